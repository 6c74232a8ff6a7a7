//! The committed offsets (and stored classic group metadata) of every group
//! one coordinator owns, as the records of its `__consumer_offsets`
//! partition say they are.
//!
//! Modelled on Kafka's `OffsetMetadataManager`. The store changes only
//! through [`OffsetStore::replay`] (or [`OffsetStore::apply`]) and
//! [`OffsetStore::replay_end_txn`], called for each record and transaction
//! marker when a partition is loaded and again after each append, so memory
//! always equals a replay of the log: last write wins, tombstones delete.
//! Everything that deletes (DeleteGroups, OffsetDelete, expiration) returns
//! the tombstones to append rather than changing the store, so nothing is
//! forgotten that the log still holds.
//!
//! After a load, restore each classic group from
//! [`OffsetStore::group_metadata_all`]; a group that has offsets
//! ([`OffsetStore::groups`]) but no stored metadata is, as Kafka's replay
//! makes it, an Empty classic group without a protocol type ("simple").
//!
//! Transactional offsets (TxnOffsetCommit) are pending per producer id until
//! the transaction's marker: a commit moves them into the committed offsets
//! (only where their record is later in the log than the committed one, as
//! Kafka orders a mix of both), an abort drops them. Pending offsets are not
//! fetched, keep their partition's committed offset from expiring and their
//! group from being deleted as empty, and are tombstoned with it.
//!
//! Invariant: no clocks and no I/O; expiration takes `now_ms` and the
//! groups' states from the caller.

use std::collections::{BTreeMap, BTreeSet};

use uuid::Uuid;

use super::records::CoordinatorRecord;
use super::GroupMetadata;

/// A committed offset, as Kafka keeps it (`OffsetAndMetadata`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetAndMetadata {
    /// The next offset the group will consume.
    pub committed_offset: i64,
    /// The leader epoch of the last consumed record, when the client knows it.
    pub committed_leader_epoch: Option<i32>,
    /// The client's opaque string; Kafka stores a null as "".
    pub metadata: String,
    pub commit_timestamp_ms: i64,
    /// Only OffsetCommit v1 requests set this (their per-partition
    /// timestamp); it then replaces the retention rule for this offset.
    pub expire_timestamp_ms: Option<i64>,
    /// The topic's id when the committer named it (OffsetCommit v10+) or the
    /// broker knew it; Kafka 4.1+ persists it so that an offset of a deleted
    /// topic is not served for a new topic of the same name. `Some(nil)` is
    /// written as unknown (Kafka's default) and reads back as `None`.
    pub topic_id: Option<Uuid>,
}

/// What the caller knows about a group when offsets are expired, mirroring
/// the cases of Kafka's `Group.offsetExpirationCondition` and
/// `Group.isSubscribedToTopic`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupExpiryState {
    /// A classic group in Empty that has a protocol type (it had members).
    /// Its offsets expire `retention` after the group became empty
    /// (`since_ms`, its current state timestamp), however recent the commit;
    /// `since_ms` is `None` when the group was loaded from metadata without
    /// that timestamp (GroupMetadataValue v0/v1), and the commit time is used.
    ClassicEmpty { since_ms: Option<i64> },
    /// A classic group without a protocol type: it only holds offsets
    /// committed by consumers that assign partitions themselves or by admin
    /// tools, and is always Empty. Offsets expire `retention` after their
    /// commit. This is also what Kafka makes of offsets whose group it does
    /// not otherwise know (replaying an offset commit creates such a group).
    ClassicSimple,
    /// A classic group with members. `subscribed_topics` is `Some` only when
    /// the group is Stable, its protocol type is `consumer` and its members'
    /// subscriptions are known; then offsets of topics outside the set expire
    /// `retention` after their commit. With `None` nothing expires.
    ClassicActive {
        subscribed_topics: Option<BTreeSet<String>>,
    },
    /// A KIP-848 consumer group: offsets of topics no member subscribes to
    /// (by name or through a resolved regular expression) expire `retention`
    /// after their commit. `is_empty` (no members) makes the group deletable
    /// once no offsets remain.
    Consumer {
        subscribed_topics: BTreeSet<String>,
        is_empty: bool,
    },
}

