"""Test tiers: the fast tier (no Ray, no server processes, no network) and the integration tier.

`./dev fast` (`pytest --fast -q -n 3`) runs the fast tier, what a developer runs on every change (under a minute on
2 cores); `./dev pytest` runs every test, and `./dev check` the static checks (ruff, mypy): .ci/run runs both.

A test belongs to the integration tier when it lives under tests/integration/ or is marked ``ray``, ``slow``,
``netns`` or ``server`` (starts an engine, simulator or other server process of its own); tests under tests/unit/
are the fast tier and may carry none of those marks. In the fast tier two guards keep the tier honest: a test that
connects a socket to anything but loopback fails (the connect is refused, as on a machine without a network), and so
does a test that starts Ray.

The static checks (tests/unit/test_static.py) run only with ``--static``: CI runs them as their own step.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import socket
import sys
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import early
import pytest
from tserve_fixtures import tserve_executable, tserve_server  # noqa: F401

# the real-engine fixtures (session-scoped: one vLLM venv, one tiny model, one server per steps value for the run)
from vllm_fixtures import stop_vllm_servers, tiny_model_dir, vllm_engine_python, vllm_servers  # noqa: F401

INTEGRATION = ("ray", "slow", "netns", "server")
NET_REACHED = pytest.StashKey[list[str]]()  # the non-loopback addresses a fast-tier test tried to connect to
EARLY = pytest.StashKey[list[Any]]()  # the early jobs' processes (tests/early.py)
TESTS = Path(__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true", help="run only the fast tier (no Ray, no server processes)")
    parser.addoption("--static", action="store_true", help="also run the static checks (CI runs them as ./dev check)")


def pytest_configure(config: pytest.Config) -> None:
    # Jobs some tests need, started now at the lowest CPU priority (tests/early.py); in the controller only (xdist's
    # workers inherit where their output goes).
    if not hasattr(config, "workerinput"):
        config.stash[EARLY] = early.start([str(a) for a in config.args], bool(config.getoption("--fast")))


def pytest_unconfigure(config: pytest.Config) -> None:
    early.stop(config.stash.get(EARLY, []))


def _tier_dir(item: pytest.Item) -> str | None:
    """'unit' or 'integration' for a test under tests/unit/ or tests/integration/, else None."""
    try:
        rel = Path(str(item.path)).resolve().relative_to(TESTS)
    except ValueError:
        return None
    top = rel.parts[0] if len(rel.parts) > 1 else None
    return top if top in ("unit", "integration") else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marks = [m for m in INTEGRATION if item.get_closest_marker(m)]
        tier = _tier_dir(item)
        if tier == "unit" and marks:
            raise pytest.UsageError(
                f"{item.nodeid} is marked {marks[0]} (integration tier) but lives under tests/unit/: move it to "
                "tests/integration/"
            )
        if marks or tier == "integration":
            item.add_marker(pytest.mark.integration)
    # The real-engine files last (in their own order): their servers are started on first use and stopped once no
    # later test needs them (pytest_runtest_teardown), so no engine idles beside the Ray tests: an idle vLLM CPU
    # engine polls at ~15% of a core, and the sim's real-time runs share the 2 cores with it.
    items.sort(key=lambda i: _uses_engines(_relpath(i)))
    skip = []
    if not config.getoption("--static"):
        skip += [i for i in items if i.get_closest_marker("static")]
    if config.getoption("--fast"):
        skip += [i for i in items if i.get_closest_marker("integration")]
    if skip:
        dropped = set(map(id, skip))
        config.hook.pytest_deselected(items=skip)
        items[:] = [i for i in items if id(i) not in dropped]


# --- parallel runs (.ci/run: pytest -n 2 --dist loadscope) ---------------------------------------------------------

# The real-engine fixtures: a session-scoped server per steps value, so their tests belong in one process.
ENGINE_FIXTURES = ("vllm_servers", "vllm_engine_python", "tiny_model_dir", "tserve_server", "tserve_executable")
SERIAL = "ray-and-engines"
# The Ray files in three lanes, each run one test at a time (at most three Ray clusters at once). The suite waits on
# Ray starts, servers and real-time levels more than it computes (2026-12-02, a quiet fresh-clone .ci/run with the
# engine venvs cached: ~750 CPU-seconds in 553 s on 2 cores), so each lane is a critical path and the three are
# balanced by their cost (that run's durations: 491 s, 392 s and, beside it, 291 s of files without Ray): the first
# holds tune, the generator-fault file, the namespace cluster and the real engines (last); the second and third go
# to workers of their own from the start when .ci/run runs 3 workers (with 2, after the files without Ray), and the
# third lane's worker runs the files without Ray after it. No test in any lane may ride on real-time margins a busy
# host can break (the bounds left are on what rig owns, with wide margins). The sim's campaign test starts Ray only
# inside its `rig sweep` subprocesses (it is not marked ray): a unit of its own
# (tests/integration/test_sim_campaign.py).
SECOND_LANE = "ray-second-lane"
THIRD_LANE = "ray-third-lane"
LANE_FILES = {
    SECOND_LANE: frozenset(
        f"tests/integration/{name}.py"
        for name in (
            "test_placement_cluster",
            "test_sweep",
            "test_openai_strict_sweep",
            "test_agentic_sim",
            "test_command_run",
            "test_e2e_run",
            "test_secrets",
            "test_harden3_stall",
            # asserts the search's own consistency (probes, resume), not where its boundary lies
            "test_tune_search_sweep",
            "test_first_hour_runs",  # its bounds (a stop, a failed launch: < 60 s) are wide
            "test_live_view_run",
        )
    ),
    # ~100 s and ~65 s (a proof, then its arms across load changes): the third lane is the shortest
    THIRD_LANE: frozenset({"tests/integration/test_sim_faults_runs.py", "tests/integration/test_prove_run.py"}),
}


def _relpath_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _relpath(item: pytest.Item) -> str:
    return _relpath_of(item.nodeid)


@functools.cache
def _uses_engines(path: str) -> bool:
    """Whether a test file starts real engines (its text names one of their fixtures)."""
    file = TESTS.parent / path
    return file.is_file() and any(f in file.read_text() for f in ENGINE_FIXTURES)


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # The session's vLLM servers are stopped as soon as the next test is not a real-engine one (a later one starts
    # them again on first use); at the session's end the fixture's own teardown stops them.
    if nextitem is not None and _uses_engines(_relpath(item)) and not _uses_engines(_relpath(nextitem)):
        stop_vllm_servers()


@functools.cache
def xdist_scope(path: str) -> str:
    """The unit of work a file's tests go to a pytest-xdist worker in: files with Ray or real-engine tests are in one
    of three lanes, each run one test at a time (at most three Ray clusters at once, and never two engines); any other
    file is a unit of its own (a module-scoped fixture is built once)."""
    text = (TESTS.parent / path).read_text()
    ray = "pytest.mark.ray" in text or "pytest.mark.netns" in text  # the namespace cluster runs Ray too
    for lane, files in LANE_FILES.items():
        if path in files and not _uses_engines(path):
            return lane
    return SERIAL if ray or _uses_engines(path) else path


def order_units(queue: OrderedDict[str, Any], workers: int) -> None:
    """The order units go out in (the next worker that asks takes the first): the first lane first (the longest
    unit); with three or more workers the other lanes next, each on a worker of its own from the start; with two,
    the other lanes after the files without Ray, so they run beside the first lane's end. Files whose job the
    session started early (tests/early.py) go last: by then their job has had the most time."""
    lanes = [lane for lane in LANE_FILES if lane in queue]
    if lanes and len(queue) > len(lanes):
        for lane in reversed(lanes) if workers >= 3 else lanes:
            queue.move_to_end(lane, last=workers < 3)
    if SERIAL in queue:
        queue.move_to_end(SERIAL, last=False)
    for _, path in early.JOBS.values():
        if path in queue:
            queue.move_to_end(path)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    # xdist's loadgroup marks no longer reach its scheduler under pytest 9.2 (nodeids are not rewritten any more), so
    # the grouping is a scheduler of our own: loadscope with files mapped to their unit.
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(_relpath_of(nodeid))

        def _assign_work_unit(self, node: Any) -> None:
            order_units(self.workqueue, len(self.nodes))
            super()._assign_work_unit(node)

    return ByUnit(config, log)


# --- where the suite's time goes (RIG_TEST_TIMELINE=FILE): one JSON line per test phase, with its worker ---------


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Lanes are balanced by what each worker actually spent: scripts/test_timeline.py reads these lines.
    path = os.environ.get("RIG_TEST_TIMELINE")
    if not path or hasattr(report, "node"):  # the xdist controller sees each worker's reports again: written once
        return
    line = {
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "unit": xdist_scope(_relpath_of(report.nodeid)),
        "nodeid": report.nodeid,
        "when": report.when,
        "start": report.start,
        "stop": report.stop,
        "outcome": report.outcome,
    }
    with open(path, "a") as f:  # one short append per line: lines from several workers do not interleave
        f.write(json.dumps(line) + "\n")


# --- fast-tier guards: no network, no Ray ------------------------------------------------------------------------


def _is_local(address: Any) -> bool:
    if not isinstance(address, tuple) or not address or not isinstance(address[0], str):
        return True  # not an internet address (a Unix socket's path)
    host = address[0]
    if host in ("", "localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False  # a host name other than localhost: resolving and reaching it needs the network
    return ip.is_loopback or ip.is_unspecified


@pytest.fixture(autouse=True)
def _fast_tier_guards(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if request.node.get_closest_marker("integration"):
        yield
        return
    reached: list[str] = []
    request.node.stash[NET_REACHED] = reached

    def guarded(original: Any) -> Any:
        def connect(self: socket.socket, address: Any) -> Any:
            if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(address):
                reached.append(repr(address))
                raise OSError(101, f"fast tier: no network (connect to {address!r} refused by tests/conftest.py)")
            return original(self, address)

        return connect

    monkeypatch.setattr(socket.socket, "connect", guarded(socket.socket.connect))
    monkeypatch.setattr(socket.socket, "connect_ex", guarded(socket.socket.connect_ex))
    ray_before = "ray" in sys.modules
    if ray_before:

        def no_ray(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("fast tier: Ray is not started here (mark the test `ray`: integration tier)")

        monkeypatch.setattr(sys.modules["ray"], "init", no_ray)
    yield
    if reached:
        pytest.fail(f"fast-tier test reached the network: {', '.join(reached)} (mark it integration)")
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
        pytest.fail("fast-tier test started Ray (mark it `ray`: integration tier)")
