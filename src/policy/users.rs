//! Proxy users: `Proxy-Authorization: Basic` credentials of forward-proxy clients, checked
//! against a file of salted password hashes (`ProxyConfig.spec.clientPolicy.proxyUsers`).
//!
//! The file holds `user:hash` lines: bcrypt (`htpasswd -B`: `$2y$`, `$2b$`, `$2a$`) or
//! SHA-crypt (`openssl passwd -5` / `-6`: `$5$`, `$6$`); blank lines and `#` comments are
//! skipped. Hashes are slow on purpose (bcrypt at cost 10 is tens of milliseconds), so:
//! checks run on the blocking pool, at most [`MAX_CONCURRENT_CHECKS`] at once (a client
//! guessing passwords cannot take the workers), and credentials that passed are remembered
//! as a SHA-256 of user and password (at most [`MAX_REMEMBERED`]), so a client sending the
//! same header on every request pays the hash once. A new file is a new table and forgets
//! them all.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use http::HeaderValue;
use tokio::sync::Semaphore;

/// Password checks running at once; more wait.
pub(crate) const MAX_CONCURRENT_CHECKS: usize = 2;
/// Checks one client address may have running or waiting; more are refused at once (429), so
/// a client guessing passwords queues at most this many ahead of anyone else.
pub(crate) const MAX_PENDING_PER_SOURCE: usize = 2;
/// Checks running or waiting over every client address; more are refused at once (429).
pub(crate) const MAX_PENDING: usize = 64;
/// Credentials remembered as checked; when full, the memory starts over.
pub(crate) const MAX_REMEMBERED: usize = 1024;
/// The longest `Proxy-Authorization` value looked at (a user and password of 1 KiB each).
const MAX_HEADER: usize = 2800;
/// Lines of the users file at most.
pub(crate) const MAX_USERS: usize = 10_000;

/// A hash from the users file.
#[derive(Clone)]
enum Hash {
    Bcrypt(Box<str>),
    Sha256Crypt(Box<str>),
    Sha512Crypt(Box<str>),
}

impl Hash {
    fn parse(text: &str) -> Option<Hash> {
        let text: Box<str> = text.into();
        if text.starts_with("$2y$") || text.starts_with("$2b$") || text.starts_with("$2a$") {
            Some(Hash::Bcrypt(text))
        } else if text.starts_with("$5$") {
            Some(Hash::Sha256Crypt(text))
        } else if text.starts_with("$6$") {
            Some(Hash::Sha512Crypt(text))
        } else {
            None
        }
    }

    fn verify(&self, password: &str) -> bool {
        match self {
            Hash::Bcrypt(h) => bcrypt::verify(password, h).unwrap_or(false),
            Hash::Sha256Crypt(h) => sha_crypt::sha256_check(password, h).is_ok(),
            Hash::Sha512Crypt(h) => sha_crypt::sha512_check(password, h).is_ok(),
        }
    }
}

/// A line of the users file that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub(crate) struct UsersFileError {
    pub(crate) line: usize,
    pub(crate) message: String,
}

/// Why a request's credentials were not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rejected {
    /// No `Proxy-Authorization`, and `required: true`.
    Missing,
    /// Not `Basic` with base64 `user:password`.
    Malformed,
    /// Unknown user or wrong password.
    Wrong,
    /// Too many checks pending for this client address, or for all (see [`MAX_PENDING`]).
    Busy,
}

impl Rejected {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Rejected::Missing => "no Proxy-Authorization credentials",
            Rejected::Malformed => "Proxy-Authorization is not Basic base64(user:password)",
            Rejected::Wrong => "unknown user or wrong password",
            Rejected::Busy => "too many password checks pending for this client; retry later",
        }
    }
}

/// The users of one version of the file.
pub(crate) struct ProxyUsers {
    users: HashMap<Box<str>, Hash>,
    pub(crate) required: bool,
    /// `Basic realm="…"`, for 407 replies.
    pub(crate) challenge: HeaderValue,
    remembered: Mutex<HashSet<[u8; 32]>>,
    checks: Arc<Semaphore>,
    /// Checks running or waiting, by client address (entries only while some are).
    pending: Arc<Mutex<HashMap<IpAddr, usize>>>,
    /// The hash an unknown user's password is checked against: a real user's, so that an
    /// unknown user costs what a known one does (no user enumeration by timing).
    decoy: Option<Hash>,
}

impl std::fmt::Debug for ProxyUsers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the hashes: this reaches logs and dumps.
        f.debug_struct("ProxyUsers")
            .field("users", &self.users.len())
            .field("required", &self.required)
            .finish()
    }
}

