//! The two produce-path checks that need a batch's records, not just its
//! header: keys on compacted topics, and recompression to a topic's
//! `compression.type`. Both stream the records one at a time through the
//! codecs, so memory stays bounded by codec buffers however far a hostile
//! batch would decompress; the only thing built in full is a recompressed
//! batch, which is capped at the topic's `max.message.bytes` as Kafka
//! re-checks the size after recompression.
//!
//! Batches that need neither (the common case: `compression.type=producer`
//! on a delete-policy topic) never come here and are stored as sent.

use std::io::{self, Read, Write};

use bytes::Bytes;
use protocol::record_batch::{rewrite, Codec, RecordBatchView, HEADER_LEN};

use crate::error::PartitionError;

/// snappy-java's stream header, which Kafka's snappy batches carry.
const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
const XERIAL_HEADER_LEN: usize = 16;
/// snappy-java's default block size; Kafka writes blocks of this size.
const XERIAL_BLOCK_LEN: usize = 32 * 1024;

/// What the scan found: the batch indexes of records without a key.
pub struct Scan {
    pub keyless: Vec<i32>,
    /// The batch re-encoded with the target codec, when one was asked for.
    pub recompressed: Option<Bytes>,
}

/// Reads `view`'s records; records keyless ones when `check_keys`, and
/// re-encodes the batch with `target` (all other header fields kept) unless
/// the batch already uses it. `max_bytes` caps the re-encoded batch.
pub fn scan(
    view: &RecordBatchView<'_>,
    check_keys: bool,
    target: Option<Codec>,
    max_bytes: u32,
) -> Result<Scan, PartitionError> {
    let codec = view
        .codec()
        .map_err(|e| PartitionError::InvalidRecord(e.to_string()))?;
    let target = target.filter(|t| *t != codec);
    let corrupt = |e: io::Error| PartitionError::CorruptMessage(format!("records: {e}"));
    let mut input = decoder(codec, view.records_payload()).map_err(corrupt)?;
    let mut output = match target {
        Some(t) => Some(encoder(t, max_bytes as usize).map_err(corrupt)?),
        None => None,
    };
    let mut keyless = Vec::new();
    let mut head = Vec::with_capacity(32);
    for index in 0..view.record_count() {
        head.clear();
        let len = read_varint(&mut input, &mut head).map_err(corrupt)?;
        let body_start = head.len();
        if len < 0 {
            return Err(PartitionError::CorruptMessage(
                "negative record length".into(),
            ));
        }
        // attributes (int8), timestampDelta (varlong), offsetDelta (varint), keyLength (varint)
        let mut attributes = [0u8; 1];
        input.read_exact(&mut attributes).map_err(corrupt)?;
        head.push(attributes[0]);
        read_varint(&mut input, &mut head).map_err(corrupt)?;
        read_varint(&mut input, &mut head).map_err(corrupt)?;
        let key_len = read_varint(&mut input, &mut head).map_err(corrupt)?;
        if check_keys && key_len < 0 {
            keyless.push(index);
        }
        let read_so_far = (head.len() - body_start) as i64;
        let rest = len - read_so_far;
        if rest < 0 {
            return Err(PartitionError::CorruptMessage(
                "record shorter than its header".into(),
            ));
        }
        let mut body = (&mut input).take(rest as u64);
        let copied = match output.as_mut() {
            Some(out) => {
                out.write_all(&head).map_err(|e| too_large(e, max_bytes))?;
                io::copy(&mut body, out).map_err(|e| too_large(e, max_bytes))?
            }
            None => io::copy(&mut body, &mut io::sink()).map_err(corrupt)?,
        };
        if copied != rest as u64 {
            return Err(PartitionError::CorruptMessage("truncated record".into()));
        }
    }
    // Anything after the declared records is not a record Kafka would keep.
    if input.read(&mut [0u8; 1]).map_err(corrupt)? != 0 {
        return Err(PartitionError::InvalidRecord(
            "bytes after the last record of the batch".into(),
        ));
    }
    let recompressed = match (output, target) {
        (Some(out), Some(t)) => {
            let payload = out.finish().map_err(|e| too_large(e, max_bytes))?;
            Some(rebuild(view, t, &payload))
        }
        _ => None,
    };
    Ok(Scan {
        keyless,
        recompressed,
    })
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
        _ => PartitionError::CorruptMessage(format!("records: {e}")),
    }
}

/// Reads a zigzag varint (up to 64 bits), appending its bytes to `raw`.
fn read_varint(input: &mut impl Read, raw: &mut Vec<u8>) -> io::Result<i64> {
    let mut value: u64 = 0;
    for shift in (0..70).step_by(7) {
        let mut b = [0u8; 1];
        input.read_exact(&mut b)?;
        raw.push(b[0]);
        value |= u64::from(b[0] & 0x7f) << shift;
        if b[0] & 0x80 == 0 {
            return Ok((value >> 1) as i64 ^ -((value & 1) as i64));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "varint too long",
    ))
}

fn decoder<'a>(codec: Codec, payload: &'a [u8]) -> io::Result<Box<dyn Read + 'a>> {
    Ok(match codec {
        Codec::None => Box::new(payload),
        Codec::Gzip => Box::new(flate2::read::GzDecoder::new(payload)),
        Codec::Snappy => Box::new(XerialReader::new(payload)),
        Codec::Lz4 => Box::new(lz4::Decoder::new(payload)?),
        Codec::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(payload)?),
    })
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

