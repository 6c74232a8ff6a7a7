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

use super::{
    Attempt, ConsumerSlot, Failure, FailureCause, Generation, QueuePartition, Route,
    MAX_ERROR_BYTES,
};

const VERSION: u8 = 1;
const KIND_PARTITION: u8 = 0;
const KIND_OFFSET: u8 = 1;

const TAG_LEASED: u8 = 1;
const TAG_ACKED: u8 = 2;
const TAG_FAILED: u8 = 3;
const TAG_COMMIT_ADVANCED: u8 = 4;

/// A state change of one partition's leases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseEvent {
    Leased {
        offset: i64,
        generation: Generation,
        expiry_ms: i64,
        consumer: ConsumerSlot,
        attempt: Attempt,
    },
    /// Acked above the commit point.
    Acked { offset: i64 },
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
        other => return Err(EventDecodeError::Tag(other)),
    };
    v.end()?;
    let offset = match &event {
        LeaseEvent::Leased { offset, .. } | LeaseEvent::Acked { offset } => Some(*offset),
        LeaseEvent::Failed(f) => Some(f.offset),
        LeaseEvent::CommitAdvanced { .. } => None,
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
    }
}
