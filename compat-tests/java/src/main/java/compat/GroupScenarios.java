package compat;

import java.time.Duration;
import java.util.ArrayList;
import java.util.BitSet;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.BooleanSupplier;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.CloseOptions;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.RangeAssignor;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.RebalanceInProgressException;
import org.apache.kafka.common.errors.RetriableException;
import org.apache.kafka.common.errors.WakeupException;

/**
 * The consumer-group scenarios of the Java family (issue 5): group.rebalance.* (members leave and
 * join while records flow; nothing committed is delivered again, everything is processed, the
 * committed offsets end at the log end) and group.rebalance.time.* (how long 10 members take to
 * all hold partitions).
 */
final class GroupScenarios {
  static final int PARTITIONS = 6;
  /** Records per produce phase; phase 2 starts only after the membership change. */
  static final int PHASE_RECORDS = 3000;
  /** Produce rate of each phase: 3000 records take about 6 s, so the change happens mid-stream. */
  static final int RECORDS_PER_SECOND = 500;
  /** The membership change waits for this many processed records (of phase 1). */
  static final int CHANGE_AFTER_RECORDS = 1000;
  static final int SESSION_TIMEOUT_MS = 10_000;
  static final int HEARTBEAT_INTERVAL_MS = 1_000;
  /** Bound of each wait inside a scenario; the runner bounds the whole scenario at 90 s. */
  static final long STABLE_WAIT_MS = 30_000;
  static final long DRAIN_WAIT_MS = 30_000;
  static final int TIME_MEMBERS = 10;
  static final int TIME_PARTITIONS = 12;
  static final long TIME_BOUND_MS = 60_000;

  enum Variant {
    RANGE,
    COOPERATIVE,
    STATIC,
    CONSUMER
  }

  private final Scenarios s;

  GroupScenarios(Scenarios s) {
    this.s = s;
  }

  /**
   * What the group did to the topic: per partition the highest committed offset (taken when a
   * commitSync returned) and every processed offset. A delivery below the committed offset of its
   * moment is a violation; one at or above it that was processed before is a duplicate (allowed).
   */
  static final class Tracker {
    final long[] committed = new long[PARTITIONS];
    final BitSet[] processed = new BitSet[PARTITIONS];
    final List<String> violations = new ArrayList<>();
    final AtomicReference<Throwable> memberError = new AtomicReference<>();
    int unique;
    int duplicates;
    int commitFailures;

    Tracker() {
      for (int p = 0; p < PARTITIONS; p++) processed[p] = new BitSet();
    }

    synchronized void deliver(String member, int partition, long offset) {
      if (offset < committed[partition]) {
        if (violations.size() < 5) {
          violations.add(String.format(
              "%s got partition %d offset %d below the committed %d", member, partition, offset, committed[partition]));
        } else {
          violations.add("...");
        }
      }
      if (processed[partition].get((int) offset)) {
        duplicates++;
      } else {
        processed[partition].set((int) offset);
        unique++;
      }
    }

    synchronized void committed(Map<TopicPartition, OffsetAndMetadata> offsets) {
      offsets.forEach((tp, om) -> committed[tp.partition()] = Math.max(committed[tp.partition()], om.offset()));
    }

    synchronized void commitFailed() {
      commitFailures++;
    }

    synchronized int unique() {
      return unique;
    }

    synchronized boolean committedAtEnd(long[] logEnd) {
      for (int p = 0; p < PARTITIONS; p++) if (committed[p] != logEnd[p]) return false;
      return true;
    }

    synchronized String committedString() {
      return java.util.Arrays.toString(committed);
    }
  }

  /**
   * One member of the group on its own thread and its own KafkaConsumer: polls, processes (records
   * the delivery), commits the processed offsets synchronously after every poll, and tracks what it
   * owns through its rebalance listener.
   */
  class Member implements Runnable, ConsumerRebalanceListener {
    final String name;
    final Properties props;
    final String topic;
    final Tracker tracker;
    /** Concurrent: the main thread reads it while the listener (member thread) changes it. */
    final Set<TopicPartition> owned = java.util.concurrent.ConcurrentHashMap.newKeySet();
    final AtomicInteger assignedCalls = new AtomicInteger();
    final AtomicInteger revokedCalls = new AtomicInteger();
    final AtomicInteger processedCount = new AtomicInteger();
    volatile boolean stop;
    volatile boolean leaveOnClose;
    final Thread thread;
    final CountDownLatch closed = new CountDownLatch(1);

