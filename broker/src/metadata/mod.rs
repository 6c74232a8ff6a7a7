//! Cluster metadata: a Raft group (openraft) whose replicated state machine is
//! the [`MetadataImage`] (brokers, topics, partition assignments, configs,
//! producer id blocks), stored in RocksDB.
//!
//! A single node is a one-voter group, so the embedded default and a cluster run
//! the same code path: every change goes through [`MetadataController::propose`],
//! is appended to the Raft log, committed, applied to the image, and published to
//! subscribers.
//!
//! Invariant: `image` is pure (no I/O); `store` knows RocksDB and openraft's
//! storage traits but not the controller; `network` is the only place that will
//! know how voters talk to each other.

pub mod image;
pub mod network;
pub mod placement;
pub mod store;

use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, Config, Raft, ServerState};
use tokio::sync::{oneshot, watch};

use crate::types::NodeId;

pub use image::{
    BrokerRegistration, MetadataCommand, MetadataError, MetadataImage, MetadataOutcome,
    PartitionImage, TopicImage, NO_LEADER,
};
use network::MetadataNetwork;
use store::{MetadataLogStore, MetadataStateMachine, RaftNodeId};

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

/// How long `open` waits for this node to lead and catch up before giving up.
/// A healthy single voter needs well under a second (one election timeout at most).
const STARTUP_TIMEOUT_MS: u64 = 10_000;

/// How long `shutdown` waits for openraft's background tasks to release the
/// store, so the RocksDB lock is free when it returns.
const SHUTDOWN_TIMEOUT_MS: u64 = 10_000;

/// The handle to this node's member of the metadata quorum.
pub struct MetadataController {
    node_id: NodeId,
    raft: Raft<TypeConfig>,
    image_rx: watch::Receiver<Arc<MetadataImage>>,
    /// Completes once openraft's tasks have dropped the store and RocksDB is closed.
    db_closed: oneshot::Receiver<()>,
}

impl MetadataController {
    /// Opens (or creates) the metadata store in `dir` and starts Raft.
    ///
    /// On a fresh store this forms a one-voter group `{node_id}` advertised at
    /// `listener_addr`. Either way it then waits until this node is the leader
    /// and has applied its whole log, and makes sure the cluster has an id.
    pub async fn open(
        dir: &Path,
        node_id: NodeId,
        listener_addr: String,
    ) -> Result<Self, MetadataError> {
        let raft_id = raft_node_id(node_id)?;
        let (db, db_closed) = store::open_db(dir)
            .map_err(|e| MetadataError::Fatal(format!("opening {}: {e}", dir.display())))?;
        let state_machine = MetadataStateMachine::open(db.clone())
            .map_err(|e| MetadataError::Fatal(e.to_string()))?;
        let image_rx = state_machine.subscribe();
        let log_store = MetadataLogStore::new(db.clone());
        // From here on openraft's tasks hold the only references to the database.
        drop(db);

        let config = Config {
            cluster_name: "metadata".to_string(),
            // Small timeouts are safe for one voter (there is nobody to lose
            // heartbeats to) and keep a restart that must re-elect fast.
            heartbeat_interval: 50,
            election_timeout_min: 150,
            election_timeout_max: 300,
            ..Config::default()
        };
        let config = Arc::new(
            config
                .validate()
                .map_err(|e| MetadataError::Fatal(e.to_string()))?,
        );
        let raft = Raft::new(raft_id, config, MetadataNetwork, log_store, state_machine)
            .await
            .map_err(|e| MetadataError::Fatal(e.to_string()))?;

        let controller = Self {
            node_id,
            raft,
            image_rx,
            db_closed,
        };
        match controller.start(raft_id, listener_addr).await {
            Ok(()) => Ok(controller),
            Err(e) => {
                // Release the store so a retry in this process can open it again.
                let _ = controller.shutdown().await;
                Err(e)
            }
        }
    }

    async fn start(&self, raft_id: RaftNodeId, listener_addr: String) -> Result<(), MetadataError> {
        let initialized = self
            .raft
            .is_initialized()
            .await
            .map_err(|e| MetadataError::Fatal(e.to_string()))?;
        if !initialized {
            let members =
                std::collections::BTreeMap::from([(raft_id, BasicNode::new(listener_addr))]);
            match self.raft.initialize(members).await {
                Ok(()) => {}
                // Someone (a previous run of this process) already formed the
                // group; that is the state we wanted.
                Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(RaftError::APIError(InitializeError::NotInMembers(e))) => {
                    return Err(MetadataError::Fatal(e.to_string()))
                }
                Err(RaftError::Fatal(e)) => return Err(MetadataError::Fatal(e.to_string())),
            }
        }

        let timeout = Some(Duration::from_millis(STARTUP_TIMEOUT_MS));
        self.raft
            .wait(timeout)
            .state(ServerState::Leader, "metadata controller startup")
            .await
            .map_err(|e| MetadataError::Fatal(format!("waiting to become metadata leader: {e}")))?;
        // Confirms leadership and waits until the state machine has applied
        // everything up to this term's first entry, i.e. the whole log.
        self.raft
            .ensure_linearizable()
            .await
            .map_err(|e| MetadataError::Fatal(format!("waiting to apply the metadata log: {e}")))?;

        // Checked on every open, not just on a fresh store, so a crash between
        // forming the group and applying InitCluster still ends with an id.
        if self.image().cluster_id.is_empty() {
            self.propose(MetadataCommand::InitCluster {
                cluster_id: new_cluster_id(),
            })
            .await?;
        }
        Ok(())
    }

    /// Proposes a change and waits until it is committed and applied. A
    /// command the image rejects returns its error; nothing changed then.
    pub async fn propose(&self, cmd: MetadataCommand) -> Result<MetadataOutcome, MetadataError> {
        match self.raft.client_write(cmd).await {
            Ok(response) => response.data,
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                Err(MetadataError::NotController {
                    leader: forward.leader_id.and_then(broker_node_id),
                })
            }
            // Only membership-change entries produce this; a metadata command
            // reaching it means openraft and this module disagree about the log.
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => Err(
                MetadataError::Fatal(format!("unexpected membership error: {e}")),
            ),
            Err(RaftError::Fatal(e)) => Err(MetadataError::Fatal(e.to_string())),
        }
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
    pub async fn shutdown(self) -> Result<(), MetadataError> {
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

        let controller = MetadataController::open(dir.path(), NodeId(1), addr.clone())
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

        let controller = MetadataController::open(dir.path(), NodeId(1), addr)
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
        let result = MetadataController::open(dir.path(), NodeId(-1), "x:1".into()).await;
        assert!(matches!(result, Err(MetadataError::Fatal(_))));
    }
}
