# Shared by perf/trace_compare.sh, perf/peer_compare.sh and perf/scale_out_test.sh (source it;
# it defines functions and runs nothing): process handling, the warmpath configurations and the
# load definitions (the arithmetic is in trace_compare.sh's header).

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "$*"; exit 1; }

# Processes started through start_bg; stop_all stops them (TERM, then KILL after 5 s).
STARTED=()
start_bg() { # LOGFILE COMMAND...: start in the background, remember its pid in LAST_PID
  local logfile=$1
  shift
  "$@" >"$logfile" 2>&1 &
  LAST_PID=$!
  STARTED+=("$LAST_PID")
}
stop_pid() { # PID: TERM, wait up to 5 s, KILL
  local pid=$1 i
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in {1..50}; do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
stop_all() {
  local pid kid
  for pid in "${STARTED[@]}"; do
    # A process started under strace: stop the traced child first (strace then exits).
    for kid in $(pgrep -P "$pid" 2>/dev/null); do stop_pid "$kid"; done
    stop_pid "$pid"
  done
  STARTED=()
}

wait_http() { # URL [TRIES]: until URL answers 2xx (TRIES x 0.1 s, default 100)
  local i
  for ((i = 0; i < ${2:-100}; i++)); do
    curl -fsS -o /dev/null --max-time 1 "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  log "nothing answers $1"
  return 1
}

port_free() { ! ss -Htln "sport = :$1" | grep -q .; }
require_free_ports() { # PORT...: fail when one is taken
  local p
  for p in "$@"; do port_free "$p" || die "port $p on 127.0.0.1 is in use"; done
}

# Load (perf/trace_compare.sh): a trace is replayed at LOAD x RATIO trace seconds per simulated
# second, and the engines run SIM_SCALE simulated seconds per real second.
compress_for() { # TRACE LOAD: the bench --time-scale
  local ratio
  case $1 in
    mooncake) ratio=$MOONCAKE_RATIO ;;
    ragpulse) ratio=$RAGPULSE_RATIO ;;
    *) die "unknown trace $1" ;;
  esac
  python3 -c "print(round($SIM_SCALE * $2 * $ratio, 4))"
}
window_for() { # TRACE: trace seconds replayed
  case $1 in mooncake) echo "$MOONCAKE_WINDOW" ;; ragpulse) echo "$RAGPULSE_WINDOW" ;; esac
}

