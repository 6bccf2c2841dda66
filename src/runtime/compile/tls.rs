//! A Backend's `tls` block → how its ports connect (docs/configuration.md, "TLS modes").

use std::path::{Path, PathBuf};

use super::gateway_tls::GatewayClientCertificate;
use super::{at, secret_refs, At, Cx};
use crate::config::wire::backend::{BackendTls, TlsValidation};
use crate::config::wire::enums::{Protocol, SanType, TlsMode, TlsVersion as WireVersion};
use crate::config::yaml::Pos;
use crate::config::{ObjectId, Reason};
use crate::upstream::pem::PemSource;
use crate::upstream::tls::{NameCheck, Roots, TlsSpec, TlsVersion};

/// The checked TLS settings of one port.
pub(super) struct TlsPlan {
    pub(crate) mode: TlsMode,
    /// What to build the client config from; `None` for plaintext.
    pub(crate) spec: Option<TlsSpec>,
}

/// Where the `tls` block is and what it is about.
pub(super) struct TlsSite<'a> {
    pub(crate) file: &'a Path,
    pub(crate) id: &'a ObjectId,
    /// The block and its position; `None` when omitted (mode Simple).
    pub(crate) tls: Option<(&'a BackendTls, Pos)>,
    pub(crate) object_pos: Pos,
    pub(crate) field: &'a str,
    /// The FQDN destination, the default SNI.
    pub(crate) hostname: Option<&'a str>,
    pub(crate) protocol: Protocol,
    /// `ProxyConfig.spec.platformIdentity`, for mode PlatformProvided.
    pub(crate) platform: Option<&'a super::settings::PlatformFiles>,
    /// The Gateways' default client certificate, for mode Mutual without one of its own.
    pub(crate) gateway_default: &'a GatewayClientCertificate,
}

/// The `tls` block being checked (an empty one when omitted), with its mode.
struct Block<'a> {
    site: &'a TlsSite<'a>,
    tls: &'a BackendTls,
    /// The block's position, else the object's.
    pos: Pos,
    mode: TlsMode,
    /// `mode`'s position, else the block's.
    mode_pos: Pos,
}

impl<'a> Block<'a> {
    /// Where a diagnostic about `tls.<name>` points: `pos`, field `<tls field>.<name>`.
    fn at(&self, pos: Pos, name: &str) -> At<'a> {
        at(
            self.site.file,
            self.site.id,
            pos,
            format!("{}.{name}", self.site.field),
        )
    }
}

/// What the `validation` block asks of the server certificate.
struct Validation {
    roots: Roots,
    names: NameCheck,
}

/// Checks a `tls` block. `None` when it has errors (already reported).
pub(super) fn compile_tls(cx: &mut Cx, site: &TlsSite<'_>) -> Option<TlsPlan> {
    let default = BackendTls::default();
    let (tls, pos) = site.tls.unwrap_or((&default, site.object_pos));
    let block = Block {
        site,
        tls,
        pos,
        mode: tls.mode.as_ref().map_or(TlsMode::Simple, |m| m.value),
        mode_pos: tls.mode.as_ref().map_or(pos, |m| m.pos),
    };
    let before = cx.error_count();
    if let Some(without_origination) = check_mode(cx, &block) {
        return without_origination;
    }
    let client_cert = client_certificate(cx, &block);
    let validation = validation(cx, &block);
    // SNI: configured, else the name to verify, else the destination hostname; none for IP
    // endpoints (the certificate is then checked against the endpoint address).
    let sni = tls
        .sni
        .clone()
        .or_else(|| tls.validation.as_ref().and_then(|v| v.hostname.clone()))
        .or_else(|| site.hostname.map(str::to_owned))
        .map(|s| s.to_ascii_lowercase());
    let versions = versions(cx, &block);
    let alpn = alpn(cx, &block);
    if cx.error_count() > before {
        return None;
    }
    Some(TlsPlan {
        mode: block.mode,
        spec: Some(TlsSpec {
            roots: validation.roots,
            names: validation.names,
            client_cert,
            versions,
            alpn,
            sni,
        }),
    })
}

