//! One handler per API key, and the one exhaustive dispatch. The APIs listed
//! here are exactly those in `protocol::versions::SUPPORTED_APIS`; a request
//! for any other key never reaches this point (the connection answers it).

mod alter_configs;
mod api_versions;
mod create_partitions;
mod create_topics;
mod delete_records;
mod delete_topics;
mod describe_cluster;
mod describe_configs;
mod fetch;
mod init_producer_id;
mod list_offsets;
mod metadata;
mod produce;

use kafka_protocol::messages::{RequestKind, ResponseKind};
use kafka_protocol::protocol::StrBytes;

use crate::broker::Broker;

/// What the connection does with a request's outcome.
// The large variant is the common case and is moved once per request;
// boxing it would add an allocation to every response for no gain.
#[allow(clippy::large_enum_variant)]
pub enum Reply {
    Respond(ResponseKind),
    /// Produce with acks=0: Kafka sends nothing back.
    NoResponse,
    /// The request is valid framing but its API is not one we serve.
    Unsupported,
}

pub async fn dispatch(broker: &Broker, version: i16, request: RequestKind) -> Reply {
    use RequestKind as R;
    use ResponseKind as S;
    match request {
        R::ApiVersions(r) => Reply::Respond(S::ApiVersions(api_versions::handle(version, r))),
        R::Metadata(r) => Reply::Respond(S::Metadata(metadata::handle(broker, version, r).await)),
        R::Produce(r) => match produce::handle(broker, version, r).await {
            Some(resp) => Reply::Respond(S::Produce(resp)),
            None => Reply::NoResponse,
        },
        R::Fetch(r) => Reply::Respond(S::Fetch(fetch::handle(broker, version, r).await)),
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
        R::DescribeConfigs(r) => Reply::Respond(S::DescribeConfigs(describe_configs::handle(
            broker, version, r,
        ))),
        R::DescribeCluster(r) => Reply::Respond(S::DescribeCluster(describe_cluster::handle(
            broker, version, r,
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
        _ => Reply::Unsupported,
    }
}

pub(crate) fn str_bytes(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}
