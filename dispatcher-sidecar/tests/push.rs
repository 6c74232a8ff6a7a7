//! Push subscriptions end to end: our broker, the dispatcher's queues and
//! push loops in this process, and HTTP (axum) and gRPC (tonic) endpoints
//! written here that answer by rule. Each outcome (2xx/OK, a permanent
//! refusal, a retryable failure, a timeout, 429/RESOURCE_EXHAUSTED with
//! Retry-After) is checked at the endpoint and in the queue; a failing
//! endpoint opens the circuit breaker and loses nothing; a pause stops
//! pushes.
//!
//! Every test has its own broker (127.0.0.2, fixed ports) and its
//! endpoints listen on 127.0.0.2 port 0.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use common::Broker;
use dispatcher_sidecar::config::Config;
use dispatcher_sidecar::kafka;
use dispatcher_sidecar::lease::RetryEnvelope;
use dispatcher_sidecar::push::proto::push_endpoint_server::{PushEndpoint, PushEndpointServer};
use dispatcher_sidecar::push::proto::{PushRequest, PushResponse};
use dispatcher_sidecar::push::Pusher;
use dispatcher_sidecar::queue::Dispatcher;
use dispatcher_sidecar::service::{NewMessage, ProduceStatus, QueueService};
use metrics_exporter_prometheus::PrometheusHandle;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;

const TIMEOUT: Duration = Duration::from_secs(60);

/// One request an endpoint got, and what it answered.
#[derive(Clone, Debug)]
struct Seen {
    /// The HTTP path without its `/`, or the gRPC request's queue.
    route: String,
    message_id: String,
    attempt: u32,
    payload: Vec<u8>,
    /// HTTP only: the request's headers (lowercase names).
    headers: Vec<(String, String)>,
    at: Instant,
    /// The answer: an HTTP status, or 200 for gRPC OK (0 for no answer in
    /// time).
    answered: u16,
}

/// What an endpoint saw, shared by its handlers and the test.
#[derive(Default)]
struct Log {
    seen: Mutex<Vec<Seen>>,
}

impl Log {
    fn push(&self, seen: Seen) {
        self.seen.lock().unwrap().push(seen);
    }

    fn of(&self, route: &str) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.route == route)
            .cloned()
            .collect()
    }

    /// Waits until `route` has `n` requests.
    async fn wait_for(&self, route: &str, n: usize) -> Vec<Seen> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let seen = self.of(route);
            if seen.len() >= n {
                return seen;
            }
            assert!(
                Instant::now() < deadline,
                "{route}: {} of {n} requests within {TIMEOUT:?}: {seen:?}",
                seen.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Runs `rule` behind a route: it gets the route and attempt and says what
/// to answer, after how long.
type Rule = fn(&str, u32) -> Answer;

struct Answer {
    status: u16,
    retry_after: Option<&'static str>,
    body: &'static str,
    delay: Duration,
}

fn answer(status: u16) -> Answer {
    Answer {
        status,
        retry_after: None,
        body: "",
        delay: Duration::ZERO,
    }
}

/// The rules of the outcome tests, by route (HTTP path or gRPC queue).
fn outcome_rule(route: &str, attempt: u32) -> Answer {
    let first = attempt == 1;
    match route {
        "ok" => answer(200),
        "bad" => Answer {
            body: "no such order",
            ..answer(400)
        },
        "fail" if first => Answer {
            body: "database down",
            ..answer(500)
        },
        "slow" if first => Answer {
            delay: Duration::from_secs(3),
            ..answer(200)
        },
        "busy" if first => Answer {
            retry_after: Some("3"),
            ..answer(429)
        },
        "fail" | "slow" | "busy" => answer(204),
        other => panic!("no rule for {other}"),
    }
}

struct HttpEndpoint {
    log: Arc<Log>,
    addr: SocketAddr,
}

async fn http_endpoint(rule: Rule) -> HttpEndpoint {
    let log = Arc::new(Log::default());
    let app = axum::Router::new()
        .fallback(http_handler)
        .with_state((Arc::clone(&log), rule));
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    HttpEndpoint { log, addr }
}

async fn http_handler(State((log, rule)): State<(Arc<Log>, Rule)>, request: Request) -> Response {
    let route = request.uri().path().trim_start_matches('/').to_owned();
    let headers: Vec<(String, String)> = request
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("?").to_owned()))
        .collect();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let attempt: u32 = header("dispatcher-attempt").parse().unwrap_or(0);
    let message_id = header("dispatcher-message-id");
    let payload = axum::body::to_bytes(request.into_body(), 1 << 20)
        .await
        .unwrap()
        .to_vec();
    let a = rule(&route, attempt);
    log.push(Seen {
        route,
        message_id,
        attempt,
        payload,
        headers,
        at: Instant::now(),
        answered: if a.delay.is_zero() { a.status } else { 0 },
    });
    tokio::time::sleep(a.delay).await;
    let mut response = (StatusCode::from_u16(a.status).unwrap(), a.body).into_response();
    if let Some(after) = a.retry_after {
        response
            .headers_mut()
            .insert("retry-after", after.parse().unwrap());
    }
    response
}

