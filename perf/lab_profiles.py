#!/usr/bin/env python3
"""Engine models beyond the three named profiles, in virtual time: warmpath with no key set
against the model of sglang-router's `cache_aware`, on two traces and two synthetic workloads,
at two loads.

The named profiles (src/sim) are three GPUs. The engines warmpath will meet differ from them in
KV capacity, batch limits, prefill and decode speed, so this lab runs each cell also on
profiles with one value changed (`examples/fleet`'s PROFILE/KEY=VALUE syntax) and reports how
warmpath's percentiles compare with `cache_aware`'s: the median over SEEDS arrival jitters of
each, then the ratio (below 1: warmpath is lower). It is a lab, not a result: the real replays
of perf/matrix.sh are. What it adds is engines no replay has.

    cargo build --release --example fleet
    python3 perf/lab_profiles.py run lab-profiles.csv      # about 8 minutes on 2 cores
    python3 perf/lab_profiles.py summary lab-profiles.csv

TRACES (default `mooncake ragpulse chat agent`) names the workloads: the two traces and the
fleet example's synthetic `chat` (short prompts, long answers) and `agent` (a long shared
system prompt, short quick steps), which resemble neither trace; the fleet example also has
`coder` (a context growing to about 16k tokens), `summarize` (one long unshared prompt per
request, no follow-ups) and `reason` (short questions, answers of 2,000 tokens: decoding
dominates), not in the default. PROFILES (space-separated,
default the ten below) names the engine models, a comma between the engines of one fleet (a
single profile is two engines of it). TARGETS (default `default
cache_aware`) names the fleet example's routers to run; the first is compared with the second.
LOADS (default `0.7 0.9`) names the loads, fractions of the fleet's measured capacity.
The latencies are what each client waits for: the first token of a streamed response, the
whole of any other. Any other environment passes through to the fleet example: a lab build's
switches, UNSTREAMED=PCT (that share of sessions asks for whole responses, as the OpenAI SDKs
do by default; NO_STREAM=1 is all of them) and SEEN=streamed|unstreamed (the figures of one
kind of client only, for a mixed fleet).
Each CSV line: TARGET,SEED|the fleet example's CSV line.

The model of `cache_aware` depends on the order of a mixed fleet's engines (the first engine a
shared prefix lands on keeps it until the balance thresholds move requests away); warmpath's
placement breaks its ties by KV capacity before order. Every mixed profile here lists the
faster engine first, the order that
favours `cache_aware` (perf/RESULTS.md, twentieth session): to see the other, name the
profiles the other way round (PROFILES="l4-3b,h100-8b").
"""
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

FLEET = os.environ.get("FLEET", "target/release/examples/fleet")
SEEDS = os.environ.get("SEEDS", "012")
TARGETS = os.environ.get("TARGETS", "default cache_aware").split()
TRACES = os.environ.get("TRACES", "mooncake ragpulse chat agent").split()
LOADS = os.environ.get("LOADS", "0.7 0.9").split()
PROFILES = os.environ.get("PROFILES", "").split() or [
    "h100-8b",
    "l4-3b",
    "h100x4-70b",
    "h100-8b,l4-3b",
    "h100-8b/kv_blocks=6000",  # an H100 whose KV cache holds a seventh as much
    "h100-8b/max_num_seqs=32",
    "h100-8b/decode_seq_cost_us=300",  # decode six times as costly per sequence
    "h100-8b/prefill_token_cost_ns=8000",  # prefill four times as fast
    "h100x4-70b/kv_blocks=10000",  # a 70B model with a third of the KV cache
    "l4-3b/kv_blocks=4000",
]
# The fleet example's CSV fields, counted from the end (a mixed fleet's PROFILE has a comma).
FIELDS = {"follow p50": -11, "first p50": -8, "first p90": -7, "all p99": -5, "hit": -4}


def run(out_path):
    jobs = [
        (trace, profile, load, target, seed)
        for profile in PROFILES
        for trace in TRACES
        for load in LOADS
        for target in TARGETS
        for seed in SEEDS
    ]

    def one(job):
        trace, profile, load, target, seed = job
        env = dict(os.environ, CSV="1", JITTER=seed)
        argv = [FLEET, trace, profile, load, target]
        return job, subprocess.run(argv, env=env, capture_output=True, text=True).stdout.strip()

    with ThreadPoolExecutor(2) as pool, open(out_path, "w") as out:
        for (_, _, _, target, seed), line in pool.map(one, jobs):
            out.write(f"{target},{seed}|{line}\n")
            out.flush()


def summary(path):
    runs = {}
    for line in open(path):
        key, csv = line.rstrip("\n").split("|")
        target, _seed = key.split(",")
        fields = csv.split(",")
        trace, load = fields[0], fields[-15]
        profile = ",".join(fields[1:-15])
        figures = [float(fields[i]) for i in FIELDS.values()]
        runs.setdefault((trace, profile, load), {}).setdefault(target, []).append(figures)
    ours, peer = TARGETS[0], TARGETS[1]
    names = list(FIELDS)
    print(f"{ours} / {peer}, medians of {len(SEEDS)} sample paths (hit: {ours}'s over {peer}'s)")
    print("| cell | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    ratios = {name: [] for name in names}
    # More than 5 % worse than the peer: a higher latency, a lower hit rate.
    worse = lambda name, ratio: ratio < 0.95 if name == "hit" else ratio > 1.05
    for cell in sorted(runs):
        by = {t: [statistics.median(col) for col in zip(*rows)] for t, rows in runs[cell].items()}
        if ours not in by or peer not in by:
            continue
        row = []
        for i, name in enumerate(names):
            ratio = by[ours][i] / by[peer][i] if by[peer][i] else 1.0
            ratios[name].append(ratio)
            row.append(f"**{ratio:.2f}**" if worse(name, ratio) else f"{ratio:.2f}")
        print(f"| {' '.join(cell)} | " + " | ".join(row) + " |")
    geo = lambda v: statistics.geometric_mean(v) if v else float("nan")
    print("| geometric mean | " + " | ".join(f"{geo(ratios[n]):.2f}" for n in names) + " |")
    print("| worst | " + " | ".join(
        f"{(min if n == 'hit' else max)(ratios[n]):.2f}" for n in names) + " |")
    counts = (str(sum(worse(n, r) for r in ratios[n])) for n in names)
    print("| cells more than 5 % worse | " + " | ".join(counts) + " |")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("run", "summary"):
        sys.exit(__doc__)
    run(sys.argv[2]) if sys.argv[1] == "run" else summary(sys.argv[2])
