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
    /// SCRAM credentials by user, then by mechanism (Kafka's
    /// `UserScramCredentialRecord`s): never the password, only what a
    /// server needs to check a proof.
    #[serde(default)]
    pub scram_credentials: BTreeMap<String, BTreeMap<i8, StoredScramCredential>>,
    /// ACL bindings (Kafka's `AccessControlEntryRecord`s), indexed for the
    /// authorizer.
    #[serde(default)]
    pub acls: crate::authz::AclSet,
    /// Client quotas by entity (Kafka's `QuotaRecord`s): each entity's
    /// quota keys and values. Stored as a list of pairs: JSON maps need
    /// string keys.
    #[serde(default, with = "pairs")]
    pub client_quotas: BTreeMap<ClientQuotaEntity, BTreeMap<String, QuotaValue>>,
    /// Group configs by group id (Kafka's `ConfigRecord`s of GROUP
    /// resources): only the keys a group sets.
    #[serde(default)]
    pub group_configs: BTreeMap<String, BTreeMap<String, String>>,
    /// Dynamic broker configs (Kafka's `ConfigRecord`s of BROKER
    /// resources): `""` holds the cluster-wide defaults, `"<node id>"` one
    /// broker's own; only the keys set.
    #[serde(default)]
    pub broker_configs: BTreeMap<String, BTreeMap<String, String>>,
}

/// A client quota entity (Kafka's `ClientQuotaEntity`): a user, a client
/// id, both, or an IP, each either named or the `<default>` entity.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ClientQuotaEntity {
    pub user: Option<QuotaEntityName>,
    pub client_id: Option<QuotaEntityName>,
    pub ip: Option<QuotaEntityName>,
}

/// One part of a quota entity: a name, or the `<default>` (null on the wire).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum QuotaEntityName {
    Default,
    Named(String),
}

impl QuotaEntityName {
    /// The wire form: `None` for the default entity.
    pub fn as_wire(&self) -> Option<&str> {
        match self {
            QuotaEntityName::Default => None,
            QuotaEntityName::Named(n) => Some(n),
        }
    }

    pub fn from_wire(name: Option<&str>) -> Self {
        match name {
            None => QuotaEntityName::Default,
            Some(n) => QuotaEntityName::Named(n.to_string()),
        }
    }
}

/// One entity's quota changes: keys set (`Some`) or removed (`None`).
pub type ClientQuotaAlteration = (ClientQuotaEntity, Vec<(String, Option<QuotaValue>)>);

/// A quota value (Kafka's are doubles). Compared bit for bit, so the image
/// stays `Eq`; validation keeps NaN and infinities out.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct QuotaValue(pub f64);

impl PartialEq for QuotaValue {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for QuotaValue {}

/// Serializes a map with structured keys as a list of pairs.
mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S, K, V>(map: &BTreeMap<K, V>, s: S) -> Result<S::Ok, S::Error>
    where
        S: Serializer,
        K: Serialize,
        V: Serialize,
    {
        s.collect_seq(map.iter())
    }

    pub fn deserialize<'de, D, K, V>(d: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        D: Deserializer<'de>,
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
    {
        Ok(Vec::<(K, V)>::deserialize(d)?.into_iter().collect())
    }
}

/// One user's SCRAM credential for one mechanism (RFC 5802's StoredKey and
/// ServerKey, with the salt and iteration count the client needs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredScramCredential {
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
    pub iterations: i32,
}

/// A broker's advertised endpoints as it registered itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRegistration {
    pub node_id: NodeId,
    /// The inter-broker listener's endpoint: where peers replicate from and
    /// send transaction markers.
    pub host: String,
    pub port: u16,
    /// Every advertised client listener. A client is told the endpoints of
    /// the listener it connected to, as Kafka does. Empty in registrations
    /// written before listeners were named: then `host:port` serves all.
    #[serde(default)]
    pub listeners: Vec<Endpoint>,
    pub rack: Option<String>,
    /// A fenced broker leads nothing and is in no ISR it could leave. The
    /// active controller fences a broker whose heartbeats stop (or that asks
    /// to, in a controlled shutdown); registering again unfences it.
    #[serde(default)]
    pub fenced: bool,
    /// The metadata commands this broker's software applies beyond the
    /// first ones ([`FEATURE_ELECT_PREFERRED`]). A controller proposes such a
    /// command only when every registered broker lists it, so a voter not yet
    /// upgraded never meets a command it cannot read.
    #[serde(default)]
    pub features: Vec<String>,
}

