//! The follower side of replication over the wire: OffsetForLeaderEpoch
//! answered by a leader, and the replica fetcher copying a leader's log into
//! a follower replica, truncating a divergent tail first.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker::config::{ServerConfig, TopicConfigs};
use broker::metadata::{BrokerRegistration, MetadataCommand};
use broker::partition::Partition;
use broker::replica_manager::PartitionRef;
use broker::replication::fetcher::{
    FetcherConfig, FetcherEnv, FollowedPartition, ReplicaFetcherManager,
};
use broker::types::{LeaderEpoch, NodeId, Offset, TopicPartition};
use bytes::{Bytes, BytesMut};
use common::{batch, start, Client, TestBroker};
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;
use kafka_protocol::ResponseError;
use protocol::record_batch::rewrite;
use uuid::Uuid;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

async fn register(b: &TestBroker, node: i32) {
    b.running
        .broker
        .metadata
        .propose(MetadataCommand::RegisterBroker(BrokerRegistration {
            node_id: NodeId(node),
            host: "127.0.0.1".into(),
            port: 9,
            listeners: Vec::new(),
            rack: None,
            fenced: false,
            features: broker::metadata::supported_features(),
        }))
        .await
        .expect("registers");
}

/// Creates a one-partition topic on the given replicas; returns its id.
async fn create_assigned(b: &TestBroker, topic: &str, replicas: &[i32]) -> Uuid {
    let mut c = Client::connect(b.running.local_addr).await;
    let mut a = create_topics_request::CreatableReplicaAssignment::default();
    a.partition_index = 0;
    a.broker_ids = replicas.iter().map(|&r| BrokerId(r)).collect();
    let mut t = create_topics_request::CreatableTopic::default();
    t.name = name(topic);
    t.num_partitions = -1;
    t.replication_factor = -1;
    t.assignments = vec![a];
    let req = CreateTopicsRequest::default()
        .with_topics(vec![t])
        .with_timeout_ms(10_000);
    let resp: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &req).await;
    assert_eq!(resp.topics[0].error_code, 0, "{:?}", resp.topics[0]);
    b.running.broker.metadata.image().topics[topic].topic_id
}

async fn offset_for_leader_epoch(
    b: &TestBroker,
    topic: &str,
    partition: i32,
    current_leader_epoch: i32,
    leader_epoch: i32,
) -> offset_for_leader_epoch_response::EpochEndOffset {
    let mut c = Client::connect(b.running.local_addr).await;
    let req = OffsetForLeaderEpochRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![OffsetForLeaderTopic::default()
            .with_topic(name(topic))
            .with_partitions(vec![OffsetForLeaderPartition::default()
                .with_partition(partition)
                .with_current_leader_epoch(current_leader_epoch)
                .with_leader_epoch(leader_epoch)])]);
    let resp: OffsetForLeaderEpochResponse = c.call(ApiKey::OffsetForLeaderEpoch, 4, &req).await;
    resp.topics[0].partitions[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offset_for_leader_epoch_is_answered_by_the_leader_only() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("ofle", 1, &[]).await, 0);
    for _ in 0..2 {
        let r = c
            .produce("ofle", 0, 1, batch(&["a", "b"], Compression::None, None))
            .await;
        assert_eq!(r.error_code, 0);
    }
    // The latest epoch ends at the log end; an epoch above it is unknown.
    let r = offset_for_leader_epoch(&b, "ofle", 0, -1, 0).await;
    assert_eq!((r.error_code, r.leader_epoch, r.end_offset), (0, 0, 4));
    let r = offset_for_leader_epoch(&b, "ofle", 0, 0, 7).await;
    assert_eq!((r.error_code, r.leader_epoch, r.end_offset), (0, -1, -1));
    // A caller that knows a newer leadership than ours.
    let r = offset_for_leader_epoch(&b, "ofle", 0, 1, 0).await;
    assert_eq!(r.error_code, ResponseError::UnknownLeaderEpoch.code());
    assert_eq!((r.leader_epoch, r.end_offset), (-1, -1));
    let r = offset_for_leader_epoch(&b, "nope", 0, -1, 0).await;
    assert_eq!(r.error_code, ResponseError::UnknownTopicOrPartition.code());
    let r = offset_for_leader_epoch(&b, "ofle", 3, -1, 0).await;
    assert_eq!(r.error_code, ResponseError::UnknownTopicOrPartition.code());

    // Node 2 leads "led-by-2": we host a replica but do not lead it.
    register(&b, 2).await;
    let topic_id = create_assigned(&b, "led-by-2", &[2, 1]).await;
    let r = offset_for_leader_epoch(&b, "led-by-2", 0, -1, 0).await;
    assert_eq!(r.error_code, ResponseError::NotLeaderOrFollower.code());
    // Node 2 is fenced: leadership moves here at epoch 1, and a caller
    // still at epoch 0 is fenced.
    b.running
        .broker
        .metadata
        .propose(MetadataCommand::FenceBroker { node_id: NodeId(2) })
        .await
        .unwrap();
    // The committed command reaches the image, and then the replica
    // manager, a moment later (under load, after this task asks): until this
    // node has become the leader it answers NOT_LEADER_OR_FOLLOWER, and a
    // client retries, as this loop does.
    let mut r = offset_for_leader_epoch(&b, "led-by-2", 0, 0, 0).await;
    for _ in 0..250 {
        if r.error_code != ResponseError::NotLeaderOrFollower.code() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        r = offset_for_leader_epoch(&b, "led-by-2", 0, 0, 0).await;
    }
    let image = b.running.broker.metadata.image();
    let p = &image.topic_by_id(topic_id).unwrap().partitions[0];
    assert_eq!((p.leader, p.leader_epoch), (NodeId(1), LeaderEpoch(1)));
    assert_eq!(r.error_code, ResponseError::FencedLeaderEpoch.code());
    b.running.shutdown().await;
}

