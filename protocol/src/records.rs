//! Streaming reads of the records inside a v2 batch.
//!
//! A batch's records section may be compressed as a whole, and what a few
//! hundred compressed bytes expand to is the sender's choice. Everything
//! that looks inside a batch (produce validation, recompression, timestamp
//! lookups, the log cleaner) reads it through [`RecordReader`]: the codec
//! decodes into a fixed window, each record is parsed field by field as the
//! bytes come, and keys, values and headers are handed to a
//! [`RecordVisitor`] in pieces, never held whole. Memory is the codec's
//! window plus [`CHUNK_LEN`], whatever the batch claims.
//!
//! Parsing follows Kafka's `DefaultRecord.readFrom`: a record is its body
//! length (varint), then attributes, timestamp delta (varlong), offset delta,
//! key, value and headers (varint lengths, -1 for null), and the fields must
//! fill the declared body length exactly.

use std::io::{self, BufRead, BufReader, Read, Write};

use thiserror::Error;

use crate::record_batch::{Codec, RecordBatchView};

/// The largest piece of a key, value or header a visitor is given at once.
pub const CHUNK_LEN: usize = 8 * 1024;

/// snappy-java's stream header, which Kafka's snappy batches carry.
pub const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
/// The header: the magic, then version and minimum compatible version (int32 each).
pub const XERIAL_HEADER_LEN: usize = 16;
/// The most a raw snappy block can expand: its densest element is a 3-byte
/// copy of 64 bytes. A block whose preamble declares more than this times
/// its compressed length cannot be valid, and is refused before room is made
/// for it (librdkafka writes a whole batch as one unframed block, so no fixed
/// block size would do).
pub const SNAPPY_MAX_EXPANSION: usize = 22;

/// Why a batch's records cannot be read. Each maps to the code Kafka gives
/// on produce: `Corrupt` is CORRUPT_MESSAGE (the compressed stream itself is
/// broken), `Invalid` is INVALID_RECORD (a record's fields are inconsistent).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RecordError {
    #[error("records cannot be decompressed: {0}")]
    Corrupt(String),
    #[error("record {index} is invalid: {reason}")]
    Invalid { index: i32, reason: String },
    #[error("bytes after the last of {count} records")]
    TrailingBytes { count: i32 },
    /// The visitor's [`RecordVisitor::raw`] failed (a capped output full, say).
    #[error("copying record {index} failed: {reason}")]
    Sink {
        index: i32,
        kind: io::ErrorKind,
        reason: String,
    },
}

impl RecordError {
    /// The batch index of the record at fault, when one is.
    pub fn index(&self) -> Option<i32> {
        match self {
            RecordError::Invalid { index, .. } => Some(*index),
            _ => None,
        }
    }
}

/// The fields of one record, without its key, value and header bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordInfo {
    /// Position in the batch, from 0.
    pub index: i32,
    /// The record's body length: the bytes after its length varint.
    pub body_len: u32,
    /// The bytes of the length varint as read (1 to 5: Kafka accepts a
    /// length written in more bytes than it needs).
    pub length_len: u8,
    pub attributes: i8,
    pub timestamp_delta: i64,
    pub offset_delta: i32,
    /// -1 for a null key.
    pub key_len: i32,
    /// -1 for a null value (a tombstone).
    pub value_len: i32,
    pub header_count: i32,
}

impl RecordInfo {
    /// The whole encoding: the length varint plus the body.
    pub fn encoded_len(&self) -> u64 {
        u64::from(self.length_len) + u64::from(self.body_len)
    }
}

/// Which part of a record a piece of bytes belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Key,
    Value,
    HeaderKey,
    HeaderValue,
}

/// Receives a record's bytes while it is read. Every method has a default
/// that ignores its input, so a reader that only needs the fields
/// ([`RecordInfo`]) implements nothing.
pub trait RecordVisitor {
    /// Whether [`RecordVisitor::bytes`] wants `part`; parts it does not want
    /// are skipped without being copied anywhere.
    fn wants(&self, _part: Part) -> bool {
        false
    }
    /// A piece (at most [`CHUNK_LEN`]) of a key, value or header.
    fn bytes(&mut self, _part: Part, _piece: &[u8]) {}
    /// Every byte of the record's encoding, in order and in pieces, length
    /// varint included: for copying a record without re-encoding it.
    fn wants_raw(&self) -> bool {
        false
    }
    fn raw(&mut self, _piece: &[u8]) -> io::Result<()> {
        Ok(())
    }
}

