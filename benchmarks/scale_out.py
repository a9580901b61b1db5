"""Scale-out, measured: rig itself with 1, 2, 4, 8 generators, one per fake host, each on a core of its own.

    python benchmarks/scale_out.py [--n 1,2,4,8] [--modes closed,open] [--itl-ms 2 --max-tokens 64] \
        [--per-gen-concurrency 64 --per-gen-rate 400 --level-s 4] [--server-cpus 0-5 --driver-cpus 6-7 \
        --gen-cpus 8-15] [--capacity-s 2] [--json OUT.json]

One Ray cluster of fake nodes on this machine (ray.cluster_utils.Cluster: a head with no CPUs, a server node, one
client node per generator, each a real raylet), the truth server (benchmarks/truth_server.py: one process per
server core, SO_REUSEPORT, pacing every stream at --itl-ms and stamping each token's write time) on cores of its
own, and per N one `rig run` (the real Runner: placement, common start, part files spooled on each "host",
gathered through Ray) with N generators, generator i pinned to the i-th core of --gen-cpus (every thread of its
process, os.sched_setaffinity). The driver, the raylets and Ray's own processes stay on --driver-cpus.

Printed first: the truth server's capacity (unpaced, one write per token) on the same cores, so the load offered
below is seen to be a fraction of it. Then per N and mode (closed loop at N x --per-gen-concurrency; open loop,
Poisson, at N x --per-gen-rate): aggregate streamed tok/s and req/s (ok requests, driver-clock window from the
first send to the last end), efficiency against N x the single generator, the client's inter-token gap error
against the server's write times (p99, per token, records matched to the server's by their text hash), open-loop
schedule slip p99, each generator's CPU and loop lag p99, the point's validity flags, and the CPU of the driver,
the raylets and the GCS over the run. Where efficiency at the largest N is under 90 %, it names where the time
went: the slowest generator's CPU and loop lag, the driver's and Ray's CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # loopback-only fake cluster

import psutil  # noqa: E402
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from truth_capacity import print_capacity  # noqa: E402
from truth_server import TruthServer, cpu_list  # noqa: E402

from rig.config import build_spec  # noqa: E402
from rig.results import load_manifest, read_requests  # noqa: E402
from rig.run.runner import Runner  # noqa: E402

MB100 = 100 * 2**20
COLUMNS = ["generator", "ok", "send_ts", "end_ts", "clock_offset_s", "completion_tokens", "chunk_offsets_s",
           "chunk_tokens", "output_hash", "slip_s"]  # fmt: skip


def layout(args: argparse.Namespace, max_n: int) -> tuple[list[int], list[int], list[int]]:
    """(server cores, driver cores, generator cores): as given, else carved from this process's affinity."""
    cores = sorted(os.sched_getaffinity(0))
    if args.server_cpus and args.driver_cpus and args.gen_cpus:
        return cpu_list(args.server_cpus), cpu_list(args.driver_cpus), cpu_list(args.gen_cpus)
    if len(cores) >= max_n + 4:  # a core per generator, then 3/4 of the rest for the server, 1/4 for the driver
        gens, rest = cores[-max_n:], cores[:-max_n]
        k = max(1, len(rest) * 3 // 4)
        return rest[:k], rest[k:], gens
    # a small machine (this 2-core one): everything shares; the figures are for the code path, not the scaling
    return cores[:1], cores, cores[1:] or cores


def pin_process(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid`` onto ``cores`` (sched_setaffinity is per thread; threads made later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.sched_setaffinity(int(tid), cores)


GEN_PIDS: set[int] = set()  # every generator process pinned so far (their CPU is counted under "generators")


def pin_generators(gen_cores: list[int], pinned: dict[int, int]) -> None:
    """Hook the run's wait for its started generators: pin generator i's process to gen_cores[i]."""
    import rig.run.fleet as fleet

    orig = fleet.wait_started

    def wait_and_pin(*a: Any, **kw: Any) -> list[Any]:
        started = orig(*a, **kw)
        for info in started:
            d = info if isinstance(info, dict) else info.model_dump()
            core = gen_cores[d["generator"] % len(gen_cores)]
            pin_process(d["pid"], {core})
            pinned[d["generator"]] = core
            GEN_PIDS.add(d["pid"])
        return started

    fleet.wait_started = wait_and_pin


class CpuByRole:
    """CPU seconds of this process and its descendants (the raylets, GCS, Ray workers), by role, over a span."""

    ROLES = ("raylet", "gcs_server", "LoadGenerator", "ServerActor")

    def __init__(self) -> None:
        self.before = self._sample()

    @classmethod
    def _role(cls, p: psutil.Process) -> str:
        if p.pid in GEN_PIDS:  # by the end of its run a generator is gone (a zombie has no command line)
            return "generators"
        try:
            text = p.name() + " " + " ".join(p.cmdline()[:3])
        except psutil.Error:
            return "other"
        return next((r for r in cls.ROLES if r in text), "other ray")

    def _sample(self) -> dict[int, tuple[str, float]]:
        me = psutil.Process()
        out = {me.pid: ("driver", sum(me.cpu_times()[:2]))}
        for p in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                out[p.pid] = (self._role(p), sum(p.cpu_times()[:2]))
        return out

    def since(self) -> dict[str, float]:
        after = self._sample()
        by: dict[str, float] = {}
        for pid, (role, cpu) in after.items():
            by[role] = by.get(role, 0.0) + cpu - self.before.get(pid, (role, 0.0))[1]
        return by


def itl_errors(t: Any, truth: dict) -> tuple[np.ndarray, int, int]:
    """|client gap - server gap| per token, over records matched to the server's by text hash; also the records
    not matched and the tokens that shared a read with the one before (one arrival stamp for both)."""
    errs, unmatched, shared = [], 0, 0
    for h, offs, toks in zip(t["output_hash"], t["chunk_offsets_s"], t["chunk_tokens"], strict=True):
        w = truth["by_hash"].get(h)
        if w is None or offs is None:
            unmatched += 1
            continue
        counts = np.asarray(toks, dtype=np.int64) if toks is not None else np.ones(len(offs), dtype=np.int64)
        arrivals = np.repeat(np.asarray(offs), counts)
        if len(arrivals) != len(w):
            unmatched += 1
            continue
        gaps = np.diff(arrivals)
        shared += int((gaps == 0).sum())  # came in the same read as the token before: one stamp for both
        errs.append(np.abs(gaps - np.diff(w)))
    return (np.concatenate(errs) if errs else np.zeros(0)), unmatched, shared


def spec_for(args: argparse.Namespace, c: Cluster, url: str, out: Path, run_id: str, n: int, mode: str) -> Any:
    load: dict[str, Any] = {"duration_s": args.level_s, "grace_s": 5.0, "warmup_requests": 1}
    if mode == "closed":
        load |= {"mode": "closed", "concurrency": [n * args.per_gen_concurrency]}
    else:
        load |= {"mode": "poisson", "rates": [n * args.per_gen_rate]}
    return build_spec(
        {},
        {
            "run_id": run_id,
            "out": str(out),
            "clients": n,
            "server": {"engine": "external", "url": url},
            "workloads": [{"name": "greedy", "max_tokens": args.max_tokens}],
            "load": load,
            "metrics_interval_s": 5.0,
            "cluster": {
                "address": c.address,
                "server_label": {"role": "server"},
                "client_label": {"role": "client"},
                "client_resource": "client",
                "per_host": 1,
                "allow_generators_on_server_node": False,
                "shared_results": False,
                "spool_dir": str(out / "spool-{node_id}"),
                "placement_timeout_s": 120,
            },
        },
    )


def measure_point(run_dir: Path, truth: dict, cpu: dict[str, float], wall_s: float, workers: int) -> dict[str, Any]:
    """One run's figures (see the module docstring)."""
    m = load_manifest(run_dir)
    (point,) = m.points
    t = read_requests(run_dir, columns=COLUMNS).to_pandas()
    ok = t[t.ok.fillna(False)]
    send = ok.send_ts - ok.clock_offset_s
    end = ok.end_ts - ok.clock_offset_s
    window = float(end.max() - send.min()) if len(ok) else float("nan")
    errs, unmatched, shared = itl_errors(ok, truth)
    slips = t.slip_s.dropna().to_numpy()
    gens = sorted(point.generators, key=lambda g: g.generator)
    return {
        "status": m.status,
        "requests": len(t),
        "ok": len(ok),
        "window_s": window,
        "tok_s": float(ok.completion_tokens.sum()) / window,
        "req_s": len(ok) / window,
        "itl_err_p99_ms": float(np.percentile(errs, 99) * 1e3) if len(errs) else None,
        "itl_err_p50_ms": float(np.percentile(errs, 50) * 1e3) if len(errs) else None,
        "itl_tokens": len(errs),
        "unmatched": unmatched,
        "shared_reads": shared,
        "slip_p99_ms": float(np.percentile(slips, 99) * 1e3) if len(slips) else None,
        "gen_cpu_pct": [g.cpu_pct for g in gens],
        "gen_lag_p99_ms": [g.loop_lag_p99_ms for g in gens],
        "gen_tokens": [g.tokens for g in gens],
        "rate_ratio": [g.rate_ratio for g in gens],
        "flags": list(point.flags),
        "flag_reasons": dict(point.flag_reasons),
        "cpu_s": cpu,
        "run_wall_s": wall_s,
        # the server's own CPU over the level window (its warm-up requests are a few): near 100 % = server-bound
        "server_cpu_pct": 100 * truth["cpu_s"] / (window * workers),
        "server_tokens": truth["tokens"],
    }


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None or x != x else format(x, spec)


def print_row(n: int, mode: str, r: dict[str, Any], single: dict[str, Any] | None) -> None:
    eff = r["tok_s"] / (n * single["tok_s"] / single["n"]) if single else None
    r["efficiency"] = eff
    cpus = ", ".join(fmt(c, ".0f") for c in r["gen_cpu_pct"])
    lags = ", ".join(fmt(c, ".1f") for c in r["gen_lag_p99_ms"])
    ray_cpu = {k: v / r["run_wall_s"] * 100 for k, v in r["cpu_s"].items()}
    kept = [x for x in r["rate_ratio"] if x is not None]
    print(
        f"N={n} {mode:6s}: {r['tok_s']:10,.0f} tok/s {r['req_s']:8,.1f} req/s  efficiency "
        f"{fmt(eff * 100 if eff else None, '.1f')} %  ITL error p99 {fmt(r['itl_err_p99_ms'], '.3f')} ms "
        f"(p50 {fmt(r['itl_err_p50_ms'], '.3f')}; {r['itl_tokens']:,} gaps, {r['unmatched']} unmatched, "
        f"{r['shared_reads']} tokens sharing a read)  slip p99 {fmt(r['slip_p99_ms'], '.3f')} ms  "
        f"flags {r['flags'] or 'none'}",
        flush=True,
    )
    print(
        f"        {r['ok']}/{r['requests']} ok over {r['window_s']:.2f} s; generator CPU % [{cpus}], loop lag p99 ms "
        f"[{lags}]"
        + (f"; open-loop rate kept {min(kept):.3f}-{max(kept):.3f}" if kept else "")
        + "; CPU % of a core over the whole run (setup, level, gather): "
        + ", ".join(f"{k} {v:.0f}" for k, v in sorted(ray_cpu.items()))
        + f"; whole run {r['run_wall_s']:.1f} s; truth server CPU {r['server_cpu_pct']:.0f} % of its cores over "
        "the level" + (" (SERVER-BOUND: these figures are the server's)" if r["server_cpu_pct"] > 80 else ""),
        flush=True,
    )


def where_the_time_goes(n: int, mode: str, r: dict[str, Any]) -> None:
    """Efficiency under 90 % at the largest N: the slowest generator, the driver, Ray."""
    toks = [t or 0 for t in r["gen_tokens"]]
    slow = int(np.argmin(toks)) if toks else 0
    ray_cpu = {k: v / r["run_wall_s"] * 100 for k, v in r["cpu_s"].items()}
    print(
        f"  where the time goes (N={n} {mode}, efficiency {r['efficiency'] * 100:.1f} %): slowest generator {slow} "
        f"({toks[slow]:,} tokens vs median {int(np.median(toks)):,}) at {fmt(r['gen_cpu_pct'][slow], '.0f')} % of "
        f"its core, loop lag p99 {fmt(r['gen_lag_p99_ms'][slow], '.1f')} ms; over the whole run: driver "
        f"{ray_cpu.get('driver', 0):.0f} %, raylets {ray_cpu.get('raylet', 0):.0f} %, GCS "
        f"{ray_cpu.get('gcs_server', 0):.0f} % of a core; "
        f"flags: {r['flag_reasons'] or 'none'}",
        flush=True,
    )
    if r["gen_cpu_pct"][slow] and r["gen_cpu_pct"][slow] > 90:
        print("    -> the slowest generator used its whole core: the client is the limit at this load per core")
    elif ray_cpu.get("driver", 0) > 80:
        print("    -> the driver is busy (progress polls and start calls grow with N)")
    else:
        print("    -> no process is CPU-bound: look at the server (capacity above) and at the level's edges")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="1,2,4,8", help="generator counts")
    ap.add_argument("--modes", default="closed,open")
    ap.add_argument("--itl-ms", type=float, default=2.0, help="the server's pace per stream")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--per-gen-concurrency", type=int, default=64)
    ap.add_argument("--per-gen-rate", type=float, default=400.0, help="open loop: requests/s per generator")
    ap.add_argument("--level-s", type=float, default=4.0)
    ap.add_argument("--server-cpus")
    ap.add_argument("--driver-cpus")
    ap.add_argument("--gen-cpus")
    ap.add_argument("--capacity-s", type=float, default=2.0, help="0: skip the server's capacity")
    ap.add_argument("--json", type=Path, help="write every figure here too")
    args = ap.parse_args()
    ns = [int(x) for x in args.n.split(",")]
    modes = args.modes.split(",")
    server_cores, driver_cores, gen_cores = layout(args, max(ns))
    span = ",".join(map(str, server_cores))
    print(
        f"cores: server {span}, driver and Ray {driver_cores}, generators {gen_cores}"
        + (
            " (fewer cores than generators: they share, so these figures test the path, not the scaling)"
            if len(gen_cores) < max(ns)
            else ""
        ),
        flush=True,
    )
    results: dict[str, Any] = {"layout": {"server": server_cores, "driver": driver_cores, "gens": gen_cores}}
    if args.capacity_s > 0:
        cap = print_capacity(args.capacity_s, len(server_cores), span, ",".join(map(str, gen_cores)), 32, 256, 1)
        results["capacity"] = cap.__dict__
        if args.json:
            args.json.write_text(json.dumps(results, indent=1, default=str))
        offered = max(ns) * args.per_gen_concurrency * 1e3 / args.itl_ms
        print(f"  offered at N={max(ns)} closed loop: at most {offered:,.0f} tok/s ({offered / cap.tok_s:.0%} of it)")
    tmp = Path(tempfile.mkdtemp(prefix="rig-scale-"))
    truth = TruthServer(tmp / "truth", itl_ms=args.itl_ms, workers=len(server_cores), cpus=span, one_per_core=True)
    # Ray's processes start on every core but the server's (faster: ten raylets on two cores take half a minute),
    # then move to the driver's cores with the driver before any generator starts (its workers inherit them).
    os.sched_setaffinity(0, set(driver_cores) | set(gen_cores))
    t0 = time.time()
    c = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, "object_store_memory": MB100}
    )
    pinned: dict[int, int] = {}
    pin_generators(gen_cores, pinned)
    try:
        c.add_node(num_cpus=1, labels={"role": "server"}, object_store_memory=MB100)
        for _ in range(max(ns)):
            c.add_node(num_cpus=1, labels={"role": "client"}, resources={"client": 1}, object_store_memory=MB100)
        c.wait_for_nodes()
        server_pids = {pr.pid for pr in truth.procs}
        for proc in psutil.Process().children(recursive=True):
            if proc.pid not in server_pids:
                with contextlib.suppress(psutil.Error, OSError):
                    pin_process(proc.pid, set(driver_cores))
        os.sched_setaffinity(0, set(driver_cores))
        print(f"fake cluster: head + server node + {max(ns)} client nodes up in {time.time() - t0:.1f} s", flush=True)
        # One driver connection for every run (the runner joins it and leaves it up): its task workers, which
        # gather the part files on each node, are reused from run to run instead of started each time.
        ray.init(address=c.address, log_to_driver=False, logging_level="ERROR")
        single: dict[str, dict[str, Any]] = {}
        for n in ns:
            for mode in modes:
                run_id = f"n{n}-{mode}"
                truth.collect()  # what came before (warm-ups of earlier runs) is not this run's
                cpu = CpuByRole()
                t_run = time.time()
                Runner(spec_for(args, c, truth.url, tmp / "out", run_id, n, mode)).run()
                wall = time.time() - t_run
                r = measure_point(tmp / "out" / run_id, truth.collect(), cpu.since(), wall, len(server_cores))
                r["pinned"] = dict(pinned)
                base = single.setdefault(mode, {**r, "n": n})  # the smallest N: per generator, the baseline
                print_row(n, mode, r, base)
                results[run_id] = r
                if args.json:  # after every run: a benchmark cut short keeps what it measured
                    args.json.write_text(json.dumps(results, indent=1, default=str))
                if n == max(ns) and n > 1 and (r.get("efficiency") or 1.0) < 0.9:
                    where_the_time_goes(n, mode, r)
    finally:
        ray.shutdown()
        c.shutdown()
        truth.stop()
    if args.json:
        print(f"figures in {args.json}")


if __name__ == "__main__":
    main()
