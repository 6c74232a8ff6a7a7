//! Test-only pauses at the broker's slow disk steps (cargo feature
//! `test-hooks`, on in the crate's own tests and its integration tests).
//!
//! A test holds one step for one partition; a thread that reaches that step
//! for that partition waits there until the test releases it. That is
//! how tests show that a slow disk stalls only what has to wait for it.
//! Without the feature `pause` compiles to nothing.

/// A disk step a test can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Opening (and recovering) a partition's log while applying an image.
    PartitionOpen,
    /// Maintenance's disk writes: the high-watermark checkpoint, the
    /// producer snapshot, a time-based flush.
    MaintenanceWrite,
    /// The group coordinator's append to a `__consumer_offsets` partition.
    OffsetsAppend,
}

#[cfg(any(test, feature = "test-hooks"))]
pub use imp::{hold, Held};

#[cfg(any(test, feature = "test-hooks"))]
pub(crate) use imp::pause;

/// Waits while a test holds `step` for the partition (only with `test-hooks`).
#[cfg(not(any(test, feature = "test-hooks")))]
#[inline(always)]
pub(crate) fn pause(_topic: &str, _partition: i32, _step: Step) {}

#[cfg(any(test, feature = "test-hooks"))]
mod imp {
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;

    use super::Step;

    struct Gate {
        released: Mutex<Released>,
        wake: Condvar,
        /// How many threads have reached the step.
        entered: tokio::sync::watch::Sender<usize>,
    }

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Released {
        No,
        ByTest,
        ByWatchdog,
    }

    impl Gate {
        fn release(&self, by: Released) {
            let mut r = self.released.lock().expect("poisoned");
            if *r == Released::No {
                *r = by;
            }
            self.wake.notify_all();
        }
    }

    type Key = (String, i32, Step);

    static HOLDS: Mutex<Vec<(Key, Arc<Gate>)>> = Mutex::new(Vec::new());

    /// A held step; dropping it releases every thread waiting there.
    pub struct Held {
        gate: Arc<Gate>,
    }

    /// Holds `step` for partition `partition` of `topic` until the returned
    /// guard is dropped, or until `cap` has passed: a watchdog thread then
    /// releases it, so a test whose requests cannot run while the step is
    /// held ends instead of hanging, and `released_by_watchdog` says so.
    pub fn hold(topic: &str, partition: i32, step: Step, cap: Duration) -> Held {
        let gate = Arc::new(Gate {
            released: Mutex::new(Released::No),
            wake: Condvar::new(),
            entered: tokio::sync::watch::channel(0).0,
        });
        HOLDS
            .lock()
            .expect("poisoned")
            .push(((topic.to_string(), partition, step), gate.clone()));
        let watchdog = gate.clone();
        std::thread::spawn(move || {
            let r = watchdog.released.lock().expect("poisoned");
            let (r, _) = watchdog
                .wake
                .wait_timeout_while(r, cap, |r| *r == Released::No)
                .expect("poisoned");
            drop(r);
            watchdog.release(Released::ByWatchdog);
        });
        Held { gate }
    }

    impl Held {
        /// Waits until a thread has reached the held step.
        pub async fn entered(&self) {
            let mut rx = self.gate.entered.subscribe();
            rx.wait_for(|n| *n > 0).await.expect("sender kept");
        }

        /// Whether the watchdog, not the test, released the step: the test's
        /// requests could not finish while it was held.
        pub fn released_by_watchdog(&self) -> bool {
            *self.gate.released.lock().expect("poisoned") == Released::ByWatchdog
        }

        /// Releases the step and reports whether the watchdog had already.
        pub fn release(self) -> bool {
            self.gate.release(Released::ByTest);
            self.released_by_watchdog()
        }
    }

    impl Drop for Held {
        fn drop(&mut self) {
            self.gate.release(Released::ByTest);
            HOLDS
                .lock()
                .expect("poisoned")
                .retain(|(_, g)| !Arc::ptr_eq(g, &self.gate));
        }
    }

    /// Waits while a test holds `step` for the partition.
    pub(crate) fn pause(topic: &str, partition: i32, step: Step) {
        let gate = HOLDS
            .lock()
            .expect("poisoned")
            .iter()
            .find(|((t, p, s), _)| t == topic && *p == partition && *s == step)
            .map(|(_, g)| g.clone());
        let Some(gate) = gate else { return };
        gate.entered.send_modify(|n| *n += 1);
        let r = gate.released.lock().expect("poisoned");
        let _r = gate
            .wake
            .wait_while(r, |r| *r == Released::No)
            .expect("poisoned");
    }
}
