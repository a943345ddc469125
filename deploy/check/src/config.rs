//! What the binaries read: the ConfigMap's keys (each one reaching the flag of its name),
//! the files their flags name (present on a mount, certificates naming the right etcd
//! user), the clustermesh config directories (parsed by the agent's own parser, the files
//! they name present beside them), and the CNI plugin's conflist (naming the socket the
//! agent serves, as the node sees it).

use std::collections::BTreeMap;

use meshwork_clustermesh::config_dir::{ClusterConfigEvent, ConfigDirState, ScannedFile};

use crate::Finding;
use crate::analysis::{Analyzed, Pod};
use crate::binaries::{Binary, Reader};
use crate::files::{self, Certificate, Found};
use crate::manifest::Manifests;

/// The ConfigMap keyed like Cilium's `cilium-config`.
pub const CONFIG_MAP: &str = "meshwork-config";

/// Cilium's clustermesh config directory, where the agent reads it.
pub const CILIUM_CLUSTERMESH_DIR: &str = "/var/lib/cilium/clustermesh";

/// Runs every check of this module.
pub fn check(manifests: &Manifests, pods: &[Pod<'_>], findings: &mut Vec<Finding>) {
    config_keys(manifests, pods, findings);
    for pod in pods {
        for analyzed in &pod.containers {
            file_flags(manifests, pod, analyzed, findings);
            config_dir(manifests, pods, pod, analyzed, findings);
        }
        cni(pod, findings);
    }
}

/// Every key of the ConfigMap reaches one flag named like it (`operator-` keys the
/// operator's), as `--<flag>=$(VAR)` with VAR taken from that key.
fn config_keys(manifests: &Manifests, pods: &[Pod<'_>], findings: &mut Vec<Finding>) {
    for config in manifests
        .of_kind("ConfigMap")
        .filter(|c| c.name() == CONFIG_MAP)
    {
        let namespace = config.namespace().unwrap_or("default");
        let mut used: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for pod in pods
            .iter()
            .filter(|pod| pod.workload.namespace() == namespace)
        {
            for analyzed in &pod.containers {
                let raw = analyzed.container.argv();
                for env in analyzed.container.value["env"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    let reference = &env["valueFrom"]["configMapKeyRef"];
                    if reference["name"] != CONFIG_MAP {
                        continue;
                    }
                    let key = reference["key"].as_str().unwrap_or_default().to_owned();
                    let var = env["name"].as_str().unwrap_or_default();
                    let suffix = format!("=$({var})");
                    let flags: Vec<String> = raw
                        .iter()
                        .filter_map(|arg| arg.strip_suffix(&suffix)?.strip_prefix("--"))
                        .map(str::to_owned)
                        .collect();
                    let id = pod.id(analyzed.container.name());
                    if flags.is_empty() {
                        findings.push(Finding::new(
                            &id,
                            format!("env {var} (key {key}) reaches no --flag=$({var})"),
                        ));
                    }
                    for flag in &flags {
                        if *flag != key && key.strip_prefix("operator-") != Some(flag.as_str()) {
                            findings.push(Finding::new(
                                &id,
                                format!(
                                    "key {key} sets --{flag}: keys are named like the flag they set"
                                ),
                            ));
                        }
                    }
                    used.entry(key).or_default().extend(flags);
                }
            }
        }
        for key in files::object_data("ConfigMap", &config.value).keys() {
            if used.get(key).is_none_or(Vec::is_empty) {
                findings.push(Finding::new(
                    &config.id(),
                    format!("key {key} reaches no binary"),
                ));
            }
        }
    }
}

/// Every file a flag names is on a mount that holds it; an etcd client certificate names
/// the etcd user it must be.
fn file_flags(
    manifests: &Manifests,
    pod: &Pod<'_>,
    analyzed: &Analyzed<'_>,
    findings: &mut Vec<Finding>,
) {
    let Some(parsed) = &analyzed.parsed else {
        return;
    };
    let id = pod.id(analyzed.container.name());
    for file in &parsed.files {
        if let Found::Missing(why) =
            files::find(manifests, &pod.workload, &analyzed.container, &file.path)
        {
            findings.push(Finding::new(
                &id,
                format!("--{} {}: {why}", file.flag, file.path),
            ));
        }
    }
    if let Some((path, users)) = &parsed.etcd_user
        && let Found::File(pem) = files::find(manifests, &pod.workload, &analyzed.container, path)
    {
        check_user(&id, path, &pem, users, findings);
    }
}

/// A client certificate's CN is one of `users` (etcd's user for it).
fn check_user(id: &str, path: &str, pem: &[u8], users: &[String], findings: &mut Vec<Finding>) {
    match Certificate::from_pem(pem) {
        Ok(cert) if users.contains(&cert.common_name) => {}
        Ok(cert) => findings.push(Finding::new(
            id,
            format!(
                "{path}: CN {} is not the etcd user it needs ({})",
                cert.common_name,
                users.join(" or ")
            ),
        )),
        Err(why) => findings.push(Finding::new(id, format!("{path}: {why}"))),
    }
}

/// A clustermesh config directory: on a mount, at Cilium's path for the agent, each file
/// valid for the agent's own parser, the files each names beside it, and the client
/// certificate the etcd user its reader must be.
fn config_dir(
    manifests: &Manifests,
    pods: &[Pod<'_>],
    pod: &Pod<'_>,
    analyzed: &Analyzed<'_>,
    findings: &mut Vec<Finding>,
) {
    let Some(dir) = analyzed.parsed.as_ref().and_then(|p| p.config_dir.clone()) else {
        return;
    };
    let id = pod.id(analyzed.container.name());
    let path = dir.dir.trim_end_matches('/');
    if dir.reader == Reader::Agent && path != CILIUM_CLUSTERMESH_DIR {
        findings.push(Finding::new(
            &id,
            format!(
                "--clustermesh-config {}: Cilium's is {CILIUM_CLUSTERMESH_DIR}",
                dir.dir
            ),
        ));
    }
    let mount = analyzed
        .container
        .mounts()
        .into_iter()
        .find(|m| m.path.trim_end_matches('/') == path);
    let Some(files) = mount.and_then(|m| files::volume_files(manifests, &pod.workload, &m.name))
    else {
        findings.push(Finding::new(
            &id,
            format!(
                "--clustermesh-config {}: no Secret volume is mounted there",
                dir.dir
            ),
        ));
        return;
    };
    let scan: BTreeMap<String, ScannedFile> = files
        .iter()
        .map(|(name, bytes)| (name.clone(), ScannedFile::Content(bytes.clone())))
        .collect();
    let mut state = ConfigDirState::new(path, dir.local_cluster.clone());
    let user = match dir.reader {
        Reader::Agent => format!("local-{}", dir.local_cluster),
        Reader::Kvstoremesh => "remote".to_owned(),
    };
    for event in state.apply(&scan) {
        match event {
            ClusterConfigEvent::Invalid { name, error } => {
                findings.push(Finding::new(
                    &id,
                    format!("remote {name}: the agent's parser refuses it: {error}"),
                ));
            }
            ClusterConfigEvent::Upsert { name, config } => {
                let etcd = &config.etcd;
                let named = [&etcd.trusted_ca_file, &etcd.cert_file, &etcd.key_file];
                for file in named.into_iter().flatten() {
                    let relative = file
                        .strip_prefix(path)
                        .ok()
                        .map(|p| p.display().to_string());
                    if relative.as_ref().is_none_or(|r| !files.contains_key(r)) {
                        findings.push(Finding::new(
                            &id,
                            format!("remote {name}: {} is not in {path}", file.display()),
                        ));
                    }
                }
                if let Some(cert) = &etcd.cert_file
                    && let Some(pem) = cert
                        .strip_prefix(path)
                        .ok()
                        .and_then(|r| files.get(&r.display().to_string()))
                {
                    check_user(
                        &id,
                        &cert.display().to_string(),
                        pem,
                        std::slice::from_ref(&user),
                        findings,
                    );
                }
                for endpoint in &etcd.endpoints {
                    let what = format!("remote {name}");
                    crate::dials::check_endpoint(
                        manifests,
                        pods,
                        pod,
                        (&id, &what),
                        endpoint,
                        findings,
                    );
                }
            }
            ClusterConfigEvent::Remove { .. } => {}
        }
    }
}

/// The CNI plugin installed from the agent's pod names, as the node sees it, the socket the
/// agent serves, and goes where the runtime looks (host paths).
fn cni(pod: &Pod<'_>, findings: &mut Vec<Finding>) {
    let agent = pod
        .containers
        .iter()
        .find(|c| c.parsed.as_ref().is_some_and(|p| p.binary == Binary::Agent));
    for analyzed in &pod.containers {
        let Some(install) = analyzed.parsed.as_ref().and_then(|p| p.install.as_ref()) else {
            continue;
        };
        let id = pod.id(analyzed.container.name());
        for (flag, dir, host) in [
            ("cni-bin-dir", &install.cni_bin_dir, "/opt/cni/bin"),
            ("cni-conf-dir", &install.cni_conf_dir, "/etc/cni/net.d"),
        ] {
            let dir = dir.display().to_string();
            match host_path(pod, analyzed, &dir) {
                Some(on_host) if on_host == host => {}
                Some(on_host) => findings.push(Finding::new(
                    &id,
                    format!(
                        "--{flag} {dir} is the node's {on_host}, not {host} where runtimes look"
                    ),
                )),
                None => findings.push(Finding::new(
                    &id,
                    format!("--{flag} {dir} is not on a hostPath volume: the node never sees it"),
                )),
            }
        }
        // The conflist it writes is one the plugin itself accepts (as a runtime hands it).
        let list: serde_json::Value =
            serde_json::from_str(&meshwork_cni::install::conflist(install)).unwrap_or_default();
        let mut entry = list["plugins"][0].clone();
        entry["cniVersion"] = list["cniVersion"].clone();
        entry["name"] = list["name"].clone();
        if let Err(err) = meshwork_cni::NetConf::parse(entry.to_string().as_bytes()) {
            findings.push(Finding::new(
                &id,
                format!("the conflist it writes is refused by the plugin: {err}"),
            ));
        }
        let wanted = install.agent_socket.display().to_string();
        let Some(agent) = agent else {
            findings.push(Finding::new(
                &id,
                "installs the CNI plugin, but no agent runs in the pod",
            ));
            continue;
        };
        let socket = agent
            .parsed
            .as_ref()
            .and_then(|p| p.api_socket.clone())
            .unwrap_or_default();
        match host_path(pod, agent, &socket) {
            Some(on_host) if on_host == wanted => {}
            Some(on_host) => findings.push(Finding::new(
                &id,
                format!("--agent-socket {wanted}: the agent's socket is {on_host} on the node"),
            )),
            None => findings.push(Finding::new(
                &id,
                format!(
                    "--agent-socket {wanted}: the agent's socket {socket} is on no hostPath volume"
                ),
            )),
        }
    }
}

/// Where `path` of a container is on the node, if it is under a hostPath mount.
fn host_path(pod: &Pod<'_>, analyzed: &Analyzed<'_>, path: &str) -> Option<String> {
    analyzed
        .container
        .mounts()
        .into_iter()
        .filter_map(|mount| {
            let base = mount.path.trim_end_matches('/').to_owned();
            let rest = if path.trim_end_matches('/') == base {
                String::new()
            } else {
                path.strip_prefix(&base)?.strip_prefix('/')?.to_owned()
            };
            let host = pod.workload.volume(&mount.name)?["hostPath"]["path"]
                .as_str()?
                .trim_end_matches('/')
                .to_owned();
            Some((
                base.len(),
                if rest.is_empty() {
                    host
                } else {
                    format!("{host}/{rest}")
                },
            ))
        })
        .max_by_key(|(depth, _)| *depth)
        .map(|(_, host)| host)
}
