package compat;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.RecordTooLargeException;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.record.TimestampType;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The Java client's implementation of the compat scenario contract: every scenario id is one
 * check written with the producer, consumer and Admin API of kafka-clients.
 *
 * <p>Usage: Scenarios &lt;bootstrap&gt; [scenario-id ...] (no ids = all, in contract order).
 * Prints exactly one "RESULT &lt;id&gt; PASS|FAIL|NA &lt;detail&gt;" line per scenario on stdout;
 * everything else (client warnings, progress) goes to stderr. Exits 1 iff a scenario failed.
 */
public final class Scenarios {
  static final String FAMILY = "java";
  /** The contract bounds every scenario; a hung one is reported as "timeout" and abandoned. */
  static final long SCENARIO_TIMEOUT_MS = 60_000;
  /** The consumer-group scenarios wait for several rebalances and get the contract's upper bound. */
  static final long GROUP_SCENARIO_TIMEOUT_MS = 90_000;
  /** Client-side bounds, well below the scenario bound so a client error is seen, not a timeout. */
  static final int API_TIMEOUT_MS = 20_000;
  static final int REQUEST_TIMEOUT_MS = 15_000;
  /** How long a consumer may go without new records before the scenario gives up. */
  static final long IDLE_LIMIT_MS = 20_000;

  static final List<String> ALL_IDS =
      List.of(
          "admin.topics",
          "admin.topic_configs",
          "codec.none",
          "codec.gzip",
          "codec.snappy",
          "codec.lz4",
          "codec.zstd",
          "idempotent",
          "group.commit",
          "seek.earliest",
          "seek.latest",
          "seek.timestamp",
          "large.near_max",
          "large.above_max",
          "partitions.many",
          "unknown.autocreate",
          "unknown.noautocreate",
          "group.rebalance.range",
          "group.rebalance.cooperative",
          "group.rebalance.static",
          "group.rebalance.consumer",
          "group.rebalance.time.classic",
          "group.rebalance.time.consumer",
          "txn.commit",
          "txn.abort",
          "txn.fence",
          "txn.offsets",
          "streams.eos",
          "share.implicit",
          "share.release",
          "share.reject",
          "share.lock_expiry",
          "share.members.2",
          "share.members.5",
          "share.delivery_limit",
          "share.dlq",
          "share.renew",
          "share.record_limit");

  /** A scenario either returns its PASS detail or throws; Na marks a check this API cannot express. */
  interface Scenario {
    String run() throws Exception;
  }

  static final class Na extends Exception {
    Na(String why) {
      super(why);
    }
  }

  final String bootstrap;
  /** One suffix per run so reruns never meet topics a broker kept from an earlier run. */
  final String runId;

  Scenarios(String bootstrap) {
    this.bootstrap = bootstrap;
    this.runId =
        Long.toString(System.currentTimeMillis(), 36)
            + Integer.toString(new Random().nextInt(36 * 36 * 36), 36);
  }

  public static void main(String[] args) {
    if (args.length < 1) {
      System.err.println("usage: Scenarios <bootstrap> [scenario-id ...]");
      System.exit(2);
    }
    Scenarios s = new Scenarios(args[0]);
    List<String> ids = args.length > 1 ? Arrays.asList(args).subList(1, args.length) : ALL_IDS;
    boolean anyFailed = false;
    for (String id : ids) {
      anyFailed |= !s.runOne(id);
    }
    System.exit(anyFailed ? 1 : 0);
  }

  /** Runs one scenario under the time bound and prints its RESULT line; false iff it failed. */
  boolean runOne(String id) {
    Scenario scenario = scenario(id);
    if (scenario == null) {
      result(id, "FAIL", "unknown scenario id for the java family");
      return false;
    }
    // A daemon thread per scenario: a client stuck inside a call cannot keep the JVM alive or
    // hold up the scenarios after it.
    ExecutorService executor =
        Executors.newSingleThreadExecutor(
            r -> {
              Thread t = new Thread(r, "scenario-" + id);
              t.setDaemon(true);
              return t;
            });
    long timeoutMs =
        id.startsWith("group.rebalance") || id.startsWith("share.") ? GROUP_SCENARIO_TIMEOUT_MS : SCENARIO_TIMEOUT_MS;
    long startNs = System.nanoTime();
    Future<String> future = executor.submit(scenario::run);
    try {
      String detail = future.get(timeoutMs, TimeUnit.MILLISECONDS);
      result(id, "PASS", String.format("%s (%.1f s)", detail, (System.nanoTime() - startNs) / 1e9));
      return true;
    } catch (TimeoutException e) {
      future.cancel(true);
      result(id, "FAIL", "timeout after " + timeoutMs / 1000 + " s");
      return false;
    } catch (ExecutionException e) {
      if (e.getCause() instanceof Na na) {
        result(id, "NA", na.getMessage());
        return true;
      }
      e.getCause().printStackTrace(System.err);
      result(id, "FAIL", describe(e.getCause()));
      return false;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      result(id, "FAIL", "interrupted");
      return false;
    } finally {
      executor.shutdownNow();
    }
  }

