//! The I/O edge under hostile connections, in-process on 127.0.0.1:0:
//! stalled and idle sockets, requests whose decoded size is far beyond
//! their wire size, and Metadata requests that repeat one topic.

mod common;

use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use common::{batch, start, Client};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;
use kafka_protocol::ResponseError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until the broker closes the connection; how long that took, or
/// `None` if it is still open after `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((started + within).into(), s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// A client that must be answered promptly: ApiVersions and a Produce.
async fn served_promptly(addr: std::net::SocketAddr, topic: &str) {
    let started = Instant::now();
    let check = async {
        let mut c = Client::connect(addr).await;
        let resp: ApiVersionsResponse = c
            .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
            .await;
        assert_eq!(resp.error_code, 0);
        let r = c
            .produce(topic, 0, 1, batch(&["x"], Compression::None, None))
            .await;
        assert_eq!(r.error_code, 0);
    };
    tokio::time::timeout(Duration::from_secs(5), check)
        .await
        .expect("a fresh client is served while others stall");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_frame_headers_do_not_starve_other_clients_and_are_closed() {
    let b = start(&[("socket.request.read.timeout.ms", "3000")]).await;
    let addr = b.running.local_addr;
    let mut c = Client::connect(addr).await;
    assert_eq!(c.create_topic("t", 1, &[]).await, 0);

    // Six connections declare 100 MB frames (600 MB, beyond the 512 MiB
    // budget) and send nothing more; one sends some body bytes, then stalls.
    let mut stalled = Vec::new();
    for _ in 0..6 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&100_000_000i32.to_be_bytes()).await.unwrap();
        stalled.push(s);
    }
    let mut partial = TcpStream::connect(addr).await.unwrap();
    partial
        .write_all(&100_000_000i32.to_be_bytes())
        .await
        .unwrap();
    partial.write_all(&[0u8; 64 * 1024]).await.unwrap();
    stalled.push(partial);

    served_promptly(addr, "t").await;

    // Each stalled request is closed once its read timeout passes.
    for s in &mut stalled {
        let took = closed_within(s, Duration::from_secs(15))
            .await
            .expect("a stalled request is closed after socket.request.read.timeout.ms");
        assert!(took < Duration::from_secs(15));
    }
    served_promptly(addr, "t").await;
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_requests_that_hold_the_whole_budget_are_closed_and_it_comes_back() {
    let b = start(&[
        ("socket.request.max.bytes", "1048576"),
        ("queued.max.request.bytes", "2097152"),
        ("socket.request.read.timeout.ms", "1500"),
    ])
    .await;
    let addr = b.running.local_addr;
    // Three requests of 1,000,000 bytes send 700,000 each and stall: more
    // than the 2 MiB budget, so the last waits for room the others hold.
    let mut stalled = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&1_000_000i32.to_be_bytes()).await.unwrap();
        s.write_all(&vec![0u8; 700_000]).await.unwrap();
        stalled.push(s);
    }
    // The standoff ends at the read timeout: the stalled requests are
    // closed, their bytes given back, and a new client is served.
    let started = Instant::now();
    let mut c = Client::connect(addr).await;
    let resp: ApiVersionsResponse = tokio::time::timeout(
        Duration::from_secs(10),
        c.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default()),
    )
    .await
    .expect("served once the stalled requests time out");
    assert_eq!(resp.error_code, 0);
    assert!(started.elapsed() < Duration::from_secs(10));
    for s in &mut stalled {
        assert!(closed_within(s, Duration::from_secs(10)).await.is_some());
    }
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_but_a_long_poll_is_not_idleness() {
    let b = start(&[("connections.max.idle.ms", "1000")]).await;
    let addr = b.running.local_addr;
    let mut c = Client::connect(addr).await;
    assert_eq!(c.create_topic("t", 1, &[]).await, 0);

    let mut idle = TcpStream::connect(addr).await.unwrap();
    let connected = Instant::now();
    let idle_closed =
        tokio::spawn(async move { closed_within(&mut idle, Duration::from_secs(10)).await });
    // A fetch that long-polls for 2.5 s, longer than the idle timeout: the
    // connection is busy, not idle, and gets its answer.
    let p = c.fetch("t", 0, 0, 2500).await;
    assert_eq!(p.error_code, 0);
    assert!(connected.elapsed() >= Duration::from_millis(2400));

    let took = idle_closed
        .await
        .unwrap()
        .expect("an idle connection is closed after connections.max.idle.ms");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2400),
        "closed after {took:?}"
    );
    // The client that was answered a moment ago is still open: idleness
    // counts from its last answer.
    let resp: ApiVersionsResponse = c
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    assert_eq!(resp.error_code, 0);
    b.running.shutdown().await;
}

