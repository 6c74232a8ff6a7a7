//! The leader epoch cache of one partition replica, after Kafka's
//! `LeaderEpochFileCache`: the ascending list of (leader epoch, offset of the
//! first batch written in that epoch). Followers use it to find where their
//! log diverges from the leader's (OffsetForLeaderEpoch), and consumers to
//! validate their position after a leader change (KIP-320).
//!
//! Unlike Kafka, there is no checkpoint file: the list is rebuilt on open from
//! the batch headers the log walks anyway (`Log::epoch_starts`), then kept in
//! step with appends and truncations. What a checkpoint would add is an epoch
//! none of whose batches survive (compaction can empty one); its boundary is
//! then lost on restart, which can only make a follower truncate less
//! precisely, never accept a divergent batch: the batches themselves carry
//! their epochs.
//!
//! Pure logic: no I/O.

use crate::types::{LeaderEpoch, Offset};

/// Kafka's `UNDEFINED_EPOCH`.
pub const UNDEFINED_EPOCH: LeaderEpoch = LeaderEpoch(-1);
/// Kafka's `UNDEFINED_EPOCH_OFFSET`.
pub const UNDEFINED_EPOCH_OFFSET: Offset = Offset(-1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: LeaderEpoch,
    pub start_offset: Offset,
}

/// Epochs strictly ascending, start offsets strictly ascending.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaderEpochCache {
    entries: Vec<EpochEntry>,
}

impl LeaderEpochCache {
    /// Builds the cache from (epoch, base offset) of batches in log order,
    /// as `assign` would have seen them when they were appended.
    pub fn from_batches(batches: impl IntoIterator<Item = (LeaderEpoch, Offset)>) -> Self {
        let mut cache = Self::default();
        for (epoch, offset) in batches {
            cache.assign(epoch, offset);
        }
        cache
    }

    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    pub fn latest_epoch(&self) -> Option<LeaderEpoch> {
        self.entries.last().map(|e| e.epoch)
    }

    pub fn earliest_entry(&self) -> Option<EpochEntry> {
        self.entries.first().copied()
    }

    /// Kafka's `assign`: records that `epoch` starts at `start_offset`.
    /// Negative epochs (batches written without one) are ignored. An entry
    /// for the latest epoch at the same or a later offset changes nothing;
    /// otherwise every entry with an epoch >= `epoch` or a start offset >=
    /// `start_offset` is dropped first, so the list stays monotonic.
    pub fn assign(&mut self, epoch: LeaderEpoch, start_offset: Offset) {
        if epoch.0 < 0 || start_offset.0 < 0 {
            return;
        }
        if let Some(last) = self.entries.last() {
            if last.epoch == epoch && start_offset >= last.start_offset {
                return;
            }
        }
        while let Some(last) = self.entries.last() {
            if last.epoch >= epoch || last.start_offset >= start_offset {
                self.entries.pop();
            } else {
                break;
            }
        }
        self.entries.push(EpochEntry {
            epoch,
            start_offset,
        });
    }

