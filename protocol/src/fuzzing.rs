//! Fuzz targets: each function takes arbitrary bytes, runs one part of the
//! crate on them and panics when a property that must hold for every input
//! fails. The libFuzzer binaries in `protocol/fuzz` are one line each around
//! these functions, and `tests/fuzz_corpus.rs` replays the committed corpus
//! through them on every `cargo test`, so a crash once found stays a test.
//! Not part of the crate's API.

use std::io::{self, Read};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind};
use kafka_protocol::protocol::Decodable;
use kafka_protocol::records::RecordBatchDecoder;

use crate::frame::{FrameDecoder, SIZE_PREFIX_LEN};
use crate::header::{decode_request, unsupported_api_versions_response, RequestError};
use crate::record_batch::{
    rewrite, BatchIter, BatchIterItem, Codec, RecordBatchView, HEADER_LEN, LOG_OVERHEAD,
    OFF_ATTRIBUTES, OFF_BATCH_LENGTH, OFF_LAST_OFFSET_DELTA, OFF_MAGIC, OFF_RECORD_COUNT,
};
use crate::records::{decompressor, Part, RecordReader, RecordVisitor, CHUNK_LEN};
use crate::{guard, unsupported_produce_response, versions};

/// The frame size limit the stream target reads with: large enough that a
/// fuzzer's inputs never reach it by accident, so it tests the splitting.
pub const STREAM_MAX_FRAME_BYTES: usize = 1 << 20;

/// Decompressed bytes a target reads before it stops: a few kilobytes of
/// zstd or gzip expand to gigabytes, and the point is the parsing, not the
/// time to stream a bomb (that memory stays bounded is the codecs' window).
pub const DECOMPRESSED_BYTES_MAX: usize = 4 << 20;

/// `data` as a byte stream from a client: split into frames (fed in pieces
/// whose sizes the first byte picks, and the result must not depend on
/// them), every frame decoded as the broker decodes it.
pub fn request_stream(data: &[u8]) {
    let Some((&piece, stream)) = data.split_first() else {
        return;
    };
    let whole = split_frames(stream, stream.len().max(1));
    let pieces = split_frames(stream, usize::from(piece % 17) + 1);
    assert_eq!(whole, pieces, "frames depend on how the bytes arrived");
    for frame in whole.0 {
        decode_frame(frame);
    }
}

/// The frames in `stream` and whether it ended with a framing error,
/// delivered to the decoder `piece` bytes at a time.
fn split_frames(stream: &[u8], piece: usize) -> (Vec<Bytes>, bool) {
    let mut decoder = FrameDecoder::new(STREAM_MAX_FRAME_BYTES);
    let mut frames = Vec::new();
    for chunk in stream.chunks(piece) {
        decoder.buffer_mut().put_slice(chunk);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(_) => return (frames, true),
            }
        }
    }
    (frames, false)
}

/// Every `(api_key, api_version)` the broker accepts, plus the versions it
/// advertises but answers with UNSUPPORTED_VERSION (Produce v0-2).
pub fn request_versions() -> Vec<(ApiKey, i16)> {
    versions::SUPPORTED_APIS
        .iter()
        .flat_map(|r| (r.min_version..=r.max_version).map(move |v| (r.api_key, v)))
        .collect()
}

/// `data` as the body of a request: its first two bytes pick the api key and
/// version from [`request_versions`], a valid header for them is put in
/// front, and the frame is decoded. This reaches every accepted request's
/// decoder without the fuzzer first having to find its header.
pub fn request_body(data: &[u8]) {
    let Some(frame) = request_body_frame(data) else {
        return;
    };
    decode_frame(frame);
}

