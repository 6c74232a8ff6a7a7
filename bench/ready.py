#!/usr/bin/env python3
"""Readiness probe: ready.py [--armed FILE] <host> <port> <timeout_s> [<topic> <partitions>]

Sends a Metadata request (v4, all topics) until one is answered with at least
one broker, then prints the wall-clock time of that answer (seconds since the
epoch, like bash's EPOCHREALTIME) and exits 0; exits 1 at the timeout.
With a topic, it instead sends ListOffsets (v1, latest) for partitions
0..<partitions>-1 until every one is answered without error: a created topic
whose leaders all serve, so that a benchmark does not time partition creation.
--armed FILE is created once the probe runs (after the interpreter started), so
a caller can launch the broker after it and leave the probe's own start-up out
of the broker's start-to-ready time. Connect from the host's loopback only.

The same probe times both brokers' start-to-ready, so the number says when the
broker answers a client, not how long a probing JVM takes to start. Version 4
is the oldest Metadata version Apache Kafka 4.x still serves.
"""
import socket
import struct
import sys
import time

METADATA_API_KEY = 3
METADATA_VERSION = 4
LIST_OFFSETS_API_KEY = 2
LIST_OFFSETS_VERSION = 1
LATEST_TIMESTAMP = -1
# Start-to-ready is polled finely; a topic's partitions coarsely, so that the
# probe does not load a broker that is busy creating them.
READY_POLL_INTERVAL_S = 0.005
TOPIC_POLL_INTERVAL_S = 0.1
CLIENT_ID = b"bench-ready"
# The probe connects from another loopback address: a tight connect loop from
# 127.0.0.1 to a port in the ephemeral range that nobody listens on yet can
# pick that very port as its source and connect to itself (TCP simultaneous
# open), which then holds the port and makes the broker's bind fail.
SOURCE_ADDRESS = ("127.0.0.2", 0)


def request(api_key, api_version, correlation_id, body):
    # Request header v1: api_key, api_version, correlation_id, client_id.
    header = struct.pack(">hhih", api_key, api_version, correlation_id, len(CLIENT_ID)) + CLIENT_ID
    return struct.pack(">i", len(header) + len(body)) + header + body


def metadata_request(correlation_id):
    # Body v4: topics = null (all topics), allow_auto_topic_creation = false.
    return request(METADATA_API_KEY, METADATA_VERSION, correlation_id, struct.pack(">ib", -1, 0))


def list_offsets_request(correlation_id, topic, partitions):
    name = topic.encode()
    # Body v1: replica_id, topics[name, partitions[partition, timestamp]].
    body = struct.pack(">iih", -1, 1, len(name)) + name + struct.pack(">i", partitions)
    body += b"".join(struct.pack(">iq", p, LATEST_TIMESTAMP) for p in range(partitions))
    return request(LIST_OFFSETS_API_KEY, LIST_OFFSETS_VERSION, correlation_id, body)


def all_partitions_answered(body, partitions):
    """Response v1 after the header: topics[name, partitions[partition, error_code, timestamp, offset]]."""
    pos = 0
    (topic_count,) = struct.unpack_from(">i", body, pos)
    pos += 4
    good = set()
    for _ in range(topic_count):
        (name_len,) = struct.unpack_from(">h", body, pos)
        pos += 2 + max(name_len, 0)
        (partition_count,) = struct.unpack_from(">i", body, pos)
        pos += 4
        for _ in range(partition_count):
            partition, error_code, _ts, _offset = struct.unpack_from(">ihqq", body, pos)
            pos += 22
            if error_code == 0:
                good.add(partition)
    return len(good) == partitions


def read_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed by the broker")
        buf += chunk
    return buf


def exchange(host, port, frame, correlation_id, wait_s):
    """Sends one request on a new connection; the response body after its header."""
    with socket.create_connection((host, port), timeout=wait_s, source_address=SOURCE_ADDRESS) as sock:
        sock.settimeout(wait_s)
        sock.sendall(frame)
        (size,) = struct.unpack(">i", read_exact(sock, 4))
        if size < 8 or size > 64 << 20:
            raise ValueError(f"response size {size}")
        response = read_exact(sock, size)
        # Response header v0: correlation_id.
        (got_id,) = struct.unpack(">i", response[:4])
        if got_id != correlation_id:
            raise ValueError(f"correlation id {got_id}, expected {correlation_id}")
        return response[4:]


def probe_once(host, port, correlation_id, wait_s, topic, partitions):
    if topic is None:
        body = exchange(host, port, metadata_request(correlation_id), correlation_id, wait_s)
        # Body v4: throttle_time_ms, brokers[].
        _throttle_ms, broker_count = struct.unpack(">ii", body[:8])
        return broker_count >= 1
    body = exchange(host, port, list_offsets_request(correlation_id, topic, partitions), correlation_id, wait_s)
    return all_partitions_answered(body, partitions)


def main():
    args = sys.argv[1:]
    armed_file = None
    if len(args) >= 2 and args[0] == "--armed":
        armed_file, args = args[1], args[2:]
    if len(args) not in (3, 5):
        print(__doc__, file=sys.stderr)
        return 2
    host, port, timeout_s = args[0], int(args[1]), float(args[2])
    topic, partitions = (args[3], int(args[4])) if len(args) == 5 else (None, 0)
    if armed_file:
        open(armed_file, "w").close()
    deadline = time.monotonic() + timeout_s
    correlation_id = 0
    while time.monotonic() < deadline:
        correlation_id += 1
        try:
            # A connected broker may take a while to answer its first request
            # (Kafka accepts before it serves); wait for it rather than
            # reconnecting, so the answer is seen as soon as it is sent.
            if probe_once(host, port, correlation_id, max(0.1, deadline - time.monotonic()), topic, partitions):
                print(f"{time.time():.6f}")
                return 0
        except (OSError, ValueError, ConnectionError, struct.error):
            pass
        time.sleep(READY_POLL_INTERVAL_S if topic is None else TOPIC_POLL_INTERVAL_S)
    print(f"not ready within {timeout_s}s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