struct GrpcEndpoint {
    log: Arc<Log>,
    rule: Rule,
}

#[tonic::async_trait]
impl PushEndpoint for GrpcEndpoint {
    async fn deliver(
        &self,
        request: tonic::Request<PushRequest>,
    ) -> Result<tonic::Response<PushResponse>, tonic::Status> {
        let r = request.into_inner();
        let a = (self.rule)(&r.queue, r.attempt);
        self.log.push(Seen {
            route: r.queue.clone(),
            message_id: r.message_id.clone(),
            attempt: r.attempt,
            payload: r.payload.to_vec(),
            headers: r
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.clone(),
                        String::from_utf8_lossy(&h.value).into_owned(),
                    )
                })
                .collect(),
            at: Instant::now(),
            answered: if a.delay.is_zero() { a.status } else { 0 },
        });
        tokio::time::sleep(a.delay).await;
        let code = match a.status {
            200..=299 => return Ok(tonic::Response::new(PushResponse {})),
            400 => tonic::Code::InvalidArgument,
            429 => tonic::Code::ResourceExhausted,
            500 => tonic::Code::Unavailable,
            503 => tonic::Code::Unavailable,
            other => panic!("no gRPC code for {other}"),
        };
        let mut status = tonic::Status::new(code, a.body);
        if let Some(after) = a.retry_after {
            status
                .metadata_mut()
                .insert("retry-after", after.parse().unwrap());
        }
        Err(status)
    }
}

async fn grpc_endpoint(rule: Rule) -> (Arc<Log>, SocketAddr) {
    let log = Arc::new(Log::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = PushEndpointServer::new(GrpcEndpoint {
        log: Arc::clone(&log),
        rule,
    });
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .unwrap()
    });
    (log, addr)
}

/// The process's metrics, rendered as Prometheus text (one recorder for
/// every test of this binary; the series carry each test's queue names).
fn metrics() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("the only recorder of this test binary")
    })
}

/// The value of the series `name` with exactly `labels`, 0 when absent.
fn metric(name: &str, labels: &[(&str, &str)]) -> f64 {
    let want: BTreeSet<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    metrics()
        .render()
        .lines()
        .find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix('{')?;
            let (series, value) = rest.rsplit_once("} ")?;
            let got: BTreeSet<String> = series.split(',').map(str::to_owned).collect();
            (got == want).then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0.0)
}

/// A broker on `port`, its topics (one partition each) and a config with
/// `queues` (TOML).
async fn setup(port: u16, topics: &[&str], queues: &str) -> (Broker, Config) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    metrics();
    let broker = Broker::start(port);
    let config = broker.config(queues);
    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(&config).create().unwrap();
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(1)))
        .collect();
    let r = admin
        .create_topics(&new, &AdminOptions::new().request_timeout(Some(TIMEOUT)))
        .await
        .unwrap();
    assert!(r.iter().all(Result::is_ok), "{r:?}");
    (broker, config)
}

