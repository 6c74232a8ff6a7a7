//! One share-partition: how one share group (KIP-932) sees one topic
//! partition. Below the share-partition start offset (SPSO) every record is
//! done with; from the SPSO to the end of the in-flight window each record
//! has a state and a delivery count; past the window no record has been
//! delivered yet.
//!
//! The rules are Kafka's (core's `SharePartition`):
//! - acquiring a record counts a delivery and locks it to one member for
//!   `share.record.lock.duration.ms`;
//! - ACCEPT acknowledges it, REJECT archives it, RELEASE makes it available
//!   again, RENEW (KIP-1222) restarts its lock; a GAP (an offset the
//!   consumer got no record for) archives it;
//! - a record released, or whose lock expires, after `share.delivery.count.limit`
//!   deliveries is archived instead of made available;
//! - the SPSO moves past every leading acknowledged or archived record;
//! - no new records are acquired while the window spans
//!   `group.share.partition.max.record.locks` offsets (available records
//!   inside it still are).
//!
//! Control batches (transaction markers) are never handed to a consumer:
//! their offsets are archived as they enter the window.
//!
//! Invariant: this module knows nothing about logs, clocks or persistence.
//! The caller passes the time and the batch boundaries it read from the log
//! at [`SharePartition::next_fetch_offset`], and persists what
//! [`SharePartition::state_batches`] returns.

use std::collections::VecDeque;
use std::sync::Arc;

/// A record's state, with Kafka's ids (persisted in `__share_group_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordState {
    Available,
    Acquired,
    Acknowledged,
    Archived,
}

impl RecordState {
    pub fn id(self) -> i8 {
        match self {
            RecordState::Available => 0,
            RecordState::Acquired => 1,
            RecordState::Acknowledged => 2,
            RecordState::Archived => 4,
        }
    }

    pub fn from_id(id: i8) -> Option<Self> {
        match id {
            0 => Some(RecordState::Available),
            1 => Some(RecordState::Acquired),
            2 => Some(RecordState::Acknowledged),
            4 => Some(RecordState::Archived),
            _ => None,
        }
    }

    fn is_done(self) -> bool {
        matches!(self, RecordState::Acknowledged | RecordState::Archived)
    }
}

/// An acknowledgement type, with the ids of ShareFetch/ShareAcknowledge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckType {
    Gap,
    Accept,
    Release,
    Reject,
    Renew,
}

impl AckType {
    pub fn from_id(id: i8) -> Option<Self> {
        match id {
            0 => Some(AckType::Gap),
            1 => Some(AckType::Accept),
            2 => Some(AckType::Release),
            3 => Some(AckType::Reject),
            4 => Some(AckType::Renew),
            _ => None,
        }
    }
}

/// One acknowledgement batch: a type for the whole range, or one per offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckBatch {
    pub first_offset: i64,
    pub last_offset: i64,
    pub types: Vec<AckType>,
}

/// Why an acknowledgement was refused; nothing of the request was applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckError {
    /// Malformed: an empty or reversed range, a type count that is neither 1
    /// nor the range's length, or batches out of order or overlapping
    /// (Kafka's `INVALID_REQUEST`).
    InvalidRequest,
    /// An offset outside the window, or not acquired by this member (its
    /// lock expired, or another member holds it): `INVALID_RECORD_STATE`.
    InvalidRecordState,
}

/// A run of acquired offsets, all delivered the same number of times (the
/// `AcquiredRecords` of a ShareFetch response).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acquired {
    pub first_offset: i64,
    pub last_offset: i64,
    pub delivery_count: i16,
}

/// The boundaries of one batch read from the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogBatch {
    pub first_offset: i64,
    pub last_offset: i64,
    /// A control batch (a transaction marker).
    pub control: bool,
}

/// A persisted run of offsets in one state (`StateBatch` of
/// `ShareSnapshotValue`/`ShareUpdateValue`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateBatch {
    pub first_offset: i64,
    pub last_offset: i64,
    pub state: RecordState,
    pub delivery_count: i16,
}

