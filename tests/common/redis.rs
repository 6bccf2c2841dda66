//! A real `redis-server` (Debian's package) on 127.0.0.1, for the global rate limits: started on
//! a free port with nothing persisted, killed when dropped; it can be killed, restarted on the
//! same port, frozen (SIGSTOP) and thawed, spoken to in raw RESP, served over TLS with a CA made
//! here, and locked to one ACL user.
//!
//! Self-contained (std, rcgen and tempfile): integration tests reach it as `common::redis`, the
//! unit tests of `src/ratelimit/redis` include this file with `#[path]`.
//!
//! When `redis-server` is not in PATH and the tests run as root, Debian's package is installed
//! once (under a lock, so parallel test processes install it once); otherwise the tests panic
//! saying to install it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// How long a started server may take to answer PING.
const READY_WITHIN: Duration = Duration::from_secs(20);
/// Tries at a free port (another process may take it between our choosing and Redis's bind).
const PORT_TRIES: usize = 5;

/// What to start: plaintext by default.
#[derive(Clone, Debug, Default)]
pub(crate) struct RedisOptions {
    tls: bool,
    acl_user: Option<(String, String)>,
}

impl RedisOptions {
    /// Clients connect with TLS (a certificate for `127.0.0.1` and `localhost` from a CA made
    /// here: [`RedisServer::ca_pem`]).
    pub(crate) fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Only user `name` with `password` may do anything (all commands and keys); the default
    /// user is off, so a client without these credentials gets NOAUTH or WRONGPASS.
    pub(crate) fn with_acl_user(mut self, name: &str, password: &str) -> Self {
        self.acl_user = Some((name.to_owned(), password.to_owned()));
        self
    }

    pub(crate) fn start(self) -> RedisServer {
        RedisServer::start_with(self)
    }
}

/// A running `redis-server`, killed on drop.
pub(crate) struct RedisServer {
    child: Option<Child>,
    /// Where clients connect (TLS when started with TLS).
    port: u16,
    /// Plaintext, for [`RedisServer::command`] and the readiness check: the TLS port's own when
    /// there is no TLS, else a second one (this harness speaks no TLS).
    admin_port: u16,
    args: Vec<String>,
    ca_pem: Option<String>,
    acl_user: Option<(String, String)>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// A plaintext server on a free port.
    pub(crate) fn start() -> RedisServer {
        RedisOptions::default().start()
    }

    /// A TLS server on a free port (and a plaintext admin port).
    pub(crate) fn start_tls() -> RedisServer {
        RedisOptions::default().tls().start()
    }

    pub(crate) fn options() -> RedisOptions {
        RedisOptions::default()
    }

    fn start_with(options: RedisOptions) -> RedisServer {
        let binary = redis_server_binary();
        let dir = tempfile::tempdir().expect("temp dir for redis-server");
        let mut server = RedisServer {
            child: None,
            port: 0,
            admin_port: 0,
            args: Vec::new(),
            ca_pem: options.tls.then(|| write_certificates(dir.path())),
            acl_user: options.acl_user.clone(),
            dir,
        };
        for _ in 0..PORT_TRIES {
            server.port = free_port();
            server.admin_port = if options.tls {
                free_port()
            } else {
                server.port
            };
            server.args = arguments(server.dir.path(), server.port, server.admin_port, &options);
            if server.spawn(binary) {
                return server;
            }
        }
        panic!("redis-server did not start on a free port in {PORT_TRIES} tries")
    }

    /// Where clients connect.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub(crate) fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The CA certificate (PEM) of a TLS server's certificate.
    pub(crate) fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// The process id, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, and waits for the process to end.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server (if it runs) and starts it again on the same port with the same
    /// arguments (nothing persisted: its keys are gone); returns once it answers PING.
    pub(crate) fn restart(&mut self) {
        self.kill();
        let binary = redis_server_binary();
        // The port was ours a moment ago; a short-lived bind race is retried.
        for _ in 0..PORT_TRIES {
            if self.spawn(binary) {
                return;
            }
        }
        panic!("redis-server did not start again on port {}", self.port)
    }

    /// Freezes the process (SIGSTOP): connections stay open, nothing answers.
    pub(crate) fn stop(&self) {
        self.signal("STOP");
    }

    /// Thaws a frozen process (SIGCONT).
    pub(crate) fn cont(&self) {
        self.signal("CONT");
    }

    /// One command in raw RESP on the plaintext port (authenticated as the ACL user if there is
    /// one): simple strings and bulk strings as they are, integers in decimal, errors with a
    /// leading `-`, nil as `(nil)`, arrays one element per line.
    pub(crate) fn command(&self, args: &[&str]) -> String {
        let mut stream =
            TcpStream::connect((Ipv4Addr::LOCALHOST, self.admin_port)).expect("connect to redis");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        let mut request = Vec::new();
        if let Some((name, password)) = &self.acl_user {
            request.extend(encode(&["AUTH", name, password]));
        }
        request.extend(encode(args));
        stream.write_all(&request).expect("send to redis");
        let mut reader = BufReader::new(stream);
        if self.acl_user.is_some() {
            let auth = read_reply(&mut reader);
            assert_eq!(auth, "OK", "AUTH of the harness's ACL user");
        }
        read_reply(&mut reader)
    }

