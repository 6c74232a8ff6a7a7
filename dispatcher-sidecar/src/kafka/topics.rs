//! Topic setup: a queue's retry-tier, DLQ and ack-log topics are created when
//! missing, shaped after the primary topic.
//!
//! `plan` decides (pure, unit-tested); `ensure_topics` asks the cluster and
//! creates what the plan says is missing. Existing topics are left as they
//! are, so a second run (or a second instance racing the first) is a no-op.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::config::QueueConfig;

/// What a derived topic is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicRole {
    RetryTier(Duration),
    Dlq,
    AckLog,
    Dedupe,
    /// Ordered queues: a parked key's later messages (issue 8).
    Hold,
    /// The message-id index of traces (`crate::trace`).
    Index,
    /// Which DLQ records were redriven (`crate::redrive::store`).
    RedriveMarks,
    /// Operator state that outlives instances: the pause (`super::control`).
    Control,
}

/// The primary topic as the cluster describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimaryTopic {
    pub name: String,
    pub partitions: i32,
    pub replication_factor: i32,
    /// `retention.ms`; negative means infinite (Kafka writes -1).
    pub retention_ms: i64,
    /// The primary's `min.insync.replicas`, copied so a derived topic is
    /// exactly as durable as the topic its messages come from.
    pub min_insync_replicas: Option<String>,
}

/// A topic the queue needs, with the configs it is created with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    pub name: String,
    pub role: TopicRole,
    pub partitions: i32,
    pub replication_factor: i32,
    pub configs: BTreeMap<String, String>,
}

