//! `Gateway` listeners → [`ListenerPlan`]s.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use super::settings::Settings;
use super::tls::resolve;
use super::{at, secret_refs, Cx};
use crate::config::wire::enums::{
    FromNamespaces, FrontendValidationMode, ListenerProtocol, ListenerTlsMode,
};
use crate::config::wire::gateway::{FrontendValidation, GatewaySpec, Listener};
use crate::config::wire::Object;
use crate::config::yaml::Spanned;
use crate::config::{ConfigSet, ObjectId};
use crate::listener::tls::{client_verifier, server_config, ServerCertificate};
use crate::names::is_valid_hostname_pattern;
use crate::snapshot::{AcceptMode, ListenerPlan};
use crate::upstream::pem::PemSource;

/// A compiled HTTP or HTTPS listener with what route attachment needs.
pub(crate) struct CompiledListener {
    pub(crate) plan: ListenerPlan,
    pub(crate) gateway: ObjectId,
    pub(crate) name: String,
    pub(crate) port: u16,
    pub(crate) hostname: Option<String>,
    pub(crate) routes_from_all_namespaces: bool,
}

impl CompiledListener {
    /// A TLS Passthrough listener (SNI routing, no HTTP).
    pub(crate) fn is_passthrough(&self) -> bool {
        matches!(self.plan.mode, AcceptMode::TlsPassthrough)
    }
}

/// Every Gateway's listeners, checked; those without errors compiled.
pub(crate) fn compile(cx: &mut Cx, set: &ConfigSet, settings: &Settings) -> Vec<CompiledListener> {
    let mut out = Vec::new();
    let mut bound: HashMap<SocketAddr, String> = HashMap::new();
    bound.insert(settings.admin_addr, "the admin listener".to_owned());
    for gw in &set.gateways {
        let (file, id) = (&*gw.file, &gw.id);
        check_gateway(cx, gw);
        let mut names: HashMap<&str, usize> = HashMap::new();
        for (i, l) in gw.spec.listeners.iter().enumerate() {
            let field = format!("spec.listeners[{i}]");
            if let Some(first) = names.insert(l.name.as_str(), i) {
                cx.error(
                    at(file, id, l.pos, format!("{field}.name")),
                    format!(
                        "listener name `{}` is used twice (also listeners[{first}])",
                        l.name
                    ),
                    "give each listener a unique name",
                );
                continue;
            }
            let site = Site {
                file,
                id,
                listener: l,
                field: &field,
            };
            if let Some(compiled) = compile_listener(cx, &site, &mut bound) {
                out.push(compiled);
            }
        }
    }
    out
}

/// One listener of a Gateway, and where it is written.
struct Site<'a> {
    file: &'a Path,
    id: &'a ObjectId,
    listener: &'a Spanned<Listener>,
    /// `spec.listeners[i]`.
    field: &'a str,
}

impl<'a> Site<'a> {
    /// Where a diagnostic about the listener's field `suffix` (`.port`, ...) points.
    fn at(&self, pos: crate::config::yaml::Pos, suffix: &str) -> super::At<'a> {
        at(self.file, self.id, pos, format!("{}{suffix}", self.field))
    }
}

/// What a Gateway has outside its listeners: fields not supported yet, and no listener.
fn check_gateway(cx: &mut Cx, gw: &Object<GatewaySpec>) {
    let (file, id) = (&*gw.file, &gw.id);
    if let Some(v) = &gw.spec.addresses {
        cx.not_yet(
            at(file, id, v.pos, "spec.addresses"),
            "spec.addresses (use each listener's `address`)",
            "",
        );
    }
    if let Some(v) = &gw.spec.infrastructure {
        cx.not_yet(
            at(file, id, v.pos, "spec.infrastructure"),
            "spec.infrastructure",
            "[ops]",
        );
    }
    if gw.spec.listeners.is_empty() {
        cx.error(
            at(file, id, gw.pos, "spec.listeners"),
            "a Gateway needs at least one listener",
            "add `listeners: [{name: http, port: 15001, protocol: HTTP}]`",
        );
    }
}

/// A listener compiled: how it accepts, where it binds (not where another one does), its
/// hostname and the routes it admits. `None` at its first error (reported).
fn compile_listener(
    cx: &mut Cx,
    site: &Site<'_>,
    bound: &mut HashMap<SocketAddr, String>,
) -> Option<CompiledListener> {
    let (id, l) = (site.id, site.listener);
    let mode = accept_mode(cx, site)?;
    let addr = listen_addr(cx, site)?;
    claim_port(cx, site, addr, bound)?;
    let hostname = match &l.hostname {
        Some(h) if is_valid_hostname_pattern(&h.value.to_ascii_lowercase()) => {
            Some(h.value.to_ascii_lowercase())
        }
        Some(h) => {
            cx.error(
                site.at(h.pos, ".hostname"),
                format!("invalid hostname `{}`", h.value),
                "use a hostname or `*.suffix`",
            );
            return None;
        }
        None => None,
    };
    let from_all = allowed_routes(cx, site);
    Some(CompiledListener {
        plan: ListenerPlan {
            key: format!("{}/{}/{}", id.namespace, id.name, l.name).into(),
            addr,
            mode,
        },
        gateway: id.clone(),
        name: l.name.clone(),
        port: l.port,
        hostname,
        routes_from_all_namespaces: from_all,
    })
}

