#!/usr/bin/env bash
# The fault suite against a local 3-node cluster: run.sh <ours|kafka> [--short|--duration S]
#   [--only a,b,...] [--keep] [--secure]
# Default (and --short): scenarios a-f, s and t, each a few seconds of faults under produce load,
# each ending with the checker (compat.Faults check). --duration S: one mixed random-fault
# loop for S seconds instead. Prints a final table and exits non-zero when a verdict is FAIL.
# Scenarios (README.md has the details):
#   a  kill -9 the leader of partition 0 under load, restart it: resume time <= 10 s
#   b  SIGSTOP a follower: ISR shrinks, produce continues; SIGCONT: it rejoins the ISR
#   c  two of three nodes down: no ack, committed data readable from the survivor;
#      one back: writes resume
#   d  network partition isolating the leader of partition 0; heal
#   e  kill -9 the active (Raft/KRaft) controller: a topic creation succeeds after re-election
#   f  rolling restart: SIGTERM (controlled shutdown) and restart each node in turn: the
#      producer sees no error it does not retry, and no partition stalls > 10 s
#   s  share groups: three KafkaShareConsumers (compat.ShareFaults) under kill -9 of the
#      partition leader, the share coordinator and the group coordinator: every record
#      accepted at least once, none delivered again after its acceptance was confirmed
#   t  transactions: a read-process-write loop (compat.TxnFaults) under kill -9 of a leader
#      of the output topic, kill -9 of the transaction coordinator, SIGSTOP and a network
#      partition; the checker counts lost committed, aborted reads, torn transactions,
#      duplicates and offsets committed without output (FAULTS_TXN_S, default 75 s)
# --txn-duration S: the transactional loop alone for S seconds with random faults.
# --secure (ours): replication over SASL_SSL and the quorum over mTLS (cluster/secure.sh).
# Environment: CLUSTER_PORT (default 30092), FAULTS_RATE (records/s, default 200),
# FAULTS_WORKDIR (default a new directory under /tmp; kept), BROKER_BIN (ours).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../cluster/common.sh"

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 1 ]] || usage
kind=$1
shift
[[ $kind == ours || $kind == kafka ]] || usage
duration=0
only="a,b,c,d,e,f,s,t"
txn_duration=0
keep=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --short) duration=0 ;;
    --duration) duration=${2:?}; shift ;;
    --txn-duration) txn_duration=${2:?}; shift ;;
    --only) only=${2:?}; shift ;;
    --keep) keep=1 ;;
    --secure) export CLUSTER_SECURE=1 ;;
    *) usage ;;
  esac
  shift
done

RATE=${FAULTS_RATE:-200}
PARTITIONS=6
# How long a fault is held in the scenarios (long enough for failure detection).
HOLD_S=${FAULTS_HOLD_S:-12}
RESUME_BOUND_MS=10000
workdir=${FAULTS_WORKDIR:-$(mktemp -d /tmp/faults.XXXXXX)}
mkdir -p "$workdir"
workdir=$(cd "$workdir" && pwd)
data="$workdir/cluster"
results="$workdir/results.tsv"
: >"$results"

