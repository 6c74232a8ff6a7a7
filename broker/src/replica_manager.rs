//! The partitions this node hosts, kept in step with the metadata image.
//! (Kafka's `ReplicaManager`.)

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::Notify;
use uuid::Uuid;

use crate::config::{ServerConfig, TopicConfigs};
use crate::error::PartitionError;
use crate::metadata::MetadataImage;
use crate::partition::{read_partition_metadata, Partition};
use crate::types::{NodeId, TopicPartition};

pub type PartitionRef = Arc<Mutex<Partition>>;

pub struct ReplicaManager {
    data_dir: PathBuf,
    node_id: NodeId,
    server: ServerConfig,
    partitions: RwLock<HashMap<TopicPartition, PartitionRef>>,
    /// Serializes reconciliation so two image updates never race to open
    /// or delete the same directory.
    reconcile_lock: Mutex<()>,
    /// Woken after every append, so long-polling fetches re-check.
    pub appended: Notify,
}

fn partition_dir(data_dir: &std::path::Path, tp: &TopicPartition) -> PathBuf {
    data_dir.join(format!("{}-{}", tp.topic, tp.partition))
}

impl ReplicaManager {
    pub fn new(server: ServerConfig) -> Self {
        Self {
            data_dir: server.data_dir().clone(),
            node_id: server.node_id,
            server,
            partitions: RwLock::new(HashMap::new()),
            reconcile_lock: Mutex::new(()),
            appended: Notify::new(),
        }
    }

    pub fn get(&self, tp: &TopicPartition) -> Option<PartitionRef> {
        self.partitions.read().expect("poisoned").get(tp).cloned()
    }

    pub fn all(&self) -> Vec<(TopicPartition, PartitionRef)> {
        self.partitions
            .read()
            .expect("poisoned")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Opens partitions the image assigns to this node, applies config
    /// changes, and deletes partitions of topics that are gone. Directories
    /// on disk that belong to no topic in the image (a topic deleted while
    /// the node was down, or an older topic of the same name) are removed.
    pub fn reconcile(&self, image: &MetadataImage, now_ms: i64) -> Result<(), PartitionError> {
        let _guard = self.reconcile_lock.lock().expect("poisoned");
        let mut wanted: HashMap<TopicPartition, (Uuid, &crate::metadata::PartitionImage)> =
            HashMap::new();
        for topic in image.topics.values() {
            for p in &topic.partitions {
                if p.replicas.contains(&self.node_id) {
                    wanted.insert(
                        TopicPartition::new(topic.name.as_str(), p.partition),
                        (topic.topic_id, p),
                    );
                }
            }
        }
        // Remove partitions no longer wanted (or recreated under a new id).
        let stale: Vec<(TopicPartition, PartitionRef)> = {
            let map = self.partitions.read().expect("poisoned");
            map.iter()
                .filter(|(tp, p)| match wanted.get(*tp) {
                    None => true,
                    Some((id, _)) => p.lock().expect("poisoned").topic_id != *id,
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        for (tp, part) in stale {
            self.partitions.write().expect("poisoned").remove(&tp);
            // Any in-flight request still holding the Arc finishes first.
            let part = match Arc::try_unwrap(part) {
                Ok(m) => m.into_inner().expect("poisoned"),
                Err(shared) => {
                    let dir = partition_dir(&self.data_dir, &tp);
                    drop(shared);
                    std::fs::remove_dir_all(&dir).ok();
                    continue;
                }
            };
            tracing::info!(%tp, "deleting partition");
            part.delete()?;
        }
        // Open or update the wanted ones.
        for (tp, (topic_id, pimg)) in &wanted {
            let topic = &image.topics[&*tp.topic];
            let configs = TopicConfigs::resolve(&self.server, &topic.configs);
            if let Some(existing) = self.get(tp) {
                existing.lock().expect("poisoned").set_configs(configs);
                continue;
            }
            let dir = partition_dir(&self.data_dir, tp);
            if let Some(on_disk) = read_partition_metadata(&dir) {
                if on_disk != *topic_id {
                    tracing::info!(%tp, "removing directory of an older topic with this name");
                    std::fs::remove_dir_all(&dir)
                        .map_err(|e| PartitionError::Storage(e.to_string()))?;
                }
            }
            let part = Partition::open(
                dir,
                tp.clone(),
                *topic_id,
                pimg.leader_epoch,
                configs,
                now_ms,
            )?;
            self.partitions
                .write()
                .expect("poisoned")
                .insert(tp.clone(), Arc::new(Mutex::new(part)));
        }
        self.remove_stray_dirs(&wanted);
        Ok(())
    }

    fn remove_stray_dirs(
        &self,
        wanted: &HashMap<TopicPartition, (Uuid, &crate::metadata::PartitionImage)>,
    ) {
        let Ok(entries) = std::fs::read_dir(&self.data_dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(on_disk) = read_partition_metadata(&path) else {
                continue;
            };
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some((topic, part)) = name.rsplit_once('-') else {
                continue;
            };
            let Ok(partition) = part.parse::<i32>() else {
                continue;
            };
            let keep = wanted
                .get(&TopicPartition::new(topic, partition))
                .is_some_and(|(id, _)| *id == on_disk);
            if !keep {
                tracing::info!(dir = %path.display(), "removing stray partition directory");
                std::fs::remove_dir_all(&path).ok();
            }
        }
    }

    /// Runs retention, compaction, flushing and snapshots on every partition.
    pub fn maintain_all(&self, now_ms: i64) {
        for (tp, part) in self.all() {
            if let Err(e) = part.lock().expect("poisoned").maintain(now_ms) {
                tracing::error!(%tp, error = %e, "partition maintenance failed");
            }
        }
    }

    /// Closes every partition cleanly (producer snapshots, clean-shutdown
    /// markers), so the next start skips recovery scans.
    pub fn shutdown(&self) {
        let parts: Vec<_> = self.partitions.write().expect("poisoned").drain().collect();
        for (tp, part) in parts {
            match Arc::try_unwrap(part) {
                Ok(m) => {
                    if let Err(e) = m.into_inner().expect("poisoned").close() {
                        tracing::error!(%tp, error = %e, "closing partition failed");
                    }
                }
                Err(_) => {
                    tracing::warn!(%tp, "partition still in use at shutdown; recovery will run")
                }
            }
        }
    }

    pub fn node_id(&self) -> NodeId {
        self.node_id
    }
}
