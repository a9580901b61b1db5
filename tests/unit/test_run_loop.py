"""The runner's one point loop, for a grid and for a planner: when servers launch, and what a server that does not
start or dies does to the points after it. The cluster, the server and the point runs are stand-ins (no Ray)."""

from __future__ import annotations

import pytest

from rig.config import build_spec
from rig.contracts import ServerConfigEntry
from rig.results import read_manifest
from rig.run.errors import RunError
from rig.run.points import expand_points
from rig.run.progress import Progress
from rig.run.runner import Runner
from rig.server.actor import ServerError


class FakeServer:
    """Launches succeed unless the configuration is in ``refuse`` (each launch of it fails)."""

    def __init__(self, store, refuse: set[str] = frozenset(), refuse_once: set[str] = frozenset()):
        self.store = store
        self.refuse, self.refuse_once = set(refuse), set(refuse_once)
        self.launches: list[str] = []
        self.up: str | None = None

    def launch(self, cfg):
        cid = cfg.config_id()
        self.launches.append(cid)
        self.store.set_server_config(cid, ServerConfigEntry(status="starting"))  # as the real launch, before it answers
        if cid in self.refuse or cid in self.refuse_once:
            self.refuse_once.discard(cid)
            raise ServerError("engine exited with code 1 before it was healthy\nlast log lines ...")
        self.up = cid
        self.store.update_server_config(cid, status="ready")
        return self.store.server_config(cid).model_copy(update={"url": f"http://127.0.0.1:1/{cid}"})

    def fetch_log(self, config_id: str) -> None:
        pass

    def stop_server(self) -> None:
        self.up = None


class FakeExecutor:
    """Completes each point, except those in ``die``: their server exits during the point."""

    def __init__(self, runner: Runner, server: FakeServer, die: set[str] = frozenset()):
        self.runner, self.server, self.die = runner, server, set(die)
        self.ran: list[str] = []

    def run_point(self, p, server_entry) -> None:
        assert self.server.up == p.config_id and server_entry.url.endswith(p.config_id)
        self.ran.append(p.point)
        store = self.runner.store
        if p.point in self.die:
            store.update_point(
                p.point, status="failed", flags=["server_died"], error="server exited with code -9 during the point"
            )
        else:
            store.update_point(p.point, status="complete")
        store.save()

    def internal_error(self, pid: str, err: Exception) -> None:
        raise AssertionError(f"unexpected internal error on {pid}: {err!r}")


def make_runner(
    tmp_path,
    run_id: str,
    planned: bool = False,
    fail_fast: bool = False,
    refuse=(),
    refuse_once=(),
    die=(),
    messages: list[str] | None = None,
) -> Runner:
    spec = build_spec(
        {},
        {
            "out": str(tmp_path),
            "run_id": run_id,
            "steps": [0, 2],
            "fail_fast": fail_fast,
            "load": {"concurrency": [1, 2]},
        },
    )
    progress = Progress(status=(messages.append if messages is not None else (lambda msg: None)))
    grid = expand_points(spec)
    runner = Runner(spec, progress=progress, planner=(lambda r: iter(grid)) if planned else None)
    runner._setup_cluster = lambda: None  # no cluster: the stand-ins need none
    runner.server = FakeServer(runner.store, set(refuse), set(refuse_once))
    runner.executor = FakeExecutor(runner, runner.server, set(die))
    return runner


def ids(tmp_path):
    """Point ids and configuration ids of the grid: steps 0 and 2, each at concurrency 1 then 2."""
    spec = build_spec({}, {"out": str(tmp_path), "steps": [0, 2], "load": {"concurrency": [1, 2]}})
    points = expand_points(spec)
    return [p.point for p in points], [points[0].config_id, points[2].config_id]


def set_fields(entry: ServerConfigEntry) -> dict:
    """What the run recorded for a server configuration (fields left at their defaults are not shown)."""
    return entry.model_dump(exclude_defaults=True)


def statuses(runner: Runner) -> dict[str, tuple[str, str | None]]:
    return {e["point"]: (e["status"], e.get("error")) for e in read_manifest(runner.run_dir)["points"]}


def test_a_grid_launches_each_configuration_once_and_runs_its_points_in_order(tmp_path):
    (a1, a2, b1, b2), (a, b) = ids(tmp_path)
    runner = make_runner(tmp_path, "ok")
    m = runner.run()
    assert runner.server.launches == [a, b]
    assert runner.executor.ran == [a1, a2, b1, b2]
    assert m.status == "complete"
    assert [set_fields(m.server_configs[c]) for c in (a, b)] == [{"status": "ready", "stopped": True}] * 2


def test_a_grid_fails_the_rest_of_a_configuration_whose_server_did_not_start(tmp_path):
    (a1, a2, b1, b2), (a, b) = ids(tmp_path)
    messages: list[str] = []
    runner = make_runner(tmp_path, "refused", refuse={a}, messages=messages)
    m = runner.run()
    assert runner.server.launches == [a, b]  # not launched again for its second point
    assert runner.executor.ran == [b1, b2]
    # the engine's last log line says why it exited: the point's error and the screen show it
    why = "server did not start: engine exited with code 1 before it was healthy; its log ends: last log lines ..."
    assert statuses(runner) == {
        a1: ("failed", why),
        a2: ("failed", why),
        b1: ("complete", None),
        b2: ("complete", None),
    }
    assert m.status == "partial"
    assert set_fields(m.server_configs[a]) == {
        "status": "failed",
        "error": "engine exited with code 1 before it was healthy\nlast log lines ...",
    }  # not "stopped": it never ran
    assert f"server {a} failed to start: {why.removeprefix('server did not start: ')}" in messages
    assert f"server {a} log, last lines:\n  last log lines ..." in messages


