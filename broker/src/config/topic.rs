use std::collections::BTreeMap;

use thiserror::Error;

use protocol::record_batch::Codec;

use super::ServerConfig;
use crate::log::{CleanupPolicy, LogConfig};

/// A topic config of Kafka 4.4's `LogConfig`: its name, the broker keys
/// that supply its default (Kafka's synonyms, highest precedence first), how
/// a value is checked, Kafka's default, and what it does here.
pub struct TopicConfigEntry {
    pub name: &'static str,
    /// Broker keys that set the default, in Kafka's precedence order (e.g.
    /// `log.retention.ms`, `log.retention.minutes`, `log.retention.hours`).
    pub synonyms: &'static [&'static str],
    kind: Kind,
    /// Kafka's default when no broker key sets one (`None`: no default, only
    /// for internal configs).
    pub default: Option<&'static str>,
    /// What DescribeConfigs v3+ answers as the config's documentation.
    pub doc: &'static str,
    /// Kafka's internal configs: accepted, never listed by DescribeConfigs.
    pub internal: bool,
    /// Kafka's documentation flag: whether DescribeConfigs marks it sensitive.
    pub sensitive: bool,
}

#[derive(Clone, Copy)]
enum Kind {
    Long {
        min: i64,
    },
    Int {
        min: i64,
        max: i64,
    },
    /// Kafka's DOUBLE with a `Range.between`.
    Ratio,
    Bool,
    CleanupPolicy,
    TimestampType,
    Compression,
    /// 1-9, or -1 for the codec's default.
    GzipLevel,
    /// Kafka's `ThrottledReplicaListValidator`: `*` or `partition:broker,...`.
    ThrottledReplicas,
}

const INT: Kind = Kind::Int {
    min: 0,
    max: i32::MAX as i64,
};
const fn int_min(min: i64) -> Kind {
    Kind::Int {
        min,
        max: i32::MAX as i64,
    }
}
const LONG_MAX: &str = "9223372036854775807";

