use std::fs;
use std::path::Path;

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use protocol::record_batch::{rewrite, BatchIter, BatchIterItem, RecordBatchView};

use super::*;

/// A record for a test batch: key, value (None = tombstone), timestamp.
type Rec<'a> = (Option<&'a str>, Option<&'a str>, i64);

fn encode(base: i64, recs: &[Rec<'_>], compression: Compression, producer_id: i64) -> Vec<u8> {
    let records: Vec<Record> = recs
        .iter()
        .enumerate()
        .map(|(i, (k, v, ts))| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id,
            producer_epoch: if producer_id >= 0 { 0 } else { -1 },
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: i as i32,
            timestamp: *ts,
            key: k.map(|k| Bytes::copy_from_slice(k.as_bytes())),
            value: v.map(|v| Bytes::copy_from_slice(v.as_bytes())),
            headers: IndexMap::new(),
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
    .expect("encode");
    let mut bytes = buf.to_vec();
    rewrite::set_base_offset(&mut bytes, base);
    bytes
}

fn plain(base: i64, n: usize, ts: i64) -> Vec<u8> {
    let recs: Vec<Rec<'_>> = (0..n).map(|_| (None, Some("value-bytes"), ts)).collect();
    encode(base, &recs, Compression::None, -1)
}

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 1000,
        index_interval_bytes: 200,
        ..LogConfig::default()
    }
}

/// Appends `count` batches of `n` records with timestamps `ts0 + i`,
/// returning their bytes.
fn fill(log: &mut Log, count: usize, n: usize, ts0: i64) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| {
            let b = plain(log.log_end_offset().0, n, ts0 + i as i64);
            log.append(&b, 0).expect("append");
            b
        })
        .collect()
}

fn all(log: &Log, from: i64) -> Bytes {
    log.read(Offset(from), usize::MAX, Offset(i64::MAX), true)
        .expect("read")
}

fn batches(blob: &[u8]) -> Vec<RecordBatchView<'_>> {
    BatchIter::new(blob)
        .map(|item| match item {
            BatchIterItem::Batch { batch, .. } => batch,
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

/// (offset, key, value) of every record in a blob.
fn decoded(blob: &Bytes) -> Vec<(i64, Option<String>, Option<String>)> {
    let mut buf = blob.clone();
    let sets = RecordBatchDecoder::decode_all(&mut buf).expect("decode");
    let s = |b: &Option<Bytes>| b.as_ref().map(|b| String::from_utf8(b.to_vec()).unwrap());
    sets.iter()
        .flat_map(|set| set.records.iter())
        .map(|r| (r.offset, s(&r.key), s(&r.value)))
        .collect()
}

fn log_file(dir: &Path, base: i64) -> std::path::PathBuf {
    dir.join(format!("{base:020}.log"))
}

#[test]
fn append_and_read_round_trip_across_segment_rolls() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path().join("p"), config(), 0).unwrap();
    let appended = fill(&mut log, 40, 3, 1_000);
    assert_eq!(log.log_end_offset(), Offset(120));
    assert!(
        log.segment_base_offsets().len() > 3,
        "{:?}",
        log.segment_base_offsets()
    );
    assert_eq!(all(&log, 0).to_vec(), appended.concat());
    // Every offset reads from the batch containing it.
    for offset in 0..120 {
        let got = log.read(Offset(offset), 1, Offset(i64::MAX), true).unwrap();
        assert_eq!(
            got.to_vec(),
            appended[(offset / 3) as usize],
            "offset {offset}"
        );
    }
    assert_eq!(
        log.size_bytes(),
        appended.iter().map(|b| b.len() as u64).sum::<u64>()
    );
    let batches_seen: Vec<Bytes> = log.batches_from(Offset(61)).map(|b| b.unwrap()).collect();
    assert_eq!(batches_seen.len(), 20);
    assert_eq!(batches_seen[0].to_vec(), appended[20]);
}

#[test]
fn append_rejects_a_base_offset_other_than_the_log_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path().to_path_buf(), config(), 0).unwrap();
    fill(&mut log, 1, 2, 0);
    for base in [0, 1, 3] {
        assert!(matches!(
            log.append(&plain(base, 1, 0), 0),
            Err(LogError::NonMonotonicOffset { .. })
        ));
    }
    let mut big = config();
    big.max_message_bytes = 50;
    log.set_config(big);
    assert!(matches!(
        log.append(&plain(2, 1, 0), 0),
        Err(LogError::RecordBatchTooLarge { .. })
    ));
    // The limit is for clients: a leader's batch is replicated whatever
    // the limit is now.
    log.append_replicated(&plain(2, 1, 0), 0).unwrap();
    assert_eq!(log.log_end_offset(), Offset(3));
    assert!(matches!(
        log.append(&[0u8; 10], 0),
        Err(LogError::InvalidBatch(_))
    ));
}

