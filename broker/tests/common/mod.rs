//! A small Kafka client for tests, built on kafka-protocol's encoders, plus
//! helpers to start a broker in-process on 127.0.0.1:0.
#![allow(dead_code)]

pub mod cluster;

use std::time::Duration;

use broker::config::ServerConfig;
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct TestBroker {
    pub running: broker::RunningBroker,
    pub dir: tempfile::TempDir,
}

pub fn config(dir: &std::path::Path, extra: &[(&str, &str)]) -> ServerConfig {
    let mut pairs = vec![
        (
            "listeners".to_string(),
            "PLAINTEXT://127.0.0.1:0".to_string(),
        ),
        ("log.dirs".to_string(), dir.display().to_string()),
        ("metrics.listen.address".to_string(), "none".to_string()),
    ];
    pairs.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    ServerConfig::from_pairs(pairs).expect("valid test config")
}

pub async fn start(extra: &[(&str, &str)]) -> TestBroker {
    let dir = tempfile::tempdir().unwrap();
    let running = broker::start(config(dir.path(), extra))
        .await
        .expect("broker starts");
    TestBroker { running, dir }
}

/// What a test client talks over: a TCP stream, or TLS over one.
pub trait Transport: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Transport for T {}

pub struct Client {
    stream: Box<dyn Transport>,
    correlation_id: i32,
}

impl Client {
    pub async fn connect(addr: std::net::SocketAddr) -> Client {
        Client::over(TcpStream::connect(addr).await.unwrap())
    }

