//! Cluster metadata: a Raft group (openraft) whose replicated state machine is
//! the [`MetadataImage`] (brokers, topics, partition assignments, configs,
//! producer id blocks), stored in RocksDB.
//!
//! A single node is a one-voter group, so the embedded default and a cluster run
//! the same code path: every change goes through [`MetadataController::propose`],
//! is appended to the Raft log, committed, applied to the image, and published to
//! subscribers. With `controller.quorum.voters` set, every node is a voter (Kafka's
//! combined mode): a follower forwards a proposal to the leader over the
//! controller listener and returns the leader's answer.
//!
//! Invariant: `image` is pure (no I/O); `store` knows RocksDB and openraft's
//! storage traits but not the controller; `transport` and `network` are the only
//! places that know how voters talk to each other.

pub mod image;
pub mod liveness;
pub mod network;
pub mod placement;
pub mod quorum_info;
pub mod store;
pub mod transport;

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, Config, Raft, RaftMetrics, ServerState};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::types::NodeId;

pub use image::{elected_leader, preferred_leader, supported_features};
pub use image::{
    BrokerRegistration, ClientQuotaAlteration, ClientQuotaEntity, Endpoint, MetadataCommand,
    MetadataError, MetadataImage, MetadataOutcome, PartitionImage, QuotaEntityName, QuotaValue,
    StoredScramCredential, TopicImage, FEATURE_BROKER_CONFIGS, FEATURE_ELECT_PREFERRED, NO_LEADER,
};
use liveness::LivenessTracker;
use network::MetadataNetwork;
use store::{MetadataLogStore, MetadataStateMachine, RaftNodeId};
use transport::{HeartbeatReply, HeartbeatRequest, PeerHandler, PeerRequest, PeerResponse};

