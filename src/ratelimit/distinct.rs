//! The counters of a `Distinct` rule (to be written).