    Member(String name, Properties props, String topic, Tracker tracker) {
      this.name = name;
      this.props = props;
      this.topic = topic;
      this.tracker = tracker;
      this.thread = new Thread(this, "member-" + name);
      this.thread.setDaemon(true);
    }

    void start() {
      thread.start();
    }

    Set<TopicPartition> owned() {
      return new HashSet<>(owned);
    }

    @Override
    public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
      System.err.println(java.time.Instant.now() + " member " + name + ": assigned " + partitions);
      if (!partitions.isEmpty()) assignedCalls.incrementAndGet();
      owned.addAll(partitions);
    }

    @Override
    public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
      System.err.println(java.time.Instant.now() + " member " + name + ": revoked " + partitions);
      if (!partitions.isEmpty()) revokedCalls.incrementAndGet();
      owned.removeAll(partitions);
    }

    @Override
    public void onPartitionsLost(Collection<TopicPartition> partitions) {
      if (!partitions.isEmpty()) revokedCalls.incrementAndGet();
      owned.removeAll(partitions);
    }

    @Override
    public void run() {
      try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
        try {
          consumer.subscribe(List.of(topic), this);
          Map<TopicPartition, OffsetAndMetadata> pending = new HashMap<>();
          while (!stop) {
            ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(200));
            for (ConsumerRecord<byte[], byte[]> r : records) {
              tracker.deliver(name, r.partition(), r.offset());
              processedCount.incrementAndGet();
              pending.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
            }
            // A refused commit stays pending and is retried after the next poll, for the
            // partitions this member still owns (the next owner of a revoked one reprocesses).
            pending.keySet().retainAll(consumer.assignment());
            if (pending.isEmpty()) continue;
            Map<TopicPartition, OffsetAndMetadata> toCommit = new HashMap<>(pending);
            try {
              consumer.commitSync(toCommit, Duration.ofSeconds(10));
              tracker.committed(toCommit);
              pending.clear();
            } catch (RebalanceInProgressException | RetriableException
                | org.apache.kafka.clients.consumer.CommitFailedException e) {
              // A commit refused around a rebalance leaves these records above the last commit:
              // the next owner may process them again, which the scenario allows and counts.
              System.err.println(java.time.Instant.now() + " member " + name + ": commit failed: " + e);
              tracker.commitFailed();
            }
          }
        } finally {
          // DEFAULT: a static member stays in the group (its restart must not rebalance);
          // LEAVE_GROUP at the end of a scenario, so the group is empty and can be deleted.
          consumer.close(CloseOptions.groupMembershipOperation(
                  leaveOnClose ? CloseOptions.GroupMembershipOperation.LEAVE_GROUP : CloseOptions.GroupMembershipOperation.DEFAULT)
              .withTimeout(Duration.ofSeconds(10)));
        }
      } catch (WakeupException e) {
        // stop() woke a blocked poll; closing is all that is left.
      } catch (Throwable t) {
        tracker.memberError.compareAndSet(null, new AssertionError("member " + name + ": " + Scenarios.describe(t), t));
      } finally {
        closed.countDown();
      }
    }

    /** Asks the member to leave (close) and waits for it, bounded. */
    void stopAndWait() throws InterruptedException {
      stop = true;
      if (!closed.await(20, TimeUnit.SECONDS)) {
        throw new AssertionError("member " + name + " did not close within 20 s (LeaveGroup/heartbeat)");
      }
    }
  }

  /**
   * Waits until ListOffsets answers for every partition of a new topic. Right after CreateTopics,
   * Kafka answers NOT_LEADER_OR_FOLLOWER for a moment; on a loaded machine the idempotent producer
   * then once got stuck resending sequence 0 of a partition that already held its batches
   * (OutOfOrderSequenceException until the delivery timeout), failing the scenario on Kafka.
   */
  static void awaitPartitionsReady(Admin admin, String topic, int partitions) throws Exception {
    Map<TopicPartition, org.apache.kafka.clients.admin.OffsetSpec> latest = new HashMap<>();
    for (int p = 0; p < partitions; p++) latest.put(new TopicPartition(topic, p), org.apache.kafka.clients.admin.OffsetSpec.latest());
    long deadlineMs = System.currentTimeMillis() + Scenarios.API_TIMEOUT_MS;
    while (true) {
      try {
        admin.listOffsets(latest).all().get(Scenarios.API_TIMEOUT_MS, TimeUnit.MILLISECONDS);
        return;
      } catch (java.util.concurrent.ExecutionException e) {
        if (System.currentTimeMillis() > deadlineMs) {
          throw new AssertionError("ListOffsets on the new topic " + topic + ": " + Scenarios.describe(e), e);
        }
        Thread.sleep(200);
      }
    }
  }

  /**
   * The stream's producer: acks=all, one request in flight, no idempotence. On a loaded machine a
   * produce request of the idempotent producer once timed out after Kafka had appended it; the
   * retry of sequence 0 was then out of Kafka's 5-batch window and was refused with
   * OutOfOrderSequenceException until the delivery timeout. The scenario is about the group, and a
   * duplicate in the log is just one more offset to process.
   */
  Properties rebalanceProducerProps() {
    Properties p = s.producerProps();
    p.put(org.apache.kafka.clients.producer.ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, false);
    p.put(org.apache.kafka.clients.producer.ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, 1);
    p.put(org.apache.kafka.clients.producer.ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, 45_000);
    return p;
  }

  Properties memberProps(String group, Variant variant, String instanceId) {
    Properties p = s.groupConsumerProps(group);
    p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 100);
    if (variant == Variant.CONSUMER) {
      // KIP-848: the broker owns session timeout, heartbeat interval and the assignor.
      p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "consumer");
    } else {
      p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "classic");
      p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, SESSION_TIMEOUT_MS);
      p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, HEARTBEAT_INTERVAL_MS);
      p.put(
          ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG,
          variant == Variant.COOPERATIVE ? CooperativeStickyAssignor.class.getName() : RangeAssignor.class.getName());
    }
    if (instanceId != null) p.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, instanceId);
    return p;
  }

  static void await(java.util.function.Supplier<String> what, long boundMs, Tracker tracker, BooleanSupplier done)
      throws InterruptedException {
    long deadlineMs = System.currentTimeMillis() + boundMs;
    while (!done.getAsBoolean()) {
      Throwable error = tracker.memberError.get();
      if (error != null) throw new AssertionError(error.getMessage(), error);
      if (System.currentTimeMillis() > deadlineMs) throw new AssertionError(what.get() + " (waited " + boundMs / 1000 + " s)");
      Thread.sleep(50);
    }
  }

  /** Every member holds partitions, no partition is held twice, and all partitions are held. */
  static boolean fullyAssigned(List<Member> members, int partitions) {
    Set<TopicPartition> union = new HashSet<>();
    int total = 0;
    for (Member m : members) {
      Set<TopicPartition> owned = m.owned();
      if (owned.isEmpty()) return false;
      union.addAll(owned);
      total += owned.size();
    }
    return union.size() == partitions && total == partitions;
  }

  static String assignments(List<Member> members) {
    StringBuilder sb = new StringBuilder();
    for (Member m : members) {
      TreeSet<Integer> ps = new TreeSet<>();
      for (TopicPartition tp : m.owned()) ps.add(tp.partition());
      sb.append(sb.length() == 0 ? "" : " ").append(m.name).append('=').append(ps);
    }
    return sb.toString();
  }

  /** Produces records [from, from + n) at RECORDS_PER_SECOND; returns after every ack. */
  static void producePhase(KafkaProducer<byte[], byte[]> producer, String topic, int from, int n, long[] logEnd)
      throws Exception {
    List<java.util.concurrent.Future<RecordMetadata>> acks = new ArrayList<>();
    long startMs = System.currentTimeMillis();
    for (int i = from; i < from + n; i++) {
      acks.add(producer.send(new ProducerRecord<>(topic, Scenarios.bytes(Scenarios.key(i)), Scenarios.bytes("rebalance-" + i))));
      long dueMs = startMs + (long) (i - from + 1) * 1000 / RECORDS_PER_SECOND;
      long waitMs = dueMs - System.currentTimeMillis();
      if (waitMs > 0) Thread.sleep(waitMs);
    }
    for (var ack : acks) {
      RecordMetadata md = ack.get(30, TimeUnit.SECONDS);
      synchronized (logEnd) {
        logEnd[md.partition()] = Math.max(logEnd[md.partition()], md.offset() + 1);
      }
    }
  }

  String rebalance(Variant variant) throws Exception {
    String id = "group.rebalance." + variant.name().toLowerCase();
    String topic = s.topicName(id);
    String group = topic + "-group";
    Tracker tracker = new Tracker();
    long[] logEnd = new long[PARTITIONS];
    List<Member> all = new ArrayList<>();
    try (Admin admin = s.admin();
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(rebalanceProducerProps())) {
      Scenarios.createTopic(admin, topic, PARTITIONS);
      awaitPartitionsReady(admin, topic, PARTITIONS);
      String staticId = variant == Variant.STATIC ? "static-" + s.runId : null;
      Member m1 = new Member("m1", memberProps(group, variant, staticId), topic, tracker);
      Member m2 = new Member("m2", memberProps(group, variant, null), topic, tracker);
      Member m3 = new Member("m3", memberProps(group, variant, null), topic, tracker);
      all.addAll(List.of(m1, m2, m3));

      // Phase 1 flows while the three members join.
      Thread phase1 = new Thread(() -> {
        try {
          producePhase(producer, topic, 0, PHASE_RECORDS, logEnd);
        } catch (Exception e) {
          tracker.memberError.compareAndSet(null, new AssertionError("Produce phase 1: " + Scenarios.describe(e), e));
        }
      }, "produce-phase-1");
      phase1.setDaemon(true);
      phase1.start();
      for (Member m : List.of(m1, m2, m3)) m.start();
      // The change waits for a stable 3-member assignment and some processed records, so it lands
      // in the middle of the stream whatever the speed of the joins.
      await(() -> "3 members never held all 6 partitions between them while processing (" + assignments(List.of(m1, m2, m3))
              + ", " + tracker.unique() + " processed)",
          STABLE_WAIT_MS, tracker, () -> fullyAssigned(List.of(m1, m2, m3), PARTITIONS) && tracker.unique() >= CHANGE_AFTER_RECORDS);
      String before = assignments(List.of(m1, m2, m3));

      // Mid-stream: m1 leaves (closes) and a new member joins; for the static variant the new
      // member is m1 restarted with the same group.instance.id, which must not rebalance the rest.
      int m2Assigned = m2.assignedCalls.get(), m3Assigned = m3.assignedCalls.get();
      int m2Revoked = m2.revokedCalls.get(), m3Revoked = m3.revokedCalls.get();
      Set<TopicPartition> m1Owned = m1.owned();
      int unique1 = tracker.unique();
      m1.stopAndWait();
      Member m4 = new Member(variant == Variant.STATIC ? "m1'" : "m4", memberProps(group, variant, staticId), topic, tracker);
      all.add(m4);
      m4.start();
      List<Member> after = List.of(m2, m3, m4);
      await(() -> "after m1 left and " + m4.name + " joined, the members never held all 6 partitions: " + assignments(after),
          STABLE_WAIT_MS, tracker, () -> fullyAssigned(after, PARTITIONS));
      phase1.join(30_000);
      producePhase(producer, topic, PHASE_RECORDS, PHASE_RECORDS, logEnd);
      long logEndSum;
      synchronized (logEnd) {
        logEndSum = java.util.Arrays.stream(logEnd).sum();
      }
      final long total = logEndSum;
      Scenarios.check(total >= 2 * PHASE_RECORDS, "log end offsets %s sum to %d, %d produced",
          java.util.Arrays.toString(logEnd), total, 2 * PHASE_RECORDS);
      await(() -> "processed " + tracker.unique() + " of " + total + " records", DRAIN_WAIT_MS, tracker,
          () -> tracker.unique() >= total);
      await(() -> "committed offsets " + tracker.committedString() + " never reached the log end offsets "
          + java.util.Arrays.toString(logEnd), DRAIN_WAIT_MS, tracker, () -> tracker.committedAtEnd(logEnd));
      String afterAssignments = assignments(after);
      String staticDetail = "";
      if (variant == Variant.STATIC) {
        Scenarios.check(m4.owned().equals(m1Owned), "static member restarted with %s, held %s before", m4.owned(), m1Owned);
        Scenarios.check(
            m2.assignedCalls.get() == m2Assigned && m3.assignedCalls.get() == m3Assigned
                && m2.revokedCalls.get() == m2Revoked && m3.revokedCalls.get() == m3Revoked,
            "the static restart rebalanced the others: m2 assigned %d->%d revoked %d->%d, m3 assigned %d->%d revoked %d->%d",
            m2Assigned, m2.assignedCalls.get(), m2Revoked, m2.revokedCalls.get(),
            m3Assigned, m3.assignedCalls.get(), m3Revoked, m3.revokedCalls.get());
        staticDetail = ", static restart kept " + m1Owned.size() + " partitions and rebalanced nobody";
      }
      for (Member m : after) {
        m.leaveOnClose = true;
        m.stopAndWait();
      }
      synchronized (tracker) {
        Scenarios.check(tracker.violations.isEmpty(), "redelivered below the committed offset: %s", tracker.violations);
        for (int p = 0; p < PARTITIONS; p++) {
          int cardinality = tracker.processed[p].cardinality();
          Scenarios.check(cardinality == logEnd[p] && tracker.processed[p].nextClearBit(0) == logEnd[p],
              "partition %d: processed %d distinct offsets, log end %d", p, cardinality, logEnd[p]);
        }
      }
      Map<TopicPartition, OffsetAndMetadata> committed =
          admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get(Scenarios.API_TIMEOUT_MS, TimeUnit.MILLISECONDS);
      for (int p = 0; p < PARTITIONS; p++) {
        OffsetAndMetadata om = committed.get(new TopicPartition(topic, p));
        Scenarios.check(om != null && om.offset() == logEnd[p],
            "OffsetFetch partition %d: committed %s, log end %d", p, om, logEnd[p]);
      }
      try {
        admin.deleteConsumerGroups(List.of(group)).all().get(Scenarios.API_TIMEOUT_MS, TimeUnit.MILLISECONDS);
      } catch (Exception e) {
        System.err.println(id + ": deleting group " + group + ": " + Scenarios.describe(e));
      }
      Scenarios.deleteTopicQuietly(admin, topic);
      return String.format(
          "%d records all processed (%d before the change), %d duplicates above the last commit, %d refused commits, "
              + "0 below a commit; commitSync after every poll; before %s; after %s; %s processed %d; "
              + "committed = log end %s%s",
          total, unique1, tracker.duplicates, tracker.commitFailures, before, afterAssignments, m4.name,
          m4.processedCount.get(), java.util.Arrays.toString(logEnd), staticDetail);
    } finally {
      for (Member m : all) m.stop = true;
    }
  }

  String rebalanceTime(boolean consumerProtocol) throws Exception {
    String id = "group.rebalance.time." + (consumerProtocol ? "consumer" : "classic");
    String topic = s.topicName(id);
    String group = topic + "-group";
    Tracker tracker = new Tracker();
    List<Member> members = new ArrayList<>();
    try (Admin admin = s.admin()) {
      Scenarios.createTopic(admin, topic, TIME_PARTITIONS);
      awaitPartitionsReady(admin, topic, TIME_PARTITIONS);
      CountDownLatch go = new CountDownLatch(1);
      AtomicReference<Long> allAssignedNs = new AtomicReference<>();
      for (int i = 0; i < TIME_MEMBERS; i++) {
        Properties p = memberProps(group, consumerProtocol ? Variant.CONSUMER : Variant.RANGE, null);
        members.add(new Member("t" + i, p, topic, tracker) {
          @Override
          public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
            super.onPartitionsAssigned(partitions);
            if (allAssignedNs.get() == null && members.stream().allMatch(m -> !m.owned().isEmpty())) {
              allAssignedNs.compareAndSet(null, System.nanoTime());
            }
          }
        });
      }
      // The clock starts at the first subscribe: every member thread is created before it.
      long startNs = System.nanoTime();
      for (Member m : members) m.start();
      await(() -> "after " + TIME_BOUND_MS / 1000 + " s not all 10 members held partitions: " + assignments(members),
          TIME_BOUND_MS, tracker, () -> allAssignedNs.get() != null);
      long ms = (allAssignedNs.get() - startNs) / 1_000_000;
      String detail = String.format("%d ms from the first subscribe until all %d members held partitions (%d partitions, %s)",
          ms, TIME_MEMBERS, TIME_PARTITIONS, consumerProtocol ? "group.protocol=consumer" : "classic, range");
      for (Member m : members) m.stop = true;
      for (Member m : members) m.stopAndWait();
      try {
        admin.deleteConsumerGroups(List.of(group)).all().get(Scenarios.API_TIMEOUT_MS, TimeUnit.MILLISECONDS);
      } catch (Exception e) {
        System.err.println(id + ": deleting group " + group + ": " + Scenarios.describe(e));
      }
      Scenarios.deleteTopicQuietly(admin, topic);
      return detail;
    } finally {
      for (Member m : members) m.stop = true;
    }
  }
}
