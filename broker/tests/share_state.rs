//! The share coordinator over the wire, as Kafka's share-partition leaders
//! and group coordinator drive it: FindCoordinator (key type 2), then
//! Initialize/Read/Write/Delete/ReadSummary share-group state, with Kafka's
//! errors for uninitialized state and stale epochs; the state kept across a
//! restart, and across the loss of the coordinator in a 3-node cluster.

mod common;

use std::time::Duration;

use common::cluster::TestCluster;
use common::Client;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use uuid::Uuid;

const GROUP: &str = "sg";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

async fn topic_id(c: &mut Client, topic: &str) -> Uuid {
    let mut t = metadata_request::MetadataRequestTopic::default();
    t.name = Some(TopicName(s(topic)));
    let req = MetadataRequest::default().with_topics(Some(vec![t]));
    let resp: MetadataResponse = c.call(ApiKey::Metadata, 12, &req).await;
    assert_eq!(resp.topics[0].error_code, 0);
    resp.topics[0].topic_id
}

async fn find(c: &mut Client, key: &str) -> find_coordinator_response::Coordinator {
    let req = FindCoordinatorRequest::default()
        .with_key_type(2)
        .with_coordinator_keys(vec![s(key)]);
    let mut resp: FindCoordinatorResponse = c.call(ApiKey::FindCoordinator, 6, &req).await;
    resp.coordinators.remove(0)
}

async fn initialize(
    c: &mut Client,
    topic: Uuid,
    partition: i32,
    state_epoch: i32,
    start: i64,
) -> i16 {
    use initialize_share_group_state_request::*;
    let req = InitializeShareGroupStateRequest::default()
        .with_group_id(s(GROUP))
        .with_topics(vec![InitializeStateData::default()
            .with_topic_id(topic)
            .with_partitions(vec![PartitionData::default()
                .with_partition(partition)
                .with_state_epoch(state_epoch)
                .with_start_offset(start)])]);
    let resp: InitializeShareGroupStateResponse =
        c.call(ApiKey::InitializeShareGroupState, 0, &req).await;
    resp.results[0].partitions[0].error_code
}

/// (first, last, state, delivery count)
type Batch = (i64, i64, i8, i16);

async fn write(
    c: &mut Client,
    topic: Uuid,
    partition: i32,
    (state_epoch, leader_epoch): (i32, i32),
    start: i64,
    batches: &[Batch],
) -> i16 {
    use write_share_group_state_request::*;
    let req = WriteShareGroupStateRequest::default()
        .with_group_id(s(GROUP))
        .with_topics(vec![WriteStateData::default()
            .with_topic_id(topic)
            .with_partitions(vec![PartitionData::default()
                .with_partition(partition)
                .with_state_epoch(state_epoch)
                .with_leader_epoch(leader_epoch)
                .with_start_offset(start)
                .with_state_batches(
                    batches
                        .iter()
                        .map(|&(f, l, st, n)| {
                            StateBatch::default()
                                .with_first_offset(f)
                                .with_last_offset(l)
                                .with_delivery_state(st)
                                .with_delivery_count(n)
                        })
                        .collect(),
                )])]);
    let resp: WriteShareGroupStateResponse = c.call(ApiKey::WriteShareGroupState, 0, &req).await;
    resp.results[0].partitions[0].error_code
}

/// (error, state epoch, start offset, batches)
async fn read(
    c: &mut Client,
    topic: Uuid,
    partition: i32,
    leader_epoch: i32,
) -> (i16, i32, i64, Vec<Batch>) {
    use read_share_group_state_request::*;
    let req = ReadShareGroupStateRequest::default()
        .with_group_id(s(GROUP))
        .with_topics(vec![ReadStateData::default()
            .with_topic_id(topic)
            .with_partitions(vec![PartitionData::default()
                .with_partition(partition)
                .with_leader_epoch(leader_epoch)])]);
    let resp: ReadShareGroupStateResponse = c.call(ApiKey::ReadShareGroupState, 0, &req).await;
    let p = &resp.results[0].partitions[0];
    (
        p.error_code,
        p.state_epoch,
        p.start_offset,
        p.state_batches
            .iter()
            .map(|b| {
                (
                    b.first_offset,
                    b.last_offset,
                    b.delivery_state,
                    b.delivery_count,
                )
            })
            .collect(),
    )
}