/// The frame [`request_body`] decodes.
pub fn request_body_frame(data: &[u8]) -> Option<Bytes> {
    let (pick, body) = data.split_at_checked(2)?;
    let all = request_versions();
    let (api_key, api_version) =
        all[usize::from(u16::from_be_bytes([pick[0], pick[1]])) % all.len()];
    let mut frame = BytesMut::new();
    frame.put_i16(api_key as i16);
    frame.put_i16(api_version);
    frame.put_i32(0x0102_0304);
    // Header v1 and v2 both start with a nullable client id (int16 length).
    frame.put_i16(4);
    frame.put_slice(b"fuzz");
    if api_key.request_header_version(api_version) >= 2 {
        frame.put_u8(0); // no tagged fields
    }
    frame.put_slice(body);
    Some(frame.freeze())
}

/// Decodes one frame body as the connection does and checks what must hold
/// whatever the bytes:
/// - an accepted request is one the version table accepts, with the ids of
///   the frame's first eight bytes;
/// - the guard and kafka-protocol's decoder read the same number of bytes
///   (the guard's schema is the decoder's, so its bounds check the bytes the
///   decoder will allocate from);
/// - the error answers (Produce v0-2, ApiVersions from the future) encode,
///   and a refused frame's correlation id is the one it carries.
pub fn decode_frame(frame: Bytes) {
    let prefix = |at: usize| {
        frame
            .get(at..at + 2)
            .map(|b| i16::from_be_bytes([b[0], b[1]]))
    };
    let correlation_id = frame
        .get(4..8)
        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    match decode_request(frame.clone()) {
        Ok(request) => {
            assert_eq!(Some(request.api_key()), prefix(0));
            assert_eq!(Some(request.api_version()), prefix(2));
            assert_eq!(Some(request.correlation_id()), correlation_id);
            assert!(versions::accepted(request.api_key(), request.api_version()));
            let api_key = ApiKey::try_from(request.api_key()).expect("decoded key is known");
            guard_reads_what_the_decoder_reads(api_key, request.api_version(), &frame);
        }
        Err(error) => {
            assert_eq!(error.correlation_id(), correlation_id);
            match error {
                RequestError::UnsupportedVersion {
                    api_key: ApiKey::Produce,
                    correlation_id,
                    ..
                } => {
                    if let Ok(response) = unsupported_produce_response(&frame) {
                        check_response_frame(&response, correlation_id);
                    }
                }
                RequestError::UnsupportedVersion {
                    api_key: ApiKey::ApiVersions,
                    correlation_id,
                    ..
                } => check_response_frame(
                    &unsupported_api_versions_response(correlation_id),
                    correlation_id,
                ),
                RequestError::TruncatedHeader(_)
                | RequestError::UnknownApiKey { .. }
                | RequestError::ApiNotEnabled { .. }
                | RequestError::UnsupportedVersion { .. }
                | RequestError::Malformed { .. } => {}
            }
        }
    }
}

fn check_response_frame(response: &[u8], correlation_id: i32) {
    assert!(response.len() >= SIZE_PREFIX_LEN + 4, "response too short");
    let size = i32::from_be_bytes(response[..4].try_into().expect("4 bytes"));
    assert_eq!(
        size as usize,
        response.len() - SIZE_PREFIX_LEN,
        "size prefix"
    );
    let id = i32::from_be_bytes(response[4..8].try_into().expect("4 bytes"));
    assert_eq!(id, correlation_id, "response answers another request");
}

