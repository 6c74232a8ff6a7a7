//! The transaction side of a partition replica, after Kafka's
//! `UnifiedLog` and `ProducerStateManager`: end-transaction markers written
//! by the leader, the last stable offset, and the producers DescribeProducers
//! reports. The producer state (`producer_state.rs`) follows markers the
//! same way whether this replica wrote them, copied them from its leader or
//! replays them at start-up, so every replica agrees on the ongoing and
//! aborted transactions.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use protocol::record_batch::{rewrite, RecordBatchView};

use super::producer_state::{ProducerStateEntry, TxnMarker};
use super::{AppendOutcome, Partition, Role};
use crate::error::PartitionError;
use crate::log::AbortedRange;
use crate::types::{Offset, ProducerId};
use kafka_protocol::ResponseError;

/// A control batch holding one end-transaction marker, as Kafka's
/// `MemoryRecords.withEndTransactionMarker` builds it: transactional and
/// control attributes, base sequence -1, never compressed.
pub(super) fn marker_batch(
    producer_id: i64,
    producer_epoch: i16,
    marker: TxnMarker,
    now_ms: i64,
) -> Result<Bytes, PartitionError> {
    let record = Record {
        transactional: true,
        control: true,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id,
        producer_epoch,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp: now_ms,
        key: Some(Bytes::copy_from_slice(&marker.key())),
        value: Some(Bytes::copy_from_slice(&marker.value())),
        headers: Default::default(),
    };
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &[record],
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| PartitionError::Storage(format!("encoding a transaction marker: {e}")))?;
    Ok(buf.freeze())
}

/// Kafka's verification guard (KIP-890): before a producer's first batch
/// of a transaction here, the leader asks the transaction coordinator
/// whether the partition is in that transaction (or has it added). The
/// check runs without the partition's lock, so a marker for the producer
/// may land meanwhile. A marker that may end the checked transaction drops
/// the check, and a batch whose check is gone is refused rather than
/// appended after its transaction ended, where no marker would ever close
/// it. Markers of earlier transactions leave the check standing: the one
/// ending the transaction still open here when the check began, and, for a
/// version 2 check (an add), any at or below the checked epoch, since
/// every version 2 end bumps the epoch past it. Those arrive while a
/// version 2 client starts its next transaction as soon as EndTxn answers,
/// and again when a new coordinator resends a transaction's markers.
#[derive(Debug, Default)]
pub struct TxnChecks {
    next_token: u64,
    by_producer: HashMap<i64, TxnCheck>,
}

#[derive(Clone, Copy, Debug)]
struct TxnCheck {
    epoch: i16,
    token: u64,
    /// The first offset of the producer's transaction open here when the
    /// check began: its marker is not the checked transaction's.
    after: Option<Offset>,
    /// A version 2 check: the checked transaction ends at a higher epoch.
    adds: bool,
}

impl Partition {
    /// Whether a transactional batch of `producer_id` at `producer_epoch`
    /// opens a transaction here (no transaction of that epoch is ongoing),
    /// so the coordinator must confirm it first.
    pub fn txn_check_needed(&self, producer_id: i64, producer_epoch: i16) -> bool {
        !self
            .producers
            .entry(ProducerId(producer_id))
            .is_some_and(|e| {
                e.current_txn_first_offset.is_some() && e.producer_epoch == producer_epoch
            })
    }

    /// Starts a check for the producer's batch: the token its append must
    /// present, or `None` when no check is needed. `adds`: the coordinator
    /// adds the partition (version 2) rather than verifies it.
    pub fn start_txn_check(
        &mut self,
        producer_id: i64,
        producer_epoch: i16,
        adds: bool,
    ) -> Option<u64> {
        if !self.txn_check_needed(producer_id, producer_epoch) {
            return None;
        }
        let after = self
            .producers
            .entry(ProducerId(producer_id))
            .and_then(|e| e.current_txn_first_offset);
        let checks = &mut self.txn_checks;
        checks.next_token += 1;
        let token = checks.next_token;
        checks.by_producer.insert(
            producer_id,
            TxnCheck {
                epoch: producer_epoch,
                token,
                after,
                adds,
            },
        );
        Some(token)
    }

