//! Redrive (issue 8): a tracked, rate-limited job that copies dead letters
//! back to the queue's primary topic as first attempts, with their failure
//! history kept.
//!
//! This module is the part that decides, free of Kafka and clocks: the
//! request and its checks, the filter, the token bucket (it takes `now`),
//! the rewrite of a DLQ record into its redriven copy, and the bitmap of
//! redriven DLQ offsets. `job` runs a job against Kafka; `store` keeps what
//! was redriven across jobs and restarts.
//!
//! Invariant: a DLQ record is redriven at most once per DLQ record (a
//! message that fails again is a new DLQ record and may be redriven again),
//! except for the last unconfirmed batch of a job whose instance died between
//! the write and the mark (at-least-once, like every dispatcher write).

pub(crate) mod job;
pub(crate) mod store;

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::lease::{Attempt, RetryEnvelope};

pub use job::Redriver;

/// The header naming the job that redrove a record (the agreed interface).
pub const REDRIVE_JOB_HEADER: &str = "dispatcher.redrive-job";
/// The header with the time (decimal ms) the record was redriven.
pub const REDRIVEN_MS_HEADER: &str = "dispatcher.redriven-ms";
/// The fastest rate a job may ask for (messages per second).
pub const MAX_RATE_PER_SEC: f64 = 10_000.0;
/// The longest text a filter field may have.
pub const MAX_FILTER_BYTES: usize = 1024;

/// What to redrive: every field given must match (AND).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedriveFilter {
    /// The message id, exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// The record key as UTF-8 text, exactly (a keyless record never matches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A substring of any error in the failure history (case-sensitive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_contains: Option<String>,
    /// First enqueued at or after this time (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// First enqueued before this time (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

/// A start request, as the API takes it (the JSON body of
/// `POST /queues/{q}/redrive`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedriveRequest {
    pub rate_per_sec: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<RedriveFilter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_messages: Option<u64>,
}

/// A checked request: the filter's times parsed.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct JobSpec {
    pub rate_per_sec: f64,
    pub filter: Option<RedriveFilter>,
    pub from_ms: Option<i64>,
    pub to_ms: Option<i64>,
    pub max_messages: Option<u64>,
}

impl RedriveRequest {
    /// Checks the request; the error says which field is wrong and why.
    pub(crate) fn check(self) -> Result<JobSpec, String> {
        let rate = self.rate_per_sec;
        if !rate.is_finite() || rate <= 0.0 || rate > MAX_RATE_PER_SEC {
            return Err(format!(
                "rate_per_sec must be above 0 and at most {MAX_RATE_PER_SEC}, not {rate}"
            ));
        }
        if self.max_messages == Some(0) {
            return Err("max_messages must be at least 1 (leave it out for no limit)".into());
        }
        let mut from_ms = None;
        let mut to_ms = None;
        if let Some(f) = &self.filter {
            for (name, value) in [
                ("message_id", &f.message_id),
                ("key", &f.key),
                ("error_contains", &f.error_contains),
            ] {
                if value.as_ref().is_some_and(|v| v.len() > MAX_FILTER_BYTES) {
                    return Err(format!(
                        "filter.{name} is longer than {MAX_FILTER_BYTES} bytes"
                    ));
                }
            }
            let time = |name: &str, v: &Option<String>| -> Result<Option<i64>, String> {
                v.as_deref()
                    .map(|t| {
                        parse_time(t).ok_or_else(|| {
                            format!(
                                "filter.{name}: {t:?} is not an RFC 3339 UTC time \
                                 (e.g. 2026-12-03T07:14:00.123Z)"
                            )
                        })
                    })
                    .transpose()
            };
            from_ms = time("from", &f.from)?;
            to_ms = time("to", &f.to)?;
            if let (Some(a), Some(b)) = (from_ms, to_ms) {
                if a >= b {
                    return Err("filter.from must be before filter.to".into());
                }
            }
        }
        Ok(JobSpec {
            rate_per_sec: rate,
            filter: self.filter.filter(|f| *f != RedriveFilter::default()),
            from_ms,
            to_ms,
            max_messages: self.max_messages,
        })
    }
}

/// RFC 3339 in UTC as the API writes it (`2026-12-03T07:14:00.123Z`), or
/// without the milliseconds (`2026-12-03T07:14:00Z`).
pub fn parse_time(text: &str) -> Option<i64> {
    crate::api::json::parse_rfc3339_ms(text).or_else(|| {
        let base = text.strip_suffix('Z')?;
        (base.len() == 19).then(|| crate::api::json::parse_rfc3339_ms(&format!("{base}.000Z")))?
    })
}

