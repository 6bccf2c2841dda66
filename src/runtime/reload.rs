//! The reload pipeline: read → parse → validate → compile → bind → swap, off the hot path.
//! A config with any error never replaces the one serving; the failure is logged with
//! positions, shown in `/status` and counted.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::Mutex;

use super::background;
use super::compile::{compile_reusing, CompiledBackends};
use crate::admin::{self, AdminHandle};
use crate::config::yaml::Pos;
use crate::config::{load_paths_cached, Diagnostic, LoadCache, LoadLimits};
use crate::listener::ListenerManager;
use crate::runtime::compile::Compiled;
use crate::runtime::watch::ConfigWatcher;
use crate::snapshot::shared::{ReloadStatus, Shared};
use crate::telemetry::time::rfc3339;
use crate::telemetry::trace::Tracing;
use crate::upstream::dns::refresh_loop;
use crate::upstream::registry::StateRegistry;

/// Why a reload did not take effect.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("config has {0} error(s); the last good config keeps serving")]
    Invalid(usize),
    #[error("{0}; the last good config keeps serving")]
    Apply(String),
}

/// How long a reload waits for new FQDN Backends to resolve before swapping, so the first
/// requests to them do not wait for DNS.
const FIRST_RESOLUTION_WAIT: Duration = Duration::from_secs(2);

