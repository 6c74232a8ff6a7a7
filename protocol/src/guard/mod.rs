//! Pre-decode bounds check for request bodies.
//!
//! kafka-protocol 0.18 sizes its vectors from counts read off the wire
//! (`Vec::with_capacity(n)` in its array decoders), so a few hostile bytes
//! could ask for gigabytes and abort the process. Before any body reaches
//! that decoder, [`check_request_body`] walks it against a schema of the same
//! message and refuses it unless every declared count and length fits in the
//! bytes that actually remain. The walk borrows the body and allocates
//! nothing, whatever the counts say.
//!
//! Fitting in the bytes is not enough on its own: a decoded element is far
//! larger than its wire form (a Metadata topic takes 2 bytes on the wire and
//! about 70 in memory). So the walk also adds up what the decoder will
//! allocate ([`BodyWalk::decoded_bytes`]: count x element size for every
//! array, from `size_of` the generated structs, and the map of unknown
//! tagged fields), which the broker charges to its memory budget before it
//! decodes.
//!
//! The schemas (`schemas.rs`) are generated from kafka-protocol's own
//! decoders by `protocol/tools/gen_guard_schemas.py`, so the guard reads
//! exactly the fields the decoder will; the round-trip tests prove it for
//! every supported version.

mod schema;
// One field per line reads as a table; rustfmt would wrap the long ones.
#[rustfmt::skip]
mod schemas;

use kafka_protocol::messages::ApiKey;

use schema::Message;
pub use schema::{BodyWalk, GuardError};

fn schema_for(api_key: ApiKey) -> Option<&'static Message> {
    use schemas::*;
    Some(match api_key {
        ApiKey::Produce => &PRODUCE,
        ApiKey::Fetch => &FETCH,
        ApiKey::ListOffsets => &LIST_OFFSETS,
        ApiKey::Metadata => &METADATA,
        ApiKey::OffsetCommit => &OFFSET_COMMIT,
        ApiKey::OffsetFetch => &OFFSET_FETCH,
        ApiKey::FindCoordinator => &FIND_COORDINATOR,
        ApiKey::JoinGroup => &JOIN_GROUP,
        ApiKey::Heartbeat => &HEARTBEAT,
        ApiKey::LeaveGroup => &LEAVE_GROUP,
        ApiKey::SyncGroup => &SYNC_GROUP,
        ApiKey::DescribeGroups => &DESCRIBE_GROUPS,
        ApiKey::ListGroups => &LIST_GROUPS,
        ApiKey::ApiVersions => &API_VERSIONS,
        ApiKey::CreateTopics => &CREATE_TOPICS,
        ApiKey::DeleteTopics => &DELETE_TOPICS,
        ApiKey::DeleteRecords => &DELETE_RECORDS,
        ApiKey::InitProducerId => &INIT_PRODUCER_ID,
        ApiKey::DescribeConfigs => &DESCRIBE_CONFIGS,
        ApiKey::DeleteGroups => &DELETE_GROUPS,
        ApiKey::CreatePartitions => &CREATE_PARTITIONS,
        ApiKey::OffsetDelete => &OFFSET_DELETE,
        ApiKey::DescribeCluster => &DESCRIBE_CLUSTER,
        ApiKey::ConsumerGroupHeartbeat => &CONSUMER_GROUP_HEARTBEAT,
        ApiKey::ConsumerGroupDescribe => &CONSUMER_GROUP_DESCRIBE,
        ApiKey::AlterConfigs => &ALTER_CONFIGS,
        ApiKey::IncrementalAlterConfigs => &INCREMENTAL_ALTER_CONFIGS,
        ApiKey::OffsetForLeaderEpoch => &OFFSET_FOR_LEADER_EPOCH,
        ApiKey::DescribeQuorum => &DESCRIBE_QUORUM,
        ApiKey::WriteTxnMarkers => &WRITE_TXN_MARKERS,
        ApiKey::DescribeProducers => &DESCRIBE_PRODUCERS,
        ApiKey::ElectLeaders => &ELECT_LEADERS,
        ApiKey::DescribeLogDirs => &DESCRIBE_LOG_DIRS,
        ApiKey::TxnOffsetCommit => &TXN_OFFSET_COMMIT,
        ApiKey::AddPartitionsToTxn => &ADD_PARTITIONS_TO_TXN,
        ApiKey::AddOffsetsToTxn => &ADD_OFFSETS_TO_TXN,
        ApiKey::EndTxn => &END_TXN,
        ApiKey::DescribeTransactions => &DESCRIBE_TRANSACTIONS,
        ApiKey::ListTransactions => &LIST_TRANSACTIONS,
        ApiKey::DescribeAcls => &DESCRIBE_ACLS,
        ApiKey::CreateAcls => &CREATE_ACLS,
        ApiKey::DeleteAcls => &DELETE_ACLS,
        ApiKey::SaslHandshake => &SASL_HANDSHAKE,
        ApiKey::DescribeClientQuotas => &DESCRIBE_CLIENT_QUOTAS,
        ApiKey::AlterClientQuotas => &ALTER_CLIENT_QUOTAS,
        ApiKey::SaslAuthenticate => &SASL_AUTHENTICATE,
        ApiKey::DescribeUserScramCredentials => &DESCRIBE_USER_SCRAM_CREDENTIALS,
        ApiKey::AlterUserScramCredentials => &ALTER_USER_SCRAM_CREDENTIALS,
        ApiKey::ShareGroupHeartbeat => &SHARE_GROUP_HEARTBEAT,
        ApiKey::ShareGroupDescribe => &SHARE_GROUP_DESCRIBE,
        ApiKey::ShareFetch => &SHARE_FETCH,
        ApiKey::ShareAcknowledge => &SHARE_ACKNOWLEDGE,
        ApiKey::DescribeShareGroupOffsets => &DESCRIBE_SHARE_GROUP_OFFSETS,
        ApiKey::AlterShareGroupOffsets => &ALTER_SHARE_GROUP_OFFSETS,
        ApiKey::DeleteShareGroupOffsets => &DELETE_SHARE_GROUP_OFFSETS,
        ApiKey::InitializeShareGroupState => &INITIALIZE_SHARE_GROUP_STATE,
        ApiKey::ReadShareGroupState => &READ_SHARE_GROUP_STATE,
        ApiKey::WriteShareGroupState => &WRITE_SHARE_GROUP_STATE,
        ApiKey::DeleteShareGroupState => &DELETE_SHARE_GROUP_STATE,
        ApiKey::ReadShareGroupStateSummary => &READ_SHARE_GROUP_STATE_SUMMARY,
        // Every other API has no schema, so the guard refuses it: a body
        // without a schema must never reach the decoder.
        _ => return None,
    })
}

