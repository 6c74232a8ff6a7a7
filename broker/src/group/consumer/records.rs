//! The `__consumer_offsets` records of KIP-848 consumer groups, byte-compatible
//! with Apache Kafka 4.x (group-coordinator's `ConsumerGroup*Key/Value`
//! schemas), and the conversion between them and [`ConsumerGroupSnapshot`].
//!
//! Key types (Kafka's `CoordinatorRecordType`): 3 group epoch
//! (`ConsumerGroupMetadata`), 4 subscription metadata
//! (`ConsumerGroupPartitionMetadata`), 5 member subscription
//! (`ConsumerGroupMemberMetadata`), 6 target assignment epoch
//! (`ConsumerGroupTargetAssignmentMetadata`), 7 one member's target
//! assignment (`ConsumerGroupTargetAssignmentMember`), 8 one member's current
//! assignment (`ConsumerGroupCurrentMemberAssignment`). Keys are not flexible
//! (int16-length strings); every value is version 0 and flexible (compact
//! strings and arrays, tagged fields).
//!
//! Tagged fields Kafka added after 4.0 (`MetadataHash` and `CreationTimeMs`
//! in the group epoch record, `ClassicMemberMetadata` in the member record)
//! are kept when decoded so that a record written back is the record read.
//! Kafka 4.1+ no longer writes type 4 (it keeps a metadata hash instead);
//! this module still writes it, because the snapshot carries the
//! subscription metadata and Kafka 4.x still replays the type.
//!
//! Invariant: nothing here knows about logs or time; decoding never panics
//! and never allocates more than the input holds.

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};
use uuid::Uuid;

use super::{
    Assignment, ConsumerGroupConfig, ConsumerGroupSnapshot, Epoch, MemberSnapshot, MemberState,
    ServerAssignor, TopicId, TopicMetadata,
};
use crate::group::records::{
    put_string, put_uvarint, CoordinatorRecord, Reader, RecordFormatError, Result,
};
use crate::group::{GroupInstanceId, MemberId};

/// Key type of a consumer group's epoch record.
pub const CONSUMER_GROUP_METADATA_KEY_VERSION: i16 = 3;
/// Key type of a consumer group's subscription metadata (deprecated in 4.1).
pub const CONSUMER_GROUP_PARTITION_METADATA_KEY_VERSION: i16 = 4;
/// Key type of a member's subscription.
pub const CONSUMER_GROUP_MEMBER_METADATA_KEY_VERSION: i16 = 5;
/// Key type of the target assignment's epoch.
pub const CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA_KEY_VERSION: i16 = 6;
/// Key type of one member's target assignment.
pub const CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER_KEY_VERSION: i16 = 7;
/// Key type of one member's current assignment.
pub const CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT_KEY_VERSION: i16 = 8;

/// Every consumer group value schema is defined at version 0 only.
pub const CONSUMER_GROUP_VALUE_VERSION: i16 = 0;

/// `ConsumerGroupMetadataValue.MetadataHash`'s tag (4.1+, KIP-1101).
const METADATA_HASH_TAG: u32 = 0;
/// `ConsumerGroupMetadataValue.CreationTimeMs`'s tag (KIP-1282).
const CREATION_TIME_TAG: u32 = 1;
/// `ConsumerGroupMemberMetadataValue.ClassicMemberMetadata`'s tag.
const CLASSIC_MEMBER_METADATA_TAG: u32 = 0;

/// Kafka's `MemberState` byte values.
const MEMBER_STATE_STABLE: i8 = 0;
const MEMBER_STATE_UNREVOKED_PARTITIONS: i8 = 1;
const MEMBER_STATE_UNRELEASED_PARTITIONS: i8 = 2;
const MEMBER_STATE_UNKNOWN: i8 = 127;

/// `ConsumerGroupMetadataValue`: the group epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerGroupMetadataValue {
    pub epoch: Epoch,
    /// Kafka 4.1+'s hash of the subscribed topics; 0 (its default, not
    /// written) when unknown. This broker does not compute it.
    pub metadata_hash: i64,
    /// -1 (the default, not written) when unknown.
    pub creation_time_ms: i64,
}

/// One topic of `ConsumerGroupPartitionMetadataValue`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionMetadataTopic {
    pub topic_id: TopicId,
    pub topic_name: String,
    pub num_partitions: i32,
    /// Partition -> racks; unused since Kafka 4.0, kept as read.
    pub partition_racks: Vec<(i32, Vec<String>)>,
}

/// `ConsumerGroupPartitionMetadataValue`: the subscribed topics' metadata
/// when the group epoch was decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerGroupPartitionMetadataValue {
    pub topics: Vec<PartitionMetadataTopic>,
}

/// `ConsumerGroupMemberMetadataValue`: a member's subscription.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerGroupMemberMetadataValue {
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub server_assignor: Option<String>,
    /// The raw `ClassicMemberMetadata` tagged field of a classic member in
    /// a consumer group (which this broker does not admit), kept opaque.
    pub classic_member_metadata: Option<Bytes>,
}

