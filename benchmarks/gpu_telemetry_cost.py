"""What GPU telemetry costs the server node, and that it stays off the request path (issue 20, item 5).

    .venv/bin/python benchmarks/gpu_telemetry_cost.py                  # here: the simulator's modelled GPUs
    python benchmarks/gpu_telemetry_cost.py --source nvml              # on a GPU node: NVML (nvidia-ml-py)

Part 1, cost: rig's own sampler (rig.server.gpu_telemetry.GpuSampler writing gpu_metrics Parquet, as the server
actor runs it) takes ROUNDS rounds back to back; prints the process CPU time per round (user + system: the NVML
library's and the driver's ioctls count here, as does Parquet writing) and what that is, as a share of one core, at
a 1 s interval; with the simulator also the sim's own CPU per /sim/gpu answer (its process, read with psutil). With
NVML it repeats this for 1..N of the node's GPUs (the cost per round grows with the GPUs sampled).

Part 2, the request path: by construction the sampler is a thread of the server actor, a process of its own; the
engine's requests and the generators never wait on it. Measured: with the simulator, the latency of short
/generate requests sent one after another with the sampler off, at 1 s and at 100 ms; on a GPU node (torch
present), the time of a fixed burst of bf16 matmuls with the sampler off and at 100 ms. It prints figures; it
asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # rig from this checkout

from rig.results import GPU_METRICS_SCHEMA, PartWriter  # noqa: E402
from rig.server.gpu_telemetry import GpuSampler, NvmlSource, SimulatedSource, Source, TelemetryAbsent  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sim(tp: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "rig.sim",
        "--model-path",
        "Qwen/Qwen3.5-122B-A10B",
        "--tp-size",
        str(tp),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--enable-metrics",
        "--sim-no-access-log",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(
        f"gpu_telemetry_cost: the simulator (--tp-size {tp}) did not become healthy (exit code {proc.poll()})"
    )


def sampler(src: Source, tmp: str, interval: float) -> GpuSampler:
    w = PartWriter(Path(tmp) / f"g{time.monotonic_ns()}", GPU_METRICS_SCHEMA, max_age_s=5.0)
    return GpuSampler(src, w, {"run_id": "bench", "point": "p", "node": "local"}, interval)


def cost(src: Source, rounds: int, other_cpu: Callable[[], float] | None = None) -> dict[str, float]:
    """Process CPU per round (sampling + writing its rows), over ``rounds`` rounds back to back."""
    with tempfile.TemporaryDirectory() as tmp:
        s = sampler(src, tmp, 1.0)
        s.sample_once()  # warm: first calls pay lazy set-up
        other0 = other_cpu() if other_cpu else 0.0
        c0, w0 = time.process_time(), time.perf_counter()
        for i in range(rounds):
            s.sample_once()
            if i % 50 == 49:
                s.writer.flush()  # a part per 50 rounds (the actor's writer: one per 5 s at a 1 s interval)
        s.writer.close()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        other = (other_cpu() - other0) if other_cpu else 0.0
    return {
        "cpu_ms": cpu / rounds * 1e3,
        "wall_ms": wall / rounds * 1e3,
        "other_ms": other / rounds * 1e3,
        "rows": len(src.gpus),
    }


def generate_latency(url: str, n: int) -> np.ndarray:
    body = json.dumps({"text": "Say hello.", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}).encode()
    out = []
    for _ in range(n):
        req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
        out.append(time.perf_counter() - t0)
    return np.array(out) * 1e3


def pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q))


def run_sim(args: argparse.Namespace) -> None:
    import psutil

    for tp in args.tp:
        proc, url = start_sim(tp)
        try:
            sim = psutil.Process(proc.pid)
            src = SimulatedSource(url)
            c = cost(src, args.rounds, lambda sim=sim: sum(sim.cpu_times()[:2]))
            total = c["cpu_ms"] + c["other_ms"]
            print(
                f"simulated source, {c['rows']} GPUs (--tp-size {tp}): {c['cpu_ms']:.3f} ms CPU per round in the "
                f"sampler's process + {c['other_ms']:.3f} ms in the sim answering /sim/gpu; wall {c['wall_ms']:.3f} "
                f"ms per round -> {total / 10:.3f} % of one core at a 1 s interval"
            )
            if tp != args.tp[0]:
                continue
            print(f"request path: {args.requests} short /generate requests one after another (ms):")
            for label, interval in (("sampler off", None), ("sampler at 1 s", 1.0), ("sampler at 100 ms", 0.1)):
                with tempfile.TemporaryDirectory() as tmp:
                    s = sampler(src, tmp, interval) if interval else None
                    if s:
                        s.start()
                    lat = generate_latency(url, args.requests)
                    rounds = s.stop().samples if s else 0
                print(
                    f"  {label:>18}: p50 {pct(lat, 50):.2f}  p90 {pct(lat, 90):.2f}  p99 {pct(lat, 99):.2f}  "
                    f"({rounds} sampling rounds meanwhile)"
                )
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def run_nvml(args: argparse.Namespace) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except (ImportError, Exception) as e:  # noqa: BLE001 (NVMLError and its subclasses)
        print(f"gpu_telemetry_cost: no NVML here ({type(e).__name__}: {e}); use --source simulated")
        raise SystemExit(2) from None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = [d for d in visible.split(",") if d] if visible else [str(i) for i in range(count)]
    for n in range(1, len(devices) + 1):
        try:
            src = NvmlSource.open(devices[:n])
        except TelemetryAbsent as e:
            print(f"gpu_telemetry_cost: {e}")
            raise SystemExit(2) from None
        c = cost(src, args.rounds)
        src.close()
        print(
            f"NVML, {n} GPU(s): {c['cpu_ms']:.3f} ms CPU per round (wall {c['wall_ms']:.3f} ms) -> "
            f"{c['cpu_ms'] / 10:.3f} % of one core at a 1 s interval"
        )
    try:
        import torch
    except ImportError:
        print("request path: torch not installed; by construction only (the sampler is its own thread)")
        return
    if not torch.cuda.is_available():
        return
    dev = torch.device("cuda:0")
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    for _ in range(5):
        a @ a
    torch.cuda.synchronize(dev)

    def burst() -> float:
        t0 = time.perf_counter()
        for _ in range(200):
            a @ a
        torch.cuda.synchronize(dev)
        return (time.perf_counter() - t0) * 1e3

    src = NvmlSource.open(devices[:1])
    print("request path: a burst of 200 bf16 4096^2 matmuls on GPU 0 (ms), 10 bursts each:")
    for label, interval in (("sampler off", None), ("sampler at 100 ms", 0.1), ("sampler off ", None)):
        with tempfile.TemporaryDirectory() as tmp:
            s = sampler(src, tmp, interval) if interval else None
            if s:
                s.start()
            times = np.array([burst() for _ in range(10)])
            rounds = s.stop().samples if s else 0
        print(f"  {label:>18}: median {np.median(times):.2f}  max {times.max():.2f}  ({rounds} rounds meanwhile)")
    src.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", choices=["simulated", "nvml"], default="simulated")
    ap.add_argument("--rounds", type=int, default=500, help="sampling rounds timed back to back")
    ap.add_argument(
        "--tp",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[4, 8],
        help="simulated GPUs (--tp-size of the sim), comma-separated",
    )
    ap.add_argument("--requests", type=int, default=300, help="requests per request-path measurement (sim)")
    args = ap.parse_args()
    info: dict[str, Any] = {"load": os.getloadavg(), "cpus": os.cpu_count()}
    print(f"machine: {info['cpus']} CPUs, load average {info['load'][0]:.2f} / {info['load'][1]:.2f}")
    (run_nvml if args.source == "nvml" else run_sim)(args)


if __name__ == "__main__":
    main()
