//! Ordered queues (issue 8) against our broker: one message in flight per
//! key, retries kept in the partition so a key's later messages never
//! overtake a retried one, the DLQ copy's history, and a restart that keeps
//! a retrying key busy. Ports 45300-45349.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{envelope_of, read_all, Broker};
use dispatcher_sidecar::config::Config;
use dispatcher_sidecar::kafka;
use dispatcher_sidecar::queue::Dispatcher;
use dispatcher_sidecar::service::{
    Delivery, NackRequest, NewMessage, ProduceStatus, QueueService, ReceiptOutcome, ReceiveRequest,
};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::Message;

const TIMEOUT: Duration = Duration::from_secs(60);
const Q: &str = "jobs";

/// A broker on `port` and an ordered queue `jobs` on a new topic `topic`
/// with `partitions`, 1 s and 2 s retry tiers, and `extra` keys.
async fn setup(port: u16, topic: &str, partitions: i32, extra: &str) -> (Broker, Config) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let broker = Broker::start(port);
    let config = broker.config(&format!(
        "[[queue]]\nname = \"{Q}\"\ntopic = \"{topic}\"\ngroup = \"{topic}-dispatcher\"\n\
         ordered = true\nretry_tiers = [\"1s\", \"2s\"]\n{extra}\n"
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

fn keyed(key: &str, payload: &str) -> NewMessage {
    NewMessage {
        message_id: None,
        key: Some(key.as_bytes().to_vec()),
        payload: payload.as_bytes().to_vec(),
        headers: vec![],
        delay: None,
    }
}

async fn produce(d: &Dispatcher, messages: Vec<NewMessage>) {
    let results = d.produce(Q, messages).await.unwrap();
    assert!(results.iter().all(|r| r.status == ProduceStatus::Accepted));
}

async fn receive(d: &Dispatcher, max: u32, wait: Duration) -> Vec<Delivery> {
    d.receive(
        Q,
        ReceiveRequest {
            max_messages: max,
            wait,
            lease: None,
            consumer: Some("worker-1".into()),
        },
    )
    .await
    .unwrap()
}

async fn ack(d: &Dispatcher, m: &Delivery) {
    assert_eq!(
        d.ack(Q, std::slice::from_ref(&m.receipt)).await.unwrap(),
        vec![ReceiptOutcome::Ok]
    );
}

async fn nack(d: &Dispatcher, m: &Delivery, error: &str, retry_after: Option<Duration>) {
    let outcome = d
        .nack(
            Q,
            NackRequest {
                receipt: m.receipt.clone(),
                retry_after,
                error: Some(error.into()),
                permanent: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(outcome, ReceiptOutcome::Ok);
}

fn key_of(m: &Delivery) -> String {
    String::from_utf8(m.key.clone().unwrap().to_vec()).unwrap()
}

fn text(m: &Delivery) -> String {
    String::from_utf8(m.payload.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_per_key_is_out_and_a_retried_message_is_not_overtaken() {
    let (_broker, config) = setup(45300, "ord-retry", 2, "lease = \"30s\"").await;
    let d = Dispatcher::start(&config).await.unwrap();
    let mut messages = Vec::new();
    for i in 0..5 {
        for key in ["K", "A", "B"] {
            messages.push(keyed(key, &format!("{key}{i}")));
        }
    }
    produce(&d, messages).await;

    // Nothing acked: one message per key comes out, however long we ask.
    let mut first = Vec::new();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        first.extend(receive(&d, 100, Duration::from_millis(500)).await);
    }
    let mut firsts: Vec<String> = first.iter().map(text).collect();
    firsts.sort();
    assert_eq!(firsts, ["A0", "B0", "K0"], "one in flight per key");

    // K0 fails (retry after 1 s); A and B flow meanwhile, K waits.
    let mut order: HashMap<String, Vec<(String, u32)>> = HashMap::new();
    for m in &first {
        order
            .entry(key_of(m))
            .or_default()
            .push((text(m), m.attempt));
        if key_of(m) == "K" {
            nack(&d, m, "db down", Some(Duration::from_secs(1))).await;
        } else {
            ack(&d, m).await;
        }
    }
    let deadline = Instant::now() + TIMEOUT;
    let mut k_retried_at = None;
    while order.values().map(Vec::len).sum::<usize>() < 16 {
        assert!(Instant::now() < deadline, "only got {order:?}");
        for m in receive(&d, 10, Duration::from_secs(2)).await {
            if key_of(&m) == "K" && text(&m) == "K0" {
                assert_eq!(m.attempt, 2);
                k_retried_at = Some(order.get("A").map_or(0, Vec::len));
            }
            order
                .entry(key_of(&m))
                .or_default()
                .push((text(&m), m.attempt));
            ack(&d, &m).await;
        }
    }
    let expect = |key: &str, retried: bool| -> Vec<(String, u32)> {
        let mut v: Vec<(String, u32)> = (0..5).map(|i| (format!("{key}{i}"), 1)).collect();
        if retried {
            v.insert(1, (format!("{key}0"), 2));
        }
        v
    };
    assert_eq!(order["K"], expect("K", true), "K's later messages waited");
    assert_eq!(order["A"], expect("A", false));
    assert_eq!(order["B"], expect("B", false));
    assert_eq!(
        k_retried_at,
        Some(5),
        "A's messages all flowed while K0 waited for its retry"
    );
    // The retry stayed in the partition: no retry-tier copy was written.
    let tier = read_all(&config, "ord-retry.retry.1s", 2, 1);
    assert!(tier.is_empty(), "an ordered keyed retry went to a tier");
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_failing_every_attempt_reaches_the_dlq_with_its_whole_history() {
    let (_broker, config) = setup(45301, "ord-dlq", 1, "lease = \"30s\"\nmax_attempts = 3").await;
    let d = Dispatcher::start(&config).await.unwrap();
    produce(&d, vec![keyed("K", "K0"), keyed("K", "K1")]).await;
    let deadline = Instant::now() + TIMEOUT;
    for attempt in 1..=3 {
        let m = loop {
            assert!(Instant::now() < deadline);
            let got = receive(&d, 10, Duration::from_secs(3)).await;
            if let Some(m) = got.into_iter().next() {
                break m;
            }
        };
        assert_eq!((text(&m).as_str(), m.attempt), ("K0", attempt));
        nack(&d, &m, &format!("fail {attempt}"), None).await;
    }
    let dlq = read_all(&config, "ord-dlq.dlq", 1, 1);
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].payload(), Some(&b"K0"[..]));
    assert_eq!(dlq[0].key(), Some(&b"K"[..]));
    let env = envelope_of(&dlq[0]);
    assert_eq!(env.attempt.0, 3);
    assert_eq!(
        (
            env.origin_topic.as_str(),
            env.origin_partition,
            env.origin_offset
        ),
        ("ord-dlq", 0, 0)
    );
    let history: Vec<(u16, &str, Option<&str>)> = env
        .errors
        .iter()
        .map(|e| (e.attempt, e.error.as_str(), e.consumer.as_deref()))
        .collect();
    assert_eq!(
        history,
        [
            (1, "fail 1", Some("worker-1")),
            (2, "fail 2", Some("worker-1")),
            (3, "fail 3", Some("worker-1"))
        ]
    );
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_a_retrying_key_busy_with_its_attempt_and_history() {
    let (_broker, config) =
        setup(45302, "ord-restart", 1, "lease = \"30s\"\nmax_attempts = 3").await;
    let first = Dispatcher::start(&config).await.unwrap();
    produce(
        &first,
        vec![keyed("K", "K0"), keyed("K", "K1"), keyed("A", "A0")],
    )
    .await;
    let deadline = Instant::now() + TIMEOUT;
    let mut got = Vec::new();
    while got.len() < 2 {
        assert!(Instant::now() < deadline);
        got.extend(receive(&first, 10, Duration::from_secs(2)).await);
    }
    let k0 = got.iter().find(|m| text(m) == "K0").unwrap();
    nack(&first, k0, "before restart", Some(Duration::from_secs(2))).await;
    let nacked_at = Instant::now();
    first.shutdown().await;
    drop(first);

    let second = Dispatcher::start(&config).await.unwrap();
    let mut seen = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "saw {seen:?}");
        let batch = receive(&second, 10, Duration::from_secs(2)).await;
        let mut done = false;
        for m in batch {
            seen.push((text(&m), m.attempt));
            if text(&m) == "K0" {
                assert_eq!(m.attempt, 2, "the attempt survived the restart");
                assert!(
                    nacked_at.elapsed() >= Duration::from_millis(1900),
                    "due time kept"
                );
                // The last attempt fails: the DLQ copy has both failures.
                nack(&second, &m, "after restart", None).await;
                let m2 = loop {
                    assert!(Instant::now() < deadline);
                    if let Some(m) = receive(&second, 1, Duration::from_secs(3)).await.pop() {
                        break m;
                    }
                };
                assert_eq!((text(&m2).as_str(), m2.attempt), ("K0", 3));
                nack(&second, &m2, "third", None).await;
                done = true;
            } else {
                assert_ne!(text(&m), "K1", "K1 overtook the retrying K0: {seen:?}");
                ack(&second, &m).await;
            }
        }
        if done {
            break;
        }
    }
    let dlq = read_all(&config, "ord-restart.dlq", 1, 1);
    let env = envelope_of(&dlq[0]);
    let errors: Vec<&str> = env.errors.iter().map(|e| e.error.as_str()).collect();
    assert_eq!(errors, ["before restart", "after restart", "third"]);
    second.shutdown().await;
}
