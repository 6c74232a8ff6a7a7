//! The lease engine: per-partition work-queue state over an offset log
//! (issue 7; seed 000 appendix A.1).
//!
//! Pure logic: no I/O, no async, no clock. Every operation takes `now_ms`, and
//! every state change the next owner of the partition must know comes out as a
//! [`LeaseEvent`] ([`PartitionLeases::drain_events`]) for the caller to write,
//! in order, to the compacted ack-log topic. An ack, a nack or a route must
//! be written before the client hears of it; a lease need not be (a lease
//! lost with its owner only means a redelivery, and the generation rule
//! below keeps its receipt stale), and the ownership's generation must be
//! written before the first lease.
//!
//! Failure path: a lease that expires, a nack, or a message forced out by the
//! gap cap becomes a [`Failure`] with a [`Route`] (a retry tier and its due
//! time, or the DLQ). The offset then waits in the "pending route" state until
//! the caller has produced the copy ([`RetryEnvelope`]) and calls
//! [`PartitionLeases::routed`], which acks it here: the copy carries the
//! obligation. A retry tier's partition runs the same engine; its messages
//! come in with the attempt their envelope names.
//!
//! Ordered queues (issue 8): the caller (`queue::ordered`) filters
//! [`Available`] candidates by key before [`PartitionLeases::lease`] and
//! learns from every ack, [`Failure`] and expiry which offset (so which key)
//! is released. Its one hook here is [`PartitionLeases::retry_in_place`]: an
//! ordered keyed message's failure is retried in its own partition (its key
//! stays busy) rather than routed to a tier.

mod acked;
mod envelope;
mod events;
mod inspect;
mod receipt;

pub use envelope::{EnvelopeError, FailureRecord, RetryEnvelope, HEADER_PREFIX};
pub use events::{
    decode_record, encode_record, AckLogRecord, EventDecodeError, LeaseEvent, LeasedRun,
    LEASE_BATCH_RING,
};
pub use inspect::OffsetState;
pub use receipt::{Receipt, ReceiptCodec, ReceiptError};

use std::collections::{btree_map, BTreeMap, BTreeSet};

use acked::AckedRanges;

/// Error strings kept in failures, ack-log events and envelopes are cut to
/// this many bytes (at a char boundary): a handler's error is not a payload.
pub const MAX_ERROR_BYTES: usize = 1024;

/// The generation of a lease: the ownership generation of the partition's
/// owner that granted it. Each new owner takes the generation after every
/// one in the ack log ([`PartitionLeases::rebuild`]) and writes it before it
/// leases anything, so its generation differs from every earlier owner's,
/// including one whose lease events never reached the ack log (the runtime
/// does not wait for them before answering a receive).
///
/// One generation serves all of an ownership's leases because an owner
/// leases an offset at most once: once leased, an offset stays in flight,
/// waiting for its route, acked, or below the commit point until the owner
/// goes. So (offset, generation) names one lease, and a receipt from an
/// earlier owner is stale even for an offset leased again. Compared with
/// serial-number arithmetic where order matters, so the u32 may wrap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Generation(pub u32);

/// One partition of one of a queue's topics. `topic` is the caller's index
/// of the topic within the queue (say 0 for the source topic and n for the
/// n-th retry tier): receipts and ack-log keys carry it, so partition 0 of
/// the source and partition 0 of a tier are never confused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueuePartition {
    pub topic: u16,
    pub partition: i32,
}

impl std::fmt::Display for QueuePartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}

/// A consumer, as a small number the caller maps to its consumer ids (keeps a
/// lease entry small).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConsumerSlot(pub u32);

/// A delivery attempt, 1-based. Messages of the source topic are at attempt
/// 1; a retry tier's copy carries the attempt it is delivered as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attempt(pub u16);

impl Attempt {
    pub const FIRST: Attempt = Attempt(1);

    pub fn next(self) -> Attempt {
        Attempt(self.0.saturating_add(1))
    }
}

