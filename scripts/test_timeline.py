"""Where a suite run's time went, per pytest-xdist worker and per unit (a lane, or a file), from the lines
tests/conftest.py writes when RIG_TEST_TIMELINE=FILE is set:

    RIG_TEST_TIMELINE=/tmp/t.jsonl ./dev test && ./dev python scripts/test_timeline.py /tmp/t.jsonl

A worker's span is its first test's start to its last test's end, relative to the first start of the run; the
critical path is the longest span. Units are listed per worker in the order they ran, with their own span."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def load(path: Path) -> list[dict]:
    lines = []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        try:
            lines.append(json.loads(raw))
        except json.JSONDecodeError:
            sys.exit(f"test_timeline: {path}:{n} is not a JSON line")
    if not lines:
        sys.exit(f"test_timeline: {path} holds no test phase (was RIG_TEST_TIMELINE set for the run?)")
    return lines


def summarize(lines: list[dict], top: int = 8) -> str:
    t0 = min(x["start"] for x in lines)
    by_worker: dict[str, list[dict]] = defaultdict(list)
    for x in lines:
        by_worker[x["worker"]].append(x)
    out = []
    spans = {w: max(x["stop"] for x in xs) - min(x["start"] for x in xs) for w, xs in by_worker.items()}
    for w in sorted(by_worker, key=lambda k: -spans[k]):
        xs = sorted(by_worker[w], key=lambda x: x["start"])
        busy = sum(x["stop"] - x["start"] for x in xs)
        first, last = xs[0]["start"] - t0, xs[-1]["stop"] - t0
        out.append(f"{w}: {first:6.1f}-{last:6.1f} s (span {spans[w]:.1f} s, in tests {busy:.1f} s)")
        units: dict[str, list[float]] = {}
        for x in xs:
            u = units.setdefault(x["unit"], [x["start"], x["stop"], 0.0])
            u[1] = max(u[1], x["stop"])
            u[2] += x["stop"] - x["start"]
        for unit, (a, b, spent) in sorted(units.items(), key=lambda kv: kv[1][0]):
            out.append(f"    {a - t0:6.1f}-{b - t0:6.1f} s  {spent:6.1f} s  {unit}")
    tests: dict[str, float] = defaultdict(float)
    for x in lines:
        tests[x["nodeid"]] += x["stop"] - x["start"]
    out.append(f"slowest {top} tests (setup + call + teardown):")
    for nodeid, spent in sorted(tests.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"    {spent:6.1f} s  {nodeid}")
    return "\n".join(out)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: scripts/test_timeline.py FILE   (the file RIG_TEST_TIMELINE named)")
    print(summarize(load(Path(sys.argv[1]))))


if __name__ == "__main__":
    main()
