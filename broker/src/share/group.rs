//! A share group's membership (KIP-932's ShareGroupHeartbeat): members join,
//! heartbeat with their epoch, change subscriptions and leave; the
//! coordinator assigns partitions to them. Unlike a consumer group, several
//! members may share a partition and nothing is revoked first (records, not
//! partitions, are what members hold), so a member takes its new
//! assignment, at the group's epoch, on its next heartbeat.
//!
//! Kafka's rules (`GroupMetadataManager.shareGroupHeartbeat`): epoch 0
//! joins (with a subscription), -1 leaves; any other epoch must be the
//! member's (else `FENCED_MEMBER_EPOCH`) and the member must exist (else
//! `UNKNOWN_MEMBER_ID`). A changed subscription, a member joining or
//! leaving, or a subscribed topic's partitions changing bumps the group
//! epoch and recomputes the assignment.
//!
//! Assignment (the `simple` assignor): per topic, its subscribers sorted by
//! member id; with no more subscribers than partitions each partition goes
//! to one member, round robin; with more, each member gets one partition
//! and partitions are shared as evenly as possible. Every subscriber gets
//! work and every partition has a consumer.
//!
//! Invariant: no clock and no I/O; the caller passes the time and the
//! topics' metadata.

use std::collections::{BTreeMap, BTreeSet};

use uuid::Uuid;

/// Partitions by topic id, each list sorted.
pub type Assignment = BTreeMap<Uuid, Vec<i32>>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub member_id: String,
    pub member_epoch: i32,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed: BTreeSet<String>,
    pub assignment: Assignment,
    /// The session ends if no heartbeat comes before this.
    pub deadline_ms: i64,
}

