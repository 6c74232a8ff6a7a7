//! The nack contract (issue 29): a nack answers `ok` only once its failure
//! copy (retry tier or DLQ) is acknowledged by Kafka. It had answered `ok`
//! when its copy failed, and without waiting when another task (the
//! periodic one, or a fetch) happened to write the copy.
//!
//! These tests run our broker behind a proxy (`common::proxy`) that slows
//! or holds its Produce requests by topic, so they do not run against an
//! external broker.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proxy::KafkaProxy;
use common::{envelope_of, read_all, Broker};
use dispatcher_sidecar::config::Config;
use dispatcher_sidecar::kafka;
use dispatcher_sidecar::queue::Dispatcher;
use dispatcher_sidecar::service::{
    Delivery, NackRequest, NewMessage, ProduceStatus, QueueService, ReceiptOutcome, ReceiveRequest,
    ServiceError,
};
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _};

const Q: &str = "jobs";
const TIMEOUT: Duration = Duration::from_secs(30);

fn queue_config(broker: &Broker, topic: &str) -> Config {
    broker.config(&format!(
        "[[queue]]\nname = \"{Q}\"\ntopic = \"{topic}\"\ngroup = \"{topic}-dispatcher\"\n\
         lease = \"30s\"\nretry_tiers = [\"1s\"]\n"
    ))
}

/// Creates the queue's topic, and its tier topic (`<topic>.retry.1s`) with
/// `tier_configs`, before the dispatcher would.
async fn create_topics(config: &Config, topic: &str, tier_configs: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(config).create().unwrap();
    let tier_name = format!("{topic}.retry.1s");
    let mut tier = NewTopic::new(&tier_name, 1, TopicReplication::Fixed(1));
    for (k, v) in tier_configs {
        tier = tier.set(k, v);
    }
    let created = admin
        .create_topics(
            &[NewTopic::new(topic, 1, TopicReplication::Fixed(1)), tier],
            &AdminOptions::new().request_timeout(Some(TIMEOUT)),
        )
        .await
        .unwrap();
    assert!(created.iter().all(|r| r.is_ok()), "{created:?}");
}

async fn produce_and_receive(d: &Dispatcher, payloads: &[&str]) -> Vec<Delivery> {
    let messages = payloads
        .iter()
        .map(|p| NewMessage {
            message_id: Some(format!("id-{p}")),
            key: None,
            payload: p.as_bytes().to_vec(),
            headers: vec![],
            delay: None,
        })
        .collect();
    let results = d.produce(Q, messages).await.unwrap();
    assert!(results.iter().all(|r| r.status == ProduceStatus::Accepted));
    receive_n(d, payloads.len()).await
}

async fn receive_n(d: &Dispatcher, n: usize) -> Vec<Delivery> {
    let deadline = Instant::now() + TIMEOUT;
    let mut got = Vec::new();
    while got.len() < n {
        assert!(Instant::now() < deadline, "{} of {n} messages", got.len());
        let request = ReceiveRequest {
            max_messages: (n - got.len()) as u32,
            wait: Duration::from_secs(1),
            lease: None,
            consumer: Some("worker".into()),
        };
        got.extend(d.receive(Q, request).await.unwrap());
    }
    got.sort_by(|a, b| a.message_id.cmp(&b.message_id));
    got
}

fn nack_request(receipt: &str) -> NackRequest {
    NackRequest {
        receipt: receipt.to_owned(),
        retry_after: None,
        error: Some("handler failed".into()),
        permanent: false,
    }
}

/// The message ids of the records `topic` partition 0 holds now (its
/// high watermark read first).
fn copies_in(config: &Config, topic: &str) -> Vec<String> {
    let reader: BaseConsumer = kafka::admin_config(config).create().unwrap();
    let (_, high) = reader
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .unwrap();
    read_all(config, topic, 1, high as usize)
        .iter()
        .map(|m| envelope_of(m).message_id)
        .collect()
}

