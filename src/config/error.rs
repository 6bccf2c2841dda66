//! Config diagnostics: every problem found while loading a config, with the file, position,
//! object and a hint a person can act on.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use super::yaml::Pos;

/// How bad a diagnostic is. Errors make a config unusable; warnings are reported but the config
/// still serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Error,
}

/// The object a diagnostic is about, as `Kind namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct ObjectId {
    pub(crate) kind: Arc<str>,
    pub(crate) namespace: Arc<str>,
    pub name: Arc<str>,
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// One problem (or warning) found in a config.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    pub file: PathBuf,
    /// 1-based; 0 (with column 0) when the problem is the whole file or directory.
    pub line: u32,
    pub column: u32,
    /// The object, when the problem is inside one (syntax errors have none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<ObjectId>,
    /// Dotted field path inside the object, e.g. `spec.rules[0].backendRefs[1]`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub field: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// The status condition reason this diagnostic maps to (`Invalid` when unset).
    #[serde(skip)]
    pub reason: Option<Reason>,
}

/// Diagnostic reasons that map to specific status conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// A field or kind this build does not implement yet (Accepted=False).
    UnsupportedValue,
    /// A reference to an object that does not exist (ResolvedRefs=False).
    RefNotFound,
    /// Another policy at the same rank won (Conflicted=True).
    Conflicted,
    /// A route-level policy set a connection-level section (Overridden=True).
    Overridden,
    /// Works, but less safely than it should (Degraded=True).
    Degraded,
}

impl Reason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::UnsupportedValue => "UnsupportedValue",
            Reason::RefNotFound => "RefNotFound",
            Reason::Conflicted => "Conflicted",
            Reason::Overridden => "Overridden",
            Reason::Degraded => "Degraded",
        }
    }
}

impl Diagnostic {
    pub(crate) fn error(file: impl Into<PathBuf>, pos: Pos, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Error,
            file: file.into(),
            line: pos.line,
            column: pos.column,
            object: None,
            field: String::new(),
            message: message.into(),
            hint: None,
            reason: None,
        }
    }

    pub(crate) fn warning(file: impl Into<PathBuf>, pos: Pos, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Self::error(file, pos, message)
        }
    }

    pub(crate) fn object(mut self, object: &ObjectId) -> Self {
        self.object = Some(object.clone());
        self
    }

    pub(crate) fn field(mut self, field: impl Into<String>) -> Self {
        self.field = field.into();
        self
    }

    pub(crate) fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub(crate) fn reason(mut self, reason: Reason) -> Self {
        self.reason = Some(reason);
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Strict mode (`validate --strict`, `ProxyConfig.spec.strict`): every warning of
/// `diagnostics` becomes an error, its message saying which switch made it one.
pub fn promote_warnings(diagnostics: &mut [Diagnostic], switch: &str) {
    for d in diagnostics.iter_mut().filter(|d| !d.is_error()) {
        d.severity = Severity::Error;
        d.message.push_str(&format!(" (an error under {switch})"));
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        // Line 0 means the whole file (it cannot be read, it is too large, ...): no position.
        if self.line == 0 {
            write!(f, "{}: {level}", self.file.display())?;
        } else {
            write!(
                f,
                "{}:{}:{}: {level}",
                self.file.display(),
                self.line,
                self.column
            )?;
        }
        if let Some(object) = &self.object {
            write!(f, ": {object}")?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, " (hint: {hint})")?;
        }
        Ok(())
    }
}