impl GroupExpiryState {
    /// Whether Kafka would delete the group once it has no offsets left
    /// (`Group.isEmpty`).
    fn is_empty(&self) -> bool {
        match self {
            GroupExpiryState::ClassicEmpty { .. } | GroupExpiryState::ClassicSimple => true,
            GroupExpiryState::ClassicActive { .. } => false,
            GroupExpiryState::Consumer { is_empty, .. } => *is_empty,
        }
    }

    fn is_classic(&self) -> bool {
        match self {
            GroupExpiryState::ClassicEmpty { .. }
            | GroupExpiryState::ClassicSimple
            | GroupExpiryState::ClassicActive { .. } => true,
            GroupExpiryState::Consumer { .. } => false,
        }
    }

    /// Kafka's `offsetExpirationCondition` with the group's subscriptions,
    /// or `None` when no offset of this group can expire.
    fn condition(&self) -> Option<ExpiryCondition<'_>> {
        match self {
            GroupExpiryState::ClassicEmpty { since_ms } => Some(ExpiryCondition {
                since_ms: *since_ms,
                subscribed_topics: None,
            }),
            GroupExpiryState::ClassicSimple => Some(ExpiryCondition {
                since_ms: None,
                subscribed_topics: None,
            }),
            GroupExpiryState::ClassicActive { subscribed_topics } => {
                subscribed_topics.as_ref().map(|topics| ExpiryCondition {
                    since_ms: None,
                    subscribed_topics: Some(topics),
                })
            }
            GroupExpiryState::Consumer {
                subscribed_topics, ..
            } => Some(ExpiryCondition {
                since_ms: None,
                subscribed_topics: Some(subscribed_topics),
            }),
        }
    }
}

/// Kafka's `OffsetExpirationConditionImpl` plus the group's subscriptions.
struct ExpiryCondition<'a> {
    /// The base timestamp when set; otherwise each offset's commit time.
    since_ms: Option<i64>,
    subscribed_topics: Option<&'a BTreeSet<String>>,
}

impl ExpiryCondition<'_> {
    fn is_subscribed(&self, topic: &str) -> bool {
        self.subscribed_topics.is_some_and(|t| t.contains(topic))
    }

    /// Kafka's `isOffsetExpired`: an explicit expire timestamp (OffsetCommit
    /// v1) wins; otherwise the offset expires once `retention_ms` has passed
    /// since the base timestamp, boundary included.
    fn is_expired(&self, offset: &OffsetAndMetadata, now_ms: i64, retention_ms: i64) -> bool {
        match offset.expire_timestamp_ms {
            Some(expire_ms) => now_ms >= expire_ms,
            None => {
                let base_ms = self.since_ms.unwrap_or(offset.commit_timestamp_ms);
                now_ms.saturating_sub(base_ms) >= retention_ms
            }
        }
    }
}

/// The result of [`OffsetStore::expired_records`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OffsetExpiration {
    /// The tombstones to append, group by group: the group's expired
    /// offsets, then its GroupMetadata tombstone if the classic group is
    /// deleted.
    pub records: Vec<CoordinatorRecord>,
    /// Groups that are empty and have no offsets left once `records` are
    /// applied; Kafka deletes them. A classic group's tombstone is already in
    /// `records`; a KIP-848 group's own tombstones are the caller's to write.
    pub deleted_groups: Vec<String>,
}

/// An offset as the log holds it: the offset of its record orders a
/// transaction's commit against plain commits of the same partition.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stored {
    offset: OffsetAndMetadata,
    record_offset: i64,
}

#[derive(Clone, Debug, Default)]
struct GroupOffsets {
    /// topic -> partition -> offset; both levels sorted, so fetches of a
    /// whole group come out in the order OffsetFetch answers.
    topics: BTreeMap<String, BTreeMap<i32, Stored>>,
}