fn guard_reads_what_the_decoder_reads(api_key: ApiKey, api_version: i16, frame: &Bytes) {
    let header_version = api_key.request_header_version(api_version);
    let header_len =
        guard::check_request_header(header_version, frame).expect("accepted header passes");
    let mut buf = frame.clone();
    RequestHeader::decode(&mut buf, header_version).expect("accepted header decodes");
    assert_eq!(
        frame.len() - buf.len(),
        header_len,
        "{api_key:?} v{api_version}: guard and decoder disagree on the header"
    );
    let guarded = guard::check_request_body(api_key, api_version, &frame[header_len..])
        .expect("accepted body passes the guard");
    // A version newer than kafka-protocol's is decoded as the one below,
    // without its extra fields.
    let (version, extra) = match crate::newer::decoded_as(api_key, api_version) {
        None => (api_version, 0),
        Some(older) => match crate::newer::split_request(api_key, api_version, &buf)
            .expect("accepted body splits")
        {
            Some((body, _)) => {
                let extra = buf.len() - body.len();
                buf = body;
                (older, extra)
            }
            None => (older, 0),
        },
    };
    let before = buf.len();
    RequestKind::decode(api_key, &mut buf, version).expect("accepted body decodes");
    assert_eq!(
        before - buf.len() + extra,
        guarded,
        "{api_key:?} v{api_version}: guard and decoder disagree on the body's length"
    );
}

/// `data` as a records blob (a produce request's records, a fetch response,
/// a run of a segment file): every batch the iterator yields, every header
/// field, the CRC, and the header rewrites a broker makes.
pub fn record_batches(data: &[u8]) {
    let mut end = 0usize;
    let mut done = false;
    for item in BatchIter::new(data) {
        assert!(!done, "an item after a partial or invalid one");
        match item {
            BatchIterItem::Batch { position, batch } => {
                assert_eq!(position, end, "batches must be contiguous");
                end = position + batch.len();
                assert_eq!(&data[position..end], batch.as_bytes());
                check_batch(&batch);
            }
            BatchIterItem::Partial {
                position,
                remaining,
            } => {
                assert_eq!(position, end);
                assert_eq!(position + remaining, data.len());
                done = true;
            }
            BatchIterItem::Invalid { position, .. } => {
                assert_eq!(position, end);
                done = true;
            }
        }
    }
    if let Ok(batch) = RecordBatchView::parse(data) {
        check_batch(&batch);
    }
}

fn check_batch(batch: &RecordBatchView<'_>) {
    assert_eq!(
        RecordBatchView::peek_len(batch.as_bytes()),
        Some(batch.len())
    );
    assert!(batch.len() >= HEADER_LEN);
    assert!(batch.record_count() >= 0);
    assert!(batch.last_offset_delta() >= 0);
    batch.codec().expect("a parsed batch has a known codec");
    let fields = (
        batch.magic(),
        batch.attributes(),
        batch.record_count(),
        batch.last_offset_delta(),
        batch.base_timestamp(),
        batch.producer_id(),
        batch.producer_epoch(),
        batch.base_sequence(),
        batch.last_sequence(),
        batch.is_transactional(),
        batch.is_control(),
    );
    let _ = (batch.last_offset(), batch.max_timestamp(), batch.crc());
    let crc_ok = batch.verify_crc().is_ok();
    assert_eq!(crc_ok, batch.compute_crc() == batch.crc());

    // The rewrites a leader makes keep the batch parseable, change only
    // what they name, and leave the CRC valid exactly when it was (the base
    // offset and leader epoch lie outside it).
    let mut copy = batch.as_bytes().to_vec();
    rewrite::set_base_offset(&mut copy, 42);
    rewrite::set_partition_leader_epoch(&mut copy, 7);
    let view = RecordBatchView::parse(&copy).expect("rewritten batch parses");
    assert_eq!(view.base_offset(), 42);
    assert_eq!(view.partition_leader_epoch(), 7);
    assert_eq!(view.verify_crc().is_ok(), crc_ok);
    let after = (
        view.magic(),
        view.attributes(),
        view.record_count(),
        view.last_offset_delta(),
        view.base_timestamp(),
        view.producer_id(),
        view.producer_epoch(),
        view.base_sequence(),
        view.last_sequence(),
        view.is_transactional(),
        view.is_control(),
    );
    assert_eq!(fields, after);
    rewrite::set_log_append_time(&mut copy, 1_700_000_000_000);
    let view = RecordBatchView::parse(&copy).expect("log-append-time batch parses");
    assert!(view.is_log_append_time());
    assert_eq!(view.max_timestamp(), 1_700_000_000_000);
    view.verify_crc().expect("set_log_append_time reseals");
}

