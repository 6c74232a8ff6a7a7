//! The state of one owned partition beside its lease engine: the fetched
//! records that may still be needed (leasable, in flight, or waiting for
//! their failure copy), which of them may be leased next, and which failures
//! wait for a copy.
//!
//! Pure: no I/O and no clock. The runtime holds it under a per-partition
//! lock, and writes the engine's drained events to the ack log in the order
//! they were drained.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};

use crate::lease::{Available, ConsumerSlot, Failure, Grant, LeaseEvent, PartitionLeases, Rebuilt};

use super::message::Buffered;

/// Records fetched and not yet leased, per partition: the prefetch bound.
/// The backlog beyond it stays in Kafka.
pub const PREFETCH_MAX: usize = 2000;

#[derive(Debug)]
pub struct PartitionState {
    pub engine: PartitionLeases,
    /// Every fetched record at or above the commit point that is not done.
    msgs: BTreeMap<i64, Buffered>,
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
        }
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
        self.msgs.insert(offset, message);
        if !self.failures.contains_key(&offset) {
            self.ready.push_back(offset);
        }
    }

    /// The due time of the next record when it is not due at `now_ms`
    /// (a retry tier's record waits).
    pub fn next_due_ms(&self, now_ms: i64) -> Option<i64> {
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
        if candidates.is_empty() {
            return Vec::new();
        }
        let grants = self.engine.lease(
            candidates.iter().copied(),
            max_n,
            consumer,
            lease_ms,
            now_ms,
        );
        // What the engine refused: beyond the gap-cap window goes back to
        // the front, in order, to wait for the commit point; anything else
        // (acked before, below the commit point) is done.
        let granted: HashSet<i64> = grants.iter().map(|g| g.receipt.offset).collect();
        let window_end = self.engine.committed_offset() + i64::from(self.engine.config().gap_cap);
        for c in candidates.iter().rev() {
            if granted.contains(&c.offset) {
                continue;
            }
            if c.offset >= window_end {
                self.ready.push_front(c.offset);
            } else {
                self.msgs.remove(&c.offset);
            }
        }
        let crashed: Vec<bool> = grants
            .iter()
            .map(|g| self.crashed.remove(&g.receipt.offset))
            .collect();
        grants
            .into_iter()
            .zip(crashed)
            .map(|(g, crashed)| {
                let m = &self.msgs[&g.receipt.offset];
                (g, m, crashed)
            })
            .collect()
    }

    pub fn message(&self, offset: i64) -> Option<&Buffered> {
        self.msgs.get(&offset)
    }

    /// The record at `offset` is acked or routed: forget it, and every
    /// record the commit point has passed.
    pub fn done(&mut self, offset: i64) {
        self.msgs.remove(&offset);
        self.trim();
    }

    fn trim(&mut self) {
        let committed = self.engine.committed_offset();
        self.msgs = self.msgs.split_off(&committed);
        self.failures = self.failures.split_off(&committed);
        self.acked_before = self.acked_before.split_off(&committed);
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
                out.push((failure.clone(), m.clone()));
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

/// The offsets above the final commit point that the ack log records as
/// acked (the engine keeps them but does not say which).
pub fn acked_above_commit(events: &[LeaseEvent], committed: i64) -> BTreeSet<i64> {
    let mut acked = BTreeSet::new();
    for event in events {
        match event {
            LeaseEvent::Acked { offset } => {
                acked.insert(*offset);
            }
            LeaseEvent::Leased { offset, .. } => {
                acked.remove(offset);
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
    use crate::lease::{Attempt, LeaseConfig, QueuePartition, RetryEnvelope};

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
