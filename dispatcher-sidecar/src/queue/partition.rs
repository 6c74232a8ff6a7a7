//! The state of one owned partition beside its lease engine: the fetched
//! records that may still be needed (leasable, in flight, or waiting for
//! their failure copy), which of them may be leased next, and which failures
//! wait for a copy.
//!
//! Pure: no I/O and no clock. The runtime holds it under a per-partition
//! lock, and writes the engine's drained events to the ack log in the order
//! they were drained.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use crate::lease::{
    Attempt, Available, ConsumerSlot, Failure, Grant, LeaseEvent, PartitionLeases, Rebuilt,
    RetryEnvelope,
};

use super::message::Buffered;
use super::ordered::{
    OrderedKeys, OrderedRecord, ParkedKey, Release, ReplayItem, ReplayLease, ReplayRetry,
    RetryRecord, HOLD_TOPIC, MAX_PARKED_KEYS,
};
use crate::lease::{Extended, FailureCause, LeaseError, QueuePartition, Receipt, Route};

/// The header a redrive job sets on the records it produces (the agreed
/// interface with the redrive job): a parked key's poison message coming
/// back with it releases the key.
pub use crate::redrive::REDRIVE_JOB_HEADER;

/// Records fetched and not yet leased, per partition: the prefetch bound.
/// The backlog beyond it stays in Kafka.
pub const PREFETCH_MAX: usize = 2000;

#[derive(Debug)]
pub struct PartitionState {
    pub engine: PartitionLeases,
    /// Every fetched record at or above the commit point that is not done.
    /// Boxed: a B-tree node moves its values on every insert and remove,
    /// and at about 250 bytes a record those moves were about 3% of the
    /// dispatcher's CPU samples under load (perf, 8 gRPC workers).
    msgs: BTreeMap<i64, Box<Buffered>>,
    /// Records of `msgs` that may be leased, in offset order.
    ready: VecDeque<i64>,
    /// Failures whose copy is not written yet (the record may not be fetched
    /// yet after a rebuild).
    failures: BTreeMap<i64, Failure>,
    /// Failures whose copy is being written now.
    routing: BTreeSet<i64>,
    /// Offsets above the commit point the previous owner acked (from the ack
    /// log): dropped when fetched.
    acked_before: BTreeSet<i64>,
    /// Offsets in flight at the previous owner's stop: their next lease is
    /// a redelivery.
    crashed: HashSet<i64>,
    /// One past the highest offset fetched.
    fetched_to: i64,
    /// An ordered queue's primary partition: its keys (`queue::ordered`).
    ordered: Option<OrderedKeys>,
}

impl PartitionState {
    pub fn new(engine: PartitionLeases) -> Self {
        let committed = engine.committed_offset();
        PartitionState {
            engine,
            msgs: BTreeMap::new(),
            ready: VecDeque::new(),
            failures: BTreeMap::new(),
            routing: BTreeSet::new(),
            acked_before: BTreeSet::new(),
            crashed: HashSet::new(),
            fetched_to: committed,
            ordered: None,
        }
    }

    /// Makes this an ordered queue's primary partition, with the retry
    /// states its ack log holds.
    pub fn set_ordered(&mut self, keys: OrderedKeys) {
        self.ordered = Some(keys);
    }

    pub fn ordered(&self) -> Option<&OrderedKeys> {
        self.ordered.as_ref()
    }

    /// Drops a held record (done, or refused by the engine as done).
    fn remove_msg(&mut self, offset: i64) -> Option<Buffered> {
        let m = self.msgs.remove(&offset)?;
        if let (Some(keys), Some(key)) = (&mut self.ordered, &m.key) {
            keys.record_gone(key, offset);
        }
        Some(*m)
    }

    /// A partition restored from its ack log: `acked_before` are the offsets
    /// above the commit point acked there (see [`acked_above_commit`]).
    pub fn rebuilt(rebuilt: Rebuilt, acked_before: BTreeSet<i64>) -> Self {
        let mut s = PartitionState::new(rebuilt.leases);
        s.acked_before = acked_before;
        s.crashed = rebuilt.expired.iter().map(|e| e.offset).collect();
        s.failures = rebuilt
            .pending_routes
            .into_iter()
            .map(|f| (f.offset, f))
            .collect();
        s
    }

    /// The next offset expected from the partition's fetch.
    pub fn fetched_to(&self) -> i64 {
        self.fetched_to
    }

    pub fn ready_len(&self) -> usize {
        self.ready.len()
    }

    pub fn buffered_len(&self) -> usize {
        self.msgs.len()
    }

    /// Room for more fetched records under the prefetch bound.
    pub fn prefetch_room(&self) -> usize {
        PREFETCH_MAX.saturating_sub(self.ready.len())
    }

    /// A record fetched from the partition, in offset order. Offsets skipped
    /// between two fetched records (compaction, transaction markers) are
    /// done without a lease.
    pub fn offer(&mut self, offset: i64, message: Buffered) {
        if offset < self.fetched_to {
            return;
        }
        let gap_from = self.fetched_to.max(self.engine.committed_offset());
        if offset > gap_from && self.failures.range(gap_from..offset).next().is_none() {
            self.engine.mark_absent(gap_from, offset);
        }
        self.fetched_to = offset + 1;
        if offset < self.engine.committed_offset() || self.acked_before.remove(&offset) {
            return;
        }
        let mut message = message;
        if let Some(keys) = &mut self.ordered {
            if let Some(key) = message.key.clone() {
                if let Some(p) = keys.parked.get_mut(&key) {
                    let redrive = p.release.is_none()
                        && message.message_id == p.message_id
                        && message.headers.iter().any(|(k, _)| k == REDRIVE_JOB_HEADER);
                    let redriven = p
                        .release
                        .as_ref()
                        .is_some_and(|r| r.primary_offset == Some(offset));
                    if redrive {
                        p.release = Some(Release {
                            by: "redrive".into(),
                            at_ms: message.timestamp_ms,
                            primary_offset: Some(offset),
                            item: None,
                        });
                        keys.out.push(OrderedRecord::Parked(p.clone()));
                    } else if redriven {
                        // The redriven record again, after a rebuild.
                    } else if offset <= p.last_held_origin {
                        // Copied to the hold before a crash: done.
                        self.engine.settle(offset);
                        return;
                    } else {
                        keys.insert(&key, offset);
                        keys.to_hold.insert(offset);
                        self.msgs.insert(offset, Box::new(message));
                        return;
                    }
                }
                keys.insert(&key, offset);
                if let Some(r) = keys.retry(offset) {
                    apply_retry(&mut message, r);
                }
            }
        }
        self.msgs.insert(offset, Box::new(message));
        if !self.failures.contains_key(&offset) {
            self.ready.push_back(offset);
        }
    }

    /// Ordered queues: the failure at `offset` is retried in place (its
    /// record `r` is in the ack log): the record waits in `ready` for its
    /// due time, as attempt `r.attempt`, keeping its key busy.
    pub fn retry_in_place(&mut self, r: RetryRecord) {
        let offset = r.offset;
        self.routing.remove(&offset);
        self.failures.remove(&offset);
        if let Err(e) = self.engine.retry_in_place(offset) {
            tracing::warn!("retry in place: {e}");
        }
        if let Some(m) = self.msgs.get_mut(&offset) {
            apply_retry(m, &r);
            let at = self.ready.partition_point(|&o| o < offset);
            if self.ready.get(at) != Some(&offset) {
                self.ready.insert(at, offset);
            }
        }
        if let Some(keys) = &mut self.ordered {
            keys.set_retry(r);
        }
    }

