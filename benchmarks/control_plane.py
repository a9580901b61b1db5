"""The control plane at 32 generators: a Ray cluster of fake nodes on this machine, a light load (prints only).

    .venv/bin/python benchmarks/control_plane.py [--nodes 8 --per-host 4] [--requests 640]

Starts a head (no CPUs), one server node and --nodes client nodes (ray.cluster_utils.Cluster; each a real raylet
with its own object store), then one `rig run`-equivalent (the real Runner, engine external) against the truth
server with --nodes x --per-host generators, part files spooled on each "host" and gathered through Ray. Prints:
- time to ready: Runner._setup_cluster (connect, place every generator actor, wait for all to start, check each
  can write its spool, one clock-offset probe per generator);
- time to the common start: from the driver's start call to the last generator's first send (driver clock, from
  the records), and the spread of first sends over generators;
- the progress polling cost on the driver (Fleet.poll_progress: one beat asks every generator; wall and driver CPU
  per beat, and the driver's CPU over the whole level);
- time to gather every part file (PointExecutor.gather: list and fetch each host's spooled parts through Ray), and
  the bytes gathered; the manifest's size.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # loopback-only fake cluster

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from truth_server import TruthServer  # noqa: E402

from rig.config import build_spec  # noqa: E402
from rig.results import PART_GLOB, load_manifest, read_requests  # noqa: E402
from rig.run.execute import PointExecutor  # noqa: E402
from rig.run.runner import Runner  # noqa: E402

MB100 = 100 * 2**20


def timed(cls, name: str, sink: dict, cpu: dict | None = None) -> None:
    """Wrap a method so each call's wall time is kept under its name (and, given cpu, the driver process's CPU
    seconds during the call)."""
    orig = getattr(cls, name)

    def wrapper(self, *a, **kw):
        t0, c0 = time.time(), time.process_time()
        try:
            return orig(self, *a, **kw)
        finally:
            sink.setdefault(name, []).append((t0, time.time()))
            if cpu is not None:
                cpu.setdefault(name, []).append(time.process_time() - c0)

    setattr(cls, name, wrapper)


def timed_fn(module, name: str, sink: dict) -> None:
    """The same for a function as the module that calls it imported it."""
    orig = getattr(module, name)

    def wrapper(*a, **kw):
        t0 = time.time()
        try:
            return orig(*a, **kw)
        finally:
            sink.setdefault(name, []).append((t0, time.time()))

    setattr(module, name, wrapper)


def marks_broadcast(marks: dict) -> float:
    """Fleet.broadcast_s as setup measured it (one call to every generator at once), from the Fleet kept."""
    fleets = marks.get("fleet") or []
    return fleets[-1].broadcast_s if fleets else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=8, help="fake client hosts")
    ap.add_argument("--per-host", type=int, default=4, help="generators per client host")
    ap.add_argument("--requests", type=int, default=640)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    n_gen = args.nodes * args.per_host
    tmp = Path(tempfile.mkdtemp(prefix="rig-ctl-"))
    truth = TruthServer(tmp / "truth", itl_ms=0, workers=1)
    t0 = time.time()
    c = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, "object_store_memory": MB100}
    )
    marks: dict[str, list] = {}
    cpu: dict[str, list] = {}  # driver CPU seconds per call
    try:
        c.add_node(num_cpus=1, labels={"role": "server"}, object_store_memory=MB100)
        for _ in range(args.nodes):
            c.add_node(
                num_cpus=args.per_host, labels={"role": "client"}, resources={"client": 1}, object_store_memory=MB100
            )
        c.wait_for_nodes()
        t_cluster = time.time() - t0
        print(
            f"fake cluster: head + 1 server node + {args.nodes} client nodes up in {t_cluster:.1f} s "
            f"(not part of the figures below)",
            flush=True,
        )
        import rig.run.fleet as fleet
        import rig.run.lifecycle as lifecycle

        # the placement steps, timed where the run calls them (rig.run imports them from rig.placement by name)
        for name in ("connect", "plan_placement", "wait_started", "set_outputs", "measure_clock_offset"):
            timed_fn(fleet, name, marks)
        timed_fn(lifecycle, "measure_clock_offset", marks)
        timed(Runner, "_setup_cluster", marks)
        orig_setup = fleet.Fleet.setup

        def keep_fleet(self, *a, **kw):
            marks.setdefault("fleet", []).append(self)
            return orig_setup(self, *a, **kw)

        fleet.Fleet.setup = keep_fleet
        timed(PointExecutor, "gather", marks)
        timed(PointExecutor, "run_point", marks, cpu)
        timed(fleet.Fleet, "poll_progress", marks, cpu)
        spec = build_spec(
            {},
            {
                "run_id": "ctl",
                "out": str(tmp / "out"),
                "clients": n_gen,
                "server": {"engine": "external", "url": truth.url},
                "workloads": [{"name": "greedy", "max_tokens": 16}],
                "load": {
                    "mode": "closed",
                    "concurrency": [args.concurrency],
                    "requests": args.requests,
                    "warmup_requests": 0,
                },
                "cluster": {
                    "address": c.address,
                    "server_label": {"role": "server"},
                    "client_label": {"role": "client"},
                    "client_resource": "client",
                    "per_host": args.per_host,
                    "allow_generators_on_server_node": False,
                    "shared_results": False,
                    "spool_dir": str(tmp / "spool-{node_id}"),
                    "placement_timeout_s": 300,
                },
            },
        )
        t_run = time.time()
        Runner(spec).run()
        t_total = time.time() - t_run
        run_dir = tmp / "out" / "ctl"
        m = load_manifest(run_dir)
        (point,) = m.points
        t = read_requests(run_dir, columns=["generator", "send_ts", "clock_offset_s", "ok"]).to_pandas()
        first = (t.send_ts - t.clock_offset_s).groupby(t.generator).min()
        start_wall = point.start_wall
        setup = marks["_setup_cluster"][0]
        gather = marks["gather"][0]
        part_files = list(run_dir.rglob(PART_GLOB))
        parts, part_bytes = len(part_files), sum(f.stat().st_size for f in part_files)
        manifest_bytes = (run_dir / "manifest.json").stat().st_size
        print(
            f"\n{n_gen} generators ({args.nodes} hosts x {args.per_host}), {args.requests} requests, closed loop "
            f"{args.concurrency}, 16 tokens each; run status {m.status}, {int(t.ok.sum())} ok of {len(t)}"
        )
        print(
            f"  time to ready (place + start {n_gen} actors, spool checks, clock probes): {setup[1] - setup[0]:.2f} s"
        )
        parts_of_ready = {
            k: sum(b - a for a, b in marks.get(k, []))
            for k in ("connect", "plan_placement", "wait_started", "set_outputs", "measure_clock_offset")
        }
        print(
            "    of which: "
            + ", ".join(
                f"{k} {v:.2f} s" + (f" ({len(marks[k])} calls)" if k == "measure_clock_offset" else "")
                for k, v in parts_of_ready.items()
            )
            + "; the rest: creating the actor handles, corpus check"
        )
        notices = [g.start_notice_s for g in point.generators if g.start_notice_s is not None]
        if start_wall is not None:
            print(
                f"  common start: the last generator's first send {first.max() - start_wall:+.3f} s after the "
                f"agreed start; first sends spread {first.max() - first.min():.3f} s over generators"
            )
        if notices:
            late = sum(1 for x in notices if x < 0)
            print(
                f"  start calls came {min(notices):+.3f} to {max(notices):+.3f} s before the agreed start "
                f"({late} of {len(notices)} after it); the broadcast at setup took {marks_broadcast(marks):.3f} s"
            )
        else:
            print(f"  first sends spread {first.max() - first.min():.3f} s over generators")
        beats = marks.get("poll_progress", [])
        if beats:
            walls = sorted(b - a for a, b in beats)
            beat_cpu = cpu["poll_progress"]
            level = marks["run_point"][0]
            level_cpu = cpu["run_point"][0]
            print(
                f"  progress polling on the driver: {len(beats)} beats, each asks {n_gen} generators: wall median "
                f"{walls[len(walls) // 2] * 1e3:.1f} ms, max {walls[-1] * 1e3:.1f} ms; driver CPU "
                f"{sum(beat_cpu) / len(beat_cpu) * 1e3:.1f} ms a beat ({sum(beat_cpu):.2f} s in all); the driver's "
                f"CPU over the point {level_cpu:.2f} s of {level[1] - level[0]:.2f} s "
                f"({level_cpu / (level[1] - level[0]) * 100:.0f} % of a core)"
            )
        print(
            f"  time to gather every part file ({parts} parts from {args.nodes} host spools through Ray): "
            f"{gather[1] - gather[0]:.2f} s, {part_bytes / 1e6:.2f} MB ({part_bytes / max(len(t), 1):.0f} B a "
            f"record); manifest {manifest_bytes / 1e3:.1f} kB ({manifest_bytes / n_gen / 1e3:.2f} kB a generator)"
        )
        print(
            f"  whole run (ready + level + gather + manifest): {t_total:.2f} s; "
            f"generators in the manifest: {len(m.cluster.generators)}"
        )
    finally:
        ray.shutdown()
        c.shutdown()
        truth.stop()


if __name__ == "__main__":
    main()
