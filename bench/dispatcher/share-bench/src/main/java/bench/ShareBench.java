package bench;

import java.time.Duration;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The share-group half of bench/dispatcher.sh: N worker threads, each owning a
 * KafkaShareConsumer in one share group with explicit acknowledgement, loop
 * poll -> acknowledge(record, ACCEPT) for every record -> commit, until M
 * acknowledgements have been confirmed by the broker in total.
 *
 * <p>Only confirmed acknowledgements count: with --commit sync (the default)
 * those of the partitions commitSync() reports without an error, with --commit
 * async those the acknowledgement commit callback reports without an
 * exception. sync is the default because it is what a worker that must know
 * its work is settled does (the same as the dispatcher's load generator, which
 * waits for the ack response and counts "ok" receipts only); async lets the
 * next poll overlap the commit and is there to show what that is worth.
 *
 * <p>The last line on stdout is one RESULT line of key=value pairs, the same
 * keys as bench/dispatcher/loadgen prints, which bench/dispatcher/report.py reads.
 * The rate is measured from the first non-empty poll of any worker to the
 * moment the M-th acknowledgement was confirmed, so the group join is left
 * out (it is reported as first_message_ms).
 */
public final class ShareBench {
    private static final String USAGE = String.join("\n",
        "usage: ShareBench --bootstrap HOST:PORT --topic T --group G --workers N --messages M",
        "                  [--batch B] [--timeout-s S] [--commit sync|async]",
        "  --batch      max.poll.records of every consumer (default 100)",
        "  --timeout-s  give up after S seconds, print what was acknowledged, exit 1 (default 300)",
        "  --commit     sync: commitSync() after each poll's acknowledgements (default);",
        "               async: commitAsync(), confirmations counted by the commit callback");

    private final String bootstrap;
    private final String topic;
    private final String group;
    private final int workers;
    private final long messages;
    private final int batch;
    private final long timeoutNs;
    private final boolean commitSync;

    private final AtomicLong acked = new AtomicLong();
    private final AtomicLong failed = new AtomicLong();
    private final AtomicLong redelivered = new AtomicLong();
    private final AtomicLong cycles = new AtomicLong();
    private final AtomicLong firstMessageNs = new AtomicLong();
    private final AtomicLong doneNs = new AtomicLong();
    private final AtomicReference<Throwable> workerError = new AtomicReference<>();
    private volatile boolean stop;
    private long startNs;

    private ShareBench(Map<String, String> args) {
        bootstrap = required(args, "bootstrap");
        topic = required(args, "topic");
        group = required(args, "group");
        workers = Integer.parseInt(required(args, "workers"));
        messages = Long.parseLong(required(args, "messages"));
        batch = Integer.parseInt(args.getOrDefault("batch", "100"));
        timeoutNs = Duration.ofSeconds(Long.parseLong(args.getOrDefault("timeout-s", "300"))).toNanos();
        String commit = args.getOrDefault("commit", "sync");
        if (!commit.equals("sync") && !commit.equals("async")) {
            throw new IllegalArgumentException("--commit must be sync or async, not " + commit);
        }
        commitSync = commit.equals("sync");
        if (workers < 1 || messages < 1 || batch < 1) {
            throw new IllegalArgumentException("--workers, --messages and --batch must be at least 1");
        }
    }

    public static void main(String[] argv) throws InterruptedException {
        ShareBench bench;
        try {
            bench = new ShareBench(parse(argv));
        } catch (IllegalArgumentException e) {
            System.err.println(e.getMessage());
            System.err.println(USAGE);
            System.exit(2);
            return;
        }
        System.exit(bench.run());
    }

    private int run() throws InterruptedException {
        startNs = System.nanoTime();
        Thread[] threads = new Thread[workers];
        long[][] latencies = new long[workers][];
        for (int i = 0; i < workers; i++) {
            final int id = i;
            threads[i] = new Thread(() -> latencies[id] = work(id), "share-bench-w" + i);
            threads[i].start();
        }
        long deadline = startNs + timeoutNs;
        for (Thread t : threads) {
            long left = deadline - System.nanoTime();
            if (left > 0) {
                t.join(Math.max(1, left / 1_000_000));
            }
            if (System.nanoTime() >= deadline) {
                stop = true;
            }
        }
        stop = true;
        // A worker stuck past the deadline still gets its close() bound (5 s).
        for (Thread t : threads) {
            t.join(10_000);
        }
        return report(latencies);
    }

