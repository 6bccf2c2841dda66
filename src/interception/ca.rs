//! The operator's interception CA: loaded from PEM and checked once, so that a CA egressd could
//! not sign with (or whose leaves no client would accept) is refused when the config loads,
//! not on the first intercepted connection.

use std::fmt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{CertificateParams, DistinguishedName, DnType, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use x509_parser::certificate::X509Certificate;

/// A CA egressd cannot intercept with. Messages name the certificate by its subject and never
/// quote the key.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CaError {
    /// The certificate PEM holds no certificate, or its first one does not parse.
    #[error("the CA certificate is unusable: {0}")]
    Certificate(String),
    /// The key PEM holds no private key egressd can sign with.
    #[error("the CA key is unusable: {0}")]
    Key(String),
    /// No basicConstraints extension saying CA:TRUE.
    #[error("the certificate {subject} is not a CA: it has no basicConstraints CA:TRUE")]
    NotCa { subject: String },
    /// A keyUsage extension that does not allow signing certificates.
    #[error("the certificate {subject} may not sign certificates: its keyUsage lacks keyCertSign")]
    NoCertSign { subject: String },
    /// The key is another certificate's.
    #[error("the CA key does not belong to the certificate {subject} (their public keys differ)")]
    KeyMismatch { subject: String },
    /// Past notAfter.
    #[error("the CA certificate {subject} expired at {not_after}")]
    Expired { subject: String, not_after: String },
    /// Before notBefore.
    #[error("the CA certificate {subject} is not valid before {not_before}")]
    NotYetValid { subject: String, not_before: String },
    /// A leaf signed by this CA does not verify against it (e.g. a subject rcgen cannot copy
    /// byte for byte into a leaf's issuer field).
    #[error("the CA {subject} cannot sign leaves clients accept: {message}")]
    Unusable { subject: String, message: String },
    /// The key file may be read by group or others.
    #[error(
        "{path} is readable by group or others (mode {mode:04o}); chmod 600 it: the CA key \
         signs certificates every client trusts"
    )]
    KeyReadable { path: String, mode: u32 },
    /// A file that cannot be read or written.
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    /// `egressd ca init` arguments that cannot make a CA.
    #[error("{0}")]
    Invalid(String),
}

/// A loaded interception CA: its certificate (DER, with any chain that followed it), its
/// signing key, SHA-256 fingerprint and notAfter.
pub(crate) struct InterceptionCa {
    /// The CA certificate first, then whatever chain followed it in the PEM; sent after each
    /// leaf.
    pub(super) chain: Vec<CertificateDer<'static>>,
    /// The CA's subject and key identifier, as written into each leaf, with its key.
    pub(super) issuer: Issuer<'static, KeyPair>,
    fingerprint: String,
    /// notAfter, Unix seconds.
    pub(super) not_after: i64,
    subject: String,
}

impl fmt::Debug for InterceptionCa {
    // The key never shows up in a `{:?}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InterceptionCa")
            .field("subject", &self.subject)
            .field("fingerprint", &self.fingerprint)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl InterceptionCa {
    /// From PEM: `cert_pem` holds the CA certificate first (a chain may follow, and is sent
    /// after each leaf), `key_pem` its key (PKCS#8, SEC1 or PKCS#1; ECDSA P-256/P-384/P-521,
    /// Ed25519 or RSA). Refused: a certificate that is not a CA (basicConstraints CA:TRUE
    /// missing, or a keyUsage without keyCertSign), a key that is not the certificate's, a CA
    /// outside its validity, PEM or DER that does not parse, and a CA whose test leaf (signed
    /// here once) does not verify against it.
    pub(crate) fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, CaError> {
        let chain = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CaError::Certificate(pem_problem(&e)))?;
        let Some(ca_der) = chain.first().cloned() else {
            return Err(CaError::Certificate("no PEM certificate found".into()));
        };
        let (_, cert) = x509_parser::parse_x509_certificate(&ca_der)
            .map_err(|e| CaError::Certificate(format!("the first certificate: {e}")))?;
        let subject = cert.subject().to_string();
        check_is_ca(&cert, &subject)?;
        check_validity(&cert, &subject, unix_now())?;
        let key =
            PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| CaError::Key(pem_problem(&e)))?;
        let key = KeyPair::try_from(&key).map_err(|e| {
            CaError::Key(format!(
                "not a key egressd can sign with (ECDSA P-256/P-384/P-521, Ed25519, RSA): {e}"
            ))
        })?;
        if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            return Err(CaError::KeyMismatch { subject });
        }
        let unusable = |message: String| CaError::Unusable {
            subject: subject.clone(),
            message,
        };
        let issuer = Issuer::from_ca_cert_der(&ca_der, key)
            .map_err(|e| unusable(format!("its subject or extensions cannot be copied: {e}")))?;
        let ca = InterceptionCa {
            fingerprint: fingerprint(&ca_der),
            not_after: cert.validity().not_after.timestamp(),
            subject: subject.clone(),
            chain,
            issuer,
        };
        ca.test_leaf(&cert).map_err(unusable)?;
        Ok(ca)
    }

    /// The SHA-256 fingerprint of the CA certificate, as `openssl x509 -fingerprint -sha256`
    /// prints it: upper-case hex bytes separated by colons.
    pub(crate) fn fingerprint_sha256(&self) -> &str {
        &self.fingerprint
    }

    /// The CA certificate's notAfter, in Unix seconds. Leaves never outlive it.
    pub(crate) fn not_after_unix(&self) -> i64 {
        self.not_after
    }

    /// The CA certificate's subject, e.g. `CN=egressd interception CA`.
    pub(crate) fn subject(&self) -> String {
        self.subject.clone()
    }

    /// Signs a leaf without names (so that any name constraints of the CA allow it) and
    /// verifies it against the CA with webpki, as a client would: a subject rcgen re-encodes
    /// differently (multi-valued RDNs, repeated attributes, unusual string types) would make
    /// every leaf's issuer differ from the CA's subject, and no client would find the CA.
    fn test_leaf(&self, cert: &X509Certificate<'_>) -> Result<(), String> {
        let key = KeyPair::generate().map_err(|e| format!("cannot make a test key: {e}"))?;
        let now = unix_now();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "egressd CA self-test");
        set_validity(&mut params, now - 60, (now + 60).min(self.not_after))?;
        params.use_authority_key_identifier_extension = true;
        let leaf = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| format!("signing a test leaf failed: {e}"))?;
        let (_, parsed) = x509_parser::parse_x509_certificate(leaf.der())
            .map_err(|e| format!("the test leaf does not parse: {e}"))?;
        if parsed.issuer().as_raw() != cert.subject().as_raw() {
            return Err(
                "its subject cannot be copied byte for byte into a leaf's issuer \
                 (a multi-valued or repeated name attribute?)"
                    .into(),
            );
        }
        let anchor = webpki::anchor_from_trusted_cert(&self.chain[0])
            .map_err(|e| format!("not usable as a trust anchor: {e}"))?;
        let end_entity = webpki::EndEntityCert::try_from(leaf.der())
            .map_err(|e| format!("the test leaf does not parse: {e}"))?;
        let time = UnixTime::since_unix_epoch(std::time::Duration::from_secs(now.max(0) as u64));
        end_entity
            .verify_for_usage(
                crate::upstream::tls::provider()
                    .signature_verification_algorithms
                    .all,
                &[anchor],
                &self.chain[1..],
                time,
                webpki::KeyUsage::server_auth(),
                None,
                None,
            )
            .map(|_| ())
            .map_err(|e| format!("a test leaf it signed does not verify: {e}"))
    }
}

