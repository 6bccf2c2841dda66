//! The ClientHello/SNI reader of Passthrough listeners, on the first bytes of a connection.
//!
//! Besides never panicking: the reader looks at a growing buffer (each TCP read appends), so a
//! verdict other than `NeedMore` must not change when more bytes arrive, and a shorter prefix
//! says `NeedMore` or the same verdict; a server name is lower-case visible ASCII, and goes
//! through `canonical_host` as the listener sends it.

#![no_main]

use egressd::listener::sni::{peek_client_hello, Peek};
use egressd::upstream::address::canonical_host;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let verdict = peek_client_hello(data);
    if let Peek::Hello(Some(name)) = &verdict {
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_graphic() && !b.is_ascii_uppercase()),
            "server name {name:?} is not lower-case visible ASCII"
        );
        let _ = canonical_host(name);
    }
    // Shorter prefixes: a few cuts, cheap enough for every input.
    for cut in [
        data.len() / 2,
        data.len().saturating_sub(1),
        data.len() / 3 * 2,
    ] {
        let shorter = peek_client_hello(&data[..cut]);
        assert!(
            shorter == Peek::NeedMore || shorter == verdict,
            "prefix of {cut} bytes says {shorter:?}, the whole {verdict:?}"
        );
    }
    if verdict != Peek::NeedMore {
        let mut longer = data.to_vec();
        longer.extend_from_slice(data);
        assert_eq!(
            peek_client_hello(&longer),
            verdict,
            "more bytes changed the verdict"
        );
    }
});
