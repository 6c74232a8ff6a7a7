//! The classic group state machine driven by a fake clock: every test says
//! the time of each request, and timers fire only through `tick`.

use bytes::Bytes;

use super::*;

const SESSION_MS: i32 = 10_000;
const REBALANCE_MS: i32 = 30_000;
const DELAY_MS: i64 = 3_000;

fn config() -> ClassicGroupConfig {
    ClassicGroupConfig {
        initial_rebalance_delay_ms: DELAY_MS,
        ..ClassicGroupConfig::default()
    }
}

fn group() -> ClassicGroup {
    ClassicGroup::new("g", config(), 0)
}

/// Most tests are not about the initial rebalance delay: without it, the
/// first join phase completes at the first tick.
fn group_without_delay() -> ClassicGroup {
    ClassicGroup::new(
        "g",
        ClassicGroupConfig {
            initial_rebalance_delay_ms: 0,
            ..config()
        },
        0,
    )
}

fn protocol(name: &str, metadata: &str) -> Protocol {
    Protocol {
        name: name.to_string(),
        metadata: Bytes::from(metadata.to_string()),
    }
}

fn join_request(member_id: &str, instance_id: Option<&str>) -> JoinRequest {
    JoinRequest {
        member_id: MemberId::from(member_id),
        group_instance_id: instance_id.map(GroupInstanceId::from),
        client_id: "client".to_string(),
        client_host: "/127.0.0.1".to_string(),
        session_timeout_ms: SESSION_MS,
        rebalance_timeout_ms: REBALANCE_MS,
        protocol_type: "consumer".to_string(),
        protocols: vec![protocol("range", "meta")],
        requires_known_member_id: true,
        supports_skip_assignment: true,
    }
}

fn sync_request(member_id: &MemberId, generation: i32) -> SyncRequest {
    SyncRequest {
        member_id: member_id.clone(),
        group_instance_id: None,
        generation_id: GenerationId(generation),
        protocol_type: Some("consumer".to_string()),
        protocol_name: Some("range".to_string()),
        assignments: Vec::new(),
    }
}

fn heartbeat(member_id: &MemberId, generation: i32) -> HeartbeatRequest {
    HeartbeatRequest {
        member_id: member_id.clone(),
        group_instance_id: None,
        generation_id: GenerationId(generation),
    }
}

fn now_reply<T: std::fmt::Debug>(reply: Reply<T>) -> T {
    match reply {
        Reply::Now(r) => r,
        Reply::Parked(m) => panic!("expected an immediate reply, parked under {m}"),
    }
}

fn parked<T: std::fmt::Debug>(reply: &Reply<T>) -> MemberId {
    match reply {
        Reply::Parked(m) => m.clone(),
        Reply::Now(r) => panic!("expected a parked reply, got {r:?}"),
    }
}

/// First join of a dynamic member: MEMBER_ID_REQUIRED, then the join with
/// that id is parked. Returns the member id.
fn join_dynamic(g: &mut ClassicGroup, now_ms: i64) -> MemberId {
    let first = now_reply(g.join(join_request("", None), now_ms).reply);
    assert_eq!(first.error, Some(GroupError::MemberIdRequired));
    let out = g.join(join_request(first.member_id.as_str(), None), now_ms);
    assert_eq!(parked(&out.reply), first.member_id);
    first.member_id
}

/// Joins a static member (no MEMBER_ID_REQUIRED for those); returns the
/// parked member id.
fn join_static(g: &mut ClassicGroup, instance_id: &str, now_ms: i64) -> MemberId {
    let out = g.join(join_request("", Some(instance_id)), now_ms);
    parked(&out.reply)
}

/// A group made Stable at time 0 with the given members at generation 1,
/// the first the leader, everyone synced. Dynamic members get ids;
/// `Some(instance)` makes a static member.
fn stable_group(instances: &[Option<&str>]) -> (ClassicGroup, Vec<MemberId>) {
    let mut g = group_without_delay();
    let ids: Vec<MemberId> = instances
        .iter()
        .map(|i| match i {
            Some(instance) => join_static(&mut g, instance, 0),
            None => join_dynamic(&mut g, 0),
        })
        .collect();
    let done = g.tick(0);
    assert_eq!(done.joins.len(), ids.len());
    assert_eq!(g.state(), GroupState::CompletingRebalance);
    let mut leader_sync = sync_request(&ids[0], 1);
    leader_sync.group_instance_id = instances[0].map(GroupInstanceId::from);
    leader_sync.assignments = ids
        .iter()
        .map(|m| (m.clone(), Bytes::from(format!("assignment-of-{m}"))))
        .collect();
    let out = g.sync(leader_sync, 0);
    assert_eq!(out.completed.syncs.len(), 1);
    assert_eq!(g.state(), GroupState::Stable);
    for (id, instance) in ids.iter().zip(instances).skip(1) {
        let mut req = sync_request(id, 1);
        req.group_instance_id = instance.map(GroupInstanceId::from);
        let r = now_reply(g.sync(req, 0).reply);
        assert_eq!(r.error, None);
    }
    (g, ids)
}

#[test]
fn first_join_requires_member_id_then_join_completes_after_initial_delay() {
    let mut g = group();
    let first = now_reply(g.join(join_request("", None), 0).reply);
    assert_eq!(first.error, Some(GroupError::MemberIdRequired));
    assert_eq!(first.error_code(), 79);
    assert!(first.member_id.as_str().starts_with("client-"));
    assert!(g.is_pending_member(first.member_id.as_str()));
    assert_eq!(g.state(), GroupState::Empty);

    let out = g.join(join_request(first.member_id.as_str(), None), 100);
    assert_eq!(parked(&out.reply), first.member_id);
    assert!(out.completed.is_empty());
    assert_eq!(g.state(), GroupState::PreparingRebalance);
    assert_eq!(g.next_deadline_ms(), Some(100 + DELAY_MS));

    // The initial rebalance waits out its delay even with every member in.
    assert!(g.tick(100 + DELAY_MS - 1).is_empty());
    let done = g.tick(100 + DELAY_MS);
    let response = done
        .join_for(first.member_id.as_str())
        .expect("join completes");
    assert_eq!(response.error, None);
    assert_eq!(response.generation_id, GenerationId(1));
    assert_eq!(response.leader, first.member_id);
    assert_eq!(response.protocol_name.as_deref(), Some("range"));
    assert_eq!(response.protocol_type.as_deref(), Some("consumer"));
    assert_eq!(response.members.len(), 1);
    assert_eq!(response.members[0].metadata, Bytes::from("meta"));
    assert_eq!(g.state(), GroupState::CompletingRebalance);
}

