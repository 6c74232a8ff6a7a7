//! A zero-copy view of a v2 record batch (magic 2), the only on-wire record
//! format Kafka 4.x accepts on produce.
//!
//! Layout (big-endian), from Kafka's `DefaultRecordBatch`:
//!
//! ```text
//! 0  baseOffset: int64          21 attributes: int16        43 producerId: int64
//! 8  batchLength: int32         23 lastOffsetDelta: int32   51 producerEpoch: int16
//! 12 partitionLeaderEpoch: int32 27 baseTimestamp: int64    53 baseSequence: int32
//! 16 magic: int8                35 maxTimestamp: int64      57 recordCount: int32
//! 17 crc: uint32 (CRC-32C of bytes 21..end)                 61 records...
//! ```
//!
//! Only `baseOffset`, `batchLength`-independent `partitionLeaderEpoch`, and
//! (for LogAppendTime topics) the timestamp-type bit and `maxTimestamp` are
//! ever rewritten by a broker; the first two lie outside the CRC.

use thiserror::Error;

pub const HEADER_LEN: usize = 61;
/// Bytes before `batchLength`'s payload starts: baseOffset + batchLength.
pub const LOG_OVERHEAD: usize = 12;
pub const MAGIC_V2: i8 = 2;
/// Where the CRC-covered bytes start (the attributes field).
pub const CRC_START: usize = 21;
/// The smallest encoding of one record: length, attributes, timestamp delta,
/// offset delta, key length, value length, header count (7 one-byte fields).
pub const MIN_RECORD_LEN: usize = 7;

// Header field positions. Public for readers that hold only a header's
// HEADER_LEN bytes (the log's segment walk), not a whole batch.
pub const OFF_BASE_OFFSET: usize = 0;
pub const OFF_BATCH_LENGTH: usize = 8;
pub const OFF_LEADER_EPOCH: usize = 12;
pub const OFF_MAGIC: usize = 16;
pub const OFF_CRC: usize = 17;
pub const OFF_ATTRIBUTES: usize = 21;
pub const OFF_LAST_OFFSET_DELTA: usize = 23;
pub const OFF_BASE_TIMESTAMP: usize = 27;
pub const OFF_MAX_TIMESTAMP: usize = 35;
pub const OFF_PRODUCER_ID: usize = 43;
pub const OFF_PRODUCER_EPOCH: usize = 51;
pub const OFF_BASE_SEQUENCE: usize = 53;
pub const OFF_RECORD_COUNT: usize = 57;

pub const ATTR_COMPRESSION_MASK: i16 = 0x07;
const ATTR_TIMESTAMP_TYPE: i16 = 0x08;
const ATTR_TRANSACTIONAL: i16 = 0x10;
const ATTR_CONTROL: i16 = 0x20;

/// Why bytes are not a valid v2 batch. Each maps to the Kafka error the
/// broker returns: `CorruptMessage` for framing and CRC, `InvalidRecord` for
/// inconsistent content.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BatchError {
    #[error("batch shorter than its header ({0} bytes)")]
    TooShort(usize),
    #[error("batch length field {declared} does not match the {available} bytes present")]
    LengthMismatch { declared: i64, available: usize },
    #[error("unsupported magic {0}")]
    UnsupportedMagic(i8),
    #[error("CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    #[error("record count {0} is inconsistent with the batch")]
    BadRecordCount(i32),
    #[error("unknown compression codec {0}")]
    UnknownCodec(i16),
}

/// The compression codec in a batch's attributes; the discriminant is the
/// value of the attributes' low three bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i16)]
pub enum Codec {
    None = 0,
    Gzip = 1,
    Snappy = 2,
    Lz4 = 3,
    Zstd = 4,
}

/// A borrowed view of one v2 record batch. Construct with [`RecordBatchView::parse`],
/// which checks lengths (not the CRC: call [`RecordBatchView::verify_crc`]).
#[derive(Clone, Copy, Debug)]
pub struct RecordBatchView<'a> {
    bytes: &'a [u8],
}