/// The group's settings a share-partition works with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// `group.share.partition.max.record.locks`.
    pub max_in_flight: usize,
    /// `share.delivery.count.limit`.
    pub delivery_limit: i16,
    /// `share.record.lock.duration.ms`.
    pub lock_duration_ms: i64,
}

/// How many records one acquisition may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireMode {
    /// Whole log batches while fewer than the maximum are taken, so the last
    /// batch may go past it (Kafka's `batch_optimized`, the default).
    BatchOptimized,
    /// Never more than the maximum, splitting a batch if need be (KIP-1206's
    /// `record_limit`).
    RecordLimit,
}

/// The most offsets a restored window holds. A persisted state written with
/// a larger lock limit than ours keeps its first offsets' states; the rest
/// are delivered again as never delivered, a duplicate and never a loss.
const MAX_RESTORED_WINDOW: i64 = 1 << 20;

#[derive(Clone, Debug)]
struct Slot {
    state: RecordState,
    delivery_count: i16,
    /// The member holding the lock, while acquired.
    owner: Option<Arc<str>>,
    /// When the lock expires, while acquired.
    deadline_ms: i64,
}

impl Slot {
    fn new(state: RecordState, delivery_count: i16) -> Self {
        Slot {
            state,
            delivery_count,
            owner: None,
            deadline_ms: 0,
        }
    }
}

/// Why a delivered record was archived, which sends it to the group's
/// dead-letter queue (KIP-1191), with Kafka's message for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadReason {
    /// A member acknowledged it REJECT.
    Rejected,
    /// It was delivered `share.delivery.count.limit` times.
    DeliveryLimit,
}

impl DeadReason {
    /// Kafka's `__dlq.errors.message` for it.
    pub fn message(self) -> &'static str {
        match self {
            DeadReason::Rejected => "Offset rejected by client.",
            DeadReason::DeliveryLimit => "Offset delivery count exceeded the threshold.",
        }
    }
}

/// A record archived undelivered, for the dead-letter queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dead {
    pub offset: i64,
    pub delivery_count: i16,
    pub reason: DeadReason,
}

#[derive(Clone, Debug)]
pub struct SharePartition {
    limits: Limits,
    /// The SPSO: the offset of `window[0]`.
    start: i64,
    window: VecDeque<Slot>,
    acquired: usize,
    /// No lock expires before this (a lower bound; 0 when none is held).
    earliest_deadline_ms: i64,
    /// Records archived by the last operations, until [`Self::take_dead`].
    dead: Vec<Dead>,
}

impl SharePartition {
    /// A share-partition none of whose records was delivered, starting at
    /// `start_offset` (from `share.auto.offset.reset`).
    pub fn new(start_offset: i64, limits: Limits) -> Self {
        SharePartition {
            limits,
            start: start_offset,
            window: VecDeque::new(),
            acquired: 0,
            earliest_deadline_ms: 0,
            dead: Vec::new(),
        }
    }

    /// The records archived undelivered (rejected, or at the delivery
    /// limit) since the last call, in the order they were.
    pub fn take_dead(&mut self) -> Vec<Dead> {
        std::mem::take(&mut self.dead)
    }

    /// A share-partition as persisted: its SPSO and the state batches at or
    /// past it, sorted and not overlapping. Offsets between batches were
    /// never delivered; a persisted ACQUIRED (Kafka never writes one) is
    /// taken as available.
    pub fn restore(start_offset: i64, batches: &[StateBatch], limits: Limits) -> Self {
        let mut p = SharePartition::new(start_offset, limits);
        let cap = start_offset.saturating_add(MAX_RESTORED_WINDOW);
        for b in batches {
            let first = b.first_offset.max(p.end_offset());
            let last = b.last_offset.min(cap - 1);
            if first > last {
                continue;
            }
            while p.end_offset() < first {
                p.window.push_back(Slot::new(RecordState::Available, 0));
            }
            let state = match b.state {
                RecordState::Acquired => RecordState::Available,
                s => s,
            };
            for _ in first..=last {
                p.window
                    .push_back(Slot::new(state, b.delivery_count.max(0)));
            }
        }
        p.advance_start();
        p
    }