/// Lease engine settings (issue 7 defaults).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Lease granted when the consumer names none.
    pub lease_ms: i64,
    /// A lease is never extended past its first grant plus this.
    pub max_total_lease_ms: i64,
    /// Delay of each retry tier, ascending; failed attempt n goes to tier n-1
    /// (the last tier for later attempts).
    pub retry_tiers_ms: Vec<i64>,
    /// After this many failed attempts a message goes to the DLQ.
    pub max_attempts: u16,
    /// Largest distance between the commit point and the highest offset
    /// leased or acked. Bounds the acked-above-commit state and the in-flight
    /// table, and is the size of the ack-log key ring.
    pub gap_cap: u32,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            lease_ms: 60_000,
            max_total_lease_ms: 3_600_000,
            retry_tiers_ms: vec![10_000, 60_000, 600_000, 3_600_000],
            max_attempts: 5,
            gap_cap: 100_000,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseConfigError {
    #[error("lease_ms must be positive, got {0}")]
    LeaseNotPositive(i64),
    #[error("max_total_lease_ms ({max}) must be at least lease_ms ({lease}) and fit in u32")]
    MaxTotalLease { max: i64, lease: i64 },
    #[error("retry_tiers_ms must be non-empty, positive and ascending")]
    RetryTiers,
    #[error("max_attempts must be at least 1")]
    MaxAttempts,
    #[error("gap_cap must be at least 1")]
    GapCap,
}

impl LeaseConfig {
    pub fn validate(&self) -> Result<(), LeaseConfigError> {
        if self.lease_ms <= 0 {
            return Err(LeaseConfigError::LeaseNotPositive(self.lease_ms));
        }
        if self.max_total_lease_ms < self.lease_ms || self.max_total_lease_ms > i64::from(u32::MAX)
        {
            return Err(LeaseConfigError::MaxTotalLease {
                max: self.max_total_lease_ms,
                lease: self.lease_ms,
            });
        }
        let tiers = &self.retry_tiers_ms;
        if tiers.is_empty() || tiers[0] <= 0 || tiers.windows(2).any(|w| w[0] > w[1]) {
            return Err(LeaseConfigError::RetryTiers);
        }
        if self.max_attempts == 0 {
            return Err(LeaseConfigError::MaxAttempts);
        }
        if self.gap_cap == 0 {
            return Err(LeaseConfigError::GapCap);
        }
        Ok(())
    }
}

/// One in-flight lease. 24 bytes: the in-flight table is the state that
/// scales with load (see `tests/lease_memory.rs` for the per-lease bound).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Lease {
    expiry_ms: i64,
    /// From `expiry_ms` to the end of the maximum total lease; fits in a u32
    /// because `validate` caps `max_total_lease_ms`.
    deadline_after_expiry_ms: u32,
    generation: Generation,
    consumer: ConsumerSlot,
    attempt: Attempt,
    /// The lease-batch slot whose ack-log record holds this lease.
    batch: u16,
}

impl Lease {
    fn deadline_ms(&self) -> i64 {
        self.expiry_ms + i64::from(self.deadline_after_expiry_ms)
    }
}

/// A message the caller read from the log and offers for leasing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Available {
    pub offset: i64,
    /// The attempt this delivery is (from the envelope on a retry tier).
    pub attempt: Attempt,
    /// On a retry tier, the envelope's due time: the message is not leased
    /// before it.
    pub due_ms: Option<i64>,
}

impl Available {
    /// A message of the source topic: first attempt, due at once.
    pub fn first(offset: i64) -> Self {
        Available {
            offset,
            attempt: Attempt::FIRST,
            due_ms: None,
        }
    }
}

/// A lease handed out: encode `receipt` with a [`ReceiptCodec`] for the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub receipt: Receipt,
    pub expiry_ms: i64,
    pub attempt: Attempt,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extended {
    pub expiry_ms: i64,
    /// The consumer asked for more than the maximum total lease allows.
    pub capped: bool,
}

/// Where a failed message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Copy to retry tier `tier` (index into `retry_tiers_ms`); its consumer
    /// releases the copy at `due_ms`.
    RetryTier {
        tier: usize,
        due_ms: i64,
    },
    Dlq,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureCause {
    Expired,
    Nacked,
    /// Nacked as permanent: straight to the DLQ.
    Permanent,
    /// Forced out because the gap above the commit point reached the cap.
    GapCap,
}

/// A failed delivery and the routing decision for it. The caller copies the
/// message to `route` (with `attempt.next()` on a retry tier, and `error`
/// appended to the history), then calls [`PartitionLeases::routed`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub offset: i64,
    /// The attempt that failed.
    pub attempt: Attempt,
    /// Who held the lease (for the history a DLQ message carries).
    pub consumer: ConsumerSlot,
    pub cause: FailureCause,
    pub route: Route,
    pub at_ms: i64,
    pub error: String,
}

/// A lease that was in flight when the previous owner stopped. Its message is
/// leasable again here (with a new generation); the caller re-delivers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpiredLease {
    pub offset: i64,
    pub generation: Generation,
    pub attempt: Attempt,
    pub consumer: ConsumerSlot,
}