/// Applies [`MetadataCommand::ElectPreferredLeader`].
pub const FEATURE_ELECT_PREFERRED: &str = "elect-preferred-leader";
/// Applies [`MetadataCommand::AlterBrokerConfigs`].
pub const FEATURE_BROKER_CONFIGS: &str = "dynamic-broker-configs";

/// The features this software registers with.
pub fn supported_features() -> Vec<String> {
    vec![
        FEATURE_ELECT_PREFERRED.to_string(),
        FEATURE_BROKER_CONFIGS.to_string(),
    ]
}

/// One advertised listener of a broker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub name: String,
    pub host: String,
    pub port: u16,
}

impl BrokerRegistration {
    /// Where a client connected on `listener` reaches this broker, if the
    /// broker has that listener (Kafka leaves a broker without it out of
    /// the answer).
    pub fn endpoint(&self, listener: &str) -> Option<(&str, u16)> {
        if self.listeners.is_empty() {
            return Some((&self.host, self.port));
        }
        self.listeners
            .iter()
            .find(|e| e.name.eq_ignore_ascii_case(listener))
            .map(|e| (e.host.as_str(), e.port))
    }
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
    /// The assignment; the first replica is the preferred leader.
    pub replicas: Vec<NodeId>,
    /// In-sync replicas. Never empty: when the last in-sync replica is fenced
    /// it stays here (as Kafka keeps it) and the partition has no leader, so
    /// only that replica, holding every acked write, can lead again.
    pub isr: Vec<NodeId>,
    /// [`NO_LEADER`] while no in-sync replica is available.
    pub leader: NodeId,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: i32,
}

/// The replica an election makes leader of the leaderless partition `p`:
/// its first in-sync, unfenced replica in assignment order, or with
/// `unclean` its first unfenced one (whose log may lack acked writes; the
/// ISR becomes that replica alone).
pub fn elected_leader(
    p: &PartitionImage,
    brokers: &BTreeMap<NodeId, BrokerRegistration>,
    unclean: bool,
) -> Result<NodeId, MetadataError> {
    if p.leader != NO_LEADER {
        return Err(MetadataError::ElectionNotNeeded);
    }
    let live = |n: &&NodeId| brokers.get(n).is_some_and(|b| !b.fenced);
    let clean = p.replicas.iter().filter(live).find(|n| p.isr.contains(n));
    let chosen = if unclean {
        clean.or_else(|| p.replicas.iter().find(live))
    } else {
        clean
    };
    chosen.copied().ok_or_else(|| {
        MetadataError::InvalidRequest(if unclean {
            "no live replica to elect".into()
        } else {
            "no live in-sync replica to elect".into()
        })
    })
}

/// The replica a PREFERRED election makes leader of `p`: its first
/// replica, when it is unfenced, in sync and not leading already.
pub fn preferred_leader(
    p: &PartitionImage,
    brokers: &BTreeMap<NodeId, BrokerRegistration>,
) -> Result<NodeId, MetadataError> {
    let Some(&preferred) = p.replicas.first() else {
        return Err(MetadataError::InvalidRequest("no replicas".into()));
    };
    if p.leader == preferred {
        return Err(MetadataError::ElectionNotNeeded);
    }
    let live = brokers.get(&preferred).is_some_and(|b| !b.fenced);
    if !live || !p.isr.contains(&preferred) {
        return Err(MetadataError::PreferredLeaderNotAvailable(preferred));
    }
    Ok(preferred)
}

/// The leader of a partition none of whose in-sync replicas is available.
pub const NO_LEADER: NodeId = NodeId(-1);

