#!/usr/bin/env bash
# warmpath side by side with the peers (issue [6/6]): replays Mooncake and/or RAGPulse through
# each target in front of the same two `warmpath sim` engines, fresh engines and a fresh target
# per run, targets interleaved within each load, one `warmpath bench` JSON per run.
# perf/peer_summary.py turns the JSONs into the table (and plot) of perf/RESULTS.md.
#
# Load, engines, bench flags and windows are those of perf/trace_compare.sh (read its header):
# LOAD is the offered load as a fraction of the two engines' prefill capacity, a trace is
# replayed at SIM_SCALE x LOAD x RATIO trace seconds per real second (Mooncake ratio 1.02,
# RAGPulse 1,540), the engines run at SIM_SCALE = 8.
#
# Targets (TARGETS, space separated, any of):
#   fifo-li          warmpath, queue.strategy = fifo, routing = least-inflight
#   boost-sa         warmpath, session-boost + session-affinity (the defaults)
#   boost-pc         warmpath, session-boost + prefix-cost (S16)
#   fifo-sa, boost-li, kthena   the other configurations of perf/trace_compare.sh
#   sgl-cache_aware  sglang-router (python -m sglang_router.launch_router), --policy cache_aware
#   sgl-round_robin  sglang-router, --policy round_robin
#   haproxy          HAProxy: balance hdr(X-Session-ID), hash-type consistent, maxconn
#                    HAPROXY_MAXCONN per server (a queue in HAProxy beyond it), health checks
#   wp-x2            scale-out: HAProxy hashing on X-Session-ID (no maxconn) in front of two
#                    warmpath boost-sa replicas, each in front of both engines
#   wp-x2-split      wp-x2 with prefill_tokens_per_backend = 8192 per replica, so that the two
#                    replicas together allow the engines the prefill backlog one replica allows
#   wp-auto          warmpath with no queue or routing key set (issue [8]: what it learns)
#   wp-auto-x2       two wp-auto replicas behind HAProxy hashing on X-Session-ID
#   NAME-anon        any warmpath target above, replayed with `bench --anonymous`: no session
#                    header, so sessions are only what the router derives (issue [10])
#   st-pc-N, st-sa-N a static configuration: session-boost, prefix-cost (pc) or
#                    session-affinity (sa), prefill_tokens_per_backend = N, prefix index 8,192
# TRACES may also name `chat`, `agent` or `classify`, the fleet lab's synthetic workloads (chat:
# short prompts, long answers; agent: a long system prompt every session shares, quick short
# steps; classify: one-shot requests of a few hundred tokens, answers of 5 tokens;
# perf/lib.sh's replay_trace), always paced by profile as LOAD_MODE=profile paces.
# PROFILE1, PROFILE2 (default h100-8b): the engines' `warmpath sim --profile`. LOAD_MODE=profile
# replays the whole trace at LOAD of the two engines' capacity by their profiles
# (`warmpath bench --load`, src/bench/load.rs) instead of the ratios below.
# Warmpath targets are configured as in perf/trace_compare.sh (one shard, metrics_interval
# 100ms, queue timeout 300 s).
#
# sglang-router runs with its defaults except: --host 127.0.0.1, --prometheus-host 127.0.0.1
# and a free --prometheus-port (it must stay on loopback), --request-timeout-secs 300 (the
# bench's own timeout), --shutdown-grace-period-secs 1, --log-level info, and the environment
# HF_HUB_OFFLINE=1 HF_ENDPOINT=http://127.0.0.1:9 (no tokenizer download: the engines answer
# 404 to /get_model_info, /model_info, /get_server_info and /server_info, pinned by
# tests/sim.rs). Safety: it runs under `strace --seccomp-bpf -f -e trace=connect` (only connect
# calls stop, so the cost is per new connection, and it reuses pooled ones); a watcher checks
# every second, and again after each run, that every address it connected to is loopback (or a
# Unix socket), that its log names no other host, and that it listens on 127.0.0.1 only. On any
# violation it is killed at once and this script exits 3 without running anything further.
#
# HAPROXY_MAXCONN (default 128). HAProxy cannot see prefill from decode: a connection is one
# request until its last token. By Little's law, on Mooncake at LOAD 0.85 each engine gets
# 3,993 / 1,022 s x 0.85 x 1.02 / 2 = 1.7 requests per simulated second, and a request holds its
# connection for its prefill plus ~150 decode steps, which take ~0.27 s each while a prefill
# chunk shares the step: ~40 s, so ~70 requests per engine in flight on average. 128 is about
# twice that: it binds in the trace's bursts (its last eighth offers 2.2x the mean) and queues
# in HAProxy there, without throttling decoding the rest of the time; 16 (kthena's cap) or 64
# would throttle decoding like kthena's flat cap does (SPEC S6). Try others with
# HAPROXY_MAXCONN=64 / 256 and a different label suffix (LABEL_SUFFIX).
#
# Usage: perf/peer_compare.sh OUT_DIR          (build first: cargo build --release)
# Environment (defaults): TRACES="mooncake ragpulse" LOADS="0.70 0.85 0.95"
#   TARGETS="fifo-li boost-sa sgl-cache_aware sgl-round_robin haproxy" SIM_SCALE=8
#   MOONCAKE_WINDOW=1030 RAGPULSE_WINDOW=604800 MOONCAKE_RATIO=1.02 RAGPULSE_RATIO=1540
#   HAPROXY_MAXCONN=128 SGLANG_VENV=/work/venv-sglang (created with sglang-router when missing)
#   WARMPATH=target/release/warmpath BASE_PORT=19100 (uses BASE_PORT+1 .. +21) ROUNDS=1
#   WARMPATH_ROUTER=$WARMPATH (the build the warmpath routers run: compare two builds of the
#   router under the same bench and engines)
#   LABEL_SUFFIX="" (appended to each run's label); BENCH_EXTRA="" (more `warmpath bench`
#   flags for every run, e.g. --no-stream)
# Needs haproxy, strace, curl (apt-get installs them when run as root) and python3.
#
# Full runs (the lead, on a quiet machine; about 55 and 25 minutes):
#   perf/peer_compare.sh perf/out/peers && /work/venv-sglang/bin/python perf/peer_summary.py perf/out/peers
#   TRACES=mooncake LOADS=0.85 TARGETS="boost-sa wp-x2 wp-x2-split" \
#     perf/peer_compare.sh perf/out/scale && /work/venv-sglang/bin/python perf/peer_summary.py perf/out/scale
# (any python3 prints the tables; the plot needs matplotlib, which the venv has)
# A short check (the first 90 trace seconds of Mooncake, one load; about 2 minutes):
#   MOONCAKE_WINDOW=90 TRACES=mooncake LOADS=0.85 perf/peer_compare.sh /tmp/peers-short
#
# Everything listens on 127.0.0.1; every process started is stopped on exit. Progress on
# stderr; a line per run on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=perf/lib.sh
. perf/lib.sh