#[test]
fn read_honours_max_bytes_min_one_batch_and_max_offset() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path().to_path_buf(), config(), 0).unwrap();
    let b = fill(&mut log, 6, 2, 0);
    let len = b[0].len();
    let read = |o, max_bytes, max_offset, min_one| {
        log.read(Offset(o), max_bytes, Offset(max_offset), min_one)
            .unwrap()
            .to_vec()
    };
    // max_bytes below one batch: one batch only if min_one_batch.
    assert_eq!(read(3, 1, 100, true), b[1]);
    assert!(read(3, 1, 100, false).is_empty());
    // Budget for exactly two batches.
    assert_eq!(
        read(2, 2 * len + len / 2, 100, false),
        [&b[1][..], &b[2][..]].concat()
    );
    // max_offset is exclusive on batch base offsets.
    assert_eq!(
        read(0, usize::MAX, 4, true),
        [&b[0][..], &b[1][..]].concat()
    );
    assert_eq!(read(0, usize::MAX, 5, true), b[..3].concat());
    assert!(read(4, usize::MAX, 4, true).is_empty());
    // At the log end: empty; beyond it or below the start: out of range.
    assert!(read(12, usize::MAX, 100, true).is_empty());
    assert!(matches!(
        log.read(Offset(13), 100, Offset(100), true),
        Err(LogError::OffsetOutOfRange {
            requested: Offset(13),
            log_start: Offset(0),
            log_end: Offset(12)
        })
    ));
    log.delete_records_before(Offset(5)).unwrap();
    assert!(matches!(
        log.read(Offset(4), 100, Offset(100), true),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    // The batch containing the log start offset is returned whole.
    assert_eq!(
        log.read(Offset(5), 1, Offset(100), true).unwrap().to_vec(),
        b[2]
    );
}

/// Writes three batches, then leaves the log as a crash would (no close).
fn crashed_log(dir: &Path) -> Vec<Vec<u8>> {
    let mut log = Log::open(dir.to_path_buf(), LogConfig::default(), 0).unwrap();
    let b = fill(&mut log, 3, 2, 0);
    drop(log);
    b
}

#[test]
fn recovery_truncates_a_torn_tail_at_every_byte_position() {
    let root = tempfile::tempdir().unwrap();
    let last_len = plain(4, 2, 2).len();
    for cut in 1..=last_len {
        let dir = root.path().join(format!("cut-{cut}"));
        let b = crashed_log(&dir);
        let file = fs::OpenOptions::new()
            .write(true)
            .open(log_file(&dir, 0))
            .unwrap();
        let full = (b[0].len() + b[1].len() + b[2].len()) as u64;
        file.set_len(full - cut as u64).unwrap();
        let log = Log::open(dir.clone(), LogConfig::default(), 0).unwrap();
        assert_eq!(log.log_end_offset(), Offset(4), "cut {cut}");
        assert_eq!(all(&log, 0).to_vec(), b[..2].concat(), "cut {cut}");
        assert_eq!(
            fs::metadata(log_file(&dir, 0)).unwrap().len(),
            full - last_len as u64
        );
    }
}

#[test]
fn recovery_drops_a_last_batch_whose_crc_does_not_match() {
    let dir = tempfile::tempdir().unwrap();
    let b = crashed_log(dir.path());
    let path = log_file(dir.path(), 0);
    let mut bytes = fs::read(&path).unwrap();
    let i = bytes.len() - 3; // inside the last record: only the CRC notices
    bytes[i] ^= 0xff;
    fs::write(&path, &bytes).unwrap();
    let mut log = Log::open(dir.path().to_path_buf(), LogConfig::default(), 0).unwrap();
    assert_eq!(log.log_end_offset(), Offset(4));
    assert_eq!(all(&log, 0).to_vec(), b[..2].concat());
    // The log continues from the truncation point.
    log.append(&plain(4, 1, 0), 0).unwrap();
    assert_eq!(log.log_end_offset(), Offset(5));
}

#[test]
fn recovery_removes_garbage_after_the_last_batch() {
    let dir = tempfile::tempdir().unwrap();
    let b = crashed_log(dir.path());
    let path = log_file(dir.path(), 0);
    let mut bytes = fs::read(&path).unwrap();
    bytes.extend_from_slice(&[0xab; 100]);
    fs::write(&path, &bytes).unwrap();
    // Also leftovers of interrupted atomic writes and cleaning.
    fs::write(dir.path().join("00000000000000000000.log.cleaned"), b"x").unwrap();
    fs::write(dir.path().join("log-start-offset.tmp"), b"x").unwrap();
    let log = Log::open(dir.path().to_path_buf(), LogConfig::default(), 0).unwrap();
    assert_eq!(log.log_end_offset(), Offset(6));
    assert_eq!(all(&log, 0).to_vec(), b.concat());
    assert!(!dir.path().join("00000000000000000000.log.cleaned").exists());
    assert!(!dir.path().join("log-start-offset.tmp").exists());
}

#[test]
fn recovery_of_a_corrupt_closed_segment_removes_later_segments() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path().to_path_buf(), config(), 0).unwrap();
    fill(&mut log, 30, 2, 0);
    let bases = log.segment_base_offsets();
    assert!(bases.len() >= 3);
    drop(log);
    // A header that cannot parse in the middle of the first segment.
    let path = log_file(dir.path(), 0);
    let mut bytes = fs::read(&path).unwrap();
    let first_len = RecordBatchView::peek_len(&bytes).unwrap();
    bytes[first_len + 16] = 7; // magic of the second batch
    fs::write(&path, &bytes).unwrap();
    let log = Log::open(dir.path().to_path_buf(), config(), 0).unwrap();
    assert_eq!(log.segment_base_offsets(), vec![Offset(0)]);
    assert_eq!(log.log_end_offset(), Offset(2));
    for base in &bases[1..] {
        assert!(!log_file(dir.path(), base.0).exists());
    }
}

/// A closed segment cut by recovery becomes the tail, and its batches
/// before the cut are CRC-checked in the same recovery, so a second one
/// changes nothing (found by the `log_recovery` fuzz target: the first
/// recovery kept a batch with a bad CRC, the second cut it).
#[test]
fn a_cut_closed_segment_is_checked_whole_in_the_same_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path().to_path_buf(), config(), 0).unwrap();
    fill(&mut log, 30, 2, 0);
    assert!(log.segment_base_offsets().len() >= 3);
    drop(log);
    let path = log_file(dir.path(), 0);
    let mut bytes = fs::read(&path).unwrap();
    let first_len = RecordBatchView::peek_len(&bytes).unwrap();
    let second_len = RecordBatchView::peek_len(&bytes[first_len..]).unwrap();
    // The second batch's records (only its CRC notices), then a header
    // that cannot parse in the third.
    bytes[first_len + second_len - 3] ^= 0xff;
    bytes[first_len + second_len + 16] = 7;
    fs::write(&path, &bytes).unwrap();
    let log = Log::open(dir.path().to_path_buf(), config(), 0).unwrap();
    assert_eq!(log.segment_base_offsets(), vec![Offset(0)]);
    assert_eq!(log.log_end_offset(), Offset(2));
    let first = all(&log, 0).to_vec();
    drop(log);
    let log = Log::open(dir.path().to_path_buf(), config(), 0).unwrap();
    assert_eq!(log.log_end_offset(), Offset(2));
    assert_eq!(all(&log, 0).to_vec(), first);
}

#[test]
fn reopen_after_clean_close_keeps_everything_and_indexes_work() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path().to_path_buf(), config(), 0).unwrap();
    let b = fill(&mut log, 40, 3, 0);
    log.close().unwrap();
    assert!(dir.path().join(CLEAN_SHUTDOWN_FILE).exists());
    // There are no index files to lose: indexes are rebuilt on open.
    let mut log = Log::open(dir.path().to_path_buf(), config(), 0).unwrap();
    assert!(!dir.path().join(CLEAN_SHUTDOWN_FILE).exists());
    assert_eq!(log.log_end_offset(), Offset(120));
    assert_eq!(all(&log, 0).to_vec(), b.concat());
    for offset in [0, 1, 50, 77, 119] {
        let got = log.read(Offset(offset), 1, Offset(i64::MAX), true).unwrap();
        assert_eq!(got.to_vec(), b[(offset / 3) as usize]);
    }
    log.append(&plain(120, 1, 0), 0).unwrap();
    assert_eq!(log.log_end_offset(), Offset(121));
}

