//! An in-process cluster of brokers in combined mode (broker + controller),
//! for tests that need several nodes: each node has its own temporary data
//! directory (kept across stop/restart), a client listener and a controller
//! listener at fixed addresses, so a restarted node comes back at the same
//! address.
//!
//! Addresses: node `i` (1-based id) listens on host `127.0.0.{i+1}` (never
//! 127.0.0.1, the kernel's source address for loopback connections; nodes
//! connect from their own address with SO_REUSEADDR, so their ephemeral
//! ports never keep a listener from binding), port
//! `base_port + 2*(i-1)` for clients and the next port for the controller.
//! Give each test its own `base_port` inside your port range (tests in one
//! binary run concurrently).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broker::broker::Broker;
use broker::metadata::MetadataImage;

use super::Client;

/// Settings every cluster node gets unless the test overrides them: small
/// timeouts so failover and fencing happen within a test's patience.
pub const FAST_TIMEOUTS: &[(&str, &str)] = &[
    ("controller.quorum.election.timeout.ms", "500"),
    ("controller.quorum.request.timeout.ms", "1000"),
    ("broker.heartbeat.interval.ms", "100"),
    ("broker.session.timeout.ms", "1500"),
    ("offsets.topic.replication.factor", "1"),
];

/// The bound on `start` waiting for the cluster to settle.
const STARTUP_WAIT: Duration = Duration::from_secs(20);

pub struct ClusterNode {
    pub node_id: i32,
    pub client_port: u16,
    pub controller_port: u16,
    pub dir: tempfile::TempDir,
    /// `None` while stopped.
    pub running: Option<broker::RunningBroker>,
    /// This node's own extra settings, applied after the cluster-wide ones.
    pub extra: Vec<(String, String)>,
}

pub struct TestCluster {
    pub nodes: Vec<ClusterNode>,
    voters: String,
    common: Vec<(String, String)>,
}

impl TestCluster {
    /// Starts `n` nodes (ids 1..=n) with `FAST_TIMEOUTS` and `extra` (which
    /// wins over `FAST_TIMEOUTS`), and waits until every node has started
    /// (seen a leader, caught up, registered), every node's image shows all
    /// `n` brokers unfenced, and all nodes name the same leader.
    pub async fn start(n: usize, base_port: u16, extra: &[(&str, &str)]) -> TestCluster {
        Self::start_with(n, base_port, extra, |_| Vec::new()).await
    }