/// Metadata v9 naming `names` (flexible, before topic ids).
fn metadata_frame(names: &[&str], correlation_id: i32) -> BytesMut {
    let mut f = BytesMut::new();
    f.put_i32(0);
    f.put_i16(ApiKey::Metadata as i16);
    f.put_i16(9);
    f.put_i32(correlation_id);
    f.put_i16(-1); // null client id
    f.put_u8(0); // header tagged fields
    let mut count = names.len() as u32 + 1;
    while count >= 0x80 {
        f.put_u8((count as u8 & 0x7F) | 0x80);
        count >>= 7;
    }
    f.put_u8(count as u8);
    for n in names {
        f.put_u8(n.len() as u8 + 1);
        f.put_slice(n.as_bytes());
        f.put_u8(0);
    }
    f.put_u8(0); // no auto-creation
    f.put_u8(0);
    f.put_u8(0);
    f.put_u8(0);
    let size = (f.len() - 4) as i32;
    f[..4].copy_from_slice(&size.to_be_bytes());
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_decoded_size_exceeds_the_budget_is_refused() {
    let b = start(&[
        ("socket.request.max.bytes", "1048576"),
        ("queued.max.request.bytes", "2097152"),
    ])
    .await;
    let addr = b.running.local_addr;
    // 400,000 empty topic names: 800 KB on the wire, about 29 MB decoded.
    let names = vec![""; 400_000];
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&metadata_frame(&names, 1)).await.unwrap();
    closed_within(&mut s, Duration::from_secs(10))
        .await
        .expect("closed, not answered");
    // The same names in a request that fits are answered.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&metadata_frame(&names[..1000], 2))
        .await
        .unwrap();
    let size = tokio::time::timeout(Duration::from_secs(10), s.read_i32())
        .await
        .expect("answered")
        .unwrap();
    assert!(size > 0);
    served_promptly_without_topic(addr).await;
    b.running.shutdown().await;
}

async fn served_promptly_without_topic(addr: std::net::SocketAddr) {
    let mut c = Client::connect(addr).await;
    let resp: ApiVersionsResponse = tokio::time::timeout(
        Duration::from_secs(5),
        c.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default()),
    )
    .await
    .expect("served");
    assert_eq!(resp.error_code, 0);
}

fn metadata_request(names: &[&str]) -> MetadataRequest {
    let mut req = MetadataRequest::default();
    req.topics = Some(
        names
            .iter()
            .map(|n| {
                let mut t = metadata_request::MetadataRequestTopic::default();
                t.name = Some(TopicName(StrBytes::from_string(n.to_string())));
                t
            })
            .collect(),
    );
    req.allow_auto_topic_creation = false;
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_answers_each_requested_topic_once() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("t", 2, &[]).await, 0);
    let mut names = vec!["t"; 1000];
    names.extend(vec!["missing"; 1000]);
    names.extend(vec![""; 1000]);
    names.push("t");
    for version in [4, 9, 12] {
        let resp: MetadataResponse = c
            .call(ApiKey::Metadata, version, &metadata_request(&names))
            .await;
        let got: Vec<(String, i16)> = resp
            .topics
            .iter()
            .map(|t| {
                (
                    t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default(),
                    t.error_code,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("t".to_string(), 0),
                (
                    "missing".to_string(),
                    ResponseError::UnknownTopicOrPartition.code()
                ),
                (String::new(), ResponseError::InvalidTopicException.code()),
            ],
            "v{version}"
        );
        assert_eq!(resp.topics[0].partitions.len(), 2);
    }
    b.running.shutdown().await;
}

