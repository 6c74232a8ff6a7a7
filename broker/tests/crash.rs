//! kill -9 under acks=all produce load and offset commits: on restart every
//! acked batch is there, byte for byte at its acked offsets, offsets are
//! contiguous, and every acknowledged commit is still committed.
//!
//! The kill times come from a seed (`CRASH_SEED`, else the clock), printed
//! so a failure replays.

mod common;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{batch, values, Client};
use kafka_protocol::messages::*;
use kafka_protocol::records::Compression;

const PARTITIONS: i32 = 3;
const PRODUCERS: usize = 4;
const ROUNDS: usize = 3;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn_broker(dir: &std::path::Path, port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_broker"))
        .args([
            "--override",
            &format!("listeners=PLAINTEXT://127.0.0.1:{port}"),
            "--override",
            &format!("log.dirs={}", dir.display()),
            "--override",
            "metrics.listen.address=none",
            "--override",
            "log.segment.bytes=65536",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("broker binary starts")
}

async fn wait_ready(addr: std::net::SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Ok(_)) =
            tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr)).await
        {
            let mut c = Client::connect(addr).await;
            let r: ApiVersionsResponse = c
                .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
                .await;
            if r.error_code == 0 {
                return;
            }
        }
        assert!(Instant::now() < deadline, "broker not ready within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// (partition, base offset) -> values of each acked batch.
type Acked = Arc<Mutex<BTreeMap<(i32, i64), Vec<String>>>>;

async fn produce_until_killed(addr: std::net::SocketAddr, round: usize, id: usize, acked: Acked) {
    let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
        return;
    };
    drop(stream);
    let mut c = Client::connect(addr).await;
    for n in 0.. {
        let partition = ((id + n) % PARTITIONS as usize) as i32;
        let vals: Vec<String> = (0..5).map(|k| format!("r{round}-p{id}-b{n}-{k}")).collect();
        let refs: Vec<&str> = vals.iter().map(String::as_str).collect();
        let codec = if n % 2 == 0 {
            Compression::None
        } else {
            Compression::Lz4
        };
        // The broker dies mid-call at some point: the task then ends (panics
        // inside the client are caught by the JoinHandle).
        let r = c
            .produce("crash", partition, -1, batch(&refs, codec, None))
            .await;
        if r.error_code == 0 {
            acked
                .lock()
                .unwrap()
                .insert((partition, r.base_offset), vals);
        }
    }
}

/// partition -> the highest committed offset the broker acknowledged.
type Commits = Arc<Mutex<BTreeMap<i32, i64>>>;

const GROUP: &str = "crash-group";

/// Commits ever-growing offsets for the group until the broker dies.
async fn commit_until_killed(addr: std::net::SocketAddr, round: usize, commits: Commits) {
    let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
        return;
    };
    drop(stream);
    let mut c = Client::connect(addr).await;
    for n in 0i64.. {
        let partition = (n % i64::from(PARTITIONS)) as i32;
        let offset = (round as i64) * 1_000_000 + n;
        let mut p = offset_commit_request::OffsetCommitRequestPartition::default();
        p.partition_index = partition;
        p.committed_offset = offset;
        let mut t = offset_commit_request::OffsetCommitRequestTopic::default();
        t.name = TopicName(kafka_protocol::protocol::StrBytes::from_static_str("crash"));
        t.partitions = vec![p];
        let r: OffsetCommitResponse = c
            .call(
                ApiKey::OffsetCommit,
                8,
                &OffsetCommitRequest::default()
                    .with_group_id(GroupId(
                        kafka_protocol::protocol::StrBytes::from_static_str(GROUP),
                    ))
                    .with_generation_id_or_member_epoch(-1)
                    .with_topics(vec![t]),
            )
            .await;
        if r.topics[0].partitions[0].error_code == 0 {
            commits.lock().unwrap().insert(partition, offset);
        }
    }
}

