#!/usr/bin/env python3
"""Round trip through confluent-kafka (librdkafka): roundtrip.py <bootstrap> [N] [codec,codec,...]

For each compression codec: create a 3-partition topic with the Admin API, produce N
records (distinct keys, two headers, explicit timestamps) with an idempotent acks=all
producer, then read them back with an assigned consumer starting at explicit offsets
and check count, per-partition order, contiguous offsets, key, value, headers,
timestamps and the watermarks that ListOffsets reports. Prints one "PASS python <codec>"
or "FAIL python <codec>: reason" line per codec and exits 1 if any failed.
"""

import sys
import time

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_CREATE_TIME,
    Consumer,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

CLIENT = "python"
PARTITION_COUNT = 3
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
# Bounds on every wait, so a broken broker fails the check instead of hanging it.
ADMIN_TIMEOUT_S = 30.0
FLUSH_TIMEOUT_S = 120.0
IDLE_LIMIT_S = 60.0


class CheckFailed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise CheckFailed(message)


def key(i):
    return f"key-{i}".encode()


def value(codec, i):
    # The value repeats the index so a record delivered under the wrong key is caught.
    return f"value-{i}-{codec}-{'x' * (64 + i % 64)}".encode()


def create_topic(admin, topic):
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=PARTITION_COUNT, replication_factor=1)],
        operation_timeout=ADMIN_TIMEOUT_S,
        request_timeout=ADMIN_TIMEOUT_S,
    )
    for future in futures.values():
        future.result(timeout=ADMIN_TIMEOUT_S)


def produce(bootstrap, topic, codec, n, base_timestamp_ms):
    """Returns (partition, offset) per record index, as acknowledged by the broker."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": codec,
            "linger.ms": 5,
        }
    )
    acks = [None] * n
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            # Delivery reports carry the key (not the headers), and the key holds the index.
            index = int(msg.key()[len(b"key-"):])
            acks[index] = (msg.partition(), msg.offset())

    for i in range(n):
        if errors:
            break
        while True:
            try:
                producer.produce(
                    topic,
                    key=key(i),
                    value=value(codec, i),
                    headers=[("index", str(i).encode()), ("codec", codec.encode())],
                    timestamp=base_timestamp_ms + i,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                # The local queue is full: serve delivery reports until there is room.
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(FLUSH_TIMEOUT_S)
    check(not errors, f"produce failed: {errors[0] if errors else ''}")
    check(remaining == 0, f"{remaining} records still unacknowledged after {FLUSH_TIMEOUT_S} s")
    missing = [i for i, a in enumerate(acks) if a is None]
    check(not missing, f"{len(missing)} records never acknowledged, first {missing[:1]}")
    return acks


def consume(bootstrap, topic, n, start_offsets):
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            # librdkafka requires a group.id, but the consumer never subscribes or commits:
            # assign() with explicit offsets is all it does.
            "group.id": f"compat-python-unused-{topic}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
        }
    )
    by_partition = {p: [] for p in range(PARTITION_COUNT)}
    try:
        consumer.assign(
            [TopicPartition(topic, p, start_offsets[p]) for p in range(PARTITION_COUNT)]
        )
        total = 0
        last_progress = time.monotonic()
        while total < n:
            messages = consumer.consume(num_messages=10000, timeout=0.5)
            now = time.monotonic()
            if not messages:
                check(
                    now - last_progress < IDLE_LIMIT_S,
                    f"consumer stalled at {total} of {n} records for {IDLE_LIMIT_S} s",
                )
                continue
            last_progress = now
            for m in messages:
                if m.error() is not None:
                    raise CheckFailed(f"consume error: {m.error()}")
                by_partition[m.partition()].append(
                    (m.offset(), m.key(), m.value(), m.headers(), m.timestamp())
                )
                total += 1
        # A short extra poll catches records beyond the N produced (duplicates).
        extra = [m for m in consumer.consume(num_messages=100, timeout=0.2) if m.error() is None]
        check(not extra, f"read {len(extra)} records beyond the {n} produced")
    finally:
        consumer.close()
    return by_partition


def watermarks(bootstrap, topic):
    """(low, high) per partition via ListOffsets (cached=False forces a broker request)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"compat-python-unused-{topic}",
            "enable.auto.commit": False,
        }
    )
    try:
        return [
            consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=ADMIN_TIMEOUT_S, cached=False
            )
            for p in range(PARTITION_COUNT)
        ]
    finally:
        consumer.close()


