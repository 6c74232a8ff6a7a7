//! One partition replica: its log, its producer state, its high watermark.
//! Synchronous; the caller holds the partition's lock and passes `now_ms`.

mod checkpoints;
pub mod epochs;
mod follower;
pub mod leader_state;
pub mod producer_state;
mod txn;
pub mod validate;

use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use protocol::record_batch::{rewrite, BatchIter, BatchIterItem, RecordBatchView};
use uuid::Uuid;

use crate::config::TopicConfigs;
use crate::error::PartitionError;
use crate::log::{Cleaned, CompactionJob, Log, LogDirFailureChannel};
use crate::types::{LeaderEpoch, NodeId, Offset, TopicPartition};
pub use checkpoints::Checkpoints;
use checkpoints::{read_high_watermark_checkpoint, CheckpointWriter};
use leader_state::{AssignedState, IsrProposal, LeaderState};
use producer_state::{AbortedTxn, ProducerCheck, ProducerSnapshot, ProducerStateManager};

/// How long an idle producer's state is kept (Kafka's
/// `producer.id.expiration.ms` default).
pub const PRODUCER_ID_EXPIRATION_MS: i64 = 86_400_000;

/// The result of a successful produce to one partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendOutcome {
    pub base_offset: Offset,
    pub last_offset: Offset,
    /// The broker time stamped on the batch, for LogAppendTime topics; -1 otherwise.
    pub log_append_time_ms: i64,
    pub log_start_offset: Offset,
    pub duplicate: bool,
}

/// What a fetch of one partition returns.
#[derive(Clone, Debug)]
pub struct FetchOutcome {
    pub records: Bytes,
    pub high_watermark: Offset,
    pub log_start_offset: Offset,
    pub last_stable_offset: Offset,
    /// read_committed only: the aborted transactions the records overlap.
    pub aborted_transactions: Option<Vec<AbortedTxn>>,
}

/// A [`FetchOutcome`] whose records are file regions, read (or sent) after
/// the partition's lock is released.
pub struct FetchRegions {
    pub regions: Vec<crate::log::FileRegion>,
    pub high_watermark: Offset,
    pub log_start_offset: Offset,
    pub last_stable_offset: Offset,
    /// read_committed only (Kafka sends null otherwise): the aborted
    /// transactions the records overlap.
    pub aborted_transactions: Option<Vec<AbortedTxn>>,
}

pub struct Partition {
    pub tp: TopicPartition,
    pub topic_id: Uuid,
    log: Log,
    producers: ProducerStateManager,
    leader_epoch: LeaderEpoch,
    high_watermark: Offset,
    configs: TopicConfigs,
    /// The configs the produce path reads on every append, parsed once
    /// (TopicConfigs keeps strings, as DescribeConfigs reports them).
    append_config: AppendConfig,
    role: Role,
    /// Bumped whenever the high watermark, the ISR or the role changes, so
    /// acks=all produce requests waiting on this partition re-check.
    events: tokio::sync::watch::Sender<()>,
    /// (epoch, start offset) of the log's leader epochs (`epochs.rs`).
    epochs: epochs::LeaderEpochCache,
    /// Writes the producer snapshot and high-watermark checkpoint, in the
    /// order of their captures (`checkpoints.rs`).
    checkpoint_writer: std::sync::Arc<std::sync::Mutex<CheckpointWriter>>,
    /// The sequence number of the last capture of the checkpoint files.
    checkpoint_seq: u64,
    /// Transactional producers being checked with their coordinator before
    /// their first batch of a transaction here (`txn.rs`); not persisted.
    txn_checks: txn::TxnChecks,
}

/// What this replica does for its partition.
#[derive(Clone, Debug)]
pub enum Role {
    /// Opened, and not (or no longer) given a role by the image.
    None,
    /// This node leads: produce and consumer fetches are served here.
    Leader(Box<LeaderState>),
    /// Another node leads (`NO_LEADER` when nobody does): only replica
    /// fetching writes here, and neither produce nor consumer fetches are served.
    Follower {
        leader: NodeId,
        partition_epoch: i32,
    },
}

/// How far a fetch may read (Kafka's `FetchIsolation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FetchLimit {
    /// read_uncommitted consumers: committed data only.
    HighWatermark,
    /// read_committed consumers: up to the last stable offset, with the
    /// aborted transactions named.
    LastStableOffset,
    /// Followers: everything the leader has.
    LogEnd,
}

impl FetchLimit {
    /// A client's isolation level (0 read_uncommitted, 1 read_committed).
    pub fn for_isolation_level(isolation_level: i8) -> FetchLimit {
        if isolation_level == 1 {
            FetchLimit::LastStableOffset
        } else {
            FetchLimit::HighWatermark
        }
    }
}

/// Where an acks=all produce stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AckState {
    /// The high watermark has not reached the batch yet.
    Waiting,
    Done,
}

/// Writes Kafka's `partition.metadata` file so a directory left by a deleted
/// topic is never mistaken for a new topic of the same name.
/// The file and the directory entries naming it are fsynced before any
/// data is appended, so a directory without it never holds data of a live
/// topic (`ReplicaManager` removes such directories).
pub fn write_partition_metadata(dir: &std::path::Path, topic_id: Uuid) -> std::io::Result<()> {
    let sync_dir = |d: &std::path::Path| std::fs::File::open(d)?.sync_all();
    if !dir.exists() {
        std::fs::create_dir_all(dir)?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
    }
    let tmp = dir.join("partition.metadata.tmp");
    std::fs::write(&tmp, format!("version: 0\ntopic_id: {topic_id}\n"))?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(tmp, dir.join("partition.metadata"))?;
    sync_dir(dir)
}

