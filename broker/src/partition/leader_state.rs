//! The leader's view of its followers and the ISR rules built on it (Kafka's
//! `Replica`/`ReplicaState` and the ISR half of `Partition.scala`): the
//! caught-up rule, the high watermark, and which followers leave or join
//! the ISR. Pure: no clock, no I/O; every decision takes `now_ms`.

use std::collections::{BTreeMap, BTreeSet};

use crate::types::{LeaderEpoch, NodeId, Offset};

/// What the leader knows about one follower, from its fetches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FollowerState {
    /// The follower's log end offset: the fetch offset of its last fetch.
    /// `None` until it fetches under this leadership.
    pub log_end_offset: Option<Offset>,
    /// The leader's log end offset when the previous fetch arrived.
    pub last_fetch_leader_log_end_offset: Option<Offset>,
    pub last_fetch_time_ms: i64,
    /// The latest time at which the follower was known to have everything
    /// the leader had (Kafka's `lastCaughtUpTimeMs`).
    pub last_caught_up_time_ms: i64,
}

impl FollowerState {
    const EMPTY: FollowerState = FollowerState {
        log_end_offset: None,
        last_fetch_leader_log_end_offset: None,
        last_fetch_time_ms: 0,
        last_caught_up_time_ms: 0,
    };

    /// Kafka's `isCaughtUp`: the follower has the leader's log end offset, or
    /// it had everything the leader had within the last `max_lag_ms`.
    pub fn is_caught_up(&self, leader_leo: Offset, now_ms: i64, max_lag_ms: i64) -> bool {
        self.log_end_offset == Some(leader_leo)
            || now_ms - self.last_caught_up_time_ms <= max_lag_ms
    }

    /// Kafka's `updateFetchStateOrThrow`. A fetch from `fetch_offset` means
    /// the follower has everything before it. It was caught up now if it
    /// asked for the leader's current end, and caught up at the previous
    /// fetch if it asked for at least what the leader had then: so a follower
    /// of a partition with a steady trickle of small appends still counts as
    /// caught up although it is never exactly at the end.
    fn record_fetch(&mut self, fetch_offset: Offset, leader_leo: Offset, now_ms: i64) {
        if fetch_offset >= leader_leo {
            self.last_caught_up_time_ms = self.last_caught_up_time_ms.max(now_ms);
        } else if self
            .last_fetch_leader_log_end_offset
            .is_some_and(|prev| fetch_offset >= prev)
        {
            self.last_caught_up_time_ms = self.last_caught_up_time_ms.max(self.last_fetch_time_ms);
        }
        self.log_end_offset = Some(fetch_offset);
        self.last_fetch_leader_log_end_offset = Some(
            self.last_fetch_leader_log_end_offset
                .map_or(leader_leo, |prev| prev.max(leader_leo)),
        );
        self.last_fetch_time_ms = now_ms;
    }
}

/// An ISR change proposed to the controller and not yet seen in the image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PendingIsr {
    /// The follower is assumed in sync already for the high watermark: a
    /// larger ISR only holds the high watermark back, so that is safe.
    Expand { node: NodeId, proposed: Vec<NodeId> },
    /// The removed followers still count for the high watermark until the
    /// shrink is committed, or a failed shrink could have let it run ahead.
    Shrink {
        removed: Vec<NodeId>,
        proposed: Vec<NodeId>,
    },
}

impl PendingIsr {
    pub fn proposed(&self) -> &[NodeId] {
        match self {
            PendingIsr::Expand { proposed, .. } | PendingIsr::Shrink { proposed, .. } => proposed,
        }
    }
}

/// The AlterPartition this leader wants the controller to apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsrProposal {
    pub leader: NodeId,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: i32,
    pub isr: Vec<NodeId>,
    /// True for an expansion, false for a shrink (metrics and logs).
    pub expand: bool,
}

