//! Slow disk work stalls only what has to wait for it. Each test holds one
//! slow step (`broker::slow_io`) for one partition, as a slow or stuck disk
//! would, and checks that requests which do not need that step are served
//! meanwhile: on other connections, other partitions and other groups. The
//! broker runs in-process on the test's two-worker runtime, so one worker
//! blocked on a lock or a disk call is half the broker, and two are all of
//! it. A step the test cannot get past is released by a watchdog after
//! `CAP`, and the test then fails instead of hanging.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use broker::slow_io::{self, Step};
use common::{start, Client};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;

const NONE: i16 = 0;

/// How long a test may hold a step before the watchdog releases it.
const CAP: Duration = Duration::from_secs(10);

const OFFSETS_TOPIC: &str = "__consumer_offsets";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// A simple group's commit (no member, no generation), as admin clients
/// and self-assigning consumers make it; the partitions' error codes.
async fn commit(c: &mut Client, group: &str, topic: &str, offset: i64) -> Vec<i16> {
    let mut p = offset_commit_request::OffsetCommitRequestPartition::default();
    p.partition_index = 0;
    p.committed_offset = offset;
    let mut t = offset_commit_request::OffsetCommitRequestTopic::default();
    t.name = TopicName(s(topic));
    t.partitions = vec![p];
    let r: OffsetCommitResponse = c
        .call(
            ApiKey::OffsetCommit,
            8,
            &OffsetCommitRequest::default()
                .with_group_id(GroupId(s(group)))
                .with_generation_id_or_member_epoch(-1)
                .with_member_id(s(""))
                .with_topics(vec![t]),
        )
        .await;
    r.topics[0]
        .partitions
        .iter()
        .map(|p| p.error_code)
        .collect()
}

/// The committed offset of partition 0 of `topic` for `group`.
async fn committed(c: &mut Client, group: &str, topic: &str) -> i64 {
    let mut t = offset_fetch_request::OffsetFetchRequestTopics::default();
    t.name = TopicName(s(topic));
    t.partition_indexes = vec![0];
    let mut g = offset_fetch_request::OffsetFetchRequestGroup::default();
    g.group_id = GroupId(s(group));
    g.topics = Some(vec![t]);
    let r: OffsetFetchResponse = c
        .call(
            ApiKey::OffsetFetch,
            9,
            &OffsetFetchRequest::default().with_groups(vec![g]),
        )
        .await;
    assert_eq!(r.groups[0].error_code, NONE);
    r.groups[0].topics[0].partitions[0].committed_offset
}

/// FindCoordinator for `group`: the error code and the coordinator's id.
async fn find_coordinator(c: &mut Client, group: &str) -> (i16, i32) {
    let r: FindCoordinatorResponse = c
        .call(
            ApiKey::FindCoordinator,
            6,
            &FindCoordinatorRequest::default().with_coordinator_keys(vec![s(group)]),
        )
        .await;
    (r.coordinators[0].error_code, r.coordinators[0].node_id.0)
}

/// A group id on `__consumer_offsets` partition `stuck` (of `partitions`),
/// and four on other partitions.
fn groups_around(partitions: i32) -> ((String, i32), Vec<String>) {
    let on = |g: String| {
        let p = broker::group::offsets::partition_for(&g, partitions);
        (g, p)
    };
    let stuck = on("stuck-group".to_string());
    let live = (0..)
        .map(|i| on(format!("live-group-{i}")))
        .filter(|(_, p)| *p != stuck.1)
        .map(|(g, _)| g)
        .take(4)
        .collect();
    (stuck, live)
}

