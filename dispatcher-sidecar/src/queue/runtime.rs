//! One queue's runtime: the partitions this instance owns (primary and retry
//! tiers), their fetch tasks, and the operations of the service on them.
//!
//! Locking: one mutex per owned partition, held only for the engine's pure
//! work and for handing records to librdkafka's local queue (which keeps
//! their order); never across a Kafka round trip. Requests then await the
//! delivery reports of their own records.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::config::{format_duration, QueueConfig};
use crate::kafka::consumer::{FetchError, QueueConsumer};
use crate::lease::{
    FailureCause, LeaseConfig, LeaseError, LeaseEvent, PartitionLeases, QueuePartition, Receipt,
    ReceiptCodec, Route,
};
use crate::service::{
    Delivery, ExtendResult, NackRequest, NewMessage, PartitionStats, ProduceResult, ProduceStatus,
    QueueStats, ReceiptOutcome, ReceiveRequest, ServiceError, MAX_CONSUMER_ID_BYTES,
    MAX_RECEIVE_MESSAGES, MAX_RECEIVE_WAIT,
};

use super::dedupe::Dedupe;
use super::message::{
    tier_for_delay, validate_produce, Buffered, ConsumerNames, MESSAGE_ID_HEADER,
};
use super::partition::{acked_above_commit, PartitionState};
use super::reader;

/// How long a Kafka metadata, commit or ack-log read may take.
pub(crate) const KAFKA_TIMEOUT: Duration = Duration::from_secs(30);
/// Records fetched from one partition at a time.
const FETCH_BATCH: usize = 500;
/// At most this many receipts in one ack.
pub const MAX_ACK_RECEIPTS: usize = 1000;
/// Distinct consumer names kept per queue; later ones are anonymous.
const MAX_CONSUMER_NAMES: usize = 10_000;
/// Message ids kept for produce dedupe per queue.
const MAX_DEDUPE_ENTRIES: usize = 1_000_000;
/// The DLQ's depth and oldest record are asked at most this often.
const STATS_TTL: Duration = Duration::from_secs(1);
/// How long one watermark or DLQ read for stats may take.
const STATS_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn unavailable(e: impl std::fmt::Display) -> ServiceError {
    ServiceError::Unavailable(e.to_string())
}

/// One owned partition of one of the queue's topics.
pub(crate) struct Partition {
    pub qp: QueuePartition,
    pub state: Mutex<PartitionState>,
    /// Woken when leasing or acking made room under the prefetch bound.
    space: Notify,
    /// Revoked or shut down: its fetch task stops.
    closed: AtomicBool,
    /// The offset last committed to the group.
    last_commit: AtomicI64,
    /// Moves fetched records into `state`; stopped by `close`.
    fetch_task: Mutex<Option<JoinHandle<()>>>,
}

/// Ack-log records handed to librdkafka, whose delivery reports are awaited
/// outside the partition lock.
#[must_use]
#[derive(Default)]
struct Pending {
    futures: Vec<DeliveryFuture>,
    error: Option<String>,
}

impl Pending {
    fn merge(&mut self, other: Pending) {
        self.futures.extend(other.futures);
        if self.error.is_none() {
            self.error = other.error;
        }
    }

    async fn wait(self) -> Result<(), String> {
        let mut error = self.error;
        for f in self.futures {
            let outcome = match f.await {
                Ok(Ok(_)) => continue,
                Ok(Err((e, _))) => e.to_string(),
                Err(_) => "the producer went away".to_string(),
            };
            error.get_or_insert(outcome);
        }
        error.map_or(Ok(()), Err)
    }
}

/// The receipts of one request that name one partition, with their index.
type ReceiptsOf = (Arc<Partition>, Vec<(usize, Receipt)>);

/// The DLQ's depth and the timestamp of its oldest record.
type DlqFigures = (i64, Option<i64>);

/// Blocking readers outside the group (see `reader`).
struct Readers {
    ack_log: Mutex<BaseConsumer>,
    meta: Mutex<BaseConsumer>,
    dlq: Mutex<BaseConsumer>,
}

/// What the Kafka side says about the owned partitions and the DLQ.
#[derive(Clone, Debug, Default)]
struct Measure {
    /// (log start, log end) of each owned partition.
    watermarks: HashMap<QueuePartition, (i64, i64)>,
    dlq_depth: i64,
    dlq_oldest_ms: Option<i64>,
}

pub(crate) struct QueueRuntime {
    pub config: QueueConfig,
    lease_config: LeaseConfig,
    codec: ReceiptCodec,
    /// Index = `QueuePartition::topic`: 0 the primary, n the tier n-1.
    topics: Vec<String>,
    /// Partition count of each topic of `topics`.
    topic_partitions: Vec<i32>,
    dlq_partitions: i32,
    ack_log_partitions: i32,
    producer: FutureProducer,
    consumers: RwLock<Vec<Arc<QueueConsumer>>>,
    partitions: RwLock<HashMap<QueuePartition, Arc<Partition>>>,
    /// Woken when records become leasable (fetched, or a partition assigned).
    ready: Notify,
    rr: AtomicUsize,
    names: Mutex<ConsumerNames>,
    dedupe: Mutex<Dedupe>,
    readers: Arc<Readers>,
    /// The DLQ's figures and when they were asked.
    dlq_cache: tokio::sync::Mutex<Option<(Instant, DlqFigures)>>,
    /// Metric labels of each topic's partitions.
    partition_labels: Vec<String>,
    /// Serializes assignment changes: the group's events and `repair`.
    assigning: tokio::sync::Mutex<()>,
    /// Assigned partitions not served at the previous `repair`.
    unserved: Mutex<BTreeSet<QueuePartition>>,
    /// Revoked partitions kept for a moment: a rebalance usually hands most
    /// partitions straight back, and one nobody touched meanwhile resumes
    /// with its leases (no redelivery).
    parked: Mutex<HashMap<QueuePartition, Parked>>,
}

/// A revoked partition's state and what proves nobody changed it since.
struct Parked {
    part: Arc<Partition>,
    /// The ack-log partition's end offset after our last write.
    ack_log_end: i64,
    /// The offset we committed to the group at the revoke.
    committed: i64,
    at: Instant,
}

/// How long a revoked partition's state is kept for a reassignment.
const PARKED_TTL: Duration = Duration::from_secs(60);

