//! Share-partitions on the leader of their topic-partition (Kafka's
//! `SharePartitionManager`): each (group, topic-partition) a member fetches
//! is loaded from the share coordinator through the persister, at the
//! partition's leader epoch (which fences the previous leader's writes),
//! and every change of a record's state that must outlive this leader
//! (acknowledge, release, lock expiry) is written back before it takes
//! effect.
//!
//! Invariants:
//! - a change is applied to a copy, written through the persister, and
//!   only then swapped in: what a member is told was accepted is durable,
//!   and a failed write leaves the in-memory state as the coordinator has
//!   it;
//! - acquisitions are not written (as in Kafka): after a leader change an
//!   acquired record is available again, delivered once more, never lost;
//! - a share-partition loaded at one leader epoch is dropped when the
//!   partition's epoch moves, so a new term reloads it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

use super::config::{AutoOffsetReset, ShareGroupSettings};
use super::coordinator::ShareCoordError;
use super::dlq::DlqRecord;
use bytes::{Bytes, BytesMut};

use super::partition::{
    AckBatch, AckError, AckType, AcquireMode, Acquired, Limits, LogBatch, SharePartition,
};
use super::records::SharePartitionKey;
use super::store::Write;
use crate::broker::{now_ms, Broker};
use crate::error::PartitionError;
use crate::partition::producer_state::AbortedTxn;
use crate::partition::FetchLimit;
use crate::types::{Offset, TopicPartition};

/// Why a share-partition operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaderError {
    #[error("this node does not lead the partition")]
    NotLeaderOrFollower,
    #[error("unknown topic or partition")]
    UnknownTopicOrPartition,
    #[error("{0:?}")]
    Ack(AckError),
    #[error("share state: {0}")]
    State(#[from] ShareCoordError),
}

impl LeaderError {
    /// The error code a ShareFetch or ShareAcknowledge partition gets.
    pub fn code(&self) -> i16 {
        use kafka_protocol::ResponseError as E;
        match self {
            LeaderError::NotLeaderOrFollower => E::NotLeaderOrFollower.code(),
            LeaderError::UnknownTopicOrPartition => E::UnknownTopicOrPartition.code(),
            LeaderError::Ack(AckError::InvalidRequest) => E::InvalidRequest.code(),
            LeaderError::Ack(AckError::InvalidRecordState) => E::InvalidRecordState.code(),
            // A write the share coordinator refused or did not take in
            // time: the acknowledgement did not happen; the records stay
            // where they were and are delivered again.
            LeaderError::State(ShareCoordError::FencedLeaderEpoch) => E::NotLeaderOrFollower.code(),
            LeaderError::State(e) => match e.code() {
                c if c == E::InvalidRequest.code() => E::UnknownServerError.code(),
                c => c,
            },
        }
    }
}

/// One loaded share-partition.
pub struct Loaded {
    pub topic_id: Uuid,
    pub partition_index: i32,
    pub leader_epoch: i32,
    pub state_epoch: i32,
    pub partition: SharePartition,
}

type Entry = Arc<tokio::sync::Mutex<Option<Loaded>>>;

/// The log bytes one share fetch of a partition reads at least (up to its
/// `max_bytes`); more when it may acquire more than 512 records.
const READ_BYTES: usize = 1 << 20;

/// What one fetch may acquire on a share-partition.
#[derive(Clone, Copy, Debug)]
pub struct Want {
    /// Bytes of log read, at least one batch.
    pub max_bytes: usize,
    pub max_records: usize,
    /// Whether whole batches are acquired past `max_records` (KIP-1206).
    pub mode: AcquireMode,
}

#[derive(Default)]
pub struct ShareLeaders {
    parts: Mutex<HashMap<(String, TopicPartition), Entry>>,
    /// Woken when records may have become available without an append
    /// (acknowledged, released, or their locks expired): a waiting share
    /// fetch looks again, as Kafka completes its delayed share fetches.
    pub changed: tokio::sync::Notify,
}

impl ShareLeaders {
    /// The share-partition of `group` on `tp`, loaded (and initialized, the
    /// first time any member of the group reads it, from the group's
    /// `share.auto.offset.reset`) if it was not. The guard holds it: one
    /// operation at a time per share-partition.
    pub async fn get(
        &self,
        broker: &Broker,
        group: &str,
        tp: &TopicPartition,
    ) -> Result<tokio::sync::OwnedMutexGuard<Option<Loaded>>, LeaderError> {
        let (topic_id, epoch) = leadership(broker, tp)?;
        let entry = self
            .parts
            .lock()
            .expect("poisoned")
            .entry((group.to_string(), tp.clone()))
            .or_default()
            .clone();
        let mut guard = entry.lock_owned().await;
        if guard
            .as_ref()
            .is_some_and(|l| l.leader_epoch != epoch || l.topic_id != topic_id)
        {
            *guard = None;
        }
        if guard.is_none() {
            *guard = Some(load(broker, group, tp, topic_id, epoch).await?);
        }
        Ok(guard)
    }

