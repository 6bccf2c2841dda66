//! Gateway API's `XBackend` (GEP-4894) mapped onto egressd's `Backend` when a config loads,
//! so that everything after loading — routes, implicit routes, policies, TLS, status — treats
//! both alike. The mapped object keeps the XBackend's identity (`XBackend namespace/name`) and
//! the positions of what was written; [`field_path`] turns the Backend field paths of later
//! diagnostics back into the XBackend's.
//!
//! Where Gateway API's reading differs from egressd's, the XBackend's wins: `tls` omitted
//! means no TLS (`H2C` requires it), `ServerOnly`/`ClientAndServer`/`None` are
//! `Simple`/`Mutual`/`InsecureDisable`, and protocol `TCP` without TLS is a port whose bytes
//! egressd does not touch (egressd's `Passthrough`: reachable by CONNECT and by SNI).

use std::sync::Arc;

use super::document::Base;
use super::error::Diagnostic;
use super::load::Loaded;
use super::wire::backend::{
    BackendPort, BackendSpec, BackendTls, Destination, FqdnDestination, TlsValidation,
};
use super::wire::enums::{
    DestinationType, Protocol, TlsMode, XBackendProtocol, XBackendTlsMode, XBackendType,
};
use super::wire::xbackend::{XBackendSpec, XBackendTls};
use super::wire::Object;
use super::yaml::{Node, Pos, Spanned};
use crate::names::is_valid_hostname;

/// Loads an XBackend document's `spec`: the XBackend as written (for `/config`) and the
/// Backend it maps to.
pub(super) fn push(base: Base<'_>, spec: &Node, loaded: &mut Loaded) {
    let mut parsed = Vec::new();
    base.push(spec, &mut loaded.diagnostics, &mut parsed);
    for x in parsed {
        if let Some(backend) = to_backend(&x, &mut loaded.diagnostics) {
            loaded.set.backends.push(Arc::new(backend));
        }
        loaded.set.xbackends.push(x);
    }
}

/// Reports an error about the XBackend being mapped: position, field, message and hint.
type ErrorSink<'a> = dyn FnMut(Pos, &str, String, &str) + 'a;

/// The Backend an XBackend stands for; `None` when it cannot be one (the reasons pushed to
/// `diags`).
pub(super) fn to_backend(
    x: &Object<XBackendSpec>,
    diags: &mut Vec<Diagnostic>,
) -> Option<Object<BackendSpec>> {
    let before = diags.len();
    let mut error = |pos: Pos, field: &str, message: String, hint: &str| {
        diags.push(
            Diagnostic::error(&*x.file, pos, message)
                .object(&x.id)
                .field(field)
                .hint(hint),
        );
    };
    check_type(&x.spec, &mut error);
    let hostname = hostname(&x.spec, &mut error);
    let port = port(&x.spec, &mut error);
    let protocol = x.spec.protocol.as_ref().map(|p| (p.value, p.pos));
    let mapped_protocol = mapped_protocol(protocol, &mut error);
    let tls = tls(x, &mut error, protocol);
    if diags.len() > before {
        return None;
    }
    let hostname = hostname?;
    let spec = BackendSpec {
        destination: destination(x, hostname, port),
        protocol: mapped_protocol,
        tls: Some(tls),
        protocol_options: None,
        fallback: None,
        extensions: Vec::new(),
        traffic_policy: None,
    };
    Some(Object {
        id: x.id.clone(),
        labels: x.labels.clone(),
        namespace_written: x.namespace_written,
        file: x.file.clone(),
        pos: x.pos,
        spec,
    })
}

/// Type EndpointSelector (or an `endpointSelector`) is refused: there is no cluster to read.
fn check_type(spec: &XBackendSpec, error: &mut ErrorSink<'_>) {
    if spec.kind.value == XBackendType::EndpointSelector || spec.endpoint_selector.is_some() {
        let pos = spec
            .endpoint_selector
            .as_ref()
            .map_or(spec.kind.pos, |s| s.pos);
        error(
            pos,
            "spec.type",
            "type EndpointSelector is not supported: egressd reads no cluster to select endpoints from".into(),
            "use type ExternalHostname, or egressd's Backend with `destination.type: IP`",
        );
    }
}