openraft::declare_raft_types!(
    /// Openraft's type configuration for the metadata group.
    pub TypeConfig:
        D = MetadataCommand,
        R = Result<MetadataOutcome, MetadataError>,
        NodeId = RaftNodeId,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// How long `open` waits for a single voter to lead and catch up before
/// giving up. A healthy single voter needs well under a second (one election
/// timeout at most).
const SINGLE_NODE_STARTUP_TIMEOUT_MS: u64 = 10_000;

/// How long `shutdown` waits for openraft's background tasks to release the
/// store, so the RocksDB lock is free when it returns.
const SHUTDOWN_TIMEOUT_MS: u64 = 10_000;

/// How long the leader waits for a proposal to commit before answering that
/// it could not (the entry may still commit later, as after Kafka's timeout).
const COMMIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause between attempts while the leader is unknown or changing.
const RETRY_BACKOFF: Duration = Duration::from_millis(50);

/// How this node takes part in the metadata quorum.
pub struct QuorumConfig {
    pub node_id: NodeId,
    /// Every voter's id and `host:port` (its controller listener), this node
    /// included. Empty: this node alone is the quorum.
    pub voters: Vec<(NodeId, String)>,
    /// With voters: the bound controller listener that peers connect to.
    pub controller_listener: Option<TcpListener>,
    /// Without voters: the address recorded for the single voter (never dialled).
    pub local_addr: String,
    /// Kafka's `controller.quorum.election.timeout.ms`: a follower that hears
    /// nothing from the leader for a random time between this and twice this
    /// starts an election. The leader's heartbeat is a third of it.
    pub election_timeout_ms: u64,
    /// Kafka's `controller.quorum.request.timeout.ms`: the bound on one call to a peer.
    pub request_timeout_ms: u64,
    /// How long `open` waits for a leader and for this node to catch up.
    pub startup_timeout_ms: u64,
    /// `broker.session.timeout.ms`, for the active controller's liveness clock.
    pub session_timeout_ms: i64,
    /// `connections.max.idle.ms`: the controller listener closes a
    /// connection idle this long between requests.
    pub idle_timeout_ms: u64,
    /// `controller.max.connections.per.voter`: connections the controller
    /// listener serves at once from one voter's address.
    pub max_connections_per_voter: usize,
    /// How this node dials the other voters' controller listeners.
    pub peer_security: Arc<crate::security::peer::PeerSecurity>,
    /// How the controller listener authenticates the voters that dial it.
    pub peer_auth: Arc<crate::security::peer::PeerServerAuth>,
    /// SCRAM credentials to form a new cluster with (`--add-scram`);
    /// ignored, with a warning, once the cluster exists.
    pub bootstrap_scram: Vec<(String, i8, StoredScramCredential)>,
}

impl QuorumConfig {
    /// A one-voter quorum, as `broker::start` forms without `controller.quorum.voters`.
    pub fn single(node_id: NodeId, local_addr: String) -> Self {
        Self {
            node_id,
            voters: Vec::new(),
            controller_listener: None,
            local_addr,
            election_timeout_ms: 1_000,
            request_timeout_ms: 2_000,
            startup_timeout_ms: SINGLE_NODE_STARTUP_TIMEOUT_MS,
            session_timeout_ms: 9_000,
            idle_timeout_ms: 600_000,
            max_connections_per_voter: 16,
            peer_security: Arc::new(crate::security::peer::PeerSecurity::plaintext()),
            peer_auth: Arc::new(crate::security::peer::PeerServerAuth::plaintext()),
            bootstrap_scram: Vec::new(),
        }
    }
}

/// The handle to this node's member of the metadata quorum.
pub struct MetadataController {
    node_id: NodeId,
    raft_id: RaftNodeId,
    raft: Raft<TypeConfig>,
    image_rx: watch::Receiver<Arc<MetadataImage>>,
    /// Whether other voters exist (a single voter never forwards or waits for peers).
    clustered: bool,
    request_timeout: Duration,
    /// How long `propose` keeps looking for a leader before `NotController`.
    leader_wait: Duration,
    liveness: Arc<Mutex<LivenessTracker>>,
    /// The connection this broker's heartbeats use, to the leader it last knew.
    heartbeat_client: tokio::sync::Mutex<Option<transport::PeerClient>>,
    /// How connections to peers are made: from this node's voter host (they
    /// serve only voters' addresses), with the controller listener's security.
    dialer: transport::Dialer,
    /// Stops the controller listener; its task ends once every connection is dropped.
    server: Option<(watch::Sender<bool>, tokio::task::JoinHandle<()>)>,
    /// Completes once openraft's tasks have dropped the store and RocksDB is closed.
    db_closed: oneshot::Receiver<()>,
}

impl MetadataController {
    /// Opens (or creates) the metadata store in `dir` and starts Raft.
    ///
    /// On a fresh store this forms the group: a one-voter group `{node_id}`, or
    /// with voters every node initializes the same full voter set (whichever
    /// initialization a node sees first is the same membership entry). Then it
    /// waits until a leader is known and this node has applied everything the
    /// leader had committed, and makes sure the cluster has an id.
    pub async fn open(dir: &Path, quorum: QuorumConfig) -> Result<Self, MetadataError> {
        let raft_id = raft_node_id(quorum.node_id)?;
        let clustered = !quorum.voters.is_empty();
        let mut members = BTreeMap::new();
        if clustered {
            for (id, addr) in &quorum.voters {
                members.insert(raft_node_id(*id)?, BasicNode::new(addr.clone()));
            }
            if !members.contains_key(&raft_id) {
                return Err(MetadataError::Fatal(format!(
                    "node {} is not one of the controller quorum voters",
                    quorum.node_id
                )));
            }
        } else {
            members.insert(raft_id, BasicNode::new(quorum.local_addr.clone()));
        }

        let (db, db_closed) = store::open_db(dir)
            .map_err(|e| MetadataError::Fatal(format!("opening {}: {e}", dir.display())))?;
        let state_machine = MetadataStateMachine::open(db.clone())
            .map_err(|e| MetadataError::Fatal(e.to_string()))?;
        let image_rx = state_machine.subscribe();
        let log_store = MetadataLogStore::new(db.clone());
        // From here on openraft's tasks hold the only references to the database.
        drop(db);

        let config = if clustered {
            // Kafka's KRaft default: an election timeout of 1 s, randomised
            // up to twice that. openraft also uses the heartbeat interval as
            // the timeout of each append-entries call, so it must leave room
            // for a peer's synced write under load: a third of the election
            // timeout still gives a follower three chances to hear from a
            // live leader before it starts an election.
            let election = quorum.election_timeout_ms.max(30);
            Config {
                cluster_name: "metadata".to_string(),
                heartbeat_interval: election / 3,
                election_timeout_min: election,
                election_timeout_max: election * 2,
                ..Config::default()
            }
        } else {
            Config {
                cluster_name: "metadata".to_string(),
                // Small timeouts are safe for one voter (there is nobody to lose
                // heartbeats to) and keep a restart that must re-elect fast.
                heartbeat_interval: 50,
                election_timeout_min: 150,
                election_timeout_max: 300,
                ..Config::default()
            }
        };
        let election_max = config.election_timeout_max;
        let config = Arc::new(
            config
                .validate()
                .map_err(|e| MetadataError::Fatal(e.to_string()))?,
        );
        let voter_hosts: Vec<String> = quorum
            .voters
            .iter()
            .filter_map(|(_, addr)| addr.rsplit_once(':').map(|(host, _)| host.to_string()))
            .collect();
        let source_host = quorum
            .voters
            .iter()
            .find(|(id, _)| *id == quorum.node_id)
            .and_then(|(_, addr)| addr.rsplit_once(':').map(|(host, _)| host.to_string()));
        let dialer = transport::Dialer {
            source_host,
            security: quorum.peer_security.clone(),
        };
        let network = MetadataNetwork {
            dialer: dialer.clone(),
        };
        let raft = Raft::new(raft_id, config, network, log_store, state_machine)
            .await
            .map_err(|e| MetadataError::Fatal(e.to_string()))?;

        let request_timeout = Duration::from_millis(quorum.request_timeout_ms.max(1));
        let liveness = Arc::new(Mutex::new(LivenessTracker::new(quorum.session_timeout_ms)));
        let server = quorum.controller_listener.map(|listener| {
            let service = Arc::new(PeerService {
                raft: raft.clone(),
                raft_id,
                image_rx: image_rx.clone(),
                liveness: liveness.clone(),
            });
            let (stop_tx, stop_rx) = watch::channel(false);
            let access = transport::PeerAccess {
                auth: quorum.peer_auth.clone(),
                voter_hosts,
                max_connections_per_voter: quorum.max_connections_per_voter,
                idle_timeout: Duration::from_millis(quorum.idle_timeout_ms),
                frame_timeout: request_timeout,
            };
            let task = tokio::spawn(transport::serve(listener, service, access, stop_rx));
            (stop_tx, task)
        });

        let controller = Self {
            node_id: quorum.node_id,
            raft_id,
            raft,
            image_rx,
            clustered,
            request_timeout,
            leader_wait: Duration::from_millis(2 * election_max) + request_timeout,
            liveness,
            heartbeat_client: tokio::sync::Mutex::new(None),
            dialer,
            server,
            db_closed,
        };
        let startup = Duration::from_millis(quorum.startup_timeout_ms.max(1));
        match controller
            .start(members, startup, quorum.bootstrap_scram)
            .await
        {
            Ok(()) => Ok(controller),
            Err(e) => {
                // Release the store so a retry in this process can open it again.
                let _ = controller.shutdown().await;
                Err(e)
            }
        }
    }

    async fn start(
        &self,
        members: BTreeMap<RaftNodeId, BasicNode>,
        timeout: Duration,
        bootstrap_scram: Vec<(String, i8, StoredScramCredential)>,
    ) -> Result<(), MetadataError> {
        let deadline = Instant::now() + timeout;
        let initialized = self
            .raft
            .is_initialized()
            .await
            .map_err(|e| MetadataError::Fatal(e.to_string()))?;
        if !initialized {
            match self.raft.initialize(members).await {
                Ok(()) => {}
                // Someone (a previous run of this process, or a peer whose
                // entries arrived first) already formed the group; that is the
                // state we wanted.
                Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(RaftError::APIError(InitializeError::NotInMembers(e))) => {
                    return Err(MetadataError::Fatal(e.to_string()))
                }
                Err(RaftError::Fatal(e)) => return Err(MetadataError::Fatal(e.to_string())),
            }
        } else if self.clustered {
            let stored = self.raft.metrics().borrow().membership_config.clone();
            let stored: Vec<RaftNodeId> = stored.membership().voter_ids().collect();
            let configured: Vec<RaftNodeId> = members.keys().copied().collect();
            if stored != configured {
                tracing::warn!(
                    ?stored,
                    ?configured,
                    "controller.quorum.voters differs from the voters in the metadata log; \
                     the log wins (changing voters is not supported)"
                );
            }
        }

        if self.clustered {
            self.catch_up(deadline).await?;
        } else {
            let remaining = deadline.saturating_duration_since(Instant::now());
            self.raft
                .wait(Some(remaining))
                .state(ServerState::Leader, "metadata controller startup")
                .await
                .map_err(|e| {
                    MetadataError::Fatal(format!("waiting to become metadata leader: {e}"))
                })?;
            // Confirms leadership and waits until the state machine has applied
            // everything up to this term's first entry, i.e. the whole log.
            self.raft.ensure_linearizable().await.map_err(|e| {
                MetadataError::Fatal(format!("waiting to apply the metadata log: {e}"))
            })?;
        }

        // Checked on every open, not just on a fresh store, so a crash between
        // forming the group and applying InitCluster still ends with an id.
        // Several nodes may propose one; the first applied wins.
        if self.image().cluster_id.is_empty() {
            self.propose(MetadataCommand::InitCluster {
                cluster_id: new_cluster_id(),
                scram_credentials: bootstrap_scram,
            })
            .await?;
        } else if !bootstrap_scram.is_empty() {
            tracing::warn!(
                "--add-scram applies only when a cluster is first formed; this one exists, so \
                 its credentials are left as they are (change them with kafka-configs.sh)"
            );
        }
        Ok(())
    }

    /// Waits until a leader is known and this node has applied everything the
    /// leader had committed when asked, retrying across elections until `deadline`.
    async fn catch_up(&self, deadline: Instant) -> Result<(), MetadataError> {
        let mut last_error = String::from("no leader elected");
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(MetadataError::Fatal(format!(
                    "metadata quorum not ready in time: {last_error}"
                )));
            }
            let read_index = match self.current_leader() {
                None => Err("no leader elected yet".to_string()),
                Some((leader, _)) if leader == self.raft_id => local_read_index(&self.raft)
                    .await
                    .map_err(|e| e.to_string()),
                Some((leader, addr)) => {
                    match transport::call_once(
                        &addr,
                        &self.dialer,
                        &PeerRequest::ReadIndex,
                        self.request_timeout,
                    )
                    .await
                    {
                        Ok(PeerResponse::ReadIndex(r)) => r.map_err(|e| e.to_string()),
                        Ok(_) => Err(format!("voter {leader} answered the wrong response")),
                        Err(e) => Err(e.to_string()),
                    }
                }
            };
            match read_index {
                Ok(index) => {
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    match self
                        .raft
                        .wait(Some(remaining))
                        .applied_index_at_least(index, "metadata catch-up")
                        .await
                    {
                        Ok(_) => return Ok(()),
                        Err(e) => last_error = e.to_string(),
                    }
                }
                Err(e) => last_error = e,
            }
            tokio::time::sleep(RETRY_BACKOFF * 2).await;
        }
    }

    /// The current Raft leader as this node knows it, with its controller address.
    fn current_leader(&self) -> Option<(RaftNodeId, String)> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let leader = m.current_leader?;
        let addr = m
            .membership_config
            .membership()
            .get_node(&leader)
            .map(|n| n.addr.clone())?;
        Some((leader, addr))
    }

    /// Waits (up to `deadline`) until some leader is known.
    async fn wait_for_leader(&self, deadline: Instant) -> Option<(RaftNodeId, String)> {
        if let Some(leader) = self.current_leader() {
            return Some(leader);
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        let _ = self
            .raft
            .wait(Some(remaining))
            .metrics(|m| m.current_leader.is_some(), "a metadata leader")
            .await;
        self.current_leader()
    }

    /// Proposes a change and waits until it is committed and applied. A
    /// command the image rejects returns its error; nothing changed then.
    ///
    /// Any node may propose: a follower forwards the command to the leader and
    /// returns the leader's answer, retrying while the leader is unknown or
    /// changing. `NotController` means no leader took the command within the
    /// wait, or (after a lost answer) that it may or may not have been applied.
    pub async fn propose(&self, cmd: MetadataCommand) -> Result<MetadataOutcome, MetadataError> {
        if !self.clustered {
            return local_write(&self.raft, cmd).await.0;
        }
        let deadline = Instant::now() + self.leader_wait;
        let mut last_leader = None;
        loop {
            if let Some((leader, addr)) = self.wait_for_leader(deadline).await {
                last_leader = broker_node_id(leader);
                if leader == self.raft_id {
                    match local_write(&self.raft, cmd.clone()).await.0 {
                        Err(MetadataError::NotController { .. }) => {}
                        other => return other,
                    }
                } else {
                    let req = PeerRequest::Write(cmd.clone());
                    // The leader bounds its own commit wait; allow for the trip.
                    let timeout = COMMIT_TIMEOUT + self.request_timeout;
                    match transport::call_once(&addr, &self.dialer, &req, timeout).await {
                        Ok(PeerResponse::Write(Err(MetadataError::NotController { .. }), _)) => {}
                        Ok(PeerResponse::Write(result, log_index)) => {
                            // Read-your-writes: the caller (e.g. CreateTopics
                            // opening the new partitions) reads the local image next.
                            self.wait_applied(log_index).await;
                            return result;
                        }
                        Ok(_) => {
                            return Err(MetadataError::Fatal(format!(
                                "voter {leader} answered a write with the wrong response"
                            )))
                        }
                        // Never delivered: safe to try again.
                        Err(transport::CallError::NotSent { .. }) => {}
                        Err(e @ transport::CallError::Failed { .. }) => {
                            tracing::warn!(error = %e, "forwarded metadata write lost its answer");
                            return Err(MetadataError::NotController {
                                leader: last_leader,
                            });
                        }
                    }
                }
            }
            if Instant::now() + RETRY_BACKOFF >= deadline {
                return Err(MetadataError::NotController {
                    leader: last_leader,
                });
            }
            tokio::time::sleep(RETRY_BACKOFF).await;
        }
    }

    /// Waits (bounded) until this node has applied the entry at `log_index`.
    async fn wait_applied(&self, log_index: Option<u64>) {
        let Some(index) = log_index else { return };
        let waited = self
            .raft
            .wait(Some(COMMIT_TIMEOUT))
            .applied_index_at_least(Some(index), "a forwarded write")
            .await;
        if let Err(e) = waited {
            tracing::warn!(error = %e, "forwarded write committed but not yet applied here");
        }
    }

    /// Sends this broker's heartbeat to the active controller (itself, when it
    /// leads) and returns what the controller says about its registration.
    pub async fn heartbeat(&self) -> Result<HeartbeatReply, MetadataError> {
        let req = HeartbeatRequest {
            node_id: self.node_id,
        };
        let Some((leader, addr)) = self.current_leader() else {
            return Err(MetadataError::NotController { leader: None });
        };
        if leader == self.raft_id {
            return record_heartbeat(
                &self.raft,
                self.raft_id,
                &self.image_rx,
                &self.liveness,
                &req,
            );
        }
        // Heartbeats reuse one connection to the leader (a fresh connection
        // per heartbeat would churn through ephemeral ports); a stale one
        // fails this heartbeat and is replaced by the next.
        let mut client = self.heartbeat_client.lock().await;
        if client.as_ref().map(|c| c.addr()) != Some(addr.as_str()) {
            *client = Some(transport::PeerClient::new(
                addr.clone(),
                self.dialer.clone(),
            ));
        }
        let client = client.as_mut().expect("set above");
        match client
            .call(&PeerRequest::Heartbeat(req), self.request_timeout)
            .await
        {
            Ok(PeerResponse::Heartbeat(r)) => r,
            Ok(_) => Err(MetadataError::Fatal(format!(
                "voter {leader} answered a heartbeat with the wrong response"
            ))),
            Err(e) => Err(MetadataError::Fatal(e.to_string())),
        }
    }

    /// Whether this node is the active controller (the Raft leader), and in which term.
    pub fn leader_term(&self) -> Option<u64> {
        leader_term(&self.raft.metrics().borrow(), self.raft_id)
    }

    /// The active controller as this node knows it.
    pub fn leader(&self) -> Option<NodeId> {
        self.current_leader().and_then(|(id, _)| broker_node_id(id))
    }

    /// The active controller's record of broker heartbeats.
    pub fn liveness(&self) -> &Mutex<LivenessTracker> {
        &self.liveness
    }

    /// Whether other voters exist.
    pub fn is_clustered(&self) -> bool {
        self.clustered
    }

    /// The latest applied image.
    pub fn image(&self) -> Arc<MetadataImage> {
        self.image_rx.borrow().clone()
    }

    /// A receiver that sees the image after every apply that changed it.
    pub fn subscribe(&self) -> watch::Receiver<Arc<MetadataImage>> {
        self.image_rx.clone()
    }

    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// Stops Raft and returns once the store is closed, so the directory can be
    /// opened again (RocksDB holds a lock on it while open).
    ///
    /// openraft 0.9 cannot hand leadership to another voter, so a leader that
    /// stops leaves the others to elect after their election timeout.
    pub async fn shutdown(mut self) -> Result<(), MetadataError> {
        if let Some((stop, task)) = self.server.take() {
            let _ = stop.send(true);
            let _ = tokio::time::timeout(Duration::from_millis(SHUTDOWN_TIMEOUT_MS), task).await;
        }
        self.raft
            .shutdown()
            .await
            .map_err(|e| MetadataError::Fatal(format!("stopping metadata raft: {e}")))?;
        drop(self.raft);
        // The state machine worker and any snapshot build finish on their own
        // once the core has stopped; they hold the last references to the store.
        // The channel closing (never a value) is the signal that it is closed.
        let closed =
            tokio::time::timeout(Duration::from_millis(SHUTDOWN_TIMEOUT_MS), self.db_closed).await;
        match closed {
            Ok(_) => Ok(()),
            Err(_elapsed) => Err(MetadataError::Fatal(
                "metadata store still in use after raft stopped".to_string(),
            )),
        }
    }
}

