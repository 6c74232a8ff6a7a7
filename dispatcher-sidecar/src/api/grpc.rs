//! The gRPC API (tonic): `dispatcher.v1.Dispatcher` from
//! `proto/dispatcher.proto`, the same operations as the HTTP API with bytes
//! where JSON needs an encoding and times in ms since the Unix epoch.

use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use super::edge;
use crate::config::{PushEndpoint, QueueConfig};
use crate::redrive::{
    JobState, RedriveAction, RedriveError, RedriveFilter, RedriveJob, RedriveRequest,
};
use crate::security::auth::{Access, Action, Denied, Principal};
use crate::service::{
    Delivery, NewMessage, ParkedKeyInfo, PartitionStats, ProduceResult, ProduceStatus,
    QueueService, QueueStats, ReceiptOutcome, ServiceError, SkipOutcome,
};
use crate::trace::{
    CurrentState, EventKind, LocationKind, MessageTrace, Place, Source, Status as TraceStatus,
    TraceEvent,
};

/// The code generated from `proto/dispatcher.proto` (package
/// `dispatcher.v1`): messages, the server trait and the client.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("dispatcher.v1");
}

use proto::dispatcher_server::{Dispatcher, DispatcherServer};

/// The largest gRPC request accepted: a 1 MiB produce batch plus the
/// framing of 500 messages (bytes need no base64 here).
pub const GRPC_MESSAGE_LIMIT_BYTES: usize = 2 << 20;

/// The gRPC service over a [`QueueService`].
#[derive(Debug)]
pub struct GrpcApi<S> {
    service: Arc<S>,
    /// `[auth]`: who may call what (everyone when `None`).
    access: Option<Arc<Access>>,
}

/// The gRPC API as a tonic service, ready for
/// `tonic::transport::Server::add_service`.
pub fn grpc_service<S: QueueService>(service: Arc<S>) -> DispatcherServer<GrpcApi<S>> {
    grpc_service_with_access(service, None)
}

/// [`grpc_service`] whose calls require a caller `access` authenticates
/// (UNAUTHENTICATED otherwise) and authorizes for the call's queue and
/// action (PERMISSION_DENIED otherwise), as the HTTP routes do.
pub fn grpc_service_with_access<S: QueueService>(
    service: Arc<S>,
    access: Option<Arc<Access>>,
) -> DispatcherServer<GrpcApi<S>> {
    DispatcherServer::new(GrpcApi { service, access })
        .max_decoding_message_size(GRPC_MESSAGE_LIMIT_BYTES)
}

impl<S> GrpcApi<S> {
    /// The caller, when it may do `action` on `queue` (or, without a queue,
    /// when it authenticates); `None` without `[auth]`.
    fn allow<T>(
        &self,
        request: &Request<T>,
        queue: Option<&str>,
        action: Action,
    ) -> Result<Option<Principal>, Status> {
        let Some(access) = &self.access else {
            return Ok(None);
        };
        let authorization = request
            .metadata()
            .get("authorization")
            .map(|v| v.as_bytes());
        match access.check(authorization, queue, action) {
            Ok(p) => Ok(Some(p)),
            Err(denied) => {
                metrics::counter!("dispatcher_auth_denied_total", "reason" => match denied {
                    Denied::Unauthenticated(_) => "unauthenticated",
                    Denied::Forbidden(_) => "forbidden",
                })
                .increment(1);
                Err(match denied {
                    Denied::Unauthenticated(m) => Status::unauthenticated(m),
                    Denied::Forbidden(m) => Status::permission_denied(m),
                })
            }
        }
    }

    fn may_read(&self, caller: Option<&Principal>, queue: &str) -> bool {
        match (&self.access, caller) {
            (None, _) => true,
            (Some(access), Some(p)) => access.allows(p, queue, Action::Read),
            (Some(_), None) => false,
        }
    }
}

