//! The parts on their own: variable expansion, etcd's flags, certificate names.

use crate::env::{Environment, Var};
use crate::files::Certificate;

fn environment(vars: &[(&str, &str)]) -> Environment {
    let mut env = Environment::default();
    for (name, value) in vars {
        let var = Var {
            value: (*value).to_owned(),
            service: None,
        };
        env.vars.insert((*name).to_owned(), var);
    }
    env
}

#[test]
fn variables_expand_as_the_kubelet_expands_them() {
    let env = environment(&[("A", "1"), ("B", "two")]);
    assert_eq!(env.expand("--x=$(A):$(B)").expect("resolves"), "--x=1:two");
    assert_eq!(env.expand("$$(A) stays").expect("escaped"), "$(A) stays");
    assert_eq!(env.expand("$(C) and $(A)"), Err(vec!["C".to_owned()]));
    assert_eq!(
        env.expand("no $ reference (A)").expect("plain"),
        "no $ reference (A)"
    );
    assert_eq!(Environment::referenced("$(A)/$$(B)/$(C)"), ["A", "C"]);
}

#[test]
fn etcd_flags_are_checked_against_etcds_own() {
    let argv = |args: &[&str]| -> Vec<String> {
        std::iter::once("/usr/bin/etcd")
            .chain(args.iter().copied())
            .map(str::to_owned)
            .collect()
    };
    let parsed = crate::etcd::parse(&argv(&[
        "--listen-client-urls=https://127.0.0.1:2379,https://10.0.0.1:2379",
        "--listen-metrics-urls=http://0.0.0.0:9963",
        "--client-cert-auth",
        "--cert-file=/tls/tls.crt",
    ]))
    .expect("parses");
    let ports: Vec<(u16, bool)> = parsed
        .listeners
        .iter()
        .map(|l| (l.port, l.loopback))
        .collect();
    assert_eq!(ports, [(2379, true), (2379, false), (9963, false)]);
    assert_eq!(parsed.files[0].path, "/tls/tls.crt");
    for bad in [
        &["--listen-client-url=https://a:1"][..],
        &["--client-cert-auth=true"],
        &["--name"],
        &["name=x"],
    ] {
        assert!(crate::etcd::parse(&argv(bad)).is_err(), "{bad:?}");
    }
}

#[test]
fn certificates_name_hosts_as_tls_clients_match_them() {
    let pem = include_bytes!("../../../kubernetes/components/dev-tls/server.crt");
    let cert = Certificate::from_pem(pem).expect("the dev server certificate");
    assert_eq!(cert.common_name, "clustermesh-apiserver");
    for named in [
        "clustermesh-apiserver.meshwork-system.svc",
        "mesh-2.mesh.meshwork.io",
        "127.0.0.1",
    ] {
        assert!(cert.names(named), "{named}");
    }
    for other in [
        "a.b.mesh.meshwork.io",
        "mesh.meshwork.io",
        "clustermesh-apiserver",
        "10.0.0.1",
    ] {
        assert!(!cert.names(other), "{other}");
    }
    assert!(Certificate::from_pem(b"not a certificate").is_err());
}

#[test]
fn images_hold_the_binaries_they_are_built_with() {
    use crate::binaries::image_binaries;
    assert!(
        image_binaries("meshwork/agent:dev")
            .expect("known")
            .contains(&"/usr/bin/meshctl")
    );
    assert!(image_binaries("meshwork/etcd:dev@sha256:00").is_some());
    assert!(image_binaries("localhost:5000/meshwork/etcd").is_none());
    assert!(image_binaries("meshwork/agentx:dev").is_none());
}
