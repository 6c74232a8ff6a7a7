package compat;

import java.io.BufferedWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * The share-group fault workload: ShareFaults &lt;subcommand&gt; args... (usage() lists them).
 *
 * <p>consume runs share consumers (explicit acknowledgement) that accept every record they get and
 * confirm it with commitSync. Each record received is logged {@code <ms> DELIVERED <member>
 * <value> <delivery count>}; each whose partition's acknowledgement commitSync reported done is
 * logged {@code <ms> ACCEPTED <member> <value>}. check reads the log: every seeded record must be
 * accepted at least once, and none may be delivered again after its acceptance was confirmed
 * (compat-tests/faults/README.md).
 */
public final class ShareFaults {
  private ShareFaults() {}

  static void usage() {
    System.err.println(
        String.join(
            "\n",
            "usage: ShareFaults <subcommand> args...",
            "  consume <bootstrap> <topic> <group> <members> <log> <stop-file> <max-s>",
            "          throttled to about 100 records/s per member until <stop-file>.drain exists",
            "  coordinator <bootstrap> <group> <topic> share|group",
            "          the node id of partition 0's share coordinator, or of the group's coordinator",
            "  check <log> <n>                           prints SHARECHECK PASS|FAIL k=v ...",
            "  selftest                                  the checker on hand-made data"));
    System.exit(2);
  }

  public static void main(String[] args) throws Exception {
    if (args.length < 1) usage();
    String[] a = java.util.Arrays.copyOfRange(args, 1, args.length);
    switch (args[0]) {
      case "consume" -> {
        if (a.length != 7) usage();
        consume(a[0], a[1], a[2], Integer.parseInt(a[3]), Path.of(a[4]), Path.of(a[5]), Faults.secs(a[6]));
      }
      case "coordinator" -> {
        if (a.length != 4 || !List.of("share", "group").contains(a[3])) usage();
        coordinator(a[0], a[1], a[2], a[3].equals("share"));
      }
      case "check" -> {
        if (a.length != 2) usage();
        System.exit(check(Files.readAllLines(Path.of(a[0])), Integer.parseInt(a[1])));
      }
      case "selftest" -> System.exit(selftest());
      default -> usage();
    }
  }

