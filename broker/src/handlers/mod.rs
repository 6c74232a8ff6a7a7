//! One handler per API key, and the one exhaustive dispatch. The APIs listed
//! here are exactly those in `protocol::versions::SUPPORTED_APIS`; a request
//! for any other key never reaches this point (the connection answers it).

mod acls;
mod alter_configs;
mod api_versions;
mod authorize;
mod client_quotas;
mod consumer_group_describe;
mod consumer_group_heartbeat;
mod create_partitions;
mod create_topics;
mod delete_groups;
mod delete_records;
mod delete_topics;
mod describe_cluster;
mod describe_configs;
mod describe_groups;
mod describe_log_dirs;
mod describe_producers;
mod describe_quorum;
mod elect_leaders;
pub mod fetch;
mod find_coordinator;
mod heartbeat;
mod init_producer_id;
mod join_group;
mod leader_hints;
mod leave_group;
mod list_groups;
mod list_offsets;
mod metadata;
mod offset_commit;
mod offset_delete;
mod offset_fetch;
mod offset_for_leader_epoch;
mod produce;
mod scram;
mod share_fetch;
mod share_group;
mod share_offsets;
mod share_state;
mod sync_group;
mod txn;
mod txn_offset_commit;
pub mod write_txn_markers;

use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use kafka_protocol::protocol::StrBytes;
use protocol::newer::NewerRequest;

use crate::authz::{Authz, Operation, ResourceType, GROUP_OPERATIONS};
use crate::broker::Broker;
use crate::quota::usage::MutationQuota;
use authorize::{group_ok, txn_ok, CLUSTER_DENIED, GROUP_DENIED, TXN_DENIED};
use kafka_protocol::ResponseError;

/// What the connection does with a request's outcome.
// The large variant is the common case and is moved once per request;
// boxing it would add an allocation to every response for no gain.
#[allow(clippy::large_enum_variant)]
pub enum Reply {
    Respond(ResponseKind),
    /// A response whose version carries fields kafka-protocol's type lacks.
    Newer(protocol::newer::NewerResponse),
    /// A Fetch response, its records sent from the segment files.
    Fetch(fetch::FetchReply),
    /// Produce with acks=0: Kafka sends nothing back.
    NoResponse,
    /// The request is valid framing but its API is not one we serve.
    Unsupported,
}

/// Who sent a request: group members are described by these.
#[derive(Clone, Debug, Default)]
pub struct RequestContext {
    /// The request header's `client.id` (empty when null).
    pub client_id: String,
    /// The peer's address as Kafka reports it: `/` + IP.
    pub client_host: String,
    /// The peer's IP, where the socket knew it.
    pub client_ip: Option<std::net::IpAddr>,
    /// The listener the connection came in on: clients are told the
    /// endpoints of that listener.
    pub listener: std::sync::Arc<str>,
    /// Who the connection authenticated as: `User:<name>`, or
    /// `User:ANONYMOUS`.
    pub principal: std::sync::Arc<str>,
    /// This connection's number, unique in the process (share sessions end
    /// with the connection that opened them).
    pub connection_id: u64,
}

