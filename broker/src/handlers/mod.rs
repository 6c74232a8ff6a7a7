//! One handler per API key, and the one exhaustive dispatch. The APIs listed
//! here are exactly those in `protocol::versions::SUPPORTED_APIS`; a request
//! for any other key never reaches this point (the connection answers it).

mod alter_configs;
mod api_versions;
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
mod describe_producers;
mod describe_quorum;
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
mod sync_group;
mod txn;
mod txn_offset_commit;
pub mod write_txn_markers;

use kafka_protocol::messages::{RequestKind, ResponseKind};
use kafka_protocol::protocol::StrBytes;

use crate::broker::Broker;

/// What the connection does with a request's outcome.
// The large variant is the common case and is moved once per request;
// boxing it would add an allocation to every response for no gain.
#[allow(clippy::large_enum_variant)]
pub enum Reply {
    Respond(ResponseKind),
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
}

pub async fn dispatch(
    broker: &Broker,
    ctx: &RequestContext,
    version: i16,
    request: RequestKind,
) -> Reply {
    use RequestKind as R;
    use ResponseKind as S;
    match request {
        R::ApiVersions(r) => {
            Reply::Respond(S::ApiVersions(api_versions::handle(broker, version, r)))
        }
        R::Metadata(r) => Reply::Respond(S::Metadata(
            metadata::handle(broker, &ctx.listener, version, r).await,
        )),
        R::Produce(r) => match produce::handle(broker, &ctx.listener, version, r).await {
            Some(resp) => Reply::Respond(S::Produce(resp)),
            None => Reply::NoResponse,
        },
        R::Fetch(r) => Reply::Fetch(fetch::handle(broker, ctx, version, r).await),
        R::ListOffsets(r) => {
            Reply::Respond(S::ListOffsets(list_offsets::handle(broker, version, r)))
        }
        R::CreateTopics(r) => Reply::Respond(S::CreateTopics(
            create_topics::handle(broker, version, r).await,
        )),
        R::DeleteTopics(r) => Reply::Respond(S::DeleteTopics(
            delete_topics::handle(broker, version, r).await,
        )),
        R::CreatePartitions(r) => Reply::Respond(S::CreatePartitions(
            create_partitions::handle(broker, version, r).await,
        )),
        R::InitProducerId(r) => Reply::Respond(S::InitProducerId(
            init_producer_id::handle(broker, version, r).await,
        )),
        R::AddPartitionsToTxn(r) => Reply::Respond(S::AddPartitionsToTxn(
            txn::add_partitions(broker, version, r).await,
        )),
        R::AddOffsetsToTxn(r) => {
            Reply::Respond(S::AddOffsetsToTxn(txn::add_offsets(broker, r).await))
        }
        R::EndTxn(r) => Reply::Respond(S::EndTxn(txn::end_txn(broker, version, r).await)),
        R::DescribeTransactions(r) => {
            Reply::Respond(S::DescribeTransactions(txn::describe(broker, r).await))
        }
        R::ListTransactions(r) => {
            Reply::Respond(S::ListTransactions(txn::list(broker, version, r).await))
        }
        R::DescribeConfigs(r) => Reply::Respond(S::DescribeConfigs(describe_configs::handle(
            broker, version, r,
        ))),
        R::DescribeQuorum(r) => Reply::Respond(S::DescribeQuorum(
            describe_quorum::handle(broker, version, r).await,
        )),
        R::DescribeCluster(r) => Reply::Respond(S::DescribeCluster(describe_cluster::handle(
            broker,
            &ctx.listener,
            version,
            r,
        ))),
        R::DeleteRecords(r) => {
            Reply::Respond(S::DeleteRecords(delete_records::handle(broker, version, r)))
        }
        R::AlterConfigs(r) => Reply::Respond(S::AlterConfigs(
            alter_configs::handle_alter(broker, version, r).await,
        )),
        R::IncrementalAlterConfigs(r) => Reply::Respond(S::IncrementalAlterConfigs(
            alter_configs::handle_incremental(broker, version, r).await,
        )),
        R::DescribeClientQuotas(r) => {
            Reply::Respond(S::DescribeClientQuotas(client_quotas::describe(broker, r)))
        }
        R::AlterClientQuotas(r) => {
            Reply::Respond(S::AlterClientQuotas(client_quotas::alter(broker, r).await))
        }
        R::AlterUserScramCredentials(r) => {
            Reply::Respond(S::AlterUserScramCredentials(scram::alter(broker, r).await))
        }
        R::DescribeUserScramCredentials(r) => {
            Reply::Respond(S::DescribeUserScramCredentials(scram::describe(broker, r)))
        }
        R::FindCoordinator(r) => Reply::Respond(S::FindCoordinator(
            find_coordinator::handle(broker, &ctx.listener, version, r).await,
        )),
        R::JoinGroup(r) => Reply::Respond(S::JoinGroup(
            join_group::handle(broker, ctx, version, r).await,
        )),
        R::SyncGroup(r) => {
            Reply::Respond(S::SyncGroup(sync_group::handle(broker, version, r).await))
        }
        R::Heartbeat(r) => Reply::Respond(S::Heartbeat(heartbeat::handle(broker, r).await)),
        R::LeaveGroup(r) => {
            Reply::Respond(S::LeaveGroup(leave_group::handle(broker, version, r).await))
        }
        R::OffsetCommit(r) => Reply::Respond(S::OffsetCommit(
            offset_commit::handle(broker, version, r).await,
        )),
        R::OffsetFetch(r) => Reply::Respond(S::OffsetFetch(
            offset_fetch::handle(broker, version, r).await,
        )),
        R::TxnOffsetCommit(r) => Reply::Respond(S::TxnOffsetCommit(
            txn_offset_commit::handle(broker, version, r).await,
        )),
        R::OffsetDelete(r) => {
            Reply::Respond(S::OffsetDelete(offset_delete::handle(broker, r).await))
        }
        R::OffsetForLeaderEpoch(r) => Reply::Respond(S::OffsetForLeaderEpoch(
            offset_for_leader_epoch::handle(broker, version, r),
        )),
        R::ListGroups(r) => {
            Reply::Respond(S::ListGroups(list_groups::handle(broker, version, r).await))
        }
        R::DescribeGroups(r) => {
            Reply::Respond(S::DescribeGroups(describe_groups::handle(broker, r).await))
        }
        R::DeleteGroups(r) => {
            Reply::Respond(S::DeleteGroups(delete_groups::handle(broker, r).await))
        }
        R::ConsumerGroupHeartbeat(r) => Reply::Respond(S::ConsumerGroupHeartbeat(
            consumer_group_heartbeat::handle(broker, ctx, version, r).await,
        )),
        R::ConsumerGroupDescribe(r) => Reply::Respond(S::ConsumerGroupDescribe(
            consumer_group_describe::handle(broker, version, r).await,
        )),
        R::WriteTxnMarkers(r) => Reply::Respond(S::WriteTxnMarkers(
            write_txn_markers::handle(broker, version, r).await,
        )),
        R::DescribeProducers(r) => Reply::Respond(S::DescribeProducers(
            describe_producers::handle(broker, version, r),
        )),
        _ => Reply::Unsupported,
    }
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
