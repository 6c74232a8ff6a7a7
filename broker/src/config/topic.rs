use std::collections::BTreeMap;

use thiserror::Error;

use protocol::record_batch::Codec;

use super::ServerConfig;
use crate::log::{CleanupPolicy, LogConfig};

/// A topic config Kafka knows and we honour: its topic-level name, the broker
/// key that supplies its default, and how to check a value.
pub struct TopicConfigEntry {
    pub name: &'static str,
    pub broker_key: &'static str,
    kind: Kind,
    /// Kafka's documentation flag: whether DescribeConfigs marks it sensitive.
    pub sensitive: bool,
}

#[derive(Clone, Copy)]
enum Kind {
    Long { min: i64 },
    Int { min: i64 },
    Bool,
    CleanupPolicy,
    TimestampType,
    Compression,
}

/// Every topic config we accept. CreateTopics and AlterConfigs reject any
/// other key with INVALID_CONFIG, as Kafka does.
pub const TOPIC_CONFIGS: &[TopicConfigEntry] = &[
    entry("cleanup.policy", "log.cleanup.policy", Kind::CleanupPolicy),
    entry("compression.type", "compression.type", Kind::Compression),
    entry(
        "delete.retention.ms",
        "log.cleaner.delete.retention.ms",
        Kind::Long { min: 0 },
    ),
    // KIP-1191: whether share groups may use the topic as their dead-letter
    // queue. No broker key supplies its default (false).
    entry(
        "errors.deadletterqueue.group.enable",
        "errors.deadletterqueue.group.enable",
        Kind::Bool,
    ),
    entry(
        "flush.messages",
        "log.flush.interval.messages",
        Kind::Long { min: 1 },
    ),
    entry("flush.ms", "log.flush.interval.ms", Kind::Long { min: 0 }),
    entry(
        "index.interval.bytes",
        "log.index.interval.bytes",
        Kind::Int { min: 0 },
    ),
    entry(
        "max.message.bytes",
        "message.max.bytes",
        Kind::Int { min: 0 },
    ),
    entry(
        "message.timestamp.after.max.ms",
        "log.message.timestamp.after.max.ms",
        Kind::Long { min: 0 },
    ),
    entry(
        "message.timestamp.before.max.ms",
        "log.message.timestamp.before.max.ms",
        Kind::Long { min: 0 },
    ),
    entry(
        "message.timestamp.type",
        "log.message.timestamp.type",
        Kind::TimestampType,
    ),
    entry(
        "min.insync.replicas",
        "min.insync.replicas",
        Kind::Int { min: 1 },
    ),
    entry(
        "retention.bytes",
        "log.retention.bytes",
        Kind::Long { min: -1 },
    ),
    entry("retention.ms", "log.retention.ms", Kind::Long { min: -1 }),
    entry("segment.bytes", "log.segment.bytes", Kind::Int { min: 14 }),
    entry("segment.ms", "log.roll.ms", Kind::Long { min: 1 }),
    entry(
        "unclean.leader.election.enable",
        "unclean.leader.election.enable",
        Kind::Bool,
    ),
];

