//! The ISR manager: the leader's half of Kafka's ISR protocol. Every
//! `replica.lag.time.max.ms / 2` (Kafka's own `isr-expiration` period) it
//! drops followers that have not been caught up for `replica.lag.time.max.ms`,
//! so a stuck follower leaves the ISR between 1x and 1.5x the lag after its
//! last caught-up fetch; and whenever a fetch makes a follower eligible (the
//! fetch handler wakes it through `ReplicaManager::isr_check`) it proposes
//! adding it, as Kafka does on the fetch path. Changes go to the controller as
//! `AlterPartition` with this leader's leader and partition epochs; until the
//! image (or the proposal's answer) settles one, the partition does not
//! propose another. A refusal that says our epochs are stale
//! (FENCED_LEADER_EPOCH, INVALID_UPDATE_VERSION) waits for the next image,
//! which carries the newer state: no retry loop.
//!
//! It also publishes the replication gauges on the same period.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::broker::{now_ms, Broker};
use crate::metadata::{MetadataCommand, MetadataError, MetadataOutcome};
use crate::partition::leader_state::AssignedState;
use crate::partition::Role;

/// How often the ISR is checked for followers to drop, for a given lag.
pub fn check_interval(replica_lag_time_max_ms: i64) -> Duration {
    Duration::from_millis((replica_lag_time_max_ms / 2).max(1) as u64)
}

/// Runs until `shutdown` turns true.
pub async fn run(broker: Arc<Broker>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(check_interval(broker.config.replica_lag_time_max_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let publish = tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => true,
            _ = broker.replicas.isr_check.notified() => false,
        };
        check_all(&broker).await;
        if publish {
            publish_metrics(&broker);
        }
    }
}

/// Proposes the ISR changes every led partition needs now.
pub async fn check_all(broker: &Broker) {
    let now = now_ms();
    let mut proposals = Vec::new();
    for (tp, part) in broker.replicas.all() {
        let mut p = part.lock().expect("poisoned");
        if let Some(proposal) = p.prepare_isr_change(now) {
            proposals.push((tp, part.clone(), p.topic_id, proposal));
        }
    }
    for (tp, part, topic_id, proposal) in proposals {
        let kind = if proposal.expand { "expand" } else { "shrink" };
        tracing::info!(%tp, kind, isr = ?proposal.isr, leader_epoch = proposal.leader_epoch.0, partition_epoch = proposal.partition_epoch, "proposing ISR change");
        let cmd = MetadataCommand::AlterPartition {
            topic_id,
            partition: tp.partition,
            leader: proposal.leader,
            leader_epoch: proposal.leader_epoch,
            partition_epoch: proposal.partition_epoch,
            isr: proposal.isr.clone(),
        };
        match broker.metadata.propose(cmd).await {
            Ok(MetadataOutcome::Partition(state)) => {
                let counter = if proposal.expand {
                    "kafka_replica_isr_expands_total"
                } else {
                    "kafka_replica_isr_shrinks_total"
                };
                metrics::counter!(counter).increment(1);
                let moved = part.lock().expect("poisoned").apply_isr_update(
                    AssignedState {
                        leader_epoch: state.leader_epoch,
                        partition_epoch: state.partition_epoch,
                        replicas: state.replicas,
                        isr: state.isr,
                    },
                    now_ms(),
                );
                if moved {
                    broker.replicas.appended.notify_waiters();
                }
            }
            Ok(other) => {
                tracing::error!(%tp, ?other, "AlterPartition answered with an unexpected outcome");
                part.lock().expect("poisoned").abandon_isr_change();
            }
            Err(e) => {
                metrics::counter!("kafka_replica_isr_update_failures_total").increment(1);
                match e {
                    // Our view is stale: the image that proves it is on its
                    // way and settles the pending change when it lands.
                    MetadataError::FencedLeaderEpoch { .. }
                    | MetadataError::InvalidUpdateVersion(_)
                    | MetadataError::UnknownTopicOrPartition(..)
                    | MetadataError::InvalidRequest(_) => {
                        tracing::info!(%tp, error = %e, "ISR change refused; waiting for the next metadata image");
                    }
                    // Nothing was applied and our epochs are current (or the
                    // quorum was unavailable): the next check may try again.
                    other => {
                        tracing::warn!(%tp, error = %other, "ISR change failed; will retry at the next check");
                        part.lock().expect("poisoned").abandon_isr_change();
                    }
                }
            }
        }
    }
}

/// The replication gauges (see docs/operations.md).
pub fn publish_metrics(broker: &Broker) {
    let mut leaders = 0u64;
    let mut under_replicated = 0u64;
    let mut under_min_isr = 0u64;
    for (tp, part) in broker.replicas.all() {
        let p = part.lock().expect("poisoned");
        let labels = [
            ("topic", tp.topic.to_string()),
            ("partition", tp.partition.to_string()),
        ];
        let Role::Leader(l) = p.role() else {
            metrics::gauge!("kafka_partition_in_sync_replicas", &labels).set(0.0);
            continue;
        };
        leaders += 1;
        metrics::gauge!("kafka_partition_in_sync_replicas", &labels).set(l.isr.len() as f64);
        if l.isr.len() < l.replicas.len() {
            under_replicated += 1;
        }
        if l.is_under_min_isr(p.configs().min_insync_replicas()) {
            under_min_isr += 1;
        }
        for (follower, lag) in l.lag(p.log_end_offset(), p.log_start_offset()) {
            metrics::gauge!(
                "kafka_replica_follower_lag_messages",
                "topic" => tp.topic.to_string(),
                "partition" => tp.partition.to_string(),
                "follower" => follower.0.to_string()
            )
            .set(lag as f64);
        }
    }
    metrics::gauge!("kafka_replica_leader_count").set(leaders as f64);
    metrics::gauge!("kafka_replica_under_replicated_partitions").set(under_replicated as f64);
    metrics::gauge!("kafka_replica_under_min_isr_partitions").set(under_min_isr as f64);
}
