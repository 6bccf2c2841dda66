//! Compiling a loaded config into a [`Snapshot`], checking everything that parsing cannot:
//! references, semantics, unsupported features, precedence; `egressd validate` runs exactly
//! this. No network and no tasks spawned, but not pure: it reads the files the config refers
//! to (certificates, keys and CA bundles, to check them and note their expiry; credential and
//! users files) and finds or makes endpoint groups in the [`StateRegistry`].

mod attachment;
mod backends;
mod client_policy;
mod consistent_hash;
mod credentials;
mod destination;
mod downstream;
mod gateway_tls;
mod health;
mod interception;
mod listeners;
mod policy;
mod policy_checks;
mod rate_limit;
mod reuse;
mod route_filters;
mod route_rules;
mod routes;
mod secret_refs;
mod settings;
mod tls;
mod tls_routes;
mod undeclared;

use std::path::Path;
use std::sync::Arc;

pub(crate) use self::reuse::CompiledBackends;
use crate::config::status::{Outcome, StatusReport};
use crate::config::wire::enums::OutboundPolicy;
use crate::config::yaml::Pos;
use crate::config::{promote_warnings, ConfigSet, Diagnostic, ObjectId, Reason};
use crate::snapshot::filters::Filters;
use crate::snapshot::router::FastMap;
use crate::snapshot::undeclared::UndeclaredDestinations;
use crate::snapshot::Snapshot;
use crate::upstream::connect::{Http2Options, Http2Settings};
use crate::upstream::dns::RefreshPlan;
use crate::upstream::pem::PemSource;
use crate::upstream::registry::StateRegistry;
use crate::upstream::GroupSettings;

/// A new endpoint group whose outlier detector needs its interval tick, and the label of the
/// Backend it belongs to (for the metrics of ejections made on the tick).
pub(crate) type OutlierGroup = (std::sync::Weak<crate::upstream::EndpointGroup>, Arc<str>);

/// The result of compiling: a snapshot (usable only when there are no errors), every
/// diagnostic, and the DNS refreshers to start if the snapshot is accepted.
pub struct Compiled {
    pub snapshot: Snapshot,
    pub diagnostics: Vec<Diagnostic>,
    pub(crate) refreshers: Vec<RefreshPlan>,
    /// New endpoint groups whose outlier detector needs its interval tick.
    pub(crate) outlier_groups: Vec<OutlierGroup>,
    /// Every endpoint group with active health checks (new or kept): each gets a checker of
    /// this config when it is accepted, replacing the previous config's checkers.
    pub(crate) health_checks: Vec<crate::upstream::health_check::CheckPlan>,
    /// Kept static groups whose addresses this config changes: published when it is accepted.
    pub(crate) static_lists: Vec<StaticList>,
    /// The compiled Backends, for the next reload to reuse when this config is accepted.
    pub(crate) backends: CompiledBackends,
}

/// A kept static endpoint group and the endpoints a new config gives it.
pub(crate) type StaticList = (
    Arc<crate::upstream::EndpointGroup>,
    Vec<Arc<crate::upstream::Endpoint>>,
);

impl Compiled {
    /// The conditions of every object, as `egressd validate` shows them: `Programmed` when
    /// the config has no error.
    pub fn status(&self) -> StatusReport {
        StatusReport::build(&self.snapshot.config, &self.diagnostics, Outcome::Checked)
    }

    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }

    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics.iter().filter(|d| d.is_error())
    }
}

/// Compiles `set`. `diagnostics` are those of loading, kept in front of the new ones.
pub fn compile(
    set: Arc<ConfigSet>,
    diagnostics: Vec<Diagnostic>,
    registry: &Arc<StateRegistry>,
    generation: u64,
) -> Compiled {
    compile_reusing(set, diagnostics, registry, generation, None)
}

/// [`compile`], taking the Backends of `previous` (the serving config's) that did not change
/// as they are (see [`reuse`]).
pub(crate) fn compile_reusing(
    set: Arc<ConfigSet>,
    diagnostics: Vec<Diagnostic>,
    registry: &Arc<StateRegistry>,
    generation: u64,
    previous: Option<&CompiledBackends>,
) -> Compiled {
    check(set, diagnostics, registry, previous).assemble(generation)
}

