//! The instance's in-flight budget, shared by its queues (issue 8,
//! fairness): a queue with many pollers does not starve one with few, the
//! budget is never exceeded, and it comes back whole as leases end (acked
//! or expired).

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Broker;
use dispatcher_sidecar::config::Config;
use dispatcher_sidecar::kafka;
use dispatcher_sidecar::queue::Dispatcher;
use dispatcher_sidecar::service::{NewMessage, QueueService, ReceiveRequest};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;

const TIMEOUT: Duration = Duration::from_secs(30);
const BUDGET: usize = 10;

/// Queues `big` and `small` on new topics, with a budget of `BUDGET` leases.
async fn setup(port: u16, lease: &str) -> (Broker, Config) {
    let broker = Broker::start(port);
    let mut config = broker.config(&format!(
        "[[queue]]\nname = \"big\"\ntopic = \"fair-big-{port}\"\nlease = \"{lease}\"\n\
         [[queue]]\nname = \"small\"\ntopic = \"fair-small-{port}\"\nlease = \"{lease}\"\n"
    ));
    config.max_in_flight = BUDGET;
    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(&config).create().unwrap();
    let topics = [
        NewTopic::new(&config.queues[0].topic, 4, TopicReplication::Fixed(1)),
        NewTopic::new(&config.queues[1].topic, 2, TopicReplication::Fixed(1)),
    ];
    let r = admin
        .create_topics(&topics, &AdminOptions::new().request_timeout(Some(TIMEOUT)))
        .await
        .unwrap();
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
    (broker, config)
}

async fn fill(d: &Dispatcher, queue: &str, n: usize) {
    for chunk in 0..n.div_ceil(500) {
        let batch = (0..500.min(n - chunk * 500))
            .map(|i| NewMessage {
                message_id: None,
                key: None,
                payload: format!("{queue}-{chunk}-{i}").into_bytes(),
                headers: vec![],
                delay: None,
            })
            .collect();
        d.produce(queue, batch).await.unwrap();
    }
}

fn one(wait: Duration) -> ReceiveRequest {
    ReceiveRequest {
        max_messages: 1,
        wait,
        lease: None,
        consumer: None,
    }
}

/// Receives one message at a time, holds it a moment, acks it, until
/// `stop`; counts what it got.
async fn poller(
    d: Arc<Dispatcher>,
    queue: &'static str,
    stop: Arc<AtomicBool>,
    got: Arc<AtomicUsize>,
) {
    while !stop.load(Ordering::Relaxed) {
        let m = d
            .receive(queue, one(Duration::from_millis(500)))
            .await
            .unwrap();
        if m.is_empty() {
            continue;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        let receipts: Vec<String> = m.into_iter().map(|m| m.receipt).collect();
        d.ack(queue, &receipts).await.unwrap();
        got.fetch_add(receipts.len(), Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_with_many_pollers_does_not_starve_one_with_few() {
    let (_broker, config) = setup(45450, "30s").await;
    let d = Dispatcher::start(&config).await.unwrap();
    fill(&d, "big", 15000).await;
    fill(&d, "small", 6000).await;

    let stop = Arc::new(AtomicBool::new(false));
    let big = Arc::new(AtomicUsize::new(0));
    let small = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..200 {
        tasks.push(tokio::spawn(poller(
            d.clone(),
            "big",
            stop.clone(),
            big.clone(),
        )));
    }
    for _ in 0..8 {
        tasks.push(tokio::spawn(poller(
            d.clone(),
            "small",
            stop.clone(),
            small.clone(),
        )));
    }
    // The budget is never exceeded, by either queue.
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        for q in ["big", "small"] {
            let in_flight = d.stats(q).await.unwrap().in_flight;
            assert!(in_flight <= BUDGET as u64, "{q}: {in_flight} leases out");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let (big, small) = (big.load(Ordering::Relaxed), small.load(Ordering::Relaxed));
    assert!(
        big + small > 100,
        "too little work to judge: {big} + {small}"
    );
    // First come, first served gives the 8 pollers about a tenth of the
    // leases (measured: 0.08 to 0.16); deficit round-robin gives each queue
    // with receives waiting its turn, so up to 8/18 (measured: about 0.35).
    let share = small as f64 / (big + small) as f64;
    eprintln!(
        "small queue: {small} of {} leases ({share:.3})",
        big + small
    );
    assert!(
        share > 0.2,
        "small queue got {small} of {} leases ({share:.3})",
        big + small
    );

    // All acked: the whole budget is free again.
    let got = d
        .receive(
            "small",
            ReceiveRequest {
                max_messages: 100,
                wait: Duration::from_secs(2),
                lease: None,
                consumer: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(got.len(), BUDGET);
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_leases_give_their_room_back() {
    let (_broker, config) = setup(45452, "1s").await;
    let d = Dispatcher::start(&config).await.unwrap();
    fill(&d, "big", 50).await;
    fill(&d, "small", 50).await;
    let mut held = Vec::new();
    while held.len() < BUDGET {
        let want = u32::try_from(BUDGET - held.len()).unwrap();
        let got = d
            .receive(
                "big",
                ReceiveRequest {
                    max_messages: want,
                    wait: Duration::from_secs(5),
                    lease: None,
                    consumer: None,
                },
            )
            .await
            .unwrap();
        held.extend(got);
    }
    // Spent: a receive that does not wait gets nothing, even from the
    // other queue.
    let none = d.receive("small", one(Duration::ZERO)).await.unwrap();
    assert!(none.is_empty());
    // The leases run out (1 s, found by the 200 ms tick): a waiting receive
    // is granted their room.
    let started = Instant::now();
    let got = d
        .receive("small", one(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(500),
        "served after {waited:?}, before the leases ran out"
    );
    d.shutdown().await;
}
