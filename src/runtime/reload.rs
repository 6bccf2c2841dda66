//! The reload pipeline: read → parse → validate → compile → bind → swap, off the hot path
//! ([`Reloader::reload`] is those six steps). A config with any error never replaces the one
//! serving; the failure is logged with positions, shown in `/status` and counted.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::Mutex;

use super::background;
use super::compile::{check, Checked, Compiled, CompiledBackends, OutlierGroup};
use crate::admin::{self, AdminHandle};
use crate::config::load::Loaded;
use crate::config::yaml::Pos;
use crate::config::{parse_files, read_paths, Diagnostic, LoadCache, LoadLimits, ReadFiles};
use crate::listener::ListenerManager;
use crate::ratelimit::redis::GlobalStore;
use crate::runtime::watch::ConfigWatcher;
use crate::snapshot::shared::{ReloadStatus, Shared};
use crate::snapshot::Snapshot;
use crate::telemetry::time::rfc3339;
use crate::telemetry::trace::Tracing;
use crate::telemetry::trace::TracingSettings;
use crate::upstream::dns::refresh_loop;
use crate::upstream::dns::RefreshPlan;
use crate::upstream::health_check::CheckPlan;
use crate::upstream::registry::StateRegistry;
use crate::upstream::EndpointGroup;

/// Why a reload did not take effect, and what serves instead.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("config has {errors} error(s); {serving}")]
    Invalid { errors: usize, serving: Serving },
    #[error("{message}; {serving}")]
    Apply { message: String, serving: Serving },
}

/// The generation that keeps serving when a reload fails (0: none was accepted yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Serving(pub u64);

impl std::fmt::Display for Serving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            0 => f.write_str("no config is serving yet"),
            generation => write!(f, "still serving generation {generation}"),
        }
    }
}

/// How long a reload waits for new FQDN Backends to resolve before swapping, so the first
/// requests to them do not wait for DNS.
const FIRST_RESOLUTION_WAIT: Duration = Duration::from_secs(2);

/// Runs reloads one at a time.
pub(crate) struct Reloader {
    paths: Vec<PathBuf>,
    shared: Arc<Shared>,
    registry: Arc<StateRegistry>,
    inner: Mutex<Inner>,
    generation: AtomicU64,
    admin_override: Option<SocketAddr>,
    /// Bumped when an accepted config starts its health checkers: the previous ones stop.
    health_epoch: tokio::sync::watch::Sender<u64>,
}

struct Inner {
    listeners: ListenerManager,
    admin: Option<AdminHandle>,
    /// The address the admin server was asked to bind (its port may have been 0).
    admin_requested: Option<SocketAddr>,
    last_fingerprint: Option<u64>,
    /// What each config file gave the previous load: unchanged files are not parsed again.
    load_cache: LoadCache,
    /// The serving config's compiled Backends: unchanged ones are not compiled again.
    compiled_backends: CompiledBackends,
    /// Told which extra files (certificates, keys) to watch after each load.
    watcher: Option<Arc<ConfigWatcher>>,
    /// The span exporter of the serving config (`tracing`), reused while unchanged.
    tracing: Option<Arc<Tracing>>,
}

