//! Fetch (key 1): whole batches from the fetch offset, within partition and
//! response byte limits, long-polling on `min_bytes` / `max_wait_ms`.
//!
//! Consumers (replica id -1) read from the leader only: up to the high
//! watermark with `isolation_level` 0 (read_uncommitted, aborted
//! transactions null, as Kafka sends them), up to the last stable offset with
//! 1 (read_committed), naming the aborted transactions the records overlap
//! so the client can drop them. Followers (replica id >= 0: the header field `replica_id` before
//! v15, `replica_state.replica_id` from v15) read up to the log end; each
//! such fetch records the follower's position (its fetch offset is its log
//! end offset), which may advance the high watermark and let the follower
//! join the ISR. A long-poll wakes on appends and on high watermark advances.
//! Fetching from a follower replica (KIP-392) is not offered: clients are
//! never given a preferred read replica, so they always fetch from the leader.
//!
//! Byte limits are Kafka's (`KafkaApis.handleFetchRequest`,
//! `ReplicaManager.readFromLog`): the response holds at most the smaller of
//! the request's `max_bytes` and the broker's `fetch.max.bytes` (consumers
//! and followers alike; a follower asks for `replica.fetch.response.max.bytes`
//! itself), `min_bytes` is capped by that, a partition holds at most its
//! `partition_max_bytes` of what is left, and the first partition with data
//! returns at least one whole batch, whatever the limits, so a batch larger
//! than them cannot stall a consumer. Negative limits count as 0.
//!
//! The records are not read here: the response carries file regions of the
//! segments (taken under the partition's lock, which reads batch headers
//! only), and the connection sends them from the files (`sendfile` on
//! Linux) after the response's other fields. So a response's record bytes
//! are never in the broker's memory, and need no share of a memory budget.
//!
//! Until brokers authenticate (Kafka checks CLUSTER_ACTION on the cluster), a
//! replica fetch is accepted only from an address the named broker's
//! registered host resolves to; any other gets TOPIC_AUTHORIZATION_FAILED
//! for every partition, as Kafka answers a follower fetch it does not
//! authorize, and records nothing.
//!
//! Fetch sessions (KIP-227): we always answer session id 0, which tells the
//! client that no session was created, so every request is a full fetch.
//! That is a correct session-less answer; clients fall back to it by design.

use std::time::Duration;

use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};
use kafka_protocol::ResponseError;

use super::leader_hints::LeaderHints;
use super::{str_bytes, RequestContext};
use crate::broker::{now_ms, Broker};
use crate::error::PartitionError;
use crate::log::FileRegion;
use crate::partition::FetchLimit;
use crate::types::{NodeId, Offset, TopicPartition};

/// One partition's records: regions of its segment files, in log order.
#[derive(Debug)]
pub struct FetchedRecords {
    pub regions: Vec<FileRegion>,
    size_bytes: usize,
}

impl FetchedRecords {
    /// No records: what a partition with an error carries. Kafka sends an
    /// empty record set there, never null, and librdkafka refuses a null
    /// one ("invalid MessageSetSize -1") and retries it forever.
    fn empty() -> Self {
        FetchedRecords::new(Vec::new())
    }

    fn new(regions: Vec<FileRegion>) -> Self {
        let size_bytes = regions.iter().map(|r| r.len() as usize).sum();
        FetchedRecords {
            regions,
            size_bytes,
        }
    }
}

impl FetchedRecords {
    /// The records' bytes, as sent.
    pub fn len_bytes(&self) -> usize {
        self.size_bytes
    }
}

impl protocol::fetch_response::RecordData for FetchedRecords {
    fn size_bytes(&self) -> usize {
        self.size_bytes
    }
}

/// A Fetch response whose partitions' `records` are `None`, and their
/// records beside it, one entry per partition in response order (empty for
/// a partition with an error, as Kafka's `MemoryRecords.EMPTY`).
pub struct FetchReply {
    pub response: FetchResponse,
    pub records: Vec<Option<FetchedRecords>>,
}

/// The longest a fetch may wait, whatever the client asks.
const MAX_WAIT_MS_CAP: i32 = 30_000;

