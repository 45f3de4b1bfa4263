#!/usr/bin/env bash
# Open-loop latency at a fixed rate: the latency each proxy adds over the backend at half of
# warmpath's peak rate (issue [12]'s target: added p50 over direct at most 30 us).
#
# What it measures. The static backend of perf/proxy_compare.sh (nginx `return 200`,
# perf/proxy/backend-nginx.conf) stands in for an engine. `warmpath bench --workload
# fixed-rate` sends the small chat request of proxy_compare.sh at RATE requests/s for DURATION
# seconds to it directly (the baseline) and through each proxy, with the same configurations
# as proxy_compare.sh: warmpath with one shard, nginx as a keep-alive reverse proxy with one
# worker, HAProxy with one thread. Rounds are interleaved (each round runs every target once,
# the order rotated by one per round so no target always runs first), ROUNDS times, after a
# WARMUP-second paced run per target that is not recorded.
#
# Why open loop. A closed-loop tool (wrk) sends a connection's next request only when the
# previous answer is back, so its rate depends on the latency it measures, and a stall shows
# as fewer requests instead of slow ones (coordinated omission). The paced generator sends at
# fixed intended times whatever the answers do, over a pool of keep-alive connections (CONNS
# opened before the start, more when all are busy), and measures each request from its
# intended send time (src/bench/fixed_rate.rs). Every target gets the same offered load, so
# latencies compare at equal load. The generator's own lag (intended time to the first write)
# is reported per run: it is in every latency alike and cancels in "added over direct".
#
# The rate. Unless RATE is given, the script first measures warmpath's peak as proxy_compare.sh
# does (wrk -t1, PEAK_CONNS connections, PEAK_DURATION seconds, the small request) and uses
# half of it. That closed-loop peak batches requests per event-loop wake-up; paced requests
# arrive one at a time and cost more each, so warmpath cannot sustain half of it open loop.
# PEAK_MODE=open measures the open-loop peak instead: a bisection (PEAK_STEPS paced runs of
# PEAK_DURATION seconds, between an eighth of the wrk peak and the wrk peak) for the highest
# rate warmpath keeps up with (sends at 98 % of the rate or more, latency p50 under 1 ms: no
# backlog), and uses half of that.
#
# Cores (PIN=1, default, on 2+ cores): the proxy alone on core 0; the generator and the backend
# on the last core (taskset), as in proxy_compare.sh. The generator polls without sleeping when
# sends are less than 2 ms apart, so it takes that core's idle time; it yields whenever it has
# nothing to read, so the backend still runs at once.
#
# Report (markdown on stdout): per target, median [min-max] over the rounds of latency p50,
# p90, p99, p99.9 and max (us, from the intended send time), the achieved send rate, late sends
# (sends that found every connection busy), errors, the generator's send lag, and the proxy's
# CPU per request at that rate (utime+stime of its process over the run / requests); then, per
# proxy, the added p50 and p99 over direct: per round the proxy's figure minus direct's in the
# same round, median [min-max] over the rounds.
#
# Usage: perf/latency_open_loop.sh     (build first: cargo build --release)
# Environment (defaults): ROUNDS=3 DURATION=5 (seconds per run) RATE= (requests/s; empty: half
#   of warmpath's measured peak) CONNS=16 ARRIVALS=constant (or poisson) WARMUP=1 PIN=1
#   PEAK_CONNS=32 PEAK_DURATION=5 PEAK_MODE=wrk (or open) PEAK_STEPS=6 TARGETS="direct warmpath nginx haproxy"
#   WARMPATH=target/release/warmpath (the generator, and the router unless ROUTER is set)
#   ROUTER=$WARMPATH (the warmpath binary measured) SHARDS=1 BASE_PORT=18300 KEEP_TMP=0
#   ROUTER_B=$ROUTER ROUTER_B_ARGS= (a second warmpath target `warmpath-b`, add it to TARGETS:
#   the binary ROUTER_B serving the same configuration with the extra arguments ROUTER_B_ARGS,
#   e.g. "--set server.busy_poll=50us": two builds or two settings side by side in one run)
# Needs wrk, nginx, its echo module (libnginx-mod-http-echo), haproxy, curl and python3;
# installs what is missing with apt-get when run as root. Everything listens on 127.0.0.1
# only; every process it starts is stopped on exit. Defaults take about 2 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
HERE=$REPO/perf/proxy
# shellcheck source=perf/lib.sh
source "$REPO/perf/lib.sh"

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
RATE=${RATE:-}
CONNS=${CONNS:-16}
ARRIVALS=${ARRIVALS:-constant}
WARMUP=${WARMUP:-1}
PIN=${PIN:-1}
PEAK_CONNS=${PEAK_CONNS:-32}
PEAK_DURATION=${PEAK_DURATION:-5}
PEAK_MODE=${PEAK_MODE:-wrk}
PEAK_STEPS=${PEAK_STEPS:-6}
TARGETS=${TARGETS:-direct warmpath nginx haproxy}
WARMPATH=${WARMPATH:-target/release/warmpath}
ROUTER=${ROUTER:-$WARMPATH}
ROUTER_B=${ROUTER_B:-$ROUTER}
ROUTER_B_ARGS=${ROUTER_B_ARGS:-}
SHARDS=${SHARDS:-1}
BASE_PORT=${BASE_PORT:-18300}
KEEP_TMP=${KEEP_TMP:-0}
ECHO_MODULE=/usr/lib/nginx/modules/ngx_http_echo_module.so
CLK_TCK=$(getconf CLK_TCK)