/// A config the compiler has checked: every diagnostic, and the runtime parts each section
/// compiled on the way, which [`Checked::assemble`] makes into a [`Snapshot`].
pub(crate) struct Checked {
    /// Errors first, then warnings; each group in file order.
    pub(crate) diagnostics: Vec<Diagnostic>,
    set: Arc<ConfigSet>,
    settings: settings::Settings,
    listeners: Vec<crate::snapshot::ListenerPlan>,
    routers: FastMap<Arc<str>, Arc<crate::snapshot::router::HttpRouter>>,
    sni_routers: FastMap<Arc<str>, Arc<crate::snapshot::router::SniRouter>>,
    backends: Vec<Arc<crate::snapshot::Backend>>,
    compiled_backends: CompiledBackends,
    undeclared: Option<Arc<UndeclaredDestinations>>,
    client_access: Option<Arc<crate::policy::ClientAccess>>,
    rate_limits: Vec<crate::snapshot::RateLimitRef>,
    /// What the context gathered: referenced files, and the plans to start on acceptance.
    cx: Cx,
}

/// Checks every section of `set` (loading's `diagnostics` kept in front of the new ones),
/// compiling each into its runtime parts, in the order later sections depend on them.
pub(crate) fn check(
    set: Arc<ConfigSet>,
    diagnostics: Vec<Diagnostic>,
    registry: &Arc<StateRegistry>,
    previous: Option<&CompiledBackends>,
) -> Checked {
    let mut cx = Cx::new(&set, diagnostics);
    let settings = settings::compile(&mut cx, &set);
    let policies = policy::PolicyIndex::build(&mut cx, &set);
    let mut backends = backends::compile(&mut cx, &set, &policies, &settings, registry, previous);
    let listeners = listeners::compile(&mut cx, &set, &settings);
    let no_holders = routes::HeldPorts::new();
    let held = previous.map_or(&no_holders, |p| &p.held_ports);
    let declared = routes::declared_ports(&mut cx, &set, &backends, held);
    let held_ports = routes::held_ports(&declared);
    let routers = routes::compile(&mut cx, &set, &listeners, &backends, &declared, &policies);
    let sni_routers =
        routes::compile_sni(&mut cx, &set, &listeners, &backends, &declared, &policies);
    let backend_labels = backends.all().iter().map(|b| b.label.to_string()).collect();
    let client_access = client_policy::compile(&mut cx, &set, &backend_labels);
    let undeclared = undeclared_destinations(&settings, &backends, registry);
    let mut compiled_backends = std::mem::take(&mut backends.compiled);
    compiled_backends.held_ports = held_ports;
    let backends = backends.all();
    let rate_limits = policies.rate_limit_instances();
    drop(policies);
    if set.proxy_configs.first().and_then(|p| p.spec.strict) == Some(true) {
        promote_warnings(&mut cx.diagnostics, "ProxyConfig `strict: true`");
    }
    Checked {
        diagnostics: in_report_order(std::mem::take(&mut cx.diagnostics)),
        listeners: listeners.into_iter().map(|l| l.plan).collect(),
        set,
        settings,
        routers,
        sni_routers,
        backends,
        compiled_backends,
        undeclared,
        client_access,
        rate_limits,
        cx,
    }
}

/// Where traffic to undeclared destinations is let through (`outboundPolicy` other than
/// `RegistryOnly`): the destinations no Backend declares.
fn undeclared_destinations(
    settings: &settings::Settings,
    backends: &backends::Backends<'_>,
    registry: &Arc<StateRegistry>,
) -> Option<Arc<UndeclaredDestinations>> {
    if settings.outbound_policy == OutboundPolicy::RegistryOnly {
        return None;
    }
    let declared = backends
        .all()
        .iter()
        .filter_map(|b| b.hostname.clone())
        .collect();
    Some(Arc::new(UndeclaredDestinations::new(
        settings.outbound_policy == OutboundPolicy::AuditOnly,
        declared,
        settings.denied_hostnames.clone(),
        &settings.undeclared_addresses,
        settings.undeclared_limits,
        registry.clone(),
    )))
}