OUT=${1:?usage: perf/peer_compare.sh OUT_DIR}
TRACES=${TRACES:-mooncake ragpulse}
LOADS=${LOADS:-0.70 0.85 0.95}
TARGETS=${TARGETS:-fifo-li boost-sa sgl-cache_aware sgl-round_robin haproxy}
SIM_SCALE=${SIM_SCALE:-8}
MOONCAKE_WINDOW=${MOONCAKE_WINDOW:-1030}
RAGPULSE_WINDOW=${RAGPULSE_WINDOW:-604800}
MOONCAKE_RATIO=${MOONCAKE_RATIO:-1.02}
RAGPULSE_RATIO=${RAGPULSE_RATIO:-1540}
HAPROXY_MAXCONN=${HAPROXY_MAXCONN:-128}
SGLANG_VENV=${SGLANG_VENV:-/work/venv-sglang}
WARMPATH=${WARMPATH:-target/release/warmpath}
BASE_PORT=${BASE_PORT:-19100}
ROUNDS=${ROUNDS:-1}
LABEL_SUFFIX=${LABEL_SUFFIX:-}

[[ -x $WARMPATH ]] || die "no $WARMPATH: run cargo build --release"
needs_sglang=0 needs_haproxy=0
for t in $TARGETS; do
  case $t in
    sgl-*) needs_sglang=1 ;;
    haproxy | wp-x2* | wp-auto-x2) needs_haproxy=1 ;;
  esac
done

