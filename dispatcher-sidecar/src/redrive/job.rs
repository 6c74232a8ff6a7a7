//! Running a redrive job against Kafka: a reader thread scans the DLQ
//! partitions (outside any group) from the floor to the end offsets taken at
//! the start, in offset order, through a bounded channel; the job task
//! filters, skips what was redriven before, writes each copy to the primary
//! topic at the job's rate, and after each small batch's delivery reports
//! marks the batch redriven and moves the floor.
//!
//! Where it runs: on the instance that owns partition 0 of the queue's
//! primary topic (`crate::forward` sends the requests there). A job whose
//! instance loses that partition or stops ends as `failed` with the reason;
//! starting it again skips what was redriven.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::store::{self, floor_consumer, mark_key};
use super::{
    redriven_headers, target_partition, ChunkBits, JobSpec, JobState, PartitionRange,
    RedriveAction, RedriveError, RedriveJob, RedriveRequest, TokenBucket,
};
use crate::api::json::rfc3339_ms;
use crate::config::QueueConfig;
use crate::lease::RetryEnvelope;
use crate::service::ServiceError;

/// How long a Kafka read (watermarks, floors, marks) may take.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(30);
/// DLQ records buffered between the reader thread and the job (with their
/// payloads: at 1 MiB each, 64 MiB at most; librdkafka's own prefetch for
/// the reader is capped at 4 MiB in `store::dlq_reader`).
const CHANNEL_RECORDS: usize = 64;
/// A batch is written (its delivery reports awaited, then its marks) at this
/// many copies, or this long after its first copy.
const BATCH_MAX: usize = 100;
const BATCH_MAX_AGE: Duration = Duration::from_millis(100);
/// A wait for a token at least this long writes the batch meanwhile (a slow
/// job marks each copy as it goes).
const FLUSH_IN_WAIT: Duration = Duration::from_millis(50);
/// Chunks of marks held at once per job (a window of DLQ offsets): 256
/// chunks of 4096 offsets, 128 KiB of bitmap.
const WINDOW_CHUNKS: i64 = 256;
/// How often a running or paused job checks it still owns partition 0.
const OWNER_CHECK: Duration = Duration::from_millis(250);
/// The floors are committed at most this often while a job runs (and at
/// each partition's end and the job's end).
const FLOOR_COMMIT_EVERY: Duration = Duration::from_secs(1);
/// How long a pause, resume or cancel waits for the job to act on it.
const CONTROL_WAIT: Duration = Duration::from_secs(2);

/// The ownership test: does this instance own the queue's partition 0 now?
pub type OwnsPartition0 = Arc<dyn Fn() -> bool + Send + Sync>;

/// Records a redriven copy's location in the message-id index
/// (`Dispatcher::record_location`); a failed write is counted there.
pub type RecordLocation =
    Arc<dyn Fn(RetryEnvelope, crate::trace::Location) -> IndexWrite + Send + Sync>;

/// One index write of [`RecordLocation`].
pub type IndexWrite = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Control {
    Run,
    Pause,
    Cancel,
}

/// One queue's redrive jobs on this instance: at most one active.
pub struct Redriver {
    queue: QueueConfig,
    producer: FutureProducer,
    reader_config: ClientConfig,
    primary_partitions: i32,
    dlq_partitions: i32,
    state_partitions: i32,
    owns: OwnsPartition0,
    index: RecordLocation,
    /// Reads and commits the floors and reads the marks (blocking).
    floors: Arc<Mutex<BaseConsumer>>,
    /// The current or last job.
    current: tokio::sync::Mutex<Option<Arc<Job>>>,
    stop: watch::Receiver<bool>,
}

