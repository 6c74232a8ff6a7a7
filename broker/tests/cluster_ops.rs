//! Cluster operations on a three-node cluster (in-process,
//! `common::cluster`): ElectLeaders moves leadership back to the preferred
//! replica after a restart, with Kafka's per-partition answers; the active
//! controller does it unasked with `auto.leader.rebalance.enable`; and
//! DescribeLogDirs reports where each replica lives and how big it is.

mod common;

use std::time::Duration;

use broker::metadata::{BrokerRegistration, MetadataCommand};
use broker::types::NodeId;
use common::cluster::TestCluster;
use common::{batch, Client};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;
use kafka_protocol::ResponseError;

const WAIT: Duration = Duration::from_secs(20);

/// `name` with partitions 0, 1, 2 preferring nodes 1, 2, 3, each led by
/// its preferred replica once created.
async fn create_rotated(cluster: &TestCluster, client: &mut Client, name: &str) {
    let t = client
        .create_assigned(name, &[&[1, 2, 3], &[2, 3, 1], &[3, 1, 2]], &[])
        .await;
    assert_eq!(t.error_code, 0, "{t:?}");
    cluster
        .wait_for_images(
            "every partition led by its preferred replica",
            WAIT,
            |image| {
                image.topics[name]
                    .partitions
                    .iter()
                    .all(|p| p.leader == p.replicas[0] && p.isr.len() == 3)
            },
        )
        .await;
}

async fn elect(
    client: &mut Client,
    election_type: i8,
    partitions: Option<&[(&str, i32)]>,
) -> ElectLeadersResponse {
    let mut req = ElectLeadersRequest::default();
    req.election_type = election_type;
    req.timeout_ms = 10_000;
    req.topic_partitions = partitions.map(|ps| {
        ps.iter()
            .map(|(topic, p)| {
                let mut tp = elect_leaders_request::TopicPartitions::default();
                tp.topic = TopicName(StrBytes::from_string(topic.to_string()));
                tp.partitions = vec![*p];
                tp
            })
            .collect()
    });
    client.call(ApiKey::ElectLeaders, 2, &req).await
}

/// (topic, partition) -> error code of an ElectLeaders answer.
fn codes(resp: &ElectLeadersResponse) -> Vec<(String, i32, i16)> {
    let mut out: Vec<(String, i32, i16)> = resp
        .replica_election_results
        .iter()
        .flat_map(|t| {
            t.partition_result
                .iter()
                .map(|p| (t.topic.0.to_string(), p.partition_id, p.error_code))
        })
        .collect();
    out.sort();
    out
}

