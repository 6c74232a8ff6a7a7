//! KIP-848 groups driven by simulated clients and a fake clock: each test
//! says the time of every heartbeat; timers fire only through `tick`.

use std::collections::{BTreeMap, BTreeSet};

use super::assignor::MemberSpec;
use super::*;

const REBALANCE_MS: i32 = 30_000;
const SESSION_MS: i64 = 45_000;

fn tid(n: u8) -> TopicId {
    TopicId(uuid::Uuid::from_bytes([n; 16]))
}

/// A fake metadata image: topic name -> (id, partition count).
#[derive(Clone, Debug, Default)]
struct Topics(BTreeMap<String, TopicMetadata>);

impl Topics {
    fn with(topics: &[(&str, u8, i32)]) -> Self {
        let mut t = Topics::default();
        for &(name, id, count) in topics {
            t.set(name, id, count);
        }
        t
    }

    fn set(&mut self, name: &str, id: u8, partition_count: i32) {
        self.0.insert(
            name.to_string(),
            TopicMetadata {
                topic_id: tid(id),
                partition_count,
            },
        );
    }
}

impl TopicsView for Topics {
    fn topic(&self, name: &str) -> Option<TopicMetadata> {
        self.0.get(name).copied()
    }

    fn topic_name(&self, topic_id: TopicId) -> Option<String> {
        self.0
            .iter()
            .find(|(_, t)| t.topic_id == topic_id)
            .map(|(n, _)| n.clone())
    }

    /// Internal topics included, to check that the group skips them itself.
    fn topic_names(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }
}

fn assignment(parts: &[(u8, &[i32])]) -> Assignment {
    parts
        .iter()
        .filter(|(_, ps)| !ps.is_empty())
        .map(|&(t, ps)| (tid(t), ps.iter().copied().collect()))
        .collect()
}

fn count(a: &Assignment) -> usize {
    a.values().map(BTreeSet::len).sum()
}

/// A consumer as the broker sees it: what it last heard and what it owns.
/// On an assignment it revokes what is gone and takes what is new at once,
/// as the Java consumer does without slow rebalance callbacks.
#[derive(Clone, Debug)]
struct Client {
    member_id: MemberId,
    instance_id: Option<GroupInstanceId>,
    epoch: Epoch,
    owned: Assignment,
    topics: Vec<String>,
    /// Sent with the join when set.
    regex: Option<String>,
    assignor: Option<String>,
    api_version: i16,
}

impl Client {
    fn new(member_id: &str, topics: &[&str]) -> Self {
        Client {
            member_id: MemberId::from(member_id),
            instance_id: None,
            epoch: Epoch::JOIN,
            owned: Assignment::new(),
            topics: topics.iter().map(|t| t.to_string()).collect(),
            regex: None,
            assignor: None,
            api_version: 1,
        }
    }

    fn static_member(member_id: &str, instance_id: &str, topics: &[&str]) -> Self {
        Client {
            instance_id: Some(GroupInstanceId::from(instance_id)),
            ..Client::new(member_id, topics)
        }
    }

    fn join_request(&self) -> ConsumerHeartbeat {
        ConsumerHeartbeat {
            member_id: self.member_id.clone(),
            member_epoch: Epoch::JOIN,
            instance_id: self.instance_id.clone(),
            rebalance_timeout_ms: REBALANCE_MS,
            subscribed_topic_names: Some(self.topics.clone()),
            subscribed_topic_regex: self.regex.clone(),
            server_assignor: self.assignor.clone(),
            owned_topic_partitions: Some(Assignment::new()),
            api_version: self.api_version,
            client_id: "client".to_string(),
            client_host: "/127.0.0.1".to_string(),
            ..ConsumerHeartbeat::default()
        }
    }

    /// A steady-state heartbeat: only the epoch and the owned partitions.
    fn heartbeat_request(&self) -> ConsumerHeartbeat {
        ConsumerHeartbeat {
            member_id: self.member_id.clone(),
            member_epoch: self.epoch,
            instance_id: self.instance_id.clone(),
            rebalance_timeout_ms: -1,
            owned_topic_partitions: Some(self.owned.clone()),
            api_version: self.api_version,
            client_id: "client".to_string(),
            client_host: "/127.0.0.1".to_string(),
            ..ConsumerHeartbeat::default()
        }
    }

    fn apply(&mut self, reply: &ConsumerHeartbeatReply) {
        self.member_id = reply.member_id.clone();
        self.epoch = reply.member_epoch;
        if let Some(a) = &reply.assignment {
            self.owned = a.clone();
        }
    }
}

struct Harness {
    coordinator: ConsumerGroupCoordinator,
    topics: Topics,
    now_ms: i64,
}

impl Harness {
    fn new(topics: Topics) -> Self {
        Harness {
            coordinator: ConsumerGroupCoordinator::new(ConsumerGroupConfig::default()),
            topics,
            now_ms: 0,
        }
    }

    fn send(&mut self, req: ConsumerHeartbeat) -> Result<ConsumerHeartbeatReply, GroupError> {
        self.coordinator
            .heartbeat("g", req, &self.topics, self.now_ms)
    }

    fn join(&mut self, client: &mut Client) -> ConsumerHeartbeatReply {
        let reply = self.send(client.join_request()).expect("join");
        client.apply(&reply);
        reply
    }

    fn heartbeat(&mut self, client: &mut Client) -> ConsumerHeartbeatReply {
        let reply = self.send(client.heartbeat_request()).expect("heartbeat");
        client.apply(&reply);
        reply
    }

    /// Everyone heartbeats until a whole round changes nothing.
    fn settle(&mut self, clients: &mut [&mut Client]) {
        for _ in 0..20 {
            let before: Vec<(Epoch, Assignment)> =
                clients.iter().map(|c| (c.epoch, c.owned.clone())).collect();
            for client in clients.iter_mut() {
                self.heartbeat(client);
                self.assert_no_partition_owned_twice();
            }
            let after: Vec<(Epoch, Assignment)> =
                clients.iter().map(|c| (c.epoch, c.owned.clone())).collect();
            if before == after {
                return;
            }
        }
        panic!("the group did not settle");
    }

    fn group(&self) -> &ConsumerGroup {
        self.coordinator.group("g").expect("group exists")
    }

    fn assert_no_partition_owned_twice(&self) {
        let Some(group) = self.coordinator.group("g") else {
            return;
        };
        let mut seen: BTreeMap<(TopicId, i32), MemberId> = BTreeMap::new();
        for member_id in group.members.keys() {
            let owned = group
                .owned_partitions(member_id.as_str())
                .unwrap_or_default();
            for (t, ps) in owned {
                for p in ps {
                    if let Some(other) = seen.insert((t, p), member_id.clone()) {
                        panic!("{t}-{p} owned by {other} and {member_id}");
                    }
                    assert_eq!(group.partition_owner(t, p), Some(member_id));
                }
            }
        }
        assert_eq!(seen.len(), group.partition_owners.len());
    }
}