impl ProxyUsers {
    /// Parses the file's text. Every bad line is reported; none is used then.
    pub(crate) fn parse(
        text: &str,
        required: bool,
        realm: &str,
    ) -> Result<ProxyUsers, Vec<UsersFileError>> {
        let mut users = HashMap::new();
        let mut errors = Vec::new();
        let mut decoy = None;
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut error = |message: String| {
                errors.push(UsersFileError {
                    line: line_no,
                    message,
                })
            };
            let Some((user, hash)) = line.split_once(':') else {
                error("expected `user:hash`".to_owned());
                continue;
            };
            if user.is_empty() {
                error("empty user name".to_owned());
                continue;
            }
            let Some(hash) = Hash::parse(hash) else {
                // The hash itself is never shown: it is a secret too.
                error(format!(
                    "the hash of user `{user}` is not bcrypt ($2y$, htpasswd -B) or SHA-crypt ($5$/$6$, openssl passwd -5)"
                ));
                continue;
            };
            decoy.get_or_insert_with(|| hash.clone());
            if users.insert(user.into(), hash).is_some() {
                error(format!("user `{user}` is listed twice"));
            }
            if users.len() > MAX_USERS {
                error(format!("more than {MAX_USERS} users"));
                break;
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let realm: String = realm
            .chars()
            .filter(|c| c.is_ascii_graphic() && *c != '"' && *c != '\\' || *c == ' ')
            .collect();
        let challenge = HeaderValue::from_str(&format!("Basic realm=\"{realm}\""))
            .unwrap_or_else(|_| HeaderValue::from_static("Basic realm=\"egressd\""));
        Ok(ProxyUsers {
            users,
            required,
            challenge,
            remembered: Mutex::new(HashSet::new()),
            checks: Arc::new(Semaphore::new(MAX_CONCURRENT_CHECKS)),
            pending: Arc::default(),
            decoy,
        })
    }

    /// The user a request authenticated as: `Ok(None)` without credentials when they are
    /// not required.
    pub(crate) async fn authenticate(
        self: &Arc<Self>,
        header: Option<&HeaderValue>,
        source: IpAddr,
    ) -> Result<Option<Box<str>>, Rejected> {
        let Some(header) = header else {
            return if self.required {
                Err(Rejected::Missing)
            } else {
                Ok(None)
            };
        };
        let (user, password) = basic_credentials(header).ok_or(Rejected::Malformed)?;
        let key = remember_key(&user, &password);
        if self.lock_remembered().contains(&key) {
            return Ok(Some(user.into()));
        }
        // An unknown user costs what a wrong password costs: no timing tells them apart.
        let hash = self.users.get(user.as_str()).cloned();
        let _pending = Pending::enter(&self.pending, source).ok_or(Rejected::Busy)?;
        let decoy = self.decoy.clone();
        let permit = self
            .checks
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Rejected::Wrong)?;
        let ok = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            match hash {
                Some(hash) => hash.verify(&password),
                None => {
                    decoy.unwrap_or_else(dummy_hash).verify(&password);
                    false
                }
            }
        })
        .await
        .unwrap_or(false);
        if !ok {
            return Err(Rejected::Wrong);
        }
        let mut remembered = self.lock_remembered();
        if remembered.len() >= MAX_REMEMBERED {
            remembered.clear();
        }
        remembered.insert(key);
        Ok(Some(user.into()))
    }

    fn lock_remembered(&self) -> std::sync::MutexGuard<'_, HashSet<[u8; 32]>> {
        self.remembered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A check counted against its client address while it runs or waits.
struct Pending {
    table: Arc<Mutex<HashMap<IpAddr, usize>>>,
    source: IpAddr,
}