/// Reads nothing but the fields.
pub struct SkipAll;
impl RecordVisitor for SkipAll {}

/// A streaming decoder of a records section compressed with `codec`. The
/// uncompressed case borrows the payload.
pub fn decompressor<'a>(codec: Codec, payload: &'a [u8]) -> io::Result<Box<dyn BufRead + 'a>> {
    const WINDOW: usize = 16 * 1024;
    Ok(match codec {
        Codec::None => Box::new(payload),
        Codec::Gzip => Box::new(BufReader::with_capacity(
            WINDOW,
            flate2::bufread::MultiGzDecoder::new(payload),
        )),
        Codec::Snappy => Box::new(BufReader::with_capacity(WINDOW, XerialReader::new(payload))),
        Codec::Lz4 => Box::new(BufReader::with_capacity(
            WINDOW,
            lz4::Decoder::new(payload)?,
        )),
        Codec::Zstd => Box::new(BufReader::with_capacity(
            WINDOW,
            zstd::stream::read::Decoder::with_buffer(payload)?,
        )),
    })
}

/// Reads a batch's records one at a time; see the module docs.
pub struct RecordReader<'a> {
    input: Box<dyn BufRead + 'a>,
    count: i32,
    next_index: i32,
}

impl<'a> RecordReader<'a> {
    pub fn new(view: &RecordBatchView<'a>) -> Result<Self, RecordError> {
        let codec = view
            .codec()
            .map_err(|e| RecordError::Corrupt(e.to_string()))?;
        let input = decompressor(codec, view.records_payload()).map_err(corrupt)?;
        Ok(Self {
            input,
            count: view.record_count().max(0),
            next_index: 0,
        })
    }

    /// How many records the batch declares.
    pub fn count(&self) -> i32 {
        self.count
    }

    /// The next record's fields, its bytes given to `visitor` as they are
    /// read; `None` once the declared count has been read.
    ///
    /// A record that lies whole in the decoder's current window (every
    /// record of an uncompressed batch, most of a compressed one) is parsed
    /// from that slice, without a call into the decoder per field; one that
    /// straddles the window's end is read through the decoder.
    pub fn next_record(
        &mut self,
        visitor: &mut impl RecordVisitor,
    ) -> Result<Option<RecordInfo>, RecordError> {
        if self.next_index >= self.count {
            return Ok(None);
        }
        let index = self.next_index;
        self.next_index += 1;
        let whole = {
            let window = self.input.fill_buf().map_err(corrupt)?;
            match whole_record_len(window) {
                Some(len) => {
                    let mut record = &window[..len];
                    Some((read_record(&mut record, visitor, index)?, len))
                }
                None => None,
            }
        };
        Ok(Some(match whole {
            Some((info, len)) => {
                self.input.consume(len);
                info
            }
            None => read_record(&mut *self.input, visitor, index)?,
        }))
    }

    /// Checks that nothing follows the declared records. Call after
    /// [`RecordReader::next_record`] returned `None`; Kafka refuses a batch
    /// with bytes after its last record.
    pub fn finish(mut self) -> Result<(), RecordError> {
        let buf = self.input.fill_buf().map_err(corrupt)?;
        if buf.is_empty() {
            Ok(())
        } else {
            Err(RecordError::TrailingBytes { count: self.count })
        }
    }
}

/// The encoded length of the record at the front of `window`, if its length
/// varint is valid and the whole record is there.
fn whole_record_len(window: &[u8]) -> Option<usize> {
    let mut raw: u32 = 0;
    for (i, &b) in window.iter().take(5).enumerate() {
        if i == 4 && b > 0x0f {
            return None;
        }
        raw |= u32::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            let body_len = ((raw >> 1) as i32) ^ -((raw & 1) as i32);
            let len = (i + 1).checked_add(usize::try_from(body_len).ok()?)?;
            return (len <= window.len()).then_some(len);
        }
    }
    None
}

