#!/usr/bin/env python3
"""Held-out cells for the fleet lab: engines, fleets, workloads, loads and client kinds drawn
from a seeded generator, so that a change is judged on cells no session picked.

    cargo build --release --example fleet
    CELLS=100 RSEED=23 python3 perf/lab_random.py run OUT.csv    # about 25 minutes on 2 cores
    python3 perf/lab_profiles.py summary OUT.csv                 # warmpath / cache_aware per cell

Each cell: one to four engines (half the time of one kind), each a named profile of the sim
with each of its keys changed with some probability (KV blocks 0.05-1.5x, step base 0.3-4x,
prefill cost 0.25-4x, decode cost 0.2-8x, `max_num_seqs` 16-256, `max_num_batched_tokens`
512-16,384); a workload (the two traces, the fleet example's synthetic ones, or a random
`custom` shape); a load from 0.5 to 0.95; every session streaming, or half of them not. The
same RSEED draws the same cells. FLEET, TARGETS (default `default cache_aware`) and SEEDS
(arrival jitters, default `012`) as in perf/lab_profiles.py; EXTRA passes KEY=VALUE settings
to every run. OUT.cells lists the cells drawn. A `custom` cell's trace is named `customN`
after its number in the CSV, so that its lines stay apart. The CSV lines are
lab_profiles.py's: TARGET,SEED|the fleet example's CSV line.
"""
import math
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

FLEET = os.environ.get("FLEET", "target/release/examples/fleet")
TARGETS = os.environ.get("TARGETS", "default cache_aware").split()
SEEDS = os.environ.get("SEEDS", "012")
CELLS = int(os.environ.get("CELLS", "100"))
EXTRA = os.environ.get("EXTRA", "").split()
R = random.Random(int(os.environ.get("RSEED", "1")))
# KV blocks, step base (us), prefill cost (ns per token), decode cost (us per sequence).
BASE = {
    "h100-8b": (27648, 6000, 32000, 50),
    "h100x4-70b": (28875, 16000, 89000, 35),
    "l4-3b": (7606, 27000, 106000, 600),
}


def log_uniform(lo, hi):
    return math.exp(R.uniform(math.log(lo), math.log(hi)))


def engine():
    name = R.choice(list(BASE))
    kv, step, prefill, decode = BASE[name]
    parts = [name]
    if R.random() < 0.5:
        parts.append(f"kv_blocks={max(1500, int(kv * log_uniform(0.05, 1.5)))}")
    if R.random() < 0.4:
        parts.append(f"step_base_us={int(step * log_uniform(0.3, 4))}")
    if R.random() < 0.4:
        parts.append(f"prefill_token_cost_ns={int(prefill * log_uniform(0.25, 4))}")
    if R.random() < 0.4:
        parts.append(f"decode_seq_cost_us={max(1, int(decode * log_uniform(0.2, 8)))}")
    if R.random() < 0.3:
        parts.append(f"max_num_seqs={R.choice([16, 32, 64, 128, 256])}")
    if R.random() < 0.3:
        batched = R.choice([512, 1024, 2048, 4096, 16384])
        parts.append(f"max_num_batched_tokens={batched}")
    return "/".join(parts)


def fleet():
    n = R.choice([1, 2, 2, 3, 4])
    first = engine()
    if n == 1:
        return first
    if R.random() < 0.5:
        return ",".join([first] * n)
    return ",".join([first] + [engine() for _ in range(n - 1)])


def workload():
    trace = R.choice(["mooncake", "ragpulse", "chat", "agent", "coder", "summarize", "reason",
                      "custom", "custom", "custom"])
    if trace != "custom":
        return trace, ""
    shape = (f"turns={R.choice([1, 2, 4, 8, 16])},"
             f"system_words={R.choice([0, 20, 300, 1500, 4000])},"
             f"context_words={R.choice([0, 100, 1000, 6000])},"
             f"new_words={R.choice([10, 50, 300])},"
             f"answer_tokens={R.choice([5, 50, 300, 1000])},"
             f"think_ms={R.choice([0, 500, 3000, 15000])}")
    return trace, shape


def cells():
    drawn = []
    for i in range(CELLS):
        trace, shape = workload()
        engines = fleet()
        load = f"{R.uniform(0.5, 0.95):.2f}"
        drawn.append((i, trace, shape, engines, load, R.choice(["0", "0", "50"])))
    return drawn


def run(out_path):
    drawn = cells()
    with open(out_path + ".cells", "w") as out:
        for cell in drawn:
            out.write("|".join(map(str, cell)) + "\n")
    jobs = [(cell, target, seed) for cell in drawn for target in TARGETS for seed in SEEDS]

    def one(job):
        (i, trace, shape, engines, load, unstreamed), target, seed = job
        env = dict(os.environ, CSV="1", JITTER=seed, UNSTREAMED=unstreamed)
        if shape:
            env["MULTITURN"] = shape
        argv = [FLEET, trace, engines, load, target] + EXTRA
        line = subprocess.run(argv, env=env, capture_output=True, text=True).stdout.strip()
        if trace == "custom":
            line = line.replace("custom", f"custom{i}", 1)
        return target, seed, line

    with ThreadPoolExecutor(2) as pool, open(out_path, "w") as out:
        for target, seed, line in pool.map(one, jobs):
            if line:
                out.write(f"{target},{seed}|{line}\n")
                out.flush()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "run":
        sys.exit(__doc__)
    run(sys.argv[2])