/// The derived topics of `queue`, in order: retry tiers, DLQ, (hold,) ack
/// log, dedupe, index, redrive marks, control.
///
/// Every one has the primary's partition count and replication factor (the
/// ack log's partition p holds the lease events of the primary's partition
/// p). Retention: the DLQ keeps messages twice as long as the primary (the
/// issue's rule, so a dead letter outlives its source), infinite when the
/// primary's is; a retry tier keeps them as long as the primary plus its
/// delay, so a retry is not deleted before it is due. The ack log is
/// compacted: only the latest state of each key matters. The dedupe topic is
/// compacted and deleted after the dedupe window (its segments roll at the
/// window, so an id older than two windows is gone from disk too). The
/// message-id index (`<topic>.index`) is compacted (one entry per message)
/// and deleted after the DLQ's retention, so an entry outlives every copy of
/// its message. The control topic (`<topic>.control`) has one partition
/// and is compacted only: a pause stands until a resume, however long ago.
pub fn plan(queue: &QueueConfig, primary: &PrimaryTopic) -> Vec<TopicSpec> {
    let retention = |extra_ms: i64, factor: i64| -> String {
        if primary.retention_ms < 0 {
            "-1".to_string()
        } else {
            primary
                .retention_ms
                .saturating_mul(factor)
                .saturating_add(extra_ms)
                .to_string()
        }
    };
    let spec = |name: String, role: TopicRole, mut configs: BTreeMap<String, String>| {
        if let Some(min_isr) = &primary.min_insync_replicas {
            configs.insert("min.insync.replicas".to_string(), min_isr.clone());
        }
        TopicSpec {
            name,
            role,
            partitions: primary.partitions,
            replication_factor: primary.replication_factor,
            configs,
        }
    };
    let mut specs: Vec<TopicSpec> = queue
        .retry_tiers
        .iter()
        .map(|tier| {
            let delay_ms = i64::try_from(tier.as_millis()).unwrap_or(i64::MAX);
            spec(
                queue.retry_topic(*tier),
                TopicRole::RetryTier(*tier),
                BTreeMap::from([("retention.ms".to_string(), retention(delay_ms, 1))]),
            )
        })
        .collect();
    specs.push(spec(
        queue.dlq_topic.clone(),
        TopicRole::Dlq,
        BTreeMap::from([("retention.ms".to_string(), retention(0, 2))]),
    ));
    if queue.ordered {
        // Held messages wait for their key's release as long as its DLQ
        // record can be redriven: the DLQ's retention.
        specs.push(spec(
            queue.hold_topic(),
            TopicRole::Hold,
            BTreeMap::from([("retention.ms".to_string(), retention(0, 2))]),
        ));
    }
    specs.push(spec(
        queue.ack_log_topic.clone(),
        TopicRole::AckLog,
        BTreeMap::from([("cleanup.policy".to_string(), "compact".to_string())]),
    ));
    let window_ms = i64::try_from(queue.dedupe_window.as_millis())
        .unwrap_or(i64::MAX)
        .max(1)
        .to_string();
    specs.push(spec(
        queue.dedupe_topic.clone(),
        TopicRole::Dedupe,
        BTreeMap::from([
            ("cleanup.policy".to_string(), "compact,delete".to_string()),
            ("retention.ms".to_string(), window_ms.clone()),
            ("segment.ms".to_string(), window_ms),
        ]),
    ));
    specs.push(spec(
        crate::trace::index_topic(&queue.topic),
        TopicRole::Index,
        BTreeMap::from([
            ("cleanup.policy".to_string(), "compact,delete".to_string()),
            ("retention.ms".to_string(), retention(0, 2)),
        ]),
    ));
    // Redrive marks: compacted (the latest bitmap of each chunk counts), and
    // gone with the DLQ's retention (a mark outliving its DLQ records is
    // useless).
    specs.push(spec(
        crate::redrive::store::state_topic(queue),
        TopicRole::RedriveMarks,
        BTreeMap::from([
            ("cleanup.policy".to_string(), "compact,delete".to_string()),
            ("retention.ms".to_string(), retention(0, 2)),
        ]),
    ));
    specs.push(TopicSpec {
        partitions: 1,
        ..spec(
            queue.control_topic(),
            TopicRole::Control,
            BTreeMap::from([("cleanup.policy".to_string(), "compact".to_string())]),
        )
    });
    specs
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SetupReport {
    pub created: Vec<String>,
    pub existing: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TopicSetupError {
    #[error("queue {queue:?}: topic {topic:?} does not exist (create it first)")]
    PrimaryMissing { queue: String, topic: String },
    #[error("queue {queue:?}: topic {topic:?}: {error}")]
    Describe {
        queue: String,
        topic: String,
        error: String,
    },
    #[error("queue {queue:?}: cannot create topic {topic:?}: {code}")]
    Create {
        queue: String,
        topic: String,
        code: RDKafkaErrorCode,
    },
    #[error(
        "queue {queue:?}: ack-log topic {topic:?} has {found} partitions, the primary has {expected}: \
         ack-log partition p must hold partition p's lease events"
    )]
    AckLogPartitions {
        queue: String,
        topic: String,
        found: i32,
        expected: i32,
    },
    #[error("queue {queue:?}: {error}")]
    Kafka { queue: String, error: KafkaError },
}

