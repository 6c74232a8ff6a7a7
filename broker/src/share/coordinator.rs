//! The share coordinator: every share-partition's durable state (start
//! offset, state batches with delivery counts, state and leader epochs) on
//! `__share_group_state`, in Kafka's record formats, as Kafka's
//! `ShareCoordinatorService` keeps it.
//!
//! The coordinator of a share-partition is the leader of partition
//! `abs(javaHash("group:topicId:partition")) % partitions` of the topic, so
//! the state moves with that partition's leadership and is replicated like
//! any internal topic. A node loads a partition it comes to lead by
//! replaying its records into a [`ShareStateStore`] and drops it when it
//! stops leading it.
//!
//! Invariants:
//! - a request's record is appended and replicated to the in-sync replicas
//!   (acks=all) before it is replayed and answered: what a reader sees is
//!   durable;
//! - the writes of one `__share_group_state` partition are serialized, so
//!   each record is computed from the state every earlier record left.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, RwLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use uuid::Uuid;

use super::records::{self, SharePartitionKey, ShareRecord};
use super::state::ShareState;
use super::store::{ShareStateStore, StoreError, Write};
use crate::broker::{now_ms, Broker, CreateTopicError, NewTopic};
use crate::error::PartitionError;
use crate::replica_manager::ReplicaManager;
use crate::types::TopicPartition;

pub const SHARE_STATE_TOPIC: &str = "__share_group_state";

/// `share.coordinator.load.buffer.size`.
const LOAD_READ_BYTES: usize = 5 << 20;
/// `share.coordinator.write.timeout.ms`.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Kafka's message for a read before InitializeShareGroupState.
pub const UNINITIALIZED_READ: &str = "Read operation on uninitialized share partition not allowed.";

/// Why a share-state request failed, as the response's error code.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShareCoordError {
    #[error("this node does not coordinate the share-partition")]
    NotCoordinator,
    #[error("the share coordinator is not available")]
    CoordinatorNotAvailable,
    #[error("{0}")]
    InvalidRequest(&'static str),
    /// A read of a share-partition never initialized (or deleted): Kafka's
    /// INVALID_REQUEST with this message, the one answer after which a
    /// leader may initialize the state itself.
    #[error("{UNINITIALIZED_READ}")]
    Uninitialized,
    #[error("unknown topic or partition")]
    UnknownTopicOrPartition,
    #[error("the leader epoch is older than the stored one")]
    FencedLeaderEpoch,
    #[error("the state epoch is older than the stored one")]
    FencedStateEpoch,
    #[error("the write was not replicated in time")]
    RequestTimedOut,
    #[error("the caller may not act on the cluster (ClusterAction)")]
    ClusterAuthorizationFailed,
}

impl ShareCoordError {
    pub fn code(&self) -> i16 {
        use kafka_protocol::ResponseError as E;
        match self {
            ShareCoordError::NotCoordinator => E::NotCoordinator.code(),
            ShareCoordError::CoordinatorNotAvailable => E::CoordinatorNotAvailable.code(),
            ShareCoordError::InvalidRequest(_) | ShareCoordError::Uninitialized => {
                E::InvalidRequest.code()
            }
            ShareCoordError::UnknownTopicOrPartition => E::UnknownTopicOrPartition.code(),
            ShareCoordError::FencedLeaderEpoch => E::FencedLeaderEpoch.code(),
            ShareCoordError::FencedStateEpoch => E::FencedStateEpoch.code(),
            ShareCoordError::RequestTimedOut => E::RequestTimedOut.code(),
            ShareCoordError::ClusterAuthorizationFailed => E::ClusterAuthorizationFailed.code(),
        }
    }
}

impl From<StoreError> for ShareCoordError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::FencedLeaderEpoch => ShareCoordError::FencedLeaderEpoch,
            StoreError::FencedStateEpoch => ShareCoordError::FencedStateEpoch,
        }
    }
}

/// What ReadShareGroupStateSummary answers: the state without its batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateSummary {
    pub state_epoch: i32,
    pub leader_epoch: i32,
    /// -1: the share-partition has no state (never initialized, or deleted).
    pub start_offset: i64,
    /// Records at or past the start offset that are done (acknowledged or
    /// archived); -1 when unknown. A group's lag on the partition is its
    /// end offset less the start offset less this (Kafka's
    /// `deliveryCompleteCount`).
    pub delivery_complete_count: i64,
}

