"""Energy from NVML's counter against the integral of sampled power, under a varying GPU load (issue 20, item 4).

Run on a GPU node (needs torch with CUDA and nvidia-ml-py; the rig package importable, e.g. from the repository root):

    python benchmarks/gpu_energy_check.py                 # GPU 0, the default load profile (~50 s)
    python benchmarks/gpu_energy_check.py --gpu 1 --size 8192 --phases 0:6,100:8,30:8,100:6,60:6,0:4

It loads the GPU with bf16 matmuls at a varying duty cycle (PHASES: duty %:seconds, each duty cycle over a 200 ms
period), samples it with rig's own sampler (rig.server.gpu_telemetry.GpuSampler over NvmlSource, writing
gpu_metrics Parquet as the server actor does) at 1 s and at 100 ms at the same time, with an extra round at the
load's start as the runner takes one at a point's common start, and prints the load window's energy: from the
total-energy counter (read directly before and after, and as rig's analysis interpolates it from each sampler's
rows), and from the integral of sampled power at each interval, with the % difference from the counter. The goal
is within 5 %. Where there is no GPU it prints one line and exits 2. It prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # rig from this checkout


def parse_phases(text: str) -> list[tuple[float, float]]:
    out = []
    for part in text.split(","):
        duty, secs = part.split(":")
        out.append((float(duty) / 100.0, float(secs)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=int, default=0, help="CUDA device (and NVML index) to load")
    ap.add_argument("--size", type=int, default=8192, help="matmul size (bf16, N x N)")
    ap.add_argument("--phases", default="0:6,100:8,30:8,100:6,60:6,0:4", help="duty %%:seconds, comma-separated")
    ap.add_argument("--period", type=float, default=0.2, help="duty-cycle period (s)")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("gpu_energy_check: no GPU here (torch is not installed); run it on the GPU node")
        return 2
    if not torch.cuda.is_available():
        print("gpu_energy_check: no GPU here (torch.cuda.is_available() is False); run it on the GPU node")
        return 2
    from rig.analysis.energy import gpu_energy
    from rig.results import GPU_METRICS_SCHEMA, PartWriter, read_gpu_metrics
    from rig.server.gpu_telemetry import GpuSampler, NvmlSource, TelemetryAbsent

    try:
        src = NvmlSource.open([str(args.gpu)])
    except TelemetryAbsent as e:
        print(f"gpu_energy_check: no NVML telemetry here: {e}")
        return 2
    nvml, handle = src.nvml, src.handles[0]
    info = src.gpus[0]
    print(
        f"GPU {args.gpu}: {info['name']} ({info['uuid']}), NVML index {info['index']}, power limit "
        f"{(info.get('power_limit_mw') or 0) / 1000:.0f} W"
    )
    dev = torch.device(f"cuda:{args.gpu}")
    a = torch.randn(args.size, args.size, device=dev, dtype=torch.bfloat16)
    b = torch.randn(args.size, args.size, device=dev, dtype=torch.bfloat16)
    for _ in range(3):  # warm up cuBLAS
        a @ b
    torch.cuda.synchronize(dev)
    phases = parse_phases(args.phases)
    with tempfile.TemporaryDirectory() as tmp:
        samplers = {}
        for name, interval in (("1s", 1.0), ("100ms", 0.1)):
            w = PartWriter(Path(tmp) / name / "gpu_metrics" / "point=check", GPU_METRICS_SCHEMA, max_age_s=60)
            samplers[name] = GpuSampler(src, w, {"run_id": "check", "point": "check", "node": "local"}, interval)
        for s in samplers.values():
            s.start()
        time.sleep(1.5)
        t_start = time.time() + 0.3
        for s in samplers.values():
            s.sample_at(t_start)  # as the runner does at a point's common start
        time.sleep(max(0.0, t_start - time.time()))
        c0 = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        t0 = time.time()
        for duty, secs in phases:
            end = time.time() + secs
            while time.time() < end:
                busy_until = time.time() + duty * args.period
                while time.time() < busy_until:
                    a @ b
                    torch.cuda.synchronize(dev)
                time.sleep(max(0.0, (1 - duty) * args.period))
        torch.cuda.synchronize(dev)
        t1 = time.time()
        c1 = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        time.sleep(0.05)
        stats = {name: s.stop() for name, s in samplers.items()}
        direct = (c1 - c0) / 1000.0
        print(f"load window {t1 - t0:.1f} s, phases {args.phases} (duty %:s), period {args.period:g} s")
        print(f"counter read directly before/after: {direct:,.1f} J (mean {direct / (t1 - t0):,.1f} W)")
        for name in samplers:
            t = read_gpu_metrics(Path(tmp) / name).sort_by("ts")
            ts = np.asarray(t["ts"].to_numpy(zero_copy_only=False), dtype=float)
            e = np.asarray(t["energy_mj"].to_numpy(zero_copy_only=False), dtype=float)
            p = np.asarray(t["power_mw"].to_numpy(zero_copy_only=False), dtype=float)
            counter = gpu_energy(ts, e, p, t0, t1)
            integral = gpu_energy(ts, np.full_like(e, np.nan), p, t0, t1)
            st = stats[name]
            per = st.cpu_s / max(1, st.samples + st.failed)
            line = f"sampler {name:>5}: {st.samples} rounds, {per * 1e3:.3f} ms CPU per round; "
            if counter is not None:
                line += (
                    f"counter (rig's interpolation) {counter[0]:,.1f} J ({(counter[0] / direct - 1) * 100:+.2f} %); "
                )
            if integral is not None:
                line += (
                    f"integral of sampled power {integral[0]:,.1f} J "
                    f"({(integral[0] / direct - 1) * 100:+.2f} % vs the counter)"
                )
            print(line)
    src.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
