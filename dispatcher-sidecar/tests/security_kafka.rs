//! The dispatcher's Kafka connection over SASL_SSL (issue 31): our broker
//! with a SASL_SSL listener (PLAIN, SCRAM-SHA-512 and OAUTHBEARER with
//! Kafka's default unsecured-JWT validator, a PEM keystore from a
//! throwaway rcgen PKI; the SCRAM user from `--add-scram`), and the
//! `dispatcher` binary whose only bootstrap address is that listener, its
//! `[librdkafka]` table carrying the SASL and TLS keys. With each mechanism,
//! a message produced through the dispatcher is received and acked; a
//! dispatcher with a wrong password never serves and stops with an error.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dispatcher_sidecar::kafka;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use serde_json::{json, Value};

const PORT: u16 = 45610;
const QUEUE: &str = "sasl-ssl";

/// A CA and, in `<dir>/broker.pem`, the broker's key and chain (Kafka's PEM
/// keystore layout) for 127.0.0.2; the CA in `<dir>/ca.pem`.
fn pki(dir: &std::path::Path) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    // OpenSSL (librdkafka) finds a certificate's issuer by name: no empty names.
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "dispatcher SASL_SSL test CA");
    let ca = params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "localhost");
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress("127.0.0.2".parse().unwrap()));
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(
        dir.join("broker.pem"),
        format!("{}{}{}", key.serialize_pem(), cert.pem(), ca.pem()),
    )
    .unwrap();
}

