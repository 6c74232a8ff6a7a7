//! The one table of APIs this broker serves. The ApiVersions response, the
//! request decoder's version check and the tests are all built from it.

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::ApiKey;

/// One API's advertised version range, and the lowest version actually
/// accepted (higher than `min_version` only for Produce, see below).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiRange {
    pub api_key: ApiKey,
    pub min_version: i16,
    pub max_version: i16,
    pub min_accepted_version: i16,
}

impl ApiRange {
    const fn new(api_key: ApiKey, min_version: i16, max_version: i16) -> Self {
        Self {
            api_key,
            min_version,
            max_version,
            min_accepted_version: min_version,
        }
    }

    /// Advertises `min_version..` but answers versions below `accepted` with
    /// UNSUPPORTED_VERSION.
    const fn accepting_from(self, accepted: i16) -> Self {
        Self {
            min_accepted_version: accepted,
            ..self
        }
    }

    pub fn advertises(&self, api_version: i16) -> bool {
        self.min_version <= api_version && api_version <= self.max_version
    }

    pub fn accepts(&self, api_version: i16) -> bool {
        self.min_accepted_version <= api_version && api_version <= self.max_version
    }
}

/// The APIs the broker implements, with Kafka 4.x's minimum versions.
pub const SUPPORTED_APIS: &[ApiRange] = &[
    // Kafka 4.0 still advertises Produce v0-2 because librdkafka refuses to
    // produce compressed batches to a broker that does not (KAFKA-18659), but
    // answers those versions with UNSUPPORTED_VERSION. We do the same.
    ApiRange::new(ApiKey::Produce, 0, 12).accepting_from(3),
    ApiRange::new(ApiKey::Fetch, 4, 16),
    ApiRange::new(ApiKey::ListOffsets, 1, 9),
    ApiRange::new(ApiKey::Metadata, 0, 12),
    ApiRange::new(ApiKey::ApiVersions, 0, 4),
    // SASL on SASL_PLAINTEXT/SASL_SSL listeners (elsewhere ILLEGAL_SASL_STATE).
    // After a v0 handshake the tokens travel as bare size-prefixed frames;
    // librdkafka before 2.x's KIP-152 support looks for v0 before it will
    // authenticate at all.
    ApiRange::new(ApiKey::SaslHandshake, 0, 1),
    ApiRange::new(ApiKey::SaslAuthenticate, 0, 2),
    ApiRange::new(ApiKey::CreateTopics, 2, 7),
    ApiRange::new(ApiKey::DeleteTopics, 1, 6),
    ApiRange::new(ApiKey::DeleteRecords, 0, 2),
    ApiRange::new(ApiKey::InitProducerId, 0, 5),
    ApiRange::new(ApiKey::DescribeConfigs, 1, 4),
    ApiRange::new(ApiKey::CreatePartitions, 0, 3),
    ApiRange::new(ApiKey::DescribeCluster, 0, 1),
    ApiRange::new(ApiKey::DescribeQuorum, 0, 2),
    ApiRange::new(ApiKey::AlterConfigs, 0, 2),
    ApiRange::new(ApiKey::IncrementalAlterConfigs, 0, 1),
    // Cluster operations: kafka-leader-election.sh (PREFERRED, UNCLEAN) and
    // kafka-log-dirs.sh; Kafka 4 removed DescribeLogDirs v0.
    ApiRange::new(ApiKey::ElectLeaders, 0, 2),
    ApiRange::new(ApiKey::DescribeLogDirs, 1, 4),
    // Kafka 4 removed v0-1. Followers and KIP-320 consumers use it.
    ApiRange::new(ApiKey::OffsetForLeaderEpoch, 2, 4),
    // Consumer groups. OffsetCommit v0-1 and OffsetFetch v0 are gone in
    // Kafka 4. kafkajs 2.x ignores minimums and speaks only non-flexible
    // versions of these (FindCoordinator v2, JoinGroup v5, SyncGroup v3,
    // Heartbeat v3, LeaveGroup v3, OffsetCommit v5, OffsetFetch v4).
    ApiRange::new(ApiKey::OffsetCommit, 2, 9),
    ApiRange::new(ApiKey::OffsetFetch, 1, 9),
    ApiRange::new(ApiKey::FindCoordinator, 0, 6),
    ApiRange::new(ApiKey::JoinGroup, 0, 9),
    ApiRange::new(ApiKey::Heartbeat, 0, 4),
    ApiRange::new(ApiKey::LeaveGroup, 0, 5),
    ApiRange::new(ApiKey::SyncGroup, 0, 5),
    ApiRange::new(ApiKey::DescribeGroups, 0, 5),
    ApiRange::new(ApiKey::ListGroups, 0, 5),
    ApiRange::new(ApiKey::DeleteGroups, 0, 2),
    ApiRange::new(ApiKey::OffsetDelete, 0, 0),
    // Transactional offset commits (issue 30); v5 is transaction version 2's
    // (the group coordinator adds its partition to the transaction).
    ApiRange::new(ApiKey::TxnOffsetCommit, 0, 5),
    // KIP-848: the consumer group protocol (group.protocol=consumer).
    ApiRange::new(ApiKey::ConsumerGroupHeartbeat, 0, 1),
    ApiRange::new(ApiKey::ConsumerGroupDescribe, 0, 1),
    // Transactions. Kafka 4.4 serves WriteTxnMarkers v1-2; v2 only adds the
    // marker's transaction version (TV2), which kafka-protocol 0.18 cannot
    // decode yet, and TV1 coordinators send v1.
    ApiRange::new(ApiKey::WriteTxnMarkers, 1, 1),
    ApiRange::new(ApiKey::DescribeProducers, 0, 0),
    // AddPartitionsToTxn v4+ is the batched form brokers send the
    // coordinator (KIP-890); EndTxn v5 is transaction version 2's epoch bump.
    ApiRange::new(ApiKey::AddPartitionsToTxn, 0, 5),
    ApiRange::new(ApiKey::AddOffsetsToTxn, 0, 4),
    ApiRange::new(ApiKey::EndTxn, 0, 5),
    ApiRange::new(ApiKey::DescribeTransactions, 0, 0),
    ApiRange::new(ApiKey::ListTransactions, 0, 2),
    // ACLs (kafka-acls.sh); Kafka 4 removed v0 of all three.
    ApiRange::new(ApiKey::DescribeAcls, 1, 3),
    ApiRange::new(ApiKey::CreateAcls, 1, 3),
    ApiRange::new(ApiKey::DeleteAcls, 1, 3),
    // Client quotas in the metadata quorum (kafka-configs.sh --entity-type
    // users/clients/ips).
    ApiRange::new(ApiKey::DescribeClientQuotas, 0, 1),
    ApiRange::new(ApiKey::AlterClientQuotas, 0, 1),
    // Share groups (KIP-932): KafkaShareConsumer. ShareFetch and
    // ShareAcknowledge v2 (RENEW, KIP-1222; the record-limit acquire mode,
    // KIP-1206) are decoded by `crate::newer`.
    ApiRange::new(ApiKey::ShareGroupHeartbeat, 1, 1),
    ApiRange::new(ApiKey::ShareGroupDescribe, 1, 1),
    ApiRange::new(ApiKey::ShareFetch, 1, 2),
    ApiRange::new(ApiKey::ShareAcknowledge, 1, 2),
    // kafka-share-groups.sh --describe / --reset-offsets / --delete-offsets.
    // DescribeShareGroupOffsets v1 adds the lag (`crate::newer`).
    ApiRange::new(ApiKey::DescribeShareGroupOffsets, 0, 1),
    ApiRange::new(ApiKey::AlterShareGroupOffsets, 0, 0),
    ApiRange::new(ApiKey::DeleteShareGroupOffsets, 0, 0),
    // The share coordinator's APIs (KIP-932), between brokers. Kafka 4.4
    // serves WriteShareGroupState and ReadShareGroupStateSummary up to v1
    // (v1 adds the delivery-complete count), which kafka-protocol 0.18
    // cannot decode yet.
    ApiRange::new(ApiKey::InitializeShareGroupState, 0, 0),
    ApiRange::new(ApiKey::ReadShareGroupState, 0, 0),
    ApiRange::new(ApiKey::WriteShareGroupState, 0, 0),
    ApiRange::new(ApiKey::DeleteShareGroupState, 0, 0),
    ApiRange::new(ApiKey::ReadShareGroupStateSummary, 0, 0),
    // SCRAM users in the metadata quorum (kafka-configs.sh --entity-type users).
    ApiRange::new(ApiKey::DescribeUserScramCredentials, 0, 0),
    ApiRange::new(ApiKey::AlterUserScramCredentials, 0, 0),
];

