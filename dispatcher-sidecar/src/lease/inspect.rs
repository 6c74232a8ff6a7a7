//! What the engine knows about one offset, for tracing a message (issue 8):
//! a read-only view, no event, no counter.

use super::{Attempt, ConsumerSlot, PartitionLeases, Route};

/// The engine's view of one offset of its partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffsetState {
    /// Below the commit point: acked, routed, or known absent.
    BelowCommit { committed: i64 },
    /// Acked above the commit point (the commit point waits for an offset
    /// below it).
    AckedAboveCommit { committed: i64 },
    InFlight {
        consumer: ConsumerSlot,
        attempt: Attempt,
        expiry_ms: i64,
    },
    /// Failed; its copy to `route` is not confirmed written yet.
    PendingRoute { attempt: Attempt, route: Route },
    /// At or above the commit point and none of the above: waiting to be
    /// leased (or not fetched yet).
    NotDone { committed: i64 },
}

impl PartitionLeases {
    pub fn offset_state(&self, offset: i64) -> OffsetState {
        let committed = self.committed;
        if offset < committed {
            return OffsetState::BelowCommit { committed };
        }
        if let Some(lease) = self.in_flight.get(&offset) {
            return OffsetState::InFlight {
                consumer: lease.consumer,
                attempt: lease.attempt,
                expiry_ms: lease.expiry_ms,
            };
        }
        if let Some(f) = self.pending.get(&offset) {
            return OffsetState::PendingRoute {
                attempt: f.attempt,
                route: f.route,
            };
        }
        if self.acked.contains(offset) {
            return OffsetState::AckedAboveCommit { committed };
        }
        OffsetState::NotDone { committed }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{Available, LeaseConfig, QueuePartition};

    #[test]
    fn every_state_of_an_offset_is_told() {
        let qp = QueuePartition {
            topic: 0,
            partition: 0,
        };
        let mut e = PartitionLeases::new(qp, LeaseConfig::default(), 10).unwrap();
        assert_eq!(
            e.offset_state(9),
            OffsetState::BelowCommit { committed: 10 }
        );
        assert_eq!(e.offset_state(10), OffsetState::NotDone { committed: 10 });
        let grants = e.lease(
            (10..13).map(Available::first),
            3,
            ConsumerSlot(4),
            1_000,
            5_000,
        );
        assert_eq!(
            e.offset_state(11),
            OffsetState::InFlight {
                consumer: ConsumerSlot(4),
                attempt: Attempt::FIRST,
                expiry_ms: 6_000
            }
        );
        e.ack(&grants[1].receipt).unwrap();
        assert_eq!(
            e.offset_state(11),
            OffsetState::AckedAboveCommit { committed: 10 }
        );
        e.nack(&grants[2].receipt, None, "boom", false, 5_500)
            .unwrap();
        assert!(matches!(
            e.offset_state(12),
            OffsetState::PendingRoute {
                attempt: Attempt(1),
                route: Route::RetryTier { tier: 0, .. }
            }
        ));
        e.ack(&grants[0].receipt).unwrap();
        assert_eq!(
            e.offset_state(11),
            OffsetState::BelowCommit { committed: 12 }
        );
    }
}