#[test]
fn first_member_gets_every_partition_at_epoch_one() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 4)]));
    let mut c = Client::new("m1", &["a"]);
    let reply = h.join(&mut c);
    assert_eq!(reply.member_epoch, Epoch(1));
    assert_eq!(reply.heartbeat_interval_ms, 5_000);
    assert_eq!(reply.assignment, Some(assignment(&[(1, &[0, 1, 2, 3])])));
    assert_eq!(h.group().state(), ConsumerGroupState::Stable);
    assert_eq!(h.group().group_epoch(), Epoch(1));

    // A steady heartbeat changes nothing and carries no assignment.
    let reply = h.heartbeat(&mut c);
    assert_eq!(reply.member_epoch, Epoch(1));
    assert_eq!(reply.assignment, None);
    assert_eq!(h.group().group_epoch(), Epoch(1));
}

#[test]
fn v0_join_without_member_id_gets_one_from_the_coordinator() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 1)]));
    let mut c = Client::new("", &["a"]);
    c.api_version = 0;
    let reply = h.join(&mut c);
    assert!(!reply.member_id.is_unknown());
    assert!(h.group().has_member(reply.member_id.as_str()));
    // v1 clients must bring their own.
    let mut v1 = Client::new("", &["a"]);
    v1.api_version = 1;
    assert_eq!(h.send(v1.join_request()), Err(GroupError::InvalidRequest));
}

#[test]
fn a_member_may_subscribe_to_nothing() {
    // The first member of a new group still moves it to epoch 1.
    let mut h = Harness::new(Topics::with(&[("a", 1, 2)]));
    let mut idle = Client::new("idle", &[]);
    let reply = h.join(&mut idle);
    assert_eq!(reply.member_epoch, Epoch(1));
    assert_eq!(reply.assignment, Some(Assignment::new()));
    let mut a = Client::new("a", &["a"]);
    h.join(&mut a);
    assert_eq!(h.group().group_epoch(), Epoch(2));
    // Another member without subscriptions changes nothing to assign, so
    // Kafka does not bump the epoch for it.
    let mut idle2 = Client::new("idle2", &[]);
    let reply = h.join(&mut idle2);
    assert_eq!(h.group().group_epoch(), Epoch(2));
    assert_eq!(reply.member_epoch, Epoch(2));
    h.settle(&mut [&mut idle, &mut a, &mut idle2]);
    assert_eq!(count(&a.owned), 2);
    assert!(idle.owned.is_empty() && idle2.owned.is_empty());
}

#[test]
fn uniform_balances_and_keeps_partitions_where_they_are() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 6)]));
    let mut c1 = Client::new("m1", &["a"]);
    let mut c2 = Client::new("m2", &["a"]);
    let mut c3 = Client::new("m3", &["a"]);
    h.join(&mut c1);
    h.join(&mut c2);
    h.settle(&mut [&mut c1, &mut c2]);
    assert_eq!(count(&c1.owned), 3);
    assert_eq!(count(&c2.owned), 3);
    let (before1, before2) = (c1.owned.clone(), c2.owned.clone());

    h.join(&mut c3);
    h.settle(&mut [&mut c1, &mut c2, &mut c3]);
    for c in [&c1, &c2, &c3] {
        assert_eq!(count(&c.owned), 2, "{c:?}");
    }
    // Sticky: the old members only gave partitions up.
    assert!(is_subset(Some(&c1.owned), &before1));
    assert!(is_subset(Some(&c2.owned), &before2));
    assert_eq!(h.group().state(), ConsumerGroupState::Stable);
    assert_eq!(h.group().group_epoch(), Epoch(3));
    assert_eq!(c1.epoch, Epoch(3));

    // m3 leaves: its partitions go to the others, nobody else moves.
    let (before1, before2) = (c1.owned.clone(), c2.owned.clone());
    let mut leave = c3.heartbeat_request();
    leave.member_epoch = Epoch::LEAVE;
    let reply = h.send(leave).unwrap();
    assert_eq!(reply.member_epoch, Epoch::LEAVE);
    assert_eq!(h.group().group_epoch(), Epoch(4));
    assert_eq!(h.group().state(), ConsumerGroupState::Assigning);
    h.settle(&mut [&mut c1, &mut c2]);
    assert_eq!(count(&c1.owned), 3);
    assert_eq!(count(&c2.owned), 3);
    assert!(is_subset(Some(&before1), &c1.owned));
    assert!(is_subset(Some(&before2), &c2.owned));
}

#[test]
fn range_cuts_every_topic_at_the_same_places() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 3), ("b", 2, 3)]));
    let mut c1 = Client::new("m1", &["a", "b"]);
    let mut c2 = Client::new("m2", &["a", "b"]);
    c1.assignor = Some("range".to_string());
    c2.assignor = Some("range".to_string());
    h.join(&mut c1);
    h.join(&mut c2);
    h.settle(&mut [&mut c1, &mut c2]);
    assert_eq!(c1.owned, assignment(&[(1, &[0, 1]), (2, &[0, 1])]));
    assert_eq!(c2.owned, assignment(&[(1, &[2]), (2, &[2])]));
    let d = h.coordinator.describe("g", &h.topics).unwrap();
    assert_eq!(d.assignor_name, "range");
}

#[test]
fn a_partition_moves_only_after_its_owner_revoked_it() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 4)]));
    let mut a = Client::new("a", &["a"]);
    let mut b = Client::new("b", &["a"]);
    h.join(&mut a);
    assert_eq!(count(&a.owned), 4);

    // b joins: epoch 2, but a still owns everything, so b gets nothing yet.
    let reply = h.join(&mut b);
    assert_eq!(reply.member_epoch, Epoch(2));
    assert_eq!(reply.assignment, Some(Assignment::new()));
    assert_eq!(
        h.group().member_state(b.member_id.as_str()),
        Some(MemberState::UnreleasedPartitions)
    );
    let b_target = h.group().target_assignment("b").unwrap().clone();
    assert_eq!(count(&b_target), 2);

    // a is told to keep two: it stays at epoch 1 until it has revoked.
    let still_owned = a.owned.clone();
    let reply = h.heartbeat(&mut a);
    assert_eq!(reply.member_epoch, Epoch(1));
    assert_eq!(count(reply.assignment.as_ref().unwrap()), 2);
    assert_eq!(
        h.group().member_state("a"),
        Some(MemberState::UnrevokedPartitions)
    );

    // A heartbeat that still reports the revoked partitions moves nothing.
    let mut slow = a.heartbeat_request();
    slow.owned_topic_partitions = Some(still_owned);
    let reply = h.send(slow).unwrap();
    assert_eq!(reply.member_epoch, Epoch(1));
    let reply = h.heartbeat(&mut b);
    assert_eq!(reply.assignment, None);
    assert!(b.owned.is_empty());
    for (t, ps) in &b_target {
        for &p in ps {
            assert_eq!(h.group().partition_owner(*t, p), Some(&MemberId::from("a")));
        }
    }

    // a reports only its two: it moves to epoch 2, and b gets the others.
    let reply = h.heartbeat(&mut a);
    assert_eq!(reply.member_epoch, Epoch(2));
    assert_eq!(h.group().member_state("a"), Some(MemberState::Stable));
    let reply = h.heartbeat(&mut b);
    assert_eq!(reply.assignment, Some(b_target));
    assert_eq!(h.group().member_state("b"), Some(MemberState::Stable));
    assert_eq!(h.group().state(), ConsumerGroupState::Stable);
    h.assert_no_partition_owned_twice();
}

