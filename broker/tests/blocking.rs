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

async fn find_coordinator(c: &mut Client, group: &str) -> i16 {
    let r: FindCoordinatorResponse = c
        .call(
            ApiKey::FindCoordinator,
            6,
            &FindCoordinatorRequest::default().with_coordinator_keys(vec![s(group)]),
        )
        .await;
    r.coordinators[0].error_code
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
    assert_eq!(find_coordinator(&mut c, &stuck).await, NONE);

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