#[test]
fn segment_ms_rolls_by_record_timestamps() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config();
    cfg.segment_bytes = 1 << 20;
    cfg.segment_ms = 100;
    let mut log = Log::open(dir.path().to_path_buf(), cfg, 0).unwrap();
    log.append(&plain(0, 1, 1_000), 0).unwrap();
    log.append(&plain(1, 1, 1_100), 0).unwrap();
    assert_eq!(log.segment_base_offsets(), vec![Offset(0)]);
    log.append(&plain(2, 1, 1_101), 0).unwrap();
    assert_eq!(log.segment_base_offsets(), vec![Offset(0), Offset(2)]);
    // maintain rolls a non-empty active segment older than segment.ms.
    let report = log.maintain(50, Offset(0)).unwrap();
    assert!(!report.rolled);
    let report = log.maintain(101, Offset(0)).unwrap();
    assert!(report.rolled);
    assert_eq!(log.segment_base_offsets().len(), 3);
}

#[test]
fn retention_by_time_deletes_old_segments_and_advances_the_log_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config();
    cfg.retention_ms = 1_000;
    let mut log = Log::open(dir.path().to_path_buf(), cfg, 0).unwrap();
    fill(&mut log, 20, 3, 0); // timestamps 0..19
    let old_bases = log.segment_base_offsets();
    fill(&mut log, 20, 3, 5_000);
    let end = log.log_end_offset();
    // Nothing is old yet.
    let r = log.maintain(1_000, end).unwrap();
    assert_eq!(r.segments_deleted, 0);
    // Segments whose max timestamp is older than retention.ms go, and only
    // up to the high watermark.
    let r = log.maintain(2_000, Offset(old_bases[1].0)).unwrap();
    assert_eq!(r.segments_deleted, 1);
    assert_eq!(log.log_start_offset(), old_bases[1]);
    // The segment holding the last old batch (57..59) also holds new ones.
    let holding_last_old = *log
        .segment_base_offsets()
        .iter()
        .rfind(|b| b.0 <= 57)
        .unwrap();
    let r = log.maintain(2_000, end).unwrap();
    assert!(r.segments_deleted >= 1);
    assert_eq!(log.log_start_offset(), holding_last_old);
    assert_eq!(r.log_start_offset, log.log_start_offset());
    // When everything is old, the active segment goes too, after a roll.
    let r = log.maintain(100_000, end).unwrap();
    assert!(r.segments_deleted >= 1);
    assert_eq!(log.log_start_offset(), end);
    assert_eq!(log.log_end_offset(), end);
    assert_eq!(log.segment_base_offsets(), vec![end]);
    assert_eq!(log.size_bytes(), 0);
    // The log start survives a reopen and appends continue from it.
    drop(log);
    let mut log = Log::open(dir.path().to_path_buf(), config(), 0).unwrap();
    assert_eq!(log.log_start_offset(), end);
    log.append(&plain(end.0, 1, 0), 0).unwrap();
}

#[test]
fn retention_by_bytes_keeps_the_log_under_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config();
    cfg.retention_ms = -1;
    cfg.retention_bytes = 2_500;
    let mut log = Log::open(dir.path().to_path_buf(), cfg, 0).unwrap();
    fill(&mut log, 60, 3, 0);
    let before = log.size_bytes();
    assert!(before > 5_000);
    let end = log.log_end_offset();
    let r = log.maintain(0, end).unwrap();
    assert!(r.segments_deleted > 0);
    assert_eq!(r.bytes_deleted, before - log.size_bytes());
    // As Kafka: a segment goes only if the log stays at or above
    // retention.bytes without it, so less than one segment (<= 1000 bytes)
    // of excess remains.
    assert!(log.size_bytes() >= 2_500, "{}", log.size_bytes());
    assert!(log.size_bytes() < 2_500 + 1_000, "{}", log.size_bytes());
    assert_eq!(log.log_start_offset(), log.segment_base_offsets()[0]);
    assert_eq!(log.log_end_offset(), end);
    // Not with cleanup.policy=compact alone.
    let mut cfg = log.config().clone();
    cfg.cleanup_policy = CleanupPolicy {
        delete: false,
        compact: true,
    };
    cfg.retention_bytes = 0;
    log.set_config(cfg);
    let r = log.maintain(0, end).unwrap();
    assert_eq!(r.segments_deleted, 0);
}

#[test]
fn delete_records_before_persists_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path().to_path_buf(), config(), 0).unwrap();
    fill(&mut log, 30, 2, 0);
    let bases = log.segment_base_offsets();
    let target = bases[2].0 + 1;
    assert_eq!(
        log.delete_records_before(Offset(target)).unwrap(),
        Offset(target)
    );
    assert_eq!(log.segment_base_offsets()[0], bases[2]);
    // Moving backwards is a no-op; past the end is an error.
    assert_eq!(
        log.delete_records_before(Offset(0)).unwrap(),
        Offset(target)
    );
    assert!(matches!(
        log.delete_records_before(Offset(61)),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    drop(log);
    let log = Log::open(dir.path().to_path_buf(), config(), 0).unwrap();
    assert_eq!(log.log_start_offset(), Offset(target));
    assert_eq!(log.log_end_offset(), Offset(60));
    let first = all(&log, target);
    assert_eq!(batches(&first)[0].base_offset(), target - 1);
}

#[test]
fn truncate_to_drops_batches_at_and_above_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path().to_path_buf(), config(), 0).unwrap();
    let b = fill(&mut log, 40, 3, 0);
    // A batch boundary inside an earlier segment removes later segments.
    log.truncate_to(Offset(30)).unwrap();
    assert_eq!(log.log_end_offset(), Offset(30));
    assert_eq!(all(&log, 0).to_vec(), b[..10].concat());
    // Inside a batch: the whole batch goes.
    log.truncate_to(Offset(28)).unwrap();
    assert_eq!(log.log_end_offset(), Offset(27));
    // At or beyond the end: nothing.
    log.truncate_to(Offset(100)).unwrap();
    assert_eq!(log.log_end_offset(), Offset(27));
    log.append(&plain(27, 2, 0), 0).unwrap();
    drop(log);
    let mut log = Log::open(dir.path().to_path_buf(), config(), 0).unwrap();
    assert_eq!(log.log_end_offset(), Offset(29));
    assert_eq!(
        all(&log, 0).len(),
        b[..9].concat().len() + plain(27, 2, 0).len()
    );
    // Below the log start: the log restarts there.
    log.delete_records_before(Offset(10)).unwrap();
    log.truncate_to(Offset(5)).unwrap();
    assert_eq!(log.log_start_offset(), Offset(5));
    assert_eq!(log.log_end_offset(), Offset(5));
    assert_eq!(log.size_bytes(), 0);
    log.append(&plain(5, 1, 0), 0).unwrap();
    // To offset 0 of a segment starting there.
    log.truncate_to(Offset(5)).unwrap();
    assert_eq!(log.log_end_offset(), Offset(5));
}

