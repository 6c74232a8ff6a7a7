//! A zstd batch that expands to 256 MiB, produced through the wire, then
//! met by ListOffsets (MAX_TIMESTAMP and by timestamp) and by the log
//! cleaner: the broker's peak RSS must not grow by anything like what the
//! batch expands to. One test in this binary, so the process's peak RSS is
//! this test's.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{base_timestamp_ms, Client};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use protocol::record_batch::{rewrite, Codec, HEADER_LEN};

/// What the bomb's first record's value expands to.
const BOMB_LEN: usize = 256 << 20;
/// The most the broker's peak RSS may grow while it reads the bomb.
const RSS_GROWTH_BOUND: u64 = 64 << 20;

/// The records' timestamp: now, give or take, so the broker accepts them.
fn ts() -> i64 {
    base_timestamp_ms() + 1_000
}

fn zigzag(v: i64, out: &mut Vec<u8>) {
    let mut raw = ((v << 1) ^ (v >> 63)) as u64;
    while raw >= 0x80 {
        out.push((raw as u8) | 0x80);
        raw >>= 7;
    }
    out.push(raw as u8);
}

/// One record's encoding up to its value bytes (the value follows, then a
/// zero header count).
fn record_head(ts_delta: i64, offset_delta: i64, key: &[u8], value_len: usize) -> Vec<u8> {
    let mut body = vec![0u8]; // attributes
    zigzag(ts_delta, &mut body);
    zigzag(offset_delta, &mut body);
    zigzag(key.len() as i64, &mut body);
    body.extend_from_slice(key);
    zigzag(value_len as i64, &mut body);
    let body_len = body.len() + value_len + 1;
    let mut out = Vec::new();
    zigzag(body_len as i64, &mut out);
    out.extend_from_slice(&body);
    out
}

/// A zstd batch: key `a` with `BOMB_LEN` zero bytes at `ts()`, then key `k`
/// with value `v` at `ts() + 2`. Built by streaming, so the test never holds
/// the expanded value either.
fn zstd_bomb() -> Bytes {
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.write_all(&record_head(0, 0, b"a", BOMB_LEN)).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..BOMB_LEN >> 20 {
        enc.write_all(&zeros).unwrap();
    }
    enc.write_all(&[0]).unwrap();
    enc.write_all(&record_head(2, 1, b"k", 1)).unwrap();
    enc.write_all(b"v").unwrap();
    enc.write_all(&[0]).unwrap();
    let payload = enc.finish().unwrap();
    // The header of the same two records, uncompressed.
    let record = |i: i64, key: &'static [u8]| Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: i,
        sequence: i as i32 - 1,
        timestamp: ts() + 2 * i,
        key: Some(Bytes::from_static(key)),
        value: Some(Bytes::from_static(b"v")),
        headers: Default::default(),
    };
    let mut model = bytes::BytesMut::new();
    RecordBatchEncoder::encode(
        &mut model,
        &[record(0, b"a"), record(1, b"k")],
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    let mut batch = model[..HEADER_LEN].to_vec();
    batch.extend_from_slice(&payload);
    rewrite::set_codec(&mut batch, Codec::Zstd);
    rewrite::seal(&mut batch);
    assert!(batch.len() < 64 << 10, "{}", batch.len());
    Bytes::from(batch)
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Runs `f` and returns how far the process's peak RSS rose above its RSS
/// at the start (Linux: `clear_refs` 5 resets the peak).
async fn peak_rss_growth<F: std::future::Future<Output = ()>>(f: F) -> u64 {
    std::fs::write("/proc/self/clear_refs", "5").expect("resetting the peak RSS");
    let base = status_kib("VmRSS:");
    f.await;
    (status_kib("VmHWM:").saturating_sub(base)) << 10
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decompression_bomb_costs_no_memory_in_list_offsets_or_the_cleaner() {
    let b = common::start(&[("log.retention.check.interval.ms", "100")]).await;
    let addr = b.running.local_addr;
    let mut c = Client::connect(addr).await;
    let bomb = zstd_bomb();

    assert_eq!(c.create_topic("bomb", 1, &[]).await, 0);
    let r = c.produce("bomb", 0, -1, bomb.clone()).await;
    assert_eq!(r.error_code, 0, "{r:?}");
    let r = c
        .produce(
            "bomb",
            0,
            -1,
            common::batch(&["later"], Compression::None, None),
        )
        .await;
    assert_eq!(r.error_code, 0);
    let mut answers = Vec::new();
    let growth = peak_rss_growth(async {
        answers.push(c.list_offset("bomb", 0, -3).await);
        answers.push(c.list_offset("bomb", 0, ts() + 1).await);
    })
    .await;
    println!(
        "ListOffsets over the bomb: peak RSS grew {} KiB",
        growth >> 10
    );
    for a in &answers {
        assert_eq!(
            (a.error_code, a.offset, a.timestamp),
            (0, 1, ts() + 2),
            "{a:?}"
        );
    }
    assert!(growth < RSS_GROWTH_BOUND, "peak RSS grew {growth} bytes");

    // A compacted topic: the bomb's k is superseded, so the cleaner
    // rebuilds the batch around the 256 MiB value.
    let configs = [
        ("cleanup.policy", "compact"),
        ("segment.bytes", "1024"),
        // Every pass it asks for runs, whatever share of the log is dirty.
        ("min.cleanable.dirty.ratio", "0"),
    ];
    assert_eq!(c.create_topic("bombc", 1, &configs).await, 0);
    let r = c.produce("bombc", 0, -1, bomb).await;
    assert_eq!(r.error_code, 0, "{r:?}");
    let growth = peak_rss_growth(async {
        let r = c.produce("bombc", 0, -1, keyed(b"k", b"newer")).await;
        assert_eq!(r.error_code, 0);
        for _ in 0..20 {
            let r = c.produce("bombc", 0, -1, keyed(b"filler", b"x")).await;
            assert_eq!(r.error_code, 0);
        }
        // The bomb's k is at offset 1: wait for the cleaner to drop it.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let fetched = c.fetch("bombc", 0, 0, 0).await;
            let offsets = record_offsets(&fetched.records);
            if !offsets.contains(&1) {
                assert_eq!(offsets.first(), Some(&0), "the bomb's a stays");
                break;
            }
            assert!(Instant::now() < deadline, "no compaction: {offsets:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    println!("compaction of the bomb: peak RSS grew {} KiB", growth >> 10);
    assert!(growth < RSS_GROWTH_BOUND, "peak RSS grew {growth} bytes");
    b.running.shutdown().await;
}

/// One record `key` = `value`.
fn keyed(key: &'static [u8], value: &'static [u8]) -> Bytes {
    let record = Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp: base_timestamp_ms(),
        key: Some(Bytes::from_static(key)),
        value: Some(Bytes::from_static(value)),
        headers: Default::default(),
    };
    let mut buf = bytes::BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &[record],
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    buf.freeze()
}

/// Record offsets in a fetch response's first batches, without decoding
/// values (a decoder would inflate the bomb in this process).
fn record_offsets(records: &Option<Bytes>) -> Vec<i64> {
    let Some(records) = records else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for item in protocol::record_batch::BatchIter::new(records) {
        let protocol::record_batch::BatchIterItem::Batch { batch, .. } = item else {
            break;
        };
        let mut reader = protocol::records::RecordReader::new(&batch).unwrap();
        while let Some(info) = reader.next_record(&mut protocol::records::SkipAll).unwrap() {
            out.push(batch.base_offset() + info.offset_delta as i64);
        }
    }
    out
}
