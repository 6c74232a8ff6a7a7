//! The redrive job's metrics (`docs/operations.md`). Its own test binary:
//! it installs a global recorder (a copy of `queue_metrics.rs`'s), which
//! would mix with other tests' queues.

mod common;

use common::recorder::TestRecorder;

use std::time::{Duration, Instant};

use dispatcher_sidecar::queue::Dispatcher;
use dispatcher_sidecar::redrive::{JobState, RedriveAction, RedriveFilter, RedriveRequest};
use dispatcher_sidecar::service::{
    NackRequest, NewMessage, QueueService, ReceiptOutcome, ReceiveRequest,
};

const Q: &str = "redriven";

async fn dead_letter(d: &Dispatcher, keys: &[&str]) {
    let messages = keys
        .iter()
        .map(|k| NewMessage {
            message_id: None,
            key: Some(k.as_bytes().to_vec()),
            payload: b"p".to_vec(),
            headers: vec![],
            delay: None,
        })
        .collect();
    d.produce(Q, messages).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    while got.len() < keys.len() {
        assert!(Instant::now() < deadline);
        let request = ReceiveRequest {
            max_messages: 10,
            wait: Duration::from_secs(2),
            lease: None,
            consumer: None,
        };
        got.extend(d.receive(Q, request).await.unwrap());
    }
    got.sort_by_key(|m| m.offset);
    for m in got {
        let nack = NackRequest {
            receipt: m.receipt,
            retry_after: None,
            error: Some("no".into()),
            permanent: true,
        };
        assert_eq!(d.nack(Q, nack).await.unwrap(), ReceiptOutcome::Ok);
    }
}

async fn run(d: &Dispatcher, request: RedriveRequest) {
    d.redrive_start(Q, request).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while d.redrive_status(Q).await.unwrap().state.is_active() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_job_counts_its_outcomes_and_shows_its_state() {
    let recorder = TestRecorder::default();
    metrics::set_global_recorder(recorder.clone()).unwrap();
    let broker = common::Broker::start(45380);
    let config = broker.config(&format!(
        "[[queue]]\nname = \"{Q}\"\ntopic = \"redriven\"\nlease = \"30s\"\n"
    ));
    common::create_topic(&config, "redriven", 1).await;
    let d = Dispatcher::start(&config).await.unwrap();
    dead_letter(&d, &["a", "b", "a"]).await;
    let q = format!("queue={Q}");
    let outcome = |o: &str| {
        recorder.counter(&format!(
            "dispatcher_redrive_messages_total{{outcome={o},{q}}}"
        ))
    };

    // Offsets 0 a, 1 b, 2 a: the first job takes 0 and 2 and leaves 1.
    run(
        &d,
        RedriveRequest {
            rate_per_sec: 1000.0,
            filter: Some(RedriveFilter {
                key: Some("a".into()),
                ..RedriveFilter::default()
            }),
            max_messages: None,
        },
    )
    .await;
    assert_eq!((outcome("redriven"), outcome("filtered")), (2, 1));
    // The second starts at the floor (1): takes 1, skips 2.
    let all = RedriveRequest {
        rate_per_sec: 1000.0,
        filter: None,
        max_messages: None,
    };
    run(&d, all.clone()).await;
    assert_eq!((outcome("redriven"), outcome("skipped")), (3, 1));
    assert_eq!(outcome("failed"), 0);
    let state = format!("dispatcher_redrive_job_state{{{q}}}");
    let remaining = format!("dispatcher_redrive_remaining{{{q}}}");
    assert_eq!(recorder.gauge(&state), Some(0.0));
    assert_eq!(recorder.gauge(&remaining), Some(0.0));

    // The three copies are delivered and acked: the DLQ keeps its 3.
    let mut copies = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while copies.len() < 3 {
        assert!(Instant::now() < deadline);
        let request = ReceiveRequest {
            max_messages: 3,
            wait: Duration::from_secs(2),
            lease: None,
            consumer: None,
        };
        copies.extend(d.receive(Q, request).await.unwrap());
    }
    assert!(copies.iter().all(|m| m.attempt == 1));
    let receipts: Vec<String> = copies.into_iter().map(|m| m.receipt).collect();
    assert!(d
        .ack(Q, &receipts)
        .await
        .unwrap()
        .iter()
        .all(|o| *o == ReceiptOutcome::Ok));

    // A slow job, paused: state 2 with offsets remaining; cancelled: 0.
    dead_letter(&d, &["c", "c", "c", "c", "c"]).await;
    d.redrive_start(
        Q,
        RedriveRequest {
            rate_per_sec: 1.0,
            ..all
        },
    )
    .await
    .unwrap();
    let paused = d.redrive_control(Q, RedriveAction::Pause).await.unwrap();
    assert_eq!(paused.state, JobState::Paused);
    assert_eq!(recorder.gauge(&state), Some(2.0));
    assert!(recorder.gauge(&remaining).unwrap() >= 3.0, "{paused:?}");
    let cancelled = d.redrive_control(Q, RedriveAction::Cancel).await.unwrap();
    assert_eq!(cancelled.state, JobState::Cancelled);
    assert_eq!(recorder.gauge(&state), Some(0.0));

    // The DLQ gauge counts from the floor: the redriven ones are not in it.
    let left = 5 - cancelled.redriven as i64;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let dlq = recorder.gauge(&format!("dispatcher_dlq_depth{{{q}}}"));
        if dlq == Some(left as f64) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "DLQ depth gauge {dlq:?}, want {left}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    d.shutdown().await;
}