    /// Starts the process and waits until it answers PING; false when it exited first (its
    /// port was taken).
    fn spawn(&mut self, binary: &Path) -> bool {
        let log = std::fs::File::create(self.dir.path().join("redis.log")).expect("redis log");
        let child = Command::new(binary)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("redis log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("run {}: {e}", binary.display()));
        self.child = Some(child);
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                let log = std::fs::read_to_string(self.dir.path().join("redis.log"));
                eprintln!(
                    "redis-server exited ({status}): {}",
                    log.unwrap_or_default()
                );
                return false;
            }
            if self.answers_ping() {
                return true;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer PING within {READY_WITHIN:?}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn answers_ping(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, self.admin_port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        let mut request = Vec::new();
        if let Some((name, password)) = &self.acl_user {
            request.extend(encode(&["AUTH", name, password]));
        }
        request.extend(encode(&["PING"]));
        if stream.write_all(&request).is_err() {
            return false;
        }
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        // The last line read is PING's answer (after AUTH's, when there is a user).
        for _ in 0..=usize::from(self.acl_user.is_some()) {
            line.clear();
            if reader.read_line(&mut line).is_err() {
                return false;
            }
        }
        line.trim_end() == "+PONG"
    }

    fn signal(&self, signal: &str) {
        let pid = self.pid().expect("redis-server runs");
        let status = Command::new("sh")
            .args(["-c", &format!("kill -{signal} {pid}")])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {pid}");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The command line: nothing saved, nothing daemonized, listening on 127.0.0.1 only.
fn arguments(dir: &Path, port: u16, admin_port: u16, options: &RedisOptions) -> Vec<String> {
    let mut args: Vec<String> = vec!["--port".into(), admin_port.to_string()];
    if options.tls {
        let file = |name: &str| dir.join(name).display().to_string();
        args.extend([
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            file("server.pem"),
            "--tls-key-file".into(),
            file("server.key"),
            "--tls-ca-cert-file".into(),
            file("ca.pem"),
            "--tls-auth-clients".into(),
            "no".into(),
        ]);
    }
    args.extend(
        [
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
        ]
        .map(String::from),
    );
    args.push(dir.display().to_string());
    if let Some((name, password)) = &options.acl_user {
        args.extend(["--user", "default", "off"].map(String::from));
        args.extend([
            "--user".into(),
            name.clone(),
            "on".into(),
            format!(">{password}"),
        ]);
        args.extend(["~*", "&*", "+@all"].map(String::from));
    }
    args
}

/// A port free on 127.0.0.1 a moment ago.
fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// `redis-server` from PATH, installed from Debian's package first when missing and root.
fn redis_server_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        if let Some(found) = in_path("redis-server") {
            return found;
        }
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0");
        if root {
            install_redis_server();
        }
        in_path("redis-server").unwrap_or_else(|| {
            panic!(
                "redis-server is not installed: the global rate limit tests need Debian's \
                 (`apt-get install redis-server`)"
            )
        })
    })
}

fn in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|file| file.is_file())
}

/// `apt-get install redis-server` under a lock file (`flock`), so that test processes running
/// at once install it once; `apt-get update` only when the install fails without it.
fn install_redis_server() {
    let script = "command -v redis-server >/dev/null \
        || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }";
    let lock = std::env::temp_dir().join("egressd-redis-server-install.lock");
    let status = Command::new("flock")
        .arg(&lock)
        .args(["sh", "-c", script])
        .status();
    if !matches!(status, Ok(s) if s.success()) {
        eprintln!("installing Debian's redis-server failed: {status:?}");
    }
}

/// A CA and a server certificate for 127.0.0.1 and localhost in `dir` (ca.pem, server.pem,
/// server.key); returns the CA's PEM.
fn write_certificates(dir: &Path) -> String {
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "egressd test Redis CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().expect("CA key");
    let issuer = CertifiedIssuer::self_signed(ca, ca_key).expect("self-signed CA");

    let mut leaf = CertificateParams::new(vec!["localhost".to_owned()]).expect("leaf params");
    leaf.subject_alt_names
        .push(SanType::IpAddress(Ipv4Addr::LOCALHOST.into()));
    leaf.distinguished_name
        .push(DnType::CommonName, "localhost");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    let leaf_key = KeyPair::generate().expect("leaf key");
    let leaf = leaf.signed_by(&leaf_key, &issuer).expect("sign leaf");

    let ca_pem = issuer.pem();
    std::fs::write(dir.join("ca.pem"), &ca_pem).expect("write CA");
    std::fs::write(dir.join("server.pem"), leaf.pem()).expect("write certificate");
    std::fs::write(dir.join("server.key"), leaf_key.serialize_pem()).expect("write key");
    ca_pem
}

/// A command as a RESP array of bulk strings.
fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend(format!("${}\r\n", arg.len()).into_bytes());
        out.extend(arg.as_bytes());
        out.extend(b"\r\n");
    }
    out
}

/// One RESP2 reply, flattened as [`RedisServer::command`] says.
fn read_reply(reader: &mut impl BufRead) -> String {
    let mut line = String::new();
    reader.read_line(&mut line).expect("read from redis");
    let line = line.trim_end_matches("\r\n");
    let (kind, rest) = line.split_at(1);
    match kind {
        "+" | ":" => rest.to_owned(),
        "-" => line.to_owned(),
        "$" => {
            let Ok(len) = usize::try_from(rest.parse::<i64>().expect("bulk length")) else {
                return "(nil)".to_owned();
            };
            let mut data = vec![0; len + 2];
            std::io::Read::read_exact(reader, &mut data).expect("read bulk string");
            data.truncate(len);
            String::from_utf8_lossy(&data).into_owned()
        }
        "*" => {
            let Ok(count) = usize::try_from(rest.parse::<i64>().expect("array length")) else {
                return "(nil)".to_owned();
            };
            (0..count)
                .map(|_| read_reply(reader))
                .collect::<Vec<_>>()
                .join("\n")
        }
        _ => panic!("unexpected RESP reply {line:?}"),
    }
}
