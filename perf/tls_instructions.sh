#!/usr/bin/env bash
# Instructions per proxied request with TLS (issue [11]): warmpath against nginx, each counted
# by callgrind, in front of perf/proxy_compare.sh's static nginx backend (plaintext, not
# counted). An instruction count does not move with what else the machine runs, so the two
# proxies can be compared on a busy machine where CPU time cannot (perf/RESULTS.md). It counts
# each proxy's user-space instructions only (its own code and its TLS library: rustls + ring,
# nginx + OpenSSL's libssl/libcrypto; not the kernel's socket work, not cycles: an AES-NI
# instruction costs more than an add, alike for both since both use AES-NI). A complement to
# perf/proxy_compare.sh's `tls` scenario, not a substitute.
#
# Modes (MODES): `tls` (warmpath with [server.tls], nginx's TLS server block; both with the same
# openssl-made EC P-256 certificate) and `plain` (the same two without TLS), so the report also
# gives what TLS adds to each.
#
# Per proxy and mode: three runs under callgrind, each to exit: one with a single readiness
# request (I0), one with it and then wrk for SHORT seconds (I1, n1 requests), one with wrk for
# DURATION seconds (I2, n2); wrk sends the small chat request on CONNS keep-alive connections.
# "per request" = (I2 - I1) / (n2 - n1): start-up, shutdown and the CONNS handshakes are in
# both runs and cancel, so this is the record layer and the proxying, per request on an open
# connection. "with handshakes" = (I2 - I0) / n2: the same plus the CONNS handshakes amortised
# over that run's requests (under callgrind a proxy serves fewer requests than natively, so this
# weighs the handshakes more than a native run would). nginx runs with `master_process off`
# (one process) under callgrind.
#
# Usage: perf/tls_instructions.sh [WARMPATH_BINARY]   (default target/release/warmpath)
# Environment (defaults): MODES="tls plain" CONNS=4 SHORT=2 DURATION=10 ROUNDS=1 BASE_PORT=18500.
# Needs valgrind, wrk, nginx with the echo module, openssl, curl, bc.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
HERE=$REPO/perf/proxy
WARMPATH=${1:-target/release/warmpath}
MODES=${MODES:-tls plain}
CONNS=${CONNS:-4}
DURATION=${DURATION:-10}
SHORT=${SHORT:-2}
ROUNDS=${ROUNDS:-1}
BASE_PORT=${BASE_PORT:-18500}
ECHO_MODULE=/usr/lib/nginx/modules/ngx_http_echo_module.so
for tool in valgrind wrk nginx curl openssl bc; do
  command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done

TMP=$(mktemp -d)
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT

BACKEND_PORT=$BASE_PORT PORT=$((BASE_PORT + 1)) ADMIN_PORT=$((BASE_PORT + 2)) TLS_PORT=$((BASE_PORT + 3))
render() { # TEMPLATE OUT DIR PORT
  sed -e "s|@DIR@|$3|g" -e "s|@PORT@|$4|g" -e "s|@BACKEND_PORT@|$BACKEND_PORT|g" \
    -e "s|@ADMIN_PORT@|$ADMIN_PORT|g" -e "s|@ECHO_MODULE@|$ECHO_MODULE|g" -e "s|@SHARDS@|1|g" \
    -e "s|@TLS_PORT@|$TLS_PORT|g" -e "s|@TLS_DIR@|$TMP/tls|g" "$HERE/$1" >"$2"
}
mkdir -p "$TMP/backend" "$TMP/warmpath" "$TMP/nginx" "$TMP/tls"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj /CN=localhost -keyout "$TMP/tls/key.pem" -out "$TMP/tls/cert.pem" 2>/dev/null
render backend-nginx.conf "$TMP/backend/nginx.conf" "$TMP/backend" "$BACKEND_PORT"
render proxy-nginx.conf "$TMP/nginx/nginx.conf" "$TMP/nginx" "$PORT"
render warmpath.toml "$TMP/warmpath/plain.toml" "$TMP/warmpath" "$PORT"
cp "$TMP/warmpath/plain.toml" "$TMP/warmpath/tls.toml"
printf '\n[server.tls]\ncert = "%s"\nkey = "%s"\n' "$TMP/tls/cert.pem" "$TMP/tls/key.pem" \
  >>"$TMP/warmpath/tls.toml"