    /// Just before the append (under the same lock): the check started
    /// with `token` still stands, or the transaction it confirmed is
    /// already open here. `refused` is the code the producer gets
    /// otherwise (INVALID_TXN_STATE, or TRANSACTION_ABORTABLE for clients
    /// that know it).
    pub fn confirm_txn_check(
        &mut self,
        producer_id: i64,
        producer_epoch: i16,
        token: Option<u64>,
        refused: ResponseError,
    ) -> Result<(), PartitionError> {
        let current = self.txn_checks.by_producer.get(&producer_id).copied();
        if !self.txn_check_needed(producer_id, producer_epoch) {
            return Ok(());
        }
        match (token, current) {
            (Some(t), Some(c)) if t == c.token && c.epoch == producer_epoch => {
                self.txn_checks.by_producer.remove(&producer_id);
                Ok(())
            }
            _ => Err(PartitionError::TransactionCheck {
                code: refused,
                reason: format!(
                    "producer {producer_id}'s transaction ended while its first batch here was checked"
                ),
            }),
        }
    }

    /// A marker at `epoch` ended the producer's transaction that began at
    /// `ended` (none here when `None`): drops a check it may end.
    fn marker_ends_checks(&mut self, producer_id: i64, epoch: i16, ended: Option<Offset>) {
        let checks = &mut self.txn_checks.by_producer;
        match checks.get_mut(&producer_id) {
            Some(c) if c.after.is_some() && c.after == ended => c.after = None,
            Some(c) if c.adds && epoch <= c.epoch => {}
            Some(_) => {
                checks.remove(&producer_id);
            }
            None => {}
        }
    }

    /// Leadership moved: checks in progress answer to the old leader.
    pub(super) fn clear_txn_checks(&mut self) {
        self.txn_checks.by_producer.clear();
    }

    /// Writes a commit or abort marker for `producer_id` as the leader
    /// (WriteTxnMarkers), with Kafka's checks: an older producer epoch is
    /// INVALID_PRODUCER_EPOCH, an older coordinator epoch is
    /// TRANSACTION_COORDINATOR_FENCED, and a marker for a producer with no
    /// transaction open here is still written. The coordinator asks for
    /// acks=all, so the ISR must hold `min.insync.replicas` first.
    pub fn write_txn_marker(
        &mut self,
        producer_id: i64,
        producer_epoch: i16,
        coordinator_epoch: i32,
        commit: bool,
        now_ms: i64,
    ) -> Result<AppendOutcome, PartitionError> {
        let Role::Leader(leader) = &self.role else {
            return Err(PartitionError::NotLeaderOrFollower);
        };
        if self.log.is_offline() {
            return Err(self.offline());
        }
        let isr_size = leader.isr.len();
        let min_isr = leader.effective_min_isr(self.append_config.min_insync_replicas);
        if isr_size < min_isr {
            return Err(PartitionError::NotEnoughReplicas {
                isr: isr_size,
                min_isr: min_isr as i32,
            });
        }
        self.producers
            .check_marker(producer_id, producer_epoch, coordinator_epoch)?;
        let marker = TxnMarker {
            commit,
            coordinator_epoch,
        };
        let encoded = marker_batch(producer_id, producer_epoch, marker, now_ms)?;
        let base_offset = self.log.log_end_offset();
        let mut batch = BytesMut::from(&encoded[..]);
        rewrite::set_base_offset(&mut batch, base_offset.0);
        rewrite::set_partition_leader_epoch(&mut batch, self.leader_epoch.0);
        let log_append_time_ms = if self.append_config.log_append_time {
            rewrite::set_log_append_time(&mut batch, now_ms);
            now_ms
        } else {
            -1
        };
        let ended = self
            .producers
            .entry(ProducerId(producer_id))
            .and_then(|e| e.current_txn_first_offset);
        let appended = self.log.append(&batch, now_ms);
        if self.log.log_end_offset() > base_offset {
            // In the log even if a flush after it failed: the producer state
            // follows the log (see `append_as_leader`).
            let stored = RecordBatchView::parse(&batch)
                .map_err(|e| PartitionError::Storage(e.to_string()))?;
            self.producers.update(&stored);
            self.epochs.assign(self.leader_epoch, base_offset);
            self.marker_ends_checks(producer_id, producer_epoch, ended);
        }
        appended?;
        self.maybe_increment_high_watermark(now_ms);
        Ok(AppendOutcome {
            base_offset,
            last_offset: base_offset,
            log_append_time_ms,
            log_start_offset: self.log.log_start_offset(),
            duplicate: false,
        })
    }

