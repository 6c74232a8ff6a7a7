//! Fuzz targets over what the broker reads back from its own disk and
//! from `__consumer_offsets`: each function takes arbitrary bytes and
//! panics when a property that must hold for every input fails. The
//! libFuzzer binaries in `broker/fuzz` are one line each around these, and
//! `tests/fuzz_corpus.rs` replays the committed corpus through them on
//! every `cargo test`. Not part of the crate's API.
//!
//! What lands on disk was written by the broker, but a crash can tear it,
//! a disk can flip it, and an operator can copy in anything; whatever is
//! there, opening must give a consistent log or an error, never a panic.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{BufMut, Bytes, BytesMut};
use protocol::record_batch::{
    rewrite, BatchIter, BatchIterItem, RecordBatchView, HEADER_LEN, OFF_BASE_SEQUENCE,
    OFF_LAST_OFFSET_DELTA, OFF_MAGIC, OFF_MAX_TIMESTAMP, OFF_PRODUCER_EPOCH, OFF_PRODUCER_ID,
    OFF_RECORD_COUNT,
};

use crate::group::consumer::records::ConsumerGroupReplay;
use crate::group::consumer::{ConsumerGroupConfig, ConsumerGroupCoordinator};
use crate::group::records::{self, CoordinatorRecord, RecordFormatError};
use crate::group::{ClassicGroup, ClassicGroupConfig, OffsetStore};
use crate::log::{Log, LogConfig, LogError};
use crate::partition::producer_state::{
    read_snapshot, write_snapshot, ProducerCheck, ProducerSnapshot, ProducerStateManager,
    NUM_BATCHES_TO_RETAIN, SNAPSHOT_FILE,
};
use crate::types::{Offset, ProducerId};

/// The environment variable naming a directory where the broker writes
/// every request frame it reads (see [`capture_frame`]).
pub const CAPTURE_DIR_ENV: &str = "KAFKA_BROKER_CAPTURE_DIR";
/// At most this many frames are captured, and none larger than
/// [`CAPTURE_FRAME_BYTES_MAX`]: a capture is a seed corpus, not a recording.
pub const CAPTURE_FRAMES_MAX: u64 = 50_000;
pub const CAPTURE_FRAME_BYTES_MAX: usize = 256 * 1024;

/// With [`CAPTURE_DIR_ENV`] set, writes `frame` (a request frame body, as
/// the connection read it) to that directory as
/// `<api key>-<api version>-<hash>.bin`, the hash taken without the
/// correlation id so a request repeated is stored once. Off, it costs one
/// load of a initialised `OnceLock`. For seeding the fuzz corpora from
/// real clients (`protocol/fuzz/README.md`); the write is blocking, so it
/// is for test runs only.
pub fn capture_frame(frame: &[u8]) {
    static DIR: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    static CAPTURED: AtomicU64 = AtomicU64::new(0);
    let Some(dir) = DIR.get_or_init(|| {
        let dir = PathBuf::from(std::env::var_os(CAPTURE_DIR_ENV)?);
        std::fs::create_dir_all(&dir).ok()?;
        Some(dir)
    }) else {
        return;
    };
    if frame.len() < 8 || frame.len() > CAPTURE_FRAME_BYTES_MAX {
        return;
    }
    if CAPTURED.fetch_add(1, Ordering::Relaxed) >= CAPTURE_FRAMES_MAX {
        return;
    }
    // FNV-1a over everything but the correlation id.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in frame[..4].iter().chain(&frame[8..]) {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let api_key = i16::from_be_bytes([frame[0], frame[1]]);
    let api_version = i16::from_be_bytes([frame[2], frame[3]]);
    let path = dir.join(format!("{api_key}-{api_version}-{hash:016x}.bin"));
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        use std::io::Write;
        let _ = f.write_all(frame);
    }
}

const NOW_MS: i64 = 1_700_000_000_000;