/// `newer`: the fields of a version newer than kafka-protocol's
/// (`protocol::newer`), whose older body `request` is.
pub async fn dispatch(
    broker: &Broker,
    ctx: &RequestContext,
    version: i16,
    request: RequestKind,
    newer: Option<NewerRequest>,
) -> Reply {
    use RequestKind as R;
    use ResponseKind as S;
    // One branch when no authorizer is configured; otherwise one image
    // read per request.
    let authz = Authz::new(&broker.config, || broker.metadata.image(), ctx);
    let authz = &authz;
    match request {
        R::ApiVersions(r) => {
            Reply::Respond(S::ApiVersions(api_versions::handle(broker, version, r)))
        }
        R::Metadata(r) => Reply::Respond(S::Metadata(
            metadata::handle(broker, authz, &ctx.listener, version, r).await,
        )),
        R::Produce(mut r) => {
            let denied = authorize::produce(authz, &mut r);
            if denied.is_empty() {
                return match produce::handle(broker, &ctx.listener, version, r).await {
                    Some(resp) => Reply::Respond(S::Produce(resp)),
                    None => Reply::NoResponse,
                };
            }
            let acks = r.acks;
            let mut resp = if r.topic_data.is_empty() {
                None
            } else {
                produce::handle(broker, &ctx.listener, version, r).await
            };
            if acks == 0 {
                return Reply::NoResponse;
            }
            let resp = resp.get_or_insert_with(Default::default);
            resp.responses.extend(denied);
            Reply::Respond(S::Produce(std::mem::take(resp)))
        }
        R::Fetch(r) => Reply::Fetch(fetch::handle(broker, ctx, version, r).await),
        R::ListOffsets(mut r) => {
            let denied = authorize::list_offsets(authz, &mut r);
            let mut resp = list_offsets::handle(broker, version, r);
            resp.topics.extend(denied);
            Reply::Respond(S::ListOffsets(resp))
        }
        R::CreateTopics(mut r) => {
            let denied = authorize::create_topics(authz, &mut r);
            let quota = MutationQuota::new(broker, ctx, ApiKey::CreateTopics, version);
            let mut resp = create_topics::handle(broker, version, r, &quota).await;
            authorize::hide_created_configs(authz, &mut resp);
            resp.topics.extend(denied);
            Reply::Respond(S::CreateTopics(resp))
        }
        R::DeleteTopics(mut r) => {
            let denied = authorize::delete_topics(authz, &broker.metadata.image(), &mut r);
            let quota = MutationQuota::new(broker, ctx, ApiKey::DeleteTopics, version);
            let mut resp = delete_topics::handle(broker, version, r, &quota).await;
            resp.responses.extend(denied);
            Reply::Respond(S::DeleteTopics(resp))
        }
        R::CreatePartitions(mut r) => {
            let denied = authorize::create_partitions(authz, &mut r);
            let quota = MutationQuota::new(broker, ctx, ApiKey::CreatePartitions, version);
            let mut resp = create_partitions::handle(broker, version, r, &quota).await;
            resp.results.extend(denied);
            Reply::Respond(S::CreatePartitions(resp))
        }
        R::InitProducerId(r) => {
            let allowed = match &r.transactional_id {
                Some(id) => txn_ok(authz, Operation::Write, id.0.as_str()),
                // Idempotence without a transaction: IdempotentWrite on
                // the cluster, or Write on any topic (Kafka 3.0+).
                None => {
                    authz.may(
                        Operation::IdempotentWrite,
                        ResourceType::Cluster,
                        crate::authz::CLUSTER_NAME,
                    ) || authz.allows_any(Operation::Write, ResourceType::Topic)
                }
            };
            if !allowed {
                let code = if r.transactional_id.is_some() {
                    TXN_DENIED
                } else {
                    CLUSTER_DENIED
                };
                let resp = kafka_protocol::messages::InitProducerIdResponse::default()
                    .with_error_code(code)
                    .with_producer_id(kafka_protocol::messages::ProducerId(-1))
                    .with_producer_epoch(-1);
                return Reply::Respond(S::InitProducerId(resp));
            }
            Reply::Respond(S::InitProducerId(
                init_producer_id::handle(broker, version, r).await,
            ))
        }
        R::AddPartitionsToTxn(r) => match authorize::add_partitions_to_txn(authz, version, &r) {
            Some(denied) => Reply::Respond(S::AddPartitionsToTxn(denied)),
            None => Reply::Respond(S::AddPartitionsToTxn(
                txn::add_partitions(broker, version, r).await,
            )),
        },
        R::AddOffsetsToTxn(r) => {
            let code = if !txn_ok(authz, Operation::Write, r.transactional_id.0.as_str()) {
                TXN_DENIED
            } else if !group_ok(authz, Operation::Read, r.group_id.0.as_str()) {
                GROUP_DENIED
            } else {
                return Reply::Respond(S::AddOffsetsToTxn(txn::add_offsets(broker, r).await));
            };
            Reply::Respond(S::AddOffsetsToTxn(
                kafka_protocol::messages::AddOffsetsToTxnResponse::default().with_error_code(code),
            ))
        }
        R::EndTxn(r) => {
            if !txn_ok(authz, Operation::Write, r.transactional_id.0.as_str()) {
                return Reply::Respond(S::EndTxn(
                    kafka_protocol::messages::EndTxnResponse::default()
                        .with_error_code(TXN_DENIED)
                        .with_producer_id(kafka_protocol::messages::ProducerId(-1))
                        .with_producer_epoch(-1),
                ));
            }
            Reply::Respond(S::EndTxn(txn::end_txn(broker, version, r).await))
        }
        R::DescribeTransactions(mut r) => {
            use kafka_protocol::messages::describe_transactions_response::TransactionState;
            let (ok, denied): (Vec<_>, Vec<_>) = std::mem::take(&mut r.transactional_ids)
                .into_iter()
                .partition(|id| txn_ok(authz, Operation::Describe, id.0.as_str()));
            r.transactional_ids = ok;
            let mut resp = txn::describe(broker, r).await;
            resp.transaction_states.extend(denied.into_iter().map(|id| {
                TransactionState::default()
                    .with_error_code(TXN_DENIED)
                    .with_transactional_id(id)
                    .with_producer_id(kafka_protocol::messages::ProducerId(-1))
                    .with_producer_epoch(-1)
            }));
            Reply::Respond(S::DescribeTransactions(resp))
        }
        R::ListTransactions(r) => {
            let mut resp = txn::list(broker, version, r).await;
            if authz.enabled() {
                resp.transaction_states.retain(|t| {
                    authz.may(
                        Operation::Describe,
                        ResourceType::TransactionalId,
                        t.transactional_id.0.as_str(),
                    )
                });
            }
            Reply::Respond(S::ListTransactions(resp))
        }
        R::DescribeConfigs(mut r) => {
            use kafka_protocol::messages::describe_configs_response::DescribeConfigsResult;
            let mut denied = Vec::new();
            r.resources.retain(|res| {
                match authorize::config_resource(
                    authz,
                    res.resource_type,
                    res.resource_name.as_str(),
                    Operation::DescribeConfigs,
                ) {
                    None => true,
                    Some(code) => {
                        denied.push(
                            DescribeConfigsResult::default()
                                .with_error_code(code)
                                .with_error_message(Some(str_bytes(
                                    ResponseError::try_from_code(code)
                                        .map(|e| e.to_string())
                                        .unwrap_or_default(),
                                )))
                                .with_resource_type(res.resource_type)
                                .with_resource_name(res.resource_name.clone()),
                        );
                        false
                    }
                }
            });
            let mut resp = describe_configs::handle(broker, version, r);
            resp.results.extend(denied);
            Reply::Respond(S::DescribeConfigs(resp))
        }
        R::DescribeQuorum(r) => {
            if !authz.allows_cluster(Operation::Describe) {
                return Reply::Respond(S::DescribeQuorum(
                    kafka_protocol::messages::DescribeQuorumResponse::default()
                        .with_error_code(CLUSTER_DENIED)
                        .with_error_message(Some(str_bytes(
                            ResponseError::ClusterAuthorizationFailed.to_string(),
                        ))),
                ));
            }
            Reply::Respond(S::DescribeQuorum(
                describe_quorum::handle(broker, version, r).await,
            ))
        }
        R::DescribeCluster(r) => {
            let requested = r.include_cluster_authorized_operations;
            let mut resp = describe_cluster::handle(broker, &ctx.listener, version, r);
            if requested {
                resp.cluster_authorized_operations = authz.operations(
                    ResourceType::Cluster,
                    crate::authz::CLUSTER_NAME,
                    crate::authz::CLUSTER_OPERATIONS,
                );
            }
            Reply::Respond(S::DescribeCluster(resp))
        }
        R::DeleteRecords(mut r) => {
            let denied = authorize::delete_records(authz, &mut r);
            let mut resp = delete_records::handle(broker, version, r);
            resp.topics.extend(denied);
            Reply::Respond(S::DeleteRecords(resp))
        }
        R::AlterConfigs(mut r) => {
            use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
            let mut denied = Vec::new();
            r.resources.retain(|res| {
                match authorize::config_resource(
                    authz,
                    res.resource_type,
                    res.resource_name.as_str(),
                    Operation::AlterConfigs,
                ) {
                    None => true,
                    Some(code) => {
                        denied.push(
                            AlterConfigsResourceResponse::default()
                                .with_error_code(code)
                                .with_resource_type(res.resource_type)
                                .with_resource_name(res.resource_name.clone()),
                        );
                        false
                    }
                }
            });
            let mut resp = alter_configs::handle_alter(broker, version, r).await;
            resp.responses.extend(denied);
            Reply::Respond(S::AlterConfigs(resp))
        }
        R::IncrementalAlterConfigs(mut r) => {
            use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
            let mut denied = Vec::new();
            r.resources.retain(|res| {
                match authorize::config_resource(
                    authz,
                    res.resource_type,
                    res.resource_name.as_str(),
                    Operation::AlterConfigs,
                ) {
                    None => true,
                    Some(code) => {
                        denied.push(
                            AlterConfigsResourceResponse::default()
                                .with_error_code(code)
                                .with_resource_type(res.resource_type)
                                .with_resource_name(res.resource_name.clone()),
                        );
                        false
                    }
                }
            });
            let mut resp = alter_configs::handle_incremental(broker, version, r).await;
            resp.responses.extend(denied);
            Reply::Respond(S::IncrementalAlterConfigs(resp))
        }
        R::DescribeClientQuotas(r) => {
            if !authz.allows_cluster(Operation::DescribeConfigs) {
                return Reply::Respond(S::DescribeClientQuotas(
                    kafka_protocol::messages::DescribeClientQuotasResponse::default()
                        .with_error_code(CLUSTER_DENIED)
                        .with_error_message(Some(str_bytes(
                            ResponseError::ClusterAuthorizationFailed.to_string(),
                        ))),
                ));
            }
            Reply::Respond(S::DescribeClientQuotas(client_quotas::describe(broker, r)))
        }
        R::AlterClientQuotas(r) => {
            use kafka_protocol::messages::alter_client_quotas_response::{EntityData, EntryData};
            // Kafka: AlterConfigs on the cluster, else every entry fails.
            if !authz.allows_cluster(Operation::AlterConfigs) {
                let message = ResponseError::ClusterAuthorizationFailed.to_string();
                let entries = r
                    .entries
                    .iter()
                    .map(|entry| {
                        EntryData::default()
                            .with_error_code(CLUSTER_DENIED)
                            .with_error_message(Some(str_bytes(message.clone())))
                            .with_entity(
                                entry
                                    .entity
                                    .iter()
                                    .map(|e| {
                                        EntityData::default()
                                            .with_entity_type(e.entity_type.clone())
                                            .with_entity_name(e.entity_name.clone())
                                    })
                                    .collect(),
                            )
                    })
                    .collect();
                return Reply::Respond(S::AlterClientQuotas(
                    kafka_protocol::messages::AlterClientQuotasResponse::default()
                        .with_entries(entries),
                ));
            }
            Reply::Respond(S::AlterClientQuotas(client_quotas::alter(broker, r).await))
        }
        R::AlterUserScramCredentials(r) => {
            use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
            if !authz.allows_cluster(Operation::Alter) {
                let users = r
                    .deletions
                    .iter()
                    .map(|d| d.name.clone())
                    .chain(r.upsertions.iter().map(|u| u.name.clone()));
                let results = users
                    .map(|user| {
                        AlterUserScramCredentialsResult::default()
                            .with_user(user)
                            .with_error_code(CLUSTER_DENIED)
                            .with_error_message(Some(str_bytes(
                                ResponseError::ClusterAuthorizationFailed.to_string(),
                            )))
                    })
                    .collect();
                return Reply::Respond(S::AlterUserScramCredentials(
                    kafka_protocol::messages::AlterUserScramCredentialsResponse::default()
                        .with_results(results),
                ));
            }
            Reply::Respond(S::AlterUserScramCredentials(scram::alter(broker, r).await))
        }
        R::DescribeUserScramCredentials(r) => {
            if !authz.allows_cluster(Operation::Describe) {
                return Reply::Respond(S::DescribeUserScramCredentials(
                    kafka_protocol::messages::DescribeUserScramCredentialsResponse::default()
                        .with_error_code(CLUSTER_DENIED)
                        .with_error_message(Some(str_bytes(
                            ResponseError::ClusterAuthorizationFailed.to_string(),
                        ))),
                ));
            }
            Reply::Respond(S::DescribeUserScramCredentials(scram::describe(broker, r)))
        }
        R::CreateAcls(r) => Reply::Respond(S::CreateAcls(acls::create(broker, authz, r).await)),
        R::DescribeAcls(r) => Reply::Respond(S::DescribeAcls(acls::describe(broker, authz, r))),
        R::DeleteAcls(r) => Reply::Respond(S::DeleteAcls(acls::delete(broker, authz, r).await)),
        R::FindCoordinator(mut r) => {
            use kafka_protocol::messages::find_coordinator_response::Coordinator;
            // Group Describe for a group's coordinator, TransactionalId
            // Describe for a transaction's, ClusterAction for a
            // share-partition's (only brokers ask for those).
            let share_allowed = authz.allows_cluster(Operation::ClusterAction);
            let allowed = |key: &str| match r.key_type {
                1 => txn_ok(authz, Operation::Describe, key),
                2 => share_allowed,
                _ => group_ok(authz, Operation::Describe, key),
            };
            let code = match r.key_type {
                1 => TXN_DENIED,
                2 => CLUSTER_DENIED,
                _ => GROUP_DENIED,
            };
            if version < 4 {
                if !allowed(r.key.as_str()) {
                    return Reply::Respond(S::FindCoordinator(
                        kafka_protocol::messages::FindCoordinatorResponse::default()
                            .with_error_code(code)
                            .with_node_id(kafka_protocol::messages::BrokerId(-1))
                            .with_port(-1),
                    ));
                }
                return Reply::Respond(S::FindCoordinator(
                    find_coordinator::handle(broker, &ctx.listener, version, r).await,
                ));
            }
            let (ok, denied): (Vec<_>, Vec<_>) = std::mem::take(&mut r.coordinator_keys)
                .into_iter()
                .partition(|k| allowed(k.as_str()));
            r.coordinator_keys = ok;
            let mut resp = find_coordinator::handle(broker, &ctx.listener, version, r).await;
            resp.coordinators.extend(denied.into_iter().map(|key| {
                Coordinator::default()
                    .with_key(key)
                    .with_node_id(kafka_protocol::messages::BrokerId(-1))
                    .with_port(-1)
                    .with_error_code(code)
            }));
            Reply::Respond(S::FindCoordinator(resp))
        }
        R::JoinGroup(r) => {
            if !group_ok(authz, Operation::Read, r.group_id.0.as_str()) {
                return Reply::Respond(S::JoinGroup(
                    kafka_protocol::messages::JoinGroupResponse::default()
                        .with_error_code(GROUP_DENIED)
                        .with_generation_id(-1)
                        .with_member_id(r.member_id),
                ));
            }
            Reply::Respond(S::JoinGroup(
                join_group::handle(broker, ctx, version, r).await,
            ))
        }
        R::SyncGroup(r) => {
            if !group_ok(authz, Operation::Read, r.group_id.0.as_str()) {
                return Reply::Respond(S::SyncGroup(
                    kafka_protocol::messages::SyncGroupResponse::default()
                        .with_error_code(GROUP_DENIED),
                ));
            }
            Reply::Respond(S::SyncGroup(sync_group::handle(broker, version, r).await))
        }
        R::Heartbeat(r) => {
            if !group_ok(authz, Operation::Read, r.group_id.0.as_str()) {
                return Reply::Respond(S::Heartbeat(
                    kafka_protocol::messages::HeartbeatResponse::default()
                        .with_error_code(GROUP_DENIED),
                ));
            }
            Reply::Respond(S::Heartbeat(heartbeat::handle(broker, r).await))
        }
        R::LeaveGroup(r) => {
            if !group_ok(authz, Operation::Read, r.group_id.0.as_str()) {
                return Reply::Respond(S::LeaveGroup(
                    kafka_protocol::messages::LeaveGroupResponse::default()
                        .with_error_code(GROUP_DENIED),
                ));
            }
            Reply::Respond(S::LeaveGroup(leave_group::handle(broker, version, r).await))
        }
        R::OffsetCommit(mut r) => {
            if !group_ok(authz, Operation::Read, r.group_id.0.as_str()) {
                let topics = r
                    .topics
                    .iter()
                    .map(|t| authorize::offset_commit_denied(t, GROUP_DENIED))
                    .collect();
                return Reply::Respond(S::OffsetCommit(
                    kafka_protocol::messages::OffsetCommitResponse::default().with_topics(topics),
                ));
            }
            let denied = authorize::offset_commit(authz, &mut r);
            let mut resp = offset_commit::handle(broker, version, r).await;
            resp.topics.extend(denied);
            Reply::Respond(S::OffsetCommit(resp))
        }
        R::OffsetFetch(r) => Reply::Respond(S::OffsetFetch(
            offset_fetch(broker, authz, version, r).await,
        )),
        R::TxnOffsetCommit(mut r) => match authorize::txn_offset_commit(authz, &mut r) {
            Err(whole) => Reply::Respond(S::TxnOffsetCommit(whole)),
            Ok(denied) => {
                let mut resp = if r.topics.is_empty() && !denied.is_empty() {
                    Default::default()
                } else {
                    txn_offset_commit::handle(broker, version, r).await
                };
                resp.topics.extend(denied);
                Reply::Respond(S::TxnOffsetCommit(resp))
            }
        },
        R::OffsetDelete(mut r) => {
            if !group_ok(authz, Operation::Delete, r.group_id.0.as_str()) {
                return Reply::Respond(S::OffsetDelete(
                    kafka_protocol::messages::OffsetDeleteResponse::default()
                        .with_error_code(GROUP_DENIED),
                ));
            }
            let denied = authorize::offset_delete(authz, &mut r);
            let mut resp = offset_delete::handle(broker, r).await;
            resp.topics.extend(denied);
            Reply::Respond(S::OffsetDelete(resp))
        }
        R::OffsetForLeaderEpoch(mut r) => {
            let denied = authorize::offset_for_leader_epoch(authz, &mut r);
            let mut resp = offset_for_leader_epoch::handle(broker, version, r);
            resp.topics.extend(denied);
            Reply::Respond(S::OffsetForLeaderEpoch(resp))
        }
        R::ListGroups(r) => {
            let mut resp = list_groups::handle(broker, version, r).await;
            // Describe on the cluster lists every group; otherwise the groups
            // the principal may describe.
            if authz.enabled()
                && !authz.may(
                    Operation::Describe,
                    ResourceType::Cluster,
                    crate::authz::CLUSTER_NAME,
                )
            {
                resp.groups.retain(|g| {
                    authz.may(
                        Operation::Describe,
                        ResourceType::Group,
                        g.group_id.0.as_str(),
                    )
                });
            }
            Reply::Respond(S::ListGroups(resp))
        }
        R::DescribeGroups(mut r) => {
            use kafka_protocol::messages::describe_groups_response::DescribedGroup;
            let requested = r.include_authorized_operations;
            let (ok, denied): (Vec<_>, Vec<_>) = std::mem::take(&mut r.groups)
                .into_iter()
                .partition(|g| group_ok(authz, Operation::Describe, g.0.as_str()));
            r.groups = ok;
            let mut resp = describe_groups::handle(broker, r).await;
            if requested && authz.enabled() {
                for g in &mut resp.groups {
                    g.authorized_operations = authz.operations(
                        ResourceType::Group,
                        g.group_id.0.as_str(),
                        GROUP_OPERATIONS,
                    );
                }
            }
            resp.groups.extend(denied.into_iter().map(|g| {
                DescribedGroup::default()
                    .with_error_code(GROUP_DENIED)
                    .with_group_id(g)
                    .with_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED)
            }));
            Reply::Respond(S::DescribeGroups(resp))
        }
        R::DeleteGroups(mut r) => {
            use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
            let (ok, denied): (Vec<_>, Vec<_>) = std::mem::take(&mut r.groups_names)
                .into_iter()
                .partition(|g| group_ok(authz, Operation::Delete, g.0.as_str()));
            r.groups_names = ok;
            let mut resp = delete_groups::handle(broker, r).await;
            resp.results.extend(denied.into_iter().map(|g| {
                DeletableGroupResult::default()
                    .with_group_id(g)
                    .with_error_code(GROUP_DENIED)
            }));
            Reply::Respond(S::DeleteGroups(resp))
        }
        R::ConsumerGroupHeartbeat(r) => {
            if !group_ok(authz, Operation::Read, r.group_id.0.as_str()) {
                return Reply::Respond(S::ConsumerGroupHeartbeat(
                    kafka_protocol::messages::ConsumerGroupHeartbeatResponse::default()
                        .with_error_code(GROUP_DENIED)
                        .with_error_message(Some(str_bytes(
                            ResponseError::GroupAuthorizationFailed.to_string(),
                        ))),
                ));
            }
            Reply::Respond(S::ConsumerGroupHeartbeat(
                consumer_group_heartbeat::handle(broker, ctx, version, r).await,
            ))
        }
        R::ConsumerGroupDescribe(mut r) => {
            use kafka_protocol::messages::consumer_group_describe_response::DescribedGroup;
            let requested = r.include_authorized_operations;
            let (ok, denied): (Vec<_>, Vec<_>) = std::mem::take(&mut r.group_ids)
                .into_iter()
                .partition(|g| group_ok(authz, Operation::Describe, g.0.as_str()));
            r.group_ids = ok;
            let mut resp = consumer_group_describe::handle(broker, version, r).await;
            if requested && authz.enabled() {
                for g in &mut resp.groups {
                    g.authorized_operations = authz.operations(
                        ResourceType::Group,
                        g.group_id.0.as_str(),
                        GROUP_OPERATIONS,
                    );
                }
            }
            resp.groups.extend(denied.into_iter().map(|g| {
                DescribedGroup::default()
                    .with_error_code(GROUP_DENIED)
                    .with_group_id(g)
                    .with_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED)
            }));
            Reply::Respond(S::ConsumerGroupDescribe(resp))
        }
        R::WriteTxnMarkers(r) => match authorize::write_txn_markers(authz, &r) {
            Some(denied) => Reply::Respond(S::WriteTxnMarkers(denied)),
            None => Reply::Respond(S::WriteTxnMarkers(
                write_txn_markers::handle(broker, version, r).await,
            )),
        },
        // Share groups (KIP-932).
        R::ShareGroupHeartbeat(r) => {
            if !group_ok(authz, Operation::Read, r.group_id.0.as_str()) {
                return Reply::Respond(S::ShareGroupHeartbeat(
                    kafka_protocol::messages::ShareGroupHeartbeatResponse::default()
                        .with_error_code(GROUP_DENIED)
                        .with_error_message(Some(str_bytes(
                            ResponseError::GroupAuthorizationFailed.to_string(),
                        ))),
                ));
            }
            Reply::Respond(S::ShareGroupHeartbeat(
                share_group::heartbeat(broker, ctx, r).await,
            ))
        }
        R::ShareGroupDescribe(mut r) => {
            use kafka_protocol::messages::share_group_describe_response::DescribedGroup;
            let requested = r.include_authorized_operations;
            let (ok, denied): (Vec<_>, Vec<_>) = std::mem::take(&mut r.group_ids)
                .into_iter()
                .partition(|g| group_ok(authz, Operation::Describe, g.0.as_str()));
            r.group_ids = ok;
            let mut resp = share_group::describe(broker, r).await;
            if requested && authz.enabled() {
                for g in &mut resp.groups {
                    g.authorized_operations = authz.operations(
                        ResourceType::Group,
                        g.group_id.0.as_str(),
                        GROUP_OPERATIONS,
                    );
                }
            }
            resp.groups.extend(denied.into_iter().map(|g| {
                DescribedGroup::default()
                    .with_error_code(GROUP_DENIED)
                    .with_group_id(g)
                    .with_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED)
            }));
            Reply::Respond(S::ShareGroupDescribe(resp))
        }
        R::ShareFetch(r) => Reply::Respond(S::ShareFetch(
            share_fetch::fetch(broker, ctx, authz, r, newer).await,
        )),
        R::ShareAcknowledge(r) => {
            Reply::Newer(share_fetch::acknowledge(broker, ctx, authz, r, version, newer).await)
        }
        R::DescribeShareGroupOffsets(r) => {
            Reply::Newer(share_offsets::describe(broker, authz, r, version).await)
        }
        R::AlterShareGroupOffsets(r) => Reply::Respond(S::AlterShareGroupOffsets(
            share_offsets::alter(broker, authz, r).await,
        )),
        R::DeleteShareGroupOffsets(r) => Reply::Respond(S::DeleteShareGroupOffsets(
            share_offsets::delete(broker, authz, r).await,
        )),
        // The share coordinator's APIs, between brokers: CLUSTER_ACTION.
        R::InitializeShareGroupState(r) => Reply::Respond(S::InitializeShareGroupState(
            share_state::initialize(broker, authz.allows_cluster(Operation::ClusterAction), r)
                .await,
        )),
        R::ReadShareGroupState(r) => Reply::Respond(S::ReadShareGroupState(
            share_state::read(broker, authz.allows_cluster(Operation::ClusterAction), r).await,
        )),
        R::WriteShareGroupState(r) => Reply::Respond(S::WriteShareGroupState(
            share_state::write(broker, authz.allows_cluster(Operation::ClusterAction), r).await,
        )),
        R::DeleteShareGroupState(r) => Reply::Respond(S::DeleteShareGroupState(
            share_state::delete(broker, authz.allows_cluster(Operation::ClusterAction), r).await,
        )),
        R::ReadShareGroupStateSummary(r) => Reply::Respond(S::ReadShareGroupStateSummary(
            share_state::read_summary(broker, authz.allows_cluster(Operation::ClusterAction), r)
                .await,
        )),
        R::DescribeLogDirs(r) => {
            let allowed = authz.allows_cluster(Operation::Describe);
            Reply::Respond(S::DescribeLogDirs(describe_log_dirs::handle(
                broker, version, r, allowed,
            )))
        }
        R::ElectLeaders(r) => {
            let allowed = authz.allows_cluster(Operation::Alter);
            Reply::Respond(S::ElectLeaders(
                elect_leaders::handle(broker, version, r, allowed).await,
            ))
        }
        R::DescribeProducers(mut r) => {
            let denied = authorize::describe_producers(authz, &mut r);
            let mut resp = describe_producers::handle(broker, version, r);
            resp.topics.extend(denied);
            Reply::Respond(S::DescribeProducers(resp))
        }
        _ => Reply::Unsupported,
    }
}