#[test]
fn join_without_member_id_requirement_adds_member_at_once() {
    let mut g = group();
    let mut req = join_request("", None);
    req.requires_known_member_id = false;
    let out = g.join(req, 0);
    let id = parked(&out.reply);
    assert!(g.has_member(id.as_str()));
    assert_eq!(g.state(), GroupState::PreparingRebalance);
}

#[test]
fn two_members_get_one_leader_and_the_same_generation() {
    let mut g = group();
    let a = join_dynamic(&mut g, 0);
    let b = join_dynamic(&mut g, 10);
    // B joined during the delay, which therefore starts over once.
    assert!(g.tick(DELAY_MS).is_empty());
    let done = g.tick(2 * DELAY_MS);
    let ra = done.join_for(a.as_str()).unwrap();
    let rb = done.join_for(b.as_str()).unwrap();
    assert_eq!(ra.generation_id, GenerationId(1));
    assert_eq!(rb.generation_id, GenerationId(1));
    assert_eq!(ra.leader, a);
    assert_eq!(rb.leader, a);
    // Only the leader sees the members, to compute the assignment.
    assert_eq!(ra.members.len(), 2);
    assert!(rb.members.is_empty());
    assert_eq!(g.leader_id(), Some(&a));
}

#[test]
fn sync_distributes_the_leaders_assignment() {
    let mut g = group_without_delay();
    let a = join_dynamic(&mut g, 0);
    let b = join_dynamic(&mut g, 0);
    assert_eq!(g.tick(0).joins.len(), 2);

    // The follower's SyncGroup waits for the leader's.
    let out = g.sync(sync_request(&b, 1), DELAY_MS + 1);
    assert_eq!(parked(&out.reply), b);
    assert!(out.completed.is_empty());

    let mut leader = sync_request(&a, 1);
    leader.assignments = vec![
        (a.clone(), Bytes::from("p0")),
        (b.clone(), Bytes::from("p1")),
    ];
    let out = g.sync(leader, DELAY_MS + 2);
    assert_eq!(parked(&out.reply), a);
    assert_eq!(out.completed.syncs.len(), 2);
    assert_eq!(
        out.completed.sync_for(a.as_str()).unwrap().assignment,
        Bytes::from("p0")
    );
    let rb = out.completed.sync_for(b.as_str()).unwrap();
    assert_eq!(rb.assignment, Bytes::from("p1"));
    assert_eq!(rb.protocol_name.as_deref(), Some("range"));
    assert_eq!(g.state(), GroupState::Stable);

    // A late SyncGroup in Stable gets the stored assignment at once.
    let again = now_reply(g.sync(sync_request(&b, 1), DELAY_MS + 3).reply);
    assert_eq!(again.assignment, Bytes::from("p1"));
    let members: Vec<_> = g.members().map(|m| m.assignment.clone()).collect();
    assert_eq!(members, vec![Bytes::from("p0"), Bytes::from("p1")]);
}

#[test]
fn heartbeat_during_rebalance_returns_rebalance_in_progress() {
    let (mut g, ids) = stable_group(&[None, None]);
    assert_eq!(g.heartbeat(&heartbeat(&ids[1], 1), 4_000), Ok(()));
    // A new member starts a rebalance.
    join_dynamic(&mut g, 4_000);
    assert_eq!(g.state(), GroupState::PreparingRebalance);
    assert_eq!(
        g.heartbeat(&heartbeat(&ids[1], 1), 4_001),
        Err(GroupError::RebalanceInProgress)
    );
    let sync = now_reply(g.sync(sync_request(&ids[1], 1), 4_002).reply);
    assert_eq!(sync.error, Some(GroupError::RebalanceInProgress));
}

#[test]
fn stale_generation_gets_illegal_generation() {
    let (mut g, ids) = stable_group(&[None, None]);
    assert_eq!(
        g.heartbeat(&heartbeat(&ids[0], 0), 4_000),
        Err(GroupError::IllegalGeneration)
    );
    let sync = now_reply(g.sync(sync_request(&ids[0], 7), 4_000).reply);
    assert_eq!(sync.error, Some(GroupError::IllegalGeneration));
    assert_eq!(
        g.validate_offset_commit(&ids[0], None, GenerationId(0), false),
        Err(GroupError::IllegalGeneration)
    );
    assert_eq!(
        g.validate_offset_commit(&ids[0], None, GenerationId(1), false),
        Ok(())
    );
}

#[test]
fn unknown_member_gets_unknown_member_id() {
    let (mut g, _) = stable_group(&[None]);
    let nobody = MemberId::from("nobody");
    assert_eq!(
        g.heartbeat(&heartbeat(&nobody, 1), 4_000),
        Err(GroupError::UnknownMemberId)
    );
    let sync = now_reply(g.sync(sync_request(&nobody, 1), 4_000).reply);
    assert_eq!(sync.error, Some(GroupError::UnknownMemberId));
    let join = now_reply(g.join(join_request("nobody", None), 4_000).reply);
    assert_eq!(join.error, Some(GroupError::UnknownMemberId));
    // SyncGroup to a group with no members at all.
    let mut empty = group();
    let sync = now_reply(empty.sync(sync_request(&nobody, 0), 0).reply);
    assert_eq!(sync.error, Some(GroupError::UnknownMemberId));
}

#[test]
fn session_timeout_expiry_removes_the_member_and_rebalances() {
    let (mut g, ids) = stable_group(&[None, None]);
    let (a, b) = (&ids[0], &ids[1]);
    // Sessions restarted when the assignment was handed out at 0.
    assert_eq!(g.heartbeat(&heartbeat(a, 1), 8_000), Ok(()));
    assert!(g.tick(SESSION_MS as i64 - 1).is_empty());
    g.tick(SESSION_MS as i64);
    assert!(!g.has_member(b.as_str()));
    assert_eq!(g.state(), GroupState::PreparingRebalance);

    let t = SESSION_MS as i64 + 1;
    assert_eq!(
        g.heartbeat(&heartbeat(a, 1), t),
        Err(GroupError::RebalanceInProgress)
    );
    // The survivor rejoins; with everyone in, the join phase completes now.
    let out = g.join(join_request(a.as_str(), None), t);
    assert_eq!(parked(&out.reply), *a);
    let r = out.completed.join_for(a.as_str()).unwrap();
    assert_eq!(r.generation_id, GenerationId(2));
    assert_eq!(r.members.len(), 1);
}

