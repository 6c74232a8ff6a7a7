#!/usr/bin/env python3
"""The ACL matrix over the wire (issue 31): for each API and the resource
operation Kafka checks for it, user bob is refused with Kafka's error before
an ACL grants it, and served after. Run by `acls.sh <broker> --matrix`
against a broker with StandardAuthorizer, super user admin and PLAIN users
admin and bob on SASL_PLAINTEXT, so the same cells run on ours and on Kafka.

usage: acl_matrix.py <bootstrap>

Prints "PASS <cell>.denied|allowed" / "FAIL <cell>...: <why>" per check and
"<passed> passed, <failed> failed"; exits non-zero on any failure. Every
call is bounded (10 s, an allowed one retried for 15 s while the ACL
propagates).
"""

import random
import sys
import time

from confluent_kafka import (Consumer, ConsumerGroupTopicPartitions, KafkaError,
                             KafkaException, Producer,
                             TopicPartition)
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation,
                                   AclPermissionType, AdminClient,
                                   AlterConfigOpType, ConfigEntry,
                                   ConfigResource, NewPartitions, NewTopic,
                                   ResourcePatternType,
                                   ResourceType)

BS = sys.argv[1]
RUN = f"{random.randrange(1 << 30):x}"
TIMEOUT = 10
passed = failed = 0


def conf(user, **extra):
    c = {"bootstrap.servers": BS, "security.protocol": "SASL_PLAINTEXT",
         "sasl.mechanism": "PLAIN", "sasl.username": user,
         "sasl.password": f"{user}-secret"}
    c.update(extra)
    return c


admin = AdminClient(conf("admin"))
bob = AdminClient(conf("bob"))


def code_of(e):
    """Kafka's error name from an exception or error, else its text."""
    if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError):
        return e.args[0].name()
    if isinstance(e, KafkaError):
        return e.name()
    return f"{type(e).__name__}: {e}"


def outcome(attempt):
    """None when the attempt succeeded, else Kafka's error name."""
    try:
        attempt()
        return None
    except Exception as e:  # noqa: BLE001 - every failure is a result here
        return code_of(e)


def result(futures, wait=TIMEOUT):
    """Waits for every future of an admin call; raises the first error."""
    if not isinstance(futures, dict):
        return futures.result(timeout=wait)
    return [f.result(timeout=wait) for f in futures.values()]


def grant(*bindings):
    result(admin.create_acls([AclBinding(rt, name, pt, "User:bob", "*", op,
                                         AclPermissionType.ALLOW)
                              for rt, name, pt, op in bindings]))


def check(name, ok, why=""):
    global passed, failed
    if ok:
        print(f"PASS {name}", flush=True)
        passed += 1
    else:
        print(f"FAIL {name}: {why}", flush=True)
        failed += 1


def cell(name, attempt, denied_with, *bindings):
    """bob is refused with `denied_with`, then granted `bindings`, then served."""
    got = outcome(attempt)
    check(f"{name}.denied", got == denied_with, f"wanted {denied_with}, got {got}")
    grant(*bindings)
    deadline = time.monotonic() + 15
    while True:
        got = outcome(attempt)
        if got is None or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    check(f"{name}.allowed", got is None, f"still refused after the grant: {got}")


LIT, PRE = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
TOPIC, GROUP, CLUSTER, TXN = (ResourceType.TOPIC, ResourceType.GROUP,
                              ResourceType.BROKER, ResourceType.TRANSACTIONAL_ID)
CLUSTER_NAME = "kafka-cluster"
T, T2, T3, DEL = (f"acl-m-{RUN}", f"acl-m2-{RUN}", f"acl-hidden-{RUN}", f"acl-del-{RUN}")
G = f"acl-mg-{RUN}"

# The admin's topics, with a few records in T.
result(admin.create_topics([NewTopic(t, 1, 1) for t in (T, T2, T3, DEL)]))
p = Producer(conf("admin", **{"message.timeout.ms": 10000}))
for i in range(5):
    p.produce(T, value=f"r{i}".encode())
p.flush(TIMEOUT)


def bob_produce():
    errors = []
    prod = Producer(conf("bob", **{"message.timeout.ms": 10000, "retries": 0,
                                   "enable.idempotence": False}))
    prod.produce(T, value=b"bob", on_delivery=lambda err, _m: err and errors.append(err))
    left = prod.flush(TIMEOUT)
    if errors:
        raise KafkaException(errors[0])
    if left:
        raise RuntimeError("not delivered in time")


def bob_fetch():
    c = Consumer(conf("bob", **{"group.id": f"unused-{RUN}", "enable.auto.commit": False}))
    try:
        c.assign([TopicPartition(T, 0, 0)])
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                raise KafkaException(m.error())
            return
        raise RuntimeError("no record in time")
    finally:
        c.close()


def bob_commit():
    c = Consumer(conf("bob", **{"group.id": G, "enable.auto.commit": False}))
    try:
        c.commit(offsets=[TopicPartition(T, 0, 1)], asynchronous=False)
    finally:
        c.close()


def bob_init_transactions():
    prod = Producer(conf("bob", **{"transactional.id": f"tx-{RUN}",
                                   "transaction.timeout.ms": 10000}))
    prod.init_transactions(TIMEOUT)


def bob_sees_hidden():
    md = bob.list_topics(timeout=TIMEOUT)
    if T3 not in md.topics:
        raise RuntimeError("hidden")


def bob_describes_acls():
    # confluent-kafka answers a refused DescribeAcls with an empty list, not an
    # error (kafka-acls.sh in acls.sh sees the ClusterAuthorizationException): so
    # "refused" here is "sees none of the ACLs that exist".
    if not result(bob.describe_acls(ANY_ACL, request_timeout=TIMEOUT)):
        raise RuntimeError("no bindings")


