//! The transaction coordinator: Kafka's `TransactionCoordinator` and
//! `TransactionStateManager`, for transaction versions 1 and 2. Under
//! version 1 clients add partitions with AddPartitionsToTxn and EndTxn keeps
//! the producer epoch. Under version 2 (KIP-890 part 2, EndTxn v5) partition
//! leaders and the group coordinator add partitions for the client, and
//! every EndTxn bumps the epoch, so each transaction has its own epoch and a
//! straggler from an earlier one is fenced by the ordinary epoch checks.
//!
//! `TxnMetadata` is one transactional id's state machine (Kafka's
//! `TransactionMetadata`), pure and synchronous: every change is prepared
//! as a new metadata value, written to `__transaction_state` by the runtime
//! (`service.rs`), and installed only once that write is replicated. While
//! a write is in flight the id is `pending`, and every other request for it
//! gets CONCURRENT_TRANSACTIONS, as in Kafka.
//!
//! Invariant: no sockets, no clocks (`now_ms` is an argument), no
//! kafka-protocol message types in this file.

pub mod records;
pub mod service;

use std::collections::{BTreeMap, BTreeSet};

use records::TxnLogValue;

/// Kafka's `TransactionState`, with its stored ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
    Dead,
    PrepareEpochFence,
}

impl TxnState {
    pub fn id(self) -> i8 {
        match self {
            TxnState::Empty => 0,
            TxnState::Ongoing => 1,
            TxnState::PrepareCommit => 2,
            TxnState::PrepareAbort => 3,
            TxnState::CompleteCommit => 4,
            TxnState::CompleteAbort => 5,
            TxnState::Dead => 6,
            TxnState::PrepareEpochFence => 7,
        }
    }

    pub fn from_id(id: i8) -> Option<Self> {
        Some(match id {
            0 => TxnState::Empty,
            1 => TxnState::Ongoing,
            2 => TxnState::PrepareCommit,
            3 => TxnState::PrepareAbort,
            4 => TxnState::CompleteCommit,
            5 => TxnState::CompleteAbort,
            6 => TxnState::Dead,
            7 => TxnState::PrepareEpochFence,
            _ => return None,
        })
    }

    /// The name DescribeTransactions and ListTransactions use.
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
            TxnState::Dead => "Dead",
            TxnState::PrepareEpochFence => "PrepareEpochFence",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        (0..=7)
            .filter_map(Self::from_id)
            .find(|s| s.name().eq_ignore_ascii_case(name))
    }
}

/// The coordinator's answer when a request cannot proceed; mapped to
/// Kafka's error codes by the handlers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TxnError {
    #[error("a state change of this transactional id is in progress")]
    ConcurrentTransactions,
    #[error("the producer has been fenced by a newer epoch")]
    ProducerFenced,
    #[error("the producer id does not belong to this transactional id")]
    InvalidProducerIdMapping,
    #[error("the request is not valid in the transaction's state")]
    InvalidTxnState,
    #[error("the transaction timeout is larger than transaction.max.timeout.ms")]
    InvalidTransactionTimeout,
    #[error("this broker does not coordinate the transactional id")]
    NotCoordinator,
    #[error("the coordinator is loading or has no __transaction_state yet")]
    CoordinatorNotAvailable,
    #[error("the coordinator is loading the transaction state")]
    CoordinatorLoadInProgress,
    #[error("invalid request")]
    InvalidRequest,
    #[error("no transaction state for this transactional id")]
    TransactionalIdNotFound,
    #[error("the partition is not part of the ongoing transaction")]
    TransactionAbortable,
}

/// One outcome per (topic, partition) of an add or a verification.
pub type PartitionResults = BTreeMap<(String, i32), Result<(), TxnError>>;

pub const NO_PRODUCER_ID: i64 = -1;
pub const NO_PRODUCER_EPOCH: i16 = -1;

/// The transaction version from which EndTxn bumps the epoch (Kafka's
/// `TransactionVersion.supportsEpochBump`).
pub const TV2: i16 = 2;

/// Kafka's `TransactionMetadata.isEpochExhausted`: the epoch a fence would
/// bump to must still fit, so a producer id is rotated one short of the max.
pub fn is_epoch_exhausted(epoch: i16) -> bool {
    epoch >= i16::MAX - 1
}

