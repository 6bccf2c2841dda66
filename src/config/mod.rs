//! Configuration: YAML files as people write them, strict parsing with positioned errors, and
//! the status conditions each object gets.

pub mod error;
pub mod load;
pub mod schema;
pub mod units;
pub mod wire;
pub mod yaml;

pub use error::{ConfigErrors, Diagnostic, ObjectId, Reason, Severity};
pub use load::{load_paths, ConfigSet};
