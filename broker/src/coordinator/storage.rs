//! The `__consumer_offsets` topic: where the coordinator's records live.
//!
//! A normal compacted, partitioned topic. A group's records all go to
//! partition `abs(hash(group_id)) % partitions` (Kafka's rule, so a group's
//! coordinator is the leader of that partition), written as ordinary v2
//! batches through the same append path as a producer's acks=all batch.
//! TxnOffsetCommit's records go in transactional batches carrying the
//! transaction's producer id and epoch; the transaction's commit or abort
//! marker (a control batch) is written later by WriteTxnMarkers.

use bytes::Bytes;
use kafka_protocol::records::RecordBatchDecoder;

use protocol::record_batch::{BatchIter, BatchIterItem, RecordBatchView};

use crate::broker::{now_ms, Broker};
use crate::error::PartitionError;
use crate::group::records::{self, CoordinatorRecord};
use crate::group::GroupError;
use crate::partition::FetchLimit;
use crate::replica_manager::{PartitionRef, ReplicaManager};
use crate::types::{Offset, TopicPartition};

pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// How much of a partition one read takes while loading.
const LOAD_READ_BYTES: usize = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("partition {0} of {OFFSETS_TOPIC} is not hosted here")]
    PartitionNotLocal(i32),
    #[error("append to {OFFSETS_TOPIC}: {0}")]
    Append(#[from] PartitionError),
    #[error("encoding records: {0}")]
    Encode(String),
    /// The blocking thread that ran the disk work panicked or was
    /// cancelled (the runtime is shutting down).
    #[error("{OFFSETS_TOPIC} disk work did not finish: {0}")]
    Interrupted(String),
}

impl StorageError {
    /// What a client is told. Kafka maps a failed coordinator write to
    /// COORDINATOR_NOT_AVAILABLE (retriable: the client finds the
    /// coordinator again), except for records too large for the log.
    pub fn group_error(&self) -> GroupError {
        match self {
            // Leadership of the partition moved: the client looks for the
            // new coordinator (Kafka maps NOT_LEADER_OR_FOLLOWER so too).
            StorageError::Append(PartitionError::NotLeaderOrFollower) => GroupError::NotCoordinator,
            StorageError::PartitionNotLocal(_)
            | StorageError::Append(_)
            | StorageError::Encode(_)
            | StorageError::Interrupted(_) => GroupError::CoordinatorNotAvailable,
        }
    }
}

/// The partition of `__consumer_offsets` that holds a group, by the topic's
/// actual partition count (Kafka falls back to the configured count only
/// while the topic does not exist).
pub fn partition_of(broker: &Broker, group_id: &str) -> i32 {
    broker.internal_partition_for(
        OFFSETS_TOPIC,
        group_id,
        broker.config.offsets_topic_num_partitions,
    )
}

/// An appended batch whose acknowledgement is the high watermark passing
/// it, as for a producer's acks=all batch.
pub struct PendingAck {
    part: PartitionRef,
    base_offset: Offset,
    required: Offset,
    events: tokio::sync::watch::Receiver<()>,
}

impl PendingAck {
    /// The offset of the batch's first record; the others follow it.
    pub fn base_offset(&self) -> i64 {
        self.base_offset.0
    }

    /// Waits until every in-sync replica has the batch, at most `timeout`.
    pub async fn wait(mut self, timeout: std::time::Duration) -> Result<(), StorageError> {
        let deadline = tokio::time::Instant::now() + timeout;
        crate::replica_manager::wait_for_ack(&self.part, self.required, &mut self.events, deadline)
            .await
            .map_err(StorageError::Append)
    }
}

/// The producer of a transactional batch. Kafka's coordinator writes base
/// sequence 0 and its log skips sequence checks for coordinator writes; our
/// partition checks every producer's sequences, so the coordinator numbers
/// its batches per producer (see `ProducerSequences`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnProducer {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
}

