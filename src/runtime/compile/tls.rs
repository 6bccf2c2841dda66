//! A Backend's `tls` block → how its ports connect (CONFIG.md, "TLS modes").

use std::path::{Path, PathBuf};

use super::{at, Cx};
use crate::config::wire::backend::BackendTls;
use crate::config::wire::enums::{Protocol, SanType, TlsMode, TlsVersion as WireVersion};
use crate::config::yaml::Pos;
use crate::config::{ObjectId, Reason};
use crate::upstream::tls::{NameCheck, Roots, TlsSpec, TlsVersion};

/// The checked TLS settings of one port.
pub(super) struct TlsPlan {
    pub mode: TlsMode,
    /// What to build the client config from; `None` for plaintext.
    pub spec: Option<TlsSpec>,
}

/// Where the `tls` block is and what it is about.
pub(super) struct TlsSite<'a> {
    pub file: &'a Path,
    pub id: &'a ObjectId,
    /// The block and its position; `None` when omitted (mode Simple).
    pub tls: Option<(&'a BackendTls, Pos)>,
    pub object_pos: Pos,
    pub field: &'a str,
    /// The FQDN destination, the default SNI.
    pub hostname: Option<&'a str>,
    pub protocol: Protocol,
    /// `ProxyConfig.spec.platformIdentity`, for mode PlatformProvided.
    pub platform: Option<&'a super::settings::PlatformFiles>,
}

