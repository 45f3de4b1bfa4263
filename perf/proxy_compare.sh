#!/usr/bin/env bash
# Side-by-side proxy benchmark: warmpath against nginx and HAProxy, in one interleaved run.
#
# What it measures. A static backend (nginx `return 200`, keep-alive) stands in for a vLLM
# engine. wrk POSTs a chat body to it directly (the baseline) and through each proxy: warmpath
# with one shard, nginx as a keep-alive reverse proxy with one worker, HAProxy with one thread.
# `haproxy-nd` (not in the default TARGETS) is the same HAProxy with `option http-no-delay`:
# by default HAProxy sends with MSG_MORE and lets the kernel merge small writes (Willy Tarreau,
# ietf-http-wg, 2011-05-10: "it aggregates as many data as possible in each segment (MSG_MORE,
# equivalent on TCP_CORK)"), so here a whole 50-event stream reaches the client in one segment,
# and with events 50 ms apart a benchmark an HAProxy engineer discusses saw the first token
# 206 ms late (dev.to/rlnorthcutt, "HAProxy holds your tokens for 206ms?"); http-no-delay relays
# each event as it comes, as the stream target's "no event delayed by more than one read" asks.
# Scenarios, each run as rounds of direct, warmpath, nginx, haproxy, ROUNDS times:
#   small    small chat body, small chat.completion JSON back, CONNS connections (saturating)
#   stream   the same body with "stream": true, 50 SSE events + [DONE] back, chunked, one
#            backend flush per event
#   body64k  a 65,536-byte chat body, small JSON back
#   latency  the small request with LAT_CONNS connections (default 2): below saturation, about
#            half of warmpath's peak rate here (see "Latency method" below)
#   tls      the small request over TLS (issue [11]): warmpath and nginx each get a second
#            listener with the same self-signed certificate (EC P-256, made with openssl per
#            run), wrk speaks https to them; the backend hop stays plaintext. warmpath's is a
#            second process (`warmpath-tls`, its main listener with [server.tls]); its CPU is
#            that process's. CONNS keep-alive connections, so each handshake is amortised over
#            the run: this is the record layer's cost, not the handshake's. The direct row
#            stays the plaintext baseline; haproxy is left out (no TLS configured for it).
# Per run: requests/s, p50 and p99 latency (wrk), the TCP segments with data sent on the whole
# machine per request (nstat's TcpExtTCPOrigDataSent: every leg, so it shows how a proxy frames what
# it relays: the backend's flushes are the same for every proxy), responses with status >= 400 and
# socket errors (wrk counts a response later than 2 s among them; a request never answered shows
# only as lost throughput, and a run with no response at all is counted as such), and the proxy's
# CPU per request: utime+stime from /proc/PID/stat (all threads; nginx: master and worker) over the
# run, divided by the requests wrk completed. A proxy that answers errors fast, or not at all, is
# not faster: before the runs, one request per scenario must come back 200 with exactly the
# backend's body, or the target is left out of that scenario. The report gives the median and the
# min-max spread over the rounds, and warmpath's ratios to nginx against the targets.
#
# How to read it. CPU per request is the primary number: it does not depend on who else is
# busy. With PIN=1 (default) the proxy runs alone on core 0 and wrk + backend share core 1,
# so requests/s is capped by core 1 unless the proxy's core is saturated: the "proxy busy"
# column says which. In the stream scenario the backend's 50 flushes cost it about 350 us per
# response, so there req/s and latency are bound by core 1: compare CPU per response.
# "Other load on core 0" is core 0's busy time (/proc/stat, steal included)
# minus the proxy's: someone else's work on the proxy's core during the run, i.e. the noise.
# utime+stime is the scheduler's exact runtime in 10 ms units (the kernel scales its tick
# samples to it); the report prints the smallest tick count behind any CPU figure, so its
# resolution is visible. Loopback TCP work the kernel does in a process's context is charged to
# that process, alike for every proxy.
#
# Latency method. The issue asks for the p50 added over direct at half of warmpath's peak rate.
# wrk2 (fixed rate, coordinated-omission-corrected) is not packaged for Debian, and wrk's delay()
# hook is not a pacer: its timers fire on 1 ms ticks, so connections synchronise into bursts and
# latency measures the burst (direct, 16 connections x 1 ms think time: p50 395 us at 9.3k
# req/s, against 37 us at 24k req/s with one connection at full speed). So the latency scenario
# is closed-loop at low concurrency: LAT_CONNS connections at full speed, each proxy reaching
# whatever rate it reaches, which the report gives as a share of the same target's small-scenario
# peak. On the 2-core machine of perf/RESULTS.md, 2 connections put warmpath at about half its
# peak; 1 connection (no request ever queued behind another) gives the bare hop latency at a
# quarter of it. Not an open-loop measurement: read "p50 - direct p50" with that in mind.
#
# Usage: perf/proxy_compare.sh            (build warmpath first: cargo build --release)
# Environment (defaults): ROUNDS=3 DURATION=5 (seconds per run, at most 10) CONNS=32
#   LAT_CONNS=2 WARMUP=1 (seconds per target per scenario, not recorded) PIN=1
#   SCENARIOS="small stream body64k latency tls" TARGETS="direct warmpath nginx haproxy"
#   (targets to add: haproxy-nd, HAProxy with http-no-delay; nginx-plain, nginx without the
#   X-Forwarded-For and X-Request-ID work that warmpath, nginx and haproxy do)
#   WARMPATH=target/release/warmpath BASE_PORT=18100 KEEP_TMP=0 (1 keeps configs and logs)
#   SHARDS=1 (warmpath's server.shards; with 2, run PIN=0: one core cannot show two shards)
#   WARMPATH_B, WARMPATH_B_ENV: a second warmpath target `warmpath-b` (add it to TARGETS), the
#   binary WARMPATH_B (default WARMPATH) with the environment assignments WARMPATH_B_ENV (e.g.
#   "WARMPATH_X=1") and the extra serve arguments WARMPATH_B_ARGS (e.g. "--set
#   server.busy_poll=50us"), the same configuration: two builds or two settings side by side
# Needs wrk, nginx, its echo module (libnginx-mod-http-echo), haproxy and openssl; installs what is
# missing with apt-get when run as root. Everything listens on 127.0.0.1 only, every process it
# starts is stopped on exit. Defaults take about 5 minutes. Progress goes to stderr, the
# markdown report to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
HERE=$REPO/perf/proxy

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
CONNS=${CONNS:-32}
LAT_CONNS=${LAT_CONNS:-2}
WARMUP=${WARMUP:-1}
PIN=${PIN:-1}
SCENARIOS=${SCENARIOS:-small stream body64k latency tls}
TARGETS=${TARGETS:-direct warmpath nginx haproxy}
WARMPATH=${WARMPATH:-target/release/warmpath}
BASE_PORT=${BASE_PORT:-18100}
KEEP_TMP=${KEEP_TMP:-0}
SHARDS=${SHARDS:-1}
WARMPATH_B=${WARMPATH_B:-$WARMPATH}
WARMPATH_B_ENV=${WARMPATH_B_ENV:-}
WARMPATH_B_ARGS=${WARMPATH_B_ARGS:-}
ECHO_MODULE=/usr/lib/nginx/modules/ngx_http_echo_module.so
CLK_TCK=$(getconf CLK_TCK)

