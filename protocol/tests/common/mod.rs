//! Populated requests of every guarded api at any version, encoded with
//! kafka-protocol's client side, shared by the round-trip and hostile tests.
#![allow(dead_code)]

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use protocol::versions::{ApiRange, SUPPORTED_APIS};

pub fn s(x: &'static str) -> StrBytes {
    StrBytes::from_static_str(x)
}
fn topic(x: &'static str) -> TopicName {
    TopicName(s(x))
}
fn group(x: &'static str) -> GroupId {
    GroupId(s(x))
}

/// Every API the guard covers: the served ones.
pub fn all_apis() -> impl Iterator<Item = &'static ApiRange> {
    SUPPORTED_APIS.iter()
}

/// A request of `api_key` at `v` with every array populated (two elements
/// where it matters) and strings set, using only fields `v` carries.
pub fn build(api_key: ApiKey, v: i16) -> RequestKind {
    let id = uuid::Uuid::from_u128;
    match api_key {
        ApiKey::Produce => {
            let partition = |i| {
                produce_request::PartitionProduceData::default()
                    .with_index(i)
                    .with_records(Some(Bytes::from_static(b"opaque record batch bytes")))
            };
            let topic_data = |name, n| {
                let t = produce_request::TopicProduceData::default()
                    .with_partition_data(vec![partition(0), partition(1)]);
                if v >= 13 {
                    t.with_topic_id(id(n))
                } else {
                    t.with_name(topic(name))
                }
            };
            ProduceRequest::default()
                .with_transactional_id(Some(TransactionalId(s("txn"))))
                .with_acks(-1)
                .with_timeout_ms(30_000)
                .with_topic_data(vec![topic_data("a", 1), topic_data("b", 2)])
                .into()
        }
        ApiKey::Fetch => {
            let partition = |i| {
                let p = fetch_request::FetchPartition::default()
                    .with_partition(i)
                    .with_fetch_offset(100)
                    .with_partition_max_bytes(1 << 20);
                let p = if v >= 9 {
                    p.with_current_leader_epoch(3)
                } else {
                    p
                };
                let p = if v >= 12 {
                    p.with_last_fetched_epoch(2)
                } else {
                    p
                };
                let p = if v >= 5 {
                    p.with_log_start_offset(7)
                } else {
                    p
                };
                let p = if v >= 17 {
                    p.with_replica_directory_id(id(9))
                } else {
                    p
                };
                if v >= 18 {
                    p.with_high_watermark(55)
                } else {
                    p
                }
            };
            let fetch_topic = |name, n| {
                let t = fetch_request::FetchTopic::default()
                    .with_partitions(vec![partition(0), partition(1)]);
                if v >= 13 {
                    t.with_topic_id(id(n))
                } else {
                    t.with_topic(topic(name))
                }
            };
            let forgotten = |name, n| {
                let t = fetch_request::ForgottenTopic::default().with_partitions(vec![4, 5]);
                if v >= 13 {
                    t.with_topic_id(id(n))
                } else {
                    t.with_topic(topic(name))
                }
            };
            let r = FetchRequest::default()
                .with_max_wait_ms(500)
                .with_min_bytes(1)
                .with_max_bytes(1 << 24)
                .with_isolation_level(1)
                .with_topics(vec![fetch_topic("a", 1), fetch_topic("b", 2)]);
            let r = if v <= 14 {
                r.with_replica_id(BrokerId(-1))
            } else {
                r
            };
            let r = if v >= 7 {
                r.with_session_id(12)
                    .with_session_epoch(1)
                    .with_forgotten_topics_data(vec![forgotten("c", 3), forgotten("d", 4)])
            } else {
                r
            };
            let r = if v >= 11 {
                r.with_rack_id(s("rack-1"))
            } else {
                r
            };
            let r = if v >= 12 {
                r.with_cluster_id(Some(s("cluster")))
            } else {
                r
            };
            let r = if v >= 15 {
                r.with_replica_state(
                    fetch_request::ReplicaState::default()
                        .with_replica_id(BrokerId(-1))
                        .with_replica_epoch(-1),
                )
            } else {
                r
            };
            r.into()
        }
        ApiKey::ListOffsets => {
            let partition = |i| {
                let p = list_offsets_request::ListOffsetsPartition::default()
                    .with_partition_index(i)
                    .with_timestamp(-1);
                if v >= 4 {
                    p.with_current_leader_epoch(5)
                } else {
                    p
                }
            };
            let t = |name| {
                list_offsets_request::ListOffsetsTopic::default()
                    .with_name(topic(name))
                    .with_partitions(vec![partition(0), partition(1)])
            };
            let r = ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(vec![t("a"), t("b")]);
            let r = if v >= 2 { r.with_isolation_level(1) } else { r };
            let r = if v >= 10 { r.with_timeout_ms(1000) } else { r };
            r.into()
        }
        ApiKey::Metadata => {
            let t = |name, n| {
                let t =
                    metadata_request::MetadataRequestTopic::default().with_name(Some(topic(name)));
                if v >= 10 {
                    t.with_topic_id(id(n))
                } else {
                    t
                }
            };
            let r = MetadataRequest::default().with_topics(Some(vec![t("a", 1), t("b", 2)]));
            let r = if v >= 4 {
                r.with_allow_auto_topic_creation(true)
            } else {
                r
            };
            let r = if (8..=10).contains(&v) {
                r.with_include_cluster_authorized_operations(true)
            } else {
                r
            };
            let r = if v >= 8 {
                r.with_include_topic_authorized_operations(true)
            } else {
                r
            };
            r.into()
        }
        ApiKey::ApiVersions => {
            let r = ApiVersionsRequest::default();
            if v >= 3 {
                r.with_client_software_name(s("client"))
                    .with_client_software_version(s("1.0"))
                    .into()
            } else {
                r.into()
            }
        }
        ApiKey::CreateTopics => {
            let assignment = |i| {
                create_topics_request::CreatableReplicaAssignment::default()
                    .with_partition_index(i)
                    .with_broker_ids(vec![BrokerId(1), BrokerId(2)])
            };
            let config = |k, val| {
                create_topics_request::CreatableTopicConfig::default()
                    .with_name(s(k))
                    .with_value(Some(s(val)))
            };
            let t = |name| {
                create_topics_request::CreatableTopic::default()
                    .with_name(topic(name))
                    .with_num_partitions(-1)
                    .with_replication_factor(-1)
                    .with_assignments(vec![assignment(0), assignment(1)])
                    .with_configs(vec![
                        config("cleanup.policy", "compact"),
                        config("retention.ms", "1000"),
                    ])
            };
            CreateTopicsRequest::default()
                .with_topics(vec![t("a"), t("b")])
                .with_timeout_ms(5000)
                .with_validate_only(true)
                .into()
        }
        ApiKey::DeleteTopics => {
            let r = DeleteTopicsRequest::default().with_timeout_ms(5000);
            if v >= 6 {
                let t = |name, n| {
                    delete_topics_request::DeleteTopicState::default()
                        .with_name(Some(topic(name)))
                        .with_topic_id(id(n))
                };
                r.with_topics(vec![t("a", 1), t("b", 2)]).into()
            } else {
                r.with_topic_names(vec![topic("a"), topic("b")]).into()
            }
        }
        ApiKey::DeleteRecords => {
            let p = |i| {
                delete_records_request::DeleteRecordsPartition::default()
                    .with_partition_index(i)
                    .with_offset(42)
            };
            let t = |name| {
                delete_records_request::DeleteRecordsTopic::default()
                    .with_name(topic(name))
                    .with_partitions(vec![p(0), p(1)])
            };
            DeleteRecordsRequest::default()
                .with_topics(vec![t("a"), t("b")])
                .with_timeout_ms(5000)
                .into()
        }
        ApiKey::InitProducerId => {
            let r = InitProducerIdRequest::default()
                .with_transactional_id(Some(TransactionalId(s("txn"))))
                .with_transaction_timeout_ms(60_000);
            let r = if v >= 3 {
                r.with_producer_id(ProducerId(77)).with_producer_epoch(3)
            } else {
                r
            };
            r.into()
        }
        ApiKey::DescribeConfigs => {
            let res = |name| {
                describe_configs_request::DescribeConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s(name))
                    .with_configuration_keys(Some(vec![s("retention.ms"), s("segment.bytes")]))
            };
            let r = DescribeConfigsRequest::default()
                .with_resources(vec![res("a"), res("b")])
                .with_include_synonyms(true);
            let r = if v >= 3 {
                r.with_include_documentation(true)
            } else {
                r
            };
            r.into()
        }
        ApiKey::CreatePartitions => {
            let a = || {
                create_partitions_request::CreatePartitionsAssignment::default()
                    .with_broker_ids(vec![BrokerId(1), BrokerId(2)])
            };
            let t = |name| {
                create_partitions_request::CreatePartitionsTopic::default()
                    .with_name(topic(name))
                    .with_count(4)
                    .with_assignments(Some(vec![a(), a()]))
            };
            CreatePartitionsRequest::default()
                .with_topics(vec![t("a"), t("b")])
                .with_timeout_ms(5000)
                .with_validate_only(true)
                .into()
        }
        ApiKey::DescribeCluster => {
            let r =
                DescribeClusterRequest::default().with_include_cluster_authorized_operations(true);
            let r = if v >= 1 { r.with_endpoint_type(1) } else { r };
            let r = if v >= 2 {
                r.with_include_fenced_brokers(true)
            } else {
                r
            };
            r.into()
        }
        ApiKey::AlterConfigs => {
            let c = |name, value| {
                alter_configs_request::AlterableConfig::default()
                    .with_name(s(name))
                    .with_value(value)
            };
            let r = |name| {
                alter_configs_request::AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s(name))
                    .with_configs(vec![c("retention.ms", Some(s("1000"))), c("x", None)])
            };
            AlterConfigsRequest::default()
                .with_resources(vec![r("a"), r("b")])
                .with_validate_only(true)
                .into()
        }
        ApiKey::IncrementalAlterConfigs => {
            let c = |name, op, value| {
                incremental_alter_configs_request::AlterableConfig::default()
                    .with_name(s(name))
                    .with_config_operation(op)
                    .with_value(value)
            };
            let r = |name| {
                incremental_alter_configs_request::AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s(name))
                    .with_configs(vec![
                        c("retention.ms", 0, Some(s("1000"))),
                        c("segment.ms", 1, None),
                    ])
            };
            IncrementalAlterConfigsRequest::default()
                .with_resources(vec![r("a"), r("b")])
                .with_validate_only(true)
                .into()
        }
        ApiKey::OffsetCommit => {
            let p = |i| {
                let p = offset_commit_request::OffsetCommitRequestPartition::default()
                    .with_partition_index(i)
                    .with_committed_offset(10)
                    .with_committed_metadata(Some(s("meta")));
                if v >= 6 {
                    p.with_committed_leader_epoch(2)
                } else {
                    p
                }
            };
            let t = |name| {
                offset_commit_request::OffsetCommitRequestTopic::default()
                    .with_name(topic(name))
                    .with_partitions(vec![p(0), p(1)])
            };
            let r = OffsetCommitRequest::default()
                .with_group_id(group("g"))
                .with_generation_id_or_member_epoch(3)
                .with_member_id(s("m"))
                .with_topics(vec![t("a"), t("b")]);
            let r = if v >= 7 {
                r.with_group_instance_id(Some(s("i")))
            } else {
                r
            };
            let r = if v <= 4 {
                r.with_retention_time_ms(1000)
            } else {
                r
            };
            r.into()
        }
        ApiKey::OffsetFetch => {
            if v >= 8 {
                let t = |name| {
                    offset_fetch_request::OffsetFetchRequestTopics::default()
                        .with_name(topic(name))
                        .with_partition_indexes(vec![0, 1])
                };
                let g = |name| {
                    let g = offset_fetch_request::OffsetFetchRequestGroup::default()
                        .with_group_id(group(name))
                        .with_topics(Some(vec![t("a"), t("b")]));
                    if v >= 9 {
                        g.with_member_id(Some(s("m"))).with_member_epoch(4)
                    } else {
                        g
                    }
                };
                OffsetFetchRequest::default()
                    .with_groups(vec![g("g1"), g("g2")])
                    .with_require_stable(true)
                    .into()
            } else {
                let t = |name| {
                    offset_fetch_request::OffsetFetchRequestTopic::default()
                        .with_name(topic(name))
                        .with_partition_indexes(vec![0, 1])
                };
                let r = OffsetFetchRequest::default()
                    .with_group_id(group("g"))
                    .with_topics(Some(vec![t("a"), t("b")]));
                let r = if v >= 7 {
                    r.with_require_stable(true)
                } else {
                    r
                };
                r.into()
            }
        }
        ApiKey::FindCoordinator => {
            let r = FindCoordinatorRequest::default();
            let r = if v <= 3 { r.with_key(s("g")) } else { r };
            let r = if v >= 1 { r.with_key_type(0) } else { r };
            let r = if v >= 4 {
                r.with_coordinator_keys(vec![s("g1"), s("g2")])
            } else {
                r
            };
            r.into()
        }
        ApiKey::JoinGroup => {
            let p = |name| {
                join_group_request::JoinGroupRequestProtocol::default()
                    .with_name(s(name))
                    .with_metadata(Bytes::from_static(b"subscription"))
            };
            let r = JoinGroupRequest::default()
                .with_group_id(group("g"))
                .with_session_timeout_ms(10_000)
                .with_member_id(s("m"))
                .with_protocol_type(s("consumer"))
                .with_protocols(vec![p("range"), p("roundrobin")]);
            let r = if v >= 1 {
                r.with_rebalance_timeout_ms(30_000)
            } else {
                r
            };
            let r = if v >= 5 {
                r.with_group_instance_id(Some(s("i")))
            } else {
                r
            };
            let r = if v >= 8 {
                r.with_reason(Some(s("why")))
            } else {
                r
            };
            r.into()
        }
        ApiKey::Heartbeat => {
            let r = HeartbeatRequest::default()
                .with_group_id(group("g"))
                .with_generation_id(3)
                .with_member_id(s("m"));
            let r = if v >= 3 {
                r.with_group_instance_id(Some(s("i")))
            } else {
                r
            };
            r.into()
        }
        ApiKey::LeaveGroup => {
            let r = LeaveGroupRequest::default().with_group_id(group("g"));
            if v <= 2 {
                r.with_member_id(s("m")).into()
            } else {
                let m = |id| {
                    let m = leave_group_request::MemberIdentity::default()
                        .with_member_id(s(id))
                        .with_group_instance_id(Some(s("i")));
                    if v >= 5 {
                        m.with_reason(Some(s("bye")))
                    } else {
                        m
                    }
                };
                r.with_members(vec![m("m1"), m("m2")]).into()
            }
        }
        ApiKey::SyncGroup => {
            let a = |m| {
                sync_group_request::SyncGroupRequestAssignment::default()
                    .with_member_id(s(m))
                    .with_assignment(Bytes::from_static(b"assignment"))
            };
            let r = SyncGroupRequest::default()
                .with_group_id(group("g"))
                .with_generation_id(3)
                .with_member_id(s("m"))
                .with_assignments(vec![a("m1"), a("m2")]);
            let r = if v >= 3 {
                r.with_group_instance_id(Some(s("i")))
            } else {
                r
            };
            let r = if v >= 5 {
                r.with_protocol_type(Some(s("consumer")))
                    .with_protocol_name(Some(s("range")))
            } else {
                r
            };
            r.into()
        }
        ApiKey::DescribeGroups => {
            let r = DescribeGroupsRequest::default().with_groups(vec![group("g1"), group("g2")]);
            let r = if v >= 3 {
                r.with_include_authorized_operations(true)
            } else {
                r
            };
            r.into()
        }
        ApiKey::ListGroups => {
            let r = ListGroupsRequest::default();
            let r = if v >= 4 {
                r.with_states_filter(vec![s("Stable"), s("Empty")])
            } else {
                r
            };
            let r = if v >= 5 {
                r.with_types_filter(vec![s("classic"), s("consumer")])
            } else {
                r
            };
            r.into()
        }
        ApiKey::DeleteGroups => DeleteGroupsRequest::default()
            .with_groups_names(vec![group("g1"), group("g2")])
            .into(),
        ApiKey::OffsetDelete => {
            let t = |name| {
                offset_delete_request::OffsetDeleteRequestTopic::default()
                    .with_name(topic(name))
                    .with_partitions(vec![
                        offset_delete_request::OffsetDeleteRequestPartition::default()
                            .with_partition_index(0),
                        offset_delete_request::OffsetDeleteRequestPartition::default()
                            .with_partition_index(1),
                    ])
            };
            OffsetDeleteRequest::default()
                .with_group_id(group("g"))
                .with_topics(vec![t("a"), t("b")])
                .into()
        }
        ApiKey::ConsumerGroupHeartbeat => {
            let tp = |n| {
                consumer_group_heartbeat_request::TopicPartitions::default()
                    .with_topic_id(id(n))
                    .with_partitions(vec![0, 1])
            };
            let r = ConsumerGroupHeartbeatRequest::default()
                .with_group_id(group("g"))
                .with_member_id(s("m"))
                .with_member_epoch(1)
                .with_instance_id(Some(s("i")))
                .with_rack_id(Some(s("r")))
                .with_rebalance_timeout_ms(30_000)
                .with_subscribed_topic_names(Some(vec![topic("a"), topic("b")]))
                .with_server_assignor(Some(s("uniform")))
                .with_topic_partitions(Some(vec![tp(1), tp(2)]));
            let r = if v >= 1 {
                r.with_subscribed_topic_regex(Some(s("a.*")))
            } else {
                r
            };
            r.into()
        }
        ApiKey::ConsumerGroupDescribe => ConsumerGroupDescribeRequest::default()
            .with_group_ids(vec![group("g1"), group("g2")])
            .with_include_authorized_operations(true)
            .into(),
        ApiKey::OffsetForLeaderEpoch => {
            let p = |i| {
                offset_for_leader_epoch_request::OffsetForLeaderPartition::default()
                    .with_partition(i)
                    .with_current_leader_epoch(3)
                    .with_leader_epoch(2)
            };
            let t = |name| {
                offset_for_leader_epoch_request::OffsetForLeaderTopic::default()
                    .with_topic(topic(name))
                    .with_partitions(vec![p(0), p(1)])
            };
            let r = OffsetForLeaderEpochRequest::default().with_topics(vec![t("a"), t("b")]);
            if v >= 3 {
                r.with_replica_id(BrokerId(2)).into()
            } else {
                r.into()
            }
        }
        ApiKey::DescribeQuorum => {
            let p = |i| describe_quorum_request::PartitionData::default().with_partition_index(i);
            DescribeQuorumRequest::default()
                .with_topics(vec![describe_quorum_request::TopicData::default()
                    .with_topic_name(topic("__cluster_metadata"))
                    .with_partitions(vec![p(0), p(1)])])
                .into()
        }
        ApiKey::WriteTxnMarkers => {
            let t = |name| {
                write_txn_markers_request::WritableTxnMarkerTopic::default()
                    .with_name(topic(name))
                    .with_partition_indexes(vec![0, 1])
            };
            let m = |pid| {
                write_txn_markers_request::WritableTxnMarker::default()
                    .with_producer_id(ProducerId(pid))
                    .with_producer_epoch(3)
                    .with_transaction_result(true)
                    .with_topics(vec![t("a"), t("b")])
                    .with_coordinator_epoch(7)
            };
            WriteTxnMarkersRequest::default()
                .with_markers(vec![m(1), m(2)])
                .into()
        }
        ApiKey::DescribeProducers => {
            let t = |name| {
                describe_producers_request::TopicRequest::default()
                    .with_name(topic(name))
                    .with_partition_indexes(vec![0, 1])
            };
            DescribeProducersRequest::default()
                .with_topics(vec![t("a"), t("b")])
                .into()
        }
        ApiKey::ElectLeaders => {
            let t = |name| {
                elect_leaders_request::TopicPartitions::default()
                    .with_topic(topic(name))
                    .with_partitions(vec![0, 1, 2])
            };
            ElectLeadersRequest::default()
                .with_election_type(if v >= 1 { 1 } else { 0 })
                .with_topic_partitions(Some(vec![t("a"), t("b")]))
                .with_timeout_ms(30_000)
                .into()
        }
        ApiKey::DescribeLogDirs => {
            let t = |name| {
                describe_log_dirs_request::DescribableLogDirTopic::default()
                    .with_topic(topic(name))
                    .with_partitions(vec![0, 1])
            };
            DescribeLogDirsRequest::default()
                .with_topics(Some(vec![t("a"), t("b")]))
                .into()
        }
        ApiKey::TxnOffsetCommit => {
            let p = |i| {
                txn_offset_commit_request::TxnOffsetCommitRequestPartition::default()
                    .with_partition_index(i)
                    .with_committed_offset(10)
                    .with_committed_leader_epoch(if v >= 2 { 2 } else { -1 })
                    .with_committed_metadata(Some(s("meta")))
            };
            let t = |name| {
                txn_offset_commit_request::TxnOffsetCommitRequestTopic::default()
                    .with_name(topic(name))
                    .with_partitions(vec![p(0), p(1)])
            };
            let r = TxnOffsetCommitRequest::default()
                .with_transactional_id(TransactionalId(s("txn")))
                .with_group_id(group("g"))
                .with_producer_id(ProducerId(7))
                .with_producer_epoch(1)
                .with_topics(vec![t("a"), t("b")]);
            if v >= 3 {
                r.with_generation_id(3)
                    .with_member_id(s("m"))
                    .with_group_instance_id(Some(s("i")))
                    .into()
            } else {
                r.into()
            }
        }
        ApiKey::AddPartitionsToTxn => {
            let t = |name| {
                add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
                    .with_name(topic(name))
                    .with_partitions(vec![0, 1])
            };
            if v >= 4 {
                let txn = add_partitions_to_txn_request::AddPartitionsToTxnTransaction::default()
                    .with_transactional_id(TransactionalId(s("tx")))
                    .with_producer_id(ProducerId(9))
                    .with_producer_epoch(2)
                    .with_verify_only(true)
                    .with_topics(vec![t("a"), t("b")]);
                return AddPartitionsToTxnRequest::default()
                    .with_transactions(vec![txn])
                    .into();
            }
            AddPartitionsToTxnRequest::default()
                .with_v3_and_below_transactional_id(TransactionalId(s("tx")))
                .with_v3_and_below_producer_id(ProducerId(9))
                .with_v3_and_below_producer_epoch(2)
                .with_v3_and_below_topics(vec![t("a"), t("b")])
                .into()
        }
        ApiKey::AddOffsetsToTxn => AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(s("tx")))
            .with_producer_id(ProducerId(9))
            .with_producer_epoch(2)
            .with_group_id(GroupId(s("g")))
            .into(),
        ApiKey::EndTxn => EndTxnRequest::default()
            .with_transactional_id(TransactionalId(s("tx")))
            .with_producer_id(ProducerId(9))
            .with_producer_epoch(2)
            .with_committed(true)
            .into(),
        ApiKey::DescribeTransactions => DescribeTransactionsRequest::default()
            .with_transactional_ids(vec![TransactionalId(s("tx")), TransactionalId(s("ty"))])
            .into(),
        ApiKey::ListTransactions => {
            let r = ListTransactionsRequest::default()
                .with_state_filters(vec![s("Ongoing")])
                .with_producer_id_filters(vec![ProducerId(9)]);
            match v {
                0 => r.into(),
                1 => r.with_duration_filter(1000).into(),
                _ => r
                    .with_duration_filter(1000)
                    .with_transactional_id_pattern(Some(s("tx.*")))
                    .into(),
            }
        }
        ApiKey::DescribeAcls => DescribeAclsRequest::default()
            .with_resource_type_filter(2)
            .with_resource_name_filter(Some(s("orders")))
            .with_pattern_type_filter(3)
            .with_principal_filter(Some(s("User:alice")))
            .with_host_filter(None)
            .with_operation(3)
            .with_permission_type(3)
            .into(),
        ApiKey::CreateAcls => CreateAclsRequest::default()
            .with_creations(vec![create_acls_request::AclCreation::default()
                .with_resource_type(2)
                .with_resource_name(s("orders"))
                .with_resource_pattern_type(4)
                .with_principal(s("User:alice"))
                .with_host(s("*"))
                .with_operation(3)
                .with_permission_type(3)])
            .into(),
        ApiKey::DeleteAcls => DeleteAclsRequest::default()
            .with_filters(vec![delete_acls_request::DeleteAclsFilter::default()
                .with_resource_type_filter(1)
                .with_resource_name_filter(None)
                .with_pattern_type_filter(1)
                .with_principal_filter(Some(s("User:bob")))
                .with_host_filter(Some(s("10.0.0.1")))
                .with_operation(2)
                .with_permission_type(1)])
            .into(),
        ApiKey::SaslHandshake => SaslHandshakeRequest::default()
            .with_mechanism(s("SCRAM-SHA-512"))
            .into(),
        ApiKey::SaslAuthenticate => SaslAuthenticateRequest::default()
            .with_auth_bytes(Bytes::from_static(b"n,,n=alice,r=abcdef"))
            .into(),
        ApiKey::DescribeClientQuotas => DescribeClientQuotasRequest::default()
            .with_components(vec![
                kafka_protocol::messages::describe_client_quotas_request::ComponentData::default()
                    .with_entity_type(s("user"))
                    .with_match_type(0)
                    .with_match(Some(s("alice"))),
            ])
            .with_strict(true)
            .into(),
        ApiKey::AlterClientQuotas => {
            use kafka_protocol::messages::alter_client_quotas_request::{
                EntityData, EntryData, OpData,
            };
            AlterClientQuotasRequest::default()
                .with_entries(vec![EntryData::default()
                    .with_entity(vec![
                        EntityData::default()
                            .with_entity_type(s("user"))
                            .with_entity_name(Some(s("alice"))),
                        EntityData::default()
                            .with_entity_type(s("client-id"))
                            .with_entity_name(None),
                    ])
                    .with_ops(vec![
                        OpData::default()
                            .with_key(s("producer_byte_rate"))
                            .with_value(1024.0),
                        OpData::default()
                            .with_key(s("consumer_byte_rate"))
                            .with_remove(true),
                    ])])
                .with_validate_only(true)
                .into()
        }
        ApiKey::DescribeUserScramCredentials => DescribeUserScramCredentialsRequest::default()
            .with_users(Some(vec![
                kafka_protocol::messages::describe_user_scram_credentials_request::UserName::default()
                    .with_name(s("alice")),
            ]))
            .into(),
        ApiKey::AlterUserScramCredentials => {
            use kafka_protocol::messages::alter_user_scram_credentials_request::{
                ScramCredentialDeletion, ScramCredentialUpsertion,
            };
            AlterUserScramCredentialsRequest::default()
                .with_deletions(vec![ScramCredentialDeletion::default()
                    .with_name(s("bob"))
                    .with_mechanism(1)])
                .with_upsertions(vec![ScramCredentialUpsertion::default()
                    .with_name(s("alice"))
                    .with_mechanism(2)
                    .with_iterations(4096)
                    .with_salt(Bytes::from_static(b"salt"))
                    .with_salted_password(Bytes::from_static(&[7u8; 64]))])
                .into()
        }
        ApiKey::InitializeShareGroupState => {
            use kafka_protocol::messages::initialize_share_group_state_request::*;
            InitializeShareGroupStateRequest::default()
                .with_group_id(s("g"))
                .with_topics(vec![InitializeStateData::default()
                    .with_topic_id(uuid::Uuid::from_u128(7))
                    .with_partitions(vec![PartitionData::default()
                        .with_partition(3)
                        .with_state_epoch(1)
                        .with_start_offset(42)])])
                .into()
        }
        ApiKey::ReadShareGroupState => {
            use kafka_protocol::messages::read_share_group_state_request::*;
            ReadShareGroupStateRequest::default()
                .with_group_id(s("g"))
                .with_topics(vec![ReadStateData::default()
                    .with_topic_id(uuid::Uuid::from_u128(7))
                    .with_partitions(vec![PartitionData::default()
                        .with_partition(3)
                        .with_leader_epoch(2)])])
                .into()
        }
        ApiKey::WriteShareGroupState => {
            use kafka_protocol::messages::write_share_group_state_request::*;
            WriteShareGroupStateRequest::default()
                .with_group_id(s("g"))
                .with_topics(vec![WriteStateData::default()
                    .with_topic_id(uuid::Uuid::from_u128(7))
                    .with_partitions(vec![PartitionData::default()
                        .with_partition(3)
                        .with_state_epoch(1)
                        .with_leader_epoch(2)
                        .with_start_offset(40)
                        .with_state_batches(vec![
                            StateBatch::default()
                                .with_first_offset(40)
                                .with_last_offset(44)
                                .with_delivery_state(2)
                                .with_delivery_count(1),
                            StateBatch::default()
                                .with_first_offset(45)
                                .with_last_offset(45)
                                .with_delivery_state(4)
                                .with_delivery_count(5),
                        ])])])
                .into()
        }
        ApiKey::DeleteShareGroupState => {
            use kafka_protocol::messages::delete_share_group_state_request::*;
            DeleteShareGroupStateRequest::default()
                .with_group_id(s("g"))
                .with_topics(vec![DeleteStateData::default()
                    .with_topic_id(uuid::Uuid::from_u128(7))
                    .with_partitions(vec![PartitionData::default().with_partition(3)])])
                .into()
        }
        ApiKey::ReadShareGroupStateSummary => {
            use kafka_protocol::messages::read_share_group_state_summary_request::*;
            ReadShareGroupStateSummaryRequest::default()
                .with_group_id(s("g"))
                .with_topics(vec![ReadStateSummaryData::default()
                    .with_topic_id(uuid::Uuid::from_u128(7))
                    .with_partitions(vec![PartitionData::default()
                        .with_partition(3)
                        .with_leader_epoch(2)])])
                .into()
        }
        ApiKey::ShareGroupHeartbeat => {
            use kafka_protocol::messages::share_group_heartbeat_request::*;
            ShareGroupHeartbeatRequest::default()
                .with_group_id(kafka_protocol::messages::GroupId(s("g")))
                .with_member_id(StrBytes::from_static_str("m"))
                .with_rack_id(Some(StrBytes::from_static_str("r")))
                .with_subscribed_topic_names(Some(vec![kafka_protocol::messages::TopicName(s("t")), kafka_protocol::messages::TopicName(s("u"))]))
                .into()
        }
        ApiKey::ShareGroupDescribe => {
            use kafka_protocol::messages::share_group_describe_request::*;
            ShareGroupDescribeRequest::default()
                .with_group_ids(vec![kafka_protocol::messages::GroupId(s("g")), kafka_protocol::messages::GroupId(s("h"))])
                .with_include_authorized_operations(true)
                .into()
        }
        ApiKey::ShareFetch => {
            use kafka_protocol::messages::share_fetch_request::*;
            ShareFetchRequest::default()
                .with_group_id(Some(kafka_protocol::messages::GroupId(s("g"))))
                .with_member_id(Some(StrBytes::from_static_str("m")))
                .with_share_session_epoch(3)
                .with_max_wait_ms(500)
                .with_max_bytes(1 << 20)
                .with_max_records(500)
                .with_batch_size(500)
                .with_topics(vec![FetchTopic::default()
                    .with_topic_id(uuid::Uuid::from_u128(7))
                    .with_partitions(vec![FetchPartition::default()
                        .with_partition_index(3)
                        .with_acknowledgement_batches(vec![AcknowledgementBatch::default()
                            .with_first_offset(10)
                            .with_last_offset(12)
                            .with_acknowledge_types(vec![1, 2, 3])])])])
                .with_forgotten_topics_data(vec![ForgottenTopic::default()
                    .with_topic_id(uuid::Uuid::from_u128(8))
                    .with_partitions(vec![0, 1])])
                .into()
        }
        ApiKey::ShareAcknowledge => {
            use kafka_protocol::messages::share_acknowledge_request::*;
            ShareAcknowledgeRequest::default()
                .with_group_id(Some(kafka_protocol::messages::GroupId(s("g"))))
                .with_member_id(Some(StrBytes::from_static_str("m")))
                .with_share_session_epoch(4)
                .with_topics(vec![AcknowledgeTopic::default()
                    .with_topic_id(uuid::Uuid::from_u128(7))
                    .with_partitions(vec![AcknowledgePartition::default()
                        .with_partition_index(3)
                        .with_acknowledgement_batches(vec![AcknowledgementBatch::default()
                            .with_first_offset(10)
                            .with_last_offset(10)
                            .with_acknowledge_types(vec![1])])])])
                .into()
        }
        ApiKey::DescribeShareGroupOffsets => {
            use kafka_protocol::messages::describe_share_group_offsets_request::*;
            DescribeShareGroupOffsetsRequest::default()
                .with_groups(vec![DescribeShareGroupOffsetsRequestGroup::default()
                    .with_group_id(kafka_protocol::messages::GroupId(s("g")))
                    .with_topics(Some(vec![DescribeShareGroupOffsetsRequestTopic::default()
                        .with_topic_name(kafka_protocol::messages::TopicName(s("t")))
                        .with_partitions(vec![0, 1])]))])
                .into()
        }
        ApiKey::AlterShareGroupOffsets => {
            use kafka_protocol::messages::alter_share_group_offsets_request::*;
            AlterShareGroupOffsetsRequest::default()
                .with_group_id(kafka_protocol::messages::GroupId(s("g")))
                .with_topics(vec![AlterShareGroupOffsetsRequestTopic::default()
                    .with_topic_name(kafka_protocol::messages::TopicName(s("t")))
                    .with_partitions(vec![AlterShareGroupOffsetsRequestPartition::default()
                        .with_partition_index(1)
                        .with_start_offset(42)])])
                .into()
        }
        ApiKey::DeleteShareGroupOffsets => {
            use kafka_protocol::messages::delete_share_group_offsets_request::*;
            DeleteShareGroupOffsetsRequest::default()
                .with_group_id(kafka_protocol::messages::GroupId(s("g")))
                .with_topics(vec![DeleteShareGroupOffsetsRequestTopic::default()
                    .with_topic_name(kafka_protocol::messages::TopicName(s("t")))])
                .into()
        }
        other => panic!("no test builder for {other:?}"),
    }
}

pub const CORRELATION_ID: i32 = 0x0102_0304;

/// The header (with a client id) and body of `request` at `v`, unframed.
pub fn encode(api_key: ApiKey, v: i16, body: &RequestKind) -> (Bytes, usize) {
    let header = RequestHeader::default()
        .with_request_api_key(api_key as i16)
        .with_request_api_version(v)
        .with_correlation_id(CORRELATION_ID)
        .with_client_id(Some(s("test-client")));
    let mut out = BytesMut::new();
    header
        .encode(&mut out, api_key.request_header_version(v))
        .expect("header encodes");
    let header_len = out.len();
    protocol::newer::encode_request_body(api_key, v, body, None, &mut out)
        .unwrap_or_else(|e| panic!("{api_key:?} v{v} encodes: {e:#}"));
    (out.freeze(), header_len)
}
