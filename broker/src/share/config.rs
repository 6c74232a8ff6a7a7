//! Share-group settings as Kafka 4.4 defines them: the broker's
//! `group.share.*` keys (defaults, and the bounds a group may choose
//! within), a group's own `share.*` configs on the GROUP config resource,
//! and what a group ends up with.
//!
//! Kafka's validation (`GroupConfig.validate`): each group value must lie
//! within the broker's min and max for it, and a group's heartbeat interval
//! must be below its session timeout.
//!
//! Invariant: parsing and validation only; nothing here reads the metadata
//! image or a file.

use std::collections::BTreeMap;

/// The broker's share-group keys (`GroupCoordinatorConfig`,
/// `ShareGroupConfig`, `ShareCoordinatorConfig`), with Kafka's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareBrokerConfig {
    pub max_size: usize,
    pub session_timeout_ms: Bounded,
    pub heartbeat_interval_ms: Bounded,
    pub record_lock_duration_ms: Bounded,
    pub delivery_count_limit: Bounded,
    pub partition_max_record_locks: Bounded,
    pub max_share_sessions: usize,
    pub snapshot_updates_per_snapshot: u32,
    /// `share.coordinator.cold.partition.snapshot.interval.ms`.
    pub cold_snapshot_interval_ms: i64,
    pub state_topic_partitions: i32,
    pub state_topic_replication_factor: i16,
    pub state_topic_min_isr: i16,
    /// `errors.deadletterqueue.auto.create.topics.enable`: a group's DLQ
    /// topic is created when it does not exist.
    pub dlq_auto_create: bool,
    /// `errors.deadletterqueue.topic.name.prefix`: every DLQ topic's name
    /// must start with it ("" allows any).
    pub dlq_topic_prefix: String,
}

/// A default and the range a group's own value must lie in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounded {
    pub default: i64,
    pub min: i64,
    pub max: i64,
}

const fn bounded(default: i64, min: i64, max: i64) -> Bounded {
    Bounded { default, min, max }
}

impl Default for ShareBrokerConfig {
    fn default() -> Self {
        ShareBrokerConfig {
            max_size: 200,
            session_timeout_ms: bounded(45_000, 45_000, 60_000),
            heartbeat_interval_ms: bounded(5_000, 5_000, 15_000),
            record_lock_duration_ms: bounded(30_000, 15_000, 60_000),
            delivery_count_limit: bounded(5, 2, 10),
            partition_max_record_locks: bounded(2_000, 100, 4_000),
            max_share_sessions: 2_000,
            snapshot_updates_per_snapshot: 500,
            cold_snapshot_interval_ms: 300_000,
            state_topic_partitions: 50,
            state_topic_replication_factor: 3,
            state_topic_min_isr: 2,
            dlq_auto_create: false,
            dlq_topic_prefix: "dlq.".to_string(),
        }
    }
}

