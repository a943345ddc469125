//! etcd's command line: not Meshwork's binary, so not its parser; every flag must be one of
//! the server flags listed here (etcd 3.4's and 3.5's, `etcd --help`; a test holds them
//! against the etcd of this machine, the one `meshwork/etcd:dev` carries), in
//! `--flag=value` form, and the listeners and files come from the flags that set them.

use crate::binaries::{Binary, FileFlag, Listener, Parsed, Protocol};

/// etcd server flags the manifests may use, and whether each takes a value.
pub const FLAGS: &[(&str, bool)] = &[
    ("name", true),
    ("data-dir", true),
    ("wal-dir", true),
    ("initial-cluster", true),
    ("initial-cluster-state", true),
    ("initial-cluster-token", true),
    ("initial-advertise-peer-urls", true),
    ("listen-peer-urls", true),
    ("listen-client-urls", true),
    ("advertise-client-urls", true),
    ("listen-metrics-urls", true),
    ("metrics", true),
    ("client-cert-auth", false),
    ("trusted-ca-file", true),
    ("cert-file", true),
    ("key-file", true),
    ("peer-client-cert-auth", false),
    ("peer-trusted-ca-file", true),
    ("peer-cert-file", true),
    ("peer-key-file", true),
    ("auto-compaction-mode", true),
    ("auto-compaction-retention", true),
    ("quota-backend-bytes", true),
    ("max-request-bytes", true),
    ("snapshot-count", true),
    ("heartbeat-interval", true),
    ("election-timeout", true),
    ("logger", true),
    ("log-level", true),
    ("enable-v2", true),
];

/// Parses etcd's flags.
pub fn parse(argv: &[String]) -> Result<Parsed, String> {
    let mut parsed = Parsed::new_for(Binary::Etcd);
    for arg in argv.iter().skip(1) {
        let flag = arg
            .strip_prefix("--")
            .ok_or_else(|| format!("{arg:?} is not a --flag"))?;
        let (name, value) = match flag.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (flag, None),
        };
        let (known, takes_value) = FLAGS
            .iter()
            .find(|(known, _)| *known == name)
            .ok_or_else(|| format!("--{name} is not an etcd flag these checks know"))?;
        if *takes_value != value.is_some() {
            return Err(format!(
                "--{known}: expected --{known}{}",
                if *takes_value { "=VALUE" } else { "" }
            ));
        }
        let value = value.unwrap_or_default();
        match *known {
            "listen-client-urls" => parsed.listen_urls(known, value, Protocol::Tcp)?,
            "listen-metrics-urls" => parsed.listen_urls(known, value, Protocol::Http(METRICS))?,
            "trusted-ca-file" | "cert-file" | "key-file" => parsed.files.push(FileFlag {
                flag: known,
                path: value.to_owned(),
            }),
            _ => {}
        }
    }
    Ok(parsed)
}

/// What etcd serves on its metrics URLs.
const METRICS: &[&str] = &["/metrics", "/health"];

impl Parsed {
    /// Comma-separated `scheme://HOST:PORT` URLs, each a listener.
    fn listen_urls(
        &mut self,
        flag: &'static str,
        urls: &str,
        protocol: Protocol,
    ) -> Result<(), String> {
        for url in urls.split(',') {
            let rest = url
                .split_once("://")
                .map(|(_, rest)| rest)
                .ok_or_else(|| format!("--{flag}: {url:?} is not a URL"))?;
            let (host, port) = rest
                .rsplit_once(':')
                .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
                .ok_or_else(|| format!("--{flag}: {url:?} has no port"))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let loopback = host == "localhost"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            self.listeners.push(Listener {
                flag,
                port,
                loopback,
                protocol,
            });
        }
        Ok(())
    }
}
