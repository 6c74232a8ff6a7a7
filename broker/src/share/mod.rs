//! Share groups (KIP-932), the parts that need no I/O:
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
//!   partition and the record each request appends.
//!
//! No share-group API is in ApiVersions yet: the coordinator runtime, the
//! handlers and the persister that put these together do not exist, and
//! until they do the APIs stay absent.

pub mod config;
pub mod group;
pub mod partition;
pub mod records;
pub mod session;
pub mod state;
pub mod store;