/// Appends `records` to `__consumer_offsets` partition `partition` as one
/// batch (acks=all: refused below `min.insync.replicas`), transactional when
/// `producer` is given, and returns what to wait on for the batch to be
/// acknowledged (None when there was nothing to append). This is disk work:
/// it runs on a blocking thread.
pub fn append_acked(
    replicas: &ReplicaManager,
    partition: i32,
    records: &[CoordinatorRecord],
    producer: Option<TxnProducer>,
) -> Result<Option<PendingAck>, StorageError> {
    if records.is_empty() {
        return Ok(None);
    }
    let tp = TopicPartition::new(OFFSETS_TOPIC, partition);
    let part = replicas
        .get(&tp)
        .ok_or(StorageError::PartitionNotLocal(partition))?;
    let now = now_ms();
    let entries = records
        .iter()
        .map(|r| records::encode(r).map_err(|e| StorageError::Encode(e.to_string())))
        .collect::<Result<Vec<_>, StorageError>>()?;
    let batch = crate::replica_manager::coordinator_records(
        entries,
        producer.map(|p| (p.producer_id, p.producer_epoch, p.base_sequence)),
        now,
    );
    crate::slow_io::pause(
        OFFSETS_TOPIC,
        partition,
        crate::slow_io::Step::OffsetsAppend,
    );
    let appended = crate::replica_manager::append_internal(replicas, part, &batch, now)?;
    Ok(Some(PendingAck {
        part: appended.part,
        base_offset: appended.base_offset,
        required: appended.required,
        events: appended.events,
    }))
}

/// One entry of a `__consumer_offsets` partition, as the loader replays it.
// Nearly every entry is a record; boxing them to shrink the rare marker
// would cost an allocation per record loaded.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum LogEntry {
    /// A record at `offset`; `producer_id` is set for a batch with a
    /// producer id (a transaction's offset commits, Kafka's rule).
    Record {
        offset: i64,
        producer_id: Option<i64>,
        record: CoordinatorRecord,
    },
    /// A transaction marker: the end of `producer_id`'s transaction.
    Marker { producer_id: i64, commit: bool },
}

/// What a load reads from a partition: its entries in log order, the
/// last epoch and sequence of each producer that wrote to it, and where the
/// read ended (the log end offset it reached).
#[derive(Debug, Default)]
pub struct LoadedLog {
    pub entries: Vec<LogEntry>,
    pub producers: ProducerSequences,
    pub end_offset: i64,
}

/// The last (epoch, sequence) each producer wrote to a partition, so the
/// next transactional batch the coordinator writes continues the sequence
/// the partition's producer state expects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProducerSequences(std::collections::HashMap<i64, (i16, i32)>);

impl ProducerSequences {
    /// The base sequence for `count` records from `producer_id` at `epoch`:
    /// one past the last at the same epoch, 0 at a new one (and after the
    /// wrap past `i32::MAX`, as Kafka wraps).
    pub fn next(&self, producer_id: i64, epoch: i16) -> i32 {
        match self.0.get(&producer_id) {
            Some(&(e, last)) if e == epoch && last < i32::MAX => last + 1,
            _ => 0,
        }
    }

    /// Every producer's (epoch, last sequence).
    pub fn iter(&self) -> impl Iterator<Item = (i64, (i16, i32))> + '_ {
        self.0.iter().map(|(&pid, &last)| (pid, last))
    }

    /// Records a batch the partition took.
    pub fn record(&mut self, producer_id: i64, epoch: i16, base_sequence: i32, count: usize) {
        let last = base_sequence.wrapping_add(count as i32 - 1);
        self.0.insert(producer_id, (epoch, last));
    }
}