  static Admin admin(String bootstrap) {
    Properties p = new Properties();
    p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, 60_000);
    p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, 10_000);
    return Admin.create(p);
  }

  // ---------------------------------------------------------------- consume

  static void consume(String bootstrap, String topic, String group, int members, Path logPath, Path stopFile, long maxMs)
      throws Exception {
    try (Admin admin = admin(bootstrap)) {
      List<AlterConfigOp> ops = new ArrayList<>();
      Map.of(
              "share.auto.offset.reset", "earliest",
              "share.record.lock.duration.ms", "15000",
              "share.delivery.count.limit", "10")
          .forEach((k, v) -> ops.add(new AlterConfigOp(new ConfigEntry(k, v), AlterConfigOp.OpType.SET)));
      admin
          .incrementalAlterConfigs(Map.of(new ConfigResource(ConfigResource.Type.GROUP, group), ops))
          .all()
          .get(60, TimeUnit.SECONDS);
    }
    Path drain = Path.of(stopFile + ".drain");
    long end = System.currentTimeMillis() + maxMs;
    try (BufferedWriter log = Files.newBufferedWriter(logPath, StandardCharsets.UTF_8)) {
      List<Thread> threads = new ArrayList<>();
      for (int m = 0; m < members; m++) {
        String name = "m" + m;
        Thread t =
            new Thread(
                () -> member(bootstrap, topic, group, name, log, stopFile, drain, end), "share-fault-" + name);
        t.start();
        threads.add(t);
      }
      for (Thread t : threads) t.join();
    }
  }

  static synchronized void line(BufferedWriter log, String s) {
    try {
      log.write(System.currentTimeMillis() + "\t" + s + "\n");
      log.flush();
    } catch (java.io.IOException e) {
      throw new RuntimeException(e);
    }
  }

  static KafkaShareConsumer<String, String> consumer(String bootstrap, String group, String topic) {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 20);
    p.put(ConsumerConfig.REQUEST_TIMEOUT_MS_CONFIG, 10_000);
    p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, 30_000);
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    p.put("share.acknowledgement.mode", "explicit");
    KafkaShareConsumer<String, String> c = new KafkaShareConsumer<>(p);
    c.subscribe(List.of(topic));
    return c;
  }

  /** One member: poll, accept, commitSync, log; a consumer that fails is replaced. */
  static void member(
      String bootstrap, String topic, String group, String name, BufferedWriter log, Path stop, Path drain, long end) {
    while (!Files.exists(stop) && System.currentTimeMillis() < end) {
      try (KafkaShareConsumer<String, String> c = consumer(bootstrap, group, topic)) {
        while (!Files.exists(stop) && System.currentTimeMillis() < end) {
          ConsumerRecords<String, String> recs = c.poll(Duration.ofMillis(500));
          if (recs.isEmpty()) continue;
          // commitSync answers per partition; ConsumerRecord has no topic id, so by name.
          Map<String, List<String>> byPartition = new HashMap<>();
          for (ConsumerRecord<String, String> r : recs) {
            line(log, "DELIVERED\t" + name + "\t" + r.value() + "\t" + r.deliveryCount().orElse((short) -1));
            c.acknowledge(r, AcknowledgeType.ACCEPT);
            byPartition.computeIfAbsent(r.topic() + "-" + r.partition(), k -> new ArrayList<>()).add(r.value());
          }
          Map<TopicIdPartition, Optional<KafkaException>> result = c.commitSync();
          for (Map.Entry<TopicIdPartition, Optional<KafkaException>> e : result.entrySet()) {
            List<String> values =
                byPartition.getOrDefault(e.getKey().topic() + "-" + e.getKey().partition(), List.of());
            if (e.getValue().isEmpty()) {
              for (String v : values) line(log, "ACCEPTED\t" + name + "\t" + v);
            } else {
              line(log, "ACKFAIL\t" + name + "\t" + values.size() + "\t" + TxnFaults.describe(e.getValue().get()));
            }
          }
          // About 100 records/s per member (a poll may return more than max.poll.records: a
          // share fetch hands out whole batches).
          if (!Files.exists(drain)) Thread.sleep(Math.min(5_000L, recs.count() * 10L));
        }
      } catch (Exception e) {
        line(log, "ERROR\t" + name + "\t" + TxnFaults.describe(e));
        try {
          Thread.sleep(1_000);
        } catch (InterruptedException ie) {
          return;
        }
      }
    }
  }

  // ---------------------------------------------------------------- coordinator

  /**
   * The share coordinator of (group, topic, 0): the leader of partition abs(hash("group:topicId:0"))
   * % partitions of __share_group_state, as Kafka's ShareCoordinatorService places it; or the
   * group's coordinator, as ShareGroupDescribe reports it.
   */
  static void coordinator(String bootstrap, String group, String topic, boolean share) throws Exception {
    try (Admin admin = admin(bootstrap)) {
      if (!share) {
        System.out.println(
            admin.describeShareGroups(List.of(group)).describedGroups().get(group).get(60, TimeUnit.SECONDS).coordinator().id());
        return;
      }
      Map<String, TopicDescription> d =
          admin.describeTopics(List.of(topic, "__share_group_state")).allTopicNames().get(60, TimeUnit.SECONDS);
      String key = group + ":" + d.get(topic).topicId() + ":0";
      int partitions = d.get("__share_group_state").partitions().size();
      int p = (key.hashCode() & 0x7fffffff) % partitions;
      System.out.println(d.get("__share_group_state").partitions().get(p).leader().id());
    }
  }

  // ---------------------------------------------------------------- check

  static final class Report {
    int seeded, accepted, missing, redeliveredAfterAccept, deliveries, ackFailures, errors;

    boolean clean() {
      return missing == 0 && redeliveredAfterAccept == 0;
    }

    @Override
    public String toString() {
      return String.format(
          "SHARECHECK %s seeded=%d accepted=%d missing=%d redelivered_after_accept=%d deliveries=%d ack_failures=%d errors=%d",
          clean() ? "PASS" : "FAIL", seeded, accepted, missing, redeliveredAfterAccept, deliveries, ackFailures, errors);
    }
  }

  static Report analyze(List<String> lines, int n) {
    Report r = new Report();
    r.seeded = n;
    Map<String, Long> acceptedAt = new HashMap<>();
    List<String[]> delivered = new ArrayList<>();
    for (String l : lines) {
      String[] f = l.split("\t");
      if (f.length < 2) continue;
      switch (f[1]) {
        case "DELIVERED" -> {
          r.deliveries++;
          delivered.add(f);
        }
        case "ACCEPTED" -> acceptedAt.merge(f[3], Long.parseLong(f[0]), Math::min);
        case "ACKFAIL" -> r.ackFailures++;
        case "ERROR" -> r.errors++;
        default -> {}
      }
    }
    for (String[] f : delivered) {
      Long at = acceptedAt.get(f[3]);
      if (at != null && Long.parseLong(f[0]) > at) r.redeliveredAfterAccept++;
    }
    for (int i = 0; i < n; i++) {
      if (acceptedAt.containsKey("in-" + i)) r.accepted++;
      else r.missing++;
    }
    return r;
  }

  static int check(List<String> lines, int n) {
    Report r = analyze(lines, n);
    System.out.println(r);
    return r.clean() ? 0 : 1;
  }

  static int selftest() {
    List<String> lines =
        List.of(
            "100\tDELIVERED\tm0\tin-0\t1",
            "101\tACCEPTED\tm0\tin-0",
            "102\tDELIVERED\tm1\tin-1\t1",
            "103\tACKFAIL\tm1\t1\tx",
            "104\tDELIVERED\tm0\tin-1\t2",
            "105\tACCEPTED\tm0\tin-1",
            "106\tDELIVERED\tm2\tin-0\t2", // after in-0's acceptance
            "107\tDELIVERED\tm2\tin-2\t1"); // in-2 never accepted
    Report r = analyze(lines, 3);
    int f = 0;
    f += Faults.expect("accepted", r.accepted, 2);
    f += Faults.expect("missing", r.missing, 1);
    f += Faults.expect("redelivered_after_accept", r.redeliveredAfterAccept, 1);
    f += Faults.expect("ack_failures", r.ackFailures, 1);
    f += Faults.expect("clean", analyze(lines.subList(0, 6), 2).clean() ? 1 : 0, 1);
    System.out.println(f == 0 ? "SELFTEST PASS" : "SELFTEST FAIL " + f);
    return f == 0 ? 0 : 1;
  }
}
