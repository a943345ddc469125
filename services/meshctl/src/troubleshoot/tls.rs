//! The TLS handshake with one endpoint, made as the agent's etcd client makes it — rustls
//! with aws-lc-rs, TLS 1.2 and 1.3, and `trusted-ca-file` as the only roots (tonic adds no
//! system pool) — but choosing the client certificate as Go's etcd client does (only if a
//! CA the server names issued it), and keeping what the server showed for the report: its
//! certificates and the CAs it accepts. No ALPN is offered, so `GET /version` can follow on
//! HTTP/1.1.

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use meshwork_kvstore::EtcdConfig;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, Error, ProtocolVersion, RootCertStore,
    SignatureScheme,
};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::target::Host;

/// A cluster's TLS files, read once for all its endpoints.
#[derive(Debug)]
pub struct TlsSetup {
    provider: Arc<CryptoProvider>,
    /// `trusted-ca-file` and its certificates (or why they cannot be read); `None`: unset.
    pub cas: Option<(PathBuf, Result<Vec<CertificateDer<'static>>, String>)>,
    /// `cert-file` with `key-file`, loaded and checked to match; `None`: unset.
    pub client: Option<Result<Arc<CertifiedKey>, String>>,
}

/// What one handshake showed.
pub struct Handshake {
    /// The connection, or why the handshake failed.
    pub stream: Result<TlsStream<TcpStream>, io::Error>,
    /// The certificates the server presented (its own first).
    pub server_chain: Option<Vec<CertificateDer<'static>>>,
    /// The server asked for a client certificate, naming these CAs (DER names; possibly
    /// none).
    pub requested: Option<Vec<Vec<u8>>>,
    /// Our certificate was issued by none of the CAs the server named, so none was sent.
    pub declined: bool,
}

impl TlsSetup {
    /// Reads the TLS files of `config`.
    pub fn load(config: &EtcdConfig) -> Self {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let cas = config
            .trusted_ca_file
            .as_ref()
            .map(|path| (path.clone(), read_certs(path)));
        let client = match (&config.cert_file, &config.key_file) {
            (Some(cert), Some(key)) => Some(load_client(cert, key, &provider)),
            _ => None,
        };
        Self {
            provider,
            cas,
            client,
        }
    }

    /// The roots a server certificate must chain to: the readable CAs of `trusted-ca-file`.
    pub fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        if let Some((_, Ok(certs))) = &self.cas {
            roots.add_parsable_certificates(certs.iter().cloned());
        }
        roots
    }

    /// The provider, for verifying our own certificates.
    pub fn provider(&self) -> Arc<CryptoProvider> {
        Arc::clone(&self.provider)
    }

    /// A handshake with the server at `host` over `tcp`.
    pub async fn handshake(&self, tcp: TcpStream, host: &Host) -> Handshake {
        let verifier = Arc::new(Recorder::new(self.roots(), self.provider()));
        let chooser = Arc::new(Chooser::new(
            self.client.as_ref().and_then(|c| c.clone().ok()),
        ));
        let observed = |stream| Handshake {
            stream,
            server_chain: verifier.seen(),
            requested: chooser.requested(),
            declined: chooser.declined(),
        };
        let server_name = match host {
            Host::Ip(ip) => ServerName::IpAddress((*ip).into()),
            Host::Name(name) => match ServerName::try_from(name.clone()) {
                Ok(name) => name,
                Err(err) => return observed(Err(io::Error::other(err))),
            },
        };
        let config = match ClientConfig::builder_with_provider(self.provider())
            .with_safe_default_protocol_versions()
        {
            // `dangerous` is rustls' door to a custom verifier; the recorder verifies as the
            // default one does.
            Ok(builder) => builder
                .dangerous()
                .with_custom_certificate_verifier(verifier.clone())
                .with_client_cert_resolver(chooser.clone()),
            Err(err) => return observed(Err(io::Error::other(err))),
        };
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        observed(connector.connect(server_name, tcp).await)
    }
}

/// "TLS 1.3, TLS13_AES_256_GCM_SHA384".
pub fn negotiated(stream: &TlsStream<TcpStream>) -> String {
    let (_, connection) = stream.get_ref();
    let version = match connection.protocol_version() {
        Some(ProtocolVersion::TLSv1_3) => "TLS 1.3".to_owned(),
        Some(ProtocolVersion::TLSv1_2) => "TLS 1.2".to_owned(),
        Some(other) => format!("{other:?}"),
        None => "unknown version".to_owned(),
    };
    let suite = connection.negotiated_cipher_suite().map_or_else(
        || "unknown cipher suite".to_owned(),
        |s| format!("{:?}", s.suite()),
    );
    format!("{version}, {suite}")
}