/// A change to the metadata image, proposed through Raft.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetadataCommand {
    /// Sets the cluster id. Only the first one applied takes effect, so a node
    /// that crashed between proposing it and seeing it applied can propose again
    /// without changing the id.
    InitCluster {
        cluster_id: String,
        /// SCRAM credentials the cluster is formed with (the broker's
        /// `--add-scram`, Kafka's `kafka-storage format --add-scram`):
        /// applied with the id, so only the first InitCluster's count.
        #[serde(default)]
        scram_credentials: Vec<(String, i8, StoredScramCredential)>,
    },
    /// Adds a broker or replaces its earlier registration, unfenced (whatever
    /// `fenced` says), and gives it the leadership of every leaderless
    /// partition whose ISR holds it.
    RegisterBroker(BrokerRegistration),
    /// Fences a broker: it leaves the ISR of every partition (unless it is the
    /// last member) and each of its leaderships moves to the first in-sync,
    /// unfenced replica in assignment order, or to [`NO_LEADER`].
    FenceBroker {
        node_id: NodeId,
    },
    /// A partition leader's ISR change (Kafka's AlterPartition). Accepted only
    /// from the current leader at the current leader epoch and partition epoch;
    /// the new ISR must hold the leader and only unfenced replicas.
    AlterPartition {
        #[serde(with = "uuid_text")]
        topic_id: Uuid,
        partition: i32,
        leader: NodeId,
        leader_epoch: LeaderEpoch,
        partition_epoch: i32,
        isr: Vec<NodeId>,
    },
    /// Elects a leader for a leaderless partition: an in-sync, unfenced
    /// replica, or with `unclean` any unfenced replica (whose log may lack
    /// acked writes; the ISR becomes that replica alone).
    ElectLeader {
        #[serde(with = "uuid_text")]
        topic_id: Uuid,
        partition: i32,
        unclean: bool,
    },
    /// Moves a partition's leadership to its preferred replica (the first
    /// of its assignment), which must be unfenced and in sync (Kafka's
    /// PREFERRED election). Proposed only when every broker registered
    /// [`FEATURE_ELECT_PREFERRED`].
    ElectPreferredLeader {
        #[serde(with = "uuid_text")]
        topic_id: Uuid,
        partition: i32,
    },
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
    /// Deletes the keys in `delete`, then sets the keys in `set`, of one
    /// group's configs (validated by the handler; the group need not
    /// exist).
    AlterGroupConfigs {
        group: String,
        set: BTreeMap<String, String>,
        delete: Vec<String>,
    },
    /// Sets and deletes dynamic broker configs of `resource` (`""`: the
    /// cluster-wide defaults; else a node id). Proposed only when every
    /// broker registered [`FEATURE_BROKER_CONFIGS`].
    AlterBrokerConfigs {
        resource: String,
        set: BTreeMap<String, String>,
        delete: Vec<String>,
    },
    /// Reserves `count` producer ids, returned as a block.
    AllocateProducerIds {
        count: i64,
    },
    /// Removes then sets SCRAM credentials (AlterUserScramCredentials, whose
    /// handler validated them): `(user, mechanism type)` pairs to delete,
    /// and credentials to set.
    AlterScramCredentials {
        delete: Vec<(String, i8)>,
        upsert: Vec<(String, i8, StoredScramCredential)>,
    },
    /// Removes then adds ACL bindings (CreateAcls and DeleteAcls, whose
    /// handlers validated them and resolved DeleteAcls' filters).
    AlterAcls {
        create: Vec<crate::authz::AclBinding>,
        delete: Vec<crate::authz::AclBinding>,
    },
    /// Sets (`Some`) or removes (`None`) client quota keys, entity by
    /// entity (AlterClientQuotas, whose handler validated them).
    AlterClientQuotas {
        alterations: Vec<ClientQuotaAlteration>,
    },
}

