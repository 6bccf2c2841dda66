//! One probe of one TLS endpoint: a real handshake with the port's client config, what the
//! server said about the client certificate, and (when verification failed) a second,
//! diagnostic handshake that only reads the certificate the server presents.
//!
//! The real handshake uses a clone of the port's `ClientConfig` with two spies that change no
//! decision: the client-certificate resolver is wrapped to learn whether the server asked for a
//! certificate, and the session store is wrapped to learn when the server sends a TLS 1.3
//! session ticket (servers send tickets after they have accepted the client's certificate). The
//! verifier, versions, ALPN, SNI, key and crypto provider are the port's own.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::{
    ClientSessionMemoryCache, ClientSessionStore, ResolvesClientCert, Resumption,
    Tls12ClientSessionValue, Tls13ClientSessionValue,
};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::sign::CertifiedKey;
use rustls::{AlertDescription, ClientConfig, NamedGroup, ProtocolVersion, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_rustls::client::TlsStream;

use crate::upstream::connect::{connect_tcp, ConnectError};
use crate::upstream::tls::{TlsFailure, TlsOrigination};
use crate::upstream::verify::CertVerifier;

/// How long, after a TLS 1.3 handshake in which a client certificate was sent, the probe waits
/// for the server's verdict on it. In TLS 1.3 the server checks the certificate after the client
/// considers the handshake done, and says so only by an alert (rejected) or, usually, a session
/// ticket (accepted); a server that sends neither leaves the probe to conclude "no objection".
const VERDICT_WINDOW: Duration = Duration::from_secs(1);

/// What probing one TLS endpoint found.
#[derive(Debug)]
pub(super) struct TlsProbe {
    /// The SNI sent (`None`: none, the endpoint is an IP address).
    pub(crate) sni: Option<String>,
    /// The name the certificate was checked against by default (SNI, or the endpoint IP).
    pub(crate) server_name: ServerName<'static>,
    pub(crate) outcome: Outcome,
    /// The chain the server presented (leaf first), when the probe got to see it.
    pub(crate) chain: Option<Vec<CertificateDer<'static>>>,
    /// Whether `chain` comes from the diagnostic handshake (the real one failed).
    pub(crate) chain_from_diagnostic: bool,
    pub(crate) client_cert: ClientCert,
}

/// How far the real connection got.
#[derive(Debug)]
pub(super) enum Outcome {
    ConnectFailed(ConnectError),
    HandshakeFailed {
        failure: TlsFailure,
        detail: String,
    },
    Established {
        version: Option<ProtocolVersion>,
        alpn: Option<Vec<u8>>,
    },
}

/// What became of the client certificate.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ClientCert {
    /// The port has none (mode Simple), and the server did not ask for one.
    NotConfigured,
    /// The port has none, but the server asked for one.
    RequestedButNotConfigured,
    /// Configured, and the server did not ask for it (so it was not sent).
    NotRequested,
    /// Sent, and the server accepted it; the text says how the probe knows.
    Accepted(String),
    /// Sent, and the server raised no objection within the verdict window.
    NoObjection,
    /// The server refused the handshake or the connection because of it (or because none was
    /// sent); `failure` when the server said precisely that a certificate is required.
    Rejected {
        failure: Option<TlsFailure>,
        why: String,
    },
    /// The handshake failed before the question came up, or for another reason.
    Unknown(String),
}

/// Probes `addr` with the port's TLS settings; connect and handshake each within `timeout`, as
/// egressd's own connections.
pub(super) async fn probe_tls(
    addr: SocketAddr,
    tls: &TlsOrigination,
    timeout: Duration,
) -> TlsProbe {
    let server_name = tls.server_name(addr);
    let sni = tls.sni.as_ref().map(|n| n.to_str().into_owned());
    let configured = tls.config.client_auth_cert_resolver.has_certs();
    let (config, cert_spy, tickets) = spied_config(tls);
    let tcp = match connect_tcp(addr, timeout).await {
        Ok(tcp) => tcp,
        Err(e) => {
            return TlsProbe {
                sni,
                server_name,
                outcome: Outcome::ConnectFailed(e),
                chain: None,
                chain_from_diagnostic: false,
                client_cert: if configured {
                    ClientCert::Unknown("not reached".to_owned())
                } else {
                    ClientCert::NotConfigured
                },
            };
        }
    };
    let result = handshake(config, server_name.clone(), tcp, timeout).await;
    let asked = Asked {
        configured,
        requested: cert_spy.requested.load(Ordering::SeqCst),
    };
    let (outcome, chain, chain_from_diagnostic, client_cert) = match result {
        Ok(stream) => {
            let (outcome, chain, client_cert) = established(stream, &tickets, asked, timeout).await;
            (outcome, chain, false, client_cert)
        }
        Err((failure, detail, error)) => {
            let client_cert = refused_client_cert(asked, failure, &detail, error.as_ref());
            // No certificate will come from a peer that is silent or speaks plaintext.
            let chain = match failure {
                TlsFailure::HandshakeTimeout | TlsFailure::PlaintextPeer => None,
                _ => diagnostic_chain(addr, tls, server_name.clone(), timeout).await,
            };
            let outcome = Outcome::HandshakeFailed { failure, detail };
            let from_diagnostic = chain.is_some();
            (outcome, chain, from_diagnostic, client_cert)
        }
    };
    TlsProbe {
        sni,
        server_name,
        outcome,
        chain,
        chain_from_diagnostic,
        client_cert,
    }
}

