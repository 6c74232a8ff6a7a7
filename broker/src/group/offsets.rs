//! The committed offsets (and stored classic group metadata) of every group
//! one coordinator owns, as the records of its `__consumer_offsets`
//! partition say they are.
//!
//! Modelled on Kafka's `OffsetMetadataManager`. The store changes only
//! through [`OffsetStore::apply`], called for each record when a partition
//! is loaded and again for each record after it is appended, so memory
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
//! Not kept here: transactional offsets (TxnOffsetCommit) pending until
//! their transaction ends, which Kafka also keeps out of expiration.
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

#[derive(Clone, Debug, Default)]
struct GroupOffsets {
    /// topic -> partition -> offset; both levels sorted, so fetches of a
    /// whole group come out in the order OffsetFetch answers.
    topics: BTreeMap<String, BTreeMap<i32, OffsetAndMetadata>>,
}

/// The offsets and classic group metadata of one coordinator.
#[derive(Clone, Debug, Default)]
pub struct OffsetStore {
    offsets: BTreeMap<String, GroupOffsets>,
    group_metadata: BTreeMap<String, GroupMetadata>,
}

impl OffsetStore {
    pub fn new() -> Self {
        OffsetStore::default()
    }

    /// Applies one record: when replaying the log on load, and after each
    /// successful append. Last write wins; a tombstone deletes; record types
    /// this store does not keep are skipped, as Kafka's loader skips them.
    pub fn apply(&mut self, record: &CoordinatorRecord) {
        match record {
            CoordinatorRecord::OffsetCommit {
                group_id,
                topic,
                partition,
                value: Some(offset),
            } => {
                self.offsets
                    .entry(group_id.clone())
                    .or_default()
                    .topics
                    .entry(topic.clone())
                    .or_default()
                    .insert(*partition, offset.clone());
            }
            CoordinatorRecord::OffsetCommit {
                group_id,
                topic,
                partition,
                value: None,
            } => {
                let Some(group) = self.offsets.get_mut(group_id.as_str()) else {
                    return;
                };
                if let Some(partitions) = group.topics.get_mut(topic.as_str()) {
                    partitions.remove(partition);
                    if partitions.is_empty() {
                        group.topics.remove(topic.as_str());
                    }
                }
                // Pruned so that `groups` and `has_offsets` never report a
                // group whose offsets are all deleted.
                if group.topics.is_empty() {
                    self.offsets.remove(group_id.as_str());
                }
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

    /// Forgets a group's offsets and metadata here (its coordinator moved);
    /// nothing is deleted from the log.
    pub fn unload(&mut self, group_id: &str) {
        self.offsets.remove(group_id);
        self.group_metadata.remove(group_id);
    }

    pub fn fetch(&self, group_id: &str, topic: &str, partition: i32) -> Option<&OffsetAndMetadata> {
        self.offsets
            .get(group_id)?
            .topics
            .get(topic)?
            .get(&partition)
    }

    /// Every offset of a group, sorted by topic, then partition.
    pub fn fetch_group(
        &self,
        group_id: &str,
    ) -> impl Iterator<Item = (&str, i32, &OffsetAndMetadata)> {
        self.offsets
            .get(group_id)
            .into_iter()
            .flat_map(|g| g.topics.iter())
            .flat_map(|(topic, partitions)| {
                partitions
                    .iter()
                    .map(move |(partition, offset)| (topic.as_str(), *partition, offset))
            })
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

    /// DeleteGroups: a tombstone for each of the group's offsets, then, when
    /// classic metadata is stored, its GroupMetadata tombstone, in Kafka's
    /// order. The caller appends them and then [`apply`](Self::apply)s them.
    /// A KIP-848 group's own tombstones are the caller's to add.
    pub fn delete_group_records(&self, group_id: &str) -> Vec<CoordinatorRecord> {
        let mut records: Vec<CoordinatorRecord> = self
            .fetch_group(group_id)
            .map(|(topic, partition, _)| offset_tombstone(group_id, topic, partition))
            .collect();
        if self.group_metadata.contains_key(group_id) {
            records.push(CoordinatorRecord::GroupMetadata {
                group_id: group_id.to_string(),
                value: None,
            });
        }
        records
    }

    /// OffsetDelete: a tombstone for each named partition that has an offset
    /// (Kafka writes none for a partition without one). The caller checks
    /// first that the group is not subscribed to the topic
    /// (GROUP_SUBSCRIBED_TO_TOPIC).
    pub fn delete_partition_records(
        &self,
        group_id: &str,
        topic: &str,
        partitions: &[i32],
    ) -> Vec<CoordinatorRecord> {
        let unique: BTreeSet<i32> = partitions.iter().copied().collect();
        unique
            .into_iter()
            .filter(|p| self.fetch(group_id, topic, *p).is_some())
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
    /// - a group with no offsets left that is empty is deleted (GroupMetadata
    ///   tombstone for a classic group), even if it never had any offsets.
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
                            for (partition, offset) in partitions {
                                if condition.is_expired(offset, now_ms, retention_ms) {
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
            if all_offsets_expired && state.is_empty() {
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