/// A v2 batch around `payload` as its records section: the first byte of
/// `data` picks the codec, the next four the record count; the header is
/// valid and the CRC sealed, so the fuzzer works on the records themselves.
pub fn batch_around(data: &[u8]) -> Option<Vec<u8>> {
    let (&codec, rest) = data.split_first()?;
    let (count, payload) = rest.split_at_checked(4)?;
    let count = i32::from_be_bytes(count.try_into().expect("4 bytes"));
    let mut batch = vec![0u8; HEADER_LEN];
    batch[OFF_MAGIC] = 2;
    batch[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&i16::from(codec % 5).to_be_bytes());
    let last_offset_delta = count.saturating_sub(1).max(0);
    batch[OFF_LAST_OFFSET_DELTA..OFF_LAST_OFFSET_DELTA + 4]
        .copy_from_slice(&last_offset_delta.to_be_bytes());
    batch[OFF_RECORD_COUNT..OFF_RECORD_COUNT + 4].copy_from_slice(&count.to_be_bytes());
    batch.extend_from_slice(payload);
    if batch.len() - LOG_OVERHEAD > i32::MAX as usize {
        return None;
    }
    let batch_length = (batch.len() - LOG_OVERHEAD) as i32;
    batch[OFF_BATCH_LENGTH..OFF_BATCH_LENGTH + 4].copy_from_slice(&batch_length.to_be_bytes());
    rewrite::update_crc(&mut batch);
    Some(batch)
}

/// The records inside a batch built by [`batch_around`], read with
/// [`RecordReader`]. Checks:
/// - the pieces a visitor is given are at most [`CHUNK_LEN`] and add up to
///   the lengths the record declares; the raw pieces are its whole encoding;
/// - what a visitor asks for does not change what is read or refused;
/// - a batch kafka-protocol's decoder (what Rust clients read with) accepts,
///   we accept too, with the same keys, values and headers.
pub fn records(data: &[u8]) {
    let Some(batch) = batch_around(data) else {
        return;
    };
    let Ok(view) = RecordBatchView::parse(&batch) else {
        return;
    };
    let full = read_records(&view, true);
    let fields_only = read_records(&view, false);
    assert_eq!(
        full.outcome, fields_only.outcome,
        "the visitor changed what was read"
    );
    if let (Ok(infos), true) = (&full.outcome, full.raw_bytes <= DECOMPRESSED_BYTES_MAX) {
        let mut bytes = Bytes::from(batch.clone());
        if let Ok(set) = RecordBatchDecoder::decode(&mut bytes) {
            assert_eq!(set.records.len(), full.records.len());
            for ((theirs, ours), info) in set.records.iter().zip(&full.records).zip(infos) {
                assert_eq!(theirs.key.as_deref(), ours.key.as_deref(), "key");
                assert_eq!(theirs.value.as_deref(), ours.value.as_deref(), "value");
                // kafka-protocol keeps headers in a map, so repeated keys
                // collapse; it can hold no more than the record declares.
                assert!(
                    theirs.headers.len() <= info.header_count as usize,
                    "headers"
                );
            }
        }
    }
}

/// One record's contents as a [`Collector`] saw them.
#[derive(Debug, Default, PartialEq, Eq)]
struct Collected {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
}

struct ReadOutcome {
    /// The record infos read and how reading ended.
    outcome: Result<Vec<crate::records::RecordInfo>, String>,
    records: Vec<Collected>,
    raw_bytes: usize,
}

/// Collects every part (when `parts`) and counts the raw bytes, stopping
/// the read once [`DECOMPRESSED_BYTES_MAX`] have passed.
struct Collector {
    parts: bool,
    current: Vec<(Part, Vec<u8>)>,
    raw: usize,
    record_raw: usize,
}

