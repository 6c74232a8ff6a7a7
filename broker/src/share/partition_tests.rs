use super::*;

const LIMITS: Limits = Limits {
    max_in_flight: 100,
    delivery_limit: 3,
    lock_duration_ms: 1_000,
};

fn member(name: &str) -> Arc<str> {
    Arc::from(name)
}

fn data(first: i64, last: i64) -> LogBatch {
    LogBatch {
        first_offset: first,
        last_offset: last,
        control: false,
    }
}

fn run(first: i64, last: i64, delivery_count: i16) -> Acquired {
    Acquired {
        first_offset: first,
        last_offset: last,
        delivery_count,
    }
}

fn ack(first: i64, last: i64, kind: AckType) -> AckBatch {
    AckBatch {
        first_offset: first,
        last_offset: last,
        types: vec![kind],
    }
}

/// A partition whose log holds batches of `per_batch` records from 0 on.
fn log_from(offset: i64, per_batch: i64, batches: i64) -> Vec<LogBatch> {
    let base = offset - offset % per_batch;
    (0..batches)
        .map(|k| data(base + k * per_batch, base + (k + 1) * per_batch - 1))
        .collect()
}

#[test]
fn acquires_whole_batches_and_counts_a_delivery() {
    let mut p = SharePartition::new(0, LIMITS);
    let a = member("a");
    let got = p.acquire(&a, &log_from(0, 5, 3), 7, AcquireMode::BatchOptimized, 0);
    // Batch-optimized: the second batch starts below the maximum, so all of
    // it is taken; the third is not.
    assert_eq!(got, vec![run(0, 9, 1)]);
    assert_eq!((p.start_offset(), p.end_offset()), (0, 10));
    assert_eq!(p.acquired_count(), 10);
    assert_eq!(p.next_fetch_offset(), 10);
    assert_eq!(p.record(3), Some((RecordState::Acquired, 1)));
}

#[test]
fn record_limit_mode_splits_a_batch_at_the_maximum() {
    let mut p = SharePartition::new(0, LIMITS);
    let a = member("a");
    let got = p.acquire(&a, &log_from(0, 5, 3), 7, AcquireMode::RecordLimit, 0);
    assert_eq!(got, vec![run(0, 6, 1)]);
    assert_eq!(p.end_offset(), 7);
    // The next read starts mid-batch; the taken offsets are skipped.
    let got = p.acquire(&a, &log_from(7, 5, 2), 2, AcquireMode::RecordLimit, 0);
    assert_eq!(got, vec![run(7, 8, 1)]);
}

#[test]
fn accept_moves_the_start_and_a_hole_holds_it() {
    let mut p = SharePartition::new(0, LIMITS);
    let a = member("a");
    p.acquire(&a, &log_from(0, 10, 1), 10, AcquireMode::BatchOptimized, 0);
    p.acknowledge("a", &[ack(2, 9, AckType::Accept)], 1)
        .unwrap();
    // Offsets 0 and 1 are still acquired: the SPSO stays.
    assert_eq!(p.start_offset(), 0);
    p.acknowledge("a", &[ack(0, 1, AckType::Accept)], 1)
        .unwrap();
    assert_eq!((p.start_offset(), p.end_offset()), (10, 10));
    assert_eq!(p.acquired_count(), 0);
    assert!(p.state_batches().is_empty());
}

#[test]
fn release_redelivers_with_the_count_raised_and_reject_never_does() {
    let mut p = SharePartition::new(0, LIMITS);
    let a = member("a");
    p.acquire(&a, &log_from(0, 4, 1), 10, AcquireMode::BatchOptimized, 0);
    let types = vec![
        AckType::Release,
        AckType::Reject,
        AckType::Accept,
        AckType::Release,
    ];
    p.acknowledge(
        "a",
        &[AckBatch {
            first_offset: 0,
            last_offset: 3,
            types,
        }],
        1,
    )
    .unwrap();
    assert_eq!(p.next_fetch_offset(), 0);
    let got = p.acquire(&a, &log_from(0, 4, 1), 10, AcquireMode::BatchOptimized, 2);
    assert_eq!(got, vec![run(0, 0, 2), run(3, 3, 2)]);
    assert_eq!(p.record(1), Some((RecordState::Archived, 1)));
    assert_eq!(p.record(2), Some((RecordState::Acknowledged, 1)));
}

