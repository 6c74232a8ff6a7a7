package compat;

import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.errors.ClusterAuthorizationException;
import org.apache.kafka.common.errors.CorruptRecordException;
import org.apache.kafka.common.InvalidRecordException;
import org.apache.kafka.common.errors.InvalidRequiredAcksException;
import org.apache.kafka.common.errors.InvalidTopicException;
import org.apache.kafka.common.errors.NotEnoughReplicasException;
import org.apache.kafka.common.errors.RecordBatchTooLargeException;
import org.apache.kafka.common.errors.RecordTooLargeException;
import org.apache.kafka.common.errors.TopicAuthorizationException;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.UnsupportedVersionException;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The fault-test client: Faults &lt;subcommand&gt; args... (usage() lists them). The produce
 * subcommand writes "&lt;writer&gt;-&lt;seq&gt;" values with a default idempotent producer and logs
 * every outcome; check reads the topic back and compares it with those logs. See
 * compat-tests/faults/README.md for what counts as acked, lost, duplicated and so on.
 *
 * <p>Outcome log format, one tab-separated line per event: {@code <ms> ACKED <p> <offset>
 * <value>}, {@code <ms> FAILED <p> -1 <value> <error>}, {@code <ms> INDETERMINATE <p> -1
 * <value> <error>}, and once a second {@code <ms> RATE <second> <acks in that second>}.
 */
public final class Faults {
  private Faults() {}

  static final String ACKED = "ACKED";
  static final String FAILED = "FAILED";
  static final String INDETERMINATE = "INDETERMINATE";

  static void usage() {
    System.err.println(
        String.join(
            "\n",
            "usage: Faults <subcommand> args...",
            "  wait-brokers <bootstrap> <n> <timeout-s>       until a metadata request lists n brokers",
            "  create-topic <bootstrap> <topic> <partitions> <rf> <min-isr> <timeout-s>",
            "                                                  retries until created; prints elapsed ms",
            "  describe <bootstrap> <topic>                    lines: partition leader isr replicas",
            "  controller <bootstrap>                          the active controller's id (DescribeQuorum;",
            "                                                  DescribeCluster's when unsupported)",
            "  await-isr <bootstrap> <topic> <full|shrunk:<id>|leaders> <timeout-s>",
            "                                                  prints elapsed ms, exit 1 on timeout",
            "  produce <bootstrap> <topic> <writer> <duration-s> <rate> <log> [stop-file]",
            "  probe <bootstrap> <topic> <partition> <timeout-ms>  one acks=all send without retries;",
            "                                                  prints OK or the error's name",
            "  check <bootstrap> <topic> [--partial] [--resume-from <ms>] [--json <file>] <log>...",
            "  selftest                                        the checker on hand-made logs"));
    System.exit(2);
  }

  public static void main(String[] args) throws Exception {
    if (args.length < 1) {
      usage();
    }
    String[] a = java.util.Arrays.copyOfRange(args, 1, args.length);
    switch (args[0]) {
      case "wait-brokers" -> need(a, 3, () -> waitBrokers(a[0], Integer.parseInt(a[1]), secs(a[2])));
      case "create-topic" ->
          need(
              a,
              6,
              () ->
                  createTopic(
                      a[0],
                      a[1],
                      Integer.parseInt(a[2]),
                      Short.parseShort(a[3]),
                      a[4],
                      secs(a[5])));
      case "describe" -> need(a, 2, () -> describe(a[0], a[1]));
      case "controller" -> need(a, 1, () -> controller(a[0]));
      case "await-isr" -> need(a, 4, () -> awaitIsr(a[0], a[1], a[2], secs(a[3])));
      case "produce" -> {
        if (a.length != 6 && a.length != 7) {
          usage();
        }
        produce(
            a[0],
            a[1],
            a[2],
            secs(a[3]),
            Double.parseDouble(a[4]),
            Path.of(a[5]),
            a.length == 7 ? Path.of(a[6]) : null);
      }
      case "probe" ->
          need(a, 4, () -> probe(a[0], a[1], Integer.parseInt(a[2]), Integer.parseInt(a[3])));
      case "check" -> {
        if (a.length < 3) {
          usage();
        }
        System.exit(check(a));
      }
      case "selftest" -> System.exit(selftest());
      default -> usage();
    }
  }