impl GroupOffsets {
    fn put(&mut self, topic: &str, partition: i32, stored: Stored) {
        self.topics
            .entry(topic.to_string())
            .or_default()
            .insert(partition, stored);
    }

    fn get(&self, topic: &str, partition: i32) -> Option<&Stored> {
        self.topics.get(topic)?.get(&partition)
    }

    fn remove(&mut self, topic: &str, partition: i32) {
        if let Some(partitions) = self.topics.get_mut(topic) {
            partitions.remove(&partition);
            if partitions.is_empty() {
                self.topics.remove(topic);
            }
        }
    }

    fn partitions(&self) -> impl Iterator<Item = (&str, i32, &Stored)> {
        self.topics.iter().flat_map(|(topic, partitions)| {
            partitions
                .iter()
                .map(move |(partition, stored)| (topic.as_str(), *partition, stored))
        })
    }
}

/// A topic partition of a group that one or more transactions have a
/// pending offset for.
type GroupPartition = (String, String, i32);

/// The offsets and classic group metadata of one coordinator.
#[derive(Clone, Debug, Default)]
pub struct OffsetStore {
    offsets: BTreeMap<String, GroupOffsets>,
    group_metadata: BTreeMap<String, GroupMetadata>,
    /// Producer id -> group -> the offsets its open transaction committed
    /// (Kafka's `pendingTransactionalOffsets`).
    pending: BTreeMap<i64, BTreeMap<String, GroupOffsets>>,
    /// (group, topic, partition) -> the producers with a pending offset for
    /// it (Kafka's `OpenTransactions`), so that fetch, expiry and deletion
    /// ask one map rather than every transaction.
    open: BTreeMap<GroupPartition, BTreeSet<i64>>,
    /// One past the last record offset replayed: where [`OffsetStore::apply`]
    /// places a record whose position the caller does not give.
    next_record_offset: i64,
}

impl OffsetStore {
    pub fn new() -> Self {
        OffsetStore::default()
    }

    /// Applies one non-transactional record as the next record of the log
    /// (after every record replayed so far). For callers that do not track
    /// log offsets; the coordinator uses [`replay`](Self::replay).
    pub fn apply(&mut self, record: &CoordinatorRecord) {
        self.replay(self.next_record_offset, None, record);
    }

    /// Replays one record at `record_offset` of the log: when loading the
    /// partition, and after each successful append. `producer_id` is the
    /// producer of a transactional batch (Kafka: any batch with a producer
    /// id), whose offset commits stay pending until the transaction's
    /// marker. Last write wins; a tombstone deletes the committed offset and
    /// every pending one of that partition; record types this store does not
    /// keep are skipped, as Kafka's loader skips them.
    pub fn replay(
        &mut self,
        record_offset: i64,
        producer_id: Option<i64>,
        record: &CoordinatorRecord,
    ) {
        self.next_record_offset = self.next_record_offset.max(record_offset + 1);
        match record {
            CoordinatorRecord::OffsetCommit {
                group_id,
                topic,
                partition,
                value: Some(offset),
            } => {
                let stored = Stored {
                    offset: offset.clone(),
                    record_offset,
                };
                match producer_id {
                    None => self
                        .offsets
                        .entry(group_id.clone())
                        .or_default()
                        .put(topic, *partition, stored),
                    Some(pid) => {
                        self.pending
                            .entry(pid)
                            .or_default()
                            .entry(group_id.clone())
                            .or_default()
                            .put(topic, *partition, stored);
                        self.open
                            .entry((group_id.clone(), topic.clone(), *partition))
                            .or_default()
                            .insert(pid);
                    }
                }
            }
            CoordinatorRecord::OffsetCommit {
                group_id,
                topic,
                partition,
                value: None,
            } => {
                self.remove_committed(group_id, topic, *partition);
                self.remove_pending(group_id, topic, *partition);
            }
            CoordinatorRecord::GroupMetadata {
                group_id,
                value: Some(metadata),
            } => {
                self.group_metadata
                    .insert(group_id.clone(), metadata.clone());
            }
            CoordinatorRecord::GroupMetadata {
                group_id,
                value: None,
            } => {
                self.group_metadata.remove(group_id.as_str());
            }
            CoordinatorRecord::ConsumerGroup(_) | CoordinatorRecord::Other { .. } => {}
        }
    }

