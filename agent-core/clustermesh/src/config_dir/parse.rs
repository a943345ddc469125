//! One cluster's file: etcd's client YAML, read the way Cilium reads it.
//!
//! Cilium hands the file to etcd's `clientv3/yaml.NewConfig` (plus its own `ca-file`
//! fallback), which converts YAML to JSON and decodes it with Go's `encoding/json`: keys match
//! case-insensitively (exact match first), a repeated key overwrites the earlier one, unknown
//! keys are skipped, `null` leaves a string unset, and an empty path means "not set".

use std::borrow::Cow;
use std::path::Path;

use yaml_serde::Value;

use meshwork_kvstore::{EtcdConfig, KvstoreError};
use meshwork_types::ClusterConfigError;
use meshwork_types::go_json::lookup_field;

/// What Cilium looks for before it treats a file as a cluster config.
const MARKER: &[u8] = b"endpoints:";

/// Whether the content looks like a cluster config (Cilium: contains `endpoints:`).
pub(super) fn is_config_file(content: &[u8]) -> bool {
    content.windows(MARKER.len()).any(|window| window == MARKER)
}

/// Why one file is not a usable cluster config.
#[derive(Debug, thiserror::Error)]
pub(super) enum FileError {
    #[error(transparent)]
    Name(#[from] ClusterConfigError),
    #[error("cannot read the file: {0}")]
    Unreadable(String),
    #[error("invalid YAML: {0}")]
    Yaml(yaml_serde::Error),
    #[error("expected a mapping of etcd client options at the top level")]
    NotAMapping,
    #[error("`{key}`: expected {expected}")]
    Type {
        key: &'static str,
        expected: &'static str,
    },
    #[error("`endpoints` is missing or empty")]
    NoEndpoints,
    #[error("endpoint {endpoint:?} is not a valid URL: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("`cert-file` and `key-file` must be given together")]
    HalfKeyPair,
    #[error(
        "endpoint {0:?} uses http:// but TLS files are configured; use https:// \
         (etcd's Go client would silently connect without TLS)"
    )]
    PlainWithTls(String),
    #[error("`username`/`password` authentication is not supported; use client certificates")]
    PasswordAuth,
    #[error(transparent)]
    Etcd(#[from] KvstoreError),
}

// The cause is in the message: converting does not also make it the error's source, so no
// chain prints it twice.
impl From<yaml_serde::Error> for FileError {
    fn from(error: yaml_serde::Error) -> Self {
        Self::Yaml(error)
    }
}

#[derive(Clone, Copy)]
enum Field {
    Endpoints,
    TrustedCaFile,
    CertFile,
    KeyFile,
    CaFile,
    InsecureTransport,
    Username,
}

const FIELDS: &[(&str, Field)] = &[
    ("endpoints", Field::Endpoints),
    ("trusted-ca-file", Field::TrustedCaFile),
    ("cert-file", Field::CertFile),
    ("key-file", Field::KeyFile),
    ("ca-file", Field::CaFile),
    ("insecure-transport", Field::InsecureTransport),
    ("username", Field::Username),
];

/// The fields as Go would have decoded them, before validation.
#[derive(Default)]
struct RawConfig {
    endpoints: Vec<String>,
    trusted_ca_file: String,
    cert_file: String,
    key_file: String,
    ca_file: String,
    insecure_transport: bool,
    username: String,
}

/// Parses and validates a cluster's file. Relative file paths are resolved against `dir`.
pub(super) fn parse_config(dir: &Path, content: &[u8]) -> Result<EtcdConfig, FileError> {
    let value: Value = yaml_serde::from_slice(content)?;
    let raw = decode(&value)?;
    if !raw.username.is_empty() {
        return Err(FileError::PasswordAuth);
    }
    if raw.endpoints.is_empty() {
        return Err(FileError::NoEndpoints);
    }
    for endpoint in &raw.endpoints {
        check_endpoint(endpoint).map_err(|reason| FileError::Endpoint {
            endpoint: endpoint.clone(),
            reason,
        })?;
    }
    let path = |file: String| (!file.is_empty()).then(|| dir.join(file));
    let config = if raw.insecure_transport {
        // etcd's Go client ignores every TLS file then.
        EtcdConfig::new(raw.endpoints)
    } else {
        let ca = if raw.trusted_ca_file.is_empty() {
            raw.ca_file
        } else {
            raw.trusted_ca_file
        };
        EtcdConfig {
            endpoints: raw.endpoints,
            trusted_ca_file: path(ca),
            cert_file: path(raw.cert_file),
            key_file: path(raw.key_file),
        }
    };
    if config.cert_file.is_some() != config.key_file.is_some() {
        return Err(FileError::HalfKeyPair);
    }
    if config.uses_tls()
        && let Some(plain) = config.endpoints.iter().find(|e| e.starts_with("http://"))
    {
        return Err(FileError::PlainWithTls(plain.clone()));
    }
    config.validate()?;
    Ok(config)
}

