//! Client quotas and connection limits over the wire: AlterClientQuotas
//! and DescribeClientQuotas against the metadata quorum (kept across a
//! restart), produce throttling with a muted connection, and the per-IP
//! connection limit.

mod common;

use std::time::{Duration, Instant};

use common::{batch, start, Client};
use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;
use kafka_protocol::ResponseError;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// An entity from (type, name) pairs; `None` is the default entity.
fn entity(parts: &[(&str, Option<&str>)]) -> Vec<EntityData> {
    parts
        .iter()
        .map(|(t, n)| {
            EntityData::default()
                .with_entity_type(s(t))
                .with_entity_name(n.map(s))
        })
        .collect()
}

fn set(key: &str, value: f64) -> OpData {
    OpData::default().with_key(s(key)).with_value(value)
}

fn remove(key: &str) -> OpData {
    OpData::default().with_key(s(key)).with_remove(true)
}

async fn alter(
    c: &mut Client,
    entries: Vec<(Vec<EntityData>, Vec<OpData>)>,
    validate_only: bool,
) -> Vec<(i16, Option<String>)> {
    let req = AlterClientQuotasRequest::default()
        .with_entries(
            entries
                .into_iter()
                .map(|(e, ops)| EntryData::default().with_entity(e).with_ops(ops))
                .collect(),
        )
        .with_validate_only(validate_only);
    let resp: AlterClientQuotasResponse = c.call(ApiKey::AlterClientQuotas, 1, &req).await;
    resp.entries
        .iter()
        .map(|e| {
            (
                e.error_code,
                e.error_message.as_ref().map(|m| m.to_string()),
            )
        })
        .collect()
}