/// One transactional id's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnMetadata {
    pub transactional_id: String,
    pub producer_id: i64,
    pub previous_producer_id: i64,
    pub next_producer_id: i64,
    pub producer_epoch: i16,
    /// The epoch before the last bump, kept so an InitProducerId retried
    /// after a lost response gets the same answer (KIP-360).
    pub last_producer_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    pub partitions: BTreeMap<String, BTreeSet<i32>>,
    pub start_ms: i64,
    pub last_update_ms: i64,
    pub client_transaction_version: i16,
    /// A prepared change is being written; the id is busy until it lands.
    pub pending: bool,
}

impl TxnMetadata {
    /// A new transactional id, not yet written: the first InitProducerId
    /// bumps it to epoch 0.
    pub fn new(transactional_id: &str, producer_id: i64, timeout_ms: i32, now_ms: i64) -> Self {
        TxnMetadata {
            transactional_id: transactional_id.to_string(),
            producer_id,
            previous_producer_id: NO_PRODUCER_ID,
            next_producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
            last_producer_epoch: NO_PRODUCER_EPOCH,
            timeout_ms,
            state: TxnState::Empty,
            partitions: BTreeMap::new(),
            start_ms: -1,
            last_update_ms: now_ms,
            client_transaction_version: 0,
            pending: false,
        }
    }

    pub fn from_value(transactional_id: &str, v: TxnLogValue) -> Self {
        TxnMetadata {
            transactional_id: transactional_id.to_string(),
            producer_id: v.producer_id,
            previous_producer_id: v.previous_producer_id,
            next_producer_id: v.next_producer_id,
            producer_epoch: v.producer_epoch,
            last_producer_epoch: NO_PRODUCER_EPOCH,
            timeout_ms: v.timeout_ms,
            state: v.state,
            partitions: v.partitions,
            start_ms: v.start_ms,
            last_update_ms: v.last_update_ms,
            client_transaction_version: v.client_transaction_version,
            pending: false,
        }
    }

    pub fn to_value(&self) -> TxnLogValue {
        TxnLogValue {
            producer_id: self.producer_id,
            previous_producer_id: self.previous_producer_id,
            next_producer_id: self.next_producer_id,
            producer_epoch: self.producer_epoch,
            timeout_ms: self.timeout_ms,
            state: self.state,
            partitions: if self.state == TxnState::Empty {
                BTreeMap::new()
            } else {
                self.partitions.clone()
            },
            last_update_ms: self.last_update_ms,
            start_ms: self.start_ms,
            client_transaction_version: self.client_transaction_version,
        }
    }

    pub fn partition_count(&self) -> usize {
        self.partitions.values().map(BTreeSet::len).sum()
    }

    pub fn contains(&self, topic: &str, partition: i32) -> bool {
        self.partitions
            .get(topic)
            .is_some_and(|p| p.contains(&partition))
    }

    fn transit(&self, now_ms: i64) -> TxnMetadata {
        let mut next = self.clone();
        next.pending = false;
        next.last_update_ms = now_ms;
        next
    }

    /// InitProducerId for an id with no transaction in flight (Empty or
    /// Complete*): Kafka's `prepareIncrementProducerEpoch`, or a new producer
    /// id when the epoch is exhausted (`prepareProducerIdRotation`, with
    /// `new_producer_id` from the caller). `expected_epoch` is the epoch a
    /// KIP-360 client presents; a retry whose answer was lost gets the same
    /// epoch again.
    pub fn prepare_init(
        &self,
        timeout_ms: i32,
        expected_epoch: Option<i16>,
        new_producer_id: impl FnOnce() -> Option<i64>,
        now_ms: i64,
    ) -> Result<TxnMetadata, TxnError> {
        let mut next = self.transit(now_ms);
        next.timeout_ms = timeout_ms;
        next.state = TxnState::Empty;
        next.partitions.clear();
        next.start_ms = -1;
        if is_epoch_exhausted(self.producer_epoch)
            && expected_epoch.is_none_or(|e| e == self.producer_epoch)
        {
            next.previous_producer_id = self.producer_id;
            next.producer_id = new_producer_id().ok_or(TxnError::CoordinatorNotAvailable)?;
            next.producer_epoch = 0;
            next.last_producer_epoch = if expected_epoch.is_some() {
                self.producer_epoch
            } else {
                NO_PRODUCER_EPOCH
            };
            return Ok(next);
        }
        let bumped = self.producer_epoch.wrapping_add(1);
        let (epoch, last) = match expected_epoch {
            None => (bumped, NO_PRODUCER_EPOCH),
            Some(e) if self.producer_epoch == NO_PRODUCER_EPOCH || e == self.producer_epoch => {
                (bumped, self.producer_epoch)
            }
            Some(e) if e == self.last_producer_epoch => {
                (self.producer_epoch, self.last_producer_epoch)
            }
            Some(_) => return Err(TxnError::ProducerFenced),
        };
        next.producer_epoch = epoch;
        next.last_producer_epoch = last;
        Ok(next)
    }

