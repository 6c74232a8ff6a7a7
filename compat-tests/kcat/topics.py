#!/usr/bin/env python3
"""Topic setup for the kcat scenarios, which kcat cannot do itself (it has no admin
requests): topics.py create <bootstrap> <topic> <partitions> | delete <bootstrap> <topic>...

Uses confluent-kafka's AdminClient from the python family's venv. create waits until
every partition has a leader in the metadata; exits non-zero with the error on stderr.
"""

import sys
import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

TIMEOUT_S = 20.0


def create(admin, topic, partitions):
    future = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)],
        operation_timeout=TIMEOUT_S,
        request_timeout=TIMEOUT_S,
    )[topic]
    future.result(timeout=TIMEOUT_S + 5)
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        t = admin.list_topics(topic=topic, timeout=TIMEOUT_S).topics.get(topic)
        if t is not None and t.error is None and len(t.partitions) == partitions and all(
            p.leader >= 0 for p in t.partitions.values()
        ):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"Metadata: {topic} has no leader for all {partitions} partitions")
        time.sleep(0.2)


def delete(admin, topics):
    for topic, future in admin.delete_topics(topics, operation_timeout=10, request_timeout=10).items():
        future.result(timeout=15)


def main():
    if len(sys.argv) < 4 or sys.argv[1] not in ("create", "delete"):
        print(__doc__, file=sys.stderr)
        return 2
    admin = AdminClient({"bootstrap.servers": sys.argv[2]})
    try:
        if sys.argv[1] == "create":
            create(admin, sys.argv[3], int(sys.argv[4]))
        else:
            delete(admin, sys.argv[3:])
    except (KafkaException, RuntimeError) as e:
        err = e.args[0] if e.args else e
        name = err.name() if hasattr(err, "name") else type(e).__name__
        print(f"{sys.argv[1]} topic: {name}: {err.str() if hasattr(err, 'str') else err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