#[test]
fn rebalance_timeout_drops_members_that_did_not_rejoin() {
    let (mut g, ids) = stable_group(&[None, None]);
    let (a, b) = (&ids[0], &ids[1]);
    // The leader rejoins (as consumers do on metadata changes): rebalance.
    let t0 = 5_000;
    let out = g.join(join_request(a.as_str(), None), t0);
    assert_eq!(parked(&out.reply), *a);
    assert_eq!(g.state(), GroupState::PreparingRebalance);

    // B keeps heartbeating (so its session stays alive) but never rejoins.
    let mut t = t0;
    while t < t0 + REBALANCE_MS as i64 {
        assert_eq!(
            g.heartbeat(&heartbeat(b, 1), t),
            Err(GroupError::RebalanceInProgress)
        );
        assert!(g.tick(t).is_empty());
        t += 3_000;
    }
    let done = g.tick(t0 + REBALANCE_MS as i64);
    let r = done.join_for(a.as_str()).expect("the join phase completes");
    assert_eq!(r.generation_id, GenerationId(2));
    assert_eq!(r.members.len(), 1);
    assert!(!g.has_member(b.as_str()));
    assert_eq!(
        g.heartbeat(&heartbeat(b, 1), t0 + REBALANCE_MS as i64),
        Err(GroupError::UnknownMemberId)
    );
}

#[test]
fn pending_sync_expiry_removes_members_that_never_synced() {
    let mut g = group_without_delay();
    let a = join_dynamic(&mut g, 0);
    let b = join_dynamic(&mut g, 0);
    g.tick(0);
    let mut leader = sync_request(&a, 1);
    leader.assignments = vec![(a.clone(), Bytes::from("p0"))];
    g.sync(leader, 0);
    assert_eq!(g.state(), GroupState::Stable);
    // B heartbeats but never syncs: after the rebalance timeout it is out.
    let mut t = 5_000;
    while t < REBALANCE_MS as i64 {
        assert_eq!(g.heartbeat(&heartbeat(&a, 1), t), Ok(()));
        assert_eq!(g.heartbeat(&heartbeat(&b, 1), t), Ok(()));
        assert!(g.tick(t).is_empty());
        t += 5_000;
    }
    assert!(g.has_member(b.as_str()));
    g.tick(REBALANCE_MS as i64);
    assert!(!g.has_member(b.as_str()));
    assert_eq!(g.state(), GroupState::PreparingRebalance);
}

#[test]
fn static_member_restart_keeps_generation_without_rebalance_and_fences_old_id() {
    let (mut g, ids) = stable_group(&[Some("a-1"), None]);
    let (old_a, b) = (ids[0].clone(), ids[1].clone());
    assert!(old_a.as_str().starts_with("a-1-"));

    // The instance restarts: it has lost its member id.
    let r = now_reply(g.join(join_request("", Some("a-1")), 5_000).reply);
    assert_eq!(r.error, None);
    assert_ne!(r.member_id, old_a);
    assert_eq!(r.generation_id, GenerationId(1));
    // It was the leader; a v9+ client is told to skip the assignment.
    assert_eq!(r.leader, r.member_id);
    assert!(r.skip_assignment);
    assert_eq!(r.members.len(), 2);
    assert_eq!(g.state(), GroupState::Stable);
    assert_eq!(g.generation_id(), GenerationId(1));
    assert_eq!(g.static_member_id("a-1"), Some(&r.member_id));
    assert_eq!(g.leader_id(), Some(&r.member_id));

    // The old incarnation is fenced; the new one gets its old assignment.
    let mut hb = heartbeat(&old_a, 1);
    hb.group_instance_id = Some(GroupInstanceId::from("a-1"));
    assert_eq!(g.heartbeat(&hb, 5_001), Err(GroupError::FencedInstanceId));
    let mut sync = sync_request(&r.member_id, 1);
    sync.group_instance_id = Some(GroupInstanceId::from("a-1"));
    let s = now_reply(g.sync(sync, 5_002).reply);
    assert_eq!(s.assignment, Bytes::from(format!("assignment-of-{old_a}")));
    // The other member never noticed.
    assert_eq!(g.heartbeat(&heartbeat(&b, 1), 5_003), Ok(()));
}

#[test]
fn static_restart_of_old_client_names_the_previous_leader() {
    let (mut g, ids) = stable_group(&[Some("a-1"), None]);
    let mut req = join_request("", Some("a-1"));
    req.supports_skip_assignment = false;
    let r = now_reply(g.join(req, 5_000).reply);
    // A client that cannot skip the assignment must not think it leads.
    assert_eq!(r.leader, ids[0]);
    assert!(!r.skip_assignment);
    assert!(r.members.is_empty());
    assert_eq!(g.state(), GroupState::Stable);
}

#[test]
fn static_restart_with_a_new_protocol_rebalances() {
    let (mut g, _) = stable_group(&[Some("a-1")]);
    let mut req = join_request("", Some("a-1"));
    req.protocols = vec![protocol("cooperative-sticky", "m"), protocol("range", "m")];
    let out = g.join(req, 5_000);
    let new_id = parked(&out.reply);
    // It is the only member and has rejoined: the join phase completes now.
    let r = out.completed.join_for(new_id.as_str()).unwrap();
    assert_eq!(r.generation_id, GenerationId(2));
    assert_eq!(r.protocol_name.as_deref(), Some("cooperative-sticky"));
}

#[test]
fn duplicate_static_instance_fences_the_parked_join() {
    let mut g = group();
    let first = join_static(&mut g, "a-1", 0);
    // A second process with the same instance id joins while the first's
    // JoinGroup is parked: the first is fenced.
    let out = g.join(join_request("", Some("a-1")), 100);
    let second = parked(&out.reply);
    let fenced = out.completed.join_for(first.as_str()).unwrap();
    assert_eq!(fenced.error, Some(GroupError::FencedInstanceId));
    assert_eq!(fenced.error_code(), 82);
    assert_eq!(g.num_members(), 1);
    let done = g.tick(DELAY_MS);
    assert_eq!(
        done.join_for(second.as_str()).unwrap().generation_id,
        GenerationId(1)
    );
}

#[test]
fn static_member_that_does_not_rejoin_keeps_its_place_until_its_session_ends() {
    let (mut g, ids) = stable_group(&[None, Some("b-1")]);
    let (a, b) = (&ids[0], &ids[1]);
    let t0 = 5_000;
    g.join(join_request(a.as_str(), None), t0);
    // B stays alive (heartbeats) but does not rejoin, as a static member
    // that is slow to restart would not.
    let mut hb = heartbeat(b, 1);
    hb.group_instance_id = Some(GroupInstanceId::from("b-1"));
    let mut t = t0;
    while t < t0 + REBALANCE_MS as i64 {
        assert_eq!(g.heartbeat(&hb, t), Err(GroupError::RebalanceInProgress));
        assert!(g.tick(t).is_empty());
        t += 3_000;
    }
    let done = g.tick(t0 + REBALANCE_MS as i64);
    // Dynamic members that miss the rebalance are removed; static ones stay.
    assert!(done.join_for(a.as_str()).is_some());
    assert!(g.has_member(b.as_str()));
    assert_eq!(g.generation_id(), GenerationId(2));
}

