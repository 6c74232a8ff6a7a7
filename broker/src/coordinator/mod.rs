//! The group coordinator's runtime: the async side of `group/`.
//!
//! `group/` decides; this module keeps the decisions' promises. It parks
//! JoinGroup/SyncGroup requests until a completion answers them, runs the
//! timers that call `tick`, and stores what must be stored (committed
//! offsets, group metadata) in the `__consumer_offsets` topic before anyone
//! is answered, as Kafka does.
//!
//! Writes go through the same `Partition::append_as_leader` as a producer's
//! acks=all batch, so a committed offset carries the same promise as an
//! acked record (see docs/contract.md). The groups live in shards, one per
//! `__consumer_offsets` partition this node leads (Kafka's coordinator
//! shards). A change takes its shard's lock, an async one, and holds it
//! across its append, which keeps the order of writes in the log the order
//! of the in-memory changes; the append itself runs on a blocking thread.
//! So a slow append (a busy disk, the partition's lock held by its
//! maintenance) makes the groups of that one partition wait, never an async
//! worker, nor the groups of other partitions.

pub mod share;
mod storage;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use tokio::sync::{oneshot, watch, Notify};

use crate::broker::{now_ms, Broker};
use crate::config::ServerConfig;
use crate::group::consumer::records::{
    member_tombstones, snapshot_records, tombstones_for, ConsumerGroupReplay,
};
use crate::group::consumer::{
    make_way_for_consumer_group, ConsumerGroupConfig, ConsumerGroupCoordinator,
    ConsumerGroupDescription, ConsumerGroupSnapshot, ConsumerGroupState, ConsumerHeartbeat,
    ConsumerHeartbeatReply, Epoch, ServerAssignor, TopicId, TopicMetadata, TopicsView,
};
use crate::group::{
    ClassicGroup, ClassicGroupConfig, Completions, GenerationId, GroupError, GroupInstanceId,
    GroupState, HeartbeatRequest, JoinRequest, JoinResponse, LeaveMember, LeaveMemberResponse,
    MemberId, Reply, SyncRequest, SyncResponse,
};
use crate::group::{CoordinatorRecord, GroupExpiryState, OffsetAndMetadata, OffsetStore};
use crate::replica_manager::ReplicaManager;

pub use storage::{partition_of, StorageError, TxnProducer, OFFSETS_TOPIC};
use storage::{LoadedLog, LogEntry, ProducerSequences};

/// The classic-group settings from `server.properties`.
pub fn classic_config(c: &ServerConfig) -> ClassicGroupConfig {
    ClassicGroupConfig {
        initial_rebalance_delay_ms: c.group_initial_rebalance_delay_ms,
        min_session_timeout_ms: c.group_min_session_timeout_ms,
        max_session_timeout_ms: c.group_max_session_timeout_ms,
        max_size: c.group_max_size as usize,
        ..ClassicGroupConfig::default()
    }
}

/// The KIP-848 settings from `server.properties`, or why they cannot work.
pub fn consumer_config(c: &ServerConfig) -> Result<ConsumerGroupConfig, String> {
    let assignors = c
        .group_consumer_assignors
        .iter()
        .map(|a| ServerAssignor::from_name(a).ok_or_else(|| format!("unknown assignor {a}")))
        .collect::<Result<Vec<_>, _>>()?;
    let config = ConsumerGroupConfig {
        session_timeout_ms: c.group_consumer_session_timeout_ms,
        heartbeat_interval_ms: c.group_consumer_heartbeat_interval_ms,
        max_size: c.group_consumer_max_size.max(1) as usize,
        assignors,
    };
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

/// The metadata image as the KIP-848 assignors see topics.
pub struct ImageTopics(pub std::sync::Arc<crate::metadata::MetadataImage>);

impl TopicsView for ImageTopics {
    fn topic(&self, name: &str) -> Option<TopicMetadata> {
        self.0.topics.get(name).map(|t| TopicMetadata {
            topic_id: TopicId(t.topic_id),
            partition_count: t.partitions.len() as i32,
        })
    }

    fn topic_name(&self, topic_id: TopicId) -> Option<String> {
        self.0
            .topics
            .values()
            .find(|t| t.topic_id == topic_id.0)
            .map(|t| t.name.clone())
    }

    fn topic_names(&self) -> Vec<String> {
        self.0.topics.keys().cloned().collect()
    }
}

/// A coordinator shard's groups: what one `__consumer_offsets` partition
/// holds (Kafka's `GroupCoordinatorShard`).
struct State {
    classic: crate::group::GroupCoordinator,
    consumer: ConsumerGroupCoordinator,
    /// What `__consumer_offsets` holds for each KIP-848 group: the snapshot
    /// last written. A change is written as the difference from it.
    stored_consumer: HashMap<String, ConsumerGroupSnapshot>,
    offsets: OffsetStore,
    /// The last sequence of each transactional producer on this partition,
    /// for the next TxnOffsetCommit batch.
    producers: ProducerSequences,
    parked_joins: HashMap<(String, MemberId), oneshot::Sender<JoinResponse>>,
    parked_syncs: HashMap<(String, MemberId), oneshot::Sender<SyncResponse>>,
    /// The share groups (KIP-932). Their epoch and share-partitions are
    /// written (`share::group_records`); their members are not: after a
    /// coordinator change members rejoin (UNKNOWN_MEMBER_ID), and what
    /// they consumed is in the share coordinator's state, not here.
    share: std::collections::BTreeMap<String, crate::share::group::ShareGroup>,
    /// What `__consumer_offsets` holds for each share group: its epoch and
    /// share-partitions as last written.
    stored_share: HashMap<String, share::StoredShareGroup>,
    /// When the last offsets-retention pass ran.
    last_expiry_ms: i64,
    /// When group metrics were last published.
    last_metrics_ms: i64,
    /// Set when this node stops leading the partition: a request that found
    /// the shard before then is answered NOT_COORDINATOR.
    unloaded: bool,
}

/// How often member counts, committed offsets and lag are published.
const METRICS_INTERVAL_MS: i64 = 10_000;

/// What a handler gets for one group in ListGroups / DescribeGroups.
pub struct GroupSummary {
    pub group_id: String,
    pub protocol_type: String,
    /// Kafka's state name (classic or consumer states).
    pub state: &'static str,
    /// `classic` or `consumer` (ListGroups v5).
    pub group_type: &'static str,
}

/// A DescribeGroups entry, copied out of the lock.
pub struct GroupDescription {
    pub state: GroupState,
    pub protocol_type: String,
    pub protocol_name: String,
    pub members: Vec<DescribedMember>,
}

pub struct DescribedMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: bytes::Bytes,
    pub assignment: bytes::Bytes,
}

/// One partition's commit, as OffsetCommit hands it over.
pub struct CommitPartition {
    pub topic: String,
    pub partition: i32,
    pub offset: OffsetAndMetadata,
}

/// The coordinator settings every shard shares.
struct Settings {
    classic: ClassicGroupConfig,
    consumer: ConsumerGroupConfig,
    offset_metadata_max_bytes: usize,
    offsets_retention_ms: i64,
    offsets_retention_check_interval_ms: i64,
}

/// The shards this node holds: one per `__consumer_offsets` partition it
/// leads.
#[derive(Default)]
struct Shards {
    /// The partition count of `__consumer_offsets` (0 before it exists).
    partitions: i32,
    by_partition: HashMap<i32, Arc<Shard>>,
}

pub struct GroupService {
    shards: std::sync::RwLock<Shards>,
    /// Serializes loading and unloading, so the shards follow the images in
    /// order.
    ownership: tokio::sync::Mutex<()>,
    replicas: Arc<ReplicaManager>,
    settings: Arc<Settings>,
    /// Stops the shards' timer tasks.
    stop: watch::Sender<bool>,
}

