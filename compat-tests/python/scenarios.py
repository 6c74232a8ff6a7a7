#!/usr/bin/env python3
"""The compat scenarios (the scenario list in compat-tests/README.md) through confluent-kafka (librdkafka).

Usage: scenarios.py <bootstrap> [scenario-id ...]   (no ids = all, in contract order)

Prints one "RESULT <id> PASS|FAIL|NA <detail>" line per scenario on stdout and
everything else on stderr; exits 0 iff no scenario failed. Each scenario runs in
its own child process (scenarios.py --one <bootstrap> <id>) so a client call that
hangs inside librdkafka is ended by the time bound and the next scenario still runs.
"""

import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_CREATE_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import OffsetSpec
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic, ResourceType

FAMILY = "python"
SCENARIOS = [
    "admin.topics",
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
    "group.rebalance",
    "group.rebalance.consumer",
    "txn.commit",
    "txn.abort",
    "txn.offsets",
]
# The contract bounds each scenario at 60 s; the waits inside are shorter so a
# broken broker shows up as a FAIL naming what was awaited, not as a bare timeout.
SCENARIO_TIMEOUT_S = 60.0
ADMIN_TIMEOUT_S = 20.0
FLUSH_TIMEOUT_S = 30.0
CONSUME_TIMEOUT_S = 30.0
GROUP_TIMEOUT_S = 25.0
# 2 MiB: the client-side limit the large-record scenarios raise to, above the broker's 1048588.
RAISED_LIMIT_BYTES = 2 * 1024 * 1024


class ScenarioFailed(Exception):
    pass


class NotApplicable(Exception):
    pass


def check(condition, message):
    if not condition:
        raise ScenarioFailed(message)


def one_line(text):
    return " ".join(str(text).split())


def describe_error(e):
    """A one-line description naming the Kafka error, for FAIL details."""
    if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError):
        err = e.args[0]
        return f"{err.name()} (code {err.code()}): {err.str()}"
    if isinstance(e, KafkaError):
        return f"{e.name()} (code {e.code()}): {e.str()}"
    if isinstance(e, (ScenarioFailed, NotApplicable)):
        return str(e)
    return f"{type(e).__name__}: {e}"


class Context:
    """Per-scenario state: the bootstrap, a run-unique topic prefix, the topics to delete
    afterwards and the errors librdkafka reported through error_cb."""

    def __init__(self, bootstrap, scenario):
        self.bootstrap = bootstrap
        self.scenario = scenario
        self.suffix = secrets.token_hex(4)
        self.created = []
        self.client_errors = []
        self.admin = AdminClient({"bootstrap.servers": bootstrap, "error_cb": self.on_error})

    def on_error(self, err):
        self.client_errors.append(err)
        print(f"[{self.scenario}] client error: {err}", file=sys.stderr)

    def errors_seen(self):
        if not self.client_errors:
            return "no client error reported"
        names = []
        for err in self.client_errors:
            text = f"{err.name()}: {err.str()}"
            if text not in names:
                names.append(text)
        return "client errors: " + "; ".join(names[-3:])

    def topic(self, tag=""):
        name = f"compat-{FAMILY}-{self.scenario.replace('.', '-')}{tag}-{self.suffix}"
        return name

    def producer(self, **config):
        conf = {"bootstrap.servers": self.bootstrap, "error_cb": self.on_error, "linger.ms": 5}
        conf.update(config)
        return Producer(conf)

    def consumer(self, **config):
        conf = {
            "bootstrap.servers": self.bootstrap,
            "error_cb": self.on_error,
            # librdkafka's consumer requires a group.id even when it only assign()s;
            # assign-only consumers never join the group nor commit.
            "group.id": f"compat-{FAMILY}-unused-{self.suffix}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
        conf.update(config)
        return Consumer(conf)

    def create_topic(self, topic, partitions, config=None):
        futures = self.admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config or {})],
            operation_timeout=ADMIN_TIMEOUT_S,
            request_timeout=ADMIN_TIMEOUT_S,
        )
        self.created.append(topic)
        try:
            futures[topic].result(timeout=ADMIN_TIMEOUT_S + 5)
        except KafkaException as e:
            raise ScenarioFailed(f"CreateTopics {topic}: {describe_error(e)}") from e
        self.wait_for_partitions(topic, partitions)

    def wait_for_partitions(self, topic, partitions):
        # CreateTopics may answer before every partition has a leader in the metadata;
        # producing earlier would only make librdkafka retry, but waiting keeps errors clear.
        deadline = time.monotonic() + ADMIN_TIMEOUT_S
        while True:
            md = self.admin.list_topics(topic=topic, timeout=ADMIN_TIMEOUT_S)
            t = md.topics.get(topic)
            if (
                t is not None
                and t.error is None
                and len(t.partitions) == partitions
                and all(p.leader >= 0 for p in t.partitions.values())
            ):
                return
            if time.monotonic() > deadline:
                state = "absent" if t is None else f"error {t.error}, {len(t.partitions)} partitions"
                raise ScenarioFailed(f"Metadata for new topic {topic}: {state}")
            time.sleep(0.2)

    def delete_created(self):
        if not self.created:
            return
        try:
            futures = self.admin.delete_topics(self.created, operation_timeout=10, request_timeout=10)
            for topic, future in futures.items():
                try:
                    future.result(timeout=15)
                except Exception as e:  # noqa: BLE001 - cleanup is best effort
                    print(f"[{self.scenario}] delete {topic}: {describe_error(e)}", file=sys.stderr)
        except Exception as e:  # noqa: BLE001
            print(f"[{self.scenario}] delete topics: {describe_error(e)}", file=sys.stderr)


def key(i):
    return f"key-{i}".encode()


def value(tag, i):
    # The value repeats the index so a record delivered under the wrong key is caught.
    return f"value-{i}-{tag}-{'x' * (64 + i % 64)}".encode()


def headers(tag, i):
    return [("index", str(i).encode()), ("tag", tag.encode())]