/// Runs a test's checks in a task, then stops the push loops and the
/// dispatcher, whether the checks passed or not, before the caller's broker
/// is killed: a dispatcher left running when its broker dies blocks the
/// runtime's shutdown in a synchronous group commit, so a failed check
/// would hang the test instead of failing it.
async fn checked(
    d: &Arc<Dispatcher>,
    pusher: Pusher,
    checks: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let outcome = tokio::spawn(checks).await;
    pusher.stop().await;
    d.shutdown().await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// `[[queue]]` `name` on topic `push-<name>` pushing to `target` (a
/// `url = ...` or `grpc = ...` line), with a 1 s push timeout and tiers
/// 1 s, 2 s and 5 s.
fn pushed_queue(name: &str, target: &str, extra_push: &str) -> String {
    format!(
        "[[queue]]\nname = \"{name}\"\ntopic = \"push-{name}\"\ngroup = \"push-{name}-dispatcher\"\n\
         retry_tiers = [\"1s\", \"2s\", \"5s\"]\n\
         [queue.push]\n{target}\ntimeout = \"1s\"\nconcurrency = 4\n{extra_push}\n"
    )
}

async fn produce(d: &Dispatcher, queue: &str, ids: &[String]) {
    let messages = ids
        .iter()
        .map(|id| NewMessage {
            message_id: Some(id.clone()),
            key: Some(b"customer 7".to_vec()),
            payload: format!("payload of {id}").into_bytes(),
            headers: vec![("Trace".into(), b"t-1".to_vec())],
            delay: None,
        })
        .collect();
    let results = d.produce(queue, messages).await.unwrap();
    assert!(results.iter().all(|r| r.status == ProduceStatus::Accepted));
}

/// Waits until the queue has nothing left: no depth, nothing in flight or
/// in a retry tier.
async fn wait_drained(d: &Dispatcher, queue: &str) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let s = d.stats(queue).await.unwrap();
        if s.depth == 0 && s.in_flight == 0 && s.retry_depth == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{queue} not drained within {TIMEOUT:?}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The DLQ records of `topic` (one partition), waiting for `want`.
fn dlq(config: &Config, topic: &str, want: usize) -> Vec<RetryEnvelope> {
    let got: Vec<RetryEnvelope> = common::read_all(config, topic, 1, want)
        .iter()
        .map(common::envelope_of)
        .collect();
    assert_eq!(got.len(), want, "{topic}: DLQ records");
    got
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// Checks the outcome queues `ok`, `bad`, `fail`, `slow` and `busy` after
/// one message each was pushed to an endpoint answering by
/// [`outcome_rule`]. `dlq_error` is the history text of the refusal.
async fn check_outcomes(d: &Dispatcher, config: &Config, log: &Log, dlq_error: &str) {
    // 2xx/OK: acked, once.
    let ok = log.wait_for("ok", 1).await;
    assert_eq!((ok[0].message_id.as_str(), ok[0].attempt), ("ok-0", 1));
    assert_eq!(ok[0].payload, b"payload of ok-0");
    wait_drained(d, "ok").await;
    assert_eq!(log.of("ok").len(), 1, "an acked message is not sent again");

    // A permanent refusal: the DLQ at once, with the answer in the history.
    let dead = dlq(config, "push-bad.dlq", 1);
    assert_eq!(dead[0].message_id, "bad-0");
    assert_eq!(dead[0].attempt.0, 1, "dead-lettered after one attempt");
    assert_eq!(dead[0].errors.len(), 1);
    assert_eq!(dead[0].errors[0].error, dlq_error);
    assert!(dead[0].errors[0]
        .consumer
        .as_deref()
        .is_some_and(|c| c.starts_with("push:")));
    wait_drained(d, "bad").await;
    assert_eq!(log.of("bad").len(), 1);

    // A retryable failure and a timeout: attempt 2 from the first tier.
    for route in ["fail", "slow"] {
        let seen = log.wait_for(route, 2).await;
        assert_eq!(
            seen.iter().map(|s| s.attempt).collect::<Vec<_>>(),
            [1, 2],
            "{route}"
        );
        assert_eq!(seen[1].message_id, format!("{route}-0"));
        assert!(
            seen[1].at - seen[0].at >= Duration::from_secs(1),
            "{route}: retried through the 1 s tier"
        );
        wait_drained(d, route).await;
        assert_eq!(log.of(route).len(), 2, "{route}: acked on attempt 2");
    }

    // Retry-After: 3 -> not before 3 s (the 5 s tier, the first that long),
    // where the attempt's own tier would have been 1 s.
    let busy = log.wait_for("busy", 2).await;
    assert_eq!(busy[1].attempt, 2);
    let gap = busy[1].at - busy[0].at;
    assert!(
        gap >= Duration::from_secs(3),
        "redelivered {gap:?} after a Retry-After of 3 s"
    );
    wait_drained(d, "busy").await;
    for q in ["ok", "bad", "fail", "slow", "busy"] {
        assert_eq!(
            d.stats(q).await.unwrap().dlq_depth,
            (q == "bad") as i64,
            "{q}"
        );
    }
}

const OUTCOME_QUEUES: [&str; 5] = ["ok", "bad", "fail", "slow", "busy"];

fn outcome_topics() -> Vec<String> {
    OUTCOME_QUEUES.iter().map(|q| format!("push-{q}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_answers_ack_dead_letter_or_retry_the_message() {
    let endpoint = http_endpoint(outcome_rule).await;
    let queues: String = OUTCOME_QUEUES
        .iter()
        .map(|q| {
            let url = format!("url = \"http://{}/{q}\"", endpoint.addr);
            pushed_queue(q, &url, "breaker_failures = 100")
        })
        .collect();
    let topics = outcome_topics();
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    let (_broker, config) = setup(45200, &topics, &queues).await;
    let d = Dispatcher::start(&config).await.unwrap();
    let pusher = Pusher::start(Arc::clone(&d), &config.queues).unwrap();
    let checks = {
        let d = Arc::clone(&d);
        let config = config.clone();
        async move {
            for q in OUTCOME_QUEUES {
                produce(&d, q, &ids(q, 1)).await;
            }
            check_outcomes(
                &d,
                &config,
                &endpoint.log,
                "push: HTTP 400 Bad Request: no such order",
            )
            .await;

            // The metadata headers of an HTTP push.
            let ok = &endpoint.log.of("ok")[0];
            let header = |name: &str| {
                ok.headers
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.as_str())
            };
            assert_eq!(header("dispatcher-queue"), Some("ok"));
            assert_eq!(header("dispatcher-message-id"), Some("ok-0"));
            assert_eq!(header("dispatcher-attempt"), Some("1"));
            assert_eq!(header("dispatcher-partition"), Some("0"));
            assert_eq!(header("dispatcher-offset"), Some("0"));
            assert_eq!(header("dispatcher-key"), Some("customer%207"));
            assert_eq!(header("dispatcher-header-trace"), Some("t-1"));
            assert_eq!(header("content-type"), Some("application/octet-stream"));
            assert!(header("dispatcher-enqueued-at").is_some_and(|t| t.ends_with('Z')));

            // Each answer was counted by outcome.
            for (q, outcome, n) in [
                ("ok", "ack", 1.0),
                ("bad", "dlq", 1.0),
                ("fail", "retry", 1.0),
                ("fail", "ack", 1.0),
                ("slow", "timeout", 1.0),
                ("busy", "retry", 1.0),
            ] {
                let url = format!("http://{}/{q}", endpoint.addr);
                let labels = [
                    ("queue", q),
                    ("endpoint", url.as_str()),
                    ("outcome", outcome),
                ];
                assert_eq!(
                    metric("dispatcher_push_requests_total", &labels),
                    n,
                    "{labels:?}\n{}",
                    metrics().render()
                );
            }
        }
    };
    checked(&d, pusher, checks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_statuses_ack_dead_letter_or_retry_the_message() {
    let (log, addr) = grpc_endpoint(outcome_rule).await;
    let queues: String = OUTCOME_QUEUES
        .iter()
        .map(|q| pushed_queue(q, &format!("grpc = \"{addr}\""), "breaker_failures = 100"))
        .collect();
    let topics = outcome_topics();
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    let (_broker, config) = setup(45202, &topics, &queues).await;
    let d = Dispatcher::start(&config).await.unwrap();
    let pusher = Pusher::start(Arc::clone(&d), &config.queues).unwrap();
    let checks = {
        let d = Arc::clone(&d);
        let config = config.clone();
        async move {
            for q in OUTCOME_QUEUES {
                produce(&d, q, &ids(q, 1)).await;
            }
            check_outcomes(
                &d,
                &config,
                &log,
                "push: gRPC InvalidArgument: no such order",
            )
            .await;
            let ok = &log.of("ok")[0];
            assert_eq!(ok.headers, [("Trace".to_owned(), "t-1".to_owned())]);
        }
    };
    checked(&d, pusher, checks).await;
}

/// The breaker test's endpoint fails until this instant (set by the test).
static FAIL_UNTIL: Mutex<Option<Instant>> = Mutex::new(None);

fn failing_then_recovered(_route: &str, _attempt: u32) -> Answer {
    let failing = FAIL_UNTIL
        .lock()
        .unwrap()
        .is_some_and(|until| Instant::now() < until);
    if failing {
        Answer {
            body: "maintenance",
            ..answer(503)
        }
    } else {
        answer(200)
    }
}

/// How long the breaker test's endpoint fails: the 30 s, with short
/// cool-downs (0.5 s doubling up to 2 s) so the breaker opens, probes and
/// reopens many times before it closes.
const FAILING_FOR: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_endpoint_opens_the_breaker_and_nothing_is_lost_when_it_recovers() {
    let endpoint = http_endpoint(failing_then_recovered).await;
    let url = format!("url = \"http://{}/flaky\"", endpoint.addr);
    let queue = pushed_queue(
        "flaky",
        &url,
        "breaker_failures = 3\nbreaker_cooldown = \"500ms\"\nbreaker_cooldown_max = \"2s\"",
    )
    // Enough attempts that the probes cannot use a message up.
    .replace("retry_tiers =", "max_attempts = 30\nretry_tiers =");
    let (_broker, config) = setup(45204, &["push-flaky"], &queue).await;
    let d = Dispatcher::start(&config).await.unwrap();
    *FAIL_UNTIL.lock().unwrap() = Some(Instant::now() + FAILING_FOR);
    let pusher = Pusher::start(Arc::clone(&d), &config.queues).unwrap();
    let checks = {
        let d = Arc::clone(&d);
        async move {
            let messages = ids("m", 40);
            produce(&d, "flaky", &messages).await;

            let url = format!("http://{}/flaky", endpoint.addr);
            let transitions = |to: &str| {
                metric(
                    "dispatcher_push_breaker_transitions_total",
                    &[("queue", "flaky"), ("endpoint", &url), ("to", to)],
                )
            };
            // Every message answered 2xx once.
            let deadline = Instant::now() + FAILING_FOR + TIMEOUT;
            loop {
                let delivered: BTreeSet<String> = endpoint
                    .log
                    .of("flaky")
                    .into_iter()
                    .filter(|s| s.answered == 200)
                    .map(|s| s.message_id)
                    .collect();
                if delivered.len() == messages.len() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{} of {} delivered",
                    delivered.len(),
                    messages.len()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            wait_drained(&d, "flaky").await;
            let seen = endpoint.log.of("flaky");
            let failed = seen.iter().filter(|s| s.answered == 503).count();
            let mut per_message: HashMap<&str, usize> = HashMap::new();
            for s in seen.iter().filter(|s| s.answered == 200) {
                *per_message.entry(s.message_id.as_str()).or_default() += 1;
            }
            assert!(
                per_message.values().all(|&n| n == 1),
                "acked once each: {per_message:?}"
            );
            assert_eq!(
                d.stats("flaky").await.unwrap().dlq_depth,
                0,
                "nothing dead-lettered"
            );

            // The breaker opened (more than once: failed probes reopen it), probed
            // and closed, and is closed now.
            assert!(
                transitions("open") >= 2.0,
                "opened and reopened: {}",
                transitions("open")
            );
            assert!(transitions("half_open") >= 2.0);
            assert_eq!(transitions("closed"), 1.0);
            assert_eq!(
                metric(
                    "dispatcher_push_breaker_state",
                    &[("queue", "flaky"), ("endpoint", &url)]
                ),
                0.0
            );
            // While open, the endpoint was left alone: without the breaker each of
            // the 40 messages would fail every 1-5 s through the tiers for 30 s
            // (hundreds of requests). With it: the opening failures, the one probe
            // per cool-down (at most 2 s: 15 in 30 s), and the few in flight when
            // it opened.
            eprintln!("{failed} requests reached the failing endpoint");
            assert!(
                failed <= 40,
                "{failed} requests reached the failing endpoint"
            );
        }
    };
    checked(&d, pusher, checks).await;
}

fn always_ok(_route: &str, _attempt: u32) -> Answer {
    answer(200)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_pushes_nothing_until_resumed() {
    let endpoint = http_endpoint(always_ok).await;
    let url = format!("url = \"http://{}/held\"", endpoint.addr);
    let (_broker, config) = setup(45206, &["push-held"], &pushed_queue("held", &url, "")).await;
    let d = Dispatcher::start(&config).await.unwrap();
    let pusher = Pusher::start(Arc::clone(&d), &config.queues).unwrap();
    let checks = {
        let d = Arc::clone(&d);
        async move {
            produce(&d, "held", &ids("before", 1)).await;
            endpoint.log.wait_for("held", 1).await;
            d.set_paused("held", true).await.unwrap();
            // Producers are not stopped.
            produce(&d, "held", &ids("during", 3)).await;
            tokio::time::sleep(Duration::from_secs(4)).await;
            assert_eq!(
                endpoint.log.of("held").len(),
                1,
                "nothing pushed while paused"
            );
            let stats = d.stats("held").await.unwrap();
            assert!(stats.paused);
            assert_eq!(stats.depth, 3);
            d.set_paused("held", false).await.unwrap();
            let seen = endpoint.log.wait_for("held", 4).await;
            let after: BTreeSet<&str> = seen[1..].iter().map(|s| s.message_id.as_str()).collect();
            assert_eq!(after, BTreeSet::from(["during-0", "during-1", "during-2"]));
            wait_drained(&d, "held").await;
        }
    };
    checked(&d, pusher, checks).await;
}

/// Kills the dispatcher binary if the test fails before it stops.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The binary starts the push loop of a configured queue, reports it in
/// `/metrics`, and stops cleanly on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_pushes_a_configured_queue() {
    let endpoint = http_endpoint(always_ok).await;
    // The config `setup` parses only serves to create the topic; the binary
    // gets its own file.
    let (broker, _) = setup(
        45208,
        &["push-e2e"],
        &pushed_queue("e2e", "url = \"http://x/\"", ""),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dispatcher.toml");
    let queue = pushed_queue(
        "e2e",
        &format!("url = \"http://{}/e2e\"", endpoint.addr),
        "",
    );
    std::fs::write(
        &path,
        format!(
            "bootstrap_servers = \"{}\"\nhttp_listen = \"127.0.0.2:45209\"\n\
             grpc_listen = \"127.0.0.2:45210\"\ninternal_listen = \"127.0.0.3:45209\"\n\
             receipt_secret = \"0123456789abcdef\"\n{queue}",
            broker.addr
        ),
    )
    .unwrap();
    let mut running = Running(
        std::process::Command::new(env!("CARGO_BIN_EXE_dispatcher"))
            .args(["--config", path.to_str().unwrap()])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let base = "http://127.0.0.2:45209";
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let produced = http
            .post(format!("{base}/queues/e2e/messages"))
            .json(&serde_json::json!({"messages": [{"message_id": "e2e-1", "payload": "hi"}]}))
            .send()
            .await;
        if produced.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        assert!(
            running.0.try_wait().unwrap().is_none(),
            "the dispatcher exited early"
        );
        assert!(
            Instant::now() < deadline,
            "no produce accepted within {TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let seen = endpoint.log.wait_for("e2e", 1).await;
    assert_eq!(
        (seen[0].message_id.as_str(), seen[0].payload.as_slice()),
        ("e2e-1", &b"hi"[..])
    );
    let series = format!(
        "dispatcher_push_requests_total{{queue=\"e2e\",endpoint=\"http://{}/e2e\",outcome=\"ack\"}} 1",
        endpoint.addr
    );
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let text = common::metrics(&http, base).await;
        if text.lines().any(|l| l == series) {
            assert!(text.contains("dispatcher_push_breaker_state{queue=\"e2e\""));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{series} not in /metrics:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &running.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = running.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "no stop within {TIMEOUT:?} of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "clean exit on SIGTERM: {status}");
    assert_eq!(endpoint.log.of("e2e").len(), 1, "pushed once");
}
