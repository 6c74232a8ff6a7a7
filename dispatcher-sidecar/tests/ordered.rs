//! Ordered queues (issue 8) against our broker: one message in flight per
//! key, retries kept in the partition so a key's later messages never
//! overtake a retried one, the DLQ copy's history, a restart that keeps a
//! retrying key busy, parked keys (hold, commit point, skip, redrive, a
//! restart while parked and mid-replay), and the 10k messages over
//! 50 keys with one poison message. Ports 45300-45349.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{envelope_of, read_all, Broker, Instance};
use dispatcher_sidecar::api::grpc::proto;
use dispatcher_sidecar::api::grpc::proto::dispatcher_client::DispatcherClient;
use dispatcher_sidecar::config::Config;
use dispatcher_sidecar::kafka;
use dispatcher_sidecar::queue::Dispatcher;
use dispatcher_sidecar::redrive::RedriveRequest;
use dispatcher_sidecar::service::{
    Delivery, NackRequest, NewMessage, ParkedKeyInfo, ProduceStatus, QueueService, ReceiptOutcome,
    ReceiveRequest, SkipOutcome, SkipRequest,
};
use dispatcher_sidecar::trace::EventKind;
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
    let tiers = if extra.contains("retry_tiers") {
        ""
    } else {
        "retry_tiers = [\"1s\", \"2s\"]\n"
    };
    let config = broker.config(&format!(
        "[[queue]]\nname = \"{Q}\"\ntopic = \"{topic}\"\ngroup = \"{topic}-dispatcher\"\n\
         ordered = true\n{tiers}{extra}\n"
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
    // A keyed message cannot be delayed (it would leave its key's order).
    let mut delayed = keyed("K", "late");
    delayed.delay = Some(Duration::from_secs(1));
    match d.produce(Q, vec![delayed]).await {
        Err(dispatcher_sidecar::service::ServiceError::InvalidArgument(e)) => {
            assert!(e.contains("cannot be delayed"), "{e}")
        }
        other => panic!("a delayed keyed message was accepted: {other:?}"),
    }
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
                    match receive(&second, 1, Duration::from_secs(3)).await.pop() {
                        Some(m) if text(&m) == "K0" => break m,
                        Some(m) => {
                            assert_ne!(text(&m), "K1", "K1 overtook the retrying K0");
                            ack(&second, &m).await;
                        }
                        None => {}
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

/// Polls `parked` until `check` holds for the list (or the timeout).
async fn parked_until(
    d: &Dispatcher,
    what: &str,
    check: impl Fn(&[ParkedKeyInfo]) -> bool,
) -> Vec<ParkedKeyInfo> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let parked = d.parked(Q).await.unwrap();
        if check(&parked) {
            return parked;
        }
        assert!(Instant::now() < deadline, "{what}: parked = {parked:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn nack_permanent(d: &Dispatcher, m: &Delivery) {
    let outcome = d
        .nack(
            Q,
            NackRequest {
                receipt: m.receipt.clone(),
                retry_after: None,
                error: Some("poison".into()),
                permanent: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(outcome, ReceiptOutcome::Ok);
}

/// Receives and acks until `n` messages came, checking that no receive
/// hands out two messages of one key; returns the payloads in order.
async fn drain_in_order(d: &Dispatcher, n: usize) -> Vec<String> {
    let deadline = Instant::now() + TIMEOUT;
    let mut got = Vec::new();
    while got.len() < n {
        assert!(Instant::now() < deadline, "only {got:?}");
        let batch = receive(d, 10, Duration::from_secs(2)).await;
        let mut keys: Vec<String> = batch.iter().map(key_of).collect();
        keys.sort();
        let before = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), before, "two messages of one key out at once");
        for m in batch {
            got.push(text(&m));
            ack(d, &m).await;
        }
    }
    got
}

/// The queue's depth (log end minus commit point) over its partitions.
async fn depth(d: &Dispatcher) -> i64 {
    d.stats(Q).await.unwrap().depth
}

/// Produces the redrive of a DLQ record as the agreed interface says: to
/// the origin partition of the queue's topic, with the record's key,
/// payload and user headers, the envelope rewritten to attempt 1 without a
/// due time, and the redrive job's two headers.
async fn redrive(config: &Config, topic: &str, dlq_record: &rdkafka::message::OwnedMessage) {
    use rdkafka::message::{Header, Headers, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let mut env = envelope_of(dlq_record);
    env.attempt = dispatcher_sidecar::lease::Attempt(1);
    env.due_ms = None;
    let mut headers: Vec<(String, Vec<u8>)> = dlq_record
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                .collect()
        })
        .unwrap_or_default();
    env.write_into(&mut headers);
    headers.push(("dispatcher.redrive-job".into(), b"job-1".to_vec()));
    headers.push(("dispatcher.redriven-ms".into(), b"1".to_vec()));
    let owned = headers.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
        h.insert(Header {
            key: k,
            value: Some(v),
        })
    });
    let producer: FutureProducer = kafka::producer_config(config).create().unwrap();
    producer
        .send(
            FutureRecord::to(topic)
                .partition(env.origin_partition)
                .key(dlq_record.key().unwrap())
                .payload(dlq_record.payload().unwrap())
                .headers(owned),
            TIMEOUT,
        )
        .await
        .unwrap();
}