/// The groups of one `__consumer_offsets` partition. Every change to them
/// takes `state`, an async lock that is held across the change's append:
/// the records reach the log in the order of the changes, and a slow append
/// makes only this partition's groups wait.
struct Shard {
    partition: i32,
    state: tokio::sync::Mutex<State>,
    /// Wakes the timer task when a call may have moved a deadline earlier.
    wake: Notify,
    replicas: Arc<ReplicaManager>,
    settings: Arc<Settings>,
}

/// How a parked request ends if its slot is taken by a newer request of the
/// same member, or the group is dropped without answering it: the client
/// rejoins, which is always safe.
const ABANDONED: GroupError = GroupError::RebalanceInProgress;

impl GroupService {
    pub fn new(config: &ServerConfig, replicas: Arc<ReplicaManager>) -> Self {
        GroupService {
            shards: Default::default(),
            ownership: tokio::sync::Mutex::new(()),
            replicas,
            settings: Arc::new(Settings {
                classic: classic_config(config),
                consumer: consumer_config(config).unwrap_or_default(),
                offset_metadata_max_bytes: config.offset_metadata_max_bytes,
                offsets_retention_ms: config.offsets_retention_ms,
                offsets_retention_check_interval_ms: config.offsets_retention_check_interval_ms,
            }),
            stop: watch::channel(false).0,
        }
    }

    /// The shard that holds `group_id`: NOT_COORDINATOR when another broker
    /// leads the group's `__consumer_offsets` partition (the client looks
    /// the coordinator up again), COORDINATOR_NOT_AVAILABLE before the topic
    /// exists.
    fn shard(&self, group_id: &str) -> Result<Arc<Shard>, GroupError> {
        let shards = self.shards.read().expect("poisoned");
        if shards.partitions == 0 {
            return Err(GroupError::CoordinatorNotAvailable);
        }
        let partition = crate::group::offsets::partition_for(group_id, shards.partitions);
        shards
            .by_partition
            .get(&partition)
            .cloned()
            .ok_or(GroupError::NotCoordinator)
    }

    fn all_shards(&self) -> Vec<Arc<Shard>> {
        let shards = self.shards.read().expect("poisoned");
        let mut all: Vec<Arc<Shard>> = shards.by_partition.values().cloned().collect();
        all.sort_by_key(|s| s.partition);
        all
    }

    /// Answers whether this node coordinates `group_id` now (see `shard`).
    pub fn check_coordinator(&self, group_id: &str) -> Result<(), GroupError> {
        self.shard(group_id).map(drop)
    }

    /// Follows leadership of `__consumer_offsets`: loads the groups of each
    /// partition this node has come to lead, and drops (answering parked
    /// requests with NOT_COORDINATOR) the groups of each partition it no
    /// longer leads, as Kafka's coordinator loads and unloads on leader
    /// change. Called at start and after every metadata change; returns the
    /// number of records loaded. A partition is read on a blocking thread,
    /// and its groups answer NOT_COORDINATOR until it is loaded.
    pub async fn sync_ownership(&self, broker: &Broker) -> Result<usize, StorageError> {
        let _serial = self.ownership.lock().await;
        let (count, led) = broker.led_partitions(OFFSETS_TOPIC);
        let led: BTreeSet<i32> = led.into_keys().collect();
        let (gained, lost): (Vec<i32>, Vec<Arc<Shard>>) = {
            let mut shards = self.shards.write().expect("poisoned");
            let held: BTreeSet<i32> = shards.by_partition.keys().copied().collect();
            if shards.partitions == count && held == led {
                return Ok(0);
            }
            // A new partition count maps groups to new partitions: every
            // shard is loaded again.
            let same_count = shards.partitions == count;
            let lost: Vec<i32> = held
                .iter()
                .copied()
                .filter(|p| !(same_count && led.contains(p)))
                .collect();
            let gained = led
                .iter()
                .copied()
                .filter(|p| !(same_count && held.contains(p)))
                .collect();
            let lost = lost
                .iter()
                .filter_map(|p| shards.by_partition.remove(p))
                .collect();
            shards.partitions = count;
            (gained, lost)
        };
        for shard in lost {
            let groups = shard.unload().await;
            tracing::info!(
                partition = shard.partition,
                groups,
                "no longer coordinating the groups of {OFFSETS_TOPIC} partition"
            );
        }
        let mut loaded = 0;
        for p in gained {
            let replicas = self.replicas.clone();
            let settings = self.settings.clone();
            let (state, records, end_offset) = tokio::task::spawn_blocking(move || {
                let log = storage::read_partition(&replicas, p, crate::types::Offset(0))?;
                Ok::<_, StorageError>((
                    State::load(&settings, &log),
                    log.entries.len(),
                    log.end_offset,
                ))
            })
            .await
            .map_err(|e| StorageError::Interrupted(e.to_string()))??;
            loaded += records;
            let shard = Arc::new(Shard {
                partition: p,
                state: tokio::sync::Mutex::new(state),
                wake: Notify::new(),
                replicas: self.replicas.clone(),
                settings: self.settings.clone(),
            });
            {
                // Held from before the shard is published until the tail is
                // read, so no request sees the groups without it.
                let mut st = shard.state.lock().await;
                self.shards
                    .write()
                    .expect("poisoned")
                    .by_partition
                    .insert(p, shard.clone());
                if let Err(e) = shard.catch_up(&mut st, end_offset).await {
                    // Only a marker written during the load can be missed:
                    // its transaction's offsets stay pending.
                    tracing::error!(partition = p, error = %e, "reading the tail of {OFFSETS_TOPIC} after its load failed");
                }
            }
            tokio::spawn(shard.run_timer(self.stop.subscribe()));
            tracing::info!(
                partition = p,
                records,
                "coordinating the groups of {OFFSETS_TOPIC} partition"
            );
        }
        Ok(loaded)
    }

    // ---------------------------------------------------------------- classic

    pub async fn join(&self, group_id: &str, request: JoinRequest) -> JoinResponse {
        let member_id = request.member_id.clone();
        let shard = match self.shard(group_id) {
            Ok(s) => s,
            Err(e) => return JoinResponse::error(member_id, e),
        };
        let waiting = {
            let mut st = match shard.lock().await {
                Ok(st) => st,
                Err(e) => return JoinResponse::error(member_id, e),
            };
            if let Err(e) = st.consumer.make_way_for_classic_group(group_id) {
                return JoinResponse::error(request.member_id, e);
            }
            let out = st.classic.join(group_id, request, now_ms());
            let waiting = match out.reply {
                Reply::Now(r) => Err(r),
                Reply::Parked(m) => {
                    let (tx, rx) = oneshot::channel();
                    st.parked_joins
                        .insert((group_id.to_string(), m.clone()), tx);
                    Ok((m, rx))
                }
            };
            shard.complete(&mut st, group_id, out.completed).await;
            waiting
        };
        shard.wake.notify_one();
        match waiting {
            Err(r) => r,
            Ok((m, rx)) => rx.await.unwrap_or_else(|_| {
                JoinResponse::error(if m.is_unknown() { member_id } else { m }, ABANDONED)
            }),
        }
    }

    pub async fn sync(&self, group_id: &str, request: SyncRequest) -> SyncResponse {
        let shard = match self.shard(group_id) {
            Ok(s) => s,
            Err(e) => return SyncResponse::error(e),
        };
        let waiting = {
            let mut st = match shard.lock().await {
                Ok(st) => st,
                Err(e) => return SyncResponse::error(e),
            };
            let out = st.classic.sync(group_id, request, now_ms());
            let waiting = match out.reply {
                Reply::Now(r) => Err(r),
                Reply::Parked(m) => {
                    let (tx, rx) = oneshot::channel();
                    st.parked_syncs.insert((group_id.to_string(), m), tx);
                    Ok(rx)
                }
            };
            shard.complete(&mut st, group_id, out.completed).await;
            waiting
        };
        shard.wake.notify_one();
        match waiting {
            Err(r) => r,
            Ok(rx) => rx.await.unwrap_or_else(|_| SyncResponse::error(ABANDONED)),
        }
    }

