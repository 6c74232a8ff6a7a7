//! Kafka's `LogValidator` for a client's batch on the leader. Every record
//! is read once, in one streaming pass, and checked as Kafka checks it: the
//! structure `DefaultRecord.readFrom` parses, exactly the declared count,
//! consecutive offset deltas, keys on compacted topics, and CreateTime
//! timestamps against `message.timestamp.before.max.ms` /
//! `message.timestamp.after.max.ms`. The same pass re-encodes the batch when
//! the topic's `compression.type` names another codec.
//!
//! Records stream through the codecs (`protocol::records`), so memory stays
//! bounded by codec buffers however far a hostile batch would decompress;
//! the only thing built in full is a recompressed batch, capped at the
//! topic's `max.message.bytes` as Kafka re-checks the size after
//! recompression. An uncompressed batch is parsed in place, and keys and
//! values are skipped, not read, unless the batch is being re-encoded.
//!
//! A record that breaks a rule is a [`RecordFault`] at its batch index; the
//! produce response names them in `record_errors`, as Kafka's
//! `RecordValidationException` does.

use std::io::{self, Write};

use bytes::Bytes;
use protocol::record_batch::{rewrite, Codec, RecordBatchView, HEADER_LEN};
use protocol::records::{RecordError, RecordReader, RecordVisitor, XERIAL_MAGIC};

use crate::error::PartitionError;
use crate::types::TopicPartition;

/// snappy-java's default block size; Kafka writes blocks of this size.
const XERIAL_BLOCK_LEN: usize = 32 * 1024;

/// Kafka's `RecordBatch.NO_TIMESTAMP`: a record without a timestamp.
const NO_TIMESTAMP: i64 = -1;

/// The most faulty records a rejection names. Each named record costs a
/// message in the response, and a compressed batch can hold millions of
/// records; the records past this many still fail (a client fails every
/// record of a rejected batch) and still count in the total.
pub const MAX_RECORD_ERRORS: usize = 1000;

/// How a topic's record timestamps are checked (`message.timestamp.type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimestampRule {
    /// The producer's timestamps are kept, and must lie within
    /// `[now - before_max_ms, now + after_max_ms]`.
    CreateTime {
        now_ms: i64,
        before_max_ms: i64,
        after_max_ms: i64,
    },
    /// The broker stamps every batch; what the producer wrote is not checked.
    LogAppendTime,
}

/// What the topic requires of a batch.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// `cleanup.policy` includes `compact`: every record needs a key.
    pub compacted: bool,
    /// The topic's `compression.type` codec, when it names one.
    pub target: Option<Codec>,
    /// The level of the target codec (`compression.<codec>.level`); `None`:
    /// the codec's default.
    pub level: Option<i32>,
    /// `max.message.bytes`: the cap on a re-encoded batch.
    pub max_bytes: u32,
    /// `max.decompressed.message.bytes`: the largest record a compressed
    /// batch may carry, decompressed.
    pub max_record_bytes: u32,
    pub timestamps: TimestampRule,
}

/// A batch that passed.
#[derive(Debug)]
pub struct Validated {
    /// The largest record timestamp (`NO_TIMESTAMP` when no record has
    /// one): the batch's max timestamp on a CreateTime topic, as Kafka sets it.
    pub max_timestamp_ms: i64,
    /// The batch re-encoded with the target codec, when one was asked for
    /// and the batch used another.
    pub recompressed: Option<Bytes>,
}

/// Why one record of a batch is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordFault {
    /// A compacted topic keeps the latest record per key; a record without
    /// one has no place there.
    MissingKey,
    /// A CreateTime timestamp outside the topic's bounds around the broker's clock.
    TimestampOutOfRange {
        timestamp_ms: i64,
        offset_delta: i32,
        min_ms: i64,
        max_ms: i64,
    },
    /// The batch claims LogAppendTime, which only a broker sets.
    LogAppendTimeFromClient,
    /// The bytes are not a record (what `DefaultRecord.readFrom` refuses), or
    /// its offset delta is not its position in the batch.
    Malformed(String),
}

