//! One queue's runtime: the partitions this instance owns (primary and retry
//! tiers), their fetch tasks, and the operations of the service on them.
//!
//! Locking: one mutex per owned partition, held only for the engine's pure
//! work and for appending its ack-log records to the writer (`ack_log`,
//! which keeps their order); never across a Kafka round trip. Requests then
//! await the delivery reports of their own records.

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
use crate::kafka::control;
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
use super::fair::FairShare;
use super::fetch_health::FetchHealth;
use super::message::{
    tier_for_delay, validate_produce, Buffered, ConsumerNames, MESSAGE_ID_HEADER,
};
use super::partition::{acked_above_commit, PartitionState};
use super::reader;

mod ack_log;
mod assignment;
mod failures;
mod ordered;
mod produce;
mod receive;
mod stats;
mod trace;

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

/// The wall clock rounded up to the millisecond: the base of a due time, so
/// that "due in 10 s" is never met before 10 s have passed (`now_ms` rounds
/// down, and a due time taken from it can be met up to 1 ms early).
pub(crate) fn now_ms_ceil() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros().div_ceil(1000) as i64)
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
    /// Locked through [`Partition::lock`], which reports in-flight changes
    /// to the instance's budget.
    state: Mutex<PartitionState>,
    /// The instance's in-flight budget (`super::fair`).
    fair: Arc<FairShare>,
    /// This partition's leases as last reported to `fair`.
    counted: AtomicUsize,
    /// Woken when leasing or acking made room under the prefetch bound.
    space: Notify,
    /// Revoked or shut down: its fetch task stops.
    closed: AtomicBool,
    /// The offset last committed to the group.
    last_commit: AtomicI64,
    /// Moves fetched records into `state`; stopped by `close`.
    fetch_task: Mutex<Option<JoinHandle<()>>>,
    /// Whether the fetch task can read the partition (`fetch_health`).
    fetch_health: Mutex<FetchHealth>,
    /// Nacks waiting for the copy of their failure (by offset), whichever
    /// task writes it: registered under the state lock before the failure
    /// is recorded, answered once its copy is acknowledged or failed.
    copy_waiters: Mutex<HashMap<i64, Vec<CopyWaiter>>>,
}

/// Told whether a failure's copy (retry tier, DLQ, or an ordered queue's
/// retry record) was acknowledged.
type CopyWaiter = tokio::sync::oneshot::Sender<Result<(), String>>;

/// Ack-log records handed to librdkafka, whose delivery reports are awaited
/// outside the partition lock.
#[must_use]
#[derive(Default)]
struct Pending {
    futures: Vec<DeliveryFuture>,
    /// Records queued in the ack-log writer (`ack_log`).
    appended: Vec<tokio::sync::oneshot::Receiver<Result<(), String>>>,
    error: Option<String>,
}

impl Pending {
    /// Adds one `send_result`: its delivery report, or why librdkafka took
    /// no record.
    fn sent<R>(&mut self, sent: Result<DeliveryFuture, (rdkafka::error::KafkaError, R)>) {
        match sent {
            Ok(f) => self.futures.push(f),
            Err((e, _)) => {
                self.error.get_or_insert(e.to_string());
            }
        }
    }

    fn appended(wait: tokio::sync::oneshot::Receiver<Result<(), String>>) -> Pending {
        Pending {
            appended: vec![wait],
            ..Pending::default()
        }
    }

    fn failed(error: String) -> Pending {
        Pending {
            error: Some(error),
            ..Pending::default()
        }
    }

    fn merge(&mut self, other: Pending) {
        self.futures.extend(other.futures);
        self.appended.extend(other.appended);
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
        for wait in self.appended {
            let outcome = match wait.await {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e,
                Err(_) => "the ack-log writer went away".to_string(),
            };
            error.get_or_insert(outcome);
        }
        error.map_or(Ok(()), Err)
    }
}

