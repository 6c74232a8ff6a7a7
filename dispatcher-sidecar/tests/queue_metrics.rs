//! The runtime emits the metrics `docs/operations.md` names (the contract with the
//! HTTP API's `/metrics`), with their labels. Its own test binary: it
//! installs a global recorder, which would mix with other tests' queues.

mod common;

use common::recorder::TestRecorder;

use std::time::{Duration, Instant};

use dispatcher_sidecar::queue::Dispatcher;
use dispatcher_sidecar::service::{
    NackRequest, NewMessage, ProduceStatus, QueueService, ReceiptOutcome, ReceiveRequest,
};

const Q: &str = "metered";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_emits_the_contracted_metrics() {
    let recorder = TestRecorder::default();
    metrics::set_global_recorder(recorder.clone()).unwrap();
    let broker = common::Broker::start(45124);
    let config = broker.config(&format!(
        "[[queue]]\nname = \"{Q}\"\ntopic = \"metered\"\nlease = \"30s\"\nretry_tiers = [\"1s\"]\n"
    ));
    common::create_topic(&config, "metered", 1).await;
    let d = Dispatcher::start(&config).await.unwrap();
    let m = |payload: &str| NewMessage {
        message_id: Some(payload.into()),
        key: None,
        payload: payload.as_bytes().to_vec(),
        headers: vec![],
        delay: None,
    };
    let results = d.produce(Q, vec![m("a"), m("b"), m("a")]).await.unwrap();
    assert_eq!(results[2].status, ProduceStatus::Duplicate);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    while got.len() < 2 {
        assert!(Instant::now() < deadline);
        let request = ReceiveRequest {
            max_messages: 2,
            wait: Duration::from_secs(5),
            lease: None,
            consumer: None,
        };
        got.extend(d.receive(Q, request).await.unwrap());
    }
    let (a, b) = (got[0].receipt.clone(), got[1].receipt.clone());
    assert_eq!(
        d.ack(Q, &[a.clone(), a, "garbage".into()]).await.unwrap(),
        vec![
            ReceiptOutcome::Ok,
            ReceiptOutcome::Stale,
            ReceiptOutcome::Invalid
        ]
    );
    let nack = NackRequest {
        receipt: b,
        retry_after: None,
        error: None,
        permanent: true,
    };
    assert_eq!(d.nack(Q, nack).await.unwrap(), ReceiptOutcome::Ok);

    // A lease that runs out: the message comes back as attempt 2.
    d.produce(Q, vec![m("c")]).await.unwrap();
    let mut attempt_of_c = Vec::new();
    while attempt_of_c.len() < 2 {
        assert!(Instant::now() < deadline);
        let request = ReceiveRequest {
            max_messages: 1,
            wait: Duration::from_secs(5),
            lease: Some(Duration::from_secs(1)),
            consumer: None,
        };
        attempt_of_c.extend(d.receive(Q, request).await.unwrap());
    }
    assert_eq!(attempt_of_c[1].attempt, 2);
    let receipt = attempt_of_c[1].receipt.clone();
    assert_eq!(
        d.ack(Q, &[receipt]).await.unwrap(),
        vec![ReceiptOutcome::Ok]
    );

    let q = format!("queue={Q}");
    for (name, want) in [
        (format!("dispatcher_lease_expiries_total{{{q}}}"), 1),
        (format!("dispatcher_redeliveries_total{{{q}}}"), 1),
        (
            format!("dispatcher_produced_total{{{q},status=accepted}}"),
            3,
        ),
        (
            format!("dispatcher_produced_total{{{q},status=duplicate}}"),
            1,
        ),
        (format!("dispatcher_receives_total{{{q}}}"), 4),
        (format!("dispatcher_acks_total{{{q}}}"), 2),
        (format!("dispatcher_stale_receipts_total{{{q}}}"), 1),
        (format!("dispatcher_invalid_receipts_total{{{q}}}"), 1),
        (format!("dispatcher_nacks_total{{{q}}}"), 1),
        (format!("dispatcher_dead_lettered_total{{{q}}}"), 1),
    ] {
        assert_eq!(recorder.counter(&name), want, "{name}");
    }
    let attempts = recorder.histogram(&format!("dispatcher_delivery_attempts{{{q}}}"));
    assert_eq!(attempts, vec![1.0, 1.0, 1.0, 2.0]);
    // One ack-log wait per ack call, each well under Kafka's request timeout.
    let waits = recorder.histogram(&format!("dispatcher_ack_log_write_seconds{{{q}}}"));
    assert_eq!(waits.len(), 2, "{waits:?}");
    assert!(waits.iter().all(|w| (0.0..30.0).contains(w)), "{waits:?}");
    // The gauges follow within a few seconds (watermarks are read ~5 s apart).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let dlq = recorder.gauge(&format!("dispatcher_dlq_depth{{{q}}}"));
        let in_flight = recorder.gauge(&format!("dispatcher_in_flight{{partition=0,{q}}}"));
        let age = recorder.gauge(&format!(
            "dispatcher_oldest_unacked_age_seconds{{partition=0,{q}}}"
        ));
        let retry = recorder.gauge(&format!("dispatcher_retry_depth{{{q},tier=1s}}"));
        let tier_in_flight =
            recorder.gauge(&format!("dispatcher_in_flight{{partition=tier:1s/0,{q}}}"));
        if dlq == Some(1.0) {
            assert_eq!(in_flight, Some(0.0));
            assert_eq!(age, Some(0.0));
            assert_eq!(retry, Some(0.0));
            assert_eq!(tier_in_flight, Some(0.0));
            assert!(recorder
                .gauge(&format!("dispatcher_dlq_oldest_age_seconds{{{q}}}"))
                .is_some());
            break;
        }
        assert!(Instant::now() < deadline, "DLQ depth gauge {dlq:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    d.shutdown().await;
}