/// UnknownQueue → NOT_FOUND, InvalidArgument → INVALID_ARGUMENT,
/// Unavailable → UNAVAILABLE.
fn status(e: ServiceError) -> Status {
    let message = e.to_string();
    match e {
        ServiceError::UnknownQueue(_) => Status::not_found(message),
        ServiceError::InvalidArgument(_) => Status::invalid_argument(message),
        ServiceError::Unavailable(_) => Status::unavailable(message),
    }
}

fn receipt_status(outcome: ReceiptOutcome) -> proto::ReceiptStatus {
    match outcome {
        ReceiptOutcome::Ok => proto::ReceiptStatus::Ok,
        ReceiptOutcome::Stale => proto::ReceiptStatus::Stale,
        ReceiptOutcome::Invalid => proto::ReceiptStatus::Invalid,
        ReceiptOutcome::NotOwner => proto::ReceiptStatus::NotOwner,
    }
}

#[tonic::async_trait]
impl<S: QueueService> Dispatcher for GrpcApi<S> {
    async fn list_queues(
        &self,
        request: Request<proto::ListQueuesRequest>,
    ) -> Result<Response<proto::ListQueuesResponse>, Status> {
        let caller = self.allow(&request, None, Action::Read)?;
        let queues = self
            .service
            .queues()
            .into_iter()
            .filter(|q| self.may_read(caller.as_ref(), &q.name))
            .map(queue)
            .collect();
        Ok(Response::new(proto::ListQueuesResponse { queues }))
    }

    async fn produce(
        &self,
        request: Request<proto::ProduceRequest>,
    ) -> Result<Response<proto::ProduceResponse>, Status> {
        self.allow(&request, Some(&request.get_ref().queue), Action::Produce)?;
        let request = request.into_inner();
        let messages: Vec<NewMessage> = request.messages.into_iter().map(new_message).collect();
        edge::check_produce(&messages).map_err(status)?;
        let results = self
            .service
            .produce(&request.queue, messages)
            .await
            .map_err(status)?;
        let results = results.into_iter().map(produce_result).collect();
        Ok(Response::new(proto::ProduceResponse { results }))
    }

    async fn receive(
        &self,
        request: Request<proto::ReceiveRequest>,
    ) -> Result<Response<proto::ReceiveResponse>, Status> {
        self.allow(&request, Some(&request.get_ref().queue), Action::Receive)?;
        let request = request.into_inner();
        let receive = edge::receive_request(edge::ReceiveParams {
            max_messages: request.max_messages,
            wait_seconds: request.wait_seconds,
            lease_seconds: request.lease_seconds,
            consumer_id: request.consumer_id,
        })
        .map_err(status)?;
        let deliveries = self
            .service
            .receive(&request.queue, receive)
            .await
            .map_err(status)?;
        let messages = deliveries.into_iter().map(delivery).collect();
        Ok(Response::new(proto::ReceiveResponse { messages }))
    }

    async fn ack(
        &self,
        request: Request<proto::AckRequest>,
    ) -> Result<Response<proto::AckResponse>, Status> {
        self.allow(&request, Some(&request.get_ref().queue), Action::Receive)?;
        let request = request.into_inner();
        edge::check_receipts(&request.receipts).map_err(status)?;
        let outcomes = self
            .service
            .ack(&request.queue, &request.receipts)
            .await
            .map_err(status)?;
        if outcomes.len() != request.receipts.len() {
            return Err(Status::internal(format!(
                "the service answered {} receipts with {} outcomes",
                request.receipts.len(),
                outcomes.len()
            )));
        }
        let results = request
            .receipts
            .into_iter()
            .zip(outcomes)
            .map(|(receipt, outcome)| proto::AckResult {
                receipt,
                status: receipt_status(outcome).into(),
            })
            .collect();
        Ok(Response::new(proto::AckResponse { results }))
    }

