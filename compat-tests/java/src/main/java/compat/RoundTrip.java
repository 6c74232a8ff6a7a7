package compat;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.record.TimestampType;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Produces N records per compression codec with the Java client's default producer settings
 * (idempotence on, acks=all, 5 requests in flight) and reads them back with an assigned,
 * group-less consumer, checking that every record survives byte for byte, in order, at
 * contiguous offsets, and that ListOffsets agrees with what was read.
 *
 * <p>Usage: RoundTrip &lt;bootstrap&gt; [N] [codec,codec,...]. Prints one "PASS java &lt;codec&gt;"
 * or "FAIL java &lt;codec&gt;: reason" line per codec and exits 1 if any failed.
 */
public final class RoundTrip {
  static final String CLIENT = "java";
  static final int PARTITION_COUNT = 3;
  /** A bound on how long the consumer may go without receiving anything before we give up. */
  static final long IDLE_LIMIT_MS = 60_000;
  /** A bound on any single admin call. */
  static final long ADMIN_TIMEOUT_MS = 30_000;

  private RoundTrip() {}

  public static void main(String[] args) throws Exception {
    if (args.length < 1) {
      System.err.println("usage: RoundTrip <bootstrap> [N] [codec,codec,...]");
      System.exit(2);
    }
    String bootstrap = args[0];
    int recordCount = args.length > 1 ? Integer.parseInt(args[1]) : 100_000;
    List<String> codecs =
        args.length > 2
            ? Arrays.asList(args[2].split(","))
            : List.of("none", "gzip", "snappy", "lz4", "zstd");
    // A run-unique suffix lets the test run again against a broker that kept old topics.
    String runId = Long.toString(System.currentTimeMillis());

    int passed = 0;
    int failed = 0;
    try (Admin admin = Admin.create(adminProps(bootstrap))) {
      for (String codec : codecs) {
        String topic = "compat-java-" + codec + "-" + runId;
        long startNs = System.nanoTime();
        try {
          String detail = roundTrip(admin, bootstrap, topic, codec, recordCount);
          double seconds = (System.nanoTime() - startNs) / 1e9;
          System.out.printf("PASS %s %s: %s in %.1f s%n", CLIENT, codec, detail, seconds);
          passed++;
        } catch (Exception | AssertionError e) {
          System.out.printf("FAIL %s %s: %s%n", CLIENT, codec, describe(e));
          failed++;
        }
        System.out.flush();
      }
    }
    System.out.printf("%s: %d passed, %d failed%n", CLIENT, passed, failed);
    System.exit(failed == 0 ? 0 : 1);
  }

  static String describe(Throwable e) {
    StringBuilder sb = new StringBuilder();
    for (Throwable t = e; t != null; t = t.getCause()) {
      if (sb.length() > 0) sb.append(" <- ");
      sb.append(t.getClass().getSimpleName()).append(": ").append(t.getMessage());
    }
    return sb.toString();
  }