  interface Body {
    void run() throws Exception;
  }

  static void need(String[] a, int n, Body body) throws Exception {
    if (a.length != n) {
      usage();
    }
    body.run();
  }

  static long secs(String s) {
    return (long) (Double.parseDouble(s) * 1000);
  }

  static Admin admin(String bootstrap) {
    Properties p = new Properties();
    p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, 5_000);
    p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, 10_000);
    p.put(AdminClientConfig.RETRY_BACKOFF_MS_CONFIG, 200);
    return Admin.create(p);
  }

  static String errName(Throwable t) {
    while (t instanceof ExecutionException && t.getCause() != null) {
      t = t.getCause();
    }
    return t.getClass().getSimpleName();
  }

  // ---------------------------------------------------------------- admin helpers

  static void waitBrokers(String bootstrap, int n, long timeoutMs) throws Exception {
    long deadline = System.currentTimeMillis() + timeoutMs;
    String last = "no answer";
    try (Admin admin = admin(bootstrap)) {
      while (System.currentTimeMillis() < deadline) {
        try {
          int got = admin.describeCluster().nodes().get(5, TimeUnit.SECONDS).size();
          if (got == n) {
            System.out.println(n);
            return;
          }
          last = got + " brokers";
        } catch (Exception e) {
          last = errName(e);
        }
        Thread.sleep(300);
      }
    }
    System.err.println("wait-brokers: not " + n + " brokers within " + timeoutMs + " ms: " + last);
    System.exit(1);
  }

  static void createTopic(
      String bootstrap, String topic, int partitions, short rf, String minIsr, long timeoutMs)
      throws Exception {
    long start = System.currentTimeMillis();
    long deadline = start + timeoutMs;
    String last = "no answer";
    try (Admin admin = admin(bootstrap)) {
      while (System.currentTimeMillis() < deadline) {
        try {
          admin
              .createTopics(
                  List.of(
                      new NewTopic(topic, partitions, rf)
                          .configs(Map.of("min.insync.replicas", minIsr))))
              .all()
              .get(10, TimeUnit.SECONDS);
          System.out.println(System.currentTimeMillis() - start);
          return;
        } catch (ExecutionException e) {
          if (e.getCause() instanceof TopicExistsException) {
            // An earlier attempt that timed out on our side may have succeeded.
            System.out.println(System.currentTimeMillis() - start);
            return;
          }
          last = errName(e) + ": " + e.getCause().getMessage();
        } catch (java.util.concurrent.TimeoutException e) {
          last = "TimeoutException";
        }
        Thread.sleep(300);
      }
    }
    System.err.println("create-topic " + topic + " failed within " + timeoutMs + " ms: " + last);
    System.exit(1);
  }

  static TopicDescription describeTopic(Admin admin, String topic) throws Exception {
    return admin.describeTopics(List.of(topic)).allTopicNames().get(10, TimeUnit.SECONDS).get(topic);
  }

  static String ids(List<Node> nodes) {
    if (nodes.isEmpty()) {
      return "-";
    }
    StringBuilder sb = new StringBuilder();
    for (Node n : nodes) {
      if (sb.length() > 0) {
        sb.append(',');
      }
      sb.append(n.id());
    }
    return sb.toString();
  }

  static void describe(String bootstrap, String topic) throws Exception {
    try (Admin admin = admin(bootstrap)) {
      for (TopicPartitionInfo p : describeTopic(admin, topic).partitions()) {
        int leader = p.leader() == null || p.leader().isEmpty() ? -1 : p.leader().id();
        System.out.println(p.partition() + " " + leader + " " + ids(p.isr()) + " " + ids(p.replicas()));
      }
    }
  }

  static void controller(String bootstrap) throws Exception {
    long deadline = System.currentTimeMillis() + 20_000;
    String last = "no answer";
    while (System.currentTimeMillis() < deadline) {
      // A fresh client each try: one that first met a node cut off from the quorum keeps
      // asking that node.
      try (Admin admin = admin(bootstrap)) {
        try {
          System.out.println(
              admin.describeMetadataQuorum().quorumInfo().get(5, TimeUnit.SECONDS).leaderId());
        } catch (ExecutionException e) {
          if (!(e.getCause() instanceof UnsupportedVersionException)) {
            throw e;
          }
          // A broker without DescribeQuorum: the controller id DescribeCluster reports (Kafka
          // itself reports a random broker there, so this fallback is for our broker only).
          Node c = admin.describeCluster().controller().get(5, TimeUnit.SECONDS);
          System.err.println("controller: DescribeQuorum unsupported; DescribeCluster says " + c);
          if (c == null || c.isEmpty()) {
            throw new IllegalStateException("no controller in DescribeCluster");
          }
          System.out.println(c.id());
        }
        return;
      } catch (Exception e) {
        last = errName(e);
      }
      Thread.sleep(300);
    }
    System.err.println("controller: no answer to DescribeQuorum: " + last);
    System.exit(1);
  }

  /**
   * Polls the topic until every partition satisfies the mode: full (ISR = replicas and a
   * leader), shrunk:&lt;id&gt; (no ISR holds id, every partition has a leader other than id), or
   * leaders (every partition has a leader).
   */
  static void awaitIsr(String bootstrap, String topic, String mode, long timeoutMs)
      throws Exception {
    long start = System.currentTimeMillis();
    long deadline = start + timeoutMs;
    String last = "no answer";
    while (System.currentTimeMillis() < deadline) {
      // A fresh client each poll: an isolated node still answers with its stale view, and a
      // client that once chose it would keep asking it.
      try (Admin admin = admin(bootstrap)) {
        boolean ok = true;
        StringBuilder state = new StringBuilder();
        for (TopicPartitionInfo p : describeTopic(admin, topic).partitions()) {
          int leader = p.leader() == null || p.leader().isEmpty() ? -1 : p.leader().id();
          state.append(String.format("[p%d l=%d isr=%s] ", p.partition(), leader, ids(p.isr())));
          boolean good;
          if (mode.equals("full")) {
            good = leader >= 0 && new HashSet<>(p.isr()).equals(new HashSet<>(p.replicas()));
          } else if (mode.equals("leaders")) {
            good = leader >= 0;
          } else if (mode.startsWith("shrunk:")) {
            int id = Integer.parseInt(mode.substring(7));
            good = leader >= 0 && leader != id && p.isr().stream().noneMatch(n -> n.id() == id);
          } else {
            throw new IllegalArgumentException("unknown await-isr mode " + mode);
          }
          ok &= good;
        }
        last = state.toString();
        if (ok) {
          System.out.println(System.currentTimeMillis() - start);
          System.err.println("await-isr " + mode + ": " + last);
          return;
        }
      } catch (IllegalArgumentException e) {
        throw e;
      } catch (Exception e) {
        last = errName(e);
      }
      Thread.sleep(250);
    }
    System.err.println("await-isr " + mode + " not reached within " + timeoutMs + " ms: " + last);
    System.exit(1);
  }

  // ---------------------------------------------------------------- produce

  /** Errors after which the broker certainly did not append the record. */
  static boolean definite(Throwable t) {
    return t instanceof NotEnoughReplicasException // checked before the append, unlike ..AfterAppend
        || t instanceof RecordTooLargeException
        || t instanceof RecordBatchTooLargeException
        || t instanceof InvalidTopicException
        || t instanceof TopicAuthorizationException
        || t instanceof ClusterAuthorizationException
        || t instanceof InvalidRecordException
        || t instanceof CorruptRecordException
        || t instanceof InvalidRequiredAcksException;
  }

  static void produce(
      String bootstrap,
      String topic,
      String writer,
      long durationMs,
      double rate,
      Path logPath,
      Path stopFile)
      throws Exception {
    Properties p = new Properties();
    // Default configuration on purpose (acks=all, enable.idempotence=true in 4.x); both are
    // spelled out so that a changed default cannot silently weaken the test.
    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ProducerConfig.ACKS_CONFIG, "all");
    p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    String deliveryTimeout = System.getenv("FAULTS_DELIVERY_TIMEOUT_MS");
    if (deliveryTimeout != null && !deliveryTimeout.isEmpty()) {
      p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, Integer.parseInt(deliveryTimeout));
    }
    BufferedWriter out = Files.newBufferedWriter(logPath, StandardCharsets.UTF_8);
    Object lock = new Object();
    AtomicLong acksThisSecond = new AtomicLong();
    AtomicLong acked = new AtomicLong();
    AtomicLong failed = new AtomicLong();
    AtomicLong indeterminate = new AtomicLong();
    long start = System.currentTimeMillis();
    Thread ticker =
        new Thread(
            () -> {
              long second = 0;
              try {
                while (true) {
                  Thread.sleep(Math.max(0, start + (second + 1) * 1000 - System.currentTimeMillis()));
                  second++;
                  long n = acksThisSecond.getAndSet(0);
                  synchronized (lock) {
                    out.write(System.currentTimeMillis() + "\tRATE\t" + second + "\t" + n + "\n");
                    out.flush();
                  }
                  System.out.println("t=" + second + "s acks/s=" + n);
                }
              } catch (InterruptedException | IOException e) {
                // stopped
              }
            });
    ticker.setDaemon(true);
    ticker.start();
    long sent = 0;
    try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
      int partitions = producer.partitionsFor(topic).size();
      long end = start + durationMs;
      for (long seq = 0; ; seq++) {
        long now = System.currentTimeMillis();
        if (now >= end || (stopFile != null && Files.exists(stopFile))) {
          break;
        }
        long due = start + (long) (seq * 1000 / rate);
        if (due > now) {
          Thread.sleep(due - now);
        }
        int partition = (int) (seq % partitions);
        String value = writer + "-" + seq;
        producer.send(
            new ProducerRecord<>(topic, partition, null, value),
            (RecordMetadata md, Exception e) -> {
              String line;
              long t = System.currentTimeMillis();
              if (e == null) {
                acked.incrementAndGet();
                acksThisSecond.incrementAndGet();
                line = t + "\t" + ACKED + "\t" + md.partition() + "\t" + md.offset() + "\t" + value;
              } else if (definite(e)) {
                failed.incrementAndGet();
                line = t + "\t" + FAILED + "\t" + partition + "\t-1\t" + value + "\t" + errName(e);
              } else {
                indeterminate.incrementAndGet();
                line =
                    t + "\t" + INDETERMINATE + "\t" + partition + "\t-1\t" + value + "\t" + errName(e);
              }
              synchronized (lock) {
                try {
                  out.write(line + "\n");
                } catch (IOException io) {
                  throw new RuntimeException(io);
                }
              }
            });
        sent++;
      }
      // Give outstanding sends a bounded time; close() then fails what is left
      // ("closed forcefully"), which the callback logs as indeterminate.
      long closeS = Long.parseLong(System.getenv().getOrDefault("FAULTS_CLOSE_TIMEOUT_S", "30"));
      producer.close(Duration.ofSeconds(closeS));
    } finally {
      ticker.interrupt();
      synchronized (lock) {
        out.flush();
        out.close();
      }
    }
    System.out.printf(
        "PRODUCE sent=%d acked=%d failed=%d indeterminate=%d%n",
        sent, acked.get(), failed.get(), indeterminate.get());
  }

  static void probe(String bootstrap, String topic, int partition, int timeoutMs) throws Exception {
    Properties p = new Properties();
    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ProducerConfig.ACKS_CONFIG, "all");
    // One attempt, so the broker's own error surfaces instead of a delivery timeout.
    p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, false);
    p.put(ProducerConfig.RETRIES_CONFIG, 0);
    p.put(ProducerConfig.LINGER_MS_CONFIG, 0);
    p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, timeoutMs);
    p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, timeoutMs);
    p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, timeoutMs);
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
      try {
        producer
            .send(new ProducerRecord<>(topic, partition, null, "probe-" + System.nanoTime()))
            .get(timeoutMs + 5_000L, TimeUnit.MILLISECONDS);
        System.out.println("OK");
      } catch (ExecutionException e) {
        System.out.println(errName(e));
      } catch (java.util.concurrent.TimeoutException e) {
        System.out.println("TimeoutException");
      }
      producer.close(Duration.ofSeconds(1));
    }
  }

  // ---------------------------------------------------------------- check

  record Outcome(long ms, String status, int partition, long offset, String value, String error) {}

  record Stored(int partition, long offset, String value) {}

  static List<Outcome> readLog(Path path) throws IOException {
    List<Outcome> out = new ArrayList<>();
    try (BufferedReader r = Files.newBufferedReader(path, StandardCharsets.UTF_8)) {
      String line;
      while ((line = r.readLine()) != null) {
        String[] f = line.split("\t");
        if (f.length < 5 || f[1].equals("RATE")) {
          continue;
        }
        out.add(
            new Outcome(
                Long.parseLong(f[0]),
                f[1],
                Integer.parseInt(f[2]),
                Long.parseLong(f[3]),
                f[4],
                f.length > 5 ? f[5] : ""));
      }
    }
    return out;
  }

  /** The figures of one check; analyze() is pure so that selftest can drive it. */
  static final class Report {
    long acked;
    long lost;
    long duplicated;
    long reordered;
    long conflicts;
    long failed;
    long failedPresent;
    long indeterminate;
    long indeterminatePresent;
    long unchecked;
    long stored;
    long resumeMs = -1;
    List<Integer> unreadable = new ArrayList<>();
    Map<String, Long> errors = new TreeMap<>();
    List<String> examples = new ArrayList<>();

    boolean clean() {
      return lost == 0 && duplicated == 0 && reordered == 0 && conflicts == 0 && failedPresent == 0;
    }

    void example(String s) {
      if (examples.size() < 10) {
        examples.add(s);
      }
    }

    String summary() {
      return String.format(
          "CHECK %s acked=%d lost=%d duplicated=%d reordered=%d conflicts=%d failed=%d"
              + " failed_present=%d indeterminate=%d indeterminate_present=%d unchecked=%d"
              + " stored=%d unreadable=%s resume_ms=%d",
          clean() ? "PASS" : "FAIL",
          acked,
          lost,
          duplicated,
          reordered,
          conflicts,
          failed,
          failedPresent,
          indeterminate,
          indeterminatePresent,
          unchecked,
          stored,
          unreadable.toString().replace(" ", ""),
          resumeMs);
    }

    String json() {
      StringBuilder e = new StringBuilder("{");
      errors.forEach((k, v) -> e.append(e.length() > 1 ? "," : "").append(q(k)).append(':').append(v));
      e.append('}');
      StringBuilder ex = new StringBuilder("[");
      for (String s : examples) {
        ex.append(ex.length() > 1 ? "," : "").append(q(s));
      }
      ex.append(']');
      return String.format(
          "{\"verdict\":%s,\"acked\":%d,\"lost\":%d,\"duplicated\":%d,\"reordered\":%d,"
              + "\"conflicts\":%d,\"failed\":%d,\"failed_present\":%d,\"indeterminate\":%d,"
              + "\"indeterminate_present\":%d,\"unchecked\":%d,\"stored\":%d,\"unreadable\":%s,"
              + "\"resume_ms\":%d,\"errors\":%s,\"examples\":%s}",
          q(clean() ? "PASS" : "FAIL"),
          acked,
          lost,
          duplicated,
          reordered,
          conflicts,
          failed,
          failedPresent,
          indeterminate,
          indeterminatePresent,
          unchecked,
          stored,
          unreadable,
          resumeMs,
          e,
          ex);
    }

    static String q(String s) {
      return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }
  }

  /**
   * Compares outcome logs with what the topic holds. stored: every record read, per partition
   * in offset order; readable: the partitions read completely (an acked write to any other
   * partition is counted unchecked); resumeFrom: when not null, the longest time without an ack
   * on any one partition after that instant (a partition with no ack after it counts until its
   * last logged event).
   */
  static Report analyze(
      List<Outcome> outcomes,
      Map<Integer, List<Stored>> stored,
      Set<Integer> readable,
      Long resumeFrom) {
    Report r = new Report();
    Set<String> writers = new HashSet<>();
    for (Outcome o : outcomes) {
      writers.add(writerOf(o.value()));
    }
    // Where each value is stored, and the value at each (partition, offset).
    Map<String, List<Stored>> where = new HashMap<>();
    Map<Integer, Map<Long, String>> at = new HashMap<>();
    for (Map.Entry<Integer, List<Stored>> e : stored.entrySet()) {
      Map<Long, String> byOffset = new HashMap<>();
      at.put(e.getKey(), byOffset);
      Map<String, Long> lastSeq = new HashMap<>();
      for (Stored s : e.getValue()) {
        byOffset.put(s.offset(), s.value());
        String w = writerOf(s.value());
        if (!writers.contains(w)) {
          continue; // a probe or another test's record
        }
        r.stored++;
        where.computeIfAbsent(s.value(), k -> new ArrayList<>()).add(s);
        long seq = seqOf(s.value());
        Long prev = lastSeq.get(w);
        if (prev != null && seq < prev) {
          r.reordered++;
          r.example("reordered " + s.value() + " at " + s.partition() + "/" + s.offset() + " after seq " + prev);
        }
        lastSeq.put(w, Math.max(seq, prev == null ? Long.MIN_VALUE : prev));
      }
    }
    for (Map.Entry<String, List<Stored>> e : where.entrySet()) {
      if (e.getValue().size() > 1) {
        r.duplicated++;
        r.example("duplicated " + e.getKey() + " at " + e.getValue());
      }
    }
    Map<Integer, List<Long>> ackTimes = new TreeMap<>();
    Map<Integer, Long> lastEvent = new HashMap<>();
    for (Outcome o : outcomes) {
      lastEvent.merge(o.partition(), o.ms(), Math::max);
      if (!o.error().isEmpty()) {
        r.errors.merge(o.status() + ":" + o.error(), 1L, Long::sum);
      }
      boolean checkable = readable.contains(o.partition());
      boolean present = where.containsKey(o.value());
      switch (o.status()) {
        case ACKED -> {
          r.acked++;
          ackTimes.computeIfAbsent(o.partition(), k -> new ArrayList<>()).add(o.ms());
          if (!checkable) {
            r.unchecked++;
          } else if (!present) {
            r.lost++;
            r.example("lost " + o.value() + " acked at " + o.partition() + "/" + o.offset());
          } else {
            String there = at.getOrDefault(o.partition(), Map.of()).get(o.offset());
            if (!o.value().equals(there)) {
              r.conflicts++;
              r.example("conflict: " + o.value() + " acked at " + o.partition() + "/" + o.offset() + " which holds " + there);
            }
          }
        }
        case FAILED -> {
          r.failed++;
          if (present) {
            r.failedPresent++;
            r.example("failed (" + o.error() + ") but present: " + o.value());
          }
        }
        default -> {
          r.indeterminate++;
          if (present) {
            r.indeterminatePresent++;
          }
        }
      }
    }
    if (resumeFrom != null) {
      long worst = 0;
      for (Map.Entry<Integer, Long> e : lastEvent.entrySet()) {
        List<Long> times = ackTimes.getOrDefault(e.getKey(), List.of());
        Collections.sort(times);
        long prev = resumeFrom;
        boolean after = false;
        for (long t : times) {
          if (t > resumeFrom) {
            worst = Math.max(worst, t - prev);
            after = true;
          }
          prev = Math.max(prev, t);
        }
        if (!after) {
          worst = Math.max(worst, Math.max(0, e.getValue() - resumeFrom));
        }
      }
      r.resumeMs = worst;
    }
    return r;
  }

  static String writerOf(String value) {
    int i = value.lastIndexOf('-');
    return i < 0 ? value : value.substring(0, i);
  }

  static long seqOf(String value) {
    try {
      return Long.parseLong(value.substring(value.lastIndexOf('-') + 1));
    } catch (NumberFormatException e) {
      return -1;
    }
  }

  static int check(String[] a) throws Exception {
    String bootstrap = a[0];
    String topic = a[1];
    boolean partial = false;
    Long resumeFrom = null;
    Path json = null;
    List<Path> logs = new ArrayList<>();
    for (int i = 2; i < a.length; i++) {
      switch (a[i]) {
        case "--partial" -> partial = true;
        case "--resume-from" -> resumeFrom = Long.parseLong(a[++i]);
        case "--json" -> json = Path.of(a[++i]);
        default -> logs.add(Path.of(a[i]));
      }
    }
    List<Outcome> outcomes = new ArrayList<>();
    for (Path log : logs) {
      outcomes.addAll(readLog(log));
    }
    long readTimeoutMs = Long.parseLong(System.getenv().getOrDefault("FAULTS_READ_TIMEOUT_S", "60")) * 1000;
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
    p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 5000);
    Map<Integer, List<Stored>> stored = new TreeMap<>();
    Set<Integer> readable = new HashSet<>();
    List<Integer> unreadable = new ArrayList<>();
    try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(p)) {
      List<TopicPartition> all = new ArrayList<>();
      for (PartitionInfo info : consumer.partitionsFor(topic, Duration.ofSeconds(30))) {
        all.add(new TopicPartition(topic, info.partition()));
      }
      // End offsets one partition at a time: in --partial mode a partition without a
      // reachable leader is reported unreadable instead of failing the whole check.
      Map<TopicPartition, Long> ends = new LinkedHashMap<>();
      for (TopicPartition tp : all) {
        try {
          Duration t = Duration.ofSeconds(partial ? 5 : 30);
          ends.put(tp, consumer.endOffsets(List.of(tp), t).get(tp));
        } catch (org.apache.kafka.common.errors.TimeoutException e) {
          if (!partial) {
            throw e;
          }
          unreadable.add(tp.partition());
        }
      }
      List<TopicPartition> todo = new ArrayList<>(ends.keySet());
      consumer.assign(todo);
      consumer.seekToBeginning(todo);
      for (TopicPartition tp : todo) {
        stored.put(tp.partition(), new ArrayList<>());
      }
      long deadline = System.currentTimeMillis() + readTimeoutMs;
      Set<TopicPartition> pending = new HashSet<>();
      for (TopicPartition tp : todo) {
        if (consumer.position(tp, Duration.ofSeconds(30)) < ends.get(tp)) {
          pending.add(tp);
        }
      }
      while (!pending.isEmpty() && System.currentTimeMillis() < deadline) {
        for (ConsumerRecord<String, String> rec : consumer.poll(Duration.ofMillis(500))) {
          TopicPartition tp = new TopicPartition(rec.topic(), rec.partition());
          if (rec.offset() < ends.get(tp)) {
            stored.get(rec.partition()).add(new Stored(rec.partition(), rec.offset(), rec.value()));
          }
        }
        pending.removeIf(tp -> consumer.position(tp) >= ends.get(tp));
      }
      for (TopicPartition tp : todo) {
        if (pending.contains(tp)) {
          if (!partial) {
            throw new IllegalStateException("could not read " + tp + " to " + ends.get(tp) + " in time");
          }
          unreadable.add(tp.partition());
          stored.remove(tp.partition());
        } else {
          readable.add(tp.partition());
        }
      }
    }
    Report r = analyze(outcomes, stored, readable, resumeFrom);
    Collections.sort(unreadable);
    r.unreadable = unreadable;
    System.out.println(r.summary());
    System.out.println("JSON " + r.json());
    for (String ex : r.examples) {
      System.err.println("  " + ex);
    }
    if (json != null) {
      Files.writeString(json, r.json() + "\n");
    }
    return r.clean() ? 0 : 1;
  }

  // ---------------------------------------------------------------- selftest

  static int selftest() {
    int failures = 0;
    // Writer w: seq 0..5 on partitions 0/1. Stored log has a loss (w-4 acked at 1/2, absent),
    // a duplicate (w-2 twice), a reorder (w-5 before w-3 in partition 1), a conflict (w-0 acked
    // at 0/0 but 0/0 holds probe-1), a definite failure that is present (w-6), an indeterminate
    // write that landed (w-7) and one that did not (w-8).
    List<Outcome> log =
        List.of(
            new Outcome(1000, ACKED, 0, 0, "w-0", ""),
            new Outcome(1010, ACKED, 1, 0, "w-1", ""),
            new Outcome(1020, ACKED, 0, 2, "w-2", ""),
            new Outcome(1030, ACKED, 1, 2, "w-3", ""),
            new Outcome(1040, ACKED, 1, 3, "w-4", ""),
            new Outcome(5000, ACKED, 1, 1, "w-5", ""),
            new Outcome(5010, FAILED, 0, -1, "w-6", "NotEnoughReplicasException"),
            new Outcome(5020, INDETERMINATE, 0, -1, "w-7", "TimeoutException"),
            new Outcome(5030, INDETERMINATE, 0, -1, "w-8", "TimeoutException"),
            new Outcome(6000, ACKED, 2, 0, "w-9", ""));
    Map<Integer, List<Stored>> stored = new TreeMap<>();
    stored.put(
        0,
        List.of(
            new Stored(0, 0, "probe-1"),
            new Stored(0, 1, "w-0"),
            new Stored(0, 2, "w-2"),
            new Stored(0, 3, "w-6"),
            new Stored(0, 4, "w-7")));
    stored.put(
        1,
        List.of(
            new Stored(1, 0, "w-1"),
            new Stored(1, 1, "w-5"),
            new Stored(1, 2, "w-3"),
            new Stored(1, 3, "w-2")));
    Report r = analyze(log, stored, Set.of(0, 1), 1100L);
    failures += expect("acked", r.acked, 7);
    failures += expect("lost", r.lost, 1);
    failures += expect("duplicated", r.duplicated, 1);
    // w-3 after w-5 in partition 1, and w-2 after w-5 too.
    failures += expect("reordered", r.reordered, 2);
    // w-0 (at 0/1, acked 0/0) and w-5 is at 1/1 as acked; w-2 acked 0/2 holds w-2: one conflict.
    failures += expect("conflicts", r.conflicts, 1);
    failures += expect("failed", r.failed, 1);
    failures += expect("failed_present", r.failedPresent, 1);
    failures += expect("indeterminate", r.indeterminate, 2);
    failures += expect("indeterminate_present", r.indeterminatePresent, 1);
    failures += expect("unchecked (partition 2 unreadable)", r.unchecked, 1);
    // Gaps are counted from the fault (1100) on. Partition 1: next ack at 5000 -> 3900.
    // Partition 0: no ack after 1100, events until 5030 -> 3930. Partition 2: 6000 -> 4900.
    failures += expect("resume_ms", r.resumeMs, 4900);
    failures += expect("verdict clean", r.clean() ? 1 : 0, 0);

    Report ok =
        analyze(
            List.of(new Outcome(1, ACKED, 0, 0, "a-0", ""), new Outcome(2, ACKED, 0, 1, "a-1", "")),
            Map.of(0, List.of(new Stored(0, 0, "a-0"), new Stored(0, 1, "a-1"))),
            Set.of(0),
            null);
    failures += expect("clean log verdict", ok.clean() ? 1 : 0, 1);
    failures += expect("clean log resume unset", ok.resumeMs, -1);
    System.out.println(failures == 0 ? "SELFTEST PASS" : "SELFTEST FAIL " + failures);
    return failures == 0 ? 0 : 1;
  }

  static int expect(String what, long got, long want) {
    if (got != want) {
      System.out.println("selftest: " + what + ": got " + got + ", want " + want);
      return 1;
    }
    return 0;
  }
}
