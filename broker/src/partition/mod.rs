//! One partition replica: its log, its producer state, its high watermark.
//! Synchronous; the caller holds the partition's lock and passes `now_ms`.

pub mod epochs;
mod follower;
pub mod producer_state;
mod transcode;

use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use protocol::record_batch::{
    read_varlong, rewrite, BatchIter, BatchIterItem, Codec, RecordBatchView,
};
use uuid::Uuid;

use crate::config::TopicConfigs;
use crate::error::PartitionError;
use crate::log::Log;
use crate::types::{LeaderEpoch, Offset, TopicPartition};
use producer_state::{ProducerCheck, ProducerSnapshot, ProducerStateManager};

/// How long an idle producer's state is kept (Kafka's
/// `producer.id.expiration.ms` default).
pub const PRODUCER_ID_EXPIRATION_MS: i64 = 86_400_000;

/// The result of a successful produce to one partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendOutcome {
    pub base_offset: Offset,
    pub last_offset: Offset,
    /// The broker time stamped on the batch, for LogAppendTime topics; -1 otherwise.
    pub log_append_time_ms: i64,
    pub log_start_offset: Offset,
    pub duplicate: bool,
}

/// What a fetch of one partition returns.
#[derive(Clone, Debug)]
pub struct FetchOutcome {
    pub records: Bytes,
    pub high_watermark: Offset,
    pub log_start_offset: Offset,
    pub last_stable_offset: Offset,
}

pub struct Partition {
    pub tp: TopicPartition,
    pub topic_id: Uuid,
    log: Log,
    producers: ProducerStateManager,
    leader_epoch: LeaderEpoch,
    high_watermark: Offset,
    configs: TopicConfigs,
    /// The configs the produce path reads on every append, parsed once
    /// (TopicConfigs keeps strings, as DescribeConfigs reports them).
    append_config: AppendConfig,
    /// Replicas currently in sync, the leader included. One on a single node.
    isr_size: usize,
    /// (epoch, start offset) of the log's leader epochs (`epochs.rs`).
    epochs: epochs::LeaderEpochCache,
}

/// Writes Kafka's `partition.metadata` file so a directory left by a deleted
/// topic is never mistaken for a new topic of the same name.
pub fn write_partition_metadata(dir: &std::path::Path, topic_id: Uuid) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join("partition.metadata.tmp");
    std::fs::write(&tmp, format!("version: 0\ntopic_id: {topic_id}\n"))?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(tmp, dir.join("partition.metadata"))
}

pub fn read_partition_metadata(dir: &std::path::Path) -> Option<Uuid> {
    let text = std::fs::read_to_string(dir.join("partition.metadata")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("topic_id: "))
        .and_then(|id| id.trim().parse().ok())
}

/// What `append_as_leader` needs from the topic's configs.
#[derive(Clone, Copy, Debug)]
struct AppendConfig {
    max_message_bytes: u32,
    min_insync_replicas: i32,
    compression_target: Option<protocol::record_batch::Codec>,
    log_append_time: bool,
}

impl From<&TopicConfigs> for AppendConfig {
    fn from(c: &TopicConfigs) -> Self {
        AppendConfig {
            max_message_bytes: c.max_message_bytes(),
            min_insync_replicas: c.min_insync_replicas(),
            compression_target: c.compression_target(),
            log_append_time: c.log_append_time(),
        }
    }
}

