//! One consumer per queue, in the queue's consumer group, so dispatcher
//! instances share the topic's partitions and take over from each other.
//!
//! - Offsets are committed only by the caller (`enable.auto.commit=false`,
//!   `enable.auto.offset.store=false`): the commit point is the lease
//!   engine's lowest un-acked offset, not "what was fetched".
//! - Assignment changes reach the caller as `Assignment` events. A revoke
//!   blocks the rebalance until the caller drops the event's `Release` (or
//!   `revoke_timeout` passes), so the caller can commit its final offsets for
//!   those partitions while it still owns them.
//! - Messages are fetched per partition: each partition of the topic gets its
//!   own librdkafka queue (`split_partition_queue`), so the lease engine of
//!   one partition pulls at its own pace and a full partition does not stall
//!   the others. A dedicated thread polls the consumer's main queue, where
//!   librdkafka serves the rebalance callbacks.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::{mpsc, Notify};

/// How long [`QueueConsumer::commit`] waits for the group coordinator.
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(15);

/// What [`QueueConsumer::fetch`] makes of each record: the caller's own
/// form, decoded straight from librdkafka's buffer, so that a record's
/// payload is copied once on its way to a client rather than first into an
/// `OwnedMessage`.
pub trait Decode {
    type Out;
    fn decode<M: Message>(&self, m: &M) -> Self::Out;
}

/// A change of the partitions this consumer owns.
#[derive(Debug)]
pub enum Assignment {
    /// These partitions are now ours; `fetch` works for them.
    Assigned(Vec<i32>),
    /// These partitions are being taken away. The rebalance waits until
    /// `release` is dropped (bounded by the consumer's revoke timeout), so
    /// commit their final offsets before dropping it.
    Revoked {
        partitions: Vec<i32>,
        release: Release,
    },
}

/// Held while the caller finishes with revoked partitions; drop it to let the
/// rebalance go on.
#[derive(Debug)]
pub struct Release(
    // Never sent on: the rebalance callback waits for this sender's drop.
    #[allow(dead_code)] std_mpsc::SyncSender<()>,
);

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("partition {0} is not assigned to this consumer")]
    NotAssigned(i32),
    #[error(transparent)]
    Kafka(#[from] KafkaError),
}

/// State shared by the poll thread, the rebalance callbacks and `fetch`.
#[derive(Default)]
struct Shared {
    assigned: Mutex<BTreeSet<i32>>,
    /// Partitions librdkafka assigned, not yet announced to the caller: the
    /// poll thread first gives each its own queue.
    pending_assigned: Mutex<Vec<i32>>,
    feeds: Mutex<HashMap<i32, Arc<Feed>>>,
    /// Messages of a partition that arrived on the main queue before the
    /// partition had its own queue (a partition added to the topic after we
    /// started). They precede whatever the partition queue holds.
    strays: Mutex<HashMap<i32, VecDeque<OwnedMessage>>>,
    /// Set by `close`: the revoke of the final leave does not wait for a
    /// release (the caller committed before closing).
    closing: AtomicBool,
}

struct Feed {
    queue: PartitionQueue<Context>,
    notify: Arc<Notify>,
    /// An error polled after records of the same `fetch`: returned by the
    /// next one, so the caller sees every error librdkafka reports.
    error: Mutex<Option<KafkaError>>,
}

pub struct Context {
    events: mpsc::UnboundedSender<Assignment>,
    shared: Arc<Shared>,
    revoke_timeout: Duration,
}

impl ClientContext for Context {}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let partitions = partitions_of(tpl);
        {
            let mut assigned = self.shared.assigned.lock().unwrap();
            for p in &partitions {
                assigned.remove(p);
            }
        }
        if partitions.is_empty() {
            return;
        }
        let (tx, rx) = std_mpsc::sync_channel(1);
        let event = Assignment::Revoked {
            partitions: partitions.clone(),
            release: Release(tx),
        };
        // Nobody listening (the caller is gone) or closing: nothing to wait for.
        if self.events.send(event).is_ok() && !self.shared.closing.load(Ordering::SeqCst) {
            if let Err(std_mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(self.revoke_timeout) {
                tracing::warn!(
                    ?partitions,
                    "revoked partitions not released within {:?}; rebalancing anyway",
                    self.revoke_timeout
                );
            }
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => self
                .shared
                .pending_assigned
                .lock()
                .unwrap()
                .extend(partitions_of(tpl)),
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::warn!("rebalance error: {e}"),
        }
    }
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<i32> {
    tpl.elements().iter().map(|e| e.partition()).collect()
}