  Scenario scenario(String id) {
    return switch (id) {
      case "admin.topics" -> this::adminTopics;
      case "admin.topic_configs" -> () -> new TopicConfigScenarios(this).all();
      case "codec.none" -> () -> codec("none");
      case "codec.gzip" -> () -> codec("gzip");
      case "codec.snappy" -> () -> codec("snappy");
      case "codec.lz4" -> () -> codec("lz4");
      case "codec.zstd" -> () -> codec("zstd");
      case "idempotent" -> this::idempotent;
      case "group.commit" -> this::groupCommit;
      case "seek.earliest" -> this::seekEarliest;
      case "seek.latest" -> this::seekLatest;
      case "seek.timestamp" -> this::seekTimestamp;
      case "large.near_max" -> this::largeNearMax;
      case "large.above_max" -> this::largeAboveMax;
      case "partitions.many" -> this::partitionsMany;
      case "unknown.autocreate" -> this::unknownAutocreate;
      case "unknown.noautocreate" -> this::unknownNoAutocreate;
      case "group.rebalance.range" -> () -> new GroupScenarios(this).rebalance(GroupScenarios.Variant.RANGE);
      case "group.rebalance.cooperative" -> () -> new GroupScenarios(this).rebalance(GroupScenarios.Variant.COOPERATIVE);
      case "group.rebalance.static" -> () -> new GroupScenarios(this).rebalance(GroupScenarios.Variant.STATIC);
      case "group.rebalance.consumer" -> () -> new GroupScenarios(this).rebalance(GroupScenarios.Variant.CONSUMER);
      case "group.rebalance.time.classic" -> () -> new GroupScenarios(this).rebalanceTime(false);
      case "group.rebalance.time.consumer" -> () -> new GroupScenarios(this).rebalanceTime(true);
      case "txn.commit" -> () -> new TxnScenarios(this).commit();
      case "txn.abort" -> () -> new TxnScenarios(this).abort();
      case "txn.fence" -> () -> new TxnScenarios(this).fence();
      case "txn.offsets" -> () -> new TxnScenarios(this).offsets();
      case "streams.eos" -> () -> new StreamsScenarios(this).eos();
      case "share.implicit" -> () -> new ShareScenarios(this).implicitAck();
      case "share.release" -> () -> new ShareScenarios(this).explicitFirst("share.release", AcknowledgeType.RELEASE);
      case "share.reject" -> () -> new ShareScenarios(this).explicitFirst("share.reject", AcknowledgeType.REJECT);
      case "share.lock_expiry" -> () -> new ShareScenarios(this).lockExpiry();
      case "share.members.2" -> () -> new ShareScenarios(this).members(2);
      case "share.members.5" -> () -> new ShareScenarios(this).members(5);
      case "share.delivery_limit" -> () -> new ShareScenarios(this).deliveryLimit();
      case "share.dlq" -> () -> new ShareScenarios(this).dlq();
      case "share.renew" -> () -> new ShareScenarios(this).renew();
      case "share.record_limit" -> () -> new ShareScenarios(this).recordLimit();
      default -> null;
    };
  }

  static void result(String id, String verdict, String detail) {
    // The contract allows one line per scenario; client messages can span several.
    String oneLine = detail.replaceAll("\\s+", " ").trim();
    System.out.println("RESULT " + id + " " + verdict + " " + oneLine);
    System.out.flush();
  }

  /** The exception chain, outermost first, without the wrappers that add nothing. */
  static String describe(Throwable e) {
    StringBuilder sb = new StringBuilder();
    String previous = null;
    for (Throwable t = e; t != null; t = t.getCause()) {
      if (t instanceof ExecutionException && t.getCause() != null) continue;
      String part = t.getClass().getSimpleName() + ": " + t.getMessage();
      if (t instanceof AssertionError) part = String.valueOf(t.getMessage());
      if (part.equals(previous)) continue;
      if (sb.length() > 0) sb.append(" <- ");
      sb.append(part);
      previous = part;
    }
    return sb.toString();
  }

