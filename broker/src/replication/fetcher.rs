//! The follower's fetchers, after Kafka's `ReplicaFetcherManager` /
//! `ReplicaFetcherThread` / `AbstractFetcherThread`: one task per leader
//! broker, fetching every partition this node follows from that leader in
//! one Fetch request over a connection to the leader's inter-broker
//! listener (TLS and a SASL login first when it speaks them), with this
//! node's id as the replica id.
//!
//! Each partition starts (and restarts after an error that may mean its log
//! diverged) in the truncating state: an OffsetForLeaderEpoch request with
//! the follower's latest epoch tells where the leader's log for that epoch
//! ends, and the follower truncates there when the logs diverge (Kafka's
//! `getOffsetTruncationState`) before fetching from its log end. Fetched
//! batches go through `Partition::append_as_follower`, then the high
//! watermark and log start offset follow the leader's.
//!
//! Requests: Fetch v15 (topic ids, `replica_state.replica_id`, no fetch
//! session), OffsetForLeaderEpoch v4 and ListOffsets v7, all with this
//! node's id as replica id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ReplicaState};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse,
    OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::error::PartitionError;
use crate::net::PeerConn;
use crate::replica_manager::PartitionRef;
use crate::types::{LeaderEpoch, NodeId, Offset, TopicPartition};

const FETCH_VERSION: i16 = 15;
const OFFSET_FOR_LEADER_EPOCH_VERSION: i16 = 4;
const LIST_OFFSETS_VERSION: i16 = 7;
/// How long connecting to a leader may take before it counts as an error.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Slack over `replica.fetch.response.max.bytes` for the response's own
/// fields (some tens of bytes per partition).
const RESPONSE_OVERHEAD_BYTES: usize = 1 << 20;

/// A partition this node follows, and the leader it follows it from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowedPartition {
    pub tp: TopicPartition,
    pub topic_id: Uuid,
    pub leader: NodeId,
    pub leader_epoch: LeaderEpoch,
}

/// Kafka's `replica.fetch.*` settings.
#[derive(Clone, Copy, Debug)]
pub struct FetcherConfig {
    pub max_bytes: i32,
    pub response_max_bytes: i32,
    pub wait_max_ms: i32,
    pub min_bytes: i32,
    pub backoff_ms: u64,
    /// The largest batch a leader may send whole even past the limits
    /// (`message.max.bytes`; Kafka's limits are soft by one batch).
    pub max_batch_bytes: i32,
    /// How long a request may wait for its answer: the leader holds a fetch
    /// up to `wait_max_ms`, so this is that plus Kafka's
    /// `replica.socket.timeout.ms` default margin.
    pub request_timeout: Duration,
}

impl FetcherConfig {
    pub fn from_server(c: &crate::config::ServerConfig) -> Self {
        Self {
            max_bytes: c.replica_fetch_max_bytes,
            response_max_bytes: c.replica_fetch_response_max_bytes,
            wait_max_ms: c.replica_fetch_wait_max_ms,
            min_bytes: c.replica_fetch_min_bytes,
            backoff_ms: c.replica_fetch_backoff_ms.max(0) as u64,
            max_batch_bytes: c.message_max_bytes.min(i32::MAX as u32) as i32,
            request_timeout: Duration::from_millis(c.replica_fetch_wait_max_ms.max(0) as u64)
                + Duration::from_secs(30),
        }
    }
}

/// What the fetchers need from the node: its local replicas, and where a
/// leader's client listener is.
pub trait FetcherEnv: Send + Sync + 'static {
    fn partition(&self, tp: &TopicPartition) -> Option<PartitionRef>;
    /// `host:port` of a broker's client listener, from its registration
    /// (a leader's, to connect to; this node's own, to connect from).
    fn leader_address(&self, leader: NodeId) -> Option<String>;
    /// How to dial the inter-broker listener (TLS, SASL login).
    fn peer_security(&self) -> Arc<crate::security::peer::PeerSecurity> {
        Arc::new(crate::security::peer::PeerSecurity::plaintext())
    }
}

