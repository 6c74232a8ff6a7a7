//! What the log needs to know about the inside of a stored v2 batch: the
//! header fields it indexes, and the records (key, value, timestamp) that
//! timestamp lookups and the cleaner look at.
//!
//! Stored batches were validated (CRC, framing) before they were appended,
//! but the bytes still come from disk, so every length is checked before use
//! and nothing here panics on bad input.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::compression::{Compressor, Decompressor, Gzip, Lz4, Snappy, Zstd};
use protocol::record_batch::{
    i16_at, i32_at, i64_at, read_varlong, Codec, RecordBatchView, ATTR_COMPRESSION_MASK,
    HEADER_LEN, MAGIC_V2, OFF_ATTRIBUTES, OFF_BASE_OFFSET, OFF_BASE_TIMESTAMP,
    OFF_LAST_OFFSET_DELTA, OFF_LEADER_EPOCH, OFF_MAGIC, OFF_MAX_TIMESTAMP, OFF_PRODUCER_ID,
    OFF_RECORD_COUNT,
};
use protocol::records::{RecordReader, SkipAll};

/// The header fields of one stored batch, read from its first
/// [`HEADER_LEN`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BatchHeader {
    pub base_offset: i64,
    /// The whole batch: `LOG_OVERHEAD + batchLength`.
    pub size_bytes: u64,
    pub last_offset_delta: i32,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub attributes: i16,
    pub record_count: i32,
    /// The partition leader epoch the batch was written in (-1: none).
    pub leader_epoch: i32,
}

impl BatchHeader {
    /// `None` when the prefix cannot start a v2 batch (bad length, magic or
    /// offset delta), which recovery treats as corruption.
    pub fn parse(h: &[u8]) -> Option<Self> {
        if h.len() < HEADER_LEN {
            return None;
        }
        let size_bytes = RecordBatchView::peek_len(h)? as u64;
        if h[OFF_MAGIC] as i8 != MAGIC_V2 {
            return None;
        }
        let base_offset = i64_at(h, OFF_BASE_OFFSET);
        let last_offset_delta = i32_at(h, OFF_LAST_OFFSET_DELTA);
        let record_count = i32_at(h, OFF_RECORD_COUNT);
        // Offsets far from i64::MAX keep `base + delta + 1` from overflowing.
        if base_offset < 0
            || base_offset > i64::MAX - (i32::MAX as i64) - 1
            || last_offset_delta < 0
            || record_count < 0
        {
            return None;
        }
        Some(Self {
            base_offset,
            size_bytes,
            last_offset_delta,
            max_timestamp: i64_at(h, OFF_MAX_TIMESTAMP),
            producer_id: i64_at(h, OFF_PRODUCER_ID),
            attributes: i16_at(h, OFF_ATTRIBUTES),
            record_count,
            leader_epoch: i32_at(h, OFF_LEADER_EPOCH),
        })
    }

    pub fn from_view(view: &RecordBatchView<'_>) -> Self {
        Self::parse(view.as_bytes()).expect("a parsed batch has a valid header")
    }

    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }
    pub fn next_offset(&self) -> i64 {
        self.last_offset() + 1
    }
}

/// One record inside a (decompressed) batch payload, borrowed.
#[derive(Debug)]
pub(crate) struct RawRecord<'a> {
    /// The record's full encoding, length prefix included, so the cleaner can
    /// copy a retained record without re-encoding it.
    pub bytes: &'a [u8],
    pub timestamp_delta: i64,
    pub offset_delta: i32,
    pub key: Option<&'a [u8]>,
    pub has_value: bool,
}

fn read_varint(buf: &[u8], pos: &mut usize) -> Option<i32> {
    let v = read_varlong(buf, pos)?;
    i32::try_from(v).ok()
}

/// Reads a length-prefixed byte string: `None` inside `Some` for length -1.
fn read_nullable_bytes<'a>(buf: &'a [u8], pos: &mut usize) -> Option<Option<&'a [u8]>> {
    let len = read_varint(buf, pos)?;
    if len == -1 {
        return Some(None);
    }
    let len = usize::try_from(len).ok()?;
    let end = pos.checked_add(len)?;
    let bytes = buf.get(*pos..end)?;
    *pos = end;
    Some(Some(bytes))
}

/// Splits a decompressed records payload into `count` records.
pub(crate) fn parse_records(payload: &[u8], count: i32) -> Result<Vec<RawRecord<'_>>, String> {
    let count = usize::try_from(count).map_err(|_| format!("negative record count {count}"))?;
    // Each record takes at least one byte per field, so a count larger than
    // the payload cannot be honest; checking first bounds the allocation.
    if count > payload.len() {
        return Err(format!(
            "record count {count} exceeds the {} payload bytes",
            payload.len()
        ));
    }
    let mut records = Vec::with_capacity(count);
    let mut pos = 0usize;
    for i in 0..count {
        let start = pos;
        let bad = || format!("record {i} at payload position {start} is malformed");
        let len = read_varint(payload, &mut pos).ok_or_else(bad)?;
        let len = usize::try_from(len).map_err(|_| bad())?;
        let end = pos.checked_add(len).ok_or_else(bad)?;
        let body = payload.get(pos..end).ok_or_else(bad)?;
        let mut p = 1usize; // attributes: one unused byte
        if body.is_empty() {
            return Err(bad());
        }
        let timestamp_delta = read_varlong(body, &mut p).ok_or_else(bad)?;
        let offset_delta = read_varint(body, &mut p).ok_or_else(bad)?;
        let key = read_nullable_bytes(body, &mut p).ok_or_else(bad)?;
        let value = read_nullable_bytes(body, &mut p).ok_or_else(bad)?;
        records.push(RawRecord {
            bytes: &payload[start..end],
            timestamp_delta,
            offset_delta,
            key,
            has_value: value.is_some(),
        });
        pos = end;
    }
    Ok(records)
}

