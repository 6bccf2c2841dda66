//! TLS peers for the TLS origination tests: a test CA issuing server and client certificates
//! (rcgen), and a TLS upstream (tokio-rustls in front of a hyper server) that records what each
//! client offered and negotiated.
//!
//! Everything listens on 127.0.0.1:0 and stops when dropped. A plaintext upstream is
//! [`super::upstream::Upstream`]; a peer that accepts TCP and never says a word is
//! [`silent_server`].

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{Acceptor, WebPkiClientVerifier};
use rustls::{ProtocolVersion, RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::LazyConfigAcceptor;

use super::upstream::{count_body, full, BoxBody, RawUpstream, Recorded};

/// The crypto provider of every config here (the same one egressd uses).
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A subject alternative name of a certificate.
#[derive(Clone, Debug)]
pub(crate) enum San {
    Dns(String),
    Ip(IpAddr),
    /// A URI, e.g. a SPIFFE ID `spiffe://cluster.local/ns/a/sa/b`.
    Uri(String),
}

impl San {
    pub(crate) fn dns(name: &str) -> San {
        San::Dns(name.to_owned())
    }

    pub(crate) fn ip(ip: &str) -> San {
        San::Ip(ip.parse().expect("IP address"))
    }

    pub(crate) fn uri(uri: &str) -> San {
        San::Uri(uri.to_owned())
    }

    fn to_rcgen(&self) -> SanType {
        match self {
            San::Dns(name) => SanType::DnsName(name.clone().try_into().expect("IA5 DNS name")),
            San::Ip(ip) => SanType::IpAddress(*ip),
            San::Uri(uri) => SanType::URI(uri.clone().try_into().expect("IA5 URI")),
        }
    }
}

/// When a certificate is valid. Fixed dates far from now, so a test never straddles a bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Validity {
    /// 2020-01-01 to 2200-01-01.
    Current,
    /// 2000-01-01 to 2001-01-01.
    Expired,
    /// 2100-01-01 to 2101-01-01.
    NotYetValid,
}

impl Validity {
    fn apply(self, params: &mut CertificateParams) {
        let (from, to) = match self {
            Validity::Current => (2020, 2200),
            Validity::Expired => (2000, 2001),
            Validity::NotYetValid => (2100, 2101),
        };
        params.not_before = rcgen::date_time_ymd(from, 1, 1);
        params.not_after = rcgen::date_time_ymd(to, 1, 1);
    }
}

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub(crate) struct CertAndKey {
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
}

impl CertAndKey {
    /// Writes `<stem>.pem` and `<stem>.key` into `dir`; returns (certificate path, key path).
    pub(crate) fn write(&self, dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{stem}.pem"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&cert, &self.cert_pem).expect("write certificate");
        std::fs::write(&key, &self.key_pem).expect("write key");
        (cert, key)
    }

    pub(crate) fn cert_chain(&self) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .expect("PEM certificates")
    }

    pub(crate) fn private_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).expect("PEM private key")
    }
}