struct Job {
    status: Mutex<RedriveJob>,
    control: watch::Sender<Control>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Job {
    fn snapshot(&self) -> RedriveJob {
        self.status.lock().unwrap().clone()
    }
}

/// The queue and topic shapes a [`Redriver`] needs.
pub struct RedriverParts {
    pub queue: QueueConfig,
    pub producer: FutureProducer,
    pub reader_config: ClientConfig,
    pub primary_partitions: i32,
    pub dlq_partitions: i32,
    pub state_partitions: i32,
    pub owns: OwnsPartition0,
    /// Tells the message-id index where each redriven copy is.
    pub index: RecordLocation,
    /// Set to true when the dispatcher stops: a running job ends.
    pub stop: watch::Receiver<bool>,
}

fn unavailable(e: impl std::fmt::Display) -> RedriveError {
    RedriveError::Service(ServiceError::Unavailable(e.to_string()))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Redriver {
    pub fn new(parts: RedriverParts) -> anyhow::Result<Redriver> {
        let floors = floor_consumer(&parts.reader_config, &parts.queue)?;
        Ok(Redriver {
            floors: Arc::new(Mutex::new(floors)),
            queue: parts.queue,
            producer: parts.producer,
            reader_config: parts.reader_config,
            primary_partitions: parts.primary_partitions.max(1),
            dlq_partitions: parts.dlq_partitions.max(1),
            state_partitions: parts.state_partitions.max(1),
            owns: parts.owns,
            index: parts.index,
            current: tokio::sync::Mutex::new(None),
            stop: parts.stop,
        })
    }

    /// Starts a job: refused while one runs or is paused, and on an instance
    /// that does not own partition 0.
    pub async fn start(
        self: &Arc<Self>,
        request: RedriveRequest,
    ) -> Result<RedriveJob, RedriveError> {
        let spec = request
            .check()
            .map_err(|m| RedriveError::Service(ServiceError::InvalidArgument(m)))?;
        if !(self.owns)() {
            return Err(RedriveError::NotOwner);
        }
        let mut current = self.current.lock().await;
        if let Some(job) = current.as_ref() {
            let s = job.snapshot();
            if s.state.is_active() {
                return Err(RedriveError::Conflict(format!(
                    "redrive job {} is {} on queue {:?}: one redrive per DLQ at a time \
                     (cancel it, or wait until it is done)",
                    s.id,
                    state_name(s.state),
                    self.queue.name
                )));
            }
        }
        let ranges = self.ranges().await?;
        let id = uuid::Uuid::new_v4().to_string();
        let status = RedriveJob {
            id: id.clone(),
            queue: self.queue.name.clone(),
            state: JobState::Running,
            reason: None,
            filter: spec.filter.clone(),
            rate_per_sec: spec.rate_per_sec,
            max_messages: spec.max_messages,
            scanned: 0,
            matched: 0,
            redriven: 0,
            skipped: 0,
            unreadable: 0,
            remaining: ranges.iter().map(|r| r.end - r.start).sum(),
            started_at: rfc3339_ms(now_ms()),
            finished_at: None,
            first_redriven_at: None,
            last_redriven_at: None,
            partitions: ranges,
        };
        let (control, control_rx) = watch::channel(Control::Run);
        let job = Arc::new(Job {
            status: Mutex::new(status),
            control,
            task: Mutex::new(None),
        });
        tracing::info!(queue = %self.queue.name, job = %id, rate = spec.rate_per_sec,
            filter = ?spec.filter, max = ?spec.max_messages, "redrive job started");
        let run = Run::new(Arc::clone(self), Arc::clone(&job), spec, control_rx);
        *job.task.lock().unwrap() = Some(tokio::spawn(run.run()));
        let snapshot = job.snapshot();
        *current = Some(job);
        Ok(snapshot)
    }

    /// The current or last job on this instance.
    pub async fn status(&self) -> Result<RedriveJob, RedriveError> {
        let job = self.current.lock().await.as_ref().map(|j| j.snapshot());
        match job {
            Some(j) if j.state.is_active() => return Ok(j),
            _ if !(self.owns)() => return Err(RedriveError::NotOwner),
            Some(j) => return Ok(j),
            None => {}
        }
        Err(RedriveError::NoJob(format!(
            "no redrive job has run on queue {:?} since this instance took it over",
            self.queue.name
        )))
    }

    /// Pauses, resumes or cancels the active job; waits (up to two seconds)
    /// until the job acted on it, and answers its state then.
    pub async fn control(&self, action: RedriveAction) -> Result<RedriveJob, RedriveError> {
        let job = self.current.lock().await.clone();
        let active = job.as_ref().is_some_and(|j| j.snapshot().state.is_active());
        if !active && !(self.owns)() {
            return Err(RedriveError::NotOwner);
        }
        let Some(job) = job else {
            return Err(if (self.owns)() {
                RedriveError::NoJob(format!(
                    "no redrive job to {} on queue {:?}",
                    action.name(),
                    self.queue.name
                ))
            } else {
                RedriveError::NotOwner
            });
        };
        let state = job.snapshot().state;
        if !state.is_active() {
            return Err(RedriveError::Conflict(format!(
                "the last redrive job on queue {:?} is {}: nothing to {}",
                self.queue.name,
                state_name(state),
                action.name()
            )));
        }
        let (control, wanted): (Control, fn(JobState) -> bool) = match action {
            RedriveAction::Pause => (Control::Pause, |s| s != JobState::Running),
            RedriveAction::Resume => (Control::Run, |s| s != JobState::Paused),
            RedriveAction::Cancel => (Control::Cancel, |s| !s.is_active()),
        };
        job.control.send_replace(control);
        let deadline = Instant::now() + CONTROL_WAIT;
        loop {
            let s = job.snapshot();
            if wanted(s.state) || Instant::now() >= deadline {
                return Ok(s);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Ends the active job (the dispatcher is stopping) and waits for it.
    pub async fn shutdown(&self) {
        let job = self.current.lock().await.clone();
        let Some(job) = job else { return };
        let task = job.task.lock().unwrap().take();
        if let Some(task) = task {
            if tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .is_err()
            {
                tracing::warn!(queue = %self.queue.name, "the redrive job did not stop within 10 s");
            }
        }
    }

    /// Each DLQ partition's range: from max(log start, floor) to the end.
    async fn ranges(&self) -> Result<Vec<PartitionRange>, RedriveError> {
        let floors = Arc::clone(&self.floors);
        let dlq_topic = self.queue.dlq_topic.clone();
        let partitions = self.dlq_partitions;
        tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<PartitionRange>> {
            let consumer = floors.lock().unwrap();
            let committed = store::read_floors(&consumer, &dlq_topic, partitions, KAFKA_TIMEOUT)?;
            let mut ranges = Vec::new();
            for p in 0..partitions {
                let (low, high) = consumer.fetch_watermarks(&dlq_topic, p, KAFKA_TIMEOUT)?;
                let start = committed.get(&p).copied().unwrap_or(low).max(low).min(high);
                ranges.push(PartitionRange {
                    partition: p,
                    start,
                    end: high,
                    position: start,
                });
            }
            Ok(ranges)
        })
        .await
        .map_err(unavailable)?
        .map_err(|e| unavailable(format!("reading the DLQ's offsets: {e:#}")))
    }
}

fn state_name(s: JobState) -> &'static str {
    match s {
        JobState::Running => "running",
        JobState::Paused => "paused",
        JobState::Cancelled => "cancelled",
        JobState::Done => "done",
        JobState::Failed => "failed",
    }
}

/// One DLQ record as the reader hands it over.
struct DlqRecord {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    headers: Vec<(String, Vec<u8>)>,
}

/// What woke the scan loop.
enum Woke {
    Item(Option<Item>),
    Flush,
    Again,
}

enum Item {
    Record(DlqRecord),
    /// Every record of the partition below its end offset was handed over.
    PartitionEnd(i32),
    Failed(String),
}

/// Scans `ranges` in partition order, each up to its end, into `tx`. Stops
/// when `stop` is set or the job dropped the receiver.
fn read_dlq(
    consumer: BaseConsumer,
    topic: String,
    ranges: Vec<PartitionRange>,
    tx: mpsc::Sender<Item>,
    stop: Arc<AtomicBool>,
) {
    for range in ranges {
        if range.start >= range.end {
            if tx
                .blocking_send(Item::PartitionEnd(range.partition))
                .is_err()
            {
                return;
            }
            continue;
        }
        let mut tpl = TopicPartitionList::new();
        let assigned = tpl
            .add_partition_offset(&topic, range.partition, Offset::Offset(range.start))
            .and_then(|()| consumer.assign(&tpl));
        if let Err(e) = assigned {
            let _ = tx.blocking_send(Item::Failed(format!("reading the DLQ: {e}")));
            return;
        }
        loop {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    // A record fetched for the previous assignment.
                    if m.partition() != range.partition || m.offset() < range.start {
                        continue;
                    }
                    if m.offset() >= range.end {
                        break;
                    }
                    let headers = m
                        .headers()
                        .map(|h| {
                            h.iter()
                                .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                                .collect()
                        })
                        .unwrap_or_default();
                    let record = DlqRecord {
                        partition: m.partition(),
                        offset: m.offset(),
                        key: m.key().map(<[u8]>::to_vec),
                        payload: m.payload().map(<[u8]>::to_vec),
                        headers,
                    };
                    let last = m.offset() + 1 >= range.end;
                    if tx.blocking_send(Item::Record(record)).is_err() {
                        return;
                    }
                    if last {
                        break;
                    }
                }
                Some(Err(e)) => {
                    let _ = tx.blocking_send(Item::Failed(format!("reading the DLQ: {e}")));
                    return;
                }
                None => {
                    // The last offsets may hold no record (control records):
                    // the position tells.
                    let at_end = consumer.position().ok().is_some_and(|tpl| {
                        tpl.find_partition(&topic, range.partition).is_some_and(
                            |e| matches!(e.offset(), Offset::Offset(o) if o >= range.end),
                        )
                    });
                    if at_end {
                        break;
                    }
                }
            }
        }
        if tx
            .blocking_send(Item::PartitionEnd(range.partition))
            .is_err()
        {
            return;
        }
    }
    let _ = consumer.unassign();
}

/// Why a job ended early.
enum Stop {
    Cancelled,
    Failed(String),
    Done(String),
}

/// A copy handed to the producer, whose delivery report is awaited.
/// Records that are not copies are kept in the batch too, in offset order,
/// so the floor moves (or stops) at them only once the copies before them
/// are written.
struct InFlight {
    partition: i32,
    offset: i64,
    message_id: String,
    /// The DLQ copy's envelope, for the index (copies only).
    envelope: Option<RetryEnvelope>,
    what: Batched,
}

enum Batched {
    Copy(DeliveryFuture),
    /// Redriven before: the floor may pass it.
    Skipped,
    /// Not redriven (filtered out or unreadable): the floor stops here.
    Left,
}

/// The floor of one DLQ partition while the job scans it.
struct Floor {
    /// Every record below was redriven (by this job or earlier).
    candidate: i64,
    /// A record at or above `candidate` was not redriven: the floor stays.
    blocked: bool,
    committed: i64,
}

/// The marks of the window being scanned.
struct Window {
    partition: i32,
    chunks: std::ops::Range<i64>,
    bits: HashMap<i64, ChunkBits>,
    dirty: BTreeSet<i64>,
}

struct Run {
    redriver: Arc<Redriver>,
    job: Arc<Job>,
    spec: JobSpec,
    job_id: String,
    control: watch::Receiver<Control>,
    stop: watch::Receiver<bool>,
    bucket: TokenBucket,
    batch: Vec<InFlight>,
    batch_started: Option<Instant>,
    window: Option<Window>,
    floors: HashMap<i32, Floor>,
    last_floor_commit: Instant,
    last_owner_check: Instant,
    /// Copies written or in flight, against `max_messages`.
    taken: u64,
}

impl Run {
    fn new(
        redriver: Arc<Redriver>,
        job: Arc<Job>,
        spec: JobSpec,
        control: watch::Receiver<Control>,
    ) -> Run {
        let (job_id, floors) = {
            let s = job.status.lock().unwrap();
            let floors = s
                .partitions
                .iter()
                .map(|r| {
                    (
                        r.partition,
                        Floor {
                            candidate: r.start,
                            blocked: false,
                            committed: r.start,
                        },
                    )
                })
                .collect();
            (s.id.clone(), floors)
        };
        let stop = redriver.stop.clone();
        Run {
            bucket: TokenBucket::new(spec.rate_per_sec, Instant::now()),
            redriver,
            job,
            spec,
            job_id,
            control,
            stop,
            batch: Vec::new(),
            batch_started: None,
            window: None,
            floors,
            last_floor_commit: Instant::now(),
            last_owner_check: Instant::now(),
            taken: 0,
        }
    }

