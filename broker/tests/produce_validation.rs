//! The leader's record validation on the produce path, over the wire:
//! every record of every codec is read and checked as Kafka's LogValidator
//! does, a refused batch stores nothing, and the connection goes on.

mod common;

use std::io::Write;

use bytes::{Bytes, BytesMut};
use common::{batch, start, values, Client};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use kafka_protocol::ResponseError;
use protocol::record_batch::{read_varlong, rewrite, Codec, HEADER_LEN};

const CODECS: [(Compression, Codec); 5] = [
    (Compression::None, Codec::None),
    (Compression::Gzip, Codec::Gzip),
    (Compression::Snappy, Codec::Snappy),
    (Compression::Lz4, Codec::Lz4),
    (Compression::Zstd, Codec::Zstd),
];

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `records` compressed as `codec` writes them in a batch: snappy-java's
/// framing for snappy, as Kafka's producers send it.
fn compress(codec: Codec, records: &[u8]) -> Vec<u8> {
    match codec {
        Codec::None => records.to_vec(),
        Codec::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(records).unwrap();
            e.finish().unwrap()
        }
        Codec::Snappy => {
            // snappy-java's magic, then its version and minimum version.
            let mut out = vec![0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
            out.extend_from_slice(&1i32.to_be_bytes());
            out.extend_from_slice(&1i32.to_be_bytes());
            let block = snap::raw::Encoder::new().compress_vec(records).unwrap();
            out.extend_from_slice(&(block.len() as u32).to_be_bytes());
            out.extend_from_slice(&block);
            out
        }
        Codec::Lz4 => {
            let mut e = lz4::EncoderBuilder::new().build(Vec::new()).unwrap();
            e.write_all(records).unwrap();
            let (out, r) = e.finish();
            r.unwrap();
            out
        }
        Codec::Zstd => zstd::encode_all(records, 3).unwrap(),
    }
}

/// An uncompressed batch's header (codec set, length and CRC resealed)
/// over `payload`: a batch whose CRC is right whatever its records are.
fn sealed(plain: &Bytes, codec: Codec, payload: &[u8]) -> Bytes {
    let mut out = plain[..HEADER_LEN].to_vec();
    out.extend_from_slice(payload);
    rewrite::set_codec(&mut out, codec);
    rewrite::seal(&mut out);
    Bytes::from(out)
}

/// Where the body (after the length varint) of each record starts.
fn record_bodies(records: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < records.len() {
        let len = read_varlong(records, &mut pos).unwrap();
        out.push(pos);
        pos += len as usize;
    }
    out
}

async fn log_end(c: &mut Client, topic: &str) -> i64 {
    c.list_offset(topic, 0, -1).await.offset
}

/// One batch of keyed records stamped `timestamps`.
fn stamped(timestamps: &[i64], compression: Compression) -> Bytes {
    let records: Vec<Record> = timestamps
        .iter()
        .enumerate()
        .map(|(i, &t)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: i as i32 - 1,
            timestamp: t,
            key: Some(Bytes::from(format!("key-{i}"))),
            value: Some(Bytes::from(format!("value-{i}"))),
            headers: Default::default(),
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
    .unwrap();
    buf.freeze()
}

/// The largest virtual size this process has had (Linux's VmPeak), in bytes.
fn vm_peak_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmPeak:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Finding 2: a snappy batch whose 5-byte raw preamble declares ~4 GiB.
/// Kafka's snappy reader fails it as a `KafkaException` (UNKNOWN_SERVER_ERROR)
/// and so do we, before making room for the block, on every kind of topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snappy_block_declaring_gigabytes_is_refused_before_allocation() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    // The topics whose batches were always read first (the compacted one's
    // keys, the lz4 one's recompression), then a default one.
    let topics: [(&str, &[(&str, &str)]); 3] = [
        ("compacted", &[("cleanup.policy", "compact")]),
        ("lz4", &[("compression.type", "lz4")]),
        ("plain", &[]),
    ];
    let plain = batch(&["x"], Compression::None, None);
    let bomb = sealed(&plain, Codec::Snappy, &[0xff, 0xff, 0xff, 0xff, 0x0f]);
    let peak_before = vm_peak_bytes();
    for (topic, configs) in topics {
        assert_eq!(c.create_topic(topic, 1, configs).await, 0);
        let r = c.produce(topic, 0, -1, bomb.clone()).await;
        if let (Some(before), Some(after)) = (peak_before, vm_peak_bytes()) {
            // Not even address space was taken for the declared 4 GiB.
            assert!(
                after - before < 1 << 30,
                "{topic}: VmPeak grew by {} MiB",
                (after - before) >> 20
            );
        }
        assert_eq!(
            r.error_code,
            ResponseError::UnknownServerError.code(),
            "{topic}: {r:?}"
        );
        assert!(
            r.error_message.as_deref().unwrap().contains("snappy"),
            "{r:?}"
        );
        assert_eq!(log_end(&mut c, topic).await, 0, "{topic}: nothing stored");
        // The same connection still produces.
        let ok = c.produce(topic, 0, -1, plain.clone()).await;
        assert_eq!((ok.error_code, ok.base_offset), (0, 0), "{topic}");
    }
    b.running.shutdown().await;
}

