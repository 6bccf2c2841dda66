//! The CA checks, the leaves (verified with webpki and openssl, served over a real rustls
//! handshake), the cache and its single mint per host.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::ServerConfig;
use x509_parser::extensions::{GeneralName, ParsedExtension};

use super::ca::CaError;
use super::init::{generate, init, CaInitOptions};
use super::*;

fn options(dir: &Path, permitted: &[&str]) -> CaInitOptions {
    CaInitOptions {
        dir: dir.to_owned(),
        name: "test interception CA".into(),
        permitted_dns: permitted.iter().map(|s| s.to_string()).collect(),
        validity_days: 30,
    }
}

/// A CA as `egressd ca init` makes it: (certificate PEM, key PEM).
fn new_ca(permitted: &[&str]) -> (String, String) {
    let ca = generate(&options(Path::new("unused"), permitted)).expect("CA");
    (ca.cert_pem, ca.key_pem)
}

fn loaded_ca(permitted: &[&str]) -> Arc<InterceptionCa> {
    let (cert, key) = new_ca(permitted);
    Arc::new(InterceptionCa::from_pem(cert.as_bytes(), key.as_bytes()).expect("loads"))
}

fn interceptor(max_entries: usize) -> Interceptor {
    let settings = LeafSettings {
        max_entries,
        ..LeafSettings::default()
    };
    Interceptor::new(loaded_ca(&[]), settings).expect("interceptor")
}

fn der_of(pem: &str) -> CertificateDer<'static> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("PEM")
}

fn pem_of(der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).expect("base64 is ASCII"))
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    )
}

/// A self-signed certificate from `params`, with its key, as PEM.
fn self_signed(params: CertificateParams) -> (String, String) {
    let key = KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("self-signed");
    (cert.pem(), key.serialize_pem())
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, "a test CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
}

fn load_error(cert: &str, key: &str) -> String {
    InterceptionCa::from_pem(cert.as_bytes(), key.as_bytes())
        .expect_err("refused")
        .to_string()
}

