"""Scale-out pieces without a cluster: clock-offset sign end to end, where part files go, shipping and gathering."""

from __future__ import annotations

import asyncio
import time as real_time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp.test_utils import TestServer
from fake_server import make_app

from rig import placement as rc
from rig.config import ClusterSpec, SpecError, build_spec
from rig.contracts import PointColumns
from rig.loadgen import actor as actor_mod
from rig.loadgen import drive as drive_mod
from rig.loadgen import spool
from rig.loadgen.actor import LoadGenerator
from rig.loadgen.plan import GeneratorPlan
from rig.results import read_requests
from rig.workloads.base import Session, Turn

INFO = PointColumns(
    run_id="r",
    point="p0",
    engine="external",
    workload="t",
    api="sglang-native",
    steps=0,
    server_config="x",
    server_args="{}",
    load_mode="poisson",
    concurrency=None,
    rate=10.0,
    repeat=0,
)


def sessions(n: int) -> tuple[Session, ...]:
    return tuple(
        Session(
            session_id=f"s{i}",
            turns=(Turn(request_id=f"s{i}-t0", max_tokens=4, messages=({"role": "user", "content": f"q{i}"},)),),
        )
        for i in range(n)
    )


class SkewedClock:
    """The time module as seen on a host whose wall clock runs ``skew`` seconds ahead of the driver's."""

    def __init__(self, skew: float):
        self.skew = skew

    def time(self) -> float:
        return real_time.time() + self.skew

    def __getattr__(self, name):
        return getattr(real_time, name)


# ------------------------------------------------------------------------------------------------ clocks
def test_best_offset_takes_the_lowest_rtt_sample_and_its_sign():
    # remote clock 5 s ahead; the middle sample has the lowest RTT (2 ms) and is exact
    samples = [(100.0, 105.030, 100.040), (200.0, 205.001, 200.002), (300.0, 305.0, 300.050)]
    offset, rtt = rc.best_offset(samples)
    assert rtt == pytest.approx(0.002, abs=1e-9) and offset == pytest.approx(5.0)
    offset, rtt = rc.best_offset([(10.0, 15.5, 10.002)])
    assert offset == pytest.approx(5.499) and rtt == pytest.approx(0.002, abs=1e-9)


def test_records_carry_the_offset_with_the_sign_analysis_subtracts(tmp_path, monkeypatch):
    """A generator whose clock is 5 s ahead: the driver measures +5 s, the generator starts at the driver's start
    time, its records keep its own clock in *_ts and carry clock_offset_s = +5, so ts - clock_offset_s is the
    driver's time of each send."""
    skew = SkewedClock(5.0)
    monkeypatch.setattr(actor_mod, "time", skew)
    monkeypatch.setattr(drive_mod, "time", skew)

    async def go():
        server = TestServer(make_app())
        await server.start_server()
        gen = LoadGenerator(0, str(tmp_path))
        try:
            samples = []
            for _ in range(5):
                t0 = real_time.time()
                t_remote = await gen.clock()
                samples.append((t0, t_remote, real_time.time()))
            offset, _ = rc.best_offset(samples)
            await gen.set_clock_offset(offset)
            url = str(server.make_url("")).rstrip("/")
            plan = GeneratorPlan(
                point=INFO, generator=0, url=url, model="m", sessions=sessions(4), arrivals=(0.0, 0.05, 0.10, 0.15)
            )
            await gen.prepare(plan)
            start_wall = real_time.time() + 0.3  # driver clock
            result = await gen.run_point(start_wall)
            return offset, start_wall, result
        finally:
            await gen.close()
            await server.close()

    offset, start_wall, result = asyncio.run(go())
    assert offset == pytest.approx(5.0, abs=0.005)
    assert result.records.ok == 4
    t = read_requests(tmp_path).to_pandas().sort_values("intended_send_ts")
    assert (t.clock_offset_s == offset).all()
    driver_intended = (t.intended_send_ts - t.clock_offset_s).tolist()
    assert driver_intended == pytest.approx([start_wall + o for o in (0.0, 0.05, 0.10, 0.15)], abs=0.02)
    assert (t.send_ts - start_wall).min() == pytest.approx(5.0, abs=0.05)  # *_ts stay on the generator's clock


# ------------------------------------------------------------------------------------------------ outputs
@pytest.mark.parametrize(
    "kw, seen, want",
    [
        ({}, True, ("/res/run1", None, "direct")),
        ({}, False, ("/tmp/rig-spool/run1", None, "spool")),
        ({"shared_results": False}, True, ("/tmp/rig-spool/run1", None, "spool")),
        ({"shared_results": True}, True, ("/res/run1", None, "direct")),
        ({"results_uri": "/nfs/rig"}, False, ("/nfs/rig/run1", None, "shared")),
        ({"results_uri": "file:///nfs/rig"}, False, ("/nfs/rig/run1", None, "shared")),
        (
            {"results_uri": "s3://bucket/rig", "spool_dir": "/data/spool-{node_ip}"},
            True,
            ("/data/spool-{node_ip}/run1", "s3://bucket/rig/run1", "ship"),
        ),
    ],
)
def test_where_each_generator_writes(kw, seen, want):
    assert rc.output_for(ClusterSpec(**kw), "run1", "/res/run1", seen, {"generator": 0}) == want