fn decode(value: &Value) -> Result<RawConfig, FileError> {
    let mut raw = RawConfig::default();
    let map = match value {
        Value::Null => return Ok(raw),
        Value::Mapping(map) => map,
        _ => return Err(FileError::NotAMapping),
    };
    // Mapping keeps document order, so a repeated key overwrites as in Go.
    for (key, value) in map {
        let Some(field) = key.as_str().and_then(|key| lookup_field(FIELDS, key)) else {
            continue;
        };
        match field {
            Field::Endpoints => raw.endpoints = string_list(value)?,
            Field::TrustedCaFile => set_string(&mut raw.trusted_ca_file, "trusted-ca-file", value)?,
            Field::CertFile => set_string(&mut raw.cert_file, "cert-file", value)?,
            Field::KeyFile => set_string(&mut raw.key_file, "key-file", value)?,
            Field::CaFile => set_string(&mut raw.ca_file, "ca-file", value)?,
            Field::Username => set_string(&mut raw.username, "username", value)?,
            Field::InsecureTransport => match value {
                Value::Null => {}
                Value::Bool(b) => raw.insecure_transport = *b,
                _ => return Err(type_error("insecure-transport", "true or false")),
            },
        }
    }
    Ok(raw)
}

fn type_error(key: &'static str, expected: &'static str) -> FileError {
    FileError::Type { key, expected }
}

fn set_string(slot: &mut String, key: &'static str, value: &Value) -> Result<(), FileError> {
    match value {
        Value::Null => Ok(()),
        Value::String(s) => {
            s.clone_into(slot);
            Ok(())
        }
        _ => Err(type_error(key, "a string")),
    }
}

fn string_list(value: &Value) -> Result<Vec<String>, FileError> {
    let expected = || type_error("endpoints", "a list of URLs");
    match value {
        Value::Null => Ok(Vec::new()),
        Value::Sequence(items) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(s.clone()),
                Value::Null => Ok(String::new()),
                _ => Err(expected()),
            })
            .collect(),
        _ => Err(expected()),
    }
}

