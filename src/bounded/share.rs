//! A count many holders share (the endpoints of a wildcard Backend's hosts, of undeclared
//! destinations): each holds a part, resized as it needs, given back when dropped. A holder
//! always gets one when it asks for any, so no holder is starved by the others: the parts
//! together are at most the share's size, plus one per holder once the share is spent.

use std::sync::{Arc, Mutex};

/// The shared count.
#[derive(Debug)]
pub(crate) struct Share {
    max: usize,
    used: Mutex<usize>,
}

impl Share {
    pub(crate) fn new(max: usize) -> Self {
        Share {
            max,
            used: Mutex::new(0),
        }
    }

    /// Held now by every part together.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        *self.lock()
    }

    /// An empty part.
    pub(crate) fn part(self: &Arc<Self>) -> Part {
        Part {
            share: self.clone(),
            held: 0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, usize> {
        // A single number, always consistent: poisoning is not a reason to fail.
        self.used.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One holder's part; given back when dropped.
#[derive(Debug)]
pub(crate) struct Part {
    share: Arc<Share>,
    held: usize,
}

impl Part {
    /// Resizes the part to `wanted`, as far as what the other parts hold leaves room (but at
    /// least one when `wanted` is not zero); returns the size now held.
    pub(crate) fn resize(&mut self, wanted: usize) -> usize {
        let mut used = self.share.lock();
        let others = used.saturating_sub(self.held);
        let room = self.share.max.saturating_sub(others);
        let held = wanted.min(room).max(wanted.min(1));
        *used = others + held;
        self.held = held;
        held
    }
}

impl Drop for Part {
    fn drop(&mut self) {
        let mut used = self.share.lock();
        *used = used.saturating_sub(self.held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_fit_the_share_and_each_gets_at_least_one() {
        let share = Arc::new(Share::new(10));
        let (mut a, mut b, mut c) = (share.part(), share.part(), share.part());
        assert_eq!(a.resize(8), 8);
        assert_eq!(b.resize(8), 2, "what a left");
        assert_eq!(c.resize(8), 1, "one however full");
        assert_eq!(share.used(), 11);
        assert_eq!(a.resize(3), 3, "shrinking gives back");
        drop(c);
        assert_eq!(b.resize(8), 7);
        assert_eq!(share.used(), 10);
        drop((a, b));
        assert_eq!(share.used(), 0);
    }
}
