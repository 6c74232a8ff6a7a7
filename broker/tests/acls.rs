//! ACL authorization over the wire: a broker with Kafka's StandardAuthorizer,
//! a SASL_PLAINTEXT listener with PLAIN users alice, bob and admin
//! (`super.users=User:admin`). CreateAcls, DescribeAcls and DeleteAcls with
//! their filters, DENY over ALLOW, prefixed patterns, topics hidden from
//! Metadata, a matrix of APIs (each denied with Kafka's code, then allowed
//! after an ACL), and ACLs kept across a restart.

mod common;

use common::{batch, config, Client, TestBroker};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

const JAAS: &str = r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-secret" user_admin="admin-secret" user_alice="alice-secret" user_bob="bob-secret";"#;

const TOPIC: i8 = 2;
const GROUP: i8 = 3;
const CLUSTER: i8 = 4;
const TRANSACTIONAL_ID: i8 = 5;
const LITERAL: i8 = 3;
const PREFIXED: i8 = 4;
const ALLOW: i8 = 3;
const DENY: i8 = 2;
const READ: i8 = 3;
const WRITE: i8 = 4;
const CREATE: i8 = 5;
const DELETE: i8 = 6;
const ALTER: i8 = 7;
const DESCRIBE: i8 = 8;
const ALTER_CONFIGS: i8 = 11;

/// A one-record batch.
fn one(value: &str) -> bytes::Bytes {
    batch(&[value], kafka_protocol::records::Compression::None, None)
}

fn s(x: &str) -> StrBytes {
    StrBytes::from_string(x.to_string())
}