impl RecordVisitor for Collector {
    fn wants(&self, _part: Part) -> bool {
        self.parts
    }
    fn bytes(&mut self, part: Part, piece: &[u8]) {
        assert!(self.parts, "given a part it did not want");
        assert!(
            !piece.is_empty() && piece.len() <= CHUNK_LEN,
            "piece of {}",
            piece.len()
        );
        if self.current.len() < 64 * 1024 {
            self.current.push((part, piece.to_vec()));
        }
    }
    fn wants_raw(&self) -> bool {
        true
    }
    fn raw(&mut self, piece: &[u8]) -> io::Result<()> {
        assert!(
            piece.len() <= CHUNK_LEN.max(10),
            "raw piece of {}",
            piece.len()
        );
        self.raw += piece.len();
        self.record_raw += piece.len();
        if self.raw > DECOMPRESSED_BYTES_MAX {
            return Err(io::Error::other("fuzz read cap"));
        }
        Ok(())
    }
}

fn read_records(view: &RecordBatchView<'_>, parts: bool) -> ReadOutcome {
    let mut collector = Collector {
        parts,
        current: Vec::new(),
        raw: 0,
        record_raw: 0,
    };
    let mut infos = Vec::new();
    let mut records = Vec::new();
    let outcome = (|| {
        let mut reader = RecordReader::new(view).map_err(|e| e.to_string())?;
        assert_eq!(reader.count(), view.record_count().max(0));
        loop {
            collector.current.clear();
            collector.record_raw = 0;
            let Some(info) = reader
                .next_record(&mut collector)
                .map_err(|e| e.to_string())?
            else {
                break;
            };
            assert_eq!(info.index as usize, infos.len());
            assert_eq!(info.encoded_len(), collector.record_raw as u64, "raw bytes");
            if parts {
                records.push(assemble(&info, &collector.current));
            }
            infos.push(info);
        }
        assert_eq!(infos.len(), reader.count() as usize);
        reader.finish().map_err(|e| e.to_string())?;
        Ok(infos)
    })();
    ReadOutcome {
        outcome,
        records,
        raw_bytes: collector.raw,
    }
}

/// A record's parts from its pieces, checked against the lengths it declares.
fn assemble(info: &crate::records::RecordInfo, pieces: &[(Part, Vec<u8>)]) -> Collected {
    let mut out = Collected::default();
    let join = |part: Part| -> Vec<u8> {
        pieces
            .iter()
            .filter(|(p, _)| *p == part)
            .flat_map(|(_, b)| b.iter().copied())
            .collect()
    };
    let key = join(Part::Key);
    let value = join(Part::Value);
    assert_eq!(key.len(), info.key_len.max(0) as usize, "key pieces");
    assert_eq!(value.len(), info.value_len.max(0) as usize, "value pieces");
    out.key = (info.key_len >= 0).then_some(key);
    out.value = (info.value_len >= 0).then_some(value);
    out
}

/// `data`'s first byte picks a codec, the rest is a compressed records
/// section: read through the streaming decompressor (bounded by
/// [`DECOMPRESSED_BYTES_MAX`]). Snappy's framing is our own code, so what it
/// reads is compared with kafka-protocol's snappy decoder.
pub fn decompress(data: &[u8]) {
    let Some((&pick, payload)) = data.split_first() else {
        return;
    };
    let codec = codec_of(pick);
    let ours = read_capped(codec, payload);
    if let (Codec::Snappy, Ok(ours)) = (codec, &ours) {
        use kafka_protocol::compression::{Decompressor, Snappy};
        let mut input = Bytes::copy_from_slice(payload);
        let theirs = <Snappy as Decompressor<Bytes>>::decompress(&mut input, |b| Ok(b.to_vec()));
        if let Ok(theirs) = theirs {
            assert_eq!(
                ours, &theirs,
                "snappy: our reader and kafka-protocol's disagree"
            );
        }
    }
}

