#!/usr/bin/env python3
"""Reads the raw outputs of one bench/run.sh run and prints the comparison.

  report.py rate <producer-perf-test output>   records/s of the run's summary line
  report.py table <run dir>                    the markdown table; exit 1 when a
                                               tool failed where it must not

The run dir holds meta.env (key=value lines written by run.sh) and, per broker
(kafka/, ours/), <run>.out/.err/.rc/.cpu/.wall for every tool run.
Standard library only.
"""
import os
import re
import sys

PRODUCER_SUMMARY = re.compile(
    r"(?P<records>\d+) records sent, (?P<rps>[\d.]+) records/sec \((?P<mbps>[\d.]+) MB/sec\), "
    r"(?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency, (?P<p50>\d+) ms 50th, "
    r"(?P<p95>\d+) ms 95th, (?P<p99>\d+) ms 99th, (?P<p999>\d+) ms 99.9th"
)
E2E_AVG = re.compile(r"Avg latency: (?P<avg>[\d.]+) ms")
E2E_PERCENTILES = re.compile(r"Percentiles: 50th = (?P<p50>\d+), 99th = (?P<p99>\d+), 99.9th = (?P<p999>\d+)")
UNSUPPORTED = re.compile(r"does not support (?P<api>[A-Z_]+)")

# Which workload each tool run belongs to, for the pass/fail decision.
RUN_WORKLOAD = {
    "warmup": "W1",
    "w1-lz4": "W1",
    "w1-none": "W1",
    "w2-lz4": "W2",
    "w2-none": "W2",
    "w3-fill": "W3",
    "w3": "W3",
    "w4": "W4",
    "txn": "TXN",
    "e2e": "E2E",
}
# Workloads whose tools must work against Kafka: a failure there means the
# harness is broken. The end-to-end run is optional (skipped cleanly).
REQUIRED_KAFKA = {"W1", "W2", "W3", "W4", "TXN"}
BROKERS = ("kafka", "ours")


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


class Run:
    """One tool run against one broker: its parsed numbers or why there are none."""

    def __init__(self, run_dir, broker, name, meta):
        base = os.path.join(run_dir, broker, name)
        self.name = name
        self.present = os.path.exists(base + ".rc")
        self.out = read(base + ".out") or ""
        self.err = read(base + ".err") or ""
        rc_text = (read(base + ".rc") or "").strip()
        self.rc = int(rc_text) if rc_text.lstrip("-").isdigit() else None
        self.values = {}
        self.error = None
        self.footnote = None
        cpu = (read(base + ".cpu") or "").split()
        hz = float(meta.get("clk_tck") or 100)
        if len(cpu) == 2 and all(c.isdigit() for c in cpu):
            self.values["broker_cpu_s"] = (int(cpu[1]) - int(cpu[0])) / hz
        if not self.present:
            self.error = "not run"
            return
        parsed = self.parse(name, meta)
        if not parsed:
            self.error = self.failure_reason()
        elif self.rc != 0:
            # Numbers were printed, but the tool ended with an error afterwards.
            self.footnote = self.failure_reason()

    def parse(self, name, meta):
        if name == "w3":
            return self.parse_consumer(int(meta.get("records") or 0))
        if name == "e2e":
            avg, pct = E2E_AVG.search(self.out), E2E_PERCENTILES.search(self.out)
            if not (avg and pct):
                return False
            self.values.update({k: float(v) for k, v in pct.groupdict().items()})
            self.values["avg"] = float(avg.group("avg"))
            return True
        matches = list(PRODUCER_SUMMARY.finditer(self.out))
        if not matches:
            return False
        self.values.update({k: float(v) for k, v in matches[-1].groupdict().items()})
        return True

    def parse_consumer(self, expected_records):
        lines = [l for l in self.out.splitlines() if l.strip()]
        header = next((i for i, l in enumerate(lines) if l.startswith("start.time")), None)
        if header is None or header + 1 >= len(lines):
            return False
        names = [c.strip() for c in lines[header].split(",")]
        cells = [c.strip() for c in lines[header + 1].split(", ")]
        if len(cells) != len(names):
            return False
        row = dict(zip(names, cells))
        try:
            self.values["mbps"] = float(row["MB.sec"])
            self.values["fetch_mbps"] = float(row["fetch.MB.sec"])
            self.values["records"] = float(row["data.consumed.in.nMsg"])
            self.values["rebalance_ms"] = float(row["rebalance.time.ms"])
        except (KeyError, ValueError):
            return False
        if expected_records and self.values["records"] < expected_records:
            self.error = f"consumed {int(self.values['records'])} of {expected_records} records"
            self.values = {}
            return True
        return True

    def failure_reason(self):
        text = self.err + "\n" + self.out
        unsupported = UNSUPPORTED.search(text)
        if unsupported:
            return f"n/a: {unsupported.group('api')} unsupported"
        if self.rc in (124, 137):
            return "failed: timed out"
        last = next((l.strip() for l in reversed(self.err.splitlines()) if l.strip()), "")
        last = last.replace("|", "/")[:70]
        return f"failed (exit {self.rc}){': ' + last if last else ''}"

    @property
    def ok(self):
        return self.present and self.error is None