    pub async fn heartbeat(
        &self,
        group_id: &str,
        request: &HeartbeatRequest,
    ) -> Result<(), GroupError> {
        let shard = self.shard(group_id)?;
        let mut st = shard.lock().await?;
        let r = st.classic.heartbeat(group_id, request, now_ms());
        drop(st);
        shard.wake.notify_one();
        r
    }

    pub async fn leave(
        &self,
        group_id: &str,
        members: &[LeaveMember],
    ) -> Result<Vec<LeaveMemberResponse>, GroupError> {
        let shard = self.shard(group_id)?;
        let mut st = shard.lock().await?;
        let out = st.classic.leave(group_id, members, now_ms());
        shard.complete(&mut st, group_id, out.completed).await;
        drop(st);
        shard.wake.notify_one();
        out.result
    }

    // ---------------------------------------------------------------- KIP-848

    /// ConsumerGroupHeartbeat.
    pub async fn consumer_heartbeat(
        &self,
        broker: &Broker,
        group_id: &str,
        request: ConsumerHeartbeat,
    ) -> Result<ConsumerHeartbeatReply, GroupError> {
        let topics = ImageTopics(broker.metadata.image());
        let shard = self.shard(group_id)?;
        let mut st = shard.lock().await?;
        let now = now_ms();
        if st.is_share_group(group_id) {
            return Err(GroupError::GroupIdNotFound);
        }
        let State {
            classic, consumer, ..
        } = &mut *st;
        make_way_for_consumer_group(classic, group_id, request.member_epoch, now)?;
        let joined = request.member_epoch == Epoch::JOIN;
        // The group's own configs (IncrementalAlterConfigs on the GROUP
        // resource) apply from its next heartbeat, as in Kafka.
        let group_config = crate::config::group::consumer_overrides(
            consumer.config(),
            topics.0.group_configs.get(group_id),
        );
        let r = consumer.heartbeat_with(group_id, request, &topics, group_config.as_ref(), now);
        // The reply waits for the change it reports to be stored, as in
        // Kafka. A failed write fails the heartbeat (the member retries);
        // the next write stores the difference from what is on disk.
        let stored = shard.persist_consumer_group(&mut st, group_id).await;
        drop(st);
        if let Err(e) = stored {
            tracing::error!(group = group_id, error = %e, "storing a consumer group failed");
            return Err(e.group_error());
        }
        if joined {
            shard.wake.notify_one();
        }
        r
    }

    pub async fn consumer_describe(
        &self,
        broker: &Broker,
        group_id: &str,
    ) -> Result<ConsumerGroupDescription, GroupError> {
        let topics = ImageTopics(broker.metadata.image());
        let shard = self.shard(group_id)?;
        let st = shard.lock().await?;
        if st.consumer.group(group_id).is_none() && st.classic.group(group_id).is_some() {
            // Kafka: "Group {} is not a consumer group."
            return Err(GroupError::GroupIdNotFound);
        }
        st.consumer.describe(group_id, &topics)
    }

