//! Transactional offsets in the offset store: pending until the
//! transaction's marker, ordered against plain commits by record offset,
//! and kept out of expiry and group deletion while pending.

use super::offsets::{GroupExpiryState, OffsetAndMetadata, OffsetStore};
use super::records::CoordinatorRecord;

const PID: i64 = 4000;
const OTHER_PID: i64 = 4001;

fn offset(committed_offset: i64) -> OffsetAndMetadata {
    OffsetAndMetadata {
        committed_offset,
        committed_leader_epoch: None,
        metadata: String::new(),
        commit_timestamp_ms: 1_000,
        expire_timestamp_ms: None,
        topic_id: None,
    }
}

fn commit(group_id: &str, topic: &str, partition: i32, committed: i64) -> CoordinatorRecord {
    CoordinatorRecord::OffsetCommit {
        group_id: group_id.into(),
        topic: topic.into(),
        partition,
        value: Some(offset(committed)),
    }
}

fn tombstone(group_id: &str, topic: &str, partition: i32) -> CoordinatorRecord {
    CoordinatorRecord::OffsetCommit {
        group_id: group_id.into(),
        topic: topic.into(),
        partition,
        value: None,
    }
}

fn fetched(store: &OffsetStore, partition: i32) -> Option<i64> {
    store.fetch("g", "t", partition).map(|o| o.committed_offset)
}

#[test]
fn a_transactional_offset_is_invisible_until_its_transaction_commits() {
    let mut store = OffsetStore::new();
    store.replay(10, None, &commit("g", "t", 0, 5));
    store.replay(11, Some(PID), &commit("g", "t", 0, 9));
    store.replay(12, Some(PID), &commit("g", "t", 1, 3));
    assert_eq!(
        fetched(&store, 0),
        Some(5),
        "the committed offset is served"
    );
    assert_eq!(fetched(&store, 1), None);
    assert!(store.has_pending("g", "t", 0));
    assert!(store.has_pending("g", "t", 1));
    assert!(!store.has_pending("g", "t", 2));
    assert!(store.has_open_transactions("g"));

    store.replay_end_txn(PID, true);
    assert_eq!(fetched(&store, 0), Some(9));
    assert_eq!(fetched(&store, 1), Some(3));
    assert!(!store.has_pending("g", "t", 0));
    assert!(!store.has_open_transactions("g"));
}

#[test]
fn an_aborted_transaction_leaves_the_committed_offsets_as_they_were() {
    let mut store = OffsetStore::new();
    store.replay(10, None, &commit("g", "t", 0, 5));
    store.replay(11, Some(PID), &commit("g", "t", 0, 9));
    store.replay(12, Some(PID), &commit("g", "t", 1, 3));
    store.replay_end_txn(PID, false);
    assert_eq!(fetched(&store, 0), Some(5));
    assert_eq!(fetched(&store, 1), None);
    assert!(!store.has_open_transactions("g"));
    assert_eq!(store.groups().collect::<Vec<_>>(), vec!["g"]);
    // A second marker for the same producer finds nothing to do.
    store.replay_end_txn(PID, true);
    assert_eq!(fetched(&store, 0), Some(5));
}

#[test]
fn a_plain_commit_after_the_transactional_one_wins_when_the_transaction_commits() {
    let mut store = OffsetStore::new();
    store.replay(20, Some(PID), &commit("g", "t", 0, 9));
    store.replay(21, None, &commit("g", "t", 0, 12));
    assert_eq!(fetched(&store, 0), Some(12));
    store.replay_end_txn(PID, true);
    assert_eq!(
        fetched(&store, 0),
        Some(12),
        "the plain commit's record is later in the log"
    );
}

#[test]
fn a_transactional_commit_after_the_plain_one_replaces_it_on_commit() {
    let mut store = OffsetStore::new();
    store.replay(20, None, &commit("g", "t", 0, 12));
    store.replay(21, Some(PID), &commit("g", "t", 0, 9));
    store.replay_end_txn(PID, true);
    assert_eq!(fetched(&store, 0), Some(9));
}

#[test]
fn apply_places_records_after_everything_replayed_so_far() {
    let mut store = OffsetStore::new();
    store.replay(50, Some(PID), &commit("g", "t", 0, 9));
    store.apply(&commit("g", "t", 0, 12));
    store.replay_end_txn(PID, true);
    assert_eq!(fetched(&store, 0), Some(12));
}

