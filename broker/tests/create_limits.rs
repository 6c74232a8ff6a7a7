//! CreateTopics and CreatePartitions within Kafka's controller limits: at
//! most 10,000 partitions asked for and 10,000 metadata records written per
//! request, checked before anything is placed, validate-only or not.

mod common;

use common::{start, Client};
use kafka_protocol::messages::create_partitions_request::{
    CreatePartitionsAssignment, CreatePartitionsTopic,
};
use kafka_protocol::messages::create_topics_request::{CreatableReplicaAssignment, CreatableTopic};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

fn topic(name: &str, partitions: i32, replication_factor: i16) -> CreatableTopic {
    let mut t = CreatableTopic::default();
    t.name = TopicName(StrBytes::from_string(name.into()));
    t.num_partitions = partitions;
    t.replication_factor = replication_factor;
    t
}

fn assigned(name: &str, assignments: Vec<(i32, Vec<i32>)>) -> CreatableTopic {
    let mut t = topic(name, -1, -1);
    t.assignments = assignments
        .into_iter()
        .map(|(index, brokers)| {
            let mut a = CreatableReplicaAssignment::default();
            a.partition_index = index;
            a.broker_ids = brokers.into_iter().map(BrokerId).collect();
            a
        })
        .collect();
    t
}

async fn create(
    c: &mut Client,
    topics: Vec<CreatableTopic>,
    validate_only: bool,
) -> Vec<(String, i16, Option<String>)> {
    let mut req = CreateTopicsRequest::default();
    req.topics = topics;
    req.timeout_ms = 10_000;
    req.validate_only = validate_only;
    let resp: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &req).await;
    resp.topics
        .into_iter()
        .map(|t| {
            (
                t.name.0.to_string(),
                t.error_code,
                t.error_message.map(|m| m.to_string()),
            )
        })
        .collect()
}

fn grow(name: &str, count: i32, assignments: Option<Vec<Vec<i32>>>) -> CreatePartitionsTopic {
    let mut t = CreatePartitionsTopic::default();
    t.name = TopicName(StrBytes::from_string(name.into()));
    t.count = count;
    t.assignments = assignments.map(|a| {
        a.into_iter()
            .map(|ids| {
                let mut x = CreatePartitionsAssignment::default();
                x.broker_ids = ids.into_iter().map(BrokerId).collect();
                x
            })
            .collect()
    });
    t
}

async fn create_partitions(
    c: &mut Client,
    topics: Vec<CreatePartitionsTopic>,
    validate_only: bool,
) -> Vec<(String, i16, Option<String>)> {
    let mut req = CreatePartitionsRequest::default();
    req.topics = topics;
    req.timeout_ms = 10_000;
    req.validate_only = validate_only;
    let resp: CreatePartitionsResponse = c.call(ApiKey::CreatePartitions, 3, &req).await;
    resp.results
        .into_iter()
        .map(|t| {
            (
                t.name.0.to_string(),
                t.error_code,
                t.error_message.map(|m| m.to_string()),
            )
        })
        .collect()
}

const POLICY: i16 = 44; // POLICY_VIOLATION
const TOO_MANY_PARTITIONS: &str = "Excessively large number of partitions per request.";
const TOO_MANY_RECORDS: &str = "Unable to perform excessively large batch operation.";