((ROUNDS >= 1)) || die "ROUNDS must be at least 1"
((DURATION >= 1 && DURATION <= 60)) || die "DURATION must be 1..60 seconds (got $DURATION)"
[[ -z $RATE || $RATE =~ ^[0-9]+([.][0-9]+)?$ ]] || die "RATE must be a number of requests/s"
"$WARMPATH" bench --help 2>/dev/null | grep -q fixed-rate ||
  die "$WARMPATH has no 'bench --workload fixed-rate' (cargo build --release first)"

# --- Tools, processes, cores, ports (as perf/proxy_compare.sh) -----------------------------

ensure_tools() {
  local pkgs=()
  command -v wrk >/dev/null || pkgs+=(wrk)
  command -v nginx >/dev/null || pkgs+=(nginx)
  [[ -e $ECHO_MODULE ]] || pkgs+=(libnginx-mod-http-echo)
  command -v haproxy >/dev/null || pkgs+=(haproxy)
  command -v curl >/dev/null || pkgs+=(curl)
  command -v python3 >/dev/null || pkgs+=(python3)
  ((${#pkgs[@]} == 0)) && return
  if ((EUID == 0)) && command -v apt-get >/dev/null; then
    log "installing ${pkgs[*]} (apt-get)"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
  else
    die "missing ${pkgs[*]}; install them (sudo apt-get install -y ${pkgs[*]}) or run as root"
  fi
}
ensure_tools

TMP=$(mktemp -d -t latency_open_loop.XXXXXX)
cleanup() {
  stop_all
  if [[ $KEEP_TMP == 1 ]]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

PIN_PROXY=() PIN_LOAD=()
if [[ $PIN == 1 ]] && (($(nproc) >= 2)); then
  LOAD_CORE=$(($(nproc) - 1))
  PIN_PROXY=(taskset -c 0) PIN_LOAD=(taskset -c "$LOAD_CORE")
  LAYOUT="proxy on core 0; generator and backend on core $LOAD_CORE (taskset)"
else
  LAYOUT="not pinned"
fi

NEXT_PORT=$BASE_PORT
alloc_port() { # VAR: the next free loopback port at or above NEXT_PORT
  while ! port_free "$NEXT_PORT"; do NEXT_PORT=$((NEXT_PORT + 1)); done
  printf -v "$1" '%s' "$NEXT_PORT"
  NEXT_PORT=$((NEXT_PORT + 1))
}
alloc_port BACKEND_PORT
alloc_port NGINX_PORT
alloc_port HAPROXY_PORT
alloc_port WARMPATH_PORT
alloc_port WARMPATH_ADMIN_PORT
alloc_port WARMPATH_B_PORT
alloc_port WARMPATH_B_ADMIN_PORT

render() { # TEMPLATE OUT DIR PORT [ADMIN_PORT]: fill in the @VARS@ of a template in perf/proxy
  sed -e "s|@DIR@|$3|g" -e "s|@PORT@|$4|g" -e "s|@BACKEND_PORT@|$BACKEND_PORT|g" \
    -e "s|@ADMIN_PORT@|${5:-$WARMPATH_ADMIN_PORT}|g" -e "s|@ECHO_MODULE@|$ECHO_MODULE|g" \
    -e "s|@SHARDS@|$SHARDS|g" -e '/The tls scenario/d' -e '/@TLS_PORT@/d' -e '/@TLS_DIR@/d' \
    "$HERE/$1" >"$2" # no TLS listener here (proxy_compare.sh's tls scenario has one)
}
mkdir -p "$TMP/backend" "$TMP/nginx" "$TMP/haproxy" "$TMP/warmpath" "$TMP/warmpath-b" "$TMP/out"
render backend-nginx.conf "$TMP/backend/nginx.conf" "$TMP/backend" "$BACKEND_PORT"
render proxy-nginx.conf "$TMP/nginx/nginx.conf" "$TMP/nginx" "$NGINX_PORT"
render haproxy.cfg "$TMP/haproxy/haproxy.cfg" "$TMP/haproxy" "$HAPROXY_PORT"
render warmpath.toml "$TMP/warmpath/warmpath.toml" "$TMP/warmpath" "$WARMPATH_PORT"
render warmpath.toml "$TMP/warmpath-b/warmpath.toml" "$TMP/warmpath-b" "$WARMPATH_B_PORT" \
  "$WARMPATH_B_ADMIN_PORT"
: >"$TMP/backend/sse.conf" # the backend's stream location is not used here
# The small request, byte for byte proxy_compare.sh's (and `bench --body small --model bench-model`).
SMALL_BODY='{"model":"bench-model","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}'
printf '%s' "$SMALL_BODY" >"$TMP/small.json"

# --- Start the backend and the proxies ------------------------------------------------------

declare -A PORT PID
start() { # NAME READY_PATH PIN... -- COMMAND...: start in the background, wait until ready
  local name=$1 ready=$2 pin=()
  shift 2
  while [[ $1 != -- ]]; do pin+=("$1"); shift; done
  shift
  start_bg "$TMP/$name.log" "${pin[@]}" "$@"
  PID[$name]=$LAST_PID
  if ! wait_http "http://127.0.0.1:${PORT[$name]}$ready" 100; then
    tail -n 20 "$TMP/$name.log" >&2
    return 1
  fi
}
PORT[backend]=$BACKEND_PORT PORT[direct]=$BACKEND_PORT PORT[nginx]=$NGINX_PORT
PORT[haproxy]=$HAPROXY_PORT PORT[warmpath]=$WARMPATH_PORT PORT[warmpath-b]=$WARMPATH_B_PORT
start backend /health "${PIN_LOAD[@]}" -- \
  nginx -p "$TMP/backend" -c "$TMP/backend/nginx.conf" -e "$TMP/backend/error.log" ||
  die "the backend did not start"
PID[direct]=${PID[backend]} # the direct row reports the backend's own CPU
active=()
for target in $TARGETS; do
  case $target in
    direct) ;;
    nginx) start nginx /health "${PIN_PROXY[@]}" -- \
      nginx -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -e "$TMP/nginx/error.log" ||
      die "the nginx proxy did not start" ;;
    haproxy) start haproxy /health "${PIN_PROXY[@]}" -- haproxy -db -f "$TMP/haproxy/haproxy.cfg" ||
      die "haproxy did not start" ;;
    warmpath) start warmpath /readyz "${PIN_PROXY[@]}" -- \
      "$ROUTER" serve --config "$TMP/warmpath/warmpath.toml" || die "warmpath did not start" ;;
    warmpath-b)
      read -ra b_args <<<"$ROUTER_B_ARGS"
      start warmpath-b /readyz "${PIN_PROXY[@]}" -- "$ROUTER_B" serve \
        --config "$TMP/warmpath-b/warmpath.toml" "${b_args[@]}" || die "warmpath-b did not start" ;;
    *) die "unknown target $target" ;;
  esac
  active+=("$target")