#[test]
fn a_member_can_only_acknowledge_what_it_holds() {
    let mut p = SharePartition::new(0, LIMITS);
    let (a, b) = (member("a"), member("b"));
    p.acquire(&a, &[data(0, 1)], 10, AcquireMode::BatchOptimized, 0);
    p.acquire(&b, &[data(2, 3)], 10, AcquireMode::BatchOptimized, 0);
    assert_eq!(
        p.acknowledge("b", &[ack(1, 2, AckType::Accept)], 1),
        Err(AckError::InvalidRecordState)
    );
    // Nothing of a refused request is applied.
    assert_eq!(p.record(2), Some((RecordState::Acquired, 1)));
    assert_eq!(
        p.acknowledge(
            "a",
            &[ack(0, 1, AckType::Accept), ack(2, 2, AckType::Accept)],
            1
        ),
        Err(AckError::InvalidRecordState)
    );
    assert_eq!(p.record(0), Some((RecordState::Acquired, 1)));
    // Twice, or past the window.
    p.acknowledge("a", &[ack(0, 1, AckType::Accept)], 1)
        .unwrap();
    assert_eq!(
        p.acknowledge("a", &[ack(0, 0, AckType::Accept)], 1),
        Err(AckError::InvalidRecordState)
    );
    assert_eq!(
        p.acknowledge("b", &[ack(3, 4, AckType::Accept)], 1),
        Err(AckError::InvalidRecordState)
    );
}

#[test]
fn malformed_acknowledgements_are_invalid_requests() {
    let mut p = SharePartition::new(0, LIMITS);
    let a = member("a");
    p.acquire(&a, &[data(0, 9)], 10, AcquireMode::BatchOptimized, 0);
    let bad = [
        vec![ack(3, 2, AckType::Accept)],
        vec![AckBatch {
            first_offset: 0,
            last_offset: 2,
            types: vec![AckType::Accept, AckType::Accept],
        }],
        vec![AckBatch {
            first_offset: 0,
            last_offset: 2,
            types: vec![],
        }],
        vec![ack(4, 5, AckType::Accept), ack(0, 1, AckType::Accept)],
        vec![ack(0, 5, AckType::Accept), ack(5, 6, AckType::Accept)],
    ];
    for batches in bad {
        assert_eq!(
            p.acknowledge("a", &batches, 1),
            Err(AckError::InvalidRequest),
            "{batches:?}"
        );
    }
    assert_eq!(p.acquired_count(), 10);
}

#[test]
fn an_expired_lock_makes_the_record_available_and_its_late_ack_is_refused() {
    let mut p = SharePartition::new(0, LIMITS);
    let (a, b) = (member("a"), member("b"));
    p.acquire(&a, &[data(0, 1)], 10, AcquireMode::BatchOptimized, 0);
    assert_eq!(p.next_deadline_ms(), Some(1_000));
    assert_eq!(p.expire_locks(999), 0);
    assert_eq!(p.expire_locks(1_000), 2);
    assert_eq!(p.next_deadline_ms(), None);
    assert_eq!(
        p.acknowledge("a", &[ack(0, 1, AckType::Accept)], 1_001),
        Err(AckError::InvalidRecordState)
    );
    let got = p.acquire(&b, &[data(0, 1)], 10, AcquireMode::BatchOptimized, 1_001);
    assert_eq!(got, vec![run(0, 1, 2)]);
}

#[test]
fn renew_restarts_the_lock() {
    let mut p = SharePartition::new(0, LIMITS);
    let a = member("a");
    p.acquire(&a, &[data(0, 1)], 10, AcquireMode::BatchOptimized, 0);
    p.acknowledge("a", &[ack(0, 0, AckType::Renew)], 900)
        .unwrap();
    assert_eq!(p.expire_locks(1_000), 1);
    assert_eq!(p.record(0), Some((RecordState::Acquired, 1)));
    assert_eq!(p.expire_locks(1_900), 1);
    assert_eq!(p.record(0), Some((RecordState::Available, 1)));
}