/// (match type, name): 0 exact, 1 default, 2 specified.
async fn describe(
    c: &mut Client,
    components: &[(&str, i8, Option<&str>)],
    strict: bool,
) -> Vec<(Vec<(String, Option<String>)>, Vec<(String, f64)>)> {
    let req = DescribeClientQuotasRequest::default()
        .with_components(
            components
                .iter()
                .map(|(t, m, n)| {
                    ComponentData::default()
                        .with_entity_type(s(t))
                        .with_match_type(*m)
                        .with_match(n.map(s))
                })
                .collect(),
        )
        .with_strict(strict);
    let resp: DescribeClientQuotasResponse = c.call(ApiKey::DescribeClientQuotas, 1, &req).await;
    assert_eq!(resp.error_code, 0, "{:?}", resp.error_message);
    let mut out: Vec<_> = resp
        .entries
        .unwrap()
        .iter()
        .map(|e| {
            let mut ent: Vec<_> = e
                .entity
                .iter()
                .map(|p| {
                    (
                        p.entity_type.to_string(),
                        p.entity_name.as_ref().map(|n| n.to_string()),
                    )
                })
                .collect();
            ent.sort();
            let vals = e
                .values
                .iter()
                .map(|v| (v.key.to_string(), v.value))
                .collect();
            (ent, vals)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn named(t: &str, n: &str) -> (String, Option<String>) {
    (t.to_string(), Some(n.to_string()))
}

fn default(t: &str) -> (String, Option<String>) {
    (t.to_string(), None)
}

#[tokio::test]
async fn quotas_round_trip_with_defaults_removal_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::config(dir.path(), &[]);
    let running = broker::start(cfg.clone()).await.unwrap();
    let mut c = Client::connect(running.local_addr).await;

    let results = alter(
        &mut c,
        vec![
            (
                entity(&[("user", Some("alice"))]),
                vec![
                    set("producer_byte_rate", 1024.0),
                    set("consumer_byte_rate", 2048.0),
                ],
            ),
            (
                entity(&[("user", None), ("client-id", Some("app"))]),
                vec![set("request_percentage", 12.5)],
            ),
            (
                entity(&[("client-id", None)]),
                vec![set("controller_mutation_rate", 3.0)],
            ),
            (
                entity(&[("ip", Some("10.0.0.1"))]),
                vec![set("connection_creation_rate", 5.0)],
            ),
        ],
        false,
    )
    .await;
    assert!(results.iter().all(|(code, _)| *code == 0), "{results:?}");

    // Everything, not strict.
    let all = describe(&mut c, &[], false).await;
    assert_eq!(all.len(), 4);
    // Exact user, strict: only the user-alone entity.
    let alice = describe(&mut c, &[("user", 0, Some("alice"))], true).await;
    assert_eq!(
        alice,
        vec![(
            vec![named("user", "alice")],
            vec![
                ("consumer_byte_rate".to_string(), 2048.0),
                ("producer_byte_rate".to_string(), 1024.0)
            ]
        )]
    );
    // The default user, not strict: the (default user, app) entity.
    let defaults = describe(&mut c, &[("user", 1, None)], false).await;
    assert_eq!(defaults.len(), 1);
    assert_eq!(
        defaults[0].0,
        vec![named("client-id", "app"), default("user")]
    );
    // Specified users, strict: alice only (the pair has a client id too).
    let users = describe(&mut c, &[("user", 2, None)], true).await;
    assert_eq!(users.len(), 1);
    // Specified users, not strict: both entities with a user part.
    assert_eq!(describe(&mut c, &[("user", 2, None)], false).await.len(), 2);
    // IPs.
    let ips = describe(&mut c, &[("ip", 2, None)], false).await;
    assert_eq!(ips[0].0, vec![named("ip", "10.0.0.1")]);

    // validate_only writes nothing.
    let r = alter(
        &mut c,
        vec![(
            entity(&[("user", Some("bob"))]),
            vec![set("producer_byte_rate", 1.0)],
        )],
        true,
    )
    .await;
    assert_eq!(r[0].0, 0);
    assert!(describe(&mut c, &[("user", 0, Some("bob"))], false)
        .await
        .is_empty());

    // Removal of one key leaves the other; removing the last drops the entity.
    let r = alter(
        &mut c,
        vec![
            (
                entity(&[("user", Some("alice"))]),
                vec![remove("consumer_byte_rate")],
            ),
            (
                entity(&[("client-id", None)]),
                vec![remove("controller_mutation_rate")],
            ),
        ],
        false,
    )
    .await;
    assert!(r.iter().all(|(code, _)| *code == 0), "{r:?}");
    drop(c);
    running.shutdown().await;

    // The quorum kept them.
    let running = broker::start(cfg).await.unwrap();
    let mut c = Client::connect(running.local_addr).await;
    let all = describe(&mut c, &[], false).await;
    assert_eq!(all.len(), 3, "{all:?}");
    assert_eq!(
        describe(&mut c, &[("user", 0, Some("alice"))], true).await[0].1,
        vec![("producer_byte_rate".to_string(), 1024.0)]
    );
    assert!(describe(&mut c, &[("client-id", 1, None)], true)
        .await
        .is_empty());
    running.shutdown().await;
}

#[tokio::test]
async fn invalid_alterations_get_kafkas_errors_and_change_nothing() {
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    let invalid = ResponseError::InvalidRequest.code();
    let cases: Vec<(Vec<EntityData>, Vec<OpData>)> = vec![
        // Unknown key.
        (
            entity(&[("user", Some("alice"))]),
            vec![set("producer_byte_rate_typo", 1.0)],
        ),
        // A Long key with a fraction.
        (
            entity(&[("client-id", Some("x"))]),
            vec![set("producer_byte_rate", 1.5)],
        ),
        // An IP key on a user.
        (
            entity(&[("user", Some("carol"))]),
            vec![set("connection_creation_rate", 1.0)],
        ),
        // A client key on an IP.
        (
            entity(&[("ip", Some("10.0.0.2"))]),
            vec![set("producer_byte_rate", 1.0)],
        ),
        // Not an IP.
        (
            entity(&[("ip", Some("not an ip"))]),
            vec![set("connection_creation_rate", 1.0)],
        ),
        // IP with a user.
        (
            entity(&[("user", Some("dave")), ("ip", Some("10.0.0.3"))]),
            vec![set("producer_byte_rate", 1.0)],
        ),
        // Unknown entity type; empty entity; empty name; duplicate type.
        (
            entity(&[("group", Some("g"))]),
            vec![set("producer_byte_rate", 1.0)],
        ),
        (vec![], vec![set("producer_byte_rate", 1.0)]),
        (
            entity(&[("user", Some(""))]),
            vec![set("producer_byte_rate", 1.0)],
        ),
        (
            entity(&[("user", Some("e")), ("user", Some("f"))]),
            vec![set("producer_byte_rate", 1.0)],
        ),
        // The same key twice.
        (
            entity(&[("user", Some("g"))]),
            vec![
                set("producer_byte_rate", 1.0),
                set("producer_byte_rate", 2.0),
            ],
        ),
    ];
    let n = cases.len();
    let results = alter(&mut c, cases, false).await;
    assert_eq!(results.len(), n);
    for (i, (code, message)) in results.iter().enumerate() {
        assert_eq!(*code, invalid, "case {i}: {message:?}");
        assert!(message.is_some(), "case {i}");
    }
    assert!(describe(&mut c, &[], false).await.is_empty());
    b.running.shutdown().await;
}

/// A producer over its quota gets throttle_time_ms and a muted connection:
/// sending as fast as the broker reads, it achieves about its quota.
#[tokio::test]
async fn a_producer_over_its_quota_is_throttled_and_held_near_it() {
    // Two one-second samples, so the test converges within seconds.
    let b = start(&[
        ("quota.window.num", "2"),
        ("quota.window.size.seconds", "1"),
    ])
    .await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("q", 1, &[]).await, 0);
    const QUOTA: f64 = 200_000.0;
    let r = alter(
        &mut c,
        vec![(
            entity(&[("client-id", Some("test"))]),
            vec![set("producer_byte_rate", QUOTA)],
        )],
        false,
    )
    .await;
    assert_eq!(r[0].0, 0);

    let value = "x".repeat(20_000);
    let values: Vec<&str> = vec![value.as_str(); 2];
    let records = batch(&values, Compression::None, None);
    let produce = |records: bytes::Bytes| {
        let mut pd = produce_request::PartitionProduceData::default();
        pd.index = 0;
        pd.records = Some(records);
        let mut td = produce_request::TopicProduceData::default();
        td.name = TopicName(s("q"));
        td.partition_data = vec![pd];
        ProduceRequest::default()
            .with_acks(1)
            .with_timeout_ms(10_000)
            .with_topic_data(vec![td])
    };
    let req = produce(records);

    // Warm up until the first throttle, then measure.
    let mut throttled = 0;
    let mut sent_bytes = 0usize;
    let mut start = None;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let resp: ProduceResponse = c.call(ApiKey::Produce, 9, &req).await;
        assert_eq!(resp.responses[0].partition_responses[0].error_code, 0);
        if resp.throttle_time_ms > 0 {
            throttled += 1;
            if start.is_none() {
                // The client does not back off: the broker's mute must.
                start = Some(Instant::now());
                continue;
            }
        }
        if let Some(t) = start {
            sent_bytes += 40_000;
            if t.elapsed() >= Duration::from_secs(5) {
                break;
            }
        }
    }
    let t = start.expect("the producer was throttled").elapsed();
    let achieved = sent_bytes as f64 / t.as_secs_f64();
    assert!(throttled >= 2, "throttled {throttled} times");
    // Held to the quota (a loose bound: this is behaviour, not speed; an
    // unthrottled loopback producer runs at tens of MB/s).
    assert!(
        achieved < QUOTA * 1.5 && achieved > QUOTA * 0.3,
        "achieved {achieved:.0} B/s against a quota of {QUOTA} B/s"
    );

    // Removing the quota ends throttling.
    let r = alter(
        &mut c,
        vec![(
            entity(&[("client-id", Some("test"))]),
            vec![remove("producer_byte_rate")],
        )],
        false,
    )
    .await;
    assert_eq!(r[0].0, 0);
    let resp: ProduceResponse = c.call(ApiKey::Produce, 9, &req).await;
    assert_eq!(resp.throttle_time_ms, 0);
    b.running.shutdown().await;
}

