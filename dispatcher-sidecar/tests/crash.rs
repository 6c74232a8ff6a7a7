//! Issue 7: kill -9 of one of two dispatcher instances during a 100k-message
//! run loses nothing. Every message is finished by a worker (its ack answered
//! `ok`, or sent to the instance that died before it answered: applied or
//! not, the worker did the work, and an unapplied one brings the message
//! back), no message is acked `ok` twice (that would mean a forgotten ack),
//! the queue ends drained, and the messages delivered more than once are at
//! most what was in flight at the kill.
//!
//! Two `dispatcher` binaries serve one queue of 4 partitions in front of our
//! broker; pull workers spread over both over HTTP. When a third of the
//! messages are acked, instance A gets SIGKILL; its workers move to B, which
//! takes A's partitions over after the group's session timeout and rebuilds
//! them from the ack log (A's leases come back as expired). The message ids
//! are the dispatcher's derived ids of messages produced straight to the
//! topic with a plain Kafka producer.
//!
//! `CRASH_TEST_MESSAGES` overrides the count (default 100,000).

mod common;

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dispatcher_sidecar::kafka;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{json, Value};

const PARTITIONS: i32 = 4;
const WORKERS_PER_INSTANCE: usize = 4;
const BATCH: usize = 50;
/// The whole run must end within this (a stuck run is a failure).
const DEADLINE: Duration = Duration::from_secs(240);

struct Instance {
    child: Option<Child>,
    http: String,
}