impl RecordFault {
    /// Kafka's message for the record, for `batch_index_error_message`.
    pub fn message(&self, partition: &str) -> String {
        match self {
            RecordFault::MissingKey => format!(
                "Compacted topic cannot accept message without key in topic partition {partition}."
            ),
            RecordFault::TimestampOutOfRange {
                timestamp_ms,
                offset_delta,
                min_ms,
                max_ms,
            } => format!(
                "Timestamp {timestamp_ms} of message with offset {offset_delta} is out of range. \
                 The timestamp should be within [{min_ms}, {max_ms}]"
            ),
            RecordFault::LogAppendTimeFromClient => "Invalid timestamp type in message. \
                 Producer should not set timestamp type to LogAppendTime."
                .to_string(),
            RecordFault::Malformed(reason) => reason.clone(),
        }
    }
}

/// The refused records of one batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordErrors {
    /// The topic partition, which Kafka's messages name.
    pub partition: String,
    /// (batch index, fault) of the first [`MAX_RECORD_ERRORS`], in batch order.
    pub faults: Vec<(i32, RecordFault)>,
    /// How many records were refused for each reason, named or not.
    pub counts: FaultCounts,
}

/// Refused records by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub missing_key: u64,
    pub timestamp: u64,
    pub malformed: u64,
}

impl RecordErrors {
    fn new(tp: &TopicPartition) -> Self {
        RecordErrors {
            partition: tp.to_string(),
            faults: Vec::new(),
            counts: FaultCounts::default(),
        }
    }

    fn push(&mut self, index: i32, fault: RecordFault) {
        match fault {
            RecordFault::MissingKey => self.counts.missing_key += 1,
            RecordFault::TimestampOutOfRange { .. } | RecordFault::LogAppendTimeFromClient => {
                self.counts.timestamp += 1
            }
            RecordFault::Malformed(_) => self.counts.malformed += 1,
        }
        if self.faults.len() < MAX_RECORD_ERRORS {
            self.faults.push((index, fault));
        }
    }

    /// How many records were refused, named or not.
    pub fn total(&self) -> u64 {
        self.counts.missing_key + self.counts.timestamp + self.counts.malformed
    }

    /// Kafka answers INVALID_TIMESTAMP when any record was refused for its
    /// timestamp, INVALID_RECORD otherwise.
    pub fn has_timestamp_fault(&self) -> bool {
        self.counts.timestamp > 0
    }
}

impl std::fmt::Display for RecordErrors {
    /// Kafka's top-level message (`LogValidator.processRecordErrors`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.has_timestamp_fault() {
            return write!(
                f,
                "One or more records have been rejected due to invalid timestamp"
            );
        }
        write!(
            f,
            "One or more records have been rejected due to {} record errors in total, \
             and only showing the first three errors at most: [",
            self.total()
        )?;
        for (i, (index, fault)) in self.faults.iter().take(3).enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(
                f,
                "RecordError(batchIndex={index}, message='{}')",
                fault.message(&self.partition)
            )?;
        }
        write!(f, "]")
    }
}

/// Copies each record's encoding into the target codec's encoder.
struct Copy<'e> {
    output: Option<&'e mut Encoder>,
}

impl RecordVisitor for Copy<'_> {
    fn wants_raw(&self) -> bool {
        self.output.is_some()
    }
    fn raw(&mut self, piece: &[u8]) -> io::Result<()> {
        match self.output.as_mut() {
            Some(out) => out.write_all(piece),
            None => Ok(()),
        }
    }
}