/// Checks a `tls` block. `None` when it has errors (already reported).
pub(super) fn compile_tls(cx: &mut Cx, site: &TlsSite<'_>) -> Option<TlsPlan> {
    let (file, id, field) = (site.file, site.id, site.field);
    let default = BackendTls::default();
    let (tls, pos) = site.tls.unwrap_or((&default, site.object_pos));
    let mode = tls.mode.as_ref().map_or(TlsMode::Simple, |m| m.value);
    let mode_pos = tls.mode.as_ref().map_or(pos, |m| m.pos);
    let before = error_count(cx);
    match mode {
        TlsMode::InsecureDisable => {
            if sets_origination_fields(tls) {
                cx.error(
                    at(file, id, pos, field),
                    "tls.mode InsecureDisable takes no other tls fields",
                    "remove them, or choose mode Simple",
                );
                return None;
            }
            return Some(TlsPlan { mode, spec: None });
        }
        TlsMode::Passthrough => {
            if sets_origination_fields(tls) {
                cx.error(
                    at(file, id, pos, field),
                    "tls.mode Passthrough takes no other tls fields: the client does TLS with the endpoint itself",
                    "remove them",
                );
                return None;
            }
            return Some(TlsPlan { mode, spec: None });
        }
        TlsMode::PlatformProvided if site.platform.is_none() => {
            cx.error(
                at(file, id, mode_pos, format!("{field}.mode")),
                "tls.mode PlatformProvided needs the platform's identity, and ProxyConfig sets no platformIdentity",
                "add ProxyConfig.spec.platformIdentity: {certificateFile, privateKeyFile, caCertificateFile} (files your platform, e.g. a SPIFFE agent, keeps current), or use Mutual with clientCertificate",
            );
            return None;
        }
        TlsMode::Simple | TlsMode::Mutual | TlsMode::PlatformProvided => {
            if site.protocol == Protocol::Tcp {
                cx.not_yet(
                    at(file, id, mode_pos, format!("{field}.mode")),
                    "TLS origination for protocol TCP (use tls.mode Passthrough to tunnel the client's own TLS, or InsecureDisable for plain TCP)",
                    "[tls]",
                );
                return None;
            }
        }
    }

    // Client certificate: required by Mutual, refused by Simple.
    if let Some(r) = &tls.client_certificate_ref {
        let _ = r;
        cx.not_yet(
            at(file, id, pos, format!("{field}.clientCertificateRef")),
            "clientCertificateRef (Secret references)",
            "[tls]",
        );
    }
    let client_cert = match (mode, &tls.client_certificate) {
        (TlsMode::PlatformProvided, Some(_)) => {
            cx.error(
                at(file, id, pos, format!("{field}.clientCertificate")),
                "tls.mode PlatformProvided presents the platform's identity, not a clientCertificate",
                "remove clientCertificate, or use tls.mode Mutual",
            );
            None
        }
        (TlsMode::PlatformProvided, None) => site
            .platform
            .map(|p| (p.certificate.clone(), p.private_key.clone())),
        (TlsMode::Simple, Some(_)) => {
            cx.error(
                at(file, id, pos, format!("{field}.clientCertificate")),
                "tls.mode Simple sends no client certificate",
                "use tls.mode Mutual, or remove clientCertificate",
            );
            None
        }
        (TlsMode::Mutual, None) if tls.client_certificate_ref.is_none() => {
            cx.error(
                at(file, id, mode_pos, format!("{field}.mode")),
                "tls.mode Mutual needs a client certificate",
                "add clientCertificate: {certificateFile: ..., privateKeyFile: ...}",
            );
            None
        }
        (_, Some(c)) => Some((
            resolve(file, &c.certificate_file),
            resolve(file, &c.private_key_file),
        )),
        _ => None,
    };

    // What to trust and what the certificate must name.
    let validation = tls.validation.clone().unwrap_or_default();
    if !validation.ca_certificate_refs.is_empty() {
        cx.not_yet(
            at(
                file,
                id,
                pos,
                format!("{field}.validation.caCertificateRefs"),
            ),
            "caCertificateRefs (Secret/ConfigMap references)",
            "[tls]",
        );
    }
    let skip = validation.insecure_skip_verify == Some(true);
    let has_ca =
        !validation.ca_certificate_files.is_empty() || !validation.ca_certificate_refs.is_empty();
    if has_ca && validation.well_known_ca_certificates.is_some() {
        cx.error(
            at(file, id, pos, format!("{field}.validation")),
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
            at(
                file,
                id,
                pos,
                format!("{field}.validation.insecureSkipVerify"),
            ),
            "insecureSkipVerify excludes every other validation field",
            "remove insecureSkipVerify (verification is the point) or the other fields",
        );
    }
    let platform_ca = match (mode, site.platform) {
        (TlsMode::PlatformProvided, Some(p)) => p.ca.clone(),
        _ => None,
    };
    let roots = if validation.ca_certificate_files.is_empty() {
        // PlatformProvided Backends that name no CA trust the platform's bundle (the mesh's
        // trust domain), unless they ask for the system store.
        match platform_ca {
            Some(ca) if validation.well_known_ca_certificates.is_none() => Roots::Files(vec![ca]),
            _ => Roots::System,
        }
    } else {
        Roots::Files(
            validation
                .ca_certificate_files
                .iter()
                .map(|f| resolve(file, f))
                .collect(),
        )
    };
    let mut names = Vec::new();
    let mut uris = Vec::new();
    for (i, san) in validation.subject_alt_names.iter().enumerate() {
        match (san.kind, &san.hostname, &san.uri) {
            (SanType::Hostname, Some(h), None) => names.push(h.to_ascii_lowercase()),
            (SanType::Uri, None, Some(u)) => uris.push(u.clone()),
            _ => cx.error(
                at(
                    file,
                    id,
                    pos,
                    format!("{field}.validation.subjectAltNames[{i}]"),
                ),
                "a subjectAltName sets exactly the field named by its type",
                "{type: Hostname, hostname: api.example.com} or {type: URI, uri: spiffe://...}",
            ),
        }
    }
    let name_check = if skip {
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
    };
    if skip {
        cx.warn(
            at(file, id, pos, format!("{field}.validation.insecureSkipVerify")),
            Reason::Degraded,
            "insecureSkipVerify: the server certificate is not verified, anyone on the path can impersonate the server",
            "trust the server's CA with caCertificateFiles instead",
        );
    }

    // SNI: configured, else the name to verify, else the destination hostname; none for IP
    // endpoints (the certificate is then checked against the endpoint address).
    let sni = tls
        .sni
        .clone()
        .or_else(|| validation.hostname.clone())
        .or_else(|| site.hostname.map(str::to_owned))
        .map(|s| s.to_ascii_lowercase());

    // Versions.
    let rank = |v: WireVersion| match v {
        WireVersion::V1_2 => TlsVersion::V1_2,
        WireVersion::V1_3 => TlsVersion::V1_3,
    };
    let min = tls.min_version.map_or(TlsVersion::V1_2, rank);
    let max = tls.max_version.map_or(TlsVersion::V1_3, rank);
    if min > max {
        cx.error(
            at(file, id, pos, format!("{field}.minVersion")),
            "minVersion is above maxVersion",
            "e.g. minVersion: \"1.2\", maxVersion: \"1.3\"",
        );
    }
    let versions: Vec<TlsVersion> = [TlsVersion::V1_2, TlsVersion::V1_3]
        .into_iter()
        .filter(|v| *v >= min && *v <= max)
        .collect();

    // ALPN: offered by protocol (CONFIG.md, Protocols); an explicit list may only narrow it.
    let alpn = match &tls.alpn_protocols {
        None => match site.protocol {
            Protocol::Http | Protocol::Mcp => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            Protocol::Http11 => vec![b"http/1.1".to_vec()],
            Protocol::Http2 | Protocol::Grpc => vec![b"h2".to_vec()],
            _ => Vec::new(),
        },
        Some(list) => {
            let speaks: &[&str] = match site.protocol {
                Protocol::Http | Protocol::Mcp => &["h2", "http/1.1"],
                Protocol::Http11 => &["http/1.1"],
                Protocol::Http2 | Protocol::Grpc => &["h2"],
                _ => &[],
            };
            for p in list.iter().filter(|p| !speaks.contains(&p.as_str())) {
                cx.error(
                    at(file, id, pos, format!("{field}.alpnProtocols")),
                    format!(
                        "ALPN protocol `{p}` is not spoken on protocol {}",
                        site.protocol
                    ),
                    format!(
                        "offer only {} here, or change `protocol`",
                        speaks.join(", ")
                    ),
                );
            }
            list.iter().map(|p| p.as_bytes().to_vec()).collect()
        }
    };

    if error_count(cx) > before {
        return None;
    }
    Some(TlsPlan {
        mode,
        spec: Some(TlsSpec {
            roots,
            names: name_check,
            client_cert,
            versions,
            alpn,
            sni,
        }),
    })
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

fn error_count(cx: &Cx) -> usize {
    cx.diagnostics.iter().filter(|d| d.is_error()).count()
}
