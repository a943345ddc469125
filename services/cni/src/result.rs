//! What the plugin prints on success: ADD's result and VERSION's answer, in the format of
//! the config's spec version.

use std::net::{IpAddr, Ipv4Addr};

use serde::Serialize;
use serde_json::{Value, json};

use crate::config::SpecVersion;
use crate::error::{CniError, ErrorCode};

/// An interface of the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Its name.
    pub name: String,
    /// Its MAC address (`aa:bb:…`).
    pub mac: String,
    /// The container namespace's path for the container's interface; `None` on the host.
    pub sandbox: Option<String>,
}

/// An address of the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// The address.
    pub ip: IpAddr,
    /// Its prefix length.
    pub prefix_len: u8,
    /// The gateway.
    pub gateway: Option<IpAddr>,
    /// Index into the result's interfaces.
    pub interface: Option<usize>,
}

/// A route of the result (inside the container).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteConfig {
    /// The destination, `ip/prefix`.
    pub dst: String,
    /// The gateway, if any.
    pub gw: Option<IpAddr>,
}

/// ADD's result.
#[derive(Debug, Clone, PartialEq)]
pub struct CniResult {
    /// The config's version, which decides the format.
    pub cni_version: SpecVersion,
    /// The host end of the veth, then the container's interface.
    pub interfaces: Vec<Interface>,
    /// The container's address.
    pub ips: Vec<IpConfig>,
    /// The container's routes.
    pub routes: Vec<RouteConfig>,
    /// The config's `dns`, copied.
    pub dns: Option<Value>,
}

impl CniResult {
    /// The result as JSON: 1.0.0's format, or 0.3.x/0.4.0's, whose IPs carry `"version"`.
    pub fn to_json(&self) -> String {
        let ips: Vec<Value> = self
            .ips
            .iter()
            .map(|ip| {
                let mut entry = json!({ "address": format!("{}/{}", ip.ip, ip.prefix_len) });
                if self.cni_version.ips_carry_version() {
                    entry["version"] = json!(if ip.ip.is_ipv4() { "4" } else { "6" });
                }
                if let Some(gateway) = ip.gateway {
                    entry["gateway"] = json!(gateway.to_string());
                }
                if let Some(index) = ip.interface {
                    entry["interface"] = json!(index);
                }
                entry
            })
            .collect();
        let interfaces: Vec<Value> = self
            .interfaces
            .iter()
            .map(|i| {
                let mut entry = json!({ "name": i.name, "mac": i.mac });
                if let Some(sandbox) = &i.sandbox {
                    entry["sandbox"] = json!(sandbox);
                }
                entry
            })
            .collect();
        let routes: Vec<Value> = self
            .routes
            .iter()
            .map(|r| {
                let mut entry = json!({ "dst": r.dst });
                if let Some(gw) = r.gw {
                    entry["gw"] = json!(gw.to_string());
                }
                entry
            })
            .collect();
        let mut out = json!({
            "cniVersion": self.cni_version.as_str(),
            "interfaces": interfaces,
            "ips": ips,
            "routes": routes,
        });
        if let Some(dns) = &self.dns {
            out["dns"] = dns.clone();
        }
        out.to_string()
    }
}

/// VERSION's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionInfo {
    /// The version asked in (or 1.0.0).
    pub cni_version: &'static str,
    /// Every version the plugin speaks.
    pub supported_versions: Vec<&'static str>,
}

impl VersionInfo {
    /// The answer for a request in `asked` (1.0.0 when stdin named none).
    pub fn new(asked: Option<SpecVersion>) -> Self {
        Self {
            cni_version: asked.unwrap_or(SpecVersion::V1_0_0).as_str(),
            supported_versions: SpecVersion::ALL.iter().map(|v| v.as_str()).collect(),
        }
    }

    /// As JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The container address a previous ADD reported (CHECK's `prevResult`): the first IPv4
/// entry of `ips`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrevAddress {
    /// The address.
    pub ip: Ipv4Addr,
    /// Its prefix length.
    pub prefix_len: u8,
    /// Its gateway.
    pub gateway: Option<Ipv4Addr>,
}

