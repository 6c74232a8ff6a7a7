//! Three brokers in one process, in combined mode: one metadata quorum,
//! forwarded writes, controller failover, fencing by session timeout and by
//! controlled shutdown, and unclean leader election.

mod common;

use std::time::Duration;

use broker::metadata::{MetadataCommand, NO_LEADER};
use broker::types::NodeId;
use common::cluster::TestCluster;
use common::Client;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

const WAIT: Duration = Duration::from_secs(15);

fn creatable(name: &str) -> create_topics_request::CreatableTopic {
    let mut t = create_topics_request::CreatableTopic::default();
    t.name = TopicName(StrBytes::from_string(name.into()));
    t
}

async fn create_topics(
    client: &mut Client,
    topic: create_topics_request::CreatableTopic,
) -> (i16, Option<String>) {
    let mut req = CreateTopicsRequest::default();
    req.topics = vec![topic];
    req.timeout_ms = 10_000;
    let resp: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &req).await;
    let t = &resp.topics[0];
    (
        t.error_code,
        t.error_message.as_ref().map(|m| m.to_string()),
    )
}

async fn create(client: &mut Client, name: &str, partitions: i32, rf: i16) -> i16 {
    let mut t = creatable(name);
    t.num_partitions = partitions;
    t.replication_factor = rf;
    create_topics(client, t).await.0
}

async fn create_with(
    client: &mut Client,
    name: &str,
    assignment: &[i32],
    configs: &[(&str, &str)],
) -> i16 {
    client
        .create_assigned(name, &[assignment], configs)
        .await
        .error_code
}

