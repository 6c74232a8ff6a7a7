package compat;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.FinalizedVersionRange;
import org.apache.kafka.clients.admin.ListConsumerGroupOffsetsOptions;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.InvalidProducerEpochException;
import org.apache.kafka.common.errors.ProducerFencedException;

/**
 * The transaction scenarios of the Java family (issue 30): txn.commit, txn.abort, txn.fence and
 * txn.offsets. Each checks exact results: which records a read_committed and a read_uncommitted
 * consumer see, at which offsets (one control record per partition and transaction), what
 * endOffsets/seekToEnd answer while a transaction is open, and where a group's offsets stand.
 *
 * <p>The producers use the client's defaults (a 4.4 client picks transaction version 2 when the
 * broker finalizes it, 1 otherwise); the PASS detail names the version the broker finalizes.
 */
final class TxnScenarios {
  /** Bound of every wait for markers or records; the runner bounds the scenario at 60 s. */
  static final long WAIT_MS = 20_000;

  private final Scenarios s;

  TxnScenarios(Scenarios s) {
    this.s = s;
  }

  // ---------------------------------------------------------------- txn.commit

  static final int COMMIT_PARTITIONS = 3;
  static final int COMMIT_TRANSACTIONS = 3;
  static final int COMMIT_RECORDS_PER_TXN = 60;

  /**
   * Three committed transactions of 60 records over 3 partitions (record i to partition i % 3): a
   * read_committed consumer reads exactly them at their acknowledged offsets in order, and each
   * transaction is followed by exactly one control record per partition (the next transaction
   * starts 2 offsets after the last record, the log ends 1 after it).
   */
  String commit() throws Exception {
    String topic = s.topicName("txn.commit");
    try (Admin admin = s.admin()) {
      createTopic(admin, topic, COMMIT_PARTITIONS);
      List<TopicPartition> tps = partitions(topic, COMMIT_PARTITIONS);
      List<List<RecordMetadata>> acks = new ArrayList<>();
      try (KafkaProducer<byte[], byte[]> producer = transactionalProducer(topic + "-tx")) {
        producer.initTransactions();
        for (int t = 0; t < COMMIT_TRANSACTIONS; t++) {
          producer.beginTransaction();
          List<Future<RecordMetadata>> sent = new ArrayList<>();
          for (int j = 0; j < COMMIT_RECORDS_PER_TXN; j++) {
            int i = t * COMMIT_RECORDS_PER_TXN + j;
            sent.add(producer.send(record(topic, i % COMMIT_PARTITIONS, "commit", i)));
          }
          producer.commitTransaction();
          acks.add(resolved(sent));
        }
      }
      int n = COMMIT_TRANSACTIONS * COMMIT_RECORDS_PER_TXN;
      List<RecordMetadata> all = new ArrayList<>();
      acks.forEach(all::addAll);
      Map<Integer, List<ConsumerRecord<byte[], byte[]>>> read =
          Scenarios.readAll(consumerProps("read_committed"), tps, n);
      checkRecords(read, all, "commit");

      // Per partition: the first record of transaction t+1 sits 2 after the last of t (one marker).
      long[] expectedEnd = new long[COMMIT_PARTITIONS];
      for (int p = 0; p < COMMIT_PARTITIONS; p++) {
        long previousLast = -1;
        for (int t = 0; t < COMMIT_TRANSACTIONS; t++) {
          long first = Long.MAX_VALUE;
          long last = -1;
          for (RecordMetadata md : acks.get(t)) {
            if (md.partition() != p) continue;
            first = Math.min(first, md.offset());
            last = Math.max(last, md.offset());
          }
          check(first == previousLast + 2 || (t == 0 && first == 0),
              "partition %d: transaction %d starts at offset %d, the previous ended at %d: expected one commit marker between",
              p, t, first, previousLast);
          check(last - first + 1 == COMMIT_RECORDS_PER_TXN / COMMIT_PARTITIONS,
              "partition %d: transaction %d spans offsets %d..%d, expected %d contiguous records",
              p, t, first, last, COMMIT_RECORDS_PER_TXN / COMMIT_PARTITIONS);
          previousLast = last;
        }
        expectedEnd[p] = previousLast + 2;
      }
      awaitEndOffsets(tps, "read_committed", expectedEnd, "after the last commit");
      awaitEndOffsets(tps, "read_uncommitted", expectedEnd, "after the last commit");
      Scenarios.deleteTopicQuietly(admin, topic);
      return String.format(
          "%d transactions x %d records over %d partitions read back exactly (read_committed, offsets, order); "
              + "one marker per partition and transaction, log end %d each; %s",
          COMMIT_TRANSACTIONS, COMMIT_RECORDS_PER_TXN, COMMIT_PARTITIONS, expectedEnd[0], transactionVersion(admin));
    }
  }

