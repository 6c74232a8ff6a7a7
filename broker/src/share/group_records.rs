//! The share-group records of `__consumer_offsets`, byte-compatible with
//! Apache Kafka 4.4 (checked against its group-coordinator jar): key type
//! 11 is a group's `ShareGroupMetadata` (its epoch), key type 15 its
//! `ShareGroupStatePartitionMetadata` (the share-partitions whose state the
//! share coordinator may hold). Both keys are the group id; both values are
//! version 0, flexible. A null value is a tombstone: the group was deleted.
//!
//! Kafka's other share-group records (members and assignments, key types
//! 10 and 12 to 14) are not written here: after the coordinator moves,
//! members join again (UNKNOWN_MEMBER_ID), and a loader skips those types.
//!
//! Invariant: as `group::records`: bytes to [`ShareGroupRecord`] and back,
//! never panicking and never allocating more than the input holds.

use bytes::{BufMut, Bytes, BytesMut};
use uuid::Uuid;

use crate::group::records::{put_string, put_uvarint, Reader, RecordFormatError, Result};

pub const METADATA_KEY_TYPE: i16 = 11;
pub const STATE_PARTITIONS_KEY_TYPE: i16 = 15;
const VALUE_VERSION: i16 = 0;

/// A topic's share-partitions, as `ShareGroupStatePartitionMetadataValue`
/// lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicPartitions {
    pub topic_id: Uuid,
    pub topic_name: String,
    pub partitions: Vec<i32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShareGroupRecord {
    /// The group's epoch; `None`: the group was deleted.
    Metadata {
        group_id: String,
        epoch: Option<i32>,
    },
    /// The share-partitions initialized (or being initialized) for the
    /// group; `None`: the group was deleted.
    StatePartitions {
        group_id: String,
        initialized: Option<Vec<TopicPartitions>>,
    },
}

/// The key of either record type; `key_type` says which.
pub fn encode_key(key_type: i16, group_id: &str) -> Result<Bytes> {
    let mut k = BytesMut::with_capacity(4 + group_id.len());
    k.put_i16(key_type);
    put_string(
        &mut k,
        "ShareGroupMetadataKey.groupId",
        Some(group_id),
        false,
    )?;
    Ok(k.freeze())
}

/// A `ShareGroupMetadataValue`. Kafka also writes the hash of the
/// subscribed topics' metadata, which only its assignor reads: 0 here.
pub fn encode_metadata(group_id: &str, epoch: i32) -> Result<(Bytes, Bytes)> {
    let mut v = BytesMut::with_capacity(16);
    v.put_i16(VALUE_VERSION);
    v.put_i32(epoch);
    v.put_i64(0);
    put_uvarint(&mut v, 0);
    Ok((encode_key(METADATA_KEY_TYPE, group_id)?, v.freeze()))
}

/// A `ShareGroupStatePartitionMetadataValue` with `initialized` as its
/// initialized topics (none initializing, none being deleted).
pub fn encode_state_partitions(
    group_id: &str,
    initialized: &[TopicPartitions],
) -> Result<(Bytes, Bytes)> {
    let mut v = BytesMut::with_capacity(16 + initialized.len() * 32);
    v.put_i16(VALUE_VERSION);
    put_uvarint(&mut v, 1); // initializing_topics: none
    put_uvarint(&mut v, initialized.len() as u32 + 1);
    for t in initialized {
        v.put_slice(t.topic_id.as_bytes());
        put_string(
            &mut v,
            "TopicPartitionsInfo.topicName",
            Some(&t.topic_name),
            true,
        )?;
        put_uvarint(&mut v, t.partitions.len() as u32 + 1);
        for p in &t.partitions {
            v.put_i32(*p);
        }
        put_uvarint(&mut v, 0);
    }
    put_uvarint(&mut v, 1); // deleting_topics: none
    put_uvarint(&mut v, 0);
    Ok((encode_key(STATE_PARTITIONS_KEY_TYPE, group_id)?, v.freeze()))
}

