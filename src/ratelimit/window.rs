//! One rule's sliding-window counter (to be written).