/// Produce v0-2, which kafka-protocol no longer decodes but Kafka still
/// advertises (KAFKA-18659); walked only to answer UNSUPPORTED_VERSION per
/// partition. Same as v3 without `transactional_id`.
const PRODUCE_V0_TO_V2: Message = {
    use schema::*;
    const PARTITION: &[Field] = &[field("index", 0, 2, INT32), field("records", 0, 2, RECORDS)];
    // Never decoded (see `check_produce_v0_to_v2`), so nothing is allocated per element.
    const TOPIC: &[Field] = &[
        field("name", 0, 2, STRING),
        field("partition_data", 0, 2, array_of(&Ty::Struct(PARTITION), 0)),
    ];
    Message {
        versions: (0, 2),
        flexible_from: NEVER,
        body: &[
            field("acks", 0, 2, INT16),
            field("timeout_ms", 0, 2, INT32),
            field("topic_data", 0, 2, array_of(&Ty::Struct(TOPIC), 0)),
        ],
    }
};

/// Checks a Produce v0-2 body; see [`crate::header::unsupported_produce_response`].
pub fn check_produce_v0_to_v2(api_version: i16, body: &[u8]) -> Result<usize, GuardError> {
    if !(0..=2).contains(&api_version) {
        return Err(GuardError::NoSchema {
            api_key: ApiKey::Produce as i16,
            api_version,
        });
    }
    schema::walk_message(&PRODUCE_V0_TO_V2, api_version, body).map(|w| w.len)
}

/// The versions the guard has a schema for, if any.
pub fn guarded_versions(api_key: ApiKey) -> Option<(i16, i16)> {
    schema_for(api_key).map(|m| m.versions)
}

/// Checks that `body` (the request after its header) can be decoded as
/// `api_key` at `api_version` without any allocation larger than the body
/// itself justifies. Returns the number of bytes the body takes; bytes after
/// that are ignored, as Kafka ignores them.
pub fn check_request_body(
    api_key: ApiKey,
    api_version: i16,
    body: &[u8],
) -> Result<usize, GuardError> {
    walk_request_body(api_key, api_version, body).map(|w| w.len)
}

/// As [`check_request_body`], and also what decoding the body will allocate
/// ([`BodyWalk::decoded_bytes`]): a decoded request is far larger than its
/// wire form (a Metadata topic is 2 bytes on the wire and about 70 in
/// memory), so the broker charges this against its memory budget before it
/// decodes.
pub fn walk_request_body(
    api_key: ApiKey,
    api_version: i16,
    body: &[u8],
) -> Result<BodyWalk, GuardError> {
    let no_schema = GuardError::NoSchema {
        api_key: api_key as i16,
        api_version,
    };
    let message = schema_for(api_key).ok_or(no_schema.clone())?;
    if api_version < message.versions.0 || api_version > message.versions.1 {
        return Err(no_schema);
    }
    schema::walk_message(message, api_version, body)
}

/// Checks a request header of `header_version` at the front of `frame` and
/// returns its length.
pub fn check_request_header(header_version: i16, frame: &[u8]) -> Result<usize, GuardError> {
    walk_request_header(header_version, frame).map(|w| w.len)
}

/// As [`check_request_header`], with what decoding the header allocates
/// (its unknown tagged fields).
pub fn walk_request_header(header_version: i16, frame: &[u8]) -> Result<BodyWalk, GuardError> {
    schema::walk_request_header(header_version, frame)
}