    /// AddPartitionsToTxn / AddOffsetsToTxn: the transaction becomes (or
    /// stays) Ongoing with these partitions added; it starts now if it was
    /// not ongoing.
    /// `client_version` is the transaction version of the request (0 for
    /// AddPartitionsToTxn v0-3 and AddOffsetsToTxn, 2 for v4+), recorded
    /// as Kafka records it.
    pub fn prepare_add_partitions(
        &self,
        added: &BTreeMap<String, BTreeSet<i32>>,
        client_version: i16,
        now_ms: i64,
    ) -> TxnMetadata {
        let mut next = self.transit(now_ms);
        next.client_transaction_version = client_version;
        if matches!(
            self.state,
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
        ) {
            next.start_ms = now_ms;
            next.partitions.clear();
        }
        next.state = TxnState::Ongoing;
        for (topic, parts) in added {
            next.partitions
                .entry(topic.clone())
                .or_default()
                .extend(parts.iter().copied());
        }
        next
    }

    /// EndTxn (or a coordinator abort) of an Ongoing transaction:
    /// PrepareCommit or PrepareAbort, epoch unchanged under TV1.
    pub fn prepare_end(&self, commit: bool, now_ms: i64) -> TxnMetadata {
        let mut next = self.transit(now_ms);
        next.state = if commit {
            TxnState::PrepareCommit
        } else {
            TxnState::PrepareAbort
        };
        next
    }

    /// The coordinator aborts an Ongoing transaction of a producer it must
    /// fence (a new InitProducerId, or the transaction timed out): Kafka's
    /// `prepareFenceProducerEpoch` followed by the abort, written as one
    /// PrepareAbort at the bumped epoch so the markers fence the old one.
    /// A version 2 transaction's abort bumps once more, as Kafka's does, so
    /// the fenced client's epoch is not mistaken for a retry (`epoch + 1`).
    pub fn prepare_fence_and_abort(&self, now_ms: i64) -> TxnMetadata {
        let mut next = self.prepare_end(false, now_ms);
        let bumps = if self.client_transaction_version >= TV2 {
            2
        } else {
            1
        };
        next.producer_epoch = self.producer_epoch.saturating_add(bumps);
        next.last_producer_epoch = if bumps == 2 {
            self.producer_epoch.saturating_add(1)
        } else {
            NO_PRODUCER_EPOCH
        };
        next
    }

    /// Version 2's PrepareCommit/PrepareAbort (Kafka's
    /// `prepareAbortOrCommit` with an epoch bump): the epoch moves on, and
    /// an exhausted one moves to `next_producer_id` once complete. An abort
    /// with no partitions (`empty`) starts its transaction now.
    fn prepare_end_v2(
        &self,
        commit: bool,
        next_producer_id: i64,
        empty: bool,
        now_ms: i64,
    ) -> TxnMetadata {
        let mut next = self.prepare_end(commit, now_ms);
        next.producer_epoch = self.producer_epoch.saturating_add(1);
        next.last_producer_epoch = self.producer_epoch;
        next.next_producer_id = next_producer_id;
        next.client_transaction_version = TV2;
        if empty {
            next.partitions.clear();
            next.start_ms = now_ms;
        }
        next
    }

    /// Every marker was written: CompleteCommit or CompleteAbort, with no
    /// partitions left.
    /// Under version 2 an exhausted epoch continues as epoch 0 of the
    /// producer id allocated at the Prepare (the client was told so by
    /// EndTxn); the last epoch stays the one the client last used.
    pub fn prepare_complete(&self, now_ms: i64) -> TxnMetadata {
        let mut next = self.transit(now_ms);
        next.state = match self.state {
            TxnState::PrepareCommit => TxnState::CompleteCommit,
            _ => TxnState::CompleteAbort,
        };
        next.partitions.clear();
        if self.client_transaction_version >= TV2 && self.next_producer_id != NO_PRODUCER_ID {
            next.previous_producer_id = self.producer_id;
            next.producer_id = self.next_producer_id;
            next.producer_epoch = 0;
        }
        next.next_producer_id = NO_PRODUCER_ID;
        next
    }