    fn queue(&self) -> String {
        self.redriver.queue.name.clone()
    }

    fn count(&self, outcome: &'static str, n: u64) {
        metrics::counter!("dispatcher_redrive_messages_total", "queue" => self.queue(),
            "outcome" => outcome)
        .increment(n);
    }

    fn set_gauges(&self) {
        let (state, remaining) = {
            let s = self.job.status.lock().unwrap();
            (s.state, s.remaining)
        };
        metrics::gauge!("dispatcher_redrive_job_state", "queue" => self.queue()).set(state.gauge());
        metrics::gauge!("dispatcher_redrive_remaining", "queue" => self.queue())
            .set(remaining as f64);
    }

    async fn run(mut self) {
        self.set_gauges();
        let ranges = self.job.status.lock().unwrap().partitions.clone();
        let consumer = match store::dlq_reader(&self.redriver.reader_config) {
            Ok(c) => c,
            Err(e) => return self.finish(Stop::Failed(format!("{e:#}"))).await,
        };
        let (tx, mut rx) = mpsc::channel(CHANNEL_RECORDS);
        let reader_stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let topic = self.redriver.queue.dlq_topic.clone();
            let stop = Arc::clone(&reader_stop);
            tokio::task::spawn_blocking(move || read_dlq(consumer, topic, ranges, tx, stop))
        };
        let outcome = self.scan(&mut rx).await;
        reader_stop.store(true, Ordering::SeqCst);
        drop(rx);
        let _ = reader.await;
        let stop = match outcome {
            Ok(()) => Stop::Done(String::new()),
            Err(stop) => stop,
        };
        self.finish(stop).await;
    }

