//! CreatePartitions (key 37): grow a topic's partition count.
//!
//! As Kafka's controller (`ControllerApis.createPartitions`,
//! `ReplicationControlManager.createPartitions`): a duplicated topic name is
//! refused; every other topic is checked (it exists, the count grows, the
//! assignments match the partitions added) before anything is placed, and
//! the partitions one request adds count against the 10,000 metadata records
//! one controller operation may write. A topic that would pass that cap is
//! refused with POLICY_VIOLATION before its partitions are placed (Kafka's
//! controller would fail the same way once its record list is full).

use std::collections::HashSet;

use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{CreatePartitionsRequest, CreatePartitionsResponse};
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::broker::{
    count_operation_too_large, metadata_error, partition_with_isr, validate_manual_assignment,
    Broker, MAX_RECORDS_PER_USER_OP, TOO_MANY_RECORDS,
};
use crate::metadata::{MetadataCommand, MetadataImage, PartitionImage};
use crate::quota::usage::MutationQuota;
use crate::types::NodeId;

pub async fn handle(
    broker: &Broker,
    _version: i16,
    req: CreatePartitionsRequest,
    quota: &MutationQuota,
) -> CreatePartitionsResponse {
    let mut resp = CreatePartitionsResponse::default();
    let mut seen = HashSet::new();
    let mut duplicates: Vec<String> = Vec::new();
    for t in &req.topics {
        let name = t.name.0.to_string();
        if !seen.insert(name.clone()) && !duplicates.contains(&name) {
            duplicates.push(name);
        }
    }
    for name in &duplicates {
        let mut r = CreatePartitionsTopicResult::default();
        r.name = kafka_protocol::messages::TopicName(str_bytes(name));
        r.error_code = ResponseError::InvalidRequest.code();
        r.error_message = Some(str_bytes("Duplicate topic name."));
        resp.results.push(r);
    }
    let mut records_left = MAX_RECORDS_PER_USER_OP;
    for topic in req.topics {
        let name = topic.name.0.to_string();
        if duplicates.contains(&name) {
            continue;
        }
        let mut r = CreatePartitionsTopicResult::default();
        r.name = topic.name.clone();
        let image = broker.metadata.image();
        let new = match plan(broker, &image, &name, &topic, records_left) {
            Ok(new) => new,
            Err((code, message)) => {
                if code == ResponseError::PolicyViolation {
                    count_operation_too_large("CreatePartitions");
                }
                r.error_code = code.code();
                r.error_message = Some(str_bytes(message));
                resp.results.push(r);
                continue;
            }
        };
        if quota.admit(broker, new.len()).is_err() {
            let (code, message) = MutationQuota::refusal();
            r.error_code = code;
            r.error_message = Some(str_bytes(message.to_string()));
            resp.results.push(r);
            continue;
        }
        records_left -= new.len();
        if !req.validate_only {
            match broker
                .metadata
                .propose(MetadataCommand::CreatePartitions {
                    name: name.clone(),
                    partitions: new,
                })
                .await
            {
                Ok(_) => {
                    if let Err(e) = broker.sync_replicas().await {
                        tracing::error!(topic = %name, error = %e, "opening new partitions failed");
                    }
                }
                Err(e) => {
                    r.error_code = metadata_error(&e).code();
                    r.error_message = Some(str_bytes(e.to_string()));
                }
            }
        }
        resp.results.push(r);
    }
    resp.throttle_time_ms = quota.throttle_ms();
    resp
}

/// Kafka's checks of one topic, in its order, and the new partitions'
/// replicas. Counts are checked before anything is allocated per partition.
fn plan(
    broker: &Broker,
    image: &MetadataImage,
    name: &str,
    topic: &CreatePartitionsTopic,
    records_left: usize,
) -> Result<Vec<PartitionImage>, (ResponseError, String)> {
    let Some(current) = image.topics.get(name) else {
        return Err((
            ResponseError::UnknownTopicOrPartition,
            format!("The topic '{name}' does not exist."),
        ));
    };
    let have = current.partitions.len() as i64;
    let count = i64::from(topic.count);
    if count == have {
        return Err((
            ResponseError::InvalidPartitions,
            format!("Topic already has {have} partition(s)."),
        ));
    }
    if count < have {
        return Err((
            ResponseError::InvalidPartitions,
            format!(
                "The topic {name} currently has {have} partition(s); {count} would not be an increase."
            ),
        ));
    }
    let additional = (count - have) as usize;
    // Before the assignments are looked at: Kafka 4.4 answers an increase past
    // its per-operation record limit with POLICY_VIOLATION even when the
    // assignment list does not match it (seen with count = 2^31-1 and none).
    if additional > records_left {
        return Err((ResponseError::PolicyViolation, TOO_MANY_RECORDS.to_string()));
    }
    if let Some(a) = &topic.assignments {
        if a.len() != additional {
            return Err((
                ResponseError::InvalidReplicaAssignment,
                format!(
                    "Attempted to add {additional} additional partition(s), but only {} assignment(s) were specified.",
                    a.len()
                ),
            ));
        }
    }
    let rf = current.partitions.first().map_or(1, |p| p.replicas.len());
    let first = have as i32;
    let mut new = Vec::with_capacity(additional);
    match &topic.assignments {
        Some(assignments) => {
            let (registered, active) = broker.registered_and_active(image);
            for (i, a) in assignments.iter().enumerate() {
                let partition = first + i as i32;
                let replicas: Vec<NodeId> = a.broker_ids.iter().map(|b| NodeId(b.0)).collect();
                let isr = validate_manual_assignment(
                    &registered,
                    &active,
                    partition,
                    &replicas,
                    Some(rf),
                )
                .map_err(|e| (ResponseError::InvalidReplicaAssignment, e))?;
                new.push(partition_with_isr(partition, replicas, isr));
            }
        }
        None => {
            let rf = i16::try_from(rf).map_err(|_| {
                (
                    ResponseError::UnknownServerError,
                    format!("Invalid replication factor {rf}"),
                )
            })?;
            let placed = broker
                .place_replicas(image, first, additional as i32, rf)
                .map_err(|e| (ResponseError::InvalidReplicationFactor, e.to_string()))?;
            for (i, replicas) in placed.into_iter().enumerate() {
                let isr = replicas.clone();
                new.push(partition_with_isr(first + i as i32, replicas, isr));
            }
        }
    }
    Ok(new)
}