pub async fn handle(
    broker: &Broker,
    ctx: &RequestContext,
    version: i16,
    req: FetchRequest,
) -> FetchReply {
    if req.session_id != 0 {
        let mut response = FetchResponse::default();
        response.error_code = ResponseError::FetchSessionIdNotFound.code();
        return FetchReply {
            response,
            records: Vec::new(),
        };
    }
    let replica_id = replica_id(version, &req);
    let authz = crate::authz::Authz::new(&broker.config, || broker.metadata.image(), ctx);
    // A follower's fetch needs ClusterAction (with an authorizer) and, until
    // brokers authenticate, an address of the broker it names.
    if replica_id >= 0
        && (!authz.allows_cluster(crate::authz::Operation::ClusterAction)
            || !from_registered_broker(broker, ctx, replica_id).await)
    {
        metrics::counter!("kafka_broker_replica_fetches_refused_total").increment(1);
        tracing::warn!(replica_id, client = %ctx.client_host, "replica fetch from an address that is not the broker's; refused");
        return account(broker, refused(version, &req));
    }
    let fetch_max_bytes = broker.config.fetch_max_bytes;
    if req.max_bytes > fetch_max_bytes {
        metrics::counter!("kafka_broker_fetch_max_bytes_capped_total").increment(1);
    }
    let mut max_bytes = req.max_bytes.min(fetch_max_bytes).max(0) as usize;
    // A consumer's fetch is answered by its consumer_byte_rate, if any.
    let consumer = replica_id < 0;
    if consumer {
        if let Some(quota_bytes) = crate::quota::usage::fetch_max_bytes(broker, ctx) {
            max_bytes = max_bytes.min(quota_bytes);
        }
    }
    let done = |reply: FetchReply| {
        let reply = if consumer {
            crate::quota::usage::throttle_fetch(broker, ctx, reply)
        } else {
            reply
        };
        account(broker, reply)
    };
    let min_bytes = req.min_bytes.clamp(0, max_bytes as i32) as usize;
    let deadline = tokio::time::Instant::now()
        + Duration::from_millis(req.max_wait_ms.clamp(0, MAX_WAIT_MS_CAP) as u64);
    loop {
        // Register interest before reading, so an append between the read
        // and the wait still wakes us.
        let notified = broker.replicas.appended.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let (reply, bytes, had_error) =
            read_once(broker, &authz, &ctx.listener, version, &req, max_bytes);
        if bytes >= min_bytes || had_error || tokio::time::Instant::now() >= deadline {
            return done(reply);
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            let (reply, _, _) = read_once(broker, &authz, &ctx.listener, version, &req, max_bytes);
            return done(reply);
        }
    }
}

/// Counts bytes out per topic and per-partition errors, then hands the
/// reply back.
fn account(broker: &Broker, reply: FetchReply) -> FetchReply {
    let image = broker.metadata.image();
    let mut records = reply.records.iter();
    for t in &reply.response.responses {
        let name = if t.topic.0.is_empty() {
            image
                .topic_by_id(t.topic_id)
                .map(|i| i.name.clone())
                .unwrap_or_default()
        } else {
            t.topic.0.to_string()
        };
        let bytes: usize = records
            .by_ref()
            .take(t.partitions.len())
            .map(|r| r.as_ref().map_or(0, |r| r.size_bytes))
            .sum();
        if bytes > 0 {
            metrics::counter!("kafka_broker_bytes_out_total", "topic" => name)
                .increment(bytes as u64);
        }
        for p in t.partitions.iter().filter(|p| p.error_code != 0) {
            metrics::counter!("kafka_broker_partition_errors_total", "api" => "Fetch", "code" => p.error_code.to_string())
                .increment(1);
        }
    }
    reply
}

/// A read_committed fetch's aborted transactions, as the response has them.
fn aborted_transactions(
    aborted: Vec<crate::partition::producer_state::AbortedTxn>,
) -> Vec<AbortedTransaction> {
    aborted
        .into_iter()
        .map(|a| {
            let mut t = AbortedTransaction::default();
            t.producer_id = kafka_protocol::messages::ProducerId(a.producer_id);
            t.first_offset = a.first_offset.0;
            t
        })
        .collect()
}

