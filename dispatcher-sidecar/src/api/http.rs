//! The HTTP/JSON API (axum), described route by route in `openapi.yaml`.
//!
//! The router is built from [`HTTP_ROUTES`], the same table a test compares
//! with the OpenAPI document, so a route cannot be added to one and not the
//! other. Every error, including a body that is not JSON, an unknown route
//! and a body over the limit, is JSON: `{"error": {"code", "message"}}`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::edge;
use super::json::{
    receipt_status, AckBody, AckResponse, AckResultOut, DeliveryOut, ErrorBody, ErrorDetail,
    ExtendBody, ExtendResponse, MessageIn, NackBody, ProduceBody, ProduceResponse, QueueOut,
    QueuesResponse, ReceiveBody, ReceiveResponse, StatsResponse, StatusResponse,
};
use super::json::{ParkedResponse, SkipBody};
use crate::redrive::{RedriveAction, RedriveError, RedriveRequest};
use crate::security::auth::{Access, Action, Denied, Principal, WWW_AUTHENTICATE};
use crate::service::{QueueService, ServiceError, SkipOutcome};

/// The largest request body accepted (413 above it): a full 1 MiB produce
/// batch written in base64 (4/3 of its size) plus the JSON around 500
/// messages.
pub const HTTP_BODY_LIMIT_BYTES: usize = 3 << 20;

/// One route of the HTTP API.
#[derive(Clone, Copy, Debug)]
pub struct HttpRoute {
    /// `GET` or `POST`.
    pub method: &'static str,
    /// In axum's (and OpenAPI's) template syntax: `/queues/{q}`.
    pub path: &'static str,
    endpoint: Endpoint,
}

#[derive(Clone, Copy, Debug)]
enum Endpoint {
    Health,
    Metrics,
    ListQueues,
    Stats,
    Produce,
    Receive,
    Ack,
    Nack,
    Extend,
    Pause,
    Resume,
    Parked,
    Skip,
    Trace,
    RedriveStart,
    RedriveStatus,
    RedriveControl(RedriveAction),
}

const fn route(method: &'static str, path: &'static str, endpoint: Endpoint) -> HttpRoute {
    HttpRoute {
        method,
        path,
        endpoint,
    }
}

/// Every route the router serves.
pub const HTTP_ROUTES: &[HttpRoute] = &[
    route("GET", "/healthz", Endpoint::Health),
    route("GET", "/metrics", Endpoint::Metrics),
    route("GET", "/queues", Endpoint::ListQueues),
    route("GET", "/queues/{q}", Endpoint::Stats),
    route("POST", "/queues/{q}/messages", Endpoint::Produce),
    route("POST", "/queues/{q}/receive", Endpoint::Receive),
    route("POST", "/queues/{q}/ack", Endpoint::Ack),
    route("POST", "/queues/{q}/nack", Endpoint::Nack),
    route("POST", "/queues/{q}/extend", Endpoint::Extend),
    route("POST", "/queues/{q}/pause", Endpoint::Pause),
    route("POST", "/queues/{q}/resume", Endpoint::Resume),
    route("GET", "/queues/{q}/parked", Endpoint::Parked),
    route("POST", "/queues/{q}/skip", Endpoint::Skip),
    route("GET", "/messages/{message_id}", Endpoint::Trace),
    route("POST", "/queues/{q}/redrive", Endpoint::RedriveStart),
    route("GET", "/queues/{q}/redrive", Endpoint::RedriveStatus),
    route(
        "POST",
        "/queues/{q}/redrive/pause",
        Endpoint::RedriveControl(RedriveAction::Pause),
    ),
    route(
        "POST",
        "/queues/{q}/redrive/resume",
        Endpoint::RedriveControl(RedriveAction::Resume),
    ),
    route(
        "POST",
        "/queues/{q}/redrive/cancel",
        Endpoint::RedriveControl(RedriveAction::Cancel),
    ),
];

