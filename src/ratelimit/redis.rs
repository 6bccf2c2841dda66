//! Global limits in Redis (to be written).