/// What applying a command produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetadataOutcome {
    Done,
    /// The partition's state after an accepted `AlterPartition` or `ElectLeader`.
    Partition(PartitionImage),
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
    #[error("unknown topic id {0} or partition {1}")]
    UnknownTopicOrPartition(String, i32),
    /// The proposer is not the partition's leader at the image's leader epoch
    /// (Kafka's FENCED_LEADER_EPOCH / NOT_LEADER_OR_FOLLOWER).
    #[error("fenced leader epoch: partition is led by {leader} at epoch {leader_epoch}")]
    FencedLeaderEpoch {
        leader: NodeId,
        leader_epoch: LeaderEpoch,
    },
    /// The proposer's partition epoch is stale (Kafka's INVALID_UPDATE_VERSION).
    #[error("stale partition epoch; current is {0}")]
    InvalidUpdateVersion(i32),
    /// A proposed ISR member is not an unfenced replica (Kafka's INELIGIBLE_REPLICA).
    #[error("replica {0} cannot be in the ISR")]
    IneligibleReplica(NodeId),
    /// The ISR must hold the leader, and an election needs a leaderless partition
    /// with an eligible replica.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The partition is already led by the replica an election would choose.
    #[error("election not needed")]
    ElectionNotNeeded,
    /// The preferred replica is fenced or out of sync.
    #[error("the preferred leader {0} is not available")]
    PreferredLeaderNotAvailable(NodeId),
    /// This node is not the metadata leader; `leader` is the one it knows of.
    #[error("not the controller; leader is {leader:?}")]
    NotController { leader: Option<NodeId> },
    /// The metadata quorum on this node cannot continue (storage failure, stopped).
    #[error("metadata quorum failed: {0}")]
    Fatal(String),
}

impl MetadataImage {
    /// The dynamic broker configs that apply to `node`: its own, then the
    /// cluster-wide defaults.
    pub fn dynamic_broker_configs(&self, node: NodeId) -> crate::config::DynamicBrokerConfigs {
        crate::config::DynamicBrokerConfigs {
            broker: self
                .broker_configs
                .get(&node.0.to_string())
                .cloned()
                .unwrap_or_default(),
            cluster: self.broker_configs.get("").cloned().unwrap_or_default(),
        }
    }