/// The follower replica of the tests: one partition in its own directory,
/// fetching from the in-process broker.
struct TestEnv {
    tp: TopicPartition,
    part: PartitionRef,
    leader_addr: String,
}

impl FetcherEnv for TestEnv {
    fn partition(&self, tp: &TopicPartition) -> Option<PartitionRef> {
        (tp == &self.tp).then(|| self.part.clone())
    }
    fn leader_address(&self, leader: NodeId) -> Option<String> {
        (leader == NodeId(1)).then(|| self.leader_addr.clone())
    }
}

fn follower_partition(dir: &std::path::Path, tp: &TopicPartition, topic_id: Uuid) -> PartitionRef {
    let configs = TopicConfigs::resolve(&ServerConfig::default(), &BTreeMap::new());
    let p = Partition::open(
        dir.to_path_buf(),
        tp.clone(),
        topic_id,
        LeaderEpoch(0),
        configs,
        broker::broker::now_ms(),
    )
    .unwrap();
    Arc::new(Mutex::new(p))
}

fn fetcher(env: Arc<TestEnv>) -> ReplicaFetcherManager {
    let config = FetcherConfig {
        max_bytes: 1 << 20,
        response_max_bytes: 10 << 20,
        wait_max_ms: 100,
        min_bytes: 1,
        backoff_ms: 20,
        max_batch_bytes: 1 << 20,
        request_timeout: Duration::from_secs(10),
    };
    ReplicaFetcherManager::new(NodeId(2), config, env)
}

/// Every batch of a partition from offset 0, as stored.
fn log_bytes(p: &PartitionRef) -> Bytes {
    let p = p.lock().unwrap();
    let out = p.read(p.log_start_offset(), usize::MAX, true).unwrap();
    assert_eq!(out.high_watermark, p.log_end_offset(), "read all of it");
    out.records
}

