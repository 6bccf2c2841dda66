//! Configuration: YAML files as people write them, strict parsing with positioned errors, and
//! the status conditions each object gets.

mod document;
pub mod error;
mod files;
pub mod limits;
pub mod load;
pub mod schema;
mod secrets;
pub mod status;
pub mod units;
pub mod wire;
pub mod xbackend;
pub mod yaml;

pub use error::{ConfigErrors, Diagnostic, ObjectId, Reason, Severity};
pub use files::{hash_file_state, read_regular_file};
pub use limits::LoadLimits;
pub use load::{
    load_paths, load_paths_cached, load_paths_with, parse_files, read_paths, ConfigSet, LoadCache,
    ReadFiles,
};
