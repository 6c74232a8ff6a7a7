//! Idempotent-producer state for one partition, with Kafka's rules
//! (`ProducerStateManager` / `ProducerAppendInfo`): per producer id, its
//! epoch and the metadata of its last five batches.
//!
//! Pure logic: no I/O except the snapshot helpers at the bottom, which the
//! partition calls. `now_ms` is an argument.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::path::Path;

use protocol::record_batch::RecordBatchView;
use serde::{Deserialize, Serialize};

use crate::types::{Offset, ProducerEpoch, ProducerId};

/// How many batches per producer Kafka remembers for duplicate detection;
/// it is also the most in-flight requests an idempotent producer may have.
pub const NUM_BATCHES_TO_RETAIN: usize = 5;
const NO_PRODUCER_EPOCH: i16 = -1;
const NO_SEQUENCE: i32 = -1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchMetadata {
    pub first_seq: i32,
    pub last_seq: i32,
    pub first_offset: Offset,
    pub last_offset: Offset,
    pub timestamp_ms: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerStateEntry {
    pub producer_epoch: i16,
    pub batches: VecDeque<BatchMetadata>,
    pub last_timestamp_ms: i64,
}

impl ProducerStateEntry {
    fn last_seq(&self) -> i32 {
        self.batches.back().map_or(NO_SEQUENCE, |b| b.last_seq)
    }
}

/// The outcome of checking a batch against the producer state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProducerCheck {
    /// Not an idempotent batch, or the next in sequence: append it.
    Append,
    /// The same batch was already appended: answer with its offsets.
    Duplicate(BatchMetadata),
}

/// A batch the producer state rejects. Mapped to Kafka's codes by the caller.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProducerError {
    #[error("producer {producer_id} epoch {epoch} is older than the current epoch {current}")]
    InvalidProducerEpoch {
        producer_id: ProducerId,
        epoch: ProducerEpoch,
        current: ProducerEpoch,
    },
    #[error("producer {producer_id}: expected sequence after {last_seq}, got {first_seq}")]
    OutOfOrderSequence {
        producer_id: ProducerId,
        first_seq: i32,
        last_seq: i32,
    },
}

/// All producers' state for one partition.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerStateManager {
    producers: BTreeMap<i64, ProducerStateEntry>,
}

fn in_sequence(last_seq: i32, next_seq: i32) -> bool {
    next_seq == last_seq.wrapping_add(1) || (next_seq == 0 && last_seq == i32::MAX)
}

impl ProducerStateManager {
    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    pub fn entry(&self, producer_id: ProducerId) -> Option<&ProducerStateEntry> {
        self.producers.get(&producer_id.0)
    }

    /// Checks a client batch before it is appended, as the leader does.
    pub fn check(&self, batch: &RecordBatchView<'_>) -> Result<ProducerCheck, ProducerError> {
        let pid = batch.producer_id();
        if pid < 0 {
            return Ok(ProducerCheck::Append);
        }
        let epoch = batch.producer_epoch();
        let first_seq = batch.base_sequence();
        let last_seq = batch.last_sequence();
        let Some(entry) = self.producers.get(&pid) else {
            // An unknown producer (new, or its state expired or was removed
            // with the records) may start at any sequence, as in Kafka.
            return Ok(ProducerCheck::Append);
        };
        if epoch < entry.producer_epoch {
            return Err(ProducerError::InvalidProducerEpoch {
                producer_id: ProducerId(pid),
                epoch: ProducerEpoch(epoch),
                current: ProducerEpoch(entry.producer_epoch),
            });
        }
        if epoch == entry.producer_epoch {
            if let Some(dup) = entry
                .batches
                .iter()
                .find(|b| b.first_seq == first_seq && b.last_seq == last_seq)
            {
                return Ok(ProducerCheck::Duplicate(*dup));
            }
            let current_last = entry.last_seq();
            if entry.producer_epoch != NO_PRODUCER_EPOCH && !in_sequence(current_last, first_seq) {
                return Err(ProducerError::OutOfOrderSequence {
                    producer_id: ProducerId(pid),
                    first_seq,
                    last_seq: current_last,
                });
            }
        } else if first_seq != 0 && entry.producer_epoch != NO_PRODUCER_EPOCH {
            // A bumped epoch must start its sequences again at zero.
            return Err(ProducerError::OutOfOrderSequence {
                producer_id: ProducerId(pid),
                first_seq,
                last_seq: NO_SEQUENCE,
            });
        }
        Ok(ProducerCheck::Append)
    }

