//! The operations each API checks, as Kafka's `KafkaApis` checks them, done
//! around the handlers: a request-wide check answers the API's error
//! without calling the handler; a per-topic or per-resource check takes
//! the denied entries out of the request, calls the handler with the rest,
//! and puts the denied ones back into the response with Kafka's code
//! (TOPIC_AUTHORIZATION_FAILED for a topic, whether or not it exists).
//! With no authorizer, `Authz::Open` allows everything and the request
//! passes through untouched.

use kafka_protocol::messages::*;
use kafka_protocol::ResponseError;

use crate::authz::{Authz, Operation, ResourceType};

const TOPIC_DENIED: i16 = ResponseError::TopicAuthorizationFailed.code();
pub const GROUP_DENIED: i16 = ResponseError::GroupAuthorizationFailed.code();
pub const CLUSTER_DENIED: i16 = ResponseError::ClusterAuthorizationFailed.code();
pub const TXN_DENIED: i16 = ResponseError::TransactionalIdAuthorizationFailed.code();

fn topic_ok(authz: &Authz<'_>, op: Operation, name: &TopicName) -> bool {
    authz.allows(op, ResourceType::Topic, name.0.as_str())
}

pub fn group_ok(authz: &Authz<'_>, op: Operation, group: &str) -> bool {
    authz.allows(op, ResourceType::Group, group)
}

pub fn txn_ok(authz: &Authz<'_>, op: Operation, id: &str) -> bool {
    authz.allows(op, ResourceType::TransactionalId, id)
}

/// Splits `items` into the allowed (left in place) and the denied.
fn take_denied<T>(items: &mut Vec<T>, mut allowed: impl FnMut(&T) -> bool) -> Vec<T> {
    let (keep, denied): (Vec<T>, Vec<T>) =
        std::mem::take(items).into_iter().partition(|t| allowed(t));
    *items = keep;
    denied
}

/// Produce: TransactionalId Write for a transactional producer (else
/// every partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED), Write per topic.
pub fn produce(
    authz: &Authz<'_>,
    req: &mut ProduceRequest,
) -> Vec<produce_response::TopicProduceResponse> {
    // Kafka checks the transactional id only when a partition's first batch
    // is transactional, and refuses such a request without one
    // (`RequestUtils.hasTransactionalRecords`).
    let all_denied = has_transactional_records(req)
        && req
            .transactional_id
            .as_ref()
            .is_none_or(|id| !txn_ok(authz, Operation::Write, id.0.as_str()));
    let denied = take_denied(&mut req.topic_data, |t| {
        !all_denied && topic_ok(authz, Operation::Write, &t.name)
    });
    let code = if all_denied { TXN_DENIED } else { TOPIC_DENIED };
    denied
        .into_iter()
        .map(|t| {
            produce_response::TopicProduceResponse::default()
                .with_name(t.name)
                .with_topic_id(t.topic_id)
                .with_partition_responses(
                    t.partition_data
                        .iter()
                        .map(|p| {
                            produce_response::PartitionProduceResponse::default()
                                .with_index(p.index)
                                .with_error_code(code)
                                .with_base_offset(-1)
                                .with_log_append_time_ms(-1)
                                .with_log_start_offset(-1)
                        })
                        .collect(),
                )
        })
        .collect()
}

pub fn list_offsets(
    authz: &Authz<'_>,
    req: &mut ListOffsetsRequest,
) -> Vec<list_offsets_response::ListOffsetsTopicResponse> {
    take_denied(&mut req.topics, |t| {
        topic_ok(authz, Operation::Describe, &t.name)
    })
    .into_iter()
    .map(|t| {
        list_offsets_response::ListOffsetsTopicResponse::default()
            .with_name(t.name)
            .with_partitions(
                t.partitions
                    .iter()
                    .map(|p| {
                        list_offsets_response::ListOffsetsPartitionResponse::default()
                            .with_partition_index(p.partition_index)
                            .with_error_code(TOPIC_DENIED)
                            .with_timestamp(-1)
                            .with_offset(-1)
                            .with_leader_epoch(-1)
                    })
                    .collect(),
            )
    })
    .collect()
}

