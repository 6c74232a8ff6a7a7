//! Ack-log events and their record format for a compacted Kafka topic.
//!
//! Key: `version u8 | topic u16 | partition i32 | kind u8`, then for per-offset records
//! `ring u32 | slot u32` with `slot = offset % ring` (ring = the gap cap).
//! Value: `tag u8` and the event's fields, big-endian.
//!
//! Why a ring of slots rather than one key per offset: the topic must stay
//! bounded without a tombstone per message. Every per-offset record is
//! written while its offset is inside the window `[commit point, commit
//! point + gap cap)`, and the commit point only grows, so two offsets that
//! share a slot are never live at once: a later record in a slot is for the
//! same offset or supersedes a dead one. Compaction keeps the latest record
//! per key, so the latest record of every live offset survives, and records
//! of dead offsets lie below the latest `CommitAdvanced` and are ignored.
//! The ring is part of the key, so an owner with another gap cap never
//! shares a key with an older one. The partition key holds the commit point.
//!
//! Leases are not per-offset records: each `lease` call writes one
//! `LeasedBatch` under `kind 4 | ring u32 | slot u32`, the slot taken in turn
//! from a ring of [`LEASE_BATCH_RING`] (one record per receive and partition
//! instead of one per message, which was most of what the dispatcher wrote).
//! Before a slot is reused, the leases its previous record holds that are
//! still in flight are written into the new record, so the latest record
//! of every live lease survives compaction. A lease ends with a per-offset
//! record (acked, failed) or the commit point passing it, all later in the
//! log than its batch record, so replaying in log order gives each offset
//! its latest state. (Ack logs of the first writers held one `Leased` record
//! per offset under the offset keys; a rebuild still reads them.)

use super::{
    Attempt, ConsumerSlot, Failure, FailureCause, Generation, QueuePartition, Route,
    MAX_ERROR_BYTES,
};

const VERSION: u8 = 1;
const KIND_PARTITION: u8 = 0;
const KIND_OFFSET: u8 = 1;
// Kinds 2 and 3 are the ordered queues' records (`queue::ordered`).
const KIND_LEASE_BATCH: u8 = 4;

const TAG_LEASED: u8 = 1;
const TAG_ACKED: u8 = 2;
const TAG_FAILED: u8 = 3;
const TAG_COMMIT_ADVANCED: u8 = 4;
const TAG_LEASED_BATCH: u8 = 5;
const TAG_ACKED_RUN: u8 = 6;

/// The number of lease-batch slots per partition (at most 65,536). A
/// compacted ack log holds at most this many batch records per partition.
pub const LEASE_BATCH_RING: u32 = 4096;

/// Consecutive offsets leased alike, in a `LeasedBatch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeasedRun {
    pub start: i64,
    pub len: u32,
    pub expiry_ms: i64,
    pub consumer: ConsumerSlot,
    pub attempt: Attempt,
}

impl LeasedRun {
    pub fn offsets(&self) -> std::ops::Range<i64> {
        self.start..self.start + i64::from(self.len)
    }
}

/// A state change of one partition's leases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseEvent {
    /// One offset leased (read from ack logs of the first writers only).
    Leased {
        offset: i64,
        generation: Generation,
        expiry_ms: i64,
        consumer: ConsumerSlot,
        attempt: Attempt,
    },
    /// The leases of one `lease` call, and the live ones the slot's
    /// previous record held, in offset order.
    LeasedBatch {
        /// The writer's number of slots (part of the key, as the offset ring).
        ring: u32,
        slot: u16,
        generation: Generation,
        runs: Vec<LeasedRun>,
    },
    /// Acked above the commit point.
    Acked { offset: i64 },
    /// `[start, end)` acked above the commit point (one ack request's
    /// consecutive offsets). Keyed by the slot of its last offset: no later
    /// record is ever written for that offset, and `end - 1 + ring` enters
    /// the window only once the commit point has passed the whole run.
    AckedRun { start: i64, end: i64 },
    /// Failed and waiting for its copy to be routed.
    Failed(Failure),
    /// Everything below `offset` is done. `generation` is the writer's
    /// ownership generation: a new owner writes one at its rebuild, before
    /// it leases anything, and takes the next one after every generation it
    /// reads, so generations never repeat across owners. (Ack logs of the
    /// first version held the next per-lease counter value here; a rebuild
    /// reads both the same way.)
    CommitAdvanced { offset: i64, generation: Generation },
}

