//! Reads for a trace: one index partition, newest records first, and the one
//! record at a message's latest location. Blocking (librdkafka calls): run
//! them on `spawn_blocking`, with a consumer that is only ever `assign()`ed.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{Headers as _, Message as _};
use rdkafka::{Offset, TopicPartitionList};

use super::IndexEntry;

/// A lookup reads the index partition backwards in windows of this many
/// offsets, and stops in the first window (the newest) that holds the id:
/// a message touched lately is found in the first window.
const WINDOW: i64 = 5_000;
const POLL: Duration = Duration::from_millis(100);

/// What an index lookup cost, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scanned {
    pub records: u64,
}

/// The newest index entry of `message_id` in `topic`/`partition`, reading
/// backwards from the end; `None` when the partition holds none. Fails when
/// the partition cannot be read within `timeout`.
pub fn lookup(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    message_id: &str,
    timeout: Duration,
) -> anyhow::Result<(Option<IndexEntry>, Scanned)> {
    let deadline = Instant::now() + timeout;
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, timeout)
        .with_context(|| format!("watermarks of {topic}/{partition}"))?;
    let mut scanned = Scanned::default();
    let mut end = high;
    let result = (|| {
        while end > low {
            let start = (end - WINDOW).max(low);
            let mut newest = None;
            read_range(consumer, topic, partition, start, end, deadline, |m| {
                scanned.records += 1;
                if m.key() == Some(message_id.as_bytes()) {
                    match m.payload().and_then(IndexEntry::decode) {
                        Some(entry) => newest = Some(entry),
                        None => tracing::warn!(
                            topic,
                            partition,
                            offset = m.offset(),
                            "index record not readable"
                        ),
                    }
                }
            })?;
            if newest.is_some() {
                return Ok(newest);
            }
            end = start;
        }
        Ok(None)
    })();
    let _ = consumer.unassign();
    result.map(|found| (found, scanned))
}

/// Gives `each` every record of `[start, end)` in offset order.
fn read_range(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    start: i64,
    end: i64,
    deadline: Instant,
    mut each: impl FnMut(&rdkafka::message::BorrowedMessage<'_>),
) -> anyhow::Result<()> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(start))?;
    consumer.assign(&tpl)?;
    loop {
        anyhow::ensure!(
            Instant::now() < deadline,
            "reading {topic}/{partition} took too long"
        );
        match consumer.poll(POLL) {
            Some(Ok(m)) => {
                if m.offset() >= end {
                    return Ok(());
                }
                each(&m);
                if m.offset() + 1 >= end {
                    return Ok(());
                }
            }
            Some(Err(e)) => return Err(e).with_context(|| format!("reading {topic}/{partition}")),
            None => {
                // Compaction can leave no record at the end itself.
                if let Some(Offset::Offset(o)) = consumer
                    .position()?
                    .find_partition(topic, partition)
                    .map(|e| e.offset())
                {
                    if o >= end {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// The record at one offset, as a trace needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadAt {
    Record {
        headers: Vec<(String, Vec<u8>)>,
        timestamp_ms: i64,
    },
    /// Below the log start: deleted by retention.
    Gone { log_start: i64 },
    /// At or past the log end: not written (or not yet).
    Absent { log_end: i64 },
}

/// Reads the record at `topic`/`partition`/`offset`.
pub fn read_at(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    offset: i64,
    timeout: Duration,
) -> anyhow::Result<(ReadAt, i64)> {
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, timeout)
        .with_context(|| format!("watermarks of {topic}/{partition}"))?;
    if offset < low {
        return Ok((ReadAt::Gone { log_start: low }, low));
    }
    if offset >= high {
        return Ok((ReadAt::Absent { log_end: high }, low));
    }
    let deadline = Instant::now() + timeout;
    let mut found = None;
    let read = read_range(
        consumer,
        topic,
        partition,
        offset,
        offset + 1,
        deadline,
        |m| {
            if m.offset() == offset {
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                            .collect()
                    })
                    .unwrap_or_default();
                found = Some(ReadAt::Record {
                    headers,
                    timestamp_ms: m.timestamp().to_millis().unwrap_or(0),
                });
            }
        },
    );
    let _ = consumer.unassign();
    read?;
    // No record at the offset itself (compacted away, a transaction marker).
    Ok((found.unwrap_or(ReadAt::Absent { log_end: high }), low))
}
