//! The share coordinator's state for one `__share_group_state` partition:
//! every share-partition's persisted state, rebuilt by replaying the
//! partition's records, and the record each request appends.
//!
//! Kafka's rules (`ShareCoordinatorShard`):
//! - the first write of a share-partition, and every write after
//!   `share.coordinator.snapshot.update.records.per.snapshot` updates, is a
//!   snapshot (the whole state, snapshot epoch + 1); other writes are
//!   updates laid over the last snapshot;
//! - a write or read with a leader epoch below the stored one is
//!   `FENCED_LEADER_EPOCH`; a write or initialize with a state epoch below
//!   the stored one is `FENCED_STATE_EPOCH` (the state was reset since);
//! - a delete writes tombstones for both record types.
//!
//! Invariant: no I/O. A request produces the record to append; the caller
//! appends it, and replays it here only once it is committed, so what a
//! reader sees is always durable.

use std::collections::HashMap;

use super::partition::StateBatch;
use super::records::{SharePartitionKey, ShareRecord, Snapshot, Update};
use super::state::{combine, ShareState};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreError {
    FencedLeaderEpoch,
    FencedStateEpoch,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Stored {
    state: ShareState,
    snapshot_epoch: i32,
    updates_since_snapshot: u32,
    create_timestamp: i64,
    /// When the last snapshot was written (0: none was replayed).
    write_timestamp: i64,
}

/// One write of a share-partition's state (WriteShareGroupState).
#[derive(Clone, Debug)]
pub struct Write {
    pub state_epoch: i32,
    pub leader_epoch: i32,
    /// -1 keeps the stored start offset.
    pub start_offset: i64,
    pub batches: Vec<StateBatch>,
}

#[derive(Debug)]
pub struct ShareStateStore {
    updates_per_snapshot: u32,
    states: HashMap<SharePartitionKey, Stored>,
}

impl ShareStateStore {
    /// `updates_per_snapshot` is
    /// `share.coordinator.snapshot.update.records.per.snapshot`.
    pub fn new(updates_per_snapshot: u32) -> Self {
        ShareStateStore {
            updates_per_snapshot,
            states: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.states.len()
    }

    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// Applies one committed record (while loading the partition, or after
    /// an append).
    pub fn replay(&mut self, record: &ShareRecord) {
        match record {
            ShareRecord::Snapshot(key, None) | ShareRecord::Update(key, None) => {
                self.states.remove(key);
            }
            ShareRecord::Snapshot(key, Some(s)) => {
                self.states.insert(
                    key.clone(),
                    Stored {
                        state: ShareState {
                            state_epoch: s.state_epoch,
                            leader_epoch: s.leader_epoch,
                            start_offset: s.start_offset,
                            batches: combine(&[], &s.batches, s.start_offset),
                        },
                        snapshot_epoch: s.snapshot_epoch,
                        updates_since_snapshot: 0,
                        create_timestamp: s.create_timestamp,
                        write_timestamp: s.write_timestamp,
                    },
                );
            }
            ShareRecord::Update(key, Some(u)) => match self.states.get_mut(key) {
                Some(stored) => {
                    stored
                        .state
                        .apply(u.leader_epoch, u.start_offset, &u.batches);
                    stored.updates_since_snapshot += 1;
                }
                None => {
                    let start_offset = u.start_offset.max(0);
                    self.states.insert(
                        key.clone(),
                        Stored {
                            state: ShareState {
                                state_epoch: 0,
                                leader_epoch: u.leader_epoch,
                                start_offset,
                                batches: combine(&[], &u.batches, start_offset),
                            },
                            snapshot_epoch: u.snapshot_epoch,
                            updates_since_snapshot: 1,
                            create_timestamp: 0,
                            write_timestamp: 0,
                        },
                    );
                }
            },
            ShareRecord::Other { .. } => {}
        }
    }

    /// The stored state, for a leader loading the share-partition
    /// (ReadShareGroupState). `None`: never initialized or written.
    pub fn read(
        &self,
        key: &SharePartitionKey,
        leader_epoch: i32,
    ) -> Result<Option<&ShareState>, StoreError> {
        match self.states.get(key) {
            Some(s) if leader_epoch >= 0 && s.state.leader_epoch > leader_epoch => {
                Err(StoreError::FencedLeaderEpoch)
            }
            Some(s) => Ok(Some(&s.state)),
            None => Ok(None),
        }
    }

    /// The record a write appends.
    pub fn write(
        &self,
        key: &SharePartitionKey,
        w: &Write,
        now_ms: i64,
    ) -> Result<ShareRecord, StoreError> {
        let Some(stored) = self.states.get(key) else {
            let start_offset = w.start_offset.max(0);
            return Ok(ShareRecord::Snapshot(
                key.clone(),
                Some(Snapshot {
                    snapshot_epoch: 0,
                    state_epoch: w.state_epoch.max(0),
                    leader_epoch: w.leader_epoch,
                    start_offset,
                    delivery_complete_count: -1,
                    create_timestamp: now_ms,
                    write_timestamp: now_ms,
                    batches: combine(&[], &w.batches, start_offset),
                }),
            ));
        };
        if stored.state.leader_epoch > w.leader_epoch {
            return Err(StoreError::FencedLeaderEpoch);
        }
        if stored.state.state_epoch > w.state_epoch {
            return Err(StoreError::FencedStateEpoch);
        }
        if stored.updates_since_snapshot >= self.updates_per_snapshot {
            let mut state = stored.state.clone();
            state.apply(w.leader_epoch, w.start_offset, &w.batches);
            return Ok(ShareRecord::Snapshot(
                key.clone(),
                Some(Snapshot {
                    snapshot_epoch: stored.snapshot_epoch + 1,
                    state_epoch: w.state_epoch,
                    leader_epoch: state.leader_epoch,
                    start_offset: state.start_offset,
                    delivery_complete_count: -1,
                    create_timestamp: stored.create_timestamp,
                    write_timestamp: now_ms,
                    batches: state.batches,
                }),
            ));
        }
        let start_offset = if w.start_offset >= 0 {
            w.start_offset
        } else {
            stored.state.start_offset
        };
        Ok(ShareRecord::Update(
            key.clone(),
            Some(Update {
                snapshot_epoch: stored.snapshot_epoch,
                leader_epoch: w.leader_epoch,
                start_offset: w.start_offset,
                delivery_complete_count: -1,
                batches: combine(&[], &w.batches, start_offset),
            }),
        ))
    }

    /// The record that (re)initializes a share-partition at `start_offset`
    /// with a new state epoch (InitializeShareGroupState: the group starts
    /// consuming it, or its offsets were altered).
    pub fn initialize(
        &self,
        key: &SharePartitionKey,
        state_epoch: i32,
        start_offset: i64,
        now_ms: i64,
    ) -> Result<ShareRecord, StoreError> {
        let stored = self.states.get(key);
        if stored.is_some_and(|s| s.state.state_epoch > state_epoch) {
            return Err(StoreError::FencedStateEpoch);
        }
        Ok(ShareRecord::Snapshot(
            key.clone(),
            Some(Snapshot {
                snapshot_epoch: stored.map_or(0, |s| s.snapshot_epoch + 1),
                state_epoch,
                leader_epoch: stored.map_or(-1, |s| s.state.leader_epoch),
                start_offset,
                delivery_complete_count: -1,
                create_timestamp: now_ms,
                write_timestamp: now_ms,
                batches: Vec::new(),
            }),
        ))
    }

    /// Kafka's cold-partition snapshots
    /// (`share.coordinator.cold.partition.snapshot.interval.ms`): a new
    /// snapshot, same snapshot epoch, of every share-partition whose last
    /// snapshot is at least `interval_ms` old. `__share_group_state` is a
    /// delete-policy topic, so without them a share-partition left alone
    /// past the topic's retention would lose the records it is rebuilt
    /// from.
    pub fn cold_snapshots(&self, now_ms: i64, interval_ms: i64) -> Vec<ShareRecord> {
        let mut out: Vec<ShareRecord> = self
            .states
            .iter()
            .filter(|(_, s)| now_ms.saturating_sub(s.write_timestamp) >= interval_ms)
            .map(|(key, s)| {
                ShareRecord::Snapshot(
                    key.clone(),
                    Some(Snapshot {
                        snapshot_epoch: s.snapshot_epoch,
                        state_epoch: s.state.state_epoch,
                        leader_epoch: s.state.leader_epoch,
                        start_offset: s.state.start_offset,
                        delivery_complete_count: -1,
                        create_timestamp: s.create_timestamp,
                        write_timestamp: now_ms,
                        batches: s.state.batches.clone(),
                    }),
                )
            })
            .collect();
        // One order whatever the map's, so a batch of them is reproducible.
        out.sort_by(|a, b| match (a, b) {
            (ShareRecord::Snapshot(x, _), ShareRecord::Snapshot(y, _)) => x.cmp(y),
            _ => std::cmp::Ordering::Equal,
        });
        out
    }

    /// The tombstones that delete a share-partition's state
    /// (DeleteShareGroupState), or nothing if none is stored.
    pub fn delete(&self, key: &SharePartitionKey) -> Vec<ShareRecord> {
        if !self.states.contains_key(key) {
            return Vec::new();
        }
        vec![
            ShareRecord::Snapshot(key.clone(), None),
            ShareRecord::Update(key.clone(), None),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::share::partition::RecordState;
    use uuid::Uuid;

    fn key() -> SharePartitionKey {
        SharePartitionKey {
            group_id: "g".into(),
            topic_id: Uuid::from_u128(9),
            partition: 0,
        }
    }

    fn batch(first: i64, last: i64, state: RecordState, count: i16) -> StateBatch {
        StateBatch {
            first_offset: first,
            last_offset: last,
            state,
            delivery_count: count,
        }
    }

    fn write(store: &mut ShareStateStore, w: Write) -> ShareRecord {
        let record = store.write(&key(), &w, 1).unwrap();
        store.replay(&record);
        record
    }

    #[test]
    fn a_snapshot_then_updates_then_a_snapshot_again() {
        let mut store = ShareStateStore::new(2);
        let first = write(
            &mut store,
            Write {
                state_epoch: 0,
                leader_epoch: 1,
                start_offset: 0,
                batches: vec![batch(0, 4, RecordState::Available, 1)],
            },
        );
        assert!(matches!(first, ShareRecord::Snapshot(_, Some(ref s)) if s.snapshot_epoch == 0));
        for (i, offset) in [0, 1].into_iter().enumerate() {
            let r = write(
                &mut store,
                Write {
                    state_epoch: 0,
                    leader_epoch: 1,
                    start_offset: -1,
                    batches: vec![batch(offset, offset, RecordState::Acknowledged, 1)],
                },
            );
            assert!(matches!(r, ShareRecord::Update(..)), "write {i}");
        }
        let state = store.read(&key(), 1).unwrap().unwrap().clone();
        assert_eq!(
            state.batches,
            vec![
                batch(0, 1, RecordState::Acknowledged, 1),
                batch(2, 4, RecordState::Available, 1)
            ]
        );
        // Two updates since the snapshot: the next write is a snapshot with
        // the whole state.
        let r = write(
            &mut store,
            Write {
                state_epoch: 0,
                leader_epoch: 2,
                start_offset: 2,
                batches: vec![],
            },
        );
        match r {
            ShareRecord::Snapshot(_, Some(s)) => {
                assert_eq!(s.snapshot_epoch, 1);
                assert_eq!((s.leader_epoch, s.start_offset), (2, 2));
                assert_eq!(s.batches, vec![batch(2, 4, RecordState::Available, 1)]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn stale_epochs_are_fenced() {
        let mut store = ShareStateStore::new(10);
        write(
            &mut store,
            Write {
                state_epoch: 3,
                leader_epoch: 5,
                start_offset: 0,
                batches: vec![],
            },
        );
        let stale_leader = Write {
            state_epoch: 3,
            leader_epoch: 4,
            start_offset: 0,
            batches: vec![],
        };
        assert_eq!(
            store.write(&key(), &stale_leader, 0),
            Err(StoreError::FencedLeaderEpoch)
        );
        assert_eq!(store.read(&key(), 4), Err(StoreError::FencedLeaderEpoch));
        let stale_state = Write {
            state_epoch: 2,
            leader_epoch: 5,
            start_offset: 0,
            batches: vec![],
        };
        assert_eq!(
            store.write(&key(), &stale_state, 0),
            Err(StoreError::FencedStateEpoch)
        );
        assert_eq!(
            store.initialize(&key(), 2, 0, 0),
            Err(StoreError::FencedStateEpoch)
        );
    }

    #[test]
    fn initialize_resets_and_delete_removes() {
        let mut store = ShareStateStore::new(10);
        write(
            &mut store,
            Write {
                state_epoch: 0,
                leader_epoch: 0,
                start_offset: 0,
                batches: vec![batch(0, 0, RecordState::Acknowledged, 1)],
            },
        );
        let r = store.initialize(&key(), 1, 100, 0).unwrap();
        store.replay(&r);
        let state = store.read(&key(), -1).unwrap().unwrap();
        assert_eq!((state.state_epoch, state.start_offset), (1, 100));
        assert!(state.batches.is_empty());
        for r in store.delete(&key()) {
            store.replay(&r);
        }
        assert_eq!(store.read(&key(), 0), Ok(None));
        assert!(store.delete(&key()).is_empty());
    }

    #[test]
    fn cold_share_partitions_get_a_fresh_snapshot_of_the_same_state() {
        let mut store = ShareStateStore::new(10);
        let r = store.initialize(&key(), 0, 0, 1_000).unwrap();
        store.replay(&r);
        let r = store
            .write(
                &key(),
                &Write {
                    state_epoch: 0,
                    leader_epoch: 2,
                    start_offset: -1,
                    batches: vec![batch(0, 3, RecordState::Acknowledged, 1)],
                },
                2_000,
            )
            .unwrap();
        assert!(matches!(r, ShareRecord::Update(..)));
        store.replay(&r);
        let before = store.read(&key(), -1).unwrap().unwrap().clone();
        // Not yet cold: snapshotted at 1000, interval 5000.
        assert!(store.cold_snapshots(5_999, 5_000).is_empty());
        let cold = store.cold_snapshots(6_000, 5_000);
        assert_eq!(cold.len(), 1);
        match &cold[0] {
            ShareRecord::Snapshot(_, Some(s)) => {
                assert_eq!((s.snapshot_epoch, s.write_timestamp), (0, 6_000));
            }
            other => panic!("{other:?}"),
        }
        store.replay(&cold[0]);
        assert_eq!(store.read(&key(), -1).unwrap().unwrap(), &before);
        assert!(store.cold_snapshots(6_000, 5_000).is_empty());
    }

    #[test]
    fn replay_of_the_encoded_records_rebuilds_the_same_state() {
        use crate::share::records::{decode, encode_snapshot, encode_update};
        let mut store = ShareStateStore::new(1);
        let mut log = Vec::new();
        for (start, b) in [
            (0, batch(0, 9, RecordState::Available, 1)),
            (-1, batch(3, 3, RecordState::Archived, 1)),
            (4, batch(4, 4, RecordState::Acknowledged, 2)),
        ] {
            let r = write(
                &mut store,
                Write {
                    state_epoch: 0,
                    leader_epoch: 0,
                    start_offset: start,
                    batches: vec![b],
                },
            );
            log.push(match &r {
                ShareRecord::Snapshot(k, Some(s)) => encode_snapshot(k, s).unwrap(),
                ShareRecord::Update(k, Some(u)) => encode_update(k, u).unwrap(),
                other => panic!("{other:?}"),
            });
        }
        let mut loaded = ShareStateStore::new(1);
        for (k, v) in &log {
            loaded.replay(&decode(k, Some(v)).unwrap());
        }
        assert_eq!(loaded.read(&key(), 0), store.read(&key(), 0));
        let state = loaded.read(&key(), 0).unwrap().unwrap();
        assert_eq!(state.start_offset, 4);
        assert_eq!(
            state.batches,
            vec![
                batch(4, 4, RecordState::Acknowledged, 2),
                batch(5, 9, RecordState::Available, 1)
            ]
        );
    }
}