    /// Kafka's `endOffsetFor`: for the largest epoch <= `requested`, that
    /// epoch and the offset where the next epoch starts (the log end offset
    /// when `requested` is the latest epoch). `(UNDEFINED_EPOCH,
    /// UNDEFINED_EPOCH_OFFSET)` when the requested epoch is undefined, above
    /// every known epoch, or the cache is empty. A requested epoch below
    /// every known one answers with itself and the first known start offset:
    /// its data is gone from the log, and the follower must start there.
    pub fn end_offset_for(
        &self,
        requested: LeaderEpoch,
        log_end_offset: Offset,
    ) -> (LeaderEpoch, Offset) {
        let undefined = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET);
        if requested == UNDEFINED_EPOCH {
            return undefined;
        }
        if self.latest_epoch() == Some(requested) {
            return (requested, log_end_offset);
        }
        // The first entry with an epoch above the requested one.
        let higher = self.entries.partition_point(|e| e.epoch <= requested);
        let Some(next) = self.entries.get(higher) else {
            return undefined;
        };
        match higher.checked_sub(1).map(|i| self.entries[i]) {
            None => (requested, next.start_offset),
            Some(floor) => (floor.epoch, next.start_offset),
        }
    }

    /// Kafka's `truncateFromEnd`: the log was cut at `end_offset`; entries
    /// starting at or above it go.
    pub fn truncate_from_end(&mut self, end_offset: Offset) {
        if end_offset.0 < 0 {
            return;
        }
        while self
            .entries
            .last()
            .is_some_and(|e| e.start_offset >= end_offset)
        {
            self.entries.pop();
        }
    }

    /// Kafka's `truncateFromStart`: the log start moved to `start_offset`.
    /// Entries starting at or below it go, except that the last of them is
    /// kept with its start moved up to `start_offset`.
    pub fn truncate_from_start(&mut self, start_offset: Offset) {
        let removed = self
            .entries
            .partition_point(|e| e.start_offset <= start_offset);
        if removed == 0 {
            return;
        }
        let kept = EpochEntry {
            epoch: self.entries[removed - 1].epoch,
            start_offset,
        };
        self.entries.drain(..removed);
        self.entries.insert(0, kept);
    }

    /// Forgets everything (the log was emptied and restarted elsewhere).
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    //! Cases after Kafka's `LeaderEpochFileCacheTest`.
    use super::*;

    fn e(epoch: i32) -> LeaderEpoch {
        LeaderEpoch(epoch)
    }
    fn o(offset: i64) -> Offset {
        Offset(offset)
    }
    fn cache(entries: &[(i32, i64)]) -> LeaderEpochCache {
        let mut c = LeaderEpochCache::default();
        for &(ep, off) in entries {
            c.assign(e(ep), o(off));
        }
        c
    }
    fn list(c: &LeaderEpochCache) -> Vec<(i32, i64)> {
        c.entries()
            .iter()
            .map(|x| (x.epoch.0, x.start_offset.0))
            .collect()
    }

    #[test]
    fn should_add_epoch_and_message_offset_to_cache() {
        let c = cache(&[(2, 10)]);
        assert_eq!(list(&c), vec![(2, 10)]);
        assert_eq!(c.latest_epoch(), Some(e(2)));
        assert_eq!(c.end_offset_for(e(2), o(11)), (e(2), o(11)));
    }

    #[test]
    fn should_return_log_end_offset_if_latest_epoch_requested() {
        let c = cache(&[(2, 5), (3, 6), (4, 7)]);
        assert_eq!(c.end_offset_for(e(4), o(8)), (e(4), o(8)));
    }

    #[test]
    fn should_return_undefined_offset_if_undefined_epoch_requested() {
        let c = cache(&[(2, 5), (3, 6)]);
        assert_eq!(
            c.end_offset_for(UNDEFINED_EPOCH, o(10)),
            (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
        );
    }

    #[test]
    fn should_not_overwrite_the_start_of_the_latest_epoch_once_set() {
        let mut c = cache(&[(2, 9)]);
        c.assign(e(2), o(10));
        assert_eq!(list(&c), vec![(2, 9)]);
        // An earlier, non-latest epoch assigned again rewrites history:
        // everything from it on goes (Kafka's maybeTruncateNonMonotonicEntries).
        let mut c = cache(&[(2, 6), (3, 8), (4, 9)]);
        c.assign(e(3), o(10));
        assert_eq!(list(&c), vec![(2, 6), (3, 10)]);
    }

    #[test]
    fn should_return_undefined_for_epoch_above_latest_and_for_empty_cache() {
        let empty = LeaderEpochCache::default();
        assert_eq!(
            empty.end_offset_for(e(0), o(0)),
            (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
        );
        let c = cache(&[(2, 5)]);
        assert_eq!(
            c.end_offset_for(e(3), o(10)),
            (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
        );
    }

    #[test]
    fn should_return_requested_epoch_and_first_start_when_below_all_epochs() {
        let c = cache(&[(5, 11), (6, 12)]);
        assert_eq!(c.end_offset_for(e(1), o(20)), (e(1), o(11)));
        assert_eq!(c.end_offset_for(e(4), o(20)), (e(4), o(11)));
    }

    #[test]
    fn should_return_floor_epoch_and_next_start_for_unknown_middle_epoch() {
        // Kafka: shouldReturnNextAvailableEpochIfThereIsNoExactEpochForTheOneRequested
        let c = cache(&[(0, 10), (2, 13), (4, 17)]);
        assert_eq!(c.end_offset_for(e(1), o(20)), (e(0), o(13)));
        assert_eq!(c.end_offset_for(e(3), o(20)), (e(2), o(17)));
        assert_eq!(c.end_offset_for(e(0), o(20)), (e(0), o(13)));
    }

    #[test]
    fn should_drop_later_entries_when_an_earlier_epoch_or_offset_is_assigned() {
        // Kafka: shouldNotStoreNonMonotonicEpochs / shouldUpdateSavedOffsetWhenOffsetToClearToIsBetweenEpochs
        let mut c = cache(&[(1, 5), (2, 10), (3, 15)]);
        c.assign(e(4), o(12));
        assert_eq!(list(&c), vec![(1, 5), (2, 10), (4, 12)]);
        c.assign(e(2), o(20));
        assert_eq!(list(&c), vec![(1, 5), (2, 20)]);
        // The same latest epoch at an earlier offset moves it down.
        c.assign(e(2), o(7));
        assert_eq!(list(&c), vec![(1, 5), (2, 7)]);
        // Negative epochs (no epoch recorded) are ignored.
        c.assign(e(-1), o(30));
        assert_eq!(list(&c), vec![(1, 5), (2, 7)]);
    }

    #[test]
    fn truncate_from_end_drops_entries_at_or_above_the_offset() {
        // Kafka: shouldDropEntriesOnEpochBoundaryWhenRemovingLatestEntries
        let mut c = cache(&[(2, 6), (3, 8), (4, 11)]);
        c.truncate_from_end(o(8));
        assert_eq!(list(&c), vec![(2, 6)]);
        // Kafka: shouldRetainLatestEpochOnClearAllEarliestAndUpdateItsOffset
        let mut c = cache(&[(2, 6), (3, 8), (4, 11)]);
        c.truncate_from_end(o(9));
        assert_eq!(list(&c), vec![(2, 6), (3, 8)]);
        // Past the end changes nothing; a negative offset is ignored.
        c.truncate_from_end(o(100));
        c.truncate_from_end(o(-1));
        assert_eq!(list(&c), vec![(2, 6), (3, 8)]);
    }

    #[test]
    fn truncate_from_start_keeps_the_epoch_covering_the_new_start() {
        // Kafka: shouldUpdateSavedOffsetWhenOffsetToClearToIsBetweenEpochs
        let mut c = cache(&[(2, 6), (3, 8), (4, 11)]);
        c.truncate_from_start(o(9));
        assert_eq!(list(&c), vec![(3, 9), (4, 11)]);
        // Kafka: shouldNotClearAnythingIfOffsetToEarly
        let mut c = cache(&[(2, 6), (3, 8)]);
        c.truncate_from_start(o(1));
        assert_eq!(list(&c), vec![(2, 6), (3, 8)]);
        // Kafka: shouldRetainLatestEpochOnClearAllEarliestAndUpdateItsOffset
        let mut c = cache(&[(2, 6), (3, 8), (4, 11)]);
        c.truncate_from_start(o(15));
        assert_eq!(list(&c), vec![(4, 15)]);
        // Exactly on a boundary.
        let mut c = cache(&[(2, 6), (3, 8)]);
        c.truncate_from_start(o(8));
        assert_eq!(list(&c), vec![(3, 8)]);
    }

    #[test]
    fn from_batches_keeps_the_first_offset_of_each_epoch() {
        let c = LeaderEpochCache::from_batches([
            (e(0), o(0)),
            (e(0), o(3)),
            (e(2), o(5)),
            (e(2), o(9)),
            (e(5), o(10)),
        ]);
        assert_eq!(list(&c), vec![(0, 0), (2, 5), (5, 10)]);
        assert_eq!(c.earliest_entry().map(|x| x.epoch), Some(e(0)));
    }
}
