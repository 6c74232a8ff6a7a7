//! The cluster metadata image: the replicated state machine's state and the
//! pure function that applies one command to it.
//!
//! Invariant: nothing here does I/O or reads a clock or a random source. Every
//! replica applies the same commands in the same order and must end in the same
//! image, so anything random (topic ids, the cluster id) is chosen by the
//! proposer and carried inside the command.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::types::{LeaderEpoch, NodeId};

/// Everything the cluster agrees on: brokers, topics and their partition
/// assignments, and the producer id high-water mark.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataImage {
    /// Empty until `InitCluster` has been applied.
    pub cluster_id: String,
    pub brokers: BTreeMap<NodeId, BrokerRegistration>,
    pub topics: BTreeMap<String, TopicImage>,
    /// The first producer id of the next block handed out. Only ever grows, so
    /// a producer id is never handed out twice, even across restarts.
    pub next_producer_id: i64,
}

/// A broker's advertised endpoint as it registered itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRegistration {
    pub node_id: NodeId,
    pub host: String,
    pub port: u16,
    pub rack: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicImage {
    pub name: String,
    #[serde(with = "uuid_text")]
    pub topic_id: Uuid,
    /// Indexed by partition number: `partitions[i].partition == i`.
    pub partitions: Vec<PartitionImage>,
    /// Only the configs overridden for this topic; defaults live in the broker config.
    pub configs: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionImage {
    pub partition: i32,
    pub replicas: Vec<NodeId>,
    pub isr: Vec<NodeId>,
    pub leader: NodeId,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: i32,
}

/// A change to the metadata image, proposed through Raft.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetadataCommand {
    /// Sets the cluster id. Only the first one applied takes effect, so a node
    /// that crashed between proposing it and seeing it applied can propose again
    /// without changing the id.
    InitCluster {
        cluster_id: String,
    },
    /// Adds a broker or replaces its earlier registration.
    RegisterBroker(BrokerRegistration),
    CreateTopic {
        name: String,
        #[serde(with = "uuid_text")]
        topic_id: Uuid,
        partitions: Vec<PartitionImage>,
        configs: BTreeMap<String, String>,
    },
    DeleteTopic {
        name: String,
    },
    /// Appends partitions to a topic; `partitions` holds only the new ones,
    /// numbered from the topic's current partition count.
    CreatePartitions {
        name: String,
        partitions: Vec<PartitionImage>,
    },
    /// Deletes the keys in `delete`, then sets the keys in `set`.
    AlterTopicConfigs {
        name: String,
        set: BTreeMap<String, String>,
        delete: Vec<String>,
    },
    /// Reserves `count` producer ids, returned as a block.
    AllocateProducerIds {
        count: i64,
    },
}