impl Pending {
    /// `None` when `source` has [`MAX_PENDING_PER_SOURCE`] checks pending, or all sources
    /// [`MAX_PENDING`] (the table has at most that many entries).
    fn enter(table: &Arc<Mutex<HashMap<IpAddr, usize>>>, source: IpAddr) -> Option<Pending> {
        let mut pending = lock(table);
        let total: usize = pending.values().sum();
        let mine = pending.get(&source).copied().unwrap_or(0);
        if mine >= MAX_PENDING_PER_SOURCE || total >= MAX_PENDING {
            return None;
        }
        pending.insert(source, mine + 1);
        Some(Pending {
            table: table.clone(),
            source,
        })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut pending = lock(&self.table);
        if let Some(n) = pending.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                pending.remove(&self.source);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A SHA-crypt hash of nothing anyone knows, checked for unknown users when the file has none.
fn dummy_hash() -> Hash {
    Hash::Sha256Crypt("$5$egressd.dummy$Tz7ZcQkuQ1h6zbbeO4T1lYIoVPXpMmI6X2BhoQ6TOZ0".into())
}

/// SHA-256 of user and password: what is remembered of credentials that passed.
fn remember_key(user: &str, password: &str) -> [u8; 32] {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    ctx.update(user.as_bytes());
    ctx.update(&[0]);
    ctx.update(password.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(ctx.finish().as_ref());
    key
}

/// `Basic base64(user:password)` → user and password.
fn basic_credentials(header: &HeaderValue) -> Option<(String, String)> {
    let bytes = header.as_bytes();
    if bytes.len() > MAX_HEADER {
        return None;
    }
    let text = std::str::from_utf8(bytes).ok()?.trim();
    let (scheme, encoded) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = data_encoding::BASE64
        .decode(encoded.trim().as_bytes())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    if user.is_empty() {
        return None;
    }
    Some((user.to_owned(), password.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn basic(user_pass: &str) -> HeaderValue {
        let encoded = data_encoding::BASE64.encode(user_pass.as_bytes());
        HeaderValue::from_str(&format!("Basic {encoded}")).unwrap()
    }

    #[tokio::test]
    async fn users_of_both_hash_families_authenticate() {
        let bcrypt = bcrypt::hash("s3cret", 4).unwrap();
        let sha = sha_crypt::sha256_simple("hunter2", &sha_crypt::Sha256Params::new(1000).unwrap())
            .unwrap();
        let text = format!("# users\nalice:{bcrypt}\n\nbob:{sha}\n");
        let users = Arc::new(ProxyUsers::parse(&text, false, "egressd").unwrap());
        let ok = users
            .authenticate(Some(&basic("alice:s3cret")), LOCAL)
            .await;
        assert_eq!(ok, Ok(Some("alice".into())));
        // Remembered: the second check finds it without hashing.
        assert_eq!(
            users
                .authenticate(Some(&basic("alice:s3cret")), LOCAL)
                .await,
            Ok(Some("alice".into()))
        );
        assert_eq!(
            users.authenticate(Some(&basic("bob:hunter2")), LOCAL).await,
            Ok(Some("bob".into()))
        );
        for wrong in ["alice:nope", "bob:s3cret", "carol:hunter2"] {
            assert_eq!(
                users.authenticate(Some(&basic(wrong)), LOCAL).await,
                Err(Rejected::Wrong),
                "{wrong}"
            );
        }
        assert_eq!(users.authenticate(None, LOCAL).await, Ok(None));
        for malformed in ["Bearer abc", "Basic !!!", "Basic"] {
            let header = HeaderValue::from_static(malformed);
            assert_eq!(
                users.authenticate(Some(&header), LOCAL).await,
                Err(Rejected::Malformed),
                "{malformed}"
            );
        }
        let required = Arc::new(ProxyUsers::parse(&text, true, "egressd").unwrap());
        assert_eq!(
            required.authenticate(None, LOCAL).await,
            Err(Rejected::Missing)
        );
        assert_eq!(required.challenge, "Basic realm=\"egressd\"");
    }

    #[tokio::test]
    async fn hashes_openssl_passwd_writes_are_understood() {
        // The example users file (config/examples/central-gateway/proxy-users), written by
        // `openssl passwd -5 -salt examplesalt1 payments-example-password`.
        let text = include_str!("../../config/examples/central-gateway/proxy-users");
        let users = Arc::new(ProxyUsers::parse(text, true, "egressd").unwrap());
        let ok = users
            .authenticate(
                Some(&basic("payments-batch:payments-example-password")),
                LOCAL,
            )
            .await;
        assert_eq!(ok, Ok(Some("payments-batch".into())));
        let wrong = users
            .authenticate(
                Some(&basic("payments-batch:search-example-password")),
                LOCAL,
            )
            .await;
        assert_eq!(wrong, Err(Rejected::Wrong));
    }

    #[test]
    fn bad_lines_are_named_without_their_hashes() {
        let errors =
            ProxyUsers::parse("alice\nbob:plaintext-password\n:$5$x$y\n", false, "r").unwrap_err();
        let lines: Vec<usize> = errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, [1, 2, 3]);
        assert!(
            !errors[1].message.contains("plaintext-password"),
            "{}",
            errors[1]
        );
    }

    #[test]
    fn a_source_may_have_two_checks_pending_and_all_sources_a_bounded_number() {
        let table = Arc::default();
        let (a, b) = (LOCAL, IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2)));
        let first = Pending::enter(&table, a).expect("first check");
        let _second = Pending::enter(&table, a).expect("second check");
        assert!(
            Pending::enter(&table, a).is_none(),
            "a third check of one source waits"
        );
        // Another source is not queued behind the first one's guesses.
        let other = Pending::enter(&table, b).expect("another source's check");
        drop(first);
        let _again = Pending::enter(&table, a).expect("a slot freed");
        drop(other);
        assert_eq!(
            lock(&table).get(&b),
            None,
            "no entry left for a source with none pending"
        );
        // Over every source: at most MAX_PENDING.
        let many: Vec<Pending> = (0..MAX_PENDING as u32 - 2)
            .filter_map(|i| {
                Pending::enter(
                    &table,
                    IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i)),
                )
            })
            .collect();
        assert_eq!(many.len(), MAX_PENDING - 2);
        assert!(Pending::enter(&table, IpAddr::V4(std::net::Ipv4Addr::new(10, 9, 9, 9))).is_none());
    }

    #[test]
    fn an_unknown_user_is_checked_against_a_real_users_hash() {
        let bcrypt = bcrypt::hash("s3cret", 4).unwrap();
        let users = ProxyUsers::parse(&format!("alice:{bcrypt}\n"), true, "egressd").unwrap();
        // The same kind and cost as alice's: an unknown name takes as long as a wrong password.
        assert!(matches!(users.decoy, Some(Hash::Bcrypt(ref h)) if **h == *bcrypt));
    }
}