def round_trip(admin, bootstrap, topic, codec, n):
    create_topic(admin, topic)
    # Explicit timestamps in the past, 1 ms apart, so a broker that substitutes its own
    # clock or drops per-record timestamp deltas is caught.
    base_timestamp_ms = int(time.time() * 1000) - 3_600_000
    acks = produce(bootstrap, topic, codec, n, base_timestamp_ms)

    sent_by_partition = {p: [] for p in range(PARTITION_COUNT)}
    for i, (partition, _) in enumerate(acks):
        sent_by_partition[partition].append(i)

    # ListOffsets before consuming gives the explicit start offsets for assign().
    marks = watermarks(bootstrap, topic)
    for p, (low, high) in enumerate(marks):
        check(low == 0, f"partition {p}: earliest offset {low}, expected 0")
        check(
            high == len(sent_by_partition[p]),
            f"partition {p}: latest offset {high}, expected {len(sent_by_partition[p])}",
        )
    read_by_partition = consume(bootstrap, topic, n, [low for low, _ in marks])

    total = 0
    for p in range(PARTITION_COUNT):
        read, sent = read_by_partition[p], sent_by_partition[p]
        check(
            len(read) == len(sent),
            f"partition {p}: read {len(read)} records, {len(sent)} were acknowledged",
        )
        previous = None
        for (offset, k, v, headers, (ts_type, ts)), i in zip(read, sent):
            where = f"partition {p} offset {offset}"
            check(
                previous is None or offset == previous + 1,
                f"{where}: offsets not contiguous (previous {previous})",
            )
            previous = offset
            check(offset == acks[i][1], f"{where}: record {i} was acknowledged at {acks[i][1]}")
            check(k == key(i), f"{where}: key {k!r}, expected {key(i)!r}")
            check(v == value(codec, i), f"{where}: value differs for record {i}")
            check(
                ts_type == TIMESTAMP_CREATE_TIME and ts == base_timestamp_ms + i,
                f"{where}: timestamp type {ts_type} {ts}, expected CreateTime {base_timestamp_ms + i}",
            )
            expected_headers = [("index", str(i).encode()), ("codec", codec.encode())]
            check(headers == expected_headers, f"{where}: headers {headers}")
        total += len(read)
    check(total == n, f"read {total} records in total, produced {n}")
    admin.delete_topics([topic], operation_timeout=ADMIN_TIMEOUT_S)[topic].result(
        timeout=ADMIN_TIMEOUT_S
    )
    sizes = ",".join(str(len(read_by_partition[p])) for p in range(PARTITION_COUNT))
    return f"{n} records, per partition [{sizes}], ListOffsets ok"


def main():
    if len(sys.argv) < 2:
        print("usage: roundtrip.py <bootstrap> [N] [codec,codec,...]", file=sys.stderr)
        return 2
    bootstrap = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    codecs = sys.argv[3].split(",") if len(sys.argv) > 3 else CODECS
    # A run-unique suffix lets the test run again against a broker that kept old topics.
    run_id = str(int(time.time() * 1000))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    passed = failed = 0
    for codec in codecs:
        topic = f"compat-python-{codec}-{run_id}"
        start = time.monotonic()
        try:
            detail = round_trip(admin, bootstrap, topic, codec, n)
            print(f"PASS {CLIENT} {codec}: {detail} in {time.monotonic() - start:.1f} s", flush=True)
            passed += 1
        except Exception as e:  # noqa: BLE001 - any error fails this codec, the next still runs
            print(f"FAIL {CLIENT} {codec}: {type(e).__name__}: {e}", flush=True)
            failed += 1
    print(f"{CLIENT}: {passed} passed, {failed} failed", flush=True)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