/// What applying a command produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetadataOutcome {
    Done,
    /// Producer ids `first .. first + count` now belong to the proposer.
    ProducerIdBlock {
        first: i64,
        count: i64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum MetadataError {
    #[error("topic {0} already exists")]
    TopicAlreadyExists(String),
    #[error("unknown topic {0}")]
    UnknownTopic(String),
    #[error("invalid partitions: {0}")]
    InvalidPartitions(String),
    /// A producer id block must hold at least one id and must not run past `i64::MAX`.
    #[error("invalid producer id block size {0}")]
    InvalidProducerIdCount(i64),
    /// This node is not the metadata leader; `leader` is the one it knows of.
    #[error("not the controller; leader is {leader:?}")]
    NotController { leader: Option<NodeId> },
    /// The metadata quorum on this node cannot continue (storage failure, stopped).
    #[error("metadata quorum failed: {0}")]
    Fatal(String),
}

impl MetadataImage {
    /// Applies one command. Deterministic: the same image and command always give
    /// the same result. A rejected command leaves the image unchanged, which is
    /// why every check runs before the first mutation.
    pub fn apply(&mut self, cmd: &MetadataCommand) -> Result<MetadataOutcome, MetadataError> {
        match cmd {
            MetadataCommand::InitCluster { cluster_id } => {
                if self.cluster_id.is_empty() {
                    self.cluster_id = cluster_id.clone();
                }
                Ok(MetadataOutcome::Done)
            }
            MetadataCommand::RegisterBroker(registration) => {
                self.brokers
                    .insert(registration.node_id, registration.clone());
                Ok(MetadataOutcome::Done)
            }
            MetadataCommand::CreateTopic {
                name,
                topic_id,
                partitions,
                configs,
            } => {
                if self.topics.contains_key(name) {
                    return Err(MetadataError::TopicAlreadyExists(name.clone()));
                }
                // Topic ids name a topic on the wire (Fetch v13+), so two live
                // topics must never share one.
                if self.topic_by_id(*topic_id).is_some() {
                    return Err(MetadataError::TopicAlreadyExists(name.clone()));
                }
                if partitions.is_empty() {
                    return Err(MetadataError::InvalidPartitions(format!(
                        "topic {name} needs at least one partition"
                    )));
                }
                check_partitions(name, 0, partitions)?;
                self.topics.insert(
                    name.clone(),
                    TopicImage {
                        name: name.clone(),
                        topic_id: *topic_id,
                        partitions: partitions.clone(),
                        configs: configs.clone(),
                    },
                );
                Ok(MetadataOutcome::Done)
            }
            MetadataCommand::DeleteTopic { name } => match self.topics.remove(name) {
                Some(_) => Ok(MetadataOutcome::Done),
                None => Err(MetadataError::UnknownTopic(name.clone())),
            },
            MetadataCommand::CreatePartitions { name, partitions } => {
                let topic = self
                    .topics
                    .get_mut(name)
                    .ok_or_else(|| MetadataError::UnknownTopic(name.clone()))?;
                if partitions.is_empty() {
                    return Err(MetadataError::InvalidPartitions(format!(
                        "no new partitions for topic {name}"
                    )));
                }
                let first = i32::try_from(topic.partitions.len()).map_err(|_| {
                    MetadataError::InvalidPartitions(format!(
                        "topic {name} has too many partitions"
                    ))
                })?;
                check_partitions(name, first, partitions)?;
                topic.partitions.extend(partitions.iter().cloned());
                Ok(MetadataOutcome::Done)
            }
            MetadataCommand::AlterTopicConfigs { name, set, delete } => {
                let topic = self
                    .topics
                    .get_mut(name)
                    .ok_or_else(|| MetadataError::UnknownTopic(name.clone()))?;
                for key in delete {
                    topic.configs.remove(key);
                }
                for (key, value) in set {
                    topic.configs.insert(key.clone(), value.clone());
                }
                Ok(MetadataOutcome::Done)
            }
            MetadataCommand::AllocateProducerIds { count } => {
                let count = *count;
                if count <= 0 {
                    return Err(MetadataError::InvalidProducerIdCount(count));
                }
                let first = self.next_producer_id;
                let next = first
                    .checked_add(count)
                    .ok_or(MetadataError::InvalidProducerIdCount(count))?;
                self.next_producer_id = next;
                Ok(MetadataOutcome::ProducerIdBlock { first, count })
            }
        }
    }

    pub fn topic_by_id(&self, id: Uuid) -> Option<&TopicImage> {
        self.topics.values().find(|topic| topic.topic_id == id)
    }
}

/// Checks that `partitions` are numbered `first, first + 1, ...` and that each
/// has at least one replica, so `TopicImage::partitions` stays indexable by
/// partition number.
fn check_partitions(
    name: &str,
    first: i32,
    partitions: &[PartitionImage],
) -> Result<(), MetadataError> {
    let mut expected = first;
    for partition in partitions {
        if partition.partition != expected {
            return Err(MetadataError::InvalidPartitions(format!(
                "topic {name}: expected partition {expected}, got {}",
                partition.partition
            )));
        }
        if partition.replicas.is_empty() {
            return Err(MetadataError::InvalidPartitions(format!(
                "topic {name} partition {expected} has no replicas"
            )));
        }
        expected = expected.checked_add(1).ok_or_else(|| {
            MetadataError::InvalidPartitions(format!("topic {name} has too many partitions"))
        })?;
    }
    Ok(())
}

/// Serializes a `Uuid` as its hyphenated text. The workspace builds `uuid`
/// without its `serde` feature, and turning it on would rebuild every crate
/// that shares `uuid` (kafka-protocol among them) for one field.
mod uuid_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use uuid::Uuid;

    pub fn serialize<S: Serializer>(id: &Uuid, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&id.hyphenated())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Uuid, D::Error> {
        let text = String::deserialize(deserializer)?;
        Uuid::parse_str(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partition(partition: i32) -> PartitionImage {
        PartitionImage {
            partition,
            replicas: vec![NodeId(1)],
            isr: vec![NodeId(1)],
            leader: NodeId(1),
            leader_epoch: LeaderEpoch(0),
            partition_epoch: 0,
        }
    }

    fn create(name: &str, count: i32) -> MetadataCommand {
        MetadataCommand::CreateTopic {
            name: name.to_string(),
            topic_id: Uuid::new_v4(),
            partitions: (0..count).map(partition).collect(),
            configs: BTreeMap::new(),
        }
    }

    #[test]
    fn create_topic_then_find_it_by_name_and_id() {
        let mut image = MetadataImage::default();
        let cmd = create("orders", 3);
        assert_eq!(image.apply(&cmd), Ok(MetadataOutcome::Done));
        let topic = &image.topics["orders"];
        assert_eq!(topic.partitions.len(), 3);
        assert_eq!(image.topic_by_id(topic.topic_id).unwrap().name, "orders");
        assert!(image.topic_by_id(Uuid::new_v4()).is_none());
    }

    #[test]
    fn duplicate_topic_is_rejected_and_leaves_image_unchanged() {
        let mut image = MetadataImage::default();
        image.apply(&create("orders", 1)).unwrap();
        let before = image.clone();
        assert_eq!(
            image.apply(&create("orders", 5)),
            Err(MetadataError::TopicAlreadyExists("orders".into()))
        );
        assert_eq!(image, before);
    }

    #[test]
    fn duplicate_topic_id_is_rejected() {
        let mut image = MetadataImage::default();
        image.apply(&create("a", 1)).unwrap();
        let topic_id = image.topics["a"].topic_id;
        let cmd = MetadataCommand::CreateTopic {
            name: "b".into(),
            topic_id,
            partitions: vec![partition(0)],
            configs: BTreeMap::new(),
        };
        assert!(matches!(
            image.apply(&cmd),
            Err(MetadataError::TopicAlreadyExists(_))
        ));
        assert!(!image.topics.contains_key("b"));
    }

    #[test]
    fn create_topic_rejects_bad_partition_numbering() {
        let mut image = MetadataImage::default();
        let cmd = MetadataCommand::CreateTopic {
            name: "t".into(),
            topic_id: Uuid::new_v4(),
            partitions: vec![partition(0), partition(2)],
            configs: BTreeMap::new(),
        };
        assert!(matches!(
            image.apply(&cmd),
            Err(MetadataError::InvalidPartitions(_))
        ));
        assert!(matches!(
            image.apply(&create("t", 0)),
            Err(MetadataError::InvalidPartitions(_))
        ));
        let mut no_replicas = partition(0);
        no_replicas.replicas.clear();
        let cmd = MetadataCommand::CreateTopic {
            name: "t".into(),
            topic_id: Uuid::new_v4(),
            partitions: vec![no_replicas],
            configs: BTreeMap::new(),
        };
        assert!(matches!(
            image.apply(&cmd),
            Err(MetadataError::InvalidPartitions(_))
        ));
        assert!(image.topics.is_empty());
    }

    #[test]
    fn delete_topic_and_unknown_topic() {
        let mut image = MetadataImage::default();
        image.apply(&create("t", 1)).unwrap();
        let delete = MetadataCommand::DeleteTopic { name: "t".into() };
        assert_eq!(image.apply(&delete), Ok(MetadataOutcome::Done));
        assert!(image.topics.is_empty());
        assert_eq!(
            image.apply(&delete),
            Err(MetadataError::UnknownTopic("t".into()))
        );
        // A deleted name can be created again.
        assert_eq!(image.apply(&create("t", 2)), Ok(MetadataOutcome::Done));
    }

    #[test]
    fn create_partitions_appends_in_order() {
        let mut image = MetadataImage::default();
        image.apply(&create("t", 2)).unwrap();
        let grow = MetadataCommand::CreatePartitions {
            name: "t".into(),
            partitions: vec![partition(2), partition(3)],
        };
        assert_eq!(image.apply(&grow), Ok(MetadataOutcome::Done));
        let numbers: Vec<i32> = image.topics["t"]
            .partitions
            .iter()
            .map(|p| p.partition)
            .collect();
        assert_eq!(numbers, vec![0, 1, 2, 3]);

        let before = image.clone();
        let overlapping = MetadataCommand::CreatePartitions {
            name: "t".into(),
            partitions: vec![partition(3)],
        };
        assert!(matches!(
            image.apply(&overlapping),
            Err(MetadataError::InvalidPartitions(_))
        ));
        let empty = MetadataCommand::CreatePartitions {
            name: "t".into(),
            partitions: vec![],
        };
        assert!(matches!(
            image.apply(&empty),
            Err(MetadataError::InvalidPartitions(_))
        ));
        let unknown = MetadataCommand::CreatePartitions {
            name: "nope".into(),
            partitions: vec![partition(0)],
        };
        assert_eq!(
            image.apply(&unknown),
            Err(MetadataError::UnknownTopic("nope".into()))
        );
        assert_eq!(image, before);
    }

    #[test]
    fn alter_configs_deletes_then_sets() {
        let mut image = MetadataImage::default();
        image.apply(&create("t", 1)).unwrap();
        let alter = MetadataCommand::AlterTopicConfigs {
            name: "t".into(),
            set: BTreeMap::from([
                ("retention.ms".to_string(), "1000".to_string()),
                ("cleanup.policy".to_string(), "compact".to_string()),
            ]),
            delete: vec![],
        };
        image.apply(&alter).unwrap();
        let alter = MetadataCommand::AlterTopicConfigs {
            name: "t".into(),
            set: BTreeMap::from([("retention.ms".to_string(), "2000".to_string())]),
            delete: vec!["cleanup.policy".into(), "retention.ms".into()],
        };
        image.apply(&alter).unwrap();
        assert_eq!(
            image.topics["t"].configs,
            BTreeMap::from([("retention.ms".to_string(), "2000".to_string())])
        );
        let unknown = MetadataCommand::AlterTopicConfigs {
            name: "nope".into(),
            set: BTreeMap::new(),
            delete: vec![],
        };
        assert_eq!(
            image.apply(&unknown),
            Err(MetadataError::UnknownTopic("nope".into()))
        );
    }

    #[test]
    fn producer_id_blocks_never_overlap() {
        let mut image = MetadataImage::default();
        let allocate = MetadataCommand::AllocateProducerIds { count: 1000 };
        assert_eq!(
            image.apply(&allocate),
            Ok(MetadataOutcome::ProducerIdBlock {
                first: 0,
                count: 1000
            })
        );
        assert_eq!(
            image.apply(&allocate),
            Ok(MetadataOutcome::ProducerIdBlock {
                first: 1000,
                count: 1000
            })
        );
        assert_eq!(image.next_producer_id, 2000);

        for count in [0, -5] {
            assert_eq!(
                image.apply(&MetadataCommand::AllocateProducerIds { count }),
                Err(MetadataError::InvalidProducerIdCount(count))
            );
        }
        assert_eq!(
            image.apply(&MetadataCommand::AllocateProducerIds { count: i64::MAX }),
            Err(MetadataError::InvalidProducerIdCount(i64::MAX))
        );
        assert_eq!(image.next_producer_id, 2000);
    }

    #[test]
    fn first_cluster_id_wins_and_brokers_reregister() {
        let mut image = MetadataImage::default();
        for id in ["first", "second"] {
            let cmd = MetadataCommand::InitCluster {
                cluster_id: id.into(),
            };
            assert_eq!(image.apply(&cmd), Ok(MetadataOutcome::Done));
        }
        assert_eq!(image.cluster_id, "first");

        for port in [9092, 9093] {
            let cmd = MetadataCommand::RegisterBroker(BrokerRegistration {
                node_id: NodeId(1),
                host: "localhost".into(),
                port,
                rack: None,
            });
            image.apply(&cmd).unwrap();
        }
        assert_eq!(image.brokers.len(), 1);
        assert_eq!(image.brokers[&NodeId(1)].port, 9093);
    }

    #[test]
    fn image_round_trips_through_json() {
        let mut image = MetadataImage::default();
        image.apply(&create("t", 2)).unwrap();
        image
            .apply(&MetadataCommand::AllocateProducerIds { count: 7 })
            .unwrap();
        let json = serde_json::to_vec(&image).unwrap();
        let back: MetadataImage = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, image);
    }
}
