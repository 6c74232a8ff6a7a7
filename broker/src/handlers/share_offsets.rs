//! DescribeShareGroupOffsets (key 90), AlterShareGroupOffsets (91) and
//! DeleteShareGroupOffsets (92): where a share group stands on each
//! partition (its start offset, from the share coordinator), and resetting
//! or forgetting it (`kafka-share-groups.sh --describe`, `--reset-offsets`,
//! `--delete-offsets`).
//!
//! As in Kafka: describing needs Describe on the group and on each topic;
//! altering needs Read on both, deleting Delete on the group and Read on the
//! topics. Altering and deleting need a group without members
//! (NON_EMPTY_GROUP); altering creates the group if need be. An altered
//! share-partition is initialized again at the new start offset with a new
//! state epoch, which fences whatever its leader had loaded.

use kafka_protocol::messages::alter_share_group_offsets_response::{
    AlterShareGroupOffsetsResponsePartition, AlterShareGroupOffsetsResponseTopic,
};
use kafka_protocol::messages::delete_share_group_offsets_response::DeleteShareGroupOffsetsResponseTopic;
use kafka_protocol::messages::describe_share_group_offsets_response::{
    DescribeShareGroupOffsetsResponseGroup, DescribeShareGroupOffsetsResponsePartition,
    DescribeShareGroupOffsetsResponseTopic,
};
use kafka_protocol::messages::{
    AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse, DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsResponse, DescribeShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsResponse, TopicName,
};
use kafka_protocol::ResponseError;
use protocol::newer::NewerResponse;
use uuid::Uuid;

use super::str_bytes;
use crate::authz::{Authz, Operation, ResourceType};
use crate::broker::Broker;
use crate::share::records::SharePartitionKey;
use crate::types::TopicPartition;

fn key(group: &str, topic_id: Uuid, partition: i32) -> SharePartitionKey {
    SharePartitionKey {
        group_id: group.to_string(),
        topic_id,
        partition,
    }
}

/// A topic's id and partition count, if it exists.
fn topic(broker: &Broker, name: &str) -> Option<(Uuid, i32)> {
    broker
        .metadata
        .image()
        .topics
        .get(name)
        .map(|t| (t.topic_id, t.partitions.len() as i32))
}

/// The share-partitions of one group: start offsets from the share
/// coordinator (-1 where it holds no state).
/// The partitions' lags, in the topics' order, when `with_lag`.
async fn describe_group(
    broker: &Broker,
    authz: &Authz<'_>,
    group: &str,
    topics: Option<Vec<(String, Vec<i32>)>>,
    with_lag: bool,
) -> Result<(Vec<DescribeShareGroupOffsetsResponseTopic>, Vec<Vec<i64>>), ResponseError> {
    if !authz.allows(Operation::Describe, ResourceType::Group, group) {
        return Err(ResponseError::GroupAuthorizationFailed);
    }
    let image = broker.metadata.image();
    let topics: Vec<(String, Vec<i32>)> = match topics {
        Some(t) => t,
        None => broker
            .groups
            .share_partitions(group)
            .await
            .map_err(|e| {
                ResponseError::try_from_code(e.code()).unwrap_or(ResponseError::UnknownServerError)
            })?
            .into_iter()
            .filter_map(|(id, parts)| {
                image
                    .topic_by_id(id)
                    .map(|t| (t.name.clone(), parts.into_iter().collect()))
            })
            .collect(),
    };
    let mut out = Vec::new();
    let mut lags = Vec::new();
    for (name, partitions) in topics {
        let mut topic_lags = Vec::new();
        let mut t = DescribeShareGroupOffsetsResponseTopic::default()
            .with_topic_name(TopicName(str_bytes(name.as_str())));
        let refusal = if !authz.allows(Operation::Describe, ResourceType::Topic, &name) {
            Some(ResponseError::TopicAuthorizationFailed)
        } else {
            None
        };
        let found = topic(broker, &name);
        if let Some((id, _)) = found {
            t.topic_id = id;
        }
        for p in partitions {
            let mut pd = DescribeShareGroupOffsetsResponsePartition::default()
                .with_partition_index(p)
                .with_start_offset(-1)
                .with_leader_epoch(-1);
            let mut lag = -1;
            let error = match (refusal, found) {
                (Some(e), _) => Some(e),
                (None, Some((_, count))) if p >= 0 && p < count => None,
                _ => Some(ResponseError::UnknownTopicOrPartition),
            };
            if let Some(e) = error {
                pd.error_code = e.code();
                pd.error_message = Some(str_bytes(e.to_string()));
            } else {
                match broker
                    .share_persister
                    .read_summary(broker, &key(group, t.topic_id, p))
                    .await
                {
                    Ok(s) => {
                        pd.start_offset = s.start_offset;
                        pd.leader_epoch = if s.start_offset < 0 {
                            -1
                        } else {
                            s.leader_epoch
                        };
                        // As Kafka: the end offset less the start offset
                        // less what is done past it; unknown (-1) without a
                        // state or an end offset.
                        if with_lag && s.start_offset >= 0 && s.delivery_complete_count >= 0 {
                            let tp = TopicPartition::new(name.as_str(), p);
                            if let Some(end) = broker.share_persister.end_offset(broker, &tp).await
                            {
                                lag = (end - s.start_offset - s.delivery_complete_count).max(0);
                            }
                        }
                    }
                    Err(e) => {
                        pd.error_code = e.code();
                        pd.error_message = Some(str_bytes(e.to_string()));
                    }
                }
            }
            t.partitions.push(pd);
            topic_lags.push(lag);
        }
        out.push(t);
        lags.push(topic_lags);
    }
    Ok((out, lags))
}