/// What other clients do while a step is held, each on its own connection,
/// all at once: more requests in flight than the runtime has workers. Every
/// one must be answered. Client `i` commits for `groups[i]`, if given.
async fn other_clients_are_served(addr: SocketAddr, topic: &str, groups: &[String]) {
    let mut tasks = Vec::new();
    for i in 0..4 {
        let topic = topic.to_string();
        let group = groups.get(i as usize).cloned();
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let value = format!("v{i}");
            let r = c
                .produce(
                    &topic,
                    0,
                    -1,
                    common::batch(&[value.as_str()], Compression::None, None),
                )
                .await;
            assert_eq!(r.error_code, NONE);
            let f = c.fetch(&topic, 0, r.base_offset, 0).await;
            assert_eq!(f.error_code, NONE);
            assert_eq!(
                common::values(&f.records).first().map(|(_, v)| v.clone()),
                Some(value)
            );
            if let Some(g) = group {
                assert_eq!(commit(&mut c, &g, &topic, i).await, vec![NONE]);
                assert_eq!(committed(&mut c, &g, &topic).await, i);
            }
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_opening_slowly_stalls_no_other_request() {
    let b = start(&[]).await;
    let addr = b.running.local_addr;
    let mut c = Client::connect(addr).await;
    assert_eq!(c.create_topic("live", 1, &[]).await, NONE);

    // Creating a topic opens its partition while the image is applied; a
    // recovery scan after a crash makes that open take as long as the log
    // is big.
    let held = slow_io::hold("slow-open", 0, Step::PartitionOpen, CAP);
    let creating = tokio::spawn(async move {
        let mut c = Client::connect(addr).await;
        c.create_topic("slow-open", 1, &[]).await
    });
    held.entered().await;
    other_clients_are_served(addr, "live", &[]).await;
    assert!(
        !held.release(),
        "requests on other partitions waited for a partition to open"
    );
    assert_eq!(creating.await.unwrap(), NONE);
    let mut c = Client::connect(addr).await;
    let r = c
        .produce(
            "slow-open",
            0,
            -1,
            common::batch(&["after"], Compression::None, None),
        )
        .await;
    assert_eq!(r.error_code, NONE);
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_offsets_append_stalls_only_the_groups_of_its_partition() {
    let b = start(&[("offsets.topic.num.partitions", "4")]).await;
    let addr = b.running.local_addr;
    let mut c = Client::connect(addr).await;
    assert_eq!(c.create_topic("live", 1, &[]).await, NONE);
    let ((stuck, stuck_partition), live) = groups_around(4);
    assert_eq!(find_coordinator(&mut c, &stuck).await.0, NONE);

    let held = slow_io::hold(OFFSETS_TOPIC, stuck_partition, Step::OffsetsAppend, CAP);
    let stuck_commit = {
        let stuck = stuck.clone();
        tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            commit(&mut c, &stuck, "live", 7).await
        })
    };
    held.entered().await;
    other_clients_are_served(addr, "live", &live).await;
    assert!(
        !held.release(),
        "other groups and partitions waited for one group's offsets append"
    );
    assert_eq!(stuck_commit.await.unwrap(), vec![NONE]);
    assert_eq!(committed(&mut c, &stuck, "live").await, 7);
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_maintenance_writes_do_not_hold_the_partition() {
    // Maintenance every 100 ms, so the test does not wait for it.
    let b = start(&[("log.retention.check.interval.ms", "100")]).await;
    let addr = b.running.local_addr;
    let mut c = Client::connect(addr).await;
    assert_eq!(c.create_topic("maintained", 1, &[]).await, NONE);
    assert_eq!(c.create_topic("live", 1, &[]).await, NONE);

    // The high-watermark checkpoint and the producer snapshot are fsynced
    // files: slow on a busy disk.
    let held = slow_io::hold("maintained", 0, Step::MaintenanceWrite, CAP);
    held.entered().await;
    // The maintained partition itself and the others are served meanwhile.
    other_clients_are_served(addr, "maintained", &[]).await;
    other_clients_are_served(addr, "live", &[]).await;
    assert!(
        !held.release(),
        "requests waited for a partition's maintenance writes"
    );
    b.running.shutdown().await;
}

/// A node running on its own runtime with two worker threads, as a
/// separate process would: a stall of its workers leaves the other nodes'
/// timers running, so its Raft peers and the active controller notice.
struct Node {
    id: i32,
    broker: Arc<broker::broker::Broker>,
    addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

/// Starts `n` nodes in combined mode (ids 1..=n, node i on 127.0.0.{i+1}),
/// each on its own runtime, with the cluster harness's fast timeouts.
async fn start_nodes(n: i32, base_port: u16, extra: &[(&str, &str)]) -> Vec<Node> {
    let host = common::cluster::host;
    let client_port = |id: i32| base_port + 2 * (id as u16 - 1);
    let voters = (1..=n)
        .map(|id| format!("{id}@{}:{}", host(id), client_port(id) + 1))
        .collect::<Vec<_>>()
        .join(",");
    let dir = tempfile::tempdir().unwrap();
    let mut starting = Vec::new();
    for id in 1..=n {
        let mut pairs: Vec<(String, String)> = vec![
            ("node.id".into(), id.to_string()),
            ("process.roles".into(), "broker,controller".into()),
            (
                "listeners".into(),
                format!(
                    "PLAINTEXT://{h}:{},CONTROLLER://{h}:{}",
                    client_port(id),
                    client_port(id) + 1,
                    h = host(id)
                ),
            ),
            ("controller.listener.names".into(), "CONTROLLER".into()),
            ("controller.quorum.voters".into(), voters.clone()),
            (
                "log.dirs".into(),
                dir.path().join(id.to_string()).display().to_string(),
            ),
            ("metrics.listen.address".into(), "none".into()),
        ];
        for (k, v) in common::cluster::FAST_TIMEOUTS.iter().chain(extra) {
            pairs.push((k.to_string(), v.to_string()));
        }
        let config = broker::config::ServerConfig::from_pairs(pairs).unwrap();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let running = broker::start(config).await.expect("node starts");
                let _ = ready_tx.send((running.broker.clone(), running.local_addr));
                let _ = stop_rx.await;
                running.shutdown().await;
            });
        });
        starting.push((id, ready_rx, stop, thread));
    }
    let mut nodes = Vec::new();
    for (id, ready, stop, thread) in starting {
        let (broker, addr) = ready.await.expect("node started");
        nodes.push(Node {
            id,
            broker,
            addr,
            stop,
            thread,
        });
    }
    // The temporary directory outlives the nodes: they are stopped before
    // the test returns.
    std::mem::forget(dir);
    nodes
}

