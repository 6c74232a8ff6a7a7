//! Share groups in the group coordinator (KIP-932): ShareGroupHeartbeat and
//! ShareGroupDescribe on the shard that holds the group, and the members'
//! session expiry in the shard's timer. The membership rules are in
//! `share::group`; what members consumed is the share coordinator's.
//!
//! A group's epoch and share-partitions are written to the shard's
//! partition (`share::group_records`, Kafka's record formats) when they
//! change, and loaded with it; its members are not.
//!
//! A group id names one kind of group: a share heartbeat for a classic or
//! consumer group, or a consumer heartbeat for a share group, gets
//! GROUP_ID_NOT_FOUND, as Kafka answers "Group {} is not a share group."

use std::collections::{BTreeMap, BTreeSet};

use uuid::Uuid;

use super::storage::{LoadedLog, LogEntry, StorageError};
use super::{GroupService, ImageTopics, Shard, State};
use crate::broker::{now_ms, Broker};
use crate::group::{CoordinatorRecord, GroupError};
use crate::share::group::{GroupLimits, Heartbeat, HeartbeatError, HeartbeatResponse, ShareGroup};
use crate::share::group_records::{self, ShareGroupRecord, TopicPartitions};
use crate::share::leader::settings;

/// A ShareGroupHeartbeat's answer without error.
pub struct ShareHeartbeatReply {
    pub member_id: String,
    pub heartbeat_interval_ms: i32,
    pub response: HeartbeatResponse,
}

/// Kafka's error for each refusal of a share heartbeat, with its message.
pub fn heartbeat_error(e: HeartbeatError) -> (GroupError, Option<&'static str>) {
    match e {
        HeartbeatError::InvalidRequest(why) => (GroupError::InvalidRequest, Some(why)),
        HeartbeatError::UnknownMemberId => (GroupError::UnknownMemberId, None),
        HeartbeatError::FencedMemberEpoch => (GroupError::FencedMemberEpoch, None),
        HeartbeatError::GroupMaxSizeReached => (GroupError::GroupMaxSizeReached, None),
    }
}

pub enum ShareHeartbeatError {
    Group(GroupError),
    Member(HeartbeatError),
}

impl From<GroupError> for ShareHeartbeatError {
    fn from(e: GroupError) -> Self {
        ShareHeartbeatError::Group(e)
    }
}

/// Whether `group_id` is a classic or consumer group in this shard.
fn other_kind(st: &State, group_id: &str) -> bool {
    st.classic.group(group_id).is_some() || st.consumer.group(group_id).is_some()
}

impl GroupService {
    /// ShareGroupHeartbeat. A join (epoch 0) creates the group.
    pub async fn share_heartbeat(
        &self,
        broker: &Broker,
        group_id: &str,
        heartbeat: Heartbeat,
    ) -> Result<ShareHeartbeatReply, ShareHeartbeatError> {
        if group_id.is_empty() {
            return Err(GroupError::InvalidGroupId.into());
        }
        let image = ImageTopics(broker.metadata.image());
        let s = settings(broker, group_id);
        let limits = GroupLimits {
            max_size: broker.config.share.max_size,
            session_timeout_ms: s.session_timeout_ms,
        };
        let shard = self.shard(group_id)?;
        let mut st = shard.lock().await?;
        if other_kind(&st, group_id) {
            return Err(GroupError::GroupIdNotFound.into());
        }
        if heartbeat.member_epoch != 0 && !st.share.contains_key(group_id) {
            return Err(ShareHeartbeatError::Member(HeartbeatError::UnknownMemberId));
        }
        let member_id = heartbeat.member_id.clone();
        let group = st
            .share
            .entry(group_id.to_string())
            .or_insert_with(|| ShareGroup::new(group_id));
        let topic = |name: &str| {
            image
                .0
                .topics
                .get(name)
                .map(|t| (t.topic_id, t.partitions.len() as i32))
        };
        let r = group.heartbeat(heartbeat, topic, limits, now_ms());
        if group.members.is_empty() && group.group_epoch == 0 {
            // A join that failed leaves no group behind.
            st.share.remove(group_id);
        }
        let names = |id| image.0.topic_by_id(id).map(|t| t.name.clone());
        shard
            .persist_share_group(&mut st, group_id, &names)
            .await
            .map_err(|e| e.group_error())?;
        drop(st);
        // The timer must see the new member's deadline.
        shard.wake.notify_one();
        let response = r.map_err(ShareHeartbeatError::Member)?;
        Ok(ShareHeartbeatReply {
            member_id,
            heartbeat_interval_ms: s.heartbeat_interval_ms.clamp(0, i32::MAX as i64) as i32,
            response,
        })
    }