#[test]
fn session_timeout_removes_the_member_and_bumps_the_epoch() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 4)]));
    let mut a = Client::new("a", &["a"]);
    let mut b = Client::new("b", &["a"]);
    h.join(&mut a);
    h.join(&mut b);
    h.settle(&mut [&mut a, &mut b]);
    let epoch = h.group().group_epoch();

    // a keeps heartbeating; b goes silent after its last heartbeat at 0.
    h.now_ms = 40_000;
    h.heartbeat(&mut a);
    assert_eq!(h.coordinator.next_deadline_ms(), Some(SESSION_MS));
    assert!(h.coordinator.tick(SESSION_MS - 1).is_empty());
    assert!(h.group().has_member("b"));
    assert_eq!(h.coordinator.tick(SESSION_MS), vec!["g".to_string()]);
    assert!(!h.group().has_member("b"));
    assert_eq!(h.group().group_epoch(), Epoch(epoch.0 + 1));

    h.now_ms = SESSION_MS;
    h.settle(&mut [&mut a]);
    assert_eq!(count(&a.owned), 4);
    assert_eq!(
        h.send(b.heartbeat_request()),
        Err(GroupError::UnknownMemberId)
    );
}

#[test]
fn a_member_that_does_not_revoke_within_its_rebalance_timeout_is_fenced() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 4)]));
    let mut a = Client::new("a", &["a"]);
    let mut b = Client::new("b", &["a"]);
    h.join(&mut a);
    h.now_ms = 1_000;
    h.join(&mut b);
    // a learns of the revocation at 2s but never lets go.
    h.now_ms = 2_000;
    let keep = a.owned.clone();
    h.heartbeat(&mut a);
    a.owned = keep;
    assert_eq!(
        h.group().member_state("a"),
        Some(MemberState::UnrevokedPartitions)
    );
    let deadline = 2_000 + i64::from(REBALANCE_MS);
    // Heartbeats keep its session alive but do not restart the timer.
    for t in (7_000..deadline).step_by(5_000) {
        h.now_ms = t;
        h.heartbeat(&mut a);
        h.heartbeat(&mut b);
        h.coordinator.tick(t);
    }
    assert!(h.group().has_member("a"));
    assert_eq!(h.coordinator.next_deadline_ms(), Some(deadline));
    h.coordinator.tick(deadline);
    assert!(!h.group().has_member("a"));
    h.now_ms = deadline;
    assert_eq!(
        h.send(a.heartbeat_request()),
        Err(GroupError::UnknownMemberId)
    );
    h.settle(&mut [&mut b]);
    assert_eq!(count(&b.owned), 4);

    // The fenced consumer rejoins under its own id with epoch 0.
    a.owned.clear();
    let reply = h.join(&mut a);
    assert!(reply.member_epoch > Epoch(0));
    h.settle(&mut [&mut a, &mut b]);
    assert_eq!(count(&a.owned), 2);
}

#[test]
fn a_revoking_member_that_moves_on_in_time_is_not_fenced() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 4)]));
    let mut a = Client::new("a", &["a"]);
    let mut b = Client::new("b", &["a"]);
    h.join(&mut a);
    h.join(&mut b);
    h.heartbeat(&mut a); // told to revoke
    h.now_ms = 1_000;
    h.heartbeat(&mut a); // revoked: epoch 2, timer cancelled
    assert_eq!(h.group().member_state("a"), Some(MemberState::Stable));
    h.now_ms = 5_000;
    h.heartbeat(&mut a);
    h.heartbeat(&mut b);
    h.coordinator.tick(1_000 + i64::from(REBALANCE_MS));
    assert!(h.group().has_member("a"));
}

#[test]
fn static_member_leaves_and_a_new_instance_takes_its_assignment_back() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 4)]));
    let mut s = Client::static_member("s1", "instance-1", &["a"]);
    let mut d = Client::new("d", &["a"]);
    h.join(&mut s);
    h.join(&mut d);
    h.settle(&mut [&mut s, &mut d]);
    let epoch = h.group().group_epoch();
    let s_owned = s.owned.clone();
    assert_eq!(count(&s_owned), 2);

    // Leaving with -2 keeps the assignment and does not bump the epoch.
    h.now_ms = 1_000;
    let mut leave = s.heartbeat_request();
    leave.member_epoch = Epoch::STATIC_LEAVE;
    let reply = h.send(leave).unwrap();
    assert_eq!(reply.member_epoch, Epoch::STATIC_LEAVE);
    assert_eq!(h.group().group_epoch(), epoch);
    assert_eq!(
        h.group().member_assignment("s1"),
        Some((Epoch::STATIC_LEAVE, &s_owned))
    );
    h.settle(&mut [&mut d]);
    assert_eq!(
        count(&d.owned),
        2,
        "d must not take the static member's partitions"
    );

    // The restarted process has a new member id and the same instance id.
    h.now_ms = 20_000;
    let mut s2 = Client::static_member("s2", "instance-1", &["a"]);
    let reply = h.join(&mut s2);
    assert_eq!(reply.member_epoch, epoch);
    assert_eq!(reply.assignment, Some(s_owned));
    assert_eq!(h.group().group_epoch(), epoch);
    assert!(!h.group().has_member("s1"));
    assert_eq!(
        h.group().static_member_id("instance-1"),
        Some(&MemberId::from("s2"))
    );
    assert_eq!(h.group().state(), ConsumerGroupState::Stable);

    // The old process is fenced by the new one.
    assert_eq!(
        h.send(s.heartbeat_request()),
        Err(GroupError::FencedInstanceId)
    );
}

#[test]
fn static_member_that_does_not_come_back_expires_with_its_session() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 2)]));
    let mut s = Client::static_member("s1", "instance-1", &["a"]);
    let mut d = Client::new("d", &["a"]);
    h.join(&mut s);
    h.join(&mut d);
    h.settle(&mut [&mut s, &mut d]);
    let epoch = h.group().group_epoch();
    let mut leave = s.heartbeat_request();
    leave.member_epoch = Epoch::STATIC_LEAVE;
    h.send(leave).unwrap();

    // d heartbeats on; s1's session runs from its last heartbeat at 0.
    h.now_ms = 30_000;
    h.heartbeat(&mut d);
    h.coordinator.tick(SESSION_MS);
    assert!(!h.group().has_member("s1"));
    assert_eq!(h.group().group_epoch(), Epoch(epoch.0 + 1));
    h.now_ms = SESSION_MS;
    h.settle(&mut [&mut d]);
    assert_eq!(count(&d.owned), 2);
}

#[test]
fn an_instance_id_in_use_cannot_join_again() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 2)]));
    let mut s = Client::static_member("s1", "instance-1", &["a"]);
    h.join(&mut s);
    let other = Client::static_member("s2", "instance-1", &["a"]);
    assert_eq!(
        h.send(other.join_request()),
        Err(GroupError::UnreleasedInstanceId)
    );
    // A static leave of an unknown instance, or by another member id.
    let mut leave = other.heartbeat_request();
    leave.member_epoch = Epoch::STATIC_LEAVE;
    assert_eq!(h.send(leave.clone()), Err(GroupError::FencedInstanceId));
    leave.instance_id = Some(GroupInstanceId::from("nobody"));
    assert_eq!(h.send(leave), Err(GroupError::UnknownMemberId));
}

