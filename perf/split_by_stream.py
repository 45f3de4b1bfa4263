#!/usr/bin/env python3
"""Percentiles of a `warmpath bench` run's JSON for each kind of client, when the run mixed them
(`--no-stream=PERCENT`): for streaming requests the time to the first token, for the others the
time to the whole response (what each client waits for; the JSON's `ttft_ms` is both).

    python3 perf/split_by_stream.py RESULT.json [RESULT.json ...]

One line per file and kind: requests, then p50 / p90 / p99 in ms of first turns, follow-ups and
all (nearest rank, as the bench's own report).
"""
import json
import math
import sys


def pct(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[max(1, math.ceil(p / 100 * len(values))) - 1]


def main(paths):
    for path in paths:
        samples = json.load(open(path))["samples"]
        ok = [s for s in samples if s["failure"] is None and 200 <= s["status"] < 300]
        for stream, kind in ((True, "streaming"), (False, "whole")):
            mine = [s for s in ok if s.get("stream", True) == stream]
            groups = {
                "first": [s["ttft_ms"] for s in mine if not s["follow_up"]],
                "follow": [s["ttft_ms"] for s in mine if s["follow_up"]],
                "all": [s["ttft_ms"] for s in mine],
            }
            cells = " | ".join(
                f"{name} {pct(v, 50):.0f} / {pct(v, 90):.0f} / {pct(v, 99):.0f}"
                for name, v in groups.items()
            )
            print(f"{path} {kind}: {len(mine)} requests | {cells}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