/// The fetching replica: the header field before v15, `replica_state` from v15.
pub(crate) fn replica_id(version: i16, req: &FetchRequest) -> i32 {
    if version >= 15 {
        req.replica_state.replica_id.0
    } else {
        req.replica_id.0
    }
}

/// Whether the connection comes from an address of the registered broker
/// `replica_id`.
async fn from_registered_broker(broker: &Broker, ctx: &RequestContext, replica_id: i32) -> bool {
    let Some(ip) = ctx.client_ip else {
        return false;
    };
    let host = match broker.metadata.image().brokers.get(&NodeId(replica_id)) {
        Some(b) => b.host.clone(),
        None => return false,
    };
    crate::net::is_address_of(&host, ip).await
}

/// TOPIC_AUTHORIZATION_FAILED for every partition the request names.
fn refused(version: i16, req: &FetchRequest) -> FetchReply {
    let mut resp = FetchResponse::default();
    let mut records = Vec::new();
    for topic in &req.topics {
        let mut t = FetchableTopicResponse::default();
        t.topic_id = topic.topic_id;
        if version < 13 {
            t.topic = topic.topic.clone();
        }
        for fp in &topic.partitions {
            let mut pd = PartitionData::default();
            pd.partition_index = fp.partition;
            pd.error_code = ResponseError::TopicAuthorizationFailed.code();
            pd.high_watermark = -1;
            pd.last_stable_offset = -1;
            pd.log_start_offset = -1;
            pd.preferred_read_replica = kafka_protocol::messages::BrokerId(-1);
            // Records travel beside the response ([`FetchReply`]), null here.
            pd.records = None;
            t.partitions.push(pd);
            records.push(Some(FetchedRecords::empty()));
        }
        resp.responses.push(t);
    }
    FetchReply {
        response: resp,
        records,
    }
}

