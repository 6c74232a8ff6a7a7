//! The broker: a Kafka-wire-compatible server. See ARCHITECTURE.md for the map.

pub mod authz;
pub mod broker;
pub mod config;
pub mod coordinator;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod group;
pub mod handlers;
pub mod log;
pub mod metadata;
pub mod net;
pub mod partition;
pub mod quota;
pub mod replica_manager;
pub mod replication;
pub mod security;
pub mod server;
pub mod share;
pub mod slow_io;
#[cfg(test)]
mod test_alloc;
pub mod txn;
pub mod types;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::broker::{now_ms, Broker};
use crate::config::{Listener, ServerConfig};
use crate::metadata::{
    BrokerRegistration, Endpoint, MetadataCommand, MetadataController, QuorumConfig,
};

/// How often share-partition acquisition locks are checked for expiry: a
/// lock ends at most this long after its deadline.
const SHARE_LOCK_CHECK: Duration = Duration::from_millis(100);

/// A started broker: its bound addresses and a way to stop it.
pub struct RunningBroker {
    pub broker: Arc<Broker>,
    /// The inter-broker listener's bound address (the PLAINTEXT listener
    /// of a default config).
    pub local_addr: std::net::SocketAddr,
    /// Every client listener's name and bound address.
    pub listener_addrs: Vec<(String, std::net::SocketAddr)>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    liveness_stop: Arc<watch::Sender<bool>>,
    liveness_tasks: Vec<tokio::task::JoinHandle<()>>,
    /// `Some(reason)` once the broker cannot go on (its log directory
    /// failed); `main` exits non-zero on it.
    fatal: watch::Receiver<Option<String>>,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot create data directory {0}: {1}")]
    DataDir(String, std::io::Error),
    #[error("metadata quorum: {0}")]
    Metadata(#[from] metadata::MetadataError),
    #[error("opening partitions: {0}")]
    Partitions(#[from] error::PartitionError),
    #[error("loading consumer groups: {0}")]
    Groups(#[from] coordinator::StorageError),
    #[error("cannot listen on {0}: {1}")]
    Listen(String, std::io::Error),
    #[error("listener {0}: {1}")]
    Security(String, String),
}

/// Opens storage, joins (or forms) the metadata quorum, and starts serving.
pub async fn start(config: ServerConfig) -> Result<RunningBroker, StartError> {
    let data_dir = config.data_dir().clone();
    std::fs::create_dir_all(&data_dir)
        .map_err(|e| StartError::DataDir(data_dir.display().to_string(), e))?;
    // Every client listener is bound, and its TLS and SASL set-up built,
    // before anything else starts, so a port in use or a keystore that does
    // not load stops the broker at once.
    let mut contexts: Vec<server::ListenerContext> = Vec::new();
    let mut bound: Vec<(Listener, TcpListener)> = Vec::new();
    for l in config.client_listeners() {
        let addr = l.socket_addr().map_err(|e| {
            StartError::Listen(format!("{}:{}", l.host, l.port), std::io::Error::other(e))
        })?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| StartError::Listen(addr.to_string(), e))?;
        contexts.push(server::ListenerContext::build(&config, l)?);
        bound.push((l.clone(), listener));
    }
    let bound_addr = |name: &str| -> Option<std::net::SocketAddr> {
        bound
            .iter()
            .find(|(l, _)| l.name.eq_ignore_ascii_case(name))
            .and_then(|(_, t)| t.local_addr().ok())
    };
    let inter_broker = config.inter_broker_listener_name();
    let local_addr = bound_addr(&inter_broker)
        .or_else(|| bound.first().and_then(|(_, t)| t.local_addr().ok()))
        .ok_or_else(|| {
            StartError::Listen(
                "listeners".into(),
                std::io::Error::other("no client listener"),
            )
        })?;
    let listener_addrs: Vec<(String, std::net::SocketAddr)> = bound
        .iter()
        .filter_map(|(l, t)| Some((l.name.clone(), t.local_addr().ok()?)))
        .collect();

    // With voters, peers reach this node's quorum member on the controller
    // listener (validate() made sure it exists and matches our voter entry).
    let controller_listener = match config.controller_listener() {
        Some(l) if !config.controller_quorum_voters.is_empty() => {
            let addr = l.socket_addr().map_err(|e| {
                StartError::Listen(format!("{}:{}", l.host, l.port), std::io::Error::other(e))
            })?;
            Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|e| StartError::Listen(addr.to_string(), e))?,
            )
        }
        _ => None,
    };
    // How this node dials its peers (and how its controller listener admits
    // them), built before the quorum opens so that a keystore or login that
    // does not load stops the broker before it registers.
    let security_error = |listener: String| move |e: String| StartError::Security(listener, e);
    let inter_broker_security = Arc::new(
        security::peer::PeerSecurity::inter_broker(&config)
            .map_err(security_error(inter_broker.clone()))?,
    );
    let controller_name = config
        .controller_listener()
        .map_or_else(String::new, |l| l.name.clone());
    let peer_security = Arc::new(
        security::peer::PeerSecurity::controller(&config)
            .map_err(security_error(controller_name.clone()))?,
    );
    let peer_auth = Arc::new(
        security::peer::PeerServerAuth::controller(&config)
            .map_err(security_error(controller_name))?,
    );
    let quorum = QuorumConfig {
        node_id: config.node_id,
        voters: config
            .controller_quorum_voters
            .iter()
            .map(|v| (v.node_id, format!("{}:{}", v.host, v.port)))
            .collect(),
        controller_listener,
        local_addr: local_addr.to_string(),
        election_timeout_ms: config.controller_quorum_election_timeout_ms,
        request_timeout_ms: config.controller_quorum_request_timeout_ms,
        startup_timeout_ms: config.controller_quorum_startup_timeout_ms,
        session_timeout_ms: config.broker_session_timeout_ms,
        idle_timeout_ms: config.connections_max_idle_ms,
        max_connections_per_voter: config.controller_max_connections_per_voter,
        peer_security,
        peer_auth,
        bootstrap_scram: config
            .bootstrap_scram
            .iter()
            .map(|b| (b.user.clone(), b.mechanism, b.credential.clone()))
            .collect(),
    };
    let metadata = MetadataController::open(&data_dir.join("__cluster_metadata"), quorum).await?;
    let mut config = config;
    // An advertised port 0 (tests bind to port 0) means "the port we got".
    for l in &mut config.advertised_listeners {
        if l.port == 0 {
            if let Some((_, addr)) = listener_addrs
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(&l.name))
            {
                l.port = addr.port();
            }
        }
    }
    let advertised = config.advertised_inter_broker_listener().clone();
    let registration = BrokerRegistration {
        node_id: config.node_id,
        host: advertised.host.clone(),
        port: advertised.port,
        listeners: config
            .advertised_listeners
            .iter()
            .map(|l| Endpoint {
                name: l.name.clone(),
                host: l.host.clone(),
                port: l.port,
            })
            .collect(),
        rack: config.broker_rack.clone(),
        fenced: false,
        features: crate::metadata::supported_features(),
    };
    let registered = metadata.image().brokers.get(&config.node_id).cloned();
    if registered.as_ref() != Some(&registration) {
        metadata
            .propose(MetadataCommand::RegisterBroker(registration.clone()))
            .await?;
    }
    let retention_check_ms = config.log_retention_check_interval_ms;
    let broker = Arc::new(Broker::new(config, metadata, inter_broker_security));
    broker.sync_replicas().await?;
    broker.txn.attach(&broker);
    broker.share_state.attach(&broker);
    let loaded = broker.groups.sync_ownership(&broker).await?;
    let loaded_txns = broker.txn.sync_ownership(&broker).await?;
    broker.share_state.sync_ownership(&broker).await?;
    if loaded_txns > 0 {
        tracing::info!(transactional_ids = loaded_txns, "loaded transaction state");
    }
    if loaded > 0 {
        tracing::info!(records = loaded, "loaded consumer groups and offsets");
    }

    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    let shared = server::Shared::new(&broker.config);
    for ((l, listener), context) in bound.into_iter().zip(contexts) {
        let broker = broker.clone();
        let shared = shared.clone();
        let rx = shutdown_rx.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = server::serve(broker, listener, context, shared, rx).await {
                tracing::error!(listener = %l.name, error = %e, "listener failed");
            }
        }));
    }
    {
        // The ISR manager (leader side of replication).
        let broker = broker.clone();
        let rx = shutdown_rx.clone();
        tasks.push(tokio::spawn(replication::leader::run(broker, rx)));
    }
    {
        // Follow metadata changes made elsewhere (issue 6: other brokers).
        let broker = broker.clone();
        let mut images = broker.metadata.subscribe();
        let mut rx = shutdown_rx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = rx.changed() => return,
                    changed = images.changed() => {
                        if changed.is_err() { return; }
                        if let Err(e) = broker.sync_replicas().await {
                            tracing::error!(error = %e, "applying metadata to partitions failed");
                        }
                    }
                }
            }
        }));
    }
    {
        // The group coordinator follows leadership of its partitions once
        // they are open, on its own: loading one waits for that partition
        // (its lock, its reads), which must not hold up the next image for
        // the other partitions.
        let broker = broker.clone();
        let mut images = broker.replicas.subscribe_applied();
        let mut rx = shutdown_rx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = rx.changed() => return,
                    changed = images.changed() => {
                        if changed.is_err() { return; }
                        if let Err(e) = broker.groups.sync_ownership(&broker).await {
                            tracing::error!(error = %e, "following {} leadership failed", coordinator::OFFSETS_TOPIC);
                        }
                        if let Err(e) = broker.txn.sync_ownership(&broker).await {
                            tracing::error!(error = %e, "following {} leadership failed", txn::service::TXN_TOPIC);
                        }
                        if let Err(e) = broker.share_state.sync_ownership(&broker).await {
                            tracing::error!(error = %e, "following {} leadership failed", share::coordinator::SHARE_STATE_TOPIC);
                        }
                    }
                }
            }
        }));
    }
    // Broker lifecycle in a cluster: heartbeats to the active controller and,
    // on whichever node leads, the controller's fencing and elections. Kept
    // apart from `shutdown` so a controlled shutdown can stop them first.
    let (liveness_stop, liveness_rx) = watch::channel(false);
    let mut liveness_tasks = Vec::new();
    if broker.metadata.is_clustered() {
        let interval = Duration::from_millis(broker.config.broker_heartbeat_interval_ms as u64);
        {
            let broker = broker.clone();
            let rx = liveness_rx.clone();
            liveness_tasks.push(tokio::spawn(async move {
                metadata::liveness::run_heartbeats(&broker.metadata, registration, interval, rx)
                    .await;
            }));
        }
        {
            let broker = broker.clone();
            let rx = liveness_rx.clone();
            // Checked twice per heartbeat interval, so a silent broker is
            // fenced within half an interval of its session timeout.
            let check = (interval / 2).max(Duration::from_millis(10));
            let unclean_default = broker.config.unclean_leader_election_enable;
            let rebalance = broker.config.auto_leader_rebalance_enable.then(|| {
                Duration::from_millis(broker.config.leader_imbalance_check_interval_ms as u64)
            });
            liveness_tasks.push(tokio::spawn(async move {
                metadata::liveness::run_controller(
                    &broker.metadata,
                    unclean_default,
                    rebalance,
                    check,
                    rx,
                )
                .await;
            }));
        }
    } else {
        // A single node is always the active controller.
        metrics::gauge!("kafka_controller_active").set(1.0);
    }
    let liveness_stop = Arc::new(liveness_stop);
    let (fatal_tx, fatal) = watch::channel(None);
    {
        // Kafka's handling of its last log directory failing: partitions
        // there already answer KAFKA_STORAGE_ERROR; leadership moves (this
        // broker fences itself, as a controlled shutdown does) and the
        // process stops.
        let broker = broker.clone();
        let mut failure = broker.replicas.log_dir_failure().subscribe();
        let liveness_stop = liveness_stop.clone();
        let mut rx = shutdown_rx.clone();
        tasks.push(tokio::spawn(async move {
            let reason = tokio::select! {
                _ = rx.changed() => return,
                failed = failure.wait_for(Option::is_some) => match failed {
                    Ok(reason) => reason.clone().unwrap_or_default(),
                    Err(_) => return,
                },
            };
            tracing::error!(
                %reason,
                "the log directory failed: moving leaderships away, then stopping"
            );
            if broker.metadata.is_clustered() {
                // No heartbeat may register this broker again meanwhile.
                let _ = liveness_stop.send(true);
                fence_self(&broker).await;
            }
            fatal_tx.send_replace(Some(reason));
        }));
    }
    {
        let broker = broker.clone();
        let mut rx = shutdown_rx.clone();
        tasks.push(tokio::spawn(async move {
            let mut tick =
                tokio::time::interval(Duration::from_millis(retention_check_ms.max(1) as u64));
            // A pass that outlasts the interval is followed by one more, not
            // by a burst of the ticks it missed.
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = rx.changed() => return,
                    _ = tick.tick() => {
                        let b = broker.clone();
                        let _ = tokio::task::spawn_blocking(move || {
                            b.replicas.maintain_all(now_ms());
                            publish_partition_metrics(&b);
                        }).await;
                    }
                }
            }
        }));
    }
    // The share groups' dead-letter queue writer.
    tasks.push(tokio::spawn(crate::share::dlq::ShareDlq::run(
        broker.clone(),
        shutdown_rx.clone(),
    )));
    {
        // Share-partition acquisition locks: expired ones are written back
        // as available (or archived at the delivery limit), and
        // share-partitions whose partition moved are dropped; the share
        // coordinator's cold-partition snapshots on their own interval.
        let broker = broker.clone();
        let mut rx = shutdown_rx.clone();
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(SHARE_LOCK_CHECK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let cold_every = broker.config.share.cold_snapshot_interval_ms;
            let mut next_cold =
                tokio::time::Instant::now() + Duration::from_millis(cold_every.max(1) as u64);
            loop {
                tokio::select! {
                    _ = rx.changed() => return,
                    _ = tick.tick() => {
                        broker.share_leaders.expire_sessions(&broker).await;
                        let in_use = broker.share_sessions.lock().expect("poisoned").in_use();
                        broker.share_leaders.unload(&broker, &in_use);
                        broker.share_leaders.expire_locks(&broker).await;
                        if tokio::time::Instant::now() >= next_cold {
                            broker.share_state.snapshot_cold(cold_every).await;
                            next_cold = tokio::time::Instant::now()
                                + Duration::from_millis(cold_every.max(1) as u64);
                        }
                    }
                }
            }
        }));
    }
    Ok(RunningBroker {
        broker,
        local_addr,
        listener_addrs,
        shutdown,
        tasks,
        liveness_stop,
        liveness_tasks,
        fatal,
    })
}