/// Record headers for librdkafka from a message's (name, value) list.
fn owned_headers(headers: &[(String, Vec<u8>)]) -> OwnedHeaders {
    headers.iter().fold(
        OwnedHeaders::new_with_capacity(headers.len()),
        |owned, (key, value)| {
            owned.insert(Header {
                key,
                value: Some(value),
            })
        },
    )
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
    /// Ordered queues: reads the hold topic to replay a released key.
    hold: Mutex<BaseConsumer>,
    /// Reads the redrive floors (`crate::redrive::store`), where the DLQ's
    /// depth starts.
    redrive_floors: Mutex<BaseConsumer>,
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
    hold_partitions: i32,
    producer: FutureProducer,
    /// Writes the ack log, one write in flight per partition.
    ack_log: Arc<ack_log::AckLogWriter>,
    consumers: RwLock<Vec<Arc<QueueConsumer>>>,
    partitions: RwLock<HashMap<QueuePartition, Arc<Partition>>>,
    /// Woken when records become leasable (fetched, or a partition assigned).
    ready: Notify,
    rr: AtomicUsize,
    names: Mutex<ConsumerNames>,
    dedupe: Arc<Mutex<Dedupe>>,
    /// Reads the dedupe topic's window at start, then follows it.
    dedupe_follower: Mutex<Option<crate::kafka::dedupe_log::Follower>>,
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
    /// Receives lease nothing while set (`set_paused`).
    paused: AtomicBool,
    /// Reads the control topic (the pause state) at start, then follows it.
    control_follower: Mutex<Option<crate::kafka::follow::Follower>>,
    /// The instance's in-flight budget, shared by its queues; `lane` is this
    /// queue's index in it.
    fair: Arc<FairShare>,
    lane: usize,
    /// The message-id index (`crate::trace`).
    index: trace::IndexParts,
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
    /// Ordered queues: the hold topic's.
    pub hold_partitions: i32,
    pub producer: FutureProducer,
    pub consumers: Vec<Arc<QueueConsumer>>,
    pub reader_config: rdkafka::config::ClientConfig,
    pub fair: Arc<FairShare>,
    pub lane: usize,
    /// Partitions of the index topic (`crate::trace::index_topic`).
    pub index_partitions: i32,
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
            hold: Mutex::new(reader::hold_consumer(&parts.reader_config)?),
            redrive_floors: Mutex::new(crate::redrive::store::floor_consumer(
                &parts.reader_config,
                &config,
            )?),
        });
        let index = trace::IndexParts::new(
            crate::trace::index_topic(&config.topic),
            parts.index_partitions,
            &parts.reader_config,
        )?;
        let ack_log = Arc::new(ack_log::AckLogWriter::new(
            parts.producer.clone(),
            config.ack_log_topic.clone(),
            parts.ack_log_partitions,
        ));
        Ok(QueueRuntime {
            index,
            dedupe: Arc::new(Mutex::new(Dedupe::new(
                ms(config.dedupe_window),
                MAX_DEDUPE_ENTRIES,
            ))),
            dedupe_follower: Mutex::new(None),
            config,
            lease_config,
            codec: parts.codec,
            topics,
            topic_partitions: parts.topic_partitions,
            dlq_partitions: parts.dlq_partitions.max(1),
            ack_log_partitions: parts.ack_log_partitions.max(1),
            hold_partitions: parts.hold_partitions.max(1),
            ack_log,
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
            paused: AtomicBool::new(false),
            control_follower: Mutex::new(None),
            fair: parts.fair,
            lane: parts.lane,
        })
    }

    /// Stops or restarts deliveries. A resume wakes the receives waiting in
    /// a long poll.
    pub(crate) fn set_paused(&self, paused: bool) {
        let was = self.paused.swap(paused, Ordering::SeqCst);
        metrics::gauge!("dispatcher_queue_paused", "queue" => self.name()).set(if paused {
            1.0
        } else {
            0.0
        });
        if was != paused {
            tracing::info!(queue = %self.config.name, paused, "deliveries paused or resumed");
        }
        if !paused {
            self.ready.notify_waiters();
        }
    }

    /// Writes the queue's pause state to its control topic and waits for
    /// Kafka to acknowledge it (a pause is a record, a resume a
    /// tombstone). It changes nothing here: every instance applies it when
    /// it reads it back (`follow_control`), and `set_paused` applies it now.
    pub(crate) async fn record_paused(&self, paused: bool) -> Result<(), ServiceError> {
        let topic = self.config.control_topic();
        let key = control::pause_key(&self.config.group);
        let value = paused.then(|| control::pause_value(now_ms()));
        let mut record = FutureRecord::<[u8], [u8]>::to(&topic)
            .partition(0)
            .key(key.as_bytes());
        if let Some(v) = &value {
            record = record.payload(&v[..]);
        }
        let action = if paused { "pause" } else { "resume" };
        // Bounded here: the producer would wait out `message.timeout.ms`.
        let why = match tokio::time::timeout(
            control::WRITE_TIMEOUT,
            self.producer.send(record, control::WRITE_TIMEOUT),
        )
        .await
        {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err((e, _))) => e.to_string(),
            Err(_) => format!("no answer within {:?}", control::WRITE_TIMEOUT),
        };
        tracing::warn!(queue = %self.config.name, %topic, "recording a {action}: {why}");
        // A write that timed out may still land; every instance then
        // applies it when it reads it, as any recorded change.
        Err(ServiceError::Unavailable(format!(
            "the {action} was not recorded in {topic} ({why}); it is applied nowhere \
             unless Kafka writes it after all; retry"
        )))
    }

    /// Reads the control topic to its end, taking the pause state it holds
    /// before any receive is served, then follows it: a change recorded by
    /// any instance applies here too, even one whose broadcast did not
    /// reach this instance.
    pub(crate) async fn follow_control(
        self: &Arc<Self>,
        reader_config: &rdkafka::config::ClientConfig,
    ) -> anyhow::Result<()> {
        let client_config = reader_config
            .clone()
            .set("client.id", "dispatcher-control-reader")
            .clone();
        let topic = self.config.control_topic();
        let group = self.config.group.clone();
        let this = Arc::downgrade(self);
        let follower = tokio::task::spawn_blocking(move || {
            control::follow_pause(&client_config, &topic, &group, move |paused| {
                if let Some(runtime) = this.upgrade() {
                    runtime.set_paused(paused);
                }
            })
        })
        .await
        .expect("the control reader does not panic")
        .map_err(|e| {
            e.context(format!(
                "queue {:?}: reading the control topic",
                self.config.name
            ))
        })?;
        *self.control_follower.lock().unwrap() = Some(follower);
        Ok(())
    }

    /// Stops following the control topic (at shutdown).
    pub(crate) fn stop_control(&self) {
        let follower = self.control_follower.lock().unwrap().take();
        drop(follower);
    }

    pub(crate) fn paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
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

    /// Hands the partition's drained engine events to the ack-log writer,
    /// in order.
    fn write_events(&self, state: &mut PartitionState) -> Pending {
        // Ordered queues' records first: one naming a record as held (or a
        // key as parked) must not be lost while the event that makes the
        // record done survives (the writer keeps their order).
        let ring = state.engine.config().gap_cap;
        let qp = state.engine.partition();
        let mut records = Vec::new();
        for record in state.take_ordered_out() {
            let r = crate::queue::ordered::encode(qp, ring, &record);
            let tombstone = matches!(record, crate::queue::ordered::OrderedRecord::Unparked(_));
            records.push(ack_log::OutRecord {
                key: r.key,
                value: (!tombstone).then_some(r.value),
            });
        }
        for event in &state.engine.drain_events() {
            let r = state.engine.encode(event);
            records.push(ack_log::OutRecord {
                key: r.key,
                value: Some(r.value),
            });
        }
        self.ack_log.append(qp.partition, records)
    }
}