    /// Kafka's `lastStableOffset`: the first offset of the earliest
    /// transaction that is open, or decided with its marker not yet below
    /// the high watermark (never below the log start), capped at the high
    /// watermark. Equal to the high watermark when no transaction is
    /// pending.
    pub fn last_stable_offset(&self) -> Offset {
        let hw = self.high_watermark;
        match self.producers.first_unstable_offset(hw) {
            Some(first) => first.max(self.log.log_start_offset()).min(hw),
            None => hw,
        }
    }

    /// The aborted transactions whose marker is below the high watermark:
    /// the ones compaction may remove the data of.
    pub(super) fn aborted_below_high_watermark(&self) -> Vec<AbortedRange> {
        let hw = self.high_watermark;
        self.producers
            .aborted_between(self.log.log_start_offset(), hw)
            .into_iter()
            .filter(|a| a.last_offset < hw)
            .map(|a| AbortedRange {
                producer_id: a.producer_id,
                first_offset: a.first_offset.0,
                last_offset: a.last_offset.0,
            })
            .collect()
    }

    /// The producers this replica knows (DescribeProducers), by id.
    pub fn active_producers(&self) -> impl Iterator<Item = (ProducerId, &ProducerStateEntry)> {
        self.producers.producers()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::config::{ServerConfig, TopicConfigs};
    use crate::partition::leader_state::AssignedState;
    use crate::partition::producer_state::{self, AbortedTxn};
    use crate::partition::FetchLimit;
    use crate::types::{LeaderEpoch, NodeId, TopicPartition};

    const NOW: i64 = 1_000_000;

    /// `n` records from producer `pid` (epoch 0) from sequence `seq`,
    /// transactional or not; `pid` -1 for a plain producer.
    fn batch(pid: i64, seq: i32, n: usize, transactional: bool) -> Bytes {
        let records: Vec<Record> = (0..n)
            .map(|i| Record {
                transactional,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: pid,
                producer_epoch: if pid < 0 { -1 } else { 0 },
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: if pid < 0 { -1 } else { seq + i as i32 },
                timestamp: NOW + i as i64,
                key: Some(Bytes::from(format!("k{i}"))),
                value: Some(Bytes::from(format!("v{seq}-{i}"))),
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

    fn txn(pid: i64, seq: i32, n: usize) -> Bytes {
        batch(pid, seq, n, true)
    }

    fn open(dir: &std::path::Path) -> Partition {
        open_with(dir, &[])
    }

    fn open_with(dir: &std::path::Path, overrides: &[(&str, &str)]) -> Partition {
        let overrides: BTreeMap<String, String> = overrides
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let configs = TopicConfigs::resolve(&ServerConfig::default(), &overrides);
        Partition::open(
            dir.to_path_buf(),
            TopicPartition::new("t", 0),
            uuid::Uuid::nil(),
            LeaderEpoch(0),
            configs,
            NOW,
        )
        .unwrap()
    }

    /// Leads at epoch 0 with `isr` in sync (node 1 is this one).
    fn lead(p: &mut Partition, isr: &[i32]) {
        p.become_leader(
            NodeId(1),
            AssignedState {
                leader_epoch: LeaderEpoch(0),
                partition_epoch: 0,
                replicas: vec![NodeId(1), NodeId(2)],
                isr: isr.iter().map(|&n| NodeId(n)).collect(),
            },
            Default::default(),
            30_000,
            NOW,
        );
    }

    fn leader(dir: &std::path::Path) -> Partition {
        let mut p = open(dir);
        lead(&mut p, &[1]);
        p
    }

    fn aborted(pid: i64, first: i64, last: i64, lso: i64) -> AbortedTxn {
        AbortedTxn {
            producer_id: pid,
            first_offset: Offset(first),
            last_offset: Offset(last),
            last_stable_offset: Offset(lso),
        }
    }

    /// Producer 7 aborts [0, 1] at 3 while producer 8's transaction (2)
    /// commits at 5, a plain batch at 4, and producer 9 opens one at 6.
    fn with_transactions(p: &mut Partition) {
        p.append_as_leader(&txn(7, 0, 2), -1, NOW).unwrap();
        p.append_as_leader(&txn(8, 0, 1), -1, NOW).unwrap();
        p.write_txn_marker(7, 0, 1, false, NOW).unwrap();
        p.append_as_leader(&batch(-1, 0, 1, false), -1, NOW)
            .unwrap();
        p.write_txn_marker(8, 0, 1, true, NOW).unwrap();
        p.append_as_leader(&txn(9, 0, 1), -1, NOW).unwrap();
    }

    #[test]
    fn the_last_stable_offset_waits_for_the_marker_to_pass_the_high_watermark() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = open(dir.path());
        lead(&mut p, &[1, 2]);
        p.append_as_leader(&batch(-1, 0, 1, false), -1, NOW)
            .unwrap();
        p.append_as_leader(&txn(7, 0, 2), -1, NOW).unwrap();
        p.record_follower_fetch(NodeId(2), Offset(3), NOW).unwrap();
        assert_eq!(p.high_watermark(), Offset(3));
        assert_eq!(p.last_stable_offset(), Offset(1));
        let marker = p.write_txn_marker(7, 0, 0, true, NOW).unwrap();
        assert_eq!(marker.base_offset, Offset(3));
        // Decided, but the marker is not replicated yet.
        p.record_follower_fetch(NodeId(2), Offset(3), NOW).unwrap();
        assert_eq!(p.last_stable_offset(), Offset(1));
        p.record_follower_fetch(NodeId(2), Offset(4), NOW).unwrap();
        assert_eq!(p.high_watermark(), Offset(4));
        assert_eq!(p.last_stable_offset(), Offset(4));
    }

    #[test]
    fn read_committed_stops_at_the_last_stable_offset_and_names_the_aborted() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = leader(dir.path());
        with_transactions(&mut p);
        assert_eq!(p.high_watermark(), Offset(7));
        assert_eq!(p.last_stable_offset(), Offset(6));
        let committed = p
            .read_up_to(Offset(0), 1 << 20, true, FetchLimit::LastStableOffset)
            .unwrap();
        assert_eq!(committed.last_stable_offset, Offset(6));
        assert_eq!(
            committed.aborted_transactions,
            Some(vec![aborted(7, 0, 3, 2)])
        );
        let last = protocol::record_batch::BatchIter::new(&committed.records)
            .filter_map(|b| match b {
                protocol::record_batch::BatchIterItem::Batch { batch, .. } => {
                    Some(batch.last_offset())
                }
                _ => None,
            })
            .last();
        assert_eq!(last, Some(5), "nothing at or above the LSO");
        // read_uncommitted reads to the high watermark, and names nothing.
        let uncommitted = p
            .read_up_to(Offset(0), 1 << 20, true, FetchLimit::HighWatermark)
            .unwrap();
        assert_eq!(uncommitted.aborted_transactions, None);
        assert!(uncommitted.records.len() > committed.records.len());
        // From past the aborted transaction: nothing to name.
        let later = p
            .read_up_to(Offset(4), 1 << 20, true, FetchLimit::LastStableOffset)
            .unwrap();
        assert_eq!(later.aborted_transactions, Some(vec![]));
        // Between the LSO and the high watermark: no records, no error;
        // above the high watermark: out of range, as read_uncommitted.
        let waiting = p
            .read_up_to(Offset(7), 1 << 20, true, FetchLimit::LastStableOffset)
            .unwrap();
        assert!(waiting.records.is_empty());
        assert_eq!(waiting.aborted_transactions, Some(vec![]));
        assert!(matches!(
            p.read_up_to(Offset(8), 1 << 20, true, FetchLimit::LastStableOffset),
            Err(PartitionError::OffsetOutOfRange { .. })
        ));
    }

    #[test]
    fn list_offsets_for_read_committed_is_bounded_by_the_last_stable_offset() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = leader(dir.path());
        with_transactions(&mut p);
        let latest = |limit| p.list_offset(-1, limit).unwrap().unwrap().0;
        assert_eq!(latest(FetchLimit::LastStableOffset), Offset(6));
        assert_eq!(latest(FetchLimit::HighWatermark), Offset(7));
        // Producer 9's record (offset 6) is the only one at NOW.
        assert_eq!(
            p.list_offset(NOW, FetchLimit::HighWatermark).unwrap(),
            Some((Offset(0), NOW))
        );
        let found = |limit| p.list_offset(NOW + 1, limit).unwrap().map(|f| f.0);
        assert_eq!(found(FetchLimit::HighWatermark), Some(Offset(1)));
        assert_eq!(found(FetchLimit::LastStableOffset), Some(Offset(1)));
        // Producer 10's third record (9) is the first at NOW + 2: above
        // the LSO, so read_committed clients do not find it.
        p.append_as_leader(&txn(10, 0, 3), -1, NOW).unwrap();
        let found = |limit| p.list_offset(NOW + 2, limit).unwrap().map(|f| f.0);
        assert_eq!(found(FetchLimit::HighWatermark), Some(Offset(9)));
        assert_eq!(found(FetchLimit::LastStableOffset), None);
        let max = |limit| p.list_offset(-3, limit).unwrap();
        assert_eq!(max(FetchLimit::HighWatermark), Some((Offset(9), NOW + 2)));
        assert_eq!(max(FetchLimit::LastStableOffset), None);
    }

    #[test]
    fn a_marker_during_a_transaction_check_refuses_the_checked_batch() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = leader(dir.path());
        let refused = ResponseError::TransactionAbortable;
        // A first batch needs a check; once it is in, the rest do not.
        let token = p.start_txn_check(7, 0, false);
        assert!(token.is_some());
        p.confirm_txn_check(7, 0, token, refused).unwrap();
        p.append_as_leader(&txn(7, 0, 2), -1, NOW).unwrap();
        assert_eq!(p.start_txn_check(7, 0, false), None);
        p.confirm_txn_check(7, 0, None, refused).unwrap();
        // The coordinator confirmed the next transaction, but its marker
        // (a timeout's abort) landed before the batch: no append.
        p.write_txn_marker(7, 0, 0, true, NOW).unwrap();
        let token = p.start_txn_check(7, 0, false);
        p.write_txn_marker(7, 0, 0, false, NOW).unwrap();
        let err = p.confirm_txn_check(7, 0, token, refused).unwrap_err();
        assert_eq!(err.code(), refused.code(), "{err}");
        // The marker of the transaction still open when the check began
        // (version 2: the next one starts at the bumped epoch at once)
        // leaves the check standing; a second marker does not.
        let token = p.start_txn_check(7, 0, false);
        p.confirm_txn_check(7, 0, token, refused).unwrap();
        p.append_as_leader(&txn(7, 2, 1), -1, NOW).unwrap();
        let token = p.start_txn_check(7, 1, false);
        assert!(token.is_some());
        p.write_txn_marker(7, 1, 0, true, NOW).unwrap();
        p.confirm_txn_check(7, 1, token, refused).unwrap();
        let token = p.start_txn_check(7, 1, false);
        p.write_txn_marker(7, 1, 0, true, NOW).unwrap();
        assert!(p.confirm_txn_check(7, 1, token, refused).is_err());
        // A version 2 check outlives markers at or below its epoch (a new
        // coordinator resending an earlier transaction's), not one above.
        let token = p.start_txn_check(7, 2, true);
        p.write_txn_marker(7, 1, 0, true, NOW).unwrap();
        p.write_txn_marker(7, 2, 0, true, NOW).unwrap();
        p.confirm_txn_check(7, 2, token, refused).unwrap();
        let token = p.start_txn_check(7, 2, true);
        p.write_txn_marker(7, 3, 0, false, NOW).unwrap();
        assert!(p.confirm_txn_check(7, 2, token, refused).is_err());
        // Nor does a token from before a leadership change count.
        let token = p.start_txn_check(7, 0, false);
        p.become_follower(NodeId(2), LeaderEpoch(1), 1);
        p.become_leader(
            NodeId(1),
            AssignedState {
                leader_epoch: LeaderEpoch(2),
                partition_epoch: 2,
                replicas: vec![NodeId(1), NodeId(2)],
                isr: vec![NodeId(1)],
            },
            Default::default(),
            30_000,
            NOW,
        );
        assert!(p.confirm_txn_check(7, 0, token, refused).is_err());
    }

