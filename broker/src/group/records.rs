//! The key and value formats of the records in `__consumer_offsets`,
//! byte-compatible with Apache Kafka 4.x, so a log written by either can be
//! loaded by the other.
//!
//! Every record's key and value start with an int16. In the key it names the
//! record type (Kafka calls it the key version): 0 and 1 are offset commits
//! (0 is the pre-0.9 layout, identical on the wire), 2 is a classic group's
//! metadata, 3 to 8 are the records of KIP-848 consumer groups (their
//! formats are in `consumer::records`), and 9 and up are share and streams
//! groups, which this module does not interpret: they stay
//! [`CoordinatorRecord::Other`], and the share groups' types 11 and 15 are
//! read from there by `share::group_records`. In the value it is the
//! version of the value's schema.
//!
//! What Kafka writes (group-coordinator's `GroupCoordinatorRecordHelpers`,
//! checked against the 4.4.0 jar): offset commit keys as type 1;
//! `OffsetCommitValue` v1 when the commit carries an explicit expire
//! timestamp (OffsetCommit v1 requests), else the flexible v4 with the topic
//! id as tagged field 0 when it is known (Kafka 4.0 wrote v3; 4.1 added the
//! tag and moved to v4); group metadata keys as type 2 with
//! `GroupMetadataValue` v3. This module writes the same and reads every
//! version Kafka defines. A type-0 key carries Kafka's
//! `LegacyOffsetCommitValue`, which only has version 0.
//!
//! For a loader, as in Kafka's `CoordinatorLoaderImpl`: an unknown key type
//! is skipped ([`CoordinatorRecord::Other`]); any [`RecordFormatError`],
//! including an unknown value version, fails the load.
//!
//! Invariant: this module knows nothing about logs, batches or time; it maps
//! one record's key and value bytes to a [`CoordinatorRecord`] and back.
//! Decoding never panics and never allocates more than the input holds.

use bytes::{BufMut, Bytes, BytesMut};
use uuid::Uuid;

use super::consumer::records::ConsumerGroupRecord;
use super::offsets::OffsetAndMetadata;
use super::{GenerationId, GroupInstanceId, GroupMetadata, MemberId, MemberMetadata};

/// Key type of an offset commit as written before Kafka 0.9 (same layout).
pub const LEGACY_OFFSET_COMMIT_KEY_VERSION: i16 = 0;
/// Key type of an offset commit.
pub const OFFSET_COMMIT_KEY_VERSION: i16 = 1;
/// Key type of a classic group's metadata.
pub const GROUP_METADATA_KEY_VERSION: i16 = 2;

/// The highest `OffsetCommitValue` version Kafka 4.x defines.
pub const OFFSET_COMMIT_VALUE_MAX_VERSION: i16 = 4;
/// The highest `GroupMetadataValue` version Kafka 4.x defines.
pub const GROUP_METADATA_VALUE_MAX_VERSION: i16 = 4;
/// The `GroupMetadataValue` version Kafka 4.x writes
/// (`GroupCoordinatorRecordHelpers.GROUP_METADATA_VALUE_VERSION`).
pub const GROUP_METADATA_VALUE_WRITE_VERSION: i16 = 3;

/// The longest string Kafka's serializers accept (an int16 length).
const STRING_BYTES_MAX: usize = i16::MAX as usize;

/// One record of `__consumer_offsets`, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoordinatorRecord {
    /// A group's committed offset for one partition; `None` is a tombstone
    /// (the offset was deleted or expired).
    OffsetCommit {
        group_id: String,
        topic: String,
        partition: i32,
        value: Option<OffsetAndMetadata>,
    },
    /// A classic group's metadata; `None` is a tombstone (the group was
    /// deleted).
    GroupMetadata {
        group_id: String,
        value: Option<GroupMetadata>,
    },
    /// A record of a KIP-848 consumer group (key types 3 to 8), whose
    /// formats live in [`super::consumer::records`].
    ConsumerGroup(ConsumerGroupRecord),
    /// A record type this module does not interpret (share groups, whose
    /// types 11 and 15 `share::group_records` reads, streams groups, or a
    /// type from a newer Kafka). Kafka's loader
    /// skips types it does not know; so does [`super::OffsetStore`]. The raw
    /// bytes are kept so that the record can be written back unchanged.
    Other {
        key_version: i16,
        key: Bytes,
        value: Option<Bytes>,
    },
}

