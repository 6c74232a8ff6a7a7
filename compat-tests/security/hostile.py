#!/usr/bin/env python3
"""Hostile input on the secure listeners (issue 31, after hostile/ of issue 29).

    hostile.py --pid PID --plaintext H:P --ssl H:P --sasl-plaintext H:P --sasl-ssl H:P
               --ca CA.pem [--check] [--cases a,b] [--stall-wait-s 40] [--flood 300]
               [--rss-limit-mib 512]

Each case talks raw bytes (Python's socket and ssl modules, no Kafka client) to one
listener, then a fresh client must get ApiVersions within 5 s over PLAINTEXT and over
SASL_SSL (a TLS handshake and ApiVersions, allowed before authentication), and the broker's
peak RSS while the case ran (VmRSS of /proc/PID/status every 20 ms) must stay under
--rss-limit-mib. One line per case on stdout, the format of hostile/src/main.rs:

    case <name> answer="..." expected="..." alive_ms=<n|dead> peak_rss_mib=<n> verdict=<PASS|FAIL|->

With --check the verdict says whether the case held (the answer is one the expectation
allows, liveness, RSS) and the exit status whether all held; without it (Apache Kafka) the
verdict is "-" and the run only reports.
"""
import argparse
import os
import socket
import ssl
import struct
import sys
import threading
import time

LIVENESS_TIMEOUT_S = 5.0


def log(msg):
    print(f"[hostile-sec {time.strftime('%H:%M:%S', time.gmtime())}] {msg}", file=sys.stderr, flush=True)


def addr(text):
    host, port = text.rsplit(":", 1)
    return host, int(port)


# ------------------------------------------------------------------ Kafka wire

def string(s):
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def request(api_key, version, correlation, body, client_id="hostile-sec"):
    """A non-flexible request (header v1) with its size prefix."""
    msg = struct.pack(">hhi", api_key, version, correlation) + string(client_id) + body
    return struct.pack(">i", len(msg)) + msg


API_VERSIONS, METADATA, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 3, 17, 36
ERRORS = {0: "NONE", 33: "UNSUPPORTED_SASL_MECHANISM", 34: "ILLEGAL_SASL_STATE", 58: "SASL_AUTHENTICATION_FAILED"}


def err_name(code):
    return f"{ERRORS.get(code, 'error')}({code})"


def recv_exact(sock, n, deadline):
    buf = b""
    while len(buf) < n:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def recv_response(sock, timeout):
    """(correlation id, body) of one response; raises EOFError on close, socket.timeout."""
    deadline = time.monotonic() + timeout
    size = struct.unpack(">i", recv_exact(sock, 4, deadline))[0]
    if size < 4 or size > 1 << 24:
        raise ValueError(f"response size {size}")
    data = recv_exact(sock, size, deadline)
    return struct.unpack(">i", data[:4])[0], data[4:]


def wait_closed(sock, timeout):
    """Milliseconds until the peer closed (EOF or reset), or None if still open after timeout.
    Bytes the peer sends meanwhile (a TLS alert, a response) are read and dropped."""
    start = time.monotonic()
    deadline = start + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            return None
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError, OSError):
            return int((time.monotonic() - start) * 1000)
        if not chunk:
            return int((time.monotonic() - start) * 1000)


