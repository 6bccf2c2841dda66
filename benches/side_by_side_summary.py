#!/usr/bin/env python3
"""Tables from the results.tsv of benches/side_by_side.sh (one row per run).

usage: side_by_side_summary.py results.tsv [more.tsv ...]

Prints markdown: first the CPU time per request of each target in each scenario (medians over
the runs) with egressd's ratio to the best of the peers (nginx, HAProxy, Envoy; `direct` is no
peer), then one table per scenario with every column. Several files (runs of the same
binaries on the same machine) are merged before the medians are taken.
"""
import csv
import statistics
import sys
from collections import OrderedDict

ORDER = ["direct", "nginx", "haproxy", "envoy", "egressd"]
NAMES = {"direct": "direct", "nginx": "nginx", "haproxy": "HAProxy", "envoy": "Envoy", "egressd": "egressd"}
PEERS = ["nginx", "haproxy", "envoy"]


def number(row, key):
    try:
        v = float(row[key])
    except (KeyError, ValueError):
        return None
    return None if v != v else v


def median(rows, key):
    vals = [v for v in (number(r, key) for r in rows) if v is not None]
    return statistics.median(vals) if vals else None


def fmt(v, spec):
    return "–" if v is None else format(v, spec)


def main(paths):
    runs = OrderedDict()
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f, delimiter="\t"):
                runs.setdefault(row["scenario"], {}).setdefault(row["target"], []).append(row)
    if not runs:
        sys.exit("no runs in " + ", ".join(paths))
    targets = [t for t in ORDER if any(t in by for by in runs.values())]
    reps = max(len(rs) for by in runs.values() for rs in by.values())

    print(f"CPU time of the server under test per request, µs (median of {reps} runs; lower is better).")
    print("`direct`: the origin alone, serving the load itself (no proxy).\n")
    head = ["scenario"] + [NAMES[t] for t in targets]
    has_ratio = "egressd" in targets and any(p in targets for p in PEERS)
    if has_ratio:
        head.append("egressd ÷ best peer")
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for scenario, by in runs.items():
        us = {t: median(by[t], "us_per_req") for t in targets if t in by}
        cells = [fmt(us.get(t), ".1f") for t in targets]
        if has_ratio:
            peers = [us[p] for p in PEERS if us.get(p) is not None]
            ratio = us.get("egressd") / min(peers) if peers and us.get("egressd") else None
            cells.append(fmt(ratio, ".2f"))
        print(f"| {scenario} | " + " | ".join(cells) + " |")

    print("\nEvery column, medians over runs (RSS: the largest sample, taken halfway through each run;")
    print("`core busy`: the server core's busy time from /proc/stat, which also counts anything else")
    print("that ran there; `errors`: summed over runs).\n")
    cols = ["target", "runs", "req/s", "p50 ms", "p99 ms", "µs/req", "server CPU %", "core busy %",
            "RSS MiB", "errors", "µs/req per run"]
    for scenario, by in runs.items():
        print(f"**{scenario}**\n")
        print("| " + " | ".join(cols) + " |")
        print("|---|" + "---:|" * (len(cols) - 2) + "---|")
        for t in targets:
            rs = by.get(t)
            if not rs:
                continue
            rss = [v for v in (number(r, "rss_mib") for r in rs) if v is not None]
            errors = sum(int(number(r, "errors") or 0) for r in rs)
            per_run = " / ".join(fmt(number(r, "us_per_req"), ".1f") for r in rs)
            print(
                f"| {NAMES[t]} | {len(rs)} | {fmt(median(rs, 'rps'), ',.0f')} | {fmt(median(rs, 'p50_ms'), '.2f')} "
                f"| {fmt(median(rs, 'p99_ms'), '.2f')} | {fmt(median(rs, 'us_per_req'), '.1f')} "
                f"| {fmt(median(rs, 'server_cpu_pct'), '.0f')} | {fmt(median(rs, 'core_busy_pct'), '.0f')} "
                f"| {fmt(max(rss) if rss else None, '.1f')} | {errors} | {per_run} |"
            )
        print()


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        sys.exit(0 if len(sys.argv) > 1 else 2)
    main(sys.argv[1:])
