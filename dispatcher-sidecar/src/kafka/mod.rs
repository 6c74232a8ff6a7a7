//! The dispatcher's Kafka client layer (librdkafka through `rdkafka`): topic
//! setup, one consumer per queue, and one producer for retry, DLQ and
//! ack-log writes. It speaks only the Kafka protocol, so it works the same
//! in front of our broker and Apache Kafka.
//!
//! Invariant: nothing here decides delivery; it moves records and reports
//! assignments. The lease engine decides.

pub mod consumer;
pub mod control;
pub mod dedupe_log;
pub mod follow;
pub mod producer;
pub mod topics;

use rdkafka::config::ClientConfig;

use crate::config::{Config, QueueConfig};

/// Settings shared by every client: the bootstrap servers and the
/// `[librdkafka]` extras (security settings and the like).
fn base_config(config: &Config, client_id: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &config.bootstrap_servers)
        .set("client.id", client_id);
    // No Nagle delay, as Kafka's Java client (librdkafka leaves it on): an
    // ack's ack-log write is one small produce request the client waits on.
    c.set("socket.nagle.disable", "true");
    for (k, v) in &config.librdkafka {
        c.set(k, v);
    }
    // Set after the extras: the config rejects these keys there anyway.
    // Asking for a missing topic must never create it with broker defaults.
    c.set("allow.auto.create.topics", "false");
    c
}

/// The admin client's settings (topic setup).
pub fn admin_config(config: &Config) -> ClientConfig {
    base_config(config, "dispatcher-admin")
}