/// Big-endian integers at a header position; callers check the length first.
pub fn i16_at(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
pub fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
pub fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl<'a> RecordBatchView<'a> {
    /// Views `bytes` as exactly one batch: the batch length field must cover
    /// all of `bytes`.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, BatchError> {
        if bytes.len() < HEADER_LEN {
            return Err(BatchError::TooShort(bytes.len()));
        }
        let declared = i32_at(bytes, OFF_BATCH_LENGTH) as i64;
        if declared + LOG_OVERHEAD as i64 != bytes.len() as i64 {
            return Err(BatchError::LengthMismatch {
                declared,
                available: bytes.len(),
            });
        }
        let magic = bytes[OFF_MAGIC] as i8;
        if magic != MAGIC_V2 {
            return Err(BatchError::UnsupportedMagic(magic));
        }
        let view = Self { bytes };
        view.codec()?;
        let count = view.record_count();
        // Every record takes at least MIN_RECORD_LEN bytes when uncompressed;
        // compressed batches still need a non-negative count that agrees
        // with lastOffsetDelta.
        let body = bytes.len() - HEADER_LEN;
        if count < 0
            || (view.codec()? == Codec::None && (count as usize) * MIN_RECORD_LEN > body)
            || (count > 0 && view.last_offset_delta() < count - 1)
            || view.last_offset_delta() < 0
        {
            return Err(BatchError::BadRecordCount(count));
        }
        Ok(view)
    }

    /// The size of the batch starting at the front of `bytes`, if its length
    /// field can be read: `LOG_OVERHEAD + batchLength`.
    pub fn peek_len(bytes: &[u8]) -> Option<usize> {
        if bytes.len() < LOG_OVERHEAD {
            return None;
        }
        let declared = i32_at(bytes, OFF_BATCH_LENGTH);
        if declared < (HEADER_LEN - LOG_OVERHEAD) as i32 {
            return None;
        }
        Some(LOG_OVERHEAD + declared as usize)
    }

    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }
    pub fn len(&self) -> usize {
        self.bytes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    pub fn base_offset(&self) -> i64 {
        i64_at(self.bytes, OFF_BASE_OFFSET)
    }
    pub fn last_offset_delta(&self) -> i32 {
        i32_at(self.bytes, OFF_LAST_OFFSET_DELTA)
    }
    /// `baseOffset + lastOffsetDelta`, wrapping as Java's `long` does: a
    /// client's base offset is arbitrary until the leader assigns one, and
    /// a torn or hostile header must not panic whoever asks.
    pub fn last_offset(&self) -> i64 {
        self.base_offset()
            .wrapping_add(self.last_offset_delta() as i64)
    }
    pub fn partition_leader_epoch(&self) -> i32 {
        i32_at(self.bytes, OFF_LEADER_EPOCH)
    }
    pub fn magic(&self) -> i8 {
        self.bytes[OFF_MAGIC] as i8
    }
    pub fn crc(&self) -> u32 {
        i32_at(self.bytes, OFF_CRC) as u32
    }
    pub fn attributes(&self) -> i16 {
        i16_at(self.bytes, OFF_ATTRIBUTES)
    }
    pub fn codec(&self) -> Result<Codec, BatchError> {
        match self.attributes() & ATTR_COMPRESSION_MASK {
            0 => Ok(Codec::None),
            1 => Ok(Codec::Gzip),
            2 => Ok(Codec::Snappy),
            3 => Ok(Codec::Lz4),
            4 => Ok(Codec::Zstd),
            other => Err(BatchError::UnknownCodec(other)),
        }
    }
    pub fn is_log_append_time(&self) -> bool {
        self.attributes() & ATTR_TIMESTAMP_TYPE != 0
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes() & ATTR_TRANSACTIONAL != 0
    }
    pub fn is_control(&self) -> bool {
        self.attributes() & ATTR_CONTROL != 0
    }
    pub fn base_timestamp(&self) -> i64 {
        i64_at(self.bytes, OFF_BASE_TIMESTAMP)
    }
    pub fn max_timestamp(&self) -> i64 {
        i64_at(self.bytes, OFF_MAX_TIMESTAMP)
    }
    pub fn producer_id(&self) -> i64 {
        i64_at(self.bytes, OFF_PRODUCER_ID)
    }
    pub fn producer_epoch(&self) -> i16 {
        i16_at(self.bytes, OFF_PRODUCER_EPOCH)
    }
    pub fn base_sequence(&self) -> i32 {
        i32_at(self.bytes, OFF_BASE_SEQUENCE)
    }
    /// The sequence of the last record, wrapping at i32::MAX as Kafka does.
    pub fn last_sequence(&self) -> i32 {
        let base = self.base_sequence();
        if base < 0 {
            return base;
        }
        let last = base as i64 + self.last_offset_delta() as i64;
        if last > i32::MAX as i64 {
            (last - i32::MAX as i64 - 1) as i32
        } else {
            last as i32
        }
    }
    pub fn record_count(&self) -> i32 {
        i32_at(self.bytes, OFF_RECORD_COUNT)
    }
    /// The bytes after the header: records, compressed as a whole if a codec is set.
    pub fn records_payload(&self) -> &'a [u8] {
        &self.bytes[HEADER_LEN..]
    }
    pub fn compute_crc(&self) -> u32 {
        crc32c::crc32c(&self.bytes[CRC_START..])
    }
    pub fn verify_crc(&self) -> Result<(), BatchError> {
        let computed = self.compute_crc();
        let stored = self.crc();
        if computed == stored {
            Ok(())
        } else {
            Err(BatchError::CrcMismatch { stored, computed })
        }
    }
}