/// Reads one record from `input` as Kafka's `DefaultRecord.readFrom`,
/// giving its bytes to `visitor`.
fn read_record<R: BufRead + ?Sized>(
    input: &mut R,
    visitor: &mut impl RecordVisitor,
    index: i32,
) -> Result<RecordInfo, RecordError> {
    let mut r = Fields {
        input,
        visitor,
        index,
        left: u64::MAX,
        head: [0; 10],
        head_len: 0,
    };
    let body_len = r.varint("length")?;
    // Nothing else is in `head` yet: these are the varint's bytes.
    let length_len = r.head_len as u8;
    if body_len < 0 {
        return Err(r.invalid(format!("negative record length {body_len}")));
    }
    r.flush_head()?;
    r.left = body_len as u64;
    let attributes = r.byte("attributes")? as i8;
    let timestamp_delta = r.varlong("timestamp delta")?;
    let offset_delta = r.varint("offset delta")?;
    let key_len = r.length("key", Part::Key, -1)?;
    let value_len = r.length("value", Part::Value, -1)?;
    let header_count = r.varint("header count")?;
    if header_count < 0 {
        return Err(r.invalid(format!("invalid number of record headers {header_count}")));
    }
    for _ in 0..header_count {
        r.length("header key", Part::HeaderKey, 0)?;
        r.length("header value", Part::HeaderValue, -1)?;
    }
    r.flush_head()?;
    if r.left != 0 {
        return Err(r.invalid(format!(
            "expected to read {body_len} bytes in record payload, but {} were left over",
            r.left
        )));
    }
    Ok(RecordInfo {
        index,
        body_len: body_len as u32,
        length_len,
        attributes,
        timestamp_delta,
        offset_delta,
        key_len,
        value_len,
        header_count,
    })
}

fn corrupt(e: io::Error) -> RecordError {
    RecordError::Corrupt(e.to_string())
}

/// The length of `v` as a zig-zag varint.
pub fn varint_len(v: i64) -> usize {
    let mut raw = ((v << 1) ^ (v >> 63)) as u64;
    let mut n = 1;
    while raw >= 0x80 {
        raw >>= 7;
        n += 1;
    }
    n
}

/// One record's field reader: counts the body bytes left and forwards raw
/// bytes to the visitor.
struct Fields<'r, R: BufRead + ?Sized, V: RecordVisitor> {
    input: &'r mut R,
    visitor: &'r mut V,
    index: i32,
    /// Body bytes not yet read; `u64::MAX` while reading the length itself.
    left: u64,
    /// Raw bytes of the varints and fixed fields read since the last flush.
    head: [u8; 10],
    head_len: usize,
}

impl<R: BufRead + ?Sized, V: RecordVisitor> Fields<'_, R, V> {
    fn invalid(&self, reason: String) -> RecordError {
        RecordError::Invalid {
            index: self.index,
            reason,
        }
    }

    fn truncated(&self, field: &str) -> RecordError {
        if self.left == 0 {
            self.invalid(format!("{field} runs past the record's declared length"))
        } else {
            self.invalid(format!("{field} runs past the end of the records"))
        }
    }

    fn flush_head(&mut self) -> Result<(), RecordError> {
        if self.head_len > 0 && self.visitor.wants_raw() {
            self.visitor
                .raw(&self.head[..self.head_len])
                .map_err(|e| self.raw_failed(e))?;
        }
        self.head_len = 0;
        Ok(())
    }

    fn raw_failed(&self, e: io::Error) -> RecordError {
        RecordError::Sink {
            index: self.index,
            kind: e.kind(),
            reason: e.to_string(),
        }
    }

    fn byte(&mut self, field: &str) -> Result<u8, RecordError> {
        if self.left == 0 {
            return Err(self.truncated(field));
        }
        let buf = self.input.fill_buf().map_err(corrupt)?;
        let Some(&b) = buf.first() else {
            return Err(self.truncated(field));
        };
        self.input.consume(1);
        if self.left != u64::MAX {
            self.left -= 1;
        }
        if self.head_len == self.head.len() {
            self.flush_head()?;
        }
        self.head[self.head_len] = b;
        self.head_len += 1;
        Ok(b)
    }

    fn varlong(&mut self, field: &str) -> Result<i64, RecordError> {
        let mut raw: u64 = 0;
        for i in 0..10 {
            let b = self.byte(field)?;
            raw |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64));
            }
        }
        Err(self.invalid(format!("{field}: varlong longer than 10 bytes")))
    }

    /// A 32-bit zig-zag varint, as Kafka's `ByteUtils.readVarint`: at most
    /// five bytes.
    fn varint(&mut self, field: &str) -> Result<i32, RecordError> {
        let mut raw: u32 = 0;
        for i in 0..5 {
            let b = self.byte(field)?;
            if i == 4 && b > 0x0f {
                return Err(self.invalid(format!("{field}: varint above 32 bits")));
            }
            raw |= u32::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(((raw >> 1) as i32) ^ -((raw & 1) as i32));
            }
        }
        Err(self.invalid(format!("{field}: varint longer than 5 bytes")))
    }

    /// A length-prefixed field; `min` is the smallest length allowed (-1
    /// where null is). Its bytes go to the visitor or are skipped.
    fn length(&mut self, field: &str, part: Part, min: i32) -> Result<i32, RecordError> {
        let len = self.varint(field)?;
        if len < min {
            return Err(self.invalid(format!("{field} has invalid length {len}")));
        }
        self.flush_head()?;
        let mut n = len.max(0) as u64;
        if n > self.left {
            return Err(self.invalid(format!(
                "{field} of {n} bytes runs past the record's declared length"
            )));
        }
        let wanted = self.visitor.wants(part);
        let raw = self.visitor.wants_raw();
        while n > 0 {
            let buf = self.input.fill_buf().map_err(corrupt)?;
            if buf.is_empty() {
                return Err(self.truncated(field));
            }
            let take = buf.len().min(CHUNK_LEN).min(n as usize);
            let piece = &buf[..take];
            if wanted {
                self.visitor.bytes(part, piece);
            }
            if raw {
                if let Err(e) = self.visitor.raw(piece) {
                    return Err(self.raw_failed(e));
                }
            }
            self.input.consume(take);
            n -= take as u64;
            self.left -= take as u64;
        }
        Ok(len)
    }
}