/// `externalHostname.hostname` (required by type ExternalHostname), reported when it is not
/// a DNS name or names a cluster Service.
fn hostname<'a>(spec: &'a XBackendSpec, error: &mut ErrorSink<'_>) -> Option<&'a Spanned<String>> {
    let hostname = match &spec.external_hostname {
        Some(h) => Some(&h.value.hostname),
        None if spec.kind.value == XBackendType::ExternalHostname => {
            error(
                spec.kind.pos,
                "spec.externalHostname",
                "type ExternalHostname needs externalHostname".into(),
                "add `externalHostname: {hostname: api.example.com}`",
            );
            None
        }
        None => None,
    };
    if let Some(h) = hostname {
        let name = h.value.to_ascii_lowercase();
        if !is_valid_hostname(&name) {
            error(
                h.pos,
                "spec.externalHostname.hostname",
                format!("`{}` is not a hostname", h.value),
                "write a DNS name (IP addresses are not allowed here; egressd's Backend takes them with `destination.type: IP`)",
            );
        } else if name.ends_with(".cluster.local") {
            error(
                h.pos,
                "spec.externalHostname.hostname",
                format!("`{}` names a cluster Service", h.value),
                "XBackend hostnames may not end with .cluster.local (Gateway API forbids it: DNS rebinding)",
            );
        }
    }
    hostname
}

/// The port number, written once as `number` (or `port`), and not 0.
fn port(spec: &XBackendSpec, error: &mut ErrorSink<'_>) -> Spanned<u16> {
    let written = &spec.port.value;
    let port = match (&written.number, &written.port) {
        (Some(n), None) | (None, Some(n)) => n.clone(),
        (Some(n), Some(_)) => {
            error(
                spec.port.pos,
                "spec.port",
                "both `number` and `port` are set".into(),
                "write the port once, as `number`",
            );
            n.clone()
        }
        (None, None) => {
            error(
                spec.port.pos,
                "spec.port",
                "the port has no `number`".into(),
                "e.g. `port: {number: 443}`",
            );
            Spanned::new(spec.port.pos, 0)
        }
    };
    if port.value == 0 && (written.number.is_some() || written.port.is_some()) {
        error(
            port.pos,
            "spec.port.number",
            "port 0 is not a destination port".into(),
            "use 1-65535",
        );
    }
    port
}

/// egressd's protocol for the one written; WSS is refused.
fn mapped_protocol(
    protocol: Option<(XBackendProtocol, Pos)>,
    error: &mut ErrorSink<'_>,
) -> Option<Spanned<Protocol>> {
    match protocol {
        None => None,
        Some((XBackendProtocol::Wss, pos)) => {
            error(
                pos,
                "spec.protocol",
                "protocol WSS is not supported yet".into(),
                "use HTTP (websocket upgrades are allowed on every HTTP protocol) with tls",
            );
            None
        }
        Some((p, pos)) => Some(Spanned::new(pos, egressd_protocol(p))),
    }
}

/// The mapped Backend's destination: the hostname (type FQDN) with its one port.
fn destination(
    x: &Object<XBackendSpec>,
    hostname: &Spanned<String>,
    port: Spanned<u16>,
) -> Spanned<Destination> {
    let spec = &x.spec;
    let fqdn = FqdnDestination {
        hostname: hostname.clone(),
        rewrite_authority: None,
        allowed_addresses: None,
        max_hosts: None,
        host_idle_timeout: None,
        max_endpoints: None,
    };
    let port = BackendPort {
        name: spec.port.value.name.clone(),
        number: port,
        protocol: None,
        tls: None,
        protocol_options: None,
        interception: None,
    };
    Spanned::new(
        x.pos,
        Destination {
            kind: Spanned::new(spec.kind.pos, DestinationType::Fqdn),
            fqdn: Some(Spanned::new(hostname.pos, fqdn)),
            ip: None,
            ports: vec![Spanned::new(spec.port.pos, port)],
        },
    )
}

/// Gateway API's protocol names are egressd's (WSS aside, refused before).
fn egressd_protocol(p: XBackendProtocol) -> Protocol {
    match p {
        XBackendProtocol::Tcp => Protocol::Tcp,
        XBackendProtocol::Http | XBackendProtocol::Wss => Protocol::Http,
        XBackendProtocol::Http2 => Protocol::Http2,
        XBackendProtocol::Http11 => Protocol::Http11,
        XBackendProtocol::H2c => Protocol::H2c,
        XBackendProtocol::Mcp => Protocol::Mcp,
        XBackendProtocol::Grpc => Protocol::Grpc,
    }
}