async fn topic_count(c: &mut Client) -> usize {
    let mut req = MetadataRequest::default();
    req.topics = None;
    let resp: MetadataResponse = c.call(ApiKey::Metadata, 12, &req).await;
    resp.topics.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_topics_with_two_billion_partitions_is_refused_before_any_placement() {
    assert_eq!(ResponseError::PolicyViolation.code(), POLICY);
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    for validate_only in [true, false] {
        let out = create(&mut c, vec![topic("huge", i32::MAX, 1)], validate_only).await;
        assert_eq!(
            out,
            vec![(
                "huge".to_string(),
                POLICY,
                Some(TOO_MANY_PARTITIONS.to_string())
            )]
        );
    }
    // Over the cap only together: the whole request is refused, every
    // topic with the same error, and nothing is created.
    let out = create(
        &mut c,
        vec![topic("half-a", 5_000, 1), topic("half-b", 5_001, 1)],
        false,
    )
    .await;
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|(_, code, _)| *code == POLICY), "{out:?}");
    // Two topics of 2^31-1 each: the sum saturates, it does not wrap.
    let out = create(
        &mut c,
        vec![topic("wrap-a", i32::MAX, 1), topic("wrap-b", i32::MAX, 1)],
        true,
    )
    .await;
    assert!(out.iter().all(|(_, code, _)| *code == POLICY), "{out:?}");
    assert_eq!(topic_count(&mut c).await, 0);
    // The broker is alive and creates a sane topic.
    assert_eq!(c.create_topic("sane", 3, &[]).await, 0);
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_topics_counts_metadata_records_as_kafkas_controller_does() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    // 10,000 partitions pass the partition count, but with the topic's own
    // record they are 10,001 records: one more than an operation may write.
    let out = create(&mut c, vec![topic("ten-k", 10_000, 1)], true).await;
    assert_eq!(out[0].1, POLICY, "{out:?}");
    assert_eq!(out[0].2.as_deref(), Some(TOO_MANY_RECORDS));
    // Config overrides are records too.
    let mut with_config = topic("nines", 9_999, 1);
    let mut cfg = create_topics_request::CreatableTopicConfig::default();
    cfg.name = StrBytes::from_static_str("retention.ms");
    cfg.value = Some(StrBytes::from_static_str("1000"));
    with_config.configs = vec![cfg];
    let out = create(&mut c, vec![with_config], true).await;
    assert_eq!(out[0].1, POLICY, "{out:?}");
    // 9,999 partitions and the topic record fit.
    let out = create(&mut c, vec![topic("nines", 9_999, 1)], true).await;
    assert_eq!(out[0].1, 0, "{out:?}");
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_assignments_are_bounded_and_checked_like_kafkas() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    let node = 1;
    // 10,001 one-replica assignments: over the partition cap.
    let many: Vec<(i32, Vec<i32>)> = (0..10_001).map(|i| (i, vec![node])).collect();
    let out = create(&mut c, vec![assigned("many", many)], true).await;
    assert_eq!(out[0].1, POLICY, "{out:?}");
    // One partition naming the same broker 5,000 times.
    let out = create(
        &mut c,
        vec![assigned("repeat", vec![(0, vec![node; 5_000])])],
        true,
    )
    .await;
    assert_eq!(
        out[0].1,
        ResponseError::InvalidReplicaAssignment.code(),
        "{out:?}"
    );
    assert_eq!(
        out[0].2.as_deref(),
        Some("The manual partition assignment includes the broker 1 more than once.")
    );
    let out = create(
        &mut c,
        vec![assigned("unknown", vec![(0, vec![node, 42])])],
        true,
    )
    .await;
    assert_eq!(
        out[0].1,
        ResponseError::InvalidReplicaAssignment.code(),
        "{out:?}"
    );
    let mut both = assigned("both", vec![(0, vec![node])]);
    both.replication_factor = 1;
    let out = create(&mut c, vec![both], true).await;
    assert_eq!(out[0].1, ResponseError::InvalidRequest.code(), "{out:?}");
    let out = create(
        &mut c,
        vec![assigned("twice", vec![(0, vec![node]), (0, vec![node])])],
        true,
    )
    .await;
    assert_eq!(
        out[0].1,
        ResponseError::InvalidReplicaAssignment.code(),
        "{out:?}"
    );
    let out = create(
        &mut c,
        vec![assigned("gap", vec![(0, vec![node]), (2, vec![node])])],
        true,
    )
    .await;
    assert_eq!(
        out[0].1,
        ResponseError::InvalidReplicaAssignment.code(),
        "{out:?}"
    );
    // In any order, as long as they are 0..n.
    let out = create(
        &mut c,
        vec![assigned("ok", vec![(1, vec![node]), (0, vec![node])])],
        false,
    )
    .await;
    assert_eq!(out[0].1, 0, "{out:?}");
    // Duplicated names and the metadata topic are refused one by one.
    let out = create(
        &mut c,
        vec![
            topic("dup", 1, 1),
            topic("dup", 1, 1),
            topic("__cluster_metadata", 1, 1),
        ],
        true,
    )
    .await;
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(out
        .iter()
        .all(|(_, code, _)| *code == ResponseError::InvalidRequest.code()));
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_partitions_is_bounded_before_any_placement() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("grow", 1, &[]).await, 0);
    assert_eq!(c.create_topic("grow2", 1, &[]).await, 0);
    for validate_only in [true, false] {
        let out =
            create_partitions(&mut c, vec![grow("grow", i32::MAX, None)], validate_only).await;
        assert_eq!(
            out,
            vec![(
                "grow".to_string(),
                POLICY,
                Some(TOO_MANY_RECORDS.to_string())
            )]
        );
    }
    // Past the cap the answer is POLICY_VIOLATION even with an assignment list
    // that does not match the count, as Kafka 4.4 answers.
    let out = create_partitions(&mut c, vec![grow("grow", i32::MAX, Some(vec![]))], true).await;
    assert_eq!(out[0].1, POLICY, "{out:?}");
    // The cap is per request: the first topic's 6,000 fit, the second's
    // 6,000 do not.
    let out = create_partitions(
        &mut c,
        vec![grow("grow", 6_001, None), grow("grow2", 6_001, None)],
        true,
    )
    .await;
    assert_eq!(out[0].1, 0, "{out:?}");
    assert_eq!(out[1].1, POLICY, "{out:?}");
    // Assignments must match the partitions added, and are checked.
    let out = create_partitions(&mut c, vec![grow("grow", 3, Some(vec![vec![1]]))], true).await;
    assert_eq!(
        out[0].1,
        ResponseError::InvalidReplicaAssignment.code(),
        "{out:?}"
    );
    let out = create_partitions(&mut c, vec![grow("grow", 2, Some(vec![vec![1, 1]]))], true).await;
    assert_eq!(
        out[0].1,
        ResponseError::InvalidReplicaAssignment.code(),
        "{out:?}"
    );
    let out = create_partitions(
        &mut c,
        vec![grow("grow", 3, None), grow("grow", 4, None)],
        true,
    )
    .await;
    assert_eq!(
        out,
        vec![(
            "grow".to_string(),
            ResponseError::InvalidRequest.code(),
            Some("Duplicate topic name.".to_string())
        )]
    );
    let out = create_partitions(
        &mut c,
        vec![grow("grow", 3, Some(vec![vec![1], vec![1]]))],
        false,
    )
    .await;
    assert_eq!(out[0].1, 0, "{out:?}");
    let out = create_partitions(&mut c, vec![grow("grow", 3, None)], false).await;
    assert_eq!(out[0].1, ResponseError::InvalidPartitions.code(), "{out:?}");
    b.running.shutdown().await;
}

/// Metadata auto-creation and internal topics create one topic through the
/// same checks: a `num.partitions` over the cap is refused, not placed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_topic_creation_applies_the_same_caps() {
    let b = start(&[("num.partitions", "2147483647")]).await;
    let new = |name: &str| broker::broker::NewTopic {
        name: name.to_string(),
        num_partitions: -1,
        replication_factor: -1,
        assignments: vec![],
        configs: Default::default(),
    };
    let broker = b.running.broker.clone();
    for validate_only in [true, false] {
        let err = broker
            .create_topic(new("auto"), validate_only)
            .await
            .expect_err("over the cap");
        assert_eq!(err.code(), POLICY);
    }
    let mut c = Client::connect(b.running.local_addr).await;
    let mut t = metadata_request::MetadataRequestTopic::default();
    t.name = Some(TopicName(StrBytes::from_static_str("auto")));
    let mut req = MetadataRequest::default();
    req.topics = Some(vec![t]);
    req.allow_auto_topic_creation = true;
    let resp: MetadataResponse = c.call(ApiKey::Metadata, 12, &req).await;
    assert_eq!(resp.topics[0].error_code, POLICY);
    assert_eq!(topic_count(&mut c).await, 0);
    b.running.shutdown().await;
}