fn encoder(codec: Codec, max_bytes: usize) -> io::Result<Encoder> {
    // The payload's share of the limit: the batch header comes on top.
    let capped = Capped {
        buf: Vec::new(),
        max: max_bytes.saturating_sub(HEADER_LEN),
    };
    Ok(match codec {
        Codec::None => Encoder::None(capped),
        Codec::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
            capped,
            flate2::Compression::default(),
        )),
        Codec::Snappy => Encoder::Snappy(XerialWriter::new(capped)?),
        Codec::Lz4 => Encoder::Lz4(lz4::EncoderBuilder::new().build(capped)?),
        Codec::Zstd => Encoder::Zstd(zstd::stream::write::Encoder::new(capped, 3)?),
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

/// Reads snappy-java's framing (header, then length-prefixed raw snappy
/// blocks) one block at a time; without the header the payload is one raw
/// snappy block, as snappy-java and Kafka accept. A block's decompressed
/// size is read from its preamble and checked before allocating; snappy's
/// format bounds it to a small multiple of the compressed block.
struct XerialReader<'a> {
    rest: &'a [u8],
    framed: bool,
    block: Vec<u8>,
    pos: usize,
}

impl<'a> XerialReader<'a> {
    fn new(payload: &'a [u8]) -> Self {
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
                return Err(invalid("truncated snappy block length"));
            }
            let len = u32::from_be_bytes([self.rest[0], self.rest[1], self.rest[2], self.rest[3]])
                as usize;
            if len > self.rest.len() - 4 {
                return Err(invalid("snappy block longer than the batch"));
            }
            let block = &self.rest[4..4 + len];
            self.rest = &self.rest[4 + len..];
            block
        } else {
            std::mem::take(&mut self.rest)
        };
        let n = snap::raw::decompress_len(compressed).map_err(|e| invalid(&e.to_string()))?;
        self.block.resize(n, 0);
        snap::raw::Decoder::new()
            .decompress(compressed, &mut self.block)
            .map_err(|e| invalid(&e.to_string()))?;
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

    fn records(n: usize, keyless_every: usize) -> Vec<Record> {
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
                key: (keyless_every == 0 || i % keyless_every != 0)
                    .then(|| Bytes::from(format!("k{i}"))),
                value: Some(Bytes::from(format!("value {i} ").repeat(20))),
                headers: Default::default(),
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

    #[test]
    fn every_codec_converts_to_every_other_losslessly() {
        let original = records(300, 0);
        for (from, _) in CODECS {
            let batch = encode(&original, from);
            let view = RecordBatchView::parse(&batch).unwrap();
            for (_, to) in CODECS {
                let out = scan(&view, false, Some(to), 10 << 20).unwrap();
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
    fn keyless_records_are_found_in_every_codec() {
        let original = records(100, 10);
        for (from, _) in CODECS {
            let batch = encode(&original, from);
            let view = RecordBatchView::parse(&batch).unwrap();
            let out = scan(&view, true, None, 10 << 20).unwrap();
            assert_eq!(out.keyless, (0..100).step_by(10).collect::<Vec<i32>>());
            assert!(out.recompressed.is_none());
        }
    }

    #[test]
    fn recompression_past_the_limit_is_message_too_large() {
        let batch = encode(&records(300, 0), Compression::Zstd);
        let view = RecordBatchView::parse(&batch).unwrap();
        let err = scan(&view, false, Some(Codec::None), batch.len() as u32)
            .err()
            .unwrap();
        assert!(matches!(err, PartitionError::MessageTooLarge { .. }));
    }

    /// `view`'s batch with `payload` as its (already encoded) records.
    fn with_payload(batch: &Bytes, codec: Codec, payload: &[u8]) -> Bytes {
        rebuild(&RecordBatchView::parse(batch).unwrap(), codec, payload)
    }

    #[test]
    fn unframed_snappy_is_read_as_one_raw_block() {
        let original = records(50, 7);
        let plain = encode(&original, Compression::None);
        let raw = snap::raw::Encoder::new()
            .compress_vec(&plain[HEADER_LEN..])
            .unwrap();
        let batch = with_payload(&plain, Codec::Snappy, &raw);
        let view = RecordBatchView::parse(&batch).unwrap();
        let out = scan(&view, true, Some(Codec::None), 10 << 20).unwrap();
        assert_eq!(out.keyless, (0..50).step_by(7).collect::<Vec<i32>>());
        assert_eq!(out.recompressed.unwrap(), plain);
    }

    #[test]
    fn bytes_after_the_declared_records_are_invalid() {
        let plain = encode(&records(10, 0), Compression::None);
        let mut records_and_more = plain[HEADER_LEN..].to_vec();
        records_and_more.extend_from_slice(&plain[HEADER_LEN..HEADER_LEN + 20]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&records_and_more).unwrap();
        let batch = with_payload(&plain, Codec::Gzip, &gz.finish().unwrap());
        let view = RecordBatchView::parse(&batch).unwrap();
        assert!(matches!(
            scan(&view, true, None, 10 << 20),
            Err(PartitionError::InvalidRecord(_))
        ));
    }

    #[test]
    fn garbage_payloads_are_corrupt_not_panics() {
        for (from, _) in CODECS {
            let batch = encode(&records(20, 0), from);
            let mut bad = batch.to_vec();
            let mid = HEADER_LEN + (bad.len() - HEADER_LEN) / 2;
            for b in &mut bad[mid..] {
                *b = 0xff;
            }
            let view = RecordBatchView::parse(&bad).unwrap();
            assert!(scan(&view, true, Some(Codec::Gzip), 10 << 20).is_err());
        }
    }
}