#[test]
fn leave_triggers_a_rebalance() {
    let (mut g, ids) = stable_group(&[None, None]);
    let (a, b) = (&ids[0], &ids[1]);
    let out = g.leave(
        &[LeaveMember {
            member_id: b.clone(),
            group_instance_id: None,
        }],
        5_000,
    );
    let responses = out.result.unwrap();
    assert_eq!(responses.len(), 1);
    assert_eq!(responses[0].error, None);
    assert_eq!(g.state(), GroupState::PreparingRebalance);
    assert_eq!(
        g.heartbeat(&heartbeat(a, 1), 5_001),
        Err(GroupError::RebalanceInProgress)
    );
    let out = g.join(join_request(a.as_str(), None), 5_002);
    assert_eq!(
        out.completed.join_for(a.as_str()).unwrap().generation_id,
        GenerationId(2)
    );
}

#[test]
fn last_leave_empties_the_group_and_then_it_can_be_deleted() {
    let (mut g, ids) = stable_group(&[None]);
    assert_eq!(g.validate_delete(), Err(GroupError::NonEmptyGroup));
    let out = g.leave(
        &[LeaveMember {
            member_id: ids[0].clone(),
            group_instance_id: None,
        }],
        5_000,
    );
    assert_eq!(out.result.unwrap()[0].error, None);
    assert_eq!(g.state(), GroupState::Empty);
    assert_eq!(g.num_members(), 0);
    assert_eq!(g.generation_id(), GenerationId(2));
    assert_eq!(g.protocol_name(), None);
    assert_eq!(g.next_deadline_ms(), None);
    // Admin clients may commit to an empty group with generation -1.
    assert_eq!(
        g.validate_offset_commit(&MemberId::unknown(), None, GenerationId(-1), false),
        Ok(())
    );

    assert_eq!(g.delete(5_001), Ok(()));
    assert_eq!(g.state(), GroupState::Dead);
    assert_eq!(g.validate_delete(), Err(GroupError::GroupIdNotFound));
    let r = now_reply(g.join(join_request("", None), 5_002).reply);
    assert_eq!(r.error, Some(GroupError::CoordinatorNotAvailable));
    assert_eq!(
        g.leave(&[], 5_003).result,
        Err(GroupError::CoordinatorNotAvailable)
    );
}

#[test]
fn batched_leave_by_member_id_and_instance_id() {
    let (mut g, ids) = stable_group(&[None, Some("b-1"), None]);
    let out = g.leave(
        &[
            LeaveMember {
                member_id: MemberId::unknown(),
                group_instance_id: Some(GroupInstanceId::from("b-1")),
            },
            LeaveMember {
                member_id: ids[2].clone(),
                group_instance_id: None,
            },
            LeaveMember {
                member_id: MemberId::unknown(),
                group_instance_id: Some(GroupInstanceId::from("nope")),
            },
            LeaveMember {
                member_id: MemberId::from("ghost"),
                group_instance_id: None,
            },
        ],
        5_000,
    );
    let errors: Vec<_> = out.result.unwrap().into_iter().map(|r| r.error).collect();
    assert_eq!(
        errors,
        vec![
            None,
            None,
            Some(GroupError::UnknownMemberId),
            Some(GroupError::UnknownMemberId)
        ]
    );
    assert_eq!(g.num_members(), 1);
    assert!(g.has_member(ids[0].as_str()));
    assert_eq!(g.static_member_id("b-1"), None);
    assert_eq!(g.state(), GroupState::PreparingRebalance);
}

#[test]
fn leave_with_a_stale_instance_id_is_fenced() {
    let (mut g, ids) = stable_group(&[Some("a-1")]);
    let out = g.leave(
        &[LeaveMember {
            member_id: MemberId::from("a-1-old"),
            group_instance_id: Some(GroupInstanceId::from("a-1")),
        }],
        5_000,
    );
    assert_eq!(
        out.result.unwrap()[0].error,
        Some(GroupError::FencedInstanceId)
    );
    assert!(g.has_member(ids[0].as_str()));
    assert_eq!(g.state(), GroupState::Stable);
}

#[test]
fn initial_rebalance_delay_extends_while_members_join() {
    let mut g = ClassicGroup::new(
        "g",
        ClassicGroupConfig {
            initial_rebalance_delay_ms: 3_000,
            ..ClassicGroupConfig::default()
        },
        0,
    );
    // Rebalance timeout 10 s: the delay may stretch to at most 10 s.
    let join = |g: &mut ClassicGroup, now_ms| {
        let first = now_reply(g.join(join_request("", None), now_ms).reply);
        let mut req = join_request(first.member_id.as_str(), None);
        req.rebalance_timeout_ms = 10_000;
        g.join(req, now_ms);
        first.member_id
    };
    let a = join(&mut g, 0);
    assert_eq!(g.next_deadline_ms(), Some(3_000));
    let b = join(&mut g, 2_000);
    // At 3 s a member has arrived since the delay began: wait 3 s more.
    assert!(g.tick(3_000).is_empty());
    assert_eq!(g.next_deadline_ms(), Some(6_000));
    let c = join(&mut g, 5_000);
    assert!(g.tick(6_000).is_empty());
    // 7 s of the 10 s remained after the first delay, 4 s after the second:
    // room for another 3 s. Nobody joins meanwhile, so the phase completes.
    assert_eq!(g.next_deadline_ms(), Some(9_000));
    let done = g.tick(9_000);
    assert_eq!(done.joins.len(), 3);
    for m in [&a, &b, &c] {
        assert_eq!(
            done.join_for(m.as_str()).unwrap().generation_id,
            GenerationId(1)
        );
    }
    assert_eq!(done.join_for(a.as_str()).unwrap().leader, a);
}

#[test]
fn initial_rebalance_delay_is_capped_by_the_rebalance_timeout() {
    let mut g = group();
    let mut t = 0;
    // A member joins every 2 s, for ever; rebalance timeout 30 s.
    let completed_at = loop {
        if t % 2_000 == 0 {
            join_dynamic(&mut g, t);
        }
        let done = g.tick(t);
        if !done.is_empty() {
            break t;
        }
        t += 1_000;
        assert!(t <= 60_000, "initial rebalance never completed");
    };
    assert_eq!(completed_at, REBALANCE_MS as i64);
    assert_eq!(g.state(), GroupState::CompletingRebalance);
}