fn codec_of(pick: u8) -> Codec {
    match pick % 5 {
        0 => Codec::None,
        1 => Codec::Gzip,
        2 => Codec::Snappy,
        3 => Codec::Lz4,
        _ => Codec::Zstd,
    }
}

fn read_capped(codec: Codec, payload: &[u8]) -> io::Result<Vec<u8>> {
    let reader = decompressor(codec, payload)?;
    let mut out = Vec::new();
    reader
        .take(DECOMPRESSED_BYTES_MAX as u64 + 1)
        .read_to_end(&mut out)?;
    if out.len() > DECOMPRESSED_BYTES_MAX {
        return Err(io::Error::other("over the fuzz cap"));
    }
    Ok(out)
}

/// `data` compressed by each codec as Kafka clients frame it (kafka-protocol's
/// compressors write what the Java client does, snappy in 32 KiB
/// snappy-java blocks) and read back through our streaming decompressors:
/// the bytes must come back unchanged. The first byte repeats the rest, so
/// inputs also span several snappy blocks.
pub fn codec_round_trip(data: &[u8]) {
    use kafka_protocol::compression::{Compressor, Gzip, Lz4, Snappy, Zstd};
    let Some((&repeat, rest)) = data.split_first() else {
        return;
    };
    let plain = rest.repeat(usize::from(repeat % 64) + 1);
    let compressed = |codec: Codec| -> BytesMut {
        let mut out = BytesMut::new();
        let put = |b: &mut BytesMut| {
            b.put_slice(&plain);
            Ok(())
        };
        match codec {
            Codec::None => out.put_slice(&plain),
            Codec::Gzip => Gzip::compress(&mut out, put).expect("gzip compresses"),
            Codec::Snappy => Snappy::compress(&mut out, put).expect("snappy compresses"),
            Codec::Lz4 => Lz4::compress(&mut out, put).expect("lz4 compresses"),
            Codec::Zstd => Zstd::compress(&mut out, put).expect("zstd compresses"),
        }
        out
    };
    for codec in [
        Codec::None,
        Codec::Gzip,
        Codec::Snappy,
        Codec::Lz4,
        Codec::Zstd,
    ] {
        let bytes = compressed(codec);
        let back = read_capped(codec, &bytes).unwrap_or_else(|e| panic!("{codec:?}: {e}"));
        assert!(back == plain, "{codec:?} did not round-trip");
    }
    // librdkafka writes snappy as one raw block, without snappy-java's framing.
    let raw = snap::raw::Encoder::new()
        .compress_vec(&plain)
        .expect("snappy compresses");
    let back = read_capped(Codec::Snappy, &raw).expect("raw snappy block reads");
    assert!(back == plain, "raw snappy did not round-trip");
}

/// The heap a decoded request may take per byte of its frame: the largest
/// ratio of kafka-protocol's in-memory structs to their smallest encoding.
/// The `request_body` fuzz target holds decoding to it.
pub const DECODED_BYTES_PER_WIRE_BYTE: usize = 64;
/// Plus this much for the request's fixed parts.
pub const DECODED_BYTES_FIXED: usize = 16 * 1024;

/// A fuzz target: arbitrary bytes in, a panic when a property fails.
pub type Target = fn(&[u8]);

/// The fuzz targets of this crate by name, as `protocol/fuzz` names its
/// binaries and corpus directories.
pub const TARGETS: &[(&str, Target)] = &[
    ("request_stream", request_stream),
    ("request_body", request_body),
    ("record_batches", record_batches),
    ("records", records),
    ("decompress", decompress),
    ("codec_round_trip", codec_round_trip),
];

