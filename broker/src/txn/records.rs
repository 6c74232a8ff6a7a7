//! The key and value formats of `__transaction_state` records, byte-compatible
//! with Apache Kafka 4.x (`TransactionLogKey` v0, `TransactionLogValue` v0
//! and the flexible v1), so a log written by either loads in the other.
//!
//! Both start with an int16 version. Kafka writes value v1 once
//! `transaction.version` is at least 1 (`TransactionVersion
//! .transactionLogValueVersion`), and so do we. An `Empty` transaction is
//! written with a null partition list, as Kafka does.
//!
//! Invariant: decoding never panics and never allocates more than the input
//! holds; the module knows nothing of logs or time.

use std::collections::{BTreeMap, BTreeSet};

use bytes::{BufMut, Bytes, BytesMut};

use crate::group::records::{put_string, put_uvarint, Reader, RecordFormatError, Result};

use super::TxnState;

/// The value version this broker writes (flexible, with tagged fields).
pub const VALUE_WRITE_VERSION: i16 = 1;
const VALUE_MAX_VERSION: i16 = 1;
const KEY_VERSION: i16 = 0;

const TAG_PREVIOUS_PRODUCER_ID: u32 = 0;
const TAG_NEXT_PRODUCER_ID: u32 = 1;
const TAG_CLIENT_TRANSACTION_VERSION: u32 = 2;

/// One transactional id's stored state (`TransactionLogValue`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnLogValue {
    pub producer_id: i64,
    pub previous_producer_id: i64,
    pub next_producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    /// Topic -> partitions in the transaction.
    pub partitions: BTreeMap<String, BTreeSet<i32>>,
    pub last_update_ms: i64,
    pub start_ms: i64,
    pub client_transaction_version: i16,
}

pub fn encode_key(transactional_id: &str) -> Result<Bytes> {
    let mut buf = BytesMut::with_capacity(4 + transactional_id.len());
    buf.put_i16(KEY_VERSION);
    put_string(
        &mut buf,
        "TransactionLogKey.transactionalId",
        Some(transactional_id),
        false,
    )?;
    Ok(buf.freeze())
}

/// The transactional id a key names; `None` for a key version Kafka does
/// not define (its loader skips those).
pub fn decode_key(bytes: &[u8]) -> Result<Option<String>> {
    let mut r = Reader::new(bytes);
    if r.i16("TransactionLogKey.version")? != KEY_VERSION {
        return Ok(None);
    }
    r.string("TransactionLogKey.transactionalId", false)
        .map(Some)
}

pub fn encode_value(v: &TxnLogValue, version: i16) -> Result<Bytes> {
    let flexible = version >= 1;
    let mut buf = BytesMut::with_capacity(64);
    buf.put_i16(version);
    buf.put_i64(v.producer_id);
    buf.put_i16(v.producer_epoch);
    buf.put_i32(v.timeout_ms);
    buf.put_i8(v.state.id());
    if v.state == TxnState::Empty {
        if flexible {
            put_uvarint(&mut buf, 0);
        } else {
            buf.put_i32(-1);
        }
    } else {
        put_len(&mut buf, v.partitions.len(), flexible);
        for (topic, parts) in &v.partitions {
            put_string(&mut buf, "PartitionsSchema.topic", Some(topic), flexible)?;
            put_len(&mut buf, parts.len(), flexible);
            for p in parts {
                buf.put_i32(*p);
            }
            if flexible {
                put_uvarint(&mut buf, 0);
            }
        }
    }
    buf.put_i64(v.last_update_ms);
    buf.put_i64(v.start_ms);
    if flexible {
        // Tagged fields are written only when they differ from their default.
        let mut tags: Vec<(u32, Vec<u8>)> = Vec::new();
        if v.previous_producer_id != -1 {
            tags.push((
                TAG_PREVIOUS_PRODUCER_ID,
                v.previous_producer_id.to_be_bytes().to_vec(),
            ));
        }
        if v.next_producer_id != -1 {
            tags.push((
                TAG_NEXT_PRODUCER_ID,
                v.next_producer_id.to_be_bytes().to_vec(),
            ));
        }
        if v.client_transaction_version != 0 {
            tags.push((
                TAG_CLIENT_TRANSACTION_VERSION,
                v.client_transaction_version.to_be_bytes().to_vec(),
            ));
        }
        put_uvarint(&mut buf, tags.len() as u32);
        for (tag, data) in tags {
            put_uvarint(&mut buf, tag);
            put_uvarint(&mut buf, data.len() as u32);
            buf.put_slice(&data);
        }
    }
    Ok(buf.freeze())
}

