//! Consumer groups over the wire: the classic protocol's request flow,
//! committed offsets and their storage in `__consumer_offsets`. The state
//! machine's rules are tested without sockets in `src/group/tests.rs`;
//! these tests check the wiring, the parked responses and persistence.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use common::{start, Client};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::ResponseError;

const NONE: i16 = 0;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn gid(v: &str) -> GroupId {
    GroupId(s(v))
}

/// A consumer's subscription metadata (ConsumerProtocolSubscription v0).
fn subscription(topics: &[&str]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    ConsumerProtocolSubscription::default()
        .with_topics(topics.iter().map(|t| s(t)).collect())
        .encode(&mut b, 0)
        .unwrap();
    b.freeze()
}

fn join_request(group: &str, member_id: &str, instance: Option<&str>) -> JoinGroupRequest {
    let mut p = join_group_request::JoinGroupRequestProtocol::default();
    p.name = s("range");
    p.metadata = subscription(&["orders"]);
    JoinGroupRequest::default()
        .with_group_id(gid(group))
        .with_session_timeout_ms(10_000)
        .with_rebalance_timeout_ms(10_000)
        .with_member_id(s(member_id))
        .with_group_instance_id(instance.map(s))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![p])
}

async fn join(c: &mut Client, group: &str, member_id: &str) -> JoinGroupResponse {
    c.call(ApiKey::JoinGroup, 9, &join_request(group, member_id, None))
        .await
}

/// A dynamic member's first join: MEMBER_ID_REQUIRED, then the real join.
async fn join_new(c: &mut Client, group: &str) -> JoinGroupResponse {
    let first = join(c, group, "").await;
    assert_eq!(first.error_code, ResponseError::MemberIdRequired.code());
    assert!(!first.member_id.is_empty());
    join(c, group, &first.member_id).await
}

async fn sync(
    c: &mut Client,
    group: &str,
    member_id: &str,
    generation: i32,
    assignments: &[(&str, &[u8])],
) -> SyncGroupResponse {
    let assignments = assignments
        .iter()
        .map(|(m, a)| {
            let mut x = sync_group_request::SyncGroupRequestAssignment::default();
            x.member_id = s(m);
            x.assignment = Bytes::copy_from_slice(a);
            x
        })
        .collect();
    c.call(
        ApiKey::SyncGroup,
        5,
        &SyncGroupRequest::default()
            .with_group_id(gid(group))
            .with_generation_id(generation)
            .with_member_id(s(member_id))
            .with_protocol_type(Some(s("consumer")))
            .with_protocol_name(Some(s("range")))
            .with_assignments(assignments),
    )
    .await
}

async fn heartbeat(c: &mut Client, group: &str, member_id: &str, generation: i32) -> i16 {
    let r: HeartbeatResponse = c
        .call(
            ApiKey::Heartbeat,
            4,
            &HeartbeatRequest::default()
                .with_group_id(gid(group))
                .with_generation_id(generation)
                .with_member_id(s(member_id)),
        )
        .await;
    r.error_code
}

async fn commit(
    c: &mut Client,
    group: &str,
    member_id: &str,
    generation: i32,
    topic: &str,
    offsets: &[(i32, i64)],
) -> Vec<i16> {
    commit_at(c, 8, group, member_id, generation, topic, offsets).await
}

async fn commit_at(
    c: &mut Client,
    version: i16,
    group: &str,
    member_id: &str,
    generation: i32,
    topic: &str,
    offsets: &[(i32, i64)],
) -> Vec<i16> {
    let mut t = offset_commit_request::OffsetCommitRequestTopic::default();
    t.name = TopicName(s(topic));
    t.partitions = offsets
        .iter()
        .map(|&(p, o)| {
            let mut x = offset_commit_request::OffsetCommitRequestPartition::default();
            x.partition_index = p;
            x.committed_offset = o;
            x.committed_leader_epoch = 0;
            x.committed_metadata = Some(s(&format!("meta-{o}")));
            x
        })
        .collect();
    let r: OffsetCommitResponse = c
        .call(
            ApiKey::OffsetCommit,
            version,
            &OffsetCommitRequest::default()
                .with_group_id(gid(group))
                .with_generation_id_or_member_epoch(generation)
                .with_member_id(s(member_id))
                .with_topics(vec![t]),
        )
        .await;
    r.topics[0]
        .partitions
        .iter()
        .map(|p| p.error_code)
        .collect()
}

