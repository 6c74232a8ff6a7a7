//! The follower side of a partition replica, after Kafka's
//! `UnifiedLog.appendAsFollower` / `truncateTo`: batches copied from the
//! leader are stored byte for byte (offsets, leader epochs and producer
//! fields as the leader wrote them), and the producer state and leader
//! epoch cache follow them exactly as they follow a leader's own appends, so
//! that a follower which becomes leader answers a retried idempotent batch
//! the old leader had stored as a duplicate.

use bytes::Bytes;
use protocol::record_batch::{BatchIter, BatchIterItem, RecordBatchView};

use super::epochs::LeaderEpochCache;
use super::producer_state::{self, ProducerStateManager};
use super::Partition;
use crate::error::PartitionError;
use crate::log::Log;
use crate::types::{LeaderEpoch, Offset};

/// The producer state of `log`: the snapshot on disk if it lies within the
/// log, then every batch after it replayed.
pub(super) fn rebuild_producer_state(log: &Log) -> Result<ProducerStateManager, PartitionError> {
    let (mut producers, from) = match producer_state::read_snapshot(log.dir()) {
        Some(s) if s.offset <= log.log_end_offset() && s.offset >= log.log_start_offset() => {
            (s.state, s.offset)
        }
        _ => (ProducerStateManager::default(), log.log_start_offset()),
    };
    for batch in log.batches_from(from) {
        let batch = batch?;
        if let Ok(view) = RecordBatchView::parse(&batch) {
            if view.last_offset() >= from.0 {
                producers.update(&view);
            }
        }
    }
    // Retention may have passed aborted transactions since the snapshot.
    producers.on_log_start(log.log_start_offset());
    Ok(producers)
}

/// The leader epoch cache of `log`, from the batch headers it walked.
pub(super) fn epoch_cache_of(log: &Log) -> LeaderEpochCache {
    let mut cache = LeaderEpochCache::from_batches(log.epoch_starts());
    cache.truncate_from_start(log.log_start_offset());
    cache
}

impl Partition {
    /// Appends the records of a leader's fetch response: one or more v2
    /// batches, each CRC-checked, the first starting at or above the log end
    /// offset (a compacted leader's log has gaps) and each above the one
    /// before. A partial batch at the end (the response's size limit cut it)
    /// is left for the next fetch. Nothing is appended unless every whole
    /// batch is valid. Returns the new log end offset.
    pub fn append_as_follower(
        &mut self,
        records: Bytes,
        now_ms: i64,
    ) -> Result<Offset, PartitionError> {
        let mut views = Vec::new();
        let leo = self.log.log_end_offset();
        let mut next_min = leo.0;
        // Kafka's exception to "never below the log end": an empty log that
        // starts inside the first batch (it started at the leader's log
        // start, which DeleteRecords can put mid-batch) restarts at the
        // batch's base offset so the batch can be stored whole.
        if let Some(BatchIterItem::Batch { batch, .. }) = BatchIter::new(&records).next() {
            if leo == self.log.log_start_offset()
                && batch.base_offset() < leo.0
                && batch.last_offset() >= leo.0
                && batch.base_offset() >= 0
            {
                self.truncate_fully_and_start_at(Offset(batch.base_offset()))?;
                next_min = batch.base_offset();
            }
        }
        for item in BatchIter::new(&records) {
            let view = match item {
                BatchIterItem::Batch { batch, .. } => batch,
                BatchIterItem::Partial { .. } => break,
                BatchIterItem::Invalid { error, .. } => {
                    return Err(PartitionError::CorruptMessage(error.to_string()))
                }
            };
            view.verify_crc()
                .map_err(|e| PartitionError::CorruptMessage(e.to_string()))?;
            if view.base_offset() < next_min {
                return Err(PartitionError::OffsetOutOfRange {
                    requested: view.base_offset(),
                    log_start: self.log.log_start_offset().0,
                    log_end: next_min,
                });
            }
            next_min = view.last_offset() + 1;
            views.push(view);
        }
        for view in views {
            let before = self.log.log_end_offset();
            let appended = self.log.append_replicated(view.as_bytes(), now_ms);
            // Stored even if a flush after it failed: the producer state
            // follows the log (see `append_as_leader`).
            if self.log.log_end_offset() > before {
                self.producers.update(&view);
                self.epochs.assign(
                    LeaderEpoch(view.partition_leader_epoch()),
                    Offset(view.base_offset()),
                );
            }
            appended?;
        }
        Ok(self.log.log_end_offset())
    }

