//! ApiVersions (key 18): generated from the one table of supported versions,
//! with Kafka's KRaft features: `transaction.version` (a Java client at
//! level 2 uses transaction version 2) and `share.version` (level 2, as a
//! new Kafka 4.4 cluster: share groups with their dead-letter queue).

use kafka_protocol::messages::api_versions_response::{FinalizedFeatureKey, SupportedFeatureKey};
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::protocol::StrBytes;

use std::sync::OnceLock;

use crate::broker::{now_ms, Broker};

const TRANSACTION_VERSION: &str = "transaction.version";
/// The highest `transaction.version` this broker implements.
const MAX_TRANSACTION_VERSION: i16 = 2;
const SHARE_VERSION: &str = "share.version";
/// The `share.version` this broker implements, always finalized.
const SHARE_VERSION_LEVEL: i16 = 2;

pub fn handle(broker: &Broker, version: i16, _req: ApiVersionsRequest) -> ApiVersionsResponse {
    let mut resp = ApiVersionsResponse::default();
    resp.api_keys = protocol::versions::api_versions_keys();
    if version >= 3 {
        resp.supported_features = vec![
            SupportedFeatureKey::default()
                .with_name(StrBytes::from_static_str(SHARE_VERSION))
                .with_min_version(0)
                .with_max_version(SHARE_VERSION_LEVEL),
            SupportedFeatureKey::default()
                .with_name(StrBytes::from_static_str(TRANSACTION_VERSION))
                .with_min_version(0)
                .with_max_version(MAX_TRANSACTION_VERSION),
        ];
        resp.finalized_features = vec![FinalizedFeatureKey::default()
            .with_name(StrBytes::from_static_str(SHARE_VERSION))
            .with_min_version_level(SHARE_VERSION_LEVEL)
            .with_max_version_level(SHARE_VERSION_LEVEL)];
        let level = broker.config.transaction_version;
        // Kafka lists only levels above 0 as finalized.
        if level > 0 {
            resp.finalized_features.push(
                FinalizedFeatureKey::default()
                    .with_name(StrBytes::from_static_str(TRANSACTION_VERSION))
                    .with_min_version_level(level)
                    .with_max_version_level(level),
            );
        }
        // Clients keep the features of the highest epoch they have seen; a
        // time fixed per process orders a restart with a new level after
        // the old one.
        static EPOCH: OnceLock<i64> = OnceLock::new();
        resp.finalized_features_epoch = *EPOCH.get_or_init(now_ms);
    }
    resp
}