impl Reloader {
    pub(crate) fn new(
        paths: Vec<PathBuf>,
        shared: Arc<Shared>,
        registry: Arc<StateRegistry>,
        listeners: ListenerManager,
        admin_override: Option<SocketAddr>,
    ) -> Self {
        Reloader {
            paths,
            shared,
            registry,
            inner: Mutex::new(Inner {
                listeners,
                admin: None,
                admin_requested: None,
                last_fingerprint: None,
                load_cache: LoadCache::default(),
                compiled_backends: CompiledBackends::default(),
                watcher: None,
                tracing: None,
            }),
            generation: AtomicU64::new(0),
            admin_override,
            health_epoch: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Loads the config and, if it is valid, makes it the one serving. `force` reloads even
    /// when no file changed (SIGHUP). One step each: read → parse → validate → compile → bind →
    /// swap; a step that fails leaves the last good config serving.
    pub(crate) async fn reload(&self, cause: &str, force: bool) -> Result<u64, ReloadError> {
        let mut inner = self.inner.lock().await;
        let mut attempt = Attempt::new(cause, self.generation.load(Ordering::Acquire) + 1);
        let Some(read) = self.read(&inner, cause, force).await? else {
            tracing::debug!(cause, "config files unchanged; nothing to reload");
            return Ok(self.generation.load(Ordering::Acquire));
        };
        let loaded = self.parse(&mut inner, &mut attempt, read).await?;
        let checked = self.validate(&mut inner, &attempt, loaded).await?;
        let compiled = self.compile(&inner, &mut attempt, checked).await?;
        let bound = self.bind(&mut inner, cause, &compiled.snapshot).await?;
        Ok(self.swap(&mut inner, &attempt, compiled, bound).await)
    }

    /// Read: the config files, and the state of the files the serving config refers to
    /// (rotating a certificate is a change even when no YAML changed). `None` when neither
    /// changed since the last accepted config, unless `force`d.
    async fn read(
        &self,
        inner: &Inner,
        cause: &str,
        force: bool,
    ) -> Result<Option<ReadConfig>, ReloadError> {
        let serving_files = self.shared.snapshot.load().referenced_files.clone();
        let unchanged = (!force).then_some(inner.last_fingerprint).flatten();
        let paths = self.paths.clone();
        // Reading, parsing and compiling take a while for a large config (10,000 Backends: a
        // hundred milliseconds and more): never on a worker, and below the workers' priority.
        self.in_background(cause, move || {
            let limits = LoadLimits::current();
            let files = read_paths(&paths, &limits);
            let fingerprint = combined_fingerprint(files.fingerprint, &serving_files);
            (unchanged != Some(fingerprint)).then_some(ReadConfig { files, limits })
        })
        .await
    }

    /// One step of a reload on the background thread, within the reload timeout
    /// (`--reload-timeout`): a step that fails or hangs fails the reload, recorded and logged.
    async fn in_background<T: Send + 'static>(
        &self,
        cause: &str,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ReloadError> {
        background::run_within(LoadLimits::current().reload_timeout, work)
            .await
            .map_err(|e| self.fail_apply(cause, format!("config loader failed: {e}")))
    }

    /// Parse: the YAML of the files read into typed objects; the files whose bytes did not
    /// change since the last load are not parsed again (their objects are reused).
    async fn parse(
        &self,
        inner: &mut Inner,
        attempt: &mut Attempt<'_>,
        read: ReadConfig,
    ) -> Result<Loaded, ReloadError> {
        let mut cache = std::mem::take(&mut inner.load_cache);
        let started = attempt.started;
        let (cache, loaded, load_took) = self
            .in_background(attempt.cause, move || {
                let loaded = parse_files(read.files, &read.limits, &mut cache);
                (cache, loaded, started.elapsed())
            })
            .await?;
        inner.load_cache = cache;
        attempt.load_took = load_took;
        Ok(loaded)
    }

    /// Validate: the compiler checks every object, reference and precedence rule (what
    /// `egressd validate` runs), compiling the Backends that changed on the way. A config with
    /// any error, or with no listener, is refused: logged, shown in `/status` and counted.
    async fn validate(
        &self,
        inner: &mut Inner,
        attempt: &Attempt<'_>,
        loaded: Loaded,
    ) -> Result<Checked, ReloadError> {
        let registry = self.registry.clone();
        let previous = std::mem::take(&mut inner.compiled_backends);
        // Who holds each declared port outlives a reload that times out (the rest of the
        // serving config's Backends are then compiled again next time).
        inner.compiled_backends.held_ports = previous.held_ports.clone();
        let (previous, mut checked) = self
            .in_background(attempt.cause, move || {
                let set = Arc::new(loaded.set);
                let checked = check(set, loaded.diagnostics, &registry, Some(&previous));
                (previous, checked)
            })
            .await?;
        // Until a new config is accepted, the serving one's Backends are the ones to reuse.
        inner.compiled_backends = previous;
        let serves_nothing = checked.serves_nothing();
        refuse_serving_nothing(serves_nothing, &mut checked.diagnostics, &self.paths);
        if checked.has_errors() {
            // Forget the last good fingerprint, so that reverting the files to it reloads (and
            // clears the failure from /status) instead of being skipped as "unchanged".
            inner.last_fingerprint = None;
            let errors = checked.errors().count();
            for d in checked.errors() {
                tracing::error!(target: "egressd::config", "{d}");
            }
            let serving = Serving(self.shared.snapshot.load().generation);
            let rejected = checked.rejected_status(serving.0).objects;
            self.record_failure(attempt.cause, checked.diagnostics, rejected);
            let error = ReloadError::Invalid { errors, serving };
            tracing::error!(target: "egressd::config", cause = attempt.cause, "config rejected: {error}");
            return Err(error);
        }
        for d in checked.diagnostics.iter().filter(|d| !d.is_error()) {
            tracing::warn!(target: "egressd::config", "{d}");
        }
        Ok(checked)
    }

    /// Compile: the snapshot of this generation assembled from the checked parts, with the
    /// span exporter its settings ask for (the serving one when they are unchanged).
    async fn compile(
        &self,
        inner: &Inner,
        attempt: &mut Attempt<'_>,
        checked: Checked,
    ) -> Result<Compiled, ReloadError> {
        let (generation, started) = (attempt.generation, attempt.started);
        // Reads every referenced certificate for its expiry: off the workers too.
        let (mut compiled, compiled_at) = self
            .in_background(attempt.cause, move || {
                let compiled = checked.assemble(generation);
                (compiled, started.elapsed())
            })
            .await?;
        attempt.compiled_at = compiled_at;
        let wanted = compiled.snapshot.settings.tracing.clone();
        compiled.snapshot.tracing = self.span_exporter(inner, attempt.cause, wanted).await?;
        compiled.snapshot.rate_limit_store = self.rate_limit_store(&compiled.snapshot);
        Ok(compiled)
    }

    /// The Redis store of `rateLimit.redis`: the serving one when its settings are the same
    /// (its connections and health carry on), else a new one connecting in the background.
    fn rate_limit_store(&self, snapshot: &Snapshot) -> Option<Arc<GlobalStore>> {
        let wanted = snapshot.settings.rate_limit_redis.as_ref()?;
        let serving = self.shared.snapshot.load();
        match &serving.rate_limit_store {
            Some(store) if store.settings() == wanted => Some(store.clone()),
            _ => Some(GlobalStore::start(wanted.clone())),
        }
    }

    /// The span exporter for the `tracing` settings `wanted`: the serving one when they are
    /// the same, else a new one.
    async fn span_exporter(
        &self,
        inner: &Inner,
        cause: &str,
        wanted: Option<TracingSettings>,
    ) -> Result<Option<Arc<Tracing>>, ReloadError> {
        let Some(wanted) = wanted else {
            return Ok(None);
        };
        match &inner.tracing {
            Some(current) if current.settings() == &wanted => Ok(Some(current.clone())),
            _ => {
                // Building the exporter starts threads and joins one: off the workers.
                let started = tokio::task::spawn_blocking(move || Tracing::start(&wanted))
                    .await
                    .unwrap_or_else(|e| Err(format!("starting the span exporter: {e}")));
                match started {
                    Ok(tracing) => Ok(Some(Arc::new(tracing))),
                    Err(e) => Err(self.fail_apply(cause, e)),
                }
            }
        }
    }

    /// Bind: everything that can fail happens before the swap. The DNS nameservers, the
    /// listeners' sockets, the admin server (when its address changed) and the access log.
    async fn bind(
        &self,
        inner: &mut Inner,
        cause: &str,
        snapshot: &Snapshot,
    ) -> Result<Bound, ReloadError> {
        let settings = &snapshot.settings;
        if let Err(e) = self.registry.set_nameservers(&settings.nameservers) {
            return Err(self.fail_apply(cause, e.to_string()));
        }
        let listeners = match inner.listeners.bind(&snapshot.listeners) {
            Ok(bound) => bound,
            Err(e) => return Err(self.fail_apply(cause, e.to_string())),
        };
        let admin_addr = self.admin_override.unwrap_or(settings.admin_addr);
        let admin = if inner.admin.is_some() && inner.admin_requested == Some(admin_addr) {
            None
        } else {
            match admin::start(admin_addr, self.shared.clone()).await {
                Ok(handle) => Some(handle),
                Err(e) => {
                    return Err(self.fail_apply(
                        cause,
                        format!("cannot bind admin address {admin_addr}: {e}"),
                    ))
                }
            }
        };
        if let Err(e) = self.shared.access_log.configure(&settings.access_log) {
            return Err(self.fail_apply(
                cause,
                format!("cannot open access log {}: {e}", settings.access_log.path),
            ));
        }
        Ok(Bound {
            listeners,
            admin,
            admin_addr,
        })
    }

    /// Swap: the new config's background work starts (DNS refreshes, outlier ticks, health
    /// checks), its new names get a moment to resolve, then it replaces the serving one and
    /// the reload is recorded as a success.
    async fn swap(
        &self,
        inner: &mut Inner,
        attempt: &Attempt<'_>,
        compiled: Compiled,
        bound: Bound,
    ) -> u64 {
        let Compiled {
            snapshot,
            diagnostics,
            refreshers,
            outlier_groups,
            health_checks,
            static_lists,
            backends,
        } = compiled;
        self.registry.set_dns_limits(&snapshot.settings.dns_limits);
        let resolving = self.start_resolving(refreshers);
        self.report_wildcard_hosts(&snapshot);
        self.tick_outlier_groups(outlier_groups);
        self.start_health_checks(health_checks);
        wait_first_resolution(resolving).await;
        // Kept static groups take this config's addresses now, just before the swap.
        for (group, endpoints) in static_lists {
            group.publish(crate::balance::EndpointList::resolved(endpoints));
        }
        let yaml_fingerprint = snapshot.config.fingerprint;
        let referenced = self.install(inner, snapshot, backends, bound, attempt.generation);
        let serving = self.shared.snapshot.load_full();
        self.shared
            .blocked_destinations
            .forget_unless(|host, port, action, policy| {
                serving.still_refuses(host, port, action, policy)
            });
        inner.last_fingerprint = Some(combined_fingerprint(yaml_fingerprint, &referenced));
        if let Some(watcher) = &inner.watcher {
            watcher.set_extra_files(referenced);
        }
        self.record_success(attempt, diagnostics);
        attempt.generation
    }

    /// Starts resolving the new FQDN groups; returns them, to wait for their first answers.
    fn start_resolving(&self, refreshers: Vec<RefreshPlan>) -> Vec<Arc<EndpointGroup>> {
        let groups = refreshers
            .iter()
            .filter_map(|r| r.group.upgrade())
            .collect();
        for plan in refreshers {
            tokio::spawn(refresh_loop(plan, self.registry.clone()));
        }
        groups
    }

    /// A wildcard Backend's hosts are made on demand, each with its detector and checker:
    /// they count as the Backend.
    fn report_wildcard_hosts(&self, snapshot: &Snapshot) {
        for backend in &snapshot.backends {
            for hosts in backend.ports.iter().filter_map(|p| p.wildcard.as_ref()) {
                let (shared, label) = (self.shared.clone(), backend.label.clone());
                hosts.report(crate::snapshot::wildcard::Reporting {
                    checks: self.shared.metrics.health_check_counters(&backend.label),
                    detections: Arc::new(move |d| {
                        shared.metrics.outlier_detection(&label, d.into())
                    }),
                });
            }
        }
    }

    /// Gives each new group's outlier detector its interval tick, counting its ejections.
    fn tick_outlier_groups(&self, outlier_groups: Vec<OutlierGroup>) {
        for (group, backend) in outlier_groups {
            let shared = self.shared.clone();
            let sink = Box::new(move |d: crate::balance::outlier::Detection| {
                shared.metrics.outlier_detection(&backend, d.into())
            });
            self.registry.outlier_clock().add(group, sink);
        }
    }

    /// Every group with active checks gets a checker of this config (kept DNS groups too, so
    /// that the checks use this config's TLS material); the previous ones stop.
    fn start_health_checks(&self, health_checks: Vec<CheckPlan>) {
        self.health_epoch.send_modify(|epoch| *epoch += 1);
        for plan in health_checks {
            let counters = self.shared.metrics.health_check_counters(&plan.backend);
            tokio::spawn(crate::upstream::health_check::run(
                plan,
                self.health_epoch.subscribe(),
                counters,
            ));
        }
    }

    /// Makes `snapshot` the one serving, with its listeners, admin server and span exporter;
    /// returns the files it refers to.
    fn install(
        &self,
        inner: &mut Inner,
        snapshot: Snapshot,
        backends: CompiledBackends,
        bound: Bound,
        generation: u64,
    ) -> Vec<PathBuf> {
        let plans = snapshot.listeners.clone();
        let http2 = snapshot.settings.downstream_http2;
        let referenced = snapshot.referenced_files.clone();
        let tracing = snapshot.tracing.clone();
        let old = self.shared.snapshot.swap(Arc::new(snapshot));
        let old_backends = std::mem::replace(&mut inner.compiled_backends, backends);
        // The last reference to a large config takes a while to free: not on a worker.
        background::detach(move || drop((old, old_backends)));
        let replaced = std::mem::replace(&mut inner.tracing, tracing);
        if let Some(old) = replaced.filter(|old| {
            !inner
                .tracing
                .as_ref()
                .is_some_and(|new| Arc::ptr_eq(old, new))
        }) {
            // Exports what the old exporter holds; requests still on the old config lose
            // their spans.
            tokio::task::spawn_blocking(move || old.shutdown());
        }
        self.generation.store(generation, Ordering::Release);
        inner.listeners.activate(bound.listeners, &plans, &http2);
        if let Some(admin) = bound.admin {
            inner.admin = Some(admin); // the old one (if any) stops when dropped
            inner.admin_requested = Some(bound.admin_addr);
        }
        referenced
    }

    /// Counts the accepted reload, and shows it in `/status` and the log.
    fn record_success(&self, attempt: &Attempt<'_>, diagnostics: Vec<Diagnostic>) {
        let (cause, generation) = (attempt.cause, attempt.generation);
        let metrics = &self.shared.metrics;
        metrics
            .reloads
            .get_or_create(&crate::telemetry::metrics::ResultLabel { result: "success" })
            .inc();
        metrics.generation.set(generation as i64);
        let insecure = diagnostics
            .iter()
            .filter(|d| is_insecure_upstream(d))
            .count();
        metrics.insecure_upstreams.set(insecure as i64);
        let now = SystemTime::now();
        let took = attempt.started.elapsed();
        metrics.last_reload_success.set(
            now.duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64),
        );
        self.update_status(|s| {
            s.result = "success";
            s.time = rfc3339(now);
            s.cause = cause.to_owned();
            s.generation = generation;
            s.succeeded += 1;
            s.messages = diagnostics.iter().map(ToString::to_string).collect();
            s.diagnostics = diagnostics;
            s.rejected_objects = Vec::new();
            s.duration_ms = Some(took.as_millis() as u64);
        });
        tracing::info!(
            generation,
            cause,
            took_ms = took.as_millis() as u64,
            load_ms = attempt.load_took.as_millis() as u64,
            compile_ms = (attempt.compiled_at - attempt.load_took).as_millis() as u64,
            "config loaded"
        );
    }

    /// Hands over the file watcher, so that files referenced by each loaded config (TLS
    /// material) are watched too.
    pub(crate) async fn set_watcher(&self, watcher: Arc<ConfigWatcher>) {
        let mut inner = self.inner.lock().await;
        let files = self.shared.snapshot.load().referenced_files.clone();
        watcher.set_extra_files(files);
        inner.watcher = Some(watcher);
    }

    /// The admin address, once bound.
    pub(crate) async fn admin_addr(&self) -> Option<SocketAddr> {
        self.inner.lock().await.admin.as_ref().map(|a| a.addr)
    }

    /// Binds the admin server when no config could be loaded at start, so `/status` can say
    /// why.
    pub(crate) async fn ensure_admin(&self) -> std::io::Result<()> {
        let mut inner = self.inner.lock().await;
        if inner.admin.is_none() {
            let addr = self
                .admin_override
                .unwrap_or_else(|| crate::snapshot::ProxySettings::default().admin_addr);
            inner.admin = Some(admin::start(addr, self.shared.clone()).await?);
            inner.admin_requested = Some(addr);
        }
        Ok(())
    }

    /// Stops accepting on every listener (drain).
    pub(crate) async fn stop_listeners(&self) {
        self.inner.lock().await.listeners.stop_all();
    }

    /// Exports the spans still batched and stops the exporter (at the end of a drain).
    pub(crate) async fn flush_tracing(&self) {
        if let Some(tracing) = self.inner.lock().await.tracing.take() {
            let _ = tokio::task::spawn_blocking(move || tracing.shutdown()).await;
        }
    }

    fn fail_apply(&self, cause: &str, message: String) -> ReloadError {
        let serving = Serving(self.shared.snapshot.load().generation);
        let error = ReloadError::Apply { message, serving };
        tracing::error!(cause, "{error}");
        let ReloadError::Apply { message, .. } = &error else {
            unreachable!("built just above")
        };
        self.record_failure_message(cause, vec![message.clone()], Vec::new(), serving.0);
        error
    }

    fn record_failure(
        &self,
        cause: &str,
        diagnostics: Vec<Diagnostic>,
        rejected_objects: Vec<crate::config::status::ObjectStatus>,
    ) {
        let messages = diagnostics.iter().map(ToString::to_string).collect();
        let serving = self.shared.snapshot.load().generation;
        self.record_failure_message(cause, messages, diagnostics, serving);
        self.update_status(|s| s.rejected_objects = rejected_objects);
    }

    fn record_failure_message(
        &self,
        cause: &str,
        messages: Vec<String>,
        diagnostics: Vec<Diagnostic>,
        serving: u64,
    ) {
        self.shared
            .metrics
            .reloads
            .get_or_create(&crate::telemetry::metrics::ResultLabel { result: "failure" })
            .inc();
        self.update_status(|s| {
            s.result = "failure";
            s.time = rfc3339(SystemTime::now());
            s.cause = cause.to_owned();
            s.generation = serving;
            s.failed += 1;
            s.messages = messages;
            s.diagnostics = diagnostics;
            s.rejected_objects = Vec::new();
        });
    }

    fn update_status(&self, f: impl FnOnce(&mut ReloadStatus)) {
        let mut status = self
            .shared
            .reload_status
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        f(&mut status);
    }
}

/// One reload as it goes: what its outcome is recorded with.
struct Attempt<'a> {
    cause: &'a str,
    started: std::time::Instant,
    /// The generation the config gets if it is accepted.
    generation: u64,
    /// From `started` to the end of parsing.
    load_took: Duration,
    /// From `started` to the end of compiling.
    compiled_at: Duration,
}