/// The entry for `api_key` in [`SUPPORTED_APIS`].
pub fn range(api_key: i16) -> Option<&'static ApiRange> {
    SUPPORTED_APIS.iter().find(|r| r.api_key as i16 == api_key)
}

/// The advertised `(min, max)` versions of `api_key`, if the broker serves it.
pub fn supported(api_key: i16) -> Option<(i16, i16)> {
    range(api_key).map(|r| (r.min_version, r.max_version))
}

/// Whether a request at `api_version` is decoded and handled (rather than
/// answered with UNSUPPORTED_VERSION).
pub fn accepted(api_key: i16, api_version: i16) -> bool {
    range(api_key).is_some_and(|r| r.accepts(api_version))
}

/// The `api_keys` of the ApiVersions response.
pub fn api_versions_keys() -> Vec<ApiVersion> {
    SUPPORTED_APIS
        .iter()
        .map(|r| {
            ApiVersion::default()
                .with_api_key(r.api_key as i16)
                .with_min_version(r.min_version)
                .with_max_version(r.max_version)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_versions_keys_mirror_the_table() {
        let keys = api_versions_keys();
        assert_eq!(keys.len(), SUPPORTED_APIS.len());
        for (key, range) in keys.iter().zip(SUPPORTED_APIS) {
            assert_eq!(key.api_key, range.api_key as i16);
            assert_eq!(
                (key.min_version, key.max_version),
                (range.min_version, range.max_version)
            );
        }
        assert!(keys.iter().any(|k| k.api_key == ApiKey::ApiVersions as i16));
    }

    #[test]
    fn each_api_appears_once() {
        for (i, a) in SUPPORTED_APIS.iter().enumerate() {
            assert!(a.min_version <= a.min_accepted_version);
            assert!(a.min_accepted_version <= a.max_version);
            assert!(
                SUPPORTED_APIS[i + 1..]
                    .iter()
                    .all(|b| b.api_key != a.api_key),
                "{:?} listed twice",
                a.api_key
            );
        }
    }

    #[test]
    fn produce_advertises_v0_but_accepts_from_v3() {
        assert_eq!(supported(ApiKey::Produce as i16), Some((0, 12)));
        assert!(!accepted(ApiKey::Produce as i16, 0));
        assert!(!accepted(ApiKey::Produce as i16, 2));
        assert!(accepted(ApiKey::Produce as i16, 3));
        assert!(accepted(ApiKey::Produce as i16, 12));
        assert!(!accepted(ApiKey::Produce as i16, 13));
        assert!(accepted(ApiKey::Fetch as i16, 4));
        assert!(!accepted(ApiKey::Fetch as i16, 3));
        assert_eq!(supported(-1), None);
    }
}
