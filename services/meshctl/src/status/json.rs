//! `status --json`: one line, in the field order of [`StatusView`].

use super::view::StatusView;

/// The status as one newline-terminated line of JSON.
pub fn to_line(view: &StatusView) -> String {
    // Plain structs of strings, numbers and bools always serialize.
    let mut line = serde_json::to_string(view).expect("status view serializes");
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::view::sample;

    #[test]
    fn exact_shape_with_and_without_last_failure() {
        let expected = concat!(
            r#"{"clustermesh":{"ready":1,"total":2,"clusters":["#,
            r#"{"name":"cluster-2","ready":true,"connected":true,"cluster_id":2,"#,
            r#""config":{"required":true,"retrieved":true},"#,
            r#""synced":{"nodes":true,"services":true,"identities":true,"endpoints":true},"#,
            r#""entries":{"nodes":3,"services":2,"identities":5,"endpoints":10},"#,
            r#""failures":0,"last_failure":null,"last_error":null,"#,
            r#""endpoints":["https://127.0.0.1:2379"],"cached":true,"heartbeat_age_ms":35400},"#,
            r#"{"name":"cluster-3","ready":false,"connected":true,"cluster_id":0,"#,
            r#""config":{"required":true,"retrieved":true},"#,
            r#""synced":{"nodes":false,"services":false,"identities":false,"endpoints":false},"#,
            r#""entries":{"nodes":1,"services":0,"identities":0,"endpoints":0},"#,
            r#""failures":1,"last_failure":"2026-11-29T10:00:00Z","#,
            r#""last_error":"clusterID 2 is already used","#,
            r#""endpoints":["https://127.0.0.1:2381","https://127.0.0.2:2381"],"#,
            r#""cached":false,"heartbeat_age_ms":null}]}}"#,
            "\n"
        );
        assert_eq!(to_line(&StatusView::from(&sample())), expected);
    }

    #[test]
    fn absent_messages_are_zeroes() {
        use meshwork_proto::agent::v1::{ClusterMeshStatus, RemoteClusterStatus};
        let mesh = ClusterMeshStatus {
            ready: 0,
            total: 1,
            config_dir: String::new(),
            clusters: vec![RemoteClusterStatus {
                name: "c".into(),
                ..Default::default()
            }],
        };
        let expected = concat!(
            r#"{"clustermesh":{"ready":0,"total":1,"clusters":[{"name":"c","ready":false,"#,
            r#""connected":false,"cluster_id":0,"config":{"required":false,"retrieved":false},"#,
            r#""synced":{"nodes":false,"services":false,"identities":false,"endpoints":false},"#,
            r#""entries":{"nodes":0,"services":0,"identities":0,"endpoints":0},"#,
            r#""failures":0,"last_failure":null,"last_error":null,"endpoints":[],"#,
            r#""cached":false,"heartbeat_age_ms":null}]}}"#,
            "\n"
        );
        assert_eq!(to_line(&StatusView::from(&mesh)), expected);
    }
}