/// Every record and transaction marker of one local `__consumer_offsets`
/// partition, in offset order,
/// up to its log end, as Kafka's coordinator loads it. The caller leads the
/// partition, so its log is the one the followers converge on: a record
/// above the high watermark here is one a new leader has not yet seen its
/// followers confirm (its high watermark lags the old leader's by a fetch),
/// often one whose commit was already acked. A record whose bytes do not decode is logged
/// and skipped: one bad record must not keep every group on the partition
/// from loading. Reading starts at `from` (or the log start, if later).
/// This is disk work: it runs on a blocking thread.
pub fn read_partition(
    replicas: &ReplicaManager,
    p: i32,
    from: Offset,
) -> Result<LoadedLog, StorageError> {
    let mut out = LoadedLog::default();
    let Some(part) = replicas.get(&TopicPartition::new(OFFSETS_TOPIC, p)) else {
        return Err(StorageError::PartitionNotLocal(p));
    };
    let mut offset = part
        .lock()
        .expect("partition poisoned")
        .log_start_offset()
        .max(from);
    loop {
        let fetched = {
            let part = part.lock().expect("partition poisoned");
            if offset >= part.log_end_offset() {
                break;
            }
            part.read_up_to(offset, LOAD_READ_BYTES, true, FetchLimit::LogEnd)?
        };
        let mut next = offset;
        for item in BatchIter::new(&fetched.records) {
            let BatchIterItem::Batch { batch, .. } = item else {
                // Reads stop at the log end on batch boundaries; anything
                // else is corruption the log would have cut.
                break;
            };
            next = Offset(batch.last_offset() + 1);
            read_batch(p, offset, &batch, &mut out);
        }
        if next <= offset {
            break;
        }
        offset = next;
    }
    out.end_offset = offset.0;
    Ok(out)
}

/// Adds one batch's records (those at or after `from`) or its marker to
/// `out`.
fn read_batch(p: i32, from: Offset, batch: &RecordBatchView<'_>, out: &mut LoadedLog) {
    let mut one = Bytes::copy_from_slice(batch.as_bytes());
    let set = match RecordBatchDecoder::decode(&mut one) {
        Ok(set) => set,
        Err(e) => {
            tracing::warn!(partition = p, offset = batch.base_offset(), error = %e, "skipping an undecodable {OFFSETS_TOPIC} batch");
            return;
        }
    };
    let producer_id = (batch.producer_id() >= 0).then_some(batch.producer_id());
    if batch.is_control() {
        if let Some(pid) = producer_id {
            out.entries.extend(
                set.records
                    .iter()
                    .filter_map(|r| marker_commits(r.key.as_deref()))
                    .map(|commit| LogEntry::Marker {
                        producer_id: pid,
                        commit,
                    }),
            );
        }
        return;
    }
    if let Some(pid) = producer_id {
        let count = set.records.len();
        if count > 0 && batch.base_sequence() >= 0 {
            out.producers
                .record(pid, batch.producer_epoch(), batch.base_sequence(), count);
        }
    }
    for r in set.records {
        if r.offset < from.0 {
            continue;
        }
        let Some(key) = r.key else { continue };
        match records::decode(&key, r.value.as_deref()) {
            Ok(record) => out.entries.push(LogEntry::Record {
                offset: r.offset,
                producer_id,
                record,
            }),
            Err(e) => {
                tracing::warn!(partition = p, offset = r.offset, error = %e, "skipping an undecodable {OFFSETS_TOPIC} record")
            }
        }
    }
}

