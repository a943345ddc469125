//! `meshctl bpf ipcache list`, `meshctl endpoint …` and the datapath part of `status`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use meshwork_datapath::maps::PinDir;
use meshwork_proto::agent::v1 as pb;
use meshwork_proto::agent::v1::datapath_client::DatapathClient;
use serde::Serialize;

use crate::cli::EndpointAddArgs;
use crate::client::Agent;
use crate::status::print_text;

/// One row of `bpf ipcache list --json`.
#[derive(Debug, Serialize)]
struct IpCacheRow {
    prefix: String,
    identity: u32,
    tunnel_endpoint: String,
    cluster_id: u8,
    encrypt_key: u8,
}

/// Prints the pinned ipcache map under `bpf_root`, sorted by prefix.
pub fn ipcache_list(bpf_root: &Path, json: bool) -> anyhow::Result<()> {
    let pins = PinDir::under(bpf_root);
    let map = pins
        .open_ipcache()
        .with_context(|| format!("opening the ipcache pinned under {}", pins.path().display()))?;
    let mut entries = map.entries()?;
    entries.sort_by_key(|(k, _)| (k.family, k.ip, k.prefixlen, k.cluster_id));
    let rows: Vec<IpCacheRow> = entries
        .iter()
        .map(|(key, value)| IpCacheRow {
            prefix: format!("{}/{}", key.addr(), key.prefix_len()),
            identity: value.sec_identity,
            tunnel_endpoint: value
                .tunnel()
                .map_or_else(|| "0.0.0.0".to_owned(), |ip| ip.to_string()),
            cluster_id: key.cluster_id,
            encrypt_key: value.key,
        })
        .collect();
    let mut out = String::new();
    if json {
        out = serde_json::to_string(&rows)?;
        out.push('\n');
    } else {
        let _ = writeln!(out, "{:<44} IDENTITY", "IP PREFIX/ADDRESS");
        for r in &rows {
            let _ = writeln!(
                out,
                "{:<44} identity={} encryptkey={} tunnelendpoint={} cluster={}",
                r.prefix, r.identity, r.encrypt_key, r.tunnel_endpoint, r.cluster_id
            );
        }
    }
    print_text(&out)?;
    Ok(())
}

async fn client(agent: &Agent) -> anyhow::Result<DatapathClient<tonic::transport::Channel>> {
    Ok(DatapathClient::new(agent.channel().await?))
}

/// `meshctl endpoint list`.
pub async fn endpoint_list(agent: &Agent, json: bool) -> anyhow::Result<()> {
    let reply = client(agent)
        .await?
        .list_endpoints(pb::ListEndpointsRequest {})
        .await
        .map_err(|s| agent.call_error("Datapath/ListEndpoints", &s))?
        .into_inner();
    let mut out = String::new();
    if json {
        let rows: Vec<_> = reply.endpoints.iter().map(endpoint_json).collect();
        out = serde_json::to_string(&rows)?;
        out.push('\n');
    } else {
        let _ = writeln!(
            out,
            "{:<6} {:<16} {:<10} {:<18} {:<10} {:<30} IPS",
            "ID", "INTERFACE", "IDENTITY", "STATE", "GENERATION", "ALLOWED"
        );
        for s in &reply.endpoints {
            let e = s.endpoint.clone().unwrap_or_default();
            let allowed: Vec<String> = e.allowed_identities.iter().map(u32::to_string).collect();
            let _ = writeln!(
                out,
                "{:<6} {:<16} {:<10} {:<18} {:<10} {:<30} {}",
                e.id,
                e.interface,
                e.identity,
                s.state,
                s.generation,
                allowed.join(","),
                e.ips.join(",")
            );
            if let Some(err) = &s.error {
                let _ = writeln!(out, "       error: {err}");
            }
        }
    }
    print_text(&out)?;
    Ok(())
}

fn endpoint_json(s: &pb::EndpointStatus) -> serde_json::Value {
    let e = s.endpoint.clone().unwrap_or_default();
    serde_json::json!({
        "id": e.id,
        "interface": e.interface,
        "netns": e.netns,
        "ips": e.ips,
        "identity": e.identity,
        "allowed_identities": e.allowed_identities,
        "host": e.host,
        "state": s.state,
        "generation": s.generation,
        "regenerated_at": s.regenerated_at,
        "restored": s.restored,
        "error": s.error,
    })
}

/// `meshctl endpoint add`.
pub async fn endpoint_add(agent: &Agent, args: &EndpointAddArgs) -> anyhow::Result<()> {
    let (pod_namespace, pod_name) = match args.pod.as_deref().map(|pod| pod.split_once('/')) {
        None => (String::new(), String::new()),
        Some(Some((ns, name))) => (ns.to_owned(), name.to_owned()),
        Some(None) => anyhow::bail!(
            "--pod {:?} is not NAMESPACE/NAME",
            args.pod.as_deref().unwrap_or_default()
        ),
    };
    let endpoint = pb::Endpoint {
        id: args.id,
        interface: args.interface.clone(),
        netns: args
            .netns
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        ips: args.ip.clone(),
        identity: args.identity,
        allowed_identities: args.allow.clone(),
        host: args.host,
        labels: args.labels.clone(),
        pod_namespace,
        pod_name,
    };
    client(agent)
        .await?
        .put_endpoint(pb::PutEndpointRequest {
            endpoint: Some(endpoint),
        })
        .await
        .map_err(|s| agent.call_error("Datapath/PutEndpoint", &s))?;
    print_text(&format!("endpoint {} regenerated\n", args.id))?;
    Ok(())
}

/// `meshctl endpoint delete`.
pub async fn endpoint_delete(agent: &Agent, id: u64) -> anyhow::Result<()> {
    let reply = client(agent)
        .await?
        .delete_endpoint(pb::DeleteEndpointRequest { id })
        .await
        .map_err(|s| agent.call_error("Datapath/DeleteEndpoint", &s))?
        .into_inner();
    if reply.existed {
        print_text(&format!("endpoint {id} deleted\n"))?;
    } else {
        print_text(&format!("endpoint {id} did not exist\n"))?;
    }
    Ok(())
}

/// The datapath section of the human `status`.
pub fn render_status(d: &pb::DatapathStatus) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Datapath:      {} ipcache entries, {}/{} endpoints ready (maps in {})",
        d.ipcache_entries, d.endpoints_ready, d.endpoints, d.pin_dir
    );
    let drops: Vec<String> = d
        .drops
        .iter()
        .map(|r| format!("{}={}", r.reason, r.count))
        .collect();
    let _ = writeln!(out, "   drops: {}", drops.join(" "));
    if !d.ipcache_rejected.is_empty() || d.ipcache_map_full > 0 {
        let rejected: Vec<String> = d
            .ipcache_rejected
            .iter()
            .map(|r| format!("{}={}", r.reason, r.count))
            .collect();
        let _ = writeln!(
            out,
            "   ipcache rejected: {} map_full={}",
            rejected.join(" "),
            d.ipcache_map_full
        );
    }
    for m in &d.maps {
        let _ = writeln!(
            out,
            "   {}: written={} deleted={} restored_pending={} errors={}",
            m.name, m.written, m.deleted, m.restored_pending, m.errors
        );
    }
    if let Some(err) = &d.last_error {
        let _ = writeln!(out, "   last error: {err}");
    }
    out
}
