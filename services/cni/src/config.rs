//! The network configuration on stdin: the spec's keys and the plugin's own.
//!
//! | key | type | meaning |
//! |---|---|---|
//! | `cniVersion` | string | required; one of [`SpecVersion::ALL`] |
//! | `name` | string | required, non-empty |
//! | `type` | string | the plugin's name (not checked: runtimes look the binary up by it) |
//! | `agent-socket` | path | the agent's API socket; default [`DEFAULT_AGENT_SOCKET`] |
//! | `labels` | `["source:key=value", …]` | the endpoint's security labels |
//! | `args.cni.labels` | `[{"key": K, "value": V}, …]` | more labels (the CNI convention); `cni:K=V`, or `K=V` when K already has a `source:` |
//! | `identity` | number | a fixed security identity (works without an apiserver); absent: the apiserver allocates one for the labels |
//! | `allowed-identities` | `[number, …]` | identities the endpoint's BPF program lets in |
//! | `mtu` | number | MTU of both ends of the veth (68–65535); absent: the kernel's default |
//! | `host-netns` | path | where the host end of the veth goes; absent: the plugin's own namespace |
//! | `dns` | object | copied into the ADD result, as the reference plugins do |
//! | `prevResult` | object | CHECK compares the IP it lists; ignored otherwise |
//! | `runtimeConfig` | object | accepted and ignored: the plugin declares no capabilities |
//! | `ipam` | object | refused when it names a `type` (code 2): the agent hands out the IPs |
//!
//! Any other key is ignored, as the spec asks.

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{CniError, ErrorCode};

/// The agent's default `--api-socket`: `<--state-dir>/agent.sock` with the default state dir
/// `/var/run/meshwork` (`services/agent/src/args.rs`).
pub const DEFAULT_AGENT_SOCKET: &str = "/var/run/meshwork/agent.sock";

/// The source of labels given as `args.cni.labels` without one (Cilium's `cni` source).
pub const ARGS_LABEL_SOURCE: &str = "cni";

/// The pod's namespace label, added when CNI_ARGS names the pod (as Cilium labels every pod).
pub const NAMESPACE_LABEL: &str = "k8s:io.kubernetes.pod.namespace";

/// A CNI spec version this plugin speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SpecVersion {
    /// 0.3.0: results with `version` in each IP.
    V0_3_0,
    /// 0.3.1: as 0.3.0.
    V0_3_1,
    /// 0.4.0: adds CHECK; results as 0.3.x.
    V0_4_0,
    /// 1.0.0: results without `version` in the IPs.
    V1_0_0,
}

impl SpecVersion {
    /// Every version this plugin speaks, oldest first (what VERSION lists).
    pub const ALL: [Self; 4] = [Self::V0_3_0, Self::V0_3_1, Self::V0_4_0, Self::V1_0_0];

    /// The version's text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V0_3_0 => "0.3.0",
            Self::V0_3_1 => "0.3.1",
            Self::V0_4_0 => "0.4.0",
            Self::V1_0_0 => "1.0.0",
        }
    }

    /// Parses a version this plugin speaks.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == text)
    }

    /// CHECK exists from 0.4.0 on.
    pub fn has_check(self) -> bool {
        self >= Self::V0_4_0
    }

    /// Results before 1.0.0 carry `"version": "4"` in each IP.
    pub fn ips_carry_version(self) -> bool {
        self < Self::V1_0_0
    }

    /// The error for any other version.
    fn unsupported(text: &str) -> CniError {
        let all: Vec<&str> = Self::ALL.iter().map(|v| v.as_str()).collect();
        CniError::new(
            ErrorCode::IncompatibleVersion,
            format!(
                "cniVersion {text:?} is not supported (supported: {})",
                all.join(", ")
            ),
        )
    }
}

/// The network configuration, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    /// `cniVersion`.
    pub cni_version: SpecVersion,
    /// `name`.
    pub name: String,
    /// `type`.
    pub plugin_type: String,
    /// `agent-socket`, or [`DEFAULT_AGENT_SOCKET`].
    pub agent_socket: PathBuf,
    /// `labels` and `args.cni.labels`, each `source:key=value`, sorted, without duplicates.
    pub labels: Vec<String>,
    /// `identity`.
    pub identity: Option<u32>,
    /// `allowed-identities`.
    pub allowed_identities: Vec<u32>,
    /// `mtu`.
    pub mtu: Option<u32>,
    /// `host-netns`.
    pub host_netns: Option<PathBuf>,
    /// `dns`, as given.
    pub dns: Option<Value>,
    /// `prevResult`, as given.
    pub prev_result: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    name: Option<String>,
    #[serde(rename = "type", default)]
    plugin_type: String,
    #[serde(rename = "agent-socket")]
    agent_socket: Option<PathBuf>,
    #[serde(default)]
    labels: Vec<String>,
    identity: Option<u32>,
    #[serde(rename = "allowed-identities", default)]
    allowed_identities: Vec<u32>,
    mtu: Option<u32>,
    #[serde(rename = "host-netns")]
    host_netns: Option<PathBuf>,
    args: Option<RawArgs>,
    dns: Option<Value>,
    prev_result: Option<Value>,
    ipam: Option<Value>,
}

