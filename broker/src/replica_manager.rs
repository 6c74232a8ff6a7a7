//! The partitions this node hosts, kept in step with the metadata image.
//! (Kafka's `ReplicaManager`.)

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::Notify;
use uuid::Uuid;

use crate::config::{ServerConfig, TopicConfigs};
use crate::error::PartitionError;
use crate::log::LogDirFailureChannel;
use crate::metadata::image::NO_LEADER;
use crate::metadata::MetadataImage;
use crate::partition::leader_state::AssignedState;
use crate::partition::{read_partition_metadata, Partition};
use crate::types::{NodeId, TopicPartition};

/// A partition this node follows, as the replica fetchers need it.
pub use crate::replication::fetcher::FollowedPartition as Followed;

pub type PartitionRef = Arc<Mutex<Partition>>;

pub struct ReplicaManager {
    data_dir: PathBuf,
    node_id: NodeId,
    server: ServerConfig,
    partitions: RwLock<HashMap<TopicPartition, PartitionRef>>,
    /// Serializes reconciliation so two image updates never race to open
    /// or delete the same directory.
    reconcile_lock: Mutex<()>,
    /// Taken (asynchronously) before a reconcile goes to a blocking thread,
    /// so callers queue here rather than each holding a blocking thread on
    /// `reconcile_lock`: however many requests apply images at once, one
    /// blocking thread does.
    pub reconcile_turn: tokio::sync::Mutex<()>,
    /// Woken after every append and every high watermark advance, so
    /// long-polling fetches re-check.
    pub appended: Notify,
    /// Woken when a follower may join an ISR, so the ISR manager
    /// (`replication::leader`) proposes it without waiting for its tick.
    pub isr_check: Notify,
    followed: Mutex<Vec<Followed>>,
    /// The health of `log.dirs`' first entry, which holds every partition:
    /// an I/O error in any of them takes them all offline.
    log_dir_failure: LogDirFailureChannel,
    /// Counts the images applied, so what depends on the partitions being
    /// open (the group coordinator) follows them rather than the quorum.
    applied: tokio::sync::watch::Sender<u64>,
}

/// Waits until an acks=all append that ends before `required` is committed
/// (the high watermark reaches it), at most until `deadline`
/// (REQUEST_TIMED_OUT). `events` must come from `Partition::subscribe` under
/// the lock of the append, so no change after it is missed. Fails at once
/// when leadership is lost (NOT_LEADER_OR_FOLLOWER) or the ISR falls below
/// `min.insync.replicas` (NOT_ENOUGH_REPLICAS_AFTER_APPEND).
pub async fn wait_for_ack(
    part: &PartitionRef,
    required: crate::types::Offset,
    events: &mut tokio::sync::watch::Receiver<()>,
    deadline: tokio::time::Instant,
) -> Result<(), PartitionError> {
    use crate::partition::AckState;
    loop {
        let state = part.lock().expect("poisoned").ack_state(required);
        match state {
            Ok(AckState::Done) => return Ok(()),
            Err(e) => return Err(e),
            Ok(AckState::Waiting) => {}
        }
        match tokio::time::timeout_at(deadline, events.changed()).await {
            Ok(Ok(())) => continue,
            // The partition was dropped from this node.
            Ok(Err(_)) => return Err(PartitionError::NotLeaderOrFollower),
            Err(_) => {
                // One last look: the deadline and the change may race.
                let state = part.lock().expect("poisoned").ack_state(required);
                return match state {
                    Ok(AckState::Done) => Ok(()),
                    Ok(AckState::Waiting) => Err(PartitionError::RequestTimedOut),
                    Err(e) => Err(e),
                };
            }
        }
    }
}

/// A batch a coordinator appended to its internal topic, acknowledged once
/// the high watermark reaches `required` (wait with [`wait_for_ack`]).
pub struct InternalAppend {
    pub part: PartitionRef,
    pub base_offset: crate::types::Offset,
    pub required: crate::types::Offset,
    pub events: tokio::sync::watch::Receiver<()>,
}

/// The records of one coordinator batch for [`append_internal`]: offsets
/// 0, 1, ... and, for a transactional batch, `producer`'s (id, epoch, base
/// sequence). kafka-protocol keeps records in one batch only while offset -
/// sequence stays the same, so sequences follow the base one (-1 without a
/// producer).
pub fn coordinator_records(
    entries: impl IntoIterator<Item = (bytes::Bytes, Option<bytes::Bytes>)>,
    producer: Option<(i64, i16, i32)>,
    now_ms: i64,
) -> Vec<kafka_protocol::records::Record> {
    let base_sequence = producer.map_or(-1, |p| p.2);
    entries
        .into_iter()
        .enumerate()
        .map(|(i, (key, value))| kafka_protocol::records::Record {
            transactional: producer.is_some(),
            control: false,
            partition_leader_epoch: -1,
            producer_id: producer.map_or(-1, |p| p.0),
            producer_epoch: producer.map_or(-1, |p| p.1),
            timestamp_type: kafka_protocol::records::TimestampType::Creation,
            offset: i as i64,
            sequence: base_sequence.wrapping_add(i as i32),
            timestamp: now_ms,
            key: Some(key),
            value,
            headers: Default::default(),
            delete_horizon: false,
        })
        .collect()
}