/// What [`PartitionLeases::rebuild`] restores.
#[derive(Debug)]
pub struct Rebuilt {
    pub leases: PartitionLeases,
    /// In flight at the crash: treated as expired, leasable again.
    pub expired: Vec<ExpiredLease>,
    /// Failed but not confirmed routed: copy them again (the copy may exist
    /// already; delivery is at least once), then call `routed`.
    pub pending_routes: Vec<Failure>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    #[error("receipt names partition {receipt}, this is partition {owned}")]
    WrongPartition {
        receipt: QueuePartition,
        owned: QueuePartition,
    },
    #[error("stale receipt: offset {offset} is not leased")]
    StaleReceipt { offset: i64 },
    #[error("stale receipt: offset {offset} is leased at another generation")]
    StaleGeneration { offset: i64 },
    #[error("offset {offset} has no failure waiting to be routed")]
    NotPendingRoute { offset: i64 },
}

/// Plain counters; the runtime exports them as metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseCounters {
    /// Receipts for an offset that is leased at another generation.
    pub stale_generation: u64,
    /// Receipts for an offset that is not leased at all (acked, expired, routed).
    pub stale_receipt: u64,
    pub expired: u64,
    pub nacked: u64,
    pub dead_lettered: u64,
    pub gap_forced: u64,
    pub extend_capped: u64,
}

/// Lease state of one owned partition.
#[derive(Debug)]
pub struct PartitionLeases {
    partition: QueuePartition,
    config: LeaseConfig,
    /// Lowest offset not done: everything below is acked or routed.
    committed: i64,
    /// One past the highest offset leased, acked or known absent.
    head: i64,
    in_flight: BTreeMap<i64, Lease>,
    /// (expiry_ms, offset) of every in-flight lease, for `expire`.
    by_expiry: BTreeSet<(i64, i64)>,
    acked: AckedRanges,
    /// Failed offsets whose copy the caller has not confirmed yet.
    pending: BTreeMap<i64, Failure>,
    /// This ownership's generation, carried by every lease it grants.
    generation: Generation,
    /// The lease-batch slot the next `lease` call writes its record under,
    /// of `batch_ring`.
    next_batch: u16,
    batch_ring: u32,
    /// The in-flight offsets each lease-batch slot's latest record holds.
    /// Reusing a slot rewrites its live leases into the new record, so
    /// compaction never drops the only record of a live lease.
    batch_live: BTreeMap<u16, Vec<i64>>,
    events: Vec<LeaseEvent>,
    counters: LeaseCounters,
}

impl PartitionLeases {
    /// Starts a partition with nothing in flight at `committed` (the group's
    /// committed offset).
    pub fn new(
        partition: QueuePartition,
        config: LeaseConfig,
        committed: i64,
    ) -> Result<Self, LeaseConfigError> {
        config.validate()?;
        Ok(PartitionLeases {
            partition,
            config,
            committed,
            head: committed,
            in_flight: BTreeMap::new(),
            by_expiry: BTreeSet::new(),
            acked: AckedRanges::default(),
            pending: BTreeMap::new(),
            generation: Generation(0),
            next_batch: 0,
            batch_ring: LEASE_BATCH_RING,
            batch_live: BTreeMap::new(),
            events: Vec::new(),
            counters: LeaseCounters::default(),
        })
    }

    pub fn partition(&self) -> QueuePartition {
        self.partition
    }

    /// A smaller lease-batch ring, so tests reuse slots.
    #[cfg(test)]
    pub(crate) fn set_batch_ring(&mut self, ring: u16) {
        assert!(ring > 0);
        self.batch_ring = u32::from(ring);
        self.next_batch = 0;
    }

    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// The commit point: the offset to commit to the consumer group (once
    /// the events that moved it are written).
    pub fn committed_offset(&self) -> i64 {
        self.committed
    }

    pub fn in_flight_len(&self) -> usize {
        self.in_flight.len()
    }

    pub fn pending_route_len(&self) -> usize {
        self.pending.len()
    }

    /// Runs of acked offsets above the commit point (its memory, in entries).
    pub fn acked_run_count(&self) -> usize {
        self.acked.run_count()
    }

    pub fn counters(&self) -> LeaseCounters {
        self.counters
    }

    /// The events produced since the last call, in order, for the ack log
    /// (with [`encode_record`]); see the module documentation for which must
    /// be acked before the client is answered.
    pub fn drain_events(&mut self) -> Vec<LeaseEvent> {
        std::mem::take(&mut self.events)
    }

    /// Encodes one of this partition's events for the ack-log topic.
    pub fn encode(&self, event: &LeaseEvent) -> AckLogRecord {
        encode_record(self.partition, self.config.gap_cap, event)
    }