#[test]
fn epochs_ahead_or_behind_are_fenced_but_a_lost_response_is_forgiven() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 4)]));
    let mut a = Client::new("a", &["a"]);
    let mut b = Client::new("b", &["a"]);
    h.join(&mut a);
    h.join(&mut b);
    h.settle(&mut [&mut a, &mut b]);
    assert_eq!(a.epoch, Epoch(2));

    let mut ahead = a.heartbeat_request();
    ahead.member_epoch = Epoch(3);
    assert_eq!(h.send(ahead), Err(GroupError::FencedMemberEpoch));

    // Epoch 1 was a's previous epoch and it owns a subset of its
    // partitions: the response that moved it to 2 may have been lost.
    let mut previous = a.heartbeat_request();
    previous.member_epoch = Epoch(1);
    assert_eq!(h.send(previous.clone()).unwrap().member_epoch, Epoch(2));
    // Not a subset: fenced.
    previous.owned_topic_partitions = Some(assignment(&[(1, &[0, 1, 2, 3])]));
    assert_eq!(h.send(previous), Err(GroupError::FencedMemberEpoch));

    let unknown = Client::new("ghost", &["a"]);
    let mut req = unknown.heartbeat_request();
    req.member_epoch = Epoch(2);
    assert_eq!(h.send(req.clone()), Err(GroupError::UnknownMemberId));
    req.member_epoch = Epoch::LEAVE;
    assert_eq!(h.send(req.clone()), Err(GroupError::UnknownMemberId));
    req.member_epoch = Epoch(2);
    assert_eq!(
        h.coordinator.heartbeat("other", req, &h.topics, 0),
        Err(GroupError::GroupIdNotFound)
    );
}

#[test]
fn malformed_heartbeats_are_invalid_requests() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 1)]));
    let c = Client::new("m", &["a"]);
    type Breaker = Box<dyn Fn(&mut ConsumerHeartbeat)>;
    let invalid: Vec<Breaker> = vec![
        Box::new(|r| r.rebalance_timeout_ms = -1),
        Box::new(|r| r.owned_topic_partitions = None),
        Box::new(|r| r.owned_topic_partitions = Some(assignment(&[(1, &[0])]))),
        Box::new(|r| r.subscribed_topic_names = None),
        // A join must subscribe somehow, and an empty regex is no regex.
        Box::new(|r| {
            r.subscribed_topic_names = None;
            r.subscribed_topic_regex = Some(String::new());
        }),
        Box::new(|r| r.instance_id = Some(GroupInstanceId::from(""))),
        Box::new(|r| r.rack_id = Some(String::new())),
        Box::new(|r| r.member_epoch = Epoch(-3)),
        Box::new(|r| {
            r.member_epoch = Epoch(1);
            r.member_id = MemberId::unknown();
        }),
        Box::new(|r| {
            r.member_epoch = Epoch::LEAVE;
            r.member_id = MemberId::unknown();
        }),
        Box::new(|r| r.member_epoch = Epoch::STATIC_LEAVE),
        Box::new(|r| {
            r.api_version = 1;
            r.member_id = MemberId::unknown();
        }),
    ];
    for (i, break_it) in invalid.iter().enumerate() {
        let mut req = c.join_request();
        break_it(&mut req);
        assert_eq!(h.send(req), Err(GroupError::InvalidRequest), "case {i}");
    }
    let mut req = c.join_request();
    req.server_assignor = Some("cooperative-sticky".to_string());
    assert_eq!(h.send(req), Err(GroupError::UnsupportedAssignor));
    assert_eq!(
        h.coordinator.heartbeat("", c.join_request(), &h.topics, 0),
        Err(GroupError::InvalidRequest)
    );
    assert!(h.coordinator.group("g").is_none());
}

#[test]
fn a_full_group_turns_new_members_away() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 2)]));
    h.coordinator = ConsumerGroupCoordinator::new(ConsumerGroupConfig {
        max_size: 1,
        ..ConsumerGroupConfig::default()
    });
    let mut a = Client::new("a", &["a"]);
    h.join(&mut a);
    let b = Client::new("b", &["a"]);
    assert_eq!(
        h.send(b.join_request()),
        Err(GroupError::GroupMaxSizeReached)
    );
    h.heartbeat(&mut a);
}

#[test]
fn offset_commits_must_carry_the_members_current_epoch() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 4)]));
    let c = &h.coordinator;
    assert_eq!(
        c.validate_offset_commit("g", &MemberId::unknown(), Epoch(-1), 9, false),
        Err(GroupError::GroupIdNotFound)
    );
    let mut a = Client::new("a", &["a"]);
    h.join(&mut a);
    let c = &h.coordinator;
    assert_eq!(
        c.validate_offset_commit("g", &a.member_id, Epoch(1), 9, false),
        Ok(())
    );
    assert_eq!(
        c.validate_offset_commit("g", &a.member_id, Epoch(0), 9, false),
        Err(GroupError::StaleMemberEpoch)
    );
    assert_eq!(
        c.validate_offset_commit("g", &a.member_id, Epoch(2), 9, false),
        Err(GroupError::StaleMemberEpoch)
    );
    assert_eq!(
        c.validate_offset_commit("g", &MemberId::from("x"), Epoch(1), 9, false),
        Err(GroupError::UnknownMemberId)
    );
    // Admin commits (-1, no member) are refused while the group has members.
    assert_eq!(
        c.validate_offset_commit("g", &MemberId::unknown(), Epoch(-1), 9, false),
        Err(GroupError::UnknownMemberId)
    );
    assert_eq!(
        c.validate_offset_commit("g", &a.member_id, Epoch(1), 8, false),
        Err(GroupError::UnsupportedVersion)
    );
    assert_eq!(
        c.validate_offset_commit("g", &a.member_id, Epoch(1), 8, true),
        Ok(())
    );
    assert_eq!(
        c.validate_offset_fetch("g", Some(&a.member_id), Epoch(0)),
        Err(GroupError::StaleMemberEpoch)
    );
    assert_eq!(c.validate_offset_fetch("g", None, Epoch(-1)), Ok(()));

    let mut leave = a.heartbeat_request();
    leave.member_epoch = Epoch::LEAVE;
    h.send(leave).unwrap();
    assert_eq!(
        h.coordinator
            .validate_offset_commit("g", &MemberId::unknown(), Epoch(-1), 9, false),
        Ok(())
    );
    assert_eq!(h.group().state(), ConsumerGroupState::Empty);
}

#[test]
fn growing_a_topic_bumps_the_epoch_and_assigns_the_new_partitions() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 4)]));
    let mut a = Client::new("a", &["a", "later"]);
    let mut b = Client::new("b", &["a", "later"]);
    h.join(&mut a);
    h.join(&mut b);
    h.settle(&mut [&mut a, &mut b]);
    let epoch = h.group().group_epoch();

    h.topics.set("a", 1, 6);
    h.heartbeat(&mut a);
    assert_eq!(h.group().group_epoch(), Epoch(epoch.0 + 1));
    h.settle(&mut [&mut a, &mut b]);
    assert_eq!(count(&a.owned) + count(&b.owned), 6);
    assert_eq!(count(&a.owned), 3);

    // A subscribed topic that did not exist appears.
    h.topics.set("later", 2, 2);
    h.settle(&mut [&mut a, &mut b]);
    assert_eq!(h.group().group_epoch(), Epoch(epoch.0 + 2));
    assert_eq!(count(&a.owned) + count(&b.owned), 8);
    assert_eq!(h.group().state(), ConsumerGroupState::Stable);
}

