//! Reading PEM certificate chains and private keys, from files or from bytes the config holds
//! (a `Secret`'s or `ConfigMap`'s key), with errors that name where the PEM came from and never
//! what it holds. Shared by TLS origination (client certificates, CA bundles) and HTTPS
//! listeners.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject};

use crate::bounded::file::{read_regular_file, MAX_PEM_FILE};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Where PEM material comes from.
#[derive(Clone, Debug)]
pub(crate) enum PemSource {
    /// A file, read when a config is compiled (and watched).
    File(PathBuf),
    /// Bytes held by the config itself: one key of a `Secret` or `ConfigMap`.
    Inline(Arc<InlinePem>),
}

/// PEM bytes held by the config, with what they are and where they were written.
pub(crate) struct InlinePem {
    /// E.g. ``Secret team-a/client key `tls.crt` ``: the source's identity.
    pub(crate) name: String,
    /// E.g. `certs.yaml:5:12`: where the value is written (not part of the identity, so that
    /// an edit above it in the file changes nothing).
    pub(crate) written_at: String,
    pub(crate) pem: Arc<[u8]>,
}

impl fmt::Debug for InlinePem {
    // The bytes may be a private key: a `{:?}` anywhere must not print them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InlinePem")
            .field("name", &self.name)
            .field("written_at", &self.written_at)
            .field("pem", &format_args!("<{} bytes>", self.pem.len()))
            .finish()
    }
}

impl PemSource {
    pub(crate) fn file(path: impl Into<PathBuf>) -> PemSource {
        PemSource::File(path.into())
    }

    pub(crate) fn inline(name: String, written_at: String, pem: Arc<[u8]>) -> PemSource {
        PemSource::Inline(Arc::new(InlinePem {
            name,
            written_at,
            pem,
        }))
    }

    /// The file, for sources that are one (watched, and their expiry exported by path).
    pub(crate) fn path(&self) -> Option<&Path> {
        match self {
            PemSource::File(path) => Some(path),
            PemSource::Inline(_) => None,
        }
    }
}

impl fmt::Display for PemSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PemSource::File(path) => write!(f, "{}", path.display()),
            PemSource::Inline(inline) => write!(f, "{} ({})", inline.name, inline.written_at),
        }
    }
}

// A source's identity is where it comes from, as a file's is its path: a rotated Secret, like
// a rewritten file, is the same source (the endpoint state built on it stays) and its new
// bytes are read when the config compiles.
impl PartialEq for PemSource {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (PemSource::File(a), PemSource::File(b)) => a == b,
            (PemSource::Inline(a), PemSource::Inline(b)) => a.name == b.name,
            _ => false,
        }
    }
}

impl Eq for PemSource {}

impl std::hash::Hash for PemSource {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match self {
            PemSource::File(path) => (0u8, path).hash(state),
            PemSource::Inline(inline) => (1u8, &inline.name).hash(state),
        }
    }
}

/// PEM that cannot be used. The message names the source, never its content.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PemError {
    #[error("cannot read {origin}: {message}")]
    Read { origin: String, message: String },
    #[error("{origin} holds no PEM certificate")]
    NoCertificate { origin: String },
    #[error("{origin} holds no PEM private key (PKCS#8, RSA or EC)")]
    NoKey { origin: String },
}

/// What went wrong, in words that quote nothing of the input: rustls's own messages for
/// malformed PEM include the offending line, which may be part of a private key.
fn describe(e: &pem::Error) -> String {
    match e {
        pem::Error::MissingSectionEnd { .. } => "a PEM section has no END line".to_owned(),
        pem::Error::IllegalSectionStart { .. } => "a PEM BEGIN line is malformed".to_owned(),
        pem::Error::Base64Decode(_) => "a PEM section is not valid base64".to_owned(),
        pem::Error::Io(io) => io.to_string(),
        pem::Error::NoItemsFound => "no PEM section found".to_owned(),
        _ => "not valid PEM".to_owned(),
    }
}

fn read_error(source: &PemSource, e: &pem::Error) -> PemError {
    PemError::Read {
        origin: source.to_string(),
        message: describe(e),
    }
}

/// A PEM file's bytes: a regular file only, at most [`MAX_PEM_FILE`] of them.
fn read_file(source: &PemSource, path: &std::path::Path) -> Result<Vec<u8>, PemError> {
    read_regular_file(path, MAX_PEM_FILE).map_err(|e| PemError::Read {
        origin: source.to_string(),
        message: e.to_string(),
    })
}

/// Every certificate of a PEM source, in order (a chain: leaf first).
pub(crate) fn read_certs(source: &PemSource) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let certs: Result<Vec<_>, pem::Error> = match source {
        PemSource::File(path) => {
            CertificateDer::pem_slice_iter(&read_file(source, path)?).collect()
        }
        PemSource::Inline(inline) => CertificateDer::pem_slice_iter(&inline.pem).collect(),
    };
    let certs = certs.map_err(|e| read_error(source, &e))?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate {
            origin: source.to_string(),
        });
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 RSA or SEC1 EC) of a PEM source.
pub(crate) fn read_key(source: &PemSource) -> Result<PrivateKeyDer<'static>, PemError> {
    let key = match source {
        PemSource::File(path) => PrivateKeyDer::from_pem_slice(&read_file(source, path)?),
        PemSource::Inline(inline) => PrivateKeyDer::from_pem_slice(&inline.pem),
    };
    key.map_err(|e| match e {
        pem::Error::NoItemsFound => PemError::NoKey {
            origin: source.to_string(),
        },
        other => read_error(source, &other),
    })
}

/// When the first certificate of a PEM source expires (Unix seconds, the earliest `notAfter`
/// of its certificates: any expired one breaks a chain); `None` for sources holding no
/// certificate (keys, credentials) or that cannot be read.
pub(crate) fn earliest_expiry(source: &PemSource) -> Option<i64> {
    let certs = read_certs(source).ok()?;
    certs
        .iter()
        .filter_map(|der| {
            let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
            Some(cert.validity().not_after.timestamp())
        })
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inline(text: &str) -> PemSource {
        PemSource::inline(
            "Secret default/x key `tls.key`".into(),
            "s.yaml:4:12".into(),
            text.as_bytes().into(),
        )
    }

    /// A broken key must not show up in the error, even the line rustls complains about.
    #[test]
    fn errors_name_the_source_and_quote_nothing() {
        let secret_line = "c2VjcmV0LWtleS1tYXRlcmlhbA";
        let text = format!("-----BEGIN PRIVATE KEY-----\n{secret_line}\n");
        let e = read_key(&inline(&text)).unwrap_err().to_string();
        assert!(e.contains("Secret default/x key `tls.key`"), "{e}");
        assert!(!e.contains(secret_line), "{e}");
        let e = read_certs(&inline("junk")).unwrap_err().to_string();
        assert_eq!(
            e,
            "Secret default/x key `tls.key` (s.yaml:4:12) holds no PEM certificate"
        );
        assert!(!format!("{:?}", inline(&text)).contains(secret_line));
    }

    /// Sources are the same by where they come from, not by their bytes.
    #[test]
    fn inline_sources_are_identified_by_name() {
        assert_eq!(inline("a"), inline("b"));
        assert_ne!(inline("a"), PemSource::file("a"));
    }
}
