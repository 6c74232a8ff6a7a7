//! The operations the dispatcher's APIs expose (issue 7), independent of the
//! transport: the HTTP/JSON routes and the gRPC service both call a
//! [`QueueService`], and the queue runtime implements it over the lease
//! engine and the Kafka layer. Receipts are opaque strings here; only the
//! implementation decodes them.

use std::future::Future;
use std::time::Duration;

use crate::config::QueueConfig;
use crate::redrive::{RedriveAction, RedriveError, RedriveJob, RedriveRequest};
use crate::trace::MessageTrace;

/// At most this many messages in one produce request.
pub const MAX_PRODUCE_MESSAGES: usize = 500;
/// At most this many payload and header bytes in one produce request.
pub const MAX_PRODUCE_BYTES: usize = 1 << 20;
/// At most this many messages in one receive.
pub const MAX_RECEIVE_MESSAGES: u32 = 100;
/// The longest long-poll of a receive.
pub const MAX_RECEIVE_WAIT: Duration = Duration::from_secs(20);
/// The longest consumer id a receive may name.
pub const MAX_CONSUMER_ID_BYTES: usize = 128;

/// One message to enqueue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewMessage {
    /// Stable across the producer's retries; generated (UUID) when absent.
    pub message_id: Option<String>,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
    /// Not delivered before this delay has passed (through the retry tier
    /// whose delay covers it).
    pub delay: Option<Duration>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProduceStatus {
    Accepted,
    /// The message id was accepted within the dedupe window; nothing new
    /// was written, and the partition and offset are the first copy's.
    Duplicate,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProduceResult {
    pub message_id: String,
    pub status: ProduceStatus,
    pub partition: i32,
    pub offset: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceiveRequest {
    /// 1..=MAX_RECEIVE_MESSAGES.
    pub max_messages: u32,
    /// Long-poll: wait up to this long for the first message.
    pub wait: Duration,
    /// The lease; the queue's default when absent. Capped by its maximum
    /// total lease.
    pub lease: Option<Duration>,
    /// The worker's own name for itself (at most [`MAX_CONSUMER_ID_BYTES`]),
    /// kept with the lease and in the failure history of a retried or
    /// dead-lettered message; anonymous when absent.
    pub consumer: Option<String>,
}

/// One leased message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub message_id: String,
    /// Opaque, tamper-evident: names (partition, offset, lease generation).
    pub receipt: String,
    /// Shared with the record the dispatcher holds (no copy per delivery).
    pub key: Option<bytes::Bytes>,
    pub payload: bytes::Bytes,
    /// The producer's headers (the dispatcher's own `dispatcher.*` headers
    /// are not shown).
    pub headers: Vec<(String, Vec<u8>)>,
    /// 1 for a first delivery.
    pub attempt: u32,
    /// When the message was first enqueued (ms since the epoch).
    pub enqueued_at_ms: i64,
    /// Where the original message is in the queue's topic.
    pub partition: i32,
    pub offset: i64,
    /// When this lease runs out (ms since the epoch).
    pub lease_expires_at_ms: i64,
}

/// What became of one receipt in an ack, nack or extend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReceiptOutcome {
    Ok,
    /// A valid receipt of a lease that is over (expired, acked, or leased
    /// again): counted, and nothing changed.
    Stale,
    /// Not a receipt of this queue (garbled or forged).
    Invalid,
    /// The receipt's partition is not owned by this instance now.
    NotOwner,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NackRequest {
    pub receipt: String,
    pub retry_after: Option<Duration>,
    pub error: Option<String>,
    /// Straight to the DLQ.
    pub permanent: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtendResult {
    pub outcome: ReceiptOutcome,
    /// The lease's new end when `outcome` is Ok (capped by the maximum total
    /// lease).
    pub lease_expires_at_ms: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionStats {
    pub partition: i32,
    /// Messages between the commit point and the log end.
    pub depth: i64,
    pub in_flight: u64,
    /// Age of the oldest message not acked (0 when none).
    pub oldest_unacked_age_ms: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub depth: i64,
    pub in_flight: u64,
    /// The maximum over partitions, never an average.
    pub oldest_unacked_age_ms: i64,
    pub retry_depth: i64,
    pub dlq_depth: i64,
    pub dlq_oldest_age_ms: i64,
    /// Deliveries are stopped on this instance (`set_paused`).
    pub paused: bool,
    /// The partitions this instance owns.
    pub partitions: Vec<PartitionStats>,
    /// Owned partitions (of the queue's topic or a retry tier) whose
    /// records cannot be read now: nothing at or after `offset` is
    /// delivered until they can.
    pub stuck_partitions: Vec<StuckPartition>,
    /// Dispatcher instances in the queue's group whose receipts this one
    /// cannot verify (they sign with another `receipt_secret`): acks
    /// between them are refused and their messages come back. Filled in by
    /// the forwarding layer; 0 from the local service.
    pub foreign_secret_members: u32,
}

impl QueueStats {
    /// What an operator must fix about this queue, in words.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.foreign_secret_members > 0 {
            warnings.push(format!(
                "{} instance(s) of this queue's group sign receipts with another receipt_secret: \
                 acks and nacks between them and this one are refused and their messages are \
                 delivered again when their leases run out; give every instance the same \
                 receipt_secret",
                self.foreign_secret_members
            ));
        }
        warnings
    }
}

/// A partition whose fetch fails (`crate::queue::fetch_health`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StuckPartition {
    /// The queue's topic or one of its retry tiers' topics.
    pub topic: String,
    pub partition: i32,
    /// The next offset the dispatcher expects: the record it cannot read is
    /// at or after it.
    pub offset: i64,
    /// The latest error, as the Kafka client reports it.
    pub error: String,
    /// When the errors began.
    pub since_ms: i64,
    /// Errors since then (one per fetch of the partition).
    pub errors: u64,
}

