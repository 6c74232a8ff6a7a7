//! The queue runtime against our broker: leases and their expiry, stale
//! receipts, nacks with a retry delay, the DLQ with its history, group
//! commits, delayed produce, rebuild by a new owner, the gap cap, produce
//! dedupe, records from plain Kafka clients, and receipts of partitions not
//! owned. Each test has its own broker and topics.

mod common;

use std::sync::Arc;
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
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

const TIMEOUT: Duration = Duration::from_secs(30);
const Q: &str = "jobs";

/// A broker on `port` and a config with one queue `jobs` on a new topic
/// `topic` (`partitions`), with `extra` keys, and a 2 s lease and 1 s and
/// 2 s tiers unless `extra` names others.
async fn setup(port: u16, topic: &str, partitions: i32, extra: &str) -> (Broker, Config) {
    // RUST_LOG=dispatcher_sidecar=info shows the runtime's log under the test.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let broker = Broker::start(port);
    let mut keys = extra.to_owned();
    // A group per test: against one external broker
    // (DISPATCHER_TEST_BOOTSTRAP) the tests run side by side.
    let group = format!("\"{topic}-dispatcher\"");
    for (key, default) in [
        ("lease", "\"2s\""),
        ("retry_tiers", "[\"1s\", \"2s\"]"),
        ("group", group.as_str()),
    ] {
        if !extra.lines().any(|l| l.starts_with(&format!("{key} ="))) {
            keys.push_str(&format!("\n{key} = {default}"));
        }
    }
    let config = broker.config(&format!(
        "[[queue]]\nname = \"{Q}\"\ntopic = \"{topic}\"\n{keys}\n"
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

fn message(payload: &str) -> NewMessage {
    NewMessage {
        message_id: None,
        key: None,
        payload: payload.as_bytes().to_vec(),
        headers: vec![],
        delay: None,
    }
}

async fn produce(d: &Dispatcher, payloads: &[&str]) {
    let results = d
        .produce(Q, payloads.iter().map(|p| message(p)).collect())
        .await
        .unwrap();
    assert!(results.iter().all(|r| r.status == ProduceStatus::Accepted));
}

fn request(max: u32, wait: Duration) -> ReceiveRequest {
    ReceiveRequest {
        max_messages: max,
        wait,
        lease: None,
        consumer: Some("worker-1".into()),
    }
}

/// Receives until `n` messages came (or the timeout).
async fn receive_n(d: &Dispatcher, n: usize) -> Vec<Delivery> {
    let deadline = Instant::now() + TIMEOUT;
    let mut got = Vec::new();
    while got.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} messages within {TIMEOUT:?}",
            got.len()
        );
        let want = u32::try_from(n - got.len()).unwrap();
        got.extend(
            d.receive(Q, request(want, Duration::from_secs(5)))
                .await
                .unwrap(),
        );
    }
    got
}

async fn receive_one(d: &Dispatcher) -> Delivery {
    receive_n(d, 1).await.remove(0)
}

