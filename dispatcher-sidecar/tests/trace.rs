//! Issue 8, tracing: `GET /messages/{message_id}`, gRPC `Trace` and
//! `dispatcher trace` against our broker, through the `dispatcher` binary (the index must
//! outlive the process that wrote it). Ports 45400-45449.

mod common;

use common::Instance;

use std::process::Command;
use std::time::{Duration, Instant};

use dispatcher_sidecar::api::grpc::proto;
use dispatcher_sidecar::api::grpc::proto::dispatcher_client::DispatcherClient;
use dispatcher_sidecar::kafka;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{json, Value};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A broker on `port` with topic `topic` (one partition), and the config
/// of a dispatcher serving queue `tr` on it: 1 s and 2 s tiers, three
/// attempts, a 30 s lease.
async fn setup(port: u16, topic: &str) -> (common::Broker, String) {
    setup_with(port, topic, 1).await
}

async fn setup_with(port: u16, topic: &str, partitions: i32) -> (common::Broker, String) {
    setup_tiers(port, topic, partitions, "[\"1s\", \"2s\"]").await
}

async fn setup_tiers(
    port: u16,
    topic: &str,
    partitions: i32,
    tiers: &str,
) -> (common::Broker, String) {
    let broker = common::Broker::start(port);
    let config = client_config(&broker);
    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(&config).create().unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().request_timeout(Some(TIMEOUT)),
        )
        .await
        .unwrap();
    assert!(created[0].is_ok(), "{created:?}");
    let queue = format!(
        "[[queue]]\nname = \"tr\"\ntopic = \"{topic}\"\ngroup = \"{topic}-dispatcher\"\n\
         lease = \"30s\"\nretry_tiers = {tiers}\nmax_attempts = 3\n"
    );
    (broker, queue)
}

/// A config for this broker's plain Kafka clients (the queue is unused).
fn client_config(broker: &common::Broker) -> dispatcher_sidecar::config::Config {
    broker.config("[[queue]]\nname = \"unused\"\ntopic = \"unused\"\n")
}

