//! Each of Meshwork's binaries' command lines, parsed by that binary's own parser (the
//! library's `parse_args`), then checked as the binary checks it before it starts (but the
//! files it reads).

use meshwork_cni::install::CliCommand as CniCommand;

use super::{Binary, ConfigDir, HEALTH, METRICS, METRICS_AND_HEALTH, Parsed, Protocol, Reader};

/// `meshwork-agent`.
pub(super) fn agent(argv: &[String]) -> Result<Parsed, String> {
    let args = meshwork_agent::args::parse_args(argv).map_err(|e| e.to_string())?;
    // What `Args::validate` checks, but the TLS files it reads.
    meshwork_types::validate_max_connected_clusters(args.max_connected_clusters)
        .map_err(|e| format!("--max-connected-clusters: {e}"))?;
    meshwork_types::validate_cluster_name(&args.cluster_name)
        .map_err(|e| format!("--cluster-name: {e}"))?;
    if args.cluster_id != 0 {
        meshwork_types::validate_cluster_id(args.cluster_id, args.max_connected_clusters)
            .map_err(|e| format!("--cluster-id: {e}"))?;
    }
    let node = args
        .node_name
        .clone()
        .ok_or("--node-name (K8S_NODE_NAME) is not set")?;
    meshwork_types::validate_node_name(&node).map_err(|e| format!("--node-name {node:?}: {e}"))?;
    args.ipam
        .validate(args.ipv4_alloc_cidr.as_deref())
        .map_err(|e| e.to_string())?;
    let mut parsed = Parsed::new_for(Binary::Agent);
    parsed.listen(
        "prometheus-serve-addr",
        &args.prometheus_serve_addr,
        Protocol::Http(METRICS_AND_HEALTH),
    )?;
    parsed.api_socket = Some(args.api_socket().display().to_string());
    parsed.file("apiserver-ca-file", args.apiserver_ca_file.as_deref());
    parsed.file("apiserver-cert-file", args.apiserver_cert_file.as_deref());
    parsed.file("apiserver-key-file", args.apiserver_key_file.as_deref());
    parsed.file("operator-tls-ca", args.ipam.operator_tls_ca.as_deref());
    parsed.file("operator-tls-cert", args.ipam.operator_tls_cert.as_deref());
    parsed.file("operator-tls-key", args.ipam.operator_tls_key.as_deref());
    if let Some(addr) = &args.apiserver_addr {
        parsed.dial("apiserver-addr", addr, args.apiserver_ca_file.is_some())?;
    }
    if let Some(addr) = &args.ipam.operator_addr {
        parsed.dial("operator-addr", addr, addr.starts_with("https://"))?;
    }
    if let Some(dir) = &args.clustermesh_config {
        parsed.config_dir = Some(ConfigDir {
            dir: dir.display().to_string(),
            local_cluster: args.cluster_name.clone(),
            reader: Reader::Agent,
        });
    }
    Ok(parsed)
}

/// `meshwork-operator`.
pub(super) fn operator(argv: &[String]) -> Result<Parsed, String> {
    let cli = meshwork_operator::args::parse_args(argv).map_err(|e| e.to_string())?;
    let mut parsed = Parsed::new_for(Binary::Operator);
    if cli.command.is_some() {
        return Ok(parsed);
    }
    let run = cli.run;
    // What the binary checks before it starts, but the TLS files it reads.
    match (run.kube, run.kvstore_endpoints.is_empty()) {
        (true, true) => parsed.kube_operator = Some(run.leader_election.k8s_namespace.clone()),
        (false, false) => {}
        _ => return Err("exactly one of --kube and --kvstore-endpoints".to_owned()),
    }
    if run.aws_region.as_deref().is_none_or(str::is_empty) {
        return Err("--aws-region (or AWS_REGION) is required".to_owned());
    }
    run.leader_election
        .timing()
        .validate()
        .map_err(|e| e.to_string())?;
    parsed.listen(
        "prometheus-serve-addr",
        &run.prometheus_serve_addr,
        Protocol::Http(METRICS_AND_HEALTH),
    )?;
    let tls = run.grpc_tls_cert.is_some();
    parsed.listen(
        "grpc-serve-addr",
        &run.grpc_serve_addr,
        Protocol::Grpc { tls },
    )?;
    parsed.file("grpc-tls-cert", run.grpc_tls_cert.as_deref());
    parsed.file("grpc-tls-key", run.grpc_tls_key.as_deref());
    parsed.file("grpc-tls-client-ca", run.grpc_tls_client_ca.as_deref());
    parsed.kvstore(
        &run.kvstore_endpoints,
        run.kvstore_trusted_ca_file.as_deref(),
        run.kvstore_cert_file.as_deref(),
        run.kvstore_key_file.as_deref(),
    )?;
    Ok(parsed)
}