/// Fences this broker through the quorum, so its leaderships move to
/// in-sync followers at once, bounded by `broker.session.timeout.ms` (after
/// which the controller would fence a silent broker anyway).
async fn fence_self(broker: &Broker) {
    let node_id = broker.node_id();
    let bound = Duration::from_millis(broker.config.broker_session_timeout_ms.max(1) as u64);
    let fence = broker
        .metadata
        .propose(MetadataCommand::FenceBroker { node_id });
    match tokio::time::timeout(bound, fence).await {
        Ok(Ok(_)) => tracing::info!("fenced; leaderships moved"),
        Ok(Err(e)) => tracing::warn!(error = %e, "fencing failed; stopping anyway"),
        Err(_) => {
            tracing::warn!("no quorum answered within broker.session.timeout.ms; stopping anyway")
        }
    }
}

fn publish_partition_metrics(broker: &Broker) {
    for (tp, part) in broker.replicas.all() {
        let p = part.lock().expect("poisoned");
        let labels = [
            ("topic", tp.topic.to_string()),
            ("partition", tp.partition.to_string()),
        ];
        metrics::gauge!("kafka_log_end_offset", &labels).set(p.log_end_offset().0 as f64);
        metrics::gauge!("kafka_log_start_offset", &labels).set(p.log_start_offset().0 as f64);
        metrics::gauge!("kafka_log_size_bytes", &labels).set(p.size_bytes() as f64);
    }
}

