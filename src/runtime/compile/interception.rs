//! `ProxyConfig.spec.tlsInterception` → the [`Interceptor`] that makes certificates for
//! intercepted hosts.
//!
//! The CA is read like every file the config names (bounded, regular files only, watched) or
//! taken from a `kubernetes.io/tls` Secret of the config; a key file group or others may read
//! is refused. An unchanged CA and leaf settings keep the running interceptor, with the
//! certificates it has made, across reloads.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{at, At, Cx};
use crate::bounded::file::{read_regular_file, MAX_KEY_FILE, MAX_PEM_FILE};
use crate::config::wire::proxy::TlsInterceptionSpec;
use crate::config::yaml::Spanned;
use crate::config::ConfigSet;
use crate::interception::{
    check_key_permissions, InterceptionCa, Interceptor, LeafSettings, MintError,
};
use crate::upstream::pem::PemSource;

/// Leaf certificates are valid this long unless `leaf.validity` says otherwise.
pub(crate) const DEFAULT_LEAF_VALIDITY: Duration = Duration::from_secs(24 * 3600);
/// Hosts whose certificates are cached unless `leaf.cacheSize` says otherwise.
pub(crate) const DEFAULT_CACHE_SIZE: u32 = 1024;

/// The interceptor the config asks for, or `None` (no `tlsInterception`, or an error reported).
pub(crate) fn compile(cx: &mut Cx, set: &ConfigSet) -> Option<Arc<Interceptor>> {
    let pc = set.proxy_configs.first()?;
    let spec = pc.spec.tls_interception.as_ref()?;
    let field = "spec.tlsInterception";
    let at_field = |pos, f: &str| at(&pc.file, &pc.id, pos, format!("{field}.{f}"));
    let (cert_pem, key_pem) = read_ca(cx, &at_field, &pc.file, &pc.id.namespace, &spec.value)?;
    let ca = match InterceptionCa::from_pem(&cert_pem, &key_pem) {
        Ok(ca) => ca,
        Err(e) => {
            cx.error(
                at_field(spec.value.ca.pos, "ca"),
                e.to_string(),
                "make one with `egressd ca init DIR` (docs/interception.md)",
            );
            return None;
        }
    };
    let settings = leaf_settings(cx, &at_field, &spec.value)?;
    match reuse_or_new(ca, settings) {
        Ok(interceptor) => Some(interceptor),
        Err(e) => {
            cx.error(
                at_field(spec.pos, ""),
                e.to_string(),
                "egressd could not make its leaf key; see the log",
            );
            None
        }
    }
}

/// The CA certificate's PEM and its key's.
type CaPem = (Arc<[u8]>, Arc<[u8]>);

/// The CA certificate's and key's PEM, from the files or the Secret.
fn read_ca<'a>(
    cx: &mut Cx,
    at_field: &impl Fn(crate::config::yaml::Pos, &str) -> At<'a>,
    file: &std::path::Path,
    namespace: &str,
    spec: &TlsInterceptionSpec,
) -> Option<CaPem> {
    let ca = &spec.ca.value;
    match (&ca.certificate_file, &ca.private_key_file, &ca.secret_ref) {
        (Some(cert), Some(key), None) => {
            let cert = read_file(
                cx,
                at_field(cert.pos, "ca.certificateFile"),
                file,
                cert,
                false,
            );
            let key = read_file(cx, at_field(key.pos, "ca.privateKeyFile"), file, key, true);
            Some((cert?, key?))
        }
        (None, None, Some(secret)) => {
            let at = at_field(secret.pos, "ca.secretRef");
            let (cert, key) = super::secret_refs::certificate(cx, at, &secret.value, namespace)?;
            Some((inline_bytes(cert)?, inline_bytes(key)?))
        }
        _ => {
            cx.error(
                at_field(spec.ca.pos, "ca"),
                "the CA needs certificateFile and privateKeyFile, or secretRef",
                "e.g. `ca: {certificateFile: ca.crt, privateKeyFile: ca.key}` as written by `egressd ca init`",
            );
            None
        }
    }
}

fn inline_bytes(source: PemSource) -> Option<Arc<[u8]>> {
    match source {
        PemSource::Inline(inline) => Some(inline.pem.clone()),
        PemSource::File(_) => None,
    }
}

/// One file of the CA, watched; a key also checked for who may read it.
fn read_file(
    cx: &mut Cx,
    at: At<'_>,
    yaml_file: &std::path::Path,
    path: &Spanned<String>,
    key: bool,
) -> Option<Arc<[u8]>> {
    let resolved = super::tls::resolve(yaml_file, &path.value);
    cx.refer(&resolved);
    let max = if key { MAX_KEY_FILE } else { MAX_PEM_FILE };
    let checked = if key {
        check_key_permissions(&resolved).map_err(|e| e.to_string())
    } else {
        Ok(())
    };
    let read = checked.and_then(|()| {
        read_regular_file(&resolved, max).map_err(|e| format!("{}: {e}", resolved.display()))
    });
    match read {
        Ok(bytes) => Some(bytes.into()),
        Err(e) => {
            let hint = if key {
                "the CA key signs certificates every client of egressd trusts: a PEM file only its owner may read"
            } else {
                "the certificate must be a PEM file"
            };
            cx.error(at, e, hint);
            None
        }
    }
}

/// `leaf`: validity (at least an hour: a leaf is made again when a third is left) and cache
/// size (at least 1).
fn leaf_settings<'a>(
    cx: &mut Cx,
    at_field: &impl Fn(crate::config::yaml::Pos, &str) -> At<'a>,
    spec: &TlsInterceptionSpec,
) -> Option<LeafSettings> {
    let leaf = spec.leaf.as_ref().map(|l| &l.value);
    let mut settings = LeafSettings {
        validity: DEFAULT_LEAF_VALIDITY,
        max_entries: DEFAULT_CACHE_SIZE as usize,
    };
    let mut ok = true;
    if let Some(validity) = leaf.and_then(|l| l.validity.as_ref()) {
        let value = validity.value.0;
        if value < Duration::from_secs(3600) {
            cx.error(
                at_field(validity.pos, "leaf.validity"),
                "leaf.validity must be at least 1h",
                "the default, 24h, suits most; clients check it against their own clock",
            );
            ok = false;
        }
        settings.validity = value;
    }
    if let Some(size) = leaf.and_then(|l| l.cache_size.as_ref()) {
        if size.value == 0 {
            cx.error(
                at_field(size.pos, "leaf.cacheSize"),
                "leaf.cacheSize must be at least 1",
                "the default is 1024 hosts",
            );
            ok = false;
        }
        settings.max_entries = size.value as usize;
    }
    ok.then_some(settings)
}

/// The running interceptor when the CA and settings are the same (its certificates stay
/// cached across a reload), else a new one.
fn reuse_or_new(ca: InterceptionCa, settings: LeafSettings) -> Result<Arc<Interceptor>, MintError> {
    static LAST: Mutex<Option<Arc<Interceptor>>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(running) = last.as_ref() {
        if running.ca().fingerprint_sha256() == ca.fingerprint_sha256()
            && running.settings() == &settings
        {
            return Ok(running.clone());
        }
    }
    let fresh = Arc::new(Interceptor::new(Arc::new(ca), settings)?);
    *last = Some(fresh.clone());
    Ok(fresh)
}