    pub fn over<T: Transport + 'static>(stream: T) -> Client {
        Client {
            stream: Box::new(stream),
            correlation_id: 0,
        }
    }

    /// Sends a request without reading the answer.
    pub async fn send<R: Encodable>(&mut self, key: ApiKey, version: i16, req: &R) {
        let mut body = BytesMut::new();
        req.encode(&mut body, version).unwrap();
        self.send_body(key, version, &body).await;
    }

    /// Sends a request at a version newer than kafka-protocol's (with
    /// `newer`'s fields) and returns the raw response body.
    #[allow(dead_code)]
    pub async fn call_newer(
        &mut self,
        key: ApiKey,
        version: i16,
        req: kafka_protocol::messages::RequestKind,
        newer: Option<protocol::newer::NewerRequest>,
    ) -> Bytes {
        let mut body = BytesMut::new();
        protocol::newer::encode_request_body(key, version, &req, newer, &mut body).unwrap();
        self.send_body(key, version, &body).await;
        let mut resp = self.read_frame().await.expect("response");
        let header =
            ResponseHeader::decode(&mut resp, key.response_header_version(version)).unwrap();
        assert_eq!(header.correlation_id, self.correlation_id);
        resp
    }

    async fn send_body(&mut self, key: ApiKey, version: i16, body: &[u8]) {
        self.correlation_id += 1;
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("test")));
        let mut buf = BytesMut::new();
        header
            .encode(&mut buf, key.request_header_version(version))
            .unwrap();
        buf.extend_from_slice(body);
        let mut framed = BytesMut::new();
        framed.extend_from_slice(&(buf.len() as i32).to_be_bytes());
        framed.extend_from_slice(&buf);
        self.stream.write_all(&framed).await.unwrap();
    }

    /// Whether the broker closed the connection (end of stream or reset)
    /// within `within`, discarding anything it sent first.
    pub async fn closed_within(&mut self, within: Duration) -> bool {
        let mut buf = [0u8; 4096];
        tokio::time::timeout(within, async {
            loop {
                match self.stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Sends a request and returns the raw response body (after the header).
    pub async fn call_raw<R: Encodable>(&mut self, key: ApiKey, version: i16, req: &R) -> Bytes {
        self.send(key, version, req).await;
        let mut resp = self.read_frame().await.expect("response");
        let header =
            ResponseHeader::decode(&mut resp, key.response_header_version(version)).unwrap();
        assert_eq!(header.correlation_id, self.correlation_id);
        resp
    }

    pub async fn read_frame(&mut self) -> Option<Bytes> {
        let size = tokio::time::timeout(Duration::from_secs(30), self.stream.read_i32())
            .await
            .expect("response within 30 s")
            .ok()?;
        let mut body = vec![0u8; size as usize];
        self.stream.read_exact(&mut body).await.ok()?;
        Some(Bytes::from(body))
    }

    pub async fn call<R: Encodable, S: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &R,
    ) -> S {
        let mut body = self.call_raw(key, version, req).await;
        S::decode(&mut body, version).unwrap()
    }

    pub async fn create_topic(
        &mut self,
        name: &str,
        partitions: i32,
        configs: &[(&str, &str)],
    ) -> i16 {
        let mut t = create_topics_request::CreatableTopic::default();
        t.name = TopicName(StrBytes::from_string(name.into()));
        t.num_partitions = partitions;
        t.replication_factor = 1;
        t.configs = creatable_configs(configs);
        self.create(t).await.error_code
    }

    /// Creates `name` with one partition per entry of `assignments`, each
    /// on those replicas (the first preferred), and `configs`.
    pub async fn create_assigned(
        &mut self,
        name: &str,
        assignments: &[&[i32]],
        configs: &[(&str, &str)],
    ) -> create_topics_response::CreatableTopicResult {
        let mut t = create_topics_request::CreatableTopic::default();
        t.name = TopicName(StrBytes::from_string(name.into()));
        t.num_partitions = -1;
        t.replication_factor = -1;
        t.assignments = assignments
            .iter()
            .enumerate()
            .map(|(i, replicas)| {
                let mut a = create_topics_request::CreatableReplicaAssignment::default();
                a.partition_index = i as i32;
                a.broker_ids = replicas.iter().map(|&b| BrokerId(b)).collect();
                a
            })
            .collect();
        t.configs = creatable_configs(configs);
        self.create(t).await
    }

    async fn create(
        &mut self,
        topic: create_topics_request::CreatableTopic,
    ) -> create_topics_response::CreatableTopicResult {
        let mut req = CreateTopicsRequest::default();
        req.topics = vec![topic];
        req.timeout_ms = 10_000;
        let resp: CreateTopicsResponse = self.call(ApiKey::CreateTopics, 7, &req).await;
        resp.topics[0].clone()
    }

    pub async fn produce(
        &mut self,
        topic: &str,
        partition: i32,
        acks: i16,
        batch: Bytes,
    ) -> produce_response::PartitionProduceResponse {
        let mut pd = produce_request::PartitionProduceData::default();
        pd.index = partition;
        pd.records = Some(batch);
        let mut td = produce_request::TopicProduceData::default();
        td.name = TopicName(StrBytes::from_string(topic.into()));
        td.partition_data = vec![pd];
        let mut req = ProduceRequest::default();
        req.acks = acks;
        req.timeout_ms = 10_000;
        req.topic_data = vec![td];
        let resp: ProduceResponse = self.call(ApiKey::Produce, 9, &req).await;
        resp.responses[0].partition_responses[0].clone()
    }

    pub async fn fetch(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_wait_ms: i32,
    ) -> fetch_response::PartitionData {
        let mut fp = fetch_request::FetchPartition::default();
        fp.partition = partition;
        fp.fetch_offset = offset;
        fp.partition_max_bytes = 1 << 20;
        fp.current_leader_epoch = -1;
        let mut ft = fetch_request::FetchTopic::default();
        ft.topic = TopicName(StrBytes::from_string(topic.into()));
        ft.partitions = vec![fp];
        let mut req = FetchRequest::default();
        req.replica_id = BrokerId(-1);
        req.max_wait_ms = max_wait_ms;
        req.min_bytes = 1;
        req.max_bytes = 50 << 20;
        req.session_epoch = -1;
        req.topics = vec![ft];
        let resp: FetchResponse = self.call(ApiKey::Fetch, 12, &req).await;
        resp.responses[0].partitions[0].clone()
    }

    pub async fn list_offset(
        &mut self,
        topic: &str,
        partition: i32,
        timestamp: i64,
    ) -> list_offsets_response::ListOffsetsPartitionResponse {
        let mut p = list_offsets_request::ListOffsetsPartition::default();
        p.partition_index = partition;
        p.timestamp = timestamp;
        p.current_leader_epoch = -1;
        let mut t = list_offsets_request::ListOffsetsTopic::default();
        t.name = TopicName(StrBytes::from_string(topic.into()));
        t.partitions = vec![p];
        let mut req = ListOffsetsRequest::default();
        req.replica_id = BrokerId(-1);
        req.topics = vec![t];
        let resp: ListOffsetsResponse = self.call(ApiKey::ListOffsets, 7, &req).await;
        resp.topics[0].partitions[0].clone()
    }
}

fn creatable_configs(configs: &[(&str, &str)]) -> Vec<create_topics_request::CreatableTopicConfig> {
    configs
        .iter()
        .map(|(k, v)| {
            let mut c = create_topics_request::CreatableTopicConfig::default();
            c.name = StrBytes::from_string(k.to_string());
            c.value = Some(StrBytes::from_string(v.to_string()));
            c
        })
        .collect()
}

/// The first record timestamp of test batches: the clock when the test
/// process first asks, so that records pass the broker's timestamp bounds
/// (`log.message.timestamp.after.max.ms`) and idle-producer expiry (24 h
/// after a producer's last timestamp, as in Kafka) leaves them alone.
pub fn base_timestamp_ms() -> i64 {
    static BASE: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_millis() as i64
    })
}

