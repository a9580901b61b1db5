"""Multi-host integration: each Ray node in its own network namespace with its own IP (10.213.0.0/24 exists only
inside those namespaces), `rig run` driven from the head namespace against the simulated server.

Proves: the server runs on the server node and binds an address the client hosts reach (a server bound to loopback
fails here: the generators live in other namespaces); one generator per client node; part files written to a
spool on each client host (a directory the driver does not read) and gathered through Ray; every scheduled
request is a record, ids unique, rows from both client hosts; clock offsets recorded per host and on every row.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import REPO, TESTS

sys.path.insert(0, str(TESTS / "netns"))
from netcluster import NetnsCluster, unavailable  # noqa: E402

from rig.loadgen.arrivals import arrival_offsets  # noqa: E402
from rig.results import read_manifest, read_requests  # noqa: E402

ROOT = REPO
WHY = unavailable()
pytestmark = [pytest.mark.netns, pytest.mark.skipif(WHY is not None, reason=f"namespace cluster: {WHY}")]

SERVER_IP, CLIENT_IPS = "10.213.0.2", {"10.213.0.3", "10.213.0.4"}


@pytest.fixture(scope="module")
def netns():
    c = NetnsCluster(python=sys.executable, n_clients=2)
    c.up()
    try:
        c.wait_nodes()
        yield c
    finally:
        c.down()


def rig_run(
    c: NetnsCluster, tmp: Path, run_id: str, *args: str, server: dict | None = None
) -> tuple[dict, subprocess.CompletedProcess]:
    cfile = tmp / f"{run_id}-cluster.yaml"
    cfile.write_text(
        yaml.safe_dump(
            {
                **({"server": server} if server else {}),
                "cluster": {
                    "address": c.address,
                    "server_label": {"role": "server"},
                    "client_label": {"role": "client"},
                    "client_resource": "client",
                    "allow_generators_on_server_node": False,
                    "shared_results": False,  # every namespace shares this disk: force the spool + gather path
                    "spool_dir": str(c.base / "spool-{node_ip}"),
                },
            }
        )
    )
    argv = [
        str(Path(sys.executable).with_name("rig")),
        "run",
        "--cluster",
        str(cfile),
        "--engine",
        "sim",
        "--steps",
        "2",
        "--workload",
        "greedy",
        "--workload-opt",
        "max_tokens=16",
        "--warmup",
        "1",
        "--clients",
        "2",
        "--out",
        str(tmp / "out"),
        "--run-id",
        run_id,
        "-q",
        *args,
    ]
    proc = subprocess.run(
        c.exec_argv("head", argv), capture_output=True, text=True, timeout=150, env=c.full_env(), cwd=ROOT
    )
    run_dir = tmp / "out" / run_id
    assert (run_dir / "manifest.json").exists(), proc.stdout[-2000:] + proc.stderr[-4000:] + c.logs()
    return read_manifest(run_dir), proc


def _common_checks(c: NetnsCluster, m: dict, run_dir: Path, proc: subprocess.CompletedProcess):
    assert m["status"] == "complete", proc.stderr[-4000:]
    # the server ran on the server node and handed out its namespace IP, not loopback
    (server,) = m["server_configs"].values()
    assert server["node_ip"] == SERVER_IP and server["url"].startswith(f"http://{SERVER_IP}:")
    # one generator on each client node, with its own hostname, clock offset and RTT
    gens = sorted(m["cluster"]["generators"], key=lambda g: g["generator"])
    assert {g["node_ip"] for g in gens} == CLIENT_IPS and len(gens) == 2
    assert {g["host"] for g in gens} == {"rig-client1", "rig-client2"}
    assert set(m["cluster"]["hosts"]) == CLIENT_IPS
    for g in gens:
        assert g["output_mode"] == "spool" and g["spool_root"] == str(c.base / f"spool-{g['node_ip']}" / m["run_id"])
        assert abs(g["clock_offset_s"]) < 0.01 and 0 < g["clock_rtt_s"] < 0.5  # one machine: one clock
        assert m["cluster"]["hosts"][g["node_ip"]]["clock_offset_s"] == g["clock_offset_s"]
    t = read_requests(run_dir).to_pandas()
    # rows from both client hosts, each row stamped with its generator's host and clock offset
    by_gen = {g["generator"]: g for g in gens}
    assert set(t.generator.unique()) == {0, 1}
    for gid, rows in t.groupby("generator"):
        assert (rows.host == by_gen[gid]["host"]).all()
        assert (rows.clock_offset_s == by_gen[gid]["clock_offset_s"]).all()
    assert t.request_id.is_unique and t.ok.all()
    # spooled parts were gathered into the results dir and removed from the hosts
    for p in m["points"]:
        assert (
            sum(g["gathered"]["from_host"] for g in p["generators"])
            == len(list((run_dir / "requests" / f"point={p['point']}").rglob("part-*.parquet")))
            > 0
        )
    assert not list(c.base.glob("spool-*/**/part-*.parquet"))
    # the server node spooled its log and /metrics samples too; the driver brought them home
    log = next((run_dir / "logs").glob("server=*/server.log")).read_text()
    assert "max_total_num_tokens=" in log
    assert list((run_dir / "server_metrics").rglob("part-*.parquet"))
    assert not list(c.base.glob("spool-*/**/server.log"))
    return t, gens


def test_closed_loop_across_namespaces(netns, tmp_path):
    m, proc = rig_run(netns, tmp_path, "closed", "--concurrency", "4", "--requests", "12")
    t, gens = _common_checks(netns, m, tmp_path / "out" / "closed", proc)
    (p,) = m["points"]
    # accounting: scheduled = records = rows; concurrency 4 over 2 generators is 2 + 2, so 6 requests each
    assert p["requests_scheduled"] == p["records"]["ok"] == len(t) == 12
    assert t.groupby("generator").size().to_dict() == {0: 6, 1: 6}
    assert sorted(g["scheduled"] for g in p["generators"]) == [6, 6]
    # the two generators started together (common start time, driver clock): first sends within 100 ms
    first = t.groupby("generator").apply(lambda r: (r.send_ts - r.clock_offset_s).min())
    assert abs(first[0] - first[1]) < 0.1


def test_open_loop_schedule_split_across_namespaces(netns, tmp_path):
    m, proc = rig_run(netns, tmp_path, "open", "--rate", "20", "--requests", "30")
    t, gens = _common_checks(netns, m, tmp_path / "out" / "open", proc)
    (p,) = m["points"]
    assert p["requests_scheduled"] == p["records"]["ok"] == len(t) == 30
    assert t.groupby("generator").size().to_dict() == {0: 15, 1: 15}  # every other arrival of one schedule
    # one global schedule, split round-robin: on the driver's clock (ts - clock_offset_s) the union of both
    # generators' intended send times is the runner's schedule, generator g holding arrivals g, g+2, ...
    offs = list(arrival_offsets("poisson", rate=20.0, n=30, seed=0))
    t["driver_intended"] = t.intended_send_ts - t.clock_offset_s
    t0 = t.driver_intended.min()
    for g in (0, 1):
        got = sorted(t[t.generator == g].driver_intended - t0)
        want = [o - offs[0] for o in offs[g::2]]
        assert max(abs(a - b) for a, b in zip(got, want, strict=False)) < 0.005, (got, want)
    assert 0 < (t.slip_s.quantile(0.99)) < 0.05  # generators kept to the schedule


def test_a_server_bound_to_loopback_is_not_reachable_from_client_hosts(netns, tmp_path):
    """The negative control: the namespaces really are separate hosts, so a loopback-bound server fails the run."""
    m, proc = rig_run(
        netns, tmp_path, "loopback", "--concurrency", "2", "--requests", "4", server={"host": "127.0.0.1"}
    )
    (server,) = m["server_configs"].values()
    assert server["url"].startswith("http://127.0.0.1:") and server["status"] == "ready"  # healthy on its own host
    (p,) = m["points"]
    assert m["status"] != "complete" and p["status"] != "complete" and p["records"]["ok"] == 0
    t = read_requests(tmp_path / "out" / "loopback").to_pandas()
    assert len(t) == 4 and not t.ok.any() and set(t.generator) == {0, 1}
    # refused on the client host's own loopback (aiohttp says "Connect call failed", the lean client the errno)
    assert t.error.str.contains("Connect call failed|Connection refused").all()
