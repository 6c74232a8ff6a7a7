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