/// The outcome of a transaction marker from a control record's key
/// (int16 version, int16 type: 0 abort, 1 commit), or None for another
/// control type (Kafka's leader-change and snapshot records).
pub fn marker_commits(key: Option<&[u8]>) -> Option<bool> {
    let key = key?;
    if key.len() < 4 {
        return None;
    }
    match i16::from_be_bytes([key[2], key[3]]) {
        0 => Some(false),
        1 => Some(true),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::offsets::OffsetAndMetadata;
    use bytes::BytesMut;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    fn encode(records: &[Record]) -> Bytes {
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            records,
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .unwrap();
        buf.freeze()
    }

    fn record(
        offset: i64,
        producer_id: i64,
        sequence: i32,
        key: Bytes,
        value: Option<Bytes>,
    ) -> Record {
        Record {
            transactional: producer_id >= 0,
            control: false,
            partition_leader_epoch: -1,
            producer_id,
            producer_epoch: if producer_id >= 0 { 3 } else { -1 },
            timestamp_type: TimestampType::Creation,
            offset,
            sequence,
            timestamp: 0,
            key: Some(key),
            value,
            headers: Default::default(),
            delete_horizon: false,
        }
    }

    fn offset_commit(committed_offset: i64) -> CoordinatorRecord {
        CoordinatorRecord::OffsetCommit {
            group_id: "g".into(),
            topic: "t".into(),
            partition: 0,
            value: Some(OffsetAndMetadata {
                committed_offset,
                committed_leader_epoch: None,
                metadata: String::new(),
                commit_timestamp_ms: 0,
                expire_timestamp_ms: None,
                topic_id: None,
            }),
        }
    }

    fn read(bytes: &Bytes, from: i64, out: &mut LoadedLog) {
        for item in BatchIter::new(bytes) {
            let BatchIterItem::Batch { batch, .. } = item else {
                panic!("not a batch");
            };
            read_batch(0, Offset(from), &batch, out);
        }
    }

    #[test]
    fn a_transactional_batch_loads_as_its_producers_records_and_its_sequences() {
        let (k1, v1) = records::encode(&offset_commit(7)).unwrap();
        let (k2, v2) = records::encode(&offset_commit(8)).unwrap();
        let bytes = encode(&[record(0, 42, 5, k1, v1), record(1, 42, 6, k2, v2)]);
        let mut out = LoadedLog::default();
        read(&bytes, 0, &mut out);
        assert_eq!(
            out.entries,
            vec![
                LogEntry::Record {
                    offset: 0,
                    producer_id: Some(42),
                    record: offset_commit(7),
                },
                LogEntry::Record {
                    offset: 1,
                    producer_id: Some(42),
                    record: offset_commit(8),
                },
            ]
        );
        // The next batch continues after sequence 6 at epoch 3.
        assert_eq!(out.producers.next(42, 3), 7);
        assert_eq!(out.producers.next(42, 4), 0, "a new epoch starts again");
        assert_eq!(
            out.producers.next(43, 0),
            0,
            "an unknown producer starts at 0"
        );
    }

    #[test]
    fn a_plain_batch_loads_without_a_producer() {
        let (k, v) = records::encode(&offset_commit(7)).unwrap();
        let bytes = encode(&[record(0, -1, -1, k, v)]);
        let mut out = LoadedLog::default();
        read(&bytes, 0, &mut out);
        assert_eq!(
            out.entries,
            vec![LogEntry::Record {
                offset: 0,
                producer_id: None,
                record: offset_commit(7),
            }]
        );
        assert_eq!(out.producers, ProducerSequences::default());
    }

    #[test]
    fn control_batches_load_as_markers_not_as_group_records() {
        let marker = |commit: bool| {
            let mut r = record(
                0,
                42,
                -1,
                Bytes::from_static(if commit { &[0, 0, 0, 1] } else { &[0, 0, 0, 0] }),
                Some(Bytes::from_static(&[0, 0, 0, 0, 0, 5])),
            );
            r.control = true;
            encode(&[r])
        };
        let mut out = LoadedLog::default();
        read(&marker(true), 0, &mut out);
        read(&marker(false), 0, &mut out);
        assert_eq!(
            out.entries,
            vec![
                LogEntry::Marker {
                    producer_id: 42,
                    commit: true
                },
                LogEntry::Marker {
                    producer_id: 42,
                    commit: false
                },
            ]
        );
    }

    #[test]
    fn only_commit_and_abort_control_records_are_markers() {
        assert_eq!(marker_commits(Some(&[0, 0, 0, 1])), Some(true));
        assert_eq!(marker_commits(Some(&[0, 0, 0, 0])), Some(false));
        // Leader change (2) and snapshot records are other control types.
        assert_eq!(marker_commits(Some(&[0, 0, 0, 2])), None);
        assert_eq!(marker_commits(Some(&[0, 0])), None);
        assert_eq!(marker_commits(None), None);
    }

    #[test]
    fn sequences_continue_within_an_epoch() {
        let mut s = ProducerSequences::default();
        assert_eq!(s.next(1, 0), 0);
        s.record(1, 0, 0, 3);
        assert_eq!(s.next(1, 0), 3);
        s.record(1, 0, 3, 1);
        assert_eq!(s.next(1, 0), 4);
        s.record(1, 0, i32::MAX, 1);
        assert_eq!(s.next(1, 0), 0, "wraps as Kafka's sequences do");
    }
}