  // ---------------------------------------------------------------- txn.abort

  static final int ABORT_PARTITIONS = 2;
  static final int ABORT_PER_PARTITION = 5;

  /**
   * Two producers interleave on 2 partitions: P1 commits c0; P1 opens a1 and P2 writes c2 after
   * it and commits; while a1 is open, read_committed endOffsets and seekToEnd answer the first
   * offset of a1 (the last stable offset), read_uncommitted the log end, and a read_committed
   * consumer sees c0 only. P1 aborts a1 and commits c3: read_committed then sees c0, c2, c3,
   * read_uncommitted all four, at their acknowledged offsets; both end offsets are records + 4
   * markers.
   */
  String abort() throws Exception {
    String topic = s.topicName("txn.abort");
    try (Admin admin = s.admin()) {
      createTopic(admin, topic, ABORT_PARTITIONS);
      List<TopicPartition> tps = partitions(topic, ABORT_PARTITIONS);
      List<RecordMetadata> c0, a1, c2, c3;
      long[] lso = new long[ABORT_PARTITIONS];
      long[] openEnd = new long[ABORT_PARTITIONS];
      try (KafkaProducer<byte[], byte[]> p1 = transactionalProducer(topic + "-tx1");
          KafkaProducer<byte[], byte[]> p2 = transactionalProducer(topic + "-tx2")) {
        p1.initTransactions();
        p2.initTransactions();
        c0 = committedTransaction(p1, topic, "c0", 0);
        p1.beginTransaction();
        a1 = sendAll(p1, topic, "a1", 100);
        c2 = committedTransaction(p2, topic, "c2", 200);
        for (int p = 0; p < ABORT_PARTITIONS; p++) {
          lso[p] = firstOffset(a1, p);
          // P2's commit marker follows its last record once the coordinator has written it.
          openEnd[p] = lastOffset(c2, p) + 2;
        }
        awaitEndOffsets(tps, "read_uncommitted", openEnd, "while a1 is open, after c2 committed");
        awaitEndOffsets(tps, "read_committed", lso, "while a1 is open (the last stable offset)");
        String seek = seekToEndPositions(tps, "read_committed");
        check(seek.equals(java.util.Arrays.toString(lso)),
            "read_committed seekToEnd while a1 is open: positions %s, expected the first offsets of a1 %s",
            seek, java.util.Arrays.toString(lso));
        // A read_committed consumer stops at the open transaction: c0 only, not c2 behind it.
        Map<Integer, List<ConsumerRecord<byte[], byte[]>>> stable =
            Scenarios.readAll(consumerProps("read_committed"), tps, c0.size());
        checkRecords(stable, c0, "c0");
        p1.abortTransaction();
        c3 = committedTransaction(p1, topic, "c3", 300);
      }
      long[] end = new long[ABORT_PARTITIONS];
      for (int p = 0; p < ABORT_PARTITIONS; p++) end[p] = lastOffset(c3, p) + 2;
      check(end[0] == 4 * ABORT_PER_PARTITION + 4,
          "partition 0: log end %d after 4 transactions of %d records, expected %d (one marker each)",
          end[0], ABORT_PER_PARTITION, 4 * ABORT_PER_PARTITION + 4);
      awaitEndOffsets(tps, "read_committed", end, "after a1 aborted and c3 committed");
      awaitEndOffsets(tps, "read_uncommitted", end, "after a1 aborted and c3 committed");

      List<RecordMetadata> committed = concat(c0, c2, c3);
      Map<Integer, List<ConsumerRecord<byte[], byte[]>>> rc =
          Scenarios.readAll(consumerProps("read_committed"), tps, committed.size());
      checkByValue(rc, committed, "read_committed");
      List<RecordMetadata> everything = concat(c0, a1, c2, c3);
      Map<Integer, List<ConsumerRecord<byte[], byte[]>>> ru =
          Scenarios.readAll(consumerProps("read_uncommitted"), tps, everything.size());
      checkByValue(ru, everything, "read_uncommitted");
      Scenarios.deleteTopicQuietly(admin, topic);
      return String.format(
          "while a1 open: read_committed endOffsets/seekToEnd = LSO %s, read_uncommitted %s, only c0 visible; "
              + "after abort: read_committed %d records (c0 c2 c3), read_uncommitted %d (with a1), end %s; %s",
          java.util.Arrays.toString(lso), java.util.Arrays.toString(openEnd), committed.size(), everything.size(),
          java.util.Arrays.toString(end), transactionVersion(admin));
    }
  }

