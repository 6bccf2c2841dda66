//! The store's connections: each slot has a task that connects (TCP, TLS with egressd's own
//! rustls config, then AUTH, SELECT and SCRIPT LOAD over redis-rs's multiplexed connection),
//! drives the connection until it closes, and connects again, with a backoff from 50 ms doubling
//! to 2 s while attempts fail.
//!
//! The task owns the connection's driver future: aborting the task (the store dropped) closes
//! the connection, and a closed connection (Redis killed or restarted) ends the driver, so the
//! task notices at once, with or without traffic. A connection that stops answering (a frozen
//! or partitioned Redis) is dropped after [`TIMEOUTS_BEFORE_RECONNECT`] timeouts in a row and
//! a second without an answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisConnectionInfo, RedisError};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};
use tokio_rustls::TlsConnector;

use super::{script, RedisSettings, RedisTls, Shared, StoreError};
use crate::ratelimit::clock;

const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A connection that lived this long is connected again at once when lost; one lost sooner
/// waits the backoff first, as a failed attempt does.
const STABLE_AFTER: Duration = BACKOFF_MAX;
/// A connection (TCP, TLS, AUTH, SELECT, SCRIPT LOAD) may take this long even when the
/// decisions' timeout is shorter: it runs in the background, never in a request's path, and a
/// distant Redis needs several round trips.
const CONNECT_TIMEOUT_FLOOR: Duration = Duration::from_secs(1);
/// A connection is given up for a new one after this many decisions timed out in a row...
const TIMEOUTS_BEFORE_RECONNECT: u32 = 3;
/// ...with no answer for this long (a latency spike of a busy Redis is not a dead connection).
const SILENCE_BEFORE_RECONNECT_MS: u64 = 1000;

type Driver = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Where one multiplexed connection stands.
#[derive(Clone)]
pub(super) enum SlotState {
    /// An attempt is under way: a decision may wait for it (within its timeout).
    Connecting,
    Up(MultiplexedConnection),
    /// The last attempt failed with this error; the next one comes after a backoff.
    Down(StoreError),
}

pub(super) struct Slot {
    pub(super) state: watch::Sender<SlotState>,
    /// Decisions on the current connection that timed out since its last answer.
    timeouts: AtomicU32,
    /// When the current connection last answered or was made ([`clock::now_ms`]).
    answered_ms: AtomicU64,
    /// Wakes the task to drop a connection that stopped answering.
    give_up: Notify,
}

impl Slot {
    pub(super) fn new() -> Slot {
        Slot {
            state: watch::Sender::new(SlotState::Connecting),
            timeouts: AtomicU32::new(0),
            answered_ms: AtomicU64::new(0),
            give_up: Notify::new(),
        }
    }

    /// A decision on this slot's connection got its answer. (Written only when it changes: the
    /// cache line is read by every worker thread.)
    pub(super) fn answered(&self) {
        if self.timeouts.load(Ordering::Relaxed) != 0 {
            self.timeouts.store(0, Ordering::Relaxed);
        }
        let now = clock::now_ms();
        if self.answered_ms.load(Ordering::Relaxed) != now {
            self.answered_ms.store(now, Ordering::Relaxed);
        }
    }

    /// A decision on this slot's connection timed out.
    pub(super) fn timed_out(&self) {
        let timeouts = self.timeouts.fetch_add(1, Ordering::Relaxed) + 1;
        let silent = clock::now_ms().saturating_sub(self.answered_ms.load(Ordering::Relaxed));
        if timeouts >= TIMEOUTS_BEFORE_RECONNECT && silent >= SILENCE_BEFORE_RECONNECT_MS {
            self.give_up.notify_waiters();
        }
    }
}

