//! The transaction coordinator's APIs: AddPartitionsToTxn (24; v0-3 from
//! clients, v4-5 batched from partition leaders and group coordinators,
//! KIP-890), AddOffsetsToTxn (25), EndTxn (26; v5 bumps the epoch),
//! DescribeTransactions (65) and ListTransactions (66). The state machine
//! is in `txn/`.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::add_partitions_to_txn_response::{
    self, AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::describe_transactions_response::{self, TopicData};
use kafka_protocol::messages::list_transactions_response;
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, DescribeTransactionsRequest, DescribeTransactionsResponse,
    EndTxnRequest, EndTxnResponse, ListTransactionsRequest, ListTransactionsResponse, ProducerId,
    TopicName, TransactionalId,
};
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::broker::Broker;
use crate::coordinator::OFFSETS_TOPIC;
use crate::txn::service::{error_code, TxnDescription};
use crate::txn::TxnState;

pub async fn add_partitions(
    broker: &Broker,
    version: i16,
    req: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    if version > 3 {
        return add_partitions_batch(broker, req).await;
    }
    let mut resp = AddPartitionsToTxnResponse::default();
    // Kafka answers a partition of an unknown topic (or beyond its count)
    // UNKNOWN_TOPIC_OR_PARTITION and every other OPERATION_NOT_ATTEMPTED,
    // before asking the coordinator anything.
    let image = broker.metadata.image();
    let mut added: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    let mut unknown = false;
    for t in &req.v3_and_below_topics {
        let known = image.topics.get(t.name.as_str());
        for p in &t.partitions {
            if known.is_none_or(|k| *p < 0 || *p as usize >= k.partitions.len()) {
                unknown = true;
            }
            added.entry(t.name.to_string()).or_default().insert(*p);
        }
    }
    drop(image);
    let result = if unknown {
        Err(None)
    } else {
        broker
            .txn
            .add_partitions(
                &req.v3_and_below_transactional_id,
                req.v3_and_below_producer_id.0,
                req.v3_and_below_producer_epoch,
                added.clone(),
                0,
            )
            .await
            .map_err(Some)
    };
    let image = broker.metadata.image();
    resp.results_by_topic_v3_and_below = added
        .into_iter()
        .map(|(topic, parts)| {
            let known = image.topics.get(&topic);
            let results = parts
                .into_iter()
                .map(|p| {
                    let code = match &result {
                        Ok(()) => 0,
                        Err(Some(e)) => error_code(*e),
                        Err(None)
                            if known.is_none_or(|k| p < 0 || p as usize >= k.partitions.len()) =>
                        {
                            ResponseError::UnknownTopicOrPartition.code()
                        }
                        Err(None) => ResponseError::OperationNotAttempted.code(),
                    };
                    AddPartitionsToTxnPartitionResult::default()
                        .with_partition_index(p)
                        .with_partition_error_code(code)
                })
                .collect();
            AddPartitionsToTxnTopicResult::default()
                .with_name(TopicName(str_bytes(topic)))
                .with_results_by_partition(results)
        })
        .collect();
    resp
}

/// AddPartitionsToTxn v4+ (Kafka's broker-to-coordinator form): each
/// transaction is verified (`verify_only`, KIP-890 part 1) or has its
/// partitions added for a version 2 client, with one result per partition.
/// Kafka requires CLUSTER_ACTION for it, which no ACL denies here.
async fn add_partitions_batch(
    broker: &Broker,
    req: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    let mut resp = AddPartitionsToTxnResponse::default();
    for txn in req.transactions {
        let mut partitions: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
        for t in &txn.topics {
            partitions
                .entry(t.name.to_string())
                .or_default()
                .extend(t.partitions.iter().copied());
        }
        let id = txn.transactional_id.to_string();
        let results = if txn.verify_only {
            broker
                .txn
                .verify_partitions(&id, txn.producer_id.0, txn.producer_epoch, &partitions)
                .await
        } else {
            let r = broker
                .txn
                .add_partitions(
                    &id,
                    txn.producer_id.0,
                    txn.producer_epoch,
                    partitions.clone(),
                    crate::txn::TV2,
                )
                .await;
            Ok(partitions
                .iter()
                .flat_map(|(t, ps)| ps.iter().map(move |p| ((t.clone(), *p), r)))
                .collect())
        };
        let mut topics: BTreeMap<String, Vec<AddPartitionsToTxnPartitionResult>> = BTreeMap::new();
        for (topic, parts) in &partitions {
            for p in parts {
                let code = match &results {
                    Err(e) => error_code(*e),
                    Ok(r) => r
                        .get(&(topic.clone(), *p))
                        .map_or(0, |r| r.map_or_else(error_code, |()| 0)),
                };
                topics.entry(topic.clone()).or_default().push(
                    AddPartitionsToTxnPartitionResult::default()
                        .with_partition_index(*p)
                        .with_partition_error_code(code),
                );
            }
        }
        resp.results_by_transaction.push(
            add_partitions_to_txn_response::AddPartitionsToTxnResult::default()
                .with_transactional_id(txn.transactional_id)
                .with_topic_results(
                    topics
                        .into_iter()
                        .map(|(t, results)| {
                            AddPartitionsToTxnTopicResult::default()
                                .with_name(TopicName(str_bytes(t)))
                                .with_results_by_partition(results)
                        })
                        .collect(),
                ),
        );
    }
    resp
}