    /// The due time of the next record when it is not due at `now_ms`
    /// (a retry tier's record waits).
    pub fn next_due_ms(&self, now_ms: i64) -> Option<i64> {
        if let Some(keys) = &self.ordered {
            let replay = keys
                .replay
                .values()
                .filter(|i| i.lease.is_none())
                .filter_map(|i| i.msg.due_ms)
                .filter(|&d| d > now_ms)
                .min();
            return match (keys.next_due_ms(now_ms), replay) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        let offset = self.ready.front()?;
        self.msgs[offset].due_ms.filter(|&due| due > now_ms)
    }

    /// Leases up to `max_n` ready records that are due. A tier's records are
    /// taken in offset order up to the first not due (copies are written in
    /// due order, within clock skew), so this is O(messages leased).
    /// Returns each grant with its record, and whether it is a redelivery of
    /// a lease that was in flight at the previous owner's stop.
    pub fn lease(
        &mut self,
        max_n: usize,
        consumer: ConsumerSlot,
        lease_ms: i64,
        now_ms: i64,
    ) -> Vec<(Grant, &Buffered, bool)> {
        let candidates = if self.ordered.is_some() {
            self.ordered_candidates(max_n, now_ms)
        } else {
            self.candidates(max_n, now_ms)
        };
        let mut grants = if candidates.is_empty() {
            Vec::new()
        } else {
            self.lease_candidates(candidates, max_n, consumer, lease_ms, now_ms)
        };
        if self.ordered.is_some() && grants.len() < max_n {
            let room = max_n - grants.len();
            grants.extend(
                self.lease_replays(room, consumer, lease_ms, now_ms)
                    .into_iter()
                    .map(|g| (g, false)),
            );
        }
        let keys = self.ordered.as_ref();
        grants
            .into_iter()
            .map(|(g, crashed)| {
                let m = if g.receipt.partition.topic == HOLD_TOPIC {
                    let keys = keys.expect("replays are ordered");
                    &keys
                        .replay
                        .values()
                        .find(|i| i.hold_offset == g.receipt.offset)
                        .expect("just leased")
                        .msg
                } else {
                    &self.msgs[&g.receipt.offset]
                };
                (g, m, crashed)
            })
            .collect()
    }

    /// Ready records in offset order up to the first not due.
    fn candidates(&mut self, max_n: usize, now_ms: i64) -> Vec<Available> {
        let mut candidates = Vec::new();
        while candidates.len() < max_n {
            let Some(&offset) = self.ready.front() else {
                break;
            };
            let Some(m) = self.msgs.get(&offset) else {
                self.ready.pop_front();
                continue;
            };
            if m.due_ms.is_some_and(|due| due > now_ms) {
                break;
            }
            self.ready.pop_front();
            candidates.push(Available {
                offset,
                attempt: m.attempt,
                due_ms: m.due_ms,
            });
        }
        candidates
    }

    /// Ordered queues: ready records in offset order, skipping the ones not
    /// due and every keyed record with a lower offset of its key still held
    /// (in flight, failing, retrying, or itself skipped here), up to the end
    /// of the gap-cap window. Skipped records stay ready in their place.
    fn ordered_candidates(&mut self, max_n: usize, now_ms: i64) -> Vec<Available> {
        let keys = self.ordered.as_ref().expect("ordered");
        let window_end = self.engine.committed_offset() + i64::from(self.engine.config().gap_cap);
        let mut candidates = Vec::new();
        let mut taken = Vec::new();
        for (i, &offset) in self.ready.iter().enumerate() {
            if candidates.len() >= max_n || offset >= window_end {
                break;
            }
            let Some(m) = self.msgs.get(&offset) else {
                taken.push(i);
                continue;
            };
            if m.due_ms.is_some_and(|due| due > now_ms) {
                continue;
            }
            if let Some(key) = &m.key {
                if !keys.is_first(key, offset) {
                    continue;
                }
                // A parked key's only leasable record is its redriven one.
                if let Some(p) = keys.parked.get(key) {
                    if p.release.as_ref().and_then(|r| r.primary_offset) != Some(offset) {
                        continue;
                    }
                }
            }
            taken.push(i);
            candidates.push(Available {
                offset,
                attempt: m.attempt,
                due_ms: m.due_ms,
            });
        }
        for i in taken.into_iter().rev() {
            self.ready.remove(i);
        }
        candidates
    }

    fn lease_candidates(
        &mut self,
        candidates: Vec<Available>,
        max_n: usize,
        consumer: ConsumerSlot,
        lease_ms: i64,
        now_ms: i64,
    ) -> Vec<(Grant, bool)> {
        let grants = self.engine.lease(
            candidates.iter().copied(),
            max_n,
            consumer,
            lease_ms,
            now_ms,
        );
        // What the engine refused: beyond the gap-cap window goes back to
        // the front, in order, to wait for the commit point; anything else
        // (acked before, below the commit point) is done. Most times the
        // engine grants every candidate.
        if grants.len() < candidates.len() {
            let granted: HashSet<i64> = grants.iter().map(|g| g.receipt.offset).collect();
            let window_end =
                self.engine.committed_offset() + i64::from(self.engine.config().gap_cap);
            for c in candidates.iter().rev() {
                if granted.contains(&c.offset) {
                    continue;
                }
                if c.offset >= window_end {
                    self.ready.push_front(c.offset);
                } else {
                    self.remove_msg(c.offset);
                }
            }
        }
        let crashed = !self.crashed.is_empty();
        grants
            .into_iter()
            .map(|g| {
                let was = crashed && self.crashed.remove(&g.receipt.offset);
                (g, was)
            })
            .collect()
    }

    pub fn message(&self, offset: i64) -> Option<&Buffered> {
        self.msgs.get(&offset).map(|m| &**m)
    }

    /// The record at `offset` is acked or routed: forget it, and every
    /// record the commit point has passed.
    pub fn done(&mut self, offset: i64) {
        self.remove_msg(offset);
        self.trim();
    }

    /// Drops what the commit point has passed. Called once per acked or
    /// routed offset, so it pops from the front (nothing, most times)
    /// rather than splitting the maps: `split_off` moved the 2,000 buffered
    /// records into a new tree on every ack, a tenth of the dispatcher's
    /// CPU under load.
    fn trim(&mut self) {
        let committed = self.engine.committed_offset();
        while let Some(entry) = self.msgs.first_entry() {
            if *entry.key() >= committed {
                break;
            }
            let (offset, m) = entry.remove_entry();
            if let (Some(keys), Some(key)) = (&mut self.ordered, &m.key) {
                // Left retention.
                keys.record_gone(key, offset);
            }
        }
        if let Some(keys) = &mut self.ordered {
            keys.trim(committed);
        }
        while self
            .failures
            .first_key_value()
            .is_some_and(|(&o, _)| o < committed)
        {
            self.failures.pop_first();
        }
        while self.acked_before.first().is_some_and(|&o| o < committed) {
            self.acked_before.pop_first();
        }
        while self.ready.front().is_some_and(|&o| o < committed) {
            self.ready.pop_front();
        }
    }

    /// A failure from the engine: its record waits for the copy.
    pub fn fail(&mut self, failure: Failure) {
        self.failures.insert(failure.offset, failure);
    }

    /// Failures whose record is here and whose copy nobody is writing:
    /// marked as being routed.
    pub fn take_routable(&mut self) -> Vec<(Failure, Buffered)> {
        let mut out = Vec::new();
        for (offset, failure) in &self.failures {
            if self.routing.contains(offset) {
                continue;
            }
            if let Some(m) = self.msgs.get(offset) {
                out.push((failure.clone(), Buffered::clone(m)));
            }
        }
        for (f, _) in &out {
            self.routing.insert(f.offset);
        }
        out
    }

    /// The copy of the failure at `offset` is written.
    pub fn routed(&mut self, offset: i64) {
        self.routing.remove(&offset);
        if self.failures.remove(&offset).is_some() {
            if let Err(e) = self.engine.routed(offset) {
                tracing::warn!("routed: {e}");
            }
        }
        self.done(offset);
    }

    /// Writing the copy failed: the next routing round tries again.
    pub fn route_failed(&mut self, offset: i64) {
        self.routing.remove(&offset);
    }

    pub fn has_routable(&self) -> bool {
        self.failures.len() > self.routing.len()
    }

    /// Timestamp of the oldest record at or above the commit point we hold.
    pub fn oldest_timestamp_ms(&self) -> Option<i64> {
        self.msgs.values().next().map(|m| m.timestamp_ms)
    }

    /// Nothing fetched or failed below `offset`: the offsets from the
    /// commit point up to it may be declared gone (left retention).
    pub fn nothing_held_below(&self, offset: i64) -> bool {
        self.msgs.range(..offset).next().is_none() && self.failures.range(..offset).next().is_none()
    }

    /// The records below `log_start` left the log unacked: done without a
    /// lease. Returns how many offsets that was.
    pub fn left_retention(&mut self, log_start: i64) -> i64 {
        let committed = self.engine.committed_offset();
        if log_start <= committed || !self.nothing_held_below(log_start) {
            return 0;
        }
        self.engine.mark_absent(committed, log_start);
        self.fetched_to = self.fetched_to.max(log_start);
        self.trim();
        log_start - committed
    }
}

/// Why a skip was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipRefused {
    NotParked,
    /// The key is parked by another message (its id).
    OtherMessage(String),
    /// Released already (by a skip or a redrive): its hold is replaying.
    Released,
}