/// Runs the dispatcher against the SASL_SSL listener as `user` with
/// `password` over `mechanism` (OAUTHBEARER: librdkafka's unsecured JWT
/// for principal `user`, which Kafka's default validator accepts).
fn dispatcher(
    dir: &std::path::Path,
    name: &str,
    port: u16,
    (mechanism, user, password): (&str, &str, &str),
) -> (std::process::Child, String) {
    let credentials = if mechanism == "OAUTHBEARER" {
        format!(
            "\"enable.sasl.oauthbearer.unsecure.jwt\" = true\n\
             \"sasl.oauthbearer.config\" = \"principal={user}\"\n"
        )
    } else {
        format!("\"sasl.username\" = \"{user}\"\n\"sasl.password\" = \"{password}\"\n")
    };
    let path = dir.join(format!("{name}.toml"));
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    std::fs::write(
        &path,
        format!(
            "bootstrap_servers = \"127.0.0.2:{}\"\n\
             http_listen = \"127.0.0.2:{port}\"\n\
             grpc_listen = \"127.0.0.2:{}\"\n\
             internal_listen = \"127.0.0.3:{port}\"\n\
             receipt_secret = \"dispatcher-test-secret-0123456789\"\n\
             [librdkafka]\n\
             \"heartbeat.interval.ms\" = 300\n\
             \"session.timeout.ms\" = 6000\n\
             \"security.protocol\" = \"SASL_SSL\"\n\
             \"sasl.mechanisms\" = \"{mechanism}\"\n\
             {credentials}\
             \"ssl.ca.location\" = \"{}\"\n\
             [[queue]]\nname = \"{QUEUE}\"\ntopic = \"{QUEUE}\"\n",
            PORT + 1,
            port + 1,
            dir.join("ca.pem").display(),
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
        .args(["--config", path.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("the dispatcher binary starts");
    (child, format!("http://127.0.0.2:{port}"))
}

struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dispatcher_works_through_a_sasl_ssl_listener() {
    if std::env::var_os("DISPATCHER_TEST_BOOTSTRAP").is_some() {
        // The external broker has no SASL_SSL listener of ours.
        eprintln!("DISPATCHER_TEST_BOOTSTRAP set: this test needs our broker's SASL_SSL listener");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path());
    let sasl_ssl = format!("127.0.0.2:{}", PORT + 1);
    let listeners = format!("PLAINTEXT://127.0.0.2:{PORT},SASL_SSL://{sasl_ssl}");
    let keystore = dir.path().join("broker.pem").display().to_string();
    let broker = common::Broker::start_with_args(
        PORT,
        &[
            ("listeners", &listeners),
            ("advertised.listeners", &listeners),
            (
                "listener.security.protocol.map",
                "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
            ),
            ("inter.broker.listener.name", "PLAINTEXT"),
            ("sasl.enabled.mechanisms", "PLAIN,SCRAM-SHA-512,OAUTHBEARER"),
            (
                "listener.name.sasl_ssl.plain.sasl.jaas.config",
                "org.apache.kafka.common.security.plain.PlainLoginModule required \
                 user_alice=\"alice-secret\";",
            ),
            ("listener.name.sasl_ssl.ssl.keystore.type", "PEM"),
            ("listener.name.sasl_ssl.ssl.keystore.location", &keystore),
        ],
        &[
            "--add-scram",
            "SCRAM-SHA-512=[name=bob,password=bob-secret]",
        ],
    );
    // The topic, through the PLAINTEXT listener.
    let config = broker.config(&format!(
        "[[queue]]\nname = \"{QUEUE}\"\ntopic = \"{QUEUE}\"\n"
    ));
    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(&config).create().unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new(QUEUE, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new().request_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .unwrap();
    assert!(created[0].is_ok(), "{created:?}");

    // Each mechanism in turn; the first dispatcher leaves the group before
    // the next joins.
    for (name, port, login) in [
        ("plain", 45612, ("PLAIN", "alice", "alice-secret")),
        ("scram", 45616, ("SCRAM-SHA-512", "bob", "bob-secret")),
        ("oauthbearer", 45618, ("OAUTHBEARER", "carol", "")),
    ] {
        let (child, url) = dispatcher(dir.path(), name, port, login);
        let mut good = Killed(child);
        round_trip(dir.path(), name, &url).await;
        // SIGTERM: a clean stop leaves the consumer group at once.
        let _ = Command::new("kill")
            .args(["-TERM", &good.0.id().to_string()])
            .status();
        let _ = good.0.wait();
    }

    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    // A wrong password: the broker refuses the login, the dispatcher never
    // serves and stops with an error (librdkafka reports the refused
    // connection as a transport failure of the metadata fetch).
    let (child, url) = dispatcher(
        dir.path(),
        "bad",
        45614,
        ("PLAIN", "alice", "wrong-password"),
    );
    let mut bad = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = bad.0.try_wait().unwrap() {
            break status;
        }
        let served = http.get(format!("{url}/queues/{QUEUE}")).send().await;
        assert!(
            !served.is_ok_and(|r| r.status().is_success()),
            "a dispatcher that cannot log in serves the queue"
        );
        assert!(
            Instant::now() < deadline,
            "the dispatcher with a wrong password still runs after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let log = std::fs::read_to_string(dir.path().join("bad.log")).unwrap();
    assert!(!status.success(), "{status}; its log:\n{log}");
    assert!(log.contains("dispatcher stopped"), "its log:\n{log}");
}

/// Waits until the dispatcher at `url` owns the queue's partition, then
/// produces, receives and acks one message through it.
async fn round_trip(dir: &std::path::Path, name: &str, url: &str) {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stats = http.get(format!("{url}/queues/{QUEUE}")).send().await;
        if let Ok(r) = stats {
            if r.status().is_success() {
                let v: Value = r.json().await.unwrap();
                if v["partitions"].as_array().is_some_and(|p| p.len() == 1) {
                    break;
                }
            }
        }
        let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        assert!(
            Instant::now() < deadline,
            "the {name} dispatcher did not own the partition over SASL_SSL; its log:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let produced: Value = http
        .post(format!("{url}/queues/{QUEUE}/messages"))
        .json(&json!({ "messages": [{ "payload": "over SASL_SSL" }] }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(produced["results"][0]["status"], "accepted", "{produced}");
    let got: Value = http
        .post(format!("{url}/queues/{QUEUE}/receive"))
        .json(&json!({ "max_messages": 1, "wait_seconds": 10 }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let m = &got["messages"][0];
    assert_eq!(m["payload"], "over SASL_SSL", "{got}");
    let acked: Value = http
        .post(format!("{url}/queues/{QUEUE}/ack"))
        .json(&json!({ "receipts": [m["receipt"]] }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(acked["results"][0]["status"], "ok", "{acked}");
}
