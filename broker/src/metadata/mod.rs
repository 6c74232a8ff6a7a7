//! Cluster metadata (being written).
