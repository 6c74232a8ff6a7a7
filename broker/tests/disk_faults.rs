//! Disk faults under acks=all load (the short form, for CI):
//!
//! - the log directory on a small tmpfs that fills up (real ENOSPC from
//!   the kernel; the test mounts one, so it needs root or CAP_SYS_ADMIN and
//!   fails, loudly, without);
//! - EIO on a segment write, through the `fault-injection` hook;
//! - EIO on the leader of a three-node cluster: leadership moves to an
//!   in-sync follower.
//!
//! Each shows: producers get KAFKA_STORAGE_ERROR, the broker takes its log
//! directory offline and signals that it must stop (`RunningBroker::fatal`;
//! the binary exits 1 there), no acknowledged record is lost (checked record
//! by record after a restart), and the broker restarts cleanly once the
//! fault is gone. Figures are printed (`--nocapture`).

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use broker::log::faults;
use broker::types::NodeId;
use bytes::Bytes;
use common::cluster::TestCluster;
use common::{config, Client};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

const KAFKA_STORAGE_ERROR: i16 = 56;
const WAIT: Duration = Duration::from_secs(20);

/// A tmpfs mounted for the test's lifetime.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Tmpfs {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .output()
            .expect("running mount");
        assert!(
            out.status.success(),
            "this test mounts a {size} tmpfs to fill it and needs root or \
             CAP_SYS_ADMIN; mount said: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(path.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// One batch of `n` records `<tag>-<i>` padded to `len` bytes.
fn batch(tag: &str, n: usize, len: usize) -> (Bytes, Vec<String>) {
    let values: Vec<String> = (0..n)
        .map(|i| {
            let mut v = format!("{tag}-{i}-");
            v.extend(std::iter::repeat_n('x', len.saturating_sub(v.len())));
            v
        })
        .collect();
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: i as i32 - 1,
            timestamp: common::base_timestamp_ms(),
            key: None,
            value: Some(Bytes::from(v.clone())),
            headers: Default::default(),
        })
        .collect();
    let mut buf = bytes::BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    (buf.freeze(), values)
}

/// What a load run saw.
#[derive(Default)]
struct Load {
    /// offset -> value of every acknowledged record.
    acked: BTreeMap<i64, String>,
    /// Error codes of the failed produce requests.
    errors: Vec<i16>,
}

/// `conns` connections each send acks=all batches (`records` records of
/// `len` bytes) until one fails or `max_batches` were sent.
async fn produce_until_error(
    addr: SocketAddr,
    topic: &str,
    conns: usize,
    records: usize,
    len: usize,
    max_batches: usize,
) -> Load {
    let mut tasks = Vec::new();
    for conn in 0..conns {
        let topic = topic.to_string();
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let mut load = Load::default();
            for i in 0..max_batches {
                let (b, values) = batch(&format!("c{conn}-b{i}"), records, len);
                let r = c.produce(&topic, 0, -1, b).await;
                if r.error_code != 0 {
                    load.errors.push(r.error_code);
                    break;
                }
                for (j, v) in values.into_iter().enumerate() {
                    load.acked.insert(r.base_offset + j as i64, v);
                }
            }
            load
        }));
    }
    let mut all = Load::default();
    for t in tasks {
        let load = t.await.unwrap();
        all.acked.extend(load.acked);
        all.errors.extend(load.errors);
    }
    all
}

/// offset -> value of every record of `topic`-0 from offset 0, as read.
async fn read_all(addr: SocketAddr, topic: &str) -> BTreeMap<i64, String> {
    let mut c = Client::connect(addr).await;
    let mut out = BTreeMap::new();
    let mut offset = 0;
    loop {
        let p = c.fetch(topic, 0, offset, 0).await;
        assert_eq!(p.error_code, 0, "fetch at {offset}");
        let Some(mut records) = p.records.filter(|r| !r.is_empty()) else {
            assert_eq!(offset, p.high_watermark, "stopped below the high watermark");
            return out;
        };
        for set in RecordBatchDecoder::decode_all(&mut records).unwrap() {
            for r in set.records {
                let v = String::from_utf8(r.value.unwrap().to_vec()).unwrap();
                out.insert(r.offset, v);
                offset = r.offset + 1;
            }
        }
    }
}

