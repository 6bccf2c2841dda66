//! Reloading the real binary: every way a config file can change on disk (in-place edit,
//! editor rename, Kubernetes ConfigMap symlink swap), SIGHUP, rejected configs, and reloads
//! under load that must not lose a single request.
//!
//! Each test routes Host `svc.test` to upstream `a`, changes the config to route it to
//! upstream `b`, and expects requests to reach `b` (and the generation to rise) within 2 s.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use common::binary::{try_get, Egressd, KeepAlive, TestConfig, HOST, LISTENER};
use common::upstream::Upstream;
use common::{eventually, poll_within};

/// How soon a change on disk (or a SIGHUP) must be serving.
const RELOAD_WITHIN: Duration = Duration::from_secs(2);
const CONFIG_FILE: &str = "egressd.yaml";

/// Two upstreams, a config dir and egressd serving it with the route to `a`.
struct Rig {
    a: Upstream,
    b: Upstream,
    dir: tempfile::TempDir,
    egressd: Egressd,
    listener: SocketAddr,
}

impl Rig {
    /// Writes the config routing to `a` with `write` (which decides the directory layout),
    /// starts egressd with `extra_args` and checks that `a` answers.
    async fn start(extra_args: &[&str], write: impl FnOnce(&Path, &str)) -> Rig {
        let a = Upstream::start("a").await;
        let b = Upstream::start("b").await;
        let dir = tempfile::tempdir().expect("config dir");
        write(dir.path(), &config(&a, &b, "a"));
        let egressd = Egressd::spawn_with(dir.path(), extra_args).await;
        let listener = egressd.listener_addr(LISTENER).await;
        let rig = Rig {
            a,
            b,
            dir,
            egressd,
            listener,
        };
        assert_eq!(rig.answered_by().await.as_deref(), Ok("a"));
        rig
    }

    /// Plain layout: `egressd.yaml` in the config dir.
    async fn plain(extra_args: &[&str]) -> Rig {
        Rig::start(extra_args, |dir, yaml| {
            std::fs::write(dir.join(CONFIG_FILE), yaml).expect("write config");
        })
        .await
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join(CONFIG_FILE)
    }

    /// The config routing to `to` (`a` or `b`).
    fn config(&self, to: &str) -> String {
        config(&self.a, &self.b, to)
    }

    /// Which upstream a request on a new connection reached, or what went wrong.
    async fn answered_by(&self) -> Result<String, String> {
        answered_by(try_get(self.listener, HOST, "/").await)
    }

    /// Polls until the generation is above `since` and requests reach `upstream`; panics with
    /// the last reload result if that does not happen within [`RELOAD_WITHIN`]. Returns the new
    /// generation.
    async fn expect_reload_to(&self, since: u64, upstream: &str) -> u64 {
        let rig = self;
        let reloaded = poll_within(RELOAD_WITHIN, || async move {
            rig.egressd.generation().await > since
                && rig.answered_by().await.as_deref() == Ok(upstream)
        })
        .await
        .is_some();
        if !reloaded {
            let status = self.egressd.status().await;
            self.egressd.fail(&format!(
                "no reload to `{upstream}` within {RELOAD_WITHIN:?} (generation was {since}); \
                 last reload: {:#}",
                status["lastReload"]
            ));
        }
        // The listener was unchanged, so it kept its ephemeral port.
        assert_eq!(self.egressd.listener_addr(LISTENER).await, self.listener);
        self.egressd.generation().await
    }
}

fn config(a: &Upstream, b: &Upstream, to: &str) -> String {
    TestConfig::new()
        .backend("a", a.addr)
        .backend("b", b.addr)
        .route_to(to)
        .yaml()
}

fn answered_by(response: anyhow::Result<common::proxy::Response>) -> Result<String, String> {
    match response {
        Ok(r) if r.status == http::StatusCode::OK => r
            .upstream()
            .map(str::to_owned)
            .ok_or_else(|| format!("200 without x-upstream: {:?}", r.text())),
        Ok(r) => Err(format!(
            "{} {:?}: {}",
            r.status,
            r.error_code(),
            r.text().trim_end()
        )),
        Err(e) => Err(format!("{e:#}")),
    }
}

