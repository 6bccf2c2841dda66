//! Global limits in Redis: the counters of `global` rules, shared by every egressd replica that
//! talks to the same Redis.
//!
//! # The algorithm (the local counters' own)
//!
//! A rule of `requests` (R) per `period` (P ms) counts in windows of P aligned on Redis's clock
//! (`TIME`, shared by the replicas): at `now`, window `w = floor(now / P)`, elapsed
//! `e = now % P`, `cur` the count of window w and `prev` that of w - 1. The estimate of the last
//! period is `prev * (P - e) / P + cur`, and a request is allowed iff
//! `(cur + 1) * P + prev * (P - e) <= R * P` (integers, exact). For each rule the reply has:
//!
//! - `remaining = floor(R - estimate)`, after counting the request when it is allowed;
//! - `reset`: allowed, `P - e` (the window's end); denied, the time until one more request
//!   would be allowed if no other arrived: in this window, from the first `t` with
//!   `(cur + 1) * P + prev * (P - t) <= R * P`, else in the next, where `cur` is the previous
//!   count: `P - e + t'` with `P + cur * (P - t') <= R * P` (at least 1 ms, whole ms rounded up).
//!
//! One script call (`script.lua`) decides for all the rules of a request: if every one allows,
//! each rule's current window counts it; if one denies, none counts it (a rule that allowed
//! then says so, with `remaining` not lowered by this request). Counters are
//! `<key_prefix><key>:<w>` (the key's `{hash tag}` keeps a rule's windows in one cluster slot),
//! expiring after 2 P. A decision that timed out may still have been counted: Redis runs the
//! script whenever it gets it.
//!
//! # Connections
//!
//! [`GlobalStore::start`] returns at once; each of `connections` multiplexed connections is kept
//! up by its own task ([`connect`]), decisions pick them round-robin. An unreachable or
//! misconfigured Redis is a state ([`GlobalStore::health`]), not an error of the config: the
//! tasks retry until it works, and limiting resumes by itself. Every decision is bounded by
//! `timeout`, waiting for a connection included.
//!
//! # What Redis must offer
//!
//! Redis 5 or later (or Valkey): a script that reads `TIME` then writes needs effect
//! replication, the default since 5. One endpoint, not Redis Cluster's client protocol
//! (MOVED is an error; rules of different hash tags in one call would be CROSSSLOT). The ACL
//! user needs `AUTH`, `SELECT` (with a database other than 0), `SCRIPT LOAD` and `EVALSHA` (the
//! script calls `TIME`, `GET`, `INCR` and `PEXPIRE`) on keys `<key_prefix>*`.

mod connect;
mod health;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::Script;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use self::connect::{Slot, SlotState};
use self::health::Health;
// The parts of a health report, named by /status and the console once they show it.
#[allow(unused_imports)]
pub(crate) use self::health::{ErrorCounts, StoreHealth, StoreState};
use super::{Decision, Quota};

/// How to reach the Redis of global limits. Equal settings may share one store.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct RedisSettings {
    /// `host:port`: a hostname or an IP literal (IPv6 in brackets).
    pub(crate) address: String,
    pub(crate) tls: Option<RedisTls>,
    /// The ACL user, sent with the password (`AUTH username password`); without a password,
    /// nothing is sent (the default user, if Redis lets it in).
    pub(crate) username: Option<String>,
    /// A secret: never in Debug, errors or logs.
    pub(crate) password: Option<String>,
    pub(crate) database: u32,
    /// Put before every key (e.g. `egressd:rl:`).
    pub(crate) key_prefix: String,
    /// Bounds every decision, waiting for a connection included.
    pub(crate) timeout: Duration,
    /// Multiplexed connections, used round-robin (at least 1).
    pub(crate) connections: usize,
}

impl fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            address,
            tls,
            username,
            password,
            database,
            key_prefix,
            timeout,
            connections,
        } = self;
        f.debug_struct("RedisSettings")
            .field("address", address)
            .field("tls", tls)
            .field("username", username)
            .field("password", &password.as_ref().map(|_| "<redacted>"))
            .field("database", database)
            .field("key_prefix", key_prefix)
            .field("timeout", timeout)
            .field("connections", connections)
            .finish()
    }
}

/// TLS to Redis.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RedisTls {
    /// The CA certificates (PEM) that Redis's certificate must chain to; `None`: the system's.
    pub(crate) ca_pem: Option<Vec<u8>>,
    /// The name sent as SNI and verified in the certificate; `None`: the address's host.
    pub(crate) server_name: Option<String>,
}

/// One rule's part of a decision.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GlobalCheck<'a> {
    /// The rule's counter key (with its `{hash tag}`), without the store's prefix.
    pub(crate) key: &'a str,
    pub(crate) quota: Quota,
}

/// Why the store could not decide. Messages never hold a secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StoreError {
    /// Not connected (yet, or again), refused, or the connection closed.
    #[error("Redis unavailable: {0}")]
    Unavailable(String),
    #[error("Redis did not answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// Redis refused the credentials or a command (WRONGPASS, NOAUTH, NOPERM): its message.
    #[error("Redis refused egressd's credentials: {0}")]
    Auth(String),
    #[error("Redis: {0}")]
    Other(String),
}

impl StoreError {
    /// The metric label: `unavailable`, `timeout`, `auth` or `other`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Timeout(_) => "timeout",
            StoreError::Auth(_) => "auth",
            StoreError::Other(_) => "other",
        }
    }
}

