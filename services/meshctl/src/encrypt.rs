//! `meshctl encrypt status`: the agent's WireGuard device, peers and pending GC.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::anyhow;
use meshwork_proto::agent::v1::encrypt_client::EncryptClient;
use meshwork_proto::agent::v1::{EncryptStatusRequest, EncryptStatusResponse};
use serde_json::{Value, json};
use tonic::Code;

use crate::cli::EncryptCommand;
use crate::client::{Agent, call_error};
use crate::status::print_text;

/// Runs an `encrypt` subcommand.
pub async fn run(socket: &Path, command: &EncryptCommand) -> anyhow::Result<ExitCode> {
    let EncryptCommand::Status { json } = command;
    let status = fetch(socket).await?;
    let text = if *json {
        format!("{}\n", to_json(&status))
    } else {
        render(&status, SystemTime::now())
    };
    print_text(&text)?;
    Ok(ExitCode::SUCCESS)
}

async fn fetch(socket: &Path) -> anyhow::Result<EncryptStatusResponse> {
    let channel = Agent::new(socket).channel().await?;
    let reply = EncryptClient::new(channel)
        .status(EncryptStatusRequest {})
        .await
        .map_err(|status| match status.code() {
            Code::FailedPrecondition => anyhow!("{}", status.message()),
            _ => call_error(socket, "Encrypt/Status", &status),
        })?;
    Ok(reply.into_inner())
}

/// The status as one JSON object (the protobuf field names).
pub fn to_json(s: &EncryptStatusResponse) -> Value {
    json!({
        "device": s.device,
        "backend": s.backend,
        "public_key": s.public_key,
        "listen_port": s.listen_port,
        "device_up": s.device_up,
        "userspace_pid": s.userspace_pid,
        "device_recreations": s.device_recreations,
        "rejected_duplicate_keys": s.rejected_duplicate_keys,
        "rejected_malformed_keys": s.rejected_malformed_keys,
        "last_error": s.last_error,
        // The node object as JSON (null if the agent sent none or it does not parse).
        "local_node": serde_json::from_str::<Value>(&s.local_node_json).unwrap_or(Value::Null),
        "peers": s.peers.iter().map(|p| json!({
            "public_key": p.public_key,
            "node": p.node,
            "endpoint": p.endpoint,
            "allowed_ips": p.allowed_ips,
            "last_handshake_unix": p.last_handshake_unix,
            "rx_bytes": p.rx_bytes,
            "tx_bytes": p.tx_bytes,
        })).collect::<Vec<_>>(),
        "pending_gc": s.pending_gc.iter().map(|p| json!({
            "public_key": p.public_key,
            "wait": p.wait,
        })).collect::<Vec<_>>(),
    })
}

/// The human view.
pub fn render(s: &EncryptStatusResponse, now: SystemTime) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let up = if s.device_up { "up" } else { "DOWN" };
    let _ = writeln!(out, "Device:      {} ({}, {up})", s.device, s.backend);
    let _ = writeln!(out, "Public key:  {}", s.public_key);
    let _ = writeln!(out, "Listen port: {}", s.listen_port);
    if s.userspace_pid != 0 {
        let _ = writeln!(out, "Userspace:   pid {}", s.userspace_pid);
    }
    if s.device_recreations != 0 {
        let _ = writeln!(out, "Recreated:   {} times", s.device_recreations);
    }
    if s.rejected_duplicate_keys + s.rejected_malformed_keys != 0 {
        let _ = writeln!(
            out,
            "Rejected:    {} duplicate keys, {} malformed keys",
            s.rejected_duplicate_keys, s.rejected_malformed_keys
        );
    }
    if let Some(err) = &s.last_error {
        let _ = writeln!(out, "Last error:  {err}");
    }
    let _ = writeln!(out, "Peers:       {}", s.peers.len());
    for p in &s.peers {
        let node = if p.node.is_empty() {
            "(restored)"
        } else {
            &p.node
        };
        let handshake = if p.last_handshake_unix <= 0 {
            "never".to_owned()
        } else {
            let at = UNIX_EPOCH + Duration::from_secs(p.last_handshake_unix.unsigned_abs());
            match now.duration_since(at) {
                Ok(ago) => format!(
                    "{} ago",
                    humantime::format_duration(Duration::from_secs(ago.as_secs()))
                ),
                Err(_) => "just now".to_owned(),
            }
        };
        let _ = writeln!(out, "  {} {node}", p.public_key);
        let _ = writeln!(out, "    endpoint:    {}", or_none(&p.endpoint));
        let _ = writeln!(
            out,
            "    allowed IPs: {}",
            or_none(&p.allowed_ips.join(", "))
        );
        let _ = writeln!(out, "    handshake:   {handshake}");
        let _ = writeln!(
            out,
            "    transfer:    {} B received, {} B sent",
            p.rx_bytes, p.tx_bytes
        );
    }
    if !s.pending_gc.is_empty() {
        let _ = writeln!(out, "Restored, awaiting GC: {}", s.pending_gc.len());
        for p in &s.pending_gc {
            let _ = writeln!(out, "  {} (waits for {})", p.public_key, p.wait);
        }
    }
    out
}

fn or_none(text: &str) -> &str {
    if text.is_empty() { "(none)" } else { text }
}

#[cfg(test)]
mod tests {
    use meshwork_proto::agent::v1::{PendingGc, WireguardPeer};

    use super::*;

    fn status() -> EncryptStatusResponse {
        EncryptStatusResponse {
            device: "meshwork_wg0".into(),
            backend: "userspace".into(),
            public_key: "PUB=".into(),
            listen_port: 51871,
            device_up: true,
            peers: vec![WireguardPeer {
                public_key: "PEER=".into(),
                node: "c2/n1".into(),
                endpoint: "10.213.0.2:51871".into(),
                allowed_ips: vec!["10.214.2.0/24".into()],
                last_handshake_unix: 100,
                rx_bytes: 5,
                tx_bytes: 6,
            }],
            pending_gc: vec![PendingGc {
                public_key: "OLD=".into(),
                wait: "NodesSynced".into(),
            }],
            ..EncryptStatusResponse::default()
        }
    }

    #[test]
    fn human_view_shows_peers_handshake_age_and_pending_gc() {
        let text = render(&status(), UNIX_EPOCH + Duration::from_secs(160));
        assert!(text.contains("meshwork_wg0 (userspace, up)"), "{text}");
        assert!(text.contains("Listen port: 51871"), "{text}");
        assert!(text.contains("PEER= c2/n1"), "{text}");
        assert!(text.contains("handshake:   1m ago"), "{text}");
        assert!(text.contains("OLD= (waits for NodesSynced)"), "{text}");
    }

    #[test]
    fn json_has_every_field() {
        let value = to_json(&status());
        assert_eq!(value["listen_port"], 51871);
        assert_eq!(value["peers"][0]["allowed_ips"][0], "10.214.2.0/24");
        assert_eq!(value["pending_gc"][0]["wait"], "NodesSynced");
    }
}
