//! The circuit breaker of one push endpoint, as a state machine that takes
//! `now_ms` and never sleeps: the push loop asks it before receiving and
//! tells it each result.
//!
//! Closed: everything goes; `failures` consecutive endpoint failures open
//! it. Open: nothing is sent until the cool-down has passed; then it is
//! half-open and lets one probe through. The probe's success closes it (the
//! cool-down back to its base); its failure opens it again with the
//! cool-down doubled, up to the maximum. Results of requests sent before
//! the breaker opened, or other than the probe while half-open, change
//! nothing: they describe the endpoint as it was.

/// What the `dispatcher_push_breaker_state` gauge shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    HalfOpen,
    Open,
}

impl BreakerState {
    /// The gauge value: 0 closed, 1 half-open, 2 open.
    pub fn gauge(self) -> f64 {
        match self {
            BreakerState::Closed => 0.0,
            BreakerState::HalfOpen => 1.0,
            BreakerState::Open => 2.0,
        }
    }

    /// The `to` label of `dispatcher_push_breaker_transitions_total`.
    pub fn label(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::HalfOpen => "half_open",
            BreakerState::Open => "open",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker (at least 1).
    pub failures: u32,
    pub cooldown_ms: i64,
    pub cooldown_max_ms: i64,
}

/// What the push loop may do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Closed: send as much as the concurrency limit allows.
    Go,
    /// Half-open: send one message, the probe. Report its result with
    /// `probe: true`, or call [`Breaker::probe_unused`] when there was no
    /// message to send.
    Probe,
    /// Send nothing for this long (open, or a probe is out).
    Wait { ms: i64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Closed { failures: u32 },
    Open { until_ms: i64, cooldown_ms: i64 },
    HalfOpen { cooldown_ms: i64, probe_out: bool },
}

/// How long the loop waits while a probe is out before asking again.
pub const PROBE_POLL_MS: i64 = 50;

#[derive(Debug)]
pub struct Breaker {
    config: BreakerConfig,
    state: State,
}

impl Breaker {
    pub fn new(config: BreakerConfig) -> Breaker {
        Breaker {
            config,
            state: State::Closed { failures: 0 },
        }
    }

