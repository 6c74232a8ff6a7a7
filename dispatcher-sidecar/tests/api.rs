//! The HTTP and gRPC APIs over real sockets (127.0.0.3, ephemeral ports),
//! in front of a test double of the queue service that records what it was
//! asked and answers by rule: queue `jobs` exists, `down` is unavailable,
//! `picky` rejects every request as invalid, any other is unknown; a
//! receipt's outcome is named by its prefix (`ok`, `stale`, `invalid`,
//! `notowner`).

use std::collections::{BTreeSet, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use dispatcher_sidecar::api::grpc::proto;
use dispatcher_sidecar::api::grpc::proto::dispatcher_client::DispatcherClient;
use dispatcher_sidecar::api::{self, Servers, HTTP_BODY_LIMIT_BYTES, HTTP_ROUTES};
use dispatcher_sidecar::config::{Config, QueueConfig};
use dispatcher_sidecar::redrive::{
    JobState, PartitionRange, RedriveAction, RedriveError, RedriveFilter, RedriveJob,
    RedriveRequest,
};
use dispatcher_sidecar::service::{
    Delivery, ExtendResult, NackRequest, NewMessage, PartitionStats, ProduceResult, ProduceStatus,
    QueueService, QueueStats, ReceiptOutcome, ReceiveRequest, ServiceError,
};
use dispatcher_sidecar::service::{ParkedKeyInfo, SkipOutcome, SkipRequest, StuckPartition};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::oneshot;

// ---------------------------------------------------------------------------
// The test double.

#[derive(Clone, Debug, PartialEq)]
enum Call {
    Produce(String, Vec<NewMessage>),
    Receive(String, ReceiveRequest),
    Ack(String, Vec<String>),
    Nack(String, NackRequest),
    Extend(String, String, Duration),
    Stats(String),
    SetPaused(String, bool),
    RecordPaused(String, bool),
    Parked(String),
    Skip(String, SkipRequest),
    RedriveStart(String, RedriveRequest),
    RedriveStatus(String),
    RedriveControl(String, RedriveAction),
}

#[derive(Default)]
struct Fake {
    calls: Mutex<Vec<Call>>,
    /// What the next receive on `jobs` returns.
    deliveries: Mutex<Vec<Delivery>>,
}

/// The instant the double reports as "now" in lease ends.
const NOW_MS: i64 = 1_796_282_040_123; // 2026-12-03T07:14:00.123Z

impl Fake {
    fn record(&self, call: Call) {
        self.calls.lock().unwrap().push(call);
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn check(&self, queue: &str) -> Result<(), ServiceError> {
        match queue {
            "jobs" => Ok(()),
            "down" => Err(ServiceError::Unavailable("the broker is down".into())),
            "picky" => Err(ServiceError::InvalidArgument("picky says no".into())),
            other => Err(ServiceError::UnknownQueue(other.into())),
        }
    }

    fn set_deliveries(&self, deliveries: Vec<Delivery>) {
        *self.deliveries.lock().unwrap() = deliveries;
    }
}

fn outcome(receipt: &str) -> ReceiptOutcome {
    if receipt.starts_with("ok") {
        ReceiptOutcome::Ok
    } else if receipt.starts_with("stale") {
        ReceiptOutcome::Stale
    } else if receipt.starts_with("notowner") {
        ReceiptOutcome::NotOwner
    } else {
        ReceiptOutcome::Invalid
    }
}

fn jobs_config() -> QueueConfig {
    let text = "[[queue]]\nname = \"jobs\"\ntopic = \"jobs-topic\"\n\
                [queue.push]\nurl = \"http://user:secret@push.internal:9000/jobs\"\n";
    Config::parse(text, "test.toml", Path::new("."))
        .expect("the test config parses")
        .queues
        .remove(0)
}

impl QueueService for Fake {
    fn queues(&self) -> Vec<QueueConfig> {
        vec![jobs_config()]
    }

    async fn produce(
        &self,
        queue: &str,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<ProduceResult>, ServiceError> {
        self.record(Call::Produce(queue.into(), messages.clone()));
        self.check(queue)?;
        Ok(messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let message_id = m.message_id.clone().unwrap_or(format!("gen-{i}"));
                let status = if message_id.starts_with("dup") {
                    ProduceStatus::Duplicate
                } else {
                    ProduceStatus::Accepted
                };
                ProduceResult {
                    message_id,
                    status,
                    partition: i as i32 % 3,
                    offset: 100 + i as i64,
                }
            })
            .collect())
    }

    async fn receive(
        &self,
        queue: &str,
        request: ReceiveRequest,
    ) -> Result<Vec<Delivery>, ServiceError> {
        self.record(Call::Receive(queue.into(), request));
        self.check(queue)?;
        Ok(self.deliveries.lock().unwrap().clone())
    }

    async fn ack(
        &self,
        queue: &str,
        receipts: &[String],
    ) -> Result<Vec<ReceiptOutcome>, ServiceError> {
        self.record(Call::Ack(queue.into(), receipts.to_vec()));
        self.check(queue)?;
        Ok(receipts.iter().map(|r| outcome(r)).collect())
    }

    async fn nack(
        &self,
        queue: &str,
        request: NackRequest,
    ) -> Result<ReceiptOutcome, ServiceError> {
        let result = outcome(&request.receipt);
        self.record(Call::Nack(queue.into(), request));
        self.check(queue)?;
        Ok(result)
    }

    async fn extend(
        &self,
        queue: &str,
        receipt: String,
        lease: Duration,
    ) -> Result<ExtendResult, ServiceError> {
        let result = outcome(&receipt);
        self.record(Call::Extend(queue.into(), receipt, lease));
        self.check(queue)?;
        Ok(ExtendResult {
            outcome: result,
            lease_expires_at_ms: (result == ReceiptOutcome::Ok)
                .then(|| NOW_MS + lease.as_millis() as i64),
        })
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats, ServiceError> {
        self.record(Call::Stats(queue.into()));
        self.check(queue)?;
        Ok(QueueStats {
            depth: 42,
            in_flight: 3,
            oldest_unacked_age_ms: 1500,
            retry_depth: 7,
            dlq_depth: 2,
            dlq_oldest_age_ms: 60_000,
            paused: true,
            partitions: vec![
                PartitionStats {
                    partition: 0,
                    depth: 40,
                    in_flight: 2,
                    oldest_unacked_age_ms: 1500,
                },
                PartitionStats {
                    partition: 1,
                    depth: 2,
                    in_flight: 1,
                    oldest_unacked_age_ms: 10,
                },
            ],
            stuck_partitions: vec![StuckPartition {
                topic: "jobs.retry.1m".into(),
                partition: 1,
                offset: 17,
                error: "Message consumption error: BadCompression".into(),
                since_ms: 1_000,
                errors: 4,
            }],
            foreign_secret_members: 1,
        })
    }

    async fn record_paused(&self, queue: &str, paused: bool) -> Result<(), ServiceError> {
        self.record(Call::RecordPaused(queue.into(), paused));
        self.check(queue)
    }

    async fn set_paused(&self, queue: &str, paused: bool) -> Result<(), ServiceError> {
        self.record(Call::SetPaused(queue.into(), paused));
        self.check(queue)
    }

    async fn parked(&self, queue: &str) -> Result<Vec<ParkedKeyInfo>, ServiceError> {
        self.record(Call::Parked(queue.into()));
        self.check(queue)?;
        Ok(vec![
            ParkedKeyInfo {
                partition: 1,
                key: b"K".to_vec(),
                message_id: "m-1".into(),
                parked_at_ms: 0,
                held: 3,
                released_by: None,
            },
            ParkedKeyInfo {
                partition: 0,
                key: vec![0xff, 0x00],
                message_id: "m-2".into(),
                parked_at_ms: 1_000,
                held: 0,
                released_by: Some("skip".into()),
            },
        ])
    }

    async fn skip(&self, queue: &str, request: SkipRequest) -> Result<SkipOutcome, ServiceError> {
        self.record(Call::Skip(queue.into(), request.clone()));
        self.check(queue)?;
        Ok(
            match (request.key.as_slice(), request.message_id.as_str()) {
                (b"K", "m-1") => SkipOutcome::Released,
                (b"K", _) => SkipOutcome::OtherMessage,
                (b"R", _) => SkipOutcome::AlreadyReleased,
                (b"O", _) => SkipOutcome::NotOwner,
                _ => SkipOutcome::NotParked,
            },
        )
    }

    /// The fake knows one message, `traced` (in `jobs`): every other valid
    /// id is unknown.
    async fn trace(
        &self,
        message_id: &str,
        queue: Option<&str>,
    ) -> Result<Vec<dispatcher_sidecar::trace::MessageTrace>, ServiceError> {
        dispatcher_sidecar::trace::validate_message_id(message_id)
            .map_err(ServiceError::InvalidArgument)?;
        if let Some(q) = queue {
            self.check(q)?;
        }
        if message_id != "traced" || queue.is_some_and(|q| q != "jobs") {
            return Ok(Vec::new());
        }
        Ok(vec![traced_message()])
    }

    async fn redrive_start(
        &self,
        queue: &str,
        request: RedriveRequest,
    ) -> Result<RedriveJob, RedriveError> {
        self.record(Call::RedriveStart(queue.into(), request));
        self.check(queue)?;
        Ok(redrive_job())
    }

    async fn redrive_status(&self, queue: &str) -> Result<RedriveJob, RedriveError> {
        self.record(Call::RedriveStatus(queue.into()));
        self.check(queue)?;
        Ok(redrive_job())
    }

    /// Pause answers the job; resume a conflict; cancel "no job".
    async fn redrive_control(
        &self,
        queue: &str,
        action: RedriveAction,
    ) -> Result<RedriveJob, RedriveError> {
        self.record(Call::RedriveControl(queue.into(), action));
        self.check(queue)?;
        match action {
            RedriveAction::Pause => Ok(redrive_job()),
            RedriveAction::Resume => Err(RedriveError::Conflict("nothing to resume".into())),
            RedriveAction::Cancel => Err(RedriveError::NoJob("no job".into())),
        }
    }
}

/// The double's redrive job: every field set.
fn redrive_job() -> RedriveJob {
    RedriveJob {
        id: "job-1".into(),
        queue: "jobs".into(),
        state: JobState::Failed,
        reason: Some("lost partition 0".into()),
        filter: Some(RedriveFilter {
            message_id: Some("m".into()),
            key: Some("k".into()),
            error_contains: Some("503".into()),
            from: Some("2026-12-03T07:14:00.123Z".into()),
            to: Some("2026-12-04T07:14:00.123Z".into()),
        }),
        rate_per_sec: 2.5,
        max_messages: Some(10),
        scanned: 5,
        matched: 4,
        redriven: 3,
        skipped: 1,
        unreadable: 0,
        remaining: 7,
        started_at: "2026-12-03T07:14:00.123Z".into(),
        finished_at: Some("2026-12-03T07:15:00.123Z".into()),
        first_redriven_at: Some("2026-12-03T07:14:01.123Z".into()),
        last_redriven_at: Some("2026-12-03T07:14:02.123Z".into()),
        partitions: vec![PartitionRange {
            partition: 0,
            start: 2,
            end: 14,
            position: 7,
        }],
    }
}

fn delivery(receipt: &str, key: Option<&[u8]>, payload: &[u8], header: &[u8]) -> Delivery {
    Delivery {
        message_id: format!("id-{receipt}"),
        receipt: receipt.into(),
        key: key.map(bytes::Bytes::copy_from_slice),
        payload: bytes::Bytes::copy_from_slice(payload),
        headers: vec![("trace".into(), header.to_vec())],
        attempt: 2,
        enqueued_at_ms: 951_782_400_000, // 2000-02-29T00:00:00.000Z
        partition: 1,
        offset: 77,
        lease_expires_at_ms: NOW_MS,
    }
}

// ---------------------------------------------------------------------------
// Harness.

struct Harness {
    fake: Arc<Fake>,
    servers: Option<Servers>,
    http: SocketAddr,
    grpc: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    client: reqwest::Client,
}

const LOCAL: &str = "127.0.0.3:0";

async fn start_with(metrics: Option<metrics_exporter_prometheus::PrometheusHandle>) -> Harness {
    let fake = Arc::new(Fake::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let servers = api::serve_bound(
        fake.clone(),
        LOCAL.parse().unwrap(),
        LOCAL.parse().unwrap(),
        metrics,
        async move {
            let _ = stopped.await;
        },
    )
    .await
    .expect("the API servers start");
    Harness {
        fake,
        http: servers.http,
        grpc: servers.grpc,
        servers: Some(servers),
        stop: Some(stop),
        client: reqwest::Client::new(),
    }
}

async fn start() -> Harness {
    start_with(None).await
}

impl Harness {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self.client.get(self.url(path)).send().await.unwrap();
        decode(response).await
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let response = self
            .client
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        decode(response).await
    }

    async fn post_raw(&self, path: &str, body: &'static str) -> (StatusCode, Value) {
        let response = self
            .client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        decode(response).await
    }

    async fn grpc(&self) -> DispatcherClient<tonic::transport::Channel> {
        DispatcherClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("the gRPC client connects")
    }

    async fn shutdown(mut self) {
        self.stop.take().unwrap().send(()).unwrap();
        self.servers.take().unwrap().wait().await.unwrap();
    }
}

async fn decode(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string());
    let text = response.text().await.unwrap();
    assert_eq!(
        content_type.as_deref(),
        Some("application/json"),
        "{status}: {text}"
    );
    (status, serde_json::from_str(&text).unwrap())
}

fn assert_error(response: (StatusCode, Value), status: StatusCode, code: &str) {
    assert_eq!(response.0, status, "{}", response.1);
    assert_eq!(response.1["error"]["code"], code, "{}", response.1);
    assert!(
        response.1["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{}",
        response.1
    );
}

// ---------------------------------------------------------------------------
// HTTP: happy paths.

#[tokio::test]
async fn healthz_answers_ok() {
    let h = start().await;
    assert_eq!(
        h.get("/healthz").await,
        (StatusCode::OK, json!({"status": "ok"}))
    );
    h.shutdown().await;
}

#[tokio::test]
async fn list_queues_shows_each_queue_with_its_settings() {
    let h = start().await;
    let (status, body) = h.get("/queues").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"queues": [{
            "name": "jobs",
            "topic": "jobs-topic",
            "group": jobs_config().group,
            "lease": "1m",
            "max_lease": "1h",
            "retry_tiers": ["10s", "1m", "10m", "1h"],
            "retry_topics": ["jobs-topic.retry.10s", "jobs-topic.retry.1m",
                             "jobs-topic.retry.10m", "jobs-topic.retry.1h"],
            "max_attempts": 5,
            "dlq_topic": "jobs-topic.dlq",
            "ack_log_topic": jobs_config().ack_log_topic,
            "dedupe_topic": jobs_config().dedupe_topic,
            "ordered": false,
            "dedupe_window": "5m",
            "gap_cap": 100000,
            "weight": 1,
            "push": {
                "url": "http://push.internal:9000/jobs", "concurrency": 16, "timeout": "30s",
                "breaker_failures": 5, "breaker_cooldown": "5s", "breaker_cooldown_max": "1m",
            },
        }]})
    );
    h.shutdown().await;
}