/// A scratch directory, removed when dropped. Under `/dev/shm` where there
/// is one: the log fsyncs, and on tmpfs that costs nothing.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = std::env::var_os("FUZZ_TMPDIR")
            .map(PathBuf::from)
            .or_else(|| Some(PathBuf::from("/dev/shm")).filter(|p| p.is_dir()))
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!(
            "broker-fuzz-{what}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Scratch(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Reads fields off the front of a fuzz input; short reads give zeros.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }
    fn u16(&mut self) -> u16 {
        let b = self.take(2);
        if b.len() == 2 {
            u16::from_be_bytes([b[0], b[1]])
        } else {
            0
        }
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
}

// ---------------------------------------------------------------------------
// Producer-state snapshot

/// `data` is `[json length: u16][snapshot file][batch headers...]`: the
/// snapshot file is read as the partition reads it at start-up, then each
/// following 20 bytes describe an idempotent batch (producer id, epoch,
/// base sequence, record count, max timestamp) that is checked and, when
/// the state says append, recorded. Checks:
/// - a batch just recorded is then a duplicate of itself;
/// - no producer keeps more than the last five batches once it appends;
/// - the state written as a snapshot reads back equal.
pub fn producer_snapshot(data: &[u8]) {
    let mut input = Input(data);
    let json_len = usize::from(input.u16());
    let json = input.take(json_len);
    let scratch = Scratch::new("snapshot");
    std::fs::write(scratch.path().join(SNAPSHOT_FILE), json).expect("write snapshot");
    let Some(ProducerSnapshot { offset, mut state }) = read_snapshot(scratch.path()) else {
        return;
    };
    let mut next_offset = offset.0.max(0);
    while input.0.len() >= 20 {
        let fields = input.take(20);
        let pid = i64::from(i16::from_be_bytes([fields[0], fields[1]]));
        let epoch = i16::from_be_bytes([fields[2], fields[3]]);
        let base_sequence = i32::from_be_bytes(fields[4..8].try_into().expect("4"));
        let count = i32::from(fields[8] % 8) + 1;
        let max_timestamp = i64::from_be_bytes(fields[12..20].try_into().expect("8"));
        let batch = header_only_batch(pid, epoch, base_sequence, count, max_timestamp, next_offset);
        let view = RecordBatchView::parse(&batch).expect("built batch parses");
        match state.check(&view) {
            Ok(ProducerCheck::Append) => {
                state.update(&view);
                next_offset = next_offset.saturating_add(i64::from(count));
                if pid >= 0 {
                    let entry = state.entry(ProducerId(pid)).expect("just updated");
                    assert!(entry.batches.len() <= NUM_BATCHES_TO_RETAIN);
                    assert!(
                        matches!(state.check(&view), Ok(ProducerCheck::Duplicate(_))),
                        "a batch just appended is not its own duplicate"
                    );
                }
            }
            Ok(ProducerCheck::Duplicate(_)) | Err(_) => {}
        }
        if fields[9] & 1 == 1 {
            state.expire(NOW_MS, i64::from(fields[10]) * 1000);
        }
    }
    let snapshot = ProducerSnapshot {
        offset: Offset(next_offset),
        state: state.clone(),
    };
    write_snapshot(scratch.path(), &snapshot).expect("write snapshot");
    let back = read_snapshot(scratch.path()).expect("a written snapshot reads back");
    assert_eq!(back.offset, Offset(next_offset));
    assert_eq!(back.state, state, "snapshot did not round-trip");
    let _ = ProducerStateManager::default();
}

/// A valid batch with no records payload beyond the header (its CRC
/// sealed): all the producer state looks at.
fn header_only_batch(
    pid: i64,
    epoch: i16,
    base_sequence: i32,
    count: i32,
    max_timestamp: i64,
    base_offset: i64,
) -> Vec<u8> {
    let mut b = vec![0u8; HEADER_LEN + count as usize * 7];
    b[OFF_MAGIC] = 2;
    b[OFF_LAST_OFFSET_DELTA..OFF_LAST_OFFSET_DELTA + 4].copy_from_slice(&(count - 1).to_be_bytes());
    b[OFF_MAX_TIMESTAMP..OFF_MAX_TIMESTAMP + 8].copy_from_slice(&max_timestamp.to_be_bytes());
    b[OFF_PRODUCER_ID..OFF_PRODUCER_ID + 8].copy_from_slice(&pid.to_be_bytes());
    b[OFF_PRODUCER_EPOCH..OFF_PRODUCER_EPOCH + 2].copy_from_slice(&epoch.to_be_bytes());
    b[OFF_BASE_SEQUENCE..OFF_BASE_SEQUENCE + 4].copy_from_slice(&base_sequence.to_be_bytes());
    b[OFF_RECORD_COUNT..OFF_RECORD_COUNT + 4].copy_from_slice(&count.to_be_bytes());
    rewrite::set_base_offset(&mut b, base_offset);
    rewrite::seal(&mut b);
    b
}

// ---------------------------------------------------------------------------
// Segment recovery

/// `data` is a partition directory: `[flags][log-start-offset file?]` then
/// segments as `[base offset step: u16][length: u16][bytes]` (the last one
/// takes the rest). Flags: bit 0 a clean-shutdown marker, bit 1 a
/// log-start-offset file (`[length: u8][bytes]` follows), bits 2-3 the
/// number of segments less one. The log is opened as at start-up.
/// Checks, when it opens:
/// - log start <= log end; the batches from the log start parse, and their
///   offsets rise from there to the log end;
/// - recovery is idempotent: closed uncleanly and opened again, the log
///   holds the same batches (after a clean open, whose closed segments were
///   not CRC-checked, the first unclean one may cut further, so only the
///   second is compared);
/// - a batch appended at the log end reads back;
/// - the timestamp lookups stay within the log.
pub fn log_recovery(data: &[u8]) {
    let mut input = Input(data);
    let flags = input.u8();
    let scratch = Scratch::new("log");
    let dir = scratch.path().join("topic-0");
    std::fs::create_dir_all(&dir).expect("partition directory");
    if flags & 1 == 1 {
        std::fs::write(dir.join("clean-shutdown"), b"").expect("marker");
    }
    if flags & 2 == 2 {
        let n = usize::from(input.u8());
        std::fs::write(dir.join("log-start-offset"), input.take(n)).expect("log start");
    }
    let segments = usize::from((flags >> 2) & 3) + 1;
    let mut base = 0i64;
    for i in 0..segments {
        base += i64::from(input.u16());
        let bytes = if i + 1 == segments {
            input.rest()
        } else {
            let n = usize::from(input.u16());
            input.take(n)
        };
        std::fs::write(dir.join(format!("{base:020}.log")), bytes).expect("segment");
    }
    let config = LogConfig {
        index_interval_bytes: 128,
        ..LogConfig::default()
    };
    let Ok(log) = Log::open(dir.clone(), config.clone(), NOW_MS) else {
        return;
    };
    let unclean = flags & 1 == 0;
    let first = check_log(&log, unclean);
    drop(log);
    // An unclean reopen (no close: a crash) recovers what the first open left.
    let log = Log::open(dir.clone(), config.clone(), NOW_MS).expect("a recovered log reopens");
    let second = check_log(&log, true);
    if unclean {
        assert_eq!(first, second, "recovery is not idempotent");
    }
    drop(log);
    let mut log = Log::open(dir.clone(), config.clone(), NOW_MS).expect("reopens again");
    assert_eq!(
        second,
        check_log(&log, true),
        "the second recovery changed the log"
    );

    // An append at the log end reads back.
    let end = log.log_end_offset();
    let batch = header_only_batch(-1, -1, -1, 1, NOW_MS, end.0);
    match log.append(&batch, NOW_MS) {
        Ok(()) => {
            assert_eq!(log.log_end_offset(), Offset(end.0 + 1));
            let read = log
                .read(end, 1 << 20, Offset(i64::MAX), true)
                .expect("the appended batch reads");
            assert_eq!(
                &read[..],
                &batch[..],
                "the appended batch reads back unchanged"
            );
        }
        // The log end is at i64::MAX's edge, say.
        Err(LogError::NonMonotonicOffset { .. } | LogError::InvalidBatch(_)) => {}
        Err(e) => panic!("append after recovery failed: {e}"),
    }
    log.close().expect("close");
    let log = Log::open(dir, config, NOW_MS).expect("reopens after a clean close");
    check_log(&log, false);
}

/// The log's batches from its start, checked; what recovery left.
/// Recovery CRC-checks only the active segment (closed ones were fsynced
/// when rolled, as in Kafka), so a damaged closed segment keeps batches
/// that do not parse; their headers still order the offsets. With one
/// segment, recovered without a clean-shutdown marker, every batch must
/// parse and carry a valid CRC.
fn check_log(log: &Log, verified: bool) -> (Offset, Offset, Vec<Bytes>) {
    use protocol::record_batch::{i32_at, i64_at, OFF_BASE_OFFSET};
    let start = log.log_start_offset();
    let end = log.log_end_offset();
    assert!(start <= end, "log start {start:?} above log end {end:?}");
    let bases = log.segment_base_offsets();
    assert!(
        bases.windows(2).all(|w| w[0] < w[1]),
        "segments out of order"
    );
    let verified = verified && bases.len() == 1;
    let mut batches = Vec::new();
    let mut next = None::<i64>;
    for batch in log.batches_from(start) {
        let batch = batch.unwrap_or_else(|e| panic!("reading a recovered log failed: {e}"));
        assert!(
            batch.len() >= HEADER_LEN,
            "a recovered batch shorter than a header"
        );
        let base = i64_at(&batch, OFF_BASE_OFFSET);
        let last = base + i64::from(i32_at(&batch, OFF_LAST_OFFSET_DELTA));
        if let Some(next) = next {
            assert!(base >= next, "offsets go back");
        }
        assert!(last < end.0, "a batch past the log end");
        next = Some(last + 1);
        if verified {
            let view = RecordBatchView::parse(&batch).expect("recovered batches parse");
            view.verify_crc()
                .expect("recovered batches have valid CRCs");
        }
        batches.push(batch);
    }
    if start < end {
        // What a fetch from the log start returns is the same bytes.
        let read = log
            .read(start, 64 << 20, Offset(i64::MAX), true)
            .expect("reads from the log start");
        assert!(
            read[..] == batches.concat()[..],
            "a fetch from the log start reads other bytes"
        );
    }
    if let Ok((ts, offset)) = log.max_timestamp() {
        assert!(ts == -1 || (offset >= start.min(Offset(0)) && offset < end.max(Offset(1))));
    }
    if let Ok(Some((offset, _))) = log.offset_for_timestamp(0) {
        assert!(
            offset >= start && offset < end,
            "timestamp lookup outside the log"
        );
    }
    (start, end, batches)
}

// ---------------------------------------------------------------------------
// Coordinator records

/// `data` is a run of `__consumer_offsets` records, each
/// `[tombstone: u8][key length: u16][key][value length: u16][value]`.
/// Each is decoded as the coordinator loads them, and what decodes:
/// - encodes again (unless a string is longer than Kafka's writers allow)
///   and decodes to the same record;
/// - replays into the offset store and the consumer-group loader, whose
///   snapshots restore into a coordinator, and whose classic groups
///   rebuild, as on a coordinator failover.
pub fn coordinator_records(data: &[u8]) {
    let mut input = Input(data);
    let mut decoded = Vec::new();
    while !input.0.is_empty() {
        let tombstone = input.u8() & 1 == 1;
        let key_len = usize::from(input.u16());
        let key = input.take(key_len);
        let value_len = usize::from(input.u16());
        let value = input.take(value_len);
        let value = (!tombstone).then_some(value);
        let Ok(record) = records::decode(key, value) else {
            continue;
        };
        match records::encode(&record) {
            Ok((k, v)) => {
                let again = records::decode(&k, v.as_deref()).expect("an encoded record decodes");
                assert_eq!(again, record, "record did not round-trip");
            }
            Err(RecordFormatError::StringTooLong { .. }) => {}
            Err(e) => panic!("a decoded record does not encode: {e}"),
        }
        decoded.push(record);
    }
    replay(&decoded);
}

fn replay(records: &[CoordinatorRecord]) {
    let mut offsets = OffsetStore::new();
    let mut consumer = ConsumerGroupReplay::new();
    for r in records {
        offsets.apply(r);
        consumer.apply(r);
    }
    let config = ConsumerGroupConfig::default();
    let mut coordinator = ConsumerGroupCoordinator::new(config.clone());
    for snapshot in consumer.snapshots(&config) {
        let _ = coordinator.restore(snapshot, NOW_MS);
    }
    for (group_id, metadata) in offsets.group_metadata_all() {
        ClassicGroup::from_group_metadata(
            group_id,
            ClassicGroupConfig::default(),
            metadata.clone(),
            NOW_MS,
        );
    }
}

/// Seeds for the targets above, built from what the broker writes: valid
/// inputs the fuzzer starts from (`broker/fuzz`'s `write_seeds` puts them
/// in the corpus directories).
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();

    // A snapshot of two producers, then batches continuing and duplicating them.
    let mut state = ProducerStateManager::default();
    let mut offset = 0;
    for (pid, seq) in [(1i64, 0i32), (1, 3), (2, 0), (1, 6), (2, 2)] {
        let b = header_only_batch(pid, 0, seq, 3, NOW_MS, offset);
        state.update(&RecordBatchView::parse(&b).expect("parses"));
        offset += 3;
    }
    let scratch = Scratch::new("seeds");
    write_snapshot(
        scratch.path(),
        &ProducerSnapshot {
            offset: Offset(offset),
            state,
        },
    )
    .expect("write");
    let json = std::fs::read(scratch.path().join(SNAPSHOT_FILE)).expect("read");
    let mut seed = Vec::new();
    seed.put_u16(json.len() as u16);
    seed.extend_from_slice(&json);
    for (pid, epoch, seq) in [(1i16, 0i16, 9i32), (1, 0, 9), (2, 1, 0), (3, 0, 5)] {
        seed.put_i16(pid);
        seed.put_i16(epoch);
        seed.put_i32(seq);
        seed.extend_from_slice(&[2, 1, 5, 0]);
        seed.put_i64(NOW_MS);
    }
    out.push(("producer_snapshot", seed));

    // Logs: one segment of batches in every codec; two segments with a
    // torn tail; a clean shutdown with a log start offset.
    let batches = sample_batches(0);
    let mut one = vec![0u8];
    one.put_u16(0);
    one.extend_from_slice(&batches);
    out.push(("log_recovery", one));
    let first = sample_batches(0);
    let count = BatchIter::new(&first)
        .filter_map(|i| match i {
            BatchIterItem::Batch { batch, .. } => Some(batch.last_offset() + 1),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let second = sample_batches(count);
    let mut two = vec![1u8 << 2];
    two.put_u16(0);
    two.put_u16(first.len() as u16);
    two.extend_from_slice(&first);
    two.put_u16(count as u16);
    two.extend_from_slice(&second[..second.len() - 5]);
    out.push(("log_recovery", two));
    let mut clean = vec![1u8 | 2];
    clean.push(2);
    clean.extend_from_slice(b"3\n");
    clean.put_u16(0);
    clean.extend_from_slice(&batches);
    out.push(("log_recovery", clean));

    // Coordinator records of every kind the encoders write.
    let mut records = Vec::new();
    for record in sample_records() {
        let (k, v) = records::encode(&record).expect("samples encode");
        records.push(u8::from(v.is_none()));
        records.put_u16(k.len() as u16);
        records.extend_from_slice(&k);
        let v = v.unwrap_or_default();
        records.put_u16(v.len() as u16);
        records.extend_from_slice(&v);
    }
    out.push(("coordinator_records", records));
    security_seeds(&mut out);
    out
}

/// A run of stored batches from `base_offset`: one per codec, with keys,
/// values and headers, offsets assigned as a leader assigns them.
pub fn sample_batches(base_offset: i64) -> Vec<u8> {
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };
    let mut out = BytesMut::new();
    let mut offset = base_offset;
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
                offset: offset + j,
                sequence: (offset + j) as i32,
                timestamp: NOW_MS + i as i64 * 10 + j,
                key: Some(Bytes::from(format!("key-{j}"))),
                value: (j != 2).then(|| Bytes::from(format!("value {i} {j}"))),
                headers: Default::default(),
                delete_horizon: false,
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
        .expect("encodes");
        out.extend_from_slice(&buf);
        offset += 3;
    }
    out.to_vec()
}

