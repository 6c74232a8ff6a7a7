#!/usr/bin/env python3
"""Reads the raw outputs of one bench/dispatcher.sh run and prints its table.

  report.py <run dir>

The run dir holds meta.env (key=value lines), and per side (share,
share-ours, dispatcher-ours, dispatcher-kafka) and round k (1..rounds), under the prefix
<side>-r<k>: .out with the client's RESULT line (warm-up rounds, not
counted, under <side>-w<k>),
.rc, .time (GNU time: user s, system s, max RSS KiB), .broker_cpu,
.other_broker_cpu (the broker the side does not use), .machine_cpu (busy
ticks of all CPUs) and .dispatcher_cpu (clock ticks before and after),
.dispatcher_rss_kib, or .why
when the run did not happen; and
lease-memory.out/.err, lease-rebuild.out for the lease engine's figures.
With several rounds, a side's column is its median-rate round, and the rate
row lists every round. Exit status 1 when a run or a figure has no number.
Standard library only.
"""
import os
import re
import sys

# (name, column label, whether a dispatcher serves it, the rate it must
# reach as a multiple of Kafka's share group's): our share groups must beat
# Kafka's, the dispatcher must stay 2x ahead of it.
SIDES = (
    ("share", "Kafka share group (KafkaShareConsumer, commit{commit})", False, None),
    ("share-ours", "share group on our broker (same client)", False, 1.0),
    ("dispatcher-ours", "dispatcher → our broker", True, 2.0),
    ("dispatcher-kafka", "dispatcher → Apache Kafka", True, 2.0),
)
TARGET_LEASE_BYTES = 128.0
TARGET_REBUILD_MS = 2000.0
LEASE_BYTES = re.compile(r"(?P<bytes>[\d.]+) bytes per in-flight lease")
REBUILD_ROW = re.compile(r"^\|\s*(?P<records>\d+)\s*\|\s*(?P<ms>[\d.]+) ms\s*\|\s*(?P<expired>\d+)\s*\|", re.M)


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def read_meta(run_dir):
    meta = {}
    for line in (read(os.path.join(run_dir, "meta.env")) or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            meta[key] = value
    return meta


def parse_result(text):
    """The key=value pairs of the last RESULT line, or None."""
    lines = [l for l in (text or "").splitlines() if l.startswith("RESULT ")]
    if not lines:
        return None
    pairs = (item.partition("=") for item in lines[-1].split()[1:])
    return {k: v for k, sep, v in pairs if sep}


def ticks_s(path, hz):
    parts = (read(path) or "").split()
    if len(parts) == 2 and all(p.isdigit() for p in parts):
        return (int(parts[1]) - int(parts[0])) / hz
    return None


class Side:
    def __init__(self, run_dir, name, hz):
        base = os.path.join(run_dir, name)
        self.result = parse_result(read(base + ".out"))
        why = (read(base + ".why") or "").strip()
        self.why = f"not run: {why}" if why else ""
        rc = (read(base + ".rc") or "").strip()
        self.rc = int(rc) if rc.lstrip("-").isdigit() else None
        self.broker_cpu_s = ticks_s(base + ".broker_cpu", hz)
        self.other_broker_cpu_s = ticks_s(base + ".other_broker_cpu", hz)
        self.machine_cpu_s = ticks_s(base + ".machine_cpu", hz)
        self.dispatcher_cpu_s = ticks_s(base + ".dispatcher_cpu", hz)
        rss = (read(base + ".dispatcher_rss_kib") or "").strip()
        self.dispatcher_rss_mib = int(rss) / 1024 if rss.isdigit() and int(rss) > 0 else None
        self.client_cpu_s = self.client_rss_mib = None
        gnu_time = (read(base + ".time") or "").split()
        if len(gnu_time) >= 3:
            try:
                self.client_cpu_s = float(gnu_time[-3]) + float(gnu_time[-2])
                self.client_rss_mib = int(gnu_time[-1]) / 1024
            except ValueError:
                pass
        if self.result is None and not self.why:
            err = read(base + ".err") or ""
            last = next((l.strip() for l in reversed(err.splitlines()) if l.strip()), "")
            if self.rc in (124, 137):
                self.why = "timed out"
            elif self.rc is None:
                self.why = "not run"
            else:
                self.why = f"failed (exit {self.rc})" + (f": {last[:80]}" if last else "")
        elif self.result is not None and self.result.get("status") != "ok":
            self.why = f"{self.result.get('status')} after {self.result.get('acked')} acks"

    @property
    def ok(self):
        return self.result is not None and self.result.get("status") == "ok"

    def rate(self):
        return float(self.result["msgs_per_s"]) if self.ok else None

    def server_cpu_us(self, with_dispatcher):
        """CPU µs the servers spent per acked message: the broker's, plus
        the dispatcher's on a dispatcher side. None when a figure is missing."""
        if not self.ok or self.broker_cpu_s is None:
            return None
        cpu = self.broker_cpu_s
        if with_dispatcher:
            if self.dispatcher_cpu_s is None:
                return None
            cpu += self.dispatcher_cpu_s
        acked = float(self.result.get("acked", 0) or 0)
        return cpu / acked * 1e6 if acked > 0 else None


class SideRounds:
    """One side over all rounds: the median-rate round stands for it."""

    def __init__(self, run_dir, name, hz, rounds):
        self.runs = [Side(run_dir, f"{name}-r{r}", hz) for r in range(1, rounds + 1)]
        ok = sorted((s for s in self.runs if s.ok), key=lambda s: s.rate())
        failed = [s for s in self.runs if not s.ok]
        # The lower median, so that the chosen round is one that happened.
        self.median = ok[(len(ok) - 1) // 2] if ok else None
        self.all_ok = not failed
        self.first_failure = failed[0] if failed else None

    def rate_cell(self):
        if self.median is None:
            return self.first_failure.why
        if len(self.runs) == 1:
            return num(self.median.rate())
        rounds = " / ".join(num(s.rate()) if s.ok else "failed" for s in self.runs)
        return f"{num(self.median.rate())} (median of {rounds})"


def num(v, fmt="{:,.0f}"):
    return "-" if v is None else fmt.format(v)


def field(side, key, fmt):
    if side.result is None or key not in side.result:
        return "-"
    try:
        value = float(side.result[key])
    except ValueError:
        return "-"
    return "-" if value != value else fmt.format(value)  # NaN: no samples


def lease_figures(run_dir):
    text = (read(os.path.join(run_dir, "lease-memory.err")) or "") + (read(os.path.join(run_dir, "lease-memory.out")) or "")
    m = LEASE_BYTES.search(text)
    lease_bytes = float(m.group("bytes")) if m else None
    r = REBUILD_ROW.search(read(os.path.join(run_dir, "lease-rebuild.out")) or "")
    rebuild = (int(r.group("records")), float(r.group("ms")), int(r.group("expired"))) if r else None
    return lease_bytes, rebuild


def main(run_dir):
    meta = read_meta(run_dir)
    hz = float(meta.get("clk_tck") or 100)
    commit = "Sync" if meta.get("share_commit", "sync") == "sync" else "Async"
    rounds = int(meta.get("rounds") or 1)
    warmup = int(meta.get("warmup") or 0)
    aggregated = [(label.format(commit=commit), SideRounds(run_dir, name, hz, rounds)) for name, label, _, _ in SIDES]
    # Every row but the rate shows the median round (an empty Side when none ran).
    sides = [(label, agg.median or agg.first_failure) for label, agg in aggregated]
    share_rate = sides[0][1].rate()
    out = []
    out.append(
        f"Dispatcher vs share groups (Kafka, ours): {meta.get('workers')} workers, {int(meta.get('messages', 0)):,} messages "
        f"of {meta.get('record_bytes')} B pre-loaded into {meta.get('partitions')} partitions per side, "
        f"batch {meta.get('batch')}, lease {meta.get('lease_s')} s, {rounds} round{'s' if rounds > 1 else ''}, "
        f"dispatcher workers on its {'gRPC' if meta.get('api') == 'grpc' else 'HTTP/JSON'} API"
        f" ({meta.get('worker_mode', 'receive-ack')})"
        + {
            "servers": ", the brokers and the dispatcher pinned to CPU 0, the workers to CPU 1 (--pin servers)",
            "broker": ", the brokers pinned to CPU 0, the dispatcher and the workers to CPU 1 (--pin broker)",
        }.get(meta.get("pin", ""), "")
        + f"{' (smoke run)' if meta.get('smoke') == '1' else ''}."
    )
    out.append(
        f"Apache Kafka {meta.get('kafka_version', '?')} (share.version={meta.get('share_version', '?')}); "
        f"dispatcher {meta.get('dispatcher_version', 'not built')}; our broker {meta.get('ours_version', 'not built')}; "
        f"bench {meta.get('bench_commit', '?')}; {meta.get('date_utc', '?')}; {meta.get('cpus', '?')} CPUs "
        f"({meta.get('cpu_model', '?')}); {meta.get('java', '?')}; share-group workers in a JVM with -Xmx1g, "
        f"dispatcher workers with GOGC={meta.get('loadgen_gogc', '100')}."
    )
    out.append(
        f"Load average (1, 5, 15 min) at start {meta.get('loadavg_start', '?')}, at end {meta.get('loadavg_end', '?')}. "
        "A cycle is one poll (receive) and the confirmed acknowledgement of what it returned."
        + (" Rows below the rate show each side's median round." if rounds > 1 else "")
    )
    if warmup:
        warm = []
        for name, label, _, _ in SIDES:
            runs = [Side(run_dir, f"{name}-w{k}", hz) for k in range(1, warmup + 1)]
            rates = " / ".join(num(r.rate()) if r.ok else "failed" for r in runs)
            warm.append(f"{label.format(commit=commit)} {rates}")
        out.append(
            f"Before them, {warmup} warm-up round{'s' if warmup > 1 else ''} of each side, not counted (msgs/s): "
            + "; ".join(warm) + "."
        )
    out.append("")
    out.append("| Metric | " + " | ".join(label for label, _ in sides) + " |")
    out.append("|---|" + "---|" * len(sides))

    def row(metric, cells):
        out.append(f"| {metric} | " + " | ".join(cells) + " |")

    row("acked msgs/s", [agg.rate_cell() for _, agg in aggregated])
    def ratios(base, targets):
        cells = []
        for (_, s), target in zip(sides, targets):
            if s.rate() is None or not base:
                cells.append("-")
            elif target is None:
                cells.append(f"{s.rate() / base:.2f}x")
            else:
                r = s.rate() / base
                cells.append(f"{r:.2f}x ({'met' if r >= target else 'not met'}: ≥ {target:g}x)")
        return cells

    row("÷ Kafka's share group", ratios(share_rate, [t for _, _, _, t in SIDES]))
    # The dispatcher must stay ahead of our own share groups too.
    row("÷ share group on our broker", ratios(
        sides[1][1].rate(), [1.0 if d else None for _, _, d, _ in SIDES]))
    row("cycle latency p50 ms", [field(s, "p50_ms", "{:,.1f}") for _, s in sides])
    row("cycle latency p99 ms", [field(s, "p99_ms", "{:,.1f}") for _, s in sides])
    # The dispatcher's workers time the two halves of a cycle apart (the
    # share consumer's poll and commit are not timed so): "-" there.
    row("receive p50 / p99 ms", [
        f"{field(s, 'receive_p50_ms', '{:,.1f}')} / {field(s, 'receive_p99_ms', '{:,.1f}')}"
        if s.result and "receive_p50_ms" in s.result else "-" for _, s in sides])
    row("ack p50 / p99 ms", [
        f"{field(s, 'ack_p50_ms', '{:,.1f}')} / {field(s, 'ack_p99_ms', '{:,.1f}')}"
        if s.result and "ack_p50_ms" in s.result else "-" for _, s in sides])
    row("messages per cycle", [
        num(float(s.result["acked"]) / float(s.result["cycles"]), "{:,.1f}")
        if s.result and float(s.result.get("cycles", 0) or 0) > 0 else "-" for _, s in sides])
    row("first message after ms (join; not in the rate)", [field(s, "first_message_ms", "{:,.0f}") for _, s in sides])
    row("redelivered (attempt or delivery count > 1)", [field(s, "redelivered", "{:,.0f}") for _, s in sides])
    row("acks not confirmed", [field(s, "failed", "{:,.0f}") for _, s in sides])
    row("broker CPU s during the run", [num(s.broker_cpu_s, "{:.2f}") for _, s in sides])
    row("the other broker's CPU s during the run (not this side's)",
        [num(s.other_broker_cpu_s, "{:.2f}") for _, s in sides])
    row("whole machine's busy CPU s during the run", [num(s.machine_cpu_s, "{:.2f}") for _, s in sides])
    row("dispatcher CPU s during the run", [
        num(s.dispatcher_cpu_s, "{:.2f}") if d else "n/a" for (_, s), (_, _, d, _) in zip(sides, SIDES)])
    # What the servers cost per message, whatever the layout: the rate
    # depends on where the workers run (--pin), this much less.
    server_us = [s.server_cpu_us(d) for (_, s), (_, _, d, _) in zip(sides, SIDES)]
    row("servers' CPU µs per acked message (broker, and dispatcher)", [num(u, "{:.2f}") for u in server_us])
    row("share group's servers' CPU per message ÷ this side's (> 1: cheaper)", [
        "-" if u is None or not server_us[0] else f"{server_us[0] / u:.2f}x" for u in server_us])
    row("workers' process CPU s", [num(s.client_cpu_s, "{:.2f}") for _, s in sides])
    row("dispatcher peak RSS MiB", [
        num(s.dispatcher_rss_mib, "{:.0f}") if d else "n/a" for (_, s), (_, _, d, _) in zip(sides, SIDES)])
    row("workers' process peak RSS MiB", [num(s.client_rss_mib, "{:.0f}") for _, s in sides])

    lease_bytes, rebuild = lease_figures(run_dir)
    skipped = meta.get("lease_figures") == "skipped"
    out.append("")
    out.append("| Lease engine | Value | Target | Met |")
    out.append("|---|---|---|---|")
    if skipped:
        out.append("| memory per in-flight lease, partition rebuild | skipped (--skip-lease-figures) | - | - |")
    elif lease_bytes is None:
        out.append(f"| memory per in-flight lease | not read: see lease-memory.err | ≤ {TARGET_LEASE_BYTES:.0f} B | - |")
    else:
        met = "met" if lease_bytes <= TARGET_LEASE_BYTES else "not met"
        out.append(f"| memory per in-flight lease | {lease_bytes:.1f} B | ≤ {TARGET_LEASE_BYTES:.0f} B | {met} |")
    if skipped:
        pass
    elif rebuild is None:
        out.append("| partition rebuild from the ack log | not read: see lease-rebuild.err | ≤ 2 s | - |")
    else:
        records, ms, expired = rebuild
        # The target is about 1M records; a smaller run (--smoke) says nothing about it.
        if records >= 1_000_000:
            met, note = ("met" if ms <= TARGET_REBUILD_MS else "not met"), ""
        else:
            met, note = "- (needs 1M records)", " (fewer records than the target's 1M)"
        out.append(f"| partition rebuild from {records:,} ack-log records ({expired:,} leases back as expired){note} "
                   f"| {ms:,.1f} ms | ≤ 2 s at 1M | {met} |")
    print("\n".join(out))
    complete = all(agg.all_ok for _, agg in aggregated) and (skipped or (lease_bytes is not None and rebuild is not None))
    return 0 if complete else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