/// The counters of global rules in one Redis. Dropping it closes its connections.
pub(crate) struct GlobalStore {
    shared: Arc<Shared>,
    tasks: Vec<AbortHandle>,
}

/// What the store and its connection tasks share.
struct Shared {
    settings: RedisSettings,
    slots: Box<[Slot]>,
    /// The round-robin's next slot.
    next: AtomicUsize,
    health: Health,
}

/// The decision script, hashed once.
fn script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(include_str!("script.lua")))
}

impl GlobalStore {
    /// Starts connecting in the background (inside the tokio runtime) and returns at once.
    pub(crate) fn start(settings: RedisSettings) -> Arc<GlobalStore> {
        let slots = (0..settings.connections.max(1))
            .map(|_| Slot::new())
            .collect();
        let shared = Arc::new(Shared {
            health: Health::new(&settings.address),
            settings,
            slots,
            next: AtomicUsize::new(0),
        });
        let tasks = (0..shared.slots.len())
            .map(|index| tokio::spawn(connect::supervise(shared.clone(), index)).abort_handle())
            .collect();
        Arc::new(GlobalStore { shared, tasks })
    }

    /// Decides about one request for every rule in `checks`, atomically, within `timeout`:
    /// one decision per check, in their order.
    pub(crate) async fn acquire(
        &self,
        checks: &[GlobalCheck<'_>],
    ) -> Result<Vec<Decision>, StoreError> {
        if checks.is_empty() {
            return Ok(Vec::new());
        }
        let deadline = Instant::now() + self.shared.settings.timeout;
        let decided = self.decide(checks, deadline).await;
        match &decided {
            Ok(_) => self.shared.health.succeeded(),
            Err(error) => self.shared.health.decision_failed(error),
        }
        decided
    }

    async fn decide(
        &self,
        checks: &[GlobalCheck<'_>],
        deadline: Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        let timeout = self.shared.settings.timeout;
        let Ok(found) = tokio::time::timeout_at(deadline, self.shared.connection()).await else {
            return Err(StoreError::Unavailable(format!(
                "not connected within {} ms",
                timeout.as_millis()
            )));
        };
        let (slot, mut connection) = found?;
        let mut invocation = script().prepare_invoke();
        let prefix = &self.shared.settings.key_prefix;
        for check in checks {
            let mut key = String::with_capacity(prefix.len() + check.key.len());
            key.push_str(prefix);
            key.push_str(check.key);
            invocation
                .key(key)
                .arg(check.quota.requests)
                .arg(check.quota.period_ms());
        }
        let reply = invocation.invoke_async::<Vec<i64>>(&mut connection);
        match tokio::time::timeout_at(deadline, reply).await {
            Ok(Ok(values)) => {
                slot.answered();
                decisions(&values, checks.len())
            }
            Ok(Err(error)) => {
                let error = connect::classify(&error, timeout);
                if matches!(error, StoreError::Timeout(_)) {
                    slot.timed_out();
                }
                Err(error)
            }
            Err(_) => {
                slot.timed_out();
                Err(StoreError::Timeout(timeout))
            }
        }
    }

    /// Up or down, errors by kind, the last success.
    pub(crate) fn health(&self) -> StoreHealth {
        self.shared.health.snapshot()
    }

    /// The settings it was started with.
    pub(crate) fn settings(&self) -> &RedisSettings {
        &self.shared.settings
    }
}

impl Shared {
    /// The next connection that is up, round-robin; else the next slot's attempt under way
    /// (waited for), or its last error.
    async fn connection(&self) -> Result<(&Slot, redis::aio::MultiplexedConnection), StoreError> {
        let count = self.slots.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed) % count;
        for i in 0..count {
            let slot = &self.slots[(first + i) % count];
            if let SlotState::Up(connection) = &*slot.state.borrow() {
                return Ok((slot, connection.clone()));
            }
        }
        let slot = &self.slots[first];
        let mut state = slot.state.subscribe();
        let state = state
            .wait_for(|state| !matches!(state, SlotState::Connecting))
            .await
            .map_err(|_| StoreError::Unavailable("the store stopped".to_owned()))?;
        match &*state {
            SlotState::Up(connection) => Ok((slot, connection.clone())),
            SlotState::Down(error) => Err(error.clone()),
            SlotState::Connecting => Err(StoreError::Unavailable("connecting".to_owned())),
        }
    }
}

/// The script's reply: three integers per rule.
fn decisions(values: &[i64], rules: usize) -> Result<Vec<Decision>, StoreError> {
    if values.len() != 3 * rules {
        return Err(StoreError::Other(format!(
            "the rate limit script answered {} values for {rules} rules",
            values.len()
        )));
    }
    let decisions = values
        .chunks_exact(3)
        .map(|rule| Decision {
            allowed: rule[0] == 1,
            remaining: u32::try_from(rule[1].max(0)).unwrap_or(u32::MAX),
            reset: Duration::from_millis(u64::try_from(rule[2]).unwrap_or(0)),
        })
        .collect();
    Ok(decisions)
}

impl Drop for GlobalStore {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl fmt::Debug for GlobalStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GlobalStore")
            .field("settings", &self.shared.settings)
            .field("state", &self.shared.health.snapshot().state)
            .finish_non_exhaustive()
    }
}