/// A parked key of an ordered queue (issue 8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParkedKeyInfo {
    pub partition: i32,
    pub key: Vec<u8>,
    /// The dead-lettered message the key is parked by.
    pub message_id: String,
    pub parked_at_ms: i64,
    /// Messages of the key in the hold topic, not replayed yet.
    pub held: u64,
    /// `skip`, `redrive`, `gap_cap` or `spill` once released (its hold is
    /// replaying, after the message named by the release if any).
    pub released_by: Option<String>,
}

/// Releases a parked key without a redrive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkipRequest {
    pub partition: i32,
    pub key: Vec<u8>,
    /// The message the key is parked by (as `GET parked` shows it).
    pub message_id: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipOutcome {
    Released,
    NotParked,
    /// The key is parked by another message (`parked` shows which).
    OtherMessage,
    AlreadyReleased,
    /// The partition is not owned by this instance.
    NotOwner,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ServiceError {
    #[error("no queue named {0:?}")]
    UnknownQueue(String),
    #[error("{0}")]
    InvalidArgument(String),
    /// Kafka refused or timed out; the client may retry.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// What the HTTP and gRPC APIs call. One implementation serves every queue
/// of this dispatcher instance.
pub trait QueueService: Send + Sync + 'static {
    fn queues(&self) -> Vec<QueueConfig>;

    fn produce(
        &self,
        queue: &str,
        messages: Vec<NewMessage>,
    ) -> impl Future<Output = Result<Vec<ProduceResult>, ServiceError>> + Send;

    fn receive(
        &self,
        queue: &str,
        request: ReceiveRequest,
    ) -> impl Future<Output = Result<Vec<Delivery>, ServiceError>> + Send;

    /// One outcome per receipt, in order.
    fn ack(
        &self,
        queue: &str,
        receipts: &[String],
    ) -> impl Future<Output = Result<Vec<ReceiptOutcome>, ServiceError>> + Send;

    fn nack(
        &self,
        queue: &str,
        request: NackRequest,
    ) -> impl Future<Output = Result<ReceiptOutcome, ServiceError>> + Send;

    fn extend(
        &self,
        queue: &str,
        receipt: String,
        lease: Duration,
    ) -> impl Future<Output = Result<ExtendResult, ServiceError>> + Send;

    fn stats(&self, queue: &str) -> impl Future<Output = Result<QueueStats, ServiceError>> + Send;

    /// Records the queue's pause state (`true`: paused) where it outlives
    /// the instances (the control topic), so an instance that restarts or
    /// joins later takes it up; applies nothing by itself. An error means
    /// it was not confirmed (a write that timed out may still land, and is
    /// then taken up like any recorded change).
    fn record_paused(
        &self,
        queue: &str,
        paused: bool,
    ) -> impl Future<Output = Result<(), ServiceError>> + Send;

    /// Pauses (`true`) or resumes (`false`) the queue's deliveries on this
    /// instance: while paused, receives (pull and push) lease nothing and
    /// a long poll waits; produce, ack, nack and extend go on. Idempotent.
    /// The public API records the change first (`record_paused`).
    fn set_paused(
        &self,
        queue: &str,
        paused: bool,
    ) -> impl Future<Output = Result<(), ServiceError>> + Send;

    /// An ordered queue's parked keys in the partitions this instance owns.
    fn parked(
        &self,
        queue: &str,
    ) -> impl Future<Output = Result<Vec<ParkedKeyInfo>, ServiceError>> + Send;

    /// Releases a parked key: its held messages are delivered, in order,
    /// before its newer ones. The DLQ record stays.
    fn skip(
        &self,
        queue: &str,
        request: SkipRequest,
    ) -> impl Future<Output = Result<SkipOutcome, ServiceError>> + Send;
    /// Where the message `message_id` is and where it has been (issue 8,
    /// `crate::trace`): its trace in every queue that knows it (in `queue`
    /// alone when given); empty when none does. An id that is not valid is
    /// `InvalidArgument`.
    fn trace(
        &self,
        message_id: &str,
        queue: Option<&str>,
    ) -> impl Future<Output = Result<Vec<MessageTrace>, ServiceError>> + Send;
    /// Starts a redrive job copying the queue's dead letters back to its
    /// topic (`crate::redrive`). One job per DLQ at a time: `Conflict` while
    /// one runs or is paused. Jobs run on the owner of the primary topic's
    /// partition 0 (`NotOwner` elsewhere; `crate::forward` sends it there).
    fn redrive_start(
        &self,
        queue: &str,
        request: RedriveRequest,
    ) -> impl Future<Output = Result<RedriveJob, RedriveError>> + Send;

    /// The current or last redrive job.
    fn redrive_status(
        &self,
        queue: &str,
    ) -> impl Future<Output = Result<RedriveJob, RedriveError>> + Send;

    /// Pauses, resumes or cancels the active redrive job.
    fn redrive_control(
        &self,
        queue: &str,
        action: RedriveAction,
    ) -> impl Future<Output = Result<RedriveJob, RedriveError>> + Send;
}