    /// Removes every batch at or above `offset` (a batch straddling it goes
    /// whole), as Kafka's `truncateTo`: the epoch cache drops the epochs that
    /// started in the removed batches, the producer state is rebuilt from
    /// what remains (and snapshotted, so a stale snapshot cannot bring the
    /// removed producers back on restart), and the high watermark comes down
    /// to the log end if it was above it.
    pub fn truncate_to(&mut self, offset: Offset) -> Result<(), PartitionError> {
        if offset >= self.log.log_end_offset() {
            return Ok(());
        }
        let emptied = offset < self.log.log_start_offset();
        self.log.truncate_to(offset)?;
        if emptied {
            self.epochs.clear();
        } else {
            self.epochs.truncate_from_end(self.log.log_end_offset());
        }
        self.after_truncation()
    }

    /// Kafka's `truncateFullyAndStartAt`: the leader's log start passed this
    /// replica's log end, so everything goes and the log restarts at
    /// `offset`.
    pub fn truncate_fully_and_start_at(&mut self, offset: Offset) -> Result<(), PartitionError> {
        self.log.truncate_fully_and_start_at_offset(offset)?;
        self.epochs.clear();
        self.after_truncation()
    }

    fn after_truncation(&mut self) -> Result<(), PartitionError> {
        // A capture taken before the cut may describe batches that are gone.
        self.fence_checkpoints();
        // The snapshot on disk still holds when it ends within what is left:
        // the state is rebuilt from it and the batches after it, not from
        // the whole log (this runs under the partition's lock). One that
        // ends above the cut describes batches that are gone.
        let end = self.log.log_end_offset();
        let start = self.log.log_start_offset();
        if producer_state::read_snapshot(self.log.dir())
            .is_some_and(|s| s.offset > end || s.offset < start)
        {
            self.remove_producer_snapshot()?;
        }
        self.producers = rebuild_producer_state(&self.log)?;
        let leo = self.log.log_end_offset();
        if self.high_watermark > leo {
            self.high_watermark = leo;
        }
        if self.high_watermark < self.log.log_start_offset() {
            self.high_watermark = self.log.log_start_offset();
        }
        self.producers.on_high_watermark(self.high_watermark);
        self.capture_checkpoints().write()?;
        Ok(())
    }

    /// A follower's high watermark: the leader's, but never above what this
    /// replica holds.
    pub fn update_follower_high_watermark(&mut self, leader_hw: Offset) {
        let leo = self.log.log_end_offset();
        self.high_watermark = leader_hw.min(leo).max(self.log.log_start_offset());
        self.producers.on_high_watermark(self.high_watermark);
    }

    /// Follows the leader's log start offset (DeleteRecords and retention
    /// on the leader), as far as this replica's high watermark.
    pub fn maybe_increment_log_start_offset(
        &mut self,
        leader_log_start: Offset,
    ) -> Result<(), PartitionError> {
        let target = leader_log_start.min(self.high_watermark);
        if target > self.log.log_start_offset() {
            self.log.delete_records_before(target)?;
            self.epochs.truncate_from_start(self.log.log_start_offset());
            self.producers.on_log_start(self.log.log_start_offset());
        }
        Ok(())
    }

    /// Kafka's `endOffsetForEpoch` with `LeaderEpochFileCache.endOffsetFor`
    /// semantics: the largest epoch <= `epoch` this replica knows, and where
    /// the next one starts (the log end offset for the latest epoch);
    /// `(-1, -1)` when unknown.
    pub fn end_offset_for_epoch(&self, epoch: LeaderEpoch) -> (LeaderEpoch, Offset) {
        self.epochs_from_log_start()
            .end_offset_for(epoch, self.log.log_end_offset())
    }

    /// The cache as of the current log start: retention and DeleteRecords
    /// move the log start without telling the cache (Kafka's
    /// `truncateFromStart` on every log start change, done lazily here).
    fn epochs_from_log_start(&self) -> LeaderEpochCache {
        let mut cache = self.epochs.clone();
        cache.truncate_from_start(self.log.log_start_offset());
        cache
    }

    /// The epoch of the last batch in the log that carries one.
    pub fn latest_epoch(&self) -> Option<LeaderEpoch> {
        self.epochs.latest_epoch()
    }