    /// First offset beyond the window nothing may be leased in.
    fn window_end(&self) -> i64 {
        self.committed + i64::from(self.config.gap_cap)
    }

    /// Leases up to `max_n` of `candidates` (messages read from the log, in
    /// offset order) to `consumer` for `lease_ms` (clamped to the maximum
    /// total lease). Skips offsets not yet due, below the commit point, in
    /// flight, acked, waiting to be routed, or beyond the gap-cap window.
    pub fn lease(
        &mut self,
        candidates: impl IntoIterator<Item = Available>,
        max_n: usize,
        consumer: ConsumerSlot,
        lease_ms: i64,
        now_ms: i64,
    ) -> Vec<Grant> {
        let lease_ms = lease_ms.clamp(1, self.config.max_total_lease_ms);
        let deadline_ms = now_ms + self.config.max_total_lease_ms;
        let window_end = self.window_end();
        let batch = self.next_batch;
        let mut grants = Vec::new();
        for Available {
            offset,
            attempt,
            due_ms,
        } in candidates
        {
            if grants.len() >= max_n {
                break;
            }
            // Not `break`: copies from several producers' clocks are only
            // roughly in due order.
            if due_ms.is_some_and(|due_ms| due_ms > now_ms)
                || offset < self.committed
                || offset >= window_end
                || self.pending.contains_key(&offset)
                || self.acked.contains(offset)
            {
                continue;
            }
            // One search of the in-flight map for both the check and the
            // insert: the lease and ack paths are mostly B-tree searches.
            let btree_map::Entry::Vacant(slot) = self.in_flight.entry(offset) else {
                continue;
            };
            let generation = self.generation;
            let expiry_ms = now_ms + lease_ms;
            slot.insert(Lease {
                expiry_ms,
                deadline_after_expiry_ms: u32::try_from(deadline_ms - expiry_ms)
                    .expect("max_total_lease_ms fits in u32 (validate)"),
                generation,
                consumer,
                attempt,
                batch,
            });
            self.by_expiry.insert((expiry_ms, offset));
            self.head = self.head.max(offset + 1);
            grants.push(Grant {
                receipt: Receipt {
                    partition: self.partition,
                    offset,
                    generation,
                },
                expiry_ms,
                attempt,
            });
        }
        if !grants.is_empty() {
            let granted = grants.iter().map(|g| LeasedRun {
                start: g.receipt.offset,
                len: 1,
                expiry_ms: g.expiry_ms,
                consumer,
                attempt: g.attempt,
            });
            self.record_batch(batch, granted);
        }
        grants
    }

    /// Writes one record for the leases of one `lease` call, under the next
    /// lease-batch slot: one ack-log record per receive and partition rather
    /// than one per message. The leases the slot's previous record still
    /// holds go into the new record too (the new one replaces it under
    /// compaction).
    ///
    /// `granted` are the leases just granted under `batch`, one offset
    /// each: the caller knows them, so only the slot's older live leases
    /// are looked up.
    fn record_batch(&mut self, batch: u16, granted: impl Iterator<Item = LeasedRun>) {
        self.next_batch =
            u16::try_from((u32::from(batch) + 1) % self.batch_ring).expect("the ring fits in u16");
        let mut leases: Vec<LeasedRun> = Vec::new();
        if let Some(older) = self.batch_live.remove(&batch) {
            for offset in older {
                let lease = self
                    .in_flight
                    .get_mut(&offset)
                    .expect("live leases are in flight");
                lease.batch = batch;
                leases.push(LeasedRun {
                    start: offset,
                    len: 1,
                    expiry_ms: lease.expiry_ms,
                    consumer: lease.consumer,
                    attempt: lease.attempt,
                });
            }
        }
        leases.extend(granted);
        leases.sort_unstable_by_key(|l| l.start);
        let offsets: Vec<i64> = leases.iter().map(|l| l.start).collect();
        // Consecutive offsets leased alike become one run, in place.
        let mut runs = leases;
        runs.dedup_by(|lease, run| {
            let joins = run.start + i64::from(run.len) == lease.start
                && run.expiry_ms == lease.expiry_ms
                && run.consumer == lease.consumer
                && run.attempt == lease.attempt;
            if joins {
                run.len += 1;
            }
            joins
        });
        self.batch_live.insert(batch, offsets);
        self.events.push(LeaseEvent::LeasedBatch {
            ring: self.batch_ring,
            slot: batch,
            generation: self.generation,
            runs,
        });
    }

