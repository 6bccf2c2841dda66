//! MCP session affinity without a shared store (`sessionRouting: Stateful`).
//!
//! An MCP server issues an `Mcp-Session-Id` on `initialize`; every later request of that session
//! must reach the same server. egressd hands the client a session id that *wraps* the server's
//! id together with the endpoint that issued it, authenticated with HMAC-SHA256 under a key that
//! replicas share (a file), and unwraps it on the way in. Any egressd replica, or egressd after a
//! restart, can route the session without remembering anything.
//!
//! Wrapped form: `egd1.<b64url(endpoint "\n" upstream id)>.<b64url(MAC)>`, the MAC over the
//! Backend's label, the endpoint and the upstream id (so a session of one Backend is worthless
//! at another). Only visible ASCII, as the MCP specification requires of session ids.

use std::net::SocketAddr;
use std::path::Path;

use aws_lc_rs::hmac;
use data_encoding::BASE64URL_NOPAD;

/// What every id egressd wraps starts with.
pub const PREFIX: &str = "egd1.";
/// MAC bytes kept (128 bits: forging one takes 2^128 tries).
const MAC_LEN: usize = 16;

/// The key session ids are authenticated with.
pub struct SessionKey {
    key: hmac::Key,
    /// Where it came from, for logs and `/status` (never the key itself).
    pub source: KeySource,
}

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionKey")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// Read from `ProxyConfig.spec.mcp.sessionKeyFile`: shared by replicas, survives restarts.
    File(std::path::PathBuf),
    /// Made at start: sessions stay valid for this process only.
    Generated,
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
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
    pub fn from_file(path: &Path) -> Result<SessionKey, KeyError> {
        let bytes = std::fs::read(path).map_err(|source| KeyError::Read {
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

    fn mac(&self, backend: &str, endpoint: &str, upstream: &str) -> [u8; MAC_LEN] {
        let mut ctx = hmac::Context::with_key(&self.key);
        for part in [backend, "\n", endpoint, "\n", upstream] {
            ctx.update(part.as_bytes());
        }
        let tag = ctx.sign();
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&tag.as_ref()[..MAC_LEN]);
        out
    }

    /// The session id the client gets for `upstream`, issued by `endpoint` of `backend`.
    pub fn wrap(&self, backend: &str, endpoint: SocketAddr, upstream: &str) -> String {
        let endpoint = endpoint.to_string();
        let payload = format!("{endpoint}\n{upstream}");
        let mac = self.mac(backend, &endpoint, upstream);
        format!(
            "{PREFIX}{}.{}",
            BASE64URL_NOPAD.encode(payload.as_bytes()),
            BASE64URL_NOPAD.encode(&mac)
        )
    }

    /// The endpoint and upstream session id inside `wrapped`, if it is one of ours for
    /// `backend` (the MAC is compared in constant time).
    pub fn unwrap(&self, backend: &str, wrapped: &str) -> Result<(SocketAddr, String), Invalid> {
        let rest = wrapped.strip_prefix(PREFIX).ok_or(Invalid::NotOurs)?;
        let (payload, mac) = rest.split_once('.').ok_or(Invalid::Malformed)?;
        let payload = BASE64URL_NOPAD
            .decode(payload.as_bytes())
            .map_err(|_| Invalid::Malformed)?;
        let mac = BASE64URL_NOPAD
            .decode(mac.as_bytes())
            .map_err(|_| Invalid::Malformed)?;
        let payload = String::from_utf8(payload).map_err(|_| Invalid::Malformed)?;
        let (endpoint, upstream) = payload.split_once('\n').ok_or(Invalid::Malformed)?;
        let expected = self.mac(backend, endpoint, upstream);
        if mac.len() != MAC_LEN || !constant_time_eq(&mac, &expected) {
            return Err(Invalid::BadMac);
        }
        let endpoint = endpoint.parse().map_err(|_| Invalid::Malformed)?;
        Ok((endpoint, upstream.to_owned()))
    }
}

/// Why a session id was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// Not issued by egressd (no prefix).
    NotOurs,
    Malformed,
    /// Issued under another key (another deployment, or a key that changed), or tampered with.
    BadMac,
}

impl Invalid {
    pub fn as_str(self) -> &'static str {
        match self {
            Invalid::NotOurs => "not issued by egressd",
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

    fn addr() -> SocketAddr {
        "10.0.0.7:8080".parse().unwrap()
    }

    #[test]
    fn a_wrapped_id_unwraps_to_its_endpoint_and_upstream_id() {
        let key = SessionKey::generate();
        let wrapped = key.wrap("team/mcp", addr(), "abc-123");
        assert!(wrapped.starts_with("egd1."));
        assert!(wrapped.bytes().all(|b| (0x21..=0x7e).contains(&b)));
        assert_eq!(
            key.unwrap("team/mcp", &wrapped),
            Ok((addr(), "abc-123".to_owned()))
        );
    }

    #[test]
    fn another_key_another_backend_or_a_changed_byte_is_refused() {
        let key = SessionKey::generate();
        let wrapped = key.wrap("team/mcp", addr(), "abc-123");
        assert_eq!(
            SessionKey::generate().unwrap("team/mcp", &wrapped),
            Err(Invalid::BadMac)
        );
        assert_eq!(key.unwrap("team/other", &wrapped), Err(Invalid::BadMac));
        let forged = key
            .wrap("team/mcp", "10.0.0.8:8080".parse().unwrap(), "abc-123")
            .split_once('.')
            .map(|(_, rest)| rest.split_once('.').unwrap().0.to_owned())
            .unwrap();
        let mac = wrapped.rsplit_once('.').unwrap().1;
        assert_eq!(
            key.unwrap("team/mcp", &format!("egd1.{forged}.{mac}")),
            Err(Invalid::BadMac),
            "another endpoint under the original MAC"
        );
        assert_eq!(key.unwrap("team/mcp", "abc-123"), Err(Invalid::NotOurs));
        assert_eq!(
            key.unwrap("team/mcp", "egd1.!!.??"),
            Err(Invalid::Malformed)
        );
    }

    #[test]
    fn a_key_file_is_shared_by_replicas() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "0123456789abcdef0123456789abcdef-replicas\n").unwrap();
        let one = SessionKey::from_file(&path).unwrap();
        let two = SessionKey::from_file(&path).unwrap();
        let wrapped = one.wrap("b", addr(), "s");
        assert_eq!(two.unwrap("b", &wrapped), Ok((addr(), "s".to_owned())));
        std::fs::write(&path, "short").unwrap();
        assert!(matches!(
            SessionKey::from_file(&path),
            Err(KeyError::TooShort { len: 5, .. })
        ));
    }
}
