//! The transaction coordinator's runtime, the async side of [`super`]: the
//! state of every transactional id whose `__transaction_state` partition
//! this node leads, its writes to that partition, the markers it sends to
//! the partitions of each finished transaction, and its timers.
//!
//! As for groups (`coordinator/`), the ids live in shards, one per led
//! partition of `__transaction_state` (Kafka's `hash(id) % partitions`),
//! loaded from the partition's log when this node becomes its leader and
//! dropped when it stops. A shard's coordinator epoch is the partition's
//! leader epoch at load; every marker carries it, so a partition leader
//! refuses markers of a deposed coordinator.
//!
//! A change is written with the shard's lock held for the append only: the
//! id is marked pending, the record appended, the lock released, the
//! replication waited for, and the new state installed only then. Requests
//! for a pending id get CONCURRENT_TRANSACTIONS (clients retry it).
//!
//! After a PrepareCommit/PrepareAbort is written, a task per transaction
//! writes its markers to the leaders of its partitions (this node's own
//! through the WriteTxnMarkers handler's core, others over a peer
//! connection), retrying until every partition has its marker or the shard
//! is dropped, then writes CompleteCommit/CompleteAbort. A new leader of the
//! shard's partition finds the Prepare state in the log and does the same.
//!
//! Partition leaders and the group coordinator reach the coordinator of an
//! id through [`TxnService::check_partitions`] (KIP-890): directly when this
//! node coordinates it, else with AddPartitionsToTxn v5 over a peer
//! connection kept apart from the markers'.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, RwLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::add_partitions_to_txn_request::{
    AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
};
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ApiKey, ProducerId, TopicName,
    TransactionalId, WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use tokio::sync::watch;

use super::records::{self, VALUE_WRITE_VERSION};
use super::{
    is_epoch_exhausted, plan_end, EndPlan, PartitionResults, TxnError, TxnMetadata, TxnState,
};
use crate::broker::{now_ms, Broker};
use crate::config::ServerConfig;
use crate::error::PartitionError;
use crate::replica_manager::ReplicaManager;
use crate::types::{NodeId, TopicPartition};

pub const TXN_TOPIC: &str = "__transaction_state";

/// How much of a partition one read takes while loading.
const LOAD_READ_BYTES: usize = 4 << 20;
/// Between two rounds of markers to partitions not yet done.
const MARKER_RETRY_BACKOFF: Duration = Duration::from_millis(100);
const PEER_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const WRITE_TXN_MARKERS_VERSION: i16 = 1;
/// The AddPartitionsToTxn version brokers send each other (Kafka's
/// `forBroker` builder): batched transactions with `verify_only`.
const ADD_PARTITIONS_BROKER_VERSION: i16 = 5;
/// Kafka's `add.partitions.to.txn.retry.backoff.ms` and `.max.ms`.
const ADD_PARTITIONS_RETRY_BACKOFF: Duration = Duration::from_millis(20);
const ADD_PARTITIONS_RETRY_MAX: Duration = Duration::from_millis(100);
/// Kafka's `request.timeout.ms` default, which bounds its coordinator's
/// writes and its marker requests.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

struct Settings {
    max_timeout_ms: i32,
    expiration_ms: i64,
    abort_interval: Duration,
    expire_interval: Duration,
    /// How long a write waits for the partition's in-sync replicas (Kafka
    /// uses the request timeout).
    write_timeout: Duration,
}

#[derive(Default)]
struct Shards {
    partitions: i32,
    by_partition: HashMap<i32, Arc<Shard>>,
}

/// The transactional ids of one `__transaction_state` partition.
struct Shard {
    partition: i32,
    coordinator_epoch: i32,
    txns: tokio::sync::Mutex<HashMap<String, TxnMetadata>>,
    /// Cleared when the shard is dropped: its marker tasks and timers stop.
    alive: AtomicBool,
}

pub struct TxnService {
    shards: RwLock<Shards>,
    ownership: tokio::sync::Mutex<()>,
    broker: OnceLock<Weak<Broker>>,
    settings: Settings,
    peers: crate::net::PeerPool,
    stop: watch::Sender<bool>,
}

/// What InitProducerId answers for a transactional id.
pub type InitResult = Result<(i64, i16), TxnError>;

/// A partition leader's or the group coordinator's request to the
/// transaction coordinator before it writes a transactional batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnCheck {
    /// KIP-890 part 1: the partitions must already be in the transaction.
    Verify,
    /// Version 2: add the partitions for the client (starting a
    /// transaction if none is ongoing).
    Add,
}

/// One transaction as DescribeTransactions and ListTransactions show it.
#[derive(Clone, Debug)]
pub struct TxnDescription {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub state: TxnState,
    pub timeout_ms: i32,
    pub start_ms: i64,
    pub partitions: BTreeMap<String, BTreeSet<i32>>,
}