/// A clone of the port's client config with the two spies (see the module's doc), and the
/// spies.
fn spied_config(tls: &TlsOrigination) -> (Arc<ClientConfig>, Arc<CertSpy>, Arc<TicketSpy>) {
    let cert_spy = Arc::new(CertSpy {
        inner: tls.config.client_auth_cert_resolver.clone(),
        requested: AtomicBool::new(false),
    });
    let tickets = Arc::new(TicketSpy {
        inner: ClientSessionMemoryCache::new(8),
        received: Notify::new(),
    });
    let mut config = (*tls.config).clone();
    config.client_auth_cert_resolver = cert_spy.clone();
    config.resumption = Resumption::store(tickets.clone());
    (Arc::new(config), cert_spy, tickets)
}

/// Whether the port has a client certificate, and whether the server asked for one.
#[derive(Clone, Copy)]
struct Asked {
    configured: bool,
    requested: bool,
}

/// What an established connection tells: version and ALPN, the server's chain, and the
/// server's verdict on the client certificate (waited for in TLS 1.3). Closes the connection.
async fn established(
    mut stream: TlsStream<TcpStream>,
    tickets: &TicketSpy,
    asked: Asked,
    timeout: Duration,
) -> (Outcome, Option<Vec<CertificateDer<'static>>>, ClientCert) {
    let (_, conn) = stream.get_ref();
    let version = conn.protocol_version();
    let outcome = Outcome::Established {
        version,
        alpn: conn.alpn_protocol().map(<[u8]>::to_vec),
    };
    let chain = conn
        .peer_certificates()
        .map(|chain| chain.iter().map(|c| c.clone().into_owned()).collect());
    let Asked {
        configured,
        requested,
    } = asked;
    let client_cert = match (configured, requested, version) {
        (false, false, _) => ClientCert::NotConfigured,
        (true, false, _) => ClientCert::NotRequested,
        // TLS 1.2: the server's Finished comes after it has judged our Certificate.
        (true, true, Some(ProtocolVersion::TLSv1_2)) => {
            ClientCert::Accepted("the server finished the handshake after checking it".to_owned())
        }
        (false, true, Some(ProtocolVersion::TLSv1_2)) => ClientCert::RequestedButNotConfigured,
        // TLS 1.3: the server judges our (possibly empty) Certificate only after the client
        // has finished; a server that insists says so by an alert now.
        (_, true, _) => {
            let verdict = verdict(&mut stream, tickets, timeout.min(VERDICT_WINDOW)).await;
            match verdict {
                ClientCert::Rejected { .. } => verdict,
                _ if !configured => ClientCert::RequestedButNotConfigured,
                _ => verdict,
            }
        }
    };
    // A polite close_notify; the server's opinion of it does not matter.
    let _ = tokio::time::timeout(timeout, stream.shutdown()).await;
    (outcome, chain, client_cert)
}

/// What a failed handshake (`failure`, `detail`, and the rustls `error` if any) tells about
/// the client certificate.
fn refused_client_cert(
    asked: Asked,
    failure: TlsFailure,
    detail: &str,
    error: Option<&rustls::Error>,
) -> ClientCert {
    match (asked.configured, asked.requested, error.and_then(alert)) {
        (_, _, Some(AlertDescription::CertificateRequired)) => ClientCert::Rejected {
            failure: Some(TlsFailure::ClientCertRequired),
            why: detail.to_owned(),
        },
        (false, true, _) => ClientCert::RequestedButNotConfigured,
        (false, false, _) => ClientCert::NotConfigured,
        // An alert right after our certificate went out is the server's answer to it.
        (true, true, Some(a)) => ClientCert::Rejected {
            failure: None,
            why: format!("the server answered it with alert {a:?}"),
        },
        (true, true, None) => ClientCert::Unknown(format!(
            "the server asked for it, but the handshake failed ({}) first",
            failure.code()
        )),
        (true, false, _) => ClientCert::Unknown(format!(
            "the handshake failed ({}) before the server asked for it",
            failure.code()
        )),
    }
}

type HandshakeError = (TlsFailure, String, Option<rustls::Error>);

async fn handshake(
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
    tcp: TcpStream,
    timeout: Duration,
) -> Result<TlsStream<TcpStream>, HandshakeError> {
    let connector = tokio_rustls::TlsConnector::from(config);
    match tokio::time::timeout(timeout, connector.connect(server_name, tcp)).await {
        Err(_) => Err((
            TlsFailure::HandshakeTimeout,
            format!("no handshake within {timeout:?}"),
            None,
        )),
        Ok(Err(e)) => {
            let failure = TlsFailure::from_error_chain(&e).unwrap_or(TlsFailure::Other);
            let detail = e.to_string();
            Err((failure, detail, rustls_error(&e).cloned()))
        }
        Ok(Ok(stream)) => Ok(stream),
    }
}