pub fn read_partition_metadata(dir: &std::path::Path) -> Option<Uuid> {
    let text = std::fs::read_to_string(dir.join("partition.metadata")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("topic_id: "))
        .and_then(|id| id.trim().parse().ok())
}

/// What `append_as_leader` needs from the topic's configs.
#[derive(Clone, Copy, Debug)]
struct AppendConfig {
    max_message_bytes: u32,
    min_insync_replicas: i32,
    compression_target: Option<protocol::record_batch::Codec>,
    compression_level: Option<i32>,
    max_record_bytes: u32,
    log_append_time: bool,
    timestamp_before_max_ms: i64,
    timestamp_after_max_ms: i64,
}

impl From<&TopicConfigs> for AppendConfig {
    fn from(c: &TopicConfigs) -> Self {
        AppendConfig {
            max_message_bytes: c.max_message_bytes(),
            min_insync_replicas: c.min_insync_replicas(),
            compression_target: c.compression_target(),
            compression_level: c.compression_level(),
            max_record_bytes: c.max_decompressed_record_bytes(),
            log_append_time: c.log_append_time(),
            timestamp_before_max_ms: c.message_timestamp_before_max_ms(),
            timestamp_after_max_ms: c.message_timestamp_after_max_ms(),
        }
    }
}

impl Partition {
    /// Opens (recovering) the log and rebuilds the producer state from the
    /// last snapshot plus the log after it.
    pub fn open(
        dir: PathBuf,
        tp: TopicPartition,
        topic_id: Uuid,
        leader_epoch: LeaderEpoch,
        configs: TopicConfigs,
        now_ms: i64,
    ) -> Result<Self, PartitionError> {
        write_partition_metadata(&dir, topic_id)
            .map_err(|e| PartitionError::Storage(e.to_string()))?;
        let log = Log::open(dir.clone(), configs.log_config(), now_ms)?;
        let mut producers = follower::rebuild_producer_state(&log)?;
        producers.expire(now_ms, PRODUCER_ID_EXPIRATION_MS);
        // The last checkpointed high watermark (Kafka's
        // replication-offset-checkpoint), else the log start: a leader then
        // computes it from its ISR (at once when the ISR is itself), a
        // follower takes it from its leader. A stale or missing checkpoint
        // only starts it lower, which is always safe.
        let high_watermark = read_high_watermark_checkpoint(&dir)
            .unwrap_or(Offset(0))
            .min(log.log_end_offset())
            .max(log.log_start_offset());
        producers.on_high_watermark(high_watermark);
        let epochs = follower::epoch_cache_of(&log);
        let checkpoint_writer = CheckpointWriter::new(dir);
        Ok(Self {
            tp,
            topic_id,
            log,
            producers,
            leader_epoch,
            high_watermark,
            append_config: AppendConfig::from(&configs),
            configs,
            role: Role::None,
            events: tokio::sync::watch::channel(()).0,
            epochs,
            checkpoint_writer,
            checkpoint_seq: 0,
            txn_checks: txn::TxnChecks::default(),
        })
    }

    pub fn log_start_offset(&self) -> Offset {
        self.log.log_start_offset()
    }
    pub fn log_end_offset(&self) -> Offset {
        self.log.log_end_offset()
    }
    pub fn high_watermark(&self) -> Offset {
        self.high_watermark
    }
    pub fn leader_epoch(&self) -> LeaderEpoch {
        self.leader_epoch
    }
    pub fn size_bytes(&self) -> u64 {
        self.log.size_bytes()
    }
    pub fn configs(&self) -> &TopicConfigs {
        &self.configs
    }

    /// Makes this partition's log one of the directory's whose health
    /// `channel` tracks (see [`LogDirFailureChannel`]).
    pub fn set_log_dir_failure_channel(&mut self, channel: LogDirFailureChannel) {
        checkpoints::set_dir_failure_channel(&self.checkpoint_writer, channel.clone());
        self.log.set_dir_failure_channel(channel);
    }

    fn offline(&self) -> PartitionError {
        PartitionError::Storage(format!("the log directory of {} is offline", self.tp))
    }

    pub fn set_configs(&mut self, configs: TopicConfigs) {
        self.log.set_config(configs.log_config());
        self.append_config = AppendConfig::from(&configs);
        self.configs = configs;
    }