    /// The leader epoch cache (tests and diagnostics).
    pub fn epoch_entries(&self) -> Vec<(LeaderEpoch, Offset)> {
        self.epochs_from_log_start()
            .entries()
            .iter()
            .map(|e| (e.epoch, e.start_offset))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use bytes::{Bytes, BytesMut};
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    use super::*;
    use crate::config::{ServerConfig, TopicConfigs};
    use crate::partition::leader_state::AssignedState;
    use crate::types::{NodeId, ProducerId, TopicPartition};

    const NOW: i64 = 1_000_000;

    /// A client batch from idempotent producer `pid` (epoch 0), `n` records
    /// starting at sequence `seq`; `pid` -1 for a plain producer.
    fn client_batch(pid: i64, seq: i32, n: usize) -> Bytes {
        let records: Vec<Record> = (0..n)
            .map(|i| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: pid,
                producer_epoch: if pid < 0 { -1 } else { 0 },
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: if pid < 0 {
                    i as i32 - 1
                } else {
                    seq + i as i32
                },
                timestamp: NOW + i as i64,
                key: None,
                value: Some(Bytes::from(format!("value-{seq}-{i}"))),
                headers: Default::default(),
            })
            .collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .unwrap();
        buf.freeze()
    }

    fn open(dir: &std::path::Path, epoch: i32) -> Partition {
        let configs = TopicConfigs::resolve(&ServerConfig::default(), &BTreeMap::new());
        Partition::open(
            dir.to_path_buf(),
            TopicPartition::new("t", 0),
            uuid::Uuid::nil(),
            LeaderEpoch(epoch),
            configs,
            NOW,
        )
        .unwrap()
    }

    /// Makes `p` the sole in-sync leader at `epoch`, as the image would.
    fn lead(p: &mut Partition, epoch: i32) {
        p.become_leader(
            NodeId(1),
            AssignedState {
                leader_epoch: LeaderEpoch(epoch),
                partition_epoch: epoch,
                replicas: vec![NodeId(1)],
                isr: vec![NodeId(1)],
            },
            Default::default(),
            30_000,
            NOW,
        );
    }

    fn all_bytes(p: &Partition) -> Bytes {
        p.log
            .read(
                p.log.log_start_offset(),
                usize::MAX,
                p.log.log_end_offset(),
                true,
            )
            .unwrap()
    }

    /// A leader with batches at epochs 0, 0, 2, 2, 5 (producer 7's
    /// sequences 0..10 in the first four, a plain producer in the last).
    fn leader(dir: &std::path::Path) -> Partition {
        let mut l = open(dir, 0);
        lead(&mut l, 0);
        l.append_as_leader(&client_batch(7, 0, 3), -1, NOW).unwrap();
        l.append_as_leader(&client_batch(7, 3, 2), -1, NOW).unwrap();
        lead(&mut l, 2);
        l.append_as_leader(&client_batch(7, 5, 4), -1, NOW).unwrap();
        l.append_as_leader(&client_batch(7, 9, 1), -1, NOW).unwrap();
        lead(&mut l, 5);
        l.append_as_leader(&client_batch(-1, 0, 2), -1, NOW)
            .unwrap();
        l
    }