#[test]
fn describe_shows_epochs_states_and_both_assignments() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 2)]));
    assert_eq!(
        h.coordinator.describe("g", &h.topics),
        Err(GroupError::GroupIdNotFound)
    );
    let mut a = Client::new("a", &["a"]);
    let mut b = Client::new("b", &["a"]);
    h.join(&mut a);
    h.join(&mut b);
    let d = h.coordinator.describe("g", &h.topics).unwrap();
    assert_eq!(d.state, ConsumerGroupState::Reconciling);
    assert_eq!(d.state.as_str(), "Reconciling");
    assert_eq!((d.group_epoch, d.assignment_epoch), (Epoch(2), Epoch(2)));
    assert_eq!(d.assignor_name, "uniform");
    let da = &d.members[0];
    assert_eq!(da.member_id, MemberId::from("a"));
    assert_eq!(da.member_epoch, Epoch(1));
    assert_eq!(da.client_host, "/127.0.0.1");
    assert_eq!(da.subscribed_topic_names, vec!["a".to_string()]);
    assert_eq!(da.assignment[0].topic_name, "a");
    assert_eq!(da.assignment[0].partitions.len(), 2);
    assert_eq!(da.target_assignment[0].partitions.len(), 1);

    h.settle(&mut [&mut a, &mut b]);
    let d = h.coordinator.describe("g", &h.topics).unwrap();
    assert_eq!(d.state, ConsumerGroupState::Stable);
    assert!(d
        .members
        .iter()
        .all(|m| m.assignment == m.target_assignment));
}

#[test]
fn classic_and_consumer_groups_share_the_id_space_as_in_kafka() {
    use crate::group::{ClassicGroupConfig, GenerationId, GroupCoordinator};
    let mut classic = GroupCoordinator::new(ClassicGroupConfig::default());
    // An admin commit creates an empty classic ("simple") group.
    classic
        .validate_offset_commit("g", &MemberId::unknown(), None, GenerationId(-1), true, 0)
        .unwrap();
    assert_eq!(
        make_way_for_consumer_group(&mut classic, "g", Epoch(3), 0),
        Err(GroupError::GroupIdNotFound)
    );
    assert_eq!(
        make_way_for_consumer_group(&mut classic, "g", Epoch::JOIN, 0),
        Ok(())
    );
    assert!(classic.group("g").is_none());

    let mut h = Harness::new(Topics::with(&[("a", 1, 1)]));
    let mut a = Client::new("a", &["a"]);
    h.join(&mut a);
    assert_eq!(
        h.coordinator.make_way_for_classic_group("g"),
        Err(GroupError::InconsistentGroupProtocol)
    );
    assert_eq!(
        h.coordinator.delete_group("g"),
        Err(GroupError::NonEmptyGroup)
    );
    let mut leave = a.heartbeat_request();
    leave.member_epoch = Epoch::LEAVE;
    h.send(leave).unwrap();
    assert_eq!(h.coordinator.make_way_for_classic_group("g"), Ok(()));
    assert!(h.coordinator.group("g").is_none());
}

#[test]
fn config_defaults_are_kafkas_and_validate() {
    let c = ConsumerGroupConfig::default();
    assert_eq!(c.session_timeout_ms, 45_000);
    assert_eq!(c.heartbeat_interval_ms, 5_000);
    assert_eq!(
        c.assignors,
        vec![ServerAssignor::Uniform, ServerAssignor::Range]
    );
    assert_eq!(c.validate(), Ok(()));
    let bad = ConsumerGroupConfig {
        heartbeat_interval_ms: 45_000,
        ..c.clone()
    };
    assert!(matches!(
        bad.validate(),
        Err(ConsumerGroupConfigError::HeartbeatInterval { .. })
    ));
    let none = ConsumerGroupConfig {
        assignors: vec![],
        ..c
    };
    assert_eq!(none.validate(), Err(ConsumerGroupConfigError::NoAssignors));
    assert_eq!(
        ServerAssignor::from_name("org.apache.kafka.coordinator.group.assignor.RangeAssignor"),
        Some(ServerAssignor::Range)
    );
}

fn spec(member: &str, topics: &[u8], previous: Assignment) -> MemberSpec {
    MemberSpec {
        member_id: MemberId::from(member),
        instance_id: None,
        subscribed_topic_ids: topics.iter().map(|&t| tid(t)).collect(),
        previous,
    }
}

#[test]
fn uniform_with_different_subscriptions_balances_where_it_can() {
    // m1 and m2 read t1 (6 partitions); m3 reads t1 and t2 (2 partitions).
    let counts: BTreeMap<TopicId, i32> = [(tid(1), 6), (tid(2), 2)].into_iter().collect();
    let specs = vec![
        spec("m1", &[1], Assignment::new()),
        spec("m2", &[1], Assignment::new()),
        spec("m3", &[1, 2], Assignment::new()),
    ];
    let result = ServerAssignor::Uniform.assign(&specs, &counts);
    let loads: Vec<usize> = result.values().map(count).collect();
    assert_eq!(loads.iter().sum::<usize>(), 8);
    assert!(
        loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 1,
        "{result:?}"
    );
    assert_eq!(
        result[&MemberId::from("m3")]
            .get(&tid(2))
            .map(BTreeSet::len),
        Some(2)
    );
}