/// What every handler sees.
struct ApiState<S> {
    service: Arc<S>,
    metrics: Option<PrometheusHandle>,
    /// `[auth]`: who may call which route (everyone when `None`).
    access: Option<Arc<Access>>,
}

type AppState<S> = State<Arc<ApiState<S>>>;

/// The HTTP API over `service`; `metrics` is rendered at `GET /metrics`
/// (404 when `None`).
pub fn http_router<S: QueueService>(service: Arc<S>, metrics: Option<PrometheusHandle>) -> Router {
    http_router_with_access(service, metrics, None)
}

/// [`http_router`] whose routes (but `/healthz`) require a caller
/// `access` authenticates and, on a queue, authorizes for the route's
/// [`Action`] ([`route_action`]): 401 with `WWW-Authenticate` without a
/// valid credential, 403 when the caller may not.
pub fn http_router_with_access<S: QueueService>(
    service: Arc<S>,
    metrics: Option<PrometheusHandle>,
    access: Option<Arc<Access>>,
) -> Router {
    let mut router = Router::new();
    for route in HTTP_ROUTES {
        router = router.route(route.path, method_router::<S>(route));
    }
    if let Some(access) = &access {
        // After routing, so the route (and its queue) is known.
        router = router.route_layer(axum::middleware::from_fn_with_state(
            access.clone(),
            authorize,
        ));
    }
    router
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(HTTP_BODY_LIMIT_BYTES))
        .with_state(Arc::new(ApiState {
            service,
            metrics,
            access,
        }))
}

/// What a route requires of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requirement {
    /// Nothing (`/healthz`).
    Open,
    /// Any authenticated caller (what it sees may be filtered).
    Authenticated,
    /// The action on the route's queue (`{q}`).
    OnQueue(Action),
    /// Read on the queue of `?queue=` when given; otherwise authenticated,
    /// and only the queues the caller may read are shown.
    Trace,
}

/// The one mapping of HTTP endpoints to what they require.
pub fn route_action(route: &HttpRoute) -> Requirement {
    match route.endpoint {
        Endpoint::Health => Requirement::Open,
        Endpoint::Metrics | Endpoint::ListQueues => Requirement::Authenticated,
        Endpoint::Stats | Endpoint::Parked | Endpoint::RedriveStatus => {
            Requirement::OnQueue(Action::Read)
        }
        Endpoint::Produce => Requirement::OnQueue(Action::Produce),
        Endpoint::Receive | Endpoint::Ack | Endpoint::Nack | Endpoint::Extend => {
            Requirement::OnQueue(Action::Receive)
        }
        Endpoint::Pause
        | Endpoint::Resume
        | Endpoint::Skip
        | Endpoint::RedriveStart
        | Endpoint::RedriveControl(_) => Requirement::OnQueue(Action::Admin),
        Endpoint::Trace => Requirement::Trace,
    }
}

async fn authorize(
    State(access): State<Arc<Access>>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let matched = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str().to_owned());
    let route = HTTP_ROUTES
        .iter()
        .find(|r| Some(r.path) == matched.as_deref() && r.method == request.method().as_str());
    let Some(route) = route else {
        return next.run(request).await;
    };
    let (mut parts, body) = request.into_parts();
    let (queue, action) = match route_action(route) {
        Requirement::Open => return next.run(Request::from_parts(parts, body)).await,
        Requirement::Authenticated => (None, Action::Read),
        Requirement::OnQueue(action) => {
            match QueueName::from_request_parts(&mut parts, &()).await {
                Ok(QueueName(q)) => (Some(q), action),
                Err(e) => return e.into_response(),
            }
        }
        Requirement::Trace => (query_param(&parts.uri, "queue"), Action::Read),
    };
    let authorization = parts
        .headers
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    match access.check(authorization, queue.as_deref(), action) {
        Ok(principal) => {
            parts.extensions.insert(principal);
            next.run(Request::from_parts(parts, body)).await
        }
        Err(denied) => denied_response(&denied),
    }
}