/// Encodes `records` as one uncompressed batch and appends it to `part` as
/// its leader with acks=all (refused below `min.insync.replicas`), the way
/// the group and transaction coordinators write their internal topics.
/// Disk work: call it on a blocking thread.
pub fn append_internal(
    replicas: &ReplicaManager,
    part: PartitionRef,
    records: &[kafka_protocol::records::Record],
    now_ms: i64,
) -> Result<InternalAppend, PartitionError> {
    use kafka_protocol::records::{Compression, RecordBatchEncoder, RecordEncodeOptions};
    let mut buf = bytes::BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| PartitionError::Storage(format!("encoding an internal batch: {e}")))?;
    let bytes = buf.freeze();
    let (outcome, events) = {
        let mut guard = part.lock().expect("partition poisoned");
        let outcome = guard.append_as_leader(&bytes, -1, now_ms)?;
        // Subscribed under the append's lock: no HW change after it is missed.
        (outcome, guard.subscribe())
    };
    replicas.appended.notify_waiters();
    Ok(InternalAppend {
        part,
        base_offset: outcome.base_offset,
        required: outcome.last_offset.next(),
        events,
    })
}

/// Calls `f(offset, key, value)` for every data record of the local
/// partition `tp`, from its log start to its log end, in offset order: how
/// a coordinator loads the state of an internal topic's partition it has
/// come to lead. Batches that do not decode are logged and skipped. Disk
/// work: call it on a blocking thread.
pub fn for_each_internal_record(
    replicas: &ReplicaManager,
    tp: &TopicPartition,
    read_bytes: usize,
    mut f: impl FnMut(i64, Option<bytes::Bytes>, Option<bytes::Bytes>),
) -> Result<(), PartitionError> {
    use crate::partition::FetchLimit;
    use kafka_protocol::records::RecordBatchDecoder;
    use protocol::record_batch::{BatchIter, BatchIterItem};
    let part = replicas
        .get(tp)
        .ok_or(PartitionError::NotLeaderOrFollower)?;
    let mut offset = part.lock().expect("partition poisoned").log_start_offset();
    loop {
        let fetched = {
            let part = part.lock().expect("partition poisoned");
            if offset >= part.log_end_offset() {
                break;
            }
            part.read_up_to(offset, read_bytes, true, FetchLimit::LogEnd)?
        };
        let mut next = offset;
        for item in BatchIter::new(&fetched.records) {
            let BatchIterItem::Batch { batch, .. } = item else {
                break;
            };
            next = crate::types::Offset(batch.last_offset() + 1);
            if batch.is_control() {
                continue;
            }
            let mut one = bytes::Bytes::copy_from_slice(batch.as_bytes());
            let Ok(set) = RecordBatchDecoder::decode(&mut one) else {
                tracing::warn!(%tp, offset = batch.base_offset(), "skipping an undecodable batch");
                continue;
            };
            for r in set.records {
                if r.offset >= offset.0 {
                    f(r.offset, r.key, r.value);
                }
            }
        }
        if next <= offset {
            break;
        }
        offset = next;
    }
    Ok(())
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
            reconcile_turn: tokio::sync::Mutex::new(()),
            appended: Notify::new(),
            isr_check: Notify::new(),
            followed: Mutex::new(Vec::new()),
            log_dir_failure: {
                metrics::gauge!("kafka_log_offline_log_directory_count").set(0.0);
                LogDirFailureChannel::new()
            },
            applied: tokio::sync::watch::channel(0).0,
        }
    }

    /// The log directory's health: `lib.rs` watches it to stop the broker
    /// when the directory fails.
    pub fn log_dir_failure(&self) -> &LogDirFailureChannel {
        &self.log_dir_failure
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
    /// changes, gives each its role (leader when the image names this node,
    /// follower otherwise), and deletes partitions of topics that are gone.
    /// Directories on disk that belong to no topic in the image (a topic
    /// deleted while the node was down, or an older topic of the same name)
    /// are removed. Returns the complete set of partitions this node follows
    /// with a live leader, for the replica fetchers.
    ///
    /// The image is read under the reconcile lock, so two callers can never
    /// apply an older image after a newer one; `on_followed` runs under it
    /// too, so the fetchers see the followed sets in image order.
    ///
    /// This opens logs (a recovery scan after a crash reads the whole active
    /// segment) and deletes directories: call it off the async workers
    /// (`Broker::sync_replicas` does).
    pub fn reconcile(
        &self,
        latest_image: impl FnOnce() -> std::sync::Arc<MetadataImage>,
        now_ms: i64,
        on_followed: impl FnOnce(Vec<Followed>),
    ) -> Result<(), PartitionError> {
        let _guard = self.reconcile_lock.lock().expect("poisoned");
        let image = latest_image();
        let followed = self.apply_image(&image, now_ms)?;
        *self.followed.lock().expect("poisoned") = followed.clone();
        on_followed(followed);
        self.applied.send_modify(|n| *n += 1);
        Ok(())
    }

    /// A receiver that sees every image `reconcile` applied.
    pub fn subscribe_applied(&self) -> tokio::sync::watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// The partitions this node follows, as last handed to the fetchers.
    pub fn followed(&self) -> Vec<Followed> {
        self.followed.lock().expect("poisoned").clone()
    }

    fn apply_image(
        &self,
        image: &MetadataImage,
        now_ms: i64,
    ) -> Result<Vec<Followed>, PartitionError> {
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
            {
                let mut p = part.lock().expect("poisoned");
                // Producers waiting for acks on it answer NOT_LEADER_OR_FOLLOWER.
                p.resign();
                // A maintenance pass still holding it writes nothing into
                // the directory from now on.
                p.retire_checkpoints();
            }
            // Any in-flight request still holding the Arc finishes first.
            let part = match Arc::try_unwrap(part) {
                Ok(m) => m.into_inner().expect("poisoned"),
                Err(shared) => {
                    // Renamed away now; a request still holding it writes
                    // into the renamed directory, which goes with it.
                    let dir = partition_dir(&self.data_dir, &tp);
                    drop(shared);
                    if let Err(e) = crate::log::delete_dir(&dir) {
                        tracing::error!(%tp, error = %e, "deleting partition failed");
                    }
                    continue;
                }
            };
            tracing::info!(%tp, "deleting partition");
            part.delete()?;
        }
        // Followers that may not join an ISR: fenced or unregistered brokers.
        let ineligible: std::collections::BTreeSet<NodeId> = image
            .topics
            .values()
            .flat_map(|t| t.partitions.iter().flat_map(|p| p.replicas.iter().copied()))
            .filter(|r| image.brokers.get(r).is_none_or(|b| b.fenced))
            .collect();
        let mut followed = Vec::new();
        let mut hw_moved = false;
        let dynamic = image.dynamic_broker_configs(self.node_id);
        // Open or update the wanted ones.
        for (tp, (topic_id, pimg)) in &wanted {
            let topic = &image.topics[&*tp.topic];
            let configs = TopicConfigs::resolve_with(&self.server, &dynamic, &topic.configs);
            let part = match self.get(tp) {
                Some(existing) => {
                    existing.lock().expect("poisoned").set_configs(configs);
                    existing
                }
                None => self.open(tp, *topic_id, pimg, configs, now_ms)?,
            };
            let mut p = part.lock().expect("poisoned");
            if pimg.leader == self.node_id {
                let state = AssignedState {
                    leader_epoch: pimg.leader_epoch,
                    partition_epoch: pimg.partition_epoch,
                    replicas: pimg.replicas.clone(),
                    isr: pimg.isr.clone(),
                };
                hw_moved |= p.become_leader(
                    self.node_id,
                    state,
                    ineligible.clone(),
                    self.server.replica_lag_time_max_ms,
                    now_ms,
                );
            } else {
                p.become_follower(pimg.leader, pimg.leader_epoch, pimg.partition_epoch);
                if pimg.leader != NO_LEADER {
                    followed.push(Followed {
                        tp: tp.clone(),
                        topic_id: *topic_id,
                        leader: pimg.leader,
                        leader_epoch: pimg.leader_epoch,
                    });
                }
            }
        }
        if hw_moved {
            self.appended.notify_waiters();
        }
        self.remove_stray_dirs(&wanted);
        followed.sort_by(|a, b| a.tp.cmp(&b.tp));
        Ok(followed)
    }

    fn open(
        &self,
        tp: &TopicPartition,
        topic_id: Uuid,
        pimg: &crate::metadata::PartitionImage,
        configs: TopicConfigs,
        now_ms: i64,
    ) -> Result<PartitionRef, PartitionError> {
        if self.log_dir_failure.is_offline() {
            return Err(PartitionError::Storage(format!(
                "the log directory is offline; not opening {tp}"
            )));
        }
        {
            let dir = partition_dir(&self.data_dir, tp);
            // A directory whose `partition.metadata` names another topic id
            // belongs to an older topic of this name; one without it is the
            // remnant of a deletion or of a creation that never got as far
            // as appending (the file is durable before any data). Neither
            // may be taken for this topic (Kafka's stray logs).
            if dir.exists() && read_partition_metadata(&dir) != Some(topic_id) {
                tracing::info!(%tp, "removing a stray directory with this partition's name");
                crate::log::delete_dir(&dir).map_err(|e| PartitionError::Storage(e.to_string()))?;
            }
            crate::slow_io::pause(&tp.topic, tp.partition, crate::slow_io::Step::PartitionOpen);
            let mut part = Partition::open(
                dir.clone(),
                tp.clone(),
                topic_id,
                pimg.leader_epoch,
                configs,
                now_ms,
            )
            .inspect_err(|e| self.log_dir_failure.fail(&dir, e))?;
            part.set_log_dir_failure_channel(self.log_dir_failure.clone());
            let part = Arc::new(Mutex::new(part));
            self.partitions
                .write()
                .expect("poisoned")
                .insert(tp.clone(), part.clone());
            Ok(part)
        }
    }

    fn remove_stray_dirs(
        &self,
        wanted: &HashMap<TopicPartition, (Uuid, &crate::metadata::PartitionImage)>,
    ) {
        // Deletions a crash interrupted after their rename.
        match crate::log::remove_deleted_dirs(&self.data_dir) {
            Ok(0) => {}
            Ok(n) => tracing::info!(directories = n, "removed partitions left mid-deletion"),
            Err(e) => tracing::warn!(error = %e, "removing partitions left mid-deletion failed"),
        }
        let Ok(entries) = std::fs::read_dir(&self.data_dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some((topic, part)) = name.rsplit_once('-') else {
                continue;
            };
            let Ok(partition) = part.parse::<i32>() else {
                continue;
            };
            // Without `partition.metadata` a directory belongs to no topic:
            // a deletion or creation a crash interrupted.
            let on_disk = read_partition_metadata(&path);
            let keep = wanted
                .get(&TopicPartition::new(topic, partition))
                .is_some_and(|(id, _)| Some(*id) == on_disk);
            if !keep {
                tracing::info!(dir = %path.display(), "removing stray partition directory");
                if let Err(e) = crate::log::delete_dir(&path) {
                    tracing::warn!(dir = %path.display(), error = %e, "removing a stray directory failed");
                }
            }
        }
    }

    /// Runs retention, compaction, flushing and the checkpoint files on
    /// every partition, one partition at a time. Disk work: run it off the
    /// async workers.
    pub fn maintain_all(&self, now_ms: i64) {
        for (tp, part) in self.all() {
            if let Err(e) = maintain_partition(&tp, &part, now_ms) {
                tracing::error!(%tp, error = %e, "partition maintenance failed");
            }
        }
    }

    /// Closes every partition cleanly (producer snapshots, clean-shutdown
    /// markers), so the next start skips recovery scans.
    pub fn shutdown(&self) {
        let parts: Vec<_> = self.partitions.write().expect("poisoned").drain().collect();
        if self.log_dir_failure.is_offline() {
            // Nothing more is written to a failed directory: no snapshots,
            // no clean-shutdown markers; the next start recovers.
            tracing::warn!("log directory offline: partitions not closed cleanly");
            return;
        }
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

/// One partition's maintenance. Its lock is held for the in-memory steps,
/// the log's housekeeping (`Partition::maintain`) and planning a compaction;
/// the checkpoint files are written and fsynced, and the compaction runs,
/// after it is released, so the partition's requests do not wait for them.
/// The lock is taken again only to swap the cleaned segments in.
fn maintain_partition(
    tp: &TopicPartition,
    part: &PartitionRef,
    now_ms: i64,
) -> Result<(), PartitionError> {
    let (checkpoints, compaction) = {
        let mut p = part.lock().expect("poisoned");
        let checkpoints = p.maintain(now_ms)?;
        (checkpoints, p.compaction_plan(now_ms)?)
    };
    crate::slow_io::pause(
        &tp.topic,
        tp.partition,
        crate::slow_io::Step::MaintenanceWrite,
    );
    checkpoints.write()?;
    if let Some(job) = compaction {
        let cleaned = job.run()?;
        if !part.lock().expect("poisoned").install_compaction(cleaned)? {
            tracing::debug!(%tp, "log changed during compaction; the pass is discarded");
        }
    }
    Ok(())
}
