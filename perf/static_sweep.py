#!/usr/bin/env python3
"""The best static configuration per cell of the issue [8] matrix, found in virtual time.

For every (trace, profile, load) cell, runs each static configuration of the knobs warmpath had
before it learned them (routing prefix-cost or session-affinity, a fixed prefill budget, the
prefix index fixed at 8,192 blocks) through `examples/fleet` (the scheduler and the simulated
engines in virtual time, src/fleet), two sample paths each, and keeps the one with the lowest
product of follow-up TTFT p50 and all-request TTFT p99 (the two figures the matrix compares
with the best static configuration). perf/matrix.sh then replays that configuration for real.

    cargo build --release --example fleet
    python3 perf/static_sweep.py > perf/matrix-static.txt

Each line: TRACE PROFILE LOAD TARGET f50_s a99_s (TARGET as perf/lib.sh names it).
"""
import itertools
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

FLEET = os.environ.get("FLEET", "target/release/examples/fleet")
TRACES = os.environ.get("TRACES", "mooncake ragpulse").split()
PROFILES = os.environ.get("PROFILES", "h100-8b h100x4-70b l4-3b").split()
LOADS = os.environ.get("LOADS", "0.70 0.85 0.95").split()
# The sims' --time-scale per profile in perf/matrix.sh (the router's durations are real time).
SIM_SCALE = {"h100-8b": 8, "h100x4-70b": 24, "l4-3b": 32}
BUDGETS = [0, 8192, 16384, 32768, 65536]
CANDIDATES = [("pc", b) for b in BUDGETS] + [("sa", b) for b in (16384, 65536)]


def spec(routing, budget):
    router = "boost-pc" if routing == "pc" else "boost-sa"
    return [router, f"queue.prefill_tokens_per_backend={budget}", "queue.prefix_index_blocks=8192"]


def run(job):
    trace, profile, load, (routing, budget), seed = job
    env = dict(os.environ, CSV="1", JITTER=str(seed), SIM_SCALE=str(SIM_SCALE.get(profile, 8)))
    out = subprocess.run([FLEET, trace, profile, load] + spec(routing, budget), env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    fields = out.split(",")
    return job, float(fields[6]), float(fields[12])


jobs = [(t, p, l, c, s) for t, p, l in itertools.product(TRACES, PROFILES, LOADS)
        for c in CANDIDATES for s in (0, 1)]
results = {}
with ThreadPoolExecutor(int(os.environ.get("PAR", "2"))) as pool:
    for (t, p, l, c, s), f50, a99 in pool.map(run, jobs):
        results.setdefault((t, p, l, c), []).append((f50, a99))
for t, p, l in itertools.product(TRACES, PROFILES, LOADS):
    scored = []
    for c in CANDIDATES:
        f50 = statistics.median(x[0] for x in results[(t, p, l, c)])
        a99 = statistics.median(x[1] for x in results[(t, p, l, c)])
        scored.append((f50 * a99, c, f50, a99))
    _, (routing, budget), f50, a99 = min(scored)
    print(f"{t} {p} {l} st-{routing}-{budget} {f50:.3f} {a99:.2f}", flush=True)