fn leader_term(m: &RaftMetrics<RaftNodeId, BasicNode>, raft_id: RaftNodeId) -> Option<u64> {
    (m.state == ServerState::Leader && m.current_leader == Some(raft_id)).then_some(m.current_term)
}

/// Proposes on this node, which must be the leader; `NotController` otherwise.
/// Also returns the log index of the applied entry, if there is one.
async fn local_write(
    raft: &Raft<TypeConfig>,
    cmd: MetadataCommand,
) -> (Result<MetadataOutcome, MetadataError>, Option<u64>) {
    let result = tokio::time::timeout(COMMIT_TIMEOUT, raft.client_write(cmd)).await;
    let result = match result {
        Ok(Ok(response)) => return (response.data, Some(response.log_id.index)),
        Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward)))) => {
            Err(MetadataError::NotController {
                leader: forward.leader_id.and_then(broker_node_id),
            })
        }
        // Only membership-change entries produce this; a metadata command
        // reaching it means openraft and this module disagree about the log.
        Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => Err(
            MetadataError::Fatal(format!("unexpected membership error: {e}")),
        ),
        Ok(Err(RaftError::Fatal(e))) => Err(MetadataError::Fatal(e.to_string())),
        // No quorum answered in time; the entry may still commit later.
        Err(_elapsed) => Err(MetadataError::NotController { leader: None }),
    };
    (result, None)
}