/// One ShareGroupHeartbeat, as the handler decoded it.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    pub member_id: String,
    pub member_epoch: i32,
    pub rack_id: Option<String>,
    /// `None`: unchanged since the last heartbeat.
    pub subscribed_topic_names: Option<Vec<String>>,
    pub client_id: String,
    pub client_host: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeartbeatError {
    InvalidRequest(&'static str),
    UnknownMemberId,
    FencedMemberEpoch,
    GroupMaxSizeReached,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatResponse {
    pub member_epoch: i32,
    /// The member's assignment, when its epoch moved or the request was a
    /// full one (a join, or a subscription sent).
    pub assignment: Option<Assignment>,
}

/// The group settings membership needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupLimits {
    /// `group.share.max.size`.
    pub max_size: usize,
    /// `share.session.timeout.ms`.
    pub session_timeout_ms: i64,
}

#[derive(Clone, Debug, Default)]
pub struct ShareGroup {
    pub group_id: String,
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    pub members: BTreeMap<String, Member>,
    /// The subscribed topics as last assigned: name to (id, partitions).
    topics: BTreeMap<String, (Uuid, i32)>,
    /// Every share-partition ever assigned (or whose offsets were altered),
    /// by topic id: those whose state the share coordinator may hold
    /// (Kafka's `ShareGroupStatePartitionMetadata`), which
    /// DescribeShareGroupOffsets lists and DeleteGroups deletes.
    pub initialized: BTreeMap<Uuid, BTreeSet<i32>>,
}

impl ShareGroup {
    pub fn new(group_id: &str) -> Self {
        ShareGroup {
            group_id: group_id.to_string(),
            ..Default::default()
        }
    }

    /// `Empty` or `Stable`, as ShareGroupDescribe and ListGroups say it.
    pub fn state(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else {
            "Stable"
        }
    }

    /// Every topic some member subscribes to.
    pub fn subscribed_topics(&self) -> BTreeSet<String> {
        self.members
            .values()
            .flat_map(|m| m.subscribed.iter().cloned())
            .collect()
    }

    /// Handles one heartbeat. `topic` resolves a topic name to its id and
    /// partition count (`None`: no such topic, which is assigned nothing).
    pub fn heartbeat(
        &mut self,
        hb: Heartbeat,
        topic: impl Fn(&str) -> Option<(Uuid, i32)>,
        limits: GroupLimits,
        now_ms: i64,
    ) -> Result<HeartbeatResponse, HeartbeatError> {
        if hb.member_id.is_empty() {
            return Err(HeartbeatError::InvalidRequest("MemberId can't be empty."));
        }
        if hb.member_epoch < -1 {
            return Err(HeartbeatError::InvalidRequest("MemberEpoch is invalid."));
        }
        if hb.member_epoch == -1 {
            if self.members.remove(&hb.member_id).is_none() {
                return Err(HeartbeatError::UnknownMemberId);
            }
            self.group_epoch += 1;
            self.reassign(&topic);
            return Ok(HeartbeatResponse {
                member_epoch: -1,
                assignment: None,
            });
        }
        let full = hb.member_epoch == 0 || hb.subscribed_topic_names.is_some();
        if hb.member_epoch == 0 {
            if hb
                .subscribed_topic_names
                .as_ref()
                .is_none_or(|names| names.is_empty())
            {
                return Err(HeartbeatError::InvalidRequest(
                    "SubscribedTopicNames must be set in first request.",
                ));
            }
            if !self.members.contains_key(&hb.member_id) && self.members.len() >= limits.max_size {
                return Err(HeartbeatError::GroupMaxSizeReached);
            }
        } else {
            let member = self
                .members
                .get(&hb.member_id)
                .ok_or(HeartbeatError::UnknownMemberId)?;
            if member.member_epoch != hb.member_epoch {
                return Err(HeartbeatError::FencedMemberEpoch);
            }
        }
        let joining = hb.member_epoch == 0;
        let member = self
            .members
            .entry(hb.member_id.clone())
            .or_insert_with(|| Member {
                member_id: hb.member_id.clone(),
                member_epoch: 0,
                rack_id: None,
                client_id: String::new(),
                client_host: String::new(),
                subscribed: BTreeSet::new(),
                assignment: Assignment::new(),
                deadline_ms: 0,
            });
        member.deadline_ms = now_ms.saturating_add(limits.session_timeout_ms);
        member.client_id = hb.client_id;
        member.client_host = hb.client_host;
        if hb.rack_id.is_some() {
            member.rack_id = hb.rack_id;
        }
        let mut changed = joining;
        if let Some(names) = hb.subscribed_topic_names {
            let names: BTreeSet<String> = names.into_iter().collect();
            if names != member.subscribed {
                member.subscribed = names;
                changed = true;
            }
        }
        if changed || self.topics_changed(&topic) {
            self.group_epoch += 1;
        }
        if self.assignment_epoch < self.group_epoch {
            self.reassign(&topic);
        }
        let member = self.members.get_mut(&hb.member_id).expect("inserted above");
        // A member whose epoch is behind has not been told the latest
        // assignment (it may not differ from its last one).
        let behind = member.member_epoch != self.assignment_epoch;
        member.member_epoch = self.assignment_epoch;
        let assignment = (full || behind).then(|| member.assignment.clone());
        Ok(HeartbeatResponse {
            member_epoch: member.member_epoch,
            assignment,
        })
    }

    /// Removes members whose session ended by `now_ms`; returns their ids.
    pub fn expire(
        &mut self,
        topic: impl Fn(&str) -> Option<(Uuid, i32)>,
        now_ms: i64,
    ) -> Vec<String> {
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| m.deadline_ms <= now_ms)
            .map(|m| m.member_id.clone())
            .collect();
        if !gone.is_empty() {
            for id in &gone {
                self.members.remove(id);
            }
            self.group_epoch += 1;
            self.reassign(&topic);
        }
        gone
    }

    /// [`Self::expire`] against the topics as last assigned (the timer has
    /// no metadata image): the members left get the departed members'
    /// partitions; a topic change is picked up at the next heartbeat.
    pub fn expire_members(&mut self, now_ms: i64) -> Vec<String> {
        let topics = self.topics.clone();
        self.expire(|name| topics.get(name).copied(), now_ms)
    }

    fn topics_changed(&self, topic: &impl Fn(&str) -> Option<(Uuid, i32)>) -> bool {
        let now: BTreeMap<String, (Uuid, i32)> = self
            .subscribed_topics()
            .into_iter()
            .filter_map(|name| topic(&name).map(|t| (name, t)))
            .collect();
        now != self.topics
    }

    /// Recomputes every member's target assignment at the group epoch.
    fn reassign(&mut self, topic: &impl Fn(&str) -> Option<(Uuid, i32)>) {
        self.topics = self
            .subscribed_topics()
            .into_iter()
            .filter_map(|name| topic(&name).map(|t| (name, t)))
            .collect();
        for m in self.members.values_mut() {
            m.assignment.clear();
        }
        for (name, &(topic_id, partitions)) in &self.topics {
            let subscribers: Vec<String> = self
                .members
                .values()
                .filter(|m| m.subscribed.contains(name))
                .map(|m| m.member_id.clone())
                .collect();
            for (member, parts) in assign_topic(&subscribers, partitions) {
                if !parts.is_empty() {
                    self.initialized
                        .entry(topic_id)
                        .or_default()
                        .extend(parts.iter().copied());
                    self.members
                        .get_mut(&member)
                        .expect("a subscriber")
                        .assignment
                        .insert(topic_id, parts);
                }
            }
        }
        self.assignment_epoch = self.group_epoch;
    }
}