/// Whether any partition's first record batch is transactional (magic 2,
/// attributes bit 4), as Kafka's `RequestUtils.hasTransactionalRecords`.
fn has_transactional_records(req: &ProduceRequest) -> bool {
    const MAGIC_OFFSET: usize = 16;
    const ATTRIBUTES_OFFSET: usize = 21;
    const TRANSACTIONAL: u8 = 0x10;
    req.topic_data
        .iter()
        .flat_map(|t| &t.partition_data)
        .filter_map(|p| p.records.as_ref())
        .any(|r| {
            r.len() > ATTRIBUTES_OFFSET + 1
                && r[MAGIC_OFFSET] == 2
                && r[ATTRIBUTES_OFFSET + 1] & TRANSACTIONAL != 0
        })
}

/// CreateTopics: Create on the cluster, or else on each topic.
pub fn create_topics(
    authz: &Authz<'_>,
    req: &mut CreateTopicsRequest,
) -> Vec<create_topics_response::CreatableTopicResult> {
    if authz.may(
        Operation::Create,
        ResourceType::Cluster,
        crate::authz::CLUSTER_NAME,
    ) {
        return Vec::new();
    }
    take_denied(&mut req.topics, |t| {
        topic_ok(authz, Operation::Create, &t.name)
    })
    .into_iter()
    .map(|t| {
        create_topics_response::CreatableTopicResult::default()
            .with_name(t.name)
            .with_error_code(TOPIC_DENIED)
            .with_error_message(Some(super::str_bytes(
                ResponseError::TopicAuthorizationFailed.to_string(),
            )))
            .with_topic_config_error_code(TOPIC_DENIED)
            .with_num_partitions(-1)
            .with_replication_factor(-1)
    })
    .collect()
}

/// CreateTopics: a created topic's configs go back only to a principal who
/// may DescribeConfigs it; otherwise `topic_config_error_code` says why
/// (Kafka's `describableTopics` in `ReplicationControlManager.createTopics`).
pub fn hide_created_configs(authz: &Authz<'_>, resp: &mut CreateTopicsResponse) {
    if !authz.enabled() {
        return;
    }
    for t in resp.topics.iter_mut().filter(|t| t.error_code == 0) {
        if !topic_ok(authz, Operation::DescribeConfigs, &t.name) {
            t.configs = None;
            t.topic_config_error_code = TOPIC_DENIED;
        }
    }
}

/// DeleteTopics: Delete per topic (named, or by id once the id is known).
pub fn delete_topics(
    authz: &Authz<'_>,
    image: &crate::metadata::MetadataImage,
    req: &mut DeleteTopicsRequest,
) -> Vec<delete_topics_response::DeletableTopicResult> {
    let result = |name: Option<TopicName>, id| {
        delete_topics_response::DeletableTopicResult::default()
            .with_name(name)
            .with_topic_id(id)
            .with_error_code(TOPIC_DENIED)
    };
    let mut out: Vec<_> = take_denied(&mut req.topic_names, |n| {
        topic_ok(authz, Operation::Delete, n)
    })
    .into_iter()
    .map(|n| result(Some(n), uuid::Uuid::nil()))
    .collect();
    let denied = take_denied(&mut req.topics, |t| {
        let name = match &t.name {
            Some(n) => Some(n.0.to_string()),
            None => image.topic_by_id(t.topic_id).map(|i| i.name.clone()),
        };
        name.is_none_or(|n| authz.allows(Operation::Delete, ResourceType::Topic, &n))
    });
    out.extend(denied.into_iter().map(|t| result(t.name, t.topic_id)));
    out
}

