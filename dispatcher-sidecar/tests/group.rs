//! Queue consumers against our broker: two consumers of one group split the
//! partitions, the survivor takes all of them when the other leaves; a
//! message produced to a partition is fetched from that partition and its
//! commit is stored.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use dispatcher_sidecar::config::QueueConfig;
use dispatcher_sidecar::kafka::consumer::{Assignment, Decode, FetchError, QueueConsumer};
use dispatcher_sidecar::kafka::producer::{Producer, Record};
use dispatcher_sidecar::kafka::{self};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use tokio::sync::watch;

/// Fetched records as rdkafka's own owned messages, to look at them whole.
struct Owned;

impl Decode for Owned {
    type Out = OwnedMessage;

    fn decode<M: Message>(&self, m: &M) -> OwnedMessage {
        let headers = m.headers().map(|hs| {
            hs.iter().fold(OwnedHeaders::new(), |all, h| {
                all.insert(Header {
                    key: h.key,
                    value: h.value,
                })
            })
        });
        OwnedMessage::new(
            m.payload().map(<[u8]>::to_vec),
            m.key().map(<[u8]>::to_vec),
            m.topic().to_owned(),
            m.timestamp(),
            m.partition(),
            m.offset(),
            headers,
        )
    }
}

const TIMEOUT: Duration = Duration::from_secs(30);

/// Starts a consumer and a task that applies its assignment events to a
/// watched set (releasing revokes at once), as the lease engine's owner would.
fn start(
    config: &dispatcher_sidecar::config::Config,
    queue: &QueueConfig,
) -> (
    QueueConsumer,
    watch::Receiver<BTreeSet<i32>>,
    watch::Receiver<usize>,
) {
    let (consumer, mut events) = QueueConsumer::start(
        &kafka::consumer_config(config, queue),
        &queue.topic,
        Duration::from_secs(5),
        TIMEOUT,
    )
    .unwrap();
    let (owned_tx, owned_rx) = watch::channel(BTreeSet::new());
    let (revokes_tx, revokes_rx) = watch::channel(0usize);
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            match event {
                Assignment::Assigned(ps) => owned_tx.send_modify(|o| o.extend(ps)),
                Assignment::Revoked {
                    partitions,
                    release,
                } => {
                    owned_tx.send_modify(|o| {
                        partitions.iter().for_each(|p| {
                            o.remove(p);
                        })
                    });
                    revokes_tx.send_modify(|n| *n += 1);
                    drop(release);
                }
            }
        }
    });
    (consumer, owned_rx, revokes_rx)
}