    /// The lease a receipt names, or why the receipt is stale (counted).
    fn check(&mut self, receipt: &Receipt) -> Result<Lease, LeaseError> {
        self.check_partition(receipt)?;
        match self.in_flight.get(&receipt.offset).copied() {
            Some(lease) if lease.generation == receipt.generation => Ok(lease),
            other => Err(self.stale(receipt.offset, other.is_some())),
        }
    }

    /// `check` and `remove_lease` in one search of the in-flight map.
    fn take_checked(&mut self, receipt: &Receipt) -> Result<Lease, LeaseError> {
        self.check_partition(receipt)?;
        let entry = match self.in_flight.entry(receipt.offset) {
            btree_map::Entry::Occupied(entry) => entry,
            btree_map::Entry::Vacant(_) => return Err(self.stale(receipt.offset, false)),
        };
        if entry.get().generation != receipt.generation {
            return Err(self.stale(receipt.offset, true));
        }
        let lease = entry.remove();
        self.forget_lease(receipt.offset, &lease);
        Ok(lease)
    }

    fn check_partition(&self, receipt: &Receipt) -> Result<(), LeaseError> {
        if receipt.partition == self.partition {
            Ok(())
        } else {
            Err(LeaseError::WrongPartition {
                receipt: receipt.partition,
                owned: self.partition,
            })
        }
    }

    /// Counts a stale receipt for `offset` and says why it is: a lease of
    /// another generation is in flight there, or none is.
    fn stale(&mut self, offset: i64, other_generation: bool) -> LeaseError {
        if other_generation {
            self.counters.stale_generation += 1;
            LeaseError::StaleGeneration { offset }
        } else {
            self.counters.stale_receipt += 1;
            LeaseError::StaleReceipt { offset }
        }
    }

    fn remove_lease(&mut self, offset: i64) -> Option<Lease> {
        let lease = self.in_flight.remove(&offset)?;
        self.forget_lease(offset, &lease);
        Some(lease)
    }

    /// Drops what indexes a lease just taken out of the in-flight map.
    fn forget_lease(&mut self, offset: i64, lease: &Lease) {
        self.by_expiry.remove(&(lease.expiry_ms, offset));
        if let Some(live) = self.batch_live.get_mut(&lease.batch) {
            if let Some(i) = live.iter().position(|&o| o == offset) {
                live.swap_remove(i);
            }
            if live.is_empty() {
                self.batch_live.remove(&lease.batch);
            }
        }
    }

    /// Acks a delivery. A lease stays valid until `expire` reaps it, so an ack
    /// just after the expiry time still counts (one duplicate fewer).
    pub fn ack(&mut self, receipt: &Receipt) -> Result<(), LeaseError> {
        self.take_checked(receipt)?;
        self.mark_done(receipt.offset);
        Ok(())
    }

    /// Fails a delivery: the message goes to the retry tier for its attempt
    /// (at least `retry_after_ms` later, up to the last tier's delay), or to
    /// the DLQ after the maximum attempts or at once when `permanent`.
    pub fn nack(
        &mut self,
        receipt: &Receipt,
        retry_after_ms: Option<i64>,
        error: &str,
        permanent: bool,
        now_ms: i64,
    ) -> Result<Failure, LeaseError> {
        let lease = self.take_checked(receipt)?;
        self.counters.nacked += 1;
        let cause = if permanent {
            FailureCause::Permanent
        } else {
            FailureCause::Nacked
        };
        Ok(self.fail(
            receipt.offset,
            lease,
            cause,
            retry_after_ms.unwrap_or(0),
            error,
            now_ms,
        ))
    }

    /// Extends a lease to `now_ms + lease_ms`, never past its first grant
    /// plus the maximum total lease, and never shorter than it is. As for
    /// `ack`, a lease past its expiry that `expire` has not reaped is valid.
    pub fn extend(
        &mut self,
        receipt: &Receipt,
        lease_ms: i64,
        now_ms: i64,
    ) -> Result<Extended, LeaseError> {
        let lease = self.check(receipt)?;
        let deadline_ms = lease.deadline_ms();
        let wanted_ms = now_ms.saturating_add(lease_ms.max(1));
        let capped = wanted_ms > deadline_ms;
        if capped {
            self.counters.extend_capped += 1;
        }
        let expiry_ms = wanted_ms.min(deadline_ms).max(lease.expiry_ms);
        if expiry_ms != lease.expiry_ms {
            self.by_expiry.remove(&(lease.expiry_ms, receipt.offset));
            self.by_expiry.insert((expiry_ms, receipt.offset));
            let entry = self
                .in_flight
                .get_mut(&receipt.offset)
                .expect("checked above");
            entry.expiry_ms = expiry_ms;
            entry.deadline_after_expiry_ms =
                u32::try_from(deadline_ms - expiry_ms).expect("expiry never passes the deadline");
        }
        // Not persisted: a new owner treats every lease as expired anyway.
        Ok(Extended { expiry_ms, capped })
    }

