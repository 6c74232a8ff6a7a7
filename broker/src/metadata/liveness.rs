//! Broker liveness, as KRaft does it: every broker sends a heartbeat to the
//! active controller (the Raft leader) every `broker.heartbeat.interval.ms`;
//! the active controller fences a broker it has not heard from for
//! `broker.session.timeout.ms`, and a fenced broker whose heartbeats come back
//! is told so and registers again, which unfences it.
//!
//! Heartbeat times live only in the active controller's memory, as in Kafka's
//! `BrokerHeartbeatManager`: a newly elected controller starts every broker's
//! clock at its election, so a broker is never fenced for silence that a
//! previous controller saw. One exception, because every node is both broker
//! and controller here: the previous Raft leader's clock starts at the last
//! Raft message this node had from it. That silence this node saw itself, and
//! it is why there is an election at all; without it a leader that dies with
//! its controller role waits an election plus a whole session before its
//! partitions move. The [`LivenessTracker`] here is that clock, pure
//! and driven by `now_ms`; the loops that use it are in
//! [`MetadataController`](super::MetadataController) and `lib.rs`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::sync::watch;

use super::image::{
    elected_leader, preferred_leader, BrokerRegistration, MetadataCommand, MetadataImage,
    MetadataOutcome, FEATURE_ELECT_PREFERRED,
};
use super::MetadataController;
use crate::broker::now_ms;
use crate::types::NodeId;

/// The topic config (and broker default) that allows electing an out-of-sync replica.
const UNCLEAN_KEY: &str = "unclean.leader.election.enable";

/// The active controller's record of when it last heard from each broker.
#[derive(Debug)]
pub struct LivenessTracker {
    session_timeout_ms: i64,
    /// The Raft term in which this node is the active controller, and when it
    /// found out; `None` while it is not.
    active: Option<(u64, i64)>,
    last_heartbeat: HashMap<NodeId, i64>,
    /// The brokers unfenced in the image `expired` last saw: one that
    /// (re)registered since counts as heard from, as a registration does in
    /// Kafka's `BrokerHeartbeatManager`. None right after winning a term.
    live: Option<HashSet<NodeId>>,
    /// When this node last had a Raft message from each leader, kept in
    /// every role: it seeds that node's clock when this one takes over.
    raft_contact: HashMap<NodeId, i64>,
}

impl LivenessTracker {
    pub fn new(session_timeout_ms: i64) -> Self {
        Self {
            session_timeout_ms,
            active: None,
            last_heartbeat: HashMap::new(),
            live: None,
            raft_contact: HashMap::new(),
        }
    }

    /// Records a Raft message (AppendEntries) from `leader`.
    pub fn raft_contact(&mut self, leader: NodeId, now_ms: i64) {
        let last = self.raft_contact.entry(leader).or_insert(now_ms);
        *last = (*last).max(now_ms);
    }

    /// Tells the tracker whether this node leads the quorum, and in which
    /// term. Winning a new term forgets every heartbeat: each broker's clock
    /// starts at `now_ms`, except a former leader's, which starts at its last
    /// Raft message here.
    pub fn set_role(&mut self, leader_term: Option<u64>, now_ms: i64) {
        match (leader_term, self.active) {
            (Some(term), Some((active_term, _))) if term == active_term => {}
            (Some(term), _) => {
                self.active = Some((term, now_ms));
                self.last_heartbeat = self
                    .raft_contact
                    .iter()
                    .map(|(&node, &at)| (node, at.min(now_ms)))
                    .collect();
                self.live = None;
            }
            (None, _) => {
                self.active = None;
                self.last_heartbeat.clear();
                self.live = None;
            }
        }
    }

    pub fn is_active(&self) -> bool {
        self.active.is_some()
    }

    /// Records a heartbeat. Ignored unless this node is the active controller.
    pub fn heartbeat(&mut self, node: NodeId, now_ms: i64) {
        if self.active.is_some() {
            let last = self.last_heartbeat.entry(node).or_insert(now_ms);
            *last = (*last).max(now_ms);
        }
    }

    /// The registered, unfenced brokers silent for longer than the session
    /// timeout, counting from the latest of their last heartbeat, their
    /// (re)registration as this tracker saw it, and this controller's election.
    pub fn expired(&mut self, image: &MetadataImage, now_ms: i64) -> Vec<NodeId> {
        let Some((_, since)) = self.active else {
            return Vec::new();
        };
        let live: HashSet<NodeId> = image
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .map(|b| b.node_id)
            .collect();
        // The first look after an election has no earlier set to compare
        // with: the clocks set at the election stand.
        if let Some(before) = &self.live {
            for node in live.difference(before) {
                let last = self.last_heartbeat.entry(*node).or_insert(now_ms);
                *last = (*last).max(now_ms);
            }
        }
        self.live = Some(live);
        image
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .filter(|b| {
                let last = self
                    .last_heartbeat
                    .get(&b.node_id)
                    .copied()
                    .unwrap_or(since);
                now_ms - last > self.session_timeout_ms
            })
            .map(|b| b.node_id)
            .collect()
    }
}

