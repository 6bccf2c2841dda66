//! The log filter, changeable while egressd runs (admin `/logging`), so an operator can turn on
//! `debug` for one module during an incident and back off again without a restart.
//!
//! The binary installs the filter's reload handle once at start ([`install`]); the library
//! only sees it through this module (tests that build no subscriber have none: changes are
//! then refused with a clear reason).

use std::sync::{Mutex, OnceLock};

type Setter = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

struct Control {
    set: Setter,
    current: Mutex<String>,
}

static CONTROL: OnceLock<Control> = OnceLock::new();

/// Installs how to change the filter (`set` parses and applies a directive such as `debug` or
/// `info,egressd::upstream=trace`); `initial` is the filter in force now.
pub fn install(initial: &str, set: Setter) {
    let _ = CONTROL.set(Control {
        set,
        current: Mutex::new(initial.to_owned()),
    });
}

/// The filter in force (None when no subscriber installed one).
pub(crate) fn current() -> Option<String> {
    let control = CONTROL.get()?;
    Some(
        control
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
    )
}

/// Applies `directive` (`error`..`trace`, or `RUST_LOG` syntax); the old filter stays when it
/// does not parse.
pub(crate) fn set(directive: &str) -> Result<String, String> {
    let control = CONTROL
        .get()
        .ok_or("this process has no adjustable log filter")?;
    let directive = directive.trim();
    if directive.is_empty() {
        return Err("empty log filter".into());
    }
    (control.set)(directive)?;
    *control.current.lock().unwrap_or_else(|p| p.into_inner()) = directive.to_owned();
    tracing::warn!(
        filter = directive,
        "log filter changed through the admin API"
    );
    Ok(directive.to_owned())
}
