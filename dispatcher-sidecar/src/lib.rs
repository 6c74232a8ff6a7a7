//! The dispatcher sidecar (issue 7): turns a Kafka topic into a work queue.
//!
//! `config` reads `dispatcher.toml`; `kafka` is the client layer (topic
//! setup, a consumer per queue, the producer); `lease` is the per-partition
//! lease engine. `run` starts what exists.

pub mod api;
pub mod config;
pub mod forward;
pub mod kafka;
pub mod lease;
pub mod queue;
pub mod service;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;

use config::{Config, SecretOrigin};
use kafka::consumer::{Assignment, QueueConsumer};

/// How long one admin or metadata request may take at start.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a rebalance waits for the caller to release revoked partitions.
const REVOKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Sets up every queue's topics, then consumes each queue in its group until
/// SIGINT or SIGTERM. The lease engine and the APIs are not wired in yet:
/// assignments are logged and no message is fetched or committed.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let mut shutdown = Shutdown::register()?;
    tracing::warn!(
        "this build does not deliver messages yet: it sets up each queue's topics and joins its \
         group, but serves no HTTP or gRPC API and leases nothing (issue 7)"
    );
    if config.receipt_secret.origin == SecretOrigin::Generated {
        tracing::warn!(
            "no receipt_secret or receipt_secret_file configured: generated a random one; \
             receipts will not survive a restart and other instances will reject them"
        );
    }
    let admin: Arc<AdminClient<DefaultClientContext>> = Arc::new(
        kafka::admin_config(&config)
            .create()
            .context("creating the admin client")?,
    );
    for queue in &config.queues {
        let report = tokio::select! {
            report = kafka::topics::ensure_topics(&admin, queue, SETUP_TIMEOUT) => report?,
            _ = shutdown.wait() => {
                tracing::info!("stopping during topic setup");
                return Ok(());
            }
        };
        tracing::info!(
            queue = %queue.name,
            created = ?report.created,
            existing = ?report.existing,
            "topics ready"
        );
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    for queue in &config.queues {
        let client_config = kafka::consumer_config(&config, queue);
        let topic = queue.topic.clone();
        let (consumer, mut events) = tokio::task::spawn_blocking(move || {
            QueueConsumer::start(&client_config, &topic, REVOKE_TIMEOUT, SETUP_TIMEOUT)
        })
        .await
        .expect("consumer start does not panic")
        .with_context(|| format!("queue {:?}: starting the consumer", queue.name))?;
        let name = queue.name.clone();
        let mut stop = stop_rx.clone();
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.changed() => break,
                    event = events.recv() => match event {
                        Some(Assignment::Assigned(partitions)) => {
                            tracing::info!(queue = %name, ?partitions, "partitions assigned")
                        }
                        Some(Assignment::Revoked { partitions, .. }) => {
                            tracing::info!(queue = %name, ?partitions, "partitions revoked")
                        }
                        None => break,
                    },
                }
            }
            consumer.close().await;
        });
    }
    shutdown.wait().await;
    tracing::info!("stopping: leaving the consumer groups");
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    Ok(())
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
