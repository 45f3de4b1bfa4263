# shellcheck shell=bash
# What perf/proxy_instructions.sh and perf/proxy_syscalls.sh share, sourced by both: a
# temporary directory cleaned up on exit (with every process in PIDS), the ports from
# BASE_PORT, the static nginx backend's and warmpath's configurations rendered from this
# directory's templates, the backend's 50-event stream (EVENT_GAP_MS apart), SCENARIO's request
# body in $TMP/body.json and its path in $path, and two helpers: `ready URL` and `answered`
# (the router's 200 answers so far). The caller sets HERE, SCENARIO, SHARDS, EVENT_GAP_MS,
# BASE_PORT and ECHO_MODULE first, and starts the backend itself.

TMP=$(mktemp -d)
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT

BACKEND_PORT=$BASE_PORT PORT=$((BASE_PORT + 1)) ADMIN_PORT=$((BASE_PORT + 2))
render() { # TEMPLATE OUT DIR PORT
  sed -e "s|@DIR@|$3|g" -e "s|@PORT@|$4|g" -e "s|@BACKEND_PORT@|$BACKEND_PORT|g" \
    -e "s|@ADMIN_PORT@|$ADMIN_PORT|g" -e "s|@ECHO_MODULE@|$ECHO_MODULE|g" \
    -e "s|@SHARDS@|$SHARDS|g" "$HERE/$1" >"$2"
}
mkdir -p "$TMP/backend" "$TMP/warmpath"
render backend-nginx.conf "$TMP/backend/nginx.conf" "$TMP/backend" "$BACKEND_PORT"
render warmpath.toml "$TMP/warmpath/warmpath.toml" "$TMP/warmpath" "$PORT"
for i in $(seq 1 50); do
  printf "echo -n 'data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"token%02d \"}}]}\\\\n\\\\n';\necho_flush;\n" "$i"
  if ((EVENT_GAP_MS > 0)); then printf "echo_sleep %.3f;\n" "$(echo "$EVENT_GAP_MS / 1000" | bc -l)"; fi
done >"$TMP/backend/sse.conf"
printf "echo -n 'data: [DONE]\\\\n\\\\n';\n" >>"$TMP/backend/sse.conf"
body='{"model":"bench-model","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}'
path=/v1/chat/completions
case $SCENARIO in
  small) ;;
  stream) body="${body%\}},\"stream\":true}" path=/v1/stream/chat/completions ;;
  body64k) # 65,536 bytes exactly, as perf/proxy_compare.sh's: the user message padded
    body=$(printf '{"model":"bench-model","messages":[{"role":"user","content":"Say hello.%s"}],"max_tokens":16}' \
      "$(head -c $((65536 - ${#body})) /dev/zero | tr '\0' 'x')") ;;
  *) echo "SCENARIO is small, stream or body64k" >&2; exit 2 ;;
esac
printf '%s' "$body" >"$TMP/body.json"

ready() { for _ in {1..300}; do curl -fsS -o /dev/null --max-time 1 "$1" 2>/dev/null && return 0; sleep 0.1; done; return 1; }

answered() { # the router's 200 answers so far
  curl -fsS "http://127.0.0.1:$ADMIN_PORT/metrics" |
    awk '/^warmpath_requests_total\{.*status="200"/ { n += $2 } END { print n + 0 }'
}