    /// Applies one command. Deterministic: the same image and command always give
    /// the same result. A rejected command leaves the image unchanged, which is
    /// why every check runs before the first mutation.
    pub fn apply(&mut self, cmd: &MetadataCommand) -> Result<MetadataOutcome, MetadataError> {
        match cmd {
            MetadataCommand::InitCluster {
                cluster_id,
                scram_credentials,
            } => {
                if self.cluster_id.is_empty() {
                    self.cluster_id = cluster_id.clone();
                    for (user, mechanism, credential) in scram_credentials {
                        self.scram_credentials
                            .entry(user.clone())
                            .or_default()
                            .insert(*mechanism, credential.clone());
                    }
                }
                Ok(MetadataOutcome::Done)
            }
            MetadataCommand::RegisterBroker(registration) => {
                let node = registration.node_id;
                let mut registration = registration.clone();
                registration.fenced = false;
                self.brokers.insert(node, registration);
                for topic in self.topics.values_mut() {
                    for p in &mut topic.partitions {
                        if p.leader == NO_LEADER && p.isr.contains(&node) {
                            p.leader = node;
                            p.leader_epoch = LeaderEpoch(p.leader_epoch.0 + 1);
                            p.partition_epoch += 1;
                        }
                    }
                }
                Ok(MetadataOutcome::Done)
            }
            MetadataCommand::FenceBroker { node_id } => {
                let node = *node_id;
                let Some(broker) = self.brokers.get_mut(&node) else {
                    return Err(MetadataError::InvalidRequest(format!(
                        "broker {node} is not registered"
                    )));
                };
                broker.fenced = true;
                let brokers = &self.brokers;
                for topic in self.topics.values_mut() {
                    for p in &mut topic.partitions {
                        fence_in_partition(p, node, brokers);
                    }
                }
                Ok(MetadataOutcome::Done)
            }
            MetadataCommand::AlterPartition {
                topic_id,
                partition,
                leader,
                leader_epoch,
                partition_epoch,
                isr,
            } => {
                let brokers = &self.brokers;
                let p = partition_mut(&mut self.topics, *topic_id, *partition)?;
                if p.leader != *leader || p.leader_epoch != *leader_epoch {
                    return Err(MetadataError::FencedLeaderEpoch {
                        leader: p.leader,
                        leader_epoch: p.leader_epoch,
                    });
                }
                if p.partition_epoch != *partition_epoch {
                    return Err(MetadataError::InvalidUpdateVersion(p.partition_epoch));
                }
                if !isr.contains(leader) {
                    return Err(MetadataError::InvalidRequest(
                        "the ISR must hold the leader".into(),
                    ));
                }
                let mut new_isr: Vec<NodeId> = Vec::with_capacity(isr.len());
                for &member in isr {
                    // Members already in the ISR may stay even while fenced
                    // (the fence itself removes them); a new one must be live.
                    let live = brokers.get(&member).is_some_and(|b| !b.fenced);
                    if !p.replicas.contains(&member) || (!live && !p.isr.contains(&member)) {
                        return Err(MetadataError::IneligibleReplica(member));
                    }
                    if !new_isr.contains(&member) {
                        new_isr.push(member);
                    }
                }
                p.isr = new_isr;
                p.partition_epoch += 1;
                Ok(MetadataOutcome::Partition(p.clone()))
            }
            MetadataCommand::ElectLeader {
                topic_id,
                partition,
                unclean,
            } => {
                let brokers = &self.brokers;
                let p = partition_mut(&mut self.topics, *topic_id, *partition)?;
                let chosen = elected_leader(p, brokers, *unclean)?;
                if !p.isr.contains(&chosen) {
                    p.isr = vec![chosen];
                }
                p.leader = chosen;
                p.leader_epoch = LeaderEpoch(p.leader_epoch.0 + 1);
                p.partition_epoch += 1;
                Ok(MetadataOutcome::Partition(p.clone()))
            }
            MetadataCommand::ElectPreferredLeader {
                topic_id,
                partition,
            } => {
                let brokers = &self.brokers;
                let p = partition_mut(&mut self.topics, *topic_id, *partition)?;
                p.leader = preferred_leader(p, brokers)?;
                p.leader_epoch = LeaderEpoch(p.leader_epoch.0 + 1);
                p.partition_epoch += 1;
                Ok(MetadataOutcome::Partition(p.clone()))
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
            MetadataCommand::AlterBrokerConfigs {
                resource,
                set,
                delete,
            } => {
                let configs = self.broker_configs.entry(resource.clone()).or_default();
                for key in delete {
                    configs.remove(key);
                }
                for (key, value) in set {
                    configs.insert(key.clone(), value.clone());
                }
                if configs.is_empty() {
                    self.broker_configs.remove(resource);
                }
                Ok(MetadataOutcome::Done)
            }
            MetadataCommand::AlterGroupConfigs { group, set, delete } => {
                let configs = self.group_configs.entry(group.clone()).or_default();
                for key in delete {
                    configs.remove(key);
                }
                for (key, value) in set {
                    configs.insert(key.clone(), value.clone());
                }
                if configs.is_empty() {
                    self.group_configs.remove(group);
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
            MetadataCommand::AlterScramCredentials { delete, upsert } => {
                for (user, mechanism) in delete {
                    if let Some(by_mechanism) = self.scram_credentials.get_mut(user) {
                        by_mechanism.remove(mechanism);
                        if by_mechanism.is_empty() {
                            self.scram_credentials.remove(user);
                        }
                    }
                }
                for (user, mechanism, credential) in upsert {
                    self.scram_credentials
                        .entry(user.clone())
                        .or_default()
                        .insert(*mechanism, credential.clone());
                }
                Ok(MetadataOutcome::Done)
            }
            MetadataCommand::AlterAcls { create, delete } => {
                self.acls = self.acls.changed(create, delete);
                Ok(MetadataOutcome::Done)
            }
            MetadataCommand::AlterClientQuotas { alterations } => {
                for (entity, ops) in alterations {
                    let values = self.client_quotas.entry(entity.clone()).or_default();
                    for (key, value) in ops {
                        match value {
                            Some(v) => {
                                values.insert(key.clone(), *v);
                            }
                            None => {
                                values.remove(key);
                            }
                        }
                    }
                    if values.is_empty() {
                        self.client_quotas.remove(entity);
                    }
                }
                Ok(MetadataOutcome::Done)
            }
        }
    }

    pub fn topic_by_id(&self, id: Uuid) -> Option<&TopicImage> {
        self.topics.values().find(|topic| topic.topic_id == id)
    }
}

fn partition_mut(
    topics: &mut BTreeMap<String, TopicImage>,
    topic_id: Uuid,
    partition: i32,
) -> Result<&mut PartitionImage, MetadataError> {
    topics
        .values_mut()
        .find(|t| t.topic_id == topic_id)
        .and_then(|t| {
            usize::try_from(partition)
                .ok()
                .and_then(|i| t.partitions.get_mut(i))
        })
        .ok_or_else(|| MetadataError::UnknownTopicOrPartition(topic_id.to_string(), partition))
}

/// What fencing `node` does to one partition: it leaves the ISR unless it is
/// the last member, and if it led, leadership moves to the first in-sync,
/// unfenced replica in assignment order (or to nobody).
fn fence_in_partition(
    p: &mut PartitionImage,
    node: NodeId,
    brokers: &BTreeMap<NodeId, BrokerRegistration>,
) {
    if !p.replicas.contains(&node) {
        return;
    }
    let mut changed = false;
    if p.isr.len() > 1 && p.isr.contains(&node) {
        p.isr.retain(|&n| n != node);
        changed = true;
    }
    if p.leader == node {
        let live = |n: &NodeId| brokers.get(n).is_some_and(|b| !b.fenced);
        p.leader = p
            .replicas
            .iter()
            .copied()
            .find(|n| *n != node && p.isr.contains(n) && live(n))
            .unwrap_or(NO_LEADER);
        p.leader_epoch = LeaderEpoch(p.leader_epoch.0 + 1);
        changed = true;
    }
    if changed {
        p.partition_epoch += 1;
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
    fn group_configs_need_no_group_and_vanish_when_emptied() {
        let mut image = MetadataImage::default();
        let set = |pairs: &[(&str, &str)], delete: &[&str]| MetadataCommand::AlterGroupConfigs {
            group: "g".into(),
            set: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            delete: delete.iter().map(|k| k.to_string()).collect(),
        };
        image
            .apply(&set(&[("share.auto.offset.reset", "earliest")], &[]))
            .unwrap();
        assert_eq!(
            image.group_configs["g"]["share.auto.offset.reset"],
            "earliest"
        );
        // A snapshot written before group configs existed still loads.
        let json = serde_json::to_value(&image).unwrap();
        let mut old = json.clone();
        old.as_object_mut().unwrap().remove("group_configs");
        let loaded: MetadataImage = serde_json::from_value(old).unwrap();
        assert!(loaded.group_configs.is_empty());
        image
            .apply(&set(&[], &["share.auto.offset.reset"]))
            .unwrap();
        assert!(image.group_configs.is_empty());
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
                scram_credentials: vec![(
                    format!("user-of-{id}"),
                    1,
                    StoredScramCredential {
                        salt: vec![1],
                        stored_key: vec![2],
                        server_key: vec![3],
                        iterations: 4096,
                    },
                )],
            };
            assert_eq!(image.apply(&cmd), Ok(MetadataOutcome::Done));
        }
        assert_eq!(image.cluster_id, "first");
        // The credentials formed with the cluster are the first InitCluster's.
        assert_eq!(
            image.scram_credentials.keys().collect::<Vec<_>>(),
            vec!["user-of-first"]
        );

        for port in [9092, 9093] {
            let cmd = MetadataCommand::RegisterBroker(BrokerRegistration {
                node_id: NodeId(1),
                host: "localhost".into(),
                port,
                listeners: Vec::new(),
                rack: None,
                fenced: false,
                features: Vec::new(),
            });
            image.apply(&cmd).unwrap();
        }
        assert_eq!(image.brokers.len(), 1);
        assert_eq!(image.brokers[&NodeId(1)].port, 9093);
    }

    fn register(image: &mut MetadataImage, id: i32) {
        let cmd = MetadataCommand::RegisterBroker(BrokerRegistration {
            node_id: NodeId(id),
            host: format!("127.0.0.{id}"),
            port: 9092,
            listeners: Vec::new(),
            rack: None,
            fenced: false,
            features: Vec::new(),
        });
        image.apply(&cmd).unwrap();
    }

    /// Three brokers and one partition replicated on all three, led by 1.
    fn three_brokers() -> (MetadataImage, Uuid) {
        let mut image = MetadataImage::default();
        for id in 1..=3 {
            register(&mut image, id);
        }
        let replicas = vec![NodeId(1), NodeId(2), NodeId(3)];
        let topic_id = Uuid::new_v4();
        let cmd = MetadataCommand::CreateTopic {
            name: "t".into(),
            topic_id,
            partitions: vec![PartitionImage {
                partition: 0,
                replicas: replicas.clone(),
                isr: replicas,
                leader: NodeId(1),
                leader_epoch: LeaderEpoch(0),
                partition_epoch: 0,
            }],
            configs: BTreeMap::new(),
        };
        image.apply(&cmd).unwrap();
        (image, topic_id)
    }

    fn fence(image: &mut MetadataImage, id: i32) {
        image
            .apply(&MetadataCommand::FenceBroker {
                node_id: NodeId(id),
            })
            .unwrap();
    }

    #[test]
    fn fencing_the_leader_moves_leadership_within_the_isr() {
        let (mut image, _) = three_brokers();
        fence(&mut image, 1);
        let p = &image.topics["t"].partitions[0];
        assert_eq!(p.leader, NodeId(2));
        assert_eq!(p.isr, vec![NodeId(2), NodeId(3)]);
        assert_eq!(p.leader_epoch, LeaderEpoch(1));
        assert_eq!(p.partition_epoch, 1);
        assert!(image.brokers[&NodeId(1)].fenced);

        // A follower's fence changes the ISR but not the leader epoch.
        fence(&mut image, 3);
        let p = &image.topics["t"].partitions[0];
        assert_eq!((p.leader, p.leader_epoch), (NodeId(2), LeaderEpoch(1)));
        assert_eq!(p.isr, vec![NodeId(2)]);
        assert_eq!(p.partition_epoch, 2);

        // The last in-sync replica stays in the ISR and the partition has no
        // leader; an out-of-sync replica coming back does not get it.
        fence(&mut image, 2);
        let p = &image.topics["t"].partitions[0];
        assert_eq!((p.leader, p.isr.clone()), (NO_LEADER, vec![NodeId(2)]));
        assert_eq!(p.leader_epoch, LeaderEpoch(2));
        register(&mut image, 1);
        assert_eq!(image.topics["t"].partitions[0].leader, NO_LEADER);
        assert!(!image.brokers[&NodeId(1)].fenced);

        // The last in-sync replica coming back leads again.
        register(&mut image, 2);
        let p = &image.topics["t"].partitions[0];
        assert_eq!((p.leader, p.leader_epoch), (NodeId(2), LeaderEpoch(3)));
    }

    #[test]
    fn unclean_election_needs_asking_for() {
        let (mut image, topic_id) = three_brokers();
        for id in [3, 2, 1] {
            fence(&mut image, id);
        }
        register(&mut image, 3);
        let clean = MetadataCommand::ElectLeader {
            topic_id,
            partition: 0,
            unclean: false,
        };
        assert!(matches!(
            image.apply(&clean),
            Err(MetadataError::InvalidRequest(_))
        ));
        let unclean = MetadataCommand::ElectLeader {
            topic_id,
            partition: 0,
            unclean: true,
        };
        let Ok(MetadataOutcome::Partition(p)) = image.apply(&unclean) else {
            panic!("unclean election failed");
        };
        assert_eq!((p.leader, p.isr), (NodeId(3), vec![NodeId(3)]));
        // Led again: a second election is refused.
        assert!(image.apply(&unclean).is_err());
    }

    #[test]
    fn alter_partition_checks_leader_epochs_and_eligibility() {
        let (mut image, topic_id) = three_brokers();
        let alter = |isr: &[i32], leader_epoch: i32, partition_epoch: i32| {
            MetadataCommand::AlterPartition {
                topic_id,
                partition: 0,
                leader: NodeId(1),
                leader_epoch: LeaderEpoch(leader_epoch),
                partition_epoch,
                isr: isr.iter().map(|&n| NodeId(n)).collect(),
            }
        };
        let Ok(MetadataOutcome::Partition(p)) = image.apply(&alter(&[1, 2], 0, 0)) else {
            panic!("shrink refused");
        };
        assert_eq!((p.isr, p.partition_epoch), (vec![NodeId(1), NodeId(2)], 1));
        let before = image.clone();
        assert_eq!(
            image.apply(&alter(&[1, 2, 3], 0, 0)),
            Err(MetadataError::InvalidUpdateVersion(1))
        );
        assert!(matches!(
            image.apply(&alter(&[1, 2, 3], 5, 1)),
            Err(MetadataError::FencedLeaderEpoch { .. })
        ));
        assert!(matches!(
            image.apply(&alter(&[2, 3], 0, 1)),
            Err(MetadataError::InvalidRequest(_))
        ));
        assert_eq!(
            image.apply(&alter(&[1, 4], 0, 1)),
            Err(MetadataError::IneligibleReplica(NodeId(4)))
        );
        assert_eq!(image, before);

        // A fenced broker cannot rejoin the ISR until it registers again.
        fence(&mut image, 3);
        let epoch = image.topics["t"].partitions[0].partition_epoch;
        assert_eq!(
            image.apply(&alter(&[1, 2, 3], 0, epoch)),
            Err(MetadataError::IneligibleReplica(NodeId(3)))
        );
        register(&mut image, 3);
        assert!(image.apply(&alter(&[1, 2, 3], 0, epoch)).is_ok());
        let unknown = MetadataCommand::AlterPartition {
            topic_id: Uuid::new_v4(),
            partition: 0,
            leader: NodeId(1),
            leader_epoch: LeaderEpoch(0),
            partition_epoch: 0,
            isr: vec![NodeId(1)],
        };
        assert!(matches!(
            image.apply(&unknown),
            Err(MetadataError::UnknownTopicOrPartition(..))
        ));
    }

    #[test]
    fn acls_are_added_removed_and_kept_in_the_json() {
        use crate::authz::{AclBinding, Operation, PatternType, Permission, ResourceType, Verdict};
        let binding = |name: &str| AclBinding {
            resource_type: ResourceType::Topic,
            resource_name: name.into(),
            pattern_type: PatternType::Prefixed,
            principal: "User:alice".into(),
            host: "*".into(),
            operation: Operation::Read,
            permission: Permission::Allow,
        };
        let mut image = MetadataImage::default();
        let add = MetadataCommand::AlterAcls {
            create: vec![binding("a-"), binding("b-")],
            delete: vec![],
        };
        image.apply(&add).unwrap();
        image
            .apply(&MetadataCommand::AlterAcls {
                create: vec![],
                delete: vec![binding("b-")],
            })
            .unwrap();
        assert_eq!(image.acls.len(), 1);
        let json = serde_json::to_vec(&image).unwrap();
        let back: MetadataImage = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, image);
        // The index is rebuilt from the JSON, not only the list.
        let check = |name| {
            back.acls.check(
                "User:alice",
                "h",
                Operation::Read,
                ResourceType::Topic,
                name,
            )
        };
        assert_eq!(check("a-1"), Verdict::Allowed);
        assert_eq!(check("b-1"), Verdict::NoAcls);
        // An image written before ACLs existed reads as having none.
        let mut old: serde_json::Value = serde_json::to_value(&image).unwrap();
        old.as_object_mut().unwrap().remove("acls");
        let old: MetadataImage = serde_json::from_value(old).unwrap();
        assert!(old.acls.is_empty());
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
