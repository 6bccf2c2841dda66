//! TLS origination: client configs built once per Backend port when a snapshot is compiled,
//! the verifier that honours `validation.hostname` / `subjectAltNames`, and the classification
//! of handshake failures into causes people can act on.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use super::pem::{read_certs, read_key, PemError};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// How one Backend port originates TLS.
#[derive(Debug)]
pub struct TlsOrigination {
    pub config: Arc<ClientConfig>,
    /// The same, offering only `http/1.1` in ALPN: for requests that must stay on HTTP/1.1
    /// (websocket upgrades). The same object as `config` when that offers no `h2`.
    pub http1_config: Arc<ClientConfig>,
    /// The SNI to send; `None` for IP endpoints without a configured name (no SNI is sent and
    /// the certificate is checked against the endpoint's IP address).
    pub sni: Option<ServerName<'static>>,
}

impl TlsOrigination {
    /// The name the handshake with `addr` uses.
    pub fn server_name(&self, addr: SocketAddr) -> ServerName<'static> {
        self.sni
            .clone()
            .unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()))
    }
}

/// What to trust.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Roots {
    /// The platform store (`wellKnownCACertificates: System`).
    System,
    /// PEM bundles.
    Files(Vec<PathBuf>),
}

/// What the server certificate must name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum NameCheck {
    /// The name the handshake uses (SNI, or the endpoint IP).
    ServerName,
    /// Any of these DNS names or IP addresses (`validation.hostname`, `subjectAltNames` of
    /// type Hostname), or any of these URI SANs (type URI, e.g. SPIFFE IDs).
    Expected {
        names: Vec<String>,
        uris: Vec<String>,
    },
    /// Nothing at all: `insecureSkipVerify` (chain not checked either).
    SkipVerify,
}

/// Everything a TLS client config is built from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TlsSpec {
    pub roots: Roots,
    pub names: NameCheck,
    /// (certificate chain file, private key file) for Mutual.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    pub versions: Vec<TlsVersion>,
    pub alpn: Vec<Vec<u8>>,
    /// SNI (None: the endpoint IP is verified and no SNI is sent).
    pub sni: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TlsVersion {
    V1_2,
    V1_3,
}

/// A TLS setting that cannot be turned into a client config.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    #[error(transparent)]
    Pem(#[from] PemError),
    #[error("{path}: not a usable CA certificate: {message}")]
    CaCertificate { path: PathBuf, message: String },
    #[error("client certificate {cert} with key {key} is unusable: {message}")]
    ClientCertificate {
        cert: PathBuf,
        key: PathBuf,
        message: String,
    },
    #[error("the system trust store has no usable certificate{0}")]
    NoSystemRoots(String),
    #[error("invalid server name `{0}`")]
    ServerName(String),
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
    #[error("cannot build the certificate verifier: {0}")]
    Verifier(String),
}

/// The crypto provider every config uses.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .clone()
}

/// The platform trust store, loaded once per process (it is large and does not change under
/// a running process often enough to re-read it on every reload).
fn system_roots() -> Result<Arc<RootCertStore>, TlsConfigError> {
    static SYSTEM: OnceLock<Result<Arc<RootCertStore>, String>> = OnceLock::new();
    SYSTEM
        .get_or_init(|| {
            let loaded = rustls_native_certs::load_native_certs();
            let mut store = RootCertStore::empty();
            let (added, _ignored) = store.add_parsable_certificates(loaded.certs);
            if added == 0 {
                let why = loaded
                    .errors
                    .first()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default();
                return Err(why);
            }
            Ok(Arc::new(store))
        })
        .clone()
        .map_err(TlsConfigError::NoSystemRoots)
}