/// One record of each kind the coordinator writes most: a committed
/// offset, a classic group with a member, a consumer group's epoch, and
/// tombstones.
fn sample_records() -> Vec<CoordinatorRecord> {
    use crate::group::consumer::records::{ConsumerGroupMetadataValue, ConsumerGroupRecord};
    use crate::group::consumer::Epoch;
    use crate::group::offsets::OffsetAndMetadata;
    use crate::group::{GenerationId, GroupMetadata, MemberId, MemberMetadata};
    let offset = OffsetAndMetadata {
        committed_offset: 42,
        committed_leader_epoch: Some(3),
        metadata: "m".into(),
        commit_timestamp_ms: NOW_MS,
        expire_timestamp_ms: None,
        topic_id: None,
    };
    let group = GroupMetadata {
        protocol_type: Some("consumer".into()),
        generation_id: GenerationId(2),
        protocol_name: Some("range".into()),
        leader: Some(MemberId("member-1".into())),
        current_state_timestamp_ms: NOW_MS,
        members: vec![MemberMetadata {
            member_id: MemberId("member-1".into()),
            group_instance_id: None,
            client_id: "client".into(),
            client_host: "/127.0.0.1".into(),
            rebalance_timeout_ms: 30_000,
            session_timeout_ms: 10_000,
            subscription: Bytes::from_static(&[0, 1, 0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 0]),
            assignment: Bytes::from_static(&[0, 1, 0, 0, 0, 0, 0, 0, 0, 0]),
        }],
    };
    vec![
        CoordinatorRecord::OffsetCommit {
            group_id: "g".into(),
            topic: "t".into(),
            partition: 0,
            value: Some(offset),
        },
        CoordinatorRecord::GroupMetadata {
            group_id: "g".into(),
            value: Some(group),
        },
        CoordinatorRecord::ConsumerGroup(ConsumerGroupRecord::GroupMetadata {
            group_id: "cg".into(),
            value: Some(ConsumerGroupMetadataValue {
                epoch: Epoch(5),
                metadata_hash: 0,
                creation_time_ms: NOW_MS,
            }),
        }),
        CoordinatorRecord::OffsetCommit {
            group_id: "g".into(),
            topic: "t".into(),
            partition: 1,
            value: None,
        },
    ]
}