/// Every acknowledged record is stored at its offset, unchanged.
fn assert_none_lost(acked: &BTreeMap<i64, String>, stored: &BTreeMap<i64, String>) {
    let lost: Vec<_> = acked
        .iter()
        .filter(|(o, v)| stored.get(o) != Some(v))
        .map(|(o, _)| *o)
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acked records lost, e.g. offsets {:?}",
        lost.len(),
        acked.len(),
        &lost[..lost.len().min(10)]
    );
}

async fn wait_fatal(running: &broker::RunningBroker) -> String {
    let mut fatal = running.fatal();
    let reason = tokio::time::timeout(WAIT, fatal.wait_for(Option::is_some))
        .await
        .expect("the broker signals that it must stop")
        .unwrap()
        .clone();
    reason.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_disk_stops_the_broker_without_losing_an_acked_record() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let mount = Tmpfs::mount(&data, "64m");
    let settings = [("log.segment.bytes", "1048576")];

    let b = broker::start(config(&data, &settings)).await.unwrap();
    let mut c = Client::connect(b.local_addr).await;
    assert_eq!(c.create_topic("full", 1, &[]).await, 0);
    // Take all the space there is, then give 4 MiB back: the load fills it.
    let ballast = data.join("ballast");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&ballast).unwrap();
        let chunk = vec![1u8; 1 << 20];
        while f.write_all(&chunk).is_ok() {}
        let len = f.metadata().unwrap().len();
        f.set_len(len.saturating_sub(4 << 20)).unwrap();
    }

    let started = Instant::now();
    let load = produce_until_error(b.local_addr, "full", 4, 4, 16 << 10, 10_000).await;
    let reason = wait_fatal(&b).await;
    println!(
        "full disk: {} records acked in {:?}; errors {:?}; fatal: {reason}",
        load.acked.len(),
        started.elapsed(),
        load.errors
    );
    assert!(!load.acked.is_empty());
    assert!(
        load.errors.contains(&KAFKA_STORAGE_ERROR),
        "{:?}",
        load.errors
    );
    assert!(
        load.errors.iter().all(|&e| e == KAFKA_STORAGE_ERROR),
        "{:?}",
        load.errors
    );
    // Nothing is served from the offline directory.
    let fetched = c.fetch("full", 0, 0, 0).await;
    assert_eq!(fetched.error_code, KAFKA_STORAGE_ERROR);
    b.shutdown().await;

    // Space is freed; the broker starts and recovers.
    std::fs::remove_file(&ballast).unwrap();
    let b = broker::start(config(&data, &settings)).await.unwrap();
    let stored = read_all(b.local_addr, "full").await;
    assert_none_lost(&load.acked, &stored);
    println!(
        "full disk: after restart {} records stored, {} acked, 0 lost",
        stored.len(),
        load.acked.len()
    );
    let after = produce_until_error(b.local_addr, "full", 1, 1, 100, 3).await;
    assert!(after.errors.is_empty(), "{:?}", after.errors);
    b.shutdown().await;
    drop(mount);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_eio_on_a_write_stops_the_broker_without_losing_an_acked_record() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    let b = broker::start(config(&data, &[])).await.unwrap();
    let mut c = Client::connect(b.local_addr).await;
    assert_eq!(c.create_topic("eio", 1, &[]).await, 0);
    // The 50th segment write stops part way with EIO.
    faults::inject(faults::Fault {
        dir: data.clone(),
        op: faults::FaultOp::Write { write_bytes: 100 },
        after: 50,
        errno: faults::EIO,
    });
    let load = produce_until_error(b.local_addr, "eio", 4, 4, 1000, 1000).await;
    // The disk recovers at once: nothing may be acked after the failure
    // anyway, or it would sit behind the torn write.
    faults::clear(&data);
    let more = produce_until_error(b.local_addr, "eio", 2, 4, 1000, 5).await;
    let reason = wait_fatal(&b).await;
    println!(
        "EIO: {} records acked; errors {:?} then {:?}; fatal: {reason}",
        load.acked.len(),
        load.errors,
        more.errors
    );
    assert!(more.acked.is_empty(), "acked after the directory failed");
    assert!(load
        .errors
        .iter()
        .chain(&more.errors)
        .all(|&e| e == KAFKA_STORAGE_ERROR));
    b.shutdown().await;

    let b = broker::start(config(&data, &[])).await.unwrap();
    let stored = read_all(b.local_addr, "eio").await;
    assert_none_lost(&load.acked, &stored);
    println!(
        "EIO: after restart {} records stored, {} acked, 0 lost",
        stored.len(),
        load.acked.len()
    );
    b.shutdown().await;
}

