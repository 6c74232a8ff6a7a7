//! Share groups over the wire, as KafkaShareConsumer drives them (KIP-932):
//! ShareGroupHeartbeat and ShareGroupDescribe on the group coordinator,
//! ShareFetch and ShareAcknowledge with their share sessions on the
//! partition's leader, and the records' states kept across a restart.

mod common;

use bytes::Bytes;
use common::Client;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, StrBytes};
use kafka_protocol::records::Compression;
use kafka_protocol::ResponseError;
use uuid::Uuid;

const GROUP: &str = "sg";
const ACCEPT: i8 = 1;
const RELEASE: i8 = 2;
const REJECT: i8 = 3;
const RENEW: i8 = 4;
const BATCH_OPTIMIZED: i8 = 0;
const RECORD_LIMIT: i8 = 1;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn code(e: ResponseError) -> i16 {
    e.code()
}

async fn topic_id(c: &mut Client, topic: &str) -> Uuid {
    let mut t = metadata_request::MetadataRequestTopic::default();
    t.name = Some(TopicName(s(topic)));
    let req = MetadataRequest::default().with_topics(Some(vec![t]));
    let resp: MetadataResponse = c.call(ApiKey::Metadata, 12, &req).await;
    assert_eq!(resp.topics[0].error_code, 0);
    resp.topics[0].topic_id
}

/// Sets the group's configs (IncrementalAlterConfigs on the GROUP resource).
async fn group_configs(c: &mut Client, configs: &[(&str, &str)]) {
    const GROUP_RESOURCE: i8 = 32;
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
        incremental_alter_configs_request::AlterConfigsResource::default()
            .with_resource_type(GROUP_RESOURCE)
            .with_resource_name(s(GROUP))
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        incremental_alter_configs_request::AlterableConfig::default()
                            .with_name(s(k))
                            .with_config_operation(0)
                            .with_value(Some(s(v)))
                    })
                    .collect(),
            ),
    ]);
    let r: IncrementalAlterConfigsResponse = c.call(ApiKey::IncrementalAlterConfigs, 1, &req).await;
    assert_eq!(r.responses[0].error_code, 0, "{r:?}");
}

/// The group reads from the log start, as the scenarios set it.
async fn earliest(c: &mut Client) {
    group_configs(c, &[("share.auto.offset.reset", "earliest")]).await;
}

