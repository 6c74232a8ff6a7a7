//! Produce (key 0): validate each partition's batch, append as leader,
//! answer per partition. v0-2 are advertised (librdkafka needs to see them,
//! KAFKA-18659) but rejected, as Kafka 4 does.
//!
//! Only the leader appends (NOT_LEADER_OR_FOLLOWER elsewhere, naming the
//! current leader from v10, KIP-951). acks=1 answers after the local append;
//! acks=-1 first requires the ISR to hold `min.insync.replicas`
//! (NOT_ENOUGH_REPLICAS, nothing appended), then waits until the high
//! watermark passes the batch (Kafka's `DelayedProduce`), at most
//! `timeout_ms` (REQUEST_TIMED_OUT). While it waits, losing leadership
//! answers NOT_LEADER_OR_FOLLOWER and the ISR falling below
//! `min.insync.replicas` answers NOT_ENOUGH_REPLICAS_AFTER_APPEND at once
//! (Kafka would freeze the high watermark and time out; the error is the
//! one its `checkEnoughReplicasReachOffset` would give, sooner).
//!
//! Transactional records need the request's `transactional_id`: without
//! one Kafka answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED for every
//! partition. A producer's first batch of a transaction on a partition is
//! appended only once the transaction coordinator confirms it (KIP-890,
//! Kafka's `AddPartitionsToTxnManager`): v0-11 have it verify that the
//! client added the partition (part 1, which keeps a late batch from
//! opening a transaction no marker will close); v12 (transaction version
//! 2) has it add the partition for the client (part 2). Verification is
//! skipped when `transaction.partition.verification.enable` is false, as in
//! Kafka; adding never is.
//!
//! The wait happens inside the handler, so later requests on the same
//! connection wait too. That is Kafka's behaviour: its network layer mutes a
//! channel from the moment a request is read until its response is sent, so
//! a connection never has two requests in progress, and pipelined produce
//! requests from an idempotent producer are appended in the order sent.

use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::ResponseError;
use protocol::record_batch::RecordBatchView;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use super::leader_hints::LeaderHints;
use super::str_bytes;
use crate::broker::{now_ms, Broker};
use crate::error::PartitionError;
use crate::partition::validate::RecordErrors;
use crate::replica_manager::PartitionRef;
use crate::txn::service::TxnCheck;
use crate::txn::TxnError;
use crate::types::{Offset, TopicPartition};

/// The first Produce version Kafka 4 accepts.
const MIN_ACCEPTED_VERSION: i16 = 3;

fn partition_error(index: i32, err: &PartitionError) -> PartitionProduceResponse {
    let mut p = PartitionProduceResponse::default();
    p.index = index;
    p.error_code = err.code();
    p.base_offset = -1;
    p.log_append_time_ms = -1;
    p.log_start_offset = -1;
    p.error_message = err.message().map(str_bytes);
    // v8+ name the offending records, so a client fails only those and
    // reports the rest of the batch as collateral (as against Kafka).
    if let PartitionError::RecordsRejected(errors) = err {
        p.record_errors = errors
            .faults
            .iter()
            .map(|(index, fault)| {
                let mut e = BatchIndexAndErrorMessage::default();
                e.batch_index = *index;
                e.batch_index_error_message = Some(str_bytes(fault.message(&errors.partition)));
                e
            })
            .collect();
    }
    p
}

/// Counts the records of a rejected batch by why they were refused (Kafka's
/// `NoKeyCompactedTopicRecordsPerSec` and its siblings).
fn count_rejected_records(errors: &RecordErrors) {
    let c = errors.counts;
    for (reason, n) in [
        ("no_key", c.missing_key),
        ("timestamp", c.timestamp),
        ("malformed", c.malformed),
    ] {
        if n > 0 {
            metrics::counter!("kafka_broker_rejected_records_total", "reason" => reason)
                .increment(n);
        }
    }
}

/// An acks=all append waiting for the high watermark.
struct AckWait {
    topic: usize,
    partition: usize,
    tp: TopicPartition,
    part: PartitionRef,
    /// The high watermark that commits the batch: its last offset + 1.
    required: Offset,
    events: tokio::sync::watch::Receiver<()>,
}

/// Fills in an error for a partition, naming the current leader when the
/// error is NOT_LEADER_OR_FOLLOWER and the version carries it.
fn set_error(
    p: &mut PartitionProduceResponse,
    version: i16,
    e: &PartitionError,
    hint: impl FnOnce() -> Option<(crate::types::NodeId, i32)>,
) {
    p.error_code = e.code();
    p.error_message = e.message().map(str_bytes);
    if matches!(e, PartitionError::NotLeaderOrFollower) && version >= 10 {
        if let Some((leader, epoch)) = hint() {
            p.current_leader.leader_id = kafka_protocol::messages::BrokerId(leader.0);
            p.current_leader.leader_epoch = epoch;
        }
    }
}