/// The leader's read index: confirms leadership with a quorum and returns the
/// log index a reader must have applied to see every committed change.
async fn local_read_index(raft: &Raft<TypeConfig>) -> Result<Option<u64>, MetadataError> {
    match raft.ensure_linearizable().await {
        Ok(log_id) => Ok(log_id.map(|l| l.index)),
        Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(forward))) => {
            Err(MetadataError::NotController {
                leader: forward.leader_id.and_then(broker_node_id),
            })
        }
        Err(e) => {
            tracing::debug!(error = %e, "read index failed");
            Err(MetadataError::NotController { leader: None })
        }
    }
}

/// The active controller's side of a heartbeat: records it and reports the
/// broker's registration as the image shows it.
fn record_heartbeat(
    raft: &Raft<TypeConfig>,
    raft_id: RaftNodeId,
    image_rx: &watch::Receiver<Arc<MetadataImage>>,
    liveness: &Mutex<LivenessTracker>,
    req: &HeartbeatRequest,
) -> Result<HeartbeatReply, MetadataError> {
    let (term, leader) = {
        let m = raft.metrics();
        let m = m.borrow();
        (leader_term(&m, raft_id), m.current_leader)
    };
    let Some(term) = term else {
        return Err(MetadataError::NotController {
            leader: leader.and_then(broker_node_id),
        });
    };
    let now = crate::broker::now_ms();
    {
        let mut tracker = liveness.lock().expect("poisoned");
        tracker.set_role(Some(term), now);
        tracker.heartbeat(req.node_id, now);
    }
    let image = image_rx.borrow().clone();
    let registration = image.brokers.get(&req.node_id);
    Ok(HeartbeatReply {
        registered: registration.is_some(),
        fenced: registration.is_some_and(|b| b.fenced),
    })
}

