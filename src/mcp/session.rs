//! MCP session affinity without a shared store (`sessionRouting: Stateful`).
//!
//! An MCP server issues an `Mcp-Session-Id` on `initialize`; every later request of that session
//! must reach the same server. egressd hands the client a session id that *wraps* the server's
//! id together with where it was issued — the Backend, its port and the endpoint — authenticated
//! with HMAC-SHA256 under a key that replicas share (a file), and unwraps it on the way in. Any
//! egressd replica, or egressd after a restart, can route the session without remembering
//! anything, whichever of a route's weighted backendRefs the request would otherwise get.
//!
//! Wrapped form: `egd2.<b64url(backend "\n" port "\n" endpoint "\n" upstream id)>.<b64url(MAC)>`,
//! the MAC over that payload. Only visible ASCII, as the MCP specification requires of session
//! ids. Ids of the earlier form (`egd1.`, without the Backend) are refused as issued by an
//! earlier egressd: the client initializes a new session.

use std::net::SocketAddr;
use std::path::Path;

use aws_lc_rs::hmac;
use data_encoding::BASE64URL_NOPAD;

/// What every id egressd wraps starts with.
pub(crate) const PREFIX: &str = "egd2.";
/// What ids wrapped by egressd before the Backend was part of them start with.
const EARLIER_PREFIX: &str = "egd1.";

/// Whether `value` is a session id egressd wrapped (of this form or an earlier one).
pub(crate) fn is_wrapped(value: &str) -> bool {
    value.starts_with(PREFIX) || value.starts_with(EARLIER_PREFIX)
}

/// Whether a query string carries a session id egressd wrapped.
pub(crate) fn mentions_wrapped(query: &str) -> bool {
    query.contains(PREFIX) || query.contains(EARLIER_PREFIX)
}

/// Where a session was issued: the Backend (`namespace/name`), its port and the endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionHome {
    pub backend: String,
    pub port: u16,
    pub endpoint: SocketAddr,
}
/// MAC bytes kept (128 bits: forging one takes 2^128 tries).
const MAC_LEN: usize = 16;

/// The key session ids are authenticated with.
pub struct SessionKey {
    key: hmac::Key,
    /// Where it came from, for logs and `/status` (never the key itself).
    pub(crate) source: KeySource,
}

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionKey")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeySource {
    /// Read from `ProxyConfig.spec.mcp.sessionKeyFile`: shared by replicas, survives restarts.
    File(std::path::PathBuf),
    /// Made at start: sessions stay valid for this process only.
    Generated,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyError {
    #[error("cannot read MCP session key file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("MCP session key file {path} holds {len} bytes; at least 32 are needed")]
    TooShort { path: String, len: usize },
}

impl SessionKey {
    /// A random key for this process.
    pub fn generate() -> SessionKey {
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &rng)
            // aws-lc's RNG failing means the process cannot do TLS either.
            .expect("the system RNG works");
        SessionKey {
            key,
            source: KeySource::Generated,
        }
    }

    /// The key in `path`: its bytes (at least 32; surrounding whitespace of a text key is
    /// ignored), so `openssl rand -base64 48 > key` makes a good one.
    pub(crate) fn from_file(path: &Path) -> Result<SessionKey, KeyError> {
        use crate::bounded::file::{read_regular_file, MAX_KEY_FILE};
        let bytes = read_regular_file(path, MAX_KEY_FILE).map_err(|source| KeyError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let trimmed = bytes.trim_ascii();
        if trimmed.len() < 32 {
            return Err(KeyError::TooShort {
                path: path.display().to_string(),
                len: trimmed.len(),
            });
        }
        Ok(SessionKey {
            key: hmac::Key::new(hmac::HMAC_SHA256, trimmed),
            source: KeySource::File(path.to_owned()),
        })
    }

    /// The key of this process when no `sessionKeyFile` is configured: made once, kept across
    /// reloads (a reload must not end every MCP session).
    pub(crate) fn of_this_process() -> std::sync::Arc<SessionKey> {
        static KEY: std::sync::OnceLock<std::sync::Arc<SessionKey>> = std::sync::OnceLock::new();
        KEY.get_or_init(|| std::sync::Arc::new(SessionKey::generate()))
            .clone()
    }

    fn mac(&self, payload: &str) -> [u8; MAC_LEN] {
        let tag = hmac::sign(&self.key, payload.as_bytes());
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&tag.as_ref()[..MAC_LEN]);
        out
    }

    /// The session id the client gets for `upstream`, issued at `home`.
    pub(crate) fn wrap(&self, home: &SessionHome, upstream: &str) -> String {
        let payload = format!(
            "{}\n{}\n{}\n{upstream}",
            home.backend, home.port, home.endpoint
        );
        let mac = self.mac(&payload);
        format!(
            "{PREFIX}{}.{}",
            BASE64URL_NOPAD.encode(payload.as_bytes()),
            BASE64URL_NOPAD.encode(&mac)
        )
    }

    /// Where `wrapped` was issued and the upstream session id inside it, if it is one of ours
    /// (the MAC is compared in constant time).
    pub(crate) fn unwrap(&self, wrapped: &str) -> Result<(SessionHome, String), Invalid> {
        let Some(rest) = wrapped.strip_prefix(PREFIX) else {
            return Err(if wrapped.starts_with(EARLIER_PREFIX) {
                Invalid::Earlier
            } else {
                Invalid::NotOurs
            });
        };
        let (payload, mac) = rest.split_once('.').ok_or(Invalid::Malformed)?;
        let payload = BASE64URL_NOPAD
            .decode(payload.as_bytes())
            .map_err(|_| Invalid::Malformed)?;
        let mac = BASE64URL_NOPAD
            .decode(mac.as_bytes())
            .map_err(|_| Invalid::Malformed)?;
        let payload = String::from_utf8(payload).map_err(|_| Invalid::Malformed)?;
        if mac.len() != MAC_LEN || !constant_time_eq(&mac, &self.mac(&payload)) {
            return Err(Invalid::BadMac);
        }
        let mut parts = payload.splitn(4, '\n');
        let (Some(backend), Some(port), Some(endpoint), Some(upstream)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Invalid::Malformed);
        };
        let home = SessionHome {
            backend: backend.to_owned(),
            port: port.parse().map_err(|_| Invalid::Malformed)?,
            endpoint: endpoint.parse().map_err(|_| Invalid::Malformed)?,
        };
        Ok((home, upstream.to_owned()))
    }
}

