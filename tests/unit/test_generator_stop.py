"""A stop that reaches a generator while its level writes the last part (the CI failure of 85de48f: under load, the
server's death was seen as the level ended; the stop cancelled the final write's wait, run_point raised
CancelledError, the driver counted no rows while the writer's thread went on and wrote 11)."""

from __future__ import annotations

import asyncio
import threading
import time

import pyarrow.parquet as pq
from aiohttp.test_utils import TestServer
from fake_server import make_app
from synthetic import point_columns

from rig.loadgen.actor import LoadGenerator
from rig.loadgen.plan import GeneratorPlan
from rig.results import PART_GLOB, requests_dir
from rig.workloads.base import Session, Turn

INFO = point_columns()


def _sessions(n: int) -> tuple[Session, ...]:
    return tuple(
        Session(
            session_id=f"s{i}",
            turns=(Turn(request_id=f"r{i}", max_tokens=4, messages=({"role": "user", "content": "hello"},)),),
        )
        for i in range(n)
    )


def test_a_stop_during_the_last_part_write_lets_it_finish_and_the_report_counts_its_rows(tmp_path):
    release = threading.Event()  # holds the final write in its thread until the stop has arrived

    async def go():
        server = TestServer(make_app())
        await server.start_server()
        gen = LoadGenerator(0, str(tmp_path))
        plan = GeneratorPlan(
            point=INFO, generator=0, url=str(server.make_url("")).rstrip("/"), model="m", sessions=_sessions(6), slots=2
        )
        try:
            await gen.prepare(plan)
            writer = gen._current.writer
            close = writer.close

            def slow_close() -> None:
                release.wait(5)
                close()

            writer.close = slow_close  # type: ignore[method-assign]
            run = asyncio.get_running_loop().create_task(gen.run_point(time.time()))
            for _ in range(500):  # until the level has ended and the last write waits in its thread
                if gen._current.ended_mono is not None:
                    break
                await asyncio.sleep(0.01)
            stop = asyncio.get_running_loop().create_task(gen.stop())
            await asyncio.sleep(0.1)  # the stop has arrived while the write is held
            release.set()
            await stop
            return await asyncio.wait_for(run, 5)
        finally:
            release.set()
            await gen.close()
            await server.close()

    report = asyncio.run(go())
    rows = [
        s
        for part in sorted(requests_dir(tmp_path, "p0", 0).glob(PART_GLOB))
        for s in pq.read_table(part, columns=["status"]).column("status").to_pylist()
    ]
    assert report.status == "complete" and report.records.ok == 6 == len(rows)
    assert rows == ["ok"] * 6 and report.rows_written == 6


def test_a_stop_before_the_level_starts_returns_an_empty_report_not_a_cancelled_task(tmp_path):
    async def go():
        gen = LoadGenerator(0, str(tmp_path))
        plan = GeneratorPlan(point=INFO, generator=0, url="http://127.0.0.1:9", model="m", sessions=_sessions(2))
        gen._http = object()  # type: ignore[assignment]  # never used: the level is stopped before its first step
        from rig.loadgen.drive import PointRun

        gen._current = PointRun(plan, tmp_path, "h", 0.0)
        run = asyncio.get_running_loop().create_task(gen.run_point(time.time() + 5))
        await asyncio.sleep(0)  # run_point has made the level's task, which has not run a step yet
        gen._task.cancel()  # type: ignore[union-attr]  # a stop that lands before the first step
        return await run

    report = asyncio.run(go())
    assert report.status == "interrupted" and report.records.ok == 0 and report.scheduled == 0


def _executor(tmp_path, monkeypatch, answers: bool):
    """A PointExecutor over one fake generator that does (or does not) answer a ping; Ray is a stand-in."""
    import types

    import ray as real_ray

    import rig.run.execute as execute
    from rig.run.fleet import Fleet

    alive = {"up": True}
    killed: list[int] = []

    def ping():
        if not alive["up"]:
            return real_ray.exceptions.RayActorError()
        return 0.0 if answers else real_ray.exceptions.GetTimeoutError()

    def fake_get(x, timeout=None):
        if isinstance(x, BaseException):
            raise x
        return x

    def kill(handle):
        killed.append(0)
        alive["up"] = False

    gen = types.SimpleNamespace(clock=types.SimpleNamespace(remote=ping))
    monkeypatch.setattr(execute, "ray", types.SimpleNamespace(get=fake_get, kill=kill, exceptions=real_ray.exceptions))
    fleet = Fleet()
    fleet.active = [(0, gen)]
    ctx = types.SimpleNamespace(fleet=fleet, run_dir=tmp_path)
    ex = execute.PointExecutor(ctx, None)  # type: ignore[arg-type]
    ex.gather_one = lambda pid, gid: {}
    return ex, fleet, killed


def test_a_generator_whose_task_failed_but_answers_stays_for_the_next_point(tmp_path, monkeypatch):
    ex, fleet, killed = _executor(tmp_path, monkeypatch, answers=True)
    report = ex.salvage("p0", 0, "generator task failed: x", keep=ex._answers(0))
    assert [g for g, _ in fleet.active] == [0] and killed == [] and report.status == "failed"


def test_a_generator_whose_task_failed_and_does_not_answer_is_killed_before_its_rows_are_counted(tmp_path, monkeypatch):
    ex, fleet, killed = _executor(tmp_path, monkeypatch, answers=False)
    report = ex.salvage("p0", 0, "generator task failed: x", keep=ex._answers(0))
    assert fleet.active == [] and killed == [0] and report.records.ok == 0