    /// The share-partition start offset (SPSO).
    pub fn start_offset(&self) -> i64 {
        self.start
    }

    /// The first offset past the in-flight window (Kafka's SPEO + 1).
    pub fn end_offset(&self) -> i64 {
        self.start + self.window.len() as i64
    }

    /// Records currently locked by a member.
    pub fn acquired_count(&self) -> usize {
        self.acquired
    }

    /// The offset a fetch for this share-partition reads from: the first
    /// available record in the window, else the end of the window.
    pub fn next_fetch_offset(&self) -> i64 {
        match self
            .window
            .iter()
            .position(|s| s.state == RecordState::Available)
        {
            Some(i) => self.start + i as i64,
            None => self.end_offset(),
        }
    }

    /// Whether an acquisition could take anything: an available record in
    /// the window, or room to grow it.
    pub fn can_acquire(&self) -> bool {
        self.window.len() < self.limits.max_in_flight
            || self
                .window
                .iter()
                .any(|s| s.state == RecordState::Available)
    }

    /// Locks records of `batches` (consecutive batches of the log, read from
    /// [`Self::next_fetch_offset`]) for `member`: the available ones inside
    /// the window, then new ones past it while the window has room. Returns
    /// the acquired runs in offset order.
    pub fn acquire(
        &mut self,
        member: &Arc<str>,
        batches: &[LogBatch],
        max_records: usize,
        mode: AcquireMode,
        now_ms: i64,
    ) -> Vec<Acquired> {
        let deadline = now_ms.saturating_add(self.limits.lock_duration_ms);
        let mut out: Vec<Acquired> = Vec::new();
        let mut taken = 0usize;
        for b in batches {
            if taken >= max_records {
                break;
            }
            let first = b.first_offset.max(self.start);
            if first > b.last_offset {
                continue;
            }
            // The part inside the window: its available records.
            let inside_last = b.last_offset.min(self.end_offset() - 1);
            let mut offset = first;
            while offset <= inside_last && taken < max_records {
                let i = (offset - self.start) as usize;
                if self.window[i].state == RecordState::Available
                    && self.take_slot(i, member, deadline)
                {
                    push_run(&mut out, offset, self.window[i].delivery_count);
                    taken += 1;
                }
                offset += 1;
            }
            if b.last_offset < self.end_offset() {
                continue;
            }
            // The part past the window: the window grows by the whole batch
            // (or in record-limit mode by what is taken), if it has room.
            if self.window.len() >= self.limits.max_in_flight || taken >= max_records {
                break;
            }
            let first = first.max(self.end_offset());
            if first > self.end_offset() {
                if self.window.is_empty() {
                    // Nothing in flight: the offsets before this batch do not
                    // exist in the log (compacted or never written).
                    self.start = first;
                } else if first - self.end_offset() > self.limits.max_in_flight as i64 {
                    // Too far to fill with archived gaps; wait until the
                    // window drains.
                    break;
                } else {
                    while self.end_offset() < first {
                        self.window.push_back(Slot::new(RecordState::Archived, 0));
                    }
                }
            }
            if b.control {
                for _ in first..=b.last_offset {
                    self.window.push_back(Slot::new(RecordState::Archived, 0));
                }
                continue;
            }
            let mut offset = first;
            while offset <= b.last_offset {
                if mode == AcquireMode::RecordLimit && taken >= max_records {
                    break;
                }
                self.window.push_back(Slot::new(RecordState::Available, 0));
                let i = self.window.len() - 1;
                if self.take_slot(i, member, deadline) {
                    push_run(&mut out, offset, self.window[i].delivery_count);
                    taken += 1;
                }
                offset += 1;
            }
        }
        self.advance_start();
        out
    }

