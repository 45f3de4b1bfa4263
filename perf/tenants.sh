#!/usr/bin/env bash
# Issue [11]'s tenant targets in a real replay: two `warmpath sim` engines behind warmpath with
# two tenants, each tenant's load a `warmpath bench --api-key` of its own, run side by side.
#
#   perf/tenants.sh OUT_DIR
#
# Three runs, each with fresh engines and a fresh router (same seeds):
#   solo      the light tenant alone (multiturn at LIGHT_RATE new sessions per second);
#   neighbour the same light workload beside a heavy tenant at HEAVY_X times its rate, weights 1:1;
#   split     two tenants of weights 3:1 both sending SPLIT_RATE sessions per second (both
#             saturating); the router's warmpath_tenant_tokens_total{kind="prompt"} scraped
#             every WINDOW seconds gives each window's settled prompt tokens per tenant.
# Printed: the light tenant's TTFT p50 solo and beside the neighbour (the target: at most
# +10 %), and each window's prompt-token ratio of the 3:1 pair (the target: within 5 % of 3).
#
# Environment: WARMPATH (default target/release/warmpath), SIM_SCALE (8), PROFILE (h100-8b),
# DURATION (30s of session arrivals), LIGHT_RATE (0.2), HEAVY_X (100), SPLIT_RATE (4),
# WINDOW (10), BASE_PORT (19400), RUNS ("neighbour split": which of the two to run).
set -euo pipefail
cd "$(dirname "$0")/.."
source perf/lib.sh

OUT=${1:?usage: perf/tenants.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WARMPATH=${WARMPATH:-target/release/warmpath}
[[ -x $WARMPATH ]] || die "no warmpath binary at $WARMPATH (cargo build --release)"
SIM_SCALE=${SIM_SCALE:-8}
PROFILE=${PROFILE:-h100-8b}
DURATION=${DURATION:-30s}
LIGHT_RATE=${LIGHT_RATE:-0.2}
HEAVY_X=${HEAVY_X:-100}
SPLIT_RATE=${SPLIT_RATE:-4}
WINDOW=${WINDOW:-10}
BASE=${BASE_PORT:-19400}
RUNS=${RUNS:-neighbour split}
SIM1=$BASE SIM2=$((BASE + 1)) FRONT=$((BASE + 2)) ADMIN=$((BASE + 3))
trap stop_all EXIT

key_pair() { # prints "KEY DIGEST"
  local out
  out=$("$WARMPATH" keygen)
  printf '%s %s\n' "$(sed -n 1p <<<"$out")" "$(sed -n 2p <<<"$out" | grep -o '[0-9a-f]\{64\}')"
}
read -r LIGHT_KEY LIGHT_DIGEST < <(key_pair)
read -r HEAVY_KEY HEAVY_DIGEST < <(key_pair)

config() { # LIGHT_WEIGHT HEAVY_WEIGHT
  cat <<EOF
[server]
listen = "127.0.0.1:$FRONT"
admin_listen = "127.0.0.1:$ADMIN"
shards = 1
pin_cores = false

[queue]
timeout = "300s"

[upstream]
metrics_interval = "100ms"

[[tenant]]
name = "light"
api_key_sha256 = ["$LIGHT_DIGEST"]
weight = $1

[[tenant]]
name = "heavy"
api_key_sha256 = ["$HEAVY_DIGEST"]
weight = $2

[[model]]
name = "sim-8b"
engine = "vllm"
backends = ["127.0.0.1:$SIM1", "127.0.0.1:$SIM2"]
EOF
}

start_fleet() { # NAME LIGHT_WEIGHT HEAVY_WEIGHT
  require_free_ports "$SIM1" "$SIM2" "$FRONT" "$ADMIN"
  PROFILE1=$PROFILE PROFILE2=$PROFILE start_sims "$SIM1" "$SIM2" "$OUT/$1"
  config "$2" "$3" >"$OUT/$1/warmpath.toml"
  start_bg "$OUT/$1/warmpath.log" "$WARMPATH" serve --config "$OUT/$1/warmpath.toml"
  wait_http "http://127.0.0.1:$FRONT/readyz"
}

bench() { # DIR LABEL KEY RATE SEED
  "$WARMPATH" bench --target "http://127.0.0.1:$FRONT" --model sim-8b --workload multiturn \
    --rate "$4" --duration "$DURATION" --seed "$5" --api-key "$3" --label "$2" \
    --max-inflight 1024 --no-progress --out "$1" >"$1/$2.out" 2>"$1/$2.err"
}

ttft_p50() { # JSON: all turns' TTFT p50 in ms
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["all"]["ttft_ms"]["p50"])' "$1"
}