impl RunningBroker {
    /// Turns `Some(reason)` when the broker cannot go on: its log directory
    /// failed (after its leaderships were moved away). `main` then exits
    /// non-zero; in-process tests stop it themselves.
    pub fn fatal(&self) -> watch::Receiver<Option<String>> {
        self.fatal.clone()
    }

    /// Stops accepting, closes connections, closes every partition cleanly.
    ///
    /// In a cluster with `controlled.shutdown.enable`, it first fences itself
    /// through the quorum (bounded by `broker.session.timeout.ms`), so its
    /// leaderships move to in-sync followers while it still serves, as
    /// Kafka's controlled shutdown does; then it stops.
    pub async fn shutdown(mut self) {
        let _ = self.liveness_stop.send(true);
        for t in std::mem::take(&mut self.liveness_tasks) {
            let _ = t.await;
        }
        if self.broker.metadata.is_clustered() && self.broker.config.controlled_shutdown_enable {
            tracing::info!("controlled shutdown");
            fence_self(&self.broker).await;
        }
        let _ = self.shutdown.send(true);
        // Parked JoinGroup/SyncGroup requests would hold their connections
        // open; answer them so connections can close.
        self.broker.groups.stop().await;
        self.broker.txn.stop().await;
        self.broker.share_state.stop();
        for t in self.tasks {
            let _ = t.await;
        }
        let broker = self.broker;
        // Connections drop their Arc as they notice the shutdown.
        for _ in 0..50 {
            if Arc::strong_count(&broker) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Fetch sessions hold partitions and would keep replicating.
        broker.fetchers.shutdown().await;
        broker.replicas.shutdown();
        match Arc::try_unwrap(broker) {
            Ok(b) => {
                if let Err(e) = b.metadata.shutdown().await {
                    tracing::error!(error = %e, "metadata shutdown failed");
                }
            }
            Err(_) => tracing::warn!("broker still referenced at shutdown"),
        }
    }
}