impl ShareBrokerConfig {
    /// Sets one broker key; `Ok(false)` if the key is not a share-group
    /// key.
    pub fn set(&mut self, key: &str, value: &str) -> Result<bool, String> {
        let num = |v: &str| -> Result<i64, String> {
            v.trim()
                .parse::<i64>()
                .map_err(|_| format!("{key}: not a number: {v:?}"))
        };
        let slot = match key {
            "group.share.max.size" => {
                self.max_size = positive(key, num(value)?)? as usize;
                return Ok(true);
            }
            "group.share.max.share.sessions" => {
                self.max_share_sessions = positive(key, num(value)?)? as usize;
                return Ok(true);
            }
            "share.coordinator.snapshot.update.records.per.snapshot" => {
                let n = num(value)?;
                if !(0..=500).contains(&n) {
                    return Err(format!("{key} must be between 0 and 500, got {n}"));
                }
                self.snapshot_updates_per_snapshot = n as u32;
                return Ok(true);
            }
            "share.coordinator.cold.partition.snapshot.interval.ms" => {
                self.cold_snapshot_interval_ms = positive(key, num(value)?)?;
                return Ok(true);
            }
            "share.coordinator.state.topic.num.partitions" => {
                self.state_topic_partitions = positive(key, num(value)?)? as i32;
                return Ok(true);
            }
            "share.coordinator.state.topic.replication.factor" => {
                self.state_topic_replication_factor = positive(key, num(value)?)? as i16;
                return Ok(true);
            }
            "errors.deadletterqueue.auto.create.topics.enable" => {
                self.dlq_auto_create = match value.trim().to_ascii_lowercase().as_str() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(format!("{key}: not a boolean: {value:?}")),
                };
                return Ok(true);
            }
            "errors.deadletterqueue.topic.name.prefix" => {
                self.dlq_topic_prefix = value.trim().to_string();
                return Ok(true);
            }
            "share.coordinator.state.topic.min.isr" => {
                self.state_topic_min_isr = positive(key, num(value)?)? as i16;
                return Ok(true);
            }
            "group.share.session.timeout.ms" => &mut self.session_timeout_ms.default,
            "group.share.min.session.timeout.ms" => &mut self.session_timeout_ms.min,
            "group.share.max.session.timeout.ms" => &mut self.session_timeout_ms.max,
            "group.share.heartbeat.interval.ms" => &mut self.heartbeat_interval_ms.default,
            "group.share.min.heartbeat.interval.ms" => &mut self.heartbeat_interval_ms.min,
            "group.share.max.heartbeat.interval.ms" => &mut self.heartbeat_interval_ms.max,
            "group.share.record.lock.duration.ms" => &mut self.record_lock_duration_ms.default,
            "group.share.min.record.lock.duration.ms" => &mut self.record_lock_duration_ms.min,
            "group.share.max.record.lock.duration.ms" => &mut self.record_lock_duration_ms.max,
            "group.share.delivery.count.limit" => &mut self.delivery_count_limit.default,
            "group.share.min.delivery.count.limit" => &mut self.delivery_count_limit.min,
            "group.share.max.delivery.count.limit" => &mut self.delivery_count_limit.max,
            "group.share.partition.max.record.locks" => {
                &mut self.partition_max_record_locks.default
            }
            "group.share.min.partition.max.record.locks" => {
                &mut self.partition_max_record_locks.min
            }
            "group.share.max.partition.max.record.locks" => {
                &mut self.partition_max_record_locks.max
            }
            _ => return Ok(false),
        };
        *slot = positive(key, num(value)?)?;
        Ok(true)
    }

    /// Kafka's checks between the keys (`GroupCoordinatorConfig`,
    /// `ShareGroupConfig`): each default within its bounds, and the
    /// heartbeat interval below the session timeout.
    pub fn validate(&self) -> Result<(), String> {
        for (name, b) in [
            ("group.share.session.timeout.ms", self.session_timeout_ms),
            (
                "group.share.heartbeat.interval.ms",
                self.heartbeat_interval_ms,
            ),
            (
                "group.share.record.lock.duration.ms",
                self.record_lock_duration_ms,
            ),
            (
                "group.share.delivery.count.limit",
                self.delivery_count_limit,
            ),
            (
                "group.share.partition.max.record.locks",
                self.partition_max_record_locks,
            ),
        ] {
            if b.min > b.max {
                return Err(format!(
                    "{name}: the min {} is above the max {}",
                    b.min, b.max
                ));
            }
            if b.default < b.min || b.default > b.max {
                return Err(format!(
                    "{name} {} must be between {} and {}",
                    b.default, b.min, b.max
                ));
            }
        }
        if self.heartbeat_interval_ms.default >= self.session_timeout_ms.default {
            return Err(format!(
                "group.share.heartbeat.interval.ms {} must be less than group.share.session.timeout.ms {}",
                self.heartbeat_interval_ms.default, self.session_timeout_ms.default
            ));
        }
        Ok(())
    }
}

fn positive(key: &str, n: i64) -> Result<i64, String> {
    if n < 1 {
        return Err(format!("{key} must be at least 1, got {n}"));
    }
    Ok(n)
}

/// Where a share group starts on a partition it has never consumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoOffsetReset {
    Latest,
    Earliest,
    /// The first record at most this long ago (`by_duration:<ISO-8601>`).
    ByDuration {
        ms: i64,
    },
}