#[tokio::test]
async fn stats_route_returns_the_queue_figures() {
    let h = start().await;
    let (status, body) = h.get("/queues/jobs").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({
            "queue": "jobs", "depth": 42, "in_flight": 3, "oldest_unacked_age_ms": 1500,
            "retry_depth": 7, "dlq_depth": 2, "dlq_oldest_age_ms": 60000, "paused": true,
            "partitions": [
                {"partition": 0, "depth": 40, "in_flight": 2, "oldest_unacked_age_ms": 1500},
                {"partition": 1, "depth": 2, "in_flight": 1, "oldest_unacked_age_ms": 10},
            ],
            "stuck_partitions": [
                {"topic": "jobs.retry.1m", "partition": 1, "offset": 17,
                 "error": "Message consumption error: BadCompression",
                 "since": "1970-01-01T00:00:01.000Z", "errors": 4},
            ],
            "foreign_secret_members": 1,
            "warnings": [
                "1 instance(s) of this queue's group sign receipts with another receipt_secret: \
                 acks and nacks between them and this one are refused and their messages are \
                 delivered again when their leases run out; give every instance the same \
                 receipt_secret",
            ],
        })
    );
    assert_eq!(h.fake.calls(), [Call::Stats("jobs".into())]);
    h.shutdown().await;
}

#[tokio::test]
async fn parked_keys_list_utf8_or_base64_keys_and_skip_maps_refusals_to_404_409_and_503() {
    let h = start().await;
    assert_eq!(
        h.get("/queues/jobs/parked").await,
        (
            StatusCode::OK,
            json!({"parked": [
                {"partition": 1, "key": "K", "message_id": "m-1",
                 "parked_at": "1970-01-01T00:00:00.000Z", "held": 3},
                {"partition": 0, "key_base64": "/wA=", "message_id": "m-2",
                 "parked_at": "1970-01-01T00:00:01.000Z", "held": 0, "released_by": "skip"},
            ]})
        )
    );
    let skip = |body: Value| h.post("/queues/jobs/skip", body);
    assert_eq!(
        skip(json!({"partition": 1, "key": "K", "message_id": "m-1"})).await,
        (StatusCode::OK, json!({"status": "released"}))
    );
    assert_eq!(
        skip(json!({"partition": 1, "key_base64": "Sw==", "message_id": "m-1"})).await,
        (StatusCode::OK, json!({"status": "released"})),
        "key_base64 names the same key"
    );
    assert_error(
        skip(json!({"partition": 1, "key": "K", "message_id": "m-9"})).await,
        StatusCode::CONFLICT,
        "other_message",
    );
    assert_error(
        skip(json!({"partition": 1, "key": "R", "message_id": "m-1"})).await,
        StatusCode::CONFLICT,
        "already_released",
    );
    assert_error(
        skip(json!({"partition": 1, "key": "X", "message_id": "m-1"})).await,
        StatusCode::NOT_FOUND,
        "not_parked",
    );
    assert_error(
        skip(json!({"partition": 1, "key": "O", "message_id": "m-1"})).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
    );
    for bad in [
        json!({"partition": 1, "message_id": "m-1"}),
        json!({"partition": 1, "key": "K", "key_base64": "Sw==", "message_id": "m-1"}),
        json!({"partition": 1, "key_base64": "%%", "message_id": "m-1"}),
        json!({"partition": 1, "key": "K", "message_id": ""}),
    ] {
        assert_error(
            skip(bad.clone()).await,
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        );
    }
}