def test_a_grid_fails_the_rest_of_a_configuration_whose_server_died(tmp_path):
    (a1, a2, b1, b2), (a, b) = ids(tmp_path)
    runner = make_runner(tmp_path, "died", die={a1})
    m = runner.run()
    assert runner.server.launches == [a, b]
    assert runner.executor.ran == [a1, b1, b2]
    assert statuses(runner) == {
        a1: ("failed", "server exited with code -9 during the point"),
        a2: ("failed", "server died earlier"),
        b1: ("complete", None),
        b2: ("complete", None),
    }
    assert m.status == "partial" and set_fields(m.server_configs[a]) == {"status": "ready", "stopped": True}


def test_fail_fast_stops_at_the_first_failed_point(tmp_path):
    (a1, a2, b1, b2), _ = ids(tmp_path)
    runner = make_runner(tmp_path, "ff", fail_fast=True, die={a1})
    with pytest.raises(RunError, match=f"point {a1} failed: server exited with code -9"):
        runner.run()
    assert runner.executor.ran == [a1]
    assert {k: s for k, (s, _) in statuses(runner).items()} == {
        a1: "failed",
        a2: "pending",
        b1: "pending",
        b2: "pending",
    }
    assert read_manifest(runner.run_dir)["status"] == "failed"


def test_a_planner_relaunches_a_server_that_died_for_its_next_point(tmp_path):
    (a1, a2, b1, b2), (a, b) = ids(tmp_path)
    runner = make_runner(tmp_path, "plan-died", planned=True, die={a1})
    m = runner.run()
    assert runner.server.launches == [a, a, b]
    assert runner.executor.ran == [a1, a2, b1, b2]
    assert [e.point for e in m.points] == [a1, a2, b1, b2]  # entries added as the planner yields them
    assert statuses(runner)[a2] == ("complete", None) and m.status == "partial"


def test_a_planner_tries_the_launch_again_for_its_next_point(tmp_path):
    (a1, a2, b1, b2), (a, b) = ids(tmp_path)
    runner = make_runner(tmp_path, "plan-refused", planned=True, refuse_once={a})
    m = runner.run()
    assert runner.server.launches == [a, a, b]
    assert runner.executor.ran == [a2, b1, b2]
    assert statuses(runner)[a1] == (
        "failed",
        "server did not start: engine exited with code 1 before it was healthy; its log ends: last log lines ...",
    )
    assert m.status == "partial"


def test_an_internal_error_fails_its_point_with_one_line_and_the_run_goes_on(tmp_path):
    from rig.run.execute import PointExecutor

    (a1, a2, b1, b2), _ = ids(tmp_path)
    messages: list[str] = []
    runner = make_runner(tmp_path, "bug", messages=messages)
    stand_in = runner.executor
    real = PointExecutor(runner.ctx, runner.server)

    class Broken:
        """The stand-in's points, except a2, whose run raises a multi-line error; the real executor records it."""

        def run_point(self, p, server_entry) -> None:
            if p.point == a2:
                raise ValueError("bad answer\nTraceback (most recent call last): ...")
            stand_in.run_point(p, server_entry)

        internal_error = real.internal_error

    runner.executor = Broken()
    m = runner.run()
    assert statuses(runner) == {
        a1: ("complete", None),
        a2: ("failed", "internal error: ValueError: bad answer"),
        b1: ("complete", None),
        b2: ("complete", None),
    }
    assert m.status == "partial"
    log = runner.run_dir / "logs" / "driver.log"
    assert "Traceback" in log.read_text() and "bad answer" in log.read_text()
    assert f"{a2}: internal error (ValueError); traceback in {log}" in messages


def test_a_levels_common_start_leads_by_the_generators_round_trips_within_bounds():
    from rig.run.fleet import LEAD_CEILING_PER_GENERATOR_S, START_LEAD_S, Fleet

    fleet = Fleet()
    assert fleet.start_lead_s() == START_LEAD_S[0]  # no generator yet: the floor
    fleet.active = [(0, None), (1, None), (2, None)]
    fleet.gen_info = [{"generator": g, "clock_rtt_s": rtt} for g, rtt in ((0, 0.001), (1, 0.08), (2, None))]
    assert fleet.start_lead_s() == pytest.approx(10 * 0.08 + 0.005 * 3)  # the slowest generator's round trips
    fleet.active = [(0, None), (2, None)]  # a generator dropped: only those still running count
    assert fleet.start_lead_s() == START_LEAD_S[0]
    fleet.gen_info[0]["clock_rtt_s"] = 5.0
    assert fleet.start_lead_s() == pytest.approx(START_LEAD_S[1] + 2 * LEAD_CEILING_PER_GENERATOR_S)


def test_a_run_the_disk_check_refuses_leaves_no_run_directory_behind(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(2**30, 2**30 - 2**20, 2**20))
    runner = make_runner(tmp_path, "full")
    with pytest.raises(RunError, match="only 1 MiB free"):
        runner.run()
    assert not (tmp_path / "full").exists()  # the id can be used again once there is room
    monkeypatch.undo()
    assert make_runner(tmp_path, "full").run().status == "complete"