    /// A transaction marker of `producer_id` (Kafka's
    /// `replayEndTransactionMarker`): a commit makes its pending offsets the
    /// committed ones, except where a committed offset's record is later in
    /// the log (a plain commit after the transactional one wins, so
    /// compaction of the topic cannot change which offset a reload sees); an
    /// abort drops them. A marker without pending offsets changes nothing.
    pub fn replay_end_txn(&mut self, producer_id: i64, commit: bool) {
        let Some(groups) = self.pending.remove(&producer_id) else {
            return;
        };
        for (group_id, pending) in groups {
            for (topic, partition, stored) in pending.partitions() {
                let key = (group_id.clone(), topic.to_string(), partition);
                if let Some(producers) = self.open.get_mut(&key) {
                    producers.remove(&producer_id);
                    if producers.is_empty() {
                        self.open.remove(&key);
                    }
                }
                if !commit {
                    continue;
                }
                let committed = self.offsets.entry(group_id.clone()).or_default();
                let later = committed
                    .get(topic, partition)
                    .is_none_or(|c| stored.record_offset > c.record_offset);
                if later {
                    committed.put(topic, partition, stored.clone());
                }
            }
            // A commit that kept nothing must not leave an empty group.
            if self
                .offsets
                .get(&group_id)
                .is_some_and(|g| g.topics.is_empty())
            {
                self.offsets.remove(&group_id);
            }
        }
    }

    fn remove_committed(&mut self, group_id: &str, topic: &str, partition: i32) {
        let Some(group) = self.offsets.get_mut(group_id) else {
            return;
        };
        group.remove(topic, partition);
        // Pruned so that `groups` and `has_offsets` never report a group
        // whose offsets are all deleted.
        if group.topics.is_empty() {
            self.offsets.remove(group_id);
        }
    }

    /// A tombstone also deletes every pending offset of the partition; the
    /// producers' transactions stay open for their other partitions.
    fn remove_pending(&mut self, group_id: &str, topic: &str, partition: i32) {
        let key = (group_id.to_string(), topic.to_string(), partition);
        let Some(producers) = self.open.remove(&key) else {
            return;
        };
        for pid in producers {
            if let Some(group) = self.pending.get_mut(&pid).and_then(|g| g.get_mut(group_id)) {
                group.remove(topic, partition);
            }
        }
    }

    /// Whether a transaction has a pending offset for the partition: an
    /// OffsetFetch that requires stable offsets is then answered
    /// UNSTABLE_OFFSET_COMMIT (Kafka's `hasPendingTransactionalOffsets`).
    pub fn has_pending(&self, group_id: &str, topic: &str, partition: i32) -> bool {
        self.open
            .contains_key(&(group_id.to_string(), topic.to_string(), partition))
    }

    /// Whether any transaction has a pending offset for the group.
    pub fn has_open_transactions(&self, group_id: &str) -> bool {
        self.open_partitions(group_id).next().is_some()
    }

