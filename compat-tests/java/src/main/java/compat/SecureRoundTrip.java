package compat;

import java.io.FileReader;
import java.io.Reader;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.AuthenticationException;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The Java kafka-clients part of security/run.sh (issue 31): a KafkaProducer/KafkaConsumer
 * round trip, or one refused connection, over a secure listener whose client settings are
 * in a properties file (security.protocol, ssl.*, sasl.*; as the console tools'
 * --command-config).
 *
 * <pre>
 *   SecureRoundTrip roundtrip &lt;bootstrap&gt; &lt;client.properties&gt; &lt;topic&gt; &lt;n&gt;
 *   SecureRoundTrip refused &lt;bootstrap&gt; &lt;client.properties&gt;
 * </pre>
 *
 * roundtrip sends n records k-i:&lt;topic&gt;-v-i to partition 0 (acks=all, idempotent, the
 * defaults), checks the acknowledged offsets are contiguous, then a group-less consumer
 * (assign + seekToBeginning) reads them back: count, order, keys, values, offsets. refused
 * asks Admin for the cluster and expects an AuthenticationException (SASL or SSL). Prints one
 * "ok ..." or "error: ..." line on stdout; exits 0 only when the expectation held. Every
 * client call is bounded (about 30 s in all).
 */
public final class SecureRoundTrip {
    private static final Duration BOUND = Duration.ofSeconds(30);

    public static void main(String[] args) throws Exception {
        if (args.length < 3 || !(args[0].equals("refused") || (args[0].equals("roundtrip") && args.length == 5))) {
            System.err.println("usage: SecureRoundTrip roundtrip <bootstrap> <props> <topic> <n> | refused <bootstrap> <props>");
            System.exit(2);
        }
        Properties base = new Properties();
        try (Reader r = new FileReader(args[2])) {
            base.load(r);
        }
        base.put("bootstrap.servers", args[1]);
        String line;
        try {
            line = args[0].equals("roundtrip")
                    ? roundTrip(base, args[3], Integer.parseInt(args[4]))
                    : refused(base);
        } catch (Exception e) {
            System.out.println("error: " + e);
            e.printStackTrace();
            System.exit(1);
            return;
        }
        System.out.println(line);
        System.exit(line.startsWith("ok") ? 0 : 1);
    }

    private static String value(String topic, int i) {
        return topic + "-v-" + i;
    }

    static String roundTrip(Properties base, String topic, int n) throws Exception {
        Properties p = new Properties();
        p.putAll(base);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "20000");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "25000");
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "15000");
        List<RecordMetadata> acks = new ArrayList<>();
        try (KafkaProducer<String, String> producer =
                new KafkaProducer<>(p, new StringSerializer(), new StringSerializer())) {
            List<java.util.concurrent.Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                sent.add(producer.send(new ProducerRecord<>(topic, 0, "k-" + i, value(topic, i))));
            }
            producer.flush();
            for (var f : sent) {
                acks.add(f.get(BOUND.toMillis(), TimeUnit.MILLISECONDS));
            }
        }
        long first = acks.get(0).offset();
        for (int i = 0; i < n; i++) {
            if (acks.get(i).offset() != first + i) {
                return "error: record " + i + " acknowledged at offset " + acks.get(i).offset() + ", not " + (first + i);
            }
        }

        Properties c = new Properties();
        c.putAll(base);
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.REQUEST_TIMEOUT_MS_CONFIG, "15000");
        c.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
        List<ConsumerRecord<String, String>> got = new ArrayList<>();
        try (KafkaConsumer<String, String> consumer =
                new KafkaConsumer<>(c, new StringDeserializer(), new StringDeserializer())) {
            TopicPartition tp = new TopicPartition(topic, 0);
            consumer.assign(List.of(tp));
            consumer.seekToBeginning(List.of(tp));
            long deadline = System.nanoTime() + BOUND.toNanos();
            while (got.size() < n && System.nanoTime() < deadline) {
                consumer.poll(Duration.ofMillis(500)).forEach(got::add);
            }
        }
        if (got.size() != n) {
            return "error: read " + got.size() + " records, not the " + n + " produced";
        }
        for (int i = 0; i < n; i++) {
            ConsumerRecord<String, String> r = got.get(i);
            if (!r.key().equals("k-" + i) || !r.value().equals(value(topic, i)) || r.offset() != first + i) {
                return "error: record " + i + " is " + r.key() + ":" + r.value() + " at offset " + r.offset()
                        + " (acknowledged " + (first + i) + ")";
            }
        }
        return "ok " + n + " records produced (offsets " + first + ".." + (first + n - 1) + ") and read back";
    }

    static String refused(Properties base) throws Exception {
        Properties a = new Properties();
        a.putAll(base);
        a.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        a.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "15000");
        try (Admin admin = Admin.create(a)) {
            var nodes = admin.describeCluster().nodes().get(BOUND.toMillis(), TimeUnit.MILLISECONDS);
            return "error: describeCluster answered with bad credentials: " + nodes;
        } catch (ExecutionException e) {
            if (e.getCause() instanceof AuthenticationException) {
                return "ok refused: " + e.getCause();
            }
            return "error: no AuthenticationException: " + e.getCause();
        }
    }
}
