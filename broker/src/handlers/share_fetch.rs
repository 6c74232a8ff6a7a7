//! ShareFetch (key 78) and ShareAcknowledge (key 79): members of a share
//! group acquire records from the partitions this node leads and
//! acknowledge them (KIP-932). The share session (`share::session`) says
//! which partitions a fetch reads; the share-partitions (`share::leader`)
//! hold the records' states, written to the share coordinator before an
//! acknowledgement is answered.
//!
//! As in Kafka (`KafkaApis.handleShareFetchRequest`): the group needs Read
//! (else GROUP_AUTHORIZATION_FAILED for the whole request), each topic Read
//! (else TOPIC_AUTHORIZATION_FAILED for its partitions); a session error
//! (SHARE_SESSION_NOT_FOUND, INVALID_SHARE_SESSION_EPOCH,
//! SHARE_SESSION_LIMIT_REACHED) is the whole request's error; the
//! acknowledgements a fetch carries are applied before it acquires
//! anything, and their outcome is each partition's
//! `acknowledge_error_code`. A fetch that finds nothing to acquire waits up
//! to `max_wait_ms` for new records, or for records others acknowledged,
//! released or let expire (which may make room in the window).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::share_acknowledge_response::{self, ShareAcknowledgeTopicResponse};
use kafka_protocol::messages::share_fetch_response::{
    self, AcquiredRecords, PartitionData, ShareFetchableTopicResponse,
};
use kafka_protocol::messages::{
    BrokerId, ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareFetchRequest,
    ShareFetchResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use protocol::newer::{NewerRequest, NewerResponse};
use uuid::Uuid;

use super::leader_hints::LeaderHints;
use super::RequestContext;
use crate::authz::{Authz, Operation, ResourceType};
use crate::broker::{now_ms, Broker};
use crate::share::leader::{settings, LeaderError, Want};
use crate::share::partition::{AckBatch, AckType, AcquireMode};
use crate::share::session::{FetchContext, SessionError, SessionPartition};
use crate::types::TopicPartition;

/// The longest a share fetch waits, whatever the client asks.
const MAX_WAIT_MS_CAP: i32 = 30_000;
/// How often a waiting fetch looks again, woken or not (a record can
/// become available on another node's say, when the log start moves).
const RECHECK_MS: u64 = 250;
/// The records a fetch acquires when the request sets no limit.
const DEFAULT_MAX_RECORDS: usize = 500;

fn session_error(e: SessionError) -> ResponseError {
    match e {
        SessionError::NotFound => ResponseError::ShareSessionNotFound,
        SessionError::InvalidEpoch => ResponseError::InvalidShareSessionEpoch,
        SessionError::InvalidRequest => ResponseError::InvalidRequest,
        SessionError::LimitReached => ResponseError::ShareSessionLimitReached,
    }
}

/// What the acknowledgements of a request may say about renewals
/// (KIP-1222, version 2): whether RENEW is a known type, and whether the
/// request says it carries renewals (`IsRenewAck`).
#[derive(Clone, Copy, Default)]
struct Renewals {
    supported: bool,
    declared: bool,
}

/// A request's acknowledgement batches, as the share-partition takes them.
/// As Kafka (`KafkaApis.validateAcknowledgementBatches`), the partition's
/// INVALID_REQUEST: an unknown acknowledge type, RENEW before version 2, or
/// RENEW in a request that does not declare `IsRenewAck`.
fn ack_batches<'a>(
    batches: impl Iterator<Item = (i64, i64, &'a [i8])>,
    renewals: Renewals,
) -> Result<Vec<AckBatch>, LeaderError> {
    batches
        .map(|(first_offset, last_offset, types)| {
            let types = types
                .iter()
                .map(|t| {
                    AckType::from_id(*t).filter(|t| {
                        *t != AckType::Renew || (renewals.supported && renewals.declared)
                    })
                })
                .collect::<Option<Vec<_>>>()
                .ok_or(LeaderError::Ack(
                    crate::share::partition::AckError::InvalidRequest,
                ))?;
            Ok(AckBatch {
                first_offset,
                last_offset,
                types,
            })
        })
        .collect()
}

/// The group and member a share request names: the request's error when
/// either is missing or the group may not be read.
fn identify(
    authz: &Authz<'_>,
    group: Option<&str>,
    member: Option<&str>,
) -> Result<(String, String), ResponseError> {
    let group = group.filter(|g| !g.is_empty());
    let member = member.filter(|m| !m.is_empty());
    let (Some(group), Some(member)) = (group, member) else {
        return Err(ResponseError::InvalidRequest);
    };
    if !authz.allows(Operation::Read, ResourceType::Group, group) {
        return Err(ResponseError::GroupAuthorizationFailed);
    }
    Ok((group.to_string(), member.to_string()))
}

/// A partition's topic name, if the topic exists and may be read.
fn topic_name(broker: &Broker, authz: &Authz<'_>, topic_id: Uuid) -> Result<String, ResponseError> {
    let image = broker.metadata.image();
    let name = image
        .topic_by_id(topic_id)
        .map(|t| t.name.clone())
        .ok_or(ResponseError::UnknownTopicId)?;
    if !authz.allows(Operation::Read, ResourceType::Topic, &name) {
        return Err(ResponseError::TopicAuthorizationFailed);
    }
    Ok(name)
}

/// Applies one partition's acknowledgements: its error code (0 when done).
async fn acknowledge_partition(
    broker: &Broker,
    authz: &Authz<'_>,
    group: &str,
    member: &str,
    (topic_id, partition): SessionPartition,
    batches: Result<Vec<AckBatch>, LeaderError>,
) -> i16 {
    let name = match topic_name(broker, authz, topic_id) {
        Ok(name) => name,
        Err(e) => return e.code(),
    };
    let tp = TopicPartition::new(name.as_str(), partition);
    let result = match batches {
        Ok(batches) => {
            broker
                .share_leaders
                .acknowledge(broker, group, &tp, member, &batches)
                .await
        }
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            tracing::debug!(group, member, %tp, error = %e, "share acknowledgement refused");
            e.code()
        }
    }
}

