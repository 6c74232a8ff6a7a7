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
    /// The transaction coordinator (the ids of the `__transaction_state`
    /// partitions this node leads).
    pub txn: crate::txn::service::TxnService,
    /// The share coordinator (the share-group state of the
    /// `__share_group_state` partitions this node leads).
    pub share_state: crate::share::coordinator::ShareCoordinator,
    /// This node's way to the share coordinator of any share-partition.
    pub share_persister: crate::share::persister::Persister,
    /// The share-partitions of the partitions this node leads.
    pub share_leaders: crate::share::leader::ShareLeaders,
    /// The share groups' dead-letter queue writer.
    pub share_dlq: crate::share::dlq::ShareDlq,
    /// The share sessions of the members fetching from this node.
    pub share_sessions: Mutex<crate::share::session::ShareSessions>,
    /// How this broker dials its peers' inter-broker listener.
    pub inter_broker_security: Arc<crate::security::peer::PeerSecurity>,
    producer_ids: Mutex<(i64, i64)>,
    /// SCRAM credentials from the metadata quorum, for the SASL listeners.
    credentials: Arc<dyn crate::security::sasl::CredentialSource>,
    /// Client quotas: the rates clients are measured at.
    pub quotas: Arc<crate::quota::QuotaManager>,
}

/// The most metadata records one CreateTopics or CreatePartitions request
/// may write: Kafka's `QuorumController.MAX_RECORDS_PER_USER_OP`. A topic
/// counts one record, one per config override and one per partition, as
/// Kafka's `TopicRecord`, `ConfigRecord`s and `PartitionRecord`s do. Fixed,
/// as in Kafka: clients and tools expect the same ceiling everywhere.
pub const MAX_RECORDS_PER_USER_OP: usize = 10_000;

/// The most partitions one CreateTopics request may ask for over all its
/// topics: Kafka's `ReplicationControlManager.MAX_PARTITIONS_PER_BATCH`,
/// checked before anything is placed or allocated.
pub const MAX_PARTITIONS_PER_BATCH: u64 = 10_000;

/// Kafka's message when a request asks for more than
/// [`MAX_PARTITIONS_PER_BATCH`] partitions.
pub const TOO_MANY_PARTITIONS: &str = "Excessively large number of partitions per request.";

/// Kafka's message when a request would write more than
/// [`MAX_RECORDS_PER_USER_OP`] records.
pub const TOO_MANY_RECORDS: &str = "Unable to perform excessively large batch operation.";

/// Counts a request refused for one of the two caps above.
pub fn count_operation_too_large(api: &'static str) {
    metrics::counter!("kafka_broker_operation_too_large_total", "api" => api).increment(1);
}