/// 401 (with `WWW-Authenticate`) or 403, as a JSON error.
fn denied_response(denied: &Denied) -> Response {
    metrics::counter!("dispatcher_auth_denied_total", "reason" => match denied {
        Denied::Unauthenticated(_) => "unauthenticated",
        Denied::Forbidden(_) => "forbidden",
    })
    .increment(1);
    match denied {
        Denied::Unauthenticated(m) => {
            let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", m.clone())
                .into_response();
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static(WWW_AUTHENTICATE),
            );
            r
        }
        Denied::Forbidden(m) => {
            ApiError::new(StatusCode::FORBIDDEN, "permission_denied", m.clone()).into_response()
        }
    }
}

/// Whether the caller of this request may read `queue` (always, without `[auth]`).
fn may_read<S>(state: &ApiState<S>, caller: Option<&Principal>, queue: &str) -> bool {
    match (&state.access, caller) {
        (None, _) => true,
        (Some(access), Some(p)) => access.allows(p, queue, Action::Read),
        (Some(_), None) => false,
    }
}

fn method_router<S: QueueService>(route: &HttpRoute) -> MethodRouter<Arc<ApiState<S>>> {
    let filter = match route.method {
        "GET" => MethodFilter::GET,
        "POST" => MethodFilter::POST,
        other => panic!("HTTP_ROUTES names method {other}, which the router does not map"),
    };
    match route.endpoint {
        Endpoint::Health => on(filter, healthz),
        Endpoint::Metrics => on(filter, metrics::<S>),
        Endpoint::ListQueues => on(filter, list_queues::<S>),
        Endpoint::Stats => on(filter, stats::<S>),
        Endpoint::Produce => on(filter, produce::<S>),
        Endpoint::Receive => on(filter, receive::<S>),
        Endpoint::Ack => on(filter, ack::<S>),
        Endpoint::Nack => on(filter, nack::<S>),
        Endpoint::Extend => on(filter, extend::<S>),
        Endpoint::Pause => on(filter, pause::<S>),
        Endpoint::Resume => on(filter, resume::<S>),
        Endpoint::Parked => on(filter, parked::<S>),
        Endpoint::Skip => on(filter, skip::<S>),
        Endpoint::Trace => on(filter, trace_message::<S>),
        Endpoint::RedriveStart => on(filter, redrive_start::<S>),
        Endpoint::RedriveStatus => on(filter, redrive_status::<S>),
        Endpoint::RedriveControl(action) => {
            on(filter, move |state: AppState<S>, queue: QueueName| {
                redrive_control::<S>(state, queue, action)
            })
        }
    }
}

async fn healthz() -> Response {
    json(StatusCode::OK, &StatusResponse { status: "ok" })
}

async fn metrics<S: QueueService>(State(state): AppState<S>) -> Result<Response, ApiError> {
    let handle = state
        .metrics
        .as_ref()
        .ok_or_else(|| ApiError::not_found("metrics are not enabled on this dispatcher"))?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
        .into_response())
}

async fn list_queues<S: QueueService>(
    State(state): AppState<S>,
    caller: Option<axum::Extension<Principal>>,
) -> Response {
    let caller = caller.map(|axum::Extension(p)| p);
    let queues = state
        .service
        .queues()
        .into_iter()
        .filter(|q| may_read(&state, caller.as_ref(), &q.name))
        .map(QueueOut::from);
    json(
        StatusCode::OK,
        &QueuesResponse {
            queues: queues.collect(),
        },
    )
}

async fn stats<S: QueueService>(
    State(state): AppState<S>,
    QueueName(queue): QueueName,
) -> Result<Response, ApiError> {
    let stats = state.service.stats(&queue).await?;
    Ok(json(StatusCode::OK, &StatsResponse::new(queue, stats)))
}