log() { printf '%s\n' "$*" >&2; }
die() { log "proxy_compare: $*"; exit 1; }

((DURATION >= 1 && DURATION <= 10)) || die "DURATION must be 1..10 seconds (got $DURATION)"
((ROUNDS >= 1)) || die "ROUNDS must be at least 1"

# --- Tools -------------------------------------------------------------------------------------

ensure_tools() {
  local pkgs=()
  command -v wrk >/dev/null || pkgs+=(wrk)
  command -v nginx >/dev/null || pkgs+=(nginx)
  [[ -e $ECHO_MODULE ]] || pkgs+=(libnginx-mod-http-echo)
  command -v haproxy >/dev/null || pkgs+=(haproxy)
  command -v curl >/dev/null || pkgs+=(curl)
  command -v openssl >/dev/null || pkgs+=(openssl)
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

# --- Processes, cleanup, cores -------------------------------------------------------------------

TMP=$(mktemp -d -t proxy_compare.XXXXXX)
STARTED=() # every pid this script started; stopped on exit

cleanup() {
  local pid i
  for pid in "${STARTED[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${STARTED[@]}"; do
    for i in {1..50}; do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [[ $KEEP_TMP == 1 ]]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Core layout (PIN=1 on 2+ cores): the proxy under test alone on core 0; wrk and the backend
# on the last core. Every proxy gets the same single core, whatever its thread count.
PIN_PROXY=() PIN_LOAD=()
if [[ $PIN == 1 ]] && (($(nproc) >= 2)); then
  LOAD_CORE=$(($(nproc) - 1))
  PIN_PROXY=(taskset -c 0) PIN_LOAD=(taskset -c "$LOAD_CORE")
  LAYOUT="proxy on core 0; wrk and backend on core $LOAD_CORE (taskset)"
else
  LAYOUT="not pinned"
fi

# --- Ports (127.0.0.1 only) ------------------------------------------------------------------------

NEXT_PORT=$BASE_PORT
port_in_use() { ss -Htln "sport = :$1" | grep -q .; }
alloc_port() { # VAR: the next free loopback port at or above NEXT_PORT
  while port_in_use "$NEXT_PORT"; do NEXT_PORT=$((NEXT_PORT + 1)); done
  printf -v "$1" '%s' "$NEXT_PORT"
  NEXT_PORT=$((NEXT_PORT + 1))
}
alloc_port BACKEND_PORT
alloc_port NGINX_PORT
alloc_port NGINX_PLAIN_PORT
alloc_port HAPROXY_PORT
alloc_port HAPROXY_ND_PORT
alloc_port WARMPATH_PORT
alloc_port WARMPATH_ADMIN_PORT
alloc_port WARMPATH_B_PORT
alloc_port WARMPATH_B_ADMIN_PORT
alloc_port NGINX_TLS_PORT
alloc_port WARMPATH_TLS_PORT
alloc_port WARMPATH_TLS_ADMIN_PORT

# --- Configurations and bodies ---------------------------------------------------------------------

render() { # TEMPLATE OUT DIR PORT [ADMIN_PORT]: fill in the @VARS@ of a template in perf/proxy
  sed -e "s|@DIR@|$3|g" -e "s|@PORT@|$4|g" -e "s|@BACKEND_PORT@|$BACKEND_PORT|g" \
    -e "s|@ADMIN_PORT@|${5:-$WARMPATH_ADMIN_PORT}|g" -e "s|@ECHO_MODULE@|$ECHO_MODULE|g" \
    -e "s|@SHARDS@|$SHARDS|g" -e "s|@TLS_PORT@|$NGINX_TLS_PORT|g" -e "s|@TLS_DIR@|$TMP/tls|g" \
    "$HERE/$1" >"$2"
}

mkdir -p "$TMP/backend" "$TMP/nginx" "$TMP/haproxy" "$TMP/haproxy-nd" "$TMP/warmpath" \
  "$TMP/warmpath-b" "$TMP/body"
mkdir -p "$TMP/warmpath-tls" "$TMP/tls"
# The tls scenario's certificate, the same for warmpath and nginx: self-signed, EC P-256.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj /CN=localhost -keyout "$TMP/tls/key.pem" -out "$TMP/tls/cert.pem" 2>/dev/null ||
  die "openssl could not make the test certificate"
render backend-nginx.conf "$TMP/backend/nginx.conf" "$TMP/backend" "$BACKEND_PORT"
render proxy-nginx.conf "$TMP/nginx/nginx.conf" "$TMP/nginx" "$NGINX_PORT"
# nginx-plain: the same proxy without the header work (no X-Forwarded-For, no X-Request-ID) and
# without the TLS listener.
mkdir -p "$TMP/nginx-plain"
render proxy-nginx.conf "$TMP/nginx-plain/nginx.conf" "$TMP/nginx-plain" "$NGINX_PLAIN_PORT"
sed -i '/X-Forwarded-For\|X-Request-ID\|ssl/d' "$TMP/nginx-plain/nginx.conf"
render haproxy.cfg "$TMP/haproxy/haproxy.cfg" "$TMP/haproxy" "$HAPROXY_PORT"
# haproxy-nd: the same HAProxy with `option http-no-delay`, which relays each event as it comes.
render haproxy.cfg "$TMP/haproxy-nd/haproxy.cfg" "$TMP/haproxy-nd" "$HAPROXY_ND_PORT"
sed -i 's/^    option http-keep-alive$/&\n    option http-no-delay/' "$TMP/haproxy-nd/haproxy.cfg"
grep -q '^    option http-no-delay$' "$TMP/haproxy-nd/haproxy.cfg" ||
  die "haproxy-nd: the configuration has no http-no-delay"
render warmpath.toml "$TMP/warmpath/warmpath.toml" "$TMP/warmpath" "$WARMPATH_PORT"
render warmpath.toml "$TMP/warmpath-b/warmpath.toml" "$TMP/warmpath-b" "$WARMPATH_B_PORT" \
  "$WARMPATH_B_ADMIN_PORT"
render warmpath.toml "$TMP/warmpath-tls/warmpath.toml" "$TMP/warmpath-tls" "$WARMPATH_TLS_PORT" \
  "$WARMPATH_TLS_ADMIN_PORT"
printf '\n[server.tls]\ncert = "%s"\nkey = "%s"\n' "$TMP/tls/cert.pem" "$TMP/tls/key.pem" \
  >>"$TMP/warmpath-tls/warmpath.toml"

# The stream: 50 chat.completion.chunk events and [DONE], each written and flushed on its own
# (echo module), so the proxy relays a chunked stream as an engine sends it.
for i in $(seq 1 50); do
  printf "echo -n 'data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench-model\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"token%02d \"},\"finish_reason\":null}]}\\\\n\\\\n';\necho_flush;\n" "$i"
done >"$TMP/backend/sse.conf"
printf "echo -n 'data: [DONE]\\\\n\\\\n';\n" >>"$TMP/backend/sse.conf"

SMALL_BODY='{"model":"bench-model","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}'
printf '%s' "$SMALL_BODY" >"$TMP/body/small.json"
printf '%s' "${SMALL_BODY%\}},\"stream\":true}" >"$TMP/body/stream.json"
# 65,536 bytes exactly: the same JSON with the user message padded.
pad=$((65536 - ${#SMALL_BODY}))
printf '{"model":"bench-model","messages":[{"role":"user","content":"Say hello.%s"}],"max_tokens":16}' \
  "$(head -c "$pad" /dev/zero | tr '\0' 'x')" >"$TMP/body/body64k.json"
(($(stat -c %s "$TMP/body/body64k.json") == 65536)) || die "64 KiB body has the wrong size"

scenario_path() { if [[ $1 == stream ]]; then echo /v1/stream/chat/completions; else echo /v1/chat/completions; fi; }
scenario_body() { case $1 in stream | body64k) echo "$TMP/body/$1.json" ;; *) echo "$TMP/body/small.json" ;; esac; }
scenario_conns() { if [[ $1 == latency ]]; then echo "$LAT_CONNS"; else echo "$CONNS"; fi; }

# --- Start the backend and the proxies ----------------------------------------------------------

declare -A PORT CPU_PIDS
url() { # NAME: the base URL of a target (https for the TLS listeners)
  if [[ $1 == *-tls ]]; then echo "https://127.0.0.1:${PORT[$1]}"; else echo "http://127.0.0.1:${PORT[$1]}"; fi
}
# The process and listener a target is measured on in a scenario: in tls, warmpath-tls and
# nginx-tls (nginx's own TLS server block); everything else as named.
key_of() { # SCENARIO TARGET
  if [[ $1 == tls && ($2 == warmpath || $2 == nginx) ]]; then echo "$2-tls"; else echo "$2"; fi
}
wait_http() { # URL PID: until URL answers 2xx (10 s), while PID lives
  local i
  for i in {1..100}; do
    curl -kfsS -o /dev/null --max-time 1 "$1" 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
start() { # NAME READY_PATH PIN... -- COMMAND...: start in the background, wait until ready
  local name=$1 ready=$2 pin=() pid
  shift 2
  while [[ $1 != -- ]]; do pin+=("$1"); shift; done
  shift
  "${pin[@]}" "$@" >"$TMP/$name.log" 2>&1 &
  pid=$!
  STARTED+=("$pid")
  CPU_PIDS[$name]=$pid
  if ! wait_http "$(url "$name")$ready" "$pid"; then
    log "$name did not become ready on 127.0.0.1:${PORT[$name]}; its log:"
    tail -n 20 "$TMP/$name.log" >&2
    return 1
  fi
}

PORT[backend]=$BACKEND_PORT PORT[nginx]=$NGINX_PORT PORT[haproxy]=$HAPROXY_PORT
PORT[haproxy-nd]=$HAPROXY_ND_PORT PORT[nginx-plain]=$NGINX_PLAIN_PORT
PORT[warmpath]=$WARMPATH_PORT PORT[warmpath-b]=$WARMPATH_B_PORT
PORT[nginx-tls]=$NGINX_TLS_PORT PORT[warmpath-tls]=$WARMPATH_TLS_PORT
start backend /health "${PIN_LOAD[@]}" -- \
  nginx -p "$TMP/backend" -c "$TMP/backend/nginx.conf" -e "$TMP/backend/error.log" ||
  die "backend failed to start"
PORT[direct]=$BACKEND_PORT
CPU_PIDS[direct]=${CPU_PIDS[backend]} # the direct row reports the backend's own CPU

active=()
for target in $TARGETS; do
  case $target in
    direct) active+=(direct) ;;
    nginx)
      start nginx /health "${PIN_PROXY[@]}" -- \
        nginx -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -e "$TMP/nginx/error.log" ||
        die "nginx proxy failed to start"
      CPU_PIDS[nginx-tls]=${CPU_PIDS[nginx]} # the same process, its TLS server block
      active+=(nginx)
      ;;
    nginx-plain)
      start nginx-plain /health "${PIN_PROXY[@]}" -- nginx -p "$TMP/nginx-plain" \
        -c "$TMP/nginx-plain/nginx.conf" -e "$TMP/nginx-plain/error.log" ||
        die "nginx-plain failed to start"
      active+=(nginx-plain)
      ;;
    haproxy | haproxy-nd)
      start "$target" /health "${PIN_PROXY[@]}" -- haproxy -db -f "$TMP/$target/haproxy.cfg" ||
        die "$target failed to start"
      active+=("$target")
      ;;
    warmpath)
      if ! "$WARMPATH" serve --help >/dev/null 2>&1; then
        log "skipping warmpath: '$WARMPATH serve --help' failed (cargo build --release first)"
      elif start warmpath /readyz "${PIN_PROXY[@]}" -- \
        "$WARMPATH" serve --config "$TMP/warmpath/warmpath.toml"; then
        active+=(warmpath)
        if [[ " $SCENARIOS " == *" tls "* ]] && ! start warmpath-tls /readyz "${PIN_PROXY[@]}" -- \
          "$WARMPATH" serve --config "$TMP/warmpath-tls/warmpath.toml"; then
          log "warmpath-tls did not become ready (/readyz) within 10 s"
        fi
      else
        log "skipping warmpath: it did not become ready (/readyz) within 10 s"
      fi
      ;;
    warmpath-b)
      read -ra b_env <<<"$WARMPATH_B_ENV"
      read -ra b_args <<<"$WARMPATH_B_ARGS"
      if start warmpath-b /readyz "${PIN_PROXY[@]}" -- env "${b_env[@]}" "$WARMPATH_B" serve \
        --config "$TMP/warmpath-b/warmpath.toml" "${b_args[@]}"; then
        active+=(warmpath-b)
      else
        log "skipping warmpath-b: it did not become ready (/readyz) within 10 s"
      fi
      ;;
    *) die "unknown target $target" ;;
  esac