    /** One worker: its own consumer, poll -> acknowledge -> commit until stopped. */
    private long[] work(int id) {
        LongList latencyNs = new LongList();
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, "share-bench-w" + id);
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.SHARE_ACKNOWLEDGEMENT_MODE_CONFIG, "explicit");
        props.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, Integer.toString(batch));
        try (KafkaShareConsumer<byte[], byte[]> consumer = new KafkaShareConsumer<>(props)) {
            if (!commitSync) {
                consumer.setAcknowledgementCommitCallback((offsets, exception) -> {
                    long n = offsets.values().stream().mapToLong(Set::size).sum();
                    if (exception == null) {
                        confirm(n);
                    } else {
                        failed.addAndGet(n);
                    }
                });
            }
            consumer.subscribe(List.of(topic));
            while (!stop) {
                long cycleStart = System.nanoTime();
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofSeconds(1));
                if (records.isEmpty()) {
                    continue;
                }
                firstMessageNs.compareAndSet(0, System.nanoTime());
                Map<TopicPartition, Long> perPartition = new HashMap<>();
                for (ConsumerRecord<byte[], byte[]> record : records) {
                    consumer.acknowledge(record, AcknowledgeType.ACCEPT);
                    perPartition.merge(new TopicPartition(record.topic(), record.partition()), 1L, Long::sum);
                    if (record.deliveryCount().orElse((short) 1) > 1) {
                        redelivered.incrementAndGet();
                    }
                }
                if (commitSync) {
                    countConfirmed(consumer.commitSync(), perPartition);
                } else {
                    consumer.commitAsync();
                }
                latencyNs.add(System.nanoTime() - cycleStart);
                cycles.incrementAndGet();
            }
            consumer.close(Duration.ofSeconds(5));
        } catch (Throwable t) {
            workerError.compareAndSet(null, t);
            stop = true;
        }
        return latencyNs.toArray();
    }

    /** Adds the records of every partition whose acknowledgement commit succeeded. */
    private void countConfirmed(Map<TopicIdPartition, Optional<KafkaException>> results,
                                Map<TopicPartition, Long> perPartition) {
        for (Map.Entry<TopicIdPartition, Optional<KafkaException>> e : results.entrySet()) {
            Long n = perPartition.get(e.getKey().topicPartition());
            if (n == null) {
                continue;
            }
            if (e.getValue().isEmpty()) {
                confirm(n);
            } else {
                failed.addAndGet(n);
            }
        }
    }

    private void confirm(long n) {
        long after = acked.addAndGet(n);
        if (after >= messages && after - n < messages) {
            doneNs.set(System.nanoTime());
            stop = true;
        }
    }

    private int report(long[][] latencies) {
        long total = 0;
        for (long[] l : latencies) {
            total += l == null ? 0 : l.length;
        }
        long[] all = new long[(int) total];
        int at = 0;
        for (long[] l : latencies) {
            if (l != null) {
                System.arraycopy(l, 0, all, at, l.length);
                at += l.length;
            }
        }
        Arrays.sort(all);
        long first = firstMessageNs.get();
        long end = doneNs.get() != 0 ? doneNs.get() : System.nanoTime();
        long ackedNow = acked.get();
        long counted = doneNs.get() != 0 ? messages : ackedNow;
        double elapsedS = first == 0 ? 0 : (end - first) / 1e9;
        String status = doneNs.get() != 0 ? "ok" : workerError.get() != null ? "error" : "timeout";
        if (workerError.get() != null) {
            System.err.println("a worker failed: " + workerError.get());
            workerError.get().printStackTrace();
        }
        System.out.printf("RESULT status=%s workers=%d batch=%d commit=%s acked=%d counted=%d elapsed_s=%.3f"
                + " msgs_per_s=%.1f p50_ms=%.2f p99_ms=%.2f cycles=%d redelivered=%d failed=%d"
                + " first_message_ms=%.0f%n",
            status, workers, batch, commitSync ? "sync" : "async", ackedNow, counted, elapsedS,
            elapsedS > 0 ? counted / elapsedS : 0.0, percentileMs(all, 0.50), percentileMs(all, 0.99),
            cycles.get(), redelivered.get(), failed.get(),
            first == 0 ? -1.0 : (first - startNs) / 1e6);
        return status.equals("ok") ? 0 : 1;
    }

    /** Nearest-rank percentile of sorted nanosecond samples, in ms (NaN when there are none). */
    private static double percentileMs(long[] sorted, double q) {
        if (sorted.length == 0) {
            return Double.NaN;
        }
        int rank = (int) Math.ceil(q * sorted.length);
        return sorted[Math.max(0, rank - 1)] / 1e6;
    }

    private static Map<String, String> parse(String[] argv) {
        if (argv.length == 0 || argv.length % 2 != 0) {
            throw new IllegalArgumentException(argv.length == 0 ? "no arguments" : "every flag takes a value");
        }
        Map<String, String> args = new HashMap<>();
        for (int i = 0; i < argv.length; i += 2) {
            if (!argv[i].startsWith("--")) {
                throw new IllegalArgumentException("expected a --flag, got " + argv[i]);
            }
            args.put(argv[i].substring(2), argv[i + 1]);
        }
        for (String key : args.keySet()) {
            if (!Set.of("bootstrap", "topic", "group", "workers", "messages", "batch", "timeout-s", "commit")
                    .contains(key)) {
                throw new IllegalArgumentException("unknown flag --" + key);
            }
        }
        return args;
    }

    private static String required(Map<String, String> args, String key) {
        String v = args.get(key);
        if (v == null) {
            throw new IllegalArgumentException("missing --" + key);
        }
        return v;
    }

    /** A growable array of longs, so a million latency samples are not a million boxed Longs. */
    private static final class LongList {
        private long[] items = new long[1024];
        private int size;

        void add(long v) {
            if (size == items.length) {
                items = Arrays.copyOf(items, size * 2);
            }
            items[size++] = v;
        }

        long[] toArray() {
            return Arrays.copyOf(items, size);
        }
    }
}