#[test]
fn protocol_is_selected_by_vote_among_protocols_all_members_support() {
    let mut g = group_without_delay();
    let join_with = |g: &mut ClassicGroup, names: &[&str]| {
        let first = now_reply(g.join(join_request("", None), 0).reply);
        let mut req = join_request(first.member_id.as_str(), None);
        req.protocols = names.iter().map(|n| protocol(n, n)).collect();
        g.join(req, 0);
        first.member_id
    };
    let a = join_with(&mut g, &["range", "roundrobin"]);
    join_with(&mut g, &["roundrobin", "range"]);
    join_with(&mut g, &["roundrobin", "range", "sticky"]);
    let done = g.tick(0);
    let r = done.join_for(a.as_str()).unwrap();
    assert_eq!(r.protocol_name.as_deref(), Some("roundrobin"));
    // The leader gets each member's metadata for the chosen protocol.
    assert!(r.members.iter().all(|m| m.metadata == "roundrobin"));
}

#[test]
fn member_without_a_common_protocol_is_rejected() {
    let (mut g, _) = stable_group(&[None]);
    let mut req = join_request("", None);
    req.protocols = vec![protocol("sticky", "")];
    let r = now_reply(g.join(req, 5_000).reply);
    assert_eq!(r.error, Some(GroupError::InconsistentGroupProtocol));
    let mut req = join_request("", None);
    req.protocol_type = "connect".to_string();
    let r = now_reply(g.join(req, 5_000).reply);
    assert_eq!(r.error, Some(GroupError::InconsistentGroupProtocol));
    let mut empty = group();
    let mut req = join_request("", None);
    req.protocols.clear();
    let r = now_reply(empty.join(req, 0).reply);
    assert_eq!(r.error, Some(GroupError::InconsistentGroupProtocol));
}

#[test]
fn follower_rejoin_with_same_metadata_does_not_rebalance_but_new_metadata_does() {
    let (mut g, ids) = stable_group(&[None, None]);
    let b = &ids[1];
    let r = now_reply(g.join(join_request(b.as_str(), None), 5_000).reply);
    assert_eq!(r.error, None);
    assert_eq!(r.generation_id, GenerationId(1));
    assert_eq!(g.state(), GroupState::Stable);

    // Cooperative-sticky consumers rejoin with changed metadata (owned
    // partitions) after revoking: that is a rebalance the broker allows.
    let mut req = join_request(b.as_str(), None);
    req.protocols = vec![protocol("range", "owned: none")];
    let out = g.join(req, 5_001);
    assert_eq!(parked(&out.reply), *b);
    assert_eq!(g.state(), GroupState::PreparingRebalance);
}

#[test]
fn join_during_completing_rebalance_sends_parked_syncs_back_to_rejoin() {
    let mut g = group_without_delay();
    let a = join_dynamic(&mut g, 0);
    let b = join_dynamic(&mut g, 0);
    g.tick(0);
    let out = g.sync(sync_request(&b, 1), DELAY_MS);
    assert_eq!(parked(&out.reply), b);
    // Heartbeats between JoinGroup and SyncGroup are normal ones, but the
    // assignment is not known yet, so commits must wait.
    assert_eq!(g.heartbeat(&heartbeat(&a, 1), DELAY_MS), Ok(()));
    assert_eq!(
        g.validate_offset_commit(&a, None, GenerationId(1), false),
        Err(GroupError::RebalanceInProgress)
    );

    let first = now_reply(g.join(join_request("", None), DELAY_MS + 1).reply);
    let out = g.join(join_request(first.member_id.as_str(), None), DELAY_MS + 1);
    let rb = out.completed.sync_for(b.as_str()).unwrap();
    assert_eq!(rb.error, Some(GroupError::RebalanceInProgress));
    assert!(out.completed.sync_for(a.as_str()).is_none());
    assert_eq!(g.state(), GroupState::PreparingRebalance);
}

#[test]
fn pending_member_that_never_rejoins_expires_after_its_session() {
    let mut g = group();
    let first = now_reply(g.join(join_request("", None), 0).reply);
    assert_eq!(g.next_deadline_ms(), Some(SESSION_MS as i64));
    g.tick(SESSION_MS as i64);
    assert!(!g.is_pending_member(first.member_id.as_str()));
    let r = now_reply(
        g.join(
            join_request(first.member_id.as_str(), None),
            SESSION_MS as i64,
        )
        .reply,
    );
    assert_eq!(r.error, Some(GroupError::UnknownMemberId));
}

#[test]
fn member_whose_session_ends_during_a_rebalance_is_removed_and_the_join_completes() {
    let (mut g, ids) = stable_group(&[None]);
    let a = &ids[0];
    // A new member starts a rebalance; A neither rejoins nor heartbeats.
    let c = join_dynamic(&mut g, 5_000);
    assert!(g.tick(SESSION_MS as i64 - 1).is_empty());
    let done = g.tick(SESSION_MS as i64);
    assert!(!g.has_member(a.as_str()));
    let r = done.join_for(c.as_str()).unwrap();
    assert_eq!(r.leader, c);
    assert_eq!(r.generation_id, GenerationId(2));
}

#[test]
fn group_max_size_turns_away_extra_members() {
    let mut g = ClassicGroup::new(
        "g",
        ClassicGroupConfig {
            max_size: 1,
            ..config()
        },
        0,
    );
    join_dynamic(&mut g, 0);
    g.tick(DELAY_MS);
    let r = now_reply(g.join(join_request("", None), DELAY_MS).reply);
    assert_eq!(r.error, Some(GroupError::GroupMaxSizeReached));
}

#[test]
fn session_timeout_outside_the_broker_range_is_rejected() {
    let mut g = group();
    let mut req = join_request("", None);
    req.session_timeout_ms = 1_000;
    let r = now_reply(g.join(req, 0).reply);
    assert_eq!(r.error, Some(GroupError::InvalidSessionTimeout));
    let mut g = ClassicGroup::new("", config(), 0);
    let r = now_reply(g.join(join_request("", None), 0).reply);
    assert_eq!(r.error, Some(GroupError::InvalidGroupId));
}

#[test]
fn unload_answers_parked_requests_with_not_coordinator() {
    let mut g = group();
    let a = join_dynamic(&mut g, 0);
    let done = g.unload(1);
    assert_eq!(
        done.join_for(a.as_str()).unwrap().error,
        Some(GroupError::NotCoordinator)
    );
    assert_eq!(g.state(), GroupState::Dead);
    assert_eq!(g.next_deadline_ms(), None);
    assert_eq!(
        g.heartbeat(&heartbeat(&a, 0), 2),
        Err(GroupError::CoordinatorNotAvailable)
    );
}

