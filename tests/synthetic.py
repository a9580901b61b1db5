"""Writing run directories by hand: fixtures for the analysis tests and data for the scale benchmark (a test helper:
nothing in rig/ imports it)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rig.contracts import Manifest, unknown_columns
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
