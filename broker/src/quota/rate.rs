//! A rate over sampled windows, as Kafka's `Rate` over a `SampledStat`:
//! `quota.window.num` samples of `quota.window.size.seconds` each. Pure:
//! every call takes `now_ms`.

/// How a rate is sampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateConfig {
    /// `quota.window.num` (Kafka: 11).
    pub samples: usize,
    /// `quota.window.size.seconds` in milliseconds (Kafka: 1000).
    pub window_ms: u64,
}

impl RateConfig {
    pub fn from_config(config: &crate::config::ServerConfig) -> Self {
        Self {
            samples: config.quota_window_num.max(1),
            window_ms: config.quota_window_size_seconds.max(1) * 1000,
        }
    }
}

impl Default for RateConfig {
    fn default() -> Self {
        Self {
            samples: 11,
            window_ms: 1000,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    start_ms: u64,
    value: f64,
}

/// The samples of one measured quantity (bytes, request time, partitions,
/// connections).
#[derive(Clone, Debug)]
pub struct SampledRate {
    samples: Vec<Sample>,
    current: usize,
}

impl SampledRate {
    pub fn new(now_ms: u64) -> Self {
        Self {
            samples: vec![Sample {
                start_ms: now_ms,
                value: 0.0,
            }],
            current: 0,
        }
    }

    /// Adds `value` to the current sample, starting a new sample when the
    /// current one has lasted its window (Kafka's `SampledStat.record`).
    pub fn record(&mut self, config: RateConfig, value: f64, now_ms: u64) {
        let cur = self.samples[self.current];
        if now_ms.saturating_sub(cur.start_ms) >= config.window_ms {
            self.current = (self.current + 1) % config.samples.max(1);
            let fresh = Sample {
                start_ms: now_ms,
                value: 0.0,
            };
            if self.current >= self.samples.len() {
                self.samples.push(fresh);
            } else {
                self.samples[self.current] = fresh;
            }
        }
        self.samples[self.current].value += value;
    }

    /// Resets samples older than the whole window, as Kafka's
    /// `purgeObsoleteSamples`.
    fn purge(&mut self, config: RateConfig, now_ms: u64) {
        let expire_ms = config.samples as u64 * config.window_ms;
        for s in &mut self.samples {
            if now_ms.saturating_sub(s.start_ms) >= expire_ms {
                *s = Sample {
                    start_ms: now_ms,
                    value: 0.0,
                };
            }
        }
    }

    /// The span the rate is measured over: from the oldest sample's start,
    /// but never less than `samples - 1` full windows (Kafka's
    /// `Rate.windowSize`), so a new client is not judged on a few
    /// milliseconds.
    pub fn window_size_ms(&mut self, config: RateConfig, now_ms: u64) -> u64 {
        self.purge(config, now_ms);
        let oldest = self
            .samples
            .iter()
            .map(|s| s.start_ms)
            .min()
            .unwrap_or(now_ms);
        let mut elapsed = now_ms.saturating_sub(oldest);
        let full = elapsed / config.window_ms.max(1);
        let min_full = config.samples.saturating_sub(1) as u64;
        if full < min_full {
            elapsed += (min_full - full) * config.window_ms;
        }
        elapsed
    }

    /// Units per second over the sampled window.
    pub fn rate(&mut self, config: RateConfig, now_ms: u64) -> f64 {
        let window_ms = self.window_size_ms(config, now_ms);
        let total: f64 = self.samples.iter().map(|s| s.value).sum();
        if window_ms == 0 {
            return 0.0;
        }
        total * 1000.0 / window_ms as f64
    }

    /// Records `value`, then returns how long the client must wait for its
    /// rate to come back to `quota`: with O the observed rate and T the
    /// quota over a window W, X = (O - T) / T * W, so that O * W / (W + X) = T
    /// (Kafka's `ClientQuotaManager.throttleTime`). 0 within the quota.
    pub fn record_and_throttle_ms(
        &mut self,
        config: RateConfig,
        value: f64,
        quota: f64,
        now_ms: u64,
    ) -> u64 {
        self.record(config, value, now_ms);
        self.throttle_ms(config, quota, now_ms)
    }

    /// How long the client must wait for its rate to come back to `quota`
    /// (0 within it), recording nothing.
    pub fn throttle_ms(&mut self, config: RateConfig, quota: f64, now_ms: u64) -> u64 {
        let observed = self.rate(config, now_ms);
        if observed <= quota {
            return 0;
        }
        let window_ms = self.window_size_ms(config, now_ms) as f64;
        if quota <= 0.0 {
            return window_ms as u64;
        }
        ((observed - quota) / quota * window_ms).round() as u64
    }

    /// When the last value was recorded (the newest sample's start), for
    /// dropping idle sensors.
    pub fn last_sample_ms(&self) -> u64 {
        self.samples[self.current].start_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: RateConfig = RateConfig {
        samples: 11,
        window_ms: 1000,
    };

    #[test]
    fn a_new_rate_is_measured_over_at_least_ten_windows() {
        let mut r = SampledRate::new(0);
        r.record(CONFIG, 10_000.0, 0);
        // 10,000 units in the first millisecond: 1,000/s over 10 s, not
        // 10,000,000/s.
        assert_eq!(r.window_size_ms(CONFIG, 1), 10_001);
        assert!((r.rate(CONFIG, 0) - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn old_samples_fall_out_of_the_window() {
        let mut r = SampledRate::new(0);
        r.record(CONFIG, 5000.0, 0);
        for t in 1..=20u64 {
            r.record(CONFIG, 0.0, t * 1000);
        }
        assert_eq!(r.rate(CONFIG, 20_000), 0.0);
    }

    #[test]
    fn throttle_time_is_kafkas_formula() {
        let mut r = SampledRate::new(0);
        // 20,000 over a 10 s window is 2,000/s; quota 1,000/s: wait (2000 -
        // 1000) / 1000 * 10 s.
        assert_eq!(
            r.record_and_throttle_ms(CONFIG, 20_000.0, 1000.0, 0),
            10_000
        );
        let mut r = SampledRate::new(0);
        assert_eq!(r.record_and_throttle_ms(CONFIG, 5_000.0, 1000.0, 0), 0);
    }

    /// A client that sends as fast as it is let through, waiting out each
    /// throttle, ends up at its quota.
    #[test]
    fn a_client_that_waits_out_its_throttles_converges_on_the_quota() {
        let quota = 1000.0;
        let mut r = SampledRate::new(0);
        let mut now = 0u64;
        let mut sent = 0.0;
        // 10x the quota when not throttled: 1,000 units every 100 ms.
        while now < 120_000 {
            let throttle = r.record_and_throttle_ms(CONFIG, 1000.0, quota, now);
            if now >= 20_000 {
                sent += 1000.0;
            }
            now += 100 + throttle;
        }
        let achieved = sent / ((now - 20_000) as f64 / 1000.0);
        assert!(
            (achieved - quota).abs() / quota < 0.1,
            "achieved {achieved}/s against a quota of {quota}/s"
        );
    }
}