/// The consumer of one queue's topic. Dropping it (or `close`) leaves the
/// group.
pub struct QueueConsumer {
    consumer: Arc<BaseConsumer<Context>>,
    topic: String,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    poll_thread: Option<JoinHandle<()>>,
}

impl QueueConsumer {
    /// Subscribes to `topic` in the group `client_config` names and starts
    /// the poll thread. `client_config` comes from `kafka::consumer_config`.
    /// Blocks for a metadata request (up to `metadata_timeout`).
    pub fn start(
        client_config: &ClientConfig,
        topic: &str,
        revoke_timeout: Duration,
        metadata_timeout: Duration,
    ) -> Result<(QueueConsumer, mpsc::UnboundedReceiver<Assignment>), KafkaError> {
        let (events, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared::default());
        let context = Context {
            events,
            shared: Arc::clone(&shared),
            revoke_timeout,
        };
        let consumer: Arc<BaseConsumer<Context>> =
            Arc::new(client_config.create_with_context(context)?);
        // Give every partition its own queue before the first poll, so no
        // message of theirs ever lands on the main queue. The split outlives
        // reassignments: librdkafka marks an application-set forward
        // (RD_KAFKA_Q_F_FWD_APP) and a later fetch start does not replace it.
        let metadata = consumer.fetch_metadata(Some(topic), metadata_timeout)?;
        let count = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
            .map_or(0, |t| t.partitions().len() as i32);
        for p in 0..count {
            split(&consumer, &shared, topic, p);
        }
        consumer.subscribe(&[topic])?;
        let stop = Arc::new(AtomicBool::new(false));
        let poll_thread = {
            let consumer = Arc::clone(&consumer);
            let shared = Arc::clone(&shared);
            let stop = Arc::clone(&stop);
            let topic = topic.to_string();
            std::thread::Builder::new()
                .name(format!("poll-{topic}"))
                .spawn(move || poll_loop(&consumer, &shared, &topic, &stop))
                .expect("spawn the consumer poll thread")
        };
        Ok((
            QueueConsumer {
                consumer,
                topic: topic.to_string(),
                shared,
                stop,
                poll_thread: Some(poll_thread),
            },
            rx,
        ))
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The partitions this consumer owns now.
    pub fn assigned(&self) -> BTreeSet<i32> {
        self.shared.assigned.lock().unwrap().clone()
    }

    /// Up to `max` messages of `partition`, in offset order, waiting up to
    /// `wait` for the first, each turned by `decode` into what the caller
    /// keeps. Returns an empty batch when nothing came.
    pub async fn fetch<D: Decode>(
        &self,
        partition: i32,
        max: usize,
        wait: Duration,
        decode: &D,
    ) -> Result<Vec<D::Out>, FetchError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if !self.shared.assigned.lock().unwrap().contains(&partition) {
                return Err(FetchError::NotAssigned(partition));
            }
            let mut batch = Vec::new();
            if let Some(strays) = self.shared.strays.lock().unwrap().get_mut(&partition) {
                while batch.len() < max {
                    let Some(m) = strays.pop_front() else { break };
                    batch.push(decode.decode(&m));
                }
            }
            let feed = self.shared.feeds.lock().unwrap().get(&partition).cloned();
            let Some(feed) = feed else {
                return Err(FetchError::NotAssigned(partition));
            };
            if batch.is_empty() {
                if let Some(e) = feed.error.lock().unwrap().take() {
                    return Err(e.into());
                }
            }
            while batch.len() < max {
                match feed.queue.poll(Duration::ZERO) {
                    None => break,
                    Some(Ok(m)) => batch.push(decode.decode(&m)),
                    Some(Err(e)) if batch.is_empty() => return Err(e.into()),
                    // Hand back what we have; the next fetch returns the error.
                    Some(Err(e)) => {
                        *feed.error.lock().unwrap() = Some(e);
                        break;
                    }
                }
            }
            if !batch.is_empty() {
                return Ok(batch);
            }
            if tokio::time::timeout_at(deadline, feed.notify.notified())
                .await
                .is_err()
            {
                return Ok(batch);
            }
        }
    }

    /// Commits `offset` (the next offset to consume, Kafka's convention) for
    /// each partition, waiting for the coordinator's answer. A commit for a
    /// partition this member no longer owns fails (stale generation).
    pub async fn commit(&self, offsets: &[(i32, i64)]) -> Result<(), KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for &(p, o) in offsets {
            tpl.add_partition_offset(&self.topic, p, Offset::Offset(o))?;
        }
        let consumer = Arc::clone(&self.consumer);
        let commit = tokio::task::spawn_blocking(move || consumer.commit(&tpl, CommitMode::Sync));
        // librdkafka's synchronous commit waits for the coordinator without
        // a bound; a caller gets an answer within COMMIT_TIMEOUT (the commit
        // may still land later).
        match tokio::time::timeout(COMMIT_TIMEOUT, commit).await {
            Ok(done) => done.expect("commit task does not panic"),
            Err(_) => Err(KafkaError::ConsumerCommit(
                rdkafka::types::RDKafkaErrorCode::OperationTimedOut,
            )),
        }
    }

    /// The group's committed offsets of `partitions` (`None`: nothing
    /// committed).
    pub async fn committed(
        &self,
        partitions: &[i32],
        timeout: Duration,
    ) -> Result<Vec<(i32, Option<i64>)>, KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for &p in partitions {
            tpl.add_partition(&self.topic, p);
        }
        let consumer = Arc::clone(&self.consumer);
        let answer = tokio::task::spawn_blocking(move || consumer.committed_offsets(tpl, timeout))
            .await
            .expect("committed task does not panic")?;
        Ok(answer
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => (e.partition(), Some(o)),
                _ => (e.partition(), None),
            })
            .collect())
    }

    /// Leaves the group and closes the consumer: commit what must be
    /// committed first (the final revoke event is sent but not waited for).
    pub async fn close(self) {
        tokio::task::spawn_blocking(move || drop(self))
            .await
            .expect("close task does not panic");
    }
}

