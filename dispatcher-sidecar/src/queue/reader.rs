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
) -> anyhow::Result<Vec<(QueuePartition, LeaseEvent)>> {
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
    if ends.is_empty() {
        return Ok(events);
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
                    if let (Some(key), Some(value)) = (m.key(), m.payload()) {
                        match decode_record(key, value) {
                            Ok(e) => events.push(e),
                            Err(e) => tracing::warn!(topic, p, offset = m.offset(), "ack log: {e}"),
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
    result.map(|()| events)
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
