//! What was redriven, kept in Kafka so it survives restarts and moves with
//! the job to another instance:
//!
//! - the **marks**: the compacted topic `<dlq>.redrive` (created with the
//!   queue's other topics), whose partition p holds, per chunk of
//!   [`CHUNK_OFFSETS`] offsets of DLQ partition p, the bitmap of the offsets
//!   redriven (key `m/<p>/<chunk>`, value [`ChunkBits::encode`]). A job reads
//!   only the chunks of the window it scans, so its memory is bounded by the
//!   window, not by the DLQ;
//! - the **floor**: the consumer group `<queue group>.redrive`, whose
//!   committed offset on DLQ partition p is the offset below which every
//!   record was redriven. Later jobs start scanning there, and `dlq_depth`
//!   counts from there (`queue::runtime::stats`). The floor is a shortcut:
//!   every redriven record is also marked, so a floor lost to the broker's
//!   offset retention only makes the next job scan (and skip) more.
//!
//! Blocking calls (librdkafka): run them on `spawn_blocking`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::ChunkBits;
#[cfg(doc)]
use super::CHUNK_OFFSETS;
use crate::config::QueueConfig;

/// The compacted topic of a queue's redrive marks.
pub fn state_topic(queue: &QueueConfig) -> String {
    format!("{}.redrive", queue.dlq_topic)
}

/// The consumer group whose committed DLQ offsets are the redrive floors.
pub fn floor_group(queue: &QueueConfig) -> String {
    format!("{}.redrive", queue.group)
}

/// The record key of the marks of chunk `chunk` of DLQ partition
/// `partition`. The partition is in the key as well: a marks topic with
/// fewer partitions than the DLQ (created by hand) holds several DLQ
/// partitions' marks in one.
pub fn mark_key(partition: i32, chunk: i64) -> String {
    format!("m/{partition}/{chunk}")
}

fn parse_mark_key(key: &[u8]) -> Option<(i32, i64)> {
    let (p, chunk) = std::str::from_utf8(key)
        .ok()?
        .strip_prefix("m/")?
        .split_once('/')?;
    Some((p.parse().ok()?, chunk.parse().ok()?))
}

/// A consumer in the floor group that never joins it: it reads and commits
/// the floors (a commit outside any generation, as admin tools do) and
/// reads the marks topic by `assign()`.
pub fn floor_consumer(base: &ClientConfig, queue: &QueueConfig) -> anyhow::Result<BaseConsumer> {
    let mut c = base.clone();
    c.set("group.id", floor_group(queue))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "50");
    c.create().context("creating the redrive floor consumer")
}

/// The consumer that scans the DLQ for a job (assigned, never in a group).
/// librdkafka's own prefetch is kept small: the job reads at its rate.
pub fn dlq_reader(base: &ClientConfig) -> anyhow::Result<BaseConsumer> {
    let mut c = base.clone();
    c.set("group.id", "dispatcher-redrive-reader")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest")
        .set("queued.max.messages.kbytes", "4096")
        .set("fetch.wait.max.ms", "50");
    c.create().context("creating the redrive DLQ reader")
}

/// The committed floor of each DLQ partition that has one.
pub fn read_floors(
    consumer: &BaseConsumer,
    dlq_topic: &str,
    partitions: i32,
    timeout: Duration,
) -> anyhow::Result<HashMap<i32, i64>> {
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(dlq_topic, p);
    }
    let committed = consumer
        .committed_offsets(tpl, timeout)
        .context("reading the redrive floors")?;
    Ok(committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect())
}

pub fn commit_floors(
    consumer: &BaseConsumer,
    dlq_topic: &str,
    floors: &[(i32, i64)],
) -> anyhow::Result<()> {
    if floors.is_empty() {
        return Ok(());
    }
    let mut tpl = TopicPartitionList::new();
    for &(p, o) in floors {
        tpl.add_partition_offset(dlq_topic, p, Offset::Offset(o))?;
    }
    consumer
        .commit(&tpl, CommitMode::Sync)
        .context("committing the redrive floors")
}

/// The marks of chunks `chunks` (a range) of DLQ partition `dlq_partition`,
/// read from the marks topic's partition `partition` from its start to its
/// end when asked. Unreadable records are skipped with a warning.
pub fn load_marks(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    dlq_partition: i32,
    chunks: std::ops::Range<i64>,
    timeout: Duration,
) -> anyhow::Result<HashMap<i64, ChunkBits>> {
    let mut marks = HashMap::new();
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, timeout)
        .with_context(|| format!("watermarks of {topic}/{partition}"))?;
    if high <= low {
        return Ok(marks);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + timeout;
    let result = (|| loop {
        anyhow::ensure!(
            Instant::now() < deadline,
            "reading the redrive marks {topic}/{partition} took over {timeout:?}"
        );
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                if let Some((p, chunk)) = m.key().and_then(parse_mark_key) {
                    if p == dlq_partition && chunks.contains(&chunk) {
                        match m.payload().and_then(ChunkBits::decode) {
                            Some(bits) => {
                                marks.insert(chunk, bits);
                            }
                            None => tracing::warn!(
                                topic,
                                partition,
                                offset = m.offset(),
                                "unreadable redrive marks"
                            ),
                        }
                    }
                }
                if m.offset() + 1 >= high {
                    return Ok(());
                }
            }
            Some(Err(e)) => return Err(e).context("reading the redrive marks"),
            None => {
                let position = consumer.position()?;
                if let Some(Offset::Offset(o)) = position
                    .find_partition(topic, partition)
                    .map(|e| e.offset())
                {
                    if o >= high {
                        return Ok(());
                    }
                }
            }
        }
    })();
    let _ = consumer.unassign();
    result.map(|()| marks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_keys_round_trip() {
        assert_eq!(parse_mark_key(mark_key(3, 42).as_bytes()), Some((3, 42)));
        assert_eq!(parse_mark_key(b"floor"), None);
        assert_eq!(parse_mark_key(b"m/42"), None);
        assert_eq!(parse_mark_key(b"m/1/x"), None);
    }
}
