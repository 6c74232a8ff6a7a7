//! The ack-log writer: per ack-log partition, one write in flight at a
//! time, and what queued meanwhile goes as the next write (group commit).
//!
//! Why not hand each record to librdkafka at once: its idempotent producer
//! stops sending to a partition once five *records* are in flight there
//! (`RD_KAFKA_IDEMP_MAX_INFLIGHT - rktp_msgs_inflight` in
//! `rd_kafka_toppar_producer_serve`), and while records wait behind that
//! bound its broker thread polls with a zero timeout, never sleeping
//! (their linger deadline has passed). In front of a broker that answers
//! slowly that thread burns a core. Handing it a partition's records only when none are in flight
//! sends them as one request and leaves nothing waiting.
//!
//! Order: records are appended under the owning partition's lock and
//! written in append order, each write after the previous one's delivery
//! reports, so the ack log holds them in the order the engine made them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::sync::{oneshot, Notify};

use super::Pending;

/// One record for the ack log; `value: None` is a tombstone.
pub(crate) struct OutRecord {
    pub key: Vec<u8>,
    pub value: Option<Vec<u8>>,
}

/// The records of one `append` and who waits for their delivery.
struct Appended {
    records: Vec<OutRecord>,
    done: oneshot::Sender<Result<(), String>>,
}

#[derive(Default)]
struct LaneQueue {
    waiting: VecDeque<Appended>,
    /// Records in `waiting`.
    waiting_records: usize,
    /// A task is writing this lane; it takes what is appended meanwhile.
    writing: bool,
}

#[derive(Default)]
struct Lane {
    queue: Mutex<LaneQueue>,
    /// Woken when the lane's writer ends (nothing left to write).
    idle: Notify,
}

/// Records one ack-log partition may have waiting behind its write in
/// flight (librdkafka's own local queue holds 100,000 by default); past it
/// an append fails at once, so a Kafka that stopped answering cannot grow
/// the dispatcher's memory.
const MAX_WAITING_RECORDS: usize = 100_000;

pub(crate) struct AckLogWriter {
    producer: FutureProducer,
    topic: String,
    lanes: Vec<Lane>,
    max_waiting: usize,
}

impl AckLogWriter {
    pub(crate) fn new(producer: FutureProducer, topic: String, partitions: i32) -> AckLogWriter {
        let n = usize::try_from(partitions.max(1)).unwrap_or(1);
        AckLogWriter {
            producer,
            topic,
            lanes: (0..n).map(|_| Lane::default()).collect(),
            max_waiting: MAX_WAITING_RECORDS,
        }
    }

    /// Queues `records` for the ack-log partition that mirrors queue
    /// partition `partition` (`partition` modulo the ack log's count), after
    /// everything appended to it before. The returned `Pending` resolves
    /// when Kafka has acknowledged them (or one of them failed). Needs a
    /// tokio runtime: the first append to an idle partition starts its
    /// writer.
    pub(crate) fn append(self: &Arc<Self>, partition: i32, records: Vec<OutRecord>) -> Pending {
        if records.is_empty() {
            return Pending::default();
        }
        let lane = usize::try_from(partition).unwrap_or(0) % self.lanes.len();
        let (done, wait) = oneshot::channel();
        let start = {
            let mut q = self.lanes[lane].queue.lock().unwrap();
            if q.waiting_records + records.len() > self.max_waiting {
                return Pending::failed(format!(
                    "ack-log partition {lane}: {} records already wait for Kafka",
                    q.waiting_records
                ));
            }
            q.waiting_records += records.len();
            q.waiting.push_back(Appended { records, done });
            !std::mem::replace(&mut q.writing, true)
        };
        if start {
            let this = Arc::clone(self);
            tokio::spawn(async move { this.write_lane(lane).await });
        }
        Pending::appended(wait)
    }

    /// Writes the lane's queued records, one batch in flight at a time,
    /// until none are left.
    async fn write_lane(&self, lane: usize) {
        let partition = i32::try_from(lane).expect("lanes are counted by an i32");
        loop {
            let batch: Vec<Appended> = {
                let mut q = self.lanes[lane].queue.lock().unwrap();
                if q.waiting.is_empty() {
                    q.writing = false;
                    drop(q);
                    self.lanes[lane].idle.notify_waiters();
                    return;
                }
                q.waiting_records = 0;
                q.waiting.drain(..).collect()
            };
            let mut sends = Vec::with_capacity(batch.len());
            for appended in &batch {
                let mut pending = Pending::default();
                for r in &appended.records {
                    let mut record = FutureRecord::<[u8], [u8]>::to(&self.topic)
                        .partition(partition)
                        .key(&r.key[..]);
                    if let Some(v) = &r.value {
                        record = record.payload(&v[..]);
                    }
                    pending.sent(self.producer.send_result(record));
                }
                sends.push(pending);
            }
            for (appended, pending) in batch.into_iter().zip(sends) {
                // Nobody waiting (a lease write's watcher gone) is fine.
                let _ = appended.done.send(pending.wait().await);
            }
        }
    }