/// (partition, committed offset, metadata) for the requested partitions.
async fn fetch_offsets(
    c: &mut Client,
    group: &str,
    topic: &str,
    partitions: &[i32],
) -> Vec<(i32, i64, String)> {
    let mut t = offset_fetch_request::OffsetFetchRequestTopics::default();
    t.name = TopicName(s(topic));
    t.partition_indexes = partitions.to_vec();
    let mut g = offset_fetch_request::OffsetFetchRequestGroup::default();
    g.group_id = gid(group);
    g.topics = Some(vec![t]);
    let r: OffsetFetchResponse = c
        .call(
            ApiKey::OffsetFetch,
            9,
            &OffsetFetchRequest::default().with_groups(vec![g]),
        )
        .await;
    assert_eq!(r.groups[0].error_code, NONE);
    r.groups[0]
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter())
        .map(|p| {
            assert_eq!(p.error_code, NONE);
            (
                p.partition_index,
                p.committed_offset,
                p.metadata
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default(),
            )
        })
        .collect()
}

async fn find_coordinator(c: &mut Client, group: &str) -> FindCoordinatorResponse {
    c.call(
        ApiKey::FindCoordinator,
        6,
        &FindCoordinatorRequest::default().with_coordinator_keys(vec![s(group)]),
    )
    .await
}

async fn describe(c: &mut Client, group: &str) -> describe_groups_response::DescribedGroup {
    let r: DescribeGroupsResponse = c
        .call(
            ApiKey::DescribeGroups,
            5,
            &DescribeGroupsRequest::default().with_groups(vec![gid(group)]),
        )
        .await;
    r.groups.into_iter().next().unwrap()
}

