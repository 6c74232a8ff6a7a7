package compat;

import static compat.Scenarios.check;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.CreateTopicsOptions;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.InvalidConfigurationException;
import org.apache.kafka.storage.internals.log.LogConfig;

/**
 * Every topic config Kafka 4.4 defines (read at run time from its own {@code LogConfig}, so a
 * config Kafka adds fails this scenario until it has values here), walked through the Admin API
 * as topic-creating tools (Connect, Debezium, Strimzi, Terraform) use them: each accepted with a
 * valid value and refused with an invalid one by CreateTopics; all set at once on a topic, listed
 * by DescribeConfigs with their values, types and documentation; a fresh topic lists every config
 * with Kafka's default; IncrementalAlterConfigs sets, appends to and deletes them. The one value
 * that needs tiered storage, {@code remote.storage.enable=true}, is refused, as a Kafka broker
 * without tiered storage refuses it.
 */
final class TopicConfigScenarios {
  /** A valid value other than the default, and an invalid one, per config. */
  static final Map<String, String[]> VALUES = new HashMap<>();

  static {
    v("segment.bytes", "2097152", "x");
    v("segment.ms", "3600000", "0");
    v("segment.jitter.ms", "60000", "-1");
    v("segment.index.bytes", "1048576", "3");
    v("flush.messages", "1000", "0");
    v("flush.ms", "60000", "-1");
    v("retention.bytes", "1073741824", "ten");
    v("retention.ms", "86400000", "-2");
    v("max.message.bytes", "2097152", "-1");
    v("max.decompressed.message.bytes", "16777216", "0");
    v("index.interval.bytes", "8192", "-1");
    v("delete.retention.ms", "3600000", "-1");
    v("min.compaction.lag.ms", "1000", "-1");
    v("max.compaction.lag.ms", "86400000", "0");
    v("file.delete.delay.ms", "1000", "-1");
    v("min.cleanable.dirty.ratio", "0.2", "1.5");
    v("cleanup.policy", "compact", "shred");
    v("unclean.leader.election.enable", "true", "maybe");
    v("min.insync.replicas", "1", "0");
    v("compression.type", "lz4", "brotli");
    v("compression.gzip.level", "5", "0");
    v("compression.lz4.level", "12", "18");
    v("compression.zstd.level", "9", "23");
    v("preallocate", "true", "maybe");
    v("message.timestamp.type", "LogAppendTime", "WallClock");
    v("message.timestamp.before.max.ms", "86400000", "-1");
    v("message.timestamp.after.max.ms", "60000", "-1");
    v("leader.replication.throttled.replicas", "0:1,1:2", "0-1");
    v("follower.replication.throttled.replicas", "*", "a:b");
    v("remote.storage.enable", "true", "maybe");
    v("local.retention.ms", "3600000", "-3");
    v("local.retention.bytes", "1048576", "-3");
    v("remote.log.copy.disable", "true", "maybe");
    v("remote.copy.lag.ms", "1000", "-2");
    v("remote.copy.lag.bytes", "1000", "-2");
    v("remote.log.delete.on.disable", "true", "maybe");
    v("errors.deadletterqueue.group.enable", "true", "maybe");
  }

  static void v(String name, String good, String bad) {
    VALUES.put(name, new String[] {good, bad});
  }

  /** Valid alone, refused where it needs what is not there. */
  static final String NEEDS_TIERED_STORAGE = "remote.storage.enable";

  private final Scenarios s;

  TopicConfigScenarios(Scenarios s) {
    this.s = s;
  }