# One bench replay of TRACE at LOAD against the front on FRONT_PORT, the engines' gauges
# scraped from SIM1 SIM2; the bench's JSON goes to $OUT under LABEL, its output to
# $TMP/bench.out and .err (the last lines are printed). Uses WARMPATH, OUT and TMP.
replay_trace() { # FRONT_PORT TRACE LOAD LABEL SIM1 SIM2
  local front=$1 trace=$2 load=$3 label=$4 compress window duration pace workload=$2
  if [[ $trace == chat || $trace == agent || $trace == classify ]]; then
    # The fleet lab's synthetic workloads (examples/fleet.rs), always paced by profile. `chat`:
    # short prompts, answers of 300 tokens, five turns. `agent`: a 1,500-word system prompt
    # every session shares, eight quick steps, answers of 60 tokens. The bench divides think
    # times by its compression as well, the lab does not: CHAT_THINK_MS (default 11600, the
    # lab's 8 s times its compression at load 0.9 on two h100-8b) and AGENT_THINK_MS (default
    # 160, the lab's 500 ms times its compression at 0.9 on two l4-3b, 0.32) keep them about
    # the lab's. `classify`: one-shot requests of a few hundred tokens behind a shared
    # 300-word instruction, answers of 5 tokens (the lab's `custom` shape of that name,
    # perf/RESULTS.md, nineteenth session).
    workload=multiturn
    if [[ $trace == chat ]]; then
      pace=(--rate 5 --turns 5 --system-words 80 --context-words 150 --new-words 40
        --answer-tokens 300 --think-ms "${CHAT_THINK_MS:-11600}")
    elif [[ $trace == classify ]]; then
      pace=(--rate 5 --turns 1 --system-words 300 --context-words 100 --new-words 20
        --answer-tokens 5 --think-ms 0)
    else
      pace=(--rate 2 --turns 8 --system-words 1500 --context-words 300 --new-words 80
        --answer-tokens 60 --think-ms "${AGENT_THINK_MS:-160}")
    fi
    pace+=(--duration 400s --seed 1 --load "$load" --engine-profile "${PROFILE1:-h100-8b}"
      --engine-profile "${PROFILE2:-h100-8b}" --sim-scale "$SIM_SCALE")
    log "$label: $trace at load $load of ${PROFILE1:-h100-8b} + ${PROFILE2:-h100-8b}" \
      "(sims x$SIM_SCALE)"
  elif [[ ${LOAD_MODE:-ratio} == profile ]]; then
    # The load as a fraction of the two engines' capacity by their profiles
    # (src/bench/load.rs), the whole trace replayed.
    pace=(--load "$load" --engine-profile "${PROFILE1:-h100-8b}"
      --engine-profile "${PROFILE2:-h100-8b}" --sim-scale "$SIM_SCALE")
    log "$label: $trace at load $load of ${PROFILE1:-h100-8b} + ${PROFILE2:-h100-8b} (sims x$SIM_SCALE)"
  else
    compress=$(compress_for "$trace" "$load")
    window=$(window_for "$trace")
    duration=$(python3 -c "print(f'{$window / $compress:.3f}s')")
    pace=(--time-scale "$compress" --duration "$duration")
    log "$label: $trace x$compress for $duration of replay"
  fi
  "$WARMPATH" bench --target "http://127.0.0.1:$front" --model sim-8b --workload "$workload" \
    "${pace[@]}" --no-progress --label "$label" \
    --engine-metrics "http://127.0.0.1:$5/metrics" \
    --engine-metrics "http://127.0.0.1:$6/metrics" \
    --max-inflight 1024 --out "$OUT" ${BENCH_EXTRA:-} >"$TMP/bench.out" 2>"$TMP/bench.err" || true
  tail -n 4 "$TMP/bench.out"
}
save_sim_metrics() { # LABEL SIM1 SIM2: each engine's /metrics into $OUT/LABEL.simN-metrics.txt
  curl -fsS "http://127.0.0.1:$2/metrics" >"$OUT/$1.sim1-metrics.txt" 2>/dev/null || true
  curl -fsS "http://127.0.0.1:$3/metrics" >"$OUT/$1.sim2-metrics.txt" 2>/dev/null || true
}

start_sims() { # PORT1 PORT2 DIR: two fresh engines, seeds 1 and 2, as trace_compare starts them
  # PROFILE1 / PROFILE2 (default h100-8b): each engine's `warmpath sim --profile`;
  # SIM_ARGS1 / SIM_ARGS2 (default none): more `warmpath sim` flags, overriding the profile's
  # values (e.g. "--kv-blocks 10000"; the bench's load still follows the profile's).
  # shellcheck disable=SC2086 # the extra flags are words
  start_bg "$3/sim1.log" "$WARMPATH" sim --listen "127.0.0.1:$1" --time-scale "$SIM_SCALE" \
    --seed 1 --profile "${PROFILE1:-h100-8b}" ${SIM_ARGS1:-}
  # shellcheck disable=SC2086
  start_bg "$3/sim2.log" "$WARMPATH" sim --listen "127.0.0.1:$2" --time-scale "$SIM_SCALE" \
    --seed 2 --profile "${PROFILE2:-h100-8b}" ${SIM_ARGS2:-}
  wait_http "http://127.0.0.1:$1/health" && wait_http "http://127.0.0.1:$2/health"
}