/// A partition's state while this node leads it.
#[derive(Clone, Debug)]
pub struct LeaderState {
    local: NodeId,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: i32,
    /// The assignment, in the image's order (the leader included).
    pub replicas: Vec<NodeId>,
    /// The ISR the image holds (committed).
    pub isr: Vec<NodeId>,
    pub pending: Option<PendingIsr>,
    /// The leader's log end offset when this leader epoch began: a follower
    /// must reach it before it may join the ISR, or it could become leader
    /// without data committed in this epoch.
    pub epoch_start_offset: Offset,
    followers: BTreeMap<NodeId, FollowerState>,
    /// Followers that may not join the ISR (fenced or unregistered brokers).
    ineligible: BTreeSet<NodeId>,
    max_lag_ms: i64,
}

/// The part of the image's partition state a leader takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AssignedState {
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: i32,
    pub replicas: Vec<NodeId>,
    pub isr: Vec<NodeId>,
}

impl LeaderState {
    /// Becoming leader at a new leader epoch (Kafka's `makeLeader` with
    /// `resetReplicaState`). A follower in the ISR gets `max_lag_ms` from now
    /// to fetch before it is dropped; one outside gets no credit, so it does
    /// not hold the high watermark back. When this node already led (a
    /// re-election at a higher epoch) the followers' positions are kept.
    pub fn start(
        local: NodeId,
        state: AssignedState,
        leader_leo: Offset,
        previous: Option<&LeaderState>,
        max_lag_ms: i64,
        now_ms: i64,
    ) -> Self {
        let mut followers = BTreeMap::new();
        for &r in state.replicas.iter().filter(|&&r| r != local) {
            let in_sync = state.isr.contains(&r);
            let credit = if in_sync { now_ms } else { 0 };
            let f = match previous.and_then(|p| p.followers.get(&r)) {
                None => FollowerState {
                    last_caught_up_time_ms: credit,
                    ..FollowerState::EMPTY
                },
                Some(prev) => FollowerState {
                    log_end_offset: prev.log_end_offset,
                    last_fetch_leader_log_end_offset: Some(leader_leo),
                    last_fetch_time_ms: credit,
                    last_caught_up_time_ms: credit,
                },
            };
            followers.insert(r, f);
        }
        LeaderState {
            local,
            leader_epoch: state.leader_epoch,
            partition_epoch: state.partition_epoch,
            replicas: state.replicas,
            isr: state.isr,
            pending: None,
            epoch_start_offset: leader_leo,
            followers,
            ineligible: previous.map(|p| p.ineligible.clone()).unwrap_or_default(),
            max_lag_ms,
        }
    }

    /// A new partition epoch under the same leader epoch: the ISR or the
    /// assignment changed (our AlterPartition, or the controller fencing a
    /// broker). Whatever was pending is settled by it.
    pub fn update_assignment(&mut self, state: AssignedState) {
        let followers: Vec<NodeId> = state
            .replicas
            .iter()
            .copied()
            .filter(|&r| r != self.local)
            .collect();
        self.followers.retain(|r, _| followers.contains(r));
        for r in followers {
            self.followers.entry(r).or_insert(FollowerState::EMPTY);
        }
        self.partition_epoch = state.partition_epoch;
        self.replicas = state.replicas;
        self.isr = state.isr;
        self.pending = None;
    }

    pub fn set_ineligible(&mut self, ineligible: BTreeSet<NodeId>) {
        self.ineligible = ineligible;
    }

    pub fn set_max_lag_ms(&mut self, max_lag_ms: i64) {
        self.max_lag_ms = max_lag_ms;
    }

    pub fn follower(&self, node: NodeId) -> Option<&FollowerState> {
        self.followers.get(&node)
    }

    pub fn followers(&self) -> impl Iterator<Item = (NodeId, &FollowerState)> {
        self.followers.iter().map(|(n, f)| (*n, f))
    }

    /// Records a follower's fetch. `None` if `node` is not a follower of this
    /// partition (Kafka answers UNKNOWN_LEADER_EPOCH or NOT_LEADER_OR_FOLLOWER).
    pub fn record_fetch(
        &mut self,
        node: NodeId,
        fetch_offset: Offset,
        leader_leo: Offset,
        now_ms: i64,
    ) -> Option<()> {
        self.followers
            .get_mut(&node)?
            .record_fetch(fetch_offset, leader_leo, now_ms);
        Some(())
    }

