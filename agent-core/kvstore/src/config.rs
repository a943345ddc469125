//! How to reach an etcd cluster: Cilium's etcd client configuration.

use std::path::PathBuf;

use super::KvstoreError;

/// Endpoints and TLS files, as in Cilium's per-cluster etcd config file (`endpoints`,
/// `trusted-ca-file`, `cert-file`, `key-file`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct EtcdConfig {
    /// Client URLs, e.g. `https://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// CA that signed the server certificate.
    pub trusted_ca_file: Option<PathBuf>,
    /// Client certificate (its CN is the etcd user).
    pub cert_file: Option<PathBuf>,
    /// Key of the client certificate.
    pub key_file: Option<PathBuf>,
}

impl EtcdConfig {
    /// A config with plain endpoints and no TLS.
    pub fn new(endpoints: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// Whether TLS files are configured.
    pub fn uses_tls(&self) -> bool {
        self.trusted_ca_file.is_some() || self.cert_file.is_some()
    }

    /// Checks the combination of fields before any connection attempt.
    pub fn validate(&self) -> Result<(), KvstoreError> {
        if self.endpoints.is_empty() {
            return Err(KvstoreError::Config("no endpoints".to_owned()));
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(KvstoreError::Config(
                "cert-file and key-file must be given together".to_owned(),
            ));
        }
        Ok(())
    }

    pub(crate) fn tls_options(&self) -> Result<Option<etcd_client::TlsOptions>, KvstoreError> {
        if !self.uses_tls() {
            return Ok(None);
        }
        let mut tls = etcd_client::TlsOptions::new();
        if let Some(ca) = &self.trusted_ca_file {
            let pem = read("trusted-ca-file", ca)?;
            tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
        }
        if let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) {
            let cert = read("cert-file", cert)?;
            let key = read("key-file", key)?;
            tls = tls.identity(etcd_client::Identity::from_pem(cert, key));
        }
        Ok(Some(tls))
    }
}

fn read(what: &'static str, path: &PathBuf) -> Result<Vec<u8>, KvstoreError> {
    std::fs::read(path).map_err(|source| KvstoreError::TlsFile {
        what,
        path: path.clone(),
        error: source,
    })
}