/// The public API (the forwarding layer) records a pause or resume before
/// it applies it, and applies nothing when it could not be recorded.
#[tokio::test]
async fn a_pause_is_recorded_before_it_applies_and_not_applied_unrecorded() {
    let fake = Arc::new(Fake::default());
    // No queue of the config is `jobs` or `down`: nothing is broadcast.
    let config = Config::parse(
        "bootstrap_servers = \"127.0.0.3:1\"\n[[queue]]\nname = \"other\"\ntopic = \"other\"\n",
        "test.toml",
        Path::new("."),
    )
    .unwrap();
    let forwarding =
        dispatcher_sidecar::forward::Forwarding::new(fake.clone(), &config, "127.0.0.3:1".into())
            .unwrap();
    forwarding.set_paused("jobs", true).await.unwrap();
    forwarding.set_paused("jobs", false).await.unwrap();
    let refused = forwarding.set_paused("down", true).await.unwrap_err();
    assert!(
        matches!(refused, ServiceError::Unavailable(_)),
        "{refused:?}"
    );
    assert_eq!(
        fake.calls(),
        [
            Call::RecordPaused("jobs".into(), true),
            Call::SetPaused("jobs".into(), true),
            Call::RecordPaused("jobs".into(), false),
            Call::SetPaused("jobs".into(), false),
            Call::RecordPaused("down".into(), true),
        ]
    );
}

