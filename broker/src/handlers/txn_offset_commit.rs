//! TxnOffsetCommit (key 28): a transactional producer commits its consumer
//! group's offsets inside its transaction (`sendOffsetsToTransaction`).
//! v2+ carry leader epochs, v3+ the member id, generation and instance id
//! the group checks. The offsets stay pending until the transaction's
//! marker. Before storing them the group's `__consumer_offsets` partition
//! is confirmed with the transaction coordinator, as Kafka does: v0-4
//! verify that the client added it with AddOffsetsToTxn (KIP-890 part 1),
//! v5 (transaction version 2, no AddOffsetsToTxn) has it added.

use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{TxnOffsetCommitRequest, TxnOffsetCommitResponse};
use kafka_protocol::ResponseError;

use crate::broker::{now_ms, Broker};
use crate::coordinator::{CommitPartition, TxnCommitError};
use crate::group::offsets::OffsetAndMetadata;
use crate::group::{GenerationId, GroupInstanceId, MemberId};

pub async fn handle(
    broker: &Broker,
    version: i16,
    req: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    let (codes, commits) = known_partitions(broker, version, &req);
    let results = if commits.is_empty() {
        Vec::new()
    } else if let Err(code) = confirm_offsets_partition(broker, version, &req).await {
        vec![code; commits.len()]
    } else {
        commit(broker, &req, commits).await
    };
    let mut results = results.into_iter();
    let mut resp = TxnOffsetCommitResponse::default();
    for (t, topic_codes) in req.topics.into_iter().zip(codes) {
        let mut rt = TxnOffsetCommitResponseTopic::default();
        rt.name = t.name;
        for (p, code) in t.partitions.into_iter().zip(topic_codes) {
            let mut rp = TxnOffsetCommitResponsePartition::default();
            rp.partition_index = p.partition_index;
            rp.error_code = code.unwrap_or_else(|| results.next().unwrap_or_default());
            rt.partitions.push(rp);
        }
        resp.topics.push(rt);
    }
    resp
}

/// Has the transaction coordinator verify (v0-4) or add (v5) the group's
/// `__consumer_offsets` partition. Kafka's codes: a fenced producer gets
/// INVALID_PRODUCER_EPOCH; a partition outside the transaction
/// TRANSACTION_ABORTABLE from v5 and INVALID_TXN_STATE before; a
/// coordinator that is moving, loading or busy COORDINATOR_NOT_AVAILABLE,
/// which the client retries.
async fn confirm_offsets_partition(
    broker: &Broker,
    version: i16,
    req: &TxnOffsetCommitRequest,
) -> Result<(), i16> {
    use crate::txn::service::TxnCheck;
    use crate::txn::TxnError;
    let partition = crate::coordinator::partition_of(broker, &req.group_id);
    let partitions = std::collections::BTreeMap::from([(
        crate::coordinator::OFFSETS_TOPIC.to_string(),
        std::collections::BTreeSet::from([partition]),
    )]);
    let check = if version >= 5 {
        TxnCheck::Add
    } else if broker.config.transaction_partition_verification_enable {
        TxnCheck::Verify
    } else {
        return Ok(());
    };
    let outcome = broker
        .txn
        .check_partitions(
            broker,
            &req.transactional_id,
            req.producer_id.0,
            req.producer_epoch,
            &partitions,
            check,
        )
        .await
        .and_then(|r| r.into_values().find(Result::is_err).unwrap_or(Ok(())));
    let code = match outcome {
        Ok(()) => return Ok(()),
        Err(TxnError::ProducerFenced) => ResponseError::InvalidProducerEpoch,
        Err(TxnError::TransactionAbortable | TxnError::InvalidTxnState) if version >= 5 => {
            ResponseError::TransactionAbortable
        }
        Err(TxnError::TransactionAbortable | TxnError::InvalidTxnState) => {
            ResponseError::InvalidTxnState
        }
        Err(TxnError::InvalidProducerIdMapping) => ResponseError::InvalidProducerIdMapping,
        Err(_) => ResponseError::CoordinatorNotAvailable,
    };
    Err(code.code())
}

/// Kafka answers partitions of unknown topics (and unknown partitions of
/// known ones) UNKNOWN_TOPIC_OR_PARTITION before asking the group; the rest
/// become commits, in request order.
fn known_partitions(
    broker: &Broker,
    version: i16,
    req: &TxnOffsetCommitRequest,
) -> (Vec<Vec<Option<i16>>>, Vec<CommitPartition>) {
    let now = now_ms();
    let image = broker.metadata.image();
    let mut codes = Vec::with_capacity(req.topics.len());
    let mut commits = Vec::new();
    for t in &req.topics {
        let count = image
            .topics
            .get(t.name.0.as_str())
            .map(|t| t.partitions.len() as i32);
        let mut topic_codes = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            if count.is_none_or(|n| p.partition_index < 0 || p.partition_index >= n) {
                topic_codes.push(Some(ResponseError::UnknownTopicOrPartition.code()));
                continue;
            }
            topic_codes.push(None);
            commits.push(CommitPartition {
                topic: t.name.0.to_string(),
                partition: p.partition_index,
                offset: OffsetAndMetadata {
                    committed_offset: p.committed_offset,
                    committed_leader_epoch: (version >= 2 && p.committed_leader_epoch >= 0)
                        .then_some(p.committed_leader_epoch),
                    metadata: p
                        .committed_metadata
                        .as_ref()
                        .map(|m| m.to_string())
                        .unwrap_or_default(),
                    commit_timestamp_ms: now,
                    // A transactional commit never carries a retention.
                    expire_timestamp_ms: None,
                    topic_id: None,
                },
            });
        }
        codes.push(topic_codes);
    }
    (codes, commits)
}

/// Stores the commits and waits, as OffsetCommit does, until every in-sync
/// replica has them; one error code per commit, in order.
async fn commit(
    broker: &Broker,
    req: &TxnOffsetCommitRequest,
    commits: Vec<CommitPartition>,
) -> Vec<i16> {
    let count = commits.len();
    // Fields before v3 decode as Kafka's defaults: generation -1, no
    // member, no instance: a commit from outside the group's membership.
    let outcome = broker
        .groups
        .commit_txn_offsets(
            &req.group_id.0,
            req.producer_id.0,
            req.producer_epoch,
            &MemberId(req.member_id.to_string()),
            req.group_instance_id
                .as_ref()
                .map(|i| GroupInstanceId(i.to_string()))
                .as_ref(),
            GenerationId(req.generation_id),
            commits,
        )
        .await;
    let results = match outcome {
        Err(e) => return vec![e.code(); count],
        Ok((results, None)) => results,
        Ok((results, Some(pending))) => {
            let timeout = std::time::Duration::from_millis(broker.config.offsets_commit_timeout_ms);
            match pending.wait(timeout).await {
                Ok(()) => results,
                Err(e) => {
                    tracing::warn!(group = %req.group_id.0, error = %e, "transactional offset commit not replicated");
                    let error = TxnCommitError::Group(e.group_error());
                    results.into_iter().map(|r| r.and(Err(error))).collect()
                }
            }
        }
    };
    results
        .into_iter()
        .map(|r| r.err().map_or(0, TxnCommitError::code))
        .collect()
}
