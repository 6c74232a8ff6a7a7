//! Group configs (Kafka's `GroupConfig`, KIP-848 and KIP-932): settings one
//! group overrides on the GROUP config resource (IncrementalAlterConfigs,
//! `kafka-configs.sh --entity-type groups`). They are stored in the metadata
//! quorum by group id, whether or not the group exists yet, as in Kafka.
//!
//! KIP-848 consumer groups use `consumer.session.timeout.ms` and
//! `consumer.heartbeat.interval.ms`. The `share.*` and
//! `errors.deadletterqueue.*` keys are validated and stored for share
//! groups (see `crate::share::config`), which this broker does not serve
//! yet. Kafka's other group keys (assignment intervals, offloading, streams
//! groups) are refused as unknown: nothing here would honour them.
//!
//! Invariant: validation and lookup only.

use std::collections::BTreeMap;

use super::ServerConfig;
use crate::share::config::{ShareGroupSettings, GROUP_KEYS as SHARE_KEYS};

const CONSUMER_SESSION_TIMEOUT: &str = "consumer.session.timeout.ms";
const CONSUMER_HEARTBEAT_INTERVAL: &str = "consumer.heartbeat.interval.ms";

/// Every group config key this broker takes, in the order DescribeConfigs
/// lists them.
pub fn keys() -> impl Iterator<Item = &'static str> {
    [CONSUMER_SESSION_TIMEOUT, CONSUMER_HEARTBEAT_INTERVAL]
        .into_iter()
        .chain(SHARE_KEYS.iter().copied())
}

/// A group's configs as they would be after a change: every key known,
/// every value in the range the broker allows, and each heartbeat interval
/// below its session timeout. The error is INVALID_CONFIG's message.
pub fn validate(config: &ServerConfig, after: &BTreeMap<String, String>) -> Result<(), String> {
    for k in after.keys() {
        if !keys().any(|known| known == k) {
            return Err(format!("Unknown group config name: {k}"));
        }
    }
    let number = |key: &str, default: i32, min: i32, max: i32| -> Result<i32, String> {
        let Some(v) = after.get(key) else {
            return Ok(default);
        };
        let n: i32 = v.trim().parse().map_err(|_| {
            format!("Invalid value {v} for configuration {key}: Not a number of type INT")
        })?;
        if n < min || n > max {
            return Err(format!(
                "{key} must be in the range {min} to {max} inclusive."
            ));
        }
        Ok(n)
    };
    let session = number(
        CONSUMER_SESSION_TIMEOUT,
        config.group_consumer_session_timeout_ms,
        config.group_consumer_min_session_timeout_ms,
        config.group_consumer_max_session_timeout_ms,
    )?;
    let heartbeat = number(
        CONSUMER_HEARTBEAT_INTERVAL,
        config.group_consumer_heartbeat_interval_ms,
        config.group_consumer_min_heartbeat_interval_ms,
        config.group_consumer_max_heartbeat_interval_ms,
    )?;
    if heartbeat >= session {
        return Err(format!(
            "{CONSUMER_HEARTBEAT_INTERVAL} {heartbeat} must be less than {CONSUMER_SESSION_TIMEOUT} {session}"
        ));
    }
    ShareGroupSettings::validate(&config.share, after)
}

/// Every group config key with the value the group has: its own, or the
/// broker's default. `true` marks the group's own.
pub fn effective(
    config: &ServerConfig,
    own: Option<&BTreeMap<String, String>>,
) -> Vec<(&'static str, String, bool)> {
    let empty = BTreeMap::new();
    let own = own.unwrap_or(&empty);
    let share = ShareGroupSettings::resolve(&config.share, &BTreeMap::new());
    keys()
        .map(|k| {
            if let Some(v) = own.get(k) {
                return (k, v.clone(), true);
            }
            let default = match k {
                CONSUMER_SESSION_TIMEOUT => config.group_consumer_session_timeout_ms.to_string(),
                CONSUMER_HEARTBEAT_INTERVAL => {
                    config.group_consumer_heartbeat_interval_ms.to_string()
                }
                "share.session.timeout.ms" => share.session_timeout_ms.to_string(),
                "share.heartbeat.interval.ms" => share.heartbeat_interval_ms.to_string(),
                "share.record.lock.duration.ms" => share.record_lock_duration_ms.to_string(),
                "share.delivery.count.limit" => share.delivery_count_limit.to_string(),
                "share.partition.max.record.locks" => share.partition_max_record_locks.to_string(),
                "share.auto.offset.reset" => "latest".to_string(),
                "share.isolation.level" => "read_uncommitted".to_string(),
                "share.renew.acknowledge.enable" => "true".to_string(),
                "errors.deadletterqueue.topic.name" => String::new(),
                "errors.deadletterqueue.copy.record.enable" => "false".to_string(),
                _ => String::new(),
            };
            (k, default, false)
        })
        .collect()
}

