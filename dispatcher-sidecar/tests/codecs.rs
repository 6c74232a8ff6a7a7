//! Records written in every codec Kafka has (none, gzip, snappy, lz4,
//! zstd) are leased and acked through the dispatcher (issue 29: its
//! librdkafka had been built without zstd, so a zstd batch, a common
//! producer default, failed to decode and was never leased).

mod common;

use std::time::{Duration, Instant};

use common::Broker;
use dispatcher_sidecar::queue::Dispatcher;
use dispatcher_sidecar::service::{QueueService, ReceiptOutcome, ReceiveRequest};
use kafka_protocol::records::Compression;

const TIMEOUT: Duration = Duration::from_secs(30);
const Q: &str = "codecs";
const CODECS: [(&str, Compression); 5] = [
    ("none", Compression::None),
    ("gzip", Compression::Gzip),
    ("snappy", Compression::Snappy),
    ("lz4", Compression::Lz4),
    ("zstd", Compression::Zstd),
];
const PER_CODEC: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_in_every_codec_are_leased_and_acked() {
    let broker = Broker::start(45500);
    let topic = "codecs";
    let config = broker.config(&format!(
        "[[queue]]\nname = \"{Q}\"\ntopic = \"{topic}\"\ngroup = \"{topic}-dispatcher\"\n"
    ));
    common::create_topic(&config, topic, CODECS.len() as i32).await;
    // One partition per codec, so a codec the dispatcher cannot read stops
    // only its own partition.
    for (p, (name, codec)) in CODECS.iter().enumerate() {
        let payloads: Vec<Vec<u8>> = (0..PER_CODEC)
            .map(|i| format!("{name} record {i}: {}", "x".repeat(200)).into_bytes())
            .collect();
        let error = common::produce_batch(broker.addr, topic, p as i32, &payloads, *codec);
        assert_eq!(error, 0, "producing the {name} batch");
    }

    let d = Dispatcher::start(&config).await.unwrap();
    let mut got = vec![0usize; CODECS.len()];
    let deadline = Instant::now() + TIMEOUT;
    while got.iter().sum::<usize>() < CODECS.len() * PER_CODEC && Instant::now() < deadline {
        let batch = d
            .receive(
                Q,
                ReceiveRequest {
                    max_messages: 100,
                    wait: Duration::from_secs(1),
                    lease: None,
                    consumer: None,
                },
            )
            .await
            .unwrap();
        for m in &batch {
            let name = CODECS[m.partition as usize].0;
            let text = String::from_utf8(m.payload.to_vec()).unwrap();
            assert!(
                text.starts_with(&format!("{name} record ")),
                "partition {} ({name}) delivered {text:?}",
                m.partition
            );
            got[m.partition as usize] += 1;
        }
        let receipts: Vec<String> = batch.into_iter().map(|m| m.receipt).collect();
        if !receipts.is_empty() {
            let acked = d.ack(Q, &receipts).await.unwrap();
            assert!(acked.iter().all(|o| *o == ReceiptOutcome::Ok), "{acked:?}");
        }
    }
    let names: Vec<&str> = CODECS.iter().map(|c| c.0).collect();
    assert_eq!(
        got,
        vec![PER_CODEC; CODECS.len()],
        "records leased per codec {names:?} within {TIMEOUT:?}"
    );
    let stats = d.stats(Q).await.unwrap();
    assert_eq!((stats.depth, stats.in_flight), (0, 0), "{stats:?}");
    d.shutdown().await;
}