    /// The producer id and epoch a client continues with once this Prepare
    /// is written: EndTxn v5's answer.
    pub fn continuation(&self) -> (i64, i16) {
        if self.next_producer_id != NO_PRODUCER_ID {
            (self.next_producer_id, 0)
        } else {
            (self.producer_id, self.producer_epoch)
        }
    }

    /// Whether an Ongoing transaction has outlived its timeout.
    pub fn timed_out(&self, now_ms: i64) -> bool {
        self.state == TxnState::Ongoing
            && !self.pending
            && self.start_ms >= 0
            && self.start_ms.saturating_add(i64::from(self.timeout_ms)) < now_ms
    }

    /// Whether an idle id may be removed (`transactional.id.expiration.ms`).
    pub fn expired(&self, now_ms: i64, expiration_ms: i64) -> bool {
        matches!(
            self.state,
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
        ) && !self.pending
            && self.last_update_ms.saturating_add(expiration_ms) <= now_ms
    }

    /// Kafka's checks of a client request that names this id's producer
    /// (AddPartitionsToTxn, AddOffsetsToTxn, EndTxn under TV1).
    pub fn check_producer(&self, producer_id: i64, producer_epoch: i16) -> Result<(), TxnError> {
        if self.producer_id != producer_id {
            return Err(TxnError::InvalidProducerIdMapping);
        }
        if self.producer_epoch != producer_epoch {
            return Err(TxnError::ProducerFenced);
        }
        if self.pending {
            return Err(TxnError::ConcurrentTransactions);
        }
        Ok(())
    }
}

/// What EndTxn does for the id's current state (Kafka's `endTransaction`,
/// after the producer checks).
#[derive(Debug, PartialEq, Eq)]
pub enum EndPlan {
    /// Write PrepareCommit/PrepareAbort, then the markers.
    Prepare(TxnMetadata),
    /// Already done (a retry of a completed EndTxn): answer success.
    AlreadyDone,
}