/// Ordered queues: parked keys, their hold copies, and the replay of the
/// hold once a key is released (see `queue::ordered`).
impl PartitionState {
    fn keys_mut(&mut self) -> &mut OrderedKeys {
        self.ordered.as_mut().expect("an ordered partition")
    }

    pub fn has_ordered_out(&self) -> bool {
        self.ordered.as_ref().is_some_and(|k| !k.out.is_empty())
    }

    /// The ordered-queue records to write to the ack log, in order.
    pub fn take_ordered_out(&mut self) -> Vec<OrderedRecord> {
        self.ordered
            .as_mut()
            .map(|k| std::mem::take(&mut k.out))
            .unwrap_or_default()
    }

    /// A message of `key` was dead-lettered: the key is parked (again, when
    /// it was being released). Its records held here wait for their hold
    /// copy. `false` when the table of parked keys is full: not parked.
    pub fn park(&mut self, key: &bytes::Bytes, message_id: &str, now_ms: i64) -> bool {
        let keys = self.keys_mut();
        if !keys.parked.contains_key(key) && keys.parked.len() >= MAX_PARKED_KEYS {
            return false;
        }
        let p = keys.parked.entry(key.clone()).or_insert_with(|| ParkedKey {
            key: key.to_vec(),
            message_id: String::new(),
            parked_at_ms: now_ms,
            held: 0,
            first_hold: None,
            last_hold: None,
            last_held_origin: -1,
            replayed_origin: -1,
            release: None,
            auto_release_at_ms: None,
        });
        p.auto_release_at_ms = None;
        p.message_id = message_id.to_owned();
        p.parked_at_ms = now_ms;
        p.release = None;
        let record = OrderedRecord::Parked(p.clone());
        keys.out.push(record);
        keys.replay.remove(key);
        let offsets = keys.offsets_of(key);
        for &o in &offsets {
            keys.to_hold.insert(o);
        }
        self.ready.retain(|o| !offsets.contains(o));
        true
    }

    /// Ordered queues: when the prefetch is full of records waiting behind
    /// busy keys (a head message in flight or retrying), the key with the
    /// most waiting records is spilled: parked, with its head message still
    /// served here first (as a redriven one is) and its other records
    /// copied to the hold, to be replayed once the head is acked (if the
    /// head is dead-lettered, the key stays parked by it). The prefetch is
    /// then free for the other keys. Returns whether a key was spilled.
    pub fn spill(&mut self, now_ms: i64) -> bool {
        let Some(keys) = &self.ordered else {
            return false;
        };
        if self.ready.len() < PREFETCH_MAX || keys.parked.len() >= MAX_PARKED_KEYS {
            return false;
        }
        let mut waiting: HashMap<bytes::Bytes, usize> = HashMap::new();
        for o in &self.ready {
            if let Some(key) = self.msgs.get(o).and_then(|m| m.key.as_ref()) {
                if !keys.is_first(key, *o) && !keys.parked.contains_key(key) {
                    *waiting.entry(key.clone()).or_default() += 1;
                }
            }
        }
        let Some((key, _)) = waiting.into_iter().max_by_key(|&(_, n)| n) else {
            return false;
        };
        let Some(&head) = keys.offsets_of(&key).first() else {
            return false;
        };
        let Some(id) = self.msgs.get(&head).map(|m| m.message_id.clone()) else {
            return false;
        };
        let head_ready = self.ready.contains(&head);
        if !self.park(&key, &id, now_ms) {
            return false;
        }
        let keys = self.keys_mut();
        keys.to_hold.remove(&head);
        if let Some(p) = keys.parked.get_mut(&key) {
            p.release = Some(Release {
                by: "spill".into(),
                at_ms: now_ms,
                primary_offset: Some(head),
                item: None,
            });
            let record = OrderedRecord::Parked(p.clone());
            keys.out.push(record);
        }
        if head_ready {
            let at = self.ready.partition_point(|&o| o < head);
            self.ready.insert(at, head);
        }
        true
    }

    /// Records waiting for their hold copy: the lowest of each key not being
    /// copied (one copy per key at a time keeps the hold in order), marked
    /// as being copied.
    pub fn take_holdable(&mut self) -> Vec<(i64, Buffered)> {
        let Some(keys) = &mut self.ordered else {
            return Vec::new();
        };
        let mut busy: HashSet<bytes::Bytes> = keys
            .holding
            .iter()
            .filter_map(|o| self.msgs.get(o).and_then(|m| m.key.clone()))
            .collect();
        let mut out = Vec::new();
        for &offset in &keys.to_hold {
            if keys.holding.contains(&offset) {
                continue;
            }
            let Some(m) = self.msgs.get(&offset) else {
                continue;
            };
            let Some(key) = &m.key else { continue };
            if busy.insert(key.clone()) {
                out.push((offset, Buffered::clone(m)));
            }
        }
        for (o, _) in &out {
            keys.holding.insert(*o);
        }
        out
    }

    pub fn has_holdable(&self) -> bool {
        self.ordered
            .as_ref()
            .is_some_and(|k| k.to_hold.len() > k.holding.len())
    }

    /// The record at `offset` was copied to the hold at `hold_offset`: done
    /// here (the commit point may pass it).
    pub fn held(&mut self, offset: i64, hold_offset: i64) {
        let Some(key) = self.msgs.get(&offset).and_then(|m| m.key.clone()) else {
            return;
        };
        let keys = self.keys_mut();
        keys.holding.remove(&offset);
        keys.to_hold.remove(&offset);
        if let Some(p) = keys.parked.get_mut(&key) {
            p.held += 1;
            if !p.hold_left() {
                p.first_hold = Some(hold_offset);
            }
            p.last_hold = Some(hold_offset);
            p.last_held_origin = p.last_held_origin.max(offset);
            let record = OrderedRecord::Parked(p.clone());
            keys.out.push(record);
        }
        self.engine.settle(offset);
        self.remove_msg(offset);
        self.trim();
    }

    pub fn hold_failed(&mut self, offset: i64) {
        if let Some(keys) = &mut self.ordered {
            keys.holding.remove(&offset);
        }
    }

    /// Released keys whose next hold copy should be read now: (key, first
    /// hold offset to read, last hold offset, origin offset of the last
    /// replayed copy). Marked as loading.
    pub fn replay_wanted(&mut self) -> Vec<(bytes::Bytes, i64, i64, i64)> {
        let Some(keys) = &mut self.ordered else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (key, p) in &keys.parked {
            let Some(r) = &p.release else { continue };
            if r.primary_offset.is_some()
                || !p.hold_left()
                || keys.replay.contains_key(key)
                || keys.loading.contains(key)
            {
                continue;
            }
            let (Some(first), Some(last)) = (p.first_hold, p.last_hold) else {
                continue;
            };
            out.push((key.clone(), first, last, p.replayed_origin));
        }
        for (key, ..) in &out {
            keys.loading.insert(key.clone());
        }
        out
    }

    /// The hold read for `key` found its next copy (at `hold_offset`), or
    /// none up to `scanned_to` (exclusive); `None, None` when the read
    /// failed (tried again later).
    pub fn replay_loaded(
        &mut self,
        key: &bytes::Bytes,
        found: Option<(i64, Buffered)>,
        scanned_to: Option<i64>,
    ) {
        let keys = self.keys_mut();
        keys.loading.remove(key);
        let Some(p) = keys.parked.get_mut(key) else {
            return;
        };
        match found {
            Some((hold_offset, mut msg)) => {
                p.first_hold = Some(hold_offset);
                let retry = p
                    .release
                    .as_ref()
                    .and_then(|r| r.item.clone())
                    .filter(|i| i.hold_offset == hold_offset);
                if let (Some(retry), Some(env)) = (retry, &mut msg.envelope) {
                    env.attempt = Attempt(retry.attempt);
                    env.due_ms = Some(retry.due_ms);
                    env.errors = retry.errors;
                    msg.attempt = Attempt(retry.attempt);
                    msg.due_ms = Some(retry.due_ms);
                }
                let origin_offset = super::ordered::held_from(&msg);
                keys.replay.insert(
                    key.clone(),
                    ReplayItem {
                        hold_offset,
                        origin_offset,
                        msg,
                        lease: None,
                        dead: false,
                    },
                );
            }
            None => {
                if let Some(to) = scanned_to {
                    p.first_hold = Some(to);
                }
                keys.check_finished(key);
            }
        }
    }

