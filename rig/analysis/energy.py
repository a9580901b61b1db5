"""Energy and cost per point, from the run's GPU telemetry (``gpu_metrics``) and its requests.

- **Energy** of a point: over its window (first send to last end, on the driver's clock; the server node's samples
  are moved onto it with the clock offset the manifest recorded), per GPU the increase of NVML's total-energy
  counter, linearly interpolated between the samples either side of each end of the window (``counter``). Only a
  GPU with no counter readings is integrated from sampled power instead (trapezoids, ``power_integral``): sampled
  power misses what happens between samples (gpu-node.md: -0.98 % at 1 s under a varying load). Summed over the GPUs.
  A window the samples do not cover is not extrapolated: the point then has no energy.
- **J/token** = energy / output tokens (Σ completion_tokens of ok requests, as aggregate tok/s).
  **Mean power** = energy / wall. **tok/s per W** = aggregate tok/s / mean power (= tokens per joule).
- **$/Mtok** = GPU-hour price x GPUs x wall hours / output tokens x 10^6, GPUs from the telemetry (else tp). The
  price is ``--gpu-hour-price`` or the cluster file's ``gpu_hour_price``; it covers the GPUs' time, not electricity.

Figures from the simulator's power model carry ``energy_source = simulated`` everywhere they are shown.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow.compute as pc

from rig.analysis.runs import PointInfo, Run, read_point_gpu_metrics
from rig.contracts import CampaignRow
from rig.results import GPU_METRICS_DIR

COVERAGE = 0.999  # share of a point's window the samples must span (both ends bracketed, within float noise)
ENERGY_KEYS = ("energy_source", "energy_method", "gpus", "energy_j", "mean_power_w", "j_per_token", "tok_s_per_w")
COST_KEYS = ("gpu_hour_price", "usd_per_mtok")
_COLUMNS = ["ts", "source", "gpu_uuid", "power_mw", "energy_mj"]


def gpu_energy(
    ts: np.ndarray, counter_mj: np.ndarray, power_mw: np.ndarray, a: float, b: float
) -> tuple[float, str] | None:
    """Joules one GPU drew over [a, b] from its samples (times ascending): (joules, method), or None when the
    samples do not span the window."""
    if b <= a:
        return None
    have = np.isfinite(counter_mj)
    t, c = ts[have], counter_mj[have]
    if t.size >= 2 and t[0] <= a and t[-1] >= b:
        delta = float(np.interp(b, t, c) - np.interp(a, t, c))
        if delta >= 0 and np.all(np.diff(c) >= 0):  # a counter that went back (driver reload) is not used
            return delta / 1000.0, "counter"
    have = np.isfinite(power_mw)
    t, p = ts[have], power_mw[have]
    if t.size < 2 or t[0] > a + (1 - COVERAGE) * (b - a) or t[-1] < b - (1 - COVERAGE) * (b - a):
        return None
    inside = (t > a) & (t < b)
    xs = np.concatenate([[a], t[inside], [b]])
    ys = np.concatenate([[np.interp(a, t, p)], p[inside], [np.interp(b, t, p)]])
    return float(np.sum((ys[1:] + ys[:-1]) / 2 * np.diff(xs))) / 1000.0, "power_integral"


def telemetry_of(run: Run, p: PointInfo) -> Any:
    """The GpuTelemetry entry of the point's server configuration (None: the run recorded none)."""
    return run.server_config(p.server_config).telemetry


def has_telemetry(run: Run) -> bool:
    """Did any server configuration of the run record GPU samples (or do samples lie on disk)?"""
    if any(c.telemetry is not None and c.telemetry.source for c in run.manifest.server_configs.values()):
        return True
    return (run.run_dir / GPU_METRICS_DIR).exists()


@dataclass(frozen=True)
class PointEnergy:
    """The ENERGY_KEYS of one campaign row (None where the point has no usable samples)."""

    energy_source: str | None = None
    energy_method: str | None = None
    gpus: int | None = None
    energy_j: float | None = None
    mean_power_w: float | None = None
    j_per_token: float | None = None
    tok_s_per_w: float | None = None


