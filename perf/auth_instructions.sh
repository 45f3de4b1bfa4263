#!/usr/bin/env bash
# Instructions per request of issue [11]'s key check and rate-limit buckets, counted by
# callgrind on the criterion bench binary (benches/auth.rs): repeatable whatever else the
# machine is doing, unlike wall time. Target: at most 1 µs per request for both together.
# Usage: perf/auth_instructions.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
cargo bench --bench auth --no-run 2>/dev/null
bin=$(ls -t target/release/deps/auth-* | grep -v '\.d$' | head -n 1)
out=$(mktemp -d)
# bench name, then the #[inline(never)] function whose inclusive cost per call is reported.
for pair in "reserve_settle:limit_request" "check_and_limit:check_and_limit"; do
  bench=${pair%%:*}
  function=${pair##*:}
  valgrind --tool=callgrind --callgrind-out-file="$out/cg.$bench" "$bin" --bench \
    --profile-time 2 "auth/limit/$bench\$" >/dev/null 2>&1
  callgrind_annotate --inclusive=yes --tree=calling "$out/cg.$bench" 2>/dev/null |
    awk -v bench="$bench" -v fn="$function" '
      $0 ~ "^ *[0-9,]+ .*\\*  .*auth::" fn " " { cost = $1; gsub(",", "", cost); total += cost }
      $0 ~ "=> .*auth::" fn " \\(" {
        n = $0; sub(/.*\(/, "", n); sub(/x\).*/, "", n); gsub(",", "", n); calls += n }
      END { printf "%s: %.0f instructions per call of %s (%d calls)\n", bench, total / calls, fn, calls }'
done
rm -rf "$out"
