//! Fetch within the broker's caps: `fetch.max.bytes` bounds what a request
//! may ask for, `min_bytes` is capped by it, and the first batch is always
//! returned whole. Responses are checked at every version we serve.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{batch, start, values, Client};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;

const VALUE_BYTES: usize = 5_000;

struct Limits {
    max_bytes: i32,
    partition_max_bytes: i32,
    min_bytes: i32,
    max_wait_ms: i32,
}

async fn fetch(
    c: &mut Client,
    version: i16,
    topic: &str,
    topic_id: uuid::Uuid,
    limits: Limits,
) -> fetch_response::PartitionData {
    let mut fp = fetch_request::FetchPartition::default();
    fp.partition = 0;
    fp.fetch_offset = 0;
    fp.partition_max_bytes = limits.partition_max_bytes;
    fp.current_leader_epoch = -1;
    fp.log_start_offset = -1;
    let mut ft = fetch_request::FetchTopic::default();
    if version >= 13 {
        ft.topic_id = topic_id;
    } else {
        ft.topic = TopicName(StrBytes::from_string(topic.into()));
    }
    ft.partitions = vec![fp];
    let mut req = FetchRequest::default();
    req.replica_id = BrokerId(-1);
    req.max_wait_ms = limits.max_wait_ms;
    req.min_bytes = limits.min_bytes;
    req.max_bytes = limits.max_bytes;
    req.session_epoch = -1;
    req.topics = vec![ft];
    let resp: FetchResponse = c.call(ApiKey::Fetch, version, &req).await;
    assert_eq!(resp.error_code, 0);
    resp.responses[0].partitions[0].clone()
}

async fn topic_id(c: &mut Client, topic: &str) -> uuid::Uuid {
    let mut t = metadata_request::MetadataRequestTopic::default();
    t.name = Some(TopicName(StrBytes::from_string(topic.into())));
    let mut req = MetadataRequest::default();
    req.topics = Some(vec![t]);
    let resp: MetadataResponse = c.call(ApiKey::Metadata, 12, &req).await;
    resp.topics[0].topic_id
}

