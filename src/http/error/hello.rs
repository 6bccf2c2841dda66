//! The refusals of a passthrough connection before anything routes it.

use super::{row, Class};

/// Why a passthrough connection's ClientHello gives nothing to route by: the client's doing.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HelloRejection {
    #[error("no ClientHello within headerReadTimeout")]
    Timeout,
    #[error("no usable ClientHello: {0}")]
    NotTls(&'static str),
    #[error("ClientHello without SNI: nothing to route by")]
    NoSni,
    #[error("the SNI is no host name: {0}")]
    InvalidSni(String),
}

impl HelloRejection {
    pub(super) fn class(&self) -> Class {
        match self {
            HelloRejection::Timeout => row::CLIENT_HELLO_TIMEOUT,
            HelloRejection::NotTls(_) => row::NOT_TLS,
            HelloRejection::NoSni => row::NO_SNI,
            HelloRejection::InvalidSni(_) => row::INVALID_SNI,
        }
    }
}
