#!/usr/bin/env python3
"""Writes REPORT.md (to stdout) from the raw results matrix.sh collected.

usage: report.py <results-dir> "<family> ..." "<peer suite> ..." ["<security suite> ..."]

<results-dir>/{ours,kafka}/<family>.results hold the scenario programs'
`RESULT <id> PASS|FAIL|NA <detail>` lines; <peer>.peer hold the peer suites'
`PASS <test>` / `FAIL <test> <reason>` lines; security-<suite>.checks hold
the security scripts' `PASS <check>` / `FAIL <check>: <why>` lines. A scenario a program never
reported (it crashed or timed out) counts as failed, so a dead client cannot
make the report look better.
"""

import datetime
import os
import re
import sys

# The scenario list every family runs, in the order the report shows it
# (see compat-tests/README.md); families report NA for what their API lacks.
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
]
CLI_SCENARIOS = [
    "cli.topics",
    "cli.console",
    "cli.configs",
    "cli.get-offsets",
    "cli.consumer-groups",
    "cli.delete-records",
    "cli.consumer-groups.admin",
    "cli.cluster-ops",
]
BROKERS = ["ours", "kafka"]
MARK = {"PASS": "pass", "FAIL": "**FAIL**", "NA": "n/a", None: "**missing**"}


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def scenario_results(out, broker, family):
    results = {}
    for line in read(os.path.join(out, broker, family + ".results")).splitlines():
        parts = line.split(" ", 3)
        if len(parts) >= 3 and parts[0] == "RESULT" and parts[2] in ("PASS", "FAIL", "NA"):
            results[parts[1]] = (parts[2], parts[3] if len(parts) > 3 else "")
    return results


def peer_results(out, broker, peer):
    results = {}
    for line in read(os.path.join(out, broker, peer + ".peer")).splitlines():
        parts = line.split(" ", 2)
        if len(parts) >= 2 and parts[0] in ("PASS", "FAIL"):
            results[parts[1]] = (parts[0], parts[2] if len(parts) > 2 else "")
    return results


CASE_FIELD = re.compile(r'(\w+)=(?:"([^"]*)"|(\S+))')


def hostile_cases(out, broker, suite):
    """Hostile-input case name -> its fields (answer, expected, verdict, ...):
    the `case <name> key="value" ...` lines of security/hostile.py."""
    cases = {}
    for line in read(os.path.join(out, broker, "security-" + suite + ".checks")).splitlines():
        if line.startswith("case "):
            name, _, rest = line[5:].partition(" ")
            cases[name] = {m.group(1): m.group(2) if m.group(2) is not None else m.group(3)
                           for m in CASE_FIELD.finditer(rest)}
    return cases


def security_results(out, broker, suite):
    """Check name -> (PASS|FAIL, why), in the order the script ran them."""
    results = {}
    for line in read(os.path.join(out, broker, "security-" + suite + ".checks")).splitlines():
        if line.startswith("PASS "):
            results[line[5:].strip()] = ("PASS", "")
        elif line.startswith("FAIL "):
            name, _, why = line[5:].partition(": ")
            results[name.strip()] = ("FAIL", why)
    return results


SECURITY_TITLES = {
    "listeners": "TLS and SASL listeners through real clients, hostile input, peer suites over SASL_SSL "
                 "(`security/run.sh --hostile --peers`)",
    "acls": "ACLs through kafka-acls.sh and the console clients (`security/acls.sh`)",
    "acl-matrix": "the ACL matrix per API: refused with Kafka's error before an ACL, served after (`security/acls.sh --matrix`)",
    "quotas": "client quotas through kafka-configs.sh and a throttled producer (`security/quotas.sh`)",
    "librdkafka-auth": "librdkafka's authorization tests on a broker with an authorizer (`security/librdkafka-auth.sh`)",
}


def expected_ids(family, reported):
    base = CLI_SCENARIOS if family == "cli" else SCENARIOS
    return base + sorted(set(reported) - set(base))


