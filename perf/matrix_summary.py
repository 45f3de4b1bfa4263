#!/usr/bin/env python3
"""The issue [8] matrix from perf/matrix.sh's bench JSONs, against the issue's targets.

Usage: python3 perf/matrix_summary.py [--compact] OUT_DIR

OUT_DIR holds one directory per engine profile (and `mixed`, `replicas`), each with bench JSONs
labelled TRACE-TARGET-LLOAD-rROUND (perf/peer_compare.sh). For every cell it prints follow-up
and first-turn TTFT p50, all-request TTFT p99 and the engines' prefix-cache hit rate of each
target, as the median over rounds with the spread (min-max) when there were several, then the
targets of issue [8] with what they compare:
  against cache_aware: first-turn p50 <= 1.0x, follow-up p50 >= 1.5x lower, all p99 <= 1.0x,
    hit rate >= 1.0x;
  against fifo + least-inflight: follow-up p50 >= 2x lower, all p99 <= +10 %, and on RAGPulse
    no percentile (first-turn and follow-up p50/p90/p99) worse by more than 5 %;
  against the best static configuration: follow-up p50 and all p99 within 10 %;
  mixed fleet (group `mixed`): no figure worse than the better of fifo-li and cache_aware;
  replicas (group `replicas`): wp-auto-x2's follow-up p50 within 1.2x of one wp-auto's.
With --compact: one row per cell with the ratios only (and the tally), instead of the tables.
Standard library only.
"""
import glob
import json
import os
import re
import statistics
import sys

LABEL = re.compile(r"^(mooncake|ragpulse)-(.+)-L(\d+)-r(\d+)$")


def load(out):
    cells = {}
    for path in sorted(glob.glob(os.path.join(out, "*", "*.json"))):
        group = os.path.basename(os.path.dirname(path))
        with open(path) as f:
            r = json.load(f)
        m = LABEL.match(r.get("label", ""))
        if not m:
            continue
        trace, target, l, _ = m.groups()
        load_ = "0." + l[1:]
        cells.setdefault((group, trace, load_), {}).setdefault(target, []).append(r)
    return cells


def pick(r, *keys):
    for k in keys:
        r = r.get(k) if isinstance(r, dict) else None
    return r


def stat(runs, *keys):
    v = [pick(r, *keys) for r in runs]
    v = [x for x in v if x is not None]
    if not v:
        return None, None, None
    return statistics.median(v), min(v), max(v)


FIGURES = [
    ("follow p50", ("follow_ups", "ttft_ms", "p50")),
    ("first p50", ("first_turns", "ttft_ms", "p50")),
    ("all p99", ("all", "ttft_ms", "p99")),
    ("hit", ("prefix_cache", "hit_rate")),
]
PERCENTILES = [(kind, p) for kind in ("first_turns", "follow_ups") for p in ("p50", "p90", "p99")]


def fmt(value, spread, hit=False):
    if value is None:
        return "-"
    text = f"{value:.3f}" if hit else (f"{value:,.0f}" if value >= 100 else f"{value:.1f}")
    lo, hi = spread
    if lo is not None and hi is not None and lo != hi:
        text += f" ({lo:.3f}-{hi:.3f})" if hit else f" ({lo:,.0f}-{hi:,.0f})"
    return text


def verdict(ok):
    return "met" if ok else "**not met**"


def ratio(a, b):
    return a / b if a and b else None


def cell_checks(group, trace, targets, med):
    """The issue's targets for one cell: (name, met, ratio) each."""
    auto, ca, fl = "wp-auto", "sgl-cache_aware", "fifo-li"
    checks = []
    if group == "replicas":
        if ("wp-auto-x2", "follow p50") in med:
            r = ratio(med[("wp-auto-x2", "follow p50")], med[(auto, "follow p50")])
            checks.append(("x2 follow p50 within 1.2x of one", r <= 1.2, r))
        return checks
    if group == "mixed":
        for name, _ in FIGURES:
            others = [med[(t, name)] for t in (ca, fl) if med.get((t, name)) is not None]
            if not others or med.get((auto, name)) is None:
                continue
            best = max(others) if name == "hit" else min(others)
            ok = med[(auto, name)] >= best if name == "hit" else med[(auto, name)] <= best
            checks.append((f"mixed: {name} vs better of li, ca", ok, ratio(med[(auto, name)], best)))
        return checks
    if (ca, "follow p50") in med:
        checks += [
            ("first p50 <= cache_aware", med[(auto, "first p50")] <= med[(ca, "first p50")],
             ratio(med[(auto, "first p50")], med[(ca, "first p50")])),
            ("follow p50 >= 1.5x lower than cache_aware",
             med[(ca, "follow p50")] >= 1.5 * med[(auto, "follow p50")],
             ratio(med[(ca, "follow p50")], med[(auto, "follow p50")])),
            ("all p99 <= cache_aware", med[(auto, "all p99")] <= med[(ca, "all p99")],
             ratio(med[(auto, "all p99")], med[(ca, "all p99")])),
            ("hit >= cache_aware", (med[(auto, "hit")] or 0) >= (med[(ca, "hit")] or 0),
             ratio(med[(auto, "hit")], med[(ca, "hit")])),
        ]
    if (fl, "follow p50") in med:
        checks += [
            ("follow p50 >= 2x lower than fifo-li",
             med[(fl, "follow p50")] >= 2 * med[(auto, "follow p50")],
             ratio(med[(fl, "follow p50")], med[(auto, "follow p50")])),
            ("all p99 <= fifo-li + 10 %", med[(auto, "all p99")] <= 1.1 * med[(fl, "all p99")],
             ratio(med[(auto, "all p99")], med[(fl, "all p99")])),
        ]
        if trace == "ragpulse":
            worst = max(
                stat(targets[auto], kind, "ttft_ms", p)[0] / stat(targets[fl], kind, "ttft_ms", p)[0]
                for kind, p in PERCENTILES)
            checks.append(("RAGPulse: no percentile > fifo-li + 5 %", worst <= 1.05, worst))
    for st in (t for t in targets if t.startswith("st-")):
        checks += [
            (f"follow p50 within 10 % of {st}",
             med[(auto, "follow p50")] <= 1.1 * med[(st, "follow p50")],
             ratio(med[(auto, "follow p50")], med[(st, "follow p50")])),
            (f"all p99 within 10 % of {st}", med[(auto, "all p99")] <= 1.1 * med[(st, "all p99")],
             ratio(med[(auto, "all p99")], med[(st, "all p99")])),
        ]
    return checks


