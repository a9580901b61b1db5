"""Soak: N minutes of steady closed-loop load on the sim through the real rig path (`rig run --duration`), printing the
load generator's and the sim's memory (RSS) over time and, at the end, the accounting invariant.

It measures and prints; it asserts nothing. Default 30 minutes; `--minutes 5` for a shorter soak.

    .venv/bin/python benchmarks/soak.py --minutes 30 --concurrency 16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rig.contracts import ContractError  # noqa: E402
from rig.results import PART_GLOB, load_manifest, read_requests  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0, help="length of the load level (default 30)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--workload", default="realistic")
    p.add_argument("--max-tokens", type=int, default=128, help="output length cap per request")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--interval", type=float, default=30.0, help="seconds between memory samples")
    p.add_argument("--out", default=None, help="results root (default: a temporary directory)")
    p.add_argument("--json", dest="json_out", default=None, help="also write the samples and summary here")
    return p.parse_args()


def mib(b: float) -> float:
    return b / 2**20


def rss(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        return mib(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


def find_sim(port: int) -> int | None:
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "rig.sim" in cmd and str(port) in cmd:
            return proc.pid
    return None


def progress_rows(run: Path) -> int:
    n = 0
    for f in (run / "requests").rglob(PART_GLOB):
        try:
            import pyarrow.parquet as pq

            n += pq.read_metadata(f).num_rows
        except Exception:
            pass
    return n


def main() -> None:
    a = parse()
    out = Path(a.out or tempfile.mkdtemp(prefix="rig-soak-"))
    run_id = f"soak-{time.strftime('%Y%m%d-%H%M%S')}"
    run = out / run_id
    duration = a.minutes * 60
    cmd = [
        sys.executable,
        "-m",
        "rig.cli",
        "run",
        "--workload",
        a.workload,
        "--steps",
        str(a.steps),
        "--concurrency",
        str(a.concurrency),
        "--duration",
        f"{duration:g}",
        "--warmup",
        "2",
        "--workload-opt",
        f"max_tokens={a.max_tokens}",
        "--out",
        str(out),
        "--run-id",
        run_id,
        "-q",
    ]
    print("soak:", " ".join(cmd[2:]), flush=True)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    gen_pid = sim_pid = None
    samples: list[dict] = []
    print(
        f"{'t (min)':>8} {'generator RSS MiB':>18} {'sim RSS MiB':>12} {'driver RSS MiB':>15} {'records':>9}",
        flush=True,
    )
    next_t = time.time()
    while proc.poll() is None:
        time.sleep(max(0.0, min(1.0, next_t - time.time())))
        if time.time() < next_t:
            continue
        next_t += a.interval
        try:
            m = load_manifest(run)
            gen_pid = gen_pid or (m.cluster.generators[0].model_extra or {})["pid"]
            if sim_pid is None:
                for c in m.server_configs.values():
                    if c.url:
                        sim_pid = find_sim(int(c.url.rsplit(":", 1)[1]))
        except (FileNotFoundError, KeyError, IndexError, ContractError):
            pass
        s = {
            "t_s": time.time() - t0,
            "generator_mib": rss(gen_pid),
            "sim_mib": rss(sim_pid),
            "driver_mib": rss(proc.pid),
            "records": progress_rows(run) if run.exists() else 0,
        }
        if s["generator_mib"] is None:
            continue  # not started yet
        samples.append(s)
        fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        print(
            f"{s['t_s'] / 60:8.1f} {fmt(s['generator_mib']):>18} {fmt(s['sim_mib']):>12} "
            f"{fmt(s['driver_mib']):>15} {s['records']:>9}",
            flush=True,
        )
    _, err = proc.communicate()
    wall = time.time() - t0
    print(f"rig run exited with code {proc.returncode} after {wall / 60:.1f} min", flush=True)
    if proc.returncode != 0:
        print(err[-2000:])

    # ---- the accounting invariant, from the manifest and the Parquet alone
    m = load_manifest(run)
    t = read_requests(run, columns=["point", "request_id", "status", "completion_tokens"]).to_pandas()
    (p,) = m.points
    counts = {k: int((t.status == k).sum()) for k in ("ok", "failed", "cancelled")}
    dup = int(t.duplicated(["point", "request_id"]).sum())
    holds = p.requests_scheduled == len(t) == sum(counts.values()) and counts == p.records.model_dump() and dup == 0
    print(f"point {p.point}: status {p.status}, flags {p.flags}")
    print(
        f"scheduled {p.requests_scheduled} = ok {counts['ok']} + failed {counts['failed']} + cancelled "
        f"{counts['cancelled']} = {sum(counts.values())} rows; manifest records {p.records.model_dump()}; "
        f"duplicate ids {dup} -> invariant {'HOLDS' if holds else 'BROKEN'}"
    )
    tokens = int(t.completion_tokens.fillna(0).sum())
    window = p.ended_ts - p.started_ts
    print(f"requests {len(t)} ({len(t) / window:.2f}/s), completion tokens {tokens} ({tokens / window:.0f}/s)")

    # ---- memory over time
    summary: dict = {
        "run": str(run),
        "minutes": a.minutes,
        "requests": len(t),
        "counts": counts,
        "duplicates": dup,
        "invariant_holds": holds,
        "status": p.status,
    }
    if len(samples) >= 2:
        for key in ("generator_mib", "sim_mib", "driver_mib"):
            vals = [(s["t_s"], s[key]) for s in samples if s[key] is not None]
            if len(vals) < 2:
                continue
            start, mid, end = vals[0], vals[len(vals) // 2], vals[-1]

            def per_hour(a: tuple[float, float], b: tuple[float, float]) -> float:
                return (b[1] - a[1]) / ((b[0] - a[0]) / 3600) if b[0] > a[0] else 0.0

            # whole level (from the second sample: the first can predate the level's start), and its second half
            # (steady state: caches and allocator pools have filled by then)
            whole = per_hour(vals[1] if len(vals) > 2 else vals[0], end)
            steady = per_hour(mid, end)
            summary[key] = {
                "start": start[1],
                "middle": mid[1],
                "end": end[1],
                "max": max(v for _, v in vals),
                "growth_mib_per_hour": whole,
                "second_half_growth_mib_per_hour": steady,
            }
            print(
                f"{key.removesuffix('_mib'):>9} RSS MiB: start {start[1]:.1f}, middle {mid[1]:.1f}, end {end[1]:.1f},"
                f" max {summary[key]['max']:.1f}; growth {whole:+.1f} MiB/h over the level, {steady:+.1f} MiB/h "
                f"over its second half"
            )
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"summary": summary, "samples": samples}, indent=1))


if __name__ == "__main__":
    main()