/// Encodes `values` as one v2 batch (base offset 0) with keys and a header.
pub fn batch(
    values: &[&str],
    compression: Compression,
    producer: Option<(i64, i16, i32)>,
) -> Bytes {
    let (pid, epoch, seq) = producer.unwrap_or((-1, -1, -1));
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: pid,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // kafka-protocol's encoder starts a new batch whenever offset minus
            // sequence changes, so non-idempotent records count up from -1.
            sequence: if seq < 0 {
                i as i32 - 1
            } else {
                seq + i as i32
            },
            timestamp: base_timestamp_ms() + i as i64,
            key: Some(Bytes::from(format!("key-{i}"))),
            value: Some(Bytes::from(v.to_string())),
            headers: [(
                StrBytes::from_static_str("h"),
                Some(Bytes::from_static(b"1")),
            )]
            .into_iter()
            .collect(),
        })
        .collect();
    encode_v2(&records, compression)
}

/// `records` as one v2 batch.
fn encode_v2(records: &[Record], compression: Compression) -> Bytes {
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records,
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )
    .unwrap();
    buf.freeze()
}

/// `values` as one transactional batch (no keys) of producer `pid` at
/// `epoch` from sequence `seq`, as a producer in a transaction writes it.
pub fn txn_batch(values: &[&str], pid: i64, epoch: i16, seq: i32) -> Bytes {
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional: true,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: pid,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: seq + i as i32,
            timestamp: base_timestamp_ms() + i as i64,
            key: None,
            value: Some(Bytes::from(v.to_string())),
            headers: Default::default(),
        })
        .collect();
    encode_v2(&records, Compression::None)
}

/// Decodes every record value in a fetch response's records.
pub fn values(records: &Option<Bytes>) -> Vec<(i64, String)> {
    let Some(r) = records else { return vec![] };
    let mut b = r.clone();
    let sets = RecordBatchDecoder::decode_all(&mut b).unwrap();
    sets.into_iter()
        .flat_map(|s| s.records)
        .map(|r| {
            (
                r.offset,
                String::from_utf8(r.value.unwrap().to_vec()).unwrap(),
            )
        })
        .collect()
}
