//! The data-partition side of transactions over the wire: transactional
//! batches produced raw, WriteTxnMarkers ending them, and what Fetch,
//! ListOffsets and DescribeProducers then say at each isolation level.

mod common;

use bytes::Bytes;
use common::{base_timestamp_ms, start, txn_batch, values, Client};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;
use kafka_protocol::ResponseError;

const TOPIC: &str = "txn";

/// The producers here have no transactional id the coordinator knows (the
/// markers are written by hand), so KIP-890 verification is off, as
/// Kafka's `transaction.partition.verification.enable=false` allows.
const UNVERIFIED: &[(&str, &str)] = &[("transaction.partition.verification.enable", "false")];

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

/// Produces `records` with acks=all as the transactional producer `tx`.
async fn produce_txn(c: &mut Client, records: Bytes) -> i16 {
    let mut pd = produce_request::PartitionProduceData::default();
    pd.records = Some(records);
    let mut td = produce_request::TopicProduceData::default();
    td.name = name(TOPIC);
    td.partition_data = vec![pd];
    let req = ProduceRequest::default()
        .with_transactional_id(Some(TransactionalId(StrBytes::from_static_str("tx"))))
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![td]);
    let resp: ProduceResponse = c.call(ApiKey::Produce, 9, &req).await;
    resp.responses[0].partition_responses[0].error_code
}

/// One WriteTxnMarkers request with one marker; the error per partition.
async fn write_marker(
    c: &mut Client,
    pid: i64,
    coordinator_epoch: i32,
    commit: bool,
    partitions: &[(&str, i32)],
) -> Vec<i16> {
    let topics = partitions
        .iter()
        .map(|(t, p)| {
            write_txn_markers_request::WritableTxnMarkerTopic::default()
                .with_name(name(t))
                .with_partition_indexes(vec![*p])
        })
        .collect();
    let marker = write_txn_markers_request::WritableTxnMarker::default()
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(0)
        .with_transaction_result(commit)
        .with_coordinator_epoch(coordinator_epoch)
        .with_topics(topics);
    let req = WriteTxnMarkersRequest::default().with_markers(vec![marker]);
    let resp: WriteTxnMarkersResponse = c.call(ApiKey::WriteTxnMarkers, 1, &req).await;
    assert_eq!(resp.markers.len(), 1);
    assert_eq!(resp.markers[0].producer_id, ProducerId(pid));
    resp.markers[0]
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
        .collect()
}

/// A consumer fetch of partition 0 from `offset` at `isolation_level`.
async fn fetch(
    c: &mut Client,
    version: i16,
    isolation_level: i8,
    offset: i64,
) -> fetch_response::PartitionData {
    let mut fp = fetch_request::FetchPartition::default();
    fp.fetch_offset = offset;
    fp.partition_max_bytes = 1 << 20;
    fp.current_leader_epoch = -1;
    let mut ft = fetch_request::FetchTopic::default();
    ft.topic = name(TOPIC);
    ft.partitions = vec![fp];
    let mut req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_isolation_level(isolation_level)
        .with_session_epoch(-1)
        .with_topics(vec![ft]);
    if version >= 15 {
        req.replica_id = BrokerId(0);
    }
    let resp: FetchResponse = c.call(ApiKey::Fetch, version, &req).await;
    resp.responses[0].partitions[0].clone()
}

/// ListOffsets for partition 0 at `timestamp` and `isolation_level`.
async fn list_offset(c: &mut Client, isolation_level: i8, timestamp: i64) -> (i16, i64) {
    let mut p = list_offsets_request::ListOffsetsPartition::default();
    p.timestamp = timestamp;
    p.current_leader_epoch = -1;
    let mut t = list_offsets_request::ListOffsetsTopic::default();
    t.name = name(TOPIC);
    t.partitions = vec![p];
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(isolation_level)
        .with_topics(vec![t]);
    let resp: ListOffsetsResponse = c.call(ApiKey::ListOffsets, 7, &req).await;
    let p = &resp.topics[0].partitions[0];
    (p.error_code, p.offset)
}

fn aborted(pd: &fetch_response::PartitionData) -> Option<Vec<(i64, i64)>> {
    pd.aborted_transactions.as_ref().map(|a| {
        a.iter()
            .map(|t| (t.producer_id.0, t.first_offset))
            .collect()
    })
}