/// Reads and checks every record of `view`, a client batch for `tp`, and
/// re-encodes it when `rules.target` names a codec it does not use.
pub fn validate(
    view: &RecordBatchView<'_>,
    tp: &TopicPartition,
    rules: &Rules,
) -> Result<Validated, PartitionError> {
    let codec = view
        .codec()
        .map_err(|e| PartitionError::InvalidRecord(e.to_string()))?;
    let target = rules.target.filter(|t| *t != codec);
    let max_bytes = rules.max_bytes;
    let mut output = match target {
        Some(t) => Some(
            encoder(t, rules.level, max_bytes as usize)
                .map_err(|e| PartitionError::RecompressionFailed(e.to_string()))?,
        ),
        None => None,
    };
    // As Kafka's DefaultRecord.readFrom: a LogAppendTime batch's records all
    // carry its max timestamp; otherwise the first timestamp plus the delta.
    let log_append_time_batch = view.is_log_append_time();
    let base_timestamp = view.base_timestamp();
    let batch_max_timestamp = view.max_timestamp();
    let mut errors = RecordErrors::new(tp);
    let mut max_timestamp = NO_TIMESTAMP;
    let mut reader = RecordReader::new(view).map_err(|e| record_error(e, tp, max_bytes))?;
    let mut copy = Copy {
        output: output.as_mut(),
    };
    while let Some(info) = reader
        .next_record(&mut copy)
        .map_err(|e| record_error(e, tp, max_bytes))?
    {
        // Kafka rebuilds a compressed batch whose inner offsets are not
        // 0, 1, 2, ... (for pre-v2 clients); no v2 client writes one, and a
        // stored batch's offsets must match its header, so it is refused.
        if info.offset_delta != info.index {
            return Err(malformed(
                tp,
                info.index,
                format!(
                    "record offset delta {} is not its position {} in the batch",
                    info.offset_delta, info.index
                ),
            ));
        }
        if codec != Codec::None && info.encoded_len() > u64::from(rules.max_record_bytes) {
            return Err(malformed(
                tp,
                info.index,
                format!(
                    "Record size {} exceeds the maximum decompressed record size {} (max.decompressed.message.bytes)",
                    info.encoded_len(),
                    rules.max_record_bytes
                ),
            ));
        }
        let timestamp = if log_append_time_batch {
            batch_max_timestamp
        } else {
            base_timestamp.wrapping_add(info.timestamp_delta)
        };
        // One fault per record, the key first, as Kafka's validateRecord.
        let fault = if rules.compacted && info.key_len < 0 {
            Some(RecordFault::MissingKey)
        } else {
            timestamp_fault(
                rules.timestamps,
                log_append_time_batch,
                timestamp,
                info.offset_delta,
            )
        };
        if let Some(fault) = fault {
            errors.push(info.index, fault);
        }
        max_timestamp = max_timestamp.max(timestamp);
    }
    // Anything after the declared records is not a record Kafka would keep.
    reader
        .finish()
        .map_err(|e| record_error(e, tp, max_bytes))?;
    if errors.total() > 0 {
        return Err(PartitionError::RecordsRejected(errors));
    }
    let recompressed = match (output, target) {
        (Some(out), Some(t)) => {
            let payload = out.finish().map_err(|e| too_large(e, max_bytes))?;
            Some(rebuild(view, t, &payload))
        }
        _ => None,
    };
    Ok(Validated {
        max_timestamp_ms: max_timestamp,
        recompressed,
    })
}

/// Kafka's `LogValidator.validateTimestamp`, with Java's wrapping arithmetic.
fn timestamp_fault(
    rule: TimestampRule,
    log_append_time_batch: bool,
    timestamp_ms: i64,
    offset_delta: i32,
) -> Option<RecordFault> {
    match rule {
        TimestampRule::CreateTime {
            now_ms,
            before_max_ms,
            after_max_ms,
        } if timestamp_ms != NO_TIMESTAMP => {
            let behind = now_ms.wrapping_sub(timestamp_ms);
            (behind > before_max_ms || behind.wrapping_neg() > after_max_ms).then(|| {
                RecordFault::TimestampOutOfRange {
                    timestamp_ms,
                    offset_delta,
                    min_ms: now_ms.wrapping_sub(before_max_ms),
                    max_ms: now_ms.wrapping_add(after_max_ms),
                }
            })
        }
        _ if log_append_time_batch => Some(RecordFault::LogAppendTimeFromClient),
        _ => None,
    }
}

fn malformed(tp: &TopicPartition, index: i32, reason: String) -> PartitionError {
    let mut errors = RecordErrors::new(tp);
    errors.push(index, RecordFault::Malformed(reason));
    PartitionError::RecordsRejected(errors)
}

/// A batch the reader refused, as the produce error Kafka gives: a record
/// that is not one is refused at its index (INVALID_RECORD); a stream the
/// codec cannot decode is what Kafka's decompressors report as a
/// `KafkaException`; a copy that outgrew the limit is MESSAGE_TOO_LARGE.
fn record_error(e: RecordError, tp: &TopicPartition, max_bytes: u32) -> PartitionError {
    match e {
        RecordError::Corrupt(why) => PartitionError::UndecodableRecords(why),
        RecordError::Invalid { index, reason } => malformed(tp, index, reason),
        RecordError::TrailingBytes { count } => PartitionError::InvalidRecord(format!(
            "Incorrect declared batch size, records still remaining after the {count} declared"
        )),
        RecordError::Sink {
            kind: io::ErrorKind::WriteZero,
            ..
        } => PartitionError::MessageTooLarge {
            size: max_bytes as usize + 1,
            max: max_bytes,
        },
        RecordError::Sink { reason, .. } => PartitionError::RecompressionFailed(reason),
    }
}

