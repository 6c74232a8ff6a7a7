//! Kafka wire layer. Bytes in, typed requests out; typed responses in, bytes
//! out. Invariant: this crate knows nothing about tokio, sockets or clocks.

pub mod record_batch;

pub use kafka_protocol;