/// How the listener accepts connections, by its protocol (HTTPS: with its server config).
fn accept_mode(cx: &mut Cx, site: &Site<'_>) -> Option<AcceptMode> {
    let l = site.listener;
    match l.protocol.value {
        ListenerProtocol::Http => {
            if let Some(tls) = &l.tls {
                cx.error(
                    site.at(tls.pos, ".tls"),
                    "an HTTP listener takes no tls",
                    "use protocol HTTPS to terminate TLS",
                );
            }
            Some(AcceptMode::Http)
        }
        ListenerProtocol::Https => {
            compile_tls(cx, site.file, site.id, l, site.field).map(AcceptMode::Https)
        }
        ListenerProtocol::Tls => {
            let passthrough = l.tls.as_ref().is_some_and(|t| {
                t.mode == Some(ListenerTlsMode::Passthrough)
                    && t.certificate_files.is_empty()
                    && t.certificate_refs.is_empty()
            });
            if !passthrough {
                cx.not_yet(
                    site.at(l.protocol.pos, ".protocol"),
                    "a TLS listener other than `tls: {mode: Passthrough}` (without certificates)",
                    "[tls]",
                );
                return None;
            }
            Some(AcceptMode::TlsPassthrough)
        }
        ListenerProtocol::Tcp => {
            cx.not_yet(
                site.at(l.protocol.pos, ".protocol"),
                "listener protocol TCP",
                "[tls]",
            );
            None
        }
    }
}

/// The address the listener binds: its `address` (every IPv4 address when none) and port.
fn listen_addr(cx: &mut Cx, site: &Site<'_>) -> Option<SocketAddr> {
    let l = site.listener;
    let ip = match &l.address {
        None => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        Some(a) => match a.value.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) => {
                cx.error(
                    site.at(a.pos, ".address"),
                    format!("invalid listener address `{}`", a.value),
                    "use an IP address such as 127.0.0.1 or 0.0.0.0",
                );
                return None;
            }
        },
    };
    Some(SocketAddr::new(ip, l.port))
}

/// Records `addr` as this listener's in `bound`; `None` (reported) when another listener or
/// the admin listener has it already.
fn claim_port(
    cx: &mut Cx,
    site: &Site<'_>,
    addr: SocketAddr,
    bound: &mut HashMap<SocketAddr, String>,
) -> Option<()> {
    let (id, l) = (site.id, site.listener);
    // Port 0 binds an ephemeral port (tests use it); it never collides.
    if l.port == 0 {
        return Some(());
    }
    let clash = bound.iter().find(|(b, _)| {
        b.port() == addr.port()
            && (b.ip() == addr.ip() || b.ip().is_unspecified() || addr.ip().is_unspecified())
    });
    if let Some((_, other)) = clash {
        cx.error(
            site.at(l.pos, ".port"),
            format!("{addr} is already used by {other}"),
            "choose another port",
        );
        return None;
    }
    bound.insert(
        addr,
        format!("listener {}/{}/{}", id.namespace, id.name, l.name),
    );
    Some(())
}

/// Whether the listener admits routes from all namespaces; what of `allowedRoutes` is not
/// supported yet is reported.
fn allowed_routes(cx: &mut Cx, site: &Site<'_>) -> bool {
    let allowed = site.listener.allowed_routes.as_ref();
    let mut from_all = false;
    if let Some(ns) = allowed.and_then(|a| a.namespaces.as_ref()) {
        if let Some(from) = &ns.from {
            match from.value {
                FromNamespaces::All => from_all = true,
                FromNamespaces::Same => {}
                FromNamespaces::Selector => cx.not_yet(
                    site.at(from.pos, ".allowedRoutes.namespaces.from"),
                    "allowedRoutes from Selector",
                    "",
                ),
            }
        }
        if let Some(sel) = &ns.selector {
            cx.not_yet(
                site.at(sel.pos, ".allowedRoutes.namespaces.selector"),
                "allowedRoutes selector",
                "",
            );
        }
    }
    if let Some(kinds) = allowed.and_then(|a| a.kinds.as_ref()) {
        cx.not_yet(
            site.at(kinds.pos, ".allowedRoutes.kinds"),
            "allowedRoutes.kinds",
            "",
        );
    }
    from_all
}