async fn produce<S: QueueService>(
    State(state): AppState<S>,
    QueueName(queue): QueueName,
    JsonBody(body): JsonBody<ProduceBody>,
) -> Result<Response, ApiError> {
    let messages = body
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| MessageIn::into_new_message(m, i))
        .collect::<Result<Vec<_>, _>>()?;
    edge::check_produce(&messages)?;
    let results = state.service.produce(&queue, messages).await?;
    let results = results.into_iter().map(Into::into).collect();
    Ok(json(StatusCode::OK, &ProduceResponse { results }))
}

async fn receive<S: QueueService>(
    State(state): AppState<S>,
    QueueName(queue): QueueName,
    body: OptionalJsonBody<ReceiveBody>,
) -> Result<Response, ApiError> {
    let body = body.0.unwrap_or_default();
    let request = edge::receive_request(edge::ReceiveParams {
        max_messages: body.max_messages,
        wait_seconds: body.wait_seconds,
        lease_seconds: body.lease_seconds,
        consumer_id: body.consumer_id,
    })?;
    let deliveries = state.service.receive(&queue, request).await?;
    // Room for the whole answer up front: growing a buffer of a hundred
    // payloads by doubling copies it several times over.
    let capacity: usize = deliveries
        .iter()
        .map(|d| d.payload.len() + d.key.as_ref().map_or(0, bytes::Bytes::len) + 512)
        .sum();
    let messages = deliveries
        .into_iter()
        .map(|d| DeliveryOut::new(d, body.encoding))
        .collect();
    Ok(json_with_capacity(
        StatusCode::OK,
        &ReceiveResponse { messages },
        capacity,
    ))
}

async fn ack<S: QueueService>(
    State(state): AppState<S>,
    QueueName(queue): QueueName,
    JsonBody(body): JsonBody<AckBody>,
) -> Result<Response, ApiError> {
    edge::check_receipts(&body.receipts)?;
    let outcomes = state.service.ack(&queue, &body.receipts).await?;
    if outcomes.len() != body.receipts.len() {
        return Err(ApiError::internal(format!(
            "the service answered {} receipts with {} outcomes",
            body.receipts.len(),
            outcomes.len()
        )));
    }
    let results = body
        .receipts
        .into_iter()
        .zip(outcomes)
        .map(|(receipt, outcome)| AckResultOut {
            receipt,
            status: receipt_status(outcome),
        })
        .collect();
    Ok(json(StatusCode::OK, &AckResponse { results }))
}

async fn nack<S: QueueService>(
    State(state): AppState<S>,
    QueueName(queue): QueueName,
    JsonBody(body): JsonBody<NackBody>,
) -> Result<Response, ApiError> {
    let request = edge::nack_request(
        body.receipt,
        body.retry_after_seconds,
        body.error,
        body.permanent,
    );
    let outcome = state.service.nack(&queue, request).await?;
    let status = receipt_status(outcome);
    Ok(json(StatusCode::OK, &StatusResponse { status }))
}

async fn extend<S: QueueService>(
    State(state): AppState<S>,
    QueueName(queue): QueueName,
    JsonBody(body): JsonBody<ExtendBody>,
) -> Result<Response, ApiError> {
    let lease = edge::lease_duration("lease_seconds", body.lease_seconds)?;
    let result = state.service.extend(&queue, body.receipt, lease).await?;
    Ok(json(StatusCode::OK, &ExtendResponse::from(result)))
}

/// Ordered queues: the parked keys of the partitions this instance owns.
async fn parked<S: QueueService>(
    State(state): AppState<S>,
    QueueName(queue): QueueName,
) -> Result<Response, ApiError> {
    let parked = state.service.parked(&queue).await?;
    Ok(json(
        StatusCode::OK,
        &ParkedResponse {
            parked: parked.into_iter().map(Into::into).collect(),
        },
    ))
}