impl AutoOffsetReset {
    pub fn parse(value: &str) -> Result<Self, String> {
        let v = value.trim().to_ascii_lowercase();
        match v.as_str() {
            "latest" => Ok(AutoOffsetReset::Latest),
            "earliest" => Ok(AutoOffsetReset::Earliest),
            _ => match v.strip_prefix("by_duration:") {
                Some(d) => Ok(AutoOffsetReset::ByDuration {
                    ms: parse_iso_duration_ms(d)?,
                }),
                None => Err(format!(
                    "Invalid value `{value}` for configuration share.auto.offset.reset. The value must be either 'earliest', 'latest' or of the format 'by_duration:<PnDTnHnMn.nS>'."
                )),
            },
        }
    }
}

/// Parses a non-negative ISO-8601 duration as Java's `Duration.parse`
/// reads it (`PnDTnHnMn.nS`, case-insensitive) into milliseconds.
fn parse_iso_duration_ms(s: &str) -> Result<i64, String> {
    let bad = || format!("by_duration: {s:?} is not an ISO-8601 duration such as PT1H30M");
    let rest = s.strip_prefix('p').ok_or_else(bad)?;
    if rest.is_empty() {
        return Err(bad());
    }
    let (days, time) = match rest.split_once('t') {
        Some((d, t)) => {
            if t.is_empty() {
                return Err(bad());
            }
            (d, Some(t))
        }
        None => (rest, None),
    };
    let mut ms: i64 = 0;
    if !days.is_empty() {
        let n = days.strip_suffix('d').ok_or_else(bad)?;
        let n: i64 = n.parse().map_err(|_| bad())?;
        ms = ms
            .checked_add(n.checked_mul(86_400_000).ok_or_else(bad)?)
            .ok_or_else(bad)?;
    }
    if let Some(mut t) = time {
        for (unit, scale) in [('h', 3_600_000i64), ('m', 60_000)] {
            if let Some(i) = t.find(unit) {
                let n: i64 = t[..i].parse().map_err(|_| bad())?;
                ms = ms
                    .checked_add(n.checked_mul(scale).ok_or_else(bad)?)
                    .ok_or_else(bad)?;
                t = &t[i + 1..];
            }
        }
        if !t.is_empty() {
            let secs = t.strip_suffix('s').ok_or_else(bad)?;
            let (whole, frac) = secs.split_once('.').unwrap_or((secs, ""));
            let whole: i64 = whole.parse().map_err(|_| bad())?;
            if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let frac_ms: i64 = format!("{frac:0<3}")[..3].parse().map_err(|_| bad())?;
            ms = ms
                .checked_add(whole.checked_mul(1_000).ok_or_else(bad)?)
                .and_then(|m| m.checked_add(frac_ms))
                .ok_or_else(bad)?;
        }
    }
    if ms < 0 {
        return Err(format!("by_duration: {s:?} is negative"));
    }
    Ok(ms)
}

/// What a share group works with: the broker's defaults, overridden by the
/// group's own configs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareGroupSettings {
    pub session_timeout_ms: i64,
    pub heartbeat_interval_ms: i64,
    pub record_lock_duration_ms: i64,
    pub delivery_count_limit: i64,
    pub partition_max_record_locks: i64,
    pub auto_offset_reset: AutoOffsetReset,
    pub read_committed: bool,
    pub renew_acknowledge_enable: bool,
    /// `errors.deadletterqueue.topic.name` (empty: none).
    pub dlq_topic: Option<String>,
    pub dlq_copy_record: bool,
}

/// The share-group keys a GROUP config resource takes.
pub const GROUP_KEYS: &[&str] = &[
    "share.session.timeout.ms",
    "share.heartbeat.interval.ms",
    "share.record.lock.duration.ms",
    "share.delivery.count.limit",
    "share.partition.max.record.locks",
    "share.auto.offset.reset",
    "share.isolation.level",
    "share.renew.acknowledge.enable",
    "errors.deadletterqueue.topic.name",
    "errors.deadletterqueue.copy.record.enable",
];

