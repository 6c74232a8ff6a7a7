//! The leader side of replication over the wire, on one broker (node 1)
//! whose partitions name a second replica, node 2, that the test plays by
//! sending raw Fetch requests with replica id 2: acks=all waits for the
//! follower, consumers see only up to the high watermark, followers up to
//! the log end, and the ISR shrinks and expands through the metadata quorum.
//! The leader state's rules are unit-tested in `src/partition/leader_state.rs`.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use broker::metadata::{BrokerRegistration, MetadataCommand, PartitionImage};
use broker::types::{LeaderEpoch, NodeId, TopicPartition};
use common::{batch, start, values, Client, TestBroker};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;
use kafka_protocol::ResponseError;

const NONE: i16 = 0;

/// Creates `name` with one partition on `replicas` (leader first unless
/// `leader` says otherwise) straight through the quorum, as a multi-broker
/// controller would, and applies it to the local partitions.
async fn create(
    b: &TestBroker,
    name: &str,
    replicas: &[i32],
    isr: &[i32],
    leader: i32,
    configs: &[(&str, &str)],
) -> uuid::Uuid {
    let broker = &b.running.broker;
    let topic_id = uuid::Uuid::new_v4();
    broker
        .metadata
        .propose(MetadataCommand::CreateTopic {
            name: name.to_string(),
            topic_id,
            partitions: vec![PartitionImage {
                partition: 0,
                replicas: replicas.iter().map(|&n| NodeId(n)).collect(),
                isr: isr.iter().map(|&n| NodeId(n)).collect(),
                leader: NodeId(leader),
                leader_epoch: LeaderEpoch(0),
                partition_epoch: 0,
            }],
            configs: configs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        })
        .await
        .expect("topic created");
    broker.sync_replicas().await.expect("partitions opened");
    topic_id
}

/// Registers node 2 so it may join ISRs (unregistered brokers may not).
async fn register_node_2(b: &TestBroker) {
    register_node(b, 2).await;
}

/// Registers `node_id` at 127.0.0.1, where the test's raw replica fetches
/// come from (the leader accepts them only from the broker's address).
async fn register_node(b: &TestBroker, node_id: i32) {
    b.running
        .broker
        .metadata
        .propose(MetadataCommand::RegisterBroker(BrokerRegistration {
            node_id: NodeId(node_id),
            host: "127.0.0.1".into(),
            port: 1,
            listeners: Vec::new(),
            rack: None,
            fenced: false,
            features: broker::metadata::supported_features(),
        }))
        .await
        .expect("registered");
    b.running.broker.sync_replicas().await.unwrap();
}

fn isr(b: &TestBroker, topic: &str) -> Vec<i32> {
    b.running.broker.metadata.image().topics[topic].partitions[0]
        .isr
        .iter()
        .map(|n| n.0)
        .collect()
}

fn high_watermark(b: &TestBroker, topic: &str) -> i64 {
    let part = b
        .running
        .broker
        .replicas
        .get(&TopicPartition::new(topic, 0))
        .unwrap();
    let hw = part.lock().unwrap().high_watermark().0;
    hw
}

/// Waits (bounded) until `cond` holds.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A Fetch as follower `replica` would send it (v12: header replica id; v15+:
/// `replica_state`).
async fn replica_fetch(
    c: &mut Client,
    version: i16,
    replica: i32,
    topic: &str,
    topic_id: uuid::Uuid,
    offset: i64,
    current_leader_epoch: i32,
) -> FetchResponse {
    let mut fp = fetch_request::FetchPartition::default();
    fp.partition = 0;
    fp.fetch_offset = offset;
    fp.partition_max_bytes = 1 << 20;
    fp.current_leader_epoch = current_leader_epoch;
    let mut ft = fetch_request::FetchTopic::default();
    ft.topic = TopicName(StrBytes::from_string(topic.into()));
    ft.topic_id = topic_id;
    ft.partitions = vec![fp];
    let mut req = FetchRequest::default();
    if version >= 15 {
        req.replica_state.replica_id = BrokerId(replica);
        req.replica_state.replica_epoch = -1;
    } else {
        req.replica_id = BrokerId(replica);
    }
    req.max_wait_ms = 0;
    req.min_bytes = 0;
    req.max_bytes = 50 << 20;
    req.session_epoch = -1;
    req.topics = vec![ft];
    c.call(ApiKey::Fetch, version, &req).await
}