/// A self-signed CA that issues leaf certificates directly (no intermediates).
pub(crate) struct TestCa {
    name: String,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    /// A CA whose subject CN is `name`.
    pub(crate) fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name(name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Validity::Current.apply(&mut params);
        let key = KeyPair::generate().expect("CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("self-signed CA");
        TestCa {
            name: name.to_owned(),
            issuer,
        }
    }

    /// The CA certificate, PEM.
    pub(crate) fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA certificate, DER (for a root store).
    pub(crate) fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// A root store trusting this CA alone.
    pub(crate) fn root_store(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots
            .add(self.der())
            .expect("CA certificate is a usable root");
        roots
    }

    /// Writes the CA certificate to `dir/<name>-ca.pem` and returns the path.
    /// A client config trusting only this CA, offering ALPN `http/1.1`; `sni: false` leaves
    /// the SNI extension out of the ClientHello.
    pub(crate) fn client_config(&self, sni: bool) -> Arc<rustls::ClientConfig> {
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("default protocol versions")
            .with_root_certificates(self.root_store())
            .with_no_client_auth();
        config.enable_sni = sni;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    pub(crate) fn write_pem(&self, dir: &Path) -> PathBuf {
        let path = dir.join(format!("{}-ca.pem", self.name));
        std::fs::write(&path, self.pem()).expect("write CA certificate");
        path
    }

    /// A server certificate (serverAuth) for `sans`, valid now.
    pub(crate) fn server_cert(&self, sans: &[San]) -> CertAndKey {
        self.server_cert_with(sans, Validity::Current)
    }

    /// A server certificate whose validity ended in 2001.
    pub(crate) fn expired_server_cert(&self, sans: &[San]) -> CertAndKey {
        self.server_cert_with(sans, Validity::Expired)
    }

    /// A server certificate valid only from 2100.
    pub(crate) fn not_yet_valid_server_cert(&self, sans: &[San]) -> CertAndKey {
        self.server_cert_with(sans, Validity::NotYetValid)
    }

    pub(crate) fn server_cert_with(&self, sans: &[San], validity: Validity) -> CertAndKey {
        let cn = sans.first().map_or_else(
            || "server".to_owned(),
            |san| match san {
                San::Dns(s) | San::Uri(s) => s.clone(),
                San::Ip(ip) => ip.to_string(),
            },
        );
        self.issue(&cn, sans, ExtendedKeyUsagePurpose::ServerAuth, validity)
    }

    /// A client certificate (clientAuth) with subject CN `cn` and no SANs.
    pub(crate) fn client_cert(&self, cn: &str) -> CertAndKey {
        self.issue(
            cn,
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
            Validity::Current,
        )
    }

    /// A client certificate (clientAuth) with subject CN `cn` and `sans` (e.g. a SPIFFE ID:
    /// an X.509-SVID).
    pub(crate) fn client_cert_with(&self, cn: &str, sans: &[San]) -> CertAndKey {
        self.issue(
            cn,
            sans,
            ExtendedKeyUsagePurpose::ClientAuth,
            Validity::Current,
        )
    }

    fn issue(
        &self,
        cn: &str,
        sans: &[San],
        purpose: ExtendedKeyUsagePurpose,
        validity: Validity,
    ) -> CertAndKey {
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name(cn);
        params.subject_alt_names = sans.iter().map(San::to_rcgen).collect();
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![purpose];
        params.use_authority_key_identifier_extension = true;
        validity.apply(&mut params);
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign leaf");
        CertAndKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

fn common_name(cn: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, cn);
    name
}

/// Which TLS versions a [`TlsUpstream`] accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TlsVersions {
    Both,
    Tls12Only,
    Tls13Only,
}

/// How a [`TlsUpstream`] behaves.
pub(crate) struct TlsOptions<'a> {
    /// Require a client certificate issued by this CA (mutual TLS).
    pub(crate) require_client_cert_from: Option<&'a TestCa>,
    /// ALPN protocols the server accepts, in its order of preference. Default: `h2`,
    /// `http/1.1` (what a real web server offers); HTTP/2 is served when negotiated.
    pub(crate) alpn: Vec<Vec<u8>>,
    pub(crate) versions: TlsVersions,
    /// Answer with `Connection: close`, so every request needs a new connection (and a new
    /// handshake): lets a test see what the client presents after a change.
    pub(crate) close_connections: bool,
}

impl Default for TlsOptions<'_> {
    fn default() -> Self {
        TlsOptions {
            require_client_cert_from: None,
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            versions: TlsVersions::Both,
            close_connections: false,
        }
    }
}

/// What a client put in its ClientHello (recorded for every connection, including those whose
/// handshake then failed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    /// The SNI; `None` when the client sent none (as for an IP address).
    pub(crate) sni: Option<String>,
    /// The ALPN protocols offered, in order (lossy UTF-8).
    pub(crate) alpn: Vec<String>,
}

/// A handshake that completed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Handshake {
    pub(crate) sni: Option<String>,
    /// The negotiated ALPN protocol, if any.
    pub(crate) alpn: Option<String>,
    pub(crate) version: ProtocolVersion,
    /// The subject CN of the client certificate, if one was presented.
    pub(crate) client_cn: Option<String>,
}

#[derive(Default)]
struct TlsState {
    hellos: Mutex<Vec<Hello>>,
    handshakes: Mutex<Vec<Handshake>>,
    /// Server-side handshake errors, for diagnosing a failing test.
    errors: Mutex<Vec<String>>,
    requests: Mutex<Vec<Recorded>>,
    close_connections: std::sync::atomic::AtomicBool,
}

/// An HTTPS server on 127.0.0.1: TLS by rustls, HTTP/1.1 (or h2 when negotiated) by hyper,
/// answering every request like [`super::upstream::Upstream::start`]: 200, `x-upstream: name`,
/// body `name`.
pub(crate) struct TlsUpstream {
    pub(crate) addr: SocketAddr,
    state: Arc<TlsState>,
    accept: JoinHandle<()>,
}

impl TlsUpstream {
    pub(crate) async fn start(name: &str, server: CertAndKey, opts: TlsOptions<'_>) -> TlsUpstream {
        let addr = "127.0.0.1:0".parse().unwrap();
        Self::start_on(name, addr, server, opts)
            .await
            .expect("bind TLS upstream")
    }

