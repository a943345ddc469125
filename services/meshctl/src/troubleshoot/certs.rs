//! The certificates: what each one is (serial, subject, issuer, validity, as Cilium prints
//! them) and, beyond Cilium, whether it is valid now, expires within 30 days, and — for the
//! server's — names the endpoint it was reached at.

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use x509_parser::extensions::GeneralName;

use super::report::{Check, CheckKind, Status};
use super::target::Host;
use super::tls::TlsSetup;

/// A certificate closer than this to its end is a warning.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

/// What a certificate says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Hex bytes separated by `:`.
    pub serial: String,
    /// The subject, e.g. `CN=remote`.
    pub subject: String,
    /// The issuer.
    pub issuer: String,
    /// The subject's common name (the etcd user of a client certificate).
    pub common_name: Option<String>,
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
    /// The subject alternative names: DNS names and IP addresses.
    pub names: Vec<SubjectName>,
}

/// A subject alternative name a server certificate may carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectName {
    /// `DNS:…`, possibly a wildcard (`*.mesh.cilium.io`).
    Dns(String),
    /// `IP:…`.
    Ip(IpAddr),
}

/// Where a certificate stands at a given time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// Valid for more than [`EXPIRY_WARNING`].
    Valid,
    /// Valid, ending within [`EXPIRY_WARNING`], in this long.
    ExpiresSoon(Duration),
    /// Ended this long ago.
    Expired(Duration),
    /// Starts in this long.
    NotYetValid(Duration),
}

impl CertInfo {
    /// Reads a DER certificate.
    pub fn parse(der: &[u8]) -> Result<Self, String> {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|err| format!("not a valid X.509 certificate: {err}"))?;
        let names = match cert.subject_alternative_name() {
            Ok(Some(san)) => san
                .value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::DNSName(dns) => Some(SubjectName::Dns((*dns).to_owned())),
                    GeneralName::IPAddress(bytes) => ip(bytes).map(SubjectName::Ip),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        let validity = cert.validity();
        Ok(Self {
            serial: cert.raw_serial_as_string(),
            subject: cert.subject().to_string(),
            issuer: cert.issuer().to_string(),
            common_name: cert
                .subject()
                .iter_common_name()
                .next()
                .and_then(|cn| cn.as_str().ok())
                .map(str::to_owned),
            not_before: time(validity.not_before.timestamp()),
            not_after: time(validity.not_after.timestamp()),
            names,
        })
    }

    /// Where it stands at `now`.
    pub fn validity(&self, now: SystemTime) -> Validity {
        if let Ok(ahead) = self.not_before.duration_since(now)
            && !ahead.is_zero()
        {
            return Validity::NotYetValid(ahead);
        }
        match self.not_after.duration_since(now) {
            Ok(left) if left > EXPIRY_WARNING => Validity::Valid,
            Ok(left) => Validity::ExpiresSoon(left),
            Err(past) => Validity::Expired(past.duration()),
        }
    }

    /// Whether a server reached at `host` may present it (RFC 6125: an IP needs an IP name;
    /// a wildcard covers one leftmost label).
    pub fn covers(&self, host: &Host) -> bool {
        self.names.iter().any(|name| match (name, host) {
            (SubjectName::Ip(ip), Host::Ip(host)) => ip == host,
            (SubjectName::Dns(dns), Host::Name(host)) => dns_matches(dns, host),
            _ => false,
        })
    }

    /// The names, `DNS:localhost, IP:127.0.0.1`.
    pub fn names_text(&self) -> String {
        if self.names.is_empty() {
            return "no subject alternative names".to_owned();
        }
        let names: Vec<String> = self
            .names
            .iter()
            .map(|name| match name {
                SubjectName::Dns(dns) => format!("DNS:{dns}"),
                SubjectName::Ip(ip) => format!("IP:{ip}"),
            })
            .collect();
        names.join(", ")
    }

    /// Cilium's lines: serial, subject, issuer, validity.
    pub fn details(&self) -> Vec<String> {
        vec![
            format!("- serial {}", self.serial),
            format!("  subject {}", self.subject),
            format!("  issuer {}", self.issuer),
            format!(
                "  valid from {} to {}",
                rfc3339(self.not_before),
                rfc3339(self.not_after)
            ),
        ]
    }
}