impl Partition {
    /// Opens (recovering) the log and rebuilds the producer state from the
    /// last snapshot plus the log after it.
    pub fn open(
        dir: PathBuf,
        tp: TopicPartition,
        topic_id: Uuid,
        leader_epoch: LeaderEpoch,
        configs: TopicConfigs,
        now_ms: i64,
    ) -> Result<Self, PartitionError> {
        write_partition_metadata(&dir, topic_id)
            .map_err(|e| PartitionError::Storage(e.to_string()))?;
        let log = Log::open(dir.clone(), configs.log_config(), now_ms)?;
        let (mut producers, from) = match producer_state::read_snapshot(&dir) {
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
        producers.expire(now_ms, PRODUCER_ID_EXPIRATION_MS);
        // A single replica: everything in the log is committed.
        let high_watermark = log.log_end_offset();
        let epochs = follower::epoch_cache_of(&log);
        Ok(Self {
            tp,
            topic_id,
            log,
            producers,
            leader_epoch,
            high_watermark,
            append_config: AppendConfig::from(&configs),
            configs,
            isr_size: 1,
            epochs,
        })
    }

    pub fn log_start_offset(&self) -> Offset {
        self.log.log_start_offset()
    }
    pub fn log_end_offset(&self) -> Offset {
        self.log.log_end_offset()
    }
    pub fn high_watermark(&self) -> Offset {
        self.high_watermark
    }
    pub fn leader_epoch(&self) -> LeaderEpoch {
        self.leader_epoch
    }
    pub fn size_bytes(&self) -> u64 {
        self.log.size_bytes()
    }
    pub fn configs(&self) -> &TopicConfigs {
        &self.configs
    }

    pub fn set_configs(&mut self, configs: TopicConfigs) {
        self.log.set_config(configs.log_config());
        self.append_config = AppendConfig::from(&configs);
        self.configs = configs;
    }

    /// Validates a client's records for this partition and appends them as
    /// the leader. `acks` is the request's; `acks=-1` requires the in-sync
    /// set to be at least `min.insync.replicas`.
    pub fn append_as_leader(
        &mut self,
        records: &Bytes,
        acks: i16,
        now_ms: i64,
    ) -> Result<AppendOutcome, PartitionError> {
        let cfg = self.append_config;
        let max = cfg.max_message_bytes;
        if records.len() > max as usize {
            return Err(PartitionError::MessageTooLarge {
                size: records.len(),
                max,
            });
        }
        let view = single_client_batch(records)?;
        if acks == -1 && (self.isr_size as i32) < cfg.min_insync_replicas {
            return Err(PartitionError::NotEnoughReplicas {
                isr: self.isr_size,
                min_isr: cfg.min_insync_replicas,
            });
        }
        // Kafka's LogValidator runs before the producer-state check: keys on
        // compacted topics, then recompression to the topic's codec.
        // The log's config holds the cleanup policy already parsed.
        let compacted = self.log.config().cleanup_policy.compact;
        let target = cfg.compression_target;
        let recompressed = if compacted || target.is_some_and(|t| view.codec().ok() != Some(t)) {
            let scan = transcode::scan(&view, compacted, target, max)?;
            if !scan.keyless.is_empty() {
                return Err(PartitionError::KeylessRecordsInCompactedTopic {
                    partition: self.tp.to_string(),
                    indexes: scan.keyless,
                });
            }
            scan.recompressed
        } else {
            None
        };
        let records = recompressed.as_ref().unwrap_or(records);
        if let ProducerCheck::Duplicate(m) = self.producers.check(&view)? {
            return Ok(AppendOutcome {
                base_offset: m.first_offset,
                last_offset: m.last_offset,
                log_append_time_ms: if cfg.log_append_time {
                    m.timestamp_ms
                } else {
                    -1
                },
                log_start_offset: self.log.log_start_offset(),
                duplicate: true,
            });
        }
        // Only the header fields Kafka rewrites change; the records are
        // stored exactly as the producer encoded them.
        let base_offset = self.log.log_end_offset();
        let mut batch = BytesMut::from(&records[..]);
        rewrite::set_base_offset(&mut batch, base_offset.0);
        rewrite::set_partition_leader_epoch(&mut batch, self.leader_epoch.0);
        let log_append_time_ms = if cfg.log_append_time {
            rewrite::set_log_append_time(&mut batch, now_ms);
            now_ms
        } else {
            -1
        };
        self.log.append(&batch, now_ms)?;
        let stored =
            RecordBatchView::parse(&batch).map_err(|e| PartitionError::Storage(e.to_string()))?;
        self.producers.update(&stored);
        self.epochs.assign(self.leader_epoch, base_offset);
        // One replica in sync: the high watermark follows the log end.
        self.high_watermark = self.log.log_end_offset();
        Ok(AppendOutcome {
            base_offset,
            last_offset: Offset(stored.last_offset()),
            log_append_time_ms,
            log_start_offset: self.log.log_start_offset(),
            duplicate: false,
        })
    }

    /// Reads committed batches from `offset` (the batch containing it first).
    pub fn read(
        &self,
        offset: Offset,
        max_bytes: usize,
        min_one_batch: bool,
    ) -> Result<FetchOutcome, PartitionError> {
        if offset > self.high_watermark {
            return Err(PartitionError::OffsetOutOfRange {
                requested: offset.0,
                log_start: self.log.log_start_offset().0,
                log_end: self.high_watermark.0,
            });
        }
        let records = self
            .log
            .read(offset, max_bytes, self.high_watermark, min_one_batch)?;
        Ok(FetchOutcome {
            records,
            high_watermark: self.high_watermark,
            log_start_offset: self.log.log_start_offset(),
            last_stable_offset: self.high_watermark,
        })
    }

    /// ListOffsets for one timestamp spec: -1 latest, -2 earliest, -3 max
    /// timestamp, -4 earliest local, otherwise the first offset whose
    /// timestamp is at least `timestamp`. `None` means no such offset.
    pub fn list_offset(&self, timestamp: i64) -> Result<Option<(Offset, i64)>, PartitionError> {
        match timestamp {
            -1 => Ok(Some((self.high_watermark, -1))),
            -2 | -4 => Ok(Some((self.log.log_start_offset(), -1))),
            -3 => {
                let (ts, off) = self.log.max_timestamp()?;
                Ok(if off.0 < 0 { None } else { Some((off, ts)) })
            }
            t if t < 0 => Err(PartitionError::InvalidTimestamp(t)),
            t => Ok(self
                .log
                .offset_for_timestamp(t)?
                .filter(|(o, _)| *o < self.high_watermark)),
        }
    }

    /// DeleteRecords: moves the log start offset up to `offset` (-1 means
    /// the high watermark).
    pub fn delete_records_before(&mut self, offset: i64) -> Result<Offset, PartitionError> {
        let target = if offset == -1 {
            self.high_watermark
        } else {
            Offset(offset)
        };
        if target > self.high_watermark || target.0 < 0 {
            return Err(PartitionError::OffsetOutOfRange {
                requested: offset,
                log_start: self.log.log_start_offset().0,
                log_end: self.high_watermark.0,
            });
        }
        Ok(self.log.delete_records_before(target)?)
    }

    /// Periodic work: retention, rolling, compaction, flush, producer expiry,
    /// and a producer-state snapshot so a restart replays little of the log.
    pub fn maintain(&mut self, now_ms: i64) -> Result<(), PartitionError> {
        self.log.maintain(now_ms, self.high_watermark)?;
        self.producers.expire(now_ms, PRODUCER_ID_EXPIRATION_MS);
        self.snapshot_producers()
    }

    fn snapshot_producers(&self) -> Result<(), PartitionError> {
        producer_state::write_snapshot(
            self.log.dir(),
            &ProducerSnapshot {
                offset: self.log.log_end_offset(),
                state: self.producers.clone(),
            },
        )
        .map_err(|e| PartitionError::Storage(e.to_string()))
    }

    /// Flushes and closes cleanly (writes the producer snapshot).
    pub fn close(self) -> Result<(), PartitionError> {
        self.snapshot_producers()?;
        self.log.close()?;
        Ok(())
    }

    /// Removes the partition's files (topic deletion).
    pub fn delete(self) -> Result<(), PartitionError> {
        Ok(self.log.delete()?)
    }
}

/// Checks that a produce request's records for one partition are exactly one
/// well-formed v2 batch from a client, as Kafka requires of clients.
fn single_client_batch(records: &Bytes) -> Result<RecordBatchView<'_>, PartitionError> {
    let mut iter = BatchIter::new(records);
    let view = match iter.next() {
        Some(BatchIterItem::Batch { batch, .. }) => batch,
        Some(BatchIterItem::Partial { .. }) => {
            return Err(PartitionError::CorruptMessage(
                "truncated record batch".into(),
            ))
        }
        Some(BatchIterItem::Invalid { error, .. }) => {
            return Err(match error {
                protocol::record_batch::BatchError::BadRecordCount(_)
                | protocol::record_batch::BatchError::UnknownCodec(_) => {
                    PartitionError::InvalidRecord(error.to_string())
                }
                _ => PartitionError::CorruptMessage(error.to_string()),
            })
        }
        None => return Err(PartitionError::InvalidRecord("no record batch".into())),
    };
    if iter.next().is_some() {
        return Err(PartitionError::InvalidRecord(
            "a client produce request must carry one batch per partition".into(),
        ));
    }
    view.verify_crc()
        .map_err(|e| PartitionError::CorruptMessage(e.to_string()))?;
    if view.base_offset() != 0 {
        return Err(PartitionError::InvalidRecord(
            "client batches must have base offset 0".into(),
        ));
    }
    if view.is_control() {
        return Err(PartitionError::InvalidRecord(
            "clients may not send control batches".into(),
        ));
    }
    if view.is_transactional() {
        return Err(PartitionError::TransactionsUnsupported);
    }
    if view.record_count() == 0 {
        return Err(PartitionError::InvalidRecord("empty batch".into()));
    }
    if view.codec().ok() == Some(Codec::None) {
        check_uncompressed_records(&view)?;
    }
    Ok(view)
}