impl JobSpec {
    /// Does the DLQ record with this envelope and key match the filter?
    pub(crate) fn matches(&self, envelope: &RetryEnvelope, key: Option<&[u8]>) -> bool {
        let Some(f) = &self.filter else {
            return true;
        };
        if f.message_id
            .as_ref()
            .is_some_and(|id| *id != envelope.message_id)
        {
            return false;
        }
        if f.key.as_ref().is_some_and(|k| key != Some(k.as_bytes())) {
            return false;
        }
        if let Some(text) = &f.error_contains {
            if !envelope
                .errors
                .iter()
                .any(|e| e.error.contains(text.as_str()))
            {
                return false;
            }
        }
        if self
            .from_ms
            .is_some_and(|from| envelope.first_enqueued_ms < from)
        {
            return false;
        }
        if self
            .to_ms
            .is_some_and(|to| envelope.first_enqueued_ms >= to)
        {
            return false;
        }
        true
    }
}

/// The headers of a DLQ record's redriven copy: the user's headers as they
/// were, then the envelope with `attempt` 1 and no due time (origin, message
/// id, first-enqueued time and history kept), then the job id and the time.
pub fn redriven_headers(
    headers: &[(String, Vec<u8>)],
    envelope: &RetryEnvelope,
    job_id: &str,
    now_ms: i64,
) -> Vec<(String, Vec<u8>)> {
    let mut envelope = envelope.clone();
    envelope.attempt = Attempt::FIRST;
    envelope.due_ms = None;
    let mut out = headers.to_vec();
    // Drops every `dispatcher.*` header, an earlier redrive's included.
    envelope.write_into(&mut out);
    out.push((REDRIVE_JOB_HEADER.to_owned(), job_id.as_bytes().to_vec()));
    out.push((
        REDRIVEN_MS_HEADER.to_owned(),
        now_ms.to_string().into_bytes(),
    ));
    out
}

/// The primary partition a redriven copy goes to: its origin partition when
/// the origin is this queue's topic and the partition exists; `None` (the
/// partitioner decides, by key) otherwise.
pub fn target_partition(
    envelope: &RetryEnvelope,
    primary_topic: &str,
    primary_partitions: i32,
) -> Option<i32> {
    (envelope.origin_topic == primary_topic
        && (0..primary_partitions).contains(&envelope.origin_partition))
    .then_some(envelope.origin_partition)
}

/// A token bucket: `rate` tokens a second, holding at most one second's
/// worth (at least one token). It starts with one token, so a job starts at
/// its rate rather than with a burst.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate: f64,
    capacity: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(rate_per_sec: f64, now: Instant) -> Self {
        TokenBucket {
            rate: rate_per_sec,
            capacity: rate_per_sec.max(1.0),
            tokens: 1.0,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity);
        self.last = now;
    }

    /// Takes a token: `None` when one was there, else how long until one is.
    pub fn take(&mut self, now: Instant) -> Option<Duration> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            None
        } else {
            Some(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }

    /// Forgets what accrued (after a pause: no burst on resume).
    pub fn reset(&mut self, now: Instant) {
        self.tokens = self.tokens.min(1.0);
        self.last = now;
    }
}

/// DLQ offsets per chunk of the redriven bitmap.
pub const CHUNK_OFFSETS: i64 = 4096;
const CHUNK_WORDS: usize = (CHUNK_OFFSETS / 64) as usize;

/// Which offsets of one chunk of a DLQ partition were redriven: bit `o %
/// CHUNK_OFFSETS` of chunk `o / CHUNK_OFFSETS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkBits(Box<[u64; CHUNK_WORDS]>);

impl Default for ChunkBits {
    fn default() -> Self {
        ChunkBits(Box::new([0; CHUNK_WORDS]))
    }
}

impl ChunkBits {
    pub fn chunk_of(offset: i64) -> i64 {
        offset.div_euclid(CHUNK_OFFSETS)
    }

    fn bit(offset: i64) -> (usize, u64) {
        let i = offset.rem_euclid(CHUNK_OFFSETS) as usize;
        (i / 64, 1u64 << (i % 64))
    }

    pub fn get(&self, offset: i64) -> bool {
        let (w, b) = Self::bit(offset);
        self.0[w] & b != 0
    }

    pub fn set(&mut self, offset: i64) {
        let (w, b) = Self::bit(offset);
        self.0[w] |= b;
    }

    pub fn merge(&mut self, other: &ChunkBits) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a |= *b;
        }
    }

    /// Little-endian words, behind a version byte.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + CHUNK_WORDS * 8);
        out.push(1);
        for w in self.0.iter() {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<ChunkBits> {
        let (&version, words) = bytes.split_first()?;
        if version != 1 || words.len() != CHUNK_WORDS * 8 {
            return None;
        }
        let mut bits = ChunkBits::default();
        for (w, b) in bits.0.iter_mut().zip(words.chunks_exact(8)) {
            *w = u64::from_le_bytes(b.try_into().expect("8 bytes"));
        }
        Some(bits)
    }
}