    /// Records a batch that is now in the log (leader append, or replay of
    /// the log at start-up). `batch` carries its assigned offsets.
    pub fn update(&mut self, batch: &RecordBatchView<'_>) {
        let pid = batch.producer_id();
        if pid < 0 {
            return;
        }
        let entry = self.producers.entry(pid).or_default();
        if entry.producer_epoch != batch.producer_epoch() {
            entry.producer_epoch = batch.producer_epoch();
            entry.batches.clear();
        }
        entry.batches.push_back(BatchMetadata {
            first_seq: batch.base_sequence(),
            last_seq: batch.last_sequence(),
            first_offset: Offset(batch.base_offset()),
            last_offset: Offset(batch.last_offset()),
            timestamp_ms: batch.max_timestamp(),
        });
        while entry.batches.len() > NUM_BATCHES_TO_RETAIN {
            entry.batches.pop_front();
        }
        entry.last_timestamp_ms = batch.max_timestamp();
    }

    /// Forgets producers idle for longer than `producer.id.expiration.ms`,
    /// so the table cannot grow without bound.
    pub fn expire(&mut self, now_ms: i64, expiration_ms: i64) {
        self.producers
            .retain(|_, e| now_ms.saturating_sub(e.last_timestamp_ms) < expiration_ms);
    }

    /// Drops state for batches at or above `offset` (log truncation): the
    /// state is rebuilt by the caller from the log when that happens.
    pub fn clear(&mut self) {
        self.producers.clear();
    }
}

/// The on-disk snapshot: the state as of `offset` (the log end offset when
/// it was taken). Replaying the log from `offset` brings it up to date.
#[derive(Serialize, Deserialize)]
pub struct ProducerSnapshot {
    pub offset: Offset,
    pub state: ProducerStateManager,
}

pub const SNAPSHOT_FILE: &str = "producer-state.snapshot";

/// Writes the snapshot atomically: temp file, fsync, rename.
pub fn write_snapshot(dir: &Path, snapshot: &ProducerSnapshot) -> std::io::Result<()> {
    let tmp = dir.join(format!("{SNAPSHOT_FILE}.tmp"));
    let data = serde_json::to_vec(snapshot).map_err(std::io::Error::other)?;
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(SNAPSHOT_FILE))
}

