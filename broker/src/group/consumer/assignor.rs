//! The server-side assignors of KIP-848 groups: `uniform` and `range`.
//!
//! An assignor maps every member to the partitions it should own at the
//! group epoch (the target assignment). It sees each member's subscription
//! (resolved to topic ids of topics that exist) and the previous target
//! assignment, and knows nothing of epochs or revocation: moving a partition
//! safely is the reconciliation's job.

use std::collections::{BTreeMap, BTreeSet};

use super::{Assignment, TopicId};
use crate::group::{GroupInstanceId, MemberId};

/// One of `group.consumer.assignors`, with Kafka's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServerAssignor {
    /// Kafka's `UniformAssignor`: balanced and sticky.
    Uniform,
    /// Kafka's `RangeAssignor`: contiguous ranges per topic, co-partitioned
    /// when every member subscribes to the same topics.
    Range,
}

impl ServerAssignor {
    pub fn name(self) -> &'static str {
        match self {
            ServerAssignor::Uniform => "uniform",
            ServerAssignor::Range => "range",
        }
    }

    /// Kafka accepts the short names and the class names in
    /// `group.consumer.assignors`.
    pub fn from_name(name: &str) -> Option<ServerAssignor> {
        match name {
            "uniform" | "org.apache.kafka.coordinator.group.assignor.UniformAssignor" => {
                Some(ServerAssignor::Uniform)
            }
            "range" | "org.apache.kafka.coordinator.group.assignor.RangeAssignor" => {
                Some(ServerAssignor::Range)
            }
            _ => None,
        }
    }

    /// Computes the target assignment of every member in `members`.
    /// `partition_counts` holds the topics that exist, by id; subscriptions
    /// to other topics are ignored.
    pub(crate) fn assign(
        self,
        members: &[MemberSpec],
        partition_counts: &BTreeMap<TopicId, i32>,
    ) -> BTreeMap<MemberId, Assignment> {
        match self {
            ServerAssignor::Uniform => assign_uniform(members, partition_counts),
            ServerAssignor::Range => assign_range(members, partition_counts),
        }
    }
}

/// What an assignor knows of one member.
#[derive(Clone, Debug)]
pub(crate) struct MemberSpec {
    pub member_id: MemberId,
    pub instance_id: Option<GroupInstanceId>,
    pub subscribed_topic_ids: BTreeSet<TopicId>,
    /// The member's target assignment before this computation.
    pub previous: Assignment,
}

type Partition = (TopicId, i32);

