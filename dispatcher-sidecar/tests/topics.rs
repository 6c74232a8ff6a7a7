//! Topic setup against our broker: the retry tiers, DLQ and ack log are
//! created with the primary's partitions and the right configs, and a second
//! run creates nothing.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dispatcher_sidecar::kafka::{self, topics};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;

const TIMEOUT: Duration = Duration::from_secs(20);

async fn create(
    admin: &AdminClient<DefaultClientContext>,
    name: &str,
    partitions: i32,
    retention_ms: &str,
) {
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1))
        .set("retention.ms", retention_ms);
    let r = admin
        .create_topics(
            &[topic],
            &AdminOptions::new().request_timeout(Some(TIMEOUT)),
        )
        .await
        .unwrap();
    assert!(r[0].is_ok(), "create {name}: {r:?}");
}

/// The topic's configs. Retried for a while: Apache Kafka may answer a
/// DescribeConfigs sent right after CreateTopics with no entries yet.
async fn describe(
    admin: &AdminClient<DefaultClientContext>,
    name: &str,
) -> HashMap<String, String> {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let r = admin
            .describe_configs(
                &[ResourceSpecifier::Topic(name)],
                &AdminOptions::new().request_timeout(Some(TIMEOUT)),
            )
            .await
            .unwrap();
        let configs: HashMap<String, String> = match r.into_iter().next().unwrap() {
            Ok(resource) => resource
                .entries
                .into_iter()
                .filter_map(|e| Some((e.name, e.value?)))
                .collect(),
            Err(_) => HashMap::new(),
        };
        if configs.contains_key("retention.ms") {
            return configs;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no configs for {name} within {TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn partitions(admin: &AdminClient<DefaultClientContext>) -> HashMap<String, usize> {
    admin
        .inner()
        .fetch_metadata(None, TIMEOUT)
        .unwrap()
        .topics()
        .iter()
        .map(|t| (t.name().to_string(), t.partitions().len()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_creates_tiers_dlq_and_ack_log_once_with_the_right_configs() {
    let broker = common::Broker::start(45010);
    let config = broker.config(
        "[[queue]]\nname = \"jobs\"\ntopic = \"jobs\"\n\
         [[queue]]\nname = \"forever\"\ntopic = \"forever\"\nretry_tiers = [\"30s\"]\n\
         [[queue]]\nname = \"ghost\"\ntopic = \"ghost\"\n",
    );
    let admin: Arc<AdminClient<DefaultClientContext>> =
        Arc::new(kafka::admin_config(&config).create().unwrap());
    create(&admin, "jobs", 4, "3600000").await;
    create(&admin, "forever", 2, "-1").await;

    let jobs = &config.queues[0];
    let report = tokio::time::timeout(TIMEOUT, topics::ensure_topics(&admin, jobs, TIMEOUT))
        .await
        .expect("setup finishes")
        .unwrap();
    let mut created = report.created.clone();
    created.sort();
    assert_eq!(
        created,
        [
            "jobs.acklog",
            "jobs.control",
            "jobs.dedupe",
            "jobs.dlq",
            "jobs.dlq.redrive",
            "jobs.index",
            "jobs.retry.10m",
            "jobs.retry.10s",
            "jobs.retry.1h",
            "jobs.retry.1m"
        ]
    );
    assert!(report.existing.is_empty());

    let counts = partitions(&admin);
    for t in created.iter().filter(|t| *t != "jobs.control") {
        assert_eq!(counts[t], 4, "{t} has the primary's partition count");
    }
    assert_eq!(counts["jobs.control"], 1, "one control partition");
    assert_eq!(
        describe(&admin, "jobs.control").await["cleanup.policy"],
        "compact"
    );
    let dlq = describe(&admin, "jobs.dlq").await;
    assert_eq!(
        dlq["retention.ms"], "7200000",
        "DLQ keeps twice the primary's 1 h"
    );
    let acklog = describe(&admin, "jobs.acklog").await;
    assert_eq!(acklog["cleanup.policy"], "compact");
    let dedupe = describe(&admin, "jobs.dedupe").await;
    assert_eq!(dedupe["cleanup.policy"], "compact,delete");
    assert_eq!(dedupe["retention.ms"], "300000");
    let tier = describe(&admin, "jobs.retry.10m").await;
    assert_eq!(tier["retention.ms"], (3_600_000 + 600_000).to_string());

    // Idempotent: the second run finds everything and creates nothing.
    let again = topics::ensure_topics(&admin, jobs, TIMEOUT).await.unwrap();
    assert!(again.created.is_empty(), "{again:?}");
    assert_eq!(again.existing.len(), 10);

    // An infinite primary retention gives an infinite DLQ retention.
    let forever = topics::ensure_topics(&admin, &config.queues[1], TIMEOUT)
        .await
        .unwrap();
    assert_eq!(forever.created.len(), 7, "{forever:?}");
    assert_eq!(describe(&admin, "forever.dlq").await["retention.ms"], "-1");
    assert_eq!(
        describe(&admin, "forever.retry.30s").await["retention.ms"],
        "-1"
    );
    assert_eq!(partitions(&admin)["forever.acklog"], 2);

    // A missing primary is an error, and looking for it did not create it.
    let err = topics::ensure_topics(&admin, &config.queues[2], TIMEOUT)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "queue \"ghost\": topic \"ghost\" does not exist (create it first)"
    );
    let counts = partitions(&admin);
    assert!(!counts.contains_key("ghost") && !counts.contains_key("ghost.dlq"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_log_with_another_partition_count_is_refused() {
    let broker = common::Broker::start(45012);
    let config = broker.config("[[queue]]\nname = \"q\"\ntopic = \"q\"\n");
    let admin: Arc<AdminClient<DefaultClientContext>> =
        Arc::new(kafka::admin_config(&config).create().unwrap());
    create(&admin, "q", 3, "60000").await;
    create(&admin, "q.acklog", 1, "60000").await;
    let err = topics::ensure_topics(&admin, &config.queues[0], TIMEOUT)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            topics::TopicSetupError::AckLogPartitions {
                found: 1,
                expected: 3,
                ..
            }
        ),
        "{err}"
    );
}