#[test]
fn range_puts_static_members_first_by_instance_id() {
    let counts: BTreeMap<TopicId, i32> = [(tid(1), 3)].into_iter().collect();
    let mut z = spec("aaa", &[1], Assignment::new());
    z.instance_id = Some(GroupInstanceId::from("i2"));
    let mut y = spec("zzz", &[1], Assignment::new());
    y.instance_id = Some(GroupInstanceId::from("i1"));
    let dynamic = spec("0-dynamic", &[1], Assignment::new());
    let result = ServerAssignor::Range.assign(&[z, y, dynamic], &counts);
    assert_eq!(result[&MemberId::from("zzz")], assignment(&[(1, &[0])]));
    assert_eq!(result[&MemberId::from("aaa")], assignment(&[(1, &[1])]));
    assert_eq!(
        result[&MemberId::from("0-dynamic")],
        assignment(&[(1, &[2])])
    );
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// The member joins with subscription number `.1` (see [`subscription`]).
        Join(usize, u8),
        Leave(usize),
        Heartbeat(usize),
        /// The member heartbeats but keeps what it was told to revoke.
        SlowHeartbeat(usize),
        GrowTopic(usize, i32),
        /// Creates topic t2 (which some regexes match) or x.
        CreateTopic(bool),
        Resubscribe(usize, u8),
        /// A static member leaves with -2 and a new process takes over.
        StaticBounce(usize),
        /// Time passes without heartbeats; timers fire.
        Advance(i64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..5usize, 0..SUBSCRIPTIONS).prop_map(|(i, s)| Op::Join(i, s)),
            1 => (0..5usize).prop_map(Op::Leave),
            6 => (0..5usize).prop_map(Op::Heartbeat),
            2 => (0..5usize).prop_map(Op::SlowHeartbeat),
            1 => (0..2usize, 1..4i32).prop_map(|(t, n)| Op::GrowTopic(t, n)),
            1 => any::<bool>().prop_map(Op::CreateTopic),
            1 => (0..5usize, 0..SUBSCRIPTIONS).prop_map(|(i, s)| Op::Resubscribe(i, s)),
            1 => (0..5usize).prop_map(Op::StaticBounce),
            1 => (1_000..50_000i64).prop_map(Op::Advance),
        ]
    }

    const SUBSCRIPTIONS: u8 = 5;

    /// Topic names and a regex: by names, by both, by regex only.
    fn subscription(kind: u8) -> (Vec<String>, Option<String>) {
        let (names, regex): (&[&str], Option<&str>) = match kind {
            0 => (&["t0"], None),
            1 => (&["t0", "t1"], None),
            2 => (&["t0"], Some("t1")),
            3 => (&[], Some(".*")),
            _ => (&[], Some("t[0-9]+")),
        };
        (
            names.iter().map(|n| n.to_string()).collect(),
            regex.map(str::to_string),
        )
    }

    /// What a client subscribes to now, as the test works it out: its names
    /// and the topics (internal ones too) its regex matches whole.
    fn expected_topics(c: &Client, topics: &Topics) -> BTreeSet<String> {
        let mut out: BTreeSet<String> = c.topics.iter().cloned().collect();
        if let Some(r) = &c.regex {
            let full = regex::Regex::new(&format!("^(?:{r})$")).unwrap();
            out.extend(topics.0.keys().filter(|n| full.is_match(n)).cloned());
        }
        out
    }

    /// No two members believe they own the same partition at once: the
    /// guarantee revoke-before-assign exists for. A client the coordinator
    /// has already removed (session or rebalance timeout) is a zombie until
    /// it hears so; Kafka gives its partitions away too, so it is left out.
    fn assert_clients_disjoint(h: &Harness, clients: &[Option<Client>]) {
        let mut seen = BTreeSet::new();
        let members = h.coordinator.group("g");
        for c in clients.iter().flatten() {
            if !members.is_some_and(|g| g.has_member(c.member_id.as_str())) {
                continue;
            }
            for (t, ps) in &c.owned {
                for p in ps {
                    assert!(seen.insert((*t, *p)), "{t}-{p} owned by two clients");
                }
            }
        }
    }

    /// Sends a heartbeat; a client told it is no longer a member drops its
    /// partitions and rejoins with epoch 0, as consumers do.
    fn send_or_rejoin(
        h: &mut Harness,
        c: &mut Client,
        req: ConsumerHeartbeat,
    ) -> Option<ConsumerHeartbeatReply> {
        match h.send(req) {
            Ok(reply) => Some(reply),
            Err(GroupError::UnknownMemberId | GroupError::FencedMemberEpoch) => {
                c.owned.clear();
                c.epoch = Epoch::JOIN;
                h.join(c);
                None
            }
            Err(e) => panic!("unexpected {e:?} for {c:?}"),
        }
    }

    fn run(ops: Vec<Op>, assignor: &str) {
        let mut h = Harness::new(Topics::with(&[
            ("t0", 1, 4),
            ("t1", 2, 3),
            ("__consumer_offsets", 9, 2),
        ]));
        let mut clients: Vec<Option<Client>> = vec![None; 5];
        // What a slow client was told to own and has not acted on yet; it
        // does so before its next normal heartbeat.
        let mut slow_targets: Vec<Option<Assignment>> = vec![None; 5];
        let mut generation = 0;
        for op in ops {
            match op {
                Op::Join(i, kind) => {
                    if clients[i].is_none() {
                        generation += 1;
                        let mut c = Client::static_member(
                            &format!("m{i}-{generation}"),
                            &format!("instance-{i}"),
                            &[],
                        );
                        (c.topics, c.regex) = subscription(kind);
                        if i % 2 == 0 {
                            c.instance_id = None;
                        }
                        c.assignor = Some(assignor.to_string());
                        h.join(&mut c);
                        clients[i] = Some(c);
                    }
                }
                Op::Leave(i) => {
                    slow_targets[i] = None;
                    if let Some(c) = clients[i].take() {
                        let mut req = c.heartbeat_request();
                        req.member_epoch = Epoch::LEAVE;
                        match h.send(req) {
                            Ok(_) | Err(GroupError::UnknownMemberId) => {}
                            Err(e) => panic!("leave: {e:?}"),
                        }
                    }
                }
                Op::Heartbeat(i) => {
                    if let Some(c) = clients[i].as_mut() {
                        if let Some(target) = slow_targets[i].take() {
                            c.owned = target;
                        }
                        let req = c.heartbeat_request();
                        if let Some(reply) = send_or_rejoin(&mut h, c, req) {
                            c.apply(&reply);
                        }
                    }
                }
                Op::SlowHeartbeat(i) => {
                    if let Some(c) = clients[i].as_mut() {
                        let req = c.heartbeat_request();
                        let Some(reply) = send_or_rejoin(&mut h, c, req) else {
                            slow_targets[i] = None;
                            continue;
                        };
                        // It keeps everything it owned and takes what is new.
                        c.epoch = reply.member_epoch;
                        if let Some(a) = reply.assignment {
                            slow_targets[i] = Some(a.clone());
                            for (t, ps) in a {
                                c.owned.entry(t).or_default().extend(ps);
                            }
                        }
                    }
                }
                Op::GrowTopic(t, n) => {
                    let name = format!("t{t}");
                    let m = h.topics.topic(&name).unwrap();
                    h.topics.set(&name, t as u8 + 1, m.partition_count + n);
                }
                Op::CreateTopic(matching) => {
                    let (name, id) = if matching { ("t2", 3) } else { ("x", 4) };
                    if h.topics.topic(name).is_none() {
                        h.topics.set(name, id, 2);
                    }
                }
                Op::Resubscribe(i, kind) => {
                    if let Some(c) = clients[i].as_mut() {
                        if let Some(target) = slow_targets[i].take() {
                            c.owned = target;
                        }
                        (c.topics, c.regex) = subscription(kind);
                        let mut req = c.heartbeat_request();
                        req.subscribed_topic_names = Some(c.topics.clone());
                        // "" clears a regex the member had.
                        req.subscribed_topic_regex = Some(c.regex.clone().unwrap_or_default());
                        if let Some(reply) = send_or_rejoin(&mut h, c, req) {
                            c.apply(&reply);
                        }
                    }
                }
                Op::StaticBounce(i) => {
                    let is_static = clients[i].as_ref().is_some_and(|c| c.instance_id.is_some());
                    if is_static {
                        slow_targets[i] = None;
                        let old = clients[i].take().unwrap();
                        let mut leave = old.heartbeat_request();
                        leave.member_epoch = Epoch::STATIC_LEAVE;
                        match h.send(leave) {
                            Ok(_) | Err(GroupError::UnknownMemberId) => {}
                            Err(e) => panic!("static leave: {e:?}"),
                        }
                        generation += 1;
                        let mut c = Client {
                            member_id: MemberId(format!("m{i}-{generation}")),
                            epoch: Epoch::JOIN,
                            owned: Assignment::new(),
                            ..old
                        };
                        h.join(&mut c);
                        clients[i] = Some(c);
                    }
                }
                Op::Advance(ms) => {
                    h.now_ms += ms;
                    h.coordinator.tick(h.now_ms);
                    // Nothing is left due: a driver sleeping until the next
                    // deadline never spins.
                    if let Some(next) = h.coordinator.next_deadline_ms() {
                        assert!(next > h.now_ms, "deadline {next} still due at {}", h.now_ms);
                    }
                }
            }
            h.assert_no_partition_owned_twice();
            assert_clients_disjoint(&h, &clients);
        }

        // Everyone acknowledges until nothing changes; then every subscribed
        // partition is assigned exactly once and the group is stable.
        for (c, target) in clients.iter_mut().zip(slow_targets) {
            if let (Some(c), Some(target)) = (c.as_mut(), target) {
                c.owned = target;
            }
        }
        // Zombies learn they were removed and rejoin.
        for c in clients.iter_mut().flatten() {
            if !h.group().has_member(c.member_id.as_str()) {
                c.owned.clear();
                c.epoch = Epoch::JOIN;
                h.join(c);
            }
        }
        let mut live: Vec<&mut Client> = clients.iter_mut().flatten().collect();
        h.settle(&mut live);
        let mut subscribed: BTreeSet<String> = BTreeSet::new();
        for c in clients.iter().flatten() {
            subscribed.extend(expected_topics(c, &h.topics));
        }
        let mut expected = BTreeSet::new();
        for name in &subscribed {
            let t = h.topics.topic(name).unwrap();
            expected.extend((0..t.partition_count).map(|p| (t.topic_id, p)));
        }
        let mut got = BTreeSet::new();
        for c in clients.iter().flatten() {
            let (epoch, assigned) = h.group().member_assignment(c.member_id.as_str()).unwrap();
            assert_eq!(&c.owned, assigned);
            assert_eq!(epoch, h.group().assignment_epoch());
            for (t, ps) in &c.owned {
                for p in ps {
                    assert!(got.insert((*t, *p)), "{t}-{p} assigned twice");
                }
            }
        }
        assert_eq!(got, expected);
        if clients.iter().flatten().next().is_some() {
            assert_eq!(h.group().state(), ConsumerGroupState::Stable);
        }
    }

    proptest! {
        #[test]
        fn uniform_never_owns_twice_and_converges(ops in proptest::collection::vec(op(), 1..60)) {
            run(ops, "uniform");
        }

        #[test]
        fn range_never_owns_twice_and_converges(ops in proptest::collection::vec(op(), 1..60)) {
            run(ops, "range");
        }

        /// With equal subscriptions the uniform assignor's loads differ by
        /// at most one, whatever the previous assignment was.
        #[test]
        fn uniform_homogeneous_is_balanced(
            members in 1..6usize,
            partitions in 0..20i32,
            previous in proptest::collection::vec((0..6usize, 0..20i32), 0..20),
        ) {
            let counts: BTreeMap<TopicId, i32> = [(tid(1), partitions)].into_iter().collect();
            let mut specs: Vec<MemberSpec> =
                (0..members).map(|i| spec(&format!("m{i}"), &[1], Assignment::new())).collect();
            let mut given = BTreeSet::new();
            for (m, p) in previous {
                if m < members && given.insert(p) {
                    specs[m].previous.entry(tid(1)).or_default().insert(p);
                }
            }
            let result = ServerAssignor::Uniform.assign(&specs, &counts);
            let loads: Vec<usize> = result.values().map(count).collect();
            prop_assert_eq!(loads.iter().sum::<usize>(), partitions as usize);
            prop_assert!(loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 1);
            // Sticky: a member keeps min(quota, what it had that still exists).
            let quota_floor = partitions as usize / members;
            for s in &specs {
                let had: BTreeSet<i32> = s.previous.get(&tid(1)).cloned().unwrap_or_default()
                    .into_iter().filter(|&p| p < partitions).collect();
                let now = result[&s.member_id].get(&tid(1)).cloned().unwrap_or_default();
                let kept = had.intersection(&now).count();
                prop_assert!(kept >= had.len().min(quota_floor));
            }
        }
    }
}

