package compat;

import java.io.File;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.LongDeserializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;

/**
 * streams.eos (issue 30): a Kafka Streams word count with processing.guarantee=exactly_once_v2.
 * Sentences go to a 3-partition input topic; the topology splits them into words, groups by word
 * (a repartition topic) and counts (a state store with a changelog topic); the counts go to a
 * 3-partition output topic. The record cache is off (statestore.cache.max.bytes=0), so every input
 * word yields exactly one count update.
 *
 * <p>The first Streams instance runs in a child JVM and is killed with SIGKILL in the middle of
 * the first half of the input (after it has committed some output, while it still has input to
 * process): its open transaction is left to the broker to abort. A second instance with the same
 * application.id takes over (it restores the store from the changelog) and processes the rest.
 * PASS needs, for every word, the counts a read_committed consumer sees on the output to be
 * exactly 1, 2, ..., total: nothing lost, nothing counted twice, nothing from the aborted
 * transaction visible.
 */
final class StreamsScenarios {
  static final List<String> WORDS = List.of("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf");
  static final int SENTENCES = 400;
  static final int PARTITIONS = 3;
  static final int WARMUP = 20;
  static final int KILL_AT = 160;
  static final int PACE = 2;
  static final int BURST = 40;
  /** Bound of each wait: for output progress, for the final counts. */
  static final long WAIT_MS = 25_000;

  private final Scenarios s;

  StreamsScenarios(Scenarios s) {
    this.s = s;
  }

  /** Sentence i: 1 to 4 words of WORDS, a deterministic mix so the counts differ per word. */
  static String sentence(int i) {
    int n = 1 + i % 4;
    List<String> w = new ArrayList<>();
    for (int j = 0; j < n; j++) w.add(WORDS.get((i * 3 + j * (1 + i % 5)) % WORDS.size()));
    return String.join(" ", w);
  }

  static Topology topology(String input, String output) {
    StreamsBuilder builder = new StreamsBuilder();
    builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
        .flatMapValues(v -> Arrays.asList(v.split(" ")))
        .groupBy((k, word) -> word, Grouped.with("words", Serdes.String(), Serdes.String()))
        .count(Materialized.as("counts"))
        .toStream()
        .to(output, Produced.with(Serdes.String(), Serdes.Long()));
    return builder.build();
  }

