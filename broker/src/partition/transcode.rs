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

use std::io::{self, Write};

use bytes::Bytes;
use protocol::record_batch::{rewrite, Codec, RecordBatchView, HEADER_LEN};
use protocol::records::{RecordError, RecordReader, RecordVisitor, XERIAL_MAGIC};

use crate::error::PartitionError;

/// snappy-java's default block size; Kafka writes blocks of this size.
const XERIAL_BLOCK_LEN: usize = 32 * 1024;

/// What the scan found: the batch indexes of records without a key.
pub struct Scan {
    pub keyless: Vec<i32>,
    /// The batch re-encoded with the target codec, when one was asked for.
    pub recompressed: Option<Bytes>,
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
    let mut output = match target {
        Some(t) => Some(encoder(t, max_bytes as usize).map_err(corrupt)?),
        None => None,
    };
    let mut keyless = Vec::new();
    let mut reader = RecordReader::new(view).map_err(|e| record_error(e, max_bytes))?;
    let mut copy = Copy {
        output: output.as_mut(),
    };
    while let Some(info) = reader
        .next_record(&mut copy)
        .map_err(|e| record_error(e, max_bytes))?
    {
        if check_keys && info.key_len < 0 {
            keyless.push(info.index);
        }
    }
    // Anything after the declared records is not a record Kafka would keep.
    reader.finish().map_err(|e| record_error(e, max_bytes))?;
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

/// A record the reader refused, as the produce error Kafka gives; a copy
/// that outgrew the limit is MESSAGE_TOO_LARGE.
fn record_error(e: RecordError, max_bytes: u32) -> PartitionError {
    match e {
        RecordError::Corrupt(why) => PartitionError::CorruptMessage(format!("records: {why}")),
        RecordError::Sink {
            kind: io::ErrorKind::WriteZero,
            ..
        } => PartitionError::MessageTooLarge {
            size: max_bytes as usize + 1,
            max: max_bytes,
        },
        other => PartitionError::InvalidRecord(other.to_string()),
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
        _ => PartitionError::CorruptMessage(format!("records: {e}")),
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
