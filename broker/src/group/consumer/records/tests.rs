//! KIP-848 records: byte layouts built by hand from Kafka's JSON schemas,
//! and groups driven by heartbeats that go through records and come back.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::group::consumer::{ConsumerGroupCoordinator, ConsumerHeartbeat, TopicsView};
use crate::group::records::{decode, encode};

fn tid(n: u8) -> TopicId {
    TopicId(Uuid::from_bytes([n; 16]))
}

#[derive(Clone, Debug, Default)]
struct Topics(BTreeMap<String, TopicMetadata>);

impl Topics {
    fn with(topics: &[(&str, u8, i32)]) -> Self {
        Topics(
            topics
                .iter()
                .map(|&(name, id, partition_count)| {
                    (
                        name.to_string(),
                        TopicMetadata {
                            topic_id: tid(id),
                            partition_count,
                        },
                    )
                })
                .collect(),
        )
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

    fn topic_names(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }
}

/// A consumer: what it last heard and what it owns; it revokes and takes
/// at once on every assignment.
struct Client {
    member_id: MemberId,
    instance_id: Option<GroupInstanceId>,
    epoch: Epoch,
    owned: Assignment,
    topics: Vec<String>,
    assignor: Option<String>,
    rack_id: Option<String>,
}

impl Client {
    fn new(member_id: &str, topics: &[&str]) -> Self {
        Client {
            member_id: MemberId(member_id.to_string()),
            instance_id: None,
            epoch: Epoch::JOIN,
            owned: Assignment::new(),
            topics: topics.iter().map(|t| t.to_string()).collect(),
            assignor: None,
            rack_id: None,
        }
    }

    fn request(&self) -> ConsumerHeartbeat {
        let joining = self.epoch == Epoch::JOIN;
        ConsumerHeartbeat {
            member_id: self.member_id.clone(),
            member_epoch: self.epoch,
            instance_id: self.instance_id.clone(),
            rack_id: self.rack_id.clone(),
            rebalance_timeout_ms: if joining { 30_000 } else { -1 },
            subscribed_topic_names: joining.then(|| self.topics.clone()),
            server_assignor: if joining { self.assignor.clone() } else { None },
            owned_topic_partitions: Some(self.owned.clone()),
            api_version: 1,
            client_id: format!("client-{}", self.member_id.as_str()),
            client_host: "/127.0.0.1".to_string(),
            ..ConsumerHeartbeat::default()
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
            now_ms: 1_000,
        }
    }

    fn heartbeat(&mut self, client: &mut Client) {
        self.now_ms += 10;
        let reply = self
            .coordinator
            .heartbeat("g", client.request(), &self.topics, self.now_ms)
            .expect("heartbeat");
        client.member_id = reply.member_id;
        client.epoch = reply.member_epoch;
        if let Some(a) = reply.assignment {
            client.owned = a;
        }
    }

    fn settle(&mut self, clients: &mut [&mut Client]) {
        for _ in 0..10 {
            for c in clients.iter_mut() {
                self.heartbeat(c);
            }
        }
    }