    /// Reaps every lease whose expiry is at or before `now_ms`.
    pub fn expire(&mut self, now_ms: i64) -> Vec<Failure> {
        let mut failures = Vec::new();
        while let Some(&(expiry_ms, offset)) = self.by_expiry.first() {
            if expiry_ms > now_ms {
                break;
            }
            let lease = self.remove_lease(offset).expect("indexed leases exist");
            self.counters.expired += 1;
            failures.push(self.fail(
                offset,
                lease,
                FailureCause::Expired,
                0,
                "lease expired",
                now_ms,
            ));
        }
        failures
    }

    /// When the window above the commit point is full (the highest offset
    /// leased or acked is `gap_cap` past it), forces the in-flight message at
    /// the commit point to the retry path so the commit point can move.
    /// Returns nothing when the window has room, or when the message there
    /// is not in flight (already waiting for its route).
    pub fn enforce_gap_cap(&mut self, now_ms: i64) -> Option<Failure> {
        if self.head - self.committed < i64::from(self.config.gap_cap) {
            return None;
        }
        let offset = self.committed;
        let lease = self.remove_lease(offset)?;
        self.counters.gap_forced += 1;
        let error = format!(
            "gap cap: {} offsets above a message still in flight",
            self.config.gap_cap
        );
        Some(self.fail(offset, lease, FailureCause::GapCap, 0, &error, now_ms))
    }

    /// The caller has written the copy of a failed message to its route: the
    /// message is done in this partition.
    pub fn routed(&mut self, offset: i64) -> Result<(), LeaseError> {
        if self.pending.remove(&offset).is_none() {
            return Err(LeaseError::NotPendingRoute { offset });
        }
        self.mark_done(offset);
        Ok(())
    }

    /// Ordered queues (issue 8): the failure waiting at `offset` is retried
    /// in this partition instead of being copied to a retry tier. The caller
    /// has persisted the retry state (attempt, due time, history) in its own
    /// ack-log record; the offset is leasable again (the caller offers it
    /// with the next attempt and its due time). Emits nothing: the `Failed`
    /// record stays the offset's latest, and a rebuild returns it as a
    /// pending route, which the caller recognizes by its retry record.
    pub fn retry_in_place(&mut self, offset: i64) -> Result<(), LeaseError> {
        if self.pending.remove(&offset).is_none() {
            return Err(LeaseError::NotPendingRoute { offset });
        }
        Ok(())
    }

    /// Ordered queues: the record at `offset` is done without a lease (its
    /// key is parked and the record was copied to the hold topic). Records
    /// an ack like any done offset.
    pub fn settle(&mut self, offset: i64) {
        if offset < self.committed
            || self.in_flight.contains_key(&offset)
            || self.pending.contains_key(&offset)
            || self.acked.contains(offset)
        {
            return;
        }
        self.mark_done(offset);
    }

    /// The gap-cap window is full: nothing beyond it is leased until the
    /// commit point moves.
    pub fn window_full(&self) -> bool {
        self.head - self.committed >= i64::from(self.config.gap_cap)
    }

    pub fn is_in_flight(&self, offset: i64) -> bool {
        self.in_flight.contains_key(&offset)
    }

    /// This ownership's generation (ordered queues sign replayed hold
    /// copies' receipts with it).
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// Where a failure of `attempt` goes (the rule `nack` and `expire`
    /// apply), for failures the caller tracks itself (replayed hold copies).
    pub fn route_for(
        &self,
        attempt: Attempt,
        cause: FailureCause,
        retry_after_ms: i64,
        now_ms: i64,
    ) -> Route {
        self.route(attempt, cause, retry_after_ms, now_ms)
    }

    /// Offsets in `[from, to)` hold nothing to deliver (transaction markers,
    /// compacted gaps, records the caller filters out): done without a lease.
    /// Not persisted: a new owner scanning from the commit point meets them
    /// again.
    pub fn mark_absent(&mut self, from: i64, to: i64) {
        let from = from.max(self.committed);
        if from >= to {
            return;
        }
        debug_assert!(
            self.in_flight.range(from..to).next().is_none()
                && self.pending.range(from..to).next().is_none(),
            "absent offsets were delivered"
        );
        self.acked.insert(from, to);
        self.head = self.head.max(to);
        if let Some(end) = self.acked.take_run_at(self.committed) {
            self.advance_commit(end);
        }
    }

