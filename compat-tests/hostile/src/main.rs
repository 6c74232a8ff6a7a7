//! Sends each hostile request of issue 29 to a running broker, one case at
//! a time, and reports for each: the broker's answer, whether a fresh
//! client is still served (ApiVersions within 5 s), and the broker
//! process's peak RSS while the case ran (sampled from /proc every 20 ms).
//!
//! `hostile --bootstrap HOST:PORT --pid PID [--check] [--cases a,b] [--bomb-mib N]`
//!
//! With `--check` each case is held to what we promise (the answer Kafka
//! gives, liveness, RSS under `--rss-limit-mib`) and the exit status says
//! whether all held; without it the run only reports, which is how the same
//! cases are run against Apache Kafka for the side-by-side table
//! (`run.sh both`). One line per case on stdout:
//! `case <name> answer=<...> expected=<...> alive_ms=<n|dead> peak_rss_mib=<n> verdict=<PASS|FAIL|->`.

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::ResponseError;
use protocol::record_batch::{rewrite, Codec, HEADER_LEN, OFF_RECORD_COUNT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a fresh client may wait for ApiVersions before the broker
/// counts as not serving.
const LIVENESS_TIMEOUT: Duration = Duration::from_secs(5);
/// How long any one answer may take before the case records a timeout.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);
/// Kafka's `fetch.max.bytes` default: the most a consumer fetch returns
/// (plus one batch when the first batch is larger).
const FETCH_MAX_BYTES: usize = 57_671_680;

struct Args {
    bootstrap: SocketAddr,
    pid: u32,
    check: bool,
    cases: Option<Vec<String>>,
    rss_limit_mib: u64,
    bomb_mib: u64,
}

fn parse_args() -> Result<Args> {
    let mut args = std::env::args().skip(1);
    let mut bootstrap = None;
    let mut pid = None;
    let mut check = false;
    let mut cases = None;
    let mut rss_limit_mib = 512;
    let mut bomb_mib = 3_800;
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--bootstrap" => bootstrap = Some(value()?.parse()?),
            "--pid" => pid = Some(value()?.parse()?),
            "--check" => check = true,
            "--cases" => cases = Some(value()?.split(',').map(str::to_string).collect()),
            "--rss-limit-mib" => rss_limit_mib = value()?.parse()?,
            "--bomb-mib" => bomb_mib = value()?.parse()?,
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(Args {
        bootstrap: bootstrap.context("--bootstrap HOST:PORT is required")?,
        pid: pid.context("--pid PID is required")?,
        check,
        cases,
        rss_limit_mib,
        bomb_mib,
    })
}

/// Samples the broker's resident set size; `peak` since the last `reset`.
struct RssSampler {
    peak_kib: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

impl RssSampler {
    fn start(pid: u32) -> Self {
        let peak_kib = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak_kib.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Some(kib) = rss_kib(pid) {
                    p.fetch_max(kib, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        RssSampler { peak_kib, stop }
    }
    fn reset(&self, pid: u32) {
        self.peak_kib
            .store(rss_kib(pid).unwrap_or(0), Ordering::Relaxed);
    }
    fn peak_mib(&self) -> u64 {
        self.peak_kib.load(Ordering::Relaxed) / 1024
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A minimal Kafka client: one request at a time on one connection.
struct Client {
    stream: TcpStream,
    correlation_id: i32,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Result<Client> {
        let stream = tokio::time::timeout(LIVENESS_TIMEOUT, TcpStream::connect(addr))
            .await
            .context("connect timed out")??;
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            correlation_id: 0,
        })
    }

    fn frame<R: Encodable>(&mut self, key: ApiKey, version: i16, req: &R) -> Result<BytesMut> {
        self.correlation_id += 1;
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("hostile")));
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&[0; 4]);
        header.encode(&mut buf, key.request_header_version(version))?;
        req.encode(&mut buf, version)?;
        let size = (buf.len() - 4) as i32;
        buf[..4].copy_from_slice(&size.to_be_bytes());
        Ok(buf)
    }

    /// Sends a request and decodes its response; `Ok(None)` when the broker
    /// closed the connection instead of answering.
    async fn call<R: Encodable, S: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &R,
    ) -> Result<Option<S>> {
        let frame = self.frame(key, version, req)?;
        self.call_frame(key, version, &frame).await
    }

    async fn call_frame<S: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        frame: &[u8],
    ) -> Result<Option<S>> {
        if self.stream.write_all(frame).await.is_err() {
            return Ok(None);
        }
        let Some(mut body) = tokio::time::timeout(ANSWER_TIMEOUT, read_frame(&mut self.stream))
            .await
            .context("no answer in time")?
        else {
            return Ok(None);
        };
        let header = ResponseHeader::decode(&mut body, key.response_header_version(version))?;
        if header.correlation_id != self.correlation_id {
            bail!("answer for correlation id {}", header.correlation_id);
        }
        Ok(Some(S::decode(&mut body, version)?))
    }
}