done

# Pre-flight: every target must answer each scenario with 200 and exactly the backend's body.
declare -A EXCLUDED
for scenario in $SCENARIOS; do
  expected=$TMP/expected.$scenario
  curl -sS -o "$expected" --data-binary @"$(scenario_body "$scenario")" \
    -H 'Content-Type: application/json' "http://127.0.0.1:$BACKEND_PORT$(scenario_path "$scenario")"
  for target in "${active[@]}"; do
    got=$TMP/got.$scenario.$target
    key=$(key_of "$scenario" "$target")
    if [[ $scenario == tls && $target != direct && $key == "$target" ]]; then
      EXCLUDED[$scenario.$target]="no TLS listener is configured for it"
      log "excluding $target from $scenario: ${EXCLUDED[$scenario.$target]}"
      continue
    fi
    if [[ -z ${CPU_PIDS[$key]:-} ]]; then
      EXCLUDED[$scenario.$target]="$key did not start"
      log "excluding $target from $scenario: ${EXCLUDED[$scenario.$target]}"
      continue
    fi
    # Sent as wrk sends it: one write, no Expect: 100-continue.
    code=$(curl -ksS -o "$got" -w '%{http_code}' --max-time 5 --data-binary @"$(scenario_body "$scenario")" \
      -H 'Content-Type: application/json' -H 'Expect:' \
      "$(url "$key")$(scenario_path "$scenario")" || true)
    if [[ $code == 000 ]]; then
      EXCLUDED[$scenario.$target]="the pre-flight request got no response (connection failed or 5 s passed)"
    elif [[ $code != 200 ]] || ! cmp -s "$expected" "$got"; then
      EXCLUDED[$scenario.$target]="the pre-flight request got status $code and $(stat -c %s "$got") bytes"
    fi
    if [[ -n ${EXCLUDED[$scenario.$target]:-} ]]; then
      EXCLUDED[$scenario.$target]+=" (expected 200 and the backend's $(stat -c %s "$expected") bytes)"
      log "excluding $target from $scenario: ${EXCLUDED[$scenario.$target]}"
    fi
  done