const FAST: &[(&str, &str)] = &[
    ("group.initial.rebalance.delay.ms", "0"),
    ("offsets.topic.num.partitions", "3"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_coordinator_creates_the_offsets_topic_and_names_this_broker() {
    let b = start(FAST).await;
    let mut c = Client::connect(b.running.local_addr).await;
    let r = find_coordinator(&mut c, "g").await;
    assert_eq!(r.coordinators.len(), 1);
    let co = &r.coordinators[0];
    assert_eq!(co.error_code, NONE);
    assert_eq!(co.key.as_str(), "g");
    assert_eq!(co.node_id.0, 1);
    assert_eq!(co.port, i32::from(b.running.local_addr.port()));
    // v0-3 answer one key in the top-level fields.
    let old: FindCoordinatorResponse = c
        .call(
            ApiKey::FindCoordinator,
            2,
            &FindCoordinatorRequest::default().with_key(s("g")),
        )
        .await;
    assert_eq!((old.error_code, old.node_id.0), (NONE, 1));
    // The topic is internal and compacted, with the configured partitions.
    let meta: MetadataResponse = c
        .call(
            ApiKey::Metadata,
            12,
            &MetadataRequest::default().with_topics(None),
        )
        .await;
    let t = meta
        .topics
        .iter()
        .find(|t| t.name.as_ref().map(|n| n.as_str()) == Some("__consumer_offsets"))
        .expect("offsets topic exists");
    assert!(t.is_internal);
    assert_eq!(t.partitions.len(), 3);
    // A transactional id's coordinator is found the same way (and creates
    // `__transaction_state`).
    let txn: FindCoordinatorResponse = c
        .call(
            ApiKey::FindCoordinator,
            6,
            &FindCoordinatorRequest::default()
                .with_key_type(1)
                .with_coordinator_keys(vec![s("tx")]),
        )
        .await;
    assert_eq!(
        (
            txn.coordinators[0].error_code,
            txn.coordinators[0].node_id.0
        ),
        (NONE, 1)
    );
    // Only the broker writes its internal topics.
    let produced = c
        .produce(
            "__consumer_offsets",
            0,
            1,
            common::batch(&["x"], kafka_protocol::records::Compression::None, None),
        )
        .await;
    assert_eq!(
        produced.error_code,
        ResponseError::InvalidTopicException.code()
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_rebalance_commit_and_leave() {
    let b = start(FAST).await;
    let addr = b.running.local_addr;
    let mut a = Client::connect(addr).await;
    assert_eq!(a.create_topic("orders", 2, &[]).await, NONE);
    find_coordinator(&mut a, "g").await;

    // A alone: leader of generation 1.
    let ja = join_new(&mut a, "g").await;
    assert_eq!(ja.error_code, NONE);
    assert_eq!(ja.generation_id, 1);
    assert_eq!(ja.leader, ja.member_id);
    assert_eq!(ja.members.len(), 1);
    let a_id = ja.member_id.to_string();
    let sa = sync(&mut a, "g", &a_id, 1, &[(&a_id, b"all")]).await;
    assert_eq!((sa.error_code, &sa.assignment[..]), (NONE, &b"all"[..]));
    assert_eq!(heartbeat(&mut a, "g", &a_id, 1).await, NONE);
    assert_eq!(
        commit(&mut a, "g", &a_id, 1, "orders", &[(0, 5), (1, 7)]).await,
        vec![NONE, NONE]
    );

    // B joins: its join waits until A rejoins (A learns of the rebalance from
    // its heartbeat), then both are in generation 2.
    let b_task = tokio::spawn(async move {
        let mut bc = Client::connect(addr).await;
        let jb = join_new(&mut bc, "g").await;
        (bc, jb)
    });
    let mut rebalancing = false;
    for _ in 0..100 {
        match heartbeat(&mut a, "g", &a_id, 1).await {
            0 => tokio::time::sleep(Duration::from_millis(20)).await,
            code => {
                assert_eq!(code, ResponseError::RebalanceInProgress.code());
                rebalancing = true;
                break;
            }
        }
    }
    assert!(rebalancing, "A never heard of the rebalance");
    // A commit from the old generation during the rebalance is still
    // accepted (Kafka allows it while PreparingRebalance)...
    let ja2 = join(&mut a, "g", &a_id).await;
    let (mut bc, jb) = b_task.await.unwrap();
    assert_eq!((ja2.error_code, jb.error_code), (NONE, NONE));
    assert_eq!((ja2.generation_id, jb.generation_id), (2, 2));
    assert_eq!(ja2.members.len(), 2, "the leader sees both members");
    let b_id = jb.member_id.to_string();
    // ...but not after it: generation 1 is stale now.
    assert_eq!(
        commit(&mut a, "g", &a_id, 1, "orders", &[(0, 6)]).await,
        vec![ResponseError::IllegalGeneration.code()]
    );
    // The follower's sync waits for the leader's assignment.
    let b_sync = tokio::spawn(async move {
        let r = sync(&mut bc, "g", &b_id, 2, &[]).await;
        (bc, b_id, r)
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let sa2 = sync(
        &mut a,
        "g",
        &a_id,
        2,
        &[(&a_id, b"p0"), (jb.member_id.as_str(), b"p1")],
    )
    .await;
    let (mut bc, b_id, sb2) = b_sync.await.unwrap();
    assert_eq!(&sa2.assignment[..], b"p0");
    assert_eq!(&sb2.assignment[..], b"p1");
    assert_eq!(
        commit(&mut bc, "g", &b_id, 2, "orders", &[(1, 9)]).await,
        vec![NONE]
    );
    assert_eq!(
        fetch_offsets(&mut a, "g", "orders", &[0, 1]).await,
        vec![(0, 5, "meta-5".into()), (1, 9, "meta-9".into())]
    );

    let d = describe(&mut a, "g").await;
    assert_eq!(d.group_state.as_str(), "Stable");
    assert_eq!(d.protocol_data.as_str(), "range");
    assert_eq!(d.members.len(), 2);
    assert!(d
        .members
        .iter()
        .all(|m| m.client_host.starts_with("/127.0.0.1")));

    let listed: ListGroupsResponse = a
        .call(
            ApiKey::ListGroups,
            5,
            &ListGroupsRequest::default().with_states_filter(vec![s("stable")]),
        )
        .await;
    assert_eq!(listed.groups.len(), 1);
    assert_eq!(listed.groups[0].group_type.as_str(), "classic");
    let none: ListGroupsResponse = a
        .call(
            ApiKey::ListGroups,
            5,
            &ListGroupsRequest::default().with_states_filter(vec![s("Empty")]),
        )
        .await;
    assert!(none.groups.is_empty());

    // A non-empty group cannot be deleted, nor its offsets for a topic it
    // is subscribed to.
    let del: DeleteGroupsResponse = a
        .call(
            ApiKey::DeleteGroups,
            2,
            &DeleteGroupsRequest::default().with_groups_names(vec![gid("g")]),
        )
        .await;
    assert_eq!(
        del.results[0].error_code,
        ResponseError::NonEmptyGroup.code()
    );
    let mut p = offset_delete_request::OffsetDeleteRequestPartition::default();
    p.partition_index = 0;
    let mut t = offset_delete_request::OffsetDeleteRequestTopic::default();
    t.name = TopicName(s("orders"));
    t.partitions = vec![p];
    let od: OffsetDeleteResponse = a
        .call(
            ApiKey::OffsetDelete,
            0,
            &OffsetDeleteRequest::default()
                .with_group_id(gid("g"))
                .with_topics(vec![t.clone()]),
        )
        .await;
    assert_eq!(od.error_code, NONE);
    assert_eq!(
        od.topics[0].partitions[0].error_code,
        ResponseError::GroupSubscribedToTopic.code()
    );

    // Both leave (one batched LeaveGroup): the group is Empty, and then its
    // offsets can be deleted, then the group.
    let members = [&a_id, &jb.member_id.to_string()]
        .iter()
        .map(|m| {
            let mut x = leave_group_request::MemberIdentity::default();
            x.member_id = s(m);
            x
        })
        .collect();
    let left: LeaveGroupResponse = a
        .call(
            ApiKey::LeaveGroup,
            5,
            &LeaveGroupRequest::default()
                .with_group_id(gid("g"))
                .with_members(members),
        )
        .await;
    assert_eq!(left.error_code, NONE);
    assert!(left.members.iter().all(|m| m.error_code == NONE));
    assert_eq!(describe(&mut a, "g").await.group_state.as_str(), "Empty");
    let od: OffsetDeleteResponse = a
        .call(
            ApiKey::OffsetDelete,
            0,
            &OffsetDeleteRequest::default()
                .with_group_id(gid("g"))
                .with_topics(vec![t]),
        )
        .await;
    assert_eq!(od.topics[0].partitions[0].error_code, NONE);
    assert_eq!(
        fetch_offsets(&mut a, "g", "orders", &[0, 1]).await,
        vec![(0, -1, String::new()), (1, 9, "meta-9".into())]
    );
    let del: DeleteGroupsResponse = a
        .call(
            ApiKey::DeleteGroups,
            2,
            &DeleteGroupsRequest::default().with_groups_names(vec![gid("g")]),
        )
        .await;
    assert_eq!(del.results[0].error_code, NONE);
    assert_eq!(describe(&mut a, "g").await.group_state.as_str(), "Dead");
    assert_eq!(
        fetch_offsets(&mut a, "g", "orders", &[1]).await,
        vec![(1, -1, String::new())]
    );
    b.running.shutdown().await;
}

/// A commit before any FindCoordinator (so before `__consumer_offsets`
/// exists) cannot be stored: COORDINATOR_NOT_AVAILABLE sends the client to
/// look the coordinator up, which creates the topic; then it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_before_the_offsets_topic_exists_is_retriable() {
    let b = start(FAST).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("orders", 1, &[]).await, NONE);
    assert_eq!(
        commit(&mut c, "early", "", -1, "orders", &[(0, 4)]).await,
        vec![ResponseError::CoordinatorNotAvailable.code()]
    );
    // No coordinator exists yet, so there is nobody to answer a fetch either.
    let mut g = offset_fetch_request::OffsetFetchRequestGroup::default();
    g.group_id = gid("early");
    let r: OffsetFetchResponse = c
        .call(
            ApiKey::OffsetFetch,
            9,
            &OffsetFetchRequest::default().with_groups(vec![g]),
        )
        .await;
    assert_eq!(
        r.groups[0].error_code,
        ResponseError::CoordinatorNotAvailable.code()
    );
    find_coordinator(&mut c, "early").await;
    assert_eq!(
        commit(&mut c, "early", "", -1, "orders", &[(0, 4)]).await,
        vec![NONE]
    );
    assert_eq!(fetch_offsets(&mut c, "early", "orders", &[0]).await[0].1, 4);
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_errors_are_per_partition_and_per_group() {
    let b = start(FAST).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("orders", 1, &[]).await, NONE);
    find_coordinator(&mut c, "simple").await;
    // An unknown topic or partition is refused by itself; the rest commits.
    let mut t = offset_commit_request::OffsetCommitRequestTopic::default();
    t.name = TopicName(s("orders"));
    let mut good = offset_commit_request::OffsetCommitRequestPartition::default();
    good.committed_offset = 3;
    let mut bad = good.clone();
    bad.partition_index = 7;
    let mut big = good.clone();
    big.committed_metadata = Some(s(&"m".repeat(5000)));
    t.partitions = vec![good, bad, big];
    let r: OffsetCommitResponse = c
        .call(
            ApiKey::OffsetCommit,
            9,
            &OffsetCommitRequest::default()
                .with_group_id(gid("simple"))
                .with_generation_id_or_member_epoch(-1)
                .with_topics(vec![t]),
        )
        .await;
    let codes: Vec<i16> = r.topics[0]
        .partitions
        .iter()
        .map(|p| p.error_code)
        .collect();
    assert_eq!(
        codes,
        vec![
            NONE,
            ResponseError::UnknownTopicOrPartition.code(),
            ResponseError::OffsetMetadataTooLarge.code()
        ]
    );
    // A member of a group that does not exist: v9 says so, older versions
    // answer ILLEGAL_GENERATION as Kafka does.
    assert_eq!(
        commit(&mut c, "nobody-home", "m", 3, "orders", &[(0, 1)]).await,
        vec![ResponseError::IllegalGeneration.code()]
    );
    // A simple group with a member id that is not in it.
    assert_eq!(
        commit(&mut c, "simple", "stranger", 1, "orders", &[(0, 1)]).await,
        vec![ResponseError::UnknownMemberId.code()]
    );
    assert_eq!(
        heartbeat(&mut c, "simple", "stranger", 1).await,
        ResponseError::UnknownMemberId.code()
    );
    // Offsets of a deleted topic go with it.
    assert_eq!(
        fetch_offsets(&mut c, "simple", "orders", &[0]).await,
        vec![(0, 3, String::new())]
    );
    let del: DeleteTopicsResponse = c
        .call(
            ApiKey::DeleteTopics,
            5,
            &DeleteTopicsRequest::default().with_topic_names(vec![TopicName(s("orders"))]),
        )
        .await;
    assert_eq!(del.responses[0].error_code, NONE);
    assert_eq!(
        fetch_offsets(&mut c, "simple", "orders", &[0]).await,
        vec![(0, -1, String::new())]
    );
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_and_group_membership_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::config(dir.path(), FAST);
    let running = broker::start(cfg.clone()).await.unwrap();
    let mut c = Client::connect(running.local_addr).await;
    assert_eq!(c.create_topic("orders", 2, &[]).await, NONE);
    find_coordinator(&mut c, "g").await;
    let j = join_new(&mut c, "g").await;
    let member = j.member_id.to_string();
    assert_eq!(
        sync(&mut c, "g", &member, 1, &[(&member, b"both")])
            .await
            .error_code,
        NONE
    );
    assert_eq!(
        commit(&mut c, "g", &member, 1, "orders", &[(0, 11), (1, 22)]).await,
        vec![NONE, NONE]
    );
    assert_eq!(
        commit(&mut c, "g", &member, 1, "orders", &[(1, 23)]).await,
        vec![NONE]
    );
    running.shutdown().await;

    let running = broker::start(cfg).await.unwrap();
    let mut c = Client::connect(running.local_addr).await;
    assert_eq!(
        fetch_offsets(&mut c, "g", "orders", &[0, 1]).await,
        vec![(0, 11, "meta-11".into()), (1, 23, "meta-23".into())]
    );
    // The member and its generation came back with the group: it goes on
    // heartbeating without a rebalance.
    assert_eq!(heartbeat(&mut c, "g", &member, 1).await, NONE);
    let d = describe(&mut c, "g").await;
    assert_eq!(d.group_state.as_str(), "Stable");
    assert_eq!(&d.members[0].member_assignment[..], b"both");
    running.shutdown().await;
}

async fn consumer_heartbeat(
    c: &mut Client,
    group: &str,
    member_id: &str,
    epoch: i32,
    owned: Option<Vec<(uuid::Uuid, Vec<i32>)>>,
) -> ConsumerGroupHeartbeatResponse {
    let mut r = ConsumerGroupHeartbeatRequest::default()
        .with_group_id(gid(group))
        .with_member_id(s(member_id))
        .with_member_epoch(epoch)
        .with_rebalance_timeout_ms(10_000);
    if epoch == 0 {
        r.subscribed_topic_names = Some(vec![TopicName(s("orders"))]);
        // As librdkafka sends it: an empty regex that means none.
        r.subscribed_topic_regex = Some(s(""));
    }
    r.topic_partitions = owned.map(|o| {
        o.into_iter()
            .map(|(topic_id, partitions)| {
                let mut tp = consumer_group_heartbeat_request::TopicPartitions::default();
                tp.topic_id = topic_id;
                tp.partitions = partitions;
                tp
            })
            .collect()
    });
    c.call(ApiKey::ConsumerGroupHeartbeat, 1, &r).await
}

fn assigned(r: &ConsumerGroupHeartbeatResponse) -> Vec<(uuid::Uuid, Vec<i32>)> {
    r.assignment
        .as_ref()
        .map(|a| {
            a.topic_partitions
                .iter()
                .map(|tp| (tp.topic_id, tp.partitions.clone()))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kip848_members_get_server_side_assignments_and_epoch_checked_commits() {
    let b = start(FAST).await;
    let mut a = Client::connect(b.running.local_addr).await;
    let mut bc = Client::connect(b.running.local_addr).await;
    assert_eq!(a.create_topic("orders", 4, &[]).await, NONE);
    find_coordinator(&mut a, "g848").await;
    let a_id = uuid::Uuid::new_v4().to_string();
    let b_id = uuid::Uuid::new_v4().to_string();

    // A alone gets all four partitions at epoch 1.
    let ra = consumer_heartbeat(&mut a, "g848", &a_id, 0, Some(vec![])).await;
    assert_eq!(ra.error_code, NONE);
    assert_eq!(ra.member_epoch, 1);
    let a_parts = assigned(&ra);
    assert_eq!(a_parts.len(), 1);
    assert_eq!(a_parts[0].1.len(), 4);
    let ra = consumer_heartbeat(&mut a, "g848", &a_id, 1, Some(a_parts.clone())).await;
    assert_eq!(ra.error_code, NONE);

    // B joins: epoch 2. B gets nothing until A has revoked what moves.
    let rb = consumer_heartbeat(&mut bc, "g848", &b_id, 0, Some(vec![])).await;
    assert_eq!(rb.error_code, NONE);
    assert!(assigned(&rb).iter().all(|(_, p)| p.is_empty()));
    let ra = consumer_heartbeat(&mut a, "g848", &a_id, 1, Some(a_parts.clone())).await;
    let a_keep = assigned(&ra);
    assert_eq!(a_keep[0].1.len(), 2, "A is told to keep two");
    // A reports the revocation; B then receives the other two.
    let ra = consumer_heartbeat(&mut a, "g848", &a_id, ra.member_epoch, Some(a_keep.clone())).await;
    assert_eq!(ra.member_epoch, 2);
    let rb = consumer_heartbeat(&mut bc, "g848", &b_id, rb.member_epoch, Some(vec![])).await;
    let b_parts = assigned(&rb);
    assert_eq!(b_parts[0].1.len(), 2);
    let mut all: Vec<i32> = a_keep[0].1.iter().chain(&b_parts[0].1).copied().collect();
    all.sort();
    assert_eq!(all, vec![0, 1, 2, 3]);

    // Commits carry the member epoch: the current one is accepted, an old
    // one is STALE_MEMBER_EPOCH.
    // Members of the consumer protocol commit with v9+ (older versions get
    // UNSUPPORTED_VERSION, as in Kafka).
    assert_eq!(
        commit(&mut a, "g848", &a_id, 2, "orders", &[(a_keep[0].1[0], 10)]).await,
        vec![ResponseError::UnsupportedVersion.code()]
    );
    assert_eq!(
        commit_at(
            &mut a,
            9,
            "g848",
            &a_id,
            2,
            "orders",
            &[(a_keep[0].1[0], 10)]
        )
        .await,
        vec![NONE]
    );
    let mut t = offset_commit_request::OffsetCommitRequestTopic::default();
    t.name = TopicName(s("orders"));
    let mut p = offset_commit_request::OffsetCommitRequestPartition::default();
    p.partition_index = a_keep[0].1[0];
    p.committed_offset = 11;
    t.partitions = vec![p];
    let stale: OffsetCommitResponse = a
        .call(
            ApiKey::OffsetCommit,
            9,
            &OffsetCommitRequest::default()
                .with_group_id(gid("g848"))
                .with_generation_id_or_member_epoch(1)
                .with_member_id(s(&a_id))
                .with_topics(vec![t]),
        )
        .await;
    assert_eq!(
        stale.topics[0].partitions[0].error_code,
        ResponseError::StaleMemberEpoch.code()
    );

    // OffsetFetch v9 checks a member's epoch the same way; an admin fetch
    // (no member) is free.
    let fetch_as = |member: Option<&str>, epoch: i32| {
        let mut g = offset_fetch_request::OffsetFetchRequestGroup::default();
        g.group_id = gid("g848");
        g.member_id = member.map(s);
        g.member_epoch = epoch;
        g.topics = None;
        OffsetFetchRequest::default().with_groups(vec![g])
    };
    let r: OffsetFetchResponse = a
        .call(ApiKey::OffsetFetch, 9, &fetch_as(Some(&a_id), 1))
        .await;
    assert_eq!(
        r.groups[0].error_code,
        ResponseError::StaleMemberEpoch.code()
    );
    let r: OffsetFetchResponse = a
        .call(ApiKey::OffsetFetch, 9, &fetch_as(Some(&a_id), 2))
        .await;
    assert_eq!(r.groups[0].error_code, NONE);
    assert_eq!(r.groups[0].topics[0].partitions[0].committed_offset, 10);
    let r: OffsetFetchResponse = a.call(ApiKey::OffsetFetch, 9, &fetch_as(None, -1)).await;
    assert_eq!(r.groups[0].error_code, NONE);

    let listed: ListGroupsResponse = a
        .call(
            ApiKey::ListGroups,
            5,
            &ListGroupsRequest::default().with_types_filter(vec![s("consumer")]),
        )
        .await;
    assert_eq!(listed.groups.len(), 1);
    assert_eq!(listed.groups[0].group_id.as_str(), "g848");
    let d: ConsumerGroupDescribeResponse = a
        .call(
            ApiKey::ConsumerGroupDescribe,
            1,
            &ConsumerGroupDescribeRequest::default().with_group_ids(vec![gid("g848"), gid("nope")]),
        )
        .await;
    assert_eq!(d.groups[0].error_code, NONE);
    assert_eq!(d.groups[0].members.len(), 2);
    assert_eq!(d.groups[0].group_epoch, 2);
    assert_eq!(
        d.groups[1].error_code,
        ResponseError::GroupIdNotFound.code()
    );

    // Leaving (epoch -1) hands A's partitions to B at the next epoch.
    let left = consumer_heartbeat(&mut a, "g848", &a_id, -1, None).await;
    assert_eq!((left.error_code, left.member_epoch), (NONE, -1));
    let rb = consumer_heartbeat(&mut bc, "g848", &b_id, 2, Some(b_parts)).await;
    assert_eq!(rb.member_epoch, 3);
    assert_eq!(assigned(&rb)[0].1.len(), 4);
    // A heartbeat from a member the group no longer has is fenced.
    let gone = consumer_heartbeat(&mut a, "g848", &a_id, 2, Some(vec![])).await;
    assert_eq!(gone.error_code, ResponseError::UnknownMemberId.code());
    b.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kip848_membership_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::config(dir.path(), FAST);
    let running = broker::start(cfg.clone()).await.unwrap();
    let mut a = Client::connect(running.local_addr).await;
    let mut bc = Client::connect(running.local_addr).await;
    assert_eq!(a.create_topic("orders", 4, &[]).await, NONE);
    find_coordinator(&mut a, "g848r").await;
    let a_id = uuid::Uuid::new_v4().to_string();
    let b_id = uuid::Uuid::new_v4().to_string();
    let ra = consumer_heartbeat(&mut a, "g848r", &a_id, 0, Some(vec![])).await;
    let rb = consumer_heartbeat(&mut bc, "g848r", &b_id, 0, Some(vec![])).await;
    // Settle: A revokes what B gets, both reach epoch 2.
    let ra = consumer_heartbeat(&mut a, "g848r", &a_id, ra.member_epoch, Some(assigned(&ra))).await;
    // An assignment is sent only when it changes: remember A's.
    let a_parts = assigned(&ra);
    let ra = consumer_heartbeat(
        &mut a,
        "g848r",
        &a_id,
        ra.member_epoch,
        Some(a_parts.clone()),
    )
    .await;
    let rb = consumer_heartbeat(&mut bc, "g848r", &b_id, rb.member_epoch, Some(vec![])).await;
    assert_eq!((ra.member_epoch, rb.member_epoch), (2, 2));
    let b_parts = assigned(&rb);
    assert_eq!((a_parts[0].1.len(), b_parts[0].1.len()), (2, 2));
    assert_eq!(
        commit_at(
            &mut a,
            9,
            "g848r",
            &a_id,
            2,
            "orders",
            &[(a_parts[0].1[0], 7)]
        )
        .await,
        vec![NONE]
    );
    // B leaves before the restart: its records are tombstoned.
    let left = consumer_heartbeat(&mut bc, "g848r", &b_id, -1, None).await;
    assert_eq!(left.error_code, NONE);
    running.shutdown().await;

    let running = broker::start(cfg).await.unwrap();
    let mut a = Client::connect(running.local_addr).await;
    // A carries on at its epoch, without rejoining, and is handed B's
    // partitions at the next epoch: the group came back as it was stored.
    let ra = consumer_heartbeat(&mut a, "g848r", &a_id, 2, Some(a_parts.clone())).await;
    assert_eq!(ra.error_code, NONE);
    assert_eq!(ra.member_epoch, 3);
    let mut all = assigned(&ra)[0].1.clone();
    all.sort();
    assert_eq!(all, vec![0, 1, 2, 3]);
    let d: ConsumerGroupDescribeResponse = a
        .call(
            ApiKey::ConsumerGroupDescribe,
            1,
            &ConsumerGroupDescribeRequest::default().with_group_ids(vec![gid("g848r")]),
        )
        .await;
    assert_eq!(
        d.groups[0].members.len(),
        1,
        "the member that left stays gone"
    );
    assert_eq!(
        fetch_offsets(&mut a, "g848r", "orders", &[a_parts[0].1[0]]).await[0].1,
        7
    );
    let _ = b_parts;
    running.shutdown().await;
}

/// IncrementalAlterConfigs on a GROUP resource (32); returns the error code.
async fn alter_group_configs(
    c: &mut Client,
    group: &str,
    edits: &[(&str, i8, Option<&str>)],
) -> i16 {
    let mut res = incremental_alter_configs_request::AlterConfigsResource::default();
    res.resource_type = 32;
    res.resource_name = s(group);
    res.configs = edits
        .iter()
        .map(|(k, op, v)| {
            let mut e = incremental_alter_configs_request::AlterableConfig::default();
            e.name = s(k);
            e.config_operation = *op;
            e.value = v.map(s);
            e
        })
        .collect();
    let resp: IncrementalAlterConfigsResponse = c
        .call(
            ApiKey::IncrementalAlterConfigs,
            1,
            &IncrementalAlterConfigsRequest::default().with_resources(vec![res]),
        )
        .await;
    resp.responses[0].error_code
}

/// DescribeConfigs of a GROUP resource: key to (value, source).
async fn group_configs(c: &mut Client, group: &str) -> BTreeMap<String, (String, i8)> {
    let mut res = describe_configs_request::DescribeConfigsResource::default();
    res.resource_type = 32;
    res.resource_name = s(group);
    let resp: DescribeConfigsResponse = c
        .call(
            ApiKey::DescribeConfigs,
            4,
            &DescribeConfigsRequest::default().with_resources(vec![res]),
        )
        .await;
    assert_eq!(resp.results[0].error_code, NONE);
    resp.results[0]
        .configs
        .iter()
        .map(|e| {
            (
                e.name.to_string(),
                (
                    e.value.as_deref().unwrap_or_default().to_string(),
                    e.config_source,
                ),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_configs_are_stored_checked_and_a_consumer_group_uses_its_own() {
    let b = start(FAST).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("orders", 1, &[]).await, NONE);
    find_coordinator(&mut c, "gcfg").await;

    // Defaults for a group that does not exist yet (source 5: DEFAULT_CONFIG).
    let before = group_configs(&mut c, "gcfg").await;
    assert_eq!(before["consumer.heartbeat.interval.ms"], ("5000".into(), 5));
    assert_eq!(before["share.auto.offset.reset"], ("latest".into(), 5));
    assert_eq!(before["share.record.lock.duration.ms"], ("30000".into(), 5));

    // Set before the group exists; shown with source 8 (GROUP_CONFIG).
    let set = [
        ("consumer.heartbeat.interval.ms", 0, Some("7000")),
        ("share.auto.offset.reset", 0, Some("by_duration:PT1H")),
    ];
    assert_eq!(alter_group_configs(&mut c, "gcfg", &set).await, NONE);
    let after = group_configs(&mut c, "gcfg").await;
    assert_eq!(after["consumer.heartbeat.interval.ms"], ("7000".into(), 8));
    assert_eq!(
        after["share.auto.offset.reset"],
        ("by_duration:PT1H".into(), 8)
    );
    assert_eq!(
        group_configs(&mut c, "other").await["share.auto.offset.reset"].1,
        5
    );

    // Kafka's checks: unknown keys, values outside the broker's range, a
    // heartbeat not below the session timeout, APPEND on a scalar.
    let invalid = ResponseError::InvalidConfig.code();
    for edit in [
        ("consumer.assignment.interval.ms", 0, Some("1000")),
        ("consumer.session.timeout.ms", 0, Some("1000")),
        ("consumer.heartbeat.interval.ms", 0, Some("60000")),
        ("share.delivery.count.limit", 0, Some("11")),
        ("share.auto.offset.reset", 0, Some("soonest")),
        ("share.auto.offset.reset", 2, Some("x")),
    ] {
        assert_eq!(
            alter_group_configs(&mut c, "gcfg", &[edit]).await,
            invalid,
            "{edit:?}"
        );
    }
    assert_eq!(
        group_configs(&mut c, "gcfg").await["consumer.heartbeat.interval.ms"].0,
        "7000",
        "a refused change changes nothing"
    );
    let edit = [("consumer.heartbeat.interval.ms", 0, Some("6000"))];
    assert_eq!(
        alter_group_configs(&mut c, "", &edit).await,
        ResponseError::InvalidRequest.code(),
        "a group needs a name"
    );

    // The KIP-848 group is told its own heartbeat interval.
    let id = uuid::Uuid::new_v4().to_string();
    let r = consumer_heartbeat(&mut c, "gcfg", &id, 0, Some(vec![])).await;
    assert_eq!(r.error_code, NONE);
    assert_eq!(r.heartbeat_interval_ms, 7_000);

    // Deleting a key returns the group to the broker's value.
    let delete = [("consumer.heartbeat.interval.ms", 1, None)];
    assert_eq!(alter_group_configs(&mut c, "gcfg", &delete).await, NONE);
    let r = consumer_heartbeat(&mut c, "gcfg", &id, r.member_epoch, None).await;
    assert_eq!(r.heartbeat_interval_ms, 5_000);
    assert_eq!(
        group_configs(&mut c, "gcfg").await["consumer.heartbeat.interval.ms"],
        ("5000".into(), 5)
    );
    b.running.shutdown().await;
}
