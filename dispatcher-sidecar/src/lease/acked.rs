//! The acked-above-commit set, kept as disjoint half-open ranges.
//!
//! Acks mostly arrive in offset order, and offsets with nothing to deliver
//! (transaction markers, compacted gaps) come as whole ranges, so a range set
//! costs one entry per run of acked offsets instead of one per offset.

use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct AckedRanges {
    /// start -> end (exclusive); ranges never touch or overlap.
    ranges: BTreeMap<i64, i64>,
}

impl AckedRanges {
    pub(crate) fn contains(&self, offset: i64) -> bool {
        self.ranges
            .range(..=offset)
            .next_back()
            .is_some_and(|(_, &end)| offset < end)
    }

    /// Adds `[start, end)`, merging with any range it touches.
    pub(crate) fn insert(&mut self, mut start: i64, mut end: i64) {
        if start >= end {
            return;
        }
        if let Some((&s, &e)) = self.ranges.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.ranges.remove(&s);
            }
        }
        while let Some((&s, &e)) = self.ranges.range(start..=end).next() {
            end = end.max(e);
            self.ranges.remove(&s);
        }
        self.ranges.insert(start, end);
    }

    /// If a range starts at `offset`, removes it and returns its end: the
    /// commit point can jump there.
    pub(crate) fn take_run_at(&mut self, offset: i64) -> Option<i64> {
        self.ranges.remove(&offset)
    }

    /// Forgets everything below `offset` (the commit point moved past it).
    pub(crate) fn trim_below(&mut self, offset: i64) {
        let keep = self.ranges.split_off(&offset);
        let below = std::mem::replace(&mut self.ranges, keep);
        if let Some((_, &end)) = below.iter().next_back() {
            if end > offset {
                self.ranges.insert(offset, end);
            }
        }
    }

    pub(crate) fn ranges(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.ranges.iter().map(|(&s, &e)| (s, e))
    }

    pub(crate) fn run_count(&self) -> usize {
        self.ranges.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_when_they_touch_and_trim_at_the_commit_point() {
        let mut a = AckedRanges::default();
        a.insert(5, 6);
        a.insert(7, 8);
        assert_eq!(a.run_count(), 2);
        a.insert(6, 7);
        assert_eq!(a.ranges().collect::<Vec<_>>(), vec![(5, 8)]);
        a.insert(10, 20);
        a.insert(3, 12);
        assert_eq!(a.ranges().collect::<Vec<_>>(), vec![(3, 20)]);
        assert!(a.contains(3) && a.contains(19) && !a.contains(20) && !a.contains(2));
        a.trim_below(10);
        assert_eq!(a.ranges().collect::<Vec<_>>(), vec![(10, 20)]);
        assert_eq!(a.take_run_at(10), Some(20));
        assert_eq!(a.run_count(), 0);
    }
}