    async fn nack(
        &self,
        request: Request<proto::NackRequest>,
    ) -> Result<Response<proto::NackResponse>, Status> {
        self.allow(&request, Some(&request.get_ref().queue), Action::Receive)?;
        let request = request.into_inner();
        let nack = edge::nack_request(
            request.receipt,
            request.retry_after_seconds,
            request.error,
            request.permanent,
        );
        let outcome = self
            .service
            .nack(&request.queue, nack)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::NackResponse {
            status: receipt_status(outcome).into(),
        }))
    }

    async fn extend(
        &self,
        request: Request<proto::ExtendRequest>,
    ) -> Result<Response<proto::ExtendResponse>, Status> {
        self.allow(&request, Some(&request.get_ref().queue), Action::Receive)?;
        let request = request.into_inner();
        let lease = edge::lease_duration("lease_seconds", request.lease_seconds).map_err(status)?;
        let result = self
            .service
            .extend(&request.queue, request.receipt, lease)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::ExtendResponse {
            status: receipt_status(result.outcome).into(),
            lease_expires_at_ms: result.lease_expires_at_ms,
        }))
    }

    async fn stats(
        &self,
        request: Request<proto::StatsRequest>,
    ) -> Result<Response<proto::StatsResponse>, Status> {
        self.allow(&request, Some(&request.get_ref().queue), Action::Read)?;
        let request = request.into_inner();
        let stats = self.service.stats(&request.queue).await.map_err(status)?;
        Ok(Response::new(stats_response(stats)))
    }

    async fn pause(
        &self,
        request: Request<proto::PauseRequest>,
    ) -> Result<Response<proto::PauseResponse>, Status> {
        self.allow(&request, Some(&request.get_ref().queue), Action::Admin)?;
        let request = request.into_inner();
        self.service
            .set_paused(&request.queue, true)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::PauseResponse {}))
    }

    async fn resume(
        &self,
        request: Request<proto::ResumeRequest>,
    ) -> Result<Response<proto::ResumeResponse>, Status> {
        self.allow(&request, Some(&request.get_ref().queue), Action::Admin)?;
        let request = request.into_inner();
        self.service
            .set_paused(&request.queue, false)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::ResumeResponse {}))
    }

    async fn parked(
        &self,
        request: Request<proto::ParkedRequest>,
    ) -> Result<Response<proto::ParkedResponse>, Status> {
        self.allow(&request, Some(&request.get_ref().queue), Action::Read)?;
        let request = request.into_inner();
        let parked = self.service.parked(&request.queue).await.map_err(status)?;
        Ok(Response::new(proto::ParkedResponse {
            parked: parked.into_iter().map(parked_key).collect(),
        }))
    }

    async fn skip(
        &self,
        request: Request<proto::SkipRequest>,
    ) -> Result<Response<proto::SkipResponse>, Status> {
        self.allow(&request, Some(&request.get_ref().queue), Action::Admin)?;
        let request = request.into_inner();
        let skip = edge::skip_request(request.partition, request.key, request.message_id)
            .map_err(status)?;
        let skip_status = match self
            .service
            .skip(&request.queue, skip)
            .await
            .map_err(status)?
        {
            SkipOutcome::Released => proto::SkipStatus::Released,
            SkipOutcome::NotParked => proto::SkipStatus::NotParked,
            SkipOutcome::OtherMessage => proto::SkipStatus::OtherMessage,
            SkipOutcome::AlreadyReleased => proto::SkipStatus::AlreadyReleased,
            SkipOutcome::NotOwner => return Err(Status::unavailable(edge::SKIP_OWNER_UNREACHED)),
        };
        Ok(Response::new(proto::SkipResponse {
            status: skip_status.into(),
        }))
    }

    async fn trace(
        &self,
        request: Request<proto::TraceRequest>,
    ) -> Result<Response<proto::TraceResponse>, Status> {
        let caller = self.allow(&request, request.get_ref().queue.as_deref(), Action::Read)?;
        let request = request.into_inner();
        let mut traces = self
            .service
            .trace(&request.message_id, request.queue.as_deref())
            .await
            .map_err(status)?;
        traces.retain(|t| self.may_read(caller.as_ref(), &t.queue));
        if traces.is_empty() {
            return Err(Status::not_found(edge::unknown_message(
                &request.message_id,
                request.queue.as_deref(),
            )));
        }
        Ok(Response::new(proto::TraceResponse {
            message_id: request.message_id,
            traces: traces.into_iter().map(message_trace).collect(),
        }))
    }

    async fn redrive_start(
        &self,
        request: Request<proto::RedriveStartRequest>,
    ) -> Result<Response<proto::RedriveJob>, Status> {
        self.allow(&request, Some(&request.get_ref().queue), Action::Admin)?;
        let request = request.into_inner();
        let start = RedriveRequest {
            rate_per_sec: request.rate_per_sec,
            filter: request.filter.map(|f| RedriveFilter {
                message_id: f.message_id,
                key: f.key,
                error_contains: f.error_contains,
                from: f.from_ms.map(super::json::rfc3339_ms),
                to: f.to_ms.map(super::json::rfc3339_ms),
            }),
            max_messages: request.max_messages,
        };
        let job = self
            .service
            .redrive_start(&request.queue, start)
            .await
            .map_err(redrive_status)?;
        Ok(Response::new(redrive_job(job)))
    }

    async fn redrive_status(
        &self,
        request: Request<proto::RedriveStatusRequest>,
    ) -> Result<Response<proto::RedriveJob>, Status> {
        self.allow(&request, Some(&request.get_ref().queue), Action::Read)?;
        let request = request.into_inner();
        let job = self
            .service
            .redrive_status(&request.queue)
            .await
            .map_err(redrive_status)?;
        Ok(Response::new(redrive_job(job)))
    }

    async fn redrive_control(
        &self,
        request: Request<proto::RedriveControlRequest>,
    ) -> Result<Response<proto::RedriveJob>, Status> {
        self.allow(&request, Some(&request.get_ref().queue), Action::Admin)?;
        let request = request.into_inner();
        let action = match proto::RedriveAction::try_from(request.action) {
            Ok(proto::RedriveAction::Pause) => RedriveAction::Pause,
            Ok(proto::RedriveAction::Resume) => RedriveAction::Resume,
            Ok(proto::RedriveAction::Cancel) => RedriveAction::Cancel,
            Ok(proto::RedriveAction::Unspecified) | Err(_) => {
                return Err(Status::invalid_argument(
                    "action must be PAUSE, RESUME or CANCEL",
                ))
            }
        };
        let job = self
            .service
            .redrive_control(&request.queue, action)
            .await
            .map_err(redrive_status)?;
        Ok(Response::new(redrive_job(job)))
    }
}

