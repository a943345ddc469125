//! An endpoint's URL, read as the agent's etcd client reads it: a bare `host:port` takes
//! https when TLS is configured and http otherwise; without a port, the scheme's.

use std::fmt;
use std::net::IpAddr;

/// Where an endpoint's server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// An IP address: no DNS, and the server's certificate must name the IP.
    Ip(IpAddr),
    /// A name: resolved, and the server's certificate must name it.
    Name(String),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ip(ip) => ip.fmt(f),
            Self::Name(name) => f.write_str(name),
        }
    }
}

/// A parsed endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// https (TLS) or http.
    pub https: bool,
    /// The server.
    pub host: Host,
    /// The port.
    pub port: u16,
}

impl Target {
    /// Parses `endpoint`; `tls` says whether the config has TLS settings.
    pub fn parse(endpoint: &str, tls: bool) -> Result<Self, String> {
        let url = if endpoint.contains("://") {
            endpoint.to_owned()
        } else if tls {
            format!("https://{endpoint}")
        } else {
            format!("http://{endpoint}")
        };
        let uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| format!("{endpoint:?} is not a URL: {e}"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            other => {
                return Err(format!(
                    "unsupported scheme {other:?}, expected http or https"
                ));
            }
        };
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("{endpoint:?} has no host"))?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let host = match bare.parse::<IpAddr>() {
            Ok(ip) => Host::Ip(ip),
            Err(_) => Host::Name(bare.to_owned()),
        };
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        Ok(Self { https, host, port })
    }

    /// `host:port`, with brackets around an IPv6 address.
    pub fn authority(&self) -> String {
        match &self.host {
            Host::Ip(IpAddr::V6(ip)) => format!("[{ip}]:{}", self.port),
            host => format!("{host}:{}", self.port),
        }
    }

    /// What the URL check reports.
    pub fn describe(&self) -> String {
        format!(
            "{}, host {}, port {}",
            if self.https { "https" } else { "http" },
            self.host,
            self.port
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_the_etcd_client_dials() {
        let t = Target::parse("https://127.0.0.1:2379", true).unwrap();
        assert_eq!(
            (t.https, &t.host, t.port),
            (true, &Host::Ip([127, 0, 0, 1].into()), 2379)
        );
        assert_eq!(t.describe(), "https, host 127.0.0.1, port 2379");
        let bare = Target::parse("127.0.0.1:2379", true).unwrap();
        assert!(bare.https, "a bare endpoint with TLS settings is https");
        assert!(!Target::parse("127.0.0.1:2379", false).unwrap().https);
        let v6 = Target::parse("https://[::1]:2379", true).unwrap();
        assert_eq!(v6.host, Host::Ip("::1".parse().unwrap()));
        assert_eq!(v6.authority(), "[::1]:2379");
        let name = Target::parse("https://c1.mesh.cilium.io", true).unwrap();
        assert_eq!(
            (name.host, name.port),
            (Host::Name("c1.mesh.cilium.io".into()), 443)
        );
        assert_eq!(Target::parse("http://h", false).unwrap().port, 80);
    }

    #[test]
    fn refuses_what_it_cannot_dial() {
        assert!(
            Target::parse("ftp://h:21", false)
                .unwrap_err()
                .contains("scheme")
        );
        assert!(Target::parse("unix:///run/etcd", false).is_err());
        assert!(Target::parse("not a url", false).is_err());
    }
}
