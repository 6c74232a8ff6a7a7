//! The records of `__share_group_state`, byte-compatible with Apache Kafka
//! 4.4 (checked against its share-coordinator jar): key type 0 is a
//! share-partition's snapshot (`ShareSnapshotKey`/`ShareSnapshotValue`),
//! key type 1 an update laid over the last snapshot
//! (`ShareUpdateKey`/`ShareUpdateValue`); both values are version 0,
//! flexible, with `DeliveryCompleteCount` as tagged field 0 (written when
//! it is not -1). A null value is a tombstone: the share-partition's state
//! was deleted.
//!
//! Invariant: as `group::records`: bytes to [`ShareRecord`] and back,
//! never panicking and never allocating more than the input holds.

use bytes::{BufMut, Bytes, BytesMut};
use uuid::Uuid;

use super::partition::{RecordState, StateBatch};
use crate::group::records::{put_string, put_uvarint, Reader, RecordFormatError, Result};

pub const SNAPSHOT_KEY_TYPE: i16 = 0;
pub const UPDATE_KEY_TYPE: i16 = 1;
const VALUE_VERSION: i16 = 0;
const DELIVERY_COMPLETE_COUNT_TAG: u32 = 0;

/// Which share-partition a record is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SharePartitionKey {
    pub group_id: String,
    pub topic_id: Uuid,
    pub partition: i32,
}

/// A `ShareSnapshotValue`: the whole state of a share-partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub snapshot_epoch: i32,
    pub state_epoch: i32,
    pub leader_epoch: i32,
    pub start_offset: i64,
    /// Records delivered to completion in the window, or -1 (not written).
    pub delivery_complete_count: i32,
    pub create_timestamp: i64,
    pub write_timestamp: i64,
    pub batches: Vec<StateBatch>,
}

/// A `ShareUpdateValue`: batches (and a start offset, or -1) that replace
/// what the snapshot of the same snapshot epoch says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Update {
    pub snapshot_epoch: i32,
    pub leader_epoch: i32,
    pub start_offset: i64,
    pub delivery_complete_count: i32,
    pub batches: Vec<StateBatch>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShareRecord {
    Snapshot(SharePartitionKey, Option<Snapshot>),
    Update(SharePartitionKey, Option<Update>),
    /// A key type this module does not know (from a newer Kafka); a loader
    /// skips it, as Kafka's does.
    Other {
        key_type: i16,
    },
}

pub fn encode_snapshot(key: &SharePartitionKey, value: &Snapshot) -> Result<(Bytes, Bytes)> {
    let mut v = BytesMut::with_capacity(64 + value.batches.len() * 20);
    v.put_i16(VALUE_VERSION);
    v.put_i32(value.snapshot_epoch);
    v.put_i32(value.state_epoch);
    v.put_i32(value.leader_epoch);
    v.put_i64(value.start_offset);
    v.put_i64(value.create_timestamp);
    v.put_i64(value.write_timestamp);
    put_batches(&mut v, &value.batches);
    put_value_tags(&mut v, value.delivery_complete_count);
    Ok((encode_key(SNAPSHOT_KEY_TYPE, key)?, v.freeze()))
}

pub fn encode_update(key: &SharePartitionKey, value: &Update) -> Result<(Bytes, Bytes)> {
    let mut v = BytesMut::with_capacity(32 + value.batches.len() * 20);
    v.put_i16(VALUE_VERSION);
    v.put_i32(value.snapshot_epoch);
    v.put_i32(value.leader_epoch);
    v.put_i64(value.start_offset);
    put_batches(&mut v, &value.batches);
    put_value_tags(&mut v, value.delivery_complete_count);
    Ok((encode_key(UPDATE_KEY_TYPE, key)?, v.freeze()))
}

/// The key of either record type; `key_type` says which.
pub fn encode_key(key_type: i16, key: &SharePartitionKey) -> Result<Bytes> {
    let mut k = BytesMut::with_capacity(24 + key.group_id.len());
    k.put_i16(key_type);
    put_string(
        &mut k,
        "ShareSnapshotKey.groupId",
        Some(&key.group_id),
        false,
    )?;
    k.put_slice(key.topic_id.as_bytes());
    k.put_i32(key.partition);
    Ok(k.freeze())
}

fn put_batches(v: &mut BytesMut, batches: &[StateBatch]) {
    put_uvarint(v, batches.len() as u32 + 1);
    for b in batches {
        v.put_i64(b.first_offset);
        v.put_i64(b.last_offset);
        v.put_i8(b.state.id());
        v.put_i16(b.delivery_count);
        put_uvarint(v, 0);
    }
}

fn put_value_tags(v: &mut BytesMut, delivery_complete_count: i32) {
    if delivery_complete_count == -1 {
        put_uvarint(v, 0);
    } else {
        put_uvarint(v, 1);
        put_uvarint(v, DELIVERY_COMPLETE_COUNT_TAG);
        put_uvarint(v, 4);
        v.put_i32(delivery_complete_count);
    }
}

pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<ShareRecord> {
    let mut r = Reader::new(key);
    let key_type = r.i16("share state key type")?;
    if key_type != SNAPSHOT_KEY_TYPE && key_type != UPDATE_KEY_TYPE {
        return Ok(ShareRecord::Other { key_type });
    }
    let k = SharePartitionKey {
        group_id: r.string("ShareSnapshotKey.groupId", false)?,
        topic_id: Uuid::from_bytes(r.array::<16>("ShareSnapshotKey.topicId")?),
        partition: r.i32("ShareSnapshotKey.partition")?,
    };
    let Some(value) = value else {
        return Ok(if key_type == SNAPSHOT_KEY_TYPE {
            ShareRecord::Snapshot(k, None)
        } else {
            ShareRecord::Update(k, None)
        });
    };
    let mut r = Reader::new(value);
    let version = r.i16("share state value version")?;
    if key_type == SNAPSHOT_KEY_TYPE {
        if version != VALUE_VERSION {
            return Err(RecordFormatError::UnknownValueVersion {
                record: "ShareSnapshotValue",
                version,
            });
        }
        let snapshot_epoch = r.i32("ShareSnapshotValue.snapshotEpoch")?;
        let state_epoch = r.i32("ShareSnapshotValue.stateEpoch")?;
        let leader_epoch = r.i32("ShareSnapshotValue.leaderEpoch")?;
        let start_offset = r.i64("ShareSnapshotValue.startOffset")?;
        let create_timestamp = r.i64("ShareSnapshotValue.createTimestamp")?;
        let write_timestamp = r.i64("ShareSnapshotValue.writeTimestamp")?;
        let batches = read_batches(&mut r)?;
        let delivery_complete_count = read_value_tags(&mut r)?;
        Ok(ShareRecord::Snapshot(
            k,
            Some(Snapshot {
                snapshot_epoch,
                state_epoch,
                leader_epoch,
                start_offset,
                delivery_complete_count,
                create_timestamp,
                write_timestamp,
                batches,
            }),
        ))
    } else {
        if version != VALUE_VERSION {
            return Err(RecordFormatError::UnknownValueVersion {
                record: "ShareUpdateValue",
                version,
            });
        }
        let snapshot_epoch = r.i32("ShareUpdateValue.snapshotEpoch")?;
        let leader_epoch = r.i32("ShareUpdateValue.leaderEpoch")?;
        let start_offset = r.i64("ShareUpdateValue.startOffset")?;
        let batches = read_batches(&mut r)?;
        let delivery_complete_count = read_value_tags(&mut r)?;
        Ok(ShareRecord::Update(
            k,
            Some(Update {
                snapshot_epoch,
                leader_epoch,
                start_offset,
                delivery_complete_count,
                batches,
            }),
        ))
    }
}

fn read_batches(r: &mut Reader<'_>) -> Result<Vec<StateBatch>> {
    let field = "StateBatches";
    let n = r.array_len(field, true)?;
    // Each batch takes at least 20 bytes; `array_len` bounded `n` by the
    // bytes left, so this allocation is too.
    let mut out = Vec::with_capacity(n.min(r.remaining() / 20));
    for _ in 0..n {
        let first_offset = r.i64("StateBatch.firstOffset")?;
        let last_offset = r.i64("StateBatch.lastOffset")?;
        let id = r.array::<1>("StateBatch.deliveryState")?[0] as i8;
        let delivery_count = r.i16("StateBatch.deliveryCount")?;
        r.tagged_fields("StateBatch tagged fields", |_, _| Ok(()))?;
        let state = RecordState::from_id(id).ok_or(RecordFormatError::InvalidLength {
            field: "StateBatch.deliveryState",
            length: i64::from(id),
        })?;
        out.push(StateBatch {
            first_offset,
            last_offset,
            state,
            delivery_count,
        });
    }
    Ok(out)
}