fn timestamp_lookups(compression: Compression) {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path().to_path_buf(), config(), 0).unwrap();
    assert_eq!(log.max_timestamp().unwrap(), (-1, Offset(-1)));
    assert_eq!(log.offset_for_timestamp(0).unwrap(), None);
    // Timestamps out of order within batches, as clients may send them.
    for i in 0..20i64 {
        let t = i * 100;
        let recs: Vec<Rec<'_>> = vec![
            (Some("k"), Some("v"), t + 50),
            (Some("k"), Some("v"), t + 10),
            (Some("k"), Some("v"), t + 90),
        ];
        let base = log.log_end_offset().0;
        log.append(&encode(base, &recs, compression, -1), 0)
            .unwrap();
    }
    assert!(log.segment_base_offsets().len() > 1 || compression != Compression::None);
    // Earliest record with timestamp >= target.
    assert_eq!(log.offset_for_timestamp(0).unwrap(), Some((Offset(0), 50)));
    assert_eq!(log.offset_for_timestamp(51).unwrap(), Some((Offset(2), 90)));
    assert_eq!(
        log.offset_for_timestamp(505).unwrap(),
        Some((Offset(15), 550))
    );
    assert_eq!(
        log.offset_for_timestamp(550).unwrap(),
        Some((Offset(15), 550))
    );
    assert_eq!(
        log.offset_for_timestamp(591).unwrap(),
        Some((Offset(18), 650))
    );
    assert_eq!(
        log.offset_for_timestamp(1_990).unwrap(),
        Some((Offset(59), 1_990))
    );
    assert_eq!(log.offset_for_timestamp(1_991).unwrap(), None);
    assert_eq!(log.max_timestamp().unwrap(), (1_990, Offset(59)));
    // A later batch with an older max does not change the max record.
    let base = log.log_end_offset().0;
    log.append(
        &encode(base, &[(Some("k"), Some("v"), 5)], compression, -1),
        0,
    )
    .unwrap();
    assert_eq!(log.max_timestamp().unwrap(), (1_990, Offset(59)));
    // Records below the log start are not answers.
    log.delete_records_before(Offset(16)).unwrap();
    assert_eq!(
        log.offset_for_timestamp(505).unwrap(),
        Some((Offset(16), 510))
    );
    assert_eq!(
        log.offset_for_timestamp(511).unwrap(),
        Some((Offset(17), 590))
    );
}

#[test]
fn timestamp_lookups_uncompressed() {
    timestamp_lookups(Compression::None);
}

#[test]
fn timestamp_lookups_compressed() {
    for c in [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        timestamp_lookups(c);
    }
}

#[test]
fn log_append_time_batches_use_the_batch_timestamp_for_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path().to_path_buf(), config(), 0).unwrap();
    let mut b = encode(
        0,
        &[(None, Some("a"), 1), (None, Some("b"), 2)],
        Compression::None,
        -1,
    );
    rewrite::set_log_append_time(&mut b, 777);
    log.append(&b, 0).unwrap();
    assert_eq!(
        log.offset_for_timestamp(700).unwrap(),
        Some((Offset(0), 777))
    );
    assert_eq!(log.max_timestamp().unwrap(), (777, Offset(0)));
}

/// What a decompression bomb's record expands to.
const BOMB_LEN: usize = 64 << 20;
/// The most any one allocation may take while reading inside a stored
/// batch: codec windows and one batch, never what the records expand to.
const READ_BOUND: usize = 16 << 20;

/// A zstd batch of two records at `ts` and `ts + 2`: `bomb_key` with
/// `BOMB_LEN` zero bytes, then `small_key` with a one-byte value. A few KiB
/// on disk.
fn zstd_bomb(base: i64, bomb_key: &str, small_key: &str, ts: i64) -> Vec<u8> {
    let record = |i: i64, key: &str, value: Vec<u8>| Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: i,
        sequence: i as i32,
        timestamp: ts + 2 * i,
        key: Some(Bytes::copy_from_slice(key.as_bytes())),
        value: Some(Bytes::from(value)),
        headers: IndexMap::new(),
    };
    let records = [
        record(0, bomb_key, vec![0u8; BOMB_LEN]),
        record(1, small_key, b"v".to_vec()),
    ];
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::Zstd,
        },
    )
    .expect("encode");
    let mut bytes = buf.to_vec();
    assert!(bytes.len() < 64 << 10, "{}", bytes.len());
    rewrite::set_base_offset(&mut bytes, base);
    bytes
}

/// (offset, value length) of every record in a blob, streamed.
fn value_lens(blob: &[u8]) -> Vec<(i64, i32)> {
    let mut out = Vec::new();
    for view in batches(blob) {
        let mut reader = protocol::records::RecordReader::new(&view).unwrap();
        while let Some(info) = reader.next_record(&mut protocol::records::SkipAll).unwrap() {
            out.push((
                view.base_offset() + info.offset_delta as i64,
                info.value_len,
            ));
        }
    }
    out
}

#[test]
fn timestamp_lookups_stream_a_decompression_bomb() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path().to_path_buf(), config(), 0).unwrap();
    log.append(&plain(0, 1, 10), 0).unwrap();
    log.append(&zstd_bomb(1, "k", "k", 18), 0).unwrap();
    log.append(&plain(3, 1, 15), 0).unwrap();
    // Both answers lie behind the bomb's 64 MiB record.
    let ((max, by_time), largest) = crate::test_alloc::largest_allocation(|| {
        (
            log.max_timestamp().unwrap(),
            log.offset_for_timestamp(19).unwrap(),
        )
    });
    assert_eq!(max, (20, Offset(2)));
    assert_eq!(by_time, Some((Offset(2), 20)));
    assert!(largest < READ_BOUND, "an allocation of {largest} bytes");
}

fn compacted_config() -> LogConfig {
    LogConfig {
        segment_bytes: 400,
        cleanup_policy: CleanupPolicy {
            delete: false,
            compact: true,
        },
        delete_retention_ms: 1_000,
        // Every pass these tests ask for runs (the ratio has its own test).
        min_cleanable_dirty_ppm: 0,
        ..config()
    }
}

/// Whether the next pass would do anything, by `maintain`'s measure.
fn cleaned(log: &mut Log, now_ms: i64) -> bool {
    let end = log.log_end_offset();
    log.maintain(now_ms, end).unwrap().compacted
}