    /// As [`TlsUpstream::start`], bound to `addr` (a fixed port may be refused: the error).
    pub(crate) async fn start_on(
        name: &str,
        addr: SocketAddr,
        server: CertAndKey,
        opts: TlsOptions<'_>,
    ) -> std::io::Result<TlsUpstream> {
        let config = Arc::new(server_config(&server, &opts));
        let listener = super::ports::listen(addr).await?;
        let addr = listener.local_addr().expect("TLS upstream local addr");
        let state = Arc::new(TlsState::default());
        state
            .close_connections
            .store(opts.close_connections, std::sync::atomic::Ordering::SeqCst);
        let accept = tokio::spawn(accept_loop(
            listener,
            config,
            state.clone(),
            Arc::from(name),
        ));
        Ok(TlsUpstream {
            addr,
            state,
            accept,
        })
    }

    /// Every ClientHello received, in order.
    pub(crate) fn hellos(&self) -> Vec<Hello> {
        self.state.hellos.lock().unwrap().clone()
    }

    /// The SNI of every ClientHello received (`None`: no SNI sent), in order.
    pub(crate) fn snis(&self) -> Vec<Option<String>> {
        self.hellos().into_iter().map(|h| h.sni).collect()
    }

    /// The ALPN offers of every ClientHello received.
    pub(crate) fn offered_alpns(&self) -> Vec<Vec<String>> {
        self.hellos().into_iter().map(|h| h.alpn).collect()
    }

    /// Every completed handshake, in order.
    pub(crate) fn handshakes(&self) -> Vec<Handshake> {
        self.state.handshakes.lock().unwrap().clone()
    }

    /// The negotiated ALPN protocol of every completed handshake.
    pub(crate) fn alpns(&self) -> Vec<Option<String>> {
        self.handshakes().into_iter().map(|h| h.alpn).collect()
    }

    /// The TLS version of every completed handshake.
    pub(crate) fn versions(&self) -> Vec<ProtocolVersion> {
        self.handshakes().into_iter().map(|h| h.version).collect()
    }

    /// The client certificate CN of every completed handshake (`None`: no certificate).
    pub(crate) fn client_cns(&self) -> Vec<Option<String>> {
        self.handshakes().into_iter().map(|h| h.client_cn).collect()
    }

    /// Completed handshakes (one per TLS connection that got as far as HTTP).
    pub(crate) fn handshake_count(&self) -> usize {
        self.state.handshakes.lock().unwrap().len()
    }

    /// Why handshakes failed, as the server saw it.
    pub(crate) fn handshake_errors(&self) -> Vec<String> {
        self.state.errors.lock().unwrap().clone()
    }

    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    pub(crate) fn request_count(&self) -> usize {
        self.state.requests.lock().unwrap().len()
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        // The accept task owns the listener and the connection tasks: aborting it stops all.
        self.accept.abort();
    }
}

fn server_config(server: &CertAndKey, opts: &TlsOptions<'_>) -> ServerConfig {
    let versions: &[&'static rustls::SupportedProtocolVersion] = match opts.versions {
        TlsVersions::Both => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersions::Tls12Only => &[&rustls::version::TLS12],
        TlsVersions::Tls13Only => &[&rustls::version::TLS13],
    };
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .expect("protocol versions");
    let builder = match opts.require_client_cert_from {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(ca.root_store()), provider())
                    .build()
                    .expect("client certificate verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(server.cert_chain(), server.private_key())
        .expect("server certificate and key");
    config.alpn_protocols = opts.alpn.clone();
    config
}

async fn accept_loop(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    state: Arc<TlsState>,
    name: Arc<str>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                connections.spawn(serve_tls(stream, config.clone(), state.clone(), name.clone()));
            }
            // Reap finished connections so the set does not grow without bound.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve_tls(
    stream: TcpStream,
    config: Arc<ServerConfig>,
    state: Arc<TlsState>,
    name: Arc<str>,
) {
    // Reading the ClientHello first (instead of a plain accept) lets us record what the client
    // offered even when the handshake then fails.
    let start = match LazyConfigAcceptor::new(Acceptor::default(), stream).await {
        Ok(start) => start,
        Err(e) => {
            state
                .errors
                .lock()
                .unwrap()
                .push(format!("ClientHello: {e}"));
            return;
        }
    };
    let hello = start.client_hello();
    state.hellos.lock().unwrap().push(Hello {
        sni: hello.server_name().map(str::to_owned),
        alpn: hello
            .alpn()
            .map(|offers| {
                offers
                    .map(|p| String::from_utf8_lossy(p).into_owned())
                    .collect()
            })
            .unwrap_or_default(),
    });
    let tls = match start.into_stream(config).await {
        Ok(tls) => tls,
        Err(e) => {
            state.errors.lock().unwrap().push(format!("handshake: {e}"));
            return;
        }
    };
    let (_, conn) = tls.get_ref();
    state.handshakes.lock().unwrap().push(Handshake {
        sni: conn.server_name().map(str::to_owned),
        alpn: conn
            .alpn_protocol()
            .map(|p| String::from_utf8_lossy(p).into_owned()),
        version: conn.protocol_version().expect("version after handshake"),
        client_cn: conn
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| subject_cn(leaf)),
    });

    let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
        let state = state.clone();
        let name = name.clone();
        async move { Ok::<_, Infallible>(answer(request, &state, &name).await) }
    });
    // Serves HTTP/1.1 or, after ALPN h2, HTTP/2 (the builder tells them apart by the preface).
    // Errors are the client going away, which is not this server's business.
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(tls), service)
        .await;
}

