//! The share groups' dead-letter queue (KIP-1191, Kafka 4.4): a record a
//! member rejected, or that was delivered `share.delivery.count.limit`
//! times, is copied to the group's `errors.deadletterqueue.topic.name`,
//! as Kafka's `ShareGroupDLQStateManager` does:
//!
//! - the topic's name must not be empty or start with `__`, and must start
//!   with the broker's `errors.deadletterqueue.topic.name.prefix` (`dlq.`);
//!   an existing topic must have `errors.deadletterqueue.group.enable=true`;
//!   a missing one is created (default partitions and replication, that
//!   config set, CreateTime) when `errors.deadletterqueue.auto.create.topics.enable`
//!   is true, else nothing is written;
//! - each record goes to the partition of the same index modulo the DLQ
//!   topic's partition count, uncompressed, timestamped now, with the
//!   original key and value when `errors.deadletterqueue.copy.record.enable`
//!   (else none), and the headers `__dlq.errors.topic`, `.partition`,
//!   `.offset`, `.group`, `.delivery.count` and `.message`, all UTF-8 text;
//! - the write is acks=all, retried while the DLQ partition's leader moves,
//!   and best effort: the record's state (archived) never waits for it, and
//!   after the retries a batch is dropped, counted and logged.
//!
//! Invariant: the queue between the share-partition leaders and the sender
//! is bounded; a record that does not fit is dropped and counted, so a DLQ
//! that cannot be written never holds memory or delays acknowledgements.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use indexmap::IndexMap;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Record, RecordBatchDecoder, TimestampType};
use tokio::sync::mpsc;

use super::partition::Dead;
use crate::broker::{now_ms, Broker, NewTopic};
use crate::config::TopicConfigs;
use crate::partition::FetchLimit;
use crate::types::{Offset, TopicPartition};

/// Records waiting for the sender, at most.
const QUEUE: usize = 10_000;
/// Records written in one batch, at most.
const BATCH: usize = 500;
/// Attempts at one batch before it is dropped.
const ATTEMPTS: u32 = 6;
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
const ENABLE_KEY: &str = "errors.deadletterqueue.group.enable";

/// One dead record on its way to its group's DLQ topic.
#[derive(Clone, Debug)]
pub struct DlqRecord {
    pub group: String,
    pub dlq_topic: String,
    pub copy_record: bool,
    /// Where the record is.
    pub source: TopicPartition,
    pub dead: Dead,
}

pub struct ShareDlq {
    tx: mpsc::Sender<DlqRecord>,
    rx: Mutex<Option<mpsc::Receiver<DlqRecord>>>,
    peers: crate::net::PeerPool,
}

impl Default for ShareDlq {
    fn default() -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        ShareDlq {
            tx,
            rx: Mutex::new(Some(rx)),
            peers: crate::net::PeerPool::new(WRITE_TIMEOUT, Duration::from_secs(5)),
        }
    }
}

impl ShareDlq {
    /// Queues dead records for their DLQ topic.
    pub fn enqueue(&self, records: impl IntoIterator<Item = DlqRecord>) {
        for r in records {
            if self.tx.try_send(r).is_err() {
                metrics::counter!("kafka_share_dlq_records_dropped_total").increment(1);
                tracing::warn!("the share groups' DLQ queue is full; a dead record is not copied");
            }
        }
    }

    /// The sender: writes queued records until `stop` turns true.
    pub async fn run(broker: Arc<Broker>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let Some(mut rx) = broker.share_dlq.rx.lock().expect("poisoned").take() else {
            return;
        };
        loop {
            let first = tokio::select! {
                r = rx.recv() => r,
                _ = stop.changed() => return,
            };
            let Some(first) = first else { return };
            let mut batch = vec![first];
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            // One write per (group, DLQ topic): its settings are the group's.
            let mut by_topic: BTreeMap<(String, String), Vec<DlqRecord>> = BTreeMap::new();
            for r in batch {
                by_topic
                    .entry((r.group.clone(), r.dlq_topic.clone()))
                    .or_default()
                    .push(r);
            }
            for ((group, topic), records) in by_topic {
                let n = records.len() as u64;
                match broker
                    .share_dlq
                    .write(&broker, &group, &topic, records)
                    .await
                {
                    Ok(()) => metrics::counter!("kafka_share_dlq_records_total", "group" => group)
                        .increment(n),
                    Err(e) => {
                        tracing::warn!(group, topic, records = n, error = %e, "dead records not copied to the DLQ topic");
                        metrics::counter!("kafka_share_dlq_records_failed_total", "group" => group)
                            .increment(n);
                    }
                }
            }
        }
    }