/// Builds the client config for a spec. Reads the referenced files (certificates, keys, CA
/// bundles) now, so a broken file is reported when the config is loaded, not at the first
/// request.
pub fn build(spec: &TlsSpec) -> Result<TlsOrigination, TlsConfigError> {
    let provider = provider();
    let roots = match &spec.roots {
        Roots::System => system_roots()?,
        Roots::Files(files) => {
            let mut store = RootCertStore::empty();
            for file in files {
                for cert in read_certs(file)? {
                    store.add(cert).map_err(|e| TlsConfigError::CaCertificate {
                        path: file.clone(),
                        message: e.to_string(),
                    })?;
                }
            }
            Arc::new(store)
        }
    };
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = spec
        .versions
        .iter()
        .map(|v| match v {
            TlsVersion::V1_2 => &rustls::version::TLS12,
            TlsVersion::V1_3 => &rustls::version::TLS13,
        })
        .collect();
    let webpki = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()
        .map_err(|e| TlsConfigError::Verifier(e.to_string()))?;
    let verifier: Arc<dyn ServerCertVerifier> = match &spec.names {
        NameCheck::ServerName => webpki,
        NameCheck::Expected { names, uris } => {
            let names = names
                .iter()
                .map(|n| {
                    ServerName::try_from(n.clone())
                        .map_err(|_| TlsConfigError::ServerName(n.clone()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            if uris.is_empty() {
                Arc::new(ExpectedNames { webpki, names })
            } else {
                Arc::new(ExpectedIdentities {
                    webpki,
                    roots,
                    names,
                    uris: uris.clone(),
                    provider: provider.clone(),
                })
            }
        }
        NameCheck::SkipVerify => Arc::new(SkipVerify { webpki }),
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match &spec.client_cert {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(read_certs(cert)?, read_key(key)?)
            .map_err(|e| TlsConfigError::ClientCertificate {
                cert: cert.clone(),
                key: key.clone(),
                message: e.to_string(),
            })?,
    };
    config.alpn_protocols = spec.alpn.clone();
    let sni = match &spec.sni {
        None => None,
        Some(name) => Some(
            ServerName::try_from(name.clone())
                .map_err(|_| TlsConfigError::ServerName(name.clone()))?,
        ),
    };
    let config = Arc::new(config);
    let http1_config = if spec.alpn.iter().any(|p| p == b"h2") {
        let mut http1 = (*config).clone();
        http1.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(http1)
    } else {
        config.clone()
    };
    Ok(TlsOrigination {
        config,
        http1_config,
        sni,
    })
}

/// Our verifiers only change how the certificate is judged; signatures over the handshake are
/// always checked by rustls's own verifier (held in the `webpki` field).
macro_rules! handshake_signatures_by_webpki {
    () => {
        fn verify_tls12_signature(
            &self,
            m: &[u8],
            c: &CertificateDer<'_>,
            d: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.webpki.verify_tls12_signature(m, c, d)
        }

        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &CertificateDer<'_>,
            d: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.webpki.verify_tls13_signature(m, c, d)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.webpki.supported_verify_schemes()
        }
    };
}

/// Verifies the chain as usual, then accepts any of the configured names instead of the SNI.
#[derive(Debug)]
struct ExpectedNames {
    webpki: Arc<WebPkiServerVerifier>,
    names: Vec<ServerName<'static>>,
}

impl ServerCertVerifier for ExpectedNames {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut last = rustls::Error::InvalidCertificate(CertificateError::NotValidForName);
        for name in &self.names {
            match self
                .webpki
                .verify_server_cert(end_entity, intermediates, name, ocsp, now)
            {
                Ok(ok) => return Ok(ok),
                // A chain problem is the same for every name: report it as is.
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) => {}
                Err(other) => return Err(other),
            }
            last = rustls::Error::InvalidCertificate(CertificateError::NotValidForName);
        }
        Err(last)
    }

    handshake_signatures_by_webpki!();
}

/// Verifies the chain, then requires one of the configured URI SANs (SPIFFE IDs and the like)
/// or one of the configured names. rustls's verifier only checks DNS and IP names, so the
/// chain is verified with webpki directly here.
#[derive(Debug)]
struct ExpectedIdentities {
    webpki: Arc<WebPkiServerVerifier>,
    roots: Arc<RootCertStore>,
    names: Vec<ServerName<'static>>,
    uris: Vec<String>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for ExpectedIdentities {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        cert.verify_for_usage(
            self.provider.signature_verification_algorithms.all,
            &self.roots.roots,
            intermediates,
            now,
            webpki::KeyUsage::server_auth(),
            None,
            None,
        )
        .map_err(|e| rustls::Error::InvalidCertificate(certificate_error(e)))?;
        let uri_ok = cert
            .valid_uri_names()
            .any(|uri| self.uris.iter().any(|want| want == uri));
        let name_ok = || {
            self.names
                .iter()
                .any(|n| cert.verify_is_valid_for_subject_name(n).is_ok())
        };
        if uri_ok || name_ok() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName,
            ))
        }
    }

    handshake_signatures_by_webpki!();
}

/// `insecureSkipVerify`: accepts any certificate. Signatures over the handshake are still
/// checked (they prove the peer holds the key of the certificate it sent, whatever that is).
#[derive(Debug)]
struct SkipVerify {
    webpki: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for SkipVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    handshake_signatures_by_webpki!();
}