/// Seed inputs derived from captured request frames (see
/// `broker`'s `KAFKA_BROKER_CAPTURE_DIR`): each frame for `request_stream`
/// (size-prefixed) and `request_body` (its api picked as that target picks
/// it), and from every Produce request's records, the blob for
/// `record_batches`, each batch for `records` and `decompress` in their
/// input formats.
pub fn seeds_from_frames(frames: &[Bytes]) -> Vec<(&'static str, Vec<u8>)> {
    let all = request_versions();
    let mut out = Vec::new();
    for frame in frames {
        let mut stream = Vec::with_capacity(frame.len() + 5);
        stream.push(3);
        stream.extend_from_slice(&(frame.len() as i32).to_be_bytes());
        stream.extend_from_slice(frame);
        out.push(("request_stream", stream));
        let Ok(request) = decode_request(frame.clone()) else {
            continue;
        };
        let api_key = ApiKey::try_from(request.api_key()).expect("decoded key is known");
        if let Some(pick) = all
            .iter()
            .position(|&(k, v)| k == api_key && v == request.api_version())
        {
            let header_version = api_key.request_header_version(request.api_version());
            if let Ok(header_len) = guard::check_request_header(header_version, frame) {
                let mut body = (pick as u16).to_be_bytes().to_vec();
                body.extend_from_slice(&frame[header_len..]);
                out.push(("request_body", body));
            }
        }
        if let RequestKind::Produce(produce) = &request.body {
            for topic in &produce.topic_data {
                for partition in &topic.partition_data {
                    let Some(records) = &partition.records else {
                        continue;
                    };
                    out.push(("record_batches", records.to_vec()));
                    for item in BatchIter::new(records) {
                        let BatchIterItem::Batch { batch, .. } = item else {
                            break;
                        };
                        let codec = batch.codec().map_or(0, |c| c as u8);
                        let mut input = vec![codec];
                        input.extend_from_slice(&batch.record_count().to_be_bytes());
                        input.extend_from_slice(batch.records_payload());
                        out.push(("records", input));
                        let mut input = vec![codec];
                        input.extend_from_slice(batch.records_payload());
                        out.push(("decompress", input));
                    }
                }
            }
        }
    }
    out
}

/// Runs `target` over every file in `dir` (none if it does not exist), then
/// over `mutations` mutated copies of each (bytes flipped, inserted,
/// removed, by a generator seeded with `seed`): a few thousand blind
/// mutations in `cargo test`, so even without libFuzzer the targets meet
/// inputs nobody wrote. A panic names the input and writes it to the
/// system's temp directory for replay. Returns how many inputs ran.
pub fn replay_corpus(
    name: &str,
    dir: &std::path::Path,
    target: fn(&[u8]),
    mutations: usize,
    seed: u64,
) -> usize {
    let mut inputs: Vec<(String, Vec<u8>)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries {
            let path = entry.expect("corpus entry").path();
            if path.is_file() {
                let data = std::fs::read(&path).expect("corpus file");
                inputs.push((path.display().to_string(), data));
            }
        }
    }
    inputs.sort();
    replay_inputs(name, &inputs, target, mutations, seed)
}

/// [`replay_corpus`] over inputs already in memory.
pub fn replay_inputs(
    name: &str,
    inputs: &[(String, Vec<u8>)],
    target: fn(&[u8]),
    mutations: usize,
    seed: u64,
) -> usize {
    let run = |label: &str, data: &[u8]| {
        let outcome = std::panic::catch_unwind(|| target(data));
        if let Err(panic) = outcome {
            let saved = std::env::temp_dir().join(format!("fuzz-failure-{name}"));
            let _ = std::fs::write(&saved, data);
            eprintln!(
                "fuzz target {name} failed on {label}; input saved to {}",
                saved.display()
            );
            std::panic::resume_unwind(panic);
        }
    };
    let mut ran = 0;
    let mut rng = seed | 1;
    for (label, data) in inputs {
        run(label, data);
        ran += 1;
        for m in 0..mutations {
            let mutated = mutate(data, &mut rng);
            run(&format!("{label} mutation {m} (seed {seed})"), &mutated);
            ran += 1;
        }
    }
    ran
}

