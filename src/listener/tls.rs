//! Frontend TLS: the server config of an HTTPS listener, built from certificate files or
//! Secrets when a config is compiled, and the certificate choice by SNI during each handshake.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::upstream::pem::{read_certs, read_key, PemError, PemSource};

use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

/// A certificate file and its key file that cannot be served.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServerCertError {
    #[error(transparent)]
    Pem(#[from] PemError),
    #[error("certificate {cert} with key {key} is unusable: {message}")]
    Unusable {
        cert: PemSource,
        key: PemSource,
        message: String,
    },
}

/// One served certificate: the chain with its key, and the DNS names it is chosen for.
#[derive(Debug)]
pub(crate) struct ServerCertificate {
    key: Arc<CertifiedKey>,
    /// Lower-case DNS SANs of the leaf, wildcards (`*.example.com`) included.
    names: Vec<String>,
}

impl ServerCertificate {
    /// Reads and checks a PEM certificate chain (leaf first) and its PEM private key: both
    /// parse, the key is one the crypto provider can sign with, and it belongs to the leaf.
    pub(crate) fn load(
        cert: &PemSource,
        key: &PemSource,
    ) -> Result<ServerCertificate, ServerCertError> {
        let chain = read_certs(cert)?;
        let private_key = read_key(key)?;
        let unusable = |message: String| ServerCertError::Unusable {
            cert: cert.clone(),
            key: key.clone(),
            message,
        };
        let names = webpki::EndEntityCert::try_from(&chain[0])
            .map_err(|e| unusable(format!("the first certificate does not parse: {e}")))?
            .valid_dns_names()
            .map(str::to_ascii_lowercase)
            .collect();
        let certified =
            CertifiedKey::from_der(chain, private_key, &crate::upstream::tls::provider())
                .map_err(|e| unusable(e.to_string()))?;
        Ok(ServerCertificate {
            key: Arc::new(certified),
            names,
        })
    }
}

/// The ALPN protocols an HTTPS listener offers, preferred first. The connection is then served
/// by hyper-util's auto builder, which tells HTTP/2 from HTTP/1.1 by the client's first bytes
/// (the HTTP/2 preface); a client that negotiated `h2` sends that preface, one that negotiated
/// `http/1.1` (or no ALPN) sends a request line, so both agree with what ALPN chose.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The server config of an HTTPS listener. `certificates` is non-empty; the first one is
/// served when the client sends no SNI or a name no certificate covers.
pub(crate) fn server_config(
    certificates: Vec<ServerCertificate>,
    clients: Option<Arc<dyn ClientCertVerifier>>,
) -> Arc<ServerConfig> {
    let mut exact = HashMap::new();
    let mut wildcard = HashMap::new();
    let mut default = None;
    for cert in certificates {
        for name in &cert.names {
            // The first certificate naming a host wins, as the listener lists them.
            match name.strip_prefix("*.") {
                Some(parent) => wildcard
                    .entry(parent.to_owned())
                    .or_insert_with(|| cert.key.clone()),
                None => exact
                    .entry(name.clone())
                    .or_insert_with(|| cert.key.clone()),
            };
        }
        default.get_or_insert(cert.key);
    }
    let resolver = SniResolver {
        exact,
        wildcard,
        default: default.expect("an HTTPS listener has at least one certificate"),
    };
    let builder = ServerConfig::builder_with_provider(crate::upstream::tls::provider())
        .with_safe_default_protocol_versions()
        .expect("the provider supports TLS 1.2 and 1.3");
    let builder = match clients {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// Verifies client certificates against the CAs in `ca_files` (`tls.frontendValidation`);
/// `allow_missing`: a client without a certificate is let in (an invalid one never is).
pub(crate) fn client_verifier(
    ca_files: &[PathBuf],
    allow_missing: bool,
) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for path in ca_files {
        for cert in read_certs(&PemSource::file(path)).map_err(|e| e.to_string())? {
            roots
                .add(cert)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    let builder = WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        crate::upstream::tls::provider(),
    );
    let builder = if allow_missing {
        builder.allow_unauthenticated()
    } else {
        builder
    };
    builder.build().map_err(|e| e.to_string())
}

/// Chooses the certificate for a ClientHello: an exact DNS SAN match, else a wildcard SAN
/// covering the name (`*.example.com` covers exactly one more label), else the default.
#[derive(Debug)]
struct SniResolver {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// By the part after `*.`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    default: Arc<CertifiedKey>,
}

impl SniResolver {
    fn choose(&self, sni: Option<&str>) -> Arc<CertifiedKey> {
        let Some(name) = sni else {
            return self.default.clone();
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        self.exact
            .get(&name)
            .or_else(|| {
                name.split_once('.')
                    .and_then(|(_, parent)| self.wildcard.get(parent))
            })
            .unwrap_or(&self.default)
            .clone()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.choose(hello.server_name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::sign::{Signer, SigningKey};
    use rustls::{SignatureAlgorithm, SignatureScheme};

    /// The resolver only hands keys out, never signs: a key that cannot sign will do.
    #[derive(Debug)]
    struct NoSigning;

    impl SigningKey for NoSigning {
        fn choose_scheme(&self, _offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
            None
        }

        fn algorithm(&self) -> SignatureAlgorithm {
            SignatureAlgorithm::ECDSA
        }
    }

    /// A key told apart by its (fake) one-certificate chain.
    fn key(label: &str) -> Arc<CertifiedKey> {
        Arc::new(CertifiedKey::new(
            vec![rustls::pki_types::CertificateDer::from(
                label.as_bytes().to_vec(),
            )],
            Arc::new(NoSigning),
        ))
    }

    fn label(k: &CertifiedKey) -> String {
        String::from_utf8(k.cert[0].to_vec()).unwrap()
    }

    #[test]
    fn sni_picks_exact_then_wildcard_then_default() {
        let resolver = SniResolver {
            exact: HashMap::from([
                ("a.example.com".to_owned(), key("a")),
                ("b.example.com".to_owned(), key("b")),
            ]),
            wildcard: HashMap::from([("example.com".to_owned(), key("wild"))]),
            default: key("default"),
        };
        let pick = |sni: Option<&str>| label(&resolver.choose(sni));
        assert_eq!(pick(Some("a.example.com")), "a");
        assert_eq!(pick(Some("B.Example.com.")), "b");
        assert_eq!(pick(Some("c.example.com")), "wild");
        // A wildcard covers one label only.
        assert_eq!(pick(Some("x.c.example.com")), "default");
        assert_eq!(pick(Some("example.com")), "default");
        assert_eq!(pick(Some("other.test")), "default");
        assert_eq!(pick(None), "default");
    }
}