/// Finds the group's coordinator, as a client does first: the lookup
/// creates `__consumer_offsets`, and the group is served once it is loaded.
async fn find_coordinator(c: &mut Client) {
    let req = FindCoordinatorRequest::default().with_coordinator_keys(vec![s(GROUP)]);
    for _ in 0..100 {
        let r: FindCoordinatorResponse = c.call(ApiKey::FindCoordinator, 6, &req).await;
        if r.coordinators[0].error_code == 0 {
            let hb = heartbeat(c, "probe", 4, None).await;
            if hb.error_code == code(ResponseError::UnknownMemberId) {
                return;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("no group coordinator");
}

async fn heartbeat(
    c: &mut Client,
    member: &str,
    epoch: i32,
    topics: Option<&[&str]>,
) -> ShareGroupHeartbeatResponse {
    let req = ShareGroupHeartbeatRequest::default()
        .with_group_id(GroupId(s(GROUP)))
        .with_member_id(s(member))
        .with_member_epoch(epoch)
        .with_subscribed_topic_names(topics.map(|ts| ts.iter().map(|t| TopicName(s(t))).collect()));
    c.call(ApiKey::ShareGroupHeartbeat, 1, &req).await
}

/// (first, last, acknowledge types)
type Ack<'a> = (i64, i64, &'a [i8]);

fn ack_batches(acks: &[Ack<'_>]) -> Vec<share_fetch_request::AcknowledgementBatch> {
    acks.iter()
        .map(|(first, last, types)| {
            share_fetch_request::AcknowledgementBatch::default()
                .with_first_offset(*first)
                .with_last_offset(*last)
                .with_acknowledge_types(types.to_vec())
        })
        .collect()
}

/// A ShareFetch of partition 0 of `topic` (none when `topic` is None).
fn fetch_request(
    member: &str,
    epoch: i32,
    topic: Option<Uuid>,
    acks: &[Ack<'_>],
    max_wait_ms: i32,
) -> ShareFetchRequest {
    let topics = topic
        .map(|t| {
            vec![share_fetch_request::FetchTopic::default()
                .with_topic_id(t)
                .with_partitions(vec![share_fetch_request::FetchPartition::default()
                    .with_partition_index(0)
                    .with_acknowledgement_batches(ack_batches(acks))])]
        })
        .unwrap_or_default();
    ShareFetchRequest::default()
        .with_group_id(Some(GroupId(s(GROUP))))
        .with_member_id(Some(s(member)))
        .with_share_session_epoch(epoch)
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_max_records(500)
        .with_batch_size(500)
        .with_topics(topics)
}

/// One ShareFetch (v1) of partition 0 of `topic`.
async fn share_fetch(
    c: &mut Client,
    member: &str,
    epoch: i32,
    topic: Option<Uuid>,
    acks: &[Ack<'_>],
    max_wait_ms: i32,
) -> ShareFetchResponse {
    let req = fetch_request(member, epoch, topic, acks, max_wait_ms);
    c.call(ApiKey::ShareFetch, 1, &req).await
}

/// A ShareFetch v2 (its response is v1's).
async fn share_fetch_v2(
    c: &mut Client,
    req: ShareFetchRequest,
    mode: i8,
    renew: bool,
) -> ShareFetchResponse {
    let newer = protocol::newer::NewerRequest::ShareFetch {
        acquire_mode: mode,
        is_renew_ack: renew,
    };
    let mut body = c
        .call_newer(ApiKey::ShareFetch, 2, req.into(), Some(newer))
        .await;
    ShareFetchResponse::decode(&mut body, 1).unwrap()
}

fn ack_request(member: &str, epoch: i32, topic: Uuid, acks: &[Ack<'_>]) -> ShareAcknowledgeRequest {
    let batches = acks
        .iter()
        .map(|(first, last, types)| {
            share_acknowledge_request::AcknowledgementBatch::default()
                .with_first_offset(*first)
                .with_last_offset(*last)
                .with_acknowledge_types(types.to_vec())
        })
        .collect();
    ShareAcknowledgeRequest::default()
        .with_group_id(Some(GroupId(s(GROUP))))
        .with_member_id(Some(s(member)))
        .with_share_session_epoch(epoch)
        .with_topics(vec![share_acknowledge_request::AcknowledgeTopic::default()
            .with_topic_id(topic)
            .with_partitions(vec![
                share_acknowledge_request::AcknowledgePartition::default()
                    .with_partition_index(0)
                    .with_acknowledgement_batches(batches),
            ])])
}

async fn share_ack(
    c: &mut Client,
    member: &str,
    epoch: i32,
    topic: Uuid,
    acks: &[Ack<'_>],
) -> ShareAcknowledgeResponse {
    let req = ack_request(member, epoch, topic, acks);
    c.call(ApiKey::ShareAcknowledge, 1, &req).await
}

/// A ShareAcknowledge v2: the response, and the acquisition lock timeout
/// v2 adds after the top-level error message.
async fn share_ack_v2(
    c: &mut Client,
    req: ShareAcknowledgeRequest,
    renew: bool,
) -> (ShareAcknowledgeResponse, i32) {
    let newer = protocol::newer::NewerRequest::ShareAcknowledge {
        is_renew_ack: renew,
    };
    let body = c
        .call_newer(ApiKey::ShareAcknowledge, 2, req.into(), Some(newer))
        .await;
    // throttle_time_ms, error_code, a null error_message, then the timeout.
    assert_eq!(body[6], 0, "a top-level error message");
    let timeout = i32::from_be_bytes(body[7..11].try_into().unwrap());
    let mut v1 = Bytes::from([&body[..7], &body[11..]].concat());
    (
        ShareAcknowledgeResponse::decode(&mut v1, 1).unwrap(),
        timeout,
    )
}

/// The acquired runs (first, last, delivery count) of a fetch's only
/// partition, and the values of the records it delivered in them.
fn acquired(resp: &ShareFetchResponse) -> (Vec<(i64, i64, i16)>, Vec<String>) {
    assert_eq!(resp.error_code, 0, "{resp:?}");
    let Some(p) = resp.responses.first().and_then(|t| t.partitions.first()) else {
        return (vec![], vec![]);
    };
    assert_eq!(p.error_code, 0, "{p:?}");
    let runs: Vec<(i64, i64, i16)> = p
        .acquired_records
        .iter()
        .map(|a| (a.first_offset, a.last_offset, a.delivery_count))
        .collect();
    let values = common::values(&p.records)
        .into_iter()
        .filter(|(o, _)| runs.iter().any(|(f, l, _)| f <= o && o <= l))
        .map(|(_, v)| v)
        .collect();
    (runs, values)
}

fn ack_code(resp: &ShareFetchResponse) -> i16 {
    assert_eq!(resp.error_code, 0, "{resp:?}");
    resp.responses[0].partitions[0].acknowledge_error_code
}

async fn produce(c: &mut Client, values: &[&str]) {
    let batch: Bytes = common::batch(values, Compression::None, None);
    assert_eq!(c.produce("t", 0, -1, batch).await.error_code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_acquire_acknowledge_and_release_records_and_their_states_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::config(
        dir.path(),
        &[("share.coordinator.state.topic.num.partitions", "2")],
    );
    let running = broker::start(cfg.clone()).await.unwrap();
    let mut c = Client::connect(running.local_addr).await;
    assert_eq!(c.create_topic("t", 1, &[]).await, 0);
    let t = topic_id(&mut c, "t").await;
    earliest(&mut c).await;
    find_coordinator(&mut c).await;
    produce(&mut c, &["a0", "a1", "a2", "a3", "a4"]).await;
    produce(&mut c, &["b5", "b6", "b7", "b8", "b9"]).await;

    // The coordinator assigns the partition to the member.
    let hb = heartbeat(&mut c, "m1", 0, Some(&["t"])).await;
    assert_eq!((hb.error_code, hb.member_epoch), (0, 1), "{hb:?}");
    let assigned = hb.assignment.expect("an assignment");
    assert_eq!(assigned.topic_partitions[0].topic_id, t);
    assert_eq!(assigned.topic_partitions[0].partitions, vec![0]);

    // Opening a session acquires everything, delivered once.
    let r = share_fetch(&mut c, "m1", 0, Some(t), &[], 500).await;
    assert_eq!(r.acquisition_lock_timeout_ms, 30_000);
    let (runs, values) = acquired(&r);
    assert_eq!(runs, vec![(0, 9, 1)]);
    assert_eq!(values.len(), 10);

    // Session errors are the whole request's.
    let r = share_fetch(&mut c, "m1", 7, Some(t), &[], 0).await;
    assert_eq!(r.error_code, code(ResponseError::InvalidShareSessionEpoch));
    let r = share_fetch(&mut c, "nobody", 3, Some(t), &[], 0).await;
    assert_eq!(r.error_code, code(ResponseError::ShareSessionNotFound));
    let r = share_fetch(&mut c, "m1", 0, Some(t), &[(0, 0, &[ACCEPT])], 0).await;
    assert_eq!(r.error_code, code(ResponseError::InvalidRequest));
    // A refused request leaves m1's session (at epoch 1) as it was.

    // Accept 0-2, release 3-4, reject 5.
    let r = share_ack(
        &mut c,
        "m1",
        1,
        t,
        &[(0, 2, &[ACCEPT]), (3, 4, &[RELEASE]), (5, 5, &[REJECT])],
    )
    .await;
    assert_eq!(r.error_code, 0, "{r:?}");
    assert_eq!(r.responses[0].partitions[0].error_code, 0, "{r:?}");
    // A record no longer held cannot be acknowledged again; nothing of the
    // request is applied.
    let r = share_ack(&mut c, "m1", 2, t, &[(0, 0, &[ACCEPT]), (6, 6, &[ACCEPT])]).await;
    assert_eq!(
        r.responses[0].partitions[0].error_code,
        code(ResponseError::InvalidRecordState)
    );

    // The released records come back, delivered twice; 6-9 are still m1's.
    let (runs, values) = acquired(&share_fetch(&mut c, "m1", 3, Some(t), &[], 500).await);
    assert_eq!(runs, vec![(3, 4, 2)]);
    assert_eq!(values, vec!["a3", "a4"]);

    // Another member finds nothing to acquire and waits its max_wait_ms.
    let started = std::time::Instant::now();
    let (runs, _) = acquired(&share_fetch(&mut c, "m2", 0, Some(t), &[], 300).await);
    assert!(runs.is_empty());
    assert!(started.elapsed() >= std::time::Duration::from_millis(250));

    // m1 accepts 3 with its next fetch, then closes its session: what it
    // still held (4, 6-9) is available again, and m2 takes it.
    let r = share_fetch(&mut c, "m1", 4, Some(t), &[(3, 3, &[ACCEPT])], 0).await;
    assert_eq!(ack_code(&r), 0);
    let r = share_fetch(&mut c, "m1", -1, None, &[], 0).await;
    assert_eq!(r.error_code, 0, "{r:?}");
    let (runs, values) = acquired(&share_fetch(&mut c, "m2", 1, Some(t), &[], 500).await);
    assert_eq!(runs, vec![(4, 4, 3), (6, 9, 2)]);
    assert_eq!(values, vec!["a4", "b6", "b7", "b8", "b9"]);
    let r = share_ack(&mut c, "m2", 2, t, &[(4, 4, &[ACCEPT]), (6, 9, &[ACCEPT])]).await;
    assert_eq!(r.responses[0].partitions[0].error_code, 0, "{r:?}");
    drop(c);
    running.shutdown().await;

    // After a restart no accepted or rejected record comes back: only new
    // ones.
    let running = broker::start(cfg.clone()).await.unwrap();
    let mut c = Client::connect(running.local_addr).await;
    // The group itself is back, without members, with its share-partition
    // (`__consumer_offsets` holds its epoch and share-partitions).
    find_coordinator(&mut c).await;
    let list = ListGroupsRequest::default().with_types_filter(vec![s("share")]);
    let r: ListGroupsResponse = c.call(ApiKey::ListGroups, 5, &list).await;
    assert!(
        r.groups
            .iter()
            .any(|g| g.group_id.0.as_str() == GROUP && g.group_state.as_str() == "Empty"),
        "{r:?}"
    );
    assert_eq!(
        starts(&describe_offsets(&mut c, None).await),
        vec![("t".to_string(), 10)]
    );
    produce(&mut c, &["c10", "c11"]).await;
    let mut runs = vec![];
    for _ in 0..50 {
        let r = share_fetch(&mut c, "m3", 0, Some(t), &[], 500).await;
        let p = r.responses.first().and_then(|t| t.partitions.first());
        // The partition's leadership and the share coordinator come back
        // after the start; until then the answer is retriable.
        if p.is_some_and(|p| p.error_code != 0) {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        }
        runs = acquired(&r).0;
        break;
    }
    assert_eq!(runs, vec![(10, 11, 1)]);
    // A deleted group stays deleted.
    let req = DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s(GROUP))]);
    let r: DeleteGroupsResponse = c.call(ApiKey::DeleteGroups, 2, &req).await;
    assert_eq!(r.results[0].error_code, 0, "{r:?}");
    drop(c);
    running.shutdown().await;
    let running = broker::start(cfg).await.unwrap();
    let mut c = Client::connect(running.local_addr).await;
    find_coordinator(&mut c).await;
    let r: ListGroupsResponse = c.call(ApiKey::ListGroups, 5, &list).await;
    assert!(r.groups.is_empty(), "{r:?}");
    running.shutdown().await;
}

async fn describe(c: &mut Client, groups: &[&str]) -> ShareGroupDescribeResponse {
    let req = ShareGroupDescribeRequest::default()
        .with_group_ids(groups.iter().map(|g| GroupId(s(g))).collect());
    c.call(ApiKey::ShareGroupDescribe, 1, &req).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_join_share_partitions_and_leave_and_the_group_is_listed_and_deleted() {
    let b = common::start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("t", 2, &[]).await, 0);
    assert_eq!(c.create_topic("u", 1, &[]).await, 0);
    find_coordinator(&mut c).await;

    let r = heartbeat(&mut c, "m1", 0, Some(&["t", "u"])).await;
    assert_eq!((r.error_code, r.member_epoch), (0, 1));
    assert_eq!(r.heartbeat_interval_ms, 5_000);
    let r = heartbeat(&mut c, "m2", 0, Some(&["t", "u"])).await;
    assert_eq!((r.error_code, r.member_epoch), (0, 2));
    // m1 is told the new epoch and its new assignment.
    let r = heartbeat(&mut c, "m1", 1, None).await;
    assert_eq!(r.member_epoch, 2);
    let parts: Vec<usize> = r
        .assignment
        .expect("new assignment")
        .topic_partitions
        .iter()
        .map(|tp| tp.partitions.len())
        .collect();
    assert_eq!(parts, vec![1, 1], "t split, u shared");
    assert_eq!(
        heartbeat(&mut c, "m1", 1, None).await.error_code,
        code(ResponseError::FencedMemberEpoch)
    );
    assert_eq!(
        heartbeat(&mut c, "ghost", 4, None).await.error_code,
        code(ResponseError::UnknownMemberId)
    );
    assert_eq!(
        heartbeat(&mut c, "m3", 0, None).await.error_code,
        code(ResponseError::InvalidRequest)
    );

    let d = describe(&mut c, &[GROUP, "missing"]).await;
    let g = &d.groups[0];
    assert_eq!((g.error_code, g.group_state.as_str()), (0, "Stable"));
    assert_eq!((g.group_epoch, g.assignment_epoch), (2, 2));
    assert_eq!(g.members.len(), 2);
    assert_eq!(g.members[0].assignment.topic_partitions.len(), 2);
    assert!(g.members[0]
        .assignment
        .topic_partitions
        .iter()
        .any(|tp| tp.topic_name.as_str() == "u"));
    assert_eq!(d.groups[1].error_code, code(ResponseError::GroupIdNotFound));

    // Listed as a share group, and only when share groups are asked for.
    let list = |types: Vec<&str>| {
        ListGroupsRequest::default().with_types_filter(types.into_iter().map(s).collect())
    };
    let r: ListGroupsResponse = c.call(ApiKey::ListGroups, 5, &list(vec!["share"])).await;
    assert_eq!(r.groups.len(), 1);
    assert_eq!(
        (
            r.groups[0].group_type.as_str(),
            r.groups[0].group_state.as_str()
        ),
        ("share", "Stable")
    );
    let r: ListGroupsResponse = c.call(ApiKey::ListGroups, 5, &list(vec!["classic"])).await;
    assert!(r.groups.is_empty());

    // A share group's id is not a consumer group's.
    let cg = ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId(s(GROUP)))
        .with_member_id(s("c1"))
        .with_member_epoch(0)
        .with_rebalance_timeout_ms(30_000)
        .with_subscribed_topic_names(Some(vec![TopicName(s("t"))]))
        .with_topic_partitions(Some(vec![]));
    let r: ConsumerGroupHeartbeatResponse = c.call(ApiKey::ConsumerGroupHeartbeat, 0, &cg).await;
    assert_eq!(r.error_code, code(ResponseError::GroupIdNotFound));

    // Not deleted while members remain; deleted once they left.
    let delete = DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s(GROUP))]);
    let r: DeleteGroupsResponse = c.call(ApiKey::DeleteGroups, 2, &delete).await;
    assert_eq!(r.results[0].error_code, code(ResponseError::NonEmptyGroup));
    assert_eq!(heartbeat(&mut c, "m1", -1, None).await.member_epoch, -1);
    assert_eq!(heartbeat(&mut c, "m2", -1, None).await.member_epoch, -1);
    let d = describe(&mut c, &[GROUP, "missing"]).await;
    assert_eq!(d.groups[0].group_state.as_str(), "Empty");
    let r: DeleteGroupsResponse = c.call(ApiKey::DeleteGroups, 2, &delete).await;
    assert_eq!(r.results[0].error_code, 0);
    let d = describe(&mut c, &[GROUP, "missing"]).await;
    assert_eq!(d.groups[0].error_code, code(ResponseError::GroupIdNotFound));
}

async fn describe_offsets(
    c: &mut Client,
    topics: Option<&[&str]>,
) -> describe_share_group_offsets_response::DescribeShareGroupOffsetsResponseGroup {
    use describe_share_group_offsets_request::*;
    let req = DescribeShareGroupOffsetsRequest::default().with_groups(vec![
        DescribeShareGroupOffsetsRequestGroup::default()
            .with_group_id(GroupId(s(GROUP)))
            .with_topics(topics.map(|ts| {
                ts.iter()
                    .map(|t| {
                        DescribeShareGroupOffsetsRequestTopic::default()
                            .with_topic_name(TopicName(s(t)))
                            .with_partitions(vec![0])
                    })
                    .collect()
            })),
    ]);
    let mut r: DescribeShareGroupOffsetsResponse =
        c.call(ApiKey::DescribeShareGroupOffsets, 0, &req).await;
    r.groups.remove(0)
}

/// (topic, partition 0's start offset) of a described group.
fn starts(
    g: &describe_share_group_offsets_response::DescribeShareGroupOffsetsResponseGroup,
) -> Vec<(String, i64)> {
    assert_eq!(g.error_code, 0, "{g:?}");
    g.topics
        .iter()
        .map(|t| {
            assert_eq!(t.partitions[0].error_code, 0, "{t:?}");
            (t.topic_name.to_string(), t.partitions[0].start_offset)
        })
        .collect()
}

async fn alter_offsets(c: &mut Client, topic: &str, start: i64) -> AlterShareGroupOffsetsResponse {
    use alter_share_group_offsets_request::*;
    let req = AlterShareGroupOffsetsRequest::default()
        .with_group_id(GroupId(s(GROUP)))
        .with_topics(vec![AlterShareGroupOffsetsRequestTopic::default()
            .with_topic_name(TopicName(s(topic)))
            .with_partitions(vec![
                AlterShareGroupOffsetsRequestPartition::default()
                    .with_partition_index(0)
                    .with_start_offset(start),
            ])]);
    c.call(ApiKey::AlterShareGroupOffsets, 0, &req).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_connection_releases_its_records_and_offsets_are_described_reset_and_deleted() {
    let b = common::start(&[("share.coordinator.state.topic.num.partitions", "2")]).await;
    let addr = b.running.local_addr;
    let mut c = Client::connect(addr).await;
    assert_eq!(c.create_topic("t", 1, &[]).await, 0);
    let t = topic_id(&mut c, "t").await;
    earliest(&mut c).await;
    find_coordinator(&mut c).await;
    produce(&mut c, &["a0", "a1", "a2", "a3", "a4"]).await;

    // m1, on a connection of its own, takes everything and accepts 0-1.
    assert_eq!(heartbeat(&mut c, "m1", 0, Some(&["t"])).await.error_code, 0);
    let mut m1 = Client::connect(addr).await;
    let (runs, _) = acquired(&share_fetch(&mut m1, "m1", 0, Some(t), &[], 500).await);
    assert_eq!(runs, vec![(0, 4, 1)]);
    let r = share_ack(&mut m1, "m1", 1, t, &[(0, 1, &[ACCEPT])]).await;
    assert_eq!(r.responses[0].partitions[0].error_code, 0);
    let (runs, _) = acquired(&share_fetch(&mut c, "m2", 0, Some(t), &[], 100).await);
    assert!(runs.is_empty());
    // Its connection closes: 2-4 are m2's long before their locks (30 s)
    // would have run out.
    drop(m1);
    let started = std::time::Instant::now();
    let (runs, _) = acquired(&share_fetch(&mut c, "m2", 1, Some(t), &[], 5_000).await);
    assert_eq!(runs, vec![(2, 4, 2)]);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    let r = share_ack(&mut c, "m2", 2, t, &[(2, 4, &[ACCEPT])]).await;
    assert_eq!(r.responses[0].partitions[0].error_code, 0);
    assert_eq!(
        share_fetch(&mut c, "m2", -1, None, &[], 0).await.error_code,
        0
    );

    // The group's offsets: every partition it was assigned, or those named.
    let g = describe_offsets(&mut c, None).await;
    assert_eq!(starts(&g), vec![("t".to_string(), 5)]);
    assert!(g.topics[0].partitions[0].leader_epoch >= 0);
    let g = describe_offsets(&mut c, Some(&["missing"])).await;
    assert_eq!(
        g.topics[0].partitions[0].error_code,
        code(ResponseError::UnknownTopicOrPartition)
    );

    // Reset while m1 is a member: refused; once it left, records from 1 on
    // are delivered again, as never delivered.
    let r = alter_offsets(&mut c, "t", 1).await;
    assert_eq!(r.error_code, code(ResponseError::NonEmptyGroup));
    assert_eq!(heartbeat(&mut c, "m1", -1, None).await.member_epoch, -1);
    let r = alter_offsets(&mut c, "t", 1).await;
    assert_eq!(r.error_code, 0, "{r:?}");
    assert_eq!(r.responses[0].partitions[0].error_code, 0, "{r:?}");
    assert_eq!(r.responses[0].topic_id, t);
    assert_eq!(
        starts(&describe_offsets(&mut c, None).await),
        vec![("t".to_string(), 1)]
    );
    let (runs, values) = acquired(&share_fetch(&mut c, "m3", 0, Some(t), &[], 500).await);
    assert_eq!(runs, vec![(1, 4, 1)]);
    assert_eq!(values, vec!["a1", "a2", "a3", "a4"]);
    assert_eq!(
        share_fetch(&mut c, "m3", -1, None, &[], 0).await.error_code,
        0
    );

    // Deleting the offsets forgets the topic's state.
    use delete_share_group_offsets_request::*;
    let req = DeleteShareGroupOffsetsRequest::default()
        .with_group_id(GroupId(s(GROUP)))
        .with_topics(vec![
            DeleteShareGroupOffsetsRequestTopic::default().with_topic_name(TopicName(s("t")))
        ]);
    let r: DeleteShareGroupOffsetsResponse = c.call(ApiKey::DeleteShareGroupOffsets, 0, &req).await;
    assert_eq!((r.error_code, r.responses[0].error_code), (0, 0), "{r:?}");
    assert!(starts(&describe_offsets(&mut c, None).await).is_empty());
    assert_eq!(
        starts(&describe_offsets(&mut c, Some(&["t"])).await),
        vec![("t".to_string(), -1)]
    );

    // Deleting the group: its offsets are gone with it.
    let delete = DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s(GROUP))]);
    let r: DeleteGroupsResponse = c.call(ApiKey::DeleteGroups, 2, &delete).await;
    assert_eq!(r.results[0].error_code, 0);
    assert_eq!(
        describe_offsets(&mut c, None).await.error_code,
        code(ResponseError::GroupIdNotFound)
    );
}

