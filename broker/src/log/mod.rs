//! Log storage (being written).
