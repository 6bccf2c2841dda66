//! The built `egressd` binary run as a child process, for what only the real process does:
//! file watching, signals, draining and exiting, memory use.
//!
//! [`Egressd`] starts `egressd run` with an ephemeral admin port, captures stderr to a file
//! (printed when a test panics while the process is alive), and kills the child on drop.
//! [`TestConfig`] writes the config these tests share, and [`try_get`] / [`KeepAlive`] are
//! HTTP/1.1 clients that return errors instead of panicking, so load tests can count failures.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::proxy::{ip_backend, Response};
use super::upstream::{empty, BoxBody};

/// The listener of every [`TestConfig`].
pub(crate) const LISTENER: &str = "default/gw/http";
/// The hostname the HTTPRoute of [`TestConfig`] serves.
pub(crate) const HOST: &str = "svc.test";

/// How long the process may take to bind its admin port and load the first config. Generous:
/// the machine is shared with other builds, and a slow start is not what these tests test.
const START_WITHIN: Duration = Duration::from_secs(20);

/// A running `egressd run` child process.
pub(crate) struct Egressd {
    child: Child,
    admin: SocketAddr,
    stderr_path: PathBuf,
    /// Holds the admin address file and the stderr log.
    _scratch: tempfile::TempDir,
}

impl Egressd {
    /// Runs `egressd run --config config_dir` with one worker, watching on, and waits until
    /// `/ready` answers 200.
    pub(crate) async fn spawn(config_dir: &Path) -> Egressd {
        Self::spawn_with(config_dir, &[]).await
    }

    /// As [`Egressd::spawn`], with `extra_args` appended (e.g. `--no-watch`).
    pub(crate) async fn spawn_with(config_dir: &Path, extra_args: &[&str]) -> Egressd {
        Self::spawn_inner(config_dir, extra_args, None).await
    }

    /// As [`Egressd::spawn_with`], with the soft and hard `RLIMIT_NOFILE` lowered to
    /// `open_files` (`ulimit -n` in a shell that then execs egressd).
    pub(crate) async fn spawn_with_open_files(
        config_dir: &Path,
        extra_args: &[&str],
        open_files: u32,
    ) -> Egressd {
        Self::spawn_inner(config_dir, extra_args, Some(open_files)).await
    }

    async fn spawn_inner(
        config_dir: &Path,
        extra_args: &[&str],
        open_files: Option<u32>,
    ) -> Egressd {
        let scratch = tempfile::tempdir().expect("scratch dir");
        let address_file = scratch.path().join("admin-address");
        let stderr_path = scratch.path().join("stderr.log");
        let stderr = File::create(&stderr_path).expect("create stderr log");
        let binary = env!("CARGO_BIN_EXE_egressd");
        let mut command = match open_files {
            None => Command::new(binary),
            Some(n) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(binary);
                sh
            }
        };
        let child = command
            .arg("run")
            .arg("--config")
            .arg(config_dir)
            // One worker unless the test asks for more.
            .args(
                ["--workers", "1"]
                    .iter()
                    .filter(|_| !extra_args.contains(&"--workers")),
            )
            .args(["--admin-address", "127.0.0.1:0"])
            .arg("--admin-address-file")
            .arg(&address_file)
            .args(extra_args)
            // The log level of the test environment must not change what egressd prints.
            .env_remove("RUST_LOG")
            .env_remove("EGRESSD_LOG_LEVEL")
            .stdin(Stdio::null())
            // The access log goes to stdout; the tests read status and metrics instead.
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("spawn the egressd binary");
        let mut egressd = Egressd {
            child,
            admin: SocketAddr::from(([0, 0, 0, 0], 0)),
            stderr_path,
            _scratch: scratch,
        };
        let started = Instant::now();