/// Ends the member's locks once its session closed.
async fn release(broker: &Broker, group: &str, member: &str) {
    if let Err(e) = broker
        .share_leaders
        .release_member(broker, group, member)
        .await
    {
        tracing::info!(group, member, error = %e, "releasing a closed session's records failed");
    }
}

#[derive(Default)]
struct Outcome {
    ack_error: Option<i16>,
    error: Option<(i16, Option<(i32, i32)>)>,
    records: Option<Bytes>,
    acquired: Vec<AcquiredRecords>,
}

pub async fn fetch(
    broker: &Broker,
    ctx: &RequestContext,
    authz: &Authz<'_>,
    req: ShareFetchRequest,
    newer: Option<NewerRequest>,
) -> ShareFetchResponse {
    let mut resp = ShareFetchResponse::default();
    // Version 2: the acquire mode (KIP-1206) and renewals (KIP-1222).
    let (mode, renewals) = match newer {
        Some(NewerRequest::ShareFetch {
            acquire_mode,
            is_renew_ack,
        }) => (
            acquire_mode,
            Renewals {
                supported: true,
                declared: is_renew_ack,
            },
        ),
        _ => (0, Renewals::default()),
    };
    let mode = match mode {
        0 => AcquireMode::BatchOptimized,
        1 => AcquireMode::RecordLimit,
        _ => {
            resp.error_code = ResponseError::InvalidRequest.code();
            resp.error_message = Some(StrBytes::from_string(format!(
                "Unknown share acquire mode {mode}"
            )));
            return resp;
        }
    };
    // A renewal only renews: it fetches nothing, and says so.
    if renewals.declared {
        let set: Vec<&str> = [
            ("MaxBytes", req.max_bytes),
            ("MinBytes", req.min_bytes),
            ("MaxRecords", req.max_records),
            ("MaxWaitMs", req.max_wait_ms),
        ]
        .into_iter()
        .filter(|(_, v)| *v != 0)
        .map(|(name, _)| name)
        .collect();
        if !set.is_empty() {
            resp.error_code = ResponseError::InvalidRequest.code();
            resp.error_message = Some(StrBytes::from_string(format!(
                "Renew acknowledgements carry no fetch, but {} are set",
                set.join(", ")
            )));
            return resp;
        }
    }
    let (group, member) = match identify(
        authz,
        req.group_id.as_ref().map(|g| g.0.as_str()),
        req.member_id.as_deref(),
    ) {
        Ok(ids) => ids,
        Err(e) => {
            resp.error_code = e.code();
            return resp;
        }
    };
    resp.acquisition_lock_timeout_ms = lock_timeout_ms(broker, &group);

    let mut named: Vec<SessionPartition> = Vec::new();
    let mut acks: Vec<(SessionPartition, Result<Vec<AckBatch>, LeaderError>)> = Vec::new();
    for t in &req.topics {
        for p in &t.partitions {
            let key = (t.topic_id, p.partition_index);
            named.push(key);
            if !p.acknowledgement_batches.is_empty() {
                let batches = ack_batches(
                    p.acknowledgement_batches.iter().map(|b| {
                        (
                            b.first_offset,
                            b.last_offset,
                            b.acknowledge_types.as_slice(),
                        )
                    }),
                    renewals,
                );
                acks.push((key, batches));
            }
        }
    }
    let forget: Vec<SessionPartition> = req
        .forgotten_topics_data
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, *p)))
        .collect();
    let context = broker.share_sessions.lock().expect("poisoned").fetch(
        &group,
        &member,
        req.share_session_epoch,
        &named,
        &forget,
        !acks.is_empty(),
        now_ms(),
    );
    if req.share_session_epoch == crate::share::session::INITIAL_EPOCH && context.is_ok() {
        broker
            .share_sessions
            .lock()
            .expect("poisoned")
            .bind(&group, &member, ctx.connection_id);
    }
    let context = match context {
        Ok(c) => c,
        Err(e) => {
            resp.error_code = session_error(e).code();
            return resp;
        }
    };

    let mut outcomes: BTreeMap<SessionPartition, Outcome> = BTreeMap::new();
    for (key, batches) in acks {
        let code = acknowledge_partition(broker, authz, &group, &member, key, batches).await;
        outcomes.entry(key).or_default().ack_error = Some(code);
    }
    let partitions = match context {
        FetchContext::Close(_) => {
            release(broker, &group, &member).await;
            return respond(broker, ctx, resp, outcomes);
        }
        FetchContext::Fetch(_) if renewals.declared => {
            return respond(broker, ctx, resp, outcomes);
        }
        FetchContext::Fetch(partitions) => partitions,
    };

    let max_bytes = req.max_bytes.min(broker.config.fetch_max_bytes).max(0) as usize;
    let max_records = usize::try_from(req.max_records)
        .ok()
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_MAX_RECORDS);
    let member_ref: Arc<str> = Arc::from(member.as_str());
    let deadline = tokio::time::Instant::now()
        + Duration::from_millis(req.max_wait_ms.clamp(0, MAX_WAIT_MS_CAP) as u64);
    // Start each fetch at a different partition, so one busy partition
    // cannot take every fetch's byte and record budget.
    let rotate = (req.share_session_epoch.max(0) as usize) % partitions.len().max(1);
    loop {
        // Interest first, so a change between the look and the wait wakes it.
        let appended = broker.replicas.appended.notified();
        tokio::pin!(appended);
        appended.as_mut().enable();
        let changed = broker.share_leaders.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let mut bytes_left = max_bytes;
        let mut records_left = max_records;
        let mut answered = false;
        for i in 0..partitions.len() {
            if bytes_left == 0 || records_left == 0 {
                break;
            }
            let key = partitions[(i + rotate) % partitions.len()];
            let name = match topic_name(broker, authz, key.0) {
                Ok(name) => name,
                Err(e) => {
                    outcomes.entry(key).or_default().error = Some((e.code(), None));
                    answered = true;
                    continue;
                }
            };
            let tp = TopicPartition::new(name.as_str(), key.1);
            let r = broker
                .share_leaders
                .fetch(
                    broker,
                    &group,
                    &tp,
                    &member_ref,
                    Want {
                        max_bytes: bytes_left,
                        max_records: records_left,
                        mode,
                    },
                )
                .await;
            match r {
                Ok(None) => {}
                Ok(Some((records, acquired))) => {
                    bytes_left = bytes_left.saturating_sub(records.len());
                    let n: i64 = acquired
                        .iter()
                        .map(|a| a.last_offset - a.first_offset + 1)
                        .sum();
                    records_left = records_left.saturating_sub(n as usize);
                    let o = outcomes.entry(key).or_default();
                    o.records = Some(records);
                    o.acquired = acquired
                        .into_iter()
                        .map(|a| {
                            AcquiredRecords::default()
                                .with_first_offset(a.first_offset)
                                .with_last_offset(a.last_offset)
                                .with_delivery_count(a.delivery_count)
                        })
                        .collect();
                    answered = true;
                }
                Err(e) => {
                    let hint = match e {
                        LeaderError::NotLeaderOrFollower => LeaderHints::default()
                            .hint(&broker.metadata.image(), &tp)
                            .map(|(leader, epoch)| (leader.0, epoch)),
                        _ => None,
                    };
                    outcomes.entry(key).or_default().error = Some((e.code(), hint));
                    answered = true;
                }
            }
        }
        let now = tokio::time::Instant::now();
        if answered || now >= deadline {
            break;
        }
        let wake = deadline.min(now + Duration::from_millis(RECHECK_MS));
        tokio::select! {
            _ = appended => {}
            _ = changed => {}
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
    respond(broker, ctx, resp, outcomes)
}

/// Fills the response's partitions (those with something to say: records,
/// an error, or an acknowledgement's outcome) and the leaders' endpoints.
fn respond(
    broker: &Broker,
    ctx: &RequestContext,
    mut resp: ShareFetchResponse,
    outcomes: BTreeMap<SessionPartition, Outcome>,
) -> ShareFetchResponse {
    let image = broker.metadata.image();
    let mut hints = LeaderHints::default();
    let mut by_topic: BTreeMap<Uuid, Vec<PartitionData>> = BTreeMap::new();
    for ((topic_id, partition), o) in outcomes {
        let mut pd = PartitionData::default().with_partition_index(partition);
        pd.acknowledge_error_code = o.ack_error.unwrap_or(0);
        pd.current_leader.leader_id = -1;
        pd.current_leader.leader_epoch = -1;
        if let Some((code, hint)) = o.error {
            pd.error_code = code;
            if let Some((leader, epoch)) = hint {
                if let Some(t) = image.topic_by_id(topic_id) {
                    hints.hint(&image, &TopicPartition::new(t.name.as_str(), partition));
                }
                pd.current_leader.leader_id = leader;
                pd.current_leader.leader_epoch = epoch;
            }
        }
        pd.records = Some(o.records.unwrap_or_default());
        pd.acquired_records = o.acquired;
        by_topic.entry(topic_id).or_default().push(pd);
    }
    resp.responses = by_topic
        .into_iter()
        .map(|(topic_id, partitions)| {
            ShareFetchableTopicResponse::default()
                .with_topic_id(topic_id)
                .with_partitions(partitions)
        })
        .collect();
    resp.node_endpoints = hints.endpoints_as(&image, &ctx.listener, |id, host, port, rack| {
        share_fetch_response::NodeEndpoint::default()
            .with_node_id(BrokerId(id))
            .with_host(host)
            .with_port(port)
            .with_rack(rack)
    });
    resp
}

/// ShareAcknowledge; from version 2 its response carries the acquisition
/// lock timeout, which a renewal restarted.
pub async fn acknowledge(
    broker: &Broker,
    ctx: &RequestContext,
    authz: &Authz<'_>,
    req: ShareAcknowledgeRequest,
    version: i16,
    newer: Option<NewerRequest>,
) -> NewerResponse {
    let renewals = Renewals {
        supported: version >= 2,
        declared: matches!(
            newer,
            Some(NewerRequest::ShareAcknowledge { is_renew_ack: true })
        ),
    };
    // Only v2 responses carry the timeout.
    let acquisition_lock_timeout_ms = match (&req.group_id, version >= 2) {
        (Some(group), true) => lock_timeout_ms(broker, &group.0),
        _ => 0,
    };
    let body = acknowledge_body(broker, ctx, authz, req, renewals).await;
    NewerResponse::ShareAcknowledge {
        body,
        acquisition_lock_timeout_ms,
    }
}

/// The acquisition lock timeout responses tell `group`'s members.
fn lock_timeout_ms(broker: &Broker, group: &str) -> i32 {
    settings(broker, group)
        .record_lock_duration_ms
        .clamp(0, i32::MAX as i64) as i32
}

async fn acknowledge_body(
    broker: &Broker,
    ctx: &RequestContext,
    authz: &Authz<'_>,
    req: ShareAcknowledgeRequest,
    renewals: Renewals,
) -> ShareAcknowledgeResponse {
    let mut resp = ShareAcknowledgeResponse::default();
    let (group, member) = match identify(
        authz,
        req.group_id.as_ref().map(|g| g.0.as_str()),
        req.member_id.as_deref(),
    ) {
        Ok(ids) => ids,
        Err(e) => {
            resp.error_code = e.code();
            return resp;
        }
    };
    let closing = broker.share_sessions.lock().expect("poisoned").acknowledge(
        &group,
        &member,
        req.share_session_epoch,
        now_ms(),
    );
    let closing = match closing {
        Ok(c) => c.is_some(),
        Err(e) => {
            resp.error_code = session_error(e).code();
            return resp;
        }
    };
    let image = broker.metadata.image();
    let mut hints = LeaderHints::default();
    for t in req.topics {
        let mut out = ShareAcknowledgeTopicResponse::default().with_topic_id(t.topic_id);
        for p in t.partitions {
            let batches = ack_batches(
                p.acknowledgement_batches.iter().map(|b| {
                    (
                        b.first_offset,
                        b.last_offset,
                        b.acknowledge_types.as_slice(),
                    )
                }),
                renewals,
            );
            let key = (t.topic_id, p.partition_index);
            let code = acknowledge_partition(broker, authz, &group, &member, key, batches).await;
            let mut pd = share_acknowledge_response::PartitionData::default()
                .with_partition_index(p.partition_index)
                .with_error_code(code);
            pd.current_leader.leader_id = -1;
            pd.current_leader.leader_epoch = -1;
            if code == ResponseError::NotLeaderOrFollower.code() {
                if let Some(topic) = image.topic_by_id(t.topic_id) {
                    let tp = TopicPartition::new(topic.name.as_str(), p.partition_index);
                    if let Some((leader, epoch)) = hints.hint(&image, &tp) {
                        pd.current_leader.leader_id = leader.0;
                        pd.current_leader.leader_epoch = epoch;
                    }
                }
            }
            out.partitions.push(pd);
        }
        resp.responses.push(out);
    }
    if closing {
        release(broker, &group, &member).await;
    }
    resp.node_endpoints = hints.endpoints_as(&image, &ctx.listener, |id, host, port, rack| {
        share_acknowledge_response::NodeEndpoint::default()
            .with_node_id(BrokerId(id))
            .with_host(host)
            .with_port(port)
            .with_rack(rack)
    });
    resp
}