/// How long closing waits for the group to take the assignment back after
/// unsubscribing.
const UNSUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Dropping blocks until the consumer has left the group; from async code
/// use `close`, which does it off the runtime's threads.
impl Drop for QueueConsumer {
    fn drop(&mut self) {
        // Whoever drops the consumer cannot also release the final revoke.
        self.shared.closing.store(true, Ordering::SeqCst);
        // librdkafka's close can wait forever in `rd_kafka_assign` when it
        // has to revoke an assignment itself (confluentinc/librdkafka#4884;
        // seen here in tests shutting down). So leave the group first, with
        // the poll thread still serving the revoke, and close once nothing
        // is assigned (or after a bound: then close as before).
        self.consumer.unsubscribe();
        let deadline = std::time::Instant::now() + UNSUBSCRIBE_TIMEOUT;
        while std::time::Instant::now() < deadline
            && self.consumer.assignment().is_ok_and(|tpl| tpl.count() > 0)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.poll_thread.take() {
            let _ = t.join();
        }
        // The partition queues hold the consumer too; the last reference
        // closes it (librdkafka's consumer close: final commit-free revoke
        // and LeaveGroup).
        self.shared.feeds.lock().unwrap().clear();
    }
}

fn split(consumer: &Arc<BaseConsumer<Context>>, shared: &Shared, topic: &str, partition: i32) {
    let mut feeds = shared.feeds.lock().unwrap();
    if feeds.contains_key(&partition) {
        return;
    }
    let Some(mut queue) = consumer.split_partition_queue(topic, partition) else {
        tracing::warn!(topic, partition, "cannot give the partition its own queue");
        return;
    };
    let notify = Arc::new(Notify::new());
    let wake = Arc::clone(&notify);
    queue.set_nonempty_callback(move || wake.notify_one());
    feeds.insert(
        partition,
        Arc::new(Feed {
            queue,
            notify,
            error: Mutex::new(None),
        }),
    );
}

fn poll_loop(
    consumer: &Arc<BaseConsumer<Context>>,
    shared: &Shared,
    topic: &str,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::SeqCst) {
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Ok(m)) => {
                let m = m.detach();
                let partition = m.partition();
                shared
                    .strays
                    .lock()
                    .unwrap()
                    .entry(partition)
                    .or_default()
                    .push_back(m);
                if let Some(feed) = shared.feeds.lock().unwrap().get(&partition) {
                    feed.notify.notify_one();
                }
            }
            Some(Err(e)) => tracing::warn!(topic, "consumer: {e}"),
        }
        let newly: Vec<i32> = std::mem::take(&mut *shared.pending_assigned.lock().unwrap());
        if newly.is_empty() {
            continue;
        }
        for &p in &newly {
            split(consumer, shared, topic, p);
        }
        shared
            .assigned
            .lock()
            .unwrap()
            .extend(newly.iter().copied());
        let event = Assignment::Assigned(newly);
        if consumer.context().events.send(event).is_err() {
            tracing::debug!(topic, "assignment not delivered: nobody listens");
        }
    }
}