/// The share-partitions of one `__share_group_state` partition.
struct Shard {
    partition: i32,
    leader_epoch: i32,
    store: tokio::sync::Mutex<ShareStateStore>,
    /// Cleared when this node stops leading the partition.
    alive: AtomicBool,
}

#[derive(Default)]
struct Shards {
    partitions: i32,
    by_partition: HashMap<i32, Arc<Shard>>,
}

pub struct ShareCoordinator {
    shards: RwLock<Shards>,
    ownership: tokio::sync::Mutex<()>,
    broker: OnceLock<Weak<Broker>>,
    updates_per_snapshot: u32,
}

/// Kafka's `SharePartitionKey.asCoordinatorKey`: the string FindCoordinator
/// (key type SHARE) carries and the partition is hashed from. A topic id
/// prints as Kafka's `Uuid.toString`, URL-safe base64 without padding.
pub fn coordinator_key(group_id: &str, topic_id: Uuid, partition: i32) -> String {
    use base64::Engine;
    let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(topic_id.as_bytes());
    format!("{group_id}:{id}:{partition}")
}

impl ShareCoordinator {
    /// `updates_per_snapshot` is
    /// `share.coordinator.snapshot.update.records.per.snapshot`.
    pub fn new(updates_per_snapshot: u32) -> Self {
        ShareCoordinator {
            shards: Default::default(),
            ownership: tokio::sync::Mutex::new(()),
            broker: OnceLock::new(),
            updates_per_snapshot,
        }
    }

    pub fn attach(&self, broker: &Arc<Broker>) {
        let _ = self.broker.set(Arc::downgrade(broker));
    }

    fn broker(&self) -> Option<Arc<Broker>> {
        self.broker.get().and_then(Weak::upgrade)
    }

    /// The broker this coordinator belongs to, for callers that hold only
    /// a reference to it.
    pub fn owner(&self) -> Option<Arc<Broker>> {
        self.broker()
    }

    pub fn stop(&self) {
        let mut shards = self.shards.write().expect("poisoned");
        for (_, shard) in shards.by_partition.drain() {
            shard.alive.store(false, Ordering::SeqCst);
        }
    }

    /// The partition of `__share_group_state` that holds `coordinator_key`.
    pub fn partition_for(broker: &Broker, coordinator_key: &str) -> i32 {
        broker.internal_partition_for(
            SHARE_STATE_TOPIC,
            coordinator_key,
            broker.config.share.state_topic_partitions,
        )
    }

    fn shard(&self, key: &SharePartitionKey) -> Result<Arc<Shard>, ShareCoordError> {
        let shards = self.shards.read().expect("poisoned");
        if shards.partitions == 0 {
            return Err(ShareCoordError::NotCoordinator);
        }
        let p = crate::group::offsets::partition_for(
            &coordinator_key(&key.group_id, key.topic_id, key.partition),
            shards.partitions,
        );
        shards
            .by_partition
            .get(&p)
            .cloned()
            .ok_or(ShareCoordError::NotCoordinator)
    }

    /// Follows leadership of `__share_group_state`: loads each partition
    /// this node has come to lead and drops those it no longer leads.
    /// Returns how many share-partitions it loaded.
    pub async fn sync_ownership(&self, broker: &Arc<Broker>) -> Result<usize, PartitionError> {
        let _serial = self.ownership.lock().await;
        let (count, led) = broker.led_partitions(SHARE_STATE_TOPIC);
        let gained: Vec<(i32, i32)> = {
            let mut shards = self.shards.write().expect("poisoned");
            let same_count = shards.partitions == count;
            let lost: Vec<i32> = shards
                .by_partition
                .iter()
                .filter(|(p, s)| !(same_count && led.get(p) == Some(&s.leader_epoch)))
                .map(|(p, _)| *p)
                .collect();
            for p in lost {
                if let Some(shard) = shards.by_partition.remove(&p) {
                    shard.alive.store(false, Ordering::SeqCst);
                    tracing::info!(
                        partition = p,
                        "no longer coordinating the share-partitions of {SHARE_STATE_TOPIC} partition"
                    );
                }
            }
            shards.partitions = count;
            led.iter()
                .filter(|(p, _)| !shards.by_partition.contains_key(p))
                .map(|(p, e)| (*p, *e))
                .collect()
        };
        let mut loaded = 0;
        for (p, epoch) in gained {
            let replicas = broker.replicas.clone();
            let per_snapshot = self.updates_per_snapshot;
            let store =
                tokio::task::spawn_blocking(move || load_partition(&replicas, p, per_snapshot))
                    .await
                    .map_err(|e| PartitionError::Storage(e.to_string()))??;
            loaded += store.len();
            tracing::info!(
                partition = p,
                leader_epoch = epoch,
                share_partitions = store.len(),
                "coordinating the share-partitions of {SHARE_STATE_TOPIC} partition"
            );
            let shard = Arc::new(Shard {
                partition: p,
                leader_epoch: epoch,
                store: tokio::sync::Mutex::new(store),
                alive: AtomicBool::new(true),
            });
            self.shards
                .write()
                .expect("poisoned")
                .by_partition
                .insert(p, shard);
        }
        Ok(loaded)
    }