#[derive(Deserialize)]
struct RawArgs {
    cni: Option<RawCniArgs>,
}

#[derive(Deserialize)]
struct RawCniArgs {
    #[serde(default)]
    labels: Vec<RawLabel>,
}

#[derive(Deserialize)]
struct RawLabel {
    key: String,
    value: String,
}

/// The `cniVersion` of `stdin`, if it is JSON with one this plugin speaks (for the version
/// of an error reply when the config is otherwise unusable).
pub fn peek_version(stdin: &[u8]) -> Option<SpecVersion> {
    let value: Value = serde_json::from_slice(stdin).ok()?;
    SpecVersion::parse(value.get("cniVersion")?.as_str()?)
}

/// Parses the `cniVersion` of `stdin` alone (what VERSION reads); `None` when stdin is
/// empty.
pub fn parse_version_only(stdin: &[u8]) -> Result<Option<SpecVersion>, CniError> {
    if stdin.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value = decode(stdin)?;
    match value.get("cniVersion") {
        None => Ok(None),
        Some(Value::String(text)) => SpecVersion::parse(text)
            .map(Some)
            .ok_or_else(|| SpecVersion::unsupported(text)),
        Some(other) => Err(CniError::new(
            ErrorCode::InvalidConfig,
            format!("cniVersion {other} is not a string"),
        )),
    }
}

fn decode(stdin: &[u8]) -> Result<Value, CniError> {
    serde_json::from_slice(stdin).map_err(|err| {
        CniError::new(ErrorCode::Decode, "the network config is not JSON")
            .with_details(err.to_string())
    })
}

impl NetConf {
    /// Parses and checks the network config: not JSON is [`ErrorCode::Decode`], a version
    /// this plugin does not speak [`ErrorCode::IncompatibleVersion`], an `ipam` plugin
    /// [`ErrorCode::UnsupportedField`], anything else wrong [`ErrorCode::InvalidConfig`].
    pub fn parse(stdin: &[u8]) -> Result<Self, CniError> {
        let value = decode(stdin)?;
        if !value.is_object() {
            return Err(invalid("the network config is not a JSON object"));
        }
        let cni_version = match value.get("cniVersion") {
            Some(Value::String(text)) => {
                SpecVersion::parse(text).ok_or_else(|| SpecVersion::unsupported(text))?
            }
            Some(other) => return Err(invalid(format!("cniVersion {other} is not a string"))),
            None => return Err(invalid("cniVersion is required")),
        };
        let raw: Raw = serde_json::from_value(value).map_err(|err| {
            invalid("the network config does not parse").with_details(err.to_string())
        })?;
        if let Some(ipam) = &raw.ipam
            && let Some(kind) = ipam.get("type")
        {
            return Err(CniError::new(
                ErrorCode::UnsupportedField,
                format!(
                    "ipam.type {kind} is not supported: meshwork-cni takes the pod's IP from \
                     the agent (remove the ipam section)"
                ),
            ));
        }
        let name = raw.name.unwrap_or_default();
        if name.is_empty() {
            return Err(invalid("name is required"));
        }
        if let Some(mtu) = raw.mtu
            && !(68..=65535).contains(&mtu)
        {
            return Err(invalid(format!("mtu {mtu} is outside 68-65535")));
        }
        if raw.identity == Some(0) {
            return Err(invalid(
                "identity 0 is no identity: omit the key to have the apiserver allocate one",
            ));
        }
        let mut labels = raw.labels;
        let from_args = raw.args.and_then(|a| a.cni).map(|c| c.labels);
        for label in from_args.into_iter().flatten() {
            labels.push(if label.key.contains(':') {
                format!("{}={}", label.key, label.value)
            } else {
                format!("{ARGS_LABEL_SOURCE}:{}={}", label.key, label.value)
            });
        }
        for label in &labels {
            meshwork_types::Label::parse_strict(label)
                .map_err(|why| invalid(format!("label {label:?}: {why}")))?;
        }
        labels.sort();
        labels.dedup();
        Ok(Self {
            cni_version,
            name,
            plugin_type: raw.plugin_type,
            agent_socket: raw
                .agent_socket
                .unwrap_or_else(|| PathBuf::from(DEFAULT_AGENT_SOCKET)),
            labels,
            identity: raw.identity,
            allowed_identities: raw.allowed_identities,
            mtu: raw.mtu,
            host_netns: raw.host_netns,
            dns: raw.dns,
            prev_result: raw.prev_result,
        })
    }

