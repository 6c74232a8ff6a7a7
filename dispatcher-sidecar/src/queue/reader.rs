//! Plain `assign()`ed reads, outside the queue's group: the ack log at a
//! rebuild, and the watermarks and oldest DLQ record for stats. Blocking
//! (librdkafka calls): run them on `spawn_blocking`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::lease::{decode_record, LeaseEvent, QueuePartition};

use super::ordered::{self, OrderedRecord};

/// What an ack-log read returns: the lease engine's events and the ordered
/// queues' records (`queue::ordered`), each in log order.
pub type AckLog = (
    Vec<(QueuePartition, LeaseEvent)>,
    Vec<(QueuePartition, OrderedRecord)>,
);

/// A consumer that never joins a group: it is only ever `assign()`ed and
/// never commits.
pub fn plain_consumer(base: &ClientConfig, purpose: &str) -> anyhow::Result<BaseConsumer> {
    let mut c = base.clone();
    c.set("group.id", format!("dispatcher-{purpose}"))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "50");
    c.create()
        .with_context(|| format!("creating the {purpose} consumer"))
}

/// Every decodable lease event in the ack-log partitions `partitions`, in
/// log order, with the queue partition its key names. Reads each from its
/// log start to the high watermark seen at the start. Undecodable records
/// are skipped with a warning (a newer version's record, or damage).
pub fn read_ack_log(
    consumer: &BaseConsumer,
    topic: &str,
    partitions: &[i32],
    timeout: Duration,
) -> anyhow::Result<AckLog> {
    let deadline = Instant::now() + timeout;
    let mut ends: HashMap<i32, i64> = HashMap::new();
    let mut tpl = TopicPartitionList::new();
    for &p in partitions {
        if ends.contains_key(&p) {
            continue;
        }
        let (low, high) = consumer
            .fetch_watermarks(topic, p, timeout)
            .with_context(|| format!("watermarks of {topic}/{p}"))?;
        if high > low {
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
            ends.insert(p, high);
        }
    }
    let mut events = Vec::new();
    let mut ordered_records = Vec::new();
    if ends.is_empty() {
        return Ok((events, ordered_records));
    }
    consumer.assign(&tpl)?;
    let result = (|| {
        while !ends.is_empty() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "reading the ack log {topic} took over {timeout:?}"
            );
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    let p = m.partition();
                    if let (Some(key), None) = (m.key(), m.payload()) {
                        // A released key's tombstone.
                        if let Some(r) = ordered::decode_tombstone(key) {
                            ordered_records.push(r);
                        }
                    }
                    if let (Some(key), Some(value)) = (m.key(), m.payload()) {
                        if ordered::is_ordered_key(key) {
                            match ordered::decode(key, value) {
                                Ok(r) => ordered_records.push(r),
                                Err(e) => {
                                    tracing::warn!(topic, p, offset = m.offset(), "ack log: {e}")
                                }
                            }
                        } else {
                            match decode_record(key, value) {
                                Ok(e) => events.push(e),
                                Err(e) => {
                                    tracing::warn!(topic, p, offset = m.offset(), "ack log: {e}")
                                }
                            }
                        }
                    }
                    if ends.get(&p).is_some_and(|&end| m.offset() + 1 >= end) {
                        ends.remove(&p);
                    }
                }
                Some(Err(e)) => return Err(e).context("reading the ack log"),
                None => {
                    // The last offsets may hold no record (compaction,
                    // control records): the position tells.
                    for e in consumer.position()?.elements() {
                        if let Offset::Offset(o) = e.offset() {
                            if ends.get(&e.partition()).is_some_and(|&end| o >= end) {
                                ends.remove(&e.partition());
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    })();
    let _ = consumer.unassign();
    result.map(|()| (events, ordered_records))
}

/// The timestamp of the first record at each (partition, offset), the
/// minimum over them; `None` when none came within `timeout`.
pub fn oldest_timestamp_ms(
    consumer: &BaseConsumer,
    topic: &str,
    starts: &[(i32, i64)],
    timeout: Duration,
) -> anyhow::Result<Option<i64>> {
    if starts.is_empty() {
        return Ok(None);
    }
    let mut tpl = TopicPartitionList::new();
    for &(p, o) in starts {
        tpl.add_partition_offset(topic, p, Offset::Offset(o))?;
    }
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + timeout;
    let mut waiting: Vec<i32> = starts.iter().map(|&(p, _)| p).collect();
    let mut oldest: Option<i64> = None;
    while !waiting.is_empty() && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) {
            if let Some(pos) = waiting.iter().position(|&p| p == m.partition()) {
                waiting.swap_remove(pos);
                if let Some(ts) = m.timestamp().to_millis() {
                    oldest = Some(oldest.map_or(ts, |o: i64| o.min(ts)));
                }
            }
        }
    }
    let _ = consumer.unassign();
    Ok(oldest)
}

/// A plain consumer for the hold topic: a key's first held copy may be at
/// any offset, and one that left retention is read from the log start.
pub fn hold_consumer(base: &ClientConfig) -> anyhow::Result<BaseConsumer> {
    let mut c = base.clone();
    c.set("auto.offset.reset", "earliest");
    plain_consumer(&c, "hold-reader")
}

/// The next hold copy of `key` in `topic`/`partition` from offset `from`
/// up to `last` (inclusive) whose primary offset (`ordered::held_from`) is
/// above `after` (a lower one was replayed already: a duplicate copy).
/// Returns it with its offset, or `None` and where the next read resumes
/// (after `last` when the scan got there, before it when `timeout` ran out
/// first).
#[allow(clippy::too_many_arguments)]
pub fn next_held(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    key: &[u8],
    from: i64,
    last: i64,
    after: i64,
    timeout: Duration,
) -> anyhow::Result<(Option<(i64, super::message::Buffered)>, i64)> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(from))?;
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + timeout;
    // Where the next read resumes: a long scan past other keys' copies
    // keeps its progress across calls.
    let mut next = from;
    let result = (|| loop {
        if Instant::now() >= deadline {
            anyhow::ensure!(
                next > from,
                "reading the hold {topic}/{partition} from {from} took over {timeout:?}"
            );
            return Ok((None, next));
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                if m.offset() > last {
                    return Ok((None, last + 1));
                }
                next = m.offset() + 1;
                if m.key() == Some(key) {
                    let b = super::message::Buffered::from_record(&m, false);
                    let origin = ordered::held_from(&b);
                    if origin > after {
                        return Ok((Some((m.offset(), b)), m.offset()));
                    }
                }
                if m.offset() >= last {
                    return Ok((None, last + 1));
                }
            }
            Some(Err(e)) => return Err(e).context("reading the hold"),
            None => {}
        }
    })();
    let _ = consumer.unassign();
    result
}
