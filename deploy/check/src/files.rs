//! What a container finds at a path: the files its Secret, ConfigMap and projected volumes
//! put there (with `items` renamed as the kubelet renames them), and certificates in them.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::Value;

use crate::manifest::Manifests;
use crate::pod::{Container, Workload};

/// The files a volume shows, by path relative to its mount; `None` for a volume whose
/// content the rendering does not hold (hostPath, emptyDir).
pub fn volume_files(
    manifests: &Manifests,
    workload: &Workload<'_>,
    volume: &str,
) -> Option<BTreeMap<String, Vec<u8>>> {
    let volume = workload.volume(volume)?;
    let namespace = Some(workload.namespace());
    let mut sources = Vec::new();
    if volume["secret"].is_object() {
        sources.push((
            "Secret",
            volume["secret"]["secretName"].as_str(),
            &volume["secret"],
        ));
    } else if volume["configMap"].is_object() {
        sources.push((
            "ConfigMap",
            volume["configMap"]["name"].as_str(),
            &volume["configMap"],
        ));
    } else if volume["projected"].is_object() {
        for source in volume["projected"]["sources"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if source["secret"].is_object() {
                sources.push((
                    "Secret",
                    source["secret"]["name"].as_str(),
                    &source["secret"],
                ));
            } else if source["configMap"].is_object() {
                sources.push((
                    "ConfigMap",
                    source["configMap"]["name"].as_str(),
                    &source["configMap"],
                ));
            }
        }
    } else {
        return None;
    }
    let mut files = BTreeMap::new();
    for (kind, name, source) in sources {
        let Some(object) = manifests.get(kind, namespace, name.unwrap_or_default()) else {
            continue;
        };
        let data = object_data(object.kind(), &object.value);
        match source["items"].as_array() {
            Some(items) => {
                for item in items {
                    let key = item["key"].as_str().unwrap_or_default();
                    let path = item["path"].as_str().unwrap_or(key);
                    if let Some(bytes) = data.get(key) {
                        files.insert(path.to_owned(), bytes.clone());
                    }
                }
            }
            None => files.extend(data),
        }
    }
    Some(files)
}

/// A Secret's or ConfigMap's keys and their bytes.
pub fn object_data(kind: &str, value: &Value) -> BTreeMap<String, Vec<u8>> {
    let mut data = BTreeMap::new();
    let decode = |text: &str| decode_base64(text).unwrap_or_default();
    for (key, text) in value["data"].as_object().into_iter().flatten() {
        let text = text.as_str().unwrap_or_default();
        let bytes = if kind == "Secret" {
            decode(text)
        } else {
            text.as_bytes().to_vec()
        };
        data.insert(key.clone(), bytes);
    }
    for field in ["stringData", "binaryData"] {
        for (key, text) in value[field].as_object().into_iter().flatten() {
            let text = text.as_str().unwrap_or_default();
            let bytes = if field == "binaryData" {
                decode(text)
            } else {
                text.as_bytes().to_vec()
            };
            data.insert(key.clone(), bytes);
        }
    }
    data
}

/// Base64 as Kubernetes writes it (renderings may fold it over lines).
pub fn decode_base64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD.decode(compact)
}

/// What a container finds at `path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A file of a Secret, ConfigMap or projected volume.
    File(Vec<u8>),
    /// A path under a mount whose content the rendering does not hold.
    Unknown,
    /// Nothing: no mount holds it, or its volume has no such file.
    Missing(String),
}

/// Looks `path` up in the container's mounts (the deepest mount holding it wins).
pub fn find(
    manifests: &Manifests,
    workload: &Workload<'_>,
    container: &Container<'_>,
    path: &str,
) -> Found {
    let mount = container
        .mounts()
        .into_iter()
        .filter_map(|mount| {
            let base = mount.path.trim_end_matches('/').to_owned();
            let rest = path.strip_prefix(&base)?.strip_prefix('/')?.to_owned();
            Some((base.len(), mount, rest))
        })
        .max_by_key(|(depth, _, _)| *depth);
    let Some((_, mount, relative)) = mount else {
        return Found::Missing(format!(
            "{path} is on no volume mount (the image holds only its binaries)"
        ));
    };
    match volume_files(manifests, workload, &mount.name) {
        None => Found::Unknown,
        Some(files) => match files.get(&relative) {
            Some(bytes) => Found::File(bytes.clone()),
            None => Found::Missing(format!(
                "volume {} mounted at {} has no {relative} (it has: {})",
                mount.name,
                mount.path,
                files.keys().cloned().collect::<Vec<_>>().join(", ")
            )),
        },
    }
}

/// A certificate's subject CN and its DNS and IP subject alternative names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Certificate {
    /// The subject's common name.
    pub common_name: String,
    /// DNS names (wildcards as written).
    pub dns_names: Vec<String>,
    /// IP addresses.
    pub ips: Vec<std::net::IpAddr>,
}

impl Certificate {
    /// Reads the first certificate of a PEM file.
    pub fn from_pem(pem: &[u8]) -> Result<Self, String> {
        let (_, pem) =
            x509_parser::pem::parse_x509_pem(pem).map_err(|e| format!("not PEM: {e}"))?;
        let cert = pem
            .parse_x509()
            .map_err(|e| format!("not a certificate: {e}"))?;
        let common_name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or_default()
            .to_owned();
        let mut dns_names = Vec::new();
        let mut ips = Vec::new();
        if let Ok(Some(names)) = cert.subject_alternative_name() {
            for name in &names.value.general_names {
                match name {
                    x509_parser::extensions::GeneralName::DNSName(dns) => {
                        dns_names.push((*dns).to_owned());
                    }
                    x509_parser::extensions::GeneralName::IPAddress(bytes) => {
                        let ip = match bytes.len() {
                            4 => <[u8; 4]>::try_from(*bytes).ok().map(std::net::IpAddr::from),
                            16 => <[u8; 16]>::try_from(*bytes)
                                .ok()
                                .map(std::net::IpAddr::from),
                            _ => None,
                        };
                        ips.extend(ip);
                    }
                    _ => {}
                }
            }
        }
        Ok(Self {
            common_name,
            dns_names,
            ips,
        })
    }

    /// Whether the certificate names `host` (a DNS name, `*.` matching one label, or an IP).
    pub fn names(&self, host: &str) -> bool {
        if let Ok(ip) = host.parse::<std::net::IpAddr>() {
            return self.ips.contains(&ip);
        }
        self.dns_names
            .iter()
            .any(|name| match name.strip_prefix("*.") {
                Some(suffix) => host.split_once('.').is_some_and(|(label, rest)| {
                    !label.is_empty() && rest.eq_ignore_ascii_case(suffix)
                }),
                None => name.eq_ignore_ascii_case(host),
            })
    }
}