/// The consumer settings of one queue: its group, manual commits only, and
/// a new group starts at the earliest offset (a work queue does not skip
/// messages that were there before it started).
///
/// The client id ends in `@<advertised internal address>` when there is
/// one: the group's member list (DescribeGroups) then tells every instance
/// where the owner of a partition serves its `/internal` routes, which is
/// how requests are forwarded (`crate::forward`).
pub fn consumer_config(config: &Config, queue: &QueueConfig) -> ClientConfig {
    // The address is signed (`#<tag>`), so a stranger in the group cannot
    // claim one (`crate::forward::AddressSigner`).
    let client_id = match &config.advertised_internal {
        Some(addr) => {
            crate::forward::AddressSigner::new(&config.receipt_secret).client_id(&queue.name, addr)
        }
        None => format!("dispatcher-{}", queue.name),
    };
    let mut c = base_config(config, &client_id);
    c.set("group.id", &queue.group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    if !config.librdkafka.contains_key("auto.offset.reset") {
        c.set("auto.offset.reset", "earliest");
    }
    // librdkafka pre-fetches up to 64 MiB per consumer by default, on top of
    // the records the dispatcher buffers itself; each fetch answer lands in
    // a fresh multi-MiB buffer, and keeping that many alive made the kernel
    // zero new pages for most of them (6% of the dispatcher's CPU under
    // load). 16 MiB is still 160 ms of 1 KiB records at 100k msgs/s.
    if !config.librdkafka.contains_key(PREFETCH_KIB) {
        c.set(PREFETCH_KIB, "16384");
    }
    // Once a partition's pre-fetch passes that bound, librdkafka stops
    // fetching it for `fetch.queue.backoff.ms`, 1 s by default, even if the
    // queue drains meanwhile. The dispatcher drains 16 MiB of a busy
    // partition in about a second, so with the default each partition
    // stalled for much of every second: in four alternating pairs of
    // single runs of the dispatcher benchmark's workers, 105-126k msgs/s
    // with 1 s against 133-142k with 10 ms (docs/benchmarks.md). Not 0:
    // then librdkafka's broker thread spins for as long as a queue is full
    // (a core, measured).
    if !config.librdkafka.contains_key(FETCH_QUEUE_BACKOFF_MS) {
        c.set(FETCH_QUEUE_BACKOFF_MS, "10");
    }
    // librdkafka keeps one Fetch in flight per broker. While every busy
    // partition is over that bound, the Fetch it sends holds only the
    // partitions with nothing new (an idle one, or one read to its end), and
    // the broker holds it for `fetch.wait.max.ms` (500 ms by default) waiting
    // for data. The busy partitions cannot be fetched again until it
    // returns, and the dispatcher drains a busy partition's 16 MiB in less
    // than that. A debug trace of the benchmark's workers showed three
    // partitions drained to zero behind one read to its end; with 500 ms,
    // all 11 single runs ended in 0.3-1 s of a mostly idle machine while
    // the last partitions trickled in, with 100 ms none of 7 did (four
    // alternating pairs: 139-162k msgs/s against 149-195k,
    // docs/benchmarks.md). The cost: an idle consumer's broker answers ten
    // empty Fetches a second instead of two.
    if !config.librdkafka.contains_key(FETCH_WAIT_MAX_MS) {
        c.set(FETCH_WAIT_MAX_MS, "100");
    }
    c
}

const PREFETCH_KIB: &str = "queued.max.messages.kbytes";
const FETCH_QUEUE_BACKOFF_MS: &str = "fetch.queue.backoff.ms";
const FETCH_WAIT_MAX_MS: &str = "fetch.wait.max.ms";

/// The producer settings: acks from every in-sync replica and idempotence,
/// so a retried write lands once and an ack means the copy is durable.
///
/// No linger (librdkafka's default is 5 ms) unless `[librdkafka]` sets one:
/// a client request waits for almost every write the dispatcher makes (an
/// ack's ack-log events, a nack's copy, a produce), so a batching delay is
/// latency added to each of them. Writes still batch: what queues up while
/// a request to the partition's leader is in flight goes in the next one.
/// With 1 ms, librdkafka's broker thread, woken by an ack's first record,
/// slept out the linger (`poll` with a 1 ms timeout, seen with strace), so
/// every ack waited about 1.1 ms at the median against 0.4 ms with none,
/// and one or two workers' rate was a third lower (bench figures in
/// docs/benchmarks.md); from four workers on, the two were alike.
pub fn producer_config(config: &Config) -> ClientConfig {
    let mut c = base_config(config, "dispatcher-producer");
    if !config.librdkafka.contains_key("linger.ms") {
        c.set("linger.ms", "0");
    }
    c.set("acks", "all").set("enable.idempotence", "true");
    // Java clients place a key by murmur2; librdkafka's default
    // (`consistent_random`) hashes by CRC32, so the same key would land in
    // another partition than a Java producer's, and per-key order (ordered
    // queues, issue 8) holds only within a partition.
    if !config.librdkafka.contains_key("partitioner") {
        c.set("partitioner", "murmur2_random");
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        Config::parse(
            &format!(
                "bootstrap_servers = \"b:1\"\n{extra}\n[[queue]]\nname = \"q\"\ntopic = \"t\"\n"
            ),
            "t.toml",
            std::path::Path::new("."),
        )
        .unwrap()
    }

    #[test]
    fn consumers_commit_only_by_hand_in_the_queue_group() {
        let c = config("");
        let cc = consumer_config(&c, &c.queues[0]);
        assert_eq!(cc.get("bootstrap.servers"), Some("b:1"));
        assert_eq!(cc.get("group.id"), Some("q-dispatcher"));
        assert_eq!(cc.get("enable.auto.commit"), Some("false"));
        assert_eq!(cc.get("enable.auto.offset.store"), Some("false"));
        assert_eq!(cc.get("auto.offset.reset"), Some("earliest"));
        assert_eq!(cc.get("queued.max.messages.kbytes"), Some("16384"));
        assert_eq!(cc.get("fetch.queue.backoff.ms"), Some("10"));
        assert_eq!(cc.get("fetch.wait.max.ms"), Some("100"));
        assert_eq!(cc.get("socket.nagle.disable"), Some("true"));
        assert_eq!(cc.get("allow.auto.create.topics"), Some("false"));
        assert_eq!(cc.get("client.id"), Some("dispatcher-q"));
        let mut advertised = c.clone();
        advertised.advertised_internal = Some("h:1".into());
        let cc = consumer_config(&advertised, &advertised.queues[0]);
        let id = cc.get("client.id").unwrap();
        assert!(id.starts_with("dispatcher-q@h:1#"), "{id}");
        let signer = crate::forward::AddressSigner::new(&advertised.receipt_secret);
        assert_eq!(signer.verify(id), Ok("h:1"));
    }

    #[test]
    fn the_producer_is_idempotent_with_acks_all() {
        let p = producer_config(&config(""));
        assert_eq!(p.get("acks"), Some("all"));
        assert_eq!(p.get("enable.idempotence"), Some("true"));
        assert_eq!(p.get("linger.ms"), Some("0"));
        assert_eq!(p.get("allow.auto.create.topics"), Some("false"));
        assert_eq!(
            p.get("partitioner"),
            Some("murmur2_random"),
            "as Java clients"
        );
        let own = producer_config(&config("[librdkafka]\npartitioner = \"fnv1a\""));
        assert_eq!(
            own.get("partitioner"),
            Some("fnv1a"),
            "the user's choice stays"
        );
    }

    #[test]
    fn librdkafka_extras_reach_every_client() {
        let c = config(
            "[librdkafka]\n\"auto.offset.reset\" = \"latest\"\n\"socket.timeout.ms\" = 1000\n\"linger.ms\" = 2\n\"queued.max.messages.kbytes\" = 1024\n\"fetch.queue.backoff.ms\" = 500\n\"fetch.wait.max.ms\" = 500",
        );
        let cc = consumer_config(&c, &c.queues[0]);
        assert_eq!(cc.get("auto.offset.reset"), Some("latest"));
        assert_eq!(cc.get("queued.max.messages.kbytes"), Some("1024"));
        assert_eq!(cc.get("fetch.queue.backoff.ms"), Some("500"));
        assert_eq!(cc.get("fetch.wait.max.ms"), Some("500"));
        assert_eq!(cc.get("socket.timeout.ms"), Some("1000"));
        assert_eq!(admin_config(&c).get("socket.timeout.ms"), Some("1000"));
        assert_eq!(producer_config(&c).get("socket.timeout.ms"), Some("1000"));
        assert_eq!(producer_config(&c).get("linger.ms"), Some("2"));
    }
}
