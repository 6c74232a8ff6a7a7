//! The queue runtime (issue 7): the lease engine driven by Kafka. Each
//! queue's primary topic and retry-tier topics are consumed in the queue's
//! group; every owned partition runs a [`PartitionLeases`] rebuilt from the
//! ack log at assignment; receives lease fetched records, acks and nacks
//! write the engine's events to the ack log before answering, failures are
//! copied to a retry tier or the DLQ, and the commit point is committed to
//! the group.
//!
//! Not here: forwarding a receipt to the instance that owns its partition
//! (this answers `NotOwner`; `crate::forward` wraps it), and the HTTP and
//! gRPC APIs (`crate::api`).
//!
//! Decisions worth knowing:
//! - Receipts are signed with `ReceiptSecret::mac_key` (the codec wants 32
//!   bytes; `forward` derives the same), one codec per queue: instances with the same secret read each
//!   other's receipts.
//! - A receive's `Leased` events are written but not awaited (acks' and
//!   nacks' are): a lease lost with its owner is a redelivery, and the
//!   ownership's generation, written before the first lease, keeps an old
//!   receipt from matching a new owner's lease.
//! - A nack answers Ok only once its failure copy is acknowledged (so a
//!   permanent nack's DLQ copy exists when the client hears Ok), whichever
//!   task wrote it: the nack registers a copy waiter on the partition before
//!   the failure is visible. Expiries and the gap cap are routed by the
//!   periodic task.
//! - Delivery `partition`/`offset` name the original record in the primary
//!   topic; for a message produced with a delay (never in the primary) they
//!   name its record in the retry tier, as the produce result did.
//! - A retry tier's records are leased in offset order up to the first not
//!   yet due (copies are written in due order); the first not-due record
//!   holds back that tier partition only.
//!
//! [`PartitionLeases`]: crate::lease::PartitionLeases

pub mod dedupe;
pub mod fair;
pub mod fetch_health;
pub mod message;
pub mod ordered;
pub mod partition;
mod reader;
mod runtime;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, Producer as _};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{Config, QueueConfig};
use crate::kafka::consumer::{Assignment, QueueConsumer};
use crate::lease::{QueuePartition, ReceiptCodec};
use crate::redrive::{RedriveAction, RedriveError, RedriveJob, RedriveRequest, Redriver};
use crate::service::{
    Delivery, ExtendResult, NackRequest, NewMessage, ParkedKeyInfo, ProduceResult, QueueService,
    QueueStats, ReceiptOutcome, ReceiveRequest, ServiceError, SkipOutcome, SkipRequest,
};

pub use runtime::MAX_ACK_RECEIPTS;
use runtime::{QueueRuntime, RuntimeParts, KAFKA_TIMEOUT};

/// How long a rebalance waits for a revoked partition's final commit.
const REVOKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Lease expiry, the gap cap and failure routing run this often.
const TICK: Duration = Duration::from_millis(200);
/// Every this many ticks: commits and the repair of unserved partitions
/// (~1 s).
const SLOW_TICKS: u32 = 5;
/// Every this many slow ticks: watermarks for retention accounting and the
/// gauges (~5 s; a watermark read per owned partition is a round trip).
const MEASURE_SLOW_TICKS: u32 = 5;
/// How long `start` waits for the group to assign partitions to every
/// consumer.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(15);
/// librdkafka's own prefetch per consumer (kB), unless configured: the
/// dispatcher buffers `partition::PREFETCH_MAX` records per partition
/// itself, so the backlog stays in Kafka.
const CONSUMER_QUEUE_KBYTES: &str = "16384";