/// `meshwork-apiserver`, `kvstoremesh` and `etcd-init` included.
pub(super) fn apiserver(argv: &[String]) -> Result<Parsed, String> {
    use meshwork_apiserver::cli::Command;
    let cli = meshwork_apiserver::cli::parse_args(argv).map_err(|e| e.to_string())?;
    let mut parsed = Parsed::new_for(Binary::Apiserver);
    let (cluster, kvstore) = match &cli.command {
        None => {
            let (Some(name), Some(id)) = (&cli.cluster_name, cli.cluster_id) else {
                return Err("--cluster-name and --cluster-id are required".to_owned());
            };
            cluster_checks(name, id, cli.max_connected_clusters)?;
            let tls = cli.grpc_cert_file.is_some();
            parsed.listen(
                "grpc-serve-addr",
                &cli.grpc_serve_addr,
                Protocol::Grpc { tls },
            )?;
            parsed.listen(
                "health-serve-addr",
                &cli.health_serve_addr,
                Protocol::Http(HEALTH),
            )?;
            parsed.listen(
                "prometheus-serve-addr",
                &cli.prometheus_serve_addr,
                Protocol::Http(METRICS),
            )?;
            parsed.file("grpc-cert-file", cli.grpc_cert_file.as_deref());
            parsed.file("grpc-key-file", cli.grpc_key_file.as_deref());
            parsed.file("grpc-ca-file", cli.grpc_ca_file.as_deref());
            (name.clone(), &cli.kvstore)
        }
        Some(Command::Kvstoremesh(args)) => {
            cluster_checks(
                &args.cluster_name,
                args.cluster_id,
                args.max_connected_clusters,
            )?;
            parsed.listen(
                "health-serve-addr",
                &args.health_serve_addr,
                Protocol::Http(HEALTH),
            )?;
            parsed.listen(
                "api-serve-addr",
                &args.api_serve_addr,
                Protocol::Grpc { tls: false },
            )?;
            parsed.listen(
                "prometheus-serve-addr",
                &args.prometheus_serve_addr,
                Protocol::Http(METRICS),
            )?;
            parsed.config_dir = Some(ConfigDir {
                dir: args.clustermesh_config.display().to_string(),
                local_cluster: args.cluster_name.clone(),
                reader: Reader::Kvstoremesh,
            });
            (args.cluster_name.clone(), &args.kvstore)
        }
        Some(Command::EtcdInit {
            cluster_name,
            kvstore,
        }) => {
            meshwork_types::validate_cluster_name(cluster_name)
                .map_err(|e| format!("--cluster-name: {e}"))?;
            (cluster_name.clone(), kvstore)
        }
    };
    parsed.kvstore(
        &kvstore.kvstore_endpoints,
        kvstore.kvstore_trusted_ca_file.as_deref(),
        kvstore.kvstore_cert_file.as_deref(),
        kvstore.kvstore_key_file.as_deref(),
    )?;
    if let Some(cert) = &kvstore.kvstore_cert_file {
        // Its own etcd, as the cluster's admin (role root).
        let users = vec![format!("admin-{cluster}"), "root".to_owned()];
        parsed.etcd_user = Some((cert.display().to_string(), users));
    }
    Ok(parsed)
}

/// The cluster's name and ID, as the apiserver and kvstoremesh check them.
fn cluster_checks(name: &str, id: u32, max: u32) -> Result<(), String> {
    meshwork_types::validate_cluster_name(name).map_err(|e| format!("--cluster-name: {e}"))?;
    meshwork_types::validate_max_connected_clusters(max)
        .map_err(|e| format!("--max-connected-clusters: {e}"))?;
    meshwork_types::validate_cluster_id(id, max).map_err(|e| format!("--cluster-id: {e}"))
}

/// `meshctl` (what it probes, for `health`).
pub(super) fn meshctl(argv: &[String]) -> Result<Parsed, String> {
    use meshctl::cli::Command;
    let cli = meshctl::cli::parse_args(argv).map_err(|e| e.to_string())?;
    let mut parsed = Parsed::new_for(Binary::Meshctl);
    if let Command::Health(health) = &cli.command {
        parsed.health = Some((cli.socket.display().to_string(), health.grpc_addr.clone()));
    }
    Ok(parsed)
}

/// `meshwork-cni install`.
pub(super) fn cni(argv: &[String]) -> Result<Parsed, String> {
    let cli = meshwork_cni::install::parse_args(argv).map_err(|e| e.to_string())?;
    let CniCommand::Install(install) = cli.command;
    let mut parsed = Parsed::new_for(Binary::Cni);
    parsed.install = Some(install);
    Ok(parsed)
}