async fn read_frame(stream: &mut TcpStream) -> Option<Bytes> {
    let size = stream.read_i32().await.ok()?;
    let mut body = vec![0u8; usize::try_from(size).ok()?];
    stream.read_exact(&mut body).await.ok()?;
    Some(Bytes::from(body))
}

/// How long a fresh connection waits for ApiVersions; `None`: not served
/// within [`LIVENESS_TIMEOUT`].
async fn liveness(addr: SocketAddr) -> Option<Duration> {
    let started = Instant::now();
    let answered = tokio::time::timeout(LIVENESS_TIMEOUT, async {
        let mut c = Client::connect(addr).await.ok()?;
        let req = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("hostile"))
            .with_client_software_version(StrBytes::from_static_str("1"));
        let resp: ApiVersionsResponse = c.call(ApiKey::ApiVersions, 3, &req).await.ok()??;
        (resp.error_code == 0).then_some(())
    })
    .await;
    matches!(answered, Ok(Some(()))).then(|| started.elapsed())
}

fn code_name(code: i16) -> String {
    match ResponseError::try_from_code(code) {
        None => "NONE".into(),
        Some(e) => format!("{e:?}"),
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// Appends `v` as a zig-zag varint.
fn put_varint(out: &mut Vec<u8>, v: i64) {
    let mut raw = ((v << 1) ^ (v >> 63)) as u64;
    while raw >= 0x80 {
        out.push((raw as u8) | 0x80);
        raw >>= 7;
    }
    out.push(raw as u8);
}

/// One record's encoding up to (not including) its value bytes; the
/// caller appends `value_len` value bytes and then [`RECORD_TAIL`].
fn record_head(offset_delta: i32, timestamp_delta: i64, key: &[u8], value_len: i32) -> Vec<u8> {
    let mut body = vec![0u8]; // attributes
    put_varint(&mut body, timestamp_delta);
    put_varint(&mut body, offset_delta as i64);
    put_varint(&mut body, key.len() as i64);
    body.extend_from_slice(key);
    put_varint(&mut body, value_len as i64);
    let body_len = body.len() as i64 + value_len as i64 + RECORD_TAIL.len() as i64;
    let mut out = Vec::new();
    put_varint(&mut out, body_len);
    out.extend_from_slice(&body);
    out
}

/// No headers.
const RECORD_TAIL: [u8; 1] = [0];

fn record(offset_delta: i32, timestamp_delta: i64, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = record_head(offset_delta, timestamp_delta, key, value.len() as i32);
    out.extend_from_slice(value);
    out.extend_from_slice(&RECORD_TAIL);
    out
}

/// A v2 batch around an (already encoded, possibly compressed) records
/// section, with a valid CRC: what reaches the broker's validation is only
/// what is inside.
fn batch(codec: Codec, payload: &[u8], count: i32, base_ts: i64, max_ts: i64) -> Bytes {
    let mut b = vec![0u8; HEADER_LEN];
    b[12..16].copy_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
    b[16] = 2; // magic
    b[23..27].copy_from_slice(&(count - 1).max(0).to_be_bytes()); // last offset delta
    b[27..35].copy_from_slice(&base_ts.to_be_bytes());
    b[35..43].copy_from_slice(&max_ts.to_be_bytes());
    b[43..51].copy_from_slice(&(-1i64).to_be_bytes()); // producer id
    b[51..53].copy_from_slice(&(-1i16).to_be_bytes()); // producer epoch
    b[53..57].copy_from_slice(&(-1i32).to_be_bytes()); // base sequence
    b[OFF_RECORD_COUNT..OFF_RECORD_COUNT + 4].copy_from_slice(&count.to_be_bytes());
    b.extend_from_slice(payload);
    rewrite::set_codec(&mut b, codec);
    rewrite::seal(&mut b);
    Bytes::from(b)
}

fn plain_batch(n: i32, value_len: usize, ts: i64) -> Bytes {
    let value = vec![b'x'; value_len];
    let mut payload = Vec::new();
    for i in 0..n {
        payload.extend_from_slice(&record(i, 0, format!("k{i}").as_bytes(), &value));
    }
    batch(Codec::None, &payload, n, ts, ts)
}

fn produce_request(topic: &str, batch: Bytes) -> ProduceRequest {
    let pd = produce_request::PartitionProduceData::default()
        .with_index(0)
        .with_records(Some(batch));
    let td = produce_request::TopicProduceData::default()
        .with_name(TopicName(str_bytes(topic)))
        .with_partition_data(vec![pd]);
    ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![td])
}

/// The partition's error code, or "closed" when the broker hung up.
async fn produce(c: &mut Client, topic: &str, batch: Bytes) -> Result<String> {
    let resp: Option<ProduceResponse> = c
        .call(ApiKey::Produce, 9, &produce_request(topic, batch))
        .await?;
    Ok(match resp {
        None => "closed".into(),
        Some(r) => {
            let p = &r.responses[0].partition_responses[0];
            code_name(p.error_code)
        }
    })
}

async fn create_topic(c: &mut Client, name: &str, partitions: i32) -> Result<String> {
    let t = create_topics_request::CreatableTopic::default()
        .with_name(TopicName(str_bytes(name)))
        .with_num_partitions(partitions)
        .with_replication_factor(1);
    let req = CreateTopicsRequest::default()
        .with_topics(vec![t])
        .with_timeout_ms(30_000);
    let resp: Option<CreateTopicsResponse> = c.call(ApiKey::CreateTopics, 7, &req).await?;
    Ok(match resp {
        None => "closed".into(),
        Some(r) => code_name(r.topics[0].error_code),
    })
}

async fn list_offsets(c: &mut Client, topic: &str, timestamp: i64) -> Result<String> {
    let p = list_offsets_request::ListOffsetsPartition::default()
        .with_partition_index(0)
        .with_timestamp(timestamp)
        .with_current_leader_epoch(-1);
    let t = list_offsets_request::ListOffsetsTopic::default()
        .with_name(TopicName(str_bytes(topic)))
        .with_partitions(vec![p]);
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![t]);
    let resp: Option<ListOffsetsResponse> = c.call(ApiKey::ListOffsets, 7, &req).await?;
    Ok(match resp {
        None => "closed".into(),
        Some(r) => {
            let p = &r.topics[0].partitions[0];
            format!("{}@{}", code_name(p.error_code), p.offset)
        }
    })
}