#[test]
fn from_pem_refuses_a_certificate_that_is_not_a_ca() {
    let mut params = ca_params();
    params.is_ca = IsCa::NoCa;
    let (cert, key) = self_signed(params);
    let e = InterceptionCa::from_pem(cert.as_bytes(), key.as_bytes()).expect_err("refused");
    assert!(matches!(e, CaError::NotCa { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "the certificate CN=a test CA is not a CA: it has no basicConstraints CA:TRUE"
    );
}

#[test]
fn from_pem_refuses_a_ca_whose_key_usage_lacks_cert_sign() {
    let mut params = ca_params();
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let (cert, key) = self_signed(params);
    let message = load_error(&cert, &key);
    assert_eq!(
        message,
        "the certificate CN=a test CA may not sign certificates: its keyUsage lacks keyCertSign"
    );
}

#[test]
fn from_pem_refuses_a_key_that_is_not_the_certificates() {
    let (cert, _) = new_ca(&[]);
    let (_, other_key) = new_ca(&[]);
    let message = load_error(&cert, &other_key);
    assert_eq!(
        message,
        "the CA key does not belong to the certificate CN=test interception CA \
         (their public keys differ)"
    );
}

#[test]
fn from_pem_refuses_an_expired_ca_and_unparsable_pem() {
    let mut params = ca_params();
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let (cert, key) = self_signed(params);
    let message = load_error(&cert, &key);
    assert!(
        message.starts_with("the CA certificate CN=a test CA expired at Jan  1 00:00:00 2021"),
        "{message}"
    );
    let (cert, key) = new_ca(&[]);
    assert_eq!(
        load_error("", &key),
        "the CA certificate is unusable: no PEM certificate found"
    );
    let secret = "c2VjcmV0LWtleS1tYXRlcmlhbA";
    let broken_key = format!("-----BEGIN PRIVATE KEY-----\n{secret}\n");
    let message = load_error(&cert, &broken_key);
    assert_eq!(
        message,
        "the CA key is unusable: a PEM section has no END line"
    );
    assert!(!message.contains(secret));
}

#[test]
fn from_pem_reads_the_ca_and_its_fingerprint_as_openssl_prints_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let made = init(&options(dir.path(), &[])).expect("init");
    let cert = std::fs::read(&made.cert_path).expect("ca.crt");
    let key = std::fs::read(&made.key_path).expect("ca.key");
    let ca = InterceptionCa::from_pem(&cert, &key).expect("loads");
    let openssl = openssl(&[
        "x509",
        "-in",
        path_str(&made.cert_path),
        "-noout",
        "-fingerprint",
        "-sha256",
    ]);
    assert_eq!(
        openssl.trim(),
        format!("sha256 Fingerprint={}", ca.fingerprint_sha256())
    );
    assert_eq!(ca.fingerprint_sha256(), made.fingerprint);
    assert_eq!(ca.subject(), "CN=test interception CA");
    let in_30_days = ca::unix_now() + 30 * 86_400;
    assert!((ca.not_after_unix() - in_30_days).abs() < 60);
}

/// CAs as operators make them with openssl: an RSA key in PKCS#1 and an ECDSA P-384 key in
/// SEC1, the subject with several attributes; leaves signed with each verify with openssl.
#[tokio::test]
async fn openssl_made_cas_with_pkcs1_and_sec1_keys_sign_leaves() {
    let dir = tempfile::tempdir().expect("tempdir");
    for name in ["rsa", "p384"] {
        let key_path = dir.path().join(format!("{name}.key"));
        let cert_path = dir.path().join(format!("{name}.crt"));
        let out = path_str(&key_path);
        if name == "rsa" {
            openssl(&["genrsa", "-traditional", "-out", out, "2048"]);
        } else {
            openssl(&[
                "ecparam",
                "-name",
                "secp384r1",
                "-genkey",
                "-noout",
                "-out",
                out,
            ]);
        }
        let key_pem = std::fs::read_to_string(&key_path).expect("key");
        let header = if name == "rsa" {
            "RSA PRIVATE KEY"
        } else {
            "EC PRIVATE KEY"
        };
        assert!(key_pem.contains(header), "{name}: {key_pem:.40}");
        openssl(&[
            "req",
            "-x509",
            "-new",
            "-key",
            path_str(&key_path),
            "-out",
            path_str(&cert_path),
            "-days",
            "10",
            "-subj",
            "/C=DE/O=Example Ops/CN=Ops Interception CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        let cert_pem = std::fs::read(&cert_path).expect("cert");
        let ca = InterceptionCa::from_pem(&cert_pem, key_pem.as_bytes())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(ca.subject(), "C=DE, O=Example Ops, CN=Ops Interception CA");
        let interceptor = Interceptor::new(Arc::new(ca), LeafSettings::default()).expect("new");
        let config = interceptor.server_config("api.test").await.expect("mint");
        let chain = handshake(
            config,
            &der_of(&String::from_utf8_lossy(&cert_pem)),
            "api.test",
        )
        .await
        .certs;
        assert_eq!(
            openssl_verify(dir.path(), &cert_path, &chain[0], "api.test"),
            "OK"
        );
    }
}

#[test]
fn check_key_permissions_refuses_group_or_other_access() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ca.key");
    std::fs::write(&path, "key").expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let message = check_key_permissions(&path).expect_err("0644").to_string();
    assert_eq!(
        message,
        format!(
            "{} is readable by group or others (mode 0644); chmod 600 it: the CA key signs \
             certificates every client trusts",
            path.display()
        )
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    assert!(check_key_permissions(&path).is_err());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    check_key_permissions(&path).expect("0600 is fine");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).expect("chmod");
    check_key_permissions(&path).expect("0400 is fine");
}

/// What a client saw of a handshake.
struct Seen {
    certs: Vec<CertificateDer<'static>>,
    alpn: Option<Vec<u8>>,
    version: Option<rustls::ProtocolVersion>,
}

/// A full TLS handshake over an in-memory pipe: a tokio-rustls client trusting `ca` and
/// connecting to `name` (offering `h2` and `http/1.1`) against `config`.
async fn handshake(config: Arc<ServerConfig>, ca: &CertificateDer<'_>, name: &str) -> Seen {
    let versions: &[&rustls::SupportedProtocolVersion] =
        &[&rustls::version::TLS13, &rustls::version::TLS12];
    handshake_with(config, ca, name, versions, &[b"h2", b"http/1.1"]).await
}

async fn handshake_with(
    config: Arc<ServerConfig>,
    ca: &CertificateDer<'_>,
    name: &str,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> Seen {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone().into_owned()).expect("root");
    let mut client = rustls::ClientConfig::builder_with_provider(crate::upstream::tls::provider())
        .with_protocol_versions(versions)
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let name = name.trim_start_matches('[').trim_end_matches(']');
    let server_name = ServerName::try_from(name.to_owned()).expect("server name");
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let (server, client) = tokio::join!(
        acceptor.accept(server_io),
        connector.connect(server_name, client_io)
    );
    let client = client.expect("the client accepts the leaf");
    let server = server.expect("the server completes the handshake");
    let (_, connection) = client.get_ref();
    assert_eq!(
        connection.alpn_protocol(),
        server.get_ref().1.alpn_protocol()
    );
    Seen {
        certs: connection
            .peer_certificates()
            .expect("certificates")
            .to_vec(),
        alpn: connection.alpn_protocol().map(<[u8]>::to_vec),
        version: connection.protocol_version(),
    }
}

/// The leaf verifies with webpki against the CA for `name`, and says what it should.
fn check_leaf(
    chain: &[CertificateDer<'_>],
    ca: &CertificateDer<'_>,
    name: &str,
    san: GeneralName<'_>,
) {
    assert_eq!(chain.len(), 2, "leaf, then the CA");
    assert_eq!(chain[1], *ca);
    let anchor = webpki::anchor_from_trusted_cert(ca).expect("anchor");
    let leaf = webpki::EndEntityCert::try_from(&chain[0]).expect("leaf parses");
    leaf.verify_for_usage(
        crate::upstream::tls::provider()
            .signature_verification_algorithms
            .all,
        &[anchor],
        &[],
        UnixTime::now(),
        webpki::KeyUsage::server_auth(),
        None,
        None,
    )
    .expect("verifies against the CA");
    let server_name = ServerName::try_from(name).expect("name");
    leaf.verify_is_valid_for_subject_name(&server_name)
        .expect("valid for the name");
    let (_, cert) = x509_parser::parse_x509_certificate(&chain[0]).expect("parses");
    let (_, ca_cert) = x509_parser::parse_x509_certificate(ca).expect("CA parses");
    let san_ext = cert.subject_alternative_name().expect("SAN").expect("SAN");
    assert_eq!(san_ext.value.general_names, vec![san]);
    if name.parse::<std::net::IpAddr>().is_ok() {
        // No CN for an address: the subject is empty, so the SAN is critical.
        assert!(cert.subject().as_raw().len() <= 2, "{}", cert.subject());
        assert!(san_ext.critical);
    } else {
        assert_eq!(cert.subject().to_string(), format!("CN={name}"));
    }
    let eku = cert.extended_key_usage().expect("EKU").expect("EKU").value;
    assert!(eku.server_auth && !eku.client_auth);
    let usage = cert.key_usage().expect("KU").expect("KU").value;
    assert!(usage.digital_signature() && !usage.key_cert_sign());
    assert!(!cert.is_ca());
    assert_eq!(cert.raw_serial().len(), 16);
    let ski = ca_cert
        .extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(id) => Some(id.0),
            _ => None,
        });
    let aki = cert
        .extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                aki.key_identifier.as_ref().map(|k| k.0)
            }
            _ => None,
        });
    assert_eq!(
        aki, ski,
        "authorityKeyIdentifier is the CA's subjectKeyIdentifier"
    );
    let validity = cert.validity();
    let now = ca::unix_now();
    assert!((validity.not_before.timestamp() - (now - 3600)).abs() < 60);
    assert!((validity.not_after.timestamp() - (now + 24 * 3600)).abs() < 60);
}