        // The file is written by rename, so once it exists it is complete.
        let text = super::poll_within(START_WITHIN, || {
            egressd.assert_running("while starting");
            let text = std::fs::read_to_string(&address_file).ok();
            async move { text }
        })
        .await
        .unwrap_or_else(|| egressd.fail("egressd did not write the admin address file in time"));
        egressd.admin = text
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("admin address file holds {text:?}: {e}"));
        let admin = egressd.admin;
        let ready = super::poll_within(START_WITHIN.saturating_sub(started.elapsed()), || {
            egressd.assert_running("while loading its first config");
            async move {
                try_get(admin, "localhost", "/ready")
                    .await
                    .is_ok_and(|r| r.status == http::StatusCode::OK)
            }
        })
        .await;
        if ready.is_none() {
            egressd.fail("egressd did not answer 200 on /ready in time");
        }
        egressd
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// Everything the process wrote to stderr so far (its log).
    pub(crate) fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// `GET path` on the admin server; an error when it cannot be reached.
    pub(crate) async fn admin_get(&self, path: &str) -> anyhow::Result<Response> {
        try_get(self.admin, "localhost", path).await
    }

    /// The `/ready` status, or `None` when the admin server is gone.
    pub(crate) async fn ready(&self) -> Option<http::StatusCode> {
        self.admin_get("/ready").await.ok().map(|r| r.status)
    }

    /// The `/status` document.
    pub(crate) async fn status(&self) -> serde_json::Value {
        let response = self
            .admin_get("/status")
            .await
            .unwrap_or_else(|e| self.fail(&format!("GET /status failed: {e:#}")));
        serde_json::from_slice(&response.body).expect("/status is JSON")
    }

    /// The Prometheus text of `/metrics`.
    pub(crate) async fn metrics(&self) -> String {
        let response = self
            .admin_get("/metrics")
            .await
            .unwrap_or_else(|e| self.fail(&format!("GET /metrics failed: {e:#}")));
        response.text()
    }

    /// The value of the sample `series` (name with labels, exactly as exported, e.g.
    /// `egressd_config_reloads_total{result="failure"}`); 0 when it is not exported yet.
    pub(crate) async fn metric(&self, series: &str) -> f64 {
        let text = self.metrics().await;
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .map_or(0.0, |value| value.trim().parse().expect("numeric sample"))
    }

    /// The bound address of listener `key` as `/status` reports it.
    pub(crate) async fn listener_addr(&self, key: &str) -> SocketAddr {
        let status = self.status().await;
        let listeners = status["listeners"].as_array().cloned().unwrap_or_default();
        let found = listeners.iter().find(|l| l["name"] == key);
        match found.and_then(|l| l["address"].as_str()) {
            Some(address) => address.parse().expect("listener address"),
            None => self.fail(&format!("no listener {key} in /status: {listeners:?}")),
        }
    }

    /// The generation of the config serving now.
    pub(crate) async fn generation(&self) -> u64 {
        self.status().await["generation"]
            .as_u64()
            .expect("/status generation")
    }

    /// Sends signal `name` (`HUP`, `TERM`, ...) with the `kill` command.
    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} {} failed", self.pid());
    }

    /// Waits for the process to exit; panics (with its log) if it is still running after
    /// `within`.
    pub(crate) async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let child = &mut self.child;
        let exited = super::poll_within(within, || {
            let status = child.try_wait().expect("wait for egressd");
            async move { status }
        })
        .await;
        exited.unwrap_or_else(|| {
            self.fail(&format!("egressd did not exit within {within:?} in time"))
        })
    }

    /// Peak resident set size of the process so far (`VmHWM`), in KiB.
    pub(crate) fn peak_rss_kib(&self) -> u64 {
        self.proc_status_kib("VmHWM:")
    }

    /// Resident set size of the process now (`VmRSS`), in KiB.
    pub(crate) fn rss_kib(&self) -> u64 {
        self.proc_status_kib("VmRSS:")
    }

    fn proc_status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc/PID/status");
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/PID/status"))
    }

    fn assert_running(&mut self, when: &str) {
        if let Some(status) = self.child.try_wait().expect("wait for egressd") {
            panic!(
                "egressd exited ({status}) {when}; its stderr:\n{}",
                self.stderr()
            );
        }
    }

    /// Panics with `message` and the process log.
    pub(crate) fn fail(&self, message: &str) -> ! {
        panic!("{message}\negressd stderr:\n{}", self.stderr())
    }
}