impl TxnService {
    pub fn new(config: &ServerConfig) -> Self {
        TxnService {
            shards: Default::default(),
            ownership: tokio::sync::Mutex::new(()),
            broker: OnceLock::new(),
            settings: Settings {
                max_timeout_ms: config.transaction_max_timeout_ms,
                expiration_ms: config.transactional_id_expiration_ms,
                abort_interval: Duration::from_millis(
                    config
                        .transaction_abort_timed_out_transaction_cleanup_interval_ms
                        .max(1),
                ),
                expire_interval: Duration::from_millis(
                    config
                        .transaction_remove_expired_transaction_cleanup_interval_ms
                        .max(1),
                ),
                write_timeout: REQUEST_TIMEOUT,
            },
            peers: crate::net::PeerPool::new(REQUEST_TIMEOUT, PEER_CONNECT_TIMEOUT),
            stop: watch::channel(false).0,
        }
    }

    /// Gives the service its broker, for the tasks it spawns (markers,
    /// timers). Called once the broker is in its `Arc`.
    pub fn attach(&self, broker: &Arc<Broker>) {
        let _ = self.broker.set(Arc::downgrade(broker));
    }

    fn broker(&self) -> Option<Arc<Broker>> {
        self.broker.get().and_then(Weak::upgrade)
    }

