#!/usr/bin/env bash
# Scale-out test (issue [6/6], docs/scale-out.md): HAProxy hashing on X-Session-ID
# (balance hdr(X-Session-ID), hash-type consistent, health checks on /healthz) in front of two
# warmpath replicas r1 and r2 (session-boost + session-affinity, debug_headers = true), both in
# front of the same two `warmpath sim` engines, all on 127.0.0.1. HAProxy names the replica
# that answered in an X-Replica response header.
#
# perf/scale_out_client.py drives multi-turn sessions through HAProxy and checks that
#   - every turn of a session reaches the replica that served its previous turn, every
#     follow-up is boosted there, and the replicas' /metrics (warmpath_admitted_total by lane)
#     agree with the response headers;
#   - after r1 gets SIGTERM mid-traffic, every request still succeeds, r2's sessions do not
#     move, and each of r1's sessions moves to r2 and loses its boost exactly once;
#   - after r1 is started again, exactly the sessions that hash to r1 come back to it.
# Exits non-zero on any failed check (the client prints one line per check).
#
# Usage: perf/scale_out_test.sh                (build first: cargo build --release)
# Environment (defaults): WARMPATH=target/release/warmpath BASE_PORT=19400 (uses +1 .. +21)
#   SIM_SCALE=8 SESSIONS=32 TURNS=3 (per phase) CONCURRENCY=8 (sessions in flight)
#   KEEP_TMP=0 (1 keeps configs and logs)
# Needs haproxy and curl (apt-get installs them when run as root) and python3. Takes about
# 10 seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=perf/lib.sh
. perf/lib.sh

WARMPATH=${WARMPATH:-target/release/warmpath}
BASE_PORT=${BASE_PORT:-19400}
SIM_SCALE=${SIM_SCALE:-8}
SESSIONS=${SESSIONS:-32}
TURNS=${TURNS:-3}
CONCURRENCY=${CONCURRENCY:-8}
KEEP_TMP=${KEEP_TMP:-0}

[[ -x $WARMPATH ]] || die "no $WARMPATH: run cargo build --release"
if ! command -v haproxy >/dev/null || ! command -v curl >/dev/null; then
  ((EUID == 0)) || die "missing haproxy or curl: apt-get install -y haproxy curl"
  log "installing haproxy curl (apt-get)"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy curl >/dev/null
fi

TMP=$(mktemp -d -t scale_out.XXXXXX)
cleanup() {
  # r1's second life was started by the client: its pid is in a file.
  [[ -s $TMP/r1-again.pid ]] && stop_pid "$(cat "$TMP/r1-again.pid")"
  stop_all
  if [[ $KEEP_TMP == 1 ]]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

SIM1=$((BASE_PORT + 1)) SIM2=$((BASE_PORT + 2))
R1=$((BASE_PORT + 11)) A1=$((BASE_PORT + 12)) R2=$((BASE_PORT + 13)) A2=$((BASE_PORT + 14))
HAP=$((BASE_PORT + 20)) STATS=$((BASE_PORT + 21))
require_free_ports "$SIM1" "$SIM2" "$R1" "$A1" "$R2" "$A2" "$HAP" "$STATS"

start_sims "$SIM1" "$SIM2" "$TMP"
EXTRA_SERVER="debug_headers = true" warmpath_config boost-sa "$R1" "$A1" "$SIM1" "$SIM2" >"$TMP/r1.toml"
EXTRA_SERVER="debug_headers = true" warmpath_config boost-sa "$R2" "$A2" "$SIM1" "$SIM2" >"$TMP/r2.toml"
start_bg "$TMP/r1.log" "$WARMPATH" serve --config "$TMP/r1.toml"
R1_PID=$LAST_PID
start_bg "$TMP/r2.log" "$WARMPATH" serve --config "$TMP/r2.toml"
wait_http "http://127.0.0.1:$R1/readyz" && wait_http "http://127.0.0.1:$R2/readyz"

{
  haproxy_config "$HAP" 0 /healthz "r1=$R1" "r2=$R2"
  cat <<EOF

listen stats
    bind 127.0.0.1:$STATS
    stats enable
    stats uri /stats
EOF
} >"$TMP/haproxy.cfg"
haproxy -c -q -f "$TMP/haproxy.cfg" || die "haproxy rejected $TMP/haproxy.cfg"
start_bg "$TMP/haproxy.log" haproxy -db -f "$TMP/haproxy.cfg"
wait_http "http://127.0.0.1:$HAP/healthz"
sleep 0.5 # HAProxy's first health checks; the replicas' first engine scrapes
log "HAProxy on 127.0.0.1:$HAP in front of r1 (127.0.0.1:$R1) and r2 (127.0.0.1:$R2)"

status=0
python3 perf/scale_out_client.py --haproxy-port "$HAP" --stats-port "$STATS" \
  --admin "r1=$A1" --admin "r2=$A2" --r1-pid "$R1_PID" --r1-port "$R1" \
  --r1-start "'$WARMPATH' serve --config '$TMP/r1.toml' >'$TMP/r1-again.log' 2>&1 & echo \$! | tee '$TMP/r1-again.pid'" \
  --sessions "$SESSIONS" --turns "$TURNS" --concurrency "$CONCURRENCY" || status=$?
if ((status != 0)); then
  log "scale-out test FAILED; the last lines of the logs:"
  for f in r1 r2 r1-again haproxy; do
    [[ -s $TMP/$f.log ]] && { log "--- $f"; tail -n 5 "$TMP/$f.log" >&2; }
  done
fi
exit "$status"