#[tokio::test]
async fn leaves_for_names_and_addresses_verify_and_negotiate_h2() {
    let interceptor = interceptor(16);
    let ca = interceptor.ca().chain[0].clone();
    let cases = [
        ("api.test", GeneralName::DNSName("api.test")),
        ("127.0.0.1", GeneralName::IPAddress(&[127, 0, 0, 1])),
        (
            "[::1]",
            GeneralName::IPAddress(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        ),
    ];
    for (host, san) in cases {
        let config = interceptor.server_config(host).await.expect(host);
        let seen = handshake(config, &ca, host).await;
        let name = host.trim_start_matches('[').trim_end_matches(']');
        check_leaf(&seen.certs, &ca, name, san);
        assert_eq!(seen.alpn.as_deref(), Some(&b"h2"[..]), "{host}");
        assert_eq!(seen.version, Some(rustls::ProtocolVersion::TLSv1_3));
    }
    // `[::1]` and `::1` are one host.
    let bracketed = interceptor.server_config("[::1]").await.expect("[::1]");
    let bare = interceptor.server_config("::1").await.expect("::1");
    assert!(Arc::ptr_eq(&bracketed, &bare));
    assert_eq!(interceptor.minted_total(), 3);
}

#[tokio::test]
async fn tls12_clients_and_clients_without_h2_are_served() {
    let interceptor = interceptor(16);
    let ca = interceptor.ca().chain[0].clone();
    let config = interceptor.server_config("api.test").await.expect("mint");
    let tls12 = [&rustls::version::TLS12];
    let both: [&[u8]; 2] = [b"h2", b"http/1.1"];
    let seen = handshake_with(config.clone(), &ca, "api.test", &tls12, &both).await;
    assert_eq!(seen.version, Some(rustls::ProtocolVersion::TLSv1_2));
    assert_eq!(seen.alpn.as_deref(), Some(&b"h2"[..]));
    let tls13 = [&rustls::version::TLS13];
    let seen = handshake_with(config.clone(), &ca, "api.test", &tls13, &[b"http/1.1"]).await;
    assert_eq!(seen.alpn.as_deref(), Some(&b"http/1.1"[..]));
    let seen = handshake_with(config, &ca, "api.test", &tls13, &[]).await;
    assert_eq!(seen.alpn, None);
}

/// A mint waits for one of the few mint permits: with all of them taken (as by as many
/// mints of other hosts), a new host's mint does not start.
#[tokio::test(start_paused = true)]
async fn mints_wait_for_a_permit() {
    let interceptor = interceptor(16);
    let held = interceptor
        .mints
        .clone()
        .acquire_many_owned(MAX_CONCURRENT_MINTS as u32)
        .await
        .expect("permits");
    // Paused time advances only when nothing runs (a blocking mint would hold it): the
    // timeout fires because the mint is waiting, not because it is slow.
    let waited = tokio::time::timeout(
        Duration::from_secs(3600),
        interceptor.server_config("api.test"),
    )
    .await;
    assert!(waited.is_err(), "minted without a permit");
    assert_eq!(interceptor.minted_total(), 0);
    drop(held);
    let minted = tokio::time::timeout(
        Duration::from_secs(3600),
        interceptor.server_config("api.test"),
    )
    .await;
    assert!(minted.expect("a permit is free").is_ok());
    assert_eq!(interceptor.minted_total(), 1);
}

#[tokio::test]
async fn a_long_name_is_cut_in_the_common_name_only() {
    let interceptor = interceptor(16);
    let ca = interceptor.ca().chain[0].clone();
    let host = format!("{}.{}.test", "a".repeat(60), "b".repeat(40));
    let config = interceptor.server_config(&host).await.expect("mint");
    let seen = handshake(config, &ca, &host).await;
    let (_, cert) = x509_parser::parse_x509_certificate(&seen.certs[0]).expect("parses");
    let cn = cert.subject().iter_common_name().next().expect("CN");
    assert_eq!(cn.as_str().expect("text"), &host[..64]);
    let sans = &cert
        .subject_alternative_name()
        .expect("SAN")
        .expect("SAN")
        .value
        .general_names;
    assert_eq!(sans, &vec![GeneralName::DNSName(&host)]);
}

#[tokio::test]
async fn what_is_neither_a_name_nor_an_address_is_refused() {
    let interceptor = interceptor(16);
    for host in [
        "",
        "API.test",
        "a b.test",
        "*.test",
        "[127.0.0.1]",
        "[::1",
        "fe80::1%eth0",
        "x_y.test",
        "a..test",
    ] {
        let e = interceptor.server_config(host).await.expect_err(host);
        assert!(matches!(e, MintError::InvalidHost(_)), "{host}: {e}");
        assert_eq!(
            e.to_string(),
            format!("{host:?} is neither a DNS name nor an IP address")
        );
    }
    assert_eq!(interceptor.cached_hosts(), 0);
    assert_eq!(interceptor.minted_total(), 0);
    // Refused before any mint: not a failed mint.
    assert_eq!(interceptor.mint_failures_total(), 0);
}

#[tokio::test]
async fn the_cache_reuses_leaves_and_evicts_the_least_recently_used() {
    let interceptor = interceptor(2);
    let a = interceptor.server_config("a.test").await.expect("a");
    let b = interceptor.server_config("b.test").await.expect("b");
    let again = interceptor.server_config("a.test").await.expect("a again");
    assert!(Arc::ptr_eq(&a, &again));
    assert!(!Arc::ptr_eq(&a, &b));
    assert_eq!(interceptor.minted_total(), 2);
    // Full: c evicts b, used less recently than a.
    interceptor.server_config("c.test").await.expect("c");
    assert_eq!(interceptor.cached_hosts(), 2);
    assert_eq!(interceptor.minted_total(), 3);
    let a_still = interceptor.server_config("a.test").await.expect("a");
    assert!(Arc::ptr_eq(&a, &a_still));
    assert_eq!(interceptor.minted_total(), 3);
    let b_again = interceptor.server_config("b.test").await.expect("b");
    assert!(!Arc::ptr_eq(&b, &b_again), "b was evicted and minted again");
    assert_eq!(interceptor.minted_total(), 4);
    assert_eq!(interceptor.cached_hosts(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_callers_for_one_host_share_one_mint() {
    let interceptor = Arc::new(interceptor(16));
    let callers: Vec<_> = (0..32)
        .map(|_| {
            let interceptor = interceptor.clone();
            tokio::spawn(async move { interceptor.server_config("api.test").await })
        })
        .collect();
    let mut configs = Vec::new();
    for caller in callers {
        configs.push(caller.await.expect("task").expect("mint"));
    }
    assert_eq!(interceptor.minted_total(), 1);
    assert!(configs.iter().all(|c| Arc::ptr_eq(c, &configs[0])));
    assert_eq!(interceptor.cached_hosts(), 1);
}

/// A leaf is reused until two thirds of its validity have passed, then minted again.
#[tokio::test(start_paused = true)]
async fn a_leaf_is_minted_again_when_a_third_of_its_validity_is_left() {
    let interceptor = interceptor(16);
    let first = interceptor.server_config("api.test").await.expect("mint");
    tokio::time::advance(Duration::from_secs(16 * 3600 - 60)).await;
    let same = interceptor.server_config("api.test").await.expect("cached");
    assert!(Arc::ptr_eq(&first, &same));
    tokio::time::advance(Duration::from_secs(120)).await;
    let fresh = interceptor
        .server_config("api.test")
        .await
        .expect("minted again");
    assert!(!Arc::ptr_eq(&first, &fresh));
    assert_eq!(interceptor.minted_total(), 2);
    assert_eq!(interceptor.cached_hosts(), 1);
}

/// A failed mint is counted, shared by those who awaited it, and not kept: the next caller
/// tries again.
#[tokio::test]
async fn a_failed_mint_is_not_cached() {
    let (cert, key) = new_ca(&[]);
    let mut ca = InterceptionCa::from_pem(cert.as_bytes(), key.as_bytes()).expect("loads");
    // As if the CA had expired since it was loaded.
    ca.not_after = ca::unix_now() - 1;
    let interceptor = Interceptor::new(Arc::new(ca), LeafSettings::default()).expect("new");
    let e = interceptor
        .server_config("api.test")
        .await
        .expect_err("expired");
    assert_eq!(
        e.to_string(),
        "the interception CA CN=test interception CA has expired"
    );
    assert_eq!(interceptor.mint_failures_total(), 1);
    assert_eq!(interceptor.cached_hosts(), 0);
    interceptor
        .server_config("api.test")
        .await
        .expect_err("still expired");
    assert_eq!(interceptor.mint_failures_total(), 2);
    assert_eq!(interceptor.minted_total(), 0);
}

/// A leaf never outlives its CA.
#[tokio::test]
async fn a_leaf_ends_with_its_ca() {
    let mut options = options(Path::new("unused"), &[]);
    options.validity_days = 1;
    let made = generate(&options).expect("CA");
    let ca =
        InterceptionCa::from_pem(made.cert_pem.as_bytes(), made.key_pem.as_bytes()).expect("loads");
    let not_after = ca.not_after_unix();
    let settings = LeafSettings {
        validity: Duration::from_secs(10 * 86_400),
        ..LeafSettings::default()
    };
    let interceptor = Interceptor::new(Arc::new(ca), settings).expect("new");
    let ca_der = interceptor.ca().chain[0].clone();
    let config = interceptor.server_config("api.test").await.expect("mint");
    let seen = handshake(config, &ca_der, "api.test").await;
    let (_, cert) = x509_parser::parse_x509_certificate(&seen.certs[0]).expect("parses");
    assert_eq!(cert.validity().not_after.timestamp(), not_after);
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("UTF-8 temp path")
}

/// Runs openssl; its standard output.
fn openssl(args: &[&str]) -> String {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `openssl verify` of `leaf` against `ca_file` for TLS servers named `name`: `OK` or
/// openssl's complaint.
fn openssl_verify(dir: &Path, ca_file: &Path, leaf: &[u8], name: &str) -> String {
    let leaf_path = dir.join("leaf.pem");
    std::fs::write(&leaf_path, pem_of(leaf)).expect("leaf.pem");
    let name_flag = if name.parse::<std::net::IpAddr>().is_ok() {
        "-verify_ip"
    } else {
        "-verify_hostname"
    };
    let out = Command::new("openssl")
        .args([
            "verify",
            "-purpose",
            "sslserver",
            name_flag,
            name,
            "-CAfile",
        ])
        .args([ca_file, &leaf_path])
        .output()
        .expect("openssl runs");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if out.status.success() && text.trim().ends_with(": OK") {
        "OK".into()
    } else {
        text
    }
}

/// The CA `egressd ca init` writes signs leaves openssl accepts, within its name
/// constraints and only there.
#[tokio::test]
async fn openssl_accepts_leaves_of_an_initialised_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    let made = init(&options(dir.path(), &["test"])).expect("init");
    let cert = std::fs::read(&made.cert_path).expect("ca.crt");
    let key = std::fs::read(&made.key_path).expect("ca.key");
    let ca = InterceptionCa::from_pem(&cert, &key).expect("loads");
    let interceptor = Interceptor::new(Arc::new(ca), LeafSettings::default()).expect("new");
    let ca_der = interceptor.ca().chain[0].clone();
    for host in ["api.test", "127.0.0.1"] {
        let config = interceptor.server_config(host).await.expect("mint");
        let leaf = handshake(config, &ca_der, host).await.certs[0].clone();
        assert_eq!(
            openssl_verify(dir.path(), &made.cert_path, &leaf, host),
            "OK",
            "{host}"
        );
    }
}