pub fn create_partitions(
    authz: &Authz<'_>,
    req: &mut CreatePartitionsRequest,
) -> Vec<create_partitions_response::CreatePartitionsTopicResult> {
    take_denied(&mut req.topics, |t| {
        topic_ok(authz, Operation::Alter, &t.name)
    })
    .into_iter()
    .map(|t| {
        create_partitions_response::CreatePartitionsTopicResult::default()
            .with_name(t.name)
            .with_error_code(TOPIC_DENIED)
            .with_error_message(Some(super::str_bytes(
                ResponseError::TopicAuthorizationFailed.to_string(),
            )))
    })
    .collect()
}

pub fn delete_records(
    authz: &Authz<'_>,
    req: &mut DeleteRecordsRequest,
) -> Vec<delete_records_response::DeleteRecordsTopicResult> {
    take_denied(&mut req.topics, |t| {
        topic_ok(authz, Operation::Delete, &t.name)
    })
    .into_iter()
    .map(|t| {
        delete_records_response::DeleteRecordsTopicResult::default()
            .with_name(t.name)
            .with_partitions(
                t.partitions
                    .iter()
                    .map(|p| {
                        delete_records_response::DeleteRecordsPartitionResult::default()
                            .with_partition_index(p.partition_index)
                            .with_low_watermark(-1)
                            .with_error_code(TOPIC_DENIED)
                    })
                    .collect(),
            )
    })
    .collect()
}

/// OffsetForLeaderEpoch: ClusterAction for a replica, Describe per topic
/// for a client.
pub fn offset_for_leader_epoch(
    authz: &Authz<'_>,
    req: &mut OffsetForLeaderEpochRequest,
) -> Vec<offset_for_leader_epoch_response::OffsetForLeaderTopicResult> {
    let replica = req.replica_id.0 >= 0 && !authz.allows_cluster(Operation::ClusterAction);
    take_denied(&mut req.topics, |t| {
        !replica && topic_ok(authz, Operation::Describe, &t.topic)
    })
    .into_iter()
    .map(|t| {
        offset_for_leader_epoch_response::OffsetForLeaderTopicResult::default()
            .with_topic(t.topic)
            .with_partitions(
                t.partitions
                    .iter()
                    .map(|p| {
                        offset_for_leader_epoch_response::EpochEndOffset::default()
                            .with_partition(p.partition)
                            .with_error_code(TOPIC_DENIED)
                            .with_leader_epoch(-1)
                            .with_end_offset(-1)
                    })
                    .collect(),
            )
    })
    .collect()
}

pub fn describe_producers(
    authz: &Authz<'_>,
    req: &mut DescribeProducersRequest,
) -> Vec<describe_producers_response::TopicResponse> {
    take_denied(&mut req.topics, |t| {
        topic_ok(authz, Operation::Read, &t.name)
    })
    .into_iter()
    .map(|t| {
        describe_producers_response::TopicResponse::default()
            .with_name(t.name)
            .with_partitions(
                t.partition_indexes
                    .iter()
                    .map(|p| {
                        describe_producers_response::PartitionResponse::default()
                            .with_partition_index(*p)
                            .with_error_code(TOPIC_DENIED)
                    })
                    .collect(),
            )
    })
    .collect()
}

/// OffsetCommit: the group Read is request-wide (done by the caller),
/// Read per topic here.
pub fn offset_commit(
    authz: &Authz<'_>,
    req: &mut OffsetCommitRequest,
) -> Vec<offset_commit_response::OffsetCommitResponseTopic> {
    take_denied(&mut req.topics, |t| {
        topic_ok(authz, Operation::Read, &t.name)
    })
    .into_iter()
    .map(|t| offset_commit_denied(&t, TOPIC_DENIED))
    .collect()
}

pub fn offset_commit_denied(
    t: &offset_commit_request::OffsetCommitRequestTopic,
    code: i16,
) -> offset_commit_response::OffsetCommitResponseTopic {
    offset_commit_response::OffsetCommitResponseTopic::default()
        .with_name(t.name.clone())
        .with_topic_id(t.topic_id)
        .with_partitions(
            t.partitions
                .iter()
                .map(|p| {
                    offset_commit_response::OffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(code)
                })
                .collect(),
        )
}

