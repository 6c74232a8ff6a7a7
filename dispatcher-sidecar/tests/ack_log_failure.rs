//! An ack whose ack-log write fails: the broker is gone, the write times out
//! (`message.timeout.ms` shortened to 2 s), and the ack answers
//! `Unavailable` (HTTP 503, gRPC `UNAVAILABLE`) instead of confirming, while
//! its wait is still counted in `dispatcher_ack_log_write_seconds`
//! (docs/operations.md). A pause that cannot be recorded is refused the
//! same way. Its own test binary: it installs a global recorder
//! and kills its broker.

mod common;

use common::recorder::TestRecorder;

use std::time::{Duration, Instant};

use dispatcher_sidecar::queue::Dispatcher;
use dispatcher_sidecar::service::{NewMessage, QueueService, ReceiveRequest, ServiceError};

const Q: &str = "fragile";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_whose_ack_log_write_fails_answers_unavailable_and_its_wait_is_counted() {
    if std::env::var_os("DISPATCHER_TEST_BOOTSTRAP").is_some() {
        eprintln!("not run against an external broker: the test kills its own");
        return;
    }
    let recorder = TestRecorder::default();
    metrics::set_global_recorder(recorder.clone()).unwrap();
    let broker = common::Broker::start(45132);
    let mut config = broker.config(&format!(
        "[[queue]]\nname = \"{Q}\"\ntopic = \"fragile\"\nlease = \"30s\"\n"
    ));
    // librdkafka's default is 5 minutes.
    config
        .librdkafka
        .insert("message.timeout.ms".into(), "2000".into());
    common::create_topic(&config, "fragile", 1).await;
    let d = Dispatcher::start(&config).await.unwrap();
    let message = NewMessage {
        message_id: Some("m1".into()),
        key: None,
        payload: b"payload".to_vec(),
        headers: vec![],
        delay: None,
    };
    d.produce(Q, vec![message]).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let delivery = loop {
        assert!(Instant::now() < deadline, "nothing delivered within 30 s");
        let request = ReceiveRequest {
            max_messages: 1,
            wait: Duration::from_secs(5),
            lease: None,
            consumer: None,
        };
        if let Some(m) = d.receive(Q, request).await.unwrap().pop() {
            break m;
        }
    };

    drop(broker); // killed: nothing acknowledges the ack-log write any more
    let started = Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(30), d.ack(Q, &[delivery.receipt]))
        .await
        .expect("the ack answers within 30 s");
    assert!(
        matches!(answer, Err(ServiceError::Unavailable(_))),
        "{answer:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "answered after {:?}, before the write could time out",
        started.elapsed()
    );
    let q = format!("queue={Q}");
    assert_eq!(
        recorder.counter(&format!("dispatcher_acks_total{{{q}}}")),
        0,
        "an unconfirmed ack is not counted as one"
    );
    let waits = recorder.histogram(&format!("dispatcher_ack_log_write_seconds{{{q}}}"));
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert!((1.5..30.0).contains(&waits[0]), "{waits:?}");

    // A pause that cannot be recorded in the control topic is refused the
    // same way (and the public API then applies it nowhere).
    let refused = tokio::time::timeout(Duration::from_secs(30), d.record_paused(Q, true))
        .await
        .expect("the pause answers within 30 s");
    assert!(
        matches!(&refused, Err(ServiceError::Unavailable(m)) if m.contains("fragile.control")),
        "{refused:?}"
    );
    // No shutdown: with the broker gone it would only wait out its commit
    // and close timeouts.
}
