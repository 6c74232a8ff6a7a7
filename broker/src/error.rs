//! Errors a request can meet, named after the condition, and the one
//! exhaustive mapping to Kafka error codes. A new variant does not compile
//! until someone decides its code.

use kafka_protocol::ResponseError;

use crate::log::LogError;
use crate::partition::producer_state::ProducerError;
use crate::partition::validate::RecordErrors;

/// Why an operation on one partition failed. Reported per partition.
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error("unknown topic or partition")]
    UnknownTopicOrPartition,
    #[error("corrupt batch: {0}")]
    CorruptMessage(String),
    #[error("invalid record: {0}")]
    InvalidRecord(String),
    /// Records of a client batch that Kafka's LogValidator refuses one by
    /// one (a missing key on a compacted topic, a timestamp out of bounds,
    /// bytes that are not a record), named in ProduceResponse `record_errors`.
    #[error("{0}")]
    RecordsRejected(RecordErrors),
    /// A compressed records section its codec cannot decode. Kafka's
    /// decompressors report this as a plain `KafkaException`, which its
    /// produce path answers with UNKNOWN_SERVER_ERROR; the CRC matched, so
    /// the retriable CORRUPT_MESSAGE would only have the producer resend it.
    #[error("records cannot be decompressed: {0}")]
    UndecodableRecords(String),
    /// Re-encoding a batch to the topic's `compression.type` failed for a
    /// reason other than its size (the encoder itself).
    #[error("records cannot be recompressed: {0}")]
    RecompressionFailed(String),
    #[error("batch of {size} bytes exceeds max.message.bytes {max}")]
    MessageTooLarge { size: usize, max: u32 },
    #[error(transparent)]
    Producer(#[from] ProducerError),
    #[error("offset {requested} is outside [{log_start}, {log_end}]")]
    OffsetOutOfRange {
        requested: i64,
        log_start: i64,
        log_end: i64,
    },
    #[error("in-sync replicas {isr} are fewer than min.insync.replicas {min_isr}")]
    NotEnoughReplicas { isr: usize, min_isr: i32 },
    #[error("in-sync replicas {isr} fell below min.insync.replicas {min_isr} after the append")]
    NotEnoughReplicasAfterAppend { isr: usize, min_isr: i32 },
    /// This node does not lead the partition (or does not host it as the
    /// request requires).
    #[error("this broker is not the leader of the partition")]
    NotLeaderOrFollower,
    /// The request names an older leader epoch than this replica's.
    #[error("the request's leader epoch is older than the replica's")]
    FencedLeaderEpoch,
    /// The request names a newer leader epoch than this replica has seen,
    /// or a replica the partition does not know in this epoch.
    #[error("the request's leader epoch is newer than the replica's")]
    UnknownLeaderEpoch,
    #[error("timed out waiting for the in-sync replicas")]
    RequestTimedOut,
    #[error("unsupported version for this request")]
    UnsupportedVersion,
    #[error("invalid timestamp {0}")]
    InvalidTimestamp(i64),
    #[error("storage failure: {0}")]
    Storage(String),
    /// Transactional records in a Produce request without a transactional
    /// id: Kafka refuses the whole request, every partition with this code.
    #[error("transactional records need the request's transactional id")]
    TransactionalIdAuthorizationFailed,
    /// The transaction coordinator did not confirm the batch's transaction
    /// (KIP-890), or its answer is stale: the code the producer gets.
    #[error("transaction check failed: {reason}")]
    TransactionCheck { code: ResponseError, reason: String },
    /// Kafka's rule: only the broker writes its internal topics.
    #[error("Cannot append to internal topic {0}")]
    InternalTopic(String),
}

impl PartitionError {
    pub fn code(&self) -> i16 {
        let e = match self {
            PartitionError::UnknownTopicOrPartition => ResponseError::UnknownTopicOrPartition,
            PartitionError::CorruptMessage(_) => ResponseError::CorruptMessage,
            PartitionError::InvalidRecord(_) => ResponseError::InvalidRecord,
            PartitionError::RecordsRejected(e) if e.has_timestamp_fault() => {
                ResponseError::InvalidTimestamp
            }
            PartitionError::RecordsRejected(_) => ResponseError::InvalidRecord,
            PartitionError::UndecodableRecords(_) => ResponseError::UnknownServerError,
            PartitionError::RecompressionFailed(_) => ResponseError::UnknownServerError,
            PartitionError::MessageTooLarge { .. } => ResponseError::MessageTooLarge,
            PartitionError::Producer(ProducerError::InvalidProducerEpoch { .. }) => {
                ResponseError::InvalidProducerEpoch
            }
            PartitionError::Producer(ProducerError::OutOfOrderSequence { .. }) => {
                ResponseError::OutOfOrderSequenceNumber
            }
            PartitionError::Producer(ProducerError::InvalidTxnState { .. }) => {
                ResponseError::InvalidTxnState
            }
            PartitionError::Producer(ProducerError::CoordinatorFenced { .. }) => {
                ResponseError::TransactionCoordinatorFenced
            }
            PartitionError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
            PartitionError::NotEnoughReplicas { .. } => ResponseError::NotEnoughReplicas,
            PartitionError::NotEnoughReplicasAfterAppend { .. } => {
                ResponseError::NotEnoughReplicasAfterAppend
            }
            PartitionError::NotLeaderOrFollower => ResponseError::NotLeaderOrFollower,
            PartitionError::FencedLeaderEpoch => ResponseError::FencedLeaderEpoch,
            PartitionError::UnknownLeaderEpoch => ResponseError::UnknownLeaderEpoch,
            PartitionError::RequestTimedOut => ResponseError::RequestTimedOut,
            PartitionError::UnsupportedVersion => ResponseError::UnsupportedVersion,
            PartitionError::InvalidTimestamp(_) => ResponseError::InvalidTimestamp,
            PartitionError::Storage(_) => ResponseError::KafkaStorageError,
            PartitionError::InternalTopic(_) => ResponseError::InvalidTopicException,
            PartitionError::TransactionalIdAuthorizationFailed => {
                ResponseError::TransactionalIdAuthorizationFailed
            }
            PartitionError::TransactionCheck { code, .. } => *code,
        };
        e.code()
    }

    pub fn message(&self) -> Option<String> {
        match self {
            PartitionError::UnknownTopicOrPartition => None,
            other => Some(other.to_string()),
        }
    }
}

impl From<LogError> for PartitionError {
    fn from(e: LogError) -> Self {
        match e {
            LogError::OffsetOutOfRange {
                requested,
                log_start,
                log_end,
            } => PartitionError::OffsetOutOfRange {
                requested: requested.0,
                log_start: log_start.0,
                log_end: log_end.0,
            },
            other => PartitionError::Storage(other.to_string()),
        }
    }
}