    #[test]
    fn follower_log_is_byte_identical_with_the_same_epochs_and_producers() {
        let (ld, fd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let l = leader(ld.path());
        let mut f = open(fd.path(), 0);
        // Two fetches: the first ends inside the third batch (a cut-off
        // partial batch is left for the next fetch).
        let all = all_bytes(&l);
        let first_two = l.log.read(Offset(0), 1, Offset(5), true).unwrap().len()
            + l.log.read(Offset(3), 1, Offset(5), true).unwrap().len();
        assert_eq!(
            f.append_as_follower(all.slice(..first_two + 20), NOW)
                .unwrap(),
            Offset(5)
        );
        assert_eq!(
            f.append_as_follower(all.slice(first_two..), NOW).unwrap(),
            Offset(12)
        );
        assert_eq!(all_bytes(&f), all);
        let want = vec![
            (LeaderEpoch(0), Offset(0)),
            (LeaderEpoch(2), Offset(5)),
            (LeaderEpoch(5), Offset(10)),
        ];
        assert_eq!(f.epoch_entries(), want);
        assert_eq!(l.epoch_entries(), want);
        assert_eq!(f.producers, l.producers);
        assert_eq!(f.latest_epoch(), Some(LeaderEpoch(5)));
        // Rebuilt from the headers on open, the cache is the same.
        f.close().unwrap();
        let f = open(fd.path(), 0);
        assert_eq!(f.epoch_entries(), want);
        assert_eq!(
            f.end_offset_for_epoch(LeaderEpoch(1)),
            (LeaderEpoch(0), Offset(5))
        );
        assert_eq!(
            f.end_offset_for_epoch(LeaderEpoch(2)),
            (LeaderEpoch(2), Offset(10))
        );
        assert_eq!(
            f.end_offset_for_epoch(LeaderEpoch(5)),
            (LeaderEpoch(5), Offset(12))
        );
        assert_eq!(
            f.end_offset_for_epoch(LeaderEpoch(6)),
            (LeaderEpoch(-1), Offset(-1))
        );
    }

    #[test]
    fn a_follower_that_becomes_leader_dedupes_a_retry_the_old_leader_stored() {
        let (ld, fd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let l = leader(ld.path());
        let mut f = open(fd.path(), 0);
        f.append_as_follower(all_bytes(&l), NOW).unwrap();
        // The producer never got the answer for seq 9 and retries it
        // against the new leader.
        lead(&mut f, 6);
        let retry = f.append_as_leader(&client_batch(7, 9, 1), -1, NOW).unwrap();
        assert!(retry.duplicate);
        assert_eq!(
            (retry.base_offset, retry.last_offset),
            (Offset(9), Offset(9))
        );
        assert_eq!(f.log_end_offset(), Offset(12));
        // The next sequence is accepted, a gap is not.
        assert!(matches!(
            f.append_as_leader(&client_batch(7, 11, 1), -1, NOW),
            Err(PartitionError::Producer(_))
        ));
        let next = f
            .append_as_leader(&client_batch(7, 10, 1), -1, NOW)
            .unwrap();
        assert_eq!(next.base_offset, Offset(12));
        assert_eq!(
            f.epoch_entries().last(),
            Some(&(LeaderEpoch(6), Offset(12)))
        );
    }

    #[test]
    fn bad_batches_are_refused_whole() {
        let (ld, fd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let l = leader(ld.path());
        let all = all_bytes(&l);
        let mut f = open(fd.path(), 0);
        // Not starting at the log end: the second batch alone is fine
        // (a gap, as after compaction), but then the first is below it.
        let first = l.log.read(Offset(0), 1, Offset(3), true).unwrap();
        let second = l.log.read(Offset(3), 1, Offset(5), true).unwrap();
        let gd = tempfile::tempdir().unwrap();
        let mut g = open(gd.path(), 0);
        assert_eq!(
            g.append_as_follower(second.clone(), NOW).unwrap(),
            Offset(5)
        );
        assert!(matches!(
            g.append_as_follower(first.clone(), NOW),
            Err(PartitionError::OffsetOutOfRange { .. })
        ));
        // A flipped bit in the records of the last batch: nothing appended.
        let mut corrupt = BytesMut::from(&all[..]);
        let n = corrupt.len();
        corrupt[n - 2] ^= 1;
        assert!(matches!(
            f.append_as_follower(corrupt.freeze(), NOW),
            Err(PartitionError::CorruptMessage(_))
        ));
        assert_eq!(f.log_end_offset(), Offset(0));
        // Batches out of order inside one response.
        let swapped = Bytes::from([&second[..], &first[..]].concat());
        assert!(f.append_as_follower(swapped, NOW).is_err());
        assert_eq!(f.log_end_offset(), Offset(0));
        assert!(f.epoch_entries().is_empty());
    }

    #[test]
    fn truncation_rebuilds_producer_state_and_the_epoch_cache() {
        let (ld, fd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let l = leader(ld.path());
        let mut f = open(fd.path(), 0);
        f.append_as_follower(all_bytes(&l), NOW).unwrap();
        f.update_follower_high_watermark(Offset(100));
        assert_eq!(f.high_watermark(), Offset(12));
        // Offset 6 is inside the batch 5..=8 (epoch 2): it goes whole.
        f.truncate_to(Offset(6)).unwrap();
        assert_eq!(f.log_end_offset(), Offset(5));
        assert_eq!(f.high_watermark(), Offset(5));
        assert_eq!(f.epoch_entries(), vec![(LeaderEpoch(0), Offset(0))]);
        assert_eq!(
            f.producers
                .entry(ProducerId(7))
                .unwrap()
                .batches
                .back()
                .unwrap()
                .last_seq,
            4
        );
        // Seq 5 is no longer a duplicate: it is the next in sequence.
        lead(&mut f, 3);
        let again = f.append_as_leader(&client_batch(7, 5, 4), -1, NOW).unwrap();
        assert!(!again.duplicate);
        assert_eq!(again.base_offset, Offset(5));
        // A restart sees the same state (no stale snapshot from before).
        let producers = f.producers.clone();
        let entries = f.epoch_entries();
        drop(f);
        let f = open(fd.path(), 3);
        assert_eq!(f.producers, producers);
        assert_eq!(f.epoch_entries(), entries);
        assert_eq!(entries.last(), Some(&(LeaderEpoch(3), Offset(5))));
    }

    /// A truncation above the last snapshot rebuilds the producer state
    /// from it (and the batches after it); a capture taken before the cut is
    /// never written after it; a restart agrees.
    #[test]
    fn truncation_above_the_snapshot_keeps_it_and_drops_older_captures() {
        let (ld, fd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let l = leader(ld.path());
        let all = all_bytes(&l);
        let first_two = l.log.read(Offset(0), 1, Offset(5), true).unwrap().len()
            + l.log.read(Offset(3), 1, Offset(5), true).unwrap().len();
        let mut f = open(fd.path(), 0);
        f.append_as_follower(all.slice(..first_two), NOW).unwrap();
        assert!(f.capture_checkpoints().write().unwrap());
        assert_eq!(
            producer_state::read_snapshot(fd.path()).unwrap().offset,
            Offset(5)
        );
        f.append_as_follower(all.slice(first_two..), NOW).unwrap();
        let before_the_cut = f.capture_checkpoints();
        // Offset 9 starts the fourth batch: 0..=8 stay, above the snapshot.
        f.truncate_to(Offset(9)).unwrap();
        assert_eq!(f.log_end_offset(), Offset(9));
        assert!(!before_the_cut.write().unwrap(), "an older capture waits");
        assert_eq!(
            producer_state::read_snapshot(fd.path()).unwrap().offset,
            Offset(9)
        );
        // The same state as a replica that only ever had offsets 0..=8.
        let gd = tempfile::tempdir().unwrap();
        let mut g = open(gd.path(), 0);
        let first_three = first_two + l.log.read(Offset(5), 1, Offset(9), true).unwrap().len();
        g.append_as_follower(all.slice(..first_three), NOW).unwrap();
        assert_eq!(f.producers, g.producers);
        let producers = f.producers.clone();
        drop(f);
        assert_eq!(open(fd.path(), 2).producers, producers);
    }

    #[test]
    fn truncating_fully_restarts_the_log_at_the_leaders_start() {
        let (ld, fd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let l = leader(ld.path());
        let mut f = open(fd.path(), 0);
        f.append_as_follower(all_bytes(&l), NOW).unwrap();
        f.truncate_fully_and_start_at(Offset(40)).unwrap();
        assert_eq!(
            (f.log_start_offset(), f.log_end_offset(), f.high_watermark()),
            (Offset(40), Offset(40), Offset(40))
        );
        assert!(f.producers.is_empty());
        assert!(f.epoch_entries().is_empty());
        assert_eq!(
            f.end_offset_for_epoch(LeaderEpoch(0)),
            (LeaderEpoch(-1), Offset(-1))
        );
    }

    #[test]
    fn log_start_follows_the_leader_up_to_the_high_watermark() {
        let (ld, fd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let l = leader(ld.path());
        let mut f = open(fd.path(), 0);
        f.append_as_follower(all_bytes(&l), NOW).unwrap();
        f.update_follower_high_watermark(Offset(7));
        f.maybe_increment_log_start_offset(Offset(9)).unwrap();
        assert_eq!(f.log_start_offset(), Offset(7));
        assert_eq!(
            f.epoch_entries(),
            vec![(LeaderEpoch(2), Offset(7)), (LeaderEpoch(5), Offset(10))]
        );
        assert_eq!(
            f.end_offset_for_epoch(LeaderEpoch(1)),
            (LeaderEpoch(1), Offset(7))
        );
    }

    #[test]
    fn a_lowered_max_message_bytes_does_not_stop_replication() {
        let (ld, fd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let l = leader(ld.path());
        let mut f = open(fd.path(), 0);
        // The topic's limit is lowered below the batches the leader already
        // accepted; the follower must still copy them, as Kafka's does.
        let overrides = [("max.message.bytes".to_string(), "64".to_string())].into();
        f.set_configs(TopicConfigs::resolve(&ServerConfig::default(), &overrides));
        let all = all_bytes(&l);
        for item in BatchIter::new(&all) {
            let BatchIterItem::Batch { batch, .. } = item else {
                panic!("whole batches only");
            };
            assert!(batch.as_bytes().len() > 64);
        }
        assert_eq!(f.append_as_follower(all.clone(), NOW).unwrap(), Offset(12));
        assert_eq!(all_bytes(&f), all);
    }
}