  String all() throws Exception {
    List<ConfigDef.ConfigKey> keys = new ArrayList<>();
    for (ConfigDef.ConfigKey k : LogConfig.configDefCopy().configKeys().values()) {
      if (!k.internalConfig) {
        keys.add(k);
      }
    }
    for (ConfigDef.ConfigKey k : keys) {
      check(VALUES.containsKey(k.name), "Kafka's LogConfig has %s, which this scenario has no values for", k.name);
    }
    String base = s.topicName("admin.topic_configs");
    try (Admin admin = s.admin()) {
      CreateTopicsOptions validateOnly = new CreateTopicsOptions().validateOnly(true);
      int refusedBad = 0;
      for (ConfigDef.ConfigKey k : keys) {
        String[] values = VALUES.get(k.name);
        NewTopic good = new NewTopic(base + "-v", 1, (short) 1).configs(Map.of(k.name, values[0]));
        if (k.name.equals(NEEDS_TIERED_STORAGE)) {
          String why = refusal(() -> admin.createTopics(List.of(good), validateOnly).all().get());
          check(why != null && why.contains("Tiered Storage"), "%s=%s: %s", k.name, values[0], why);
        } else {
          String why = refusal(() -> admin.createTopics(List.of(good), validateOnly).all().get());
          check(why == null, "CreateTopics refused %s=%s: %s", k.name, values[0], why);
        }
        NewTopic bad = new NewTopic(base + "-v", 1, (short) 1).configs(Map.of(k.name, values[1]));
        String why = refusal(() -> admin.createTopics(List.of(bad), validateOnly).all().get());
        check(why != null, "CreateTopics took %s=%s", k.name, values[1]);
        refusedBad++;
      }

      // Every config at once on one topic, then as DescribeConfigs lists them.
      Map<String, String> every = new HashMap<>();
      for (ConfigDef.ConfigKey k : keys) {
        if (!k.name.equals(NEEDS_TIERED_STORAGE)) {
          every.put(k.name, VALUES.get(k.name)[0]);
        }
      }
      String set = base + "-set";
      String fresh = base + "-fresh";
      admin
          .createTopics(List.of(new NewTopic(set, 1, (short) 1).configs(every), new NewTopic(fresh, 1, (short) 1)))
          .all()
          .get();
      Config described = describe(admin, set);
      for (Map.Entry<String, String> e : every.entrySet()) {
        ConfigEntry entry = described.get(e.getKey());
        check(entry != null, "DescribeConfigs does not list %s", e.getKey());
        check(
            same(e.getValue(), entry.value()) && entry.source() == ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG,
            "%s: %s (%s), set to %s", e.getKey(), entry.value(), entry.source(), e.getValue());
      }
      Config defaults = describe(admin, fresh);
      int listed = 0;
      for (ConfigDef.ConfigKey k : keys) {
        ConfigEntry entry = defaults.get(k.name);
        check(entry != null, "DescribeConfigs of a new topic does not list %s", k.name);
        check(
            entry.type().name().equals(k.type.name()),
            "%s: type %s, Kafka's is %s", k.name, entry.type(), k.type);
        check(
            entry.documentation() != null && !entry.documentation().isBlank(),
            "%s: no documentation", k.name);
        if (entry.source() == ConfigEntry.ConfigSource.DEFAULT_CONFIG) {
          String expected = ConfigDef.convertToString(k.defaultValue, k.type);
          check(same(expected, entry.value()), "%s: default %s, Kafka's is %s", k.name, entry.value(), expected);
        }
        listed++;
      }
      for (ConfigEntry entry : defaults.entries()) {
        check(
            VALUES.containsKey(entry.name()),
            "DescribeConfigs lists %s, which Kafka's LogConfig does not define", entry.name());
      }

      // IncrementalAlterConfigs: set, append to a list, delete.
      ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, fresh);
      List<AlterConfigOp> ops = new ArrayList<>();
      for (String name : List.of("min.cleanable.dirty.ratio", "segment.jitter.ms", "compression.zstd.level", "preallocate")) {
        ops.add(new AlterConfigOp(new ConfigEntry(name, VALUES.get(name)[0]), AlterConfigOp.OpType.SET));
      }
      ops.add(new AlterConfigOp(new ConfigEntry("follower.replication.throttled.replicas", "0:1"), AlterConfigOp.OpType.APPEND));
      admin.incrementalAlterConfigs(Map.of(resource, ops)).all().get();
      Config altered = waitFor(admin, fresh, "min.cleanable.dirty.ratio", "0.2");
      check(same("9", altered.get("compression.zstd.level").value()), "compression.zstd.level %s after SET", altered.get("compression.zstd.level").value());
      check(
          "0:1".equals(altered.get("follower.replication.throttled.replicas").value()),
          "follower.replication.throttled.replicas %s after APPEND 0:1", altered.get("follower.replication.throttled.replicas").value());
      String conflict =
          refusal(
              () ->
                  admin
                      .incrementalAlterConfigs(
                          Map.of(
                              resource,
                              List.of(
                                  new AlterConfigOp(new ConfigEntry("min.compaction.lag.ms", "10000"), AlterConfigOp.OpType.SET),
                                  new AlterConfigOp(new ConfigEntry("max.compaction.lag.ms", "5000"), AlterConfigOp.OpType.SET))))
                      .all()
                      .get());
      check(conflict != null, "min.compaction.lag.ms 10000 > max.compaction.lag.ms 5000 was taken");
      List<AlterConfigOp> deletes = new ArrayList<>();
      for (AlterConfigOp op : ops) {
        deletes.add(new AlterConfigOp(new ConfigEntry(op.configEntry().name(), ""), AlterConfigOp.OpType.DELETE));
      }
      admin.incrementalAlterConfigs(Map.of(resource, deletes)).all().get();
      Config reset = waitFor(admin, fresh, "min.cleanable.dirty.ratio", "0.5");
      check(
          reset.get("segment.jitter.ms").source() != ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG,
          "segment.jitter.ms still a topic override after DELETE");
      admin.deleteTopics(List.of(set, fresh)).all().get();
      return String.format(
          "%d configs of Kafka's LogConfig: each taken valid, %d refused invalid, remote.storage.enable=true refused;"
              + " all set on one topic and described; %d listed with Kafka's types and defaults; altered and reset",
          keys.size(), refusedBad, listed);
    }
  }

  interface Call {
    void run() throws Exception;
  }

  /** The INVALID_CONFIG message of a refused call, or null when it succeeded. */
  static String refusal(Call call) throws Exception {
    try {
      call.run();
      return null;
    } catch (ExecutionException e) {
      if (e.getCause() instanceof InvalidConfigurationException ice) {
        return ice.getMessage() == null ? "(no message)" : ice.getMessage();
      }
      throw e;
    }
  }

  /** Numbers compare as numbers: 0.2 and 0.20 are one ratio. */
  static boolean same(String expected, String actual) {
    if (expected == null || actual == null) {
      return expected == actual;
    }
    if (expected.equals(actual)) {
      return true;
    }
    try {
      return Double.parseDouble(expected) == Double.parseDouble(actual);
    } catch (NumberFormatException e) {
      return false;
    }
  }

  Config describe(Admin admin, String topic) throws Exception {
    ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
    return admin
        .describeConfigs(List.of(resource), new DescribeConfigsOptions().includeDocumentation(true).includeSynonyms(true))
        .all()
        .get()
        .get(resource);
  }

  /** Topic configs reach every broker's metadata a moment after the change is answered. */
  Config waitFor(Admin admin, String topic, String name, String value) throws Exception {
    long deadline = System.currentTimeMillis() + 15_000;
    while (true) {
      Config c = describe(admin, topic);
      ConfigEntry e = c.get(name);
      if (e != null && same(value, e.value())) {
        return c;
      }
      check(System.currentTimeMillis() < deadline, "%s=%s not seen 15 s after the change (%s)", name, value, e);
      Thread.sleep(100);
    }
  }
}