/// Replaces `path` the way editors and config management do: write a new file beside it,
/// then rename it over the old one (a new inode; readers never see a partial file).
fn replace_by_rename(path: &Path, text: &str) {
    let name = path.file_name().unwrap().to_string_lossy();
    // Hidden, so the loader would skip it even if a reload ran before the rename.
    let tmp = path.with_file_name(format!(".{name}.new"));
    std::fs::write(&tmp, text).expect("write new config");
    std::fs::rename(&tmp, path).expect("rename over config");
}

#[tokio::test]
async fn edit_in_place_reloads_within_two_seconds() {
    let rig = Rig::plain(&[]).await;
    let generation = rig.egressd.generation().await;
    let inode = std::fs::metadata(rig.config_path()).unwrap().ino();

    // Truncate and rewrite the same file (same inode), as `echo > file` does.
    std::fs::write(rig.config_path(), rig.config("b")).expect("rewrite config");
    assert_eq!(std::fs::metadata(rig.config_path()).unwrap().ino(), inode);

    rig.expect_reload_to(generation, "b").await;
}

#[tokio::test]
async fn rename_over_config_reloads_within_two_seconds() {
    let rig = Rig::plain(&[]).await;
    let generation = rig.egressd.generation().await;
    let inode = std::fs::metadata(rig.config_path()).unwrap().ino();

    replace_by_rename(&rig.config_path(), &rig.config("b"));
    assert_ne!(std::fs::metadata(rig.config_path()).unwrap().ino(), inode);

    rig.expect_reload_to(generation, "b").await;
}