/// A batch with `view`'s header, `codec` in its attributes and `payload` as
/// its records, with the length and CRC recomputed.
fn rebuild(view: &RecordBatchView<'_>, codec: Codec, payload: &[u8]) -> Bytes {
    let mut batch = Vec::with_capacity(HEADER_LEN + payload.len());
    batch.extend_from_slice(&view.as_bytes()[..HEADER_LEN]);
    batch.extend_from_slice(payload);
    rewrite::set_codec(&mut batch, codec);
    rewrite::seal(&mut batch);
    Bytes::from(batch)
}

fn too_large(e: io::Error, max_bytes: u32) -> PartitionError {
    match e.kind() {
        io::ErrorKind::WriteZero => PartitionError::MessageTooLarge {
            size: max_bytes as usize + 1,
            max: max_bytes,
        },
        _ => PartitionError::RecompressionFailed(e.to_string()),
    }
}

/// A writer that refuses to grow past `max` bytes (WriteZero), so a
/// recompressed batch can never outgrow the topic's limit in memory.
struct Capped {
    buf: Vec<u8>,
    max: usize,
}

impl Write for Capped {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.max {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "batch too large"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

enum Encoder {
    None(Capped),
    Gzip(flate2::write::GzEncoder<Capped>),
    Snappy(XerialWriter),
    Lz4(lz4::Encoder<Capped>),
    Zstd(zstd::stream::write::Encoder<'static, Capped>),
}

fn encoder(codec: Codec, level: Option<i32>, max_bytes: usize) -> io::Result<Encoder> {
    // The payload's share of the limit: the batch header comes on top.
    let capped = Capped {
        buf: Vec::new(),
        max: max_bytes.saturating_sub(HEADER_LEN),
    };
    Ok(match codec {
        Codec::None => Encoder::None(capped),
        Codec::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
            capped,
            level.map_or(flate2::Compression::default(), |l| {
                flate2::Compression::new(l.clamp(1, 9) as u32)
            }),
        )),
        Codec::Snappy => Encoder::Snappy(XerialWriter::new(capped)?),
        Codec::Lz4 => Encoder::Lz4(
            lz4::EncoderBuilder::new()
                .level(level.unwrap_or(0).clamp(0, 16) as u32)
                .build(capped)?,
        ),
        Codec::Zstd => Encoder::Zstd(zstd::stream::write::Encoder::new(
            capped,
            level.unwrap_or(3),
        )?),
    })
}

impl Encoder {
    fn finish(self) -> io::Result<Vec<u8>> {
        Ok(match self {
            Encoder::None(c) => c.buf,
            Encoder::Gzip(e) => e.finish()?.buf,
            Encoder::Snappy(e) => e.finish()?.buf,
            Encoder::Lz4(e) => {
                let (c, result) = e.finish();
                result?;
                c.buf
            }
            Encoder::Zstd(e) => e.finish()?.buf,
        })
    }
}

impl Write for Encoder {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        match self {
            Encoder::None(w) => w.write(data),
            Encoder::Gzip(w) => w.write(data),
            Encoder::Snappy(w) => w.write(data),
            Encoder::Lz4(w) => w.write(data),
            Encoder::Zstd(w) => w.write(data),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Encoder::None(w) => w.flush(),
            Encoder::Gzip(w) => w.flush(),
            Encoder::Snappy(w) => w.flush(),
            Encoder::Lz4(w) => w.flush(),
            Encoder::Zstd(w) => w.flush(),
        }
    }
}

/// Writes snappy-java's framing, as Kafka's producers do.
struct XerialWriter {
    out: Capped,
    pending: Vec<u8>,
}

impl XerialWriter {
    fn new(mut out: Capped) -> io::Result<Self> {
        out.write_all(&XERIAL_MAGIC)?;
        // version 1, minimum compatible version 1
        out.write_all(&1i32.to_be_bytes())?;
        out.write_all(&1i32.to_be_bytes())?;
        Ok(XerialWriter {
            out,
            pending: Vec::with_capacity(XERIAL_BLOCK_LEN),
        })
    }