    /// Leases replayed hold copies that are due (one per released key).
    fn lease_replays(
        &mut self,
        max_n: usize,
        consumer: ConsumerSlot,
        lease_ms: i64,
        now_ms: i64,
    ) -> Vec<Grant> {
        let generation = self.engine.generation();
        let max_total = self.engine.config().max_total_lease_ms;
        let partition = QueuePartition {
            topic: HOLD_TOPIC,
            partition: self.engine.partition().partition,
        };
        let lease_ms = lease_ms.clamp(1, max_total);
        let keys = self.keys_mut();
        let mut grants = Vec::new();
        for item in keys.replay.values_mut() {
            if grants.len() >= max_n {
                break;
            }
            if item.lease.is_some() || item.dead || item.msg.due_ms.is_some_and(|d| d > now_ms) {
                continue;
            }
            let expiry_ms = now_ms + lease_ms;
            item.lease = Some(ReplayLease {
                generation,
                expiry_ms,
                deadline_ms: now_ms + max_total,
                consumer,
            });
            grants.push(Grant {
                receipt: Receipt {
                    partition,
                    offset: item.hold_offset,
                    generation,
                },
                expiry_ms,
                attempt: item.msg.attempt,
            });
        }
        grants
    }

    /// The key and lease of a replayed copy's receipt.
    fn replay_lease(&self, receipt: &Receipt) -> Result<(bytes::Bytes, ReplayLease), LeaseError> {
        let offset = receipt.offset;
        let (key, item) = self
            .ordered
            .as_ref()
            .and_then(|k| k.replay.iter().find(|(_, i)| i.hold_offset == offset))
            .ok_or(LeaseError::StaleReceipt { offset })?;
        match item.lease {
            Some(l) if l.generation == receipt.generation && !item.dead => Ok((key.clone(), l)),
            Some(_) => Err(LeaseError::StaleGeneration { offset }),
            None => Err(LeaseError::StaleReceipt { offset }),
        }
    }

    /// Acks a replayed copy: the key's replay moves on.
    pub fn replay_ack(&mut self, receipt: &Receipt) -> Result<(), LeaseError> {
        let (key, _) = self.replay_lease(receipt)?;
        let keys = self.keys_mut();
        let item = keys.replay.remove(&key).expect("found");
        if let Some(p) = keys.parked.get_mut(&key) {
            p.first_hold = Some(item.hold_offset + 1);
            p.replayed_origin = p.replayed_origin.max(item.origin_offset);
            p.held = p.held.saturating_sub(1);
            if let Some(r) = &mut p.release {
                r.item = None;
            }
            let record = OrderedRecord::Parked(p.clone());
            keys.out.push(record);
        }
        keys.check_finished(&key);
        Ok(())
    }

    pub fn replay_extend(
        &mut self,
        receipt: &Receipt,
        lease_ms: i64,
        now_ms: i64,
    ) -> Result<Extended, LeaseError> {
        let (key, lease) = self.replay_lease(receipt)?;
        let wanted = now_ms.saturating_add(lease_ms.max(1));
        let capped = wanted > lease.deadline_ms;
        let expiry_ms = wanted.min(lease.deadline_ms).max(lease.expiry_ms);
        let item = self.keys_mut().replay.get_mut(&key).expect("found");
        if let Some(l) = &mut item.lease {
            l.expiry_ms = expiry_ms;
        }
        Ok(Extended { expiry_ms, capped })
    }

    /// The key and consumer of a replayed copy's lease.
    pub fn replay_key(
        &self,
        receipt: &Receipt,
    ) -> Result<(bytes::Bytes, ConsumerSlot), LeaseError> {
        self.replay_lease(receipt).map(|(k, l)| (k, l.consumer))
    }

    /// Replayed copies whose lease ran out: (key, consumer).
    pub fn replay_expired(&self, now_ms: i64) -> Vec<(bytes::Bytes, ConsumerSlot)> {
        let Some(keys) = &self.ordered else {
            return Vec::new();
        };
        keys.replay
            .iter()
            .filter_map(|(k, i)| match i.lease {
                Some(l) if !i.dead && l.expiry_ms <= now_ms => Some((k.clone(), l.consumer)),
                _ => None,
            })
            .collect()
    }

    /// A replayed copy failed. Retried (in place, as any ordered keyed
    /// message, its state in the key's record) or, after the last attempt,
    /// dead-lettered: then returns the copy for the DLQ (its envelope with
    /// the whole history), and the caller calls [`Self::replay_dead_lettered`]
    /// once it is written (or [`Self::replay_dlq_failed`]).
    pub fn replay_fail(
        &mut self,
        key: &bytes::Bytes,
        cause: FailureCause,
        retry_after_ms: i64,
        error: &str,
        consumer: Option<&str>,
        now_ms: i64,
    ) -> Option<Buffered> {
        let attempt = self.ordered.as_ref()?.replay.get(key)?.msg.attempt;
        let route = self
            .engine
            .route_for(attempt, cause, retry_after_ms, now_ms);
        let keys = self.keys_mut();
        let item = keys.replay.get_mut(key)?;
        item.lease = None;
        let (message_id, first_ms) = (item.msg.message_id.clone(), item.msg.timestamp_ms);
        let origin_offset = item.origin_offset;
        let env = item.msg.envelope.get_or_insert_with(|| RetryEnvelope {
            origin_topic: String::new(),
            origin_partition: -1,
            origin_offset,
            message_id,
            attempt,
            first_enqueued_ms: first_ms,
            due_ms: None,
            errors: Vec::new(),
        });
        env.push_failure(attempt, now_ms, error, consumer);
        match route {
            Route::RetryTier { due_ms, .. } => {
                env.attempt = attempt.next();
                env.due_ms = Some(due_ms);
                let retry = ReplayRetry {
                    hold_offset: item.hold_offset,
                    attempt: env.attempt.0,
                    due_ms,
                    errors: env.errors.clone(),
                };
                item.msg.attempt = attempt.next();
                item.msg.due_ms = Some(due_ms);
                if let Some(p) = keys.parked.get_mut(key) {
                    if let Some(r) = &mut p.release {
                        r.item = Some(retry);
                    }
                    let record = OrderedRecord::Parked(p.clone());
                    keys.out.push(record);
                }
                None
            }
            Route::Dlq => {
                env.attempt = attempt;
                env.due_ms = None;
                item.dead = true;
                let mut copy = item.msg.clone();
                let env = copy.envelope.clone().expect("set above");
                env.write_into(&mut copy.headers);
                Some(copy)
            }
        }
    }

    /// The DLQ copy of `key`'s replayed copy is written: the key is parked
    /// by it, and the rest of its hold waits.
    pub fn replay_dead_lettered(&mut self, key: &bytes::Bytes, now_ms: i64) {
        let keys = self.keys_mut();
        let Some(item) = keys.replay.remove(key) else {
            return;
        };
        if let Some(p) = keys.parked.get_mut(key) {
            p.first_hold = Some(item.hold_offset + 1);
            p.replayed_origin = p.replayed_origin.max(item.origin_offset);
            p.held = p.held.saturating_sub(1);
            p.message_id = item.msg.message_id.clone();
            p.parked_at_ms = now_ms;
            p.release = None;
            let record = OrderedRecord::Parked(p.clone());
            keys.out.push(record);
        }
    }

    /// Writing the DLQ copy failed: the copy is leasable again.
    pub fn replay_dlq_failed(&mut self, key: &bytes::Bytes) {
        if let Some(item) = self.keys_mut().replay.get_mut(key) {
            item.dead = false;
        }
    }

    /// Releases a parked key without a redrive: its hold is replayed next.
    pub fn skip(
        &mut self,
        key: &bytes::Bytes,
        message_id: &str,
        now_ms: i64,
    ) -> Result<(), SkipRefused> {
        let keys = self.ordered.as_mut().ok_or(SkipRefused::NotParked)?;
        let p = keys.parked.get_mut(key).ok_or(SkipRefused::NotParked)?;
        if p.message_id != message_id {
            return Err(SkipRefused::OtherMessage(p.message_id.clone()));
        }
        if p.release.is_some() {
            return Err(SkipRefused::Released);
        }
        p.release = Some(Release {
            by: "skip".into(),
            at_ms: now_ms,
            primary_offset: None,
            item: None,
        });
        let record = OrderedRecord::Parked(p.clone());
        keys.out.push(record);
        keys.check_finished(key);
        Ok(())
    }

