//! TLS origination: client configs built once per Backend port when a snapshot is compiled
//! (their certificate verifier is in [`super::verify`]), and the classification of handshake
//! failures into causes people can act on.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use super::pem::{read_certs, read_key, PemError, PemSource};
use super::verify::CertVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::ServerName;
use rustls::{CertificateError, ClientConfig, RootCertStore};

/// How one Backend port originates TLS.
#[derive(Debug)]
pub(crate) struct TlsOrigination {
    pub(crate) config: Arc<ClientConfig>,
    /// The same, offering only `http/1.1` in ALPN: for requests that must stay on HTTP/1.1
    /// (websocket upgrades). The same object as `config` when that offers no `h2`.
    pub(crate) http1_config: Arc<ClientConfig>,
    /// The SNI to send; `None` for IP endpoints without a configured name (no SNI is sent and
    /// the certificate is checked against the endpoint's IP address).
    pub(crate) sni: Option<ServerName<'static>>,
}

impl TlsOrigination {
    /// The name the handshake with `addr` uses.
    pub(crate) fn server_name(&self, addr: SocketAddr) -> ServerName<'static> {
        self.sni
            .clone()
            .unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()))
    }
}

/// What to trust.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Roots {
    /// The platform store (`wellKnownCACertificates: System`).
    System,
    /// PEM bundles (files, or ConfigMap/Secret keys).
    Pem(Vec<PemSource>),
}

/// What the server certificate must name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum NameCheck {
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
pub(crate) struct TlsSpec {
    pub(crate) roots: Roots,
    pub(crate) names: NameCheck,
    /// (certificate chain, private key) for Mutual.
    pub(crate) client_cert: Option<(PemSource, PemSource)>,
    pub(crate) versions: Vec<TlsVersion>,
    pub(crate) alpn: Vec<Vec<u8>>,
    /// SNI (None: the endpoint IP is verified and no SNI is sent).
    pub(crate) sni: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum TlsVersion {
    V1_2,
    V1_3,
}

/// A TLS setting that cannot be turned into a client config.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsConfigError {
    #[error(transparent)]
    Pem(#[from] PemError),
    #[error("{origin}: not a usable CA certificate: {message}")]
    CaCertificate { origin: PemSource, message: String },
    #[error("client certificate {cert} with key {key} is unusable: {message}")]
    ClientCertificate {
        cert: PemSource,
        key: PemSource,
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

impl TlsConfigError {
    /// The file or Secret key the error is about, as the error names it (`PemSource`'s
    /// display), when it is one CA bundle or certificate.
    pub(crate) fn origin(&self) -> Option<&str> {
        match self {
            TlsConfigError::Pem(
                PemError::Read { origin, .. }
                | PemError::NoCertificate { origin }
                | PemError::NoKey { origin },
            ) => Some(origin),
            _ => None,
        }
    }
}

/// The crypto provider every config uses.
pub(crate) fn provider() -> Arc<CryptoProvider> {
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
pub(crate) fn build(spec: &TlsSpec) -> Result<TlsOrigination, TlsConfigError> {
    let provider = provider();
    let roots = root_store(&spec.roots)?;
    let versions = protocol_versions(&spec.versions);
    let verifier = Arc::new(CertVerifier::new(&spec.names, roots, &provider)?);
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
    Ok(TlsOrigination {
        http1_config: http1_only(&config),
        config,
        sni,
    })
}

/// The certificates to trust: the platform store, or the PEM bundles read now.
fn root_store(roots: &Roots) -> Result<Arc<RootCertStore>, TlsConfigError> {
    match roots {
        Roots::System => system_roots(),
        Roots::Pem(sources) => {
            let mut store = RootCertStore::empty();
            for source in sources {
                for cert in read_certs(source)? {
                    store.add(cert).map_err(|e| TlsConfigError::CaCertificate {
                        origin: source.clone(),
                        message: e.to_string(),
                    })?;
                }
            }
            Ok(Arc::new(store))
        }
    }
}

/// rustls's names of the versions to offer.
fn protocol_versions(versions: &[TlsVersion]) -> Vec<&'static rustls::SupportedProtocolVersion> {
    versions
        .iter()
        .map(|v| match v {
            TlsVersion::V1_2 => &rustls::version::TLS12,
            TlsVersion::V1_3 => &rustls::version::TLS13,
        })
        .collect()
}

/// `config` offering only `http/1.1` in ALPN (for websocket upgrades); `config` itself when it
/// offers no `h2`.
fn http1_only(config: &Arc<ClientConfig>) -> Arc<ClientConfig> {
    if config.alpn_protocols.iter().any(|p| p == b"h2") {
        let mut http1 = (**config).clone();
        http1.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(http1)
    } else {
        config.clone()
    }
}

/// Why a TLS handshake with an upstream failed, in words an operator can act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum TlsFailure {
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
    pub(crate) fn code(self) -> &'static str {
        crate::telemetry::metrics::UPSTREAM_TLS_CAUSES[self as usize]
    }

    /// One line on what it means.
    pub(crate) fn explain(self) -> &'static str {
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
    pub(crate) fn from_rustls(e: &rustls::Error) -> TlsFailure {
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
    pub(crate) fn from_error_chain(e: &(dyn std::error::Error + 'static)) -> Option<TlsFailure> {
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