/// The `trusted-ca-file` check.
pub fn trusted_ca_check(tls: &TlsSetup, now: SystemTime) -> Check {
    let kind = CheckKind::TrustedCa;
    let Some((path, cas)) = &tls.cas else {
        return Check::warn(
            kind,
            "trusted-ca-file unset: Cilium's client would use the system pool, but the \
             agent's etcd client has none, so it trusts no server",
            "set trusted-ca-file to the CA that issued the remote etcd's server certificate",
        );
    };
    let hint = "trusted-ca-file must hold the PEM CA that issued the remote etcd's certificate";
    let cas = match cas {
        Ok(cas) => cas,
        Err(err) => return Check::fail(kind, err.clone(), hint),
    };
    let infos = match parse_all(cas) {
        Ok(infos) => infos,
        Err(err) => return Check::fail(kind, format!("{}: {err}", path.display()), hint),
    };
    let summary = format!(
        "{} in {}",
        count(infos.len(), "certificate", "certificates"),
        path.display()
    );
    judge(kind, &infos, &summary, now, "the CA (trusted-ca-file)")
}

/// The `cert-file` check: readable, matching `key-file`, valid now and for 30 days more,
/// and (a warning otherwise, as in Cilium) issued by a CA of `trusted-ca-file`.
pub fn client_cert_check(tls: &TlsSetup, now: SystemTime) -> Check {
    let kind = CheckKind::ClientCert;
    let key = match &tls.client {
        None => {
            return Check::warn(
                kind,
                "none configured (cert-file, key-file)",
                "a remote etcd with client-certificate auth refuses the connection: set \
                 cert-file and key-file",
            );
        }
        Some(Err(err)) => {
            return Check::fail(
                kind,
                err.clone(),
                "fix cert-file and key-file (PEM, one pair)",
            );
        }
        Some(Ok(key)) => key,
    };
    let infos = match parse_all(&key.cert) {
        Ok(infos) => infos,
        Err(err) => return Check::fail(kind, err, "cert-file must hold PEM certificates"),
    };
    let leaf = &infos[0];
    let summary = format!(
        "{} (etcd user {}), issued by {}",
        leaf.subject,
        leaf.common_name.as_deref().unwrap_or("none: no CN"),
        leaf.issuer
    );
    let check = judge(
        kind,
        &infos,
        &summary,
        now,
        "a new client certificate (cert-file)",
    );
    if check.status != Status::Ok {
        return check;
    }
    let roots = tls.roots();
    if roots.is_empty() {
        return check;
    }
    let unix = UnixTime::since_unix_epoch(
        now.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default(),
    );
    let verified = WebPkiClientVerifier::builder_with_provider(roots.into(), tls.provider())
        .build()
        .map_err(|err| err.to_string())
        .and_then(|verifier| {
            verifier
                .verify_client_cert(&key.cert[0], &key.cert[1..], unix)
                .map_err(|err| err.to_string())
        });
    match verified {
        Ok(_) => check,
        Err(err) => Check::warn(
            kind,
            format!(
                "{} — cannot be verified with trusted-ca-file: {err}",
                check.message
            ),
            "fine only if the remote's etcd trusts the CA that issued it (the TLS check lists \
             the CAs it accepts)",
        )
        .with_details(check.details),
    }
}