  // ---------------------------------------------------------------- scenarios

  String adminTopics() throws Exception {
    String topic = topicName("admin.topics");
    try (Admin admin = admin()) {
      NewTopic newTopic =
          new NewTopic(topic, 3, (short) 1).configs(Map.of("retention.ms", "3600000"));
      admin.createTopics(List.of(newTopic)).all().get();

      TopicDescription description = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
      check(
          description.partitions().size() == 3,
          "DescribeTopics: %d partitions, expected 3", description.partitions().size());
      for (var partition : description.partitions()) {
        check(
            partition.leader() != null && !partition.leader().isEmpty() && partition.replicas().size() == 1
                && partition.isr().size() == 1,
            "DescribeTopics: partition %d leader %s replicas %s isr %s",
            partition.partition(), partition.leader(), partition.replicas(), partition.isr());
      }

      ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
      Config config = admin.describeConfigs(List.of(resource)).all().get().get(resource);
      ConfigEntry retention = config.get("retention.ms");
      check(retention != null, "DescribeConfigs: no retention.ms entry");
      check(
          "3600000".equals(retention.value()),
          "DescribeConfigs: retention.ms=%s, expected 3600000", retention.value());
      check(
          retention.source() == ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG,
          "DescribeConfigs: retention.ms source %s, expected DYNAMIC_TOPIC_CONFIG", retention.source());

      check(admin.listTopics().names().get().contains(topic), "ListTopics (Metadata): topic missing");

      admin.deleteTopics(List.of(topic)).all().get();
      // Deletion reaches the metadata every broker serves a moment after DeleteTopics returns.
      long deadlineMs = System.currentTimeMillis() + 15_000;
      while (admin.listTopics().names().get().contains(topic)) {
        check(System.currentTimeMillis() < deadlineMs, "topic still listed 15 s after DeleteTopics");
        Thread.sleep(200);
      }
      return "created 3 partitions, retention.ms=3600000 (" + retention.source() + "), listed, deleted, gone";
    }
  }

  static final int CODEC_RECORDS = 1000;