impl Drop for Egressd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("egressd stderr (test failed):\n{}", self.stderr());
        }
        // Never leave a child behind, whatever the test did.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The config these tests share: Gateway `gw` with listener `http` on 127.0.0.1, ephemeral
/// port (kept across reloads while the listener is unchanged); one plaintext IP Backend per
/// upstream; and HTTPRoute `svc` sending Host [`HOST`] to one of them, so a reload shows as
/// "requests now reach upstream B".
#[derive(Clone, Debug)]
pub(crate) struct TestConfig {
    backends: Vec<(String, SocketAddr)>,
    route_to: String,
    drain_timeout: String,
}

impl Default for TestConfig {
    fn default() -> Self {
        TestConfig {
            backends: Vec::new(),
            route_to: String::new(),
            drain_timeout: "10s".to_owned(),
        }
    }
}

impl TestConfig {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Adds Backend `name` with the single endpoint `addr`.
    pub(crate) fn backend(mut self, name: &str, addr: SocketAddr) -> Self {
        self.backends.push((name.to_owned(), addr));
        self
    }

    /// Which Backend the route sends [`HOST`] to.
    pub(crate) fn route_to(mut self, name: &str) -> Self {
        self.route_to = name.to_owned();
        self
    }

    /// `ProxyConfig.spec.drain.timeout` (default 10s).
    pub(crate) fn drain_timeout(mut self, timeout: &str) -> Self {
        self.drain_timeout = timeout.to_owned();
        self
    }

    pub(crate) fn yaml(&self) -> String {
        assert!(!self.route_to.is_empty(), "TestConfig without route_to");
        let mut yaml = format!(
            r#"apiVersion: egressd.dev/v1alpha1
kind: ProxyConfig
metadata:
  name: egressd
spec:
  accessLog:
    enabled: false
  drain:
    timeout: {drain}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: gw
spec:
  listeners:
  - name: http
    address: 127.0.0.1
    port: 0
    protocol: HTTP
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: svc
spec:
  hostnames: [{HOST}]
  rules:
  - backendRefs:
    - group: egressd.dev
      kind: Backend
      name: {route}
"#,
            drain = self.drain_timeout,
            route = self.route_to,
        );
        for (name, addr) in &self.backends {
            yaml.push_str(&ip_backend(name, *addr, ""));
        }
        yaml
    }
}

/// `GET path` with `Host: host` on a new connection, read to the end. Errors instead of
/// panicking, so callers can count failures or poll until something answers.
pub(crate) async fn try_get(addr: SocketAddr, host: &str, path: &str) -> anyhow::Result<Response> {
    KeepAlive::connect(addr).await?.get(host, path).await
}

/// One client connection; requests on it reuse the connection.
pub(crate) struct KeepAlive {
    sender: hyper::client::conn::http1::SendRequest<BoxBody>,
    /// The server said `connection: close`: the next request needs a new connection.
    closing: bool,
}

impl KeepAlive {
    pub(crate) async fn connect(addr: SocketAddr) -> anyhow::Result<KeepAlive> {
        let stream = TcpStream::connect(addr).await?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            // Errors surface on the request that was in flight; nothing to do here.
            let _ = connection.await;
        });
        Ok(KeepAlive {
            sender,
            closing: false,
        })
    }

    /// Whether the server announced that it closes the connection after the last response.
    pub(crate) fn closing(&self) -> bool {
        self.closing
    }

    /// Sends `request` and returns the response with its body still streaming.
    pub(crate) async fn send(
        &mut self,
        request: http::Request<BoxBody>,
    ) -> anyhow::Result<http::Response<Incoming>> {
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        self.closing = response
            .headers()
            .get(http::header::CONNECTION)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        Ok(response)
    }

    /// `GET path` with `Host: host`, read to the end.
    pub(crate) async fn get(&mut self, host: &str, path: &str) -> anyhow::Result<Response> {
        let request = http::Request::builder()
            .uri(path)
            .header(http::header::HOST, host)
            .body(empty())?;
        let (parts, body) = self.send(request).await?.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Response {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }
}