    /// The broker this service belongs to, for callers that hold only a
    /// reference to it.
    pub fn owner(&self) -> Option<Arc<Broker>> {
        self.broker()
    }

    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let shards: Vec<Arc<Shard>> = {
            let mut s = self.shards.write().expect("poisoned");
            s.by_partition.drain().map(|(_, v)| v).collect()
        };
        for shard in shards {
            shard.alive.store(false, Ordering::SeqCst);
        }
    }

    /// The partition of `__transaction_state` that holds `transactional_id`.
    pub fn partition_for(&self, broker: &Broker, transactional_id: &str) -> i32 {
        broker.internal_partition_for(
            TXN_TOPIC,
            transactional_id,
            broker.config.transaction_state_log_num_partitions,
        )
    }

    fn shard(&self, transactional_id: &str) -> Result<Arc<Shard>, TxnError> {
        let shards = self.shards.read().expect("poisoned");
        if shards.partitions == 0 {
            return Err(TxnError::NotCoordinator);
        }
        let p = crate::group::offsets::partition_for(transactional_id, shards.partitions);
        shards
            .by_partition
            .get(&p)
            .cloned()
            .ok_or(TxnError::NotCoordinator)
    }

    /// Whether this node coordinates `transactional_id` now.
    pub fn check_coordinator(&self, transactional_id: &str) -> Result<(), TxnError> {
        self.shard(transactional_id).map(drop)
    }

    /// Follows leadership of `__transaction_state`, as the group coordinator
    /// follows `__consumer_offsets`: loads the ids of each partition this
    /// node has come to lead (resuming the markers of every transaction
    /// found prepared) and drops those of partitions it no longer leads.
    pub async fn sync_ownership(&self, broker: &Arc<Broker>) -> Result<usize, PartitionError> {
        let _serial = self.ownership.lock().await;
        let (count, led) = broker.led_partitions(TXN_TOPIC);
        let (gained, lost): (Vec<(i32, i32)>, Vec<Arc<Shard>>) = {
            let mut shards = self.shards.write().expect("poisoned");
            let same_count = shards.partitions == count;
            let keep =
                |p: i32, s: &Arc<Shard>| same_count && led.get(&p) == Some(&s.coordinator_epoch);
            let lost_ids: Vec<i32> = shards
                .by_partition
                .iter()
                .filter(|(p, s)| !keep(**p, s))
                .map(|(p, _)| *p)
                .collect();
            let lost = lost_ids
                .iter()
                .filter_map(|p| shards.by_partition.remove(p))
                .collect();
            let gained = led
                .iter()
                .filter(|(p, _)| !shards.by_partition.contains_key(p))
                .map(|(p, e)| (*p, *e))
                .collect();
            shards.partitions = count;
            (gained, lost)
        };
        for shard in lost {
            shard.alive.store(false, Ordering::SeqCst);
            tracing::info!(
                partition = shard.partition,
                "no longer coordinating the transactions of {TXN_TOPIC} partition"
            );
        }
        let mut loaded = 0;
        for (p, epoch) in gained {
            let replicas = broker.replicas.clone();
            let txns = tokio::task::spawn_blocking(move || load_partition(&replicas, p))
                .await
                .map_err(|e| PartitionError::Storage(e.to_string()))??;
            loaded += txns.len();
            let prepared: Vec<TxnMetadata> = txns
                .values()
                .filter(|m| matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort))
                .cloned()
                .collect();
            let shard = Arc::new(Shard {
                partition: p,
                coordinator_epoch: epoch,
                txns: tokio::sync::Mutex::new(txns),
                alive: AtomicBool::new(true),
            });
            self.shards
                .write()
                .expect("poisoned")
                .by_partition
                .insert(p, shard.clone());
            tracing::info!(
                partition = p,
                coordinator_epoch = epoch,
                prepared = prepared.len(),
                "coordinating the transactions of {TXN_TOPIC} partition"
            );
            for meta in prepared {
                tokio::spawn(complete_transaction(broker.clone(), shard.clone(), meta));
            }
            tokio::spawn(run_timers(broker.clone(), shard, self.stop.subscribe()));
        }
        Ok(loaded)
    }

    /// InitProducerId with a transactional id (Kafka's
    /// `handleInitProducerId`). `expected` is the KIP-360 (id, epoch) the
    /// client presents, if any.
    pub async fn init_producer_id(
        &self,
        broker: &Broker,
        transactional_id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
    ) -> InitResult {
        if transactional_id.is_empty() {
            return Err(TxnError::InvalidRequest);
        }
        if timeout_ms <= 0 || timeout_ms > self.settings.max_timeout_ms {
            return Err(TxnError::InvalidTransactionTimeout);
        }
        let shard = self.shard(transactional_id)?;
        let mut txns = shard.txns.lock().await;
        if !txns.contains_key(transactional_id) {
            let pid = new_producer_id(broker).await?;
            txns.insert(
                transactional_id.to_string(),
                TxnMetadata::new(transactional_id, pid, timeout_ms, now_ms()),
            );
        }
        let meta = txns.get(transactional_id).expect("inserted above").clone();
        if meta.pending {
            return Err(TxnError::ConcurrentTransactions);
        }
        if let Some((pid, epoch)) = expected {
            let valid = meta.producer_epoch == super::NO_PRODUCER_EPOCH
                || pid == meta.producer_id
                || (pid == meta.previous_producer_id && is_epoch_exhausted(epoch));
            if !valid {
                return Err(TxnError::ProducerFenced);
            }
        }
        let now = now_ms();
        match meta.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort => {
                Err(TxnError::ConcurrentTransactions)
            }
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
                let rotated = if is_epoch_exhausted(meta.producer_epoch) {
                    Some(new_producer_id(broker).await?)
                } else {
                    None
                };
                let next =
                    meta.prepare_init(timeout_ms, expected.map(|(_, e)| e), || rotated, now)?;
                let answer = (next.producer_id, next.producer_epoch);
                self.write(&shard, txns, next).await?;
                Ok(answer)
            }
            TxnState::Ongoing => {
                // Abort the ongoing transaction at a bumped epoch (fencing
                // the old producer) and let the client retry, which bumps
                // the epoch again once the abort is complete.
                let next = meta.prepare_fence_and_abort(now);
                self.write(&shard, txns, next.clone()).await?;
                self.spawn_markers(&shard, next);
                Err(TxnError::ConcurrentTransactions)
            }
            TxnState::Dead | TxnState::PrepareEpochFence => Err(TxnError::InvalidTxnState),
        }
    }

    /// AddPartitionsToTxn / AddOffsetsToTxn (Kafka's
    /// `handleAddPartitionsToTransaction`). `client_version` is 0 for a
    /// client's AddPartitionsToTxn v0-3 and AddOffsetsToTxn, 2 when a leader
    /// or the group coordinator adds for a version 2 client (v4+).
    pub async fn add_partitions(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        added: BTreeMap<String, BTreeSet<i32>>,
        client_version: i16,
    ) -> Result<(), TxnError> {
        if transactional_id.is_empty() {
            return Err(TxnError::InvalidRequest);
        }
        let shard = self.shard(transactional_id)?;
        let txns = shard.txns.lock().await;
        let meta = txns
            .get(transactional_id)
            .ok_or(TxnError::InvalidProducerIdMapping)?
            .clone();
        meta.check_producer(producer_id, producer_epoch)?;
        match meta.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort => {
                return Err(TxnError::ConcurrentTransactions)
            }
            TxnState::Ongoing
                if added
                    .iter()
                    .all(|(t, ps)| ps.iter().all(|p| meta.contains(t, *p))) =>
            {
                return Ok(());
            }
            _ => {}
        }
        let next = meta.prepare_add_partitions(&added, client_version, now_ms());
        self.write(&shard, txns, next).await
    }

    /// AddPartitionsToTxn v4+ with `verify_only` (KIP-890 part 1): whether
    /// each partition is in the producer's ongoing transaction.
    pub async fn verify_partitions(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &BTreeMap<String, BTreeSet<i32>>,
    ) -> Result<PartitionResults, TxnError> {
        if transactional_id.is_empty() {
            return Err(TxnError::InvalidRequest);
        }
        let shard = self.shard(transactional_id)?;
        let txns = shard.txns.lock().await;
        let meta = txns
            .get(transactional_id)
            .ok_or(TxnError::InvalidProducerIdMapping)?;
        super::verify_partitions(meta, producer_id, producer_epoch, partitions)
    }

    /// EndTxn (Kafka's `handleEndTransaction`): answers once the Prepare
    /// record is replicated; the markers follow. `bump` is version 2
    /// (EndTxn v5): the answer is the producer id and epoch the client
    /// continues with.
    pub async fn end_txn(
        &self,
        broker: &Broker,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        bump: bool,
    ) -> Result<(i64, i16), TxnError> {
        if transactional_id.is_empty() {
            return Err(TxnError::InvalidRequest);
        }
        let shard = self.shard(transactional_id)?;
        let mut txns = shard.txns.lock().await;
        let mut meta = txns
            .get(transactional_id)
            .ok_or(TxnError::InvalidProducerIdMapping)?
            .clone();
        if bump && is_epoch_exhausted(meta.producer_epoch) && meta.next_producer_id < 0 {
            // Allocated before planning, which is synchronous; unused ids
            // are harmless gaps.
            drop(txns);
            let id = new_producer_id(broker).await?;
            txns = shard.txns.lock().await;
            meta = txns
                .get(transactional_id)
                .ok_or(TxnError::InvalidProducerIdMapping)?
                .clone();
            meta.next_producer_id = id;
        }
        let plan = if bump {
            let next_id = meta.next_producer_id;
            super::plan_end_v2(
                &meta,
                producer_id,
                producer_epoch,
                commit,
                || (next_id >= 0).then_some(next_id),
                now_ms(),
            )?
        } else {
            meta.check_producer(producer_id, producer_epoch)?;
            plan_end(&meta, commit, now_ms())?
        };
        match plan {
            EndPlan::AlreadyDone => Ok((meta.producer_id, meta.producer_epoch)),
            EndPlan::Prepare(next) => {
                let answer = next.continuation();
                self.write(&shard, txns, next.clone()).await?;
                self.spawn_markers(&shard, next);
                Ok(answer)
            }
        }
    }

    pub async fn describe(&self, transactional_id: &str) -> Result<TxnDescription, TxnError> {
        if transactional_id.is_empty() {
            return Err(TxnError::InvalidRequest);
        }
        let shard = self.shard(transactional_id)?;
        let txns = shard.txns.lock().await;
        match txns.get(transactional_id) {
            Some(m) if m.state != TxnState::Dead => Ok(describe(m)),
            _ => Err(TxnError::TransactionalIdNotFound),
        }
    }

    /// Every transaction this node coordinates that passes the filters
    /// (ListTransactions: states, producer ids, started more than
    /// `min_duration_ms` ago when it is not negative; empty filters match
    /// all).
    pub async fn list(
        &self,
        states: &[TxnState],
        producer_ids: &[i64],
        min_duration_ms: i64,
        id_matches: impl Fn(&str) -> bool,
    ) -> Vec<TxnDescription> {
        let shards: Vec<Arc<Shard>> = {
            let s = self.shards.read().expect("poisoned");
            s.by_partition.values().cloned().collect()
        };
        let now = now_ms();
        let mut out = Vec::new();
        for shard in shards {
            let txns = shard.txns.lock().await;
            for m in txns.values() {
                // Kafka's `shouldInclude`: the duration is counted from the
                // transaction's start (-1 for one not started).
                if m.state == TxnState::Dead
                    || (!states.is_empty() && !states.contains(&m.state))
                    || (!producer_ids.is_empty() && !producer_ids.contains(&m.producer_id))
                    || (min_duration_ms >= 0 && now.saturating_sub(m.start_ms) <= min_duration_ms)
                    || !id_matches(&m.transactional_id)
                {
                    continue;
                }
                out.push(describe(m));
            }
        }
        out.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        out
    }

    /// Writes `next` as the id's new state: marks the id pending, appends
    /// under the shard's lock (`txns`, released after the append), waits for
    /// the in-sync replicas, and installs `next` only then.
    async fn write(
        &self,
        shard: &Arc<Shard>,
        mut txns: tokio::sync::MutexGuard<'_, HashMap<String, TxnMetadata>>,
        next: TxnMetadata,
    ) -> Result<(), TxnError> {
        let id = next.transactional_id.clone();
        if let Some(m) = txns.get_mut(&id) {
            m.pending = true;
        }
        let value = if next.state == TxnState::Dead {
            None
        } else {
            Some(
                records::encode_value(&next.to_value(), VALUE_WRITE_VERSION)
                    .map_err(|_| TxnError::InvalidRequest)?,
            )
        };
        let key = records::encode_key(&id).map_err(|_| TxnError::InvalidRequest)?;
        let broker = self.broker().ok_or(TxnError::CoordinatorNotAvailable)?;
        let replicas = broker.replicas.clone();
        let partition = shard.partition;
        let appended =
            tokio::task::spawn_blocking(move || append_record(&replicas, partition, key, value))
                .await
                .map_err(|_| PartitionError::Storage("append interrupted".into()))
                .and_then(|r| r);
        drop(txns);
        let acked = match appended {
            Ok(mut a) => {
                let deadline = tokio::time::Instant::now() + self.settings.write_timeout;
                crate::replica_manager::wait_for_ack(&a.part, a.required, &mut a.events, deadline)
                    .await
            }
            Err(e) => Err(e),
        };
        let mut txns = shard.txns.lock().await;
        let alive = shard.alive.load(Ordering::SeqCst);
        match acked {
            Ok(()) if alive => {
                if next.state == TxnState::Dead {
                    txns.remove(&id);
                } else {
                    txns.insert(id, next);
                }
                Ok(())
            }
            outcome => {
                if let Some(m) = txns.get_mut(&id) {
                    m.pending = false;
                }
                match outcome {
                    Ok(()) => Err(TxnError::NotCoordinator),
                    Err(e) => {
                        tracing::info!(transactional_id = %id, error = %e, "writing transaction state failed");
                        Err(write_error(&e))
                    }
                }
            }
        }
    }

    fn spawn_markers(&self, shard: &Arc<Shard>, prepared: TxnMetadata) {
        if let Some(broker) = self.broker() {
            tokio::spawn(complete_transaction(broker, shard.clone(), prepared));
        }
    }

    /// Sends one WriteTxnMarkers request to `leader` (another broker).
    async fn send_markers_to_peer(
        &self,
        broker: &Broker,
        leader: NodeId,
        req: &WriteTxnMarkersRequest,
    ) -> Result<WriteTxnMarkersResponse, crate::net::CallError> {
        self.call_peer(
            broker,
            leader,
            PeerUse::Markers,
            ApiKey::WriteTxnMarkers,
            WRITE_TXN_MARKERS_VERSION,
            req,
        )
        .await
    }

    /// One request to `node` (another broker), over a connection kept per
    /// peer and use, so markers and checks do not queue behind each other.
    async fn call_peer<Req, Resp>(
        &self,
        broker: &Broker,
        node: NodeId,
        purpose: PeerUse,
        key: ApiKey,
        version: i16,
        req: &Req,
    ) -> Result<Resp, crate::net::CallError>
    where
        Req: kafka_protocol::protocol::Encodable,
        Resp: kafka_protocol::protocol::Decodable,
    {
        self.peers
            .call(broker, node, purpose.name(), key, version, req)
            .await
    }

    /// Asks the coordinator of `transactional_id`, wherever it is, to
    /// verify or add `partitions` for the producer (Kafka's
    /// `AddPartitionsToTxnManager`). CONCURRENT_TRANSACTIONS (the previous
    /// transaction's markers are still being written) is retried for a
    /// short while, as Kafka's `add.partitions.to.txn.retry.backoff.*` do.
    pub async fn check_partitions(
        &self,
        broker: &Broker,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &BTreeMap<String, BTreeSet<i32>>,
        check: TxnCheck,
    ) -> Result<PartitionResults, TxnError> {
        let deadline = tokio::time::Instant::now() + ADD_PARTITIONS_RETRY_MAX;
        loop {
            let outcome = self
                .check_once(
                    broker,
                    transactional_id,
                    producer_id,
                    producer_epoch,
                    partitions,
                    check,
                )
                .await;
            let concurrent = match &outcome {
                Err(TxnError::ConcurrentTransactions) => true,
                Ok(results) => results
                    .values()
                    .any(|r| *r == Err(TxnError::ConcurrentTransactions)),
                Err(_) => false,
            };
            if !concurrent || tokio::time::Instant::now() >= deadline {
                return outcome;
            }
            tokio::time::sleep(ADD_PARTITIONS_RETRY_BACKOFF).await;
        }
    }

    async fn check_once(
        &self,
        broker: &Broker,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &BTreeMap<String, BTreeSet<i32>>,
        check: TxnCheck,
    ) -> Result<PartitionResults, TxnError> {
        let each = |r: Result<(), TxnError>| -> PartitionResults {
            partitions
                .iter()
                .flat_map(|(t, ps)| ps.iter().map(move |p| ((t.clone(), *p), r)))
                .collect()
        };
        let coordinator = {
            let image = broker.metadata.image();
            let partition = self.partition_for(broker, transactional_id);
            image
                .topics
                .get(TXN_TOPIC)
                .and_then(|t| t.partitions.get(partition as usize))
                .map(|p| p.leader)
        };
        match coordinator {
            None => Err(TxnError::CoordinatorNotAvailable),
            Some(node) if node == broker.node_id() => match check {
                TxnCheck::Verify => {
                    self.verify_partitions(
                        transactional_id,
                        producer_id,
                        producer_epoch,
                        partitions,
                    )
                    .await
                }
                TxnCheck::Add => Ok(each(
                    self.add_partitions(
                        transactional_id,
                        producer_id,
                        producer_epoch,
                        partitions.clone(),
                        super::TV2,
                    )
                    .await,
                )),
            },
            Some(node) => {
                let req = add_partitions_request(
                    transactional_id,
                    producer_id,
                    producer_epoch,
                    partitions,
                    check == TxnCheck::Verify,
                );
                let resp: AddPartitionsToTxnResponse = self
                    .call_peer(
                        broker,
                        node,
                        PeerUse::Checks,
                        ApiKey::AddPartitionsToTxn,
                        ADD_PARTITIONS_BROKER_VERSION,
                        &req,
                    )
                    .await
                    .map_err(|e| {
                        tracing::debug!(%node, error = %e, "asking the transaction coordinator failed");
                        TxnError::CoordinatorNotAvailable
                    })?;
                txn_error_of(resp.error_code)?;
                let mut results = each(Err(TxnError::CoordinatorNotAvailable));
                for txn in resp.results_by_transaction {
                    for topic in txn.topic_results {
                        for p in topic.results_by_partition {
                            let key = (topic.name.to_string(), p.partition_index);
                            if let Some(r) = results.get_mut(&key) {
                                *r = txn_error_of(p.partition_error_code);
                            }
                        }
                    }
                }
                Ok(results)
            }
        }
    }
}