ensure_tools() {
  local pkgs=()
  command -v curl >/dev/null || pkgs+=(curl)
  ((needs_haproxy)) && ! command -v haproxy >/dev/null && pkgs+=(haproxy)
  ((needs_sglang)) && ! command -v strace >/dev/null && pkgs+=(strace)
  ((${#pkgs[@]} == 0)) && return
  ((EUID == 0)) || die "missing ${pkgs[*]}: install them (apt-get install -y ${pkgs[*]})"
  log "installing ${pkgs[*]} (apt-get)"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
}
ensure_tools
if ((needs_sglang)) && ! "$SGLANG_VENV/bin/python" -c 'import sglang_router' 2>/dev/null; then
  log "creating $SGLANG_VENV with sglang-router (pip)"
  python3 -m venv "$SGLANG_VENV"
  "$SGLANG_VENV/bin/pip" install -q sglang-router
fi
SGLANG_VERSION=$( ((needs_sglang)) && "$SGLANG_VENV/bin/pip" show sglang-router 2>/dev/null | awk '/^Version/{print $2}' || echo -)

mkdir -p "$OUT"
TMP=$(mktemp -d -t peer_compare.XXXXXX)
cleanup() { stop_all; rm -rf "$TMP"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
# A copy, so that a rebuild during the runs does not change the binary under test.
cp "$WARMPATH" "$TMP/warmpath"
cp "${WARMPATH_ROUTER:-$WARMPATH}" "$TMP/warmpath-router"
WARMPATH=$TMP/warmpath
WARMPATH_ROUTER=$TMP/warmpath-router

SIM1=$((BASE_PORT + 1)) SIM2=$((BASE_PORT + 2))
FRONT=$((BASE_PORT + 10)) ADMIN=$((BASE_PORT + 11)) # what the bench targets; warmpath's admin
REP2=$((BASE_PORT + 12)) ADMIN2=$((BASE_PORT + 13)) # wp-x2: the replicas
REP1=$((BASE_PORT + 14)) ADMIN1=$((BASE_PORT + 15))
PROM=$((BASE_PORT + 21))                            # sglang-router's prometheus listener

# --- sglang-router, on loopback only --------------------------------------------------------------

# Prints the reasons an sglang-router run is unsafe (nothing when it is safe): non-loopback
# connect() calls in the strace log, hosts other than loopback named in its log, listeners on
# anything but 127.0.0.1.
sglang_violations() { # STRACE_LOG ROUTER_LOG PID
  python3 - "$1" "$2" <<'EOF'
import re, sys
strace_log, router_log = sys.argv[1], sys.argv[2]
loop4 = re.compile(r'^127\.')
loop6 = {"::1", "::ffff:127.0.0.1"}
try:
    for line in open(strace_log, errors="replace"):
        if "connect(" not in line:
            continue
        fam = re.search(r'sa_family=(AF_[A-Z0-9]+)', line)
        fam = fam.group(1) if fam else "?"
        if fam in ("AF_UNIX", "AF_UNSPEC", "AF_NETLINK"):
            continue
        if fam == "AF_INET":
            addr = re.search(r'inet_addr\("([^"]+)"\)', line)
            if addr and loop4.match(addr.group(1)):
                continue
        if fam == "AF_INET6":
            addr = re.search(r'inet_pton\(AF_INET6, "([^"]+)"', line)
            if addr and (addr.group(1) in loop6 or addr.group(1).startswith("::ffff:127.")):
                continue
        print("connect to a non-loopback address: " + line.strip())
except FileNotFoundError:
    pass
try:
    text = re.sub(r'\x1b\[[0-9;]*m', '', open(router_log, errors="replace").read())
except FileNotFoundError:
    text = ""
for url in set(re.findall(r'(?:https?|grpc)://([^/\s"\',:\]]+|\[[^\]]+\])', text)):
    if not (loop4.match(url) or url in ("localhost", "[::1]")):
        print("its log names host " + url)
for word in ("huggingface.co", "hf.co", "hf-mirror"):
    if word in text:
        print("its log mentions " + word)
EOF
  # Listeners: the router's sockets must all be on 127.0.0.1.
  ss -Htlnp 2>/dev/null | grep "pid=$3," | awk '{print $4}' | grep -v '^127\.0\.0\.1:' |
    sed 's/^/it listens on /' || true
}

SGL_PID=""
start_sglang() { # POLICY: start sglang-router on FRONT in front of the engines, wait until ready
  local policy=$1 i healthy
  require_free_ports "$FRONT" "$PROM"
  rm -f "$TMP/unsafe"
  start_bg "$TMP/sglang.out" env HF_HUB_OFFLINE=1 HF_ENDPOINT=http://127.0.0.1:9 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    strace --seccomp-bpf -f -qq -e trace=connect -o "$TMP/sglang.strace" \
    "$SGLANG_VENV/bin/python" -m sglang_router.launch_router \
    --host 127.0.0.1 --port "$FRONT" \
    --prometheus-host 127.0.0.1 --prometheus-port "$PROM" \
    --worker-urls "http://127.0.0.1:$SIM1" "http://127.0.0.1:$SIM2" \
    --policy "$policy" --request-timeout-secs 300 --shutdown-grace-period-secs 1 \
    --log-level info
  local strace_pid=$LAST_PID
  for i in {1..50}; do SGL_PID=$(pgrep -P "$strace_pid" | head -n1 || true); [[ -n $SGL_PID ]] && break; sleep 0.1; done
  [[ -n $SGL_PID ]] || die "sglang-router did not start: $(tail -n 5 "$TMP/sglang.out")"
  # The watcher: lives as long as the router, checks every second.
  (
    trap 'exit 0' TERM
    while kill -0 "$SGL_PID" 2>/dev/null; do
      v=$(sglang_violations "$TMP/sglang.strace" "$TMP/sglang.out" "$SGL_PID")
      if [[ -n $v ]]; then
        printf '%s\n' "$v" >"$TMP/unsafe"
        kill -KILL "$SGL_PID" 2>/dev/null
        exit 0
      fi
      sleep 1 &
      wait $!
    done
  ) &
  STARTED+=($!)
  # Ready: both workers registered and healthy in its metrics, and it answers /health.
  for i in {1..200}; do
    check_unsafe
    healthy=$(curl -fsS --max-time 1 "http://127.0.0.1:$PROM/metrics" 2>/dev/null |
      grep -c '^smg_worker_health{.*} 1$' || true)
    if ((healthy == 2)) && curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$FRONT/health"; then
      return 0
    fi
    sleep 0.1
  done
  die "sglang-router not ready after 20 s: $(tail -n 5 "$TMP/sglang.out")"
}

check_unsafe() { # stop everything when sglang-router tried to leave loopback
  local v=""
  [[ -s $TMP/unsafe ]] && v=$(cat "$TMP/unsafe")
  [[ -z $v && -n $SGL_PID ]] && v=$(sglang_violations "$TMP/sglang.strace" "$TMP/sglang.out" "$SGL_PID")
  if [[ -n $v ]]; then
    [[ -n $SGL_PID ]] && kill -KILL "$SGL_PID" 2>/dev/null
    cp "$TMP/sglang.out" "$OUT/UNSAFE-sglang.log" 2>/dev/null || true
    cp "$TMP/sglang.strace" "$OUT/UNSAFE-sglang.strace" 2>/dev/null || true
    log "STOPPED: sglang-router tried to leave loopback:"
    printf '%s\n' "$v" >&2
    exit 3
  fi
}

# --- The other targets ----------------------------------------------------------------------------

start_warmpath() { # CONFIG LISTEN ADMIN LOGNAME [EXTRA_QUEUE]: a warmpath replica
  require_free_ports "$2" "$3"
  EXTRA_QUEUE=${5:-} warmpath_config "$1" "$2" "$3" "$SIM1" "$SIM2" >"$TMP/$4.toml"
  start_bg "$TMP/$4.log" "$WARMPATH_ROUTER" serve --config "$TMP/$4.toml"
  wait_http "http://127.0.0.1:$2/healthz"
}

start_haproxy() { # MAXCONN HEALTH_PATH SERVERS...: HAProxy on FRONT
  require_free_ports "$FRONT"
  haproxy_config "$FRONT" "$@" >"$TMP/haproxy.cfg"
  haproxy -c -q -f "$TMP/haproxy.cfg" || die "haproxy rejected $TMP/haproxy.cfg"
  start_bg "$TMP/haproxy.log" haproxy -db -f "$TMP/haproxy.cfg"
  wait_http "http://127.0.0.1:$FRONT$2" # answered by a server: HAProxy has a live backend
}

start_target() { # TARGET
  case $1 in
    sgl-*) start_sglang "${1#sgl-}" ;;
    haproxy) start_haproxy "$HAPROXY_MAXCONN" /health "s1=$SIM1" "s2=$SIM2" ;;
    wp-x2 | wp-x2-split)
      local extra=""
      [[ $1 == wp-x2-split ]] && extra="prefill_tokens_per_backend = 8192"
      start_warmpath boost-sa "$REP1" "$ADMIN1" replica1 "$extra"
      start_warmpath boost-sa "$REP2" "$ADMIN2" replica2 "$extra"
      start_haproxy 0 /healthz "r1=$REP1" "r2=$REP2"
      ;;
    wp-auto-x2)
      # Issue [8]: two replicas with no key set, no budget split by hand.
      start_warmpath wp-auto "$REP1" "$ADMIN1" replica1
      start_warmpath wp-auto "$REP2" "$ADMIN2" replica2
      start_haproxy 0 /healthz "r1=$REP1" "r2=$REP2"
      ;;
    *-anon) start_target "${1%-anon}" ;;
    *) start_warmpath "$1" "$FRONT" "$ADMIN" router ;;
  esac
}