async fn producer_id(c: &mut Client) -> i64 {
    let resp: InitProducerIdResponse = c
        .call(
            ApiKey::InitProducerId,
            4,
            &InitProducerIdRequest::default().with_transactional_id(None),
        )
        .await;
    assert_eq!(resp.error_code, 0);
    resp.producer_id.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_committed_sees_a_transaction_only_after_its_marker_and_is_told_what_aborted() {
    let b = start(UNVERIFIED).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic(TOPIC, 1, &[]).await, 0);
    let pid = producer_id(&mut c).await;
    // An open transaction (0, 1), then a plain record (2).
    assert_eq!(
        produce_txn(&mut c, txn_batch(&["a", "b"], pid, 0, 0)).await,
        0
    );
    let plain = c
        .produce(TOPIC, 0, -1, common::batch(&["p"], Compression::None, None))
        .await;
    assert_eq!((plain.error_code, plain.base_offset), (0, 2));
    assert_eq!(list_offset(&mut c, 0, -1).await, (0, 3));
    assert_eq!(list_offset(&mut c, 1, -1).await, (0, 0));
    for version in [4, 12] {
        let committed = fetch(&mut c, version, 1, 0).await;
        assert_eq!(committed.error_code, 0);
        assert_eq!(
            (committed.high_watermark, committed.last_stable_offset),
            (3, 0)
        );
        assert!(values(&committed.records).is_empty(), "v{version}");
        assert_eq!(aborted(&committed), Some(vec![]));
        let uncommitted = fetch(&mut c, version, 0, 0).await;
        assert_eq!(values(&uncommitted.records).len(), 3);
        assert_eq!(uncommitted.last_stable_offset, 0);
        assert_eq!(aborted(&uncommitted), None, "read_uncommitted gets null");
    }
    // The coordinator aborts it: the marker is at 3.
    assert_eq!(
        write_marker(&mut c, pid, 0, false, &[(TOPIC, 0)]).await,
        [0]
    );
    let committed = fetch(&mut c, 12, 1, 0).await;
    assert_eq!(
        (committed.high_watermark, committed.last_stable_offset),
        (4, 4)
    );
    // Everything below the LSO, the marker (3) included: the client drops
    // the aborted records itself, by the list.
    let read = values(&committed.records);
    assert_eq!(
        read[..3],
        [(0, "a".into()), (1, "b".into()), (2, "p".into())]
    );
    assert_eq!(read.iter().map(|r| r.0).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_eq!(aborted(&committed), Some(vec![(pid, 0)]));
    assert_eq!(aborted(&fetch(&mut c, 12, 1, 4).await), Some(vec![]));
    // A second transaction commits; a stale coordinator is fenced.
    assert_eq!(produce_txn(&mut c, txn_batch(&["c"], pid, 0, 2)).await, 0);
    assert_eq!(list_offset(&mut c, 1, -1).await, (0, 4));
    assert_eq!(
        write_marker(&mut c, pid, -1, true, &[(TOPIC, 0)]).await,
        [ResponseError::TransactionCoordinatorFenced.code()]
    );
    assert_eq!(
        write_marker(&mut c, pid, 1, true, &[(TOPIC, 0), ("absent", 0)]).await,
        [0, ResponseError::UnknownTopicOrPartition.code()]
    );
    assert_eq!(list_offset(&mut c, 1, -1).await, (0, 6));
    let committed = fetch(&mut c, 12, 1, 4).await;
    assert_eq!(values(&committed.records)[0], (4, "c".into()));
    assert_eq!(committed.last_stable_offset, 6);
    assert_eq!(aborted(&committed), Some(vec![]));
    // A plain batch from a producer inside a transaction is refused.
    assert_eq!(produce_txn(&mut c, txn_batch(&["d"], pid, 0, 3)).await, 0);
    let plain = c
        .produce(
            TOPIC,
            0,
            -1,
            common::batch(&["e"], Compression::None, Some((pid, 0, 4))),
        )
        .await;
    assert_eq!(plain.error_code, ResponseError::InvalidTxnState.code());
    // Transactional records without a transactional id: refused whole.
    let anonymous = c.produce(TOPIC, 0, -1, txn_batch(&["f"], pid, 0, 4)).await;
    assert_eq!(
        anonymous.error_code,
        ResponseError::TransactionalIdAuthorizationFailed.code()
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_producers_reports_the_open_transaction_and_the_coordinator_epoch() {
    let b = start(UNVERIFIED).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic(TOPIC, 1, &[]).await, 0);
    let pid = producer_id(&mut c).await;
    let plain = c
        .produce(TOPIC, 0, -1, common::batch(&["p"], Compression::None, None))
        .await;
    assert_eq!(plain.error_code, 0);
    assert_eq!(
        produce_txn(&mut c, txn_batch(&["a", "b"], pid, 0, 0)).await,
        0
    );
    let describe = |topics: Vec<(&str, i32)>| {
        DescribeProducersRequest::default().with_topics(
            topics
                .into_iter()
                .map(|(t, p)| {
                    describe_producers_request::TopicRequest::default()
                        .with_name(name(t))
                        .with_partition_indexes(vec![p])
                })
                .collect(),
        )
    };
    let resp: DescribeProducersResponse = c
        .call(ApiKey::DescribeProducers, 0, &describe(vec![(TOPIC, 0)]))
        .await;
    let p = &resp.topics[0].partitions[0];
    assert_eq!(p.error_code, 0);
    assert_eq!(p.active_producers.len(), 1);
    let s = &p.active_producers[0];
    assert_eq!(
        (
            s.producer_id.0,
            s.producer_epoch,
            s.last_sequence,
            s.coordinator_epoch,
            s.current_txn_start_offset
        ),
        (pid, 0, 1, -1, 1)
    );
    assert!(s.last_timestamp >= base_timestamp_ms());
    assert_eq!(write_marker(&mut c, pid, 3, true, &[(TOPIC, 0)]).await, [0]);
    let resp: DescribeProducersResponse = c
        .call(
            ApiKey::DescribeProducers,
            0,
            &describe(vec![(TOPIC, 0), (TOPIC, 7), ("absent", 0), ("bad name", 0)]),
        )
        .await;
    let s = &resp.topics[0].partitions[0].active_producers[0];
    assert_eq!(
        (
            s.last_sequence,
            s.coordinator_epoch,
            s.current_txn_start_offset
        ),
        (1, 3, -1)
    );
    let codes: Vec<i16> = resp
        .topics
        .iter()
        .map(|t| t.partitions[0].error_code)
        .collect();
    assert_eq!(
        codes,
        [
            0,
            ResponseError::UnknownTopicOrPartition.code(),
            ResponseError::UnknownTopicOrPartition.code(),
            ResponseError::InvalidTopicException.code(),
        ]
    );
    b.running.shutdown().await;
}
