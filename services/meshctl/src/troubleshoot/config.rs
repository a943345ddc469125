//! The clustermesh config directory, read exactly as the agent reads it: the same scan and
//! the same parser (`meshwork-clustermesh`'s `config_dir`), so a file that fails here fails
//! there, with the same message.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use meshwork_clustermesh::config_dir::{
    ClusterConfigEvent, ConfigDirError, ConfigDirState, ScannedFile, scan_dir,
};
use meshwork_kvstore::EtcdConfig;

use super::report::{Check, CheckKind};

/// One remote cluster's file.
#[derive(Debug, Clone)]
pub struct ClusterFile {
    /// The cluster's name: the file's name.
    pub name: String,
    /// The file.
    pub path: PathBuf,
    /// Its etcd client config, or why the agent cannot use it.
    pub config: Result<EtcdConfig, String>,
}

/// The clusters of `dir`: every file the agent takes for a cluster config, or only `names`
/// (a name without such a file is reported, not skipped).
pub fn read(dir: &Path, names: Option<&[String]>) -> Result<Vec<ClusterFile>, ConfigDirError> {
    let scan = scan_dir(dir)?;
    // No local cluster: meshctl does not know its name, and files are never named "".
    let mut state = ConfigDirState::new(dir, "");
    let mut parsed: BTreeMap<String, Result<EtcdConfig, String>> = BTreeMap::new();
    for event in state.apply(&scan) {
        match event {
            ClusterConfigEvent::Upsert { name, config } => {
                parsed.insert(name, Ok(config.etcd));
            }
            ClusterConfigEvent::Invalid { name, error } => {
                parsed.insert(name, Err(error));
            }
            ClusterConfigEvent::Remove { .. } => {}
        }
    }
    let file = |name: &str, config| ClusterFile {
        name: name.to_owned(),
        path: dir.join(name),
        config,
    };
    Ok(match names {
        None => parsed
            .into_iter()
            .map(|(name, config)| file(&name, config))
            .collect(),
        Some(names) => names
            .iter()
            .map(|name| {
                let config = parsed
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| Err(not_a_config(dir, name, scan.get(name))));
                file(name, config)
            })
            .collect(),
    })
}

/// Why a requested cluster has no config.
fn not_a_config(dir: &Path, name: &str, scanned: Option<&ScannedFile>) -> String {
    let path = dir.join(name);
    match scanned {
        None => format!("{}: no such file", path.display()),
        // Cilium's rule: a file without `endpoints:` is not a cluster config.
        Some(_) => format!(
            "{}: does not contain `endpoints:`, so it is no cluster config",
            path.display()
        ),
    }
}

/// The first check: whether the file parses, and what it configures.
pub fn check(file: &ClusterFile) -> Check {
    match &file.config {
        Ok(config) => Check::ok(CheckKind::Config, describe(config)),
        Err(error) => Check::fail(
            CheckKind::Config,
            error.clone(),
            "fix the file: the agent cannot connect this cluster until it parses \
             (`meshctl status` shows the same error)",
        ),
    }
}

fn describe(config: &EtcdConfig) -> String {
    let endpoints = match config.endpoints.len() {
        1 => "1 endpoint".to_owned(),
        n => format!("{n} endpoints"),
    };
    if !config.uses_tls() {
        return format!("{endpoints}; plain http");
    }
    let files: Vec<&str> = [
        config.trusted_ca_file.as_ref().map(|_| "trusted-ca-file"),
        config.cert_file.as_ref().map(|_| "cert-file"),
        config.key_file.as_ref().map(|_| "key-file"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if files.is_empty() {
        format!("{endpoints}; TLS without files")
    } else {
        format!("{endpoints}; TLS: {}", files.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::troubleshoot::report::Status;

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, content) in files {
            std::fs::write(dir.path().join(name), content).unwrap();
        }
        dir
    }

    #[test]
    fn reads_every_cluster_config_as_the_agent_does() {
        let dir = dir_with(&[
            (
                "c1",
                "endpoints:\n- https://127.0.0.1:2379\ntrusted-ca-file: ca.crt\n",
            ),
            ("c2", "endpoints: [\"https://h:1\"]\ncert-file: /c\n"),
            ("notes", "nothing to see\n"),
            (".hidden", "endpoints:\n- http://127.0.0.1:1\n"),
        ]);
        let files = read(dir.path(), None).unwrap();
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["c1", "c2"]);
        let c1 = files[0].config.as_ref().unwrap();
        // Relative paths resolve against the directory, as in the agent.
        assert_eq!(
            c1.trusted_ca_file.as_deref(),
            Some(dir.path().join("ca.crt").as_path())
        );
        let c2 = files[1].config.as_ref().unwrap_err();
        assert!(c2.contains("must be given together"), "{c2}");
        assert_eq!(check(&files[0]).status, Status::Ok);
        assert_eq!(check(&files[0]).message, "1 endpoint; TLS: trusted-ca-file");
        assert_eq!(check(&files[1]).status, Status::Fail);
    }

    #[test]
    fn named_clusters_without_a_config_are_reported() {
        let dir = dir_with(&[
            ("c1", "endpoints:\n- http://127.0.0.1:2379\n"),
            ("x", "hi\n"),
        ]);
        let names = ["c1".to_owned(), "x".to_owned(), "gone".to_owned()];
        let files = read(dir.path(), Some(&names)).unwrap();
        assert_eq!(check(&files[0]).message, "1 endpoint; plain http");
        let x = files[1].config.as_ref().unwrap_err();
        assert!(x.ends_with("/x: does not contain `endpoints:`, so it is no cluster config"));
        let gone = files[2].config.as_ref().unwrap_err();
        assert!(gone.ends_with("/gone: no such file"), "{gone}");
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let err = read(Path::new("/nonexistent/meshwork"), None).unwrap_err();
        assert!(err.to_string().contains("does not exist"), "{err}");
    }
}