    fn snapshot(&self) -> ConsumerGroupSnapshot {
        self.coordinator.group("g").expect("group").snapshot()
    }
}

/// A stable group of three (one static, one with a rack and an explicit
/// assignor) over two topics.
fn stable_group() -> Harness {
    let mut h = Harness::new(Topics::with(&[("a", 1, 4), ("b", 2, 3)]));
    let mut x = Client::new("x", &["a", "b"]);
    let mut y = Client::new("y", &["a"]);
    y.instance_id = Some(GroupInstanceId("instance-y".to_string()));
    let mut z = Client::new("z", &["b", "a"]);
    z.rack_id = Some("rack-1".to_string());
    z.assignor = Some("uniform".to_string());
    h.heartbeat(&mut x);
    h.settle(&mut [&mut x]);
    h.heartbeat(&mut y);
    h.heartbeat(&mut z);
    h.settle(&mut [&mut x, &mut y, &mut z]);
    h
}

/// A group caught mid-rebalance: x must revoke, y waits for partitions.
fn reconciling_group() -> Harness {
    let mut h = Harness::new(Topics::with(&[("a", 1, 4)]));
    let mut x = Client::new("x", &["a"]);
    let mut y = Client::new("y", &["a"]);
    h.heartbeat(&mut x);
    h.heartbeat(&mut x);
    h.heartbeat(&mut y);
    h.heartbeat(&mut x);
    h
}

fn through_the_wire(records: &[CoordinatorRecord]) -> Vec<CoordinatorRecord> {
    records
        .iter()
        .map(|r| {
            let (key, value) = encode(r).expect("encode");
            let decoded = decode(&key, value.as_deref()).expect("decode");
            assert_eq!(&decoded, r);
            decoded
        })
        .collect()
}

fn replayed(records: &[CoordinatorRecord]) -> Vec<ConsumerGroupSnapshot> {
    let mut replay = ConsumerGroupReplay::new();
    for r in records {
        replay.apply(r);
    }
    replay.snapshots(&ConsumerGroupConfig::default())
}

#[test]
fn a_group_goes_through_records_and_comes_back_the_same() {
    for h in [stable_group(), reconciling_group()] {
        let original = h.snapshot();
        assert!(!original.members.is_empty());
        let records = through_the_wire(&snapshot_records(&original));
        assert_eq!(replayed(&records), vec![original.clone()]);

        // Restored elsewhere, the group describes as the original does.
        let mut other = ConsumerGroupCoordinator::new(ConsumerGroupConfig::default());
        for s in replayed(&records) {
            other.restore(s, h.now_ms + 5_000).expect("restore");
        }
        assert_eq!(
            other.describe("g", &h.topics),
            h.coordinator.describe("g", &h.topics)
        );
    }
}

#[test]
fn the_reconciling_group_has_members_in_every_interesting_state() {
    let s = reconciling_group().snapshot();
    let states: Vec<MemberState> = s.members.iter().map(|m| m.state).collect();
    assert!(
        states.contains(&MemberState::UnrevokedPartitions),
        "{states:?}"
    );
    assert!(s
        .members
        .iter()
        .any(|m| !m.partitions_pending_revocation.is_empty()));
}

#[test]
fn records_come_in_kafkas_order() {
    let s = stable_group().snapshot();
    let types: Vec<i16> = snapshot_records(&s)
        .iter()
        .map(|r| match r {
            CoordinatorRecord::ConsumerGroup(r) => r.key_version(),
            other => panic!("not a consumer group record: {other:?}"),
        })
        .collect();
    assert_eq!(types, vec![5, 5, 5, 4, 3, 7, 7, 7, 6, 8, 8, 8]);
}

#[test]
fn later_records_win_and_tombstones_remove() {
    let h = stable_group();
    let before = h.snapshot();
    let mut records = snapshot_records(&before);

    // A member leaves: its tombstones, then the group's new state.
    let mut after = before.clone();
    let gone = after.members.remove(0);
    after.group_epoch = Epoch(after.group_epoch.0 + 1);
    records.extend(member_tombstones("g", &gone.member_id));
    records.extend(snapshot_records(&after));
    let records = through_the_wire(&records);
    assert_eq!(replayed(&records), vec![after.clone()]);

    // The group is deleted.
    let mut deleted = records.clone();
    let ids: Vec<MemberId> = after.members.iter().map(|m| m.member_id.clone()).collect();
    deleted.extend(through_the_wire(&tombstones_for("g", &ids)));
    assert_eq!(replayed(&deleted), vec![]);

    // Tombstones of an unknown group change nothing.
    let mut stray = records;
    stray.extend(tombstones_for("other", &[MemberId("m".to_string())]));
    assert_eq!(replayed(&stray), vec![after]);
}

#[test]
fn group_tombstones_come_in_kafkas_order() {
    let m = MemberId("m".to_string());
    let types: Vec<(i16, bool)> = tombstones_for("g", &[m])
        .iter()
        .map(|r| match r {
            CoordinatorRecord::ConsumerGroup(r) => (r.key_version(), r.is_tombstone()),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        types,
        vec![
            (8, true),
            (7, true),
            (6, true),
            (5, true),
            (4, true),
            (3, true)
        ]
    );
}

#[test]
fn a_member_without_an_assignment_record_is_derived_as_kafka_does() {
    let value = ConsumerGroupMemberMetadataValue {
        instance_id: None,
        rack_id: None,
        client_id: "c".to_string(),
        client_host: "h".to_string(),
        subscribed_topic_names: vec!["b".to_string(), "a".to_string(), "a".to_string()],
        subscribed_topic_regex: None,
        rebalance_timeout_ms: 5_000,
        server_assignor: Some("range".to_string()),
        classic_member_metadata: None,
    };
    let records = vec![cg(ConsumerGroupRecord::MemberMetadata {
        group_id: "g".to_string(),
        member_id: MemberId("m".to_string()),
        value: Some(value),
    })];
    let snapshots = replayed(&records);
    assert_eq!(snapshots.len(), 1);
    let s = &snapshots[0];
    assert_eq!((s.group_epoch, s.assignment_epoch), (Epoch(0), Epoch(0)));
    assert_eq!(s.assignor, ServerAssignor::Range);
    let m = &s.members[0];
    assert_eq!(m.subscribed_topic_names, vec!["a", "b"]);
    assert_eq!(
        (m.member_epoch, m.previous_member_epoch, m.state),
        (Epoch(0), Epoch(-1), MemberState::Stable)
    );
    assert!(m.assigned_partitions.is_empty() && m.target_assignment.is_empty());
}

// Hand-built bytes, field by field from the JSON schemas.

fn key(key_type: i16, group: &str, member: Option<&str>) -> Vec<u8> {
    let mut k = key_type.to_be_bytes().to_vec();
    k.extend((group.len() as i16).to_be_bytes());
    k.extend(group.as_bytes());
    if let Some(m) = member {
        k.extend((m.len() as i16).to_be_bytes());
        k.extend(m.as_bytes());
    }
    k
}

fn check(record: ConsumerGroupRecord, key_bytes: Vec<u8>, value_bytes: Option<Vec<u8>>) {
    let record = cg(record);
    let (k, v) = encode(&record).expect("encode");
    assert_eq!(k.as_ref(), key_bytes.as_slice());
    assert_eq!(v.as_deref(), value_bytes.as_deref());
    assert_eq!(
        decode(&key_bytes, value_bytes.as_deref()).expect("decode"),
        record
    );
}

#[test]
fn group_metadata_bytes() {
    let g = || "g".to_string();
    // Epoch 7, no tagged fields.
    check(
        ConsumerGroupRecord::GroupMetadata {
            group_id: g(),
            value: Some(ConsumerGroupMetadataValue {
                epoch: Epoch(7),
                metadata_hash: 0,
                creation_time_ms: -1,
            }),
        },
        key(3, "g", None),
        Some(vec![0, 0, 0, 0, 0, 7, 0]),
    );
    // With MetadataHash (tag 0) and CreationTimeMs (tag 1).
    let mut v = vec![0, 0, 0, 0, 0, 7, 2, 0, 8];
    v.extend(0x0102_0304_0506_0708_i64.to_be_bytes());
    v.extend([1, 8]);
    v.extend(1_700_000_000_000_i64.to_be_bytes());
    check(
        ConsumerGroupRecord::GroupMetadata {
            group_id: g(),
            value: Some(ConsumerGroupMetadataValue {
                epoch: Epoch(7),
                metadata_hash: 0x0102_0304_0506_0708,
                creation_time_ms: 1_700_000_000_000,
            }),
        },
        key(3, "g", None),
        Some(v),
    );
    check(
        ConsumerGroupRecord::GroupMetadata {
            group_id: g(),
            value: None,
        },
        key(3, "g", None),
        None,
    );
}

#[test]
fn partition_metadata_bytes() {
    let mut v = vec![0, 0, 2]; // version 0, one topic
    v.extend([1; 16]);
    v.extend([2, b'a']); // compact "a"
    v.extend(4_i32.to_be_bytes());
    v.push(2); // one PartitionMetadata
    v.extend(0_i32.to_be_bytes());
    v.extend([2, 3, b'r', b'1']); // racks ["r1"]
    v.push(0); // PartitionMetadata tags
    v.push(0); // TopicMetadata tags
    v.push(0); // value tags
    check(
        ConsumerGroupRecord::PartitionMetadata {
            group_id: "g".to_string(),
            value: Some(ConsumerGroupPartitionMetadataValue {
                topics: vec![PartitionMetadataTopic {
                    topic_id: tid(1),
                    topic_name: "a".to_string(),
                    num_partitions: 4,
                    partition_racks: vec![(0, vec!["r1".to_string()])],
                }],
            }),
        },
        key(4, "g", None),
        Some(v),
    );
}

#[test]
fn member_metadata_bytes() {
    let mut v = vec![0, 0];
    v.push(0); // instanceId null
    v.extend([2, b'r']); // rackId "r"
    v.extend([2, b'c']); // clientId
    v.extend([2, b'h']); // clientHost
    v.extend([3, 2, b'a', 2, b'b']); // ["a", "b"]
    v.push(0); // regex null
    v.extend(30_000_i32.to_be_bytes());
    v.extend([6, b'r', b'a', b'n', b'g', b'e']);
    // ClassicMemberMetadata (tag 0): sessionTimeoutMs, one protocol, tags.
    let mut classic = 10_000_i32.to_be_bytes().to_vec();
    classic.extend([2, 2, b'p', 2, 9, 0, 0]);
    v.extend([1, 0, classic.len() as u8]);
    v.extend(&classic);
    check(
        ConsumerGroupRecord::MemberMetadata {
            group_id: "g".to_string(),
            member_id: MemberId("m".to_string()),
            value: Some(ConsumerGroupMemberMetadataValue {
                instance_id: None,
                rack_id: Some("r".to_string()),
                client_id: "c".to_string(),
                client_host: "h".to_string(),
                subscribed_topic_names: vec!["a".to_string(), "b".to_string()],
                subscribed_topic_regex: None,
                rebalance_timeout_ms: 30_000,
                server_assignor: Some("range".to_string()),
                classic_member_metadata: Some(Bytes::from(classic.clone())),
            }),
        },
        key(5, "g", Some("m")),
        Some(v),
    );
    check(
        ConsumerGroupRecord::MemberMetadata {
            group_id: "g".to_string(),
            member_id: MemberId("m".to_string()),
            value: None,
        },
        key(5, "g", Some("m")),
        None,
    );
}

#[test]
fn target_assignment_bytes() {
    check(
        ConsumerGroupRecord::TargetAssignmentMetadata {
            group_id: "g".to_string(),
            value: Some(Epoch(9)),
        },
        key(6, "g", None),
        Some(vec![0, 0, 0, 0, 0, 9, 0]),
    );
    let mut v = vec![0, 0, 2];
    v.extend([2; 16]);
    v.push(3);
    v.extend(0_i32.to_be_bytes());
    v.extend(2_i32.to_be_bytes());
    v.push(0);
    v.push(0);
    check(
        ConsumerGroupRecord::TargetAssignmentMember {
            group_id: "g".to_string(),
            member_id: MemberId("m".to_string()),
            value: Some(
                [(tid(2), [0, 2].into_iter().collect())]
                    .into_iter()
                    .collect(),
            ),
        },
        key(7, "g", Some("m")),
        Some(v),
    );
    check(
        ConsumerGroupRecord::TargetAssignmentMember {
            group_id: "g".to_string(),
            member_id: MemberId("m".to_string()),
            value: None,
        },
        key(7, "g", Some("m")),
        None,
    );
}

#[test]
fn current_member_assignment_bytes() {
    let mut v = vec![0, 0];
    v.extend(5_i32.to_be_bytes());
    v.extend(4_i32.to_be_bytes());
    v.push(1); // UNREVOKED_PARTITIONS
    v.push(2); // assigned: one topic
    v.extend([1; 16]);
    v.push(2);
    v.extend(3_i32.to_be_bytes());
    v.push(0);
    v.push(1); // pending revocation: none
    v.push(0);
    let value = ConsumerGroupCurrentMemberAssignmentValue {
        member_epoch: Epoch(5),
        previous_member_epoch: Epoch(4),
        state: MemberState::UnrevokedPartitions,
        assigned_partitions: [(tid(1), [3].into_iter().collect())].into_iter().collect(),
        partitions_pending_revocation: Assignment::new(),
    };
    check(
        ConsumerGroupRecord::CurrentMemberAssignment {
            group_id: "g".to_string(),
            member_id: MemberId("m".to_string()),
            value: Some(value.clone()),
        },
        key(8, "g", Some("m")),
        Some(v.clone()),
    );

    // A newer Kafka's AssignmentEpochs tag (KIP-1251) on a topic is read
    // past; an unknown state byte is UNKNOWN, as Kafka's `fromValue`.
    let mut tagged = v.clone();
    tagged[10] = 42;
    let topic_tags_at = 2 + 4 + 4 + 1 + 1 + 16 + 1 + 4;
    // One tagged field, tag 0, 5 bytes: the compact int32 array [5].
    tagged.splice(topic_tags_at..topic_tags_at + 1, [1, 0, 5, 2, 0, 0, 0, 5]);
    let decoded = decode(&key(8, "g", Some("m")), Some(&tagged)).expect("decode");
    let CoordinatorRecord::ConsumerGroup(ConsumerGroupRecord::CurrentMemberAssignment {
        value: Some(read),
        ..
    }) = decoded
    else {
        panic!("{decoded:?}");
    };
    assert_eq!(
        read,
        ConsumerGroupCurrentMemberAssignmentValue {
            state: MemberState::Unknown,
            ..value
        }
    );
}

#[test]
fn a_value_version_kafka_does_not_define_fails_the_load() {
    for key_type in 3..=8 {
        let k = key(
            key_type,
            "g",
            (key_type >= 5 && key_type != 6).then_some("m"),
        );
        assert!(matches!(
            decode(&k, Some(&[0, 1, 0, 0, 0, 0, 0])),
            Err(RecordFormatError::UnknownValueVersion { version: 1, .. })
        ));
    }
}

#[test]
fn truncated_records_are_errors() {
    let s = stable_group().snapshot();
    for r in snapshot_records(&s) {
        let (k, v) = encode(&r).expect("encode");
        for n in 0..k.len() {
            assert!(decode(&k[..n], v.as_deref()).is_err());
        }
        if let Some(v) = v {
            for n in 0..v.len() {
                assert!(decode(&k, Some(&v[..n])).is_err(), "{r:?} cut at {n}");
            }
        }
    }
}

proptest! {
    #[test]
    fn decoding_arbitrary_bytes_never_panics(
        key_type in 3i16..=8,
        key_tail in proptest::collection::vec(any::<u8>(), 0..24),
        value in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..96)),
    ) {
        let mut k = key_type.to_be_bytes().to_vec();
        k.extend(key_tail);
        let _ = decode(&k, value.as_deref());
        // And with a well-formed key, so that the value decoders run.
        let k = key(key_type, "g", Some("m"));
        if let Some(mut v) = value {
            if v.len() >= 2 {
                v[0] = 0;
                v[1] = 0;
            }
            let _ = decode(&k, Some(&v));
        }
    }
}