async fn nack(
    d: &Dispatcher,
    receipt: &str,
    permanent: bool,
    retry_after: Option<Duration>,
) -> ReceiptOutcome {
    d.nack(
        Q,
        NackRequest {
            receipt: receipt.to_owned(),
            retry_after,
            error: Some("handler failed".into()),
            permanent,
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacked_message_comes_back_as_attempt_2_and_its_old_receipt_is_stale() {
    let (_broker, config) = setup(45100, "expiry", 2, "").await;
    let d = Dispatcher::start(&config).await.unwrap();
    produce(&d, &["hello"]).await;
    let first = receive_one(&d).await;
    assert_eq!((first.attempt, &first.payload[..]), (1, &b"hello"[..]));
    let leased_at = Instant::now();
    let second = receive_one(&d).await;
    assert!(
        leased_at.elapsed() >= Duration::from_millis(1900),
        "redelivered before the lease ran out"
    );
    assert_eq!(second.attempt, 2);
    assert_eq!(second.message_id, first.message_id);
    assert_eq!(
        (second.partition, second.offset),
        (first.partition, first.offset)
    );
    assert_eq!(second.enqueued_at_ms, first.enqueued_at_ms);
    assert_eq!(
        d.ack(Q, &[first.receipt.clone(), second.receipt.clone()])
            .await
            .unwrap(),
        vec![ReceiptOutcome::Stale, ReceiptOutcome::Ok]
    );
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_garbled_and_forged_receipts_are_rejected() {
    let (_broker, config) = setup(45102, "receipts", 1, "lease = \"30s\"").await;
    let d = Dispatcher::start(&config).await.unwrap();
    produce(&d, &["a"]).await;
    let m = receive_one(&d).await;
    let extended = d
        .extend(Q, m.receipt.clone(), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(extended.outcome, ReceiptOutcome::Ok);
    assert!(extended.lease_expires_at_ms.unwrap() >= m.lease_expires_at_ms - 20_000);
    let mut forged = m.receipt.clone().into_bytes();
    forged[10] = if forged[10] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    assert_eq!(
        d.ack(
            Q,
            &[
                m.receipt.clone(),
                m.receipt.clone(),
                "garbage".into(),
                forged
            ]
        )
        .await
        .unwrap(),
        vec![
            ReceiptOutcome::Ok,
            ReceiptOutcome::Stale,
            ReceiptOutcome::Invalid,
            ReceiptOutcome::Invalid
        ]
    );
    assert_eq!(
        nack(&d, &m.receipt, false, None).await,
        ReceiptOutcome::Stale
    );
    let late = d
        .extend(Q, m.receipt.clone(), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        (late.outcome, late.lease_expires_at_ms),
        (ReceiptOutcome::Stale, None)
    );
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_with_retry_after_10s_is_not_redelivered_before_10s() {
    let (_broker, config) = setup(
        45104,
        "retry-after",
        1,
        "lease = \"30s\"\nretry_tiers = [\"1s\", \"10s\"]",
    )
    .await;
    let d = Dispatcher::start(&config).await.unwrap();
    produce(&d, &["slow"]).await;
    let m = receive_one(&d).await;
    let nacked_at = Instant::now();
    assert_eq!(
        nack(&d, &m.receipt, false, Some(Duration::from_secs(10))).await,
        ReceiptOutcome::Ok
    );
    let early = d
        .receive(Q, request(1, Duration::from_millis(9_500)))
        .await
        .unwrap();
    assert!(
        early.is_empty(),
        "redelivered {:?} after the nack",
        nacked_at.elapsed()
    );
    let again = receive_one(&d).await;
    let waited = nacked_at.elapsed();
    assert!(
        waited >= Duration::from_secs(10),
        "redelivered {waited:?} after the nack"
    );
    assert_eq!(
        (again.attempt, again.message_id.as_str()),
        (2, m.message_id.as_str())
    );
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_failures_put_the_message_in_the_dlq_with_five_history_entries() {
    let (_broker, config) = setup(45106, "poison", 1, "lease = \"30s\"\nmax_attempts = 5").await;
    let d = Dispatcher::start(&config).await.unwrap();
    produce(&d, &["poison"]).await;
    let mut ids = Vec::new();
    for attempt in 1..=5 {
        let m = receive_one(&d).await;
        assert_eq!(m.attempt, attempt);
        ids.push(m.message_id.clone());
        assert_eq!(nack(&d, &m.receipt, false, None).await, ReceiptOutcome::Ok);
    }
    assert!(ids.iter().all(|id| *id == ids[0]));
    let nothing = d
        .receive(Q, request(1, Duration::from_secs(3)))
        .await
        .unwrap();
    assert!(
        nothing.is_empty(),
        "a dead-lettered message was delivered again"
    );
    let dlq = read_all(&config, "poison.dlq", 1, 1);
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].payload(), Some(&b"poison"[..]));
    let env = envelope_of(&dlq[0]);
    assert_eq!(env.errors.len(), 5);
    assert_eq!(env.attempt.0, 5);
    assert_eq!(env.message_id, ids[0]);
    assert_eq!(
        (
            env.origin_topic.as_str(),
            env.origin_partition,
            env.origin_offset
        ),
        ("poison", 0, 0)
    );
    assert_eq!(
        env.errors.iter().map(|e| e.attempt).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    assert!(env
        .errors
        .iter()
        .all(|e| e.consumer.as_deref() == Some("worker-1") && e.error == "handler failed"));
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_nack_goes_to_the_dlq_at_once() {
    let (_broker, config) = setup(45108, "permanent", 1, "lease = \"30s\"").await;
    let d = Dispatcher::start(&config).await.unwrap();
    d.produce(
        Q,
        vec![NewMessage {
            key: Some(b"k".to_vec()),
            headers: vec![("trace".into(), b"t1".to_vec())],
            ..message("bad")
        }],
    )
    .await
    .unwrap();
    let m = receive_one(&d).await;
    assert_eq!(m.headers, vec![("trace".to_owned(), b"t1".to_vec())]);
    assert_eq!(nack(&d, &m.receipt, true, None).await, ReceiptOutcome::Ok);
    let dlq = read_all(&config, "permanent.dlq", 1, 1);
    assert_eq!(
        dlq.len(),
        1,
        "the DLQ copy is written before the nack answers"
    );
    assert_eq!(dlq[0].key(), Some(&b"k"[..]));
    let env = envelope_of(&dlq[0]);
    assert_eq!((env.attempt.0, env.errors.len()), (1, 1));
    assert!(dlq[0].headers().unwrap().iter().any(|h| h.key == "trace"));
    let nothing = d
        .receive(Q, request(1, Duration::from_secs(2)))
        .await
        .unwrap();
    assert!(nothing.is_empty());
    // The DLQ figures are cached for a second.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = d.stats(Q).await.unwrap();
        if stats.dlq_depth == 1 {
            assert!(stats.dlq_oldest_age_ms >= 0);
            break;
        }
        assert!(Instant::now() < deadline, "DLQ depth {}", stats.dlq_depth);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_commit_advances_past_acked_messages() {
    let (_broker, config) = setup(45110, "commits", 2, "lease = \"30s\"").await;
    let d = Dispatcher::start(&config).await.unwrap();
    produce(&d, &["1", "2", "3", "4", "5", "6"]).await;
    let got = receive_n(&d, 6).await;
    let stats = d.stats(Q).await.unwrap();
    assert_eq!((stats.depth, stats.in_flight), (6, 6));
    assert!(stats.oldest_unacked_age_ms >= 0);
    let receipts: Vec<String> = got.iter().map(|m| m.receipt.clone()).collect();
    assert!(d
        .ack(Q, &receipts)
        .await
        .unwrap()
        .iter()
        .all(|o| *o == ReceiptOutcome::Ok));
    let mut ends = [0i64; 2];
    for m in &got {
        ends[m.partition as usize] = ends[m.partition as usize].max(m.offset + 1);
    }
    let group: BaseConsumer = kafka::admin_config(&config)
        .set("group.id", "commits-dispatcher")
        .create()
        .unwrap();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition("commits", 0);
        tpl.add_partition("commits", 1);
        let committed: Vec<Offset> = group
            .committed_offsets(tpl, TIMEOUT)
            .unwrap()
            .elements()
            .iter()
            .map(|e| e.offset())
            .collect();
        let want: Vec<Offset> = ends
            .iter()
            .map(|&e| {
                if e == 0 {
                    Offset::Invalid
                } else {
                    Offset::Offset(e)
                }
            })
            .collect();
        if committed
            .iter()
            .zip(&want)
            .all(|(c, w)| c == w || (*w == Offset::Invalid && *c == Offset::Offset(0)))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "group commit {committed:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let stats = d.stats(Q).await.unwrap();
    assert_eq!(
        (stats.depth, stats.in_flight, stats.oldest_unacked_age_ms),
        (0, 0, 0)
    );
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_is_not_delivered_before_its_delay() {
    let (_broker, config) = setup(45112, "delayed", 1, "").await;
    let d = Dispatcher::start(&config).await.unwrap();
    let at = Instant::now();
    let r = d
        .produce(
            Q,
            vec![NewMessage {
                message_id: Some("later".into()),
                delay: Some(Duration::from_millis(1_500)),
                ..message("later")
            }],
        )
        .await
        .unwrap();
    assert_eq!(r[0].status, ProduceStatus::Accepted);
    let m = receive_one(&d).await;
    assert!(
        at.elapsed() >= Duration::from_millis(1_450),
        "delivered after {:?}",
        at.elapsed()
    );
    assert_eq!(
        (m.message_id.as_str(), m.attempt, &m.payload[..]),
        ("later", 1, &b"later"[..])
    );
    assert!(m.headers.is_empty());
    assert_eq!(
        d.ack(Q, &[m.receipt]).await.unwrap(),
        vec![ReceiptOutcome::Ok]
    );
    let too_long = d
        .produce(
            Q,
            vec![NewMessage {
                delay: Some(Duration::from_secs(3)),
                ..message("x")
            }],
        )
        .await;
    assert!(
        too_long.is_err(),
        "a delay past the longest tier is refused"
    );
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_owner_rebuilds_acked_as_done_and_in_flight_as_leasable() {
    let (_broker, config) = setup(45114, "rebuild", 1, "lease = \"60s\"").await;
    let first = Dispatcher::start(&config).await.unwrap();
    produce(&first, &["0", "1", "2", "3"]).await;
    let got = receive_n(&first, 4).await;
    let by_offset = |o: i64| got.iter().find(|m| m.offset == o).unwrap().clone();
    let acks = vec![by_offset(0).receipt, by_offset(2).receipt];
    assert_eq!(
        first.ack(Q, &acks).await.unwrap(),
        vec![ReceiptOutcome::Ok; 2]
    );
    first.shutdown().await;
    // The stopped instance owns nothing: it cannot answer for the receipt.
    assert_eq!(
        first.ack(Q, &[by_offset(1).receipt]).await.unwrap(),
        vec![ReceiptOutcome::NotOwner]
    );
    drop(first);

    let second = Dispatcher::start(&config).await.unwrap();
    let again = receive_n(&second, 2).await;
    let mut offsets: Vec<i64> = again.iter().map(|m| m.offset).collect();
    offsets.sort();
    assert_eq!(
        offsets,
        vec![1, 3],
        "acked messages are done, in-flight ones come back"
    );
    assert!(
        again.iter().all(|m| m.attempt == 1),
        "a crash does not count an attempt"
    );
    assert_eq!(
        second.ack(Q, &[by_offset(1).receipt]).await.unwrap(),
        vec![ReceiptOutcome::Stale],
        "the previous owner's receipt names an older lease"
    );
    let receipts: Vec<String> = again.iter().map(|m| m.receipt.clone()).collect();
    assert_eq!(
        second.ack(Q, &receipts).await.unwrap(),
        vec![ReceiptOutcome::Ok; 2]
    );
    let nothing = second
        .receive(Q, request(1, Duration::from_secs(1)))
        .await
        .unwrap();
    assert!(nothing.is_empty());
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gap_cap_forces_the_stuck_message_to_retry() {
    let (_broker, config) = setup(45116, "gapcap", 1, "lease = \"60s\"\ngap_cap = 3").await;
    let d = Dispatcher::start(&config).await.unwrap();
    produce(&d, &["stuck", "1", "2", "3", "4"]).await;
    let stuck = receive_one(&d).await;
    assert_eq!(stuck.offset, 0);
    let next = receive_n(&d, 2).await;
    assert_eq!(
        next.iter().map(|m| m.offset).collect::<Vec<_>>(),
        vec![1, 2]
    );
    let receipts: Vec<String> = next.iter().map(|m| m.receipt.clone()).collect();
    assert_eq!(
        d.ack(Q, &receipts).await.unwrap(),
        vec![ReceiptOutcome::Ok; 2]
    );
    // Offsets 3 and 4 are past the window until the stuck message moves;
    // the gap cap then sends it to the retry tier as attempt 2.
    let rest = receive_n(&d, 3).await;
    let retried = rest
        .iter()
        .find(|m| m.offset == 0)
        .expect("the stuck message is retried");
    assert_eq!(retried.attempt, 2);
    let mut offsets: Vec<i64> = rest.iter().map(|m| m.offset).collect();
    offsets.sort();
    assert_eq!(offsets, vec![0, 3, 4]);
    assert_eq!(
        d.ack(Q, &[stuck.receipt]).await.unwrap(),
        vec![ReceiptOutcome::Stale]
    );
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_message_id_answers_the_first_copy() {
    let (_broker, config) = setup(45118, "dedupe", 2, "").await;
    let d = Dispatcher::start(&config).await.unwrap();
    let with_id = |payload: &str| NewMessage {
        message_id: Some("order-17".into()),
        ..message(payload)
    };
    let first = d.produce(Q, vec![with_id("a")]).await.unwrap().remove(0);
    let second = d
        .produce(Q, vec![with_id("b"), message("c")])
        .await
        .unwrap();
    assert_eq!(first.status, ProduceStatus::Accepted);
    assert_eq!(second[0].status, ProduceStatus::Duplicate);
    assert_eq!(
        (second[0].partition, second[0].offset),
        (first.partition, first.offset)
    );
    assert_eq!(second[1].status, ProduceStatus::Accepted);
    assert_ne!(second[1].message_id, "order-17");
    let twice = d
        .produce(Q, vec![with_id("d"), message("e"), with_id("f")])
        .await
        .unwrap();
    assert_eq!(
        twice.iter().map(|r| r.status).collect::<Vec<_>>(),
        vec![
            ProduceStatus::Duplicate,
            ProduceStatus::Accepted,
            ProduceStatus::Duplicate
        ]
    );
    let again = |id: &str, payload: &str| NewMessage {
        message_id: Some(id.into()),
        ..message(payload)
    };
    let in_one = d
        .produce(Q, vec![again("x-1", "g"), again("x-1", "h")])
        .await
        .unwrap();
    assert_eq!(
        in_one.iter().map(|r| r.status).collect::<Vec<_>>(),
        vec![ProduceStatus::Accepted, ProduceStatus::Duplicate]
    );
    assert_eq!(
        (in_one[0].partition, in_one[0].offset),
        (in_one[1].partition, in_one[1].offset)
    );
    let got = receive_n(&d, 4).await;
    let mut payloads: Vec<&[u8]> = got.iter().map(|m| &m.payload[..]).collect();
    payloads.sort();
    assert_eq!(payloads, vec![&b"a"[..], &b"c"[..], &b"e"[..], &b"g"[..]]);
    let nothing = d
        .receive(Q, request(1, Duration::from_secs(1)))
        .await
        .unwrap();
    assert!(nothing.is_empty(), "the duplicate was written");
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_id_stays_a_duplicate_across_a_restart_and_on_another_instance() {
    let (_broker, config) = setup(45126, "dedupe2", 2, "").await;
    let with_id = |id: &str| NewMessage {
        message_id: Some(id.into()),
        ..message("m")
    };
    let first = Dispatcher::start(&config).await.unwrap();
    let accepted = first
        .produce(Q, vec![with_id("before-restart")])
        .await
        .unwrap();
    assert_eq!(accepted[0].status, ProduceStatus::Accepted);
    first.shutdown().await;
    drop(first);

    // A new process: it learns the window from the dedupe topic.
    let restarted = Dispatcher::start(&config).await.unwrap();
    let again = restarted
        .produce(Q, vec![with_id("before-restart")])
        .await
        .unwrap();
    assert_eq!(again[0].status, ProduceStatus::Duplicate);
    assert_eq!(
        (again[0].partition, again[0].offset),
        (accepted[0].partition, accepted[0].offset)
    );

    // Another running instance learns the ids this one accepts.
    let other = Dispatcher::start(&config).await.unwrap();
    let here = restarted
        .produce(Q, vec![with_id("while-both-run")])
        .await
        .unwrap();
    assert_eq!(here[0].status, ProduceStatus::Accepted);
    // It follows the dedupe topic (a poll every 100 ms); give it ample time.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let there = other
        .produce(Q, vec![with_id("while-both-run")])
        .await
        .unwrap();
    assert_eq!(there[0].status, ProduceStatus::Duplicate, "{there:?}");
    assert_eq!(
        (there[0].partition, there[0].offset),
        (here[0].partition, here[0].offset)
    );
    other.shutdown().await;
    restarted.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_from_a_plain_kafka_producer_is_served() {
    let (_broker, config) = setup(45120, "plain", 1, "").await;
    let d: Arc<Dispatcher> = Dispatcher::start(&config).await.unwrap();
    let producer: FutureProducer = kafka::admin_config(&config).create().unwrap();
    producer
        .send(
            FutureRecord::to("plain")
                .key("k")
                .payload("from kafka")
                .headers(OwnedHeaders::new().insert(Header {
                    key: "h",
                    value: Some("v"),
                })),
            TIMEOUT,
        )
        .await
        .unwrap();
    let m = receive_one(&d).await;
    assert_eq!(m.payload, &b"from kafka"[..]);
    assert_eq!(m.key.as_deref(), Some(&b"k"[..]));
    assert_eq!(m.headers, vec![("h".to_owned(), b"v".to_vec())]);
    assert_eq!((m.attempt, m.message_id.as_str()), (1, "plain-0-0"));
    assert!(m.enqueued_at_ms > 0);
    assert_eq!(
        d.ack(Q, &[m.receipt]).await.unwrap(),
        vec![ReceiptOutcome::Ok]
    );
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_leases_nothing_takes_produces_and_a_resume_wakes_a_long_poll() {
    let (_broker, config) = setup(45128, "paused", 1, "lease = \"30s\"").await;
    let d: Arc<Dispatcher> = Dispatcher::start(&config).await.unwrap();
    produce(&d, &["before"]).await;
    let first = receive_one(&d).await;
    d.set_paused(Q, true).await.unwrap();
    d.set_paused(Q, true).await.unwrap(); // idempotent
    assert!(d.stats(Q).await.unwrap().paused);
    // Produce, ack and the stats go on; receives lease nothing.
    produce(&d, &["during"]).await;
    assert_eq!(
        d.ack(Q, &[first.receipt]).await.unwrap(),
        vec![ReceiptOutcome::Ok]
    );
    let waited = Instant::now();
    let got = d
        .receive(Q, request(10, Duration::from_secs(2)))
        .await
        .unwrap();
    assert!(got.is_empty(), "a paused queue delivered {got:?}");
    assert!(
        waited.elapsed() >= Duration::from_millis(1900),
        "the long poll waited"
    );
    // A long poll waiting during the pause answers once resumed.
    let poll = {
        let d = Arc::clone(&d);
        tokio::spawn(async move { d.receive(Q, request(10, Duration::from_secs(15))).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!poll.is_finished(), "the long poll waits while paused");
    d.set_paused(Q, false).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .expect("the resume wakes the long poll")
        .unwrap()
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, &b"during"[..]);
    assert!(!d.stats(Q).await.unwrap().paused);
    assert!(matches!(
        d.set_paused("nope", true).await,
        Err(dispatcher_sidecar::service::ServiceError::UnknownQueue(_))
    ));
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_takes_half_and_the_first_keeps_its_leases_on_the_rest() {
    let (_broker, config) = setup(45122, "shared", 2, "lease = \"30s\"").await;
    let one = Dispatcher::start(&config).await.unwrap();
    // Keyed: null keys stick to one partition for a batch (librdkafka's
    // sticky partitioner); twenty keys land on both.
    let keyed = (0..20)
        .map(|i| NewMessage {
            key: Some(format!("key-{i}").into_bytes()),
            ..message("m")
        })
        .collect();
    one.produce(Q, keyed).await.unwrap();
    let leased = receive_n(&one, 20).await;

    let two = Dispatcher::start(&config).await.unwrap();
    let primary = |d: &Dispatcher| -> Vec<i32> {
        d.owned_partitions(Q)
            .into_iter()
            .filter(|qp| qp.topic == 0)
            .map(|qp| qp.partition)
            .collect()
    };
    let deadline = Instant::now() + TIMEOUT;
    while primary(&one).len() != 1 || primary(&two).len() != 1 {
        assert!(
            Instant::now() < deadline,
            "the instances own {:?} and {:?}",
            primary(&one),
            primary(&two)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let kept = primary(&one)[0];
    let (mine, theirs): (Vec<Delivery>, Vec<Delivery>) =
        leased.into_iter().partition(|m| m.partition == kept);
    assert!(!mine.is_empty() && !theirs.is_empty());
    let receipts = |ms: &[Delivery]| ms.iter().map(|m| m.receipt.clone()).collect::<Vec<_>>();
    // The partition handed away: the first instance is not its owner, and
    // the new owner released those leases (a new generation each).
    assert!(one
        .ack(Q, &receipts(&theirs))
        .await
        .unwrap()
        .iter()
        .all(|o| *o == ReceiptOutcome::NotOwner));
    assert!(two
        .ack(Q, &receipts(&theirs))
        .await
        .unwrap()
        .iter()
        .all(|o| *o == ReceiptOutcome::Stale));
    assert_eq!(
        nack(&two, &mine[0].receipt, false, None).await,
        ReceiptOutcome::NotOwner
    );
    // The partition the rebalance handed straight back resumed with its
    // leases: the receipts still hold.
    assert!(one
        .ack(Q, &receipts(&mine))
        .await
        .unwrap()
        .iter()
        .all(|o| *o == ReceiptOutcome::Ok));
    let again = receive_n(&two, theirs.len()).await;
    assert!(again.iter().all(|m| m.partition != kept && m.attempt == 1));
    one.shutdown().await;
    two.shutdown().await;
}