/// Kafka 4.4's topic configs (`LogConfig`), every one accepted by
/// CreateTopics and AlterConfigs with Kafka's checks; any other key is
/// refused with INVALID_CONFIG, as Kafka does. Where Kafka's behaviour is not
/// built here the doc says so (tiered storage: only `remote.storage.enable=true`
/// is refused, as a Kafka broker without tiered storage refuses it).
pub const TOPIC_CONFIGS: &[TopicConfigEntry] = &[
    // Kafka's minimum is 1 MiB; smaller segments are accepted here (tests
    // and small disks use them; Kafka's tests use `internal.segment.bytes`).
    entry("segment.bytes", &["log.segment.bytes"], int_min(14), "1073741824",
        "The size at which the active segment is closed and a new one started. Retention and compaction work a segment at a time."),
    entry("segment.ms", &["log.roll.ms", "log.roll.hours"], Kind::Long { min: 1 }, "604800000",
        "The time after which the active segment is closed even if it is not full, so that retention and compaction can reach its records."),
    entry("segment.jitter.ms", &["log.roll.jitter.ms", "log.roll.jitter.hours"], Kind::Long { min: 0 }, "0",
        "The most, drawn at random per segment, subtracted from segment.ms, so that many partitions do not roll at once."),
    entry("segment.index.bytes", &["log.index.size.max.bytes"], int_min(4), "10485760",
        "Accepted for compatibility; no effect here: the offset index of a segment grows with it and is not preallocated."),
    entry("flush.messages", &["log.flush.interval.messages"], Kind::Long { min: 1 }, LONG_MAX,
        "Fsync the log after this many messages. The default leaves durability to replication and the OS."),
    entry("flush.ms", &["log.flush.interval.ms", "log.flush.scheduler.interval.ms"], Kind::Long { min: 0 }, LONG_MAX,
        "Fsync the log when this long has passed since the last fsync."),
    entry("retention.bytes", &["log.retention.bytes"], Kind::Long { min: -1 }, "-1",
        "The size a partition may grow to before its oldest segments are deleted (cleanup.policy delete); -1: no limit."),
    entry("retention.ms", &["log.retention.ms", "log.retention.minutes", "log.retention.hours"], Kind::Long { min: -1 }, "604800000",
        "How long a segment is kept after its newest record before it is deleted (cleanup.policy delete); -1: forever."),
    entry("max.message.bytes", &["message.max.bytes"], INT, "1048588",
        "The largest record batch accepted, after compression."),
    entry("max.decompressed.message.bytes", &["max.decompressed.message.bytes"], Kind::Int { min: 1, max: 2_147_483_639 }, "2147483639",
        "The largest single record, decompressed, that a compressed produce may carry; larger ones are refused as invalid records."),
    entry("index.interval.bytes", &["log.index.interval.bytes"], INT, "4096",
        "How many bytes of batches lie between two entries of the offset and time indexes."),
    entry("delete.retention.ms", &["log.cleaner.delete.retention.ms"], Kind::Long { min: 0 }, "86400000",
        "How long a tombstone is kept on a compacted topic once its segment was cleaned."),
    entry("min.compaction.lag.ms", &["log.cleaner.min.compaction.lag.ms"], Kind::Long { min: 0 }, "0",
        "The least time a record stays uncompacted: segments with a newer record are not cleaned yet."),
    entry("max.compaction.lag.ms", &["log.cleaner.max.compaction.lag.ms"], Kind::Long { min: 1 }, LONG_MAX,
        "The most time a record stays ineligible for compaction: older dirty segments are cleaned whatever the dirty ratio, and the active segment of a compacted topic rolls after this long."),
    entry("file.delete.delay.ms", &["log.segment.delete.delay.ms"], Kind::Long { min: 0 }, "60000",
        "Accepted for compatibility; no effect here: a deleted segment's file is unlinked at once, and readers that still hold it keep reading it."),
    entry("min.cleanable.dirty.ratio", &["log.cleaner.min.cleanable.ratio"], Kind::Ratio, "0.5",
        "The share of a compacted log that must be dirty (written since the last cleaning) before it is cleaned again."),
    entry("cleanup.policy", &["log.cleanup.policy"], Kind::CleanupPolicy, "delete",
        "delete (segments go by retention.ms and retention.bytes), compact (the latest record per key is kept), both, or empty (kept forever)."),
    entry("unclean.leader.election.enable", &["unclean.leader.election.enable"], Kind::Bool, "false",
        "Whether a replica outside the ISR may become leader when no in-sync replica is left, at the cost of losing records."),
    entry("min.insync.replicas", &["min.insync.replicas"], int_min(1), "1",
        "The in-sync replicas, the leader included, an acks=all produce needs; fewer answer NOT_ENOUGH_REPLICAS."),
    entry("compression.type", &["compression.type"], Kind::Compression, "producer",
        "The codec batches are stored in: producer keeps each batch as sent; a codec recompresses batches that arrive in another."),
    entry("compression.gzip.level", &["compression.gzip.level"], Kind::GzipLevel, "-1",
        "The gzip level when the broker recompresses to gzip (1-9, -1 for the codec's default)."),
    entry("compression.lz4.level", &["compression.lz4.level"], Kind::Int { min: 1, max: 17 }, "9",
        "The lz4 level when the broker recompresses to lz4."),
    entry("compression.zstd.level", &["compression.zstd.level"], Kind::Int { min: -131_072, max: 22 }, "3",
        "The zstd level when the broker recompresses to zstd."),
    entry("preallocate", &["log.preallocate"], Kind::Bool, "false",
        "Accepted for compatibility; no effect here: segment files are not preallocated."),
    entry("message.timestamp.type", &["log.message.timestamp.type"], Kind::TimestampType, "CreateTime",
        "CreateTime keeps the producer's timestamps; LogAppendTime stamps each batch with the broker's clock."),
    entry("message.timestamp.before.max.ms", &["log.message.timestamp.before.max.ms"], Kind::Long { min: 0 }, LONG_MAX,
        "How far behind the broker's clock a CreateTime record may be."),
    entry("message.timestamp.after.max.ms", &["log.message.timestamp.after.max.ms"], Kind::Long { min: 0 }, "3600000",
        "How far ahead of the broker's clock a CreateTime record may be."),
    entry("leader.replication.throttled.replicas", &[], Kind::ThrottledReplicas, "",
        "Replicas (partition:broker, or *) whose replication the leader throttles. Accepted and stored; replication throttles are not applied yet."),
    entry("follower.replication.throttled.replicas", &[], Kind::ThrottledReplicas, "",
        "Replicas (partition:broker, or *) whose replication the follower throttles. Accepted and stored; replication throttles are not applied yet."),
    entry("remote.storage.enable", &[], Kind::Bool, "false",
        "Tiered storage for the topic. This broker does not implement tiered storage: true is refused."),
    entry("local.retention.ms", &["log.local.retention.ms"], Kind::Long { min: -2 }, "-2",
        "Tiered storage's local retention; no effect without tiered storage (retention.ms governs)."),
    entry("local.retention.bytes", &["log.local.retention.bytes"], Kind::Long { min: -2 }, "-2",
        "Tiered storage's local size limit; no effect without tiered storage (retention.bytes governs)."),
    entry("remote.log.copy.disable", &[], Kind::Bool, "false",
        "Tiered storage only; no effect here."),
    entry("remote.copy.lag.ms", &["log.remote.copy.lag.ms"], Kind::Long { min: -1 }, "0",
        "Tiered storage only; no effect here."),
    entry("remote.copy.lag.bytes", &["log.remote.copy.lag.bytes"], Kind::Long { min: -1 }, "-1",
        "Tiered storage only; no effect here."),
    entry("remote.log.delete.on.disable", &[], Kind::Bool, "false",
        "Tiered storage only; no effect here."),
    // KIP-1191: whether share groups may use the topic as their dead-letter
    // queue.
    entry("errors.deadletterqueue.group.enable", &[], Kind::Bool, "false",
        "Whether share groups may copy their undeliverable records to this topic (their dead-letter queue)."),
    // Kafka's test-only override of segment.bytes, without its minimum.
    TopicConfigEntry {
        name: "internal.segment.bytes",
        synonyms: &[],
        kind: int_min(14),
        default: None,
        doc: "The segment size, overriding segment.bytes (Kafka's internal key for tests).",
        internal: true,
        sensitive: false,
    },
];

