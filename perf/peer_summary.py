#!/usr/bin/env python3
"""Tables (and a plot) from the bench JSONs of perf/peer_compare.sh.

Usage: python3 perf/peer_summary.py OUT_DIR [--plot FILE.svg]

Reads OUT_DIR/*.json (labels TRACE-TARGET-LLOAD-rROUND[SUFFIX], as peer_compare.sh names them),
prints one markdown table per trace and load: TTFT p50/p90/p99 of follow-ups and of first
turns, TTFT p99 and end-to-end p99 over all requests, the engines' prefix-cache hit rate,
successful requests per second and errors. With several rounds, each cell is the median over
them. Then the issue's target check where both warmpath boost-sa and sglang-router cache_aware
ran: follow-up TTFT p50 at least 1.5x lower, hit rate at least equal, overall TTFT p99 no worse.

The plot (default OUT_DIR/peers-ttft.svg) is one row per trace and load, follow-up and
first-turn TTFT CDFs per target. It needs matplotlib; without it the tables are printed and
the plot is skipped with a note. Standard library otherwise.
"""

import glob
import json
import os
import re
import statistics
import sys

ORDER = ["fifo-li", "fifo-sa", "boost-li", "boost-sa", "kthena", "sgl-cache_aware",
         "sgl-round_robin", "haproxy", "wp-x2", "wp-x2-split"]
NAMES = {
    "fifo-li": "warmpath fifo + least-inflight",
    "fifo-sa": "warmpath fifo + session-affinity",
    "boost-li": "warmpath session-boost + least-inflight",
    "boost-sa": "warmpath session-boost + session-affinity",
    "kthena": "warmpath with kthena's limits",
    "sgl-cache_aware": "sglang-router cache_aware",
    "sgl-round_robin": "sglang-router round_robin",
    "haproxy": "HAProxy hdr(X-Session-ID) consistent",
    "wp-x2": "2 warmpath replicas behind HAProxy",
    "wp-x2-split": "2 replicas, prefill budget split",
}
LABEL = re.compile(r"^(mooncake|ragpulse|multiturn|chat|agent|classify)-(.+)-L(\d+)-r(\d+)(.*)$")


def load_runs(out):
    runs = {}  # (trace, load, target+suffix) -> [result, ...]
    for path in sorted(glob.glob(os.path.join(out, "*.json"))):
        with open(path) as f:
            result = json.load(f)
        m = LABEL.match(result.get("label", ""))
        if not m:
            continue
        trace, target, load, _round, suffix = m.groups()
        load = "0." + load[1:] if load.startswith("0") else load
        runs.setdefault((trace, load, target + suffix), []).append(result)
    return runs


def get(result, *keys):
    for k in keys:
        if result is None:
            return None
        result = result.get(k) if isinstance(result, dict) else None
    return result


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def figures(results):
    """The table's numbers: medians over rounds."""
    def m(*keys):
        return median([get(r, *keys) for r in results])

    errors = [sum(r.get("errors", {}).values()) for r in results]
    return {
        "fu": [m("follow_ups", "ttft_ms", p) for p in ("p50", "p90", "p99")],
        "ft": [m("first_turns", "ttft_ms", p) for p in ("p50", "p90", "p99")],
        "all_ttft_p99": m("all", "ttft_ms", "p99"),
        "all_e2e_p99": m("all", "e2e_ms", "p99"),
        "hit": m("prefix_cache", "hit_rate"),
        "rps": m("requests_per_s"),
        "errors": median(errors),
        "error_kinds": sorted({k for r in results for k in r.get("errors", {})}),
        "requests": m("all", "requests"),
        "rounds": len(results),
    }


def ms(v):
    if v is None:
        return "-"
    return f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.0f} ms"


def fmt(v):
    return "-" if v is None else f"{v:.3f}"


def ordered(targets):
    known = [t for t in ORDER if t in targets]
    rest = sorted(t for t in targets if t not in ORDER and not any(t.startswith(k) for k in known))
    extra = sorted(t for t in targets if t not in ORDER and t not in rest)
    return known + extra + rest