pub fn txn_offset_commit_denied(
    req: &TxnOffsetCommitRequest,
    code: i16,
    only: Option<&[txn_offset_commit_request::TxnOffsetCommitRequestTopic]>,
) -> Vec<txn_offset_commit_response::TxnOffsetCommitResponseTopic> {
    only.unwrap_or(&req.topics)
        .iter()
        .map(|t| {
            txn_offset_commit_response::TxnOffsetCommitResponseTopic::default()
                .with_name(t.name.clone())
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            txn_offset_commit_response::TxnOffsetCommitResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(code)
                        })
                        .collect(),
                )
        })
        .collect()
}

/// TxnOffsetCommit: TransactionalId Write, then group Read (both
/// request-wide), then Read per topic. `Err` is the whole response.
pub fn txn_offset_commit(
    authz: &Authz<'_>,
    req: &mut TxnOffsetCommitRequest,
) -> Result<Vec<txn_offset_commit_response::TxnOffsetCommitResponseTopic>, TxnOffsetCommitResponse>
{
    if !txn_ok(authz, Operation::Write, req.transactional_id.0.as_str()) {
        return Err(TxnOffsetCommitResponse::default()
            .with_topics(txn_offset_commit_denied(req, TXN_DENIED, None)));
    }
    if !group_ok(authz, Operation::Read, req.group_id.0.as_str()) {
        return Err(
            TxnOffsetCommitResponse::default().with_topics(txn_offset_commit_denied(
                req,
                GROUP_DENIED,
                None,
            )),
        );
    }
    let denied = take_denied(&mut req.topics, |t| {
        topic_ok(authz, Operation::Read, &t.name)
    });
    Ok(txn_offset_commit_denied(req, TOPIC_DENIED, Some(&denied)))
}

/// OffsetDelete: group Delete (request-wide, by the caller), Read per topic.
pub fn offset_delete(
    authz: &Authz<'_>,
    req: &mut OffsetDeleteRequest,
) -> Vec<offset_delete_response::OffsetDeleteResponseTopic> {
    take_denied(&mut req.topics, |t| {
        topic_ok(authz, Operation::Read, &t.name)
    })
    .into_iter()
    .map(|t| {
        offset_delete_response::OffsetDeleteResponseTopic::default()
            .with_name(t.name)
            .with_partitions(
                t.partitions
                    .iter()
                    .map(|p| {
                        offset_delete_response::OffsetDeleteResponsePartition::default()
                            .with_partition_index(p.partition_index)
                            .with_error_code(TOPIC_DENIED)
                    })
                    .collect(),
            )
    })
    .collect()
}

/// AddPartitionsToTxn v0-3 (a client's): TransactionalId Write for all,
/// Write per topic; when some topic is denied, the others are not
/// attempted (OPERATION_NOT_ATTEMPTED), as Kafka does. v4+ (brokers
/// verifying): ClusterAction. `Some` is the whole response.
pub fn add_partitions_to_txn(
    authz: &Authz<'_>,
    version: i16,
    req: &AddPartitionsToTxnRequest,
) -> Option<AddPartitionsToTxnResponse> {
    use add_partitions_to_txn_response::{
        AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
    };
    if version >= 4 {
        if authz.allows_cluster(Operation::ClusterAction) {
            return None;
        }
        return Some(AddPartitionsToTxnResponse::default().with_error_code(CLUSTER_DENIED));
    }
    let whole = !txn_ok(
        authz,
        Operation::Write,
        req.v3_and_below_transactional_id.0.as_str(),
    );
    let denied: Vec<bool> = req
        .v3_and_below_topics
        .iter()
        .map(|t| whole || !topic_ok(authz, Operation::Write, &t.name))
        .collect();
    if !denied.iter().any(|d| *d) {
        return None;
    }
    let results = req
        .v3_and_below_topics
        .iter()
        .zip(&denied)
        .map(|(t, d)| {
            let code = match (whole, d) {
                (true, _) => TXN_DENIED,
                (false, true) => TOPIC_DENIED,
                (false, false) => ResponseError::OperationNotAttempted.code(),
            };
            AddPartitionsToTxnTopicResult::default()
                .with_name(t.name.clone())
                .with_results_by_partition(
                    t.partitions
                        .iter()
                        .map(|p| {
                            AddPartitionsToTxnPartitionResult::default()
                                .with_partition_index(*p)
                                .with_partition_error_code(code)
                        })
                        .collect(),
                )
        })
        .collect();
    Some(AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results))
}