#[test]
fn compaction_waits_for_the_dirty_ratio_and_the_min_lag_and_not_past_the_max_lag() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        min_cleanable_dirty_ppm: 500_000,
        ..compacted_config()
    };
    let mut log = Log::open(dir.path().to_path_buf(), config.clone(), 0).unwrap();
    // Distinct keys: a pass removes nothing, so the clean part stays as big.
    let mut next_key = 0;
    let mut fill = |log: &mut Log, n: usize, ts: i64| {
        for _ in 0..n {
            next_key += 1;
            put(
                log,
                &[(&format!("k{next_key}"), Some("v"))],
                ts,
                Compression::None,
            );
        }
    };
    // The first pass: all of the cleanable log is dirty.
    fill(&mut log, 40, 0);
    assert!(cleaned(&mut log, 0));
    assert!(!cleaned(&mut log, 0), "nothing new to clean");
    // A little new dirty data is under half of the cleanable log: no pass.
    let clean_bytes = log.size_bytes();
    fill(&mut log, 6, 0);
    assert!(!cleaned(&mut log, 0), "below min.cleanable.dirty.ratio");
    // Enough of it, and the pass runs.
    while log.size_bytes() < 3 * clean_bytes {
        fill(&mut log, 3, 0);
    }
    assert!(cleaned(&mut log, 0));

    // max.compaction.lag.ms: dirty data older than it is cleaned whatever
    // the ratio.
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(
        dir.path().to_path_buf(),
        LogConfig {
            max_compaction_lag_ms: 10_000,
            ..config.clone()
        },
        0,
    )
    .unwrap();
    fill(&mut log, 40, 0);
    assert!(cleaned(&mut log, 0));
    fill(&mut log, 6, 1_000);
    assert!(!cleaned(&mut log, 5_000));
    assert!(cleaned(&mut log, 20_000), "past max.compaction.lag.ms");

    // min.compaction.lag.ms: segments holding newer records wait.
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(
        dir.path().to_path_buf(),
        LogConfig {
            min_compaction_lag_ms: 60_000,
            ..config
        },
        0,
    )
    .unwrap();
    fill(&mut log, 40, 100_000);
    assert!(!cleaned(&mut log, 120_000), "records younger than the lag");
    assert!(cleaned(&mut log, 170_000));
}

#[test]
fn segment_jitter_rolls_each_segment_a_little_early_and_max_compaction_lag_rolls_compacted_logs() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 1 << 20,
        segment_ms: 100_000,
        segment_jitter_ms: 50_000,
        ..config()
    };
    let mut log = Log::open(dir.path().to_path_buf(), config, 0).unwrap();
    // Each append at a later time: a roll comes after more than
    // segment.ms - jitter and at most segment.ms.
    let mut waits = Vec::new();
    let mut since = 0;
    for t in (0..2_000_000).step_by(1_000) {
        let before = log.segments.len();
        put(&mut log, &[("k", Some("v"))], t, Compression::None);
        if log.segments.len() > before {
            waits.push(t - since);
            since = t;
        }
    }
    assert!(waits.len() > 10, "{waits:?}");
    assert!(
        waits.iter().all(|w| (50_000..=101_000).contains(w)),
        "{waits:?}"
    );
    assert!(waits.iter().any(|w| *w < 99_000), "some jitter: {waits:?}");

    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(
        dir.path().to_path_buf(),
        LogConfig {
            segment_bytes: 1 << 20,
            segment_ms: 1_000_000,
            max_compaction_lag_ms: 10_000,
            ..compacted_config()
        },
        0,
    )
    .unwrap();
    put(&mut log, &[("k", Some("v"))], 0, Compression::None);
    put(&mut log, &[("k", Some("v"))], 11_000, Compression::None);
    assert_eq!(log.segments.len(), 2, "rolled after max.compaction.lag.ms");
}

/// Appends one single-record batch per (key, value) with timestamp `ts`.
fn put(log: &mut Log, kvs: &[(&str, Option<&str>)], ts: i64, compression: Compression) {
    for (k, v) in kvs {
        let base = log.log_end_offset().0;
        log.append(&encode(base, &[(Some(k), *v, ts)], compression, -1), 0)
            .unwrap();
    }
}

#[test]
fn compaction_keeps_the_latest_value_per_key_and_preserves_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path().to_path_buf(), compacted_config(), 0).unwrap();
    // A multi-record compressed batch, then single-record batches.
    let recs: Vec<Rec<'_>> = vec![
        (Some("a"), Some("a0"), 0),
        (Some("b"), Some("b0"), 0),
        (Some("c"), Some("c0"), 0),
    ];
    log.append(&encode(0, &recs, Compression::Gzip, -1), 0)
        .unwrap();
    put(
        &mut log,
        &[("a", Some("a1")), ("b", None), ("d", Some("d0"))],
        0,
        Compression::None,
    );
    for i in 0..10 {
        put(
            &mut log,
            &[("x", Some(&format!("x{i}")))],
            0,
            Compression::Lz4,
        );
    }
    let end = log.log_end_offset();
    assert_eq!(end, Offset(16));
    let active_base = *log.segment_base_offsets().last().unwrap();
    assert!(active_base.0 > 6, "{:?}", log.segment_base_offsets());
    let before = log.size_bytes();
    // Within delete.retention.ms: the tombstone for b stays.
    let r = log.maintain(500, end).unwrap();
    assert!(r.compacted);
    assert!(log.size_bytes() < before);
    let got = decoded(&all(&log, 0));
    let cleaned: Vec<_> = got
        .iter()
        .filter(|r| r.0 < active_base.0)
        .cloned()
        .collect();
    let s = |v: &str| Some(v.to_string());
    assert_eq!(
        cleaned[..4].to_vec(),
        vec![
            (2, s("c"), s("c0")),
            (3, s("a"), s("a1")),
            (4, s("b"), None),
            (5, s("d"), s("d0")),
        ]
    );
    // Only the newest x below the active segment survives there; the active
    // segment is untouched.
    let xs_cleaned: Vec<_> = cleaned[4..].to_vec();
    assert_eq!(xs_cleaned.len(), 1);
    assert_eq!(xs_cleaned[0].0, active_base.0 - 1);
    let active: Vec<_> = got.iter().filter(|r| r.0 >= active_base.0).collect();
    assert_eq!(active.len() as i64, end.0 - active_base.0);
    // Offsets and the log end are unchanged; reads inside gaps move forward.
    assert_eq!(log.log_end_offset(), end);
    assert_eq!(log.log_start_offset(), Offset(0));
    let from_gap = decoded(&log.read(Offset(1), 1, Offset(100), true).unwrap());
    assert_eq!(from_gap[0].0, 2);
    let from_gap = decoded(&log.read(Offset(6), 1, Offset(100), true).unwrap());
    assert_eq!(from_gap[0].0, xs_cleaned[0].0);
    // Every stored batch still has a valid CRC.
    for b in batches(&all(&log, 0)) {
        b.verify_crc().unwrap();
    }
    // Nothing new to clean: maintain does not compact again.
    assert!(!log.maintain(600, end).unwrap().compacted);
    // Without compaction, maintain leaves an expired tombstone to the
    // caller's compaction job.
    assert!(
        !log.maintain_without_compaction(1_000, end)
            .unwrap()
            .compacted
    );
    assert!(log.compaction_plan(1_000, end).unwrap().is_some());
    // After delete.retention.ms the tombstone goes.
    let r = log.maintain(1_000, end).unwrap();
    assert!(r.compacted);
    let got = decoded(&all(&log, 0));
    assert!(got.iter().all(|r| r.1.as_deref() != Some("b")), "{got:?}");
    // Reopen: same content.
    drop(log);
    let log = Log::open(dir.path().to_path_buf(), compacted_config(), 0).unwrap();
    assert_eq!(decoded(&all(&log, 0)), got);
    assert_eq!(log.log_end_offset(), end);
}

