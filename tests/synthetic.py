"""Writing run directories by hand: fixtures for the analysis tests and data for the scale benchmark (a test helper:
nothing in rig/ imports it)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rig.contracts import Manifest, PointColumns, unknown_columns
from rig.results import (
    REQUEST_SCHEMA,
    SERVER_METRICS_SCHEMA,
    PartWriter,
    empty_record,
    requests_dir,
    server_metrics_dir,
    write_manifest,
)


def record(**fields: Any) -> dict[str, Any]:
    """A request record with every schema column; unknown keys are an error (they would be dropped silently)."""
    unknown = unknown_columns(list(fields))
    if unknown:
        raise KeyError(f"not in RequestRecord: {unknown}")
    row = empty_record()
    row.update(fields)
    return row


def point_entry(point: str, steps: int, concurrency: int = 4, **over: Any) -> dict[str, Any]:
    """A complete closed-loop greedy point of configuration ``cfg<steps>`` as the manifest records it."""
    return {
        "point": point,
        "server_config": f"cfg{steps}",
        "engine": "sim",
        "workload": "greedy",
        "steps": steps,
        "load_mode": "closed",
        "concurrency": concurrency,
        "rate": None,
        "repeat": 0,
        "status": "complete",
        "flags": [],
        "generators": [],
        **over,
    }


def greedy_rows(
    point: str, steps: int, ttft: Iterable[float], e2e: Iterable[float], tokens: int
) -> list[dict[str, Any]]:
    """Successful greedy requests of a closed-loop point (concurrency 4), one per (ttft, e2e) pair, sent 0.1 s apart;
    request ids r0, r1, ... pair them across points."""
    rows = []
    for i, (first, whole) in enumerate(zip(ttft, e2e, strict=True)):
        send = 100.0 + 0.1 * i
        rows.append(
            record(
                point=point,
                steps=steps,
                workload="greedy",
                load_mode="closed",
                concurrency=4,
                repeat=0,
                generator=0,
                clock_offset_s=0.0,
                request_id=f"r{i}",
                send_ts=send,
                first_token_ts=send + first,
                end_ts=send + whole,
                ttft_s=first,
                e2e_s=whole,
                completion_tokens=tokens,
                status="ok",
                ok=True,
                temperature=0.0,
                output_hash="h",
            )
        )
    return rows


def write_requests(run_dir: Path, point: str, generator: int, rows: Iterable[dict[str, Any]]) -> None:
    """Rows of one (point, generator) as one closed part file, through the runner's own writer."""
    w = PartWriter(requests_dir(run_dir, point, generator), REQUEST_SCHEMA)
    for r in rows:
        w.add(r)
    w.close()


def write_server_metrics(run_dir: Path, point: str, samples: Iterable[dict[str, Any]]) -> None:
    """Server metric samples (run_id, point, ts, name, labels, value) of one point."""
    w = PartWriter(server_metrics_dir(run_dir, point), SERVER_METRICS_SCHEMA)
    for s in samples:
        w.add({"run_id": None, "point": point, "labels": "{}", **s})
    w.close()