impl ShareGroupSettings {
    /// The settings of a group whose own configs are `group` (validated on
    /// the way in, so a value that no longer fits, after the broker's
    /// bounds changed, falls back to the default).
    pub fn resolve(broker: &ShareBrokerConfig, group: &BTreeMap<String, String>) -> Self {
        let mut s = ShareGroupSettings {
            session_timeout_ms: broker.session_timeout_ms.default,
            heartbeat_interval_ms: broker.heartbeat_interval_ms.default,
            record_lock_duration_ms: broker.record_lock_duration_ms.default,
            delivery_count_limit: broker.delivery_count_limit.default,
            partition_max_record_locks: broker.partition_max_record_locks.default,
            auto_offset_reset: AutoOffsetReset::Latest,
            read_committed: false,
            renew_acknowledge_enable: true,
            dlq_topic: None,
            dlq_copy_record: false,
        };
        for (k, v) in group {
            // Keys this module does not know are ignored (consumer.* are the
            // consumer groups').
            let _ = s.set(broker, k, v);
        }
        if s.heartbeat_interval_ms >= s.session_timeout_ms {
            s.heartbeat_interval_ms = broker.heartbeat_interval_ms.default;
            s.session_timeout_ms = broker.session_timeout_ms.default;
        }
        s
    }