done

# Pre-flight: every target answers the small request with 200 and exactly the backend's body.
curl -sS -o "$TMP/expected" --data-binary @"$TMP/small.json" -H 'Content-Type: application/json' \
  "http://127.0.0.1:$BACKEND_PORT/v1/chat/completions"
for target in "${active[@]}"; do
  code=$(curl -sS -o "$TMP/got" -w '%{http_code}' --max-time 5 --data-binary @"$TMP/small.json" \
    -H 'Content-Type: application/json' -H 'Expect:' \
    "http://127.0.0.1:${PORT[$target]}/v1/chat/completions" || true)
  [[ $code == 200 ]] && cmp -s "$TMP/expected" "$TMP/got" ||
    die "$target answered the pre-flight request with $code and $(stat -c %s "$TMP/got") bytes"
done

# --- Runs -------------------------------------------------------------------------------------

proc_ticks() { # PID...: utime+stime (clock ticks) of the processes and their children
  local pid stat fields total=0 kids
  kids=$(pgrep -P "$(IFS=,; echo "$*")" || true)
  for pid in "$@" $kids; do
    stat=$(<"/proc/$pid/stat") || continue
    read -ra fields <<<"${stat##*) }"
    total=$((total + fields[11] + fields[12]))
  done
  echo "$total"
}