#[tokio::test]
async fn configmap_data_symlink_swap_reloads_within_two_seconds() {
    // The kubelet's AtomicWriter layout: a timestamped directory holds the files, `..data`
    // points at it, and each key is a symlink through `..data`.
    const FIRST: &str = "..2026_01_01_00_00_00.000000001";
    const SECOND: &str = "..2026_01_01_00_01_00.000000002";
    let rig = Rig::start(&[], |dir, yaml| {
        std::fs::create_dir(dir.join(FIRST)).unwrap();
        std::fs::write(dir.join(FIRST).join(CONFIG_FILE), yaml).unwrap();
        std::os::unix::fs::symlink(FIRST, dir.join("..data")).unwrap();
        std::os::unix::fs::symlink(format!("..data/{CONFIG_FILE}"), dir.join(CONFIG_FILE)).unwrap();
    })
    .await;
    let generation = rig.egressd.generation().await;

    // A new revision: new directory, `..data_tmp` pointing at it, renamed over `..data`
    // (atomic), old directory removed. The `egressd.yaml` symlink itself never changes.
    let dir = rig.dir.path();
    std::fs::create_dir(dir.join(SECOND)).unwrap();
    std::fs::write(dir.join(SECOND).join(CONFIG_FILE), rig.config("b")).unwrap();
    std::os::unix::fs::symlink(SECOND, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    std::fs::remove_dir_all(dir.join(FIRST)).unwrap();

    rig.expect_reload_to(generation, "b").await;
}

#[tokio::test]
async fn sighup_reloads_when_watching_is_off() {
    let rig = Rig::plain(&["--no-watch"]).await;
    let generation = rig.egressd.generation().await;

    replace_by_rename(&rig.config_path(), &rig.config("b"));
    // Without the watcher nothing happens on its own: a watcher would have reloaded well
    // within a second (its debounce is 250 ms).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(rig.egressd.generation().await, generation);
    assert_eq!(rig.answered_by().await.as_deref(), Ok("a"));

    rig.egressd.signal("HUP");
    rig.expect_reload_to(generation, "b").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_without_changes_keeps_serving_every_request() {
    let rig = Rig::plain(&[]).await;
    let load = Load::start(rig.listener, 2, 2);
    load.wait_for_requests(&rig.egressd).await;

    for _ in 0..5 {
        // A forced reload counts as a success even when the generation does not matter.
        let succeeded = rig.egressd.status().await["lastReload"]["succeeded"]
            .as_u64()
            .unwrap();
        rig.egressd.signal("HUP");
        let egressd = &rig.egressd;
        eventually(
            &format!("SIGHUP did not reload within {RELOAD_WITHIN:?}"),
            RELOAD_WITHIN,
            || async move {
                egressd.status().await["lastReload"]["succeeded"]
                    .as_u64()
                    .unwrap()
                    > succeeded
            },
        )
        .await;
        // Requests keep flowing between reloads, so each reload happens under load.
        load.wait_for_requests(&rig.egressd).await;
    }

    let tally = load.finish().await;
    tally.assert_no_failures();
    assert_eq!(tally.answered.keys().collect::<Vec<_>>(), ["a"]);
    let status = rig.egressd.status().await;
    assert_eq!(status["lastReload"]["result"], "success");
    // How long the reload took, from reading the files to serving (a few milliseconds here).
    assert!(
        status["lastReload"]["durationMs"].as_u64().is_some(),
        "{}",
        status["lastReload"]
    );
    assert_eq!(rig.egressd.listener_addr(LISTENER).await, rig.listener);
}

/// An invalid edit keeps the old config serving and says where the error is; fixing the file
/// reloads. `break_config` turns the `b` config into an invalid one and returns the line the
/// error must be reported on, when the test knows it.
async fn check_rejected_edit(break_config: impl FnOnce(&str) -> (String, Option<usize>)) {
    const FAILURES: &str = r#"egressd_config_reloads_total{result="failure"}"#;
    let rig = Rig::plain(&[]).await;
    let generation = rig.egressd.generation().await;
    let failed = rig.egressd.status().await["lastReload"]["failed"]
        .as_u64()
        .unwrap();
    let failures_metric = rig.egressd.metric(FAILURES).await;

    let (broken, error_line) = break_config(&rig.config("b"));
    replace_by_rename(&rig.config_path(), &broken);

    // The failed reload attempt is the signal that the edit was seen.
    let egressd = &rig.egressd;
    let attempted = poll_within(RELOAD_WITHIN, || async move {
        egressd.status().await["lastReload"]["failed"]
            .as_u64()
            .unwrap()
            > failed
    })
    .await
    .is_some();
    if !attempted {
        egressd.fail("the invalid edit was not reported as a failed reload within 2 s");
    }
    let status = rig.egressd.status().await;
    let last = &status["lastReload"];
    assert_eq!(last["result"], "failure", "{last:#}");
    assert_eq!(status["generation"].as_u64(), Some(generation), "{last:#}");

    // Every error names file:line:column, as `egressd validate` prints it.
    let messages: Vec<&str> = last["messages"]
        .as_array()
        .expect("lastReload.messages")
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    let positioned = regex::Regex::new(r"egressd\.yaml:(\d+):(\d+): error").unwrap();
    let lines: Vec<usize> = messages
        .iter()
        .filter_map(|m| positioned.captures(m))
        .map(|c| c[1].parse().unwrap())
        .collect();
    println!("rejected as expected: {messages:?}");
    assert!(!lines.is_empty(), "no file:line:column in {messages:?}");
    if let Some(line) = error_line {
        assert!(
            lines.contains(&line),
            "no error on line {line}: {messages:?}"
        );
    }

    assert!(rig.egressd.metric(FAILURES).await > failures_metric);
    // The old config still serves.
    assert_eq!(rig.answered_by().await.as_deref(), Ok("a"));

    // Fixing the file reloads.
    replace_by_rename(&rig.config_path(), &rig.config("b"));
    rig.expect_reload_to(generation, "b").await;
    assert_eq!(
        rig.egressd.status().await["lastReload"]["result"],
        "success"
    );
}

#[tokio::test]
async fn unknown_field_is_rejected_with_its_position_and_old_config_keeps_serving() {
    check_rejected_edit(|yaml| {
        let broken = yaml.replacen("  hostnames:", "  hostnamez: [oops]\n  hostnames:", 1);
        assert_ne!(broken, yaml, "the config has no hostnames to break");
        // 1-based line of the unknown field.
        let line = broken
            .lines()
            .position(|l| l.contains("hostnamez"))
            .unwrap()
            + 1;
        (broken, Some(line))
    })
    .await;
}

#[tokio::test]
async fn yaml_syntax_error_is_rejected_with_its_position_and_old_config_keeps_serving() {
    check_rejected_edit(|yaml| {
        // An unclosed flow sequence: where the parser notices depends on the parser.
        let broken = yaml.replacen("hostnames: [svc.test]", "hostnames: [svc.test", 1);
        assert_ne!(broken, yaml, "the config has no hostnames to break");
        (broken, None)
    })
    .await;
}

/// Waits until the failed-reload count rises above `failed`, returning `/status`.
async fn wait_for_failed_reload(egressd: &Egressd, failed: u64, what: &str) -> serde_json::Value {
    let refused = poll_within(RELOAD_WITHIN, || async move {
        egressd.status().await["lastReload"]["failed"]
            .as_u64()
            .unwrap()
            > failed
    })
    .await
    .is_some();
    if !refused {
        egressd.fail(&format!("{what} was not refused within {RELOAD_WITHIN:?}"));
    }
    egressd.status().await
}

fn messages(status: &serde_json::Value) -> Vec<String> {
    status["lastReload"]["messages"]
        .as_array()
        .expect("lastReload.messages")
        .iter()
        .filter_map(|m| m.as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn emptying_the_config_file_is_refused_and_the_last_good_config_keeps_serving() {
    let rig = Rig::plain(&[]).await;
    let generation = rig.egressd.generation().await;
    let failed = rig.egressd.status().await["lastReload"]["failed"]
        .as_u64()
        .unwrap();

    // `: > egressd.yaml`: truncated in place, nothing written.
    std::fs::File::create(rig.config_path()).expect("truncate config");
    let status = wait_for_failed_reload(&rig.egressd, failed, "the emptied config").await;

    let messages = messages(&status);
    println!("refused as expected: {messages:?}");
    let path = rig.config_path().display().to_string();
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with(&format!("{path}: warning: file is empty"))),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("error: the config declares no listener")),
        "{messages:?}"
    );
    assert_eq!(status["generation"].as_u64(), Some(generation));
    assert_eq!(rig.egressd.ready().await, Some(http::StatusCode::OK));
    assert_eq!(rig.answered_by().await.as_deref(), Ok("a"));
    assert_eq!(rig.egressd.listener_addr(LISTENER).await, rig.listener);

    // Restoring the file reloads.
    std::fs::write(rig.config_path(), rig.config("b")).expect("restore config");
    rig.expect_reload_to(generation, "b").await;
}

/// What an alias bomb may cost the running process at most, in all (the issue's bomb took
/// 498 MB in `validate` and killed a running egressd).
const BOMB_PEAK_RSS_KIB: u64 = 64 * 1024;

#[tokio::test]
async fn alias_bomb_dropped_into_the_config_dir_is_refused_within_64_mib() {
    let rig = Rig::plain(&[]).await;
    let generation = rig.egressd.generation().await;
    let failed = rig.egressd.status().await["lastReload"]["failed"]
        .as_u64()
        .unwrap();
    let before = rig.egressd.peak_rss_kib();

    // 595 KB, as in the issue: a 500 KB string anchored once and aliased 19,000 times
    // (9.5 GB expanded).
    let mut bomb = format!("big: &b \"{}\"\nlist:\n", "x".repeat(500_000));
    for _ in 0..19_000 {
        bomb.push_str("- *b\n");
    }
    let bomb_path = rig.dir.path().join("bomb.yaml");
    replace_by_rename(&bomb_path, &bomb);
    let status = wait_for_failed_reload(&rig.egressd, failed, "the alias bomb").await;

    let messages = messages(&status);
    let positioned =
        regex::Regex::new(r"bomb\.yaml:\d+:\d+: error: anchors and aliases expand to more than")
            .unwrap();
    assert!(
        messages.iter().any(|m| positioned.is_match(m)),
        "{messages:?}"
    );
    let peak = rig.egressd.peak_rss_kib();
    println!("peak RSS {before} KiB before the bomb, {peak} KiB after");
    assert!(
        peak < BOMB_PEAK_RSS_KIB,
        "peak RSS {peak} KiB (was {before} KiB before the bomb)"
    );
    assert_eq!(status["generation"].as_u64(), Some(generation));
    assert_eq!(rig.answered_by().await.as_deref(), Ok("a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_reloads_under_load_lose_no_request() {
    const RELOADS: usize = 50;
    let rig = Rig::plain(&[]).await;
    let load = Load::start(rig.listener, 2, 2);
    load.wait_for_requests(&rig.egressd).await;

    let mut generation = rig.egressd.generation().await;
    for i in 1..=RELOADS {
        let to = if i % 2 == 1 { "b" } else { "a" };
        replace_by_rename(&rig.config_path(), &rig.config(to));
        generation = rig.expect_reload_to(generation, to).await;
    }

    let tally = load.finish().await;
    println!(
        "{RELOADS} reloads under load: {:?}, keep-alive: {} requests on {} connections",
        tally.answered, tally.keep_alive_requests, tally.keep_alive_connections
    );
    tally.assert_no_failures();
    for upstream in ["a", "b"] {
        assert!(
            tally.answered.get(upstream).copied().unwrap_or(0) > RELOADS,
            "too few requests reached {upstream}: {:?}",
            tally.answered
        );
    }
}

/// Client tasks sending `GET /` with Host `svc.test` back to back until stopped: some reuse one
/// connection (keep-alive), some open a new connection per request.
struct Load {
    stop: Arc<AtomicBool>,
    /// Requests completed so far (answered or failed).
    done: Arc<AtomicUsize>,
    tasks: Vec<JoinHandle<Tally>>,
}

/// What the clients saw: successful answers by upstream, and every failure.
#[derive(Debug, Default)]
struct Tally {
    answered: BTreeMap<String, usize>,
    failures: Vec<String>,
    /// Requests sent and connections opened by the keep-alive clients.
    keep_alive_requests: usize,
    keep_alive_connections: usize,
}

impl Tally {
    fn record(&mut self, outcome: Result<String, String>) {
        match outcome {
            Ok(upstream) => *self.answered.entry(upstream).or_default() += 1,
            Err(failure) => self.failures.push(failure),
        }
    }

    fn merge(&mut self, other: Tally) {
        for (upstream, n) in other.answered {
            *self.answered.entry(upstream).or_default() += n;
        }
        self.failures.extend(other.failures);
        self.keep_alive_requests += other.keep_alive_requests;
        self.keep_alive_connections += other.keep_alive_connections;
    }

    fn assert_no_failures(&self) {
        let total: usize = self.answered.values().sum();
        assert!(
            self.failures.is_empty(),
            "{} of {} requests failed; first ones: {:#?}",
            self.failures.len(),
            total + self.failures.len(),
            &self.failures[..self.failures.len().min(10)]
        );
        assert!(total > 0, "the load sent no request");
        // Otherwise the keep-alive clients silently degraded into new-connection clients.
        assert!(
            self.keep_alive_requests >= 2 * self.keep_alive_connections,
            "keep-alive connections were hardly reused: {} requests on {} connections",
            self.keep_alive_requests,
            self.keep_alive_connections
        );
    }
}

impl Load {
    fn start(listener: SocketAddr, keep_alive: usize, new_connections: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..keep_alive {
            tasks.push(tokio::spawn(keep_alive_client(
                listener,
                stop.clone(),
                done.clone(),
            )));
        }
        for _ in 0..new_connections {
            tasks.push(tokio::spawn(new_connection_client(
                listener,
                stop.clone(),
                done.clone(),
            )));
        }
        Load { stop, done, tasks }
    }

    /// Waits until the clients completed some more requests, so what follows happens under
    /// load.
    async fn wait_for_requests(&self, egressd: &Egressd) {
        let target = self.done.load(Ordering::Relaxed) + 20;
        let done = &self.done;
        if poll_within(Duration::from_secs(10), || async move {
            done.load(Ordering::Relaxed) >= target
        })
        .await
        .is_none()
        {
            egressd.fail("the load made no progress");
        }
    }

    async fn finish(self) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        let mut tally = Tally::default();
        for task in self.tasks {
            tally.merge(task.await.expect("client task"));
        }
        tally
    }
}

async fn keep_alive_client(
    listener: SocketAddr,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
) -> Tally {
    let mut tally = Tally::default();
    let mut conn: Option<KeepAlive> = None;
    while !stop.load(Ordering::Relaxed) {
        let result = match conn.as_mut() {
            Some(c) => c.get(HOST, "/").await,
            None => match KeepAlive::connect(listener).await {
                Ok(c) => {
                    tally.keep_alive_connections += 1;
                    conn.insert(c).get(HOST, "/").await
                }
                Err(e) => Err(e.context("connect")),
            },
        };
        // Only a connection the server announced closing is replaced without complaint; a
        // connection that broke is a failure (recorded) and replaced too.
        let reusable = result.is_ok() && conn.as_ref().is_some_and(|c| !c.closing());
        if !reusable {
            conn = None;
        }
        tally.keep_alive_requests += 1;
        tally.record(answered_by(result).map_err(|e| format!("keep-alive: {e}")));
        done.fetch_add(1, Ordering::Relaxed);
    }
    tally
}

async fn new_connection_client(
    listener: SocketAddr,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
) -> Tally {
    let mut tally = Tally::default();
    while !stop.load(Ordering::Relaxed) {
        let outcome = answered_by(try_get(listener, HOST, "/").await);
        tally.record(outcome.map_err(|e| format!("new connection: {e}")));
        done.fetch_add(1, Ordering::Relaxed);
    }
    tally
}