    /// The ISR assumed for the high watermark and acks=all: the committed one
    /// plus a follower whose expansion is pending (Kafka's "maximal ISR").
    pub fn maximal_isr(&self) -> Vec<NodeId> {
        let mut isr = self.isr.clone();
        if let Some(PendingIsr::Expand { node, .. }) = &self.pending {
            if !isr.contains(node) {
                isr.push(*node);
            }
        }
        isr
    }

    /// `min.insync.replicas` capped at the replication factor, as Kafka does.
    pub fn effective_min_isr(&self, min_isr: i32) -> usize {
        (min_isr.max(1) as usize).min(self.replicas.len().max(1))
    }

    /// Whether the committed ISR is smaller than the effective minimum.
    pub fn is_under_min_isr(&self, min_isr: i32) -> bool {
        self.isr.len() < self.effective_min_isr(min_isr)
    }

    /// Kafka's `maybeIncrementLeaderHW`: the smallest log end offset among
    /// the leader, the maximal ISR, and followers caught up enough to be
    /// about to join it (waiting for them lets them actually join). `None`
    /// while the ISR is below `min.insync.replicas` (KAFKA-15583: nothing is
    /// committed that fewer replicas than required hold).
    pub fn high_watermark_candidate(
        &self,
        leader_leo: Offset,
        min_isr: i32,
        now_ms: i64,
    ) -> Option<Offset> {
        if self.is_under_min_isr(min_isr) {
            return None;
        }
        let maximal = self.maximal_isr();
        let mut hw = Some(leader_leo);
        for (node, f) in &self.followers {
            let counts = maximal.contains(node)
                || (f.is_caught_up(leader_leo, now_ms, self.max_lag_ms)
                    && !self.ineligible.contains(node));
            if !counts {
                continue;
            }
            hw = match (hw, f.log_end_offset) {
                (Some(h), Some(l)) => Some(h.min(l)),
                // A follower that has not fetched yet holds everything back.
                _ => None,
            };
        }
        hw
    }

    /// ISR followers that have not been caught up for `replica.lag.time.max.ms`
    /// (stuck or too slow). Empty while a change is pending.
    pub fn out_of_sync(&self, leader_leo: Offset, now_ms: i64) -> Vec<NodeId> {
        if self.pending.is_some() {
            return Vec::new();
        }
        self.isr
            .iter()
            .copied()
            .filter(|&r| r != self.local)
            .filter(|r| {
                self.followers
                    .get(r)
                    .is_none_or(|f| !f.is_caught_up(leader_leo, now_ms, self.max_lag_ms))
            })
            .collect()
    }

    /// A follower outside the ISR that may join it: eligible, at or past the
    /// high watermark, and past the start of this leader epoch.
    pub fn expand_candidate(&self, high_watermark: Offset) -> Option<NodeId> {
        if self.pending.is_some() {
            return None;
        }
        self.followers.iter().find_map(|(node, f)| {
            let leo = f.log_end_offset?;
            (!self.isr.contains(node)
                && !self.ineligible.contains(node)
                && leo >= high_watermark
                && leo >= self.epoch_start_offset)
                .then_some(*node)
        })
    }

