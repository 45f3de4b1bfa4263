#!/usr/bin/env python3
"""Tables of a perf/trace_compare.sh run: one row per run, grouped by trace and load.

Usage: perf/trace_summary.py DIR [BASELINE]

Reads every bench JSON in DIR (labels TRACE-CONFIG-LLOAD-rROUND, as trace_compare.sh names
them) and prints markdown: TTFT p50/p90/p99 of follow-ups, first turns and all requests (ms of
real time; multiply by the engines' SIM_SCALE for simulated GPU time), the engines' prefix-cache
hit rate, successful requests per second, errors by status, and requests that got no answer at
all. Then, per trace and load, the ratios against BASELINE (default fifo-li) that issue [3/6]
sets targets on. With several rounds of one configuration, each figure is the median of the
rounds and the spread (min-max) is printed beside it. Percentiles are nearest-rank over the
run's samples, as `warmpath bench` computes them. Standard library only.
"""

import glob
import json
import math
import os
import re
import statistics
import sys
from collections import defaultdict

LABEL = re.compile(r"^(?P<trace>[a-z]+)-(?P<config>.+)-L(?P<load>\d+)-r(?P<round>\d+)$")


def nearest_rank(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    return values[max(0, math.ceil(q * len(values)) - 1)]


def figures(result):
    samples = result["samples"]
    ttft = lambda pred: [s["ttft_ms"] for s in samples if pred(s) and s["ttft_ms"] is not None]
    follow = ttft(lambda s: s["follow_up"])
    first = ttft(lambda s: not s["follow_up"])
    every = ttft(lambda s: True)
    cache = result.get("prefix_cache") or {}
    unanswered = sum(1 for s in samples if s["status"] == 0)
    out = {
        "fu_p50": nearest_rank(follow, 0.5),
        "fu_p90": nearest_rank(follow, 0.9),
        "fu_p99": nearest_rank(follow, 0.99),
        "ft_p50": nearest_rank(first, 0.5),
        "ft_p90": nearest_rank(first, 0.9),
        "ft_p99": nearest_rank(first, 0.99),
        "all_p50": nearest_rank(every, 0.5),
        "all_p90": nearest_rank(every, 0.9),
        "all_p99": nearest_rank(every, 0.99),
        "hit": (cache.get("hit_rate") or 0.0) * 100.0,
        "rps": result["requests_per_s"],
        "unanswered": unanswered,
        "errors": result["errors"],
        "requests": len(samples),
    }
    return out


def load_runs(directory):
    runs = defaultdict(list)  # (trace, load, config) -> [figures]
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        with open(path) as f:
            result = json.load(f)
        match = LABEL.match(result["label"])
        if not match:
            continue
        key = (match["trace"], match["load"], match["config"])
        runs[key].append(figures(result))
    return runs


def cell(values, digits=0):
    median = statistics.median(values)
    text = f"{median:,.{digits}f}"
    if len(values) > 1:
        text += f" [{min(values):,.{digits}f}–{max(values):,.{digits}f}]"
    return text


COLUMNS = [
    ("follow-up p50", "fu_p50", 0),
    ("p90", "fu_p90", 0),
    ("p99", "fu_p99", 0),
    ("first p50", "ft_p50", 0),
    ("p90", "ft_p90", 0),
    ("p99", "ft_p99", 0),
    ("all p50", "all_p50", 0),
    ("all p99", "all_p99", 0),
    ("hit %", "hit", 1),
    ("req/s", "rps", 2),
]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    directory = sys.argv[1]
    baseline = sys.argv[2] if len(sys.argv) > 2 else "fifo-li"
    runs = load_runs(directory)
    groups = sorted({(trace, load) for trace, load, _ in runs})
    for trace, load in groups:
        configs = sorted(c for t, l, c in runs if (t, l) == (trace, load))
        rounds = max(len(runs[(trace, load, c)]) for c in configs)
        print(f"\n### {trace}, load {int(load) / 100:.2f} ({rounds} round(s); TTFT in ms)\n")
        print("| configuration | " + " | ".join(name for name, _, _ in COLUMNS) + " | errors |")
        print("|---|" + "---|" * (len(COLUMNS) + 1))
        for config in configs:
            rs = runs[(trace, load, config)]
            cells = [cell([r[key] for r in rs], digits) for _, key, digits in COLUMNS]
            errors = defaultdict(int)
            for r in rs:
                for status, n in r["errors"].items():
                    errors[status] += n
            text = ", ".join(f"{k}: {v}" for k, v in sorted(errors.items())) or "none"
            print(f"| {config} | " + " | ".join(cells) + f" | {text} |")
        if (trace, load, baseline) not in runs:
            continue
        base = runs[(trace, load, baseline)]
        med = lambda rs, key: statistics.median(r[key] for r in rs)
        print(f"\nAgainst `{baseline}` (medians of rounds):\n")
        print("| configuration | follow-up p50 (baseline / it) | all p99 (it / baseline) | "
              "hit rate (it / baseline) | worst TTFT percentile (it / baseline) |")
        print("|---|---|---|---|---|")
        for config in configs:
            if config == baseline:
                continue
            rs = runs[(trace, load, config)]
            speedup = med(base, "fu_p50") / med(rs, "fu_p50")
            p99 = med(rs, "all_p99") / med(base, "all_p99")
            hit = med(rs, "hit") / med(base, "hit") if med(base, "hit") > 0 else float("nan")
            worst = max(
                med(rs, k) / med(base, k)
                for k in ("fu_p50", "fu_p90", "fu_p99", "ft_p50", "ft_p90", "ft_p99")
            )
            print(f"| {config} | {speedup:.2f}x | {p99:.2f}x | {hit:.2f}x | {worst:.2f}x |")


if __name__ == "__main__":
    main()
