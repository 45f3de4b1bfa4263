#!/usr/bin/env bash
# When a streamed response's events reach the client through each proxy (issue [12]: "no event
# delayed by more than one read"), against the backend direct.
#
# The stream scenario's nginx backend (perf/proxy/measure.sh) with EVENT_GAP_MS (default 20)
# between its 50 events, each flushed on its own; one client on one keep-alive connection
# (perf/proxy/event_times.py) sends ROUNDS stream requests one after the other through each
# target and records when each event arrives. A proxy that relays each event as it comes shows
# the backend's gap between events and one read per event; one that holds events shows them in
# bursts (fewer reads than events) and a later first event. The report gives, per target, the
# medians over the rounds of: the first event's arrival (ms after the request), the last's, the
# reads the 51 events (50 and [DONE]) took, and the most events one read brought.
#
# Targets: direct (the backend), warmpath (WARMPATH, one shard), nginx (perf/proxy's reverse
# proxy: proxy_buffering off), haproxy (perf/proxy/haproxy.cfg, its default framing) and
# haproxy-nd (the same with `option http-no-delay`). Nothing is pinned or loaded: one request
# at a time, so every figure is the proxy's framing, not its speed.
#
# Usage: perf/event_delay.sh            (build warmpath first: cargo build --release)
# Environment (defaults): EVENT_GAP_MS=20 ROUNDS=5 WARMPATH=target/release/warmpath
#   BASE_PORT=18600. Needs nginx with the echo module, haproxy, curl and python3. Everything
#   listens on 127.0.0.1 only; every process it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
HERE=$REPO/perf/proxy
SCENARIO=stream
SHARDS=1
EVENT_GAP_MS=${EVENT_GAP_MS:-20}
ROUNDS=${ROUNDS:-5}
WARMPATH=${WARMPATH:-target/release/warmpath}
BASE_PORT=${BASE_PORT:-18600}
ECHO_MODULE=/usr/lib/nginx/modules/ngx_http_echo_module.so
for tool in nginx haproxy curl python3; do
  command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done

source "$HERE/measure.sh"
NGINX_PORT=$((BASE_PORT + 3)) HAPROXY_PORT=$((BASE_PORT + 4)) HAPROXY_ND_PORT=$((BASE_PORT + 5))
mkdir -p "$TMP/nginx" "$TMP/haproxy" "$TMP/haproxy-nd"
render proxy-nginx.conf "$TMP/nginx/nginx.conf" "$TMP/nginx" "$NGINX_PORT"
sed -i '/@TLS_PORT@\|ssl_certificate/d' "$TMP/nginx/nginx.conf" # no TLS listener here
render haproxy.cfg "$TMP/haproxy/haproxy.cfg" "$TMP/haproxy" "$HAPROXY_PORT"
render haproxy.cfg "$TMP/haproxy-nd/haproxy.cfg" "$TMP/haproxy-nd" "$HAPROXY_ND_PORT"
sed -i 's/^    option http-keep-alive$/&\n    option http-no-delay/' "$TMP/haproxy-nd/haproxy.cfg"

nginx -p "$TMP/backend" -c "$TMP/backend/nginx.conf" -e "$TMP/backend/error.log" &
PIDS+=($!)
"$WARMPATH" serve --config "$TMP/warmpath/warmpath.toml" >"$TMP/router.log" 2>&1 &
PIDS+=($!)
nginx -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -e "$TMP/nginx/error.log" &
PIDS+=($!)
for target in haproxy haproxy-nd; do
  haproxy -db -f "$TMP/$target/haproxy.cfg" >"$TMP/$target.log" 2>&1 &
  PIDS+=($!)
done
declare -A TARGET_PORT=([direct]=$BACKEND_PORT [warmpath]=$PORT [nginx]=$NGINX_PORT
  [haproxy]=$HAPROXY_PORT [haproxy-nd]=$HAPROXY_ND_PORT)
ready "http://127.0.0.1:$BACKEND_PORT/health" || { echo "backend did not start" >&2; exit 1; }
ready "http://127.0.0.1:$PORT/readyz" || { echo "warmpath did not start" >&2; exit 1; }
for target in nginx haproxy haproxy-nd; do
  ready "http://127.0.0.1:${TARGET_PORT[$target]}/health" ||
    { echo "$target did not start" >&2; exit 1; }
done

echo "## event_delay: $(date -u +%Y-%m-%d) at $(git rev-parse --short HEAD)"
echo
echo "50 events and [DONE], $EVENT_GAP_MS ms apart at the backend; $ROUNDS responses per target"
echo "on one connection; medians over the responses. warmpath: $WARMPATH, sha256"
echo "$(sha256sum "$WARMPATH" | cut -c1-12)."
echo
echo "| target | first event ms | last event ms | reads for the 51 events | most in one read |"
echo "|---|---|---|---|---|"
for target in direct warmpath nginx haproxy haproxy-nd; do
  python3 "$HERE/event_times.py" "${TARGET_PORT[$target]}" "$path" "$TMP/body.json" "$ROUNDS" |
    python3 -c '
import json, statistics, sys
rows = [json.loads(line) for line in sys.stdin]
def med(f): return statistics.median(f(r) for r in rows)
def burst(r):
    t = r["events_ms"]
    return max(t.count(x) for x in t)
assert all(len(r["events_ms"]) == 51 for r in rows), [len(r["events_ms"]) for r in rows]
print("| %s | %.1f | %.1f | %.0f | %.0f |" % (sys.argv[1], med(lambda r: r["events_ms"][0]),
      med(lambda r: r["events_ms"][-1]), med(lambda r: r["reads"]), med(burst)))
' "$target"
done
