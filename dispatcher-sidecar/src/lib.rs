//! The dispatcher sidecar (issue 7): turns a Kafka topic into a work queue.
//!
//! `config` reads `dispatcher.toml`; `kafka` is the client layer (topic
//! setup, a consumer per topic, the producer, the dedupe topic); `lease` is
//! the per-partition lease engine; `queue` drives the engines from Kafka and
//! implements the [`service::QueueService`] the `api` serves over HTTP and
//! gRPC; `forward` sends what this instance does not own to the owner;
//! `push` delivers the queues that have a push subscription to their
//! endpoints; `trace` answers where a message is and has been.
//! endpoints; `redrive` copies dead letters back to their queue as a
//! rate-limited job.
//! [`run`] puts them together.

pub mod api;
pub mod config;
pub mod forward;
#[doc(hidden)]
pub mod fuzzing;
pub mod kafka;
pub mod lease;
pub mod push;
pub mod queue;
pub mod redrive;
pub mod security;
pub mod service;
pub mod trace;

use std::sync::Arc;

use anyhow::Context as _;

use config::{Config, SecretOrigin};

/// Starts the queues (topic setup, group membership, rebuild of owned
/// partitions) and serves the APIs until SIGINT or SIGTERM; then stops
/// serving, commits the final offsets and leaves the groups, so the other
/// instances take the partitions over at once rather than after a session
/// timeout.
pub async fn run(mut config: Config) -> anyhow::Result<()> {
    let mut shutdown = Shutdown::register()?;
    if config.receipt_secret.origin == SecretOrigin::Generated {
        tracing::warn!(
            "no receipt_secret or receipt_secret_file configured: generated a random one; \
             receipts will not survive a restart and other instances will reject them"
        );
    }
    // Read before anything starts, so a bad PEM file or JWKS stops the
    // dispatcher at once.
    let tls = security::ListenerTls::from_config(&config).context("loading [tls]")?;
    let access = match &config.auth {
        Some(auth) => Some(Arc::new(
            security::auth::Access::new(auth).context("loading [auth]")?,
        )),
        None => None,
    };
    if config.auth.is_none() {
        tracing::warn!("no [auth] configured: any caller may use every queue");
    }
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .context("installing the metrics recorder")?;
    // Bound first: its address goes into the consumers' client ids, which
    // is how the other instances find where to forward.
    let internal_listener = tokio::net::TcpListener::bind(config.internal_listen)
        .await
        .with_context(|| {
            format!(
                "binding the internal listener (internal_listen) on {}",
                config.internal_listen
            )
        })?;
    let advertised = advertised_internal(&config, internal_listener.local_addr()?);
    config.advertised_internal = advertised.clone();

    let dispatcher = tokio::select! {
        started = queue::Dispatcher::start(&config) => started?,
        _ = shutdown.wait() => {
            tracing::info!("stopping during start");
            return Ok(());
        }
    };
    let pusher = match push::Pusher::start(dispatcher.clone(), &config.queues) {
        Ok(p) => p,
        Err(e) => {
            dispatcher.shutdown().await;
            return Err(e.context("starting the push subscriptions"));
        }
    };
    let forwarding = Arc::new(forward::Forwarding::new(
        dispatcher.clone(),
        &config,
        advertised.unwrap_or_default(),
    )?);
    // Every queue's group is looked at now and then, so an instance that
    // signs with another receipt secret is reported even while no request
    // is forwarded to it.
    let watcher = {
        let forwarding = forwarding.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(GROUP_CHECK_INTERVAL);
            loop {
                tick.tick().await;
                forwarding.check_groups().await;
            }
        })
    };
    // The public API forwards; `/internal`, on its own listener, answers
    // from this instance only (what a forwarding peer calls, so a request
    // is forwarded at most once). Clients of the public listener cannot
    // reach it.
    let router = api::http_router_with_access(forwarding.clone(), Some(metrics), access.clone());
    let mut internal = axum::Router::new().nest(
        forward::INTERNAL_PREFIX,
        api::http_router(dispatcher.clone(), None),
    );
    // Callers of the internal listener act for the instance that forwarded
    // them (which checked its caller): they show the internal credential.
    if let Some(auth) = security::InternalAuth::new(&config.internal) {
        internal = auth.layer(internal);
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let servers = api::serve_bound_parts(
        router,
        api::grpc_service_with_access(forwarding, access),
        config.http_listen,
        config.grpc_listen,
        Some((internal_listener, internal)),
        tls,
        async {
            let _ = stop_rx.await;
        },
    )
    .await;
    let servers = match servers {
        Ok(s) => s,
        Err(e) => {
            watcher.abort();
            pusher.stop().await;
            dispatcher.shutdown().await;
            return Err(e);
        }
    };
    tracing::info!(http = %servers.http, grpc = %servers.grpc, internal = ?servers.internal,
        "dispatcher ready");
    shutdown.wait().await;
    tracing::info!("stopping: finishing requests, committing offsets, leaving the groups");
    watcher.abort();
    let _ = stop_tx.send(());
    let served = servers.wait().await;
    // Pushes in flight are acked or nacked before the queues stop.
    let stopped = tokio::time::timeout(STOP_GRACE, async {
        pusher.stop().await;
        dispatcher.shutdown().await;
    })
    .await;
    if stopped.is_err() {
        // Kafka did not answer (its final commits or the group leave): dropping
        // the clients now would wait for it again, so they are left to the
        // process exit. Nothing acked is lost: the commit point is in the ack
        // log, and the leases in flight come back as after a crash.
        std::mem::forget(dispatcher);
        anyhow::bail!(
            "stopping took longer than {STOP_GRACE:?} (is Kafka reachable?): exiting \
             without the final offset commits and group leave"
        );
    }
    served
}

/// How often every queue's group is described to find instances that sign
/// with another receipt secret.
const GROUP_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(15);

/// How long the final offset commits, the group leave and the producer's
/// flush may take once the dispatcher is told to stop.
pub const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// The address peers forward to (this instance's internal listener):
/// `advertised_internal`; else the bound internal address when it names one
/// host; else, listening on every interface, `advertised_http`'s host with
/// the bound port. Otherwise `None`: this instance is not forwarded to (its
/// partitions' receipts must come to it directly).
fn advertised_internal(config: &Config, bound: std::net::SocketAddr) -> Option<String> {
    if let Some(a) = &config.advertised_internal {
        return Some(a.clone());
    }
    if !bound.ip().is_unspecified() {
        return Some(bound.to_string());
    }
    if let Some((host, _)) = config
        .advertised_http
        .as_deref()
        .and_then(|a| a.rsplit_once(':'))
    {
        return Some(format!("{host}:{}", bound.port()));
    }
    tracing::warn!(
        internal_listen = %config.internal_listen,
        "internal_listen names no single address: set advertised_internal (or \
         advertised_http) so other instances can forward acks for this instance's \
         partitions to it"
    );
    None
}

/// SIGINT and SIGTERM, registered when made: a signal that arrives while the
/// dispatcher is still setting up is not lost (and does not kill it the
/// default way, uncleanly).
struct Shutdown {
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
}

impl Shutdown {
    fn register() -> anyhow::Result<Shutdown> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Shutdown {
                int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
                term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Shutdown {})
    }

    async fn wait(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
