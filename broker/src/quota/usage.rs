//! What a request counts against its client's quotas, and the throttle
//! time written into its response. Called by the connection around the
//! dispatch; the connection mutes itself for the time returned.
//!
//! - Produce: the request's bytes (`producer_byte_rate`), acks=0 included.
//! - Fetch from a consumer: the response's bytes (`consumer_byte_rate`),
//!   recorded by the fetch itself ([`throttle_fetch`]): a fetch over the
//!   quota is answered without its records, and a fetch never asks for more
//!   than the quota allows in one window. A follower's fetch is replication
//!   and counts against nothing.
//! - Every request but a follower's fetch and the inter-broker
//!   WriteTxnMarkers: the time its handler spent working (`request_percentage`:
//!   100 is one request thread's whole time). That is the time the handler's
//!   future was being polled ([`Busy`]), not its waits (a fetch's long poll,
//!   acks=all replication), as Kafka counts a request thread's time and not
//!   purgatory's. A Fetch over it is answered empty, as for its byte rate.
//! - CreateTopics, CreatePartitions, DeleteTopics: the partitions created
//!   or deleted (`controller_mutation_rate`). From CreateTopics v6,
//!   CreatePartitions v3 and DeleteTopics v5 the quota is strict: the
//!   handler asks [`MutationQuota::admit`] before each topic, and a topic
//!   asked for while the client is over its quota fails with
//!   THROTTLING_QUOTA_EXCEEDED. Older versions are permissive: everything is
//!   done and the client throttled afterwards, as in Kafka.
//!
//! The throttle is the largest of the quotas' throttles, as Kafka sends
//! the larger of the bandwidth and request throttles.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

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
    /// The handler enforced `controller_mutation_rate` itself.
    strict_mutations: bool,
}

/// Whether this version of a topic mutation gets Kafka's strict
/// `controller_mutation_rate` (`strictSinceVersion` in `ControllerApis`).
pub fn strict_mutations(api_key: ApiKey, version: i16) -> bool {
    match api_key {
        ApiKey::CreateTopics => version >= 6,
        ApiKey::CreatePartitions => version >= 3,
        ApiKey::DeleteTopics => version >= 5,
        _ => false,
    }
}

/// One request's strict `controller_mutation_rate`: a topic mutation goes
/// ahead while the client is within its quota (then counted, however many
/// partitions it has) and is refused while it is over, as Kafka's
/// `StrictControllerMutationQuota`. Without a quota, or for a permissive
/// version, everything is admitted here.
pub struct MutationQuota {
    client: Option<(Arc<crate::metadata::MetadataImage>, Arc<str>, Arc<str>)>,
    throttle_ms: std::sync::atomic::AtomicU64,
}

impl MutationQuota {
    pub fn new(broker: &Broker, ctx: &RequestContext, api_key: ApiKey, version: i16) -> Self {
        let image = broker.metadata.image();
        let client =
            (strict_mutations(api_key, version) && !image.client_quotas.is_empty()).then(|| {
                (
                    image,
                    ctx.principal.clone(),
                    Arc::from(ctx.client_id.as_str()),
                )
            });
        MutationQuota {
            client,
            throttle_ms: Default::default(),
        }
    }

    /// Whether a mutation of `partitions` partitions may go ahead; `Err`
    /// with the throttle time when the client is over its quota.
    pub fn admit(&self, broker: &Broker, partitions: usize) -> Result<(), i32> {
        let Some((image, principal, client_id)) = &self.client else {
            return Ok(());
        };
        let now_ms = crate::broker::now_ms().max(0) as u64;
        let ms = broker.quotas.check_then_record(
            image,
            principal,
            client_id,
            QuotaType::ControllerMutation,
            partitions as f64,
            now_ms,
        );
        if ms == 0 {
            return Ok(());
        }
        self.throttle_ms
            .fetch_max(ms, std::sync::atomic::Ordering::Relaxed);
        Err(ms.min(i32::MAX as u64) as i32)
    }

    /// The throttle the response carries: the longest a refusal asked for.
    pub fn throttle_ms(&self) -> i32 {
        self.throttle_ms
            .load(std::sync::atomic::Ordering::Relaxed)
            .min(i32::MAX as u64) as i32
    }

    /// The error a refused topic carries.
    pub fn refusal() -> (i16, &'static str) {
        (
            kafka_protocol::ResponseError::ThrottlingQuotaExceeded.code(),
            "The throttling quota has been exceeded.",
        )
    }
}

impl Usage {
    /// Whether any client quota is configured (else nothing is measured).
    pub fn quotas_on(&self) -> bool {
        self.quotas_on
    }
}

/// A future and the time spent polling it: the work its handler did on a
/// runtime thread, without the time it waited.
pub struct Busy<F> {
    inner: Pin<Box<F>>,
    busy: Duration,
}

impl<F: Future> Busy<F> {
    pub fn new(inner: F) -> Self {
        Busy {
            inner: Box::pin(inner),
            busy: Duration::ZERO,
        }
    }
}

