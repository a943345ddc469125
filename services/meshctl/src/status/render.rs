//! The human view, laid out like the ClusterMesh section of `cilium-dbg status`.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use super::view::{ClusterMeshView, ClusterView};

/// The cluster mesh as text, `now` being when "x ago" is counted from.
pub fn render(mesh: &ClusterMeshView, now: SystemTime) -> String {
    let mut out = format!(
        "ClusterMesh:   {}/{} remote clusters ready\n",
        mesh.ready, mesh.total
    );
    if mesh.clusters.is_empty() {
        out.push_str("   no remote clusters configured\n");
    }
    for cluster in &mesh.clusters {
        render_cluster(&mut out, cluster, now);
    }
    out
}

fn render_cluster(out: &mut String, c: &ClusterView, now: SystemTime) {
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "   {}: {}, {}, {}, {}, {}, {} (last: {})",
        c.name,
        if c.ready { "ready" } else { "not ready" },
        count(c.entries.nodes, "node", "nodes"),
        count(c.entries.endpoints, "endpoint", "endpoints"),
        count(c.entries.identities, "identity", "identities"),
        count(c.entries.services, "service", "services"),
        count(c.failures, "failure", "failures"),
        c.last_failure
            .as_deref()
            .map_or_else(|| "never".to_owned(), |at| when(at, now)),
    );
    let endpoints = if c.endpoints.is_empty() {
        "(none)".to_owned()
    } else {
        c.endpoints.join(", ")
    };
    let _ = writeln!(
        out,
        "   └  etcd: {}, endpoints {endpoints}{}",
        if c.connected {
            "connected"
        } else {
            "disconnected"
        },
        if c.cached { " (kvstoremesh cache)" } else { "" },
    );
    let heartbeat = c.heartbeat_age_ms.map_or_else(
        || "none seen".to_owned(),
        |ms| match ms / 1000 {
            0 => "just now".to_owned(),
            secs => format!(
                "{} ago",
                humantime::format_duration(Duration::from_secs(secs))
            ),
        },
    );
    let _ = writeln!(out, "   └  heartbeat: {heartbeat}");
    let cluster_id = match c.cluster_id {
        0 => "unknown".to_owned(),
        id => id.to_string(),
    };
    let _ = writeln!(
        out,
        "   └  remote configuration: expected={}, retrieved={}, cluster-id={cluster_id}, kvstoremesh={}",
        c.config.required, c.config.retrieved, c.cached,
    );
    // Cilium's order: nodes, endpoints, identities, services.
    let _ = writeln!(
        out,
        "   └  synchronization status: nodes={}, endpoints={}, identities={}, services={}",
        c.synced.nodes, c.synced.endpoints, c.synced.identities, c.synced.services,
    );
    if let Some(error) = &c.last_error {
        let _ = writeln!(out, "   └  last error: {error}");
    }
}

/// "1 node", "3 nodes".
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// An RFC 3339 time as itself plus "x ago"; shown as is when it does not parse.
fn when(at: &str, now: SystemTime) -> String {
    let Ok(time) = humantime::parse_rfc3339(at) else {
        return at.to_owned();
    };
    match now.duration_since(time) {
        Ok(ago) if ago >= Duration::from_secs(1) => {
            // Whole seconds: "2m 3s ago", not nanoseconds.
            let ago = humantime::format_duration(Duration::from_secs(ago.as_secs()));
            format!("{at}, {ago} ago")
        }
        // Under a second, or ahead of this machine's clock.
        _ => format!("{at}, just now"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::view::{StatusView, sample};

    fn now() -> SystemTime {
        humantime::parse_rfc3339("2026-11-29T10:02:03Z").unwrap()
    }

    #[test]
    fn two_clusters_one_failing() {
        let view = StatusView::from(&sample());
        let expected = "\
ClusterMesh:   1/2 remote clusters ready
   cluster-2: ready, 3 nodes, 10 endpoints, 5 identities, 2 services, 0 failures (last: never)
   └  etcd: connected, endpoints https://127.0.0.1:2379 (kvstoremesh cache)
   └  heartbeat: 35s ago
   └  remote configuration: expected=true, retrieved=true, cluster-id=2, kvstoremesh=true
   └  synchronization status: nodes=true, endpoints=true, identities=true, services=true
   cluster-3: not ready, 1 node, 0 endpoints, 0 identities, 0 services, 1 failure (last: 2026-11-29T10:00:00Z, 2m 3s ago)
   └  etcd: connected, endpoints https://127.0.0.1:2381, https://127.0.0.2:2381
   └  heartbeat: none seen
   └  remote configuration: expected=true, retrieved=true, cluster-id=unknown, kvstoremesh=false
   └  synchronization status: nodes=false, endpoints=false, identities=false, services=false
   └  last error: clusterID 2 is already used
";
        assert_eq!(render(&view.clustermesh, now()), expected);
    }

    #[test]
    fn no_clusters() {
        let mesh = ClusterMeshView {
            ready: 0,
            total: 0,
            clusters: vec![],
        };
        assert_eq!(
            render(&mesh, now()),
            "ClusterMesh:   0/0 remote clusters ready\n   no remote clusters configured\n"
        );
    }

    #[test]
    fn failure_times() {
        assert_eq!(when("not a time", now()), "not a time");
        assert_eq!(
            when("2026-11-29T10:02:03.5Z", now()),
            "2026-11-29T10:02:03.5Z, just now"
        );
        assert_eq!(
            when("2026-11-28T10:02:03Z", now()),
            "2026-11-28T10:02:03Z, 1day ago"
        );
    }
}