/// One pass over the request's partitions: the reply, the record bytes it
/// holds, and whether a partition had an error.
fn read_once(
    broker: &Broker,
    authz: &crate::authz::Authz<'_>,
    listener: &str,
    version: i16,
    req: &FetchRequest,
    max_bytes: usize,
) -> (FetchReply, usize, bool) {
    let mut resp = FetchResponse::default();
    let mut records: Vec<Option<FetchedRecords>> = Vec::new();
    let mut total = 0usize;
    let mut had_error = false;
    let image = broker.metadata.image();
    let replica_id = replica_id(version, req);
    let from_follower = replica_id >= 0;
    let now = now_ms();
    let mut hw_moved = false;
    let mut leaders = LeaderHints::default();
    for topic in &req.topics {
        let mut t = FetchableTopicResponse::default();
        t.topic_id = topic.topic_id;
        // From v13 topics are named by id only.
        let name: Option<String> = if version >= 13 {
            image.topic_by_id(topic.topic_id).map(|t| t.name.clone())
        } else {
            t.topic = topic.topic.clone();
            Some(topic.topic.0.to_string())
        };
        for fp in &topic.partitions {
            let mut pd = PartitionData::default();
            pd.partition_index = fp.partition;
            pd.high_watermark = -1;
            pd.last_stable_offset = -1;
            pd.log_start_offset = -1;
            pd.preferred_read_replica = kafka_protocol::messages::BrokerId(-1);
            // The records go beside the response (`FetchReply::records`).
            pd.records = None;
            let Some(name) = &name else {
                pd.error_code = ResponseError::UnknownTopicId.code();
                had_error = true;
                t.partitions.push(pd);
                records.push(Some(FetchedRecords::empty()));
                continue;
            };
            // A consumer needs Read on the topic (a follower was checked
            // for ClusterAction above).
            if !from_follower
                && !authz.allows(
                    crate::authz::Operation::Read,
                    crate::authz::ResourceType::Topic,
                    name,
                )
            {
                pd.error_code = ResponseError::TopicAuthorizationFailed.code();
                had_error = true;
                t.partitions.push(pd);
                records.push(Some(FetchedRecords::empty()));
                continue;
            }
            let tp = TopicPartition::new(name.as_str(), fp.partition);
            let Some(part) = broker.replicas.get(&tp) else {
                pd.error_code = ResponseError::UnknownTopicOrPartition.code();
                had_error = true;
                t.partitions.push(pd);
                records.push(Some(FetchedRecords::empty()));
                continue;
            };
            let mut part = part.lock().expect("poisoned");
            // Kafka's order: the leader epoch first, then leadership, then
            // whether the fetching replica belongs to the partition.
            let check = part
                .check_leader_epoch(fp.current_leader_epoch)
                .and_then(|()| match part.leader_state() {
                    None => Err(PartitionError::NotLeaderOrFollower),
                    Some(l) if from_follower && l.follower(NodeId(replica_id)).is_none() => {
                        Err(if fp.current_leader_epoch >= 0 {
                            PartitionError::UnknownLeaderEpoch
                        } else {
                            PartitionError::NotLeaderOrFollower
                        })
                    }
                    Some(_) => Ok(()),
                });
            if let Err(e) = check {
                if matches!(e, PartitionError::NotLeaderOrFollower) && version >= 12 {
                    // KIP-951: tell the client where the leader is now.
                    if let Some((leader, epoch)) = leaders.hint(&image, &tp) {
                        pd.current_leader.leader_id = kafka_protocol::messages::BrokerId(leader.0);
                        pd.current_leader.leader_epoch = epoch;
                    }
                }
                pd.error_code = e.code();
                had_error = true;
                t.partitions.push(pd);
                records.push(Some(FetchedRecords::empty()));
                continue;
            }
            let remaining = max_bytes.saturating_sub(total);
            let partition_max = (fp.partition_max_bytes.max(0) as usize).min(remaining);
            let mut data = None;
            let limit = if from_follower {
                FetchLimit::LogEnd
            } else {
                FetchLimit::for_isolation_level(req.isolation_level)
            };
            // The first partition with data always returns at least one whole
            // batch, so a batch larger than the limits cannot stall a consumer.
            match part.read_regions_up_to(Offset(fp.fetch_offset), partition_max, total == 0, limit)
            {
                Ok(out) => {
                    pd.high_watermark = out.high_watermark.0;
                    if from_follower {
                        // The fetch offset is the follower's log end offset.
                        match part.record_follower_fetch(
                            NodeId(replica_id),
                            Offset(fp.fetch_offset),
                            now,
                        ) {
                            Ok(moved) => hw_moved |= moved,
                            Err(e) => {
                                tracing::warn!(%tp, replica_id, error = %e, "follower fetch not recorded")
                            }
                        }
                        if part.wants_isr_expand() {
                            broker.replicas.isr_check.notify_one();
                        }
                        // The high watermark after this fetch: it may have
                        // moved because of it, and the follower learns it a
                        // round trip sooner.
                        pd.high_watermark = part.high_watermark().0;
                    }
                    pd.last_stable_offset = out.last_stable_offset.0;
                    pd.log_start_offset = out.log_start_offset.0;
                    pd.aborted_transactions = out.aborted_transactions.map(aborted_transactions);
                    let fetched = FetchedRecords::new(out.regions);
                    total += fetched.size_bytes;
                    data = Some(fetched);
                }
                Err(e) => {
                    if let PartitionError::OffsetOutOfRange { .. } = e {
                        pd.high_watermark = part.high_watermark().0;
                        pd.last_stable_offset = part.last_stable_offset().0;
                        pd.log_start_offset = part.log_start_offset().0;
                    }
                    pd.error_code = e.code();
                    had_error = true;
                }
            }
            t.partitions.push(pd);
            records.push(Some(data.unwrap_or_else(FetchedRecords::empty)));
        }
        if version < 13 {
            t.topic = TopicName(str_bytes(topic.topic.0.to_string()));
        }
        resp.responses.push(t);
    }
    if hw_moved {
        // Consumers long-polling on this partition may now read more.
        broker.replicas.appended.notify_waiters();
    }
    if version >= 16 {
        resp.node_endpoints = leaders.fetch_endpoints(&image, listener);
    }
    (
        FetchReply {
            response: resp,
            records,
        },
        total,
        had_error,
    )
}