/// `ConsumerGroupCurrentMemberAssignmentValue`: where a member is in its
/// reconciliation and what it owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerGroupCurrentMemberAssignmentValue {
    pub member_epoch: Epoch,
    pub previous_member_epoch: Epoch,
    pub state: MemberState,
    pub assigned_partitions: Assignment,
    pub partitions_pending_revocation: Assignment,
}

/// One KIP-848 consumer group record; `value: None` is a tombstone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConsumerGroupRecord {
    /// Type 3.
    GroupMetadata {
        group_id: String,
        value: Option<ConsumerGroupMetadataValue>,
    },
    /// Type 4.
    PartitionMetadata {
        group_id: String,
        value: Option<ConsumerGroupPartitionMetadataValue>,
    },
    /// Type 5.
    MemberMetadata {
        group_id: String,
        member_id: MemberId,
        value: Option<ConsumerGroupMemberMetadataValue>,
    },
    /// Type 6: the assignment epoch.
    TargetAssignmentMetadata {
        group_id: String,
        value: Option<Epoch>,
    },
    /// Type 7.
    TargetAssignmentMember {
        group_id: String,
        member_id: MemberId,
        value: Option<Assignment>,
    },
    /// Type 8.
    CurrentMemberAssignment {
        group_id: String,
        member_id: MemberId,
        value: Option<ConsumerGroupCurrentMemberAssignmentValue>,
    },
}

impl ConsumerGroupRecord {
    pub fn group_id(&self) -> &str {
        match self {
            ConsumerGroupRecord::GroupMetadata { group_id, .. }
            | ConsumerGroupRecord::PartitionMetadata { group_id, .. }
            | ConsumerGroupRecord::MemberMetadata { group_id, .. }
            | ConsumerGroupRecord::TargetAssignmentMetadata { group_id, .. }
            | ConsumerGroupRecord::TargetAssignmentMember { group_id, .. }
            | ConsumerGroupRecord::CurrentMemberAssignment { group_id, .. } => group_id,
        }
    }

    pub fn is_tombstone(&self) -> bool {
        match self {
            ConsumerGroupRecord::GroupMetadata { value, .. } => value.is_none(),
            ConsumerGroupRecord::PartitionMetadata { value, .. } => value.is_none(),
            ConsumerGroupRecord::MemberMetadata { value, .. } => value.is_none(),
            ConsumerGroupRecord::TargetAssignmentMetadata { value, .. } => value.is_none(),
            ConsumerGroupRecord::TargetAssignmentMember { value, .. } => value.is_none(),
            ConsumerGroupRecord::CurrentMemberAssignment { value, .. } => value.is_none(),
        }
    }

    /// The key type (Kafka's key version) of this record.
    pub fn key_version(&self) -> i16 {
        match self {
            ConsumerGroupRecord::GroupMetadata { .. } => CONSUMER_GROUP_METADATA_KEY_VERSION,
            ConsumerGroupRecord::PartitionMetadata { .. } => {
                CONSUMER_GROUP_PARTITION_METADATA_KEY_VERSION
            }
            ConsumerGroupRecord::MemberMetadata { .. } => {
                CONSUMER_GROUP_MEMBER_METADATA_KEY_VERSION
            }
            ConsumerGroupRecord::TargetAssignmentMetadata { .. } => {
                CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA_KEY_VERSION
            }
            ConsumerGroupRecord::TargetAssignmentMember { .. } => {
                CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER_KEY_VERSION
            }
            ConsumerGroupRecord::CurrentMemberAssignment { .. } => {
                CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT_KEY_VERSION
            }
        }
    }

    /// The key bytes and the value bytes (`None` for a tombstone), as
    /// Kafka 4.x writes them.
    pub fn encode(&self) -> Result<(Bytes, Option<Bytes>)> {
        let mut key = BytesMut::with_capacity(64);
        key.put_i16(self.key_version());
        put_string(&mut key, "key.groupId", Some(self.group_id()), false)?;
        match self {
            ConsumerGroupRecord::MemberMetadata { member_id, .. }
            | ConsumerGroupRecord::TargetAssignmentMember { member_id, .. }
            | ConsumerGroupRecord::CurrentMemberAssignment { member_id, .. } => {
                put_string(&mut key, "key.memberId", Some(member_id.as_str()), false)?;
            }
            ConsumerGroupRecord::GroupMetadata { .. }
            | ConsumerGroupRecord::PartitionMetadata { .. }
            | ConsumerGroupRecord::TargetAssignmentMetadata { .. } => {}
        }
        let value = match self {
            ConsumerGroupRecord::GroupMetadata { value, .. } => {
                value.as_ref().map(encode_group_metadata_value)
            }
            ConsumerGroupRecord::PartitionMetadata { value, .. } => value
                .as_ref()
                .map(encode_partition_metadata_value)
                .transpose()?,
            ConsumerGroupRecord::MemberMetadata { value, .. } => value
                .as_ref()
                .map(encode_member_metadata_value)
                .transpose()?,
            ConsumerGroupRecord::TargetAssignmentMetadata { value, .. } => value.map(|epoch| {
                let mut buf = BytesMut::with_capacity(7);
                buf.put_i16(CONSUMER_GROUP_VALUE_VERSION);
                buf.put_i32(epoch.0);
                put_uvarint(&mut buf, 0);
                buf.freeze()
            }),
            ConsumerGroupRecord::TargetAssignmentMember { value, .. } => value
                .as_ref()
                .map(|a| {
                    let mut buf = BytesMut::with_capacity(64);
                    buf.put_i16(CONSUMER_GROUP_VALUE_VERSION);
                    put_topic_partitions(&mut buf, a)?;
                    put_uvarint(&mut buf, 0);
                    Ok(buf.freeze())
                })
                .transpose()?,
            ConsumerGroupRecord::CurrentMemberAssignment { value, .. } => value
                .as_ref()
                .map(encode_current_member_assignment_value)
                .transpose()?,
        };
        Ok((key.freeze(), value))
    }