fn produce_request(topic: &str, acks: i16, timeout_ms: i32, values: &[&str]) -> ProduceRequest {
    let mut pd = produce_request::PartitionProduceData::default();
    pd.index = 0;
    pd.records = Some(batch(values, Compression::None, None));
    let mut td = produce_request::TopicProduceData::default();
    td.name = TopicName(StrBytes::from_string(topic.into()));
    td.partition_data = vec![pd];
    let mut req = ProduceRequest::default();
    req.acks = acks;
    req.timeout_ms = timeout_ms;
    req.topic_data = vec![td];
    req
}

/// Sends a produce on its own connection in the background.
fn produce_in_background(
    addr: std::net::SocketAddr,
    req: ProduceRequest,
) -> tokio::task::JoinHandle<produce_response::PartitionProduceResponse> {
    tokio::spawn(async move {
        let mut c = Client::connect(addr).await;
        let resp: ProduceResponse = c.call(ApiKey::Produce, 11, &req).await;
        resp.responses[0].partition_responses[0].clone()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_all_waits_until_the_follower_has_fetched_past_the_batch() {
    let b = start(&[]).await;
    let addr = b.running.local_addr;
    let id = create(&b, "r", &[1, 2], &[1, 2], 1, &[]).await;
    register_node_2(&b).await;
    let mut follower = Client::connect(addr).await;
    let mut consumer = Client::connect(addr).await;

    let produce = produce_in_background(addr, produce_request("r", -1, 10_000, &["a", "b"]));
    let part = b
        .running
        .broker
        .replicas
        .get(&TopicPartition::new("r", 0))
        .unwrap();
    eventually("the batch is appended", || {
        part.lock().unwrap().log_end_offset().0 == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !produce.is_finished(),
        "acks=all answered before replication"
    );

    // A consumer sees nothing: the high watermark is still 0.
    let pd = consumer.fetch("r", 0, 0, 0).await;
    assert_eq!(pd.error_code, NONE);
    assert_eq!(pd.high_watermark, 0);
    assert!(values(&pd.records).is_empty());

    // The follower reads up to the log end, and learns HW 0.
    let resp = replica_fetch(&mut follower, 12, 2, "r", id, 0, 0).await;
    let pd = &resp.responses[0].partitions[0];
    assert_eq!(pd.error_code, NONE);
    assert_eq!(pd.high_watermark, 0);
    assert_eq!(
        values(&pd.records),
        vec![(0, "a".to_string()), (1, "b".to_string())]
    );
    assert!(!produce.is_finished());

    // Its next fetch from 2 says it has both records: committed.
    let resp = replica_fetch(&mut follower, 12, 2, "r", id, 2, 0).await;
    let pd = &resp.responses[0].partitions[0];
    assert_eq!(pd.error_code, NONE);
    assert_eq!(pd.high_watermark, 2, "the fetch that commits reports it");
    let r = tokio::time::timeout(Duration::from_secs(5), produce)
        .await
        .expect("acks=all answered after replication")
        .unwrap();
    assert_eq!(r.error_code, NONE);
    assert_eq!(r.base_offset, 0);
    let pd = consumer.fetch("r", 0, 0, 0).await;
    assert_eq!(pd.high_watermark, 2);
    assert_eq!(values(&pd.records).len(), 2);
    // ListOffsets LATEST is the high watermark.
    assert_eq!(consumer.list_offset("r", 0, -1).await.offset, 2);

    // acks=1 answers at once; the record is not visible until replicated.
    let r = consumer
        .produce("r", 0, 1, batch(&["c"], Compression::None, None))
        .await;
    assert_eq!(r.error_code, NONE);
    assert_eq!(r.base_offset, 2);
    assert_eq!(consumer.list_offset("r", 0, -1).await.offset, 2);
    // v15+ carries the replica id in replica_state.
    let resp = replica_fetch(&mut follower, 15, 2, "r", id, 3, 0).await;
    assert_eq!(resp.responses[0].partitions[0].error_code, NONE);
    assert_eq!(resp.responses[0].partitions[0].high_watermark, 3);
    assert_eq!(consumer.list_offset("r", 0, -1).await.offset, 3);
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_all_times_out_without_the_follower_and_replica_fetches_are_checked() {
    let b = start(&[]).await;
    let addr = b.running.local_addr;
    let id = create(&b, "t", &[1, 2], &[1, 2], 1, &[]).await;
    register_node(&b, 2).await;
    register_node(&b, 3).await;
    let mut c = Client::connect(addr).await;
    let resp: ProduceResponse = c
        .call(ApiKey::Produce, 11, &produce_request("t", -1, 300, &["x"]))
        .await;
    let r = &resp.responses[0].partition_responses[0];
    assert_eq!(r.error_code, ResponseError::RequestTimedOut.code());
    // Appended all the same: a retry is a duplicate for idempotent producers.
    assert_eq!(high_watermark(&b, "t"), 0);

    // A newer leader epoch than the partition's is unknown here.
    let mut f = Client::connect(addr).await;
    let resp = replica_fetch(&mut f, 12, 2, "t", id, 0, 1).await;
    assert_eq!(
        resp.responses[0].partitions[0].error_code,
        ResponseError::UnknownLeaderEpoch.code()
    );
    // A replica the partition does not have: UNKNOWN_LEADER_EPOCH when the
    // request names the epoch, NOT_LEADER_OR_FOLLOWER when it does not.
    let resp = replica_fetch(&mut f, 12, 3, "t", id, 0, 0).await;
    assert_eq!(
        resp.responses[0].partitions[0].error_code,
        ResponseError::UnknownLeaderEpoch.code()
    );
    let resp = replica_fetch(&mut f, 12, 3, "t", id, 0, -1).await;
    assert_eq!(
        resp.responses[0].partitions[0].error_code,
        ResponseError::NotLeaderOrFollower.code()
    );
    // A follower asking beyond the log end is out of range.
    let resp = replica_fetch(&mut f, 12, 2, "t", id, 5, 0).await;
    assert_eq!(
        resp.responses[0].partitions[0].error_code,
        ResponseError::OffsetOutOfRange.code()
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_all_is_refused_below_min_insync_replicas_until_the_follower_joins() {
    let b = start(&[]).await;
    let addr = b.running.local_addr;
    let id = create(&b, "m", &[1, 2], &[1], 1, &[("min.insync.replicas", "2")]).await;
    let mut c = Client::connect(addr).await;
    let r = c
        .produce("m", 0, -1, batch(&["no"], Compression::None, None))
        .await;
    assert_eq!(r.error_code, ResponseError::NotEnoughReplicas.code());
    let part = b
        .running
        .broker
        .replicas
        .get(&TopicPartition::new("m", 0))
        .unwrap();
    assert_eq!(
        part.lock().unwrap().log_end_offset().0,
        0,
        "nothing appended"
    );

    // acks=1 is appended, but under min ISR nothing is committed.
    let r = c
        .produce("m", 0, 1, batch(&["yes"], Compression::None, None))
        .await;
    assert_eq!(r.error_code, NONE);
    assert_eq!(high_watermark(&b, "m"), 0);

    // Node 2 registers and fetches up to the leader's end: it joins the ISR.
    register_node_2(&b).await;
    let mut f = Client::connect(addr).await;
    let resp = replica_fetch(&mut f, 16, 2, "m", id, 0, 0).await;
    assert_eq!(values(&resp.responses[0].partitions[0].records).len(), 1);
    let resp = replica_fetch(&mut f, 16, 2, "m", id, 1, 0).await;
    assert_eq!(resp.responses[0].partitions[0].error_code, NONE);
    eventually("node 2 joins the ISR", || isr(&b, "m") == vec![1, 2]).await;
    eventually("the high watermark advances", || {
        high_watermark(&b, "m") == 1
    })
    .await;
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_follower_leaves_the_isr_and_waiting_producers_learn_it() {
    let b = start(&[("replica.lag.time.max.ms", "500")]).await;
    let addr = b.running.local_addr;
    register_node_2(&b).await;
    create(&b, "s", &[1, 2], &[1, 2], 1, &[]).await;
    create(
        &b,
        "s2",
        &[1, 2],
        &[1, 2],
        1,
        &[("min.insync.replicas", "2")],
    )
    .await;
    // min ISR 1: once node 2 is dropped, the leader alone commits the batch.
    let ok = produce_in_background(addr, produce_request("s", -1, 10_000, &["a"]));
    // min ISR 2: once node 2 is dropped, the batch can never be committed.
    let below = produce_in_background(addr, produce_request("s2", -1, 10_000, &["a"]));
    let ok = tokio::time::timeout(Duration::from_secs(5), ok)
        .await
        .expect("answered after the shrink")
        .unwrap();
    assert_eq!(ok.error_code, NONE);
    assert_eq!(isr(&b, "s"), vec![1]);
    assert_eq!(high_watermark(&b, "s"), 1);
    let below = tokio::time::timeout(Duration::from_secs(5), below)
        .await
        .expect("answered after the shrink")
        .unwrap();
    assert_eq!(
        below.error_code,
        ResponseError::NotEnoughReplicasAfterAppend.code()
    );
    assert_eq!(isr(&b, "s2"), vec![1]);
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_replica_refuses_produce_consumer_fetch_and_list_offsets() {
    let b = start(&[]).await;
    let addr = b.running.local_addr;
    register_node_2(&b).await;
    let id = create(&b, "f", &[2, 1], &[2, 1], 2, &[]).await;
    assert_eq!(
        b.running.broker.replicas.followed(),
        vec![broker::replica_manager::Followed {
            tp: TopicPartition::new("f", 0),
            topic_id: id,
            leader: NodeId(2),
            leader_epoch: LeaderEpoch(0),
        }]
    );
    let mut c = Client::connect(addr).await;
    let resp: ProduceResponse = c
        .call(ApiKey::Produce, 11, &produce_request("f", 1, 1_000, &["x"]))
        .await;
    let r = &resp.responses[0].partition_responses[0];
    assert_eq!(r.error_code, ResponseError::NotLeaderOrFollower.code());
    // KIP-951: the answer names the leader and where it is.
    assert_eq!(r.current_leader.leader_id, BrokerId(2));
    assert_eq!(r.current_leader.leader_epoch, 0);
    assert_eq!(resp.node_endpoints.len(), 1);
    assert_eq!(resp.node_endpoints[0].node_id, BrokerId(2));
    let pd = c.fetch("f", 0, 0, 0).await;
    assert_eq!(pd.error_code, ResponseError::NotLeaderOrFollower.code());
    assert_eq!(pd.current_leader.leader_id, BrokerId(2));
    let lo = c.list_offset("f", 0, -1).await;
    assert_eq!(lo.error_code, ResponseError::NotLeaderOrFollower.code());
    // A replica fetch is refused too: only the leader serves followers.
    let resp = replica_fetch(&mut c, 12, 2, "f", id, 0, 0).await;
    assert_eq!(
        resp.responses[0].partitions[0].error_code,
        ResponseError::NotLeaderOrFollower.code()
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_polling_consumer_wakes_when_the_high_watermark_advances() {
    let b = start(&[]).await;
    let addr = b.running.local_addr;
    let id = create(&b, "w", &[1, 2], &[1, 2], 1, &[]).await;
    register_node_2(&b).await;
    let mut c = Client::connect(addr).await;
    let r = c
        .produce("w", 0, 1, batch(&["late"], Compression::None, None))
        .await;
    assert_eq!(r.error_code, NONE);
    // The record is in the log but not committed: a consumer parks.
    let started = tokio::time::Instant::now();
    let consumer = tokio::spawn(async move {
        let mut c = Client::connect(addr).await;
        c.fetch("w", 0, 0, 10_000).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!consumer.is_finished(), "nothing committed yet");
    // The follower's fetch from 1 commits it; the consumer wakes at once,
    // not at its 10 s deadline.
    let mut f = Client::connect(addr).await;
    let resp = replica_fetch(&mut f, 12, 2, "w", id, 1, 0).await;
    assert_eq!(resp.responses[0].partitions[0].error_code, NONE);
    let pd = tokio::time::timeout(Duration::from_secs(5), consumer)
        .await
        .expect("woken by the high watermark")
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(pd.high_watermark, 1);
    assert_eq!(values(&pd.records), vec![(0, "late".to_string())]);
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_produce_waiting_for_acks_learns_that_leadership_moved() {
    let b = start(&[]).await;
    let addr = b.running.local_addr;
    register_node_2(&b).await;
    create(&b, "l", &[1, 2], &[1, 2], 1, &[]).await;
    let produce = produce_in_background(addr, produce_request("l", -1, 10_000, &["x"]));
    let part = b
        .running
        .broker
        .replicas
        .get(&TopicPartition::new("l", 0))
        .unwrap();
    eventually("the batch is appended", || {
        part.lock().unwrap().log_end_offset().0 == 1
    })
    .await;
    // The controller moves leadership to node 2 (fencing node 1 does).
    b.running
        .broker
        .metadata
        .propose(MetadataCommand::FenceBroker { node_id: NodeId(1) })
        .await
        .unwrap();
    b.running.broker.sync_replicas().await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(5), produce)
        .await
        .expect("answered when leadership moved")
        .unwrap();
    assert_eq!(r.error_code, ResponseError::NotLeaderOrFollower.code());
    assert_eq!(r.current_leader.leader_id, BrokerId(2));
    assert_eq!(r.current_leader.leader_epoch, 1);
    b.running.shutdown().await;
}