    /// Stops the shards' timers and answers every parked request (the
    /// broker is stopping).
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        for shard in self.all_shards() {
            let mut st = shard.state.lock().await;
            st.parked_joins.clear();
            st.parked_syncs.clear();
        }
    }

    // ---------------------------------------------------------------- offsets

    /// OffsetCommit for one group: validates the member, stores every
    /// partition's offset, and returns one result per partition in order,
    /// with the append's pending acknowledgement: the caller answers only
    /// once the record is on every in-sync replica of `__consumer_offsets`
    /// (Kafka's acks=all coordinator write), so a commit acked to the client
    /// survives the coordinator's failover. The offsets are visible here at
    /// once; a record that never reaches the followers is one the new
    /// coordinator does not load, exactly as in Kafka.
    #[allow(clippy::too_many_arguments)]
    pub async fn commit_offsets(
        &self,
        group_id: &str,
        member_id: &MemberId,
        group_instance_id: Option<&GroupInstanceId>,
        generation_id: GenerationId,
        api_version: i16,
        partitions: Vec<CommitPartition>,
    ) -> Result<CommitOutcome, GroupError> {
        let shard = self.shard(group_id)?;
        let mut st = shard.lock().await?;
        let now = now_ms();
        if st.consumer.group(group_id).is_some() {
            // KIP-848 groups check the member epoch (STALE_MEMBER_EPOCH).
            st.consumer.validate_offset_commit(
                group_id,
                member_id,
                Epoch(generation_id.0),
                api_version,
                false,
            )?;
        } else {
            st.classic.validate_offset_commit(
                group_id,
                member_id,
                group_instance_id,
                generation_id,
                api_version >= 9,
                now,
            )?;
        }
        let mut results = Vec::with_capacity(partitions.len());
        let mut records = Vec::new();
        for p in partitions {
            if p.offset.metadata.len() > self.settings.offset_metadata_max_bytes {
                results.push(Err(CommitError::OffsetMetadataTooLarge));
                continue;
            }
            results.push(Ok(()));
            records.push(CoordinatorRecord::OffsetCommit {
                group_id: group_id.to_string(),
                topic: p.topic,
                partition: p.partition,
                value: Some(p.offset),
            });
        }
        let mut pending = None;
        if !records.is_empty() {
            match shard.append(records.clone()).await {
                Ok(p) => pending = p,
                Err(e) => {
                    tracing::error!(group = group_id, error = %e, "storing offsets failed");
                    let code = e.group_error();
                    let results = results
                        .into_iter()
                        .map(|r| r.and(Err(CommitError::Group(code))))
                        .collect();
                    return Ok((results, None));
                }
            }
            replay_appended(&mut st.offsets, pending.as_ref(), None, &records);
        }
        Ok((results, pending))
    }

    /// TxnOffsetCommit for one group: validates the member as Kafka does
    /// for transactional commits, then writes the offsets in a
    /// transactional batch of the producer. They stay pending, invisible
    /// to OffsetFetch, until [`on_txn_marker`](Self::on_txn_marker) ends the
    /// transaction. Results and acknowledgement as for
    /// [`commit_offsets`](Self::commit_offsets).
    #[allow(clippy::too_many_arguments)]
    pub async fn commit_txn_offsets(
        &self,
        group_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        member_id: &MemberId,
        group_instance_id: Option<&GroupInstanceId>,
        generation_id: GenerationId,
        partitions: Vec<CommitPartition>,
    ) -> Result<TxnCommitOutcome, GroupError> {
        if group_id.is_empty() {
            return Err(GroupError::InvalidGroupId);
        }
        let shard = self.shard(group_id)?;
        let mut st = shard.lock().await?;
        if st.consumer.group(group_id).is_some() {
            st.consumer.validate_txn_offset_commit(
                group_id,
                member_id,
                group_instance_id,
                Epoch(generation_id.0),
            )?;
        } else {
            st.classic.validate_txn_offset_commit(
                group_id,
                member_id,
                group_instance_id,
                generation_id,
                now_ms(),
            )?;
        }
        let mut results = Vec::with_capacity(partitions.len());
        let mut records = Vec::new();
        for p in partitions {
            if p.offset.metadata.len() > self.settings.offset_metadata_max_bytes {
                results.push(Err(TxnCommitError::OffsetMetadataTooLarge));
                continue;
            }
            results.push(Ok(()));
            records.push(CoordinatorRecord::OffsetCommit {
                group_id: group_id.to_string(),
                topic: p.topic,
                partition: p.partition,
                value: Some(p.offset),
            });
        }
        if records.is_empty() {
            return Ok((results, None));
        }
        let producer = TxnProducer {
            producer_id,
            producer_epoch,
            base_sequence: st.producers.next(producer_id, producer_epoch),
        };
        match shard.append_as(records.clone(), Some(producer)).await {
            Ok(pending) => {
                st.producers.record(
                    producer_id,
                    producer_epoch,
                    producer.base_sequence,
                    records.len(),
                );
                replay_appended(
                    &mut st.offsets,
                    pending.as_ref(),
                    Some(producer_id),
                    &records,
                );
                Ok((results, pending))
            }
            Err(e) => {
                tracing::warn!(group = group_id, producer_id, error = %e, "storing transactional offsets failed");
                let error = TxnCommitError::from_storage(&e);
                Ok((
                    results.into_iter().map(|r| r.and(Err(error))).collect(),
                    None,
                ))
            }
        }
    }

    /// A transaction marker of `producer_id` was written to
    /// `__consumer_offsets` partition `offsets_partition` (WriteTxnMarkers):
    /// the producer's pending offsets for every group of that partition are
    /// committed or dropped, as Kafka's `onTransactionCompleted`. Nothing to
    /// do when this node does not hold the partition's groups: whoever loads
    /// them replays the marker from the log.
    pub async fn on_txn_marker(&self, offsets_partition: i32, producer_id: i64, commit: bool) {
        let shard = self
            .shards
            .read()
            .expect("poisoned")
            .by_partition
            .get(&offsets_partition)
            .cloned();
        let Some(shard) = shard else {
            return;
        };
        let Ok(mut st) = shard.lock().await else {
            return;
        };
        st.offsets.replay_end_txn(producer_id, commit);
        drop(st);
        // Offsets kept from expiring by the transaction may expire now.
        shard.wake.notify_one();
    }

    /// OffsetFetch v9+ from a member of a KIP-848 group: its epoch must be
    /// current (STALE_MEMBER_EPOCH otherwise), so a fenced member cannot
    /// resume from offsets its replacement is moving. Anyone else (admin
    /// clients, classic groups) fetches freely.
    pub async fn validate_offset_fetch(
        &self,
        group_id: &str,
        member_id: Option<&str>,
        member_epoch: i32,
    ) -> Result<(), GroupError> {
        let shard = self.shard(group_id)?;
        let st = shard.lock().await?;
        if st.consumer.group(group_id).is_none() {
            return Ok(());
        }
        let member = member_id.map(|m| MemberId(m.to_string()));
        st.consumer
            .validate_offset_fetch(group_id, member.as_ref(), Epoch(member_epoch))
    }

    /// The committed offsets of a group's partitions (None for a partition
    /// without one), or the group error when this node does not coordinate
    /// it.
    pub async fn committed(
        &self,
        group_id: &str,
        partitions: &[(String, i32)],
    ) -> Result<Vec<Option<OffsetAndMetadata>>, GroupError> {
        let shard = self.shard(group_id)?;
        let st = shard.lock().await?;
        Ok(partitions
            .iter()
            .map(|(topic, partition)| st.offsets.fetch(group_id, topic, *partition).cloned())
            .collect())
    }

    /// OffsetFetch's view of a group's partitions: the committed offset (None
    /// for a partition without one), or, when `require_stable` is set
    /// (OffsetFetch v7+ from read_committed consumers), UNSTABLE_OFFSET_COMMIT
    /// for a partition a transaction has a pending offset for, as Kafka
    /// answers.
    pub async fn fetch_offsets(
        &self,
        group_id: &str,
        partitions: &[(String, i32)],
        require_stable: bool,
    ) -> Result<Vec<Result<Option<OffsetAndMetadata>, UnstableOffsetCommit>>, GroupError> {
        let shard = self.shard(group_id)?;
        let st = shard.lock().await?;
        Ok(partitions
            .iter()
            .map(|(topic, partition)| {
                if require_stable && st.offsets.has_pending(group_id, topic, *partition) {
                    return Err(UnstableOffsetCommit);
                }
                Ok(st.offsets.fetch(group_id, topic, *partition).cloned())
            })
            .collect())
    }

    /// Every committed offset of a group, sorted by topic and partition,
    /// with `require_stable` as in [`fetch_offsets`](Self::fetch_offsets)
    /// (a partition with only a pending offset is not listed, as in Kafka).
    pub async fn fetch_all_offsets(
        &self,
        group_id: &str,
        require_stable: bool,
    ) -> Result<Vec<(String, i32, Result<OffsetAndMetadata, UnstableOffsetCommit>)>, GroupError>
    {
        let shard = self.shard(group_id)?;
        let st = shard.lock().await?;
        Ok(st
            .offsets
            .fetch_group(group_id)
            .map(|(t, p, o)| {
                let answer = if require_stable && st.offsets.has_pending(group_id, t, p) {
                    Err(UnstableOffsetCommit)
                } else {
                    Ok(o.clone())
                };
                (t.to_string(), p, answer)
            })
            .collect())
    }

    /// Every committed offset of a group, sorted by topic and partition.
    pub async fn committed_all(
        &self,
        group_id: &str,
    ) -> Result<Vec<(String, i32, OffsetAndMetadata)>, GroupError> {
        let shard = self.shard(group_id)?;
        let st = shard.lock().await?;
        Ok(st
            .offsets
            .fetch_group(group_id)
            .map(|(t, p, o)| (t.to_string(), p, o.clone()))
            .collect())
    }

    /// OffsetDelete: removes a group's offsets for partitions the group is
    /// not consuming. Returns per-partition errors (None = deleted).
    pub async fn delete_offsets(
        &self,
        group_id: &str,
        topics: &[(String, Vec<i32>)],
    ) -> Result<Vec<TopicOffsetDeletion>, DeleteOffsetsError> {
        let shard = self.shard(group_id).map_err(DeleteOffsetsError::Group)?;
        let mut st = shard.lock().await.map_err(DeleteOffsetsError::Group)?;
        let group = st
            .classic
            .group(group_id)
            .ok_or(DeleteOffsetsError::Group(GroupError::GroupIdNotFound))?;
        let subscribed = match group.state() {
            GroupState::Dead => return Err(DeleteOffsetsError::Group(GroupError::GroupIdNotFound)),
            GroupState::Empty => Some(Default::default()),
            _ if group.protocol_type() == Some("consumer") => subscribed_topics(group),
            _ => return Err(DeleteOffsetsError::Group(GroupError::NonEmptyGroup)),
        };
        let mut out = Vec::new();
        let mut records = Vec::new();
        for (topic, partitions) in topics {
            // Undecodable subscriptions (None) count as subscribed to all.
            if subscribed
                .as_ref()
                .is_none_or(|s| s.contains(topic.as_str()))
            {
                out.push((
                    topic.clone(),
                    partitions
                        .iter()
                        .map(|&p| (p, Some(GroupError::GroupSubscribedToTopic)))
                        .collect(),
                ));
                continue;
            }
            records.extend(
                st.offsets
                    .delete_partition_records(group_id, topic, partitions),
            );
            out.push((
                topic.clone(),
                partitions.iter().map(|&p| (p, None)).collect(),
            ));
        }
        if !records.is_empty() {
            if let Err(e) = shard.append(records.clone()).await {
                tracing::error!(group = group_id, error = %e, "storing offset deletion failed");
                return Err(DeleteOffsetsError::Storage(e.group_error()));
            }
            for r in &records {
                st.offsets.apply(r);
            }
        }
        Ok(out)
    }

    /// Writes tombstones for every group's offsets of a deleted topic.
    pub async fn on_topic_deleted(&self, topic: &str) {
        for shard in self.all_shards() {
            let Ok(mut st) = shard.lock().await else {
                continue;
            };
            // Pending transactional offsets of the topic go too, as in
            // Kafka's `onPartitionsDeleted`.
            let groups: BTreeSet<String> = st
                .offsets
                .groups()
                .chain(st.offsets.groups_with_pending())
                .map(str::to_string)
                .collect();
            for group_id in groups {
                let partitions: Vec<i32> = st
                    .offsets
                    .topic_partitions(&group_id, topic)
                    .into_iter()
                    .collect();
                if partitions.is_empty() {
                    continue;
                }
                let records = st
                    .offsets
                    .delete_partition_records(&group_id, topic, &partitions);
                match shard.append(records.clone()).await {
                    Ok(_) => records.iter().for_each(|r| st.offsets.apply(r)),
                    Err(e) => {
                        tracing::error!(group = %group_id, topic, error = %e, "removing offsets of a deleted topic failed")
                    }
                }
            }
        }
    }

    // ------------------------------------------------------------------ admin

    /// Every group of every shard, by id.
    pub async fn list(&self) -> Vec<GroupSummary> {
        let mut out = Vec::new();
        for shard in self.all_shards() {
            let Ok(st) = shard.lock().await else {
                continue;
            };
            out.extend(
                st.classic
                    .groups()
                    .filter(|g| g.state() != GroupState::Dead)
                    .map(|g| GroupSummary {
                        group_id: g.group_id().to_string(),
                        protocol_type: g.protocol_type().unwrap_or_default().to_string(),
                        state: g.state().as_str(),
                        group_type: "classic",
                    }),
            );
            out.extend(
                st.consumer
                    .groups()
                    .filter(|g| g.state() != ConsumerGroupState::Dead)
                    .map(|g| GroupSummary {
                        group_id: g.group_id().to_string(),
                        protocol_type: "consumer".to_string(),
                        state: g.state().as_str(),
                        group_type: "consumer",
                    }),
            );
            out.extend(st.share.values().map(|g| GroupSummary {
                group_id: g.group_id.clone(),
                protocol_type: "share".to_string(),
                state: g.state(),
                group_type: "share",
            }));
        }
        out.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        out
    }

    /// A classic group's description (None when there is no such group),
    /// or the group error when this node does not coordinate it.
    pub async fn describe(&self, group_id: &str) -> Result<Option<GroupDescription>, GroupError> {
        let shard = self.shard(group_id)?;
        let st = shard.lock().await?;
        let Some(g) = st.classic.group(group_id) else {
            return Ok(None);
        };
        // Kafka hands out member metadata and assignments only once the
        // group is Stable: before that they belong to a generation in flux.
        let stable = g.state() == GroupState::Stable;
        Ok(Some(GroupDescription {
            state: g.state(),
            protocol_type: g.protocol_type().unwrap_or_default().to_string(),
            protocol_name: if stable {
                g.protocol_name().unwrap_or_default().to_string()
            } else {
                String::new()
            },
            members: g
                .members()
                .map(|m| DescribedMember {
                    member_id: m.member_id.to_string(),
                    group_instance_id: m.group_instance_id.map(|i| i.to_string()),
                    client_id: m.client_id.to_string(),
                    client_host: m.client_host.to_string(),
                    metadata: if stable {
                        m.metadata.clone()
                    } else {
                        Default::default()
                    },
                    assignment: if stable {
                        m.assignment.clone()
                    } else {
                        Default::default()
                    },
                })
                .collect(),
        }))
    }

    /// DeleteGroups for one group: only an empty group goes, with its offsets.
    pub async fn delete_group(&self, group_id: &str) -> Result<(), GroupError> {
        let shard = self.shard(group_id)?;
        let mut st = shard.lock().await?;
        let now = now_ms();
        let consumer_group = st.consumer.group(group_id).is_some();
        if let Some(g) = st.share.get(group_id) {
            if !g.members.is_empty() {
                return Err(GroupError::NonEmptyGroup);
            }
            st.share.remove(group_id);
            // Tombstones only: no topic names needed.
            return shard
                .persist_share_group(&mut st, group_id, &|_| None)
                .await
                .map_err(|e| e.group_error());
        }
        match (st.classic.group(group_id), st.consumer.group(group_id)) {
            (Some(g), _) => g.validate_delete()?,
            (None, Some(g)) if g.state() != ConsumerGroupState::Empty => {
                return Err(GroupError::NonEmptyGroup)
            }
            (None, Some(_)) => {}
            (None, None) => return Err(GroupError::GroupIdNotFound),
        }
        let records = st.offsets.delete_group_records(group_id);
        if !records.is_empty() {
            if let Err(e) = shard.append(records.clone()).await {
                tracing::error!(group = group_id, error = %e, "storing group deletion failed");
                return Err(e.group_error());
            }
        }
        for r in &records {
            st.offsets.apply(r);
        }
        if consumer_group {
            st.consumer.delete_group(group_id)?;
            shard
                .persist_consumer_group(&mut st, group_id)
                .await
                .map_err(|e| e.group_error())?;
        } else {
            st.classic.delete_group(group_id, now)?;
        }
        Ok(())
    }
}

