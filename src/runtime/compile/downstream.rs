//! `ProxyConfig.spec.downstream` → [`Http2ServerSettings`]: defaults filled in, each value
//! checked against the range HTTP/2 (RFC 9113 §6.5.2) and h2 accept.

use std::path::Path;

use super::{at, Cx};
use crate::config::units::Quantity;
use crate::config::wire::proxy::DownstreamHttp2Spec;
use crate::config::yaml::Spanned;
use crate::config::ObjectId;
use crate::runtime::snapshot::Http2ServerSettings;

const FIELD: &str = "spec.downstream.http2";

/// The settings `spec` asks for; a value out of range is an error at its position, and the
/// default stands in for it (the config is rejected anyway).
pub(super) fn compile_http2(
    cx: &mut Cx,
    file: &Path,
    id: &ObjectId,
    spec: &DownstreamHttp2Spec,
) -> Http2ServerSettings {
    let defaults = Http2ServerSettings::default();
    let mut check = Checker { cx, file, id };
    Http2ServerSettings {
        max_concurrent_streams: check.count(
            spec.max_concurrent_streams.as_ref(),
            "maxConcurrentStreams",
            defaults.max_concurrent_streams,
            "a client could not send any request",
        ),
        max_header_list_size: check.size(
            spec.max_header_list_size.as_ref(),
            "maxHeaderListSize",
            defaults.max_header_list_size,
            (1, u32::MAX),
            "SETTINGS values are 32-bit",
        ),
        initial_stream_window_size: check.size(
            spec.initial_stream_window_size.as_ref(),
            "initialStreamWindowSize",
            defaults.initial_stream_window_size,
            (1, Http2ServerSettings::MAX_WINDOW_SIZE),
            "HTTP/2 windows are at most 2^31-1 bytes (RFC 9113 §6.9.1)",
        ),
        initial_connection_window_size: check.size(
            spec.initial_connection_window_size.as_ref(),
            "initialConnectionWindowSize",
            defaults.initial_connection_window_size,
            (
                Http2ServerSettings::SPEC_CONNECTION_WINDOW_SIZE,
                Http2ServerSettings::MAX_WINDOW_SIZE,
            ),
            "every connection starts with a 65535-byte window that can only be raised \
             (RFC 9113 §6.9.2), and windows are at most 2^31-1 bytes",
        ),
        max_pending_accept_reset_streams: check.count(
            spec.max_pending_accept_reset_streams.as_ref(),
            "maxPendingAcceptResetStreams",
            defaults.max_pending_accept_reset_streams,
            "the first cancelled request would close the connection",
        ),
        max_local_error_reset_streams: check.count(
            spec.max_local_error_reset_streams.as_ref(),
            "maxLocalErrorResetStreams",
            defaults.max_local_error_reset_streams,
            "the first stream error would close the connection",
        ),
    }
}

struct Checker<'a, 'c> {
    cx: &'c mut Cx,
    file: &'a Path,
    id: &'a ObjectId,
}

impl Checker<'_, '_> {
    /// A count that must be at least 1; `zero` says what 0 would do.
    fn count<T: TryFrom<u32> + Copy>(
        &mut self,
        value: Option<&Spanned<u32>>,
        name: &str,
        default: T,
        zero: &str,
    ) -> T {
        let Some(value) = value else {
            return default;
        };
        if value.value == 0 {
            self.cx.error(
                at(self.file, self.id, value.pos, format!("{FIELD}.{name}")),
                format!("{name} must be at least 1"),
                format!("with 0 {zero}; leave it out for the default"),
            );
            return default;
        }
        T::try_from(value.value).unwrap_or(default)
    }

    /// A byte size within `min..=max` (both inclusive); `why` explains the range.
    fn size(
        &mut self,
        value: Option<&Spanned<Quantity>>,
        name: &str,
        default: u32,
        (min, max): (u32, u32),
        why: &str,
    ) -> u32 {
        let Some(value) = value else {
            return default;
        };
        match u32::try_from(value.value.0) {
            Ok(bytes) if (min..=max).contains(&bytes) => bytes,
            _ => {
                self.cx.error(
                    at(self.file, self.id, value.pos, format!("{FIELD}.{name}")),
                    format!(
                        "{name} {} is out of range ({min} to {max} bytes)",
                        value.value
                    ),
                    format!("{why}; e.g. \"1Mi\""),
                );
                default
            }
        }
    }
}
