//! `Secret` and `ConfigMap` (core `v1`): PEM material for the `*Ref` fields, as
//! `kubectl get -o yaml` writes them. They are not `#[apply(wire!)]` types: Kubernetes puts
//! their content beside `metadata` instead of in a `spec`, and what is kept of them is the
//! decoded bytes, never shown (see `config::secrets` for how they are read).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::config::yaml::{Pos, Spanned};

/// The `type` a Secret needs to serve a certificate and its key.
pub(crate) const TLS_SECRET_TYPE: &str = "kubernetes.io/tls";

/// What a Secret or ConfigMap holds, by key (`tls.crt`, `tls.key`, `ca.crt`, ...).
#[derive(Clone, Default)]
pub(crate) struct KeyedData {
    /// A Secret's `type` (`Opaque` when not written, as Kubernetes defaults it); `None` for a
    /// ConfigMap.
    pub(crate) secret_type: Option<Spanned<String>>,
    pub(crate) entries: BTreeMap<String, DataEntry>,
}

/// One key's value and where it is written.
#[derive(Clone)]
pub(crate) struct DataEntry {
    pub(crate) pos: Pos,
    /// The decoded bytes; `None` when a `data` value is not valid base64 (an error reported
    /// where it is written, and again by whatever refers to the key).
    pub(crate) bytes: Option<Arc<[u8]>>,
}

// Never print the bytes, whatever `{:?}` a log line or a test might use.
impl fmt::Debug for KeyedData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedData")
            .field("secret_type", &self.secret_type.as_ref().map(|t| &t.value))
            .field("keys", &self.entries.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl fmt::Debug for DataEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.bytes {
            Some(bytes) => write!(f, "<{} bytes at {}>", bytes.len(), self.pos),
            None => write!(f, "<not base64 at {}>", self.pos),
        }
    }
}

impl KeyedData {
    /// The Secret's type, as Kubernetes reads it.
    pub(crate) fn secret_type(&self) -> &str {
        self.secret_type.as_ref().map_or("Opaque", |t| &t.value)
    }
}