#[test]
fn the_delivery_limit_archives_a_record() {
    let mut p = SharePartition::new(0, LIMITS);
    let a = member("a");
    for delivery in 1..=3 {
        let got = p.acquire(
            &a,
            &[data(0, 0), data(1, 1)],
            1,
            AcquireMode::RecordLimit,
            0,
        );
        assert_eq!(got, vec![run(0, 0, delivery)]);
        p.acknowledge("a", &[ack(0, 0, AckType::Release)], 0)
            .unwrap();
    }
    // Released on its third delivery: archived, and the SPSO moves past it.
    assert_eq!(p.record(0), None);
    assert_eq!(p.start_offset(), 1);
    // Lock expiry counts the same way.
    for delivery in 1..=3 {
        let got = p.acquire(&a, &[data(1, 1)], 1, AcquireMode::RecordLimit, 0);
        assert_eq!(got, vec![run(1, 1, delivery)]);
        p.expire_locks(i64::MAX);
    }
    assert_eq!(p.start_offset(), 2);
}

#[test]
fn the_window_stops_growing_at_the_lock_limit_but_redelivers_inside_it() {
    let limits = Limits {
        max_in_flight: 10,
        ..LIMITS
    };
    let mut p = SharePartition::new(0, limits);
    let a = member("a");
    let got = p.acquire(&a, &log_from(0, 4, 5), 100, AcquireMode::BatchOptimized, 0);
    // Batches of 4: the third starts at 8 < 10 and is taken whole.
    assert_eq!(got, vec![run(0, 11, 1)]);
    assert!(!p.can_acquire());
    assert!(p
        .acquire(&a, &log_from(12, 4, 2), 100, AcquireMode::BatchOptimized, 0)
        .is_empty());
    p.acknowledge("a", &[ack(5, 5, AckType::Release)], 0)
        .unwrap();
    assert!(p.can_acquire());
    assert_eq!(p.next_fetch_offset(), 5);
    let got = p.acquire(&a, &log_from(5, 4, 3), 100, AcquireMode::BatchOptimized, 0);
    assert_eq!(got, vec![run(5, 5, 2)]);
    // Accepting the head makes room again.
    p.acknowledge("a", &[ack(0, 7, AckType::Accept)], 0)
        .unwrap();
    assert_eq!(p.start_offset(), 8);
    let got = p.acquire(&a, &log_from(12, 4, 3), 100, AcquireMode::BatchOptimized, 0);
    assert_eq!(got, vec![run(12, 19, 1)]);
    assert_eq!((p.start_offset(), p.end_offset()), (8, 20));
}

#[test]
fn control_batches_and_log_gaps_are_never_handed_out() {
    let mut p = SharePartition::new(0, LIMITS);
    let a = member("a");
    let batches = [
        data(0, 1),
        LogBatch {
            first_offset: 2,
            last_offset: 2,
            control: true,
        },
        data(5, 6),
    ];
    let got = p.acquire(&a, &batches, 100, AcquireMode::BatchOptimized, 0);
    assert_eq!(got, vec![run(0, 1, 1), run(5, 6, 1)]);
    assert_eq!(p.record(2), Some((RecordState::Archived, 0)));
    assert_eq!(p.record(3), Some((RecordState::Archived, 0)));
    p.acknowledge("a", &[ack(0, 1, AckType::Accept)], 0)
        .unwrap();
    assert_eq!(p.start_offset(), 5);
    // An empty window jumps a gap of any size.
    p.acknowledge("a", &[ack(5, 6, AckType::Accept)], 0)
        .unwrap();
    let got = p.acquire(
        &a,
        &[data(1_000_000, 1_000_001)],
        100,
        AcquireMode::BatchOptimized,
        0,
    );
    assert_eq!(got, vec![run(1_000_000, 1_000_001, 1)]);
    assert_eq!(p.start_offset(), 1_000_000);
    // A non-empty window does not fill a gap longer than its limit.
    let got = p.acquire(
        &a,
        &[data(2_000_000, 2_000_000)],
        100,
        AcquireMode::BatchOptimized,
        0,
    );
    assert!(got.is_empty());
    assert_eq!(p.end_offset(), 1_000_002);
}