fn next(rng: &mut u64) -> u64 {
    // xorshift64*
    *rng ^= *rng >> 12;
    *rng ^= *rng << 25;
    *rng ^= *rng >> 27;
    rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

fn mutate(data: &[u8], rng: &mut u64) -> Vec<u8> {
    let mut out = data.to_vec();
    let edits = next(rng) % 4 + 1;
    for _ in 0..edits {
        let at = if out.is_empty() {
            0
        } else {
            (next(rng) % out.len() as u64) as usize
        };
        match next(rng) % 6 {
            0 | 1 if !out.is_empty() => out[at] ^= 1 << (next(rng) % 8),
            2 if !out.is_empty() => out[at] = [0, 0x7f, 0x80, 0xff][(next(rng) % 4) as usize],
            3 => out.insert(at, next(rng) as u8),
            4 if !out.is_empty() => {
                out.remove(at);
            }
            _ if out.len() >= 4 => {
                // An interesting 32-bit value, as lengths and counts are.
                let at = at.min(out.len() - 4);
                let v: i32 = [0, -1, 1, i32::MAX, i32::MIN, 0x7fff][(next(rng) % 6) as usize];
                out[at..at + 4].copy_from_slice(&v.to_be_bytes());
            }
            _ => out.push(next(rng) as u8),
        }
    }
    out
}

/// Built-in seeds: a few requests as the Java client encodes them (through
/// kafka-protocol), a Produce carrying a batch in every codec, and what
/// [`seeds_from_frames`] derives from them. The captured corpus adds real
/// clients' variety; these keep every target fed without it.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{
        ApiVersionsRequest, MetadataRequest, ProduceRequest, RequestHeader, TopicName,
    };
    use kafka_protocol::protocol::{Encodable, StrBytes};
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    fn frame(api_key: ApiKey, version: i16, body: &impl Encodable) -> Bytes {
        let mut out = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(api_key as i16)
            .with_request_api_version(version)
            .with_correlation_id(7)
            .with_client_id(Some(StrBytes::from_static_str("seed")))
            .encode(&mut out, api_key.request_header_version(version))
            .expect("header encodes");
        body.encode(&mut out, version).expect("body encodes");
        out.freeze()
    }

    let mut records_blob = BytesMut::new();
    for (i, compression) in [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ]
    .into_iter()
    .enumerate()
    {
        let records: Vec<Record> = (0..3)
            .map(|j| Record {
                transactional: false,
                control: false,
                partition_leader_epoch: 0,
                producer_id: 7,
                producer_epoch: 0,
                timestamp_type: TimestampType::Creation,
                offset: j,
                sequence: (i * 3) as i32 + j as i32,
                timestamp: 1_700_000_000_000 + j,
                key: Some(Bytes::from(format!("key-{j}"))),
                value: (j != 2).then(|| Bytes::from(format!("value {i} {j}").repeat(3))),
                headers: [(
                    StrBytes::from_static_str("h"),
                    Some(Bytes::from_static(b"v")),
                )]
                .into_iter()
                .collect(),
                delete_horizon: false,
            })
            .collect();
        RecordBatchEncoder::encode(
            &mut records_blob,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .expect("batch encodes");
    }
    let records_blob = records_blob.freeze();
    let produce = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("t")))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records_blob.clone()))])]);
    let frames = vec![
        frame(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default()),
        frame(ApiKey::Metadata, 12, &MetadataRequest::default()),
        frame(ApiKey::Metadata, 1, &MetadataRequest::default()),
        frame(ApiKey::Produce, 9, &produce),
        frame(ApiKey::Produce, 3, &produce),
    ];
    let mut out = seeds_from_frames(&frames);
    out.push((
        "codec_round_trip",
        b"\x03kafka record bytes 0123456789".to_vec(),
    ));
    out.push(("codec_round_trip", records_blob.to_vec()));
    out
}