done

# --- Measuring ---------------------------------------------------------------------------------------

proc_ticks() { # PID...: "utime+stime stime" (clock ticks) of the processes and their children
  local pid stat fields total=0 sys=0 kids
  kids=$(pgrep -P "$(IFS=,; echo "$*")" || true)
  for pid in "$@" $kids; do
    stat=$(<"/proc/$pid/stat") || continue
    read -ra fields <<<"${stat##*) }" # fields[0] is field 3 (state): 14, 15 are [11], [12]
    total=$((total + fields[11] + fields[12])) sys=$((sys + fields[12]))
  done
  echo "$total $sys"
}

data_segments() { # TCP segments with data sent on this machine since boot (loopback: every leg)
  nstat -asz TcpExtTCPOrigDataSent | awk '$1 == "TcpExtTCPOrigDataSent" { print $2 }'
}

core_busy() { # busy ticks of core 0 (user nice system irq softirq steal) from /proc/stat
  awk '$1 == "cpu0" { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat
}

RESULTS=$TMP/results.tsv
run_wrk() { # SCENARIO TARGET SECONDS: prints wrk's RESULT line, the proxy's ticks over the run
  # and core 0's busy ticks (proxy included: the rest is someone else's load on the proxy core)
  local scenario=$1 target=$2 seconds=$3 t0 t1 c0 c1 s0 s1 g0 g1 out key
  key=$(key_of "$scenario" "$target")
  c0=$(core_busy)
  read -r t0 s0 <<<"$(proc_ticks "${CPU_PIDS[$key]}")"
  g0=$(data_segments)
  out=$(BODY_FILE=$(scenario_body "$scenario") "${PIN_LOAD[@]}" wrk -t1 -c"$(scenario_conns "$scenario")" \
    -d"${seconds}s" --timeout 2s -s "$HERE/post.lua" \
    "$(url "$key")$(scenario_path "$scenario")" 2>&1) ||
    die "wrk against $target ($scenario) failed: $out"
  read -r t1 s1 <<<"$(proc_ticks "${CPU_PIDS[$key]}")"
  g1=$(data_segments)
  c1=$(core_busy)
  grep -q '^RESULT' <<<"$out" || die "wrk against $target ($scenario) gave no result: $out"
  printf '%s ticks=%d core0=%d sys=%d segments=%d\n' "$(grep '^RESULT' <<<"$out")" $((t1 - t0)) \
    $((c1 - c0)) $((s1 - s0)) $((g1 - g0))
}

