package compat;

import java.io.BufferedWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The transactional fault workload: TxnFaults &lt;subcommand&gt; args... (usage() lists them).
 *
 * <p>seed writes input records "in-&lt;n&gt;" to topic A. process is a read-process-write loop as
 * an exactly-once application writes it: a read_committed group consumer on A, a transactional
 * producer writing one record "&lt;input id&gt; &lt;txn label&gt;" to B per input, the input
 * offsets sent with sendOffsetsToTransaction, then commit; every 10th transaction is aborted on
 * purpose; on an error the transaction is aborted and producer and consumer are re-created. Each
 * transaction ends with one log line {@code <ms> COMMITTED|ABORTED|UNKNOWN <label> <count>
 * <ids,...> <error>}: ABORTED when no EndTxn(commit) was attempted (so it can never commit),
 * UNKNOWN when commitTransaction itself failed. check reads B (read_committed and
 * read_uncommitted), A and the group's committed offsets and counts the anomalies (see
 * compat-tests/faults/README.md).
 */
public final class TxnFaults {
  private TxnFaults() {}

  static void usage() {
    System.err.println(
        String.join(
            "\n",
            "usage: TxnFaults <subcommand> args...",
            "  seed <bootstrap> <topicA> <n>                        writes in-0 .. in-<n-1>",
            "  process <bootstrap> <A> <B> <group> <txn-id> <log> <stop-file> <max-s>",
            "  coordinator <bootstrap> <txn-id>                     the node id of its coordinator",
            "  check <bootstrap> <A> <B> <group> <log>              prints TXNCHECK PASS|FAIL k=v ...",
            "  selftest                                             the checker on hand-made data"));
    System.exit(2);
  }

  public static void main(String[] args) throws Exception {
    if (args.length < 1) {
      usage();
    }
    String[] a = java.util.Arrays.copyOfRange(args, 1, args.length);
    switch (args[0]) {
      case "seed" -> {
        if (a.length != 3) usage();
        seed(a[0], a[1], Integer.parseInt(a[2]));
      }
      case "process" -> {
        if (a.length != 8) usage();
        process(a[0], a[1], a[2], a[3], a[4], Path.of(a[5]), Path.of(a[6]), Faults.secs(a[7]));
      }
      case "coordinator" -> {
        if (a.length != 2) usage();
        coordinator(a[0], a[1]);
      }
      case "check" -> {
        if (a.length != 5) usage();
        System.exit(check(a[0], a[1], a[2], a[3], Path.of(a[4])));
      }
      case "selftest" -> System.exit(selftest());
      default -> usage();
    }
  }

  /** The checker on hand-made data: one anomaly of each kind. */
  static int selftest() {
    List<Txn> txns =
        List.of(
            new Txn("COMMITTED", "g1t1", List.of("in-0", "in-1")),
            new Txn("ABORTED", "g1t2", List.of("in-2")),
            new Txn("COMMITTED", "g1t3", List.of("in-2", "in-3")), // in-3 lost, torn
            new Txn("UNKNOWN", "g1t4", List.of("in-4")),
            new Txn("COMMITTED", "g2t1", List.of("in-4"))); // in-4 twice
    List<String> visible =
        List.of("in-0 g1t1", "in-1 g1t1", "in-2 g1t2", "in-2 g1t3", "in-4 g1t4", "in-4 g2t1", "in-9 g9t9");
    // Offsets committed past in-5, which has no output.
    Map<Integer, List<String>> inputs = Map.of(0, List.of("in-0", "in-1", "in-2", "in-3", "in-4", "in-5", "in-6"));
    Report r = analyze(txns, visible, inputs, Map.of(0, 6L));
    int f = 0;
    f += Faults.expect("aborted_read", r.abortedRead, 1);
    f += Faults.expect("lost_committed", r.lostCommitted, 1);
    f += Faults.expect("torn", r.torn, 1);
    // in-2 (g1t2 aborted + g1t3) and in-4 (g1t4 + g2t1).
    f += Faults.expect("duplicates", r.duplicates, 2);
    // in-3 and in-5 are below the committed offset 6 without output.
    f += Faults.expect("offsets_without_output", r.offsetsWithoutOutput, 2);
    f += Faults.expect("unlogged", r.unlogged, 1);
    f += Faults.expect("inputs_committed", r.inputsCommitted, 6);
    Report ok =
        analyze(List.of(new Txn("COMMITTED", "g1t1", List.of("in-0")), new Txn("ABORTED", "g1t2", List.of("in-1"))),
            List.of("in-0 g1t1"), Map.of(0, List.of("in-0", "in-1")), Map.of(0, 1L));
    f += Faults.expect("clean verdict", ok.clean() ? 1 : 0, 1);
    System.out.println(f == 0 ? "SELFTEST PASS" : "SELFTEST FAIL " + f);
    return f == 0 ? 0 : 1;
  }