    /// InitializeShareGroupState: the share-partition starts over at
    /// `start_offset` with `state_epoch` (a group starts consuming it, or
    /// its offsets were altered).
    pub async fn initialize(
        &self,
        key: &SharePartitionKey,
        state_epoch: i32,
        start_offset: i64,
    ) -> Result<(), ShareCoordError> {
        if state_epoch < 0 {
            return Err(ShareCoordError::InvalidRequest(
                "The state epoch cannot be a negative number.",
            ));
        }
        self.check_key(key)?;
        let shard = self.shard(key)?;
        let store = shard.store.lock().await;
        let record = store.initialize(key, state_epoch, start_offset, now_ms())?;
        self.append(&shard, store, vec![record]).await
    }

    /// ReadShareGroupState: the whole state, for a leader loading the
    /// share-partition. A read with a newer leader epoch records that epoch
    /// first, fencing the previous leader's writes.
    pub async fn read(
        &self,
        key: &SharePartitionKey,
        leader_epoch: i32,
    ) -> Result<ShareState, ShareCoordError> {
        if leader_epoch < 0 {
            return Err(ShareCoordError::InvalidRequest(
                "The leader epoch cannot be a negative number.",
            ));
        }
        self.check_key(key)?;
        let shard = self.shard(key)?;
        let store = shard.store.lock().await;
        let state = store
            .read(key, leader_epoch)?
            .cloned()
            .ok_or(ShareCoordError::Uninitialized)?;
        if leader_epoch > state.leader_epoch {
            let bump = Write {
                state_epoch: state.state_epoch,
                leader_epoch,
                start_offset: -1,
                batches: Vec::new(),
            };
            let record = store.write(key, &bump, now_ms())?;
            self.append(&shard, store, vec![record]).await?;
            return Ok(ShareState {
                leader_epoch,
                ..state
            });
        }
        Ok(state)
    }

    /// ReadShareGroupStateSummary: the epochs and start offset (-1 when the
    /// share-partition has no state).
    pub async fn read_summary(
        &self,
        key: &SharePartitionKey,
    ) -> Result<StateSummary, ShareCoordError> {
        self.check_key(key)?;
        let shard = self.shard(key)?;
        let store = shard.store.lock().await;
        Ok(match store.read(key, -1)? {
            Some(s) => StateSummary {
                state_epoch: s.state_epoch,
                leader_epoch: s.leader_epoch,
                start_offset: s.start_offset,
                delivery_complete_count: s.delivery_complete_count(),
            },
            None => StateSummary {
                state_epoch: 0,
                leader_epoch: 0,
                start_offset: -1,
                delivery_complete_count: -1,
            },
        })
    }

    /// WriteShareGroupState: a share-partition leader's acknowledgements,
    /// releases and acquisitions, laid over the stored state.
    pub async fn write(&self, key: &SharePartitionKey, w: &Write) -> Result<(), ShareCoordError> {
        if w.leader_epoch < 0 {
            return Err(ShareCoordError::InvalidRequest(
                "The leader epoch cannot be a negative number.",
            ));
        }
        if w.state_epoch < 0 {
            return Err(ShareCoordError::InvalidRequest(
                "The state epoch cannot be a negative number.",
            ));
        }
        self.check_key(key)?;
        let shard = self.shard(key)?;
        let store = shard.store.lock().await;
        if store.read(key, -1)?.is_none() {
            return Err(ShareCoordError::InvalidRequest(
                "Write operation on uninitialized share partition not allowed.",
            ));
        }
        let record = store.write(key, w, now_ms())?;
        self.append(&shard, store, vec![record]).await
    }