def test_shared_results_true_but_not_visible_is_one_line():
    with pytest.raises(rc.ClusterError) as e:
        rc.output_for(
            ClusterSpec(shared_results=True),
            "run1",
            "/res/run1",
            False,
            {"generator": 1, "host": "c2", "node_ip": "10.0.0.3"},
        )
    assert str(e.value) == "shared_results is true, but generator 1 on c2 (10.0.0.3) does not see /res/run1"


@pytest.mark.parametrize(
    "cluster, message",
    [
        ({"results_uri": "nfs/rig"}, "cluster.results_uri: a shared path must be absolute"),
        ({"spool_dir": "/tmp/{user}"}, "cluster.spool_dir: only the placeholders {host}, {node_ip} and {node_id}"),
    ],
)
def test_bad_output_settings_are_one_line(cluster, message):
    with pytest.raises(SpecError) as e:
        build_spec({"cluster": cluster}, {})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_spool_template_is_filled_on_the_generator_host(tmp_path):
    gen = LoadGenerator(3, str(tmp_path / "res"), str(tmp_path / "spool-{host}-{node_ip}" / "run1"))
    assert str(gen.spool_root) == str(tmp_path / f"spool-{gen.host}-{gen.node_ip}" / "run1")
    assert "{" not in str(gen.spool_root) and gen.node_ip


# ------------------------------------------------------------------------------------------------ ship and gather
def _part(path: Path, rows: int) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"x": list(range(rows))}), path)
    return path.read_bytes()


def test_put_is_tmp_then_rename_on_filesystems(tmp_path):
    fs, base, local = spool.open_uri(str(tmp_path / "dest"))
    assert local
    spool.put(fs, f"{base}/a/part-00000.parquet", b"abc", local)
    assert (tmp_path / "dest" / "a" / "part-00000.parquet").read_bytes() == b"abc"
    assert not list((tmp_path / "dest").rglob("*.tmp"))


def test_shipper_copies_each_closed_part_once_to_an_object_store(tmp_path):
    rel = "requests/point=p0/gen=0"
    a = _part(tmp_path / "spool" / rel / "part-00000.parquet", 3)
    (tmp_path / "spool" / rel / "part-00001.parquet.tmp").write_bytes(b"half-written")
    s = spool.Shipper(tmp_path / "spool", "mock:///bucket/run1")
    assert not s.local and s.check() is None
    assert s.ship(rel) == 1 and s.ship(rel) == 0
    b = _part(tmp_path / "spool" / rel / "part-00001.parquet", 5)
    assert s.ship(rel) == 1
    assert spool.list_parts(s.fs, f"{s.base}/{rel}") == ["part-00000.parquet", "part-00001.parquet"]
    assert spool.read(s.fs, f"{s.base}/{rel}/part-00000.parquet") == a
    assert spool.read(s.fs, f"{s.base}/{rel}/part-00001.parquet") == b
    assert s.summary() == {"shipped_parts": 2, "ship_errors": []}


def test_generator_ships_its_parts_while_and_after_it_runs(tmp_path):
    async def go():
        server = TestServer(make_app())
        await server.start_server()
        gen = LoadGenerator(0, str(tmp_path / "res"))
        try:
            assert await gen.set_output(str(tmp_path / "spool"), "mock:///bucket/run1") is None
            url = str(server.make_url("")).rstrip("/")
            plan = GeneratorPlan(
                point=INFO,
                generator=0,
                url=url,
                model="m",
                sessions=sessions(6),
                arrivals=tuple(0.02 * i for i in range(6)),
            )
            await gen.prepare(plan)
            result = await gen.run_point(real_time.time())
            return gen, result
        finally:
            await gen.close()
            await server.close()

    gen, result = asyncio.run(go())
    rel = "requests/point=p0/gen=0"
    spooled = sorted(p.name for p in (tmp_path / "spool" / rel).glob("part-*.parquet"))
    assert spooled and result.shipped_parts == len(spooled) and result.ship_errors == []
    assert spool.list_parts(gen.shipper.fs, f"{gen.shipper.base}/{rel}") == spooled
    assert not (tmp_path / "res").exists()  # nothing went to the driver's path


def test_gather_copies_from_a_shared_uri_without_ray(tmp_path):
    rel = "requests/point=p0/gen=1"
    a = _part(tmp_path / "nfs" / "run1" / rel / "part-00000.parquet", 2)
    info = {"generator": 1, "output_mode": "shared", "node_id": None, "spool_root": None}
    got = rc.gather_parts(tmp_path / "res", rel, info, f"file://{tmp_path / 'nfs'}", "run1")
    assert got["from_uri"] == 1 and (tmp_path / "res" / rel / "part-00000.parquet").read_bytes() == a
    assert rc.gather_parts(tmp_path / "res", rel, info, str(tmp_path / "nfs"), "run1")["from_uri"] == 0