/// Why a session id was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// Not issued by egressd (no prefix).
    NotOurs,
    /// Issued by an earlier egressd, whose ids do not name the Backend.
    Earlier,
    Malformed,
    /// Issued under another key (another deployment, or a key that changed), or tampered with.
    BadMac,
}

impl Invalid {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Invalid::NotOurs => "not issued by egressd",
            Invalid::Earlier => "issued by an earlier egressd version",
            Invalid::Malformed => "malformed",
            Invalid::BadMac => "not valid under this proxy's session key",
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn home(endpoint: &str) -> SessionHome {
        SessionHome {
            backend: "team/mcp".into(),
            port: 8080,
            endpoint: endpoint.parse().unwrap(),
        }
    }

    #[test]
    fn a_wrapped_id_unwraps_to_where_it_was_issued_and_the_upstream_id() {
        let key = SessionKey::generate();
        let wrapped = key.wrap(&home("10.0.0.7:8080"), "abc-123");
        assert!(wrapped.starts_with("egd2."));
        assert!(wrapped.bytes().all(|b| (0x21..=0x7e).contains(&b)));
        assert_eq!(
            key.unwrap(&wrapped),
            Ok((home("10.0.0.7:8080"), "abc-123".to_owned()))
        );
    }

    #[test]
    fn another_key_a_changed_byte_or_an_earlier_form_is_refused() {
        let key = SessionKey::generate();
        let wrapped = key.wrap(&home("10.0.0.7:8080"), "abc-123");
        assert_eq!(
            SessionKey::generate().unwrap(&wrapped),
            Err(Invalid::BadMac)
        );
        let forged = key
            .wrap(&home("10.0.0.8:8080"), "abc-123")
            .split_once('.')
            .map(|(_, rest)| rest.split_once('.').unwrap().0.to_owned())
            .unwrap();
        let mac = wrapped.rsplit_once('.').unwrap().1;
        assert_eq!(
            key.unwrap(&format!("egd2.{forged}.{mac}")),
            Err(Invalid::BadMac),
            "another endpoint under the original MAC"
        );
        assert_eq!(key.unwrap("abc-123"), Err(Invalid::NotOurs));
        assert_eq!(key.unwrap("egd2.!!.??"), Err(Invalid::Malformed));
        assert_eq!(key.unwrap("egd1.AAAA.BBBB"), Err(Invalid::Earlier));
    }

    #[test]
    fn a_key_file_is_shared_by_replicas() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "0123456789abcdef0123456789abcdef-replicas\n").unwrap();
        let one = SessionKey::from_file(&path).unwrap();
        let two = SessionKey::from_file(&path).unwrap();
        let wrapped = one.wrap(&home("10.0.0.7:8080"), "s");
        assert_eq!(
            two.unwrap(&wrapped),
            Ok((home("10.0.0.7:8080"), "s".to_owned()))
        );
        std::fs::write(&path, "short").unwrap();
        assert!(matches!(
            SessionKey::from_file(&path),
            Err(KeyError::TooShort { len: 5, .. })
        ));
    }
}