    /// DeleteShareGroupState: tombstones for the share-partition's records.
    /// Deleting a state that does not exist succeeds.
    pub async fn delete(&self, key: &SharePartitionKey) -> Result<(), ShareCoordError> {
        self.check_key(key)?;
        let shard = self.shard(key)?;
        let store = shard.store.lock().await;
        let records = store.delete(key);
        if records.is_empty() {
            return Ok(());
        }
        self.append(&shard, store, records).await
    }

    /// Writes a fresh snapshot of every share-partition whose last one is
    /// at least `interval_ms` old (see [`ShareStateStore::cold_snapshots`]),
    /// one batch per `__share_group_state` partition. Returns how many.
    pub async fn snapshot_cold(&self, interval_ms: i64) -> usize {
        let shards: Vec<Arc<Shard>> = self
            .shards
            .read()
            .expect("poisoned")
            .by_partition
            .values()
            .cloned()
            .collect();
        let mut written = 0;
        for shard in shards {
            let store = shard.store.lock().await;
            let records = store.cold_snapshots(now_ms(), interval_ms);
            if records.is_empty() {
                continue;
            }
            let n = records.len();
            match self.append(&shard, store, records).await {
                Ok(()) => written += n,
                Err(e) => {
                    tracing::info!(partition = shard.partition, error = %e, "writing cold snapshots failed")
                }
            }
        }
        written
    }

    /// Kafka's request checks: a nil topic id or a negative partition is
    /// INVALID_REQUEST; a topic or partition the metadata does not have is
    /// UNKNOWN_TOPIC_OR_PARTITION.
    fn check_key(&self, key: &SharePartitionKey) -> Result<(), ShareCoordError> {
        if key.topic_id.is_nil() {
            return Err(ShareCoordError::InvalidRequest(
                "The topic id cannot be null.",
            ));
        }
        if key.partition < 0 {
            return Err(ShareCoordError::InvalidRequest(
                "The partition id cannot be a negative number.",
            ));
        }
        let broker = self
            .broker()
            .ok_or(ShareCoordError::CoordinatorNotAvailable)?;
        let image = broker.metadata.image();
        let known = image
            .topic_by_id(key.topic_id)
            .is_some_and(|t| (key.partition as usize) < t.partitions.len());
        if known {
            Ok(())
        } else {
            Err(ShareCoordError::UnknownTopicOrPartition)
        }
    }

    /// Appends `records` to the shard's partition as one batch, waits for
    /// the in-sync replicas, then replays them. Holds the shard's store for
    /// the whole write, so the next record is computed from this one.
    async fn append(
        &self,
        shard: &Arc<Shard>,
        mut store: tokio::sync::MutexGuard<'_, ShareStateStore>,
        records: Vec<ShareRecord>,
    ) -> Result<(), ShareCoordError> {
        let broker = self
            .broker()
            .ok_or(ShareCoordError::CoordinatorNotAvailable)?;
        let now = now_ms();
        let encoded = records
            .iter()
            .map(encode)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| ShareCoordError::InvalidRequest("the state cannot be encoded"))?;
        let encoded = crate::replica_manager::coordinator_records(encoded, None, now);
        let replicas = broker.replicas.clone();
        let partition = shard.partition;
        let appended = tokio::task::spawn_blocking(move || {
            let tp = TopicPartition::new(SHARE_STATE_TOPIC, partition);
            let part = replicas
                .get(&tp)
                .ok_or(PartitionError::NotLeaderOrFollower)?;
            crate::replica_manager::append_internal(&replicas, part, &encoded, now)
        })
        .await
        .map_err(|_| PartitionError::Storage("append interrupted".into()))
        .and_then(|r| r);
        let acked = match appended {
            Ok(mut a) => {
                let deadline = tokio::time::Instant::now() + WRITE_TIMEOUT;
                crate::replica_manager::wait_for_ack(&a.part, a.required, &mut a.events, deadline)
                    .await
            }
            Err(e) => Err(e),
        };
        match acked {
            Ok(()) if shard.alive.load(Ordering::SeqCst) => {
                for r in &records {
                    store.replay(r);
                }
                Ok(())
            }
            Ok(()) => Err(ShareCoordError::NotCoordinator),
            Err(e) => {
                tracing::info!(partition, error = %e, "writing share-group state failed");
                Err(match e {
                    PartitionError::RequestTimedOut => ShareCoordError::RequestTimedOut,
                    PartitionError::NotLeaderOrFollower | PartitionError::Storage(_) => {
                        ShareCoordError::NotCoordinator
                    }
                    _ => ShareCoordError::CoordinatorNotAvailable,
                })
            }
        }
    }
}