def medians(targets):
    med = {}
    for target, runs in targets.items():
        for name, keys in FIGURES:
            med[(target, name)] = stat(runs, *keys)[0]
    return med


def print_cell(group, trace, l, targets):
    rounds = max(len(v) for v in targets.values())
    print(f"\n### {group}, {trace}, load {l} ({rounds} round(s); TTFT in ms, median (min-max))\n")
    print("| target | follow-up TTFT p50 | first-turn TTFT p50 | all TTFT p99 | hit rate | errors |")
    print("|---|---|---|---|---|---|")
    for target, runs in sorted(targets.items()):
        row = []
        for name, keys in FIGURES:
            v, lo, hi = stat(runs, *keys)
            row.append(fmt(v, (lo, hi), hit=name == "hit"))
        errors = statistics.median(sum(r.get("errors", {}).values()) for r in runs)
        print(f"| {target} | " + " | ".join(row) + f" | {errors:g} |")


# The compact table's columns: a check's name (up to " of ") and the column's heading.
COLUMNS = [
    ("first p50 <= cache_aware", "first p50 / ca"),
    ("follow p50 >= 1.5x lower than cache_aware", "ca / follow p50"),
    ("all p99 <= cache_aware", "all p99 / ca"),
    ("hit >= cache_aware", "hit / ca"),
    ("follow p50 >= 2x lower than fifo-li", "fifo / follow p50"),
    ("all p99 <= fifo-li + 10 %", "all p99 / fifo"),
    ("RAGPulse: no percentile > fifo-li + 5 %", "worst RAGPulse pct / fifo"),
    ("follow p50 within 10 %", "follow p50 / static"),
    ("all p99 within 10 %", "all p99 / static"),
]


def print_compact(rows):
    """One row per cell of the trace x profile x load grid, the ratios bold where not met; then
    the mixed fleet's and the replicas' checks as lists."""
    print("\n| cell | " + " | ".join(h for _, h in COLUMNS) + " |")
    print("|---|" + "---|" * len(COLUMNS))
    others = []
    for cell, checks in rows:
        if " mixed " in cell or " replicas " in cell:
            others.append((cell, checks))
            continue
        by = {name.split(" of ")[0]: (ok, r) for name, ok, r in checks}
        cols = []
        for key, _ in COLUMNS:
            ok, r = by.get(key, (True, None))
            text = "-" if r is None else f"{r:.2f}"
            cols.append(text if ok or r is None else f"**{text}**")
        print(f"| {cell} | " + " | ".join(cols) + " |")
    for cell, checks in others:
        print(f"\n{cell}: " + "; ".join(
            f"{name} {r:.2f}" + ("" if ok else " (**not met**)") for name, ok, r in checks if r))


def main(out, compact):
    cells = load(out)
    tally = {}
    rows = []
    for (group, trace, l), targets in sorted(cells.items()):
        if not compact:
            print_cell(group, trace, l, targets)
        if ("wp-auto", "follow p50") not in medians(targets):
            continue
        checks = cell_checks(group, trace, targets, medians(targets))
        for name, ok, _ in checks:
            tally.setdefault(name.split(" of ")[0], [0, 0])[0 if ok else 1] += 1
        rounds = max(len(v) for v in targets.values())
        rows.append((f"{trace} {group} {l} ({rounds} r)", checks))
        if checks and not compact:
            print("\n| target | ratio | verdict |\n|---|---|---|")
            for name, ok, r in checks:
                print(f"| {name} | {r:.2f} | {verdict(ok)} |" if r else f"| {name} | - | {verdict(ok)} |")
    if compact:
        print_compact(rows)
    if tally:
        print("\n### Targets over all cells\n\n| target | met | not met |\n|---|---|---|")
        for name, (met, missed) in tally.items():
            print(f"| {name} | {met} | {missed} |")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--compact"]
    main(args[0] if args else "perf/out/matrix", "--compact" in sys.argv[1:])