/// What a case observed, and what it should have been for our broker.
struct Observed {
    answer: String,
    /// The answers that pass; empty: any answer passes (the case is about
    /// liveness and memory only).
    expected: Vec<String>,
}

impl Observed {
    fn new(answer: String, expected: &[&str]) -> Self {
        Observed {
            answer,
            expected: expected.iter().map(|s| s.to_string()).collect(),
        }
    }
    fn answer_ok(&self) -> bool {
        self.expected.is_empty() || self.expected.iter().any(|e| self.answer.starts_with(e))
    }
}

/// Six connections each send the size of a 100 MB frame and then nothing;
/// a fresh producer must still be served at once.
async fn stalled_frames(addr: SocketAddr) -> Result<Observed> {
    let mut stalled = Vec::new();
    for _ in 0..6 {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(&100_000_000i32.to_be_bytes()).await?;
        stalled.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let answer = tokio::time::timeout(LIVENESS_TIMEOUT, async {
        let mut c = Client::connect(addr).await?;
        produce(&mut c, "hostile", plain_batch(10, 100, now_ms())).await
    })
    .await
    .map_err(|_| anyhow::anyhow!("produce not answered in {LIVENESS_TIMEOUT:?}"))
    .and_then(|r| r);
    drop(stalled);
    let answer = match answer {
        Ok(a) => format!("{a} in {} ms", started.elapsed().as_millis()),
        Err(e) => format!("starved: {e}"),
    };
    Ok(Observed::new(answer, &["NONE"]))
}

/// Frame sizes no broker accepts: the connection is closed, nothing else.
async fn oversize_frame(addr: SocketAddr) -> Result<Observed> {
    let mut answers = Vec::new();
    for size in [i32::MAX, -1] {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(&size.to_be_bytes()).await?;
        s.write_all(&[0u8; 64]).await.ok();
        let mut buf = [0u8; 4];
        let closed = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await;
        answers.push(match closed {
            Ok(Ok(0)) | Ok(Err(_)) => "closed",
            Ok(Ok(_)) => "answered",
            Err(_) => "left-open",
        });
    }
    Ok(Observed::new(answers.join("+"), &["closed+closed"]))
}

/// A 40 MB Metadata request of empty topic names.
async fn metadata_empty_names(addr: SocketAddr) -> Result<Observed> {
    let mut c = Client::connect(addr).await?;
    // v9 is flexible: each entry is a compact empty name (0x01) and an
    // empty tag section (0x00), two bytes on the wire. Encoded by hand so
    // the client does not hold 20 million decoded entries itself.
    const N: u32 = 20_000_000;
    let one = MetadataRequest::default()
        .with_topics(Some(vec![metadata_request::MetadataRequestTopic::default(
        )
        .with_name(Some(TopicName(str_bytes(""))))]))
        .with_allow_auto_topic_creation(false);
    let frame = c.frame(ApiKey::Metadata, 9, &one)?;
    // The one-entry frame ends: count 2 (0x02), the entry 0x01 0x00, then
    // three booleans and the request's tag section.
    let tail_len = 2 + 3 + 1;
    let at = frame.len() - tail_len - 1;
    anyhow::ensure!(
        frame[at..at + 3] == [0x02, 0x01, 0x00],
        "unexpected Metadata v9 encoding"
    );
    let mut big = frame[..at].to_vec();
    let mut count = N + 1;
    while count >= 0x80 {
        big.push((count as u8) | 0x80);
        count >>= 7;
    }
    big.push(count as u8);
    big.resize(big.len() + 2 * N as usize, 0x01);
    let entries_end = big.len();
    for pair in big[entries_end - 2 * N as usize..].chunks_exact_mut(2) {
        pair[1] = 0x00;
    }
    big.extend_from_slice(&frame[frame.len() - (tail_len - 2)..]);
    let size = (big.len() - 4) as i32;
    big[..4].copy_from_slice(&size.to_be_bytes());
    let resp: Option<MetadataResponse> = c.call_frame(ApiKey::Metadata, 9, &big).await?;
    drop(big);
    let answer = match resp {
        None => "closed".to_string(),
        Some(r) => {
            let codes: std::collections::BTreeSet<String> =
                r.topics.iter().map(|t| code_name(t.error_code)).collect();
            format!(
                "{} topics: {}",
                r.topics.len(),
                codes.into_iter().collect::<Vec<_>>().join(",")
            )
        }
    };
    Ok(Observed::new(answer, &[]))
}

async fn create_topics_huge(addr: SocketAddr, validate_only: bool) -> Result<Observed> {
    let mut c = Client::connect(addr).await?;
    let t = create_topics_request::CreatableTopic::default()
        .with_name(TopicName(str_bytes(if validate_only {
            "hostile-huge-validate"
        } else {
            "hostile-huge"
        })))
        .with_num_partitions(i32::MAX)
        .with_replication_factor(1);
    let req = CreateTopicsRequest::default()
        .with_topics(vec![t])
        .with_timeout_ms(30_000)
        .with_validate_only(validate_only);
    let resp: Option<CreateTopicsResponse> = c.call(ApiKey::CreateTopics, 7, &req).await?;
    let answer = match resp {
        None => "closed".into(),
        Some(r) => code_name(r.topics[0].error_code),
    };
    // Kafka's controller refuses an operation of more than 10,000 records.
    Ok(Observed::new(answer, &["PolicyViolation"]))
}

async fn create_partitions_huge(addr: SocketAddr) -> Result<Observed> {
    let mut c = Client::connect(addr).await?;
    let t = create_partitions_request::CreatePartitionsTopic::default()
        .with_name(TopicName(str_bytes("hostile")))
        .with_count(i32::MAX);
    let req = CreatePartitionsRequest::default()
        .with_topics(vec![t])
        .with_timeout_ms(30_000);
    let resp: Option<CreatePartitionsResponse> = c.call(ApiKey::CreatePartitions, 3, &req).await?;
    let answer = match resp {
        None => "closed".into(),
        Some(r) => code_name(r.results[0].error_code),
    };
    // Kafka's controller refuses an operation of more than 10,000 records.
    Ok(Observed::new(answer, &["PolicyViolation"]))
}

/// A zstd batch whose two records hold `mib` MiB of zeros between them,
/// then ListOffsets MAX_TIMESTAMP and by timestamp on it.
async fn zstd_bomb(addr: SocketAddr, mib: u64) -> Result<Observed> {
    let mut c = Client::connect(addr).await?;
    create_topic(&mut c, "hostile-bomb", 1).await?;
    let ts = now_ms();
    let per_record = (mib << 20) / 2;
    let per_record = i32::try_from(per_record).context("--bomb-mib too large")?;
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3)?;
    let zeros = vec![0u8; 1 << 20];
    for i in 0..2 {
        enc.write_all(&record_head(i, i as i64, b"bomb", per_record))?;
        let mut left = per_record as usize;
        while left > 0 {
            let n = left.min(zeros.len());
            enc.write_all(&zeros[..n])?;
            left -= n;
        }
        enc.write_all(&RECORD_TAIL)?;
    }
    let payload = enc.finish()?;
    let compressed_kib = payload.len() / 1024;
    let b = batch(Codec::Zstd, &payload, 2, ts, ts + 1);
    let produced = produce(&mut c, "hostile-bomb", b).await?;
    let max_ts = list_offsets(&mut c, "hostile-bomb", -3).await?;
    let by_ts = list_offsets(&mut c, "hostile-bomb", ts).await?;
    Ok(Observed::new(
        format!(
            "{compressed_kib} KiB batch: produce {produced}, MAX_TIMESTAMP {max_ts}, by-timestamp {by_ts}"
        ),
        &[],
    ))
}