    /// Writes one group's records to its DLQ topic, each to its partition.
    async fn write(
        &self,
        broker: &Broker,
        group: &str,
        topic: &str,
        records: Vec<DlqRecord>,
    ) -> Result<(), String> {
        let partitions = ensure_topic(broker, group, topic).await?;
        let mut by_partition: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
        let now = now_ms();
        for r in records {
            let (key, value) = if r.copy_record {
                original(broker, &r.source, r.dead.offset).unwrap_or((None, None))
            } else {
                (None, None)
            };
            let target = r.source.partition.rem_euclid(partitions);
            let out = by_partition.entry(target).or_default();
            out.push(record(&r, key, value, out.len() as i64, now));
        }
        for (partition, records) in by_partition {
            self.write_partition(broker, &TopicPartition::new(topic, partition), &records)
                .await?;
        }
        Ok(())
    }

    /// One batch to `tp`'s leader, acks=all, retried while it moves.
    async fn write_partition(
        &self,
        broker: &Broker,
        tp: &TopicPartition,
        records: &[Record],
    ) -> Result<(), String> {
        let mut backoff = BACKOFF_FIRST;
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            let leader = broker
                .metadata
                .image()
                .topics
                .get(&*tp.topic)
                .and_then(|t| t.partitions.get(tp.partition as usize))
                .map(|p| p.leader);
            let outcome = match leader {
                Some(l) if l == broker.node_id() => append_local(broker, tp, records).await,
                Some(l) if l.0 >= 0 => self.produce_remote(broker, l, tp, records).await,
                _ => Err(format!("{tp} has no leader")),
            };
            match outcome {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
        Err(format!("writing to {tp} failed {ATTEMPTS} times: {last}"))
    }

    async fn produce_remote(
        &self,
        broker: &Broker,
        leader: crate::types::NodeId,
        tp: &TopicPartition,
        records: &[Record],
    ) -> Result<(), String> {
        let bytes = encode(records)?;
        let req = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(WRITE_TIMEOUT.as_millis() as i32)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(tp.topic.to_string())))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(tp.partition)
                    .with_records(Some(bytes))])]);
        let resp: ProduceResponse = self
            .peers
            .call(broker, leader, "share-dlq", ApiKey::Produce, 9, &req)
            .await
            .map_err(|e| e.to_string())?;
        let code = resp
            .responses
            .first()
            .and_then(|t| t.partition_responses.first())
            .map_or(-1, |p| p.error_code);
        if code == 0 {
            Ok(())
        } else {
            Err(format!("{tp}: produce error {code}"))
        }
    }
}

/// The DLQ topic's partition count, once it is fit to be one (created if
/// allowed), or why not, in Kafka's words.
async fn ensure_topic(broker: &Broker, group: &str, topic: &str) -> Result<i32, String> {
    let prefix = &broker.config.share.dlq_topic_prefix;
    if topic.is_empty() {
        return Err(format!(
            "Configured DLQ topic name in share group: {group} is empty."
        ));
    }
    if topic.starts_with("__") {
        return Err(format!(
            "Configured DLQ topic name in share group: {group} cannot start with __, topic: {topic}."
        ));
    }
    if !topic.starts_with(prefix.as_str()) {
        return Err(format!("Configured DLQ topic name does not comply with the DLQ topic prefix in share group: {group}, topic: {topic}, prefix: {prefix}."));
    }
    let existing = broker.metadata.image().topics.get(topic).map(|t| {
        // Kafka reads booleans without regard to case.
        let enabled = TopicConfigs::resolve(&broker.config, &t.configs)
            .get(ENABLE_KEY)
            .trim()
            .eq_ignore_ascii_case("true");
        (enabled, t.partitions.len() as i32)
    });
    match existing {
        Some((true, partitions)) => Ok(partitions),
        Some((false, _)) => Err(format!(
            "DLQ is not enabled on configured DLQ topic for share group: {group}, topic: {topic}."
        )),
        None if !broker.config.share.dlq_auto_create => Err(format!(
            "DLQ topic does not exist and auto create is disabled on cluster for share group: {group}, topic: {topic}."
        )),
        None => {
            let configs = [
                (ENABLE_KEY.to_string(), "true".to_string()),
                (
                    "message.timestamp.type".to_string(),
                    "CreateTime".to_string(),
                ),
            ]
            .into_iter()
            .collect();
            let created = broker
                .create_topic(
                    NewTopic {
                        name: topic.to_string(),
                        num_partitions: -1,
                        replication_factor: -1,
                        assignments: Vec::new(),
                        configs,
                    },
                    false,
                )
                .await;
            match created {
                Ok((_, partitions)) => Ok(partitions.len() as i32),
                // Created meanwhile (another leader's DLQ write): check it.
                Err(crate::broker::CreateTopicError::TopicAlreadyExists(_)) => {
                    Err(format!("DLQ topic {topic} was created meanwhile; retrying"))
                }
                Err(e) => Err(format!("Unable to create DLQ topic {topic}: {e}")),
            }
        }
    }
}

