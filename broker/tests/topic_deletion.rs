//! Topic deletion survives crashes: a partition directory is renamed to
//! `<name>.<uuid>-delete` before it is removed, remnants of an interrupted
//! deletion are removed at start, and a directory that belongs to no topic
//! is never taken for a new topic of the same name.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{batch, config, values, Client};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Polls the data directory (removal runs on a background thread).
async fn wait_for_entries(dir: &Path, what: &str, done: impl Fn(&[String]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let names = entries(dir);
        if done(&names) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {names:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn delete_topic(c: &mut Client, name: &str) {
    let mut del = DeleteTopicsRequest::default();
    del.topic_names = vec![TopicName(StrBytes::from_string(name.into()))];
    del.timeout_ms = 10_000;
    let resp: DeleteTopicsResponse = c.call(ApiKey::DeleteTopics, 5, &del).await;
    assert_eq!(resp.responses[0].error_code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_interrupted_by_a_crash_does_not_bring_the_topic_back() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let saved = tempfile::tempdir().unwrap();

    let b = broker::start(config(data, &[])).await.unwrap();
    let mut c = Client::connect(b.local_addr).await;
    assert_eq!(c.create_topic("t", 1, &[]).await, 0);
    let r = c
        .produce("t", 0, -1, batch(&["a", "b", "c"], Compression::None, None))
        .await;
    assert_eq!(r.error_code, 0);
    b.shutdown().await;
    copy_dir(&data.join("t-0"), &saved.path().join("t-0"));

    let b = broker::start(config(data, &[])).await.unwrap();
    let mut c = Client::connect(b.local_addr).await;
    delete_topic(&mut c, "t").await;
    wait_for_entries(data, "the partition is removed", |n| {
        !n.iter().any(|n| n.starts_with("t-0"))
    })
    .await;
    b.shutdown().await;

    // A crash right after the rename (the first step of a deletion) ...
    copy_dir(
        &saved.path().join("t-0"),
        &data.join("t-0.0123456789abcdef0123456789abcdef-delete"),
    );
    // ... and one part-way through removing a directory in place, which
    // can take `partition.metadata` and leave the segments.
    copy_dir(&saved.path().join("t-0"), &data.join("t-0"));
    std::fs::remove_file(data.join("t-0").join("partition.metadata")).unwrap();
    let names = entries(data);
    assert!(names.iter().any(|n| n.ends_with("-delete")), "{names:?}");

    let b = broker::start(config(data, &[])).await.unwrap();
    // A new topic of the same name starts empty.
    let mut c = Client::connect(b.local_addr).await;
    assert_eq!(c.create_topic("t", 1, &[]).await, 0);
    let latest = c.list_offset("t", 0, -1).await;
    assert_eq!((latest.error_code, latest.offset), (0, 0));
    let fetched = c.fetch("t", 0, 0, 0).await;
    assert_eq!(fetched.error_code, 0);
    assert!(values(&fetched.records).is_empty());
    // And the remnants are gone.
    wait_for_entries(data, "remnants are removed at start", |n| {
        !n.iter().any(|n| n.ends_with("-delete"))
    })
    .await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_topic_removes_its_directories() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let b = broker::start(config(data, &[])).await.unwrap();
    let mut c = Client::connect(b.local_addr).await;
    assert_eq!(c.create_topic("gone", 2, &[]).await, 0);
    for p in 0..2 {
        let r = c
            .produce("gone", p, -1, batch(&["x"], Compression::Gzip, None))
            .await;
        assert_eq!(r.error_code, 0);
    }
    delete_topic(&mut c, "gone").await;
    wait_for_entries(data, "the renamed directories are removed", |n| {
        !n.iter().any(|n| n.starts_with("gone-"))
    })
    .await;
    b.shutdown().await;
}
