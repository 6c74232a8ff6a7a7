//! Ordered queues (issue 8): per-key order within a primary partition.
//!
//! Pure: no I/O and no clock. [`OrderedKeys`] lives beside a primary
//! partition's lease engine (in `PartitionState`) when the queue is
//! `ordered = true`:
//!
//! - **Busy keys.** A keyed record is leasable only when it is the lowest
//!   offset of its key among the partition's records not yet done (in
//!   flight, waiting for a failure copy, retrying in place, or waiting to be
//!   leased). So one message per key is out at a time, and a key's messages
//!   go in offset order. Unkeyed records are not ordered. Keys are compared
//!   as bytes.
//! - **Retries in place.** A keyed record that fails (nack, expiry, gap
//!   cap) and is not dead-lettered stays in its partition with the next
//!   attempt and a due time ([`RetryRecord`]), rather than going through a
//!   retry-tier topic (whose partition another instance may own, which
//!   could not keep the key busy). Its lower offset keeps the key busy until
//!   it is acked or dead-lettered. The record is written to the ack log
//!   before the nack is answered, so a new owner restores attempt, due time
//!   and failure history.
//!
//! Ack-log records (beside the lease engine's, same topic and partition):
//! key `version u8 = 1 | topic u16 | partition i32 | kind u8 = 2 | ring u32 |
//! slot u32` (the engine's offset ring, so the topic stays bounded the same
//! way: a slot is reused only once its offset is below the commit point),
//! value `tag u8 = 1 | JSON of RetryRecord`. The engine's decoder refuses
//! kind 2 (`EventDecodeError::Kind`), which the ack-log reader hands here.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::lease::{AckLogRecord, FailureRecord, QueuePartition};

const VERSION: u8 = 1;
/// The key kind of a retry-in-place record.
pub const KIND_RETRY: u8 = 2;
/// The key kind of a parked key's record (the message key follows).
pub const KIND_PARKED: u8 = 3;
// Kind 4 is the lease engine's lease batches (`lease::events`).
const TAG_RETRY: u8 = 1;
const TAG_PARKED: u8 = 2;
/// Parked keys kept per partition. Past it a dead-lettered key is not
/// parked: its later messages are delivered (counted and logged), because
/// holding them would need state without bound.
pub const MAX_PARKED_KEYS: usize = 10_000;
/// The header a hold copy carries its primary offset in (decimal): the
/// replay orders a key's copies by it and drops a duplicate copy.
pub const HELD_FROM_HEADER: &str = "dispatcher.held-from";
/// The topic index of a replayed hold record's receipt (the primary
/// partition's owner serves it).
pub const HOLD_TOPIC: u16 = u16::MAX;
/// Bytes of a key before its kind: version, topic, partition.
const PREFIX: usize = 7;

/// The retry state of one ordered keyed message retried in its partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryRecord {
    pub offset: i64,
    /// The attempt the next delivery is.
    pub attempt: u16,
    /// Not leased before this.
    pub due_ms: i64,
    /// The failure this record follows (attempt and time): a rebuild that
    /// finds that failure still waiting for its route knows it was retried
    /// in place already.
    pub failed_attempt: u16,
    pub failed_at_ms: i64,
    /// The envelope's: where the message was first produced, and when.
    pub origin_topic: String,
    pub origin_partition: i32,
    pub origin_offset: i64,
    pub first_enqueued_ms: i64,
    /// The failure history, oldest first (the envelope's, bounded the same).
    pub errors: Vec<FailureRecord>,
}

/// An ordered-queue record of the ack log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OrderedRecord {
    Retry(RetryRecord),
    /// A parked key's state (latest wins).
    Parked(ParkedKey),
    /// The key is released and its hold replayed (a tombstone in the log).
    Unparked(Vec<u8>),
}

