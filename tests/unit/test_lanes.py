"""The suite's own scheduling (tests/conftest.py order_units) and its early jobs' selection (tests/early.py)."""

from __future__ import annotations

from collections import OrderedDict

import early
from conftest import SECOND_LANE, SERIAL, THIRD_LANE, order_units

FIT = "tests/integration/test_sim_fit_campaign.py"


def _queue() -> OrderedDict[str, dict]:
    return OrderedDict(
        (k, {}) for k in ("tests/unit/test_a.py", THIRD_LANE, SECOND_LANE, FIT, SERIAL, "tests/unit/test_b.py")
    )


def _taken(workers: int) -> list[str]:
    queue, out = _queue(), []
    while queue:
        order_units(queue, workers)
        out.append(queue.popitem(last=False)[0])
    return out


def test_two_workers_take_the_first_lane_first_and_the_other_lanes_after_the_files_without_ray():
    assert _taken(2) == [SERIAL, "tests/unit/test_a.py", "tests/unit/test_b.py", SECOND_LANE, THIRD_LANE, FIT]


def test_three_workers_start_the_three_lanes_at_once_and_the_early_jobs_file_goes_last():
    assert _taken(3) == [SERIAL, SECOND_LANE, THIRD_LANE, "tests/unit/test_a.py", "tests/unit/test_b.py", FIT]


def test_an_early_job_starts_only_when_its_file_is_selected():
    assert early.wanted([], FIT) and early.wanted(["tests"], FIT) and early.wanted([FIT + "::test_x"], FIT)
    assert early.wanted(["tests/integration", "-q"], FIT)
    assert not early.wanted(["tests/unit"], FIT) and not early.wanted(["tests/integration/test_tune.py"], FIT)
