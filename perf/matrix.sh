#!/usr/bin/env bash
# The issue [8] matrix: {Mooncake, RAGPulse} x {h100-8b, h100x4-70b, l4-3b} x {0.70, 0.85, 0.95},
# and in each cell warmpath with no queue or routing key set (wp-auto) against fifo +
# least-inflight (fifo-li: warmpath's defaults but for strategy and routing), against the best
# static configuration of the pre-[8] knobs for that cell (perf/static_sweep.py finds it in
# virtual time; STATIC names the file, one line per cell), and against sglang-router
# cache_aware; then a mixed fleet (one h100-8b and one l4-3b engine) and two wp-auto replicas
# behind HAProxy. Every run is perf/peer_compare.sh's (fresh engines and a fresh target, the
# bench's JSON per run; read its header for the targets and the safety rules for
# sglang-router), with LOAD_MODE=profile: a whole trace at LOAD of the two engines' capacity
# by their profiles (src/bench/load.rs).
#
# The engines' --time-scale per profile keeps a run within a few minutes (h100-8b 8,
# h100x4-70b 24, l4-3b 32: their steps take about the same real time). Every warmpath target
# has queue.timeout = 300 s (perf/lib.sh), as the bench's own request timeout: a deadline, not
# a scheduling knob, so that nothing is dropped that a peer would have served late.
#
# Usage: perf/matrix.sh OUT_DIR      (cargo build --release; cargo build --release --example
#        fleet && python3 perf/static_sweep.py > perf/matrix-static.txt first)
# Environment (defaults): PROFILES="h100-8b h100x4-70b l4-3b" TRACES="mooncake ragpulse"
#   LOADS="0.70 0.85 0.95" ROUNDS_85=3 STATIC=perf/matrix-static.txt PARTS="cells mixed replicas"
# perf/matrix_summary.py OUT_DIR prints the tables of perf/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: perf/matrix.sh OUT_DIR}
PROFILES=${PROFILES:-h100-8b h100x4-70b l4-3b}
TRACES=${TRACES:-mooncake ragpulse}
LOADS=${LOADS:-0.70 0.85 0.95}
ROUNDS_85=${ROUNDS_85:-3}
STATIC=${STATIC:-perf/matrix-static.txt}
PARTS=${PARTS:-cells mixed replicas}
[[ -f $STATIC ]] || { echo "no $STATIC: run perf/static_sweep.py" >&2; exit 1; }
# One copy of the binary for the whole matrix, so that a rebuild meanwhile changes nothing.
mkdir -p "$OUT"
BIN=$(mktemp -d)/warmpath
cp "${WARMPATH:-target/release/warmpath}" "$BIN"
export WARMPATH=$BIN
echo "matrix: commit $(git rev-parse --short HEAD), started $(date -u '+%Y-%m-%d %H:%M UTC')" >>"$OUT/MATRIX-INFO.txt"

scale_of() {
  case $1 in h100-8b) echo 8 ;; h100x4-70b) echo 24 ;; l4-3b) echo 32 ;; *) echo 8 ;; esac
}

run() { # DIR PROFILE1 PROFILE2 SCALE TRACE LOAD ROUNDS TARGETS...
  local dir=$1 p1=$2 p2=$3 scale=$4 trace=$5 load=$6 rounds=$7
  shift 7
  mkdir -p "$dir"
  PROFILE1=$p1 PROFILE2=$p2 SIM_SCALE=$scale LOAD_MODE=profile TRACES=$trace LOADS=$load \
    ROUNDS=$rounds TARGETS="$*" perf/peer_compare.sh "$dir"
}

if [[ " $PARTS " == *" cells "* ]]; then
  for profile in $PROFILES; do
    scale=$(scale_of "$profile")
    for trace in $TRACES; do
      for load in $LOADS; do
        static=$(awk -v t="$trace" -v p="$profile" -v l="$load" \
          '$1 == t && $2 == p && $3 + 0 == l + 0 { print $4 }' "$STATIC")
        [[ -n $static ]] || { echo "no static configuration for $trace $profile $load" >&2; exit 1; }
        rounds=1
        [[ $load == 0.85 ]] && rounds=$ROUNDS_85
        run "$OUT/$profile" "$profile" "$profile" "$scale" "$trace" "$load" "$rounds" \
          wp-auto fifo-li "$static" sgl-cache_aware
      done
    done
  done
fi
if [[ " $PARTS " == *" mixed "* ]]; then
  # One fast and one slow engine: the targets the issue names (least-inflight, cache_aware).
  for trace in $TRACES; do
    run "$OUT/mixed" h100-8b l4-3b 8 "$trace" 0.85 1 wp-auto fifo-li sgl-cache_aware
  done
fi
if [[ " $PARTS " == *" replicas "* ]]; then
  run "$OUT/replicas" h100-8b h100-8b 8 mooncake 0.85 1 wp-auto wp-auto-x2
fi