/// Answers peers on the controller listener.
struct PeerService {
    raft: Raft<TypeConfig>,
    raft_id: RaftNodeId,
    image_rx: watch::Receiver<Arc<MetadataImage>>,
    liveness: Arc<Mutex<LivenessTracker>>,
}

impl PeerHandler for PeerService {
    async fn handle(&self, req: PeerRequest) -> PeerResponse {
        match req {
            PeerRequest::Vote(rpc) => PeerResponse::Vote(self.raft.vote(rpc).await),
            PeerRequest::AppendEntries(rpc) => {
                // Proof the sender (a leader) was alive just now; the
                // liveness clock uses it if this node takes over.
                if let Some(leader) = rpc.vote.leader_id().voted_for().and_then(broker_node_id) {
                    self.liveness
                        .lock()
                        .expect("poisoned")
                        .raft_contact(leader, crate::broker::now_ms());
                }
                PeerResponse::AppendEntries(self.raft.append_entries(rpc).await)
            }
            PeerRequest::InstallSnapshot(rpc) => {
                PeerResponse::InstallSnapshot(self.raft.install_snapshot(rpc).await)
            }
            // Not forwarded again: the caller retries with the leader it learns from the error.
            PeerRequest::Write(cmd) => {
                let (result, log_index) = local_write(&self.raft, cmd).await;
                PeerResponse::Write(result, log_index)
            }
            PeerRequest::Heartbeat(req) => PeerResponse::Heartbeat(record_heartbeat(
                &self.raft,
                self.raft_id,
                &self.image_rx,
                &self.liveness,
                &req,
            )),
            PeerRequest::ReadIndex => PeerResponse::ReadIndex(local_read_index(&self.raft).await),
            PeerRequest::QuorumInfo => {
                PeerResponse::QuorumInfo(quorum_info::from_metrics(&self.raft, self.raft_id))
            }
        }
    }
}