const fn entry(
    name: &'static str,
    synonyms: &'static [&'static str],
    kind: Kind,
    default: &'static str,
    doc: &'static str,
) -> TopicConfigEntry {
    TopicConfigEntry {
        name,
        synonyms,
        kind,
        default: Some(default),
        doc,
        internal: false,
        sensitive: false,
    }
}

/// The entry for `name`, if Kafka has such a topic config.
pub fn topic_config(name: &str) -> Option<&'static TopicConfigEntry> {
    TOPIC_CONFIGS.iter().find(|e| e.name == name)
}

/// Whether `key` is a broker key that sets a topic config's default.
pub fn is_topic_synonym(key: &str) -> bool {
    TOPIC_CONFIGS.iter().any(|e| e.synonyms.contains(&key))
}

/// The topic config whose default the dynamic broker config `key` sets:
/// Kafka makes each topic config's first broker key dynamic
/// (`log.retention.ms`, not `log.retention.hours`).
pub fn dynamic_broker_key(key: &str) -> Option<&'static TopicConfigEntry> {
    TOPIC_CONFIGS
        .iter()
        .find(|e| !e.internal && e.synonyms.first() == Some(&key))
}

/// Checks a dynamic broker config's value with its topic config's rule.
pub fn check_dynamic_broker_config(key: &str, value: &str) -> Result<(), TopicConfigError> {
    dynamic_broker_key(key)
        .ok_or_else(|| TopicConfigError::UnknownKey(key.to_string()))?
        .check_as(key, value, value)
}

/// Where a broker-level value comes from, in Kafka's order of precedence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrokerSource {
    /// Set for this broker (DYNAMIC_BROKER_CONFIG).
    DynamicBroker,
    /// Set for every broker (DYNAMIC_DEFAULT_BROKER_CONFIG).
    DynamicDefault,
    /// server.properties (STATIC_BROKER_CONFIG).
    Static,
    /// Kafka's default (DEFAULT_CONFIG).
    Default,
}

/// The dynamic broker configs (stored in the metadata quorum) that apply to
/// one broker: its own, then the cluster-wide defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DynamicBrokerConfigs {
    pub broker: BTreeMap<String, String>,
    pub cluster: BTreeMap<String, String>,
}