/// A job's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Running,
    Paused,
    Cancelled,
    Done,
    Failed,
}

impl JobState {
    pub fn is_active(self) -> bool {
        matches!(self, JobState::Running | JobState::Paused)
    }

    /// The `dispatcher_redrive_job_state` gauge's value.
    pub fn gauge(self) -> f64 {
        match self {
            JobState::Running => 1.0,
            JobState::Paused => 2.0,
            JobState::Cancelled | JobState::Done | JobState::Failed => 0.0,
        }
    }
}

/// Where a job scans one DLQ partition: from `start` up to `end` (the end
/// offset when the job started), and how far it got.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRange {
    pub partition: i32,
    pub start: i64,
    pub end: i64,
    /// The next offset to scan.
    pub position: i64,
}

/// A job as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RedriveJob {
    pub id: String,
    pub queue: String,
    pub state: JobState,
    /// Why it failed, was cancelled or is done; absent while active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<RedriveFilter>,
    pub rate_per_sec: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_messages: Option<u64>,
    /// DLQ records read.
    pub scanned: u64,
    /// Records read that were not redriven before and match the filter.
    pub matched: u64,
    /// Copies written to the primary topic (delivery confirmed).
    pub redriven: u64,
    /// Records read that an earlier job had redriven already.
    pub skipped: u64,
    /// Records read without a readable dispatcher envelope (not redriven).
    pub unreadable: u64,
    /// DLQ records between each partition's position and its end offset.
    pub remaining: i64,
    /// RFC 3339 UTC.
    pub started_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// When the first and the last copy were written (RFC 3339 UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_redriven_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_redriven_at: Option<String>,
    /// Each DLQ partition's range, in partition order.
    pub partitions: Vec<PartitionRange>,
}

/// Pause, resume or cancel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedriveAction {
    Pause,
    Resume,
    Cancel,
}

impl RedriveAction {
    pub fn name(self) -> &'static str {
        match self {
            RedriveAction::Pause => "pause",
            RedriveAction::Resume => "resume",
            RedriveAction::Cancel => "cancel",
        }
    }
}