/// Produces `values` to `topic`-`partition` through `client`, retrying while
/// the node has not opened the replica the image gives it yet.
async fn produce_ok(client: &mut Client, topic: &str, partition: i32, values: &[&str]) -> i64 {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let r = client
            .produce(topic, partition, -1, batch(values, Compression::None, None))
            .await;
        let opening = r.error_code == ResponseError::UnknownTopicOrPartition.code()
            || r.error_code == ResponseError::NotLeaderOrFollower.code();
        if !opening || std::time::Instant::now() > deadline {
            assert_eq!(r.error_code, 0, "{r:?}");
            return r.base_offset;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn leader(cluster: &TestCluster, from: i32, topic: &str, partition: usize) -> NodeId {
    cluster.image(from).topics[topic].partitions[partition].leader
}

/// Stops node 1 (a controlled shutdown moves its leadership away) and starts
/// it again, until it is back in the ISR of partition 0, which it prefers.
async fn bounce_node_1(cluster: &mut TestCluster, topic: &str) {
    cluster.stop(1).await;
    cluster
        .wait_for_images("partition 0 led by another node", WAIT, |image| {
            let p = &image.topics[topic].partitions[0];
            p.leader != NodeId(1) && p.leader.0 > 0
        })
        .await;
    cluster.restart(1).await;
    cluster
        .wait_for_images("node 1 unfenced and in sync again", WAIT, |image| {
            !image.brokers[&NodeId(1)].fenced
                && image.topics[topic].partitions[0].isr.contains(&NodeId(1))
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn preferred_election_moves_leadership_back_with_kafkas_answers() {
    let mut cluster = TestCluster::start(
        3,
        46600,
        &[
            ("auto.leader.rebalance.enable", "false"),
            ("broker.session.timeout.ms", "60000"),
        ],
    )
    .await;
    let mut client = cluster.client(2).await;
    create_rotated(&cluster, &mut client, "t").await;
    // Nothing needs electing: asked for every partition, the answer is empty.
    let all = elect(&mut client, 0, None).await;
    assert_eq!(all.error_code, 0);
    assert!(codes(&all).is_empty(), "{all:?}");

    // Acked records before the move, on node 1, partition 0's leader.
    let mut on_1 = cluster.client(1).await;
    produce_ok(&mut on_1, "t", 0, &["a", "b"]).await;
    drop(on_1);
    drop(client);
    bounce_node_1(&mut cluster, "t").await;
    let mut client = cluster.client(2).await;
    let moved = leader(&cluster, 2, "t", 0);
    assert_ne!(moved, NodeId(1));
    let epoch = cluster.image(2).topics["t"].partitions[0].leader_epoch;

    let resp = elect(&mut client, 0, Some(&[("t", 0), ("t", 1), ("nope", 0)])).await;
    assert_eq!(
        codes(&resp),
        vec![
            (
                "nope".into(),
                0,
                ResponseError::UnknownTopicOrPartition.code()
            ),
            ("t".into(), 0, 0),
            ("t".into(), 1, ResponseError::ElectionNotNeeded.code()),
        ]
    );
    cluster
        .wait_for_images(
            "partition 0 led by node 1 again, at a new epoch",
            WAIT,
            |image| {
                let p = &image.topics["t"].partitions[0];
                p.leader == NodeId(1) && p.leader_epoch.0 > epoch.0 && p.isr.len() == 3
            },
        )
        .await;
    // The acked records are there on the preferred leader, and it takes more.
    let mut on_1 = cluster.client(1).await;
    assert_eq!(produce_ok(&mut on_1, "t", 0, &["c"]).await, 2);
    let fetched = on_1.fetch("t", 0, 0, 100).await;
    assert_eq!(
        common::values(&fetched.records)
            .into_iter()
            .map(|(_, v)| v)
            .collect::<Vec<_>>(),
        vec!["a", "b", "c"]
    );

    // UNCLEAN is for leaderless partitions only.
    let resp = elect(&mut client, 1, Some(&[("t", 0)])).await;
    assert_eq!(
        codes(&resp),
        vec![("t".into(), 0, ResponseError::ElectionNotNeeded.code())]
    );
    // A preferred replica that is down cannot lead.
    drop(client);
    cluster.stop(3).await;
    cluster
        .wait_for_images("partition 2 led by another node", WAIT, |image| {
            let p = &image.topics["t"].partitions[2];
            p.leader != NodeId(3) && p.leader.0 > 0
        })
        .await;
    let mut client = cluster.client(2).await;
    let resp = elect(&mut client, 0, Some(&[("t", 2)])).await;
    assert_eq!(
        codes(&resp),
        vec![(
            "t".into(),
            2,
            ResponseError::PreferredLeaderNotAvailable.code()
        )]
    );
    // An unknown election type is refused, not guessed at.
    let resp = elect(&mut client, 7, Some(&[("t", 0)])).await;
    assert_eq!(
        codes(&resp),
        vec![("t".into(), 0, ResponseError::InvalidRequest.code())]
    );
    // A broker registered by a version that cannot apply the newer commands
    // (no `features`): neither a preferred election nor a dynamic broker
    // config is proposed until it is upgraded.
    cluster
        .broker(2)
        .metadata
        .propose(MetadataCommand::RegisterBroker(BrokerRegistration {
            node_id: NodeId(9),
            host: "127.0.0.9".into(),
            port: 1,
            listeners: Vec::new(),
            rack: None,
            fenced: false,
            features: Vec::new(),
        }))
        .await
        .unwrap();
    let resp = elect(&mut client, 0, Some(&[("t", 1)])).await;
    assert_eq!(
        codes(&resp),
        vec![("t".into(), 1, ResponseError::InvalidRequest.code())]
    );
    let (code, message) =
        alter_broker(&mut client, "", &[("log.retention.ms", SET, Some("1000"))]).await;
    assert_eq!(code, ResponseError::InvalidRequest.code(), "{message:?}");
    assert!(cluster.image(2).broker_configs.is_empty());
    drop(client);
    drop(on_1);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_controller_moves_leadership_back_by_itself() {
    let mut cluster = TestCluster::start(
        3,
        46620,
        &[
            ("auto.leader.rebalance.enable", "true"),
            ("leader.imbalance.check.interval.seconds", "1"),
            ("broker.session.timeout.ms", "60000"),
        ],
    )
    .await;
    let mut client = cluster.client(2).await;
    create_rotated(&cluster, &mut client, "t").await;
    drop(client);
    bounce_node_1(&mut cluster, "t").await;
    cluster
        .wait_for_images("partition 0 led by node 1 again, unasked", WAIT, |image| {
            image.topics["t"].partitions[0].leader == NodeId(1)
        })
        .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn describe_log_dirs_lists_each_replica_with_its_size() {
    let cluster = TestCluster::start(3, 46640, &[]).await;
    let mut client = cluster.client(1).await;
    create_rotated(&cluster, &mut client, "t").await;
    produce_ok(&mut client, "t", 0, &["a", "b", "c"]).await;

    let resp: DescribeLogDirsResponse = client
        .call(
            ApiKey::DescribeLogDirs,
            4,
            &DescribeLogDirsRequest::default().with_topics(None),
        )
        .await;
    assert_eq!(resp.error_code, 0);
    assert_eq!(resp.results.len(), 1, "{resp:?}");
    let dir = &resp.results[0];
    assert_eq!(dir.error_code, 0);
    assert!(
        std::path::Path::new(dir.log_dir.as_str()).is_absolute(),
        "{}",
        dir.log_dir.as_str()
    );
    assert!(dir.total_bytes > 0 && dir.usable_bytes > 0 && dir.usable_bytes <= dir.total_bytes);
    let t = dir
        .topics
        .iter()
        .find(|t| t.name.0.as_str() == "t")
        .expect("topic t listed");
    let parts: Vec<(i32, bool)> = t
        .partitions
        .iter()
        .map(|p| (p.partition_index, p.partition_size > 0))
        .collect();
    // Node 1 holds a replica of every partition; only partition 0 has data.
    assert_eq!(parts, vec![(0, true), (1, false), (2, false)]);
    assert!(t
        .partitions
        .iter()
        .all(|p| p.offset_lag == 0 && !p.is_future_key));

    // Asked for one replica (and one this node does not have), v1.
    let mut want = describe_log_dirs_request::DescribableLogDirTopic::default();
    want.topic = TopicName(StrBytes::from_static_str("t"));
    want.partitions = vec![0, 9];
    let resp: DescribeLogDirsResponse = client
        .call(
            ApiKey::DescribeLogDirs,
            1,
            &DescribeLogDirsRequest::default().with_topics(Some(vec![want])),
        )
        .await;
    let listed: Vec<(String, i32)> = resp.results[0]
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.name.0.to_string(), p.partition_index))
        })
        .collect();
    assert_eq!(listed, vec![("t".to_string(), 0)]);
    drop(client);
    cluster.shutdown().await;
}

async fn alter_broker(
    client: &mut Client,
    resource: &str,
    ops: &[(&str, i8, Option<&str>)],
) -> (i16, Option<String>) {
    let mut r = incremental_alter_configs_request::AlterConfigsResource::default();
    r.resource_type = 4;
    r.resource_name = StrBytes::from_string(resource.into());
    r.configs = ops
        .iter()
        .map(|(k, op, v)| {
            let mut c = incremental_alter_configs_request::AlterableConfig::default();
            c.name = StrBytes::from_string(k.to_string());
            c.config_operation = *op;
            c.value = v.map(|v| StrBytes::from_string(v.into()));
            c
        })
        .collect();
    let mut req = IncrementalAlterConfigsRequest::default();
    req.resources = vec![r];
    let resp: IncrementalAlterConfigsResponse =
        client.call(ApiKey::IncrementalAlterConfigs, 1, &req).await;
    let r = &resp.responses[0];
    (
        r.error_code,
        r.error_message.as_ref().map(|m| m.to_string()),
    )
}

/// Asserts an IncrementalAlterConfigs of a broker resource succeeded.
async fn alter_broker_ok(client: &mut Client, resource: &str, ops: &[(&str, i8, Option<&str>)]) {
    let (code, message) = alter_broker(client, resource, ops).await;
    assert_eq!(code, 0, "{resource:?} {ops:?}: {message:?}");
}

/// (value, source, synonyms as (name, value, source)) of `key` on a resource.
async fn described(
    client: &mut Client,
    resource_type: i8,
    name: &str,
    key: &str,
) -> (String, i8, bool, Vec<(String, String, i8)>) {
    let mut r = describe_configs_request::DescribeConfigsResource::default();
    r.resource_type = resource_type;
    r.resource_name = StrBytes::from_string(name.into());
    r.configuration_keys = Some(vec![StrBytes::from_string(key.into())]);
    let mut req = DescribeConfigsRequest::default();
    req.resources = vec![r];
    req.include_synonyms = true;
    let resp: DescribeConfigsResponse = client.call(ApiKey::DescribeConfigs, 4, &req).await;
    let res = &resp.results[0];
    assert_eq!(res.error_code, 0, "{res:?}");
    let Some(c) = res.configs.iter().find(|c| c.name.as_str() == key) else {
        return (String::new(), -1, true, Vec::new());
    };
    (
        c.value.as_ref().map(|v| v.to_string()).unwrap_or_default(),
        c.config_source,
        c.read_only,
        c.synonyms
            .iter()
            .map(|s| {
                (
                    s.name.to_string(),
                    s.value.as_ref().map(|v| v.to_string()).unwrap_or_default(),
                    s.source,
                )
            })
            .collect(),
    )
}

/// Waits until node `node`'s replica of t-`partition` has `key` = `value`
/// (each node's partitions take a new image a moment after it commits).
async fn partition_config(
    cluster: &TestCluster,
    node: i32,
    partition: i32,
    key: &str,
    value: &str,
) {
    let tp = broker::types::TopicPartition::new("t", partition);
    cluster
        .wait_until(&format!("{key}={value} on node {node}"), WAIT, |c| {
            c.broker(node)
                .replicas
                .get(&tp)
                .is_some_and(|p| p.lock().unwrap().configs().get(key) == value)
        })
        .await;
}

const SET: i8 = 0;
const DELETE: i8 = 1;
const DYNAMIC_BROKER: i8 = 2;
const DYNAMIC_DEFAULT: i8 = 3;
const DEFAULT: i8 = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamic_broker_configs_apply_live_on_every_broker_and_survive_a_restart() {
    let mut cluster = TestCluster::start(3, 46660, &[]).await;
    let mut client = cluster.client(2).await;
    create_rotated(&cluster, &mut client, "t").await;
    let mut on_1 = cluster.client(1).await;
    let big = "x".repeat(3000);
    produce_ok(&mut on_1, "t", 0, &[&big]).await;

    // A cluster-wide default, set through one node, holds on another's
    // partitions at once.
    alter_broker_ok(&mut client, "", &[("message.max.bytes", SET, Some("2000"))]).await;
    cluster
        .wait_for_images("the default on every node", WAIT, |image| {
            image
                .broker_configs
                .get("")
                .and_then(|c| c.get("message.max.bytes"))
                == Some(&"2000".to_string())
        })
        .await;
    partition_config(&cluster, 1, 0, "max.message.bytes", "2000").await;
    let r = on_1
        .produce("t", 0, -1, batch(&[&big], Compression::None, None))
        .await;
    assert_eq!(r.error_code, ResponseError::MessageTooLarge.code(), "{r:?}");
    let (value, source, _, synonyms) = described(&mut on_1, 2, "t", "max.message.bytes").await;
    assert_eq!((value.as_str(), source), ("2000", DYNAMIC_DEFAULT));
    assert_eq!(
        synonyms,
        vec![
            ("message.max.bytes".into(), "2000".into(), DYNAMIC_DEFAULT),
            ("message.max.bytes".into(), "1048588".into(), DEFAULT),
        ]
    );

    // One broker's own value wins over the default, on that broker only.
    alter_broker_ok(
        &mut client,
        "1",
        &[("message.max.bytes", SET, Some("1000000"))],
    )
    .await;
    cluster
        .wait_for_images("node 1's own value", WAIT, |image| {
            image.broker_configs.contains_key("1")
        })
        .await;
    partition_config(&cluster, 1, 0, "max.message.bytes", "1000000").await;
    produce_ok(&mut on_1, "t", 0, &[&big]).await;
    let (value, source, read_only, _) = described(&mut on_1, 4, "1", "message.max.bytes").await;
    assert_eq!(
        (value.as_str(), source, read_only),
        ("1000000", DYNAMIC_BROKER, false)
    );
    let (value, source, _, _) = described(&mut client, 4, "", "message.max.bytes").await;
    assert_eq!((value.as_str(), source), ("2000", DYNAMIC_DEFAULT));
    let (value, source, _, _) = described(&mut client, 2, "t", "max.message.bytes").await;
    assert_eq!(
        (value.as_str(), source),
        ("2000", DYNAMIC_DEFAULT),
        "node 2 keeps the default"
    );

    // What Kafka refuses: static keys, the non-first synonyms, bad values,
    // unknown brokers.
    let refused = [
        ("", "num.io.threads", "4", ResponseError::InvalidRequest),
        (
            "",
            "log.retention.hours",
            "1",
            ResponseError::InvalidRequest,
        ),
        (
            "",
            "log.cleaner.min.cleanable.ratio",
            "2",
            ResponseError::InvalidConfig,
        ),
        (
            "9",
            "log.retention.ms",
            "1000",
            ResponseError::InvalidRequest,
        ),
    ];
    for (resource, key, value, code) in refused {
        let (got, message) = alter_broker(&mut client, resource, &[(key, SET, Some(value))]).await;
        assert_eq!(got, code.code(), "{resource:?} {key}={value}: {message:?}");
    }

    // Stored in the quorum: a restarted node has them before anything else.
    alter_broker_ok(
        &mut client,
        "",
        &[("log.retention.ms", SET, Some("3600000"))],
    )
    .await;
    drop(on_1);
    cluster.stop(3).await;
    cluster.restart(3).await;
    let mut on_3 = cluster.client(3).await;
    let (value, source, _, _) = described(&mut on_3, 2, "t", "retention.ms").await;
    assert_eq!((value.as_str(), source), ("3600000", DYNAMIC_DEFAULT));
    let part = cluster
        .broker(3)
        .replicas
        .get(&broker::types::TopicPartition::new("t", 2))
        .expect("node 3 holds t-2");
    assert_eq!(
        part.lock().unwrap().configs().get("retention.ms"),
        "3600000"
    );

    // DELETE goes back to server.properties' value.
    for resource in ["", "1"] {
        alter_broker_ok(
            &mut client,
            resource,
            &[
                ("message.max.bytes", DELETE, None),
                ("log.retention.ms", DELETE, None),
            ],
        )
        .await;
    }
    cluster
        .wait_for_images("no dynamic configs left", WAIT, |image| {
            image.broker_configs.is_empty()
        })
        .await;
    let (value, source, _, _) = described(&mut on_3, 2, "t", "max.message.bytes").await;
    assert_eq!((value.as_str(), source), ("1048588", DEFAULT));
    drop(client);
    drop(on_3);
    cluster.shutdown().await;
}