    /// Applies `member`'s acknowledgements, all or nothing, once the share
    /// coordinator has the resulting state.
    pub async fn acknowledge(
        &self,
        broker: &Broker,
        group: &str,
        tp: &TopicPartition,
        member: &str,
        batches: &[AckBatch],
    ) -> Result<(), LeaderError> {
        // As Kafka: a group with `share.renew.acknowledge.enable=false`
        // refuses renewals (INVALID_RECORD_STATE).
        let renews = batches.iter().any(|b| b.types.contains(&AckType::Renew));
        if renews && !settings(broker, group).renew_acknowledge_enable {
            return Err(LeaderError::Ack(AckError::InvalidRecordState));
        }
        let mut guard = self.get(broker, group, tp).await?;
        let loaded = guard.as_mut().expect("loaded by get");
        let mut next = loaded.partition.clone();
        next.acknowledge(member, batches, now_ms())
            .map_err(LeaderError::Ack)?;
        // Renewals only move lock deadlines, which are not persisted (a
        // new leader makes acquired records available again).
        if batches
            .iter()
            .all(|b| b.types.iter().all(|t| *t == AckType::Renew))
        {
            loaded.partition = next;
            return Ok(());
        }
        let written = persist(broker, group, loaded, next).await;
        if written.is_ok() {
            send_dead(broker, group, tp, &mut loaded.partition);
            self.changed.notify_waiters();
        }
        if let Err(LeaderError::State(
            ShareCoordError::FencedStateEpoch | ShareCoordError::FencedLeaderEpoch,
        )) = written
        {
            // Stale (the offsets were altered, or a newer leader wrote):
            // the next operation loads the coordinator's state.
            *guard = None;
        }
        written
    }

    /// Acquires records of `tp` for `member`: reads the log from the
    /// share-partition's next fetch offset (at most `max_bytes`, at least
    /// one batch) and locks what is available, at most `max_records`.
    /// Returns the batches that hold acquired records and the acquired
    /// runs; `None` when nothing was acquired. Acquisitions are not written
    /// (a new leader makes them available again).
    pub async fn fetch(
        &self,
        broker: &Broker,
        group: &str,
        tp: &TopicPartition,
        member: &Arc<str>,
        want: Want,
    ) -> Result<Option<(Bytes, Vec<Acquired>)>, LeaderError> {
        let Want {
            max_bytes,
            max_records,
            mode,
        } = want;
        let read_committed = settings(broker, group).read_committed;
        let mut guard = self.get(broker, group, tp).await?;
        let loaded = guard.as_mut().expect("loaded by get");
        let part = broker
            .replicas
            .get(tp)
            .ok_or(LeaderError::NotLeaderOrFollower)?;
        let read = {
            let part = part.lock().expect("partition poisoned");
            loaded.partition.move_log_start(part.log_start_offset().0);
            if !loaded.partition.can_acquire() {
                return Ok(None);
            }
            let limit = if read_committed {
                FetchLimit::LastStableOffset
            } else {
                FetchLimit::HighWatermark
            };
            let from = loaded.partition.next_fetch_offset();
            // What one acquisition can hand out, not the client's whole
            // `max_bytes` (50 MiB by default): reading and copying that
            // much to hand out `max_records` was most of a share fetch's
            // cost. At least one batch is read, whatever its size.
            let read_bytes = max_bytes.min(READ_BYTES.max(max_records.saturating_mul(2048)));
            match part.read_up_to(Offset(from), read_bytes, true, limit) {
                Ok(read) => read,
                // Past the high watermark (a truncated log): nothing yet.
                Err(PartitionError::OffsetOutOfRange { .. }) => return Ok(None),
                Err(_) => return Err(LeaderError::NotLeaderOrFollower),
            }
        };
        let batches = log_batches(&read.records, read.aborted_transactions.as_deref());
        if batches.is_empty() {
            return Ok(None);
        }
        let bounds: Vec<LogBatch> = batches.iter().map(|(b, _)| *b).collect();
        let acquired = loaded
            .partition
            .acquire(member, &bounds, max_records, mode, now_ms());
        send_dead(broker, group, tp, &mut loaded.partition);
        if acquired.is_empty() {
            return Ok(None);
        }
        // Only the batches that hold an acquired record go to the member:
        // a view of what was read when they are adjacent (the usual case),
        // a copy of them otherwise.
        let handed: Vec<std::ops::Range<usize>> = batches
            .iter()
            .filter(|(b, _)| {
                acquired
                    .iter()
                    .any(|a| a.first_offset <= b.last_offset && b.first_offset <= a.last_offset)
            })
            .map(|(_, range)| range.clone())
            .collect();
        let adjacent = handed.windows(2).all(|w| w[0].end == w[1].start);
        let records = match (handed.first(), handed.last()) {
            (Some(first), Some(last)) if adjacent => read.records.slice(first.start..last.end),
            _ => {
                let mut out = BytesMut::new();
                for range in &handed {
                    out.extend_from_slice(&read.records[range.clone()]);
                }
                out.freeze()
            }
        };
        Ok(Some((records, acquired)))
    }