/// DescribeShareGroupOffsets; from version 1 with each partition's lag.
pub async fn describe(
    broker: &Broker,
    authz: &Authz<'_>,
    req: DescribeShareGroupOffsetsRequest,
    version: i16,
) -> NewerResponse {
    let mut resp = DescribeShareGroupOffsetsResponse::default();
    let mut lags = Vec::new();
    for g in req.groups {
        let topics = g.topics.map(|ts| {
            ts.into_iter()
                .map(|t| (t.topic_name.0.to_string(), t.partitions))
                .collect()
        });
        let mut out = DescribeShareGroupOffsetsResponseGroup::default();
        match describe_group(broker, authz, &g.group_id.0, topics, version >= 1).await {
            Ok((topics, group_lags)) => {
                out.topics = topics;
                lags.push(group_lags);
            }
            Err(e) => {
                out.error_code = e.code();
                out.error_message = Some(str_bytes(e.to_string()));
                lags.push(Vec::new());
            }
        }
        out.group_id = g.group_id;
        resp.groups.push(out);
    }
    NewerResponse::DescribeShareGroupOffsets { body: resp, lags }
}

/// A partition of an AlterShareGroupOffsets: its index, new start offset,
/// and why it cannot be reset, if it cannot.
type PlannedReset = (i32, i64, Option<ResponseError>);

pub async fn alter(
    broker: &Broker,
    authz: &Authz<'_>,
    req: AlterShareGroupOffsetsRequest,
) -> AlterShareGroupOffsetsResponse {
    let mut resp = AlterShareGroupOffsetsResponse::default();
    let group = req.group_id.0.to_string();
    let refuse = |mut resp: AlterShareGroupOffsetsResponse, e: ResponseError| {
        resp.error_code = e.code();
        resp.error_message = Some(str_bytes(e.to_string()));
        resp
    };
    if !authz.allows(Operation::Read, ResourceType::Group, &group) {
        return refuse(resp, ResponseError::GroupAuthorizationFailed);
    }
    // Each partition: where it goes, or why it cannot.
    let mut plan: Vec<(AlterShareGroupOffsetsResponseTopic, Vec<PlannedReset>)> = Vec::new();
    let mut valid: Vec<(Uuid, i32)> = Vec::new();
    for t in req.topics {
        let name = t.topic_name.0.to_string();
        let found = topic(broker, &name);
        let allowed = authz.allows(Operation::Read, ResourceType::Topic, &name);
        let mut parts = Vec::new();
        for p in t.partitions {
            let error = match found {
                _ if !allowed => Some(ResponseError::TopicAuthorizationFailed),
                Some((_, count)) if p.partition_index >= 0 && p.partition_index < count => None,
                _ => Some(ResponseError::UnknownTopicOrPartition),
            };
            if error.is_none() && p.start_offset < 0 {
                parts.push((
                    p.partition_index,
                    p.start_offset,
                    Some(ResponseError::InvalidRequest),
                ));
                continue;
            }
            if let (None, Some((id, _))) = (error, found) {
                valid.push((id, p.partition_index));
            }
            parts.push((p.partition_index, p.start_offset, error));
        }
        let out = AlterShareGroupOffsetsResponseTopic::default()
            .with_topic_name(t.topic_name)
            .with_topic_id(found.map_or(Uuid::nil(), |(id, _)| id));
        plan.push((out, parts));
    }
    if let Err(e) = broker
        .groups
        .share_alter_offsets(broker, &group, &valid)
        .await
    {
        let e = ResponseError::try_from_code(e.code()).unwrap_or(ResponseError::UnknownServerError);
        return refuse(resp, e);
    }
    for (mut out, parts) in plan {
        for (partition, start, error) in parts {
            let mut pd =
                AlterShareGroupOffsetsResponsePartition::default().with_partition_index(partition);
            let result = match error {
                Some(e) => Err(e.code()),
                None => reset(broker, &key(&group, out.topic_id, partition), start).await,
            };
            if result.is_ok() {
                // A leader here drops what it had loaded at once; one
                // elsewhere as soon as no session fetches it, and its
                // writes are fenced by the new state epoch until then.
                let tp = TopicPartition::new(out.topic_name.0.as_str(), partition);
                broker.share_leaders.forget(&group, &tp);
            }
            if let Err(code) = result {
                pd.error_code = code;
                pd.error_message =
                    ResponseError::try_from_code(code).map(|e| str_bytes(e.to_string()));
            }
            out.partitions.push(pd);
        }
        resp.responses.push(out);
    }
    resp
}