/// The KIP-848 settings of one group: the broker's, with the group's own
/// session timeout and heartbeat interval (validated when they were set).
pub fn consumer_overrides(
    base: &crate::group::consumer::ConsumerGroupConfig,
    own: Option<&BTreeMap<String, String>>,
) -> Option<crate::group::consumer::ConsumerGroupConfig> {
    let own = own?;
    let get = |k: &str| own.get(k).and_then(|v| v.trim().parse::<i32>().ok());
    let session = get(CONSUMER_SESSION_TIMEOUT);
    let heartbeat = get(CONSUMER_HEARTBEAT_INTERVAL);
    if session.is_none() && heartbeat.is_none() {
        return None;
    }
    let mut c = base.clone();
    c.session_timeout_ms = session.unwrap_or(c.session_timeout_ms);
    c.heartbeat_interval_ms = heartbeat.unwrap_or(c.heartbeat_interval_ms);
    // A broker default changed since may make the pair inconsistent; the
    // broker's own pair is known to be valid.
    if c.heartbeat_interval_ms >= c.session_timeout_ms {
        return None;
    }
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn known_keys_in_range_are_accepted() {
        let c = ServerConfig::default();
        validate(
            &c,
            &own(&[
                ("consumer.session.timeout.ms", "50000"),
                ("consumer.heartbeat.interval.ms", "6000"),
                ("share.auto.offset.reset", "earliest"),
                ("share.record.lock.duration.ms", "15000"),
            ]),
        )
        .unwrap();
    }

    #[test]
    fn unknown_keys_out_of_range_values_and_bad_pairs_are_refused() {
        let c = ServerConfig::default();
        for pairs in [
            vec![("consumer.assignment.interval.ms", "1000")],
            vec![("retention.ms", "1")],
            vec![("consumer.session.timeout.ms", "1000")],
            vec![("consumer.session.timeout.ms", "abc")],
            vec![("consumer.heartbeat.interval.ms", "16000")],
            vec![("share.delivery.count.limit", "1")],
            vec![
                ("share.session.timeout.ms", "45000"),
                ("share.heartbeat.interval.ms", "15000"),
                ("consumer.session.timeout.ms", "45000"),
                ("consumer.heartbeat.interval.ms", "45000"),
            ],
        ] {
            assert!(validate(&c, &own(&pairs)).is_err(), "{pairs:?}");
        }
        let msg = validate(&c, &own(&[("nope", "1")])).unwrap_err();
        assert_eq!(msg, "Unknown group config name: nope");
    }

    #[test]
    fn effective_values_mark_the_groups_own() {
        let c = ServerConfig::default();
        let values = effective(&c, Some(&own(&[("share.auto.offset.reset", "earliest")])));
        assert_eq!(values.len(), keys().count());
        assert!(values.contains(&("share.auto.offset.reset", "earliest".into(), true)));
        assert!(values.contains(&("consumer.session.timeout.ms", "45000".into(), false)));
        assert!(values.contains(&("share.record.lock.duration.ms", "30000".into(), false)));
    }

    #[test]
    fn a_consumer_groups_overrides_apply_to_its_timing() {
        let base = crate::group::consumer::ConsumerGroupConfig::default();
        assert!(consumer_overrides(&base, None).is_none());
        assert!(consumer_overrides(
            &base,
            Some(&own(&[("share.auto.offset.reset", "earliest")]))
        )
        .is_none());
        let c = consumer_overrides(
            &base,
            Some(&own(&[("consumer.heartbeat.interval.ms", "7000")])),
        )
        .unwrap();
        assert_eq!(
            (c.session_timeout_ms, c.heartbeat_interval_ms),
            (45_000, 7_000)
        );
    }
}