    /// Acquires the available slot `i`, or archives it if it was already
    /// delivered as often as allowed. Returns whether it was acquired.
    fn take_slot(&mut self, i: usize, member: &Arc<str>, deadline_ms: i64) -> bool {
        let limit = self.limits.delivery_limit;
        let start = self.start;
        let slot = &mut self.window[i];
        if slot.delivery_count >= limit {
            slot.state = RecordState::Archived;
            self.dead.push(Dead {
                offset: start + i as i64,
                delivery_count: slot.delivery_count,
                reason: DeadReason::DeliveryLimit,
            });
            return false;
        }
        slot.state = RecordState::Acquired;
        slot.delivery_count = slot.delivery_count.saturating_add(1);
        slot.owner = Some(member.clone());
        slot.deadline_ms = deadline_ms;
        self.acquired += 1;
        if self.earliest_deadline_ms == 0 || deadline_ms < self.earliest_deadline_ms {
            self.earliest_deadline_ms = deadline_ms;
        }
        true
    }

    /// Applies `member`'s acknowledgements: all of them, or none if any is
    /// malformed or names a record this member does not hold.
    pub fn acknowledge(
        &mut self,
        member: &str,
        batches: &[AckBatch],
        now_ms: i64,
    ) -> Result<(), AckError> {
        let mut previous_last: Option<i64> = None;
        for b in batches {
            if b.first_offset > b.last_offset || b.types.is_empty() {
                return Err(AckError::InvalidRequest);
            }
            let len = (b.last_offset - b.first_offset).saturating_add(1);
            if b.types.len() != 1 && b.types.len() as i64 != len {
                return Err(AckError::InvalidRequest);
            }
            if previous_last.is_some_and(|p| b.first_offset <= p) {
                return Err(AckError::InvalidRequest);
            }
            previous_last = Some(b.last_offset);
            if b.first_offset < self.start || b.last_offset >= self.end_offset() {
                return Err(AckError::InvalidRecordState);
            }
            for offset in b.first_offset..=b.last_offset {
                let slot = &self.window[(offset - self.start) as usize];
                if slot.state != RecordState::Acquired || slot.owner.as_deref() != Some(member) {
                    return Err(AckError::InvalidRecordState);
                }
            }
        }
        let renewed = now_ms.saturating_add(self.limits.lock_duration_ms);
        for b in batches {
            for offset in b.first_offset..=b.last_offset {
                let k = (offset - b.first_offset) as usize;
                let kind = if b.types.len() == 1 {
                    b.types[0]
                } else {
                    b.types[k]
                };
                let i = (offset - self.start) as usize;
                match kind {
                    AckType::Accept => self.finish(i, RecordState::Acknowledged),
                    AckType::Reject => {
                        self.dead.push(Dead {
                            offset,
                            delivery_count: self.window[i].delivery_count,
                            reason: DeadReason::Rejected,
                        });
                        self.finish(i, RecordState::Archived)
                    }
                    AckType::Gap => self.finish(i, RecordState::Archived),
                    AckType::Release => self.release_slot(i),
                    AckType::Renew => self.window[i].deadline_ms = renewed,
                }
            }
        }
        self.advance_start();
        Ok(())
    }

    fn finish(&mut self, i: usize, state: RecordState) {
        let slot = &mut self.window[i];
        slot.state = state;
        slot.owner = None;
        self.acquired -= 1;
    }

    /// An acquired record goes back: available, or archived once it has
    /// been delivered as often as allowed.
    fn release_slot(&mut self, i: usize) {
        let limit = self.limits.delivery_limit;
        let count = self.window[i].delivery_count;
        let state = if count >= limit {
            self.dead.push(Dead {
                offset: self.start + i as i64,
                delivery_count: count,
                reason: DeadReason::DeliveryLimit,
            });
            RecordState::Archived
        } else {
            RecordState::Available
        };
        self.finish(i, state);
    }

    /// Releases every lock that has expired by `now_ms`. Returns how many.
    pub fn expire_locks(&mut self, now_ms: i64) -> usize {
        if self.acquired == 0 || now_ms < self.earliest_deadline_ms {
            return 0;
        }
        let mut released = 0;
        let mut earliest = 0;
        for i in 0..self.window.len() {
            let slot = &self.window[i];
            if slot.state != RecordState::Acquired {
                continue;
            }
            if slot.deadline_ms <= now_ms {
                self.release_slot(i);
                released += 1;
            } else if earliest == 0 || slot.deadline_ms < earliest {
                earliest = slot.deadline_ms;
            }
        }
        self.earliest_deadline_ms = earliest;
        self.advance_start();
        released
    }