/// Finding 8: a record whose key length runs past its record, inside a
/// batch with a valid CRC, is refused in every codec with INVALID_RECORD
/// naming the record; nothing is stored and the connection goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_inside_records_is_invalid_record_in_every_codec() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("garbage", 1, &[]).await, 0);
    let plain = batch(&["a", "b", "c", "d"], Compression::None, None);
    let mut records = plain[HEADER_LEN..].to_vec();
    let body = record_bodies(&records)[2];
    // Record 2's body: attributes, timestamp delta, offset delta 2, then its
    // key length (10, "key-2"): claim 63 bytes, more than the record holds.
    assert_eq!(records[body + 3], 10);
    records[body + 3] = 0x7e;
    let mut stored = 0;
    for (_, codec) in CODECS {
        let bad = sealed(&plain, codec, &compress(codec, &records));
        let r = c.produce("garbage", 0, -1, bad).await;
        assert_eq!(
            r.error_code,
            ResponseError::InvalidRecord.code(),
            "{codec:?}: {r:?}"
        );
        let indexes: Vec<i32> = r.record_errors.iter().map(|e| e.batch_index).collect();
        assert_eq!(indexes, vec![2], "{codec:?}");
        assert!(r.error_message.is_some(), "{codec:?}");
        assert_eq!(log_end(&mut c, "garbage").await, stored, "{codec:?}");
        // The same records, intact, in the same codec: accepted.
        let good = sealed(&plain, codec, &compress(codec, &plain[HEADER_LEN..]));
        let ok = c.produce("garbage", 0, -1, good).await;
        assert_eq!((ok.error_code, ok.base_offset), (0, stored), "{codec:?}");
        stored += 4;
    }
    let data = c.fetch("garbage", 0, 0, 0).await;
    assert_eq!(values(&data.records).len(), 20);
    b.running.shutdown().await;
}

/// Finding 8: records that stop before the batch's declared count, or a
/// lastOffsetDelta past it, are refused in every codec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_counts_must_match_the_batch_header_in_every_codec() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("count", 1, &[]).await, 0);
    let plain = batch(&["a", "b", "c", "d"], Compression::None, None);
    let records = &plain[HEADER_LEN..];
    let three = &records[..record_bodies(records)[3] - 1];
    for (compression, codec) in CODECS {
        let short = sealed(&plain, codec, &compress(codec, three));
        let r = c.produce("count", 0, -1, short).await;
        assert_eq!(
            r.error_code,
            ResponseError::InvalidRecord.code(),
            "{codec:?}: {r:?}"
        );
        // lastOffsetDelta 4 for 4 records (Kafka: "Inconsistent batch offset range").
        let mut past = batch(&["a", "b", "c", "d"], compression, None).to_vec();
        past[23..27].copy_from_slice(&4i32.to_be_bytes());
        rewrite::update_crc(&mut past);
        let r = c.produce("count", 0, -1, past.into()).await;
        assert_eq!(
            r.error_code,
            ResponseError::InvalidRecord.code(),
            "{codec:?}: {r:?}"
        );
    }
    assert_eq!(log_end(&mut c, "count").await, 0);
    b.running.shutdown().await;
}

/// Finding 9: CreateTime records more than `log.message.timestamp.after.max.ms`
/// (one hour, Kafka 4's default) ahead are INVALID_TIMESTAMP, each named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_from_the_future_are_invalid_timestamp() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("future", 1, &[]).await, 0);
    for (compression, codec) in CODECS {
        let now = now_ms();
        let r = c
            .produce(
                "future",
                0,
                -1,
                stamped(&[now, now + 30 * DAY_MS, now], compression),
            )
            .await;
        assert_eq!(
            r.error_code,
            ResponseError::InvalidTimestamp.code(),
            "{codec:?}: {r:?}"
        );
        assert_eq!(r.record_errors.len(), 1, "{codec:?}");
        assert_eq!(r.record_errors[0].batch_index, 1);
        let message = r.record_errors[0]
            .batch_index_error_message
            .as_deref()
            .unwrap()
            .to_string();
        assert!(message.contains("is out of range"), "{message}");
        assert_eq!(
            r.error_message.as_deref(),
            Some("One or more records have been rejected due to invalid timestamp")
        );
    }
    assert_eq!(log_end(&mut c, "future").await, 0);
    // A minute ahead, and a year behind, are fine.
    let now = now_ms();
    let r = c
        .produce(
            "future",
            0,
            -1,
            stamped(&[now + 60_000, now - 365 * DAY_MS], Compression::Zstd),
        )
        .await;
    assert_eq!((r.error_code, r.base_offset), (0, 0));
    // The stored batch's max timestamp is its records' largest.
    let data = c.fetch("future", 0, 0, 0).await;
    let stored = data.records.unwrap();
    let view = protocol::record_batch::RecordBatchView::parse(&stored).unwrap();
    assert_eq!(view.max_timestamp(), now + 60_000);
    b.running.shutdown().await;
}