#[test]
fn a_restored_group_carries_on_where_it_stopped() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 4)]));
    let mut a = Client::new("a", &["a"]);
    let mut b = Client::static_member("b", "instance-b", &["a"]);
    h.join(&mut a);
    h.join(&mut b);
    // a is mid-revocation when the coordinator moves.
    h.heartbeat(&mut a);
    assert_eq!(
        h.group().member_state("a"),
        Some(MemberState::UnrevokedPartitions)
    );
    let snapshot = h.group().snapshot();

    let mut restored = Harness::new(h.topics.clone());
    restored.now_ms = 100_000;
    restored
        .coordinator
        .restore(snapshot.clone(), 100_000)
        .unwrap();
    assert_eq!(restored.group().snapshot(), snapshot);
    // Fresh timers: the session from now, the revocation from now.
    assert_eq!(
        restored.coordinator.next_deadline_ms(),
        Some(100_000 + i64::from(REBALANCE_MS))
    );
    restored.settle(&mut [&mut a, &mut b]);
    assert_eq!(count(&a.owned), 2);
    assert_eq!(count(&b.owned), 2);
    assert_eq!(restored.group().state(), ConsumerGroupState::Stable);

    // A snapshot that gives a partition to two members is refused.
    let mut broken = restored.group().snapshot();
    let stolen = broken.members[0].assigned_partitions.clone();
    broken.members[1]
        .assigned_partitions
        .entry(tid(1))
        .or_default()
        .extend(stolen.get(&tid(1)).cloned().unwrap_or_default());
    assert!(matches!(
        restored.coordinator.restore(broken, 0),
        Err(ConsumerGroupRestoreError::PartitionOwnedTwice { .. })
    ));
}

fn regex_client(member_id: &str, topics: &[&str], regex: &str) -> Client {
    Client {
        regex: Some(regex.to_string()),
        ..Client::new(member_id, topics)
    }
}

/// Topics a-1, a-2 and b of 2 partitions, and an internal topic of 3.
fn regex_topics() -> Topics {
    Topics::with(&[
        ("a-1", 1, 2),
        ("a-2", 2, 2),
        ("b", 3, 2),
        ("__consumer_offsets", 9, 3),
    ])
}

#[test]
fn a_regex_subscription_gets_the_partitions_of_every_matching_topic() {
    let mut h = Harness::new(regex_topics());
    let mut c = regex_client("m", &[], "a-.*");
    let reply = h.join(&mut c);
    assert_eq!(reply.member_epoch, Epoch(1));
    assert_eq!(c.owned, assignment(&[(1, &[0, 1]), (2, &[0, 1])]));
    let subscribed: Vec<String> = h.group().subscribed_topics().into_iter().collect();
    assert_eq!(subscribed, ["a-1", "a-2"]);

    let d = h.coordinator.describe("g", &h.topics).unwrap();
    assert_eq!(d.members[0].subscribed_topic_regex.as_deref(), Some("a-.*"));
    assert!(d.members[0].subscribed_topic_names.is_empty());

    // RE2/J's `matches()` needs the whole name to match: "a" is a prefix
    // of "a-1" and "a-2", not a match.
    let mut prefix = regex_client("p", &[], "a");
    h.join(&mut prefix);
    h.settle(&mut [&mut c, &mut prefix]);
    assert!(prefix.owned.is_empty());
    assert_eq!(count(&c.owned), 4);
}