/// Reads a zig-zag varint (up to 64 bits) at `*pos`, advancing it: the
/// encoding of every length and delta inside a v2 record. `None` when the
/// bytes end first or the varint runs past ten bytes.
pub fn read_varlong(buf: &[u8], pos: &mut usize) -> Option<i64> {
    let mut raw: u64 = 0;
    for i in 0..10 {
        let b = *buf.get(*pos)?;
        *pos += 1;
        raw |= ((b & 0x7f) as u64) << (7 * i);
        if b & 0x80 == 0 {
            // Zig-zag decoding, as Kafka's ByteUtils.readVarlong.
            return Some(((raw >> 1) as i64) ^ -((raw & 1) as i64));
        }
    }
    None
}

/// Header rewrites a broker is allowed to make on a batch it stores.
pub mod rewrite {
    use super::*;

    pub fn set_base_offset(batch: &mut [u8], base_offset: i64) {
        batch[OFF_BASE_OFFSET..OFF_BASE_OFFSET + 8].copy_from_slice(&base_offset.to_be_bytes());
    }
    pub fn set_partition_leader_epoch(batch: &mut [u8], epoch: i32) {
        batch[OFF_LEADER_EPOCH..OFF_LEADER_EPOCH + 4].copy_from_slice(&epoch.to_be_bytes());
    }
    /// Marks the batch LogAppendTime with `timestamp` as its max timestamp and
    /// recomputes the CRC, as Kafka does for `message.timestamp.type=LogAppendTime`.
    pub fn set_log_append_time(batch: &mut [u8], timestamp: i64) {
        let attrs = i16_at(batch, OFF_ATTRIBUTES) | ATTR_TIMESTAMP_TYPE;
        batch[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attrs.to_be_bytes());
        batch[OFF_MAX_TIMESTAMP..OFF_MAX_TIMESTAMP + 8].copy_from_slice(&timestamp.to_be_bytes());
        update_crc(batch);
    }
    /// Marks the batch CreateTime with `max_timestamp` as its max timestamp,
    /// as Kafka's LogValidator does on a CreateTime topic with the largest
    /// record timestamp it read; recomputes the CRC only if either changed.
    pub fn set_create_time(batch: &mut [u8], max_timestamp: i64) {
        let attrs = i16_at(batch, OFF_ATTRIBUTES);
        let create_time = attrs & !ATTR_TIMESTAMP_TYPE;
        if attrs == create_time && i64_at(batch, OFF_MAX_TIMESTAMP) == max_timestamp {
            return;
        }
        batch[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&create_time.to_be_bytes());
        batch[OFF_MAX_TIMESTAMP..OFF_MAX_TIMESTAMP + 8]
            .copy_from_slice(&max_timestamp.to_be_bytes());
        update_crc(batch);
    }
    /// Marks the batch as compressed with `codec`; the caller replaces the
    /// records and then calls [`seal`].
    pub fn set_codec(batch: &mut [u8], codec: Codec) {
        let attrs = (i16_at(batch, OFF_ATTRIBUTES) & !ATTR_COMPRESSION_MASK) | codec as i16;
        batch[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attrs.to_be_bytes());
    }
    /// Recomputes the CRC after a change to anything from the attributes on.
    pub fn update_crc(batch: &mut [u8]) {
        let crc = crc32c::crc32c(&batch[CRC_START..]);
        batch[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    }
    /// Sets the batch length from `batch` (exactly one batch) and recomputes
    /// the CRC: for a batch whose records were rebuilt.
    pub fn seal(batch: &mut [u8]) {
        let batch_length = (batch.len() - LOG_OVERHEAD) as i32;
        batch[OFF_BATCH_LENGTH..OFF_BATCH_LENGTH + 4].copy_from_slice(&batch_length.to_be_bytes());
        update_crc(batch);
    }
}

/// Iterates the batches in a records blob (a produce request's `records`, a
/// fetch response, or a run of a segment file). Stops with an error at the
/// first batch that does not parse; a trailing partial batch is reported as
/// [`BatchIterItem::Partial`] so fetch readers and recovery can tell a torn
/// tail from corruption.
pub struct BatchIter<'a> {
    rest: &'a [u8],
    position: usize,
}

