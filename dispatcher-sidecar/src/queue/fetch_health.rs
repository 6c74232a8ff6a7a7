//! Whether an owned partition's records can be read.
//!
//! librdkafka reports a batch it cannot decode (a codec it was built
//! without, data that does not decompress, a batch that inflates past
//! `receive.message.max.bytes`) as an error on the partition, again on
//! every fetch of it, and hands out neither that batch nor anything after
//! it: the partition is stuck. [`FetchHealth`] keeps the current run of
//! errors so the stats (`GET /queues/{q}`) and the metrics name the
//! partition, the offset and the error, rather than only a log line.
//! Pure: it takes `now_ms`.

/// A partition counts as stuck while its last fetch error is at most this
/// old and no record came since. librdkafka retries a failed fetch every
/// `fetch.error.backoff.ms` (500 ms by default), so a batch that cannot be
/// read keeps the error this recent.
pub const STUCK_WINDOW_MS: i64 = 10_000;

/// A run of fetch errors at one offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchFailure {
    /// The latest error, as librdkafka words it.
    pub error: String,
    /// The next offset the dispatcher expects from the partition: the
    /// record it cannot read is at or after it (after it when offsets in
    /// between hold no record, e.g. a transaction marker).
    pub offset: i64,
    /// The first error of the run.
    pub since_ms: i64,
    /// The latest error of the run.
    pub last_ms: i64,
    /// Errors in the run.
    pub errors: u64,
}

/// The fetch errors of one partition (see the module doc).
#[derive(Debug, Default)]
pub struct FetchHealth {
    failure: Option<FetchFailure>,
}

impl FetchHealth {
    /// A fetch failed with `error` while the partition's next offset is
    /// `offset`. Returns true when this starts a run (an error not at the
    /// same offset as a run still stuck), which is worth a log line; the
    /// errors after it are not.
    pub fn failed(&mut self, error: String, offset: i64, now_ms: i64) -> bool {
        if let Some(run) = &mut self.failure {
            if run.offset == offset && now_ms - run.last_ms <= STUCK_WINDOW_MS {
                run.error = error;
                run.last_ms = now_ms;
                run.errors += 1;
                return false;
            }
        }
        self.failure = Some(FetchFailure {
            error,
            offset,
            since_ms: now_ms,
            last_ms: now_ms,
            errors: 1,
        });
        true
    }

    /// Records came: the run of errors, if any, is over. Returns it.
    pub fn fetched(&mut self) -> Option<FetchFailure> {
        self.failure.take()
    }

    /// The run of errors while the partition is stuck.
    pub fn stuck(&self, now_ms: i64) -> Option<&FetchFailure> {
        self.failure
            .as_ref()
            .filter(|run| now_ms - run.last_ms <= STUCK_WINDOW_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_errors_at_one_offset_are_one_run() {
        let mut h = FetchHealth::default();
        assert!(h.stuck(0).is_none());
        assert!(h.failed("bad compression".into(), 7, 1_000));
        assert!(!h.failed("bad compression again".into(), 7, 1_500));
        assert!(!h.failed("bad compression again".into(), 7, 2_000));
        let run = h.stuck(2_100).unwrap();
        assert_eq!(
            run,
            &FetchFailure {
                error: "bad compression again".into(),
                offset: 7,
                since_ms: 1_000,
                last_ms: 2_000,
                errors: 3,
            }
        );
    }

    #[test]
    fn a_run_ends_when_records_come_or_errors_stop() {
        let mut h = FetchHealth::default();
        h.failed("e".into(), 7, 1_000);
        assert!(h.stuck(1_000 + STUCK_WINDOW_MS).is_some());
        assert!(h.stuck(1_001 + STUCK_WINDOW_MS).is_none(), "errors stopped");
        assert_eq!(h.fetched().map(|r| r.offset), Some(7));
        assert!(h.fetched().is_none());
        assert!(h.stuck(1_000).is_none(), "records came");
    }

    #[test]
    fn an_error_at_another_offset_or_after_a_pause_starts_a_new_run() {
        let mut h = FetchHealth::default();
        assert!(h.failed("e".into(), 7, 1_000));
        assert!(h.failed("e".into(), 9, 1_100), "another offset");
        assert!(
            h.failed("e".into(), 9, 1_101 + STUCK_WINDOW_MS),
            "after the window"
        );
        let run = h.stuck(1_101 + STUCK_WINDOW_MS).unwrap();
        assert_eq!((run.errors, run.since_ms), (1, 1_101 + STUCK_WINDOW_MS));
    }
}
