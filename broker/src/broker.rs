//! The state every connection shares, and the operations several handlers
//! need (topic creation is used by CreateTopics and by Metadata auto-create).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use kafka_protocol::ResponseError;
use uuid::Uuid;

use crate::config::{ServerConfig, TopicConfigError, TopicConfigs};
use crate::metadata::{
    placement, MetadataCommand, MetadataController, MetadataError, MetadataImage, MetadataOutcome,
    PartitionImage,
};
use crate::replica_manager::ReplicaManager;
use crate::replication::fetcher::{BrokerFetcherEnv, FetcherConfig, ReplicaFetcherManager};
use crate::types::{LeaderEpoch, NodeId};

/// How many producer ids this node takes from the quorum at a time.
const PRODUCER_ID_BLOCK_SIZE: i64 = 1000;

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub struct Broker {
    pub config: ServerConfig,
    pub metadata: MetadataController,
    pub replicas: Arc<ReplicaManager>,
    /// The follower side of replication: fetch sessions to the leaders.
    pub fetchers: Arc<ReplicaFetcherManager>,
    /// The group coordinator (every group, on a single node).
    pub groups: crate::coordinator::GroupService,
    producer_ids: Mutex<(i64, i64)>,
}

/// Why a topic could not be created, with the Kafka code each maps to.
#[derive(Debug, thiserror::Error)]
pub enum CreateTopicError {
    #[error("Topic '{0}' already exists.")]
    TopicAlreadyExists(String),
    #[error("{0}")]
    InvalidTopic(String),
    #[error("Number of partitions must be larger than 0.")]
    InvalidPartitions,
    #[error("{0}")]
    InvalidReplicationFactor(String),
    #[error("{0}")]
    InvalidReplicaAssignment(String),
    #[error(transparent)]
    InvalidConfig(#[from] TopicConfigError),
    #[error("{0}")]
    Metadata(MetadataError),
}

impl CreateTopicError {
    pub fn code(&self) -> i16 {
        match self {
            CreateTopicError::TopicAlreadyExists(_) => ResponseError::TopicAlreadyExists,
            CreateTopicError::InvalidTopic(_) => ResponseError::InvalidTopicException,
            CreateTopicError::InvalidPartitions => ResponseError::InvalidPartitions,
            CreateTopicError::InvalidReplicationFactor(_) => {
                ResponseError::InvalidReplicationFactor
            }
            CreateTopicError::InvalidReplicaAssignment(_) => {
                ResponseError::InvalidReplicaAssignment
            }
            CreateTopicError::InvalidConfig(_) => ResponseError::InvalidConfig,
            CreateTopicError::Metadata(e) => metadata_error(e),
        }
        .code()
    }
}

/// The Kafka error for a metadata-quorum failure.
pub fn metadata_error(e: &MetadataError) -> ResponseError {
    match e {
        MetadataError::TopicAlreadyExists(_) => ResponseError::TopicAlreadyExists,
        MetadataError::UnknownTopic(_) => ResponseError::UnknownTopicOrPartition,
        MetadataError::InvalidPartitions(_) => ResponseError::InvalidPartitions,
        MetadataError::InvalidProducerIdCount(_) => ResponseError::UnknownServerError,
        MetadataError::NotController { .. } => ResponseError::NotController,
        MetadataError::UnknownTopicOrPartition(..) => ResponseError::UnknownTopicOrPartition,
        MetadataError::FencedLeaderEpoch { .. } => ResponseError::FencedLeaderEpoch,
        MetadataError::InvalidUpdateVersion(_) => ResponseError::InvalidUpdateVersion,
        MetadataError::IneligibleReplica(_) => ResponseError::IneligibleReplica,
        MetadataError::InvalidRequest(_) => ResponseError::InvalidRequest,
        MetadataError::Fatal(_) => ResponseError::UnknownServerError,
    }
}

/// Kafka's topic-name rule: 1..=249 chars of `[a-zA-Z0-9._-]`, not `.`/`..`.
pub fn validate_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("Topic name is illegal, it can't be empty".into());
    }
    if name == "." || name == ".." {
        return Err("Topic name cannot be \".\" or \"..\"".into());
    }
    if name.len() > 249 {
        return Err(format!(
            "Topic name is illegal, it can't be longer than 249 characters, topic name: {name}"
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(format!(
            "Topic name {name} is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
        ));
    }
    Ok(())
}

/// A request to create one topic, already in our terms.
pub struct NewTopic {
    pub name: String,
    pub num_partitions: i32,
    pub replication_factor: i16,
    pub assignments: Vec<(i32, Vec<i32>)>,
    pub configs: BTreeMap<String, String>,
}

impl Broker {
    pub fn new(config: ServerConfig, metadata: MetadataController) -> Self {
        let replicas = Arc::new(ReplicaManager::new(config.clone()));
        let fetchers = Arc::new(ReplicaFetcherManager::new(
            config.node_id,
            FetcherConfig::from_server(&config),
            Arc::new(BrokerFetcherEnv {
                replicas: replicas.clone(),
                images: metadata.subscribe(),
            }),
        ));
        let groups = crate::coordinator::GroupService::new(&config, replicas.clone());
        Self {
            groups,
            config,
            metadata,
            replicas,
            fetchers,
            producer_ids: Mutex::new((0, 0)),
        }
    }

    pub fn node_id(&self) -> NodeId {
        self.config.node_id
    }

    /// Applies the latest metadata image to the local partitions, on a
    /// blocking thread: opening a partition recovers its log, and deleting
    /// one removes its files, neither of which may stall an async worker.
    pub async fn sync_replicas(&self) -> Result<(), crate::error::PartitionError> {
        let _turn = self.replicas.reconcile_turn.lock().await;
        let replicas = self.replicas.clone();
        let images = self.metadata.subscribe();
        let fetchers = self.fetchers.clone();
        tokio::task::spawn_blocking(move || {
            replicas.reconcile(
                || images.borrow().clone(),
                now_ms(),
                |followed| fetchers.update(followed),
            )
        })
        .await
        .map_err(|e| {
            crate::error::PartitionError::Storage(format!("applying the metadata image: {e}"))
        })?
    }

    /// Validates a new topic and, unless `validate_only`, creates it through
    /// the quorum and opens its partitions before returning.
    pub async fn create_topic(
        &self,
        t: NewTopic,
        validate_only: bool,
    ) -> Result<(Uuid, Vec<PartitionImage>), CreateTopicError> {
        validate_topic_name(&t.name).map_err(CreateTopicError::InvalidTopic)?;
        if self.metadata.image().topics.contains_key(&t.name) {
            return Err(CreateTopicError::TopicAlreadyExists(t.name));
        }
        TopicConfigs::validate_overrides(t.configs.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
        let image = self.metadata.image();
        let brokers: Vec<NodeId> = if image.brokers.is_empty() {
            vec![self.node_id()]
        } else {
            image.brokers.keys().copied().collect()
        };
        let partitions: Vec<PartitionImage> = if !t.assignments.is_empty() {
            if t.num_partitions != -1 || t.replication_factor != -1 {
                return Err(CreateTopicError::InvalidReplicaAssignment(
                    "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at the same time.".into(),
                ));
            }
            let mut out = Vec::new();
            for (i, (index, ids)) in t.assignments.iter().enumerate() {
                if *index != i as i32 || ids.is_empty() {
                    return Err(CreateTopicError::InvalidReplicaAssignment(format!(
                        "Invalid replica assignment for partition {index}"
                    )));
                }
                let replicas: Vec<NodeId> = ids.iter().map(|&b| NodeId(b)).collect();
                if let Some(unknown) = replicas.iter().find(|r| !brokers.contains(r)) {
                    return Err(CreateTopicError::InvalidReplicaAssignment(format!(
                        "The manual partition assignment includes broker {unknown}, but no such broker is registered."
                    )));
                }
                out.push(partition_image(*index, replicas));
            }
            out
        } else {
            let n = if t.num_partitions == -1 {
                self.config.num_partitions
            } else {
                t.num_partitions
            };
            if n < 1 {
                return Err(CreateTopicError::InvalidPartitions);
            }
            let rf = if t.replication_factor == -1 {
                self.config.default_replication_factor
            } else {
                t.replication_factor
            };
            self.place_replicas(&image, 0, n, rf)
                .map_err(|e| CreateTopicError::InvalidReplicationFactor(e.to_string()))?
                .into_iter()
                .enumerate()
                .map(|(p, replicas)| partition_image(p as i32, replicas))
                .collect()
        };
        let topic_id = Uuid::new_v4();
        if validate_only {
            return Ok((topic_id, partitions));
        }
        self.metadata
            .propose(MetadataCommand::CreateTopic {
                name: t.name.clone(),
                topic_id,
                partitions: partitions.clone(),
                configs: t.configs,
            })
            .await
            .map_err(|e| match e {
                MetadataError::TopicAlreadyExists(n) => CreateTopicError::TopicAlreadyExists(n),
                other => CreateTopicError::Metadata(other),
            })?;
        self.sync_replicas()
            .await
            .map_err(|e| CreateTopicError::Metadata(MetadataError::Fatal(e.to_string())))?;
        if t.name == crate::coordinator::OFFSETS_TOPIC {
            self.groups
                .sync_ownership(self)
                .await
                .map_err(|e| CreateTopicError::Metadata(MetadataError::Fatal(e.to_string())))?;
        }
        Ok((topic_id, partitions))
    }

    /// Kafka's replica placement over the registered, unfenced brokers (this
    /// node alone before it has registered), from a random start.
    pub fn place_replicas(
        &self,
        image: &MetadataImage,
        first: i32,
        count: i32,
        replication_factor: i16,
    ) -> Result<Vec<Vec<NodeId>>, placement::PlacementError> {
        let mut candidates: Vec<placement::Candidate> = image
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .map(|b| placement::Candidate {
                node_id: b.node_id,
                rack: b.rack.clone(),
            })
            .collect();
        if image.brokers.is_empty() {
            candidates.push(placement::Candidate {
                node_id: self.node_id(),
                rack: self.config.broker_rack.clone(),
            });
        }
        let random = Uuid::new_v4().as_u128();
        let (start, shift) = ((random >> 64) as usize, random as u64 as usize);
        placement::assign(&candidates, first, count, replication_factor, start, shift)
    }

    /// Hands out the next producer id, taking a new block from the quorum
    /// when the current one is used up. Ids are never reused, even across
    /// restarts, because blocks are replicated state.
    pub async fn next_producer_id(&self) -> Result<i64, MetadataError> {
        {
            let mut ids = self.producer_ids.lock().expect("poisoned");
            if ids.0 < ids.1 {
                ids.0 += 1;
                return Ok(ids.0 - 1);
            }
        }
        let outcome = self
            .metadata
            .propose(MetadataCommand::AllocateProducerIds {
                count: PRODUCER_ID_BLOCK_SIZE,
            })
            .await?;
        let MetadataOutcome::ProducerIdBlock { first, count } = outcome else {
            return Err(MetadataError::Fatal("expected a producer id block".into()));
        };
        let mut ids = self.producer_ids.lock().expect("poisoned");
        *ids = (first + 1, first + count);
        Ok(first)
    }
}

fn partition_image(partition: i32, replicas: Vec<NodeId>) -> PartitionImage {
    PartitionImage {
        partition,
        leader: replicas[0],
        isr: replicas.clone(),
        replicas,
        leader_epoch: LeaderEpoch(0),
        partition_epoch: 0,
    }
}