/// Kafka's `RequestUtils.hasTransactionalRecords`: whether any partition's
/// first batch is transactional.
fn has_transactional_records(req: &ProduceRequest) -> bool {
    req.topic_data
        .iter()
        .flat_map(|t| t.partition_data.iter())
        .filter_map(|p| p.records.as_ref())
        .any(|r| RecordBatchView::parse(r).is_ok_and(|b| b.is_transactional()))
}

/// A partition's confirmed transaction check: the batch's producer and the
/// token its append presents (`None`: no check was needed).
struct Checked {
    producer_id: i64,
    producer_epoch: i16,
    token: Option<u64>,
}

/// The code a refused transactional batch gets: TRANSACTION_ABORTABLE from
/// v11 (clients that know it abort and retry), INVALID_TXN_STATE before.
fn refused_code(version: i16) -> ResponseError {
    if version >= 11 {
        ResponseError::TransactionAbortable
    } else {
        ResponseError::InvalidTxnState
    }
}

/// Kafka's mapping of the coordinator's answer for a Produce response:
/// a fenced producer gets INVALID_PRODUCER_EPOCH, and a coordinator that is
/// moving, loading or still writing the previous transaction's markers
/// gets NOT_ENOUGH_REPLICAS, which every client retries.
fn check_error(version: i16, e: TxnError) -> PartitionError {
    let code = match e {
        TxnError::ProducerFenced => ResponseError::InvalidProducerEpoch,
        TxnError::TransactionAbortable | TxnError::InvalidTxnState => refused_code(version),
        TxnError::ConcurrentTransactions
        | TxnError::NotCoordinator
        | TxnError::CoordinatorNotAvailable
        | TxnError::CoordinatorLoadInProgress => ResponseError::NotEnoughReplicas,
        TxnError::InvalidProducerIdMapping => ResponseError::InvalidProducerIdMapping,
        TxnError::InvalidTransactionTimeout
        | TxnError::InvalidRequest
        | TxnError::TransactionalIdNotFound => ResponseError::InvalidTxnState,
    };
    PartitionError::TransactionCheck {
        code,
        reason: e.to_string(),
    }
}

/// Asks the transaction coordinator about every partition here whose batch
/// opens a transaction, one request per producer, before anything is
/// appended. Partitions needing no check (or that this node does not lead:
/// the append answers those) are absent.
async fn check_transactions(
    broker: &Broker,
    version: i16,
    transactional_id: &str,
    req: &ProduceRequest,
) -> HashMap<(String, i32), Result<Checked, PartitionError>> {
    let mut out = HashMap::new();
    let check = if version >= 12 {
        TxnCheck::Add
    } else if broker.config.transaction_partition_verification_enable {
        TxnCheck::Verify
    } else {
        return out;
    };
    let mut by_producer: BTreeMap<(i64, i16), BTreeMap<String, BTreeSet<i32>>> = BTreeMap::new();
    for topic in &req.topic_data {
        for pd in &topic.partition_data {
            let Some(records) = &pd.records else { continue };
            let Ok(batch) = RecordBatchView::parse(records) else {
                continue;
            };
            if !batch.is_transactional() || batch.is_control() || batch.producer_id() < 0 {
                continue;
            }
            let (pid, epoch) = (batch.producer_id(), batch.producer_epoch());
            let tp = TopicPartition::new(topic.name.0.as_str(), pd.index);
            let Some(part) = broker.replicas.get(&tp) else {
                continue;
            };
            let token =
                part.lock()
                    .expect("poisoned")
                    .start_txn_check(pid, epoch, check == TxnCheck::Add);
            let checked = Checked {
                producer_id: pid,
                producer_epoch: epoch,
                token,
            };
            if token.is_some() {
                by_producer
                    .entry((pid, epoch))
                    .or_default()
                    .entry(topic.name.0.to_string())
                    .or_default()
                    .insert(pd.index);
            }
            out.insert((topic.name.0.to_string(), pd.index), Ok(checked));
        }
    }
    for ((pid, epoch), partitions) in by_producer {
        let results = broker
            .txn
            .check_partitions(broker, transactional_id, pid, epoch, &partitions, check)
            .await;
        for (topic, parts) in &partitions {
            for p in parts {
                let r = match &results {
                    Err(e) => Err(*e),
                    Ok(r) => r
                        .get(&(topic.clone(), *p))
                        .copied()
                        .unwrap_or(Err(TxnError::CoordinatorNotAvailable)),
                };
                if let Err(e) = r {
                    out.insert((topic.clone(), *p), Err(check_error(version, e)));
                }
            }
        }
    }
    out
}