async fn answer(
    request: http::Request<Incoming>,
    state: &TlsState,
    name: &str,
) -> http::Response<BoxBody> {
    let (parts, body) = request.into_parts();
    let body_len = count_body(body).await.unwrap_or(0);
    state.requests.lock().unwrap().push(Recorded {
        method: parts.method,
        uri: parts.uri.to_string(),
        version: parts.version,
        headers: parts.headers,
        body_len,
    });
    let mut response = http::Response::builder().header("x-upstream", name);
    if state
        .close_connections
        .load(std::sync::atomic::Ordering::SeqCst)
    {
        response = response.header(http::header::CONNECTION, "close");
    }
    response
        .body(full(name.to_owned()))
        .expect("valid response")
}

/// A server that accepts TCP connections and never writes a byte (nor closes): a TLS
/// handshake with it can only time out.
pub(crate) async fn silent_server() -> RawUpstream {
    RawUpstream::start(|stream| async move {
        // Holding the stream keeps the connection open until the server is dropped.
        let _stream = stream;
        std::future::pending::<()>().await
    })
    .await
}

/// Reads one DER element at the start of `input`: (tag, contents, what follows).
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        // Long form: the low bits count the length bytes that follow.
        let count = (first & 0x7f) as usize;
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, rest) = rest.split_at(count);
        let len = bytes.iter().fold(0usize, |acc, &b| (acc << 8) | b as usize);
        (len, rest)
    };
    if rest.len() < len {
        return None;
    }
    let (contents, rest) = rest.split_at(len);
    Some((tag, contents, rest))
}

/// The subject common name of a DER certificate. rustls hands out certificates as DER only, and
/// the CN is all the tests need, so this walks the few fields before the subject instead of
/// pulling in an X.509 parser.
pub(crate) fn subject_cn(cert: &[u8]) -> Option<String> {
    const CONSTRUCTED_CONTEXT_0: u8 = 0xa0;
    const OID_COMMON_NAME: [u8; 3] = [0x55, 0x04, 0x03]; // 2.5.4.3
    let (_, certificate, _) = der_element(cert)?;
    let (_, mut tbs, _) = der_element(certificate)?;
    // TBSCertificate: [0] version (optional), serialNumber, signature, issuer, validity,
    // subject, ...
    let (tag, _, after_version) = der_element(tbs)?;
    if tag == CONSTRUCTED_CONTEXT_0 {
        tbs = after_version;
    }
    for _ in 0..4 {
        tbs = der_element(tbs)?.2;
    }
    // Name: SEQUENCE OF SET OF SEQUENCE { type OID, value ANY }
    let (_, mut rdns, _) = der_element(tbs)?;
    while !rdns.is_empty() {
        let (_, mut set, rest) = der_element(rdns)?;
        rdns = rest;
        while !set.is_empty() {
            let (_, attribute, rest) = der_element(set)?;
            set = rest;
            let (_, oid, value) = der_element(attribute)?;
            if oid == OID_COMMON_NAME {
                let (_, text, _) = der_element(value)?;
                return String::from_utf8(text.to_vec()).ok();
            }
        }
    }
    None
}

/// `egressd_tls_passthrough_rejected_total{cause}` of a proxy now (0 before the first).
pub(crate) async fn passthrough_rejected(proxy: &super::proxy::TestProxy, cause: &str) -> u64 {
    let metrics = super::proxy::get(proxy.admin, "127.0.0.1", "/metrics")
        .await
        .text();
    let needle = format!("egressd_tls_passthrough_rejected_total{{cause=\"{cause}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&needle))
        .map_or(0, |v| v.trim().parse().expect("counter value"))
}

/// `GET /` with `Host: host` over an established TLS stream, as HTTP/1.1: the status and the
/// whole body. The connection closes once both are dropped.
pub(crate) async fn get_over<S>(stream: S, host: &str) -> (http::StatusCode, bytes::Bytes)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use http_body_util::BodyExt;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/1.1 handshake");
    tokio::spawn(conn);
    let response = sender
        .send_request(
            http::Request::get("/")
                .header("host", host)
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .expect("request"),
        )
        .await
        .expect("response");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("response body")
        .to_bytes();
    (status, body)
}