  /** Sends ABORT_PER_PARTITION records to every partition in a transaction and commits it. */
  List<RecordMetadata> committedTransaction(KafkaProducer<byte[], byte[]> producer, String topic, String tag, int base)
      throws Exception {
    producer.beginTransaction();
    List<RecordMetadata> acks = sendAll(producer, topic, tag, base);
    producer.commitTransaction();
    return acks;
  }

  /** ABORT_PER_PARTITION records to every partition, flushed, with their acknowledgements. */
  List<RecordMetadata> sendAll(KafkaProducer<byte[], byte[]> producer, String topic, String tag, int base) throws Exception {
    List<Future<RecordMetadata>> sent = new ArrayList<>();
    for (int j = 0; j < ABORT_PER_PARTITION * ABORT_PARTITIONS; j++) {
      sent.add(producer.send(record(topic, j % ABORT_PARTITIONS, tag, base + j)));
    }
    producer.flush();
    return resolved(sent);
  }

  // ---------------------------------------------------------------- txn.fence

  /**
   * P1 writes r0 in an open transaction; P2 with the same transactional.id initializes, which
   * aborts r0 (one abort marker follows it) and fences P1, then commits r1. P1's next send or commit fails with
   * ProducerFencedException or InvalidProducerEpochException; read_committed sees r1 only,
   * read_uncommitted r0 and r1.
   */
  String fence() throws Exception {
    String topic = s.topicName("txn.fence");
    String txid = topic + "-tx";
    try (Admin admin = s.admin()) {
      createTopic(admin, topic, 1);
      List<TopicPartition> tps = partitions(topic, 1);
      RecordMetadata r0, r1;
      String firstFailure, commitFailure;
      try (KafkaProducer<byte[], byte[]> p1 = transactionalProducer(txid)) {
        p1.initTransactions();
        p1.beginTransaction();
        r0 = p1.send(record(topic, 0, "fence", 0)).get();
        try (KafkaProducer<byte[], byte[]> p2 = transactionalProducer(txid)) {
          p2.initTransactions();
          p2.beginTransaction();
          r1 = p2.send(record(topic, 0, "fence", 1)).get();
          p2.commitTransaction();
        }
        firstFailure = fencedFailure(() -> p1.send(record(topic, 0, "fence", 2)).get(), "P1's send after P2 initialized");
        commitFailure = fencedFailure(p1::commitTransaction, "P1's commit after P2 initialized");
      }
      // P2's InitProducerId aborted P1's transaction: one abort marker between r0 and r1.
      check(r1.offset() == r0.offset() + 2, "r1 at offset %d, r0 at %d: expected one abort marker between",
          r1.offset(), r0.offset());
      Map<Integer, List<ConsumerRecord<byte[], byte[]>>> rc = Scenarios.readAll(consumerProps("read_committed"), tps, 1);
      checkByValue(rc, List.of(r1), "read_committed");
      // r0 was aborted by P2's InitProducerId; P1's fenced send never reached the log.
      Map<Integer, List<ConsumerRecord<byte[], byte[]>>> ru = Scenarios.readAll(consumerProps("read_uncommitted"), tps, 2);
      checkByValue(ru, List.of(r0, r1), "read_uncommitted");
      Scenarios.deleteTopicQuietly(admin, topic);
      return String.format(
          "P1 fenced: send -> %s, commit -> %s; P2 committed r1 at %d; read_committed [r1], read_uncommitted [r0 r1]; %s",
          firstFailure, commitFailure, r1.offset(), transactionVersion(admin));
    }
  }