run_solo_and_neighbour() {
  mkdir -p "$OUT/solo" "$OUT/neighbour"
  log "solo: the light tenant at $LIGHT_RATE sessions/s"
  start_fleet solo 1 1
  bench "$OUT/solo" light "$LIGHT_KEY" "$LIGHT_RATE" 1
  stop_all
  local heavy
  heavy=$(python3 -c "print($LIGHT_RATE * $HEAVY_X)")
  log "neighbour: the same, beside the heavy tenant at $heavy sessions/s"
  start_fleet neighbour 1 1
  bench "$OUT/neighbour" heavy "$HEAVY_KEY" "$heavy" 2 &
  local heavy_pid=$!
  bench "$OUT/neighbour" light "$LIGHT_KEY" "$LIGHT_RATE" 1
  wait "$heavy_pid" || true
  stop_all
  local solo beside
  solo=$(ttft_p50 "$OUT/solo/light.json")
  beside=$(ttft_p50 "$OUT/neighbour/light.json")
  printf 'light tenant TTFT p50: solo %s ms, beside a %sx neighbour %s ms (%s)\n' "$solo" \
    "$HEAVY_X" "$beside" "$(python3 -c "print(f'{$beside / $solo:.2f}x')")"
}

scrape_tokens() { # FILE: appends "SECONDS light heavy" (settled prompt tokens) every WINDOW s
  while sleep "$WINDOW"; do
    curl -fsS "http://127.0.0.1:$ADMIN/metrics" 2>/dev/null | python3 -c '
import re, sys, time
tokens = {"light": 0.0, "heavy": 0.0}
for line in sys.stdin:
    m = re.match(r"warmpath_tenant_tokens_total\{(.*)\} (\S+)", line)
    if m and "kind=\"prompt\"" in m.group(1):
        for t in tokens:
            if f"tenant=\"{t}\"" in m.group(1):
                tokens[t] += float(m.group(2))
light, heavy = tokens["light"], tokens["heavy"]
print(f"{time.time():.1f} {light:.0f} {heavy:.0f}")' >>"$1" || true
  done
}

run_split() {
  mkdir -p "$OUT/split"
  log "split: weights 3:1, both tenants at $SPLIT_RATE sessions/s"
  start_fleet split 3 1
  scrape_tokens "$OUT/split/tokens.txt" &
  local scraper=$!
  bench "$OUT/split" heavy "$HEAVY_KEY" "$SPLIT_RATE" 2 &
  local other=$!
  bench "$OUT/split" light "$LIGHT_KEY" "$SPLIT_RATE" 1
  wait "$other" || true
  kill "$scraper" 2>/dev/null || true
  stop_all
  echo "windows of ${WINDOW}s, settled prompt tokens (weight 3 : weight 1):"
  python3 - "$OUT/split/tokens.txt" <<'EOF'
import sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
for (t0, a0, b0), (t1, a1, b1) in zip(rows, rows[1:]):
    da, db = a1 - a0, b1 - b0
    ratio = f"{da / db:.2f}" if db else "-"
    print(f"  {t1 - rows[0][0]:6.1f}s  {da:10.0f} {db:10.0f}  {ratio}")
EOF
}

: >"$OUT/summary.txt"
[[ " $RUNS " == *" neighbour "* ]] && run_solo_and_neighbour | tee -a "$OUT/summary.txt"
[[ " $RUNS " == *" split "* ]] && run_split | tee -a "$OUT/summary.txt"
true