/// The periodic task writes the copy of a nack's failure while the nack
/// still waits for its ack-log write (slowed here to 500 ms, over the
/// task's 200 ms period), and the copy is held by the broker: the nack must
/// not answer before the copy is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_waits_for_its_copy_whoever_writes_it() {
    let proxy_addr = "127.0.0.2:45531".parse().unwrap();
    let mut broker = Broker::start_with(
        45530,
        &[("advertised.listeners", "PLAINTEXT://127.0.0.2:45531")],
    );
    let proxy = KafkaProxy::start(proxy_addr, broker.addr).await;
    broker.addr = proxy_addr;
    let topic = "nack-held";
    let config = queue_config(&broker, topic);
    create_topics(&config, topic, &[]).await;
    let d = Arc::new(Dispatcher::start(&config).await.unwrap());
    let got = produce_and_receive(&d, &["a"]).await;

    proxy.delay(&config.queues[0].ack_log_topic, Duration::from_millis(500));
    proxy.hold(&format!("{topic}.retry.1s"));
    let nacking = {
        let d = d.clone();
        let receipt = got[0].receipt.clone();
        tokio::spawn(async move { d.nack(Q, nack_request(&receipt)).await })
    };
    let mut nacking = std::pin::pin!(nacking);
    assert!(
        tokio::time::timeout(Duration::from_secs(2), &mut nacking)
            .await
            .is_err(),
        "the nack answered while its copy was held by the broker"
    );
    proxy.release();
    let answer = tokio::time::timeout(TIMEOUT, nacking)
        .await
        .expect("the nack answers once the copy is written")
        .unwrap();
    assert_eq!(answer, Ok(ReceiptOutcome::Ok));
    assert_eq!(copies_in(&config, &format!("{topic}.retry.1s")), ["id-a"]);
    d.shutdown().await;
}

/// A copy Kafka refuses (the tier's `max.message.bytes` is too small for
/// it): the nack answers 503, not `ok`, and the dispatcher writes the copy
/// again once it can, so the message is not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_whose_copy_is_refused_is_not_ok_and_the_copy_is_written_later() {
    let broker = Broker::start(45535);
    let topic = "nack-refused";
    let tier = format!("{topic}.retry.1s");
    let config = queue_config(&broker, topic);
    create_topics(&config, topic, &[("max.message.bytes", "100")]).await;
    let d = Dispatcher::start(&config).await.unwrap();
    let got = produce_and_receive(&d, &["a", "b"]).await;

    let answer = d.nack(Q, nack_request(&got[0].receipt)).await;
    assert!(
        matches!(&answer, Err(ServiceError::Unavailable(m)) if m.contains("not lost")),
        "a nack whose copy was refused: {answer:?}"
    );

    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(&config).create().unwrap();
    let fixed =
        AlterConfig::new(ResourceSpecifier::Topic(&tier)).set("max.message.bytes", "1048588");
    let altered = admin
        .alter_configs(
            &[fixed],
            &AdminOptions::new().request_timeout(Some(TIMEOUT)),
        )
        .await
        .unwrap();
    assert!(altered.iter().all(|r| r.is_ok()), "{altered:?}");
    // The dispatcher writes the first copy again (its periodic task) once
    // the tier takes it.
    let deadline = Instant::now() + TIMEOUT;
    while !copies_in(&config, &tier).contains(&"id-a".to_string()) {
        assert!(
            Instant::now() < deadline,
            "the refused copy was never written"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        d.nack(Q, nack_request(&got[1].receipt)).await,
        Ok(ReceiptOutcome::Ok)
    );
    assert!(copies_in(&config, &tier).contains(&"id-b".to_string()));
    // Both come back as attempt 2.
    let again = receive_n(&d, 2).await;
    let seen: Vec<(&str, u32)> = again
        .iter()
        .map(|m| (m.message_id.as_str(), m.attempt))
        .collect();
    assert_eq!(seen, [("id-a", 2), ("id-b", 2)]);
    d.shutdown().await;
}