/// Decodes a record of key type 11 or 15 (`key` starts with the type);
/// `None` for any other type.
pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<Option<ShareGroupRecord>> {
    let mut r = Reader::new(key);
    let key_type = r.i16("share group key type")?;
    if key_type != METADATA_KEY_TYPE && key_type != STATE_PARTITIONS_KEY_TYPE {
        return Ok(None);
    }
    let group_id = r.string("ShareGroupMetadataKey.groupId", false)?;
    let Some(value) = value else {
        return Ok(Some(if key_type == METADATA_KEY_TYPE {
            ShareGroupRecord::Metadata {
                group_id,
                epoch: None,
            }
        } else {
            ShareGroupRecord::StatePartitions {
                group_id,
                initialized: None,
            }
        }));
    };
    let mut r = Reader::new(value);
    let version = r.i16("share group value version")?;
    if version != VALUE_VERSION {
        return Err(RecordFormatError::UnknownValueVersion {
            record: if key_type == METADATA_KEY_TYPE {
                "ShareGroupMetadataValue"
            } else {
                "ShareGroupStatePartitionMetadataValue"
            },
            version,
        });
    }
    if key_type == METADATA_KEY_TYPE {
        let epoch = r.i32("ShareGroupMetadataValue.epoch")?;
        r.i64("ShareGroupMetadataValue.metadataHash")?;
        r.tagged_fields("ShareGroupMetadataValue tagged fields", |_, _| Ok(()))?;
        return Ok(Some(ShareGroupRecord::Metadata {
            group_id,
            epoch: Some(epoch),
        }));
    }
    // Topics being initialized may have state too; those being deleted
    // are on their way out.
    let mut initialized = read_topics(&mut r, "InitializingTopics")?;
    initialized.extend(read_topics(&mut r, "InitializedTopics")?);
    let deleting = r.array_len("DeletingTopics", true)?;
    for _ in 0..deleting {
        r.array::<16>("TopicInfo.topicId")?;
        r.string("TopicInfo.topicName", true)?;
        r.tagged_fields("TopicInfo tagged fields", |_, _| Ok(()))?;
    }
    r.tagged_fields(
        "ShareGroupStatePartitionMetadataValue tagged fields",
        |_, _| Ok(()),
    )?;
    Ok(Some(ShareGroupRecord::StatePartitions {
        group_id,
        initialized: Some(initialized),
    }))
}

fn read_topics(r: &mut Reader<'_>, field: &'static str) -> Result<Vec<TopicPartitions>> {
    let n = r.array_len(field, true)?;
    // Each topic takes at least 19 bytes; `array_len` bounded `n` by the
    // bytes left, so this allocation is too.
    let mut out = Vec::with_capacity(n.min(r.remaining() / 19));
    for _ in 0..n {
        let topic_id = Uuid::from_bytes(r.array::<16>("TopicPartitionsInfo.topicId")?);
        let topic_name = r.string("TopicPartitionsInfo.topicName", true)?;
        let count = r.array_len("TopicPartitionsInfo.partitions", true)?;
        let mut partitions = Vec::with_capacity(count.min(r.remaining() / 4));
        for _ in 0..count {
            partitions.push(r.i32("TopicPartitionsInfo.partitions")?);
        }
        r.tagged_fields("TopicPartitionsInfo tagged fields", |_, _| Ok(()))?;
        out.push(TopicPartitions {
            topic_id,
            topic_name,
            partitions,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn the_metadata_record_has_kafkas_layout_and_reads_back() {
        let (k, v) = encode_metadata("g", 7).unwrap();
        // type 11, "g" as a non-compact string.
        assert_eq!(hex(&k), "000b000167");
        // version 0, epoch 7, hash 0, no tagged fields.
        assert_eq!(
            hex(&v),
            ["0000", "00000007", "0000000000000000", "00"].concat()
        );
        assert_eq!(
            decode(&k, Some(&v)).unwrap(),
            Some(ShareGroupRecord::Metadata {
                group_id: "g".into(),
                epoch: Some(7)
            })
        );
        assert_eq!(
            decode(&k, None).unwrap(),
            Some(ShareGroupRecord::Metadata {
                group_id: "g".into(),
                epoch: None
            })
        );
    }

    #[test]
    fn the_state_partitions_record_has_kafkas_layout_and_reads_back() {
        let t = TopicPartitions {
            topic_id: Uuid::from_u128(1),
            topic_name: "t".into(),
            partitions: vec![0, 2],
        };
        let (k, v) = encode_state_partitions("g", std::slice::from_ref(&t)).unwrap();
        assert_eq!(hex(&k), "000f000167");
        assert_eq!(
            hex(&v),
            [
                "0000",                             // version
                "01",                               // initializing: none
                "02",                               // initialized: one
                "00000000000000000000000000000001", // topic id
                "0274",                             // "t"
                "03",
                "00000000",
                "00000002", // partitions 0, 2
                "00",       // topic's tagged fields
                "01",       // deleting: none
                "00",
            ]
            .concat()
        );
        assert_eq!(
            decode(&k, Some(&v)).unwrap(),
            Some(ShareGroupRecord::StatePartitions {
                group_id: "g".into(),
                initialized: Some(vec![t])
            })
        );
    }

    #[test]
    fn bad_bytes_are_errors_and_other_types_are_not_these() {
        let (k, v) = encode_state_partitions("g", &[]).unwrap();
        for cut in 0..v.len() {
            assert!(decode(&k, Some(&v[..cut])).is_err(), "cut at {cut}");
        }
        let mut bad = v.to_vec();
        bad[1] = 1;
        assert!(decode(&k, Some(&bad)).is_err());
        assert_eq!(decode(&[0, 10, 0, 1, b'g'], Some(&[])).unwrap(), None);
        assert!(decode(&[0], None).is_err());
    }
}