/// Produces `values` to `t`-0, retrying while its new leader has not taken
/// the partition up yet (a retriable error, as for any client).
async fn produce_retrying(c: &mut Client, values: &[&str]) {
    let batch: Bytes = common::batch(values, Compression::None, None);
    let mut code = -1;
    for _ in 0..100 {
        code = c.produce("t", 0, -1, batch.clone()).await.error_code;
        if code == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(code, 0);
}

/// `member` opens a session on `t`-0 until it acquires something: the
/// partition's leadership and the share coordinator may still be settling
/// (retriable errors). Returns the acquired runs.
async fn acquire_retrying(c: &mut Client, member: &str, t: Uuid) -> Vec<(i64, i64, i16)> {
    for _ in 0..100 {
        let r = share_fetch(c, member, 0, Some(t), &[], 500).await;
        if r.error_code == 0
            && r.responses
                .first()
                .is_some_and(|t| t.partitions[0].error_code == 0)
        {
            let runs = acquired(&r).0;
            if !runs.is_empty() {
                return runs;
            }
        }
        share_fetch(c, member, -1, None, &[], 0).await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    vec![]
}

/// The leader of `t`-0 as node `via` sees it.
fn leader_of_t(cluster: &common::cluster::TestCluster, via: i32) -> i32 {
    cluster.image(via).topics["t"].partitions[0].leader.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_partition_leader_keeps_every_acknowledgement_and_redelivers_what_was_held() {
    use std::time::Duration;
    let mut cluster = common::cluster::TestCluster::start(
        3,
        46780,
        &[
            ("share.coordinator.state.topic.num.partitions", "1"),
            ("share.coordinator.state.topic.replication.factor", "3"),
            ("share.coordinator.state.topic.min.isr", "2"),
            ("replica.fetch.wait.max.ms", "100"),
        ],
    )
    .await;
    let mut c = cluster.client(1).await;
    let mut topic = create_topics_request::CreatableTopic::default();
    topic.name = TopicName(s("t"));
    topic.num_partitions = 1;
    topic.replication_factor = 3;
    let req = CreateTopicsRequest::default()
        .with_topics(vec![topic])
        .with_timeout_ms(10_000);
    let resp: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &req).await;
    assert_eq!(resp.topics[0].error_code, 0);
    let t = topic_id(&mut c, "t").await;
    earliest(&mut c).await;
    cluster
        .wait_for_images(
            "t and the group config everywhere",
            Duration::from_secs(10),
            |img| img.topic_by_id(t).is_some() && img.group_configs.contains_key(GROUP),
        )
        .await;

    let first = leader_of_t(&cluster, 1);
    let mut c = cluster.client(first).await;
    let values: Vec<String> = (0..10).map(|i| format!("v{i}")).collect();
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    produce_retrying(&mut c, &values).await;

    // m1 takes everything from the leader (the share coordinator's topic is
    // created on the way), accepts 0-4, rejects 5 and still holds 6-9.
    let runs = acquire_retrying(&mut c, "m1", t).await;
    assert_eq!(runs, vec![(0, 9, 1)]);
    let r = share_ack(&mut c, "m1", 1, t, &[(0, 4, &[ACCEPT]), (5, 5, &[REJECT])]).await;
    assert_eq!(r.responses[0].partitions[0].error_code, 0, "{r:?}");
    drop(c);

    // The leader goes; on the new one, only what m1 held comes back, with
    // its delivery counted.
    cluster.stop(first).await;
    let other = cluster.running_ids()[0];
    cluster
        .wait_until("a new leader of t-0", Duration::from_secs(20), |cl| {
            let l = leader_of_t(cl, other);
            l >= 1 && l != first
        })
        .await;
    let next = leader_of_t(&cluster, other);
    let mut c = cluster.client(next).await;
    let runs = acquire_retrying(&mut c, "m2", t).await;
    assert_eq!(runs, vec![(6, 9, 2)]);
    let r = share_fetch(&mut c, "m2", 1, Some(t), &[(6, 9, &[ACCEPT])], 300).await;
    assert_eq!(ack_code(&r), 0);
    assert!(acquired(&r).0.is_empty(), "nothing else to deliver");
    cluster.shutdown().await;
}

/// The records of a fetched partition: (value, headers as text).
fn records_with_headers(records: &Option<Bytes>) -> Vec<(String, Vec<(String, String)>)> {
    let Some(r) = records else { return vec![] };
    let mut b = r.clone();
    kafka_protocol::records::RecordBatchDecoder::decode_all(&mut b)
        .unwrap()
        .into_iter()
        .flat_map(|set| set.records)
        .map(|r| {
            let text = |b: &Option<Bytes>| {
                b.as_ref()
                    .map(|b| String::from_utf8_lossy(b).to_string())
                    .unwrap_or_default()
            };
            (
                text(&r.value),
                r.headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), text(v)))
                    .collect(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_and_exhausted_records_are_copied_to_the_dead_letter_queue() {
    let b = common::start(&[
        ("share.coordinator.state.topic.num.partitions", "2"),
        ("errors.deadletterqueue.auto.create.topics.enable", "true"),
    ])
    .await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("t", 1, &[]).await, 0);
    let t = topic_id(&mut c, "t").await;
    // First a DLQ topic without the required prefix ("dlq."): nothing is
    // written there.
    group_configs(
        &mut c,
        &[
            ("share.auto.offset.reset", "earliest"),
            ("share.delivery.count.limit", "2"),
            ("errors.deadletterqueue.topic.name", "nodlq.t"),
            ("errors.deadletterqueue.copy.record.enable", "true"),
        ],
    )
    .await;
    find_coordinator(&mut c).await;
    produce(&mut c, &["a0", "a1", "a2", "a3"]).await;
    let (runs, _) = acquired(&share_fetch(&mut c, "m1", 0, Some(t), &[], 500).await);
    assert_eq!(runs, vec![(0, 3, 1)]);
    let r = share_ack(&mut c, "m1", 1, t, &[(0, 0, &[REJECT])]).await;
    assert_eq!(r.responses[0].partitions[0].error_code, 0);

    // Then "dlq.t", created on first use: 1 rejected, 2 released at the
    // delivery limit go there; 3 accepted does not.
    group_configs(&mut c, &[("errors.deadletterqueue.topic.name", "dlq.t")]).await;
    // The answer comes once the quorum has the change; the broker applies
    // it from its metadata image (as Kafka's brokers do).
    for _ in 0..100 {
        let image = b.running.broker.metadata.image();
        let dlq = image
            .group_configs
            .get(GROUP)
            .and_then(|g| g.get("errors.deadletterqueue.topic.name").cloned());
        if dlq.as_deref() == Some("dlq.t") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let r = share_ack(
        &mut c,
        "m1",
        2,
        t,
        &[(1, 1, &[REJECT]), (2, 2, &[RELEASE]), (3, 3, &[ACCEPT])],
    )
    .await;
    assert_eq!(r.responses[0].partitions[0].error_code, 0);
    let (runs, _) = acquired(&share_fetch(&mut c, "m1", 3, Some(t), &[], 500).await);
    assert_eq!(runs, vec![(2, 2, 2)]);
    let r = share_ack(&mut c, "m1", 4, t, &[(2, 2, &[RELEASE])]).await;
    assert_eq!(r.responses[0].partitions[0].error_code, 0);

    let mut dead = vec![];
    for _ in 0..100 {
        if b.running
            .broker
            .metadata
            .image()
            .topics
            .contains_key("dlq.t")
        {
            let p = c.fetch("dlq.t", 0, 0, 200).await;
            dead = records_with_headers(&p.records);
            if dead.len() >= 2 {
                break;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let header = |h: &[(String, String)], k: &str| {
        h.iter()
            .find(|(name, _)| name == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let summary: Vec<(String, String, String, String)> = dead
        .iter()
        .map(|(value, h)| {
            assert_eq!(header(h, "__dlq.errors.topic"), "t");
            assert_eq!(header(h, "__dlq.errors.partition"), "0");
            assert_eq!(header(h, "__dlq.errors.group"), GROUP);
            (
                value.clone(),
                header(h, "__dlq.errors.offset"),
                header(h, "__dlq.errors.delivery.count"),
                header(h, "__dlq.errors.message"),
            )
        })
        .collect();
    let row = |v: &str, o: &str, n: &str, m: &str| (v.into(), o.into(), n.into(), m.into());
    assert_eq!(
        summary,
        vec![
            row("a1", "1", "1", "Offset rejected by client."),
            row(
                "a2",
                "2",
                "2",
                "Offset delivery count exceeded the threshold."
            ),
        ]
    );
    let image = b.running.broker.metadata.image();
    assert_eq!(
        image.topics["dlq.t"]
            .configs
            .get("errors.deadletterqueue.group.enable")
            .map(String::as_str),
        Some("true")
    );
    assert!(!image.topics.contains_key("nodlq.t"));
}

/// DescribeShareGroupOffsets v1 of GROUP on partition 0 of `topic`: its
/// start offset and lag (v1 adds the lag after the leader epoch).
async fn start_and_lag(c: &mut Client, topic: &str) -> (i64, i64) {
    use describe_share_group_offsets_request::*;
    let req = DescribeShareGroupOffsetsRequest::default().with_groups(vec![
        DescribeShareGroupOffsetsRequestGroup::default()
            .with_group_id(GroupId(s(GROUP)))
            .with_topics(Some(vec![DescribeShareGroupOffsetsRequestTopic::default()
                .with_topic_name(TopicName(s(topic)))
                .with_partitions(vec![0])])),
    ]);
    let body = c
        .call_newer(ApiKey::DescribeShareGroupOffsets, 1, req.into(), None)
        .await;
    // throttle, groups (1), group id, topics (1), topic name, topic id,
    // partitions (1), partition index, then the start offset.
    let at = 4 + 1 + 1 + GROUP.len() + 1 + 1 + topic.len() + 16 + 1 + 4;
    let i64_at = |i: usize| i64::from_be_bytes(body[i..i + 8].try_into().unwrap());
    let error_code = i16::from_be_bytes(body[at + 20..at + 22].try_into().unwrap());
    assert_eq!(error_code, 0, "{body:?}");
    (i64_at(at), i64_at(at + 12))
}

/// KIP-1222 and KIP-1206, at ShareFetch and ShareAcknowledge v2: a member
/// keeps its records past the lock duration by renewing them, and the
/// record-limit acquire mode hands out exactly `max_records`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_keep_records_locked_and_record_limit_mode_acquires_exactly_max_records() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::config(
        dir.path(),
        &[
            ("share.coordinator.state.topic.num.partitions", "1"),
            ("group.share.min.record.lock.duration.ms", "1000"),
        ],
    );
    let running = broker::start(cfg).await.unwrap();
    let mut c = Client::connect(running.local_addr).await;
    assert_eq!(c.create_topic("t", 1, &[]).await, 0);
    let t = topic_id(&mut c, "t").await;
    group_configs(
        &mut c,
        &[
            ("share.auto.offset.reset", "earliest"),
            ("share.record.lock.duration.ms", "1500"),
        ],
    )
    .await;
    find_coordinator(&mut c).await;
    let values: Vec<String> = (0..10).map(|i| format!("v{i}")).collect();
    produce(
        &mut c,
        &values.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await;
    for m in ["m1", "m2"] {
        let hb = heartbeat(&mut c, m, 0, Some(&["t"])).await;
        assert_eq!(hb.error_code, 0, "{hb:?}");
    }
    // The group config is applied from the metadata image shortly after;
    // a session of no partitions acquires nothing meanwhile.
    let mut r = share_fetch(&mut c, "m1", 0, None, &[], 0).await;
    for _ in 0..100 {
        if r.acquisition_lock_timeout_ms == 1500 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        share_fetch(&mut c, "m1", -1, None, &[], 0).await;
        r = share_fetch(&mut c, "m1", 0, None, &[], 0).await;
    }
    assert_eq!(r.acquisition_lock_timeout_ms, 1500);
    let mut m1 = 1;

    // Record-limit mode: 3 of the batch's 10, not the whole batch.
    let mut req = fetch_request("m1", m1, Some(t), &[], 500);
    req.max_records = 3;
    let r = share_fetch_v2(&mut c, req, RECORD_LIMIT, false).await;
    assert_eq!(acquired(&r).0, vec![(0, 2, 1)]);
    m1 += 1;

    // Renewed for twice the lock duration, by ShareAcknowledge and by a
    // ShareFetch that only renews.
    let renewed_until = std::time::Instant::now() + std::time::Duration::from_millis(3_000);
    let mut by_fetch = false;
    while std::time::Instant::now() < renewed_until {
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        if by_fetch {
            let mut req = fetch_request("m1", m1, Some(t), &[(0, 2, &[RENEW])], 0);
            (req.max_bytes, req.min_bytes, req.max_records) = (0, 0, 0);
            let r = share_fetch_v2(&mut c, req, BATCH_OPTIMIZED, true).await;
            assert_eq!(ack_code(&r), 0, "{r:?}");
            assert!(r.responses[0].partitions[0].acquired_records.is_empty());
        } else {
            let (r, timeout) =
                share_ack_v2(&mut c, ack_request("m1", m1, t, &[(0, 2, &[RENEW])]), true).await;
            assert_eq!(r.responses[0].partitions[0].error_code, 0, "{r:?}");
            assert_eq!(timeout, 1500);
        }
        m1 += 1;
        by_fetch = !by_fetch;
    }
    // Still m1's: another member gets only the rest.
    let r = share_fetch(&mut c, "m2", 0, Some(t), &[], 500).await;
    assert_eq!(acquired(&r).0, vec![(3, 9, 1)]);
    assert_eq!(start_and_lag(&mut c, "t").await, (0, 10));
    let r = share_fetch(&mut c, "m2", 1, Some(t), &[(3, 9, &[ACCEPT])], 0).await;
    assert_eq!(ack_code(&r), 0);
    assert_eq!(start_and_lag(&mut c, "t").await, (0, 3));

    // RENEW needs version 2 and a request that declares it.
    let r = share_ack(&mut c, "m1", m1, t, &[(0, 2, &[RENEW])]).await;
    assert_eq!(
        r.responses[0].partitions[0].error_code,
        code(ResponseError::InvalidRequest)
    );
    m1 += 1;
    let (r, _) = share_ack_v2(&mut c, ack_request("m1", m1, t, &[(0, 2, &[RENEW])]), false).await;
    assert_eq!(
        r.responses[0].partitions[0].error_code,
        code(ResponseError::InvalidRequest)
    );
    m1 += 1;
    // A renewing fetch fetches nothing, so asks for nothing; an unknown
    // acquire mode is refused. Neither touches the session.
    let req = fetch_request("m1", m1, Some(t), &[(0, 2, &[RENEW])], 0);
    let r = share_fetch_v2(&mut c, req, BATCH_OPTIMIZED, true).await;
    assert_eq!(r.error_code, code(ResponseError::InvalidRequest));
    let r = share_fetch_v2(&mut c, fetch_request("m1", m1, Some(t), &[], 0), 7, false).await;
    assert_eq!(r.error_code, code(ResponseError::InvalidRequest));

    // A group may turn renewals off (share.renew.acknowledge.enable), as
    // Kafka: INVALID_RECORD_STATE (applied once the metadata image has it).
    group_configs(&mut c, &[("share.renew.acknowledge.enable", "false")]).await;
    let mut refused = 0;
    for _ in 0..50 {
        let (r, _) =
            share_ack_v2(&mut c, ack_request("m1", m1, t, &[(0, 2, &[RENEW])]), true).await;
        m1 += 1;
        refused = r.responses[0].partitions[0].error_code;
        if refused != 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(refused, code(ResponseError::InvalidRecordState));

    // Without renewals the locks expire and the records go to m2.
    let mut runs = Vec::new();
    for m2 in 2..22 {
        let r = share_fetch(&mut c, "m2", m2, Some(t), &[], 500).await;
        runs = acquired(&r).0;
        if !runs.is_empty() {
            break;
        }
    }
    assert_eq!(runs, vec![(0, 2, 2)]);
    running.shutdown().await;
}

/// A member that stops heartbeating is removed once its session times out;
/// the one that keeps heartbeating stays, and the group's epoch moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_stops_heartbeating_leaves_the_group_after_its_session_timeout() {
    let b = common::start(&[
        ("group.share.min.session.timeout.ms", "1000"),
        ("group.share.session.timeout.ms", "1500"),
        ("group.share.min.heartbeat.interval.ms", "100"),
        ("group.share.heartbeat.interval.ms", "300"),
    ])
    .await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("t", 1, &[]).await, 0);
    find_coordinator(&mut c).await;
    let m1 = heartbeat(&mut c, "m1", 0, Some(&["t"])).await;
    assert_eq!(m1.error_code, 0, "{m1:?}");
    let mut m2 = heartbeat(&mut c, "m2", 0, Some(&["t"])).await;
    assert_eq!(m2.error_code, 0, "{m2:?}");
    let members = |d: &ShareGroupDescribeResponse| -> Vec<String> {
        d.groups[0]
            .members
            .iter()
            .map(|m| m.member_id.to_string())
            .collect()
    };
    assert_eq!(members(&describe(&mut c, &[GROUP]).await), vec!["m1", "m2"]);
    // m2 heartbeats every 300 ms; m1 goes quiet past its 1.5 s session.
    let started = std::time::Instant::now();
    let mut left_after = None;
    while started.elapsed() < std::time::Duration::from_secs(10) {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        m2 = heartbeat(&mut c, "m2", m2.member_epoch, None).await;
        assert_eq!(m2.error_code, 0, "{m2:?}");
        if members(&describe(&mut c, &[GROUP]).await) == vec!["m2"] {
            left_after = Some(started.elapsed());
            break;
        }
    }
    let left_after = left_after.expect("m1 was never removed");
    assert!(
        left_after >= std::time::Duration::from_millis(1_200),
        "{left_after:?}"
    );
    let d = describe(&mut c, &[GROUP]).await;
    assert!(d.groups[0].group_epoch > m1.member_epoch, "{d:?}");
    // m1's next heartbeat finds it gone.
    let r = heartbeat(&mut c, "m1", m1.member_epoch, None).await;
    assert_eq!(r.error_code, code(ResponseError::UnknownMemberId));
    b.running.shutdown().await;
}

/// Creates `name` with one partition whose only replica is `node`, and
/// `configs`.
async fn create_on(c: &mut Client, name: &str, node: i32, configs: &[(&str, &str)]) {
    let mut topic = create_topics_request::CreatableTopic::default();
    topic.name = TopicName(s(name));
    topic.num_partitions = -1;
    topic.replication_factor = -1;
    topic.assignments = vec![create_topics_request::CreatableReplicaAssignment::default()
        .with_partition_index(0)
        .with_broker_ids(vec![BrokerId(node)])];
    topic.configs = configs
        .iter()
        .map(|(k, v)| {
            create_topics_request::CreatableTopicConfig::default()
                .with_name(s(k))
                .with_value(Some(s(v)))
        })
        .collect();
    let req = CreateTopicsRequest::default()
        .with_topics(vec![topic])
        .with_timeout_ms(10_000);
    let resp: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &req).await;
    assert_eq!(resp.topics[0].error_code, 0, "{resp:?}");
}

/// The dead-letter queue's partition is led by another node than the
/// share-partition's: rejected records get there by a Produce to it. And
/// the group coordinator is a third node, which asks the partition's
/// leader for its end offset to tell the group's lag.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_queue_led_by_another_node_gets_the_rejected_records() {
    use std::time::Duration;
    let cluster = common::cluster::TestCluster::start(
        3,
        46880,
        &[("share.coordinator.state.topic.num.partitions", "1")],
    )
    .await;
    let mut c = cluster.client(1).await;
    let req = FindCoordinatorRequest::default().with_coordinator_keys(vec![s(GROUP)]);
    let mut coordinator = -1;
    for _ in 0..100 {
        let r: FindCoordinatorResponse = c.call(ApiKey::FindCoordinator, 6, &req).await;
        if r.coordinators[0].error_code == 0 {
            coordinator = r.coordinators[0].node_id.0;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let others: Vec<i32> = (1..=3).filter(|&n| n != coordinator).collect();
    assert_eq!(others.len(), 2, "coordinator {coordinator}");
    let (leader, dlq_leader) = (others[0], others[1]);
    create_on(&mut c, "t", leader, &[]).await;
    create_on(
        &mut c,
        "dlq.t",
        dlq_leader,
        &[("errors.deadletterqueue.group.enable", "true")],
    )
    .await;
    let mut c = cluster.client(leader).await;
    let t = topic_id(&mut c, "t").await;
    group_configs(
        &mut c,
        &[
            ("share.auto.offset.reset", "earliest"),
            ("errors.deadletterqueue.topic.name", "dlq.t"),
            ("errors.deadletterqueue.copy.record.enable", "true"),
        ],
    )
    .await;
    cluster
        .wait_for_images(
            "both topics and the group config everywhere",
            Duration::from_secs(10),
            |img| {
                img.topics.contains_key("dlq.t")
                    && img.topic_by_id(t).is_some()
                    && img
                        .group_configs
                        .get(GROUP)
                        .is_some_and(|g| g.contains_key("errors.deadletterqueue.topic.name"))
            },
        )
        .await;
    produce_retrying(&mut c, &["a0", "a1"]).await;
    let runs = acquire_retrying(&mut c, "m1", t).await;
    assert_eq!(runs, vec![(0, 1, 1)]);
    let mut at_coordinator = cluster.client(coordinator).await;
    assert_eq!(start_and_lag(&mut at_coordinator, "t").await, (0, 2));
    let r = share_ack(&mut c, "m1", 1, t, &[(0, 0, &[REJECT]), (1, 1, &[ACCEPT])]).await;
    assert_eq!(r.responses[0].partitions[0].error_code, 0, "{r:?}");
    assert_eq!(start_and_lag(&mut at_coordinator, "t").await, (2, 0));

    let mut dlq = cluster.client(dlq_leader).await;
    let mut dead = vec![];
    for _ in 0..100 {
        let p = dlq.fetch("dlq.t", 0, 0, 200).await;
        dead = records_with_headers(&p.records);
        if !dead.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(dead.len(), 1, "{dead:?}");
    let (value, headers) = &dead[0];
    assert_eq!(value, "a0");
    assert!(
        headers.contains(&("__dlq.errors.offset".to_string(), "0".to_string())),
        "{headers:?}"
    );
    cluster.shutdown().await;
}