async fn create_replicated(client: &mut Client, name: &str) {
    let mut t = create_topics_request::CreatableTopic::default();
    t.name = TopicName(StrBytes::from_string(name.into()));
    t.num_partitions = -1;
    t.replication_factor = -1;
    let mut a = create_topics_request::CreatableReplicaAssignment::default();
    a.partition_index = 0;
    a.broker_ids = vec![BrokerId(1), BrokerId(2), BrokerId(3)];
    t.assignments = vec![a];
    let mut c = create_topics_request::CreatableTopicConfig::default();
    c.name = StrBytes::from_static_str("min.insync.replicas");
    c.value = Some(StrBytes::from_static_str("2"));
    t.configs = vec![c];
    let mut req = CreateTopicsRequest::default();
    req.topics = vec![t];
    req.timeout_ms = 10_000;
    let resp: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &req).await;
    assert_eq!(resp.topics[0].error_code, 0, "{:?}", resp.topics[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leadership_moves_off_a_broker_whose_disk_failed() {
    let mut cluster = TestCluster::start(
        3,
        44300,
        &[
            ("replica.lag.time.max.ms", "1000"),
            ("replica.fetch.wait.max.ms", "50"),
        ],
    )
    .await;
    let mut c = cluster.client(1).await;
    create_replicated(&mut c, "dt").await;
    let leader_of = |cl: &TestCluster, id: i32| {
        cl.image(id)
            .topics
            .get("dt")
            .map(|t| t.partitions[0].leader)
    };
    let isr_of = |cl: &TestCluster, id: i32| {
        cl.image(id)
            .topics
            .get("dt")
            .map_or(0, |t| t.partitions[0].isr.len())
    };
    cluster
        .wait_until("node 1 leads with all three in sync", WAIT, |cl| {
            (1..=3).all(|id| leader_of(cl, id) == Some(NodeId(1)) && isr_of(cl, id) == 3)
        })
        .await;
    let before = produce_until_error(cluster.addr(1), "dt", 2, 4, 1000, 10).await;
    assert!(before.errors.is_empty(), "{:?}", before.errors);

    // Node 1's disk fails.
    let failed_dir = cluster.nodes[0].dir.path().to_path_buf();
    faults::inject(faults::Fault {
        dir: failed_dir.clone(),
        op: faults::FaultOp::Write { write_bytes: 0 },
        after: 0,
        errno: faults::EIO,
    });
    let failed_at = Instant::now();
    let r = produce_until_error(cluster.addr(1), "dt", 1, 4, 1000, 1).await;
    assert_eq!(r.errors, vec![KAFKA_STORAGE_ERROR]);
    cluster
        .wait_until("leadership moves to an in-sync follower", WAIT, |cl| {
            [2, 3]
                .iter()
                .all(|&id| leader_of(cl, id).is_some_and(|l| l == NodeId(2) || l == NodeId(3)))
        })
        .await;
    let moved_after = failed_at.elapsed();
    let running = cluster.nodes[0].running.as_ref().unwrap();
    let reason = wait_fatal(running).await;
    println!("disk failure on the leader: leadership moved after {moved_after:?}; fatal: {reason}");
    assert!(moved_after < Duration::from_secs(10), "{moved_after:?}");
    // Node 1 stops, as the binary would.
    cluster.stop(1).await;
    faults::clear(&failed_dir);

    // The new leader serves acks=all with the two replicas left.
    let new_leader = leader_of(&cluster, 2).unwrap().0;
    let after = produce_until_error(cluster.addr(new_leader), "dt", 2, 4, 1000, 10).await;
    assert!(after.errors.is_empty(), "{:?}", after.errors);
    let stored = read_all(cluster.addr(new_leader), "dt").await;
    let mut acked = before.acked.clone();
    acked.extend(after.acked.clone());
    assert_none_lost(&acked, &stored);
    println!(
        "disk failure on the leader: {} records acked ({} before, {} after), 0 lost",
        acked.len(),
        before.acked.len(),
        after.acked.len()
    );

    // Node 1 comes back with a working disk and catches up.
    cluster.restart(1).await;
    cluster
        .wait_until("node 1 is back in the ISR", WAIT, |cl| isr_of(cl, 2) == 3)
        .await;
    cluster.shutdown().await;
}