fn take_all<B: Buf>(b: &mut B) -> anyhow::Result<Bytes> {
    Ok(b.copy_to_bytes(b.remaining()))
}

/// The batch's records section, decompressed with the batch's codec.
pub(crate) fn decompressed_payload(view: &RecordBatchView<'_>) -> Result<Bytes, String> {
    let codec = view.codec().map_err(|e| e.to_string())?;
    let mut payload = Bytes::copy_from_slice(view.records_payload());
    let result = match codec {
        Codec::None => Ok(payload),
        Codec::Gzip => Gzip::decompress(&mut payload, take_all),
        Codec::Snappy => Snappy::decompress(&mut payload, take_all),
        Codec::Lz4 => Lz4::decompress(&mut payload, take_all),
        Codec::Zstd => Zstd::decompress(&mut payload, take_all),
    };
    result.map_err(|e| format!("cannot decompress {codec:?} batch: {e}"))
}

fn compress(codec: Codec, raw: &[u8]) -> Result<BytesMut, String> {
    let mut out = BytesMut::new();
    let put = |b: &mut BytesMut| -> anyhow::Result<()> {
        b.put_slice(raw);
        Ok(())
    };
    let result = match codec {
        Codec::None => {
            out.put_slice(raw);
            Ok(())
        }
        Codec::Gzip => Gzip::compress(&mut out, put),
        Codec::Snappy => Snappy::compress(&mut out, put),
        Codec::Lz4 => Lz4::compress(&mut out, put),
        Codec::Zstd => Zstd::compress(&mut out, put),
    };
    result.map_err(|e| format!("cannot compress {codec:?} batch: {e}"))?;
    Ok(out)
}

/// A record's timestamp: its own for CreateTime batches; the batch's max
/// timestamp for every record of a LogAppendTime batch, as in Kafka.
pub(crate) fn record_timestamp(view: &RecordBatchView<'_>, timestamp_delta: i64) -> i64 {
    if view.is_log_append_time() {
        view.max_timestamp()
    } else {
        view.base_timestamp().wrapping_add(timestamp_delta)
    }
}

/// `(offset, timestamp)` of the first record, in batch order, for which
/// `wanted` holds. The records are streamed ([`RecordReader`]): keys and
/// values are skipped, never held, so a batch that expands to gigabytes
/// costs the codec's window.
pub(crate) fn find_record(
    view: &RecordBatchView<'_>,
    mut wanted: impl FnMut(i64, i64) -> bool,
) -> Result<Option<(i64, i64)>, String> {
    let mut reader = RecordReader::new(view).map_err(|e| e.to_string())?;
    while let Some(info) = reader
        .next_record(&mut SkipAll)
        .map_err(|e| e.to_string())?
    {
        let offset = view.base_offset() + info.offset_delta as i64;
        let timestamp = record_timestamp(view, info.timestamp_delta);
        if wanted(offset, timestamp) {
            return Ok(Some((offset, timestamp)));
        }
    }
    Ok(None)
}

/// The batch with only `retained` of its records, as Kafka's cleaner builds
/// it (`MemoryRecords.buildRetainedRecordsInto`): same base offset, last
/// offset delta, producer id, epoch and base sequence, so the producer's last
/// sequence survives cleaning; same codec; max timestamp recomputed for
/// CreateTime batches. Records are copied as encoded, which is valid because
/// their deltas are relative to the unchanged base offset and base timestamp.
pub(crate) fn rebuild_with_records(
    view: &RecordBatchView<'_>,
    retained: &[&RawRecord<'_>],
) -> Result<Vec<u8>, String> {
    let codec = view.codec().map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    for r in retained {
        raw.extend_from_slice(r.bytes);
    }
    let payload = compress(codec, &raw)?;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&view.as_bytes()[..HEADER_LEN]);
    out.extend_from_slice(&payload);
    if !view.is_log_append_time() {
        let max_timestamp = retained
            .iter()
            .map(|r| view.base_timestamp().wrapping_add(r.timestamp_delta))
            .max()
            .unwrap_or(view.max_timestamp());
        out[OFF_MAX_TIMESTAMP..OFF_MAX_TIMESTAMP + 8].copy_from_slice(&max_timestamp.to_be_bytes());
    }
    out[OFF_RECORD_COUNT..OFF_RECORD_COUNT + 4]
        .copy_from_slice(&(retained.len() as i32).to_be_bytes());
    protocol::record_batch::rewrite::seal(&mut out);
    Ok(out)
}

/// A batch header with no records, as Kafka's `DefaultRecordBatch.writeEmptyHeader`:
/// kept when the cleaner empties the last batch of a producer, so the
/// producer's epoch and last sequence are still in the log after a restart.
pub(crate) fn empty_batch_like(view: &RecordBatchView<'_>) -> Vec<u8> {
    let mut out = view.as_bytes()[..HEADER_LEN].to_vec();
    let attributes = view.attributes() & !ATTR_COMPRESSION_MASK;
    out[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    let max_timestamp = view.max_timestamp();
    out[OFF_BASE_TIMESTAMP..OFF_BASE_TIMESTAMP + 8].copy_from_slice(&max_timestamp.to_be_bytes());
    out[OFF_RECORD_COUNT..OFF_RECORD_COUNT + 4].copy_from_slice(&0i32.to_be_bytes());
    protocol::record_batch::rewrite::seal(&mut out);
    out
}