/// Starts the binary with HTTP on `port` and gRPC on `port + 1`; returns
/// once it answers `/healthz`.
async fn start(broker: &common::Broker, dir: &std::path::Path, queue: &str, port: u16) -> Instance {
    let instance = broker.dispatcher(dir, &format!("d{port}"), port, queue);
    let http = client();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Ok(r) = http.get(format!("{}/healthz", instance.http)).send().await {
            if r.status().is_success() {
                return instance;
            }
        }
        assert!(Instant::now() < deadline, "the dispatcher did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn post(i: &Instance, path: &str, body: Value) -> Value {
    let url = format!("{}{path}", i.http);
    let r = client().post(&url).json(&body).send().await.unwrap();
    assert!(r.status().is_success(), "POST {url}: {}", r.status());
    r.json().await.unwrap()
}

/// `GET /messages/{id}`: (status code, body).
async fn trace(i: &Instance, id: &str) -> (u16, Value) {
    let mut url = reqwest::Url::parse(&format!("{}/messages/", i.http)).unwrap();
    url.path_segments_mut().unwrap().pop_if_empty().push(id);
    let r = client().get(url).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// Receives one message as `consumer`, waiting for it (retry tiers hold
/// messages until due).
async fn receive_one(i: &Instance, consumer: &str) -> Value {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let got = post(
            i,
            "/queues/tr/receive",
            json!({ "max_messages": 1, "wait_seconds": 2, "consumer_id": consumer }),
        )
        .await;
        if let Some(m) = got["messages"].as_array().and_then(|m| m.first()) {
            return m.clone();
        }
        assert!(Instant::now() < deadline, "{consumer} received nothing");
    }
}

/// The trace's state, polled until `done` holds for it.
async fn trace_until(i: &Instance, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let (status, body) = trace(i, id).await;
        if status == 200 && done(&body["traces"][0]) {
            return body["traces"][0].clone();
        }
        assert!(Instant::now() < deadline, "trace of {id}: {status} {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_nacked_twice_then_dead_lettered_shows_every_step_in_order() {
    let (broker, queue) = setup(45400, "trdlq").await;
    let dir = tempfile::tempdir().unwrap();
    let d = start(&broker, dir.path(), &queue, 45401).await;
    let produced = post(
        &d,
        "/queues/tr/messages",
        json!({ "messages": [{ "message_id": "order-17", "payload": "p" }] }),
    )
    .await;
    assert_eq!(produced["results"][0]["offset"], 0, "{produced}");
    for (consumer, error) in [("w1", "e1"), ("w2", "e2"), ("w3", "e3")] {
        let m = receive_one(&d, consumer).await;
        assert_eq!(m["message_id"], "order-17");
        let nacked = post(
            &d,
            "/queues/tr/nack",
            json!({ "receipt": m["receipt"], "error": error }),
        )
        .await;
        assert_eq!(nacked["status"], "ok");
    }
    let t = trace_until(&d, "order-17", |t| t["state"]["status"] == "dead_lettered").await;
    let events = t["events"].as_array().unwrap();
    let steps: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap().to_owned(),
                e["topic"]
                    .as_str()
                    .or(e["consumer"].as_str())
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    let s = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    assert_eq!(
        steps,
        vec![
            s("produced", "trdlq"),
            s("delivery_failed", "w1"),
            s("retried", "trdlq.retry.1s"),
            s("delivery_failed", "w2"),
            s("retried", "trdlq.retry.2s"),
            s("delivery_failed", "w3"),
            s("dead_lettered", "trdlq.dlq"),
        ],
        "{t}"
    );
    assert_eq!(
        (
            events[0]["partition"].as_i64(),
            events[0]["offset"].as_i64()
        ),
        (Some(0), Some(0))
    );
    for (i, (attempt, error)) in [(1, "e1"), (2, "e2"), (3, "e3")].into_iter().enumerate() {
        let failed = &events[1 + 2 * i];
        assert_eq!(failed["attempt"], attempt, "{failed}");
        assert_eq!(failed["error"], error, "{failed}");
    }
    for e in [&events[2], &events[4], &events[6]] {
        assert!(e["partition"].is_i64() && e["offset"].is_i64(), "{e}");
    }
    let times: Vec<i64> = events
        .iter()
        .map(|e| parse_time(e["at"].as_str().unwrap()))
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert_eq!(t["state"]["location"]["kind"], "dlq");
    assert_eq!(t["state"]["location"]["topic"], "trdlq.dlq");

    // The gRPC Trace carries the same path and state.
    let mut grpc = DispatcherClient::connect(d.grpc.clone()).await.unwrap();
    let answer = grpc
        .trace(proto::TraceRequest {
            message_id: "order-17".into(),
            queue: Some("tr".into()),
        })
        .await
        .unwrap()
        .into_inner();
    let [g] = answer.traces.as_slice() else {
        panic!("one trace: {answer:?}")
    };
    use proto::TraceEventKind as K;
    let kinds: Vec<K> = g.events.iter().map(|e| e.event()).collect();
    assert_eq!(
        kinds,
        [
            K::Produced,
            K::DeliveryFailed,
            K::Retried,
            K::DeliveryFailed,
            K::Retried,
            K::DeliveryFailed,
            K::DeadLettered
        ]
    );
    let at: Vec<Option<i64>> = g.events.iter().map(|e| Some(e.at_ms)).collect();
    let http_at: Vec<Option<i64>> = events
        .iter()
        .map(|e| dispatcher_sidecar::redrive::parse_time(e["at"].as_str().unwrap()))
        .collect();
    assert_eq!(at, http_at);
    for (e, he) in g.events.iter().zip(events) {
        assert_eq!(e.topic.as_deref(), he["topic"].as_str(), "{he}");
        assert_eq!(e.offset, he["offset"].as_i64(), "{he}");
        assert_eq!(e.attempt.map(u64::from), he["attempt"].as_u64(), "{he}");
        assert_eq!(e.consumer.as_deref(), he["consumer"].as_str(), "{he}");
        assert_eq!(e.error.as_deref(), he["error"].as_str(), "{he}");
    }
    let state = g.state.as_ref().unwrap();
    assert_eq!(state.status(), proto::MessageStatus::DeadLettered);
    let place = state.location.as_ref().unwrap();
    assert_eq!(
        (place.kind(), place.topic.as_str()),
        (proto::LocationKind::Dlq, "trdlq.dlq")
    );
    let unknown = grpc
        .trace(proto::TraceRequest {
            message_id: "never-produced".into(),
            queue: None,
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_from_a_plain_client_acked_is_traced_as_acked() {
    let (broker, queue) = setup(45405, "trplain").await;
    let producer: FutureProducer = kafka::admin_config(&client_config(&broker))
        .create()
        .unwrap();
    let (partition, offset) = producer
        .send(
            FutureRecord::<(), _>::to("trplain").payload("plain"),
            Duration::from_secs(10),
        )
        .await
        .map(|d| (d.partition, d.offset))
        .unwrap();
    let id = format!("trplain-{partition}-{offset}");
    let dir = tempfile::tempdir().unwrap();
    let d = start(&broker, dir.path(), &queue, 45406).await;
    let m = receive_one(&d, "w1").await;
    assert_eq!(m["message_id"], id.as_str());
    let before = trace_until(&d, &id, |_| true).await;
    assert_eq!(before["state"]["status"], "in_flight", "{before}");
    let acked = post(&d, "/queues/tr/ack", json!({ "receipts": [m["receipt"]] })).await;
    assert_eq!(acked["results"][0]["status"], "ok");
    // Once committed, the commit is the evidence.
    let t = trace_until(&d, &id, |t| {
        t["state"]["committed_offset"].as_i64() > Some(offset)
    })
    .await;
    assert_eq!(t["state"]["status"], "acked", "{t}");
    assert_eq!(t["events"].as_array().unwrap().len(), 1, "{t}");
    assert_eq!(t["events"][0]["event"], "produced");
    assert_eq!(t["events"][0]["offset"], offset);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_in_flight_names_its_consumer_and_lease_expiry() {
    let (broker, queue) = setup(45410, "trfly").await;
    let dir = tempfile::tempdir().unwrap();
    let d = start(&broker, dir.path(), &queue, 45411).await;
    post(
        &d,
        "/queues/tr/messages",
        json!({ "messages": [{ "payload": "p" }] }),
    )
    .await;
    let m = receive_one(&d, "worker-9").await;
    let id = m["message_id"].as_str().unwrap();
    let t = trace_until(&d, id, |_| true).await;
    let state = &t["state"];
    assert_eq!(state["status"], "in_flight", "{t}");
    assert_eq!(state["consumer"], "worker-9", "{t}");
    assert_eq!(state["attempt"], 1, "{t}");
    assert_eq!(state["lease_expires_at"], m["lease_expires_at"], "{t}");
    assert_eq!(state["source"], "owner", "{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_id_is_404_and_an_invalid_one_400() {
    let (broker, queue) = setup(45415, "trnone").await;
    let dir = tempfile::tempdir().unwrap();
    let d = start(&broker, dir.path(), &queue, 45416).await;
    post(
        &d,
        "/queues/tr/messages",
        json!({ "messages": [{ "message_id": "known", "payload": "p" }] }),
    )
    .await;
    let (status, body) = trace(&d, "never-produced").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_message", "{body}");
    // A derived id of an offset that holds nothing is unknown too.
    let (status, _) = trace(&d, "trnone-0-99").await;
    assert_eq!(status, 404);
    let (status, body) = trace(&d, &"x".repeat(300)).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_argument", "{body}");
    let (status, body) = trace(&d, "a\u{1}b").await;
    assert_eq!(status, 400, "{body}");
    let r = client()
        .get(format!("{}/messages/known?queue=nope", d.http))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let (status, body) = trace(&d, "known").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["traces"][0]["state"]["status"], "queued", "{body}");
    // Lookups and index writes are counted.
    let metrics = common::metrics(&client(), &d.http).await;
    let value = |name: &str, result: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter(|l| l.contains("queue=\"tr\"") && l.contains(&format!("result=\"{result}\"")))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(
        value("dispatcher_trace_index_writes_total", "ok"),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        value("dispatcher_trace_lookups_total", "not_found"),
        2.0,
        "{metrics}"
    );
    assert_eq!(
        value("dispatcher_trace_lookups_total", "found"),
        1.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_outlives_the_instance_that_wrote_it() {
    let (broker, queue) = setup(45420, "trkeep").await;
    let dir = tempfile::tempdir().unwrap();
    let first = start(&broker, dir.path(), &queue, 45421).await;
    post(
        &first,
        "/queues/tr/messages",
        json!({ "messages": [{ "message_id": "keep-1", "payload": "p" }] }),
    )
    .await;
    let m = receive_one(&first, "w1").await;
    post(
        &first,
        "/queues/tr/nack",
        json!({ "receipt": m["receipt"], "error": "bad input", "permanent": true }),
    )
    .await;
    trace_until(&first, "keep-1", |t| {
        t["state"]["status"] == "dead_lettered"
    })
    .await;
    drop(first); // SIGKILL: nothing is flushed at exit
    let second = start(&broker, dir.path(), &queue, 45423).await;
    let t = trace_until(&second, "keep-1", |_| true).await;
    assert_eq!(t["state"]["status"], "dead_lettered", "{t}");
    let kinds: Vec<&str> = t["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["produced", "delivery_failed", "dead_lettered"],
        "{t}"
    );
    assert_eq!(t["events"][1]["error"], "bad input");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_prints_the_path() {
    let (broker, queue) = setup(45425, "trcli").await;
    let dir = tempfile::tempdir().unwrap();
    let d = start(&broker, dir.path(), &queue, 45426).await;
    post(
        &d,
        "/queues/tr/messages",
        json!({ "messages": [{ "message_id": "cli-1", "payload": "p" }] }),
    )
    .await;
    let m = receive_one(&d, "w1").await;
    post(
        &d,
        "/queues/tr/nack",
        json!({ "receipt": m["receipt"], "error": "too soon" }),
    )
    .await;
    trace_until(&d, "cli-1", |t| t["events"].as_array().unwrap().len() == 3).await;
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
            .arg("trace")
            .args(args)
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let url = d.http.as_str();
    let (code, out, err) = run(&["cli-1", "--url", url]);
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "message cli-1 in queue tr", "{out}");
    assert!(
        lines[1].ends_with("produced to trcli partition 0 offset 0"),
        "{out}"
    );
    assert!(
        lines[2].ends_with("delivery failed: attempt 1, consumer w1, error: too soon"),
        "{out}"
    );
    assert!(
        lines[3].contains("copied to retry tier trcli.retry.1s partition 0"),
        "{out}"
    );
    assert!(lines[4].starts_with("  now: "), "{out}");
    let (code, out, _) = run(&["cli-1", "--url", url, "--queue", "tr", "--json"]);
    assert_eq!(code, Some(0));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["traces"][0]["message_id"], "cli-1");
    let (code, _, err) = run(&["nobody", "--url", url]);
    assert_eq!(code, Some(1));
    assert!(err.contains("HTTP 404"), "{err}");
    let (code, _, _) = run(&[]);
    assert_eq!(code, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_instance_answers_with_the_owners_view() {
    let (broker, queue) = setup_with(45430, "trtwo", 2).await;
    let dir = tempfile::tempdir().unwrap();
    let a = start(&broker, dir.path(), &queue, 45431).await;
    let b = start(&broker, dir.path(), &queue, 45433).await;
    // Both own one partition (the group settled).
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut owned = Vec::new();
        for i in [&a, &b] {
            let stats: Value = client()
                .get(format!("{}/queues/tr", i.http))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            owned.push(stats["partitions"].as_array().map_or(0, Vec::len));
        }
        if owned == [1, 1] {
            break;
        }
        assert!(Instant::now() < deadline, "owned {owned:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let messages: Vec<Value> = (0..10)
        .map(|i| json!({ "key": format!("k{i}"), "payload": "p" }))
        .collect();
    post(&a, "/queues/tr/messages", json!({ "messages": messages })).await;
    let m = receive_one(&a, "worker-a").await;
    let id = m["message_id"].as_str().unwrap();
    // B does not own the partition: its own view rests on the commit ...
    let local: Value = client()
        .get(format!("{}/internal/messages/{id}", b.internal))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        local["traces"][0]["state"]["status"], "not_acked",
        "{local}"
    );
    assert_eq!(local["traces"][0]["state"]["source"], "commit", "{local}");
    // ... and its public answer is the owner's.
    let (status, body) = trace(&b, id).await;
    assert_eq!(status, 200, "{body}");
    let state = &body["traces"][0]["state"];
    assert_eq!(state["status"], "in_flight", "{body}");
    assert_eq!(state["consumer"], "worker-a", "{body}");
    assert_eq!(state["source"], "owner", "{body}");
    // Acked and committed: B's own view has the commit as evidence.
    post(&a, "/queues/tr/ack", json!({ "receipts": [m["receipt"]] })).await;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let local: Value = client()
            .get(format!("{}/internal/messages/{id}", b.internal))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let state = &local["traces"][0]["state"];
        if state["status"] == "acked" {
            assert_eq!(state["source"], "commit", "{local}");
            assert!(
                state["committed_offset"].as_i64() > m["offset"].as_i64(),
                "{local}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "{local}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_message_waits_on_its_tier_until_due() {
    let (broker, queue) = setup_tiers(45435, "trwait", 1, "[\"1m\"]").await;
    let dir = tempfile::tempdir().unwrap();
    let d = start(&broker, dir.path(), &queue, 45436).await;
    post(
        &d,
        "/queues/tr/messages",
        json!({ "messages": [{ "message_id": "later", "payload": "p" }] }),
    )
    .await;
    let m = receive_one(&d, "w1").await;
    post(
        &d,
        "/queues/tr/nack",
        json!({ "receipt": m["receipt"], "error": "busy" }),
    )
    .await;
    // The tier's partition is served here once assigned and fetched.
    let t = trace_until(&d, "later", |t| t["state"]["status"] == "waiting").await;
    let state = &t["state"];
    assert_eq!(state["location"]["kind"], "retry", "{t}");
    assert_eq!(state["location"]["topic"], "trwait.retry.1m", "{t}");
    assert_eq!(state["source"], "owner", "{t}");
    assert_eq!(state["attempt"], 2, "{t}");
    let due = parse_time(state["due_at"].as_str().unwrap());
    let failed = parse_time(t["events"][1]["at"].as_str().unwrap());
    assert!(due > failed, "{t}");
}

/// Milliseconds of an RFC 3339 time the API writes (`...T..:..:..mmmZ`).
fn parse_time(text: &str) -> i64 {
    let (date, time) = text.split_once('T').unwrap();
    let day: i64 = date.replace('-', "").parse().unwrap();
    let t = time.trim_end_matches('Z').replace([':', '.'], "");
    day * 1_000_000_000 + t.parse::<i64>().unwrap()
}
