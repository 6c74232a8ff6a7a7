#!/usr/bin/env bash
# Round trip through kcat (librdkafka from Debian): roundtrip.sh <bootstrap> [N] [codec,codec,...]
#
# For each codec: create a 3-partition topic (through the Java build's CreateTopic,
# since a broker need not auto-create topics), produce N keyed records with two
# static headers using an idempotent acks=all producer, consume them back from
# the beginning to the end of every partition, and check count, distinct keys,
# values, headers, CreateTime timestamps, per-partition order, contiguous offsets
# from 0, and the earliest/latest offsets that ListOffsets (kcat -Q) reports.
# kcat cannot set a timestamp or a header per record from its input, so the
# timestamp is checked to lie within the produce window and the headers are the
# same on every record. Prints one PASS/FAIL line per codec; exits 1 on failure.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

[[ $# -ge 1 ]] || { echo "usage: roundtrip.sh <bootstrap> [N] [codec,codec,...]" >&2; exit 2; }
bootstrap=$1
n=${2:-$N}
if [[ $# -ge 3 ]]; then IFS=, read -r -a codecs <<<"$3"; else codecs=("${CODECS[@]}"); fi
client=kcat
partition_count=3
# Bounds on each kcat invocation, so a broken broker fails a check instead of hanging it.
kcat_timeout_s=180

workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT
run_id=$(date +%s%3N)

# The producer's input: "key-<i><TAB>value-<i>-<codec>-<padding>", one record a line.
make_input() {
  awk -v n="$n" -v codec="$1" 'BEGIN {
    pad = sprintf("%127s", ""); gsub(/ /, "x", pad)
    for (i = 0; i < n; i++) printf "key-%d\tvalue-%d-%s-%s\n", i, i, codec, substr(pad, 1, 64 + i % 64)
  }'
}

# Reads kcat's consumer output "<partition>\t<offset>\t<timestamp>\t<key>\t<value>\t<headers>"
# and the ListOffsets lines "<partition> <earliest> <latest>"; prints nothing when every
# record checks out, else the first problem found.
verify() {
  awk -F'\t' -v n="$n" -v codec="$1" -v t0="$2" -v t1="$3" -v parts="$partition_count" '
    function fail(msg) { if (!failed) print msg; failed = 1 }
    FILENAME == ARGV[1] {
      if (NF != 6) { fail("malformed line " FNR ": " $0); next }
      p = $1; off = $2; ts = $3; k = $4; v = $5; h = $6
      if (k !~ /^key-[0-9]+$/) { fail("p" p " offset " off ": unexpected key " k); next }
      i = substr(k, 5) + 0
      if (seen[i]++) fail("key " k " read twice")
      expected = sprintf("value-%d-%s-", i, codec)
      if (index(v, expected) != 1 || length(v) != length(expected) + 64 + i % 64)
        fail("p" p " offset " off ": value differs for " k)
      if (h != "client=kcat,codec=" codec) fail("p" p " offset " off ": headers " h)
      if (ts < t0 - 1000 || ts > t1 + 1000) fail("p" p " offset " off ": timestamp " ts " outside produce window")
      if (p in last_off) {
        if (off != last_off[p] + 1) fail("p" p ": offset " off " after " last_off[p] " (not contiguous)")
        if (i <= last_i[p]) fail("p" p ": key-" i " after key-" last_i[p] " (order lost)")
      } else if (off != 0) fail("p" p ": first offset " off ", expected 0")
      last_off[p] = off; last_i[p] = i; count[p]++; total++
      next
    }
    {
      split($0, f, " "); p = f[1]; earliest = f[2]; latest = f[3]
      end = (p in last_off) ? last_off[p] + 1 : 0
      if (earliest != 0) fail("p" p ": ListOffsets earliest " earliest ", expected 0")
      if (latest != end) fail("p" p ": ListOffsets latest " latest ", expected " end)
      listed++
    }
    END {
      if (total != n) fail("read " total " records, produced " n)
      if (listed != parts) fail("ListOffsets answered for " listed " of " parts " partitions")
      if (!failed) {
        s = ""
        for (p = 0; p < parts; p++) s = s (p ? "," : "") (count[p] + 0)
        print "OK " s
      }
    }' "$workdir/out" "$workdir/offsets"
}

# Prints "<partition> <earliest> <latest>" per partition from kcat -Q (-2 = beginning, -1 = end).
list_offsets() {
  local topic=$1 args_earliest=() args_latest=() p
  for ((p = 0; p < partition_count; p++)); do
    args_earliest+=(-t "$topic:$p:-2")
    args_latest+=(-t "$topic:$p:-1")
  done
  join <(timeout --foreground 60 kcat -Q -b "$bootstrap" "${args_earliest[@]}" | sed -n 's/.*\[\([0-9]*\)\] offset \(-\?[0-9]*\)$/\1 \2/p' | sort) \
       <(timeout --foreground 60 kcat -Q -b "$bootstrap" "${args_latest[@]}" | sed -n 's/.*\[\([0-9]*\)\] offset \(-\?[0-9]*\)$/\1 \2/p' | sort)
}

round_trip() {
  local codec=$1 topic="compat-kcat-$1-$run_id" t0 t1 result
  timeout --foreground 60 java -cp "$JAVA_CLASSES:$JAVA_LIBS/*" compat.CreateTopic "$bootstrap" "$topic" "$partition_count" \
    2>"$workdir/err" || { echo "create topic failed: $(tail -1 "$workdir/err")"; return 1; }
  make_input "$codec" >"$workdir/in"
  t0=$(date +%s%3N)
  timeout --foreground "$kcat_timeout_s" kcat -P -q -b "$bootstrap" -t "$topic" -z "$codec" -K $'\t' \
    -H client=kcat -H "codec=$codec" \
    -X enable.idempotence=true -X acks=all -X linger.ms=5 <"$workdir/in" 2>"$workdir/err" \
    || { echo "kcat produce exited $?: $(tail -1 "$workdir/err")"; return 1; }
  t1=$(date +%s%3N)
  timeout --foreground "$kcat_timeout_s" kcat -C -q -b "$bootstrap" -t "$topic" -o beginning -e \
    -f '%p\t%o\t%T\t%k\t%s\t%h\n' >"$workdir/out" 2>"$workdir/err" \
    || { echo "kcat consume exited $?: $(tail -1 "$workdir/err")"; return 1; }
  list_offsets "$topic" >"$workdir/offsets" 2>"$workdir/err" \
    || { echo "kcat -Q failed: $(tail -1 "$workdir/err")"; return 1; }
  result=$(verify "$codec" "$t0" "$t1")
  [[ $result == OK* ]] || { echo "$result"; return 1; }
  echo "$n records, per partition [${result#OK }], ListOffsets ok"
}

command -v kcat >/dev/null || die "kcat not installed; run install.sh kcat"
[[ -d $JAVA_CLASSES ]] || die "Java build missing; run install.sh java"

passed=0
failed=0
for codec in "${codecs[@]}"; do
  start=$SECONDS
  if detail=$(round_trip "$codec"); then
    echo "PASS $client $codec: $detail in $((SECONDS - start)) s"
    passed=$((passed + 1))
  else
    echo "FAIL $client $codec: $detail"
    failed=$((failed + 1))
  fi
done
echo "$client: $passed passed, $failed failed"
((failed == 0))