    fn set(&mut self, broker: &ShareBrokerConfig, key: &str, value: &str) -> Result<(), String> {
        let within = |b: Bounded| -> Result<i64, String> {
            let n: i64 = value
                .trim()
                .parse()
                .map_err(|_| format!("{key}: not a number: {value:?}"))?;
            if n < b.min || n > b.max {
                return Err(format!(
                    "{key} must be in the range {} to {} inclusive.",
                    b.min, b.max
                ));
            }
            Ok(n)
        };
        let boolean = || match value.trim().to_ascii_lowercase().as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(format!("{key}: not a boolean: {value:?}")),
        };
        match key {
            "share.session.timeout.ms" => {
                self.session_timeout_ms = within(broker.session_timeout_ms)?
            }
            "share.heartbeat.interval.ms" => {
                self.heartbeat_interval_ms = within(broker.heartbeat_interval_ms)?
            }
            "share.record.lock.duration.ms" => {
                self.record_lock_duration_ms = within(broker.record_lock_duration_ms)?
            }
            "share.delivery.count.limit" => {
                self.delivery_count_limit = within(broker.delivery_count_limit)?
            }
            "share.partition.max.record.locks" => {
                self.partition_max_record_locks = within(broker.partition_max_record_locks)?
            }
            "share.auto.offset.reset" => self.auto_offset_reset = AutoOffsetReset::parse(value)?,
            "share.isolation.level" => {
                self.read_committed = match value.trim().to_ascii_lowercase().as_str() {
                    "read_committed" => true,
                    "read_uncommitted" => false,
                    _ => {
                        return Err(format!(
                    "share.isolation.level: {value:?} is not read_committed or read_uncommitted"
                ))
                    }
                }
            }
            "share.renew.acknowledge.enable" => self.renew_acknowledge_enable = boolean()?,
            "errors.deadletterqueue.topic.name" => {
                let name = value.trim();
                self.dlq_topic = (!name.is_empty()).then(|| name.to_string());
            }
            "errors.deadletterqueue.copy.record.enable" => self.dlq_copy_record = boolean()?,
            _ => return Err(format!("{key} is not a share group config")),
        }
        Ok(())
    }

    /// Checks one IncrementalAlterConfigs/AlterConfigs change of a group's
    /// configs: the group's configs as they would be after it (`after`),
    /// each value in range, and the heartbeat interval below the session
    /// timeout. The error is the message an INVALID_CONFIG carries.
    pub fn validate(
        broker: &ShareBrokerConfig,
        after: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        let mut s = ShareGroupSettings::resolve(broker, &BTreeMap::new());
        for (k, v) in after {
            if GROUP_KEYS.contains(&k.as_str()) {
                s.set(broker, k, v)?;
            }
        }
        if s.heartbeat_interval_ms >= s.session_timeout_ms {
            return Err(format!(
                "share.heartbeat.interval.ms {} must be less than share.session.timeout.ms {}",
                s.heartbeat_interval_ms, s.session_timeout_ms
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn kafkas_defaults_and_a_groups_overrides() {
        let broker = ShareBrokerConfig::default();
        broker.validate().unwrap();
        let s = ShareGroupSettings::resolve(&broker, &BTreeMap::new());
        assert_eq!(s.record_lock_duration_ms, 30_000);
        assert_eq!(s.delivery_count_limit, 5);
        assert_eq!(s.partition_max_record_locks, 2_000);
        assert_eq!(s.auto_offset_reset, AutoOffsetReset::Latest);
        let s = ShareGroupSettings::resolve(
            &broker,
            &group(&[
                ("share.record.lock.duration.ms", "15000"),
                ("share.delivery.count.limit", "2"),
                ("share.auto.offset.reset", "earliest"),
                ("share.isolation.level", "read_committed"),
                ("errors.deadletterqueue.topic.name", "dlq"),
                ("consumer.session.timeout.ms", "50000"),
            ]),
        );
        assert_eq!(s.record_lock_duration_ms, 15_000);
        assert_eq!(s.delivery_count_limit, 2);
        assert_eq!(s.auto_offset_reset, AutoOffsetReset::Earliest);
        assert!(s.read_committed);
        assert_eq!(s.dlq_topic.as_deref(), Some("dlq"));
    }

    #[test]
    fn group_values_must_lie_within_the_brokers_bounds() {
        let broker = ShareBrokerConfig::default();
        for (k, v) in [
            ("share.record.lock.duration.ms", "1000"),
            ("share.delivery.count.limit", "11"),
            ("share.partition.max.record.locks", "99"),
            ("share.session.timeout.ms", "x"),
            ("share.isolation.level", "serializable"),
            ("share.auto.offset.reset", "by_duration:1h"),
            ("share.renew.acknowledge.enable", "yes"),
        ] {
            assert!(
                ShareGroupSettings::validate(&broker, &group(&[(k, v)])).is_err(),
                "{k}={v}"
            );
        }
        assert!(ShareGroupSettings::validate(
            &broker,
            &group(&[
                ("share.session.timeout.ms", "45000"),
                ("share.heartbeat.interval.ms", "15000")
            ])
        )
        .is_ok());
        let mut tight = broker.clone();
        tight
            .set("group.share.max.heartbeat.interval.ms", "50000")
            .unwrap();
        assert!(ShareGroupSettings::validate(
            &tight,
            &group(&[("share.heartbeat.interval.ms", "45000")])
        )
        .is_err());
    }

    #[test]
    fn broker_keys_are_set_and_checked_together() {
        let mut b = ShareBrokerConfig::default();
        assert_eq!(b.set("group.share.delivery.count.limit", "7"), Ok(true));
        assert_eq!(b.set("group.consumer.session.timeout.ms", "7"), Ok(false));
        assert!(b.set("group.share.max.size", "0").is_err());
        b.validate().unwrap();
        b.set("group.share.delivery.count.limit", "11").unwrap();
        assert!(b.validate().is_err());
        // The dead-letter queue's broker keys (KIP-1191).
        assert_eq!(
            (b.dlq_auto_create, b.dlq_topic_prefix.as_str()),
            (false, "dlq.")
        );
        assert_eq!(
            b.set("errors.deadletterqueue.auto.create.topics.enable", "TRUE"),
            Ok(true)
        );
        assert_eq!(
            b.set("errors.deadletterqueue.topic.name.prefix", ""),
            Ok(true)
        );
        assert_eq!((b.dlq_auto_create, b.dlq_topic_prefix.as_str()), (true, ""));
        assert!(b
            .set("errors.deadletterqueue.auto.create.topics.enable", "yes")
            .is_err());
    }

    #[test]
    fn by_duration_reads_iso_8601_as_java_does() {
        for (s, ms) in [
            ("by_duration:PT1H", 3_600_000),
            ("by_duration:P1DT2H3M4.5S", 93_784_500),
            ("by_duration:pt0.001s", 1),
            ("BY_DURATION:P2D", 172_800_000),
            ("by_duration:PT90M", 5_400_000),
        ] {
            assert_eq!(
                AutoOffsetReset::parse(s),
                Ok(AutoOffsetReset::ByDuration { ms }),
                "{s}"
            );
        }
        for s in [
            "by_duration:",
            "by_duration:P",
            "by_duration:PT",
            "by_duration:PT-1H",
            "by_duration:1H",
            "by_duration:PT1X",
            "by_duration:P99999999999999999D",
            "latest_offset",
        ] {
            assert!(AutoOffsetReset::parse(s).is_err(), "{s}");
        }
    }
}