    async fn scan(&mut self, rx: &mut mpsc::Receiver<Item>) -> Result<(), Stop> {
        loop {
            self.gate().await?;
            // Records keep coming while the channel has them: the age of the
            // batch is checked here, not only by the timer below.
            if self.batch_due() {
                self.flush().await?;
            }
            let flush_in = self
                .batch_started
                .map(|t| BATCH_MAX_AGE.saturating_sub(t.elapsed()));
            let woke = tokio::select! {
                item = rx.recv() => Woke::Item(item),
                _ = self.control.changed() => Woke::Again,
                _ = self.stop.changed() => Woke::Again,
                () = sleep_opt(flush_in) => Woke::Flush,
                () = tokio::time::sleep(OWNER_CHECK) => Woke::Again,
            };
            let item = match woke {
                Woke::Item(item) => item,
                Woke::Again => continue,
                Woke::Flush => {
                    self.flush().await?;
                    continue;
                }
            };
            match item {
                None => {
                    self.flush().await?;
                    return Ok(());
                }
                Some(Item::Failed(e)) => {
                    self.flush().await?;
                    return Err(Stop::Failed(e));
                }
                Some(Item::PartitionEnd(p)) => {
                    self.flush().await?;
                    let end = {
                        let mut s = self.job.status.lock().unwrap();
                        let r = s.partitions.iter_mut().find(|r| r.partition == p);
                        let end = r.map(|r| {
                            r.position = r.end;
                            r.end
                        });
                        s.remaining = s.partitions.iter().map(|r| r.end - r.position).sum();
                        end
                    };
                    if let (Some(end), Some(f)) = (end, self.floors.get_mut(&p)) {
                        if !f.blocked {
                            f.candidate = f.candidate.max(end);
                        }
                    }
                    self.commit_floors().await?;
                    self.set_gauges();
                }
                Some(Item::Record(r)) => self.record(r).await?,
            }
        }
    }

