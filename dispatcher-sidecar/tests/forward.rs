//! Issue 7: a request reaching an instance that does not own the receipt's
//! partition is served anyway, forwarded to the owner. Two `dispatcher`
//! binaries share a queue; messages received from one are acked, extended
//! and nacked through the other.

mod common;

use common::Instance;
use std::time::{Duration, Instant};

use dispatcher_sidecar::kafka;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use serde_json::{json, Value};

fn start(broker: &common::Broker, dir: &std::path::Path, name: &str, port: u16) -> Instance {
    start_queue(broker, dir, name, port, "fwd")
}

/// An instance serving queue `queue` on the topic of the same name (its own
/// topic and group, so tests can share one external broker).
fn start_queue(
    broker: &common::Broker,
    dir: &std::path::Path,
    name: &str,
    port: u16,
    queue: &str,
) -> Instance {
    broker.dispatcher(
        dir,
        name,
        port,
        &format!("[[queue]]\nname = \"{queue}\"\ntopic = \"{queue}\"\nlease = \"30s\"\n"),
    )
}

async fn post(http: &reqwest::Client, url: String, body: Value) -> Value {
    let r = http.post(&url).json(&body).send().await.unwrap();
    assert!(r.status().is_success(), "POST {url}: {}", r.status());
    r.json().await.unwrap()
}

/// Both instances own one partition each (the group settled).
async fn wait_for_split(http: &reqwest::Client, a: &Instance, b: &Instance, queue: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut owned = Vec::new();
        for i in [a, b] {
            let stats = match http.get(format!("{}/queues/{queue}", i.http)).send().await {
                Ok(r) if r.status().is_success() => r.json::<Value>().await.unwrap(),
                _ => Value::Null,
            };
            owned.push(stats["partitions"].as_array().map_or(0, |p| p.len()));
        }
        if owned == [1, 1] {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the instances own {owned:?} partitions, not one each"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_are_served_by_any_instance() {
    let broker = common::Broker::start(45160);
    let config = broker.config("[[queue]]\nname = \"fwd\"\ntopic = \"fwd\"\n");
    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(&config).create().unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new("fwd", 2, TopicReplication::Fixed(1))],
            &AdminOptions::new().request_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .unwrap();
    assert!(created[0].is_ok(), "{created:?}");
    let dir = tempfile::tempdir().unwrap();
    let a = start(&broker, dir.path(), "a", 45162);
    let b = start(&broker, dir.path(), "b", 45164);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    wait_for_split(&http, &a, &b, "fwd").await;

    // Keyed messages land on both partitions.
    let messages: Vec<Value> = (0..20)
        .map(|i| json!({ "key": format!("k{i}"), "payload": format!("m{i}") }))
        .collect();
    post(
        &http,
        format!("{}/queues/fwd/messages", a.http),
        json!({ "messages": messages }),
    )
    .await;

    // Everything A serves comes from its own partition.
    let mut receipts = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while receipts.len() < 3 {
        let got = post(
            &http,
            format!("{}/queues/fwd/receive", a.http),
            json!({ "max_messages": 3, "wait_seconds": 1 }),
        )
        .await;
        for m in got["messages"].as_array().unwrap() {
            receipts.push(m["receipt"].as_str().unwrap().to_string());
        }
        assert!(Instant::now() < deadline, "A delivered {receipts:?}");
    }

    // B's own service does not own them ...
    let local = post(
        &http,
        format!("{}/internal/queues/fwd/ack", b.internal),
        json!({ "receipts": [receipts[0]] }),
    )
    .await;
    assert_eq!(local["results"][0]["status"], "not_owner", "{local}");
    // The public listener does not serve the internal routes: a client
    // cannot reach an instance's local service around its forwarding.
    let public = http
        .post(format!("{}/internal/queues/fwd/ack", b.http))
        .json(&json!({ "receipts": [receipts[0]] }))
        .send()
        .await
        .unwrap();
    assert_eq!(public.status(), reqwest::StatusCode::NOT_FOUND);
    let body: Value = public.json().await.unwrap();
    assert_eq!(body["error"]["code"], "no_route", "{body}");
    // ... but B's API serves them through A.
    let extended = post(
        &http,
        format!("{}/queues/fwd/extend", b.http),
        json!({ "receipt": receipts[0], "lease_seconds": 120 }),
    )
    .await;
    assert_eq!(extended["status"], "ok", "{extended}");
    assert!(extended["lease_expires_at"].is_string(), "{extended}");
    let acked = post(
        &http,
        format!("{}/queues/fwd/ack", b.http),
        json!({ "receipts": [receipts[0], receipts[1]] }),
    )
    .await;
    assert_eq!(acked["results"][0]["status"], "ok", "{acked}");
    assert_eq!(acked["results"][1]["status"], "ok", "{acked}");
    let nacked = post(
        &http,
        format!("{}/queues/fwd/nack", b.http),
        json!({ "receipt": receipts[2], "permanent": true, "error": "bad input" }),
    )
    .await;
    assert_eq!(nacked["status"], "ok", "{nacked}");
    // Acked through B, the owner A knows: the receipt is stale there now.
    let again = post(
        &http,
        format!("{}/queues/fwd/ack", a.http),
        json!({ "receipts": [receipts[0]] }),
    )
    .await;
    assert_eq!(again["results"][0]["status"], "stale", "{again}");
}

