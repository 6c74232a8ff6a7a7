//! Runs our broker binary for the dispatcher's integration tests.
//!
//! The binary belongs to another package, so `CARGO_BIN_EXE_broker` is not
//! available here. It is found as `$BROKER_BIN`, else next to this test's
//! own build (`<target>/<profile>/broker`: `cargo test --workspace`, as
//! `.ci/run` runs it, builds it there before any test runs). When it is
//! missing (`cargo test -p dispatcher-sidecar` alone), the test builds it
//! with `cargo build -p broker --bin broker` first.
//!
//! `DISPATCHER_TEST_BOOTSTRAP=host:port` runs the tests against a broker
//! already running there instead (e.g. Apache Kafka from
//! `compat-tests/kafka-reference/start.sh`), to check the dispatcher behaves
//! the same in front of it. Use a fresh one: the tests create fixed topic
//! names.

#![allow(dead_code)]

pub mod proxy;
pub mod recorder;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use dispatcher_sidecar::config::Config;
use dispatcher_sidecar::kafka;
use dispatcher_sidecar::lease::RetryEnvelope;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

static BUILD: Mutex<()> = Mutex::new(());

pub fn broker_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("BROKER_BIN") {
        let bin = PathBuf::from(bin);
        assert!(bin.is_file(), "BROKER_BIN={} is not a file", bin.display());
        return bin;
    }
    // <target>/<profile>/deps/<this test> -> <target>/<profile>/broker
    let exe = std::env::current_exe().expect("the test knows its path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test runs from <target>/<profile>/deps");
    let bin = profile_dir.join(format!("broker{}", std::env::consts::EXE_SUFFIX));
    let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    if !bin.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let target_dir = profile_dir.parent().expect("<target>/<profile>");
        let mut cmd = Command::new(&cargo);
        cmd.args(["build", "-p", "broker", "--bin", "broker"])
            .env("CARGO_TARGET_DIR", target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        eprintln!("building the broker binary: {cmd:?}");
        let status = cmd.status().expect("run cargo to build the broker");
        assert!(status.success(), "cargo build -p broker failed: {status}");
    }
    assert!(
        bin.is_file(),
        "broker binary missing at {} (build it with `cargo build -p broker --bin broker`, or set BROKER_BIN)",
        bin.display()
    );
    bin
}

/// A broker process on 127.0.0.2:`port` (off 127.0.0.1, where the fixed test ports inside the
/// ephemeral range can be taken by outgoing connections) with a temporary data directory,
/// killed on drop.
pub struct Broker {
    child: Option<Child>,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Broker {
    pub fn start(port: u16) -> Broker {
        Broker::start_with(port, &[])
    }

    /// [`Broker::start`] with more `--override key=value`s (ignored for a
    /// broker named by `DISPATCHER_TEST_BOOTSTRAP`).
    pub fn start_with(port: u16, overrides: &[(&str, &str)]) -> Broker {
        Self::start_with_args(port, overrides, &[])
    }

    /// As `start_with`, with more command-line arguments (`--add-scram`).
    pub fn start_with_args(port: u16, overrides: &[(&str, &str)], args: &[&str]) -> Broker {
        // The tests' own reqwest clients need a rustls provider: the
        // dispatcher's reqwest is built without one (ring is installed).
        dispatcher_sidecar::security::tls::install_ring_provider();
        if let Ok(external) = std::env::var("DISPATCHER_TEST_BOOTSTRAP") {
            return Broker {
                child: None,
                addr: external
                    .parse()
                    .expect("DISPATCHER_TEST_BOOTSTRAP is ip:port"),
                _dir: tempfile::tempdir().unwrap(),
            };
        }
        let bin = broker_bin();
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new(bin)
            .args([
                "--override",
                &format!("listeners=PLAINTEXT://127.0.0.2:{port}"),
                "--override",
                &format!("log.dirs={}", dir.path().display()),
                "--override",
                "metrics.listen.address=none",
                "--override",
                "group.initial.rebalance.delay.ms=0",
            ])
            .args(
                overrides
                    .iter()
                    .flat_map(|(k, v)| ["--override".to_string(), format!("{k}={v}")]),
            )
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("broker binary starts");
        let addr: SocketAddr = format!("127.0.0.2:{port}").parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "broker not listening on {addr} within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Broker {
            child: Some(child),
            addr,
            _dir: dir,
        }
    }

