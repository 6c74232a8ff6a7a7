//! Following a topic outside any group: read it from a start point to its
//! end at start-up (bounded), then keep reading new records on a thread.
//! The dedupe topic (`dedupe_log`) and the control topic (`control`) are
//! read this way by every instance.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{BorrowedMessage, Message as _};
use rdkafka::{Offset, TopicPartitionList};

const POLL: Duration = Duration::from_millis(100);
const METADATA_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the reading starts, in every partition of the topic.
#[derive(Debug, Clone, Copy)]
pub enum Start {
    /// Each partition's log start.
    Beginning,
    /// The first record with a timestamp at or after this (ms since the
    /// epoch); the end when there is none.
    Since(i64),
}

/// A running reader of a topic; stops when dropped.
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

/// Reads every partition of `topic` from `start` to its end, giving `give`
/// each record, then returns with a [`Follower`] that keeps giving it new
/// ones. Blocking: call from `spawn_blocking`. `client_config` is a plain
/// (group-less) client's; `reader` names the client (its group id, never
/// joined, and the thread).
pub fn follow<F>(
    client_config: &ClientConfig,
    reader: &str,
    topic: &str,
    start: Start,
    mut give: F,
) -> anyhow::Result<Follower>
where
    F: FnMut(&BorrowedMessage<'_>) + Send + 'static,
{
    // librdkafka wants a group id even for assign(); this one never joins
    // (no subscribe) and commits nothing.
    let consumer: BaseConsumer = client_config
        .clone()
        .set("group.id", format!("dispatcher-{reader}"))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .create()
        .with_context(|| format!("creating the {reader}"))?;
    // A topic created a moment ago (topic setup at start) may not have a
    // leader everywhere yet: NOT_LEADER and the like pass within seconds.
    let deadline = Instant::now() + METADATA_TIMEOUT;
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
    let starts = match start {
        Start::Beginning => None,
        Start::Since(ms) => {
            let mut wanted = TopicPartitionList::new();
            for &p in &partitions {
                wanted
                    .add_partition_offset(topic, p, Offset::Offset(ms))
                    .expect("a new list takes offsets");
            }
            Some(
                retrying(deadline, || {
                    consumer.offsets_for_times(wanted.clone(), METADATA_TIMEOUT)
                })
                .with_context(|| format!("finding {topic}'s offsets at {ms} ms"))?,
            )
        }
    };
    // Where the catch-up ends: each partition's end now.
    let mut ends: HashMap<i32, i64> = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for &p in &partitions {
        let (low, high) = retrying(deadline, || {
            consumer.fetch_watermarks(topic, p, METADATA_TIMEOUT)
        })
        .with_context(|| format!("reading {topic}/{p}'s ends"))?;
        let from = match &starts {
            None => low,
            Some(starts) => match starts.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                // No record at or after the start time.
                _ => high,
            },
        };
        if from < high {
            ends.insert(p, high);
        }
        assignment
            .add_partition_offset(topic, p, Offset::Offset(from))
            .expect("a new list takes offsets");
    }
    consumer
        .assign(&assignment)
        .with_context(|| format!("assigning {topic}"))?;

    // Catch up, bounded: a broker that stops answering fails the start.
    let deadline = Instant::now() + METADATA_TIMEOUT;
    while !ends.is_empty() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "reading {topic} to its end took over {METADATA_TIMEOUT:?}"
        );
        match consumer.poll(POLL) {
            Some(Ok(m)) => {
                give(&m);
                if ends
                    .get(&m.partition())
                    .is_some_and(|&e| m.offset() + 1 >= e)
                {
                    ends.remove(&m.partition());
                }
            }
            Some(Err(e)) => tracing::warn!(%topic, "reading {topic}: {e}"),
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
        .name(reader.chars().take(15).collect())
        .spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                match consumer.poll(POLL) {
                    Some(Ok(m)) => give(&m),
                    Some(Err(e)) => tracing::warn!(topic = %name, "following {name}: {e}"),
                    None => {}
                }
            }
        })
        .with_context(|| format!("starting the {reader} thread"))?;
    Ok(Follower {
        stop,
        thread: Some(thread),
    })
}

/// `call` again every 200 ms until it succeeds or `deadline` passes (then
/// its last error).
fn retrying<T>(
    deadline: Instant,
    mut call: impl FnMut() -> rdkafka::error::KafkaResult<T>,
) -> rdkafka::error::KafkaResult<T> {
    loop {
        match call() {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(e) => {
                tracing::debug!("topic not ready yet: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}