def connect(hostport, timeout=5.0):
    s = socket.create_connection(hostport, timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


# ------------------------------------------------------------------ liveness and RSS

class RssSampler:
    def __init__(self, pid):
        self.pid = pid
        self.peak_kib = 0
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def rss_kib(self):
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def run(self):
        while not self.stop:
            self.peak_kib = max(self.peak_kib, self.rss_kib())
            time.sleep(0.02)

    def reset(self):
        self.peak_kib = self.rss_kib()

    def peak_mib(self):
        return self.peak_kib // 1024


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


class Env:
    def __init__(self, args):
        self.args = args
        self.tls = ssl.create_default_context(cafile=args.ca)
        self.tls.check_hostname = False

    def tls_connect(self, hostport, timeout=5.0):
        raw = connect(hostport, timeout)
        return self.tls.wrap_socket(raw, server_hostname="localhost")

    def liveness_ms(self):
        """ms for ApiVersions over PLAINTEXT and over SASL_SSL, or None if either failed."""
        start = time.monotonic()
        try:
            for secure in (False, True):
                s = self.tls_connect(self.args.sasl_ssl) if secure else connect(self.args.plaintext)
                with s:
                    s.settimeout(LIVENESS_TIMEOUT_S)
                    s.sendall(request(API_VERSIONS, 0, 7, b""))
                    corr, body = recv_response(s, LIVENESS_TIMEOUT_S)
                    if corr != 7 or struct.unpack(">h", body[:2])[0] != 0:
                        return None
        except (OSError, EOFError, ValueError, ssl.SSLError) as e:
            log(f"liveness failed: {e}")
            return None
        ms = int((time.monotonic() - start) * 1000)
        return ms if ms <= 2 * LIVENESS_TIMEOUT_S * 1000 else None


# ------------------------------------------------------------------ cases
# Each returns (answer, ok): what the broker did, and whether that is what is expected.

def client_hello(env):
    """The first flight of a real TLS client: a ClientHello, as bytes."""
    ctx = ssl.create_default_context(cafile=env.args.ca)
    ctx.check_hostname = False
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname="localhost")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def case_tls_garbage(env):
    """64 KiB of non-TLS bytes instead of a ClientHello on SASL_SSL: the broker closes."""
    with connect(env.args.sasl_ssl) as s:
        garbage = bytes((i * 37 + 11) % 256 for i in range(65536))
        try:
            s.sendall(garbage)
        except OSError as e:
            return f"closed while sending ({e.__class__.__name__})", True
        ms = wait_closed(s, 10)
        return (f"closed after {ms} ms", True) if ms is not None else ("still open after 10 s", False)


def case_tls_plaintext_request(env):
    """A plaintext ApiVersions request on the SSL (mTLS) listener: closed, never answered."""
    with connect(env.args.ssl) as s:
        s.sendall(request(API_VERSIONS, 0, 1, b""))
        s.settimeout(10)
        try:
            data = s.recv(4096)
        except (ConnectionResetError, OSError):
            return "reset", True
        if not data:
            return "closed", True
        if len(data) >= 8 and struct.unpack(">i", data[4:8])[0] == 1:
            return "answered ApiVersions in plaintext", False
        # A TLS alert record (0x15) before the close is a clean refusal too.
        ms = wait_closed(s, 10)
        kind = "TLS alert" if data[:1] == b"\x15" else f"{len(data)} bytes"
        return (f"{kind}, then closed", True) if ms is not None else (f"{kind}, still open after 10 s", False)