    /// Decodes the rest of a key (after its int16 type) and its value when
    /// the type is a consumer group's (3..=8); `None` for any other type,
    /// which the caller keeps opaque. Called by
    /// [`crate::group::records::decode`].
    pub(crate) fn decode(
        key_version: i16,
        key: &mut Reader<'_>,
        value: Option<&[u8]>,
    ) -> Option<Result<ConsumerGroupRecord>> {
        let has_member_id = match key_version {
            CONSUMER_GROUP_METADATA_KEY_VERSION
            | CONSUMER_GROUP_PARTITION_METADATA_KEY_VERSION
            | CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA_KEY_VERSION => false,
            CONSUMER_GROUP_MEMBER_METADATA_KEY_VERSION
            | CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER_KEY_VERSION
            | CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT_KEY_VERSION => true,
            _ => return None,
        };
        Some(Self::decode_known(key_version, has_member_id, key, value))
    }

    fn decode_known(
        key_version: i16,
        has_member_id: bool,
        key: &mut Reader<'_>,
        value: Option<&[u8]>,
    ) -> Result<ConsumerGroupRecord> {
        let group_id = key.string("key.groupId", false)?;
        let member_id = if has_member_id {
            MemberId(key.string("key.memberId", false)?)
        } else {
            MemberId(String::new())
        };
        Ok(match key_version {
            CONSUMER_GROUP_METADATA_KEY_VERSION => ConsumerGroupRecord::GroupMetadata {
                group_id,
                value: value.map(decode_group_metadata_value).transpose()?,
            },
            CONSUMER_GROUP_PARTITION_METADATA_KEY_VERSION => {
                ConsumerGroupRecord::PartitionMetadata {
                    group_id,
                    value: value.map(decode_partition_metadata_value).transpose()?,
                }
            }
            CONSUMER_GROUP_MEMBER_METADATA_KEY_VERSION => ConsumerGroupRecord::MemberMetadata {
                group_id,
                member_id,
                value: value.map(decode_member_metadata_value).transpose()?,
            },
            CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA_KEY_VERSION => {
                ConsumerGroupRecord::TargetAssignmentMetadata {
                    group_id,
                    value: value
                        .map(decode_target_assignment_metadata_value)
                        .transpose()?,
                }
            }
            CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER_KEY_VERSION => {
                ConsumerGroupRecord::TargetAssignmentMember {
                    group_id,
                    member_id,
                    value: value
                        .map(decode_target_assignment_member_value)
                        .transpose()?,
                }
            }
            // Only type 8 is left: `decode` admits 3..=8.
            _ => ConsumerGroupRecord::CurrentMemberAssignment {
                group_id,
                member_id,
                value: value
                    .map(decode_current_member_assignment_value)
                    .transpose()?,
            },
        })
    }
}

fn decode_target_assignment_metadata_value(bytes: &[u8]) -> Result<Epoch> {
    let mut r = value_reader(bytes, "ConsumerGroupTargetAssignmentMetadataValue")?;
    let epoch = Epoch(r.i32("ConsumerGroupTargetAssignmentMetadataValue.assignmentEpoch")?);
    skip_tags(&mut r)?;
    Ok(epoch)
}

fn decode_target_assignment_member_value(bytes: &[u8]) -> Result<Assignment> {
    let mut r = value_reader(bytes, "ConsumerGroupTargetAssignmentMemberValue")?;
    let assignment = read_topic_partitions(
        &mut r,
        "ConsumerGroupTargetAssignmentMemberValue.topicPartitions",
    )?;
    skip_tags(&mut r)?;
    Ok(assignment)
}

/// A value reader positioned after its version, which must be 0.
fn value_reader<'a>(bytes: &'a [u8], record: &'static str) -> Result<Reader<'a>> {
    let mut r = Reader::new(bytes);
    let version = r.i16(record)?;
    if version != CONSUMER_GROUP_VALUE_VERSION {
        return Err(RecordFormatError::UnknownValueVersion { record, version });
    }
    Ok(r)
}

fn skip_tags(r: &mut Reader<'_>) -> Result<()> {
    r.tagged_fields("tagged fields", |_, _| Ok(()))
}

fn put_compact_array_len(buf: &mut BytesMut, field: &'static str, len: usize) -> Result<()> {
    if len >= i32::MAX as usize {
        return Err(RecordFormatError::InvalidLength {
            field,
            length: len as i64,
        });
    }
    put_uvarint(buf, len as u32 + 1);
    Ok(())
}

