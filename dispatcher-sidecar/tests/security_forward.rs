//! Forwarding between two `dispatcher` binaries with `[internal] secret`
//! and `[auth]`: a worker's ack sent to the instance that does not own the
//! receipt is forwarded with the internal secret and lands; the owner's
//! internal listener refuses a caller without the secret. Once over
//! plaintext, once with `[tls]` on every listener and `[internal] tls`
//! (forwarding over https, the peer verified against `ca_file`).

mod common;

use common::Instance;
use std::time::{Duration, Instant};

use dispatcher_sidecar::kafka;
use dispatcher_sidecar::security::auth::token_sha256_hex;
use dispatcher_sidecar::security::INTERNAL_SECRET_HEADER;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use serde_json::{json, Value};

const QUEUE: &str = "sec-fwd";
const TOKEN: &str = "worker-token-0123456789";
const SECRET: &str = "internal-secret-0123456789";

fn queues(tls: bool) -> String {
    // The certificate is the test PKI's (see `pki`), for both addresses.
    let tls = if tls {
        "tls = true\nca_file = \"ca.pem\"\n[tls]\ncert_file = \"server.pem\"\nkey_file = \"server.key\"\n"
    } else {
        ""
    };
    format!(
        "[internal]\nsecret = \"{SECRET}\"\n{tls}\
         [auth]\ntokens = [{{ principal = \"worker\", sha256 = \"{}\" }}]\n\
         [[auth.queue]]\nname = \"{QUEUE}\"\nproduce = [\"worker\"]\nreceive = [\"worker\"]\n\
         [[queue]]\nname = \"{QUEUE}\"\ntopic = \"{QUEUE}\"\nlease = \"30s\"\n",
        token_sha256_hex(TOKEN)
    )
}

async fn post(http: &reqwest::Client, url: String, body: Value) -> Value {
    let r = http
        .post(&url)
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "POST {url}: {}", r.status());
    r.json().await.unwrap()
}

async fn owned(http: &reqwest::Client, i: &Instance) -> usize {
    match http
        .get(format!("{}/queues/{QUEUE}", i.http))
        .bearer_auth(TOKEN)
        .send()
        .await
    {
        Ok(r) if r.status().is_success() => r.json::<Value>().await.unwrap()["partitions"]
            .as_array()
            .map_or(0, Vec::len),
        _ => 0,
    }
}

/// A CA (`<dir>/ca.pem`) and a server certificate for 127.0.0.2 and
/// 127.0.0.3 (`server.pem`, `server.key`).
fn pki(dir: &std::path::Path) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "forwarding test CA");
    let ca = params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    for ip in ["127.0.0.2", "127.0.0.3"] {
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(ip.parse().unwrap()));
    }
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("server.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_requests_carry_the_internal_secret() {
    forwarding((45600, 45602, 45604), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_runs_over_tls_to_the_internal_listener() {
    forwarding((45620, 45622, 45624), true).await;
}

async fn forwarding((broker_port, a_port, b_port): (u16, u16, u16), tls: bool) {
    let broker = common::Broker::start(broker_port);
    let config = broker.config(&format!(
        "[[queue]]\nname = \"{QUEUE}\"\ntopic = \"{QUEUE}\"\n"
    ));
    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(&config).create().unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new(QUEUE, 2, TopicReplication::Fixed(1))],
            &AdminOptions::new().request_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .unwrap();
    assert!(created[0].is_ok(), "{created:?}");
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path());
    let https = |mut i: common::Instance| {
        if tls {
            for url in [&mut i.http, &mut i.grpc, &mut i.internal] {
                *url = url.replacen("http://", "https://", 1);
            }
        }
        i
    };
    let a = https(broker.dispatcher(dir.path(), "a", a_port, &queues(tls)));
    let b = https(broker.dispatcher(dir.path(), "b", b_port, &queues(tls)));
    let mut http = reqwest::Client::builder().no_proxy();
    if tls {
        dispatcher_sidecar::security::tls::install_ring_provider();
        http = http.tls_backend_preconfigured(
            dispatcher_sidecar::security::tls::client_config(&dir.path().join("ca.pem"), None)
                .unwrap(),
        );
    }
    let http = http.build().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while (owned(&http, &a).await, owned(&http, &b).await) != (1, 1) {
        assert!(
            Instant::now() < deadline,
            "the instances did not split the partitions"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let messages: Vec<Value> = (0..20)
        .map(|i| json!({ "key": format!("k{i}"), "payload": format!("m{i}") }))
        .collect();
    post(
        &http,
        format!("{}/queues/{QUEUE}/messages", a.http),
        json!({ "messages": messages }),
    )
    .await;
    let mut receipts = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while receipts.len() < 2 {
        let got = post(
            &http,
            format!("{}/queues/{QUEUE}/receive", a.http),
            json!({ "max_messages": 2, "wait_seconds": 1 }),
        )
        .await;
        for m in got["messages"].as_array().unwrap() {
            receipts.push(m["receipt"].as_str().unwrap().to_string());
        }
        assert!(Instant::now() < deadline, "A delivered {receipts:?}");
    }

    // A's internal listener refuses a caller without the secret, or with
    // another one, before anything is acked.
    for secret in [None, Some("another-secret-0123456789")] {
        let mut req = http
            .post(format!("{}/internal/queues/{QUEUE}/ack", a.internal))
            .json(&json!({ "receipts": [receipts[0]] }));
        if let Some(s) = secret {
            req = req.header(INTERNAL_SECRET_HEADER, s);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), reqwest::StatusCode::UNAUTHORIZED, "{secret:?}");
    }
    // The public API refuses a caller without a token.
    let r = http
        .post(format!("{}/queues/{QUEUE}/ack", b.http))
        .json(&json!({ "receipts": [receipts[0]] }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::UNAUTHORIZED);
    // B forwards the worker's ack to A with the secret: it lands.
    let acked = post(
        &http,
        format!("{}/queues/{QUEUE}/ack", b.http),
        json!({ "receipts": [receipts[0]] }),
    )
    .await;
    assert_eq!(acked["results"][0]["status"], "ok", "{acked}");
    // With the secret, A's internal listener serves: the receipt acked
    // through B is stale there now, the other is acked.
    let r: Value = http
        .post(format!("{}/internal/queues/{QUEUE}/ack", a.internal))
        .header(INTERNAL_SECRET_HEADER, SECRET)
        .json(&json!({ "receipts": [receipts[0], receipts[1]] }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["results"][0]["status"], "stale", "{r}");
    assert_eq!(r["results"][1]["status"], "ok", "{r}");
}