def main():
    out, families, peers = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
    security = sys.argv[4].split() if len(sys.argv) > 4 else []
    sec = {(b, s): security_results(out, b, s) for b in BROKERS for s in security}
    version = {b: read(os.path.join(out, b, "version")).strip() or "unknown" for b in BROKERS}
    res = {(b, f): scenario_results(out, b, f) for b in BROKERS for f in families}
    p = print
    p("# Compatibility report")
    p()
    p(f"Generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC by "
      "`compat-tests/matrix.sh`. Ours: commit `%s`; reference: %s, single node KRaft, "
      "both with `auto.create.topics.enable=true`, `num.partitions=1`, "
      "`message.max.bytes=1048588`." % (version["ours"], version["kafka"]))
    p()
    p("What each scenario checks is in `compat-tests/README.md`; why ours fails where it does is "
      "in `compat-tests/FINDINGS.md`. `n/a`: the client's API "
      "cannot express the scenario. `missing`: the client never reported it (crash or timeout).")
    p()
    p("## Summary")
    p()
    p("| client | passed (ours) | failed (ours) | passed (Kafka) | failed (Kafka) | n/a |")
    p("|---|---|---|---|---|---|")
    for f in families:
        counts = {}
        for b in BROKERS:
            ids = expected_ids(f, res[(b, f)])
            st = [res[(b, f)].get(i, (None, ""))[0] for i in ids]
            counts[b] = (st.count("PASS"), sum(1 for s in st if s in ("FAIL", None)), st.count("NA"))
        p(f"| {f} | {counts['ours'][0]} | {counts['ours'][1]} | {counts['kafka'][0]} | "
          f"{counts['kafka'][1]} | {counts['ours'][2]} |")
    for peer in peers:
        c = {}
        for b in BROKERS:
            r = peer_results(out, b, peer)
            c[b] = (sum(1 for s, _ in r.values() if s == "PASS"), sum(1 for s, _ in r.values() if s == "FAIL"))
        p(f"| {peer} peer suite | {c['ours'][0]} | {c['ours'][1]} | {c['kafka'][0]} | {c['kafka'][1]} | |")
    for suite in security:
        c = {b: (sum(1 for s, _ in sec[(b, suite)].values() if s == "PASS"),
                 sum(1 for s, _ in sec[(b, suite)].values() if s == "FAIL")) for b in BROKERS}
        p(f"| security: {suite} | {c['ours'][0]} | {c['ours'][1]} | {c['kafka'][0]} | {c['kafka'][1]} | |")
    p()

    lib_families = [f for f in families if f != "cli"]
    if lib_families:
        p("## Client libraries × scenario (ours / Kafka)")
        p()
        p("| scenario | " + " | ".join(lib_families) + " |")
        p("|---|" + "---|" * len(lib_families))
        # The group.rebalance variants differ per client (java has four, go one): an id only
        # some families report is "-" for the others, not missing.
        extra = sorted({sid for f in lib_families for b in BROKERS for sid in res[(b, f)]} - set(SCENARIOS))
        for sid in SCENARIOS + extra:
            cells = []
            for f in lib_families:
                if sid in extra and sid not in res[("ours", f)] and sid not in res[("kafka", f)]:
                    cells.append("-")
                    continue
                o = MARK[res[("ours", f)].get(sid, (None,))[0]]
                k = MARK[res[("kafka", f)].get(sid, (None,))[0]]
                cells.append(f"{o} / {k}")
            p(f"| `{sid}` | " + " | ".join(cells) + " |")
        p()
    if "cli" in families:
        p("## Kafka CLI tools (ours / Kafka)")
        p()
        p("| scenario | result |")
        p("|---|---|")
        for sid in expected_ids("cli", res[("ours", "cli")]):
            o = MARK[res[("ours", "cli")].get(sid, (None,))[0]]
            k = MARK[res[("kafka", "cli")].get(sid, (None,))[0]]
            p(f"| `{sid}` | {o} / {k} |")
        p()

    p("## Failures on our broker")
    p()
    any_failure = False
    for f in families:
        for sid in expected_ids(f, res[("ours", f)]):
            st, detail = res[("ours", f)].get(sid, (None, "never reported"))
            if st in ("FAIL", None):
                any_failure = True
                ks = res[("kafka", f)].get(sid, (None,))[0]
                p(f"- {f} `{sid}` (Kafka: {MARK[ks]}): {detail.strip() or 'no detail'}")
    if not any_failure:
        p("None.")
    p()

    for peer in peers:
        ours, kafka = peer_results(out, "ours", peer), peer_results(out, "kafka", peer)
        p(f"## Peer suite: {peer}")
        p()
        secs = {b: read(os.path.join(out, b, peer + ".seconds")).strip() or "?" for b in BROKERS}
        p(f"All tests (`{peer}/run.sh --all`): ours {sum(1 for s, _ in ours.values() if s == 'PASS')} "
          f"passed of {len(ours)} in {secs['ours']} s; Kafka "
          f"{sum(1 for s, _ in kafka.values() if s == 'PASS')} passed of {len(kafka)} in {secs['kafka']} s. "
          f"Causes are in `{peer}/FINDINGS.md`; what CI pins is `{peer}/tests.allow`.")
        p()
        regress = sorted(t for t, (s, _) in ours.items() if s == "FAIL" and kafka.get(t, ("",))[0] == "PASS")
        if regress:
            p("Failing on ours, passing on Kafka:")
            p()
            for t in regress:
                p(f"- `{t}`: {ours[t][1].strip()[:200]}")
            p()
        both = sorted(t for t, (s, _) in ours.items() if s == "FAIL" and kafka.get(t, ("",))[0] == "FAIL")
        if both:
            p("Failing on both: " + ", ".join(f"`{t}`" for t in both))
            p()
        only_kafka_fails = sorted(t for t, (s, _) in kafka.items() if s == "FAIL" and ours.get(t, ("",))[0] == "PASS")
        if only_kafka_fails:
            p("Passing on ours, failing on Kafka: " + ", ".join(f"`{t}`" for t in only_kafka_fails))
            p()

    for suite in security:
        ours, kafka = sec[("ours", suite)], sec[("kafka", suite)]
        secs = {b: read(os.path.join(out, b, "security-" + suite + ".seconds")).strip() or "?" for b in BROKERS}
        p(f"## Security: {SECURITY_TITLES.get(suite, suite)}")
        p()
        p(f"Ours {sum(1 for s, _ in ours.values() if s == 'PASS')} passed of {len(ours)} in {secs['ours']} s; "
          f"Kafka {sum(1 for s, _ in kafka.values() if s == 'PASS')} passed of {len(kafka)} in {secs['kafka']} s. "
          "A check only one broker ran shows `-` for the other.")
        p()
        p("| check | ours / Kafka |")
        p("|---|---|")
        names = list(ours) + [n for n in kafka if n not in ours]
        for n in names:
            o = MARK[ours[n][0]] if n in ours else "-"
            k = MARK[kafka[n][0]] if n in kafka else "-"
            p(f"| {n.replace('|', '/')} | {o} / {k} |")
        p()
        cases = {b: hostile_cases(out, b, suite) for b in BROKERS}
        if cases["ours"] or cases["kafka"]:
            p("Hostile input on the secure listeners (`security/hostile.py`): each case's answer; "
              "the verdict is checked on ours only.")
            p()
            p("| case | expected | ours | Kafka |")
            p("|---|---|---|---|")
            for n in list(cases["ours"]) + [n for n in cases["kafka"] if n not in cases["ours"]]:
                o, k = cases["ours"].get(n, {}), cases["kafka"].get(n, {})
                exp = (o or k).get("expected", "")
                ours_cell = f"{o.get('answer', '-')} (**{o.get('verdict', '-')}**)" if o else "-"
                p(f"| `{n}` | {exp} | {ours_cell} | {k.get('answer', '-') if k else '-'} |".replace("\n", " "))
            p()
        failing = [n for n in ours if ours[n][0] == "FAIL"]
        if failing:
            p("Failing on ours:")
            p()
            for n in failing:
                p(f"- {n}: {ours[n][1].strip()[:200]}")
            p()


if __name__ == "__main__":
    main()