/// Version 1 (EndTxn v0-4): the epoch stays.
pub fn plan_end(meta: &TxnMetadata, commit: bool, now_ms: i64) -> Result<EndPlan, TxnError> {
    match (meta.state, commit) {
        (TxnState::Ongoing, _) => Ok(EndPlan::Prepare(meta.prepare_end(commit, now_ms))),
        (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => {
            Ok(EndPlan::AlreadyDone)
        }
        (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => {
            Err(TxnError::ConcurrentTransactions)
        }
        _ => Err(TxnError::InvalidTxnState),
    }
}

/// Version 2 (EndTxn v5), Kafka's table: a request at the current epoch
/// ends the transaction and bumps the epoch (an abort may end one with no
/// partitions, which a client cannot tell from one whose partitions a
/// leader added); a request at the epoch before (or the last epoch of a
/// rotated producer id) is the retry of one that succeeded, answered with
/// success when its result matches; anything else is fenced or invalid.
/// `new_producer_id` is called when the epoch is exhausted.
pub fn plan_end_v2(
    meta: &TxnMetadata,
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
    new_producer_id: impl FnOnce() -> Option<i64>,
    now_ms: i64,
) -> Result<EndPlan, TxnError> {
    let retry_on_overflow = meta.previous_producer_id == producer_id
        && producer_epoch == i16::MAX - 1
        && meta.producer_epoch == 0;
    let retry_on_bump = producer_epoch != i16::MAX && meta.producer_epoch == producer_epoch + 1;
    // Kafka 4.4 checks for a state change in progress first, whatever the
    // producer and epoch: a write, or a Prepare state, whose markers are
    // always in flight (Kafka's pending CompleteCommit/CompleteAbort). The
    // client retries, and by then the transaction is complete: an abort at
    // the new epoch right after a commit's answer waits, rather than being
    // told it is fenced.
    if meta.pending || matches!(meta.state, TxnState::PrepareCommit | TxnState::PrepareAbort) {
        return Err(TxnError::ConcurrentTransactions);
    }
    if meta.producer_id != producer_id && !retry_on_overflow {
        return Err(TxnError::InvalidProducerIdMapping);
    }
    let current = meta.producer_id == producer_id && meta.producer_epoch == producer_epoch;
    let valid = match meta.state {
        TxnState::CompleteCommit | TxnState::CompleteAbort => {
            retry_on_bump || retry_on_overflow || current
        }
        _ => current,
    };
    if !valid {
        return Err(TxnError::ProducerFenced);
    }
    let retry = retry_on_bump || retry_on_overflow;
    let prepare = |empty: bool| {
        let next_id = if is_epoch_exhausted(meta.producer_epoch) {
            new_producer_id().ok_or(TxnError::CoordinatorNotAvailable)?
        } else {
            NO_PRODUCER_ID
        };
        Ok(EndPlan::Prepare(
            meta.prepare_end_v2(commit, next_id, empty, now_ms),
        ))
    };
    match (meta.state, commit) {
        (TxnState::Ongoing, _) => prepare(false),
        (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) if retry => {
            Ok(EndPlan::AlreadyDone)
        }
        (TxnState::CompleteCommit | TxnState::CompleteAbort | TxnState::Empty, false) if !retry => {
            prepare(true)
        }
        _ => Err(TxnError::InvalidTxnState),
    }
}

/// Kafka's `handleVerifyPartitionsInTransaction` (AddPartitionsToTxn v4+
/// with `verify_only`, KIP-890 part 1): whether each partition is in the
/// producer's ongoing transaction; TRANSACTION_ABORTABLE for one that is
/// not, so the leader refuses a batch that would hang.
pub fn verify_partitions(
    meta: &TxnMetadata,
    producer_id: i64,
    producer_epoch: i16,
    partitions: &BTreeMap<String, BTreeSet<i32>>,
) -> Result<PartitionResults, TxnError> {
    if meta.producer_id != producer_id {
        return Err(TxnError::InvalidProducerIdMapping);
    }
    if meta.producer_epoch != producer_epoch {
        return Err(TxnError::ProducerFenced);
    }
    if matches!(meta.state, TxnState::PrepareCommit | TxnState::PrepareAbort) {
        return Err(TxnError::ConcurrentTransactions);
    }
    Ok(partitions
        .iter()
        .flat_map(|(t, ps)| ps.iter().map(move |p| (t.clone(), *p)))
        .map(|(t, p)| {
            let ok = meta.state == TxnState::Ongoing && meta.contains(&t, p);
            let r = if ok {
                Ok(())
            } else {
                Err(TxnError::TransactionAbortable)
            };
            ((t, p), r)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(list: &[(&str, i32)]) -> BTreeMap<String, BTreeSet<i32>> {
        let mut m: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
        for (t, p) in list {
            m.entry(t.to_string()).or_default().insert(*p);
        }
        m
    }

    fn initialized() -> TxnMetadata {
        TxnMetadata::new("tx", 100, 60_000, 0)
            .prepare_init(60_000, None, || None, 1)
            .unwrap()
    }

    #[test]
    fn the_first_init_is_epoch_zero_and_each_init_bumps_it() {
        let m = initialized();
        assert_eq!(
            (m.producer_id, m.producer_epoch, m.state),
            (100, 0, TxnState::Empty)
        );
        let again = m.prepare_init(60_000, None, || None, 2).unwrap();
        assert_eq!(again.producer_epoch, 1);
    }

    #[test]
    fn a_kip360_retry_gets_the_same_epoch_and_a_stale_one_is_fenced() {
        let m = initialized();
        let bumped = m.prepare_init(60_000, Some(0), || None, 2).unwrap();
        assert_eq!((bumped.producer_epoch, bumped.last_producer_epoch), (1, 0));
        // The answer was lost; the client retries with the epoch it had.
        let retry = bumped.prepare_init(60_000, Some(0), || None, 3).unwrap();
        assert_eq!(retry.producer_epoch, 1);
        assert_eq!(
            bumped.prepare_init(60_000, Some(7), || None, 3),
            Err(TxnError::ProducerFenced)
        );
    }

    #[test]
    fn an_exhausted_epoch_rotates_the_producer_id() {
        let mut m = initialized();
        m.producer_epoch = i16::MAX - 1;
        let next = m.prepare_init(60_000, None, || Some(555), 2).unwrap();
        assert_eq!(
            (
                next.producer_id,
                next.producer_epoch,
                next.previous_producer_id
            ),
            (555, 0, 100)
        );
    }

    #[test]
    fn a_transaction_runs_from_ongoing_through_prepare_to_complete() {
        let m = initialized();
        let ongoing = m.prepare_add_partitions(&parts(&[("a", 0)]), 0, 10);
        assert_eq!((ongoing.state, ongoing.start_ms), (TxnState::Ongoing, 10));
        let more = ongoing.prepare_add_partitions(&parts(&[("a", 1), ("b", 0)]), 0, 20);
        assert_eq!((more.partition_count(), more.start_ms), (3, 10));
        let EndPlan::Prepare(prep) = plan_end(&more, true, 30).unwrap() else {
            panic!("expected a prepare")
        };
        assert_eq!(
            (prep.state, prep.producer_epoch),
            (TxnState::PrepareCommit, 0)
        );
        assert_eq!(
            plan_end(&prep, true, 31),
            Err(TxnError::ConcurrentTransactions)
        );
        assert_eq!(plan_end(&prep, false, 31), Err(TxnError::InvalidTxnState));
        let done = prep.prepare_complete(40);
        assert_eq!(
            (done.state, done.partition_count()),
            (TxnState::CompleteCommit, 0)
        );
        assert_eq!(plan_end(&done, true, 41), Ok(EndPlan::AlreadyDone));
        assert_eq!(plan_end(&done, false, 41), Err(TxnError::InvalidTxnState));
        // The next transaction starts afresh.
        let next = done.prepare_add_partitions(&parts(&[("c", 0)]), 0, 50);
        assert_eq!((next.partition_count(), next.start_ms), (1, 50));
    }

    #[test]
    fn ending_an_empty_transaction_is_an_invalid_state() {
        assert_eq!(
            plan_end(&initialized(), true, 5),
            Err(TxnError::InvalidTxnState)
        );
    }

    #[test]
    fn a_fencing_abort_bumps_the_epoch_the_markers_carry() {
        let ongoing = initialized().prepare_add_partitions(&parts(&[("a", 0)]), 0, 10);
        let fence = ongoing.prepare_fence_and_abort(20);
        assert_eq!(
            (fence.state, fence.producer_epoch),
            (TxnState::PrepareAbort, 1)
        );
        assert_eq!(fence.check_producer(100, 0), Err(TxnError::ProducerFenced));
    }

    #[test]
    fn producer_checks_name_the_right_error() {
        let mut m = initialized();
        assert_eq!(
            m.check_producer(101, 0),
            Err(TxnError::InvalidProducerIdMapping)
        );
        assert_eq!(m.check_producer(100, 3), Err(TxnError::ProducerFenced));
        m.pending = true;
        assert_eq!(
            m.check_producer(100, 0),
            Err(TxnError::ConcurrentTransactions)
        );
    }

    #[test]
    fn timeouts_and_expiry_look_at_the_right_states() {
        let ongoing = initialized().prepare_add_partitions(&parts(&[("a", 0)]), 0, 1_000);
        assert!(!ongoing.timed_out(61_000));
        assert!(ongoing.timed_out(61_001));
        assert!(!ongoing.expired(10_000_000, 1_000));
        let done = ongoing.prepare_end(true, 2_000).prepare_complete(3_000);
        assert!(done.expired(4_000, 1_000));
        assert!(!done.expired(3_999, 1_000));
    }

    fn ongoing_v2() -> TxnMetadata {
        initialized().prepare_add_partitions(&parts(&[("a", 0)]), TV2, 10)
    }

    fn prepared(plan: Result<EndPlan, TxnError>) -> TxnMetadata {
        match plan {
            Ok(EndPlan::Prepare(m)) => m,
            other => panic!("expected a prepare, got {other:?}"),
        }
    }

    #[test]
    fn a_version_2_end_bumps_the_epoch_and_a_retry_at_the_old_epoch_succeeds() {
        let prep = prepared(plan_end_v2(&ongoing_v2(), 100, 0, true, || None, 20));
        assert_eq!(
            (prep.state, prep.producer_epoch, prep.last_producer_epoch),
            (TxnState::PrepareCommit, 1, 0)
        );
        assert_eq!(prep.continuation(), (100, 1));
        // While the markers are written, every EndTxn waits, as in Kafka
        // 4.4: a retry at the old epoch, and the next transaction's end at
        // the new one (franz-go aborts an empty transaction right after a
        // commit's answer; PRODUCER_FENCED there would be fatal to it).
        for (epoch, commit) in [(0, true), (0, false), (1, true), (1, false), (7, true)] {
            assert_eq!(
                plan_end_v2(&prep, 100, epoch, commit, || None, 21),
                Err(TxnError::ConcurrentTransactions),
                "epoch {epoch}, commit {commit}"
            );
        }
        let done = prep.prepare_complete(30);
        assert_eq!(
            (done.state, done.producer_epoch),
            (TxnState::CompleteCommit, 1)
        );
        assert_eq!(
            plan_end_v2(&done, 100, 0, true, || None, 31),
            Ok(EndPlan::AlreadyDone)
        );
        assert_eq!(
            plan_end_v2(&done, 100, 0, false, || None, 31),
            Err(TxnError::InvalidTxnState)
        );
        // At the current epoch, a commit of nothing is invalid and an abort
        // of nothing bumps the epoch again.
        assert_eq!(
            plan_end_v2(&done, 100, 1, true, || None, 31),
            Err(TxnError::InvalidTxnState)
        );
        let empty_abort = prepared(plan_end_v2(&done, 100, 1, false, || None, 32));
        assert_eq!(
            (
                empty_abort.state,
                empty_abort.producer_epoch,
                empty_abort.partition_count(),
                empty_abort.start_ms
            ),
            (TxnState::PrepareAbort, 2, 0, 32)
        );
        assert_eq!(
            plan_end_v2(&done, 100, 5, false, || None, 31),
            Err(TxnError::ProducerFenced)
        );
    }

    #[test]
    fn a_version_2_end_at_an_exhausted_epoch_continues_on_a_new_producer_id() {
        let mut m = ongoing_v2();
        m.producer_epoch = i16::MAX - 1;
        let prep = prepared(plan_end_v2(&m, 100, i16::MAX - 1, true, || Some(777), 20));
        // The markers fence the old id at the maximum epoch.
        assert_eq!((prep.producer_id, prep.producer_epoch), (100, i16::MAX));
        assert_eq!(prep.continuation(), (777, 0));
        let done = prep.prepare_complete(30);
        assert_eq!(
            (
                done.producer_id,
                done.producer_epoch,
                done.previous_producer_id,
                done.next_producer_id
            ),
            (777, 0, 100, NO_PRODUCER_ID)
        );
        assert_eq!(
            plan_end_v2(&done, 100, i16::MAX - 1, true, || None, 31),
            Ok(EndPlan::AlreadyDone)
        );
        assert_eq!(
            plan_end_v2(&done, 101, 0, true, || None, 31),
            Err(TxnError::InvalidProducerIdMapping)
        );
    }

    #[test]
    fn fencing_a_version_2_transaction_skips_the_epoch_a_retry_would_use() {
        let fence = ongoing_v2().prepare_fence_and_abort(20);
        assert_eq!(fence.producer_epoch, 2);
        let done = fence.prepare_complete(30);
        // The fenced client (epoch 0) is not taken for a retry at epoch 1.
        assert_eq!(
            plan_end_v2(&done, 100, 0, false, || None, 31),
            Err(TxnError::ProducerFenced)
        );
    }

    #[test]
    fn verification_names_partitions_outside_the_transaction() {
        let m = ongoing_v2();
        let checked = verify_partitions(&m, 100, 0, &parts(&[("a", 0), ("a", 1)])).unwrap();
        assert_eq!(checked[&("a".to_string(), 0)], Ok(()));
        assert_eq!(
            checked[&("a".to_string(), 1)],
            Err(TxnError::TransactionAbortable)
        );
        assert_eq!(
            verify_partitions(&m, 100, 1, &parts(&[("a", 0)])),
            Err(TxnError::ProducerFenced)
        );
        let done = initialized();
        assert_eq!(
            verify_partitions(&done, 100, 0, &parts(&[("a", 0)])).unwrap()[&("a".to_string(), 0)],
            Err(TxnError::TransactionAbortable)
        );
    }

    #[test]
    fn states_round_trip_their_ids_and_names() {
        for id in 0..=7 {
            let s = TxnState::from_id(id).unwrap();
            assert_eq!(s.id(), id);
            assert_eq!(TxnState::from_name(s.name()), Some(s));
        }
        assert_eq!(TxnState::from_id(8), None);
    }
}