impl QueueRuntime {
    /// Every topic of the queue has partitions served here (after its
    /// rebuild). Once true for all topics after start, the group has settled
    /// on a generation with all of this instance's consumers in it.
    pub(crate) fn every_topic_served(&self) -> bool {
        let parts = self.partitions.read().unwrap();
        (0..self.topics.len()).all(|t| parts.keys().any(|qp| usize::from(qp.topic) == t))
    }
}

pub(crate) struct RuntimeParts {
    pub config: QueueConfig,
    pub codec: ReceiptCodec,
    pub topic_partitions: Vec<i32>,
    pub dlq_partitions: i32,
    pub ack_log_partitions: i32,
    pub producer: FutureProducer,
    pub consumers: Vec<Arc<QueueConsumer>>,
    pub reader_config: rdkafka::config::ClientConfig,
}

impl QueueRuntime {
    pub(crate) fn new(parts: RuntimeParts) -> anyhow::Result<QueueRuntime> {
        let config = parts.config;
        let lease_config = LeaseConfig {
            lease_ms: ms(config.lease),
            max_total_lease_ms: ms(config.max_lease),
            retry_tiers_ms: config.retry_tiers.iter().map(|&t| ms(t)).collect(),
            max_attempts: u16::try_from(config.max_attempts).unwrap_or(u16::MAX),
            gap_cap: u32::try_from(config.gap_cap).unwrap_or(u32::MAX),
        };
        lease_config.validate()?;
        let mut topics = vec![config.topic.clone()];
        topics.extend(config.retry_topics());
        let mut partition_labels = vec![String::new()];
        partition_labels.extend(
            config
                .retry_tiers
                .iter()
                .map(|&t| format!("tier:{}/", format_duration(t))),
        );
        let readers = Arc::new(Readers {
            ack_log: Mutex::new(reader::plain_consumer(
                &parts.reader_config,
                "acklog-reader",
            )?),
            meta: Mutex::new(reader::plain_consumer(&parts.reader_config, "stats")?),
            dlq: Mutex::new(reader::plain_consumer(&parts.reader_config, "dlq-reader")?),
        });
        Ok(QueueRuntime {
            dedupe: Mutex::new(Dedupe::new(ms(config.dedupe_window), MAX_DEDUPE_ENTRIES)),
            config,
            lease_config,
            codec: parts.codec,
            topics,
            topic_partitions: parts.topic_partitions,
            dlq_partitions: parts.dlq_partitions.max(1),
            ack_log_partitions: parts.ack_log_partitions.max(1),
            producer: parts.producer,
            consumers: RwLock::new(parts.consumers),
            partitions: RwLock::new(HashMap::new()),
            ready: Notify::new(),
            rr: AtomicUsize::new(0),
            names: Mutex::new(ConsumerNames::new(MAX_CONSUMER_NAMES)),
            readers,
            dlq_cache: tokio::sync::Mutex::new(None),
            partition_labels,
            assigning: tokio::sync::Mutex::new(()),
            unserved: Mutex::new(BTreeSet::new()),
            parked: Mutex::new(HashMap::new()),
        })
    }

    fn name(&self) -> String {
        self.config.name.clone()
    }

    fn consumer(&self, topic: u16) -> Option<Arc<QueueConsumer>> {
        self.consumers
            .read()
            .unwrap()
            .get(usize::from(topic))
            .cloned()
    }

    fn label(&self, qp: QueuePartition) -> String {
        format!(
            "{}{}",
            self.partition_labels[usize::from(qp.topic)],
            qp.partition
        )
    }

    pub(crate) fn owned(&self) -> Vec<Arc<Partition>> {
        let mut v: Vec<Arc<Partition>> =
            self.partitions.read().unwrap().values().cloned().collect();
        v.sort_by_key(|p| p.qp);
        v
    }

    fn partition(&self, qp: QueuePartition) -> Option<Arc<Partition>> {
        self.partitions.read().unwrap().get(&qp).cloned()
    }

    /// Hands the partition's drained engine events to the producer, in order.
    fn write_events(&self, state: &mut PartitionState) -> Pending {
        let mut pending = Pending::default();
        let events = state.engine.drain_events();
        let partition = state.engine.partition().partition % self.ack_log_partitions;
        for event in &events {
            let r = state.engine.encode(event);
            let record = FutureRecord::to(&self.config.ack_log_topic)
                .partition(partition)
                .key(&r.key[..])
                .payload(&r.value[..]);
            match self.producer.send_result(record) {
                Ok(f) => pending.futures.push(f),
                Err((e, _)) => {
                    pending.error.get_or_insert(e.to_string());
                }
            }
        }
        pending
    }

    // ---- assignment ------------------------------------------------------