/// Reads snappy-java's framing (the header, then raw snappy blocks each
/// prefixed with its compressed length) one block at a time; without the
/// header the payload is one raw snappy block, as snappy-java and Kafka
/// accept. A block's declared decompressed length is checked against
/// [`SNAPPY_MAX_EXPANSION`] before room is made for it.
pub struct XerialReader<'a> {
    rest: &'a [u8],
    framed: bool,
    block: Vec<u8>,
    pos: usize,
}

impl<'a> XerialReader<'a> {
    pub fn new(payload: &'a [u8]) -> Self {
        let framed = payload.len() >= XERIAL_HEADER_LEN && payload[..8] == XERIAL_MAGIC;
        XerialReader {
            rest: if framed {
                &payload[XERIAL_HEADER_LEN..]
            } else {
                payload
            },
            framed,
            block: Vec::new(),
            pos: 0,
        }
    }

    fn next_block(&mut self) -> io::Result<bool> {
        if self.rest.is_empty() {
            return Ok(false);
        }
        let compressed = if self.framed {
            if self.rest.len() < 4 {
                return Err(invalid_data("truncated snappy block length"));
            }
            let len = u32::from_be_bytes([self.rest[0], self.rest[1], self.rest[2], self.rest[3]])
                as usize;
            if len > self.rest.len() - 4 {
                return Err(invalid_data("snappy block longer than the batch"));
            }
            let block = &self.rest[4..4 + len];
            self.rest = &self.rest[4 + len..];
            block
        } else {
            std::mem::take(&mut self.rest)
        };
        let n = snap::raw::decompress_len(compressed).map_err(|e| invalid_data(&e.to_string()))?;
        if n > compressed.len().saturating_mul(SNAPPY_MAX_EXPANSION) {
            return Err(invalid_data(&format!(
                "snappy block of {} bytes declares {n} bytes, more than it can hold",
                compressed.len()
            )));
        }
        self.block.resize(n, 0);
        snap::raw::Decoder::new()
            .decompress(compressed, &mut self.block)
            .map_err(|e| invalid_data(&e.to_string()))?;
        self.pos = 0;
        Ok(true)
    }
}

