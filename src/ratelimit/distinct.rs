//! The counters of a `Distinct` rule (placeholder until the counting core lands).

use super::{Decision, Quota};

#[derive(Debug, Default)]
pub(crate) struct DistinctCounters;

impl DistinctCounters {
    pub(crate) fn new(_max_entries: usize) -> Self {
        DistinctCounters
    }
    pub(crate) fn value_hash(&self, _value: &[u8]) -> u64 {
        0
    }
    pub(crate) fn acquire(&self, _key: u64, quota: Quota, _now_ms: u64) -> Decision {
        Decision {
            allowed: true,
            remaining: quota.requests,
            reset: quota.period,
        }
    }
    pub(crate) fn release(&self, _key: u64, _quota: Quota, _now_ms: u64) {}
    pub(crate) fn len(&self) -> usize {
        0
    }
    pub(crate) fn evicted(&self) -> u64 {
        0
    }
    pub(crate) fn max_bytes(&self) -> usize {
        0
    }
    pub(crate) fn used_max(&self, _quota: Quota, _now_ms: u64) -> u32 {
        0
    }
}