    /// Validates a client's records for this partition and appends them as
    /// the leader. `acks` is the request's; `acks=-1` requires the in-sync
    /// set to be at least `min.insync.replicas`.
    pub fn append_as_leader(
        &mut self,
        records: &Bytes,
        acks: i16,
        now_ms: i64,
    ) -> Result<AppendOutcome, PartitionError> {
        let Role::Leader(leader) = &self.role else {
            return Err(PartitionError::NotLeaderOrFollower);
        };
        // An offline directory answers nothing, not even a duplicate: the
        // batch it holds may not have reached the disk.
        if self.log.is_offline() {
            return Err(self.offline());
        }
        let isr_size = leader.isr.len();
        let min_isr = leader.effective_min_isr(self.append_config.min_insync_replicas);
        let cfg = self.append_config;
        let max = cfg.max_message_bytes;
        if records.len() > max as usize {
            return Err(PartitionError::MessageTooLarge {
                size: records.len(),
                max,
            });
        }
        let view = single_client_batch(records)?;
        // Kafka checks the committed ISR (not the maximal one) before append.
        if acks == -1 && isr_size < min_isr {
            return Err(PartitionError::NotEnoughReplicas {
                isr: isr_size,
                min_isr: min_isr as i32,
            });
        }
        // Kafka's LogValidator runs before the producer-state check: every
        // record is read once, checked, and re-encoded when the topic's
        // compression.type asks for it. The log's config holds the cleanup
        // policy already parsed.
        let rules = validate::Rules {
            compacted: self.log.config().cleanup_policy.compact,
            target: cfg.compression_target,
            level: cfg.compression_level,
            max_bytes: max,
            max_record_bytes: cfg.max_record_bytes,
            timestamps: if cfg.log_append_time {
                validate::TimestampRule::LogAppendTime
            } else {
                validate::TimestampRule::CreateTime {
                    now_ms,
                    before_max_ms: cfg.timestamp_before_max_ms,
                    after_max_ms: cfg.timestamp_after_max_ms,
                }
            },
        };
        let validated = validate::validate(&view, &self.tp, &rules)?;
        let recompressed = validated.recompressed;
        let records = recompressed.as_ref().unwrap_or(records);
        if let ProducerCheck::Duplicate(m) = self.producers.check(&view)? {
            return Ok(AppendOutcome {
                base_offset: m.first_offset,
                last_offset: m.last_offset,
                log_append_time_ms: if cfg.log_append_time {
                    m.timestamp_ms
                } else {
                    -1
                },
                log_start_offset: self.log.log_start_offset(),
                duplicate: true,
            });
        }
        // Only the header fields Kafka rewrites change; the records are
        // stored exactly as the producer encoded them.
        let base_offset = self.log.log_end_offset();
        let mut batch = BytesMut::from(&records[..]);
        rewrite::set_base_offset(&mut batch, base_offset.0);
        rewrite::set_partition_leader_epoch(&mut batch, self.leader_epoch.0);
        // The max timestamp is the broker's: now on a LogAppendTime topic,
        // the largest record timestamp otherwise (the header's claim is
        // replaced, so a lying header cannot steer retention or rolling).
        let log_append_time_ms = if cfg.log_append_time {
            rewrite::set_log_append_time(&mut batch, now_ms);
            now_ms
        } else {
            rewrite::set_create_time(&mut batch, validated.max_timestamp_ms);
            -1
        };
        let appended = self.log.append(&batch, now_ms);
        let stored =
            RecordBatchView::parse(&batch).map_err(|e| PartitionError::Storage(e.to_string()))?;
        if self.log.log_end_offset() > base_offset {
            // The batch is in the log, even if a flush after it failed (the
            // error still goes back, and the directory is offline): the
            // producer state must know it, or a retry would be stored twice.
            self.producers.update(&stored);
            self.epochs.assign(self.leader_epoch, base_offset);
        }
        appended?;
        // With the leader alone in the ISR the high watermark follows the
        // log end at once; otherwise it waits for the followers' fetches.
        self.maybe_increment_high_watermark(now_ms);
        Ok(AppendOutcome {
            base_offset,
            last_offset: Offset(stored.last_offset()),
            log_append_time_ms,
            log_start_offset: self.log.log_start_offset(),
            duplicate: false,
        })
    }

    /// Reads committed batches from `offset` (the batch containing it first).
    pub fn read(
        &self,
        offset: Offset,
        max_bytes: usize,
        min_one_batch: bool,
    ) -> Result<FetchOutcome, PartitionError> {
        self.read_up_to(offset, max_bytes, min_one_batch, FetchLimit::HighWatermark)
    }

    /// Reads batches from `offset` up to the high watermark (consumers) or
    /// the log end (followers).
    pub fn read_up_to(
        &self,
        offset: Offset,
        max_bytes: usize,
        min_one_batch: bool,
        limit: FetchLimit,
    ) -> Result<FetchOutcome, PartitionError> {
        let found = self.read_regions_up_to(offset, max_bytes, min_one_batch, limit)?;
        let mut records = Vec::new();
        for region in &found.regions {
            region
                .read_into(&mut records)
                .map_err(|e| PartitionError::from(crate::log::LogError::from(e)))?;
        }
        Ok(FetchOutcome {
            records: Bytes::from(records),
            high_watermark: found.high_watermark,
            log_start_offset: found.log_start_offset,
            last_stable_offset: found.last_stable_offset,
            aborted_transactions: found.aborted_transactions,
        })
    }

    /// [`Partition::read_up_to`] without reading the records: where they
    /// are, so the caller reads or sends them outside the partition's lock.
    /// A read_committed fetch is out of range above the high watermark, as
    /// a read_uncommitted one, and between the last stable offset and the
    /// high watermark it gets no records.
    pub fn read_regions_up_to(
        &self,
        offset: Offset,
        max_bytes: usize,
        min_one_batch: bool,
        limit: FetchLimit,
    ) -> Result<FetchRegions, PartitionError> {
        let last_stable_offset = self.last_stable_offset();
        let (in_range, end) = match limit {
            FetchLimit::HighWatermark => (self.high_watermark, self.high_watermark),
            FetchLimit::LastStableOffset => (self.high_watermark, last_stable_offset),
            FetchLimit::LogEnd => (self.log.log_end_offset(), self.log.log_end_offset()),
        };
        if offset > in_range {
            return Err(PartitionError::OffsetOutOfRange {
                requested: offset.0,
                log_start: self.log.log_start_offset().0,
                log_end: in_range.0,
            });
        }
        let (regions, fetched_end) = if offset > end {
            (Vec::new(), offset)
        } else {
            self.log
                .read_regions_to(offset, max_bytes, end, min_one_batch)?
        };
        let aborted_transactions = (limit == FetchLimit::LastStableOffset).then(|| {
            if regions.is_empty() {
                Vec::new()
            } else {
                self.producers.aborted_between(offset, fetched_end)
            }
        });
        Ok(FetchRegions {
            regions,
            high_watermark: self.high_watermark,
            log_start_offset: self.log.log_start_offset(),
            last_stable_offset,
            aborted_transactions,
        })
    }