#[test]
fn a_batch_that_starts_below_the_start_offset_is_taken_from_it() {
    let mut p = SharePartition::new(3, LIMITS);
    let a = member("a");
    let got = p.acquire(&a, &[data(0, 5)], 100, AcquireMode::BatchOptimized, 0);
    assert_eq!(got, vec![run(3, 5, 1)]);
}

#[test]
fn a_leaving_member_releases_only_its_records() {
    let mut p = SharePartition::new(0, LIMITS);
    let (a, b) = (member("a"), member("b"));
    p.acquire(&a, &[data(0, 1)], 10, AcquireMode::BatchOptimized, 0);
    p.acquire(&b, &[data(2, 3)], 10, AcquireMode::BatchOptimized, 0);
    assert_eq!(p.release_member("a"), 2);
    assert_eq!(p.next_fetch_offset(), 0);
    assert_eq!(p.record(2), Some((RecordState::Acquired, 1)));
    let got = p.acquire(
        &b,
        &[data(0, 1), data(2, 3), data(4, 4)],
        10,
        AcquireMode::BatchOptimized,
        0,
    );
    assert_eq!(got, vec![run(0, 1, 2), run(4, 4, 1)]);
}

#[test]
fn the_log_start_moving_archives_what_is_available_below_it() {
    let mut p = SharePartition::new(0, LIMITS);
    let a = member("a");
    p.acquire(&a, &[data(0, 5)], 10, AcquireMode::BatchOptimized, 0);
    p.acknowledge("a", &[ack(1, 3, AckType::Release)], 0)
        .unwrap();
    p.move_log_start(3);
    // 0 is still acquired, so the SPSO stays; 1 and 2 are archived, 3 is not.
    assert_eq!(p.start_offset(), 0);
    assert_eq!(p.record(1), Some((RecordState::Archived, 1)));
    assert_eq!(p.record(3), Some((RecordState::Available, 1)));
    p.acknowledge("a", &[ack(0, 0, AckType::Accept)], 0)
        .unwrap();
    assert_eq!(p.start_offset(), 3);
    let mut empty = SharePartition::new(0, LIMITS);
    empty.move_log_start(50);
    assert_eq!((empty.start_offset(), empty.end_offset()), (50, 50));
}

#[test]
fn the_persisted_state_restores_every_count_and_state() {
    let mut p = SharePartition::new(0, LIMITS);
    let a = member("a");
    p.acquire(&a, &[data(0, 9)], 10, AcquireMode::BatchOptimized, 0);
    p.acknowledge(
        "a",
        &[
            ack(1, 2, AckType::Accept),
            ack(3, 3, AckType::Reject),
            ack(4, 5, AckType::Release),
        ],
        0,
    )
    .unwrap();
    p.acquire(&a, &[data(4, 4)], 1, AcquireMode::RecordLimit, 0);
    let batches = p.state_batches();
    assert_eq!(
        batches,
        vec![
            StateBatch {
                first_offset: 0,
                last_offset: 0,
                state: RecordState::Available,
                delivery_count: 1,
            },
            StateBatch {
                first_offset: 1,
                last_offset: 2,
                state: RecordState::Acknowledged,
                delivery_count: 1,
            },
            StateBatch {
                first_offset: 3,
                last_offset: 3,
                state: RecordState::Archived,
                delivery_count: 1,
            },
            StateBatch {
                first_offset: 4,
                last_offset: 4,
                state: RecordState::Available,
                delivery_count: 2,
            },
            StateBatch {
                first_offset: 5,
                last_offset: 9,
                state: RecordState::Available,
                delivery_count: 1,
            },
        ]
    );
    let mut q = SharePartition::restore(p.start_offset(), &batches, LIMITS);
    assert_eq!((q.start_offset(), q.end_offset()), (0, 10));
    assert_eq!(q.acquired_count(), 0);
    for offset in 0..10 {
        let (state, count) = p.record(offset).unwrap();
        let state = if state == RecordState::Acquired {
            RecordState::Available
        } else {
            state
        };
        assert_eq!(q.record(offset), Some((state, count)), "offset {offset}");
    }
    // Redelivery continues the counts; acknowledged records are not redelivered.
    let got = q.acquire(
        &a,
        &[data(0, 9), data(10, 10)],
        100,
        AcquireMode::BatchOptimized,
        0,
    );
    assert_eq!(
        got,
        vec![run(0, 0, 2), run(4, 4, 3), run(5, 9, 2), run(10, 10, 1)]
    );
}