def point_energy(run: Run, p: PointInfo, row: CampaignRow) -> PointEnergy:
    """The energy figures of one campaign row's point, over its window, all GPUs."""
    out = PointEnergy()
    a, b = row.first_send_ts, row.last_end_ts
    tel = telemetry_of(run, p)
    if a is None or b is None:
        return out
    t = read_point_gpu_metrics(run.run_dir, p.point, _COLUMNS, run.skipped(p))
    if t.num_rows == 0:
        return out
    offset = (tel.clock_offset_s if tel is not None else None) or 0.0
    sources = set(t["source"].drop_null().to_pylist())
    total, methods, gpus = 0.0, set(), 0
    for uuid in sorted(set(t["gpu_uuid"].to_pylist()), key=str):
        g = t.filter(pc.equal(t["gpu_uuid"], uuid)) if uuid is not None else t.filter(pc.is_null(t["gpu_uuid"]))
        order = np.argsort(g["ts"].to_numpy(zero_copy_only=False), kind="stable")
        ts = g["ts"].to_numpy(zero_copy_only=False)[order] - offset  # onto the driver's clock
        got = gpu_energy(ts, _floats(g["energy_mj"])[order], _floats(g["power_mw"])[order], a, b)
        if got is None:
            return out  # one GPU's samples do not span the window: no partial sums
        total += got[0]
        methods.add(got[1])
        gpus += 1
    wall = b - a
    tokens = row.tokens or 0
    power = total / wall
    return PointEnergy(
        energy_source=",".join(sorted(sources)) or None,
        energy_method=methods.pop() if len(methods) == 1 else "mixed",
        gpus=gpus,
        energy_j=total,
        mean_power_w=power,
        j_per_token=total / tokens if tokens else None,
        tok_s_per_w=(row.aggregate_tok_s / power) if row.aggregate_tok_s and power > 0 else None,
    )


def _floats(col: Any) -> np.ndarray:
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=float)


def usd_per_mtok(price: float | None, gpus: int | None, wall_s: float | None, tokens: int | None) -> float | None:
    """Dollars per million output tokens at ``price`` per GPU-hour."""
    if price is None or not gpus or not wall_s or not tokens:
        return None
    return price * gpus * wall_s / 3600.0 / tokens * 1e6


def recorded_price(run: Run) -> float | None:
    """The cluster file's gpu_hour_price the run recorded in its spec, if any."""
    cluster = (run.manifest.spec or {}).get("cluster") or {}
    v = cluster.get("gpu_hour_price") if isinstance(cluster, dict) else None
    return float(v) if isinstance(v, (int, float)) and v >= 0 else None


def gpu_count(run: Run, p: PointInfo, energy: PointEnergy | None) -> int:
    """GPUs of the point's server: those the telemetry saw, else tp (1 when unknown)."""
    if energy is not None and energy.gpus:
        return int(energy.gpus)
    tel = telemetry_of(run, p)
    if tel is not None and tel.gpus:
        return len(tel.gpus)
    return int(p.knobs.get("tp") or 1)


def add_energy(run: Run, rows: list[CampaignRow], price: float | None = None) -> bool:
    """Set the energy keys of every campaign row when the run has GPU telemetry, and the cost keys when a price is
    given (the flag's, else the run's cluster file's). Returns whether energy keys were added."""
    price = price if price is not None else recorded_price(run)
    energy = has_telemetry(run)
    if not energy and price is None:
        return False
    by_point = {p.point: p for p in run.points}
    for r in rows:
        p = by_point[r.point]
        e = point_energy(run, p, r) if energy else None
        if e is not None:
            for k, v in asdict(e).items():
                setattr(r, k, v)
        if price is not None:
            r.gpu_hour_price = price
            r.usd_per_mtok = usd_per_mtok(price, gpu_count(run, p, e), r.wall_s, r.tokens)
    return energy


def telemetry_lines(run: Run) -> list[str]:
    """One line per server configuration: where its GPU figures come from, or why it has none."""
    out = []
    for cid, cfg in run.manifest.server_configs.items():
        tel = cfg.telemetry
        if tel is None:
            continue
        if tel.source is None:
            out.append(f"GPU telemetry of {cid}: absent ({tel.absent_reason})")
        else:
            names = sorted({str(g.get("name")) for g in tel.gpus})
            what = "SIMULATED (the simulator's power model, not a measurement)" if tel.source == "simulated" else "NVML"
            out.append(f"GPU telemetry of {cid}: {what}, {len(tel.gpus)} GPU(s) ({', '.join(names)})")
    return out
