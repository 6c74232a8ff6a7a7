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
    let t = client.create_assigned(name, &[replicas], configs).await;
    assert_eq!(t.error_code, 0, "{t:?}");
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

/// FindCoordinator for `group` asked of node `via`: (error, coordinator id).
async fn find_coordinator(cluster: &TestCluster, via: i32, group: &str) -> (i16, i32) {
    let mut c = cluster.client(via).await;
    let req = FindCoordinatorRequest::default()
        .with_key_type(0)
        .with_coordinator_keys(vec![StrBytes::from_string(group.into())]);
    let resp: FindCoordinatorResponse = c.call(ApiKey::FindCoordinator, 4, &req).await;
    let k = &resp.coordinators[0];
    (k.error_code, k.node_id.0)
}

/// A simple (generation -1) OffsetCommit of `offset` for t-0; its error code.
async fn commit(cluster: &TestCluster, id: i32, group: &str, offset: i64) -> i16 {
    let mut c = cluster.client(id).await;
    let p = offset_commit_request::OffsetCommitRequestPartition::default()
        .with_partition_index(0)
        .with_committed_offset(offset);
    let t = offset_commit_request::OffsetCommitRequestTopic::default()
        .with_name(TopicName(StrBytes::from_static_str("t")))
        .with_partitions(vec![p]);
    let req = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.into())))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![t]);
    let resp: OffsetCommitResponse = c.call(ApiKey::OffsetCommit, 8, &req).await;
    resp.topics[0].partitions[0].error_code
}

/// OffsetFetch v8 of t-0 for `group` at node `id`: (group error, offset).
async fn fetch_committed(cluster: &TestCluster, id: i32, group: &str) -> (i16, i64) {
    let mut c = cluster.client(id).await;
    let t = offset_fetch_request::OffsetFetchRequestTopics::default()
        .with_name(TopicName(StrBytes::from_static_str("t")))
        .with_partition_indexes(vec![0]);
    let g = offset_fetch_request::OffsetFetchRequestGroup::default()
        .with_group_id(GroupId(StrBytes::from_string(group.into())))
        .with_topics(Some(vec![t]));
    let req = OffsetFetchRequest::default().with_groups(vec![g]);
    let resp: OffsetFetchResponse = c.call(ApiKey::OffsetFetch, 8, &req).await;
    let g = &resp.groups[0];
    let offset = g
        .topics
        .first()
        .map_or(-1, |t| t.partitions[0].committed_offset);
    (g.error_code, offset)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_acked_offset_commit_survives_the_coordinators_loss_and_is_refused_without_enough_replicas(
) {
    let mut cluster = TestCluster::start(
        3,
        42110,
        &[
            ("offsets.topic.num.partitions", "1"),
            ("offsets.topic.replication.factor", "3"),
            ("min.insync.replicas", "2"),
            ("replica.fetch.wait.max.ms", "100"),
            ("offsets.commit.timeout.ms", "2000"),
        ],
    )
    .await;
    cluster
        .wait_for_images("all three registered and unfenced", WAIT, |img| {
            img.brokers.len() == 3 && img.brokers.values().all(|b| !b.fenced)
        })
        .await;
    let mut c = cluster.client(1).await;
    create_on(&mut c, "t", &[1, 2, 3], &[]).await;
    // The first lookup creates __consumer_offsets (RF 3); until its leader
    // has loaded the partition the answer is retriable.
    let group = "survivor";
    let mut coordinator = -1;
    let mut last = (0, 0, 0);
    for _ in 0..100 {
        let (code, id) = find_coordinator(&cluster, 1, group).await;
        last = (code, id, 0);
        if code == 0 {
            let committed = commit(&cluster, id, group, 42).await;
            last.2 = committed;
            if committed == 0 {
                coordinator = id;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        coordinator > 0,
        "no coordinator accepted the commit: (find error, id, commit error) {last:?}"
    );
    // Acked means on every in-sync replica: all three logs have it now.
    let tp = TopicPartition::new("__consumer_offsets", 0);
    let leader_log = log_bytes(&cluster, coordinator, &tp).unwrap();
    for id in 1..=3 {
        assert_eq!(
            log_bytes(&cluster, id, &tp).unwrap(),
            leader_log,
            "node {id}"
        );
    }

    // The coordinator stops (controlled: its leaderships move first); an
    // in-sync follower leads the partition and serves the committed offset.
    cluster.stop(coordinator).await;
    let other = (1..=3).find(|&id| id != coordinator).unwrap();
    let mut next = -1;
    let mut last = (0, 0, (0, 0));
    for _ in 0..100 {
        let (code, id) = find_coordinator(&cluster, other, group).await;
        last = (code, id, (0, 0));
        if code == 0 && id != coordinator {
            last.2 = fetch_committed(&cluster, id, group).await;
            if last.2 == (0, 42) {
                next = id;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        next > 0,
        "the committed offset did not survive the failover: (find error, id, fetched) {last:?}"
    );

    // One more node down: the coordinator is alone, below
    // min.insync.replicas, and must not ack a commit it cannot replicate.
    let last_follower = (1..=3).find(|&id| id != coordinator && id != next).unwrap();
    cluster.stop(last_follower).await;
    let code = commit(&cluster, next, group, 43).await;
    assert_eq!(code, 15, "COORDINATOR_NOT_AVAILABLE, not an ack");
    assert!(fetch_committed(&cluster, next, group).await.1 >= 42);
    cluster.shutdown().await;
}