def table(trace, load, by_target):
    print(f"### {trace}, load {load}\n")
    print("| target | follow-up TTFT p50 / p90 / p99 | first-turn TTFT p50 / p90 / p99 "
          "| all TTFT p99 | all e2e p99 | hit rate | req/s | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for target in ordered(by_target):
        f = by_target[target]
        name = NAMES.get(target, target)
        if f["rounds"] > 1:
            name += f" ({f['rounds']} rounds)"
        hit = "-" if f["hit"] is None else f"{f['hit']:.3f}"
        rps = "-" if f["rps"] is None else f"{f['rps']:.2f}"
        errs = "-" if f["errors"] is None else f"{f['errors']:.0f}"
        if f["error_kinds"]:
            errs += " (" + ", ".join(f["error_kinds"]) + ")"
        print(f"| {name} | {' / '.join(ms(v) for v in f['fu'])} | "
              f"{' / '.join(ms(v) for v in f['ft'])} | {ms(f['all_ttft_p99'])} | "
              f"{ms(f['all_e2e_p99'])} | {hit} | {rps} | {errs} |")
    print()
    w, s = by_target.get("boost-sa"), by_target.get("sgl-cache_aware")
    if w and s and w["fu"][0] and s["fu"][0]:
        ratio = s["fu"][0] / w["fu"][0]
        hit_ok = w["hit"] is not None and s["hit"] is not None and w["hit"] >= s["hit"]
        p99_ok = (w["all_ttft_p99"] is not None and s["all_ttft_p99"] is not None
                  and w["all_ttft_p99"] <= s["all_ttft_p99"])
        print(f"Target (boost-sa against sglang-router cache_aware): follow-up TTFT p50 "
              f"{ratio:.2f}x lower (target >= 1.5: {'met' if ratio >= 1.5 else 'NOT met'}); "
              f"hit rate {fmt(w['hit'])} vs {fmt(s['hit'])} ({'met' if hit_ok else 'NOT met'}); "
              f"all-request TTFT p99 {ms(w['all_ttft_p99'])} vs {ms(s['all_ttft_p99'])} "
              f"({'met' if p99_ok else 'NOT met'}).\n")
    one, two = by_target.get("boost-sa"), by_target.get("wp-x2")
    if one and two and one["fu"][0] and two["fu"][0]:
        print(f"Scale-out (two replicas behind HAProxy against one warmpath): follow-up TTFT "
              f"p50 {ms(two['fu'][0])} vs {ms(one['fu'][0])}, first-turn p50 "
              f"{ms(two['ft'][0])} vs {ms(one['ft'][0])}, hit rate {fmt(two['hit'])} vs "
              f"{fmt(one['hit'])}, errors {two['errors']:.0f} vs {one['errors']:.0f}.\n")


def plot(runs, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(no plot: matplotlib is not installed for {sys.executable}; run this script "
              "with a python that has it, e.g. /work/venv-sglang/bin/python)")
        return
    keys = sorted({(t, l) for (t, l, _) in runs})
    fig, axes = plt.subplots(len(keys), 2, figsize=(11, 3.6 * len(keys)), squeeze=False)
    for row, (trace, load) in enumerate(keys):
        targets = ordered({x for (t, l, x) in runs if (t, l) == (trace, load)})
        for col, follow_up in enumerate((True, False)):
            ax = axes[row][col]
            for target in targets:
                result = runs[(trace, load, target)][0]  # the first round
                values = sorted(s["ttft_ms"] / 1000 for s in result["samples"]
                                if s.get("follow_up") == follow_up and s.get("ttft_ms") is not None
                                and s.get("status") == 200)
                if not values:
                    continue
                ys = [(i + 1) / len(values) for i in range(len(values))]
                ax.step(values, ys, where="post", label=NAMES.get(target, target))
            ax.set_xscale("log")
            ax.set_xlabel("TTFT (s, log scale)")
            ax.set_ylabel("fraction of requests")
            ax.set_title(f"{trace}, load {load}: {'follow-ups' if follow_up else 'first turns'}")
            ax.grid(True, which="both", alpha=0.3)
            if row == 0 and col == 0:
                ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot: {path}")


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    out = args[0]
    plot_path = os.path.join(out, "peers-ttft.svg")
    if "--plot" in args:
        plot_path = args[args.index("--plot") + 1]
    runs = load_runs(out)
    if not runs:
        sys.exit(f"no peer_compare JSONs in {out}")
    for trace, load in sorted({(t, l) for (t, l, _) in runs}):
        table(trace, load, {x: figures(r) for (t, l, x), r in runs.items() if (t, l) == (trace, load)})
    plot(runs, plot_path)


if __name__ == "__main__":
    main()