#[test]
fn compaction_stops_at_the_high_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path().to_path_buf(), compacted_config(), 0).unwrap();
    for i in 0..20 {
        put(
            &mut log,
            &[("k", Some(&format!("v{i}")))],
            0,
            Compression::None,
        );
    }
    let bases = log.segment_base_offsets();
    assert!(bases.len() >= 3);
    // With the high watermark at the second segment's start, only the first
    // segment is cleanable, and values above it do not count.
    log.compact(0, bases[1]).unwrap();
    let got = decoded(&all(&log, 0));
    assert_eq!(got.len(), 20 - bases[1].0 as usize + 1);
    assert_eq!(got[0].0, bases[1].0 - 1);
}

#[test]
fn compaction_keeps_the_header_of_a_producers_last_batch() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path().to_path_buf(), compacted_config(), 0).unwrap();
    // Producer 7 writes key k twice; the last write of producer 7 is then
    // superseded by a non-idempotent write of k.
    log.append(
        &encode(
            0,
            &[(Some("k"), Some("p0"), 0), (Some("j"), Some("p0"), 0)],
            Compression::Zstd,
            7,
        ),
        0,
    )
    .unwrap();
    log.append(
        &encode(
            2,
            &[(Some("k"), Some("p1"), 0), (Some("j"), Some("p1"), 0)],
            Compression::Snappy,
            7,
        ),
        0,
    )
    .unwrap();
    put(
        &mut log,
        &[("k", Some("n")), ("j", Some("n"))],
        0,
        Compression::None,
    );
    for i in 0..8 {
        put(
            &mut log,
            &[("other", Some(&format!("{i}")))],
            0,
            Compression::None,
        );
    }
    let end = log.log_end_offset();
    log.compact(0, end).unwrap();
    let blob = all(&log, 0);
    let views = batches(&blob);
    // Producer 7's first batch is gone; its last batch is an empty header
    // with the same offsets and sequence.
    let p7: Vec<_> = views.iter().filter(|b| b.producer_id() == 7).collect();
    assert_eq!(p7.len(), 1);
    assert_eq!(p7[0].base_offset(), 2);
    assert_eq!(p7[0].last_offset(), 3);
    assert_eq!(p7[0].record_count(), 0);
    assert_eq!(p7[0].base_sequence(), 0);
    assert_eq!(p7[0].last_sequence(), 1);
    p7[0].verify_crc().unwrap();
    assert_eq!(decoded(&blob)[0].0, 4);
    // Reading the empty batch's offsets lands on it.
    let r = log.read(Offset(3), 1, Offset(100), true).unwrap();
    assert_eq!(batches(&r)[0].base_offset(), 2);
}

#[test]
fn compaction_rewrites_a_partly_retained_batch_keeping_its_header() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path().to_path_buf(), compacted_config(), 0).unwrap();
    let recs: Vec<Rec<'_>> = vec![
        (Some("a"), Some("1"), 10),
        (Some("b"), Some("1"), 30),
        (Some("c"), Some("1"), 20),
    ];
    let original = encode(0, &recs, Compression::Gzip, 9);
    log.append(&original, 0).unwrap();
    put(&mut log, &[("b", Some("2"))], 0, Compression::None);
    for i in 0..8 {
        put(
            &mut log,
            &[("z", Some(&format!("{i}")))],
            0,
            Compression::None,
        );
    }
    let end = log.log_end_offset();
    log.compact(0, end).unwrap();
    let blob = all(&log, 0);
    let first = batches(&blob)[0];
    let orig = RecordBatchView::parse(&original).unwrap();
    assert_eq!(first.base_offset(), 0);
    assert_eq!(first.last_offset_delta(), 2);
    assert_eq!(first.base_sequence(), orig.base_sequence());
    assert_eq!(first.producer_id(), 9);
    assert_eq!(first.codec().unwrap(), orig.codec().unwrap());
    assert_eq!(first.record_count(), 2);
    assert_eq!(first.max_timestamp(), 20);
    first.verify_crc().unwrap();
    let got = decoded(&blob);
    assert_eq!(got[0], (0, Some("a".into()), Some("1".into())));
    assert_eq!(got[1], (2, Some("c".into()), Some("1".into())));
}

#[test]
fn retention_by_time_counts_untimestamped_segments_from_their_opening() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config();
    cfg.retention_ms = 1_000;
    let mut log = Log::open(dir.path().to_path_buf(), cfg, 500_000).unwrap();
    for _ in 0..30 {
        let base = log.log_end_offset().0;
        log.append(&plain(base, 2, -1), 500_000).unwrap();
    }
    let end = log.log_end_offset();
    assert_eq!(log.maintain(500_900, end).unwrap().segments_deleted, 0);
    assert!(log.maintain(501_001, end).unwrap().segments_deleted > 0);
    assert_eq!(log.log_start_offset(), end);
}

#[test]
fn recovery_rejects_offsets_that_would_overflow() {
    let dir = tempfile::tempdir().unwrap();
    crashed_log(dir.path());
    let path = log_file(dir.path(), 0);
    let mut bytes = fs::read(&path).unwrap();
    let first_len = RecordBatchView::peek_len(&bytes).unwrap();
    bytes[first_len..first_len + 8].copy_from_slice(&(i64::MAX - 1).to_be_bytes());
    fs::write(&path, &bytes).unwrap();
    let log = Log::open(dir.path().to_path_buf(), LogConfig::default(), 0).unwrap();
    assert_eq!(log.log_end_offset(), Offset(2));
}