/// One ack-log record (the value is never a tombstone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckLogRecord {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EventDecodeError {
    #[error("ack-log record truncated or with trailing bytes")]
    Length,
    #[error("unknown ack-log record version {0}")]
    Version(u8),
    #[error("unknown ack-log key kind {0}")]
    Kind(u8),
    #[error("unknown ack-log event tag {0}")]
    Tag(u8),
    #[error("ack-log event of the wrong kind for its key")]
    KeyMismatch,
    #[error("error text is not UTF-8")]
    Utf8,
}

pub fn encode_record(partition: QueuePartition, ring: u32, event: &LeaseEvent) -> AckLogRecord {
    let mut key = Vec::with_capacity(14);
    key.push(VERSION);
    key.extend_from_slice(&partition.topic.to_be_bytes());
    key.extend_from_slice(&partition.partition.to_be_bytes());
    let mut value = Vec::with_capacity(32);
    let offset_key = |key: &mut Vec<u8>, offset: i64| {
        key.push(KIND_OFFSET);
        key.extend_from_slice(&ring.to_be_bytes());
        let slot = u32::try_from(offset.rem_euclid(i64::from(ring))).expect("below ring");
        key.extend_from_slice(&slot.to_be_bytes());
    };
    match event {
        LeaseEvent::Leased {
            offset,
            generation,
            expiry_ms,
            consumer,
            attempt,
        } => {
            offset_key(&mut key, *offset);
            value.push(TAG_LEASED);
            value.extend_from_slice(&offset.to_be_bytes());
            value.extend_from_slice(&generation.0.to_be_bytes());
            value.extend_from_slice(&expiry_ms.to_be_bytes());
            value.extend_from_slice(&consumer.0.to_be_bytes());
            value.extend_from_slice(&attempt.0.to_be_bytes());
        }
        LeaseEvent::Acked { offset } => {
            offset_key(&mut key, *offset);
            value.push(TAG_ACKED);
            value.extend_from_slice(&offset.to_be_bytes());
        }
        LeaseEvent::AckedRun { start, end } => {
            offset_key(&mut key, *end - 1);
            value.push(TAG_ACKED_RUN);
            value.extend_from_slice(&start.to_be_bytes());
            value.extend_from_slice(&end.to_be_bytes());
        }
        LeaseEvent::Failed(f) => {
            offset_key(&mut key, f.offset);
            value.push(TAG_FAILED);
            value.extend_from_slice(&f.offset.to_be_bytes());
            value.extend_from_slice(&f.attempt.0.to_be_bytes());
            value.extend_from_slice(&f.consumer.0.to_be_bytes());
            value.push(match f.cause {
                FailureCause::Expired => 0,
                FailureCause::Nacked => 1,
                FailureCause::Permanent => 2,
                FailureCause::GapCap => 3,
            });
            match f.route {
                Route::Dlq => value.push(0xff),
                Route::RetryTier { tier, due_ms } => {
                    value.push(u8::try_from(tier).expect("fewer than 255 retry tiers"));
                    value.extend_from_slice(&due_ms.to_be_bytes());
                }
            }
            value.extend_from_slice(&f.at_ms.to_be_bytes());
            let error = &f.error.as_bytes()[..f.error.len().min(MAX_ERROR_BYTES)];
            value.extend_from_slice(&(error.len() as u16).to_be_bytes());
            value.extend_from_slice(error);
        }
        LeaseEvent::LeasedBatch {
            ring,
            slot,
            generation,
            runs,
        } => {
            key.push(KIND_LEASE_BATCH);
            key.extend_from_slice(&ring.to_be_bytes());
            key.extend_from_slice(&u32::from(*slot).to_be_bytes());
            value.reserve(9 + runs.len() * 26);
            value.push(TAG_LEASED_BATCH);
            value.extend_from_slice(&generation.0.to_be_bytes());
            value.extend_from_slice(&(runs.len() as u32).to_be_bytes());
            for run in runs {
                value.extend_from_slice(&run.start.to_be_bytes());
                value.extend_from_slice(&run.len.to_be_bytes());
                value.extend_from_slice(&run.expiry_ms.to_be_bytes());
                value.extend_from_slice(&run.consumer.0.to_be_bytes());
                value.extend_from_slice(&run.attempt.0.to_be_bytes());
            }
        }
        LeaseEvent::CommitAdvanced { offset, generation } => {
            key.push(KIND_PARTITION);
            value.push(TAG_COMMIT_ADVANCED);
            value.extend_from_slice(&offset.to_be_bytes());
            value.extend_from_slice(&generation.0.to_be_bytes());
        }
    }
    AckLogRecord { key, value }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], EventDecodeError> {
        if self.0.len() < n {
            return Err(EventDecodeError::Length);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, EventDecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, EventDecodeError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, EventDecodeError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn i32(&mut self) -> Result<i32, EventDecodeError> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn i64(&mut self) -> Result<i64, EventDecodeError> {
        Ok(i64::from_be_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn end(&self) -> Result<(), EventDecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(EventDecodeError::Length)
        }
    }
}

/// Decodes a record into (partition, event). Checks that the key and the
/// value agree (the slot is the offset's), so a record written under another
/// key is refused rather than applied to the wrong offset.
pub fn decode_record(
    key: &[u8],
    value: &[u8],
) -> Result<(QueuePartition, LeaseEvent), EventDecodeError> {
    let mut k = Reader(key);
    let version = k.u8()?;
    if version != VERSION {
        return Err(EventDecodeError::Version(version));
    }
    let partition = QueuePartition {
        topic: k.u16()?,
        partition: k.i32()?,
    };
    let kind = k.u8()?;
    let mut batch_slot = None;
    let slot = match kind {
        KIND_PARTITION => None,
        KIND_OFFSET => {
            let ring = k.u32()?;
            let slot = k.u32()?;
            if ring == 0 || slot >= ring {
                return Err(EventDecodeError::KeyMismatch);
            }
            Some((ring, slot))
        }
        KIND_LEASE_BATCH => {
            let ring = k.u32()?;
            let slot = k.u32()?;
            if slot >= ring {
                return Err(EventDecodeError::KeyMismatch);
            }
            batch_slot = Some((
                ring,
                u16::try_from(slot).map_err(|_| EventDecodeError::KeyMismatch)?,
            ));
            None
        }
        other => return Err(EventDecodeError::Kind(other)),
    };
    k.end()?;
    let mut v = Reader(value);
    let tag = v.u8()?;
    let event = match tag {
        TAG_LEASED => LeaseEvent::Leased {
            offset: v.i64()?,
            generation: Generation(v.u32()?),
            expiry_ms: v.i64()?,
            consumer: ConsumerSlot(v.u32()?),
            attempt: Attempt(v.u16()?),
        },
        TAG_ACKED => LeaseEvent::Acked { offset: v.i64()? },
        TAG_ACKED_RUN => {
            let (start, end) = (v.i64()?, v.i64()?);
            if start >= end {
                return Err(EventDecodeError::Length);
            }
            LeaseEvent::AckedRun { start, end }
        }
        TAG_FAILED => {
            let offset = v.i64()?;
            let attempt = Attempt(v.u16()?);
            let consumer = ConsumerSlot(v.u32()?);
            let cause = match v.u8()? {
                0 => FailureCause::Expired,
                1 => FailureCause::Nacked,
                2 => FailureCause::Permanent,
                3 => FailureCause::GapCap,
                _ => return Err(EventDecodeError::Tag(tag)),
            };
            let route = match v.u8()? {
                0xff => Route::Dlq,
                tier => Route::RetryTier {
                    tier: usize::from(tier),
                    due_ms: v.i64()?,
                },
            };
            let at_ms = v.i64()?;
            let len = usize::from(v.u16()?);
            let error = std::str::from_utf8(v.take(len)?)
                .map_err(|_| EventDecodeError::Utf8)?
                .to_owned();
            LeaseEvent::Failed(Failure {
                offset,
                attempt,
                consumer,
                cause,
                route,
                at_ms,
                error,
            })
        }
        TAG_COMMIT_ADVANCED => LeaseEvent::CommitAdvanced {
            offset: v.i64()?,
            generation: Generation(v.u32()?),
        },
        TAG_LEASED_BATCH => {
            let (ring, slot) = batch_slot.ok_or(EventDecodeError::KeyMismatch)?;
            let generation = Generation(v.u32()?);
            let n = v.u32()? as usize;
            // Each run is 26 bytes: a count the value cannot hold is damage.
            if n > v.0.len() / 26 {
                return Err(EventDecodeError::Length);
            }
            let mut runs = Vec::with_capacity(n);
            for _ in 0..n {
                runs.push(LeasedRun {
                    start: v.i64()?,
                    len: v.u32()?,
                    expiry_ms: v.i64()?,
                    consumer: ConsumerSlot(v.u32()?),
                    attempt: Attempt(v.u16()?),
                });
            }
            LeaseEvent::LeasedBatch {
                ring,
                slot,
                generation,
                runs,
            }
        }
        other => return Err(EventDecodeError::Tag(other)),
    };
    if batch_slot.is_some() != matches!(event, LeaseEvent::LeasedBatch { .. }) {
        return Err(EventDecodeError::KeyMismatch);
    }
    v.end()?;
    let offset = match &event {
        LeaseEvent::Leased { offset, .. } | LeaseEvent::Acked { offset } => Some(*offset),
        LeaseEvent::AckedRun { end, .. } => Some(*end - 1),
        LeaseEvent::Failed(f) => Some(f.offset),
        LeaseEvent::CommitAdvanced { .. } | LeaseEvent::LeasedBatch { .. } => None,
    };
    match (slot, offset) {
        (None, None) => {}
        (Some((ring, slot)), Some(offset))
            if offset.rem_euclid(i64::from(ring)) == i64::from(slot) => {}
        _ => return Err(EventDecodeError::KeyMismatch),
    }
    Ok((partition, event))
}

#[cfg(test)]
mod tests {
    use super::*;

    const P4: QueuePartition = QueuePartition {
        topic: 1,
        partition: 4,
    };
    const P5: QueuePartition = QueuePartition {
        topic: 1,
        partition: 5,
    };
    const T4: QueuePartition = QueuePartition {
        topic: 2,
        partition: 4,
    };

    fn samples() -> Vec<LeaseEvent> {
        vec![
            LeaseEvent::Leased {
                offset: 123_456,
                generation: Generation(u32::MAX),
                expiry_ms: 1_700_000_000_000,
                consumer: ConsumerSlot(9),
                attempt: Attempt(3),
            },
            LeaseEvent::Acked { offset: 7 },
            LeaseEvent::Failed(Failure {
                offset: 99,
                attempt: Attempt(2),
                consumer: ConsumerSlot(3),
                cause: FailureCause::Nacked,
                route: Route::RetryTier {
                    tier: 1,
                    due_ms: 5_000,
                },
                at_ms: 4_000,
                error: "db timeout: é".into(),
            }),
            LeaseEvent::Failed(Failure {
                offset: 100,
                attempt: Attempt(5),
                consumer: ConsumerSlot(0),
                cause: FailureCause::Permanent,
                route: Route::Dlq,
                at_ms: 4_000,
                error: String::new(),
            }),
            LeaseEvent::CommitAdvanced {
                offset: 50,
                generation: Generation(17),
            },
            LeaseEvent::LeasedBatch {
                ring: LEASE_BATCH_RING,
                slot: 4095,
                generation: Generation(3),
                runs: vec![
                    LeasedRun {
                        start: 10,
                        len: 90,
                        expiry_ms: 1_700_000_000_000,
                        consumer: ConsumerSlot(2),
                        attempt: Attempt(1),
                    },
                    LeasedRun {
                        start: 200,
                        len: 1,
                        expiry_ms: 1_700_000_060_000,
                        consumer: ConsumerSlot(7),
                        attempt: Attempt(4),
                    },
                ],
            },
            LeaseEvent::AckedRun { start: 8, end: 20 },
        ]
    }

    #[test]
    fn events_round_trip_and_keys_share_slots_across_the_ring() {
        for event in samples() {
            let r = encode_record(P4, 100_000, &event);
            assert_eq!(decode_record(&r.key, &r.value), Ok((P4, event)));
        }
        let a = encode_record(P4, 10, &LeaseEvent::Acked { offset: 3 });
        let b = encode_record(P4, 10, &LeaseEvent::Acked { offset: 13 });
        let c = encode_record(P4, 10, &LeaseEvent::Acked { offset: 14 });
        assert_eq!(a.key, b.key);
        assert_ne!(a.key, c.key);
        let p = encode_record(P4, 10, &samples()[4]);
        assert_ne!(p.key, a.key);
        assert_ne!(encode_record(P5, 10, &samples()[4]).key, p.key);
        assert_ne!(encode_record(T4, 10, &samples()[4]).key, p.key);
        assert_ne!(
            encode_record(T4, 10, &LeaseEvent::Acked { offset: 3 }).key,
            a.key
        );
    }

    #[test]
    fn damaged_records_are_refused() {
        let r = encode_record(P4, 10, &LeaseEvent::Acked { offset: 3 });
        assert_eq!(
            decode_record(&r.key, &r.value[..5]),
            Err(EventDecodeError::Length)
        );
        // A run is keyed by its last offset's slot.
        let run = encode_record(P4, 10, &samples()[6]);
        assert_eq!(
            run.key,
            encode_record(P4, 10, &LeaseEvent::Acked { offset: 19 }).key
        );
        let empty = encode_record(P4, 10, &LeaseEvent::AckedRun { start: 9, end: 9 });
        assert_eq!(
            decode_record(&run.key, &empty.value),
            Err(EventDecodeError::Length)
        );
        let mut long = r.value.clone();
        long.push(0);
        assert_eq!(decode_record(&r.key, &long), Err(EventDecodeError::Length));
        // A value moved under another offset's key.
        let other = encode_record(P4, 10, &LeaseEvent::Acked { offset: 4 });
        assert_eq!(
            decode_record(&other.key, &r.value),
            Err(EventDecodeError::KeyMismatch)
        );
        // A per-offset value under the partition key.
        let p = encode_record(P4, 10, &samples()[4]);
        assert_eq!(
            decode_record(&p.key, &r.value),
            Err(EventDecodeError::KeyMismatch)
        );
        let mut bad = r.key.clone();
        bad[0] = 9;
        assert_eq!(
            decode_record(&bad, &r.value),
            Err(EventDecodeError::Version(9))
        );
        assert_eq!(decode_record(&r.key, &[42]), Err(EventDecodeError::Tag(42)));
        // A lease batch under an offset key, an offset record under a
        // batch key, and a batch whose run count is more than it holds.
        let batch = encode_record(P4, 10, &samples()[5]);
        assert_eq!(
            decode_record(&r.key, &batch.value),
            Err(EventDecodeError::KeyMismatch)
        );
        assert_eq!(
            decode_record(&batch.key, &r.value),
            Err(EventDecodeError::KeyMismatch)
        );
        let mut short = batch.value.clone();
        short.truncate(short.len() - 26);
        assert_eq!(
            decode_record(&batch.key, &short),
            Err(EventDecodeError::Length)
        );
    }
}