/// basicConstraints CA:TRUE, and keyCertSign if there is a keyUsage at all.
fn check_is_ca(cert: &X509Certificate<'_>, subject: &str) -> Result<(), CaError> {
    let malformed = |e| CaError::Certificate(format!("{subject}: {e}"));
    let is_ca = cert
        .basic_constraints()
        .map_err(malformed)?
        .is_some_and(|bc| bc.value.ca);
    if !is_ca {
        return Err(CaError::NotCa {
            subject: subject.to_owned(),
        });
    }
    if let Some(usage) = cert.key_usage().map_err(malformed)? {
        if !usage.value.key_cert_sign() {
            return Err(CaError::NoCertSign {
                subject: subject.to_owned(),
            });
        }
    }
    Ok(())
}

fn check_validity(cert: &X509Certificate<'_>, subject: &str, now: i64) -> Result<(), CaError> {
    let validity = cert.validity();
    if validity.not_after.timestamp() <= now {
        return Err(CaError::Expired {
            subject: subject.to_owned(),
            not_after: validity.not_after.to_string(),
        });
    }
    if validity.not_before.timestamp() > now {
        return Err(CaError::NotYetValid {
            subject: subject.to_owned(),
            not_before: validity.not_before.to_string(),
        });
    }
    Ok(())
}

/// A key file readable by group or others is refused: the CA key signs certificates every
/// client trusts. Unix mode bits only (`mode & 0o077`); the path is followed through
/// symlinks, so a Kubernetes Secret volume is judged by the file its `..data` link points to
/// (set the volume's `defaultMode: 0400`).
pub(crate) fn check_key_permissions(path: &Path) -> Result<(), CaError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| CaError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(CaError::KeyReadable {
            path: path.display().to_string(),
            mode,
        });
    }
    Ok(())
}

/// Upper-case hex bytes of the SHA-256 of `der`, separated by colons.
pub(super) fn fingerprint(der: &[u8]) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, der);
    let hex: Vec<String> = digest.as_ref().iter().map(|b| format!("{b:02X}")).collect();
    hex.join(":")
}

/// Now, in Unix seconds.
pub(super) fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Sets `params`' notBefore and notAfter from Unix seconds (through x509-parser's dates: the
/// `time` crate rcgen takes, which egressd does not name itself).
pub(super) fn set_validity(
    params: &mut CertificateParams,
    not_before: i64,
    not_after: i64,
) -> Result<(), String> {
    let date = |unix: i64| {
        x509_parser::time::ASN1Time::from_timestamp(unix)
            .map(|t| t.to_datetime())
            .map_err(|e| format!("{unix} is not a date a certificate can hold: {e}"))
    };
    params.not_before = date(not_before)?;
    params.not_after = date(not_after)?;
    Ok(())
}

/// What went wrong with PEM, quoting none of it (a malformed line may be part of a key).
fn pem_problem(e: &rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error;
    match e {
        Error::NoItemsFound => "no PEM section found".to_owned(),
        Error::MissingSectionEnd { .. } => "a PEM section has no END line".to_owned(),
        Error::IllegalSectionStart { .. } => "a PEM BEGIN line is malformed".to_owned(),
        Error::Base64Decode(_) => "a PEM section is not valid base64".to_owned(),
        _ => "not valid PEM".to_owned(),
    }
}