/// The rustls name of a webpki chain error (as rustls itself maps them).
fn certificate_error(e: webpki::Error) -> CertificateError {
    match e {
        webpki::Error::UnknownIssuer => CertificateError::UnknownIssuer,
        webpki::Error::CertExpired { .. } | webpki::Error::InvalidCertValidity => {
            CertificateError::Expired
        }
        webpki::Error::CertNotValidYet { .. } => CertificateError::NotValidYet,
        webpki::Error::CertRevoked => CertificateError::Revoked,
        webpki::Error::InvalidSignatureForPublicKey => CertificateError::BadSignature,
        _ => CertificateError::BadEncoding,
    }
}

/// Why a TLS handshake with an upstream failed, in words an operator can act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TlsFailure {
    UnknownCa,
    Expired,
    NotYetValid,
    NameMismatch,
    BadCertificate,
    ClientCertRequired,
    PlaintextPeer,
    HandshakeTimeout,
    ProtocolVersion,
    Other,
}

impl TlsFailure {
    /// The cause code in replies, logs and metric labels.
    pub fn code(self) -> &'static str {
        match self {
            TlsFailure::UnknownCa => "unknown_ca",
            TlsFailure::Expired => "expired",
            TlsFailure::NotYetValid => "not_yet_valid",
            TlsFailure::NameMismatch => "name_mismatch",
            TlsFailure::BadCertificate => "bad_certificate",
            TlsFailure::ClientCertRequired => "client_cert_required",
            TlsFailure::PlaintextPeer => "plaintext_peer",
            TlsFailure::HandshakeTimeout => "handshake_timeout",
            TlsFailure::ProtocolVersion => "protocol_version",
            TlsFailure::Other => "handshake_failed",
        }
    }

    /// One line on what it means.
    pub fn explain(self) -> &'static str {
        match self {
            TlsFailure::UnknownCa => "the server certificate is not signed by a trusted CA (check validation.caCertificateFiles)",
            TlsFailure::Expired => "the server certificate has expired",
            TlsFailure::NotYetValid => "the server certificate is not valid yet (check the clocks)",
            TlsFailure::NameMismatch => "the server certificate does not name the expected host (check sni / validation.hostname / subjectAltNames)",
            TlsFailure::BadCertificate => "the server certificate is malformed or unusable",
            TlsFailure::ClientCertRequired => "the server requires a client certificate (use tls.mode Mutual)",
            TlsFailure::PlaintextPeer => "the server answered in plaintext, not TLS (use tls.mode InsecureDisable, or the TLS port)",
            TlsFailure::HandshakeTimeout => "the server did not complete the TLS handshake in time",
            TlsFailure::ProtocolVersion => "no TLS version or cipher suite in common with the server (check minVersion/maxVersion)",
            TlsFailure::Other => "the TLS handshake failed",
        }
    }

    /// Classifies a rustls error.
    pub fn from_rustls(e: &rustls::Error) -> TlsFailure {
        use rustls::AlertDescription as A;
        match e {
            rustls::Error::InvalidCertificate(c) => match c {
                CertificateError::UnknownIssuer => TlsFailure::UnknownCa,
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    TlsFailure::Expired
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    TlsFailure::NotYetValid
                }
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => TlsFailure::NameMismatch,
                _ => TlsFailure::BadCertificate,
            },
            rustls::Error::AlertReceived(A::CertificateRequired) => TlsFailure::ClientCertRequired,
            rustls::Error::AlertReceived(A::ProtocolVersion | A::InsufficientSecurity) => {
                TlsFailure::ProtocolVersion
            }
            rustls::Error::PeerIncompatible(_) => TlsFailure::ProtocolVersion,
            // A plaintext HTTP server answers the ClientHello with "HTTP/1.1 400 ...": not a
            // TLS record.
            rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType) => {
                TlsFailure::PlaintextPeer
            }
            _ => TlsFailure::Other,
        }
    }

    /// Finds a rustls error in an I/O or hyper error chain and classifies it.
    pub fn from_error_chain(e: &(dyn std::error::Error + 'static)) -> Option<TlsFailure> {
        let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(err) = current {
            if let Some(tls) = err.downcast_ref::<rustls::Error>() {
                return Some(TlsFailure::from_rustls(tls));
            }
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                if let Some(inner) = io.get_ref() {
                    if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
                        return Some(TlsFailure::from_rustls(tls));
                    }
                }
            }
            current = err.source();
        }
        None
    }
}