fn put_tag_i64(buf: &mut BytesMut, tag: u32, v: i64) {
    put_uvarint(buf, tag);
    put_uvarint(buf, 8);
    buf.put_i64(v);
}

fn encode_group_metadata_value(v: &ConsumerGroupMetadataValue) -> Bytes {
    let mut buf = BytesMut::with_capacity(32);
    buf.put_i16(CONSUMER_GROUP_VALUE_VERSION);
    buf.put_i32(v.epoch.0);
    // Kafka writes a tagged field only when it differs from its default.
    let hash = v.metadata_hash != 0;
    let created = v.creation_time_ms != -1;
    put_uvarint(&mut buf, u32::from(hash) + u32::from(created));
    if hash {
        put_tag_i64(&mut buf, METADATA_HASH_TAG, v.metadata_hash);
    }
    if created {
        put_tag_i64(&mut buf, CREATION_TIME_TAG, v.creation_time_ms);
    }
    buf.freeze()
}

fn decode_group_metadata_value(bytes: &[u8]) -> Result<ConsumerGroupMetadataValue> {
    let mut r = value_reader(bytes, "ConsumerGroupMetadataValue")?;
    let epoch = Epoch(r.i32("ConsumerGroupMetadataValue.epoch")?);
    let mut metadata_hash = 0;
    let mut creation_time_ms = -1;
    r.tagged_fields("ConsumerGroupMetadataValue tagged fields", |tag, data| {
        let as_i64 = |field| {
            <[u8; 8]>::try_from(data)
                .map(i64::from_be_bytes)
                .map_err(|_| RecordFormatError::InvalidLength {
                    field,
                    length: data.len() as i64,
                })
        };
        match tag {
            METADATA_HASH_TAG => metadata_hash = as_i64("ConsumerGroupMetadataValue.metadataHash")?,
            CREATION_TIME_TAG => {
                creation_time_ms = as_i64("ConsumerGroupMetadataValue.creationTimeMs")?
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok(ConsumerGroupMetadataValue {
        epoch,
        metadata_hash,
        creation_time_ms,
    })
}

fn encode_partition_metadata_value(v: &ConsumerGroupPartitionMetadataValue) -> Result<Bytes> {
    let mut buf = BytesMut::with_capacity(64);
    buf.put_i16(CONSUMER_GROUP_VALUE_VERSION);
    put_compact_array_len(
        &mut buf,
        "ConsumerGroupPartitionMetadataValue.topics",
        v.topics.len(),
    )?;
    for t in &v.topics {
        buf.put_slice(t.topic_id.0.as_bytes());
        put_string(
            &mut buf,
            "TopicMetadata.topicName",
            Some(&t.topic_name),
            true,
        )?;
        buf.put_i32(t.num_partitions);
        put_compact_array_len(
            &mut buf,
            "TopicMetadata.partitionMetadata",
            t.partition_racks.len(),
        )?;
        for (partition, racks) in &t.partition_racks {
            buf.put_i32(*partition);
            put_compact_array_len(&mut buf, "PartitionMetadata.racks", racks.len())?;
            for rack in racks {
                put_string(&mut buf, "PartitionMetadata.racks", Some(rack), true)?;
            }
            put_uvarint(&mut buf, 0);
        }
        put_uvarint(&mut buf, 0);
    }
    put_uvarint(&mut buf, 0);
    Ok(buf.freeze())
}

fn read_uuid(r: &mut Reader<'_>, field: &'static str) -> Result<Uuid> {
    Ok(Uuid::from_bytes(r.array::<16>(field)?))
}

fn decode_partition_metadata_value(bytes: &[u8]) -> Result<ConsumerGroupPartitionMetadataValue> {
    let mut r = value_reader(bytes, "ConsumerGroupPartitionMetadataValue")?;
    let count = r.array_len("ConsumerGroupPartitionMetadataValue.topics", true)?;
    // A topic takes at least 23 bytes, so this reserves no more than the
    // input could hold.
    let mut topics = Vec::with_capacity(count.min(r.remaining() / 23));
    for _ in 0..count {
        let topic_id = TopicId(read_uuid(&mut r, "TopicMetadata.topicId")?);
        let topic_name = r.string("TopicMetadata.topicName", true)?;
        let num_partitions = r.i32("TopicMetadata.numPartitions")?;
        let n = r.array_len("TopicMetadata.partitionMetadata", true)?;
        let mut partition_racks = Vec::with_capacity(n.min(r.remaining() / 6));
        for _ in 0..n {
            let partition = r.i32("PartitionMetadata.partition")?;
            let m = r.array_len("PartitionMetadata.racks", true)?;
            let mut racks = Vec::with_capacity(m);
            for _ in 0..m {
                racks.push(r.string("PartitionMetadata.racks", true)?);
            }
            skip_tags(&mut r)?;
            partition_racks.push((partition, racks));
        }
        skip_tags(&mut r)?;
        topics.push(PartitionMetadataTopic {
            topic_id,
            topic_name,
            num_partitions,
            partition_racks,
        });
    }
    skip_tags(&mut r)?;
    Ok(ConsumerGroupPartitionMetadataValue { topics })
}

fn encode_member_metadata_value(v: &ConsumerGroupMemberMetadataValue) -> Result<Bytes> {
    let mut buf = BytesMut::with_capacity(128);
    buf.put_i16(CONSUMER_GROUP_VALUE_VERSION);
    let f = "ConsumerGroupMemberMetadataValue";
    put_string(&mut buf, f, v.instance_id.as_deref(), true)?;
    put_string(&mut buf, f, v.rack_id.as_deref(), true)?;
    put_string(&mut buf, f, Some(&v.client_id), true)?;
    put_string(&mut buf, f, Some(&v.client_host), true)?;
    put_compact_array_len(&mut buf, f, v.subscribed_topic_names.len())?;
    for t in &v.subscribed_topic_names {
        put_string(&mut buf, f, Some(t), true)?;
    }
    put_string(&mut buf, f, v.subscribed_topic_regex.as_deref(), true)?;
    buf.put_i32(v.rebalance_timeout_ms);
    put_string(&mut buf, f, v.server_assignor.as_deref(), true)?;
    match &v.classic_member_metadata {
        Some(raw) => {
            if raw.len() >= i32::MAX as usize {
                return Err(RecordFormatError::StringTooLong {
                    field: "ConsumerGroupMemberMetadataValue.classicMemberMetadata",
                    length: raw.len(),
                });
            }
            put_uvarint(&mut buf, 1);
            put_uvarint(&mut buf, CLASSIC_MEMBER_METADATA_TAG);
            put_uvarint(&mut buf, raw.len() as u32);
            buf.put_slice(raw);
        }
        None => put_uvarint(&mut buf, 0),
    }
    Ok(buf.freeze())
}

fn decode_member_metadata_value(bytes: &[u8]) -> Result<ConsumerGroupMemberMetadataValue> {
    let mut r = value_reader(bytes, "ConsumerGroupMemberMetadataValue")?;
    let instance_id = r.nullable_string("ConsumerGroupMemberMetadataValue.instanceId", true)?;
    let rack_id = r.nullable_string("ConsumerGroupMemberMetadataValue.rackId", true)?;
    let client_id = r.string("ConsumerGroupMemberMetadataValue.clientId", true)?;
    let client_host = r.string("ConsumerGroupMemberMetadataValue.clientHost", true)?;
    let n = r.array_len(
        "ConsumerGroupMemberMetadataValue.subscribedTopicNames",
        true,
    )?;
    let mut subscribed_topic_names = Vec::with_capacity(n);
    for _ in 0..n {
        subscribed_topic_names.push(r.string(
            "ConsumerGroupMemberMetadataValue.subscribedTopicNames",
            true,
        )?);
    }
    let subscribed_topic_regex = r.nullable_string(
        "ConsumerGroupMemberMetadataValue.subscribedTopicRegex",
        true,
    )?;
    let rebalance_timeout_ms = r.i32("ConsumerGroupMemberMetadataValue.rebalanceTimeoutMs")?;
    let server_assignor =
        r.nullable_string("ConsumerGroupMemberMetadataValue.serverAssignor", true)?;
    let mut classic_member_metadata = None;
    r.tagged_fields(
        "ConsumerGroupMemberMetadataValue tagged fields",
        |tag, data| {
            if tag == CLASSIC_MEMBER_METADATA_TAG {
                classic_member_metadata = Some(Bytes::copy_from_slice(data));
            }
            Ok(())
        },
    )?;
    Ok(ConsumerGroupMemberMetadataValue {
        instance_id,
        rack_id,
        client_id,
        client_host,
        subscribed_topic_names,
        subscribed_topic_regex,
        rebalance_timeout_ms,
        server_assignor,
        classic_member_metadata,
    })
}

/// `[]TopicPartitions` (topic id, partitions, tagged fields), compact.
fn put_topic_partitions(buf: &mut BytesMut, a: &Assignment) -> Result<()> {
    put_compact_array_len(buf, "topicPartitions", a.len())?;
    for (topic_id, partitions) in a {
        buf.put_slice(topic_id.0.as_bytes());
        put_compact_array_len(buf, "topicPartitions.partitions", partitions.len())?;
        for p in partitions {
            buf.put_i32(*p);
        }
        put_uvarint(buf, 0);
    }
    Ok(())
}

/// Reads `[]TopicPartitions`; a topic listed twice is merged. The
/// per-partition `AssignmentEpochs` tag (KIP-1251) is skipped: the snapshot
/// has no place for it.
fn read_topic_partitions(r: &mut Reader<'_>, field: &'static str) -> Result<Assignment> {
    let count = r.array_len(field, true)?;
    let mut out = Assignment::new();
    for _ in 0..count {
        let topic_id = TopicId(read_uuid(r, field)?);
        let n = r.array_len(field, true)?;
        let partitions = out.entry(topic_id).or_default();
        for _ in 0..n {
            partitions.insert(r.i32(field)?);
        }
        skip_tags(r)?;
    }
    // Kafka keeps no entry for a topic without partitions; neither does the
    // state machine.
    out.retain(|_, ps| !ps.is_empty());
    Ok(out)
}

fn member_state_byte(state: MemberState) -> i8 {
    match state {
        MemberState::Stable => MEMBER_STATE_STABLE,
        MemberState::UnrevokedPartitions => MEMBER_STATE_UNREVOKED_PARTITIONS,
        MemberState::UnreleasedPartitions => MEMBER_STATE_UNRELEASED_PARTITIONS,
        MemberState::Unknown => MEMBER_STATE_UNKNOWN,
    }
}

/// Kafka's `MemberState.fromValue`: a byte it does not know is UNKNOWN.
fn member_state_from_byte(b: i8) -> MemberState {
    match b {
        MEMBER_STATE_STABLE => MemberState::Stable,
        MEMBER_STATE_UNREVOKED_PARTITIONS => MemberState::UnrevokedPartitions,
        MEMBER_STATE_UNRELEASED_PARTITIONS => MemberState::UnreleasedPartitions,
        _ => MemberState::Unknown,
    }
}

fn encode_current_member_assignment_value(
    v: &ConsumerGroupCurrentMemberAssignmentValue,
) -> Result<Bytes> {
    let mut buf = BytesMut::with_capacity(64);
    buf.put_i16(CONSUMER_GROUP_VALUE_VERSION);
    buf.put_i32(v.member_epoch.0);
    buf.put_i32(v.previous_member_epoch.0);
    buf.put_i8(member_state_byte(v.state));
    put_topic_partitions(&mut buf, &v.assigned_partitions)?;
    put_topic_partitions(&mut buf, &v.partitions_pending_revocation)?;
    put_uvarint(&mut buf, 0);
    Ok(buf.freeze())
}

fn decode_current_member_assignment_value(
    bytes: &[u8],
) -> Result<ConsumerGroupCurrentMemberAssignmentValue> {
    let record = "ConsumerGroupCurrentMemberAssignmentValue";
    let mut r = value_reader(bytes, record)?;
    let member_epoch = Epoch(r.i32("ConsumerGroupCurrentMemberAssignmentValue.memberEpoch")?);
    let previous_member_epoch =
        Epoch(r.i32("ConsumerGroupCurrentMemberAssignmentValue.previousMemberEpoch")?);
    let state = member_state_from_byte(
        r.array::<1>("ConsumerGroupCurrentMemberAssignmentValue.state")?[0] as i8,
    );
    let assigned_partitions = read_topic_partitions(
        &mut r,
        "ConsumerGroupCurrentMemberAssignmentValue.assignedPartitions",
    )?;
    let partitions_pending_revocation = read_topic_partitions(
        &mut r,
        "ConsumerGroupCurrentMemberAssignmentValue.partitionsPendingRevocation",
    )?;
    skip_tags(&mut r)?;
    Ok(ConsumerGroupCurrentMemberAssignmentValue {
        member_epoch,
        previous_member_epoch,
        state,
        assigned_partitions,
        partitions_pending_revocation,
    })
}

fn cg(record: ConsumerGroupRecord) -> CoordinatorRecord {
    CoordinatorRecord::ConsumerGroup(record)
}

/// Every record describing the group, in the order of Kafka's
/// `ConsumerGroup.createConsumerGroupRecords`: member subscriptions, the
/// subscription metadata and the group epoch, target assignments, the
/// target assignment epoch, current assignments. Written to a compacted
/// log, they replace whatever the group's earlier records said (members
/// that left need [`member_tombstones`] as well).
pub fn snapshot_records(s: &ConsumerGroupSnapshot) -> Vec<CoordinatorRecord> {
    let group_id = &s.group_id;
    let mut records = Vec::with_capacity(3 * s.members.len() + 3);
    for m in &s.members {
        records.push(cg(ConsumerGroupRecord::MemberMetadata {
            group_id: group_id.clone(),
            member_id: m.member_id.clone(),
            value: Some(ConsumerGroupMemberMetadataValue {
                instance_id: m.instance_id.as_ref().map(|i| i.0.clone()),
                rack_id: m.rack_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                subscribed_topic_names: m.subscribed_topic_names.clone(),
                subscribed_topic_regex: m.subscribed_topic_regex.clone(),
                rebalance_timeout_ms: m.rebalance_timeout_ms,
                server_assignor: m.server_assignor.map(|a| a.name().to_string()),
                classic_member_metadata: None,
            }),
        }));
    }
    // Kafka 4.0 writes the subscription metadata just before the epoch it
    // decided.
    records.push(cg(ConsumerGroupRecord::PartitionMetadata {
        group_id: group_id.clone(),
        value: Some(ConsumerGroupPartitionMetadataValue {
            topics: s
                .subscription_metadata
                .iter()
                .map(|(name, t)| PartitionMetadataTopic {
                    topic_id: t.topic_id,
                    topic_name: name.clone(),
                    num_partitions: t.partition_count,
                    partition_racks: Vec::new(),
                })
                .collect(),
        }),
    }));
    records.push(cg(ConsumerGroupRecord::GroupMetadata {
        group_id: group_id.clone(),
        value: Some(ConsumerGroupMetadataValue {
            epoch: s.group_epoch,
            metadata_hash: 0,
            creation_time_ms: -1,
        }),
    }));
    for m in &s.members {
        records.push(cg(ConsumerGroupRecord::TargetAssignmentMember {
            group_id: group_id.clone(),
            member_id: m.member_id.clone(),
            value: Some(m.target_assignment.clone()),
        }));
    }
    records.push(cg(ConsumerGroupRecord::TargetAssignmentMetadata {
        group_id: group_id.clone(),
        value: Some(s.assignment_epoch),
    }));
    for m in &s.members {
        records.push(cg(ConsumerGroupRecord::CurrentMemberAssignment {
            group_id: group_id.clone(),
            member_id: m.member_id.clone(),
            value: Some(ConsumerGroupCurrentMemberAssignmentValue {
                member_epoch: m.member_epoch,
                previous_member_epoch: m.previous_member_epoch,
                state: m.state,
                assigned_partitions: m.assigned_partitions.clone(),
                partitions_pending_revocation: m.partitions_pending_revocation.clone(),
            }),
        }));
    }
    records
}

/// The tombstones of a member that left, in Kafka's order
/// (`GroupMetadataManager.removeMember`): current assignment, target
/// assignment, subscription.
pub fn member_tombstones(group_id: &str, member_id: &MemberId) -> Vec<CoordinatorRecord> {
    vec![
        cg(ConsumerGroupRecord::CurrentMemberAssignment {
            group_id: group_id.to_string(),
            member_id: member_id.clone(),
            value: None,
        }),
        cg(ConsumerGroupRecord::TargetAssignmentMember {
            group_id: group_id.to_string(),
            member_id: member_id.clone(),
            value: None,
        }),
        cg(ConsumerGroupRecord::MemberMetadata {
            group_id: group_id.to_string(),
            member_id: member_id.clone(),
            value: None,
        }),
    ]
}

/// The tombstones of a deleted group and of the members it still had, in
/// the order of Kafka's `ConsumerGroup.createGroupTombstoneRecords`: the
/// members' current and target assignments, the target assignment epoch,
/// the members' subscriptions, the subscription metadata, the group epoch
/// last.
pub fn tombstones_for(group_id: &str, member_ids: &[MemberId]) -> Vec<CoordinatorRecord> {
    let g = || group_id.to_string();
    let mut records = Vec::with_capacity(3 * member_ids.len() + 3);
    for member_id in member_ids {
        records.push(cg(ConsumerGroupRecord::CurrentMemberAssignment {
            group_id: g(),
            member_id: member_id.clone(),
            value: None,
        }));
    }
    for member_id in member_ids {
        records.push(cg(ConsumerGroupRecord::TargetAssignmentMember {
            group_id: g(),
            member_id: member_id.clone(),
            value: None,
        }));
    }
    records.push(cg(ConsumerGroupRecord::TargetAssignmentMetadata {
        group_id: g(),
        value: None,
    }));
    for member_id in member_ids {
        records.push(cg(ConsumerGroupRecord::MemberMetadata {
            group_id: g(),
            member_id: member_id.clone(),
            value: None,
        }));
    }
    records.push(cg(ConsumerGroupRecord::PartitionMetadata {
        group_id: g(),
        value: None,
    }));
    records.push(cg(ConsumerGroupRecord::GroupMetadata {
        group_id: g(),
        value: None,
    }));
    records
}

/// The records of one group seen so far, latest per key.
#[derive(Clone, Debug, Default)]
struct ReplayedGroup {
    epoch: Option<ConsumerGroupMetadataValue>,
    partition_metadata: Option<ConsumerGroupPartitionMetadataValue>,
    assignment_epoch: Option<Epoch>,
    members: BTreeMap<MemberId, ConsumerGroupMemberMetadataValue>,
    target_assignments: BTreeMap<MemberId, Assignment>,
    current_assignments: BTreeMap<MemberId, ConsumerGroupCurrentMemberAssignmentValue>,
}

impl ReplayedGroup {
    fn is_empty(&self) -> bool {
        self.epoch.is_none()
            && self.partition_metadata.is_none()
            && self.assignment_epoch.is_none()
            && self.members.is_empty()
            && self.target_assignments.is_empty()
            && self.current_assignments.is_empty()
    }
}

/// Rebuilds consumer groups from `__consumer_offsets` records, as Kafka's
/// loader replays them: last write wins per key, a tombstone removes its
/// key, and the group epoch's tombstone removes the group. Records of other
/// types are ignored.
#[derive(Clone, Debug, Default)]
pub struct ConsumerGroupReplay {
    groups: BTreeMap<String, ReplayedGroup>,
}

impl ConsumerGroupReplay {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn apply(&mut self, record: &CoordinatorRecord) {
        let CoordinatorRecord::ConsumerGroup(record) = record else {
            return;
        };
        let group_id = record.group_id();
        if let ConsumerGroupRecord::GroupMetadata { value: None, .. } = record {
            self.groups.remove(group_id);
            return;
        }
        let group = self.groups.entry(group_id.to_string()).or_default();
        fn set<K: Ord + Clone, V: Clone>(map: &mut BTreeMap<K, V>, k: &K, v: &Option<V>) {
            match v {
                Some(v) => {
                    map.insert(k.clone(), v.clone());
                }
                None => {
                    map.remove(k);
                }
            }
        }
        match record {
            ConsumerGroupRecord::GroupMetadata { value, .. } => group.epoch = value.clone(),
            ConsumerGroupRecord::PartitionMetadata { value, .. } => {
                group.partition_metadata = value.clone()
            }
            ConsumerGroupRecord::TargetAssignmentMetadata { value, .. } => {
                group.assignment_epoch = *value
            }
            ConsumerGroupRecord::MemberMetadata {
                member_id, value, ..
            } => set(&mut group.members, member_id, value),
            ConsumerGroupRecord::TargetAssignmentMember {
                member_id, value, ..
            } => set(&mut group.target_assignments, member_id, value),
            ConsumerGroupRecord::CurrentMemberAssignment {
                member_id, value, ..
            } => set(&mut group.current_assignments, member_id, value),
        }
        if group.is_empty() {
            self.groups.remove(group_id);
        }
    }

    /// The groups as snapshots for [`super::ConsumerGroupCoordinator::restore`],
    /// by group id. A group whose epoch record is gone (only stray
    /// tombstones or assignments remain) is left out, as is a member
    /// without a subscription record. What Kafka's records do not carry is
    /// derived as Kafka's loader derives it: a member without a current
    /// assignment record is at epoch 0, previous epoch -1, stable, owning
    /// nothing; the group's assignor is the one most members ask for among
    /// `config.assignors` (Kafka's `computePreferredServerAssignor`); a
    /// server assignor name this broker does not know is no preference.
    pub fn snapshots(&self, config: &ConsumerGroupConfig) -> Vec<ConsumerGroupSnapshot> {
        self.groups
            .iter()
            .filter(|(_, g)| g.epoch.is_some() || !g.members.is_empty())
            .map(|(group_id, g)| {
                let members: Vec<MemberSnapshot> = g
                    .members
                    .iter()
                    .map(|(member_id, m)| {
                        let current = g.current_assignments.get(member_id);
                        let mut subscribed_topic_names = m.subscribed_topic_names.clone();
                        subscribed_topic_names.sort();
                        subscribed_topic_names.dedup();
                        MemberSnapshot {
                            member_id: member_id.clone(),
                            instance_id: m.instance_id.clone().map(GroupInstanceId),
                            rack_id: m.rack_id.clone(),
                            client_id: m.client_id.clone(),
                            client_host: m.client_host.clone(),
                            rebalance_timeout_ms: m.rebalance_timeout_ms,
                            subscribed_topic_names,
                            subscribed_topic_regex: m.subscribed_topic_regex.clone(),
                            server_assignor: m
                                .server_assignor
                                .as_deref()
                                .and_then(ServerAssignor::from_name),
                            member_epoch: current.map_or(Epoch(0), |c| c.member_epoch),
                            previous_member_epoch: current
                                .map_or(Epoch(-1), |c| c.previous_member_epoch),
                            state: current.map_or(MemberState::Stable, |c| c.state),
                            assigned_partitions: current
                                .map(|c| c.assigned_partitions.clone())
                                .unwrap_or_default(),
                            partitions_pending_revocation: current
                                .map(|c| c.partitions_pending_revocation.clone())
                                .unwrap_or_default(),
                            target_assignment: g
                                .target_assignments
                                .get(member_id)
                                .cloned()
                                .unwrap_or_default(),
                        }
                    })
                    .collect();
                ConsumerGroupSnapshot {
                    group_id: group_id.clone(),
                    group_epoch: g.epoch.as_ref().map_or(Epoch(0), |e| e.epoch),
                    assignment_epoch: g.assignment_epoch.unwrap_or(Epoch(0)),
                    assignor: preferred_assignor(&members, config),
                    subscription_metadata: g
                        .partition_metadata
                        .iter()
                        .flat_map(|p| &p.topics)
                        .map(|t| {
                            (
                                t.topic_name.clone(),
                                TopicMetadata {
                                    topic_id: t.topic_id,
                                    partition_count: t.num_partitions,
                                },
                            )
                        })
                        .collect(),
                    members,
                }
            })
            .collect()
    }
}

/// Kafka's `computePreferredServerAssignor` over snapshot members: the
/// assignor most members ask for; ties go to the earlier one in
/// `config.assignors`; without any request, the first one.
fn preferred_assignor(members: &[MemberSnapshot], config: &ConsumerGroupConfig) -> ServerAssignor {
    let default = config
        .assignors
        .first()
        .copied()
        .unwrap_or(ServerAssignor::Uniform);
    let mut best: Option<(ServerAssignor, usize)> = None;
    for &a in &config.assignors {
        let n = members
            .iter()
            .filter(|m| m.server_assignor == Some(a))
            .count();
        if n > 0 && best.is_none_or(|(_, b)| n > b) {
            best = Some((a, n));
        }
    }
    best.map_or(default, |(a, _)| a)
}

#[cfg(test)]
mod tests;
