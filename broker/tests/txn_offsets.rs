//! TxnOffsetCommit over the wire: a transaction's offsets are pending
//! (invisible to OffsetFetch, UNSTABLE_OFFSET_COMMIT when stable offsets
//! are required) until the transaction marker ends them, which WriteTxnMarkers
//! reports through `GroupService::on_txn_marker`; here the test calls it.

mod common;

use bytes::Bytes;
use common::{start, Client, TestBroker};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::RecordBatchDecoder;
use kafka_protocol::ResponseError;

const NONE: i16 = 0;
const PID: i64 = 5000;
const OFFSETS: &str = "__consumer_offsets";

/// Without a transaction coordinator in these tests, the producer is
/// made up: KIP-890 verification (which would find no such producer) is
/// off, as Kafka's `transaction.partition.verification.enable=false` allows.
const FAST: &[(&str, &str)] = &[
    ("group.initial.rebalance.delay.ms", "0"),
    ("offsets.topic.num.partitions", "3"),
    ("transaction.partition.verification.enable", "false"),
];

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn unstable() -> i16 {
    ResponseError::UnstableOffsetCommit.code()
}

/// A TxnOffsetCommit at `version` from producer `PID` at `epoch`, without
/// group membership; the error code per partition.
async fn txn_commit(
    c: &mut Client,
    version: i16,
    group: &str,
    epoch: i16,
    topic: &str,
    offsets: &[(i32, i64)],
) -> Vec<i16> {
    txn_commit_as(c, version, group, epoch, -1, topic, offsets).await
}

async fn txn_commit_as(
    c: &mut Client,
    version: i16,
    group: &str,
    epoch: i16,
    generation: i32,
    topic: &str,
    offsets: &[(i32, i64)],
) -> Vec<i16> {
    let mut t = txn_offset_commit_request::TxnOffsetCommitRequestTopic::default();
    t.name = TopicName(s(topic));
    t.partitions = offsets
        .iter()
        .map(|&(p, o)| {
            let mut x = txn_offset_commit_request::TxnOffsetCommitRequestPartition::default();
            x.partition_index = p;
            x.committed_offset = o;
            x.committed_leader_epoch = 0;
            x.committed_metadata = Some(s(&format!("txn-{o}")));
            x
        })
        .collect();
    let r: TxnOffsetCommitResponse = c
        .call(
            ApiKey::TxnOffsetCommit,
            version,
            &TxnOffsetCommitRequest::default()
                .with_transactional_id(TransactionalId(s("txn")))
                .with_group_id(GroupId(s(group)))
                .with_producer_id(ProducerId(PID))
                .with_producer_epoch(epoch)
                .with_generation_id(generation)
                .with_topics(vec![t]),
        )
        .await;
    assert_eq!(r.topics.len(), 1);
    r.topics[0]
        .partitions
        .iter()
        .map(|p| p.error_code)
        .collect()
}

async fn plain_commit(c: &mut Client, group: &str, topic: &str, partition: i32, offset: i64) {
    let mut p = offset_commit_request::OffsetCommitRequestPartition::default();
    p.partition_index = partition;
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
                .with_topics(vec![t]),
        )
        .await;
    assert_eq!(r.topics[0].partitions[0].error_code, NONE);
}

/// (partition, committed offset, error code) from OffsetFetch v8.
async fn fetch_offsets(
    c: &mut Client,
    group: &str,
    topic: &str,
    partitions: &[i32],
    require_stable: bool,
) -> Vec<(i32, i64, i16)> {
    let mut t = offset_fetch_request::OffsetFetchRequestTopics::default();
    t.name = TopicName(s(topic));
    t.partition_indexes = partitions.to_vec();
    let mut g = offset_fetch_request::OffsetFetchRequestGroup::default();
    g.group_id = GroupId(s(group));
    g.topics = Some(vec![t]);
    let r: OffsetFetchResponse = c
        .call(
            ApiKey::OffsetFetch,
            8,
            &OffsetFetchRequest::default()
                .with_groups(vec![g])
                .with_require_stable(require_stable),
        )
        .await;
    assert_eq!(r.groups[0].error_code, NONE);
    r.groups[0]
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter())
        .map(|p| (p.partition_index, p.committed_offset, p.error_code))
        .collect()
}