/// Which connection to a peer a request uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum PeerUse {
    Markers,
    Checks,
}

impl PeerUse {
    fn name(self) -> &'static str {
        match self {
            PeerUse::Markers => "txn-markers",
            PeerUse::Checks => "txn-checks",
        }
    }
}

/// AddPartitionsToTxn v4+ as a broker sends it: one transaction.
fn add_partitions_request(
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
    partitions: &BTreeMap<String, BTreeSet<i32>>,
    verify_only: bool,
) -> AddPartitionsToTxnRequest {
    let topics = partitions
        .iter()
        .map(|(t, ps)| {
            AddPartitionsToTxnTopic::default()
                .with_name(TopicName(StrBytes::from_string(t.clone())))
                .with_partitions(ps.iter().copied().collect())
        })
        .collect();
    let txn = AddPartitionsToTxnTransaction::default()
        .with_transactional_id(TransactionalId(StrBytes::from_string(
            transactional_id.to_string(),
        )))
        .with_producer_id(ProducerId(producer_id))
        .with_producer_epoch(producer_epoch)
        .with_verify_only(verify_only)
        .with_topics(topics);
    AddPartitionsToTxnRequest::default().with_transactions(vec![txn])
}

pub fn error_code(e: TxnError) -> i16 {
    let code = match e {
        TxnError::ConcurrentTransactions => ResponseError::ConcurrentTransactions,
        TxnError::ProducerFenced => ResponseError::ProducerFenced,
        TxnError::InvalidProducerIdMapping => ResponseError::InvalidProducerIdMapping,
        TxnError::InvalidTxnState => ResponseError::InvalidTxnState,
        TxnError::InvalidTransactionTimeout => ResponseError::InvalidTransactionTimeout,
        TxnError::NotCoordinator => ResponseError::NotCoordinator,
        TxnError::CoordinatorNotAvailable => ResponseError::CoordinatorNotAvailable,
        TxnError::CoordinatorLoadInProgress => ResponseError::CoordinatorLoadInProgress,
        TxnError::InvalidRequest => ResponseError::InvalidRequest,
        TxnError::TransactionalIdNotFound => ResponseError::TransactionalIdNotFound,
        TxnError::TransactionAbortable => ResponseError::TransactionAbortable,
    };
    code.code()
}