    /// The partitions of a group with pending transactional offsets.
    fn open_partitions<'a>(&'a self, group_id: &'a str) -> impl Iterator<Item = (&'a str, i32)> {
        self.open
            .range((group_id.to_string(), String::new(), i32::MIN)..)
            .take_while(move |((g, _, _), _)| g == group_id)
            .map(|((_, t, p), _)| (t.as_str(), *p))
    }

    /// Groups with pending transactional offsets, sorted: a loader makes
    /// the unknown ones simple groups, as Kafka's replay does.
    pub fn groups_with_pending(&self) -> impl Iterator<Item = &str> {
        let groups: BTreeSet<&str> = self.open.keys().map(|(g, _, _)| g.as_str()).collect();
        groups.into_iter()
    }

    /// The partitions of `topic` a group has an offset for, committed or
    /// pending: what a deletion of the topic tombstones.
    pub fn topic_partitions(&self, group_id: &str, topic: &str) -> BTreeSet<i32> {
        let committed = self
            .offsets
            .get(group_id)
            .and_then(|g| g.topics.get(topic))
            .into_iter()
            .flat_map(|ps| ps.keys().copied());
        let pending = self
            .open_partitions(group_id)
            .filter(|(t, _)| *t == topic)
            .map(|(_, p)| p);
        committed.chain(pending).collect()
    }

    /// Forgets a group's offsets and metadata here (its coordinator moved);
    /// nothing is deleted from the log.
    pub fn unload(&mut self, group_id: &str) {
        self.offsets.remove(group_id);
        self.group_metadata.remove(group_id);
        let open: Vec<(String, i32)> = self
            .open_partitions(group_id)
            .map(|(t, p)| (t.to_string(), p))
            .collect();
        for (topic, partition) in open {
            self.remove_pending(group_id, &topic, partition);
        }
    }

    /// The committed offset of a partition; a pending transactional one is
    /// not visible until its transaction commits.
    pub fn fetch(&self, group_id: &str, topic: &str, partition: i32) -> Option<&OffsetAndMetadata> {
        Some(&self.offsets.get(group_id)?.get(topic, partition)?.offset)
    }

    /// Every offset of a group, sorted by topic, then partition.
    pub fn fetch_group(
        &self,
        group_id: &str,
    ) -> impl Iterator<Item = (&str, i32, &OffsetAndMetadata)> {
        self.offsets
            .get(group_id)
            .into_iter()
            .flat_map(GroupOffsets::partitions)
            .map(|(topic, partition, stored)| (topic, partition, &stored.offset))
    }

    pub fn has_offsets(&self, group_id: &str) -> bool {
        self.offsets.contains_key(group_id)
    }

    /// Groups with at least one committed offset, sorted.
    pub fn groups(&self) -> impl Iterator<Item = &str> {
        self.offsets.keys().map(String::as_str)
    }

    /// The last GroupMetadata stored for a classic group: what the loader
    /// restores the group from.
    pub fn group_metadata(&self, group_id: &str) -> Option<&GroupMetadata> {
        self.group_metadata.get(group_id)
    }

    /// Every classic group with stored metadata, sorted.
    pub fn group_metadata_all(&self) -> impl Iterator<Item = (&str, &GroupMetadata)> {
        self.group_metadata.iter().map(|(g, m)| (g.as_str(), m))
    }

    /// DeleteGroups: a tombstone for each of the group's offsets, then one
    /// for each partition with only pending transactional offsets, then,
    /// when classic metadata is stored, its GroupMetadata tombstone, in
    /// Kafka's order. The caller appends them and then
    /// [`apply`](Self::apply)s them. A KIP-848 group's own tombstones are the
    /// caller's to add.
    pub fn delete_group_records(&self, group_id: &str) -> Vec<CoordinatorRecord> {
        let mut records: Vec<CoordinatorRecord> = self
            .fetch_group(group_id)
            .map(|(topic, partition, _)| offset_tombstone(group_id, topic, partition))
            .collect();
        records.extend(
            self.open_partitions(group_id)
                .filter(|(topic, partition)| self.fetch(group_id, topic, *partition).is_none())
                .map(|(topic, partition)| offset_tombstone(group_id, topic, partition)),
        );
        if self.group_metadata.contains_key(group_id) {
            records.push(CoordinatorRecord::GroupMetadata {
                group_id: group_id.to_string(),
                value: None,
            });
        }
        records
    }

    /// OffsetDelete: a tombstone for each named partition that has an offset,
    /// committed or pending in a transaction (Kafka writes none for a
    /// partition without either). The caller checks first that the group is
    /// not subscribed to the topic (GROUP_SUBSCRIBED_TO_TOPIC).
    pub fn delete_partition_records(
        &self,
        group_id: &str,
        topic: &str,
        partitions: &[i32],
    ) -> Vec<CoordinatorRecord> {
        let unique: BTreeSet<i32> = partitions.iter().copied().collect();
        unique
            .into_iter()
            .filter(|p| {
                self.fetch(group_id, topic, *p).is_some() || self.has_pending(group_id, topic, *p)
            })
            .map(|p| offset_tombstone(group_id, topic, p))
            .collect()
    }

    /// Kafka's periodic cleanup (`GroupCoordinatorShard.cleanupGroupMetadata`
    /// with `OffsetMetadataManager.cleanupExpiredOffsets`), run every
    /// `offsets.retention.check.interval.ms` with
    /// `retention_ms` = `offsets.retention.minutes`:
    /// - an offset of a topic the group is not subscribed to expires when
    ///   its explicit expire timestamp is reached, or else when
    ///   `retention_ms` has passed since the base timestamp (the time a
    ///   classic group became Empty, otherwise the commit time);
    /// - an offset whose partition has a pending transactional offset does
    ///   not expire yet;
    /// - a group with no offsets left that is empty is deleted (GroupMetadata
    ///   tombstone for a classic group), even if it never had any offsets,
    ///   unless a transaction has pending offsets for it.
    ///
    /// Visits every group with offsets or stored classic metadata; a KIP-848
    /// group with neither is the caller's to delete. Nothing is changed here:
    /// append the records, then [`apply`](Self::apply) them.
    pub fn expired_records(
        &self,
        now_ms: i64,
        retention_ms: i64,
        group_state: impl Fn(&str) -> GroupExpiryState,
    ) -> OffsetExpiration {
        let group_ids: BTreeSet<&str> = self
            .offsets
            .keys()
            .chain(self.group_metadata.keys())
            .map(String::as_str)
            .collect();
        let mut expiration = OffsetExpiration::default();
        for group_id in group_ids {
            let state = group_state(group_id);
            let mut all_offsets_expired = true;
            if let Some(group) = self.offsets.get(group_id) {
                match state.condition() {
                    None => all_offsets_expired = false,
                    Some(condition) => {
                        for (topic, partitions) in &group.topics {
                            if condition.is_subscribed(topic) {
                                all_offsets_expired = false;
                                continue;
                            }
                            for (partition, stored) in partitions {
                                if condition.is_expired(&stored.offset, now_ms, retention_ms)
                                    && !self.has_pending(group_id, topic, *partition)
                                {
                                    expiration
                                        .records
                                        .push(offset_tombstone(group_id, topic, *partition));
                                } else {
                                    all_offsets_expired = false;
                                }
                            }
                        }
                    }
                }
            }
            if all_offsets_expired && state.is_empty() && !self.has_open_transactions(group_id) {
                if state.is_classic() {
                    expiration.records.push(CoordinatorRecord::GroupMetadata {
                        group_id: group_id.to_string(),
                        value: None,
                    });
                }
                expiration.deleted_groups.push(group_id.to_string());
            }
        }
        expiration
    }
}

fn offset_tombstone(group_id: &str, topic: &str, partition: i32) -> CoordinatorRecord {
    CoordinatorRecord::OffsetCommit {
        group_id: group_id.to_string(),
        topic: topic.to_string(),
        partition,
        value: None,
    }
}

/// The `__consumer_offsets` partition that holds a group, as Kafka computes
/// it (`GroupCoordinatorService.partitionFor`):
/// `Utils.abs(groupId.hashCode()) % offsets.topic.num.partitions`, with
/// Java's `String.hashCode` over UTF-16 code units and Kafka's `Utils.abs`,
/// which maps `Integer.MIN_VALUE` to 0 (not `& 0x7fffffff`, which would move
/// every group with a negative hash). Clients and other brokers locate the
/// coordinator by this, so it must match Kafka bit for bit.
/// `offsets.topic.num.partitions` is at least 1 once validated; a smaller
/// value is taken as 1.
pub fn partition_for(group_id: &str, num_partitions: i32) -> i32 {
    let hash = group_id.encode_utf16().fold(0i32, |h, unit| {
        h.wrapping_mul(31).wrapping_add(i32::from(unit))
    });
    let abs = if hash == i32::MIN { 0 } else { hash.abs() };
    abs % num_partitions.max(1)
}