/// A snappy batch whose records section is only a raw-snappy preamble
/// declaring 4 GiB.
async fn snappy_preamble(addr: SocketAddr) -> Result<Observed> {
    let mut c = Client::connect(addr).await?;
    let ts = now_ms();
    let b = batch(Codec::Snappy, &[0xff, 0xff, 0xff, 0xff, 0x0f], 1, ts, ts);
    let answer = produce(&mut c, "hostile", b).await?;
    // Kafka answers a records section its codec cannot decode with
    // UNKNOWN_SERVER_ERROR; so do we.
    Ok(Observed::new(answer, &["UnknownServerError"]))
}

/// A record stamped 30 days ahead.
async fn future_timestamp(addr: SocketAddr) -> Result<Observed> {
    let mut c = Client::connect(addr).await?;
    let ts = now_ms() + 30 * 24 * 3600 * 1000;
    let answer = produce(&mut c, "hostile", plain_batch(1, 10, ts)).await?;
    Ok(Observed::new(answer, &["InvalidTimestamp"]))
}

/// A valid CRC over records whose key length runs past the record.
fn garbage_records() -> Vec<u8> {
    let mut payload = Vec::new();
    for i in 0..3 {
        let mut r = record(i, 0, b"key", b"value");
        if i == 1 {
            // The key length (after length, attributes, two deltas): 3 -> 60.
            r[4] = 120;
        }
        payload.extend_from_slice(&r);
    }
    payload
}