/// Reads the primary topic's shape: partitions and replication factor from
/// the cluster metadata, `retention.ms` and `min.insync.replicas` from
/// DescribeConfigs.
async fn describe_primary(
    admin: &Arc<AdminClient<DefaultClientContext>>,
    queue: &QueueConfig,
    existing: &HashMap<String, (i32, i32)>,
    timeout: Duration,
) -> Result<PrimaryTopic, TopicSetupError> {
    let Some(&(partitions, replication_factor)) = existing.get(&queue.topic) else {
        return Err(TopicSetupError::PrimaryMissing {
            queue: queue.name.clone(),
            topic: queue.topic.clone(),
        });
    };
    let describe_err = |error: String| TopicSetupError::Describe {
        queue: queue.name.clone(),
        topic: queue.topic.clone(),
        error,
    };
    // Apache Kafka may answer a DescribeConfigs for a topic created moments
    // ago with an error or no entries; ask again until the timeout.
    let deadline = tokio::time::Instant::now() + timeout;
    let opts = AdminOptions::new().request_timeout(Some(timeout));
    let resource = loop {
        let answer = admin
            .describe_configs(&[ResourceSpecifier::Topic(&queue.topic)], &opts)
            .await
            .map_err(|e| e.to_string())
            .and_then(|results| match results.into_iter().next() {
                Some(Ok(resource)) if resource.get("retention.ms").is_some() => Ok(resource),
                Some(Ok(_)) => Err("DescribeConfigs has no retention.ms".to_string()),
                Some(Err(code)) => Err(format!("DescribeConfigs: {code}")),
                None => Err("DescribeConfigs answered nothing".to_string()),
            });
        match answer {
            Ok(resource) => break resource,
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(describe_err(e)),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let value = |key: &str| resource.get(key).and_then(|e| e.value.clone());
    let retention_ms = value("retention.ms")
        .unwrap_or_default()
        .parse::<i64>()
        .map_err(|_| {
            describe_err(format!(
                "retention.ms {:?} is not a number",
                value("retention.ms")
            ))
        })?;
    Ok(PrimaryTopic {
        name: queue.topic.clone(),
        partitions,
        replication_factor,
        retention_ms,
        min_insync_replicas: value("min.insync.replicas"),
    })
}

/// Creates the queue's derived topics that do not exist yet.
pub async fn ensure_topics(
    admin: &Arc<AdminClient<DefaultClientContext>>,
    queue: &QueueConfig,
    timeout: Duration,
) -> Result<SetupReport, TopicSetupError> {
    let existing = topic_partitions(admin, queue, timeout).await?;
    let primary = describe_primary(admin, queue, &existing, timeout).await?;
    let specs = plan(queue, &primary);
    let mut report = SetupReport::default();
    let mut missing = Vec::new();
    for spec in &specs {
        match existing.get(&spec.name) {
            Some(&(found, _)) => {
                if spec.role == TopicRole::AckLog && found != spec.partitions {
                    return Err(TopicSetupError::AckLogPartitions {
                        queue: queue.name.clone(),
                        topic: spec.name.clone(),
                        found,
                        expected: spec.partitions,
                    });
                }
                if found != spec.partitions {
                    tracing::warn!(
                        queue = %queue.name,
                        topic = %spec.name,
                        "topic has {found} partitions, the primary has {}",
                        spec.partitions
                    );
                }
                report.existing.push(spec.name.clone());
            }
            None => missing.push(spec),
        }
    }
    if missing.is_empty() {
        return Ok(report);
    }
    let new_topics: Vec<NewTopic<'_>> = missing
        .iter()
        .map(|spec| {
            spec.configs.iter().fold(
                NewTopic::new(
                    &spec.name,
                    spec.partitions,
                    TopicReplication::Fixed(spec.replication_factor),
                ),
                |t, (k, v)| t.set(k, v),
            )
        })
        .collect();
    let opts = AdminOptions::new()
        .request_timeout(Some(timeout))
        .operation_timeout(Some(timeout));
    let results = admin
        .create_topics(&new_topics, &opts)
        .await
        .map_err(|error| TopicSetupError::Kafka {
            queue: queue.name.clone(),
            error,
        })?;
    for result in results {
        match result {
            Ok(topic) => {
                tracing::info!(queue = %queue.name, %topic, "created topic");
                report.created.push(topic);
            }
            // Another dispatcher instance created it between our look and our create.
            Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => report.existing.push(topic),
            Err((topic, code)) => {
                return Err(TopicSetupError::Create {
                    queue: queue.name.clone(),
                    topic,
                    code,
                })
            }
        }
    }
    Ok(report)
}

/// Every topic in the cluster with (partitions, replication factor). Asks for
/// all topics rather than the ones we want: asking for a missing topic by
/// name would auto-create it on a broker with `auto.create.topics.enable`.
async fn topic_partitions(
    admin: &Arc<AdminClient<DefaultClientContext>>,
    queue: &QueueConfig,
    timeout: Duration,
) -> Result<HashMap<String, (i32, i32)>, TopicSetupError> {
    let admin = Arc::clone(admin);
    let metadata = tokio::task::spawn_blocking(move || admin.inner().fetch_metadata(None, timeout))
        .await
        .expect("metadata task does not panic")
        .map_err(|error| TopicSetupError::Kafka {
            queue: queue.name.clone(),
            error,
        })?;
    Ok(metadata
        .topics()
        .iter()
        .filter(|t| t.error().is_none())
        .map(|t| {
            let rf = t
                .partitions()
                .first()
                .map_or(1, |p| p.replicas().len() as i32);
            (t.name().to_string(), (t.partitions().len() as i32, rf))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{format_duration, Config};

    fn queue(extra: &str) -> QueueConfig {
        Config::parse(
            &format!("[[queue]]\nname = \"jobs\"\ntopic = \"jobs\"\n{extra}"),
            "t.toml",
            std::path::Path::new("."),
        )
        .unwrap()
        .queues
        .remove(0)
    }

    fn primary(retention_ms: i64) -> PrimaryTopic {
        PrimaryTopic {
            name: "jobs".into(),
            partitions: 6,
            replication_factor: 3,
            retention_ms,
            min_insync_replicas: Some("2".into()),
        }
    }

    fn by_name(specs: &[TopicSpec], name: &str) -> TopicSpec {
        specs.iter().find(|s| s.name == name).unwrap().clone()
    }

    /// The config's rule that two queues share no topic lists the derived
    /// topics itself (it runs before any broker is asked); every topic the
    /// plan creates must be in that list.
    #[test]
    fn no_other_queue_may_use_a_topic_the_plan_creates() {
        for extra in ["", "ordered = true\n"] {
            for spec in plan(&queue(extra), &primary(1_000)) {
                let text = format!(
                    "[[queue]]\nname = \"jobs\"\ntopic = \"jobs\"\n{extra}\
                     [[queue]]\nname = \"other\"\ntopic = \"{}\"\n",
                    spec.name
                );
                let e = Config::parse(&text, "t.toml", std::path::Path::new("."))
                    .expect_err(&spec.name)
                    .to_string();
                assert!(
                    e.contains(&format!("topic \"{}\" is already used", spec.name)),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn the_plan_has_every_tier_then_the_dlq_then_the_ack_log() {
        let specs = plan(&queue(""), &primary(604_800_000));
        let names: Vec<_> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "jobs.retry.10s",
                "jobs.retry.1m",
                "jobs.retry.10m",
                "jobs.retry.1h",
                "jobs.dlq",
                "jobs.acklog",
                "jobs.dedupe",
                "jobs.index",
                "jobs.dlq.redrive",
                "jobs.control"
            ]
        );
        assert!(specs
            .iter()
            .filter(|s| s.role != TopicRole::Control)
            .all(|s| s.partitions == 6 && s.replication_factor == 3));
        assert!(specs
            .iter()
            .all(|s| s.configs["min.insync.replicas"] == "2"));
        assert_eq!(specs[1].role, TopicRole::RetryTier(Duration::from_secs(60)));
    }

    #[test]
    fn an_ordered_queue_gets_a_hold_topic_shaped_like_its_dlq() {
        assert!(!plan(&queue(""), &primary(1_000))
            .iter()
            .any(|s| s.role == TopicRole::Hold));
        let specs = plan(&queue("ordered = true"), &primary(1_000));
        let hold = by_name(&specs, "jobs.hold");
        assert_eq!(hold.role, TopicRole::Hold);
        assert_eq!((hold.partitions, hold.replication_factor), (6, 3));
        assert_eq!(hold.configs["retention.ms"], "2000");
        assert_eq!(hold.configs["min.insync.replicas"], "2");
    }

    #[test]
    fn the_dlq_keeps_messages_twice_as_long_as_the_primary() {
        let specs = plan(&queue(""), &primary(604_800_000));
        assert_eq!(
            by_name(&specs, "jobs.dlq").configs["retention.ms"],
            "1209600000"
        );
        let infinite = plan(&queue(""), &primary(-1));
        assert_eq!(by_name(&infinite, "jobs.dlq").configs["retention.ms"], "-1");
        let huge = plan(&queue(""), &primary(i64::MAX / 2 + 1));
        assert_eq!(
            by_name(&huge, "jobs.dlq").configs["retention.ms"],
            i64::MAX.to_string()
        );
    }

    #[test]
    fn a_retry_tier_outlives_the_primary_by_its_delay() {
        let specs = plan(&queue(""), &primary(1_000));
        assert_eq!(
            by_name(&specs, "jobs.retry.1h").configs["retention.ms"],
            "3601000"
        );
        let infinite = plan(&queue(""), &primary(-1));
        assert_eq!(
            by_name(&infinite, "jobs.retry.10s").configs["retention.ms"],
            "-1"
        );
    }

    #[test]
    fn the_ack_log_is_compacted_and_named_by_the_config() {
        let specs = plan(
            &queue("ack_log_topic = \"acks\"\ndlq_topic = \"dead\"\n"),
            &PrimaryTopic {
                min_insync_replicas: None,
                ..primary(1)
            },
        );
        let ack = by_name(&specs, "acks");
        assert_eq!(ack.role, TopicRole::AckLog);
        assert_eq!(
            ack.configs,
            BTreeMap::from([("cleanup.policy".to_string(), "compact".to_string())])
        );
        assert_eq!(by_name(&specs, "dead").role, TopicRole::Dlq);
    }

    #[test]
    fn the_dedupe_topic_forgets_after_the_window() {
        let specs = plan(&queue("dedupe_window = \"2m\"\n"), &primary(1));
        let d = by_name(&specs, "jobs.dedupe");
        assert_eq!(d.role, TopicRole::Dedupe);
        assert_eq!(d.configs["cleanup.policy"], "compact,delete");
        assert_eq!(d.configs["retention.ms"], "120000");
        assert_eq!(d.configs["segment.ms"], "120000");
    }

    #[test]
    fn the_index_outlives_the_dlq_copies_it_names() {
        let specs = plan(&queue(""), &primary(1_000));
        let i = by_name(&specs, "jobs.index");
        assert_eq!(i.role, TopicRole::Index);
        assert_eq!(i.configs["cleanup.policy"], "compact,delete");
        assert_eq!(
            i.configs["retention.ms"],
            by_name(&specs, "jobs.dlq").configs["retention.ms"]
        );
        let infinite = plan(&queue(""), &primary(-1));
        assert_eq!(
            by_name(&infinite, "jobs.index").configs["retention.ms"],
            "-1"
        );
    }

    #[test]
    fn the_redrive_marks_are_compacted_and_kept_as_long_as_the_dlq() {
        let specs = plan(&queue(""), &primary(1_000));
        let m = by_name(&specs, "jobs.dlq.redrive");
        assert_eq!(m.role, TopicRole::RedriveMarks);
        assert_eq!(m.configs["cleanup.policy"], "compact,delete");
        assert_eq!(m.configs["retention.ms"], "2000");
    }

    #[test]
    fn the_control_topic_has_one_partition_and_is_never_deleted() {
        let specs = plan(&queue(""), &primary(1_000));
        let c = by_name(&specs, "jobs.control");
        assert_eq!(c.role, TopicRole::Control);
        assert_eq!((c.partitions, c.replication_factor), (1, 3));
        assert_eq!(
            c.configs,
            BTreeMap::from([
                ("cleanup.policy".to_string(), "compact".to_string()),
                ("min.insync.replicas".to_string(), "2".to_string()),
            ])
        );
    }

    #[test]
    fn tier_topics_use_the_canonical_duration() {
        let specs = plan(&queue("retry_tiers = [\"30s\", \"120s\"]\n"), &primary(1));
        assert_eq!(specs[0].name, "jobs.retry.30s");
        assert_eq!(specs[1].name, "jobs.retry.2m");
        assert_eq!(format_duration(Duration::from_secs(120)), "2m");
    }
}