#[test]
fn error_codes_match_kafka() {
    let table = [
        (GroupError::CoordinatorNotAvailable, 15),
        (GroupError::NotCoordinator, 16),
        (GroupError::IllegalGeneration, 22),
        (GroupError::InconsistentGroupProtocol, 23),
        (GroupError::InvalidGroupId, 24),
        (GroupError::UnknownMemberId, 25),
        (GroupError::InvalidSessionTimeout, 26),
        (GroupError::RebalanceInProgress, 27),
        (GroupError::NonEmptyGroup, 68),
        (GroupError::GroupIdNotFound, 69),
        (GroupError::MemberIdRequired, 79),
        (GroupError::GroupMaxSizeReached, 81),
        (GroupError::FencedInstanceId, 82),
    ];
    for (error, code) in table {
        assert_eq!(error.code(), code, "{error:?}");
    }
    assert_eq!(error_code(None), 0);
}

#[test]
fn config_validation_rejects_impossible_settings() {
    assert_eq!(ClassicGroupConfig::default().validate(), Ok(()));
    let bad = ClassicGroupConfig {
        min_session_timeout_ms: 10,
        max_session_timeout_ms: 5,
        ..ClassicGroupConfig::default()
    };
    assert!(matches!(
        bad.validate(),
        Err(ClassicGroupConfigError::SessionTimeoutRange { .. })
    ));
}

// ------------------------------------------------------------ GroupCoordinator

fn coordinator() -> GroupCoordinator {
    GroupCoordinator::new(ClassicGroupConfig {
        initial_rebalance_delay_ms: 0,
        ..config()
    })
}

#[test]
fn coordinator_creates_a_group_only_on_a_first_join() {
    let mut c = coordinator();
    let r = now_reply(c.join("g", join_request("someone", None), 0).reply);
    assert_eq!(r.error, Some(GroupError::UnknownMemberId));
    assert!(c.group("g").is_none());

    let mut bad = join_request("", None);
    bad.session_timeout_ms = 1;
    let r = now_reply(c.join("g", bad, 0).reply);
    assert_eq!(r.error, Some(GroupError::InvalidSessionTimeout));
    assert!(c.group("g").is_none());
    let r = now_reply(c.join("", join_request("", None), 0).reply);
    assert_eq!(r.error, Some(GroupError::InvalidGroupId));

    let first = now_reply(c.join("g", join_request("", None), 0).reply);
    assert_eq!(first.error, Some(GroupError::MemberIdRequired));
    let out = c.join("g", join_request(first.member_id.as_str(), None), 0);
    assert_eq!(parked(&out.reply), first.member_id);
    assert_eq!(c.next_deadline_ms(), Some(0));
    let ready = c.tick(0);
    assert_eq!(ready.len(), 1);
    assert_eq!(ready[0].0, "g");
    assert!(ready[0].1.join_for(first.member_id.as_str()).is_some());
}

#[test]
fn coordinator_answers_requests_for_missing_groups_as_unknown_member() {
    let mut c = coordinator();
    let m = MemberId::from("m");
    assert_eq!(
        c.heartbeat("nope", &heartbeat(&m, 1), 0),
        Err(GroupError::UnknownMemberId)
    );
    let s = now_reply(c.sync("nope", sync_request(&m, 1), 0).reply);
    assert_eq!(s.error, Some(GroupError::UnknownMemberId));
    assert_eq!(
        c.leave("nope", &[], 0).result,
        Err(GroupError::UnknownMemberId)
    );
    assert_eq!(c.delete_group("nope", 0), Err(GroupError::GroupIdNotFound));
}

#[test]
fn coordinator_offset_commit_to_missing_group() {
    let mut c = coordinator();
    let m = MemberId::from("m");
    assert_eq!(
        c.validate_offset_commit("g", &m, None, GenerationId(1), true, 0),
        Err(GroupError::GroupIdNotFound)
    );
    assert_eq!(
        c.validate_offset_commit("g", &m, None, GenerationId(1), false, 0),
        Err(GroupError::IllegalGeneration)
    );
    assert!(c.group("g").is_none());
    // Generation -1: a simple group is created and the commit accepted.
    assert_eq!(
        c.validate_offset_commit("g", &MemberId::unknown(), None, GenerationId(-1), true, 0),
        Ok(())
    );
    assert_eq!(
        c.group("g").map(ClassicGroup::state),
        Some(GroupState::Empty)
    );
    assert_eq!(c.delete_group("g", 1), Ok(()));
    assert!(c.group("g").is_none());
}

#[test]
fn coordinator_refuses_to_delete_a_group_with_members() {
    let mut c = coordinator();
    let first = now_reply(c.join("g", join_request("", None), 0).reply);
    c.join("g", join_request(first.member_id.as_str(), None), 0);
    assert_eq!(c.delete_group("g", 1), Err(GroupError::NonEmptyGroup));
    let ready = c.unload(&["g"], 2);
    assert_eq!(
        ready[0].1.join_for(first.member_id.as_str()).unwrap().error,
        Some(GroupError::NotCoordinator)
    );
    assert!(c.group("g").is_none());
}

// ------------------------------------------------------- randomized sequences

