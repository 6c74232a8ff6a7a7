//! A Fetch response's records are sent from the segment files, never held
//! in the broker's memory. Alone in its test binary: it reads the process's
//! peak resident set, which any other test running beside it would move.

mod common;

use common::{batch, start, Client};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::records::Compression;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The process's peak resident set (`VmHWM`), in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM in /proc/self/status");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

const BATCHES: usize = 50;
const VALUE_BYTES: usize = 1_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_50_mb_fetch_response_is_not_held_in_memory() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("big", 1, &[]).await, 0);
    let value = "v".repeat(VALUE_BYTES);
    for _ in 0..BATCHES {
        let batch = batch(&[value.as_str()], Compression::None, None);
        assert_eq!(c.produce("big", 0, 1, batch).await.error_code, 0);
    }
    drop(value);

    // The fetch, with the response read off the socket in small pieces so
    // the test's own reading costs no memory.
    let mut fp = fetch_request::FetchPartition::default();
    fp.partition = 0;
    fp.partition_max_bytes = 64 << 20;
    fp.current_leader_epoch = -1;
    fp.log_start_offset = -1;
    let mut ft = fetch_request::FetchTopic::default();
    ft.topic = TopicName(StrBytes::from_static_str("big"));
    ft.partitions = vec![fp];
    let mut req = FetchRequest::default();
    req.replica_id = BrokerId(-1);
    req.max_bytes = 64 << 20;
    req.min_bytes = 1;
    req.session_epoch = -1;
    req.topics = vec![ft];
    let header = RequestHeader::default()
        .with_request_api_key(ApiKey::Fetch as i16)
        .with_request_api_version(12)
        .with_correlation_id(1);
    let mut body = bytes::BytesMut::new();
    header
        .encode(&mut body, ApiKey::Fetch.request_header_version(12))
        .unwrap();
    req.encode(&mut body, 12).unwrap();
    let mut stream = tokio::net::TcpStream::connect(b.running.local_addr)
        .await
        .unwrap();

    let before = peak_rss_kib();
    stream
        .write_all(&(body.len() as i32).to_be_bytes())
        .await
        .unwrap();
    stream.write_all(&body).await.unwrap();
    let size = stream.read_i32().await.unwrap() as usize;
    let mut piece = vec![0u8; 64 * 1024];
    let mut read = 0;
    while read < size {
        let n = (size - read).min(piece.len());
        stream.read_exact(&mut piece[..n]).await.unwrap();
        read += n;
    }
    let grown_kib = peak_rss_kib().saturating_sub(before);

    eprintln!("peak resident set grew by {grown_kib} KiB for a {size}-byte response");
    assert!(size > BATCHES * VALUE_BYTES, "response of {size} bytes");
    // Copying the records would cost at least the response's size (it cost
    // three times that: a read buffer, its copy, and the encoded response).
    assert!(
        grown_kib < 16 * 1024,
        "peak resident set grew by {grown_kib} KiB for a {size}-byte response"
    );
    b.running.shutdown().await;
}
