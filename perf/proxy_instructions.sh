#!/usr/bin/env bash
# Instructions per proxied request, counted by callgrind: warmpath binaries side by side, in
# front of perf/proxy_compare.sh's static nginx backend. Unlike CPU time, an instruction count
# does not move with what else the machine is doing, so two builds can be compared on a busy
# machine. It counts the router's user-space instructions only (not the kernel's socket work,
# not cache misses): a complement to perf/proxy_compare.sh, not a substitute.
#
# Per binary: two runs under callgrind (all threads summed), one with WARMUP requests only and
# one with WARMUP requests and then wrk for DURATION seconds at CONNS connections; the difference of the
# instruction totals divided by the difference of the 200 answers the router counted
# (warmpath_requests_total on its admin listener, read before shutdown).
#
# In the stream scenario the backend flushes each event as it is generated; a router slowed by
# valgrind reads several per read, as many as it lags, so a stream's count depends on the
# router's speed. EVENT_GAP_MS > 0 has the backend pause that long after each event
# (echo_sleep), so that every event is its own read whatever the router's speed and the counts
# of two builds compare.
#
# Usage: perf/proxy_instructions.sh BINARY...
# Environment (defaults): SCENARIO=small (or stream, body64k) SHARDS=1 CONNS=4 DURATION=10 WARMUP=200
#   BASE_PORT=18300 EVENT_GAP_MS=0 KEEP_DIR= (when set, each binary's callgrind output of the
#   run with wrk is kept there, for callgrind_annotate). Needs valgrind, wrk and nginx with the echo module (as proxy_compare.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
HERE=$REPO/perf/proxy
SCENARIO=${SCENARIO:-small}
SHARDS=${SHARDS:-1}
CONNS=${CONNS:-4}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-200}
BASE_PORT=${BASE_PORT:-18300}
EVENT_GAP_MS=${EVENT_GAP_MS:-0}
KEEP_DIR=${KEEP_DIR:-}
ECHO_MODULE=/usr/lib/nginx/modules/ngx_http_echo_module.so
(($# > 0)) || { sed -n '2,22p' "$0" >&2; exit 2; }
for tool in valgrind wrk nginx curl; do
  command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done

# shellcheck source=perf/proxy/measure.sh
source "$HERE/measure.sh"

nginx -p "$TMP/backend" -c "$TMP/backend/nginx.conf" -e "$TMP/backend/error.log" &
PIDS+=($!)
ready "http://127.0.0.1:$BACKEND_PORT/health" || { echo "backend did not start" >&2; exit 1; }

# callgrind_control cannot zero an idle process (it answers only while a thread runs code, and
# warmpath's threads all sleep in epoll_wait when idle), so each binary runs twice, to exit:
# once with the warm-up alone, once with the warm-up and the wrk run. The difference of the two
# totals over the difference of the answers is what the requests cost, start-up and shutdown
# cancelling out.
run_once() { # BINARY WITH_WRK -> "instructions answered"
  local bin=$1 with_wrk=$2 out=$TMP/cg.out pid n ir
  rm -f "$out"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" serve \
    --config "$TMP/warmpath/warmpath.toml" >"$TMP/router.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  ready "http://127.0.0.1:$PORT/readyz" || { echo "$bin did not start; its log:" >&2; tail "$TMP/router.log" >&2; exit 1; }
  for _ in $(seq 1 "$WARMUP"); do
    curl -fsS -o /dev/null -H 'Content-Type: application/json' --data-binary @"$TMP/body.json" \
      "http://127.0.0.1:$PORT$path"
  done
  if ((with_wrk)); then
    BODY_FILE=$TMP/body.json wrk -t1 -c"$CONNS" -d"${DURATION}s" --timeout 10s -s "$HERE/post.lua" \
      "http://127.0.0.1:$PORT$path" >"$TMP/wrk.log" 2>&1
  fi
  n=$(answered)
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  ir=$(awk '/^(summary|totals):/ { print $2; exit }' "$out")
  [[ -n $ir ]] || { echo "no callgrind totals for $bin" >&2; exit 1; }
  if ((with_wrk)) && [[ -n $KEEP_DIR ]]; then
    mkdir -p "$KEEP_DIR"
    cp "$out" "$KEEP_DIR/callgrind.$SCENARIO.$(basename "$bin")"
  fi
  echo "$ir $n"
}

echo "| binary | sha256 | scenario | shards | requests measured | instructions per request |"
echo "|---|---|---|---|---|---|"
for bin in "$@"; do
  read -r ir0 n0 < <(run_once "$bin" 0)
  read -r ir1 n1 < <(run_once "$bin" 1)
  n=$((n1 - n0))
  ((n > 0)) || { echo "$bin answered nothing during the wrk run" >&2; exit 1; }
  printf '| %s | %s | %s | %s | %d | %.0f |\n' "$bin" "$(sha256sum "$bin" | cut -c1-12)" \
    "$SCENARIO" "$SHARDS" "$n" "$(echo "($ir1 - $ir0) / $n" | bc -l)"
done
