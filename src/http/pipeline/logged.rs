//! The access log line of a request is written when its response body has been sent (or
//! abandoned), so it can say how many bytes went out, how long the whole exchange took, and
//! whether the client got all of it; egressd's own span (`tracing`) ends then too. Only used
//! while the access log or tracing is on.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use crate::http::body::{BodyError, ProxyBody};
use crate::snapshot::shared::Shared;
use crate::telemetry::access_log::{millis, AccessRecord};
use crate::telemetry::trace::{RequestSpan, SpanEnd};

/// `response` whose access log `record` is written (and `span` ended) when its body ends or
/// is dropped.
pub(super) fn log_when_done(
    shared: Arc<Shared>,
    response: Response<ProxyBody>,
    record: AccessRecord,
    span: Option<RequestSpan>,
    started: Instant,
) -> Response<ProxyBody> {
    response.map(|inner| {
        ProxyBody::Stream(Box::pin(LoggedBody {
            inner,
            pending: Some((shared, record, span)),
            started,
            bytes: 0,
            ended: false,
        }))
    })
}

struct LoggedBody {
    inner: ProxyBody,
    pending: Option<(Arc<Shared>, AccessRecord, Option<RequestSpan>)>,
    started: Instant,
    bytes: u64,
    ended: bool,
}

impl LoggedBody {
    fn write(&mut self) {
        if let Some((shared, mut record, span)) = self.pending.take() {
            record.bytes_out = self.bytes;
            if let Some(counted) = record.bytes_in_counted.take() {
                record.bytes_in = Some(counted.load(std::sync::atomic::Ordering::Relaxed));
            }
            record.duration_ms = millis(self.started.elapsed());
            record.complete = self.ended || self.inner.is_end_stream();
            shared.access_log.write(&record);
            if let Some(span) = span {
                span.end(&SpanEnd::from(&record));
            }
        }
    }
}

impl Body for LoggedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.bytes += data.len() as u64;
                }
                if this.inner.is_end_stream() {
                    this.ended = true;
                    this.write();
                }
            }
            Poll::Ready(None) => {
                this.ended = true;
                this.write();
            }
            Poll::Ready(Some(Err(_))) => this.write(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for LoggedBody {
    fn drop(&mut self) {
        self.write();
    }
}
