//! `egressd ca init`: a new interception CA, written to `ca.crt` and `ca.key`.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, GeneralSubtree, IsCa, KeyPair,
    KeyUsagePurpose, NameConstraints, SerialNumber,
};

use super::ca::{fingerprint, set_validity, unix_now, CaError};

/// The CA's validity when `--validity` is not given: 825 days, two years of use and about
/// three months more in which its successor is made and spread to clients before it expires.
/// Every leaf ends by the CA's notAfter, so an expired CA stops interception at once.
pub const DEFAULT_VALIDITY_DAYS: u32 = 825;

/// The CA's common name when `--name` is not given.
pub const DEFAULT_NAME: &str = "egressd interception CA";

/// What `egressd ca init` is asked for.
#[derive(Clone, Debug)]
pub struct CaInitOptions {
    /// Where `ca.crt` and `ca.key` are written (made if missing).
    pub dir: PathBuf,
    /// The CA's common name.
    pub name: String,
    /// DNS suffixes the CA may sign for (`example.com` covers it and every name under it);
    /// empty: no name constraints.
    pub permitted_dns: Vec<String>,
    /// Days from now until the CA expires.
    pub validity_days: u32,
}

/// What `egressd ca init` made.
#[derive(Clone, Debug)]
pub struct CaInitReport {
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    /// SHA-256 of the certificate, `AB:CD:...` as openssl prints it.
    pub fingerprint: String,
}

/// A CA certificate and key, PEM.
pub(super) struct NewCa {
    pub(super) cert_pem: String,
    pub(super) key_pem: String,
    pub(super) fingerprint: String,
}

/// Makes a CA (ECDSA P-256, CA:TRUE pathlen 0, keyUsage keyCertSign and cRLSign, permitted
/// DNS subtrees if any) and writes `DIR/ca.key` (mode 0600, created so) and `DIR/ca.crt`
/// (mode 0644). Refuses to overwrite either file.
pub(crate) fn init(options: &CaInitOptions) -> Result<CaInitReport, CaError> {
    let ca = generate(options)?;
    let dir = &options.dir;
    std::fs::create_dir_all(dir).map_err(|e| io_error(dir, &e))?;
    let cert_path = dir.join("ca.crt");
    let key_path = dir.join("ca.key");
    for path in [&cert_path, &key_path] {
        // symlink_metadata: a dangling symlink is an existing file too.
        if std::fs::symlink_metadata(path).is_ok() {
            return Err(CaError::Invalid(format!(
                "{} exists; egressd ca init never overwrites a CA (move it away first)",
                path.display()
            )));
        }
    }
    write_new(&key_path, ca.key_pem.as_bytes(), 0o600)?;
    if let Err(e) = write_new(&cert_path, ca.cert_pem.as_bytes(), 0o644) {
        // No key without its certificate: a second run must not find half a CA.
        let _ = std::fs::remove_file(&key_path);
        return Err(e);
    }
    Ok(CaInitReport {
        cert_path,
        key_path,
        fingerprint: ca.fingerprint,
    })
}

/// The CA `init` writes, in memory.
pub(super) fn generate(options: &CaInitOptions) -> Result<NewCa, CaError> {
    let name = options.name.trim();
    if name.is_empty() || name.len() > 64 {
        return Err(CaError::Invalid(
            "--name must have 1 to 64 characters".into(),
        ));
    }
    if options.validity_days == 0 {
        return Err(CaError::Invalid("--validity must be at least 1 day".into()));
    }
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.name_constraints = name_constraints(&options.permitted_dns)?;
    let now = unix_now();
    let days = i64::from(options.validity_days);
    set_validity(&mut params, now - 3600, now + days * 86_400).map_err(CaError::Invalid)?;
    let mut serial = [0u8; 16];
    aws_lc_rs::rand::fill(&mut serial).map_err(|_| CaError::Invalid("no randomness".into()))?;
    serial[0] = (serial[0] & 0x7f) | 0x01;
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| CaError::Key(e.to_string()))?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| CaError::Invalid(format!("cannot sign the CA: {e}")))?;
    Ok(NewCa {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        fingerprint: fingerprint(cert.der()),
    })
}

/// Permitted DNS subtrees: lower-case names, a leading dot dropped (`.example.com` and
/// `example.com` both mean the name and every name under it in X.509).
fn name_constraints(suffixes: &[String]) -> Result<Option<NameConstraints>, CaError> {
    if suffixes.is_empty() {
        return Ok(None);
    }
    let mut permitted = Vec::new();
    for suffix in suffixes {
        let name = suffix.trim().trim_start_matches('.').to_ascii_lowercase();
        if !crate::names::is_valid_hostname(&name) {
            return Err(CaError::Invalid(format!(
                "--permitted-dns {suffix:?} is not a DNS name (e.g. example.com)"
            )));
        }
        permitted.push(GeneralSubtree::DnsName(name));
    }
    Ok(Some(NameConstraints {
        permitted_subtrees: permitted,
        excluded_subtrees: Vec::new(),
    }))
}

/// Writes a new file created with `mode` (never more readable, even for an instant) and sets
/// exactly that mode whatever the umask took away.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CaError> {
    let mut file: File = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| io_error(path, &e))?;
    let written = file
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .and_then(|()| file.write_all(bytes))
        .and_then(|()| file.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(path);
        return Err(io_error(path, &e));
    }
    Ok(())
}

fn io_error(path: &Path, e: &std::io::Error) -> CaError {
    CaError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}