  // ---------------------------------------------------------------- seed

  static void seed(String bootstrap, String topic, int n) throws Exception {
    Properties p = new Properties();
    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ProducerConfig.ACKS_CONFIG, "all");
    p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
    p.put(ProducerConfig.LINGER_MS_CONFIG, 5);
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
      int partitions = producer.partitionsFor(topic).size();
      List<java.util.concurrent.Future<?>> fs = new ArrayList<>();
      for (int i = 0; i < n; i++) {
        fs.add(producer.send(new ProducerRecord<>(topic, i % partitions, null, "in-" + i)));
      }
      for (var f : fs) {
        f.get(120, TimeUnit.SECONDS);
      }
    }
    System.out.println("seeded " + n);
  }

  // ---------------------------------------------------------------- process

  static KafkaConsumer<String, String> consumer(String bootstrap, String group, String topic) {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, envInt("TXN_FAULTS_BATCH", 30));
    p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, 10_000);
    p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, 2_000);
    p.put(ConsumerConfig.REQUEST_TIMEOUT_MS_CONFIG, 10_000);
    p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, 30_000);
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    KafkaConsumer<String, String> c = new KafkaConsumer<>(p);
    c.subscribe(List.of(topic));
    return c;
  }

  static KafkaProducer<String, String> producer(String bootstrap, String txnId) {
    Properties p = new Properties();
    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
    p.put(ProducerConfig.ACKS_CONFIG, "all");
    p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
    p.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, 20_000);
    p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, 10_000);
    p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, 30_000);
    p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, 30_000);
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    return new KafkaProducer<>(p);
  }

  static int envInt(String name, int dflt) {
    String v = System.getenv(name);
    return v == null || v.isEmpty() ? dflt : Integer.parseInt(v);
  }

  static String describe(Throwable t) {
    String m = t.getMessage();
    m = m == null ? "" : m.replaceAll("[\\t\\n]", " ");
    if (m.length() > 160) m = m.substring(0, 160);
    return Faults.errName(t) + ": " + m;
  }

  static void process(
      String bootstrap,
      String topicA,
      String topicB,
      String group,
      String txnId,
      Path logPath,
      Path stopFile,
      long maxMs)
      throws Exception {
    long pauseMs = envInt("TXN_FAULTS_PAUSE_MS", 100);
    int abortEvery = envInt("TXN_FAULTS_ABORT_EVERY", 10);
    long end = System.currentTimeMillis() + maxMs;
    BufferedWriter out = Files.newBufferedWriter(logPath, StandardCharsets.UTF_8);
    int gen = 0;
    long k = 0;
    long committed = 0, aborted = 0, unknown = 0, recreated = 0;
    KafkaConsumer<String, String> consumer = null;
    KafkaProducer<String, String> producer = null;
    while (System.currentTimeMillis() < end && !Files.exists(stopFile)) {
      if (producer == null) {
        // A real EOS application's restart: a new producer (initTransactions fences the old
        // one and aborts its open transaction) and a new consumer that resumes from the
        // group's committed offsets.
        try {
          gen++;
          producer = producer(bootstrap, txnId);
          producer.initTransactions();
          consumer = consumer(bootstrap, group, topicA);
          log(out, "INIT", "g" + gen, 0, List.of(), "");
        } catch (Exception e) {
          log(out, "INITFAIL", "g" + gen, 0, List.of(), describe(e));
          closeQuietly(producer, consumer);
          producer = null;
          consumer = null;
          Thread.sleep(1000);
          continue;
        }
      }
      String label = "g" + gen + "t" + (++k);
      List<String> ids = new ArrayList<>();
      boolean commitCalled = false;
      try {
        ConsumerRecords<String, String> recs = consumer.poll(Duration.ofMillis(500));
        if (recs.isEmpty()) {
          k--;
          continue;
        }
        producer.beginTransaction();
        Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
        Map<TopicPartition, Long> first = new HashMap<>();
        for (ConsumerRecord<String, String> r : recs) {
          ids.add(r.value());
          TopicPartition tp = new TopicPartition(r.topic(), r.partition());
          producer.send(new ProducerRecord<>(topicB, r.value(), r.value() + " " + label));
          offsets.put(tp, new OffsetAndMetadata(r.offset() + 1));
          first.putIfAbsent(tp, r.offset());
        }
        producer.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
        if (abortEvery > 0 && k % abortEvery == 0) {
          producer.abortTransaction();
          aborted++;
          log(out, "ABORTED", label, ids.size(), ids, "deliberate");
          for (Map.Entry<TopicPartition, Long> e : first.entrySet()) {
            consumer.seek(e.getKey(), e.getValue());
          }
        } else {
          commitCalled = true;
          producer.commitTransaction();
          committed++;
          log(out, "COMMITTED", label, ids.size(), ids, "");
        }
      } catch (Exception e) {
        if (ids.isEmpty() && !commitCalled) {
          // Failed before any record of a transaction was written (poll).
          log(out, "POLLFAIL", label, 0, ids, describe(e));
          k--;
        } else if (commitCalled) {
          unknown++;
          log(out, "UNKNOWN", label, ids.size(), ids, describe(e));
        } else {
          // No EndTxn(commit) was ever sent for it: it can only end aborted.
          aborted++;
          log(out, "ABORTED", label, ids.size(), ids, describe(e));
        }
        if (!commitCalled) {
          try {
            producer.abortTransaction();
          } catch (Exception ignored) {
            // the next producer's initTransactions aborts it
          }
        }
        closeQuietly(producer, consumer);
        producer = null;
        consumer = null;
        recreated++;
        Thread.sleep(500);
        continue;
      }
      if (pauseMs > 0) Thread.sleep(pauseMs);
    }
    closeQuietly(producer, consumer);
    log(out, "END", "-", 0, List.of(), "");
    out.close();
    System.out.printf(
        "PROCESS committed=%d aborted=%d unknown=%d recreated=%d%n",
        committed, aborted, unknown, recreated);
  }

  static void closeQuietly(KafkaProducer<String, String> p, KafkaConsumer<String, String> c) {
    try {
      if (p != null) p.close(Duration.ofSeconds(5));
    } catch (Exception ignored) {
      // closing
    }
    try {
      if (c != null) c.close(Duration.ofSeconds(5));
    } catch (Exception ignored) {
      // closing
    }
  }

  static void log(BufferedWriter out, String status, String label, int n, List<String> ids, String err)
      throws Exception {
    out.write(
        System.currentTimeMillis() + "\t" + status + "\t" + label + "\t" + n + "\t"
            + (ids.isEmpty() ? "-" : String.join(",", ids)) + "\t" + err + "\n");
    out.flush();
  }

  // ---------------------------------------------------------------- coordinator

  static void coordinator(String bootstrap, String txnId) throws Exception {
    try (Admin admin = Faults.admin(bootstrap)) {
      try {
        int id =
            admin.describeTransactions(List.of(txnId)).description(txnId).get(10, TimeUnit.SECONDS)
                .coordinatorId();
        System.out.println(id);
        return;
      } catch (Exception e) {
        System.err.println("describeTransactions: " + Faults.errName(e) + "; using the partition leader");
      }
      // The leader of the transactional id's __transaction_state partition.
      TopicDescription d = Faults.describeTopic(admin, "__transaction_state");
      int n = d.partitions().size();
      int part = (txnId.hashCode() & 0x7fffffff) % n;
      for (TopicPartitionInfo p : d.partitions()) {
        if (p.partition() == part && p.leader() != null) {
          System.out.println(p.leader().id());
          return;
        }
      }
    }
    System.exit(1);
  }

  // ---------------------------------------------------------------- check

  record Txn(String status, String label, List<String> ids) {}

  static List<Txn> readLog(Path log) throws Exception {
    List<Txn> out = new ArrayList<>();
    for (String line : Files.readAllLines(log)) {
      String[] f = line.split("\t", -1);
      if (f.length < 5) continue;
      if (!Set.of("COMMITTED", "ABORTED", "UNKNOWN").contains(f[1])) continue;
      out.add(new Txn(f[1], f[2], f[4].equals("-") ? List.of() : List.of(f[4].split(","))));
    }
    return out;
  }

  /** Every record of the topic up to the end offsets of the isolation level. */
  static Map<TopicPartition, List<ConsumerRecord<String, String>>> readAll(
      String bootstrap, String topic, String isolation, Map<TopicPartition, Long> endsOut)
      throws Exception {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
    p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
    p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 5000);
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    Map<TopicPartition, List<ConsumerRecord<String, String>>> out = new TreeMap<>(
        (x, y) -> Integer.compare(x.partition(), y.partition()));
    try (KafkaConsumer<String, String> c = new KafkaConsumer<>(p)) {
      List<TopicPartition> all = new ArrayList<>();
      for (var info : c.partitionsFor(topic, Duration.ofSeconds(30))) {
        all.add(new TopicPartition(topic, info.partition()));
      }
      // Under read_committed the end offset is the last stable offset.
      Map<TopicPartition, Long> ends = c.endOffsets(all, Duration.ofSeconds(30));
      endsOut.putAll(ends);
      c.assign(all);
      c.seekToBeginning(all);
      for (TopicPartition tp : all) out.put(tp, new ArrayList<>());
      long deadline = System.currentTimeMillis() + 90_000;
      Set<TopicPartition> pending = new HashSet<>();
      for (TopicPartition tp : all) {
        if (c.position(tp, Duration.ofSeconds(30)) < ends.get(tp)) pending.add(tp);
      }
      while (!pending.isEmpty() && System.currentTimeMillis() < deadline) {
        for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) {
          TopicPartition tp = new TopicPartition(r.topic(), r.partition());
          if (r.offset() < ends.get(tp)) out.get(tp).add(r);
        }
        pending.removeIf(tp -> c.position(tp) >= ends.get(tp));
      }
      if (!pending.isEmpty()) {
        throw new IllegalStateException("could not read " + pending + " of " + topic + " (" + isolation + ") in time");
      }
    }
    return out;
  }

  static final class Report {
    long txnCommitted, txnAborted, txnUnknown, inputsCommitted;
    long outCommitted, outUncommitted, lsoBehind;
    long lostCommitted, abortedRead, torn, duplicates, offsetsWithoutOutput, unlogged;
    final List<String> examples = new ArrayList<>();

    void example(String s) {
      if (examples.size() < 40) examples.add(s);
    }

    boolean clean() {
      return lostCommitted == 0 && abortedRead == 0 && torn == 0 && duplicates == 0
          && offsetsWithoutOutput == 0 && unlogged == 0;
    }

    String summary() {
      return String.format(
          "TXNCHECK %s txn_committed=%d txn_aborted=%d txn_unknown=%d inputs_committed=%d"
              + " out_committed=%d out_uncommitted=%d lost_committed=%d aborted_read=%d torn=%d"
              + " duplicates=%d offsets_without_output=%d unlogged=%d lso_behind=%d",
          clean() ? "PASS" : "FAIL", txnCommitted, txnAborted, txnUnknown, inputsCommitted,
          outCommitted, outUncommitted, lostCommitted, abortedRead, torn, duplicates,
          offsetsWithoutOutput, unlogged, lsoBehind);
    }
  }

  /**
   * visible: the read_committed output values "&lt;id&gt; &lt;label&gt;"; inputs: per input
   * partition the input ids in offset order (offset = index, the seed writes no transactions);
   * committedOffsets: the group's offsets per input partition.
   */
  static Report analyze(
      List<Txn> txns, List<String> visible, Map<Integer, List<String>> inputs,
      Map<Integer, Long> committedOffsets) {
    Report r = new Report();
    Map<String, Txn> byLabel = new HashMap<>();
    for (Txn t : txns) {
      byLabel.put(t.label(), t);
      switch (t.status()) {
        case "COMMITTED" -> r.txnCommitted++;
        case "ABORTED" -> r.txnAborted++;
        default -> r.txnUnknown++;
      }
    }
    Map<String, Set<String>> seenByLabel = new HashMap<>();
    Map<String, List<String>> labelsById = new HashMap<>();
    for (String v : visible) {
      r.outCommitted++;
      int sp = v.indexOf(' ');
      String id = sp < 0 ? v : v.substring(0, sp);
      String label = sp < 0 ? "?" : v.substring(sp + 1);
      seenByLabel.computeIfAbsent(label, x -> new HashSet<>()).add(id);
      labelsById.computeIfAbsent(id, x -> new ArrayList<>()).add(label);
      Txn t = byLabel.get(label);
      if (t == null) {
        r.unlogged++;
        r.example("unlogged: " + v + " is visible but no transaction " + label + " was logged");
      } else if (t.status().equals("ABORTED")) {
        r.abortedRead++;
        r.example("aborted read: " + v + " visible, transaction " + label + " was aborted");
      }
    }
    for (Map.Entry<String, List<String>> e : labelsById.entrySet()) {
      if (e.getValue().size() > 1) {
        r.duplicates += e.getValue().size() - 1;
        r.example("duplicate: input " + e.getKey() + " output by " + e.getValue());
      }
    }
    for (Txn t : txns) {
      Set<String> seen = seenByLabel.getOrDefault(t.label(), Set.of());
      int missing = 0;
      for (String id : t.ids()) {
        if (!seen.contains(id)) missing++;
      }
      if (t.status().equals("COMMITTED") && missing > 0) {
        r.lostCommitted += missing;
        r.example("lost committed: transaction " + t.label() + " (" + t.ids().size() + " records) has " + missing + " not visible");
      }
      if (!seen.isEmpty() && missing > 0) {
        r.torn++;
        r.example("torn: transaction " + t.label() + " (" + t.status() + ") shows " + seen.size() + " of " + t.ids().size());
      }
    }
    for (Map.Entry<Integer, List<String>> e : inputs.entrySet()) {
      long off = committedOffsets.getOrDefault(e.getKey(), 0L);
      for (int i = 0; i < off && i < e.getValue().size(); i++) {
        r.inputsCommitted++;
        String id = e.getValue().get(i);
        if (!labelsById.containsKey(id)) {
          r.offsetsWithoutOutput++;
          r.example("offset without output: input " + id + " at " + e.getKey() + "/" + i + " below the committed offset " + off);
        }
      }
    }
    return r;
  }

  static int check(String bootstrap, String topicA, String topicB, String group, Path log)
      throws Exception {
    List<Txn> txns = readLog(log);
    Map<TopicPartition, Long> lso = new HashMap<>();
    Map<TopicPartition, Long> hw = new HashMap<>();
    List<String> visible = new ArrayList<>();
    for (var l : readAll(bootstrap, topicB, "read_committed", lso).values()) {
      for (var r : l) visible.add(r.value());
    }
    long uncommitted = 0;
    for (var l : readAll(bootstrap, topicB, "read_uncommitted", hw).values()) {
      uncommitted += l.size();
    }
    Map<Integer, List<String>> inputs = new TreeMap<>();
    for (var e : readAll(bootstrap, topicA, "read_uncommitted", new HashMap<>()).entrySet()) {
      List<String> ids = new ArrayList<>();
      long expect = 0;
      for (var r : e.getValue()) {
        if (r.offset() != expect) throw new IllegalStateException("input offsets not dense at " + e.getKey());
        ids.add(r.value());
        expect++;
      }
      inputs.put(e.getKey().partition(), ids);
    }
    Map<Integer, Long> committedOffsets = new HashMap<>();
    try (Admin admin = Faults.admin(bootstrap)) {
      for (var e : admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata()
          .get(30, TimeUnit.SECONDS).entrySet()) {
        if (e.getValue() != null && e.getKey().topic().equals(topicA)) {
          committedOffsets.put(e.getKey().partition(), e.getValue().offset());
        }
      }
    }
    Report r = analyze(txns, visible, inputs, committedOffsets);
    r.outUncommitted = uncommitted;
    for (var e : hw.entrySet()) {
      if (lso.getOrDefault(e.getKey(), 0L) < e.getValue()) r.lsoBehind++;
    }
    System.out.println(r.summary());
    for (String ex : r.examples) System.err.println("  " + ex);
    return r.clean() ? 0 : 1;
  }
}
