#!/usr/bin/env bash
# System calls per proxied request, counted by `strace -c -f`: warmpath binaries side by side, in
# front of perf/proxy_compare.sh's static nginx backend. A syscall count, like an instruction
# count, does not move with what else the machine is doing (how the kernel batches events does
# move a little with timing: `epoll_wait` returns fewer, larger batches under load), so two
# builds can be compared on a busy machine. strace slows the router several-fold: the counts
# are what it is for, not the times.
#
# Per binary: start it (one shard unless SHARDS), warm up with WARMUP requests, attach
# `strace -c -f` to every thread, run wrk for DURATION seconds at CONNS connections, detach;
# calls of each syscall divided by the 200 answers the router counted over the run
# (warmpath_requests_total on its admin listener). Every thread is counted (the control
# thread's health and metrics probes included: a few calls a second).
#
# BACKEND=split puts perf/proxy/split_backend.py behind the router instead (small scenario
# only): it writes each response's head and body in two sends 1 ms apart, as uvicorn (vLLM's
# server) does, so the router reads them apart and shows whether it writes them apart.
#
# RATE (requests/s) replaces wrk's closed loop with `BINARY bench --workload fixed-rate` at that
# paced rate over CONNS connections (the small scenario only): requests that arrive one at a
# time, as in perf/latency_open_loop.sh, where no event loop wake-up is shared by two requests.
#
# EVENT_GAP_MS > 0 has the stream's backend pause that long after each event (echo_sleep), so
# that each event is its own read (see perf/proxy_instructions.sh).
#
# Usage: perf/proxy_syscalls.sh BINARY...
# Environment (defaults): SCENARIO=small (or stream, body64k) SHARDS=1 CONNS=4 DURATION=5
#   WARMUP=200 BASE_PORT=18400 BACKEND=nginx (or split) EVENT_GAP_MS=0 RATE=. Needs strace, wrk and nginx with the
#   echo module (as proxy_compare.sh); python3 for BACKEND=split.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
HERE=$REPO/perf/proxy
SCENARIO=${SCENARIO:-small}
SHARDS=${SHARDS:-1}
CONNS=${CONNS:-4}
DURATION=${DURATION:-5}
WARMUP=${WARMUP:-200}
BASE_PORT=${BASE_PORT:-18400}
BACKEND=${BACKEND:-nginx}
EVENT_GAP_MS=${EVENT_GAP_MS:-0}
RATE=${RATE:-}
[[ -z $RATE || $SCENARIO == small ]] || { echo "RATE is for the small scenario" >&2; exit 2; }
ECHO_MODULE=/usr/lib/nginx/modules/ngx_http_echo_module.so
(($# > 0)) || { sed -n '2,25p' "$0" >&2; exit 2; }
for tool in strace wrk nginx curl; do
  command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done

# shellcheck source=perf/proxy/measure.sh
source "$HERE/measure.sh"

case $BACKEND in
  nginx) nginx -p "$TMP/backend" -c "$TMP/backend/nginx.conf" -e "$TMP/backend/error.log" & ;;
  split) python3 "$HERE/split_backend.py" "$BACKEND_PORT" & ;;
  *) echo "BACKEND is nginx or split" >&2; exit 2 ;;
esac
PIDS+=($!)
ready "http://127.0.0.1:$BACKEND_PORT/health" || { echo "backend did not start" >&2; exit 1; }

# The summary table of `strace -c`: "% time seconds usecs/call calls [errors] syscall".
per_request() { # STRACE_OUT REQUESTS -> "name=calls/request ..." (0.01 and above), total
  awk -v n="$2" '
    $1 ~ /^[0-9.]+$/ && NF >= 5 && $NF != "total" {
      calls = $4; name = $NF; per = calls / n; total += per
      if (per >= 0.01) line = line sprintf("%s %.2f, ", name, per)
    }
    END { sub(/, $/, "", line); printf "%.2f | %s\n", total, line }' "$1"
}

echo "| binary | sha256 | scenario | backend | shards | conns | load | requests measured | syscalls per request | of which (per request) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for bin in "$@"; do
  "$bin" serve --config "$TMP/warmpath/warmpath.toml" >"$TMP/router.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  ready "http://127.0.0.1:$PORT/readyz" || { echo "$bin did not start; its log:" >&2; tail "$TMP/router.log" >&2; exit 1; }
  for _ in $(seq 1 "$WARMUP"); do
    curl -fsS -o /dev/null -H 'Content-Type: application/json' --data-binary @"$TMP/body.json" \
      "http://127.0.0.1:$PORT$path"
  done
  n0=$(answered)
  strace -c -f -p "$pid" -o "$TMP/strace.out" 2>"$TMP/strace.log" &
  spid=$!
  sleep 1 # attached to every thread
  if [[ -n $RATE ]]; then
    "$bin" bench --workload fixed-rate --target "http://127.0.0.1:$PORT" --model bench-model \
      --rate "$RATE" --duration "${DURATION}s" --connections "$CONNS" --label paced \
      --out "$TMP/out" --no-progress >"$TMP/load.log" 2>&1
  else
    BODY_FILE=$TMP/body.json wrk -t1 -c"$CONNS" -d"${DURATION}s" --timeout 10s -s "$HERE/post.lua" \
      "http://127.0.0.1:$PORT$path" >"$TMP/load.log" 2>&1
  fi
  n1=$(answered)
  load=wrk
  [[ -z $RATE ]] || load="$RATE/s paced"
  kill -INT "$spid"
  wait "$spid" 2>/dev/null || true
  [[ -z ${KEEP_STRACE:-} ]] || cp "$TMP/strace.out" "$KEEP_STRACE.$(basename "$bin")"
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  n=$((n1 - n0))
  ((n > 0)) || { echo "$bin answered nothing during the load run" >&2; exit 1; }
  printf '| %s | %s | %s | %s | %s | %s | %s | %d | %s |\n' "$bin" "$(sha256sum "$bin" | cut -c1-12)" \
    "$SCENARIO" "$BACKEND" "$SHARDS" "$CONNS" "$load" "$n" \
    "$(per_request "$TMP/strace.out" "$n")"
done
