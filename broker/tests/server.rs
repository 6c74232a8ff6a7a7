//! In-process broker tests on 127.0.0.1:0: the wire APIs end to end.

mod common;

use std::time::Duration;

use common::{batch, start, values, Client};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;
use kafka_protocol::ResponseError;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_versions_advertises_the_table_and_answers_unknown_versions_with_v0() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    let resp: ApiVersionsResponse = c
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    assert_eq!(resp.error_code, 0);
    let keys: Vec<i16> = resp.api_keys.iter().map(|k| k.api_key).collect();
    assert_eq!(
        keys,
        protocol::versions::api_versions_keys()
            .iter()
            .map(|k| k.api_key)
            .collect::<Vec<_>>()
    );
    assert!(keys.contains(&(ApiKey::Produce as i16)));

    // ApiVersions v99: a v0 response with UNSUPPORTED_VERSION and key 18's range.
    let mut raw = Vec::new();
    raw.extend_from_slice(&18i16.to_be_bytes());
    raw.extend_from_slice(&99i16.to_be_bytes());
    raw.extend_from_slice(&7i32.to_be_bytes());
    raw.extend_from_slice(&(-1i16).to_be_bytes());
    let mut framed = (raw.len() as i32).to_be_bytes().to_vec();
    framed.extend_from_slice(&raw);
    c.send_raw(&framed).await;
    let mut body = c.read_frame().await.unwrap();
    use kafka_protocol::protocol::Decodable;
    let header = ResponseHeader::decode(&mut body, 0).unwrap();
    assert_eq!(header.correlation_id, 7);
    let resp = ApiVersionsResponse::decode(&mut body, 0).unwrap();
    assert_eq!(resp.error_code, ResponseError::UnsupportedVersion.code());
    assert_eq!(resp.api_keys.len(), 1);
    assert_eq!(resp.api_keys[0].api_key, 18);
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_fetch_and_list_offsets_round_trip_in_every_codec() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("rt", 2, &[]).await, 0);
    let mut expected = Vec::new();
    for (i, codec) in [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ]
    .into_iter()
    .enumerate()
    {
        let vals: Vec<String> = (0..10).map(|j| format!("{i}-{j}")).collect();
        let refs: Vec<&str> = vals.iter().map(String::as_str).collect();
        let r = c.produce("rt", 1, -1, batch(&refs, codec, None)).await;
        assert_eq!(r.error_code, 0, "codec {codec:?}");
        assert_eq!(r.base_offset, (i * 10) as i64);
        expected.extend(
            vals.into_iter()
                .enumerate()
                .map(|(j, v)| ((i * 10 + j) as i64, v)),
        );
    }
    let mut got = Vec::new();
    let mut offset = 0;
    while got.len() < expected.len() {
        let p = c.fetch("rt", 1, offset, 100).await;
        assert_eq!(p.error_code, 0);
        assert_eq!(p.high_watermark, 50);
        let v = values(&p.records);
        assert!(!v.is_empty());
        offset = v.last().unwrap().0 + 1;
        got.extend(v);
    }
    assert_eq!(got, expected);
    // Fetching from the middle of a batch returns the whole batch.
    let p = c.fetch("rt", 1, 15, 0).await;
    assert_eq!(values(&p.records)[0].0, 10);

    assert_eq!(c.list_offset("rt", 1, -2).await.offset, 0);
    assert_eq!(c.list_offset("rt", 1, -1).await.offset, 50);
    let by_time = c
        .list_offset("rt", 1, common::base_timestamp_ms() + 5)
        .await;
    assert_eq!(by_time.error_code, 0);
    assert!(by_time.offset >= 0 && by_time.offset <= 5, "{by_time:?}");
    assert_eq!(
        c.list_offset("rt", 1, common::base_timestamp_ms() + 1_000_000)
            .await
            .offset,
        -1
    );

    let oor = c.fetch("rt", 1, 51, 0).await;
    assert_eq!(oor.error_code, ResponseError::OffsetOutOfRange.code());
    let unknown = c.fetch("nope", 0, 0, 0).await;
    assert_eq!(
        unknown.error_code,
        ResponseError::UnknownTopicOrPartition.code()
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_rejects_bad_batches_per_partition() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(
        c.create_topic("bad", 1, &[("max.message.bytes", "2000")])
            .await,
        0
    );
    let good = batch(&["a", "b"], Compression::None, None);
    let mut corrupt = good.to_vec();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    assert_eq!(
        c.produce("bad", 0, 1, corrupt.into()).await.error_code,
        ResponseError::CorruptMessage.code()
    );
    let big = "x".repeat(3000);
    assert_eq!(
        c.produce("bad", 0, 1, batch(&[&big], Compression::None, None))
            .await
            .error_code,
        ResponseError::MessageTooLarge.code()
    );
    assert_eq!(
        c.produce("missing", 0, 1, good.clone()).await.error_code,
        ResponseError::UnknownTopicOrPartition.code()
    );
    assert_eq!(
        c.produce("bad", 0, 1, good.slice(..good.len() - 3))
            .await
            .error_code,
        ResponseError::CorruptMessage.code()
    );
    // Nothing bad was appended; a good batch still lands at offset 0.
    assert_eq!(c.produce("bad", 0, 1, good).await.base_offset, 0);
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_producer_dedupes_retries_and_rejects_gaps() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("idem", 1, &[]).await, 0);
    let init: InitProducerIdResponse = c
        .call(
            ApiKey::InitProducerId,
            4,
            &InitProducerIdRequest::default()
                .with_transactional_id(None)
                .with_transaction_timeout_ms(60_000),
        )
        .await;
    assert_eq!(init.error_code, 0);
    let pid = init.producer_id.0;
    assert!(pid >= 0);
    let first = c
        .produce(
            "idem",
            0,
            -1,
            batch(&["a", "b", "c"], Compression::None, Some((pid, 0, 0))),
        )
        .await;
    assert_eq!((first.error_code, first.base_offset), (0, 0));
    let second = c
        .produce(
            "idem",
            0,
            -1,
            batch(&["d"], Compression::None, Some((pid, 0, 3))),
        )
        .await;
    assert_eq!((second.error_code, second.base_offset), (0, 3));
    // A retry of the first batch: success with the original offset, no append.
    let retry = c
        .produce(
            "idem",
            0,
            -1,
            batch(&["a", "b", "c"], Compression::None, Some((pid, 0, 0))),
        )
        .await;
    assert_eq!((retry.error_code, retry.base_offset), (0, 0));
    assert_eq!(c.list_offset("idem", 0, -1).await.offset, 4);
    let gap = c
        .produce(
            "idem",
            0,
            -1,
            batch(&["e"], Compression::None, Some((pid, 0, 9))),
        )
        .await;
    assert_eq!(
        gap.error_code,
        ResponseError::OutOfOrderSequenceNumber.code()
    );
    let txn: InitProducerIdResponse = c
        .call(
            ApiKey::InitProducerId,
            4,
            &InitProducerIdRequest::default()
                .with_transactional_id(Some(TransactionalId(StrBytes::from_static_str("t")))),
        )
        .await;
    assert_ne!(txn.error_code, 0);
    let next: InitProducerIdResponse = c
        .call(
            ApiKey::InitProducerId,
            4,
            &InitProducerIdRequest::default().with_transactional_id(None),
        )
        .await;
    assert!(next.producer_id.0 > pid, "producer ids are never reused");
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_and_producer_state_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::config(dir.path(), &[]);
    let running = broker::start(cfg.clone()).await.unwrap();
    let mut c = Client::connect(running.local_addr).await;
    assert_eq!(c.create_topic("keep", 1, &[]).await, 0);
    let r = c
        .produce(
            "keep",
            0,
            -1,
            batch(&["x", "y"], Compression::Lz4, Some((1000, 0, 0))),
        )
        .await;
    assert_eq!(r.error_code, 0);
    drop(c);
    running.shutdown().await;

    let running = broker::start(cfg).await.unwrap();
    let mut c = Client::connect(running.local_addr).await;
    let p = c.fetch("keep", 0, 0, 0).await;
    assert_eq!(values(&p.records), vec![(0, "x".into()), (1, "y".into())]);
    let retry = c
        .produce(
            "keep",
            0,
            -1,
            batch(&["x", "y"], Compression::Lz4, Some((1000, 0, 0))),
        )
        .await;
    assert_eq!(
        (retry.error_code, retry.base_offset),
        (0, 0),
        "dedupe survives restart"
    );
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_auto_creates_and_topics_can_be_deleted_and_grown() {
    let b = start(&[("num.partitions", "3")]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    let mut t = metadata_request::MetadataRequestTopic::default();
    t.name = Some(TopicName(StrBytes::from_static_str("auto")));
    let mut req = MetadataRequest::default();
    req.topics = Some(vec![t.clone()]);
    req.allow_auto_topic_creation = true;
    let resp: MetadataResponse = c.call(ApiKey::Metadata, 12, &req).await;
    assert_eq!(resp.topics[0].error_code, 0);
    assert_eq!(resp.topics[0].partitions.len(), 3);
    assert!(!resp.topics[0].topic_id.is_nil());
    assert_eq!(resp.brokers.len(), 1);
    assert_eq!(resp.brokers[0].port, b.running.local_addr.port() as i32);

    let mut grow = create_partitions_request::CreatePartitionsTopic::default();
    grow.name = TopicName(StrBytes::from_static_str("auto"));
    grow.count = 5;
    grow.assignments = None;
    let resp: CreatePartitionsResponse = c
        .call(
            ApiKey::CreatePartitions,
            3,
            &CreatePartitionsRequest::default().with_topics(vec![grow.clone()]),
        )
        .await;
    assert_eq!(resp.results[0].error_code, 0);
    let resp: CreatePartitionsResponse = c
        .call(
            ApiKey::CreatePartitions,
            3,
            &CreatePartitionsRequest::default().with_topics(vec![grow]),
        )
        .await;
    assert_eq!(
        resp.results[0].error_code,
        ResponseError::InvalidPartitions.code()
    );
    assert_eq!(
        c.produce("auto", 4, 1, batch(&["p4"], Compression::None, None))
            .await
            .error_code,
        0
    );

    assert_eq!(
        c.create_topic("auto", 1, &[]).await,
        ResponseError::TopicAlreadyExists.code()
    );
    assert_eq!(
        c.create_topic("bad/name", 1, &[]).await,
        ResponseError::InvalidTopicException.code()
    );
    assert_eq!(
        c.create_topic("cfg", 1, &[("no.such", "1")]).await,
        ResponseError::InvalidConfig.code()
    );

    let mut del = DeleteTopicsRequest::default();
    del.topic_names = vec![TopicName(StrBytes::from_static_str("auto"))];
    let resp: DeleteTopicsResponse = c.call(ApiKey::DeleteTopics, 5, &del).await;
    assert_eq!(resp.responses[0].error_code, 0);
    req.allow_auto_topic_creation = false;
    let resp: MetadataResponse = c.call(ApiKey::Metadata, 12, &req).await;
    assert_eq!(
        resp.topics[0].error_code,
        ResponseError::UnknownTopicOrPartition.code()
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_configs_reports_overrides_and_defaults() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(
        c.create_topic("conf", 1, &[("retention.ms", "12345")])
            .await,
        0
    );
    let mut res = describe_configs_request::DescribeConfigsResource::default();
    res.resource_type = 2;
    res.resource_name = StrBytes::from_static_str("conf");
    let resp: DescribeConfigsResponse = c
        .call(
            ApiKey::DescribeConfigs,
            4,
            &DescribeConfigsRequest::default().with_resources(vec![res]),
        )
        .await;
    let configs = &resp.results[0].configs;
    let retention = configs.iter().find(|c| &*c.name == "retention.ms").unwrap();
    assert_eq!(retention.value.as_deref(), Some("12345"));
    assert_eq!(retention.config_source, 1);
    let segment = configs
        .iter()
        .find(|c| &*c.name == "segment.bytes")
        .unwrap();
    assert_eq!(segment.config_source, 5);
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_records_advances_the_log_start_offset() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("dr", 1, &[]).await, 0);
    for _ in 0..3 {
        c.produce("dr", 0, 1, batch(&["a", "b"], Compression::None, None))
            .await;
    }
    let mut p = delete_records_request::DeleteRecordsPartition::default();
    p.partition_index = 0;
    p.offset = 2;
    let mut t = delete_records_request::DeleteRecordsTopic::default();
    t.name = TopicName(StrBytes::from_static_str("dr"));
    t.partitions = vec![p];
    let resp: DeleteRecordsResponse = c
        .call(
            ApiKey::DeleteRecords,
            2,
            &DeleteRecordsRequest::default().with_topics(vec![t]),
        )
        .await;
    assert_eq!(resp.topics[0].partitions[0].error_code, 0);
    assert_eq!(resp.topics[0].partitions[0].low_watermark, 2);
    assert_eq!(c.list_offset("dr", 0, -2).await.offset, 2);
    assert_eq!(
        c.fetch("dr", 0, 0, 0).await.error_code,
        ResponseError::OffsetOutOfRange.code()
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_long_polls_until_data_arrives() {
    let b = start(&[]).await;
    let addr = b.running.local_addr;
    let mut c = Client::connect(addr).await;
    assert_eq!(c.create_topic("poll", 1, &[]).await, 0);
    let waiter = tokio::spawn(async move {
        let mut c = Client::connect(addr).await;
        c.fetch("poll", 0, 0, 10_000).await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "an empty fetch waits for data");
    c.produce("poll", 0, 1, batch(&["wake"], Compression::None, None))
        .await;
    let p = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(values(&p.records), vec![(0, "wake".into())]);
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_frames_close_one_connection_and_the_broker_serves_others() {
    let b = start(&[("socket.request.max.bytes", "1048576")]).await;
    let addr = b.running.local_addr;
    let hostile: Vec<Vec<u8>> = vec![
        // Oversized length.
        i32::MAX.to_be_bytes().to_vec(),
        // Negative length.
        (-5i32).to_be_bytes().to_vec(),
        // Unknown api key.
        [
            &10i32.to_be_bytes()[..],
            &[0x7f, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0],
        ]
        .concat(),
        // Metadata v12 whose topic array claims 2^31-1 entries.
        [
            &16i32.to_be_bytes()[..],
            &[0, 3, 0, 12, 0, 0, 0, 1, 0xff, 0xff, 0],
            &[0xff, 0xff, 0xff, 0xff, 0x0f],
        ]
        .concat(),
        // Truncated frame: header promises more than arrives before close.
        [&100i32.to_be_bytes()[..], &[0, 18, 0, 3]].concat(),
    ];
    for bytes in hostile {
        let mut bad = Client::connect(addr).await;
        bad.send_raw(&bytes).await;
        // The broker either answers or closes; it must not hang the test.
        drop(tokio::time::timeout(Duration::from_secs(5), bad.read_frame()).await);
        let mut good = Client::connect(addr).await;
        let resp: ApiVersionsResponse = good
            .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
            .await;
        assert_eq!(resp.error_code, 0);
    }
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_append_time_topics_stamp_the_broker_time() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(
        c.create_topic("lat", 1, &[("message.timestamp.type", "LogAppendTime")])
            .await,
        0
    );
    let before = broker::broker::now_ms();
    let r = c
        .produce("lat", 0, 1, batch(&["a", "b"], Compression::Gzip, None))
        .await;
    assert_eq!(r.error_code, 0);
    assert!(r.log_append_time_ms >= before, "{r:?}");
    let p = c.fetch("lat", 0, 0, 0).await;
    let records = p.records.unwrap();
    let view = protocol::record_batch::RecordBatchView::parse(&records).unwrap();
    assert!(view.is_log_append_time());
    assert_eq!(view.max_timestamp(), r.log_append_time_ms);
    view.verify_crc().unwrap();
    b.running.shutdown().await;
}

/// Reads one topic's config as DescribeConfigs reports it: (value, source).
async fn topic_config(c: &mut Client, topic: &'static str, key: &str) -> (String, i8) {
    let mut res = describe_configs_request::DescribeConfigsResource::default();
    res.resource_type = 2;
    res.resource_name = StrBytes::from_static_str(topic);
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
        .unwrap();
    (
        entry.value.as_deref().unwrap_or_default().to_string(),
        entry.config_source,
    )
}

async fn incremental_alter(
    c: &mut Client,
    resource_type: i8,
    name: &'static str,
    edits: &[(&'static str, i8, Option<&'static str>)],
    validate_only: bool,
) -> (i16, Option<String>) {
    let mut res = incremental_alter_configs_request::AlterConfigsResource::default();
    res.resource_type = resource_type;
    res.resource_name = StrBytes::from_static_str(name);
    res.configs = edits
        .iter()
        .map(|(k, op, v)| {
            let mut e = incremental_alter_configs_request::AlterableConfig::default();
            e.name = StrBytes::from_static_str(k);
            e.config_operation = *op;
            e.value = v.map(StrBytes::from_static_str);
            e
        })
        .collect();
    let mut req = IncrementalAlterConfigsRequest::default();
    req.resources = vec![res];
    req.validate_only = validate_only;
    let resp: IncrementalAlterConfigsResponse =
        c.call(ApiKey::IncrementalAlterConfigs, 1, &req).await;
    let r = &resp.responses[0];
    (
        r.error_code,
        r.error_message.as_ref().map(|m| m.to_string()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_alter_configs_sets_appends_deletes_and_takes_effect() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("alt", 1, &[]).await, 0);

    // validate_only changes nothing.
    assert_eq!(
        incremental_alter(&mut c, 2, "alt", &[("retention.ms", 0, Some("1000"))], true)
            .await
            .0,
        0
    );
    assert_eq!(topic_config(&mut c, "alt", "retention.ms").await.1, 5);

    let edits = [
        ("retention.ms", 0, Some("1000")),
        ("cleanup.policy", 2, Some("compact")),
    ];
    assert_eq!(
        incremental_alter(&mut c, 2, "alt", &edits, false).await.0,
        0
    );
    assert_eq!(
        topic_config(&mut c, "alt", "retention.ms").await,
        ("1000".to_string(), 1)
    );
    // APPEND starts from the default "delete".
    assert_eq!(
        topic_config(&mut c, "alt", "cleanup.policy").await.0,
        "delete,compact"
    );
    let edits = [
        ("cleanup.policy", 3, Some("delete")),
        ("retention.ms", 1, None),
    ];
    assert_eq!(
        incremental_alter(&mut c, 2, "alt", &edits, false).await.0,
        0
    );
    assert_eq!(
        topic_config(&mut c, "alt", "cleanup.policy").await.0,
        "compact"
    );
    assert_eq!(topic_config(&mut c, "alt", "retention.ms").await.1, 5);

    // The partition sees the new limit at once.
    let edits = [("max.message.bytes", 0, Some("200"))];
    assert_eq!(
        incremental_alter(&mut c, 2, "alt", &edits, false).await.0,
        0
    );
    let big = "x".repeat(400);
    let resp = c
        .produce("alt", 0, -1, batch(&[&big], Compression::None, None))
        .await;
    assert_eq!(resp.error_code, ResponseError::MessageTooLarge.code());

    // Refusals, each with Kafka's error.
    let bad = [("no.such.config", 0, Some("1"))];
    assert_eq!(
        incremental_alter(&mut c, 2, "alt", &bad, false).await.0,
        ResponseError::InvalidConfig.code()
    );
    let bad = [("retention.ms", 0, Some("soon"))];
    assert_eq!(
        incremental_alter(&mut c, 2, "alt", &bad, false).await.0,
        ResponseError::InvalidConfig.code()
    );
    let bad = [("retention.ms", 2, Some("1"))];
    assert_eq!(
        incremental_alter(&mut c, 2, "alt", &bad, false).await.0,
        ResponseError::InvalidConfig.code()
    );
    let bad = [
        ("retention.ms", 0, Some("1")),
        ("retention.ms", 0, Some("2")),
    ];
    assert_eq!(
        incremental_alter(&mut c, 2, "alt", &bad, false).await.0,
        ResponseError::InvalidRequest.code()
    );
    let bad = [("retention.ms", 0, None)];
    assert_eq!(
        incremental_alter(&mut c, 2, "alt", &bad, false).await.0,
        ResponseError::InvalidRequest.code()
    );
    let ok = [("retention.ms", 0, Some("1"))];
    assert_eq!(
        incremental_alter(&mut c, 2, "missing", &ok, false).await.0,
        ResponseError::UnknownTopicOrPartition.code()
    );
    assert_eq!(
        incremental_alter(&mut c, 4, "1", &ok, false).await.0,
        ResponseError::InvalidRequest.code()
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alter_configs_replaces_the_whole_override_set() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(
        c.create_topic(
            "rep",
            1,
            &[("retention.ms", "5000"), ("segment.ms", "60000")]
        )
        .await,
        0
    );
    let mut cfg = alter_configs_request::AlterableConfig::default();
    cfg.name = StrBytes::from_static_str("retention.ms");
    cfg.value = Some(StrBytes::from_static_str("7000"));
    let mut res = alter_configs_request::AlterConfigsResource::default();
    res.resource_type = 2;
    res.resource_name = StrBytes::from_static_str("rep");
    res.configs = vec![cfg];
    let resp: AlterConfigsResponse = c
        .call(
            ApiKey::AlterConfigs,
            2,
            &AlterConfigsRequest::default().with_resources(vec![res]),
        )
        .await;
    assert_eq!(resp.responses[0].error_code, 0);
    assert_eq!(
        topic_config(&mut c, "rep", "retention.ms").await,
        ("7000".to_string(), 1)
    );
    // Not named in the request: back to the broker default.
    assert_eq!(topic_config(&mut c, "rep", "segment.ms").await.1, 5);
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_topics_reject_keyless_records_naming_each() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(
        c.create_topic("compacted", 1, &[("cleanup.policy", "compact")])
            .await,
        0
    );
    // Strip the keys of records 1 and 3 by re-encoding them keyless.
    let mut b2 = batch(&["a", "b", "c", "d"], Compression::Lz4, None);
    let mut set = kafka_protocol::records::RecordBatchDecoder::decode(&mut b2).unwrap();
    set.records[1].key = None;
    set.records[3].key = None;
    let mut buf = bytes::BytesMut::new();
    kafka_protocol::records::RecordBatchEncoder::encode(
        &mut buf,
        &set.records,
        &kafka_protocol::records::RecordEncodeOptions {
            version: 2,
            compression: Compression::Lz4,
        },
    )
    .unwrap();
    let resp = c.produce("compacted", 0, -1, buf.freeze()).await;
    assert_eq!(resp.error_code, ResponseError::InvalidRecord.code());
    let indexes: Vec<i32> = resp.record_errors.iter().map(|e| e.batch_index).collect();
    assert_eq!(indexes, vec![1, 3]);
    assert!(resp.error_message.unwrap().contains("without key"));
    // Nothing of the rejected batch was stored; keyed records still are.
    let ok = c
        .produce("compacted", 0, -1, batch(&["x"], Compression::None, None))
        .await;
    assert_eq!((ok.error_code, ok.base_offset), (0, 0));
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_compression_type_recompresses_batches_on_append() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(
        c.create_topic("zst", 1, &[("compression.type", "zstd")])
            .await,
        0
    );
    let sent = ["one", "two", "three"];
    let resp = c
        .produce("zst", 0, -1, batch(&sent, Compression::Gzip, None))
        .await;
    assert_eq!(resp.error_code, 0);
    let data = c.fetch("zst", 0, 0, 0).await;
    let stored = data.records.clone().unwrap();
    let view = protocol::record_batch::RecordBatchView::parse(&stored).unwrap();
    assert_eq!(view.codec().unwrap(), protocol::record_batch::Codec::Zstd);
    view.verify_crc().unwrap();
    assert_eq!(
        values(&data.records),
        vec![
            (0, "one".to_string()),
            (1, "two".to_string()),
            (2, "three".to_string())
        ]
    );
    b.running.shutdown().await;
}