    /// ListOffsets for one timestamp spec: -1 latest, -2 earliest, -3 max
    /// timestamp, -4 earliest local, otherwise the first offset whose
    /// timestamp is at least `timestamp`. `None` means no such offset.
    /// Latest (-1) is the high watermark for read_uncommitted clients, the
    /// last stable offset for read_committed ones and the log end for a
    /// follower (`FetchLimit::LogEnd`), as Kafka's isolation levels have
    /// it; timestamp and max-timestamp lookups find only offsets below the
    /// client's bound.
    pub fn list_offset(
        &self,
        timestamp: i64,
        limit: FetchLimit,
    ) -> Result<Option<(Offset, i64)>, PartitionError> {
        let bound = match limit {
            FetchLimit::LastStableOffset => self.last_stable_offset(),
            FetchLimit::HighWatermark | FetchLimit::LogEnd => self.high_watermark,
        };
        match timestamp {
            -1 if limit == FetchLimit::LogEnd => Ok(Some((self.log.log_end_offset(), -1))),
            -1 => Ok(Some((bound, -1))),
            -2 | -4 => Ok(Some((self.log.log_start_offset(), -1))),
            -3 => {
                // Kafka filters this one by the client's bound too: a max
                // timestamp above it is no answer, not the next best.
                let (ts, off) = self.log.max_timestamp()?;
                Ok((off.0 >= 0 && off < bound).then_some((off, ts)))
            }
            t if t < 0 => Err(PartitionError::InvalidTimestamp(t)),
            t => Ok(self
                .log
                .offset_for_timestamp(t)?
                .filter(|(o, _)| *o < bound)),
        }
    }

    /// DeleteRecords: moves the log start offset up to `offset` (-1 means
    /// the high watermark). Only on the leader, as in Kafka.
    pub fn delete_records_before(&mut self, offset: i64) -> Result<Offset, PartitionError> {
        if !self.is_leader() {
            return Err(PartitionError::NotLeaderOrFollower);
        }
        let target = if offset == -1 {
            self.high_watermark
        } else {
            Offset(offset)
        };
        if target > self.high_watermark || target.0 < 0 {
            return Err(PartitionError::OffsetOutOfRange {
                requested: offset,
                log_start: self.log.log_start_offset().0,
                log_end: self.high_watermark.0,
            });
        }
        let log_start = self.log.delete_records_before(target)?;
        self.producers.on_log_start(log_start);
        Ok(log_start)
    }

    pub fn role(&self) -> &Role {
        &self.role
    }

    pub fn is_leader(&self) -> bool {
        matches!(self.role, Role::Leader(_))
    }

    pub fn leader_state(&self) -> Option<&LeaderState> {
        match &self.role {
            Role::Leader(l) => Some(l),
            _ => None,
        }
    }