/// The broker side: a heartbeat every `interval` to the active controller.
/// When the controller answers that this broker is fenced (its heartbeats
/// stopped long enough, or a controlled shutdown that did not finish) or not
/// registered, it registers again, which unfences it. Runs until `stop` turns true.
pub async fn run_heartbeats(
    metadata: &MetadataController,
    registration: BrokerRegistration,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        match metadata.heartbeat().await {
            Ok(reply) if reply.fenced || !reply.registered => {
                tracing::info!(
                    fenced = reply.fenced,
                    "the controller does not count this broker as live; registering again"
                );
                if let Err(e) = metadata
                    .propose(MetadataCommand::RegisterBroker(registration.clone()))
                    .await
                {
                    tracing::warn!(error = %e, "registering again failed");
                }
            }
            Ok(_) => {}
            Err(e) => {
                metrics::counter!("kafka_controller_heartbeat_failures_total").increment(1);
                tracing::debug!(error = %e, "broker heartbeat failed");
            }
        }
    }
}

/// The active controller's duties, checked every `interval` on every voter
/// (only the Raft leader acts): fence brokers silent for the session timeout,
/// elect an out-of-sync replica for a leaderless partition whose topic
/// allows unclean election, and every `rebalance` (`auto.leader.rebalance.enable`,
/// `leader.imbalance.check.interval.seconds`) move leaderships back to their
/// preferred replicas. Also publishes the controller gauges.
pub async fn run_controller(
    metadata: &MetadataController,
    unclean_default: bool,
    rebalance: Option<Duration>,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut last_balance = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        let term = metadata.leader_term();
        let active = term.is_some();
        metrics::gauge!("kafka_controller_active").set(if active { 1.0 } else { 0.0 });
        let now = now_ms();
        let expired = {
            let mut tracker = metadata.liveness().lock().expect("poisoned");
            tracker.set_role(term, now);
            tracker.expired(&metadata.image(), now)
        };
        let image = metadata.image();
        let fenced = image.brokers.values().filter(|b| b.fenced).count();
        metrics::gauge!("kafka_controller_registered_brokers").set(image.brokers.len() as f64);
        metrics::gauge!("kafka_controller_fenced_brokers").set(fenced as f64);
        if !active {
            continue;
        }
        metrics::gauge!("kafka_controller_preferred_replica_imbalance_count")
            .set(imbalanced_count(&image) as f64);
        for node in expired {
            tracing::warn!(%node, "broker missed its session timeout; fencing it");
            if let Err(e) = metadata
                .propose(MetadataCommand::FenceBroker { node_id: node })
                .await
            {
                tracing::warn!(%node, error = %e, "fencing failed");
            }
        }
        // The cluster-wide dynamic default wins over server.properties, as
        // Kafka's controller reads it.
        let unclean = image
            .broker_configs
            .get("")
            .and_then(|c| c.get(UNCLEAN_KEY))
            .map_or(unclean_default, |v| v.trim().eq_ignore_ascii_case("true"));
        for (topic_id, partition) in unclean_candidates(&metadata.image(), unclean) {
            let cmd = MetadataCommand::ElectLeader {
                topic_id,
                partition,
                unclean: true,
            };
            let before = metadata.image();
            match metadata.propose(cmd).await {
                Ok(MetadataOutcome::Partition(p)) => {
                    let was_in_sync = before
                        .topic_by_id(topic_id)
                        .and_then(|t| t.partitions.get(partition as usize))
                        .is_some_and(|old| old.isr.contains(&p.leader));
                    if !was_in_sync {
                        metrics::counter!("kafka_controller_unclean_leader_elections_total")
                            .increment(1);
                        tracing::warn!(%topic_id, partition, leader = %p.leader, "unclean leader election: acked writes may be lost");
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(%topic_id, partition, error = %e, "leader election failed")
                }
            }
        }
        if let Some(every) = rebalance {
            if last_balance.elapsed() >= every {
                last_balance = tokio::time::Instant::now();
                balance_leaders(metadata).await;
            }
        }
    }
}

