//! What the leader's append costs per codec: `Partition::append_as_leader`
//! (validation, offset assignment, the segment write) over 1 MiB batches of
//! 1 KiB records, as a producer with `batch.size=1048576` would send them.
//!
//!     cargo run --release -p broker --example produce_append [-- DIR [BATCHES]]
//!
//! DIR (default: a temporary directory) holds the partition; BATCHES (default
//! 200) batches are appended per codec. Prints one row per codec: the median
//! and best time of one append and the throughput in uncompressed bytes.

use std::time::{Duration, Instant};

use broker::config::{ServerConfig, TopicConfigs};
use broker::partition::leader_state::AssignedState;
use broker::partition::Partition;
use broker::types::{LeaderEpoch, NodeId, TopicPartition};
use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

const RECORDS: usize = 1024;
const VALUE_LEN: usize = 1024;

/// Text-like values (a small alphabet from a fixed LCG), so the codecs see
/// data they compress about as well as typical payloads.
fn batch(compression: Compression, now_ms: i64) -> (Bytes, usize) {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        b"abcdefghijklmnopqrstuvwxyz     ,.0123456789"[(state >> 58) as usize % 42]
    };
    let records: Vec<Record> = (0..RECORDS)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: i as i32 - 1,
            timestamp: now_ms + i as i64 / 100,
            key: Some(Bytes::from(format!("key-{i}"))),
            value: Some(Bytes::from(
                (0..VALUE_LEN).map(|_| next()).collect::<Vec<u8>>(),
            )),
            headers: Default::default(),
        })
        .collect();
    let mut plain = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut plain,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .expect("encodes");
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
    (buf.freeze(), plain.len())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let tmp = tempfile::tempdir().expect("temporary directory");
    let dir = args
        .next()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let batches: usize = args.next().map_or(200, |n| n.parse().expect("BATCHES"));
    let server = ServerConfig::default();
    let overrides = [
        ("max.message.bytes".to_string(), (8 << 20).to_string()),
        ("segment.bytes".to_string(), (64 << 20).to_string()),
    ]
    .into();
    println!("| codec | batch bytes | median append | best append | MiB/s (uncompressed) |");
    println!("|---|---|---|---|---|");
    for (name, compression) in [
        ("none", Compression::None),
        ("gzip", Compression::Gzip),
        ("snappy", Compression::Snappy),
        ("lz4", Compression::Lz4),
        ("zstd", Compression::Zstd),
    ] {
        let now = now_ms();
        let (records, plain_len) = batch(compression, now);
        let tp = TopicPartition::new(name, 0);
        let mut p = Partition::open(
            dir.join(format!("{name}-0")),
            tp,
            uuid::Uuid::new_v4(),
            LeaderEpoch(0),
            TopicConfigs::resolve(&server, &overrides),
            now,
        )
        .expect("partition opens");
        p.become_leader(
            NodeId(1),
            AssignedState {
                leader_epoch: LeaderEpoch(0),
                partition_epoch: 0,
                replicas: vec![NodeId(1)],
                isr: vec![NodeId(1)],
            },
            Default::default(),
            30_000,
            now,
        );
        let mut times: Vec<Duration> = (0..batches)
            .map(|_| {
                let start = Instant::now();
                p.append_as_leader(&records, 1, now_ms())
                    .expect("append succeeds");
                start.elapsed()
            })
            .collect();
        p.delete().expect("partition deleted");
        times.sort();
        let median = times[times.len() / 2];
        let best = times[0];
        println!(
            "| {name} | {} | {:.3} ms | {:.3} ms | {:.0} |",
            records.len(),
            median.as_secs_f64() * 1e3,
            best.as_secs_f64() * 1e3,
            plain_len as f64 / (1 << 20) as f64 / median.as_secs_f64(),
        );
    }
}
