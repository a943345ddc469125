//! TLS on the operator's gRPC listener, and the mTLS rule: with a client CA, a client
//! certificate is required (the handshake refuses a client without one) and its subject's
//! common name must be the node the request speaks for — a node registers, watches and
//! reports only itself.
//!
//! The listener uses tonic's rustls with aws-lc-rs (`tls-aws-lc`), the one crypto provider
//! the rest of the operator (aws-sdk-ec2, kube) already builds.

use tonic::transport::{Certificate, CertificateDer, Identity, ServerTlsConfig};
use tonic::{Request, Status};

/// PEM material of the listener.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The server certificate chain.
    pub cert: Vec<u8>,
    /// Its private key.
    pub key: Vec<u8>,
    /// The CA of the clients' certificates: mTLS, and the node-is-CN rule.
    pub client_ca: Option<Vec<u8>>,
}

impl TlsFiles {
    /// tonic's server configuration: the identity and, with a client CA, required client
    /// certificates signed by it.
    pub fn server_config(&self) -> ServerTlsConfig {
        let mut config = ServerTlsConfig::new().identity(Identity::from_pem(&self.cert, &self.key));
        if let Some(ca) = &self.client_ca {
            config = config.client_ca_root(Certificate::from_pem(ca));
        }
        config
    }

    /// Whether requests must come from the node their client certificate names.
    pub fn node_is_cn(&self) -> bool {
        self.client_ca.is_some()
    }
}

/// The subject's common name of a DER certificate.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = certificate.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_owned)
}

/// The common name of the request's client certificate (the first of its chain).
pub fn client_cn<T>(request: &Request<T>) -> Option<String> {
    let certificates = request.peer_certs()?;
    certificates
        .first()
        .and_then(|der: &CertificateDer<'static>| common_name(der.as_ref()))
}

/// `Ok` when the client certificate's CN is `node`; PERMISSION_DENIED otherwise.
pub fn check_node(cn: Option<&str>, node: &str) -> Result<(), Status> {
    match cn {
        Some(cn) if cn == node => Ok(()),
        Some(cn) => Err(Status::permission_denied(format!(
            "a client whose certificate's CN is {cn:?} may not speak for node {node:?}"
        ))),
        None => Err(Status::permission_denied(format!(
            "no client certificate with a common name: may not speak for node {node:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_node_the_certificate_names_passes() {
        assert!(check_node(Some("node-1"), "node-1").is_ok());
        let other = check_node(Some("node-2"), "node-1").expect_err("another node");
        assert_eq!(other.code(), tonic::Code::PermissionDenied);
        assert!(other.message().contains("node-2"), "{}", other.message());
        let none = check_node(None, "node-1").expect_err("no certificate");
        assert_eq!(none.code(), tonic::Code::PermissionDenied);
    }

    #[test]
    fn garbage_has_no_common_name() {
        assert_eq!(common_name(b"not a certificate"), None);
    }
}