fn settings(dir: &std::path::Path, authorizer: bool) -> broker::config::ServerConfig {
    let mut pairs = vec![
        (
            "listeners",
            "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        ),
        ("sasl.enabled.mechanisms", "PLAIN"),
        ("listener.name.sasl_plaintext.plain.sasl.jaas.config", JAAS),
        ("super.users", "User:admin;User:ANONYMOUS"),
        ("group.initial.rebalance.delay.ms", "0"),
    ];
    if authorizer {
        pairs.push((
            "authorizer.class.name",
            "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        ));
    }
    config(dir, &pairs)
}

async fn start_in(dir: &std::path::Path, authorizer: bool) -> broker::RunningBroker {
    broker::start(settings(dir, authorizer))
        .await
        .expect("broker starts")
}

async fn start(authorizer: bool) -> TestBroker {
    let dir = tempfile::tempdir().unwrap();
    let running = start_in(dir.path(), authorizer).await;
    TestBroker { running, dir }
}

fn sasl_addr(b: &broker::RunningBroker) -> std::net::SocketAddr {
    b.listener_addrs
        .iter()
        .find(|(n, _)| n == "SASL_PLAINTEXT")
        .unwrap()
        .1
}

async fn login(b: &broker::RunningBroker, user: &str) -> Client {
    let mut c = Client::connect(sasl_addr(b)).await;
    let h: SaslHandshakeResponse = c
        .call(
            ApiKey::SaslHandshake,
            1,
            &SaslHandshakeRequest::default().with_mechanism(s("PLAIN")),
        )
        .await;
    assert_eq!(h.error_code, 0);
    let a: SaslAuthenticateResponse = c
        .call(
            ApiKey::SaslAuthenticate,
            2,
            &SaslAuthenticateRequest::default()
                .with_auth_bytes(format!("\0{user}\0{user}-secret").into_bytes().into()),
        )
        .await;
    assert_eq!(a.error_code, 0, "{user} logs in");
    c
}

fn acl(
    rt: i8,
    name: &str,
    pt: i8,
    principal: &str,
    op: i8,
    perm: i8,
) -> create_acls_request::AclCreation {
    create_acls_request::AclCreation::default()
        .with_resource_type(rt)
        .with_resource_name(s(name))
        .with_resource_pattern_type(pt)
        .with_principal(s(principal))
        .with_host(s("*"))
        .with_operation(op)
        .with_permission_type(perm)
}

async fn create_acls(c: &mut Client, acls: Vec<create_acls_request::AclCreation>) -> Vec<i16> {
    let resp: CreateAclsResponse = c
        .call(
            ApiKey::CreateAcls,
            3,
            &CreateAclsRequest::default().with_creations(acls),
        )
        .await;
    resp.results.iter().map(|r| r.error_code).collect()
}

async fn grant(admin: &mut Client, acls: Vec<create_acls_request::AclCreation>) {
    let n = acls.len();
    assert_eq!(create_acls(admin, acls).await, vec![0; n]);
}

fn any_filter() -> DescribeAclsRequest {
    DescribeAclsRequest::default()
        .with_resource_type_filter(1)
        .with_pattern_type_filter(1)
        .with_operation(1)
        .with_permission_type(1)
        .with_resource_name_filter(None)
        .with_principal_filter(None)
        .with_host_filter(None)
}

async fn describe_acls(c: &mut Client, f: DescribeAclsRequest) -> DescribeAclsResponse {
    c.call(ApiKey::DescribeAcls, 3, &f).await
}

/// (resource name, pattern type, principal, operation, permission) of every
/// ACL a describe returns.
fn flatten(resp: &DescribeAclsResponse) -> Vec<(String, i8, String, i8, i8)> {
    let mut out: Vec<_> = resp
        .resources
        .iter()
        .flat_map(|r| {
            r.acls.iter().map(move |a| {
                (
                    r.resource_name.to_string(),
                    r.pattern_type,
                    a.principal.to_string(),
                    a.operation,
                    a.permission_type,
                )
            })
        })
        .collect();
    out.sort();
    out
}

async fn metadata(c: &mut Client, topics: Option<&[&str]>) -> MetadataResponse {
    let req = MetadataRequest::default()
        .with_topics(topics.map(|ts| {
            ts.iter()
                .map(|t| {
                    metadata_request::MetadataRequestTopic::default()
                        .with_name(Some(TopicName(s(t))))
                })
                .collect()
        }))
        .with_allow_auto_topic_creation(false)
        .with_include_topic_authorized_operations(true);
    c.call(ApiKey::Metadata, 12, &req).await
}

const DENIED_TOPIC: i16 = ResponseError::TopicAuthorizationFailed.code();
const DENIED_GROUP: i16 = ResponseError::GroupAuthorizationFailed.code();
const DENIED_CLUSTER: i16 = ResponseError::ClusterAuthorizationFailed.code();
const DENIED_TXN: i16 = ResponseError::TransactionalIdAuthorizationFailed.code();

#[tokio::test]
async fn without_an_authorizer_acl_apis_are_security_disabled() {
    let b = start(false).await;
    let mut c = login(&b.running, "alice").await;
    let codes = create_acls(
        &mut c,
        vec![acl(TOPIC, "t", LITERAL, "User:bob", READ, ALLOW)],
    )
    .await;
    assert_eq!(codes, vec![ResponseError::SecurityDisabled.code()]);
    let d = describe_acls(&mut c, any_filter()).await;
    assert_eq!(d.error_code, ResponseError::SecurityDisabled.code());
    // And everything else is allowed, as before.
    assert_eq!(c.create_topic("open", 1, &[]).await, 0);
}

#[test]
fn an_unknown_authorizer_class_stops_the_broker() {
    let err = broker::config::ServerConfig::from_pairs(vec![(
        "authorizer.class.name".to_string(),
        "kafka.security.authorizer.AclAuthorizer".to_string(),
    )])
    .unwrap_err()
    .to_string();
    assert!(err.contains("authorizer.class.name"), "{err}");
    assert!(err.contains("StandardAuthorizer"), "{err}");
}

#[tokio::test]
async fn create_describe_and_delete_acls_with_filters() {
    let b = start(true).await;
    let mut admin = login(&b.running, "admin").await;
    let mut alice = login(&b.running, "alice").await;

    // Only the cluster's Alter may create ACLs; Describe may list them.
    let codes = create_acls(
        &mut alice,
        vec![acl(TOPIC, "t", LITERAL, "User:alice", READ, ALLOW)],
    )
    .await;
    assert_eq!(codes, vec![DENIED_CLUSTER]);
    assert_eq!(
        describe_acls(&mut alice, any_filter()).await.error_code,
        DENIED_CLUSTER
    );

    // Kafka's validation, binding by binding.
    let codes = create_acls(
        &mut admin,
        vec![
            acl(TOPIC, "orders", LITERAL, "User:alice", READ, ALLOW),
            acl(TOPIC, "orders-", PREFIXED, "User:bob", WRITE, ALLOW),
            acl(1, "x", LITERAL, "User:bob", READ, ALLOW),
            acl(TOPIC, "x", 2, "User:bob", READ, ALLOW),
            acl(TOPIC, "x", LITERAL, "bob", READ, ALLOW),
            acl(TOPIC, "x", LITERAL, "User:bob", 1, ALLOW),
            acl(TOPIC, "", LITERAL, "User:bob", READ, ALLOW),
            acl(CLUSTER, "other", LITERAL, "User:bob", ALTER, ALLOW),
            acl(GROUP, "g", LITERAL, "User:alice", READ, DENY),
        ],
    )
    .await;
    let invalid = ResponseError::InvalidRequest.code();
    assert_eq!(
        codes,
        vec![0, 0, invalid, invalid, invalid, invalid, invalid, invalid, 0]
    );

    let all = describe_acls(&mut admin, any_filter()).await;
    assert_eq!(all.error_code, 0);
    assert_eq!(flatten(&all).len(), 3);
    // MATCH: the literal name and every prefix that covers it.
    let matched = describe_acls(
        &mut admin,
        any_filter()
            .with_resource_type_filter(TOPIC)
            .with_pattern_type_filter(2)
            .with_resource_name_filter(Some(s("orders-eu"))),
    )
    .await;
    assert_eq!(
        flatten(&matched),
        vec![("orders-".into(), PREFIXED, "User:bob".into(), WRITE, ALLOW)]
    );
    let by_principal = describe_acls(
        &mut admin,
        any_filter().with_principal_filter(Some(s("User:alice"))),
    )
    .await;
    assert_eq!(flatten(&by_principal).len(), 2);

    // DeleteAcls: per filter, the bindings it matched.
    let del: DeleteAclsResponse = admin
        .call(
            ApiKey::DeleteAcls,
            3,
            &DeleteAclsRequest::default().with_filters(vec![
                delete_acls_request::DeleteAclsFilter::default()
                    .with_resource_name_filter(None)
                    .with_principal_filter(None)
                    .with_host_filter(None)
                    .with_resource_type_filter(GROUP)
                    .with_pattern_type_filter(1)
                    .with_operation(1)
                    .with_permission_type(DENY),
                delete_acls_request::DeleteAclsFilter::default()
                    .with_resource_type_filter(0)
                    .with_pattern_type_filter(1)
                    .with_operation(1)
                    .with_permission_type(1),
            ]),
        )
        .await;
    assert_eq!(del.filter_results[0].error_code, 0);
    assert_eq!(del.filter_results[0].matching_acls.len(), 1);
    assert_eq!(
        del.filter_results[0].matching_acls[0]
            .resource_name
            .as_str(),
        "g"
    );
    assert_eq!(del.filter_results[1].error_code, invalid);
    assert_eq!(
        flatten(&describe_acls(&mut admin, any_filter()).await).len(),
        2
    );
}

#[tokio::test]
async fn deny_beats_allow_and_prefixes_apply() {
    let b = start(true).await;
    let mut admin = login(&b.running, "admin").await;
    assert_eq!(admin.create_topic("orders-eu", 1, &[]).await, 0);
    assert_eq!(admin.create_topic("orders-secret", 1, &[]).await, 0);
    assert_eq!(admin.create_topic("payments", 1, &[]).await, 0);
    grant(
        &mut admin,
        vec![
            acl(TOPIC, "orders-", PREFIXED, "User:*", WRITE, ALLOW),
            acl(TOPIC, "orders-secret", LITERAL, "User:bob", WRITE, DENY),
        ],
    )
    .await;
    let mut bob = login(&b.running, "bob").await;
    assert_eq!(
        bob.produce("orders-eu", 0, -1, one("a")).await.error_code,
        0
    );
    assert_eq!(
        bob.produce("orders-secret", 0, -1, one("a"))
            .await
            .error_code,
        DENIED_TOPIC
    );
    assert_eq!(
        bob.produce("payments", 0, -1, one("a")).await.error_code,
        DENIED_TOPIC
    );
    // Write implies Describe, not Read.
    assert_eq!(bob.list_offset("orders-eu", 0, -1).await.error_code, 0);
    assert_eq!(
        bob.fetch("orders-eu", 0, 0, 0).await.error_code,
        DENIED_TOPIC
    );
    let mut alice = login(&b.running, "alice").await;
    assert_eq!(
        alice
            .produce("orders-secret", 0, -1, one("a"))
            .await
            .error_code,
        0
    );
}

#[tokio::test]
async fn metadata_hides_topics_the_principal_may_not_describe() {
    let b = start(true).await;
    let mut admin = login(&b.running, "admin").await;
    for t in ["visible", "hidden"] {
        assert_eq!(admin.create_topic(t, 1, &[]).await, 0);
    }
    grant(
        &mut admin,
        vec![acl(TOPIC, "visible", LITERAL, "User:alice", READ, ALLOW)],
    )
    .await;
    let mut alice = login(&b.running, "alice").await;
    let all = metadata(&mut alice, None).await;
    let names: Vec<_> = all
        .topics
        .iter()
        .map(|t| t.name.as_ref().unwrap().to_string())
        .collect();
    assert_eq!(names, ["visible"]);
    // READ and, implied, DESCRIBE.
    assert_eq!(
        all.topics[0].topic_authorized_operations,
        (1 << READ) | (1 << DESCRIBE)
    );
    // Named: TOPIC_AUTHORIZATION_FAILED whether the topic exists or not.
    let named = metadata(&mut alice, Some(&["hidden", "absent", "visible"])).await;
    let codes: Vec<_> = named.topics.iter().map(|t| t.error_code).collect();
    assert_eq!(codes, [DENIED_TOPIC, DENIED_TOPIC, 0]);
    assert!(named.topics[0].partitions.is_empty());
    // The admin (a super user) sees both.
    assert_eq!(metadata(&mut admin, None).await.topics.len(), 2);
}

/// One API: what the unauthorized principal gets, then the ACLs that let
/// it through, then what it gets.
#[tokio::test]
async fn matrix_denied_with_kafkas_code_then_allowed() {
    let b = start(true).await;
    let mut admin = login(&b.running, "admin").await;
    assert_eq!(admin.create_topic("m", 1, &[]).await, 0);
    assert_eq!(admin.produce("m", 0, -1, one("x")).await.error_code, 0);
    let mut bob = login(&b.running, "bob").await;

    // Produce: Write on the topic.
    assert_eq!(
        bob.produce("m", 0, -1, one("a")).await.error_code,
        DENIED_TOPIC
    );
    grant(
        &mut admin,
        vec![acl(TOPIC, "m", LITERAL, "User:bob", WRITE, ALLOW)],
    )
    .await;
    assert_eq!(bob.produce("m", 0, -1, one("a")).await.error_code, 0);

    // Fetch: Read on the topic.
    assert_eq!(bob.fetch("m", 0, 0, 0).await.error_code, DENIED_TOPIC);
    grant(
        &mut admin,
        vec![acl(TOPIC, "m", LITERAL, "User:bob", READ, ALLOW)],
    )
    .await;
    assert_eq!(bob.fetch("m", 0, 0, 0).await.error_code, 0);

    // ListOffsets: Describe (implied by Read above); another topic is denied.
    assert_eq!(bob.list_offset("m", 0, -1).await.error_code, 0);
    assert_eq!(
        bob.list_offset("other", 0, -1).await.error_code,
        DENIED_TOPIC
    );

    // CreateTopics: Create on the cluster or the topic.
    assert_eq!(bob.create_topic("bobs", 1, &[]).await, DENIED_TOPIC);
    grant(
        &mut admin,
        vec![acl(TOPIC, "bobs", PREFIXED, "User:bob", CREATE, ALLOW)],
    )
    .await;
    assert_eq!(bob.create_topic("bobs-1", 1, &[]).await, 0);
    // Created, but its configs are not bob's to see without DescribeConfigs.
    let create = |name: &str| {
        CreateTopicsRequest::default()
            .with_topics(vec![create_topics_request::CreatableTopic::default()
                .with_name(TopicName(s(name)))
                .with_num_partitions(1)
                .with_replication_factor(1)])
            .with_timeout_ms(10_000)
    };
    let r: CreateTopicsResponse = bob.call(ApiKey::CreateTopics, 7, &create("bobs-2")).await;
    assert_eq!(r.topics[0].error_code, 0);
    assert_eq!(r.topics[0].topic_config_error_code, DENIED_TOPIC);
    assert!(r.topics[0].configs.is_none());
    let r: CreateTopicsResponse = admin.call(ApiKey::CreateTopics, 7, &create("admins")).await;
    assert_eq!(r.topics[0].topic_config_error_code, 0);
    assert!(!r.topics[0].configs.as_ref().unwrap().is_empty());

    // DescribeConfigs / IncrementalAlterConfigs on the topic and on a broker.
    let describe = |rt: i8, name: &str| {
        DescribeConfigsRequest::default().with_resources(vec![
            describe_configs_request::DescribeConfigsResource::default()
                .with_resource_type(rt)
                .with_resource_name(s(name))
                .with_configuration_keys(None),
        ])
    };
    let r: DescribeConfigsResponse = bob
        .call(ApiKey::DescribeConfigs, 4, &describe(TOPIC, "bobs-1"))
        .await;
    assert_eq!(r.results[0].error_code, DENIED_TOPIC);
    let r: DescribeConfigsResponse = bob
        .call(ApiKey::DescribeConfigs, 4, &describe(4, "1"))
        .await;
    assert_eq!(r.results[0].error_code, DENIED_CLUSTER);
    let alter = IncrementalAlterConfigsRequest::default().with_resources(vec![
        incremental_alter_configs_request::AlterConfigsResource::default()
            .with_resource_type(TOPIC)
            .with_resource_name(s("bobs-1"))
            .with_configs(vec![
                incremental_alter_configs_request::AlterableConfig::default()
                    .with_name(s("retention.ms"))
                    .with_config_operation(0)
                    .with_value(Some(s("60000"))),
            ]),
    ]);
    let r: IncrementalAlterConfigsResponse =
        bob.call(ApiKey::IncrementalAlterConfigs, 1, &alter).await;
    assert_eq!(r.responses[0].error_code, DENIED_TOPIC);
    grant(
        &mut admin,
        vec![acl(
            TOPIC,
            "bobs-1",
            LITERAL,
            "User:bob",
            ALTER_CONFIGS,
            ALLOW,
        )],
    )
    .await;
    let r: IncrementalAlterConfigsResponse =
        bob.call(ApiKey::IncrementalAlterConfigs, 1, &alter).await;
    assert_eq!(r.responses[0].error_code, 0);
    // AlterConfigs implies DescribeConfigs.
    let r: DescribeConfigsResponse = bob
        .call(ApiKey::DescribeConfigs, 4, &describe(TOPIC, "bobs-1"))
        .await;
    assert_eq!(r.results[0].error_code, 0);

    // DeleteTopics: Delete on the topic.
    let delete = DeleteTopicsRequest::default()
        .with_topic_names(vec![TopicName(s("bobs-1"))])
        .with_timeout_ms(10_000);
    let r: DeleteTopicsResponse = bob.call(ApiKey::DeleteTopics, 5, &delete).await;
    assert_eq!(r.responses[0].error_code, DENIED_TOPIC);
    grant(
        &mut admin,
        vec![acl(TOPIC, "bobs-1", LITERAL, "User:bob", DELETE, ALLOW)],
    )
    .await;
    let r: DeleteTopicsResponse = bob.call(ApiKey::DeleteTopics, 5, &delete).await;
    assert_eq!(r.responses[0].error_code, 0);

    // Groups: FindCoordinator needs Describe, JoinGroup Read.
    let find = FindCoordinatorRequest::default()
        .with_key_type(0)
        .with_coordinator_keys(vec![s("g")]);
    let r: FindCoordinatorResponse = bob.call(ApiKey::FindCoordinator, 4, &find).await;
    assert_eq!(r.coordinators[0].error_code, DENIED_GROUP);
    let join = JoinGroupRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_session_timeout_ms(10_000)
        .with_rebalance_timeout_ms(10_000)
        .with_member_id(s(""))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![join_group_request::JoinGroupRequestProtocol::default(
        )
        .with_name(s("range"))
        .with_metadata(bytes::Bytes::from_static(b"\0\0"))]);
    let r: JoinGroupResponse = bob.call(ApiKey::JoinGroup, 9, &join).await;
    assert_eq!(r.error_code, DENIED_GROUP);
    let commit = OffsetCommitRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![
            offset_commit_request::OffsetCommitRequestTopic::default()
                .with_name(TopicName(s("m")))
                .with_partitions(vec![
                    offset_commit_request::OffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(1),
                ]),
        ]);
    let r: OffsetCommitResponse = bob.call(ApiKey::OffsetCommit, 8, &commit).await;
    assert_eq!(r.topics[0].partitions[0].error_code, DENIED_GROUP);
    let fetch_offsets = OffsetFetchRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_topics(None);
    let r: OffsetFetchResponse = bob.call(ApiKey::OffsetFetch, 7, &fetch_offsets).await;
    assert_eq!(r.error_code, DENIED_GROUP);
    let describe_groups = DescribeGroupsRequest::default().with_groups(vec![GroupId(s("g"))]);
    let r: DescribeGroupsResponse = bob.call(ApiKey::DescribeGroups, 5, &describe_groups).await;
    assert_eq!(r.groups[0].error_code, DENIED_GROUP);
    let delete_groups = DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s("g"))]);
    let r: DeleteGroupsResponse = bob.call(ApiKey::DeleteGroups, 2, &delete_groups).await;
    assert_eq!(r.results[0].error_code, DENIED_GROUP);

    grant(
        &mut admin,
        vec![acl(GROUP, "g", LITERAL, "User:bob", READ, ALLOW)],
    )
    .await;
    let r: FindCoordinatorResponse = bob.call(ApiKey::FindCoordinator, 4, &find).await;
    assert_eq!(r.coordinators[0].error_code, 0);
    let r: JoinGroupResponse = bob.call(ApiKey::JoinGroup, 9, &join).await;
    // v4+: the first join asks for a member id.
    assert_eq!(r.error_code, ResponseError::MemberIdRequired.code());
    let r: OffsetCommitResponse = bob.call(ApiKey::OffsetCommit, 8, &commit).await;
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
    let r: OffsetFetchResponse = bob.call(ApiKey::OffsetFetch, 7, &fetch_offsets).await;
    assert_eq!(r.error_code, 0);
    assert_eq!(r.topics[0].partitions[0].committed_offset, 1);
    // A named topic bob may not describe: TOPIC_AUTHORIZATION_FAILED.
    let named = OffsetFetchRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_topics(Some(vec![
            offset_fetch_request::OffsetFetchRequestTopic::default()
                .with_name(TopicName(s("other")))
                .with_partition_indexes(vec![0]),
        ]));
    let r: OffsetFetchResponse = bob.call(ApiKey::OffsetFetch, 7, &named).await;
    assert_eq!(r.topics[0].partitions[0].error_code, DENIED_TOPIC);
    // Read does not allow Delete.
    let r: DeleteGroupsResponse = bob.call(ApiKey::DeleteGroups, 2, &delete_groups).await;
    assert_eq!(r.results[0].error_code, DENIED_GROUP);
    // ListGroups lists only the groups bob may describe.
    let mut alice = login(&b.running, "alice").await;
    let r: ListGroupsResponse = alice
        .call(ApiKey::ListGroups, 4, &ListGroupsRequest::default())
        .await;
    assert!(r.groups.is_empty(), "alice sees no group");

    // Group configs (resource type 32): AlterConfigs / DescribeConfigs on
    // the group; Read on it allows neither.
    let alter_group = IncrementalAlterConfigsRequest::default().with_resources(vec![
        incremental_alter_configs_request::AlterConfigsResource::default()
            .with_resource_type(32)
            .with_resource_name(s("g"))
            .with_configs(vec![
                incremental_alter_configs_request::AlterableConfig::default()
                    .with_name(s("share.auto.offset.reset"))
                    .with_config_operation(0)
                    .with_value(Some(s("earliest"))),
            ]),
    ]);
    let r: IncrementalAlterConfigsResponse = bob
        .call(ApiKey::IncrementalAlterConfigs, 1, &alter_group)
        .await;
    assert_eq!(r.responses[0].error_code, DENIED_GROUP);
    let r: DescribeConfigsResponse = bob
        .call(ApiKey::DescribeConfigs, 4, &describe(32, "g"))
        .await;
    assert_eq!(r.results[0].error_code, DENIED_GROUP);
    grant(
        &mut admin,
        vec![acl(GROUP, "g", LITERAL, "User:bob", ALTER_CONFIGS, ALLOW)],
    )
    .await;
    let r: IncrementalAlterConfigsResponse = bob
        .call(ApiKey::IncrementalAlterConfigs, 1, &alter_group)
        .await;
    assert_eq!(r.responses[0].error_code, 0);
    let r: DescribeConfigsResponse = bob
        .call(ApiKey::DescribeConfigs, 4, &describe(32, "g"))
        .await;
    assert_eq!(r.results[0].error_code, 0);

    // Transactions: TransactionalId Write, which Produce checks only for
    // transactional records (Kafka's hasTransactionalRecords).
    let produce_with_txn_id = |records: bytes::Bytes| {
        let mut pd = produce_request::PartitionProduceData::default();
        pd.index = 0;
        pd.records = Some(records);
        let mut td = produce_request::TopicProduceData::default();
        td.name = TopicName(s("m"));
        td.partition_data = vec![pd];
        ProduceRequest::default()
            .with_transactional_id(Some(TransactionalId(s("tx"))))
            .with_acks(-1)
            .with_timeout_ms(10_000)
            .with_topic_data(vec![td])
    };
    let r: ProduceResponse = bob
        .call(ApiKey::Produce, 9, &produce_with_txn_id(one("plain")))
        .await;
    assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
    let r: ProduceResponse = bob
        .call(
            ApiKey::Produce,
            9,
            &produce_with_txn_id(common::txn_batch(&["t"], 4242, 0, 0)),
        )
        .await;
    assert_eq!(r.responses[0].partition_responses[0].error_code, DENIED_TXN);
    let init = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(s("tx"))))
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    let r: InitProducerIdResponse = bob.call(ApiKey::InitProducerId, 4, &init).await;
    assert_eq!(r.error_code, DENIED_TXN);
    grant(
        &mut admin,
        vec![acl(
            TRANSACTIONAL_ID,
            "tx",
            LITERAL,
            "User:bob",
            WRITE,
            ALLOW,
        )],
    )
    .await;
    // Allowed now; the transaction coordinator may take a moment to load.
    let find_txn = FindCoordinatorRequest::default()
        .with_key_type(1)
        .with_coordinator_keys(vec![s("tx")]);
    let mut code = -1;
    for _ in 0..100 {
        let f: FindCoordinatorResponse = bob.call(ApiKey::FindCoordinator, 4, &find_txn).await;
        assert_ne!(f.coordinators[0].error_code, DENIED_TXN);
        let r: InitProducerIdResponse = bob.call(ApiKey::InitProducerId, 4, &init).await;
        code = r.error_code;
        if code == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(code, 0);
    // Idempotence without a transaction: Write on any topic will do.
    let idempotent = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    let r: InitProducerIdResponse = bob.call(ApiKey::InitProducerId, 4, &idempotent).await;
    assert_eq!(r.error_code, 0);
    let r: InitProducerIdResponse = alice.call(ApiKey::InitProducerId, 4, &idempotent).await;
    assert_eq!(r.error_code, DENIED_CLUSTER);

    // Cluster resources: DescribeQuorum and the SCRAM APIs.
    let r: DescribeQuorumResponse = bob
        .call(
            ApiKey::DescribeQuorum,
            2,
            &DescribeQuorumRequest::default().with_topics(vec![
                describe_quorum_request::TopicData::default()
                    .with_topic_name(TopicName(s("__cluster_metadata")))
                    .with_partitions(vec![describe_quorum_request::PartitionData::default()]),
            ]),
        )
        .await;
    assert_eq!(r.error_code, DENIED_CLUSTER);
    let r: DescribeUserScramCredentialsResponse = bob
        .call(
            ApiKey::DescribeUserScramCredentials,
            0,
            &DescribeUserScramCredentialsRequest::default(),
        )
        .await;
    assert_eq!(r.error_code, DENIED_CLUSTER);
    grant(
        &mut admin,
        vec![acl(
            CLUSTER,
            "kafka-cluster",
            LITERAL,
            "User:bob",
            DESCRIBE,
            ALLOW,
        )],
    )
    .await;
    let r: DescribeUserScramCredentialsResponse = bob
        .call(
            ApiKey::DescribeUserScramCredentials,
            0,
            &DescribeUserScramCredentialsRequest::default(),
        )
        .await;
    assert_eq!(r.error_code, 0);
    // With Describe on the cluster, ListGroups lists every group.
    let r: ListGroupsResponse = bob
        .call(ApiKey::ListGroups, 4, &ListGroupsRequest::default())
        .await;
    assert!(r.groups.iter().any(|g| g.group_id.0.as_str() == "g"));
}