/// Seed inputs from a broker's `log.dirs` after a real run: each
/// partition's segments (cut at a batch boundary to 64 KiB) for
/// `log_recovery`, its producer-state snapshot for `producer_snapshot`,
/// and the records of `__consumer_offsets` for `coordinator_records`.
pub fn seeds_from_data_dir(data_dir: &Path) -> Vec<(&'static str, Vec<u8>)> {
    use kafka_protocol::records::RecordBatchDecoder;
    const SEGMENT_BYTES_MAX: usize = 64 * 1024;
    let mut out = Vec::new();
    let Ok(partitions) = std::fs::read_dir(data_dir) else {
        return out;
    };
    let mut partitions: Vec<PathBuf> = partitions
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    partitions.sort();
    for dir in partitions {
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
        let offsets_topic = name
            .as_deref()
            .is_some_and(|n| n.starts_with("__consumer_offsets-"));
        if let Ok(json) = std::fs::read(dir.join(SNAPSHOT_FILE)) {
            if let Ok(len) = u16::try_from(json.len()) {
                let mut seed = len.to_be_bytes().to_vec();
                seed.extend_from_slice(&json);
                out.push(("producer_snapshot", seed));
            }
        }
        let Ok(files) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut segments: Vec<PathBuf> = files
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        segments.sort();
        for segment in segments {
            let Ok(bytes) = std::fs::read(&segment) else {
                continue;
            };
            if bytes.is_empty() {
                continue;
            }
            let mut cut = 0;
            let mut records = Vec::new();
            for item in BatchIter::new(&bytes) {
                let BatchIterItem::Batch { position, batch } = item else {
                    break;
                };
                if position + batch.len() <= SEGMENT_BYTES_MAX {
                    cut = position + batch.len();
                }
                if offsets_topic && !batch.is_control() {
                    let mut one = Bytes::copy_from_slice(batch.as_bytes());
                    if let Ok(set) = RecordBatchDecoder::decode(&mut one) {
                        for r in set.records {
                            let Some(key) = r.key else { continue };
                            records.push(u8::from(r.value.is_none()));
                            records.put_u16(key.len().min(u16::MAX as usize) as u16);
                            records.extend_from_slice(&key[..key.len().min(u16::MAX as usize)]);
                            let value = r.value.unwrap_or_default();
                            records.put_u16(value.len().min(u16::MAX as usize) as u16);
                            records.extend_from_slice(&value[..value.len().min(u16::MAX as usize)]);
                        }
                    }
                }
            }
            if cut > 0 {
                let mut seed = vec![0u8];
                seed.put_u16(0);
                seed.extend_from_slice(&bytes[..cut]);
                out.push(("log_recovery", seed));
            }
            if !records.is_empty() {
                out.push(("coordinator_records", records));
            }
        }
    }
    out
}