impl CoordinatorRecord {
    /// The group the record belongs to, when this module knows the type.
    pub fn group_id(&self) -> Option<&str> {
        match self {
            CoordinatorRecord::OffsetCommit { group_id, .. }
            | CoordinatorRecord::GroupMetadata { group_id, .. } => Some(group_id),
            CoordinatorRecord::ConsumerGroup(r) => Some(r.group_id()),
            CoordinatorRecord::Other { .. } => None,
        }
    }

    /// A tombstone deletes what its key names.
    pub fn is_tombstone(&self) -> bool {
        match self {
            CoordinatorRecord::OffsetCommit { value, .. } => value.is_none(),
            CoordinatorRecord::GroupMetadata { value, .. } => value.is_none(),
            CoordinatorRecord::ConsumerGroup(r) => r.is_tombstone(),
            CoordinatorRecord::Other { value, .. } => value.is_none(),
        }
    }
}

/// Why a record's bytes could not be decoded or encoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordFormatError {
    #[error("{field}: needs {needed} bytes but only {remaining} remain")]
    Truncated {
        field: &'static str,
        needed: usize,
        remaining: usize,
    },
    #[error("{field}: invalid length {length}")]
    InvalidLength { field: &'static str, length: i64 },
    #[error("{field}: null where the schema does not allow it")]
    UnexpectedNull { field: &'static str },
    #[error("{field}: unsigned varint longer than 5 bytes")]
    VarintTooLong { field: &'static str },
    #[error("{record} value version {version} is not one Kafka defines")]
    UnknownValueVersion { record: &'static str, version: i16 },
    #[error("{field}: {length} bytes is longer than the schema allows")]
    StringTooLong { field: &'static str, length: usize },
}

pub(crate) type Result<T> = std::result::Result<T, RecordFormatError>;

/// Encodes a record as Kafka 4.4 writes it: the key bytes and the value
/// bytes (`None` for a tombstone). Fails only for strings longer than Kafka's
/// int16 length limit, which Kafka's serializer rejects as well.
pub fn encode(record: &CoordinatorRecord) -> Result<(Bytes, Option<Bytes>)> {
    match record {
        CoordinatorRecord::OffsetCommit {
            group_id,
            topic,
            partition,
            value,
        } => {
            let key = encode_offset_commit_key(group_id, topic, *partition)?;
            let value = match value {
                Some(v) => Some(encode_offset_commit_value(
                    v,
                    offset_commit_value_version(v),
                )?),
                None => None,
            };
            Ok((key, value))
        }
        CoordinatorRecord::GroupMetadata { group_id, value } => {
            let key = encode_group_metadata_key(group_id)?;
            let value = match value {
                Some(v) => Some(encode_group_metadata_value(
                    v,
                    GROUP_METADATA_VALUE_WRITE_VERSION,
                )?),
                None => None,
            };
            Ok((key, value))
        }
        CoordinatorRecord::ConsumerGroup(r) => r.encode(),
        CoordinatorRecord::Other { key, value, .. } => Ok((key.clone(), value.clone())),
    }
}

/// Kafka's `GroupCoordinatorRecordHelpers.offsetCommitValueVersion` (4.1+):
/// v1 is the only version with an expire timestamp; otherwise v4, which can
/// carry the topic id. A v1 record drops the leader epoch and topic id, as
/// Kafka's does.
pub fn offset_commit_value_version(value: &OffsetAndMetadata) -> i16 {
    if value.expire_timestamp_ms.is_some() {
        1
    } else {
        4
    }
}

/// Decodes one record. `value` is `None` for a tombstone. A key type this
/// module does not interpret decodes to [`CoordinatorRecord::Other`] without
/// looking at the rest of the bytes, as Kafka's loader skips unknown types.
/// Bytes after the last field are ignored, as Kafka's readers ignore them.
pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<CoordinatorRecord> {
    let mut k = Reader::new(key);
    let key_version = k.i16("key version")?;
    match key_version {
        LEGACY_OFFSET_COMMIT_KEY_VERSION | OFFSET_COMMIT_KEY_VERSION => {
            let group_id = k.string("OffsetCommitKey.group", false)?;
            let topic = k.string("OffsetCommitKey.topic", false)?;
            let partition = k.i32("OffsetCommitKey.partition")?;
            let value = match value {
                Some(v) => {
                    let value = decode_offset_commit_value(v)?;
                    if key_version == LEGACY_OFFSET_COMMIT_KEY_VERSION && value.1 != 0 {
                        // Kafka reads a type-0 key's value as
                        // `LegacyOffsetCommitValue`, defined at version 0 only.
                        return Err(RecordFormatError::UnknownValueVersion {
                            record: "LegacyOffsetCommitValue",
                            version: value.1,
                        });
                    }
                    Some(value.0)
                }
                None => None,
            };
            Ok(CoordinatorRecord::OffsetCommit {
                group_id,
                topic,
                partition,
                value,
            })
        }
        GROUP_METADATA_KEY_VERSION => {
            let group_id = k.string("GroupMetadataKey.group", false)?;
            let value = match value {
                Some(v) => Some(decode_group_metadata_value(v)?),
                None => None,
            };
            Ok(CoordinatorRecord::GroupMetadata { group_id, value })
        }
        _ => match ConsumerGroupRecord::decode(key_version, &mut k, value) {
            Some(record) => Ok(CoordinatorRecord::ConsumerGroup(record?)),
            None => Ok(CoordinatorRecord::Other {
                key_version,
                key: Bytes::copy_from_slice(key),
                value: value.map(Bytes::copy_from_slice),
            }),
        },
    }
}

pub(crate) fn encode_offset_commit_key(
    group_id: &str,
    topic: &str,
    partition: i32,
) -> Result<Bytes> {
    let mut buf = BytesMut::with_capacity(2 + 2 + group_id.len() + 2 + topic.len() + 4);
    buf.put_i16(OFFSET_COMMIT_KEY_VERSION);
    put_string(&mut buf, "OffsetCommitKey.group", Some(group_id), false)?;
    put_string(&mut buf, "OffsetCommitKey.topic", Some(topic), false)?;
    buf.put_i32(partition);
    Ok(buf.freeze())
}

pub(crate) fn encode_group_metadata_key(group_id: &str) -> Result<Bytes> {
    let mut buf = BytesMut::with_capacity(2 + 2 + group_id.len());
    buf.put_i16(GROUP_METADATA_KEY_VERSION);
    put_string(&mut buf, "GroupMetadataKey.group", Some(group_id), false)?;
    Ok(buf.freeze())
}

/// `OffsetCommitValue` at `version` (0..=4). Fields the version lacks are
/// dropped, as Kafka's serializer drops ignorable fields.
pub(crate) fn encode_offset_commit_value(value: &OffsetAndMetadata, version: i16) -> Result<Bytes> {
    if !(0..=OFFSET_COMMIT_VALUE_MAX_VERSION).contains(&version) {
        return Err(RecordFormatError::UnknownValueVersion {
            record: "OffsetCommitValue",
            version,
        });
    }
    let flexible = version >= 4;
    let mut buf = BytesMut::with_capacity(2 + 8 + 4 + 3 + value.metadata.len() + 8 + 8 + 1);
    buf.put_i16(version);
    buf.put_i64(value.committed_offset);
    if version >= 3 {
        buf.put_i32(value.committed_leader_epoch.unwrap_or(-1));
    }
    put_string(
        &mut buf,
        "OffsetCommitValue.metadata",
        Some(&value.metadata),
        flexible,
    )?;
    buf.put_i64(value.commit_timestamp_ms);
    if version == 1 {
        buf.put_i64(value.expire_timestamp_ms.unwrap_or(-1));
    }
    if flexible {
        // Kafka writes a tagged field only when it differs from its default
        // (the zero UUID for the topic id).
        match value.topic_id.filter(|id| !id.is_nil()) {
            Some(topic_id) => {
                put_uvarint(&mut buf, 1);
                put_uvarint(&mut buf, OFFSET_COMMIT_VALUE_TOPIC_ID_TAG);
                put_uvarint(&mut buf, 16);
                buf.put_slice(topic_id.as_bytes());
            }
            None => put_uvarint(&mut buf, 0),
        }
    }
    Ok(buf.freeze())
}

/// `OffsetCommitValue.topicId`'s tag (v4+).
const OFFSET_COMMIT_VALUE_TOPIC_ID_TAG: u32 = 0;

/// Reads any `OffsetCommitValue` version; returns the value and its version.
pub(crate) fn decode_offset_commit_value(bytes: &[u8]) -> Result<(OffsetAndMetadata, i16)> {
    let mut r = Reader::new(bytes);
    let version = r.i16("OffsetCommitValue version")?;
    if !(0..=OFFSET_COMMIT_VALUE_MAX_VERSION).contains(&version) {
        return Err(RecordFormatError::UnknownValueVersion {
            record: "OffsetCommitValue",
            version,
        });
    }
    let flexible = version >= 4;
    let committed_offset = r.i64("OffsetCommitValue.offset")?;
    let committed_leader_epoch = if version >= 3 {
        r.i32("OffsetCommitValue.leaderEpoch")?
    } else {
        -1
    };
    let metadata = r.string("OffsetCommitValue.metadata", flexible)?;
    let commit_timestamp_ms = r.i64("OffsetCommitValue.commitTimestamp")?;
    let expire_timestamp_ms = if version == 1 {
        r.i64("OffsetCommitValue.expireTimestamp")?
    } else {
        -1
    };
    let mut topic_id = None;
    if flexible {
        r.tagged_fields("OffsetCommitValue tagged fields", |tag, data| {
            if tag == OFFSET_COMMIT_VALUE_TOPIC_ID_TAG {
                let bytes: [u8; 16] =
                    data.try_into()
                        .map_err(|_| RecordFormatError::InvalidLength {
                            field: "OffsetCommitValue.topicId",
                            length: data.len() as i64,
                        })?;
                topic_id = Some(Uuid::from_bytes(bytes)).filter(|id| !id.is_nil());
            }
            Ok(())
        })?;
    }
    // Kafka's `OffsetAndMetadata.fromRecord`: -1 is the "absent" sentinel,
    // and so is the zero UUID for the topic id.
    let value = OffsetAndMetadata {
        committed_offset,
        committed_leader_epoch: (committed_leader_epoch != -1).then_some(committed_leader_epoch),
        metadata,
        commit_timestamp_ms,
        expire_timestamp_ms: (expire_timestamp_ms != -1).then_some(expire_timestamp_ms),
        topic_id,
    };
    Ok((value, version))
}

/// `GroupMetadataValue` at `version` (0..=4). Fields the version lacks are
/// dropped. A missing protocol type is written as the empty string, as
/// Kafka does (the field is not nullable).
pub(crate) fn encode_group_metadata_value(value: &GroupMetadata, version: i16) -> Result<Bytes> {
    if !(0..=GROUP_METADATA_VALUE_MAX_VERSION).contains(&version) {
        return Err(RecordFormatError::UnknownValueVersion {
            record: "GroupMetadataValue",
            version,
        });
    }
    let flexible = version >= 4;
    let mut buf = BytesMut::with_capacity(64);
    buf.put_i16(version);
    put_string(
        &mut buf,
        "GroupMetadataValue.protocolType",
        Some(value.protocol_type.as_deref().unwrap_or("")),
        flexible,
    )?;
    buf.put_i32(value.generation_id.0);
    put_string(
        &mut buf,
        "GroupMetadataValue.protocol",
        value.protocol_name.as_deref(),
        flexible,
    )?;
    put_string(
        &mut buf,
        "GroupMetadataValue.leader",
        value.leader.as_ref().map(MemberId::as_str),
        flexible,
    )?;
    if version >= 2 {
        buf.put_i64(value.current_state_timestamp_ms);
    }
    put_array_len(&mut buf, value.members.len(), flexible)?;
    for m in &value.members {
        put_string(
            &mut buf,
            "MemberMetadata.memberId",
            Some(m.member_id.as_str()),
            flexible,
        )?;
        if version >= 3 {
            put_string(
                &mut buf,
                "MemberMetadata.groupInstanceId",
                m.group_instance_id.as_ref().map(|g| g.0.as_str()),
                flexible,
            )?;
        }
        put_string(
            &mut buf,
            "MemberMetadata.clientId",
            Some(&m.client_id),
            flexible,
        )?;
        put_string(
            &mut buf,
            "MemberMetadata.clientHost",
            Some(&m.client_host),
            flexible,
        )?;
        if version >= 1 {
            buf.put_i32(m.rebalance_timeout_ms);
        }
        buf.put_i32(m.session_timeout_ms);
        put_bytes(
            &mut buf,
            "MemberMetadata.subscription",
            &m.subscription,
            flexible,
        )?;
        put_bytes(
            &mut buf,
            "MemberMetadata.assignment",
            &m.assignment,
            flexible,
        )?;
        if flexible {
            put_uvarint(&mut buf, 0);
        }
    }
    if flexible {
        put_uvarint(&mut buf, 0);
    }
    Ok(buf.freeze())
}

/// Reads any `GroupMetadataValue` version. Fields a version lacks take the
/// schema's defaults: `currentStateTimestamp` -1 (v0, v1), the member's
/// `rebalanceTimeout` -1 (v0; Kafka's replay then uses the session timeout),
/// `groupInstanceId` null (v0..v2). An empty protocol type reads as `None`,
/// as in Kafka's replay.
pub(crate) fn decode_group_metadata_value(bytes: &[u8]) -> Result<GroupMetadata> {
    let mut r = Reader::new(bytes);
    let version = r.i16("GroupMetadataValue version")?;
    if !(0..=GROUP_METADATA_VALUE_MAX_VERSION).contains(&version) {
        return Err(RecordFormatError::UnknownValueVersion {
            record: "GroupMetadataValue",
            version,
        });
    }
    let flexible = version >= 4;
    let protocol_type = r.string("GroupMetadataValue.protocolType", flexible)?;
    let generation_id = GenerationId(r.i32("GroupMetadataValue.generation")?);
    let protocol_name = r.nullable_string("GroupMetadataValue.protocol", flexible)?;
    let leader = r.nullable_string("GroupMetadataValue.leader", flexible)?;
    let current_state_timestamp_ms = if version >= 2 {
        r.i64("GroupMetadataValue.currentStateTimestamp")?
    } else {
        -1
    };
    let count = r.array_len("GroupMetadataValue.members", flexible)?;
    // Each member takes at least 14 bytes even in the compact form, so the
    // count cannot make us reserve more than the input could hold.
    let mut members = Vec::with_capacity(count.min(r.remaining() / 14));
    for _ in 0..count {
        let member_id = MemberId(r.string("MemberMetadata.memberId", flexible)?);
        let group_instance_id = if version >= 3 {
            r.nullable_string("MemberMetadata.groupInstanceId", flexible)?
                .map(GroupInstanceId)
        } else {
            None
        };
        let client_id = r.string("MemberMetadata.clientId", flexible)?;
        let client_host = r.string("MemberMetadata.clientHost", flexible)?;
        let rebalance_timeout_ms = if version >= 1 {
            r.i32("MemberMetadata.rebalanceTimeout")?
        } else {
            -1
        };
        let session_timeout_ms = r.i32("MemberMetadata.sessionTimeout")?;
        let subscription = r.bytes("MemberMetadata.subscription", flexible)?;
        let assignment = r.bytes("MemberMetadata.assignment", flexible)?;
        if flexible {
            r.tagged_fields("MemberMetadata tagged fields", |_, _| Ok(()))?;
        }
        members.push(MemberMetadata {
            member_id,
            group_instance_id,
            client_id,
            client_host,
            rebalance_timeout_ms,
            session_timeout_ms,
            subscription,
            assignment,
        });
    }
    if flexible {
        r.tagged_fields("GroupMetadataValue tagged fields", |_, _| Ok(()))?;
    }
    Ok(GroupMetadata {
        protocol_type: (!protocol_type.is_empty()).then_some(protocol_type),
        generation_id,
        protocol_name,
        leader: leader.map(MemberId),
        current_state_timestamp_ms,
        members,
    })
}

/// A cursor over untrusted bytes: every read checks the remaining length
/// first, and nothing is allocated beyond what the input holds.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn take(&mut self, field: &'static str, n: usize) -> Result<&'a [u8]> {
        if n > self.buf.len() {
            return Err(RecordFormatError::Truncated {
                field,
                needed: n,
                remaining: self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    pub(crate) fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(field, N)?);
        Ok(out)
    }

    pub(crate) fn i16(&mut self, field: &'static str) -> Result<i16> {
        Ok(i16::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn i32(&mut self, field: &'static str) -> Result<i32> {
        Ok(i32::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn i64(&mut self, field: &'static str) -> Result<i64> {
        Ok(i64::from_be_bytes(self.array(field)?))
    }

    /// Kafka's `ByteUtils.readUnsignedVarint`: at most 5 bytes, the value
    /// taken as a Java int (bits past 32 dropped).
    pub(crate) fn uvarint(&mut self, field: &'static str) -> Result<u32> {
        let mut value: u32 = 0;
        for i in 0..5 {
            let b = self.array::<1>(field)?[0];
            value |= u32::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(RecordFormatError::VarintTooLong { field })
    }

    /// The length in a compact field: an unsigned varint of length + 1,
    /// computed as Kafka does in Java int arithmetic (so a varint past
    /// `i32::MAX` wraps negative and reads as null, as in Kafka).
    pub(crate) fn compact_length(&mut self, field: &'static str) -> Result<i32> {
        Ok((self.uvarint(field)? as i32).wrapping_sub(1))
    }

    /// The length prefix of a string: int16 (classic) or unsigned varint of
    /// length + 1 (compact). `None` is null.
    pub(crate) fn string_len(
        &mut self,
        field: &'static str,
        flexible: bool,
    ) -> Result<Option<usize>> {
        let length = if flexible {
            i64::from(self.compact_length(field)?)
        } else {
            i64::from(self.i16(field)?)
        };
        if length < 0 {
            return Ok(None);
        }
        if length > STRING_BYTES_MAX as i64 {
            return Err(RecordFormatError::InvalidLength { field, length });
        }
        Ok(Some(length as usize))
    }

    /// Invalid UTF-8 is replaced, not refused: Kafka's readers decode with
    /// `new String(bytes, UTF_8)`, and a log Kafka loads must load here.
    pub(crate) fn nullable_string(
        &mut self,
        field: &'static str,
        flexible: bool,
    ) -> Result<Option<String>> {
        match self.string_len(field, flexible)? {
            None => Ok(None),
            Some(n) => {
                let raw = self.take(field, n)?;
                Ok(Some(String::from_utf8_lossy(raw).into_owned()))
            }
        }
    }

    pub(crate) fn string(&mut self, field: &'static str, flexible: bool) -> Result<String> {
        self.nullable_string(field, flexible)?
            .ok_or(RecordFormatError::UnexpectedNull { field })
    }

    /// Non-nullable bytes: int32 length (classic) or unsigned varint of
    /// length + 1 (compact).
    pub(crate) fn bytes(&mut self, field: &'static str, flexible: bool) -> Result<Bytes> {
        let length = if flexible {
            i64::from(self.compact_length(field)?)
        } else {
            i64::from(self.i32(field)?)
        };
        if length < 0 {
            return Err(RecordFormatError::UnexpectedNull { field });
        }
        let n = usize::try_from(length)
            .map_err(|_| RecordFormatError::InvalidLength { field, length })?;
        Ok(Bytes::copy_from_slice(self.take(field, n)?))
    }

    /// A non-nullable array's element count: int32 (classic) or unsigned
    /// varint of count + 1 (compact). Like Kafka's generated readers, a count
    /// larger than the bytes left is rejected before anything is allocated.
    pub(crate) fn array_len(&mut self, field: &'static str, flexible: bool) -> Result<usize> {
        let length = if flexible {
            i64::from(self.compact_length(field)?)
        } else {
            i64::from(self.i32(field)?)
        };
        if length < 0 {
            return Err(RecordFormatError::UnexpectedNull { field });
        }
        if length > self.remaining() as i64 {
            return Err(RecordFormatError::InvalidLength { field, length });
        }
        Ok(length as usize)
    }

    /// Reads a tagged-field section: a count, then (tag, size, data) each,
    /// handing each field to `on_tag`. Tags the caller does not know are
    /// ignored, as Kafka keeps them opaque.
    pub(crate) fn tagged_fields(
        &mut self,
        field: &'static str,
        mut on_tag: impl FnMut(u32, &'a [u8]) -> Result<()>,
    ) -> Result<()> {
        let count = self.uvarint(field)?;
        for _ in 0..count {
            let tag = self.uvarint(field)?;
            let size = self.uvarint(field)?;
            let data = self.take(field, size as usize)?;
            on_tag(tag, data)?;
        }
        Ok(())
    }
}

pub(crate) fn put_uvarint(buf: &mut BytesMut, mut value: u32) {
    while value >= 0x80 {
        buf.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    buf.put_u8(value as u8);
}

pub(crate) fn put_string(
    buf: &mut BytesMut,
    field: &'static str,
    s: Option<&str>,
    flexible: bool,
) -> Result<()> {
    match s {
        None if flexible => put_uvarint(buf, 0),
        None => buf.put_i16(-1),
        Some(s) => {
            if s.len() > STRING_BYTES_MAX {
                return Err(RecordFormatError::StringTooLong {
                    field,
                    length: s.len(),
                });
            }
            if flexible {
                put_uvarint(buf, s.len() as u32 + 1);
            } else {
                buf.put_i16(s.len() as i16);
            }
            buf.put_slice(s.as_bytes());
        }
    }
    Ok(())
}

pub(crate) fn put_bytes(
    buf: &mut BytesMut,
    field: &'static str,
    b: &[u8],
    flexible: bool,
) -> Result<()> {
    // The compact length is a varint of length + 1 that Kafka reads into a
    // Java int, so the longest value is one byte shorter than in the
    // classic int32 form.
    let max = if flexible {
        i32::MAX as usize - 1
    } else {
        i32::MAX as usize
    };
    if b.len() > max {
        return Err(RecordFormatError::StringTooLong {
            field,
            length: b.len(),
        });
    }
    if flexible {
        put_uvarint(buf, b.len() as u32 + 1);
    } else {
        buf.put_i32(b.len() as i32);
    }
    buf.put_slice(b);
    Ok(())
}

fn put_array_len(buf: &mut BytesMut, len: usize, flexible: bool) -> Result<()> {
    let field = "GroupMetadataValue.members";
    if len > i32::MAX as usize - 1 {
        return Err(RecordFormatError::InvalidLength {
            field,
            length: len as i64,
        });
    }
    if flexible {
        put_uvarint(buf, len as u32 + 1);
    } else {
        buf.put_i32(len as i32);
    }
    Ok(())
}