/// The most preferred-leader elections one balancing round proposes, as
/// Kafka's controller bounds its own (`maxElectionsPerImbalance`).
const MAX_ELECTIONS_PER_BALANCE: usize = 1000;

/// One balancing round: every partition led by another replica than its
/// preferred one, while that one is live and in sync, is led by it again.
async fn balance_leaders(metadata: &MetadataController) {
    let image = metadata.image();
    if !all_support(&image, FEATURE_ELECT_PREFERRED) {
        return;
    }
    let candidates = preferred_candidates(&image);
    for (topic_id, partition) in candidates.into_iter().take(MAX_ELECTIONS_PER_BALANCE) {
        match metadata
            .propose(MetadataCommand::ElectPreferredLeader {
                topic_id,
                partition,
            })
            .await
        {
            Ok(MetadataOutcome::Partition(p)) => {
                metrics::counter!("kafka_controller_preferred_leader_elections_total").increment(1);
                tracing::info!(%topic_id, partition, leader = %p.leader, "leadership back on the preferred replica");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(%topic_id, partition, error = %e, "preferred election failed")
            }
        }
    }
}

/// Whether every registered broker applies the metadata command `feature` names.
pub fn all_support(image: &MetadataImage, feature: &str) -> bool {
    image
        .brokers
        .values()
        .all(|b| b.features.iter().any(|f| f == feature))
}

/// Partitions not led by their preferred replica.
pub fn imbalanced_count(image: &MetadataImage) -> usize {
    image
        .topics
        .values()
        .flat_map(|t| &t.partitions)
        .filter(|p| p.replicas.first().is_some_and(|r| *r != p.leader))
        .count()
}

/// Partitions whose preferred replica is live and in sync but not leading.
pub fn preferred_candidates(image: &MetadataImage) -> Vec<(uuid::Uuid, i32)> {
    image
        .topics
        .values()
        .flat_map(|t| {
            t.partitions
                .iter()
                .filter(|p| preferred_leader(p, &image.brokers).is_ok())
                .map(|p| (t.topic_id, p.partition))
        })
        .collect()
}

