//! Configuration: YAML files as people write them, strict parsing with positioned errors, and
//! the status conditions each object gets.

mod document;
pub(crate) mod error;
mod files;
pub(crate) mod limits;
pub mod load;
pub mod schema;
mod secrets;
pub(crate) mod status;
pub mod units;
pub mod wire;
pub(crate) mod xbackend;
pub(crate) mod yaml;

pub(crate) use error::ObjectId;
pub use error::{promote_warnings, Diagnostic, Reason, Severity};
pub(crate) use files::{hash_file_state, read_regular_file};
pub use limits::LoadLimits;
pub use load::{load_paths, load_paths_with};
pub(crate) use load::{parse_files, read_paths, ConfigSet, LoadCache, ReadFiles};
