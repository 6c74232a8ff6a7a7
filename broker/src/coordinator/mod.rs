//! The group coordinator's runtime: the async side of `group/`.
//!
//! `group/` decides; this module keeps the decisions' promises. It holds the
//! state machines behind one lock, parks JoinGroup/SyncGroup requests until
//! a completion answers them, runs the timer task that calls `tick`, and
//! stores what must be stored (committed offsets, group metadata) in the
//! `__consumer_offsets` topic before anyone is answered, as Kafka does.
//!
//! Writes go through the same `Partition::append_as_leader` as a producer's
//! acks=all batch, so a committed offset carries the same promise as an
//! acked record (see docs/contract.md). The lock is a plain mutex: appends
//! are synchronous and short, and holding it across the append keeps the
//! order of writes in the log the order of the in-memory changes.

mod storage;

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::{oneshot, Notify};

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

pub use storage::{partition_of, StorageError, OFFSETS_TOPIC};

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

struct State {
    classic: crate::group::GroupCoordinator,
    consumer: ConsumerGroupCoordinator,
    /// What `__consumer_offsets` holds for each KIP-848 group: the snapshot
    /// last written. A change is written as the difference from it.
    stored_consumer: HashMap<String, ConsumerGroupSnapshot>,
    offsets: OffsetStore,
    parked_joins: HashMap<(String, MemberId), oneshot::Sender<JoinResponse>>,
    parked_syncs: HashMap<(String, MemberId), oneshot::Sender<SyncResponse>>,
    /// When the last offsets-retention pass ran.
    last_expiry_ms: i64,
    /// When group metrics were last published.
    last_metrics_ms: i64,
    /// The `__consumer_offsets` partitions whose groups are loaded here: the
    /// ones this node leads. Groups of other partitions belong to their leaders.
    owned: std::collections::BTreeSet<i32>,
    /// The partition count of `__consumer_offsets` (0 before it exists).
    offsets_partitions: i32,
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

pub struct GroupService {
    state: Mutex<State>,
    /// Wakes the timer task when a call may have moved a deadline earlier.
    wake: Notify,
    offset_metadata_max_bytes: usize,
    offsets_retention_ms: i64,
    offsets_retention_check_interval_ms: i64,
}

/// How a parked request ends if its slot is taken by a newer request of the
/// same member, or the group is dropped without answering it: the client
/// rejoins, which is always safe.
const ABANDONED: GroupError = GroupError::RebalanceInProgress;

impl GroupService {
    pub fn new(config: &ServerConfig) -> Self {
        GroupService {
            state: Mutex::new(State {
                classic: crate::group::GroupCoordinator::new(classic_config(config)),
                consumer: ConsumerGroupCoordinator::new(
                    consumer_config(config).unwrap_or_default(),
                ),
                stored_consumer: HashMap::new(),
                offsets: OffsetStore::new(),
                parked_joins: HashMap::new(),
                parked_syncs: HashMap::new(),
                last_expiry_ms: now_ms(),
                last_metrics_ms: 0,
                owned: std::collections::BTreeSet::new(),
                offsets_partitions: 0,
            }),
            wake: Notify::new(),
            offset_metadata_max_bytes: config.offset_metadata_max_bytes,
            offsets_retention_ms: config.offsets_retention_ms,
            offsets_retention_check_interval_ms: config.offsets_retention_check_interval_ms,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("group state poisoned")
    }

    /// Answers whether this node coordinates `group_id` now: NOT_COORDINATOR
    /// when another broker leads the group's `__consumer_offsets` partition
    /// (the client looks the coordinator up again), COORDINATOR_NOT_AVAILABLE
    /// before the topic exists.
    pub fn check_coordinator(&self, group_id: &str) -> Result<(), GroupError> {
        gate(&self.lock(), group_id)
    }

    /// Follows leadership of `__consumer_offsets`: loads the groups of each
    /// partition this node has come to lead, and drops (answering parked
    /// requests with NOT_COORDINATOR) the groups of each partition it no
    /// longer leads, as Kafka's coordinator loads and unloads on leader
    /// change. Called at start and after every metadata change; returns the
    /// number of records loaded.
    pub fn sync_ownership(&self, broker: &Broker) -> Result<usize, StorageError> {
        let image = broker.metadata.image();
        let me = broker.node_id();
        let (count, led): (i32, std::collections::BTreeSet<i32>) =
            match image.topics.get(OFFSETS_TOPIC) {
                Some(t) => (
                    t.partitions.len() as i32,
                    t.partitions
                        .iter()
                        .filter(|p| {
                            p.leader == me
                                && broker
                                    .replicas
                                    .get(&crate::types::TopicPartition::new(
                                        OFFSETS_TOPIC,
                                        p.partition,
                                    ))
                                    .is_some()
                        })
                        .map(|p| p.partition)
                        .collect(),
                ),
                None => (0, Default::default()),
            };
        let (gained, lost): (Vec<i32>, Vec<i32>) = {
            let st = self.lock();
            if st.offsets_partitions == count && st.owned == led {
                return Ok(0);
            }
            (
                led.difference(&st.owned).copied().collect(),
                st.owned.difference(&led).copied().collect(),
            )
        };
        if !lost.is_empty() {
            let mut st = self.lock();
            let now = now_ms();
            let in_lost = |g: &str| lost.contains(&crate::group::offsets::partition_for(g, count));
            let mut groups: Vec<String> = st
                .offsets
                .groups()
                .chain(st.classic.groups().map(|g| g.group_id()))
                .chain(st.consumer.groups().map(|g| g.group_id()))
                .filter(|g| in_lost(g))
                .map(str::to_string)
                .collect();
            groups.sort();
            groups.dedup();
            let ids: Vec<&str> = groups.iter().map(String::as_str).collect();
            for (group_id, completed) in st.classic.unload(&ids, now) {
                self.complete(broker, &mut st, &group_id, completed);
            }
            st.consumer.unload(&ids);
            for g in &ids {
                st.offsets.unload(g);
                st.stored_consumer.remove(*g);
            }
            st.parked_joins.retain(|(g, _), _| !in_lost(g));
            st.parked_syncs.retain(|(g, _), _| !in_lost(g));
            for p in &lost {
                st.owned.remove(p);
            }
            tracing::info!(partitions = ?lost, groups = ids.len(), "no longer coordinating; groups unloaded");
        }
        let mut loaded = 0;
        for p in gained {
            let records = storage::read_partition(broker, p)?;
            loaded += records.len();
            self.load_records(&records);
            self.lock().owned.insert(p);
            tracing::info!(
                partition = p,
                records = records.len(),
                "coordinating the groups of {OFFSETS_TOPIC} partition"
            );
        }
        self.lock().offsets_partitions = count;
        self.wake.notify_one();
        Ok(loaded)
    }

    /// Adds the groups and offsets `records` describe (one partition's worth,
    /// in log order).
    fn load_records(&self, records: &[CoordinatorRecord]) {
        let now = now_ms();
        let mut st = self.lock();
        let mut replay = ConsumerGroupReplay::new();
        for r in records {
            st.offsets.apply(r);
            replay.apply(r);
        }
        let consumer_config = st.consumer.config().clone();
        for snapshot in replay.snapshots(&consumer_config) {
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
        // Only the groups these records name: groups of other partitions
        // loaded earlier are live and must not be replaced.
        let named: std::collections::BTreeSet<&str> =
            records.iter().filter_map(|r| r.group_id()).collect();
        let config = st.classic.config().clone();
        let restored: Vec<ClassicGroup> = st
            .offsets
            .group_metadata_all()
            .filter(|(group_id, _)| named.contains(group_id))
            .map(|(group_id, m)| {
                ClassicGroup::from_group_metadata(group_id, config.clone(), m.clone(), now)
            })
            .collect();
        for group in restored {
            st.classic.insert_loaded(group);
        }
        // A group that only ever committed offsets (an admin client, or a
        // consumer that assigns partitions itself) has no metadata record;
        // it comes back as an empty group, as in Kafka's replay.
        let offset_groups: Vec<String> = st
            .offsets
            .groups()
            .filter(|g| named.contains(g))
            .map(str::to_string)
            .collect();
        for group_id in offset_groups {
            if st.classic.group(&group_id).is_none() && st.consumer.group(&group_id).is_none() {
                st.classic
                    .insert_loaded(ClassicGroup::new(&group_id, config.clone(), now));
            }
        }
    }

    // ---------------------------------------------------------------- classic

    pub async fn join(
        &self,
        broker: &Broker,
        group_id: &str,
        request: JoinRequest,
    ) -> JoinResponse {
        let member_id = request.member_id.clone();
        let waiting = {
            let now = now_ms();
            let mut st = self.lock();
            if let Err(e) = gate(&st, group_id) {
                return JoinResponse::error(request.member_id, e);
            }
            if let Err(e) = st.consumer.make_way_for_classic_group(group_id) {
                return JoinResponse::error(request.member_id, e);
            }
            let out = st.classic.join(group_id, request, now);
            let waiting = match out.reply {
                Reply::Now(r) => Err(r),
                Reply::Parked(m) => {
                    let (tx, rx) = oneshot::channel();
                    st.parked_joins
                        .insert((group_id.to_string(), m.clone()), tx);
                    Ok((m, rx))
                }
            };
            self.complete(broker, &mut st, group_id, out.completed);
            waiting
        };
        self.wake.notify_one();
        match waiting {
            Err(r) => r,
            Ok((m, rx)) => rx.await.unwrap_or_else(|_| {
                JoinResponse::error(if m.is_unknown() { member_id } else { m }, ABANDONED)
            }),
        }
    }

    pub async fn sync(
        &self,
        broker: &Broker,
        group_id: &str,
        request: SyncRequest,
    ) -> SyncResponse {
        let waiting = {
            let now = now_ms();
            let mut st = self.lock();
            if let Err(e) = gate(&st, group_id) {
                return SyncResponse::error(e);
            }
            let out = st.classic.sync(group_id, request, now);
            let waiting = match out.reply {
                Reply::Now(r) => Err(r),
                Reply::Parked(m) => {
                    let (tx, rx) = oneshot::channel();
                    st.parked_syncs.insert((group_id.to_string(), m), tx);
                    Ok(rx)
                }
            };
            self.complete(broker, &mut st, group_id, out.completed);
            waiting
        };
        self.wake.notify_one();
        match waiting {
            Err(r) => r,
            Ok(rx) => rx.await.unwrap_or_else(|_| SyncResponse::error(ABANDONED)),
        }
    }

    pub fn heartbeat(&self, group_id: &str, request: &HeartbeatRequest) -> Result<(), GroupError> {
        let mut st = self.lock();
        gate(&st, group_id)?;
        let r = st.classic.heartbeat(group_id, request, now_ms());
        drop(st);
        self.wake.notify_one();
        r
    }

    pub fn leave(
        &self,
        broker: &Broker,
        group_id: &str,
        members: &[LeaveMember],
    ) -> Result<Vec<LeaveMemberResponse>, GroupError> {
        let mut st = self.lock();
        gate(&st, group_id)?;
        let out = st.classic.leave(group_id, members, now_ms());
        self.complete(broker, &mut st, group_id, out.completed);
        drop(st);
        self.wake.notify_one();
        out.result
    }

    /// Stores what a call's completions require, then answers the parked
    /// requests they name. Called with the lock held.
    fn complete(&self, broker: &Broker, st: &mut State, group_id: &str, completed: Completions) {
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
                match storage::append(broker, group_id, std::slice::from_ref(&record)) {
                    Ok(()) => st.offsets.apply(&record),
                    Err(e) => {
                        tracing::error!(group = group_id, error = %e, "storing group metadata failed");
                        failure = Some(e.group_error());
                    }
                }
            }
        }
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

    /// The timer task: fires group deadlines and runs offset expiry, until
    /// `shutdown` flips.
    pub async fn run_timers(
        &self,
        broker: &Broker,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        loop {
            let now = now_ms();
            let next = {
                let st = self.lock();
                let expiry = (st.last_expiry_ms + self.offsets_retention_check_interval_ms)
                    .min(st.last_metrics_ms + METRICS_INTERVAL_MS);
                st.classic
                    .next_deadline_ms()
                    .map_or(expiry, |d| d.min(expiry))
            };
            let wait_ms = (next - now).clamp(0, 60_000) as u64;
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_millis(wait_ms)) => {}
                _ = self.wake.notified() => {}
                _ = shutdown.changed() => return,
            }
            let now = now_ms();
            let mut st = self.lock();
            for (group_id, completed) in st.classic.tick(now) {
                self.complete(broker, &mut st, &group_id, completed);
            }
            for group_id in st.consumer.tick(now) {
                if let Err(e) = self.persist_consumer_group(broker, &mut st, &group_id) {
                    tracing::error!(group = %group_id, error = %e, "storing a consumer group failed");
                }
            }
            if now >= st.last_expiry_ms + self.offsets_retention_check_interval_ms {
                st.last_expiry_ms = now;
                self.expire_offsets(broker, &mut st, now);
            }
            if now >= st.last_metrics_ms + METRICS_INTERVAL_MS {
                st.last_metrics_ms = now;
                publish_metrics(broker, &st, now);
            }
        }
    }