def write_run(run_dir: Path, manifest: Manifest | dict[str, Any]) -> Path:
    """Create the directory and its manifest (a dict is read as a manifest would be: validated, migrated)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_manifest(run_dir, manifest if isinstance(manifest, Manifest) else Manifest.from_data(manifest))
    return run_dir


# The reference campaign's shape (docs: shared/reference/campaign.md), per (steps, concurrency): the TPOT each
# request decodes at, in seconds. steps=4 is best up to C=32; at C=64 steps=3 beats it (the campaign's regression).
CAMPAIGN_TPOT = {
    1: {1: 0.0081, 4: 0.0095, 16: 0.0140, 32: 0.0200, 64: 0.0330},
    2: {1: 0.0054, 4: 0.0070, 16: 0.0115, 32: 0.0180, 64: 0.0300},
    3: {1: 0.0043, 4: 0.0058, 16: 0.0105, 32: 0.0170, 64: 0.0290},
    4: {1: 0.0036, 4: 0.0052, 16: 0.0100, 32: 0.0165, 64: 0.0310},
}
CAMPAIGN_TOKENS = 200
CAMPAIGN_TTFT = 0.05


def campaign_run(
    run_dir: Path,
    spread: float = 0.03,
    jitter: float = 0.02,
    seed: int = 1,
    arms: dict[str, tuple[int, dict[int, float]]] | None = None,
) -> Path:
    """A closed-loop greedy sweep shaped like the reference campaign: steps 1-4 x C=1..64, 2C requests a level (4
    at C=1) that run back to back in C slots, each at its level's TPOT times a seeded factor within ±``spread``
    (the same per request id at every point: the request's own length, as a sweep's points pair up) and one
    within ±``jitter`` of its own (the point's noise). ``arms``: more configurations, by id: (startup steps, TPOT
    per level), e.g. a schedule or an adaptive server."""
    import numpy as np

    rng = np.random.default_rng(seed)
    factors = 1 + rng.uniform(-spread, spread, 128)
    configs: dict[str, Any] = {}
    points, rows_of = [], {}
    table = [(f"cfg{steps}", steps, by) for steps, by in CAMPAIGN_TPOT.items()]
    table += [(cfg, steps, by) for cfg, (steps, by) in (arms or {}).items()]
    for cfg, steps, by_level in table:
        configs[cfg] = {"engine": "sim", "knobs": {"engine": "sim", "tp": 4, "steps": steps}}
        for c, tpot in by_level.items():
            n, point = (4 if c == 1 else 2 * c), f"{cfg}-c{c}" if arms and cfg in arms else f"s{steps}-c{c}"
            points.append(
                point_entry(
                    point,
                    steps,
                    c,
                    server_config=cfg,
                    requests_scheduled=n,
                    records={"ok": n, "failed": 0, "cancelled": 0},
                    generators=[{"generator": 0, "status": "complete"}],
                )
            )
            rows, free = [], [100.0] * c  # each slot's next free time
            for i in range(n):
                own = 1 + rng.uniform(-jitter, jitter)
                e2e = CAMPAIGN_TTFT + tpot * factors[i] * own * (CAMPAIGN_TOKENS - 1)
                slot = min(range(c), key=lambda s: free[s])
                send = free[slot]
                free[slot] = send + e2e
                common = dict(point=point, steps=steps, server_config=cfg, engine="sim", workload="greedy")
                rows.append(
                    record(
                        **common,
                        load_mode="closed",
                        concurrency=c,
                        repeat=0,
                        generator=0,
                        clock_offset_s=0.0,
                        request_id=f"r{i}",
                        send_ts=send,
                        first_token_ts=send + CAMPAIGN_TTFT,
                        end_ts=send + e2e,
                        ttft_s=CAMPAIGN_TTFT,
                        e2e_s=e2e,
                        completion_tokens=CAMPAIGN_TOKENS,
                        status="ok",
                        ok=True,
                        temperature=0.0,
                        ignore_eos=True,
                        output_hash=f"h{i}",
                    )
                )
            rows_of[point] = rows
    manifest = {
        "run_id": "campaign",
        "status": "complete",
        "server_configs": configs,
        "points": points,
        "cluster": {"generators": [{"generator": 0, "clock_offset_s": 0.0}]},
    }
    write_run(run_dir, manifest)
    for point, rows in rows_of.items():
        write_requests(run_dir, point, 0, rows)
    return run_dir


def point_columns(**over: Any) -> PointColumns:
    """The point columns a generator stamps on every record, for a closed-loop point of an external server."""
    base: dict[str, Any] = dict(
        run_id="r", point="p0", engine="external", workload="t", api="sglang-native", steps=0, server_config="x",
        server_args="{}", load_mode="closed", concurrency=2, rate=None, repeat=0,
    )  # fmt: skip
    return PointColumns(**{**base, **over})
