//! Produce dedupe: a message id accepted within the window answers
//! `duplicate` with the first copy's partition and offset.
//!
//! In memory only (for now): a restart forgets the window. Bounded: entries
//! older than the window are dropped, and past `max_entries` the oldest go
//! first (a duplicate that old is then accepted again: at-least-once).

use std::collections::{HashMap, VecDeque};

/// Where the first copy of a message id went, or `None` while its produce is
/// still waiting for the broker's answer.
type Position = Option<(i32, i64)>;

#[derive(Debug)]
pub struct Dedupe {
    window_ms: i64,
    max_entries: usize,
    entries: HashMap<String, (Position, i64)>,
    /// (inserted at, id), oldest first: the eviction order.
    order: VecDeque<(i64, String)>,
}

impl Dedupe {
    pub fn new(window_ms: i64, max_entries: usize) -> Self {
        Dedupe {
            window_ms,
            max_entries: max_entries.max(1),
            entries: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The first copy's position when `id` was accepted within the window.
    /// Otherwise marks `id` as being produced and returns `None`: the caller
    /// produces it and then calls [`Dedupe::record`] (or [`Dedupe::forget`]
    /// when the produce failed). A second request for an id whose produce is
    /// still in flight also gets `None` and writes a second copy (a rare
    /// duplicate, never a lost message).
    pub fn check_and_insert(&mut self, id: &str, now_ms: i64) -> Option<(i32, i64)> {
        self.evict(now_ms);
        if let Some(&(position, _)) = self.entries.get(id) {
            return position;
        }
        self.insert(id, None, now_ms);
        None
    }

    /// `id` was written at (partition, offset).
    pub fn record(&mut self, id: &str, partition: i32, offset: i64, now_ms: i64) {
        match self.entries.get_mut(id) {
            Some((position, _)) => *position = Some((partition, offset)),
            None => self.insert(id, Some((partition, offset)), now_ms),
        }
    }

    /// The produce of `id` failed: a retry must not be answered `duplicate`.
    pub fn forget(&mut self, id: &str) {
        if matches!(self.entries.get(id), Some((None, _))) {
            self.entries.remove(id);
        }
    }

    fn insert(&mut self, id: &str, position: Position, now_ms: i64) {
        self.entries.insert(id.to_owned(), (position, now_ms));
        self.order.push_back((now_ms, id.to_owned()));
        self.evict(now_ms);
    }

    fn evict(&mut self, now_ms: i64) {
        while let Some((at_ms, _)) = self.order.front() {
            let too_old = now_ms - at_ms >= self.window_ms;
            if !too_old && self.order.len() <= self.max_entries {
                break;
            }
            let (at_ms, id) = self.order.pop_front().expect("front exists");
            // Only the entry this order slot made (a forgotten and re-inserted
            // id has a newer slot behind).
            if self.entries.get(&id).is_some_and(|&(_, t)| t == at_ms) {
                self.entries.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_id_is_a_duplicate_within_the_window_only() {
        let mut d = Dedupe::new(1_000, 100);
        assert_eq!(d.check_and_insert("a", 0), None);
        d.record("a", 3, 42, 0);
        assert_eq!(d.check_and_insert("a", 999), Some((3, 42)));
        assert_eq!(d.check_and_insert("a", 1_000), None);
        assert_eq!(d.len(), 1, "re-inserted as pending");
    }

    #[test]
    fn a_failed_produce_is_forgotten_and_memory_is_bounded() {
        let mut d = Dedupe::new(1_000_000, 3);
        assert_eq!(d.check_and_insert("x", 0), None);
        d.forget("x");
        assert!(d.is_empty());
        for (i, id) in ["a", "b", "c", "d"].into_iter().enumerate() {
            assert_eq!(d.check_and_insert(id, i as i64), None);
            d.record(id, 0, i as i64, i as i64);
        }
        assert_eq!(d.len(), 3);
        assert_eq!(d.check_and_insert("a", 10), None, "evicted as oldest");
        assert_eq!(d.check_and_insert("d", 10), Some((0, 3)));
    }
}