  String codec(String codec) throws Exception {
    String topic = topicName("codec." + codec);
    try (Admin admin = admin()) {
      createTopic(admin, topic, 3);
      Properties p = producerProps();
      p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, codec);
      // The idempotent producer is its own scenario; here one request in flight keeps the
      // per-partition order without relying on it.
      p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, false);
      p.put(ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, 1);
      String detail = produceAndVerify(p, topic, 3, CODEC_RECORDS, codec);
      deleteTopicQuietly(admin, topic);
      return detail;
    }
  }

  String idempotent() throws Exception {
    String topic = topicName("idempotent");
    try (Admin admin = admin()) {
      createTopic(admin, topic, 3);
      Properties p = producerProps();
      p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
      p.put(ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, 5);
      String detail = produceAndVerify(p, topic, 3, CODEC_RECORDS, "idempotent");
      deleteTopicQuietly(admin, topic);
      return detail + ", enable.idempotence=true";
    }
  }

  String groupCommit() throws Exception {
    String topic = topicName("group.commit");
    String group = topicName("group.commit") + "-group";
    TopicPartition tp = new TopicPartition(topic, 0);
    int produced = 200;
    int firstRead = 100;
    try (Admin admin = admin()) {
      createTopic(admin, topic, 1);
      try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps())) {
        List<Future<RecordMetadata>> acks = new ArrayList<>();
        for (int i = 0; i < produced; i++) {
          acks.add(producer.send(new ProducerRecord<>(topic, 0, bytes(key(i)), bytes("group-" + i))));
        }
        for (Future<RecordMetadata> ack : acks) ack.get();
      }

      // First member: reads exactly the first 100 records, commits their end, leaves.
      int read = 0;
      try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(groupConsumerProps(group))) {
        consumer.subscribe(List.of(topic));
        long deadlineMs = System.currentTimeMillis() + 40_000;
        while (read < firstRead) {
          check(
              System.currentTimeMillis() < deadlineMs,
              "first member read %d of %d records in 40 s (JoinGroup/SyncGroup/Fetch)", read, firstRead);
          for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(500))) {
            if (read < firstRead) {
              check(r.offset() == read, "first member read offset %d, expected %d", r.offset(), read);
              read++;
            }
          }
        }
        consumer.commitSync(Map.of(tp, new OffsetAndMetadata(firstRead)));
      }

      Map<TopicPartition, OffsetAndMetadata> committed =
          admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
      check(
          committed.get(tp) != null && committed.get(tp).offset() == firstRead,
          "OffsetFetch (Admin listConsumerGroupOffsets): %s, expected offset %d", committed, firstRead);

      // Second member of the same group: resumes at the committed offset, never before it.
      int resumed = 0;
      long firstOffset = -1;
      try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(groupConsumerProps(group))) {
        consumer.subscribe(List.of(topic));
        long deadlineMs = System.currentTimeMillis() + 40_000;
        while (resumed < produced - firstRead) {
          check(
              System.currentTimeMillis() < deadlineMs,
              "second member read %d of %d records in 40 s", resumed, produced - firstRead);
          for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(500))) {
            if (firstOffset < 0) firstOffset = r.offset();
            check(
                r.offset() == firstRead + resumed,
                "second member read offset %d, expected %d", r.offset(), firstRead + resumed);
            resumed++;
          }
        }
      }
      try {
        admin.deleteConsumerGroups(List.of(group)).all().get();
      } catch (ExecutionException e) {
        System.err.println("group.commit: deleting group " + group + ": " + describe(e));
      }
      deleteTopicQuietly(admin, topic);
      return String.format(
          "first member committed %d, second resumed at offset %d and read %d", firstRead, firstOffset, resumed);
    }
  }

  static final int SEEK_RECORDS = 100;

  /** A 1-partition topic with 100 records whose timestamps are t0 + i * 1000 ms. */
  record SeekTopic(String topic, TopicPartition tp, long t0Ms) {}

  SeekTopic seekTopic(Admin admin, String scenario) throws Exception {
    String topic = topicName(scenario);
    createTopic(admin, topic, 1);
    // Timestamps in the past, so that none can be confused with the broker's clock.
    long t0Ms = System.currentTimeMillis() - 3_600_000L;
    try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps())) {
      List<Future<RecordMetadata>> acks = new ArrayList<>();
      for (int i = 0; i < SEEK_RECORDS; i++) {
        acks.add(producer.send(new ProducerRecord<>(topic, 0, t0Ms + i * 1000L, bytes(key(i)), bytes("seek-" + i))));
      }
      for (int i = 0; i < SEEK_RECORDS; i++) {
        long offset = acks.get(i).get().offset();
        check(offset == i, "record %d acknowledged at offset %d", i, offset);
      }
    }
    return new SeekTopic(topic, new TopicPartition(topic, 0), t0Ms);
  }

  String seekEarliest() throws Exception {
    try (Admin admin = admin()) {
      SeekTopic st = seekTopic(admin, "seek.earliest");
      try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(assignConsumerProps())) {
        consumer.assign(List.of(st.tp()));
        consumer.seekToBeginning(List.of(st.tp()));
        ConsumerRecord<byte[], byte[]> first = firstRecord(consumer);
        check(first.offset() == 0, "first record after seekToBeginning at offset %d, expected 0", first.offset());
        check(Arrays.equals(first.value(), bytes("seek-0")), "first record value %s", str(first.value()));
        check(first.timestamp() == st.t0Ms(), "first record timestamp %d, expected %d", first.timestamp(), st.t0Ms());
      }
      deleteTopicQuietly(admin, st.topic());
      return "seekToBeginning read offset 0 first";
    }
  }

  String seekLatest() throws Exception {
    try (Admin admin = admin()) {
      SeekTopic st = seekTopic(admin, "seek.latest");
      try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(assignConsumerProps());
          KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps())) {
        consumer.assign(List.of(st.tp()));
        consumer.seekToEnd(List.of(st.tp()));
        long position = consumer.position(st.tp());
        check(position == SEEK_RECORDS, "position after seekToEnd %d, expected %d", position, SEEK_RECORDS);
        ConsumerRecords<byte[], byte[]> old = consumer.poll(Duration.ofMillis(1000));
        check(old.isEmpty(), "read %d old records after seekToEnd", old.count());
        long offset = producer.send(new ProducerRecord<>(st.topic(), 0, bytes("late"), bytes("after-seek"))).get().offset();
        check(offset == SEEK_RECORDS, "new record acknowledged at offset %d", offset);
        ConsumerRecord<byte[], byte[]> first = firstRecord(consumer);
        check(
            first.offset() == SEEK_RECORDS && Arrays.equals(first.value(), bytes("after-seek")),
            "first record read after seekToEnd: offset %d value %s", first.offset(), str(first.value()));
      }
      deleteTopicQuietly(admin, st.topic());
      return "seekToEnd at 100, nothing old read, new record read at offset 100";
    }
  }

  String seekTimestamp() throws Exception {
    try (Admin admin = admin()) {
      SeekTopic st = seekTopic(admin, "seek.timestamp");
      long targetMs = st.t0Ms() + 50 * 1000L;
      try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(assignConsumerProps())) {
        Map<TopicPartition, OffsetAndTimestamp> found = consumer.offsetsForTimes(Map.of(st.tp(), targetMs));
        OffsetAndTimestamp oat = found.get(st.tp());
        check(oat != null, "offsetsForTimes (ListOffsets) found no offset for T0+50 s");
        check(
            oat.offset() == 50 && oat.timestamp() == targetMs,
            "offsetsForTimes (ListOffsets): offset %d timestamp %d, expected 50 at %d",
            oat.offset(), oat.timestamp(), targetMs);
        // A timestamp between two records resolves to the later one.
        OffsetAndTimestamp between = consumer.offsetsForTimes(Map.of(st.tp(), targetMs - 500)).get(st.tp());
        check(
            between != null && between.offset() == 50,
            "offsetsForTimes(T0+49.5 s): %s, expected offset 50", between);
        consumer.assign(List.of(st.tp()));
        consumer.seek(st.tp(), oat.offset());
        ConsumerRecord<byte[], byte[]> first = firstRecord(consumer);
        check(
            first.offset() == 50 && first.timestamp() == targetMs,
            "first record after seek: offset %d timestamp %d", first.offset(), first.timestamp());
      }
      deleteTopicQuietly(admin, st.topic());
      return "offsetsForTimes(T0+50 s) = offset 50, record read";
    }
  }

  static final int NEAR_MAX_VALUE_BYTES = 1_000_000;
  static final int ABOVE_MAX_VALUE_BYTES = 1_100_000;
  static final int RAISED_LIMIT_BYTES = 2 * 1024 * 1024;

  String largeNearMax() throws Exception {
    String topic = topicName("large.near_max");
    byte[] value = new byte[NEAR_MAX_VALUE_BYTES];
    new Random(42).nextBytes(value);
    try (Admin admin = admin()) {
      createTopic(admin, topic, 1);
      TopicPartition tp = new TopicPartition(topic, 0);
      Properties p = producerProps();
      p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "none");
      p.put(ProducerConfig.MAX_REQUEST_SIZE_CONFIG, RAISED_LIMIT_BYTES);
      try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
        long offset = producer.send(new ProducerRecord<>(topic, 0, bytes("big"), value)).get().offset();
        check(offset == 0, "acknowledged at offset %d", offset);
      }
      Properties c = assignConsumerProps();
      c.put(ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG, RAISED_LIMIT_BYTES);
      c.put(ConsumerConfig.FETCH_MAX_BYTES_CONFIG, RAISED_LIMIT_BYTES);
      try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c)) {
        consumer.assign(List.of(tp));
        consumer.seekToBeginning(List.of(tp));
        ConsumerRecord<byte[], byte[]> r = firstRecord(consumer);
        check(r.offset() == 0, "read offset %d", r.offset());
        check(Arrays.equals(r.value(), value), "value differs (%d bytes read)", r.value() == null ? -1 : r.value().length);
      }
      deleteTopicQuietly(admin, topic);
      return NEAR_MAX_VALUE_BYTES + "-byte value produced and consumed intact";
    }
  }

  String largeAboveMax() throws Exception {
    String topic = topicName("large.above_max");
    try (Admin admin = admin()) {
      createTopic(admin, topic, 1);
      Properties p = producerProps();
      p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "none");
      p.put(ProducerConfig.MAX_REQUEST_SIZE_CONFIG, RAISED_LIMIT_BYTES);
      p.put(ProducerConfig.BATCH_SIZE_CONFIG, RAISED_LIMIT_BYTES);
      try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
        try {
          RecordMetadata md =
              producer.send(new ProducerRecord<>(topic, 0, bytes("too-big"), new byte[ABOVE_MAX_VALUE_BYTES])).get();
          throw new AssertionError("Produce accepted a " + ABOVE_MAX_VALUE_BYTES + "-byte record at offset " + md.offset()
              + ", expected MESSAGE_TOO_LARGE");
        } catch (ExecutionException e) {
          if (!(e.getCause() instanceof RecordTooLargeException)) {
            throw new AssertionError("expected MESSAGE_TOO_LARGE, got " + describe(e.getCause()), e.getCause());
          }
          deleteTopicQuietly(admin, topic);
          return "Produce rejected with MESSAGE_TOO_LARGE (" + e.getCause().getMessage() + ")";
        }
      }
    }
  }

  static final int MANY_PARTITIONS = 200;

  String partitionsMany() throws Exception {
    String topic = topicName("partitions.many");
    try (Admin admin = admin()) {
      createTopic(admin, topic, MANY_PARTITIONS);
      try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps())) {
        List<Future<RecordMetadata>> acks = new ArrayList<>();
        for (int p = 0; p < MANY_PARTITIONS; p++) {
          acks.add(producer.send(new ProducerRecord<>(topic, p, bytes(key(p)), bytes("partition-" + p))));
        }
        for (int p = 0; p < MANY_PARTITIONS; p++) {
          RecordMetadata md = acks.get(p).get();
          check(md.partition() == p && md.offset() == 0, "record for partition %d acknowledged at %d/%d", p, md.partition(), md.offset());
        }
      }
      List<TopicPartition> tps = new ArrayList<>();
      for (int p = 0; p < MANY_PARTITIONS; p++) tps.add(new TopicPartition(topic, p));
      Map<Integer, List<ConsumerRecord<byte[], byte[]>>> read = readAll(assignConsumerProps(), tps, MANY_PARTITIONS);
      for (int p = 0; p < MANY_PARTITIONS; p++) {
        List<ConsumerRecord<byte[], byte[]>> records = read.getOrDefault(p, List.of());
        check(records.size() == 1, "partition %d: read %d records, expected 1", p, records.size());
        check(
            Arrays.equals(records.get(0).value(), bytes("partition-" + p)),
            "partition %d: value %s", p, str(records.get(0).value()));
      }
      deleteTopicQuietly(admin, topic);
      return MANY_PARTITIONS + " partitions, one record each, all read back";
    }
  }

  String unknownAutocreate() throws Exception {
    String topic = topicName("unknown.autocreate");
    try (Admin admin = admin()) {
      check(!admin.listTopics().names().get().contains(topic), "topic exists before the produce");
      long offset;
      int partition;
      try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps())) {
        RecordMetadata md = producer.send(new ProducerRecord<>(topic, bytes("auto"), bytes("created"))).get();
        offset = md.offset();
        partition = md.partition();
      }
      // Both brokers run with num.partitions=1, which an auto-created topic must get.
      int partitionCount = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic).partitions().size();
      check(partitionCount == 1, "auto-created topic has %d partitions, num.partitions is 1", partitionCount);
      TopicPartition tp = new TopicPartition(topic, partition);
      try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(assignConsumerProps())) {
        consumer.assign(List.of(tp));
        consumer.seekToBeginning(List.of(tp));
        ConsumerRecord<byte[], byte[]> r = firstRecord(consumer);
        check(
            r.offset() == offset && Arrays.equals(r.value(), bytes("created")),
            "read offset %d value %s, acknowledged offset %d", r.offset(), str(r.value()), offset);
      }
      deleteTopicQuietly(admin, topic);
      return "auto-created by Metadata, record acked at " + partition + "/" + offset + " and read back";
    }
  }

  String unknownNoAutocreate() throws Exception {
    String topic = topicName("unknown.noautocreate");
    try (Admin admin = admin()) {
      Properties c = assignConsumerProps();
      c.put(ConsumerConfig.ALLOW_AUTO_CREATE_TOPICS_CONFIG, false);
      String seen;
      try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c)) {
        // The Java consumer maps UNKNOWN_TOPIC_OR_PARTITION in the Metadata response to an
        // absent topic: partitionsFor returns an empty list instead of throwing.
        List<PartitionInfo> partitions = consumer.partitionsFor(topic);
        check(
            partitions == null || partitions.isEmpty(),
            "partitionsFor returned %d partitions for a topic that does not exist", partitions == null ? 0 : partitions.size());
        seen = "partitionsFor empty";
        // Fetching from an assigned partition of it must not create it either.
        TopicPartition tp = new TopicPartition(topic, 0);
        consumer.assign(List.of(tp));
        consumer.seek(tp, 0);
        ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(1500));
        check(records.isEmpty(), "read %d records from a nonexistent topic", records.count());
      }
      try {
        admin.describeTopics(List.of(topic)).allTopicNames().get();
        throw new AssertionError("the topic was created (DescribeTopics found it) after " + seen);
      } catch (ExecutionException e) {
        check(
            e.getCause() instanceof UnknownTopicOrPartitionException,
            "DescribeTopics: %s, expected UNKNOWN_TOPIC_OR_PARTITION", describe(e.getCause()));
      }
      check(!admin.listTopics().names().get().contains(topic), "the topic was created (listed by ListTopics)");
      return seen + ", DescribeTopics UNKNOWN_TOPIC_OR_PARTITION, topic not created";
    }
  }

  // ---------------------------------------------------------------- shared steps

  /**
   * Produces n keyed records (two headers, explicit CreateTime timestamps) with producer
   * properties p, reads them back from the beginning with an assigned consumer, and checks key,
   * value, headers, timestamp, acknowledged offset and per-partition order of every record.
   */
  String produceAndVerify(Properties p, String topic, int partitions, int n, String tag) throws Exception {
    long baseTimestampMs = System.currentTimeMillis() - 3_600_000L;
    int[] ackPartition = new int[n];
    long[] ackOffset = new long[n];
    AtomicReference<Exception> firstError = new AtomicReference<>();
    try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
      for (int i = 0; i < n && firstError.get() == null; i++) {
        final int index = i;
        RecordHeaders headers = new RecordHeaders();
        headers.add("index", bytes(Integer.toString(i)));
        headers.add("tag", bytes(tag));
        producer.send(
            new ProducerRecord<>(topic, null, baseTimestampMs + i, bytes(key(i)), bytes(value(tag, i)), headers),
            (RecordMetadata md, Exception e) -> {
              if (e != null) {
                firstError.compareAndSet(null, e);
              } else {
                ackPartition[index] = md.partition();
                ackOffset[index] = md.offset();
              }
            });
      }
      producer.flush();
    }
    if (firstError.get() != null) throw new AssertionError("Produce: " + describe(firstError.get()), firstError.get());

    Map<Integer, List<Integer>> sentByPartition = new HashMap<>();
    for (int i = 0; i < n; i++) sentByPartition.computeIfAbsent(ackPartition[i], k -> new ArrayList<>()).add(i);

    List<TopicPartition> tps = new ArrayList<>();
    for (int i = 0; i < partitions; i++) tps.add(new TopicPartition(topic, i));
    Map<Integer, List<ConsumerRecord<byte[], byte[]>>> read = readAll(assignConsumerProps(), tps, n);

    StringBuilder perPartition = new StringBuilder();
    for (int part = 0; part < partitions; part++) {
      List<ConsumerRecord<byte[], byte[]>> records = read.getOrDefault(part, List.of());
      List<Integer> sent = sentByPartition.getOrDefault(part, List.of());
      check(records.size() == sent.size(), "partition %d: read %d records, %d acknowledged", part, records.size(), sent.size());
      for (int j = 0; j < records.size(); j++) {
        ConsumerRecord<byte[], byte[]> r = records.get(j);
        int i = sent.get(j);
        String where = "partition " + part + " offset " + r.offset();
        check(r.offset() == ackOffset[i], "%s: expected record %d acknowledged at offset %d (order)", where, i, ackOffset[i]);
        check(Arrays.equals(r.key(), bytes(key(i))), "%s: key %s, expected %s", where, str(r.key()), key(i));
        check(Arrays.equals(r.value(), bytes(value(tag, i))), "%s: value differs for record %d", where, i);
        check(
            r.timestampType() == TimestampType.CREATE_TIME && r.timestamp() == baseTimestampMs + i,
            "%s: timestamp %s %d, expected CreateTime %d", where, r.timestampType(), r.timestamp(), baseTimestampMs + i);
        Header[] headers = r.headers().toArray();
        check(headers.length == 2, "%s: %d headers, expected 2", where, headers.length);
        check(
            headers[0].key().equals("index")
                && Arrays.equals(headers[0].value(), bytes(Integer.toString(i)))
                && headers[1].key().equals("tag")
                && Arrays.equals(headers[1].value(), bytes(tag)),
            "%s: headers %s=%s %s=%s", where, headers[0].key(), str(headers[0].value()), headers[1].key(), str(headers[1].value()));
      }
      perPartition.append(part == 0 ? "" : ",").append(records.size());
    }
    return String.format("%d records verified, per partition [%s]", n, perPartition);
  }

  /** Reads from the beginning of tps until n records arrived, then checks nothing more follows. */
  static Map<Integer, List<ConsumerRecord<byte[], byte[]>>> readAll(Properties c, Collection<TopicPartition> tps, int n) {
    Map<Integer, List<ConsumerRecord<byte[], byte[]>>> byPartition = new HashMap<>();
    try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c)) {
      consumer.assign(tps);
      consumer.seekToBeginning(tps);
      int total = 0;
      long lastProgressMs = System.currentTimeMillis();
      while (total < n) {
        ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(500));
        long nowMs = System.currentTimeMillis();
        if (records.isEmpty()) {
          check(nowMs - lastProgressMs < IDLE_LIMIT_MS, "Fetch: stalled at %d of %d records for %d ms", total, n, IDLE_LIMIT_MS);
          continue;
        }
        lastProgressMs = nowMs;
        for (ConsumerRecord<byte[], byte[]> r : records) {
          byPartition.computeIfAbsent(r.partition(), k -> new ArrayList<>()).add(r);
          total++;
        }
      }
      ConsumerRecords<byte[], byte[]> extra = consumer.poll(Duration.ofMillis(200));
      check(extra.isEmpty() && total == n, "read %d records beyond the %d produced", total - n + extra.count(), n);
    }
    return byPartition;
  }

  /** Polls until one record arrives (bounded by IDLE_LIMIT_MS) and returns the first. */
  static ConsumerRecord<byte[], byte[]> firstRecord(KafkaConsumer<byte[], byte[]> consumer) {
    long deadlineMs = System.currentTimeMillis() + IDLE_LIMIT_MS;
    while (System.currentTimeMillis() < deadlineMs) {
      ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(500));
      if (!records.isEmpty()) return records.iterator().next();
    }
    throw new AssertionError("Fetch: no record within " + IDLE_LIMIT_MS + " ms");
  }

  static void createTopic(Admin admin, String topic, int partitions) throws Exception {
    admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
  }

  /** Deleting is housekeeping: a failure is reported on stderr and does not fail the scenario. */
  static void deleteTopicQuietly(Admin admin, String topic) {
    try {
      admin.deleteTopics(List.of(topic)).all().get(API_TIMEOUT_MS, TimeUnit.MILLISECONDS);
    } catch (Exception e) {
      System.err.println("deleting " + topic + ": " + describe(e));
    }
  }

  String topicName(String scenario) {
    return "compat-" + FAMILY + "-" + scenario.replace('.', '-') + "-" + runId;
  }

  Admin admin() {
    Properties p = new Properties();
    p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, API_TIMEOUT_MS);
    p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, REQUEST_TIMEOUT_MS);
    return Admin.create(p);
  }

  Properties producerProps() {
    Properties p = new Properties();
    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ProducerConfig.ACKS_CONFIG, "all");
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    p.put(ProducerConfig.LINGER_MS_CONFIG, 5);
    p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, REQUEST_TIMEOUT_MS);
    p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, 30_000);
    p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, API_TIMEOUT_MS);
    return p;
  }

  /** A consumer without group.id: assign() and seek only, never a coordinator. */
  Properties assignConsumerProps() {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "none");
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, API_TIMEOUT_MS);
    p.put(ConsumerConfig.REQUEST_TIMEOUT_MS_CONFIG, REQUEST_TIMEOUT_MS);
    return p;
  }

  Properties groupConsumerProps(String group) {
    Properties p = assignConsumerProps();
    p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 10);
    return p;
  }

  static byte[] bytes(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  static String str(byte[] b) {
    return b == null ? "null" : new String(b, StandardCharsets.UTF_8);
  }

  static String key(int i) {
    return "key-" + i;
  }

  /** The value repeats the index and tag so a record delivered under the wrong key is caught. */
  static String value(String tag, int i) {
    return "value-" + i + "-" + tag + "-" + "x".repeat(32 + i % 64);
  }

  static void check(boolean condition, String format, Object... args) {
    if (!condition) throw new AssertionError(String.format(format, args));
  }
}
