#!/usr/bin/env python3
"""The issue [8] matrix in virtual time: every cell, several sample paths, in minutes.

For every (trace, profile, load) cell, runs through `examples/fleet` (the real scheduler and the
sim's engine cores in virtual time, src/fleet) warmpath with no key set (`default`), fifo with
least-inflight (`fifo-li`), the model of sglang-router's `cache_aware` (src/fleet/peer.rs), and
the best static configuration of perf/matrix-static.txt, each with SEEDS arrival jitters, the
sims' time scale as perf/matrix.sh runs them. It is a lab, not the result: the real replays of
perf/matrix.sh are. What it adds is more sample paths per cell than real time allows.

    cargo build --release --example fleet
    python3 perf/lab_matrix.py run lab.csv      # about 15 minutes on 2 cores
    python3 perf/lab_matrix.py summary lab.csv  # the table of perf/RESULTS.md

Each CSV line: TRACE,PROFILE,LOAD,TARGET,SEED|the fleet example's CSV line.
"""
import itertools
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

FLEET = os.environ.get("FLEET", "target/release/examples/fleet")
SEEDS = os.environ.get("SEEDS", "012")
SIM_SCALE = {"h100-8b": 8, "h100x4-70b": 24, "l4-3b": 32}
TARGETS = ["cache_aware", "fifo-li", "default"]


def static_targets():
    best = {}
    for line in open(os.path.join(os.path.dirname(__file__), "matrix-static.txt")):
        trace, profile, load, name, _, _ = line.split()
        best[(trace, profile, load)] = name
    return best


def fleet_args(name):
    """The fleet example's ROUTER and KEY=VALUE arguments for a target."""
    if not name.startswith("st-"):
        return [name]
    _, routing, budget = name.split("-")
    return [
        "boost-pc" if routing == "pc" else "boost-sa",
        f"queue.prefill_tokens_per_backend={budget}",
        "queue.prefix_index_blocks=8192",
    ]


def run(out_path):
    best = static_targets()
    jobs = []
    for cell in sorted(best):
        for name in TARGETS + [best[cell]]:
            jobs += [(*cell, name, seed) for seed in SEEDS]

    def one(job):
        trace, profile, load, name, seed = job
        env = dict(os.environ, CSV="1", JITTER=seed, SIM_SCALE=str(SIM_SCALE[profile]))
        argv = [FLEET, trace, profile, load] + fleet_args(name)
        return job, subprocess.run(argv, env=env, capture_output=True, text=True).stdout.strip()

    with ThreadPoolExecutor(2) as pool, open(out_path, "w") as out:
        for job, line in pool.map(one, jobs):
            out.write(",".join(job) + "|" + line + "\n")
            out.flush()


# Fields of the fleet example's CSV line after TRACE,PROFILE,LOAD,ROUTER,SETS,JITTER.
FOLLOW50, FIRST50, ALL99, HIT = 6, 9, 12, 13


def summary(path):
    runs = {}
    for line in open(path):
        key, csv = line.rstrip("\n").split("|")
        trace, profile, load, name, _seed = key.split(",")
        fields = csv.split(",")
        figures = [float(fields[i]) for i in (FOLLOW50, FIRST50, ALL99, HIT)]
        runs.setdefault((trace, profile, load), {}).setdefault(name, []).append(figures)
    print("| cell | first p50 / ca | ca / follow p50 | all p99 / ca | hit / ca "
          "| fifo / follow p50 | all p99 / fifo | follow p50 / static | all p99 / static |")
    print("|---|---|---|---|---|---|---|---|---|")
    tally = {}
    for cell in sorted(runs):
        by = {name: [statistics.median(col) for col in zip(*rows)] for name, rows in runs[cell].items()}
        static = next(n for n in by if n.startswith("st-"))
        d, ca, fifo, st = by["default"], by["cache_aware"], by["fifo-li"], by[static]
        checks = [
            ("first p50 <= ca", d[1] / ca[1], lambda r: r <= 1.0),
            ("follow 1.5x under ca", ca[0] / d[0], lambda r: r >= 1.5),
            ("all p99 <= ca", d[2] / ca[2], lambda r: r <= 1.0),
            ("hit >= ca", d[3] / ca[3], lambda r: r >= 1.0),
            ("follow 2x under fifo", fifo[0] / d[0], lambda r: r >= 2.0),
            ("all p99 <= fifo +10%", d[2] / fifo[2], lambda r: r <= 1.1),
            ("follow within 10% of static", d[0] / st[0], lambda r: r <= 1.1),
            ("all p99 within 10% of static", d[2] / st[2], lambda r: r <= 1.1),
        ]
        cells = []
        for name, ratio, ok in checks:
            met = ok(ratio)
            tally.setdefault(name, [0, 0])[0 if met else 1] += 1
            cells.append(f"{ratio:.2f}" if met else f"**{ratio:.2f}**")
        print(f"| {' '.join(cell)} ({static}) | " + " | ".join(cells) + " |")
    print("\n| target | met | not met |\n|---|---|---|")
    for name, (met, not_met) in tally.items():
        print(f"| {name} | {met} | {not_met} |")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("run", "summary"):
        sys.exit(__doc__)
    run(sys.argv[2]) if sys.argv[1] == "run" else summary(sys.argv[2])
