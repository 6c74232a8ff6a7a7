//! Share groups (KIP-932):
//!
//! - `config`: the broker's `group.share.*` keys and a group's `share.*`
//!   configs, with Kafka's defaults and bounds;
//! - `group`: membership and assignment (ShareGroupHeartbeat);
//! - `session`: share sessions (the ShareSessionEpoch of ShareFetch and
//!   ShareAcknowledge);
//! - `partition`: a share-partition's records (states, delivery counts,
//!   acquisition locks, the start offset and window), as Kafka's
//!   `SharePartition` keeps them;
//! - `state`: the persisted state and how an update folds into it;
//! - `records`: the `__share_group_state` record formats;
//! - `store`: the share coordinator's state for one `__share_group_state`
//!   partition and the record each request appends;
//! - `coordinator`: the share coordinator itself, on the
//!   `__share_group_state` partitions this node leads (the durable state
//!   behind the Initialize/Read/Write/Delete/ReadSummary share-group-state
//!   APIs);
//! - `persister`: how a share-partition leader reaches the coordinator of a
//!   share-partition, on this node or another;
//! - `leader`: the share-partitions on their partition's leader, loaded
//!   through the persister and written back before a change takes effect;
//! - `dlq`: the dead-letter queue (KIP-1191) that rejected and exhausted
//!   records are copied to.
//!
//! The client-facing APIs are in `handlers/`: ShareGroupHeartbeat and
//! ShareGroupDescribe on the group coordinator (`coordinator/share.rs`
//! holds the share groups beside classic and consumer groups), ShareFetch
//! and ShareAcknowledge on the partition leaders (`leader`), and the
//! share-group offset APIs (Describe/Alter/DeleteShareGroupOffsets) through
//! the persister.

pub mod config;
pub mod coordinator;
pub mod dlq;
pub mod group;
pub mod group_records;
pub mod leader;
pub mod partition;
pub mod persister;
pub mod records;
pub mod session;
pub mod state;
pub mod store;