impl<F: Future> Future for Busy<F> {
    type Output = (F::Output, Duration);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let started = Instant::now();
        let polled = this.inner.as_mut().poll(cx);
        this.busy += started.elapsed();
        polled.map(|out| (out, this.busy))
    }
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
    usage.strict_mutations = strict_mutations(api_key, version);
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
    busy: Duration,
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
            // Recorded, and the records dropped when over, by throttle_fetch.
            if let Reply::Fetch(f) = reply {
                throttle_ms = throttle_ms.max(f.response.throttle_time_ms.max(0) as u64);
            }
        }
        ApiKey::CreateTopics | ApiKey::CreatePartitions | ApiKey::DeleteTopics
            if usage.strict_mutations =>
        {
            // Recorded topic by topic by MutationQuota, which set the
            // response's throttle when it refused one.
            let set = match reply {
                Reply::Respond(ResponseKind::CreateTopics(r)) => r.throttle_time_ms,
                Reply::Respond(ResponseKind::CreatePartitions(r)) => r.throttle_time_ms,
                Reply::Respond(ResponseKind::DeleteTopics(r)) => r.throttle_time_ms,
                _ => 0,
            };
            throttle_ms = throttle_ms.max(set.max(0) as u64);
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
    if api_key != ApiKey::WriteTxnMarkers {
        // Kafka records request thread time as a percentage of a second.
        let percent_seconds = busy.as_secs_f64() * 100.0;
        let request_throttle_ms = record(QuotaType::Request, percent_seconds);
        if request_throttle_ms > 0 {
            // A Fetch throttled for its request time goes out empty too,
            // its bytes taken back from the byte rate (Kafka's handleFetchRequest).
            if let Reply::Fetch(f) = reply {
                if !f.response.responses.is_empty() {
                    let bytes = fetch_bytes(&f.records);
                    empty_fetch(broker, &image, ctx, &client_id, f, bytes, now_ms);
                }
            }
        }
        throttle_ms = throttle_ms.max(request_throttle_ms);
    }
    if throttle_ms > 0 {
        let ms = throttle_ms.min(i32::MAX as u64) as i32;
        match reply {
            Reply::Respond(resp) => {
                super::set_throttle_time(resp, ms);
            }
            Reply::Fetch(f) => f.response.throttle_time_ms = ms,
            Reply::Newer(n) => n.set_throttle_time_ms(ms),
            Reply::NoResponse | Reply::Unsupported => {}
        }
    }
    throttle_ms
}

/// The most bytes a consumer's fetch may return: its `consumer_byte_rate`
/// over `quota.window.num - 1` windows, so that one response alone can never
/// earn a throttle longer than the window (Kafka caps `fetch.max.bytes` the
/// same way). `None` without a quota.
pub fn fetch_max_bytes(broker: &Broker, ctx: &RequestContext) -> Option<usize> {
    let image = broker.metadata.image();
    if image.client_quotas.is_empty() {
        return None;
    }
    let client_id: Arc<str> = Arc::from(ctx.client_id.as_str());
    broker
        .quotas
        .max_in_window(&image, &ctx.principal, &client_id, QuotaType::Fetch)
        .map(|b| b.clamp(0.0, i32::MAX as f64) as usize)
}

/// Records a consumer's fetch response against its `consumer_byte_rate`.
/// Over the quota, the bytes are taken back and the response goes out with
/// no partitions and `throttle_time_ms` set: Kafka's throttled fetch
/// response, which the client answers by waiting and fetching the same
/// offsets again.
pub fn throttle_fetch(
    broker: &Broker,
    ctx: &RequestContext,
    mut reply: crate::handlers::fetch::FetchReply,
) -> crate::handlers::fetch::FetchReply {
    let image = broker.metadata.image();
    if image.client_quotas.is_empty() {
        return reply;
    }
    let bytes = fetch_bytes(&reply.records);
    let client_id: Arc<str> = Arc::from(ctx.client_id.as_str());
    let now_ms = crate::broker::now_ms().max(0) as u64;
    let quotas = &broker.quotas;
    let throttle_ms = quotas.record(
        &image,
        &ctx.principal,
        &client_id,
        QuotaType::Fetch,
        bytes as f64,
        now_ms,
    );
    if throttle_ms > 0 {
        empty_fetch(broker, &image, ctx, &client_id, &mut reply, bytes, now_ms);
        reply.response.throttle_time_ms = throttle_ms.min(i32::MAX as u64) as i32;
    }
    reply
}

/// Kafka's throttled fetch response: the `bytes` the fetch was charged are
/// taken back from the client's byte rate, and it goes out with no
/// partitions.
fn empty_fetch(
    broker: &Broker,
    image: &Arc<crate::metadata::MetadataImage>,
    ctx: &RequestContext,
    client_id: &Arc<str>,
    reply: &mut crate::handlers::fetch::FetchReply,
    bytes: usize,
    now_ms: u64,
) {
    broker.quotas.unrecord(
        image,
        &ctx.principal,
        client_id,
        QuotaType::Fetch,
        bytes as f64,
        now_ms,
    );
    reply.response.responses.clear();
    reply.records.clear();
}

/// What a fetch response counts against `consumer_byte_rate`.
fn fetch_bytes(records: &[Option<crate::handlers::fetch::FetchedRecords>]) -> usize {
    records
        .iter()
        .map(|r| r.as_ref().map_or(0, |r| r.len_bytes()) + FETCH_PARTITION_OVERHEAD_BYTES)
        .sum()
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