    /// A receiver that sees every change of the high watermark, the ISR or
    /// the role.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<()> {
        self.events.subscribe()
    }

    fn changed(&self) {
        self.events.send_replace(());
    }

    /// Kafka's `checkCurrentLeaderEpoch`: a request that names an older
    /// leader epoch is fenced, a newer one is from a future we have not seen
    /// yet; -1 means the client does not know.
    pub fn check_leader_epoch(&self, current_leader_epoch: i32) -> Result<(), PartitionError> {
        let epoch = self.leader_epoch.0;
        if current_leader_epoch < 0 || current_leader_epoch == epoch {
            Ok(())
        } else if current_leader_epoch < epoch {
            Err(PartitionError::FencedLeaderEpoch)
        } else {
            Err(PartitionError::UnknownLeaderEpoch)
        }
    }

    /// Takes the image's state for a partition this node leads. A new
    /// leader epoch resets the followers' states (Kafka's `makeLeader`); a
    /// new partition epoch under the same leader epoch updates the ISR and
    /// assignment and settles any pending ISR change; an image that did not
    /// change this partition changes nothing, so a pending change stays
    /// pending. Returns true if the high watermark moved.
    pub fn become_leader(
        &mut self,
        local: NodeId,
        state: AssignedState,
        ineligible: std::collections::BTreeSet<NodeId>,
        max_lag_ms: i64,
        now_ms: i64,
    ) -> bool {
        let leo = self.log.log_end_offset();
        let changed = match &mut self.role {
            Role::Leader(l) if l.leader_epoch == state.leader_epoch => {
                // Older or equal partition epochs are images that did not
                // change this partition (or lag behind what we know).
                if state.partition_epoch > l.partition_epoch {
                    l.update_assignment(state);
                    true
                } else {
                    false
                }
            }
            role => {
                let previous = match &*role {
                    Role::Leader(l) => Some(l.as_ref()),
                    _ => None,
                };
                tracing::info!(tp = %self.tp, epoch = state.leader_epoch.0, start = leo.0, isr = ?state.isr, "leading");
                self.leader_epoch = state.leader_epoch;
                // Kafka's `maybeAssignEpochStartOffset`: the new epoch starts
                // here even before an append, so a follower holding entries
                // of a later (lost) epoch truncates to the right offset.
                self.epochs.assign(state.leader_epoch, leo);
                let next = LeaderState::start(local, state, leo, previous, max_lag_ms, now_ms);
                *role = Role::Leader(Box::new(next));
                true
            }
        };
        if let Role::Leader(l) = &mut self.role {
            l.set_ineligible(ineligible);
            l.set_max_lag_ms(max_lag_ms);
        }
        if changed {
            self.high_watermark = self.high_watermark.min(leo);
            self.changed();
        }
        self.maybe_increment_high_watermark(now_ms)
    }

    /// Follows `leader` (or nobody, `NO_LEADER`) at the image's epochs.
    pub fn become_follower(
        &mut self,
        leader: NodeId,
        leader_epoch: LeaderEpoch,
        partition_epoch: i32,
    ) {
        if let Role::Follower {
            leader: l,
            partition_epoch: p,
        } = &self.role
        {
            if *l == leader && self.leader_epoch == leader_epoch && *p == partition_epoch {
                return;
            }
        }
        tracing::info!(tp = %self.tp, leader = leader.0, epoch = leader_epoch.0, "following");
        self.clear_txn_checks();
        self.leader_epoch = leader_epoch;
        self.role = Role::Follower {
            leader,
            partition_epoch,
        };
        self.changed();
    }

    /// The replica leaves this node: waiting producers learn it at once.
    pub fn resign(&mut self) {
        self.clear_txn_checks();
        self.role = Role::None;
        self.changed();
    }

    /// Kafka's `maybeIncrementLeaderHW`. Returns true if it moved; it never
    /// moves back.
    pub fn maybe_increment_high_watermark(&mut self, now_ms: i64) -> bool {
        let Role::Leader(l) = &self.role else {
            return false;
        };
        let leo = self.log.log_end_offset();
        match l.high_watermark_candidate(leo, self.append_config.min_insync_replicas, now_ms) {
            Some(hw) if hw > self.high_watermark => {
                self.high_watermark = hw;
                self.producers.on_high_watermark(hw);
                self.changed();
                true
            }
            _ => false,
        }
    }

    /// A follower fetched from `fetch_offset`: it has everything before it.
    /// Returns true if the high watermark moved.
    pub fn record_follower_fetch(
        &mut self,
        replica: NodeId,
        fetch_offset: Offset,
        now_ms: i64,
    ) -> Result<bool, PartitionError> {
        let leo = self.log.log_end_offset();
        let Role::Leader(l) = &mut self.role else {
            return Err(PartitionError::NotLeaderOrFollower);
        };
        l.record_fetch(replica, fetch_offset, leo, now_ms)
            .ok_or(PartitionError::UnknownLeaderEpoch)?;
        Ok(self.maybe_increment_high_watermark(now_ms))
    }

    /// Whether a follower outside the ISR may now join it (the ISR manager
    /// is woken when this turns true).
    pub fn wants_isr_expand(&self) -> bool {
        self.leader_state()
            .is_some_and(|l| l.expand_candidate(self.high_watermark).is_some())
    }

    /// The next AlterPartition to propose, marked pending.
    pub fn prepare_isr_change(&mut self, now_ms: i64) -> Option<IsrProposal> {
        let leo = self.log.log_end_offset();
        let hw = self.high_watermark;
        let Role::Leader(l) = &mut self.role else {
            return None;
        };
        let p = l.prepare_isr_change(leo, hw, now_ms);
        if p.is_some() {
            self.changed();
        }
        p
    }

    /// The controller applied our AlterPartition (Kafka's
    /// `handleAlterPartitionUpdate`): take the new ISR at once, unless
    /// leadership or a newer image has moved on. Returns true if the high
    /// watermark moved.
    pub fn apply_isr_update(&mut self, state: AssignedState, now_ms: i64) -> bool {
        let Role::Leader(l) = &mut self.role else {
            return false;
        };
        if l.leader_epoch != state.leader_epoch || state.partition_epoch <= l.partition_epoch {
            return false;
        }
        l.update_assignment(state);
        self.changed();
        self.maybe_increment_high_watermark(now_ms)
    }

    /// The controller refused the pending change without applying it.
    pub fn abandon_isr_change(&mut self) {
        if let Role::Leader(l) = &mut self.role {
            l.abandon_pending();
        }
    }

    /// Kafka's `checkEnoughReplicasReachOffset` for an acks=all produce
    /// whose batch ends before `required`: done once the high watermark
    /// reaches it, failed if leadership is lost or the ISR fell below
    /// `min.insync.replicas` after the append.
    pub fn ack_state(&self, required: Offset) -> Result<AckState, PartitionError> {
        let Role::Leader(l) = &self.role else {
            return Err(PartitionError::NotLeaderOrFollower);
        };
        let min_isr = l.effective_min_isr(self.append_config.min_insync_replicas);
        let maximal = l.maximal_isr().len();
        if maximal < min_isr {
            return Err(PartitionError::NotEnoughReplicasAfterAppend {
                isr: maximal,
                min_isr: min_isr as i32,
            });
        }
        Ok(if self.high_watermark >= required {
            AckState::Done
        } else {
            AckState::Waiting
        })
    }

    /// A compaction pass of this partition's log below its high watermark,
    /// to run without the partition's lock ([`CompactionJob::run`]), or
    /// `None` when none is due. Its result goes back through
    /// [`Partition::install_compaction`].
    pub fn compaction_plan(&self, now_ms: i64) -> Result<Option<CompactionJob>, PartitionError> {
        let Some(job) = self.log.compaction_plan(now_ms, self.high_watermark)? else {
            return Ok(None);
        };
        Ok(Some(job.with_aborted_transactions(
            self.aborted_below_high_watermark(),
        )))
    }

    /// Swaps a finished compaction in; `false` when the log changed under
    /// it (retention, truncation) and the work was discarded.
    pub fn install_compaction(&mut self, cleaned: Cleaned) -> Result<bool, PartitionError> {
        Ok(self.log.install(cleaned)?)
    }

    /// Periodic work under the partition's lock: retention, rolling, flush
    /// by `flush.ms`, producer expiry (compaction is planned separately,
    /// [`Partition::compaction_plan`], and runs without the lock). Returns the
    /// checkpoint files' contents (the high watermark, and the producer
    /// state so a restart replays little of the log) for the caller to write
    /// once the lock is released.
    pub fn maintain(&mut self, now_ms: i64) -> Result<Checkpoints, PartitionError> {
        self.log
            .maintain_without_compaction(now_ms, self.high_watermark)?;
        self.producers.on_log_start(self.log.log_start_offset());
        self.producers.expire(now_ms, PRODUCER_ID_EXPIRATION_MS);
        Ok(self.capture_checkpoints())
    }

    /// What the checkpoint files should say now: the high watermark (a
    /// restart starts from it rather than from the log start, so consumers
    /// and the group coordinator's load see committed data before the
    /// followers have fetched again) and the producer state at the log end.
    /// Written by `Checkpoints::write`, which never lets it replace a later
    /// capture.
    pub fn capture_checkpoints(&mut self) -> Checkpoints {
        self.checkpoint_seq += 1;
        Checkpoints {
            seq: self.checkpoint_seq,
            high_watermark: self.high_watermark,
            snapshot: ProducerSnapshot {
                offset: self.log.log_end_offset(),
                state: self.producers.clone(),
            },
            writer: self.checkpoint_writer.clone(),
        }
    }

    /// No capture taken before now is written from here on (they may
    /// describe batches a truncation removed).
    fn fence_checkpoints(&mut self) {
        self.checkpoint_seq += 1;
        checkpoints::fence(&self.checkpoint_writer, self.checkpoint_seq);
    }

    /// Removes the producer snapshot (its batches are gone); a capture taken
    /// before is not written after this.
    fn remove_producer_snapshot(&mut self) -> Result<(), PartitionError> {
        self.checkpoint_seq += 1;
        checkpoints::remove_snapshot(&self.checkpoint_writer, self.checkpoint_seq)
    }

    /// The partition's files are about to be deleted: no checkpoint is
    /// written into its directory any more (one being written finishes
    /// first).
    pub fn retire_checkpoints(&self) {
        checkpoints::retire(&self.checkpoint_writer);
    }

    /// Flushes and closes cleanly (writes the checkpoint files).
    /// A partition whose directory is offline writes nothing more.
    pub fn close(mut self) -> Result<(), PartitionError> {
        if self.log.is_offline() {
            return Err(self.offline());
        }
        self.capture_checkpoints().write()?;
        self.log.close()?;
        Ok(())
    }

    /// Removes the partition's files (topic deletion).
    pub fn delete(self) -> Result<(), PartitionError> {
        self.retire_checkpoints();
        Ok(self.log.delete()?)
    }
}