# One line per run: scenario target round requests duration_us p50 p99 status_err socket_err
# ticks core0 sys (the proxy's system-time ticks, part of ticks) segments (TCP segments with
# data sent on the machine during the run: every leg, client, proxy and backend)
printf 'scenario\ttarget\tround\trequests\tduration_us\tp50_us\tp99_us\tstatus_errors\tsocket_errors\tticks\tcore0\tsys\tsegments\n' >"$RESULTS"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
for scenario in $SCENARIOS; do
  targets=()
  for target in "${active[@]}"; do [[ -z ${EXCLUDED[$scenario.$target]:-} ]] && targets+=("$target"); done
  log "$scenario: warm-up ${WARMUP}s each: ${targets[*]}"
  if ((WARMUP > 0)); then
    for target in "${targets[@]}"; do run_wrk "$scenario" "$target" "$WARMUP" >/dev/null; done
  fi
  for round in $(seq 1 "$ROUNDS"); do
    for target in "${targets[@]}"; do
      line=$(run_wrk "$scenario" "$target" "$DURATION")
      log "$scenario round $round $target: $line"
      # RESULT requests=.. duration_us=.. p50_us=.. p99_us=.. status_errors=.. socket_errors=..
      # ticks=.. core0=.. sys=.. segments=..
      printf '%s\t%s\t%s\t%s\n' "$scenario" "$target" "$round" \
        "$(sed -e 's/^RESULT //' -e 's/[a-z_0-9]*=//g' -e 's/ /\t/g' <<<"$line")" >>"$RESULTS"
    done
  done