#[test]
fn config_defaults_are_kafkas_and_validate() {
    let c = LogConfig::default();
    assert_eq!(c.segment_bytes, 1_073_741_824);
    assert_eq!(c.segment_ms, 604_800_000);
    assert_eq!(c.retention_ms, 604_800_000);
    assert_eq!(c.retention_bytes, -1);
    assert_eq!(c.delete_retention_ms, 86_400_000);
    assert_eq!(c.max_message_bytes, 1_048_588);
    assert!(c.cleanup_policy.delete && !c.cleanup_policy.compact);
    assert_eq!(c.validate(), Ok(()));
    let bad = LogConfig {
        retention_ms: -2,
        ..LogConfig::default()
    };
    assert_eq!(bad.validate(), Err(LogConfigError::RetentionMsInvalid(-2)));
    let bad = LogConfig {
        flush_messages: 0,
        ..LogConfig::default()
    };
    assert_eq!(bad.validate(), Err(LogConfigError::FlushMessagesZero));
}

#[test]
fn compaction_streams_a_decompression_bomb() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path().to_path_buf(), compacted_config(), 0).unwrap();
    // Key a holds 64 MiB of zeros; key k's value in the same batch is then
    // superseded, so the batch is rebuilt with the bomb in it.
    log.append(&zstd_bomb(0, "a", "k", 0), 0).unwrap();
    put(&mut log, &[("k", Some("k2"))], 0, Compression::None);
    for i in 0..8 {
        put(
            &mut log,
            &[("z", Some(&format!("{i}")))],
            0,
            Compression::None,
        );
    }
    let end = log.log_end_offset();
    let ((), largest) = crate::test_alloc::largest_allocation(|| log.compact(0, end).unwrap());
    assert!(largest < READ_BOUND, "an allocation of {largest} bytes");
    let blob = all(&log, 0);
    let first = batches(&blob)[0];
    assert_eq!((first.base_offset(), first.last_offset_delta()), (0, 1));
    assert_eq!(first.record_count(), 1);
    first.verify_crc().unwrap();
    let lens = value_lens(&blob);
    assert_eq!(lens[0], (0, BOMB_LEN as i32));
    assert_eq!(lens[1], (2, 2));

    // Then a supersedes the bomb: the batch goes, again without inflating it.
    put(&mut log, &[("a", Some("a2"))], 0, Compression::None);
    for i in 0..8 {
        put(
            &mut log,
            &[("z", Some(&format!("{i}")))],
            0,
            Compression::None,
        );
    }
    let end = log.log_end_offset();
    let ((), largest) = crate::test_alloc::largest_allocation(|| log.compact(0, end).unwrap());
    assert!(largest < READ_BOUND, "an allocation of {largest} bytes");
    let lens = value_lens(&all(&log, 0));
    assert_eq!(lens[0], (2, 2));
    assert!(lens.iter().all(|&(_, len)| len < 10), "{lens:?}");
}

#[test]
fn a_batch_whose_rebuild_is_out_of_bounds_is_kept_whole() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        max_message_bytes: 8 << 20,
        ..compacted_config()
    };
    let mut log = Log::open(dir.path().to_path_buf(), config, 0).unwrap();
    // Unique keys alternate with a key written again later: the kept and
    // dropped records alternate more often than the cleaner keeps track of.
    let n = records::MAX_RETAINED_RUNS + 1;
    let keys: Vec<String> = (0..n).map(|i| format!("u{i}")).collect();
    let mut recs: Vec<Rec<'_>> = Vec::new();
    for k in &keys {
        recs.push((Some(k), Some("v"), 0));
        recs.push((Some("dup"), Some("old"), 0));
    }
    let original = encode(0, &recs, Compression::Lz4, -1);
    log.append(&original, 0).unwrap();
    put(&mut log, &[("dup", Some("new"))], 0, Compression::None);
    for i in 0..8 {
        put(
            &mut log,
            &[("z", Some(&format!("{i}")))],
            0,
            Compression::None,
        );
    }
    let end = log.log_end_offset();
    let cleaned = log.compaction_plan(0, end).unwrap().unwrap().run().unwrap();
    assert_eq!(cleaned.batches_kept_whole, 1);
    assert!(log.install(cleaned).unwrap());
    assert_eq!(batches(&all(&log, 0))[0].as_bytes(), &original[..]);
}

#[test]
fn a_full_key_map_cleans_in_several_passes_and_never_resurrects_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        cleaner_dedupe_buffer_bytes: 3 * DEDUPE_ENTRY_BYTES,
        ..compacted_config()
    };
    let mut log = Log::open(dir.path().to_path_buf(), config, 0).unwrap();
    // t's value, three keys, then t's (expired) tombstone: the first pass's
    // map fills before the tombstone, so the tombstone must stay while t's
    // value does.
    put(
        &mut log,
        &[
            ("t", Some("v")),
            ("k0", Some("a")),
            ("k1", Some("a")),
            ("k2", Some("a")),
            ("t", None),
        ],
        0,
        Compression::None,
    );
    for round in ["b", "c"] {
        for k in ["k0", "k1", "k2", "k3"] {
            put(&mut log, &[(k, Some(round))], 0, Compression::None);
        }
    }
    for i in 0..8 {
        put(
            &mut log,
            &[("z", Some(&format!("{i}")))],
            0,
            Compression::None,
        );
    }
    let end = log.log_end_offset();
    let active_base = log.segment_base_offsets().last().unwrap().0;
    let mut passes = 0;
    loop {
        let Some(job) = log.compaction_plan(10_000, end).unwrap() else {
            break;
        };
        let cleaned = job.run().unwrap();
        if passes == 0 {
            assert!(cleaned.dedupe_map_full);
        }
        assert!(log.install(cleaned).unwrap());
        passes += 1;
        let got = decoded(&all(&log, 0));
        // A value of t is always followed by its tombstone.
        let t: Vec<_> = got.iter().filter(|r| r.1.as_deref() == Some("t")).collect();
        if let Some(first) = t.first() {
            assert!(first.2.is_none() || t.len() == 2, "pass {passes}: {got:?}");
        }
        // The latest value of every key is always there.
        for k in ["k0", "k1", "k2", "k3"] {
            assert!(
                got.iter()
                    .any(|r| r.1.as_deref() == Some(k) && r.2.as_deref() == Some("c")),
                "pass {passes}: {k} lost: {got:?}"
            );
        }
        assert!(passes < 20, "no progress");
    }
    assert!(passes > 1, "{passes}");
    let got = decoded(&all(&log, 0));
    let cleaned: Vec<_> = got
        .iter()
        .filter(|r| r.0 < active_base && r.1.as_deref() != Some("z"))
        .map(|r| (r.1.clone().unwrap(), r.2.clone()))
        .collect();
    let s = |k: &str| (k.to_string(), Some("c".to_string()));
    assert_eq!(cleaned, vec![s("k0"), s("k1"), s("k2"), s("k3")]);
}