fn put_len(buf: &mut BytesMut, len: usize, flexible: bool) {
    if flexible {
        put_uvarint(buf, len as u32 + 1);
    } else {
        buf.put_i32(len as i32);
    }
}

pub fn decode_value(bytes: &[u8]) -> Result<TxnLogValue> {
    let mut r = Reader::new(bytes);
    let version = r.i16("TransactionLogValue.version")?;
    if !(0..=VALUE_MAX_VERSION).contains(&version) {
        return Err(RecordFormatError::UnknownValueVersion {
            record: "TransactionLogValue",
            version,
        });
    }
    let flexible = version >= 1;
    let producer_id = r.i64("TransactionLogValue.producerId")?;
    let producer_epoch = r.i16("TransactionLogValue.producerEpoch")?;
    let timeout_ms = r.i32("TransactionLogValue.transactionTimeoutMs")?;
    let status = r.array::<1>("TransactionLogValue.transactionStatus")?[0] as i8;
    let state = TxnState::from_id(status).ok_or(RecordFormatError::InvalidLength {
        field: "TransactionLogValue.transactionStatus",
        length: i64::from(status),
    })?;
    let field = "TransactionLogValue.transactionPartitions";
    let count = if flexible {
        i64::from(r.compact_length(field)?)
    } else {
        i64::from(r.i32(field)?)
    };
    let mut partitions = BTreeMap::new();
    if count > r.remaining() as i64 {
        return Err(RecordFormatError::InvalidLength {
            field,
            length: count,
        });
    }
    for _ in 0..count.max(0) {
        let topic = r.string("PartitionsSchema.topic", flexible)?;
        let n = r.array_len("PartitionsSchema.partitionIds", flexible)?;
        let set: &mut BTreeSet<i32> = partitions.entry(topic).or_default();
        for _ in 0..n {
            set.insert(r.i32("PartitionsSchema.partitionIds")?);
        }
        if flexible {
            r.tagged_fields("PartitionsSchema", |_, _| Ok(()))?;
        }
    }
    let last_update_ms = r.i64("TransactionLogValue.transactionLastUpdateTimestampMs")?;
    let start_ms = r.i64("TransactionLogValue.transactionStartTimestampMs")?;
    let mut value = TxnLogValue {
        producer_id,
        previous_producer_id: -1,
        next_producer_id: -1,
        producer_epoch,
        timeout_ms,
        state,
        // Kafka ignores the stored partitions of an Empty transaction.
        partitions: if state == TxnState::Empty {
            BTreeMap::new()
        } else {
            partitions
        },
        last_update_ms,
        start_ms,
        client_transaction_version: 0,
    };
    if flexible {
        r.tagged_fields("TransactionLogValue", |tag, data| {
            match tag {
                TAG_PREVIOUS_PRODUCER_ID => {
                    value.previous_producer_id = Reader::new(data).i64("PreviousProducerId")?
                }
                TAG_NEXT_PRODUCER_ID => {
                    value.next_producer_id = Reader::new(data).i64("NextProducerId")?
                }
                TAG_CLIENT_TRANSACTION_VERSION => {
                    value.client_transaction_version =
                        Reader::new(data).i16("ClientTransactionVersion")?
                }
                _ => {}
            }
            Ok(())
        })?;
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(state: TxnState) -> TxnLogValue {
        let mut partitions = BTreeMap::new();
        if state != TxnState::Empty {
            partitions.insert("orders".to_string(), BTreeSet::from([0, 3]));
            partitions.insert("__consumer_offsets".to_string(), BTreeSet::from([17]));
        }
        TxnLogValue {
            producer_id: 4001,
            previous_producer_id: -1,
            next_producer_id: -1,
            producer_epoch: 7,
            timeout_ms: 60_000,
            state,
            partitions,
            last_update_ms: 1_700_000_000_123,
            start_ms: 1_700_000_000_000,
            client_transaction_version: 1,
        }
    }

    #[test]
    fn keys_and_values_round_trip_in_both_versions() {
        let key = encode_key("tx-1").unwrap();
        assert_eq!(&key[..], b"\x00\x00\x00\x04tx-1");
        assert_eq!(decode_key(&key).unwrap().as_deref(), Some("tx-1"));
        for state in [TxnState::Empty, TxnState::Ongoing, TxnState::PrepareCommit] {
            for version in [0, 1] {
                let mut v = sample(state);
                if version == 0 {
                    // v0 has no tagged fields to carry these.
                    v.client_transaction_version = 0;
                }
                let bytes = encode_value(&v, version).unwrap();
                assert_eq!(decode_value(&bytes).unwrap(), v, "{state:?} v{version}");
            }
        }
    }

    /// The exact bytes of Kafka's `MessageUtil.toVersionPrefixedBytes` for
    /// a v0 Ongoing value with one topic, worked out from the schema.
    #[test]
    fn version_zero_is_kafkas_classic_layout() {
        let mut v = sample(TxnState::Ongoing);
        v.partitions = BTreeMap::from([("t".to_string(), BTreeSet::from([2]))]);
        v.client_transaction_version = 0;
        let bytes = encode_value(&v, 0).unwrap();
        let mut want = vec![0, 0];
        want.extend_from_slice(&4001i64.to_be_bytes());
        want.extend_from_slice(&7i16.to_be_bytes());
        want.extend_from_slice(&60_000i32.to_be_bytes());
        want.push(1);
        want.extend_from_slice(&1i32.to_be_bytes());
        want.extend_from_slice(&[0, 1, b't']);
        want.extend_from_slice(&1i32.to_be_bytes());
        want.extend_from_slice(&2i32.to_be_bytes());
        want.extend_from_slice(&1_700_000_000_123i64.to_be_bytes());
        want.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
        assert_eq!(&bytes[..], &want[..]);
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Bytes from Kafka 4.4's own `MessageUtil.toVersionPrefixedBytes` of
    /// the generated `TransactionLogValue`, for the same values.
    #[test]
    fn version_one_matches_kafkas_serializer_byte_for_byte() {
        let mut v = sample(TxnState::Ongoing);
        v.partitions = BTreeMap::from([("orders".to_string(), BTreeSet::from([0, 3]))]);
        v.previous_producer_id = 12;
        v.next_producer_id = 13;
        let kafka = unhex(
            "00010000000000000fa100070000ea600102076f726465727303000000000000000300\
             0000018bcfe5687b0000018bcfe56800030008000000000000000c0108000000000000\
             000d02020001",
        );
        assert_eq!(encode_value(&v, 1).unwrap().to_vec(), kafka);
        assert_eq!(decode_value(&kafka).unwrap(), v);
        let mut empty = sample(TxnState::Empty);
        empty.start_ms = -1;
        empty.client_transaction_version = 0;
        let kafka_empty =
            unhex("00010000000000000fa100070000ea6000000000018bcfe5687bffffffffffffffff00");
        assert_eq!(encode_value(&empty, 1).unwrap().to_vec(), kafka_empty);
    }

    #[test]
    fn tagged_fields_are_written_only_when_set_and_unknown_ones_are_skipped() {
        let mut v = sample(TxnState::Empty);
        v.client_transaction_version = 0;
        let plain = encode_value(&v, 1).unwrap();
        assert_eq!(*plain.last().unwrap(), 0, "no tagged fields");
        v.previous_producer_id = 12;
        v.next_producer_id = 13;
        v.client_transaction_version = 2;
        let tagged = encode_value(&v, 1).unwrap();
        assert_eq!(decode_value(&tagged).unwrap(), v);
        // An unknown tag (9, two bytes) appended by a newer writer.
        let mut newer = plain.to_vec();
        *newer.last_mut().unwrap() = 1;
        newer.extend_from_slice(&[9, 2, 0xab, 0xcd]);
        assert!(decode_value(&newer).is_ok());
    }

    #[test]
    fn damaged_values_are_errors_not_panics() {
        let bytes = encode_value(&sample(TxnState::Ongoing), 1).unwrap();
        for cut in 0..bytes.len() {
            assert!(decode_value(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad_state = bytes.to_vec();
        bad_state[2 + 8 + 2 + 4] = 42;
        assert!(decode_value(&bad_state).is_err());
        assert!(decode_value(&[0, 5]).is_err());
    }
}
