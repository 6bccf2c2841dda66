//! Reading PEM certificate chains and private keys from files, with errors that name the file.
//! Shared by TLS origination (client certificates, CA bundles) and HTTPS listeners.

use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A PEM file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    #[error("cannot read {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} holds no PEM private key (PKCS#8, RSA or EC)")]
    NoKey { path: PathBuf },
}

/// Every certificate in a PEM file, in order (a chain: leaf first).
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let file_error = |message: String| PemError::File {
        path: path.to_owned(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(e.to_string()))?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 RSA or SEC1 EC) in a PEM file.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, PemError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => PemError::NoKey {
            path: path.to_owned(),
        },
        other => PemError::File {
            path: path.to_owned(),
            message: other.to_string(),
        },
    })
}

/// When the first certificate of a PEM file expires (Unix seconds, the earliest `notAfter`
/// of the file's certificates: any expired one breaks a chain); `None` for files holding no
/// certificate (keys, credentials) or that cannot be read.
pub fn earliest_expiry(path: &Path) -> Option<i64> {
    let certs = read_certs(path).ok()?;
    certs
        .iter()
        .filter_map(|der| {
            let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
            Some(cert.validity().not_after.timestamp())
        })
        .min()
}