paced() { # TARGET LABEL SECONDS: one paced run; its JSON is $TMP/out/LABEL.json
  "${PIN_LOAD[@]}" "$WARMPATH" bench --workload fixed-rate --arrivals "$ARRIVALS" \
    --target "http://127.0.0.1:${PORT[$1]}" --model bench-model --rate "$RATE" \
    --duration "${3}s" --connections "$CONNS" --label "$2" --out "$TMP/out" --no-progress \
    >"$TMP/run.out" 2>"$TMP/run.err" || die "bench against $1 failed: $(cat "$TMP/run.err")"
}

# --- The rate ------------------------------------------------------------------------------

PEAK=""
if [[ -z $RATE ]]; then
  [[ -n ${PID[warmpath]:-} ]] || die "no RATE given and warmpath is not a target to measure it on"
  log "warmpath's peak: wrk -t1 -c$PEAK_CONNS -d${PEAK_DURATION}s"
  out=$(BODY_FILE=$TMP/small.json "${PIN_LOAD[@]}" wrk -t1 -c"$PEAK_CONNS" -d"${PEAK_DURATION}s" \
    --timeout 2s -s "$HERE/post.lua" "http://127.0.0.1:$WARMPATH_PORT/v1/chat/completions" 2>&1) ||
    die "wrk failed: $out"
  line=$(grep '^RESULT' <<<"$out") || die "wrk gave no result: $out"
  PEAK=$(sed -E 's/.*requests=([0-9]+) duration_us=([0-9]+).*/\1 \2/' <<<"$line" |
    awk '{ printf "%.0f", $1 / ($2 / 1e6) }')
  RATE=$((PEAK / 2))
  log "warmpath's peak: $PEAK req/s; rate: $RATE req/s"
  if [[ $PEAK_MODE == open ]]; then
    WRK_PEAK=$PEAK low=$((PEAK / 8)) high=$PEAK
    for step in $(seq 1 "$PEAK_STEPS"); do
      RATE=$(((low + high) / 2))
      paced warmpath "peak-$step" "$PEAK_DURATION"
      if python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); rate=float(sys.argv[2]); lat=r["latency_us"] or {}
sys.exit(0 if r["sent_per_s"] >= 0.98*rate and (lat.get("p50") or 1e9) < 1000 else 1)' \
        "$TMP/out/peak-$step.json" "$RATE"; then
        low=$RATE verdict="keeps up"
      else
        high=$RATE verdict="falls behind"
      fi
      log "open-loop peak, step $step: $RATE req/s: $verdict"
    done
    PEAK=$low RATE=$((low / 2))
    log "warmpath's open-loop peak: $PEAK req/s (wrk's: $WRK_PEAK); rate: $RATE req/s"
  fi
fi

RESULTS=$TMP/results.tsv
printf 'target\tround\tjson\tticks\n' >"$RESULTS"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
if ((WARMUP > 0)); then
  log "warm-up: ${WARMUP}s at $RATE req/s each: ${active[*]}"
  for target in "${active[@]}"; do paced "$target" "warmup-$target" "$WARMUP"; done