/// A pause sent to one instance stops the queue on every instance of its
/// group; a resume sent to another starts it everywhere again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_reaches_every_instance_of_the_queue() {
    let broker = common::Broker::start(45460);
    let config = broker.config("[[queue]]\nname = \"fwd-pause\"\ntopic = \"fwd-pause\"\n");
    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(&config).create().unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new("fwd-pause", 2, TopicReplication::Fixed(1))],
            &AdminOptions::new().request_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .unwrap();
    assert!(created[0].is_ok(), "{created:?}");
    let dir = tempfile::tempdir().unwrap();
    let a = start_queue(&broker, dir.path(), "a", 45462, "fwd-pause");
    let b = start_queue(&broker, dir.path(), "b", 45464, "fwd-pause");
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    wait_for_split(&http, &a, &b, "fwd-pause").await;
    let paused = |i: &Instance| {
        let url = format!("{}/queues/fwd-pause", i.http);
        let http = http.clone();
        async move {
            let stats: Value = http.get(&url).send().await.unwrap().json().await.unwrap();
            stats["paused"].as_bool().unwrap()
        }
    };
    assert!(!paused(&a).await && !paused(&b).await);

    post(
        &http,
        format!("{}/queues/fwd-pause/pause", a.http),
        Value::Null,
    )
    .await;
    assert!(paused(&a).await, "the instance asked");
    assert!(paused(&b).await, "the other instance");
    // Nothing is delivered by either while paused; produce still works.
    post(
        &http,
        format!("{}/queues/fwd-pause/messages", b.http),
        json!({ "messages": [{ "key": "k1", "payload": "p" }, { "key": "k2", "payload": "q" }] }),
    )
    .await;
    for i in [&a, &b] {
        let got = post(
            &http,
            format!("{}/queues/fwd-pause/receive", i.http),
            json!({ "max_messages": 10, "wait_seconds": 1 }),
        )
        .await;
        assert_eq!(got["messages"], json!([]), "{got}");
    }

    post(
        &http,
        format!("{}/queues/fwd-pause/resume", b.http),
        Value::Null,
    )
    .await;
    assert!(!paused(&a).await && !paused(&b).await);

    // An instance that cannot be told (killed, still a member until its
    // session times out) is named in a 503; the pause stands where it was
    // asked, and a retry succeeds once the group has dropped the instance.
    let mut b = b;
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    let pause = || {
        http.post(format!("{}/queues/fwd-pause/pause", a.http))
            .send()
    };
    let refused = pause().await.unwrap();
    assert_eq!(refused.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("not on 127.0.0.3:45464"),
        "names the instance not reached: {body}"
    );
    assert!(paused(&a).await, "paused where it was asked");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pause().await.unwrap().status().is_success() {
        assert!(
            Instant::now() < deadline,
            "the group never dropped the killed instance"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(paused(&a).await);

    // The pause is recorded in the queue's control topic: an instance that
    // joins the group later starts paused, and so does one restarted after
    // a kill -9. Each answers its first stats already paused: the control
    // topic is read before the API listens.
    let first_stats = |i: &Instance| {
        let url = format!("{}/queues/fwd-pause", i.http);
        let http = http.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if let Ok(r) = http.get(&url).send().await {
                    if r.status().is_success() {
                        return r.json::<Value>().await.unwrap()["paused"]
                            .as_bool()
                            .unwrap();
                    }
                }
                assert!(Instant::now() < deadline, "{url} never answered");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let c = start_queue(&broker, dir.path(), "c", 45466, "fwd-pause");
    assert!(first_stats(&c).await, "a later instance starts paused");
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let a = start_queue(&broker, dir.path(), "a", 45462, "fwd-pause");
    assert!(first_stats(&a).await, "a restarted instance starts paused");
    let got = post(
        &http,
        format!("{}/queues/fwd-pause/receive", a.http),
        json!({ "max_messages": 10, "wait_seconds": 1 }),
    )
    .await;
    assert_eq!(got["messages"], json!([]), "{got}");

    // A resume is recorded too (a tombstone): the restarted instance starts
    // unpaused.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !http
        .post(format!("{}/queues/fwd-pause/resume", c.http))
        .send()
        .await
        .unwrap()
        .status()
        .is_success()
    {
        // The killed `a` may still be a member until its session times out.
        assert!(Instant::now() < deadline, "the resume never reached both");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(!paused(&a).await && !paused(&c).await);
    let mut c = c;
    c.child.kill().unwrap();
    c.child.wait().unwrap();
    let c = start_queue(&broker, dir.path(), "c", 45466, "fwd-pause");
    assert!(!first_stats(&c).await, "a resume outlives a restart");

    // Each instance follows the control topic: a pause recorded by any
    // instance, here written straight to the topic as a `record_paused`
    // whose broadcast reached nobody, applies everywhere within moments.
    let producer: rdkafka::producer::FutureProducer =
        kafka::producer_config(&config).create().unwrap();
    producer
        .send(
            rdkafka::producer::FutureRecord::to("fwd-pause.control")
                .partition(0)
                .key(&kafka::control::pause_key("fwd-pause-dispatcher"))
                .payload(&kafka::control::pause_value(0)),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(paused(&a).await && paused(&c).await) {
        assert!(
            Instant::now() < deadline,
            "the recorded pause never reached both instances"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A plain Kafka client that joins the queue's group with a dispatcher-like
/// client id naming its own address does not get forwarded acks (and the
/// receipts in them): only addresses signed with the instances' shared
/// receipt secret are forwarded to. The member is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_in_the_group_is_never_forwarded_to() {
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let q = "fwd-stranger";
    let broker = common::Broker::start(45540);
    let config = broker.config(&format!("[[queue]]\nname = \"{q}\"\ntopic = \"{q}\"\n"));
    common::create_topic(&config, q, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let a = start_queue(&broker, dir.path(), "a", 45542, q);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();

    // A owns both partitions; it leases a message of each.
    let owned = |http: reqwest::Client, url: String| async move {
        match http.get(url).send().await {
            Ok(r) if r.status().is_success() => r.json::<Value>().await.unwrap()["partitions"]
                .as_array()
                .map(|p| p.iter().map(|p| p["partition"].as_i64().unwrap()).collect())
                .unwrap_or_default(),
            _ => Vec::<i64>::new(),
        }
    };
    let stats_url = format!("{}/queues/{q}", a.http);
    let deadline = Instant::now() + Duration::from_secs(60);
    while owned(http.clone(), stats_url.clone()).await.len() != 2 {
        assert!(Instant::now() < deadline, "A never owned both partitions");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let messages: Vec<Value> = (0..20)
        .map(|i| json!({ "key": format!("k{i}"), "payload": format!("m{i}") }))
        .collect();
    post(
        &http,
        format!("{}/queues/{q}/messages", a.http),
        json!({ "messages": messages }),
    )
    .await;
    let mut receipts: std::collections::HashMap<i64, String> = Default::default();
    while receipts.len() < 2 {
        assert!(Instant::now() < deadline, "A leased from {receipts:?}");
        let got = post(
            &http,
            format!("{}/queues/{q}/receive", a.http),
            json!({ "max_messages": 20, "wait_seconds": 1, "lease_seconds": 300 }),
        )
        .await;
        for m in got["messages"].as_array().unwrap() {
            receipts
                .entry(m["partition"].as_i64().unwrap())
                .or_insert_with(|| m["receipt"].as_str().unwrap().to_string());
        }
    }

    // The stranger: an HTTP listener that records what reaches it, and a
    // consumer in the queue's group whose client id names it.
    let listener = tokio::net::TcpListener::bind("127.0.0.4:45543")
        .await
        .unwrap();
    let reached = Arc::new(AtomicUsize::new(0));
    {
        let reached = reached.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                reached.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let body = r#"{"results":[{"status":"ok"}]}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            }
        });
    }
    let stranger: BaseConsumer = dispatcher_sidecar::kafka::admin_config(&config)
        .set("group.id", format!("{q}-dispatcher"))
        .set("client.id", format!("dispatcher-{q}@127.0.0.4:45543"))
        .set("enable.auto.commit", "false")
        .set("heartbeat.interval.ms", "300")
        .set("session.timeout.ms", "6000")
        .create()
        .unwrap();
    stranger.subscribe(&[q]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let polling = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let _ = stranger.poll(Duration::from_millis(100));
            }
        })
    };
    // The group gives the stranger one partition.
    let lost = loop {
        let now = owned(http.clone(), stats_url.clone()).await;
        if now.len() == 1 {
            break 1 - now[0];
        }
        assert!(Instant::now() < deadline, "A owns {now:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // An ack for the partition A lost: its owner is the stranger, whose
    // address is not signed. Not forwarded: not_owner.
    let acked = post(
        &http,
        format!("{}/queues/{q}/ack", a.http),
        json!({ "receipts": [receipts[&lost]] }),
    )
    .await;
    assert_eq!(acked["results"][0]["status"], "not_owner", "{acked}");
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "the ack (and its receipt) reached the stranger"
    );
    let metrics = common::metrics(&http, &a.http).await;
    assert!(
        metrics.contains(&format!(
            "dispatcher_group_unverified_members{{queue=\"{q}\"}} 1"
        )),
        "{metrics}"
    );
    stop.store(true, Ordering::SeqCst);
    polling.join().unwrap();
}

/// Two instances of one queue started with different receipt secrets (the
/// misconfiguration that makes every forwarded ack fail): each reports the
/// other, in `GET /queues/{q}` (a count and a warning in words) and in
/// `dispatcher_group_foreign_secret_members`, without any request having
/// been forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_with_another_receipt_secret_is_reported_by_both() {
    let q = "fwd-secrets";
    let broker = common::Broker::start(45560);
    let queue = format!("[[queue]]\nname = \"{q}\"\ntopic = \"{q}\"\n");
    let config = broker.config(&queue);
    common::create_topic(&config, q, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let a = broker.dispatcher(dir.path(), "a", 45562, &queue);
    let b = broker.dispatcher_with_secret(
        dir.path(),
        "b",
        45564,
        &queue,
        "another-secret-for-instance-b-0123",
    );
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    for (name, instance) in [("a", &a), ("b", &b)] {
        let deadline = Instant::now() + Duration::from_secs(60);
        let stats = loop {
            let stats = match http
                .get(format!("{}/queues/{q}", instance.http))
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => r.json::<Value>().await.unwrap(),
                _ => Value::Null,
            };
            if stats["foreign_secret_members"] == 1 {
                break stats;
            }
            assert!(
                Instant::now() < deadline,
                "{name} never reported the other instance: {stats}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let warning = stats["warnings"][0].as_str().unwrap_or_default();
        assert!(warning.contains("receipt_secret"), "{name}: {stats}");
        let metrics = common::metrics(&http, &instance.http).await;
        assert!(
            metrics.contains(&format!(
                "dispatcher_group_foreign_secret_members{{queue=\"{q}\"}} 1"
            )),
            "{name}: {metrics}"
        );
    }
    drop(a);
    drop(b);
}