  static Properties adminProps(String bootstrap) {
    Properties p = new Properties();
    p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, (int) ADMIN_TIMEOUT_MS);
    return p;
  }

  static byte[] bytes(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  static String key(int i) {
    return "key-" + i;
  }

  /** The value repeats the key so a record delivered under the wrong key is caught. */
  static String value(String codec, int i) {
    return "value-" + i + "-" + codec + "-" + "x".repeat(64 + i % 64);
  }

  /** What the producer learned when record i was acknowledged. */
  record Ack(int partition, long offset) {}

  static String roundTrip(Admin admin, String bootstrap, String topic, String codec, int n)
      throws Exception {
    admin
        .createTopics(List.of(new NewTopic(topic, PARTITION_COUNT, (short) 1)))
        .all()
        .get(ADMIN_TIMEOUT_MS, TimeUnit.MILLISECONDS);

    // Explicit timestamps in the past, one millisecond apart, so that a broker which replaced
    // them with its own clock (LogAppendTime) or dropped the per-record delta is caught.
    long baseTimestampMs = System.currentTimeMillis() - 3_600_000L;
    Ack[] acks = produce(bootstrap, topic, codec, n, baseTimestampMs);

    // Expected sequence per partition in send order; the idempotent producer must keep it.
    Map<Integer, List<Integer>> sentByPartition = new HashMap<>();
    for (int i = 0; i < n; i++) {
      sentByPartition.computeIfAbsent(acks[i].partition(), k -> new ArrayList<>()).add(i);
    }

    Map<Integer, List<ConsumerRecord<byte[], byte[]>>> readByPartition =
        consume(bootstrap, topic, n);

    int total = 0;
    for (int p = 0; p < PARTITION_COUNT; p++) {
      List<ConsumerRecord<byte[], byte[]>> read =
          readByPartition.getOrDefault(p, Collections.emptyList());
      List<Integer> sent = sentByPartition.getOrDefault(p, Collections.emptyList());
      check(
          read.size() == sent.size(),
          "partition %d: read %d records, %d were acknowledged", p, read.size(), sent.size());
      for (int j = 0; j < read.size(); j++) {
        ConsumerRecord<byte[], byte[]> r = read.get(j);
        int i = sent.get(j);
        String where = "partition " + p + " offset " + r.offset();
        check(
            j == 0 || r.offset() == read.get(j - 1).offset() + 1,
            "%s: offsets not contiguous (previous %d)", where, j == 0 ? -1 : read.get(j - 1).offset());
        check(
            r.offset() == acks[i].offset(),
            "%s: record %d was acknowledged at offset %d", where, i, acks[i].offset());
        check(
            Arrays.equals(r.key(), bytes(key(i))),
            "%s: key %s, expected %s", where, str(r.key()), key(i));
        check(
            Arrays.equals(r.value(), bytes(value(codec, i))),
            "%s: value differs for record %d", where, i);
        check(
            r.timestampType() == TimestampType.CREATE_TIME && r.timestamp() == baseTimestampMs + i,
            "%s: timestamp %s %d, expected CreateTime %d",
            where, r.timestampType(), r.timestamp(), baseTimestampMs + i);
        Header[] headers = r.headers().toArray();
        check(headers.length == 2, "%s: %d headers, expected 2", where, headers.length);
        check(
            headers[0].key().equals("index") && Arrays.equals(headers[0].value(), bytes(Integer.toString(i)))
                && headers[1].key().equals("codec") && Arrays.equals(headers[1].value(), bytes(codec)),
            "%s: headers %s=%s %s=%s", where,
            headers[0].key(), str(headers[0].value()), headers[1].key(), str(headers[1].value()));
      }
      total += read.size();
    }
    check(total == n, "read %d records in total, produced %d", total, n);

    // ListOffsets must describe exactly the range that was read.
    Map<TopicPartition, OffsetSpec> earliestSpec = new HashMap<>();
    Map<TopicPartition, OffsetSpec> latestSpec = new HashMap<>();
    for (int p = 0; p < PARTITION_COUNT; p++) {
      earliestSpec.put(new TopicPartition(topic, p), OffsetSpec.earliest());
      latestSpec.put(new TopicPartition(topic, p), OffsetSpec.latest());
    }
    Map<TopicPartition, ListOffsetsResultInfo> earliest =
        admin.listOffsets(earliestSpec).all().get(ADMIN_TIMEOUT_MS, TimeUnit.MILLISECONDS);
    Map<TopicPartition, ListOffsetsResultInfo> latest =
        admin.listOffsets(latestSpec).all().get(ADMIN_TIMEOUT_MS, TimeUnit.MILLISECONDS);
    StringBuilder perPartition = new StringBuilder();
    for (int p = 0; p < PARTITION_COUNT; p++) {
      TopicPartition tp = new TopicPartition(topic, p);
      List<ConsumerRecord<byte[], byte[]>> read =
          readByPartition.getOrDefault(p, Collections.emptyList());
      long first = read.isEmpty() ? 0 : read.get(0).offset();
      long end = read.isEmpty() ? 0 : read.get(read.size() - 1).offset() + 1;
      long e = earliest.get(tp).offset();
      long l = latest.get(tp).offset();
      check(e == 0 && first == 0, "partition %d: earliest offset %d, first read %d, expected 0", p, e, first);
      check(l == end, "partition %d: latest offset %d, expected %d", p, l, end);
      perPartition.append(perPartition.length() == 0 ? "" : ",").append(read.size());
    }
    admin.deleteTopics(List.of(topic)).all().get(ADMIN_TIMEOUT_MS, TimeUnit.MILLISECONDS);
    return String.format("%d records, per partition [%s], ListOffsets ok", n, perPartition);
  }

  static Ack[] produce(String bootstrap, String topic, String codec, int n, long baseTimestampMs)
      throws Exception {
    Properties p = new Properties();
    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, codec);
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    // Everything else stays at the client's defaults on purpose: enable.idempotence=true,
    // acks=all, max.in.flight.requests.per.connection=5 is what applications get.
    Ack[] acks = new Ack[n];
    AtomicReference<Exception> firstError = new AtomicReference<>();
    try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
      for (int i = 0; i < n && firstError.get() == null; i++) {
        final int index = i;
        RecordHeaders headers = new RecordHeaders();
        headers.add("index", bytes(Integer.toString(i)));
        headers.add("codec", bytes(codec));
        ProducerRecord<byte[], byte[]> record =
            new ProducerRecord<>(
                topic, null, baseTimestampMs + i, bytes(key(i)), bytes(value(codec, i)), headers);
        producer.send(
            record,
            (RecordMetadata md, Exception e) -> {
              if (e != null) {
                firstError.compareAndSet(null, e);
              } else {
                acks[index] = new Ack(md.partition(), md.offset());
              }
            });
      }
      // flush() is bounded by delivery.timeout.ms (120 s by default) for every record.
      producer.flush();
    }
    if (firstError.get() != null) {
      throw new AssertionError("produce failed", firstError.get());
    }
    for (int i = 0; i < n; i++) {
      check(acks[i] != null, "record %d was never acknowledged", i);
    }
    return acks;
  }

  static Map<Integer, List<ConsumerRecord<byte[], byte[]>>> consume(
      String bootstrap, String topic, int n) {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    // No group.id: the consumer must work with assign() alone and never touch a coordinator.
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "none");
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    Map<Integer, List<ConsumerRecord<byte[], byte[]>>> byPartition = new HashMap<>();
    try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p)) {
      List<TopicPartition> tps = new ArrayList<>();
      for (int i = 0; i < PARTITION_COUNT; i++) tps.add(new TopicPartition(topic, i));
      consumer.assign(tps);
      // Partition 0 starts from an explicit seek, the others from seekToBeginning, so both
      // the plain Fetch path and the ListOffsets(earliest) path are exercised.
      consumer.seek(tps.get(0), 0L);
      consumer.seekToBeginning(tps.subList(1, tps.size()));
      int total = 0;
      long lastProgressMs = System.currentTimeMillis();
      while (total < n) {
        ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(500));
        long nowMs = System.currentTimeMillis();
        if (records.isEmpty()) {
          check(
              nowMs - lastProgressMs < IDLE_LIMIT_MS,
              "consumer stalled at %d of %d records for %d ms", total, n, IDLE_LIMIT_MS);
          continue;
        }
        lastProgressMs = nowMs;
        for (ConsumerRecord<byte[], byte[]> r : records) {
          byPartition.computeIfAbsent(r.partition(), k -> new ArrayList<>()).add(r);
          total++;
        }
      }
      // A short extra poll catches records beyond the N produced (duplicates).
      ConsumerRecords<byte[], byte[]> extra = consumer.poll(Duration.ofMillis(200));
      check(extra.isEmpty(), "read %d records beyond the %d produced", extra.count(), n);
    }
    return byPartition;
  }

  static String str(byte[] b) {
    return b == null ? "null" : new String(b, StandardCharsets.UTF_8);
  }

  static void check(boolean condition, String format, Object... args) {
    if (!condition) throw new AssertionError(String.format(format, args));
  }
}