/// Checks the mode. `Some` when the port does not originate TLS (or cannot): the plan for
/// InsecureDisable and Passthrough, `None` for errors; `None` when the rest is to be checked.
fn check_mode(cx: &mut Cx, b: &Block<'_>) -> Option<Option<TlsPlan>> {
    let (file, id, field) = (b.site.file, b.site.id, b.site.field);
    match b.mode {
        TlsMode::InsecureDisable | TlsMode::Passthrough => {
            if !sets_origination_fields(b.tls) {
                return Some(Some(TlsPlan {
                    mode: b.mode,
                    spec: None,
                }));
            }
            let message = if b.mode == TlsMode::InsecureDisable {
                "tls.mode InsecureDisable takes no other tls fields"
            } else {
                "tls.mode Passthrough takes no other tls fields: the client does TLS with the endpoint itself"
            };
            let hint = if b.mode == TlsMode::InsecureDisable {
                "remove them, or choose mode Simple"
            } else {
                "remove them"
            };
            cx.error(at(file, id, b.pos, field), message, hint);
            Some(None)
        }
        TlsMode::PlatformProvided if b.site.platform.is_none() => {
            cx.error(
                b.at(b.mode_pos, "mode"),
                "tls.mode PlatformProvided needs the platform's identity, and ProxyConfig sets no platformIdentity",
                "add ProxyConfig.spec.platformIdentity: {certificateFile, privateKeyFile, caCertificateFile} (files your platform, e.g. a SPIFFE agent, keeps current), or use Mutual with clientCertificate",
            );
            Some(None)
        }
        TlsMode::Simple | TlsMode::Mutual | TlsMode::PlatformProvided => {
            if b.site.protocol == Protocol::Tcp {
                cx.not_yet(
                    b.at(b.mode_pos, "mode"),
                    "TLS origination for protocol TCP (use tls.mode Passthrough to tunnel the client's own TLS, or InsecureDisable for plain TCP)",
                    "[tls]",
                );
                return Some(None);
            }
            None
        }
    }
}

/// The client certificate: required by Mutual (files, else a Secret, else the Gateways'
/// default), refused by Simple, the platform's under PlatformProvided. Paths are resolved against the YAML file.
fn client_certificate(cx: &mut Cx, b: &Block<'_>) -> Option<(PemSource, PemSource)> {
    let (tls, pos) = (b.tls, b.pos);
    let reference = tls.client_certificate_ref.as_ref();
    let written = |name: &str| match (name, reference) {
        ("clientCertificateRef", Some(r)) => r.pos,
        _ => pos,
    };
    let set = match (&tls.client_certificate, reference) {
        (Some(_), Some(r)) => {
            cx.error(
                b.at(r.pos, "clientCertificateRef"),
                "clientCertificate and clientCertificateRef exclude each other",
                "keep one: files, or a kubernetes.io/tls Secret",
            );
            return None;
        }
        (Some(_), None) => Some("clientCertificate"),
        (None, Some(_)) => Some("clientCertificateRef"),
        (None, None) => None,
    };
    match (b.mode, set) {
        (TlsMode::PlatformProvided, Some(name)) => {
            cx.error(
                b.at(written(name), name),
                format!("tls.mode PlatformProvided presents the platform's identity, not a {name}"),
                format!("remove {name}, or use tls.mode Mutual"),
            );
            None
        }
        (TlsMode::PlatformProvided, None) => b.site.platform.map(|p| {
            (
                PemSource::file(&p.certificate),
                PemSource::file(&p.private_key),
            )
        }),
        (TlsMode::Simple, Some(name)) => {
            cx.error(
                b.at(written(name), name),
                "tls.mode Simple sends no client certificate",
                format!("use tls.mode Mutual, or remove {name}"),
            );
            None
        }
        (TlsMode::Mutual, None) => gateway_default_certificate(cx, b),
        _ => match (&tls.client_certificate, reference) {
            (Some(c), _) => Some((
                PemSource::file(resolve(b.site.file, &c.certificate_file)),
                PemSource::file(resolve(b.site.file, &c.private_key_file)),
            )),
            (None, Some(r)) => secret_refs::certificate(
                cx,
                b.at(r.pos, "clientCertificateRef"),
                &r.value,
                &b.site.id.namespace,
            ),
            (None, None) => None,
        },
    }
}