impl DynamicBrokerConfigs {
    /// The dynamic value of `key` and its source, if one is set.
    pub fn get(&self, key: &str) -> Option<(&str, BrokerSource)> {
        self.broker
            .get(key)
            .map(|v| (v.as_str(), BrokerSource::DynamicBroker))
            .or_else(|| {
                self.cluster
                    .get(key)
                    .map(|v| (v.as_str(), BrokerSource::DynamicDefault))
            })
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
    /// A rule across keys (Kafka's `LogConfig.validateValues` and its
    /// tiered-storage checks), with Kafka's message.
    #[error("{0}")]
    Conflict(String),
}

pub(super) fn validate_cleanup_policy(v: &str) -> Result<CleanupPolicy, String> {
    let mut policy = CleanupPolicy {
        delete: false,
        compact: false,
    };
    // An empty list keeps the log forever (Kafka 4.x).
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
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

fn validate_throttled_replicas(v: &str) -> Result<(), String> {
    let v = v.trim();
    if v == "*" || v.is_empty() {
        return Ok(());
    }
    let ok = v.split(',').map(str::trim).all(|r| {
        r.split_once(':').is_some_and(|(p, b)| {
            !p.is_empty()
                && !b.is_empty()
                && p.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        })
    });
    if ok {
        Ok(())
    } else {
        Err(
            "must be the literal '*' or a list of replicas in the following format: \
             [partitionId]:[brokerId],[partitionId]:[brokerId],..."
                .into(),
        )
    }
}

impl TopicConfigEntry {
    fn check(&self, value: &str) -> Result<(), String> {
        match self.kind {
            Kind::Long { min } => {
                let n: i64 = value
                    .trim()
                    .parse()
                    .map_err(|_| "Not a number of type LONG".to_string())?;
                if n < min {
                    return Err(format!("Value must be at least {min}"));
                }
                Ok(())
            }
            Kind::Int { min, max } => {
                let n: i32 = value
                    .trim()
                    .parse()
                    .map_err(|_| "Not a number of type INT".to_string())?;
                if i64::from(n) < min {
                    return Err(format!("Value must be at least {min}"));
                }
                if i64::from(n) > max {
                    return Err(format!("Value must be no more than {max}"));
                }
                Ok(())
            }
            Kind::Ratio => {
                let n: f64 = value
                    .trim()
                    .parse()
                    .map_err(|_| "Not a number of type DOUBLE".to_string())?;
                if !(0.0..=1.0).contains(&n) {
                    return Err(if n < 0.0 || n.is_nan() {
                        "Value must be at least 0".into()
                    } else {
                        "Value must be no more than 1".into()
                    });
                }
                Ok(())
            }
            Kind::GzipLevel => match value.trim().parse::<i32>() {
                Ok(-1 | 1..=9) => Ok(()),
                Ok(_) => Err("Value must be between 1 and 9, or -1 for the default".into()),
                Err(_) => Err("Not a number of type INT".into()),
            },
            Kind::Bool => match value.trim().to_ascii_lowercase().as_str() {
                "true" | "false" => Ok(()),
                _ => Err("Expected value to be either true or false".into()),
            },
            Kind::CleanupPolicy => validate_cleanup_policy(value).map(|_| ()),
            Kind::ThrottledReplicas => validate_throttled_replicas(value),
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

    /// [`Self::check`] of `checked`, refusing as `key` = `given` (what the
    /// user wrote, when `checked` is it converted to milliseconds).
    fn check_as(&self, key: &str, checked: &str, given: &str) -> Result<(), TopicConfigError> {
        self.check(checked)
            .map_err(|reason| TopicConfigError::InvalidValue {
                key: key.to_string(),
                value: given.to_string(),
                reason,
            })
    }

    /// Kafka's type name for DescribeConfigs (`ConfigType` codes).
    pub fn config_type(&self) -> i8 {
        match self.kind {
            Kind::Bool => 1,
            Kind::TimestampType | Kind::Compression => 2,
            Kind::Int { .. } | Kind::GzipLevel => 3,
            Kind::Long { .. } => 5,
            Kind::Ratio => 6,
            Kind::CleanupPolicy | Kind::ThrottledReplicas => 7,
        }
    }

    /// The broker key (and its value, as written) that sets this config's
    /// default, if the broker's properties set one of its synonyms.
    pub fn broker_setting<'a>(&self, server: &'a ServerConfig) -> Option<(&'static str, &'a str)> {
        self.synonyms
            .iter()
            .find_map(|k| server.explicit.get(*k).map(|v| (*k, v.as_str())))
    }

    /// The broker-level default for this config with the dynamic broker
    /// configs over the static ones, and where it comes from.
    pub fn broker_default_with(
        &self,
        server: &ServerConfig,
        dynamic: &DynamicBrokerConfigs,
    ) -> Option<(String, BrokerSource)> {
        if let Some((v, source)) = self.synonyms.first().and_then(|k| dynamic.get(k)) {
            return Some((v.to_string(), source));
        }
        let source = if self.broker_setting(server).is_some() {
            BrokerSource::Static
        } else {
            BrokerSource::Default
        };
        self.broker_default(server).map(|v| (v, source))
    }

    /// The broker-level default for this config from server.properties
    /// (`None` only for internal configs without a default).
    pub fn broker_default(&self, server: &ServerConfig) -> Option<String> {
        Some(match self.name {
            "cleanup.policy" => server.log_cleanup_policy.clone(),
            "delete.retention.ms" => server.log_cleaner_delete_retention_ms.to_string(),
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
            "unclean.leader.election.enable" => server.unclean_leader_election_enable.to_string(),
            _ => match self.broker_setting(server) {
                // Checked at start (`check_broker_settings`).
                Some((key, v)) => in_millis(key, v.trim()),
                None => self.default?.to_string(),
            },
        })
    }
}

/// A broker value in the topic config's unit: `*.hours` and `*.minutes`
/// synonyms are in those units.
fn in_millis(key: &str, v: &str) -> String {
    let scale = if key.ends_with(".hours") {
        3_600_000
    } else if key.ends_with(".minutes") {
        60_000
    } else {
        return v.to_string();
    };
    v.parse::<i64>()
        .map(|n| n.saturating_mul(scale).to_string())
        .unwrap_or_else(|_| v.to_string())
}

/// Checks the broker keys that set topic-config defaults with the topic
/// config's rule (the server config parses some of them itself too).
pub fn check_broker_settings(server: &ServerConfig) -> Result<(), TopicConfigError> {
    for e in TOPIC_CONFIGS {
        for key in e.synonyms {
            let Some(v) = server.explicit.get(*key) else {
                continue;
            };
            e.check_as(key, &in_millis(key, v.trim()), v)?;
        }
    }
    Ok(())
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
    /// Checks a topic's overrides given to CreateTopics / AlterConfigs: each
    /// value by its key's rule, then the rules across keys on the effective
    /// configs (the overrides over the broker's defaults), as Kafka's
    /// `LogConfig.validate` does.
    pub fn validate_overrides<'a, I>(
        server: &ServerConfig,
        dynamic: &DynamicBrokerConfigs,
        overrides: I,
    ) -> Result<(), TopicConfigError>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut given = BTreeMap::new();
        for (key, value) in overrides {
            topic_config(key)
                .ok_or_else(|| TopicConfigError::UnknownKey(key.to_string()))?
                .check_as(key, value, value)?;
            given.insert(key.to_string(), value.to_string());
        }
        let effective = Self::resolve_with(server, dynamic, &given);
        let (min_lag, max_lag) = (
            effective.long("min.compaction.lag.ms"),
            effective.long("max.compaction.lag.ms"),
        );
        if min_lag > max_lag {
            return Err(TopicConfigError::Conflict(format!(
                "conflict topic config setting min.compaction.lag.ms ({min_lag}) > max.compaction.lag.ms ({max_lag})"
            )));
        }
        if effective
            .get("remote.storage.enable")
            .eq_ignore_ascii_case("true")
        {
            return Err(TopicConfigError::Conflict(
                "Tiered Storage functionality is disabled in the broker. Topic cannot be \
                 configured with remote log storage. (This broker does not implement tiered \
                 storage.)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The effective configs from server.properties' defaults only.
    pub fn resolve(server: &ServerConfig, overrides: &BTreeMap<String, String>) -> Self {
        Self::resolve_with(server, &DynamicBrokerConfigs::default(), overrides)
    }

    /// The effective configs: the topic's overrides, else the dynamic broker
    /// configs (this broker's, then the cluster's), else server.properties.
    pub fn resolve_with(
        server: &ServerConfig,
        dynamic: &DynamicBrokerConfigs,
        overrides: &BTreeMap<String, String>,
    ) -> Self {
        let values = TOPIC_CONFIGS
            .iter()
            .filter_map(|e| {
                let v = overrides
                    .get(e.name)
                    .cloned()
                    .or_else(|| e.broker_default_with(server, dynamic).map(|(v, _)| v))?;
                Some((e.name, v))
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
        self.get(name).trim().parse().unwrap_or(i64::MAX)
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

    /// The level the broker recompresses with for `compression_target`
    /// (`compression.gzip.level`, `.lz4.level`, `.zstd.level`); `None`: the
    /// codec's default.
    pub fn compression_level(&self) -> Option<i32> {
        let key = match self.compression_target()? {
            Codec::Gzip => "compression.gzip.level",
            Codec::Lz4 => "compression.lz4.level",
            Codec::Zstd => "compression.zstd.level",
            Codec::None | Codec::Snappy => return None,
        };
        match self.long(key) {
            -1 if key == "compression.gzip.level" => None,
            n => i32::try_from(n).ok(),
        }
    }

    /// `max.decompressed.message.bytes`: the largest record, decompressed,
    /// a compressed batch may carry.
    pub fn max_decompressed_record_bytes(&self) -> u32 {
        self.long("max.decompressed.message.bytes")
            .clamp(1, u32::MAX as i64) as u32
    }

    pub fn min_insync_replicas(&self) -> i32 {
        self.long("min.insync.replicas") as i32
    }

    pub fn log_config(&self) -> LogConfig {
        let flush_messages = self.long("flush.messages");
        LogConfig {
            segment_bytes: self
                .values
                .get("internal.segment.bytes")
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or_else(|| self.long("segment.bytes"))
                .max(14) as u64,
            segment_ms: self.long("segment.ms"),
            segment_jitter_ms: self.long("segment.jitter.ms"),
            retention_ms: self.long("retention.ms"),
            retention_bytes: self.long("retention.bytes"),
            cleanup_policy: validate_cleanup_policy(self.get("cleanup.policy")).unwrap_or(
                CleanupPolicy {
                    delete: true,
                    compact: false,
                },
            ),
            delete_retention_ms: self.long("delete.retention.ms"),
            min_compaction_lag_ms: self.long("min.compaction.lag.ms"),
            max_compaction_lag_ms: self.long("max.compaction.lag.ms"),
            min_cleanable_dirty_ppm: (self
                .get("min.cleanable.dirty.ratio")
                .parse::<f64>()
                .unwrap_or(0.5)
                .clamp(0.0, 1.0)
                * 1_000_000.0)
                .round() as u32,
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

    /// The effective value of every config DescribeConfigs lists (internal
    /// ones left out).
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.values
            .iter()
            .filter(|(k, _)| topic_config(k).is_some_and(|e| !e.internal))
            .map(|(k, v)| (*k, v.as_str()))
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

    fn check(pairs: &[(&str, &str)]) -> Result<(), TopicConfigError> {
        TopicConfigs::validate_overrides(
            &ServerConfig::default(),
            &DynamicBrokerConfigs::default(),
            pairs.iter().copied(),
        )
    }

    #[test]
    fn unknown_and_invalid_overrides_are_rejected() {
        assert_eq!(
            check(&[("no.such.key", "1")]),
            Err(TopicConfigError::UnknownKey("no.such.key".into()))
        );
        assert!(check(&[("segment.bytes", "1")]).is_err());
        assert!(check(&[("cleanup.policy", "compact,delete")]).is_ok());
        assert!(check(&[("cleanup.policy", "")]).is_ok());
        assert!(check(&[("compression.type", "lz4")]).is_ok());
        assert!(check(&[("compression.type", "brotli")]).is_err());
    }

    #[test]
    fn every_kafka_topic_config_is_accepted_with_its_checks() {
        for (key, good, bad) in [
            ("min.cleanable.dirty.ratio", "0.1", "1.5"),
            ("min.compaction.lag.ms", "1000", "-1"),
            ("max.compaction.lag.ms", "60000", "0"),
            ("segment.jitter.ms", "100", "-1"),
            ("segment.index.bytes", "4096", "3"),
            ("preallocate", "true", "yes"),
            ("file.delete.delay.ms", "0", "x"),
            ("compression.gzip.level", "-1", "0"),
            ("compression.lz4.level", "17", "18"),
            ("compression.zstd.level", "-131072", "23"),
            ("max.decompressed.message.bytes", "1", "2147483640"),
            ("leader.replication.throttled.replicas", "0:1,1:2", "0-1"),
            ("follower.replication.throttled.replicas", "*", "a:b"),
            ("local.retention.ms", "-2", "-3"),
            ("local.retention.bytes", "100", "-3"),
            ("remote.log.copy.disable", "false", "1"),
            ("remote.copy.lag.ms", "-1", "-2"),
            ("remote.copy.lag.bytes", "10", "-2"),
            ("remote.log.delete.on.disable", "false", "maybe"),
            ("internal.segment.bytes", "1000", "1"),
        ] {
            assert!(check(&[(key, good)]).is_ok(), "{key}={good}");
            assert!(
                matches!(
                    check(&[(key, bad)]),
                    Err(TopicConfigError::InvalidValue { .. })
                ),
                "{key}={bad}"
            );
        }
        assert!(matches!(
            check(&[
                ("min.compaction.lag.ms", "10"),
                ("max.compaction.lag.ms", "5")
            ]),
            Err(TopicConfigError::Conflict(_))
        ));
        // Only what would need tiered storage is refused.
        assert!(check(&[("remote.storage.enable", "false")]).is_ok());
        let refused = check(&[("remote.storage.enable", "true")]).unwrap_err();
        assert!(refused.to_string().contains("tiered storage"), "{refused}");
    }

    #[test]
    fn broker_keys_set_topic_defaults_in_their_units() {
        let server = ServerConfig::from_pairs([
            ("log.roll.jitter.hours".to_string(), "2".to_string()),
            (
                "log.cleaner.min.cleanable.ratio".to_string(),
                "0.25".to_string(),
            ),
        ])
        .unwrap();
        let t = TopicConfigs::resolve(&server, &BTreeMap::new());
        assert_eq!(t.get("segment.jitter.ms"), "7200000");
        assert_eq!(t.log_config().min_cleanable_dirty_ppm, 250_000);
        assert_eq!(t.get("preallocate"), "false");
        assert!(t.iter().all(|(k, _)| k != "internal.segment.bytes"));
        assert!(ServerConfig::from_pairs([(
            "log.cleaner.min.cleanable.ratio".to_string(),
            "2".to_string()
        )])
        .is_err());
    }

    #[test]
    fn dynamic_broker_configs_win_over_static_ones_and_lose_to_the_topic() {
        let server =
            ServerConfig::from_pairs([("log.retention.ms".to_string(), "1000".to_string())])
                .unwrap();
        let mut dynamic = DynamicBrokerConfigs::default();
        let entry = topic_config("retention.ms").unwrap();
        assert_eq!(
            entry.broker_default_with(&server, &dynamic),
            Some(("1000".to_string(), BrokerSource::Static))
        );
        dynamic
            .cluster
            .insert("log.retention.ms".into(), "2000".into());
        assert_eq!(
            entry.broker_default_with(&server, &dynamic),
            Some(("2000".to_string(), BrokerSource::DynamicDefault))
        );
        dynamic
            .broker
            .insert("log.retention.ms".into(), "3000".into());
        let t = TopicConfigs::resolve_with(&server, &dynamic, &BTreeMap::new());
        assert_eq!(t.get("retention.ms"), "3000");
        let own = BTreeMap::from([("retention.ms".to_string(), "4000".to_string())]);
        let t = TopicConfigs::resolve_with(&server, &dynamic, &own);
        assert_eq!(t.get("retention.ms"), "4000");
        // Only a topic config's first broker key is dynamic, as in Kafka.
        assert!(dynamic_broker_key("log.retention.ms").is_some());
        assert!(dynamic_broker_key("log.retention.hours").is_none());
        assert!(dynamic_broker_key("num.io.threads").is_none());
        assert!(check_dynamic_broker_config("log.cleaner.min.cleanable.ratio", "0.2").is_ok());
        assert!(check_dynamic_broker_config("log.cleaner.min.cleanable.ratio", "2").is_err());
    }
}