/// Finding 9: `before.max.ms` is honoured when set, at the topic or broker
/// level; LogAppendTime topics are exempt from both bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_max_ms_is_honoured_and_log_append_time_topics_are_exempt() {
    let b = start(&[("log.message.timestamp.before.max.ms", "86400000")]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("broker-bound", 1, &[]).await, 0);
    assert_eq!(
        c.create_topic(
            "topic-bound",
            1,
            &[("message.timestamp.before.max.ms", "3600000")]
        )
        .await,
        0
    );
    assert_eq!(
        c.create_topic(
            "appended",
            1,
            &[("message.timestamp.type", "LogAppendTime")]
        )
        .await,
        0
    );
    let now = now_ms();
    let two_hours_old = stamped(&[now - 2 * HOUR_MS], Compression::Lz4);
    let two_days_old = stamped(&[now - 2 * DAY_MS], Compression::Lz4);
    let invalid = ResponseError::InvalidTimestamp.code();
    let code = |r: produce_response::PartitionProduceResponse| r.error_code;
    assert_eq!(
        code(
            c.produce("broker-bound", 0, -1, two_hours_old.clone())
                .await
        ),
        0
    );
    assert_eq!(
        code(c.produce("broker-bound", 0, -1, two_days_old.clone()).await),
        invalid
    );
    assert_eq!(
        code(c.produce("topic-bound", 0, -1, two_hours_old.clone()).await),
        invalid
    );
    for old_or_new in [
        two_days_old,
        stamped(&[now + 30 * DAY_MS], Compression::None),
    ] {
        assert_eq!(code(c.produce("appended", 0, -1, old_or_new).await), 0);
    }
    b.running.shutdown().await;
}

/// Reads one config of a resource as DescribeConfigs reports it: (value, source).
async fn described(c: &mut Client, resource_type: i8, name: &str, key: &str) -> (String, i8) {
    let mut res = describe_configs_request::DescribeConfigsResource::default();
    res.resource_type = resource_type;
    res.resource_name = StrBytes::from_string(name.to_string());
    let resp: DescribeConfigsResponse = c
        .call(
            ApiKey::DescribeConfigs,
            4,
            &DescribeConfigsRequest::default().with_resources(vec![res]),
        )
        .await;
    let entry = resp.results[0]
        .configs
        .iter()
        .find(|c| &*c.name == key)
        .unwrap_or_else(|| panic!("{key} not described"));
    (
        entry.value.as_deref().unwrap_or_default().to_string(),
        entry.config_source,
    )
}

/// The timestamp keys are described with Kafka's defaults and sources, and
/// IncrementalAlterConfigs changes them on a live topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timestamp_bounds_are_described_and_alterable() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("bounds", 1, &[]).await, 0);
    let node = b.running.broker.config.node_id.0.to_string();
    const TOPIC: i8 = 2;
    const BROKER: i8 = 4;
    const DEFAULT: i8 = 5;
    assert_eq!(
        described(&mut c, TOPIC, "bounds", "message.timestamp.after.max.ms").await,
        ("3600000".to_string(), DEFAULT)
    );
    assert_eq!(
        described(&mut c, TOPIC, "bounds", "message.timestamp.before.max.ms").await,
        (i64::MAX.to_string(), DEFAULT)
    );
    assert_eq!(
        described(&mut c, BROKER, &node, "log.message.timestamp.after.max.ms")
            .await
            .0,
        "3600000"
    );
    assert_eq!(
        described(&mut c, BROKER, &node, "log.message.timestamp.before.max.ms")
            .await
            .0,
        i64::MAX.to_string()
    );

    let future = stamped(&[now_ms() + 2 * HOUR_MS], Compression::Gzip);
    assert_eq!(
        c.produce("bounds", 0, -1, future.clone()).await.error_code,
        ResponseError::InvalidTimestamp.code()
    );
    let mut edit = incremental_alter_configs_request::AlterableConfig::default();
    edit.name = StrBytes::from_static_str("message.timestamp.after.max.ms");
    edit.config_operation = 0; // SET
    edit.value = Some(StrBytes::from_string((3 * HOUR_MS).to_string()));
    let mut res = incremental_alter_configs_request::AlterConfigsResource::default();
    res.resource_type = TOPIC;
    res.resource_name = StrBytes::from_static_str("bounds");
    res.configs = vec![edit];
    let mut req = IncrementalAlterConfigsRequest::default();
    req.resources = vec![res];
    let resp: IncrementalAlterConfigsResponse =
        c.call(ApiKey::IncrementalAlterConfigs, 1, &req).await;
    assert_eq!(resp.responses[0].error_code, 0);
    assert_eq!(
        described(&mut c, TOPIC, "bounds", "message.timestamp.after.max.ms").await,
        ((3 * HOUR_MS).to_string(), 1)
    );
    // The partition sees the new bound at once.
    let r = c.produce("bounds", 0, -1, future).await;
    assert_eq!((r.error_code, r.base_offset), (0, 0));
    b.running.shutdown().await;
}