/// The fuzz targets of this crate by name, as `broker/fuzz` names its
/// binaries and corpus directories.
pub const TARGETS: &[(&str, protocol::fuzzing::Target)] = &[
    ("producer_snapshot", producer_snapshot),
    ("log_recovery", log_recovery),
    ("coordinator_records", coordinator_records),
    ("sasl_exchange", sasl_exchange),
    ("certificate_subject", certificate_subject),
];

/// The SASL exchange as an unauthenticated client drives it: the first byte
/// picks the mechanism, the rest is a sequence of client messages, each a
/// big-endian `u16` length and that many bytes (a short last message takes
/// what is left). The listener has PLAIN user `alice`, a SCRAM credential
/// for `alice` under both hashes, and OAUTHBEARER's unsecured validator.
///
/// Properties: no input panics; a challenge stays small; once an exchange
/// has succeeded or failed, every further message fails; PLAIN and SCRAM
/// only ever authenticate `alice`.
pub fn sasl_exchange(data: &[u8]) {
    use crate::security::sasl::{self, Mechanism, Step};

    let Some((&selector, mut rest)) = data.split_first() else {
        return;
    };
    let (configs, creds) = sasl_fixture();
    let index = usize::from(selector) % Mechanism::ALL.len();
    let mech = Mechanism::ALL[index];
    let mut exchange = sasl::authenticator(mech, &configs[index], creds);
    let mut finished = false;
    while !rest.is_empty() {
        let message = if rest.len() >= 2 {
            let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
            let body = &rest[2..];
            let take = len.min(body.len());
            rest = &body[take..];
            &body[..take]
        } else {
            std::mem::take(&mut rest)
        };
        let step = exchange.step(message);
        if finished {
            assert!(
                matches!(step, Step::Failed { .. }),
                "{mech}: a message after the end of the exchange answered {step:?}"
            );
            continue;
        }
        match step {
            Step::Challenge(challenge) => assert!(
                challenge.len() <= 4096,
                "{mech}: a {}-byte challenge",
                challenge.len()
            ),
            Step::Done { principal, .. } => {
                if mech != Mechanism::OAuthBearer {
                    assert_eq!(principal, "alice", "{mech} authenticated a stranger");
                }
                finished = true;
            }
            Step::Failed { .. } => finished = true,
        }
    }
}

