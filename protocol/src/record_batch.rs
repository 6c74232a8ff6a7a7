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
const CRC_START: usize = 21;
/// The smallest encoding of one record: length, attributes, timestamp delta,
/// offset delta, key length, value length, header count (7 one-byte fields).
pub const MIN_RECORD_LEN: usize = 7;

const OFF_BASE_OFFSET: usize = 0;
const OFF_BATCH_LENGTH: usize = 8;
const OFF_LEADER_EPOCH: usize = 12;
const OFF_MAGIC: usize = 16;
const OFF_CRC: usize = 17;
const OFF_ATTRIBUTES: usize = 21;
const OFF_LAST_OFFSET_DELTA: usize = 23;
const OFF_BASE_TIMESTAMP: usize = 27;
const OFF_MAX_TIMESTAMP: usize = 35;
const OFF_PRODUCER_ID: usize = 43;
const OFF_PRODUCER_EPOCH: usize = 51;
const OFF_BASE_SEQUENCE: usize = 53;
const OFF_RECORD_COUNT: usize = 57;

const ATTR_COMPRESSION_MASK: i16 = 0x07;
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

/// The compression codec in a batch's attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

/// A borrowed view of one v2 record batch. Construct with [`RecordBatchView::parse`],
/// which checks lengths (not the CRC: call [`RecordBatchView::verify_crc`]).
#[derive(Clone, Copy, Debug)]
pub struct RecordBatchView<'a> {
    bytes: &'a [u8],
}

fn i16_at(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn i64_at(b: &[u8], at: usize) -> i64 {
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
    pub fn last_offset(&self) -> i64 {
        self.base_offset() + self.last_offset_delta() as i64
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
        let crc = crc32c::crc32c(&batch[CRC_START..]);
        batch[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
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
