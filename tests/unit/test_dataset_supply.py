"""A dataset smaller than its level (rate x duration) is flagged, and a trace whose timestamps may not mean seconds
is said before the run starts."""

from __future__ import annotations

import json

from rig.config import build_spec
from rig.contracts import GeneratorReport, Thresholds, judge_point
from rig.notices import notices
from rig.run.plans import build_plans
from rig.run.points import expand_points


def _dataset(path, n, stamps=None):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"q {i}", **({"timestamp": stamps[i]} if stamps else {})}) + "\n")
    return str(path)


def _spec(path, **load):
    return build_spec({"workloads": [{"name": "dataset", "path": path}], "steps": [0], "load": load}, {})


def test_an_open_loop_level_that_outruns_its_dataset_plans_where_it_ends_and_is_flagged(tmp_path):
    spec = _spec(_dataset(tmp_path / "d.jsonl", 20), mode="poisson", rates=[2.0, 10.0], duration_s=5.0)
    slow, fast = expand_points(spec)
    plans = {p.rate: build_plans(spec, p, "http://h:1", "m", "openai-completions", [0, 1], None) for p in (slow, fast)}
    assert all(pl.supply_ends_s is None for pl in plans[2.0])  # ~10 arrivals in 5 s: the file's 20 suffice
    ends = {pl.supply_ends_s for pl in plans[10.0]}
    assert len(ends) == 1 and 1.0 < ends.pop() < 3.0  # the 21st arrival of ~50, about 2 s in
    assert sum(len(pl.sessions) for pl in plans[10.0]) == 20
    assert any("fewer than rate x duration at rate 10" in n and "dataset_exhausted" in n for n in notices(spec))
    # with cycle the file repeats: nothing runs out
    cyc = build_spec(
        {
            "workloads": [{"name": "dataset", "path": str(tmp_path / "d.jsonl"), "cycle": True}],
            "steps": [0],
            "load": {"mode": "poisson", "rates": [10.0], "duration_s": 5.0},
        },
        {},
    )
    assert all(pl.supply_ends_s is None for pl in build_plans(cyc, expand_points(cyc)[0], "u", "m", "a", [0], None))


def test_a_generator_whose_sessions_ran_out_flags_its_point_as_judged():
    t = Thresholds()
    ran_out = GeneratorReport(generator=1, status="complete", ran_out_s=2.04)
    flags = judge_point("poisson", [GeneratorReport(generator=0, status="complete"), ran_out], t)
    assert (
        list(flags) == ["dataset_exhausted"]
        and "ran out 2.0s into a level bound by its duration" in flags["dataset_exhausted"]
    )
    assert judge_point("closed", [GeneratorReport(generator=0, status="complete")], t) == {}


def test_a_trace_in_milliseconds_or_with_an_idle_gap_is_said_before_it_starts(tmp_path):
    ms = _spec(_dataset(tmp_path / "ms.jsonl", 20, [1_700_000_000_000 + 250 * i for i in range(20)]), mode="trace")
    assert any("looks like milliseconds since the epoch" in n for n in notices(ms))
    relative_ms = _spec(_dataset(tmp_path / "rel.jsonl", 20, [250 * i for i in range(20)]), mode="trace")
    assert any("the replay spans 1.3 hours" in n for n in notices(relative_ms))
    gap = [0.5 * i + (7200 if i >= 10 else 0) for i in range(20)]
    idle = _spec(_dataset(tmp_path / "gap.jsonl", 20, gap), mode="trace")
    assert any("gap.jsonl:11: 7,200 s after the entry before it" in n for n in notices(idle))
    fine = _spec(_dataset(tmp_path / "ok.jsonl", 20, [0.5 * i for i in range(20)]), mode="trace")
    assert notices(fine) == []