/// ElectLeaders needs Alter on the cluster and DescribeLogDirs Describe on
/// it, as in Kafka: without them the answer is CLUSTER_AUTHORIZATION_FAILED
/// (per partition, and at the top from v1 / v3) and nothing is done.
#[tokio::test]
async fn cluster_operations_need_their_cluster_acls() {
    let b = start(true).await;
    let mut admin = login(&b.running, "admin").await;
    assert_eq!(admin.create_topic("ops", 1, &[]).await, 0);
    let mut bob = login(&b.running, "bob").await;
    let mut tp = elect_leaders_request::TopicPartitions::default();
    tp.topic = TopicName(s("ops"));
    tp.partitions = vec![0];
    let elect = ElectLeadersRequest::default()
        .with_topic_partitions(Some(vec![tp]))
        .with_timeout_ms(5_000);
    let codes = |r: &ElectLeadersResponse| {
        (
            r.error_code,
            r.replica_election_results
                .iter()
                .flat_map(|t| t.partition_result.iter().map(|p| p.error_code))
                .collect::<Vec<_>>(),
        )
    };
    let r: ElectLeadersResponse = bob.call(ApiKey::ElectLeaders, 2, &elect).await;
    assert_eq!(codes(&r), (DENIED_CLUSTER, vec![DENIED_CLUSTER]));
    let dirs = DescribeLogDirsRequest::default().with_topics(None);
    let r: DescribeLogDirsResponse = bob.call(ApiKey::DescribeLogDirs, 4, &dirs).await;
    assert_eq!((r.error_code, r.results.len()), (DENIED_CLUSTER, 0));

    grant(
        &mut admin,
        vec![
            acl(CLUSTER, "kafka-cluster", LITERAL, "User:bob", ALTER, ALLOW),
            acl(
                CLUSTER,
                "kafka-cluster",
                LITERAL,
                "User:bob",
                DESCRIBE,
                ALLOW,
            ),
        ],
    )
    .await;
    let r: ElectLeadersResponse = bob.call(ApiKey::ElectLeaders, 2, &elect).await;
    assert_eq!(
        codes(&r),
        (0, vec![ResponseError::ElectionNotNeeded.code()]),
        "one node leads its only partition already"
    );
    let r: DescribeLogDirsResponse = bob.call(ApiKey::DescribeLogDirs, 4, &dirs).await;
    assert_eq!((r.error_code, r.results.len()), (0, 1));
    assert!(r.results[0]
        .topics
        .iter()
        .any(|t| t.name.0.as_str() == "ops"));
}

#[tokio::test]
async fn acls_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let b = start_in(dir.path(), true).await;
    let mut admin = login(&b, "admin").await;
    grant(
        &mut admin,
        vec![
            acl(TOPIC, "kept", LITERAL, "User:alice", READ, ALLOW),
            acl(GROUP, "app-", PREFIXED, "User:alice", READ, ALLOW),
        ],
    )
    .await;
    let before = flatten(&describe_acls(&mut admin, any_filter()).await);
    drop(admin);
    b.shutdown().await;

    let b = start_in(dir.path(), true).await;
    let mut admin = login(&b, "admin").await;
    assert_eq!(
        flatten(&describe_acls(&mut admin, any_filter()).await),
        before
    );
    assert_eq!(before.len(), 2);
    b.shutdown().await;
}