fn node(nodes: &[Node], id: i32) -> &Node {
    nodes
        .iter()
        .find(|n| n.id == id)
        .expect("a node with that id")
}

/// The Raft leader every node names, if they agree.
fn raft_leader(nodes: &[Node]) -> Option<i32> {
    let first = nodes[0].broker.metadata.leader()?.0;
    nodes
        .iter()
        .all(|n| n.broker.metadata.leader().map(|l| l.0) == Some(first))
        .then_some(first)
}

/// Polls `check` every 50 ms until it gives a value, at most `timeout`.
async fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The node leading partition 0 of `topic`, once one does.
async fn leader_of(nodes: &[Node], topic: &str) -> i32 {
    wait_for("a leader for the topic", Duration::from_secs(10), || {
        let image = nodes[0].broker.metadata.image();
        image
            .topics
            .get(topic)
            .map(|t| t.partitions[0].leader.0)
            .filter(|l| *l >= 0)
    })
    .await
}

/// The node coordinating `group`, once it stores a commit of the group.
async fn coordinator_of(nodes: &[Node], group: &str, topic: &str) -> i32 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut c = Client::connect(nodes[0].addr).await;
        let (code, id) = find_coordinator(&mut c, group).await;
        if code == NONE {
            let mut c = Client::connect(node(nodes, id).addr).await;
            if commit(&mut c, group, topic, 0).await == vec![NONE] {
                return id;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{group} has no coordinator"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Three nodes, each on its own runtime: one node's maintenance writes and
/// one group's offsets append are stuck for longer than the broker session
/// timeout and several election timeouts, and the cluster does not notice:
/// the Raft leader and its term stay, no broker is fenced, and the other
/// partitions and groups are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_disk_work_on_one_node_moves_no_raft_leadership() {
    let nodes = start_nodes(
        3,
        45300,
        &[
            ("log.retention.check.interval.ms", "100"),
            ("offsets.topic.num.partitions", "4"),
        ],
    )
    .await;
    let leader = wait_for("an agreed Raft leader", Duration::from_secs(20), || {
        raft_leader(&nodes)
    })
    .await;
    wait_for("every broker registered", Duration::from_secs(20), || {
        nodes
            .iter()
            .all(|n| {
                let image = n.broker.metadata.image();
                image.brokers.len() == nodes.len() && image.brokers.values().all(|b| !b.fenced)
            })
            .then_some(())
    })
    .await;
    let term = node(&nodes, leader).broker.metadata.leader_term();
    assert!(term.is_some());
    let mut c = Client::connect(node(&nodes, leader).addr).await;
    assert_eq!(c.create_topic("maintained", 1, &[]).await, NONE);
    assert_eq!(c.create_topic("live", 1, &[]).await, NONE);
    let maintained = leader_of(&nodes, "maintained").await;
    let live = leader_of(&nodes, "live").await;
    let ((stuck, stuck_partition), live_groups) = groups_around(4);
    let stuck_node = coordinator_of(&nodes, &stuck, "live").await;
    let live_group = live_groups[0].clone();
    let live_node = coordinator_of(&nodes, &live_group, "live").await;

    let held_maintenance = slow_io::hold("maintained", 0, Step::MaintenanceWrite, CAP);
    let held_append = slow_io::hold(OFFSETS_TOPIC, stuck_partition, Step::OffsetsAppend, CAP);
    held_maintenance.entered().await;
    let stuck_addr = node(&nodes, stuck_node).addr;
    let stuck_commit = {
        let stuck = stuck.clone();
        tokio::spawn(async move {
            let mut c = Client::connect(stuck_addr).await;
            commit(&mut c, &stuck, "live", 7).await
        })
    };
    held_append.entered().await;

    // Serve clients for longer than broker.session.timeout.ms (1.5 s) and
    // several controller election timeouts (0.5 s).
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut rounds = 0;
    while tokio::time::Instant::now() < until {
        other_clients_are_served(node(&nodes, maintained).addr, "maintained", &[]).await;
        other_clients_are_served(node(&nodes, live).addr, "live", &[]).await;
        let mut c = Client::connect(node(&nodes, live_node).addr).await;
        assert_eq!(
            commit(&mut c, &live_group, "live", rounds).await,
            vec![NONE]
        );
        rounds += 1;
    }
    for n in &nodes {
        assert!(
            n.broker
                .metadata
                .image()
                .brokers
                .values()
                .all(|b| !b.fenced),
            "node {} sees a fenced broker",
            n.id
        );
    }
    assert_eq!(raft_leader(&nodes), Some(leader), "the Raft leader moved");
    assert_eq!(
        node(&nodes, leader).broker.metadata.leader_term(),
        term,
        "an election ran"
    );
    assert!(
        !held_maintenance.release(),
        "clients waited for a maintenance write"
    );
    assert!(
        !held_append.release(),
        "clients waited for an offsets append"
    );
    assert_eq!(stuck_commit.await.unwrap(), vec![NONE]);
    for n in nodes {
        drop(n.broker);
        let _ = n.stop.send(());
        tokio::task::spawn_blocking(move || n.thread.join())
            .await
            .unwrap()
            .expect("node thread");
    }
}