#[test]
fn a_topic_created_later_that_matches_is_assigned_after_the_next_heartbeat() {
    let mut h = Harness::new(regex_topics());
    let mut c = regex_client("m", &[], "a-.*");
    h.join(&mut c);
    assert_eq!(h.group().group_epoch(), Epoch(1));

    // A topic the regex does not match changes nothing.
    h.topics.set("c-1", 4, 2);
    let reply = h.heartbeat(&mut c);
    assert_eq!(reply.assignment, None);
    assert_eq!(h.group().group_epoch(), Epoch(1));

    h.topics.set("a-3", 5, 1);
    let reply = h.heartbeat(&mut c);
    assert_eq!(h.group().group_epoch(), Epoch(2));
    assert_eq!(reply.member_epoch, Epoch(2));
    assert_eq!(
        reply.assignment,
        Some(assignment(&[(1, &[0, 1]), (2, &[0, 1]), (5, &[0])]))
    );

    // A deleted topic leaves the resolution, and the assignment, too.
    h.topics.0.remove("a-1");
    let reply = h.heartbeat(&mut c);
    assert_eq!(h.group().group_epoch(), Epoch(3));
    assert_eq!(
        reply.assignment,
        Some(assignment(&[(2, &[0, 1]), (5, &[0])]))
    );
}

#[test]
fn names_and_a_regex_subscribe_to_the_union() {
    let mut h = Harness::new(regex_topics());
    let mut both = regex_client("both", &["b"], "a-1");
    h.join(&mut both);
    assert_eq!(both.owned, assignment(&[(1, &[0, 1]), (3, &[0, 1])]));

    // A member subscribing by names only to what the regex also matches.
    let mut names = Client::new("names", &["a-1"]);
    h.join(&mut names);
    h.settle(&mut [&mut both, &mut names]);
    assert_eq!(count(&both.owned) + count(&names.owned), 4);

    // An empty regex clears it (Kafka's "SubscribedTopicRegex": ""): the
    // member keeps its names only, and the group moves to a new epoch.
    let epoch = h.group().group_epoch();
    let mut req = both.heartbeat_request();
    req.subscribed_topic_regex = Some(String::new());
    let reply = h.send(req).unwrap();
    both.apply(&reply);
    assert_eq!(h.group().group_epoch(), Epoch(epoch.0 + 1));
    h.settle(&mut [&mut both, &mut names]);
    assert_eq!(both.owned, assignment(&[(3, &[0, 1])]));
    assert_eq!(names.owned, assignment(&[(1, &[0, 1])]));
    let d = h.coordinator.describe("g", &h.topics).unwrap();
    assert!(d.members.iter().all(|m| m.subscribed_topic_regex.is_none()));
}

#[test]
fn an_invalid_regex_is_refused_and_changes_nothing() {
    let mut h = Harness::new(regex_topics());
    // The first join of a group: the group is not left behind.
    let bad = regex_client("m", &[], "a-(");
    assert_eq!(
        h.send(bad.join_request()),
        Err(GroupError::InvalidRegularExpression)
    );
    assert!(h.coordinator.group("g").is_none());
    assert_eq!(GroupError::InvalidRegularExpression.code(), 128);

    // Anchoring must not make an unbalanced pattern valid.
    let bad = regex_client("m", &[], "a-1)|(b");
    assert_eq!(
        h.send(bad.join_request()),
        Err(GroupError::InvalidRegularExpression)
    );

    // A member switching to an invalid regex keeps its subscription.
    let mut c = regex_client("m", &[], "a-.*");
    h.join(&mut c);
    let before = h.group().snapshot();
    let mut req = c.heartbeat_request();
    req.subscribed_topic_regex = Some("[a-".to_string());
    assert_eq!(h.send(req), Err(GroupError::InvalidRegularExpression));
    assert_eq!(h.group().snapshot(), before);
    let reply = h.heartbeat(&mut c);
    assert_eq!(reply.member_epoch, Epoch(1));
    assert_eq!(count(&c.owned), 4);
}

/// Kafka matches a regex against every topic name, internal ones too.
#[test]
fn a_regex_that_names_an_internal_topic_gets_it() {
    let mut h = Harness::new(regex_topics());
    let mut internal = regex_client("internal", &[], "__consumer_offsets");
    h.join(&mut internal);
    h.settle(&mut [&mut internal]);
    assert_eq!(internal.owned.get(&tid(9)).map(|p| p.len()), Some(3));
    assert_eq!(count(&internal.owned), 3);
    assert!(h.group().subscribed_topics().contains("__consumer_offsets"));
}

#[test]
fn a_restored_group_keeps_its_regex_subscriptions() {
    let mut h = Harness::new(regex_topics());
    let mut r = regex_client("r", &[], "a-.*");
    let mut n = Client::new("n", &["b"]);
    h.join(&mut r);
    h.join(&mut n);
    h.settle(&mut [&mut r, &mut n]);
    let snapshot = h.group().snapshot();
    let member = snapshot.members.iter().find(|m| m.member_id == r.member_id);
    assert_eq!(
        member.and_then(|m| m.subscribed_topic_regex.as_deref()),
        Some("a-.*")
    );

    let mut restored = Harness::new(h.topics.clone());
    restored.coordinator.restore(snapshot.clone(), 0).unwrap();
    assert_eq!(restored.group().snapshot(), snapshot);
    // The resolution comes back as it was: no new epoch without new topics.
    let epoch = restored.group().group_epoch();
    restored.settle(&mut [&mut r, &mut n]);
    assert_eq!(restored.group().group_epoch(), epoch);
    assert_eq!(count(&r.owned), 4);
    // ... and a matching topic created meanwhile is picked up.
    restored.topics.set("a-9", 7, 1);
    restored.settle(&mut [&mut r, &mut n]);
    assert_eq!(restored.group().group_epoch(), Epoch(epoch.0 + 1));
    assert_eq!(count(&r.owned), 5);

    let mut broken = snapshot;
    broken.members[0].subscribed_topic_regex = Some("(".to_string());
    assert!(matches!(
        restored.coordinator.restore(broken, 0),
        Err(ConsumerGroupRestoreError::InvalidRegularExpression { .. })
    ));
}

#[test]
fn transactional_commits_to_a_consumer_group_check_the_member_epoch() {
    let mut h = Harness::new(Topics::with(&[("a", 1, 4)]));
    assert_eq!(
        h.coordinator
            .validate_txn_offset_commit("g", &MemberId::unknown(), None, Epoch(1)),
        Err(GroupError::IllegalGeneration),
        "no such consumer group"
    );
    let mut a = Client::new("a", &["a"]);
    h.join(&mut a);
    let c = &h.coordinator;
    assert_eq!(
        c.validate_txn_offset_commit("g", &a.member_id, None, Epoch(1)),
        Ok(())
    );
    // TxnOffsetCommit before v6 has no STALE_MEMBER_EPOCH.
    assert_eq!(
        c.validate_txn_offset_commit("g", &a.member_id, None, Epoch(2)),
        Err(GroupError::IllegalGeneration)
    );
    assert_eq!(
        c.validate_txn_offset_commit("g", &MemberId::from("x"), None, Epoch(1)),
        Err(GroupError::UnknownMemberId)
    );
    // A producer that is not a member commits while the group has members,
    // unless it names an instance.
    assert_eq!(
        c.validate_txn_offset_commit("g", &MemberId::unknown(), None, Epoch(-1)),
        Ok(())
    );
    let instance = crate::group::GroupInstanceId::from("i");
    assert_eq!(
        c.validate_txn_offset_commit("g", &MemberId::unknown(), Some(&instance), Epoch(-1)),
        Err(GroupError::UnknownMemberId)
    );
}