/// Errors first, then warnings; each group in file order.
fn in_report_order(mut diagnostics: Vec<Diagnostic>) -> Vec<Diagnostic> {
    diagnostics.sort_by(|a, b| {
        (a.severity, &a.file, a.line, a.column).cmp(&(b.severity, &b.file, b.line, b.column))
    });
    diagnostics.sort_by_key(|d| std::cmp::Reverse(d.severity));
    diagnostics
}

impl Checked {
    /// The conditions of every object of a config a reload refused, the config of generation
    /// `serving` (0: none) serving on.
    pub(crate) fn rejected_status(&self, serving: u64) -> StatusReport {
        StatusReport::build(&self.set, &self.diagnostics, Outcome::Rejected { serving })
    }

    pub(crate) fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }

    pub(crate) fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics.iter().filter(|d| d.is_error())
    }

    /// Whether the config declares no listener at all.
    pub(crate) fn serves_nothing(&self) -> bool {
        self.listeners.is_empty()
    }

    /// The snapshot of generation `generation` made of the checked parts (the referenced
    /// certificates read for their expiry), and the plans to start when it is accepted.
    pub(crate) fn assemble(self, generation: u64) -> Compiled {
        let cx = self.cx;
        let certificate_expiries = cx
            .referenced
            .iter()
            .filter_map(|f| {
                let expiry = crate::upstream::pem::earliest_expiry(&PemSource::file(f))?;
                Some((f.display().to_string(), expiry))
            })
            .chain(secret_refs::certificate_expiries(&self.set))
            .collect();
        let snapshot = Snapshot {
            generation,
            settings: self.settings.proxy,
            listeners: self.listeners,
            routers: self.routers,
            sni_routers: self.sni_routers,
            backends: self.backends,
            undeclared: self.undeclared,
            client_access: self.client_access,
            mcp_session_key: self.settings.mcp_session_key,
            interception: self.settings.interception,
            rate_limit_store: None,
            rate_limits: self.rate_limits,
            tracing: None,
            config: self.set,
            diagnostics: self.diagnostics.as_slice().into(),
            certificate_expiries,
            referenced_files: cx.referenced.into_iter().collect(),
        };
        Compiled {
            snapshot,
            diagnostics: self.diagnostics,
            refreshers: cx.refreshers,
            outlier_groups: cx.outlier_groups,
            health_checks: cx.health_checks,
            static_lists: cx.static_lists,
            backends: self.compiled_backends,
        }
    }
}

/// Compile context: collects diagnostics and DNS refreshers.
pub(crate) struct Cx {
    diagnostics: Vec<Diagnostic>,
    /// How many of `diagnostics` are errors: asked once or twice per object, so counted as
    /// they come (a scan per object made 10,000 Backends with a warning each take seconds).
    errors: usize,
    refreshers: Vec<RefreshPlan>,
    pub(crate) outlier_groups: Vec<OutlierGroup>,
    pub(crate) health_checks: Vec<crate::upstream::health_check::CheckPlan>,
    pub(crate) static_lists: Vec<StaticList>,
    /// Files the config refers to (certificates, keys, CA bundles).
    referenced: std::collections::BTreeSet<std::path::PathBuf>,
    /// The files referred to since the Backend being compiled started (for reusing it).
    referred_by_backend: Vec<std::path::PathBuf>,
    /// One object per distinct endpoint-group settings: the groups of Backends under the same
    /// policy share it (bounded by the config's distinct policies).
    pub(crate) group_settings: Interner<GroupSettings>,
    /// The same for the HTTP/2 connection settings of Backend ports (one hyper builder each).
    http2: std::collections::HashMap<Http2Settings, Arc<Http2Options>>,
    /// The same for the filters of route rules (most rules have none).
    pub(crate) filters: Interner<Filters>,
    /// The Secrets and ConfigMaps `*Ref` fields name.
    pub(crate) secrets: secret_refs::Secrets,
}