/// Waits for the server's word on the client certificate after a TLS 1.3 handshake.
async fn verdict(
    stream: &mut TlsStream<TcpStream>,
    tickets: &TicketSpy,
    window: Duration,
) -> ClientCert {
    let mut buf = [0u8; 512];
    let read = async {
        tokio::select! {
            // Reading drives the connection: it processes tickets and alerts as they come.
            read = stream.read(&mut buf) => Some(read),
            () = tickets.received.notified() => None,
        }
    };
    match tokio::time::timeout(window, read).await {
        Err(_) => ClientCert::NoObjection,
        Ok(None) => ClientCert::Accepted("the server sent a session ticket after it".to_owned()),
        Ok(Some(Ok(0))) => ClientCert::Rejected {
            failure: None,
            why: "the server closed the connection right after the handshake".to_owned(),
        },
        Ok(Some(Ok(_))) => ClientCert::Accepted("the server sent data after it".to_owned()),
        Ok(Some(Err(e))) => match rustls_error(&e) {
            Some(tls) if alert(tls) == Some(AlertDescription::CertificateRequired) => {
                ClientCert::Rejected {
                    failure: Some(TlsFailure::ClientCertRequired),
                    why: format!("after the handshake: {tls}"),
                }
            }
            Some(tls) => ClientCert::Rejected {
                failure: None,
                why: format!("after the handshake: {tls}"),
            },
            None => ClientCert::Rejected {
                failure: None,
                why: format!("the connection failed after the handshake: {e}"),
            },
        },
    }
}

/// The chain the server presents, read by a handshake whose verifier accepts anything. Used
/// only to describe the certificate; nothing is sent on this connection.
async fn diagnostic_chain(
    addr: SocketAddr,
    tls: &TlsOrigination,
    server_name: ServerName<'static>,
    timeout: Duration,
) -> Option<Vec<CertificateDer<'static>>> {
    let recorder = Arc::new(CertVerifier::keeping_any_chain(
        tls.config.crypto_provider(),
    ));
    let mut config = (*tls.config).clone();
    config
        .dangerous()
        .set_certificate_verifier(recorder.clone());
    // A resumed session shows no certificate; start afresh every time.
    config.resumption = Resumption::disabled();
    let tcp = connect_tcp(addr, timeout).await.ok()?;
    // Its outcome does not matter: the verifier has seen the chain, or there was none.
    if let Ok(mut stream) = handshake(Arc::new(config), server_name, tcp, timeout).await {
        let _ = tokio::time::timeout(timeout, stream.shutdown()).await;
    }
    recorder.presented_chain()
}

/// The rustls error inside an I/O error, if that is what it is.
fn rustls_error(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

fn alert(e: &rustls::Error) -> Option<AlertDescription> {
    match e {
        rustls::Error::AlertReceived(a) => Some(*a),
        _ => None,
    }
}

/// Wraps the port's client-certificate resolver to learn whether the server asked: rustls
/// consults the resolver only when a CertificateRequest arrives.
#[derive(Debug)]
struct CertSpy {
    inner: Arc<dyn ResolvesClientCert>,
    requested: AtomicBool,
}

impl ResolvesClientCert for CertSpy {
    fn resolve(
        &self,
        root_hint_subjects: &[&[u8]],
        sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.requested.store(true, Ordering::SeqCst);
        self.inner.resolve(root_hint_subjects, sigschemes)
    }

    fn only_raw_public_keys(&self) -> bool {
        self.inner.only_raw_public_keys()
    }

    fn has_certs(&self) -> bool {
        self.inner.has_certs()
    }
}

/// A session store that signals when a TLS 1.3 ticket arrives.
#[derive(Debug)]
struct TicketSpy {
    inner: ClientSessionMemoryCache,
    /// `notify_one` keeps a permit, so a ticket that arrives before anyone waits is not missed.
    received: Notify,
}

impl ClientSessionStore for TicketSpy {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: NamedGroup) {
        self.inner.set_kx_hint(server_name, group);
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<NamedGroup> {
        self.inner.kx_hint(server_name)
    }

    fn set_tls12_session(&self, server_name: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.inner.set_tls12_session(server_name, value);
    }

    fn tls12_session(&self, server_name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.inner.tls12_session(server_name)
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.inner.remove_tls12_session(server_name);
    }

    fn insert_tls13_ticket(
        &self,
        server_name: ServerName<'static>,
        value: Tls13ClientSessionValue,
    ) {
        self.inner.insert_tls13_ticket(server_name, value);
        self.received.notify_one();
    }

    fn take_tls13_ticket(
        &self,
        server_name: &ServerName<'static>,
    ) -> Option<Tls13ClientSessionValue> {
        self.inner.take_tls13_ticket(server_name)
    }
}