def fmt(value, kind):
    if value is None:
        return "-"
    if kind == "int":
        return f"{value:,.0f}"
    if kind == "ms":
        return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value != int(value) else f"{value:.0f}"
    if kind == "x":
        return f"{value:.3f}x" if 0 < value < 0.01 else f"{value:.2f}x"
    if kind == "cpu":
        return f"{value:,.2f}"
    return f"{value:,.1f}"


def ratio_cell(kafka, ours):
    if kafka is None or ours is None or kafka == 0:
        return None
    return ours / kafka


def met_cell(value, target):
    """target: (op, bound) applied to value (a ratio)."""
    if target is None:
        return ""
    if value is None:
        return "n/a"
    op, bound = target
    ok = value >= bound if op == ">=" else value <= bound
    return "met" if ok else "not met"


def target_text(target, scope="ours/Kafka"):
    if target is None:
        return ""
    op, bound = target
    return f"{scope} {'≥' if op == '>=' else '≤'} {bound:g}x"


class Table:
    def __init__(self):
        self.rows = []
        self.footnotes = []

    def footnote(self, text):
        if text not in self.footnotes:
            self.footnotes.append(text)
        return f" [{self.footnotes.index(text) + 1}]"

    def cell(self, run, key, kind):
        if run is None:
            return "-", None
        if not run.ok:
            return run.error, None
        value = run.values.get(key)
        text = fmt(value, kind)
        if run.footnote:
            text += self.footnote(f"{run.name}: the tool exited with an error after printing its results ({run.footnote})")
        return text, value

    def metric(self, workload, label, runs, key, kind, target=None):
        k_text, k_value = self.cell(runs[0], key, kind)
        o_text, o_value = self.cell(runs[1], key, kind)
        ratio = ratio_cell(k_value, o_value)
        self.rows.append([workload, label, k_text, o_text, fmt(ratio, "x") if ratio is not None else "-",
                          target_text(target), met_cell(ratio, target)])

    def plain(self, workload, label, k_text, o_text, ratio="-", target="", met=""):
        self.rows.append([workload, label, k_text, o_text, ratio, target, met])

    def render(self):
        header = ["Workload", "Metric", "Kafka", "Ours", "Ours/Kafka", "Target", "Met"]
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        if self.footnotes:
            lines.append("")
            lines += [f"[{i + 1}] {t}" for i, t in enumerate(self.footnotes)]
        return "\n".join(lines)