/// Conflict → FAILED_PRECONDITION, NoJob → NOT_FOUND, NotOwner →
/// UNAVAILABLE; service errors as [`status`].
fn redrive_status(e: RedriveError) -> Status {
    let message = e.to_string();
    match e {
        RedriveError::Service(e) => status(e),
        RedriveError::Conflict(_) => Status::failed_precondition(message),
        RedriveError::NoJob(_) => Status::not_found(message),
        RedriveError::NotOwner => Status::unavailable(message),
    }
}

fn redrive_job(j: RedriveJob) -> proto::RedriveJob {
    let ms = |t: &str| super::json::parse_rfc3339_ms(t).unwrap_or_default();
    let state = match j.state {
        JobState::Running => proto::RedriveState::Running,
        JobState::Paused => proto::RedriveState::Paused,
        JobState::Cancelled => proto::RedriveState::Cancelled,
        JobState::Done => proto::RedriveState::Done,
        JobState::Failed => proto::RedriveState::Failed,
    };
    proto::RedriveJob {
        state: state.into(),
        reason: j.reason,
        filter: j.filter.map(|f| proto::RedriveFilter {
            message_id: f.message_id,
            key: f.key,
            error_contains: f.error_contains,
            from_ms: f.from.as_deref().and_then(crate::redrive::parse_time),
            to_ms: f.to.as_deref().and_then(crate::redrive::parse_time),
        }),
        rate_per_sec: j.rate_per_sec,
        max_messages: j.max_messages,
        scanned: j.scanned,
        matched: j.matched,
        redriven: j.redriven,
        skipped: j.skipped,
        unreadable: j.unreadable,
        remaining: j.remaining,
        started_at_ms: ms(&j.started_at),
        finished_at_ms: j.finished_at.as_deref().map(ms),
        first_redriven_at_ms: j.first_redriven_at.as_deref().map(ms),
        last_redriven_at_ms: j.last_redriven_at.as_deref().map(ms),
        partitions: j
            .partitions
            .into_iter()
            .map(|r| proto::RedriveRange {
                partition: r.partition,
                start: r.start,
                end: r.end,
                position: r.position,
            })
            .collect(),
        id: j.id,
        queue: j.queue,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn queue(q: QueueConfig) -> proto::Queue {
    let push = q.push.as_ref().map(|p| {
        let endpoint = p.endpoint.redacted();
        let (url, grpc) = match p.endpoint {
            PushEndpoint::Http(_) => (endpoint, String::new()),
            PushEndpoint::Grpc(_) => (String::new(), endpoint),
        };
        proto::PushSettings {
            url,
            grpc,
            concurrency: p.concurrency,
            timeout_ms: millis(p.timeout),
            breaker_failures: p.breaker_failures,
            breaker_cooldown_ms: millis(p.breaker_cooldown),
            breaker_cooldown_max_ms: millis(p.breaker_cooldown_max),
        }
    });
    proto::Queue {
        push,
        lease_ms: millis(q.lease),
        max_lease_ms: millis(q.max_lease),
        retry_tiers_ms: q.retry_tiers.iter().copied().map(millis).collect(),
        dedupe_window_ms: millis(q.dedupe_window),
        name: q.name,
        topic: q.topic,
        group: q.group,
        max_attempts: q.max_attempts,
        dlq_topic: q.dlq_topic,
        ack_log_topic: q.ack_log_topic,
        dedupe_topic: q.dedupe_topic,
        ordered: q.ordered,
        gap_cap: q.gap_cap,
        weight: q.weight,
    }
}

fn new_message(m: proto::NewMessage) -> NewMessage {
    NewMessage {
        message_id: m.message_id,
        key: m.key,
        payload: m.payload,
        headers: m.headers.into_iter().map(|h| (h.name, h.value)).collect(),
        delay: m.delay_seconds.map(Duration::from_secs),
    }
}

fn produce_result(r: ProduceResult) -> proto::ProduceResult {
    let status = match r.status {
        ProduceStatus::Accepted => proto::ProduceStatus::Accepted,
        ProduceStatus::Duplicate => proto::ProduceStatus::Duplicate,
    };
    proto::ProduceResult {
        message_id: r.message_id,
        status: status.into(),
        partition: r.partition,
        offset: r.offset,
    }
}

fn delivery(d: Delivery) -> proto::Delivery {
    proto::Delivery {
        message_id: d.message_id,
        receipt: d.receipt,
        key: d.key,
        payload: d.payload,
        headers: d
            .headers
            .into_iter()
            .map(|(name, value)| proto::Header { name, value })
            .collect(),
        attempt: d.attempt,
        enqueued_at_ms: d.enqueued_at_ms,
        partition: d.partition,
        offset: d.offset,
        lease_expires_at_ms: d.lease_expires_at_ms,
    }
}

fn stats_response(s: QueueStats) -> proto::StatsResponse {
    proto::StatsResponse {
        foreign_secret_members: s.foreign_secret_members,
        warnings: s.warnings(),
        depth: s.depth,
        in_flight: s.in_flight,
        oldest_unacked_age_ms: s.oldest_unacked_age_ms,
        retry_depth: s.retry_depth,
        dlq_depth: s.dlq_depth,
        dlq_oldest_age_ms: s.dlq_oldest_age_ms,
        paused: s.paused,
        partitions: s.partitions.into_iter().map(partition_stats).collect(),
        stuck_partitions: s
            .stuck_partitions
            .into_iter()
            .map(|p| proto::StuckPartition {
                topic: p.topic,
                partition: p.partition,
                offset: p.offset,
                error: p.error,
                since_ms: p.since_ms,
                errors: p.errors,
            })
            .collect(),
    }
}

fn partition_stats(p: PartitionStats) -> proto::PartitionStats {
    proto::PartitionStats {
        partition: p.partition,
        depth: p.depth,
        in_flight: p.in_flight,
        oldest_unacked_age_ms: p.oldest_unacked_age_ms,
    }
}

fn parked_key(p: ParkedKeyInfo) -> proto::ParkedKey {
    proto::ParkedKey {
        partition: p.partition,
        key: p.key,
        message_id: p.message_id,
        parked_at_ms: p.parked_at_ms,
        held: p.held,
        released_by: p.released_by,
    }
}

fn message_trace(t: MessageTrace) -> proto::MessageTrace {
    proto::MessageTrace {
        queue: t.queue,
        message_id: t.message_id,
        events: t.events.into_iter().map(trace_event).collect(),
        state: Some(trace_state(t.state)),
    }
}

fn trace_event(e: TraceEvent) -> proto::TraceEvent {
    let kind = match e.event {
        EventKind::Produced => proto::TraceEventKind::Produced,
        EventKind::DeliveryFailed => proto::TraceEventKind::DeliveryFailed,
        EventKind::Retried => proto::TraceEventKind::Retried,
        EventKind::DeadLettered => proto::TraceEventKind::DeadLettered,
        EventKind::Redriven => proto::TraceEventKind::Redriven,
        EventKind::Held => proto::TraceEventKind::Held,
        EventKind::Moved => proto::TraceEventKind::Moved,
    };
    proto::TraceEvent {
        at_ms: e.at,
        event: kind.into(),
        topic: e.topic,
        partition: e.partition,
        offset: e.offset,
        attempt: e.attempt.map(u32::from),
        consumer: e.consumer,
        error: e.error,
    }
}

fn trace_state(s: CurrentState) -> proto::TraceState {
    let status = match s.status {
        TraceStatus::Queued => proto::MessageStatus::Queued,
        TraceStatus::Waiting => proto::MessageStatus::Waiting,
        TraceStatus::InFlight => proto::MessageStatus::InFlight,
        TraceStatus::PendingRoute => proto::MessageStatus::PendingRoute,
        TraceStatus::Acked => proto::MessageStatus::Acked,
        TraceStatus::DeadLettered => proto::MessageStatus::DeadLettered,
        TraceStatus::Held => proto::MessageStatus::Held,
        TraceStatus::LeftRetention => proto::MessageStatus::LeftRetention,
        TraceStatus::NotAcked => proto::MessageStatus::NotAcked,
    };
    let source = match s.source {
        Source::Owner => proto::TraceSource::Owner,
        Source::Commit => proto::TraceSource::Commit,
        Source::Log => proto::TraceSource::Log,
    };
    proto::TraceState {
        status: status.into(),
        location: Some(trace_place(s.location)),
        detail: s.detail,
        source: source.into(),
        consumer: s.consumer,
        attempt: s.attempt.map(u32::from),
        lease_expires_at_ms: s.lease_expires_at,
        due_at_ms: s.due_at,
        committed_offset: s.committed_offset,
        log_start_offset: s.log_start_offset,
    }
}

fn trace_place(p: Place) -> proto::TracePlace {
    let kind = match p.kind {
        LocationKind::Primary => proto::LocationKind::Primary,
        LocationKind::Retry => proto::LocationKind::Retry,
        LocationKind::Dlq => proto::LocationKind::Dlq,
        LocationKind::Redriven => proto::LocationKind::Redriven,
        LocationKind::Held => proto::LocationKind::Held,
    };
    proto::TracePlace {
        kind: kind.into(),
        topic: p.topic,
        partition: p.partition,
        offset: p.offset,
    }
}