ANY_ACL = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                           AclOperation.ANY, AclPermissionType.ANY)
cell("describe_acls.cluster_describe", bob_describes_acls, "RuntimeError: no bindings",
     (CLUSTER, CLUSTER_NAME, LIT, AclOperation.DESCRIBE))
# Consumers with a group id look their group's coordinator up even when only assigned
# (FindCoordinator: Describe on the group); bob may, so the cells below test what they name.
grant((GROUP, "unused-", PRE, AclOperation.DESCRIBE), (GROUP, G, LIT, AclOperation.DESCRIBE))

cell("produce.topic_write", bob_produce, "TOPIC_AUTHORIZATION_FAILED", (TOPIC, T, LIT, AclOperation.WRITE))
cell("fetch.topic_read", bob_fetch, "TOPIC_AUTHORIZATION_FAILED", (TOPIC, T, LIT, AclOperation.READ))
def bob_watermarks():
    # A consumer's ListOffsets (AdminClient.list_offsets waits out its timeout
    # on a topic it cannot see, on both brokers). A fresh client each time.
    c = Consumer(conf("bob", **{"group.id": f"unused-{RUN}"}))
    try:
        c.get_watermark_offsets(TopicPartition(T2, 0), timeout=TIMEOUT)
    finally:
        c.close()


# Without Describe the topic is hidden from Metadata, so librdkafka refuses the
# ListOffsets itself: the same on both brokers.
cell("list_offsets.topic_describe", bob_watermarks,
     "_UNKNOWN_PARTITION", (TOPIC, T2, LIT, AclOperation.DESCRIBE))
cell("metadata.topic_describe", bob_sees_hidden, "RuntimeError: hidden", (TOPIC, T3, LIT, AclOperation.DESCRIBE))
cell("create_topics.topic_create",
     lambda: result(bob.create_topics([NewTopic(f"bobs-{RUN}", 1, 1)])),
     "TOPIC_AUTHORIZATION_FAILED", (TOPIC, "bobs-", PRE, AclOperation.CREATE))
cell("create_partitions.topic_alter",
     lambda: result(bob.create_partitions([NewPartitions(T2, 2)])),
     "TOPIC_AUTHORIZATION_FAILED", (TOPIC, T2, LIT, AclOperation.ALTER))
cell("describe_configs.topic_describe_configs",
     lambda: result(bob.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, T)])),
     "TOPIC_AUTHORIZATION_FAILED", (TOPIC, T, LIT, AclOperation.DESCRIBE_CONFIGS))
cell("incremental_alter_configs.topic_alter_configs",
     lambda: result(bob.incremental_alter_configs([ConfigResource(
         ConfigResource.Type.TOPIC, T, incremental_configs=[ConfigEntry(
             "retention.ms", "86400000", incremental_operation=AlterConfigOpType.SET)])])),
     "TOPIC_AUTHORIZATION_FAILED", (TOPIC, T, LIT, AclOperation.ALTER_CONFIGS))
cell("delete_records.topic_delete",
     lambda: result(bob.delete_records([TopicPartition(T, 0, 1)], request_timeout=TIMEOUT)),
     "TOPIC_AUTHORIZATION_FAILED", (TOPIC, T, LIT, AclOperation.DELETE))
cell("delete_topics.topic_delete",
     lambda: result(bob.delete_topics([DEL], operation_timeout=TIMEOUT)),
     "TOPIC_AUTHORIZATION_FAILED", (TOPIC, DEL, LIT, AclOperation.DELETE))
cell("describe_configs.cluster_describe_configs",
     lambda: result(bob.describe_configs([ConfigResource(ConfigResource.Type.BROKER, "1")])),
     "CLUSTER_AUTHORIZATION_FAILED", (CLUSTER, CLUSTER_NAME, LIT, AclOperation.DESCRIBE_CONFIGS))
cell("offset_commit.group_read", bob_commit, "GROUP_AUTHORIZATION_FAILED", (GROUP, G, LIT, AclOperation.READ))
cell("list_consumer_group_offsets.group_describe",
     lambda: result(bob.list_consumer_group_offsets(
         [ConsumerGroupTopicPartitions(f"{G}-d")])),
     "GROUP_AUTHORIZATION_FAILED", (GROUP, f"{G}-d", LIT, AclOperation.DESCRIBE))
cell("describe_consumer_groups.group_describe",
     lambda: result(bob.describe_consumer_groups([f"{G}-e"], request_timeout=TIMEOUT)),
     "GROUP_AUTHORIZATION_FAILED", (GROUP, f"{G}-e", LIT, AclOperation.DESCRIBE))
cell("delete_consumer_groups.group_delete",
     lambda: result(bob.delete_consumer_groups([G], request_timeout=TIMEOUT)),
     "GROUP_AUTHORIZATION_FAILED", (GROUP, G, LIT, AclOperation.DELETE))
cell("init_producer_id.transactional_id_write", bob_init_transactions,
     "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", (TXN, f"tx-{RUN}", LIT, AclOperation.WRITE))
cell("create_acls.cluster_alter",
     lambda: result(bob.create_acls([AclBinding(TOPIC, f"x-{RUN}", LIT, "User:nobody", "*",
                                                AclOperation.READ, AclPermissionType.ALLOW)],
                                    request_timeout=TIMEOUT)),
     "CLUSTER_AUTHORIZATION_FAILED", (CLUSTER, CLUSTER_NAME, LIT, AclOperation.ALTER))

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