/// The client certificate of a Mutual Backend that names none: the Gateways' default, when
/// there is exactly one.
fn gateway_default_certificate(cx: &mut Cx, b: &Block<'_>) -> Option<(PemSource, PemSource)> {
    match b.site.gateway_default {
        GatewayClientCertificate::One(pair) => Some(pair.clone()),
        // Reported at the Gateway's reference.
        GatewayClientCertificate::Broken => None,
        GatewayClientCertificate::Conflict(named) => {
            let named: Vec<String> = named
                .iter()
                .map(|(gateway, secret)| format!("Gateway {gateway}: {secret}"))
                .collect();
            cx.error(
                b.at(b.mode_pos, "mode"),
                format!(
                    "tls.mode Mutual without a client certificate of its own takes the Gateways' default, and they name different ones ({})",
                    named.join("; ")
                ),
                "set clientCertificateRef on this Backend, or make the Gateways' spec.tls.backend.clientCertificateRef agree",
            );
            None
        }
        GatewayClientCertificate::None => {
            cx.error(
                b.at(b.mode_pos, "mode"),
                "tls.mode Mutual needs a client certificate",
                "add clientCertificate: {certificateFile: ..., privateKeyFile: ...}, or clientCertificateRef: {name: <a kubernetes.io/tls Secret>}, or a default in Gateway spec.tls.backend.clientCertificateRef",
            );
            None
        }
    }
}

/// `validation`: what to trust and what the certificate must name.
fn validation(cx: &mut Cx, b: &Block<'_>) -> Validation {
    let validation = b.tls.validation.clone().unwrap_or_default();
    check_validation_fields(cx, b, &validation);
    let roots = trusted_roots(cx, b, &validation);
    let names = name_check(cx, b, &validation);
    if validation.insecure_skip_verify == Some(true) {
        cx.warn(
            b.at(b.pos, "validation.insecureSkipVerify"),
            Reason::Degraded,
            "insecureSkipVerify: the server certificate is not verified, anyone on the path can impersonate the server",
            "trust the server's CA with caCertificateFiles instead",
        );
    }
    Validation { roots, names }
}

/// The `validation` fields that exclude each other.
fn check_validation_fields(cx: &mut Cx, b: &Block<'_>, validation: &TlsValidation) {
    let skip = validation.insecure_skip_verify == Some(true);
    let has_ca =
        !validation.ca_certificate_files.is_empty() || !validation.ca_certificate_refs.is_empty();
    if has_ca && validation.well_known_ca_certificates.is_some() {
        cx.error(
            b.at(b.pos, "validation"),
            "wellKnownCACertificates and caCertificateFiles/Refs exclude each other",
            "trust either the system store or your own CA files",
        );
    }
    if skip
        && (has_ca
            || validation.well_known_ca_certificates.is_some()
            || validation.hostname.is_some()
            || !validation.subject_alt_names.is_empty())
    {
        cx.error(
            b.at(b.pos, "validation.insecureSkipVerify"),
            "insecureSkipVerify excludes every other validation field",
            "remove insecureSkipVerify (verification is the point) or the other fields",
        );
    }
}

/// The CA files named (resolved against the YAML file) and the `ca.crt` of the ConfigMaps
/// and Secrets named, else the platform's bundle under PlatformProvided, else the system store.
fn trusted_roots(cx: &mut Cx, b: &Block<'_>, validation: &TlsValidation) -> Roots {
    let platform_ca = match (b.mode, b.site.platform) {
        (TlsMode::PlatformProvided, Some(p)) => p.ca.clone(),
        _ => None,
    };
    if validation.ca_certificate_files.is_empty() && validation.ca_certificate_refs.is_empty() {
        // PlatformProvided Backends that name no CA trust the platform's bundle (the mesh's
        // trust domain), unless they ask for the system store.
        return match platform_ca {
            Some(ca) if validation.well_known_ca_certificates.is_none() => {
                Roots::Pem(vec![PemSource::file(ca)])
            }
            _ => Roots::System,
        };
    }
    let mut sources: Vec<PemSource> = validation
        .ca_certificate_files
        .iter()
        .map(|f| PemSource::file(resolve(b.site.file, &f.value)))
        .collect();
    for (i, r) in validation.ca_certificate_refs.iter().enumerate() {
        let at = b.at(r.pos, &format!("validation.caCertificateRefs[{i}]"));
        // An unusable reference is an error (the config is refused): what is left is unused.
        sources.extend(secret_refs::ca_bundle(
            cx,
            at,
            &r.value,
            &b.site.id.namespace,
        ));
    }
    Roots::Pem(sources)
}