: >"$TMP/backend/sse.conf"
body='{"model":"bench-model","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}'
printf '%s' "$body" >"$TMP/body.json"
path=/v1/chat/completions

nginx -p "$TMP/backend" -c "$TMP/backend/nginx.conf" -e "$TMP/backend/error.log" &
PIDS+=($!)
ready() { for _ in {1..600}; do curl -kfsS -o /dev/null --max-time 2 "$1" 2>/dev/null && return 0; sleep 0.1; done; return 1; }
ready "http://127.0.0.1:$BACKEND_PORT/health" || { echo "backend did not start" >&2; exit 1; }

run_once() { # PROXY MODE SECONDS (0: no wrk) -> "instructions requests"
  local proxy=$1 mode=$2 seconds=$3 out=$TMP/cg.out pid url n=0 ir
  rm -f "$out"
  case $proxy.$mode in
    warmpath.*) url="http://127.0.0.1:$PORT" ;;
    nginx.plain) url="http://127.0.0.1:$PORT" ;;
    nginx.tls) url="https://127.0.0.1:$TLS_PORT" ;;
  esac
  [[ $proxy.$mode == warmpath.tls ]] && url="https://127.0.0.1:$PORT"
  if [[ $proxy == warmpath ]]; then
    valgrind --tool=callgrind --callgrind-out-file="$out" "$WARMPATH" serve \
      --config "$TMP/warmpath/$mode.toml" >"$TMP/proxy.log" 2>&1 &
  else
    valgrind --tool=callgrind --callgrind-out-file="$out" nginx -g 'master_process off;' \
      -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -e "$TMP/nginx/error.log" >"$TMP/proxy.log" 2>&1 &
  fi
  pid=$!
  PIDS+=("$pid")
  ready "$url/health$([[ $proxy == warmpath ]] && echo z || true)" ||
    { echo "$proxy ($mode) did not start; its log:" >&2; tail "$TMP/proxy.log" >&2; exit 1; }
  if ((seconds > 0)); then
    BODY_FILE=$TMP/body.json wrk -t1 -c"$CONNS" -d"${seconds}s" --timeout 10s -s "$HERE/post.lua" \
      "$url$path" >"$TMP/wrk.log" 2>&1
    n=$(awk '/^RESULT/ { for (i = 2; i <= NF; i++) if ($i ~ /^requests=/) { sub("requests=", "", $i); print $i } }' "$TMP/wrk.log")
    grep -q 'status_errors=0 socket_errors=0' "$TMP/wrk.log" ||
      { echo "$proxy ($mode): wrk saw errors: $(cat "$TMP/wrk.log")" >&2; exit 1; }
  fi
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  ir=$(awk '/^(summary|totals):/ { print $2; exit }' "$out")
  [[ -n $ir ]] || { echo "no callgrind totals for $proxy ($mode)" >&2; exit 1; }
  echo "$ir $n"
}

echo "| proxy | mode | round | requests (short, long run) | instructions per request | with handshakes |"
echo "|---|---|---|---|---|---|"
for round in $(seq 1 "$ROUNDS"); do
  for mode in $MODES; do
    for proxy in warmpath nginx; do
      read -r ir0 _ < <(run_once "$proxy" "$mode" 0)
      read -r ir1 n1 < <(run_once "$proxy" "$mode" "$SHORT")
      read -r ir2 n2 < <(run_once "$proxy" "$mode" "$DURATION")
      ((n2 > n1)) || { echo "$proxy ($mode): the long run answered no more than the short one" >&2; exit 1; }
      printf '| %s | %s | %d | %d, %d | %.0f | %.0f |\n' "$proxy" "$mode" "$round" "$n1" "$n2" \
        "$(echo "($ir2 - $ir1) / ($n2 - $n1)" | bc -l)" "$(echo "($ir2 - $ir0) / $n2" | bc -l)"
    done
  done
done
echo
echo "warmpath: $WARMPATH, sha256 $(sha256sum "$WARMPATH" | cut -c1-12); $(nginx -v 2>&1 | sed 's/.*: //'), $(openssl version)."