/// Runs reloads one at a time.
pub struct Reloader {
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
    pub fn new(
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
    /// when no file changed (SIGHUP).
    pub async fn reload(&self, cause: &str, force: bool) -> Result<u64, ReloadError> {
        let mut inner = self.inner.lock().await;
        let started = std::time::Instant::now();
        // The YAML and the files the serving config refers to: rotating a certificate is a
        // change even when no YAML changed.
        let serving_files = self.shared.snapshot.load().referenced_files.clone();
        let unchanged = (!force).then_some(inner.last_fingerprint).flatten();
        let generation = self.generation.load(Ordering::Acquire) + 1;
        let (paths, registry) = (self.paths.clone(), self.registry.clone());
        let mut cache = std::mem::take(&mut inner.load_cache);
        let previous = std::mem::take(&mut inner.compiled_backends);
        // Loading and compiling take a while for a large config (10,000 Backends: a hundred
        // milliseconds and more): never on a worker, and below the workers' priority.
        let prepared = background::run(move || {
            let loaded = load_paths_cached(&paths, &LoadLimits::current(), &mut cache);
            let fingerprint = combined_fingerprint(loaded.set.fingerprint, &serving_files);
            if unchanged == Some(fingerprint) {
                return (cache, previous, None);
            }
            let load_took = started.elapsed();
            let yaml_fingerprint = loaded.set.fingerprint;
            let compiled = compile_reusing(
                Arc::new(loaded.set),
                loaded.diagnostics,
                &registry,
                generation,
                Some(&previous),
            );
            let prepared = (compiled, yaml_fingerprint, load_took, started.elapsed());
            (cache, previous, Some(prepared))
        })
        .await
        .map_err(|e| ReloadError::Apply(format!("config loader failed: {e}")))?;
        let (cache, previous, prepared) = prepared;
        inner.load_cache = cache;
        // Until a new config is accepted, the serving one's Backends are the ones to reuse.
        inner.compiled_backends = previous;
        let Some((mut compiled, yaml_fingerprint, load_took, compiled_at)) = prepared else {
            tracing::debug!(cause, "config files unchanged; nothing to reload");
            return Ok(self.generation.load(Ordering::Acquire));
        };
        refuse_without_listeners(&mut compiled, &self.paths);

        if compiled.has_errors() {
            // Forget the last good fingerprint, so that reverting the files to it reloads (and
            // clears the failure from /status) instead of being skipped as "unchanged".
            inner.last_fingerprint = None;
            let errors = compiled.errors().count();
            for d in compiled.errors() {
                tracing::error!(target: "egressd::config", "{d}");
            }
            let rejected = compiled.status().objects;
            self.record_failure(cause, compiled.diagnostics, rejected);
            return Err(ReloadError::Invalid(errors));
        }
        for d in compiled.diagnostics.iter().filter(|d| !d.is_error()) {
            tracing::warn!(target: "egressd::config", "{d}");
        }
        let mut snapshot = compiled.snapshot;
        snapshot.tracing = match &snapshot.settings.tracing {
            None => None,
            Some(wanted) => match &inner.tracing {
                Some(current) if current.settings() == wanted => Some(current.clone()),
                _ => {
                    // Building the exporter starts threads and joins one: off the workers.
                    let wanted = wanted.clone();
                    let started = tokio::task::spawn_blocking(move || Tracing::start(&wanted))
                        .await
                        .unwrap_or_else(|e| Err(format!("starting the span exporter: {e}")));
                    match started {
                        Ok(tracing) => Some(Arc::new(tracing)),
                        Err(e) => return Err(self.fail_apply(cause, e)),
                    }
                }
            },
        };
        let settings = &snapshot.settings;

        // Everything that can fail happens before the swap.
        if let Err(e) = self.registry.set_nameservers(&settings.nameservers) {
            return Err(self.fail_apply(cause, e.to_string()));
        }
        let bound = match inner.listeners.bind(&snapshot.listeners) {
            Ok(bound) => bound,
            Err(e) => return Err(self.fail_apply(cause, e.to_string())),
        };
        let admin_addr = self.admin_override.unwrap_or(settings.admin_addr);
        let new_admin = if inner.admin.is_some() && inner.admin_requested == Some(admin_addr) {
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

        // New FQDN groups start resolving now; give them a moment so the first requests find
        // addresses ready.
        let groups: Vec<_> = compiled
            .refreshers
            .iter()
            .filter_map(|r| r.group.upgrade())
            .collect();
        for plan in compiled.refreshers {
            tokio::spawn(refresh_loop(plan, self.registry.clone()));
        }
        // A wildcard Backend's hosts are made on demand, each with its detector and checker:
        // they count as the Backend.
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
        for (group, backend) in compiled.outlier_groups {
            let shared = self.shared.clone();
            let sink = Box::new(move |d: crate::balance::outlier::Detection| {
                shared.metrics.outlier_detection(&backend, d.into())
            });
            self.registry.outlier_clock().add(group, sink);
        }
        // Every group with active checks gets a checker of this config (kept DNS groups too, so
        // that the checks use this config's TLS material); the previous ones stop.
        self.health_epoch.send_modify(|epoch| *epoch += 1);
        for plan in compiled.health_checks {
            let counters = self.shared.metrics.health_check_counters(&plan.backend);
            tokio::spawn(crate::upstream::health_check::run(
                plan,
                self.health_epoch.subscribe(),
                counters,
            ));
        }
        let _ = tokio::time::timeout(FIRST_RESOLUTION_WAIT, async {
            for g in &groups {
                g.wait_resolved(FIRST_RESOLUTION_WAIT).await;
            }
        })
        .await;
        drop(groups);

        // Kept static groups take this config's addresses now, just before the swap.
        for (group, endpoints) in compiled.static_lists {
            group.publish(crate::balance::EndpointList::resolved(endpoints));
        }
        let plans = snapshot.listeners.clone();
        let http2 = snapshot.settings.downstream_http2;
        let referenced = snapshot.referenced_files.clone();
        let diagnostics = compiled.diagnostics;
        let tracing = snapshot.tracing.clone();
        let old = self.shared.snapshot.swap(Arc::new(snapshot));
        let old_backends = std::mem::replace(&mut inner.compiled_backends, compiled.backends);
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
        inner.listeners.activate(bound, &plans, &http2);
        if let Some(admin) = new_admin {
            inner.admin = Some(admin); // the old one (if any) stops when dropped
            inner.admin_requested = Some(admin_addr);
        }
        inner.last_fingerprint = Some(combined_fingerprint(yaml_fingerprint, &referenced));
        if let Some(watcher) = &inner.watcher {
            watcher.set_extra_files(referenced);
        }

        let metrics = &self.shared.metrics;
        metrics
            .reloads
            .get_or_create(&crate::telemetry::metrics::ResultLabel { result: "success" })
            .inc();
        metrics.generation.set(generation as i64);
        let insecure = diagnostics
            .iter()
            .filter(|d| {
                d.reason == Some(crate::config::Reason::Degraded)
                    && d.object
                        .as_ref()
                        .is_some_and(|o| matches!(&*o.kind, "Backend" | "XBackend"))
            })
            .count();
        metrics.insecure_upstreams.set(insecure as i64);
        let now = SystemTime::now();
        let took = started.elapsed();
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
            load_ms = load_took.as_millis() as u64,
            compile_ms = (compiled_at - load_took).as_millis() as u64,
            "config loaded"
        );
        Ok(generation)
    }

    /// Hands over the file watcher, so that files referenced by each loaded config (TLS
    /// material) are watched too.
    pub async fn set_watcher(&self, watcher: Arc<ConfigWatcher>) {
        let mut inner = self.inner.lock().await;
        let files = self.shared.snapshot.load().referenced_files.clone();
        watcher.set_extra_files(files);
        inner.watcher = Some(watcher);
    }

    /// The admin address, once bound.
    pub async fn admin_addr(&self) -> Option<SocketAddr> {
        self.inner.lock().await.admin.as_ref().map(|a| a.addr)
    }

    /// Binds the admin server when no config could be loaded at start, so `/status` can say
    /// why.
    pub async fn ensure_admin(&self) -> std::io::Result<()> {
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
    pub async fn stop_listeners(&self) {
        self.inner.lock().await.listeners.stop_all();
    }

    /// Exports the spans still batched and stops the exporter (at the end of a drain).
    pub async fn flush_tracing(&self) {
        if let Some(tracing) = self.inner.lock().await.tracing.take() {
            let _ = tokio::task::spawn_blocking(move || tracing.shutdown()).await;
        }
    }

    fn fail_apply(&self, cause: &str, message: String) -> ReloadError {
        tracing::error!(cause, "{message}; the last good config keeps serving");
        let snapshot = self.shared.snapshot.load();
        self.record_failure_message(
            cause,
            vec![message.clone()],
            Vec::new(),
            snapshot.generation,
        );
        ReloadError::Apply(message)
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

/// A config that would serve no listener is refused like an invalid one: an emptied or
/// truncated file must not take every listener down while `/ready` stays 200, and at start a
/// proxy that serves nothing must not report ready. Only added when nothing else is wrong
/// (a broken Gateway already explains the missing listener).
pub fn refuse_without_listeners(compiled: &mut Compiled, paths: &[PathBuf]) {
    if !compiled.snapshot.listeners.is_empty() || compiled.has_errors() {
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
    compiled.diagnostics.insert(0, diagnostic);
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