/// One request over `stream`, answered (kafka-protocol's encoders).
async fn call_on<R: kafka_protocol::protocol::Encodable, S: kafka_protocol::protocol::Decodable>(
    stream: &mut TcpStream,
    key: ApiKey,
    version: i16,
    req: &R,
) -> S {
    use kafka_protocol::protocol::{Decodable, Encodable};
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(1)
        .encode(&mut buf, key.request_header_version(version))
        .unwrap();
    req.encode(&mut buf, version).unwrap();
    let size = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&size.to_be_bytes());
    stream.write_all(&buf).await.unwrap();
    let size = stream.read_i32().await.unwrap();
    let mut body = vec![0u8; size as usize];
    stream.read_exact(&mut body).await.unwrap();
    let mut body = bytes::Bytes::from(body);
    ResponseHeader::decode(&mut body, key.response_header_version(version)).unwrap();
    S::decode(&mut body, version).unwrap()
}

async fn connect_from(addr: std::net::SocketAddr, source: &str) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(addr).await.unwrap()
}

fn replica_fetch_request(replica: i32, topic_id: uuid::Uuid, offset: i64) -> FetchRequest {
    let mut fp = fetch_request::FetchPartition::default();
    fp.partition = 0;
    fp.fetch_offset = offset;
    fp.partition_max_bytes = 1 << 20;
    fp.current_leader_epoch = 0;
    let mut ft = fetch_request::FetchTopic::default();
    ft.topic_id = topic_id;
    ft.partitions = vec![fp];
    let mut req = FetchRequest::default();
    req.replica_state.replica_id = BrokerId(replica);
    req.replica_state.replica_epoch = -1;
    req.max_wait_ms = 0;
    req.max_bytes = 1 << 20;
    req.session_epoch = -1;
    req.topics = vec![ft];
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_fetch_from_another_address_than_the_brokers_is_refused() {
    use broker::metadata::{BrokerRegistration, MetadataCommand, PartitionImage};
    use broker::types::{LeaderEpoch, NodeId, TopicPartition};

    let b = start(&[]).await;
    let addr = b.running.local_addr;
    let broker = &b.running.broker;
    // Node 2 is registered at 127.0.0.2 and follows the partition.
    broker
        .metadata
        .propose(MetadataCommand::RegisterBroker(BrokerRegistration {
            node_id: NodeId(2),
            host: "127.0.0.2".into(),
            port: 1,
            listeners: Vec::new(),
            rack: None,
            fenced: false,
            features: broker::metadata::supported_features(),
        }))
        .await
        .unwrap();
    let topic_id = uuid::Uuid::new_v4();
    broker
        .metadata
        .propose(MetadataCommand::CreateTopic {
            name: "r".into(),
            topic_id,
            partitions: vec![PartitionImage {
                partition: 0,
                replicas: vec![NodeId(1), NodeId(2)],
                isr: vec![NodeId(1), NodeId(2)],
                leader: NodeId(1),
                leader_epoch: LeaderEpoch(0),
                partition_epoch: 0,
            }],
            configs: Default::default(),
        })
        .await
        .unwrap();
    broker.sync_replicas().await.unwrap();
    let mut c = Client::connect(addr).await;
    let r = c
        .produce(
            "r",
            0,
            1,
            batch(&["only one copy"], Compression::None, None),
        )
        .await;
    assert_eq!(r.error_code, 0);
    let part = broker.replicas.get(&TopicPartition::new("r", 0)).unwrap();
    let high_watermark = || part.lock().unwrap().high_watermark().0;
    assert_eq!(high_watermark(), 0);

    // From 127.0.0.1, claiming to be node 2 and to hold the record: refused
    // for every partition, and the high watermark does not move.
    let mut forger = TcpStream::connect(addr).await.unwrap();
    let resp: FetchResponse = call_on(
        &mut forger,
        ApiKey::Fetch,
        15,
        &replica_fetch_request(2, topic_id, 1),
    )
    .await;
    let p = &resp.responses[0].partitions[0];
    assert_eq!(p.error_code, ResponseError::TopicAuthorizationFailed.code());
    assert!(p.records.as_ref().is_none_or(|r| r.is_empty()));
    assert_eq!(
        high_watermark(),
        0,
        "a forged fetch moved the high watermark"
    );
    // A replica id no broker is registered under: refused too.
    let resp: FetchResponse = call_on(
        &mut forger,
        ApiKey::Fetch,
        15,
        &replica_fetch_request(3, topic_id, 1),
    )
    .await;
    assert_eq!(
        resp.responses[0].partitions[0].error_code,
        ResponseError::TopicAuthorizationFailed.code()
    );

    // From node 2's address the same fetch is the follower's: it commits.
    let mut follower = connect_from(addr, "127.0.0.2").await;
    let resp: FetchResponse = call_on(
        &mut follower,
        ApiKey::Fetch,
        15,
        &replica_fetch_request(2, topic_id, 1),
    )
    .await;
    assert_eq!(resp.responses[0].partitions[0].error_code, 0);
    assert_eq!(high_watermark(), 1);
    b.running.shutdown().await;
}

/// A free port on `ip` (bound and released: a voter's port must be known
/// before its node starts).
fn free_port(ip: &str) -> u16 {
    std::net::TcpListener::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A one-voter quorum with a controller listener, on an address of its
/// own: the node, its controller address and its voter host.
async fn start_one_voter(
    host: &str,
) -> (
    broker::RunningBroker,
    std::net::SocketAddr,
    tempfile::TempDir,
) {
    let port = free_port(host);
    let dir = tempfile::tempdir().unwrap();
    let config = common::config(
        dir.path(),
        &[
            (
                "listeners",
                &format!("PLAINTEXT://{host}:0,CONTROLLER://{host}:{port}"),
            ),
            ("controller.quorum.voters", &format!("1@{host}:{port}")),
        ],
    );
    let running = broker::start(config).await.expect("starts");
    (running, format!("{host}:{port}").parse().unwrap(), dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_cannot_propose_on_the_controller_listener() {
    use broker::metadata::transport::{read_frame, write_frame, PeerRequest, PeerResponse};
    use broker::metadata::MetadataCommand;

    let (running, controller, _dir) = start_one_voter("127.0.29.1").await;
    // A stranger (127.0.0.1) proposes a topic: the connection is closed
    // and nothing is applied.
    let mut stranger = TcpStream::connect(controller).await.unwrap();
    let write = PeerRequest::Write(MetadataCommand::CreateTopic {
        name: "planted".into(),
        topic_id: uuid::Uuid::new_v4(),
        partitions: vec![],
        configs: Default::default(),
    });
    let _ = write_frame(&mut stranger, &write).await;
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        read_frame::<_, PeerResponse>(&mut stranger),
    )
    .await
    .expect("closed or answered in time");
    assert!(!matches!(answer, Ok(Some(_))), "a stranger was answered");
    assert!(!running
        .broker
        .metadata
        .image()
        .topics
        .contains_key("planted"));
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_strangers_cannot_lock_a_voter_out_of_the_controller_listener() {
    use broker::metadata::transport::{read_frame, write_frame, PeerRequest, PeerResponse};

    let host = "127.0.29.2";
    let (running, controller, _dir) = start_one_voter(host).await;
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(TcpStream::connect(controller).await.unwrap());
    }
    let mut voter = connect_from(controller, host).await;
    write_frame(&mut voter, &PeerRequest::ReadIndex)
        .await
        .unwrap();
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        read_frame::<_, PeerResponse>(&mut voter),
    )
    .await
    .expect("answered in time");
    assert!(
        matches!(answer, Ok(Some(PeerResponse::ReadIndex(Ok(_))))),
        "the voter was not served"
    );
    running.shutdown().await;
}