    #[test]
    fn markers_are_fenced_by_producer_and_coordinator_epochs() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = open(dir.path());
        assert!(matches!(
            p.write_txn_marker(7, 0, 0, true, NOW),
            Err(PartitionError::NotLeaderOrFollower)
        ));
        lead(&mut p, &[1]);
        let mut bumped = BytesMut::from(&txn(7, 0, 1)[..]);
        bumped[51..53].copy_from_slice(&2i16.to_be_bytes());
        rewrite::update_crc(&mut bumped);
        p.append_as_leader(&bumped.freeze(), -1, NOW).unwrap();
        let err = p.write_txn_marker(7, 1, 5, false, NOW).unwrap_err();
        assert_eq!(err.code(), 47, "INVALID_PRODUCER_EPOCH: {err}");
        p.write_txn_marker(7, 2, 5, false, NOW).unwrap();
        let err = p.write_txn_marker(7, 2, 4, false, NOW).unwrap_err();
        assert_eq!(err.code(), 52, "TRANSACTION_COORDINATOR_FENCED: {err}");
        // No transaction open: the marker is still written, and ends nothing.
        let out = p.write_txn_marker(7, 2, 5, false, NOW).unwrap();
        assert_eq!(out.base_offset, Offset(2));
        assert_eq!(p.producers.aborted_between(Offset(0), Offset(10)).len(), 1);
        let entry = p.producers.entry(ProducerId(7)).unwrap();
        assert_eq!(
            (entry.coordinator_epoch, entry.current_txn_first_offset),
            (5, None)
        );
    }

    #[test]
    fn a_plain_batch_inside_a_transaction_is_invalid_txn_state_and_control_batches_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = leader(dir.path());
        p.append_as_leader(&txn(7, 0, 1), -1, NOW).unwrap();
        let err = p
            .append_as_leader(&batch(7, 1, 1, false), -1, NOW)
            .unwrap_err();
        assert_eq!(err.code(), 48, "INVALID_TXN_STATE: {err}");
        let control = marker_batch(
            7,
            0,
            TxnMarker {
                commit: true,
                coordinator_epoch: 0,
            },
            NOW,
        )
        .unwrap();
        let err = p.append_as_leader(&control, -1, NOW).unwrap_err();
        assert_eq!(err.code(), 87, "INVALID_RECORD: {err}");
        // After the marker the producer may write outside a transaction.
        p.write_txn_marker(7, 0, 0, true, NOW).unwrap();
        p.append_as_leader(&batch(7, 1, 1, false), -1, NOW).unwrap();
    }

    #[test]
    fn transactions_survive_clean_and_unclean_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = leader(dir.path());
        with_transactions(&mut p);
        let want_aborted = p.producers.aborted_between(Offset(0), Offset(100));
        assert_eq!(want_aborted.len(), 1);
        p.close().unwrap();
        // Clean: from the snapshot.
        let mut p = open(dir.path());
        assert_eq!(p.high_watermark(), Offset(7));
        assert_eq!(p.last_stable_offset(), Offset(6));
        assert_eq!(
            p.producers.aborted_between(Offset(0), Offset(100)),
            want_aborted
        );
        // A snapshot taken mid-way, then replay of what follows it.
        p.capture_checkpoints().write().unwrap();
        lead(&mut p, &[1]);
        p.write_txn_marker(9, 0, 1, false, NOW).unwrap();
        drop(p);
        let mut p = open(dir.path());
        // The checkpointed high watermark (7) is below the new marker.
        assert_eq!(p.last_stable_offset(), Offset(6));
        lead(&mut p, &[1]);
        assert_eq!(p.last_stable_offset(), Offset(8));
        assert_eq!(
            p.producers.aborted_between(Offset(0), Offset(100)),
            vec![aborted(7, 0, 3, 2), aborted(9, 6, 7, 8)]
        );
        drop(p);
        // Unclean, no snapshot at all: everything from the log.
        std::fs::remove_file(dir.path().join(producer_state::SNAPSHOT_FILE)).unwrap();
        let p = open(dir.path());
        assert_eq!(
            p.producers.aborted_between(Offset(0), Offset(100)),
            vec![aborted(7, 0, 3, 2), aborted(9, 6, 7, 8)]
        );
        assert_eq!(
            p.producers.entry(ProducerId(9)).unwrap().coordinator_epoch,
            1
        );
    }

    #[test]
    fn a_follower_has_the_leaders_transactions_and_loses_those_it_truncates() {
        let (ld, fd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut l = leader(ld.path());
        with_transactions(&mut l);
        let all = l
            .read_up_to(Offset(0), 1 << 20, true, FetchLimit::LogEnd)
            .unwrap()
            .records;
        let mut f = open(fd.path());
        f.become_follower(NodeId(1), LeaderEpoch(0), 0);
        f.append_as_follower(all, NOW).unwrap();
        // A follower whose high watermark lags holds the LSO back.
        f.update_follower_high_watermark(Offset(3));
        assert_eq!(f.last_stable_offset(), Offset(0));
        f.update_follower_high_watermark(l.high_watermark());
        assert_eq!(f.producers, l.producers);
        assert_eq!(f.last_stable_offset(), l.last_stable_offset());
        // The abort marker (3) is cut: producer 7's transaction is open again.
        f.truncate_to(Offset(3)).unwrap();
        assert!(f
            .producers
            .aborted_between(Offset(0), Offset(100))
            .is_empty());
        assert_eq!(
            f.producers
                .entry(ProducerId(7))
                .unwrap()
                .current_txn_first_offset,
            Some(Offset(0))
        );
        // Leading now, it can end that transaction itself.
        lead(&mut f, &[1]);
        f.write_txn_marker(7, 0, 1, false, NOW).unwrap();
        assert_eq!(
            f.producers.aborted_between(Offset(0), Offset(100)),
            vec![aborted(7, 0, 3, 2)]
        );
    }

    #[test]
    fn the_log_start_passing_an_aborted_transaction_forgets_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = leader(dir.path());
        with_transactions(&mut p);
        p.delete_records_before(3).unwrap();
        assert_eq!(p.producers.aborted_between(Offset(0), Offset(100)).len(), 1);
        p.delete_records_before(4).unwrap();
        assert!(p
            .producers
            .aborted_between(Offset(0), Offset(100))
            .is_empty());
        // The open transaction (6) still holds the LSO.
        assert_eq!(p.last_stable_offset(), Offset(6));
    }

    /// Base offsets of the batches in the log.
    fn batch_offsets(p: &Partition) -> Vec<i64> {
        let all = p
            .read_up_to(Offset(0), 1 << 20, true, FetchLimit::LogEnd)
            .unwrap()
            .records;
        protocol::record_batch::BatchIter::new(&all)
            .filter_map(|b| match b {
                protocol::record_batch::BatchIterItem::Batch { batch, .. } => {
                    Some(batch.base_offset())
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn compaction_removes_aborted_data_and_keeps_the_markers() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = open_with(
            dir.path(),
            &[("cleanup.policy", "compact"), ("segment.bytes", "200")],
        );
        lead(&mut p, &[1]);
        p.append_as_leader(&txn(7, 0, 2), -1, NOW).unwrap(); // 0-1, aborted
        p.append_as_leader(&txn(8, 0, 1), -1, NOW).unwrap(); // 2, committed
        p.write_txn_marker(7, 0, 0, false, NOW).unwrap(); // 3
        p.write_txn_marker(8, 0, 0, true, NOW).unwrap(); // 4
        p.append_as_leader(&txn(9, 0, 1), -1, NOW).unwrap(); // 5, aborted: its last batch
        p.write_txn_marker(9, 0, 0, false, NOW).unwrap(); // 6
        for seq in 0..4 {
            p.append_as_leader(&batch(-1, seq, 1, false), -1, NOW)
                .unwrap();
        }
        let before = batch_offsets(&p);
        assert_eq!(before, [0, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        let job = p.compaction_plan(NOW).unwrap().expect("a pass is due");
        assert!(p.install_compaction(job.run().unwrap()).unwrap());
        let after = batch_offsets(&p);
        assert!(!after.contains(&0), "aborted data goes: {after:?}");
        for kept in [2, 3, 4, 6] {
            assert!(after.contains(&kept), "{kept} stays: {after:?}");
        }
        // Producer 9's aborted batch was its last data batch before the
        // marker, but the marker is its last batch: the data goes whole.
        assert!(!after.contains(&5), "{after:?}");
        // Nothing read_committed sees changed: only aborted data went.
        assert_eq!(p.last_stable_offset(), p.high_watermark());
    }
}