/// What the certificate must name: nothing (`insecureSkipVerify`), else `subjectAltNames`,
/// else `validation.hostname`, else the handshake's server name.
fn name_check(cx: &mut Cx, b: &Block<'_>, validation: &TlsValidation) -> NameCheck {
    let mut names = Vec::new();
    let mut uris = Vec::new();
    for (i, san) in validation.subject_alt_names.iter().enumerate() {
        match (san.kind, &san.hostname, &san.uri) {
            (SanType::Hostname, Some(h), None) => names.push(h.to_ascii_lowercase()),
            (SanType::Uri, None, Some(u)) => uris.push(u.clone()),
            _ => cx.error(
                b.at(b.pos, &format!("validation.subjectAltNames[{i}]")),
                "a subjectAltName sets exactly the field named by its type",
                "{type: Hostname, hostname: api.example.com} or {type: URI, uri: spiffe://...}",
            ),
        }
    }
    if validation.insecure_skip_verify == Some(true) {
        NameCheck::SkipVerify
    } else if !names.is_empty() || !uris.is_empty() {
        NameCheck::Expected { names, uris }
    } else if let Some(h) = &validation.hostname {
        NameCheck::Expected {
            names: vec![h.to_ascii_lowercase()],
            uris: Vec::new(),
        }
    } else {
        NameCheck::ServerName
    }
}

/// The TLS versions to offer: `minVersion` (default 1.2) to `maxVersion` (default 1.3).
fn versions(cx: &mut Cx, b: &Block<'_>) -> Vec<TlsVersion> {
    let rank = |v: WireVersion| match v {
        WireVersion::V1_2 => TlsVersion::V1_2,
        WireVersion::V1_3 => TlsVersion::V1_3,
    };
    let min = b.tls.min_version.map_or(TlsVersion::V1_2, rank);
    let max = b.tls.max_version.map_or(TlsVersion::V1_3, rank);
    if min > max {
        cx.error(
            b.at(b.pos, "minVersion"),
            "minVersion is above maxVersion",
            "e.g. minVersion: \"1.2\", maxVersion: \"1.3\"",
        );
    }
    [TlsVersion::V1_2, TlsVersion::V1_3]
        .into_iter()
        .filter(|v| *v >= min && *v <= max)
        .collect()
}

/// ALPN: offered by protocol (docs/configuration.md, Protocols); an explicit list may only narrow it.
fn alpn(cx: &mut Cx, b: &Block<'_>) -> Vec<Vec<u8>> {
    let protocol = b.site.protocol;
    let speaks: &[&str] = match protocol {
        Protocol::Http | Protocol::Mcp => &["h2", "http/1.1"],
        Protocol::Http11 => &["http/1.1"],
        Protocol::Http2 | Protocol::Grpc => &["h2"],
        _ => &[],
    };
    let Some(list) = &b.tls.alpn_protocols else {
        return speaks.iter().map(|p| p.as_bytes().to_vec()).collect();
    };
    for p in list.iter().filter(|p| !speaks.contains(&p.as_str())) {
        cx.error(
            b.at(b.pos, "alpnProtocols"),
            format!("ALPN protocol `{p}` is not spoken on protocol {protocol}"),
            format!(
                "offer only {} here, or change `protocol`",
                speaks.join(", ")
            ),
        );
    }
    list.iter().map(|p| p.as_bytes().to_vec()).collect()
}

/// Whether any field that only makes sense when egressd originates TLS is set.
fn sets_origination_fields(tls: &BackendTls) -> bool {
    tls.sni.is_some()
        || tls.validation.is_some()
        || tls.client_certificate.is_some()
        || tls.client_certificate_ref.is_some()
        || tls.min_version.is_some()
        || tls.max_version.is_some()
        || tls.alpn_protocols.is_some()
}

/// Relative certificate paths are relative to the YAML file that names them, so a config
/// directory can carry its own certificates.
pub(super) fn resolve(config_file: &Path, path: &str) -> PathBuf {
    let p = PathBuf::from(path);
    if p.is_absolute() {
        p
    } else {
        config_file.parent().map_or(p.clone(), |dir| dir.join(&p))
    }
}