/// The broker's environment: its replica manager, and broker
/// registrations from the metadata image.
pub struct BrokerFetcherEnv {
    pub replicas: Arc<crate::replica_manager::ReplicaManager>,
    pub images: tokio::sync::watch::Receiver<Arc<crate::metadata::MetadataImage>>,
    pub security: Arc<crate::security::peer::PeerSecurity>,
}

impl FetcherEnv for BrokerFetcherEnv {
    fn partition(&self, tp: &TopicPartition) -> Option<PartitionRef> {
        self.replicas.get(tp)
    }
    fn leader_address(&self, leader: NodeId) -> Option<String> {
        let image = self.images.borrow();
        image
            .brokers
            .get(&leader)
            .map(|b| format!("{}:{}", b.host, b.port))
    }
    fn peer_security(&self) -> Arc<crate::security::peer::PeerSecurity> {
        self.security.clone()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Before fetching: find and cut any divergence from the leader's log.
    Truncating,
    Fetching,
}

#[derive(Clone, Debug)]
struct FetchState {
    tp: TopicPartition,
    topic_id: Uuid,
    leader_epoch: LeaderEpoch,
    phase: Phase,
    /// Skipped until then after an error that a newer image should resolve.
    delayed_until: Option<Instant>,
}

type States = Arc<Mutex<HashMap<TopicPartition, FetchState>>>;

struct Session {
    states: States,
    task: JoinHandle<()>,
}

/// The fetch sessions of this node, one per leader it follows something
/// from. `update` is given the complete set of followed partitions on every
/// metadata change.
pub struct ReplicaFetcherManager {
    node_id: NodeId,
    config: FetcherConfig,
    env: Arc<dyn FetcherEnv>,
    sessions: Mutex<HashMap<NodeId, Session>>,
}

impl ReplicaFetcherManager {
    pub fn new(node_id: NodeId, config: FetcherConfig, env: Arc<dyn FetcherEnv>) -> Self {
        Self {
            node_id,
            config,
            env,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    /// Makes the sessions match `followed`: new leaders get a task, leaders
    /// no longer followed lose theirs, a partition that is new to a session
    /// or whose leader epoch changed starts over with truncation. Must be
    /// called inside a tokio runtime.
    pub fn update(&self, followed: Vec<FollowedPartition>) {
        let mut by_leader: HashMap<NodeId, Vec<FollowedPartition>> = HashMap::new();
        for f in followed {
            if f.leader.0 >= 0 && f.leader != self.node_id {
                by_leader.entry(f.leader).or_default().push(f);
            }
        }
        let mut sessions = self.sessions.lock().expect("poisoned");
        sessions.retain(|leader, s| {
            let keep = by_leader.contains_key(leader) && !s.task.is_finished();
            if !keep {
                s.task.abort();
            }
            keep
        });
        for (leader, parts) in by_leader {
            let session = sessions.entry(leader).or_insert_with(|| {
                let states: States = Arc::default();
                let task = tokio::spawn(run_session(
                    self.node_id,
                    leader,
                    self.config,
                    self.env.clone(),
                    states.clone(),
                ));
                Session { states, task }
            });
            let mut states = session.states.lock().expect("poisoned");
            states.retain(|tp, _| parts.iter().any(|p| &p.tp == tp));
            for p in parts {
                let restart = states
                    .get(&p.tp)
                    .is_none_or(|s| s.leader_epoch != p.leader_epoch || s.topic_id != p.topic_id);
                if restart {
                    states.insert(
                        p.tp.clone(),
                        FetchState {
                            tp: p.tp,
                            topic_id: p.topic_id,
                            leader_epoch: p.leader_epoch,
                            phase: Phase::Truncating,
                            delayed_until: None,
                        },
                    );
                }
            }
        }
    }

    /// The partitions being fetched, with their leader (tests, metrics).
    pub fn followed(&self) -> Vec<(TopicPartition, NodeId)> {
        let sessions = self.sessions.lock().expect("poisoned");
        let mut out = Vec::new();
        for (leader, s) in sessions.iter() {
            for tp in s.states.lock().expect("poisoned").keys() {
                out.push((tp.clone(), *leader));
            }
        }
        out
    }

    /// Stops every session and waits until their tasks are gone, so no
    /// task holds a partition when the replicas close.
    pub async fn shutdown(&self) {
        let sessions: Vec<Session> = self
            .sessions
            .lock()
            .expect("poisoned")
            .drain()
            .map(|(_, s)| s)
            .collect();
        for s in sessions {
            s.task.abort();
            let _ = s.task.await;
        }
    }
}

impl Drop for ReplicaFetcherManager {
    fn drop(&mut self) {
        if let Ok(sessions) = self.sessions.get_mut() {
            for s in sessions.values() {
                s.task.abort();
            }
        }
    }
}

/// Why a round with the leader failed as a whole.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error("no address for leader {0}")]
    NoAddress(NodeId),
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("leader answered {0:?}")]
    Leader(ResponseError),
}

impl From<crate::net::CallError> for RoundError {
    fn from(e: crate::net::CallError) -> Self {
        match e {
            crate::net::CallError::Io(e) => RoundError::Io(e),
            crate::net::CallError::Protocol(m) => RoundError::Protocol(m),
        }
    }
}

async fn run_session(
    node_id: NodeId,
    leader: NodeId,
    config: FetcherConfig,
    env: Arc<dyn FetcherEnv>,
    states: States,
) {
    let backoff = Duration::from_millis(config.backoff_ms.max(1));
    let mut conn: Option<PeerConn> = None;
    let mut failed_connects: u64 = 0;
    loop {
        if conn.is_none() {
            match connect(node_id, leader, &config, env.as_ref()).await {
                Ok(c) => {
                    conn = Some(c);
                    failed_connects = 0;
                }
                Err(e) => {
                    // A leader that is down is routine; one that refuses our
                    // login (a wrong password, an untrusted certificate) stops
                    // replication, so say it at the first failure and now and
                    // then after, not only at debug level.
                    failed_connects += 1;
                    if failed_connects == 1 || failed_connects.is_multiple_of(60) {
                        tracing::warn!(%leader, error = %e, attempts = failed_connects, "replica fetcher cannot connect to the leader");
                    } else {
                        tracing::debug!(%leader, error = %e, "replica fetcher cannot reach the leader");
                    }
                    tokio::time::sleep(backoff).await;
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected above");
        match round(node_id, &config, env.as_ref(), &states, c).await {
            Ok(true) => {}
            Ok(false) => tokio::time::sleep(backoff).await,
            Err(e) => {
                tracing::info!(%leader, error = %e, "replica fetch failed; backing off");
                if !matches!(e, RoundError::Leader(_)) {
                    conn = None;
                }
                tokio::time::sleep(backoff).await;
            }
        }
    }
}

async fn connect(
    node_id: NodeId,
    leader: NodeId,
    config: &FetcherConfig,
    env: &dyn FetcherEnv,
) -> Result<PeerConn, RoundError> {
    let addr = env
        .leader_address(leader)
        .ok_or(RoundError::NoAddress(leader))?;
    // The leader accepts replica fetches only from this node's registered
    // address, so connect from it.
    let own = env.leader_address(node_id);
    let own_host = own
        .as_deref()
        .and_then(|a| a.rsplit_once(':'))
        .map(|(host, _)| host);
    // The response holds at most `response_max_bytes` of batches, or one
    // batch when the first alone is larger.
    let max_response = (config.response_max_bytes.max(0) as usize)
        .max(config.max_batch_bytes.max(0) as usize)
        .saturating_add(RESPONSE_OVERHEAD_BYTES);
    Ok(PeerConn::open(
        &addr,
        own_host,
        &env.peer_security(),
        StrBytes::from_string(format!("broker-{node_id}-fetcher-{leader}")),
        max_response,
        config.request_timeout,
        CONNECT_TIMEOUT,
    )
    .await?)
}

/// The partitions ready in `phase`, as of now.
fn ready(states: &States, phase: Phase) -> Vec<FetchState> {
    let now = Instant::now();
    states
        .lock()
        .expect("poisoned")
        .values()
        .filter(|s| s.phase == phase && s.delayed_until.is_none_or(|t| t <= now))
        .cloned()
        .collect()
}

/// Changes a partition's state, unless `update` replaced it meanwhile (a
/// new leader epoch starts over).
fn set_state(states: &States, was: &FetchState, f: impl FnOnce(&mut FetchState)) {
    if let Some(s) = states.lock().expect("poisoned").get_mut(&was.tp) {
        if s.leader_epoch == was.leader_epoch && s.topic_id == was.topic_id {
            f(s);
        }
    }
}

fn delay(states: &States, was: &FetchState, backoff_ms: u64) {
    let until = Instant::now() + Duration::from_millis(backoff_ms.max(1));
    set_state(states, was, |s| s.delayed_until = Some(until));
}

/// One exchange with the leader: truncation for partitions that need it,
/// then one Fetch for the rest. `Ok(false)` when there was nothing to do.
async fn round(
    node_id: NodeId,
    config: &FetcherConfig,
    env: &dyn FetcherEnv,
    states: &States,
    conn: &mut PeerConn,
) -> Result<bool, RoundError> {
    let truncating = ready(states, Phase::Truncating);
    if !truncating.is_empty() {
        truncate_divergence(node_id, config, env, states, conn, truncating).await?;
    }
    let fetching = ready(states, Phase::Fetching);
    if fetching.is_empty() {
        return Ok(false);
    }
    fetch(node_id, config, env, states, conn, fetching).await?;
    Ok(true)
}

/// Kafka's `maybeTruncate`: OffsetForLeaderEpoch for each partition's latest
/// epoch, then truncation by `getOffsetTruncationState`.
async fn truncate_divergence(
    node_id: NodeId,
    config: &FetcherConfig,
    env: &dyn FetcherEnv,
    states: &States,
    conn: &mut PeerConn,
    parts: Vec<FetchState>,
) -> Result<(), RoundError> {
    let mut asked = Vec::new();
    for s in parts {
        let Some(part) = env.partition(&s.tp) else {
            delay(states, &s, config.backoff_ms);
            continue;
        };
        let latest = part.lock().expect("poisoned").latest_epoch();
        match latest {
            Some(epoch) => asked.push((s, epoch)),
            None => {
                // No epochs (an empty log): nothing can diverge. Kafka
                // truncates such a replica to its high watermark.
                let mut p = part.lock().expect("poisoned");
                let hw = p.high_watermark();
                p.truncate_to(hw).map_err(storage)?;
                drop(p);
                set_state(states, &s, |x| x.phase = Phase::Fetching);
            }
        }
    }
    if asked.is_empty() {
        return Ok(());
    }
    let mut topics: Vec<OffsetForLeaderTopic> = Vec::new();
    for (s, epoch) in &asked {
        let p = OffsetForLeaderPartition::default()
            .with_partition(s.tp.partition)
            .with_current_leader_epoch(s.leader_epoch.0)
            .with_leader_epoch(epoch.0);
        match topics.iter_mut().find(|t| *t.topic.0 == *s.tp.topic) {
            Some(t) => t.partitions.push(p),
            None => topics.push(
                OffsetForLeaderTopic::default()
                    .with_topic(topic_name(&s.tp))
                    .with_partitions(vec![p]),
            ),
        }
    }
    let req = OffsetForLeaderEpochRequest::default()
        .with_replica_id(BrokerId(node_id.0))
        .with_topics(topics);
    let resp: OffsetForLeaderEpochResponse = conn
        .call(
            ApiKey::OffsetForLeaderEpoch,
            OFFSET_FOR_LEADER_EPOCH_VERSION,
            &req,
        )
        .await?;
    for (s, _) in asked {
        let answer = resp
            .topics
            .iter()
            .filter(|t| *t.topic.0 == *s.tp.topic)
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition == s.tp.partition);
        let Some(answer) = answer else {
            delay(states, &s, config.backoff_ms);
            continue;
        };
        if answer.error_code != 0 {
            tracing::debug!(tp = %s.tp, code = answer.error_code, "OffsetForLeaderEpoch failed");
            delay(states, &s, config.backoff_ms);
            continue;
        }
        let Some(part) = env.partition(&s.tp) else {
            continue;
        };
        let mut p = part.lock().expect("poisoned");
        let done = apply_truncation(
            &mut p,
            LeaderEpoch(answer.leader_epoch),
            Offset(answer.end_offset),
        )
        .map_err(storage)?;
        drop(p);
        if done {
            set_state(states, &s, |x| x.phase = Phase::Fetching);
        }
    }
    Ok(())
}

/// Kafka's `getOffsetTruncationState` followed by the truncation. Returns
/// whether truncation is complete; when the follower does not know the
/// epoch the leader answered with, it cuts to the end of its own largest
/// epoch below that and asks again.
pub fn apply_truncation(
    p: &mut crate::partition::Partition,
    leader_epoch: LeaderEpoch,
    leader_end_offset: Offset,
) -> Result<bool, PartitionError> {
    let leo = p.log_end_offset();
    if leader_end_offset.0 < 0 || leader_epoch.0 < 0 {
        // The leader knows no epoch at or below ours: keep what is below
        // the high watermark (committed), refetch the rest.
        let hw = p.high_watermark();
        p.truncate_to(hw)?;
        return Ok(true);
    }
    let (follower_epoch, follower_end) = p.end_offset_for_epoch(leader_epoch);
    if follower_end.0 >= 0 && follower_epoch != leader_epoch {
        p.truncate_to(follower_end.min(leo))?;
        return Ok(false);
    }
    p.truncate_to(leader_end_offset.min(leo))?;
    Ok(true)
}

fn storage(e: PartitionError) -> RoundError {
    RoundError::Protocol(format!("local replica: {e}"))
}

fn topic_name(tp: &TopicPartition) -> TopicName {
    TopicName(StrBytes::from_string(tp.topic.to_string()))
}

async fn fetch(
    node_id: NodeId,
    config: &FetcherConfig,
    env: &dyn FetcherEnv,
    states: &States,
    conn: &mut PeerConn,
    parts: Vec<FetchState>,
) -> Result<(), RoundError> {
    // The fetch offset of each partition, remembered to drop an answer the
    // log has moved past meanwhile.
    let mut sent: Vec<(FetchState, Offset)> = Vec::new();
    let mut topics: Vec<FetchTopic> = Vec::new();
    for s in parts {
        let Some(part) = env.partition(&s.tp) else {
            delay(states, &s, config.backoff_ms);
            continue;
        };
        let (leo, log_start) = {
            let p = part.lock().expect("poisoned");
            (p.log_end_offset(), p.log_start_offset())
        };
        let fp = FetchPartition::default()
            .with_partition(s.tp.partition)
            .with_current_leader_epoch(s.leader_epoch.0)
            .with_fetch_offset(leo.0)
            .with_last_fetched_epoch(-1)
            .with_log_start_offset(log_start.0)
            .with_partition_max_bytes(config.max_bytes);
        match topics.iter_mut().find(|t| t.topic_id == s.topic_id) {
            Some(t) => t.partitions.push(fp),
            None => topics.push(
                FetchTopic::default()
                    .with_topic_id(s.topic_id)
                    .with_partitions(vec![fp]),
            ),
        }
        sent.push((s, leo));
    }
    if sent.is_empty() {
        return Ok(());
    }
    let req = FetchRequest::default()
        .with_replica_state(
            ReplicaState::default()
                .with_replica_id(BrokerId(node_id.0))
                .with_replica_epoch(-1),
        )
        .with_max_wait_ms(config.wait_max_ms)
        .with_min_bytes(config.min_bytes)
        .with_max_bytes(config.response_max_bytes)
        .with_isolation_level(0)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(topics);
    let resp: FetchResponse = conn.call(ApiKey::Fetch, FETCH_VERSION, &req).await?;
    if resp.error_code != 0 {
        return Err(RoundError::Leader(
            ResponseError::try_from_code(resp.error_code)
                .unwrap_or(ResponseError::UnknownServerError),
        ));
    }
    let mut out_of_range = Vec::new();
    for (s, fetch_offset) in sent {
        let data = resp
            .responses
            .iter()
            .filter(|t| t.topic_id == s.topic_id)
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == s.tp.partition);
        let Some(data) = data else { continue };
        match ResponseError::try_from_code(data.error_code) {
            None => {}
            Some(ResponseError::OffsetOutOfRange) => {
                out_of_range.push(s);
                continue;
            }
            Some(e) => {
                // NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH,
                // UNKNOWN_TOPIC_ID, ...: the next image will tell.
                tracing::debug!(tp = %s.tp, error = ?e, "replica fetch partition error");
                delay(states, &s, config.backoff_ms);
                continue;
            }
        }
        if data.diverging_epoch.epoch >= 0 {
            set_state(states, &s, |x| x.phase = Phase::Truncating);
            continue;
        }
        let Some(part) = env.partition(&s.tp) else {
            continue;
        };
        let mut p = part.lock().expect("poisoned");
        if p.log_end_offset() != fetch_offset {
            continue;
        }
        if let Some(records) = data.records.clone().filter(|r| !r.is_empty()) {
            if let Err(e) = p.append_as_follower(records, crate::broker::now_ms()) {
                tracing::warn!(tp = %s.tp, error = %e, "appending fetched batches failed");
                drop(p);
                match e {
                    PartitionError::Storage(_) => return Err(storage(e)),
                    _ => {
                        set_state(states, &s, |x| x.phase = Phase::Truncating);
                        continue;
                    }
                }
            }
        }
        p.update_follower_high_watermark(Offset(data.high_watermark));
        if data.log_start_offset >= 0 {
            p.maybe_increment_log_start_offset(Offset(data.log_start_offset))
                .map_err(storage)?;
        }
    }
    for s in out_of_range {
        handle_out_of_range(node_id, config, env, states, conn, s).await?;
    }
    Ok(())
}

/// Kafka's `fetchOffsetAndTruncate`: the leader's log end is below ours
/// (truncate to it) or its log start is above ours (start over there). Our
/// ListOffsets answers "latest" with the high watermark even for replicas,
/// so the cut may be lower than Kafka's; what lies between is fetched again.
async fn handle_out_of_range(
    node_id: NodeId,
    config: &FetcherConfig,
    env: &dyn FetcherEnv,
    states: &States,
    conn: &mut PeerConn,
    s: FetchState,
) -> Result<(), RoundError> {
    let mut offsets = Vec::new();
    for timestamp in [-1i64, -2] {
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(node_id.0))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(topic_name(&s.tp))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(s.tp.partition)
                    .with_current_leader_epoch(s.leader_epoch.0)
                    .with_timestamp(timestamp)])]);
        let resp: ListOffsetsResponse = conn
            .call(ApiKey::ListOffsets, LIST_OFFSETS_VERSION, &req)
            .await?;
        let answer = resp
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == s.tp.partition);
        match answer {
            Some(a) if a.error_code == 0 && a.offset >= 0 => offsets.push(Offset(a.offset)),
            _ => {
                delay(states, &s, config.backoff_ms);
                return Ok(());
            }
        }
    }
    let (leader_end, leader_start) = (offsets[0], offsets[1]);
    let Some(part) = env.partition(&s.tp) else {
        return Ok(());
    };
    let mut p = part.lock().expect("poisoned");
    let leo = p.log_end_offset();
    if leader_end < leo {
        tracing::warn!(tp = %s.tp, %leader_end, %leo, "leader's log ends below ours; truncating");
        p.truncate_to(leader_end).map_err(storage)?;
    } else if leader_start > leo {
        tracing::info!(tp = %s.tp, %leader_start, "leader's log starts above our log end; starting over there");
        p.truncate_fully_and_start_at(leader_start)
            .map_err(storage)?;
    } else {
        drop(p);
        delay(states, &s, config.backoff_ms);
        set_state(states, &s, |x| x.phase = Phase::Truncating);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use bytes::{Bytes, BytesMut};
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };
    use protocol::record_batch::rewrite;

    use super::*;
    use crate::config::{ServerConfig, TopicConfigs};
    use crate::partition::Partition;

    /// `n` records stored at `base` in `epoch`.
    fn stored(n: usize, base: i64, epoch: i32) -> Bytes {
        let records: Vec<Record> = (0..n)
            .map(|i| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: i as i32 - 1,
                timestamp: 1_000,
                key: None,
                value: Some(Bytes::from(format!("{epoch}-{base}-{i}"))),
                headers: Default::default(),
            })
            .collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .unwrap();
        rewrite::set_base_offset(&mut buf, base);
        rewrite::set_partition_leader_epoch(&mut buf, epoch);
        buf.freeze()
    }

    /// A replica whose log holds one batch per (epoch, base, count).
    fn replica(dir: &std::path::Path, batches: &[(i32, i64, usize)]) -> Partition {
        let configs = TopicConfigs::resolve(&ServerConfig::default(), &BTreeMap::new());
        let mut p = Partition::open(
            dir.to_path_buf(),
            TopicPartition::new("t", 0),
            Uuid::nil(),
            LeaderEpoch(0),
            configs,
            1_000,
        )
        .unwrap();
        for &(epoch, base, n) in batches {
            p.append_as_follower(stored(n, base, epoch), 1_000).unwrap();
        }
        p
    }

    /// Kafka's fetcher loop over OffsetForLeaderEpoch answers, run against a
    /// leader replica in memory; returns how many requests it took.
    fn truncate_against(follower: &mut Partition, leader: &Partition) -> usize {
        for round in 1..10 {
            let epoch = follower.latest_epoch().unwrap_or(LeaderEpoch(-1));
            let (e, o) = leader.end_offset_for_epoch(epoch);
            if apply_truncation(follower, e, o).unwrap() {
                return round;
            }
        }
        panic!("truncation did not converge");
    }

    #[test]
    fn a_follower_truncates_to_the_end_of_the_last_common_epoch() {
        let (ld, fd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // Both have epoch 0 up to 5; the follower then led epoch 1 (5..8),
        // the leader epoch 3 (5..9).
        let leader = replica(ld.path(), &[(0, 0, 3), (0, 3, 2), (3, 5, 4)]);
        let mut follower = replica(fd.path(), &[(0, 0, 3), (0, 3, 2), (1, 5, 3)]);
        assert_eq!(truncate_against(&mut follower, &leader), 1);
        assert_eq!(follower.log_end_offset(), Offset(5));
        assert_eq!(follower.epoch_entries(), vec![(LeaderEpoch(0), Offset(0))]);
    }

    #[test]
    fn an_epoch_the_follower_lacks_takes_another_round() {
        let (ld, fd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // Leader: epochs 0 (0..5), 2 (5..10), 4 (10..12). Follower: 0
        // (0..5), 1 (5..8), 3 (8..12). Asked for 3, the leader answers
        // (2, 10); the follower has no epoch 2, so it cuts at the end of its
        // epoch 1 (8) and asks again with 1: (0, 5).
        let leader = replica(ld.path(), &[(0, 0, 5), (2, 5, 5), (4, 10, 2)]);
        let mut follower = replica(fd.path(), &[(0, 0, 5), (1, 5, 3), (3, 8, 4)]);
        assert_eq!(truncate_against(&mut follower, &leader), 2);
        assert_eq!(follower.log_end_offset(), Offset(5));
    }

    #[test]
    fn a_follower_behind_the_leader_keeps_its_log() {
        let (ld, fd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let leader = replica(ld.path(), &[(0, 0, 3), (2, 3, 3)]);
        let mut follower = replica(fd.path(), &[(0, 0, 3), (2, 3, 1)]);
        assert_eq!(truncate_against(&mut follower, &leader), 1);
        assert_eq!(follower.log_end_offset(), Offset(4));
        // The leader knows no epoch at or below the follower's: keep the
        // committed part only.
        let ad = tempfile::tempdir().unwrap();
        let mut ahead = replica(ad.path(), &[(7, 0, 2)]);
        ahead.update_follower_high_watermark(Offset(1));
        assert!(apply_truncation(&mut ahead, LeaderEpoch(-1), Offset(-1)).unwrap());
        assert_eq!(ahead.log_end_offset(), Offset(0));
    }
}