def case_tls_stalled_handshake(env):
    """Half a ClientHello, and a whole ClientHello with no reply to the server's flight, on
    SASL_SSL and SSL; the broker must close all four within --stall-wait-s (its handshake
    bound; ours is socket.request.read.timeout.ms, 30 s by default)."""
    hello = client_hello(env)
    socks = []
    for name, hostport in (("sasl_ssl", env.args.sasl_ssl), ("ssl", env.args.ssl)):
        s = connect(hostport)
        s.sendall(hello[: len(hello) // 2])
        socks.append((f"{name}.half-hello", s))
        s = connect(hostport)
        s.sendall(hello)
        socks.append((f"{name}.no-finished", s))
    start = time.monotonic()
    results = []
    for name, s in socks:
        left = env.args.stall_wait_s - (time.monotonic() - start)
        ms = wait_closed(s, max(0.1, left))
        s.close()
        results.append(f"{name}: " + (f"closed at {int((time.monotonic() - start) * 1000)} ms" if ms is not None
                                      else f"open after {env.args.stall_wait_s} s"))
    ok = all("closed" in r for r in results)
    return "; ".join(results), ok


def sasl_handshake(s, mechanism, correlation=1):
    s.sendall(request(SASL_HANDSHAKE, 1, correlation, string(mechanism)))
    corr, body = recv_response(s, 10)
    code = struct.unpack(">h", body[:2])[0]
    count = struct.unpack(">i", body[2:6])[0]
    mechs, off = [], 6
    for _ in range(max(0, count)):
        n = struct.unpack(">h", body[off:off + 2])[0]
        mechs.append(body[off + 2:off + 2 + n].decode())
        off += 2 + n
    return corr, code, mechs


def sasl_authenticate(s, token, correlation):
    s.sendall(request(SASL_AUTHENTICATE, 1, correlation, struct.pack(">i", len(token)) + token))


def case_sasl_token_too_large(env):
    """SaslHandshake PLAIN, then a SaslAuthenticate of 600,000 bytes (over Kafka's default
    sasl.server.max.receive.size, 524288): the broker closes without authenticating."""
    with connect(env.args.sasl_plaintext) as s:
        _, code, _ = sasl_handshake(s, "PLAIN")
        if code != 0:
            return f"SaslHandshake PLAIN answered {err_name(code)}", False
        token = b"\0alice\0" + b"x" * 600_000
        try:
            sasl_authenticate(s, token, 2)
        except OSError as e:
            return f"closed while sending ({e.__class__.__name__})", True
        try:
            corr, body = recv_response(s, 10)
        except (EOFError, ConnectionResetError, OSError, ValueError) as e:
            if isinstance(e, socket.timeout):
                return "no answer and still open after 10 s", False
            return "closed, no answer", True
        code = struct.unpack(">h", body[:2])[0]
        ms = wait_closed(s, 5)
        return (f"SaslAuthenticate {err_name(code)}" + (", then closed" if ms is not None else ", still open"),
                code != 0)


def case_sasl_handshake_flood(env):
    """--flood connections to SASL_PLAINTEXT each send SaslHandshake PLAIN, read the answer,
    then send nothing for 5 s: the broker stays live and its RSS bounded."""
    socks, answered, closed = [], 0, 0
    try:
        for i in range(env.args.flood):
            try:
                s = connect(env.args.sasl_plaintext)
                socks.append(s)
                s.sendall(request(SASL_HANDSHAKE, 1, i, string("PLAIN")))
            except OSError:
                closed += 1
        for s in socks:
            try:
                _, body = recv_response(s, 5)
                if struct.unpack(">h", body[:2])[0] == 0:
                    answered += 1
            except (EOFError, OSError, ValueError):
                closed += 1
        during = env.liveness_ms()
        time.sleep(5)
    finally:
        for s in socks:
            s.close()
    ok = during is not None
    return (f"{answered} of {env.args.flood} handshakes answered, {closed} refused/closed; "
            f"ApiVersions while all were open: {'%d ms' % during if ok else 'failed'}"), ok


def case_sasl_authenticate_first(env):
    """SaslAuthenticate (a valid-looking PLAIN token) before any SaslHandshake on
    SASL_PLAINTEXT: ILLEGAL_SASL_STATE or a close, never success."""
    with connect(env.args.sasl_plaintext) as s:
        sasl_authenticate(s, b"\0alice\0alice-secret", 1)
        try:
            corr, body = recv_response(s, 10)
        except socket.timeout:
            return "no answer and still open after 10 s", False
        except (EOFError, OSError, ValueError):
            return "closed, no answer", True
        code = struct.unpack(">h", body[:2])[0]
        ms = wait_closed(s, 5)
        return (f"SaslAuthenticate {err_name(code)}" + (", then closed" if ms is not None else ", still open"),
                code != 0)


def case_metadata_before_auth(env):
    """A Metadata request on SASL_PLAINTEXT before authenticating: closed or an error, never
    the cluster's metadata."""
    with connect(env.args.sasl_plaintext) as s:
        s.sendall(request(METADATA, 1, 1, struct.pack(">i", -1)))
        try:
            corr, body = recv_response(s, 10)
        except socket.timeout:
            return "no answer and still open after 10 s", False
        except (EOFError, OSError, ValueError):
            return "closed, no answer", True
        return f"answered Metadata ({len(body)} bytes) before authentication", False


def case_sasl_wrong_mechanism(env):
    """SaslHandshake with GSSAPI (not enabled): UNSUPPORTED_SASL_MECHANISM listing the enabled
    mechanisms; a SaslAuthenticate after it must not succeed."""
    with connect(env.args.sasl_plaintext) as s:
        try:
            _, code, mechs = sasl_handshake(s, "GSSAPI")
        except (EOFError, OSError, ValueError) as e:
            return f"closed, no SaslHandshake answer ({e})", False
        answer = f"{err_name(code)} mechanisms={','.join(mechs)}"
        ok = code == 33 and set(mechs) == {"PLAIN", "SCRAM-SHA-512"}
        try:
            sasl_authenticate(s, b"\0alice\0alice-secret", 2)
            corr, body = recv_response(s, 10)
            acode = struct.unpack(">h", body[:2])[0]
            answer += f"; then SaslAuthenticate {err_name(acode)}"
            ok = ok and acode != 0
        except socket.timeout:
            answer += "; then no answer to SaslAuthenticate, still open after 10 s"
            ok = False
        except (EOFError, OSError, ValueError):
            answer += "; then closed"
        return answer, ok


CASES = [
    ("tls.garbage_client_hello", case_tls_garbage,
     "closed"),
    ("tls.plaintext_request", case_tls_plaintext_request,
     "closed (a TLS alert first is fine), never answered"),
    ("tls.stalled_handshake", case_tls_stalled_handshake,
     "all 4 closed within the handshake bound"),
    ("sasl.token_too_large", case_sasl_token_too_large,
     "closed, or an error; never authenticated"),
    ("sasl.handshake_flood", case_sasl_handshake_flood,
     "live while the unauthenticated connections are open"),
    ("sasl.authenticate_first", case_sasl_authenticate_first,
     "ILLEGAL_SASL_STATE(34) or closed; never authenticated"),
    ("sasl.metadata_before_auth", case_metadata_before_auth,
     "closed, no metadata"),
    ("sasl.wrong_mechanism", case_sasl_wrong_mechanism,
     "UNSUPPORTED_SASL_MECHANISM(33) listing PLAIN,SCRAM-SHA-512; no authentication after it"),
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pid", type=int, required=True)
    for name in ("plaintext", "ssl", "sasl-plaintext", "sasl-ssl"):
        p.add_argument(f"--{name}", type=addr, required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--check", action="store_true")
    p.add_argument("--cases")
    p.add_argument("--stall-wait-s", type=float, default=40)
    p.add_argument("--flood", type=int, default=300)
    p.add_argument("--rss-limit-mib", type=int, default=512)
    args = p.parse_args()
    env = Env(args)
    wanted = set(args.cases.split(",")) if args.cases else None
    rss = RssSampler(args.pid)
    all_held = True
    for name, fn, expected in CASES:
        if wanted is not None and name not in wanted:
            continue
        if not alive(args.pid):
            print(f"broker process {args.pid} is gone; stopping", flush=True)
            return 1
        rss.reset()
        log(f"case {name}")
        try:
            answer, ok = fn(env)
        except Exception as e:  # a case that breaks is a failure with its reason
            answer, ok = f"case error: {e.__class__.__name__}: {e}", False
        live = env.liveness_ms() if alive(args.pid) else None
        peak = rss.peak_mib()
        verdict = "-"
        if args.check:
            held = ok and live is not None and peak < args.rss_limit_mib
            verdict = "PASS" if held else "FAIL"
            all_held &= held
        alive_ms = "dead" if not alive(args.pid) else (live if live is not None else "none")
        answer = answer.replace('"', "'")
        print(f'case {name} answer="{answer}" expected="{expected}" alive_ms={alive_ms} '
              f"peak_rss_mib={peak} verdict={verdict}", flush=True)
    rss.stop = True
    return 0 if all_held else 1


if __name__ == "__main__":
    sys.exit(main())
