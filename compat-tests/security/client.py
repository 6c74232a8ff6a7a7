"""confluent-kafka (librdkafka) side of the security checks, run by run.sh.

client.py ready <bootstrap> <timeout_s>             a metadata request succeeds
client.py create-topics <bootstrap> <topic>...      1-partition topics (PLAINTEXT admin)
client.py roundtrip <bootstrap> <topic> <n> [-X key=value]...
client.py auth-fail <bootstrap> <timeout_s> <auth|ssl> [-X key=value]...
client.py describe-scram <bootstrap> <user> <mechanism> <iterations>

The last line on stdout is the verdict: "ok ..." (exit 0) or "error: ..." (exit 1).
Client errors go to stderr as they arrive, so a failure names librdkafka's own words.
"""

import sys
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def parse_x(args):
    conf = {}
    it = iter(args)
    for a in it:
        if a != "-X":
            raise SystemExit(f"unexpected argument {a!r}")
        k, _, v = next(it).partition("=")
        conf[k] = v
    return conf


def verdict(ok, text):
    print(("ok " if ok else "error: ") + text, flush=True)
    sys.exit(0 if ok else 1)


class Errors:
    """Collects the client's error callbacks (librdkafka reports connection and
    authentication failures there, not as exceptions)."""

    def __init__(self):
        self.seen = []

    def __call__(self, err):
        print(f"client error: {err.name()}: {err.str()}", file=sys.stderr, flush=True)
        self.seen.append(err)

    def summary(self):
        return "; ".join(f"{e.name()}: {e.str()}" for e in self.seen[:3]) or "none reported"


def ready(bootstrap, timeout_s):
    deadline = time.monotonic() + float(timeout_s)
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    last = None
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=2)
            verdict(True, "metadata served")
        except KafkaException as e:
            last = e
            time.sleep(0.3)
    verdict(False, f"no metadata within {timeout_s} s: {last}")


def create_topics(bootstrap, topics):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, 1, 1) for t in topics], operation_timeout=20, request_timeout=20)
    failed = []
    for t, f in futures.items():
        try:
            f.result(timeout=30)
        except Exception as e:  # noqa: BLE001 - reported as the verdict
            failed.append(f"{t}: {e}")
    # A new topic reaches every listener's metadata a moment after CreateTopics returns.
    deadline = time.monotonic() + 20
    while not failed and time.monotonic() < deadline:
        md = admin.list_topics(timeout=5)
        missing = [t for t in topics if t not in md.topics or md.topics[t].error is not None]
        if not missing:
            verdict(True, f"{len(topics)} topics")
        time.sleep(0.3)
    verdict(False, "; ".join(failed) or "topics not in metadata within 20 s")


def roundtrip(bootstrap, topic, n, conf):
    n = int(n)
    errors = Errors()
    expected = [(f"k-{i}".encode(), f"{topic}-v-{i}".encode()) for i in range(n)]
    producer = Producer(
        {
            **conf,
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "message.timeout.ms": 30000,
            "error_cb": errors,
        }
    )
    delivered, failed = [], []

    def on_delivery(err, msg):
        (failed if err else delivered).append(err or msg.offset())

    for k, v in expected:
        producer.produce(topic, key=k, value=v, partition=0, on_delivery=on_delivery)
        producer.poll(0)
    left = producer.flush(40)
    if failed or left or len(delivered) != n:
        verdict(
            False,
            f"produce: {len(delivered)} of {n} acknowledged, {len(failed)} failed"
            f" (first: {failed[0] if failed else '-'}), {left} unsent; client errors: {errors.summary()}",
        )

    consumer = Consumer(
        {
            **conf,
            "bootstrap.servers": bootstrap,
            # librdkafka wants a group id even for assign(); nothing is committed.
            "group.id": f"sec-{topic}",
            "enable.auto.commit": False,
            "error_cb": errors,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + 40
    while len(got) < n and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                continue
            verdict(False, f"consume: {msg.error()}")
        got.append((msg.key(), msg.value()))
    consumer.close()
    if got != expected:
        first_bad = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), n))
        verdict(
            False,
            f"consume: read {len(got)} of {n} records, first difference at index {first_bad}"
            f" (got {got[first_bad] if first_bad < len(got) else 'nothing'}); client errors: {errors.summary()}",
        )
    verdict(True, f"{n} records produced and read back identical")


def auth_fail(bootstrap, timeout_s, kind, conf):
    """A client with bad credentials must be told so (an error callback) and get
    no metadata, within the bound."""
    errors = Errors()
    admin = AdminClient({**conf, "bootstrap.servers": bootstrap, "error_cb": errors})
    wanted = {KafkaError._AUTHENTICATION} if kind == "auth" else {
        KafkaError._SSL,
        KafkaError._AUTHENTICATION,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
    }
    deadline = time.monotonic() + float(timeout_s)
    served = False
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=1)
            served = True
            break
        except KafkaException as e:
            print(f"list_topics: {e}", file=sys.stderr, flush=True)
        # The error callback is served by poll(), not by list_topics().
        admin.poll(0.2)
        if any(e.code() in wanted for e in errors.seen):
            break
    if served:
        verdict(False, "metadata was served despite the bad credentials")
    if not any(e.code() in wanted for e in errors.seen):
        verdict(False, f"no {kind} error reported within {timeout_s} s; client errors: {errors.summary()}")
    verdict(True, f"refused: {errors.summary()}")


def describe_scram(bootstrap, user, mechanism, iterations):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        desc = admin.describe_user_scram_credentials([user], request_timeout=20)[user].result(timeout=30)
    except Exception as e:  # noqa: BLE001 - reported as the verdict
        verdict(False, f"DescribeUserScramCredentials: {e}")
    infos = [(str(i.mechanism).rsplit(".", 1)[-1].replace("_", "-"), i.iterations) for i in desc.scram_credential_infos]
    if (mechanism, int(iterations)) in infos:
        verdict(True, f"{user}: {infos}")
    verdict(False, f"{user}: {infos}, expected {mechanism} with {iterations} iterations")


def main(argv):
    cmd, rest = argv[1], argv[2:]
    if cmd == "ready":
        ready(*rest)
    elif cmd == "create-topics":
        create_topics(rest[0], rest[1:])
    elif cmd == "roundtrip":
        roundtrip(rest[0], rest[1], rest[2], parse_x(rest[3:]))
    elif cmd == "auth-fail":
        auth_fail(rest[0], rest[1], rest[2], parse_x(rest[3:]))
    elif cmd == "describe-scram":
        describe_scram(*rest)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
