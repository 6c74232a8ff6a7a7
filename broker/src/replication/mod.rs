//! Replication between brokers (issue 6): the leader side (`leader`: the ISR
//! manager) and the follower side (`fetcher`).

pub mod fetcher;
pub mod leader;