/// The coordinator error an AddPartitionsToTxn response code stands for.
fn txn_error_of(code: i16) -> Result<(), TxnError> {
    Err(match ResponseError::try_from_code(code) {
        None => return Ok(()),
        Some(ResponseError::ConcurrentTransactions) => TxnError::ConcurrentTransactions,
        Some(ResponseError::ProducerFenced | ResponseError::InvalidProducerEpoch) => {
            TxnError::ProducerFenced
        }
        Some(ResponseError::InvalidProducerIdMapping) => TxnError::InvalidProducerIdMapping,
        Some(ResponseError::InvalidTxnState) => TxnError::InvalidTxnState,
        Some(ResponseError::TransactionAbortable) => TxnError::TransactionAbortable,
        Some(ResponseError::NotCoordinator) => TxnError::NotCoordinator,
        Some(ResponseError::CoordinatorLoadInProgress) => TxnError::CoordinatorLoadInProgress,
        Some(ResponseError::InvalidRequest) => TxnError::InvalidRequest,
        Some(_) => TxnError::CoordinatorNotAvailable,
    })
}

fn describe(m: &TxnMetadata) -> TxnDescription {
    TxnDescription {
        transactional_id: m.transactional_id.clone(),
        producer_id: m.producer_id,
        producer_epoch: m.producer_epoch,
        state: m.state,
        timeout_ms: m.timeout_ms,
        start_ms: m.start_ms,
        partitions: m.partitions.clone(),
    }
}