def table(run_dir):
    meta = read_meta(run_dir)
    runs = {b: {} for b in BROKERS}
    for b in BROKERS:
        for name in RUN_WORKLOAD:
            runs[b][name] = Run(run_dir, b, name, meta)
    pair = lambda name: (runs["kafka"][name], runs["ours"][name])
    selected = set(filter(None, meta.get("workloads", "").split(",")))
    t = Table()

    producer_metrics = [
        ("records/s", "rps", "int"),
        ("MB/s", "mbps", "float"),
        ("latency p50 ms", "p50", "ms"),
        ("latency p99 ms", "p99", "ms"),
        ("latency p99.9 ms", "p999", "ms"),
        ("broker CPU s", "broker_cpu_s", "cpu"),
    ]
    if "W1" in selected or "W2" in selected:
        for codec in ("lz4", "none"):
            for label, key, kind in producer_metrics:
                target = (">=", 1.5) if key == "rps" else None
                t.metric(f"W1 {codec}", label, pair(f"w1-{codec}"), key, kind, target)
    if "W2" in selected:
        for codec in ("lz4", "none"):
            rate = meta.get(f"w2_{codec}_rate", "?")
            w = f"W2 {codec} @ {int(rate):,}/s" if rate.isdigit() else f"W2 {codec}"
            for label, key, kind, target in [
                ("achieved records/s", "rps", "int", None),
                ("latency p50 ms", "p50", "ms", None),
                ("latency p99 ms", "p99", "ms", ("<=", 0.5)),
                ("latency p99.9 ms", "p999", "ms", None),
                ("latency max ms", "max", "ms", None),
            ]:
                t.metric(w, label, pair(f"w2-{codec}"), key, kind, target)
    if "W3" in selected:
        t.metric("W3 consume w1-none", "MB/s", pair("w3"), "mbps", "float", (">=", 1.5))
        t.metric("W3 consume w1-none", "fetch MB/s (without group join)", pair("w3"), "fetch_mbps", "float")
    if "W4" in selected:
        w = f"W4 {meta.get('w4_codec', '?')}, 1000 partitions"
        t.metric(w, "records/s", pair("w4"), "rps", "int")
        t.metric(w, "MB/s", pair("w4"), "mbps", "float")
        t.metric(w, "latency p99 ms", pair("w4"), "p99", "ms")
        t.metric(w, "broker CPU s", pair("w4"), "broker_cpu_s", "cpu")
        settle = [read(os.path.join(run_dir, b, "w4.settle_ms")) for b in BROKERS]
        settle = [float(v) if v and v.strip().isdigit() else None for v in settle]
        r = ratio_cell(*settle)
        t.plain(w, "all partitions writable after create ms (not in the runs)", fmt(settle[0], "int"),
                fmt(settle[1], "int"), fmt(r, "x") if r is not None else "-")
        # The target compares our broker with itself: W4 over W1 at the same codec.
        base = f"w1-{meta.get('w4_codec', 'none')}"
        own = []
        for b in BROKERS:
            w4, w1 = runs[b]["w4"], runs[b][base]
            own.append(w4.values["rps"] / w1.values["rps"] if w4.ok and w1.ok and w1.values.get("rps") else None)
        target = (">=", 0.5)
        t.plain(w, f"records/s ÷ own W1 {meta.get('w4_codec', 'none')} records/s", fmt(own[0], "x"), fmt(own[1], "x"),
                "-", target_text(target, "ours"), met_cell(own[1], target))
    if "TXN" in selected:
        w = f"TXN {meta.get('txn_codec', '?')}, transactions of {meta.get('txn_duration_ms', '?')} ms"
        for label, key, kind in producer_metrics:
            t.metric(w, label, pair("txn"), key, kind)
    if "W5" in selected:
        t.plain("W5 3 brokers, RF 3", "W1 and W2 again", "not run", "not run: needs replication (issue 6)")
    if "E2E" in selected:
        w = f"E2E 1 partition, {meta.get('e2e_records', '?')} round trips"
        for label, key in [("latency avg ms", "avg"), ("latency p50 ms", "p50"), ("latency p99 ms", "p99"),
                           ("latency p99.9 ms", "p999")]:
            t.metric(w, label, pair("e2e"), key, "ms")

    def num(key):
        try:
            return float(meta[key])
        except (KeyError, ValueError):
            return None

    for label, key, kind, scale, target in [
        ("peak RSS MiB (VmHWM)", "peak_rss_kib", "int", 1 / 1024, ("<=", 0.2)),
        ("CPU s, whole run (utime+stime)", "cpu_s", "cpu", 1, None),
        ("start-to-ready ms", "ready_ms", "int", 1, ("<=", 0.1)),
    ]:
        k, o = num(f"kafka_{key}"), num(f"ours_{key}")
        k = k * scale if k is not None else None
        o = o * scale if o is not None else None
        r = ratio_cell(k, o)
        t.plain("process", label, fmt(k, kind), fmt(o, kind), fmt(r, "x") if r is not None else "-",
                target_text(target), met_cell(r, target))

    # Failures that make the run fail: any tool against Kafka (except the
    # optional end-to-end run), and the expected workloads against ours.
    expected = set(filter(None, meta.get("expected_ours", "").split(",")))
    failures = []
    for b in BROKERS:
        for name, run in runs[b].items():
            workload = RUN_WORKLOAD[name]
            must = workload in (REQUIRED_KAFKA if b == "kafka" else expected)
            if run.present and not run.ok and must:
                failures.append(f"{name} against {b}: {run.error}")
        if meta.get(f"{b}_alive") != "1":
            failures.append(f"the {b} broker was not running at the end")

    records = meta.get("records", "?")
    records_text = f"{int(records):,}" if records.isdigit() else records
    heading = [
        f"Apache Kafka {meta.get('kafka_version', '?')} vs ours ({meta.get('ours_version', '?')}; "
        f"bench {meta.get('bench_commit', '?')}), "
        f"{meta.get('date_utc', '?')}, {meta.get('cpus', '?')} CPUs ({meta.get('cpu_model', '?')})"
        + (", SMOKE RUN (tiny counts, numbers meaningless)" if meta.get("smoke") == "1" else ""),
        f"Producer runs: {records_text} records of {meta.get('record_bytes', '?')} B each, one producer process, "
        f"{meta.get('producer_props', '')}; latencies are the tools' own (ms, whole numbers for the producer).",
        f"Load average (1, 5, 15 min) at start {meta.get('loadavg_start', '?')}, at end {meta.get('loadavg_end', '?')}.",
        "Ours/Kafka: higher is better for records/s and MB/s; lower is better for latency, CPU, RSS and start-to-ready.",
        "",
    ]
    print("\n".join(heading) + t.render())
    if failures:
        print("", file=sys.stderr)
        for f in failures:
            print(f"FAILED: {f}", file=sys.stderr)
        return 1
    return 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "rate":
        matches = list(PRODUCER_SUMMARY.finditer(read(sys.argv[2]) or ""))
        if not matches:
            print(f"no producer summary line in {sys.argv[2]}", file=sys.stderr)
            return 1
        print(f"{float(matches[-1].group('rps')):.0f}")
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "table":
        return table(sys.argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