async fn garbage_uncompressed(addr: SocketAddr) -> Result<Observed> {
    let mut c = Client::connect(addr).await?;
    let ts = now_ms();
    let answer = produce(
        &mut c,
        "hostile",
        batch(Codec::None, &garbage_records(), 3, ts, ts),
    )
    .await?;
    Ok(Observed::new(answer, &["InvalidRecord", "CorruptMessage"]))
}

async fn garbage_gzip(addr: SocketAddr) -> Result<Observed> {
    let mut c = Client::connect(addr).await?;
    let ts = now_ms();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&garbage_records())?;
    let answer = produce(
        &mut c,
        "hostile",
        batch(Codec::Gzip, &gz.finish()?, 3, ts, ts),
    )
    .await?;
    Ok(Observed::new(answer, &["InvalidRecord", "CorruptMessage"]))
}

/// 64 MiB in the log, then a Fetch asking for all of it at once: the
/// answer stays within `fetch.max.bytes`.
async fn fetch_over_cap(addr: SocketAddr) -> Result<Observed> {
    let mut c = Client::connect(addr).await?;
    create_topic(&mut c, "hostile-fetch", 1).await?;
    for _ in 0..64 {
        let code = produce(
            &mut c,
            "hostile-fetch",
            plain_batch(64, 16 * 1024 - 40, now_ms()),
        )
        .await?;
        if code != "NONE" {
            return Ok(Observed::new(format!("produce {code}"), &["within"]));
        }
    }
    let fp = fetch_request::FetchPartition::default()
        .with_partition(0)
        .with_fetch_offset(0)
        .with_partition_max_bytes(i32::MAX)
        .with_current_leader_epoch(-1);
    let ft = fetch_request::FetchTopic::default()
        .with_topic(TopicName(str_bytes("hostile-fetch")))
        .with_partitions(vec![fp]);
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(500)
        .with_min_bytes(1)
        .with_max_bytes(i32::MAX)
        .with_session_epoch(-1)
        .with_topics(vec![ft]);
    let resp: Option<FetchResponse> = c.call(ApiKey::Fetch, 12, &req).await?;
    let answer = match resp {
        None => "closed".into(),
        Some(r) => {
            let p = &r.responses[0].partitions[0];
            let n = p.records.as_ref().map_or(0, |r| r.len());
            let verdict = if n <= FETCH_MAX_BYTES + (1 << 20) {
                "within"
            } else {
                "over"
            };
            format!(
                "{verdict} fetch.max.bytes: {} {n} bytes",
                code_name(p.error_code)
            )
        }
    };
    Ok(Observed::new(answer, &["within"]))
}

