//! Global limits in Redis (placeholder with the agreed API until the store lands).

use std::sync::Arc;
use std::time::Duration;

use super::{Decision, Quota};

#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct RedisSettings {
    pub(crate) address: String,
    pub(crate) tls: Option<RedisTls>,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) database: u32,
    pub(crate) key_prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) connections: usize,
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RedisTls {
    pub(crate) ca_pem: Option<Vec<u8>>,
    pub(crate) server_name: Option<String>,
}

#[derive(Debug)]
pub(crate) struct GlobalStore {
    settings: RedisSettings,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    #[error("Redis is unavailable: {0}")]
    Unavailable(String),
    #[error("Redis did not answer in time")]
    Timeout,
    #[error("Redis refused egressd's credentials: {0}")]
    Auth(String),
    #[error("Redis: {0}")]
    Other(String),
}

impl StoreError {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Timeout => "timeout",
            StoreError::Auth(_) => "auth",
            StoreError::Other(_) => "other",
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) enum StoreHealth {
    Connecting,
    Up,
    Down { error: String },
}

pub(crate) struct GlobalCheck<'a> {
    pub(crate) key: &'a str,
    pub(crate) quota: Quota,
}

impl GlobalStore {
    pub(crate) fn start(settings: RedisSettings) -> Arc<GlobalStore> {
        Arc::new(GlobalStore { settings })
    }
    pub(crate) async fn acquire(
        &self,
        _checks: &[GlobalCheck<'_>],
    ) -> Result<Vec<Decision>, StoreError> {
        Err(StoreError::Unavailable("not built yet".into()))
    }
    pub(crate) fn health(&self) -> StoreHealth {
        StoreHealth::Connecting
    }
    pub(crate) fn settings(&self) -> &RedisSettings {
        &self.settings
    }
}