def produce_records(ctx, topic, n, tag, base_timestamp_ms, timestamp_step_ms=1, partition=None, **config):
    """Produces records 0..n-1 and returns the acknowledged (partition, offset) per index."""
    producer = ctx.producer(acks="all", **config)
    acks = [None] * n
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            acks[int(msg.key()[len(b"key-"):])] = (msg.partition(), msg.offset())

    for i in range(n):
        kwargs = {} if partition is None else {"partition": partition}
        while True:
            try:
                producer.produce(
                    topic,
                    key=key(i),
                    value=value(tag, i),
                    headers=headers(tag, i),
                    timestamp=base_timestamp_ms + i * timestamp_step_ms,
                    on_delivery=on_delivery,
                    **kwargs,
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(FLUSH_TIMEOUT_S)
    if errors:
        raise ScenarioFailed(f"Produce: {describe_error(errors[0])}")
    check(remaining == 0, f"Produce: {remaining} records unacknowledged after {FLUSH_TIMEOUT_S:.0f} s; {ctx.errors_seen()}")
    missing = [i for i, a in enumerate(acks) if a is None]
    check(not missing, f"Produce: {len(missing)} records never acknowledged")
    return acks


def consume_assigned(ctx, partitions, n, start_offset=OFFSET_BEGINNING, **config):
    """Reads n records from the assigned (topic, partition) list; returns the messages.
    Fails on a consumer error or when no record arrives for CONSUME_TIMEOUT_S."""
    consumer = ctx.consumer(**config)
    messages = []
    try:
        consumer.assign([TopicPartition(t, p, start_offset) for t, p in partitions])
        last_progress = time.monotonic()
        while len(messages) < n:
            batch = consumer.consume(num_messages=min(10000, n - len(messages)), timeout=0.5)
            for m in batch:
                if m.error() is not None:
                    raise ScenarioFailed(f"Fetch: {describe_error(m.error())}")
                messages.append(m)
            if batch:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > CONSUME_TIMEOUT_S:
                raise ScenarioFailed(
                    f"Fetch: stalled at {len(messages)} of {n} records for {CONSUME_TIMEOUT_S:.0f} s; {ctx.errors_seen()}"
                )
        # A short extra poll catches records beyond those produced (duplicates).
        extra = [m for m in consumer.consume(num_messages=100, timeout=0.3) if m.error() is None]
        check(not extra, f"Fetch: {len(extra)} records beyond the {n} produced")
    finally:
        consumer.close()
    return messages


def verify_records(messages, acks, tag, base_timestamp_ms, timestamp_step_ms=1):
    """Every acknowledged record read exactly once, at its acknowledged offset, in
    per-partition order, with its key, value, headers and CreateTime timestamp."""
    expected_by_partition = {}
    for i, (p, offset) in enumerate(acks):
        expected_by_partition.setdefault(p, []).append((offset, i))
    read_by_partition = {}
    for m in messages:
        read_by_partition.setdefault(m.partition(), []).append(m)
    check(
        set(read_by_partition) <= set(expected_by_partition),
        f"records read from partitions {sorted(read_by_partition)} but produced to {sorted(expected_by_partition)}",
    )
    for p, expected in expected_by_partition.items():
        expected.sort()
        read = read_by_partition.get(p, [])
        check(len(read) == len(expected), f"partition {p}: read {len(read)} records, {len(expected)} acknowledged")
        for m, (offset, i) in zip(read, expected):
            where = f"partition {p} offset {m.offset()}"
            check(m.offset() == offset, f"{where}: expected record {i} acknowledged at offset {offset}")
            check(m.key() == key(i), f"{where}: key {m.key()!r}, expected {key(i)!r}")
            check(m.value() == value(tag, i), f"{where}: value differs for record {i}")
            check(m.headers() == headers(tag, i), f"{where}: headers {m.headers()}")
            ts_type, ts = m.timestamp()
            want = base_timestamp_ms + i * timestamp_step_ms
            check(
                ts_type == TIMESTAMP_CREATE_TIME and ts == want,
                f"{where}: timestamp type {ts_type} value {ts}, expected CreateTime {want}",
            )
        # Acknowledged offsets grow with the index within a partition: order kept.
        indexes = [i for _, i in expected]
        check(indexes == sorted(indexes), f"partition {p}: records acknowledged out of order")
    return {p: len(read_by_partition.get(p, [])) for p in sorted(expected_by_partition)}


def past_timestamp_ms():
    # One hour back, so a broker that stamps its own clock (or LogAppendTime) is caught.
    return int(time.time() * 1000) - 3_600_000


# --- scenarios -------------------------------------------------------------------


def config_source_name(source):
    try:
        return ConfigSource(source).name
    except ValueError:
        return str(source)


def admin_topics(ctx):
    topic = ctx.topic()
    ctx.create_topic(topic, 3, {"retention.ms": "3600000"})

    description = None
    deadline = time.monotonic() + ADMIN_TIMEOUT_S
    while description is None:
        try:
            futures = ctx.admin.describe_topics(TopicCollection([topic]), request_timeout=ADMIN_TIMEOUT_S)
            description = futures[topic].result(timeout=ADMIN_TIMEOUT_S + 5)
        except KafkaException as e:
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"DescribeTopics (Metadata): {describe_error(e)}") from e
            time.sleep(0.2)
    check(len(description.partitions) == 3, f"DescribeTopics: {len(description.partitions)} partitions, expected 3")

    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        configs = ctx.admin.describe_configs([resource], request_timeout=ADMIN_TIMEOUT_S)[resource].result(
            timeout=ADMIN_TIMEOUT_S + 5
        )
    except KafkaException as e:
        raise ScenarioFailed(f"DescribeConfigs: {describe_error(e)}") from e
    entry = configs.get("retention.ms")
    check(entry is not None, "DescribeConfigs: no retention.ms entry")
    check(entry.value == "3600000", f"DescribeConfigs: retention.ms={entry.value}, expected 3600000")

    listed = ctx.admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics
    check(topic in listed, "Metadata (all topics): the new topic is not listed")

    try:
        ctx.admin.delete_topics([topic], operation_timeout=ADMIN_TIMEOUT_S, request_timeout=ADMIN_TIMEOUT_S)[topic].result(
            timeout=ADMIN_TIMEOUT_S + 5
        )
    except KafkaException as e:
        raise ScenarioFailed(f"DeleteTopics: {describe_error(e)}") from e
    ctx.created.remove(topic)
    deadline = time.monotonic() + ADMIN_TIMEOUT_S
    while topic in ctx.admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics:
        check(time.monotonic() < deadline, f"Metadata: topic still listed {ADMIN_TIMEOUT_S:.0f} s after DeleteTopics")
        time.sleep(0.2)
    return f"created 3 partitions, retention.ms={entry.value} (source {config_source_name(entry.source)}), listed, deleted, gone"


def codec(name):
    def run(ctx):
        topic = ctx.topic()
        ctx.create_topic(topic, 3)
        base = past_timestamp_ms()
        acks = produce_records(ctx, topic, 1000, name, base, **{"compression.type": name})
        messages = consume_assigned(ctx, [(topic, p) for p in range(3)], 1000)
        sizes = verify_records(messages, acks, name, base)
        return f"1000 records compression.type={name}, per partition {list(sizes.values())}, key/value/headers/CreateTime/order ok"

    return run


def idempotent(ctx):
    topic = ctx.topic()
    ctx.create_topic(topic, 3)
    base = past_timestamp_ms()
    acks = produce_records(ctx, topic, 1000, "idempotent", base, **{"enable.idempotence": True})
    messages = consume_assigned(ctx, [(topic, p) for p in range(3)], 1000)
    sizes = verify_records(messages, acks, "idempotent", base)
    return f"1000 records exactly once and in order, per partition {list(sizes.values())}"


