//! Redrive jobs (issue 8) against our broker: a redriven message comes back
//! as attempt 1 with its history, the rate, the filters and `max_messages`,
//! pause, resume, cancel and the one-job rule, no second redrive of the same
//! DLQ record (also across a restart), and bad input. Each test has its own
//! broker and topics; ports 45350-45399.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{envelope_of, read_all, Broker, Instance};
use dispatcher_sidecar::config::Config;
use dispatcher_sidecar::forward::Forwarding;
use dispatcher_sidecar::kafka;
use dispatcher_sidecar::queue::Dispatcher;
use dispatcher_sidecar::redrive::{
    JobState, RedriveAction, RedriveError, RedriveFilter, RedriveJob, RedriveRequest,
    REDRIVEN_MS_HEADER, REDRIVE_JOB_HEADER,
};
use dispatcher_sidecar::service::{
    Delivery, NackRequest, NewMessage, ProduceStatus, QueueService, ReceiptOutcome, ReceiveRequest,
};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::{Headers, Message, OwnedMessage};
use serde_json::{json, Value};

const TIMEOUT: Duration = Duration::from_secs(30);
const Q: &str = "jobs";

/// A broker on `port` and a config with queue `jobs` on a new topic `topic`.
async fn setup(port: u16, topic: &str, partitions: i32) -> (Broker, Config) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let broker = Broker::start(port);
    let config = broker.config(&format!(
        "[[queue]]\nname = \"{Q}\"\ntopic = \"{topic}\"\ngroup = \"{topic}-dispatcher\"\n\
         lease = \"30s\"\nretry_tiers = [\"1s\"]\n"
    ));
    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(&config).create().unwrap();
    let r = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().request_timeout(Some(TIMEOUT)),
        )
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    (broker, config)
}

fn message(id: &str, key: Option<&str>) -> NewMessage {
    NewMessage {
        message_id: Some(id.into()),
        key: key.map(|k| k.as_bytes().to_vec()),
        payload: format!("payload of {id}").into_bytes(),
        headers: vec![("trace".into(), id.as_bytes().to_vec())],
        delay: None,
    }
}

async fn receive_n(d: &Dispatcher, n: usize) -> Vec<Delivery> {
    let deadline = Instant::now() + TIMEOUT;
    let mut got = Vec::new();
    while got.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} messages within {TIMEOUT:?}",
            got.len()
        );
        let want = u32::try_from((n - got.len()).min(100)).unwrap();
        got.extend(
            d.receive(
                Q,
                ReceiveRequest {
                    max_messages: want,
                    wait: Duration::from_secs(2),
                    lease: None,
                    consumer: Some("worker".into()),
                },
            )
            .await
            .unwrap(),
        );
    }
    got
}