mod randomized {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Join { client: usize, protocols: u8 },
        Sync { client: usize, stale: bool },
        Heartbeat { client: usize },
        Leave { client: usize },
        AdminLeave { client: usize },
        Advance { ms: i64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..4usize, 0..4u8).prop_map(|(client, protocols)| Op::Join { client, protocols }),
            3 => (0..4usize, proptest::bool::weighted(0.1))
                .prop_map(|(client, stale)| Op::Sync { client, stale }),
            2 => (0..4usize).prop_map(|client| Op::Heartbeat { client }),
            1 => (0..4usize).prop_map(|client| Op::Leave { client }),
            1 => (0..2usize).prop_map(|client| Op::AdminLeave { client }),
            3 => (0..20_000i64).prop_map(|ms| Op::Advance { ms }),
        ]
    }

    /// What a client remembers, as a Kafka consumer does.
    #[derive(Clone, Debug, Default)]
    struct Client {
        member_id: MemberId,
        generation: i32,
    }

    /// Clients 0 and 1 are static members, 2 and 3 dynamic.
    fn instance_of(client: usize) -> Option<GroupInstanceId> {
        (client < 2).then(|| GroupInstanceId(format!("i{client}")))
    }

    fn protocols(variant: u8) -> Vec<Protocol> {
        match variant {
            0 => vec![protocol("range", "a")],
            1 => vec![protocol("range", "b")],
            2 => vec![protocol("cooperative-sticky", "a"), protocol("range", "a")],
            _ => vec![protocol("roundrobin", "a")],
        }
    }

    #[derive(Default)]
    struct Harness {
        clients: [Client; 4],
        /// Parked requests not answered yet, (is_sync, member id), and the
        /// client that sent each.
        outstanding: HashMap<(bool, MemberId), usize>,
        /// How far the run got, to see that the sequences reach the
        /// interesting states.
        max_generation: i32,
        stable_seen: bool,
    }

    impl Harness {
        fn on_join(&mut self, client: usize, r: &JoinResponse) {
            let c = &mut self.clients[client];
            match r.error {
                None | Some(GroupError::MemberIdRequired) => {
                    c.member_id = r.member_id.clone();
                    c.generation = r.generation_id.0;
                }
                Some(GroupError::UnknownMemberId) | Some(GroupError::FencedInstanceId) => {
                    c.member_id = MemberId::unknown();
                    c.generation = -1;
                }
                Some(_) => {}
            }
        }

        fn deliver(&mut self, completed: &Completions) {
            for (member_id, r) in &completed.joins {
                let Some(client) = self.outstanding.remove(&(false, member_id.clone())) else {
                    panic!("unexpected JoinGroup response for {member_id}: {r:?}");
                };
                // A client that restarted meanwhile ignores the answer to
                // its previous incarnation.
                if self.clients[client].member_id == *member_id
                    || self.clients[client].member_id.is_unknown()
                {
                    self.on_join(client, r);
                }
                self.max_generation = self.max_generation.max(r.generation_id.0);
            }
            for (member_id, r) in &completed.syncs {
                assert!(
                    self.outstanding
                        .remove(&(true, member_id.clone()))
                        .is_some(),
                    "unexpected SyncGroup response for {member_id}: {r:?}"
                );
            }
        }
    }

    /// Runs the operations; returns the highest generation and whether the
    /// group was ever Stable.
    fn run(ops: Vec<Op>) -> (i32, bool) {
        let mut g = ClassicGroup::new(
            "g",
            ClassicGroupConfig {
                initial_rebalance_delay_ms: 3_000,
                ..ClassicGroupConfig::default()
            },
            0,
        );
        let mut h = Harness::default();
        let mut now = 0i64;
        for op in ops {
            match op {
                Op::Join {
                    client,
                    protocols: p,
                } => {
                    let mut req = join_request(h.clients[client].member_id.as_str(), None);
                    req.group_instance_id = instance_of(client);
                    req.protocols = protocols(p);
                    req.rebalance_timeout_ms = 15_000;
                    let out = g.join(req, now);
                    match &out.reply {
                        Reply::Now(r) => h.on_join(client, r),
                        Reply::Parked(m) => {
                            h.outstanding.insert((false, m.clone()), client);
                        }
                    }
                    h.deliver(&out.completed);
                }
                Op::Sync { client, stale } => {
                    let c = h.clients[client].clone();
                    let mut req = sync_request(&c.member_id, c.generation - i32::from(stale));
                    req.group_instance_id = instance_of(client);
                    req.protocol_name = None;
                    req.assignments = h
                        .clients
                        .iter()
                        .map(|c| (c.member_id.clone(), Bytes::from("x")))
                        .collect();
                    let out = g.sync(req, now);
                    if let Reply::Parked(m) = &out.reply {
                        h.outstanding.insert((true, m.clone()), client);
                    }
                    h.deliver(&out.completed);
                }
                Op::Heartbeat { client } => {
                    let c = h.clients[client].clone();
                    let mut req = heartbeat(&c.member_id, c.generation);
                    req.group_instance_id = instance_of(client);
                    let _ = g.heartbeat(&req, now);
                }
                Op::Leave { client } => {
                    let c = h.clients[client].clone();
                    let out = g.leave(
                        &[LeaveMember {
                            member_id: c.member_id,
                            group_instance_id: instance_of(client),
                        }],
                        now,
                    );
                    h.deliver(&out.completed);
                }
                Op::AdminLeave { client } => {
                    let out = g.leave(
                        &[LeaveMember {
                            member_id: MemberId::unknown(),
                            group_instance_id: instance_of(client),
                        }],
                        now,
                    );
                    h.deliver(&out.completed);
                }
                Op::Advance { ms } => {
                    now += ms;
                    let completed = g.tick(now);
                    h.deliver(&completed);
                }
            }
            g.assert_invariants();
            h.stable_seen |= g.state() == GroupState::Stable;
            // What would be stored now restores to a sound group that
            // stores the same thing.
            let stored = g.group_metadata();
            let restored = ClassicGroup::from_group_metadata(
                "g",
                ClassicGroupConfig::default(),
                stored.clone(),
                now,
            );
            restored.assert_invariants();
            if matches!(g.state(), GroupState::Stable | GroupState::Empty) {
                assert_eq!(restored.group_metadata(), stored);
            }
        }

        // Left alone, every group drains: parked requests are answered and
        // silent members time out, until the group is empty.
        let end = now + 3_600_000;
        while let Some(deadline) = g.next_deadline_ms() {
            assert!(deadline <= end, "a deadline beyond an hour of silence");
            now = now.max(deadline);
            let completed = g.tick(now);
            h.deliver(&completed);
            g.assert_invariants();
        }
        assert_eq!(g.state(), GroupState::Empty);
        assert!(
            h.outstanding.is_empty(),
            "never answered: {:?}",
            h.outstanding
        );
        (h.max_generation, h.stable_seen)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn random_sequences_keep_invariants_and_drain(ops in proptest::collection::vec(op(), 0..80)) {
            run(ops);
        }
    }

    /// The random sequences are only worth something if they reach
    /// rebalances and Stable groups; check that they do, with a fixed seed.
    #[test]
    fn random_sequences_reach_stable_groups_and_later_generations() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
        let mut runner = TestRunner::new_with_rng(
            Config::default(),
            TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
        );
        let strategy = proptest::collection::vec(op(), 40..80);
        let (mut stable_runs, mut max_generation) = (0, 0);
        for _ in 0..200 {
            let ops = strategy.new_tree(&mut runner).unwrap().current();
            let (generation, stable) = run(ops);
            stable_runs += usize::from(stable);
            max_generation = max_generation.max(generation);
        }
        assert!(
            stable_runs >= 20,
            "only {stable_runs} of 200 runs became Stable"
        );
        assert!(
            max_generation >= 3,
            "generations stayed at {max_generation}"
        );
    }
}

// ------------------------------------------------------------ stored metadata