impl<'a> Attempt<'a> {
    fn new(cause: &'a str, generation: u64) -> Self {
        Attempt {
            cause,
            started: std::time::Instant::now(),
            generation,
            load_took: Duration::ZERO,
            compiled_at: Duration::ZERO,
        }
    }
}

/// The config files as read, and the limits they were read within (parsing keeps to the same).
struct ReadConfig {
    files: ReadFiles,
    limits: LoadLimits,
}

/// What binding made, installed by the swap.
struct Bound {
    listeners: crate::listener::Bound,
    /// A new admin server, when the admin address changed (or none was running).
    admin: Option<AdminHandle>,
    /// The address the admin server was asked to bind.
    admin_addr: SocketAddr,
}

/// Gives the new FQDN groups a moment so the first requests find addresses ready.
async fn wait_first_resolution(groups: Vec<Arc<EndpointGroup>>) {
    let _ = tokio::time::timeout(FIRST_RESOLUTION_WAIT, async {
        for g in &groups {
            g.wait_resolved(FIRST_RESOLUTION_WAIT).await;
        }
    })
    .await;
}

/// Whether `d` is a Backend's Degraded warning (plaintext or unverified TLS), counted in
/// `insecure_upstreams`.
fn is_insecure_upstream(d: &Diagnostic) -> bool {
    d.reason == Some(crate::config::Reason::Degraded)
        && d.object
            .as_ref()
            .is_some_and(|o| matches!(&*o.kind, "Backend" | "XBackend"))
}

