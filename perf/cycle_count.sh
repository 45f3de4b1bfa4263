#!/usr/bin/env bash
# Instructions per scheduler cycle, exactly: `examples/cycle_count.rs` (the cycle of
# benches/scheduler.rs without criterion) under callgrind with CYCLES=0 and CYCLES=N; the
# difference of the two totals over N. Deterministic: the same binary gives the same count.
# Usage: perf/cycle_count.sh BIN [DEPTH [TENANTS [N]]]
#   BIN: a release build of the example (cargo build --release --example cycle_count, then
#   target/release/examples/cycle_count copied aside); TENANTS=0: none configured.
set -euo pipefail
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
bin=$1; depth=${2:-1000}; tenants=${3:-0}; n=${4:-100000}
out=$(mktemp -d)
total() {
  DEPTH=$depth TENANTS=$tenants CYCLES=$1 valgrind --tool=callgrind \
    --callgrind-out-file="$out/cg.$1" "$bin" >/dev/null 2>&1
  callgrind_annotate "$out/cg.$1" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'
}
base=$(total 0)
full=$(total "$n")
echo "$bin depth $depth tenants $tenants: $(( (full - base) / n )) instructions per cycle ($n cycles)"
rm -rf "$out"