/// Checks that a produce request's records for one partition are exactly one
/// well-formed v2 batch from a client, as Kafka requires of clients.
fn single_client_batch(records: &Bytes) -> Result<RecordBatchView<'_>, PartitionError> {
    let mut iter = BatchIter::new(records);
    let view = match iter.next() {
        Some(BatchIterItem::Batch { batch, .. }) => batch,
        Some(BatchIterItem::Partial { .. }) => {
            return Err(PartitionError::CorruptMessage(
                "truncated record batch".into(),
            ))
        }
        Some(BatchIterItem::Invalid { error, .. }) => {
            return Err(match error {
                protocol::record_batch::BatchError::BadRecordCount(_)
                | protocol::record_batch::BatchError::UnknownCodec(_) => {
                    PartitionError::InvalidRecord(error.to_string())
                }
                _ => PartitionError::CorruptMessage(error.to_string()),
            })
        }
        None => return Err(PartitionError::InvalidRecord("no record batch".into())),
    };
    if iter.next().is_some() {
        return Err(PartitionError::InvalidRecord(
            "a client produce request must carry one batch per partition".into(),
        ));
    }
    view.verify_crc()
        .map_err(|e| PartitionError::CorruptMessage(e.to_string()))?;
    if view.base_offset() != 0 {
        return Err(PartitionError::InvalidRecord(
            "client batches must have base offset 0".into(),
        ));
    }
    if view.is_control() {
        return Err(PartitionError::InvalidRecord(
            "clients may not send control batches".into(),
        ));
    }
    // Kafka's LogValidator.validateBatch for a client's batch.
    let count = view.record_count();
    if count <= 0 {
        return Err(PartitionError::InvalidRecord(format!(
            "Invalid reported count for record batch: {count}"
        )));
    }
    if i64::from(view.last_offset_delta()) + 1 != i64::from(count) {
        return Err(PartitionError::InvalidRecord(format!(
            "Inconsistent batch offset range [0, {}] and count of records {count}",
            view.last_offset_delta()
        )));
    }
    if view.producer_id() >= 0 && view.base_sequence() < 0 {
        return Err(PartitionError::InvalidRecord(format!(
            "Invalid sequence number {} in record batch with producerId {}",
            view.base_sequence(),
            view.producer_id()
        )));
    }
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    fn encode(values: &[&str], compression: Compression) -> Bytes {
        let records: Vec<Record> = values
            .iter()
            .enumerate()
            .map(|(i, v)| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: i as i32 - 1,
                timestamp: 1_000 + i as i64,
                key: Some(Bytes::from(format!("k{i}"))),
                value: Some(Bytes::from(v.to_string())),
                headers: Default::default(),
            })
            .collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .unwrap();
        buf.freeze()
    }

    fn open_partition(dir: &std::path::Path, min_isr: &str) -> Partition {
        let server = crate::config::ServerConfig::default();
        let overrides = [("min.insync.replicas".to_string(), min_isr.to_string())].into();
        Partition::open(
            dir.join("t-0"),
            TopicPartition::new("t", 0),
            Uuid::new_v4(),
            LeaderEpoch(0),
            TopicConfigs::resolve(&server, &overrides),
            0,
        )
        .unwrap()
    }

    fn assigned(epoch: i32, partition_epoch: i32, isr: &[i32]) -> AssignedState {
        AssignedState {
            leader_epoch: LeaderEpoch(epoch),
            partition_epoch,
            replicas: vec![NodeId(1), NodeId(2)],
            isr: isr.iter().map(|&n| NodeId(n)).collect(),
        }
    }

    #[test]
    fn the_leader_commits_what_the_isr_has_fetched() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = open_partition(dir.path(), "1");
        let batch = encode(&["a", "b"], Compression::None);
        // No role yet: nothing is accepted.
        assert!(matches!(
            p.append_as_leader(&batch, -1, 0),
            Err(PartitionError::NotLeaderOrFollower)
        ));
        p.become_leader(
            NodeId(1),
            assigned(0, 0, &[1, 2]),
            Default::default(),
            10_000,
            0,
        );
        let out = p.append_as_leader(&batch, -1, 1).unwrap();
        let required = out.last_offset.next();
        assert_eq!(p.high_watermark(), Offset(0));
        assert_eq!(p.ack_state(required).unwrap(), AckState::Waiting);
        // Consumers see nothing, followers see the batch.
        assert!(p.read(Offset(0), 1 << 20, true).unwrap().records.is_empty());
        assert!(!p
            .read_up_to(Offset(0), 1 << 20, true, FetchLimit::LogEnd)
            .unwrap()
            .records
            .is_empty());
        let mut events = p.subscribe();
        assert!(!p.record_follower_fetch(NodeId(2), Offset(0), 2).unwrap());
        assert!(p.record_follower_fetch(NodeId(2), Offset(2), 3).unwrap());
        assert!(events.has_changed().unwrap());
        events.mark_unchanged();
        assert_eq!(p.high_watermark(), Offset(2));
        assert_eq!(p.ack_state(required).unwrap(), AckState::Done);
        assert!(matches!(
            p.record_follower_fetch(NodeId(3), Offset(2), 3),
            Err(PartitionError::UnknownLeaderEpoch)
        ));
        // Leadership moves away: waiting producers learn it.
        p.become_follower(NodeId(2), LeaderEpoch(1), 1);
        assert!(events.has_changed().unwrap());
        assert!(matches!(
            p.ack_state(required),
            Err(PartitionError::NotLeaderOrFollower)
        ));
        assert_eq!(p.check_leader_epoch(0).unwrap_err().code(), 74);
        assert_eq!(p.check_leader_epoch(2).unwrap_err().code(), 75);
        assert!(p.check_leader_epoch(1).is_ok() && p.check_leader_epoch(-1).is_ok());
    }

    #[test]
    fn the_high_watermark_survives_a_restart_through_its_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = open_partition(dir.path(), "1");
        p.become_leader(
            NodeId(1),
            assigned(0, 0, &[1, 2]),
            Default::default(),
            10_000,
            0,
        );
        for _ in 0..3 {
            p.append_as_leader(&encode(&["a"], Compression::None), 1, 1)
                .unwrap();
        }
        p.record_follower_fetch(NodeId(2), Offset(2), 2).unwrap();
        assert_eq!(p.high_watermark(), Offset(2));
        p.close().unwrap();
        let p = open_partition(dir.path(), "1");
        // Committed before the restart, so visible before any follower fetch.
        assert_eq!(p.high_watermark(), Offset(2));
        assert_eq!(p.log_end_offset(), Offset(3));
    }

    #[test]
    fn min_insync_replicas_gates_acks_all_before_and_after_the_append() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = open_partition(dir.path(), "2");
        let batch = encode(&["a"], Compression::None);
        p.become_leader(
            NodeId(1),
            assigned(0, 0, &[1]),
            Default::default(),
            10_000,
            0,
        );
        assert!(matches!(
            p.append_as_leader(&batch, -1, 1),
            Err(PartitionError::NotEnoughReplicas { isr: 1, min_isr: 2 })
        ));
        assert_eq!(p.log_end_offset(), Offset(0));
        // acks=1 appends, but nothing is committed below min ISR.
        p.append_as_leader(&batch, 1, 1).unwrap();
        assert_eq!(p.high_watermark(), Offset(0));
        // The image adds node 2 (a new partition epoch, same leader epoch).
        p.become_leader(
            NodeId(1),
            assigned(0, 1, &[1, 2]),
            Default::default(),
            10_000,
            2,
        );
        let out = p.append_as_leader(&batch, -1, 3).unwrap();
        p.record_follower_fetch(NodeId(2), Offset(1), 4).unwrap();
        assert_eq!(p.high_watermark(), Offset(1));
        // The ISR shrinks to the leader while the produce waits.
        // (The high watermark cannot move: the ISR is now below min ISR.)
        assert!(!p.apply_isr_update(assigned(0, 2, &[1]), 5));
        assert!(matches!(
            p.ack_state(out.last_offset.next()),
            Err(PartitionError::NotEnoughReplicasAfterAppend { isr: 1, min_isr: 2 })
        ));
        // A stale answer (older partition epoch) changes nothing.
        assert!(!p.apply_isr_update(assigned(0, 1, &[1, 2]), 6));
        assert_eq!(p.leader_state().unwrap().isr, vec![NodeId(1)]);
    }

    #[test]
    fn client_batches_are_validated() {
        let good = encode(&["a", "bb", "ccc"], Compression::None);
        single_client_batch(&good).unwrap();
        single_client_batch(&encode(&["a"], Compression::Gzip)).unwrap();
        let two = Bytes::from([&good[..], &good[..]].concat());
        assert!(matches!(
            single_client_batch(&two),
            Err(PartitionError::InvalidRecord(_))
        ));
        let mut offset = BytesMut::from(&good[..]);
        rewrite::set_base_offset(&mut offset, 5);
        assert!(matches!(
            single_client_batch(&offset.freeze()),
            Err(PartitionError::InvalidRecord(_))
        ));
        let truncated = good.slice(..good.len() - 1);
        assert!(matches!(
            single_client_batch(&truncated),
            Err(PartitionError::CorruptMessage(_))
        ));
    }

    /// Rewrites the record count and fixes the CRC, so only the record walk
    /// can notice.
    fn with_record_count(batch: &Bytes, count: i32) -> Bytes {
        let mut b = BytesMut::from(&batch[..]);
        b[57..61].copy_from_slice(&count.to_be_bytes());
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b.freeze()
    }

    /// `batch` with lastOffsetDelta replaced and the CRC fixed.
    fn with_last_offset_delta(batch: &Bytes, delta: i32) -> Bytes {
        let mut b = BytesMut::from(&batch[..]);
        b[23..27].copy_from_slice(&delta.to_be_bytes());
        rewrite::update_crc(&mut b);
        b.freeze()
    }

    fn leader(dir: &std::path::Path) -> Partition {
        let mut p = open_partition(dir, "1");
        p.become_leader(
            NodeId(1),
            assigned(0, 0, &[1]),
            Default::default(),
            10_000,
            0,
        );
        p
    }

    #[test]
    fn batch_headers_must_agree_with_their_record_count() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = leader(dir.path());
        let good = encode(&["a", "bb", "ccc"], Compression::None);
        let mut bad = vec![with_record_count(&good, 2)];
        // lastOffsetDelta past the record count, in every codec (Kafka's
        // "Inconsistent batch offset range").
        for codec in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            bad.push(with_last_offset_delta(
                &encode(&["a", "bb", "ccc"], codec),
                3,
            ));
        }
        // An idempotent batch without a sequence.
        let mut no_seq = BytesMut::from(&good[..]);
        no_seq[43..51].copy_from_slice(&7i64.to_be_bytes());
        rewrite::update_crc(&mut no_seq);
        bad.push(no_seq.freeze());
        for b in &bad {
            let err = p.append_as_leader(b, 1, 1).unwrap_err();
            assert_eq!(err.code(), 87, "INVALID_RECORD: {err}");
        }
        assert_eq!(p.log_end_offset(), Offset(0));
        p.append_as_leader(&good, 1, 1).unwrap();
    }

    #[test]
    fn the_stored_max_timestamp_is_the_records_not_the_headers() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = leader(dir.path());
        // The records' timestamps are 1000..1002; the header claims an hour later.
        let honest = encode(&["a", "b", "c"], Compression::Lz4);
        let mut lying = BytesMut::from(&honest[..]);
        lying[35..43].copy_from_slice(&3_601_000i64.to_be_bytes());
        rewrite::update_crc(&mut lying);
        p.append_as_leader(&lying.freeze(), 1, 1_000).unwrap();
        let stored = p
            .read_up_to(Offset(0), 1 << 20, true, FetchLimit::LogEnd)
            .unwrap()
            .records;
        let view = RecordBatchView::parse(&stored).unwrap();
        view.verify_crc().unwrap();
        assert_eq!(view.max_timestamp(), 1_002);
        // A record two hours ahead of the broker's clock is refused, and
        // nothing of its batch is stored.
        let err = p
            .append_as_leader(&honest, 1, 1_002 - 7_200_000)
            .unwrap_err();
        assert_eq!(err.code(), 32, "INVALID_TIMESTAMP: {err}");
        assert_eq!(p.log_end_offset(), Offset(3));
    }

    #[test]
    fn an_idempotent_retry_after_a_failed_fsync_is_not_stored_twice() {
        use crate::log::faults;
        let dir = tempfile::tempdir().unwrap();
        let server = crate::config::ServerConfig::default();
        let overrides = [("flush.messages".to_string(), "1".to_string())].into();
        let mut p = Partition::open(
            dir.path().join("t-0"),
            TopicPartition::new("t", 0),
            Uuid::new_v4(),
            LeaderEpoch(0),
            TopicConfigs::resolve(&server, &overrides),
            0,
        )
        .unwrap();
        p.become_leader(
            NodeId(1),
            assigned(0, 0, &[1]),
            Default::default(),
            10_000,
            0,
        );
        let record = Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: 7,
            producer_epoch: 0,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: 0,
            timestamp: 1_000,
            key: None,
            value: Some(Bytes::from_static(b"v")),
            headers: Default::default(),
        };
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &[record],
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .unwrap();
        let batch = buf.freeze();
        // The write lands, the fsync after it fails.
        faults::inject(faults::Fault {
            dir: dir.path().to_path_buf(),
            op: faults::FaultOp::Sync,
            after: 0,
            errno: faults::EIO,
        });
        let err = p.append_as_leader(&batch, -1, 1).unwrap_err();
        faults::clear(dir.path());
        assert_eq!(err.code(), 56, "{err}");
        // The producer state knows the batch the log holds ...
        let view = RecordBatchView::parse(&batch).unwrap();
        assert!(matches!(
            p.producers.check(&view),
            Ok(ProducerCheck::Duplicate(_))
        ));
        // ... and the retry is not stored again.
        let retry = p.append_as_leader(&batch, -1, 2);
        assert!(retry.as_ref().is_err_and(|e| e.code() == 56), "{retry:?}");
        assert_eq!(p.log_end_offset(), Offset(1));
    }
}