impl State {
    /// Replays `log`'s offset records and transaction markers into the
    /// offset store, and takes its producers' sequences.
    fn replay(&mut self, log: &LoadedLog) {
        for entry in &log.entries {
            match entry {
                LogEntry::Record {
                    offset,
                    producer_id,
                    record,
                } => self.offsets.replay(*offset, *producer_id, record),
                LogEntry::Marker {
                    producer_id,
                    commit,
                } => self.offsets.replay_end_txn(*producer_id, *commit),
            }
        }
        for (producer_id, (epoch, last)) in log.producers.iter() {
            self.producers.record(producer_id, epoch, last, 1);
        }
    }

    fn new(settings: &Settings) -> State {
        State {
            classic: crate::group::GroupCoordinator::new(settings.classic.clone()),
            consumer: ConsumerGroupCoordinator::new(settings.consumer.clone()),
            stored_consumer: HashMap::new(),
            offsets: OffsetStore::new(),
            producers: ProducerSequences::default(),
            parked_joins: HashMap::new(),
            parked_syncs: HashMap::new(),
            share: Default::default(),
            stored_share: HashMap::new(),
            last_expiry_ms: now_ms(),
            last_metrics_ms: 0,
            unloaded: false,
        }
    }

    /// The groups and offsets `log` describes (one partition's worth, in
    /// log order). A transaction whose marker is not in the log stays
    /// pending: its coordinator will still end it.
    fn load(settings: &Settings, log: &LoadedLog) -> State {
        let now = now_ms();
        let mut st = State::new(settings);
        let mut replay = ConsumerGroupReplay::new();
        for entry in &log.entries {
            if let LogEntry::Record { record, .. } = entry {
                replay.apply(record);
            }
        }
        st.replay(log);
        st.load_share_groups(log);
        for snapshot in replay.snapshots(&settings.consumer) {
            let group_id = snapshot.group_id.clone();
            match st.consumer.restore(snapshot.clone(), now) {
                Ok(()) => {
                    st.stored_consumer.insert(group_id, snapshot);
                }
                Err(e) => {
                    tracing::error!(group = %group_id, error = %e, "cannot restore a consumer group; its members will rejoin")
                }
            }
        }
        let restored: Vec<ClassicGroup> = st
            .offsets
            .group_metadata_all()
            .map(|(group_id, m)| {
                ClassicGroup::from_group_metadata(
                    group_id,
                    settings.classic.clone(),
                    m.clone(),
                    now,
                )
            })
            .collect();
        for group in restored {
            st.classic.insert_loaded(group);
        }
        // A group that only ever committed offsets (an admin client, or a
        // consumer that assigns partitions itself) has no metadata record;
        // it comes back as an empty group, as in Kafka's replay.
        let offset_groups: BTreeSet<String> = st
            .offsets
            .groups()
            .chain(st.offsets.groups_with_pending())
            .map(str::to_string)
            .collect();
        for group_id in offset_groups {
            if st.classic.group(&group_id).is_none() && st.consumer.group(&group_id).is_none() {
                st.classic.insert_loaded(ClassicGroup::new(
                    &group_id,
                    settings.classic.clone(),
                    now,
                ));
            }
        }
        st
    }
}

impl Shard {
    /// Replays what was appended after `from` while the partition was being
    /// read: only WriteTxnMarkers writes then (no shard takes records), and
    /// its `on_txn_marker` found no shard to tell. A marker also reported
    /// after this is applied twice, which changes nothing: its producer
    /// cannot start another transaction before the marker's write is
    /// answered.
    async fn catch_up(&self, st: &mut State, from: i64) -> Result<(), StorageError> {
        let replicas = self.replicas.clone();
        let partition = self.partition;
        let tail = tokio::task::spawn_blocking(move || {
            storage::read_partition(&replicas, partition, crate::types::Offset(from))
        })
        .await
        .map_err(|e| StorageError::Interrupted(e.to_string()))??;
        st.replay(&tail);
        Ok(())
    }