/// Many idle connections, then a fresh client.
async fn many_connections(addr: SocketAddr) -> Result<Observed> {
    let mut idle = Vec::new();
    let mut refused = 0;
    for _ in 0..500 {
        match TcpStream::connect(addr).await {
            Ok(s) => idle.push(s),
            Err(_) => refused += 1,
        }
    }
    let alive = liveness(addr).await;
    drop(idle);
    Ok(Observed::new(
        format!(
            "{} open, {refused} refused, fresh client {}",
            500 - refused,
            if alive.is_some() {
                "served"
            } else {
                "not served"
            }
        ),
        &["500 open, 0 refused, fresh client served"],
    ))
}

const CASES: &[&str] = &[
    "stalled_frames",
    "oversize_frame",
    "metadata_empty_names",
    "create_topics_huge_validate_only",
    "create_topics_huge",
    "create_partitions_huge",
    "zstd_bomb_list_offsets",
    "snappy_preamble",
    "future_timestamp",
    "garbage_records_uncompressed",
    "garbage_records_gzip",
    "fetch_over_cap",
    "many_connections",
];

async fn run_case(name: &str, addr: SocketAddr, args: &Args) -> Result<Observed> {
    match name {
        "stalled_frames" => stalled_frames(addr).await,
        "oversize_frame" => oversize_frame(addr).await,
        "metadata_empty_names" => metadata_empty_names(addr).await,
        "create_topics_huge_validate_only" => create_topics_huge(addr, true).await,
        "create_topics_huge" => create_topics_huge(addr, false).await,
        "create_partitions_huge" => create_partitions_huge(addr).await,
        "zstd_bomb_list_offsets" => zstd_bomb(addr, args.bomb_mib).await,
        "snappy_preamble" => snappy_preamble(addr).await,
        "future_timestamp" => future_timestamp(addr).await,
        "garbage_records_uncompressed" => garbage_uncompressed(addr).await,
        "garbage_records_gzip" => garbage_gzip(addr).await,
        "fetch_over_cap" => fetch_over_cap(addr).await,
        "many_connections" => many_connections(addr).await,
        other => bail!("unknown case {other}; cases: {}", CASES.join(",")),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    let addr = args.bootstrap;
    let cases: Vec<String> = match &args.cases {
        Some(c) => c.clone(),
        None => CASES.iter().map(|s| s.to_string()).collect(),
    };
    if liveness(addr).await.is_none() {
        bail!("nothing serves ApiVersions at {addr}");
    }
    // The topic most cases write to.
    let mut c = Client::connect(addr).await?;
    let created = create_topic(&mut c, "hostile", 1).await?;
    if created != "NONE" && created != "TopicAlreadyExists" {
        bail!("cannot create the topic `hostile`: {created}");
    }
    drop(c);
    let sampler = RssSampler::start(args.pid);
    let mut failed = 0;
    for name in &cases {
        sampler.reset(args.pid);
        let observed = run_case(name, addr, &args).await;
        // Let the broker finish what the case started before judging it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let alive = liveness(addr).await;
        let peak = sampler.peak_mib();
        let (answer, answer_ok, expected) = match &observed {
            Ok(o) => (o.answer.clone(), o.answer_ok(), o.expected.join("|")),
            Err(e) => (format!("error: {e:#}"), false, String::new()),
        };
        let pass = answer_ok && alive.is_some() && peak <= args.rss_limit_mib;
        let verdict = match (args.check, pass) {
            (false, _) => "-",
            (true, true) => "PASS",
            (true, false) => "FAIL",
        };
        if args.check && !pass {
            failed += 1;
        }
        println!(
            "case {name} answer={answer:?} expected={:?} alive_ms={} peak_rss_mib={peak} verdict={verdict}",
            if expected.is_empty() { "any" } else { &expected },
            alive.map_or("dead".to_string(), |d| d.as_millis().to_string()),
        );
        if alive.is_none() && rss_kib(args.pid).is_none() {
            println!("broker process {} is gone; stopping", args.pid);
            failed += cases.len();
            break;
        }
    }
    if args.check && failed > 0 {
        bail!("{failed} case(s) failed");
    }
    Ok(())
}
