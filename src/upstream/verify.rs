//! The one server-certificate verifier of egressd's TLS connections (Backend ports, their
//! health checks, `egressd check --probe`): the chain against the port's roots, then the names
//! the port expects (`validation.hostname` / `subjectAltNames`, else the handshake's server
//! name), or nothing at all under `insecureSkipVerify`. Signatures over the handshake are always
//! checked, whatever the certificate check. It can keep the chain the server presented, which
//! is how the probe's diagnostic handshake reads a certificate that failed verification.

use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::tls::{NameCheck, TlsConfigError};

/// Judges server certificates as one port asks; see the module documentation.
#[derive(Debug)]
pub(crate) struct CertVerifier {
    check: Check,
    /// The crypto provider's signature algorithms: handshake signatures are checked with them.
    algorithms: WebPkiSupportedAlgorithms,
    /// Where the first chain presented is kept, when asked to keep it.
    presented: Option<OnceLock<Vec<CertificateDer<'static>>>>,
}

/// How the certificate is judged.
#[derive(Debug)]
enum Check {
    /// The chain, and the name the handshake uses (the SNI, or the endpoint IP): rustls's own
    /// verifier.
    ServerName(Arc<WebPkiServerVerifier>),
    /// The chain, then any of these names instead of the handshake's.
    Names {
        webpki: Arc<WebPkiServerVerifier>,
        names: Vec<ServerName<'static>>,
    },
    /// The chain, then any of these URI SANs (SPIFFE IDs and the like) or names. rustls's
    /// verifier only checks DNS and IP names, so the chain is verified with webpki directly.
    Identities {
        roots: Arc<RootCertStore>,
        names: Vec<ServerName<'static>>,
        uris: Vec<String>,
    },
    /// Any certificate: `insecureSkipVerify`, and the probe's diagnostic handshake.
    Nothing,
}

impl CertVerifier {
    /// The verifier of a port whose certificate must name what `names` says, signed by `roots`.
    pub(crate) fn new(
        names: &NameCheck,
        roots: Arc<RootCertStore>,
        provider: &Arc<CryptoProvider>,
    ) -> Result<CertVerifier, TlsConfigError> {
        let webpki = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| TlsConfigError::Verifier(e.to_string()))?;
        let check = match names {
            NameCheck::ServerName => Check::ServerName(webpki),
            NameCheck::Expected { names, uris } => {
                let names = names
                    .iter()
                    .map(|n| {
                        ServerName::try_from(n.clone())
                            .map_err(|_| TlsConfigError::ServerName(n.clone()))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if uris.is_empty() {
                    Check::Names { webpki, names }
                } else {
                    Check::Identities {
                        roots,
                        names,
                        uris: uris.clone(),
                    }
                }
            }
            NameCheck::SkipVerify => Check::Nothing,
        };
        Ok(CertVerifier {
            check,
            algorithms: provider.signature_verification_algorithms,
            presented: None,
        })
    }

    /// Accepts any certificate and keeps the chain the server presents (read it with
    /// [`presented_chain`](Self::presented_chain)). Handshake signatures are still verified,
    /// so the chain kept is one the peer holds the key for.
    pub(crate) fn keeping_any_chain(provider: &CryptoProvider) -> CertVerifier {
        CertVerifier {
            check: Check::Nothing,
            algorithms: provider.signature_verification_algorithms,
            presented: Some(OnceLock::new()),
        }
    }

    /// The first chain presented (leaf first), if this verifier keeps chains and saw one.
    pub(crate) fn presented_chain(&self) -> Option<Vec<CertificateDer<'static>>> {
        self.presented.as_ref()?.get().cloned()
    }

    /// Judges the certificate (not the handshake signatures).
    fn judge(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match &self.check {
            Check::ServerName(webpki) => {
                webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
            }
            Check::Names { webpki, names } => {
                any_name(webpki, names, end_entity, intermediates, ocsp, now)
            }
            Check::Identities { roots, names, uris } => {
                let cert = webpki::EndEntityCert::try_from(end_entity).map_err(|_| {
                    rustls::Error::InvalidCertificate(CertificateError::BadEncoding)
                })?;
                cert.verify_for_usage(
                    self.algorithms.all,
                    &roots.roots,
                    intermediates,
                    now,
                    webpki::KeyUsage::server_auth(),
                    None,
                    None,
                )
                .map_err(|e| rustls::Error::InvalidCertificate(certificate_error(e)))?;
                if names_any_identity(&cert, names, uris) {
                    Ok(ServerCertVerified::assertion())
                } else {
                    Err(rustls::Error::InvalidCertificate(
                        CertificateError::NotValidForName,
                    ))
                }
            }
            Check::Nothing => Ok(ServerCertVerified::assertion()),
        }
    }
}

impl ServerCertVerifier for CertVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(presented) = &self.presented {
            let chain = std::iter::once(end_entity)
                .chain(intermediates)
                .map(|c| c.clone().into_owned())
                .collect();
            let _ = presented.set(chain);
        }
        self.judge(end_entity, intermediates, server_name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Verifies the chain as usual, then accepts any of `names` instead of the handshake's name.
fn any_name(
    webpki: &WebPkiServerVerifier,
    names: &[ServerName<'static>],
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    ocsp: &[u8],
    now: UnixTime,
) -> Result<ServerCertVerified, rustls::Error> {
    for name in names {
        match webpki.verify_server_cert(end_entity, intermediates, name, ocsp, now) {
            Ok(ok) => return Ok(ok),
            // A chain problem is the same for every name: report it as is.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => {}
            Err(other) => return Err(other),
        }
    }
    Err(rustls::Error::InvalidCertificate(
        CertificateError::NotValidForName,
    ))
}

/// Whether the certificate names any of `names` (webpki's subject-name check) or carries any
/// of `uris` as a URI SAN (compared exactly). The chain is not looked at.
pub(crate) fn names_any_identity(
    cert: &webpki::EndEntityCert<'_>,
    names: &[ServerName<'_>],
    uris: &[String],
) -> bool {
    cert.valid_uri_names()
        .any(|uri| uris.iter().any(|want| want == uri))
        || names
            .iter()
            .any(|n| cert.verify_is_valid_for_subject_name(n).is_ok())
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