    /// As `start`, with per-node settings from `per_node(node_id)` on top.
    pub async fn start_with(
        n: usize,
        base_port: u16,
        extra: &[(&str, &str)],
        per_node: impl Fn(i32) -> Vec<(String, String)>,
    ) -> TestCluster {
        let voters = (1..=n as i32)
            .map(|id| format!("{id}@{}:{}", host(id), base_port + 2 * (id as u16 - 1) + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut common: Vec<(String, String)> = FAST_TIMEOUTS
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        common.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let nodes = (1..=n as i32)
            .map(|id| ClusterNode {
                node_id: id,
                client_port: base_port + 2 * (id as u16 - 1),
                controller_port: base_port + 2 * (id as u16 - 1) + 1,
                dir: tempfile::tempdir().unwrap(),
                running: None,
                extra: per_node(id),
            })
            .collect();
        let mut cluster = TestCluster {
            nodes,
            voters,
            common,
        };
        // Every node waits for a quorum while it starts, so they start together.
        let mut starts = Vec::new();
        for node in &cluster.nodes {
            let config = cluster.config(node);
            starts.push(tokio::spawn(start_retrying_bind(config)));
        }
        for (node, start) in cluster.nodes.iter_mut().zip(starts) {
            let running = start
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("node {} starts: {e}", node.node_id));
            node.running = Some(running);
        }
        // Each node registered itself through the quorum; make sure every
        // node's image shows all of them, and that they agree on a leader.
        cluster
            .wait_for_images(
                "every broker registered on every node",
                STARTUP_WAIT,
                |image| image.brokers.len() == n && image.brokers.values().all(|b| !b.fenced),
            )
            .await;
        cluster
            .wait_until("an agreed leader", STARTUP_WAIT, |c| c.leader().is_some())
            .await;
        cluster
    }

    /// The config node `node` starts with.
    pub fn config(&self, node: &ClusterNode) -> broker::config::ServerConfig {
        let mut pairs = vec![
            ("node.id".to_string(), node.node_id.to_string()),
            ("process.roles".to_string(), "broker,controller".to_string()),
            (
                "listeners".to_string(),
                format!(
                    "PLAINTEXT://{host}:{},CONTROLLER://{host}:{}",
                    node.client_port,
                    node.controller_port,
                    host = host(node.node_id)
                ),
            ),
            (
                "controller.listener.names".to_string(),
                "CONTROLLER".to_string(),
            ),
            ("controller.quorum.voters".to_string(), self.voters.clone()),
            (
                "log.dirs".to_string(),
                node.dir.path().display().to_string(),
            ),
            ("metrics.listen.address".to_string(), "none".to_string()),
        ];
        pairs.extend(self.common.iter().cloned());
        pairs.extend(node.extra.iter().cloned());
        broker::config::ServerConfig::from_pairs(pairs).expect("valid cluster config")
    }

    fn node(&self, id: i32) -> &ClusterNode {
        self.nodes
            .iter()
            .find(|n| n.node_id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    fn node_mut(&mut self, id: i32) -> &mut ClusterNode {
        self.nodes
            .iter_mut()
            .find(|n| n.node_id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    /// The running broker with this id (panics if stopped).
    pub fn broker(&self, id: i32) -> &Arc<Broker> {
        &self
            .node(id)
            .running
            .as_ref()
            .unwrap_or_else(|| panic!("node {id} is stopped"))
            .broker
    }

    /// The client address of node `id`.
    pub fn addr(&self, id: i32) -> SocketAddr {
        SocketAddr::new(host(id).parse().unwrap(), self.node(id).client_port)
    }

    pub async fn client(&self, id: i32) -> Client {
        Client::connect(self.addr(id)).await
    }

    /// Ids of the nodes currently running.
    pub fn running_ids(&self) -> Vec<i32> {
        self.nodes
            .iter()
            .filter(|n| n.running.is_some())
            .map(|n| n.node_id)
            .collect()
    }

    /// The metadata image of node `id`.
    pub fn image(&self, id: i32) -> Arc<MetadataImage> {
        self.broker(id).metadata.image()
    }

    /// The Raft leader (active controller) as the running nodes agree on it,
    /// if they all name the same one and it is running.
    pub fn leader(&self) -> Option<i32> {
        let ids = self.running_ids();
        let first = self.broker(*ids.first()?).metadata.leader()?.0;
        let agreed = ids
            .iter()
            .all(|&id| self.broker(id).metadata.leader().map(|n| n.0) == Some(first));
        (agreed && ids.contains(&first)).then_some(first)
    }

    /// Stops node `id` as `RunningBroker::shutdown` does (a controlled
    /// shutdown unless the node has `controlled.shutdown.enable=false`). Its
    /// data directory stays for `restart`.
    pub async fn stop(&mut self, id: i32) {
        let running = self
            .node_mut(id)
            .running
            .take()
            .unwrap_or_else(|| panic!("node {id} is already stopped"));
        running.shutdown().await;
    }

    /// Starts a stopped node again with the same directory and ports.
    pub async fn restart(&mut self, id: i32) {
        let config = self.config(self.node(id));
        let running = start_retrying_bind(config)
            .await
            .unwrap_or_else(|e| panic!("node {id} restarts: {e}"));
        self.node_mut(id).running = Some(running);
    }

    /// Polls `check` every 50 ms until it holds, panicking with `what` after `timeout`.
    pub async fn wait_until(&self, what: &str, timeout: Duration, check: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + timeout;
        while !check(self) {
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `check` holds for the image of every running node.
    pub async fn wait_for_images(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&MetadataImage) -> bool,
    ) {
        self.wait_until(what, timeout, |c| {
            c.running_ids().iter().all(|&id| check(&c.image(id)))
        })
        .await
    }

    /// Stops every running node.
    pub async fn shutdown(mut self) {
        for id in self.running_ids() {
            self.stop(id).await;
        }
    }
}

/// `broker::start`, retried for a few seconds while a port is in use: the
/// fixed test ports lie inside Linux's ephemeral range, so an outgoing
/// connection (any process's) can briefly hold one.
async fn start_retrying_bind(
    config: broker::config::ServerConfig,
) -> Result<broker::RunningBroker, broker::StartError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match broker::start(config.clone()).await {
            Err(broker::StartError::Listen(addr, e))
                if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline =>
            {
                eprintln!("{addr} in use; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

/// The loopback address node `id` listens on.
pub fn host(id: i32) -> String {
    format!("127.0.0.{}", id + 1)
}