/// A partition's state, locked. On unlock it reports how the engine's
/// in-flight count changed to the budget, so every lease, ack, nack, expiry
/// and rebuild is counted wherever it happens.
pub(crate) struct StateGuard<'a> {
    state: std::sync::MutexGuard<'a, PartitionState>,
    part: &'a Partition,
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = PartitionState;
    fn deref(&self) -> &PartitionState {
        &self.state
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut PartitionState {
        &mut self.state
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        let now = self.state.engine.in_flight_len();
        let before = self.part.counted.swap(now, Ordering::Relaxed);
        if now != before {
            self.part
                .fair
                .in_flight_changed(now as isize - before as isize);
        }
    }
}

impl Drop for Partition {
    /// Its leases leave the budget with it (a revoked partition's leases
    /// count until it is dropped or taken back).
    fn drop(&mut self) {
        let counted = *self.counted.get_mut();
        if counted > 0 {
            self.fair.in_flight_changed(-(counted as isize));
        }
    }
}

impl Partition {
    pub(crate) fn new(
        qp: QueuePartition,
        state: PartitionState,
        committed: i64,
        fair: Arc<FairShare>,
    ) -> Partition {
        Partition {
            qp,
            state: Mutex::new(state),
            fair,
            counted: AtomicUsize::new(0),
            space: Notify::new(),
            closed: AtomicBool::new(false),
            last_commit: AtomicI64::new(committed),
            fetch_task: Mutex::new(None),
            fetch_health: Mutex::new(FetchHealth::default()),
            copy_waiters: Mutex::new(HashMap::new()),
        }
    }

    /// Waits for the copy of the failure at `offset`. Register it before
    /// the failure is recorded (under the state lock), so no routing can
    /// finish unseen. The sender is dropped, unanswered, with the partition.
    fn wait_for_copy(&self, offset: i64) -> tokio::sync::oneshot::Receiver<Result<(), String>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.copy_waiters
            .lock()
            .unwrap()
            .entry(offset)
            .or_default()
            .push(tx);
        rx
    }

    /// The copy of the failure at `offset` was acknowledged (`Ok`) or its
    /// write failed: tells the nacks waiting for it.
    fn copied(&self, offset: i64, result: &Result<(), String>) {
        let waiters = self.copy_waiters.lock().unwrap().remove(&offset);
        for w in waiters.into_iter().flatten() {
            let _ = w.send(result.clone());
        }
    }

    pub(crate) fn lock(&self) -> StateGuard<'_> {
        StateGuard {
            state: self.state.lock().unwrap(),
            part: self,
        }
    }

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
