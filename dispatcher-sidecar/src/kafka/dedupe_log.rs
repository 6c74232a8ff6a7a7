//! The dedupe topic (`<topic>.dedupe`): one record per message id a produce
//! accepted, keyed by the id, valued with where the first copy went.
//!
//! Every instance reads the topic's last dedupe window at start and then
//! follows it, so an id accepted by any instance, before or after a restart,
//! answers `duplicate` everywhere. The topic is compacted and deleted after
//! the window; readers also drop records older than the window by their
//! timestamp, so correctness does not wait for the broker's cleaner.
//!
//! Window edge: an id whose record is not yet read by another instance (the
//! follow lag, milliseconds) can be accepted there a second time. That is a
//! duplicate message, never a lost one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::Message as _;
use rdkafka::{Offset, TopicPartitionList};

const VALUE_LEN: usize = 12;
const POLL: Duration = Duration::from_millis(100);
const METADATA_TIMEOUT: Duration = Duration::from_secs(30);

/// The record value: the first copy's partition and offset.
pub fn encode_value(partition: i32, offset: i64) -> [u8; VALUE_LEN] {
    let mut v = [0u8; VALUE_LEN];
    v[..4].copy_from_slice(&partition.to_be_bytes());
    v[4..].copy_from_slice(&offset.to_be_bytes());
    v
}

pub fn decode_value(value: &[u8]) -> Option<(i32, i64)> {
    if value.len() != VALUE_LEN {
        return None;
    }
    let partition = i32::from_be_bytes(value[..4].try_into().ok()?);
    let offset = i64::from_be_bytes(value[4..].try_into().ok()?);
    Some((partition, offset))
}

/// One accepted id, as read back: `(id, partition, offset, accepted at ms)`.
pub type Accepted<'a> = (&'a str, i32, i64, i64);

/// A running reader of the dedupe topic; stops when dropped.
pub struct Follower {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Reads `topic` from `window` ago to its end, giving `sink` every id, then
/// returns with a [`Follower`] that keeps giving it new ones. Blocking: call
/// from `spawn_blocking`. `client_config` is a plain (group-less) client's.
pub fn follow<F>(
    client_config: &ClientConfig,
    topic: &str,
    window: Duration,
    mut sink: F,
) -> anyhow::Result<Follower>
where
    F: FnMut(Accepted<'_>) + Send + 'static,
{
    // librdkafka wants a group id even for assign(); this one never joins
    // (no subscribe) and commits nothing.
    let consumer: BaseConsumer = client_config
        .clone()
        .set("group.id", "dispatcher-dedupe-reader")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .create()
        .context("creating the dedupe-topic reader")?;
    // A topic created a moment ago (topic setup at start) may not have a
    // leader everywhere yet: NOT_LEADER and the like pass within seconds.
    let deadline = std::time::Instant::now() + METADATA_TIMEOUT;
    let metadata = retrying(deadline, || {
        consumer.fetch_metadata(Some(topic), METADATA_TIMEOUT)
    })
    .with_context(|| format!("reading {topic}'s partitions"))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    anyhow::ensure!(!partitions.is_empty(), "topic {topic} has no partitions");
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    let since = now_ms().saturating_sub(window_ms);
    let mut wanted = TopicPartitionList::new();
    for &p in &partitions {
        wanted
            .add_partition_offset(topic, p, Offset::Offset(since))
            .expect("a new list takes offsets");
    }
    let starts = retrying(deadline, || {
        consumer.offsets_for_times(wanted.clone(), METADATA_TIMEOUT)
    })
    .with_context(|| format!("finding {topic}'s offsets of the window start"))?;
    // Where the catch-up ends: each partition's end now.
    let mut ends: HashMap<i32, i64> = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for &p in &partitions {
        let (_, high) = retrying(deadline, || {
            consumer.fetch_watermarks(topic, p, METADATA_TIMEOUT)
        })
        .with_context(|| format!("reading {topic}/{p}'s end"))?;
        let start = match starts.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Offset::Offset(o),
            // No record at or after the window start.
            _ => Offset::Offset(high),
        };
        if let Offset::Offset(s) = start {
            if s < high {
                ends.insert(p, high);
            }
        }
        assignment
            .add_partition_offset(topic, p, start)
            .expect("a new list takes offsets");
    }
    consumer
        .assign(&assignment)
        .with_context(|| format!("assigning {topic}"))?;

    let mut give = move |m: &rdkafka::message::BorrowedMessage<'_>, window_ms: i64| {
        let at = m.timestamp().to_millis().unwrap_or_else(now_ms);
        if at < now_ms().saturating_sub(window_ms) {
            return;
        }
        let (Some(Ok(id)), Some(value)) = (m.key_view::<str>(), m.payload()) else {
            return;
        };
        if let Some((partition, offset)) = decode_value(value) {
            sink((id, partition, offset, at));
        }
    };
    // Catch up, bounded: a broker that stops answering fails the start.
    let deadline = std::time::Instant::now() + METADATA_TIMEOUT;
    while !ends.is_empty() {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "reading the dedupe window of {topic} took over {METADATA_TIMEOUT:?}"
        );
        match consumer.poll(POLL) {
            Some(Ok(m)) => {
                give(&m, window_ms);
                if ends
                    .get(&m.partition())
                    .is_some_and(|&e| m.offset() + 1 >= e)
                {
                    ends.remove(&m.partition());
                }
            }
            Some(Err(e)) => tracing::warn!(%topic, "reading the dedupe topic: {e}"),
            None => {
                // Compaction can leave no record at the end offset itself:
                // the position then tells that the partition is read.
                if let Ok(position) = consumer.position() {
                    for e in position.elements() {
                        if let Offset::Offset(o) = e.offset() {
                            if ends.get(&e.partition()).is_some_and(|&end| o >= end) {
                                ends.remove(&e.partition());
                            }
                        }
                    }
                }
            }
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let name = topic.to_string();
    let thread = std::thread::Builder::new()
        .name("dedupe-follow".into())
        .spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                match consumer.poll(POLL) {
                    Some(Ok(m)) => give(&m, window_ms),
                    Some(Err(e)) => {
                        tracing::warn!(topic = %name, "following the dedupe topic: {e}")
                    }
                    None => {}
                }
            }
        })
        .context("starting the dedupe follower thread")?;
    Ok(Follower {
        stop,
        thread: Some(thread),
    })
}

/// `call` again every 200 ms until it succeeds or `deadline` passes (then
/// its last error).
fn retrying<T>(
    deadline: std::time::Instant,
    mut call: impl FnMut() -> rdkafka::error::KafkaResult<T>,
) -> rdkafka::error::KafkaResult<T> {
    loop {
        match call() {
            Ok(v) => return Ok(v),
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            Err(e) => {
                tracing::debug!("dedupe topic not ready yet: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_damage_is_refused() {
        let v = encode_value(7, 1 << 40);
        assert_eq!(decode_value(&v), Some((7, 1 << 40)));
        assert_eq!(decode_value(&v[..11]), None);
        assert_eq!(decode_value(b""), None);
    }
}
