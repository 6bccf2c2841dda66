//! `ProxyConfig.spec.downstream` → [`DownstreamSettings`] and [`Http2ServerSettings`]:
//! defaults filled in, each value checked against the range HTTP/2 (RFC 9113 §6.5.2), h2 and
//! hyper accept.

use std::path::Path;
use std::time::Duration;

use super::{at, Cx};
use crate::config::units::{GwDuration, Quantity};
use crate::config::wire::enums::EscapedSlashesAction;
use crate::config::wire::proxy::{DownstreamHttp2Spec, DownstreamPathsSpec, DownstreamSpec};
use crate::config::yaml::Spanned;
use crate::config::{ObjectId, Reason};
use crate::snapshot::{DownstreamSettings, Http2ServerSettings, RequestHeadLimits};
use crate::snapshot::{EscapedSlashes, PathRules};

const FIELD: &str = "spec.downstream.http2";

/// The connection limits, timeouts and request head bounds `spec` asks for; a value out of
/// range is an error at its position, and the default stands in for it.
pub(super) fn compile_limits(
    cx: &mut Cx,
    file: &Path,
    id: &ObjectId,
    spec: &DownstreamSpec,
) -> DownstreamSettings {
    let defaults = DownstreamSettings::default();
    let mut check = Checker {
        cx,
        file,
        id,
        field: "spec.downstream",
    };
    let head = RequestHeadLimits {
        max_bytes: check.size(
            spec.max_request_headers_bytes.as_ref(),
            "maxRequestHeadersBytes",
            defaults.head.max_bytes,
            (RequestHeadLimits::MIN_BYTES, u32::MAX as usize),
            "a smaller head cannot hold an ordinary request",
        ),
        max_headers: check.count(
            spec.max_request_headers.as_ref(),
            "maxRequestHeaders",
            defaults.head.max_headers,
            "no request could carry a Host header",
        ),
        max_uri_bytes: check.size(
            spec.max_request_uri_bytes.as_ref(),
            "maxRequestUriBytes",
            defaults.head.max_uri_bytes,
            (1, u32::MAX as usize),
            "a request target has at least one byte",
        ),
        max_method_bytes: check.count(
            spec.max_request_method_bytes.as_ref(),
            "maxRequestMethodBytes",
            defaults.head.max_method_bytes,
            "no request could have a method",
        ),
    };
    DownstreamSettings {
        max_connections: check.count(
            spec.max_connections.as_ref(),
            "maxConnections",
            defaults.max_connections,
            "no client could connect",
        ),
        header_read_timeout: check.timeout(
            spec.header_read_timeout.as_ref(),
            "headerReadTimeout",
            defaults.header_read_timeout,
            "a client that connects and sends nothing then holds its connection forever",
        ),
        idle_timeout: check.timeout(
            spec.idle_timeout.as_ref(),
            "idleTimeout",
            defaults.idle_timeout,
            "idle keep-alive and HTTP/2 connections then stay open until the client closes them",
        ),
        send_timeout: check.timeout(
            spec.send_timeout.as_ref(),
            "sendTimeout",
            defaults.send_timeout,
            "a client that stops reading then holds its response and the upstream connection forever",
        ),
        head,
        paths: spec
            .paths
            .as_ref()
            .map_or(defaults.paths, |paths| compile_paths(check.cx, file, id, paths)),
    }
}

/// `spec.downstream.paths`; `normalize: false` is allowed but reported as Degraded.
fn compile_paths(cx: &mut Cx, file: &Path, id: &ObjectId, spec: &DownstreamPathsSpec) -> PathRules {
    let defaults = PathRules::default();
    let normalize = match &spec.normalize {
        Some(off) if !off.value => {
            cx.warn(
                at(file, id, off.pos, "spec.downstream.paths.normalize"),
                Reason::Degraded,
                "paths are not normalised: routes match `/public/../admin` as sent, and the \
                 upstream may serve `/admin`",
                "leave it out for the default (true)",
            );
            false
        }
        Some(on) => on.value,
        None => defaults.normalize,
    };
    PathRules {
        normalize,
        merge_slashes: spec.merge_slashes.unwrap_or(defaults.merge_slashes),
        escaped_slashes: match spec.escaped_slashes {
            None => defaults.escaped_slashes,
            Some(EscapedSlashesAction::KeepUnchanged) => EscapedSlashes::KeepUnchanged,
            Some(EscapedSlashesAction::RejectRequest) => EscapedSlashes::RejectRequest,
            Some(EscapedSlashesAction::UnescapeAndForward) => EscapedSlashes::UnescapeAndForward,
        },
    }
}

/// `spec.admin.maxConnections`, at least 1.
pub(super) fn compile_admin_max_connections(
    cx: &mut Cx,
    file: &Path,
    id: &ObjectId,
    value: Option<&Spanned<u32>>,
    default: usize,
) -> usize {
    Checker {
        cx,
        file,
        id,
        field: "spec.admin",
    }
    .count(
        value,
        "maxConnections",
        default,
        "the admin server (readiness, metrics) could not be reached",
    )
}

/// The settings `spec` asks for; a value out of range is an error at its position, and the
/// default stands in for it (the config is rejected anyway).
pub(super) fn compile_http2(
    cx: &mut Cx,
    file: &Path,
    id: &ObjectId,
    spec: &DownstreamHttp2Spec,
) -> Http2ServerSettings {
    let defaults = Http2ServerSettings::default();
    let mut check = Checker {
        cx,
        file,
        id,
        field: FIELD,
    };
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
    /// The section the checked fields are in, e.g. `spec.downstream`.
    field: &'a str,
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
                at(
                    self.file,
                    self.id,
                    value.pos,
                    format!("{}.{name}", self.field),
                ),
                format!("{name} must be at least 1"),
                format!("with 0 {zero}; leave it out for the default"),
            );
            return default;
        }
        T::try_from(value.value).unwrap_or(default)
    }

    /// A timeout; `0s` turns it off, which is allowed but reported as Degraded with what
    /// `off` then permits.
    fn timeout(
        &mut self,
        value: Option<&Spanned<GwDuration>>,
        name: &str,
        default: Option<Duration>,
        off: &str,
    ) -> Option<Duration> {
        let Some(value) = value else {
            return default;
        };
        if value.value.0.is_zero() {
            self.cx.warn(
                at(
                    self.file,
                    self.id,
                    value.pos,
                    format!("{}.{name}", self.field),
                ),
                Reason::Degraded,
                format!("{name} 0s turns the timeout off: {off}"),
                "leave it out for the default",
            );
            return None;
        }
        Some(value.value.0)
    }

    /// A byte size within `min..=max` (both inclusive); `why` explains the range.
    fn size<T>(
        &mut self,
        value: Option<&Spanned<Quantity>>,
        name: &str,
        default: T,
        (min, max): (T, T),
        why: &str,
    ) -> T
    where
        T: TryFrom<u64> + PartialOrd + Copy + std::fmt::Display,
    {
        let Some(value) = value else {
            return default;
        };
        match T::try_from(value.value.0) {
            Ok(bytes) if min <= bytes && bytes <= max => bytes,
            _ => {
                self.cx.error(
                    at(
                        self.file,
                        self.id,
                        value.pos,
                        format!("{}.{name}", self.field),
                    ),
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