def poll_one(consumer, ctx, what, timeout_s, describe=None):
    """The next record, skipping partition-EOF events; fails naming what was awaited
    (describe() gives a fresher description at the time of failure)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is None:
            continue
        if m.error() is not None:
            if m.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise ScenarioFailed(f"{what}: {describe_error(m.error())}")
        return m
    if describe is not None:
        what = describe()
    raise ScenarioFailed(f"timeout ({timeout_s:.0f} s) waiting for {what}; {ctx.errors_seen()}")


# librdkafka consumer group states (statistics "cgrp.state") and the request each awaits.
GROUP_STEPS = {
    "query-coord": "FindCoordinator not answered (librdkafka sends it only when ApiVersions lists it)",
    "wait-coord": "waiting for the coordinator found by FindCoordinator",
    "wait-broker": "connecting to the coordinator",
    "wait-broker-transport": "connecting to the coordinator",
}


def group_commit(ctx):
    topic = ctx.topic()
    ctx.create_topic(topic, 1)
    base = past_timestamp_ms()
    produce_records(ctx, topic, 200, "group", base)
    group = f"compat-{FAMILY}-group-{ctx.suffix}"
    config = {"group.id": group, "auto.offset.reset": "earliest", "session.timeout.ms": 10000}

    # librdkafka's statistics carry the consumer group state, which names the
    # protocol step a stuck group is waiting on (query-coord = FindCoordinator).
    group_states = []

    def on_stats(stats_json):
        cgrp = json.loads(stats_json).get("cgrp") or {}
        group_states.append(f"{cgrp.get('state')}/{cgrp.get('join_state')}")

    config.update({"statistics.interval.ms": 1000, "stats_cb": on_stats})

    def awaiting(what):
        state = group_states[-1] if group_states else "unknown"
        step = GROUP_STEPS.get(state.split("/")[0], "")
        return f"{what} (group state {state}{': ' + step if step else ''})"

    first = ctx.consumer(**config)
    try:
        first.subscribe([topic])
        offsets = []
        while len(offsets) < 100:
            what = "group assignment and first record" if not offsets else "records"
            m = poll_one(first, ctx, awaiting(what), GROUP_TIMEOUT_S, lambda: awaiting(what))
            offsets.append(m.offset())
        check(offsets == list(range(100)), f"first consumer read offsets {offsets[:3]}..., expected 0..99")
        try:
            first.commit(offsets=[TopicPartition(topic, 0, 100)], asynchronous=False)
        except KafkaException as e:
            raise ScenarioFailed(f"OffsetCommit: {describe_error(e)}") from e
        committed = first.committed([TopicPartition(topic, 0)], timeout=ADMIN_TIMEOUT_S)[0]
        check(committed.offset == 100, f"OffsetFetch: committed offset {committed.offset}, expected 100")
    finally:
        first.close()

    second = ctx.consumer(**config)
    try:
        second.subscribe([topic])
        what = "second consumer's first record"
        m = poll_one(second, ctx, what, GROUP_TIMEOUT_S, lambda: awaiting(what))
        check(m.offset() == 100, f"second consumer resumed at offset {m.offset()}, expected 100 (committed)")
        check(m.key() == key(100), f"second consumer read key {m.key()!r} at offset 100")
    finally:
        second.close()
    return "first member read 0..99 and committed 100; second member resumed at 100"


def seek_setup(ctx):
    """A 1-partition topic with records 0..99 whose timestamps are T0 + i*1000 ms."""
    topic = ctx.topic()
    ctx.create_topic(topic, 1)
    t0 = past_timestamp_ms()
    produce_records(ctx, topic, 100, "seek", t0, timestamp_step_ms=1000)
    return topic, t0


def seek_earliest(ctx):
    topic, t0 = seek_setup(ctx)
    consumer = ctx.consumer()
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        m = poll_one(consumer, ctx, "first record after seeking to earliest", CONSUME_TIMEOUT_S)
    finally:
        consumer.close()
    check(m.offset() == 0, f"first record at offset {m.offset()}, expected 0")
    check(m.key() == key(0) and m.timestamp()[1] == t0, f"first record key {m.key()!r} timestamp {m.timestamp()}")
    return "assign(OFFSET_BEGINNING): first record offset 0, T0"


def seek_latest(ctx):
    topic, _ = seek_setup(ctx)
    # enable.partition.eof reports the resolved end offset, so the new record is
    # produced only after the consumer's position is known to be the old end.
    consumer = ctx.consumer(**{"enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_END)])
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        eof_offset = None
        while eof_offset is None:
            check(time.monotonic() < deadline, f"timeout waiting for end of partition after seek to latest; {ctx.errors_seen()}")
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error() is not None and m.error().code() == KafkaError._PARTITION_EOF:
                eof_offset = m.offset()
            elif m.error() is not None:
                raise ScenarioFailed(f"Fetch: {describe_error(m.error())}")
            else:
                raise ScenarioFailed(f"read old record at offset {m.offset()} after seeking to latest")
        check(eof_offset == 100, f"end of partition reported at offset {eof_offset}, expected 100")
        producer = ctx.producer(acks="all")
        producer.produce(topic, key=b"late", value=b"produced-after-seek")
        check(producer.flush(FLUSH_TIMEOUT_S) == 0, "Produce: the late record was not acknowledged")
        m = poll_one(consumer, ctx, "the record produced after the seek", CONSUME_TIMEOUT_S)
    finally:
        consumer.close()
    check(m.offset() == 100 and m.key() == b"late", f"first record read: offset {m.offset()} key {m.key()!r}, expected 100 'late'")
    return "assign(OFFSET_END): end at 100, nothing old read, first record is the new one at offset 100"


def seek_timestamp(ctx):
    topic, t0 = seek_setup(ctx)
    target = t0 + 50 * 1000
    consumer = ctx.consumer()
    try:
        try:
            found = consumer.offsets_for_times([TopicPartition(topic, 0, target)], timeout=ADMIN_TIMEOUT_S)[0]
        except KafkaException as e:
            raise ScenarioFailed(f"ListOffsets (offsets_for_times): {describe_error(e)}") from e
        check(found.error is None, f"ListOffsets (offsets_for_times): {found.error}")
        check(found.offset == 50, f"ListOffsets for T0+50000: offset {found.offset}, expected 50")
        consumer.assign([TopicPartition(topic, 0, found.offset)])
        m = poll_one(consumer, ctx, "record at the offset for the timestamp", CONSUME_TIMEOUT_S)
    finally:
        consumer.close()
    check(m.offset() == 50 and m.timestamp()[1] == target, f"read offset {m.offset()} timestamp {m.timestamp()}")
    return "offsets_for_times(T0+50000) = 50; record 50 read with that timestamp"


def large_value(size):
    # A deterministic, barely compressible pattern so truncation or corruption shows.
    block = hashlib.sha256(b"compat").digest() * 2048
    return (block * (size // len(block) + 1))[:size]


def large_near_max(ctx):
    topic = ctx.topic()
    ctx.create_topic(topic, 1)
    payload = large_value(1_000_000)
    producer = ctx.producer(
        acks="all", **{"message.max.bytes": RAISED_LIMIT_BYTES, "batch.size": RAISED_LIMIT_BYTES, "compression.type": "none"}
    )
    errors = []
    producer.produce(topic, key=b"large", value=payload, on_delivery=lambda err, msg: err and errors.append(err))
    remaining = producer.flush(FLUSH_TIMEOUT_S)
    if errors:
        raise ScenarioFailed(f"Produce: {describe_error(errors[0])}")
    check(remaining == 0, f"Produce: record unacknowledged after {FLUSH_TIMEOUT_S:.0f} s; {ctx.errors_seen()}")
    messages = consume_assigned(
        ctx, [(topic, 0)], 1, **{"fetch.max.bytes": RAISED_LIMIT_BYTES * 2, "max.partition.fetch.bytes": RAISED_LIMIT_BYTES}
    )
    got = messages[0].value()
    check(got == payload, f"value read back has {len(got or b'')} bytes or differs from the 1000000 produced")
    return "1000000-byte value produced and consumed intact"


def large_above_max(ctx):
    topic = ctx.topic()
    ctx.create_topic(topic, 1)
    producer = ctx.producer(
        acks="all",
        **{
            "message.max.bytes": RAISED_LIMIT_BYTES,
            "batch.size": RAISED_LIMIT_BYTES,
            "compression.type": "none",
            "message.timeout.ms": int(FLUSH_TIMEOUT_S * 1000),
        },
    )
    reports = []
    # produce() itself raises only for the client-side limit, raised here above the
    # record's size: any MSG_SIZE_TOO_LARGE seen in the delivery report is the broker's.
    producer.produce(topic, key=b"large", value=large_value(1_100_000), on_delivery=lambda err, msg: reports.append(err))
    producer.flush(FLUSH_TIMEOUT_S + 5)
    check(reports, f"no delivery report within {FLUSH_TIMEOUT_S:.0f} s; {ctx.errors_seen()}")
    err = reports[0]
    check(err is not None, "Produce of a 1100000-byte record was acknowledged; expected MESSAGE_TOO_LARGE (10)")
    check(
        err.code() == KafkaError.MSG_SIZE_TOO_LARGE,
        f"Produce failed with {describe_error(err)}, expected MESSAGE_TOO_LARGE (10)",
    )
    return f"broker rejected the 1100000-byte record: {err.name()} (code {err.code()})"


def partitions_many(ctx):
    topic = ctx.topic()
    count = 200
    ctx.create_topic(topic, count)
    base = past_timestamp_ms()
    producer = ctx.producer(acks="all")
    acks = {}
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            acks[msg.partition()] = (msg.key(), msg.offset())

    for p in range(count):
        producer.produce(topic, partition=p, key=f"p{p}".encode(), value=b"one", timestamp=base + p, on_delivery=on_delivery)
        producer.poll(0)
    remaining = producer.flush(FLUSH_TIMEOUT_S)
    if errors:
        raise ScenarioFailed(f"Produce: {describe_error(errors[0])}")
    check(remaining == 0 and len(acks) == count, f"Produce: {len(acks)} of {count} acknowledged; {ctx.errors_seen()}")
    messages = consume_assigned(ctx, [(topic, p) for p in range(count)], count)
    seen = {}
    for m in messages:
        check(m.partition() not in seen, f"partition {m.partition()} read twice")
        check(m.key() == f"p{m.partition()}".encode() and m.offset() == 0, f"partition {m.partition()}: key {m.key()!r} offset {m.offset()}")
        seen[m.partition()] = m
    check(len(seen) == count, f"read {len(seen)} of {count} partitions")
    return f"{count} partitions, one record each produced and consumed"


def unknown_autocreate(ctx):
    topic = ctx.topic()
    ctx.created.append(topic)
    producer = ctx.producer(acks="all", **{"allow.auto.create.topics": True, "message.timeout.ms": int(FLUSH_TIMEOUT_S * 1000)})
    reports = []
    producer.produce(topic, key=b"auto", value=b"created-by-produce", on_delivery=lambda err, msg: reports.append((err, msg)))
    producer.flush(FLUSH_TIMEOUT_S + 5)
    check(reports, f"no delivery report for the produce to a new topic; {ctx.errors_seen()}")
    err, msg = reports[0]
    if err is not None:
        raise ScenarioFailed(f"Produce to a nonexistent topic: {describe_error(err)}")
    messages = consume_assigned(ctx, [(topic, msg.partition())], 1)
    m = messages[0]
    check(m.key() == b"auto" and m.value() == b"created-by-produce", f"read key {m.key()!r} value {m.value()!r}")
    return f"auto-created, record acked at partition {msg.partition()} offset {msg.offset()} and consumed"


def unknown_noautocreate(ctx):
    topic = ctx.topic()
    consumer = ctx.consumer(**{"allow.auto.create.topics": False})
    try:
        md = consumer.list_topics(topic=topic, timeout=ADMIN_TIMEOUT_S)
    finally:
        consumer.close()
    t = md.topics.get(topic)
    check(t is not None, "Metadata: the topic is missing from the response (no error reported)")
    check(t.error is not None, f"Metadata: no error for the nonexistent topic ({len(t.partitions)} partitions)")
    check(
        t.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART,
        f"Metadata: {describe_error(t.error)}, expected UNKNOWN_TOPIC_OR_PARTITION",
    )
    # Kafka creates auto topics asynchronously after answering; give a wrongly
    # triggered creation time to show before looking.
    time.sleep(1.5)
    if topic in ctx.admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics:
        ctx.created.append(topic)
        raise ScenarioFailed("the topic was created although allow.auto.create.topics=false")
    return "Metadata: UNKNOWN_TOPIC_OR_PARTITION, topic not created"


# ---------------------------------------------------------------- consumer groups (issue 5)

REBALANCE_PARTITIONS = 6
# Records per produce phase; phase 2 starts only after the membership change.
PHASE_RECORDS = 3000
# Produce rate of each phase: 3000 records take about 6 s, so the change lands mid-stream.
RECORDS_PER_SECOND = 500
# The membership change waits for a stable 3-member assignment and this many processed records.
CHANGE_AFTER_RECORDS = 1000
STABLE_WAIT_S = 30.0
DRAIN_WAIT_S = 30.0
GROUP_SCENARIO_TIMEOUT_S = 90.0


class Tracker:
    """What the group did to the topic: per partition the highest committed offset (taken when a
    synchronous commit returned) and every processed offset. A delivery below the committed offset
    of its moment is a violation; one at or above it that was processed before is a duplicate."""

    def __init__(self, partitions):
        self.lock = threading.Lock()
        self.committed = [0] * partitions
        self.processed = [set() for _ in range(partitions)]
        self.violations = []
        self.errors = []
        self.duplicates = 0
        self.commit_failures = 0

    def deliver(self, member, partition, offset):
        with self.lock:
            if offset < self.committed[partition]:
                self.violations.append(
                    f"{member} got partition {partition} offset {offset} below the committed {self.committed[partition]}"
                )
            if offset in self.processed[partition]:
                self.duplicates += 1
            else:
                self.processed[partition].add(offset)

    def commit_done(self, offsets):
        with self.lock:
            for tp in offsets:
                self.committed[tp.partition] = max(self.committed[tp.partition], tp.offset)

    def unique(self):
        with self.lock:
            return sum(len(s) for s in self.processed)


class Member:
    """One group member on its own thread with its own Consumer: polls, processes (records the
    delivery), commits the processed offsets synchronously after every poll (a refused commit is
    retried after the next poll for the partitions it still owns) and tracks what it owns through
    its rebalance callbacks."""

    def __init__(self, ctx, name, config, topic, tracker):
        self.ctx, self.name, self.config, self.topic, self.tracker = ctx, name, config, topic, tracker
        self.owned = set()
        self.processed = 0
        self.stop = False
        self.thread = threading.Thread(target=self.run, name=name, daemon=True)
        # librdkafka's statistics name the group step a stuck member waits on.
        self.group_state = "unknown"
        self.config = dict(config, **{"statistics.interval.ms": 1000, "stats_cb": self.on_stats})

    def on_stats(self, stats_json):
        cgrp = json.loads(stats_json).get("cgrp") or {}
        self.group_state = f"{cgrp.get('state')}/{cgrp.get('join_state')}"

    def state(self):
        step = GROUP_STEPS.get(self.group_state.split("/")[0], "")
        return f"{self.name} {self.group_state}{' (' + step + ')' if step else ''}"

    def on_assign(self, consumer, partitions):
        self.owned.update(tp.partition for tp in partitions)

    def on_revoke(self, consumer, partitions):
        self.owned.difference_update(tp.partition for tp in partitions)

    def run(self):
        try:
            consumer = self.ctx.consumer(**self.config)
        except Exception as e:  # noqa: BLE001
            self.tracker.errors.append(f"member {self.name}: {describe_error(e)}")
            return
        try:
            consumer.subscribe([self.topic], on_assign=self.on_assign, on_revoke=self.on_revoke, on_lost=self.on_revoke)
            pending = {}
            while not self.stop:
                batch = consumer.consume(num_messages=100, timeout=0.2)
                for m in batch:
                    if m.error() is not None:
                        raise ScenarioFailed(f"member {self.name} Fetch: {describe_error(m.error())}")
                    self.tracker.deliver(self.name, m.partition(), m.offset())
                    self.processed += 1
                    pending[m.partition()] = m.offset() + 1
                owned_now = {tp.partition for tp in consumer.assignment()}
                pending = {p: o for p, o in pending.items() if p in owned_now}
                if not pending:
                    continue
                offsets = [TopicPartition(self.topic, p, o) for p, o in pending.items()]
                try:
                    consumer.commit(offsets=offsets, asynchronous=False)
                    self.tracker.commit_done(offsets)
                    pending = {}
                except KafkaException as e:
                    print(f"member {self.name}: commit failed: {describe_error(e)}", file=sys.stderr)
                    with self.tracker.lock:
                        self.tracker.commit_failures += 1
        except Exception as e:  # noqa: BLE001 - reported by the scenario thread
            self.tracker.errors.append(f"member {self.name}: {describe_error(e)}")
        finally:
            consumer.close()

    def stop_and_wait(self):
        self.stop = True
        self.thread.join(20)
        check(not self.thread.is_alive(), f"member {self.name} did not close within 20 s (LeaveGroup)")


def await_condition(tracker, what, bound_s, done):
    deadline = time.monotonic() + bound_s
    while not done():
        check(not tracker.errors, "; ".join(tracker.errors[:2]))
        if time.monotonic() > deadline:
            raise ScenarioFailed(f"{what() if callable(what) else what} (waited {bound_s:.0f} s)")
        time.sleep(0.05)


def fully_assigned(members, partitions):
    """Every member owns partitions, none is owned twice, all are owned."""
    owned = [set(m.owned) for m in members]
    union = set().union(*owned)
    return all(owned) and len(union) == partitions and sum(len(o) for o in owned) == partitions


def assignments(members):
    return " ".join(f"{m.name}={sorted(m.owned)}" for m in members)


def produce_phase(ctx, producer, topic, start, n, log_end):
    """Produces records start..start+n-1 at RECORDS_PER_SECOND and waits for every ack."""
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            log_end[msg.partition()] = max(log_end[msg.partition()], msg.offset() + 1)

    began = time.monotonic()
    for i in range(start, start + n):
        producer.produce(topic, key=key(i), value=f"rebalance-{i}".encode(), on_delivery=on_delivery)
        producer.poll(0)
        wait = began + (i - start + 1) / RECORDS_PER_SECOND - time.monotonic()
        if wait > 0:
            time.sleep(wait)
    remaining = producer.flush(FLUSH_TIMEOUT_S)
    if errors:
        raise ScenarioFailed(f"Produce: {describe_error(errors[0])}")
    check(remaining == 0, f"Produce: {remaining} records unacknowledged; {ctx.errors_seen()}")


def await_partitions_ready(ctx, topic, partitions):
    """Waits until ListOffsets answers for every partition of the new topic: right after
    CreateTopics Kafka answers NOT_LEADER_OR_FOLLOWER for a moment, and producing into that
    window made the Java idempotent producer stall on a loaded machine."""
    deadline = time.monotonic() + ADMIN_TIMEOUT_S
    request = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}
    while True:
        try:
            for future in ctx.admin.list_offsets(request, request_timeout=ADMIN_TIMEOUT_S).values():
                future.result(timeout=ADMIN_TIMEOUT_S)
            return
        except KafkaException as e:
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"ListOffsets on the new topic {topic}: {describe_error(e)}") from e
            time.sleep(0.2)


def group_rebalance(protocol):
    def run(ctx):
        topic = ctx.topic()
        group = f"{topic}-group"
        ctx.create_topic(topic, REBALANCE_PARTITIONS)
        await_partitions_ready(ctx, topic, REBALANCE_PARTITIONS)
        config = {"group.id": group, "auto.offset.reset": "earliest", "group.protocol": protocol}
        if protocol == "classic":
            # librdkafka's default assignors (range,roundrobin), eager rebalancing.
            config.update({"session.timeout.ms": 10000, "heartbeat.interval.ms": 1000})
        tracker = Tracker(REBALANCE_PARTITIONS)
        log_end = [0] * REBALANCE_PARTITIONS
        producer = ctx.producer(acks="all")
        members = [Member(ctx, f"m{i}", config, topic, tracker) for i in (1, 2, 3)]
        all_members = list(members)
        try:
            phase1_errors = []

            def phase1():
                try:
                    produce_phase(ctx, producer, topic, 0, PHASE_RECORDS, log_end)
                except Exception as e:  # noqa: BLE001
                    phase1_errors.append(describe_error(e))
                    tracker.errors.append(f"produce phase 1: {describe_error(e)}")

            producing = threading.Thread(target=phase1, daemon=True)
            producing.start()
            for m in members:
                m.thread.start()
            await_condition(
                tracker,
                lambda: f"3 members never held all {REBALANCE_PARTITIONS} partitions while processing "
                f"({assignments(members)}, {tracker.unique()} processed; group states: "
                f"{', '.join(m.state() for m in members)}; {ctx.errors_seen()})"
                + (
                    "; group.protocol=consumer needs ConsumerGroupHeartbeat (key 68): librdkafka reports no error "
                    "when the broker does not advertise it"
                    if protocol == "consumer" and tracker.unique() == 0
                    else ""
                ),
                STABLE_WAIT_S,
                lambda: fully_assigned(members, REBALANCE_PARTITIONS) and tracker.unique() >= CHANGE_AFTER_RECORDS,
            )
            before = assignments(members)
            processed_before = tracker.unique()
            # Mid-stream: m1 leaves (closes) and m4 joins.
            members[0].stop_and_wait()
            m4 = Member(ctx, "m4", config, topic, tracker)
            all_members.append(m4)
            m4.thread.start()
            after = [members[1], members[2], m4]
            await_condition(
                tracker,
                lambda: f"after m1 left and m4 joined the members never held all partitions ({assignments(after)})",
                STABLE_WAIT_S,
                lambda: fully_assigned(after, REBALANCE_PARTITIONS),
            )
            after_text = assignments(after)
            producing.join(30)
            check(not phase1_errors, f"produce phase 1: {phase1_errors}")
            produce_phase(ctx, producer, topic, PHASE_RECORDS, PHASE_RECORDS, log_end)
            total = 2 * PHASE_RECORDS
            await_condition(tracker, lambda: f"processed {tracker.unique()} of {total} records", DRAIN_WAIT_S,
                            lambda: tracker.unique() >= total)
            await_condition(
                tracker,
                lambda: f"committed offsets {tracker.committed} never reached the log end offsets {log_end}",
                DRAIN_WAIT_S,
                lambda: tracker.committed == log_end,
            )
            for m in after:
                m.stop_and_wait()
            check(not tracker.violations, f"redelivered below the committed offset: {tracker.violations[:5]}")
            for p in range(REBALANCE_PARTITIONS):
                check(
                    tracker.processed[p] == set(range(log_end[p])),
                    f"partition {p}: processed {len(tracker.processed[p])} distinct offsets, log end {log_end[p]}",
                )
            futures = ctx.admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group)], request_timeout=ADMIN_TIMEOUT_S
            )
            try:
                result = futures[group].result(timeout=ADMIN_TIMEOUT_S + 5)
            except KafkaException as e:
                raise ScenarioFailed(f"OffsetFetch: {describe_error(e)}") from e
            fetched = {tp.partition: tp.offset for tp in result.topic_partitions if tp.topic == topic}
            check(
                all(fetched.get(p) == log_end[p] for p in range(REBALANCE_PARTITIONS)),
                f"OffsetFetch: committed {fetched}, log end {log_end}",
            )
            try:
                ctx.admin.delete_consumer_groups([group], request_timeout=ADMIN_TIMEOUT_S)[group].result(
                    timeout=ADMIN_TIMEOUT_S + 5
                )
            except Exception as e:  # noqa: BLE001 - cleanup
                print(f"delete group {group}: {describe_error(e)}", file=sys.stderr)
            return (
                f"{total} records all processed ({processed_before} before the change), {tracker.duplicates} "
                f"duplicates above the last commit, {tracker.commit_failures} refused commits, 0 below a commit; "
                f"group.protocol={protocol}, synchronous commit after every consume(); before {before}; "
                f"after {after_text}; m4 processed {m4.processed}; committed = log end {log_end}"
            )
        finally:
            for m in all_members:
                m.stop = True

    return run


# --- transactions (issue 30) -------------------------------------------------------
#
# Exact checks, as the Java family's TxnScenarios: which records read_committed and
# read_uncommitted consumers see, at which offsets (one control record per partition and
# transaction), the end offsets while a transaction is open, and where a group's offsets
# stand. The producers keep librdkafka's defaults otherwise.

TXN_TIMEOUT_S = 20.0


class TxnProducer:
    """A Producer that keeps every delivery report: acks[tag] lists the (partition, offset,
    index) of each record of that tag in send order. With a transactional_id it is
    transactional and initialized (InitProducerId)."""

    def __init__(self, ctx, transactional_id=None):
        self.ctx = ctx
        self.errors = []
        self.acks = {}
        config = {"acks": "all"}
        if transactional_id is not None:
            config["transactional.id"] = transactional_id
        self.producer = ctx.producer(**config)
        if transactional_id is not None:
            self.call("InitProducerId (init_transactions)", self.producer.init_transactions, TXN_TIMEOUT_S)

    def call(self, what, fn, *args):
        try:
            return fn(*args)
        except KafkaException as e:
            raise ScenarioFailed(f"{what}: {describe_error(e)}") from e

    def send(self, topic, partition, tag, i, value_bytes=None, key_bytes=None):
        def on_delivery(err, msg):
            if err is not None:
                self.errors.append(err)
            else:
                self.acks.setdefault(tag, []).append((msg.partition(), msg.offset(), i))

        self.producer.produce(
            topic,
            key=key(i) if key_bytes is None else key_bytes,
            value=value(tag, i) if value_bytes is None else value_bytes,
            partition=partition,
            on_delivery=on_delivery,
        )
        self.producer.poll(0)

    def flush(self):
        remaining = self.producer.flush(FLUSH_TIMEOUT_S)
        check(not self.errors, f"Produce: {describe_error(self.errors[0]) if self.errors else ''}")
        check(remaining == 0, f"Produce: {remaining} records unacknowledged; {self.ctx.errors_seen()}")

    def begin(self):
        self.call("begin_transaction", self.producer.begin_transaction)

    def commit(self):
        self.call("EndTxn (commit_transaction)", self.producer.commit_transaction, TXN_TIMEOUT_S)
        check(not self.errors, f"Produce: {describe_error(self.errors[0]) if self.errors else ''}")

    def abort(self):
        self.call("EndTxn (abort_transaction)", self.producer.abort_transaction, TXN_TIMEOUT_S)


def txn_create_topic(ctx, topic, partitions):
    ctx.create_topic(topic, partitions)
    await_partitions_ready(ctx, topic, partitions)


def by_partition(acks):
    """{partition: [(offset, index), ...] sorted by offset}."""
    out = {}
    for p, offset, i in acks:
        out.setdefault(p, []).append((offset, i))
    for v in out.values():
        v.sort()
    return out


def check_read(messages, expected, what):
    """The messages are exactly the expected (partition, offset, tag, index) records: per
    partition the same offsets in order, each with key-i and the value of its tag and i."""
    want = {}
    for p, offset, tag, i in expected:
        want.setdefault(p, []).append((offset, tag, i))
    got = {}
    for m in messages:
        got.setdefault(m.partition(), []).append(m)
    check(set(got) <= set(want), f"{what}: records from partitions {sorted(got)}, expected only {sorted(want)}")
    for p, records in want.items():
        records.sort()
        read = got.get(p, [])
        offsets = [m.offset() for m in read]
        check(offsets == [o for o, _, _ in records], f"{what} partition {p}: read offsets {offsets}, expected {[o for o, _, _ in records]}")
        for m, (offset, tag, i) in zip(read, records):
            check(m.key() == key(i) and m.value() == value(tag, i), f"{what} partition {p} offset {offset}: not record {i} of {tag}")


def tagged(acks, tag):
    return [(p, o, tag, i) for p, o, i in acks]


def await_high_watermarks(ctx, topic, partitions, isolation, expected, when):
    """Waits until a consumer with that isolation level reads the expected end offsets
    (ListOffsets latest: the last stable offset under read_committed, the high watermark
    otherwise); the commit markers are written after EndTxn returns."""
    consumer = ctx.consumer(**{"isolation.level": isolation})
    try:
        deadline = time.monotonic() + TXN_TIMEOUT_S
        while True:
            seen = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=ADMIN_TIMEOUT_S, cached=False)[1]
                    for p in range(partitions)]
            if seen == expected:
                return seen
            check(time.monotonic() < deadline, f"{isolation} end offsets {when}: {seen}, expected {expected}")
            time.sleep(0.1)
    finally:
        consumer.close()


def read_isolated(ctx, topic, partitions, n, isolation):
    return consume_assigned(ctx, [(topic, p) for p in range(partitions)], n, **{"isolation.level": isolation})


TXN_COMMIT_PARTITIONS = 3
TXN_COMMIT_TRANSACTIONS = 3
TXN_COMMIT_RECORDS = 60


def txn_commit(ctx):
    """Three committed transactions of 60 records over 3 partitions (record i to partition
    i % 3): read_committed reads exactly them at their acknowledged offsets in order; each
    transaction is followed by exactly one control record per partition."""
    topic = ctx.topic()
    txn_create_topic(ctx, topic, TXN_COMMIT_PARTITIONS)
    producer = TxnProducer(ctx, f"{topic}-tx")
    for t in range(TXN_COMMIT_TRANSACTIONS):
        producer.begin()
        for j in range(TXN_COMMIT_RECORDS):
            i = t * TXN_COMMIT_RECORDS + j
            producer.send(topic, i % TXN_COMMIT_PARTITIONS, f"t{t}", i)
        producer.commit()
    per_partition = TXN_COMMIT_RECORDS // TXN_COMMIT_PARTITIONS
    ends = []
    for p in range(TXN_COMMIT_PARTITIONS):
        previous_last = -2
        for t in range(TXN_COMMIT_TRANSACTIONS):
            offsets = [o for o, _ in by_partition(producer.acks[f"t{t}"]).get(p, [])]
            check(
                offsets == list(range(previous_last + 2, previous_last + 2 + per_partition)),
                f"partition {p}: transaction {t} acknowledged at {offsets[:1]}..{offsets[-1:]}, expected {per_partition} "
                f"offsets from {previous_last + 2} (one commit marker after the previous transaction)",
            )
            previous_last = offsets[-1]
        ends.append(previous_last + 2)
    n = TXN_COMMIT_TRANSACTIONS * TXN_COMMIT_RECORDS
    expected = [r for t in range(TXN_COMMIT_TRANSACTIONS) for r in tagged(producer.acks[f"t{t}"], f"t{t}")]
    check_read(read_isolated(ctx, topic, TXN_COMMIT_PARTITIONS, n, "read_committed"), expected, "read_committed")
    await_high_watermarks(ctx, topic, TXN_COMMIT_PARTITIONS, "read_committed", ends, "after the last commit")
    await_high_watermarks(ctx, topic, TXN_COMMIT_PARTITIONS, "read_uncommitted", ends, "after the last commit")
    return (
        f"{TXN_COMMIT_TRANSACTIONS} transactions x {TXN_COMMIT_RECORDS} records over {TXN_COMMIT_PARTITIONS} partitions "
        f"read back exactly (read_committed, offsets, order); one marker per partition and transaction, end offsets {ends}"
    )


TXN_ABORT_PARTITIONS = 2
TXN_ABORT_PER_PARTITION = 5


def txn_abort(ctx):
    """Two producers interleave on 2 partitions: P1 commits c0; P1 opens a1, P2 writes c2
    after it and commits; while a1 is open, read_committed end offsets are the first offsets
    of a1 (the last stable offset) and a read_committed consumer sees c0 only. P1 aborts a1
    and commits c3: read_committed then sees c0 c2 c3, read_uncommitted all four."""
    topic = ctx.topic()
    txn_create_topic(ctx, topic, TXN_ABORT_PARTITIONS)
    p1 = TxnProducer(ctx, f"{topic}-tx1")
    p2 = TxnProducer(ctx, f"{topic}-tx2")

    def send_all(producer, tag, base):
        for j in range(TXN_ABORT_PER_PARTITION * TXN_ABORT_PARTITIONS):
            producer.send(topic, j % TXN_ABORT_PARTITIONS, tag, base + j)
        producer.flush()

    p1.begin()
    send_all(p1, "c0", 0)
    p1.commit()
    p1.begin()
    send_all(p1, "a1", 100)
    p2.begin()
    send_all(p2, "c2", 200)
    p2.commit()
    a1 = by_partition(p1.acks["a1"])
    c2 = by_partition(p2.acks["c2"])
    lso = [a1[p][0][0] for p in range(TXN_ABORT_PARTITIONS)]
    open_end = [c2[p][-1][0] + 2 for p in range(TXN_ABORT_PARTITIONS)]
    await_high_watermarks(ctx, topic, TXN_ABORT_PARTITIONS, "read_uncommitted", open_end, "while a1 is open")
    await_high_watermarks(ctx, topic, TXN_ABORT_PARTITIONS, "read_committed", lso, "while a1 is open (last stable offset)")
    c0_n = TXN_ABORT_PER_PARTITION * TXN_ABORT_PARTITIONS
    stable = read_isolated(ctx, topic, TXN_ABORT_PARTITIONS, c0_n, "read_committed")
    check_read(stable, tagged(p1.acks["c0"], "c0"), "read_committed while a1 is open")
    p1.abort()
    p1.begin()
    send_all(p1, "c3", 300)
    p1.commit()
    c3 = by_partition(p1.acks["c3"])
    end = [c3[p][-1][0] + 2 for p in range(TXN_ABORT_PARTITIONS)]
    check(
        end == [4 * TXN_ABORT_PER_PARTITION + 4] * TXN_ABORT_PARTITIONS,
        f"log end {end} after 4 transactions of {TXN_ABORT_PER_PARTITION} records per partition, "
        f"expected {4 * TXN_ABORT_PER_PARTITION + 4} (one marker each)",
    )
    await_high_watermarks(ctx, topic, TXN_ABORT_PARTITIONS, "read_committed", end, "after a1 aborted, c3 committed")
    await_high_watermarks(ctx, topic, TXN_ABORT_PARTITIONS, "read_uncommitted", end, "after a1 aborted, c3 committed")
    committed = tagged(p1.acks["c0"], "c0") + tagged(p2.acks["c2"], "c2") + tagged(p1.acks["c3"], "c3")
    everything = committed + tagged(p1.acks["a1"], "a1")
    check_read(read_isolated(ctx, topic, TXN_ABORT_PARTITIONS, len(committed), "read_committed"), committed, "read_committed")
    check_read(
        read_isolated(ctx, topic, TXN_ABORT_PARTITIONS, len(everything), "read_uncommitted"), everything, "read_uncommitted"
    )
    return (
        f"while a1 open: read_committed end offsets = LSO {lso}, read_uncommitted {open_end}, only c0 visible; after "
        f"abort: read_committed {len(committed)} records (c0 c2 c3), read_uncommitted {len(everything)} (with a1), end {end}"
    )


TXN_OFFSETS_PARTITIONS = 3
TXN_OFFSETS_PER_PARTITION = 20
TXN_ABORTED_ROUND = 1


def stable_group_offsets(ctx, group, topic):
    """The group's committed offsets of topic (OffsetFetch with require_stable). While a
    transactional offset commit is pending (its marker not yet written) the broker answers
    UNSTABLE_OFFSET_COMMIT for that partition, which librdkafka's admin call returns as a
    per-partition error without retrying; it is retried here within TXN_TIMEOUT_S."""
    deadline = time.monotonic() + TXN_TIMEOUT_S
    while True:
        futures = ctx.admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group)], require_stable=True, request_timeout=ADMIN_TIMEOUT_S
        )
        try:
            result = futures[group].result(timeout=ADMIN_TIMEOUT_S + 5)
        except KafkaException as e:
            raise ScenarioFailed(f"OffsetFetch (require_stable): {describe_error(e)}") from e
        mine = [tp for tp in result.topic_partitions if tp.topic == topic]
        errors = [tp.error for tp in mine if tp.error is not None]
        if errors and all(e.code() == KafkaError.UNSTABLE_OFFSET_COMMIT for e in errors) and time.monotonic() < deadline:
            time.sleep(0.05)
            continue
        check(not errors, f"OffsetFetch (require_stable): {describe_error(errors[0]) if errors else ''}")
        return {tp.partition: tp.offset for tp in mine if tp.offset >= 0}


def txn_offsets(ctx):
    """Read-process-write: a group consumer (read_committed) reads input A; each consume()
    batch goes to B with its offsets through send_offsets_to_transaction(positions,
    consumer_group_metadata()) in one transaction. Round 1 is aborted: the group's offsets must
    not move and the consumer rewinds. B under read_committed then holds every input record
    exactly once in input order per partition; the group's offsets equal A's end offsets."""
    source = ctx.topic("-in")
    sink = ctx.topic("-out")
    group = f"{source}-group"
    n = TXN_OFFSETS_PARTITIONS * TXN_OFFSETS_PER_PARTITION
    txn_create_topic(ctx, source, TXN_OFFSETS_PARTITIONS)
    txn_create_topic(ctx, sink, TXN_OFFSETS_PARTITIONS)
    plain = TxnProducer(ctx)
    for i in range(n):
        plain.send(source, i % TXN_OFFSETS_PARTITIONS, "in", i)
    plain.flush()

    producer = TxnProducer(ctx, f"{sink}-tx")
    consumer = ctx.consumer(**{
        "group.id": group,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    })
    committed = {}
    processed = 0
    rounds = 0
    aborted = 0
    abort_detail = ""
    try:
        consumer.subscribe([source])
        last_progress = time.monotonic()
        while processed < n:
            batch = [m for m in consumer.consume(num_messages=10, timeout=0.5) if m.error() is None]
            if not batch:
                check(
                    time.monotonic() - last_progress < TXN_TIMEOUT_S,
                    f"group consumer read {processed} of {n} input records, then nothing for {TXN_TIMEOUT_S:.0f} s",
                )
                continue
            last_progress = time.monotonic()
            firsts, nexts = {}, {}
            producer.begin()
            for m in batch:
                firsts.setdefault(m.partition(), m.offset())
                nexts[m.partition()] = m.offset() + 1
                producer.send(sink, m.partition(), "out", 0, value_bytes=b"out-" + m.value(), key_bytes=m.key())
            offsets = [TopicPartition(source, p, o) for p, o in nexts.items()]
            producer.call(
                "TxnOffsetCommit (send_offsets_to_transaction)",
                producer.producer.send_offsets_to_transaction,
                offsets,
                consumer.consumer_group_metadata(),
                TXN_TIMEOUT_S,
            )
            if rounds == TXN_ABORTED_ROUND:
                # Flushed first: abort_transaction purges messages not yet sent (_PURGE_QUEUE),
                # and the check below counts the aborted round's records in the output log.
                producer.flush()
                producer.abort()
                aborted = len(batch)
                stable = stable_group_offsets(ctx, group, source)
                check(stable == committed, f"OffsetFetch after the aborted round: {stable}, expected the offsets before it {committed}")
                abort_detail = f"offsets after the aborted round of {aborted} records unchanged {committed}"
                for p, o in firsts.items():
                    consumer.seek(TopicPartition(source, p, o))
            else:
                producer.commit()
                committed.update(nexts)
                processed += len(batch)
            rounds += 1
    finally:
        consumer.close()
    check(rounds > TXN_ABORTED_ROUND + 1, f"only {rounds} rounds: the aborted round was the last")
    final = stable_group_offsets(ctx, group, source)
    check(
        final == {p: TXN_OFFSETS_PER_PARTITION for p in range(TXN_OFFSETS_PARTITIONS)},
        f"OffsetFetch at the end: {final}, expected {TXN_OFFSETS_PER_PARTITION} per partition",
    )
    out = read_isolated(ctx, sink, TXN_OFFSETS_PARTITIONS, n, "read_committed")
    got = {}
    for m in out:
        got.setdefault(m.partition(), []).append(m.value())
    for p in range(TXN_OFFSETS_PARTITIONS):
        want = [b"out-" + value("in", j * TXN_OFFSETS_PARTITIONS + p) for j in range(TXN_OFFSETS_PER_PARTITION)]
        check(got.get(p) == want, f"output partition {p}: {len(got.get(p, []))} records, not each input record once in order")
    everything = read_isolated(ctx, sink, TXN_OFFSETS_PARTITIONS, n + aborted, "read_uncommitted")
    check(len(everything) == n + aborted, f"output under read_uncommitted: {len(everything)}, expected {n} + {aborted} aborted")
    try:
        ctx.admin.delete_consumer_groups([group], request_timeout=ADMIN_TIMEOUT_S)[group].result(timeout=ADMIN_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - cleanup
        print(f"delete group {group}: {describe_error(e)}", file=sys.stderr)
    return (
        f"{n} input records in {rounds} transactions (round {TXN_ABORTED_ROUND} aborted); {abort_detail}; output "
        f"read_committed exactly once in order, read_uncommitted {n + aborted} (+{aborted} aborted); group offsets = "
        f"end offsets {TXN_OFFSETS_PER_PARTITION}"
    )


RUNNERS = {
    "admin.topics": admin_topics,
    "codec.none": codec("none"),
    "codec.gzip": codec("gzip"),
    "codec.snappy": codec("snappy"),
    "codec.lz4": codec("lz4"),
    "codec.zstd": codec("zstd"),
    "idempotent": idempotent,
    "group.commit": group_commit,
    "seek.earliest": seek_earliest,
    "seek.latest": seek_latest,
    "seek.timestamp": seek_timestamp,
    "large.near_max": large_near_max,
    "large.above_max": large_above_max,
    "partitions.many": partitions_many,
    "unknown.autocreate": unknown_autocreate,
    "unknown.noautocreate": unknown_noautocreate,
    "group.rebalance": group_rebalance("classic"),
    "group.rebalance.consumer": group_rebalance("consumer"),
    "txn.commit": txn_commit,
    "txn.abort": txn_abort,
    "txn.offsets": txn_offsets,
}


def run_one(bootstrap, scenario):
    """Runs one scenario in this process and prints its RESULT line."""
    started = time.monotonic()
    ctx = Context(bootstrap, scenario)
    try:
        detail = RUNNERS[scenario](ctx)
        line = f"RESULT {scenario} PASS {one_line(detail)} ({time.monotonic() - started:.1f} s)"
    except NotApplicable as e:
        line = f"RESULT {scenario} NA {one_line(e)}"
    except Exception as e:  # noqa: BLE001 - any error fails this scenario, the next still runs
        line = f"RESULT {scenario} FAIL {one_line(describe_error(e))}"
    print(line, flush=True)
    ctx.delete_created()
    return 0


def run_child(bootstrap, scenario):
    """Runs a scenario in a child process bounded by SCENARIO_TIMEOUT_S (the group scenarios by
    GROUP_SCENARIO_TIMEOUT_S); returns its RESULT line."""
    timeout_s = GROUP_SCENARIO_TIMEOUT_S if scenario.startswith("group.rebalance") else SCENARIO_TIMEOUT_S
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--one", bootstrap, scenario],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        out, _ = child.communicate()
        results = [l for l in out.splitlines() if l.startswith(f"RESULT {scenario} ")]
        # A scenario that reported but hung in cleanup keeps its result.
        return results[0] if results else f"RESULT {scenario} FAIL timeout after {timeout_s:.0f} s"
    results = [l for l in out.splitlines() if l.startswith(f"RESULT {scenario} ")]
    for l in out.splitlines():
        if not l.startswith("RESULT "):
            print(l, file=sys.stderr)
    if results:
        return results[0]
    return f"RESULT {scenario} FAIL client process exited {child.returncode} without a result"


def reachable_error(bootstrap):
    """None when the first bootstrap address accepts a TCP connection, else why not."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
        return None
    except (OSError, ValueError) as e:
        return f"nothing listens on {bootstrap}: {e}"


def main():
    args = sys.argv[1:]
    if len(args) >= 3 and args[0] == "--one":
        return run_one(args[1], args[2])
    if not args:
        print("usage: scenarios.py <bootstrap> [scenario-id ...]", file=sys.stderr)
        return 2
    bootstrap, wanted = args[0], args[1:] or SCENARIOS
    unknown = [s for s in wanted if s not in RUNNERS]
    if unknown:
        print(f"unknown scenario ids: {' '.join(unknown)}", file=sys.stderr)
        return 2
    failed = 0
    unreachable = reachable_error(bootstrap)
    for scenario in wanted:
        # Nothing listening fails every scenario at once instead of timing each out.
        line = f"RESULT {scenario} FAIL {unreachable}" if unreachable else run_child(bootstrap, scenario)
        print(line, flush=True)
        failed += line.split()[2] == "FAIL"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