#[tokio::test]
async fn the_per_ip_limit_refuses_the_extra_connection() {
    let b = start(&[("max.connections.per.ip", "2")]).await;
    let addr = b.running.local_addr;
    let mut first = Client::connect(addr).await;
    let mut second = Client::connect(addr).await;
    let mut third = Client::connect(addr).await;
    assert!(
        third.closed_within(Duration::from_secs(5)).await,
        "a third connection from one IP is closed"
    );
    // The first two are served.
    for c in [&mut first, &mut second] {
        let _: ApiVersionsResponse = c
            .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
            .await;
    }
    // One leaves: a new one is served.
    drop(first);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut fourth = Client::connect(addr).await;
    let _: ApiVersionsResponse = fourth
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    b.running.shutdown().await;
}

#[tokio::test]
async fn a_consumer_over_its_quota_gets_empty_throttled_fetches_and_loses_nothing() {
    // Two one-second samples: at most one window's quota in one response.
    let b = start(&[
        ("quota.window.num", "2"),
        ("quota.window.size.seconds", "1"),
    ])
    .await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("f", 1, &[]).await, 0);
    const QUOTA: f64 = 50_000.0;
    let value = "y".repeat(10_000);
    let values: Vec<&str> = vec![value.as_str(); 2];
    const BATCHES: i64 = 10;
    for _ in 0..BATCHES {
        let p = c
            .produce("f", 0, 1, batch(&values, Compression::None, None))
            .await;
        assert_eq!(p.error_code, 0);
    }
    let r = alter(
        &mut c,
        vec![(
            entity(&[("client-id", Some("test"))]),
            vec![set("consumer_byte_rate", QUOTA)],
        )],
        false,
    )
    .await;
    assert_eq!(r[0].0, 0);

    let fetch = |offset: i64| {
        let mut fp = fetch_request::FetchPartition::default();
        fp.partition = 0;
        fp.fetch_offset = offset;
        fp.partition_max_bytes = 1 << 20;
        fp.current_leader_epoch = -1;
        let mut ft = fetch_request::FetchTopic::default();
        ft.topic = TopicName(s("f"));
        ft.partitions = vec![fp];
        FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_min_bytes(1)
            .with_max_bytes(50 << 20)
            .with_session_epoch(-1)
            .with_topics(vec![ft])
    };
    let mut next = 0i64;
    let mut throttled_empty = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while next < 2 * BATCHES && Instant::now() < deadline {
        // The client does not wait out throttles: the broker's mute must.
        let resp: FetchResponse = c.call(ApiKey::Fetch, 12, &fetch(next)).await;
        if resp.throttle_time_ms > 0 && resp.responses.is_empty() {
            throttled_empty += 1;
            continue;
        }
        let p = &resp.responses[0].partitions[0];
        assert_eq!(p.error_code, 0);
        let records = p.records.clone().unwrap_or_default();
        // The quota caps the response at one window's worth (the first
        // batch always goes, so a consumer is never stuck).
        assert!(
            records.len() <= QUOTA as usize,
            "{} bytes in one response against a window of {QUOTA}",
            records.len()
        );
        for (offset, _) in common::values(&p.records) {
            assert_eq!(offset, next, "records arrive in order, none skipped");
            next += 1;
        }
    }
    assert_eq!(next, 2 * BATCHES, "every record was fetched");
    assert!(throttled_empty >= 1, "no fetch was throttled");
    b.running.shutdown().await;
}