    /// Kafka's periodic cleanup: tombstones for expired offsets, and for
    /// empty groups left with no offsets.
    fn expire_offsets(&self, broker: &Broker, st: &mut State, now: i64) {
        let expiration = {
            let State {
                classic, offsets, ..
            } = &*st;
            offsets.expired_records(now, self.offsets_retention_ms, |g| {
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
        for (group_id, records) in &by_group {
            match storage::append(broker, group_id, records) {
                Ok(()) => records.iter().for_each(|r| st.offsets.apply(r)),
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

    // ---------------------------------------------------------------- KIP-848

    /// ConsumerGroupHeartbeat.
    pub fn consumer_heartbeat(
        &self,
        broker: &Broker,
        group_id: &str,
        request: ConsumerHeartbeat,
    ) -> Result<ConsumerHeartbeatReply, GroupError> {
        let now = now_ms();
        let topics = ImageTopics(broker.metadata.image());
        let mut st = self.lock();
        gate(&st, group_id)?;
        let State {
            classic, consumer, ..
        } = &mut *st;
        make_way_for_consumer_group(classic, group_id, request.member_epoch, now)?;
        let joined = request.member_epoch == Epoch::JOIN;
        let r = consumer.heartbeat(group_id, request, &topics, now);
        // The reply waits for the change it reports to be stored, as in
        // Kafka. A failed write fails the heartbeat (the member retries);
        // the next write stores the difference from what is on disk.
        let stored = self.persist_consumer_group(broker, &mut st, group_id);
        drop(st);
        if let Err(e) = stored {
            tracing::error!(group = group_id, error = %e, "storing a consumer group failed");
            return Err(e.group_error());
        }
        if joined {
            self.wake.notify_one();
        }
        r
    }

    /// Writes the records that bring `__consumer_offsets` from the stored
    /// snapshot of a KIP-848 group to its current state: tombstones for
    /// members that left, the group's records, or the whole group's
    /// tombstones once it is gone. Nothing when nothing changed.
    fn persist_consumer_group(
        &self,
        broker: &Broker,
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
        storage::append(broker, group_id, &records)?;
        match current {
            Some(cur) => st.stored_consumer.insert(group_id.to_string(), cur),
            None => st.stored_consumer.remove(group_id),
        };
        Ok(())
    }

    pub fn consumer_describe(
        &self,
        broker: &Broker,
        group_id: &str,
    ) -> Result<ConsumerGroupDescription, GroupError> {
        let topics = ImageTopics(broker.metadata.image());
        let st = self.lock();
        gate(&st, group_id)?;
        if st.consumer.group(group_id).is_none() && st.classic.group(group_id).is_some() {
            // Kafka: "Group {} is not a consumer group."
            return Err(GroupError::GroupIdNotFound);
        }
        st.consumer.describe(group_id, &topics)
    }

    /// Answers every parked request (the broker is stopping).
    pub fn abandon_parked(&self) {
        let mut st = self.lock();
        st.parked_joins.clear();
        st.parked_syncs.clear();
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
    pub fn commit_offsets(
        &self,
        broker: &Broker,
        group_id: &str,
        member_id: &MemberId,
        group_instance_id: Option<&GroupInstanceId>,
        generation_id: GenerationId,
        api_version: i16,
        partitions: Vec<CommitPartition>,
    ) -> Result<CommitOutcome, GroupError> {
        let now = now_ms();
        let mut st = self.lock();
        gate(&st, group_id)?;
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
            if p.offset.metadata.len() > self.offset_metadata_max_bytes {
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
            match storage::append_acked(broker, group_id, &records) {
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
            for r in &records {
                st.offsets.apply(r);
            }
        }
        Ok((results, pending))
    }

    /// OffsetFetch v9+ from a member of a KIP-848 group: its epoch must be
    /// current (STALE_MEMBER_EPOCH otherwise), so a fenced member cannot
    /// resume from offsets its replacement is moving. Anyone else (admin
    /// clients, classic groups) fetches freely.
    pub fn validate_offset_fetch(
        &self,
        group_id: &str,
        member_id: Option<&str>,
        member_epoch: i32,
    ) -> Result<(), GroupError> {
        let st = self.lock();
        gate(&st, group_id)?;
        if st.consumer.group(group_id).is_none() {
            return Ok(());
        }
        let member = member_id.map(|m| MemberId(m.to_string()));
        st.consumer
            .validate_offset_fetch(group_id, member.as_ref(), Epoch(member_epoch))
    }

    /// The committed offset of one partition, if any.
    pub fn committed(
        &self,
        group_id: &str,
        topic: &str,
        partition: i32,
    ) -> Option<OffsetAndMetadata> {
        self.lock()
            .offsets
            .fetch(group_id, topic, partition)
            .cloned()
    }

    /// Every committed offset of a group, sorted by topic and partition.
    pub fn committed_all(&self, group_id: &str) -> Vec<(String, i32, OffsetAndMetadata)> {
        self.lock()
            .offsets
            .fetch_group(group_id)
            .map(|(t, p, o)| (t.to_string(), p, o.clone()))
            .collect()
    }

    /// OffsetDelete: removes a group's offsets for partitions the group is
    /// not consuming. Returns per-partition errors (None = deleted).
    pub fn delete_offsets(
        &self,
        broker: &Broker,
        group_id: &str,
        topics: &[(String, Vec<i32>)],
    ) -> Result<Vec<TopicOffsetDeletion>, DeleteOffsetsError> {
        let mut st = self.lock();
        gate(&st, group_id).map_err(DeleteOffsetsError::Group)?;
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
            if let Err(e) = storage::append(broker, group_id, &records) {
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
    pub fn on_topic_deleted(&self, broker: &Broker, topic: &str) {
        let mut st = self.lock();
        let groups: Vec<String> = st.offsets.groups().map(str::to_string).collect();
        for group_id in groups {
            let partitions: Vec<i32> = st
                .offsets
                .fetch_group(&group_id)
                .filter(|(t, _, _)| *t == topic)
                .map(|(_, p, _)| p)
                .collect();
            if partitions.is_empty() {
                continue;
            }
            let records = st
                .offsets
                .delete_partition_records(&group_id, topic, &partitions);
            match storage::append(broker, &group_id, &records) {
                Ok(()) => records.iter().for_each(|r| st.offsets.apply(r)),
                Err(e) => {
                    tracing::error!(group = %group_id, topic, error = %e, "removing offsets of a deleted topic failed")
                }
            }
        }
    }

    // ------------------------------------------------------------------ admin

    pub fn list(&self) -> Vec<GroupSummary> {
        let st = self.lock();
        let mut out: Vec<GroupSummary> = st
            .classic
            .groups()
            .filter(|g| g.state() != GroupState::Dead)
            .map(|g| GroupSummary {
                group_id: g.group_id().to_string(),
                protocol_type: g.protocol_type().unwrap_or_default().to_string(),
                state: g.state().as_str(),
                group_type: "classic",
            })
            .collect();
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
        out.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        out
    }

    pub fn describe(&self, group_id: &str) -> Option<GroupDescription> {
        let st = self.lock();
        let g = st.classic.group(group_id)?;
        // Kafka hands out member metadata and assignments only once the
        // group is Stable: before that they belong to a generation in flux.
        let stable = g.state() == GroupState::Stable;
        Some(GroupDescription {
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
        })
    }

    /// DeleteGroups for one group: only an empty group goes, with its offsets.
    pub fn delete_group(&self, broker: &Broker, group_id: &str) -> Result<(), GroupError> {
        let now = now_ms();
        let mut st = self.lock();
        gate(&st, group_id)?;
        let consumer_group = st.consumer.group(group_id).is_some();
        match (st.classic.group(group_id), st.consumer.group(group_id)) {
            (Some(g), _) => g.validate_delete()?,
            (None, Some(g)) if g.state() != ConsumerGroupState::Empty => {
                return Err(GroupError::NonEmptyGroup)
            }
            (None, Some(_)) => {}
            (None, None) => return Err(GroupError::GroupIdNotFound),
        }
        let records = st.offsets.delete_group_records(group_id);
        let forget = |st: &mut State| {
            if consumer_group {
                st.consumer.delete_group(group_id)
            } else {
                st.classic.delete_group(group_id, now)
            }
        };
        if !records.is_empty() {
            if let Err(e) = storage::append(broker, group_id, &records) {
                tracing::error!(group = group_id, error = %e, "storing group deletion failed");
                return Err(e.group_error());
            }
        }
        for r in &records {
            st.offsets.apply(r);
        }
        forget(&mut st)?;
        if consumer_group {
            self.persist_consumer_group(broker, &mut st, group_id)
                .map_err(|e| e.group_error())?;
        }
        Ok(())
    }
}

/// Members per group, and per committed partition: the committed offset,
/// the lag in records (high watermark - committed) and, when records are
/// waiting, the lag in time: now - the timestamp of the first batch at the
/// committed offset (a batch's first timestamp, so it can overstate the lag
/// by the time one batch spans).
/// Whether this node coordinates `group_id` (see `check_coordinator`).
fn gate(st: &State, group_id: &str) -> Result<(), GroupError> {
    if st.offsets_partitions == 0 {
        return Err(GroupError::CoordinatorNotAvailable);
    }
    let partition = crate::group::offsets::partition_for(group_id, st.offsets_partitions);
    if st.owned.contains(&partition) {
        Ok(())
    } else {
        Err(GroupError::NotCoordinator)
    }
}

fn publish_metrics(broker: &Broker, st: &State, now: i64) {
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
    let groups: Vec<&str> = st.offsets.groups().collect();
    for group_id in groups {
        for (topic, partition, o) in st.offsets.fetch_group(group_id) {
            let labels = [
                ("group", group_id.to_string()),
                ("topic", topic.to_string()),
                ("partition", partition.to_string()),
            ];
            metrics::gauge!("kafka_group_committed_offset", &labels).set(o.committed_offset as f64);
            let Some(part) = broker
                .replicas
                .get(&crate::types::TopicPartition::new(topic, partition))
            else {
                continue;
            };
            let part = part.lock().expect("partition poisoned");
            let hw = part.high_watermark().0;
            let lag = (hw - o.committed_offset).max(0);
            metrics::gauge!("kafka_group_lag", &labels).set(lag as f64);
            let lag_seconds = if lag == 0 {
                0.0
            } else {
                part.read(
                    crate::types::Offset(o.committed_offset.max(part.log_start_offset().0)),
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
            .commit_offsets(
                &broker,
                "old",
                &unknown,
                None,
                GenerationId(-1),
                8,
                vec![commit(5)],
            )
            .unwrap()
            .0;
        assert_eq!(results, vec![Ok(())]);
        assert!(broker.groups.committed("old", "t", 0).is_some());
        let now = now_ms();
        {
            let mut st = broker.groups.lock();
            // Not yet: one minute has not passed.
            broker.groups.expire_offsets(&broker, &mut st, now + 1_000);
        }
        assert!(broker.groups.committed("old", "t", 0).is_some());
        {
            let mut st = broker.groups.lock();
            broker.groups.expire_offsets(&broker, &mut st, now + 61_000);
        }
        assert!(broker.groups.committed("old", "t", 0).is_none());
        assert!(
            broker.groups.describe("old").is_none(),
            "the empty group went too"
        );
        drop(broker);
        running.shutdown().await;

        let running = crate::start(config(dir.path())).await.unwrap();
        assert!(running.broker.groups.committed("old", "t", 0).is_none());
        running.shutdown().await;
    }
}