    /// The gap cap (issue 8, decision 4): when the window above the commit
    /// point is full and the record at the commit point is a keyed record
    /// retried in place, it is moved to the hold, its key parked by it and
    /// released by itself at its due time, so the commit point moves on.
    /// Returns it, marked as being copied (not for a key parked already, nor
    /// when the table of parked keys is full).
    pub fn take_stuck(&mut self) -> Option<(i64, Buffered)> {
        let keys = self.ordered.as_ref()?;
        if !self.engine.window_full() {
            return None;
        }
        let offset = self.engine.committed_offset();
        keys.retry(offset)?;
        let m = self.msgs.get(&offset)?;
        let key = m.key.as_ref()?;
        if self.engine.is_in_flight(offset)
            || keys.holding.contains(&offset)
            || keys.parked.contains_key(key)
            || keys.parked.len() >= MAX_PARKED_KEYS
        {
            return None;
        }
        let m = Buffered::clone(m);
        self.keys_mut().holding.insert(offset);
        self.ready.retain(|&o| o != offset);
        Some((offset, m))
    }

    /// The stuck record at `offset` is in the hold at `hold_offset`.
    pub fn stuck_held(&mut self, offset: i64, hold_offset: i64, now_ms: i64) {
        let Some(m) = self.msgs.get(&offset) else {
            return;
        };
        let (Some(key), id) = (m.key.clone(), m.message_id.clone()) else {
            return;
        };
        let due_ms = m.due_ms.unwrap_or(now_ms);
        self.keys_mut().holding.remove(&offset);
        self.engine.settle(offset);
        self.remove_msg(offset);
        self.trim();
        if !self.park(&key, &id, now_ms) {
            return;
        }
        let keys = self.keys_mut();
        if let Some(p) = keys.parked.get_mut(&key) {
            p.auto_release_at_ms = Some(due_ms);
            p.held += 1;
            if !p.hold_left() {
                p.first_hold = Some(hold_offset);
            }
            p.last_hold = Some(hold_offset);
            p.last_held_origin = p.last_held_origin.max(offset);
            let record = OrderedRecord::Parked(p.clone());
            keys.out.push(record);
        }
    }

    /// Writing the stuck record's hold copy failed: it waits as before.
    pub fn stuck_hold_failed(&mut self, offset: i64) {
        self.keys_mut().holding.remove(&offset);
        if self.msgs.contains_key(&offset) {
            let at = self.ready.partition_point(|&o| o < offset);
            self.ready.insert(at, offset);
        }
    }