/// The dispatcher's queues on this instance. Implements [`QueueService`].
pub struct Dispatcher {
    queues: HashMap<String, Arc<QueueRuntime>>,
    configs: Vec<QueueConfig>,
    /// Each queue's redrive jobs (`crate::redrive`).
    redrivers: HashMap<String, Arc<Redriver>>,
    producer: FutureProducer,
    stop: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Dispatcher {
    /// Sets up every queue's topics, starts its consumers (the primary and
    /// one per retry tier, all in the queue's group) and the periodic tasks.
    /// Returns once every consumer serves an assignment, or after
    /// `SETTLE_TIMEOUT` (a receive waits for partitions anyway).
    pub async fn start(config: &Config) -> anyhow::Result<Arc<Dispatcher>> {
        let admin: Arc<AdminClient<DefaultClientContext>> = Arc::new(
            crate::kafka::admin_config(config)
                .create()
                .context("creating the admin client")?,
        );
        for queue in &config.queues {
            crate::kafka::topics::ensure_topics(&admin, queue, KAFKA_TIMEOUT).await?;
        }
        let producer: FutureProducer = crate::kafka::producer_config(config)
            .create()
            .context("creating the producer")?;
        // The same key `forward` verifies receipts with.
        let secret: [u8; 32] = config.receipt_secret.mac_key();
        let (stop, _) = watch::channel(false);
        let mut queues = HashMap::new();
        let mut redrivers = HashMap::new();
        let mut tasks = Vec::new();
        let reader_config = crate::kafka::admin_config(config);
        let fair = Arc::new(fair::FairShare::new(
            config.max_in_flight,
            &config
                .queues
                .iter()
                .map(|q| (q.name.clone(), q.weight))
                .collect::<Vec<_>>(),
        ));
        for (lane, queue) in config.queues.iter().enumerate() {
            let counts = partition_counts(&reader_config, queue).await?;
            let mut consumers = Vec::new();
            let mut event_streams = Vec::new();
            let mut topics = vec![queue.topic.clone()];
            topics.extend(queue.retry_topics());
            for topic in &topics {
                let mut client_config = crate::kafka::consumer_config(config, queue);
                if !config.librdkafka.contains_key("queued.max.messages.kbytes") {
                    client_config.set("queued.max.messages.kbytes", CONSUMER_QUEUE_KBYTES);
                }
                let topic = topic.clone();
                let (consumer, events) = tokio::task::spawn_blocking(move || {
                    QueueConsumer::start(&client_config, &topic, REVOKE_TIMEOUT, KAFKA_TIMEOUT)
                })
                .await
                .expect("consumer start does not panic")
                .with_context(|| format!("queue {:?}: starting a consumer", queue.name))?;
                consumers.push(Arc::new(consumer));
                event_streams.push(events);
            }
            let runtime = Arc::new(QueueRuntime::new(RuntimeParts {
                config: queue.clone(),
                codec: ReceiptCodec::new(&secret, &queue.name),
                topic_partitions: topics
                    .iter()
                    .map(|t| counts.get(t).copied().unwrap_or(1))
                    .collect(),
                dlq_partitions: counts.get(&queue.dlq_topic).copied().unwrap_or(1),
                ack_log_partitions: counts.get(&queue.ack_log_topic).copied().unwrap_or(1),
                hold_partitions: counts.get(&queue.hold_topic()).copied().unwrap_or(1),
                producer: producer.clone(),
                consumers,
                reader_config: reader_config.clone(),
                fair: fair.clone(),
                lane,
                index_partitions: counts
                    .get(&crate::trace::index_topic(&queue.topic))
                    .copied()
                    .or_else(|| counts.get(&queue.topic).copied())
                    .unwrap_or(1),
            })?);
            runtime.follow_dedupe(&reader_config).await?;
            runtime.follow_control(&reader_config).await?;
            for (t, events) in event_streams.into_iter().enumerate() {
                let t = u16::try_from(t).context("too many retry tiers")?;
                tasks.push(tokio::spawn(assignments(
                    Arc::clone(&runtime),
                    t,
                    events,
                    stop.subscribe(),
                )));
            }
            tasks.push(tokio::spawn(ticks(Arc::clone(&runtime), stop.subscribe())));
            let owner = Arc::clone(&runtime);
            let partition_0 = QueuePartition {
                topic: 0,
                partition: 0,
            };
            let redriver = Redriver::new(crate::redrive::job::RedriverParts {
                queue: queue.clone(),
                producer: producer.clone(),
                reader_config: reader_config.clone(),
                primary_partitions: counts.get(&queue.topic).copied().unwrap_or(1),
                dlq_partitions: counts.get(&queue.dlq_topic).copied().unwrap_or(1),
                state_partitions: counts
                    .get(&crate::redrive::store::state_topic(queue))
                    .copied()
                    .unwrap_or(1),
                owns: Arc::new(move || owner.owned().iter().any(|p| p.qp == partition_0)),
                index: {
                    let runtime = runtime.clone();
                    Arc::new(move |envelope, location| {
                        let runtime = runtime.clone();
                        Box::pin(async move { runtime.record_location(&envelope, location).await })
                    })
                },
                stop: stop.subscribe(),
            })?;
            redrivers.insert(queue.name.clone(), Arc::new(redriver));
            queues.insert(queue.name.clone(), runtime);
        }
        wait_for_assignments(&queues).await;
        Ok(Arc::new(Dispatcher {
            queues,
            configs: config.queues.clone(),
            redrivers,
            producer,
            stop,
            tasks: Mutex::new(tasks),
        }))
    }

    /// Stops serving: commits every owned partition's commit point, leaves
    /// the groups and flushes the producer. Leases in flight come back on
    /// the next owner.
    pub async fn shutdown(&self) {
        let _ = self.stop.send(true);
        let tasks: Vec<JoinHandle<()>> = std::mem::take(&mut *self.tasks.lock().unwrap());
        for t in tasks {
            let _ = t.await;
        }
        // Running redrive jobs saw the stop: they write what is in flight
        // and end.
        for redriver in self.redrivers.values() {
            redriver.shutdown().await;
        }
        for runtime in self.queues.values() {
            runtime.stop().await;
            for consumer in runtime.take_consumers() {
                match Arc::try_unwrap(consumer) {
                    Ok(c) => c.close().await,
                    Err(shared) => {
                        let _ = tokio::task::spawn_blocking(move || drop(shared)).await;
                    }
                }
            }
        }
        let producer = self.producer.clone();
        let _ = tokio::task::spawn_blocking(move || producer.flush(Duration::from_secs(5))).await;
    }

    /// The partitions (primary and tier topics) this instance owns now.
    pub fn owned_partitions(&self, queue: &str) -> Vec<QueuePartition> {
        self.queues
            .get(queue)
            .map(|q| q.owned().iter().map(|p| p.qp).collect())
            .unwrap_or_default()
    }

    fn redriver(&self, name: &str) -> Result<&Arc<Redriver>, RedriveError> {
        self.redrivers
            .get(name)
            .ok_or_else(|| RedriveError::Service(ServiceError::UnknownQueue(name.to_owned())))
    }

    fn queue(&self, name: &str) -> Result<&Arc<QueueRuntime>, ServiceError> {
        self.queues
            .get(name)
            .ok_or_else(|| ServiceError::UnknownQueue(name.to_owned()))
    }
}

/// Waits (bounded) until every consumer serves an assignment. Consumers of
/// one group joining one after another rebalance the group each time, and
/// each rebalance moves leases (their messages come back); a caller that
/// starts working after this sees a settled group. Another instance already
/// holding every partition of a topic makes this wait the whole bound.
async fn wait_for_assignments(queues: &HashMap<String, Arc<QueueRuntime>>) {
    let deadline = tokio::time::Instant::now() + SETTLE_TIMEOUT;
    while !queues.values().all(|q| q.every_topic_served()) {
        if tokio::time::Instant::now() >= deadline {
            tracing::info!(
                "not every topic has partitions here after {SETTLE_TIMEOUT:?}; serving what is assigned"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Partition counts of every topic (the partitioner of copies and ack-log
/// writes needs them).
async fn partition_counts(
    reader_config: &rdkafka::config::ClientConfig,
    queue: &QueueConfig,
) -> anyhow::Result<HashMap<String, i32>> {
    let consumer: BaseConsumer = reader::plain_consumer(reader_config, "metadata")?;
    let name = queue.name.clone();
    tokio::task::spawn_blocking(move || {
        let metadata = consumer
            .fetch_metadata(None, KAFKA_TIMEOUT)
            .with_context(|| format!("queue {name:?}: metadata"))?;
        Ok(metadata
            .topics()
            .iter()
            .map(|t| (t.name().to_owned(), t.partitions().len() as i32))
            .collect())
    })
    .await
    .expect("metadata task does not panic")
}

/// Applies one consumer's assignment events to the queue's partitions.
async fn assignments(
    runtime: Arc<QueueRuntime>,
    t: u16,
    mut events: tokio::sync::mpsc::UnboundedReceiver<Assignment>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            event = events.recv() => match event {
                None => return,
                Some(Assignment::Assigned(partitions)) => {
                    tracing::info!(queue = %runtime.config.name, topic = t, ?partitions, "assigned");
                    runtime.assign(t, partitions).await
                }
                Some(Assignment::Revoked { partitions, release }) => {
                    tracing::info!(queue = %runtime.config.name, topic = t, ?partitions, "revoked");
                    runtime.revoke(t, &partitions).await;
                    drop(release);
                }
            },
        }
    }
}

async fn ticks(runtime: Arc<QueueRuntime>, mut stop: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n: u32 = 0;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = interval.tick() => {
                n = n.wrapping_add(1);
                let slow = n.is_multiple_of(SLOW_TICKS);
                runtime.tick(slow, n.is_multiple_of(SLOW_TICKS * MEASURE_SLOW_TICKS)).await;
            }
        }
    }
}

impl QueueService for Dispatcher {
    fn queues(&self) -> Vec<QueueConfig> {
        self.configs.clone()
    }

    async fn produce(
        &self,
        queue: &str,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<ProduceResult>, ServiceError> {
        self.queue(queue)?.produce(messages).await
    }

    async fn receive(
        &self,
        queue: &str,
        request: ReceiveRequest,
    ) -> Result<Vec<Delivery>, ServiceError> {
        self.queue(queue)?.receive(request).await
    }

    async fn ack(
        &self,
        queue: &str,
        receipts: &[String],
    ) -> Result<Vec<ReceiptOutcome>, ServiceError> {
        self.queue(queue)?.ack(receipts).await
    }

    async fn nack(
        &self,
        queue: &str,
        request: NackRequest,
    ) -> Result<ReceiptOutcome, ServiceError> {
        self.queue(queue)?.nack(request).await
    }

    async fn extend(
        &self,
        queue: &str,
        receipt: String,
        lease: Duration,
    ) -> Result<ExtendResult, ServiceError> {
        self.queue(queue)?.extend(receipt, lease).await
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats, ServiceError> {
        self.queue(queue)?.stats().await
    }

    async fn record_paused(&self, queue: &str, paused: bool) -> Result<(), ServiceError> {
        self.queue(queue)?.record_paused(paused).await
    }

    async fn set_paused(&self, queue: &str, paused: bool) -> Result<(), ServiceError> {
        self.queue(queue)?.set_paused(paused);
        Ok(())
    }

    async fn parked(&self, queue: &str) -> Result<Vec<ParkedKeyInfo>, ServiceError> {
        self.queue(queue)?.parked()
    }

    async fn skip(&self, queue: &str, request: SkipRequest) -> Result<SkipOutcome, ServiceError> {
        self.queue(queue)?.skip(request).await
    }

    async fn trace(
        &self,
        message_id: &str,
        queue: Option<&str>,
    ) -> Result<Vec<crate::trace::MessageTrace>, ServiceError> {
        crate::trace::validate_message_id(message_id).map_err(ServiceError::InvalidArgument)?;
        let runtimes: Vec<&Arc<QueueRuntime>> = match queue {
            Some(q) => vec![self.queue(q)?],
            None => self
                .configs
                .iter()
                .filter_map(|c| self.queues.get(&c.name))
                .collect(),
        };
        let mut traces = Vec::new();
        for runtime in runtimes {
            if let Some(t) = runtime.trace(message_id).await? {
                traces.push(t);
            }
        }
        Ok(traces)
    }

    async fn redrive_start(
        &self,
        queue: &str,
        request: RedriveRequest,
    ) -> Result<RedriveJob, RedriveError> {
        self.redriver(queue)?.start(request).await
    }

    async fn redrive_status(&self, queue: &str) -> Result<RedriveJob, RedriveError> {
        self.redriver(queue)?.status().await
    }

    async fn redrive_control(
        &self,
        queue: &str,
        action: RedriveAction,
    ) -> Result<RedriveJob, RedriveError> {
        self.redriver(queue)?.control(action).await
    }
}
