//! Partition replication between brokers, in Kafka's model: followers fetch
//! from the leader (`fetcher.rs`).

pub mod fetcher;