/// Ordered queues: releases a parked key without a redrive.
async fn skip<S: QueueService>(
    State(state): AppState<S>,
    QueueName(queue): QueueName,
    JsonBody(body): JsonBody<SkipBody>,
) -> Result<Response, ApiError> {
    let request = body.into_request()?;
    match state.service.skip(&queue, request).await? {
        SkipOutcome::Released => Ok(json(StatusCode::OK, &StatusResponse { status: "released" })),
        SkipOutcome::NotParked => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_parked",
            "that key is not parked in that partition".into(),
        )),
        SkipOutcome::OtherMessage => Err(ApiError::new(
            StatusCode::CONFLICT,
            "other_message",
            "the key is parked by another message (GET /queues/{q}/parked shows which)".into(),
        )),
        SkipOutcome::AlreadyReleased => Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_released",
            "the key is released already; its held messages are being delivered".into(),
        )),
        SkipOutcome::NotOwner => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            edge::SKIP_OWNER_UNREACHED.into(),
        )),
    }
}

/// Any body is ignored: the route is the whole request.
async fn pause<S: QueueService>(
    State(state): AppState<S>,
    QueueName(queue): QueueName,
) -> Result<Response, ApiError> {
    state.service.set_paused(&queue, true).await?;
    Ok(json(StatusCode::OK, &StatusResponse { status: "ok" }))
}

async fn resume<S: QueueService>(
    State(state): AppState<S>,
    QueueName(queue): QueueName,
) -> Result<Response, ApiError> {
    state.service.set_paused(&queue, false).await?;
    Ok(json(StatusCode::OK, &StatusResponse { status: "ok" }))
}

/// `GET /messages/{message_id}[?queue=q]`: the message's trace in every
/// queue that knows it (`crate::trace`).
async fn trace_message<S: QueueService>(
    State(state): AppState<S>,
    MessageIdParam(message_id): MessageIdParam,
    caller: Option<axum::Extension<Principal>>,
    uri: axum::http::Uri,
) -> Result<Response, ApiError> {
    let queue = query_param(&uri, "queue");
    let caller = caller.map(|axum::Extension(p)| p);
    let mut traces = state.service.trace(&message_id, queue.as_deref()).await?;
    traces.retain(|t| may_read(&state, caller.as_ref(), &t.queue));
    if traces.is_empty() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_message",
            edge::unknown_message(&message_id, queue.as_deref()),
        ));
    }
    Ok(json(
        StatusCode::OK,
        &crate::trace::TraceResponse { message_id, traces },
    ))
}

/// The `{message_id}` of `GET /messages/{message_id}`, percent-decoded.
struct MessageIdParam(String);

impl<St: Send + Sync> FromRequestParts<St> for MessageIdParam {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &St) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::invalid(format!("message id in the path: {e}")))?;
        Ok(MessageIdParam(id))
    }
}

/// The first value of `name` in the URI's query string, decoded.
fn query_param(uri: &axum::http::Uri, name: &str) -> Option<String> {
    let query = uri.query()?;
    let url = reqwest::Url::parse(&format!("http://q/?{query}")).ok()?;
    url.query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

// Redrive (issue 8): the job's JSON is `crate::redrive::RedriveJob`.

async fn redrive_start<S: QueueService>(
    State(state): AppState<S>,
    QueueName(queue): QueueName,
    JsonBody(body): JsonBody<RedriveRequest>,
) -> Result<Response, ApiError> {
    let job = state.service.redrive_start(&queue, body).await?;
    Ok(json(StatusCode::ACCEPTED, &job))
}

async fn redrive_status<S: QueueService>(
    State(state): AppState<S>,
    QueueName(queue): QueueName,
) -> Result<Response, ApiError> {
    let job = state.service.redrive_status(&queue).await?;
    Ok(json(StatusCode::OK, &job))
}

/// Any body is ignored: the route is the whole request.
async fn redrive_control<S: QueueService>(
    State(state): AppState<S>,
    QueueName(queue): QueueName,
    action: RedriveAction,
) -> Result<Response, ApiError> {
    let job = state.service.redrive_control(&queue, action).await?;
    Ok(json(StatusCode::OK, &job))
}

impl From<RedriveError> for ApiError {
    fn from(e: RedriveError) -> Self {
        let message = e.to_string();
        match e {
            RedriveError::Service(e) => e.into(),
            RedriveError::Conflict(_) => ApiError::new(StatusCode::CONFLICT, "conflict", message),
            RedriveError::NoJob(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "no_redrive_job", message)
            }
            RedriveError::NotOwner => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_owner", message)
            }
        }
    }
}