    /// A dispatcher config for this broker, with `queues` (TOML `[[queue]]`
    /// tables) and short group timers so rebalances take a second, not ten.
    pub fn config(&self, queues: &str) -> Config {
        let text = format!(
            "bootstrap_servers = \"{}\"\n\
             [librdkafka]\n\
             \"heartbeat.interval.ms\" = 300\n\
             \"session.timeout.ms\" = 6000\n\
             \"topic.metadata.refresh.interval.ms\" = 1000\n\
             {queues}",
            self.addr
        );
        Config::parse(&text, "test.toml", std::path::Path::new(".")).unwrap()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A `dispatcher` binary run by a test, killed on drop.
pub struct Instance {
    pub child: Child,
    /// `http://127.0.0.2:<port>`.
    pub http: String,
    /// `http://127.0.0.2:<port + 1>`, the gRPC API.
    pub grpc: String,
    /// `http://127.0.0.3:<port>`, the routes other instances forward to.
    pub internal: String,
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Broker {
    /// Runs the `dispatcher` binary against this broker with HTTP on
    /// 127.0.0.2:`port`, gRPC on `port` + 1, the internal routes on
    /// 127.0.0.3:`port`, the receipt secret every
    /// instance of a test shares, short group timers, and `queues` (TOML
    /// `[[queue]]` tables); its config file is `<dir>/<name>.toml`.
    pub fn dispatcher(
        &self,
        dir: &std::path::Path,
        name: &str,
        port: u16,
        queues: &str,
    ) -> Instance {
        self.dispatcher_with_secret(dir, name, port, queues, "dispatcher-test-secret-0123456789")
    }

    /// As [`Broker::dispatcher`], signing receipts with `secret`.
    pub fn dispatcher_with_secret(
        &self,
        dir: &std::path::Path,
        name: &str,
        port: u16,
        queues: &str,
        secret: &str,
    ) -> Instance {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(
            &path,
            format!(
                "bootstrap_servers = \"{}\"\n\
                 http_listen = \"127.0.0.2:{port}\"\n\
                 grpc_listen = \"127.0.0.2:{}\"\n\
                 internal_listen = \"127.0.0.3:{port}\"\n\
                 receipt_secret = \"{secret}\"\n\
                 [librdkafka]\n\
                 \"heartbeat.interval.ms\" = 300\n\
                 \"session.timeout.ms\" = 6000\n\
                 {queues}",
                self.addr,
                port + 1,
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
            child,
            http: format!("http://127.0.0.2:{port}"),
            grpc: format!("http://127.0.0.2:{}", port + 1),
            internal: format!("http://127.0.0.3:{port}"),
        }
    }
}

/// The Prometheus text an instance serves at `<base>/metrics`.
pub async fn metrics(http: &reqwest::Client, base: &str) -> String {
    http.get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// How long [`read_all`] waits for the records it wants.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The records of `topic`'s partitions `0..partitions`, read from the
/// beginning outside any group until `want` came or 30 s passed.
pub fn read_all(
    config: &Config,
    topic: &str,
    partitions: i32,
    want: usize,
) -> Vec<rdkafka::message::OwnedMessage> {
    let consumer: BaseConsumer = kafka::admin_config(config)
        .set("group.id", "test-reader")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut got = Vec::new();
    while got.len() < want && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            got.push(m.detach());
        }
    }
    got
}

/// The retry envelope a retry or DLQ copy carries in its headers.
pub fn envelope_of(m: &rdkafka::message::OwnedMessage) -> RetryEnvelope {
    let headers: Vec<(String, Vec<u8>)> = m
        .headers()
        .unwrap()
        .iter()
        .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
        .collect();
    RetryEnvelope::from_headers(&headers).unwrap().unwrap()
}

/// Creates `name` with `partitions` partitions (replication factor 1) on the
/// broker `config` names, and checks that the broker took it.
pub async fn create_topic(config: &Config, name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(config).create().unwrap();
    let r = admin
        .create_topics(
            &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().request_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{r:?}");
}

/// Writes one record batch of `payloads` (keyless, compressed with
/// `compression`) to `topic`/`partition` with a Produce request (v8,
/// acks=all) on a plain socket to `addr`, the partition's leader, and
/// returns the partition's error code. The batch is what any Kafka client
/// writes; built here so a test does not depend on which codecs the test's
/// own librdkafka was built with.
pub fn produce_batch(
    addr: SocketAddr,
    topic: &str,
    partition: i32,
    payloads: &[Vec<u8>],
    compression: kafka_protocol::records::Compression,
) -> i16 {
    use bytes::{BufMut as _, Bytes, BytesMut};
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{
        ApiKey, ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader, TopicName,
    };
    use kafka_protocol::protocol::{Decodable as _, Encodable as _, HeaderVersion as _, StrBytes};
    use kafka_protocol::records::{
        Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType, NO_PARTITION_LEADER_EPOCH,
        NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE,
    };
    use std::io::{Read as _, Write as _};

    const VERSION: i16 = 8;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let records: Vec<Record> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
            producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // kafka-protocol's encoder starts a new batch whenever offset
            // minus sequence changes: without a producer id the batch's
            // base sequence is -1 and the rest count up from it.
            sequence: NO_SEQUENCE + i as i32,
            timestamp: now,
            key: None,
            value: Some(Bytes::copy_from_slice(p)),
            headers: Default::default(),
        })
        .collect();
    let mut batch = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut batch,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )
    .unwrap();
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(batch.freeze()))])]);
    let header = RequestHeader::default()
        .with_request_api_key(ApiKey::Produce as i16)
        .with_request_api_version(VERSION)
        .with_correlation_id(1)
        .with_client_id(Some(StrBytes::from_static_str("dispatcher-test")));
    let mut body = BytesMut::new();
    header
        .encode(&mut body, ProduceRequest::header_version(VERSION))
        .unwrap();
    request.encode(&mut body, VERSION).unwrap();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut frame = BytesMut::with_capacity(body.len() + 4);
    frame.put_i32(body.len() as i32);
    frame.extend_from_slice(&body);
    stream.write_all(&frame).unwrap();
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).unwrap();
    let mut answer = vec![0u8; i32::from_be_bytes(size) as usize];
    stream.read_exact(&mut answer).unwrap();
    let mut answer = Bytes::from(answer);
    ResponseHeader::decode(&mut answer, ProduceResponse::header_version(VERSION)).unwrap();
    let response = ProduceResponse::decode(&mut answer, VERSION).unwrap();
    response.responses[0].partition_responses[0].error_code
}