#[test]
fn restore_fills_gaps_as_undelivered_and_skips_what_is_below_the_start() {
    let batches = [
        StateBatch {
            first_offset: 0,
            last_offset: 12,
            state: RecordState::Acknowledged,
            delivery_count: 1,
        },
        StateBatch {
            first_offset: 15,
            last_offset: 15,
            state: RecordState::Acquired,
            delivery_count: 2,
        },
    ];
    let p = SharePartition::restore(10, &batches, LIMITS);
    assert_eq!((p.start_offset(), p.end_offset()), (13, 16));
    assert_eq!(p.record(13), Some((RecordState::Available, 0)));
    assert_eq!(p.record(15), Some((RecordState::Available, 2)));
    assert_eq!(p.next_fetch_offset(), 13);
}

#[test]
fn rejected_and_exhausted_records_are_reported_for_the_dead_letter_queue_once() {
    let dead = |offset, delivery_count, reason| Dead {
        offset,
        delivery_count,
        reason,
    };
    let mut p = SharePartition::new(0, LIMITS);
    let a = member("a");
    p.acquire(&a, &log_from(0, 4, 1), 10, AcquireMode::BatchOptimized, 0);
    // Reject 0; release 1-3 (count 1, under the limit of 3): only 0 is dead.
    p.acknowledge(
        "a",
        &[ack(0, 0, AckType::Reject), ack(1, 3, AckType::Release)],
        0,
    )
    .unwrap();
    assert_eq!(p.take_dead(), vec![dead(0, 1, DeadReason::Rejected)]);
    assert_eq!(p.take_dead(), vec![], "taken once");
    // Second delivery of 1-3: 1 released, 2 expires, 3 is accepted.
    p.acquire(&a, &log_from(1, 4, 1), 10, AcquireMode::BatchOptimized, 0);
    p.acknowledge(
        "a",
        &[ack(1, 1, AckType::Release), ack(3, 3, AckType::Accept)],
        0,
    )
    .unwrap();
    assert_eq!(p.expire_locks(5_000), 1);
    assert_eq!(p.take_dead(), vec![]);
    // Third delivery, the last allowed: a release and an expiry are dead.
    p.acquire(
        &a,
        &log_from(1, 4, 1),
        10,
        AcquireMode::BatchOptimized,
        6_000,
    );
    p.acknowledge("a", &[ack(1, 1, AckType::Release)], 6_000)
        .unwrap();
    assert_eq!(p.expire_locks(20_000), 1);
    assert_eq!(
        p.take_dead(),
        vec![
            dead(1, 3, DeadReason::DeliveryLimit),
            dead(2, 3, DeadReason::DeliveryLimit)
        ]
    );
    // A restored record at the limit dies when it would be acquired again;
    // a GAP acknowledgement is not a dead record.
    let mut p = SharePartition::restore(
        0,
        &[StateBatch {
            first_offset: 0,
            last_offset: 0,
            state: RecordState::Available,
            delivery_count: 3,
        }],
        LIMITS,
    );
    assert_eq!(
        p.acquire(&a, &log_from(0, 2, 1), 10, AcquireMode::BatchOptimized, 0),
        vec![run(1, 1, 1)]
    );
    p.acknowledge("a", &[ack(1, 1, AckType::Gap)], 0).unwrap();
    assert_eq!(p.take_dead(), vec![dead(0, 3, DeadReason::DeliveryLimit)]);
}
