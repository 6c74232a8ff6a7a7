//! Persisted share-partition state: a start offset and state batches, and
//! how an update folds into what is stored (Kafka's share coordinator keeps
//! a snapshot and applies `ShareUpdate` records to it the same way, in
//! `PersisterStateBatchCombiner`).
//!
//! Invariant: pure functions over batches; the result is sorted, has no
//! overlaps, nothing below the start offset, and no two adjacent batches of
//! the same state and delivery count.

use std::collections::BTreeMap;

use super::partition::{RecordState, StateBatch};

/// A share-partition's persisted state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShareState {
    /// Bumped when the state is reset (Initialize, or AlterShareGroupOffsets).
    pub state_epoch: i32,
    pub leader_epoch: i32,
    pub start_offset: i64,
    pub batches: Vec<StateBatch>,
}

impl ShareState {
    /// Applies an update: a new start offset (or -1 to keep it) and batches
    /// that replace whatever the stored ones say about their offsets.
    pub fn apply(&mut self, leader_epoch: i32, start_offset: i64, batches: &[StateBatch]) {
        if leader_epoch >= 0 {
            self.leader_epoch = leader_epoch;
        }
        if start_offset >= 0 {
            self.start_offset = start_offset;
        }
        self.batches = combine(&self.batches, batches, self.start_offset);
    }

    /// Records at or past the start offset in a final state (acknowledged
    /// or archived).
    pub fn delivery_complete_count(&self) -> i64 {
        self.batches
            .iter()
            .filter(|b| matches!(b.state, RecordState::Acknowledged | RecordState::Archived))
            .map(|b| b.last_offset - b.first_offset.max(self.start_offset) + 1)
            .filter(|n| *n > 0)
            .sum()
    }
}

/// `so_far` with `newer` laid over it: where they overlap, `newer` wins.
/// Both must be sorted and free of overlaps within themselves.
pub fn combine(so_far: &[StateBatch], newer: &[StateBatch], start_offset: i64) -> Vec<StateBatch> {
    // first offset -> (last offset, state, delivery count), never overlapping.
    let mut runs: BTreeMap<i64, (i64, RecordState, i16)> = BTreeMap::new();
    for b in so_far {
        if b.last_offset >= b.first_offset {
            runs.insert(b.first_offset, (b.last_offset, b.state, b.delivery_count));
        }
    }
    for b in newer {
        if b.last_offset < b.first_offset {
            continue;
        }
        // Cut every stored run the new batch overlaps: keep what lies
        // outside it.
        let overlapping: Vec<i64> = runs
            .range(..=b.last_offset)
            .rev()
            .take_while(|(_, (last, _, _))| *last >= b.first_offset)
            .map(|(first, _)| *first)
            .collect();
        for first in overlapping {
            let (last, state, count) = runs.remove(&first).expect("listed above");
            if first < b.first_offset {
                runs.insert(first, (b.first_offset - 1, state, count));
            }
            if last > b.last_offset {
                runs.insert(b.last_offset + 1, (last, state, count));
            }
        }
        runs.insert(b.first_offset, (b.last_offset, b.state, b.delivery_count));
    }
    let mut out: Vec<StateBatch> = Vec::with_capacity(runs.len());
    for (first, (last, state, delivery_count)) in runs {
        if last < start_offset {
            continue;
        }
        let first = first.max(start_offset);
        match out.last_mut() {
            Some(prev)
                if prev.last_offset + 1 == first
                    && prev.state == state
                    && prev.delivery_count == delivery_count =>
            {
                prev.last_offset = last;
            }
            _ => out.push(StateBatch {
                first_offset: first,
                last_offset: last,
                state,
                delivery_count,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(first: i64, last: i64, state: RecordState, delivery_count: i16) -> StateBatch {
        StateBatch {
            first_offset: first,
            last_offset: last,
            state,
            delivery_count,
        }
    }

    use RecordState::{Acknowledged as Acked, Archived, Available};

    #[test]
    fn newer_batches_win_where_they_overlap() {
        let so_far = [b(0, 9, Available, 1)];
        let newer = [b(3, 4, Acked, 1), b(8, 12, Archived, 2)];
        assert_eq!(
            combine(&so_far, &newer, 0),
            vec![
                b(0, 2, Available, 1),
                b(3, 4, Acked, 1),
                b(5, 7, Available, 1),
                b(8, 12, Archived, 2),
            ]
        );
    }

    #[test]
    fn a_newer_batch_can_cover_several_stored_ones() {
        let so_far = [
            b(0, 1, Acked, 1),
            b(2, 3, Archived, 1),
            b(4, 5, Available, 2),
        ];
        let newer = [b(1, 4, Available, 3)];
        assert_eq!(
            combine(&so_far, &newer, 0),
            vec![
                b(0, 0, Acked, 1),
                b(1, 4, Available, 3),
                b(5, 5, Available, 2)
            ]
        );
    }

    #[test]
    fn the_start_offset_prunes_and_equal_neighbours_merge() {
        let so_far = [b(0, 4, Acked, 1), b(5, 6, Available, 1)];
        let newer = [b(7, 9, Available, 1)];
        assert_eq!(
            combine(&so_far, &newer, 3),
            vec![b(3, 4, Acked, 1), b(5, 9, Available, 1)]
        );
        assert_eq!(combine(&so_far, &newer, 10), vec![]);
    }

    #[test]
    fn apply_keeps_the_start_offset_on_minus_one() {
        let mut s = ShareState {
            state_epoch: 0,
            leader_epoch: 0,
            start_offset: 5,
            batches: vec![b(5, 9, Available, 1)],
        };
        s.apply(-1, -1, &[b(5, 5, Acked, 1)]);
        assert_eq!(s.start_offset, 5);
        assert_eq!(s.batches, vec![b(5, 5, Acked, 1), b(6, 9, Available, 1)]);
        s.apply(3, 6, &[]);
        assert_eq!((s.leader_epoch, s.start_offset), (3, 6));
        assert_eq!(s.batches, vec![b(6, 9, Available, 1)]);
    }
}