async fn new_producer_id(broker: &Broker) -> Result<i64, TxnError> {
    broker.next_producer_id().await.map_err(|e| {
        tracing::warn!(error = %e, "allocating a producer id failed");
        TxnError::CoordinatorNotAvailable
    })
}

/// Kafka's `appendTransactionToLog` error mapping.
fn write_error(e: &PartitionError) -> TxnError {
    match e {
        PartitionError::NotLeaderOrFollower | PartitionError::Storage(_) => {
            TxnError::NotCoordinator
        }
        _ => TxnError::CoordinatorNotAvailable,
    }
}

/// Writes the markers of a prepared transaction until every partition has
/// one, then its Complete state. Gives up when the shard is dropped: the
/// partition's next leader resumes from the Prepare record.
async fn complete_transaction(broker: Arc<Broker>, shard: Arc<Shard>, prepared: TxnMetadata) {
    let commit = prepared.state == TxnState::PrepareCommit;
    let mut remaining = prepared.partitions.clone();
    while !remaining.is_empty() {
        if !shard.alive.load(Ordering::SeqCst) {
            return;
        }
        let image = broker.metadata.image();
        // Partitions of deleted topics need no marker (Kafka drops them).
        remaining.retain(|t, _| image.topics.contains_key(t));
        let mut by_leader: BTreeMap<NodeId, BTreeMap<String, Vec<i32>>> = BTreeMap::new();
        for (topic, parts) in &remaining {
            let t = &image.topics[topic];
            for p in parts {
                if let Some(info) = t.partitions.get(*p as usize) {
                    by_leader
                        .entry(info.leader)
                        .or_default()
                        .entry(topic.clone())
                        .or_default()
                        .push(*p);
                }
            }
        }
        drop(image);
        for (leader, topics) in by_leader {
            let req = marker_request(&prepared, shard.coordinator_epoch, commit, &topics);
            let resp = if leader == broker.node_id() {
                Ok(crate::handlers::write_txn_markers::write_markers(&broker, req).await)
            } else {
                broker.txn.send_markers_to_peer(&broker, leader, &req).await
            };
            let resp = match resp {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(%leader, error = %e, "sending transaction markers failed; retrying");
                    continue;
                }
            };
            for marker in resp.markers {
                for topic in marker.topics {
                    for p in topic.partitions {
                        match ResponseError::try_from_code(p.error_code) {
                            None => {
                                if let Some(set) = remaining.get_mut(topic.name.as_str()) {
                                    set.remove(&p.partition_index);
                                }
                            }
                            // A newer coordinator or producer epoch took over
                            // the partition: this coordinator must stop.
                            Some(
                                ResponseError::InvalidProducerEpoch
                                | ResponseError::TransactionCoordinatorFenced,
                            ) => {
                                tracing::warn!(
                                    transactional_id = %prepared.transactional_id,
                                    topic = %topic.name.as_str(),
                                    partition = p.partition_index,
                                    "transaction marker fenced; giving up on this transaction"
                                );
                                return;
                            }
                            Some(e) => tracing::debug!(
                                topic = %topic.name.as_str(),
                                partition = p.partition_index,
                                error = ?e,
                                "transaction marker not written; retrying"
                            ),
                        }
                    }
                }
            }
        }
        remaining.retain(|_, ps| !ps.is_empty());
        if !remaining.is_empty() {
            tokio::time::sleep(MARKER_RETRY_BACKOFF).await;
        }
    }
    // Every marker is written: record the transaction complete, retrying a
    // failed write while this node still coordinates it.
    loop {
        if !shard.alive.load(Ordering::SeqCst) {
            return;
        }
        let txns = shard.txns.lock().await;
        let Some(current) = txns.get(&prepared.transactional_id) else {
            return;
        };
        if current.pending {
            drop(txns);
            tokio::time::sleep(MARKER_RETRY_BACKOFF).await;
            continue;
        }
        if current.state != prepared.state
            || current.producer_id != prepared.producer_id
            || current.producer_epoch != prepared.producer_epoch
        {
            return;
        }
        let next = current.prepare_complete(now_ms());
        match broker.txn.write(&shard, txns, next).await {
            Ok(()) => return,
            Err(e) => {
                tracing::info!(transactional_id = %prepared.transactional_id, error = %e, "completing the transaction failed; retrying");
                tokio::time::sleep(MARKER_RETRY_BACKOFF).await;
            }
        }
    }
}