async fn nack_permanent(d: &Dispatcher, m: &Delivery, error: &str) {
    let outcome = d
        .nack(
            Q,
            NackRequest {
                receipt: m.receipt.clone(),
                retry_after: None,
                error: Some(error.into()),
                permanent: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(outcome, ReceiptOutcome::Ok);
}

/// Produces `messages`, receives them all and nacks each permanently with
/// `error(message id)`, in message-id order: the DLQ then holds them in
/// that order (per partition).
async fn dead_letter(d: &Dispatcher, messages: Vec<NewMessage>, error: impl Fn(&str) -> String) {
    let n = messages.len();
    for chunk in messages.chunks(500) {
        let results = d.produce(Q, chunk.to_vec()).await.unwrap();
        assert!(results.iter().all(|r| r.status == ProduceStatus::Accepted));
    }
    let mut got = receive_n(d, n).await;
    got.sort_by(|a, b| a.message_id.cmp(&b.message_id));
    for m in &got {
        nack_permanent(d, m, &error(&m.message_id)).await;
    }
}

/// Starts a job and waits until it has ended.
async fn run_job(d: &Dispatcher, request: RedriveRequest) -> RedriveJob {
    let job = d.redrive_start(Q, request).await.unwrap();
    wait_ended(d, &job.id).await
}

async fn wait_ended(d: &Dispatcher, id: &str) -> RedriveJob {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let job = d.redrive_status(Q).await.unwrap();
        assert_eq!(job.id, id);
        if !job.state.is_active() {
            return job;
        }
        assert!(
            Instant::now() < deadline,
            "job still {:?}: {job:?}",
            job.state
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn rate(rate_per_sec: f64) -> RedriveRequest {
    RedriveRequest {
        rate_per_sec,
        filter: None,
        max_messages: None,
    }
}

fn filtered(filter: RedriveFilter) -> RedriveRequest {
    RedriveRequest {
        filter: Some(filter),
        ..rate(1000.0)
    }
}

fn header<'a>(m: &'a OwnedMessage, name: &str) -> Option<&'a [u8]> {
    m.headers()?
        .iter()
        .filter(|h| h.key == name)
        .last()
        .and_then(|h| h.value)
}

/// The redriven copies in the primary topic (records with the job header),
/// among the `total` records expected there.
fn copies(config: &Config, topic: &str, partitions: i32, total: usize) -> Vec<OwnedMessage> {
    read_all(config, topic, partitions, total)
        .into_iter()
        .filter(|m| header(m, REDRIVE_JOB_HEADER).is_some())
        .collect()
}

/// Message ids of the copies a job wrote.
fn ids_of_job(copies: &[OwnedMessage], job: &str) -> BTreeSet<String> {
    copies
        .iter()
        .filter(|m| header(m, REDRIVE_JOB_HEADER) == Some(job.as_bytes()))
        .map(|m| envelope_of(m).message_id)
        .collect()
}

fn ids(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

async fn wait_dlq_depth(d: &Dispatcher, want: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let depth = d.stats(Q).await.unwrap().dlq_depth;
        if depth == want {
            return;
        }
        assert!(Instant::now() < deadline, "DLQ depth {depth}, want {want}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redriven_message_is_attempt_1_with_its_history_and_a_later_failure_appends() {
    let (_broker, config) = setup(45350, "rd-basic", 2).await;
    let d = Dispatcher::start(&config).await.unwrap();
    let messages: Vec<NewMessage> = (0..4)
        .map(|i| message(&format!("m{i}"), Some(&format!("k{i}"))))
        .collect();
    dead_letter(&d, messages, |id| format!("bad {id}")).await;
    let dlq = read_all(&config, "rd-basic.dlq", 2, 4);
    assert_eq!(dlq.len(), 4);
    let origin: BTreeMap<String, (i32, i64, i64)> = dlq
        .iter()
        .map(|m| {
            let e = envelope_of(m);
            (
                e.message_id,
                (e.origin_partition, e.origin_offset, e.first_enqueued_ms),
            )
        })
        .collect();
    wait_dlq_depth(&d, 4).await;

    let job = run_job(&d, rate(50.0)).await;
    assert_eq!(job.state, JobState::Done, "{job:?}");
    assert_eq!(
        (job.scanned, job.matched, job.redriven, job.skipped),
        (4, 4, 4, 0)
    );
    assert_eq!(job.remaining, 0);
    assert!(job.finished_at.is_some() && job.first_redriven_at.is_some());

    // The copies: origin partition, attempt 1, the history, the job's id.
    let copies = copies(&config, "rd-basic", 2, 8);
    assert_eq!(copies.len(), 4);
    for c in &copies {
        let e = envelope_of(c);
        let (partition, offset, enqueued) = origin[&e.message_id];
        assert_eq!(c.partition(), partition, "back to its origin partition");
        assert_eq!((e.origin_partition, e.origin_offset), (partition, offset));
        assert_eq!(e.attempt.0, 1);
        assert_eq!(e.due_ms, None);
        assert_eq!(e.first_enqueued_ms, enqueued);
        assert_eq!(e.errors.len(), 1);
        assert_eq!(e.errors[0].error, format!("bad {}", e.message_id));
        assert_eq!(header(c, REDRIVE_JOB_HEADER), Some(job.id.as_bytes()));
        let redriven_ms: i64 = std::str::from_utf8(header(c, REDRIVEN_MS_HEADER).unwrap())
            .unwrap()
            .parse()
            .unwrap();
        assert!((now_ms() - 60_000..=now_ms()).contains(&redriven_ms));
        assert_eq!(header(c, "trace"), Some(e.message_id.as_bytes()));
        assert_eq!(c.key(), Some(format!("k{}", &e.message_id[1..]).as_bytes()));
    }

    // Delivered again as first attempts, with their first-enqueued time.
    let mut again = receive_n(&d, 4).await;
    again.sort_by(|a, b| a.message_id.cmp(&b.message_id));
    for m in &again {
        assert_eq!(m.attempt, 1);
        assert_eq!(m.enqueued_at_ms, origin[&m.message_id].2);
        assert_eq!(
            m.headers,
            vec![("trace".to_owned(), m.message_id.as_bytes().to_vec())]
        );
    }
    // Everything in the DLQ was redriven: its depth starts at the floor.
    wait_dlq_depth(&d, 0).await;

    // A later failure appends to the kept history.
    nack_permanent(&d, &again[0], "worse").await;
    let dlq = read_all(&config, "rd-basic.dlq", 2, 5);
    let back = dlq
        .iter()
        .map(envelope_of)
        .find(|e| e.message_id == again[0].message_id && e.errors.len() == 2)
        .expect("the second DLQ copy");
    assert_eq!(back.errors[0].error, format!("bad {}", again[0].message_id));
    assert_eq!(back.errors[1].error, "worse");
    assert_eq!(back.attempt.0, 1);
    for m in &again[1..] {
        assert_eq!(
            d.ack(Q, std::slice::from_ref(&m.receipt)).await.unwrap(),
            [ReceiptOutcome::Ok]
        );
    }
    wait_dlq_depth(&d, 1).await;
    d.shutdown().await;
}

/// The rate is measured from the copies' `dispatcher.redriven-ms` headers
/// (stamped when a token is taken, just before the write): the first
/// second's copies are left out (a token bucket may burst up to one
/// second's worth), and the rest must come at 100/s ± 10%. The bucket
/// catches up after a stall shorter than a second, so a busy machine does
/// not slow the measured rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_at_100_per_second_stays_within_ten_percent() {
    let (_broker, config) = setup(45352, "rd-rate", 2).await;
    let d = Dispatcher::start(&config).await.unwrap();
    let messages: Vec<NewMessage> = (0..500)
        .map(|i| message(&format!("m{i:03}"), None))
        .collect();
    dead_letter(&d, messages, |_| "down".into()).await;

    let job = run_job(&d, rate(100.0)).await;
    assert_eq!((job.state, job.redriven), (JobState::Done, 500), "{job:?}");
    let copies = copies(&config, "rd-rate", 2, 1000);
    assert_eq!(copies.len(), 500);
    let mut stamps: Vec<i64> = copies
        .iter()
        .map(|c| {
            std::str::from_utf8(header(c, REDRIVEN_MS_HEADER).unwrap())
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    stamps.sort_unstable();
    let after_burst = &stamps[100..];
    let span_ms = after_burst.last().unwrap() - after_burst[0];
    let measured = (after_burst.len() - 1) as f64 * 1000.0 / span_ms as f64;
    eprintln!("redrive rate after the first second: {measured:.1}/s over {span_ms} ms");
    assert!(
        (90.0..=110.0).contains(&measured),
        "{measured:.1}/s over {span_ms} ms"
    );
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_pick_exactly_the_matching_messages_and_max_messages_stops_the_job() {
    let (_broker, config) = setup(45354, "rd-filter", 1).await;
    let d = Dispatcher::start(&config).await.unwrap();
    // m_i: key a (even) or b (odd); error "timeout" when i % 3 == 0.
    let key = |i: usize| if i.is_multiple_of(2) { "a" } else { "b" };
    let error = |id: &str| {
        let i: usize = id[1..].parse().unwrap();
        if i.is_multiple_of(3) {
            format!("timeout after 30s ({id})")
        } else {
            format!("HTTP 503 ({id})")
        }
    };
    let batch = |range: std::ops::Range<usize>| {
        range
            .map(|i| message(&format!("m{i}"), Some(key(i))))
            .collect::<Vec<_>>()
    };
    dead_letter(&d, batch(0..4), error).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mid_ms = now_ms();
    tokio::time::sleep(Duration::from_millis(50)).await;
    dead_letter(&d, batch(4..8), error).await;
    let rfc = |ms: i64| {
        // RFC 3339 with milliseconds, UTC.
        let secs = ms.div_euclid(1000);
        let days = secs.div_euclid(86_400);
        let (y, m, d) = civil(days);
        let s = secs.rem_euclid(86_400);
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
            s / 3600,
            s / 60 % 60,
            s % 60,
            ms.rem_euclid(1000)
        )
    };

    let job = run_job(
        &d,
        filtered(RedriveFilter {
            message_id: Some("m5".into()),
            ..RedriveFilter::default()
        }),
    )
    .await;
    assert_eq!((job.matched, job.redriven), (1, 1), "{job:?}");
    let by_id = job.id;

    let job = run_job(
        &d,
        filtered(RedriveFilter {
            key: Some("a".into()),
            error_contains: Some("timeout".into()),
            ..RedriveFilter::default()
        }),
    )
    .await;
    assert_eq!((job.matched, job.redriven), (2, 2), "{job:?}");
    let by_key_and_error = job.id;

    let job = run_job(
        &d,
        filtered(RedriveFilter {
            from: Some(rfc(mid_ms)),
            to: Some(rfc(now_ms() + 60_000)),
            ..RedriveFilter::default()
        }),
    )
    .await;
    // m4..m7, of which m5 and m6 were redriven already.
    // m0 is below the floor (redriven, and first in the partition).
    assert_eq!(
        (job.matched, job.redriven, job.skipped),
        (2, 2, 2),
        "{job:?}"
    );
    let by_time = job.id;

    let job = run_job(
        &d,
        RedriveRequest {
            max_messages: Some(2),
            ..filtered(RedriveFilter {
                to: Some(rfc(mid_ms)),
                ..RedriveFilter::default()
            })
        },
    )
    .await;
    assert_eq!(job.state, JobState::Done);
    assert_eq!(job.reason.as_deref(), Some("max_messages reached"));
    assert_eq!(job.redriven, 2, "{job:?}");
    let limited = job.id;

    let job = run_job(&d, rate(1000.0)).await;
    assert_eq!(job.redriven, 1, "{job:?}");
    let rest = job.id;

    let copies = copies(&config, "rd-filter", 1, 16);
    assert_eq!(copies.len(), 8, "each message redriven once");
    assert_eq!(ids_of_job(&copies, &by_id), ids(&["m5"]));
    assert_eq!(ids_of_job(&copies, &by_key_and_error), ids(&["m0", "m6"]));
    assert_eq!(ids_of_job(&copies, &by_time), ids(&["m4", "m7"]));
    assert_eq!(ids_of_job(&copies, &limited), ids(&["m1", "m2"]));
    assert_eq!(ids_of_job(&copies, &rest), ids(&["m3"]));
    wait_dlq_depth(&d, 0).await;
    d.shutdown().await;
}

/// Howard Hinnant's `civil_from_days`.
fn civil(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The HTTP API of `d` (through the forwarding layer, as the binary serves
/// it) on 127.0.0.2:`port`.
async fn serve(
    d: Arc<Dispatcher>,
    config: &Config,
    port: u16,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let addr: SocketAddr = format!("127.0.0.2:{port}").parse().unwrap();
    let grpc: SocketAddr = format!("127.0.0.2:{}", port + 1).parse().unwrap();
    let forwarding = Arc::new(Forwarding::new(d, config, addr.to_string()).unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    dispatcher_sidecar::api::serve_bound(forwarding, addr, grpc, None, async move {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    (format!("http://{addr}"), stop)
}

async fn call(
    client: &reqwest::Client,
    method: &str,
    url: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let request = match method {
        "GET" => client.get(url),
        _ => client.post(url),
    };
    let request = match body {
        Some(b) => request.json(&b),
        None => request,
    };
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_progress_resume_goes_on_cancel_ends_and_a_second_start_is_409() {
    let (_broker, config) = setup(45356, "rd-control", 2).await;
    let d = Dispatcher::start(&config).await.unwrap();
    let messages: Vec<NewMessage> = (0..60)
        .map(|i| message(&format!("m{i:02}"), None))
        .collect();
    dead_letter(&d, messages, |_| "no".into()).await;
    let (base, stop) = serve(d.clone(), &config, 45358).await;
    let url = format!("{base}/queues/{Q}/redrive");
    let client = reqwest::Client::new();

    let (status, job) = call(&client, "POST", &url, Some(json!({"rate_per_sec": 10}))).await;
    assert_eq!(status, 202, "{job}");
    assert_eq!(job["state"], "running");
    let id = job["id"].as_str().unwrap().to_owned();
    let (status, conflict) = call(&client, "POST", &url, Some(json!({"rate_per_sec": 5}))).await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["error"]["code"], "conflict");
    assert!(conflict["error"]["message"].as_str().unwrap().contains(&id));

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, paused) = call(&client, "POST", &format!("{url}/pause"), None).await;
    assert_eq!(
        (status, paused["state"].as_str()),
        (200, Some("paused")),
        "{paused}"
    );
    let at_pause = paused["redriven"].as_u64().unwrap();
    assert!(at_pause > 0 && at_pause < 60, "{paused}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, still) = call(&client, "GET", &url, None).await;
    assert_eq!(still["state"], "paused");
    assert_eq!(
        still["redriven"].as_u64(),
        Some(at_pause),
        "no progress while paused"
    );
    // Paused is active: still one job per DLQ.
    let (status, _) = call(&client, "POST", &url, Some(json!({"rate_per_sec": 5}))).await;
    assert_eq!(status, 409);

    let (status, resumed) = call(&client, "POST", &format!("{url}/resume"), None).await;
    assert_eq!((status, resumed["state"].as_str()), (200, Some("running")));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, cancelled) = call(&client, "POST", &format!("{url}/cancel"), None).await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["state"], "cancelled");
    let at_cancel = cancelled["redriven"].as_u64().unwrap();
    assert!(at_cancel > at_pause && at_cancel < 60, "{cancelled}");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (_, ended) = call(&client, "GET", &url, None).await;
    assert_eq!(ended["redriven"].as_u64(), Some(at_cancel));
    assert!(ended["finished_at"].is_string());
    // Nothing left to control.
    let (status, _) = call(&client, "POST", &format!("{url}/pause"), None).await;
    assert_eq!(status, 409);

    // A new job after the cancel redrives the rest, not what was redriven.
    let (status, next) = call(&client, "POST", &url, Some(json!({"rate_per_sec": 1000}))).await;
    assert_eq!(status, 202, "{next}");
    let next = wait_ended(&d, next["id"].as_str().unwrap()).await;
    assert_eq!(next.redriven, 60 - at_cancel, "{next:?}");
    let copies = copies(&config, "rd-control", 2, 120);
    assert_eq!(copies.len(), 60);
    let distinct: BTreeSet<String> = copies.iter().map(|c| envelope_of(c).message_id).collect();
    assert_eq!(distinct.len(), 60, "no message redriven twice");
    assert_eq!(ids_of_job(&copies, &id).len() as u64, at_cancel);
    let _ = stop.send(());
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_job_does_not_redrive_the_same_messages_also_after_a_restart() {
    let (_broker, config) = setup(45360, "rd-twice", 2).await;
    let d = Dispatcher::start(&config).await.unwrap();
    let messages: Vec<NewMessage> = (0..8)
        .map(|i| message(&format!("m{i}"), Some(if i % 2 == 0 { "k1" } else { "k2" })))
        .collect();
    dead_letter(&d, messages, |_| "no".into()).await;
    let first = run_job(
        &d,
        filtered(RedriveFilter {
            key: Some("k1".into()),
            ..RedriveFilter::default()
        }),
    )
    .await;
    assert_eq!(first.redriven, 4, "{first:?}");
    d.shutdown().await;
    drop(d);

    // A restart: the marks are read back from Kafka.
    let d = Dispatcher::start(&config).await.unwrap();
    let no_job = d.redrive_status(Q).await.unwrap_err();
    assert!(matches!(no_job, RedriveError::NoJob(_)), "{no_job:?}");
    let second = run_job(&d, rate(1000.0)).await;
    assert_eq!(second.redriven, 4, "{second:?}");
    let third = run_job(&d, rate(1000.0)).await;
    assert_eq!((third.scanned, third.redriven), (0, 0), "{third:?}");
    d.shutdown().await;
    drop(d);

    let d = Dispatcher::start(&config).await.unwrap();
    let fourth = run_job(&d, rate(1000.0)).await;
    assert_eq!(
        (fourth.state, fourth.redriven),
        (JobState::Done, 0),
        "{fourth:?}"
    );
    let copies_now = copies(&config, "rd-twice", 2, 16);
    assert_eq!(copies_now.len(), 8);
    assert_eq!(
        ids_of_job(&copies_now, &first.id),
        ids(&["m0", "m2", "m4", "m6"])
    );
    assert_eq!(
        ids_of_job(&copies_now, &second.id),
        ids(&["m1", "m3", "m5", "m7"])
    );

    // A message that fails again is back in the DLQ: it may be redriven.
    let again = receive_n(&d, 8).await;
    let m3 = again.iter().find(|m| m.message_id == "m3").unwrap();
    nack_permanent(&d, m3, "still no").await;
    let fifth = run_job(&d, rate(1000.0)).await;
    assert_eq!(fifth.redriven, 1, "{fifth:?}");
    let copies_now = copies(&config, "rd-twice", 2, 17);
    assert_eq!(ids_of_job(&copies_now, &fifth.id), ids(&["m3"]));
    let e = envelope_of(
        copies_now
            .iter()
            .find(|c| header(c, REDRIVE_JOB_HEADER) == Some(fifth.id.as_bytes()))
            .unwrap(),
    );
    assert_eq!(e.errors.len(), 2, "both failures in the history");
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_redrive_requests_are_clean_4xx() {
    let (_broker, config) = setup(45362, "rd-bad", 1).await;
    let d = Dispatcher::start(&config).await.unwrap();
    let (base, stop) = serve(d.clone(), &config, 45364).await;
    let client = reqwest::Client::new();
    let url = format!("{base}/queues/{Q}/redrive");
    for (body, field) in [
        (json!({"rate_per_sec": 0}), "rate_per_sec"),
        (json!({"rate_per_sec": -5}), "rate_per_sec"),
        (json!({"rate_per_sec": 1e9}), "rate_per_sec"),
        (
            json!({"rate_per_sec": 1, "filter": {"colour": "red"}}),
            "colour",
        ),
        (json!({"rate_per_sec": 1, "speed": 1}), "speed"),
        (json!({"filter": {"key": "k"}}), "rate_per_sec"),
        (
            json!({"rate_per_sec": 1, "max_messages": 0}),
            "max_messages",
        ),
        // serde names no field for a negative count: only the status is checked.
        (json!({"rate_per_sec": 1, "max_messages": -1}), ""),
        (
            json!({"rate_per_sec": 1, "filter": {"from": "last tuesday"}}),
            "filter.from",
        ),
        (
            json!({"rate_per_sec": 1, "filter": {"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}}),
            "filter.from",
        ),
    ] {
        let (status, answer) = call(&client, "POST", &url, Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_argument");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{body}: {message}");
    }
    let (status, answer) = call(
        &client,
        "POST",
        &format!("{base}/queues/nope/redrive"),
        Some(json!({"rate_per_sec": 1})),
    )
    .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (404, Some("unknown_queue"))
    );
    let (status, answer) = call(&client, "GET", &format!("{base}/queues/nope/redrive"), None).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (404, Some("unknown_queue"))
    );
    let (status, answer) = call(&client, "GET", &url, None).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (404, Some("no_redrive_job"))
    );
    let (status, answer) = call(&client, "POST", &format!("{url}/cancel"), None).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (404, Some("no_redrive_job"))
    );
    // Nothing was started by any of them; a good request still works.
    let (status, job) = call(&client, "POST", &url, Some(json!({"rate_per_sec": 1}))).await;
    assert_eq!(
        (status, job["state"].as_str()),
        (202, Some("running")),
        "{job}"
    );
    assert_eq!(job["scanned"], 0);
    let ended = wait_ended(&d, job["id"].as_str().unwrap()).await;
    assert_eq!((ended.state, ended.scanned), (JobState::Done, 0));
    let _ = d
        .redrive_control(Q, RedriveAction::Cancel)
        .await
        .unwrap_err();
    let _ = stop.send(());
    d.shutdown().await;
}

/// A `dispatcher` binary serving queue `jobs` on `topic`.
fn instance(
    broker: &Broker,
    dir: &std::path::Path,
    name: &str,
    port: u16,
    topic: &str,
) -> Instance {
    broker.dispatcher(
        dir,
        name,
        port,
        &format!("[[queue]]\nname = \"{Q}\"\ntopic = \"{topic}\"\nlease = \"30s\"\n"),
    )
}

/// The partitions of the queue's topic `i` owns (empty while it starts).
async fn owned(client: &reqwest::Client, i: &Instance) -> Vec<i64> {
    match client.get(format!("{}/queues/{Q}", i.http)).send().await {
        Ok(r) if r.status().is_success() => r.json::<Value>().await.unwrap()["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["partition"].as_i64().unwrap())
            .collect(),
        _ => Vec::new(),
    }
}

/// Two instances: a request to the one without partition 0 is forwarded to
/// the one with it, where the job runs; when that one stops, the job ends
/// with it, and a job started again on the survivor redrives the rest and
/// nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_runs_on_the_owner_of_partition_0_and_restarts_elsewhere_without_repeats() {
    let broker = Broker::start(45370);
    let config = broker.config(&format!("[[queue]]\nname = \"{Q}\"\ntopic = \"rd-fwd\"\n"));
    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(&config).create().unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new("rd-fwd", 2, TopicReplication::Fixed(1))],
            &AdminOptions::new().request_timeout(Some(TIMEOUT)),
        )
        .await
        .unwrap();
    assert!(created[0].is_ok(), "{created:?}");
    let dir = tempfile::tempdir().unwrap();
    let a = instance(&broker, dir.path(), "a", 45372, "rd-fwd");
    let b = instance(&broker, dir.path(), "b", 45374, "rd-fwd");
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut owner, other) = loop {
        let (oa, ob) = (owned(&client, &a).await, owned(&client, &b).await);
        if oa.len() == 1 && ob.len() == 1 {
            break if oa == [0] { (a, b) } else { (b, a) };
        }
        assert!(Instant::now() < deadline, "no split: {oa:?} {ob:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // 40 dead letters on both partitions, through either instance.
    let messages: Vec<Value> = (0..40)
        .map(|i| json!({"message_id": format!("m{i:02}"), "key": format!("k{i}"), "payload": "p"}))
        .collect();
    let (status, _) = call(
        &client,
        "POST",
        &format!("{}/queues/{Q}/messages", owner.http),
        Some(json!({ "messages": messages })),
    )
    .await;
    assert_eq!(status, 200);
    let mut dead = 0;
    let deadline = Instant::now() + TIMEOUT;
    while dead < 40 {
        assert!(Instant::now() < deadline, "only {dead} dead-lettered");
        for i in [&owner, &other] {
            let (_, got) = call(
                &client,
                "POST",
                &format!("{}/queues/{Q}/receive", i.http),
                Some(json!({"max_messages": 20, "wait_seconds": 0})),
            )
            .await;
            for m in got["messages"].as_array().unwrap() {
                let (_, nacked) = call(
                    &client,
                    "POST",
                    &format!("{}/queues/{Q}/nack", i.http),
                    Some(json!({"receipt": m["receipt"], "permanent": true, "error": "no"})),
                )
                .await;
                assert_eq!(nacked["status"], "ok", "{nacked}");
                dead += 1;
            }
        }
    }

    // Started through the instance without partition 0: it runs on the owner.
    let (status, job) = call(
        &client,
        "POST",
        &format!("{}/queues/{Q}/redrive", other.http),
        Some(json!({"rate_per_sec": 5})),
    )
    .await;
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    let (status, on_owner) = call(
        &client,
        "GET",
        &format!("{}/internal/queues/{Q}/redrive", owner.internal),
        None,
    )
    .await;
    assert_eq!((status, on_owner["id"].as_str()), (200, Some(id.as_str())));
    let (status, local) = call(
        &client,
        "GET",
        &format!("{}/internal/queues/{Q}/redrive", other.internal),
        None,
    )
    .await;
    assert_eq!(
        (status, local["error"]["code"].as_str()),
        (503, Some("not_owner"))
    );
    let (status, conflict) = call(
        &client,
        "POST",
        &format!("{}/queues/{Q}/redrive", other.http),
        Some(json!({"rate_per_sec": 5})),
    )
    .await;
    assert_eq!(status, 409, "{conflict}");

    // The owner stops (SIGTERM) while the job runs.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let (_, before_stop) = call(
        &client,
        "GET",
        &format!("{}/queues/{Q}/redrive", other.http),
        None,
    )
    .await;
    assert_eq!(before_stop["state"], "running", "{before_stop}");
    let stopped = std::process::Command::new("kill")
        .args(["-TERM", &owner.child.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let _ = owner.child.wait();
    let deadline = Instant::now() + Duration::from_secs(60);
    while owned(&client, &other).await.len() != 2 {
        assert!(
            Instant::now() < deadline,
            "the survivor did not take partition 0"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The job's record went with its instance; a new job skips what it did.
    let url = format!("{}/queues/{Q}/redrive", other.http);
    let (status, _) = call(&client, "GET", &url, None).await;
    assert_eq!(status, 404);
    let (status, next) = call(&client, "POST", &url, Some(json!({"rate_per_sec": 1000}))).await;
    assert_eq!(status, 202, "{next}");
    let deadline = Instant::now() + TIMEOUT;
    let next = loop {
        let (_, j) = call(&client, "GET", &url, None).await;
        if j["state"] != "running" {
            break j;
        }
        assert!(Instant::now() < deadline, "{j}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(next["state"], "done", "{next}");
    let first_did = 40 - next["redriven"].as_u64().unwrap();
    assert!((5..40).contains(&first_did), "{next}");
    let copies = copies(&config, "rd-fwd", 2, 80);
    assert_eq!(copies.len(), 40);
    let distinct: BTreeSet<String> = copies.iter().map(|c| envelope_of(c).message_id).collect();
    assert_eq!(distinct.len(), 40, "no message redriven twice");
    assert_eq!(ids_of_job(&copies, &id).len() as u64, first_did);
    drop(owner);
    drop(other);
}

/// Dead-letters `n` messages through an instance's HTTP API.
async fn dead_letter_http(client: &reqwest::Client, i: &Instance, n: usize) {
    let messages: Vec<Value> = (0..n)
        .map(|k| json!({"message_id": format!("m{k:02}"), "key": format!("k{k}"), "payload": "p"}))
        .collect();
    let (status, _) = call(
        client,
        "POST",
        &format!("{}/queues/{Q}/messages", i.http),
        Some(json!({ "messages": messages })),
    )
    .await;
    assert_eq!(status, 200);
    let mut dead = 0;
    let deadline = Instant::now() + TIMEOUT;
    while dead < n {
        assert!(Instant::now() < deadline, "only {dead} dead-lettered");
        let (_, got) = call(
            client,
            "POST",
            &format!("{}/queues/{Q}/receive", i.http),
            Some(json!({"max_messages": 20, "wait_seconds": 1})),
        )
        .await;
        for m in got["messages"].as_array().unwrap() {
            let (_, nacked) = call(
                client,
                "POST",
                &format!("{}/queues/{Q}/nack", i.http),
                Some(json!({"receipt": m["receipt"], "permanent": true, "error": "no"})),
            )
            .await;
            assert_eq!(nacked["status"], "ok", "{nacked}");
            dead += 1;
        }
    }
}

/// kill -9 of the instance running a job: nothing is lost (every message
/// is redriven once the job is started again after the restart), and what
/// is repeated is at most the copies that were in flight (one batch:
/// `BATCH_MAX`, 100, in the worst case; at 10/s a batch is a copy or two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_killed_mid_run_loses_nothing_when_started_again() {
    let broker = Broker::start(45384);
    let config = broker.config(&format!("[[queue]]\nname = \"{Q}\"\ntopic = \"rd-kill\"\n"));
    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(&config).create().unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new("rd-kill", 2, TopicReplication::Fixed(1))],
            &AdminOptions::new().request_timeout(Some(TIMEOUT)),
        )
        .await
        .unwrap();
    assert!(created[0].is_ok(), "{created:?}");
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut first = instance(&broker, dir.path(), "first", 45386, "rd-kill");
    let deadline = Instant::now() + Duration::from_secs(60);
    while owned(&client, &first).await.len() != 2 {
        assert!(Instant::now() < deadline, "the instance did not start");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    dead_letter_http(&client, &first, 40).await;
    let url = format!("{}/queues/{Q}/redrive", first.http);
    let (status, job) = call(&client, "POST", &url, Some(json!({"rate_per_sec": 10}))).await;
    assert_eq!(status, 202, "{job}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, before) = call(&client, "GET", &url, None).await;
    let redriven_before = before["redriven"].as_u64().unwrap();
    // At 10/s each copy is marked while the job waits for the next token.
    assert!(redriven_before >= 5, "{before}");
    first.child.kill().unwrap();
    let _ = first.child.wait();
    drop(first);

    let second = instance(&broker, dir.path(), "second", 45386, "rd-kill");
    let url = format!("{}/queues/{Q}/redrive", second.http);
    // The dead member's partitions come back after its session timeout.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "no job could start");
        if let Ok(r) = client
            .post(&url)
            .json(&json!({"rate_per_sec": 1000}))
            .send()
            .await
        {
            if r.status().as_u16() == 202 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let deadline = Instant::now() + TIMEOUT;
    let next = loop {
        let (_, j) = call(&client, "GET", &url, None).await;
        if j["state"] != "running" {
            break j;
        }
        assert!(Instant::now() < deadline, "{j}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(next["state"], "done", "{next}");
    let redriven_after = next["redriven"].as_u64().unwrap();
    let want = 40 + 40 + 100;
    let copies = copies(&config, "rd-kill", 2, want);
    assert!(
        redriven_after <= 40 - redriven_before,
        "what the killed job reported written was skipped: {next}"
    );
    let distinct: BTreeSet<String> = copies.iter().map(|c| envelope_of(c).message_id).collect();
    assert_eq!(distinct.len(), 40, "every dead letter was redriven");
    let repeated = copies.len() - 40;
    eprintln!("copies repeated after the kill: {repeated}");
    assert!(repeated <= 100, "{repeated} repeated copies");
    drop(second);
}