/// AddOffsetsToTxn: the group's `__consumer_offsets` partition joins the
/// transaction, so its TxnOffsetCommit gets a marker.
pub async fn add_offsets(broker: &Broker, req: AddOffsetsToTxnRequest) -> AddOffsetsToTxnResponse {
    let partition = crate::coordinator::partition_of(broker, &req.group_id);
    let added = BTreeMap::from([(OFFSETS_TOPIC.to_string(), BTreeSet::from([partition]))]);
    let mut resp = AddOffsetsToTxnResponse::default();
    if let Err(e) = broker
        .txn
        .add_partitions(
            &req.transactional_id,
            req.producer_id.0,
            req.producer_epoch,
            added,
            0,
        )
        .await
    {
        resp.error_code = error_code(e);
    }
    resp
}

/// EndTxn; v5 is transaction version 2: the epoch is bumped and the
/// answer carries the producer id and epoch the client continues with.
pub async fn end_txn(broker: &Broker, version: i16, req: EndTxnRequest) -> EndTxnResponse {
    let mut resp = EndTxnResponse::default();
    resp.producer_id = ProducerId(-1);
    resp.producer_epoch = -1;
    match broker
        .txn
        .end_txn(
            broker,
            &req.transactional_id,
            req.producer_id.0,
            req.producer_epoch,
            req.committed,
            version >= 5,
        )
        .await
    {
        Ok((pid, epoch)) => {
            resp.producer_id = ProducerId(pid);
            resp.producer_epoch = epoch;
        }
        Err(e) => resp.error_code = error_code(e),
    }
    resp
}

pub async fn describe(
    broker: &Broker,
    req: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let mut resp = DescribeTransactionsResponse::default();
    for id in req.transactional_ids {
        let mut state = describe_transactions_response::TransactionState::default()
            .with_transactional_id(id.clone())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
            .with_transaction_state(str_bytes(""))
            .with_transaction_start_time_ms(-1);
        match broker.txn.describe(&id).await {
            Ok(d) => {
                state = state
                    .with_producer_id(ProducerId(d.producer_id))
                    .with_producer_epoch(d.producer_epoch)
                    .with_transaction_state(str_bytes(d.state.name()))
                    .with_transaction_timeout_ms(d.timeout_ms)
                    .with_transaction_start_time_ms(d.start_ms)
                    .with_topics(
                        d.partitions
                            .into_iter()
                            .map(|(t, ps)| {
                                TopicData::default()
                                    .with_topic(TopicName(str_bytes(t)))
                                    .with_partitions(ps.into_iter().collect())
                            })
                            .collect(),
                    );
            }
            Err(e) => state = state.with_error_code(error_code(e)),
        }
        resp.transaction_states.push(state);
    }
    resp
}

pub async fn list(
    broker: &Broker,
    version: i16,
    req: ListTransactionsRequest,
) -> ListTransactionsResponse {
    let mut resp = ListTransactionsResponse::default();
    let mut states = Vec::new();
    for s in &req.state_filters {
        match TxnState::from_name(s) {
            Some(state) => states.push(state),
            // Kafka lists an unknown state name back and matches nothing
            // by it.
            None => resp.unknown_state_filters.push(s.clone()),
        }
    }
    if !req.state_filters.is_empty() && states.is_empty() {
        return resp;
    }
    let pattern = match req
        .transactional_id_pattern
        .as_deref()
        .filter(|_| version >= 2)
    {
        Some(p) if !p.is_empty() => match regex::Regex::new(&format!("^(?:{p})$")) {
            Ok(re) => Some(re),
            Err(_) => {
                resp.error_code = ResponseError::InvalidRegularExpression.code();
                return resp;
            }
        },
        _ => None,
    };
    let producer_ids: Vec<i64> = req.producer_id_filters.iter().map(|p| p.0).collect();
    let min_duration = if version >= 1 {
        req.duration_filter
    } else {
        -1
    };
    let found: Vec<TxnDescription> = broker
        .txn
        .list(&states, &producer_ids, min_duration, |id| {
            pattern.as_ref().is_none_or(|re| re.is_match(id))
        })
        .await;
    resp.transaction_states = found
        .into_iter()
        .map(|d| {
            list_transactions_response::TransactionState::default()
                .with_transactional_id(TransactionalId(str_bytes(d.transactional_id)))
                .with_producer_id(ProducerId(d.producer_id))
                .with_transaction_state(str_bytes(d.state.name()))
        })
        .collect();
    resp
}