fn read_value_tags(r: &mut Reader<'_>) -> Result<i32> {
    let mut count = -1;
    r.tagged_fields("share state value tagged fields", |tag, data| {
        if tag == DELIVERY_COMPLETE_COUNT_TAG {
            let bytes: [u8; 4] = data
                .try_into()
                .map_err(|_| RecordFormatError::InvalidLength {
                    field: "deliveryCompleteCount",
                    length: data.len() as i64,
                })?;
            count = i32::from_be_bytes(bytes);
        }
        Ok(())
    })?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SharePartitionKey {
        SharePartitionKey {
            group_id: "g".into(),
            topic_id: Uuid::from_u128(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10),
            partition: 3,
        }
    }

    fn batch() -> StateBatch {
        StateBatch {
            first_offset: 5,
            last_offset: 9,
            state: RecordState::Acknowledged,
            delivery_count: 2,
        }
    }

    #[test]
    fn a_snapshot_has_kafkas_layout_and_reads_back() {
        let snapshot = Snapshot {
            snapshot_epoch: 1,
            state_epoch: 2,
            leader_epoch: 3,
            start_offset: 5,
            delivery_complete_count: -1,
            create_timestamp: 7,
            write_timestamp: 8,
            batches: vec![batch()],
        };
        let (k, v) = encode_snapshot(&key(), &snapshot).unwrap();
        let mut want_key = vec![0, 0, 0, 1, b'g'];
        want_key.extend_from_slice(&key().topic_id.as_bytes()[..]);
        want_key.extend_from_slice(&[0, 0, 0, 3]);
        assert_eq!(&k[..], &want_key[..]);
        let mut want = vec![0, 0];
        for x in [1i32, 2, 3] {
            want.extend_from_slice(&x.to_be_bytes());
        }
        for x in [5i64, 7, 8] {
            want.extend_from_slice(&x.to_be_bytes());
        }
        want.push(2); // one batch
        want.extend_from_slice(&5i64.to_be_bytes());
        want.extend_from_slice(&9i64.to_be_bytes());
        want.extend_from_slice(&[2, 0, 2, 0]); // state, count, no tags
        want.push(0); // no tags
        assert_eq!(&v[..], &want[..]);
        assert_eq!(
            decode(&k, Some(&v)).unwrap(),
            ShareRecord::Snapshot(key(), Some(snapshot))
        );
    }

    #[test]
    fn an_update_carries_the_delivery_complete_count_as_tag_zero() {
        let update = Update {
            snapshot_epoch: 4,
            leader_epoch: 1,
            start_offset: -1,
            delivery_complete_count: 9,
            batches: vec![batch(), batch()],
        };
        let (k, v) = encode_update(&key(), &update).unwrap();
        assert_eq!(&k[..2], &[0, 1]);
        assert_eq!(&v[v.len() - 7..], &[1, 0, 4, 0, 0, 0, 9]);
        assert_eq!(
            decode(&k, Some(&v)).unwrap(),
            ShareRecord::Update(key(), Some(update))
        );
        assert_eq!(decode(&k, None).unwrap(), ShareRecord::Update(key(), None));
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// The same records serialized by Kafka 4.4's generated classes
    /// (`MessageUtil.toCoordinatorTypePrefixedBytes` for keys,
    /// `toVersionPrefixedByteBuffer(0, ..)` for values).
    #[test]
    fn the_bytes_equal_what_kafka_4_4_writes() {
        let snapshot = Snapshot {
            snapshot_epoch: 1,
            state_epoch: 2,
            leader_epoch: 3,
            start_offset: 5,
            delivery_complete_count: -1,
            create_timestamp: 7,
            write_timestamp: 8,
            batches: vec![batch()],
        };
        let (k, v) = encode_snapshot(&key(), &snapshot).unwrap();
        assert_eq!(
            hex(&k),
            "00000001670102030405060708090a0b0c0d0e0f1000000003"
        );
        assert_eq!(
            hex(&v),
            "0000000000010000000200000003000000000000000500000000000000070000000000000008\
             02000000000000000500000000000000090200020000"
        );
        let update = Update {
            snapshot_epoch: 4,
            leader_epoch: 1,
            start_offset: -1,
            delivery_complete_count: 9,
            batches: vec![batch()],
        };
        let (k, v) = encode_update(&key(), &update).unwrap();
        assert_eq!(
            hex(&k),
            "00010001670102030405060708090a0b0c0d0e0f1000000003"
        );
        assert_eq!(
            hex(&v),
            "00000000000400000001ffffffffffffffff02000000000000000500000000000000090200020001000400000009"
        );
    }

    #[test]
    fn bad_bytes_are_errors_and_unknown_types_are_skipped() {
        let (k, v) = encode_update(
            &key(),
            &Update {
                snapshot_epoch: 0,
                leader_epoch: 0,
                start_offset: 0,
                delivery_complete_count: -1,
                batches: vec![batch()],
            },
        )
        .unwrap();
        for cut in 0..v.len() {
            assert!(decode(&k, Some(&v[..cut])).is_err(), "cut at {cut}");
        }
        let mut bad_state = v.to_vec();
        bad_state[2 + 4 + 4 + 8 + 1 + 16] = 3;
        assert!(decode(&k, Some(&bad_state)).is_err());
        let mut huge = v[..18].to_vec();
        huge.extend_from_slice(&[0xff, 0xff, 0xff, 0x7f]);
        assert!(decode(&k, Some(&huge)).is_err());
        assert_eq!(
            decode(&[0, 9, 1, 2], Some(&[])).unwrap(),
            ShareRecord::Other { key_type: 9 }
        );
    }
}