#[tokio::test]
async fn topic_mutations_over_the_controller_mutation_rate_are_refused_from_the_strict_versions() {
    let b = start(&[
        ("quota.window.num", "2"),
        ("quota.window.size.seconds", "1"),
    ])
    .await;
    let mut c = Client::connect(b.running.local_addr).await;
    let r = alter(
        &mut c,
        vec![(
            entity(&[("client-id", Some("test"))]),
            vec![set("controller_mutation_rate", 2.0)],
        )],
        false,
    )
    .await;
    assert_eq!(r[0].0, 0);
    let create = |names: &[&str], partitions: i32| {
        let topics = names
            .iter()
            .map(|n| {
                let mut t = create_topics_request::CreatableTopic::default();
                t.name = TopicName(s(n));
                t.num_partitions = partitions;
                t.replication_factor = 1;
                t
            })
            .collect();
        CreateTopicsRequest::default()
            .with_topics(topics)
            .with_timeout_ms(10_000)
    };
    let throttling = ResponseError::ThrottlingQuotaExceeded.code();

    // Within the quota, a topic goes ahead whatever its size (4 partitions
    // against 2/s); the next one in the same request is refused.
    let resp: CreateTopicsResponse = c
        .call(ApiKey::CreateTopics, 7, &create(&["m1", "m2"], 4))
        .await;
    let codes: Vec<i16> = resp.topics.iter().map(|t| t.error_code).collect();
    assert_eq!(codes, vec![0, throttling], "{:?}", resp.topics);
    assert!(resp.topics[1].error_message.is_some());
    assert!(resp.throttle_time_ms > 0);

    // The broker muted the connection for that throttle, so by the next
    // request the rate is back under the quota. CreateTopics v5 is
    // permissive: both topics are created, and the client throttled after.
    let resp: CreateTopicsResponse = c
        .call(ApiKey::CreateTopics, 5, &create(&["m3", "m4"], 2))
        .await;
    let codes: Vec<i16> = resp.topics.iter().map(|t| t.error_code).collect();
    assert_eq!(codes, vec![0, 0], "{:?}", resp.topics);
    assert!(resp.throttle_time_ms > 0);

    // DeleteTopics v6 is strict: the first deletion goes, the second waits.
    let del = DeleteTopicsRequest::default()
        .with_topics(
            ["m1", "m3"]
                .iter()
                .map(|n| {
                    delete_topics_request::DeleteTopicState::default()
                        .with_name(Some(TopicName(s(n))))
                })
                .collect(),
        )
        .with_timeout_ms(10_000);
    let resp: DeleteTopicsResponse = c.call(ApiKey::DeleteTopics, 6, &del).await;
    let codes: Vec<i16> = resp.responses.iter().map(|t| t.error_code).collect();
    assert_eq!(codes, vec![0, throttling], "{:?}", resp.responses);
    assert!(resp.throttle_time_ms > 0);

    // CreatePartitions v3 is strict as well: m3 grows by 3 and takes the
    // client over, so m4 waits.
    let grow = CreatePartitionsRequest::default()
        .with_topics(
            ["m3", "m4"]
                .iter()
                .map(|n| {
                    create_partitions_request::CreatePartitionsTopic::default()
                        .with_name(TopicName(s(n)))
                        .with_count(5)
                        .with_assignments(None)
                })
                .collect(),
        )
        .with_timeout_ms(10_000);
    // (Until the deletion's partitions leave the window, both are refused.)
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let resp: CreatePartitionsResponse = c.call(ApiKey::CreatePartitions, 3, &grow).await;
        let codes: Vec<i16> = resp.results.iter().map(|t| t.error_code).collect();
        assert!(resp.throttle_time_ms > 0);
        if codes[0] == 0 {
            assert_eq!(codes, vec![0, throttling], "{:?}", resp.results);
            break;
        }
        assert_eq!(codes, vec![throttling, throttling], "{:?}", resp.results);
        assert!(Instant::now() < deadline, "m3 never grew");
    }

    // Once the rate has come back under the quota, m2 is created: the
    // throttle is a wait, not a refusal for good.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let resp: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create(&["m2"], 1)).await;
        if resp.topics[0].error_code == 0 {
            break;
        }
        assert_eq!(resp.topics[0].error_code, throttling);
        assert!(Instant::now() < deadline, "m2 was never admitted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    b.running.shutdown().await;
}