/// OffsetFetch's checks: group Describe (one group before v8, each group
/// from v8), then Describe per topic.
async fn offset_fetch(
    broker: &Broker,
    authz: &Authz<'_>,
    version: i16,
    mut r: kafka_protocol::messages::OffsetFetchRequest,
) -> kafka_protocol::messages::OffsetFetchResponse {
    use kafka_protocol::messages::offset_fetch_response::OffsetFetchResponseGroup;
    use kafka_protocol::messages::OffsetFetchResponse;
    if !authz.enabled() {
        return offset_fetch::handle(broker, version, r).await;
    }
    if version < 8 {
        if !group_ok(authz, Operation::Describe, r.group_id.0.as_str()) {
            return OffsetFetchResponse::default().with_error_code(GROUP_DENIED);
        }
        let named = r.topics.is_some();
        let mut resp = offset_fetch::handle(broker, version, r).await;
        authorize::offset_fetch_filter(authz, &mut resp, |_| named);
        return resp;
    }
    let (ok, denied): (Vec<_>, Vec<_>) = std::mem::take(&mut r.groups)
        .into_iter()
        .partition(|g| group_ok(authz, Operation::Describe, g.group_id.0.as_str()));
    r.groups = ok;
    let named: std::collections::HashSet<String> = r
        .groups
        .iter()
        .filter(|g| g.topics.is_some())
        .map(|g| g.group_id.0.to_string())
        .collect();
    let mut resp = if r.groups.is_empty() {
        OffsetFetchResponse::default()
    } else {
        offset_fetch::handle(broker, version, r).await
    };
    authorize::offset_fetch_filter(authz, &mut resp, |g| named.contains(g));
    resp.groups.extend(denied.into_iter().map(|g| {
        OffsetFetchResponseGroup::default()
            .with_group_id(g.group_id)
            .with_error_code(GROUP_DENIED)
    }));
    resp
}

/// `authorized_operations` when the client did not ask for them (Kafka's
/// Integer.MIN_VALUE).
pub(crate) const AUTHORIZED_OPERATIONS_OMITTED: i32 = i32::MIN;

/// A group's `authorized_operations`: READ (3), DELETE (6) and DESCRIBE (8),
/// all a group allows; with no authorizer every client may do all of it.
pub(crate) fn group_authorized_operations(requested: bool) -> i32 {
    if requested {
        (1 << 3) | (1 << 6) | (1 << 8)
    } else {
        AUTHORIZED_OPERATIONS_OMITTED
    }
}

pub(crate) fn str_bytes(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}