    /// Pause, cancel, shutdown and ownership: returns when the job may go
    /// on.
    async fn gate(&mut self) -> Result<(), Stop> {
        loop {
            // A dropped sender (the dispatcher is gone) stops the job too.
            if *self.stop.borrow() || self.stop.has_changed().is_err() {
                return Err(Stop::Failed(
                    "the dispatcher instance running the job stopped; start the job again \
                     (what was redriven is skipped)"
                        .into(),
                ));
            }
            if self.last_owner_check.elapsed() >= OWNER_CHECK {
                self.last_owner_check = Instant::now();
                if !(self.redriver.owns)() {
                    return Err(Stop::Failed(format!(
                        "this instance lost partition 0 of {:?} (redrive jobs run on its owner); \
                         start the job again (what was redriven is skipped)",
                        self.redriver.queue.topic
                    )));
                }
            }
            let control = *self.control.borrow_and_update();
            match control {
                Control::Run => {
                    let was_paused = {
                        let mut s = self.job.status.lock().unwrap();
                        let was = s.state == JobState::Paused;
                        s.state = JobState::Running;
                        was
                    };
                    if was_paused {
                        self.bucket.reset(Instant::now());
                        self.set_gauges();
                        tracing::info!(queue = %self.queue(), job = %self.job_id, "redrive resumed");
                    }
                    return Ok(());
                }
                Control::Cancel => return Err(Stop::Cancelled),
                Control::Pause => {
                    // What was handed to the producer is written and marked
                    // before the job shows paused.
                    self.flush().await?;
                    let was_running = {
                        let mut s = self.job.status.lock().unwrap();
                        let was = s.state == JobState::Running;
                        s.state = JobState::Paused;
                        was
                    };
                    if was_running {
                        self.set_gauges();
                        tracing::info!(queue = %self.queue(), job = %self.job_id, "redrive paused");
                    }
                    tokio::select! {
                        _ = self.control.changed() => {}
                        _ = self.stop.changed() => {}
                        () = tokio::time::sleep(OWNER_CHECK) => {}
                    }
                }
            }
        }
    }