/// A config that would serve no listener is refused like an invalid one: an emptied or
/// truncated file must not take every listener down while `/ready` stays 200, and at start a
/// proxy that serves nothing must not report ready. Only added when nothing else is wrong
/// (a broken Gateway already explains the missing listener).
pub(crate) fn refuse_without_listeners(compiled: &mut Compiled, paths: &[PathBuf]) {
    let serves_nothing = compiled.snapshot.listeners.is_empty();
    refuse_serving_nothing(serves_nothing, &mut compiled.diagnostics, paths);
}

/// [`refuse_without_listeners`] for a config that `serves_nothing`, with these `diagnostics`.
fn refuse_serving_nothing(
    serves_nothing: bool,
    diagnostics: &mut Vec<Diagnostic>,
    paths: &[PathBuf],
) {
    if !serves_nothing || diagnostics.iter().any(Diagnostic::is_error) {
        return;
    }
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let diagnostic = Diagnostic::error(
        paths.first().cloned().unwrap_or_default(),
        Pos::default(),
        format!(
            "the config declares no listener: it would serve nothing (read from {})",
            shown.join(", ")
        ),
    )
    .hint("add a Gateway with a listener; if a file was emptied or truncated, restore it");
    // Errors come first (compile's order).
    diagnostics.insert(0, diagnostic);
}

/// The YAML fingerprint combined with the content of the referenced files (a missing or
/// unreadable file counts as a distinct state, so it appearing later is a change too).
fn combined_fingerprint(yaml: u64, files: &[PathBuf]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    yaml.hash(&mut hasher);
    for file in files {
        file.hash(&mut hasher);
        // Never blocks on a FIFO nor reads a huge file whole: its size (in the error when it
        // is too large) still tells a change.
        crate::config::hash_file_state(file, &mut hasher);
    }
    hasher.finish()
}