impl PrevAddress {
    /// Reads it from a `prevResult` object.
    pub fn from_prev_result(prev: &Value) -> Result<Self, CniError> {
        let bad =
            |why: String| CniError::new(ErrorCode::InvalidConfig, format!("prevResult: {why}"));
        let ips = prev
            .get("ips")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no ips".to_owned()))?;
        for entry in ips {
            let Some(address) = entry.get("address").and_then(Value::as_str) else {
                return Err(bad(format!("an IP without address: {entry}")));
            };
            let (ip, len) = address
                .split_once('/')
                .ok_or_else(|| bad(format!("address {address:?} is not ip/prefix")))?;
            let Ok(IpAddr::V4(ip)) = ip.parse::<IpAddr>() else {
                continue;
            };
            let prefix_len = len
                .parse::<u8>()
                .ok()
                .filter(|l| *l <= 32)
                .ok_or_else(|| bad(format!("address {address:?} has a bad prefix length")))?;
            let gateway = match entry.get("gateway").and_then(Value::as_str) {
                None => None,
                Some(text) => Some(
                    text.parse::<Ipv4Addr>()
                        .map_err(|_| bad(format!("gateway {text:?} is not an IPv4 address")))?,
                ),
            };
            return Ok(Self {
                ip,
                prefix_len,
                gateway,
            });
        }
        Err(bad("no IPv4 address".to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(version: SpecVersion) -> CniResult {
        CniResult {
            cni_version: version,
            interfaces: vec![
                Interface {
                    name: "mw0123456789a".into(),
                    mac: "aa:bb:cc:dd:ee:01".into(),
                    sandbox: None,
                },
                Interface {
                    name: "eth0".into(),
                    mac: "aa:bb:cc:dd:ee:02".into(),
                    sandbox: Some("/run/netns/pod".into()),
                },
            ],
            ips: vec![IpConfig {
                ip: "10.214.1.5".parse().unwrap(),
                prefix_len: 32,
                gateway: Some("10.214.1.1".parse().unwrap()),
                interface: Some(1),
            }],
            routes: vec![RouteConfig {
                dst: "0.0.0.0/0".into(),
                gw: Some("10.214.1.1".parse().unwrap()),
            }],
            dns: None,
        }
    }

    #[test]
    fn results_follow_the_version_format() {
        let v1: Value = serde_json::from_str(&sample(SpecVersion::V1_0_0).to_json()).unwrap();
        assert_eq!(
            v1,
            json!({
                "cniVersion": "1.0.0",
                "interfaces": [
                    {"name": "mw0123456789a", "mac": "aa:bb:cc:dd:ee:01"},
                    {"name": "eth0", "mac": "aa:bb:cc:dd:ee:02", "sandbox": "/run/netns/pod"}
                ],
                "ips": [{"address": "10.214.1.5/32", "gateway": "10.214.1.1", "interface": 1}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.214.1.1"}]
            })
        );
        let v04: Value = serde_json::from_str(&sample(SpecVersion::V0_4_0).to_json()).unwrap();
        assert_eq!(v04["cniVersion"], "0.4.0");
        assert_eq!(v04["ips"][0]["version"], "4");

        // What ADD printed is what CHECK reads back.
        let prev = PrevAddress::from_prev_result(&v1).unwrap();
        assert_eq!(prev.ip, Ipv4Addr::new(10, 214, 1, 5));
        assert_eq!(prev.prefix_len, 32);
        assert_eq!(prev.gateway, Some(Ipv4Addr::new(10, 214, 1, 1)));
        assert_eq!(
            PrevAddress::from_prev_result(&json!({"ips": []}))
                .unwrap_err()
                .code,
            ErrorCode::InvalidConfig
        );
    }

    #[test]
    fn version_lists_every_supported_version() {
        assert_eq!(
            VersionInfo::new(None).to_json(),
            r#"{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}"#
        );
        assert_eq!(
            VersionInfo::new(Some(SpecVersion::V0_3_1)).cni_version,
            "0.3.1"
        );
    }
}