/// Leaderless partitions of topics that allow unclean election and that have
/// a live (registered, unfenced) replica to elect.
pub fn unclean_candidates(image: &MetadataImage, unclean_default: bool) -> Vec<(uuid::Uuid, i32)> {
    let mut out = Vec::new();
    for topic in image.topics.values() {
        let enabled = topic
            .configs
            .get(UNCLEAN_KEY)
            .map(|v| v.trim().eq_ignore_ascii_case("true"))
            .unwrap_or(unclean_default);
        if !enabled {
            continue;
        }
        for p in &topic.partitions {
            if elected_leader(p, &image.brokers, true).is_ok() {
                out.push((topic.topic_id, p.partition));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::{BrokerRegistration, NO_LEADER};

    fn image(brokers: &[(i32, bool)]) -> MetadataImage {
        let mut image = MetadataImage::default();
        for &(id, fenced) in brokers {
            image.brokers.insert(
                NodeId(id),
                BrokerRegistration {
                    node_id: NodeId(id),
                    host: "h".into(),
                    port: 1,
                    listeners: Vec::new(),
                    rack: None,
                    fenced,
                    features: Vec::new(),
                },
            );
        }
        image
    }

    #[test]
    fn silent_brokers_expire_after_the_session_timeout() {
        let image = image(&[(1, false), (2, false), (3, true)]);
        let mut t = LivenessTracker::new(1_000);
        // Not the controller: nobody expires, heartbeats are not recorded.
        t.heartbeat(NodeId(1), 0);
        assert!(t.expired(&image, 10_000).is_empty());

        t.set_role(Some(5), 10_000);
        assert!(t.expired(&image, 10_000).is_empty());
        t.heartbeat(NodeId(1), 10_500);
        // Exactly the timeout is still alive, as in Kafka (strictly older is stale).
        assert!(t.expired(&image, 11_000).is_empty());
        // Broker 2 never sent one: its clock started at the election.
        assert_eq!(t.expired(&image, 11_001), vec![NodeId(2)]);
        assert_eq!(t.expired(&image, 11_501), vec![NodeId(1), NodeId(2)]);
        // A heartbeat resets the clock; an older one arriving late does not rewind it.
        t.heartbeat(NodeId(2), 11_400);
        t.heartbeat(NodeId(2), 11_200);
        assert_eq!(t.expired(&image, 12_401), vec![NodeId(1), NodeId(2)]);
        assert_eq!(t.expired(&image, 12_400), vec![NodeId(1)]);
        // Broker 3 is already fenced; it is never reported again.
        assert!(!t.expired(&image, 99_999).contains(&NodeId(3)));
    }

    #[test]
    fn unclean_candidates_follow_topic_config_over_the_broker_default() {
        use crate::metadata::{PartitionImage, TopicImage};
        use crate::types::LeaderEpoch;
        let mut image = image(&[(1, true), (2, false)]);
        let leaderless = |partition, replicas: Vec<NodeId>| PartitionImage {
            partition,
            isr: vec![replicas[0]],
            replicas,
            leader: NO_LEADER,
            leader_epoch: LeaderEpoch(3),
            partition_epoch: 4,
        };
        let mut add = |name: &str, setting: Option<&str>, partitions: Vec<PartitionImage>| {
            let topic_id = uuid::Uuid::new_v4();
            let configs = setting
                .map(|v| (UNCLEAN_KEY.to_string(), v.to_string()))
                .into_iter()
                .collect();
            image.topics.insert(
                name.to_string(),
                TopicImage {
                    name: name.to_string(),
                    topic_id,
                    partitions,
                    configs,
                },
            );
            topic_id
        };
        let allowed = add(
            "allowed",
            Some("true"),
            vec![
                leaderless(0, vec![NodeId(1), NodeId(2)]),
                // Only fenced replicas: nothing to elect.
                leaderless(1, vec![NodeId(1)]),
            ],
        );
        let refused = add(
            "refused",
            Some("false"),
            vec![leaderless(0, vec![NodeId(1), NodeId(2)])],
        );
        let defaulted = add(
            "defaulted",
            None,
            vec![leaderless(0, vec![NodeId(1), NodeId(2)])],
        );

        let mut off = unclean_candidates(&image, false);
        off.sort();
        assert_eq!(off, vec![(allowed, 0)]);
        let on = unclean_candidates(&image, true);
        assert!(on.contains(&(allowed, 0)) && on.contains(&(defaulted, 0)));
        assert!(!on.contains(&(refused, 0)) && !on.contains(&(allowed, 1)));
        assert_eq!(on.len(), 2);
    }

    #[test]
    fn registering_again_counts_as_contact() {
        let mut t = LivenessTracker::new(1_000);
        t.set_role(Some(1), 0);
        let fenced = image(&[(1, true)]);
        assert!(t.expired(&fenced, 0).is_empty());
        // Long silent while fenced, then registered (unfenced) at 60 s: its
        // clock starts at the registration, not at its last heartbeat.
        let registered = image(&[(1, false)]);
        assert!(t.expired(&registered, 60_000).is_empty());
        assert!(t.expired(&registered, 61_000).is_empty());
        assert_eq!(t.expired(&registered, 61_001), vec![NodeId(1)]);
    }

    #[test]
    fn a_new_term_restarts_every_clock() {
        let image = image(&[(1, false), (2, false)]);
        let mut t = LivenessTracker::new(1_000);
        t.set_role(Some(1), 0);
        assert!(t.expired(&image, 0).is_empty());
        t.heartbeat(NodeId(1), 100);
        // Same term again: nothing resets.
        t.set_role(Some(1), 5_000);
        assert_eq!(t.expired(&image, 5_000), vec![NodeId(1), NodeId(2)]);
        // Losing leadership forgets everything and reports nothing.
        t.set_role(None, 5_000);
        assert!(!t.is_active());
        assert!(t.expired(&image, 50_000).is_empty());
        // Winning a later term starts every clock at that moment.
        t.set_role(Some(3), 50_000);
        assert!(t.expired(&image, 50_000).is_empty());
        assert!(t.expired(&image, 51_000).is_empty());
        assert_eq!(t.expired(&image, 51_001), vec![NodeId(1), NodeId(2)]);
    }

    #[test]
    fn a_former_leaders_clock_starts_at_its_last_raft_message() {
        let image = image(&[(1, false), (2, false)]);
        let mut t = LivenessTracker::new(5_000);
        // A follower hears from leader 1 until 10 s, then wins at 12 s.
        t.raft_contact(NodeId(1), 9_000);
        t.raft_contact(NodeId(1), 10_000);
        t.set_role(Some(2), 12_000);
        assert!(t.expired(&image, 15_000).is_empty());
        // Node 1's silence began at 10 s; node 2's clock at the election.
        assert_eq!(t.expired(&image, 15_001), vec![NodeId(1)]);
        assert_eq!(t.expired(&image, 17_001), vec![NodeId(1), NodeId(2)]);
        // A heartbeat from the former leader counts as anyone's does.
        t.heartbeat(NodeId(1), 17_500);
        assert_eq!(t.expired(&image, 17_600), vec![NodeId(2)]);
    }
}