impl Instance {
    fn start(broker: &common::Broker, dir: &std::path::Path, name: &str, port: u16) -> Instance {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(
            &path,
            format!(
                "bootstrap_servers = \"{}\"\n\
                 http_listen = \"127.0.0.2:{port}\"\n\
                 grpc_listen = \"127.0.0.2:{}\"\n\
                 internal_listen = \"127.0.0.3:{port}\"\n\
                 receipt_secret = \"crash-test-secret-0123456789\"\n\
                 [librdkafka]\n\
                 \"heartbeat.interval.ms\" = 300\n\
                 \"session.timeout.ms\" = 6000\n\
                 [[queue]]\nname = \"crash\"\ntopic = \"crash\"\nlease = \"30s\"\n",
                broker.addr,
                port + 1
            ),
        )
        .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
            .args(["--config", path.to_str().unwrap()])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the dispatcher binary starts");
        Instance {
            child: Some(child),
            http: format!("http://127.0.0.2:{port}"),
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL the dispatcher");
            let _ = child.wait();
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What the workers saw, per message id.
#[derive(Default)]
struct Ledger {
    deliveries: HashMap<String, u32>,
    /// Acks answered `ok`.
    acked: HashMap<String, u32>,
    /// Acks sent to an instance that died before answering: applied or not,
    /// nobody can tell (if not, the message comes back and is acked again).
    /// The worker finished these messages either way.
    unanswered: HashSet<String>,
}

impl Ledger {
    /// Messages a worker finished: acked, or whose ack went unanswered.
    fn finished(&self) -> usize {
        self.acked.len()
            + self
                .unanswered
                .iter()
                .filter(|id| !self.acked.contains_key(*id))
                .count()
    }
}

async fn wait_healthy(http: &reqwest::Client, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = http.get(format!("{base}/healthz")).send().await {
            if r.status().is_success() {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{base} not healthy within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One pull worker: receive a batch, ack it, until `done`. Starts on
/// `bases[0]` and moves to the next base when the current one is gone.
async fn worker(
    http: reqwest::Client,
    bases: Vec<String>,
    ledger: Arc<Mutex<Ledger>>,
    in_flight: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
) {
    let mut current = 0;
    while !done.load(Ordering::Relaxed) {
        let base = &bases[current];
        let received = http
            .post(format!("{base}/queues/crash/receive"))
            .json(
                &json!({ "max_messages": BATCH, "wait_seconds": 1, "consumer_id": "crash-worker" }),
            )
            .send()
            .await;
        let body: Value = match received {
            Ok(r) if r.status().is_success() => r.json().await.unwrap(),
            Ok(r) => panic!("receive: HTTP {}", r.status()),
            Err(_) => {
                // The instance is gone: move on to the next one.
                current = (current + 1) % bases.len();
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let messages = body["messages"].as_array().unwrap();
        if messages.is_empty() {
            continue;
        }
        let mut ids = Vec::new();
        let mut receipts = Vec::new();
        {
            let mut l = ledger.lock().unwrap();
            for m in messages {
                let id = m["message_id"].as_str().unwrap().to_string();
                *l.deliveries.entry(id.clone()).or_default() += 1;
                ids.push(id);
                receipts.push(m["receipt"].as_str().unwrap().to_string());
            }
        }
        in_flight.fetch_add(ids.len() as u64, Ordering::SeqCst);
        let acked = http
            .post(format!("{base}/queues/crash/ack"))
            .json(&json!({ "receipts": receipts }))
            .send()
            .await;
        in_flight.fetch_sub(ids.len() as u64, Ordering::SeqCst);
        let Ok(r) = acked else {
            // The ack may or may not have been applied; the message comes
            // back if it was not.
            ledger.lock().unwrap().unanswered.extend(ids);
            current = (current + 1) % bases.len();
            continue;
        };
        assert!(r.status().is_success(), "ack: HTTP {}", r.status());
        let body: Value = r.json().await.unwrap();
        let results = body["results"].as_array().unwrap();
        assert_eq!(results.len(), ids.len());
        let mut l = ledger.lock().unwrap();
        for (id, result) in ids.into_iter().zip(results) {
            if result["status"] == "ok" {
                *l.acked.entry(id).or_default() += 1;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_one_of_two_dispatchers_loses_nothing() {
    let total: usize = std::env::var("CRASH_TEST_MESSAGES")
        .ok()
        .map(|v| v.parse().expect("CRASH_TEST_MESSAGES is a number"))
        .unwrap_or(100_000);
    let started = Instant::now();
    let broker = common::Broker::start(45150);
    let config = broker.config("[[queue]]\nname = \"crash\"\ntopic = \"crash\"\n");
    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(&config).create().unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new(
                "crash",
                PARTITIONS,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new().request_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .unwrap();
    assert!(created[0].is_ok(), "{created:?}");

    // The messages, produced straight to the topic by a plain Kafka client.
    let producer: FutureProducer = kafka::producer_config(&config)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let mut pending = Vec::with_capacity(total);
    for i in 0..total {
        let payload = format!("message {i}");
        let key = i.to_string();
        let sent = producer
            .send_result(FutureRecord::to("crash").key(&key).payload(&payload))
            .map_err(|(e, _)| e);
        pending.push(sent);
        if pending.len() == 10_000 {
            for p in pending.drain(..) {
                p.unwrap().await.unwrap().unwrap();
            }
        }
    }
    for p in pending.drain(..) {
        p.unwrap().await.unwrap().unwrap();
    }
    eprintln!("produced {total} in {:?}", started.elapsed());

    let dir = tempfile::tempdir().unwrap();
    let mut a = Instance::start(&broker, dir.path(), "a", 45152);
    let b = Instance::start(&broker, dir.path(), "b", 45154);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    wait_healthy(&http, &a.http).await;
    wait_healthy(&http, &b.http).await;

    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let in_flight = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    for i in 0..2 * WORKERS_PER_INSTANCE {
        let bases = if i % 2 == 0 {
            vec![a.http.clone(), b.http.clone()]
        } else {
            vec![b.http.clone(), a.http.clone()]
        };
        workers.spawn(worker(
            http.clone(),
            bases,
            ledger.clone(),
            in_flight.clone(),
            done.clone(),
        ));
    }

    let acked_count = |l: &Ledger| l.finished();
    let mut killed_with_in_flight = None;
    let deadline = started + DEADLINE;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(w) = workers.try_join_next() {
            w.expect("a worker failed");
        }
        let acked = acked_count(&ledger.lock().unwrap());
        if killed_with_in_flight.is_none() && acked >= total / 3 {
            // Everything leased but not acked anywhere can come back; bound it
            // by every worker's largest batch.
            let seen = in_flight.load(Ordering::SeqCst);
            a.kill();
            eprintln!(
                "killed instance A after {acked} acks ({seen} in flight at the workers), at {:?}",
                started.elapsed()
            );
            killed_with_in_flight = Some(seen);
        }
        if acked >= total {
            break;
        }
        if Instant::now() >= deadline {
            // Which messages never came back, and what B says about them.
            let stats: Value = http
                .get(format!("{}/queues/crash", b.http))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let l = ledger.lock().unwrap();
            let mut missing: Vec<(String, u32)> = (0..PARTITIONS)
                .flat_map(|p| (0..total as i64).map(move |o| format!("crash-{p}-{o}")))
                .filter(|id| {
                    !l.acked.contains_key(id)
                        && !l.unanswered.contains(id)
                        && l.deliveries.contains_key(id)
                })
                .map(|id| {
                    let n = l.deliveries[&id];
                    (id, n)
                })
                .collect();
            missing.sort();
            panic!(
                "only {acked} of {total} acked within {DEADLINE:?}; delivered but never acked: \
                 {} e.g. {:?}; B's stats: {stats}",
                missing.len(),
                &missing[..missing.len().min(20)]
            );
        }
    }
    done.store(true, Ordering::Relaxed);
    while let Some(w) = workers.join_next().await {
        w.expect("a worker failed");
    }

    // Nothing is left in the queue: B's commit point is at the log end.
    let settle = Instant::now() + Duration::from_secs(30);
    loop {
        let stats: Value = http
            .get(format!("{}/queues/crash", b.http))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if stats["depth"] == 0 && stats["in_flight"] == 0 {
            break;
        }
        assert!(Instant::now() < settle, "the queue is not drained: {stats}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let l = ledger.lock().unwrap();
    let twice: Vec<_> = l.acked.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "acked more than once (an ack was lost): {} e.g. {:?}",
        twice.len(),
        twice.first()
    );
    assert_eq!(
        l.finished(),
        total,
        "every message finished by a worker ({} with an unanswered ack)",
        l.unanswered.len()
    );
    assert!(
        (0..PARTITIONS)
            .flat_map(|p| (0..total as i64).map(move |o| format!("crash-{p}-{o}")))
            .filter(|id| l.deliveries.contains_key(id))
            .count()
            == total,
        "the message ids are the derived ones of every produced record"
    );
    let duplicates: u64 = l.deliveries.values().map(|n| u64::from(n - 1)).sum();
    // In flight at the kill: the leases A held. At most every worker's batch.
    let bound = (2 * WORKERS_PER_INSTANCE * BATCH) as u64;
    eprintln!(
        "{total} messages, {} deliveries, {duplicates} duplicates (bound {bound}), \
         {} unanswered acks, in {:?}",
        l.deliveries.values().map(|n| u64::from(*n)).sum::<u64>(),
        l.unanswered.len(),
        started.elapsed()
    );
    assert!(killed_with_in_flight.is_some(), "the kill happened");
    assert!(
        duplicates <= bound,
        "{duplicates} messages delivered again, more than the {bound} that could be in flight"
    );
}