fn arb_name() -> impl Strategy<Value = String> {
    "[a-z0-9.-]{0,12}"
}

fn arb_member() -> impl Strategy<Value = MemberId> {
    arb_name().prop_map(MemberId)
}

fn arb_assignment() -> impl Strategy<Value = Assignment> {
    proptest::collection::btree_map(
        any::<u8>().prop_map(tid),
        proptest::collection::btree_set(any::<i32>(), 1..5),
        0..4,
    )
}

fn arb_state() -> impl Strategy<Value = MemberState> {
    prop_oneof![
        Just(MemberState::Stable),
        Just(MemberState::UnrevokedPartitions),
        Just(MemberState::UnreleasedPartitions),
        Just(MemberState::Unknown),
    ]
}

fn arb_record() -> impl Strategy<Value = ConsumerGroupRecord> {
    prop_oneof![
        (
            arb_name(),
            proptest::option::of((any::<i32>(), any::<i64>(), any::<i64>()))
        )
            .prop_map(|(group_id, v)| ConsumerGroupRecord::GroupMetadata {
                group_id,
                value: v.map(|(e, h, c)| ConsumerGroupMetadataValue {
                    epoch: Epoch(e),
                    metadata_hash: h,
                    creation_time_ms: c,
                }),
            }),
        (
            arb_name(),
            proptest::option::of(proptest::collection::vec(
                (
                    any::<u8>(),
                    arb_name(),
                    any::<i32>(),
                    proptest::collection::vec(
                        (any::<i32>(), proptest::collection::vec(arb_name(), 0..3)),
                        0..3
                    )
                ),
                0..3
            ))
        )
            .prop_map(|(group_id, v)| ConsumerGroupRecord::PartitionMetadata {
                group_id,
                value: v.map(|topics| ConsumerGroupPartitionMetadataValue {
                    topics: topics
                        .into_iter()
                        .map(|(id, name, n, racks)| PartitionMetadataTopic {
                            topic_id: tid(id),
                            topic_name: name,
                            num_partitions: n,
                            partition_racks: racks,
                        })
                        .collect(),
                }),
            }),
        (
            arb_name(),
            arb_member(),
            proptest::option::of((
                proptest::option::of(arb_name()),
                proptest::option::of(arb_name()),
                arb_name(),
                arb_name(),
                proptest::collection::vec(arb_name(), 0..4),
                proptest::option::of(arb_name()),
                any::<i32>(),
                proptest::option::of(arb_name()),
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..16)),
            ))
        )
            .prop_map(
                |(group_id, member_id, v)| ConsumerGroupRecord::MemberMetadata {
                    group_id,
                    member_id,
                    value: v.map(|(i, r, c, h, t, re, rt, sa, cm)| {
                        ConsumerGroupMemberMetadataValue {
                            instance_id: i,
                            rack_id: r,
                            client_id: c,
                            client_host: h,
                            subscribed_topic_names: t,
                            subscribed_topic_regex: re,
                            rebalance_timeout_ms: rt,
                            server_assignor: sa,
                            classic_member_metadata: cm.map(Bytes::from),
                        }
                    }),
                }
            ),
        (arb_name(), proptest::option::of(any::<i32>())).prop_map(|(group_id, v)| {
            ConsumerGroupRecord::TargetAssignmentMetadata {
                group_id,
                value: v.map(Epoch),
            }
        }),
        (
            arb_name(),
            arb_member(),
            proptest::option::of(arb_assignment())
        )
            .prop_map(|(group_id, member_id, value)| {
                ConsumerGroupRecord::TargetAssignmentMember {
                    group_id,
                    member_id,
                    value,
                }
            }),
        (
            arb_name(),
            arb_member(),
            proptest::option::of((
                any::<i32>(),
                any::<i32>(),
                arb_state(),
                arb_assignment(),
                arb_assignment()
            ))
        )
            .prop_map(|(group_id, member_id, v)| {
                ConsumerGroupRecord::CurrentMemberAssignment {
                    group_id,
                    member_id,
                    value: v.map(
                        |(e, p, s, a, r)| ConsumerGroupCurrentMemberAssignmentValue {
                            member_epoch: Epoch(e),
                            previous_member_epoch: Epoch(p),
                            state: s,
                            assigned_partitions: a,
                            partitions_pending_revocation: r,
                        },
                    ),
                }
            }),
    ]
}

proptest! {
    #[test]
    fn every_record_reads_back_as_written(record in arb_record()) {
        let record = cg(record);
        let (k, v) = encode(&record).expect("encode");
        prop_assert_eq!(decode(&k, v.as_deref()).expect("decode"), record);
    }
}