    fn flush_block(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let block = snap::raw::Encoder::new()
            .compress_vec(&self.pending)
            .map_err(|e| invalid(&e.to_string()))?;
        self.out.write_all(&(block.len() as u32).to_be_bytes())?;
        self.out.write_all(&block)?;
        self.pending.clear();
        Ok(())
    }

    fn finish(mut self) -> io::Result<Capped> {
        self.flush_block()?;
        Ok(self.out)
    }
}

impl Write for XerialWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(XERIAL_BLOCK_LEN - self.pending.len());
        self.pending.extend_from_slice(&data[..n]);
        if self.pending.len() == XERIAL_BLOCK_LEN {
            self.flush_block()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn invalid(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
        TimestampType,
    };

    const CODECS: [(Compression, Codec); 5] = [
        (Compression::None, Codec::None),
        (Compression::Gzip, Codec::Gzip),
        (Compression::Snappy, Codec::Snappy),
        (Compression::Lz4, Codec::Lz4),
        (Compression::Zstd, Codec::Zstd),
    ];

    /// The broker's clock in these tests; records are stamped around it.
    const NOW: i64 = 1_700_000_000_000;
    const HOUR: i64 = 3_600_000;

    fn record(i: usize, key: bool, timestamp: i64) -> Record {
        Record {
            transactional: false,
            delete_horizon: false,
            control: false,
            partition_leader_epoch: 0,
            producer_id: 7,
            producer_epoch: 1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: i as i32,
            timestamp,
            key: key.then(|| Bytes::from(format!("k{i}"))),
            value: Some(Bytes::from(format!("value {i} ").repeat(20))),
            headers: Default::default(),
        }
    }

    fn records(n: usize, keyless_every: usize) -> Vec<Record> {
        (0..n)
            .map(|i| {
                let key = keyless_every == 0 || i % keyless_every != 0;
                record(i, key, NOW + i as i64)
            })
            .collect()
    }

    fn encode(records: &[Record], compression: Compression) -> Bytes {
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .unwrap();
        buf.freeze()
    }

    fn tp() -> TopicPartition {
        TopicPartition::new("t", 0)
    }

    /// A delete-policy CreateTime topic with Kafka 4's default bounds.
    fn rules() -> Rules {
        Rules {
            compacted: false,
            target: None,
            level: None,
            max_bytes: 10 << 20,
            max_record_bytes: u32::MAX,
            timestamps: TimestampRule::CreateTime {
                now_ms: NOW,
                before_max_ms: i64::MAX,
                after_max_ms: HOUR,
            },
        }
    }

    fn check(batch: &[u8], rules: Rules) -> Result<Validated, PartitionError> {
        let view = RecordBatchView::parse(batch).unwrap();
        validate(&view, &tp(), &rules)
    }

    fn rejected(r: Result<Validated, PartitionError>) -> RecordErrors {
        match r {
            Err(PartitionError::RecordsRejected(e)) => e,
            other => panic!("expected RecordsRejected, got {other:?}"),
        }
    }

    #[test]
    fn every_codec_converts_to_every_other_losslessly() {
        let original = records(300, 0);
        for (from, _) in CODECS {
            let batch = encode(&original, from);
            for (_, to) in CODECS {
                let out = check(
                    &batch,
                    Rules {
                        target: Some(to),
                        ..rules()
                    },
                )
                .unwrap();
                let converted = out.recompressed.unwrap_or_else(|| batch.clone());
                let parsed = RecordBatchView::parse(&converted).unwrap();
                parsed.verify_crc().unwrap();
                assert_eq!(parsed.codec().unwrap(), to);
                assert_eq!(parsed.producer_id(), 7);
                assert_eq!(parsed.base_sequence(), 0);
                assert_eq!(parsed.record_count(), 300);
                let decoded = RecordBatchDecoder::decode(&mut converted.clone()).unwrap();
                assert_eq!(decoded.records, original, "{from:?} -> {to:?}");
            }
        }
    }

    #[test]
    fn keyless_records_are_named_in_every_codec() {
        let original = records(100, 10);
        for (from, _) in CODECS {
            let batch = encode(&original, from);
            let errors = rejected(check(
                &batch,
                Rules {
                    compacted: true,
                    ..rules()
                },
            ));
            let indexes: Vec<i32> = errors.faults.iter().map(|(i, _)| *i).collect();
            assert_eq!(indexes, (0..100).step_by(10).collect::<Vec<i32>>());
            assert!(errors
                .faults
                .iter()
                .all(|(_, f)| *f == RecordFault::MissingKey));
            assert!(!errors.has_timestamp_fault());
            let err = PartitionError::RecordsRejected(errors);
            assert_eq!(err.code(), 87, "INVALID_RECORD");
            assert!(err.to_string().starts_with(
                "One or more records have been rejected due to 10 record errors in total, \
                 and only showing the first three errors at most: [RecordError(batchIndex=0, \
                 message='Compacted topic cannot accept message without key in topic partition t-0.'), "
            ));
            // Keyed records pass on the same topic.
            let keyed = encode(&records(100, 0), from);
            check(
                &keyed,
                Rules {
                    compacted: true,
                    ..rules()
                },
            )
            .unwrap();
        }
    }

    #[test]
    fn a_rejection_names_at_most_max_record_errors() {
        let n = MAX_RECORD_ERRORS + 500;
        let batch = encode(
            &(0..n)
                .map(|i| Record {
                    value: Some(Bytes::from_static(b"v")),
                    ..record(i, false, NOW)
                })
                .collect::<Vec<_>>(),
            Compression::Zstd,
        );
        let errors = rejected(check(
            &batch,
            Rules {
                compacted: true,
                ..rules()
            },
        ));
        assert_eq!(errors.faults.len(), MAX_RECORD_ERRORS);
        assert_eq!(errors.total(), n as u64);
        assert!(PartitionError::RecordsRejected(errors)
            .to_string()
            .contains(&format!("due to {n} record errors in total")));
    }

    #[test]
    fn recompression_past_the_limit_is_message_too_large() {
        let batch = encode(&records(300, 0), Compression::Zstd);
        let err = check(
            &batch,
            Rules {
                target: Some(Codec::None),
                level: None,
                max_bytes: batch.len() as u32,
                max_record_bytes: u32::MAX,
                ..rules()
            },
        )
        .unwrap_err();
        assert!(matches!(err, PartitionError::MessageTooLarge { .. }));
    }

    /// `batch`'s header (CRC resealed) with `payload` as its records section.
    fn with_payload(batch: &Bytes, codec: Codec, payload: &[u8]) -> Bytes {
        rebuild(&RecordBatchView::parse(batch).unwrap(), codec, payload)
    }

    fn compress(codec: Codec, plain: &[u8]) -> Vec<u8> {
        match codec {
            Codec::None => plain.to_vec(),
            Codec::Snappy => snap::raw::Encoder::new().compress_vec(plain).unwrap(),
            other => {
                let mut e = encoder(other, None, usize::MAX).unwrap();
                e.write_all(plain).unwrap();
                e.finish().unwrap()
            }
        }
    }

    #[test]
    fn unframed_snappy_is_read_as_one_raw_block() {
        let original = records(50, 7);
        let plain = encode(&original, Compression::None);
        let batch = with_payload(
            &plain,
            Codec::Snappy,
            &compress(Codec::Snappy, &plain[HEADER_LEN..]),
        );
        let out = check(
            &batch,
            Rules {
                target: Some(Codec::None),
                ..rules()
            },
        )
        .unwrap();
        assert_eq!(out.recompressed.unwrap(), plain);
    }

    #[test]
    fn bytes_after_the_declared_records_are_invalid_in_every_codec() {
        let plain = encode(&records(10, 0), Compression::None);
        let mut records_and_more = plain[HEADER_LEN..].to_vec();
        records_and_more.extend_from_slice(&plain[HEADER_LEN..HEADER_LEN + 20]);
        for (_, codec) in CODECS {
            let batch = with_payload(&plain, codec, &compress(codec, &records_and_more));
            let err = check(&batch, rules()).unwrap_err();
            assert!(
                matches!(err, PartitionError::InvalidRecord(_)),
                "{codec:?}: {err}"
            );
        }
    }

    /// Where each record of an uncompressed records section starts, and
    /// where its body (after the length varint) starts.
    fn record_starts(payload: &[u8]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < payload.len() {
            let start = pos;
            let len = protocol::record_batch::read_varlong(payload, &mut pos).unwrap();
            out.push((start, pos));
            pos += len as usize;
        }
        out
    }

    /// A record whose key length claims more than its record holds, inside
    /// a batch whose CRC is right: every codec reads it and names record 3.
    #[test]
    fn garbage_inside_a_record_is_invalid_record_at_its_index_in_every_codec() {
        let plain = encode(&records(10, 0), Compression::None);
        let mut payload = plain[HEADER_LEN..].to_vec();
        let (_, body) = record_starts(&payload)[3];
        // Record 3's body: attributes, timestamp delta 3, offset delta 3,
        // key length 2 ("k3").
        assert_eq!(&payload[body..body + 4], &[0, 6, 6, 4]);
        payload[body + 3] = 0x7e; // zig-zag 63: past the record's end
        for (_, codec) in CODECS {
            let batch = with_payload(&plain, codec, &compress(codec, &payload));
            let errors = rejected(check(&batch, rules()));
            assert_eq!(errors.faults.len(), 1, "{codec:?}");
            assert_eq!(errors.faults[0].0, 3, "{codec:?}");
            assert!(matches!(errors.faults[0].1, RecordFault::Malformed(_)));
            assert_eq!(PartitionError::RecordsRejected(errors).code(), 87);
        }
    }

    #[test]
    fn records_that_end_before_the_declared_count_are_invalid_in_every_codec() {
        let plain = encode(&records(10, 0), Compression::None);
        let (r9, _) = record_starts(&plain[HEADER_LEN..])[9];
        let nine = &plain[HEADER_LEN..HEADER_LEN + r9];
        for (_, codec) in CODECS {
            let batch = with_payload(&plain, codec, &compress(codec, nine));
            let errors = rejected(check(&batch, rules()));
            assert_eq!(errors.faults[0].0, 9, "{codec:?}");
        }
    }

    #[test]
    fn offset_deltas_must_count_up_from_zero_in_every_codec() {
        // Offsets 0, 2, 3: the count (3) and lastOffsetDelta (2) agree, the
        // deltas do not.
        let mut rs = records(3, 0);
        rs[1].offset = 2;
        rs[2].offset = 3;
        rs[1].sequence = 2;
        rs[2].sequence = 3;
        for (compression, codec) in CODECS {
            let mut batch = encode(&rs, compression).to_vec();
            // kafka-protocol writes lastOffsetDelta 3; make it agree with the count.
            batch[23..27].copy_from_slice(&2i32.to_be_bytes());
            rewrite::update_crc(&mut batch);
            let errors = rejected(check(&batch, rules()));
            assert_eq!(errors.faults[0].0, 1, "{codec:?}");
        }
    }

    #[test]
    fn a_compressed_stream_that_does_not_decode_is_undecodable() {
        for (compression, codec) in CODECS.into_iter().skip(1) {
            let batch = encode(&records(20, 0), compression);
            let mut bad = batch.to_vec();
            let mid = HEADER_LEN + (bad.len() - HEADER_LEN) / 2;
            for b in &mut bad[mid..] {
                *b = 0xff;
            }
            rewrite::update_crc(&mut bad);
            let err = check(&bad, rules()).unwrap_err();
            // lz4 and zstd frames carry a checksum; gzip its CRC-32; snappy
            // blocks their lengths. Any of them fails before the records do.
            assert!(
                matches!(
                    err,
                    PartitionError::UndecodableRecords(_) | PartitionError::RecordsRejected(_)
                ),
                "{codec:?}: {err:?}"
            );
            if !matches!(err, PartitionError::RecordsRejected(_)) {
                assert_eq!(err.code(), -1, "UNKNOWN_SERVER_ERROR, as Kafka");
            }
        }
    }

    #[test]
    fn a_snappy_preamble_declaring_gigabytes_is_refused_before_allocation() {
        let plain = encode(&records(1, 0), Compression::None);
        // An unframed raw block whose preamble declares 4 GiB - 1.
        let batch = with_payload(&plain, Codec::Snappy, &[0xff, 0xff, 0xff, 0xff, 0x0f]);
        for target in [None, Some(Codec::Lz4)] {
            for compacted in [false, true] {
                let err = check(
                    &batch,
                    Rules {
                        compacted,
                        target,
                        ..rules()
                    },
                )
                .unwrap_err();
                assert!(
                    matches!(err, PartitionError::UndecodableRecords(_)),
                    "{err}"
                );
            }
        }
    }

    fn stamped(timestamps: &[i64], compression: Compression) -> Bytes {
        let rs: Vec<Record> = timestamps
            .iter()
            .enumerate()
            .map(|(i, &t)| record(i, true, t))
            .collect();
        encode(&rs, compression)
    }

    #[test]
    fn create_time_records_past_after_max_ms_are_invalid_timestamp() {
        const DAY: i64 = 24 * HOUR;
        for (compression, codec) in CODECS {
            let batch = stamped(
                &[NOW, NOW + 30 * DAY, NOW + 60_000, NOW + 31 * DAY],
                compression,
            );
            let errors = rejected(check(&batch, rules()));
            let faults: Vec<(i32, RecordFault)> = errors.faults.clone();
            assert_eq!(
                faults,
                vec![
                    (
                        1,
                        RecordFault::TimestampOutOfRange {
                            timestamp_ms: NOW + 30 * DAY,
                            offset_delta: 1,
                            min_ms: NOW.wrapping_sub(i64::MAX),
                            max_ms: NOW + HOUR,
                        }
                    ),
                    (
                        3,
                        RecordFault::TimestampOutOfRange {
                            timestamp_ms: NOW + 31 * DAY,
                            offset_delta: 3,
                            min_ms: NOW.wrapping_sub(i64::MAX),
                            max_ms: NOW + HOUR,
                        }
                    ),
                ],
                "{codec:?}"
            );
            let err = PartitionError::RecordsRejected(errors);
            assert_eq!(err.code(), 32, "INVALID_TIMESTAMP");
            assert_eq!(
                err.to_string(),
                "One or more records have been rejected due to invalid timestamp"
            );
            // A minute ahead, and long ago, are fine by default.
            let ok = stamped(&[NOW + 60_000, NOW - 365 * DAY, -1], compression);
            let v = check(&ok, rules()).unwrap();
            assert_eq!(v.max_timestamp_ms, NOW + 60_000);
        }
    }

    #[test]
    fn before_max_ms_bounds_old_records_when_set() {
        let rules = Rules {
            timestamps: TimestampRule::CreateTime {
                now_ms: NOW,
                before_max_ms: HOUR,
                after_max_ms: HOUR,
            },
            ..rules()
        };
        let batch = stamped(&[NOW - HOUR, NOW - HOUR - 1], Compression::Lz4);
        let errors = rejected(check(&batch, rules));
        assert_eq!(errors.faults.len(), 1);
        assert_eq!(errors.faults[0].0, 1);
        assert!(errors.faults[0].1.message("t-0").contains(&format!(
            "within [{}, {}]",
            NOW - HOUR,
            NOW + HOUR
        )));
        // Records without a timestamp (-1) are not checked, as in Kafka.
        check(&stamped(&[-1, NOW], Compression::None), rules).unwrap();
    }

    #[test]
    fn log_append_time_topics_skip_the_bounds_but_refuse_client_log_append_time() {
        let lat = Rules {
            timestamps: TimestampRule::LogAppendTime,
            ..rules()
        };
        let far = stamped(&[NOW + 1000 * HOUR, 0], Compression::Gzip);
        check(&far, lat).unwrap();
        // A client batch that claims LogAppendTime itself.
        let mut claimed = far.to_vec();
        rewrite::set_log_append_time(&mut claimed, NOW);
        let errors = rejected(check(&claimed, lat));
        assert_eq!(errors.faults.len(), 2);
        assert!(errors
            .faults
            .iter()
            .all(|(_, f)| *f == RecordFault::LogAppendTimeFromClient));
        // On a CreateTime topic the records of such a batch carry its max
        // timestamp, which is checked like any other (Kafka's readFrom).
        assert_eq!(check(&claimed, rules()).unwrap().max_timestamp_ms, NOW);
        rewrite::set_log_append_time(&mut claimed, NOW + 2 * HOUR);
        assert!(rejected(check(&claimed, rules())).has_timestamp_fault());
    }

    #[test]
    fn the_max_timestamp_is_the_largest_record_timestamp() {
        let mut batch = stamped(&[NOW + 5, NOW + 9, NOW + 2], Compression::Snappy).to_vec();
        // A header that claims a later max than any record has.
        batch[35..43].copy_from_slice(&(NOW + 3 * HOUR).to_be_bytes());
        rewrite::update_crc(&mut batch);
        assert_eq!(check(&batch, rules()).unwrap().max_timestamp_ms, NOW + 9);
    }
}