const fn entry(name: &'static str, broker_key: &'static str, kind: Kind) -> TopicConfigEntry {
    TopicConfigEntry {
        name,
        broker_key,
        kind,
        sensitive: false,
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum TopicConfigError {
    #[error("Unknown topic config name: {0}")]
    UnknownKey(String),
    #[error("Invalid value {value} for configuration {key}: {reason}")]
    InvalidValue {
        key: String,
        value: String,
        reason: String,
    },
}

pub(super) fn validate_cleanup_policy(v: &str) -> Result<CleanupPolicy, String> {
    let mut policy = CleanupPolicy {
        delete: false,
        compact: false,
    };
    for part in v.split(',').map(str::trim) {
        match part {
            "delete" => policy.delete = true,
            "compact" => policy.compact = true,
            other => {
                return Err(format!(
                    "String must be one of: compact, delete (got {other:?})"
                ))
            }
        }
    }
    Ok(policy)
}

impl TopicConfigEntry {
    fn check(&self, value: &str) -> Result<(), String> {
        match self.kind {
            Kind::Long { min } | Kind::Int { min } => {
                let n: i64 = value
                    .trim()
                    .parse()
                    .map_err(|_| "not a number".to_string())?;
                if matches!(self.kind, Kind::Int { .. }) && i32::try_from(n).is_err() {
                    return Err("not a 32-bit integer".into());
                }
                if n < min {
                    return Err(format!("Value must be at least {min}"));
                }
                Ok(())
            }
            Kind::Bool => match value {
                "true" | "false" => Ok(()),
                _ => Err("Expected value to be either true or false".into()),
            },
            Kind::CleanupPolicy => validate_cleanup_policy(value).map(|_| ()),
            Kind::TimestampType => match value {
                "CreateTime" | "LogAppendTime" => Ok(()),
                _ => Err("String must be one of: CreateTime, LogAppendTime".into()),
            },
            // `producer` stores batches as sent; a codec makes the broker
            // recompress batches that arrive in another one.
            Kind::Compression => match value {
                "producer" | "uncompressed" | "gzip" | "snappy" | "lz4" | "zstd" => Ok(()),
                _ => Err(
                    "String must be one of: uncompressed, zstd, lz4, snappy, gzip, producer".into(),
                ),
            },
        }
    }

    /// The broker-level default for this config.
    pub fn broker_default(&self, server: &ServerConfig) -> String {
        match self.name {
            "cleanup.policy" => server.log_cleanup_policy.clone(),
            "compression.type" => "producer".into(),
            "delete.retention.ms" => server.log_cleaner_delete_retention_ms.to_string(),
            "errors.deadletterqueue.group.enable" => "false".into(),
            "flush.messages" => never_u64(server.log_flush_interval_messages),
            "flush.ms" => server.log_flush_interval_ms.to_string(),
            "index.interval.bytes" => server.log_index_interval_bytes.to_string(),
            "max.message.bytes" => server.message_max_bytes.to_string(),
            "message.timestamp.after.max.ms" => {
                server.log_message_timestamp_after_max_ms.to_string()
            }
            "message.timestamp.before.max.ms" => {
                server.log_message_timestamp_before_max_ms.to_string()
            }
            "message.timestamp.type" => server.log_message_timestamp_type.clone(),
            "min.insync.replicas" => server.min_insync_replicas.to_string(),
            "retention.bytes" => server.log_retention_bytes.to_string(),
            "retention.ms" => server.log_retention_ms.to_string(),
            "segment.bytes" => server.log_segment_bytes.to_string(),
            "segment.ms" => server.log_roll_ms.to_string(),
            "unclean.leader.election.enable" => "false".into(),
            other => unreachable!("topic config {other} has no broker default"),
        }
    }
}

fn never_u64(v: u64) -> String {
    if v == u64::MAX {
        i64::MAX.to_string()
    } else {
        v.to_string()
    }
}

/// A topic's effective configs: broker defaults overlaid with the topic's
/// overrides (which live in the metadata image).
#[derive(Clone, Debug)]
pub struct TopicConfigs {
    values: BTreeMap<&'static str, String>,
    /// The broker's `log.cleaner.dedupe.buffer.size` (not a topic key).
    cleaner_dedupe_buffer_bytes: u64,
}

impl TopicConfigs {
    /// Checks overrides given to CreateTopics / AlterConfigs.
    pub fn validate_overrides<'a, I>(overrides: I) -> Result<(), TopicConfigError>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        for (key, value) in overrides {
            let entry = TOPIC_CONFIGS
                .iter()
                .find(|e| e.name == key)
                .ok_or_else(|| TopicConfigError::UnknownKey(key.to_string()))?;
            entry
                .check(value)
                .map_err(|reason| TopicConfigError::InvalidValue {
                    key: key.to_string(),
                    value: value.to_string(),
                    reason,
                })?;
        }
        Ok(())
    }

    pub fn resolve(server: &ServerConfig, overrides: &BTreeMap<String, String>) -> Self {
        let values = TOPIC_CONFIGS
            .iter()
            .map(|e| {
                let v = overrides
                    .get(e.name)
                    .cloned()
                    .unwrap_or_else(|| e.broker_default(server));
                (e.name, v)
            })
            .collect();
        Self {
            values,
            cleaner_dedupe_buffer_bytes: server.log_cleaner_dedupe_buffer_size,
        }
    }

    pub fn get(&self, name: &str) -> &str {
        self.values.get(name).map(String::as_str).unwrap_or("")
    }

    fn long(&self, name: &str) -> i64 {
        // Values were validated on the way in; a default is only reachable
        // if the table and this accessor disagree.
        self.get(name).parse().unwrap_or(i64::MAX)
    }

    pub fn max_message_bytes(&self) -> u32 {
        self.long("max.message.bytes").clamp(0, u32::MAX as i64) as u32
    }

    /// How far behind the broker's clock a CreateTime record may be.
    pub fn message_timestamp_before_max_ms(&self) -> i64 {
        self.long("message.timestamp.before.max.ms")
    }

    /// How far ahead of the broker's clock a CreateTime record may be.
    pub fn message_timestamp_after_max_ms(&self) -> i64 {
        self.long("message.timestamp.after.max.ms")
    }

    pub fn log_append_time(&self) -> bool {
        self.get("message.timestamp.type") == "LogAppendTime"
    }

    /// The codec every stored batch must use; `None` for `producer`, which
    /// keeps each batch as its producer compressed it.
    pub fn compression_target(&self) -> Option<Codec> {
        match self.get("compression.type") {
            "uncompressed" => Some(Codec::None),
            "gzip" => Some(Codec::Gzip),
            "snappy" => Some(Codec::Snappy),
            "lz4" => Some(Codec::Lz4),
            "zstd" => Some(Codec::Zstd),
            _ => None,
        }
    }

    pub fn min_insync_replicas(&self) -> i32 {
        self.long("min.insync.replicas") as i32
    }

    pub fn log_config(&self) -> LogConfig {
        let flush_messages = self.long("flush.messages");
        LogConfig {
            segment_bytes: self.long("segment.bytes").max(14) as u64,
            segment_ms: self.long("segment.ms"),
            retention_ms: self.long("retention.ms"),
            retention_bytes: self.long("retention.bytes"),
            cleanup_policy: validate_cleanup_policy(self.get("cleanup.policy")).unwrap_or(
                CleanupPolicy {
                    delete: true,
                    compact: false,
                },
            ),
            delete_retention_ms: self.long("delete.retention.ms"),
            index_interval_bytes: self.long("index.interval.bytes").clamp(0, u32::MAX as i64)
                as u32,
            flush_messages: if flush_messages == i64::MAX {
                u64::MAX
            } else {
                flush_messages.max(1) as u64
            },
            flush_ms: self.long("flush.ms"),
            max_message_bytes: self.max_message_bytes(),
            cleaner_dedupe_buffer_bytes: self.cleaner_dedupe_buffer_bytes,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.values.iter().map(|(k, v)| (*k, v.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_win_over_broker_defaults() {
        let server = ServerConfig::default();
        let mut o = BTreeMap::new();
        o.insert("retention.ms".to_string(), "1000".to_string());
        let t = TopicConfigs::resolve(&server, &o);
        assert_eq!(t.get("retention.ms"), "1000");
        assert_eq!(t.get("segment.bytes"), (1u64 << 30).to_string());
        assert_eq!(t.log_config().retention_ms, 1000);
    }

    #[test]
    fn unknown_and_invalid_overrides_are_rejected() {
        assert_eq!(
            TopicConfigs::validate_overrides([("no.such.key", "1")]),
            Err(TopicConfigError::UnknownKey("no.such.key".into()))
        );
        assert!(TopicConfigs::validate_overrides([("segment.bytes", "1")]).is_err());
        assert!(TopicConfigs::validate_overrides([("cleanup.policy", "compact,delete")]).is_ok());
        assert!(TopicConfigs::validate_overrides([("compression.type", "lz4")]).is_ok());
        assert!(TopicConfigs::validate_overrides([("compression.type", "brotli")]).is_err());
    }
}
