//! `spec.extensions` of Backends: validation with positions, and `CredentialInjector`s
//! resolved (their credential read now; the file is watched, so a change recompiles).

use http::{HeaderName, HeaderValue};

use super::{at, At, Cx};
use crate::config::wire::backend::{
    BackendExtension, CredentialInjectorConfig, CredentialSecretRef,
};
use crate::config::yaml::{Pos, Spanned};
use crate::config::{ObjectId, Reason};
use crate::snapshot::credentials::CredentialInjection;

/// Headers an injected credential may not replace: hop-by-hop ones (RFC 9110 §7.6.1) and the
/// ones that frame or route the request.
const RESERVED: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "content-type",
];

pub(super) fn compile_extensions(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    extensions: &[Spanned<BackendExtension>],
) -> Vec<CredentialInjection> {
    let mut injections = Vec::new();
    for (i, ext) in extensions.iter().enumerate() {
        let field = |name: &str| format!("spec.extensions[{i}].{name}");
        let ext_value = &ext.value;
        if ext_value.kind.value != "CredentialInjector" {
            cx.error(
                at(file, id, ext_value.kind.pos, field("type")),
                format!("unknown extension type `{}`", ext_value.kind.value),
                "CredentialInjector",
            );
            continue;
        }
        let Some(config) = &ext_value.config else {
            cx.error(
                at(file, id, ext.pos, field("config")),
                "a CredentialInjector needs config",
                "config: {header: Authorization, prefix: \"Bearer \", credential: {valueFile: token}}",
            );
            continue;
        };
        if let Some(injection) = credential_injector(cx, file, id, i, ext_value, config) {
            injections.push(injection);
        }
    }
    injections
}

/// One CredentialInjector's header and credential; `None` when it has errors (reported). A
/// credential file that cannot be read now is a warning: requests fail (or go without it)
/// until it can.
fn credential_injector(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    i: usize,
    ext: &BackendExtension,
    config: &Spanned<CredentialInjectorConfig>,
) -> Option<CredentialInjection> {
    let site = Site { file, id, i, ext };
    let c = &config.value;
    let header = site.header(cx, c)?;
    let source = &c.credential.value;
    let prefix = c.prefix.as_deref().unwrap_or("");
    let value = match (&source.value_file, &source.secret_ref) {
        (Some(value_file), None) => site.file_credential(cx, value_file, prefix),
        (None, Some(r)) => Ok(site.secret_credential(cx, r, prefix)?),
        _ => {
            cx.error(
                site.at(c.credential.pos, "credential"),
                "credential needs exactly one of valueFile and secretRef",
                "credential: {valueFile: /etc/egressd/secrets/api.key} or {secretRef: {name: api-key}}",
            );
            return None;
        }
    };
    Some(CredentialInjection {
        name: ext.name.value.clone(),
        header,
        value,
        overwrite: c.overwrite.unwrap_or(true),
        fail_open: ext.fail_open.unwrap_or(false),
    })
}

/// The CredentialInjector extension `i` of a Backend, and where it is written.
struct Site<'a> {
    file: &'a std::path::Path,
    id: &'a ObjectId,
    i: usize,
    ext: &'a BackendExtension,
}

impl<'a> Site<'a> {
    /// Where a diagnostic about `config.{name}` points.
    fn at(&self, pos: Pos, name: &str) -> At<'a> {
        let field = format!("spec.extensions[{}].config.{name}", self.i);
        at(self.file, self.id, pos, field)
    }

    /// The header the credential goes in (Authorization unless named), never one egressd
    /// manages.
    fn header(&self, cx: &mut Cx, c: &CredentialInjectorConfig) -> Option<HeaderName> {
        let Some(h) = &c.header else {
            return Some(http::header::AUTHORIZATION);
        };
        match HeaderName::from_bytes(h.value.as_bytes()) {
            Ok(name) if !RESERVED.contains(&name.as_str()) => Some(name),
            Ok(name) => {
                cx.error(
                    self.at(h.pos, "header"),
                    format!("header `{name}` cannot carry a credential: egressd manages it"),
                    "e.g. Authorization, x-api-key",
                );
                None
            }
            Err(_) => {
                cx.error(
                    self.at(h.pos, "header"),
                    format!("`{}` is not a valid header name", h.value),
                    "e.g. Authorization, x-api-key",
                );
                None
            }
        }
    }

    /// The credential in `valueFile`, read now; why it cannot be used, warned about.
    fn file_credential(
        &self,
        cx: &mut Cx,
        value_file: &Spanned<String>,
        prefix: &str,
    ) -> Result<HeaderValue, String> {
        let path = super::tls::resolve(self.file, &value_file.value);
        // Watched whether or not it can be read now: when it appears or changes, the
        // config recompiles and the credential is read again.
        cx.refer(&path);
        let value = read_credential(&path, prefix);
        if let Err(reason) = &value {
            let fail_open = self.ext.fail_open.unwrap_or(false);
            cx.warn(
                self.at(value_file.pos, "credential.valueFile"),
                Reason::RefNotFound,
                format!(
                    "credential of extension {}: {reason}; requests {}",
                    self.ext.name.value,
                    if fail_open {
                        "are sent without it (failOpen)"
                    } else {
                        "get 503 credential_unavailable and nothing is sent upstream"
                    }
                ),
                "write the credential to the file; it is watched, no restart needed",
            );
        }
        value
    }

    /// The credential in the Secret `secretRef` names. A Secret is part of the config: one
    /// that cannot serve is an error like any other reference's, and the last good config
    /// keeps its credential.
    fn secret_credential(
        &self,
        cx: &mut Cx,
        r: &Spanned<CredentialSecretRef>,
        prefix: &str,
    ) -> Option<HeaderValue> {
        let here = self.at(r.pos, "credential.secretRef");
        let (bytes, label) =
            super::secret_refs::secret_value(cx, here, &r.value, &self.id.namespace)?;
        match credential_value(&bytes, prefix) {
            Ok(value) => Some(value),
            Err(problem) => {
                cx.error(
                    self.at(r.pos, "credential.secretRef"),
                    format!("{label} {problem}"),
                    "put the credential alone under the key (`stringData` for plain text)",
                );
                None
            }
        }
    }
}

/// `prefix` + the file's content without trailing line breaks, as a sensitive header value.
/// The reasons never quote the content.
fn read_credential(path: &std::path::Path, prefix: &str) -> Result<HeaderValue, String> {
    use crate::bounded::file::{read_regular_file, MAX_CREDENTIAL_FILE};
    let content = read_regular_file(path, MAX_CREDENTIAL_FILE)
        .map_err(|e| format!("{} cannot be read: {e}", path.display()))?;
    credential_value(&content, prefix).map_err(|problem| format!("{} {problem}", path.display()))
}

/// `prefix` + `content` without trailing line breaks, as a sensitive header value; or what is
/// wrong with it, in words that never quote it.
fn credential_value(content: &[u8], prefix: &str) -> Result<HeaderValue, &'static str> {
    let mut end = content.len();
    while end > 0 && matches!(content[end - 1], b'\r' | b'\n') {
        end -= 1;
    }
    let credential = &content[..end];
    if credential.is_empty() {
        return Err("is empty");
    }
    let mut bytes = Vec::with_capacity(prefix.len() + credential.len());
    bytes.extend_from_slice(prefix.as_bytes());
    bytes.extend_from_slice(credential);
    let mut value = HeaderValue::from_bytes(&bytes).map_err(|_| {
        "holds characters a header cannot carry (control characters or line breaks)"
    })?;
    value.set_sensitive(true);
    Ok(value)
}
