//! Earliest-deadline-first scheduling over weighted entries (the scheduler Envoy's weighted
//! balancers use): each entry is due at `now + 1/weight`; the earliest is picked and put back
//! with the weight it has at that moment, so a weight that changes with load (least request)
//! takes effect on the entry's next turn.

/// One entry of the schedule.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// When the entry is due (high 64 bits), then its insertion order (low 64 bits: equal
    /// deadlines go first in, first out), as one number: comparing two entries is one integer
    /// comparison, which compiles without branches. Deadlines are positive and finite, and such
    /// `f64`s order as their bits do.
    due: u128,
    index: u32,
}

impl Entry {
    fn deadline(&self) -> f64 {
        f64::from_bits((self.due >> 64) as u64)
    }
}

/// An EDF schedule over entries `0..n`: a binary min-heap on `due`.
#[derive(Debug)]
pub(crate) struct Edf {
    heap: Vec<Entry>,
    now: f64,
    order: u64,
}

/// Added to every weight so entries whose weights are exact multiples of each other do not tie
/// forever (Envoy does the same).
const EPSILON: f64 = 1e-13;

impl Edf {
    /// A schedule with entry `i` at weight `weight(i)`.
    pub(crate) fn new(n: usize, weight: impl Fn(usize) -> f64) -> Self {
        let mut edf = Edf {
            heap: Vec::with_capacity(n),
            now: 0.0,
            order: 0,
        };
        for i in 0..n {
            let entry = edf.entry(i as u32, weight(i));
            edf.heap.push(entry);
            sift_up(&mut edf.heap);
        }
        edf
    }

    /// Entry `index`, due one interval of `weight` from now.
    fn entry(&mut self, index: u32, weight: f64) -> Entry {
        let deadline = self.now + interval(weight);
        let order = self.order;
        self.order += 1;
        Entry {
            due: (u128::from(deadline.to_bits()) << 64) | u128::from(order),
            index,
        }
    }

    /// The next entry; it is put back with `weight(index)` as computed now.
    pub(crate) fn pick_and_add(&mut self, weight: impl Fn(usize) -> f64) -> Option<usize> {
        // The earliest entry is rescheduled where it stands (one sift down) rather than popped
        // and pushed again: the same order, half the heap work.
        let top = *self.heap.first()?;
        let index = top.index as usize;
        self.now = top.deadline();
        let next = self.entry(top.index, weight(index));
        sift_down_from_root(&mut self.heap, next);
        Some(index)
    }
}

/// Puts `entry` at the root of `heap` (replacing what was there) and moves it down to its place.
/// Each level takes the earlier child without a branch; the one branch, "is the entry earlier
/// than that child", is taken until the place is found.
fn sift_down_from_root(heap: &mut [Entry], entry: Entry) {
    let n = heap.len();
    let mut hole = 0;
    loop {
        let left = 2 * hole + 1;
        let child = if left + 1 < n {
            left + usize::from(heap[left + 1].due < heap[left].due)
        } else if left < n {
            left
        } else {
            break;
        };
        if entry.due < heap[child].due {
            break;
        }
        heap[hole] = heap[child];
        hole = child;
    }
    heap[hole] = entry;
}

/// Moves the last entry of `heap` up to its place.
fn sift_up(heap: &mut [Entry]) {
    let Some(mut hole) = heap.len().checked_sub(1) else {
        return;
    };
    let entry = heap[hole];
    while hole > 0 {
        let parent = (hole - 1) / 2;
        if heap[parent].due < entry.due {
            break;
        }
        heap[hole] = heap[parent];
        hole = parent;
    }
    heap[hole] = entry;
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

    /// The heap picks exactly what a scan for the earliest (deadline, insertion order) picks,
    /// with weights that change between picks (as least request's do) and many ties.
    #[test]
    fn picks_what_a_linear_scan_picks() {
        for n in [1usize, 2, 3, 7, 100] {
            let mut rng = fastrand::Rng::with_seed(n as u64);
            let mut weights: Vec<f64> = (0..n).map(|_| f64::from(rng.u32(1..4))).collect();
            let mut edf = Edf::new(n, |i| weights[i]);
            // The reference: (deadline, order) per entry, the earliest found by a scan.
            let mut reference: Vec<(f64, u64)> =
                (0..n).map(|i| (interval(weights[i]), i as u64)).collect();
            for order in n as u64..n as u64 + 5_000 {
                let i = rng.usize(..n);
                weights[i] = f64::from(rng.u32(1..4)) / f64::from(rng.u32(1..3));
                let picked = edf.pick_and_add(|i| weights[i]).unwrap();
                let (expected, &(now, _)) = reference
                    .iter()
                    .enumerate()
                    .min_by(|a, b| a.1 .0.total_cmp(&b.1 .0).then(a.1 .1.cmp(&b.1 .1)))
                    .unwrap();
                assert_eq!(picked, expected, "n = {n}");
                reference[expected] = (now + interval(weights[expected]), order);
            }
        }
    }
}