    async fn record(&mut self, r: DlqRecord) -> Result<(), Stop> {
        // Bounds the batch, which also holds the records scanned past while
        // copies are in flight.
        if self.batch.len() >= BATCH_MAX {
            self.flush().await?;
        }
        {
            let mut s = self.job.status.lock().unwrap();
            s.scanned += 1;
            if let Some(range) = s.partitions.iter_mut().find(|x| x.partition == r.partition) {
                range.position = r.offset + 1;
            }
            s.remaining = s.partitions.iter().map(|x| x.end - x.position).sum();
        }
        self.load_window(r.partition, r.offset).await?;
        let already = self
            .window
            .as_ref()
            .and_then(|w| w.bits.get(&ChunkBits::chunk_of(r.offset)))
            .is_some_and(|b| b.get(r.offset));
        if already {
            self.job.status.lock().unwrap().skipped += 1;
            self.count("skipped", 1);
            self.floor_at(&r, Batched::Skipped);
            return Ok(());
        }
        let envelope = match RetryEnvelope::from_headers(&r.headers) {
            Ok(Some(e)) => e,
            _ => {
                self.job.status.lock().unwrap().unreadable += 1;
                self.count("unreadable", 1);
                self.floor_at(&r, Batched::Left);
                return Ok(());
            }
        };
        if !self.spec.matches(&envelope, r.key.as_deref()) {
            self.count("filtered", 1);
            self.floor_at(&r, Batched::Left);
            return Ok(());
        }
        self.job.status.lock().unwrap().matched += 1;
        // The rate: wait for a token, still answering pause and cancel. A
        // batch that is old, or a wait long enough to write it in, is
        // written first (the bucket makes up the time spent, up to a
        // second's worth).
        loop {
            self.gate().await?;
            match self.bucket.take(Instant::now()) {
                None => break,
                Some(wait)
                    if self.batch_due() || (!self.batch.is_empty() && wait >= FLUSH_IN_WAIT) =>
                {
                    self.flush().await?;
                }
                Some(wait) => tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    _ = self.control.changed() => {}
                    _ = self.stop.changed() => {}
                },
            }
        }
        self.send(r, &envelope)?;
        self.taken += 1;
        if self.spec.max_messages.is_some_and(|max| self.taken >= max) {
            // The job ends here: no later record moves the floor.
            self.flush().await?;
            return Err(Stop::Done("max_messages reached".into()));
        }
        if self.batch.len() >= BATCH_MAX {
            self.flush().await?;
        }
        Ok(())
    }

    fn send(&mut self, r: DlqRecord, envelope: &RetryEnvelope) -> Result<(), Stop> {
        let rd = &self.redriver;
        let mut headers = redriven_headers(&r.headers, envelope, &self.job_id, now_ms());
        // The copy carries where the message has been (for a trace).
        headers.push(crate::trace::path_header(
            &r.headers,
            crate::trace::Location {
                kind: crate::trace::LocationKind::Dlq,
                topic: rd.queue.dlq_topic.clone(),
                partition: r.partition,
                offset: r.offset,
                at_ms: envelope.errors.last().map_or(0, |e| e.at_ms),
            },
        ));
        let owned = headers.iter().fold(
            rdkafka::message::OwnedHeaders::new_with_capacity(headers.len()),
            |h, (key, value)| {
                h.insert(rdkafka::message::Header {
                    key,
                    value: Some(value),
                })
            },
        );
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&rd.queue.topic).headers(owned);
        if let Some(p) = target_partition(envelope, &rd.queue.topic, rd.primary_partitions) {
            record = record.partition(p);
        }
        if let Some(k) = &r.key {
            record = record.key(&k[..]);
        }
        if let Some(v) = &r.payload {
            record = record.payload(&v[..]);
        }
        let delivery = rd
            .producer
            .send_result(record)
            .map_err(|(e, _)| Stop::Failed(format!("writing to {:?}: {e}", rd.queue.topic)))?;
        self.batch_started.get_or_insert_with(Instant::now);
        self.batch.push(InFlight {
            partition: r.partition,
            offset: r.offset,
            message_id: envelope.message_id.clone(),
            envelope: Some(envelope.clone()),
            what: Batched::Copy(delivery),
        });
        Ok(())
    }

    /// Awaits the batch's delivery reports, then writes its marks; counts
    /// only what was written.
    async fn flush(&mut self) -> Result<(), Stop> {
        self.batch_started = None;
        let batch = std::mem::take(&mut self.batch);
        let mut failed = None;
        let mut written = 0u64;
        for f in batch {
            let pending = match f.what {
                Batched::Copy(pending) => pending,
                Batched::Skipped => {
                    self.advance_floor(f.partition, f.offset);
                    continue;
                }
                Batched::Left => {
                    self.block_floor(f.partition);
                    continue;
                }
            };
            match pending.await {
                Ok(Ok(delivery)) => {
                    written += 1;
                    if let Some(w) = self.window.as_mut() {
                        if w.partition == f.partition {
                            let chunk = ChunkBits::chunk_of(f.offset);
                            w.bits.entry(chunk).or_default().set(f.offset);
                            w.dirty.insert(chunk);
                        }
                    }
                    self.advance_floor(f.partition, f.offset);
                    tracing::debug!(queue = %self.redriver.queue.name, job = %self.job_id,
                        message_id = %f.message_id, dlq_partition = f.partition,
                        dlq_offset = f.offset, partition = delivery.partition,
                        offset = delivery.offset, "redriven");
                    if let Some(envelope) = f.envelope {
                        // Not awaited here: the index write is counted
                        // (and a failure logged) by the index itself.
                        tokio::spawn((self.redriver.index)(
                            envelope,
                            crate::trace::Location {
                                kind: crate::trace::LocationKind::Redriven,
                                topic: self.redriver.queue.topic.clone(),
                                partition: delivery.partition,
                                offset: delivery.offset,
                                at_ms: delivery.timestamp.to_millis().unwrap_or_else(now_ms),
                            },
                        ));
                    }
                }
                Ok(Err((e, _))) => {
                    self.block_floor(f.partition);
                    failed.get_or_insert(e.to_string());
                }
                Err(_) => {
                    self.block_floor(f.partition);
                    failed.get_or_insert("the producer went away".to_string());
                }
            }
        }
        // Marks first, even after a failed write: what was written must not
        // be redriven again. The counts follow the marks, so a `redriven`
        // the API showed survives a crash.
        let marked = self.write_marks().await;
        if written > 0 {
            let now = rfc3339_ms(now_ms());
            let mut s = self.job.status.lock().unwrap();
            s.redriven += written;
            s.first_redriven_at.get_or_insert_with(|| now.clone());
            s.last_redriven_at = Some(now);
        }
        self.count("redriven", written);
        marked?;
        if let Some(e) = failed {
            self.count("failed", 1);
            return Err(Stop::Failed(format!(
                "writing to {:?}: {e}",
                self.redriver.queue.topic
            )));
        }
        if self.last_floor_commit.elapsed() >= FLOOR_COMMIT_EVERY {
            self.commit_floors().await?;
        }
        self.set_gauges();
        Ok(())
    }

    async fn write_marks(&mut self) -> Result<(), Stop> {
        let Some(w) = self.window.as_mut() else {
            return Ok(());
        };
        if w.dirty.is_empty() {
            return Ok(());
        }
        let rd = &self.redriver;
        let topic = store::state_topic(&rd.queue);
        let partition = w.partition % rd.state_partitions;
        let mut pending = Vec::new();
        for chunk in std::mem::take(&mut w.dirty) {
            let key = mark_key(w.partition, chunk);
            let value = w.bits[&chunk].encode();
            let record = FutureRecord::to(&topic)
                .partition(partition)
                .key(key.as_bytes())
                .payload(&value[..]);
            pending.push(
                rd.producer
                    .send_result(record)
                    .map_err(|(e, _)| e.to_string()),
            );
        }
        for p in pending {
            let result = match p {
                Ok(f) => match f.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err((e, _))) => Err(e.to_string()),
                    Err(_) => Err("the producer went away".to_string()),
                },
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                return Err(Stop::Failed(format!(
                    "writing the redrive marks to {topic:?}: {e}"
                )));
            }
        }
        Ok(())
    }

    /// Makes sure the marks of `offset`'s window of `partition` are loaded
    /// (writing the previous window's first).
    async fn load_window(&mut self, partition: i32, offset: i64) -> Result<(), Stop> {
        let chunk = ChunkBits::chunk_of(offset);
        if self
            .window
            .as_ref()
            .is_some_and(|w| w.partition == partition && w.chunks.contains(&chunk))
        {
            return Ok(());
        }
        self.flush().await?;
        let lo = chunk.div_euclid(WINDOW_CHUNKS) * WINDOW_CHUNKS;
        let chunks = lo..lo + WINDOW_CHUNKS;
        let consumer = Arc::clone(&self.redriver.floors);
        let topic = store::state_topic(&self.redriver.queue);
        let state_partition = partition % self.redriver.state_partitions;
        let range = chunks.clone();
        let bits = tokio::task::spawn_blocking(move || {
            store::load_marks(
                &consumer.lock().unwrap(),
                &topic,
                state_partition,
                partition,
                range,
                KAFKA_TIMEOUT,
            )
        })
        .await
        .map_err(|e| Stop::Failed(e.to_string()))?
        .map_err(|e| Stop::Failed(format!("{e:#}")))?;
        self.window = Some(Window {
            partition,
            chunks,
            bits,
            dirty: BTreeSet::new(),
        });
        Ok(())
    }

    fn advance_floor(&mut self, partition: i32, offset: i64) {
        if let Some(f) = self.floors.get_mut(&partition) {
            if !f.blocked && offset >= f.candidate {
                f.candidate = offset + 1;
            }
        }
    }

    /// A record that is not copied: its effect on the floor now, or after
    /// the copies in flight before it.
    fn floor_at(&mut self, r: &DlqRecord, what: Batched) {
        if !self.batch.is_empty() {
            self.batch.push(InFlight {
                partition: r.partition,
                offset: r.offset,
                message_id: String::new(),
                envelope: None,
                what,
            });
            return;
        }
        match what {
            Batched::Skipped => self.advance_floor(r.partition, r.offset),
            _ => self.block_floor(r.partition),
        }
    }

    /// The batch is older than `BATCH_MAX_AGE`.
    fn batch_due(&self) -> bool {
        self.batch_started
            .is_some_and(|t| t.elapsed() >= BATCH_MAX_AGE)
    }

    fn block_floor(&mut self, partition: i32) {
        if let Some(f) = self.floors.get_mut(&partition) {
            f.blocked = true;
        }
    }

    /// Commits the floors that moved. Called with no batch in flight, so
    /// every record below a floor is written and marked.
    async fn commit_floors(&mut self) -> Result<(), Stop> {
        self.last_floor_commit = Instant::now();
        let moved: Vec<(i32, i64)> = self
            .floors
            .iter()
            .filter(|(_, f)| f.candidate > f.committed)
            .map(|(&p, f)| (p, f.candidate))
            .collect();
        if moved.is_empty() {
            return Ok(());
        }
        let consumer = Arc::clone(&self.redriver.floors);
        let topic = self.redriver.queue.dlq_topic.clone();
        let floors = moved.clone();
        tokio::task::spawn_blocking(move || {
            store::commit_floors(&consumer.lock().unwrap(), &topic, &floors)
        })
        .await
        .map_err(|e| Stop::Failed(e.to_string()))?
        .map_err(|e| Stop::Failed(format!("{e:#}")))?;
        for (p, o) in moved {
            if let Some(f) = self.floors.get_mut(&p) {
                f.committed = o;
            }
        }
        Ok(())
    }

    async fn finish(mut self, stop: Stop) {
        // Copies handed to the producer are written and marked whatever the
        // reason to stop (a failed flush has already taken its batch), so a
        // later job does not redrive them again. The floor never moves past a
        // record whose copy failed.
        let mut stop = stop;
        if let Err(e) = self.flush().await {
            if !matches!(stop, Stop::Failed(_)) {
                stop = e;
            }
        }
        if let Err(e) = self.commit_floors().await {
            if !matches!(stop, Stop::Failed(_)) {
                stop = e;
            }
        }
        let (state, reason) = match stop {
            Stop::Cancelled => (
                JobState::Cancelled,
                Some("cancelled by request".to_string()),
            ),
            Stop::Failed(r) => (JobState::Failed, Some(r)),
            Stop::Done(r) if r.is_empty() => (JobState::Done, None),
            Stop::Done(r) => (JobState::Done, Some(r)),
        };
        let snapshot = {
            let mut s = self.job.status.lock().unwrap();
            s.state = state;
            s.reason = reason;
            s.finished_at = Some(rfc3339_ms(now_ms()));
            s.clone()
        };
        self.set_gauges();
        tracing::info!(queue = %self.queue(), job = %self.job_id, state = state_name(state),
            reason = ?snapshot.reason, scanned = snapshot.scanned, redriven = snapshot.redriven,
            skipped = snapshot.skipped, "redrive job ended");
    }
}

async fn sleep_opt(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}