/// The rustls error inside an I/O error of a TLS stream, if that is what it is.
pub fn rustls_error(err: &io::Error) -> Option<&Error> {
    err.get_ref()
        .and_then(|inner| inner.downcast_ref::<Error>())
}

/// What to do about a failed handshake.
pub fn handshake_hint(err: &io::Error) -> &'static str {
    match rustls_error(err) {
        Some(Error::InvalidCertificate(CertificateError::UnknownIssuer)) => {
            "trusted-ca-file must hold the CA that issued the server's certificate (its issuer \
             is under `server certificate`)"
        }
        Some(Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        )) => {
            "use an endpoint the server's certificate names, or have the remote's certificate \
             reissued with this one"
        }
        Some(Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        )) => "the server's certificate expired: the remote must renew it",
        Some(Error::AlertReceived(_)) => {
            "the server refused the handshake: check cert-file and key-file against what the \
             remote's etcd trusts"
        }
        _ => "is this endpoint an etcd serving TLS? (an http:// endpoint takes no TLS settings)",
    }
}

fn read_certs(path: &PathBuf) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

fn load_client(
    cert: &PathBuf,
    key: &PathBuf,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, String> {
    let chain = read_certs(cert)?;
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|err| format!("cannot read the key {}: {err}", key.display()))?;
    CertifiedKey::from_der(chain, key_der, provider)
        .map(Arc::new)
        .map_err(|err| match err {
            Error::InconsistentKeys(_) => format!(
                "key-file {} is not the key of cert-file {}",
                key.display(),
                cert.display()
            ),
            other => format!("cannot use the key {}: {other}", key.display()),
        })
}

/// Verifies the server as the agent does, keeping the certificates it presented.
#[derive(Debug)]
struct Recorder {
    /// `None` with no roots: every certificate is then of an unknown issuer, as for tonic.
    inner: Option<Arc<WebPkiServerVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
    seen: Mutex<Option<Vec<CertificateDer<'static>>>>,
}

impl Recorder {
    fn new(roots: RootCertStore, provider: Arc<CryptoProvider>) -> Self {
        let algorithms = provider.signature_verification_algorithms;
        let inner = (!roots.is_empty())
            .then(|| WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build())
            .and_then(Result::ok);
        Self {
            inner,
            algorithms,
            seen: Mutex::new(None),
        }
    }

    fn seen(&self) -> Option<Vec<CertificateDer<'static>>> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let chain = std::iter::once(end_entity)
            .chain(intermediates)
            .map(|c| c.clone().into_owned())
            .collect();
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = Some(chain);
        match &self.inner {
            Some(inner) => {
                inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            }
            None => Err(Error::InvalidCertificate(CertificateError::UnknownIssuer)),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Offers our certificate only when the server names a CA that issued one in its chain (Go's
/// `SupportsCertificate`, which Cilium's check relies on), and remembers what it was asked.
#[derive(Debug)]
struct Chooser {
    key: Option<Arc<CertifiedKey>>,
    /// The DER issuer names of our chain.
    issuers: Vec<Vec<u8>>,
    asked: Mutex<Option<(Vec<Vec<u8>>, bool)>>,
}

impl Chooser {
    fn new(key: Option<Arc<CertifiedKey>>) -> Self {
        let issuers = key
            .iter()
            .flat_map(|key| key.cert.iter())
            .filter_map(|der| {
                x509_parser::parse_x509_certificate(der)
                    .ok()
                    .map(|(_, cert)| cert.issuer().as_raw().to_vec())
            })
            .collect();
        Self {
            key,
            issuers,
            asked: Mutex::new(None),
        }
    }

    fn requested(&self) -> Option<Vec<Vec<u8>>> {
        let asked = self.asked.lock().unwrap_or_else(PoisonError::into_inner);
        asked.as_ref().map(|(names, _)| names.clone())
    }

    fn declined(&self) -> bool {
        let asked = self.asked.lock().unwrap_or_else(PoisonError::into_inner);
        asked.as_ref().is_some_and(|(_, declined)| *declined)
    }
}

impl ResolvesClientCert for Chooser {
    fn resolve(
        &self,
        root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        let matches = root_hint_subjects.is_empty()
            || self
                .issuers
                .iter()
                .any(|issuer| root_hint_subjects.contains(&issuer.as_slice()));
        let offered = self.key.clone().filter(|_| matches);
        let names = root_hint_subjects.iter().map(|n| n.to_vec()).collect();
        *self.asked.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((names, self.key.is_some() && offered.is_none()));
        offered
    }

    fn has_certs(&self) -> bool {
        self.key.is_some()
    }
}