/// One shared object per distinct value. Parts that most compiled objects have alike (the
/// settings of endpoint groups, request policies, route filters) are held once per config, not
/// once per Backend or route: with 10,000 of them, this is megabytes.
pub(crate) struct Interner<T>(std::collections::HashSet<Arc<T>, foldhash::fast::RandomState>);

impl<T> Default for Interner<T> {
    fn default() -> Self {
        Interner(Default::default())
    }
}

impl<T: Eq + std::hash::Hash> Interner<T> {
    /// The shared object holding `value`.
    pub(crate) fn get(&mut self, value: T) -> Arc<T> {
        if let Some(shared) = self.0.get(&value) {
            return shared.clone();
        }
        let shared = Arc::new(value);
        self.0.insert(shared.clone());
        shared
    }
}

/// Where a diagnostic points: an object, a position and a field path.
#[derive(Clone)]
pub(crate) struct At<'a> {
    pub(crate) file: &'a Path,
    pub(crate) id: &'a ObjectId,
    pub(crate) pos: Pos,
    pub(crate) field: String,
}

impl Cx {
    /// A context for compiling `set`, holding loading's `diagnostics`.
    fn new(set: &ConfigSet, diagnostics: Vec<Diagnostic>) -> Self {
        Cx {
            errors: diagnostics.iter().filter(|d| d.is_error()).count(),
            diagnostics,
            refreshers: Vec::new(),
            outlier_groups: Vec::new(),
            health_checks: Vec::new(),
            static_lists: Vec::new(),
            referenced: Default::default(),
            referred_by_backend: Vec::new(),
            group_settings: Default::default(),
            http2: Default::default(),
            filters: Default::default(),
            secrets: secret_refs::Secrets::new(set),
        }
    }

    /// The shared HTTP/2 connection options made from `settings`.
    pub(crate) fn http2_options(&mut self, settings: &Http2Settings) -> Arc<Http2Options> {
        self.http2
            .entry(*settings)
            .or_insert_with(|| Arc::new(Http2Options::new(settings)))
            .clone()
    }

    pub(crate) fn error(
        &mut self,
        at: At<'_>,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) {
        self.push(Diagnostic::error(at.file, at.pos, message), at, hint);
    }

    pub(crate) fn warn(
        &mut self,
        at: At<'_>,
        reason: Reason,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) {
        let d = Diagnostic::warning(at.file, at.pos, message).reason(reason);
        self.push(d, at, hint);
    }

    /// An error for a field that is part of the model but not implemented by this build.
    pub(crate) fn not_yet(&mut self, at: At<'_>, what: &str, issue: &str) {
        let d = Diagnostic::error(at.file, at.pos, format!("{what} is not supported yet"))
            .reason(Reason::UnsupportedValue);
        let hint = if issue.is_empty() {
            "remove it; this build does not implement it (see README, feature table)".to_owned()
        } else {
            format!(
                "remove it for now; it arrives with the {issue} work (see README, feature table)"
            )
        };
        self.push(d, at, hint);
    }

    pub(crate) fn missing_ref(
        &mut self,
        at: At<'_>,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) {
        let d = Diagnostic::error(at.file, at.pos, message).reason(Reason::RefNotFound);
        self.push(d, at, hint);
    }

    fn push(&mut self, d: Diagnostic, at: At<'_>, hint: impl Into<String>) {
        let hint = hint.into();
        let mut d = d.object(at.id).field(at.field);
        if !hint.is_empty() {
            d = d.hint(hint);
        }
        self.errors += usize::from(d.is_error());
        self.diagnostics.push(d);
    }

    /// Notes a file the config reads (watched; its change is a config change).
    pub(crate) fn refer(&mut self, path: &Path) {
        self.referred_by_backend.push(path.to_owned());
        if !self.referenced.contains(path) {
            self.referenced.insert(path.to_owned());
        }
    }

    /// How many errors were reported so far (loading's included).
    pub(crate) fn error_count(&self) -> usize {
        self.errors
    }
}

/// Shorthand for building an [`At`].
pub(crate) fn at<'a>(
    file: &'a Path,
    id: &'a ObjectId,
    pos: Pos,
    field: impl Into<String>,
) -> At<'a> {
    At {
        file,
        id,
        pos,
        field: field.into(),
    }
}