/// Initializes the share-partition again at `start` with the next state
/// epoch.
async fn reset(broker: &Broker, key: &SharePartitionKey, start: i64) -> Result<(), i16> {
    let persister = &broker.share_persister;
    let current = persister
        .read_summary(broker, key)
        .await
        .map_err(|e| e.code())?;
    persister
        .initialize(broker, key, current.state_epoch.saturating_add(1), start)
        .await
        .map_err(|e| e.code())
}

pub async fn delete(
    broker: &Broker,
    authz: &Authz<'_>,
    req: DeleteShareGroupOffsetsRequest,
) -> DeleteShareGroupOffsetsResponse {
    let mut resp = DeleteShareGroupOffsetsResponse::default();
    let group = req.group_id.0.to_string();
    if !authz.allows(Operation::Delete, ResourceType::Group, &group) {
        resp.error_code = ResponseError::GroupAuthorizationFailed.code();
        resp.error_message = Some(str_bytes(
            ResponseError::GroupAuthorizationFailed.to_string(),
        ));
        return resp;
    }
    let mut ids = Vec::new();
    let mut plan = Vec::new();
    for t in req.topics {
        let name = t.topic_name.0.to_string();
        let found = topic(broker, &name);
        let error = if !authz.allows(Operation::Read, ResourceType::Topic, &name) {
            Some(ResponseError::TopicAuthorizationFailed)
        } else if found.is_none() {
            Some(ResponseError::UnknownTopicOrPartition)
        } else {
            None
        };
        if let (None, Some((id, _))) = (error, found) {
            ids.push(id);
        }
        plan.push((t.topic_name, found.map(|(id, _)| id), error));
    }
    let removed = match broker
        .groups
        .share_delete_offsets(broker, &group, &ids)
        .await
    {
        Ok(r) => r,
        Err(e) => {
            resp.error_code = e.code();
            resp.error_message = Some(str_bytes(e.to_string()));
            return resp;
        }
    };
    for (name, id, error) in plan {
        let mut out = DeleteShareGroupOffsetsResponseTopic::default()
            .with_topic_name(name.clone())
            .with_topic_id(id.unwrap_or_else(Uuid::nil));
        let mut code = error.map(|e| e.code());
        if let (None, Some(id)) = (code, id) {
            for p in removed.get(&id).into_iter().flatten() {
                if let Err(e) = broker
                    .share_persister
                    .delete(broker, &key(&group, id, *p))
                    .await
                {
                    code = Some(e.code());
                }
                broker
                    .share_leaders
                    .forget(&group, &TopicPartition::new(name.0.as_str(), *p));
            }
        }
        if let Some(c) = code {
            out.error_code = c;
            out.error_message = ResponseError::try_from_code(c).map(|e| str_bytes(e.to_string()));
        }
        resp.responses.push(out);
    }
    resp
}

/// After DeleteGroups removed share group `group`: deletes the state of
/// its share-partitions, as Kafka does.
pub async fn delete_group_state(
    broker: &Broker,
    group: &str,
    partitions: crate::coordinator::share::SharePartitions,
) {
    for (topic_id, parts) in partitions {
        for p in parts {
            if let Err(e) = broker
                .share_persister
                .delete(broker, &key(group, topic_id, p))
                .await
            {
                tracing::warn!(group, %topic_id, partition = p, error = %e, "deleting a deleted share group's state failed");
            }
        }
    }
}
