#!/usr/bin/env bash
# Runs the fuzz targets under libFuzzer and prints one line per target.
#
#   run.sh --brief               CI: the protocol targets, $BRIEF_SECONDS
#                                (default 10) each, in a quick unoptimised build
#   run.sh --seconds N [name...] every target (or those named) for N seconds,
#                                in an optimised build; the broker's and the
#                                dispatcher's first build compiles RocksDB and
#                                librdkafka with the fuzzing flags (10+ minutes)
#   run.sh --cmin DIR            merges DIR/<target>/ (new inputs: capture.sh's
#                                output, or a long run's $FUZZ_WORK) into the
#                                committed corpora, keeping only inputs that
#                                add coverage
#   run.sh --list                the targets, as crate/name
#
# The targets live in protocol/fuzz, broker/fuzz and dispatcher-sidecar/fuzz,
# one line each around the crates' `fuzzing` modules. Builds are plain
# cargo with cargo-fuzz's instrumentation flags (no nightly, no cargo-fuzz
# needed; `cargo +nightly fuzz run <name>` in a fuzz directory works too,
# with AddressSanitizer), into $CARGO_TARGET_DIR (under --target, so the
# workspace's own build is untouched). New inputs go to $FUZZ_WORK (default
# a temp directory, printed), crashes to $FUZZ_WORK/artifacts/<name>/.
# Exits 1 if any target crashed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
triple=$(rustc -vV | sed -n 's/^host: //p')

declare -A CRATE_DIR=([protocol]=protocol/fuzz [broker]=broker/fuzz [dispatcher]=dispatcher-sidecar/fuzz)
TARGETS=(
  protocol/request_stream protocol/request_body protocol/record_batches
  protocol/records protocol/decompress protocol/codec_round_trip
  broker/producer_snapshot broker/log_recovery broker/coordinator_records
  broker/sasl_exchange broker/certificate_subject
  dispatcher/receipt dispatcher/envelope dispatcher/ack_log dispatcher/values
)

# cargo-fuzz's flags for `--sanitizer none`, plus debug assertions and
# overflow checks, which are most of what finds bugs in safe Rust.
RUSTFLAGS_FUZZ="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
RUSTFLAGS_FUZZ+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters"
RUSTFLAGS_FUZZ+=" -Cllvm-args=-sanitizer-coverage-pc-table"
RUSTFLAGS_FUZZ+=" -Cllvm-args=-sanitizer-coverage-trace-compares"
RUSTFLAGS_FUZZ+=" --cfg fuzzing -Cdebug-assertions -Coverflow-checks"

log() { printf '[fuzz %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

usage() { sed -n '2,25p' "$0" >&2; exit 2; }

# build <crate> <profile>: prints the directory holding its binaries.
build() {
  local crate=$1 profile=$2
  log "building $crate fuzz targets ($profile)"
  RUSTFLAGS="$RUSTFLAGS_FUZZ" cargo build -q --manifest-path "$root/${CRATE_DIR[$crate]}/Cargo.toml" \
    --profile "$profile" --target "$triple" --bins >&2
  echo "$CARGO_TARGET_DIR/$triple/$profile"
}

# fuzz <bin dir> <crate/name> <seconds>: runs one target, prints its line.
failed=0
fuzz() {
  local bins=$1 target=$2 seconds=$3
  local crate=${target%%/*} name=${target#*/}
  local corpus="$root/${CRATE_DIR[$crate]}/corpus/$name"
  local new="$work/$name" artifacts="$work/artifacts/$name"
  mkdir -p "$new" "$artifacts" "$corpus"
  local out="$work/$name.log" rc=0
  # -rss_limit_mb: a target whose memory grows past 2 GiB has found a bomb.
  FUZZ_TMPDIR="$work/tmp" "$bins/$name" -max_total_time="$seconds" -timeout=20 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts/" \
    "$new" "$corpus" >"$out" 2>&1 || rc=$?
  local execs cov units
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out" | tail -1)
  units=$(sed -n 's/^stat::new_units_added: *//p' "$out" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$out" | tail -1 | cut -d' ' -f2)
  local verdict=ok
  if ((rc != 0)); then
    verdict="CRASH (exit $rc): $(ls "$artifacts" | head -3 | tr '\n' ' ')"
    failed=1
    grep -m1 -E 'panicked|ERROR: libFuzzer' -A3 "$out" >&2 || tail -20 "$out" >&2
  fi
  printf '%-32s %8s s %12s execs %8s edges %6s new inputs  %s\n' \
    "$target" "$seconds" "${execs:-?}" "${cov:-?}" "${units:-?}" "$verdict"
}

mode=${1:-}
[[ -n $mode ]] || usage
shift
work=${FUZZ_WORK:-$(mktemp -d)}
mkdir -p "$work/tmp"
case $mode in
  --list)
    printf '%s\n' "${TARGETS[@]}"
    ;;
  --brief)
    seconds=${BRIEF_SECONDS:-10}
    bins=$(build protocol fuzz-ci)
    for t in "${TARGETS[@]}"; do
      [[ $t == protocol/* ]] && fuzz "$bins" "$t" "$seconds"
    done
    ;;
  --seconds)
    seconds=${1:?--seconds N}
    shift
    want=("$@")
    ((${#want[@]})) || want=("${TARGETS[@]}")
    declare -A bins=()
    for t in "${want[@]}"; do
      [[ $t == */* ]] || t=$(printf '%s\n' "${TARGETS[@]}" | grep -m1 "/$t\$") || { echo "unknown target" >&2; exit 2; }
      crate=${t%%/*}
      [[ -n ${bins[$crate]:-} ]] || bins[$crate]=$(build "$crate" release)
      fuzz "${bins[$crate]}" "$t" "$seconds"
    done
    log "new inputs in $work (merge them with run.sh --cmin $work)"
    ;;
  --cmin)
    from=${1:?--cmin DIR}
    declare -A bins=()
    for t in "${TARGETS[@]}"; do
      crate=${t%%/*} name=${t#*/}
      for src in "$from/$name" "$from/$crate/$name"; do
        [[ -d $src ]] || continue
        [[ -n ${bins[$crate]:-} ]] || bins[$crate]=$(build "$crate" release)
        corpus="$root/${CRATE_DIR[$crate]}/corpus/$name"
        mkdir -p "$corpus" "$work/merged/$name"
        # Merge the committed corpus and the new inputs into an empty
        # directory, then replace the corpus with it: cmin.
        FUZZ_TMPDIR="$work/tmp" "${bins[$crate]}/$name" -merge=1 -timeout=20 -rss_limit_mb=2048 \
          "$work/merged/$name" "$corpus" "$src" >"$work/$name.merge.log" 2>&1 \
          || { tail -20 "$work/$name.merge.log" >&2; exit 1; }
        rm -rf "$corpus"
        mv "$work/merged/$name" "$corpus"
        log "$t: $(ls "$corpus" | wc -l) inputs, $(du -sk "$corpus" | cut -f1) KiB"
      done
    done
    ;;
  *) usage ;;
esac
exit "$failed"