"$COMPAT_DIR/install.sh" java >/dev/null 2>"$workdir/install.log" || { cat "$workdir/install.log" >&2; die "install.sh java failed"; }
faults selftest >"$workdir/selftest.out" || { cat "$workdir/selftest.out"; die "checker selftest failed"; }
TXN_JAVA=("${FAULTS_JAVA[@]}")
TXN_JAVA[${#TXN_JAVA[@]}-1]=compat.TxnFaults
txnf() { "${TXN_JAVA[@]}" "$@"; }
txnf selftest >"$workdir/txn-selftest.out" || { cat "$workdir/txn-selftest.out"; die "transaction checker selftest failed"; }
SHARE_JAVA=("${FAULTS_JAVA[@]}")
SHARE_JAVA[${#SHARE_JAVA[@]}-1]=compat.ShareFaults
sharef() { "${SHARE_JAVA[@]}" "$@"; }
sharef selftest >"$workdir/share-selftest.out" || { cat "$workdir/share-selftest.out"; die "share checker selftest failed"; }

# Failure detection sped up for both brokers (our broker ignores keys it does not know):
# a follower leaves the ISR after 5 s without catching up, Kafka fences a broker after
# 6 s without heartbeat (default 9 s).
export CLUSTER_EXTRA_PROPERTIES="replica.lag.time.max.ms=5000
broker.session.timeout.ms=6000
broker.heartbeat.interval.ms=1000
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
offsets.topic.replication.factor=3
group.initial.rebalance.delay.ms=0
${CLUSTER_EXTRA_PROPERTIES:-}"

produce_pid=
process_pid=
cleanup() {
  [[ -n $produce_pid ]] && kill "$produce_pid" 2>/dev/null
  [[ -n $process_pid ]] && kill "$process_pid" 2>/dev/null
  if [[ -f "$data/cluster.env" ]]; then
    "$CLUSTER_DIR/stop.sh" "$data" >/dev/null 2>&1
    ((keep)) || rm -rf "$data"/node*/data
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

node() { "$CLUSTER_DIR/node.sh" "$data" "$@"; }
now_ms() { date +%s%3N; }
say() { log "[$scenario] $*"; }

if ((txn_duration > 0)); then
  list=(txnmixed)
elif ((duration > 0)); then
  list=(mixed)
else
  IFS=, read -r -a list <<<"$only"
fi

label=$kind
[[ ${CLUSTER_SECURE:-0} == 0 ]] || label="$kind, secured inter-broker and controller listeners"
log "fault suite: $label, workdir $workdir"
if ! "$CLUSTER_DIR/start.sh" "$kind" 3 "$data" >/dev/null 2>"$workdir/start.err"; then
  tail -5 "$workdir/start.err" >&2
  for scenario in "${list[@]}"; do
    printf '%s\t-\t-\t-\t-\t-\t-\tFAIL\tthe cluster did not start (%s)\n' "$scenario" "$workdir/start.err" >>"$results"
  done
  { printf 'scenario\tacked\tlost\tduplicated\treordered\tconflicts\tresume_ms\tverdict\tnotes\n'; cat "$results"; } | column -t -s $'\t'
  echo "fault suite ($label): 0 passed, ${#list[@]} failed; logs in $workdir"
  exit 1
fi
load_cluster "$data"

# ---------------------------------------------------------------- helpers

# Brings every node back (resumes paused ones, heals partitions, starts dead ones) and
# waits until the cluster lists all brokers.
restore_cluster() {
  local i
  node heal
  for ((i = 1; i <= N; i++)); do
    if node_alive "$i"; then node resume "$i"; else node start "$i"; fi
  done
  node wait
}

new_topic() {
  faults create-topic "$BOOTSTRAP" "$1" "$PARTITIONS" 3 2 60 >/dev/null
}

leader_of() { faults describe "$BOOTSTRAP" "$1" | awk -v p="$2" '$1 == p { print $2 }'; }
replicas_of() { faults describe "$BOOTSTRAP" "$1" | awk -v p="$2" '$1 == p { gsub(",", " ", $4); print $4 }'; }
controller_id() { faults controller "$BOOTSTRAP" 2>/dev/null; }
# The bootstrap list without node $1.
without_node() {
  local i out=""
  for ((i = 1; i <= N; i++)); do ((i == $1)) || out+="${out:+,}$(node_addr "$i"):$PORT"; done
  echo "$out"
}

# start_produce <topic> <log>: the producer runs until stop_produce (bounded to an hour).
start_produce() {
  rm -f "$workdir/$1.stop"
  "${FAULTS_JAVA[@]}" produce "$BOOTSTRAP" "$1" "w$RANDOM" 3600 "$RATE" "$2" "$workdir/$1.stop" \
    >"$2.out" 2>"$2.err" &
  produce_pid=$!
  produce_topic=$1
}
stop_produce() {
  touch "$workdir/$produce_topic.stop"
  wait "$produce_pid"
  produce_pid=
}

# acks_between <log> <from-ms> [<to-ms>]
acks_between() {
  awk -F'\t' -v a="$2" -v b="${3:-99999999999999}" '$2 == "ACKED" && $1 >= a && $1 < b { n++ } END { print n + 0 }' "$1"
}

# wait_acks <log> <since-ms> <timeout-s>: until an ack after since; prints its delay in ms.
wait_acks() {
  local deadline=$((SECONDS + $3)) t
  while ((SECONDS < deadline)); do
    t=$(awk -F'\t' -v a="$2" '$2 == "ACKED" && $1 >= a { print $1; exit }' "$1" 2>/dev/null)
    [[ -n $t ]] && { echo $((t - $2)); return 0; }
    sleep 0.5
  done
  return 1
}

# field <name> <CHECK line>
field() { tr ' ' '\n' <<<"$2" | awk -F= -v k="$1" '$1 == k { print $2 }'; }

# run_check <topic> <log> [check args]: runs the checker, sets check_line.
run_check() {
  local topic=$1 logf=$2
  shift 2
  faults check "$BOOTSTRAP" "$topic" "$@" --json "$logf.check.json" "$logf" >"$logf.check" 2>"$logf.check.err"
  check_line=$(grep -m1 '^CHECK ' "$logf.check")
  [[ -n $check_line ]] || check_line="CHECK FAIL (checker crashed: $(tail -1 "$logf.check.err"))"
  say "$check_line"
}

# leader0 <topic>: the leader of partition 0, waiting up to 30 s for one.
leader0() {
  local l deadline=$((SECONDS + 30))
  while ((SECONDS < deadline)); do
    l=$(leader_of "$1" 0 2>/dev/null)
    [[ $l =~ ^[0-9]+$ ]] && ((l >= 1 && l <= N)) && { echo "$l"; return 0; }
    sleep 1
  done
  return 1
}

# give_up <topic> <log> <note>: ends a scenario early as FAIL (stops the producer, checks).
give_up() {
  [[ -n $produce_pid ]] && stop_produce
  run_check "$1" "$2"
  row FAIL - "$3"
}

# row <verdict> <resume> <notes>: one line of the final table from check_line.
row() {
  local v=$1
  [[ $check_line == "CHECK PASS"* ]] || v=FAIL
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$scenario" \
    "$(field acked "$check_line")" "$(field lost "$check_line")" "$(field duplicated "$check_line")" \
    "$(field reordered "$check_line")" "$(field conflicts "$check_line")" "$2" "$v" \
    "$3; indeterminate=$(field indeterminate "$check_line")" >>"$results"
  say "verdict $v ($3)"
}

# ---------------------------------------------------------------- scenarios

scenario_a() {
  local topic=fa-a logf="$workdir/a.log" l t resume verdict=PASS notes
  new_topic "$topic" || { check_line="CHECK FAIL"; row FAIL - "create-topic failed"; return; }
  start_produce "$topic" "$logf"
  wait_acks "$logf" 0 60 >/dev/null || say "no ack within 60 s before the fault"
  sleep 3
  l=$(leader0 "$topic") || { give_up "$topic" "$logf" "no leader for partition 0"; return; }
  notes="killed leader $l (controller was $(controller_id))"
  say "kill -9 node $l, the leader of partition 0"
  t=$(now_ms)
  node kill "$l"
  sleep "$HOLD_S"
  say "restarting node $l"
  node start "$l" && node wait || notes+="; restart failed"
  faults await-isr "$BOOTSTRAP" "$topic" full 60 >/dev/null 2>&1 || notes+="; ISR not full again within 60 s"
  sleep 2
  stop_produce
  run_check "$topic" "$logf" --resume-from "$t"
  resume=$(field resume_ms "$check_line")
  if [[ -z $resume ]] || ((resume > RESUME_BOUND_MS)); then
    verdict=FAIL
    notes+="; resume > ${RESUME_BOUND_MS} ms"
  fi
  row "$verdict" "$resume" "$notes"
}

scenario_b() {
  local topic=fa-b logf="$workdir/b.log" l c f r t shrink_ms rejoin_ms after verdict=PASS notes
  new_topic "$topic" || { check_line="CHECK FAIL"; row FAIL - "create-topic failed"; return; }
  start_produce "$topic" "$logf"
  wait_acks "$logf" 0 60 >/dev/null
  sleep 2
  l=$(leader0 "$topic") || { give_up "$topic" "$logf" "no leader for partition 0"; return; }
  c=$(controller_id)
  # A follower of partition 0 that is not the active controller, when there is one.
  f=
  for r in $(replicas_of "$topic" 0); do
    [[ $r == "$l" ]] && continue
    [[ -z $f || $r != "$c" ]] && f=$r
    [[ $r != "$c" ]] && break
  done
  [[ -n $f ]] || { give_up "$topic" "$logf" "no follower of partition 0 found"; return; }
  say "SIGSTOP node $f (a follower of partition 0; leader $l, controller $c)"
  t=$(now_ms)
  node pause "$f"
  if shrink_ms=$(faults await-isr "$BOOTSTRAP" "$topic" "shrunk:$f" 40 2>"$logf.isr"); then
    notes="ISR without $f after ${shrink_ms} ms"
    sleep 3
    after=$(acks_between "$logf" "$((t + shrink_ms))")
    notes+=", $after acks after the shrink"
    ((after > 0)) || { verdict=FAIL; notes+=" (produce did not continue)"; }
  else
    verdict=FAIL
    notes="ISR did not shrink within 40 s: $(tail -1 "$logf.isr")"
  fi
  say "SIGCONT node $f"
  node resume "$f"
  if rejoin_ms=$(faults await-isr "$BOOTSTRAP" "$topic" full 60 2>"$logf.isr2"); then
    notes+="; rejoined the ISR ${rejoin_ms} ms after SIGCONT"
  else
    verdict=FAIL
    notes+="; did not rejoin the ISR within 60 s"
  fi
  stop_produce
  run_check "$topic" "$logf" --resume-from "$t"
  row "$verdict" "$(field resume_ms "$check_line")" "$notes"
}

scenario_c() {
  local topic=fa-c logf="$workdir/c.log" z x y t t2 during probe verdict=PASS notes readable
  new_topic "$topic" || { check_line="CHECK FAIL"; row FAIL - "create-topic failed"; return; }
  start_produce "$topic" "$logf"
  wait_acks "$logf" 0 60 >/dev/null
  sleep 2
  # The survivor z leads partition 0; x goes first (while the quorum still can shrink ISRs
  # and move leaders), then y, which takes the quorum away.
  z=$(leader0 "$topic") || { give_up "$topic" "$logf" "no leader for partition 0"; return; }
  read -r x y < <(for r in 1 2 3; do [[ $r != "$z" ]] && printf '%s ' "$r"; done)
  say "kill -9 node $x; survivor will be node $z"
  node kill "$x"
  faults await-isr "$BOOTSTRAP" "$topic" "shrunk:$x" 40 >/dev/null 2>&1 || say "ISR did not drop $x within 40 s"
  say "kill -9 node $y: one node of three left"
  t=$(now_ms)
  node kill "$y"
  sleep 2
  probe=$(faults probe "$(node_addr "$z"):$PORT" "$topic" 0 8000 2>/dev/null | tail -1)
  notes="probe on partition 0 (leader $z): ${probe:-no answer}"
  # Committed data stays readable: every acked write of a partition the survivor can serve.
  cp "$logf" "$logf.snapshot"
  if faults check "$(node_addr "$z"):$PORT" "$topic" --partial "$logf.snapshot" >"$logf.partial" 2>&1; then
    readable=$(grep -m1 '^CHECK ' "$logf.partial")
    notes+="; survivor read: acked=$(field acked "$readable") unchecked=$(field unchecked "$readable") unreadable=$(field unreadable "$readable")"
  else
    verdict=FAIL
    notes+="; survivor read FAILED: $(grep -m1 '^CHECK ' "$logf.partial" || tail -1 "$logf.partial")"
  fi
  during=$(acks_between "$logf" "$((t + 1000))")
  notes+="; $during acks with 1 of 3 up"
  ((during == 0)) || verdict=FAIL
  say "starting node $y again"
  t2=$(now_ms)
  node start "$y"
  local resumed
  if resumed=$(wait_acks "$logf" "$t2" 60); then
    notes+="; writes resumed ${resumed} ms after restarting $y"
  else
    verdict=FAIL
    notes+="; no ack within 60 s after restarting $y"
  fi
  node start "$x"
  node wait
  faults await-isr "$BOOTSTRAP" "$topic" full 60 >/dev/null 2>&1 || notes+="; ISR not full again within 60 s"
  stop_produce
  grep -o 'Error: [A-Z_]*' "$logf.err" | sort | uniq -c | awk '{ printf "%s%s x%s", (NR > 1 ? ", " : "; producer retried: "), $3, $1 }' >"$logf.errs"
  notes+=$(cat "$logf.errs")
  run_check "$topic" "$logf" --resume-from "$t2"
  row "$verdict" "$(field resume_ms "$check_line")" "$notes"
}

scenario_d() {
  local topic=fa-d logf="$workdir/d.log" l t th during led majority verdict=PASS notes
  new_topic "$topic" || { check_line="CHECK FAIL"; row FAIL - "create-topic failed"; return; }
  start_produce "$topic" "$logf"
  wait_acks "$logf" 0 60 >/dev/null
  sleep 2
  l=$(leader0 "$topic") || { give_up "$topic" "$logf" "no leader for partition 0"; return; }
  led=$(faults describe "$BOOTSTRAP" "$topic" | awk -v l="$l" '$2 == l { printf "%s%s", sep, $1; sep = "," }')
  # The isolated node keeps its stale view of the metadata; ask the majority only.
  majority=$(without_node "$l")
  notes="isolated node $l, leader of partitions $led (controller was $(controller_id))"
  say "isolating node $l from the other nodes"
  t=$(now_ms)
  if ! node isolate "$l"; then
    check_line="CHECK FAIL"
    stop_produce
    row FAIL - "could not partition the network"
    return
  fi
  local moved
  if moved=$(faults await-isr "$majority" "$topic" "shrunk:$l" 40 2>/dev/null); then
    notes+="; the majority moved its leaderships away after ${moved} ms"
  else
    verdict=FAIL
    notes+="; the majority did not move leaderships off $l within 40 s"
  fi
  sleep "$((HOLD_S / 2))"
  th=$(now_ms)
  during=$(awk -F'\t' -v a="$((t + 1000))" -v b="$th" -v led=",$led," \
    '$2 == "ACKED" && $1 >= a && $1 < b && index(led, "," $3 ",") { n++ } END { print n + 0 }' "$logf")
  notes+="; $during acks on those partitions during the partition"
  say "healing"
  node heal
  faults await-isr "$BOOTSTRAP" "$topic" full 60 >/dev/null 2>&1 || { verdict=FAIL; notes+="; ISR not full within 60 s of healing"; }
  sleep 2
  stop_produce
  run_check "$topic" "$logf" --resume-from "$t"
  row "$verdict" "$(field resume_ms "$check_line")" "$notes"
}

scenario_e() {
  local topic=fa-e logf="$workdir/e.log" c t created verdict=PASS notes
  new_topic "$topic" || { check_line="CHECK FAIL"; row FAIL - "create-topic failed"; return; }
  start_produce "$topic" "$logf"
  wait_acks "$logf" 0 60 >/dev/null
  sleep 2
  c=$(controller_id)
  if [[ ! $c =~ ^[0-9]+$ ]] || ((c < 1)); then
    stop_produce
    run_check "$topic" "$logf"
    row FAIL - "no active controller found (DescribeQuorum)"
    return
  fi
  say "kill -9 node $c, the active controller"
  t=$(now_ms)
  node kill "$c"
  if created=$(faults create-topic "$(without_node "$c")" fa-e-after 3 2 2 60 2>"$logf.create"); then
    notes="killed controller $c; CreateTopics succeeded after ${created} ms; new controller $(controller_id)"
  else
    verdict=FAIL
    notes="killed controller $c; CreateTopics failed: $(tail -1 "$logf.create")"
  fi
  node start "$c"
  node wait
  faults await-isr "$BOOTSTRAP" "$topic" full 60 >/dev/null 2>&1 || notes+="; ISR not full again within 60 s"
  stop_produce
  run_check "$topic" "$logf" --resume-from "$t"
  row "$verdict" "$(field resume_ms "$check_line")" "$notes"
}

scenario_f() {
  local topic=fa-f logf="$workdir/f.log" i t resume failed indeterminate verdict=PASS notes=""
  new_topic "$topic" || { check_line="CHECK FAIL"; row FAIL - "create-topic failed"; return; }
  start_produce "$topic" "$logf"
  wait_acks "$logf" 0 60 >/dev/null
  sleep 2
  t=$(now_ms)
  for ((i = 1; i <= N; i++)); do
    say "SIGTERM node $i (controlled shutdown), then start it again"
    node term "$i"
    { node start "$i" && node wait; } || notes+="node $i did not come back; "
    faults await-isr "$BOOTSTRAP" "$topic" full 60 >/dev/null 2>&1 || notes+="ISR not full 60 s after restarting $i; "
  done
  sleep 2
  stop_produce
  notes+="restarted nodes 1-$N in turn"
  grep -o 'Error: [A-Z_]*' "$logf.err" | sort | uniq -c | awk '{ printf "%s%s x%s", (NR > 1 ? ", " : "; producer retried: "), $3, $1 }' >"$logf.errs"
  notes+=$(cat "$logf.errs")
  run_check "$topic" "$logf" --resume-from "$t"
  resume=$(field resume_ms "$check_line")
  failed=$(field failed "$check_line")
  indeterminate=$(field indeterminate "$check_line")
  # Every write acked: a restart the client notices only as retried errors.
  if [[ $failed != 0 || $indeterminate != 0 ]]; then
    verdict=FAIL
    notes+="; the producer saw errors it did not retry away"
  fi
  if [[ -z $resume ]] || ((resume > RESUME_BOUND_MS)); then
    verdict=FAIL
    notes+="; a partition stalled > ${RESUME_BOUND_MS} ms"
  fi
  row "$verdict" "$resume" "$notes"
}

# The mixed random-fault loop of the long form.
scenario_mixed() {
  local topic=fa-mixed logf="$workdir/mixed.log" end=$((SECONDS + duration)) faults_done=0 kind_ n hold verdict=PASS notes="" done_list="" t
  new_topic "$topic" || { check_line="CHECK FAIL"; row FAIL - "create-topic failed"; return; }
  start_produce "$topic" "$logf"
  wait_acks "$logf" 0 60 >/dev/null
  t=$(now_ms)
  while ((SECONDS < end)); do
    n=$((RANDOM % 3 + 1))
    hold=$((RANDOM % 11 + 5))
    case $((RANDOM % 4)) in
      0) kind_="kill"; node kill "$n" ;;
      1) kind_=pause; node pause "$n" ;;
      2) kind_=isolate; node isolate "$n" ;;
      3) n=$(controller_id); [[ $n =~ ^[1-9]$ ]] || n=1; kind_=kill-controller; node kill "$n" ;;
    esac
    say "fault $((faults_done + 1)): $kind_ node $n for $hold s"
    done_list+="${done_list:+, }$kind_ $n"
    sleep "$hold"
    restore_cluster || { verdict=FAIL; notes+="cluster did not recover after $kind_ $n; "; }
    faults await-isr "$BOOTSTRAP" "$topic" full 90 >/dev/null 2>&1 || notes+="ISR not full 90 s after $kind_ $n; "
    faults_done=$((faults_done + 1))
    sleep $((RANDOM % 4 + 2))
  done
  stop_produce
  # resume_ms here is the longest time any partition went without an ack during the loop.
  run_check "$topic" "$logf" --resume-from "$t"
  row "$verdict" "$(field resume_ms "$check_line")" "${notes}$faults_done faults: $done_list"
}

# ---------------------------------------------------------------- transactions

# One transactional fault: kind and node; held $2 s, then the cluster is restored.
txn_fault() {
  local kind_=$1 hold=$2 n txid=$3 out=$4
  case $kind_ in
    kill-leader) n=$(leader0 "$out") || n=1; node kill "$n" ;;
    kill-coordinator) n=$(txnf coordinator "$BOOTSTRAP" "$txid" 2>>"$workdir/t.coordinator.err"); [[ $n =~ ^[1-9]$ ]] || n=1; node kill "$n" ;;
    pause) n=$((RANDOM % N + 1)); node pause "$n" ;;
    isolate) n=$((RANDOM % N + 1)); node isolate "$n" ;;
  esac
  say "fault: $kind_ node $n for $hold s"
  txn_done+="${txn_done:+, }$kind_ $n"
  sleep "$hold"
  restore_cluster || txn_notes+="cluster did not recover after $kind_ $n; "
  faults await-isr "$BOOTSTRAP" "$out" full 90 >/dev/null 2>&1 || txn_notes+="ISR not full 90 s after $kind_ $n; "
}