    /// The shard's state, once no other change is in progress, or
    /// NOT_COORDINATOR when the shard was unloaded meanwhile.
    async fn lock(&self) -> Result<tokio::sync::MutexGuard<'_, State>, GroupError> {
        let st = self.state.lock().await;
        if st.unloaded {
            return Err(GroupError::NotCoordinator);
        }
        Ok(st)
    }

    /// Appends `records` to this shard's partition on a blocking thread;
    /// the caller holds the state lock, so appends keep the order of the
    /// changes.
    async fn append(
        &self,
        records: Vec<CoordinatorRecord>,
    ) -> Result<Option<storage::PendingAck>, StorageError> {
        self.append_as(records, None).await
    }

    /// Appends `records`, in a transactional batch of `producer` when given.
    async fn append_as(
        &self,
        records: Vec<CoordinatorRecord>,
        producer: Option<TxnProducer>,
    ) -> Result<Option<storage::PendingAck>, StorageError> {
        let replicas = self.replicas.clone();
        let partition = self.partition;
        tokio::task::spawn_blocking(move || {
            storage::append_acked(&replicas, partition, &records, producer)
        })
        .await
        .map_err(|e| StorageError::Interrupted(e.to_string()))?
    }

    /// This node no longer leads the partition: answers parked requests
    /// NOT_COORDINATOR, drops the groups and stops the timer. Returns how
    /// many groups were dropped.
    async fn unload(&self) -> usize {
        let mut st = self.state.lock().await;
        st.unloaded = true;
        let mut groups: Vec<String> = st
            .offsets
            .groups()
            .chain(st.classic.groups().map(|g| g.group_id()))
            .chain(st.consumer.groups().map(|g| g.group_id()))
            .map(str::to_string)
            .collect();
        groups.sort();
        groups.dedup();
        let ids: Vec<&str> = groups.iter().map(String::as_str).collect();
        for (group_id, completed) in st.classic.unload(&ids, now_ms()) {
            // Nothing is stored: the partition is another node's now.
            answer(&mut st, &group_id, completed, None);
        }
        *st = State {
            unloaded: true,
            ..State::new(&self.settings)
        };
        drop(st);
        self.wake.notify_one();
        groups.len()
    }

    /// Stores what a call's completions require, then answers the parked
    /// requests they name. Called with the state lock held.
    async fn complete(&self, st: &mut State, group_id: &str, completed: Completions) {
        let mut failure = None;
        if !completed.joins.is_empty() {
            // The join phase completed: a new generation, one rebalance.
            metrics::counter!("kafka_group_rebalances_total", "group" => group_id.to_string())
                .increment(1);
        }
        if completed.group_metadata_changed {
            if let Some(group) = st.classic.group(group_id) {
                let value = if group.state() == GroupState::Dead {
                    None
                } else {
                    Some(group.group_metadata())
                };
                let record = CoordinatorRecord::GroupMetadata {
                    group_id: group_id.to_string(),
                    value,
                };
                match self.append(vec![record.clone()]).await {
                    Ok(_) => st.offsets.apply(&record),
                    Err(e) => {
                        tracing::error!(group = group_id, error = %e, "storing group metadata failed");
                        failure = Some(e.group_error());
                    }
                }
            }
        }
        answer(st, group_id, completed, failure);
    }

    /// Writes the records that bring `__consumer_offsets` from the stored
    /// snapshot of a KIP-848 group to its current state: tombstones for
    /// members that left, the group's records, or the whole group's
    /// tombstones once it is gone. Nothing when nothing changed.
    async fn persist_consumer_group(
        &self,
        st: &mut State,
        group_id: &str,
    ) -> Result<(), StorageError> {
        let current = st.consumer.group(group_id).map(|g| g.snapshot());
        let previous = st.stored_consumer.get(group_id);
        if current.as_ref() == previous {
            return Ok(());
        }
        let records = match (previous, &current) {
            (_, Some(cur)) => {
                let mut records = Vec::new();
                if let Some(prev) = previous {
                    for m in &prev.members {
                        if !cur.members.iter().any(|c| c.member_id == m.member_id) {
                            records.extend(member_tombstones(group_id, &m.member_id));
                        }
                    }
                }
                records.extend(snapshot_records(cur));
                records
            }
            (Some(prev), None) => {
                let members: Vec<MemberId> =
                    prev.members.iter().map(|m| m.member_id.clone()).collect();
                tombstones_for(group_id, &members)
            }
            (None, None) => return Ok(()),
        };
        self.append(records).await?;
        match current {
            Some(cur) => st.stored_consumer.insert(group_id.to_string(), cur),
            None => st.stored_consumer.remove(group_id),
        };
        Ok(())
    }

    /// The shard's timer task: fires group deadlines, runs offset expiry and
    /// publishes the group metrics, until the shard is unloaded or the
    /// service stops.
    async fn run_timer(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            let next = {
                let st = self.state.lock().await;
                if st.unloaded {
                    return;
                }
                let expiry = (st.last_expiry_ms
                    + self.settings.offsets_retention_check_interval_ms)
                    .min(st.last_metrics_ms + METRICS_INTERVAL_MS);
                [st.classic.next_deadline_ms(), st.next_share_deadline_ms()]
                    .into_iter()
                    .flatten()
                    .fold(expiry, i64::min)
            };
            let wait_ms = (next - now_ms()).clamp(0, 60_000) as u64;
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_millis(wait_ms)) => {}
                _ = self.wake.notified() => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
            let mut st = self.state.lock().await;
            if st.unloaded {
                return;
            }
            let now = now_ms();
            for (group_id, completed) in st.classic.tick(now) {
                self.complete(&mut st, &group_id, completed).await;
            }
            st.expire_share_members(now);
            for group_id in st.consumer.tick(now) {
                if let Err(e) = self.persist_consumer_group(&mut st, &group_id).await {
                    tracing::error!(group = %group_id, error = %e, "storing a consumer group failed");
                }
            }
            if now >= st.last_expiry_ms + self.settings.offsets_retention_check_interval_ms {
                st.last_expiry_ms = now;
                self.expire_offsets(&mut st, now).await;
            }
            if now >= st.last_metrics_ms + METRICS_INTERVAL_MS {
                st.last_metrics_ms = now;
                let committed = publish_member_metrics(&st);
                drop(st);
                // The lag reads the consumed partitions: disk work, and
                // their locks may be busy.
                let replicas = self.replicas.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    publish_lag_metrics(&replicas, committed, now)
                })
                .await;
            }
        }
    }

    /// Kafka's periodic cleanup: tombstones for expired offsets, and for
    /// empty groups left with no offsets.
    async fn expire_offsets(&self, st: &mut State, now: i64) {
        let expiration = {
            let State {
                classic, offsets, ..
            } = &*st;
            offsets.expired_records(now, self.settings.offsets_retention_ms, |g| {
                expiry_state(classic.group(g))
            })
        };
        let mut by_group: std::collections::BTreeMap<String, Vec<CoordinatorRecord>> =
            Default::default();
        for r in expiration.records {
            let group_id = match &r {
                CoordinatorRecord::OffsetCommit { group_id, .. }
                | CoordinatorRecord::GroupMetadata { group_id, .. } => group_id.clone(),
                CoordinatorRecord::ConsumerGroup(_) | CoordinatorRecord::Other { .. } => continue,
            };
            by_group.entry(group_id).or_default().push(r);
        }
        for (group_id, records) in by_group {
            match self.append(records.clone()).await {
                Ok(_) => records.iter().for_each(|r| st.offsets.apply(r)),
                Err(e) => {
                    tracing::error!(group = %group_id, error = %e, "expiring offsets failed");
                    return;
                }
            }
            let expired = records
                .iter()
                .filter(|r| matches!(r, CoordinatorRecord::OffsetCommit { .. }))
                .count();
            if expired > 0 {
                tracing::info!(group = %group_id, offsets = expired, "expired committed offsets");
                metrics::counter!("kafka_group_offsets_expired_total").increment(expired as u64);
            }
        }
        for group_id in expiration.deleted_groups {
            if st
                .classic
                .group(&group_id)
                .is_some_and(|g| g.state() == GroupState::Empty)
            {
                let _ = st.classic.delete_group(&group_id, now);
                tracing::info!(group = %group_id, "removed an empty group with no offsets left");
            }
        }
    }
}