async fn no_route() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no_route", "no such route".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method".into(),
    )
}

fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    json_with_capacity(status, body, 128)
}

fn json_with_capacity<T: Serialize>(status: StatusCode, body: &T, capacity: usize) -> Response {
    let mut bytes = Vec::with_capacity(capacity);
    match serde_json::to_writer(&mut bytes, body) {
        Ok(()) => (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(e) => ApiError::internal(format!("encoding the response: {e}")).into_response(),
    }
}

/// A failed request, answered as `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: String) -> Self {
        ApiError {
            status,
            code,
            message,
        }
    }

    fn not_found(message: &str) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message.into())
    }

    fn invalid(message: String) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_argument", message)
    }

    fn too_large() -> Self {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the request body is over {HTTP_BODY_LIMIT_BYTES} bytes"),
        )
    }

    fn internal(message: String) -> Self {
        tracing::error!(%message, "HTTP API internal error");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        let message = e.to_string();
        match e {
            ServiceError::UnknownQueue(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "unknown_queue", message)
            }
            ServiceError::InvalidArgument(_) => ApiError::invalid(message),
            ServiceError::Unavailable(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: &self.message,
            },
        };
        let bytes = serde_json::to_vec(&body).expect("an error body always serializes");
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            bytes,
        )
            .into_response()
    }
}

/// The `{q}` of a queue route.
struct QueueName(String);

impl<St: Send + Sync> FromRequestParts<St> for QueueName {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &St) -> Result<Self, ApiError> {
        let Path(name) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::invalid(format!("queue name in the path: {e}")))?;
        Ok(QueueName(name))
    }
}

/// A JSON body, whatever its content type says (a `curl -d` without
/// `-H 'content-type: application/json'` works), read up to
/// [`HTTP_BODY_LIMIT_BYTES`] (413 above).
struct JsonBody<T>(T);

impl<T: DeserializeOwned, St: Send + Sync> FromRequest<St> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &St) -> Result<Self, ApiError> {
        let bytes = read_body(request, state).await?;
        parse(&bytes).map(JsonBody)
    }
}

/// Like [`JsonBody`], but an empty body means "all defaults".
struct OptionalJsonBody<T>(Option<T>);

impl<T: DeserializeOwned, St: Send + Sync> FromRequest<St> for OptionalJsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &St) -> Result<Self, ApiError> {
        let bytes = read_body(request, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJsonBody(None));
        }
        parse(&bytes).map(|body| OptionalJsonBody(Some(body)))
    }
}

/// Reads the body up to the limit. A declared `content-length` over it is
/// refused before anything is read; a chunked body when it passes it.
async fn read_body<St: Send + Sync>(request: Request, state: &St) -> Result<Bytes, ApiError> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > HTTP_BODY_LIMIT_BYTES as u64) {
        return Err(ApiError::too_large());
    }
    Bytes::from_request(request, state).await.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large()
        } else {
            ApiError::invalid(format!("reading the request body: {}", e.body_text()))
        }
    })
}

fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::invalid(format!(
            "the request body is not valid JSON for this route: {e}"
        ))
    })
}
