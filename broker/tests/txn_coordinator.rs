//! The transaction coordinator over the wire, as a TV1 client drives it:
//! FindCoordinator (key type 1), InitProducerId with a transactional id,
//! AddPartitionsToTxn, transactional Produce, EndTxn, then what
//! read_committed consumers and DescribeTransactions/ListTransactions see;
//! then transaction version 2 (Produce v12 and TxnOffsetCommit v5 adding
//! partitions, EndTxn v5 bumping the epoch) and KIP-890 verification.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{txn_batch, Client};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::RecordBatchDecoder;
use kafka_protocol::ResponseError;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

struct Txn<'a> {
    c: &'a mut Client,
    id: String,
    pid: i64,
    epoch: i16,
    seq: i32,
}

async fn find_coordinator(c: &mut Client, id: &str) -> FindCoordinatorResponse {
    let req = FindCoordinatorRequest::default()
        .with_key(s(id))
        .with_key_type(1);
    c.call(ApiKey::FindCoordinator, 3, &req).await
}

async fn init(c: &mut Client, id: &str, timeout_ms: i32) -> InitProducerIdResponse {
    let req = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(s(id))))
        .with_transaction_timeout_ms(timeout_ms)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    c.call(ApiKey::InitProducerId, 4, &req).await
}

/// InitProducerId until the coordinator stops answering
/// CONCURRENT_TRANSACTIONS (it is finishing an earlier transaction).
async fn init_retrying(c: &mut Client, id: &str, timeout_ms: i32) -> InitProducerIdResponse {
    for _ in 0..100 {
        let r = init(c, id, timeout_ms).await;
        if r.error_code != ResponseError::ConcurrentTransactions.code() {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("InitProducerId kept answering CONCURRENT_TRANSACTIONS");
}

impl<'a> Txn<'a> {
    async fn begin(c: &'a mut Client, id: &str) -> Txn<'a> {
        let found = find_coordinator(c, id).await;
        assert_eq!(found.error_code, 0, "{:?}", found.error_message);
        let r = init_retrying(c, id, 60_000).await;
        assert_eq!(r.error_code, 0);
        Txn {
            c,
            id: id.to_string(),
            pid: r.producer_id.0,
            epoch: r.producer_epoch,
            seq: 0,
        }
    }

    async fn add(&mut self, topic: &str, partitions: &[i32]) -> Vec<(i32, i16)> {
        let req = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(s(&self.id)))
            .with_v3_and_below_producer_id(ProducerId(self.pid))
            .with_v3_and_below_producer_epoch(self.epoch)
            .with_v3_and_below_topics(vec![
                add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
                    .with_name(TopicName(s(topic)))
                    .with_partitions(partitions.to_vec()),
            ]);
        let resp: AddPartitionsToTxnResponse =
            self.c.call(ApiKey::AddPartitionsToTxn, 3, &req).await;
        resp.results_by_topic_v3_and_below
            .iter()
            .flat_map(|t| t.results_by_partition.iter())
            .map(|p| (p.partition_index, p.partition_error_code))
            .collect()
    }

    async fn produce(&mut self, topic: &str, partition: i32, values: &[&str]) -> i16 {
        let batch = txn_batch(values, self.pid, self.epoch, self.seq);
        self.seq += values.len() as i32;
        produce_txn(self.c, &self.id, topic, partition, batch).await
    }

    async fn end(&mut self, commit: bool) -> i16 {
        end_txn(self.c, &self.id, self.pid, self.epoch, commit).await
    }
}

async fn produce_txn(c: &mut Client, id: &str, topic: &str, partition: i32, batch: Bytes) -> i16 {
    produce_at(c, 9, id, topic, partition, batch).await
}

/// A transactional Produce at `version`; the partition's error code.
async fn produce_at(
    c: &mut Client,
    version: i16,
    id: &str,
    topic: &str,
    partition: i32,
    batch: Bytes,
) -> i16 {
    let req = ProduceRequest::default()
        .with_transactional_id(Some(TransactionalId(s(id))))
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![produce_request::TopicProduceData::default()
            .with_name(TopicName(s(topic)))
            .with_partition_data(vec![
                produce_request::PartitionProduceData::default()
                    .with_index(partition)
                    .with_records(Some(batch)),
            ])]);
    let resp: ProduceResponse = c.call(ApiKey::Produce, version, &req).await;
    resp.responses[0].partition_responses[0].error_code
}

/// EndTxn v5 (transaction version 2): the error and the producer id and
/// epoch the client continues with.
async fn end_txn_v5(
    c: &mut Client,
    id: &str,
    pid: i64,
    epoch: i16,
    commit: bool,
) -> (i16, i64, i16) {
    let req = EndTxnRequest::default()
        .with_transactional_id(TransactionalId(s(id)))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_committed(commit);
    let resp: EndTxnResponse = c.call(ApiKey::EndTxn, 5, &req).await;
    (resp.error_code, resp.producer_id.0, resp.producer_epoch)
}

/// EndTxn v5 until it stops answering CONCURRENT_TRANSACTIONS (the
/// previous transaction's markers are still being written), as clients do.
async fn end_txn_v5_retrying(
    c: &mut Client,
    id: &str,
    pid: i64,
    epoch: i16,
    commit: bool,
) -> (i16, i64, i16) {
    for _ in 0..200 {
        let r = end_txn_v5(c, id, pid, epoch, commit).await;
        if r.0 != ResponseError::ConcurrentTransactions.code() {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("EndTxn kept answering CONCURRENT_TRANSACTIONS");
}

/// A TxnOffsetCommit at `version` of `offset` for partition 0 of `topic`,
/// outside any group membership; the partition's error code.
async fn txn_offset_commit(
    c: &mut Client,
    version: i16,
    id: &str,
    (pid, epoch): (i64, i16),
    group: &str,
    topic: &str,
    offset: i64,
) -> i16 {
    let req = TxnOffsetCommitRequest::default()
        .with_transactional_id(TransactionalId(s(id)))
        .with_group_id(GroupId(s(group)))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_generation_id(-1)
        .with_member_id(s(""))
        .with_topics(vec![
            txn_offset_commit_request::TxnOffsetCommitRequestTopic::default()
                .with_name(TopicName(s(topic)))
                .with_partitions(vec![
                    txn_offset_commit_request::TxnOffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(offset),
                ]),
        ]);
    let resp: TxnOffsetCommitResponse = c.call(ApiKey::TxnOffsetCommit, version, &req).await;
    resp.topics[0].partitions[0].error_code
}

/// The group's committed offset of partition 0 of `topic` (-1 for none),
/// stable offsets required.
async fn committed_offset(c: &mut Client, group: &str, topic: &str) -> (i16, i64) {
    let req = OffsetFetchRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_require_stable(true)
        .with_topics(Some(vec![
            offset_fetch_request::OffsetFetchRequestTopic::default()
                .with_name(TopicName(s(topic)))
                .with_partition_indexes(vec![0]),
        ]));
    let resp: OffsetFetchResponse = c.call(ApiKey::OffsetFetch, 7, &req).await;
    let p = &resp.topics[0].partitions[0];
    (p.error_code, p.committed_offset)
}

async fn end_txn(c: &mut Client, id: &str, pid: i64, epoch: i16, commit: bool) -> i16 {
    let req = EndTxnRequest::default()
        .with_transactional_id(TransactionalId(s(id)))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_committed(commit);
    let resp: EndTxnResponse = c.call(ApiKey::EndTxn, 3, &req).await;
    resp.error_code
}

async fn describe(c: &mut Client, id: &str) -> describe_transactions_response::TransactionState {
    let req =
        DescribeTransactionsRequest::default().with_transactional_ids(vec![TransactionalId(s(id))]);
    let resp: DescribeTransactionsResponse = c.call(ApiKey::DescribeTransactions, 0, &req).await;
    resp.transaction_states[0].clone()
}

async fn wait_for_state(c: &mut Client, id: &str, state: &str) {
    for _ in 0..200 {
        if describe(c, id).await.transaction_state.as_str() == state {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "{id} never reached {state}: {:?}",
        describe(c, id).await.transaction_state
    );
}

/// A Fetch (v12) of one partition from `offset` at `isolation_level`.
async fn fetch(
    c: &mut Client,
    topic: &str,
    partition: i32,
    offset: i64,
    isolation_level: i8,
) -> fetch_response::PartitionData {
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_isolation_level(isolation_level)
        .with_session_epoch(-1)
        .with_topics(vec![fetch_request::FetchTopic::default()
            .with_topic(TopicName(s(topic)))
            .with_partitions(vec![fetch_request::FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(1 << 20)
                .with_current_leader_epoch(-1)])]);
    let resp: FetchResponse = c.call(ApiKey::Fetch, 12, &req).await;
    resp.responses[0].partitions[0].clone()
}

/// The data records' values in a fetch answer (control batches left out),
/// as a read_committed consumer keeps them: a producer's records are
/// skipped from the first offset of an aborted transaction the answer lists
/// up to that producer's next marker.
fn committed_values(p: &fetch_response::PartitionData) -> Vec<String> {
    let mut aborted: Vec<(i64, i64)> = p
        .aborted_transactions
        .iter()
        .flatten()
        .map(|a| (a.first_offset, a.producer_id.0))
        .collect();
    aborted.sort();
    let mut aborted = aborted.into_iter().peekable();
    let mut skipping = std::collections::HashSet::new();
    let Some(mut bytes) = p.records.clone() else {
        return vec![];
    };
    let mut out = Vec::new();
    for set in RecordBatchDecoder::decode_all(&mut bytes).unwrap() {
        for r in set.records {
            while let Some((_, pid)) = aborted.next_if(|(first, _)| *first <= r.offset) {
                skipping.insert(pid);
            }
            if r.control {
                skipping.remove(&r.producer_id);
                continue;
            }
            if skipping.contains(&r.producer_id) {
                continue;
            }
            out.push(String::from_utf8(r.value.unwrap().to_vec()).unwrap());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_transaction_becomes_visible_to_read_committed() {
    let b = common::start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("orders", 2, &[]).await, 0);
    let mut reader = Client::connect(b.running.local_addr).await;

    let mut tx = Txn::begin(&mut c, "tx-commit").await;
    assert_eq!(tx.epoch, 0);
    assert_eq!(tx.add("orders", &[0, 1]).await, vec![(0, 0), (1, 0)]);
    assert_eq!(tx.produce("orders", 0, &["a", "b"]).await, 0);
    assert_eq!(tx.produce("orders", 1, &["c"]).await, 0);
    // Open: read_uncommitted sees the records, read_committed does not.
    assert_eq!(
        committed_values(&fetch(&mut reader, "orders", 0, 0, 0).await),
        ["a", "b"]
    );
    let open = fetch(&mut reader, "orders", 0, 0, 1).await;
    assert_eq!(open.last_stable_offset, 0);
    assert!(committed_values(&open).is_empty());
    let d = describe(tx.c, "tx-commit").await;
    assert_eq!(d.transaction_state.as_str(), "Ongoing");
    assert_eq!(d.topics[0].partitions, vec![0, 1]);

    assert_eq!(tx.end(true).await, 0);
    wait_for_state(tx.c, "tx-commit", "CompleteCommit").await;
    let p0 = fetch(&mut reader, "orders", 0, 0, 1).await;
    assert_eq!(committed_values(&p0), ["a", "b"]);
    assert_eq!(
        p0.last_stable_offset, 3,
        "two records and the commit marker"
    );
    assert_eq!(
        committed_values(&fetch(&mut reader, "orders", 1, 0, 1).await),
        ["c"]
    );
    // A retried EndTxn of a completed commit succeeds; an abort does not.
    assert_eq!(tx.end(true).await, 0);
    assert_eq!(tx.end(false).await, ResponseError::InvalidTxnState.code());

    let list: ListTransactionsResponse = c
        .call(
            ApiKey::ListTransactions,
            1,
            &ListTransactionsRequest::default().with_duration_filter(-1),
        )
        .await;
    let names: Vec<(String, String)> = list
        .transaction_states
        .iter()
        .map(|t| {
            (
                t.transactional_id.to_string(),
                t.transaction_state.to_string(),
            )
        })
        .collect();
    assert_eq!(
        names,
        vec![("tx-commit".to_string(), "CompleteCommit".to_string())]
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_transaction_stays_invisible_to_read_committed() {
    let b = common::start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("t", 1, &[]).await, 0);
    let mut reader = Client::connect(b.running.local_addr).await;

    let mut tx = Txn::begin(&mut c, "tx-abort").await;
    tx.add("t", &[0]).await;
    assert_eq!(tx.produce("t", 0, &["gone-1", "gone-2"]).await, 0);
    assert_eq!(tx.end(false).await, 0);
    wait_for_state(tx.c, "tx-abort", "CompleteAbort").await;
    // The next transaction of the same producer commits.
    tx.add("t", &[0]).await;
    assert_eq!(tx.produce("t", 0, &["kept"]).await, 0);
    assert_eq!(tx.end(true).await, 0);
    wait_for_state(tx.c, "tx-abort", "CompleteCommit").await;

    let p = fetch(&mut reader, "t", 0, 0, 1).await;
    let aborted = p.aborted_transactions.clone().unwrap_or_default();
    assert_eq!(aborted.len(), 1, "{aborted:?}");
    assert_eq!(aborted[0].first_offset, 0);
    assert_eq!(committed_values(&p), ["kept"]);
    // read_uncommitted gets everything and no aborted list.
    let raw = fetch(&mut reader, "t", 0, 0, 0).await;
    assert_eq!(
        common::values(&raw.records).len(),
        5,
        "3 records, 2 markers"
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_producer_with_the_same_id_fences_the_first() {
    let b = common::start(&[]).await;
    let mut c1 = Client::connect(b.running.local_addr).await;
    let mut c2 = Client::connect(b.running.local_addr).await;
    assert_eq!(c1.create_topic("f", 1, &[]).await, 0);
    let mut reader = Client::connect(b.running.local_addr).await;

    let mut first = Txn::begin(&mut c1, "tx-fence").await;
    first.add("f", &[0]).await;
    assert_eq!(first.produce("f", 0, &["zombie"]).await, 0);
    // The second instance's InitProducerId aborts the open transaction at a
    // bumped epoch, then (on retry) gets the next epoch itself.
    let second = init_retrying(&mut c2, "tx-fence", 60_000).await;
    assert_eq!(second.error_code, 0);
    assert_eq!(second.producer_id.0, first.pid);
    assert_eq!(second.producer_epoch, first.epoch + 2);
    assert_eq!(
        describe(&mut c2, "tx-fence")
            .await
            .transaction_state
            .as_str(),
        "Empty"
    );
    // The zombie can neither write nor end its transaction.
    assert_eq!(first.end(true).await, ResponseError::ProducerFenced.code());
    assert_eq!(
        first.add("f", &[0]).await,
        vec![(0, ResponseError::ProducerFenced.code())]
    );
    assert_ne!(first.produce("f", 0, &["late"]).await, 0);
    let p = fetch(&mut reader, "f", 0, 0, 1).await;
    assert!(
        committed_values(&p).is_empty(),
        "{:?}",
        committed_values(&p)
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_past_its_timeout_is_aborted_by_the_coordinator() {
    let b = common::start(&[(
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        "100",
    )])
    .await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("slow", 1, &[]).await, 0);
    assert_eq!(find_coordinator(&mut c, "tx-slow").await.error_code, 0);
    let r = init(&mut c, "tx-slow", 300).await;
    assert_eq!(r.error_code, 0);
    let mut tx = Txn {
        c: &mut c,
        id: "tx-slow".into(),
        pid: r.producer_id.0,
        epoch: r.producer_epoch,
        seq: 0,
    };
    tx.add("slow", &[0]).await;
    assert_eq!(tx.produce("slow", 0, &["late"]).await, 0);
    wait_for_state(tx.c, "tx-slow", "CompleteAbort").await;
    let d = describe(tx.c, "tx-slow").await;
    assert_eq!(
        d.producer_epoch,
        tx.epoch + 1,
        "the abort fenced the producer"
    );
    assert_eq!(tx.end(true).await, ResponseError::ProducerFenced.code());
    let mut reader = Client::connect(b.running.local_addr).await;
    let p = fetch(&mut reader, "slow", 0, 0, 1).await;
    assert_eq!(p.last_stable_offset, 2, "the record and the abort marker");
    assert!(committed_values(&p).is_empty());
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_state_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::config(dir.path(), &[]);
    let running = broker::start(cfg.clone()).await.unwrap();
    let mut c = Client::connect(running.local_addr).await;
    assert_eq!(c.create_topic("r", 1, &[]).await, 0);
    let (pid, epoch) = {
        let mut tx = Txn::begin(&mut c, "tx-restart").await;
        tx.add("r", &[0]).await;
        assert_eq!(tx.produce("r", 0, &["x"]).await, 0);
        assert_eq!(tx.end(true).await, 0);
        wait_for_state(tx.c, "tx-restart", "CompleteCommit").await;
        (tx.pid, tx.epoch)
    };
    drop(c);
    running.shutdown().await;

    let running = broker::start(cfg).await.unwrap();
    let mut c = Client::connect(running.local_addr).await;
    let d = describe(&mut c, "tx-restart").await;
    assert_eq!(d.error_code, 0);
    assert_eq!(
        (
            d.producer_id.0,
            d.producer_epoch,
            d.transaction_state.as_str()
        ),
        (pid, epoch, "CompleteCommit")
    );
    let again = init_retrying(&mut c, "tx-restart", 60_000).await;
    assert_eq!(
        (again.producer_id.0, again.producer_epoch),
        (pid, epoch + 1)
    );
    assert_eq!(committed_values(&fetch(&mut c, "r", 0, 0, 1).await), ["x"]);
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_transactional_requests_get_kafkas_errors() {
    let b = common::start(&[("transaction.max.timeout.ms", "1000")]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("e", 1, &[]).await, 0);
    assert_eq!(find_coordinator(&mut c, "tx-e").await.error_code, 0);
    assert_eq!(
        init(&mut c, "tx-e", 5_000).await.error_code,
        ResponseError::InvalidTransactionTimeout.code()
    );
    assert_eq!(
        init(&mut c, "", 500).await.error_code,
        ResponseError::InvalidRequest.code()
    );
    assert_eq!(
        end_txn(&mut c, "tx-unknown", 1, 0, true).await,
        ResponseError::InvalidProducerIdMapping.code()
    );
    let r = init(&mut c, "tx-e", 500).await;
    assert_eq!(r.error_code, 0);
    let mut tx = Txn {
        c: &mut c,
        id: "tx-e".into(),
        pid: r.producer_id.0,
        epoch: r.producer_epoch,
        seq: 0,
    };
    // Nothing was added: there is no transaction to end.
    assert_eq!(tx.end(true).await, ResponseError::InvalidTxnState.code());
    // A partition of an unknown topic fails the whole request, the others
    // not attempted.
    let mut results = tx.add("nope", &[0]).await;
    results.sort();
    assert_eq!(
        results,
        vec![(0, ResponseError::UnknownTopicOrPartition.code())]
    );
    assert_eq!(
        describe(tx.c, "tx-e").await.transaction_state.as_str(),
        "Empty"
    );
    let mut wrong_pid = Txn {
        c: tx.c,
        id: "tx-e".into(),
        pid: r.producer_id.0 + 1000,
        epoch: r.producer_epoch,
        seq: 0,
    };
    assert_eq!(
        wrong_pid.add("e", &[0]).await,
        vec![(0, ResponseError::InvalidProducerIdMapping.code())]
    );
    let d = describe(wrong_pid.c, "never-seen").await;
    assert_eq!(d.error_code, ResponseError::TransactionalIdNotFound.code());
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_2_transaction_is_added_by_the_leader_and_bumps_the_epoch_when_it_ends() {
    let b = common::start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("v2", 2, &[]).await, 0);
    let mut reader = Client::connect(b.running.local_addr).await;
    let tx = Txn::begin(&mut c, "tx-v2").await;
    let (pid, id) = (tx.pid, tx.id.clone());

    // Produce v12 with no AddPartitionsToTxn: the leader adds each partition.
    for p in [0, 1] {
        let batch = txn_batch(&["a"], pid, 0, 0);
        assert_eq!(produce_at(tx.c, 12, &id, "v2", p, batch).await, 0);
    }
    let d = describe(tx.c, &id).await;
    assert_eq!(
        (d.transaction_state.as_str(), d.topics[0].partitions.clone()),
        ("Ongoing", vec![0, 1])
    );
    assert_eq!(end_txn_v5(tx.c, &id, pid, 0, true).await, (0, pid, 1));
    // The client continues at epoch 1, sequences from 0.
    assert_eq!(
        produce_at(tx.c, 12, &id, "v2", 0, txn_batch(&["b"], pid, 1, 0)).await,
        0
    );
    // Right after the commit's answer its markers may still be in flight:
    // the abort waits (CONCURRENT_TRANSACTIONS) until they are written.
    assert_eq!(
        end_txn_v5_retrying(tx.c, &id, pid, 1, false).await,
        (0, pid, 2)
    );
    // A retry of that abort (its answer lost) succeeds with the same answer;
    // a commit at the old epoch is a different request and is fenced... by
    // state: the transaction it would retry was an abort.
    wait_for_state(tx.c, &id, "CompleteAbort").await;
    assert_eq!(end_txn_v5(tx.c, &id, pid, 1, false).await, (0, pid, 2));
    assert_eq!(
        end_txn_v5(tx.c, &id, pid, 1, true).await.0,
        ResponseError::InvalidTxnState.code()
    );
    assert_eq!(
        end_txn_v5(tx.c, &id, pid, 0, true).await.0,
        ResponseError::ProducerFenced.code()
    );
    // A straggler of the committed transaction (epoch 0) is fenced by the
    // bumped epoch its marker carried.
    assert_eq!(
        produce_at(tx.c, 12, &id, "v2", 1, txn_batch(&["late"], pid, 0, 1)).await,
        ResponseError::InvalidProducerEpoch.code()
    );
    assert_eq!(
        committed_values(&fetch(&mut reader, "v2", 0, 0, 1).await),
        ["a"]
    );
    assert_eq!(
        committed_values(&fetch(&mut reader, "v2", 1, 0, 1).await),
        ["a"]
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_batch_the_coordinator_does_not_know_is_refused_unappended() {
    let b = common::start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("vf", 1, &[]).await, 0);
    let mut reader = Client::connect(b.running.local_addr).await;
    let mut tx = Txn::begin(&mut c, "tx-verify").await;
    let (pid, id) = (tx.pid, tx.id.clone());

    // KIP-890 part 1: the partition was never added to the transaction.
    let batch = txn_batch(&["hang"], pid, 0, 0);
    assert_eq!(
        produce_at(tx.c, 11, &id, "vf", 0, batch.clone()).await,
        ResponseError::TransactionAbortable.code()
    );
    assert_eq!(
        produce_at(tx.c, 9, &id, "vf", 0, batch.clone()).await,
        ResponseError::InvalidTxnState.code()
    );
    assert_eq!(fetch(&mut reader, "vf", 0, 0, 0).await.high_watermark, 0);
    // Once added, the same batch is appended.
    assert_eq!(tx.add("vf", &[0]).await, vec![(0, 0)]);
    assert_eq!(produce_at(tx.c, 11, &id, "vf", 0, batch).await, 0);
    tx.seq = 1;
    assert_eq!(tx.end(true).await, 0);
    wait_for_state(tx.c, &id, "CompleteCommit").await;
    // The next transaction's first batch is checked again: the producer
    // did not add the partition this time.
    assert_eq!(
        produce_at(tx.c, 11, &id, "vf", 0, txn_batch(&["x"], pid, 0, 1)).await,
        ResponseError::TransactionAbortable.code()
    );
    assert_eq!(
        committed_values(&fetch(&mut reader, "vf", 0, 0, 1).await),
        ["hang"]
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_offset_commit_v5_adds_the_groups_partition_and_v3_must_find_it_added() {
    let b = common::start(&[("offsets.topic.num.partitions", "3")]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("in", 1, &[]).await, 0);
    // As a client does, find the group's coordinator first (which creates
    // `__consumer_offsets`).
    let found: FindCoordinatorResponse = c
        .call(
            ApiKey::FindCoordinator,
            3,
            &FindCoordinatorRequest::default().with_key(s("g5")),
        )
        .await;
    assert_eq!(found.error_code, 0);
    let tx = Txn::begin(&mut c, "tx-offsets").await;
    let (pid, id) = (tx.pid, tx.id.clone());

    // Before v5 the client must have called AddOffsetsToTxn.
    assert_eq!(
        txn_offset_commit(tx.c, 3, &id, (pid, 0), "g5", "in", 7).await,
        ResponseError::InvalidTxnState.code()
    );
    // v5: the group coordinator adds `__consumer_offsets` for the client.
    assert_eq!(
        txn_offset_commit(tx.c, 5, &id, (pid, 0), "g5", "in", 7).await,
        0
    );
    let d = describe(tx.c, &id).await;
    assert_eq!(d.transaction_state.as_str(), "Ongoing");
    assert_eq!(d.topics[0].topic.as_str(), "__consumer_offsets");
    assert_eq!(
        committed_offset(tx.c, "g5", "in").await.0,
        ResponseError::UnstableOffsetCommit.code()
    );
    assert_eq!(end_txn_v5(tx.c, &id, pid, 0, true).await, (0, pid, 1));
    wait_for_state(tx.c, &id, "CompleteCommit").await;
    assert_eq!(committed_offset(tx.c, "g5", "in").await, (0, 7));
    // A fenced epoch is refused before anything is stored.
    assert_eq!(
        txn_offset_commit(tx.c, 5, &id, (pid, 0), "g5", "in", 9).await,
        ResponseError::InvalidProducerEpoch.code()
    );
    assert_eq!(committed_offset(tx.c, "g5", "in").await, (0, 7));
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_versions_finalizes_share_groups_and_the_configured_transaction_version() {
    async fn level(extra: &[(&str, &str)]) -> (Vec<(String, i16, i16)>, Vec<(String, i16)>) {
        let b = common::start(extra).await;
        let mut c = Client::connect(b.running.local_addr).await;
        let req = ApiVersionsRequest::default()
            .with_client_software_name(s("t"))
            .with_client_software_version(s("1"));
        let resp: ApiVersionsResponse = c.call(ApiKey::ApiVersions, 3, &req).await;
        b.running.shutdown().await;
        (
            resp.supported_features
                .iter()
                .map(|f| (f.name.to_string(), f.min_version, f.max_version))
                .collect(),
            resp.finalized_features
                .iter()
                .map(|f| (f.name.to_string(), f.max_version_level))
                .collect(),
        )
    }
    let tv = "transaction.version".to_string();
    // share.version 2: share groups with their DLQ, as a new Kafka 4.4 cluster.
    let sv = "share.version".to_string();
    assert_eq!(
        level(&[]).await,
        (
            vec![(sv.clone(), 0, 2), (tv.clone(), 0, 2)],
            vec![(sv.clone(), 2), (tv.clone(), 2)]
        )
    );
    assert_eq!(
        level(&[("transaction.version", "1")]).await.1,
        vec![(sv.clone(), 2), (tv, 1)]
    );
    assert_eq!(
        level(&[("transaction.version", "0")]).await.1,
        vec![(sv, 2)]
    );
}

/// franz-go ends an empty transaction with an abort at the new epoch right
/// after a commit's answer, while that commit's markers may still be in
/// flight. Kafka 4.4 answers CONCURRENT_TRANSACTIONS there (a state change
/// is in progress) and the client retries; PRODUCER_FENCED would be fatal
/// to it. Here the markers cannot be written until the partition's leader
/// is back, so the window stays open as long as the test needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_end_at_the_new_epoch_waits_while_the_last_commits_markers_are_in_flight() {
    use common::cluster::TestCluster;
    let mut cluster = TestCluster::start(
        3,
        46740,
        &[
            ("transaction.state.log.num.partitions", "1"),
            ("replica.fetch.wait.max.ms", "100"),
        ],
    )
    .await;
    let id = "tx-markers-in-flight";
    let mut c = cluster.client(1).await;
    let mut coordinator = -1;
    for _ in 0..100 {
        let found = find_coordinator(&mut c, id).await;
        if found.error_code == 0 {
            coordinator = found.node_id.0;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(coordinator > 0, "no transaction coordinator");
    // The data partition lives on another node, alone.
    let far = (1..=3).find(|&n| n != coordinator).unwrap();
    let mut t = create_topics_request::CreatableTopic::default();
    t.name = TopicName(s("far"));
    t.num_partitions = -1;
    t.replication_factor = -1;
    t.assignments = vec![create_topics_request::CreatableReplicaAssignment::default()
        .with_partition_index(0)
        .with_broker_ids(vec![BrokerId(far)])];
    let req = CreateTopicsRequest::default()
        .with_topics(vec![t])
        .with_timeout_ms(10_000);
    let resp: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &req).await;
    assert_eq!(resp.topics[0].error_code, 0);
    cluster
        .wait_for_images("far everywhere", Duration::from_secs(10), |img| {
            img.topics.contains_key("far")
        })
        .await;

    let mut co = cluster.client(coordinator).await;
    let r = init_retrying(&mut co, id, 60_000).await;
    assert_eq!(r.error_code, 0);
    let pid = r.producer_id.0;
    let mut leader = cluster.client(far).await;
    assert_eq!(
        produce_at(&mut leader, 12, id, "far", 0, txn_batch(&["x"], pid, 0, 0)).await,
        0
    );
    drop(leader);
    cluster.stop(far).await;
    // The commit is answered once PrepareCommit is written; its marker
    // waits for the partition's leader.
    assert_eq!(end_txn_v5(&mut co, id, pid, 0, true).await, (0, pid, 1));
    assert_eq!(
        describe(&mut co, id).await.transaction_state.as_str(),
        "PrepareCommit"
    );
    for commit in [false, true] {
        assert_eq!(
            end_txn_v5(&mut co, id, pid, 1, commit).await.0,
            ResponseError::ConcurrentTransactions.code(),
            "commit {commit} at the new epoch"
        );
    }
    // The leader comes back, the marker is written, and the same abort of
    // an empty transaction goes through.
    cluster.restart(far).await;
    assert_eq!(
        end_txn_v5_retrying(&mut co, id, pid, 1, false).await,
        (0, pid, 2)
    );
    drop(co);
    drop(c);
    cluster.shutdown().await;
}
