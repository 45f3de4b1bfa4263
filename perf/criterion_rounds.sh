#!/usr/bin/env bash
# Criterion benches of several bench binaries, interleaved, one bench at a time on core 0: the
# way to compare two builds (or two benches of one build) on a shared machine in one run.
#
# Usage: perf/criterion_rounds.sh ROUNDS LABEL=BINARY=FILTER...
#   e.g. perf/criterion_rounds.sh 3 main=/work/runs/bench-0e6380f='cycle/warmpath/1000$' \
#          tenants=target/release/deps/scheduler-HASH='cycle/warmpath-100-tenants/1000$'
# Each round runs every LABEL's FILTER once (2 s warm-up, 5 s measurement, no plots) and prints
# one line: round, label, criterion's median estimate and its 95 % interval in ns. A bench
# binary comes from `cargo bench --bench NAME --no-run` (its path is printed); copy it away
# before building another commit. Criterion's data goes to a temporary directory.
set -euo pipefail
(($# >= 2)) || { sed -n '2,11p' "$0" >&2; exit 2; }
rounds=$1
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "round label median_ns low_ns high_ns"
for round in $(seq 1 "$rounds"); do
  for spec in "$@"; do
    label=${spec%%=*} rest=${spec#*=}
    bin=${rest%%=*} filter=${rest#*=}
    rm -rf "$work/target"
    (cd "$work" && taskset -c 0 "$bin" --bench "$filter" --warm-up-time 2 --measurement-time 5 \
      --noplot >"$work/log" 2>&1) || { echo "$label failed:" >&2; tail "$work/log" >&2; exit 1; }
    estimates=$(find "$work/target/criterion" -path '*new/estimates.json' | head -1)
    [[ -n $estimates ]] || { echo "$label: no bench matched $filter" >&2; exit 1; }
    python3 -c 'import json, sys
m = json.load(open(sys.argv[1]))["median"]
print(sys.argv[2], sys.argv[3], "%.1f %.1f %.1f" % (m["point_estimate"],
      m["confidence_interval"]["lower_bound"], m["confidence_interval"]["upper_bound"]))' \
      "$estimates" "$round" "$label"
  done
done