    fn mark_done(&mut self, offset: i64) {
        self.head = self.head.max(offset + 1);
        if offset == self.committed {
            let mut committed = offset + 1;
            if let Some(end) = self.acked.take_run_at(committed) {
                committed = end;
            }
            self.advance_commit(committed);
        } else {
            self.acked.insert(offset, offset + 1);
            // Consecutive acks (one worker's batch) make one record.
            match self.events.last_mut() {
                Some(LeaseEvent::Acked { offset: last }) if *last + 1 == offset => {
                    let start = *last;
                    *self.events.last_mut().expect("just matched") = LeaseEvent::AckedRun {
                        start,
                        end: offset + 1,
                    };
                }
                Some(LeaseEvent::AckedRun { end, .. }) if *end == offset => *end += 1,
                _ => self.events.push(LeaseEvent::Acked { offset }),
            }
        }
    }

    /// Moves the commit point to `committed` and records it. The undrained
    /// events at the tail that the new record makes moot (an earlier commit
    /// record, acks below the new commit point) are dropped: a rebuild
    /// ignores per-offset records below the commit point, and in-order acks
    /// (the common case) then cost one record per request, not one per
    /// message.
    fn advance_commit(&mut self, committed: i64) {
        self.committed = committed;
        while let Some(last) = self.events.last() {
            match last {
                LeaseEvent::CommitAdvanced { .. } => {}
                LeaseEvent::Acked { offset } if *offset < committed => {}
                LeaseEvent::AckedRun { end, .. } if *end <= committed => {}
                _ => break,
            }
            self.events.pop();
        }
        self.events.push(LeaseEvent::CommitAdvanced {
            offset: committed,
            generation: self.generation,
        });
    }

    fn route(
        &self,
        attempt: Attempt,
        cause: FailureCause,
        retry_after_ms: i64,
        now_ms: i64,
    ) -> Route {
        if cause == FailureCause::Permanent || attempt.0 >= self.config.max_attempts {
            return Route::Dlq;
        }
        let tiers = &self.config.retry_tiers_ms;
        let last = tiers.len() - 1;
        let by_attempt = usize::from(attempt.0.saturating_sub(1)).min(last);
        let wanted_ms = retry_after_ms.min(tiers[last]);
        let by_delay = tiers.iter().position(|&d| d >= wanted_ms).unwrap_or(last);
        let tier = by_attempt.max(by_delay);
        Route::RetryTier {
            tier,
            due_ms: now_ms + tiers[tier],
        }
    }

    fn fail(
        &mut self,
        offset: i64,
        lease: Lease,
        cause: FailureCause,
        retry_after_ms: i64,
        error: &str,
        now_ms: i64,
    ) -> Failure {
        let route = self.route(lease.attempt, cause, retry_after_ms, now_ms);
        if route == Route::Dlq {
            self.counters.dead_lettered += 1;
        }
        let failure = Failure {
            offset,
            attempt: lease.attempt,
            consumer: lease.consumer,
            cause,
            route,
            at_ms: now_ms,
            error: truncate_error(error),
        };
        self.pending.insert(offset, failure.clone());
        self.events.push(LeaseEvent::Failed(failure.clone()));
        failure
    }