/// K0 is poison: K is parked, K1 and K2 go to the hold and the commit point
/// passes them, other keys flow; `release` (a skip or a redrive) then
/// delivers K1, K2 and the K3 produced meanwhile in order, before K4.
async fn parked_key_then(port: u16, topic: &str, redriven: bool) {
    let (_broker, config) = setup(port, topic, 1, "lease = \"30s\"").await;
    let d = Dispatcher::start(&config).await.unwrap();
    let mut messages = Vec::new();
    for i in 0..3 {
        messages.push(keyed("K", &format!("K{i}")));
        messages.push(keyed("A", &format!("A{i}")));
    }
    produce(&d, messages).await;
    let deadline = Instant::now() + TIMEOUT;
    let mut others = Vec::new();
    let mut poison_id = None;
    while others.len() < 3 || poison_id.is_none() {
        assert!(Instant::now() < deadline, "got {others:?}");
        for m in receive(&d, 10, Duration::from_secs(2)).await {
            match text(&m).as_str() {
                "K0" => {
                    poison_id = Some(m.message_id.clone());
                    nack_permanent(&d, &m).await;
                }
                t if t.starts_with('A') => {
                    others.push(t.to_owned());
                    ack(&d, &m).await;
                }
                t => panic!("{t} delivered while K is parked"),
            }
        }
    }
    assert_eq!(others, ["A0", "A1", "A2"]);
    let poison_id = poison_id.unwrap();
    let parked = parked_until(&d, "K1 and K2 held", |p| p.len() == 1 && p[0].held == 2).await;
    assert_eq!(
        (
            parked[0].partition,
            parked[0].key.as_slice(),
            parked[0].message_id.as_str()
        ),
        (0, &b"K"[..], poison_id.as_str())
    );
    assert_eq!(parked[0].released_by, None);
    // The commit point passed the held messages.
    let until = Instant::now() + TIMEOUT;
    while depth(&d).await != 0 {
        assert!(Instant::now() < until, "the commit point is stuck");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        receive(&d, 10, Duration::from_secs(1)).await.is_empty(),
        "a parked key's message was delivered"
    );
    let hold = read_all(&config, &format!("{topic}.hold"), 1, 2);
    let held: Vec<&[u8]> = hold.iter().filter_map(|m| m.payload()).collect();
    assert_eq!(held, [&b"K1"[..], b"K2"]);
    assert_eq!(envelope_of(&hold[0]).origin_offset, 2);
    let dlq = read_all(&config, &format!("{topic}.dlq"), 1, 1);
    assert_eq!(envelope_of(&dlq[0]).errors[0].error, "poison");

    produce(&d, vec![keyed("K", "K3")]).await;
    parked_until(&d, "K3 held", |p| p.len() == 1 && p[0].held == 3).await;
    if redriven {
        redrive(&config, topic, &dlq[0]).await;
        let again = drain_in_order(&d, 1).await;
        assert_eq!(again, ["K0"], "the redriven message comes first");
    } else {
        let wrong = d
            .skip(
                Q,
                SkipRequest {
                    partition: 0,
                    key: b"K".to_vec(),
                    message_id: "not-it".into(),
                },
            )
            .await
            .unwrap();
        assert_eq!(wrong, SkipOutcome::OtherMessage);
        let none = d
            .skip(
                Q,
                SkipRequest {
                    partition: 0,
                    key: b"Z".to_vec(),
                    message_id: poison_id.clone(),
                },
            )
            .await
            .unwrap();
        assert_eq!(none, SkipOutcome::NotParked);
        let skip = SkipRequest {
            partition: 0,
            key: b"K".to_vec(),
            message_id: poison_id.clone(),
        };
        assert_eq!(
            d.skip(Q, skip.clone()).await.unwrap(),
            SkipOutcome::Released
        );
        assert_eq!(d.skip(Q, skip).await.unwrap(), SkipOutcome::AlreadyReleased);
    }
    let replayed = drain_in_order(&d, 1).await;
    produce(&d, vec![keyed("K", "K4")]).await;
    let rest = drain_in_order(&d, 3).await;
    assert_eq!(
        [replayed, rest].concat(),
        ["K1", "K2", "K3", "K4"],
        "held messages in order, before the newer one"
    );
    parked_until(&d, "K released", |p| p.is_empty()).await;
    assert!(receive(&d, 10, Duration::from_secs(1)).await.is_empty());
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_parks_its_key_until_a_skip_replays_the_hold_in_order() {
    parked_key_then(45303, "ord-skip", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redrive_of_the_poison_message_releases_its_key_and_comes_first() {
    parked_key_then(45304, "ord-redrive", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_a_parked_key_parked_and_loses_none_of_its_messages() {
    let (_broker, config) = setup(45305, "ord-park-restart", 1, "lease = \"30s\"").await;
    let first = Dispatcher::start(&config).await.unwrap();
    produce(
        &first,
        vec![keyed("K", "K0"), keyed("K", "K1"), keyed("K", "K2")],
    )
    .await;
    let deadline = Instant::now() + TIMEOUT;
    let k0 = loop {
        assert!(Instant::now() < deadline);
        if let Some(m) = receive(&first, 10, Duration::from_secs(2)).await.pop() {
            break m;
        }
    };
    assert_eq!(text(&k0), "K0");
    nack_permanent(&first, &k0).await;
    parked_until(&first, "K1 and K2 held", |p| p.len() == 1 && p[0].held == 2).await;
    first.shutdown().await;
    drop(first);

    let second = Dispatcher::start(&config).await.unwrap();
    let parked = parked_until(&second, "still parked", |p| p.len() == 1).await;
    assert_eq!(parked[0].held, 2);
    assert_eq!(parked[0].message_id, k0.message_id);
    produce(&second, vec![keyed("K", "K3")]).await;
    parked_until(&second, "K3 held", |p| p.len() == 1 && p[0].held == 3).await;
    assert!(
        receive(&second, 10, Duration::from_secs(1))
            .await
            .is_empty(),
        "a parked key's message was delivered after the restart"
    );
    let released = second
        .skip(
            Q,
            SkipRequest {
                partition: 0,
                key: b"K".to_vec(),
                message_id: k0.message_id.clone(),
            },
        )
        .await
        .unwrap();
    assert_eq!(released, SkipOutcome::Released);
    // A restart in the middle of the replay: it goes on where it was.
    let one = drain_in_order(&second, 1).await;
    assert_eq!(one, ["K1"]);
    second.shutdown().await;
    drop(second);
    let third = Dispatcher::start(&config).await.unwrap();
    let rest = drain_in_order(&third, 2).await;
    assert_eq!(rest, ["K2", "K3"], "nothing lost, nothing repeated");
    parked_until(&third, "K released", |p| p.is_empty()).await;
    third.shutdown().await;
}

/// The case: 10k messages over 50 keys in 4 partitions, one poison
/// message of key K. Every other key's messages come in order; K's later
/// messages come in order after the poison message's redrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_over_fifty_keys_with_one_poison_message() {
    let (_broker, config) = setup(45306, "ord-10k", 4, "lease = \"60s\"").await;
    let d = Dispatcher::start(&config).await.unwrap();
    const KEYS: usize = 50;
    const N: usize = 10_000;
    let poison = ("k7".to_string(), 30usize);
    let mut all: Vec<NewMessage> = (0..N)
        .map(|i| keyed(&format!("k{}", i % KEYS), &format!("{}", i / KEYS)))
        .collect();
    while !all.is_empty() {
        let rest = all.split_off(all.len().min(500));
        produce(&d, std::mem::replace(&mut all, rest)).await;
    }
    let mut seen: HashMap<String, Vec<usize>> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut poison_id = None;
    // Everything but K's messages after the poison one (which is delivered).
    let expected_before_release = N - (N / KEYS - poison.1 - 1);
    let mut count = 0;
    while count < expected_before_release {
        assert!(Instant::now() < deadline, "only {count} delivered");
        let batch = receive(&d, 100, Duration::from_secs(2)).await;
        let mut acks = Vec::new();
        for m in batch {
            let key = key_of(&m);
            let seq: usize = text(&m).parse().unwrap();
            if key == poison.0 && seq == poison.1 {
                poison_id = Some(m.message_id.clone());
                nack_permanent(&d, &m).await;
                count += 1;
                continue;
            }
            if key == poison.0 {
                assert!(seq < poison.1, "{key} {seq} delivered while parked");
            }
            seen.entry(key).or_default().push(seq);
            acks.push(m.receipt);
            count += 1;
        }
        if !acks.is_empty() {
            let outcomes = d.ack(Q, &acks).await.unwrap();
            assert!(outcomes.iter().all(|o| *o == ReceiptOutcome::Ok));
        }
    }
    for (key, seqs) in &seen {
        let want: Vec<usize> = if *key == poison.0 {
            (0..poison.1).collect()
        } else {
            (0..N / KEYS).collect()
        };
        assert_eq!(seqs, &want, "{key} out of order");
    }
    assert_eq!(seen.len(), KEYS);
    let held = (N / KEYS - poison.1 - 1) as u64;
    let parked = parked_until(&d, "K's later messages held", |p| {
        p.len() == 1 && p[0].held == held
    })
    .await;
    let partition = parked[0].partition;
    let dlq = read_all(&config, "ord-10k.dlq", 4, 1);
    assert_eq!(envelope_of(&dlq[0]).origin_partition, partition);
    // The operator's redrive (the real job, through the service).
    let job = d
        .redrive_start(
            Q,
            RedriveRequest {
                rate_per_sec: 100.0,
                filter: None,
                max_messages: None,
            },
        )
        .await
        .unwrap();
    let rest = drain_in_order(&d, N / KEYS - poison.1).await;
    let want: Vec<String> = (poison.1..N / KEYS).map(|s| s.to_string()).collect();
    assert_eq!(
        rest, want,
        "the redriven message, then K's held ones in order"
    );
    parked_until(&d, "K released", |p| p.is_empty()).await;
    let status = d.redrive_status(Q).await.unwrap();
    assert_eq!((status.id.as_str(), status.redriven), (job.id.as_str(), 1));
    // The trace names the whole path of the poison message.
    let poison_id = poison_id.expect("the poison message was delivered");
    let traces = d.trace(&poison_id, Some(Q)).await.unwrap();
    let kinds: Vec<EventKind> = traces[0].events.iter().map(|e| e.event).collect();
    assert_eq!(
        kinds,
        [
            EventKind::Produced,
            EventKind::DeliveryFailed,
            EventKind::DeadLettered,
            EventKind::Redriven
        ],
        "{traces:#?}"
    );
    d.shutdown().await;
}

/// A `dispatcher` binary serving the ordered queue `fwd` over HTTP.
fn start_instance(broker: &Broker, dir: &std::path::Path, name: &str, port: u16) -> Instance {
    broker.dispatcher(
        dir,
        name,
        port,
        "[[queue]]\nname = \"fwd\"\ntopic = \"ord-fwd\"\nlease = \"30s\"\nordered = true\n",
    )
}

/// A skip sent to the instance that does not own the key's partition is
/// forwarded to the owner; the parked list is each instance's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skip_sent_to_another_instance_reaches_the_partition_owner() {
    use serde_json::{json, Value};
    let broker = Broker::start(45310);
    let config = broker.config("[[queue]]\nname = \"fwd\"\ntopic = \"ord-fwd\"\n");
    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(&config).create().unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new("ord-fwd", 2, TopicReplication::Fixed(1))],
            &AdminOptions::new().request_timeout(Some(TIMEOUT)),
        )
        .await
        .unwrap();
    assert!(created[0].is_ok(), "{created:?}");
    let dir = tempfile::tempdir().unwrap();
    let a = start_instance(&broker, dir.path(), "a", 45311);
    let b = start_instance(&broker, dir.path(), "b", 45313);
    let http = reqwest::Client::new();
    let get = |url: String| {
        let http = http.clone();
        async move {
            match http.get(&url).send().await {
                Ok(r) if r.status().is_success() => r.json::<Value>().await.unwrap(),
                _ => Value::Null,
            }
        }
    };
    // Both instances own a partition.
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut owned = Vec::new();
        for i in [&a, &b] {
            let stats = get(format!("{}/queues/fwd", i.http)).await;
            owned.push(stats["partitions"].as_array().map_or(0, |p| p.len()));
        }
        if owned == [1, 1] {
            break;
        }
        assert!(Instant::now() < deadline, "owned {owned:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let produced = http
        .post(format!("{}/queues/fwd/messages", a.http))
        .json(&json!({"messages": [{"key": "K", "payload": "K0"}, {"key": "K", "payload": "K1"}]}))
        .send()
        .await
        .unwrap();
    assert!(produced.status().is_success());
    // Receive K0 from its owner, dead-letter it there.
    let (owner, other, k0) = 'found: loop {
        assert!(Instant::now() < deadline, "K0 never delivered");
        for (i, o) in [(&a, &b), (&b, &a)] {
            let got = http
                .post(format!("{}/queues/fwd/receive", i.http))
                .json(&json!({"max_messages": 10, "wait_seconds": 1}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap();
            if let Some(m) = got["messages"].as_array().and_then(|m| m.first()) {
                break 'found (i, o, m.clone());
            }
        }
    };
    assert_eq!(k0["payload"], "K0");
    let nacked = http
        .post(format!("{}/queues/fwd/nack", owner.http))
        .json(&json!({"receipt": k0["receipt"], "permanent": true, "error": "poison"}))
        .send()
        .await
        .unwrap();
    assert!(nacked.status().is_success());
    let partition = k0["partition"].clone();
    loop {
        let parked = get(format!("{}/queues/fwd/parked", owner.http)).await;
        if parked["parked"][0]["held"] == 1 {
            assert_eq!(parked["parked"][0]["key"], "K");
            assert_eq!(parked["parked"][0]["partition"], partition);
            assert_eq!(parked["parked"][0]["message_id"], k0["message_id"]);
            break;
        }
        assert!(Instant::now() < deadline, "K1 not held: {parked}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        get(format!("{}/queues/fwd/parked", other.http)).await,
        json!({"parked": []}),
        "answered per instance"
    );
    // gRPC: the owner's Parked shows the key; a Skip naming the wrong
    // message, sent to the other instance, is refused by the owner.
    let mut grpc = DispatcherClient::connect(owner.grpc.clone()).await.unwrap();
    let parked = grpc
        .parked(proto::ParkedRequest {
            queue: "fwd".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .parked;
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!((parked[0].key.as_slice(), parked[0].held), (&b"K"[..], 1));
    assert_eq!(Some(parked[0].partition.into()), partition.as_i64());
    assert_eq!(
        Some(parked[0].message_id.as_str()),
        k0["message_id"].as_str()
    );
    let mut grpc_other = DispatcherClient::connect(other.grpc.clone()).await.unwrap();
    let refused = grpc_other
        .skip(proto::SkipRequest {
            queue: "fwd".into(),
            partition: parked[0].partition,
            key: b"K".to_vec(),
            message_id: "nope".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(refused.status(), proto::SkipStatus::OtherMessage);
    let skip = |body: Value| {
        http.post(format!("{}/queues/fwd/skip", other.http))
            .json(&body)
            .send()
    };
    let wrong = skip(json!({"partition": partition, "key": "K", "message_id": "nope"}))
        .await
        .unwrap();
    assert_eq!(wrong.status(), reqwest::StatusCode::CONFLICT);
    let unknown = skip(json!({"partition": partition, "key_base64": "Wg==", "message_id": "x"}))
        .await
        .unwrap();
    assert_eq!(unknown.status(), reqwest::StatusCode::NOT_FOUND);
    let released =
        skip(json!({"partition": partition, "key": "K", "message_id": k0["message_id"]}))
            .await
            .unwrap();
    assert_eq!(released.status(), reqwest::StatusCode::OK);
    // K1 comes back from the hold, through its owner.
    loop {
        assert!(Instant::now() < deadline, "K1 not replayed");
        let got = http
            .post(format!("{}/queues/fwd/receive", owner.http))
            .json(&json!({"max_messages": 10, "wait_seconds": 1}))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap();
        if let Some(m) = got["messages"].as_array().and_then(|m| m.first()) {
            assert_eq!(m["payload"], "K1");
            // Acked through the other instance: forwarded like any receipt.
            let acked = http
                .post(format!("{}/queues/fwd/ack", other.http))
                .json(&json!({"receipts": [m["receipt"]]}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap();
            assert_eq!(acked["results"][0]["status"], "ok");
            break;
        }
    }
    loop {
        let parked = get(format!("{}/queues/fwd/parked", owner.http)).await;
        if parked == json!({"parked": []}) {
            break;
        }
        assert!(Instant::now() < deadline, "K not released: {parked}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A hot key whose head message waits for a long retry: its 2,500 later
/// messages would fill the partition's prefetch and stop the other keys;
/// the key is spilled to the hold instead, and the other keys flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_behind_a_long_retry_does_not_stop_the_other_keys() {
    let (_broker, config) = setup(
        45307,
        "ord-spill",
        1,
        "lease = \"30s\"\nretry_tiers = [\"1s\", \"2m\"]",
    )
    .await;
    let d = Dispatcher::start(&config).await.unwrap();
    produce(&d, vec![keyed("H", "H0")]).await;
    let deadline = Instant::now() + TIMEOUT;
    let h0 = loop {
        assert!(Instant::now() < deadline);
        if let Some(m) = receive(&d, 1, Duration::from_secs(2)).await.pop() {
            break m;
        }
    };
    // H0 comes back in 2 minutes: the A messages must not wait for it.
    nack(&d, &h0, "slow dependency", Some(Duration::from_secs(120))).await;
    for batch in 0..5 {
        let hot = (0..500)
            .map(|i| keyed("H", &format!("H{}", 1 + batch * 500 + i)))
            .collect();
        produce(&d, hot).await;
    }
    produce(&d, (0..10).map(|i| keyed("A", &format!("A{i}"))).collect()).await;
    let got = drain_in_order(&d, 10).await;
    let want: Vec<String> = (0..10).map(|i| format!("A{i}")).collect();
    assert_eq!(
        got, want,
        "the other key flowed, in order, before H0's retry"
    );
    let parked = parked_until(&d, "H spilled", |p| {
        p.len() == 1 && p[0].held > 0 && p[0].released_by.as_deref() == Some("spill")
    })
    .await;
    assert_eq!(
        parked[0].message_id, h0.message_id,
        "named by its busy message"
    );
    d.shutdown().await;
}
