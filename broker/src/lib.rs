//! The broker: a Kafka-wire-compatible server. See ARCHITECTURE.md for the map.

pub mod log;
pub mod metadata;
pub mod types;