    pub fn state(&self) -> BreakerState {
        match self.state {
            State::Closed { .. } => BreakerState::Closed,
            State::Open { .. } => BreakerState::Open,
            State::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// May the loop send now? An open breaker whose cool-down has passed
    /// turns half-open here and hands out its probe (the transition is
    /// returned for the metrics).
    pub fn admit(&mut self, now_ms: i64) -> (Admit, Option<BreakerState>) {
        match self.state {
            State::Closed { .. } => (Admit::Go, None),
            State::Open {
                until_ms,
                cooldown_ms,
            } => {
                if now_ms < until_ms {
                    return (
                        Admit::Wait {
                            ms: until_ms - now_ms,
                        },
                        None,
                    );
                }
                self.state = State::HalfOpen {
                    cooldown_ms,
                    probe_out: true,
                };
                (Admit::Probe, Some(BreakerState::HalfOpen))
            }
            State::HalfOpen {
                cooldown_ms,
                probe_out,
            } => {
                if probe_out {
                    return (Admit::Wait { ms: PROBE_POLL_MS }, None);
                }
                self.state = State::HalfOpen {
                    cooldown_ms,
                    probe_out: true,
                };
                (Admit::Probe, None)
            }
        }
    }

    /// The probe handed out was not used (nothing to send): the next
    /// `admit` hands it out again.
    pub fn probe_unused(&mut self) {
        if let State::HalfOpen { cooldown_ms, .. } = self.state {
            self.state = State::HalfOpen {
                cooldown_ms,
                probe_out: false,
            };
        }
    }

    /// How long it stays open, when it is open: messages received before it
    /// opened are given back for at least this long instead of being sent.
    pub fn open_for_ms(&self, now_ms: i64) -> Option<i64> {
        match self.state {
            State::Open { until_ms, .. } => Some((until_ms - now_ms).max(0)),
            State::Closed { .. } | State::HalfOpen { .. } => None,
        }
    }

    /// One request's result: `failed` when the endpoint failed (a retryable
    /// answer, a timeout or no connection), `probe` when it was the
    /// half-open probe. Returns the new state when it changed.
    pub fn record(&mut self, probe: bool, failed: bool, now_ms: i64) -> Option<BreakerState> {
        match self.state {
            State::Closed { failures } => {
                if !failed {
                    self.state = State::Closed { failures: 0 };
                    return None;
                }
                let failures = failures + 1;
                if failures < self.config.failures {
                    self.state = State::Closed { failures };
                    return None;
                }
                self.open(self.config.cooldown_ms, now_ms)
            }
            State::HalfOpen { cooldown_ms, .. } if probe => {
                if failed {
                    let longer = cooldown_ms
                        .saturating_mul(2)
                        .min(self.config.cooldown_max_ms);
                    self.open(longer, now_ms)
                } else {
                    self.state = State::Closed { failures: 0 };
                    Some(BreakerState::Closed)
                }
            }
            State::HalfOpen { .. } | State::Open { .. } => None,
        }
    }

    fn open(&mut self, cooldown_ms: i64, now_ms: i64) -> Option<BreakerState> {
        self.state = State::Open {
            until_ms: now_ms + cooldown_ms,
            cooldown_ms,
        };
        Some(BreakerState::Open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: BreakerConfig = BreakerConfig {
        failures: 3,
        cooldown_ms: 1000,
        cooldown_max_ms: 3000,
    };

    #[test]
    fn consecutive_failures_open_it_and_a_success_resets_the_count() {
        let mut b = Breaker::new(CONFIG);
        assert_eq!(b.admit(0), (Admit::Go, None));
        assert_eq!(b.record(false, true, 0), None);
        assert_eq!(b.record(false, true, 0), None);
        assert_eq!(b.record(false, false, 0), None, "a success in between");
        assert_eq!(b.record(false, true, 0), None);
        assert_eq!(b.record(false, true, 0), None);
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.record(false, true, 10), Some(BreakerState::Open));
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.open_for_ms(10), Some(1000));
        assert_eq!(b.admit(500), (Admit::Wait { ms: 510 }, None));
        // Results of requests sent before it opened change nothing.
        assert_eq!(b.record(false, false, 600), None);
        assert_eq!(b.record(false, true, 600), None);
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn after_the_cooldown_one_probe_goes_and_its_success_closes_it() {
        let mut b = Breaker::new(BreakerConfig {
            failures: 1,
            ..CONFIG
        });
        assert_eq!(b.record(false, true, 0), Some(BreakerState::Open));
        assert_eq!(b.admit(1000), (Admit::Probe, Some(BreakerState::HalfOpen)));
        assert_eq!(b.open_for_ms(1000), None);
        // One probe at a time.
        assert_eq!(b.admit(1001), (Admit::Wait { ms: PROBE_POLL_MS }, None));
        // Not the probe: ignored.
        assert_eq!(b.record(false, true, 1002), None);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert_eq!(b.record(true, false, 1100), Some(BreakerState::Closed));
        assert_eq!(b.admit(1100), (Admit::Go, None));
    }

    #[test]
    fn a_failed_probe_reopens_it_for_twice_as_long_up_to_the_maximum() {
        let mut b = Breaker::new(BreakerConfig {
            failures: 1,
            ..CONFIG
        });
        b.record(false, true, 0);
        let mut now = 0;
        for expected in [2000, 3000, 3000] {
            now += b.open_for_ms(now).unwrap();
            assert_eq!(b.admit(now).0, Admit::Probe);
            assert_eq!(b.record(true, true, now), Some(BreakerState::Open));
            assert_eq!(b.open_for_ms(now), Some(expected));
        }
        now += 3000;
        assert_eq!(b.admit(now).0, Admit::Probe);
        assert_eq!(b.record(true, false, now), Some(BreakerState::Closed));
        // Closed again: the next opening starts from the base cool-down.
        assert_eq!(b.record(false, true, now), Some(BreakerState::Open));
        assert_eq!(b.open_for_ms(now), Some(1000));
    }

    #[test]
    fn an_unused_probe_is_handed_out_again() {
        let mut b = Breaker::new(BreakerConfig {
            failures: 1,
            ..CONFIG
        });
        b.record(false, true, 0);
        assert_eq!(b.admit(1000).0, Admit::Probe);
        b.probe_unused();
        assert_eq!(b.admit(1500), (Admit::Probe, None));
        assert_eq!(b.state(), BreakerState::HalfOpen);
    }

    #[test]
    fn gauge_values_and_labels() {
        assert_eq!(BreakerState::Closed.gauge(), 0.0);
        assert_eq!(BreakerState::HalfOpen.gauge(), 1.0);
        assert_eq!(BreakerState::Open.gauge(), 2.0);
        assert_eq!(BreakerState::HalfOpen.label(), "half_open");
    }
}