/// Accepts what the etcd client dials: `http://host[:port]`, `https://host[:port]`, or a bare
/// `host:port` (whose scheme then follows the TLS settings).
fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let url = match endpoint.split_once("://") {
        Some(("http" | "https", _)) => Cow::Borrowed(endpoint),
        Some((scheme, _)) => {
            return Err(format!(
                "unsupported scheme {scheme:?}, expected http or https"
            ));
        }
        None => Cow::Owned(format!("http://{endpoint}")),
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| e.to_string())?;
    let Some(authority) = uri.authority().filter(|a| !a.host().is_empty()) else {
        return Err("no host".to_owned());
    };
    if authority.as_str().contains('@') {
        return Err("user info is not supported".to_owned());
    }
    // `Uri` accepts any port text; the dialer needs a number.
    let port = &authority.as_str()[authority.host().len()..];
    if !port.is_empty()
        && port
            .strip_prefix(':')
            .and_then(|p| p.parse::<u16>().ok())
            .is_none()
    {
        return Err(format!("invalid port {port:?}"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err("an endpoint has no path or query".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(content: &str) -> Result<EtcdConfig, FileError> {
        parse_config(Path::new("/etc/cm"), content.as_bytes())
    }

    #[test]
    fn reads_cilium_helm_output() {
        let config = parse(
            "endpoints:\n- https://c1.mesh.cilium.io:2379\n\
             trusted-ca-file: /var/lib/cilium/clustermesh/c1.etcd-client-ca.crt\n\
             key-file: /var/lib/cilium/clustermesh/c1.etcd-client.key\n\
             cert-file: /var/lib/cilium/clustermesh/c1.etcd-client.crt\n",
        )
        .unwrap();
        assert_eq!(config.endpoints, ["https://c1.mesh.cilium.io:2379"]);
        assert_eq!(
            config.trusted_ca_file.as_deref(),
            Some(Path::new(
                "/var/lib/cilium/clustermesh/c1.etcd-client-ca.crt"
            ))
        );
        assert_eq!(
            config.key_file.as_deref(),
            Some(Path::new("/var/lib/cilium/clustermesh/c1.etcd-client.key"))
        );
    }

    #[test]
    fn relative_paths_resolve_against_the_dir() {
        let config = parse(
            "endpoints: [\"https://h:2379\"]\ntrusted-ca-file: ca.crt\ncert-file: sub/c.crt\nkey-file: /abs/c.key\n",
        )
        .unwrap();
        assert_eq!(
            config.trusted_ca_file.as_deref(),
            Some(Path::new("/etc/cm/ca.crt"))
        );
        assert_eq!(
            config.cert_file.as_deref(),
            Some(Path::new("/etc/cm/sub/c.crt"))
        );
        assert_eq!(config.key_file.as_deref(), Some(Path::new("/abs/c.key")));
    }

    #[test]
    fn reads_keys_like_go() {
        // Case-insensitive keys, last one wins, unknown keys and nulls ignored, "" = unset.
        let config = parse(
            "Endpoints: [\"http://a:1\"]\nendpoints: [\"127.0.0.1:2379\"]\ndial-timeout: 5s\n\
             cert-file: ~\nkey-file: \"\"\n",
        )
        .unwrap();
        assert_eq!(config, EtcdConfig::new(["127.0.0.1:2379"]));
    }

    #[test]
    fn ca_file_is_a_fallback_and_insecure_transport_drops_tls() {
        let config = parse("endpoints: [\"https://h:1\"]\nca-file: /ca\n").unwrap();
        assert_eq!(config.trusted_ca_file.as_deref(), Some(Path::new("/ca")));
        let config =
            parse("endpoints: [\"https://h:1\"]\nca-file: /old\ntrusted-ca-file: /new\n").unwrap();
        assert_eq!(config.trusted_ca_file.as_deref(), Some(Path::new("/new")));
        let config =
            parse("endpoints: [\"http://h:1\"]\ninsecure-transport: true\ntrusted-ca-file: /ca\n")
                .unwrap();
        assert_eq!(config, EtcdConfig::new(["http://h:1"]));
    }

    #[test]
    fn rejects_unusable_configs() {
        let cases: &[(&str, &str)] = &[
            ("endpoints: [\"https://h:1\"\n", "invalid YAML"),
            ("- endpoints:\n", "expected a mapping"),
            ("endpoints:\n", "`endpoints` is missing or empty"),
            ("endpoints: []\n", "`endpoints` is missing or empty"),
            (
                "endpoints: https://h:1\n",
                "`endpoints`: expected a list of URLs",
            ),
            ("endpoints: [1]\n", "`endpoints`: expected a list of URLs"),
            (
                "endpoints: [\"not a url\"]\n",
                "endpoint \"not a url\" is not a valid URL",
            ),
            (
                "endpoints: [\"unix:///run/etcd\"]\n",
                "unsupported scheme \"unix\"",
            ),
            (
                "endpoints: [\"https://h:port\"]\n",
                "invalid port \":port\"",
            ),
            ("endpoints: [\"h:70000\"]\n", "invalid port"),
            ("endpoints: [\"https://:1\"]\n", "is not a valid URL"),
            ("endpoints: [\"https://h:1/v3\"]\n", "no path or query"),
            ("endpoints: [\"\"]\n", "is not a valid URL"),
            (
                "endpoints: [\"https://h:1\"]\ncert-file: /c\n",
                "must be given together",
            ),
            (
                "endpoints: [\"https://h:1\"]\nkey-file: /k\n",
                "must be given together",
            ),
            (
                "endpoints: [\"https://h:1\"]\ncert-file: [1]\n",
                "`cert-file`: expected a string",
            ),
            (
                "endpoints: [\"http://h:1\"]\ntrusted-ca-file: /ca\n",
                "uses http://",
            ),
            (
                "endpoints: [\"https://h:1\"]\nusername: root\n",
                "not supported",
            ),
            (
                "endpoints: [\"https://h:1\"]\ninsecure-transport: 1\n",
                "true or false",
            ),
        ];
        for (content, expected) in cases {
            let err = parse(content).expect_err(content).to_string();
            assert!(err.contains(expected), "{content:?}: {err}");
        }
    }

    #[test]
    fn accepts_what_the_etcd_client_dials() {
        for endpoint in [
            "https://c1.mesh.cilium.io:2379",
            "http://127.0.0.1:2379",
            "127.0.0.1:2379",
            "https://[::1]:2379",
            "https://h",
            "https://h:1/",
        ] {
            assert_eq!(check_endpoint(endpoint), Ok(()), "{endpoint}");
        }
    }

    #[test]
    fn marker_is_cilium_substring_check() {
        assert!(is_config_file(b"# endpoints: somewhere\n"));
        assert!(!is_config_file(b"Endpoints:\n- https://h:1\n"));
        assert!(!is_config_file(b""));
    }
}
