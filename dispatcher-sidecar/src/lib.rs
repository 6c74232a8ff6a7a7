//! The dispatcher sidecar (issue 7): a Kafka consumer that turns a partitioned
//! log into a per-message work queue.

pub mod lease;
