package compat;

import java.util.List;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;

/**
 * Creates one topic through the Admin API: CreateTopic &lt;bootstrap&gt; &lt;topic&gt;
 * &lt;partitions&gt;. The kcat round trip uses it because a broker need not auto-create topics,
 * and the Java build is lighter to install than the Kafka command-line tools.
 */
public final class CreateTopic {
  private CreateTopic() {}

  public static void main(String[] args) throws Exception {
    if (args.length != 3) {
      System.err.println("usage: CreateTopic <bootstrap> <topic> <partitions>");
      System.exit(2);
    }
    Properties p = new Properties();
    p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
    p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, 30_000);
    try (Admin admin = Admin.create(p)) {
      admin
          .createTopics(List.of(new NewTopic(args[1], Integer.parseInt(args[2]), (short) 1)))
          .all()
          .get(30, TimeUnit.SECONDS);
    }
  }
}