/// Why a topic could not be created, with the Kafka code each maps to.
#[derive(Debug, thiserror::Error)]
pub enum CreateTopicError {
    #[error("Topic '{0}' already exists.")]
    TopicAlreadyExists(String),
    #[error("{0}")]
    InvalidTopic(String),
    #[error("{0}")]
    InvalidPartitions(String),
    #[error("{0}")]
    InvalidReplicationFactor(String),
    #[error("{0}")]
    InvalidReplicaAssignment(String),
    /// Both a manual assignment and a partition count or replication factor.
    #[error("{0}")]
    InvalidRequest(String),
    /// Over [`MAX_PARTITIONS_PER_BATCH`] or [`MAX_RECORDS_PER_USER_OP`].
    #[error("{0}")]
    TooLarge(&'static str),
    #[error(transparent)]
    InvalidConfig(#[from] TopicConfigError),
    #[error("Null value not supported for topic configs: {0}")]
    NullConfig(String),
    #[error("{0}")]
    Metadata(MetadataError),
}

impl CreateTopicError {
    pub fn code(&self) -> i16 {
        match self {
            CreateTopicError::TopicAlreadyExists(_) => ResponseError::TopicAlreadyExists,
            CreateTopicError::InvalidTopic(_) => ResponseError::InvalidTopicException,
            CreateTopicError::InvalidPartitions(_) => ResponseError::InvalidPartitions,
            CreateTopicError::InvalidReplicationFactor(_) => {
                ResponseError::InvalidReplicationFactor
            }
            CreateTopicError::InvalidReplicaAssignment(_) => {
                ResponseError::InvalidReplicaAssignment
            }
            CreateTopicError::InvalidRequest(_) => ResponseError::InvalidRequest,
            CreateTopicError::TooLarge(_) => ResponseError::PolicyViolation,
            CreateTopicError::InvalidConfig(_) | CreateTopicError::NullConfig(_) => {
                ResponseError::InvalidConfig
            }
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
        MetadataError::ElectionNotNeeded => ResponseError::ElectionNotNeeded,
        MetadataError::PreferredLeaderNotAvailable(_) => ResponseError::PreferredLeaderNotAvailable,
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

impl NewTopic {
    /// The partitions this topic asks for, as Kafka's
    /// `validateTotalNumberOfPartitions` counts them: the default for -1,
    /// nothing for an invalid count, the assignments when given.
    pub fn requested_partitions(&self, default_partitions: i32) -> u64 {
        if !self.assignments.is_empty() {
            return self.assignments.len() as u64;
        }
        match self.num_partitions {
            -1 => u64::try_from(default_partitions).unwrap_or(0),
            n if n > 0 => n as u64,
            _ => 0,
        }
    }
}

/// A topic that passed every check, with its partitions placed: what
/// CreateTopics proposes (or, validate-only, reports).
pub struct ValidatedTopic {
    pub name: String,
    pub topic_id: Uuid,
    pub partitions: Vec<PartitionImage>,
    pub configs: BTreeMap<String, String>,
}

impl ValidatedTopic {
    /// The metadata records Kafka would write for it (see
    /// [`MAX_RECORDS_PER_USER_OP`]).
    pub fn records(&self) -> usize {
        1 + self.configs.len() + self.partitions.len()
    }
}

/// Kafka's `validateManualPartitionAssignment`, plus its check that some
/// replica can lead: the replicas of one partition are registered brokers,
/// each named once, as many as `replication_factor` when one is set. Returns
/// the in-sync replicas a new partition starts with (the active ones, in
/// assignment order).
pub fn validate_manual_assignment(
    registered: &[NodeId],
    active: &[NodeId],
    partition: i32,
    replicas: &[NodeId],
    replication_factor: Option<usize>,
) -> Result<Vec<NodeId>, String> {
    if replicas.is_empty() {
        return Err("The manual partition assignment includes an empty replica list.".into());
    }
    let mut sorted = replicas.to_vec();
    sorted.sort();
    let mut previous = None;
    for &id in &sorted {
        if !registered.contains(&id) {
            return Err(format!(
                "The manual partition assignment includes broker {id}, but no such broker is registered."
            ));
        }
        if previous == Some(id) {
            return Err(format!(
                "The manual partition assignment includes the broker {id} more than once."
            ));
        }
        previous = Some(id);
    }
    if let Some(rf) = replication_factor.filter(|&rf| rf != sorted.len()) {
        return Err(format!(
            "The manual partition assignment includes a partition with {} replica(s), but this is not consistent with previous partitions, which have {rf} replica(s).",
            sorted.len()
        ));
    }
    let isr: Vec<NodeId> = replicas
        .iter()
        .copied()
        .filter(|r| active.contains(r))
        .collect();
    if isr.is_empty() {
        return Err(format!(
            "All brokers specified in the manual partition assignment for partition {partition} are fenced or in controlled shutdown."
        ));
    }
    Ok(isr)
}

impl Broker {
    pub fn new(
        config: ServerConfig,
        metadata: MetadataController,
        inter_broker_security: Arc<crate::security::peer::PeerSecurity>,
    ) -> Self {
        let replicas = Arc::new(ReplicaManager::new(config.clone()));
        let fetchers = Arc::new(ReplicaFetcherManager::new(
            config.node_id,
            FetcherConfig::from_server(&config),
            Arc::new(BrokerFetcherEnv {
                replicas: replicas.clone(),
                images: metadata.subscribe(),
                security: inter_broker_security.clone(),
            }),
        ));
        let groups = crate::coordinator::GroupService::new(&config, replicas.clone());
        let txn = crate::txn::service::TxnService::new(&config);
        let share_state = crate::share::coordinator::ShareCoordinator::new(
            config.share.snapshot_updates_per_snapshot,
        );
        let credentials = Arc::new(crate::security::credentials::MetadataCredentials::new(
            metadata.subscribe(),
        ));
        let quotas = Arc::new(crate::quota::QuotaManager::new(
            crate::quota::rate::RateConfig::from_config(&config),
        ));
        Self {
            inter_broker_security,
            groups,
            txn,
            share_state,
            share_persister: Default::default(),
            share_leaders: Default::default(),
            share_dlq: Default::default(),
            share_sessions: Mutex::new(crate::share::session::ShareSessions::new(
                config.share.max_share_sessions,
            )),
            config,
            metadata,
            replicas,
            fetchers,
            producer_ids: Mutex::new((0, 0)),
            credentials,
            quotas,
        }
    }

    pub fn scram_credentials(&self) -> Arc<dyn crate::security::sasl::CredentialSource> {
        self.credentials.clone()
    }

    pub fn node_id(&self) -> NodeId {
        self.config.node_id
    }

    /// The partition of internal topic `topic` that holds `key` (a group,
    /// a transactional id, a share-partition): Kafka's hash over the
    /// topic's actual partition count, or over `configured` while the topic
    /// does not exist.
    pub fn internal_partition_for(&self, topic: &str, key: &str, configured: i32) -> i32 {
        let count = self
            .metadata
            .image()
            .topics
            .get(topic)
            .map(|t| t.partitions.len() as i32)
            .filter(|&n| n > 0)
            .unwrap_or(configured);
        crate::group::offsets::partition_for(key, count)
    }

    /// What a coordinator on internal topic `topic` follows: the topic's
    /// partition count (0 while it does not exist) and the leader epoch of
    /// each partition this node leads and has open.
    pub fn led_partitions(&self, topic: &str) -> (i32, BTreeMap<i32, i32>) {
        let image = self.metadata.image();
        let me = self.node_id();
        match image.topics.get(topic) {
            Some(t) => (
                t.partitions.len() as i32,
                t.partitions
                    .iter()
                    .filter(|p| {
                        p.leader == me
                            && self
                                .replicas
                                .get(&crate::types::TopicPartition::new(topic, p.partition))
                                .is_some()
                    })
                    .map(|p| (p.partition, p.leader_epoch.0))
                    .collect(),
            ),
            None => (0, BTreeMap::new()),
        }
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
    /// the quorum and opens its partitions before returning. For callers
    /// that create one topic (auto-creation, internal topics); CreateTopics
    /// validates the whole request first.
    pub async fn create_topic(
        &self,
        t: NewTopic,
        validate_only: bool,
    ) -> Result<(Uuid, Vec<PartitionImage>), CreateTopicError> {
        if t.requested_partitions(self.config.num_partitions) > MAX_PARTITIONS_PER_BATCH {
            count_operation_too_large("CreateTopics");
            return Err(CreateTopicError::TooLarge(TOO_MANY_PARTITIONS));
        }
        let topic = self.validate_new_topic(t)?;
        if topic.records() > MAX_RECORDS_PER_USER_OP {
            count_operation_too_large("CreateTopics");
            return Err(CreateTopicError::TooLarge(TOO_MANY_RECORDS));
        }
        let result = (topic.topic_id, topic.partitions.clone());
        if !validate_only {
            self.create_validated(topic).await?;
        }
        Ok(result)
    }

    /// Kafka's checks of one CreateTopics entry, in its order (name, existence,
    /// configs, then the assignment or the partition count and replication
    /// factor), and the placement of its partitions. Nothing is allocated per
    /// partition before the count is known to be within
    /// [`MAX_PARTITIONS_PER_BATCH`].
    pub fn validate_new_topic(&self, t: NewTopic) -> Result<ValidatedTopic, CreateTopicError> {
        validate_topic_name(&t.name).map_err(CreateTopicError::InvalidTopic)?;
        let image = self.metadata.image();
        if image.topics.contains_key(&t.name) {
            return Err(CreateTopicError::TopicAlreadyExists(t.name));
        }
        TopicConfigs::validate_overrides(
            &self.config,
            &image.dynamic_broker_configs(self.node_id()),
            t.configs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        )?;
        if t.requested_partitions(self.config.num_partitions) > MAX_PARTITIONS_PER_BATCH {
            return Err(CreateTopicError::TooLarge(TOO_MANY_PARTITIONS));
        }
        let partitions: Vec<PartitionImage> = if !t.assignments.is_empty() {
            if t.replication_factor != -1 {
                return Err(CreateTopicError::InvalidRequest(
                    "A manual partition assignment was specified, but replication factor was not set to -1.".into(),
                ));
            }
            if t.num_partitions != -1 {
                return Err(CreateTopicError::InvalidRequest(
                    "A manual partition assignment was specified, but numPartitions was not set to -1.".into(),
                ));
            }
            let (registered, active) = self.registered_and_active(&image);
            let mut by_index: BTreeMap<i32, PartitionImage> = BTreeMap::new();
            let mut replication_factor = None;
            for (index, ids) in &t.assignments {
                if by_index.contains_key(index) {
                    return Err(CreateTopicError::InvalidReplicaAssignment(format!(
                        "Found multiple manual partition assignments for partition {index}"
                    )));
                }
                let replicas: Vec<NodeId> = ids.iter().map(|&b| NodeId(b)).collect();
                let isr = validate_manual_assignment(
                    &registered,
                    &active,
                    *index,
                    &replicas,
                    replication_factor,
                )
                .map_err(CreateTopicError::InvalidReplicaAssignment)?;
                replication_factor = Some(replicas.len());
                by_index.insert(*index, partition_with_isr(*index, replicas, isr));
            }
            // Indexes 0..n with n entries: the map's keys are exactly 0..n.
            let consecutive = by_index
                .keys()
                .enumerate()
                .all(|(i, &index)| i64::from(index) == i as i64);
            if !consecutive {
                return Err(CreateTopicError::InvalidReplicaAssignment(
                    "partitions should be a consecutive 0-based integer sequence".into(),
                ));
            }
            by_index.into_values().collect()
        } else if t.replication_factor < -1 || t.replication_factor == 0 {
            return Err(CreateTopicError::InvalidReplicationFactor(
                "Replication factor must be larger than 0, or -1 to use the default value.".into(),
            ));
        } else if t.num_partitions < -1 || t.num_partitions == 0 {
            return Err(CreateTopicError::InvalidPartitions(
                "Number of partitions was set to an invalid non-positive value.".into(),
            ));
        } else {
            let n = if t.num_partitions == -1 {
                self.config.num_partitions
            } else {
                t.num_partitions
            };
            if n < 1 {
                return Err(CreateTopicError::InvalidPartitions(
                    "Number of partitions was set to an invalid non-positive value.".into(),
                ));
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
        Ok(ValidatedTopic {
            name: t.name,
            topic_id: Uuid::new_v4(),
            partitions,
            configs: t.configs,
        })
    }

    /// Proposes a validated topic to the quorum and opens its partitions.
    pub async fn create_validated(&self, t: ValidatedTopic) -> Result<(), CreateTopicError> {
        let name = t.name.clone();
        self.metadata
            .propose(MetadataCommand::CreateTopic {
                name: t.name,
                topic_id: t.topic_id,
                partitions: t.partitions,
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
        if name == crate::coordinator::OFFSETS_TOPIC {
            self.groups
                .sync_ownership(self)
                .await
                .map_err(|e| CreateTopicError::Metadata(MetadataError::Fatal(e.to_string())))?;
        }
        Ok(())
    }

    /// The brokers a manual assignment may name (registered) and those that
    /// may lead or be in sync at creation (registered and unfenced). Before
    /// this node has registered, it is both.
    pub fn registered_and_active(&self, image: &MetadataImage) -> (Vec<NodeId>, Vec<NodeId>) {
        if image.brokers.is_empty() {
            return (vec![self.node_id()], vec![self.node_id()]);
        }
        let registered = image.brokers.keys().copied().collect();
        let active = image
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .map(|b| b.node_id)
            .collect();
        (registered, active)
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
    let isr = replicas.clone();
    partition_with_isr(partition, replicas, isr)
}

/// A new partition led by the first of `isr` (never empty).
pub fn partition_with_isr(
    partition: i32,
    replicas: Vec<NodeId>,
    isr: Vec<NodeId>,
) -> PartitionImage {
    PartitionImage {
        partition,
        leader: isr[0],
        isr,
        replicas,
        leader_epoch: LeaderEpoch(0),
        partition_epoch: 0,
    }
}