/// `spec.tls` → egressd's `tls`, with Gateway API's rules on which protocol needs what.
fn tls(
    x: &Object<XBackendSpec>,
    error: &mut ErrorSink<'_>,
    protocol: Option<(XBackendProtocol, Pos)>,
) -> Spanned<Box<BackendTls>> {
    let Some(tls) = &x.spec.tls else {
        return without_tls(x, error, protocol);
    };
    if let Some((XBackendProtocol::H2c, pos)) = protocol {
        error(
            pos,
            "spec.protocol",
            "protocol H2C is HTTP/2 without TLS, but tls is set".into(),
            "remove tls, or use protocol HTTP2 for HTTP/2 over TLS",
        );
    }
    let mode = tls.value.mode.clone();
    check_client_certificate(&tls.value, error);
    let plaintext = mode.value == XBackendTlsMode::None;
    let tcp = protocol.is_some_and(|(p, _)| p == XBackendProtocol::Tcp);
    let mapped = match mode.value {
        XBackendTlsMode::None if tcp => TlsMode::Passthrough,
        XBackendTlsMode::None => TlsMode::InsecureDisable,
        XBackendTlsMode::ServerOnly => TlsMode::Simple,
        XBackendTlsMode::ClientAndServer => TlsMode::Mutual,
    };
    if plaintext && tls.value.validation.is_some() {
        error(
            tls.pos,
            "spec.tls.validation",
            "tls.mode None takes no validation".into(),
            "remove validation, or use mode ServerOnly",
        );
    }
    let validation = tls.value.validation.as_ref().map(|v| {
        let v = &v.value;
        Box::new(TlsValidation {
            well_known_ca_certificates: v.well_known_ca_certificates,
            ca_certificate_files: Vec::new(),
            ca_certificate_refs: v.ca_certificate_refs.clone(),
            hostname: v.hostname.clone(),
            subject_alt_names: v.subject_alt_names.clone(),
            insecure_skip_verify: None,
        })
    });
    Spanned::new(
        tls.pos,
        Box::new(BackendTls {
            mode: Some(Spanned::new(mode.pos, mapped)),
            validation,
            client_certificate_ref: tls
                .value
                .client_certificate_ref
                .as_ref()
                .map(|r| Spanned::new(r.pos, Box::new(r.value.clone()))),
            ..BackendTls::default()
        }),
    )
}

/// No `tls`: TCP bytes pass untouched, anything else is plaintext HTTP (HTTP2 and WSS need
/// TLS, and are reported).
fn without_tls(
    x: &Object<XBackendSpec>,
    error: &mut ErrorSink<'_>,
    protocol: Option<(XBackendProtocol, Pos)>,
) -> Spanned<Box<BackendTls>> {
    if let Some((p @ (XBackendProtocol::Http2 | XBackendProtocol::Wss), pos)) = protocol {
        error(
            pos,
            "spec.tls",
            format!("protocol {p} needs tls"),
            "add `tls: {mode: ServerOnly}`, or use protocol H2C for HTTP/2 without TLS",
        );
    }
    // Without TLS, TCP bytes are the client's own (often its TLS): egressd passes them
    // untouched; anything else is plaintext HTTP.
    let mode = if protocol.is_some_and(|(p, _)| p == XBackendProtocol::Tcp) {
        TlsMode::Passthrough
    } else {
        TlsMode::InsecureDisable
    };
    Spanned::new(
        x.pos,
        Box::new(BackendTls {
            mode: Some(Spanned::new(x.pos, mode)),
            ..BackendTls::default()
        }),
    )
}

/// `clientCertificateRef` goes with mode ClientAndServer, and only with it.
fn check_client_certificate(tls: &XBackendTls, error: &mut ErrorSink<'_>) {
    let mode = &tls.mode;
    let mutual = mode.value == XBackendTlsMode::ClientAndServer;
    match (&tls.client_certificate_ref, mutual) {
        (None, true) => error(
            mode.pos,
            "spec.tls.clientCertificateRef",
            "tls.mode ClientAndServer needs clientCertificateRef".into(),
            "add `clientCertificateRef: {name: <a kubernetes.io/tls Secret>}`",
        ),
        (Some(r), false) => error(
            r.pos,
            "spec.tls.clientCertificateRef",
            format!(
                "clientCertificateRef is only for tls.mode ClientAndServer, not {}",
                mode.value
            ),
            "remove it, or use mode ClientAndServer",
        ),
        _ => {}
    }
}

/// The XBackend field a diagnostic about the mapped Backend's `field` is about.
pub(crate) fn field_path(field: &str) -> String {
    const MAP: [(&str, &str); 4] = [
        (
            "spec.destination.fqdn.hostname",
            "spec.externalHostname.hostname",
        ),
        ("spec.destination.fqdn", "spec.externalHostname"),
        ("spec.destination.ports[0]", "spec.port"),
        ("spec.destination", "spec"),
    ];
    for (backend, xbackend) in MAP {
        if let Some(rest) = field.strip_prefix(backend) {
            return format!("{xbackend}{rest}");
        }
    }
    field.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_fields_read_as_xbackend_fields() {
        assert_eq!(
            field_path("spec.destination.fqdn.hostname"),
            "spec.externalHostname.hostname"
        );
        assert_eq!(
            field_path("spec.destination.ports[0].number"),
            "spec.port.number"
        );
        assert_eq!(field_path("spec.tls.mode"), "spec.tls.mode");
    }
}