/// A key parked in one primary partition because a message of it was
/// dead-lettered: its later messages are copied to the hold topic, in
/// order, until the key is released (skip or redrive) and the hold replayed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParkedKey {
    pub key: Vec<u8>,
    /// The dead-lettered message the key was parked by.
    pub message_id: String,
    pub parked_at_ms: i64,
    /// Held copies not replayed yet.
    pub held: u64,
    /// The hold-partition offset from which the key's copies not replayed
    /// yet start (`None` until the first copy).
    pub first_hold: Option<i64>,
    /// The hold-partition offset of the key's last copy.
    pub last_hold: Option<i64>,
    /// The highest primary offset held: a record at or below it was held
    /// already (a crash between the copy and this record re-reads it).
    pub last_held_origin: i64,
    /// Origin offset of the last replayed copy (-1: none): a copy at or
    /// below it is a duplicate (a crash between a copy and its record).
    pub replayed_origin: i64,
    /// Set once the key is released: the replay's progress.
    pub release: Option<Release>,
    /// Parked by the gap cap (its stuck message is the first held copy):
    /// released by itself at this time, the message's due time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_release_at_ms: Option<i64>,
}

impl ParkedKey {
    /// Copies of the key in the hold not replayed yet.
    pub fn hold_left(&self) -> bool {
        match (self.first_hold, self.last_hold) {
            (Some(first), Some(last)) => first <= last,
            _ => false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    /// `skip`, `redrive`, `gap_cap` or `spill`.
    pub by: String,
    pub at_ms: i64,
    /// A redrive (the redriven message) or a spill (the busy message): its
    /// primary offset, delivered before the hold.
    pub primary_offset: Option<i64>,
    /// The copy being replayed, when it failed before: its next attempt,
    /// due time and history.
    pub item: Option<ReplayRetry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayRetry {
    pub hold_offset: i64,
    pub attempt: u16,
    pub due_ms: i64,
    pub errors: Vec<FailureRecord>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OrderedDecodeError {
    #[error("ordered ack-log record: bad key")]
    Key,
    #[error("ordered ack-log record: bad value: {0}")]
    Value(String),
}

/// An ack-log key of ours (not the lease engine's).
pub fn is_ordered_key(key: &[u8]) -> bool {
    key.len() > PREFIX && key[0] == VERSION && matches!(key[PREFIX], KIND_RETRY | KIND_PARKED)
}

fn key_prefix(partition: QueuePartition, kind: u8) -> Vec<u8> {
    let mut key = Vec::with_capacity(16);
    key.push(VERSION);
    key.extend_from_slice(&partition.topic.to_be_bytes());
    key.extend_from_slice(&partition.partition.to_be_bytes());
    key.push(kind);
    key
}

/// The ack-log key of a parked key's record.
pub fn parked_log_key(partition: QueuePartition, key: &[u8]) -> Vec<u8> {
    let mut k = key_prefix(partition, KIND_PARKED);
    k.extend_from_slice(key);
    k
}

/// Decodes a tombstone (a record without a value) of ours.
pub fn decode_tombstone(key: &[u8]) -> Option<(QueuePartition, OrderedRecord)> {
    if key.len() <= PREFIX || key[0] != VERSION || key[PREFIX] != KIND_PARKED {
        return None;
    }
    let partition = QueuePartition {
        topic: u16::from_be_bytes([key[1], key[2]]),
        partition: i32::from_be_bytes([key[3], key[4], key[5], key[6]]),
    };
    Some((
        partition,
        OrderedRecord::Unparked(key[PREFIX + 1..].to_vec()),
    ))
}

/// Encodes a record; an `Unparked` one is a tombstone (empty value: the
/// caller writes no payload).
pub fn encode(partition: QueuePartition, ring: u32, record: &OrderedRecord) -> AckLogRecord {
    let mut value = Vec::new();
    let key = match record {
        OrderedRecord::Parked(p) => {
            value.push(TAG_PARKED);
            value.extend(serde_json::to_vec(p).expect("plain data serializes"));
            parked_log_key(partition, &p.key)
        }
        OrderedRecord::Unparked(key) => parked_log_key(partition, key),
        OrderedRecord::Retry(r) => {
            let mut key = key_prefix(partition, KIND_RETRY);
            key.extend_from_slice(&ring.to_be_bytes());
            let slot = u32::try_from(r.offset.rem_euclid(i64::from(ring))).expect("below ring");
            key.extend_from_slice(&slot.to_be_bytes());
            value.push(TAG_RETRY);
            value.extend(serde_json::to_vec(r).expect("plain data serializes"));
            key
        }
    };
    AckLogRecord { key, value }
}

pub fn decode(
    key: &[u8],
    value: &[u8],
) -> Result<(QueuePartition, OrderedRecord), OrderedDecodeError> {
    if key.len() > PREFIX && key[0] == VERSION && key[PREFIX] == KIND_PARKED {
        let Some((partition, _)) = decode_tombstone(key) else {
            return Err(OrderedDecodeError::Key);
        };
        return match value.split_first() {
            Some((&TAG_PARKED, json)) => {
                let p: ParkedKey = serde_json::from_slice(json)
                    .map_err(|e| OrderedDecodeError::Value(e.to_string()))?;
                if p.key != key[PREFIX + 1..] {
                    return Err(OrderedDecodeError::Key);
                }
                Ok((partition, OrderedRecord::Parked(p)))
            }
            _ => Err(OrderedDecodeError::Value("not a parked-key record".into())),
        };
    }
    if key.len() != PREFIX + 9 || key[0] != VERSION || key[PREFIX] != KIND_RETRY {
        return Err(OrderedDecodeError::Key);
    }
    let partition = QueuePartition {
        topic: u16::from_be_bytes([key[1], key[2]]),
        partition: i32::from_be_bytes([key[3], key[4], key[5], key[6]]),
    };
    let ring = u32::from_be_bytes(key[8..12].try_into().expect("4"));
    let slot = u32::from_be_bytes(key[12..16].try_into().expect("4"));
    match value.split_first() {
        Some((&TAG_RETRY, json)) => {
            let r: RetryRecord = serde_json::from_slice(json)
                .map_err(|e| OrderedDecodeError::Value(e.to_string()))?;
            if ring == 0 || r.offset.rem_euclid(i64::from(ring)) != i64::from(slot) {
                return Err(OrderedDecodeError::Key);
            }
            Ok((partition, OrderedRecord::Retry(r)))
        }
        Some((tag, _)) => Err(OrderedDecodeError::Value(format!("unknown tag {tag}"))),
        None => Err(OrderedDecodeError::Value("empty".into())),
    }
}

/// The primary offset a hold copy was made from (-1 when absent).
pub fn held_from(m: &super::message::Buffered) -> i64 {
    m.headers
        .iter()
        .rev()
        .find(|(k, _)| k == HELD_FROM_HEADER)
        .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse().ok())
        .unwrap_or(-1)
}

/// The per-key state of one ordered primary partition.
#[derive(Debug, Default)]
pub struct OrderedKeys {
    /// The offsets of each key's records held by the partition (not done).
    by_key: HashMap<Bytes, BTreeSet<i64>>,
    /// Retry states of keyed records retried in place, by offset.
    retries: BTreeMap<i64, RetryRecord>,
    /// Parked keys (at most [`MAX_PARKED_KEYS`]).
    pub(crate) parked: BTreeMap<Bytes, ParkedKey>,
    /// Records of parked keys waiting for their hold copy, and the ones
    /// being copied now.
    pub(crate) to_hold: BTreeSet<i64>,
    pub(crate) holding: BTreeSet<i64>,
    /// The copy being replayed per released key (read from the hold).
    pub(crate) replay: HashMap<Bytes, ReplayItem>,
    /// Released keys whose next copy is being read from the hold.
    pub(crate) loading: BTreeSet<Bytes>,
    /// Records for the ack log, in order (`PartitionState::take_ordered_out`).
    pub(crate) out: Vec<OrderedRecord>,
}

/// A hold copy being replayed.
#[derive(Debug, Clone)]
pub struct ReplayItem {
    pub hold_offset: i64,
    pub origin_offset: i64,
    pub msg: super::message::Buffered,
    pub lease: Option<ReplayLease>,
    /// Dead-lettered: its DLQ copy is being written.
    pub dead: bool,
}

#[derive(Debug, Clone, Copy)]
pub struct ReplayLease {
    pub generation: crate::lease::Generation,
    pub expiry_ms: i64,
    pub deadline_ms: i64,
    pub consumer: crate::lease::ConsumerSlot,
}

impl OrderedKeys {
    /// A partition's key state, with the retry records its ack log holds
    /// (in log order: the latest per offset wins).
    pub fn new(records: impl IntoIterator<Item = OrderedRecord>, committed: i64) -> Self {
        let mut s = OrderedKeys::default();
        for record in records {
            match record {
                OrderedRecord::Retry(r) if r.offset >= committed => {
                    s.retries.insert(r.offset, r);
                }
                OrderedRecord::Retry(_) => {}
                OrderedRecord::Parked(p) => {
                    s.parked.insert(Bytes::from(p.key.clone()), p);
                }
                OrderedRecord::Unparked(key) => {
                    s.parked.remove(&key[..]);
                }
            }
        }
        s
    }

    /// A record of `key` at `offset` is held by the partition.
    pub fn insert(&mut self, key: &Bytes, offset: i64) {
        self.by_key.entry(key.clone()).or_default().insert(offset);
    }

    /// The record at `offset` is done (acked, dead-lettered, or below the
    /// commit point).
    pub fn remove(&mut self, key: &Bytes, offset: i64) {
        if let Some(set) = self.by_key.get_mut(key) {
            set.remove(&offset);
            if set.is_empty() {
                self.by_key.remove(key);
            }
        }
        self.retries.remove(&offset);
    }

    /// The record of `key` at `offset` left the partition (done, or below
    /// the commit point): it is no longer held or waiting for the hold, and
    /// when it was a released key's first record (its redriven message),
    /// the key's hold is next.
    pub(crate) fn record_gone(&mut self, key: &Bytes, offset: i64) {
        self.remove(key, offset);
        self.to_hold.remove(&offset);
        if let Some(p) = self.parked.get_mut(key) {
            if let Some(r) = &mut p.release {
                if r.primary_offset == Some(offset) {
                    r.primary_offset = None;
                    self.out.push(OrderedRecord::Parked(p.clone()));
                    self.check_finished(key);
                }
            }
        }
    }

    /// Forgets the retry states below the commit point.
    pub fn trim(&mut self, committed: i64) {
        while self
            .retries
            .first_key_value()
            .is_some_and(|(&o, _)| o < committed)
        {
            self.retries.pop_first();
        }
    }

    /// The record of `key` at `offset` may be leased: no lower offset of its
    /// key is held.
    pub fn is_first(&self, key: &Bytes, offset: i64) -> bool {
        self.by_key
            .get(key)
            .and_then(|set| set.first())
            .is_none_or(|&first| first == offset)
    }

    pub fn retry(&self, offset: i64) -> Option<&RetryRecord> {
        self.retries.get(&offset)
    }

    pub fn set_retry(&mut self, record: RetryRecord) {
        self.retries.insert(record.offset, record);
    }

    /// Keys with a record held (busy or waiting behind one).
    pub fn key_count(&self) -> usize {
        self.by_key.len()
    }

    /// Records retried in place now.
    pub fn retry_count(&self) -> usize {
        self.retries.len()
    }

    pub fn parked(&self) -> impl Iterator<Item = &ParkedKey> {
        self.parked.values()
    }

    pub fn is_parked(&self, key: &Bytes) -> bool {
        self.parked.contains_key(key)
    }

    /// Copies written to the hold and not replayed yet, over all keys.
    pub fn held_count(&self) -> u64 {
        self.parked.values().map(|p| p.held).sum()
    }

    /// A released key whose redriven record, hold copies, and records
    /// waiting for a hold copy are all done is unparked (tombstone).
    pub(crate) fn check_finished(&mut self, key: &Bytes) {
        let Some(p) = self.parked.get(key) else {
            return;
        };
        let Some(r) = &p.release else {
            return;
        };
        if r.primary_offset.is_some()
            || p.hold_left()
            || self.replay.contains_key(key)
            || self.loading.contains(key)
        {
            return;
        }
        let waiting = self.by_key.get(key).is_some_and(|set| {
            set.iter()
                .any(|o| self.to_hold.contains(o) || self.holding.contains(o))
        });
        if waiting {
            return;
        }
        self.parked.remove(key);
        self.out.push(OrderedRecord::Unparked(key.to_vec()));
    }

    /// The offsets of `key`'s held records.
    pub(crate) fn offsets_of(&self, key: &Bytes) -> Vec<i64> {
        self.by_key
            .get(key)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The earliest due time after `now_ms` of a record retried in place.
    pub fn next_due_ms(&self, now_ms: i64) -> Option<i64> {
        self.retries
            .values()
            .map(|r| r.due_ms)
            .filter(|&d| d > now_ms)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: QueuePartition = QueuePartition {
        topic: 0,
        partition: 3,
    };

    fn retry(offset: i64) -> RetryRecord {
        RetryRecord {
            offset,
            attempt: 2,
            due_ms: 5_000,
            failed_attempt: 1,
            failed_at_ms: 4_000,
            origin_topic: "t".into(),
            origin_partition: 3,
            origin_offset: offset,
            first_enqueued_ms: 1_000,
            errors: vec![FailureRecord {
                attempt: 1,
                at_ms: 4_000,
                error: "boom".into(),
                consumer: Some("w1".into()),
            }],
        }
    }

    #[test]
    fn retry_records_round_trip_and_share_the_offset_ring() {
        let r = OrderedRecord::Retry(retry(12));
        let rec = encode(P, 10, &r);
        assert!(is_ordered_key(&rec.key));
        assert_eq!(decode(&rec.key, &rec.value), Ok((P, r)));
        let other = encode(P, 10, &OrderedRecord::Retry(retry(22)));
        assert_eq!(other.key, rec.key, "offsets a ring apart share a slot");
        let engine =
            crate::lease::encode_record(P, 10, &crate::lease::LeaseEvent::Acked { offset: 12 });
        assert!(!is_ordered_key(&engine.key));
        assert_eq!(
            crate::lease::decode_record(&rec.key, &rec.value),
            Err(crate::lease::EventDecodeError::Kind(KIND_RETRY)),
            "the engine's decoder leaves them to us"
        );
        // A value moved under another slot is refused.
        assert_eq!(
            decode(
                &encode(P, 10, &OrderedRecord::Retry(retry(13))).key,
                &rec.value
            ),
            Err(OrderedDecodeError::Key)
        );
    }

    #[test]
    fn only_the_lowest_held_offset_of_a_key_is_leasable() {
        let mut k = OrderedKeys::default();
        let a = Bytes::from_static(b"a");
        let b = Bytes::from_static(b"b");
        k.insert(&a, 1);
        k.insert(&b, 2);
        k.insert(&a, 3);
        assert!(k.is_first(&a, 1));
        assert!(!k.is_first(&a, 3), "a busy key's later message waits");
        assert!(k.is_first(&b, 2), "other keys flow");
        k.remove(&a, 1);
        assert!(k.is_first(&a, 3), "released by the ack");
        k.remove(&a, 3);
        assert_eq!(k.key_count(), 1);
    }

    #[test]
    fn retry_states_rebuild_from_the_log_above_the_commit_point() {
        let mut newer = retry(7);
        newer.attempt = 3;
        let k = OrderedKeys::new(
            [
                OrderedRecord::Retry(retry(4)),
                OrderedRecord::Retry(retry(7)),
                OrderedRecord::Retry(newer.clone()),
            ],
            5,
        );
        assert_eq!(k.retry(4), None, "below the commit point");
        assert_eq!(k.retry(7), Some(&newer), "the latest wins");
        assert_eq!(k.next_due_ms(0), Some(5_000));
        assert_eq!(k.next_due_ms(5_000), None);
    }
}
