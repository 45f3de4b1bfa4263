#!/usr/bin/env bash
# Instructions per scheduler cycle (arrive + admit + complete), counted by callgrind on the
# criterion bench binary: repeatable whatever else the machine is doing, unlike wall time.
# Usage: [BENCH=warmpath-100-tenants] perf/cycle_instructions.sh [DEPTH...]   (default: 0 1000 10000)
# BENCH names the bench variant (default `warmpath`, no tenants).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
cargo bench --bench scheduler --no-run 2>/dev/null
bin=$(ls -t target/release/deps/scheduler-* | grep -v '\.d$' | head -n 1)
out=$(mktemp -d)
for depth in "${@:-0 1000 10000}"; do
  for depth in $depth; do
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.$depth" "$bin" --bench --profile-time 2 \
      "cycle/${BENCH:-warmpath}/$depth\$" >/dev/null 2>&1
    # Inclusive cost of the two per-cycle calls divided by their call count. Setup calls of the
    # same functions are few (depth + 4,352) next to the hundreds of thousands profiled.
    callgrind_annotate --inclusive=yes --tree=calling "$out/cg.$depth" 2>/dev/null |
      awk -v depth="$depth" '
        /^ *[0-9,]+ .*\*  .*Steady::(arrive|complete_oldest) / {
          cost = $1; gsub(",", "", cost); total += cost }
        /=> .*Steady::(arrive|complete_oldest) \(/ {
          n = $0; sub(/.*\(/, "", n); sub(/x\).*/, "", n); gsub(",", "", n); calls[$0 ~ /arrive/] += n }
        END { cycles = calls[1]; printf "depth %s: %.0f instructions per cycle (%d cycles)\n", depth, total / cycles, cycles }'
  done
done
rm -rf "$out"