#[tokio::test]
async fn pause_and_resume_routes_reach_the_service() {
    let h = start().await;
    assert_eq!(
        h.post_raw("/queues/jobs/pause", "").await,
        (StatusCode::OK, json!({"status": "ok"}))
    );
    assert_eq!(
        h.post("/queues/jobs/resume", json!({})).await,
        (StatusCode::OK, json!({"status": "ok"}))
    );
    assert_error(
        h.post_raw("/queues/nope/pause", "").await,
        StatusCode::NOT_FOUND,
        "unknown_queue",
    );
    assert_eq!(
        h.fake.calls(),
        [
            Call::SetPaused("jobs".into(), true),
            Call::SetPaused("jobs".into(), false),
            Call::SetPaused("nope".into(), true),
        ]
    );
    let mut client = h.grpc().await;
    client
        .pause(proto::PauseRequest {
            queue: "jobs".into(),
        })
        .await
        .unwrap();
    client
        .resume(proto::ResumeRequest {
            queue: "jobs".into(),
        })
        .await
        .unwrap();
    let unknown = client
        .pause(proto::PauseRequest {
            queue: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    assert_eq!(
        h.fake.calls()[3..],
        [
            Call::SetPaused("jobs".into(), true),
            Call::SetPaused("jobs".into(), false),
            Call::SetPaused("nope".into(), true),
        ]
    );
    h.shutdown().await;
}

#[tokio::test]
async fn produce_passes_messages_through_and_reports_each_result() {
    let h = start().await;
    let (status, body) = h
        .post(
            "/queues/jobs/messages",
            json!({"messages": [
                {"message_id": "m-1", "key": "user-7", "payload": "hello",
                 "headers": [{"name": "trace", "value": "abc"}, {"name": "trace", "value": "def"}],
                 "delay_seconds": 30},
                {"payload": "no id"},
                {"message_id": "dup-3", "payload": ""},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"results": [
            {"message_id": "m-1", "status": "accepted", "partition": 0, "offset": 100},
            {"message_id": "gen-1", "status": "accepted", "partition": 1, "offset": 101},
            {"message_id": "dup-3", "status": "duplicate", "partition": 2, "offset": 102},
        ]})
    );
    let expected = vec![
        NewMessage {
            message_id: Some("m-1".into()),
            key: Some(b"user-7".to_vec()),
            payload: b"hello".to_vec(),
            headers: vec![
                ("trace".into(), b"abc".to_vec()),
                ("trace".into(), b"def".to_vec()),
            ],
            delay: Some(Duration::from_secs(30)),
        },
        NewMessage {
            message_id: None,
            key: None,
            payload: b"no id".to_vec(),
            headers: vec![],
            delay: None,
        },
        NewMessage {
            message_id: Some("dup-3".into()),
            key: None,
            payload: vec![],
            headers: vec![],
            delay: None,
        },
    ];
    assert_eq!(h.fake.calls(), [Call::Produce("jobs".into(), expected)]);
    h.shutdown().await;
}

#[tokio::test]
async fn binary_payloads_round_trip_through_base64() {
    let h = start().await;
    let payload: Vec<u8> = (0..=255).collect();
    let key = [0xff_u8, 0x00, 0xfe];
    let header = [0xc3_u8, 0x28]; // an invalid UTF-8 sequence
    let (status, body) = h
        .post(
            "/queues/jobs/messages",
            json!({"messages": [{
                "encoding": "base64",
                "key": BASE64.encode(key),
                "payload": BASE64.encode(&payload),
                "headers": [{"name": "bin", "value": BASE64.encode(header)}],
            }]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let Call::Produce(_, produced) = &h.fake.calls()[0] else {
        panic!("expected a produce")
    };
    assert_eq!(produced[0].payload, payload);
    assert_eq!(produced[0].key.as_deref(), Some(&key[..]));
    assert_eq!(produced[0].headers, [("bin".to_string(), header.to_vec())]);

    // The same bytes delivered come back as base64, and decode to them.
    let m = &produced[0];
    h.fake.set_deliveries(vec![delivery(
        "ok-1",
        m.key.as_deref(),
        &m.payload,
        &m.headers[0].1,
    )]);
    let (status, body) = h.post("/queues/jobs/receive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let delivered = &body["messages"][0];
    assert_eq!(delivered["encoding"], "base64");
    let bytes = |v: &Value| BASE64.decode(v.as_str().unwrap()).unwrap();
    assert_eq!(bytes(&delivered["payload"]), payload);
    assert_eq!(bytes(&delivered["key"]), key);
    assert_eq!(bytes(&delivered["headers"][0]["value"]), header);
    h.shutdown().await;
}

#[tokio::test]
async fn invalid_base64_is_400_naming_the_field() {
    let h = start().await;
    let response = h
        .post(
            "/queues/jobs/messages",
            json!({"messages": [{"payload": "ok"}, {"encoding": "base64", "payload": "!!"}]}),
        )
        .await;
    assert!(response.1["error"]["message"]
        .as_str()
        .unwrap()
        .contains("messages[1].payload"));
    assert_error(response, StatusCode::BAD_REQUEST, "invalid_argument");
    assert_eq!(h.fake.calls(), []);
    h.shutdown().await;
}

#[tokio::test]
async fn receive_delivers_utf8_messages_with_rfc3339_times() {
    let h = start().await;
    h.fake.set_deliveries(vec![
        delivery("ok-1", Some(b"k"), b"hello", b"abc"),
        delivery("ok-2", None, b"bye", b"def"),
    ]);
    let (status, body) = h
        .post(
            "/queues/jobs/receive",
            json!({"max_messages": 5, "wait_seconds": 20, "lease_seconds": 90, "consumer_id": "w-1"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["messages"][0],
        json!({
            "message_id": "id-ok-1", "receipt": "ok-1", "key": "k", "payload": "hello",
            "headers": [{"name": "trace", "value": "abc"}], "encoding": "utf8",
            "attempt": 2, "enqueued_at": "2000-02-29T00:00:00.000Z", "partition": 1,
            "offset": 77, "lease_expires_at": "2026-12-03T07:14:00.123Z",
        })
    );
    assert_eq!(body["messages"][1]["key"], Value::Null);
    assert_eq!(
        h.fake.calls(),
        [Call::Receive(
            "jobs".into(),
            ReceiveRequest {
                max_messages: 5,
                wait: Duration::from_secs(20),
                lease: Some(Duration::from_secs(90)),
                consumer: Some("w-1".into()),
            }
        )]
    );
    h.shutdown().await;
}

#[tokio::test]
async fn receive_with_an_empty_body_uses_the_defaults() {
    let h = start().await;
    let response = h
        .client
        .post(h.url("/queues/jobs/receive"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        decode(response).await,
        (StatusCode::OK, json!({"messages": []}))
    );
    assert_eq!(
        h.fake.calls(),
        [Call::Receive(
            "jobs".into(),
            ReceiveRequest {
                max_messages: api::DEFAULT_RECEIVE_MESSAGES,
                wait: Duration::ZERO,
                lease: None,
                consumer: None,
            }
        )]
    );
    h.shutdown().await;
}

#[tokio::test]
async fn receive_can_ask_for_base64_throughout() {
    let h = start().await;
    h.fake
        .set_deliveries(vec![delivery("ok-1", Some(b"k"), b"hello", b"abc")]);
    let (_, body) = h
        .post("/queues/jobs/receive", json!({"encoding": "base64"}))
        .await;
    let m = &body["messages"][0];
    assert_eq!(m["encoding"], "base64");
    assert_eq!(m["payload"], BASE64.encode("hello"));
    assert_eq!(m["key"], BASE64.encode("k"));
    assert_eq!(m["headers"][0]["value"], BASE64.encode("abc"));
    h.shutdown().await;
}

#[tokio::test]
async fn ack_maps_every_receipt_outcome_in_order() {
    let h = start().await;
    let receipts = ["ok-1", "stale-2", "invalid-3", "notowner-4"];
    let (status, body) = h
        .post("/queues/jobs/ack", json!({"receipts": receipts}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"results": [
            {"receipt": "ok-1", "status": "ok"},
            {"receipt": "stale-2", "status": "stale"},
            {"receipt": "invalid-3", "status": "invalid"},
            {"receipt": "notowner-4", "status": "not_owner"},
        ]})
    );
    let receipts = receipts.map(String::from).to_vec();
    assert_eq!(h.fake.calls(), [Call::Ack("jobs".into(), receipts)]);
    h.shutdown().await;
}

#[tokio::test]
async fn nack_passes_its_options_and_reports_the_outcome() {
    let h = start().await;
    let (status, body) = h
        .post(
            "/queues/jobs/nack",
            json!({"receipt": "ok-1", "retry_after_seconds": 10, "error": "boom", "permanent": true}),
        )
        .await;
    assert_eq!((status, body), (StatusCode::OK, json!({"status": "ok"})));
    let (_, body) = h
        .post("/queues/jobs/nack", json!({"receipt": "stale-2"}))
        .await;
    assert_eq!(body, json!({"status": "stale"}));
    let long_error = "x".repeat(api::MAX_NACK_ERROR_BYTES + 10);
    let (_, body) = h
        .post(
            "/queues/jobs/nack",
            json!({"receipt": "notowner-3", "error": long_error}),
        )
        .await;
    assert_eq!(body, json!({"status": "not_owner"}));
    assert_eq!(
        h.fake.calls(),
        [
            Call::Nack(
                "jobs".into(),
                NackRequest {
                    receipt: "ok-1".into(),
                    retry_after: Some(Duration::from_secs(10)),
                    error: Some("boom".into()),
                    permanent: true,
                }
            ),
            Call::Nack(
                "jobs".into(),
                NackRequest {
                    receipt: "stale-2".into(),
                    retry_after: None,
                    error: None,
                    permanent: false,
                }
            ),
            Call::Nack(
                "jobs".into(),
                NackRequest {
                    receipt: "notowner-3".into(),
                    retry_after: None,
                    error: Some("x".repeat(api::MAX_NACK_ERROR_BYTES)),
                    permanent: false,
                }
            ),
        ]
    );
    h.shutdown().await;
}

#[tokio::test]
async fn extend_reports_the_new_lease_end_only_when_ok() {
    let h = start().await;
    let (status, body) = h
        .post(
            "/queues/jobs/extend",
            json!({"receipt": "ok-1", "lease_seconds": 60}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"status": "ok", "lease_expires_at": "2026-12-03T07:15:00.123Z"})
    );
    let (_, body) = h
        .post(
            "/queues/jobs/extend",
            json!({"receipt": "invalid", "lease_seconds": 60}),
        )
        .await;
    assert_eq!(body, json!({"status": "invalid"}));
    assert_eq!(
        h.fake.calls()[0],
        Call::Extend("jobs".into(), "ok-1".into(), Duration::from_secs(60))
    );
    h.shutdown().await;
}

// ---------------------------------------------------------------------------
// HTTP: errors.

/// A request to each queue route, with a body the route accepts.
fn queue_requests(queue: &str) -> Vec<(&'static str, String, Value)> {
    vec![
        ("GET", format!("/queues/{queue}"), Value::Null),
        (
            "POST",
            format!("/queues/{queue}/messages"),
            json!({"messages": [{"payload": "p"}]}),
        ),
        ("POST", format!("/queues/{queue}/receive"), json!({})),
        (
            "POST",
            format!("/queues/{queue}/ack"),
            json!({"receipts": ["ok"]}),
        ),
        (
            "POST",
            format!("/queues/{queue}/nack"),
            json!({"receipt": "ok"}),
        ),
        (
            "POST",
            format!("/queues/{queue}/extend"),
            json!({"receipt": "ok", "lease_seconds": 1}),
        ),
        ("POST", format!("/queues/{queue}/pause"), Value::Null),
        ("POST", format!("/queues/{queue}/resume"), Value::Null),
        ("GET", format!("/queues/{queue}/parked"), Value::Null),
        (
            "POST",
            format!("/queues/{queue}/skip"),
            json!({"partition": 1, "key": "K", "message_id": "m-1"}),
        ),
        (
            "POST",
            format!("/queues/{queue}/redrive"),
            json!({"rate_per_sec": 1}),
        ),
        ("GET", format!("/queues/{queue}/redrive"), Value::Null),
        (
            "POST",
            format!("/queues/{queue}/redrive/pause"),
            Value::Null,
        ),
        (
            "POST",
            format!("/queues/{queue}/redrive/resume"),
            Value::Null,
        ),
        (
            "POST",
            format!("/queues/{queue}/redrive/cancel"),
            Value::Null,
        ),
    ]
}

async fn send(h: &Harness, method: &str, path: &str, body: &Value) -> (StatusCode, Value) {
    match method {
        "GET" => h.get(path).await,
        _ => h.post(path, body.clone()).await,
    }
}

#[tokio::test]
async fn service_errors_map_to_404_400_and_503_on_every_queue_route() {
    let h = start().await;
    for (queue, status, code) in [
        ("nope", StatusCode::NOT_FOUND, "unknown_queue"),
        ("picky", StatusCode::BAD_REQUEST, "invalid_argument"),
        ("down", StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    ] {
        let requests = queue_requests(queue);
        for (method, path, body) in &requests {
            let response = send(&h, method, path, body).await;
            assert_error(response, status, code);
        }
        assert_eq!(
            h.fake.calls().len(),
            requests.len(),
            "every call reached the service"
        );
        h.fake.calls.lock().unwrap().clear();
    }
    h.shutdown().await;
}

#[tokio::test]
async fn redrive_routes_reach_the_service_and_map_its_answers() {
    let h = start().await;
    let (status, body) = h
        .post(
            "/queues/jobs/redrive",
            json!({"rate_per_sec": 2.5, "filter": {"key": "k"}, "max_messages": 3}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["id"], "job-1");
    assert_eq!(body["state"], "failed");
    assert_eq!(body["partitions"][0]["end"], 14);
    let (status, body) = h.get("/queues/jobs/redrive").await;
    assert_eq!((status, &body["redriven"]), (StatusCode::OK, &json!(3)));
    let (status, _) = h.post("/queues/jobs/redrive/pause", Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    assert_error(
        h.post("/queues/jobs/redrive/resume", Value::Null).await,
        StatusCode::CONFLICT,
        "conflict",
    );
    assert_error(
        h.post("/queues/jobs/redrive/cancel", Value::Null).await,
        StatusCode::NOT_FOUND,
        "no_redrive_job",
    );
    // Unknown fields, at the top and in the filter, and a missing rate
    // never reach the service.
    for bad in [
        json!({"rate_per_sec": 1, "speed": 2}),
        json!({"rate_per_sec": 1, "filter": {"color": "red"}}),
        json!({"filter": {}}),
        json!({"rate_per_sec": "fast"}),
    ] {
        assert_error(
            h.post("/queues/jobs/redrive", bad).await,
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        );
    }
    assert_eq!(
        h.fake.calls(),
        vec![
            Call::RedriveStart(
                "jobs".into(),
                RedriveRequest {
                    rate_per_sec: 2.5,
                    filter: Some(RedriveFilter {
                        key: Some("k".into()),
                        ..RedriveFilter::default()
                    }),
                    max_messages: Some(3),
                }
            ),
            Call::RedriveStatus("jobs".into()),
            Call::RedriveControl("jobs".into(), RedriveAction::Pause),
            Call::RedriveControl("jobs".into(), RedriveAction::Resume),
            Call::RedriveControl("jobs".into(), RedriveAction::Cancel),
        ]
    );
    h.shutdown().await;
}

#[tokio::test]
async fn malformed_json_is_400_in_the_error_shape() {
    let h = start().await;
    for (path, body) in [
        ("/queues/jobs/messages", "{not json"),
        ("/queues/jobs/messages", r#"{"messages": [{"key": "k"}]}"#), // no payload
        (
            "/queues/jobs/messages",
            r#"{"messages": [{"payload": "p", "payload_b64": "x"}]}"#,
        ),
        (
            "/queues/jobs/messages",
            r#"{"messages": [{"payload": "p", "encoding": "hex"}]}"#,
        ),
        ("/queues/jobs/receive", r#"{"max_messages": -1}"#),
        ("/queues/jobs/receive", r#"{"wait_seconds": 1.5}"#),
        ("/queues/jobs/ack", r#"{"receipts": "ok"}"#),
        ("/queues/jobs/ack", ""),
        ("/queues/jobs/nack", r#"{"receipt": 7}"#),
        ("/queues/jobs/extend", r#"{"receipt": "ok"}"#),
    ] {
        assert_error(
            h.post_raw(path, body).await,
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        );
    }
    assert_eq!(h.fake.calls(), [], "nothing malformed reached the service");
    h.shutdown().await;
}

#[tokio::test]
async fn over_limit_requests_are_400_and_never_reach_the_service() {
    let h = start().await;
    let messages = |n: usize| json!({"messages": vec![json!({"payload": "p"}); n]});
    let big = "x".repeat(dispatcher_sidecar::service::MAX_PRODUCE_BYTES / 2 + 1);
    let cases = [
        ("/queues/jobs/messages", messages(501)),
        ("/queues/jobs/messages", messages(0)),
        (
            "/queues/jobs/messages",
            json!({"messages": [{"payload": big}, {"payload": big}]}),
        ),
        (
            "/queues/jobs/messages",
            json!({"messages": [{"message_id": "", "payload": "p"}]}),
        ),
        ("/queues/jobs/receive", json!({"max_messages": 101})),
        ("/queues/jobs/receive", json!({"max_messages": 0})),
        ("/queues/jobs/receive", json!({"wait_seconds": 21})),
        ("/queues/jobs/receive", json!({"lease_seconds": 0})),
        (
            "/queues/jobs/receive",
            json!({"consumer_id": "c".repeat(129)}),
        ),
        ("/queues/jobs/ack", json!({"receipts": []})),
        ("/queues/jobs/ack", json!({"receipts": vec!["ok"; 1001]})),
        (
            "/queues/jobs/extend",
            json!({"receipt": "ok", "lease_seconds": 0}),
        ),
    ];
    for (path, body) in cases {
        let response = h.post(path, body).await;
        assert_error(response, StatusCode::BAD_REQUEST, "invalid_argument");
    }
    assert_eq!(h.fake.calls(), []);
    // At the limits, requests pass.
    let (status, _) = h.post("/queues/jobs/messages", messages(500)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = h
        .post(
            "/queues/jobs/receive",
            json!({"max_messages": 100, "wait_seconds": 20}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    h.shutdown().await;
}

/// Sends the head of a request with a `content-length` over the limit and
/// only part of the body, and reads the answer: the server must refuse
/// from the declared length, without reading (or buffering) the body.
#[tokio::test]
async fn an_oversize_body_is_413() {
    let h = start().await;
    let mut socket = tokio::net::TcpStream::connect(h.http).await.unwrap();
    let head = format!(
        "POST /queues/jobs/messages HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        h.http,
        HTTP_BODY_LIMIT_BYTES + 1
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(&[b' '; 1024]).await.unwrap();
    let answer = read_answer(&mut socket).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "payload_too_large");
    assert_eq!(h.fake.calls(), []);
    h.shutdown().await;
}

/// Reads what the server sent until it closed. A server that closes with
/// part of the request unread resets the connection, which surfaces as an
/// error after its answer has been read.
async fn read_answer(socket: &mut (impl tokio::io::AsyncRead + Unpin)) -> String {
    let mut answer = Vec::new();
    let mut buffer = [0; 4096];
    let reading = async {
        loop {
            match socket.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buffer[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .expect("the server answers without waiting for the rest of the body");
    String::from_utf8(answer).unwrap()
}

/// A chunked body has no declared length: the limit is found while
/// reading, and the answer is the same.
#[tokio::test]
async fn a_chunked_body_past_the_limit_is_413() {
    let h = start().await;
    let socket = tokio::net::TcpStream::connect(h.http).await.unwrap();
    let (mut reader, mut writer) = socket.into_split();
    let head = format!(
        "POST /queues/jobs/messages HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\nconnection: close\r\n\r\n",
        h.http
    );
    // The writer may be cut off when the server answers and closes.
    let writing = tokio::spawn(async move {
        writer.write_all(head.as_bytes()).await?;
        let chunk = [b' '; 64 * 1024];
        for _ in 0..(HTTP_BODY_LIMIT_BYTES / chunk.len() + 2) {
            writer
                .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                .await?;
            writer.write_all(&chunk).await?;
            writer.write_all(b"\r\n").await?;
        }
        writer.write_all(b"0\r\n\r\n").await
    });
    let answer = read_answer(&mut reader).await;
    let _ = writing.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
    assert_eq!(h.fake.calls(), []);
    h.shutdown().await;
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_in_the_error_shape() {
    let h = start().await;
    assert_error(h.get("/nowhere").await, StatusCode::NOT_FOUND, "no_route");
    let response = h.client.delete(h.url("/queues/jobs")).send().await.unwrap();
    assert_error(
        decode(response).await,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );
    h.shutdown().await;
}

// ---------------------------------------------------------------------------
// Metrics.

#[tokio::test]
async fn metrics_route_renders_the_prometheus_handle() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!("dispatcher_acks_total", "queue" => "jobs").increment(3);
    });
    let h = start_with(Some(handle)).await;
    let response = h.client.get(h.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; version=0.0.4"
    );
    let text = response.text().await.unwrap();
    assert!(
        text.contains("dispatcher_acks_total{queue=\"jobs\"} 3"),
        "{text}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn metrics_route_is_404_without_a_handle() {
    let h = start().await;
    assert_error(h.get("/metrics").await, StatusCode::NOT_FOUND, "not_found");
    h.shutdown().await;
}

// ---------------------------------------------------------------------------
// The OpenAPI document.

fn openapi() -> serde_yaml::Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml"))
        .expect("openapi.yaml is in the package");
    serde_yaml::from_str(&text).expect("openapi.yaml is valid YAML")
}

fn openapi_routes(doc: &serde_yaml::Value) -> BTreeSet<(String, String)> {
    let mut routes = BTreeSet::new();
    for (path, item) in doc["paths"].as_mapping().expect("paths is a mapping") {
        for (method, _) in item.as_mapping().unwrap() {
            let method = method.as_str().unwrap();
            if method != "parameters" {
                routes.insert((method.to_uppercase(), path.as_str().unwrap().to_string()));
            }
        }
    }
    routes
}

#[test]
fn openapi_describes_exactly_the_routes_the_router_serves() {
    let doc = openapi();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.0"));
    let router: BTreeSet<(String, String)> = HTTP_ROUTES
        .iter()
        .map(|r| (r.method.to_string(), r.path.to_string()))
        .collect();
    assert_eq!(router.len(), HTTP_ROUTES.len(), "no route is listed twice");
    assert_eq!(openapi_routes(&doc), router);
}

/// Every `$ref` in the document names something the document defines.
#[test]
fn openapi_references_resolve() {
    fn walk(value: &serde_yaml::Value, refs: &mut HashSet<String>) {
        match value {
            serde_yaml::Value::Mapping(m) => {
                for (k, v) in m {
                    if k.as_str() == Some("$ref") {
                        refs.insert(v.as_str().unwrap().to_string());
                    }
                    walk(v, refs);
                }
            }
            serde_yaml::Value::Sequence(s) => s.iter().for_each(|v| walk(v, refs)),
            _ => {}
        }
    }
    let doc = openapi();
    let mut refs = HashSet::new();
    walk(&doc, &mut refs);
    assert!(refs.len() > 20, "the document uses references: {refs:?}");
    for reference in refs {
        let mut target = &doc;
        for part in reference.strip_prefix("#/").unwrap().split('/') {
            target = &target[part];
        }
        assert!(!target.is_null(), "{reference} does not resolve");
    }
}

/// Follows `$ref`s to the node they name.
fn resolve<'a>(
    doc: &'a serde_yaml::Value,
    mut node: &'a serde_yaml::Value,
) -> &'a serde_yaml::Value {
    while let Some(reference) = node["$ref"].as_str() {
        let path = reference.strip_prefix("#/").expect("a local reference");
        node = path.split('/').fold(doc, |n, part| &n[part]);
    }
    node
}

/// Checks `value` against the OpenAPI schema: types, required fields,
/// enums, nullability, and (stricter than OpenAPI's default) no field the
/// schema does not list, so an undocumented field fails.
fn check_schema(doc: &serde_yaml::Value, schema: &serde_yaml::Value, value: &Value, at: &str) {
    let schema = resolve(doc, schema);
    if value.is_null() {
        assert_eq!(
            schema["nullable"].as_bool(),
            Some(true),
            "{at}: null, not nullable"
        );
        return;
    }
    if let Some(options) = schema["enum"].as_sequence() {
        assert!(
            options.iter().any(|o| o.as_str() == value.as_str()),
            "{at}: {value} is not one of {options:?}"
        );
    }
    match schema["type"].as_str() {
        Some("object") => {
            let object = value
                .as_object()
                .unwrap_or_else(|| panic!("{at}: not an object"));
            for required in schema["required"].as_sequence().into_iter().flatten() {
                let name = required.as_str().unwrap();
                assert!(object.contains_key(name), "{at}: {name} is missing");
            }
            for (name, field) in object {
                let property = &schema["properties"][name.as_str()];
                assert!(!property.is_null(), "{at}.{name}: not in the schema");
                check_schema(doc, property, field, &format!("{at}.{name}"));
            }
        }
        Some("array") => {
            let items = value
                .as_array()
                .unwrap_or_else(|| panic!("{at}: not an array"));
            for (i, item) in items.iter().enumerate() {
                check_schema(doc, &schema["items"], item, &format!("{at}[{i}]"));
            }
        }
        Some("string") => assert!(value.is_string(), "{at}: not a string"),
        Some("integer") => assert!(value.is_i64() || value.is_u64(), "{at}: not an integer"),
        Some("boolean") => assert!(value.is_boolean(), "{at}: not a boolean"),
        Some("number") => assert!(value.is_number(), "{at}: not a number"),
        other => panic!("{at}: schema type {other:?} is not handled here"),
    }
}

/// The JSON schema of a route's request body, or of its answer with
/// `status`.
fn documented_schema<'a>(
    doc: &'a serde_yaml::Value,
    method: &str,
    path: &str,
    status: Option<StatusCode>,
) -> &'a serde_yaml::Value {
    let operation = &doc["paths"][path][method.to_lowercase().as_str()];
    let part = match status {
        None => resolve(doc, &operation["requestBody"]),
        Some(status) => resolve(doc, &operation["responses"][status.as_str()]),
    };
    let schema = &part["content"]["application/json"]["schema"];
    assert!(
        !schema.is_null(),
        "{method} {path} {status:?} has no JSON schema"
    );
    schema
}

/// Requests (valid and not) and their answers match the schemas
/// `openapi.yaml` gives them.
#[tokio::test]
async fn requests_and_answers_match_the_documented_schemas() {
    let doc = openapi();
    let h = start().await;
    h.fake.set_deliveries(vec![
        delivery("ok-1", Some(b"k"), b"text", b"v"),
        delivery("ok-2", None, &[0xff], b"v"),
    ]);
    let cases: Vec<(&str, &str, &str, Value)> = vec![
        ("GET", "/healthz", "/healthz", Value::Null),
        ("GET", "/queues", "/queues", Value::Null),
        ("GET", "/queues/{q}", "/queues/jobs", Value::Null),
        ("GET", "/queues/{q}", "/queues/nope", Value::Null),
        ("GET", "/queues/{q}", "/queues/down", Value::Null),
        ("GET", "/metrics", "/metrics", Value::Null),
        (
            "POST",
            "/queues/{q}/messages",
            "/queues/jobs/messages",
            json!({"messages": [
                {"message_id": "m", "key": "k", "payload": "p", "delay_seconds": 1,
                 "headers": [{"name": "n", "value": "dg=="}], "encoding": "base64"},
                {"message_id": "dup-1", "payload": "p"},
            ]}),
        ),
        (
            "POST",
            "/queues/{q}/messages",
            "/queues/jobs/messages",
            json!({"messages": []}),
        ),
        (
            "POST",
            "/queues/{q}/receive",
            "/queues/jobs/receive",
            json!({"max_messages": 2, "wait_seconds": 0, "lease_seconds": 5,
                   "consumer_id": "w", "encoding": "auto"}),
        ),
        (
            "POST",
            "/queues/{q}/ack",
            "/queues/jobs/ack",
            json!({"receipts": ["ok-1", "stale-2", "invalid-3", "notowner-4"]}),
        ),
        (
            "POST",
            "/queues/{q}/nack",
            "/queues/jobs/nack",
            json!({"receipt": "ok-1", "retry_after_seconds": 10, "error": "e", "permanent": false}),
        ),
        (
            "POST",
            "/queues/{q}/extend",
            "/queues/jobs/extend",
            json!({"receipt": "ok-1", "lease_seconds": 30}),
        ),
        (
            "POST",
            "/queues/{q}/extend",
            "/queues/jobs/extend",
            json!({"receipt": "stale-1", "lease_seconds": 30}),
        ),
        (
            "POST",
            "/queues/{q}/pause",
            "/queues/jobs/pause",
            Value::Null,
        ),
        (
            "POST",
            "/queues/{q}/resume",
            "/queues/nope/resume",
            Value::Null,
        ),
        (
            "POST",
            "/queues/{q}/redrive",
            "/queues/jobs/redrive",
            json!({"rate_per_sec": 2.5, "max_messages": 10, "filter": {
                "message_id": "m", "key": "k", "error_contains": "503",
                "from": "2026-12-03T07:14:00.123Z", "to": "2026-12-04T07:14:00Z"}}),
        ),
        (
            "GET",
            "/queues/{q}/redrive",
            "/queues/jobs/redrive",
            Value::Null,
        ),
        (
            "GET",
            "/queues/{q}/redrive",
            "/queues/nope/redrive",
            Value::Null,
        ),
        (
            "POST",
            "/queues/{q}/redrive/pause",
            "/queues/jobs/redrive/pause",
            Value::Null,
        ),
        (
            "POST",
            "/queues/{q}/redrive/resume",
            "/queues/jobs/redrive/resume",
            Value::Null,
        ),
        (
            "POST",
            "/queues/{q}/redrive/cancel",
            "/queues/jobs/redrive/cancel",
            Value::Null,
        ),
    ];
    for (method, template, path, body) in cases {
        let at = format!("{method} {path}");
        if method == "POST" && !body.is_null() {
            let schema = documented_schema(&doc, method, template, None);
            check_schema(&doc, schema, &body, &format!("{at} request"));
        }
        let (status, answer) = send(&h, method, path, &body).await;
        let schema = documented_schema(&doc, method, template, Some(status));
        check_schema(&doc, schema, &answer, &format!("{at} {status}"));
    }
    h.shutdown().await;
}

/// Each documented route reaches a handler: the answer is not the
/// router's "no route" or "method not allowed".
#[tokio::test]
async fn every_documented_route_reaches_a_handler() {
    let h = start().await;
    for (method, path) in openapi_routes(&openapi()) {
        let path = path.replace("{q}", "jobs");
        let response = match method.as_str() {
            "GET" => h.client.get(h.url(&path)),
            "POST" => h.client.post(h.url(&path)).body("{}"),
            other => panic!("openapi.yaml documents method {other}"),
        }
        .send()
        .await
        .unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert!(
            !text.contains("\"no_route\"") && status != StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}: {status} {text}"
        );
    }
    h.shutdown().await;
}

/// The trace of `traced`: failed once, retried, and now leased again.
fn traced_message() -> dispatcher_sidecar::trace::MessageTrace {
    use dispatcher_sidecar::trace::{
        CurrentState, EventKind, LocationKind, MessageTrace, Place, Source, Status, TraceEvent,
    };
    let event = |at: i64, event: EventKind, topic: &str| TraceEvent {
        at,
        event,
        topic: Some(topic.into()),
        partition: Some(1),
        offset: Some(at / 1000),
        attempt: None,
        consumer: None,
        error: None,
    };
    MessageTrace {
        queue: "jobs".into(),
        message_id: "traced".into(),
        events: vec![
            event(NOW_MS - 3000, EventKind::Produced, "jobs-topic"),
            TraceEvent {
                attempt: Some(1),
                consumer: Some("w1".into()),
                error: Some("boom".into()),
                topic: None,
                partition: None,
                offset: None,
                ..event(NOW_MS - 2000, EventKind::DeliveryFailed, "")
            },
            event(NOW_MS - 1000, EventKind::Retried, "jobs-topic.retry.10s"),
        ],
        state: CurrentState {
            status: Status::InFlight,
            location: Place {
                kind: LocationKind::Retry,
                topic: "jobs-topic.retry.10s".into(),
                partition: 1,
                offset: 7,
            },
            detail: "leased to w2".into(),
            source: Source::Owner,
            consumer: Some("w2".into()),
            attempt: Some(2),
            lease_expires_at: Some(NOW_MS + 60_000),
            due_at: None,
            committed_offset: Some(7),
            log_start_offset: Some(0),
        },
    }
}

// ---------------------------------------------------------------------------
// gRPC.

/// Parked, Skip and Trace answer what their HTTP routes answer.
#[tokio::test]
async fn grpc_parked_skip_and_trace_carry_what_http_shows() {
    let h = start().await;
    let mut client = h.grpc().await;

    let parked = client
        .parked(proto::ParkedRequest {
            queue: "jobs".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .parked;
    assert_eq!(
        parked,
        [
            proto::ParkedKey {
                partition: 1,
                key: b"K".to_vec(),
                message_id: "m-1".into(),
                parked_at_ms: 0,
                held: 3,
                released_by: None,
            },
            proto::ParkedKey {
                partition: 0,
                key: vec![0xff, 0x00],
                message_id: "m-2".into(),
                parked_at_ms: 1_000,
                held: 0,
                released_by: Some("skip".into()),
            },
        ]
    );

    let skip = |key: &[u8], message_id: &str| proto::SkipRequest {
        queue: "jobs".into(),
        partition: 1,
        key: key.to_vec(),
        message_id: message_id.into(),
    };
    for (request, expected) in [
        (skip(b"K", "m-1"), proto::SkipStatus::Released),
        (skip(b"K", "m-9"), proto::SkipStatus::OtherMessage),
        (skip(b"R", "m-1"), proto::SkipStatus::AlreadyReleased),
        (skip(b"X", "m-1"), proto::SkipStatus::NotParked),
    ] {
        let got = client.skip(request.clone()).await.unwrap().into_inner();
        assert_eq!(got.status(), expected, "{request:?}");
    }
    let unreached = client.skip(skip(b"O", "m-1")).await.unwrap_err();
    assert_eq!(unreached.code(), tonic::Code::Unavailable, "{unreached:?}");
    let empty_id = client.skip(skip(b"K", "")).await.unwrap_err();
    assert_eq!(empty_id.code(), tonic::Code::InvalidArgument);
    let calls = h.fake.calls();
    assert_eq!(
        calls[1],
        Call::Skip(
            "jobs".into(),
            SkipRequest {
                partition: 1,
                key: b"K".to_vec(),
                message_id: "m-1".into(),
            }
        )
    );
    assert_eq!(calls.len(), 6, "the empty id never reached the service");

    let trace = client
        .trace(proto::TraceRequest {
            message_id: "traced".into(),
            queue: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(trace.message_id, "traced");
    let [t] = trace.traces.as_slice() else {
        panic!("one trace: {trace:?}")
    };
    let (status, http) = h.get("/messages/traced").await;
    assert_eq!(status, StatusCode::OK);
    let ht = &http["traces"][0];
    assert_eq!(t.queue, "jobs");
    assert_eq!(t.events.len(), 3);
    let kinds: Vec<_> = t.events.iter().map(|e| e.event()).collect();
    assert_eq!(
        kinds,
        [
            proto::TraceEventKind::Produced,
            proto::TraceEventKind::DeliveryFailed,
            proto::TraceEventKind::Retried
        ]
    );
    for (e, he) in t.events.iter().zip(ht["events"].as_array().unwrap()) {
        assert_eq!(Some(e.at_ms), he["at"].as_str().map(rfc3339_ms), "{he}");
        assert_eq!(e.topic.as_deref(), he["topic"].as_str(), "{he}");
        assert_eq!(e.partition.map(i64::from), he["partition"].as_i64());
        assert_eq!(e.offset, he["offset"].as_i64());
        assert_eq!(e.attempt.map(u64::from), he["attempt"].as_u64());
        assert_eq!(e.consumer.as_deref(), he["consumer"].as_str());
        assert_eq!(e.error.as_deref(), he["error"].as_str());
    }
    let state = t.state.as_ref().unwrap();
    assert_eq!(ht["state"]["status"], "in_flight");
    assert_eq!(state.status(), proto::MessageStatus::InFlight);
    assert_eq!(state.source(), proto::TraceSource::Owner);
    assert_eq!(
        state.location,
        Some(proto::TracePlace {
            kind: proto::LocationKind::Retry.into(),
            topic: "jobs-topic.retry.10s".into(),
            partition: 1,
            offset: 7,
        })
    );
    assert_eq!(state.detail, "leased to w2");
    assert_eq!(
        (state.consumer.as_deref(), state.attempt),
        (Some("w2"), Some(2))
    );
    assert_eq!(state.lease_expires_at_ms, Some(NOW_MS + 60_000));
    assert_eq!(
        Some(NOW_MS + 60_000),
        ht["state"]["lease_expires_at"].as_str().map(rfc3339_ms)
    );
    assert_eq!(state.due_at_ms, None);
    assert_eq!(
        (state.committed_offset, state.log_start_offset),
        (Some(7), Some(0))
    );

    for (message_id, queue, code) in [
        ("unknown", None, tonic::Code::NotFound),
        ("traced", Some("nope"), tonic::Code::NotFound),
        ("a\u{1}b", None, tonic::Code::InvalidArgument),
    ] {
        let err = client
            .trace(proto::TraceRequest {
                message_id: message_id.into(),
                queue: queue.map(Into::into),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "{message_id} {queue:?}: {err:?}");
    }
    h.shutdown().await;
}

/// Milliseconds since the epoch of the HTTP API's RFC 3339 times.
fn rfc3339_ms(text: &str) -> i64 {
    dispatcher_sidecar::redrive::parse_time(text).expect("an RFC 3339 time")
}

#[tokio::test]
async fn grpc_serves_every_rpc() {
    let h = start().await;
    let mut client = h.grpc().await;

    let queues = client
        .list_queues(proto::ListQueuesRequest {})
        .await
        .unwrap()
        .into_inner()
        .queues;
    assert_eq!(queues.len(), 1);
    assert_eq!(queues[0].name, "jobs");
    assert_eq!(queues[0].lease_ms, 60_000);
    assert_eq!(
        queues[0].retry_tiers_ms,
        [10_000, 60_000, 600_000, 3_600_000]
    );
    assert_eq!(
        queues[0].push,
        Some(proto::PushSettings {
            url: "http://push.internal:9000/jobs".into(),
            grpc: String::new(),
            concurrency: 16,
            timeout_ms: 30_000,
            breaker_failures: 5,
            breaker_cooldown_ms: 5_000,
            breaker_cooldown_max_ms: 60_000,
        })
    );

    let binary: Vec<u8> = (0..=255).collect();
    let produced = client
        .produce(proto::ProduceRequest {
            queue: "jobs".into(),
            messages: vec![
                proto::NewMessage {
                    message_id: Some("m-1".into()),
                    key: Some(vec![0xff]),
                    payload: binary.clone(),
                    headers: vec![proto::Header {
                        name: "h".into(),
                        value: vec![0xc3, 0x28],
                    }],
                    delay_seconds: Some(5),
                },
                proto::NewMessage {
                    message_id: Some("dup-2".into()),
                    payload: b"p".to_vec(),
                    ..Default::default()
                },
            ],
        })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(
        produced,
        [
            proto::ProduceResult {
                message_id: "m-1".into(),
                status: proto::ProduceStatus::Accepted.into(),
                partition: 0,
                offset: 100,
            },
            proto::ProduceResult {
                message_id: "dup-2".into(),
                status: proto::ProduceStatus::Duplicate.into(),
                partition: 1,
                offset: 101,
            },
        ]
    );

    h.fake.set_deliveries(vec![delivery(
        "ok-1",
        Some(&[0xff]),
        &binary,
        &[0xc3, 0x28],
    )]);
    let delivered = client
        .receive(proto::ReceiveRequest {
            queue: "jobs".into(),
            max_messages: Some(3),
            wait_seconds: Some(1),
            lease_seconds: Some(30),
            consumer_id: Some("w".into()),
        })
        .await
        .unwrap()
        .into_inner()
        .messages;
    assert_eq!(
        delivered,
        [proto::Delivery {
            message_id: "id-ok-1".into(),
            receipt: "ok-1".into(),
            key: Some(bytes::Bytes::from_static(&[0xff])),
            payload: binary.clone().into(),
            headers: vec![proto::Header {
                name: "trace".into(),
                value: vec![0xc3, 0x28]
            }],
            attempt: 2,
            enqueued_at_ms: 951_782_400_000,
            partition: 1,
            offset: 77,
            lease_expires_at_ms: NOW_MS,
        }]
    );

    let acked = client
        .ack(proto::AckRequest {
            queue: "jobs".into(),
            receipts: vec![
                "ok-1".into(),
                "stale-2".into(),
                "invalid-3".into(),
                "notowner-4".into(),
            ],
        })
        .await
        .unwrap()
        .into_inner()
        .results;
    let statuses: Vec<_> = acked.iter().map(|r| r.status()).collect();
    assert_eq!(
        statuses,
        [
            proto::ReceiptStatus::Ok,
            proto::ReceiptStatus::Stale,
            proto::ReceiptStatus::Invalid,
            proto::ReceiptStatus::NotOwner,
        ]
    );
    assert_eq!(acked[1].receipt, "stale-2");

    let nacked = client
        .nack(proto::NackRequest {
            queue: "jobs".into(),
            receipt: "stale-1".into(),
            retry_after_seconds: Some(10),
            error: Some("boom".into()),
            permanent: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(nacked.status(), proto::ReceiptStatus::Stale);

    let extended = client
        .extend(proto::ExtendRequest {
            queue: "jobs".into(),
            receipt: "ok-1".into(),
            lease_seconds: 60,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(extended.status(), proto::ReceiptStatus::Ok);
    assert_eq!(extended.lease_expires_at_ms, Some(NOW_MS + 60_000));

    let stats = client
        .stats(proto::StatsRequest {
            queue: "jobs".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((stats.depth, stats.in_flight, stats.dlq_depth), (42, 3, 2));
    assert!(stats.paused);
    assert_eq!(stats.partitions.len(), 2);
    assert_eq!(stats.partitions[1].oldest_unacked_age_ms, 10);
    assert_eq!(
        stats.stuck_partitions,
        vec![proto::StuckPartition {
            topic: "jobs.retry.1m".into(),
            partition: 1,
            offset: 17,
            error: "Message consumption error: BadCompression".into(),
            since_ms: 1_000,
            errors: 4,
        }]
    );

    let calls = h.fake.calls();
    assert_eq!(
        calls[1],
        Call::Receive(
            "jobs".into(),
            ReceiveRequest {
                max_messages: 3,
                wait: Duration::from_secs(1),
                lease: Some(Duration::from_secs(30)),
                consumer: Some("w".into()),
            }
        )
    );
    assert_eq!(
        calls[3],
        Call::Nack(
            "jobs".into(),
            NackRequest {
                receipt: "stale-1".into(),
                retry_after: Some(Duration::from_secs(10)),
                error: Some("boom".into()),
                permanent: true,
            }
        )
    );
    let Call::Produce(_, messages) = &calls[0] else {
        panic!("expected a produce first")
    };
    assert_eq!(messages[0].headers, [("h".to_string(), vec![0xc3, 0x28])]);
    assert_eq!(messages[0].delay, Some(Duration::from_secs(5)));
    h.shutdown().await;
}

#[tokio::test]
async fn grpc_maps_service_errors_to_status_codes() {
    let h = start().await;
    let mut client = h.grpc().await;
    for (queue, code) in [
        ("nope", tonic::Code::NotFound),
        ("picky", tonic::Code::InvalidArgument),
        ("down", tonic::Code::Unavailable),
    ] {
        let stats = client
            .stats(proto::StatsRequest {
                queue: queue.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(stats.code(), code, "{stats:?}");
        let ack = client
            .ack(proto::AckRequest {
                queue: queue.into(),
                receipts: vec!["ok".into()],
            })
            .await
            .unwrap_err();
        assert_eq!(ack.code(), code, "{ack:?}");
        let receive = client
            .receive(proto::ReceiveRequest {
                queue: queue.into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(receive.code(), code, "{receive:?}");
        let parked = client
            .parked(proto::ParkedRequest {
                queue: queue.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(parked.code(), code, "{parked:?}");
        let skipped = client
            .skip(proto::SkipRequest {
                queue: queue.into(),
                partition: 1,
                key: b"K".to_vec(),
                message_id: "m-1".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(skipped.code(), code, "{skipped:?}");
    }
    h.shutdown().await;
}

#[tokio::test]
async fn grpc_redrive_calls_reach_the_service_and_map_its_answers() {
    let h = start().await;
    let mut client = h.grpc().await;
    let job = client
        .redrive_start(proto::RedriveStartRequest {
            queue: "jobs".into(),
            rate_per_sec: 2.5,
            filter: Some(proto::RedriveFilter {
                key: Some("k".into()),
                from_ms: Some(NOW_MS),
                ..Default::default()
            }),
            max_messages: Some(3),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(job.id, "job-1");
    assert_eq!(job.state(), proto::RedriveState::Failed);
    assert_eq!(job.started_at_ms, NOW_MS);
    assert_eq!(job.finished_at_ms, Some(NOW_MS + 60_000));
    assert_eq!(job.filter.as_ref().unwrap().from_ms, Some(NOW_MS));
    assert_eq!(job.partitions[0].end, 14);
    let status = client
        .redrive_status(proto::RedriveStatusRequest {
            queue: "jobs".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.redriven, 3);
    let control = |action: proto::RedriveAction| proto::RedriveControlRequest {
        queue: "jobs".into(),
        action: action.into(),
    };
    client
        .redrive_control(control(proto::RedriveAction::Pause))
        .await
        .unwrap();
    let resume = client
        .redrive_control(control(proto::RedriveAction::Resume))
        .await
        .unwrap_err();
    assert_eq!(resume.code(), tonic::Code::FailedPrecondition);
    let cancel = client
        .redrive_control(control(proto::RedriveAction::Cancel))
        .await
        .unwrap_err();
    assert_eq!(cancel.code(), tonic::Code::NotFound);
    let unspecified = client
        .redrive_control(control(proto::RedriveAction::Unspecified))
        .await
        .unwrap_err();
    assert_eq!(unspecified.code(), tonic::Code::InvalidArgument);
    let unknown = client
        .redrive_status(proto::RedriveStatusRequest {
            queue: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    assert_eq!(
        h.fake.calls(),
        vec![
            Call::RedriveStart(
                "jobs".into(),
                RedriveRequest {
                    rate_per_sec: 2.5,
                    filter: Some(RedriveFilter {
                        key: Some("k".into()),
                        from: Some("2026-12-03T07:14:00.123Z".into()),
                        ..RedriveFilter::default()
                    }),
                    max_messages: Some(3),
                }
            ),
            Call::RedriveStatus("jobs".into()),
            Call::RedriveControl("jobs".into(), RedriveAction::Pause),
            Call::RedriveControl("jobs".into(), RedriveAction::Resume),
            Call::RedriveControl("jobs".into(), RedriveAction::Cancel),
            Call::RedriveStatus("nope".into()),
        ]
    );
    h.shutdown().await;
}

#[tokio::test]
async fn grpc_rejects_over_limit_requests_before_the_service() {
    let h = start().await;
    let mut client = h.grpc().await;
    let many = vec![
        proto::NewMessage {
            payload: b"p".to_vec(),
            ..Default::default()
        };
        501
    ];
    let produce = client
        .produce(proto::ProduceRequest {
            queue: "jobs".into(),
            messages: many,
        })
        .await
        .unwrap_err();
    assert_eq!(produce.code(), tonic::Code::InvalidArgument);
    assert!(produce.message().contains("500"), "{produce:?}");
    for (max_messages, wait_seconds) in [(Some(101), None), (Some(0), None), (None, Some(21))] {
        let receive = client
            .receive(proto::ReceiveRequest {
                queue: "jobs".into(),
                max_messages,
                wait_seconds,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(receive.code(), tonic::Code::InvalidArgument);
    }
    let extend = client
        .extend(proto::ExtendRequest {
            queue: "jobs".into(),
            receipt: "ok".into(),
            lease_seconds: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(extend.code(), tonic::Code::InvalidArgument);
    let ack = client
        .ack(proto::AckRequest {
            queue: "jobs".into(),
            receipts: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(ack.code(), tonic::Code::InvalidArgument);
    assert_eq!(h.fake.calls(), []);
    h.shutdown().await;
}

// ---------------------------------------------------------------------------
// Lifecycle.

#[tokio::test]
async fn shutdown_stops_both_servers() {
    let h = start().await;
    let (http, grpc) = (h.http, h.grpc);
    assert_eq!(http.ip().to_string(), "127.0.0.3");
    assert_ne!(http.port(), 0);
    assert_ne!(grpc.port(), 0);
    h.shutdown().await;
    assert!(tokio::net::TcpStream::connect(http).await.is_err());
    assert!(tokio::net::TcpStream::connect(grpc).await.is_err());
}

#[tokio::test]
async fn a_taken_address_is_a_bind_error_naming_it() {
    let taken = tokio::net::TcpListener::bind(LOCAL).await.unwrap();
    let addr = taken.local_addr().unwrap();
    let error = api::serve_bound(
        Arc::new(Fake::default()),
        LOCAL.parse().unwrap(),
        addr,
        None,
        std::future::pending(),
    )
    .await
    .unwrap_err();
    let message = format!("{error:#}");
    assert!(
        message.contains("gRPC") && message.contains(&addr.to_string()),
        "{message}"
    );
}
