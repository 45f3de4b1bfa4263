#!/usr/bin/env bash
# Long fuzz runs, one target at a time, at the lowest CPU priority. The targets are built from
# a snapshot of the committed HEAD (`git archive`, so edits made during a run change nothing and
# the commit reported is the one fuzzed); each target runs for SECONDS_PER_TARGET (default 600)
# from its committed seeds plus a scratch corpus, and one line per target is printed: target,
# commit, seconds, executions, result.
#
#   fuzz/run_long.sh                                  # every target of `cargo fuzz list`
#   SECONDS_PER_TARGET=60 fuzz/run_long.sh http_request chunked
#
# Snapshot, scratch corpora and logs go to $FUZZ_WORK (default /tmp/warmpath-fuzz). A crash
# leaves its input under $FUZZ_WORK/artifacts/<target>/ and the line says CRASH.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${SECONDS_PER_TARGET:-600}
work=${FUZZ_WORK:-/tmp/warmpath-fuzz}
commit=$(git rev-parse --short HEAD)
src="$work/src-$commit"
if [ ! -d "$src" ]; then
  mkdir -p "$src"
  git archive HEAD | tar -x -C "$src"
fi
cd "$src/fuzz"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list)
fi
nice -n 19 cargo fuzz build -s none >"$work/build.log" 2>&1 || {
  echo "cargo fuzz build failed: $work/build.log"
  exit 1
}
bin="$src/fuzz/target/x86_64-unknown-linux-gnu/release"
printf '%-16s %-8s %8s %14s %s\n' target commit seconds executions result
for target in "${targets[@]}"; do
  mkdir -p "$work/corpus/$target" "$work/artifacts/$target"
  log="$work/$target.log"
  nice -n 19 "$bin/$target" -artifact_prefix="$work/artifacts/$target/" \
    -max_total_time="$seconds" -print_final_stats=1 "$work/corpus/$target" "corpus/$target" \
    >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  took=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | grep -o 'in [0-9]*' | grep -o '[0-9]*')
  result=clean
  [ $rc -ne 0 ] && result="CRASH (rc $rc, see $log)"
  printf '%-16s %-8s %8s %14s %s\n' "$target" "$commit" "${took:-?}" "${execs:-?}" "$result"
done