save_target_metrics() { # TARGET LABEL
  case $1 in
    sgl-*) curl -fsS "http://127.0.0.1:$PROM/metrics" >"$OUT/$2.router-metrics.txt" 2>/dev/null || true ;;
    haproxy) ;;
    wp-x2* | wp-auto-x2)
      curl -fsS "http://127.0.0.1:$ADMIN1/metrics" >"$OUT/$2.replica1-metrics.txt" 2>/dev/null || true
      curl -fsS "http://127.0.0.1:$ADMIN2/metrics" >"$OUT/$2.replica2-metrics.txt" 2>/dev/null || true
      ;;
    *) curl -fsS "http://127.0.0.1:$ADMIN/metrics" >"$OUT/$2.router-metrics.txt" 2>/dev/null || true ;;
  esac
}

one_run() { # TRACE TARGET LOAD ROUND
  local trace=$1 target=$2 load=$3 round=$4
  local label="$trace-$target-L${load//./}-r$round$LABEL_SUFFIX"
  require_free_ports "$SIM1" "$SIM2"
  start_sims "$SIM1" "$SIM2" "$TMP"
  start_target "$target"
  sleep 0.3 # a first scrape
  local bench_extra=${BENCH_EXTRA:-}
  [[ $target == *-anon ]] && bench_extra+=" --anonymous"
  BENCH_EXTRA=$bench_extra replay_trace "$FRONT" "$trace" "$load" "$label" "$SIM1" "$SIM2"
  [[ $target == sgl-* ]] && check_unsafe
  save_target_metrics "$target" "$label"
  save_sim_metrics "$label" "$SIM1" "$SIM2"
  stop_all
  if [[ $target == sgl-* ]]; then
    cp "$TMP/sglang.out" "$OUT/$label.sglang.log"
    # Every address it connected to, with counts (all loopback, or check_unsafe stopped us).
    grep -o 'sa_family=AF_[A-Z0-9]*[^}]*' "$TMP/sglang.strace" | sort | uniq -c \
      >"$OUT/$label.sglang-connects.txt" || true
    SGL_PID=""
  fi
  return 0
}

{
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "sglang-router $SGLANG_VERSION; $(haproxy -v 2>/dev/null | head -n1 || echo 'no haproxy')"
  echo "TRACES=$TRACES LOADS=$LOADS TARGETS=$TARGETS SIM_SCALE=$SIM_SCALE"
  echo "PROFILE1=${PROFILE1:-h100-8b} PROFILE2=${PROFILE2:-h100-8b} LOAD_MODE=${LOAD_MODE:-ratio}"
  echo "MOONCAKE_WINDOW=$MOONCAKE_WINDOW RAGPULSE_WINDOW=$RAGPULSE_WINDOW HAPROXY_MAXCONN=$HAPROXY_MAXCONN"
  echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >>"$OUT/RUN-INFO.txt"
for round in $(seq 1 "$ROUNDS"); do
  for trace in $TRACES; do
    for load in $LOADS; do
      for target in $TARGETS; do
        one_run "$trace" "$target" "$load" "$round"
      done
    done
  done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/RUN-INFO.txt"
log "done: $OUT (python3 perf/peer_summary.py $OUT)"
