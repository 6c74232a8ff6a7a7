//! The leader side of replication on a real three-node cluster (in-process,
//! `common::cluster`): acks=all produce completes once the followers' fetchers
//! have the batch, the three logs end byte-identical, a stopped follower is
//! dropped from the ISR by the leader's lag check (before the controller's
//! session timeout would fence it), and it rejoins after catching up.

mod common;

use std::time::Duration;

use broker::partition::FetchLimit;
use broker::types::{NodeId, Offset, TopicPartition};
use bytes::Bytes;
use common::cluster::TestCluster;
use common::{batch, Client};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;

const WAIT: Duration = Duration::from_secs(20);

async fn create_on(client: &mut Client, name: &str, replicas: &[i32], configs: &[(&str, &str)]) {
    let mut t = create_topics_request::CreatableTopic::default();
    t.name = TopicName(StrBytes::from_string(name.into()));
    t.num_partitions = -1;
    t.replication_factor = -1;
    let mut a = create_topics_request::CreatableReplicaAssignment::default();
    a.partition_index = 0;
    a.broker_ids = replicas.iter().map(|&b| BrokerId(b)).collect();
    t.assignments = vec![a];
    t.configs = configs
        .iter()
        .map(|(k, v)| {
            let mut c = create_topics_request::CreatableTopicConfig::default();
            c.name = StrBytes::from_string(k.to_string());
            c.value = Some(StrBytes::from_string(v.to_string()));
            c
        })
        .collect();
    let mut req = CreateTopicsRequest::default();
    req.topics = vec![t];
    req.timeout_ms = 10_000;
    let resp: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &req).await;
    assert_eq!(resp.topics[0].error_code, 0, "{:?}", resp.topics[0]);
}

/// Every byte of node `id`'s replica of `tp`, up to its log end.
fn log_bytes(cluster: &TestCluster, id: i32, tp: &TopicPartition) -> Option<Bytes> {
    let part = cluster.broker(id).replicas.get(tp)?;
    let p = part.lock().unwrap();
    Some(
        p.read_up_to(Offset(0), 64 << 20, true, FetchLimit::LogEnd)
            .ok()?
            .records,
    )
}

fn isr(cluster: &TestCluster, id: i32, topic: &str) -> Vec<i32> {
    cluster.image(id).topics[topic].partitions[0]
        .isr
        .iter()
        .map(|n| n.0)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acks_all_replicates_to_three_identical_logs_and_a_stopped_follower_leaves_then_rejoins_the_isr(
) {
    let mut cluster = TestCluster::start(
        3,
        42100,
        &[
            ("replica.lag.time.max.ms", "1000"),
            ("replica.fetch.wait.max.ms", "100"),
            // Slow fencing, so the shrink below is the leader's own doing.
            ("broker.session.timeout.ms", "30000"),
            ("controlled.shutdown.enable", "false"),
        ],
    )
    .await;
    cluster
        .wait_for_images("all three registered and unfenced", WAIT, |img| {
            img.brokers.len() == 3 && img.brokers.values().all(|b| !b.fenced)
        })
        .await;
    let tp = TopicPartition::new("rep", 0);
    let mut c = cluster.client(1).await;
    create_on(&mut c, "rep", &[1, 2, 3], &[("min.insync.replicas", "2")]).await;
    cluster
        .wait_until("every node hosts the partition", WAIT, |cl| {
            (1..=3).all(|id| cl.broker(id).replicas.get(&tp).is_some())
        })
        .await;
    assert_eq!(
        cluster.image(1).topics["rep"].partitions[0].leader,
        NodeId(1)
    );

    for i in 0..20 {
        let v = format!("v{i}");
        let r = c
            .produce("rep", 0, -1, batch(&[&v, "x"], Compression::None, None))
            .await;
        assert_eq!(r.error_code, 0, "batch {i}");
        assert_eq!(r.base_offset, 2 * i as i64);
    }
    // acks=all answered only once the ISR had everything: the leader's HW.
    let hw = {
        let part = cluster.broker(1).replicas.get(&tp).unwrap();
        let hw = part.lock().unwrap().high_watermark();
        hw
    };
    assert_eq!(hw, Offset(40));
    cluster
        .wait_until("the three logs are identical", WAIT, |cl| {
            let leader = log_bytes(cl, 1, &tp);
            leader.as_ref().is_some_and(|b| !b.is_empty())
                && log_bytes(cl, 2, &tp) == leader
                && log_bytes(cl, 3, &tp) == leader
        })
        .await;
    assert_eq!(isr(&cluster, 1, "rep"), vec![1, 2, 3]);

    // Node 3 stops without telling anyone. While the partition is idle it
    // still counts as caught up (its log end equals the leader's, Kafka's
    // rule); the next append leaves it behind, and the leader drops it after
    // the lag (1 s), long before the 30 s session timeout would fence it.
    // The acks=all produce waits for that shrink, then two in sync satisfy
    // min.insync.replicas=2.
    cluster.stop(3).await;
    let r = c
        .produce("rep", 0, -1, batch(&["after"], Compression::None, None))
        .await;
    assert_eq!(r.error_code, 0);
    assert_eq!(r.base_offset, 40);
    cluster
        .wait_until("the image shows the shrink", WAIT, |cl| {
            isr(cl, 1, "rep") == vec![1, 2]
        })
        .await;
    assert!(
        !cluster.image(1).brokers[&NodeId(3)].fenced,
        "the shrink came from the leader, not from fencing"
    );

    // It comes back, catches up, and is added again.
    cluster.restart(3).await;
    cluster
        .wait_until("node 3 rejoins the ISR", WAIT, |cl| {
            isr(cl, 1, "rep") == vec![1, 2, 3]
        })
        .await;
    cluster
        .wait_until("node 3 has the leader's log", WAIT, |cl| {
            log_bytes(cl, 3, &tp) == log_bytes(cl, 1, &tp)
        })
        .await;
    cluster.shutdown().await;
}