/// Keeps slot `index` connected for as long as the store lives (the store aborts it).
pub(super) async fn supervise(shared: Arc<Shared>, index: usize) {
    let slot = &shared.slots[index];
    let settings = &shared.settings;
    let tls = settings.tls.as_ref().map(tls_config);
    let connect_timeout = settings.timeout.max(CONNECT_TIMEOUT_FLOOR);
    let mut backoff = BACKOFF_MIN;
    loop {
        slot.state.send_replace(SlotState::Connecting);
        let attempt = tokio::time::timeout(connect_timeout, connect(settings, tls.as_ref()));
        let error = match attempt.await {
            Ok(Ok((connection, driver))) => {
                slot.timeouts.store(0, Ordering::Relaxed);
                slot.answered_ms.store(clock::now_ms(), Ordering::Relaxed);
                shared.health.succeeded();
                let up_since = Instant::now();
                // Registered before the connection is published: no give-up can be missed.
                let give_up = slot.give_up.notified();
                slot.state.send_replace(SlotState::Up(connection));
                let lost = tokio::select! {
                    () = driver => "the connection closed",
                    () = give_up => "the connection stopped answering",
                };
                tracing::debug!(address = %settings.address, "Redis: {lost}");
                if up_since.elapsed() >= STABLE_AFTER {
                    backoff = BACKOFF_MIN;
                    continue;
                }
                // One that dies young (a Redis that closes what it accepts) waits its turn too.
                StoreError::Unavailable(lost.to_owned())
            }
            Ok(Err(error)) => error,
            Err(_) => StoreError::Unavailable(format!(
                "no connection within {} ms",
                connect_timeout.as_millis()
            )),
        };
        shared.health.connect_failed(&error);
        slot.state.send_replace(SlotState::Down(error));
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// One attempt: a connection ready for decisions, and its driver (to be polled until it ends).
async fn connect(
    settings: &RedisSettings,
    tls: Option<&Result<Arc<ClientConfig>, StoreError>>,
) -> Result<(MultiplexedConnection, Driver), StoreError> {
    let (host, port) = split_address(&settings.address)?;
    let tcp = TcpStream::connect((host, port))
        .await
        .map_err(|e| StoreError::Unavailable(format!("connecting to {}: {e}", settings.address)))?;
    // Commands are small and each waits for its answer: no Nagle delay.
    let _ = tcp.set_nodelay(true);
    let Some(tls) = tls else {
        return handshake(settings, tcp).await;
    };
    let config = tls.clone()?;
    let name = settings
        .tls
        .as_ref()
        .and_then(|tls| tls.server_name.as_deref())
        .unwrap_or(host);
    let name = ServerName::try_from(name.to_owned())
        .map_err(|e| StoreError::Other(format!("TLS server name {name:?}: {e}")))?;
    let stream = TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| tls_error(&settings.address, &e))?;
    handshake(settings, stream).await
}

/// Redis's session on a connected stream: AUTH (when there is a password), SELECT (a database
/// other than 0), and SCRIPT LOAD, which also proves that the user may run the script.
async fn handshake<S>(
    settings: &RedisSettings,
    stream: S,
) -> Result<(MultiplexedConnection, Driver), StoreError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // egressd sends AUTH itself: redis-rs would replace the server's message of a refusal
    // (WRONGPASS, NOPERM...) with its own, and the operator needs the server's.
    let info = RedisConnectionInfo::default().set_skip_set_lib_name();
    let setup_timeout = settings.timeout.max(CONNECT_TIMEOUT_FLOOR);
    let config = AsyncConnectionConfig::new().set_response_timeout(Some(setup_timeout));
    let (mut connection, driver) = MultiplexedConnection::new_with_config(&info, stream, config)
        .await
        .map_err(|e| classify(&e, setup_timeout))?;
    let mut driver: Driver = Box::pin(driver);
    let setup = async {
        if let Some(password) = &settings.password {
            let mut auth = redis::cmd("AUTH");
            if let Some(username) = &settings.username {
                auth.arg(username);
            }
            auth.arg(password);
            auth.query_async::<()>(&mut connection).await?;
        }
        if settings.database != 0 {
            redis::cmd("SELECT")
                .arg(settings.database)
                .query_async::<()>(&mut connection)
                .await?;
        }
        script().load_async(&mut connection).await
    };
    tokio::select! {
        done = setup => { done.map_err(|e| classify(&e, setup_timeout))?; }
        () = &mut driver => {
            return Err(StoreError::Unavailable("Redis closed the connection".to_owned()));
        }
    }
    connection.set_response_timeout(settings.timeout);
    Ok((connection, driver))
}

/// What a redis-rs error means to egressd.
pub(super) fn classify(error: &RedisError, timeout: Duration) -> StoreError {
    if let Some(code) = error.code() {
        let message = match error.detail() {
            Some(detail) => format!("{code} {detail}"),
            None => code.to_owned(),
        };
        return match code {
            "WRONGPASS" | "NOAUTH" | "NOPERM" => StoreError::Auth(message),
            _ => StoreError::Other(message),
        };
    }
    if error.kind() == redis::ErrorKind::AuthenticationFailed {
        StoreError::Auth(error.to_string())
    } else if error.is_timeout() {
        StoreError::Timeout(timeout)
    } else if error.is_io_error() || error.is_connection_dropped() || error.is_connection_refusal()
    {
        StoreError::Unavailable(error.to_string())
    } else {
        StoreError::Other(error.to_string())
    }
}

/// A failed TLS handshake: a certificate or protocol problem is the configuration's, anything
/// else (a reset) the network's.
fn tls_error(address: &str, error: &std::io::Error) -> StoreError {
    let message = format!("TLS handshake with {address}: {error}");
    let rustls = error
        .get_ref()
        .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some());
    if rustls {
        StoreError::Other(message)
    } else {
        StoreError::Unavailable(message)
    }
}

/// `host:port`, `[v6]:port`: the host (without brackets) and the port.
pub(super) fn split_address(address: &str) -> Result<(&str, u16), StoreError> {
    let invalid = || StoreError::Other(format!("address {address:?} is not host:port"));
    let (host, port) = match address.strip_prefix('[') {
        Some(rest) => rest.split_once("]:").ok_or_else(invalid)?,
        None => address.rsplit_once(':').ok_or_else(invalid)?,
    };
    if host.is_empty() || (host.contains(':') && !address.starts_with('[')) {
        return Err(invalid());
    }
    Ok((host, port.parse().map_err(|_| invalid())?))
}

/// The TLS client config: egressd's aws-lc-rs provider (no process-wide default is needed or
/// installed), trusting the given CA or else the platform's roots.
fn tls_config(tls: &RedisTls) -> Result<Arc<ClientConfig>, StoreError> {
    let roots = match &tls.ca_pem {
        Some(pem) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| StoreError::Other(format!("Redis CA PEM: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| StoreError::Other(format!("Redis CA certificate: {e}")))?;
            }
            if roots.is_empty() {
                return Err(StoreError::Other(
                    "Redis CA PEM holds no certificate".to_owned(),
                ));
            }
            roots
        }
        None => system_roots()?,
    };
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Other(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .clone()
}

/// The platform's trust store, read once per process.
fn system_roots() -> Result<RootCertStore, StoreError> {
    static ROOTS: OnceLock<RootCertStore> = OnceLock::new();
    let roots = ROOTS.get_or_init(|| {
        let mut roots = RootCertStore::empty();
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        roots
    });
    if roots.is_empty() {
        return Err(StoreError::Other(
            "no system root certificate to verify Redis with (set a CA)".to_owned(),
        ));
    }
    Ok(roots.clone())
}