done
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

# --- Report --------------------------------------------------------------------------------------------

commit=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
[[ -z $(git status --porcelain -- src Cargo.toml Cargo.lock 2>/dev/null) ]] ||
  commit="$commit (with uncommitted changes in src/ or Cargo.*)"
cat <<EOF
## proxy_compare: $(date -u +%Y-%m-%d) at $commit

Machine: nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average $LOAD_START at the start, $LOAD_END at the end.
Tools: $(nginx -v 2>&1 | sed 's/.*: //'), HAProxy $(haproxy -v | awk 'NR==1{print $3}'), $(wrk --version 2>&1 | awk 'NR==1{print $1, $2}'). Cores: $LAYOUT.
Runs: $ROUNDS rounds x ${DURATION}s per target and scenario, interleaved (${active[*]}), after ${WARMUP}s of warm-up each; wrk -t1, $CONNS connections ($LAT_CONNS in the latency scenario).
Cells: median [min-max] over the rounds. CPU: utime+stime of the proxy process (all threads; nginx: master + worker) over the run / requests, the share of it that is stime ("in the kernel"), and its share of one core ("busy"); the direct row gives the backend's own. Other load on core 0: core 0's busy time minus the proxy's.
EOF
if [[ -n ${CPU_PIDS[warmpath]:-} ]]; then
  echo "warmpath: $WARMPATH built $(date -u -r "$WARMPATH" '+%Y-%m-%d %H:%M UTC'), sha256 $(sha256sum "$WARMPATH" | cut -c1-12); $SHARDS shard(s)."