/// One configuration per mechanism (in [`Mechanism::ALL`]'s order) and the
/// SCRAM credentials, built once: PBKDF2 at 4096 iterations is too slow to
/// repeat per input.
fn sasl_fixture() -> &'static (
    Vec<std::sync::Arc<crate::security::sasl::MechanismConfig>>,
    std::sync::Arc<dyn crate::security::sasl::CredentialSource>,
) {
    use std::sync::{Arc, OnceLock};

    use crate::security::sasl::{
        CredentialSource, Mechanism, MechanismConfig, ScramCredential, ScramMechanism,
    };

    struct Alice(ScramCredential, ScramCredential);
    impl CredentialSource for Alice {
        fn scram(&self, mechanism: ScramMechanism, user: &str) -> Option<ScramCredential> {
            (user == "alice").then(|| match mechanism {
                ScramMechanism::Sha256 => self.0.clone(),
                ScramMechanism::Sha512 => self.1.clone(),
            })
        }
    }

    type Fixture = (Vec<Arc<MechanismConfig>>, Arc<dyn CredentialSource>);
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        const JAAS: &str = r#"org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret";"#;
        let configs = Mechanism::ALL
            .into_iter()
            .map(|mech| {
                let get = |key: &str| (key == "sasl.jaas.config").then(|| JAAS.to_owned());
                Arc::new(MechanismConfig::from_config(mech, &get).expect("fixture config"))
            })
            .collect();
        let salt = b"fuzz-salt";
        let creds: Arc<dyn CredentialSource> = Arc::new(Alice(
            ScramCredential::from_password(ScramMechanism::Sha256, "alice-secret", salt, 4096),
            ScramCredential::from_password(ScramMechanism::Sha512, "alice-secret", salt, 4096),
        ));
        (configs, creds)
    })
}