  static Properties streamsProps(String bootstrap, String appId, String stateDir) {
    Properties p = new Properties();
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
    p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
    p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
    p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
    p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
    // After the kill the dead member holds its partitions until its session expires (the
    // broker's minimum, 6 s), and its open transaction until the transaction timeout aborts it.
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 6000);
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 1000);
    p.put(StreamsConfig.producerPrefix(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG), 5000);
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.MAX_POLL_RECORDS_CONFIG), 20);
    return p;
  }

  /**
   * The child JVM: compat.StreamsScenarios <bootstrap> <appId> <input> <output> <stateDir>. Runs
   * the topology until it is killed; prints RUNNING on stdout once the instance is running.
   */
  public static void main(String[] args) throws Exception {
    Properties p = streamsProps(args[0], args[1], args[4]);
    // Streams' producer lingers 100 ms, so a killed instance's records would mostly die in its
    // buffer; sent at once, its open transaction holds records the broker must then abort.
    p.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), 0);
    KafkaStreams streams = new KafkaStreams(topology(args[2], args[3]), p);
    streams.setStateListener(
        (now, before) -> {
          if (now == KafkaStreams.State.RUNNING) {
            System.out.println("RUNNING");
            System.out.flush();
          }
        });
    streams.start();
    Thread.sleep(Long.MAX_VALUE);
  }

  String eos() throws Exception {
    String input = s.topicName("streams.eos") + "-in";
    String output = s.topicName("streams.eos") + "-out";
    String appId = s.topicName("streams.eos") + "-app";
    Path stateRoot = Files.createTempDirectory("compat-streams-eos");
    Map<String, Long> expected = new TreeMap<>();
    for (int i = 0; i < SENTENCES; i++)
      for (String w : sentence(i).split(" ")) expected.merge(w, 1L, Long::sum);
    long totalWords = expected.values().stream().mapToLong(Long::longValue).sum();

    Map<String, List<Long>> seen = new TreeMap<>();
    long t0 = System.nanoTime();
    String timing;
    try (Admin admin = s.admin()) {
      Scenarios.createTopic(admin, input, PARTITIONS);
      Scenarios.createTopic(admin, output, PARTITIONS);
      Properties pp = s.producerProps();
      pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
      pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
      pp.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
      Properties cp = s.assignConsumerProps();
      cp.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
      cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
      cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, LongDeserializer.class.getName());
      List<TopicPartition> outTps = new ArrayList<>();
      for (int p = 0; p < PARTITIONS; p++) outTps.add(new TopicPartition(output, p));

      try (KafkaProducer<String, String> producer = new KafkaProducer<>(pp);
          KafkaConsumer<String, Long> reader = new KafkaConsumer<>(cp)) {
        reader.assign(outTps);
        reader.seekToBeginning(outTps);
        // Instance 1 in a child JVM. The first WARMUP sentences wait until it commits output; the
        // input then keeps flowing (PACE sentences per poll of the output) and the child is killed
        // when KILL_AT sentences are sent, so it dies with input to process and, most likely, a
        // transaction open (SIGKILL: no close, no abort; the broker aborts it on timeout or fencing).
        Process child = startChild(appId, input, output, stateRoot.resolve("1").toString());
        int next = 0;
        for (; next < WARMUP; next++) producer.send(new ProducerRecord<>(input, "s" + next, sentence(next)));
        producer.flush();
        long killedAt;
        long countsBeforeKill;
        try {
          long deadline = System.currentTimeMillis() + WAIT_MS;
          while (totalSeen(seen) == 0) {
            Scenarios.check(child.isAlive(), "the first Streams instance (child JVM) exited with %s", exitOf(child));
            Scenarios.check(System.currentTimeMillis() < deadline,
                "no committed output from the first Streams instance within %d ms", WAIT_MS);
            poll(reader, seen, 100);
          }
          while (next < KILL_AT) {
            for (int k = 0; k < PACE && next < KILL_AT; k++, next++)
              producer.send(new ProducerRecord<>(input, "s" + next, sentence(next)));
            producer.flush();
            poll(reader, seen, 20);
          }
          // A last burst, and the kill while the child is processing it.
          for (int k = 0; k < BURST; k++, next++) producer.send(new ProducerRecord<>(input, "s" + next, sentence(next)));
          producer.flush();
          poll(reader, seen, 40);
          Scenarios.check(child.isAlive(), "the first Streams instance (child JVM) exited with %s", exitOf(child));
        } finally {
          child.destroyForcibly();
          child.waitFor(10, TimeUnit.SECONDS);
        }
        killedAt = System.nanoTime();
        System.err.printf("streams.eos: first instance killed at %.1f s%n", (killedAt - t0) / 1e9);
        countsBeforeKill = totalSeen(seen);
        for (; next < SENTENCES; next++) producer.send(new ProducerRecord<>(input, "s" + next, sentence(next)));
        producer.flush();

        // Instance 2 in this JVM, same application.id, a fresh state directory (restores from the changelog).
        KafkaStreams streams =
            new KafkaStreams(topology(input, output), streamsProps(s.bootstrap, appId, stateRoot.resolve("2").toString()));
        CountDownLatch failed = new CountDownLatch(1);
        Throwable[] error = new Throwable[1];
        streams.setUncaughtExceptionHandler(
            e -> {
              error[0] = e;
              failed.countDown();
              return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
            });
        try {
          streams.start();
          long deadline = System.currentTimeMillis() + 2 * WAIT_MS;
          while (totalSeen(seen) < totalWords) {
            if (error[0] != null) throw new AssertionError("second Streams instance failed: " + Scenarios.describe(error[0]), error[0]);
            Scenarios.check(System.currentTimeMillis() < deadline,
                "read_committed output stalled at %d of %d count updates %d ms after the restart (instance state %s)",
                totalSeen(seen), totalWords, 2 * WAIT_MS, streams.state());
            poll(reader, seen, 200);
          }
          timing = String.format("restart to full output %.1f s", (System.nanoTime() - killedAt) / 1e9);
          // Anything beyond the expected updates (a duplicate) shows up here.
          for (int k = 0; k < 5; k++) poll(reader, seen, 200);
        } finally {
          streams.close(Duration.ofSeconds(15));
          streams.cleanUp();
        }
        for (Map.Entry<String, Long> e : expected.entrySet()) {
          List<Long> got = seen.getOrDefault(e.getKey(), List.of());
          List<Long> want = new ArrayList<>();
          for (long c = 1; c <= e.getValue(); c++) want.add(c);
          Scenarios.check(got.equals(want), "word %s: read_committed counts %s, expected 1..%d (%d updates)",
              e.getKey(), abbreviate(got), e.getValue(), got.size());
        }
        Scenarios.check(seen.keySet().equals(expected.keySet()), "words seen %s, expected %s", seen.keySet(), expected.keySet());
        long uncommitted = countUncommitted(cp, outTps);
        String detail = String.format(
            "%d sentences, %d words, counts %s; each word's read_committed counts exactly 1..total; "
                + "first instance SIGKILLed after %d committed updates; read_uncommitted sees %d updates "
                + "(%d aborted); %s",
            SENTENCES, totalWords, expected, countsBeforeKill, uncommitted, uncommitted - totalWords, timing);
        cleanup(admin, appId, input, output);
        return detail;
      }
    } finally {
      deleteTree(stateRoot);
      System.err.printf("streams.eos: %.1f s%n", (System.nanoTime() - t0) / 1e9);
    }
  }

  Process startChild(String appId, String input, String output, String stateDir) throws Exception {
    String java = ProcessHandle.current().info().command().orElse("java");
    ProcessBuilder pb = new ProcessBuilder(
        java, "-Xmx256m", "-cp", System.getProperty("java.class.path"), StreamsScenarios.class.getName(),
        s.bootstrap, appId, input, output, stateDir);
    // The child's logs go to our stderr; stdout (RESULT lines only) stays ours.
    pb.redirectError(ProcessBuilder.Redirect.INHERIT);
    pb.redirectOutput(ProcessBuilder.Redirect.DISCARD);
    return pb.start();
  }

  static String exitOf(Process p) {
    return p.isAlive() ? "(running)" : Integer.toString(p.exitValue());
  }

  static void poll(KafkaConsumer<String, Long> reader, Map<String, List<Long>> seen, long ms) {
    for (ConsumerRecord<String, Long> r : reader.poll(Duration.ofMillis(ms)))
      seen.computeIfAbsent(r.key(), k -> new ArrayList<>()).add(r.value());
  }

  /**
   * The output's data records under read_uncommitted (informative: more than the committed ones
   * shows the kill left a transaction that was then aborted).
   */
  static long countUncommitted(Properties cp, List<TopicPartition> tps) {
    Properties p = new Properties();
    p.putAll(cp);
    p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_uncommitted");
    try (KafkaConsumer<String, Long> c = new KafkaConsumer<>(p)) {
      c.assign(tps);
      c.seekToBeginning(tps);
      Map<TopicPartition, Long> end = c.endOffsets(tps);
      long n = 0;
      long deadline = System.currentTimeMillis() + WAIT_MS;
      while (tps.stream().anyMatch(tp -> c.position(tp) < end.get(tp)) && System.currentTimeMillis() < deadline)
        n += c.poll(Duration.ofMillis(200)).count();
      return n;
    }
  }

  static long totalSeen(Map<String, List<Long>> seen) {
    return seen.values().stream().mapToLong(List::size).sum();
  }

  static String abbreviate(List<Long> l) {
    if (l.size() <= 12) return l.toString();
    // Show where it first deviates from 1..n.
    int i = 0;
    while (i < l.size() && l.get(i) == i + 1) i++;
    int from = Math.max(0, i - 3);
    return "[..." + l.subList(from, Math.min(l.size(), i + 6)) + "... first deviation at index " + i + "]";
  }

  /** The topics, and the application's internal topics (repartition, changelog). */
  static void cleanup(Admin admin, String appId, String input, String output) {
    try {
      List<String> internal = admin.listTopics().names().get().stream()
          .filter(t -> t.startsWith(appId + "-")).collect(Collectors.toList());
      for (String t : internal) Scenarios.deleteTopicQuietly(admin, t);
    } catch (Exception e) {
      System.err.println("listing internal topics of " + appId + ": " + Scenarios.describe(e));
    }
    Scenarios.deleteTopicQuietly(admin, input);
    Scenarios.deleteTopicQuietly(admin, output);
  }

  static void deleteTree(Path root) {
    try (Stream<Path> walk = Files.walk(root)) {
      walk.sorted(Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
    } catch (Exception e) {
      // housekeeping only
    }
  }
}
