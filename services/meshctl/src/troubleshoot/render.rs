//! The report as text (one line per check: ✔, ⚠ or ✖, the check, what was found) and as
//! one line of JSON.

use std::fmt::Write as _;

use super::report::{Check, ClusterReport, Report, Status};

/// The human view. Each endpoint's checks are grouped under it, in the order they ran.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    if report.clusters.is_empty() {
        let _ = writeln!(
            out,
            "No remote clusters configured in {}",
            report.config_dir
        );
        return out;
    }
    for cluster in &report.clusters {
        render_cluster(&mut out, cluster);
        out.push('\n');
    }
    out.push_str(&summary(report));
    out
}

fn render_cluster(out: &mut String, cluster: &ClusterReport) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "Cluster {} ({})", cluster.name, cluster.config_file);
    let mut endpoint: Option<&str> = None;
    for check in &cluster.checks {
        let indent = match check.endpoint.as_deref() {
            Some(ep) => {
                if endpoint != Some(ep) {
                    let _ = writeln!(out, "  {ep}");
                }
                endpoint = Some(ep);
                "    "
            }
            None => {
                endpoint = None;
                "  "
            }
        };
        render_check(out, indent, check);
    }
}

fn render_check(out: &mut String, indent: &str, check: &Check) {
    let _ = writeln!(
        out,
        "{indent}{} {}: {}",
        symbol(check.status),
        check.check.title(),
        check.message
    );
    for line in &check.details {
        let _ = writeln!(out, "{indent}    {line}");
    }
    if let Some(hint) = &check.hint {
        let _ = writeln!(out, "{indent}    hint: {hint}");
    }
}

/// ✔, ⚠ or ✖.
pub fn symbol(status: Status) -> char {
    match status {
        Status::Ok => '✔',
        Status::Warn => '⚠',
        Status::Fail => '✖',
    }
}

fn summary(report: &Report) -> String {
    let count = |status| {
        report
            .clusters
            .iter()
            .filter(|c| c.status == status)
            .count()
    };
    let total = report.clusters.len();
    format!(
        "{total} {} checked: {} ok, {} with warnings, {} failing\n",
        if total == 1 { "cluster" } else { "clusters" },
        count(Status::Ok),
        count(Status::Warn),
        count(Status::Fail),
    )
}

/// The report as one newline-terminated line of JSON, in the field order of [`Report`].
pub fn to_json_line(report: &Report) -> String {
    // Plain structs of strings, enums and lists always serialize.
    let mut line = serde_json::to_string(report).expect("the report serializes");
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::troubleshoot::report::sample;

    #[test]
    fn one_line_per_check_grouped_by_endpoint() {
        let expected = "\
Cluster c2 (/etc/meshwork/clustermesh/c2)
  ✔ config file: 1 endpoint; TLS: trusted-ca-file, cert-file
  https://127.0.0.1:2379
    ✔ URL: https, host 127.0.0.1, port 2379
    ✔ TCP: connected to 127.0.0.1:2379
    ✔ TLS: TLS 1.3, TLS13_AES_256_GCM_SHA384
  ⚠ client certificate: CN=remote expires in 9 days (2026-12-11T00:00:00Z)
      serial 0a:1b
      issuer CN=lab-ca
      hint: issue a new client certificate (cert-file) before it expires

Cluster c3 (/etc/meshwork/clustermesh/c3)
  ✔ config file: 1 endpoint; plain http
  http://127.0.0.1:2381
    ✖ TCP: cannot connect to 127.0.0.1:2381: Connection refused (os error 111)
        hint: is the remote's etcd running and listening there?

2 clusters checked: 0 ok, 1 with warnings, 1 failing
";
        assert_eq!(render(&sample()), expected);
    }

    #[test]
    fn no_clusters() {
        let report = Report::new("/etc/cm", Vec::new());
        assert_eq!(
            render(&report),
            "No remote clusters configured in /etc/cm\n"
        );
    }

    #[test]
    fn json_is_one_line_of_the_documented_shape() {
        let line = to_json_line(&sample());
        assert!(line.ends_with('\n') && line.lines().count() == 1);
        let expected = concat!(
            r#"{"config_dir":"/etc/meshwork/clustermesh","status":"fail","clusters":["#,
            r#"{"name":"c2","config_file":"/etc/meshwork/clustermesh/c2","status":"warn","checks":["#,
            r#"{"check":"config","endpoint":null,"status":"ok","#,
            r#""message":"1 endpoint; TLS: trusted-ca-file, cert-file","details":[],"hint":null},"#,
        );
        assert!(line.starts_with(expected), "{line}");
        let json: serde_json::Value = serde_json::from_str(&line).unwrap();
        let cert = &json["clusters"][0]["checks"][4];
        assert_eq!(cert["check"], "client-cert");
        assert_eq!(cert["status"], "warn");
        assert_eq!(cert["details"][0], "serial 0a:1b");
        let tcp = &json["clusters"][1]["checks"][1];
        assert_eq!(
            (&tcp["check"], &tcp["endpoint"], &tcp["status"]),
            (
                &serde_json::json!("tcp"),
                &serde_json::json!("http://127.0.0.1:2381"),
                &serde_json::json!("fail")
            )
        );
    }
}
