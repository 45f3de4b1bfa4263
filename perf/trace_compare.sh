#!/usr/bin/env bash
# Scheduling quality on the real traces (issue [3/6]): replays Mooncake and/or RAGPulse through
# warmpath with two `warmpath sim` engines behind it, for several router configurations and
# load levels, each run on fresh engines and a fresh router, and writes one bench JSON per run.
# perf/trace_summary.py turns the JSONs into the tables of perf/RESULTS.md.
#
# Load. The engines run at SIM_SCALE simulated seconds per real second (default 8). LOAD is the
# offered load as a fraction of the two engines' capacity, where capacity is their prefill
# throughput when every step is a full chunk: 2 x 8,192 tokens per (6 ms + 8,192 x 32 us) =
# 61,100 prompt tokens per simulated second (profile h100-8b; docs/sim.md). A trace is replayed
# at LOAD x CAPACITY_RATIO trace seconds per simulated second, where CAPACITY_RATIO is the trace
# rate at which its average offered prompt tokens equal that capacity (cache hits not counted):
#   Mooncake: 3,993 requests, 61.2 M prompt tokens over 1,022 s = 59,900 tokens/s: ratio 1.02
#   RAGPulse: 7,106 requests over 604,603 s, mean 2,944 prompt and 283 output tokens; prefill
#             alone would allow a ratio of 1,770, decoding (283 steps a request, 50 us per
#             sequence plus its share of the 6 ms step) takes roughly an eighth more: ratio
#             1,540 (an estimate).
# Both traces are uneven: Mooncake's prompts grow through the trace (its last eighth offers
# 2.2x the tokens of its second), RAGPulse has a day-night cycle (its busiest hour 3.5x the
# mean), so at an average LOAD of 0.85 parts of each run are overloaded. The engines'
# utilisation (busy simulated time) is reported per run too, but it is not the load: a step
# with one decoding sequence counts as busy as a full one.
#
# Configurations (CONFIGS, space separated, any of):
#   fifo-li     queue.strategy = fifo,          routing = least-inflight
#   fifo-sa     queue.strategy = fifo,          routing = session-affinity
#   boost-li    queue.strategy = session-boost, routing = least-inflight
#   boost-sa    queue.strategy = session-boost, routing = session-affinity
#   boost-pc    queue.strategy = session-boost, routing = prefix-cost (S16)
#   fifo-pc     queue.strategy = fifo,          routing = prefix-cost
#   kthena      session-boost + session-affinity with kthena's defaults:
#               inflight_per_backend = 16, prefill_tokens_per_backend = 0
# Everything else is warmpath's defaults, but metrics_interval = 100ms (real time: 0.8 s of
# simulated time at SIM_SCALE 8, near the 1 s default) and one shard.
#
# Usage: perf/trace_compare.sh OUT_DIR        (build first: cargo build --release)
# Environment (defaults): TRACES="mooncake ragpulse" CONFIGS="fifo-li fifo-sa boost-li boost-sa
#   kthena" LOADS="0.70 0.85 0.95" SIM_SCALE=8 MOONCAKE_WINDOW=1030 (trace seconds
#   replayed: the whole trace)
#   RAGPULSE_WINDOW=604800 (trace seconds: the whole week) MOONCAKE_RATIO=1.02
#   RAGPULSE_RATIO=1540 (the capacity ratios above)
#   WARMPATH=target/release/warmpath BASE_PORT=18300 SET="" (extra --set KEY=VALUE for the
#   router, space separated) ROUNDS=1.
# Everything listens on 127.0.0.1; every process started is stopped on exit. Progress on
# stderr; a line per run on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:?usage: perf/trace_compare.sh OUT_DIR}
TRACES=${TRACES:-mooncake ragpulse}
CONFIGS=${CONFIGS:-fifo-li fifo-sa boost-li boost-sa kthena}
LOADS=${LOADS:-0.70 0.85 0.95}
SIM_SCALE=${SIM_SCALE:-8}
MOONCAKE_WINDOW=${MOONCAKE_WINDOW:-1030}
RAGPULSE_WINDOW=${RAGPULSE_WINDOW:-604800}
MOONCAKE_RATIO=${MOONCAKE_RATIO:-1.02}
RAGPULSE_RATIO=${RAGPULSE_RATIO:-1540}
WARMPATH=${WARMPATH:-target/release/warmpath}
BASE_PORT=${BASE_PORT:-18300}
SET=${SET:-}
ROUNDS=${ROUNDS:-1}

# shellcheck source=perf/lib.sh
. perf/lib.sh
[[ -x $WARMPATH ]] || { log "no $WARMPATH: run cargo build --release"; exit 1; }
mkdir -p "$OUT"
TMP=$(mktemp -d)
cleanup() {
  stop_all
  rm -rf "$TMP"
}
trap cleanup EXIT
# A copy, so that a rebuild during the runs does not change the binary under test.
cp "$WARMPATH" "$TMP/warmpath"
WARMPATH=$TMP/warmpath

SIM1=$((BASE_PORT + 1)) SIM2=$((BASE_PORT + 2)) ROUTER=$((BASE_PORT + 10)) ADMIN=$((BASE_PORT + 11))

router_config() { # $1 = configuration name (perf/lib.sh has the configurations)
  warmpath_config "$1" "$ROUTER" "$ADMIN" "$SIM1" "$SIM2"
}

one_run() { # $1 trace, $2 config, $3 load, $4 round
  local trace=$1 config=$2 load=$3 round=$4
  local label="$trace-$config-L${load//./}-r$round"
  start_sims "$SIM1" "$SIM2" "$TMP"
  router_config "$config" >"$TMP/router.toml"
  local sets=()
  for kv in $SET; do sets+=(--set "$kv"); done
  start_bg "$TMP/router.log" "$WARMPATH" serve --config "$TMP/router.toml" "${sets[@]}"
  wait_http "http://127.0.0.1:$ROUTER/healthz"
  sleep 0.3 # a first scrape
  replay_trace "$ROUTER" "$trace" "$load" "$label" "$SIM1" "$SIM2"
  curl -fsS "http://127.0.0.1:$ADMIN/metrics" >"$OUT/$label.router-metrics.txt" 2>/dev/null || true
  save_sim_metrics "$label" "$SIM1" "$SIM2"
  stop_all
}

for round in $(seq 1 "$ROUNDS"); do
  for trace in $TRACES; do
    for load in $LOADS; do
      for config in $CONFIGS; do
        one_run "$trace" "$config" "$load" "$round"
      done
    done
  done
done
log "done: $OUT"