    /// Restores a partition from its ack-log events (decoded, in log order,
    /// possibly compacted) and the group's committed offset. Leases in flight
    /// at the crash are treated as expired: their messages are leasable again
    /// (under the new generation, so old receipts are stale) and returned for
    /// re-delivery.
    ///
    /// The new ownership takes the generation after the latest one read, and
    /// restoring emits one event, the `CommitAdvanced` that records it: the
    /// caller writes it and waits for its ack before it leases anything, so
    /// the owner after this one reads it even if none of this owner's lease
    /// events is ever written.
    pub fn rebuild(
        partition: QueuePartition,
        config: LeaseConfig,
        group_committed: i64,
        events: impl IntoIterator<Item = LeaseEvent>,
    ) -> Result<Rebuilt, LeaseConfigError> {
        let mut s = PartitionLeases::new(partition, config, group_committed)?;
        // The latest generation read, in serial order (every generation in
        // the log lies within far less than 2^31 of the others).
        let mut latest: Option<u32> = None;
        let mut saw = |g: Generation| {
            latest = Some(match latest {
                Some(l) if !serial_gt(g.0, l) => l,
                _ => g.0,
            });
        };
        for event in events {
            // Each per-offset record sets that offset's whole state: under
            // compaction only the latest record per key survives, in order.
            match event {
                LeaseEvent::CommitAdvanced { offset, generation } => {
                    saw(generation);
                    if offset > s.committed {
                        s.committed = offset;
                        s.in_flight = s.in_flight.split_off(&offset);
                        s.pending = s.pending.split_off(&offset);
                        s.acked.trim_below(offset);
                    }
                }
                LeaseEvent::Leased {
                    offset,
                    generation,
                    expiry_ms,
                    consumer,
                    attempt,
                } => {
                    saw(generation);
                    if offset >= s.committed {
                        s.pending.remove(&offset);
                        s.in_flight.insert(
                            offset,
                            Lease {
                                expiry_ms,
                                deadline_after_expiry_ms: 0,
                                generation,
                                consumer,
                                attempt,
                                batch: 0,
                            },
                        );
                    }
                }
                LeaseEvent::LeasedBatch {
                    generation, runs, ..
                } => {
                    saw(generation);
                    for run in runs {
                        // A writer leases within `gap_cap` of its commit
                        // point, so a longer run is not one it wrote; its
                        // offsets stay unleased (delivered again) rather
                        // than filling memory one lease per offset.
                        if run.len > s.config.gap_cap {
                            tracing::warn!(
                                partition = ?s.partition,
                                start = run.start,
                                len = run.len,
                                gap_cap = s.config.gap_cap,
                                "ack log: a leased run longer than gap_cap is ignored"
                            );
                            continue;
                        }
                        for offset in run.offsets().filter(|&o| o >= s.committed) {
                            s.pending.remove(&offset);
                            s.in_flight.insert(
                                offset,
                                Lease {
                                    expiry_ms: run.expiry_ms,
                                    deadline_after_expiry_ms: 0,
                                    generation,
                                    consumer: run.consumer,
                                    attempt: run.attempt,
                                    batch: 0,
                                },
                            );
                        }
                    }
                }
                LeaseEvent::Acked { offset } => {
                    if offset >= s.committed {
                        s.in_flight.remove(&offset);
                        s.pending.remove(&offset);
                        s.acked.insert(offset, offset + 1);
                    }
                }
                LeaseEvent::AckedRun { start, end } => {
                    let start = start.max(s.committed);
                    if start < end {
                        // By the entries in the run, not by its offsets:
                        // the cost is what the tables hold, whatever the
                        // record says the run spans.
                        remove_range(&mut s.in_flight, start, end);
                        remove_range(&mut s.pending, start, end);
                        s.acked.insert(start, end);
                    }
                }
                LeaseEvent::Failed(failure) => {
                    if failure.offset >= s.committed {
                        s.in_flight.remove(&failure.offset);
                        s.pending.insert(failure.offset, failure);
                    }
                }
            }
        }
        if let Some(end) = s.acked.take_run_at(s.committed) {
            s.committed = end;
            s.in_flight = s.in_flight.split_off(&end);
            s.pending = s.pending.split_off(&end);
        }
        s.generation = Generation(latest.map_or(0, |g| g.wrapping_add(1)));
        s.events.push(LeaseEvent::CommitAdvanced {
            offset: s.committed,
            generation: s.generation,
        });
        let expired: Vec<ExpiredLease> = std::mem::take(&mut s.in_flight)
            .into_iter()
            .map(|(offset, lease)| ExpiredLease {
                offset,
                generation: lease.generation,
                attempt: lease.attempt,
                consumer: lease.consumer,
            })
            .collect();
        s.head = [
            Some(s.committed),
            expired.last().map(|e| e.offset + 1),
            s.pending.keys().next_back().map(|o| o + 1),
            s.acked.ranges().last().map(|(_, end)| end),
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(s.committed);
        let pending_routes = s.pending.values().cloned().collect();
        Ok(Rebuilt {
            leases: s,
            expired,
            pending_routes,
        })
    }
}

/// `a` comes after `b` in RFC 1982 serial-number order.
fn serial_gt(a: u32, b: u32) -> bool {
    a != b && (a.wrapping_sub(b) as i32) > 0
}

fn truncate_error(error: &str) -> String {
    cut_at_char(error, MAX_ERROR_BYTES).to_owned()
}

/// The longest prefix of `s` of at most `max_bytes` that ends on a char.
pub(crate) fn cut_at_char(s: &str, max_bytes: usize) -> &str {
    let mut end = s.len().min(max_bytes);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Removes the entries of `map` in `start..end`.
fn remove_range<V>(map: &mut BTreeMap<i64, V>, start: i64, end: i64) {
    let keys: Vec<i64> = map.range(start..end).map(|(&k, _)| k).collect();
    for k in keys {
        map.remove(&k);
    }
}

#[cfg(test)]
mod tests;