    /// The next ISR change to propose, if any, marking it pending. Shrinks
    /// first: a stuck follower holds the high watermark back.
    pub fn prepare_isr_change(
        &mut self,
        leader_leo: Offset,
        high_watermark: Offset,
        now_ms: i64,
    ) -> Option<IsrProposal> {
        let out = self.out_of_sync(leader_leo, now_ms);
        let (pending, expand) = if !out.is_empty() {
            let proposed: Vec<NodeId> = self
                .isr
                .iter()
                .copied()
                .filter(|r| !out.contains(r))
                .collect();
            (
                PendingIsr::Shrink {
                    removed: out,
                    proposed,
                },
                false,
            )
        } else if let Some(node) = self.expand_candidate(high_watermark) {
            // The ISR keeps the assignment's order.
            let proposed: Vec<NodeId> = self
                .replicas
                .iter()
                .copied()
                .filter(|r| self.isr.contains(r) || *r == node)
                .collect();
            (PendingIsr::Expand { node, proposed }, true)
        } else {
            return None;
        };
        let proposal = IsrProposal {
            leader: self.local,
            leader_epoch: self.leader_epoch,
            partition_epoch: self.partition_epoch,
            isr: pending.proposed().to_vec(),
            expand,
        };
        self.pending = Some(pending);
        Some(proposal)
    }

    /// The controller refused the change in a way that says nothing was
    /// applied and our epochs are current (INELIGIBLE_REPLICA): forget it, so
    /// the next check may propose again.
    pub fn abandon_pending(&mut self) {
        self.pending = None;
    }

