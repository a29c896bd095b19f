"""Do two runs write the same metrics? Compares two metrics.jsonl files value by value, timings and speeds aside
(a behaviour-preserving change must leave every other value bit for bit the same on a fixed seed in fp32).

    python benchmarks/same_metrics.py BEFORE/metrics.jsonl AFTER/metrics.jsonl [--out RESULT.md]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TIMED = ("timing_s/", "perf/", "time", "sync/seconds", "sync/GBps", "sync/gather_s", "sync/cast_s", "sync/load_s")


def compare(before: Path, after: Path) -> tuple[int, list[str]]:
    """(values compared, one line per value that differs or is missing)."""
    rows = [[json.loads(line) for line in p.read_text().splitlines()] for p in (before, after)]
    if len(rows[0]) != len(rows[1]):
        return 0, [f"{len(rows[0])} rows against {len(rows[1])}"]
    compared, differ = 0, []
    for x, y in zip(*rows):
        for key in sorted(set(x) | set(y)):
            if key.startswith(TIMED):
                continue
            compared += 1
            if x.get(key) != y.get(key):
                differ.append(f"step {x.get('step')} {key}: {x.get(key)!r} -> {y.get(key)!r}")
    return compared, differ


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    compared, differ = compare(args.before, args.after)
    text = f"{compared} values compared, {len(differ)} differ" + "".join(f"\n- {d}" for d in differ[:50])
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