/// WriteTxnMarkers: ClusterAction, else CLUSTER_AUTHORIZATION_FAILED on
/// every partition.
pub fn write_txn_markers(
    authz: &Authz<'_>,
    req: &WriteTxnMarkersRequest,
) -> Option<WriteTxnMarkersResponse> {
    use write_txn_markers_response::*;
    if authz.allows_cluster(Operation::ClusterAction) {
        return None;
    }
    Some(
        WriteTxnMarkersResponse::default().with_markers(
            req.markers
                .iter()
                .map(|m| {
                    WritableTxnMarkerResult::default()
                        .with_producer_id(m.producer_id)
                        .with_topics(
                            m.topics
                                .iter()
                                .map(|t| {
                                    WritableTxnMarkerTopicResult::default()
                                        .with_name(t.name.clone())
                                        .with_partitions(
                                            t.partition_indexes
                                                .iter()
                                                .map(|p| {
                                                    WritableTxnMarkerPartitionResult::default()
                                                        .with_partition_index(*p)
                                                        .with_error_code(CLUSTER_DENIED)
                                                })
                                                .collect(),
                                        )
                                })
                                .collect(),
                        )
                })
                .collect(),
        ),
    )
}

/// OffsetFetch's topic check (the group's is the caller's): fetching all
/// of a group's offsets leaves out the topics the principal may not
/// describe; a named one is answered TOPIC_AUTHORIZATION_FAILED per
/// partition. `named(group)`: whether that group's request named topics
/// (before v8 there is one group, asked for as "").
pub fn offset_fetch_filter(
    authz: &Authz<'_>,
    resp: &mut OffsetFetchResponse,
    named: impl Fn(&str) -> bool,
) {
    if !authz.enabled() {
        return;
    }
    let may =
        |name: &TopicName| authz.may(Operation::Describe, ResourceType::Topic, name.0.as_str());
    if named("") {
        for t in resp.topics.iter_mut().filter(|t| !may(&t.name)) {
            for p in &mut t.partitions {
                p.error_code = TOPIC_DENIED;
                p.committed_offset = -1;
                p.metadata = None;
            }
        }
    } else {
        resp.topics.retain(|t| may(&t.name));
    }
    for g in &mut resp.groups {
        if named(g.group_id.0.as_str()) {
            for t in g.topics.iter_mut().filter(|t| !may(&t.name)) {
                for p in &mut t.partitions {
                    p.error_code = TOPIC_DENIED;
                    p.committed_offset = -1;
                    p.metadata = None;
                }
            }
        } else {
            g.topics.retain(|t| may(&t.name));
        }
    }
}

/// The config resources' checks: topics (2) need `op` on the topic
/// (TOPIC_AUTHORIZATION_FAILED), groups (32) on the group
/// (GROUP_AUTHORIZATION_FAILED), brokers (4) and broker loggers (8) on the
/// cluster (CLUSTER_AUTHORIZATION_FAILED). `None` when allowed.
pub fn config_resource(
    authz: &Authz<'_>,
    resource_type: i8,
    name: &str,
    op: Operation,
) -> Option<i16> {
    match resource_type {
        2 => (!authz.allows(op, ResourceType::Topic, name)).then_some(TOPIC_DENIED),
        32 => (!authz.allows(op, ResourceType::Group, name)).then_some(GROUP_DENIED),
        4 | 8 => (!authz.allows_cluster(op)).then_some(CLUSTER_DENIED),
        _ => None,
    }
}