/// Creates `__share_group_state` if it does not exist, with Kafka's
/// configs (`ShareCoordinatorService.shareGroupStateTopicConfigs`: delete
/// policy, the producer's compression, its own segment size and min ISR),
/// and loads the share-partitions this node then coordinates.
pub async fn ensure_state_topic(broker: &Broker) -> Result<(), String> {
    if !broker
        .metadata
        .image()
        .topics
        .contains_key(SHARE_STATE_TOPIC)
    {
        let c = &broker.config.share;
        let configs = [
            ("cleanup.policy", "delete".to_string()),
            ("compression.type", "producer".to_string()),
            ("segment.bytes", "104857600".to_string()),
            ("min.insync.replicas", c.state_topic_min_isr.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let topic = NewTopic {
            name: SHARE_STATE_TOPIC.to_string(),
            num_partitions: c.state_topic_partitions,
            replication_factor: c.state_topic_replication_factor,
            assignments: Vec::new(),
            configs,
        };
        match broker.create_topic(topic, false).await {
            Ok(_) | Err(CreateTopicError::TopicAlreadyExists(_)) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot create {SHARE_STATE_TOPIC}");
                return Err(e.to_string());
            }
        }
    }
    if let Some(me) = broker.share_state.owner() {
        if let Err(e) = broker.share_state.sync_ownership(&me).await {
            tracing::warn!(error = %e, "loading share-group state after creating {SHARE_STATE_TOPIC}");
        }
    }
    Ok(())
}

/// One record of `__share_group_state` as its key and value.
fn encode(
    r: &ShareRecord,
) -> Result<(Bytes, Option<Bytes>), crate::group::records::RecordFormatError> {
    Ok(match r {
        ShareRecord::Snapshot(k, Some(v)) => {
            let (k, v) = records::encode_snapshot(k, v)?;
            (k, Some(v))
        }
        ShareRecord::Update(k, Some(v)) => {
            let (k, v) = records::encode_update(k, v)?;
            (k, Some(v))
        }
        ShareRecord::Snapshot(k, None) => {
            (records::encode_key(records::SNAPSHOT_KEY_TYPE, k)?, None)
        }
        ShareRecord::Update(k, None) => (records::encode_key(records::UPDATE_KEY_TYPE, k)?, None),
        ShareRecord::Other { .. } => {
            unreachable!("the coordinator writes only its own record types")
        }
    })
}

/// The state of every share-partition in one local partition of
/// `__share_group_state`, replayed from its log start. Disk work: runs on a
/// blocking thread.
fn load_partition(
    replicas: &ReplicaManager,
    p: i32,
    updates_per_snapshot: u32,
) -> Result<ShareStateStore, PartitionError> {
    let mut store = ShareStateStore::new(updates_per_snapshot);
    let tp = TopicPartition::new(SHARE_STATE_TOPIC, p);
    crate::replica_manager::for_each_internal_record(
        replicas,
        &tp,
        LOAD_READ_BYTES,
        |offset, key, value| {
            let Some(key) = key else { return };
            match records::decode(&key, value.as_deref()) {
                Ok(r) => store.replay(&r),
                Err(e) => {
                    tracing::warn!(partition = p, offset, error = %e, "skipping an undecodable {SHARE_STATE_TOPIC} record")
                }
            }
        },
    )?;
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coordinator_key_prints_the_topic_id_as_kafka_does() {
        // Kafka's Uuid.toString of 0x0123...: URL-safe base64, no padding.
        let id = Uuid::from_u128(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210);
        assert_eq!(coordinator_key("g", id, 7), "g:ASNFZ4mrze_-3LqYdlQyEA:7");
    }
}
