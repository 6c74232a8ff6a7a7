//! Partition replication between brokers, in Kafka's model: the leader side
//! (`leader.rs`: the ISR manager) and the follower side (`fetcher.rs`:
//! followers fetch from the leader).

pub mod fetcher;
pub mod leader;