/// The check of the certificate an endpoint's server presented when reached at `host`.
pub fn server_cert_check(chain: &[CertificateDer<'_>], host: &Host, now: SystemTime) -> Check {
    let kind = CheckKind::ServerCert;
    let infos = match parse_all(chain) {
        Ok(infos) => infos,
        Err(err) => return Check::fail(kind, err, "the remote must serve a valid certificate"),
    };
    let leaf = &infos[0];
    if !leaf.covers(host) {
        return Check::fail(
            kind,
            format!(
                "{} does not name {host} (it names {})",
                leaf.subject,
                leaf.names_text()
            ),
            "the agent's client refuses it too: use an endpoint the certificate names, or \
             have the remote's certificate reissued with this one",
        )
        .with_details(leaf.details());
    }
    let summary = format!("{} names {host}, issued by {}", leaf.subject, leaf.issuer);
    let check = judge(
        kind,
        &infos[..1],
        &summary,
        now,
        "the remote's server certificate",
    );
    // Its fields matter when something is wrong with it; Cilium prints none of them.
    if check.status == Status::Ok {
        check.with_details(Vec::new())
    } else {
        check
    }
}

/// The check of `infos` (the first one is described): failed when one is not valid now, a
/// warning when one ends within 30 days.
fn judge(
    kind: CheckKind,
    infos: &[CertInfo],
    summary: &str,
    now: SystemTime,
    renew: &str,
) -> Check {
    let details: Vec<String> = infos.iter().flat_map(CertInfo::details).collect();
    // The summary describes the first certificate; another one is named.
    let which = |info: &CertInfo| {
        if std::ptr::eq(info, &infos[0]) {
            String::new()
        } else {
            format!("{} ", info.subject)
        }
    };
    let worst = infos
        .iter()
        .map(|info| (info, info.validity(now)))
        .max_by_key(|(_, v)| match v {
            Validity::Valid => 0,
            Validity::ExpiresSoon(_) => 1,
            Validity::Expired(_) | Validity::NotYetValid(_) => 2,
        });
    let check = match worst {
        None | Some((_, Validity::Valid)) => Check::ok(
            kind,
            format!("{summary}; valid until {}", rfc3339(infos[0].not_after)),
        ),
        Some((info, Validity::ExpiresSoon(left))) => Check::warn(
            kind,
            format!(
                "{summary}; {}expires in {} ({})",
                which(info),
                span(left),
                rfc3339(info.not_after)
            ),
            format!("issue {renew} before it expires"),
        ),
        Some((info, Validity::Expired(ago))) => Check::fail(
            kind,
            format!(
                "{summary}; {}expired {} ago ({})",
                which(info),
                span(ago),
                rfc3339(info.not_after)
            ),
            format!("issue {renew}: an expired certificate is refused"),
        ),
        Some((info, Validity::NotYetValid(ahead))) => Check::fail(
            kind,
            format!(
                "{summary}; {}not valid before {} (in {})",
                which(info),
                rfc3339(info.not_before),
                span(ahead)
            ),
            "check this machine's clock, or issue a certificate valid now",
        ),
    };
    check.with_details(details)
}

fn parse_all(ders: &[CertificateDer<'_>]) -> Result<Vec<CertInfo>, String> {
    if ders.is_empty() {
        return Err("no certificate".to_owned());
    }
    ders.iter().map(|der| CertInfo::parse(der)).collect()
}

fn dns_matches(pattern: &str, host: &str) -> bool {
    let (pattern, host) = (pattern.to_ascii_lowercase(), host.to_ascii_lowercase());
    let host = host.trim_end_matches('.');
    match pattern.strip_prefix("*.") {
        Some(suffix) => host
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest == suffix),
        None => pattern == host,
    }
}

fn ip(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

fn time(unix: i64) -> SystemTime {
    let secs = Duration::from_secs(unix.unsigned_abs());
    if unix >= 0 {
        SystemTime::UNIX_EPOCH + secs
    } else {
        SystemTime::UNIX_EPOCH - secs
    }
}

/// UTC, whole seconds.
pub fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

/// "9 days", "5 hours", "3 minutes", "10 seconds": the largest whole unit.
pub fn span(d: Duration) -> String {
    let secs = d.as_secs();
    let (n, unit) = match secs {
        s if s >= 86_400 => (s / 86_400, "days"),
        s if s >= 3_600 => (s / 3_600, "hours"),
        s if s >= 60 => (s / 60, "minutes"),
        s => (s, "seconds"),
    };
    if n == 1 {
        format!("1 {}", unit.trim_end_matches('s'))
    } else {
        format!("{n} {unit}")
    }
}

fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn info(not_before: u64, not_after: u64) -> CertInfo {
        CertInfo {
            serial: "0a:1b".into(),
            subject: "CN=remote".into(),
            issuer: "CN=lab-ca".into(),
            common_name: Some("remote".into()),
            not_before: at(not_before),
            not_after: at(not_after),
            names: vec![
                SubjectName::Dns("*.mesh.cilium.io".into()),
                SubjectName::Dns("localhost".into()),
                SubjectName::Ip([127, 0, 0, 1].into()),
            ],
        }
    }

    const DAY: u64 = 86_400;

    #[test]
    fn validity_against_now() {
        let now = at(100 * DAY);
        assert_eq!(info(0, 200 * DAY).validity(now), Validity::Valid);
        assert_eq!(
            info(0, 109 * DAY).validity(now),
            Validity::ExpiresSoon(Duration::from_secs(9 * DAY))
        );
        assert_eq!(
            info(0, 97 * DAY).validity(now),
            Validity::Expired(Duration::from_secs(3 * DAY))
        );
        assert_eq!(
            info(102 * DAY, 300 * DAY).validity(now),
            Validity::NotYetValid(Duration::from_secs(2 * DAY))
        );
    }

    #[test]
    fn judging_fails_the_invalid_and_warns_the_soon_expiring() {
        let now = at(100 * DAY);
        let check =
            |infos: &[CertInfo]| judge(CheckKind::ClientCert, infos, "CN=remote", now, "a new one");
        assert_eq!(check(&[info(0, 200 * DAY)]).status, Status::Ok);
        let soon = check(&[info(0, 109 * DAY)]);
        assert_eq!(soon.status, Status::Warn);
        assert_eq!(
            soon.message,
            "CN=remote; expires in 9 days (1970-04-20T00:00:00Z)"
        );
        let expired = check(&[info(0, 97 * DAY)]);
        assert_eq!(expired.status, Status::Fail);
        assert!(
            expired.message.contains("expired 3 days ago"),
            "{}",
            expired.message
        );
        // An intermediate that expired fails the chain, and is named.
        let mut intermediate = info(0, 99 * DAY);
        intermediate.subject = "CN=intermediate".into();
        let chain = check(&[info(0, 200 * DAY), intermediate]);
        assert_eq!(chain.status, Status::Fail);
        assert!(
            chain
                .message
                .starts_with("CN=remote; CN=intermediate expired 1 day ago"),
            "{}",
            chain.message
        );
        assert_eq!(check(&[info(101 * DAY, 200 * DAY)]).status, Status::Fail);
        assert_eq!(
            soon.details,
            [
                "- serial 0a:1b",
                "  subject CN=remote",
                "  issuer CN=lab-ca",
                "  valid from 1970-01-01T00:00:00Z to 1970-04-20T00:00:00Z"
            ]
        );
    }

    #[test]
    fn server_names_cover_hosts_as_rfc_6125_says() {
        let cert = info(0, 1);
        assert!(cert.covers(&Host::Ip([127, 0, 0, 1].into())));
        assert!(!cert.covers(&Host::Ip([127, 0, 0, 2].into())));
        assert!(cert.covers(&Host::Name("localhost".into())));
        assert!(cert.covers(&Host::Name("c1.mesh.cilium.io".into())));
        assert!(cert.covers(&Host::Name("C1.Mesh.Cilium.IO.".into())));
        assert!(!cert.covers(&Host::Name("a.c1.mesh.cilium.io".into())));
        assert!(!cert.covers(&Host::Name("mesh.cilium.io".into())));
        // An IP in a DNS name does not count.
        assert!(!cert.covers(&Host::Name("127.0.0.1".into())));
        assert_eq!(
            cert.names_text(),
            "DNS:*.mesh.cilium.io, DNS:localhost, IP:127.0.0.1"
        );
    }

    #[test]
    fn spans_in_the_largest_whole_unit() {
        assert_eq!(span(Duration::from_secs(9 * DAY + 5)), "9 days");
        assert_eq!(span(Duration::from_secs(DAY)), "1 day");
        assert_eq!(span(Duration::from_secs(DAY - 1)), "23 hours");
        assert_eq!(span(Duration::from_secs(150)), "2 minutes");
        assert_eq!(span(Duration::from_secs(61)), "1 minute");
        assert_eq!(span(Duration::from_secs(59)), "59 seconds");
        assert_eq!(span(Duration::from_secs(1)), "1 second");
    }
}