#[test]
fn a_compaction_is_discarded_if_the_segments_changed_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path().to_path_buf(), compacted_config(), 0).unwrap();
    for i in 0..20 {
        put(
            &mut log,
            &[("k", Some(&format!("v{i}")))],
            0,
            Compression::None,
        );
    }
    let end = log.log_end_offset();
    let before = all(&log, 0);
    let cleaned = log.compaction_plan(0, end).unwrap().unwrap().run().unwrap();
    let cleaned_files = || {
        fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".cleaned")
            })
            .count()
    };
    assert!(cleaned_files() > 0);
    // A follower truncation while the job ran: its result must not land.
    log.truncate_to(Offset(19)).unwrap();
    assert!(!log.install(cleaned).unwrap());
    assert_eq!(cleaned_files(), 0);
    let mut expected = decoded(&before);
    expected.pop();
    assert_eq!(decoded(&all(&log, 0)), expected);

    // Appends (and rolls) while a job runs do not stand in its way.
    let end = log.log_end_offset();
    let job = log.compaction_plan(0, end).unwrap().unwrap();
    for i in 0..10 {
        put(
            &mut log,
            &[("n", Some(&format!("{i}")))],
            0,
            Compression::None,
        );
    }
    assert!(log.install(job.run().unwrap()).unwrap());
    let got = decoded(&all(&log, 0));
    assert_eq!(
        got.iter().filter(|r| r.1.as_deref() == Some("n")).count(),
        10
    );
    assert!(got.len() < 29, "{got:?}");
}

#[test]
fn a_rebuild_past_its_bound_keeps_the_batch_whole() {
    let values: Vec<String> = (0..50).map(|i| format!("value {i} ").repeat(10)).collect();
    let keys: Vec<String> = (0..50).map(|i| format!("k{i}")).collect();
    let recs: Vec<Rec<'_>> = keys
        .iter()
        .zip(&values)
        .map(|(k, v)| (Some(k.as_str()), Some(v.as_str()), 0))
        .collect();
    let b = encode(0, &recs, Compression::Gzip, -1);
    let view = RecordBatchView::parse(&b).unwrap();
    let secret = [7u8; 32];
    let mut i = 0;
    let every_other = |_: &records::RecordSummary| {
        i += 1;
        i % 2 == 0
    };
    assert_eq!(
        records::retain(&view, &secret, every_other, 100).unwrap(),
        records::Retained::KeptWhole
    );
    let mut i = 0;
    let every_other = |_: &records::RecordSummary| {
        i += 1;
        i % 2 == 0
    };
    let records::Retained::Some(rebuilt) =
        records::retain(&view, &secret, every_other, b.len()).unwrap()
    else {
        panic!("not rebuilt");
    };
    let v = RecordBatchView::parse(&rebuilt).unwrap();
    v.verify_crc().unwrap();
    assert_eq!(v.record_count(), 25);
    assert_eq!(v.codec().unwrap(), view.codec().unwrap());
    let got = decoded(&Bytes::from(rebuilt.clone()));
    assert_eq!(got[0].1.as_deref(), Some("k1"));
}

fn segment_file_len(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .map(|p| fs::metadata(p).unwrap().len())
        .sum()
}

#[test]
fn a_partial_append_is_cut_off_and_takes_the_log_offline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let mut log = Log::open(path.clone(), config(), 0).unwrap();
    let mut acked = Vec::new();
    for _ in 0..2 {
        let b = plain(log.log_end_offset().0, 2, 0);
        log.append(&b, 0).unwrap();
        acked.push(b);
    }
    let size = segment_file_len(&path);
    // The disk fills in the middle of the next batch, then frees up again.
    faults::inject(faults::Fault {
        dir: path.clone(),
        op: faults::FaultOp::Write { write_bytes: 30 },
        after: 0,
        errno: faults::ENOSPC,
    });
    let failed = plain(log.log_end_offset().0, 2, 0);
    assert!(matches!(log.append(&failed, 0), Err(LogError::Io(_))));
    faults::clear(&path);
    // None of it stays in the file.
    assert_eq!(segment_file_len(&path), size);
    assert!(log.is_offline());
    // Nothing more is appended or served.
    for _ in 0..2 {
        let b = plain(log.log_end_offset().0, 2, 0);
        match log.append(&b, 0) {
            Ok(()) => acked.push(b),
            Err(e) => assert!(matches!(e, LogError::LogDirOffline { .. }), "{e}"),
        }
    }
    assert!(matches!(
        log.read(Offset(0), 1 << 20, Offset(100), true),
        Err(LogError::LogDirOffline { .. })
    ));
    assert!(log.close().is_err());
    // Every acked batch survives recovery.
    let log = Log::open(path, config(), 0).unwrap();
    assert_eq!(all(&log, 0).to_vec(), acked.concat());
}

#[test]
fn a_failed_fsync_takes_the_log_offline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let config = LogConfig {
        flush_messages: 1,
        ..config()
    };
    let mut log = Log::open(path.clone(), config.clone(), 0).unwrap();
    fill(&mut log, 2, 1, 0);
    faults::inject(faults::Fault {
        dir: path.clone(),
        op: faults::FaultOp::Sync,
        after: 0,
        errno: faults::EIO,
    });
    let b = plain(log.log_end_offset().0, 1, 0);
    assert!(matches!(log.append(&b, 0), Err(LogError::Io(_))));
    faults::clear(&path);
    // The batch was written before the fsync failed: it is in the log's
    // view (its offsets are taken), but the log serves nothing more.
    assert_eq!(log.log_end_offset(), Offset(3));
    let next = plain(3, 1, 0);
    assert!(matches!(
        log.append(&next, 0),
        Err(LogError::LogDirOffline { .. })
    ));
    assert!(matches!(
        log.offset_for_timestamp(0),
        Err(LogError::LogDirOffline { .. })
    ));
    // Another log of the same directory goes offline with it.
    let channel = LogDirFailureChannel::new();
    let mut other = Log::open(dir.path().join("q"), config, 0).unwrap();
    other.set_dir_failure_channel(channel.clone());
    log.set_dir_failure_channel(channel.clone());
    assert!(!other.is_offline());
    channel.fail(dir.path(), &"test");
    assert!(matches!(
        other.append(&plain(0, 1, 0), 0),
        Err(LogError::LogDirOffline { .. })
    ));
}

#[test]
fn a_deleted_log_is_renamed_before_it_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    let mut log = Log::open(path.clone(), config(), 0).unwrap();
    fill(&mut log, 3, 1, 0);
    let renamed = rename_for_deletion(&path).unwrap();
    let name = renamed.file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with("t-0.") && is_deleted_dir_name(name),
        "{name}"
    );
    assert!(!path.exists());
    assert!(!is_deleted_dir_name("t-0"));
    assert!(!is_deleted_dir_name("topic-delete"));
    // What a crash between the rename and the removal leaves goes at start.
    assert_eq!(remove_deleted_dirs(dir.path()).unwrap(), 1);
    assert!(!renamed.exists());
    drop(log);
}