#[test]
fn calls_that_change_stored_metadata_say_so() {
    let mut g = group_without_delay();
    let first = g.join(join_request("", None), 0);
    assert!(
        first.completed.group_metadata_changed,
        "a new group is stored"
    );
    let a = now_reply(first.reply).member_id;
    let out = g.join(join_request(a.as_str(), None), 0);
    assert!(!out.completed.group_metadata_changed);
    assert!(!g.tick(0).group_metadata_changed);
    let mut leader = sync_request(&a, 1);
    leader.assignments = vec![(a.clone(), Bytes::from("p0"))];
    let out = g.sync(leader, 1);
    assert!(
        out.completed.group_metadata_changed,
        "the assignment is stored"
    );
    assert_eq!(g.heartbeat(&heartbeat(&a, 1), 2), Ok(()));
    let out = g.leave(
        &[LeaveMember {
            member_id: a,
            group_instance_id: None,
        }],
        3,
    );
    assert!(
        out.completed.group_metadata_changed,
        "an empty generation is stored"
    );

    let (mut g, _) = stable_group(&[Some("a-1")]);
    let out = g.join(join_request("", Some("a-1")), 5_000);
    assert!(
        out.completed.group_metadata_changed,
        "a static member's new id is stored"
    );
}

#[test]
fn group_restored_from_its_metadata_carries_on_without_a_rebalance() {
    let (g, ids) = stable_group(&[Some("a-1"), None]);
    let stored = g.group_metadata();
    assert_eq!(stored.generation_id, GenerationId(1));
    assert_eq!(stored.leader.as_ref(), Some(&ids[0]));
    assert_eq!(stored.members.len(), 2);
    assert_eq!(stored.members[1].subscription, Bytes::from("meta"));

    let mut r = ClassicGroup::from_group_metadata("g", config(), stored.clone(), 1_000);
    assert_eq!(r.state(), GroupState::Stable);
    assert_eq!(r.generation_id(), GenerationId(1));
    assert_eq!(r.protocol_name(), Some("range"));
    assert_eq!(r.leader_id(), Some(&ids[0]));
    assert_eq!(r.static_member_id("a-1"), Some(&ids[0]));
    assert_eq!(r.group_metadata(), stored);
    // Sessions start at the restore.
    assert_eq!(r.next_deadline_ms(), Some(1_000 + SESSION_MS as i64));
    assert_eq!(r.heartbeat(&heartbeat(&ids[1], 1), 2_000), Ok(()));
    let s = now_reply(r.sync(sync_request(&ids[1], 1), 2_000).reply);
    assert_eq!(
        s.assignment,
        Bytes::from(format!("assignment-of-{}", ids[1]))
    );
    // A static member restarting across the coordinator restart keeps its
    // place too.
    let j = now_reply(r.join(join_request("", Some("a-1")), 2_001).reply);
    assert_eq!(j.error, None);
    assert_eq!(j.generation_id, GenerationId(1));
    assert_eq!(r.state(), GroupState::Stable);
    // Silent members time out as usual.
    r.tick(2_000 + SESSION_MS as i64);
    assert!(!r.has_member(ids[1].as_str()));
    assert_eq!(r.state(), GroupState::PreparingRebalance);
    r.tick(2_001 + SESSION_MS as i64);
    assert_eq!(r.state(), GroupState::Empty);
}

#[test]
fn restored_group_over_max_size_rebalances() {
    let (g, _) = stable_group(&[None, None]);
    let r = ClassicGroup::from_group_metadata(
        "g",
        ClassicGroupConfig {
            max_size: 1,
            ..config()
        },
        g.group_metadata(),
        1_000,
    );
    assert_eq!(r.state(), GroupState::PreparingRebalance);

    let empty = ClassicGroup::from_group_metadata("g", config(), group().group_metadata(), 1_000);
    assert_eq!(empty.state(), GroupState::Empty);
    assert_eq!(empty.next_deadline_ms(), None);
}

#[test]
fn transactional_commits_check_members_but_let_a_producer_outside_the_group_commit() {
    let mut c = coordinator();
    let (g, ids) = stable_group(&[None, Some("static")]);
    c.insert_loaded(g);
    let unknown = MemberId::unknown();
    assert_eq!(
        c.validate_txn_offset_commit("g", &ids[0], None, GenerationId(1), 0),
        Ok(())
    );
    assert_eq!(
        c.validate_txn_offset_commit("g", &ids[0], None, GenerationId(0), 0),
        Err(GroupError::IllegalGeneration)
    );
    assert_eq!(
        c.validate_txn_offset_commit("g", &MemberId::from("x"), None, GenerationId(1), 0),
        Err(GroupError::UnknownMemberId)
    );
    let fenced = GroupInstanceId::from("static");
    assert_eq!(
        c.validate_txn_offset_commit("g", &ids[0], Some(&fenced), GenerationId(1), 0),
        Err(GroupError::FencedInstanceId)
    );
    // An OffsetCommit without a member is refused by a group with members;
    // a transactional one (TxnOffsetCommit v0-2 carry no member) is not.
    assert_eq!(
        c.validate_offset_commit("g", &unknown, None, GenerationId(-1), false, 0),
        Err(GroupError::UnknownMemberId)
    );
    assert_eq!(
        c.validate_txn_offset_commit("g", &unknown, None, GenerationId(-1), 0),
        Ok(())
    );
    // A missing group: a generation is ILLEGAL_GENERATION, -1 makes a
    // simple group.
    assert_eq!(
        c.validate_txn_offset_commit("h", &ids[0], None, GenerationId(1), 0),
        Err(GroupError::IllegalGeneration)
    );
    assert_eq!(
        c.validate_txn_offset_commit("h", &unknown, None, GenerationId(-1), 0),
        Ok(())
    );
    assert_eq!(
        c.group("h").map(ClassicGroup::state),
        Some(GroupState::Empty)
    );
}

#[test]
fn a_rebalance_in_progress_does_not_refuse_a_transactional_commit() {
    let mut c = coordinator();
    let (mut g, ids) = stable_group(&[None, None]);
    // A rejoin with new metadata moves the group to PreparingRebalance,
    // then CompletingRebalance once both rejoined.
    for id in &ids {
        let mut req = join_request(id.as_str(), None);
        req.protocols = vec![protocol("range", "new")];
        let _ = g.join(req, 0);
    }
    let _ = g.tick(0);
    assert_eq!(g.state(), GroupState::CompletingRebalance);
    c.insert_loaded(g);
    assert_eq!(
        c.validate_offset_commit("g", &ids[0], None, GenerationId(2), false, 0),
        Err(GroupError::RebalanceInProgress)
    );
    assert_eq!(
        c.validate_txn_offset_commit("g", &ids[0], None, GenerationId(2), 0),
        Ok(())
    );
}