    /// ShareGroupDescribe: the group as it is now.
    pub async fn share_describe(&self, group_id: &str) -> Result<ShareGroup, GroupError> {
        let shard = self.shard(group_id)?;
        let st = shard.lock().await?;
        if other_kind(&st, group_id) {
            return Err(GroupError::GroupIdNotFound);
        }
        st.share
            .get(group_id)
            .cloned()
            .ok_or(GroupError::GroupIdNotFound)
    }
}

/// The share-partitions of a group, by topic id.
pub type SharePartitions = BTreeMap<Uuid, BTreeSet<i32>>;

/// What `__consumer_offsets` holds for a share group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoredShareGroup {
    pub epoch: i32,
    pub initialized: SharePartitions,
}

impl Shard {
    /// Writes what changed of `group_id`'s epoch and share-partitions since
    /// they were last written (tombstones once the group is gone), before
    /// the change is answered.
    /// `names`: topic names by id, which the records carry beside the ids.
    pub(super) async fn persist_share_group(
        &self,
        st: &mut State,
        group_id: &str,
        names: &(dyn Fn(Uuid) -> Option<String> + Sync),
    ) -> Result<(), StorageError> {
        let current = st.share.get(group_id).map(|g| StoredShareGroup {
            epoch: g.group_epoch,
            initialized: g.initialized.clone(),
        });
        let previous = st.stored_share.get(group_id);
        if current.as_ref() == previous {
            return Ok(());
        }
        let encoded = |r: crate::group::records::Result<(bytes::Bytes, bytes::Bytes)>| {
            r.map(|(key, value)| record(key, Some(value)))
                .map_err(|e| StorageError::Encode(e.to_string()))
        };
        let mut records = Vec::new();
        match &current {
            Some(cur) => {
                if previous.is_none_or(|p| p.epoch != cur.epoch) {
                    records.push(encoded(group_records::encode_metadata(
                        group_id, cur.epoch,
                    ))?);
                }
                if previous.is_none_or(|p| p.initialized != cur.initialized) {
                    let topics: Vec<TopicPartitions> = cur
                        .initialized
                        .iter()
                        .map(|(id, parts)| TopicPartitions {
                            topic_id: *id,
                            topic_name: names(*id).unwrap_or_default(),
                            partitions: parts.iter().copied().collect(),
                        })
                        .collect();
                    records.push(encoded(group_records::encode_state_partitions(
                        group_id, &topics,
                    ))?);
                }
            }
            None => {
                for key_type in [
                    group_records::STATE_PARTITIONS_KEY_TYPE,
                    group_records::METADATA_KEY_TYPE,
                ] {
                    let key = group_records::encode_key(key_type, group_id)
                        .map_err(|e| StorageError::Encode(e.to_string()))?;
                    records.push(record(key, None));
                }
            }
        }
        self.append(records).await?;
        match current {
            Some(cur) => st.stored_share.insert(group_id.to_string(), cur),
            None => st.stored_share.remove(group_id),
        };
        Ok(())
    }
}

/// A share-group record as the shard's log takes it (a type the offset
/// store does not interpret).
fn record(key: bytes::Bytes, value: Option<bytes::Bytes>) -> CoordinatorRecord {
    CoordinatorRecord::Other {
        key_version: i16::from_be_bytes([key[0], key[1]]),
        key,
        value,
    }
}

impl GroupService {
    /// The share-partitions whose state `group_id` may have
    /// (DescribeShareGroupOffsets for every topic, DeleteGroups).
    pub async fn share_partitions(&self, group_id: &str) -> Result<SharePartitions, GroupError> {
        let shard = self.shard(group_id)?;
        let st = shard.lock().await?;
        if other_kind(&st, group_id) {
            return Err(GroupError::GroupIdNotFound);
        }
        st.share
            .get(group_id)
            .map(|g| g.initialized.clone())
            .ok_or(GroupError::GroupIdNotFound)
    }