    /// Releases the keys the gap cap parked whose message is due.
    pub fn auto_release(&mut self, now_ms: i64) {
        let Some(keys) = &mut self.ordered else {
            return;
        };
        let due: Vec<bytes::Bytes> = keys
            .parked
            .iter()
            .filter(|(_, p)| {
                p.release.is_none() && p.auto_release_at_ms.is_some_and(|t| t <= now_ms)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            if let Some(p) = keys.parked.get_mut(&key) {
                p.auto_release_at_ms = None;
                p.release = Some(Release {
                    by: "gap_cap".into(),
                    at_ms: now_ms,
                    primary_offset: None,
                    item: None,
                });
                let record = OrderedRecord::Parked(p.clone());
                keys.out.push(record);
            }
            keys.check_finished(&key);
        }
    }

    /// The parked keys, for the API.
    pub fn parked_keys(&self) -> Vec<ParkedKey> {
        self.ordered
            .as_ref()
            .map(|k| k.parked().cloned().collect())
            .unwrap_or_default()
    }
}

/// A record retried in place: its next attempt, due time and history (the
/// envelope its DLQ copy will carry).
fn apply_retry(m: &mut Buffered, r: &RetryRecord) {
    m.attempt = Attempt(r.attempt);
    m.due_ms = Some(r.due_ms);
    m.envelope = Some(RetryEnvelope {
        origin_topic: r.origin_topic.clone(),
        origin_partition: r.origin_partition,
        origin_offset: r.origin_offset,
        message_id: m.message_id.clone(),
        attempt: Attempt(r.attempt),
        first_enqueued_ms: r.first_enqueued_ms,
        due_ms: Some(r.due_ms),
        errors: r.errors.clone(),
    });
}

/// The offsets above the final commit point that the ack log records as
/// acked (the engine keeps them but does not say which).
pub fn acked_above_commit(events: &[LeaseEvent], committed: i64) -> BTreeSet<i64> {
    let mut acked = BTreeSet::new();
    for event in events {
        match event {
            LeaseEvent::Acked { offset } => {
                acked.insert(*offset);
            }
            LeaseEvent::AckedRun { start, end } => {
                acked.extend(*start..*end);
            }
            LeaseEvent::Leased { offset, .. } => {
                acked.remove(offset);
            }
            LeaseEvent::LeasedBatch { runs, .. } => {
                for run in runs {
                    for offset in run.offsets() {
                        acked.remove(&offset);
                    }
                }
            }
            LeaseEvent::Failed(f) => {
                acked.remove(&f.offset);
            }
            LeaseEvent::CommitAdvanced { offset, .. } => {
                acked = acked.split_off(offset);
            }
        }
    }
    acked.split_off(&committed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{LeaseConfig, QueuePartition};

    const P: QueuePartition = QueuePartition {
        topic: 0,
        partition: 0,
    };

    fn config() -> LeaseConfig {
        LeaseConfig {
            lease_ms: 1_000,
            max_total_lease_ms: 10_000,
            retry_tiers_ms: vec![1_000, 2_000],
            max_attempts: 3,
            gap_cap: 4,
        }
    }

    fn msg(offset: i64, due_ms: Option<i64>) -> Buffered {
        let headers = match due_ms {
            None => vec![],
            Some(due) => RetryEnvelope {
                origin_topic: "t".into(),
                origin_partition: 0,
                origin_offset: offset,
                message_id: format!("m{offset}"),
                attempt: Attempt(2),
                first_enqueued_ms: 0,
                due_ms: Some(due),
                errors: vec![],
            }
            .to_headers(),
        };
        Buffered::new(
            "t",
            0,
            offset,
            None,
            bytes::Bytes::new(),
            headers,
            100 + offset,
            due_ms.is_some(),
        )
    }

    fn state() -> PartitionState {
        PartitionState::new(PartitionLeases::new(P, config(), 0).unwrap())
    }

    #[test]
    fn fetched_records_are_leased_in_order_and_acks_move_the_commit_point() {
        let mut s = state();
        for o in 0..3 {
            s.offer(o, msg(o, None));
        }
        s.offer(1, msg(1, None));
        assert_eq!(s.ready_len(), 3, "a refetched offset is ignored");
        let got: Vec<i64> = s
            .lease(2, ConsumerSlot(0), 1_000, 0)
            .iter()
            .map(|(g, _, _)| g.receipt.offset)
            .collect();
        assert_eq!(got, vec![0, 1]);
        let r0 = crate::lease::Receipt {
            partition: P,
            offset: 0,
            generation: crate::lease::Generation(0),
        };
        s.engine.ack(&r0).unwrap();
        s.done(0);
        assert_eq!(s.engine.committed_offset(), 1);
        assert_eq!(s.buffered_len(), 2);
        assert_eq!(s.oldest_timestamp_ms(), Some(101));
    }

    #[test]
    fn the_gap_cap_window_holds_records_back_without_losing_them() {
        let mut s = state();
        for o in 0..6 {
            s.offer(o, msg(o, None));
        }
        assert_eq!(s.lease(10, ConsumerSlot(0), 1_000, 0).len(), 4);
        assert_eq!(s.ready_len(), 2, "offsets 4 and 5 wait for the window");
        assert!(s.lease(10, ConsumerSlot(0), 1_000, 0).is_empty());
        assert_eq!(s.ready_len(), 2);
    }

    #[test]
    fn a_tier_record_waits_for_its_due_time_and_reports_it() {
        let engine = PartitionLeases::new(
            QueuePartition {
                topic: 1,
                partition: 0,
            },
            config(),
            0,
        )
        .unwrap();
        let mut s = PartitionState::new(engine);
        s.offer(0, msg(0, Some(5_000)));
        assert!(s.lease(1, ConsumerSlot(0), 1_000, 4_999).is_empty());
        assert_eq!(s.next_due_ms(4_999), Some(5_000));
        let got = s.lease(1, ConsumerSlot(0), 1_000, 5_000);
        assert_eq!(got[0].0.attempt, Attempt(2));
        assert_eq!(s.next_due_ms(5_000), None);
    }

    #[test]
    fn failures_route_once_their_record_is_here() {
        let mut s = state();
        s.offer(0, msg(0, None));
        assert_eq!(s.lease(1, ConsumerSlot(0), 1_000, 0).len(), 1);
        let failures = s.engine.expire(1_000);
        assert_eq!(failures.len(), 1);
        s.fail(failures[0].clone());
        assert!(s.has_routable());
        let jobs = s.take_routable();
        assert_eq!(jobs.len(), 1);
        assert!(s.take_routable().is_empty(), "being routed");
        s.route_failed(0);
        assert_eq!(s.take_routable().len(), 1);
        s.routed(0);
        assert_eq!(s.engine.committed_offset(), 1);
        assert!(!s.has_routable());
        assert_eq!(s.buffered_len(), 0);
    }

    #[test]
    fn a_rebuilt_partition_drops_what_was_acked_and_releases_what_was_in_flight() {
        let mut old = state();
        for o in 0..3 {
            old.offer(o, msg(o, None));
        }
        let grants: Vec<_> = old
            .lease(3, ConsumerSlot(0), 1_000, 0)
            .iter()
            .map(|(g, _, _)| g.receipt)
            .collect();
        old.engine.ack(&grants[1]).unwrap();
        let events = old.engine.drain_events();
        let rebuilt = PartitionLeases::rebuild(P, config(), 0, events.clone()).unwrap();
        let acked = acked_above_commit(&events, rebuilt.leases.committed_offset());
        assert_eq!(acked, BTreeSet::from([1]));
        let mut s = PartitionState::rebuilt(rebuilt, acked);
        for o in 0..3 {
            s.offer(o, msg(o, None));
        }
        let got: Vec<(i64, bool)> = s
            .lease(3, ConsumerSlot(0), 1_000, 0)
            .iter()
            .map(|(g, _, crashed)| (g.receipt.offset, *crashed))
            .collect();
        assert_eq!(got, vec![(0, true), (2, true)]);
    }

    fn keyed(offset: i64, key: &str) -> Buffered {
        Buffered::new(
            "t",
            0,
            offset,
            Some(bytes::Bytes::copy_from_slice(key.as_bytes())),
            bytes::Bytes::new(),
            vec![],
            100 + offset,
            false,
        )
    }

    fn ordered_state(config: LeaseConfig) -> PartitionState {
        let mut s = PartitionState::new(PartitionLeases::new(P, config, 0).unwrap());
        s.set_ordered(OrderedKeys::default());
        s
    }

    fn leased(s: &mut PartitionState, now_ms: i64) -> Vec<(i64, u16)> {
        s.lease(100, ConsumerSlot(1), 1_000, now_ms)
            .iter()
            .map(|(g, _, _)| (g.receipt.offset, g.attempt.0))
            .collect()
    }

    fn receipt(offset: i64, generation: u32) -> crate::lease::Receipt {
        crate::lease::Receipt {
            partition: P,
            offset,
            generation: crate::lease::Generation(generation),
        }
    }

    /// The record a nack of `failure` writes for a retry in place (what the
    /// runtime builds with `failure_copy`).
    fn retry_record(s: &PartitionState, failure: &Failure) -> RetryRecord {
        let m = s.message(failure.offset).unwrap();
        let (env, _) = m.failure_copy("t", 0, failure.offset, failure, Some("w1"));
        RetryRecord {
            offset: failure.offset,
            attempt: env.attempt.0,
            due_ms: env.due_ms.unwrap(),
            failed_attempt: failure.attempt.0,
            failed_at_ms: failure.at_ms,
            origin_topic: env.origin_topic,
            origin_partition: env.origin_partition,
            origin_offset: env.origin_offset,
            first_enqueued_ms: env.first_enqueued_ms,
            errors: env.errors,
        }
    }

    fn ordered_config() -> LeaseConfig {
        LeaseConfig {
            gap_cap: 100,
            ..config()
        }
    }

    #[test]
    fn an_ordered_key_has_one_message_out_and_the_ack_releases_the_next() {
        let mut s = ordered_state(ordered_config());
        for (o, k) in [(0, "a"), (1, "a"), (2, "b"), (3, "a"), (4, "b")] {
            s.offer(o, keyed(o, k));
        }
        s.offer(5, msg(5, None));
        assert_eq!(
            leased(&mut s, 0),
            vec![(0, 1), (2, 1), (5, 1)],
            "one per key, in offset order; unkeyed records are not ordered"
        );
        assert_eq!(leased(&mut s, 0), vec![], "busy keys are skipped");
        assert_eq!(s.ready_len(), 3, "skipped records keep their place");
        s.engine.ack(&receipt(2, 0)).unwrap();
        s.done(2);
        assert_eq!(leased(&mut s, 0), vec![(4, 1)], "b's next after b's ack");
        s.engine.ack(&receipt(0, 0)).unwrap();
        s.done(0);
        assert_eq!(leased(&mut s, 0), vec![(1, 1)], "a's next, not a's last");
    }

    #[test]
    fn a_retry_in_place_keeps_its_key_busy_and_returns_at_its_due_time() {
        let mut s = ordered_state(ordered_config());
        for (o, k) in [(0, "a"), (1, "a"), (2, "b")] {
            s.offer(o, keyed(o, k));
        }
        assert_eq!(leased(&mut s, 0), vec![(0, 1), (2, 1)]);
        let failure = s
            .engine
            .nack(&receipt(0, 0), None, "db down", false, 500)
            .unwrap();
        assert_eq!(
            failure.route,
            crate::lease::Route::RetryTier {
                tier: 0,
                due_ms: 1_500
            }
        );
        s.fail(failure.clone());
        assert_eq!(s.take_routable().len(), 1);
        let record = retry_record(&s, &failure);
        s.retry_in_place(record.clone());
        assert!(!s.has_routable());
        assert_eq!(s.next_due_ms(500), Some(1_500));
        assert_eq!(
            leased(&mut s, 1_499),
            vec![],
            "not due, and a's later message does not overtake it"
        );
        let again = s.lease(10, ConsumerSlot(1), 1_000, 1_500);
        assert_eq!(again.len(), 1);
        let (grant, m, _) = &again[0];
        assert_eq!((grant.receipt.offset, grant.attempt), (0, Attempt(2)));
        let env = m.envelope.clone().unwrap();
        assert_eq!(env.errors.len(), 1);
        assert_eq!(env.errors[0].error, "db down");
        assert_eq!(env.origin_offset, 0);
        // The last attempt fails: DLQ, with the whole history.
        s.engine.expire(2_500);
        let s2 = s.lease(10, ConsumerSlot(1), 1_000, 2_500);
        assert!(s2.is_empty(), "a's failure waits for its route, still busy");
    }

    #[test]
    fn the_last_failure_of_a_retried_message_carries_its_history_to_the_dlq() {
        let mut s = ordered_state(LeaseConfig {
            max_attempts: 2,
            ..ordered_config()
        });
        s.offer(0, keyed(0, "a"));
        s.offer(1, keyed(1, "a"));
        leased(&mut s, 0);
        let f1 = s
            .engine
            .nack(&receipt(0, 0), None, "first", false, 0)
            .unwrap();
        s.fail(f1.clone());
        s.take_routable();
        let record = retry_record(&s, &f1);
        s.retry_in_place(record);
        assert_eq!(leased(&mut s, 1_000), vec![(0, 2)]);
        let f2 = s
            .engine
            .nack(&receipt(0, 0), None, "second", false, 1_100)
            .unwrap();
        assert_eq!(f2.route, crate::lease::Route::Dlq);
        s.fail(f2.clone());
        let jobs = s.take_routable();
        let (env, _) = jobs[0].1.failure_copy("t", 0, 0, &f2, None);
        let errors: Vec<&str> = env.errors.iter().map(|e| e.error.as_str()).collect();
        assert_eq!(errors, ["first", "second"]);
        assert_eq!(env.attempt, Attempt(2));
        s.routed(0);
        assert_eq!(leased(&mut s, 1_100), vec![(1, 1)], "the key moves on");
    }

    #[test]
    fn a_rebuild_restores_a_retry_in_place_and_its_busy_key() {
        let mut old = ordered_state(ordered_config());
        for (o, k) in [(0, "a"), (1, "a"), (2, "b")] {
            old.offer(o, keyed(o, k));
        }
        leased(&mut old, 0);
        let failure = old
            .engine
            .nack(&receipt(0, 0), None, "x", false, 0)
            .unwrap();
        old.fail(failure.clone());
        old.take_routable();
        let record = retry_record(&old, &failure);
        old.retry_in_place(record.clone());
        let events = old.engine.drain_events();
        // The new owner: the engine sees a failure waiting for its route;
        // the retry record says it was retried in place.
        let rebuilt = PartitionLeases::rebuild(P, ordered_config(), 0, events.clone()).unwrap();
        assert_eq!(rebuilt.pending_routes.len(), 1);
        let acked = acked_above_commit(&events, rebuilt.leases.committed_offset());
        let mut s = PartitionState::rebuilt(rebuilt, acked);
        s.set_ordered(OrderedKeys::new(
            [super::super::ordered::OrderedRecord::Retry(record.clone())],
            0,
        ));
        for (o, k) in [(0, "a"), (1, "a"), (2, "b")] {
            s.offer(o, keyed(o, k));
        }
        assert_eq!(leased(&mut s, 0), vec![(2, 1)], "a is still busy");
        let jobs = s.take_routable();
        assert_eq!(jobs.len(), 1);
        let known = s.ordered().unwrap().retry(0).unwrap();
        assert_eq!(
            (known.failed_at_ms, known.failed_attempt),
            (jobs[0].0.at_ms, jobs[0].0.attempt.0),
            "the runtime recognizes the failure as retried already"
        );
        s.retry_in_place(known.clone());
        assert_eq!(leased(&mut s, 999), vec![]);
        assert_eq!(
            leased(&mut s, 1_000),
            vec![(0, 2)],
            "attempt 2 at its due time"
        );
    }

    /// A hold copy as the runtime writes it (read back by the replay).
    fn hold_copy(s: &PartitionState, offset: i64) -> Buffered {
        let m = s.message(offset).unwrap();
        let mut headers = m.headers.clone();
        headers.push((
            super::super::ordered::HELD_FROM_HEADER.into(),
            offset.to_string().into_bytes(),
        ));
        Buffered::new(
            "t.hold",
            0,
            offset,
            m.key.clone(),
            m.payload.clone(),
            headers,
            0,
            false,
        )
    }

    fn hold_receipt(hold_offset: i64) -> crate::lease::Receipt {
        crate::lease::Receipt {
            partition: QueuePartition {
                topic: HOLD_TOPIC,
                partition: 0,
            },
            offset: hold_offset,
            generation: crate::lease::Generation(0),
        }
    }

    /// Parks `a` by its record at 0 (dead-lettered) with `a` at 1 and 3
    /// and `b` at 2.
    fn parked_a() -> PartitionState {
        let mut s = ordered_state(ordered_config());
        for (o, k) in [(0, "a"), (1, "a"), (2, "b"), (3, "a")] {
            s.offer(o, keyed(o, k));
        }
        assert_eq!(leased(&mut s, 0), vec![(0, 1), (2, 1)]);
        let f = s
            .engine
            .nack(&receipt(0, 0), None, "poison", true, 0)
            .unwrap();
        s.fail(f);
        s.take_routable();
        s.routed(0);
        let a = bytes::Bytes::from_static(b"a");
        assert!(s.park(&a, "m-a0", 10));
        s
    }

    #[test]
    fn a_parked_keys_records_go_to_the_hold_in_order_and_the_commit_point_passes_them() {
        let mut s = parked_a();
        assert_eq!(leased(&mut s, 0), vec![], "a is parked, b is in flight");
        let first = s.take_holdable();
        assert_eq!(
            first.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
            vec![1],
            "one copy per key at a time"
        );
        assert!(s.take_holdable().is_empty());
        s.held(1, 100);
        let second = s.take_holdable();
        assert_eq!(second.iter().map(|(o, _)| *o).collect::<Vec<_>>(), vec![3]);
        s.held(3, 101);
        s.engine.ack(&receipt(2, 0)).unwrap();
        s.done(2);
        assert_eq!(s.engine.committed_offset(), 4, "past the held records");
        let p = &s.parked_keys()[0];
        assert_eq!(
            (
                p.message_id.as_str(),
                p.held,
                p.first_hold,
                p.last_hold,
                p.last_held_origin
            ),
            ("m-a0", 2, Some(100), Some(101), 3)
        );
        let records = s.take_ordered_out();
        assert!(matches!(records.last(), Some(OrderedRecord::Parked(p)) if p.held == 2));
    }

    #[test]
    fn a_skip_replays_the_hold_one_at_a_time_then_unparks_the_key() {
        let mut s = parked_a();
        for o in [1, 3] {
            let h = s.take_holdable();
            assert_eq!(h[0].0, o);
            s.held(o, 99 + o);
        }
        let a = bytes::Bytes::from_static(b"a");
        assert_eq!(
            s.skip(&a, "m-other", 20),
            Err(SkipRefused::OtherMessage("m-a0".into()))
        );
        assert_eq!(
            s.skip(&bytes::Bytes::from_static(b"z"), "m-a0", 20),
            Err(SkipRefused::NotParked)
        );
        assert_eq!(s.skip(&a, "m-a0", 20), Ok(()));
        assert_eq!(s.skip(&a, "m-a0", 20), Err(SkipRefused::Released));
        // A later record of the key, during the replay, is held too.
        s.offer(4, keyed(4, "a"));
        assert_eq!(leased(&mut s, 0), vec![], "b is in flight, a waits");
        assert_eq!(s.take_holdable()[0].0, 4);
        s.held(4, 105);
        let wanted = s.replay_wanted();
        assert_eq!(wanted, vec![(a.clone(), 100, 105, -1)]);
        assert!(s.replay_wanted().is_empty(), "one read at a time");
        // The hold copies as the reader finds them (origin 1, then 3, 4).
        let copies: Vec<(i64, Buffered)> = [(100, 1), (102, 3), (105, 4)]
            .iter()
            .map(|&(h, o)| {
                let mut m = keyed(o, "a");
                m.headers.push((
                    super::super::ordered::HELD_FROM_HEADER.into(),
                    o.to_string().into_bytes(),
                ));
                (h, m)
            })
            .collect();
        let mut order = Vec::new();
        for (hold_offset, copy) in copies {
            s.replay_wanted();
            s.replay_loaded(&a, Some((hold_offset, copy)), Some(hold_offset));
            let got = s.lease(10, ConsumerSlot(1), 1_000, 0);
            let hold: Vec<_> = got
                .iter()
                .filter(|(g, _, _)| g.receipt.partition.topic == HOLD_TOPIC)
                .map(|(g, m, _)| (g.receipt.offset, super::super::ordered::held_from(m)))
                .collect();
            assert_eq!(hold, vec![(hold_offset, hold[0].1)], "one copy out");
            order.push(hold[0].1);
            assert!(s.lease(10, ConsumerSlot(1), 1_000, 0).is_empty());
            assert_eq!(
                s.replay_ack(&hold_receipt(hold_offset + 1)),
                Err(LeaseError::StaleReceipt {
                    offset: hold_offset + 1
                })
            );
            s.replay_ack(&hold_receipt(hold_offset)).unwrap();
        }
        assert_eq!(order, vec![1, 3, 4]);
        assert!(s.parked_keys().is_empty(), "nothing left: unparked");
        assert!(matches!(
            s.take_ordered_out().last(),
            Some(OrderedRecord::Unparked(k)) if k == b"a"
        ));
        s.offer(5, keyed(5, "a"));
        assert_eq!(leased(&mut s, 0), vec![(5, 1)], "a flows again");
    }

    #[test]
    fn a_replayed_copy_that_fails_retries_then_parks_the_key_again() {
        let mut s = ordered_state(LeaseConfig {
            max_attempts: 2,
            ..ordered_config()
        });
        s.offer(0, keyed(0, "a"));
        leased(&mut s, 0);
        let f = s.engine.nack(&receipt(0, 0), None, "x", true, 0).unwrap();
        s.fail(f);
        s.take_routable();
        s.routed(0);
        let a = bytes::Bytes::from_static(b"a");
        s.park(&a, "m0", 0);
        s.offer(1, keyed(1, "a"));
        s.offer(2, keyed(2, "a"));
        for (o, h) in [(1, 10), (2, 11)] {
            let copy = hold_copy(&s, o);
            assert_eq!(s.take_holdable()[0].0, o);
            s.held(o, h);
            let _ = copy;
        }
        s.skip(&a, "m0", 0).unwrap();
        s.replay_wanted();
        let mut copy = keyed(1, "a");
        copy.headers.push((
            super::super::ordered::HELD_FROM_HEADER.into(),
            b"1".to_vec(),
        ));
        s.replay_loaded(&a, Some((10, copy)), Some(10));
        assert_eq!(s.lease(1, ConsumerSlot(1), 1_000, 0).len(), 1);
        let dead = s.replay_fail(&a, FailureCause::Nacked, 0, "first", None, 0);
        assert!(dead.is_none(), "retried");
        assert!(
            s.lease(1, ConsumerSlot(1), 1_000, 999).is_empty(),
            "not due"
        );
        let again = s.lease(1, ConsumerSlot(1), 1_000, 1_000);
        assert_eq!(again[0].0.attempt, Attempt(2));
        let dead = s
            .replay_fail(&a, FailureCause::Nacked, 0, "second", None, 1_000)
            .expect("the last attempt: DLQ");
        let env = dead.envelope.unwrap();
        let errors: Vec<&str> = env.errors.iter().map(|e| e.error.as_str()).collect();
        assert_eq!(errors, ["first", "second"]);
        s.replay_dead_lettered(&a, 1_000);
        let p = &s.parked_keys()[0];
        assert_eq!(
            (p.release.is_none(), p.held, p.first_hold, p.replayed_origin),
            (true, 1, Some(11), 1),
            "parked again by the copy; the rest of the hold waits"
        );
    }

    #[test]
    fn a_rebuild_keeps_a_key_parked_and_does_not_hold_a_record_twice() {
        let mut old = parked_a();
        let h = old.take_holdable();
        old.held(h[0].0, 100);
        let records = old.take_ordered_out();
        let mut s = ordered_state(ordered_config());
        s.set_ordered(OrderedKeys::new(records, 0));
        assert_eq!(s.parked_keys().len(), 1);
        for (o, k) in [(1, "a"), (2, "b"), (3, "a")] {
            s.offer(o, keyed(o, k));
        }
        assert_eq!(leased(&mut s, 0), vec![(2, 1)], "a still parked");
        let again = s.take_holdable();
        assert_eq!(
            again.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
            vec![3],
            "offset 1 was held before the rebuild"
        );
    }

    #[test]
    fn the_redrive_of_the_poison_message_releases_the_key_and_is_leased_first() {
        let mut s = parked_a();
        for o in [1, 3] {
            s.take_holdable();
            s.held(o, 99 + o);
        }
        let mut redriven = keyed(10, "a");
        redriven.message_id = "m-a0".into();
        redriven
            .headers
            .push((REDRIVE_JOB_HEADER.into(), b"job".to_vec()));
        let mut other = keyed(9, "a");
        other.message_id = "m-a0".into();
        s.offer(9, other);
        assert_eq!(
            s.take_holdable()[0].0,
            9,
            "same id without the header: held"
        );
        s.held(9, 110);
        s.offer(10, redriven);
        s.offer(11, keyed(11, "a"));
        assert_eq!(
            s.parked_keys()[0].release.as_ref().map(|r| r.by.as_str()),
            Some("redrive")
        );
        assert!(s.replay_wanted().is_empty(), "the redriven record first");
        assert_eq!(leased(&mut s, 0), vec![(10, 1)]);
        assert_eq!(s.take_holdable()[0].0, 11, "newer records are held");
        s.held(11, 111);
        s.engine.ack(&receipt(10, 0)).unwrap();
        s.done(10);
        assert_eq!(s.replay_wanted().len(), 1, "then the hold");
    }

    #[test]
    fn the_gap_cap_moves_a_stuck_retry_to_the_hold_and_releases_its_key_when_due() {
        let mut s = ordered_state(LeaseConfig {
            gap_cap: 4,
            ..config()
        });
        for (o, k) in [(0, "a"), (1, "c1"), (2, "c2")] {
            s.offer(o, keyed(o, k));
        }
        assert_eq!(leased(&mut s, 0).len(), 3);
        let f = s
            .engine
            .nack(&receipt(0, 0), None, "slow", false, 0)
            .unwrap();
        s.fail(f.clone());
        s.take_routable();
        let record = retry_record(&s, &f);
        s.retry_in_place(record);
        assert!(s.take_stuck().is_none(), "the window has room");
        s.offer(3, keyed(3, "c3"));
        assert_eq!(leased(&mut s, 0), vec![(3, 1)]);
        for o in 1..4 {
            s.engine.ack(&receipt(o, 0)).unwrap();
            s.done(o);
        }
        s.offer(4, keyed(4, "a"));
        s.offer(5, keyed(5, "d"));
        assert_eq!(leased(&mut s, 0), vec![], "the window is full");
        let (offset, m) = s.take_stuck().expect("a stuck retry at the commit point");
        assert_eq!((offset, m.attempt), (0, Attempt(2)));
        s.stuck_held(0, 50, 10);
        assert_eq!(s.engine.committed_offset(), 4, "the commit point moves on");
        assert_eq!(leased(&mut s, 10), vec![(5, 1)], "other keys flow");
        let p = &s.parked_keys()[0];
        assert_eq!(
            (p.auto_release_at_ms, p.held, p.first_hold),
            (Some(1_000), 1, Some(50))
        );
        assert_eq!(
            s.take_holdable()[0].0,
            4,
            "a's next record is held after it"
        );
        s.held(4, 51);
        s.auto_release(999);
        assert!(s.replay_wanted().is_empty(), "not due yet");
        s.auto_release(1_000);
        let a = bytes::Bytes::from_static(b"a");
        assert_eq!(s.replay_wanted(), vec![(a, 50, 51, -1)]);
    }

    #[test]
    fn a_full_prefetch_behind_a_busy_key_spills_the_key_to_the_hold() {
        let mut s = ordered_state(LeaseConfig {
            gap_cap: 100_000,
            ..config()
        });
        let total = PREFETCH_MAX as i64 + 1;
        for o in 0..total {
            s.offer(o, keyed(o, "hot"));
        }
        assert_eq!(leased(&mut s, 0), vec![(0, 1)]);
        assert_eq!(
            s.prefetch_room(),
            0,
            "the hot key's records fill the prefetch"
        );
        assert!(s.spill(5));
        assert!(s.prefetch_room() > 0, "room for the other keys");
        assert_eq!(
            s.take_holdable()[0].0,
            1,
            "the hot key's later records are held"
        );
        let p = &s.parked_keys()[0];
        assert_eq!(
            p.release
                .as_ref()
                .map(|r| (r.by.as_str(), r.primary_offset)),
            Some(("spill", Some(0)))
        );
        // The head message is still served first: retried in place, then acked.
        let f = s.engine.nack(&receipt(0, 0), None, "x", false, 10).unwrap();
        s.fail(f.clone());
        s.take_routable();
        let record = retry_record(&s, &f);
        s.retry_in_place(record);
        s.offer(total, keyed(total, "other"));
        assert_eq!(leased(&mut s, 1_010), vec![(0, 2), (total, 1)]);
        s.held(1, 500);
        s.engine.ack(&receipt(0, 0)).unwrap();
        s.done(0);
        let hot = bytes::Bytes::from_static(b"hot");
        assert_eq!(
            s.replay_wanted(),
            vec![(hot, 500, 500, -1)],
            "the head acked: the hold is replayed"
        );
    }

    #[test]
    fn records_that_left_retention_are_counted_once() {
        let mut s = state();
        assert_eq!(s.left_retention(5), 5);
        assert_eq!(s.engine.committed_offset(), 5);
        assert_eq!(s.left_retention(5), 0);
        s.offer(5, msg(5, None));
        assert_eq!(s.left_retention(7), 0, "a fetched record is still served");
    }
}