    /// When the next lock expires, if one is held.
    pub fn next_deadline_ms(&self) -> Option<i64> {
        (self.acquired > 0).then_some(self.earliest_deadline_ms)
    }

    /// Releases every record `member` holds (it left the group, or closed
    /// its share session). Returns how many.
    pub fn release_member(&mut self, member: &str) -> usize {
        let mut released = 0;
        for i in 0..self.window.len() {
            let slot = &self.window[i];
            if slot.state == RecordState::Acquired && slot.owner.as_deref() == Some(member) {
                self.release_slot(i);
                released += 1;
            }
        }
        self.advance_start();
        released
    }

    /// The log's start offset moved to `log_start_offset` (retention or
    /// DeleteRecords): available records below it are archived, and an
    /// empty window moves up to it. Acquired records below it stay locked
    /// until acknowledged or expired.
    pub fn move_log_start(&mut self, log_start_offset: i64) {
        if log_start_offset <= self.start {
            return;
        }
        let below = ((log_start_offset - self.start) as usize).min(self.window.len());
        for slot in self.window.iter_mut().take(below) {
            if slot.state == RecordState::Available {
                slot.state = RecordState::Archived;
            }
        }
        self.advance_start();
        if self.window.is_empty() && self.start < log_start_offset {
            self.start = log_start_offset;
        }
    }

    /// Starts over at `offset` (AlterShareGroupOffsets, allowed only while
    /// the group has no members, so nothing is acquired).
    pub fn reset(&mut self, offset: i64) {
        self.window.clear();
        self.start = offset;
        self.acquired = 0;
        self.earliest_deadline_ms = 0;
    }

    fn advance_start(&mut self) {
        while self.window.front().is_some_and(|s| s.state.is_done()) {
            self.window.pop_front();
            self.start += 1;
        }
    }

    /// The window as it would be persisted: runs of one state and delivery
    /// count, acquired records as available (a crash ends their locks, and
    /// the delivery they count has happened). Runs never delivered are left
    /// out; they read back as never delivered.
    pub fn state_batches(&self) -> Vec<StateBatch> {
        let mut out: Vec<StateBatch> = Vec::new();
        for (i, slot) in self.window.iter().enumerate() {
            let offset = self.start + i as i64;
            let state = match slot.state {
                RecordState::Acquired => RecordState::Available,
                s => s,
            };
            if state == RecordState::Available && slot.delivery_count == 0 {
                continue;
            }
            match out.last_mut() {
                Some(last)
                    if last.last_offset + 1 == offset
                        && last.state == state
                        && last.delivery_count == slot.delivery_count =>
                {
                    last.last_offset = offset;
                }
                _ => out.push(StateBatch {
                    first_offset: offset,
                    last_offset: offset,
                    state,
                    delivery_count: slot.delivery_count,
                }),
            }
        }
        out
    }

    /// The state and delivery count of `offset`, for tests and describe
    /// tools: `None` outside the window.
    pub fn record(&self, offset: i64) -> Option<(RecordState, i16)> {
        if offset < self.start {
            return None;
        }
        self.window
            .get((offset - self.start) as usize)
            .map(|s| (s.state, s.delivery_count))
    }
}

/// Appends `offset` to the last run if it continues it with the same
/// delivery count, else starts a run.
fn push_run(out: &mut Vec<Acquired>, offset: i64, delivery_count: i16) {
    match out.last_mut() {
        Some(run) if run.last_offset + 1 == offset && run.delivery_count == delivery_count => {
            run.last_offset = offset;
        }
        _ => out.push(Acquired {
            first_offset: offset,
            last_offset: offset,
            delivery_count,
        }),
    }
}

#[cfg(test)]
#[path = "partition_tests.rs"]
mod tests;