/// The `tls` block of an HTTPS listener → its server config. Reads the certificate and key
/// files now, so a broken file rejects the config (the last good one keeps serving) instead of
/// failing handshakes later. `None` when there are errors (already reported).
fn compile_tls(
    cx: &mut Cx,
    file: &Path,
    id: &ObjectId,
    listener: &Spanned<Listener>,
    field: &str,
) -> Option<Arc<rustls::ServerConfig>> {
    let Some(tls) = &listener.tls else {
        cx.error(
            at(file, id, listener.pos, format!("{field}.tls")),
            "an HTTPS listener needs tls with at least one certificate",
            "add `tls: {certificateFiles: [{certificateFile: server.pem, privateKeyFile: server.key}]}`",
        );
        return None;
    };
    let mut ok = true;
    if tls.mode == Some(ListenerTlsMode::Passthrough) {
        cx.error(
            at(file, id, tls.pos, format!("{field}.tls.mode")),
            "an HTTPS listener terminates TLS; tls.mode Passthrough belongs to protocol TLS",
            "remove `mode` (Terminate is the default) or use protocol TLS",
        );
        ok = false;
    }
    if tls.certificate_refs.is_empty() && tls.certificate_files.is_empty() {
        cx.error(
            at(file, id, tls.pos, format!("{field}.tls.certificateFiles")),
            "an HTTPS listener needs at least one certificate",
            "add `certificateFiles: [{certificateFile: server.pem, privateKeyFile: server.key}]` or `certificateRefs: [{name: <a kubernetes.io/tls Secret>}]`",
        );
        ok = false;
    }
    // Gateway API's `certificateRefs` first, then the files: the first is served when the
    // client names no host a certificate covers.
    let mut sources = Vec::new();
    for (i, r) in tls.certificate_refs.iter().enumerate() {
        let here = at(file, id, r.pos, format!("{field}.tls.certificateRefs[{i}]"));
        match secret_refs::certificate(cx, here, &r.value, &id.namespace) {
            Some(pair) => sources.push((pair, r.pos, format!("certificateRefs[{i}]"))),
            None => ok = false,
        }
    }
    for (i, files) in tls.certificate_files.iter().enumerate() {
        let cert = resolve(file, &files.certificate_file);
        let key = resolve(file, &files.private_key_file);
        // Watched even when broken, so that fixing the file reloads.
        cx.refer(&cert);
        cx.refer(&key);
        let pair = (PemSource::file(cert), PemSource::file(key));
        sources.push((pair, tls.pos, format!("certificateFiles[{i}]")));
    }
    let mut certificates = Vec::new();
    for ((cert, key), pos, name) in sources {
        match ServerCertificate::load(&cert, &key) {
            Ok(certificate) => certificates.push(certificate),
            Err(e) => {
                cx.missing_ref(
                    at(file, id, pos, format!("{field}.tls.{name}")),
                    format!("{name} cannot be served: {e}"),
                    "check the certificate and key (PEM; file paths are relative to this YAML file)",
                );
                ok = false;
            }
        }
    }
    let clients = tls
        .frontend_validation
        .as_ref()
        .and_then(|v| frontend_validation(cx, file, id, field, v));
    ok.then(|| server_config(certificates, clients))
}

/// `tls.frontendValidation`: the verifier of client certificates.
fn frontend_validation(
    cx: &mut Cx,
    file: &Path,
    id: &ObjectId,
    field: &str,
    validation: &Spanned<FrontendValidation>,
) -> Option<Arc<dyn rustls::server::danger::ClientCertVerifier>> {
    let here = || {
        at(
            file,
            id,
            validation.pos,
            format!("{field}.tls.frontendValidation"),
        )
    };
    if validation.ca_certificate_files.is_empty() {
        cx.error(
            here(),
            "frontendValidation needs caCertificateFiles",
            "add `caCertificateFiles: [clients-ca.pem]`",
        );
        return None;
    }
    let files: Vec<_> = validation
        .ca_certificate_files
        .iter()
        .map(|f| resolve(file, &f.value))
        .collect();
    for f in &files {
        cx.refer(f);
    }
    let allow_missing = validation
        .mode
        .as_ref()
        .is_some_and(|m| m.value == FrontendValidationMode::AllowMissing);
    match client_verifier(&files, allow_missing) {
        Ok(verifier) => Some(verifier),
        Err(e) => {
            cx.missing_ref(
                here(),
                format!("client CA certificates cannot be used: {e}"),
                "check caCertificateFiles (PEM; paths are relative to this YAML file)",
            );
            None
        }
    }
}