/// Four batches of one 5,000-byte record each: every batch is larger than
/// the 4,096-byte `fetch.max.bytes` the broker runs with.
async fn four_large_batches(c: &mut Client, topic: &str) -> Vec<Bytes> {
    assert_eq!(c.create_topic(topic, 1, &[]).await, 0);
    let value = "v".repeat(VALUE_BYTES);
    let mut sent = Vec::new();
    for _ in 0..4 {
        let b = batch(&[value.as_str()], Compression::None, None);
        assert_eq!(c.produce(topic, 0, 1, b.clone()).await.error_code, 0);
        sent.push(b);
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_max_bytes_caps_what_a_fetch_may_ask_for() {
    let b = start(&[("fetch.max.bytes", "4096")]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    four_large_batches(&mut c, "capped").await;
    let id = topic_id(&mut c, "capped").await;
    for version in 4..=16 {
        // The request asks for 50 MiB; the broker's cap leaves room for the
        // first batch only, which is returned whole although it is larger.
        let p = fetch(
            &mut c,
            version,
            "capped",
            id,
            Limits {
                max_bytes: 50 << 20,
                partition_max_bytes: 50 << 20,
                min_bytes: 1,
                max_wait_ms: 0,
            },
        )
        .await;
        assert_eq!(p.error_code, 0, "v{version}");
        assert_eq!(values(&p.records).len(), 1, "v{version}");
        // No limit, or a negative one, is no licence to read everything.
        for max_bytes in [0, -1] {
            let p = fetch(
                &mut c,
                version,
                "capped",
                id,
                Limits {
                    max_bytes,
                    partition_max_bytes: 50 << 20,
                    min_bytes: 1,
                    max_wait_ms: 0,
                },
            )
            .await;
            assert_eq!(
                values(&p.records).len(),
                1,
                "v{version} max_bytes {max_bytes}"
            );
        }
    }
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_bytes_above_fetch_max_bytes_does_not_hold_a_fetch_until_max_wait() {
    let b = start(&[("fetch.max.bytes", "4096")]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    four_large_batches(&mut c, "min").await;
    let id = topic_id(&mut c, "min").await;
    let started = Instant::now();
    let p = fetch(
        &mut c,
        12,
        "min",
        id,
        Limits {
            max_bytes: 50 << 20,
            partition_max_bytes: 50 << 20,
            min_bytes: 100 << 20,
            max_wait_ms: 30_000,
        },
    )
    .await;
    // min_bytes is capped at fetch.max.bytes (Kafka's fetchMinBytes), which
    // the first batch alone exceeds: the answer comes at once, not after
    // max_wait_ms.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(values(&p.records).len(), 1);
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_sent_from_the_segment_files_are_the_stored_batches() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("exact", 3, &[]).await, 0);
    let id = topic_id(&mut c, "exact").await;
    // Partitions 0 and 2 hold batches; 1 is empty and fetched past its end;
    // 3 does not exist.
    let mut sent: Vec<Vec<Bytes>> = vec![Vec::new(); 3];
    for (partition, count) in [(0, 3), (2, 2)] {
        for i in 0..count {
            let value = format!("p{partition}-{i}-{}", "x".repeat(20_000));
            let b = batch(&[value.as_str()], Compression::Gzip, None);
            assert_eq!(
                c.produce("exact", partition, 1, b.clone()).await.error_code,
                0
            );
            sent[partition as usize].push(b);
        }
    }
    for version in 4..=16 {
        let mut ft = fetch_request::FetchTopic::default();
        if version >= 13 {
            ft.topic_id = id;
        } else {
            ft.topic = TopicName(StrBytes::from_static_str("exact"));
        }
        ft.partitions = (0..4)
            .map(|partition| {
                let mut fp = fetch_request::FetchPartition::default();
                fp.partition = partition;
                fp.fetch_offset = if partition == 1 { 5 } else { 0 };
                fp.partition_max_bytes = 1 << 20;
                fp.current_leader_epoch = -1;
                fp.log_start_offset = -1;
                fp
            })
            .collect();
        let mut req = FetchRequest::default();
        req.replica_id = BrokerId(-1);
        req.max_bytes = 50 << 20;
        req.min_bytes = 1;
        req.session_epoch = -1;
        req.topics = vec![ft];
        let resp: FetchResponse = c.call(ApiKey::Fetch, version, &req).await;
        let parts = &resp.responses[0].partitions;
        assert_eq!(parts.len(), 4);
        assert_eq!(
            parts[3].error_code,
            kafka_protocol::ResponseError::UnknownTopicOrPartition.code()
        );
        assert_eq!(
            parts[1].error_code,
            kafka_protocol::ResponseError::OffsetOutOfRange.code()
        );
        // A partition with an error carries an empty record set, as Kafka's
        // does: librdkafka refuses a null one and never gets past it.
        assert_eq!(parts[1].records, Some(Bytes::new()), "v{version}");
        assert_eq!(parts[3].records, Some(Bytes::new()), "v{version}");
        for partition in 0..3 {
            let got = parts[partition].records.clone().expect("records");
            let expected = &sent[partition];
            assert_eq!(got.len(), expected.iter().map(Bytes::len).sum::<usize>());
            // Byte for byte as produced, except the base offset and the
            // leader epoch the broker writes into the header (bytes 0..8
            // and 12..16), which the CRC does not cover.
            let mut at = 0;
            for (i, s) in expected.iter().enumerate() {
                let stored = &got[at..at + s.len()];
                assert_eq!(
                    i64::from_be_bytes(stored[0..8].try_into().unwrap()),
                    i as i64
                );
                assert_eq!(stored[8..12], s[8..12]);
                assert_eq!(stored[16..], s[16..], "v{version} p{partition} batch {i}");
                at += s.len();
            }
        }
    }
    b.running.shutdown().await;
}