fi
if [[ -n ${CPU_PIDS[warmpath-b]:-} ]]; then
  echo "warmpath-b: $WARMPATH_B built $(date -u -r "$WARMPATH_B" '+%Y-%m-%d %H:%M UTC'), sha256 $(sha256sum "$WARMPATH_B" | cut -c1-12); environment: ${WARMPATH_B_ENV:-none}; arguments: ${WARMPATH_B_ARGS:-none}; $SHARDS shard(s)."
fi
for key in "${!EXCLUDED[@]}"; do echo "Excluded ${key#*.} from ${key%%.*}: ${EXCLUDED[$key]}."; done
echo

awk -F'\t' -v scenarios="$SCENARIOS" -v targets="${active[*]}" -v tck="$CLK_TCK" -v lat_conns="$LAT_CONNS" \
  -v pinned=$((${#PIN_PROXY[@]} > 0)) '
  function sort(a, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t } }
  function median(a, n) { return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2 }
  function grp(n,   s, out) { s = sprintf("%.0f", n); out = ""
    while (length(s) > 3) { out = "," substr(s, length(s) - 2) out; s = substr(s, 1, length(s) - 3) }
    return s out }
  function fmt(v, d) { return d == "k" ? grp(v) : sprintf("%." d "f", v) }
  # cell(KEY, METRIC, DIGITS): "median [min-max]" over the rounds; stores the median in MED
  function add(key, m, v) { val[key, m, ++num[key, m]] = v }
  function cell(key, m, d,   a, n, i) {
    n = num[key, m]; if (!n) return "-"
    for (i = 1; i <= n; i++) a[i] = val[key, m, i]
    sort(a, n); med[key, m] = median(a, n)
    return n == 1 ? fmt(a[1], d) : fmt(med[key, m], d) " [" fmt(a[1], d) "-" fmt(a[n], d) "]"
  }
  NR > 1 {
    key = $1 SUBSEP $2; cnt[key]++
    secs = $5 / 1e6; cpu = $10 / tck
    add(key, "rps", $4 / secs); add(key, "busy", 100 * cpu / secs)
    # /proc/stat is tick-sampled per core, the process time exact: a few % of disagreement.
    other = 100 * ($11 - ($2 == "direct" ? 0 : $10)) / tck / secs
    add(key, "other", other < 0 ? 0 : other)
    # A run that completed no request has no latency and no CPU per request: it is counted
    # as stalled and left out of those medians.
    if ($10 > 0) add(key, "sys", 100 * $12 / $10)
    if ($4 > 0) { add(key, "p50", $6); add(key, "p99", $7); add(key, "cpu", cpu * 1e6 / $4)
      add(key, "segs", $13 / $4) }
    else stalled[key]++
    errs[key] += $8; sock[key] += $9
    if ($2 != "direct" && $4 >= 1000 && (min_ticks == "" || $10 < min_ticks)) min_ticks = $10
  }
  END {
    ns = split(scenarios, sc, " "); nt = split(targets, tg, " ")
    for (s = 1; s <= ns; s++) {
      S = sc[s]
      printf "### %s\n\n", S
      print "| target | req/s | p50 us | p99 us | CPU us/req | of it in the kernel % | proxy busy % | other load on core 0 % | data segments / req | status>=400 / socket errors | runs with no response |"
      print "|---|---|---|---|---|---|---|---|---|---|---|"
      for (t = 1; t <= nt; t++) {
        T = tg[t]; key = S SUBSEP T
        if (!cnt[key]) continue
        printf "| %s | %s | %s | %s | %s%s | %s | %s%s | %s | %s | %d / %d | %d of %d |\n", T == "direct" ? "direct (baseline)" : T,
          cell(key, "rps", "k"), cell(key, "p50", 0), cell(key, "p99", 0),
          T == "direct" ? "backend " : "", cell(key, "cpu", 1), cell(key, "sys", 0),
          T == "direct" ? "backend " : "", cell(key, "busy", 0),
          pinned ? cell(key, "other", 0) : "-", cell(key, "segs", 1), errs[key], sock[key],
          stalled[key], cnt[key]
      }
      print ""
      d = S SUBSEP "direct"; w = S SUBSEP "warmpath"; x = S SUBSEP "nginx"
      # A target that answered (almost) nothing stalled: its latency and CPU figures come from
      # a handful of requests and are left out of the comparisons below.
      for (t = 1; t <= nt; t++) { T = tg[t]; k = S SUBSEP T
        broken[k] = cnt[k] && (stalled[k] || (cnt[d] && med[k, "rps"] < 0.05 * med[d, "rps"]))
        if (broken[k]) printf "**%s stalled**: %s req/s, %d of %d runs with no response at all; left out of the comparisons.\n",
          T, grp(med[k, "rps"]), stalled[k], cnt[k] }
      if (num[w, "cpu"] && num[x, "cpu"] && !broken[w] && !broken[x])
        printf "warmpath / nginx: CPU per request %.2f (target <= %s), req/s %.2f (target >= 1.2).\n",
          med[w, "cpu"] / med[x, "cpu"], S == "tls" ? "0.8, both with TLS" : "0.7", med[w, "rps"] / med[x, "rps"]
      for (h = 1; h <= 2; h++) { H = h == 1 ? "haproxy" : "haproxy-nd"; y = S SUBSEP H
        if (num[w, "cpu"] && num[y, "cpu"] && !broken[w] && !broken[y])
          printf "warmpath / %s: CPU per request %.2f%s.\n", H, med[w, "cpu"] / med[y, "cpu"],
            S == "stream" ? " (target <= 0.8)" : "" }
      if (num[d, "p50"]) {
        line = ""
        for (t = 1; t <= nt; t++) { T = tg[t]; k = S SUBSEP T
          if (T != "direct" && num[k, "p50"] && !broken[k]) line = line sprintf("%s%s %+.0f us", line == "" ? "" : ", ", T, med[k, "p50"] - med[d, "p50"]) }
        if (line != "") printf "p50 over direct: %s%s.\n", line, S == "latency" ? " (target for warmpath: <= 30 us)" : ""
      }
      if (S == "latency") {
        line = ""
        for (t = 1; t <= nt; t++) { T = tg[t]; k = S SUBSEP T; p = "small" SUBSEP T
          if (cnt[k] && cnt[p]) line = line sprintf("%s%s %.0f%%", line == "" ? "" : ", ", T, 100 * med[k, "rps"] / med[p, "rps"]) }
        if (line != "") printf "Rate with %d connection(s) as a share of the same target'"'"'s small-scenario peak: %s.\n", lat_conns, line
      }
      print ""
    }
    if (min_ticks != "") printf "CPU resolution: the smallest proxy sample was %d ticks of 1/%d s (%.1f%% per tick).\n", min_ticks, tck, 100 / min_ticks
  }' "$RESULTS"

# Anything warmpath said on stderr/stdout during the run (errors, warnings).
if [[ -n ${CPU_PIDS[warmpath]:-} && -s $TMP/warmpath.log ]]; then
  echo
  echo "warmpath log (last 10 lines):"
  echo '```'
  tail -n 10 "$TMP/warmpath.log"
  echo '```'
fi