# A warmpath configuration named as in perf/trace_compare.sh (fifo-li, fifo-sa, boost-li,
# boost-sa, boost-pc, fifo-pc, kthena), listening on LISTEN_PORT / ADMIN_PORT, in front of the engines SIM1 SIM2.
# EXTRA_SERVER: more lines for [server] (e.g. debug_headers = true); EXTRA_QUEUE for [queue].
warmpath_config() { # NAME LISTEN_PORT ADMIN_PORT SIM1 SIM2
  local strategy="" routing="" extra=""
  case $1 in
    # Issue [8]: warmpath with no queue or routing key set (what it learns).
    wp-auto) ;;
    # A static configuration of the pre-[8] knobs: st-ROUTING-BUDGET, ROUTING pc
    # (prefix-cost) or sa (session-affinity), BUDGET prefill_tokens_per_backend (0 = off),
    # session-boost, the prefix index fixed at its former default of 8,192 blocks.
    st-pc-* | st-sa-*)
      strategy=session-boost
      [[ $1 == st-pc-* ]] && routing=prefix-cost || routing=session-affinity
      extra="prefill_tokens_per_backend = ${1##*-}"$'\n'"prefix_index_blocks = 8192" ;;
    fifo-li) strategy=fifo routing=least-inflight ;;
    fifo-sa) strategy=fifo routing=session-affinity ;;
    boost-li) strategy=session-boost routing=least-inflight ;;
    boost-sa) strategy=session-boost routing=session-affinity ;;
    boost-pc) strategy=session-boost routing=prefix-cost ;;
    fifo-pc) strategy=fifo routing=prefix-cost ;;
    kthena) strategy=session-boost routing=session-affinity
            extra=$'inflight_per_backend = 16\nprefill_tokens_per_backend = 0' ;;
    *) die "unknown warmpath configuration $1" ;;
  esac
  cat <<EOF
[server]
listen = "127.0.0.1:$2"
admin_listen = "127.0.0.1:$3"
shards = 1
pin_cores = false
${EXTRA_SERVER:-}

[queue]
$([[ -n $strategy ]] && echo "strategy = \"$strategy\"")
timeout = "300s"
$extra
${EXTRA_QUEUE:-}

[upstream]
metrics_interval = "100ms"

[[model]]
name = "sim-8b"
engine = "vllm"
$([[ -n $routing ]] && echo "routing = \"$routing\"")
backends = ["127.0.0.1:$4", "127.0.0.1:$5"]
EOF
}

# HAProxy hashing on the session header (consistent hashing: adding or removing a server moves
# only the sessions that hash to it), a maxconn queue per server, health checks on HEALTH_PATH.
# SERVERS: "name=port ..." on 127.0.0.1. MAXCONN 0 = no per-server limit.
haproxy_config() { # LISTEN_PORT MAXCONN HEALTH_PATH SERVERS...
  local port=$1 maxconn=$2 health=$3 s
  shift 3
  cat <<EOF
global
    nbthread 1
    maxconn 8192

defaults
    mode http
    option http-keep-alive
    http-reuse safe
    timeout connect 1s
    timeout client 600s
    timeout server 600s
    # A request waiting for a server slot (maxconn) waits at most as long as warmpath's queue.
    timeout queue 300s
    timeout http-keep-alive 75s
    # A connection refused by a server that is going away is retried, the last time on
    # another server (redispatch), before the health check has marked it down.
    retries 3
    option redispatch 1
    # Also a request sent on a kept-alive connection that the server closed (a replica
    # draining) is resent; HAProxy can do so while the request is still in its buffer.
    retry-on conn-failure empty-response
    # Token streams and prompts are latency-bound: without it, Nagle's algorithm on HAProxy's
    # sockets added about 2 ms to a streamed request's first byte on loopback (measured with a
    # 12,000-word prompt: 2.4 ms direct, 4.7 ms through HAProxy, 2.4 ms with this option).
    option http-no-delay

frontend sessions
    bind 127.0.0.1:$port
    default_backend replicas

backend replicas
    balance hdr(X-Session-ID)
    hash-type consistent
    option httpchk GET $health
    http-check expect status 200
    default-server check inter 200ms fall 2 rise 2$( ((maxconn > 0)) && printf ' maxconn %s' "$maxconn")
    # Which server answered: the scale-out test reads it.
    http-response set-header X-Replica %s
EOF
  for s in "$@"; do printf '    server %s 127.0.0.1:%s\n' "${s%%=*}" "${s#*=}"; done
}