/// Waits until the follower holds exactly the leader's log, all of it
/// committed.
async fn converge(leader: &PartitionRef, follower: &PartitionRef) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (l_end, l_hw) = {
            let l = leader.lock().unwrap();
            (l.log_end_offset(), l.high_watermark())
        };
        let (f_end, f_hw) = {
            let f = follower.lock().unwrap();
            (f.log_end_offset(), f.high_watermark())
        };
        // Everything committed (the leader's high watermark needs the
        // follower's next fetch) and known to the follower.
        if l_end == f_end && l_hw == l_end && f_hw == l_hw {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "follower at {f_end}/{f_hw}, leader at {l_end}/{l_hw}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(log_bytes(follower), log_bytes(leader));
    assert_eq!(
        follower.lock().unwrap().epoch_entries(),
        leader.lock().unwrap().epoch_entries()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetcher_copies_the_leaders_log_byte_for_byte() {
    let b = start(&[]).await;
    register(&b, 2).await;
    let topic_id = create_assigned(&b, "rep", &[1, 2]).await;
    let tp = TopicPartition::new("rep", 0);
    let mut c = Client::connect(b.running.local_addr).await;
    c.produce(
        "rep",
        0,
        1,
        batch(&["a", "b", "c"], Compression::None, None),
    )
    .await;
    c.produce(
        "rep",
        0,
        1,
        batch(&["d"], Compression::Gzip, Some((5, 0, 0))),
    )
    .await;
    let leader = b.running.broker.replicas.get(&tp).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let follower = follower_partition(dir.path(), &tp, topic_id);
    let env = Arc::new(TestEnv {
        tp: tp.clone(),
        part: follower.clone(),
        leader_addr: b.running.local_addr.to_string(),
    });
    let fetchers = fetcher(env);
    fetchers.update(vec![FollowedPartition {
        tp: tp.clone(),
        topic_id,
        leader: NodeId(1),
        leader_epoch: LeaderEpoch(0),
    }]);
    converge(&leader, &follower).await;
    // It keeps following.
    c.produce(
        "rep",
        0,
        1,
        batch(&["e", "f"], Compression::Lz4, Some((5, 0, 1))),
    )
    .await;
    converge(&leader, &follower).await;
    assert_eq!(follower.lock().unwrap().log_end_offset(), Offset(6));
    assert_eq!(fetchers.followed(), vec![(tp.clone(), NodeId(1))]);
    fetchers.update(vec![]);
    assert!(fetchers.followed().is_empty());
    fetchers.shutdown().await;
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_the_leaders_log_start_starts_over_there() {
    let b = start(&[]).await;
    register(&b, 2).await;
    let topic_id = create_assigned(&b, "oor", &[1, 2]).await;
    let tp = TopicPartition::new("oor", 0);
    let mut c = Client::connect(b.running.local_addr).await;
    for _ in 0..3 {
        c.produce("oor", 0, 1, batch(&["a", "b"], Compression::None, None))
            .await;
    }
    // A first follower commits everything (the high watermark needs it),
    // then the leader's log start moves inside the batch 2..=3.
    let leader = b.running.broker.replicas.get(&tp).unwrap();
    let first_dir = tempfile::tempdir().unwrap();
    let first = follower_partition(first_dir.path(), &tp, topic_id);
    let first_fetchers = fetcher(Arc::new(TestEnv {
        tp: tp.clone(),
        part: first.clone(),
        leader_addr: b.running.local_addr.to_string(),
    }));
    first_fetchers.update(vec![FollowedPartition {
        tp: tp.clone(),
        topic_id,
        leader: NodeId(1),
        leader_epoch: LeaderEpoch(0),
    }]);
    converge(&leader, &first).await;
    first_fetchers.shutdown().await;
    leader.lock().unwrap().delete_records_before(3).unwrap();
    // A new, empty follower is behind the leader's log start.
    let dir = tempfile::tempdir().unwrap();
    let follower = follower_partition(dir.path(), &tp, topic_id);
    let fetchers = fetcher(Arc::new(TestEnv {
        tp: tp.clone(),
        part: follower.clone(),
        leader_addr: b.running.local_addr.to_string(),
    }));
    fetchers.update(vec![FollowedPartition {
        tp: tp.clone(),
        topic_id,
        leader: NodeId(1),
        leader_epoch: LeaderEpoch(0),
    }]);
    converge(&leader, &follower).await;
    let bounds = {
        let f = follower.lock().unwrap();
        (f.log_start_offset(), f.log_end_offset())
    };
    assert_eq!(bounds, (Offset(3), Offset(6)));
    fetchers.shutdown().await;
    b.running.shutdown().await;
}

/// A client batch of `n` records rewritten to sit at `base_offset` in
/// `epoch`, as a leader of that epoch would have stored it.
fn stored_batch(tag: &str, n: usize, base_offset: i64, epoch: i32) -> Bytes {
    let values: Vec<String> = (0..n).map(|i| format!("{tag}-{i}")).collect();
    let refs: Vec<&str> = values.iter().map(|s| s.as_str()).collect();
    let mut b = BytesMut::from(&batch(&refs, Compression::None, None)[..]);
    rewrite::set_base_offset(&mut b, base_offset);
    rewrite::set_partition_leader_epoch(&mut b, epoch);
    b.freeze()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetcher_truncates_a_divergent_tail_before_fetching() {
    let b = start(&[]).await;
    register(&b, 2).await;
    let topic_id = create_assigned(&b, "div", &[1, 2]).await;
    let tp = TopicPartition::new("div", 0);
    // History: epoch 0 wrote offsets 0..5 and both replicas have them; the
    // leader of epoch 1 (this follower) wrote 5..8 that never replicated;
    // the leader of epoch 3 (our broker) wrote 5..9.
    let common = [stored_batch("x", 3, 0, 0), stored_batch("y", 2, 3, 0)];
    let leader = b.running.broker.replicas.get(&tp).unwrap();
    {
        let mut l = leader.lock().unwrap();
        for batch in common.iter().chain([&stored_batch("new", 4, 5, 3)]) {
            l.append_as_follower(batch.clone(), broker::broker::now_ms())
                .unwrap();
        }
        l.update_follower_high_watermark(Offset(9));
    }
    let dir = tempfile::tempdir().unwrap();
    let follower = follower_partition(dir.path(), &tp, topic_id);
    {
        let mut f = follower.lock().unwrap();
        for batch in common.iter().chain([&stored_batch("old", 3, 5, 1)]) {
            f.append_as_follower(batch.clone(), broker::broker::now_ms())
                .unwrap();
        }
        assert_eq!(f.latest_epoch(), Some(LeaderEpoch(1)));
    }
    let r = offset_for_leader_epoch(&b, "div", 0, 0, 1).await;
    assert_eq!((r.error_code, r.leader_epoch, r.end_offset), (0, 0, 5));
    let env = Arc::new(TestEnv {
        tp: tp.clone(),
        part: follower.clone(),
        leader_addr: b.running.local_addr.to_string(),
    });
    let fetchers = fetcher(env);
    fetchers.update(vec![FollowedPartition {
        tp: tp.clone(),
        topic_id,
        leader: NodeId(1),
        leader_epoch: LeaderEpoch(0),
    }]);
    converge(&leader, &follower).await;
    assert_eq!(
        follower.lock().unwrap().epoch_entries(),
        vec![(LeaderEpoch(0), Offset(0)), (LeaderEpoch(3), Offset(5))]
    );
    fetchers.shutdown().await;
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_converge_on_the_leaders_log() {
    let cluster =
        common::cluster::TestCluster::start(3, 43100, &[("replica.fetch.backoff.ms", "50")]).await;
    cluster
        .wait_for_images(
            "three registered, unfenced brokers",
            Duration::from_secs(15),
            |image| image.brokers.len() == 3 && image.brokers.values().all(|b| !b.fenced),
        )
        .await;
    let mut client = cluster.client(1).await;
    let mut a = create_topics_request::CreatableReplicaAssignment::default();
    a.partition_index = 0;
    a.broker_ids = vec![BrokerId(1), BrokerId(2), BrokerId(3)];
    let mut t = create_topics_request::CreatableTopic::default();
    t.name = name("conv");
    t.num_partitions = -1;
    t.replication_factor = -1;
    t.assignments = vec![a];
    let req = CreateTopicsRequest::default()
        .with_topics(vec![t])
        .with_timeout_ms(10_000);
    let resp: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &req).await;
    assert_eq!(resp.topics[0].error_code, 0);
    let tp = TopicPartition::new("conv", 0);
    cluster
        .wait_until(
            "the partition on every node",
            Duration::from_secs(15),
            |c| (1..=3).all(|id| c.broker(id).replicas.get(&tp).is_some()),
        )
        .await;
    for i in 0..5 {
        let r = client
            .produce(
                "conv",
                0,
                1,
                batch(&["p", "q"], Compression::Snappy, Some((9, 0, 2 * i))),
            )
            .await;
        assert_eq!(r.error_code, 0, "{r:?}");
    }
    let leader = cluster.broker(1).replicas.get(&tp).unwrap();
    for id in [2, 3] {
        let follower = cluster.broker(id).replicas.get(&tp).unwrap();
        converge(&leader, &follower).await;
        assert_eq!(follower.lock().unwrap().log_end_offset(), Offset(10));
    }
    cluster.shutdown().await;
}

/// Produces until the partition's current leader accepts (a new leader
/// takes its role when its image arrives).
async fn produce_when_led(
    cluster: &common::cluster::TestCluster,
    node: i32,
    acks: i16,
    records: Bytes,
) -> produce_response::PartitionProduceResponse {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let mut c = cluster.client(node).await;
        let r = c.produce("fail", 0, acks, records.clone()).await;
        if r.error_code == 0 || tokio::time::Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_leader_change_the_old_leader_truncates_and_the_logs_converge() {
    let mut cluster =
        common::cluster::TestCluster::start(3, 43200, &[("replica.fetch.backoff.ms", "50")]).await;
    cluster
        .wait_for_images("three unfenced brokers", Duration::from_secs(15), |image| {
            image.brokers.len() == 3 && image.brokers.values().all(|b| !b.fenced)
        })
        .await;
    let mut client = cluster.client(1).await;
    let mut a = create_topics_request::CreatableReplicaAssignment::default();
    a.partition_index = 0;
    a.broker_ids = vec![BrokerId(1), BrokerId(2), BrokerId(3)];
    let mut t = create_topics_request::CreatableTopic::default();
    t.name = name("fail");
    t.num_partitions = -1;
    t.replication_factor = -1;
    t.assignments = vec![a];
    let req = CreateTopicsRequest::default()
        .with_topics(vec![t])
        .with_timeout_ms(10_000);
    let resp: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &req).await;
    assert_eq!(resp.topics[0].error_code, 0);
    let tp = TopicPartition::new("fail", 0);
    // Producer 9's sequences 0..6 in three committed batches at epoch 0.
    let idem = |seq: i32| batch(&["a", "b"], Compression::None, Some((9, 0, seq)));
    for seq in [0, 2, 4] {
        let r = produce_when_led(&cluster, 1, -1, idem(seq)).await;
        assert_eq!(r.error_code, 0, "{r:?}");
    }
    // The followers stop fetching (until their next image); the leader
    // appends a batch only it has.
    for id in [2, 3] {
        cluster.broker(id).fetchers.shutdown().await;
    }
    let lost = produce_when_led(&cluster, 1, 1, idem(6)).await;
    assert_eq!((lost.error_code, lost.base_offset), (0, 6));
    // Node 1 goes; node 2 leads at epoch 1 and the retry of the committed
    // batch with sequence 4 is a duplicate there too.
    cluster.stop(1).await;
    cluster
        .wait_for_images("node 2 leads", Duration::from_secs(15), |image| {
            let p = &image.topics["fail"].partitions[0];
            p.leader == NodeId(2) && p.leader_epoch == LeaderEpoch(1)
        })
        .await;
    let retry = produce_when_led(&cluster, 2, 1, idem(4)).await;
    assert_eq!((retry.error_code, retry.base_offset), (0, 4), "{retry:?}");
    // Node 1's lost batch had sequence 6; the new leader never saw it, so
    // the producer's 6 is new here.
    let new = produce_when_led(&cluster, 2, 1, idem(6)).await;
    assert_eq!((new.error_code, new.base_offset), (0, 6), "{new:?}");
    let extra = produce_when_led(&cluster, 2, 1, idem(8)).await;
    assert_eq!((extra.error_code, extra.base_offset), (0, 8), "{extra:?}");
    // Node 1 comes back as a follower with a divergent batch at epoch 0
    // from offset 6: it truncates it and copies the leader's.
    cluster.restart(1).await;
    let leader = cluster.broker(2).replicas.get(&tp).unwrap();
    cluster
        .wait_until(
            "the partition open on node 1",
            Duration::from_secs(15),
            |c| c.broker(1).replicas.get(&tp).is_some(),
        )
        .await;
    for id in [1, 3] {
        let follower = cluster.broker(id).replicas.get(&tp).unwrap();
        converge(&leader, &follower).await;
        assert_eq!(
            follower.lock().unwrap().epoch_entries(),
            vec![(LeaderEpoch(0), Offset(0)), (LeaderEpoch(1), Offset(6))]
        );
    }
    cluster.shutdown().await;
}