fn marker_request(
    meta: &TxnMetadata,
    coordinator_epoch: i32,
    commit: bool,
    topics: &BTreeMap<String, Vec<i32>>,
) -> WriteTxnMarkersRequest {
    let marker = WritableTxnMarker::default()
        .with_producer_id(ProducerId(meta.producer_id))
        .with_producer_epoch(meta.producer_epoch)
        .with_transaction_result(commit)
        .with_coordinator_epoch(coordinator_epoch)
        .with_topics(
            topics
                .iter()
                .map(|(t, ps)| {
                    WritableTxnMarkerTopic::default()
                        .with_name(TopicName(StrBytes::from_string(t.clone())))
                        .with_partition_indexes(ps.clone())
                })
                .collect(),
        );
    WriteTxnMarkersRequest::default().with_markers(vec![marker])
}

/// Aborts timed-out transactions every
/// `transaction.abort.timed.out.transaction.cleanup.interval.ms` and removes
/// idle ids every `transaction.remove.expired.transaction.cleanup.interval.ms`.
async fn run_timers(broker: Arc<Broker>, shard: Arc<Shard>, mut stop: watch::Receiver<bool>) {
    let settings = &broker.txn.settings;
    let mut abort = tokio::time::interval(settings.abort_interval);
    let mut expire = tokio::time::interval(settings.expire_interval);
    abort.tick().await;
    expire.tick().await;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = abort.tick() => abort_timed_out(&broker, &shard).await,
            _ = expire.tick() => expire_ids(&broker, &shard).await,
        }
        if !shard.alive.load(Ordering::SeqCst) {
            return;
        }
    }
}