    /// Waits until every record appended so far was written or failed, at
    /// most `timeout`: before a revoked partition's next owner reads the
    /// ack log, and at shutdown.
    pub(crate) async fn drain(&self, timeout: Duration) {
        let all = async {
            for lane in &self.lanes {
                loop {
                    let idle = lane.idle.notified();
                    tokio::pin!(idle);
                    idle.as_mut().enable();
                    if !lane.queue.lock().unwrap().writing {
                        break;
                    }
                    idle.await;
                }
            }
        };
        let _ = tokio::time::timeout(timeout, all).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::mocking::MockCluster;
    use rdkafka::{Message, Offset, TopicPartitionList};

    const TOPIC: &str = "jobs.acks";

    fn producer(bootstrap: &str, timeout_ms: u32) -> FutureProducer {
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("linger.ms", "0")
            .set("message.timeout.ms", timeout_ms.to_string())
            // Back soon after the mock broker is.
            .set("reconnect.backoff.max.ms", "200")
            .create()
            .unwrap()
    }

    fn record(i: usize) -> OutRecord {
        OutRecord {
            key: format!("k{i:04}").into_bytes(),
            // Every seventh a tombstone, as an ordered queue's `Unparked`.
            value: (!i.is_multiple_of(7)).then(|| format!("v{i}").into_bytes()),
        }
    }

    /// The (key, value) of partition `partition` of the topic, from its start.
    fn read_back(bootstrap: &str, partition: i32, n: usize) -> Vec<(String, Option<String>)> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "reader")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(TOPIC, partition, Offset::Beginning)
            .unwrap();
        consumer.assign(&tpl).unwrap();
        let text = |b: Option<&[u8]>| b.map(|b| String::from_utf8(b.to_vec()).unwrap());
        let mut out = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while out.len() < n && std::time::Instant::now() < deadline {
            if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                let m = m.unwrap();
                out.push((text(m.key()).unwrap(), text(m.payload())));
            }
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_reach_the_partition_in_order_and_drain_waits_for_them() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic(TOPIC, 2, 1).unwrap();
        // Slow answers, so appends pile up behind a write in flight.
        cluster
            .broker_round_trip_time(1, Duration::from_millis(20))
            .unwrap();
        let bootstrap = cluster.bootstrap_servers();
        let writer = Arc::new(AckLogWriter::new(
            producer(&bootstrap, 30_000),
            TOPIC.to_string(),
            2,
        ));
        let mut pendings = Vec::new();
        let mut i = 0;
        for round in 0..40 {
            let records: Vec<OutRecord> = (0..1 + round % 4).map(|k| record(i + k)).collect();
            i += records.len();
            pendings.push(writer.append(1, records));
            if round.is_multiple_of(5) {
                tokio::time::sleep(Duration::from_millis(7)).await;
            }
        }
        writer.drain(Duration::from_secs(30)).await;
        for lane in &writer.lanes {
            assert!(!lane.queue.lock().unwrap().writing, "drain left a write");
        }
        for p in pendings {
            assert_eq!(p.wait().await, Ok(()));
        }
        let expected: Vec<(String, Option<String>)> = (0..i)
            .map(|k| {
                let r = record(k);
                let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
                (text(r.key), r.value.map(text))
            })
            .collect();
        let got = tokio::task::spawn_blocking(move || read_back(&bootstrap, 1, i))
            .await
            .unwrap();
        assert_eq!(got, expected);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_waiting_behind_a_stuck_write_are_bounded() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic(TOPIC, 1, 1).unwrap();
        let bootstrap = cluster.bootstrap_servers();
        let mut writer = AckLogWriter::new(producer(&bootstrap, 30_000), TOPIC.to_string(), 1);
        writer.max_waiting = 3;
        let writer = Arc::new(writer);
        assert_eq!(writer.append(0, vec![record(1)]).wait().await, Ok(()));
        cluster.broker_down(1).unwrap();
        let in_flight = writer.append(0, vec![record(2)]);
        // The writer takes it: it no longer counts as waiting.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let waiting = writer.append(0, vec![record(3), record(4), record(5)]);
        let refused = writer.append(0, vec![record(6)]).wait().await;
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.contains("3 records already wait")),
            "{refused:?}"
        );
        // A drain gives up at its bound while the write is stuck.
        writer.drain(Duration::from_millis(300)).await;
        assert!(writer.lanes[0].queue.lock().unwrap().writing);
        cluster.broker_up(1).unwrap();
        assert_eq!(in_flight.wait().await, Ok(()));
        assert_eq!(waiting.wait().await, Ok(()));
        // Room again once the waiting records went out.
        assert_eq!(writer.append(0, vec![record(7)]).wait().await, Ok(()));
        let got = tokio::task::spawn_blocking(move || read_back(&bootstrap, 0, 6))
            .await
            .unwrap();
        let keys: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["k0001", "k0002", "k0003", "k0004", "k0005", "k0007"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_write_is_reported_to_its_waiters_and_the_lane_goes_on() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic(TOPIC, 1, 1).unwrap();
        let bootstrap = cluster.bootstrap_servers();
        let writer = Arc::new(AckLogWriter::new(
            producer(&bootstrap, 3_000),
            TOPIC.to_string(),
            1,
        ));
        assert_eq!(writer.append(0, vec![record(1)]).wait().await, Ok(()));
        cluster.broker_down(1).unwrap();
        let lost = writer.append(0, vec![record(2), record(3)]);
        assert!(
            lost.wait().await.is_err(),
            "a write to a down broker failed"
        );
        cluster.broker_up(1).unwrap();
        assert_eq!(writer.append(0, vec![record(4)]).wait().await, Ok(()));
        writer.drain(Duration::from_secs(10)).await;
        let got = tokio::task::spawn_blocking(move || read_back(&bootstrap, 0, 2))
            .await
            .unwrap();
        let keys: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["k0001", "k0004"]);
    }
}
