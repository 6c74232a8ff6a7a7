//! Idempotent and transactional producer state for one partition, with
//! Kafka's rules (`ProducerStateManager` / `ProducerAppendInfo`): per
//! producer id, its epoch, the metadata of its last five batches, the first
//! offset of its ongoing transaction and the coordinator epoch of its last
//! marker; for the partition, the ongoing transactions by first offset, the
//! completed ones whose marker the high watermark has not passed yet (both
//! hold the last stable offset back), and the aborted transactions that
//! read_committed fetches name.
//!
//! Pure logic: no I/O except the snapshot helpers at the bottom, which the
//! partition calls. `now_ms` is an argument.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::path::Path;

use protocol::record_batch::RecordBatchView;
use protocol::records::{Part, RecordReader, RecordVisitor};
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerStateEntry {
    pub producer_epoch: i16,
    pub batches: VecDeque<BatchMetadata>,
    pub last_timestamp_ms: i64,
    /// The coordinator epoch of the last marker written for this producer
    /// (-1 before any): a marker from an older coordinator is fenced.
    #[serde(default = "no_coordinator_epoch")]
    pub coordinator_epoch: i32,
    /// Kafka's `currentTxnFirstOffset`: where this producer's ongoing
    /// transaction starts in this partition.
    #[serde(default)]
    pub current_txn_first_offset: Option<Offset>,
}

fn no_coordinator_epoch() -> i32 {
    -1
}

impl Default for ProducerStateEntry {
    fn default() -> Self {
        ProducerStateEntry {
            producer_epoch: NO_PRODUCER_EPOCH,
            batches: VecDeque::new(),
            last_timestamp_ms: -1,
            coordinator_epoch: no_coordinator_epoch(),
            current_txn_first_offset: None,
        }
    }
}

impl ProducerStateEntry {
    /// The last sequence appended, -1 when none is remembered.
    pub fn last_seq(&self) -> i32 {
        self.batches.back().map_or(NO_SEQUENCE, |b| b.last_seq)
    }

    /// A new epoch forgets the old epoch's batches (Kafka's
    /// `maybeUpdateProducerEpoch`).
    fn set_epoch(&mut self, epoch: i16) {
        if self.producer_epoch != epoch {
            self.producer_epoch = epoch;
            self.batches.clear();
        }
    }
}

/// A transaction ended by an abort marker: read_committed consumers drop
/// its producer's records from `first_offset` to the marker at `last_offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: Offset,
    pub last_offset: Offset,
    /// The first unstable offset once this transaction ended (Kafka's
    /// `AbortedTxn.lastStableOffset`): every transaction aborted later
    /// started at or after it, which ends a search early.
    pub last_stable_offset: Offset,
}

/// A completed transaction whose marker is not yet below the high watermark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct CompletedTxn {
    producer_id: i64,
    last_offset: Offset,
}

/// An end-transaction marker, as the control record of a control batch
/// holds it (Kafka's `EndTransactionMarker`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnMarker {
    pub commit: bool,
    pub coordinator_epoch: i32,
}

impl TxnMarker {
    /// The control record's key: version 0, then the type (0 abort, 1 commit).
    pub fn key(&self) -> [u8; 4] {
        let mut k = [0u8; 4];
        k[2..].copy_from_slice(&i16::from(self.commit).to_be_bytes());
        k
    }

    /// The control record's value: version 0, then the coordinator epoch.
    pub fn value(&self) -> [u8; 6] {
        let mut v = [0u8; 6];
        v[2..].copy_from_slice(&self.coordinator_epoch.to_be_bytes());
        v
    }