fn assign_range(
    members: &[MemberSpec],
    partition_counts: &BTreeMap<TopicId, i32>,
) -> BTreeMap<MemberId, Assignment> {
    // Kafka sorts static members first, by instance id, then dynamic ones by
    // member id, so that a rolling bounce of static members (which changes
    // their member ids) keeps every range where it was.
    let mut order: Vec<&MemberSpec> = members.iter().collect();
    order.sort_by(|a, b| match (&a.instance_id, &b.instance_id) {
        (Some(x), Some(y)) => x.cmp(y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.member_id.cmp(&b.member_id),
    });
    let mut result: BTreeMap<MemberId, Assignment> = members
        .iter()
        .map(|m| (m.member_id.clone(), Assignment::new()))
        .collect();
    for (&topic_id, &count) in partition_counts {
        let subscribers: Vec<&MemberSpec> = order
            .iter()
            .copied()
            .filter(|m| m.subscribed_topic_ids.contains(&topic_id))
            .collect();
        if subscribers.is_empty() || count <= 0 {
            continue;
        }
        // The same quota arithmetic as Kafka's: the first `extra` members in
        // the order get one partition more. With equal subscriptions and
        // partition counts every topic is cut at the same places, which is
        // the co-partitioning the range assignor promises.
        let n = subscribers.len() as i32;
        let min_quota = count / n;
        let mut extra = count % n;
        let mut next = 0;
        for member in subscribers {
            let mut quota = min_quota;
            if extra > 0 {
                quota += 1;
                extra -= 1;
            }
            let end = (next + quota).min(count);
            if next < end {
                let entry = result.entry(member.member_id.clone()).or_default();
                entry.insert(topic_id, (next..end).collect());
            }
            next = end;
        }
    }
    result
}

fn assign_uniform(
    members: &[MemberSpec],
    partition_counts: &BTreeMap<TopicId, i32>,
) -> BTreeMap<MemberId, Assignment> {
    let mut order: Vec<&MemberSpec> = members.iter().collect();
    order.sort_by(|a, b| a.member_id.cmp(&b.member_id));
    let subscribed = |m: &MemberSpec, (topic_id, partition): Partition| {
        m.subscribed_topic_ids.contains(&topic_id)
            && partition_counts
                .get(&topic_id)
                .is_some_and(|&count| partition >= 0 && partition < count)
    };

    // Every partition of a topic that at least one member subscribes to.
    let mut all_partitions: BTreeSet<Partition> = BTreeSet::new();
    for (&topic_id, &count) in partition_counts {
        if order
            .iter()
            .any(|m| m.subscribed_topic_ids.contains(&topic_id))
        {
            all_partitions.extend((0..count.max(0)).map(|p| (topic_id, p)));
        }
    }

    // Stickiness first: each member keeps what it had and may still have. A
    // partition in two previous assignments (which the coordinator never
    // produces) goes to the first member in member-id order.
    let mut taken: BTreeSet<Partition> = BTreeSet::new();
    let mut kept: Vec<Vec<Partition>> = order
        .iter()
        .map(|m| {
            let mut mine = Vec::new();
            for (&topic_id, partitions) in &m.previous {
                for &p in partitions {
                    if subscribed(m, (topic_id, p)) && taken.insert((topic_id, p)) {
                        mine.push((topic_id, p));
                    }
                }
            }
            mine
        })
        .collect();

    // When every member subscribes to the same topics, Kafka's homogeneous
    // builder caps each member at its quota: floor(P / N), one more for
    // P % N members. The extra slots go to the members that hold the most
    // already, so that as few partitions move as possible.
    let homogeneous = order
        .windows(2)
        .all(|w| w[0].subscribed_topic_ids == w[1].subscribed_topic_ids);
    if homogeneous && !order.is_empty() {
        let n = order.len();
        let min_quota = all_partitions.len() / n;
        let mut extra = all_partitions.len() % n;
        let mut by_holding: Vec<usize> = (0..n).collect();
        by_holding.sort_by(|&a, &b| kept[b].len().cmp(&kept[a].len()).then(a.cmp(&b)));
        for i in by_holding {
            let mut quota = min_quota;
            if extra > 0 {
                quota += 1;
                extra -= 1;
            }
            if kept[i].len() > quota {
                for freed in kept[i].split_off(quota) {
                    taken.remove(&freed);
                }
            }
        }
    }

    // Each unassigned partition goes to the least loaded member that
    // subscribes to its topic (ties: member-id order). With equal
    // subscriptions and the caps above this ends with loads that differ by
    // at most one.
    let mut loads: Vec<usize> = kept.iter().map(Vec::len).collect();
    let unassigned: Vec<Partition> = all_partitions.difference(&taken).copied().collect();
    for partition in unassigned {
        let least = (0..order.len())
            .filter(|&i| subscribed(order[i], partition))
            .min_by_key(|&i| (loads[i], i));
        if let Some(i) = least {
            kept[i].push(partition);
            loads[i] += 1;
            taken.insert(partition);
        }
    }

    // With different subscriptions the greedy pass can leave a member with
    // two or more partitions more than another member that could take one of
    // them; move such partitions until no move helps (Kafka's heterogeneous
    // builder balances the same way). Each move lowers the sum of squared
    // loads, so this ends.
    if !homogeneous {
        rebalance_heterogeneous(&order, &mut kept, &mut loads, &subscribed);
    }

    order
        .iter()
        .zip(kept)
        .map(|(m, partitions)| {
            let mut assignment = Assignment::new();
            for (topic_id, p) in partitions {
                assignment.entry(topic_id).or_default().insert(p);
            }
            (m.member_id.clone(), assignment)
        })
        .collect()
}

fn rebalance_heterogeneous(
    order: &[&MemberSpec],
    kept: &mut [Vec<Partition>],
    loads: &mut [usize],
    subscribed: &dyn Fn(&MemberSpec, Partition) -> bool,
) {
    loop {
        let mut moved = false;
        let mut from_order: Vec<usize> = (0..order.len()).collect();
        from_order.sort_by(|&a, &b| loads[b].cmp(&loads[a]).then(a.cmp(&b)));
        'search: for from in from_order {
            // The most recently added partitions move first: they are the
            // ones the member did not have in its previous target.
            for idx in (0..kept[from].len()).rev() {
                let partition = kept[from][idx];
                let to = (0..order.len())
                    .filter(|&i| i != from && subscribed(order[i], partition))
                    .min_by_key(|&i| (loads[i], i));
                if let Some(to) = to {
                    if loads[to] + 1 < loads[from] {
                        kept[from].remove(idx);
                        kept[to].push(partition);
                        loads[from] -= 1;
                        loads[to] += 1;
                        moved = true;
                        break 'search;
                    }
                }
            }
        }
        if !moved {
            return;
        }
    }
}
