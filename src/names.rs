//! Host names: what every layer agrees on about them (a leaf module: it imports nothing of
//! egressd, so the config loader, the request path and telemetry can all use it).

/// The longest host name (RFC 1035 §2.3.4: 255 octets on the wire, 253 as text).
pub const MAX_HOST_LEN: usize = 253;