async fn abort_timed_out(broker: &Arc<Broker>, shard: &Arc<Shard>) {
    let now = now_ms();
    let ids: Vec<String> = {
        let txns = shard.txns.lock().await;
        txns.values()
            .filter(|m| m.timed_out(now))
            .map(|m| m.transactional_id.clone())
            .collect()
    };
    for id in ids {
        let txns = shard.txns.lock().await;
        let Some(meta) = txns.get(&id).filter(|m| m.timed_out(now_ms())).cloned() else {
            continue;
        };
        tracing::info!(transactional_id = %id, producer_id = meta.producer_id, "aborting a timed-out transaction");
        let next = meta.prepare_fence_and_abort(now_ms());
        if broker.txn.write(shard, txns, next.clone()).await.is_ok() {
            broker.txn.spawn_markers(shard, next);
        }
    }
}

async fn expire_ids(broker: &Arc<Broker>, shard: &Arc<Shard>) {
    let expiration = broker.txn.settings.expiration_ms;
    let ids: Vec<String> = {
        let txns = shard.txns.lock().await;
        txns.values()
            .filter(|m| m.expired(now_ms(), expiration))
            .map(|m| m.transactional_id.clone())
            .collect()
    };
    for id in ids {
        let txns = shard.txns.lock().await;
        let Some(meta) = txns
            .get(&id)
            .filter(|m| m.expired(now_ms(), expiration))
            .cloned()
        else {
            continue;
        };
        let mut dead = meta.clone();
        dead.state = TxnState::Dead;
        tracing::info!(transactional_id = %id, "removing an expired transactional id");
        let _ = broker.txn.write(shard, txns, dead).await;
    }
}

/// Appends one record to `__transaction_state` partition `partition` as its
/// own batch (acks=all) and returns what to wait on for its replication.
/// Disk work: runs on a blocking thread.
fn append_record(
    replicas: &ReplicaManager,
    partition: i32,
    key: Bytes,
    value: Option<Bytes>,
) -> Result<crate::replica_manager::InternalAppend, PartitionError> {
    let tp = TopicPartition::new(TXN_TOPIC, partition);
    let part = replicas
        .get(&tp)
        .ok_or(PartitionError::NotLeaderOrFollower)?;
    let now = now_ms();
    let record = crate::replica_manager::coordinator_records([(key, value)], None, now);
    crate::replica_manager::append_internal(replicas, part, &record, now)
}

/// Every transactional id stored in one local partition, as of its log end
/// (the last record of an id wins; a tombstone removes it). Records that do
/// not decode are logged and skipped. Disk work: runs on a blocking thread.
fn load_partition(
    replicas: &ReplicaManager,
    p: i32,
) -> Result<HashMap<String, TxnMetadata>, PartitionError> {
    let mut out = HashMap::new();
    let tp = TopicPartition::new(TXN_TOPIC, p);
    crate::replica_manager::for_each_internal_record(
        replicas,
        &tp,
        LOAD_READ_BYTES,
        |offset, key, value| {
            let Some(key) = key else { return };
            let id = match records::decode_key(&key) {
                Ok(Some(id)) => id,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(partition = p, offset, error = %e, "skipping an undecodable {TXN_TOPIC} key");
                    return;
                }
            };
            match value.as_deref().map(records::decode_value) {
                None => {
                    out.remove(&id);
                }
                Some(Ok(v)) => {
                    out.insert(id.clone(), TxnMetadata::from_value(&id, v));
                }
                Some(Err(e)) => {
                    tracing::warn!(partition = p, offset, error = %e, "skipping an undecodable {TXN_TOPIC} value")
                }
            }
        },
    )?;
    Ok(out)
}