fn raft_node_id(node_id: NodeId) -> Result<RaftNodeId, MetadataError> {
    RaftNodeId::try_from(node_id.0)
        .map_err(|_| MetadataError::Fatal(format!("node.id {node_id} must not be negative")))
}

fn broker_node_id(raft_id: RaftNodeId) -> Option<NodeId> {
    i32::try_from(raft_id).ok().map(NodeId)
}

/// A random cluster id in Kafka's format: a UUID's 16 bytes as unpadded
/// URL-safe base64, 22 characters.
fn new_cluster_id() -> String {
    base64_url_unpadded(uuid::Uuid::new_v4().as_bytes())
}

fn base64_url_unpadded(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b0 = chunk[0];
        let b1 = chunk.get(1).copied().unwrap_or(0);
        let b2 = chunk.get(2).copied().unwrap_or(0);
        let sextets = [
            b0 >> 2,
            ((b0 & 0x03) << 4) | (b1 >> 4),
            ((b1 & 0x0f) << 2) | (b2 >> 6),
            b2 & 0x3f,
        ];
        // A chunk of n bytes carries n + 1 meaningful sextets; the rest would be padding.
        for &sextet in &sextets[..chunk.len() + 1] {
            out.push(ALPHABET[usize::from(sextet)] as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::types::LeaderEpoch;

    #[test]
    fn base64_url_matches_known_vectors() {
        assert_eq!(base64_url_unpadded(b""), "");
        assert_eq!(base64_url_unpadded(b"f"), "Zg");
        assert_eq!(base64_url_unpadded(b"fo"), "Zm8");
        assert_eq!(base64_url_unpadded(b"foo"), "Zm9v");
        assert_eq!(base64_url_unpadded(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_url_unpadded(&[0xfb, 0xff]), "-_8");
        let id = new_cluster_id();
        assert_eq!(id.len(), 22);
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    }

    fn create_topic(name: &str) -> MetadataCommand {
        MetadataCommand::CreateTopic {
            name: name.to_string(),
            topic_id: uuid::Uuid::new_v4(),
            partitions: vec![PartitionImage {
                partition: 0,
                replicas: vec![NodeId(1)],
                isr: vec![NodeId(1)],
                leader: NodeId(1),
                leader_epoch: LeaderEpoch(0),
                partition_epoch: 0,
            }],
            configs: BTreeMap::new(),
        }
    }

    async fn allocate(controller: &MetadataController) -> i64 {
        match controller
            .propose(MetadataCommand::AllocateProducerIds { count: 10 })
            .await
            .unwrap()
        {
            MetadataOutcome::ProducerIdBlock { first, count } => {
                assert_eq!(count, 10);
                first
            }
            other => panic!("expected a producer id block, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn state_survives_restart() {
        let dir = tempfile::tempdir().unwrap();
        let addr = "127.0.0.1:9092".to_string();

        let controller =
            MetadataController::open(dir.path(), QuorumConfig::single(NodeId(1), addr.clone()))
                .await
                .unwrap();
        let cluster_id = controller.image().cluster_id.clone();
        assert_eq!(cluster_id.len(), 22);

        let mut updates = controller.subscribe();
        updates.mark_unchanged();
        assert_eq!(
            controller.propose(create_topic("orders")).await,
            Ok(MetadataOutcome::Done)
        );
        assert!(updates.has_changed().unwrap());
        assert!(updates.borrow_and_update().topics.contains_key("orders"));
        assert_eq!(
            controller.propose(create_topic("orders")).await,
            Err(MetadataError::TopicAlreadyExists("orders".into()))
        );
        let topic_id = controller.image().topics["orders"].topic_id;
        let first_block = allocate(&controller).await;
        let second_block = allocate(&controller).await;
        assert!(second_block >= first_block + 10);
        controller.shutdown().await.unwrap();

        let controller =
            MetadataController::open(dir.path(), QuorumConfig::single(NodeId(1), addr))
                .await
                .unwrap();
        let image = controller.image();
        assert_eq!(image.cluster_id, cluster_id);
        assert_eq!(image.topics["orders"].topic_id, topic_id);
        assert_eq!(image.topic_by_id(topic_id).unwrap().name, "orders");
        let third_block = allocate(&controller).await;
        assert!(third_block >= second_block + 10);
        controller.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn negative_node_id_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let result =
            MetadataController::open(dir.path(), QuorumConfig::single(NodeId(-1), "x:1".into()))
                .await;
        assert!(matches!(result, Err(MetadataError::Fatal(_))));
    }
}