    /// Ends every lock `member` holds in `group` (its share session closed
    /// or it left the group): the records are available again.
    pub async fn release_member(
        &self,
        broker: &Broker,
        group: &str,
        member: &str,
    ) -> Result<usize, LeaderError> {
        let mut released = 0;
        for (tp, entry) in self.entries_of(group) {
            let mut guard = entry.lock_owned().await;
            let Some(loaded) = guard.as_mut() else {
                continue;
            };
            let mut next = loaded.partition.clone();
            let n = next.release_member(member);
            if n > 0 {
                if let Err(e) = persist(broker, group, loaded, next).await {
                    tracing::info!(group, %tp, error = %e, "releasing a member's records failed");
                    *guard = None;
                    continue;
                }
                send_dead(broker, group, &tp, &mut loaded.partition);
                self.changed.notify_waiters();
                released += n;
            }
        }
        Ok(released)
    }

    /// Expires the locks past their deadline on every loaded
    /// share-partition, writing the result; a share-partition whose write
    /// fails is unloaded, to be reloaded from the coordinator's state.
    /// Returns how many records became available (or were archived at the
    /// delivery limit).
    pub async fn expire_locks(&self, broker: &Broker) -> usize {
        let now = now_ms();
        let entries: Vec<((String, TopicPartition), Entry)> = self
            .parts
            .lock()
            .expect("poisoned")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut expired = 0;
        for ((group, tp), entry) in entries {
            let mut guard = entry.lock_owned().await;
            let Some(loaded) = guard.as_mut() else {
                continue;
            };
            if loaded.partition.next_deadline_ms().is_none_or(|d| d > now) {
                continue;
            }
            let mut next = loaded.partition.clone();
            let n = next.expire_locks(now);
            if n == 0 {
                continue;
            }
            match persist(broker, &group, loaded, next).await {
                Ok(()) => {
                    send_dead(broker, &group, &tp, &mut loaded.partition);
                    self.changed.notify_waiters();
                    expired += n
                }
                Err(e) => {
                    tracing::info!(group, %tp, error = %e, "writing expired locks failed");
                    *guard = None;
                }
            }
        }
        expired
    }

    /// Ends the share sessions unused for a share session timeout (their
    /// member stopped fetching without closing them): what their members
    /// held is available again.
    pub async fn expire_sessions(&self, broker: &Broker) {
        let idle_before = now_ms() - broker.config.share.session_timeout_ms.default;
        let idle = broker
            .share_sessions
            .lock()
            .expect("poisoned")
            .expire(idle_before);
        for (group, member, _) in idle {
            tracing::info!(group, member, "share session expired");
            if let Err(e) = self.release_member(broker, &group, &member).await {
                tracing::info!(group, member, error = %e, "releasing an expired session's records failed");
            }
        }
    }

    /// Forgets the loaded share-partition of `group` on `tp` (its state was
    /// reset or deleted): the next fetch loads the coordinator's.
    pub fn forget(&self, group: &str, tp: &TopicPartition) {
        self.parts
            .lock()
            .expect("poisoned")
            .remove(&(group.to_string(), tp.clone()));
    }

    /// Ends the share sessions `connection` opened, which closed (as Kafka
    /// does on a disconnect): what their members held is available again
    /// at once, not when the locks run out.
    pub async fn close_connection(&self, broker: &Broker, connection: u64) {
        let gone = broker
            .share_sessions
            .lock()
            .expect("poisoned")
            .close_connection(connection);
        for (group, member) in gone {
            if let Err(e) = self.release_member(broker, &group, &member).await {
                tracing::info!(group, member, error = %e, "releasing a disconnected member's records failed");
            }
        }
    }