    /// How far each follower is behind the leader's end, in offsets; a
    /// follower that has not fetched counts as all of the log behind.
    pub fn lag(&self, leader_leo: Offset, log_start: Offset) -> Vec<(NodeId, i64)> {
        self.followers
            .iter()
            .map(|(n, f)| {
                let leo = f.log_end_offset.unwrap_or(log_start);
                (*n, (leader_leo.0 - leo.0).max(0))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAG: i64 = 10_000;
    /// A realistic clock: Kafka's "never caught up" is time 0.
    const T0: i64 = 1_700_000_000_000;
    const L: NodeId = NodeId(1);
    const F2: NodeId = NodeId(2);
    const F3: NodeId = NodeId(3);

    fn assigned(isr: &[i32]) -> AssignedState {
        AssignedState {
            leader_epoch: LeaderEpoch(1),
            partition_epoch: 5,
            replicas: vec![L, F2, F3],
            isr: isr.iter().map(|&n| NodeId(n)).collect(),
        }
    }

    fn leader(isr: &[i32], leo: i64, now: i64) -> LeaderState {
        LeaderState::start(L, assigned(isr), Offset(leo), None, LAG, now)
    }

    #[test]
    fn caught_up_now_when_fetching_from_the_leaders_end() {
        let mut f = FollowerState::EMPTY;
        f.record_fetch(Offset(10), Offset(10), 1_000);
        assert_eq!(f.last_caught_up_time_ms, 1_000);
        assert!(
            f.is_caught_up(Offset(10), 1_000 + LAG + 5, LAG),
            "at the end"
        );
        assert!(f.is_caught_up(Offset(11), 1_000 + LAG, LAG));
        assert!(!f.is_caught_up(Offset(11), 1_000 + LAG + 1, LAG));
    }

    #[test]
    fn caught_up_at_the_previous_fetch_when_reaching_what_the_leader_had_then() {
        let mut f = FollowerState::EMPTY;
        // Leader at 10 when the first fetch (from 5) came: not caught up.
        f.record_fetch(Offset(5), Offset(10), 1_000);
        assert_eq!(f.last_caught_up_time_ms, 0);
        // Next fetch from 10 while the leader is at 12: it had everything
        // the leader had at the previous fetch, so caught up as of then.
        f.record_fetch(Offset(10), Offset(12), 2_000);
        assert_eq!(f.last_caught_up_time_ms, 1_000);
        // A fetch below what the leader had last time gives no credit.
        f.record_fetch(Offset(11), Offset(20), 3_000);
        assert_eq!(f.last_caught_up_time_ms, 1_000);
        assert_eq!(f.log_end_offset, Some(Offset(11)));
    }

    #[test]
    fn high_watermark_is_the_smallest_leo_of_the_isr() {
        let mut s = leader(&[1, 2, 3], 0, 0);
        // Nobody fetched yet: nothing can be committed.
        assert_eq!(s.high_watermark_candidate(Offset(10), 1, 0), None);
        s.record_fetch(F2, Offset(10), Offset(10), 1).unwrap();
        assert_eq!(s.high_watermark_candidate(Offset(10), 1, 1), None);
        s.record_fetch(F3, Offset(7), Offset(10), 1).unwrap();
        assert_eq!(
            s.high_watermark_candidate(Offset(10), 1, 1),
            Some(Offset(7))
        );
        s.record_fetch(F3, Offset(10), Offset(10), 2).unwrap();
        assert_eq!(
            s.high_watermark_candidate(Offset(10), 1, 2),
            Some(Offset(10))
        );
        // Not a replica.
        assert_eq!(s.record_fetch(NodeId(9), Offset(0), Offset(10), 2), None);
    }

    #[test]
    fn a_follower_outside_the_isr_only_counts_while_caught_up() {
        let mut s = leader(&[1, 2], 0, T0);
        s.record_fetch(F2, Offset(10), Offset(10), T0 + 1).unwrap();
        // F3 never fetched and is out of the ISR: it does not hold the HW.
        assert_eq!(
            s.high_watermark_candidate(Offset(10), 1, T0 + 1),
            Some(Offset(10))
        );
        // F3 fetched from the end once: caught up, so the HW waits for it
        // to reach the leader's end rather than running away from it.
        s.record_fetch(F3, Offset(10), Offset(10), T0 + 1).unwrap();
        assert_eq!(
            s.high_watermark_candidate(Offset(12), 1, T0 + 2),
            Some(Offset(10))
        );
        // Long after, no longer caught up: no longer waited for.
        s.record_fetch(F2, Offset(12), Offset(12), T0 + 2 + LAG)
            .unwrap();
        assert_eq!(
            s.high_watermark_candidate(Offset(12), 1, T0 + 2 + LAG),
            Some(Offset(12))
        );
        // An ineligible (fenced) broker is never waited for.
        let mut s = leader(&[1, 2], 0, T0);
        s.record_fetch(F2, Offset(10), Offset(10), T0 + 1).unwrap();
        s.record_fetch(F3, Offset(3), Offset(10), T0 + 1).unwrap();
        s.followers.get_mut(&F3).unwrap().last_caught_up_time_ms = T0 + 1;
        assert_eq!(
            s.high_watermark_candidate(Offset(10), 1, T0 + 1),
            Some(Offset(3))
        );
        s.set_ineligible([F3].into());
        assert_eq!(
            s.high_watermark_candidate(Offset(10), 1, T0 + 1),
            Some(Offset(10))
        );
    }

    #[test]
    fn high_watermark_holds_while_under_min_isr() {
        let s = leader(&[1], 0, T0);
        assert_eq!(
            s.high_watermark_candidate(Offset(10), 1, T0),
            Some(Offset(10))
        );
        assert_eq!(s.high_watermark_candidate(Offset(10), 2, T0), None);
        // min.insync.replicas above the replication factor is capped at it.
        let single = LeaderState::start(
            L,
            AssignedState {
                leader_epoch: LeaderEpoch(0),
                partition_epoch: 0,
                replicas: vec![L],
                isr: vec![L],
            },
            Offset(4),
            None,
            LAG,
            T0,
        );
        assert_eq!(
            single.high_watermark_candidate(Offset(4), 3, T0),
            Some(Offset(4))
        );
    }

    #[test]
    fn a_stuck_follower_is_dropped_after_the_lag_and_the_shrink_is_pending() {
        let mut s = leader(&[1, 2, 3], 10, 0);
        // Both in the ISR get the lag from the start of the leadership.
        assert!(s.prepare_isr_change(Offset(10), Offset(0), LAG).is_none());
        s.record_fetch(F2, Offset(10), Offset(10), 100).unwrap();
        s.record_fetch(F2, Offset(10), Offset(10), LAG + 1).unwrap();
        // F3 never fetched: out of sync once the lag has passed.
        let p = s
            .prepare_isr_change(Offset(10), Offset(10), LAG + 1)
            .unwrap();
        assert_eq!(
            p,
            IsrProposal {
                leader: L,
                leader_epoch: LeaderEpoch(1),
                partition_epoch: 5,
                isr: vec![L, F2],
                expand: false
            }
        );
        // Pending: nothing more is proposed, and F3 still counts for the HW.
        assert!(s
            .prepare_isr_change(Offset(10), Offset(10), LAG + 2)
            .is_none());
        assert_eq!(s.maximal_isr(), vec![L, F2, F3]);
        assert_eq!(s.high_watermark_candidate(Offset(10), 1, LAG + 2), None);
        // The image commits the shrink.
        let mut a = assigned(&[1, 2]);
        a.partition_epoch = 6;
        s.update_assignment(a);
        assert_eq!(s.pending, None);
        assert_eq!(
            s.high_watermark_candidate(Offset(10), 1, LAG + 2),
            Some(Offset(10))
        );
    }

    #[test]
    fn a_slow_follower_that_never_reaches_the_end_is_dropped() {
        let mut s = leader(&[1, 2], 100, 0);
        let mut leo = 100;
        let mut t = 0;
        // The follower always fetches from well behind what the leader had.
        for i in 0..30 {
            leo += 10;
            t += 1_000;
            s.record_fetch(F2, Offset(50 + i), Offset(leo), t).unwrap();
        }
        assert!(t > LAG);
        assert_eq!(s.out_of_sync(Offset(leo), t), vec![F2]);
    }

    #[test]
    fn a_follower_joins_once_past_the_hw_and_the_epoch_start() {
        let mut s = leader(&[1, 2], 20, 0);
        s.record_fetch(F2, Offset(20), Offset(20), 1).unwrap();
        // F3 behind the epoch start (20) may not join even at the HW.
        s.record_fetch(F3, Offset(15), Offset(20), 1).unwrap();
        assert_eq!(s.expand_candidate(Offset(15)), None);
        assert!(s.prepare_isr_change(Offset(20), Offset(15), 1).is_none());
        s.record_fetch(F3, Offset(20), Offset(20), 2).unwrap();
        let p = s.prepare_isr_change(Offset(20), Offset(20), 2).unwrap();
        assert_eq!(p.isr, vec![L, F2, F3]);
        assert!(p.expand);
        // The pending follower counts for the HW already.
        assert_eq!(s.maximal_isr(), vec![L, F2, F3]);
        // An ineligible follower never joins.
        let mut s = leader(&[1, 2], 0, 0);
        s.set_ineligible([F3].into());
        s.record_fetch(F3, Offset(0), Offset(0), 1).unwrap();
        assert_eq!(s.expand_candidate(Offset(0)), None);
        // INELIGIBLE_REPLICA: dropped, may be proposed again later.
        let mut s = leader(&[1, 2], 0, 0);
        s.record_fetch(F3, Offset(0), Offset(0), 1).unwrap();
        assert!(s.prepare_isr_change(Offset(0), Offset(0), 1).is_some());
        s.abandon_pending();
        assert!(s.prepare_isr_change(Offset(0), Offset(0), 1).is_some());
    }

    #[test]
    fn re_election_keeps_positions_and_resets_credit() {
        let mut s = leader(&[1, 2, 3], 0, 0);
        s.record_fetch(F2, Offset(8), Offset(10), 5).unwrap();
        let mut a = assigned(&[1, 2]);
        a.leader_epoch = LeaderEpoch(2);
        let s2 = LeaderState::start(L, a, Offset(10), Some(&s), LAG, 1_000);
        let f2 = s2.follower(F2).unwrap();
        assert_eq!(f2.log_end_offset, Some(Offset(8)));
        assert_eq!(f2.last_caught_up_time_ms, 1_000);
        assert_eq!(f2.last_fetch_leader_log_end_offset, Some(Offset(10)));
        let f3 = s2.follower(F3).unwrap();
        assert_eq!(f3.last_caught_up_time_ms, 0);
        assert_eq!(s2.epoch_start_offset, Offset(10));
        assert_eq!(s2.lag(Offset(10), Offset(0)), vec![(F2, 2), (F3, 10)]);
    }
}