    /// The marker in a control batch; `None` when the batch holds no
    /// end-transaction marker (an empty control batch, another control type,
    /// or records that do not read).
    pub fn of_batch(batch: &RecordBatchView<'_>) -> Option<TxnMarker> {
        #[derive(Default)]
        struct Fields {
            key: Vec<u8>,
            value: Vec<u8>,
        }
        impl RecordVisitor for Fields {
            fn wants(&self, part: Part) -> bool {
                matches!(part, Part::Key | Part::Value)
            }
            fn bytes(&mut self, part: Part, piece: &[u8]) {
                // A marker's key and value are a few bytes; more is not one.
                let field = if part == Part::Key {
                    &mut self.key
                } else {
                    &mut self.value
                };
                if field.len() + piece.len() <= 16 {
                    field.extend_from_slice(piece);
                }
            }
        }
        if !batch.is_control() {
            return None;
        }
        let mut reader = RecordReader::new(batch).ok()?;
        let mut fields = Fields::default();
        reader.next_record(&mut fields).ok()??;
        let (key, value) = (&fields.key, &fields.value);
        if key.len() < 4 || value.len() < 6 {
            return None;
        }
        let kind = i16::from_be_bytes([key[2], key[3]]);
        if !(0..=1).contains(&kind) {
            return None;
        }
        Some(TxnMarker {
            commit: kind == 1,
            coordinator_epoch: i32::from_be_bytes([value[2], value[3], value[4], value[5]]),
        })
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
    /// A non-transactional batch from a producer whose transaction is open.
    #[error("expected a transactional write from producer {producer_id}")]
    InvalidTxnState { producer_id: ProducerId },
    /// A marker from a transaction coordinator older than the last one seen.
    #[error("producer {producer_id}: coordinator epoch {epoch} is older than {current}")]
    CoordinatorFenced {
        producer_id: ProducerId,
        epoch: i32,
        current: i32,
    },
}

/// All producers' state for one partition.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerStateManager {
    producers: BTreeMap<i64, ProducerStateEntry>,
    /// Ongoing transactions: first offset to producer id. Derived from the
    /// entries' `current_txn_first_offset` (rebuilt when a snapshot is read).
    #[serde(skip)]
    ongoing: BTreeMap<i64, i64>,
    /// Completed transactions by first offset, until the high watermark
    /// passes their marker (Kafka's `unreplicatedTxns`).
    #[serde(default)]
    unreplicated: BTreeMap<i64, CompletedTxn>,
    /// Aborted transactions in marker (last offset) order, from the log start.
    #[serde(default)]
    aborted: VecDeque<AbortedTxn>,
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
        if entry.current_txn_first_offset.is_some() && !batch.is_transactional() {
            return Err(ProducerError::InvalidTxnState {
                producer_id: ProducerId(pid),
            });
        }
        Ok(ProducerCheck::Append)
    }

    /// Kafka's `appendEndTxnMarker` checks for a marker the leader is about
    /// to write: an older producer epoch is refused, and so is an older
    /// coordinator epoch (a zombie coordinator). A marker for a producer
    /// with no transaction open here is still written, as Kafka does.
    pub fn check_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        coordinator_epoch: i32,
    ) -> Result<(), ProducerError> {
        let Some(entry) = self.producers.get(&producer_id) else {
            return Ok(());
        };
        if producer_epoch < entry.producer_epoch {
            return Err(ProducerError::InvalidProducerEpoch {
                producer_id: ProducerId(producer_id),
                epoch: ProducerEpoch(producer_epoch),
                current: ProducerEpoch(entry.producer_epoch),
            });
        }
        if coordinator_epoch < entry.coordinator_epoch {
            return Err(ProducerError::CoordinatorFenced {
                producer_id: ProducerId(producer_id),
                epoch: coordinator_epoch,
                current: entry.coordinator_epoch,
            });
        }
        Ok(())
    }

    /// Records a batch that is now in the log (leader append, or replay of
    /// the log at start-up). `batch` carries its assigned offsets.
    /// Control batches end the producer's transaction; a transactional
    /// data batch starts one if none is open.
    pub fn update(&mut self, batch: &RecordBatchView<'_>) {
        let pid = batch.producer_id();
        if pid < 0 {
            return;
        }
        if batch.is_control() {
            // An empty (or unreadable) control batch ends nothing, as in Kafka.
            if let Some(marker) = TxnMarker::of_batch(batch) {
                self.end_txn(pid, batch, marker);
            }
            return;
        }
        let entry = self.producers.entry(pid).or_default();
        entry.set_epoch(batch.producer_epoch());
        if batch.is_transactional() && entry.current_txn_first_offset.is_none() {
            entry.current_txn_first_offset = Some(Offset(batch.base_offset()));
            self.ongoing.insert(batch.base_offset(), pid);
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

    /// A marker (stored at the batch's offset) ends `pid`'s transaction: it
    /// waits among the completed ones for the high watermark, and an abort
    /// is remembered for read_committed fetches.
    fn end_txn(&mut self, pid: i64, batch: &RecordBatchView<'_>, marker: TxnMarker) {
        let offset = Offset(batch.base_offset());
        let entry = self.producers.entry(pid).or_default();
        let started = entry.current_txn_first_offset.take();
        entry.set_epoch(batch.producer_epoch());
        entry.coordinator_epoch = marker.coordinator_epoch;
        entry.last_timestamp_ms = batch.max_timestamp();
        let Some(first) = started else {
            // A marker without data changes neither the LSO nor the index.
            return;
        };
        self.ongoing.remove(&first.0);
        self.unreplicated.insert(
            first.0,
            CompletedTxn {
                producer_id: pid,
                last_offset: offset,
            },
        );
        if !marker.commit {
            let last_stable_offset = self
                .ongoing
                .keys()
                .next()
                .map_or(offset.next(), |&o| Offset(o));
            self.aborted.push_back(AbortedTxn {
                producer_id: pid,
                first_offset: first,
                last_offset: offset,
                last_stable_offset,
            });
        }
    }

    /// Kafka's `firstUnstableOffset`: the first offset of the earliest
    /// transaction that is ongoing, or completed with its marker at or
    /// above `high_watermark`.
    pub fn first_unstable_offset(&self, high_watermark: Offset) -> Option<Offset> {
        let ongoing = self.ongoing.keys().next().copied();
        let unreplicated = self
            .unreplicated
            .iter()
            .find(|(_, t)| t.last_offset >= high_watermark)
            .map(|(&first, _)| first);
        match (ongoing, unreplicated) {
            (Some(a), Some(b)) => Some(Offset(a.min(b))),
            (a, b) => a.or(b).map(Offset),
        }
    }

    /// The high watermark passed these markers: their transactions no
    /// longer hold the last stable offset back.
    pub fn on_high_watermark(&mut self, high_watermark: Offset) {
        self.unreplicated
            .retain(|_, t| t.last_offset >= high_watermark);
    }

    /// The log start moved to `log_start`: transactions that ended before
    /// it are gone from the log, and from the aborted list.
    pub fn on_log_start(&mut self, log_start: Offset) {
        self.on_high_watermark(log_start);
        while self
            .aborted
            .front()
            .is_some_and(|a| a.last_offset < log_start)
        {
            self.aborted.pop_front();
        }
    }

    /// Kafka's `collectAbortedTxns`: the aborted transactions overlapping
    /// `[fetch_offset, upper_bound)`, in marker order.
    pub fn aborted_between(&self, fetch_offset: Offset, upper_bound: Offset) -> Vec<AbortedTxn> {
        let from = self
            .aborted
            .partition_point(|a| a.last_offset < fetch_offset);
        let mut out = Vec::new();
        for a in self.aborted.range(from..) {
            if a.first_offset < upper_bound {
                out.push(*a);
            }
            if a.last_stable_offset >= upper_bound {
                break;
            }
        }
        out
    }

    /// Every producer's state (DescribeProducers).
    pub fn producers(&self) -> impl Iterator<Item = (ProducerId, &ProducerStateEntry)> {
        self.producers.iter().map(|(&id, e)| (ProducerId(id), e))
    }

    /// Forgets producers idle for longer than `producer.id.expiration.ms`,
    /// so the table cannot grow without bound. A producer with an open
    /// transaction is kept, as in Kafka: its transaction holds the LSO.
    pub fn expire(&mut self, now_ms: i64, expiration_ms: i64) {
        self.producers.retain(|_, e| {
            e.current_txn_first_offset.is_some()
                || now_ms.saturating_sub(e.last_timestamp_ms) < expiration_ms
        });
    }

    /// Drops all state (log truncation): the state is rebuilt by the caller
    /// from the log when that happens.
    pub fn clear(&mut self) {
        *self = ProducerStateManager::default();
    }

    /// Rebuilds the ongoing-transaction index from the entries, and checks
    /// what a snapshot file said: `false` when it cannot be the state of a
    /// log (two transactions at one offset, an aborted list out of order).
    fn reindex(&mut self) -> bool {
        self.ongoing.clear();
        for (&pid, e) in &self.producers {
            if let Some(first) = e.current_txn_first_offset {
                if self.ongoing.insert(first.0, pid).is_some() {
                    return false;
                }
            }
        }
        let ordered = self
            .aborted
            .iter()
            .zip(self.aborted.iter().skip(1))
            .all(|(a, b)| a.last_offset < b.last_offset);
        ordered && self.aborted.iter().all(|a| a.first_offset <= a.last_offset)
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
    let mut snapshot: ProducerSnapshot = serde_json::from_slice(&data).ok()?;
    snapshot.state.reindex().then_some(snapshot)
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

    /// `batch` marked transactional (attribute bit 4), at `base_offset`.
    fn txn_batch(pid: i64, seq: i32, count: i32, base_offset: i64) -> Vec<u8> {
        let mut b = batch(pid, 0, seq, count, base_offset);
        b[22] |= 0x10;
        b
    }

    /// An end-transaction marker for `pid` (epoch 0) at `offset`.
    fn marker(pid: i64, commit: bool, coordinator_epoch: i32, offset: i64) -> Vec<u8> {
        let m = TxnMarker {
            commit,
            coordinator_epoch,
        };
        let mut b = crate::partition::txn::marker_batch(pid, 0, m, 5_000)
            .unwrap()
            .to_vec();
        rewrite::set_base_offset(&mut b, offset);
        b
    }

    #[test]
    fn markers_read_back_from_their_control_batch() {
        let b = marker(3, false, 9, 0);
        assert_eq!(
            TxnMarker::of_batch(&view(&b)),
            Some(TxnMarker {
                commit: false,
                coordinator_epoch: 9
            })
        );
        assert_eq!(TxnMarker::of_batch(&view(&txn_batch(3, 0, 1, 0))), None);
    }

    #[test]
    fn the_aborted_search_stops_where_later_transactions_cannot_reach() {
        let mut s = ProducerStateManager::default();
        // 1 runs 0..=4 (aborted at 4), 2 runs 1..=2 (aborted at 3, while 1 is
        // open: its LSO is 0), 3 runs 5..=6 (aborted at 6).
        s.update(&view(&txn_batch(1, 0, 1, 0)));
        s.update(&view(&txn_batch(2, 0, 2, 1)));
        s.update(&view(&marker(2, false, 0, 3)));
        s.update(&view(&marker(1, false, 0, 4)));
        s.update(&view(&txn_batch(3, 0, 1, 5)));
        s.update(&view(&marker(3, false, 0, 6)));
        let pids = |from, to| -> Vec<i64> {
            s.aborted_between(Offset(from), Offset(to))
                .iter()
                .map(|a| a.producer_id)
                .collect()
        };
        assert_eq!(pids(0, 7), vec![2, 1, 3]);
        assert_eq!(pids(4, 5), vec![1]);
        assert_eq!(pids(0, 1), vec![1]);
        assert_eq!(pids(5, 7), vec![3]);
        assert_eq!(pids(7, 9), Vec::<i64>::new());
        assert_eq!(s.first_unstable_offset(Offset(7)), None);
        assert_eq!(s.first_unstable_offset(Offset(4)), Some(Offset(0)));
    }

    #[test]
    fn a_producer_with_an_open_transaction_does_not_expire() {
        let mut s = ProducerStateManager::default();
        s.update(&view(&txn_batch(1, 0, 1, 0)));
        s.update(&view(&batch(2, 0, 0, 1, 1)));
        s.expire(i64::MAX, 1_000);
        assert!(s.entry(ProducerId(1)).is_some());
        assert!(s.entry(ProducerId(2)).is_none());
        assert_eq!(s.first_unstable_offset(Offset(5)), Some(Offset(0)));
    }

    #[test]
    fn a_snapshot_keeps_transactions_and_one_that_cannot_be_a_log_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = ProducerStateManager::default();
        s.update(&view(&txn_batch(1, 0, 1, 0)));
        s.update(&view(&marker(1, false, 4, 1)));
        s.update(&view(&txn_batch(2, 0, 1, 2)));
        let snapshot = ProducerSnapshot {
            offset: Offset(3),
            state: s.clone(),
        };
        write_snapshot(dir.path(), &snapshot).unwrap();
        let back = read_snapshot(dir.path()).unwrap().state;
        assert_eq!(back, s);
        assert_eq!(back.first_unstable_offset(Offset(3)), Some(Offset(2)));
        // Two aborted transactions out of marker order.
        let mut bad = s.clone();
        let a = bad.aborted[0];
        bad.aborted.push_back(a);
        let snapshot = ProducerSnapshot {
            offset: Offset(3),
            state: bad,
        };
        write_snapshot(dir.path(), &snapshot).unwrap();
        assert!(read_snapshot(dir.path()).is_none());
    }
}