    /// Drops the share-partitions that need not stay loaded: those of
    /// partitions this node no longer leads at the epoch they were loaded
    /// at, and those no share session fetches and with nothing acquired
    /// (reloaded from the share coordinator when fetched again, so an
    /// AlterShareGroupOffsets or a deletion is seen). `in_use` are the
    /// (group, (topic id, partition)) the sessions fetch.
    pub fn unload(
        &self,
        broker: &Broker,
        in_use: &std::collections::HashSet<(String, (Uuid, i32))>,
    ) {
        let mut parts = self.parts.lock().expect("poisoned");
        parts.retain(|(group, tp), entry| {
            let Ok(mut guard) = entry.try_lock() else {
                return true;
            };
            let keep = match (guard.as_ref(), leadership(broker, tp)) {
                (Some(l), Ok((_, epoch))) => {
                    l.leader_epoch == epoch
                        && (l.partition.acquired_count() > 0
                            || in_use.contains(&(group.clone(), (l.topic_id, l.partition_index))))
                }
                _ => false,
            };
            if !keep {
                *guard = None;
            }
            keep
        });
    }

    fn entries_of(&self, group: &str) -> Vec<(TopicPartition, Entry)> {
        self.parts
            .lock()
            .expect("poisoned")
            .iter()
            .filter(|((g, _), _)| g == group)
            .map(|((_, tp), e)| (tp.clone(), e.clone()))
            .collect()
    }
}

/// The batches of `records` (whole batches, as the log returns them) with
/// where each lies in it. A data batch of an aborted transaction counts as a
/// control batch: it is archived, never delivered (read_committed; the
/// aborted transactions are `None` for read_uncommitted).
fn log_batches(
    records: &[u8],
    aborted: Option<&[AbortedTxn]>,
) -> Vec<(LogBatch, std::ops::Range<usize>)> {
    const ATTRIBUTES: usize = 21;
    const LAST_OFFSET_DELTA: usize = 23;
    const PRODUCER_ID: usize = 43;
    const HEADER: usize = 61;
    let mut out = Vec::new();
    let mut pos = 0usize;
    while records.len() - pos >= HEADER {
        let b = &records[pos..];
        let base = i64::from_be_bytes(b[0..8].try_into().expect("8 bytes"));
        let len = i32::from_be_bytes(b[8..12].try_into().expect("4 bytes"));
        let Some(total) = usize::try_from(len).ok().and_then(|l| l.checked_add(12)) else {
            break;
        };
        if total < HEADER || total > b.len() {
            break;
        }
        let attributes = i16::from_be_bytes([b[ATTRIBUTES], b[ATTRIBUTES + 1]]);
        let delta = i32::from_be_bytes(
            b[LAST_OFFSET_DELTA..LAST_OFFSET_DELTA + 4]
                .try_into()
                .expect("4 bytes"),
        );
        let producer_id =
            i64::from_be_bytes(b[PRODUCER_ID..PRODUCER_ID + 8].try_into().expect("8 bytes"));
        let last = base + i64::from(delta.max(0));
        let transactional = attributes & 0x10 != 0;
        let aborted_data = transactional
            && aborted.is_some_and(|txns| {
                txns.iter().any(|t| {
                    t.producer_id == producer_id
                        && t.first_offset.0 <= base
                        && last <= t.last_offset.0
                })
            });
        out.push((
            LogBatch {
                first_offset: base,
                last_offset: last,
                control: attributes & 0x20 != 0 || aborted_data,
            },
            pos..pos + total,
        ));
        pos += total;
    }
    out
}

/// Sends what the last operation on `partition` archived undelivered to
/// the group's dead-letter queue, if it has one.
fn send_dead(broker: &Broker, group: &str, tp: &TopicPartition, partition: &mut SharePartition) {
    let dead = partition.take_dead();
    if dead.is_empty() {
        return;
    }
    let s = settings(broker, group);
    let Some(topic) = s.dlq_topic else {
        return;
    };
    broker
        .share_dlq
        .enqueue(dead.into_iter().map(|dead| DlqRecord {
            group: group.to_string(),
            dlq_topic: topic.clone(),
            copy_record: s.dlq_copy_record,
            source: tp.clone(),
            dead,
        }));
}