impl Read for XerialReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.block.len() {
            if !self.next_block()? {
                return Ok(0);
            }
        }
        let n = out.len().min(self.block.len() - self.pos);
        out[..n].copy_from_slice(&self.block[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fn invalid_data(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

/// snappy-java's default block size, which Kafka's producers write.
const XERIAL_BLOCK_LEN: usize = 32 * 1024;

/// A streaming compressor for a records section: records' encodings are
/// written in (as [`RecordVisitor::raw`] gives them), the compressed
/// section comes out of [`RecordsCompressor::finish`]. The output is held in
/// memory and capped: a write that would take it past `max_len` fails with
/// [`io::ErrorKind::WriteZero`], so nothing built this way can outgrow the
/// caller's bound, whatever the input expands to. Snappy is written in
/// snappy-java's framing, as Kafka's producers write it.
pub struct RecordsCompressor {
    inner: Encoder,
}

enum Encoder {
    None(Capped),
    Gzip(flate2::write::GzEncoder<Capped>),
    Snappy(XerialWriter),
    Lz4(lz4::Encoder<Capped>),
    Zstd(zstd::stream::write::Encoder<'static, Capped>),
}

impl RecordsCompressor {
    pub fn new(codec: Codec, max_len: usize) -> io::Result<Self> {
        let out = Capped {
            buf: Vec::new(),
            max_len,
        };
        let inner = match codec {
            Codec::None => Encoder::None(out),
            Codec::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
                out,
                flate2::Compression::default(),
            )),
            Codec::Snappy => Encoder::Snappy(XerialWriter::new(out)?),
            Codec::Lz4 => Encoder::Lz4(lz4::EncoderBuilder::new().build(out)?),
            Codec::Zstd => Encoder::Zstd(zstd::stream::write::Encoder::new(out, 3)?),
        };
        Ok(Self { inner })
    }

    /// The compressed section (`WriteZero` if its end did not fit).
    pub fn finish(self) -> io::Result<Vec<u8>> {
        Ok(match self.inner {
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

impl Write for RecordsCompressor {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        match &mut self.inner {
            Encoder::None(w) => w.write(data),
            Encoder::Gzip(w) => w.write(data),
            Encoder::Snappy(w) => w.write(data),
            Encoder::Lz4(w) => w.write(data),
            Encoder::Zstd(w) => w.write(data),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match &mut self.inner {
            Encoder::None(w) => w.flush(),
            Encoder::Gzip(w) => w.flush(),
            Encoder::Snappy(w) => w.flush(),
            Encoder::Lz4(w) => w.flush(),
            Encoder::Zstd(w) => w.flush(),
        }
    }
}

/// An in-memory writer that refuses to grow past `max_len` bytes.
struct Capped {
    buf: Vec<u8>,
    max_len: usize,
}

impl Write for Capped {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if data.len() > self.max_len - self.buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("compressed records exceed {} bytes", self.max_len),
            ));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes snappy-java's framing: the header, then raw snappy blocks of at
/// most [`XERIAL_BLOCK_LEN`] input bytes, each prefixed with its length.
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
        Ok(Self {
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
            .map_err(|e| invalid_data(&e.to_string()))?;
        let len = u32::try_from(block.len()).map_err(|_| invalid_data("snappy block too long"))?;
        self.out.write_all(&len.to_be_bytes())?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record_batch::{rewrite, HEADER_LEN};
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    const CODECS: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    fn records(n: usize) -> Vec<Record> {
        (0..n)
            .map(|i| Record {
                transactional: false,
                delete_horizon: false,
                control: false,
                partition_leader_epoch: 0,
                producer_id: 7,
                producer_epoch: 1,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: i as i32,
                timestamp: 1_000 + i as i64,
                key: (i % 3 != 0).then(|| Bytes::from(format!("k{i}"))),
                value: (i % 5 != 0).then(|| Bytes::from(format!("value {i} ").repeat(i % 40))),
                headers: [(
                    format!("h{i}").into(),
                    (i % 2 == 0).then(|| Bytes::from_static(b"hv")),
                )]
                .into_iter()
                .collect(),
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

    /// Collects keys, values and the raw encoding.
    #[derive(Default)]
    struct Collect {
        key: Vec<u8>,
        value: Vec<u8>,
        raw: Vec<u8>,
    }
    impl RecordVisitor for Collect {
        fn wants(&self, part: Part) -> bool {
            matches!(part, Part::Key | Part::Value)
        }
        fn bytes(&mut self, part: Part, piece: &[u8]) {
            match part {
                Part::Key => self.key.extend_from_slice(piece),
                Part::Value => self.value.extend_from_slice(piece),
                _ => unreachable!("not wanted"),
            }
        }
        fn wants_raw(&self) -> bool {
            true
        }
        fn raw(&mut self, piece: &[u8]) -> io::Result<()> {
            self.raw.extend_from_slice(piece);
            Ok(())
        }
    }

    #[test]
    fn every_codec_reads_every_field() {
        let original = records(200);
        let plain = encode(&original, Compression::None);
        for compression in CODECS {
            let batch = encode(&original, compression);
            let view = RecordBatchView::parse(&batch).unwrap();
            let mut reader = RecordReader::new(&view).unwrap();
            let mut raw = Vec::new();
            for (i, want) in original.iter().enumerate() {
                let mut c = Collect::default();
                let info = reader.next_record(&mut c).unwrap().unwrap();
                assert_eq!(info.index, i as i32);
                assert_eq!(info.offset_delta, i as i32);
                assert_eq!(info.timestamp_delta, i as i64);
                assert_eq!(
                    info.key_len,
                    want.key.as_ref().map_or(-1, |k| k.len() as i32)
                );
                assert_eq!(
                    info.value_len,
                    want.value.as_ref().map_or(-1, |v| v.len() as i32)
                );
                assert_eq!(info.header_count, 1);
                assert_eq!(c.key, want.key.clone().unwrap_or_default());
                assert_eq!(c.value, want.value.clone().unwrap_or_default());
                assert_eq!(info.encoded_len(), c.raw.len() as u64);
                raw.extend_from_slice(&c.raw);
            }
            assert!(reader.next_record(&mut SkipAll).unwrap().is_none());
            reader.finish().unwrap();
            // The raw pieces are the uncompressed records section, byte for byte.
            assert_eq!(raw, &plain[HEADER_LEN..], "{compression:?}");
        }
    }

    /// Records larger than a decoder's window are read through the decoder,
    /// smaller ones from the window's slice: both give the same fields,
    /// pieces and raw bytes, in every codec.
    #[test]
    fn records_inside_and_across_the_window_read_alike() {
        let sizes = [10usize, 20_000, 300, 16_000, 5, 40_000, 1];
        let original: Vec<Record> = records(30)
            .into_iter()
            .enumerate()
            .map(|(i, r)| Record {
                value: Some(Bytes::from(
                    (0..sizes[i % sizes.len()])
                        .map(|j| (j * 7 + i) as u8)
                        .collect::<Vec<u8>>(),
                )),
                ..r
            })
            .collect();
        let plain = encode(&original, Compression::None);
        for compression in CODECS {
            let batch = encode(&original, compression);
            let view = RecordBatchView::parse(&batch).unwrap();
            let mut reader = RecordReader::new(&view).unwrap();
            let mut raw = Vec::new();
            for want in &original {
                let mut c = Collect::default();
                let info = reader.next_record(&mut c).unwrap().unwrap();
                assert_eq!(c.key, want.key.clone().unwrap_or_default());
                assert_eq!(c.value, want.value.clone().unwrap_or_default());
                assert_eq!(info.encoded_len(), c.raw.len() as u64);
                raw.extend_from_slice(&c.raw);
            }
            reader.finish().unwrap();
            assert_eq!(raw, &plain[HEADER_LEN..], "{compression:?}");
        }
    }

    /// `batch` (uncompressed) with its records section replaced by `payload`.
    fn with_payload(batch: &Bytes, payload: &[u8]) -> Vec<u8> {
        let mut out = batch[..HEADER_LEN].to_vec();
        out.extend_from_slice(payload);
        rewrite::seal(&mut out);
        out
    }

    /// Found by the `records` fuzz target: Kafka's varint reader takes a
    /// length written in more bytes than it needs, so the encoding's size
    /// is what was read, not the shortest encoding of the body length.
    #[test]
    fn encoded_len_counts_a_length_varint_written_long() {
        let plain = encode(&records(1), Compression::None);
        let body = &plain[HEADER_LEN + 1..];
        let mut payload = vec![((body.len() as u8) << 1) | 0x80, 0x00];
        payload.extend_from_slice(body);
        let batch = with_payload(&plain, &payload);
        let view = RecordBatchView::parse(&batch).unwrap();
        let mut reader = RecordReader::new(&view).unwrap();
        let mut c = Collect::default();
        let info = reader.next_record(&mut c).unwrap().unwrap();
        assert_eq!(c.raw, payload);
        assert_eq!(info.encoded_len(), payload.len() as u64);
    }

    fn read_all(batch: &[u8]) -> Result<Vec<RecordInfo>, RecordError> {
        let view = RecordBatchView::parse(batch).unwrap();
        let mut reader = RecordReader::new(&view)?;
        let mut out = Vec::new();
        while let Some(info) = reader.next_record(&mut SkipAll)? {
            out.push(info);
        }
        reader.finish()?;
        Ok(out)
    }

    #[test]
    fn a_key_longer_than_its_record_is_invalid() {
        let batch = encode(&records(2), Compression::None);
        let mut payload = batch[HEADER_LEN..].to_vec();
        // Record 0: length, attributes, ts delta, offset delta, key length.
        // Its key is null (-1 = 0x01); claim 60 bytes instead.
        assert_eq!(payload[4], 0x01);
        payload[4] = 120; // zig-zag 60
        let err = read_all(&with_payload(&batch, &payload)).unwrap_err();
        assert_eq!(err.index(), Some(0), "{err}");
    }

    /// A record whose key runs past it is refused at its index whether it
    /// lies in the decoder's window or across it.
    #[test]
    fn a_bad_record_is_refused_at_its_index_in_every_codec() {
        let big = Record {
            value: Some(Bytes::from(vec![7u8; 40_000])),
            ..records(3).remove(2)
        };
        for with_big in [false, true] {
            let mut rs = records(6);
            if with_big {
                rs[2] = big.clone();
            }
            let plain = encode(&rs, Compression::None);
            let mut payload = plain[HEADER_LEN..].to_vec();
            // Find record 2's key length: walk two records.
            let mut pos = 0;
            for _ in 0..2 {
                let len = crate::record_batch::read_varlong(&payload, &mut pos).unwrap();
                pos += len as usize;
            }
            crate::record_batch::read_varlong(&payload, &mut pos).unwrap();
            // attributes, timestamp delta 2 (0x04), offset delta 2 (0x04), key length.
            assert_eq!(&payload[pos..pos + 3], &[0, 4, 4]);
            // A key of about a million bytes (overwriting "k2"): past the record.
            payload[pos + 3..pos + 6].copy_from_slice(&[0xfe, 0xff, 0x7f]);
            for codec in [
                Codec::None,
                Codec::Gzip,
                Codec::Snappy,
                Codec::Lz4,
                Codec::Zstd,
            ] {
                let batch = compressed_payload(&plain, codec, &payload);
                let err = read_all(&batch).unwrap_err();
                assert_eq!(err.index(), Some(2), "{codec:?} big={with_big}: {err}");
            }
        }
    }

    /// `plain`'s header with `records` compressed by `codec` (snappy unframed).
    fn compressed_payload(plain: &Bytes, codec: Codec, records: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let payload = match codec {
            Codec::None => records.to_vec(),
            Codec::Gzip => {
                let mut e =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(records).unwrap();
                e.finish().unwrap()
            }
            Codec::Snappy => snap::raw::Encoder::new().compress_vec(records).unwrap(),
            Codec::Lz4 => {
                let mut e = lz4::EncoderBuilder::new().build(Vec::new()).unwrap();
                e.write_all(records).unwrap();
                let (out, r) = e.finish();
                r.unwrap();
                out
            }
            Codec::Zstd => zstd::encode_all(records, 3).unwrap(),
        };
        let mut batch = with_payload(plain, &payload);
        rewrite::set_codec(&mut batch, codec);
        rewrite::seal(&mut batch);
        batch
    }

    #[test]
    fn fields_that_do_not_fill_the_declared_length_are_invalid() {
        let batch = encode(&records(2), Compression::None);
        let mut payload = batch[HEADER_LEN..].to_vec();
        // Record 0's declared body length one byte longer: its fields end early.
        let mut pos = 0;
        let len = crate::record_batch::read_varlong(&payload, &mut pos).unwrap();
        assert_eq!(pos, 1);
        payload[0] = ((len + 1) << 1) as u8;
        let err = read_all(&with_payload(&batch, &payload)).unwrap_err();
        assert_eq!(err.index(), Some(0), "{err}");
    }

    #[test]
    fn negative_header_counts_and_lengths_are_invalid() {
        let batch = encode(&records(1), Compression::None);
        let payload = batch[HEADER_LEN..].to_vec();
        // The record ends: header count 1 (0x02), key length 2 (0x04), "h0",
        // value length 2 (0x04), "hv".
        let n = payload.len();
        assert_eq!(
            &payload[n - 7..],
            &[0x02, 0x04, b'h', b'0', 0x04, b'h', b'v']
        );
        let mut bad_count = payload.clone();
        bad_count[n - 7] = 0x01; // -1 headers
        let mut bad_key = payload.clone();
        bad_key[n - 6] = 0x03; // header key length -2
        for p in [bad_count, bad_key] {
            assert!(matches!(
                read_all(&with_payload(&batch, &p)),
                Err(RecordError::Invalid { index: 0, .. })
            ));
        }
    }

    #[test]
    fn trailing_bytes_and_truncation_are_refused() {
        let batch = encode(&records(3), Compression::None);
        let mut longer = batch[HEADER_LEN..].to_vec();
        longer.push(0);
        assert!(matches!(
            read_all(&with_payload(&batch, &longer)),
            Err(RecordError::TrailingBytes { count: 3 })
        ));
        let shorter = &batch[HEADER_LEN..batch.len() - 3];
        assert!(matches!(
            read_all(&with_payload(&batch, shorter)),
            Err(RecordError::Invalid { index: 2, .. })
        ));
    }

    #[test]
    fn a_snappy_block_declaring_gigabytes_is_refused_before_allocation() {
        let batch = encode(&records(1), Compression::None);
        // An unframed raw block whose preamble declares 4 GiB - 1.
        let preamble = [0xff, 0xff, 0xff, 0xff, 0x0f];
        let mut bomb = with_payload(&batch, &preamble);
        rewrite::set_codec(&mut bomb, Codec::Snappy);
        rewrite::seal(&mut bomb);
        assert!(matches!(read_all(&bomb), Err(RecordError::Corrupt(_))));
    }

    #[test]
    fn a_zstd_bomb_streams_in_bounded_memory() {
        // One record whose value is 64 MiB of zeros, compressed to a few KiB.
        let value = vec![0u8; 64 << 20];
        let batch = encode(
            &[Record {
                value: Some(Bytes::from(value)),
                ..records(1).remove(0)
            }],
            Compression::Zstd,
        );
        assert!(batch.len() < 64 * 1024, "{}", batch.len());
        struct Largest(usize);
        impl RecordVisitor for Largest {
            fn wants(&self, _: Part) -> bool {
                true
            }
            fn bytes(&mut self, _: Part, piece: &[u8]) {
                self.0 = self.0.max(piece.len());
            }
        }
        let view = RecordBatchView::parse(&batch).unwrap();
        let mut reader = RecordReader::new(&view).unwrap();
        let mut largest = Largest(0);
        let info = reader.next_record(&mut largest).unwrap().unwrap();
        assert_eq!(info.value_len, 64 << 20);
        assert!(largest.0 <= CHUNK_LEN);
        reader.finish().unwrap();
    }

    #[test]
    fn the_compressor_writes_what_the_reader_reads_in_every_codec() {
        let original = records(200);
        let plain = encode(&original, Compression::None);
        let section = &plain[HEADER_LEN..];
        for codec in [
            Codec::None,
            Codec::Gzip,
            Codec::Snappy,
            Codec::Lz4,
            Codec::Zstd,
        ] {
            let mut c = RecordsCompressor::new(codec, 1 << 20).unwrap();
            // In small pieces, as a visitor's raw bytes come.
            for piece in section.chunks(7) {
                c.write_all(piece).unwrap();
            }
            let mut batch = with_payload(&plain, &c.finish().unwrap());
            rewrite::set_codec(&mut batch, codec);
            rewrite::seal(&mut batch);
            let view = RecordBatchView::parse(&batch).unwrap();
            let mut reader = RecordReader::new(&view).unwrap();
            let mut raw = Collect::default();
            while reader.next_record(&mut raw).unwrap().is_some() {}
            reader.finish().unwrap();
            assert_eq!(raw.raw, section, "{codec:?}");
        }
    }

    #[test]
    fn the_compressor_refuses_to_outgrow_its_cap() {
        let noise: Vec<u8> = (0..64 * 1024u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        for codec in [
            Codec::None,
            Codec::Gzip,
            Codec::Snappy,
            Codec::Lz4,
            Codec::Zstd,
        ] {
            let mut c = RecordsCompressor::new(codec, 1000).unwrap();
            let err = c
                .write_all(&noise)
                .and_then(|()| c.finish().map(drop))
                .unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::WriteZero, "{codec:?}");
        }
    }

    #[test]
    fn varint_len_matches_the_encoding() {
        for v in [
            0i64,
            1,
            -1,
            63,
            64,
            -65,
            8191,
            8192,
            i32::MAX as i64,
            i64::MIN,
        ] {
            let mut buf = BytesMut::new();
            let mut raw = ((v << 1) ^ (v >> 63)) as u64;
            loop {
                let b = (raw & 0x7f) as u8;
                raw >>= 7;
                if raw == 0 {
                    buf.extend_from_slice(&[b]);
                    break;
                }
                buf.extend_from_slice(&[b | 0x80]);
            }
            assert_eq!(varint_len(v), buf.len(), "{v}");
        }
    }
}