#[test]
fn a_marker_ends_only_its_own_producers_transaction() {
    let mut store = OffsetStore::new();
    store.replay(1, Some(PID), &commit("g", "t", 0, 9));
    store.replay(2, Some(OTHER_PID), &commit("g", "t", 0, 11));
    store.replay(3, Some(OTHER_PID), &commit("h", "t", 0, 4));
    store.replay_end_txn(PID, true);
    assert_eq!(fetched(&store, 0), Some(9));
    assert!(
        store.has_pending("g", "t", 0),
        "the other producer's offset is still pending"
    );
    assert_eq!(
        store.groups_with_pending().collect::<Vec<_>>(),
        vec!["g", "h"]
    );
    store.replay_end_txn(OTHER_PID, true);
    assert_eq!(fetched(&store, 0), Some(11));
    assert_eq!(
        store.fetch("h", "t", 0).map(|o| o.committed_offset),
        Some(4)
    );
    assert_eq!(store.groups_with_pending().count(), 0);
}

#[test]
fn a_tombstone_deletes_the_pending_offsets_of_its_partition() {
    let mut store = OffsetStore::new();
    store.replay(1, None, &commit("g", "t", 0, 5));
    store.replay(2, Some(PID), &commit("g", "t", 0, 9));
    store.replay(3, Some(PID), &commit("g", "t", 1, 3));
    store.replay(4, None, &tombstone("g", "t", 0));
    assert!(!store.has_pending("g", "t", 0));
    assert!(store.has_pending("g", "t", 1));
    store.replay_end_txn(PID, true);
    assert_eq!(fetched(&store, 0), None, "the deleted offset stays deleted");
    assert_eq!(fetched(&store, 1), Some(3));
}

#[test]
fn deleting_a_group_tombstones_partitions_with_only_pending_offsets_too() {
    let mut store = OffsetStore::new();
    store.replay(1, None, &commit("g", "t", 0, 5));
    store.replay(2, Some(PID), &commit("g", "t", 0, 9));
    store.replay(3, Some(PID), &commit("g", "t", 1, 3));
    let records = store.delete_group_records("g");
    // One tombstone per partition: a committed one is not tombstoned twice.
    assert_eq!(
        records,
        vec![tombstone("g", "t", 0), tombstone("g", "t", 1)]
    );
    for (i, r) in records.iter().enumerate() {
        store.replay(10 + i as i64, None, r);
    }
    assert!(!store.has_open_transactions("g"));
    store.replay_end_txn(PID, true);
    assert_eq!(fetched(&store, 0), None);
    assert_eq!(fetched(&store, 1), None);
}

#[test]
fn offset_delete_and_topic_deletion_reach_pending_offsets() {
    let mut store = OffsetStore::new();
    store.replay(1, None, &commit("g", "t", 0, 5));
    store.replay(2, Some(PID), &commit("g", "t", 1, 3));
    assert_eq!(
        store.delete_partition_records("g", "t", &[0, 1, 2]),
        vec![tombstone("g", "t", 0), tombstone("g", "t", 1)]
    );
    assert_eq!(
        store
            .topic_partitions("g", "t")
            .into_iter()
            .collect::<Vec<_>>(),
        vec![0, 1]
    );
    assert!(store.topic_partitions("g", "other").is_empty());
}

#[test]
fn a_pending_offset_keeps_its_partition_from_expiring_and_its_group_from_deletion() {
    let mut store = OffsetStore::new();
    store.replay(1, None, &commit("g", "t", 0, 5));
    store.replay(2, None, &commit("g", "t", 1, 6));
    store.replay(3, Some(PID), &commit("g", "t", 1, 7));
    let late = 1_000 + 10_000;
    let expiration = store.expired_records(late, 1_000, |_| GroupExpiryState::ClassicSimple);
    assert_eq!(expiration.records, vec![tombstone("g", "t", 0)]);
    assert!(expiration.deleted_groups.is_empty());

    // Only pending offsets left: the empty group is still not deleted.
    let mut pending_only = OffsetStore::new();
    pending_only.replay(1, Some(PID), &commit("g", "t", 0, 7));
    let expiration = pending_only.expired_records(late, 1_000, |_| GroupExpiryState::ClassicSimple);
    assert!(expiration.records.is_empty());
    assert!(expiration.deleted_groups.is_empty());

    // Once the transaction aborts, both go.
    store.replay_end_txn(PID, false);
    let expiration = store.expired_records(late, 1_000, |_| GroupExpiryState::ClassicSimple);
    assert_eq!(
        expiration.records,
        vec![
            tombstone("g", "t", 0),
            tombstone("g", "t", 1),
            CoordinatorRecord::GroupMetadata {
                group_id: "g".into(),
                value: None
            },
        ]
    );
    assert_eq!(expiration.deleted_groups, vec!["g".to_string()]);
}

#[test]
fn unloading_a_group_forgets_its_pending_offsets() {
    let mut store = OffsetStore::new();
    store.replay(1, Some(PID), &commit("g", "t", 0, 7));
    store.replay(2, Some(PID), &commit("h", "t", 0, 8));
    store.unload("g");
    assert!(!store.has_open_transactions("g"));
    store.replay_end_txn(PID, true);
    assert_eq!(fetched(&store, 0), None);
    assert_eq!(
        store.fetch("h", "t", 0).map(|o| o.committed_offset),
        Some(8)
    );
}