/// A node other than the Raft leader.
fn follower(cluster: &TestCluster) -> i32 {
    let leader = cluster.leader().expect("a leader");
    *cluster
        .running_ids()
        .iter()
        .find(|&&id| id != leader)
        .expect("a follower")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_share_one_image_and_forward_writes() {
    let cluster = TestCluster::start(3, 41000, &[]).await;

    cluster
        .wait_for_images("three registered, unfenced brokers", WAIT, |image| {
            image.brokers.len() == 3 && image.brokers.values().all(|b| !b.fenced)
        })
        .await;
    let cluster_id = cluster.image(1).cluster_id.clone();
    assert_eq!(cluster_id.len(), 22);
    for id in 1..=3 {
        assert_eq!(cluster.image(id).cluster_id, cluster_id);
        let b = &cluster.image(id).brokers[&NodeId(2)];
        assert_eq!((b.host.as_str(), b.port), ("127.0.0.3", 41002));
    }
    cluster
        .wait_until("one leader all nodes agree on", WAIT, |c| {
            c.leader().is_some()
        })
        .await;

    // CreateTopics on a follower: its proposal is forwarded to the leader.
    let f = follower(&cluster);
    let mut client = cluster.client(f).await;
    assert_eq!(create(&mut client, "replicated", 3, 3).await, 0);
    cluster
        .wait_for_images("the topic on every node", WAIT, |image| {
            image.topics.get("replicated").is_some_and(|t| {
                t.partitions.len() == 3 && t.partitions.iter().all(|p| p.replicas.len() == 3)
            })
        })
        .await;
    let topic_id = cluster.image(1).topics["replicated"].topic_id;
    for id in 1..=3 {
        assert_eq!(cluster.image(id).topics["replicated"].topic_id, topic_id);
    }
    // Creating it again on another node is refused by the one image.
    let mut other = cluster.client(cluster.leader().unwrap()).await;
    assert_eq!(
        create(&mut other, "replicated", 3, 3).await,
        ResponseError::TopicAlreadyExists.code()
    );
    // More replicas than brokers.
    let (code, message) = {
        let mut t = creatable("too-wide");
        t.num_partitions = 1;
        t.replication_factor = 4;
        create_topics(&mut client, t).await
    };
    assert_eq!(
        code,
        ResponseError::InvalidReplicationFactor.code(),
        "{message:?}"
    );
    assert!(!cluster.image(f).topics.contains_key("too-wide"));

    // DescribeQuorum asked of a follower answers with the leader's view:
    // every voter's log end is known, and the controller ids agree.
    let leader = cluster.leader().unwrap();
    let mut fc = cluster.client(f).await;
    let req = DescribeQuorumRequest::default().with_topics(vec![
        describe_quorum_request::TopicData::default()
            .with_topic_name(TopicName(StrBytes::from_static_str("__cluster_metadata")))
            .with_partitions(vec![describe_quorum_request::PartitionData::default()]),
    ]);
    let resp: DescribeQuorumResponse = fc.call(ApiKey::DescribeQuorum, 2, &req).await;
    let p = &resp.topics[0].partitions[0];
    assert_eq!((p.error_code, p.leader_id.0), (0, leader));
    assert!(p.high_watermark > 0);
    let mut voters: Vec<i32> = p.current_voters.iter().map(|v| v.replica_id.0).collect();
    voters.sort_unstable();
    assert_eq!(voters, vec![1, 2, 3]);
    assert!(
        p.current_voters.iter().all(|v| v.log_end_offset > 0),
        "{:?}",
        p.current_voters
    );
    assert_eq!(resp.nodes.len(), 3);
    let req = DescribeClusterRequest::default().with_endpoint_type(1);
    let dc: DescribeClusterResponse = fc.call(ApiKey::DescribeCluster, 1, &req).await;
    assert_eq!(dc.controller_id.0, leader);

    // A broker fenced while alive is told so by its next heartbeat and
    // registers again.
    cluster
        .broker(1)
        .metadata
        .propose(MetadataCommand::FenceBroker { node_id: NodeId(3) })
        .await
        .unwrap();
    // No assertion that node 1's image shows the fence: broker 3 heartbeats
    // every 100 ms, so by the time node 1 has applied the fence it may have
    // applied 3's new registration too (CI saw exactly that). The applied
    // proposal above is the fence; what follows is the recovery.
    cluster
        .wait_for_images("broker 3 unfenced by its heartbeats", WAIT, |image| {
            !image.brokers[&NodeId(3)].fenced
        })
        .await;

    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stopping_the_leader_elects_another_and_writes_continue() {
    // A long session timeout: only the controlled shutdown can fence the
    // stopped node within this test's waits.
    let mut cluster = TestCluster::start(
        3,
        41010,
        &[
            ("broker.session.timeout.ms", "60000"),
            ("broker.heartbeat.interval.ms", "200"),
        ],
    )
    .await;
    cluster
        .wait_until("a leader", WAIT, |c| c.leader().is_some())
        .await;
    let old = cluster.leader().unwrap();
    let mut client = cluster.client(old).await;
    assert_eq!(create(&mut client, "before", 1, 3).await, 0);
    drop(client);

    cluster.stop(old).await;
    let survivor = cluster.running_ids()[0];
    // Controlled shutdown fenced it before it stopped.
    cluster
        .wait_for_images(
            "the stopped leader fenced",
            Duration::from_secs(5),
            |image| {
                image.brokers[&NodeId(old)].fenced
                    && image.topics["before"]
                        .partitions
                        .iter()
                        .all(|p| p.leader != NodeId(old) && !p.isr.contains(&NodeId(old)))
            },
        )
        .await;
    cluster
        .wait_until("a new leader", WAIT, |c| {
            c.leader().is_some_and(|l| l != old)
        })
        .await;

    // A metadata change succeeds through either survivor within a bound.
    let started = std::time::Instant::now();
    let mut client = cluster.client(survivor).await;
    let mut code = create(&mut client, "after", 1, 2).await;
    while code == ResponseError::NotController.code() && started.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(100)).await;
        code = create(&mut client, "after", 1, 2).await;
    }
    assert_eq!(code, 0);
    cluster
        .wait_for_images("the new topic on both survivors", WAIT, |image| {
            image.topics.contains_key("after")
        })
        .await;

    // The old leader comes back as a follower and catches up.
    cluster.restart(old).await;
    assert!(cluster.image(old).topics.contains_key("after"));
    cluster
        .wait_for_images("the restarted node unfenced", WAIT, |image| {
            !image.brokers[&NodeId(old)].fenced
        })
        .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_broker_is_fenced_and_unclean_election_follows_topic_config() {
    // Node 3 stops without a controlled shutdown, as if it crashed.
    let mut cluster = TestCluster::start_with(3, 41020, &[], |id| {
        if id == 3 {
            vec![("controlled.shutdown.enable".into(), "false".into())]
        } else {
            Vec::new()
        }
    })
    .await;
    cluster
        .wait_until("a leader", WAIT, |c| c.leader().is_some())
        .await;
    let mut client = cluster.client(1).await;
    // Led by 3, followed by 1 and 2.
    assert_eq!(
        create_with(&mut client, "led-by-3", &[3, 1, 2], &[]).await,
        0
    );
    // Replicas 3 and 2; the ISR is narrowed to 3 below, so losing 3 leaves
    // only an out-of-sync replica. One topic allows electing it, one does not.
    assert_eq!(
        create_with(
            &mut client,
            "unclean-ok",
            &[3, 2],
            &[("unclean.leader.election.enable", "true")]
        )
        .await,
        0
    );
    assert_eq!(
        create_with(&mut client, "clean-only", &[3, 2], &[]).await,
        0
    );
    for name in ["unclean-ok", "clean-only"] {
        let image = cluster.image(1);
        let t = &image.topics[name];
        let p = &t.partitions[0];
        assert_eq!(p.leader, NodeId(3));
        cluster
            .broker(1)
            .metadata
            .propose(MetadataCommand::AlterPartition {
                topic_id: t.topic_id,
                partition: 0,
                leader: p.leader,
                leader_epoch: p.leader_epoch,
                partition_epoch: p.partition_epoch,
                isr: vec![NodeId(3)],
            })
            .await
            .unwrap();
    }

    cluster.stop(3).await;
    cluster
        .wait_for_images("broker 3 fenced after its session timeout", WAIT, |image| {
            image.brokers[&NodeId(3)].fenced
        })
        .await;
    // Either survivor may lead "led-by-3": the controller takes the first
    // live in-sync replica (1), but if 1 misses its own session timeout
    // meanwhile (a loaded machine: the timeout here is 1.5 s) the choice is
    // 2, and leadership does not move back by itself.
    cluster
        .wait_for_images("leaderships moved off broker 3", WAIT, |image| {
            let led = &image.topics["led-by-3"].partitions[0];
            let unclean = &image.topics["unclean-ok"].partitions[0];
            [NodeId(1), NodeId(2)].contains(&led.leader)
                && !led.isr.contains(&NodeId(3))
                && unclean.leader == NodeId(2)
                && unclean.isr == vec![NodeId(2)]
        })
        .await;
    // Without the topic's permission the partition waits for its last in-sync replica.
    let clean = cluster.image(1).topics["clean-only"].partitions[0].clone();
    assert_eq!(clean.leader, NO_LEADER);
    assert_eq!(clean.isr, vec![NodeId(3)]);

    // Back again: registering unfences it, and it takes back the partition
    // only it could lead.
    cluster.restart(3).await;
    cluster
        .wait_for_images("broker 3 unfenced and leading clean-only", WAIT, |image| {
            !image.brokers[&NodeId(3)].fenced
                && image.topics["clean-only"].partitions[0].leader == NodeId(3)
        })
        .await;
    cluster.shutdown().await;
}