#[tokio::test]
async fn request_percentage_charges_a_handlers_work_not_its_waits() {
    let b = start(&[
        ("quota.window.num", "2"),
        ("quota.window.size.seconds", "1"),
    ])
    .await;
    let mut c = Client::connect(b.running.local_addr).await;
    assert_eq!(c.create_topic("r", 1, &[]).await, 0);
    assert_eq!(c.create_topic("idle", 1, &[]).await, 0);
    let p = c
        .produce("r", 0, 1, batch(&["a", "b"], Compression::None, None))
        .await;
    assert_eq!(p.error_code, 0);
    let set_quota = |percent: f64| {
        AlterClientQuotasRequest::default().with_entries(vec![EntryData::default()
            .with_entity(entity(&[("client-id", Some("test"))]))
            .with_ops(vec![set("request_percentage", percent)])])
    };
    let fetch = |topic: &str, max_wait_ms: i32| {
        let mut fp = fetch_request::FetchPartition::default();
        fp.partition = 0;
        fp.fetch_offset = 0;
        fp.partition_max_bytes = 1 << 20;
        fp.current_leader_epoch = -1;
        let mut ft = fetch_request::FetchTopic::default();
        ft.topic = TopicName(s(topic));
        ft.partitions = vec![fp];
        FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(max_wait_ms)
            .with_min_bytes(1)
            .with_max_bytes(1 << 20)
            .with_session_epoch(-1)
            .with_topics(vec![ft])
    };

    // 1% of a thread: 10 ms a second. Four 300 ms long polls would be 120%
    // if their waits counted; their handlers' work is far below 1%.
    let r: AlterClientQuotasResponse = c.call(ApiKey::AlterClientQuotas, 1, &set_quota(1.0)).await;
    assert_eq!(r.entries[0].error_code, 0);
    for _ in 0..4 {
        let resp: FetchResponse = c.call(ApiKey::Fetch, 12, &fetch("idle", 300)).await;
        assert_eq!(resp.throttle_time_ms, 0, "a long poll's wait was charged");
    }

    // A quota far below any request's work: Fetch counts too, and a Fetch
    // over it goes out empty with its throttle. (The AlterClientQuotas is
    // itself charged against the new quota and its connection muted, so the
    // fetches go on another.)
    let r: AlterClientQuotasResponse = c.call(ApiKey::AlterClientQuotas, 1, &set_quota(0.01)).await;
    assert_eq!(r.entries[0].error_code, 0);
    let mut c = Client::connect(b.running.local_addr).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let resp: FetchResponse = c.call(ApiKey::Fetch, 12, &fetch("r", 0)).await;
        if resp.throttle_time_ms > 0 {
            assert!(
                resp.responses.is_empty(),
                "a throttled fetch carried records"
            );
            break;
        }
        assert_eq!(resp.responses[0].partitions[0].error_code, 0);
        assert!(Instant::now() < deadline, "fetches were never throttled");
    }
    b.running.shutdown().await;
}
