package compat;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ListShareGroupOffsetsSpec;
import org.apache.kafka.clients.admin.SharePartitionOffsetInfo;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The share-group scenarios of the Java family (KIP-932, issue 32): KafkaShareConsumer with
 * implicit and explicit acknowledgement, RELEASE (redelivered with the delivery count raised),
 * REJECT (never redelivered), lock expiry (redelivered to another member), several members sharing
 * partitions (no record accepted twice), and the delivery-count limit (archived after it).
 *
 * <p>Every scenario sets its group's configs first (share.auto.offset.reset=earliest and what it
 * tests) with IncrementalAlterConfigs on the GROUP resource, as a user does with kafka-configs.sh.
 */
final class ShareScenarios {
  static final int RECORDS = 200;
  /** Kafka's smallest allowed group.share.min.record.lock.duration.ms default. */
  static final int SHORT_LOCK_MS = 15_000;
  /** How long a scenario watches for a record that must not come back. */
  static final long QUIET_MS = 3_000;
  static final long WAIT_MS = 30_000;

  private final Scenarios s;

  ShareScenarios(Scenarios s) {
    this.s = s;
  }

  Properties props(String group, boolean explicit) {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, s.bootstrap);
    p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, Scenarios.API_TIMEOUT_MS);
    p.put(ConsumerConfig.REQUEST_TIMEOUT_MS_CONFIG, Scenarios.REQUEST_TIMEOUT_MS);
    p.put("share.acknowledgement.mode", explicit ? "explicit" : "implicit");
    return p;
  }

  /** Sets the group's configs; share.auto.offset.reset=earliest is always among them. */
  void groupConfigs(Admin admin, String group, Map<String, String> configs) throws Exception {
    Map<String, String> all = new HashMap<>(configs);
    all.putIfAbsent("share.auto.offset.reset", "earliest");
    List<AlterConfigOp> ops = new ArrayList<>();
    all.forEach((k, v) -> ops.add(new AlterConfigOp(new ConfigEntry(k, v), AlterConfigOp.OpType.SET)));
    ConfigResource resource = new ConfigResource(ConfigResource.Type.GROUP, group);
    admin
        .incrementalAlterConfigs(Map.of(resource, ops))
        .all()
        .get(Scenarios.API_TIMEOUT_MS, TimeUnit.MILLISECONDS);
  }

  /** n records spread over the topic's two partitions. */
  void produce(String topic, int n) throws Exception {
    produce(topic, n, 2);
  }

  void produce(String topic, int n, int partitions) throws Exception {
    try (KafkaProducer<byte[], byte[]> p = new KafkaProducer<>(s.producerProps())) {
      for (int i = 0; i < n; i++) {
        p.send(new ProducerRecord<>(topic, i % partitions, Scenarios.bytes(Scenarios.key(i)), Scenarios.bytes(Scenarios.value("share", i))));
      }
      p.flush();
    }
  }

  static short count(ConsumerRecord<byte[], byte[]> r) {
    Optional<Short> c = r.deliveryCount();
    return c.orElse((short) -1);
  }

  /** Fails if an acknowledgement commit reported an error for any partition. */
  static void checkCommitted(Map<TopicIdPartition, Optional<KafkaException>> result) {
    result.forEach(
        (tp, e) -> Scenarios.check(e.isEmpty(), "acknowledging %s failed: %s", tp, e.map(Scenarios::describe).orElse("")));
  }

  interface Body {
    String run(Admin admin, String topic, String group) throws Exception;
  }

  /** A two-partition topic and a group of its own for the body; the topic is deleted after. */
  String withTopic(String id, Map<String, String> configs, Body body) throws Exception {
    return withTopic(id, 2, configs, body);
  }

  String withTopic(String id, int partitions, Map<String, String> configs, Body body) throws Exception {
    String topic = s.topicName(id);
    String group = topic + "-group";
    try (Admin admin = s.admin()) {
      Scenarios.createTopic(admin, topic, partitions);
      try {
        groupConfigs(admin, group, configs);
        return body.run(admin, topic, group);
      } finally {
        Scenarios.deleteTopicQuietly(admin, topic);
      }
    }
  }

  /** Implicit mode: every record once, delivery count 1, and none again for a new member. */
  String implicitAck() throws Exception {
    return withTopic(
        "share.implicit",
        Map.of(),
        (admin, topic, group) -> {
          produce(topic, RECORDS);
          Map<String, Short> seen = new HashMap<>();
          try (KafkaShareConsumer<byte[], byte[]> c = new KafkaShareConsumer<>(props(group, false))) {
            c.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + WAIT_MS;
            while (seen.size() < RECORDS && System.currentTimeMillis() < deadline) {
              for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(500))) {
                String k = Scenarios.str(r.key());
                Scenarios.check(seen.put(k, count(r)) == null, "%s delivered twice", k);
                Scenarios.check(count(r) == 1, "%s delivery count %d, expected 1", k, count(r));
              }
            }
            Scenarios.check(seen.size() == RECORDS, "received %d of %d records", seen.size(), RECORDS);
            checkCommitted(c.commitSync());
          }
          try (KafkaShareConsumer<byte[], byte[]> c = new KafkaShareConsumer<>(props(group, false))) {
            c.subscribe(List.of(topic));
            int again = pollFor(c, QUIET_MS).size();
            Scenarios.check(again == 0, "%d accepted records were delivered again", again);
          }
          return RECORDS + " records, each delivered once";
        });
  }

  static List<ConsumerRecord<byte[], byte[]>> pollFor(KafkaShareConsumer<byte[], byte[]> c, long ms) {
    List<ConsumerRecord<byte[], byte[]>> out = new ArrayList<>();
    long deadline = System.currentTimeMillis() + ms;
    while (System.currentTimeMillis() < deadline) {
      for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(300))) out.add(r);
    }
    return out;
  }

  /**
   * Explicit mode: the first delivery of every record gets {@code first}; every later one is
   * accepted. RELEASE must bring each record back with delivery count 2; REJECT must never.
   */
  String explicitFirst(String id, AcknowledgeType first) throws Exception {
    return withTopic(
        id,
        Map.of(),
        (admin, topic, group) -> {
          produce(topic, RECORDS);
          Map<String, List<Short>> deliveries = new HashMap<>();
          try (KafkaShareConsumer<byte[], byte[]> c = new KafkaShareConsumer<>(props(group, true))) {
            c.subscribe(List.of(topic));
            int wanted = first == AcknowledgeType.RELEASE ? 2 * RECORDS : RECORDS;
            long deadline = System.currentTimeMillis() + WAIT_MS;
            int total = 0;
            while (total < wanted && System.currentTimeMillis() < deadline) {
              ConsumerRecords<byte[], byte[]> recs = c.poll(Duration.ofMillis(500));
              for (ConsumerRecord<byte[], byte[]> r : recs) {
                List<Short> counts = deliveries.computeIfAbsent(Scenarios.str(r.key()), k -> new ArrayList<>());
                counts.add(count(r));
                c.acknowledge(r, counts.size() == 1 ? first : AcknowledgeType.ACCEPT);
                total++;
              }
              if (!recs.isEmpty()) checkCommitted(c.commitSync());
            }
            for (ConsumerRecord<byte[], byte[]> r : pollFor(c, QUIET_MS)) {
              deliveries.get(Scenarios.str(r.key())).add(count(r));
              c.acknowledge(r, AcknowledgeType.ACCEPT);
            }
            checkCommitted(c.commitSync());
          }
          Scenarios.check(deliveries.size() == RECORDS, "received %d of %d records", deliveries.size(), RECORDS);
          List<Short> want = first == AcknowledgeType.RELEASE ? List.of((short) 1, (short) 2) : List.of((short) 1);
          deliveries.forEach(
              (k, counts) -> Scenarios.check(counts.equals(want), "%s delivery counts %s, expected %s", k, counts, want));
          return RECORDS + " records, delivery counts " + want + " after " + first;
        });
  }

  /**
   * A member that takes records and goes quiet: after the lock duration another member gets them
   * with delivery count 2 (and the rest with count 1), and the first member's late acknowledgement
   * changes nothing.
   */
  String lockExpiry() throws Exception {
    return withTopic(
        "share.lock_expiry",
        // One partition, so both members are assigned it (with two, each would get its own).
        1,
        Map.of("share.record.lock.duration.ms", Integer.toString(SHORT_LOCK_MS)),
        (admin, topic, group) -> {
          produce(topic, 10, 1);
          try (KafkaShareConsumer<byte[], byte[]> a = new KafkaShareConsumer<>(props(group, true));
              KafkaShareConsumer<byte[], byte[]> b = new KafkaShareConsumer<>(props(group, true))) {
            a.subscribe(List.of(topic));
            // One poll's records, held: in explicit mode a cannot poll again without acknowledging.
            List<ConsumerRecord<byte[], byte[]>> held = firstPoll(a);
            long heldAt = System.currentTimeMillis();
            Map<String, Short> heldKeys = new HashMap<>();
            for (ConsumerRecord<byte[], byte[]> r : held) heldKeys.put(Scenarios.str(r.key()), count(r));
            b.subscribe(List.of(topic));
            Map<String, Short> atB = new HashMap<>();
            long heldBackAfter = -1;
            long deadline = heldAt + SHORT_LOCK_MS + WAIT_MS;
            while (atB.size() < 10 && System.currentTimeMillis() < deadline) {
              for (ConsumerRecord<byte[], byte[]> r : b.poll(Duration.ofMillis(500))) {
                String k = Scenarios.str(r.key());
                Scenarios.check(atB.put(k, count(r)) == null, "%s delivered to b twice", k);
                if (heldKeys.containsKey(k) && heldBackAfter < 0) heldBackAfter = System.currentTimeMillis() - heldAt;
                b.acknowledge(r, AcknowledgeType.ACCEPT);
              }
              checkCommitted(b.commitSync());
            }
            Scenarios.check(atB.size() == 10, "member b received %d of 10 records", atB.size());
            Scenarios.check(
                heldBackAfter >= SHORT_LOCK_MS - 1_000,
                "a's records reached b after %d ms, before the %d ms lock ended",
                heldBackAfter,
                SHORT_LOCK_MS);
            atB.forEach(
                (k, c) -> {
                  short want = (short) (heldKeys.containsKey(k) ? 2 : 1);
                  Scenarios.check(c == want, "%s delivery count %d at b, expected %d", k, c, want);
                });
            // a's late acknowledgement (Kafka's client reports no error for it) must not
            // change what b accepted: nothing comes back.
            for (ConsumerRecord<byte[], byte[]> r : held) a.acknowledge(r, AcknowledgeType.RELEASE);
            a.commitSync();
            int again = pollFor(b, QUIET_MS).size();
            Scenarios.check(again == 0, "%d records came back after a's late release", again);
            return held.size() + " held records redelivered to b with count 2 after " + heldBackAfter + " ms";
          }
        });
  }

  /**
   * {@code members} consumers in one group on a two-partition topic, implicit acknowledgement,
   * records produced while they consume: every record accepted, none twice.
   */
  String members(int members) throws Exception {
    int records = 1_000;
    return withTopic(
        "share.members." + members,
        Map.of(),
        (admin, topic, group) -> {
          Map<String, String> acceptedBy = new ConcurrentHashMap<>();
          AtomicReference<String> violation = new AtomicReference<>();
          AtomicBoolean stop = new AtomicBoolean();
          AtomicInteger active = new AtomicInteger();
          List<Thread> threads = new ArrayList<>();
          for (int m = 0; m < members; m++) {
            String name = "m" + m;
            Thread t =
                new Thread(
                    () -> {
                      try (KafkaShareConsumer<byte[], byte[]> c = new KafkaShareConsumer<>(props(group, false))) {
                        c.subscribe(List.of(topic));
                        boolean counted = false;
                        while (!stop.get()) {
                          ConsumerRecords<byte[], byte[]> recs = c.poll(Duration.ofMillis(300));
                          if (!recs.isEmpty() && !counted) {
                            active.incrementAndGet();
                            counted = true;
                          }
                          for (ConsumerRecord<byte[], byte[]> r : recs) {
                            String k = Scenarios.str(r.key());
                            String other = acceptedBy.putIfAbsent(k, name);
                            if (other != null) violation.compareAndSet(null, k + " delivered to " + other + " and " + name);
                          }
                        }
                      } catch (Exception e) {
                        violation.compareAndSet(null, name + ": " + Scenarios.describe(e));
                      }
                    },
                    "share-member-" + m);
            t.setDaemon(true);
            t.start();
            threads.add(t);
          }
          produce(topic, records);
          long deadline = System.currentTimeMillis() + WAIT_MS;
          while (acceptedBy.size() < records && violation.get() == null && System.currentTimeMillis() < deadline) {
            Thread.sleep(100);
          }
          stop.set(true);
          for (Thread t : threads) t.join(Scenarios.API_TIMEOUT_MS);
          Scenarios.check(violation.get() == null, "%s", violation.get());
          Scenarios.check(acceptedBy.size() == records, "accepted %d of %d records", acceptedBy.size(), records);
          return records + " records over " + members + " members (" + active.get() + " got records), none twice";
        });
  }

  /** The first non-empty poll of member a (within WAIT_MS). */
  static List<ConsumerRecord<byte[], byte[]>> firstPoll(KafkaShareConsumer<byte[], byte[]> a) {
    List<ConsumerRecord<byte[], byte[]>> held = new ArrayList<>();
    long deadline = System.currentTimeMillis() + WAIT_MS;
    while (held.isEmpty() && System.currentTimeMillis() < deadline) {
      for (ConsumerRecord<byte[], byte[]> r : a.poll(Duration.ofMillis(500))) held.add(r);
    }
    Scenarios.check(!held.isEmpty(), "member a received nothing");
    return held;
  }

  static Set<String> keys(List<ConsumerRecord<byte[], byte[]>> records) {
    Set<String> out = new TreeSet<>();
    for (ConsumerRecord<byte[], byte[]> r : records) out.add(Scenarios.str(r.key()));
    return out;
  }

  /**
   * RENEW (KIP-1222): a member that renews its records' locks keeps them past the lock duration.
   * Each renewal brings the records back to it with delivery count 1; another member meanwhile
   * gets none of them.
   */
  String renew() throws Exception {
    return withTopic(
        "share.renew",
        1,
        Map.of("share.record.lock.duration.ms", Integer.toString(SHORT_LOCK_MS)),
        (admin, topic, group) -> {
          produce(topic, 10, 1);
          try (KafkaShareConsumer<byte[], byte[]> a = new KafkaShareConsumer<>(props(group, true));
              KafkaShareConsumer<byte[], byte[]> b = new KafkaShareConsumer<>(props(group, true))) {
            a.subscribe(List.of(topic));
            List<ConsumerRecord<byte[], byte[]>> held = firstPoll(a);
            Set<String> heldKeys = keys(held);
            b.subscribe(List.of(topic));
            Map<String, Short> atB = new HashMap<>();
            long until = System.currentTimeMillis() + SHORT_LOCK_MS + 5_000;
            int renewals = 0;
            while (System.currentTimeMillis() < until) {
              for (ConsumerRecord<byte[], byte[]> r : held) a.acknowledge(r, AcknowledgeType.RENEW);
              // The renewal goes with the next poll, which gives the records back.
              List<ConsumerRecord<byte[], byte[]>> again = new ArrayList<>();
              long pollUntil = System.currentTimeMillis() + 5_000;
              while (again.size() < held.size() && System.currentTimeMillis() < pollUntil) {
                for (ConsumerRecord<byte[], byte[]> r : a.poll(Duration.ofMillis(300))) again.add(r);
              }
              Scenarios.check(
                  keys(again).equals(heldKeys), "renewed records came back as %s, expected %s", keys(again), heldKeys);
              for (ConsumerRecord<byte[], byte[]> r : again) {
                Scenarios.check(count(r) == 1, "%s came back with delivery count %d", Scenarios.str(r.key()), count(r));
              }
              held = again;
              renewals++;
              for (ConsumerRecord<byte[], byte[]> r : b.poll(Duration.ofMillis(300))) {
                atB.put(Scenarios.str(r.key()), count(r));
                b.acknowledge(r, AcknowledgeType.ACCEPT);
              }
            }
            for (String k : atB.keySet()) {
              Scenarios.check(!heldKeys.contains(k), "%s reached b while a renewed it", k);
            }
            for (ConsumerRecord<byte[], byte[]> r : held) a.acknowledge(r, AcknowledgeType.ACCEPT);
            checkCommitted(a.commitSync());
            int again = pollFor(b, QUIET_MS).size();
            Scenarios.check(again == 0, "%d records came back after a accepted", again);
            return heldKeys.size() + " records kept by " + renewals + " renewals past the " + SHORT_LOCK_MS + " ms lock";
          }
        });
  }

  /**
   * share.acquire.mode=record_limit (KIP-1206): a fetch acquires at most max.poll.records, so a
   * member holding 3 records leaves the rest of their batch to another member at once. Once all
   * is accepted the group's lag (DescribeShareGroupOffsets v1) is 0.
   */
  String recordLimit() throws Exception {
    return withTopic(
        "share.record_limit",
        1,
        Map.of(),
        (admin, topic, group) -> {
          produce(topic, 10, 1);
          Properties p = props(group, true);
          p.put(ConsumerConfig.SHARE_ACQUIRE_MODE_CONFIG, "record_limit");
          p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "3");
          try (KafkaShareConsumer<byte[], byte[]> a = new KafkaShareConsumer<>(p);
              KafkaShareConsumer<byte[], byte[]> b = new KafkaShareConsumer<>(p)) {
            a.subscribe(List.of(topic));
            List<ConsumerRecord<byte[], byte[]>> held = firstPoll(a);
            Scenarios.check(held.size() <= 3, "member a's poll returned %d records", held.size());
            Set<String> heldKeys = keys(held);
            b.subscribe(List.of(topic));
            Map<String, Short> atB = new HashMap<>();
            // Well inside the 30 s lock a holds its records for.
            long deadline = System.currentTimeMillis() + 10_000;
            while (atB.size() < 10 - held.size() && System.currentTimeMillis() < deadline) {
              ConsumerRecords<byte[], byte[]> recs = b.poll(Duration.ofMillis(300));
              Scenarios.check(recs.count() <= 3, "a poll of b returned %d records", recs.count());
              for (ConsumerRecord<byte[], byte[]> r : recs) {
                String k = Scenarios.str(r.key());
                Scenarios.check(!heldKeys.contains(k), "%s reached b while a held it", k);
                Scenarios.check(atB.put(k, count(r)) == null, "%s delivered to b twice", k);
                b.acknowledge(r, AcknowledgeType.ACCEPT);
              }
              if (!recs.isEmpty()) checkCommitted(b.commitSync());
            }
            Scenarios.check(
                atB.size() == 10 - held.size(), "b received %d records, expected the %d a did not hold", atB.size(), 10 - held.size());
            for (ConsumerRecord<byte[], byte[]> r : held) a.acknowledge(r, AcknowledgeType.ACCEPT);
            checkCommitted(a.commitSync());
          }
          TopicPartition tp = new TopicPartition(topic, 0);
          SharePartitionOffsetInfo info = null;
          long deadline = System.currentTimeMillis() + WAIT_MS;
          while (System.currentTimeMillis() < deadline) {
            info =
                admin
                    .listShareGroupOffsets(Map.of(group, new ListShareGroupOffsetsSpec()))
                    .partitionsToOffsetInfo(group)
                    .get(Scenarios.API_TIMEOUT_MS, TimeUnit.MILLISECONDS)
                    .get(tp);
            // The start offset is not compared: Kafka 4.4 reports 0 here (and counts the
            // accepted records as complete), we report 10.
            if (info != null && info.lag().equals(Optional.of(0L))) break;
            Thread.sleep(200);
          }
          Scenarios.check(
              info != null && info.lag().equals(Optional.of(0L)),
              "after all was accepted the group's offsets are %s, expected lag 0",
              info);
          return "3 records at most per fetch; the other member took the rest at once; lag 0 at the end";
        });
  }

  /** share.delivery.count.limit=2: a record released on every delivery comes twice, then never. */
  String deliveryLimit() throws Exception {
    return withTopic(
        "share.delivery_limit",
        Map.of("share.delivery.count.limit", "2"),
        (admin, topic, group) -> {
          produce(topic, 20);
          Map<String, List<Short>> deliveries = new HashMap<>();
          try (KafkaShareConsumer<byte[], byte[]> c = new KafkaShareConsumer<>(props(group, true))) {
            c.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + WAIT_MS;
            int total = 0;
            while (total < 40 && System.currentTimeMillis() < deadline) {
              ConsumerRecords<byte[], byte[]> recs = c.poll(Duration.ofMillis(500));
              for (ConsumerRecord<byte[], byte[]> r : recs) {
                deliveries.computeIfAbsent(Scenarios.str(r.key()), k -> new ArrayList<>()).add(count(r));
                c.acknowledge(r, AcknowledgeType.RELEASE);
                total++;
              }
              if (!recs.isEmpty()) checkCommitted(c.commitSync());
            }
            for (ConsumerRecord<byte[], byte[]> r : pollFor(c, QUIET_MS)) {
              deliveries.get(Scenarios.str(r.key())).add(count(r));
              c.acknowledge(r, AcknowledgeType.RELEASE);
            }
            checkCommitted(c.commitSync());
          }
          Scenarios.check(deliveries.size() == 20, "received %d of 20 records", deliveries.size());
          deliveries.forEach(
              (k, counts) ->
                  Scenarios.check(counts.equals(List.of((short) 1, (short) 2)), "%s delivery counts %s, expected [1, 2]", k, counts));
          return "20 records delivered twice each, then archived";
        });
  }

  /**
   * The dead-letter queue (KIP-1191): with share.delivery.count.limit=2 and a DLQ topic that allows
   * it (errors.deadletterqueue.group.enable=true), 10 records rejected once and 10 released on both
   * their deliveries all reach the DLQ topic, each with its original key and value
   * (errors.deadletterqueue.copy.record.enable) and Kafka's __dlq.errors.* headers.
   */
  String dlq() throws Exception {
    int n = 20;
    return withTopic(
        "share.dlq",
        1,
        Map.of(),
        (admin, topic, group) -> {
          String dlqTopic = "dlq." + topic;
          admin
              .createTopics(
                  List.of(new NewTopic(dlqTopic, 1, (short) 1).configs(Map.of("errors.deadletterqueue.group.enable", "true"))))
              .all()
              .get(Scenarios.API_TIMEOUT_MS, TimeUnit.MILLISECONDS);
          try {
            groupConfigs(
                admin,
                group,
                Map.of(
                    "share.delivery.count.limit", "2",
                    "errors.deadletterqueue.topic.name", dlqTopic,
                    "errors.deadletterqueue.copy.record.enable", "true"));
            produce(topic, n, 1);
            int deliveries = 0;
            try (KafkaShareConsumer<byte[], byte[]> c = new KafkaShareConsumer<>(props(group, true))) {
              c.subscribe(List.of(topic));
              long deadline = System.currentTimeMillis() + WAIT_MS;
              // Even keys are rejected (one delivery), odd ones released on both deliveries.
              while (deliveries < n / 2 * 3 && System.currentTimeMillis() < deadline) {
                ConsumerRecords<byte[], byte[]> recs = c.poll(Duration.ofMillis(500));
                for (ConsumerRecord<byte[], byte[]> r : recs) {
                  int i = Integer.parseInt(Scenarios.str(r.key()).substring("key-".length()));
                  c.acknowledge(r, i % 2 == 0 ? AcknowledgeType.REJECT : AcknowledgeType.RELEASE);
                  deliveries++;
                }
                if (!recs.isEmpty()) checkCommitted(c.commitSync());
              }
            }
            Scenarios.check(deliveries == n / 2 * 3, "%d deliveries, expected %d", deliveries, n / 2 * 3);
            Map<Integer, List<ConsumerRecord<byte[], byte[]>>> dead =
                Scenarios.readAll(s.assignConsumerProps(), List.of(new TopicPartition(dlqTopic, 0)), n);
            List<ConsumerRecord<byte[], byte[]>> got = dead.getOrDefault(0, List.of());
            Scenarios.check(got.size() == n, "%d records in the DLQ topic, expected %d", got.size(), n);
            Map<String, String> seen = new HashMap<>();
            for (ConsumerRecord<byte[], byte[]> r : got) {
              String k = Scenarios.str(r.key());
              int i = Integer.parseInt(k.substring("key-".length()));
              boolean rejected = i % 2 == 0;
              Map<String, String> want =
                  Map.of(
                      "__dlq.errors.topic", topic,
                      "__dlq.errors.partition", "0",
                      "__dlq.errors.offset", Integer.toString(i),
                      "__dlq.errors.group", group,
                      "__dlq.errors.delivery.count", rejected ? "1" : "2",
                      "__dlq.errors.message",
                          rejected ? "Offset rejected by client." : "Offset delivery count exceeded the threshold.");
              for (Map.Entry<String, String> e : want.entrySet()) {
                Header h = r.headers().lastHeader(e.getKey());
                String v = h == null ? null : Scenarios.str(h.value());
                Scenarios.check(e.getValue().equals(v), "%s: header %s is %s, expected %s", k, e.getKey(), v, e.getValue());
              }
              Scenarios.check(
                  Scenarios.value("share", i).equals(Scenarios.str(r.value())), "%s: value %s is not the original", k, Scenarios.str(r.value()));
              Scenarios.check(seen.put(k, k) == null, "%s in the DLQ topic twice", k);
            }
            return n + " records in the DLQ topic (10 rejected, 10 at the delivery limit) with their key, value and __dlq.errors.* headers";
          } finally {
            Scenarios.deleteTopicQuietly(admin, dlqTopic);
          }
        });
  }
}