/// Reads the snapshot if there is a readable one. A damaged snapshot is not
/// an error: the caller rebuilds from the log instead.
pub fn read_snapshot(dir: &Path) -> Option<ProducerSnapshot> {
    let data = std::fs::read(dir.join(SNAPSHOT_FILE)).ok()?;
    serde_json::from_slice(&data).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::record_batch::rewrite;

    /// A minimal valid header-only view is enough for the state logic; build
    /// a real batch so `RecordBatchView::parse` accepts it.
    fn batch(pid: i64, epoch: i16, seq: i32, count: i32, base_offset: i64) -> Vec<u8> {
        let mut b = vec![0u8; 61 + 7 * count as usize];
        let len = (b.len() - 12) as i32;
        b[8..12].copy_from_slice(&len.to_be_bytes());
        b[16] = 2;
        b[23..27].copy_from_slice(&(count - 1).to_be_bytes());
        b[43..51].copy_from_slice(&pid.to_be_bytes());
        b[51..53].copy_from_slice(&epoch.to_be_bytes());
        b[53..57].copy_from_slice(&seq.to_be_bytes());
        b[57..61].copy_from_slice(&count.to_be_bytes());
        rewrite::set_base_offset(&mut b, base_offset);
        b
    }

    fn view(b: &[u8]) -> RecordBatchView<'_> {
        RecordBatchView::parse(b).unwrap()
    }

    #[test]
    fn in_order_batches_append_and_duplicates_return_original_offsets() {
        let mut s = ProducerStateManager::default();
        let b1 = batch(7, 0, 0, 3, 0);
        assert_eq!(s.check(&view(&b1)), Ok(ProducerCheck::Append));
        s.update(&view(&b1));
        let b2 = batch(7, 0, 3, 2, 3);
        assert_eq!(s.check(&view(&b2)), Ok(ProducerCheck::Append));
        s.update(&view(&b2));
        // A retry of the first batch (any base offset on the wire) is a duplicate.
        let retry = batch(7, 0, 0, 3, 0);
        match s.check(&view(&retry)) {
            Ok(ProducerCheck::Duplicate(m)) => {
                assert_eq!((m.first_offset, m.last_offset), (Offset(0), Offset(2)))
            }
            other => panic!("expected duplicate, got {other:?}"),
        }
    }

    #[test]
    fn gaps_and_old_epochs_are_rejected() {
        let mut s = ProducerStateManager::default();
        s.update(&view(&batch(7, 1, 0, 1, 0)));
        assert!(matches!(
            s.check(&view(&batch(7, 1, 2, 1, 0))),
            Err(ProducerError::OutOfOrderSequence { .. })
        ));
        assert!(matches!(
            s.check(&view(&batch(7, 0, 1, 1, 0))),
            Err(ProducerError::InvalidProducerEpoch { .. })
        ));
        // A new epoch must start at zero ...
        assert!(matches!(
            s.check(&view(&batch(7, 2, 5, 1, 0))),
            Err(ProducerError::OutOfOrderSequence { .. })
        ));
        // ... and then resets the window.
        assert_eq!(
            s.check(&view(&batch(7, 2, 0, 1, 0))),
            Ok(ProducerCheck::Append)
        );
    }

    #[test]
    fn only_the_last_five_batches_are_remembered() {
        let mut s = ProducerStateManager::default();
        for i in 0..7 {
            s.update(&view(&batch(1, 0, i, 1, i as i64)));
        }
        assert_eq!(
            s.entry(ProducerId(1)).unwrap().batches.len(),
            NUM_BATCHES_TO_RETAIN
        );
        // Seq 0 fell out of the window: neither a duplicate nor in sequence.
        assert!(s.check(&view(&batch(1, 0, 0, 1, 0))).is_err());
        assert!(matches!(
            s.check(&view(&batch(1, 0, 3, 1, 0))),
            Ok(ProducerCheck::Duplicate(_))
        ));
    }

    #[test]
    fn sequence_wraps_at_i32_max() {
        let mut s = ProducerStateManager::default();
        s.update(&view(&batch(1, 0, i32::MAX - 1, 2, 0)));
        assert_eq!(s.entry(ProducerId(1)).unwrap().last_seq(), i32::MAX);
        assert_eq!(
            s.check(&view(&batch(1, 0, 0, 1, 2))),
            Ok(ProducerCheck::Append)
        );
        // A batch crossing the wrap has its last sequence wrapped too.
        let mut s = ProducerStateManager::default();
        s.update(&view(&batch(1, 0, i32::MAX, 3, 0)));
        assert_eq!(s.entry(ProducerId(1)).unwrap().last_seq(), 1);
    }

    #[test]
    fn unknown_producers_start_anywhere_and_idle_ones_expire() {
        let mut s = ProducerStateManager::default();
        assert_eq!(
            s.check(&view(&batch(9, 3, 42, 1, 0))),
            Ok(ProducerCheck::Append)
        );
        let mut b = batch(9, 3, 42, 1, 0);
        b[35..43].copy_from_slice(&1_000i64.to_be_bytes());
        s.update(&view(&b));
        s.expire(1_500, 1_000);
        assert_eq!(s.len(), 1);
        s.expire(2_000, 1_000);
        assert!(s.is_empty());
    }

    #[test]
    fn snapshot_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = ProducerStateManager::default();
        s.update(&view(&batch(5, 0, 0, 4, 10)));
        write_snapshot(
            dir.path(),
            &ProducerSnapshot {
                offset: Offset(14),
                state: s.clone(),
            },
        )
        .unwrap();
        let back = read_snapshot(dir.path()).unwrap();
        assert_eq!(back.offset, Offset(14));
        assert_eq!(back.state, s);
        std::fs::write(dir.path().join(SNAPSHOT_FILE), b"{garbage").unwrap();
        assert!(read_snapshot(dir.path()).is_none());
    }
}