    /// Before AlterShareGroupOffsets: the group must have no members (it is
    /// created if it does not exist, so offsets can be set before anyone
    /// consumes); `partitions` become the group's.
    pub async fn share_alter_offsets(
        &self,
        broker: &Broker,
        group_id: &str,
        partitions: &[(uuid::Uuid, i32)],
    ) -> Result<(), GroupError> {
        if group_id.is_empty() {
            return Err(GroupError::InvalidGroupId);
        }
        let shard = self.shard(group_id)?;
        let mut st = shard.lock().await?;
        if other_kind(&st, group_id) {
            return Err(GroupError::GroupIdNotFound);
        }
        let group = st
            .share
            .entry(group_id.to_string())
            .or_insert_with(|| ShareGroup::new(group_id));
        if !group.members.is_empty() {
            return Err(GroupError::NonEmptyGroup);
        }
        for (topic_id, partition) in partitions {
            group
                .initialized
                .entry(*topic_id)
                .or_default()
                .insert(*partition);
        }
        let image = broker.metadata.image();
        let names = |id| image.topic_by_id(id).map(|t| t.name.clone());
        shard
            .persist_share_group(&mut st, group_id, &names)
            .await
            .map_err(|e| e.group_error())
    }

    /// Before DeleteShareGroupOffsets: the group must exist and have no
    /// members; the topics stop being the group's. Returns their
    /// share-partitions, whose state the caller deletes.
    pub async fn share_delete_offsets(
        &self,
        broker: &Broker,
        group_id: &str,
        topics: &[uuid::Uuid],
    ) -> Result<SharePartitions, GroupError> {
        let shard = self.shard(group_id)?;
        let mut st = shard.lock().await?;
        if other_kind(&st, group_id) {
            return Err(GroupError::GroupIdNotFound);
        }
        let group = st
            .share
            .get_mut(group_id)
            .ok_or(GroupError::GroupIdNotFound)?;
        if !group.members.is_empty() {
            return Err(GroupError::NonEmptyGroup);
        }
        let removed: SharePartitions = topics
            .iter()
            .filter_map(|t| group.initialized.remove(t).map(|p| (*t, p)))
            .collect();
        let image = broker.metadata.image();
        let names = |id| image.topic_by_id(id).map(|t| t.name.clone());
        shard
            .persist_share_group(&mut st, group_id, &names)
            .await
            .map_err(|e| e.group_error())?;
        Ok(removed)
    }
}

impl State {
    /// Restores the share groups `log` describes: their epoch and
    /// share-partitions, without members (the last record of each key
    /// wins; a tombstone deletes the group).
    pub(super) fn load_share_groups(&mut self, log: &LoadedLog) {
        let mut groups: BTreeMap<String, (Option<i32>, Option<SharePartitions>)> = BTreeMap::new();
        for entry in &log.entries {
            let LogEntry::Record {
                record: CoordinatorRecord::Other { key, value, .. },
                ..
            } = entry
            else {
                continue;
            };
            let decoded = match group_records::decode(key, value.as_deref()) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "skipping an unreadable share group record");
                    continue;
                }
            };
            match decoded {
                ShareGroupRecord::Metadata { group_id, epoch } => match epoch {
                    Some(epoch) => groups.entry(group_id).or_default().0 = Some(epoch),
                    None => {
                        groups.remove(&group_id);
                    }
                },
                ShareGroupRecord::StatePartitions {
                    group_id,
                    initialized,
                } => {
                    let entry = groups.entry(group_id).or_default();
                    entry.1 = initialized.map(|topics| {
                        let mut out = SharePartitions::new();
                        for t in topics {
                            out.entry(t.topic_id).or_default().extend(t.partitions);
                        }
                        out
                    });
                }
            }
        }
        for (group_id, (epoch, initialized)) in groups {
            let Some(epoch) = epoch else { continue };
            if self.classic.group(&group_id).is_some() || self.consumer.group(&group_id).is_some() {
                continue;
            }
            let mut group = ShareGroup::new(&group_id);
            group.group_epoch = epoch;
            group.assignment_epoch = epoch;
            group.initialized = initialized.unwrap_or_default();
            self.stored_share.insert(
                group_id.clone(),
                StoredShareGroup {
                    epoch,
                    initialized: group.initialized.clone(),
                },
            );
            self.share.insert(group_id, group);
        }
    }

    /// Whether `group_id` is a share group here (so no other kind may take
    /// the id).
    pub(super) fn is_share_group(&self, group_id: &str) -> bool {
        self.share.contains_key(group_id)
    }

    /// Ends the sessions of share-group members that stopped heartbeating.
    pub(super) fn expire_share_members(&mut self, now: i64) {
        for group in self.share.values_mut() {
            for member in group.expire_members(now) {
                tracing::info!(group = %group.group_id, member = %member, "share group member's session expired");
            }
        }
    }

    /// The earliest share member deadline, for the timer.
    pub(super) fn next_share_deadline_ms(&self) -> Option<i64> {
        self.share
            .values()
            .flat_map(|g| g.members.values().map(|m| m.deadline_ms))
            .min()
    }
}