/// (error, state epoch, leader epoch, start offset)
async fn summary(c: &mut Client, topic: Uuid, partition: i32) -> (i16, i32, i32, i64) {
    use read_share_group_state_summary_request::*;
    let req = ReadShareGroupStateSummaryRequest::default()
        .with_group_id(s(GROUP))
        .with_topics(vec![ReadStateSummaryData::default()
            .with_topic_id(topic)
            .with_partitions(vec![
                PartitionData::default().with_partition(partition)
            ])]);
    let resp: ReadShareGroupStateSummaryResponse =
        c.call(ApiKey::ReadShareGroupStateSummary, 0, &req).await;
    let p = &resp.results[0].partitions[0];
    (p.error_code, p.state_epoch, p.leader_epoch, p.start_offset)
}

async fn delete(c: &mut Client, topic: Uuid, partition: i32) -> i16 {
    use delete_share_group_state_request::*;
    let req = DeleteShareGroupStateRequest::default()
        .with_group_id(s(GROUP))
        .with_topics(vec![DeleteStateData::default()
            .with_topic_id(topic)
            .with_partitions(vec![
                PartitionData::default().with_partition(partition)
            ])]);
    let resp: DeleteShareGroupStateResponse = c.call(ApiKey::DeleteShareGroupState, 0, &req).await;
    resp.results[0].partitions[0].error_code
}

const AVAILABLE: i8 = 0;
const ACKNOWLEDGED: i8 = 2;
const ARCHIVED: i8 = 4;

