//! A batch the dispatcher's Kafka client cannot decode stops its partition
//! (librdkafka reports the error at every fetch and hands out nothing at or
//! after it). Issue 29: that was only a log line; now `GET /queues/{q}`
//! names the stuck partition, the offset and the error, and the metrics
//! count it. Its own test binary: it installs a global metrics recorder.

mod common;

use common::recorder::TestRecorder;

use std::time::{Duration, Instant};

use dispatcher_sidecar::queue::Dispatcher;
use dispatcher_sidecar::service::{QueueService, ReceiptOutcome, ReceiveRequest};
use kafka_protocol::records::Compression;

const Q: &str = "undecodable";
const TIMEOUT: Duration = Duration::from_secs(30);

fn records(prefix: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("{prefix}{i}").into_bytes())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_cannot_be_decoded_shows_as_a_stuck_partition() {
    let recorder = TestRecorder::default();
    metrics::set_global_recorder(recorder.clone()).unwrap();
    let broker = common::Broker::start(45510);
    // librdkafka refuses a batch that inflates past
    // `receive.message.max.bytes` (100 MB by default; lowered here so the
    // test stays small). These two keys go to the `[librdkafka]` table the
    // test config opens.
    let config = broker.config(&format!(
        "\"fetch.max.bytes\" = 1000000\n\"receive.message.max.bytes\" = 1000512\n\
         [[queue]]\nname = \"{Q}\"\ntopic = \"{Q}\"\n"
    ));
    common::create_topic(&config, Q, 2).await;
    let produce = |partition, payloads: &[Vec<u8>], codec| {
        let error = common::produce_batch(broker.addr, Q, partition, payloads, codec);
        assert_eq!(error, 0, "producing to partition {partition}");
    };
    // Partition 0: three records, a zstd batch of 4 MB of zeros (a few
    // hundred bytes on the wire) at offset 3, three more behind it.
    produce(0, &records("before-", 3), Compression::None);
    produce(0, &[vec![0u8; 4 << 20]], Compression::Zstd);
    produce(0, &records("after-", 3), Compression::None);
    // Partition 1 is fine.
    produce(1, &records("other-", 3), Compression::Zstd);

    let d = Dispatcher::start(&config).await.unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    while got.len() < 6 && Instant::now() < deadline {
        let batch = d
            .receive(
                Q,
                ReceiveRequest {
                    max_messages: 10,
                    wait: Duration::from_secs(1),
                    lease: None,
                    consumer: None,
                },
            )
            .await
            .unwrap();
        let receipts: Vec<String> = batch.iter().map(|m| m.receipt.clone()).collect();
        got.extend(
            batch
                .into_iter()
                .map(|m| String::from_utf8(m.payload.to_vec()).unwrap()),
        );
        if !receipts.is_empty() {
            let acked = d.ack(Q, &receipts).await.unwrap();
            assert!(acked.iter().all(|o| *o == ReceiptOutcome::Ok), "{acked:?}");
        }
    }
    got.sort();
    assert_eq!(
        got,
        ["before-0", "before-1", "before-2", "other-0", "other-1", "other-2"],
        "everything but the batch that cannot be read and what follows it"
    );

    // The stats name the stuck partition, where, and why.
    let deadline = Instant::now() + TIMEOUT;
    let stuck = loop {
        let stats = d.stats(Q).await.unwrap();
        if let Some(s) = stats.stuck_partitions.first() {
            assert_eq!(stats.stuck_partitions.len(), 1, "{stats:?}");
            assert_eq!(stats.depth, 4, "the batch and the three behind it wait");
            break s.clone();
        }
        assert!(Instant::now() < deadline, "no stuck partition in {stats:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (stuck.topic.as_str(), stuck.partition, stuck.offset),
        (Q, 0, 3)
    );
    assert!(
        stuck.error.contains("BadCompression"),
        "the client's error: {stuck:?}"
    );
    assert!(stuck.errors >= 1 && stuck.since_ms > 0, "{stuck:?}");

    // And so do the metrics: every error counted, the partition flagged.
    let q = format!("queue={Q}");
    assert!(recorder.counter(&format!("dispatcher_fetch_errors_total{{partition=0,{q}}}")) >= 1);
    assert_eq!(
        recorder.counter(&format!("dispatcher_fetch_errors_total{{partition=1,{q}}}")),
        0
    );
    assert_eq!(
        recorder.gauge(&format!("dispatcher_partition_stuck{{partition=0,{q}}}")),
        Some(1.0)
    );
    // The periodic gauges (every ~5 s) keep it flagged, and partition 1 not.
    let deadline = Instant::now() + Duration::from_secs(15);
    while recorder.gauge(&format!("dispatcher_partition_stuck{{partition=1,{q}}}")) != Some(0.0) {
        assert!(Instant::now() < deadline, "no stuck gauge for partition 1");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        recorder.gauge(&format!("dispatcher_partition_stuck{{partition=0,{q}}}")),
        Some(1.0)
    );
    d.shutdown().await;
}
