//! What a request counts against its client's quotas, and the throttle
//! time written into its response. Called by the connection around the
//! dispatch; the connection mutes itself for the time returned.
//!
//! - Produce: the request's bytes (`producer_byte_rate`), acks=0 included.
//! - Fetch from a consumer: the response's bytes (`consumer_byte_rate`);
//!   a follower's fetch is replication and counts against nothing.
//! - Every request but a follower's fetch, a consumer's Fetch (whose time
//!   is mostly its long poll) and the inter-broker WriteTxnMarkers: the
//!   time spent handling it (`request_percentage`: 100 is one request
//!   thread's whole time).
//! - CreateTopics, CreatePartitions, DeleteTopics: the partitions created
//!   or deleted (`controller_mutation_rate`).
//!
//! The throttle is the largest of the quotas' throttles, as Kafka sends
//! the larger of the bandwidth and request throttles.

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};

use super::QuotaType;
use crate::broker::Broker;
use crate::handlers::{Reply, RequestContext};

/// Fixed bytes of a fetch response beyond its records: a partition's
/// header fields, approximately. The records dominate.
const FETCH_PARTITION_OVERHEAD_BYTES: usize = 64;

/// What is known about a request before it is dispatched.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    quotas_on: bool,
    follower_fetch: bool,
    /// Partitions a DeleteTopics would delete or a CreatePartitions add,
    /// counted from the image before the request changes it.
    partitions_changed: usize,
}

pub fn before(broker: &Broker, api_key: ApiKey, version: i16, request: &RequestKind) -> Usage {
    let image = broker.metadata.image();
    let mut usage = Usage {
        quotas_on: !image.client_quotas.is_empty(),
        ..Usage::default()
    };
    if !usage.quotas_on {
        return usage;
    }
    match (api_key, request) {
        (ApiKey::Fetch, RequestKind::Fetch(r)) => {
            usage.follower_fetch = crate::handlers::fetch::replica_id(version, r) >= 0;
        }
        (ApiKey::DeleteTopics, RequestKind::DeleteTopics(r)) => {
            let names = r
                .topics
                .iter()
                .filter_map(|t| t.name.as_ref().map(|n| n.to_string()))
                .chain(r.topic_names.iter().map(|n| n.to_string()));
            usage.partitions_changed = names
                .filter_map(|n| image.topics.get(&n))
                .map(|t| t.partitions.len())
                .sum();
        }
        (ApiKey::CreatePartitions, RequestKind::CreatePartitions(r)) => {
            usage.partitions_changed = r
                .topics
                .iter()
                .filter_map(|t| {
                    let current = image.topics.get(t.name.as_str())?.partitions.len();
                    Some((t.count.max(0) as usize).saturating_sub(current))
                })
                .sum();
        }
        _ => {}
    }
    usage
}

/// Records what the request used, sets the response's `throttle_time_ms`
/// and returns the throttle in milliseconds.
pub fn after(
    broker: &Broker,
    ctx: &RequestContext,
    api_key: ApiKey,
    usage: Usage,
    reply: &mut Reply,
    request_bytes: usize,
    elapsed: Duration,
) -> u64 {
    if !usage.quotas_on || usage.follower_fetch {
        return 0;
    }
    let image = broker.metadata.image();
    let client_id: Arc<str> = Arc::from(ctx.client_id.as_str());
    let now_ms = crate::broker::now_ms().max(0) as u64;
    let quotas = &broker.quotas;
    let record =
        |kind, value: f64| quotas.record(&image, &ctx.principal, &client_id, kind, value, now_ms);
    let mut throttle_ms = 0;
    match api_key {
        ApiKey::Produce => {
            throttle_ms = throttle_ms.max(record(QuotaType::Produce, request_bytes as f64));
        }
        ApiKey::Fetch => {
            if let Reply::Fetch(f) = reply {
                let bytes: usize = f
                    .records
                    .iter()
                    .map(|r| {
                        r.as_ref().map_or(0, |r| r.len_bytes()) + FETCH_PARTITION_OVERHEAD_BYTES
                    })
                    .sum();
                throttle_ms = throttle_ms.max(record(QuotaType::Fetch, bytes as f64));
            }
        }
        ApiKey::CreateTopics | ApiKey::CreatePartitions | ApiKey::DeleteTopics => {
            let partitions = mutations(reply, usage);
            if partitions > 0 {
                throttle_ms =
                    throttle_ms.max(record(QuotaType::ControllerMutation, partitions as f64));
            }
        }
        _ => {}
    }
    let request_quota_applies = !matches!(api_key, ApiKey::Fetch | ApiKey::WriteTxnMarkers);
    if request_quota_applies {
        // Kafka records request thread time as a percentage of a second.
        let percent_seconds = elapsed.as_secs_f64() * 100.0;
        throttle_ms = throttle_ms.max(record(QuotaType::Request, percent_seconds));
    }
    if throttle_ms > 0 {
        let ms = throttle_ms.min(i32::MAX as u64) as i32;
        match reply {
            Reply::Respond(resp) => {
                super::set_throttle_time(resp, ms);
            }
            Reply::Fetch(f) => f.response.throttle_time_ms = ms,
            Reply::NoResponse | Reply::Unsupported => {}
        }
    }
    throttle_ms
}

/// Partitions a successful CreateTopics, CreatePartitions or DeleteTopics
/// created or deleted.
fn mutations(reply: &Reply, usage: Usage) -> usize {
    let Reply::Respond(resp) = reply else {
        return 0;
    };
    match resp {
        ResponseKind::CreateTopics(r) => r
            .topics
            .iter()
            .filter(|t| t.error_code == 0)
            .map(|t| t.num_partitions.max(0) as usize)
            .sum(),
        // Counted from the request when any topic succeeded.
        ResponseKind::CreatePartitions(r) if r.results.iter().any(|t| t.error_code == 0) => {
            usage.partitions_changed
        }
        ResponseKind::DeleteTopics(r) if r.responses.iter().any(|t| t.error_code == 0) => {
            usage.partitions_changed
        }
        _ => 0,
    }
}