/// The `simple` assignment of one topic's partitions to its subscribers
/// (sorted member ids).
fn assign_topic(subscribers: &[String], partitions: i32) -> Vec<(String, Vec<i32>)> {
    let n = subscribers.len();
    if n == 0 || partitions <= 0 {
        return Vec::new();
    }
    let mut out: Vec<(String, Vec<i32>)> = subscribers
        .iter()
        .map(|m| (m.clone(), Vec::new()))
        .collect();
    if n <= partitions as usize {
        for p in 0..partitions {
            out[p as usize % n].1.push(p);
        }
    } else {
        for (i, (_, parts)) in out.iter_mut().enumerate() {
            parts.push((i % partitions as usize) as i32);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: GroupLimits = GroupLimits {
        max_size: 3,
        session_timeout_ms: 1_000,
    };

    fn id(name: &str) -> Uuid {
        match name {
            "a" => Uuid::from_u128(1),
            _ => Uuid::from_u128(2),
        }
    }

    fn topics(name: &str) -> Option<(Uuid, i32)> {
        match name {
            "a" => Some((id("a"), 2)),
            "b" => Some((id("b"), 1)),
            _ => None,
        }
    }

    fn join(member: &str, subs: &[&str]) -> Heartbeat {
        Heartbeat {
            member_id: member.into(),
            member_epoch: 0,
            rack_id: None,
            subscribed_topic_names: Some(subs.iter().map(|s| s.to_string()).collect()),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
        }
    }

    fn beat(member: &str, epoch: i32) -> Heartbeat {
        Heartbeat {
            subscribed_topic_names: None,
            member_epoch: epoch,
            ..join(member, &[])
        }
    }

    fn parts(a: &[i32], b: &[i32]) -> Assignment {
        let mut out = Assignment::new();
        if !a.is_empty() {
            out.insert(id("a"), a.to_vec());
        }
        if !b.is_empty() {
            out.insert(id("b"), b.to_vec());
        }
        out
    }

    #[test]
    fn members_split_partitions_and_share_them_when_they_outnumber_them() {
        let mut g = ShareGroup::new("g");
        let r = g
            .heartbeat(join("m1", &["a", "b"]), topics, LIMITS, 0)
            .unwrap();
        assert_eq!(r.member_epoch, 1);
        assert_eq!(r.assignment, Some(parts(&[0, 1], &[0])));
        let r = g
            .heartbeat(join("m2", &["a", "b"]), topics, LIMITS, 0)
            .unwrap();
        assert_eq!(r.member_epoch, 2);
        // Topic "a" is split; topic "b" (one partition) is shared.
        assert_eq!(r.assignment, Some(parts(&[1], &[0])));
        // m1 learns its new assignment and epoch on its next heartbeat.
        let r = g.heartbeat(beat("m1", 1), topics, LIMITS, 0).unwrap();
        assert_eq!(
            r,
            HeartbeatResponse {
                member_epoch: 2,
                assignment: Some(parts(&[0], &[0])),
            }
        );
        // Nothing changed: no assignment in the response.
        let r = g.heartbeat(beat("m1", 2), topics, LIMITS, 0).unwrap();
        assert_eq!(r.assignment, None);
        let r = g.heartbeat(join("m3", &["a"]), topics, LIMITS, 0).unwrap();
        assert_eq!(r.assignment, Some(parts(&[0], &[])));
        assert_eq!(g.members["m2"].assignment, parts(&[1], &[0]));
        assert_eq!(g.members["m1"].assignment, parts(&[0], &[0]));
    }

    #[test]
    fn epochs_and_member_ids_are_checked() {
        let mut g = ShareGroup::new("g");
        g.heartbeat(join("m1", &["a"]), topics, LIMITS, 0).unwrap();
        assert_eq!(
            g.heartbeat(beat("m1", 7), topics, LIMITS, 0),
            Err(HeartbeatError::FencedMemberEpoch)
        );
        assert_eq!(
            g.heartbeat(beat("nobody", 1), topics, LIMITS, 0),
            Err(HeartbeatError::UnknownMemberId)
        );
        assert!(matches!(
            g.heartbeat(join("", &["a"]), topics, LIMITS, 0),
            Err(HeartbeatError::InvalidRequest(_))
        ));
        assert!(matches!(
            g.heartbeat(join("m2", &[]), topics, LIMITS, 0),
            Err(HeartbeatError::InvalidRequest(_))
        ));
        assert!(matches!(
            g.heartbeat(beat("m1", -2), topics, LIMITS, 0),
            Err(HeartbeatError::InvalidRequest(_))
        ));
        g.heartbeat(join("m2", &["a"]), topics, LIMITS, 0).unwrap();
        g.heartbeat(join("m3", &["a"]), topics, LIMITS, 0).unwrap();
        assert_eq!(
            g.heartbeat(join("m4", &["a"]), topics, LIMITS, 0),
            Err(HeartbeatError::GroupMaxSizeReached)
        );
        // A member already in the group may join again at the limit.
        assert!(g.heartbeat(join("m3", &["a"]), topics, LIMITS, 0).is_ok());
    }

    #[test]
    fn leaving_and_expiry_reassign_to_the_rest() {
        let mut g = ShareGroup::new("g");
        g.heartbeat(join("m1", &["a"]), topics, LIMITS, 0).unwrap();
        g.heartbeat(join("m2", &["a"]), topics, LIMITS, 0).unwrap();
        let r = g.heartbeat(beat("m2", 2), topics, LIMITS, 0).unwrap();
        assert_eq!(r.member_epoch, 2);
        let r = g.heartbeat(beat("m2", -1), topics, LIMITS, 0).unwrap();
        assert_eq!(r.member_epoch, -1);
        assert_eq!(g.members["m1"].assignment, parts(&[0, 1], &[]));
        g.heartbeat(join("m3", &["a"]), topics, LIMITS, 500)
            .unwrap();
        assert_eq!(g.expire(topics, 999), Vec::<String>::new());
        assert_eq!(g.expire(topics, 1_000), vec!["m1".to_string()]);
        assert_eq!(g.members["m3"].assignment, parts(&[0, 1], &[]));
        assert_eq!(g.expire(topics, 1_500), vec!["m3".to_string()]);
        assert_eq!(g.state(), "Empty");
        // What was assigned stays the group's, members or not.
        assert_eq!(g.initialized.get(&id("a")), Some(&BTreeSet::from([0, 1])));
        assert_eq!(g.initialized.get(&id("b")), None);
    }

    #[test]
    fn a_subscription_or_partition_change_bumps_the_epoch() {
        let mut g = ShareGroup::new("g");
        g.heartbeat(join("m1", &["a"]), topics, LIMITS, 0).unwrap();
        let mut resub = beat("m1", 1);
        resub.subscribed_topic_names = Some(vec!["b".into(), "missing".into()]);
        let r = g.heartbeat(resub, topics, LIMITS, 0).unwrap();
        assert_eq!(r.member_epoch, 2);
        assert_eq!(r.assignment, Some(parts(&[], &[0])));
        // "missing" appears with two partitions.
        let grown = |name: &str| match name {
            "missing" => Some((Uuid::from_u128(3), 2)),
            other => topics(other),
        };
        let r = g.heartbeat(beat("m1", 2), grown, LIMITS, 0).unwrap();
        assert_eq!(r.member_epoch, 3);
        let mut want = parts(&[], &[0]);
        want.insert(Uuid::from_u128(3), vec![0, 1]);
        assert_eq!(r.assignment, Some(want));
    }
}