    /// The endpoint's labels for the pod `namespace`: the config's, plus the namespace
    /// label when the config has none of its own.
    pub fn labels_for(&self, namespace: Option<&str>) -> Vec<String> {
        let mut labels = self.labels.clone();
        let prefix = format!("{NAMESPACE_LABEL}=");
        if let Some(ns) = namespace
            && !labels.iter().any(|l| l.starts_with(&prefix))
        {
            labels.push(format!("{prefix}{ns}"));
            labels.sort();
        }
        labels
    }
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::InvalidConfig, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<NetConf, CniError> {
        NetConf::parse(json.as_bytes())
    }

    #[test]
    fn a_full_config_parses_with_labels_merged_sorted_and_checked() {
        let conf = parse(
            r#"{"cniVersion":"1.0.0","name":"mesh","type":"meshwork-cni",
                "agent-socket":"/run/a.sock","labels":["k8s:app=web","k8s:app=web"],
                "args":{"cni":{"labels":[{"key":"tier","value":"front"},
                                         {"key":"k8s:team","value":"a"}]}},
                "identity":4242,"allowed-identities":[1,2],"mtu":1400,
                "host-netns":"/run/netns/node","dns":{"nameservers":["10.0.0.10"]},
                "runtimeConfig":{"portMappings":[]},"somethingElse":true}"#,
        )
        .unwrap();
        assert_eq!(conf.cni_version, SpecVersion::V1_0_0);
        assert_eq!(conf.agent_socket, PathBuf::from("/run/a.sock"));
        assert_eq!(conf.labels, ["cni:tier=front", "k8s:app=web", "k8s:team=a"]);
        assert_eq!(conf.identity, Some(4242));
        assert_eq!(conf.allowed_identities, [1, 2]);
        assert_eq!(conf.mtu, Some(1400));
        assert_eq!(conf.host_netns, Some(PathBuf::from("/run/netns/node")));
        assert!(conf.dns.is_some());
        assert_eq!(
            conf.labels_for(Some("default")),
            [
                "cni:tier=front",
                "k8s:app=web",
                "k8s:io.kubernetes.pod.namespace=default",
                "k8s:team=a"
            ]
        );
    }

    #[test]
    fn defaults() {
        let conf = parse(r#"{"cniVersion":"0.3.1","name":"mesh"}"#).unwrap();
        assert_eq!(conf.agent_socket, PathBuf::from(DEFAULT_AGENT_SOCKET));
        assert!(conf.labels.is_empty() && conf.identity.is_none() && conf.mtu.is_none());
        assert!(conf.cni_version.ips_carry_version() && !conf.cni_version.has_check());
    }

    #[test]
    fn each_failure_has_its_code() {
        let code = |json: &str| parse(json).unwrap_err().code;
        assert_eq!(code("{not json"), ErrorCode::Decode);
        assert_eq!(code(""), ErrorCode::Decode);
        assert_eq!(code("[1]"), ErrorCode::InvalidConfig);
        assert_eq!(code(r#"{"name":"m"}"#), ErrorCode::InvalidConfig);
        assert_eq!(
            code(r#"{"cniVersion":"1.1.0","name":"m"}"#),
            ErrorCode::IncompatibleVersion
        );
        assert_eq!(
            code(r#"{"cniVersion":"0.2.0","name":"m"}"#),
            ErrorCode::IncompatibleVersion
        );
        assert_eq!(code(r#"{"cniVersion":"1.0.0"}"#), ErrorCode::InvalidConfig);
        assert_eq!(
            code(r#"{"cniVersion":"1.0.0","name":"m","mtu":"big"}"#),
            ErrorCode::InvalidConfig
        );
        assert_eq!(
            code(r#"{"cniVersion":"1.0.0","name":"m","mtu":20}"#),
            ErrorCode::InvalidConfig
        );
        assert_eq!(
            code(r#"{"cniVersion":"1.0.0","name":"m","labels":["app=web"]}"#),
            ErrorCode::InvalidConfig
        );
        assert_eq!(
            code(r#"{"cniVersion":"1.0.0","name":"m","identity":0}"#),
            ErrorCode::InvalidConfig
        );
        assert_eq!(
            code(r#"{"cniVersion":"1.0.0","name":"m","ipam":{"type":"host-local"}}"#),
            ErrorCode::UnsupportedField
        );
    }

    #[test]
    fn version_only_reads() {
        assert_eq!(parse_version_only(b"").unwrap(), None);
        assert_eq!(
            parse_version_only(br#"{"cniVersion":"0.4.0"}"#).unwrap(),
            Some(SpecVersion::V0_4_0)
        );
        assert_eq!(
            parse_version_only(br#"{"cniVersion":"9.9.9"}"#)
                .unwrap_err()
                .code,
            ErrorCode::IncompatibleVersion
        );
        assert_eq!(
            peek_version(br#"{"cniVersion":"0.3.0","x":1}"#),
            Some(SpecVersion::V0_3_0)
        );
        assert_eq!(peek_version(b"nope"), None);
    }
}