fn code(e: ResponseError) -> i16 {
    e.code()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_state_is_kept_with_kafkas_rules_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    // A snapshot every 2 updates, so the restart replays snapshots and
    // updates both.
    let cfg = common::config(
        dir.path(),
        &[
            (
                "share.coordinator.snapshot.update.records.per.snapshot",
                "2",
            ),
            ("share.coordinator.state.topic.num.partitions", "3"),
        ],
    );
    let running = broker::start(cfg.clone()).await.unwrap();
    let mut c = Client::connect(running.local_addr).await;
    assert_eq!(c.create_topic("t", 2, &[]).await, 0);
    let t = topic_id(&mut c, "t").await;

    // The first lookup creates __share_group_state; this node leads it all.
    let key = broker::share::coordinator::coordinator_key(GROUP, t, 0);
    let found = find(&mut c, &key).await;
    assert_eq!(found.error_code, 0, "{found:?}");
    assert_eq!(found.port, i32::from(running.local_addr.port()));
    assert_eq!(
        find(&mut c, "no-colons").await.error_code,
        code(ResponseError::InvalidRequest)
    );
    assert_eq!(
        find(&mut c, "g:not-a-topic-id:0").await.error_code,
        code(ResponseError::InvalidRequest)
    );

    // Nothing is read or written before the group initializes the partition.
    assert_eq!(
        read(&mut c, t, 0, 1).await.0,
        code(ResponseError::InvalidRequest)
    );
    assert_eq!(
        write(&mut c, t, 0, (0, 1), 0, &[]).await,
        code(ResponseError::InvalidRequest)
    );
    assert_eq!(summary(&mut c, t, 0).await, (0, 0, 0, -1));
    assert_eq!(
        initialize(&mut c, Uuid::from_u128(77), 0, 0, 0).await,
        code(ResponseError::UnknownTopicOrPartition)
    );
    assert_eq!(
        initialize(&mut c, t, 5, 0, 0).await,
        code(ResponseError::UnknownTopicOrPartition)
    );

    assert_eq!(initialize(&mut c, t, 0, 1, 10).await, 0);
    assert_eq!(initialize(&mut c, t, 1, 1, 0).await, 0);
    // Leader epoch 3 acquires 10-19, then acknowledges, archives and
    // releases parts of it: five writes, so snapshots and updates mix.
    let writes: [(i64, &[Batch]); 5] = [
        (10, &[(10, 19, 1, 1)]),
        (-1, &[(10, 12, ACKNOWLEDGED, 1)]),
        (-1, &[(13, 13, ARCHIVED, 1)]),
        (-1, &[(14, 19, AVAILABLE, 1)]),
        (13, &[(14, 15, ACKNOWLEDGED, 2)]),
    ];
    for (i, (start, batches)) in writes.iter().enumerate() {
        assert_eq!(
            write(&mut c, t, 0, (1, 3), *start, batches).await,
            0,
            "write {i}"
        );
    }
    let expected: Vec<Batch> = vec![
        (13, 13, ARCHIVED, 1),
        (14, 15, ACKNOWLEDGED, 2),
        (16, 19, AVAILABLE, 1),
    ];
    assert_eq!(read(&mut c, t, 0, 3).await, (0, 1, 13, expected.clone()));
    assert_eq!(summary(&mut c, t, 0).await, (0, 1, 3, 13));

    // A leader of an older epoch, or a state from before a reset, is fenced.
    assert_eq!(
        write(&mut c, t, 0, (1, 2), -1, &[(16, 16, ACKNOWLEDGED, 1)]).await,
        code(ResponseError::FencedLeaderEpoch)
    );
    assert_eq!(
        read(&mut c, t, 0, 2).await.0,
        code(ResponseError::FencedLeaderEpoch)
    );
    assert_eq!(
        write(&mut c, t, 0, (0, 3), -1, &[(16, 16, ACKNOWLEDGED, 1)]).await,
        code(ResponseError::FencedStateEpoch)
    );
    assert_eq!(
        initialize(&mut c, t, 0, 0, 0).await,
        code(ResponseError::FencedStateEpoch)
    );
    // Bad batches and epochs are refused, and change nothing.
    assert_eq!(
        write(&mut c, t, 0, (1, 3), -1, &[(16, 16, 9, 1)]).await,
        code(ResponseError::InvalidRequest)
    );
    assert_eq!(
        write(&mut c, t, 0, (1, 3), -1, &[(16, 18, 2, 1), (18, 19, 2, 1)]).await,
        code(ResponseError::InvalidRequest)
    );
    assert_eq!(
        write(&mut c, t, 0, (1, -1), -1, &[]).await,
        code(ResponseError::InvalidRequest)
    );
    // A new leader's read records its epoch: the old leader's writes are
    // fenced from then on.
    assert_eq!(read(&mut c, t, 0, 4).await, (0, 1, 13, expected.clone()));
    assert_eq!(
        write(&mut c, t, 0, (1, 3), -1, &[]).await,
        code(ResponseError::FencedLeaderEpoch)
    );
    // Partition 1's state is apart; deleting it leaves partition 0's.
    assert_eq!(
        write(&mut c, t, 1, (1, 1), 0, &[(0, 4, ACKNOWLEDGED, 1)]).await,
        0
    );
    assert_eq!(delete(&mut c, t, 1).await, 0);
    assert_eq!(delete(&mut c, t, 1).await, 0, "deleting nothing succeeds");
    assert_eq!(summary(&mut c, t, 1).await, (0, 0, 0, -1));
    drop(c);
    running.shutdown().await;

    // Replayed from __share_group_state: the same state, the new leader
    // epoch, and the deletion.
    let running = broker::start(cfg).await.unwrap();
    let mut c = Client::connect(running.local_addr).await;
    assert_eq!(read(&mut c, t, 0, 4).await, (0, 1, 13, expected));
    assert_eq!(summary(&mut c, t, 0).await, (0, 1, 4, 13));
    assert_eq!(
        write(&mut c, t, 0, (1, 3), -1, &[]).await,
        code(ResponseError::FencedLeaderEpoch)
    );
    assert_eq!(
        read(&mut c, t, 1, 1).await.0,
        code(ResponseError::InvalidRequest)
    );
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cluster_action_every_partition_is_refused() {
    let b = common::start(&[
        (
            "authorizer.class.name",
            "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        ),
        ("allow.everyone.if.no.acl.found", "false"),
    ])
    .await;
    let mut c = Client::connect(b.running.local_addr).await;
    let t = Uuid::from_u128(5);
    let denied = code(ResponseError::ClusterAuthorizationFailed);
    assert_eq!(initialize(&mut c, t, 0, 0, 0).await, denied);
    assert_eq!(read(&mut c, t, 0, 0).await.0, denied);
    assert_eq!(write(&mut c, t, 0, (0, 0), 0, &[]).await, denied);
    assert_eq!(summary(&mut c, t, 0).await.0, denied);
    assert_eq!(delete(&mut c, t, 0).await, denied);
    assert_eq!(
        find(&mut c, &format!("g:{}:0", "AAAAAAAAAAAAAAAAAAAAAA"))
            .await
            .error_code,
        denied
    );
    b.running.shutdown().await;
}

/// The coordinator of `key` as node `via` sees it, once it answers.
async fn coordinator(cluster: &TestCluster, via: i32, key: &str) -> i32 {
    for _ in 0..200 {
        let mut c = cluster.client(via).await;
        let found = find(&mut c, key).await;
        if found.error_code == 0 {
            return found.node_id.0;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no coordinator for {key}");
}

/// A 3-node cluster whose `__share_group_state` is one partition on all
/// three nodes (min ISR 2), with topic `t` (one partition, three replicas)
/// known to every node; `t`'s id.
async fn cluster_with_topic(base_port: u16) -> (TestCluster, Uuid) {
    let cluster = TestCluster::start(
        3,
        base_port,
        &[
            ("share.coordinator.state.topic.num.partitions", "1"),
            ("share.coordinator.state.topic.replication.factor", "3"),
            ("share.coordinator.state.topic.min.isr", "2"),
            ("replica.fetch.wait.max.ms", "100"),
        ],
    )
    .await;
    let mut c = cluster.client(1).await;
    let mut t = create_topics_request::CreatableTopic::default();
    t.name = TopicName(s("t"));
    t.num_partitions = 1;
    t.replication_factor = 3;
    let req = CreateTopicsRequest::default()
        .with_topics(vec![t])
        .with_timeout_ms(10_000);
    let resp: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &req).await;
    assert_eq!(resp.topics[0].error_code, 0);
    let t = topic_id(&mut c, "t").await;
    cluster
        .wait_for_images("t everywhere", Duration::from_secs(10), |img| {
            img.topic_by_id(t).is_some()
        })
        .await;
    (cluster, t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acked_share_state_survives_the_loss_of_its_coordinator() {
    let (mut cluster, t) = cluster_with_topic(46700).await;
    let key = broker::share::coordinator::coordinator_key(GROUP, t, 0);

    // The coordinator acks only what its in-sync replicas have.
    let first = coordinator(&cluster, 1, &key).await;
    let mut c = cluster.client(first).await;
    let mut ok = false;
    for _ in 0..100 {
        if initialize(&mut c, t, 0, 0, 0).await == 0 {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "initialize never succeeded on node {first}");
    let batches: &[Batch] = &[
        (0, 4, ACKNOWLEDGED, 1),
        (5, 5, ARCHIVED, 3),
        (6, 9, AVAILABLE, 2),
    ];
    assert_eq!(write(&mut c, t, 0, (0, 1), 0, batches).await, 0);
    drop(c);

    cluster.stop(first).await;
    let other = cluster.running_ids()[0];
    let next = coordinator(&cluster, other, &key).await;
    assert_ne!(next, first);
    let mut c = cluster.client(next).await;
    let mut got = read(&mut c, t, 0, 2).await;
    for _ in 0..50 {
        if got.0 != code(ResponseError::NotCoordinator) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        got = read(&mut c, t, 0, 2).await;
    }
    assert_eq!(got, (0, 0, 0, batches.to_vec()));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_persister_reaches_the_coordinator_from_any_node_and_follows_it() {
    use broker::share::partition::{RecordState, StateBatch};
    use broker::share::records::SharePartitionKey;
    use broker::share::store::Write;

    let (mut cluster, t) = cluster_with_topic(46720).await;
    let key = SharePartitionKey {
        group_id: GROUP.into(),
        topic_id: t,
        partition: 0,
    };
    let ck = broker::share::coordinator::coordinator_key(GROUP, t, 0);
    let first = coordinator(&cluster, 1, &ck).await;
    let other = (1..=3).find(|&id| id != first).unwrap();

    // From a node that does not coordinate it: over the inter-broker
    // listener.
    let b = cluster.broker(other).clone();
    // Before Initialize the coordinator's INVALID_REQUEST comes back as the
    // one error a leader may initialize after.
    assert_eq!(
        b.share_persister.read(&b, &key, 1).await,
        Err(broker::share::coordinator::ShareCoordError::Uninitialized)
    );
    b.share_persister.initialize(&b, &key, 0, 0).await.unwrap();
    let batch = |first, last, state, count| StateBatch {
        first_offset: first,
        last_offset: last,
        state,
        delivery_count: count,
    };
    let w = Write {
        state_epoch: 0,
        leader_epoch: 1,
        start_offset: 0,
        batches: vec![
            batch(0, 2, RecordState::Acknowledged, 1),
            batch(3, 3, RecordState::Archived, 5),
        ],
    };
    b.share_persister.write(&b, &key, &w).await.unwrap();
    let state = b.share_persister.read(&b, &key, 1).await.unwrap();
    assert_eq!((state.state_epoch, state.start_offset), (0, 0));
    assert_eq!(state.batches, w.batches);
    // The summary carries the records done (for a group's lag) across
    // nodes too.
    let summary = b.share_persister.read_summary(&b, &key).await.unwrap();
    assert_eq!(
        (summary.start_offset, summary.delivery_complete_count),
        (0, 4)
    );
    // Errors come back as the coordinator's.
    let stale = Write {
        leader_epoch: 0,
        ..w.clone()
    };
    assert_eq!(
        b.share_persister.write(&b, &key, &stale).await,
        Err(broker::share::coordinator::ShareCoordError::FencedLeaderEpoch)
    );

    // The coordinator goes away: the persister finds the next one (once it
    // has loaded the partition) without the caller retrying.
    cluster.stop(first).await;
    let survivor = cluster.running_ids()[0];
    let b = cluster.broker(survivor).clone();
    let summary = b.share_persister.read_summary(&b, &key).await.unwrap();
    assert_eq!(
        (
            summary.leader_epoch,
            summary.start_offset,
            summary.delivery_complete_count
        ),
        (1, 0, 4)
    );
    let state = b.share_persister.read(&b, &key, 2).await.unwrap();
    assert_eq!(state.batches, w.batches);
    b.share_persister.delete(&b, &key).await.unwrap();
    assert_eq!(
        b.share_persister
            .read_summary(&b, &key)
            .await
            .unwrap()
            .start_offset,
        -1
    );
    cluster.shutdown().await;
}

/// Acknowledges one run of offsets with one type (1 accept, 2 release,
/// 3 reject).
fn ack(first: i64, last: i64, kind: i8) -> broker::share::partition::AckBatch {
    broker::share::partition::AckBatch {
        first_offset: first,
        last_offset: last,
        types: vec![broker::share::partition::AckType::from_id(kind).unwrap()],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_partition_leader_writes_acks_and_expired_locks_before_they_count() {
    use broker::share::partition::{AcquireMode, LogBatch, RecordState};
    use broker::types::TopicPartition;
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    // Locks of 300 ms, so that the expiry timer is seen at work.
    let cfg = common::config(
        dir.path(),
        &[
            ("group.share.min.record.lock.duration.ms", "100"),
            ("group.share.record.lock.duration.ms", "300"),
            ("share.coordinator.state.topic.num.partitions", "2"),
        ],
    );
    let running = broker::start(cfg.clone()).await.unwrap();
    let mut c = Client::connect(running.local_addr).await;
    assert_eq!(c.create_topic("q", 1, &[]).await, 0);
    let values: Vec<String> = (0..5).map(|i| format!("v{i}")).collect();
    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
    let r = c
        .produce(
            "q",
            0,
            -1,
            common::batch(&refs, kafka_protocol::records::Compression::None, None),
        )
        .await;
    assert_eq!(r.error_code, 0);
    let tp = TopicPartition::new("q", 0);
    let b = running.broker.clone();

    // First use: initialized at `latest` (5), as Kafka's default.
    {
        let loaded = b.share_leaders.get(&b, GROUP, &tp).await.unwrap();
        assert_eq!(loaded.as_ref().unwrap().partition.start_offset(), 5);
    }
    let more: Vec<&str> = vec!["a", "b", "c", "d", "e"];
    let r = c
        .produce(
            "q",
            0,
            -1,
            common::batch(&more, kafka_protocol::records::Compression::None, None),
        )
        .await;
    assert_eq!(r.base_offset, 5);
    let member: Arc<str> = Arc::from("m1");
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    {
        let mut loaded = b.share_leaders.get(&b, GROUP, &tp).await.unwrap();
        let p = &mut loaded.as_mut().unwrap().partition;
        let got = p.acquire(
            &member,
            &[LogBatch {
                first_offset: 5,
                last_offset: 9,
                control: false,
            }],
            100,
            AcquireMode::BatchOptimized,
            now(),
        );
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].first_offset, got[0].last_offset), (5, 9));
    }
    // Accept 5-6, release 7, reject 8; 9 stays locked.
    b.share_leaders
        .acknowledge(
            &b,
            GROUP,
            &tp,
            "m1",
            &[ack(5, 6, 1), ack(7, 7, 2), ack(8, 8, 3)],
        )
        .await
        .unwrap();
    // Another member cannot acknowledge m1's record; nothing changes.
    let refused = b
        .share_leaders
        .acknowledge(&b, GROUP, &tp, "m2", &[ack(9, 9, 1)])
        .await;
    assert!(refused.is_err(), "{refused:?}");
    // The lock on 9 expires within its 300 ms (and the timer's period).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let loaded = b.share_leaders.get(&b, GROUP, &tp).await.unwrap();
        let p = &loaded.as_ref().unwrap().partition;
        if p.record(9) == Some((RecordState::Available, 1)) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{:?}", p.record(9));
        drop(loaded);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop((c, b));
    running.shutdown().await;

    // Reloaded from the share coordinator after a restart: every state and
    // delivery count, the lock expiry included.
    let running = broker::start(cfg).await.unwrap();
    let b = running.broker.clone();
    {
        let loaded = b.share_leaders.get(&b, GROUP, &tp).await.unwrap();
        let p = &loaded.as_ref().unwrap().partition;
        assert_eq!(p.start_offset(), 7, "5 and 6 are done");
        assert_eq!(p.record(7), Some((RecordState::Available, 1)));
        assert_eq!(p.record(8), Some((RecordState::Archived, 1)));
        assert_eq!(p.record(9), Some((RecordState::Available, 1)));
        assert_eq!(p.next_fetch_offset(), 7);
    }
    drop(b);
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_share_partition_is_snapshotted_again_so_retention_never_takes_its_state() {
    use broker::share::coordinator::{ShareCoordinator, SHARE_STATE_TOPIC};
    use broker::types::TopicPartition;

    let dir = tempfile::tempdir().unwrap();
    let cfg = common::config(
        dir.path(),
        &[
            ("share.coordinator.state.topic.num.partitions", "1"),
            (
                "share.coordinator.cold.partition.snapshot.interval.ms",
                "300",
            ),
        ],
    );
    let running = broker::start(cfg.clone()).await.unwrap();
    let mut c = Client::connect(running.local_addr).await;
    assert_eq!(c.create_topic("t", 1, &[]).await, 0);
    let t = topic_id(&mut c, "t").await;
    let key = broker::share::coordinator::coordinator_key(GROUP, t, 0);
    assert_eq!(find(&mut c, &key).await.error_code, 0);
    assert_eq!(initialize(&mut c, t, 0, 0, 0).await, 0);
    assert_eq!(
        write(&mut c, t, 0, (0, 1), -1, &[(0, 1, ACKNOWLEDGED, 1)]).await,
        0
    );
    let b = running.broker.clone();
    let tp = TopicPartition::new(SHARE_STATE_TOPIC, ShareCoordinator::partition_for(&b, &key));
    let log_end = |b: &broker::broker::Broker| {
        b.replicas
            .get(&tp)
            .unwrap()
            .lock()
            .unwrap()
            .log_end_offset()
            .0
    };
    let written = log_end(&b);
    assert_eq!(written, 2, "the initialize snapshot and one update");
    // Idle: within a few intervals a snapshot of the same state is appended.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while log_end(&b) == written {
        assert!(std::time::Instant::now() < deadline, "no cold snapshot");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        read(&mut c, t, 0, 1).await,
        (0, 0, 0, vec![(0, 1, ACKNOWLEDGED, 1)])
    );
    drop((c, b));
    running.shutdown().await;
    let running = broker::start(cfg).await.unwrap();
    let mut c = Client::connect(running.local_addr).await;
    assert_eq!(
        read(&mut c, t, 0, 1).await,
        (0, 0, 0, vec![(0, 1, ACKNOWLEDGED, 1)])
    );
    running.shutdown().await;
}