/// The same through OffsetFetch v7, the last version with one group and
/// the first with require_stable.
async fn fetch_offsets_v7(
    c: &mut Client,
    group: &str,
    topic: &str,
    partitions: &[i32],
) -> Vec<(i32, i64, i16)> {
    let mut t = offset_fetch_request::OffsetFetchRequestTopic::default();
    t.name = TopicName(s(topic));
    t.partition_indexes = partitions.to_vec();
    let r: OffsetFetchResponse = c
        .call(
            ApiKey::OffsetFetch,
            7,
            &OffsetFetchRequest::default()
                .with_group_id(GroupId(s(group)))
                .with_topics(Some(vec![t]))
                .with_require_stable(true),
        )
        .await;
    assert_eq!(r.error_code, NONE);
    r.topics
        .iter()
        .flat_map(|t| t.partitions.iter())
        .map(|p| (p.partition_index, p.committed_offset, p.error_code))
        .collect()
}

/// A broker with topic `in` (2 partitions) and the offsets topic; returns
/// the `__consumer_offsets` partition of `group`.
async fn setup(b: &TestBroker, c: &mut Client, group: &str) -> i32 {
    assert_eq!(c.create_topic("in", 2, &[]).await, NONE);
    let r: FindCoordinatorResponse = c
        .call(
            ApiKey::FindCoordinator,
            6,
            &FindCoordinatorRequest::default().with_coordinator_keys(vec![s(group)]),
        )
        .await;
    assert_eq!(r.coordinators[0].error_code, NONE);
    broker::coordinator::partition_of(&b.running.broker, group)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_offsets_are_pending_until_the_commit_marker() {
    let b = start(FAST).await;
    let mut c = Client::connect(b.running.local_addr).await;
    let partition = setup(&b, &mut c, "g").await;
    plain_commit(&mut c, "g", "in", 0, 3).await;

    assert_eq!(
        txn_commit(&mut c, 3, "g", 0, "in", &[(0, 10), (1, 20)]).await,
        vec![NONE, NONE]
    );
    // Not visible: the last committed offset, or none.
    assert_eq!(
        fetch_offsets(&mut c, "g", "in", &[0, 1], false).await,
        vec![(0, 3, NONE), (1, -1, NONE)]
    );
    // A read_committed consumer is told to wait.
    assert_eq!(
        fetch_offsets(&mut c, "g", "in", &[0, 1], true).await,
        vec![(0, -1, unstable()), (1, -1, unstable())]
    );
    assert_eq!(
        fetch_offsets_v7(&mut c, "g", "in", &[0, 1]).await,
        vec![(0, -1, unstable()), (1, -1, unstable())]
    );

    b.running
        .broker
        .groups
        .on_txn_marker(partition, PID, true)
        .await;
    let committed = vec![(0, 10, NONE), (1, 20, NONE)];
    assert_eq!(
        fetch_offsets(&mut c, "g", "in", &[0, 1], true).await,
        committed
    );
    assert_eq!(
        fetch_offsets(&mut c, "g", "in", &[0, 1], false).await,
        committed
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_transaction_leaves_the_groups_offsets_where_they_were() {
    let b = start(FAST).await;
    let mut c = Client::connect(b.running.local_addr).await;
    let partition = setup(&b, &mut c, "g").await;
    plain_commit(&mut c, "g", "in", 0, 3).await;
    assert_eq!(
        txn_commit(&mut c, 2, "g", 0, "in", &[(0, 10), (1, 20)]).await,
        vec![NONE, NONE]
    );
    // A marker of another producer ends nothing here.
    b.running
        .broker
        .groups
        .on_txn_marker(partition, PID + 1, true)
        .await;
    assert_eq!(
        fetch_offsets(&mut c, "g", "in", &[0], true).await,
        vec![(0, -1, unstable())]
    );
    b.running
        .broker
        .groups
        .on_txn_marker(partition, PID, false)
        .await;
    assert_eq!(
        fetch_offsets(&mut c, "g", "in", &[0, 1], true).await,
        vec![(0, 3, NONE), (1, -1, NONE)]
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offsets_are_written_as_transactional_batches_of_the_producer() {
    let b = start(FAST).await;
    let mut c = Client::connect(b.running.local_addr).await;
    let partition = setup(&b, &mut c, "g").await;
    // Two commits of one transaction (TV1: the same epoch), then one of
    // the next transaction at the same epoch: every batch must land, none
    // taken for a duplicate of the one before.
    for (version, offset) in [(0, 1), (3, 2)] {
        assert_eq!(
            txn_commit(&mut c, version, "g", 7, "in", &[(0, offset)]).await,
            vec![NONE]
        );
    }
    b.running
        .broker
        .groups
        .on_txn_marker(partition, PID, true)
        .await;
    assert_eq!(
        txn_commit(&mut c, 4, "g", 7, "in", &[(1, 3)]).await,
        vec![NONE]
    );
    let data = c.fetch(OFFSETS, partition, 0, 0).await;
    let mut bytes: Bytes = data.records.expect("records");
    let mut seen = Vec::new();
    while !bytes.is_empty() {
        let set = RecordBatchDecoder::decode(&mut bytes).unwrap();
        for r in set.records {
            seen.push((r.transactional, r.producer_id, r.producer_epoch, r.sequence));
        }
    }
    assert_eq!(
        seen,
        vec![(true, PID, 7, 0), (true, PID, 7, 1), (true, PID, 7, 2)]
    );
    assert_eq!(
        fetch_offsets(&mut c, "g", "in", &[0, 1], false).await,
        vec![(0, 2, NONE), (1, -1, NONE)],
        "the second transaction is still open"
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_producer_epoch_cannot_commit_offsets() {
    let b = start(FAST).await;
    let mut c = Client::connect(b.running.local_addr).await;
    setup(&b, &mut c, "g").await;
    assert_eq!(
        txn_commit(&mut c, 3, "g", 5, "in", &[(0, 1)]).await,
        vec![NONE]
    );
    assert_eq!(
        txn_commit(&mut c, 3, "g", 4, "in", &[(0, 2)]).await,
        vec![ResponseError::InvalidProducerEpoch.code()]
    );
    // A bumped epoch starts its sequences again.
    assert_eq!(
        txn_commit(&mut c, 3, "g", 6, "in", &[(0, 3)]).await,
        vec![NONE]
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_the_group_or_the_topics_refuse_get_kafkas_errors() {
    let b = start(FAST).await;
    let mut c = Client::connect(b.running.local_addr).await;
    setup(&b, &mut c, "g").await;
    // A generation for a group that does not exist.
    assert_eq!(
        txn_commit_as(&mut c, 3, "nobody", 0, 4, "in", &[(0, 1)]).await,
        vec![ResponseError::IllegalGeneration.code()]
    );
    // Unknown partitions are answered before the group is asked.
    assert_eq!(
        txn_commit(&mut c, 3, "g", 0, "in", &[(0, 1), (9, 1)]).await,
        vec![NONE, ResponseError::UnknownTopicOrPartition.code()]
    );
    assert_eq!(
        txn_commit(&mut c, 3, "g", 0, "missing", &[(0, 1)]).await,
        vec![ResponseError::UnknownTopicOrPartition.code()]
    );
    assert_eq!(
        txn_commit(&mut c, 3, "", 0, "in", &[(0, 1)]).await,
        vec![ResponseError::InvalidGroupId.code()]
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_offsets_survive_a_restart_and_the_transaction_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::config(dir.path(), FAST);
    let running = broker::start(cfg.clone()).await.unwrap();
    let b = TestBroker { running, dir };
    let mut c = Client::connect(b.running.local_addr).await;
    let partition = setup(&b, &mut c, "g").await;
    plain_commit(&mut c, "g", "in", 0, 3).await;
    assert_eq!(
        txn_commit(&mut c, 3, "g", 0, "in", &[(0, 10)]).await,
        vec![NONE]
    );
    let TestBroker { running, dir } = b;
    running.shutdown().await;

    // No marker in the log: the offset is still pending after the load.
    let running = broker::start(cfg).await.unwrap();
    let b = TestBroker { running, dir };
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(
        fetch_offsets(&mut c, "g", "in", &[0, 1], true).await,
        vec![(0, -1, unstable()), (1, -1, NONE)]
    );
    assert_eq!(
        fetch_offsets(&mut c, "g", "in", &[0], false).await,
        vec![(0, 3, NONE)]
    );
    // The same producer goes on: its next batch continues the sequence
    // the log holds.
    assert_eq!(
        txn_commit(&mut c, 3, "g", 0, "in", &[(1, 20)]).await,
        vec![NONE]
    );
    b.running
        .broker
        .groups
        .on_txn_marker(partition, PID, true)
        .await;
    assert_eq!(
        fetch_offsets(&mut c, "g", "in", &[0, 1], true).await,
        vec![(0, 10, NONE), (1, 20, NONE)]
    );
    b.running.shutdown().await;
}