/// A client certificate's subject, read by the broker's own DER reader
/// (`ssl.client.auth` principals), then mapped by a rule set: never a
/// panic, and the same subject always maps to the same name. The bytes are
/// also tried as mapping rules.
pub fn certificate_subject(data: &[u8]) {
    use crate::security::tls::{subject_dn, PrincipalMapper};
    use std::sync::OnceLock;

    static MAPPER: OnceLock<PrincipalMapper> = OnceLock::new();
    let mapper = MAPPER.get_or_init(|| {
        PrincipalMapper::parse(
            r"RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1@$3/L,RULE:^.*CN=([^,]*).*$/$1/U,DEFAULT",
        )
        .expect("fixture rules")
    });
    if let Some(dn) = subject_dn(data) {
        // An empty CN can map to an empty name, as in Kafka; what must hold
        // is that a subject always maps the same way.
        let name = mapper.map(&dn);
        assert_eq!(mapper.map(&dn), name, "{dn:?} mapped two ways");
    }
    if let Ok(rules) = std::str::from_utf8(data) {
        if let Ok(mapper) = PrincipalMapper::parse(rules) {
            let _ = mapper.map("CN=alice,OU=ops,O=Example");
        }
    }
}

/// Built-in seeds of the security targets: a successful exchange per
/// mechanism's opening and a certificate with the attribute kinds the
/// subject reader formats differently.
fn security_seeds(out: &mut Vec<(&'static str, Vec<u8>)>) {
    use base64::Engine as _;

    let framed = |selector: u8, messages: &[&[u8]]| {
        let mut seed = vec![selector];
        for m in messages {
            seed.extend_from_slice(&(m.len() as u16).to_be_bytes());
            seed.extend_from_slice(m);
        }
        seed
    };
    let position = |name: &str| {
        crate::security::sasl::Mechanism::ALL
            .iter()
            .position(|m| m.name() == name)
            .expect("mechanism") as u8
    };
    out.push((
        "sasl_exchange",
        framed(position("PLAIN"), &[b"\0alice\0alice-secret", b"again"]),
    ));
    for scram in ["SCRAM-SHA-256", "SCRAM-SHA-512"] {
        out.push((
            "sasl_exchange",
            framed(
                position(scram),
                &[
                    b"n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL",
                    b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
                ],
            ),
        ));
    }
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let token = format!(
        "{}.{}.",
        b64.encode(br#"{"alg":"none"}"#),
        b64.encode(br#"{"sub":"alice","iat":1700000000,"exp":4102444800,"scope":"a b"}"#)
    );
    let first = format!("n,,\x01auth=Bearer {token}\x01\x01");
    out.push((
        "sasl_exchange",
        framed(position("OAUTHBEARER"), &[first.as_bytes(), b"\x01"]),
    ));
    out.push((
        "certificate_subject",
        include_bytes!("../fuzz/corpus/certificate_subject/seed-ec-cert.der").to_vec(),
    ));
}