#[derive(Debug)]
pub enum BatchIterItem<'a> {
    Batch {
        position: usize,
        batch: RecordBatchView<'a>,
    },
    /// Fewer bytes remain than the next batch declares (or than a header).
    Partial {
        position: usize,
        remaining: usize,
    },
    Invalid {
        position: usize,
        error: BatchError,
    },
}

impl<'a> BatchIter<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self {
            rest: bytes,
            position: 0,
        }
    }
}

impl<'a> Iterator for BatchIter<'a> {
    type Item = BatchIterItem<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let position = self.position;
        let Some(len) = RecordBatchView::peek_len(self.rest) else {
            let remaining = self.rest.len();
            self.rest = &[];
            return Some(if remaining < LOG_OVERHEAD {
                BatchIterItem::Partial {
                    position,
                    remaining,
                }
            } else {
                BatchIterItem::Invalid {
                    position,
                    error: BatchError::TooShort(remaining),
                }
            });
        };
        if len > self.rest.len() {
            let remaining = self.rest.len();
            self.rest = &[];
            return Some(BatchIterItem::Partial {
                position,
                remaining,
            });
        }
        let (this, rest) = self.rest.split_at(len);
        self.rest = rest;
        self.position += len;
        Some(match RecordBatchView::parse(this) {
            Ok(batch) => BatchIterItem::Batch { position, batch },
            Err(error) => {
                self.rest = &[];
                BatchIterItem::Invalid { position, error }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
        TimestampType,
    };

    fn record(offset: i64, sequence: i32, transactional: bool) -> Record {
        let mut headers = kafka_protocol::indexmap::IndexMap::new();
        headers.insert(
            StrBytes::from_static_str("h"),
            Some(Bytes::from_static(b"v")),
        );
        Record {
            transactional,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 5,
            producer_id: 42,
            producer_epoch: 3,
            timestamp_type: TimestampType::Creation,
            offset,
            sequence,
            timestamp: 1000 + offset,
            key: Some(Bytes::from(format!("key-{offset}"))),
            value: Some(Bytes::from(vec![b'x'; 100])),
            headers,
        }
    }

    fn encode(records: &[Record], compression: Compression) -> Vec<u8> {
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .expect("encodes");
        buf.to_vec()
    }

    fn three_records() -> Vec<Record> {
        (0..3).map(|i| record(i, 10 + i as i32, false)).collect()
    }

    const CODECS: [(Compression, Codec); 5] = [
        (Compression::None, Codec::None),
        (Compression::Gzip, Codec::Gzip),
        (Compression::Snappy, Codec::Snappy),
        (Compression::Lz4, Codec::Lz4),
        (Compression::Zstd, Codec::Zstd),
    ];

    #[test]
    fn reads_the_header_of_batches_in_every_codec() {
        for (compression, codec) in CODECS {
            let bytes = encode(&three_records(), compression);
            let batch = RecordBatchView::parse(&bytes).expect("parses");
            batch.verify_crc().expect("crc");
            assert_eq!(batch.codec(), Ok(codec));
            assert_eq!(batch.len(), bytes.len());
            assert_eq!(batch.magic(), MAGIC_V2);
            assert_eq!(batch.base_offset(), 0);
            assert_eq!(batch.last_offset_delta(), 2);
            assert_eq!(batch.last_offset(), 2);
            assert_eq!(batch.record_count(), 3);
            assert_eq!(batch.partition_leader_epoch(), 5);
            assert_eq!(batch.producer_id(), 42);
            assert_eq!(batch.producer_epoch(), 3);
            assert_eq!(batch.base_sequence(), 10);
            assert_eq!(batch.last_sequence(), 12);
            assert_eq!(batch.base_timestamp(), 1000);
            assert_eq!(batch.max_timestamp(), 1002);
            assert!(!batch.is_transactional());
            assert!(!batch.is_control());
            assert!(!batch.is_log_append_time());
            assert_eq!(
                batch.records_payload().len(),
                bytes.len() - HEADER_LEN,
                "{codec:?}"
            );
        }
    }

    #[test]
    fn transactional_flag_is_read() {
        let records: Vec<_> = (0..2).map(|i| record(i, i as i32, true)).collect();
        let bytes = encode(&records, Compression::None);
        let batch = RecordBatchView::parse(&bytes).expect("parses");
        assert!(batch.is_transactional());
    }

    #[test]
    fn a_flipped_byte_is_a_crc_mismatch() {
        for (compression, _) in CODECS {
            let mut bytes = encode(&three_records(), compression);
            let last = bytes.len() - 1;
            bytes[last] ^= 0x01;
            let batch = RecordBatchView::parse(&bytes).expect("still parses");
            assert!(matches!(
                batch.verify_crc(),
                Err(BatchError::CrcMismatch { .. })
            ));
        }
    }

    #[test]
    fn every_flip_inside_the_crc_range_is_caught() {
        let original = encode(&three_records(), Compression::None);
        for at in CRC_START..original.len() {
            let mut bytes = original.clone();
            bytes[at] ^= 0x40;
            // Either the header no longer makes sense, or the CRC says so.
            if let Ok(batch) = RecordBatchView::parse(&bytes) {
                assert!(batch.verify_crc().is_err(), "flip at {at} undetected");
            }
        }
    }

    #[test]
    fn rewrites_keep_the_batch_valid() {
        for (compression, _) in CODECS {
            let mut bytes = encode(&three_records(), compression);
            rewrite::set_base_offset(&mut bytes, 100);
            rewrite::set_partition_leader_epoch(&mut bytes, 9);
            // Both live before the CRC range.
            let batch = RecordBatchView::parse(&bytes).expect("parses");
            batch.verify_crc().expect("crc unaffected");
            assert_eq!(batch.base_offset(), 100);
            assert_eq!(batch.last_offset(), 102);
            assert_eq!(batch.partition_leader_epoch(), 9);

            rewrite::set_log_append_time(&mut bytes, 5555);
            let batch = RecordBatchView::parse(&bytes).expect("parses");
            batch.verify_crc().expect("crc recomputed");
            assert!(batch.is_log_append_time());
            assert_eq!(batch.max_timestamp(), 5555);

            // Back to CreateTime with the records' own maximum.
            rewrite::set_create_time(&mut bytes, 1002);
            let batch = RecordBatchView::parse(&bytes).expect("parses");
            batch.verify_crc().expect("crc recomputed");
            assert!(!batch.is_log_append_time());
            assert_eq!(batch.max_timestamp(), 1002);
            // Nothing to change: the bytes stay as they are.
            let before = bytes.clone();
            rewrite::set_create_time(&mut bytes, 1002);
            assert_eq!(bytes, before);

            // kafka-protocol reads the rewritten batch back.
            let mut buf = Bytes::from(bytes);
            let set = RecordBatchDecoder::decode(&mut buf).expect("decodes");
            let offsets: Vec<i64> = set.records.iter().map(|r| r.offset).collect();
            assert_eq!(offsets, vec![100, 101, 102]);
        }
    }

    #[test]
    fn last_sequence_wraps_like_kafka() {
        let records: Vec<_> = [i32::MAX - 1, i32::MAX, i32::MIN]
            .into_iter()
            .enumerate()
            .map(|(i, sequence)| record(i as i64, sequence, false))
            .collect();
        let bytes = encode(&records, Compression::None);
        let batch = RecordBatchView::parse(&bytes).expect("parses");
        assert_eq!(batch.record_count(), 3);
        assert_eq!(batch.base_sequence(), i32::MAX - 1);
        assert_eq!(batch.last_sequence(), 0);
    }

    #[test]
    fn iterates_batches_and_reports_a_torn_tail_as_partial() {
        let first = encode(&three_records(), Compression::None);
        let second = encode(&three_records(), Compression::Lz4);
        for cut in 0..second.len() {
            let mut blob = first.clone();
            blob.extend_from_slice(&second[..cut]);
            let items: Vec<_> = BatchIter::new(&blob).collect();
            assert!(
                matches!(items[0], BatchIterItem::Batch { position: 0, .. }),
                "{items:?}"
            );
            if cut == 0 {
                assert_eq!(items.len(), 1);
            } else {
                assert_eq!(items.len(), 2);
                assert!(
                    matches!(items[1], BatchIterItem::Partial { position, remaining }
                        if position == first.len() && remaining == cut),
                    "cut {cut}: {:?}",
                    items[1]
                );
            }
        }
        let mut blob = first.clone();
        blob.extend_from_slice(&second);
        let positions: Vec<_> = BatchIter::new(&blob)
            .map(|item| match item {
                BatchIterItem::Batch { position, batch } => (position, batch.len()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            positions,
            vec![(0, first.len()), (first.len(), second.len())]
        );
    }

    #[test]
    fn refuses_inconsistent_headers() {
        let bytes = encode(&three_records(), Compression::None);
        assert_eq!(
            RecordBatchView::parse(&bytes[..HEADER_LEN - 1]).unwrap_err(),
            BatchError::TooShort(HEADER_LEN - 1)
        );
        assert!(matches!(
            RecordBatchView::parse(&bytes[..bytes.len() - 1]),
            Err(BatchError::LengthMismatch { .. })
        ));
        let mut bad_magic = bytes.clone();
        bad_magic[OFF_MAGIC] = 1;
        assert_eq!(
            RecordBatchView::parse(&bad_magic).unwrap_err(),
            BatchError::UnsupportedMagic(1)
        );
        let mut bad_codec = bytes.clone();
        bad_codec[OFF_ATTRIBUTES + 1] |= 0x07;
        assert_eq!(
            RecordBatchView::parse(&bad_codec).unwrap_err(),
            BatchError::UnknownCodec(7)
        );
        let mut huge_count = bytes.clone();
        huge_count[OFF_RECORD_COUNT..OFF_RECORD_COUNT + 4].copy_from_slice(&i32::MAX.to_be_bytes());
        assert_eq!(
            RecordBatchView::parse(&huge_count).unwrap_err(),
            BatchError::BadRecordCount(i32::MAX)
        );
        let mut negative_count = bytes;
        negative_count[OFF_RECORD_COUNT..OFF_RECORD_COUNT + 4]
            .copy_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(
            RecordBatchView::parse(&negative_count).unwrap_err(),
            BatchError::BadRecordCount(-1)
        );
    }
}