  /**
   * Runs a call that must fail because the producer is fenced; returns the fencing exception's
   * name. A call that succeeds or fails otherwise fails the scenario.
   */
  static String fencedFailure(FencedCall call, String what) {
    try {
      call.run();
    } catch (Exception e) {
      for (Throwable t = e; t != null; t = t.getCause()) {
        if (t instanceof ProducerFencedException || t instanceof InvalidProducerEpochException) {
          return t.getClass().getSimpleName();
        }
      }
      throw new AssertionError(what + ": " + Scenarios.describe(e) + ", expected ProducerFenced/InvalidProducerEpoch", e);
    }
    throw new AssertionError(what + " succeeded, expected ProducerFencedException or InvalidProducerEpochException");
  }

  /** A producer call expected to fail with the fencing error. */
  interface FencedCall {
    void run() throws Exception;
  }

  // ---------------------------------------------------------------- txn.offsets

  static final int OFFSETS_PARTITIONS = 3;
  static final int OFFSETS_PER_PARTITION = 20;
  /** The round whose transaction is aborted (0-based); its input is processed again afterwards. */
  static final int ABORTED_ROUND = 1;

  /**
   * Read-process-write: a group consumer (read_committed) reads input A in polls of at most 10
   * records; each poll's output goes to B and its offsets to the group through
   * sendOffsetsToTransaction(offsets, groupMetadata()), in one transaction per poll. Round 1 is
   * aborted: the group's offsets (OffsetFetch with requireStable) must not move, and the consumer
   * rewinds to the round's first offsets. Then B under read_committed holds every input record
   * exactly once in input order per partition, read_uncommitted also holds the aborted round's
   * output once more, and the group's offsets equal A's end offsets.
   */
  String offsets() throws Exception {
    String input = s.topicName("txn.offsets") + "-in";
    String output = s.topicName("txn.offsets") + "-out";
    String group = s.topicName("txn.offsets") + "-group";
    int n = OFFSETS_PARTITIONS * OFFSETS_PER_PARTITION;
    try (Admin admin = s.admin()) {
      createTopic(admin, input, OFFSETS_PARTITIONS);
      createTopic(admin, output, OFFSETS_PARTITIONS);
      try (KafkaProducer<byte[], byte[]> plain = new KafkaProducer<>(s.producerProps())) {
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        for (int i = 0; i < n; i++) sent.add(plain.send(record(input, i % OFFSETS_PARTITIONS, "in", i)));
        resolved(sent);
      }

      Map<TopicPartition, OffsetAndMetadata> committed = new HashMap<>();
      int rounds = 0;
      int abortedRecords = 0;
      String abortCheck = "";
      Properties c = s.groupConsumerProps(group);
      c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
      try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c);
          KafkaProducer<byte[], byte[]> producer = transactionalProducer(output + "-tx")) {
        producer.initTransactions();
        consumer.subscribe(List.of(input));
        int processed = 0;
        long lastProgressMs = System.currentTimeMillis();
        while (processed < n) {
          ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(500));
          if (records.isEmpty()) {
            check(System.currentTimeMillis() - lastProgressMs < WAIT_MS,
                "group consumer read %d of %d input records, then nothing for %d ms", processed, n, WAIT_MS);
            continue;
          }
          lastProgressMs = System.currentTimeMillis();
          Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
          Map<TopicPartition, Long> firsts = new HashMap<>();
          producer.beginTransaction();
          for (ConsumerRecord<byte[], byte[]> r : records) {
            TopicPartition tp = new TopicPartition(r.topic(), r.partition());
            firsts.putIfAbsent(tp, r.offset());
            next.put(tp, new OffsetAndMetadata(r.offset() + 1));
            producer.send(new ProducerRecord<>(output, r.partition(), r.key(), process(r.value())));
          }
          producer.sendOffsetsToTransaction(next, consumer.groupMetadata());
          if (rounds == ABORTED_ROUND) {
            // Flushed first: abortTransaction drops batches not yet sent, and the check below
            // counts the aborted round's records in the output log.
            producer.flush();
            producer.abortTransaction();
            abortedRecords = records.count();
            Map<TopicPartition, OffsetAndMetadata> stable = stableOffsets(admin, group, input);
            check(offsetsOnly(stable).equals(offsetsOnly(committed)),
                "OffsetFetch (requireStable) after the aborted round: %s, expected the offsets before it %s",
                summary(stable), summary(committed));
            abortCheck = "offsets after the aborted round of " + abortedRecords + " records unchanged " + summary(committed);
            firsts.forEach(consumer::seek);
          } else {
            producer.commitTransaction();
            committed.putAll(next);
            processed += records.count();
          }
          rounds++;
        }
      }
      check(rounds > ABORTED_ROUND + 1, "only %d rounds: the aborted round was the last", rounds);

      Map<TopicPartition, OffsetAndMetadata> finalOffsets = stableOffsets(admin, group, input);
      Map<TopicPartition, OffsetAndMetadata> expectedFinal = new HashMap<>();
      for (TopicPartition tp : partitions(input, OFFSETS_PARTITIONS)) {
        expectedFinal.put(tp, new OffsetAndMetadata(OFFSETS_PER_PARTITION));
      }
      check(offsetsOnly(finalOffsets).equals(offsetsOnly(expectedFinal)),
          "OffsetFetch (requireStable) at the end: %s, expected %d per partition", summary(finalOffsets), OFFSETS_PER_PARTITION);

      List<TopicPartition> outTps = partitions(output, OFFSETS_PARTITIONS);
      Map<Integer, List<ConsumerRecord<byte[], byte[]>>> rc = Scenarios.readAll(consumerProps("read_committed"), outTps, n);
      for (int p = 0; p < OFFSETS_PARTITIONS; p++) {
        List<ConsumerRecord<byte[], byte[]>> records = rc.getOrDefault(p, List.of());
        check(records.size() == OFFSETS_PER_PARTITION, "output partition %d: %d records under read_committed, expected %d",
            p, records.size(), OFFSETS_PER_PARTITION);
        for (int j = 0; j < records.size(); j++) {
          int i = j * OFFSETS_PARTITIONS + p;
          check(java.util.Arrays.equals(records.get(j).value(), process(Scenarios.bytes(Scenarios.value("in", i)))),
              "output partition %d position %d: %s, expected the output of input record %d (no duplicate, no gap)",
              p, j, Scenarios.str(records.get(j).key()), i);
        }
      }
      Map<Integer, List<ConsumerRecord<byte[], byte[]>>> ru =
          Scenarios.readAll(consumerProps("read_uncommitted"), outTps, n + abortedRecords);
      int seen = ru.values().stream().mapToInt(List::size).sum();
      check(seen == n + abortedRecords, "output under read_uncommitted: %d records, expected %d + %d aborted",
          seen, n, abortedRecords);
      deleteGroupQuietly(admin, group);
      Scenarios.deleteTopicQuietly(admin, input);
      Scenarios.deleteTopicQuietly(admin, output);
      return String.format(
          "%d input records in %d transactions (round %d aborted); %s; output read_committed exactly once in order, "
              + "read_uncommitted %d (+%d aborted); group offsets = end offsets %d; %s",
          n, rounds, ABORTED_ROUND, abortCheck, n + abortedRecords, abortedRecords, OFFSETS_PER_PARTITION,
          transactionVersion(admin));
    }
  }

  static byte[] process(byte[] value) {
    return Scenarios.bytes("out-" + Scenarios.str(value));
  }

  /** The group's committed offsets for the topic, waiting out pending transactional commits. */
  static Map<TopicPartition, OffsetAndMetadata> stableOffsets(Admin admin, String group, String topic) throws Exception {
    Map<TopicPartition, OffsetAndMetadata> all =
        admin.listConsumerGroupOffsets(group, new ListConsumerGroupOffsetsOptions().requireStable(true))
            .partitionsToOffsetAndMetadata().get();
    Map<TopicPartition, OffsetAndMetadata> out = new HashMap<>();
    all.forEach((tp, om) -> {
      if (tp.topic().equals(topic) && om != null) out.put(tp, om);
    });
    return out;
  }

  static Map<Integer, Long> offsetsOnly(Map<TopicPartition, OffsetAndMetadata> offsets) {
    Map<Integer, Long> out = new TreeMap<>();
    offsets.forEach((tp, om) -> out.put(tp.partition(), om.offset()));
    return out;
  }

  static String summary(Map<TopicPartition, OffsetAndMetadata> offsets) {
    return offsetsOnly(offsets).toString();
  }

  static void deleteGroupQuietly(Admin admin, String group) {
    try {
      admin.deleteConsumerGroups(List.of(group)).all().get();
    } catch (Exception e) {
      System.err.println("deleting group " + group + ": " + Scenarios.describe(e));
    }
  }

  // ---------------------------------------------------------------- shared steps

  KafkaProducer<byte[], byte[]> transactionalProducer(String transactionalId) {
    Properties p = s.producerProps();
    p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
    return new KafkaProducer<>(p);
  }

  Properties consumerProps(String isolation) {
    Properties p = s.assignConsumerProps();
    p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
    return p;
  }

  static void createTopic(Admin admin, String topic, int partitions) throws Exception {
    Scenarios.createTopic(admin, topic, partitions);
    // Kafka answers NOT_LEADER_OR_FOLLOWER for a moment after CreateTopics.
    GroupScenarios.awaitPartitionsReady(admin, topic, partitions);
  }

  static List<TopicPartition> partitions(String topic, int n) {
    List<TopicPartition> tps = new ArrayList<>();
    for (int p = 0; p < n; p++) tps.add(new TopicPartition(topic, p));
    return tps;
  }

  /** Record i: key-i and the value of tag and i, to the given partition. */
  static ProducerRecord<byte[], byte[]> record(String topic, int partition, String tag, int i) {
    return new ProducerRecord<>(topic, partition, Scenarios.bytes(Scenarios.key(i)), Scenarios.bytes(Scenarios.value(tag, i)));
  }

  static List<RecordMetadata> resolved(List<Future<RecordMetadata>> futures) throws Exception {
    List<RecordMetadata> out = new ArrayList<>();
    for (Future<RecordMetadata> f : futures) {
      try {
        out.add(f.get());
      } catch (ExecutionException e) {
        throw new AssertionError("Produce: " + Scenarios.describe(e.getCause()), e.getCause());
      }
    }
    return out;
  }

  @SafeVarargs
  static List<RecordMetadata> concat(List<RecordMetadata>... lists) {
    List<RecordMetadata> out = new ArrayList<>();
    for (List<RecordMetadata> l : lists) out.addAll(l);
    return out;
  }

  static long firstOffset(List<RecordMetadata> acks, int partition) {
    return acks.stream().filter(m -> m.partition() == partition).mapToLong(RecordMetadata::offset).min().orElseThrow();
  }

  static long lastOffset(List<RecordMetadata> acks, int partition) {
    return acks.stream().filter(m -> m.partition() == partition).mapToLong(RecordMetadata::offset).max().orElseThrow();
  }

  /**
   * The records read are exactly the acknowledged ones: per partition, at the acknowledged
   * offsets in order, with key-i and the value of tag and i, where i is the record's position in acks.
   */
  static void checkRecords(Map<Integer, List<ConsumerRecord<byte[], byte[]>>> read, List<RecordMetadata> acks, String tag) {
    Map<Integer, List<Integer>> expected = new TreeMap<>();
    for (int k = 0; k < acks.size(); k++) expected.computeIfAbsent(acks.get(k).partition(), x -> new ArrayList<>()).add(k);
    for (var e : expected.entrySet()) {
      int p = e.getKey();
      List<ConsumerRecord<byte[], byte[]>> records = read.getOrDefault(p, List.of());
      check(records.size() == e.getValue().size(), "partition %d: read %d records, expected %d", p, records.size(),
          e.getValue().size());
      for (int j = 0; j < records.size(); j++) {
        int k = e.getValue().get(j);
        int i = k;
        ConsumerRecord<byte[], byte[]> r = records.get(j);
        check(r.offset() == acks.get(k).offset(), "partition %d: record %d read at offset %d, acknowledged at %d", p, i,
            r.offset(), acks.get(k).offset());
        check(java.util.Arrays.equals(r.key(), Scenarios.bytes(Scenarios.key(i)))
                && java.util.Arrays.equals(r.value(), Scenarios.bytes(Scenarios.value(tag, i))),
            "partition %d offset %d: key %s, expected record %d of %s", p, r.offset(), Scenarios.str(r.key()), i, tag);
      }
    }
  }

  /**
   * The records read are exactly the acknowledged ones, matched by offset: per partition the
   * offsets read equal the acknowledged offsets in order, and each record's value is the one
   * sent there (values name their transaction, so a record of the wrong transaction is caught).
   */
  static void checkByValue(Map<Integer, List<ConsumerRecord<byte[], byte[]>>> read, List<RecordMetadata> acks, String what) {
    Map<Integer, List<Long>> expected = new TreeMap<>();
    for (RecordMetadata md : acks) expected.computeIfAbsent(md.partition(), x -> new ArrayList<>()).add(md.offset());
    expected.values().forEach(l -> l.sort(Long::compare));
    for (var e : expected.entrySet()) {
      List<Long> offsets = new ArrayList<>();
      for (ConsumerRecord<byte[], byte[]> r : read.getOrDefault(e.getKey(), List.of())) offsets.add(r.offset());
      check(offsets.equals(e.getValue()), "%s partition %d: read offsets %s, expected %s", what, e.getKey(), offsets,
          e.getValue());
    }
    check(expected.keySet().containsAll(read.keySet()), "%s: records from partitions %s, expected only %s", what,
        read.keySet(), expected.keySet());
  }

  /** Waits until the consumer's endOffsets (under that isolation level) equal expected. */
  void awaitEndOffsets(List<TopicPartition> tps, String isolation, long[] expected, String when) throws Exception {
    try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerProps(isolation))) {
      long deadlineMs = System.currentTimeMillis() + WAIT_MS;
      long[] seen = new long[tps.size()];
      while (true) {
        Map<TopicPartition, Long> ends = consumer.endOffsets(tps);
        for (int p = 0; p < tps.size(); p++) seen[p] = ends.get(tps.get(p));
        if (java.util.Arrays.equals(seen, expected)) return;
        check(System.currentTimeMillis() < deadlineMs, "%s endOffsets %s: %s, expected %s (within %d ms)", isolation, when,
            java.util.Arrays.toString(seen), java.util.Arrays.toString(expected), WAIT_MS);
        Thread.sleep(100);
      }
    }
  }

  /** The positions an assigned consumer reaches with seekToEnd, as "[p0, p1, ...]". */
  String seekToEndPositions(List<TopicPartition> tps, String isolation) {
    try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerProps(isolation))) {
      consumer.assign(tps);
      consumer.seekToEnd(tps);
      long[] positions = new long[tps.size()];
      for (int p = 0; p < tps.size(); p++) positions[p] = consumer.position(tps.get(p));
      return java.util.Arrays.toString(positions);
    }
  }

  /** The transaction.version the broker finalizes (the client uses 2 iff it is 2), for the detail. */
  static String transactionVersion(Admin admin) {
    try {
      FinalizedVersionRange range = admin.describeFeatures().featureMetadata().get().finalizedFeatures().get("transaction.version");
      return range == null ? "transaction.version not finalized (TV1)" : "transaction.version " + range.maxVersionLevel();
    } catch (Exception e) {
      return "transaction.version unknown (" + Scenarios.describe(e) + ")";
    }
  }

  static void check(boolean condition, String format, Object... args) {
    Scenarios.check(condition, format, args);
  }
}