/// Returns `None` for acks=0, which gets no response.
pub async fn handle(
    broker: &Broker,
    listener: &str,
    version: i16,
    req: ProduceRequest,
) -> Option<ProduceResponse> {
    let acks = req.acks;
    let now = now_ms();
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(req.timeout_ms.max(0) as u64);
    let mut image = broker.metadata.image();
    let mut leaders = LeaderHints::default();
    let mut resp = ProduceResponse::default();
    let mut appended = false;
    let mut waits = Vec::new();
    let unauthorized_txn = req.transactional_id.is_none() && has_transactional_records(&req);
    let mut checks = match &req.transactional_id {
        Some(id) if version >= MIN_ACCEPTED_VERSION && matches!(acks, -1..=1) => {
            check_transactions(broker, version, id, &req).await
        }
        _ => HashMap::new(),
    };
    for topic in req.topic_data {
        let name = topic.name.0.to_string();
        let mut t = TopicProduceResponse::default();
        t.name = topic.name.clone();
        t.topic_id = topic.topic_id;
        for pd in topic.partition_data {
            let result = if version < MIN_ACCEPTED_VERSION {
                Err(PartitionError::UnsupportedVersion)
            } else if unauthorized_txn {
                Err(PartitionError::TransactionalIdAuthorizationFailed)
            } else if !matches!(acks, -1..=1) {
                // INVALID_REQUIRED_ACKS has no PartitionError condition of its
                // own elsewhere; answer it here.
                let mut p = PartitionProduceResponse::default();
                p.index = pd.index;
                p.error_code = ResponseError::InvalidRequiredAcks.code();
                p.base_offset = -1;
                p.log_append_time_ms = -1;
                p.log_start_offset = -1;
                t.partition_responses.push(p);
                continue;
            } else if name == crate::coordinator::OFFSETS_TOPIC {
                Err(PartitionError::InternalTopic(name.clone()))
            } else {
                let tp = TopicPartition::new(name.as_str(), pd.index);
                let check = checks.remove(&(name.clone(), pd.index));
                match (broker.replicas.get(&tp), pd.records, check) {
                    (_, _, Some(Err(e))) => Err(e),
                    (None, _, _) => Err(PartitionError::UnknownTopicOrPartition),
                    (Some(_), None, _) => Err(PartitionError::InvalidRecord("null records".into())),
                    (Some(part), Some(records), check) => {
                        let size = records.len();
                        let mut locked = part.lock().expect("poisoned");
                        let r = match check {
                            Some(Ok(c)) => locked.confirm_txn_check(
                                c.producer_id,
                                c.producer_epoch,
                                c.token,
                                refused_code(version),
                            ),
                            _ => Ok(()),
                        }
                        .and_then(|()| locked.append_as_leader(&records, acks, now));
                        if let Ok(out) = &r {
                            appended = true;
                            metrics::counter!("kafka_broker_bytes_in_total", "topic" => name.clone())
                                .increment(size as u64);
                            if acks == -1 {
                                // Subscribed under the lock of the append,
                                // so no change after it can be missed.
                                waits.push(AckWait {
                                    topic: resp.responses.len(),
                                    partition: t.partition_responses.len(),
                                    tp: tp.clone(),
                                    part: part.clone(),
                                    required: out.last_offset.next(),
                                    events: locked.subscribe(),
                                });
                            }
                        }
                        r
                    }
                }
            };
            let p = match result {
                Ok(out) => {
                    let mut p = PartitionProduceResponse::default();
                    p.index = pd.index;
                    p.base_offset = out.base_offset.0;
                    p.log_append_time_ms = out.log_append_time_ms;
                    p.log_start_offset = out.log_start_offset.0;
                    p
                }
                Err(e) => {
                    if let PartitionError::Storage(msg) = &e {
                        tracing::error!(topic = %name, partition = pd.index, error = %msg, "append failed");
                    }
                    metrics::counter!("kafka_broker_partition_errors_total", "api" => "Produce", "code" => e.code().to_string())
                        .increment(1);
                    if let PartitionError::RecordsRejected(r) = &e {
                        count_rejected_records(r);
                    }
                    let mut p = partition_error(pd.index, &e);
                    let tp = TopicPartition::new(name.as_str(), pd.index);
                    set_error(&mut p, version, &e, || leaders.hint(&image, &tp));
                    p
                }
            };
            t.partition_responses.push(p);
        }
        resp.responses.push(t);
    }
    if appended {
        // Followers long-polling for data fetch it now.
        broker.replicas.appended.notify_waiters();
    }
    // The partitions make progress together, so waiting on each in turn
    // costs the slowest one's time, not the sum.
    let mut failed = Vec::new();
    for mut w in waits {
        let outcome =
            crate::replica_manager::wait_for_ack(&w.part, w.required, &mut w.events, deadline)
                .await;
        if let Err(e) = outcome {
            failed.push((w, e));
        }
    }
    if !failed.is_empty() {
        // Leadership may have moved while we waited: name the current leader.
        image = broker.metadata.image();
    }
    for (w, e) in failed {
        metrics::counter!("kafka_broker_partition_errors_total", "api" => "Produce", "code" => e.code().to_string())
            .increment(1);
        let p = &mut resp.responses[w.topic].partition_responses[w.partition];
        set_error(p, version, &e, || leaders.hint(&image, &w.tp));
    }
    if version >= 10 {
        resp.node_endpoints = leaders.produce_endpoints(&image, listener);
    }
    if acks == 0 {
        None
    } else {
        Some(resp)
    }
}
