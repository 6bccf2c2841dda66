//! One rule's sliding-window counter (placeholder until the counting core lands).

use super::{Decision, Quota};

#[derive(Debug, Default)]
pub(crate) struct WindowCounter;

impl WindowCounter {
    pub(crate) fn acquire(&self, quota: Quota, _now_ms: u64) -> Decision {
        Decision {
            allowed: true,
            remaining: quota.requests,
            reset: quota.period,
        }
    }
    pub(crate) fn release(&self, _quota: Quota, _now_ms: u64) {}
    pub(crate) fn used(&self, _quota: Quota, _now_ms: u64) -> u32 {
        0
    }
}