fi
n=${#active[@]}
for round in $(seq 1 "$ROUNDS"); do
  for ((k = 0; k < n; k++)); do
    target=${active[$(((k + round - 1) % n))]}
    t0=$(proc_ticks "${PID[$target]}")
    paced "$target" "$target-r$round" "$DURATION"
    t1=$(proc_ticks "${PID[$target]}")
    log "round $round $target: $(grep -E '^[^ ]+ +latency ' "$TMP/run.out" | sed 's/  */ /g')"
    printf '%s\t%s\t%s\t%s\n' "$target" "$round" "$TMP/out/$target-r$round.json" $((t1 - t0)) >>"$RESULTS"
  done
done
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

# --- Report ---------------------------------------------------------------------------------

commit=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
[[ -z $(git status --porcelain -- src Cargo.toml Cargo.lock 2>/dev/null) ]] ||
  commit="$commit (with uncommitted changes in src/ or Cargo.*)"
cat <<EOF
## latency_open_loop: $(date -u +%Y-%m-%d) at $commit

Machine: nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average $LOAD_START at the start, $LOAD_END at the end.
Tools: $(nginx -v 2>&1 | sed 's/.*: //'), HAProxy $(haproxy -v | awk 'NR==1{print $3}'), $(wrk --version 2>&1 | awk 'NR==1{print $1, $2}'). Cores: $LAYOUT.
Generator: $WARMPATH bench --workload fixed-rate --arrivals $ARRIVALS --rate $RATE --duration ${DURATION}s --connections $CONNS (built $(date -u -r "$WARMPATH" '+%Y-%m-%d %H:%M UTC')).
Rate: $RATE req/s$([[ -n $PEAK && $PEAK_MODE != open ]] && echo ", half of warmpath's peak of $PEAK req/s (wrk -t1 -c$PEAK_CONNS, ${PEAK_DURATION}s)")$([[ -n $PEAK && $PEAK_MODE == open ]] && echo ", half of warmpath's open-loop peak of $PEAK req/s ($PEAK_STEPS paced runs of ${PEAK_DURATION}s bisecting up to wrk's peak of $WRK_PEAK req/s)"). Runs: $ROUNDS rounds x ${DURATION}s per target, interleaved, order rotated per round, after ${WARMUP}s of warm-up each.
EOF
if [[ -n ${PID[warmpath]:-} ]]; then
  echo "warmpath: $ROUTER built $(date -u -r "$ROUTER" '+%Y-%m-%d %H:%M UTC'), sha256 $(sha256sum "$ROUTER" | cut -c1-12); $SHARDS shard(s)."
fi
if [[ -n ${PID[warmpath-b]:-} ]]; then
  echo "warmpath-b: $ROUTER_B built $(date -u -r "$ROUTER_B" '+%Y-%m-%d %H:%M UTC'), sha256 $(sha256sum "$ROUTER_B" | cut -c1-12); arguments: ${ROUTER_B_ARGS:-none}; $SHARDS shard(s)."
fi
echo
python3 - "$RESULTS" "$CLK_TCK" "${active[*]}" <<'PY'
import json, sys

rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1])][1:]
tck, targets = float(sys.argv[2]), sys.argv[3].split()
runs = {}  # target -> round -> figures
for target, rnd, path, ticks in rows:
    r = json.load(open(path))
    lat, lag = r["latency_us"] or {}, r["send_lag_us"] or {}
    runs.setdefault(target, {})[int(rnd)] = {
        "p50": lat.get("p50"), "p90": lat.get("p90"), "p99": lat.get("p99"),
        "p999": lat.get("p999"), "max": lat.get("max"), "rate": r["sent_per_s"],
        "lag50": lag.get("p50"), "lag99": lag.get("p99"), "late": r["late"],
        "errors": sum(r["errors"].values()), "sent": r["sent"], "planned": r["planned"],
        "cpu": int(ticks) / tck * 1e6 / r["ok"] if r["ok"] else None,
    }

def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2

def cell(values, digits=0, signed=False):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    f = ("{:+,.%df}" if signed else "{:,.%df}") % digits
    if len(values) == 1:
        return f.format(values[0])
    return "%s [%s to %s]" % (f.format(median(values)), f.format(min(values)), f.format(max(values)))

print("| target | p50 us | p90 us | p99 us | p99.9 us | max us | sent/s | late sends | errors | send lag p50 / p99 us | CPU us/req |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for t in targets:
    rs = list(runs.get(t, {}).values())
    col = lambda k: [r[k] for r in rs]
    print("| %s | %s | %s | %s | %s | %s | %s | %d | %d | %s / %s | %s%s |" % (
        "direct (baseline)" if t == "direct" else t, cell(col("p50")), cell(col("p90")),
        cell(col("p99")), cell(col("p999")), cell(col("max")), cell(col("rate")),
        sum(col("late")), sum(col("errors")), cell(col("lag50"), 1), cell(col("lag99"), 1),
        "backend " if t == "direct" else "", cell(col("cpu"), 1)))
print()
if "direct" in runs:
    print("Added over direct (per round: the target's figure minus direct's in the same round; median [min to max] over the rounds):")
    print()
    print("| proxy | added p50 us | added p99 us |")
    print("|---|---|---|")
    d = runs["direct"]
    for t in targets:
        if t == "direct":
            continue
        add = lambda k: [r[k] - d[n][k] for n, r in runs[t].items()
                         if n in d and r[k] is not None and d[n][k] is not None]
        note = " (target <= 30 us)" if t == "warmpath" else ""
        print("| %s | %s%s | %s |" % (t, cell(add("p50"), 1, True), note, cell(add("p99"), 1, True)))
short = [t for t in targets for r in runs.get(t, {}).values() if r["sent"] < r["planned"]]
if short:
    print()
    print("Runs that sent fewer requests than planned (connections refused): " + ", ".join(sorted(set(short))))
PY
