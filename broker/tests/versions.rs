//! Every API in the ApiVersions table, at every version we accept, answered
//! over the wire: a handler that sets a field its response version lacks
//! fails to encode, and this test finds it.

mod common;

use common::{batch, start, Client};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::records::Compression;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// Writes an encoded request body.
type BodyWriter = Box<dyn FnOnce(&mut Vec<u8>)>;

/// A representative request for `key` at `version`, using only fields that
/// version has.
fn request(key: ApiKey, version: i16, topic_id: uuid::Uuid) -> BodyWriter {
    fn enc<R: Encodable + 'static>(r: R, version: i16) -> BodyWriter {
        Box::new(move |out: &mut Vec<u8>| {
            let mut b = bytes::BytesMut::new();
            r.encode(&mut b, version).unwrap();
            out.extend_from_slice(&b);
        })
    }
    // Versions newer than kafka-protocol's, as clients send them.
    fn newer(key: ApiKey, r: RequestKind, version: i16) -> BodyWriter {
        Box::new(move |out: &mut Vec<u8>| {
            let mut b = bytes::BytesMut::new();
            protocol::newer::encode_request_body(key, version, &r, None, &mut b).unwrap();
            out.extend_from_slice(&b);
        })
    }
    match key {
        ApiKey::ApiVersions => enc(
            ApiVersionsRequest::default()
                .with_client_software_name(if version >= 3 {
                    StrBytes::from_static_str("t")
                } else {
                    StrBytes::default()
                })
                .with_client_software_version(if version >= 3 {
                    StrBytes::from_static_str("1")
                } else {
                    StrBytes::default()
                }),
            version,
        ),
        ApiKey::Metadata => {
            let mut t = metadata_request::MetadataRequestTopic::default();
            t.name = Some(name("sweep"));
            enc(
                MetadataRequest::default().with_topics(Some(vec![t])),
                version,
            )
        }
        ApiKey::Produce => {
            let mut pd = produce_request::PartitionProduceData::default();
            pd.records = Some(batch(&["v"], Compression::None, None));
            let mut td = produce_request::TopicProduceData::default();
            td.name = name("sweep");
            td.partition_data = vec![pd];
            enc(
                ProduceRequest::default()
                    .with_acks(1)
                    .with_timeout_ms(1000)
                    .with_topic_data(vec![td]),
                version,
            )
        }
        ApiKey::Fetch => {
            let mut fp = fetch_request::FetchPartition::default();
            fp.partition_max_bytes = 1 << 20;
            let mut ft = fetch_request::FetchTopic::default();
            if version >= 13 {
                ft.topic_id = topic_id;
            } else {
                ft.topic = name("sweep");
            }
            ft.partitions = vec![fp];
            let mut r = FetchRequest::default()
                .with_max_wait_ms(0)
                .with_min_bytes(1)
                .with_max_bytes(1 << 20)
                .with_topics(vec![ft]);
            if version < 15 {
                r.replica_id = BrokerId(-1);
            }
            enc(r, version)
        }
        ApiKey::ListOffsets => {
            let mut p = list_offsets_request::ListOffsetsPartition::default();
            p.timestamp = -1;
            let mut t = list_offsets_request::ListOffsetsTopic::default();
            t.name = name("sweep");
            t.partitions = vec![p];
            enc(
                ListOffsetsRequest::default()
                    .with_replica_id(BrokerId(-1))
                    .with_topics(vec![t]),
                version,
            )
        }
        ApiKey::CreateTopics => {
            let mut t = create_topics_request::CreatableTopic::default();
            t.name = name(&format!("sweep-create-{version}"));
            t.num_partitions = 1;
            t.replication_factor = 1;
            enc(
                CreateTopicsRequest::default()
                    .with_topics(vec![t])
                    .with_timeout_ms(1000),
                version,
            )
        }
        ApiKey::DeleteTopics => {
            let n = format!("sweep-create-{}", 2 + version % 6);
            let mut r = DeleteTopicsRequest::default().with_timeout_ms(1000);
            if version >= 6 {
                let mut t = delete_topics_request::DeleteTopicState::default();
                t.name = Some(name(&n));
                r.topics = vec![t];
            } else {
                r.topic_names = vec![name(&n)];
            }
            enc(r, version)
        }
        ApiKey::CreatePartitions => {
            let mut t = create_partitions_request::CreatePartitionsTopic::default();
            t.name = name("sweep");
            t.count = 1;
            t.assignments = None;
            enc(
                CreatePartitionsRequest::default()
                    .with_topics(vec![t])
                    .with_validate_only(true),
                version,
            )
        }
        ApiKey::InitProducerId => enc(
            InitProducerIdRequest::default()
                .with_transactional_id(None)
                .with_transaction_timeout_ms(1000),
            version,
        ),
        ApiKey::DescribeConfigs => {
            let mut t = describe_configs_request::DescribeConfigsResource::default();
            t.resource_type = 2;
            t.resource_name = StrBytes::from_static_str("sweep");
            let mut b = describe_configs_request::DescribeConfigsResource::default();
            b.resource_type = 4;
            b.resource_name = StrBytes::from_static_str("1");
            enc(
                DescribeConfigsRequest::default()
                    .with_resources(vec![t, b])
                    .with_include_synonyms(true),
                version,
            )
        }
        ApiKey::DescribeCluster => enc(DescribeClusterRequest::default(), version),
        ApiKey::DeleteRecords => {
            let mut p = delete_records_request::DeleteRecordsPartition::default();
            p.offset = 0;
            let mut t = delete_records_request::DeleteRecordsTopic::default();
            t.name = name("sweep");
            t.partitions = vec![p];
            enc(
                DeleteRecordsRequest::default()
                    .with_topics(vec![t])
                    .with_timeout_ms(1000),
                version,
            )
        }
        ApiKey::AlterConfigs => {
            let mut c = alter_configs_request::AlterableConfig::default();
            c.name = StrBytes::from_static_str("retention.ms");
            c.value = Some(StrBytes::from_static_str("86400000"));
            let mut r = alter_configs_request::AlterConfigsResource::default();
            r.resource_type = 2;
            r.resource_name = StrBytes::from_static_str("sweep");
            r.configs = vec![c];
            enc(
                AlterConfigsRequest::default().with_resources(vec![r]),
                version,
            )
        }
        ApiKey::IncrementalAlterConfigs => {
            let mut c = incremental_alter_configs_request::AlterableConfig::default();
            c.name = StrBytes::from_static_str("retention.ms");
            c.value = Some(StrBytes::from_static_str("86400000"));
            let mut r = incremental_alter_configs_request::AlterConfigsResource::default();
            r.resource_type = 2;
            r.resource_name = StrBytes::from_static_str("sweep");
            r.configs = vec![c];
            enc(
                IncrementalAlterConfigsRequest::default().with_resources(vec![r]),
                version,
            )
        }
        ApiKey::FindCoordinator => {
            let mut r = FindCoordinatorRequest::default();
            if version >= 4 {
                r.coordinator_keys = vec![StrBytes::from_static_str("sweep-group")];
            } else {
                r.key = StrBytes::from_static_str("sweep-group");
            }
            enc(r, version)
        }
        // Without protocols a join is refused at once (INCONSISTENT_GROUP_PROTOCOL):
        // the sweep checks that every version's response encodes, not the
        // rebalance, which tests/groups.rs covers.
        ApiKey::JoinGroup => enc(
            JoinGroupRequest::default()
                .with_group_id(GroupId(StrBytes::from_static_str("sweep-group")))
                .with_session_timeout_ms(10_000)
                .with_protocol_type(StrBytes::from_static_str("consumer")),
            version,
        ),
        ApiKey::SyncGroup => enc(
            SyncGroupRequest::default()
                .with_group_id(GroupId(StrBytes::from_static_str("sweep-group")))
                .with_member_id(StrBytes::from_static_str("nobody")),
            version,
        ),
        ApiKey::Heartbeat => enc(
            HeartbeatRequest::default()
                .with_group_id(GroupId(StrBytes::from_static_str("sweep-group")))
                .with_member_id(StrBytes::from_static_str("nobody")),
            version,
        ),
        ApiKey::LeaveGroup => {
            let mut r = LeaveGroupRequest::default()
                .with_group_id(GroupId(StrBytes::from_static_str("sweep-group")));
            if version >= 3 {
                let mut m = leave_group_request::MemberIdentity::default();
                m.member_id = StrBytes::from_static_str("nobody");
                r.members = vec![m];
            } else {
                r.member_id = StrBytes::from_static_str("nobody");
            }
            enc(r, version)
        }
        ApiKey::OffsetCommit => {
            let mut p = offset_commit_request::OffsetCommitRequestPartition::default();
            p.committed_offset = 1;
            let mut t = offset_commit_request::OffsetCommitRequestTopic::default();
            t.name = name("sweep");
            t.partitions = vec![p];
            enc(
                OffsetCommitRequest::default()
                    .with_group_id(GroupId(StrBytes::from_static_str("sweep-commit")))
                    .with_generation_id_or_member_epoch(-1)
                    .with_topics(vec![t]),
                version,
            )
        }
        ApiKey::OffsetFetch => {
            let mut r = OffsetFetchRequest::default();
            if version >= 8 {
                let mut t = offset_fetch_request::OffsetFetchRequestTopics::default();
                t.name = name("sweep");
                t.partition_indexes = vec![0];
                let mut g = offset_fetch_request::OffsetFetchRequestGroup::default();
                g.group_id = GroupId(StrBytes::from_static_str("sweep-commit"));
                g.topics = Some(vec![t]);
                r.groups = vec![g];
            } else {
                let mut t = offset_fetch_request::OffsetFetchRequestTopic::default();
                t.name = name("sweep");
                t.partition_indexes = vec![0];
                r.group_id = GroupId(StrBytes::from_static_str("sweep-commit"));
                r.topics = Some(vec![t]);
            }
            enc(r, version)
        }
        ApiKey::TxnOffsetCommit => {
            let mut p = txn_offset_commit_request::TxnOffsetCommitRequestPartition::default();
            p.committed_offset = 1;
            let mut t = txn_offset_commit_request::TxnOffsetCommitRequestTopic::default();
            t.name = name("sweep");
            t.partitions = vec![p];
            enc(
                TxnOffsetCommitRequest::default()
                    .with_transactional_id(TransactionalId(StrBytes::from_static_str("sweep-txn")))
                    .with_group_id(GroupId(StrBytes::from_static_str("sweep-txn-commit")))
                    .with_producer_id(ProducerId(1000 + i64::from(version)))
                    .with_producer_epoch(0)
                    .with_generation_id(-1)
                    .with_topics(vec![t]),
                version,
            )
        }
        ApiKey::OffsetDelete => {
            let mut p = offset_delete_request::OffsetDeleteRequestPartition::default();
            p.partition_index = 0;
            let mut t = offset_delete_request::OffsetDeleteRequestTopic::default();
            t.name = name("sweep");
            t.partitions = vec![p];
            enc(
                OffsetDeleteRequest::default()
                    .with_group_id(GroupId(StrBytes::from_static_str("sweep-commit")))
                    .with_topics(vec![t]),
                version,
            )
        }
        ApiKey::ListGroups => enc(ListGroupsRequest::default(), version),
        ApiKey::DescribeGroups => enc(
            DescribeGroupsRequest::default().with_groups(vec![
                GroupId(StrBytes::from_static_str("sweep-commit")),
                GroupId(StrBytes::from_static_str("no-such-group")),
            ]),
            version,
        ),
        ApiKey::DeleteGroups => enc(
            DeleteGroupsRequest::default()
                .with_groups_names(vec![GroupId(StrBytes::from_static_str("no-such-group"))]),
            version,
        ),
        ApiKey::ConsumerGroupHeartbeat => enc(
            ConsumerGroupHeartbeatRequest::default()
                .with_group_id(GroupId(StrBytes::from_static_str("sweep-848")))
                .with_member_id(StrBytes::from_string(uuid::Uuid::new_v4().to_string()))
                .with_member_epoch(0)
                .with_rebalance_timeout_ms(10_000)
                .with_subscribed_topic_names(Some(vec![name("sweep")]))
                .with_topic_partitions(Some(vec![])),
            version,
        ),
        ApiKey::ConsumerGroupDescribe => enc(
            ConsumerGroupDescribeRequest::default().with_group_ids(vec![
                GroupId(StrBytes::from_static_str("sweep-848")),
                GroupId(StrBytes::from_static_str("sweep-commit")),
            ]),
            version,
        ),
        ApiKey::OffsetForLeaderEpoch => {
            let mut p = offset_for_leader_epoch_request::OffsetForLeaderPartition::default();
            p.current_leader_epoch = -1;
            p.leader_epoch = 0;
            let mut t = offset_for_leader_epoch_request::OffsetForLeaderTopic::default();
            t.topic = name("sweep");
            t.partitions = vec![p];
            let mut r = OffsetForLeaderEpochRequest::default().with_topics(vec![t]);
            if version >= 3 {
                r.replica_id = BrokerId(-1);
            }
            enc(r, version)
        }
        ApiKey::DescribeQuorum => {
            let mut p = describe_quorum_request::PartitionData::default();
            p.partition_index = 0;
            let mut t = describe_quorum_request::TopicData::default();
            t.topic_name = name("__cluster_metadata");
            t.partitions = vec![p];
            enc(
                DescribeQuorumRequest::default().with_topics(vec![t]),
                version,
            )
        }
        ApiKey::WriteTxnMarkers => {
            let mut t = write_txn_markers_request::WritableTxnMarkerTopic::default();
            t.name = name("sweep");
            t.partition_indexes = vec![0];
            let mut m = write_txn_markers_request::WritableTxnMarker::default();
            m.producer_id = ProducerId(1000 + i64::from(version));
            m.transaction_result = true;
            m.topics = vec![t];
            enc(
                WriteTxnMarkersRequest::default().with_markers(vec![m]),
                version,
            )
        }
        ApiKey::ElectLeaders => {
            let mut t = elect_leaders_request::TopicPartitions::default();
            t.topic = name("sweep");
            t.partitions = vec![0];
            enc(
                ElectLeadersRequest::default()
                    .with_topic_partitions(Some(vec![t]))
                    .with_timeout_ms(5_000),
                version,
            )
        }
        ApiKey::DescribeLogDirs => enc(DescribeLogDirsRequest::default(), version),
        ApiKey::DescribeProducers => {
            let mut t = describe_producers_request::TopicRequest::default();
            t.name = name("sweep");
            t.partition_indexes = vec![0];
            enc(
                DescribeProducersRequest::default().with_topics(vec![t]),
                version,
            )
        }
        ApiKey::AddPartitionsToTxn => {
            let mut t = add_partitions_to_txn_request::AddPartitionsToTxnTopic::default();
            t.name = name("sweep");
            t.partitions = vec![0];
            if version >= 4 {
                // The batched form a partition leader sends.
                let txn = add_partitions_to_txn_request::AddPartitionsToTxnTransaction::default()
                    .with_transactional_id(TransactionalId(s("sweep-tx")))
                    .with_producer_id(ProducerId(1))
                    .with_verify_only(true)
                    .with_topics(vec![t]);
                enc(
                    AddPartitionsToTxnRequest::default().with_transactions(vec![txn]),
                    version,
                )
            } else {
                enc(
                    AddPartitionsToTxnRequest::default()
                        .with_v3_and_below_transactional_id(TransactionalId(s("sweep-tx")))
                        .with_v3_and_below_producer_id(ProducerId(1))
                        .with_v3_and_below_producer_epoch(0)
                        .with_v3_and_below_topics(vec![t]),
                    version,
                )
            }
        }
        ApiKey::AddOffsetsToTxn => enc(
            AddOffsetsToTxnRequest::default()
                .with_transactional_id(TransactionalId(s("sweep-tx")))
                .with_producer_id(ProducerId(1))
                .with_group_id(GroupId(s("sweep-group"))),
            version,
        ),
        ApiKey::EndTxn => enc(
            EndTxnRequest::default()
                .with_transactional_id(TransactionalId(s("sweep-tx")))
                .with_producer_id(ProducerId(1))
                .with_committed(true),
            version,
        ),
        ApiKey::DescribeTransactions => enc(
            DescribeTransactionsRequest::default()
                .with_transactional_ids(vec![TransactionalId(s("sweep-tx"))]),
            version,
        ),
        ApiKey::ListTransactions => enc(ListTransactionsRequest::default(), version),
        ApiKey::DescribeAcls => enc(DescribeAclsRequest::default(), version),
        ApiKey::CreateAcls => enc(CreateAclsRequest::default(), version),
        ApiKey::DeleteAcls => enc(DeleteAclsRequest::default(), version),
        ApiKey::SaslHandshake => enc(
            SaslHandshakeRequest::default().with_mechanism(s("PLAIN")),
            version,
        ),
        ApiKey::SaslAuthenticate => enc(SaslAuthenticateRequest::default(), version),
        ApiKey::DescribeUserScramCredentials => {
            enc(DescribeUserScramCredentialsRequest::default(), version)
        }
        ApiKey::DescribeClientQuotas => enc(DescribeClientQuotasRequest::default(), version),
        ApiKey::AlterClientQuotas => enc(AlterClientQuotasRequest::default(), version),
        ApiKey::AlterUserScramCredentials => {
            enc(AlterUserScramCredentialsRequest::default(), version)
        }
        // Empty requests: each answers with no results.
        ApiKey::InitializeShareGroupState => enc(
            InitializeShareGroupStateRequest::default().with_group_id(s("g")),
            version,
        ),
        ApiKey::ReadShareGroupState => enc(
            ReadShareGroupStateRequest::default().with_group_id(s("g")),
            version,
        ),
        ApiKey::WriteShareGroupState => enc(
            WriteShareGroupStateRequest::default().with_group_id(s("g")),
            version,
        ),
        ApiKey::DeleteShareGroupState => enc(
            DeleteShareGroupStateRequest::default().with_group_id(s("g")),
            version,
        ),
        ApiKey::ReadShareGroupStateSummary => enc(
            ReadShareGroupStateSummaryRequest::default().with_group_id(s("g")),
            version,
        ),
        // A member's first heartbeat, a describe of no group, and share
        // requests without a session (each answers with an error).
        ApiKey::ShareGroupHeartbeat => enc(
            ShareGroupHeartbeatRequest::default()
                .with_group_id(GroupId(s("g")))
                .with_member_id(s("m"))
                .with_subscribed_topic_names(Some(vec![TopicName(s("t"))])),
            version,
        ),
        ApiKey::ShareGroupDescribe => enc(ShareGroupDescribeRequest::default(), version),
        ApiKey::ShareFetch => newer(
            key,
            ShareFetchRequest::default()
                .with_group_id(Some(GroupId(s("g"))))
                .with_member_id(Some(s("m")))
                .with_share_session_epoch(5)
                .into(),
            version,
        ),
        ApiKey::ShareAcknowledge => newer(
            key,
            ShareAcknowledgeRequest::default()
                .with_group_id(Some(GroupId(s("g"))))
                .with_member_id(Some(s("m")))
                .with_share_session_epoch(5)
                .into(),
            version,
        ),
        ApiKey::DescribeShareGroupOffsets => newer(
            key,
            DescribeShareGroupOffsetsRequest::default().into(),
            version,
        ),
        ApiKey::AlterShareGroupOffsets => enc(
            AlterShareGroupOffsetsRequest::default().with_group_id(GroupId(s("g"))),
            version,
        ),
        ApiKey::DeleteShareGroupOffsets => enc(
            DeleteShareGroupOffsetsRequest::default().with_group_id(GroupId(s("g"))),
            version,
        ),
        other => panic!("no sweep request for {other:?}: add one when adding the API"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_advertised_version_gets_an_answer() {
    let b = start(&[]).await;
    let addr = b.running.local_addr;
    let mut c = Client::connect(addr).await;
    assert_eq!(c.create_topic("sweep", 1, &[]).await, 0);
    let meta: MetadataResponse = c
        .call(
            ApiKey::Metadata,
            12,
            &MetadataRequest::default().with_topics(None),
        )
        .await;
    let topic_id = meta
        .topics
        .iter()
        .find(|t| t.name.as_ref().map(|n| &*n.0) == Some("sweep"))
        .unwrap()
        .topic_id;
    let mut answered = 0;
    for api in protocol::versions::SUPPORTED_APIS {
        for version in api.min_accepted_version..=api.max_version {
            let mut body = Vec::new();
            request(api.api_key, version, topic_id)(&mut body);
            let header_version = api.api_key.request_header_version(version);
            let mut frame = bytes::BytesMut::new();
            RequestHeader::default()
                .with_request_api_key(api.api_key as i16)
                .with_request_api_version(version)
                .with_correlation_id(version as i32)
                .with_client_id(Some(StrBytes::from_static_str("sweep")))
                .encode(&mut frame, header_version)
                .unwrap();
            frame.extend_from_slice(&body);
            // A fresh connection per request: a close cannot hide behind the next call.
            let mut one = Client::connect(addr).await;
            let mut framed = (frame.len() as i32).to_be_bytes().to_vec();
            framed.extend_from_slice(&frame);
            one.send_raw(&framed).await;
            let resp = one.read_frame().await;
            assert!(
                resp.is_some(),
                "{:?} v{version}: connection closed without a response",
                api.api_key
            );
            answered += 1;
        }
    }
    assert!(answered > 50, "only {answered} api versions swept");
    b.running.shutdown().await;
}
