//! Reading a file the config names (certificates, keys, CA bundles, credentials, users, the
//! MCP session key) without trusting the file system: nothing but a regular file is read (a
//! FIFO would block the reload for good, `/dev/zero` would fill memory, `/dev/urandom` would
//! never end), it is opened non-blocking, and at most a bound per kind of file is read.

use std::fs::{Metadata, OpenOptions};
use std::io::{self, Read};
use std::path::Path;

/// The most a PEM file (certificate chain, private key, CA bundle) may hold: Mozilla's whole
/// CA bundle is ~230 KB.
pub(crate) const MAX_PEM_FILE: u64 = 4 << 20;
/// The most a credential file (`valueFile`: a token, an API key) may hold.
pub(crate) const MAX_CREDENTIAL_FILE: u64 = 64 << 10;
/// The most the MCP session-key file may hold.
pub(crate) const MAX_KEY_FILE: u64 = 4 << 10;

/// The bytes of the regular file `path`, at most `max` of them; an error for anything else
/// (nothing but a regular file is opened, see [`open`]) or a larger file.
///
/// # Errors
/// The file cannot be opened or read, is not a regular file, or holds more than `max` bytes.
pub(crate) fn read_regular_file(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other(format!(
            "{} is {}",
            path.display(),
            not_a_file(&meta)
        )));
    }
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::other(format!(
            "{} is {} bytes, more than {max}",
            path.display(),
            meta.len()
        )));
    }
    Ok(bytes)
}

/// What a non-regular file is, for messages ("a FIFO (named pipe)").
pub(crate) fn not_a_file(meta: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "not a regular file"
    }
}
