//! TEMPORARY in-memory stand-in with the agreed API, so the server compiles
//! while the Raft-backed metadata is written on its own branch. Replaced on merge.
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use uuid::Uuid;

use crate::types::{LeaderEpoch, NodeId};

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MetadataImage {
    pub cluster_id: String,
    pub brokers: BTreeMap<NodeId, BrokerRegistration>,
    pub topics: BTreeMap<String, TopicImage>,
    pub next_producer_id: i64,
}
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BrokerRegistration { pub node_id: NodeId, pub host: String, pub port: u16, pub rack: Option<String> }
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TopicImage { pub name: String, pub topic_id: Uuid, pub partitions: Vec<PartitionImage>, pub configs: BTreeMap<String, String> }
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PartitionImage { pub partition: i32, pub replicas: Vec<NodeId>, pub isr: Vec<NodeId>, pub leader: NodeId, pub leader_epoch: LeaderEpoch, pub partition_epoch: i32 }
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum MetadataCommand {
    InitCluster { cluster_id: String },
    RegisterBroker(BrokerRegistration),
    CreateTopic { name: String, topic_id: Uuid, partitions: Vec<PartitionImage>, configs: BTreeMap<String, String> },
    DeleteTopic { name: String },
    CreatePartitions { name: String, partitions: Vec<PartitionImage> },
    AlterTopicConfigs { name: String, set: BTreeMap<String, String>, delete: Vec<String> },
    AllocateProducerIds { count: i64 },
}
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetadataOutcome { Done, ProducerIdBlock { first: i64, count: i64 } }
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum MetadataError {
    #[error("topic {0} already exists")] TopicAlreadyExists(String),
    #[error("unknown topic {0}")] UnknownTopic(String),
    #[error("invalid partitions: {0}")] InvalidPartitions(String),
    #[error("not controller")] NotController { leader: Option<NodeId> },
    #[error("fatal: {0}")] Fatal(String),
}
impl MetadataImage {
    pub fn apply(&mut self, cmd: &MetadataCommand) -> Result<MetadataOutcome, MetadataError> {
        match cmd {
            MetadataCommand::InitCluster { cluster_id } => self.cluster_id = cluster_id.clone(),
            MetadataCommand::RegisterBroker(b) => { self.brokers.insert(b.node_id, b.clone()); }
            MetadataCommand::CreateTopic { name, topic_id, partitions, configs } => {
                if self.topics.contains_key(name) { return Err(MetadataError::TopicAlreadyExists(name.clone())); }
                self.topics.insert(name.clone(), TopicImage { name: name.clone(), topic_id: *topic_id, partitions: partitions.clone(), configs: configs.clone() });
            }
            MetadataCommand::DeleteTopic { name } => { self.topics.remove(name).ok_or_else(|| MetadataError::UnknownTopic(name.clone()))?; }
            MetadataCommand::CreatePartitions { name, partitions } => {
                let t = self.topics.get_mut(name).ok_or_else(|| MetadataError::UnknownTopic(name.clone()))?;
                t.partitions.extend(partitions.iter().cloned());
            }
            MetadataCommand::AlterTopicConfigs { name, set, delete } => {
                let t = self.topics.get_mut(name).ok_or_else(|| MetadataError::UnknownTopic(name.clone()))?;
                for d in delete { t.configs.remove(d); }
                t.configs.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            MetadataCommand::AllocateProducerIds { count } => {
                let first = self.next_producer_id;
                self.next_producer_id += count;
                return Ok(MetadataOutcome::ProducerIdBlock { first, count: *count });
            }
        }
        Ok(MetadataOutcome::Done)
    }
    pub fn topic_by_id(&self, id: Uuid) -> Option<&TopicImage> { self.topics.values().find(|t| t.topic_id == id) }
}
pub struct MetadataController { state: Mutex<MetadataImage>, tx: watch::Sender<Arc<MetadataImage>> }
impl MetadataController {
    pub async fn open(_dir: &Path, _node_id: NodeId, _listener_addr: String) -> Result<Self, MetadataError> {
        let img = MetadataImage { cluster_id: "shim-cluster-id-000000".into(), ..Default::default() };
        let (tx, _) = watch::channel(Arc::new(img.clone()));
        Ok(Self { state: Mutex::new(img), tx })
    }
    pub async fn propose(&self, cmd: MetadataCommand) -> Result<MetadataOutcome, MetadataError> {
        let mut s = self.state.lock().unwrap();
        let r = s.apply(&cmd)?;
        self.tx.send_replace(Arc::new(s.clone()));
        Ok(r)
    }
    pub fn image(&self) -> Arc<MetadataImage> { self.tx.borrow().clone() }
    pub fn subscribe(&self) -> watch::Receiver<Arc<MetadataImage>> { self.tx.subscribe() }
    pub async fn shutdown(self) -> Result<(), MetadataError> { Ok(()) }
}