# txn_run <seconds> <fixed|random>: seed, the read-process-write loop under faults, check.
txn_run() {
  local budget=$1 mode=$2 in=fa-t-in out=fa-t-out group=fa-t-group txid=fa-t-txn logf="$workdir/t.log"
  local end=$((SECONDS + budget)) kinds=(kill-leader kill-coordinator pause isolate) nf=0 c
  txn_done="" txn_notes=""
  { new_topic "$in" && new_topic "$out"; } || { check_line="CHECK FAIL"; row FAIL - "create-topic failed"; return; }
  txnf seed "$BOOTSTRAP" "$in" "${FAULTS_TXN_INPUTS:-$((budget * 300))}" >"$logf.seed" 2>&1 \
    || { check_line="CHECK FAIL"; row FAIL - "seeding failed: $(tail -1 "$logf.seed")"; return; }
  rm -f "$workdir/t.stop"
  txnf process "$BOOTSTRAP" "$in" "$out" "$group" "$txid" "$logf" "$workdir/t.stop" $((budget + 600)) \
    >"$logf.out" 2>"$logf.err" &
  process_pid=$!
  local deadline=$((SECONDS + 60))
  until grep -q $'\tCOMMITTED\t' "$logf" 2>/dev/null || ((SECONDS > deadline)); do sleep 1; done
  sleep 3
  # fixed: the four faults once each whatever the budget (it sizes the input); random: until
  # the budget is spent.
  while [[ $mode == fixed ]] || ((SECONDS < end)); do
    if [[ $mode == fixed ]]; then
      ((nf < ${#kinds[@]})) || break
      txn_fault "${kinds[nf]}" 8 "$txid" "$out"
    else
      txn_fault "${kinds[RANDOM % 4]}" $((RANDOM % 11 + 5)) "$txid" "$out"
    fi
    nf=$((nf + 1))
    sleep $((RANDOM % 3 + 3))
  done
  # Let it commit after the last fault, then stop it.
  sleep 5
  touch "$workdir/t.stop"
  wait "$process_pid"
  process_pid=
  txnf check "$BOOTSTRAP" "$in" "$out" "$group" "$logf" >"$logf.check" 2>"$logf.check.err"
  c=$(grep -m1 '^TXNCHECK ' "$logf.check")
  [[ -n $c ]] || c="TXNCHECK FAIL (checker crashed: $(tail -1 "$logf.check.err"))"
  say "$c"
  say "$(tail -1 "$logf.out")"
  local v=PASS
  [[ $c == "TXNCHECK PASS"* ]] || v=FAIL
  # Columns: acked = inputs under the committed offsets, lost = lost committed,
  # duplicated = duplicates; the other counts go to the notes.
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$scenario" \
    "$(field inputs_committed "$c")" "$(field lost_committed "$c")" "$(field duplicates "$c")" - - - "$v" \
    "${txn_notes}aborted_read=$(field aborted_read "$c") torn=$(field torn "$c") offsets_without_output=$(field offsets_without_output "$c") unlogged=$(field unlogged "$c") txns=$(field txn_committed "$c")/$(field txn_aborted "$c")/$(field txn_unknown "$c") (committed/aborted/unknown); $nf faults: $txn_done" >>"$results"
  say "verdict $v"
}

scenario_t() { txn_run "${FAULTS_TXN_S:-75}" fixed; }

# ---------------------------------------------------------------- share groups

# accepted_count <log>: distinct records whose acceptance was confirmed.
accepted_count() { awk -F'\t' '$2 == "ACCEPTED" { a[$4] = 1 } END { print length(a) }' "$1" 2>/dev/null || echo 0; }

# s: three share consumers (about 600 records/s in all) under kill -9 of partition 0's
# leader, of its share coordinator and of the group's coordinator, each held 8 s; then they
# drain the rest. Every record must be accepted at least once and none delivered again after
# its acceptance was confirmed.
scenario_s() {
  local topic=fa-s group=fa-s-group logf="$workdir/s.log" n=${FAULTS_SHARE_RECORDS:-20000}
  local kind_ n_ c v=PASS done_="" notes="" deadline
  new_topic "$topic" || { check_line="CHECK FAIL"; row FAIL - "create-topic failed"; return; }
  txnf seed "$BOOTSTRAP" "$topic" "$n" >"$logf.seed" 2>&1 \
    || { check_line="CHECK FAIL"; row FAIL - "seeding failed: $(tail -1 "$logf.seed")"; return; }
  rm -f "$workdir/s.stop" "$workdir/s.stop.drain"
  sharef consume "$BOOTSTRAP" "$topic" "$group" 3 "$logf" "$workdir/s.stop" 900 >"$logf.out" 2>"$logf.err" &
  process_pid=$!
  deadline=$((SECONDS + 60))
  until grep -q $'\tACCEPTED\t' "$logf" 2>/dev/null || ((SECONDS > deadline)); do sleep 1; done
  sleep 3
  for kind_ in kill-leader kill-share-coordinator kill-group-coordinator; do
    case $kind_ in
      kill-leader) n_=$(leader0 "$topic") || n_=1 ;;
      kill-share-coordinator) n_=$(sharef coordinator "$BOOTSTRAP" "$group" "$topic" share 2>>"$logf.coordinator.err") ;;
      kill-group-coordinator) n_=$(sharef coordinator "$BOOTSTRAP" "$group" "$topic" group 2>>"$logf.coordinator.err") ;;
    esac
    [[ $n_ =~ ^[1-9]$ ]] || { notes+="no node found for $kind_; "; n_=$((RANDOM % N + 1)); }
    node kill "$n_"
    say "fault: $kind_ node $n_ (accepted so far: $(accepted_count "$logf"))"
    done_+="${done_:+, }$kind_ $n_"
    sleep 8
    restore_cluster || notes+="cluster did not recover after $kind_ $n_; "
    faults await-isr "$BOOTSTRAP" "$topic" full 90 >/dev/null 2>&1 || notes+="ISR not full 90 s after $kind_ $n_; "
    sleep 3
  done
  touch "$workdir/s.stop.drain"
  deadline=$((SECONDS + 180))
  while (($(accepted_count "$logf") < n && SECONDS < deadline)); do sleep 2; done
  # A few seconds more: a record delivered again after its acceptance would show now.
  sleep 5
  touch "$workdir/s.stop"
  wait "$process_pid"
  process_pid=
  sharef check "$logf" "$n" >"$logf.check" 2>"$logf.check.err"
  c=$(grep -m1 '^SHARECHECK ' "$logf.check")
  [[ -n $c ]] || c="SHARECHECK FAIL (checker crashed: $(tail -1 "$logf.check.err"))"
  say "$c"
  [[ $c == "SHARECHECK PASS"* ]] || v=FAIL
  # Columns: acked = records accepted, lost = never accepted, duplicated = delivered again
  # after their acceptance was confirmed.
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$scenario" \
    "$(field accepted "$c")" "$(field missing "$c")" "$(field redelivered_after_accept "$c")" - - - "$v" \
    "${notes}deliveries=$(field deliveries "$c") ack_failures=$(field ack_failures "$c") consumer_errors=$(field errors "$c"); 3 faults: $done_" >>"$results"
  say "verdict $v"
}
scenario_txnmixed() { txn_run "$txn_duration" random; }

# ---------------------------------------------------------------- run

for scenario in "${list[@]}"; do
  start=$SECONDS
  say "start"
  "scenario_$scenario"
  say "done in $((SECONDS - start)) s"
  restore_cluster || die "the cluster did not recover after scenario $scenario"
done

echo
{
  printf 'scenario\tacked\tlost\tduplicated\treordered\tconflicts\tresume_ms\tverdict\tnotes\n'
  cat "$results"
} | column -t -s $'\t'
failed=$(awk -F'\t' '$8 != "PASS"' "$results" | wc -l)
echo "fault suite ($label): $(($(wc -l <"$results") - failed)) passed, $failed failed; logs in $workdir"
((failed == 0))