/// The topic id and leader epoch of `tp`, if this node leads it.
fn leadership(broker: &Broker, tp: &TopicPartition) -> Result<(Uuid, i32), LeaderError> {
    let image = broker.metadata.image();
    let topic = image
        .topics
        .get(&*tp.topic)
        .ok_or(LeaderError::UnknownTopicOrPartition)?;
    let p = topic
        .partitions
        .get(tp.partition as usize)
        .ok_or(LeaderError::UnknownTopicOrPartition)?;
    let local = broker.replicas.get(tp).is_some();
    if p.leader != broker.node_id() || !local {
        return Err(LeaderError::NotLeaderOrFollower);
    }
    Ok((topic.topic_id, p.leader_epoch.0))
}

/// `group`'s share settings as the metadata image has them now.
pub(crate) fn settings(broker: &Broker, group: &str) -> ShareGroupSettings {
    let image = broker.metadata.image();
    let empty = Default::default();
    ShareGroupSettings::resolve(
        &broker.config.share,
        image.group_configs.get(group).unwrap_or(&empty),
    )
}

fn limits(s: &ShareGroupSettings) -> Limits {
    Limits {
        max_in_flight: s.partition_max_record_locks.max(1) as usize,
        delivery_limit: s.delivery_count_limit.clamp(1, i16::MAX as i64) as i16,
        lock_duration_ms: s.record_lock_duration_ms,
    }
}

/// Reads the share-partition's state at `epoch`; the first time, initializes
/// it where `share.auto.offset.reset` says.
async fn load(
    broker: &Broker,
    group: &str,
    tp: &TopicPartition,
    topic_id: Uuid,
    epoch: i32,
) -> Result<Loaded, LeaderError> {
    let key = SharePartitionKey {
        group_id: group.to_string(),
        topic_id,
        partition: tp.partition,
    };
    let s = settings(broker, group);
    let persister = &broker.share_persister;
    // Only the coordinator's "uninitialized" answer leads to an
    // initialize: any other refusal must not reset a state that exists.
    let state = match persister.read(broker, &key, epoch).await {
        Err(ShareCoordError::Uninitialized) => {
            let start = reset_offset(broker, tp, &s)?;
            persister.initialize(broker, &key, 0, start).await?;
            persister.read(broker, &key, epoch).await?
        }
        other => other?,
    };
    // A state initialized without an offset (-1) starts where the group's
    // reset policy says.
    let start = if state.start_offset < 0 {
        reset_offset(broker, tp, &s)?
    } else {
        state.start_offset
    };
    Ok(Loaded {
        topic_id,
        partition_index: tp.partition,
        leader_epoch: epoch,
        state_epoch: state.state_epoch,
        partition: SharePartition::restore(start, &state.batches, limits(&s)),
    })
}

/// Where a share group starts on a partition it never consumed: the log
/// start (`earliest`), the high watermark, or the last stable offset for a
/// `read_committed` group (`latest`), or the first record at most the
/// duration old (`by_duration`, the latest if none is).
fn reset_offset(
    broker: &Broker,
    tp: &TopicPartition,
    s: &ShareGroupSettings,
) -> Result<i64, LeaderError> {
    let part = broker
        .replicas
        .get(tp)
        .ok_or(LeaderError::NotLeaderOrFollower)?;
    let part = part.lock().expect("partition poisoned");
    let limit = if s.read_committed {
        FetchLimit::LastStableOffset
    } else {
        FetchLimit::HighWatermark
    };
    let timestamp = match s.auto_offset_reset {
        AutoOffsetReset::Earliest => -2,
        AutoOffsetReset::Latest => -1,
        AutoOffsetReset::ByDuration { ms } => now_ms().saturating_sub(ms).max(0),
    };
    let found = part
        .list_offset(timestamp, limit)
        .map_err(|_| LeaderError::NotLeaderOrFollower)?;
    Ok(match found {
        Some((offset, _)) => offset.0,
        None => part
            .list_offset(-1, limit)
            .ok()
            .flatten()
            .map_or(0, |(o, _)| o.0),
    })
}

/// Writes `next`'s state and, once the coordinator has it, makes it the
/// share-partition's. On a fenced write the share-partition is stale (a
/// newer leader, or its offsets were reset): the caller gets the error and
/// the next operation reloads it.
async fn persist(
    broker: &Broker,
    group: &str,
    loaded: &mut Loaded,
    next: SharePartition,
) -> Result<(), LeaderError> {
    let key = SharePartitionKey {
        group_id: group.to_string(),
        topic_id: loaded.topic_id,
        partition: loaded.partition_index,
    };
    let w = Write {
        state_epoch: loaded.state_epoch,
        leader_epoch: loaded.leader_epoch,
        start_offset: next.start_offset(),
        batches: next.state_batches(),
    };
    broker.share_persister.write(broker, &key, &w).await?;
    loaded.partition = next;
    Ok(())
}