    /// Restores the newly assigned partitions of topic `t` from the ack log
    /// and the group's commits, then starts fetching them.
    pub(crate) async fn assign(self: &Arc<Self>, t: u16, partitions: Vec<i32>) {
        let _serial = self.assigning.lock().await;
        for attempt in 1..=2 {
            match self.try_assign(t, &partitions).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(queue = %self.config.name, topic = %self.topics[usize::from(t)],
                        ?partitions, attempt, "rebuilding assigned partitions failed: {e:#}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        tracing::error!(queue = %self.config.name, ?partitions,
            "assigned partitions not served yet: the periodic repair tries again");
    }

    /// Rebuilds partitions the group assigned that are still not served
    /// (their rebuild failed) on two passes in a row (one pass may just
    /// precede the assignment event).
    async fn repair(self: &Arc<Self>) {
        let Ok(_serial) = self.assigning.try_lock() else {
            return;
        };
        let served: Vec<QueuePartition> = self.owned().iter().map(|p| p.qp).collect();
        let mut missing = BTreeSet::new();
        for t in 0..self.topics.len() {
            let t = u16::try_from(t).expect("validated at start");
            let Some(consumer) = self.consumer(t) else {
                continue;
            };
            for partition in consumer.assigned() {
                let qp = QueuePartition {
                    topic: t,
                    partition,
                };
                if !served.contains(&qp) {
                    missing.insert(qp);
                }
            }
        }
        let previous = std::mem::replace(&mut *self.unserved.lock().unwrap(), missing.clone());
        let mut again: BTreeMap<u16, Vec<i32>> = BTreeMap::new();
        for qp in missing.intersection(&previous) {
            again.entry(qp.topic).or_default().push(qp.partition);
        }
        for (t, partitions) in again {
            tracing::info!(queue = %self.config.name, topic = t, ?partitions, "repairing unserved partitions");
            if let Err(e) = self.try_assign(t, &partitions).await {
                tracing::warn!(queue = %self.config.name, topic = t, ?partitions, "repair failed: {e:#}");
            }
        }
    }

    async fn try_assign(self: &Arc<Self>, t: u16, partitions: &[i32]) -> anyhow::Result<()> {
        let consumer = self
            .consumer(t)
            .ok_or_else(|| anyhow::anyhow!("consumer closed"))?;
        let committed: HashMap<i32, Option<i64>> = consumer
            .committed(partitions, KAFKA_TIMEOUT)
            .await?
            .into_iter()
            .collect();
        let resumed = self.unpark(t, partitions, &committed).await;
        let resumed_partitions: Vec<i32> = resumed.iter().map(|p| p.qp.partition).collect();
        for part in resumed {
            tracing::info!(queue = %self.config.name, partition = %part.qp,
                "partition resumed as it was at its revoke");
            part.closed.store(false, Ordering::SeqCst);
            self.serve(part, &consumer).await;
        }
        let partitions: Vec<i32> = partitions
            .iter()
            .copied()
            .filter(|p| !resumed_partitions.contains(p))
            .collect();
        let partitions = &partitions[..];
        if partitions.is_empty() {
            self.ready.notify_waiters();
            return Ok(());
        }
        let readers = Arc::clone(&self.readers);
        let ack_topic = self.config.ack_log_topic.clone();
        let topic = self.topics[usize::from(t)].clone();
        let ack_parts: Vec<i32> = partitions
            .iter()
            .map(|p| p % self.ack_log_partitions)
            .collect();
        let need_low: Vec<i32> = partitions
            .iter()
            .copied()
            .filter(|p| committed.get(p).copied().flatten().is_none())
            .collect();
        let started = Instant::now();
        let (events, lows) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let events = reader::read_ack_log(
                &readers.ack_log.lock().unwrap(),
                &ack_topic,
                &ack_parts,
                KAFKA_TIMEOUT * 2,
            )?;
            let meta = readers.meta.lock().unwrap();
            let mut lows = HashMap::new();
            for p in need_low {
                lows.insert(p, meta.fetch_watermarks(&topic, p, KAFKA_TIMEOUT)?.0);
            }
            Ok((events, lows))
        })
        .await??;
        let mut by_partition: HashMap<i32, Vec<LeaseEvent>> = HashMap::new();
        for (qp, event) in events {
            if qp.topic == t && partitions.contains(&qp.partition) {
                by_partition.entry(qp.partition).or_default().push(event);
            }
        }
        for &p in partitions {
            let qp = QueuePartition {
                topic: t,
                partition: p,
            };
            let base = committed
                .get(&p)
                .copied()
                .flatten()
                .or_else(|| lows.get(&p).copied())
                .unwrap_or(0);
            let events = by_partition.remove(&p).unwrap_or_default();
            let event_count = events.len();
            let mut acked = acked_above_commit(&events, base);
            let rebuilt = PartitionLeases::rebuild(qp, self.lease_config.clone(), base, events)?;
            let acked = acked.split_off(&rebuilt.leases.committed_offset());
            tracing::info!(queue = %self.config.name, partition = %qp, group_committed = base,
                committed = rebuilt.leases.committed_offset(), released = rebuilt.expired.len(),
                pending_routes = rebuilt.pending_routes.len(), event_count,
                elapsed_ms = started.elapsed().as_millis() as u64, "partition rebuilt");
            let state = PartitionState::rebuilt(rebuilt, acked);
            let partition = Arc::new(Partition {
                qp,
                last_commit: AtomicI64::new(base),
                state: Mutex::new(state),
                space: Notify::new(),
                closed: AtomicBool::new(false),
                fetch_task: Mutex::new(None),
            });
            self.serve(partition, &consumer).await;
        }
        self.ready.notify_waiters();
        Ok(())
    }

    /// Makes `partition` owned and starts its fetch task.
    async fn serve(self: &Arc<Self>, partition: Arc<Partition>, consumer: &Arc<QueueConsumer>) {
        let old = self
            .partitions
            .write()
            .unwrap()
            .insert(partition.qp, Arc::clone(&partition));
        if let Some(old) = old {
            old.close().await;
        }
        let this = Arc::clone(self);
        let consumer = Arc::clone(consumer);
        let part = Arc::clone(&partition);
        let task = tokio::spawn(async move { this.fetch_loop(part, consumer).await });
        *partition.fetch_task.lock().unwrap() = Some(task);
    }

    /// Commits the final offsets of revoked partitions and forgets them.
    pub(crate) async fn revoke(&self, t: u16, partitions: &[i32]) {
        let _serial = self.assigning.lock().await;
        let mut gone = Vec::new();
        {
            let mut map = self.partitions.write().unwrap();
            for &p in partitions {
                if let Some(part) = map.remove(&QueuePartition {
                    topic: t,
                    partition: p,
                }) {
                    gone.push(part);
                }
            }
        }
        // Before the release: a fetch task still running when the group
        // hands the partition back would take records of the new assignment.
        for part in &gone {
            part.close().await;
        }
        // Writes of requests still running land before the next owner reads
        // the ack log.
        let producer = self.producer.clone();
        let _ = tokio::task::spawn_blocking(move || {
            rdkafka::producer::Producer::flush(&producer, Duration::from_secs(5))
        })
        .await;
        self.commit(&gone, true).await;
        for part in &gone {
            metrics::gauge!("dispatcher_in_flight", "queue" => self.name(), "partition" => self.label(part.qp)).set(0.0);
        }
        self.park(gone).await;
    }

    /// Keeps revoked partitions whose final commit is stored, with the
    /// ack-log end that proves later that nobody wrote since.
    async fn park(&self, gone: Vec<Arc<Partition>>) {
        let committed: Vec<(Arc<Partition>, i64)> = gone
            .into_iter()
            .filter_map(|part| {
                let committed = part.state.lock().unwrap().engine.committed_offset();
                (part.last_commit.load(Ordering::SeqCst) == committed).then_some((part, committed))
            })
            .collect();
        if committed.is_empty() {
            return;
        }
        let ends = self
            .ack_log_ends(committed.iter().map(|(p, _)| p.qp.partition).collect())
            .await;
        let Ok(ends) = ends else { return };
        let mut parked = self.parked.lock().unwrap();
        for (part, committed) in committed {
            let end = ends[&(part.qp.partition % self.ack_log_partitions)];
            parked.insert(
                part.qp,
                Parked {
                    part,
                    ack_log_end: end,
                    committed,
                    at: Instant::now(),
                },
            );
        }
    }

    /// The end offsets of the ack-log partitions of `partitions`.
    async fn ack_log_ends(&self, partitions: Vec<i32>) -> anyhow::Result<HashMap<i32, i64>> {
        let readers = Arc::clone(&self.readers);
        let topic = self.config.ack_log_topic.clone();
        let n = self.ack_log_partitions;
        tokio::task::spawn_blocking(move || {
            let meta = readers.meta.lock().unwrap();
            let mut ends = HashMap::new();
            for p in partitions {
                let a = p % n;
                if let std::collections::hash_map::Entry::Vacant(e) = ends.entry(a) {
                    e.insert(meta.fetch_watermarks(&topic, a, STATS_TIMEOUT)?.1);
                }
            }
            Ok(ends)
        })
        .await?
    }

    /// Parked states of `partitions` that nobody changed since their revoke
    /// (same group commit, no ack-log write): they resume as they were.
    async fn unpark(
        &self,
        t: u16,
        partitions: &[i32],
        committed: &HashMap<i32, Option<i64>>,
    ) -> Vec<Arc<Partition>> {
        let candidates: Vec<Parked> = {
            let mut parked = self.parked.lock().unwrap();
            parked.retain(|_, p| p.at.elapsed() < PARKED_TTL);
            partitions
                .iter()
                .filter_map(|&partition| {
                    parked.remove(&QueuePartition {
                        topic: t,
                        partition,
                    })
                })
                .filter(|p| {
                    committed.get(&p.part.qp.partition).copied().flatten() == Some(p.committed)
                })
                .collect()
        };
        if candidates.is_empty() {
            return Vec::new();
        }
        let Ok(ends) = self
            .ack_log_ends(candidates.iter().map(|p| p.part.qp.partition).collect())
            .await
        else {
            return Vec::new();
        };
        candidates
            .into_iter()
            .filter(|p| {
                ends.get(&(p.part.qp.partition % self.ack_log_partitions)) == Some(&p.ack_log_end)
            })
            .map(|p| p.part)
            .collect()
    }

    /// Commits each partition's commit point to the group when it moved
    /// (`force`: always).
    async fn commit(&self, parts: &[Arc<Partition>], force: bool) {
        let mut by_topic: BTreeMap<u16, Vec<(Arc<Partition>, i64)>> = BTreeMap::new();
        for part in parts {
            let committed = part.state.lock().unwrap().engine.committed_offset();
            if force || committed != part.last_commit.load(Ordering::SeqCst) {
                by_topic
                    .entry(part.qp.topic)
                    .or_default()
                    .push((Arc::clone(part), committed));
            }
        }
        for (t, list) in by_topic {
            let Some(consumer) = self.consumer(t) else {
                continue;
            };
            let offsets: Vec<(i32, i64)> = list.iter().map(|(p, o)| (p.qp.partition, *o)).collect();
            match consumer.commit(&offsets).await {
                Ok(()) => {
                    for (p, o) in list {
                        p.last_commit.store(o, Ordering::SeqCst);
                    }
                }
                Err(e) => {
                    tracing::warn!(queue = %self.config.name, topic = %self.topics[usize::from(t)],
                    ?offsets, "commit failed: {e}")
                }
            }
        }
    }

    /// Closes every owned partition after committing its commit point.
    pub(crate) async fn stop(&self) {
        let parts: Vec<Arc<Partition>> = self
            .partitions
            .write()
            .unwrap()
            .drain()
            .map(|(_, p)| p)
            .collect();
        for p in &parts {
            p.close().await;
        }
        self.commit(&parts, true).await;
    }

    pub(crate) fn take_consumers(&self) -> Vec<Arc<QueueConsumer>> {
        std::mem::take(&mut *self.consumers.write().unwrap())
    }

    /// Moves fetched records into the partition's buffer, up to the
    /// prefetch bound, until the partition is closed or revoked.
    async fn fetch_loop(self: Arc<Self>, part: Arc<Partition>, consumer: Arc<QueueConsumer>) {
        let is_tier = part.qp.topic > 0;
        while !part.closed.load(Ordering::SeqCst) {
            let room = {
                let space = part.space.notified();
                tokio::pin!(space);
                space.as_mut().enable();
                let room = part.state.lock().unwrap().prefetch_room();
                if room == 0 {
                    let _ = tokio::time::timeout(Duration::from_millis(500), space).await;
                    continue;
                }
                room
            };
            let batch = match consumer
                .fetch(
                    part.qp.partition,
                    room.min(FETCH_BATCH),
                    Duration::from_millis(500),
                )
                .await
            {
                Ok(batch) => batch,
                Err(FetchError::NotAssigned(_)) => return,
                Err(e) => {
                    tracing::warn!(queue = %self.config.name, partition = %part.qp, "fetch: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            if batch.is_empty() {
                continue;
            }
            tracing::debug!(queue = %self.config.name, partition = %part.qp, n = batch.len(),
                first = rdkafka::Message::offset(&batch[0]), "fetched");
            let parsed: Vec<(i64, Buffered)> = batch
                .iter()
                .map(|m| {
                    (
                        rdkafka::Message::offset(m),
                        Buffered::from_record(m, is_tier),
                    )
                })
                .collect();
            let (pending, routable) = {
                let mut state = part.state.lock().unwrap();
                if part.closed.load(Ordering::SeqCst) {
                    return;
                }
                for (offset, m) in parsed {
                    state.offer(offset, m);
                }
                (self.write_events(&mut state), state.has_routable())
            };
            self.ready.notify_waiters();
            if let Err(e) = pending.wait().await {
                tracing::warn!(queue = %self.config.name, partition = %part.qp, "ack-log write: {e}");
            }
            if routable {
                self.route(&part).await;
            }
        }
    }

    // ---- receive ---------------------------------------------------------

    pub(crate) async fn receive(
        &self,
        request: ReceiveRequest,
    ) -> Result<Vec<Delivery>, ServiceError> {
        if request.max_messages == 0 || request.max_messages > MAX_RECEIVE_MESSAGES {
            return Err(ServiceError::InvalidArgument(format!(
                "max_messages must be 1 to {MAX_RECEIVE_MESSAGES}"
            )));
        }
        if request.wait > MAX_RECEIVE_WAIT {
            return Err(ServiceError::InvalidArgument(format!(
                "wait_seconds must be at most {}",
                MAX_RECEIVE_WAIT.as_secs()
            )));
        }
        if request
            .consumer
            .as_ref()
            .is_some_and(|c| c.len() > MAX_CONSUMER_ID_BYTES)
        {
            return Err(ServiceError::InvalidArgument(format!(
                "consumer must be at most {MAX_CONSUMER_ID_BYTES} bytes"
            )));
        }
        let lease_ms = ms(request
            .lease
            .unwrap_or(self.config.lease)
            .min(self.config.max_lease))
        .max(1);
        let slot = self.names.lock().unwrap().slot(request.consumer.as_deref());
        let max = request.max_messages as usize;
        let deadline = tokio::time::Instant::now() + request.wait;
        loop {
            let notified = self.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (deliveries, pending, next_due_ms) = self.try_lease(max, slot, lease_ms);
            if !deliveries.is_empty() {
                pending
                    .wait()
                    .await
                    .map_err(|e| unavailable(format!("ack log: {e}")))?;
                self.count_deliveries(&deliveries);
                return Ok(deliveries.into_iter().map(|(d, _)| d).collect());
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            let wake = next_due_ms
                .map(|due| now + Duration::from_millis(u64::try_from(due - now_ms()).unwrap_or(0)))
                .map_or(deadline, |t| t.min(deadline));
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    fn count_deliveries(&self, deliveries: &[(Delivery, bool)]) {
        let name = self.name();
        metrics::counter!("dispatcher_receives_total", "queue" => name.clone())
            .increment(deliveries.len() as u64);
        let redelivered = deliveries
            .iter()
            .filter(|(d, crashed)| d.attempt > 1 || *crashed)
            .count();
        if redelivered > 0 {
            metrics::counter!("dispatcher_redeliveries_total", "queue" => name.clone())
                .increment(redelivered as u64);
        }
        let h = metrics::histogram!("dispatcher_delivery_attempts", "queue" => name);
        for (d, _) in deliveries {
            h.record(f64::from(d.attempt));
        }
    }

    /// One pass over the owned partitions (from a rotating start, so no
    /// partition starves): leases up to `max` records. Returns the
    /// deliveries (with whether each re-delivers a crashed lease), their
    /// ack-log writes, and the earliest due time of a waiting tier record.
    fn try_lease(
        &self,
        max: usize,
        slot: crate::lease::ConsumerSlot,
        lease_ms: i64,
    ) -> (Vec<(Delivery, bool)>, Pending, Option<i64>) {
        let parts = self.owned();
        let mut deliveries = Vec::new();
        let mut pending = Pending::default();
        let mut next_due: Option<i64> = None;
        if parts.is_empty() {
            return (deliveries, pending, None);
        }
        let start = self.rr.fetch_add(1, Ordering::Relaxed) % parts.len();
        let now = now_ms();
        for i in 0..parts.len() {
            if deliveries.len() >= max {
                break;
            }
            let part = &parts[(start + i) % parts.len()];
            let mut state = part.state.lock().unwrap();
            let grants = state.lease(max - deliveries.len(), slot, lease_ms, now);
            let leased = !grants.is_empty();
            for (grant, m, crashed) in grants {
                let (partition, offset) = match m.origin(part.qp.partition, grant.receipt.offset) {
                    (_, o) if o < 0 => (part.qp.partition, grant.receipt.offset),
                    origin => origin,
                };
                deliveries.push((
                    Delivery {
                        message_id: m.message_id.clone(),
                        receipt: self.codec.encode(&grant.receipt),
                        key: m.key.clone(),
                        payload: m.payload.clone(),
                        headers: m.user_headers(),
                        attempt: u32::from(grant.attempt.0),
                        enqueued_at_ms: m.enqueued_at_ms(),
                        partition,
                        offset,
                        lease_expires_at_ms: grant.expiry_ms,
                    },
                    crashed,
                ));
            }
            if leased {
                pending.merge(self.write_events(&mut state));
                part.space.notify_one();
            }
            if let Some(due) = state.next_due_ms(now) {
                next_due = Some(next_due.map_or(due, |d: i64| d.min(due)));
            }
        }
        (deliveries, pending, next_due)
    }

    // ---- ack, nack, extend -----------------------------------------------

    /// Decodes a receipt and finds its partition: the outcome when it is
    /// not ours to apply.
    fn resolve(&self, text: &str) -> Result<(Receipt, Arc<Partition>), ReceiptOutcome> {
        let receipt = match self.codec.decode(text) {
            Ok(r) => r,
            Err(_) => {
                metrics::counter!("dispatcher_invalid_receipts_total", "queue" => self.name())
                    .increment(1);
                return Err(ReceiptOutcome::Invalid);
            }
        };
        match self.partition(receipt.partition) {
            Some(p) => Ok((receipt, p)),
            None => Err(ReceiptOutcome::NotOwner),
        }
    }

    fn stale(&self, e: &LeaseError) -> ReceiptOutcome {
        if matches!(
            e,
            LeaseError::StaleReceipt { .. } | LeaseError::StaleGeneration { .. }
        ) {
            metrics::counter!("dispatcher_stale_receipts_total", "queue" => self.name())
                .increment(1);
            ReceiptOutcome::Stale
        } else {
            ReceiptOutcome::NotOwner
        }
    }

    pub(crate) async fn ack(
        &self,
        receipts: Vec<String>,
    ) -> Result<Vec<ReceiptOutcome>, ServiceError> {
        if receipts.len() > MAX_ACK_RECEIPTS {
            return Err(ServiceError::InvalidArgument(format!(
                "at most {MAX_ACK_RECEIPTS} receipts in one ack"
            )));
        }
        let mut outcomes = vec![ReceiptOutcome::Invalid; receipts.len()];
        let mut by_partition: BTreeMap<QueuePartition, ReceiptsOf> = BTreeMap::new();
        for (i, text) in receipts.iter().enumerate() {
            match self.resolve(text) {
                Ok((r, part)) => by_partition
                    .entry(r.partition)
                    .or_insert_with(|| (part, Vec::new()))
                    .1
                    .push((i, r)),
                Err(outcome) => outcomes[i] = outcome,
            }
        }
        let mut pending = Pending::default();
        let mut wake = false;
        for (part, list) in by_partition.values() {
            let mut state = part.state.lock().unwrap();
            for (i, r) in list {
                outcomes[*i] = match state.engine.ack(r) {
                    Ok(()) => {
                        state.done(r.offset);
                        ReceiptOutcome::Ok
                    }
                    Err(e) => self.stale(&e),
                };
            }
            pending.merge(self.write_events(&mut state));
            part.space.notify_one();
            wake |= state.ready_len() > 0;
        }
        if wake {
            // The commit point may have moved: records held back by the gap
            // cap can be leased now.
            self.ready.notify_waiters();
        }
        pending
            .wait()
            .await
            .map_err(|e| unavailable(format!("ack log: {e}")))?;
        let acked = outcomes
            .iter()
            .filter(|o| **o == ReceiptOutcome::Ok)
            .count();
        metrics::counter!("dispatcher_acks_total", "queue" => self.name()).increment(acked as u64);
        Ok(outcomes)
    }

    pub(crate) async fn nack(&self, request: NackRequest) -> Result<ReceiptOutcome, ServiceError> {
        let (receipt, part) = match self.resolve(&request.receipt) {
            Ok(found) => found,
            Err(outcome) => return Ok(outcome),
        };
        let retry_after_ms = request.retry_after.map(ms);
        let error = request.error.as_deref().unwrap_or("nacked");
        let pending = {
            let mut state = part.state.lock().unwrap();
            match state
                .engine
                .nack(&receipt, retry_after_ms, error, request.permanent, now_ms())
            {
                Ok(failure) => {
                    state.fail(failure);
                    self.write_events(&mut state)
                }
                Err(e) => return Ok(self.stale(&e)),
            }
        };
        pending
            .wait()
            .await
            .map_err(|e| unavailable(format!("ack log: {e}")))?;
        metrics::counter!("dispatcher_nacks_total", "queue" => self.name()).increment(1);
        self.route(&part).await;
        Ok(ReceiptOutcome::Ok)
    }

    pub(crate) async fn extend(
        &self,
        receipt: String,
        lease: Duration,
    ) -> Result<ExtendResult, ServiceError> {
        let (receipt, part) = match self.resolve(&receipt) {
            Ok(found) => found,
            Err(outcome) => {
                return Ok(ExtendResult {
                    outcome,
                    lease_expires_at_ms: None,
                });
            }
        };
        let result = part
            .state
            .lock()
            .unwrap()
            .engine
            .extend(&receipt, ms(lease), now_ms());
        Ok(match result {
            Ok(extended) => ExtendResult {
                outcome: ReceiptOutcome::Ok,
                lease_expires_at_ms: Some(extended.expiry_ms),
            },
            Err(e) => ExtendResult {
                outcome: self.stale(&e),
                lease_expires_at_ms: None,
            },
        })
    }

    // ---- failures ----------------------------------------------------------

    /// Writes the copies of the partition's failures (retry tier or DLQ),
    /// and once each copy is acknowledged, marks its offset done.
    async fn route(&self, part: &Arc<Partition>) {
        let jobs = part.state.lock().unwrap().take_routable();
        if jobs.is_empty() {
            return;
        }
        let mut sends = Vec::with_capacity(jobs.len());
        for (failure, m) in &jobs {
            let consumer = self
                .names
                .lock()
                .unwrap()
                .name(failure.consumer)
                .map(str::to_owned);
            let (_, headers) = m.failure_copy(
                &self.config.topic,
                part.qp.partition,
                failure.offset,
                failure,
                consumer.as_deref(),
            );
            let (topic, partitions) = match failure.route {
                Route::Dlq => (&self.config.dlq_topic, self.dlq_partitions),
                Route::RetryTier { tier, .. } => {
                    (&self.topics[tier + 1], self.topic_partitions[tier + 1])
                }
            };
            let mut owned = OwnedHeaders::new_with_capacity(headers.len());
            for (k, v) in &headers {
                owned = owned.insert(Header {
                    key: k,
                    value: Some(v),
                });
            }
            let mut record = FutureRecord::to(topic)
                .partition(part.qp.partition % partitions.max(1))
                .payload(&m.payload[..])
                .headers(owned);
            if let Some(k) = &m.key {
                record = record.key(&k[..]);
            }
            sends.push(self.producer.send_result(record).map_err(|(e, _)| e));
        }
        let mut ok = Vec::new();
        let mut dead_lettered = 0u64;
        for ((failure, _), send) in jobs.iter().zip(sends) {
            let result = match send {
                Ok(f) => match f.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err((e, _))) => Err(e.to_string()),
                    Err(_) => Err("the producer went away".to_string()),
                },
                Err(e) => Err(e.to_string()),
            };
            match result {
                Ok(()) => {
                    if failure.route == Route::Dlq {
                        dead_lettered += 1;
                    }
                    ok.push(failure.offset);
                }
                Err(e) => tracing::warn!(queue = %self.config.name, partition = %part.qp,
                    offset = failure.offset, "writing the failure copy: {e}"),
            }
        }
        let (pending, wake) = {
            let mut state = part.state.lock().unwrap();
            for (failure, _) in &jobs {
                if ok.contains(&failure.offset) {
                    state.routed(failure.offset);
                } else {
                    state.route_failed(failure.offset);
                }
            }
            (self.write_events(&mut state), state.ready_len() > 0)
        };
        part.space.notify_one();
        if wake {
            self.ready.notify_waiters();
        }
        if dead_lettered > 0 {
            metrics::counter!("dispatcher_dead_lettered_total", "queue" => self.name())
                .increment(dead_lettered);
        }
        if let Err(e) = pending.wait().await {
            tracing::warn!(queue = %self.config.name, partition = %part.qp, "ack-log write: {e}");
        }
    }

    /// The periodic work: expire leases, enforce the gap cap, route
    /// failures; with `slow` also commit, account records that left
    /// retention, and update the gauges.
    pub(crate) async fn tick(self: &Arc<Self>, slow: bool, measure: bool) {
        let now = now_ms();
        for part in self.owned() {
            let (pending, expired, routable) = {
                let mut state = part.state.lock().unwrap();
                let mut failures = state.engine.expire(now);
                failures.extend(state.engine.enforce_gap_cap(now));
                let expired = failures
                    .iter()
                    .filter(|f| f.cause == FailureCause::Expired)
                    .count();
                for f in failures {
                    state.fail(f);
                }
                (self.write_events(&mut state), expired, state.has_routable())
            };
            if expired > 0 {
                metrics::counter!("dispatcher_lease_expiries_total", "queue" => self.name())
                    .increment(expired as u64);
            }
            if let Err(e) = pending.wait().await {
                tracing::warn!(queue = %self.config.name, partition = %part.qp, "ack-log write: {e}");
                continue;
            }
            if routable {
                self.route(&part).await;
            }
        }
        if slow {
            let owned = self.owned();
            self.commit(&owned, false).await;
            self.repair().await;
        }
        if measure {
            let owned = self.owned();
            match self.measure().await {
                Ok(measure) => {
                    self.account_retention(&owned, &measure).await;
                    self.set_gauges(&owned, &measure);
                }
                Err(e) => tracing::warn!(queue = %self.config.name, "stats: {e}"),
            }
        }
    }

    /// Records below the log start offset left retention before being done:
    /// counted, and the commit point moves past them.
    async fn account_retention(&self, owned: &[Arc<Partition>], measure: &Measure) {
        for part in owned.iter().filter(|p| p.qp.topic == 0) {
            let Some(&(low, _)) = measure.watermarks.get(&part.qp) else {
                continue;
            };
            let (lost, pending) = {
                let mut state = part.state.lock().unwrap();
                let lost = state.left_retention(low);
                (lost, self.write_events(&mut state))
            };
            if lost > 0 {
                tracing::warn!(queue = %self.config.name, partition = %part.qp, lost,
                    "records left retention before being acked");
                metrics::counter!("dispatcher_expired_unprocessed_total", "queue" => self.name(),
                    "partition" => part.qp.partition.to_string())
                .increment(lost as u64);
            }
            if let Err(e) = pending.wait().await {
                tracing::warn!(queue = %self.config.name, partition = %part.qp, "ack-log write: {e}");
            }
        }
    }

    fn set_gauges(&self, owned: &[Arc<Partition>], measure: &Measure) {
        let now = now_ms();
        let name = self.name();
        let mut retry_depth = vec![0i64; self.topics.len()];
        for part in owned {
            let (in_flight, committed, oldest) = {
                let s = part.state.lock().unwrap();
                (
                    s.engine.in_flight_len(),
                    s.engine.committed_offset(),
                    s.oldest_timestamp_ms(),
                )
            };
            let label = self.label(part.qp);
            metrics::gauge!("dispatcher_in_flight", "queue" => name.clone(), "partition" => label.clone())
                .set(in_flight as f64);
            if part.qp.topic == 0 {
                let age = oldest.map_or(0, |ts| (now - ts).max(0));
                metrics::gauge!("dispatcher_oldest_unacked_age_seconds", "queue" => name.clone(), "partition" => label)
                    .set(age as f64 / 1000.0);
            } else if let Some(&(_, high)) = measure.watermarks.get(&part.qp) {
                retry_depth[usize::from(part.qp.topic)] += (high - committed).max(0);
            }
        }
        for (i, tier) in self.config.retry_tiers.iter().enumerate() {
            metrics::gauge!("dispatcher_retry_depth", "queue" => name.clone(), "tier" => format_duration(*tier))
                .set(retry_depth[i + 1] as f64);
        }
        metrics::gauge!("dispatcher_dlq_depth", "queue" => name.clone())
            .set(measure.dlq_depth as f64);
        let dlq_age = measure.dlq_oldest_ms.map_or(0, |ts| (now - ts).max(0));
        metrics::gauge!("dispatcher_dlq_oldest_age_seconds", "queue" => name)
            .set(dlq_age as f64 / 1000.0);
    }

    // ---- produce -----------------------------------------------------------

    pub(crate) async fn produce(
        &self,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<ProduceResult>, ServiceError> {
        validate_produce(&messages, &self.config.retry_tiers)
            .map_err(ServiceError::InvalidArgument)?;
        let now = now_ms();
        let mut results: Vec<Option<ProduceResult>> = vec![None; messages.len()];
        // (index, id, deduped, the send)
        let mut sends = Vec::new();
        // An id given twice in one request: the later ones answer as
        // duplicates of the first.
        let mut first_of: HashMap<String, usize> = HashMap::new();
        let mut repeats: Vec<(usize, usize)> = Vec::new();
        for (i, m) in messages.into_iter().enumerate() {
            let deduped = m.message_id.is_some();
            let id = m
                .message_id
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            if deduped {
                if let Some(&first) = first_of.get(&id) {
                    repeats.push((i, first));
                    continue;
                }
                first_of.insert(id.clone(), i);
                if let Some((partition, offset)) =
                    self.dedupe.lock().unwrap().check_and_insert(&id, now)
                {
                    results[i] = Some(ProduceResult {
                        message_id: id,
                        status: ProduceStatus::Duplicate,
                        partition,
                        offset,
                    });
                    continue;
                }
            }
            let mut headers = m.headers;
            let topic = match m.delay.filter(|d| !d.is_zero()) {
                None => {
                    headers.push((MESSAGE_ID_HEADER.to_owned(), id.clone().into_bytes()));
                    &self.topics[0]
                }
                Some(delay) => {
                    let tier = tier_for_delay(&self.config.retry_tiers, delay).expect("validated");
                    crate::lease::RetryEnvelope {
                        origin_topic: self.config.topic.clone(),
                        origin_partition: -1,
                        origin_offset: -1,
                        message_id: id.clone(),
                        attempt: crate::lease::Attempt::FIRST,
                        first_enqueued_ms: now,
                        due_ms: Some(now + ms(delay)),
                        errors: Vec::new(),
                    }
                    .write_into(&mut headers);
                    &self.topics[tier + 1]
                }
            };
            let mut owned = OwnedHeaders::new_with_capacity(headers.len());
            for (k, v) in &headers {
                owned = owned.insert(Header {
                    key: k,
                    value: Some(v),
                });
            }
            // By key with librdkafka's default partitioner; without a key its
            // sticky partitioner spreads batches over the partitions.
            let mut record = FutureRecord::to(topic)
                .payload(&m.payload[..])
                .headers(owned);
            if let Some(k) = &m.key {
                record = record.key(&k[..]);
            }
            let send = self
                .producer
                .send_result(record)
                .map_err(|(e, _)| e.to_string());
            sends.push((i, id, deduped, send));
        }
        let mut error = None;
        for (i, id, deduped, send) in sends {
            let outcome = match send {
                Ok(f) => match f.await {
                    Ok(Ok(d)) => Ok((d.partition, d.offset)),
                    Ok(Err((e, _))) => Err(e.to_string()),
                    Err(_) => Err("the producer went away".to_string()),
                },
                Err(e) => Err(e),
            };
            match outcome {
                Ok((partition, offset)) => {
                    if deduped {
                        self.dedupe
                            .lock()
                            .unwrap()
                            .record(&id, partition, offset, now);
                    }
                    results[i] = Some(ProduceResult {
                        message_id: id,
                        status: ProduceStatus::Accepted,
                        partition,
                        offset,
                    });
                }
                Err(e) => {
                    if deduped {
                        self.dedupe.lock().unwrap().forget(&id);
                    }
                    error.get_or_insert(e);
                }
            }
        }
        for (i, first) in repeats {
            results[i] = results[first].clone().map(|r| ProduceResult {
                status: ProduceStatus::Duplicate,
                ..r
            });
        }
        let results: Vec<ProduceResult> = results.into_iter().flatten().collect();
        let accepted = results
            .iter()
            .filter(|r| r.status == ProduceStatus::Accepted)
            .count();
        let name = self.name();
        metrics::counter!("dispatcher_produced_total", "queue" => name.clone(), "status" => "accepted")
            .increment(accepted as u64);
        metrics::counter!("dispatcher_produced_total", "queue" => name, "status" => "duplicate")
            .increment((results.len() - accepted) as u64);
        match error {
            // The ones written are recorded: a retry of the request answers
            // them `duplicate` (when they carry ids) and writes the rest.
            Some(e) => Err(unavailable(format!("produce: {e}"))),
            None => Ok(results),
        }
    }

    // ---- stats -------------------------------------------------------------

    /// The owned partitions' watermarks (asked each time: a depth must not
    /// lag a produce), and the DLQ's depth and oldest record (cached for
    /// `STATS_TTL`: it costs a fetch).
    async fn measure(&self) -> Result<Measure, ServiceError> {
        let owned: Vec<(QueuePartition, String)> = self
            .owned()
            .iter()
            .map(|p| (p.qp, self.topics[usize::from(p.qp.topic)].clone()))
            .collect();
        let readers = Arc::clone(&self.readers);
        let watermarks = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let meta = readers.meta.lock().unwrap();
            let mut watermarks = HashMap::new();
            for (qp, topic) in owned {
                watermarks.insert(
                    qp,
                    meta.fetch_watermarks(&topic, qp.partition, STATS_TIMEOUT)?,
                );
            }
            Ok(watermarks)
        })
        .await
        .map_err(unavailable)?
        .map_err(|e| unavailable(format!("{e:#}")))?;
        let (dlq_depth, dlq_oldest_ms) = self.dlq().await?;
        Ok(Measure {
            watermarks,
            dlq_depth,
            dlq_oldest_ms,
        })
    }

    async fn dlq(&self) -> Result<DlqFigures, ServiceError> {
        let mut cache = self.dlq_cache.lock().await;
        if let Some((at, dlq)) = *cache {
            if at.elapsed() < STATS_TTL {
                return Ok(dlq);
            }
        }
        let readers = Arc::clone(&self.readers);
        let dlq_topic = self.config.dlq_topic.clone();
        let dlq_partitions = self.dlq_partitions;
        let dlq = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let mut depth = 0;
            let mut starts = Vec::new();
            {
                let meta = readers.meta.lock().unwrap();
                for p in 0..dlq_partitions {
                    let (low, high) = meta.fetch_watermarks(&dlq_topic, p, STATS_TIMEOUT)?;
                    if high > low {
                        depth += high - low;
                        starts.push((p, low));
                    }
                }
            }
            let oldest = reader::oldest_timestamp_ms(
                &readers.dlq.lock().unwrap(),
                &dlq_topic,
                &starts,
                STATS_TIMEOUT,
            )?;
            Ok((depth, oldest))
        })
        .await
        .map_err(unavailable)?
        .map_err(|e| unavailable(format!("{e:#}")))?;
        *cache = Some((Instant::now(), dlq));
        Ok(dlq)
    }

    pub(crate) async fn stats(&self) -> Result<QueueStats, ServiceError> {
        let measure = self.measure().await?;
        let now = now_ms();
        let mut stats = QueueStats {
            dlq_depth: measure.dlq_depth,
            dlq_oldest_age_ms: measure.dlq_oldest_ms.map_or(0, |ts| (now - ts).max(0)),
            ..QueueStats::default()
        };
        for part in self.owned() {
            let (in_flight, committed, oldest) = {
                let s = part.state.lock().unwrap();
                (
                    s.engine.in_flight_len() as u64,
                    s.engine.committed_offset(),
                    s.oldest_timestamp_ms(),
                )
            };
            let high = measure
                .watermarks
                .get(&part.qp)
                .map_or(committed, |&(_, h)| h);
            let depth = (high - committed).max(0);
            if part.qp.topic > 0 {
                stats.retry_depth += depth;
                stats.in_flight += in_flight;
                continue;
            }
            let age = if depth > 0 {
                oldest.map_or(0, |ts| (now - ts).max(0))
            } else {
                0
            };
            stats.depth += depth;
            stats.in_flight += in_flight;
            stats.oldest_unacked_age_ms = stats.oldest_unacked_age_ms.max(age);
            stats.partitions.push(PartitionStats {
                partition: part.qp.partition,
                depth,
                in_flight,
                oldest_unacked_age_ms: age,
            });
        }
        Ok(stats)
    }
}

impl Partition {
    /// Stops the fetch task and waits until it is gone.
    async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let task = self.fetch_task.lock().unwrap().take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
    }
}