/// Answers the parked requests `completed` names, with `failure` instead of
/// their responses when storing the change failed.
fn answer(st: &mut State, group_id: &str, completed: Completions, failure: Option<GroupError>) {
    for (member, response) in completed.joins {
        if let Some(tx) = st
            .parked_joins
            .remove(&(group_id.to_string(), member.clone()))
        {
            let response = match failure {
                Some(e) => JoinResponse::error(member, e),
                None => response,
            };
            let _ = tx.send(response);
        }
    }
    for (member, response) in completed.syncs {
        if let Some(tx) = st.parked_syncs.remove(&(group_id.to_string(), member)) {
            let response = match failure {
                Some(e) => SyncResponse::error(e),
                None => response,
            };
            let _ = tx.send(response);
        }
    }
}

/// A committed offset whose lag is published: group, topic, partition,
/// committed offset.
type CommittedOffset = (String, String, i32, i64);

/// Members per group and the committed offsets; returns the committed
/// offsets, for `publish_lag_metrics`.
fn publish_member_metrics(st: &State) -> Vec<CommittedOffset> {
    for g in st.classic.groups() {
        metrics::gauge!("kafka_group_members", "group" => g.group_id().to_string())
            .set(g.num_members() as f64);
    }
    for g in st.consumer.groups() {
        metrics::gauge!("kafka_group_members", "group" => g.group_id().to_string())
            .set(g.num_members() as f64);
        metrics::gauge!("kafka_group_epoch", "group" => g.group_id().to_string())
            .set(f64::from(g.group_epoch().0));
    }
    let mut out = Vec::new();
    for group_id in st.offsets.groups() {
        for (topic, partition, o) in st.offsets.fetch_group(group_id) {
            out.push((
                group_id.to_string(),
                topic.to_string(),
                partition,
                o.committed_offset,
            ));
        }
    }
    out
}

/// Per committed partition: the committed offset, the lag in records (high
/// watermark - committed) and, when records are waiting, the lag in time:
/// now - the timestamp of the first batch at the committed offset (a
/// batch's first timestamp, so it can overstate the lag by the time one
/// batch spans).
fn publish_lag_metrics(replicas: &ReplicaManager, committed: Vec<CommittedOffset>, now: i64) {
    for (group_id, topic, partition, committed_offset) in committed {
        let labels = [
            ("group", group_id),
            ("topic", topic.clone()),
            ("partition", partition.to_string()),
        ];
        metrics::gauge!("kafka_group_committed_offset", &labels).set(committed_offset as f64);
        let Some(part) = replicas.get(&crate::types::TopicPartition::new(topic, partition)) else {
            continue;
        };
        let part = part.lock().expect("partition poisoned");
        let hw = part.high_watermark().0;
        let lag = (hw - committed_offset).max(0);
        metrics::gauge!("kafka_group_lag", &labels).set(lag as f64);
        let lag_seconds = if lag == 0 {
            0.0
        } else {
            part.read(
                crate::types::Offset(committed_offset.max(part.log_start_offset().0)),
                1,
                true,
            )
            .ok()
            .and_then(|f| {
                protocol::record_batch::RecordBatchView::parse(&f.records)
                    .ok()
                    .map(|b| b.base_timestamp())
            })
            .map_or(0.0, |ts| ((now - ts).max(0) as f64) / 1000.0)
        };
        metrics::gauge!("kafka_group_lag_seconds", &labels).set(lag_seconds);
    }
}
/// What offset expiry needs to know of a group (Kafka's
/// `offsetExpirationCondition`).
fn expiry_state(group: Option<&ClassicGroup>) -> GroupExpiryState {
    let Some(g) = group else {
        return GroupExpiryState::ClassicSimple;
    };
    match g.state() {
        GroupState::Empty | GroupState::Dead if g.protocol_type().is_none_or(str::is_empty) => {
            GroupExpiryState::ClassicSimple
        }
        GroupState::Empty | GroupState::Dead => GroupExpiryState::ClassicEmpty {
            since_ms: Some(g.state_timestamp_ms()),
        },
        GroupState::Stable if g.protocol_type() == Some("consumer") => {
            GroupExpiryState::ClassicActive {
                subscribed_topics: subscribed_topics(g).map(|t| t.into_iter().collect()),
            }
        }
        _ => GroupExpiryState::ClassicActive {
            subscribed_topics: None,
        },
    }
}

/// OffsetDelete's result for one topic: per partition, why it was kept
/// (None: deleted, or had no offset).
pub type TopicOffsetDeletion = (String, Vec<(i32, Option<GroupError>)>);

/// Per-partition results of an OffsetCommit, in request order, and the
/// pending acknowledgement of the stored record (None when nothing was
/// stored).
pub type CommitOutcome = (Vec<Result<(), CommitError>>, Option<storage::PendingAck>);

/// Per-partition results of a TxnOffsetCommit, in request order, and the
/// pending acknowledgement of the stored batch.
pub type TxnCommitOutcome = (Vec<Result<(), TxnCommitError>>, Option<storage::PendingAck>);

/// Why one partition of a TxnOffsetCommit was not stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnCommitError {
    OffsetMetadataTooLarge,
    Group(GroupError),
    /// The partition has seen a newer epoch of this producer id: a newer
    /// producer with the same transactional id fenced this one.
    InvalidProducerEpoch,
}

impl TxnCommitError {
    /// What a failed transactional append tells the client: Kafka passes a
    /// fenced epoch through and maps storage failures as for any
    /// coordinator write.
    fn from_storage(e: &StorageError) -> Self {
        match e {
            StorageError::Append(crate::error::PartitionError::Producer(
                crate::partition::producer_state::ProducerError::InvalidProducerEpoch { .. },
            )) => TxnCommitError::InvalidProducerEpoch,
            _ => TxnCommitError::Group(e.group_error()),
        }
    }

    /// The one mapping to Kafka error codes.
    pub fn code(self) -> i16 {
        match self {
            TxnCommitError::OffsetMetadataTooLarge => {
                kafka_protocol::ResponseError::OffsetMetadataTooLarge.code()
            }
            TxnCommitError::Group(e) => e.code(),
            TxnCommitError::InvalidProducerEpoch => {
                kafka_protocol::ResponseError::InvalidProducerEpoch.code()
            }
        }
    }
}

/// A partition with a pending transactional offset, fetched with
/// `require_stable`: the client retries until the transaction ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnstableOffsetCommit;

/// Replays records the shard just appended, at their offsets in the log.
fn replay_appended(
    offsets: &mut OffsetStore,
    pending: Option<&storage::PendingAck>,
    producer_id: Option<i64>,
    records: &[CoordinatorRecord],
) {
    let Some(pending) = pending else {
        // Nothing was appended (no records).
        debug_assert!(records.is_empty());
        return;
    };
    for (i, r) in records.iter().enumerate() {
        offsets.replay(pending.base_offset() + i as i64, producer_id, r);
    }
}