/// Walks the records of an uncompressed batch: their lengths must tile the
/// payload exactly, and offset deltas must run 0..count, as Kafka's
/// `LogValidator` requires.
fn check_uncompressed_records(view: &RecordBatchView<'_>) -> Result<(), PartitionError> {
    let payload = view.records_payload();
    let mut pos = 0usize;
    let mut expected_delta = 0i64;
    let bad = |why: &str| PartitionError::InvalidRecord(why.to_string());
    while pos < payload.len() {
        let len = read_varlong(payload, &mut pos).ok_or_else(|| bad("bad record length"))?;
        if len < 0 || len as usize > payload.len() - pos {
            return Err(bad("record length exceeds the batch"));
        }
        let end = pos + len as usize;
        let record = &payload[..end];
        // attributes (int8), timestampDelta (varlong), offsetDelta (varint)
        let mut p = pos + 1;
        read_varlong(record, &mut p).ok_or_else(|| bad("bad timestamp delta"))?;
        let delta = read_varlong(record, &mut p).ok_or_else(|| bad("bad offset delta"))?;
        if delta != expected_delta {
            return Err(bad("record offset deltas are not consecutive"));
        }
        expected_delta += 1;
        pos = end;
    }
    if expected_delta != view.record_count() as i64
        || expected_delta - 1 != view.last_offset_delta() as i64
    {
        return Err(bad("record count does not match the batch header"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    fn encode(values: &[&str], compression: Compression) -> Bytes {
        let records: Vec<Record> = values
            .iter()
            .enumerate()
            .map(|(i, v)| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: i as i32 - 1,
                timestamp: 1_000 + i as i64,
                key: Some(Bytes::from(format!("k{i}"))),
                value: Some(Bytes::from(v.to_string())),
                headers: Default::default(),
            })
            .collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .unwrap();
        buf.freeze()
    }

    #[test]
    fn client_batches_are_validated() {
        let good = encode(&["a", "bb", "ccc"], Compression::None);
        single_client_batch(&good).unwrap();
        single_client_batch(&encode(&["a"], Compression::Gzip)).unwrap();
        let two = Bytes::from([&good[..], &good[..]].concat());
        assert!(matches!(
            single_client_batch(&two),
            Err(PartitionError::InvalidRecord(_))
        ));
        let mut offset = BytesMut::from(&good[..]);
        rewrite::set_base_offset(&mut offset, 5);
        assert!(matches!(
            single_client_batch(&offset.freeze()),
            Err(PartitionError::InvalidRecord(_))
        ));
        let truncated = good.slice(..good.len() - 1);
        assert!(matches!(
            single_client_batch(&truncated),
            Err(PartitionError::CorruptMessage(_))
        ));
    }

    /// Rewrites the record count and fixes the CRC, so only the record walk
    /// can notice.
    fn with_record_count(batch: &Bytes, count: i32) -> Bytes {
        let mut b = BytesMut::from(&batch[..]);
        b[57..61].copy_from_slice(&count.to_be_bytes());
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b.freeze()
    }

    #[test]
    fn uncompressed_records_must_match_their_header() {
        let good = encode(&["a", "bb", "ccc"], Compression::None);
        let fewer = with_record_count(&good, 2);
        assert!(matches!(
            single_client_batch(&fewer),
            Err(PartitionError::InvalidRecord(_))
        ));
        // Offset deltas 0 and 2: consistent with lastOffsetDelta, but not consecutive.
        let records: Vec<Record> = [0i64, 2]
            .iter()
            .map(|&o| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: o,
                sequence: o as i32 - 1,
                timestamp: 1_000,
                key: None,
                value: Some(Bytes::from_static(b"v")),
                headers: Default::default(),
            })
            .collect();
        let mut gap = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut gap,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .unwrap();
        let err = single_client_batch(&gap.freeze()).unwrap_err();
        assert!(err.to_string().contains("not consecutive"), "{err}");
    }
}