/// Every acknowledged commit is still there: the committed offset is at
/// least the last acknowledged one (a commit the kill interrupted may have
/// landed without its acknowledgement).
async fn verify_commits(addr: std::net::SocketAddr, commits: &Commits, seed: u64) {
    let mut c = Client::connect(addr).await;
    let commits = commits.lock().unwrap().clone();
    let mut t = offset_fetch_request::OffsetFetchRequestTopic::default();
    t.name = TopicName(kafka_protocol::protocol::StrBytes::from_static_str("crash"));
    t.partition_indexes = (0..PARTITIONS).collect();
    let r: OffsetFetchResponse = c
        .call(
            ApiKey::OffsetFetch,
            7,
            &OffsetFetchRequest::default()
                .with_group_id(GroupId(
                    kafka_protocol::protocol::StrBytes::from_static_str(GROUP),
                ))
                .with_topics(Some(vec![t])),
        )
        .await;
    for p in &r.topics[0].partitions {
        if let Some(&acked) = commits.get(&p.partition_index) {
            assert!(
                p.committed_offset >= acked,
                "seed {seed}: partition {} committed {} but {acked} was acknowledged",
                p.partition_index,
                p.committed_offset
            );
        }
    }
}

async fn verify(addr: std::net::SocketAddr, acked: &Acked, seed: u64) {
    let mut c = Client::connect(addr).await;
    let acked = acked.lock().unwrap().clone();
    for p in 0..PARTITIONS {
        let mut log: Vec<(i64, String)> = Vec::new();
        let mut offset = 0;
        loop {
            let part = c.fetch("crash", p, offset, 0).await;
            assert_eq!(part.error_code, 0, "seed {seed}: fetch p{p}@{offset}");
            let v = values(&part.records);
            if v.is_empty() {
                break;
            }
            offset = v.last().unwrap().0 + 1;
            log.extend(v);
        }
        for (i, (o, _)) in log.iter().enumerate() {
            assert_eq!(
                *o, i as i64,
                "seed {seed}: offsets in partition {p} are not contiguous"
            );
        }
        for ((ap, base), vals) in acked.iter().filter(|((ap, _), _)| *ap == p) {
            for (k, v) in vals.iter().enumerate() {
                let at = (*base as usize) + k;
                assert_eq!(
                    log.get(at).map(|(_, s)| s.as_str()),
                    Some(v.as_str()),
                    "seed {seed}: acked record {v} missing at {ap}/{at}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_batches_survive_kill_9() {
    let seed: u64 = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("crash test seed: {seed} (replay with CRASH_SEED={seed})");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let acked: Acked = Arc::default();
    let commits: Commits = Arc::default();
    let mut rng = seed;
    for round in 0..ROUNDS {
        let mut child = spawn_broker(dir.path(), port);
        wait_ready(addr).await;
        if round == 0 {
            let mut c = Client::connect(addr).await;
            assert_eq!(c.create_topic("crash", PARTITIONS, &[]).await, 0);
            // The first lookup creates __consumer_offsets.
            let f: FindCoordinatorResponse = c
                .call(
                    ApiKey::FindCoordinator,
                    3,
                    &FindCoordinatorRequest::default()
                        .with_key(kafka_protocol::protocol::StrBytes::from_static_str(GROUP)),
                )
                .await;
            assert_eq!(f.error_code, 0);
        } else {
            verify(addr, &acked, seed).await;
            verify_commits(addr, &commits, seed).await;
        }
        let mut tasks: Vec<_> = (0..PRODUCERS)
            .map(|id| tokio::spawn(produce_until_killed(addr, round, id, acked.clone())))
            .collect();
        tasks.push(tokio::spawn(commit_until_killed(
            addr,
            round,
            commits.clone(),
        )));
        // xorshift: 300..1300 ms of load before the kill.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        tokio::time::sleep(Duration::from_millis(300 + rng % 1000)).await;
        child.kill().expect("SIGKILL");
        child.wait().unwrap();
        for t in tasks {
            let _ = t.await;
        }
    }
    let mut child = spawn_broker(dir.path(), port);
    wait_ready(addr).await;
    verify(addr, &acked, seed).await;
    verify_commits(addr, &commits, seed).await;
    let total: usize = acked.lock().unwrap().values().map(Vec::len).sum();
    eprintln!(
        "crash test: {total} acked records and the group's commits verified after {ROUNDS} kills"
    );
    assert!(total > 0, "seed {seed}: no produce was acked at all");
    assert!(
        !commits.lock().unwrap().is_empty(),
        "seed {seed}: no commit was acknowledged"
    );
    child.kill().ok();
    child.wait().ok();
}