/// The DLQ record of `r`, at `offset` in its batch.
fn record(
    r: &DlqRecord,
    key: Option<Bytes>,
    value: Option<Bytes>,
    offset: i64,
    now: i64,
) -> Record {
    let text = |s: String| Some(Bytes::from(s));
    let mut headers: IndexMap<StrBytes, Option<Bytes>> = IndexMap::new();
    headers.insert(
        StrBytes::from_static_str("__dlq.errors.topic"),
        text(r.source.topic.to_string()),
    );
    headers.insert(
        StrBytes::from_static_str("__dlq.errors.partition"),
        text(r.source.partition.to_string()),
    );
    headers.insert(
        StrBytes::from_static_str("__dlq.errors.offset"),
        text(r.dead.offset.to_string()),
    );
    headers.insert(
        StrBytes::from_static_str("__dlq.errors.group"),
        text(r.group.clone()),
    );
    headers.insert(
        StrBytes::from_static_str("__dlq.errors.delivery.count"),
        text(r.dead.delivery_count.to_string()),
    );
    headers.insert(
        StrBytes::from_static_str("__dlq.errors.message"),
        text(r.dead.reason.message().to_string()),
    );
    Record {
        transactional: false,
        control: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset,
        // kafka-protocol keeps records in one batch while offset - sequence
        // is constant.
        sequence: offset as i32 - 1,
        timestamp: now,
        key,
        value,
        headers,
        delete_horizon: false,
    }
}

fn encode(records: &[Record]) -> Result<Bytes, String> {
    use kafka_protocol::records::{Compression, RecordBatchEncoder, RecordEncodeOptions};
    let mut buf = bytes::BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| format!("encoding a DLQ batch: {e}"))?;
    Ok(buf.freeze())
}

/// Appends to a DLQ partition this node leads, and waits for its ISR.
async fn append_local(
    broker: &Broker,
    tp: &TopicPartition,
    records: &[Record],
) -> Result<(), String> {
    let part = broker
        .replicas
        .get(tp)
        .ok_or_else(|| format!("{tp} is not on this node"))?;
    let appended = {
        let replicas = broker.replicas.clone();
        let records = records.to_vec();
        tokio::task::spawn_blocking(move || {
            crate::replica_manager::append_internal(&replicas, part, &records, now_ms())
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?
    };
    let mut events = appended.events;
    crate::replica_manager::wait_for_ack(
        &appended.part,
        appended.required,
        &mut events,
        tokio::time::Instant::now() + WRITE_TIMEOUT,
    )
    .await
    .map_err(|e| e.to_string())
}

/// The key and value of the record at `offset` of the local partition `tp`
/// (`None` when it cannot be read: the DLQ record then has headers only,
/// as in Kafka).
fn original(
    broker: &Broker,
    tp: &TopicPartition,
    offset: i64,
) -> Option<(Option<Bytes>, Option<Bytes>)> {
    let part = broker.replicas.get(tp)?;
    let read = part
        .lock()
        .expect("partition poisoned")
        .read_up_to(Offset(offset), 1, true, FetchLimit::LogEnd)
        .ok()?;
    let mut bytes = read.records;
    let sets = RecordBatchDecoder::decode_all(&mut bytes).ok()?;
    sets.into_iter()
        .flat_map(|s| s.records)
        .find(|r| r.offset == offset)
        .map(|r| (r.key, r.value))
}