/// Why one partition of an OffsetCommit was not stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitError {
    OffsetMetadataTooLarge,
    Group(GroupError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteOffsetsError {
    Group(GroupError),
    Storage(GroupError),
}

/// The topics a consumer group's members subscribe to, from their
/// `ConsumerProtocolSubscription` metadata (Kafka's
/// `ClassicGroup.computeSubscribedTopics`).
fn subscribed_topics(group: &ClassicGroup) -> Option<std::collections::HashSet<String>> {
    use kafka_protocol::messages::ConsumerProtocolSubscription;
    use kafka_protocol::protocol::Decodable;
    let mut topics = std::collections::HashSet::new();
    for m in group.members() {
        let mut buf = m.metadata.clone();
        if buf.len() < 2 {
            return None;
        }
        let version = i16::from_be_bytes([buf[0], buf[1]]);
        bytes::Buf::advance(&mut buf, 2);
        // A member whose metadata does not decode could be subscribed to
        // anything; Kafka then treats the group as subscribed to every topic.
        let s = ConsumerProtocolSubscription::decode(&mut buf, version.clamp(0, 3)).ok()?;
        topics.extend(s.topics.into_iter().map(|t| t.to_string()));
    }
    Some(topics)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServerConfig;

    fn config(dir: &std::path::Path) -> ServerConfig {
        ServerConfig::from_pairs(
            [
                ("listeners", "PLAINTEXT://127.0.0.1:0"),
                ("log.dirs", dir.to_str().unwrap()),
                ("metrics.listen.address", "none"),
                ("offsets.topic.num.partitions", "2"),
                ("offsets.retention.minutes", "1"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        )
        .unwrap()
    }

    fn commit(offset: i64) -> CommitPartition {
        CommitPartition {
            topic: "t".into(),
            partition: 0,
            offset: OffsetAndMetadata {
                committed_offset: offset,
                committed_leader_epoch: None,
                metadata: String::new(),
                commit_timestamp_ms: now_ms(),
                expire_timestamp_ms: None,
                topic_id: None,
            },
        }
    }

    async fn committed(broker: &Broker, group: &str) -> Option<OffsetAndMetadata> {
        broker
            .groups
            .committed(group, &[("t".to_string(), 0)])
            .await
            .unwrap()
            .remove(0)
    }

    fn settings() -> Settings {
        Settings {
            classic: ClassicGroupConfig::default(),
            consumer: ConsumerGroupConfig::default(),
            offset_metadata_max_bytes: 4096,
            offsets_retention_ms: 60_000,
            offsets_retention_check_interval_ms: 60_000,
        }
    }

    fn logged(offset: i64, producer_id: Option<i64>, group: &str, committed: i64) -> LogEntry {
        LogEntry::Record {
            offset,
            producer_id,
            record: CoordinatorRecord::OffsetCommit {
                group_id: group.into(),
                topic: "t".into(),
                partition: 0,
                value: Some(commit(committed).offset),
            },
        }
    }

    fn loaded_offset(st: &State, group: &str) -> Option<i64> {
        st.offsets.fetch(group, "t", 0).map(|o| o.committed_offset)
    }

    #[test]
    fn a_load_applies_the_markers_it_finds_in_the_log() {
        let log = LoadedLog {
            entries: vec![
                logged(0, None, "g", 1),
                logged(1, Some(7), "g", 5),
                logged(2, Some(8), "h", 6),
                LogEntry::Marker {
                    producer_id: 7,
                    commit: true,
                },
                LogEntry::Marker {
                    producer_id: 8,
                    commit: false,
                },
            ],
            ..Default::default()
        };
        let st = State::load(&settings(), &log);
        assert_eq!(loaded_offset(&st, "g"), Some(5));
        assert_eq!(loaded_offset(&st, "h"), None);
        assert!(!st.offsets.has_pending("g", "t", 0));
        assert!(!st.offsets.has_pending("h", "t", 0));
    }

    #[test]
    fn a_load_keeps_a_transaction_without_a_marker_pending_and_its_group_known() {
        let mut producers = ProducerSequences::default();
        producers.record(7, 0, 0, 1);
        let log = LoadedLog {
            entries: vec![
                logged(0, None, "g", 1),
                logged(1, Some(7), "g", 5),
                logged(2, Some(7), "p", 9),
            ],
            producers,
            ..Default::default()
        };
        let mut st = State::load(&settings(), &log);
        assert_eq!(loaded_offset(&st, "g"), Some(1));
        assert!(st.offsets.has_pending("g", "t", 0));
        // A group with only a pending offset comes back as a simple group,
        // as Kafka's replay creates one.
        assert_eq!(
            st.classic.group("p").map(ClassicGroup::state),
            Some(GroupState::Empty)
        );
        assert_eq!(
            st.producers.next(7, 0),
            1,
            "sequences continue after a load"
        );
        // The transaction coordinator ends it later.
        st.offsets.replay_end_txn(7, true);
        assert_eq!(loaded_offset(&st, "g"), Some(5));
        assert_eq!(loaded_offset(&st, "p"), Some(9));
    }

    /// The tail read after a load replays what was appended from the offset
    /// the load reached, and nothing before it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_tail_read_after_a_load_replays_from_where_the_load_ended() {
        let dir = tempfile::tempdir().unwrap();
        let running = crate::start(config(dir.path())).await.unwrap();
        let broker = running.broker.clone();
        broker
            .create_topic(
                crate::broker::NewTopic {
                    name: OFFSETS_TOPIC.into(),
                    num_partitions: 2,
                    replication_factor: 1,
                    assignments: vec![],
                    configs: [("cleanup.policy".to_string(), "compact".to_string())].into(),
                },
                false,
            )
            .await
            .unwrap();
        let unknown = MemberId::unknown();
        let (results, pending) = broker
            .groups
            .commit_txn_offsets("g", 9, 0, &unknown, None, GenerationId(-1), vec![commit(5)])
            .await
            .unwrap();
        assert_eq!(results, vec![Ok(())]);
        let record_offset = pending.expect("appended").base_offset();
        let shard = broker.groups.shard("g").unwrap();

        let mut from_before = State::new(&settings());
        shard
            .catch_up(&mut from_before, record_offset)
            .await
            .unwrap();
        assert!(from_before.offsets.has_pending("g", "t", 0));
        assert_eq!(from_before.producers.next(9, 0), 1);

        let mut from_after = State::new(&settings());
        shard
            .catch_up(&mut from_after, record_offset + 1)
            .await
            .unwrap();
        assert!(!from_after.offsets.has_pending("g", "t", 0));
        drop(shard);
        drop(broker);
        running.shutdown().await;
    }

    /// The timer task's expiry pass, run with a clock moved past
    /// `offsets.retention.minutes`: an empty simple group loses its offsets
    /// and the group itself, in memory and in the log (a restart agrees).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn expired_offsets_are_tombstoned_and_stay_gone_after_restart() {
        let dir = tempfile::tempdir().unwrap();
        let running = crate::start(config(dir.path())).await.unwrap();
        let broker = running.broker.clone();
        broker
            .create_topic(
                crate::broker::NewTopic {
                    name: OFFSETS_TOPIC.into(),
                    num_partitions: 2,
                    replication_factor: 1,
                    assignments: vec![],
                    configs: [("cleanup.policy".to_string(), "compact".to_string())].into(),
                },
                false,
            )
            .await
            .unwrap();
        let unknown = MemberId::unknown();
        let results = broker
            .groups
            .commit_offsets("old", &unknown, None, GenerationId(-1), 8, vec![commit(5)])
            .await
            .unwrap()
            .0;
        assert_eq!(results, vec![Ok(())]);
        assert!(committed(&broker, "old").await.is_some());
        let now = now_ms();
        let shard = broker.groups.shard("old").unwrap();
        {
            let mut st = shard.lock().await.unwrap();
            // Not yet: one minute has not passed.
            shard.expire_offsets(&mut st, now + 1_000).await;
        }
        assert!(committed(&broker, "old").await.is_some());
        {
            let mut st = shard.lock().await.unwrap();
            shard.expire_offsets(&mut st, now + 61_000).await;
        }
        assert!(committed(&broker, "old").await.is_none());
        assert!(
            broker.groups.describe("old").await.unwrap().is_none(),
            "the empty group went too"
        );
        drop(shard);
        drop(broker);
        running.shutdown().await;

        let running = crate::start(config(dir.path())).await.unwrap();
        assert!(committed(&running.broker, "old").await.is_none());
        running.shutdown().await;
    }
}
