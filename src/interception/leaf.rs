//! One leaf certificate for one intercepted host, and the rustls server config presenting it.
//! Everything here is synchronous CPU work; the [`Interceptor`](super::Interceptor) runs it on
//! tokio's blocking pool.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, StoresServerSessions};
use rustls::sign::{CertifiedKey, SigningKey};
use rustls::ServerConfig;

use super::ca::{set_validity, unix_now, InterceptionCa};
use super::MintError;

/// How far notBefore lies in the past, for clients whose clocks run behind egressd's.
const CLOCK_SKEW: i64 = 3600;

/// The longest common name X.509 allows (RFC 5280 `ub-common-name`); longer host names are
/// cut in the CN (the SAN, which clients check, holds the whole name).
const MAX_COMMON_NAME: usize = 64;

/// The ALPN protocols offered, preferred first, as an HTTPS listener offers them.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// A host a leaf is made for: a DNS name or an IP address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Host {
    Dns(String),
    Ip(IpAddr),
}

impl Host {
    /// A canonical lower-case DNS name, or an IP literal (IPv6 with or without brackets);
    /// anything else is refused.
    pub(super) fn parse(host: &str) -> Result<Host, MintError> {
        let invalid = || MintError::InvalidHost(host.chars().take(300).collect());
        if let Some(inner) = host.strip_prefix('[') {
            let inner = inner.strip_suffix(']').ok_or_else(invalid)?;
            return match inner.parse::<std::net::Ipv6Addr>() {
                Ok(ip) => Ok(Host::Ip(IpAddr::V6(ip))),
                Err(_) => Err(invalid()),
            };
        }
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(Host::Ip(ip));
        }
        if crate::names::is_valid_hostname(host) {
            return Ok(Host::Dns(host.to_owned()));
        }
        Err(invalid())
    }

    /// The cache key: the name, or the address as Rust prints it (`::1`, without brackets).
    pub(super) fn key(&self) -> String {
        match self {
            Host::Dns(name) => name.clone(),
            Host::Ip(ip) => ip.to_string(),
        }
    }
}

/// The key pair every leaf of one [`Interceptor`](super::Interceptor) certifies.
///
/// One key per Interceptor, made when it starts and never written anywhere, rather than one
/// per leaf: minting is then a single ECDSA signature (no key generation), and each cached
/// entry shares the signing key instead of holding its own. Separate keys would not separate
/// anything: they would all live in the same process, next to the CA key that can sign a
/// certificate for any of them.
pub(super) struct LeafKey {
    /// To put its public key into leaves.
    rcgen: KeyPair,
    /// To sign handshakes.
    signing: Arc<dyn SigningKey>,
}

impl LeafKey {
    /// A fresh ECDSA P-256 key.
    pub(super) fn generate() -> Result<LeafKey, MintError> {
        let rcgen = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| MintError::Key(e.to_string()))?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(rcgen.serialize_der()));
        let signing = crate::upstream::tls::provider()
            .key_provider
            .load_private_key(der)
            .map_err(|e| MintError::Key(e.to_string()))?;
        Ok(LeafKey { rcgen, signing })
    }
}

/// A minted leaf: the server config presenting it, and for how long it is valid from now.
pub(super) struct Minted {
    pub(super) config: Arc<ServerConfig>,
    pub(super) lifetime: Duration,
}

/// Signs a leaf for `host` with the CA and builds the server config presenting it.
pub(super) fn mint(
    ca: &InterceptionCa,
    key: &LeafKey,
    host: &Host,
    validity: Duration,
    sessions: &Arc<dyn StoresServerSessions>,
) -> Result<Minted, MintError> {
    let now = unix_now();
    let wanted = now.saturating_add(i64::try_from(validity.as_secs()).unwrap_or(i64::MAX));
    let not_after = wanted.min(ca.not_after_unix());
    if not_after <= now {
        return Err(MintError::CaExpired {
            subject: ca.subject(),
        });
    }
    let params = leaf_params(host, now - CLOCK_SKEW, not_after)?;
    let leaf = params
        .signed_by(&key.rcgen, &ca.issuer)
        .map_err(|e| MintError::Sign(e.to_string()))?;
    let mut chain = Vec::with_capacity(1 + ca.chain.len());
    chain.push(CertificateDer::from(leaf.der().to_vec()));
    chain.extend(ca.chain.iter().cloned());
    let certified = Arc::new(CertifiedKey::new(chain, key.signing.clone()));
    let config = server_config(certified, sessions.clone())?;
    let lifetime = Duration::from_secs(u64::try_from(not_after - now).unwrap_or(0));
    Ok(Minted { config, lifetime })
}

/// CN = host (cut to 64 characters; none for an address), SAN = DNS:host or IP:addr, a
/// random 16-byte serial, keyUsage digitalSignature, extendedKeyUsage serverAuth, the CA's key
/// identifier as authorityKeyIdentifier.
fn leaf_params(
    host: &Host,
    not_before: i64,
    not_after: i64,
) -> Result<CertificateParams, MintError> {
    let mut params = CertificateParams::default();
    let (cn, san) = match host {
        Host::Dns(name) => {
            let san = name
                .clone()
                .try_into()
                .map_err(|_| MintError::InvalidHost(name.clone()))?;
            (Some(name.as_str()), SanType::DnsName(san))
        }
        Host::Ip(ip) => (None, SanType::IpAddress(*ip)),
    };
    params.distinguished_name = DistinguishedName::new();
    // An address gets no common name (an empty subject, and rcgen marks the SAN critical, as
    // RFC 5280 §4.2.1.6 asks): OpenSSL checks a CN that looks like a DNS name (`127.0.0.1`
    // does) against the CA's DNS name constraints when the leaf has no DNS SAN, so under a CA
    // made with `--permitted-dns` every client using OpenSSL would refuse the leaf.
    if let Some(cn) = cn {
        // Host names are ASCII, so a byte cut is a character cut.
        let cn_len = cn.len().min(MAX_COMMON_NAME);
        params
            .distinguished_name
            .push(DnType::CommonName, &cn[..cn_len]);
    }
    params.subject_alt_names = vec![san];
    set_validity(&mut params, not_before, not_after).map_err(MintError::Sign)?;
    let mut serial = [0u8; 16];
    aws_lc_rs::rand::fill(&mut serial).map_err(|_| MintError::Sign("no randomness".into()))?;
    // Positive and 16 bytes long in DER: the top bit clear, the top byte not zero.
    serial[0] = (serial[0] & 0x7f) | 0x01;
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    Ok(params)
}

/// TLS 1.2 and 1.3 with egressd's provider, ALPN `h2` then `http/1.1`, no client
/// certificates, the given session store (shared by every leaf of one Interceptor).
fn server_config(
    certified: Arc<CertifiedKey>,
    sessions: Arc<dyn StoresServerSessions>,
) -> Result<Arc<ServerConfig>, MintError> {
    let mut config = ServerConfig::builder_with_provider(crate::upstream::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| MintError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(OneLeaf(certified)));
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    config.session_storage = sessions;
    Ok(Arc::new(config))
}

/// Presents the one leaf whatever the ClientHello says: the config is chosen by the CONNECT
/// target before the handshake starts.
#[derive(Debug)]
struct OneLeaf(Arc<CertifiedKey>);

impl ResolvesServerCert for OneLeaf {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}