/// Why a redrive operation did not happen.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RedriveError {
    #[error(transparent)]
    Service(#[from] crate::service::ServiceError),
    /// A job runs or is paused (start), or none does (pause, resume, cancel).
    #[error("{0}")]
    Conflict(String),
    /// No job ran on this queue since its runner started.
    #[error("{0}")]
    NoJob(String),
    /// This instance does not own the queue's partition 0, where redrive
    /// jobs run; `crate::forward` sends the request to its owner.
    #[error("this instance does not run the queue's redrive jobs (it does not own partition 0)")]
    NotOwner,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope() -> RetryEnvelope {
        let mut e = RetryEnvelope {
            origin_topic: "jobs".into(),
            origin_partition: 1,
            origin_offset: 7,
            message_id: "m-1".into(),
            attempt: Attempt(5),
            first_enqueued_ms: 1_000,
            due_ms: None,
            errors: Vec::new(),
        };
        e.push_failure(Attempt(5), 2_000, "HTTP 503 busy", Some("w"));
        e
    }

    fn spec(filter: RedriveFilter) -> JobSpec {
        RedriveRequest {
            rate_per_sec: 10.0,
            filter: Some(filter),
            max_messages: None,
        }
        .check()
        .unwrap()
    }

    #[test]
    fn bad_requests_are_refused_with_the_field_named() {
        let req = |rate: f64| RedriveRequest {
            rate_per_sec: rate,
            filter: None,
            max_messages: None,
        };
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY, 10_001.0] {
            assert!(req(rate).check().unwrap_err().contains("rate_per_sec"));
        }
        assert!(req(0.5).check().is_ok());
        let err = RedriveRequest {
            max_messages: Some(0),
            ..req(1.0)
        }
        .check()
        .unwrap_err();
        assert!(err.contains("max_messages"), "{err}");
        let bad_time = RedriveRequest {
            filter: Some(RedriveFilter {
                from: Some("yesterday".into()),
                ..RedriveFilter::default()
            }),
            ..req(1.0)
        };
        assert!(bad_time.check().unwrap_err().contains("filter.from"));
        let backwards = RedriveRequest {
            filter: Some(RedriveFilter {
                from: Some("2026-01-02T00:00:00Z".into()),
                to: Some("2026-01-01T00:00:00.000Z".into()),
                ..RedriveFilter::default()
            }),
            ..req(1.0)
        };
        assert!(backwards.check().unwrap_err().contains("before"));
    }

    #[test]
    fn every_filter_field_must_match() {
        let e = envelope();
        assert!(spec(RedriveFilter::default()).matches(&e, None));
        let by_id = |id: &str| {
            spec(RedriveFilter {
                message_id: Some(id.into()),
                ..RedriveFilter::default()
            })
        };
        assert!(by_id("m-1").matches(&e, None));
        assert!(!by_id("m-2").matches(&e, None));
        let by_key = spec(RedriveFilter {
            key: Some("k".into()),
            ..RedriveFilter::default()
        });
        assert!(by_key.matches(&e, Some(b"k")));
        assert!(!by_key.matches(&e, Some(b"kk")));
        assert!(!by_key.matches(&e, None));
        let by_error = |t: &str| {
            spec(RedriveFilter {
                error_contains: Some(t.into()),
                ..RedriveFilter::default()
            })
        };
        assert!(by_error("503").matches(&e, None));
        assert!(!by_error("timeout").matches(&e, None));
        let window = |from: &str, to: &str| {
            spec(RedriveFilter {
                from: Some(from.into()),
                to: Some(to.into()),
                ..RedriveFilter::default()
            })
        };
        // first_enqueued_ms is 1000: from is inclusive, to exclusive.
        assert!(window("1970-01-01T00:00:01.000Z", "1970-01-01T00:00:01.001Z").matches(&e, None));
        assert!(!window("1970-01-01T00:00:00.000Z", "1970-01-01T00:00:01.000Z").matches(&e, None));
        let both = spec(RedriveFilter {
            message_id: Some("m-1".into()),
            error_contains: Some("timeout".into()),
            ..RedriveFilter::default()
        });
        assert!(!both.matches(&e, None));
    }

    #[test]
    fn a_redriven_copy_is_attempt_1_with_the_history_and_the_job() {
        let e = envelope();
        let mut dlq_headers = vec![("trace".to_owned(), b"t".to_vec())];
        e.write_into(&mut dlq_headers);
        dlq_headers.push((REDRIVE_JOB_HEADER.to_owned(), b"old".to_vec()));
        let out = redriven_headers(&dlq_headers, &e, "job-2", 99);
        let back = RetryEnvelope::from_headers(&out).unwrap().unwrap();
        assert_eq!(back.attempt, Attempt::FIRST);
        assert_eq!(back.due_ms, None);
        assert_eq!(back.errors, e.errors);
        assert_eq!(back.message_id, "m-1");
        assert_eq!((back.origin_partition, back.origin_offset), (1, 7));
        assert_eq!(out[0], ("trace".to_owned(), b"t".to_vec()));
        let jobs: Vec<_> = out
            .iter()
            .filter(|(n, _)| n == REDRIVE_JOB_HEADER)
            .collect();
        assert_eq!(jobs, [&(REDRIVE_JOB_HEADER.to_owned(), b"job-2".to_vec())]);
        assert!(out.contains(&(REDRIVEN_MS_HEADER.to_owned(), b"99".to_vec())));
    }

    #[test]
    fn the_copy_goes_to_its_origin_partition_when_it_exists() {
        let e = envelope();
        assert_eq!(target_partition(&e, "jobs", 2), Some(1));
        assert_eq!(target_partition(&e, "jobs", 1), None);
        assert_eq!(target_partition(&e, "other", 2), None);
    }

    #[test]
    fn the_bucket_keeps_the_rate_and_bursts_at_most_a_second() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(100.0, t0);
        assert_eq!(b.take(t0), None);
        let wait = b.take(t0).unwrap();
        assert!((wait.as_secs_f64() - 0.01).abs() < 1e-9, "{wait:?}");
        // Ten seconds idle: at most 100 tokens (one second's worth).
        let later = t0 + Duration::from_secs(10);
        let mut taken = 0;
        while b.take(later).is_none() {
            taken += 1;
        }
        assert_eq!(taken, 100);
        // Steady: one every 10 ms.
        let mut now = later;
        let mut n = 0;
        while now < later + Duration::from_secs(1) {
            match b.take(now) {
                None => n += 1,
                Some(w) => now += w,
            }
        }
        assert!((99..=101).contains(&n), "{n}");
        // A full bucket reset (after a pause): no burst, one token at most.
        let resumed = now + Duration::from_secs(10);
        assert_eq!(b.take(resumed), None);
        b.reset(resumed);
        assert_eq!(b.take(resumed), None);
        assert!(b.take(resumed).is_some());
    }

    #[test]
    fn chunk_bits_round_trip() {
        let mut b = ChunkBits::default();
        for o in [0, 63, 64, 4095, 4096 + 5] {
            b.set(o);
        }
        assert!(b.get(4095) && b.get(5) && !b.get(6));
        assert_eq!(ChunkBits::chunk_of(4096 + 5), 1);
        let back = ChunkBits::decode(&b.encode()).unwrap();
        assert_eq!(back, b);
        assert!(ChunkBits::decode(&[2]).is_none());
        let mut c = ChunkBits::default();
        c.set(6);
        c.merge(&b);
        assert!(c.get(6) && c.get(63));
    }
}