async fn wait_for(
    what: &str,
    rx: &mut watch::Receiver<BTreeSet<i32>>,
    pred: impl FnMut(&BTreeSet<i32>) -> bool,
) -> BTreeSet<i32> {
    let got = tokio::time::timeout(TIMEOUT, rx.wait_for(pred))
        .await
        .map(|r| r.unwrap().clone());
    got.unwrap_or_else(|_| panic!("{what}: not within {TIMEOUT:?}; have {:?}", *rx.borrow()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_consumers_split_the_partitions_and_one_takes_over_when_the_other_leaves() {
    let broker = common::Broker::start(45020);
    let config = broker.config("[[queue]]\nname = \"work\"\ntopic = \"work\"\n");
    let queue = &config.queues[0];
    common::create_topic(&config, "work", 4).await;
    let all: BTreeSet<i32> = (0..4).collect();

    let (a, mut a_owned, a_revokes) = start(&config, queue);
    wait_for("A alone owns every partition", &mut a_owned, |o| *o == all).await;
    assert_eq!(a.assigned(), all);

    let (b, mut b_owned, _) = start(&config, queue);
    let b_set = wait_for("B gets a share", &mut b_owned, |o| !o.is_empty()).await;
    let a_set = wait_for("A keeps the rest", &mut a_owned, |o| {
        o.is_disjoint(&b_set) && o.len() + b_set.len() == 4
    })
    .await;
    assert!(
        !a_set.is_empty() && !b_set.is_empty(),
        "A {a_set:?} B {b_set:?}"
    );
    assert!(*a_revokes.borrow() >= 1, "A saw its partitions revoked");
    assert_eq!(b.assigned(), b_set);

    // A partition A does not own cannot be fetched through A.
    let foreign = *b_set.iter().next().unwrap();
    assert!(matches!(
        a.fetch(foreign, 10, Duration::ZERO, &Owned).await,
        Err(FetchError::NotAssigned(p)) if p == foreign
    ));

    tokio::time::timeout(TIMEOUT, b.close())
        .await
        .expect("B leaves in time");
    wait_for("A takes over every partition", &mut a_owned, |o| *o == all).await;
    a.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_produced_message_is_fetched_from_its_partition_and_committed() {
    let broker = common::Broker::start(45030);
    let config = broker.config("[[queue]]\nname = \"mail\"\ntopic = \"mail\"\n");
    let queue = &config.queues[0];
    common::create_topic(&config, "mail", 3).await;

    let producer = Producer::new(&kafka::producer_config(&config), Duration::from_secs(5)).unwrap();
    let mut offsets = Vec::new();
    for i in 0..3u8 {
        let value = [b'v', b'0' + i];
        let delivered = tokio::time::timeout(
            TIMEOUT,
            producer.send(&Record {
                topic: "mail",
                partition: Some(1),
                key: Some(b"k"),
                payload: Some(&value),
                headers: vec![("attempt", b"2")],
            }),
        )
        .await
        .expect("ack in time")
        .unwrap();
        assert_eq!(delivered.0, 1);
        offsets.push(delivered.1);
    }
    assert_eq!(offsets, [0, 1, 2]);

    let (consumer, mut owned, _) = start(&config, queue);
    wait_for("the consumer owns all", &mut owned, |o| o.len() == 3).await;
    let mut got = Vec::new();
    while got.len() < 3 {
        let batch = consumer.fetch(1, 2, TIMEOUT, &Owned).await.unwrap();
        assert!(!batch.is_empty(), "messages within {TIMEOUT:?}");
        assert!(batch.len() <= 2, "fetch honours max");
        got.extend(batch);
    }
    let values: Vec<&[u8]> = got.iter().map(|m| m.payload().unwrap()).collect();
    assert_eq!(values, [b"v0", b"v1", b"v2"]);
    assert!(got
        .iter()
        .all(|m| m.partition() == 1 && m.key() == Some(b"k")));
    let h = got[0].headers().unwrap().get(0);
    assert_eq!((h.key, h.value), ("attempt", Some(&b"2"[..])));
    assert_eq!(got[2].offset(), 2);
    // Nothing on the other partitions.
    assert!(consumer
        .fetch(0, 10, Duration::from_millis(300), &Owned)
        .await
        .unwrap()
        .is_empty());

    // Nothing was committed by fetching (no auto commit); an explicit commit is stored.
    assert_eq!(
        consumer.committed(&[1], TIMEOUT).await.unwrap(),
        [(1, None)]
    );
    consumer.commit(&[(1, 2)]).await.unwrap();
    assert_eq!(
        consumer.committed(&[1], TIMEOUT).await.unwrap(),
        [(1, Some(2))]
    );
    consumer.close().await;
}

/// The point of the blocking revoke: the old owner commits its final offsets
/// while it still owns the partitions, and the new owner starts from them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoked_owner_commits_before_releasing_and_the_new_owner_resumes_there() {
    let broker = common::Broker::start(45040);
    let config = broker.config("[[queue]]\nname = \"hand\"\ntopic = \"hand\"\n");
    let queue = &config.queues[0];
    common::create_topic(&config, "hand", 2).await;
    let producer = Producer::new(&kafka::producer_config(&config), Duration::from_secs(5)).unwrap();
    for p in 0..2 {
        for i in 0..4u8 {
            producer
                .send(&Record {
                    topic: "hand",
                    partition: Some(p),
                    payload: Some(&[i]),
                    ..Record::default()
                })
                .await
                .unwrap();
        }
    }

    let (a, mut a_events) = QueueConsumer::start(
        &kafka::consumer_config(&config, queue),
        "hand",
        Duration::from_secs(20),
        TIMEOUT,
    )
    .unwrap();
    let first = tokio::time::timeout(TIMEOUT, a_events.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&first, Assignment::Assigned(ps) if ps.len() == 2),
        "{first:?}"
    );
    // A processes the first two messages of each partition.
    for p in 0..2 {
        let got = a.fetch(p, 2, TIMEOUT, &Owned).await.unwrap();
        assert_eq!(got.iter().map(|m| m.offset()).collect::<Vec<_>>(), [0, 1]);
    }

    let (b, mut b_owned, _) = start(&config, queue);
    let next = tokio::time::timeout(TIMEOUT, a_events.recv())
        .await
        .unwrap()
        .unwrap();
    let Assignment::Revoked {
        partitions,
        release,
    } = next
    else {
        panic!("A's next event after B joined is not a revoke: {next:?}");
    };
    assert_eq!(partitions.len(), 2, "eager rebalance revokes everything");
    assert!(a.assigned().is_empty());
    // The rebalance waits for us: B cannot own anything yet.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        b_owned.borrow().is_empty(),
        "B got partitions before A released"
    );
    let commits: Vec<(i32, i64)> = partitions.iter().map(|&p| (p, 2)).collect();
    a.commit(&commits)
        .await
        .expect("A still owns what it commits");
    drop(release);

    let b_set = wait_for("B gets a share", &mut b_owned, |o| !o.is_empty()).await;
    let p = *b_set.iter().next().unwrap();
    let got = b.fetch(p, 10, TIMEOUT, &Owned).await.unwrap();
    assert_eq!(
        got.iter().map(|m| m.offset()).collect::<Vec<_>>(),
        [2, 3],
        "B resumes at A's commit"
    );
    b.close().await;
    a.close().await;
}

/// A partition added to the topic after the consumer started gets its own
/// queue when it is assigned, and its messages are fetched from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_added_later_is_assigned_and_fetched() {
    use rdkafka::admin::NewPartitions;

    let broker = common::Broker::start(45060);
    let config = broker.config("[[queue]]\nname = \"grow\"\ntopic = \"grow\"\n");
    let queue = &config.queues[0];
    common::create_topic(&config, "grow", 1).await;
    let (consumer, mut owned, _) = start(&config, queue);
    wait_for("the first partition", &mut owned, |o| o.len() == 1).await;

    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(&config).create().unwrap();
    let r = admin
        .create_partitions(
            &[NewPartitions::new("grow", 2)],
            &AdminOptions::new().request_timeout(Some(TIMEOUT)),
        )
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    let producer = Producer::new(&kafka::producer_config(&config), Duration::from_secs(5)).unwrap();
    producer
        .send(&Record {
            topic: "grow",
            partition: Some(1),
            payload: Some(b"late"),
            ..Record::default()
        })
        .await
        .unwrap();

    wait_for("the new partition", &mut owned, |o| o.contains(&1)).await;
    let got = consumer.fetch(1, 10, TIMEOUT, &Owned).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload(), Some(&b"late"[..]));
    consumer.close().await;
}
