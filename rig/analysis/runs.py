"""Opening a run directory for analysis: the validated manifest, a view of each point, per-point Parquet readers."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pydantic import Field, ValidationError

from rig.analysis.memo import Memo
from rig.contracts import (
    IDENTITY_FIELDS,
    JUDGED_FLAGS,
    ContractError,
    Manifest,
    PointEntry,
    ServerConfigEntry,
    Thresholds,
    judge_point,
    parse_manifest,
)
from rig.results import (
    GPU_METRICS_DIR,
    GPU_METRICS_SCHEMA,
    MANIFEST,
    REQUEST_SCHEMA,
    REQUESTS_DIR,
    SERVER_METRICS_DIR,
    SERVER_METRICS_SCHEMA,
    part_paths,
)
from rig.server.effective import change_lines, label_knobs

# Knobs that only change how speculation runs; configurations differing only in these must agree on greedy output.
SPECULATIVE_KNOBS = frozenset(
    {"steps", "spec_algorithm", "spec_method", "eagle_topk", "num_draft_tokens", "draft_model_path", "spec_schedule"}
)
CLOSED = "closed"
T = TypeVar("T")


class AnalysisInputError(Exception):
    """A user-facing problem with a run directory (one line, no traceback)."""


class PointInfo(PointEntry):
    """A point as analysis sees it: its manifest entry (rig.contracts.PointEntry: identity, status, generators, the
    run's verdict) with the server knobs it ran, and what analysis found on disk. A point the manifest lacks (or a
    sparse entry) gets its identity from its rows."""

    knobs: dict[str, Any] = Field(default_factory=dict)  # as the server ran them (effective values)
    seeds_honoured: bool | None = None  # does the server use per-request sampling seeds (None: unknown)
    in_manifest: bool = True
    unreadable_parts: list[str] = Field(default_factory=list)  # part files on disk that could not be read
    missing_parts: list[str] = Field(default_factory=list)  # part files the manifest lists but the disk lacks

    @property
    def open_loop(self) -> bool:
        return self.load_mode not in (None, CLOSED)

    @property
    def level(self) -> float | int | None:
        """The load level: concurrency for a closed loop, target rate for an open one."""
        return self.rate if self.open_loop else self.concurrency

    def level_key(self) -> tuple:
        """Points with equal level keys ran the same requests at the same load (they are paired)."""
        return (self.workload, self.load_mode, self.concurrency, self.rate, self.repeat)

    def non_speculative_knobs(self) -> str:
        """The server knobs other than speculative ones, as a canonical string."""
        rest = {k: v for k, v in self.knobs.items() if k not in SPECULATIVE_KNOBS}
        if not rest:
            return json.dumps({"engine": self.engine}, sort_keys=True)
        return json.dumps(rest, sort_keys=True, default=str)


@dataclass
class Run:
    """A run directory opened for analysis."""

    run_dir: Path
    manifest: Manifest
    points: list[PointInfo]
    warnings: list[str] = field(default_factory=list)
    _memo: Memo = field(default_factory=Memo, repr=False, compare=False)
    _local: threading.local = field(default_factory=threading.local, repr=False, compare=False)

    def memo(self, what: str, point: str, make: Callable[[], T]) -> T:
        """``make()`` for (what, point), kept for the next call while the point's part files are unchanged (the
        report's later sections read a point again; a run still being written is re-read). Keeps the last
        MEMO_ENTRIES results, and more while they hold no more than MEMO_BYTES (rig.analysis.memo); two threads
        asking for the same one make it once."""
        stamp = []
        for f in point_files(self.run_dir, point):
            try:
                st = os.stat(f)
                stamp.append((f, st.st_size, st.st_mtime_ns))
            except OSError:
                stamp.append((f, -1, -1))
        key = (what, point, tuple(stamp))
        return self._memo.get(key, make)

    def forget(self) -> None:
        """Drop what ``memo`` kept."""
        self._memo.clear()

    @contextmanager
    def deferred_notes(self) -> Iterator[list[str]]:
        """Warnings this thread notes inside the block are collected in the list it yields instead of added: a
        reader thread's warnings are added by the report in point order (``note`` each), as a sequential pass would."""
        notes: list[str] = []
        self._local.notes = notes
        try:
            yield notes
        finally:
            self._local.notes = None

    @property
    def run_id(self) -> str:
        return str(self.manifest.run_id or self.run_dir.name)

    @property
    def status(self) -> str | None:
        return self.manifest.status

    def note(self, warning: str) -> None:
        """Add a warning once (inside ``deferred_notes``: collect it)."""
        deferred = getattr(self._local, "notes", None)
        if deferred is not None:
            deferred.append(warning)
        elif warning not in self.warnings:
            self.warnings.append(warning)

    def point(self, name: str) -> PointInfo:
        for p in self.points:
            if p.point == name:
                return p
        raise AnalysisInputError(
            f"no point {name!r} in {self.run_dir} (points: {', '.join(p.point for p in self.points)})"
        )

    def skipped(self, p: PointInfo) -> Callable[[str], None]:
        """The ``on_skip`` callback every reader of ``p``'s rows uses: warns once and marks the point."""

        def record(message: str) -> None:
            path = message.rsplit(": ", 1)[-1]
            if path not in p.unreadable_parts:
                p.unreadable_parts.append(path)
            self.note(message)

        return record

    def server_config(self, config_id: str | None) -> ServerConfigEntry:
        return (self.manifest.server_configs.get(config_id) if config_id else None) or ServerConfigEntry()


def point_files(run_dir: Path, point: str, kind: str = REQUESTS_DIR) -> list[str]:
    """Closed part files of one point (``.tmp`` files are half-written and never read)."""
    root = Path(run_dir) / kind / f"point={point}"
    return part_paths(root)


def _points_on_disk(run_dir: Path) -> list[str]:
    root = run_dir / REQUESTS_DIR
    found = {p.name.split("=", 1)[1] for p in root.glob("point=*")} if root.exists() else set()
    return sorted(found)


# The point identity columns of a record (rig.contracts.PointIdentity), and the server knobs as JSON.
_IDENTITY = [*IDENTITY_FIELDS[1:], "server_args"]


@dataclass(frozen=True)
class RowIdentity:
    """A point's identity as its first record carries it (every field None when no part file is readable)."""

    server_config: str | None = None
    engine: str | None = None
    workload: str | None = None
    steps: int | None = None
    load_mode: str | None = None
    concurrency: int | None = None
    rate: float | None = None
    repeat: int | None = None
    server_args: str | None = None  # the server knobs as JSON


def _identity_from_rows(run_dir: Path, point: str) -> RowIdentity:
    files = point_files(run_dir, point)
    for f in files:
        try:
            t = pq.ParquetFile(f).read_row_group(0, columns=_IDENTITY)
        except (OSError, pa.ArrowInvalid):
            continue
        if t.num_rows:
            return RowIdentity(**t.slice(0, 1).to_pylist()[0])
    return RowIdentity()


def _status_warning(run_dir: Path, status: str | None) -> str | None:
    """What the run's status says about its numbers (None: complete)."""
    if status == "running":
        holder = run_holder(run_dir)
        return (
            f"run in progress (rig pid {holder}): numbers cover what was written so far"
            if holder
            else "the manifest says running but no rig process holds the run: it was cut off (killed, "
            "power loss); numbers cover what was written"
        )
    if status != "complete":
        return f"run status is {status or 'unknown'}: numbers cover what was written"
    return None


def load_run(run_dir: Path | str, thresholds: str | None = None) -> Run:
    """Open a run directory; missing manifest keys are filled from the rows and noted in ``warnings``.

    ``thresholds`` (``NAME=VALUE,...``, see rig.contracts.Thresholds) judges the points' validity again with those
    values in place of the ones the run recorded; without it the run's own verdict stands.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise AnalysisInputError(f"{run_dir} is not a directory")
    mpath = run_dir / MANIFEST
    if not mpath.exists():
        raise AnalysisInputError(f"{run_dir} is not a rig run directory (no {MANIFEST})")
    try:
        manifest = parse_manifest(mpath.read_text(), str(mpath))
    except ContractError as e:
        raise AnalysisInputError(str(e)) from None
    warnings: list[str] = []
    if thresholds:
        rejudge_points(manifest, thresholds, warnings)
    status_warning = _status_warning(run_dir, manifest.status)
    if status_warning:
        warnings.append(status_warning)
    points: list[PointInfo] = []
    seen: set[str] = set()
    for entry in manifest.points:
        name = entry.point
        if not name:
            continue
        if name in seen:  # a resumed sweep must not list a point twice; if it does, the first entry wins
            warnings.append(f"point {name} is listed twice in the manifest")
            continue
        seen.add(name)
        cfg = manifest.server_configs.get(entry.server_config or "") or ServerConfigEntry()
        eff = cfg.effective
        knobs = label_knobs(cfg.knobs, eff)  # a value the server changed is labelled as it ran
        try:
            p = PointInfo(
                **{
                    **entry.model_dump(),
                    "engine": entry.engine or cfg.engine,
                    "steps": entry.steps if entry.steps is not None else knobs.get("steps"),
                    "error": entry.error or None,
                },
                knobs=knobs,
                seeds_honoured=eff.seeds_honoured if eff is not None else None,
            )
        except ValidationError as e:
            raise AnalysisInputError(f"{mpath}: point {name}: {e.errors()[0]['msg']}") from None
        points.append(p)
    warnings += effective_warnings(manifest)
    for name in _points_on_disk(run_dir):
        if name not in seen:
            points.append(PointInfo(point=name, in_manifest=False))
            warnings.append(f"point {name} has rows but is not in the manifest")
    for p in points:
        _fill_from_rows(run_dir, p)
        p.missing_parts = _missing_parts(run_dir, p)
        if p.missing_parts:
            warnings.append(
                f"point {p.point}: {len(p.missing_parts)} part file(s) listed in the manifest are missing "
                f"({', '.join(p.missing_parts[:3])}{' …' if len(p.missing_parts) > 3 else ''})"
            )
    if not points:
        raise AnalysisInputError(f"{run_dir} has no points (empty run)")
    return Run(run_dir=run_dir, manifest=manifest, points=points, warnings=warnings)


def rejudge_points(manifest: Manifest, overrides: str, warnings: list[str]) -> None:
    """Judge every point's validity again with the run's thresholds changed by ``overrides`` (in place)."""
    recorded = manifest.thresholds or Thresholds()
    try:
        new = recorded.with_overrides(overrides)
    except ContractError as e:
        raise AnalysisInputError(str(e)) from None
    for entry in manifest.points:
        died = entry.flag_reasons.get("server_died", entry.error) if "server_died" in entry.flags else None
        reasons = {
            f: entry.flag_reasons.get(f, "set by the run (see the manifest)")
            for f in entry.flags
            if f not in JUDGED_FLAGS
        }
        reasons.update(judge_point(entry.load_mode, entry.generators, new, died))
        entry.set_verdict(reasons)
    changed = ", ".join(f"{k}={v:g}" for k, v in new.model_dump().items() if v != getattr(recorded, k))
    warnings.append(
        f"validity judged again with {changed or 'the same thresholds'} (the run recorded "
        + ", ".join(f"{k}={v:g}" for k, v in recorded.model_dump().items())
        + ")"
    )
    manifest.thresholds = new


def sampled_workloads(manifest: Manifest) -> set[str]:
    """Names of the run's workloads that sample (temperature > 0), from the recorded spec."""
    spec = manifest.spec if isinstance(manifest.spec, dict) else {}
    return {
        str(w.get("name"))
        for w in spec.get("workloads") or []
        if isinstance(w, dict) and (w.get("temperature") or 0) > 0
    }


def effective_warnings(manifest: Manifest) -> list[str]:
    """Requested values a server changed, and sampled workloads on a server that ignores per-request seeds."""
    out: list[str] = []
    sampled = sampled_workloads(manifest)
    ran: dict[str, list[str]] = {}  # effective knobs -> configurations that ran them
    for cid, cfg in manifest.server_configs.items():
        eff = cfg.effective
        out += change_lines(cid, eff)
        if eff is not None and eff.changed:
            key = json.dumps(label_knobs(cfg.knobs, eff), sort_keys=True, default=str)
            ran.setdefault(key, []).append(cid)
        else:
            ran.setdefault(json.dumps(cfg.knobs, sort_keys=True, default=str), []).append(cid)
        if eff is not None and eff.seeds_honoured is False and sampled:
            out.append(
                f"server {cid} does not honour per-request seeds (SGLang needs "
                f"--enable-deterministic-inference; rig run --deterministic, which also changes the engine: "
                f"pytorch sampler, and the prefix cache off unless the attention backend is fa3/fa4/triton): "
                f"sampled workloads ({', '.join(sorted(sampled))}) draw different outputs for the same request "
                f"at every point"
            )
    for cids in ran.values():
        if len(cids) > 1:  # e.g. --grid num_draft_tokens=4,8 with topk 1: both ran steps + 1
            out.append(
                f"server configurations {', '.join(cids)} ran the same effective settings (the server "
                "changed what distinguished them): their points are repeats, not different configurations"
            )
    return out


def run_holder(run_dir: Path) -> str | None:
    """The pid of the rig process working in ``run_dir`` (it holds the directory's lock), or None."""
    import fcntl
    import os

    try:
        fd = os.open(Path(run_dir) / ".lock", os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None  # nobody holds it exclusively
    except OSError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
    finally:
        os.close(fd)


def _missing_parts(run_dir: Path, p: PointInfo) -> list[str]:
    """Part files a generator reported writing (the manifest's ``parts``) that are not on disk now."""
    out = []
    for g in p.generators:
        for name in g.parts or []:
            rel = f"{REQUESTS_DIR}/point={p.point}/gen={g.generator}/{name}"
            if not (run_dir / rel).exists():
                out.append(rel)
    return out


def _fill_from_rows(run_dir: Path, p: PointInfo) -> None:
    """Fill identity fields the manifest lacks from the point's first row."""
    needed = [k for k in _IDENTITY[:-1] if getattr(p, k) is None]
    if not needed and p.knobs:
        return
    row = _identity_from_rows(run_dir, p.point)
    for k in needed:
        if getattr(row, k) is not None:
            setattr(p, k, getattr(row, k))
    if not p.knobs and row.server_args:
        try:
            knobs = json.loads(row.server_args)
        except json.JSONDecodeError:
            pass
        else:
            p.knobs = knobs if isinstance(knobs, dict) else {}
    if p.load_mode is None and (p.concurrency is not None or p.rate is not None):
        p.load_mode = CLOSED if p.concurrency is not None else "poisson"


def _read(
    files: list[str],
    schema: pa.Schema,
    cols: list[str] | None,
    filter: pc.Expression | None,
    on_skip: Callable[[str], None] | None,
) -> pa.Table:
    """Read part files as one table; an unreadable file (a crash or a copy cut it short) is skipped and reported."""
    empty = schema.empty_table()
    if not files:
        return empty.select(cols) if cols else empty
    try:
        return ds.dataset(files, schema=schema, format="parquet").to_table(columns=cols, filter=filter)
    except (pa.ArrowInvalid, OSError):
        pass
    # Slow path, only when some file is bad: read file by file and leave the bad ones out.
    tables = []
    for f in files:
        try:
            tables.append(ds.dataset([f], schema=schema, format="parquet").to_table(columns=cols, filter=filter))
        except (pa.ArrowInvalid, OSError):
            if on_skip:
                on_skip(f"unreadable part file skipped: {f}")
    if tables:
        return pa.concat_tables(tables)
    return empty.select(cols) if cols else empty


def read_parts(
    files: list[str],
    schema: pa.Schema,
    columns: Iterable[str] | None = None,
    filter: pc.Expression | None = None,
    on_skip: Callable[[str], None] | None = None,
) -> pa.Table:
    """Part files of any kind as one table, unreadable ones skipped and reported through ``on_skip``."""
    return _read(files, schema, list(columns) if columns is not None else None, filter, on_skip)


def read_point_requests(
    run_dir: Path | str,
    point: str,
    columns: Iterable[str],
    filter: pc.Expression | None = None,
    on_skip: Callable[[str], None] | None = None,
) -> pa.Table:
    """Selected request columns of one point (an empty table with the right schema if it has no rows)."""
    return _read(point_files(Path(run_dir), point), REQUEST_SCHEMA, list(columns), filter, on_skip)


def read_request_files(
    files: list[str], columns: Iterable[str], on_skip: Callable[[str], None] | None = None
) -> pa.Table:
    """Selected request columns of the given part files (a point's, a few at a time: see percentiles.read_itl)."""
    cols = list(columns)
    if len(files) == 1:
        # One file whose columns have the schema's types: Parquet's own reader, several times cheaper than the
        # dataset scanner on list columns (a point's ITL lists); anything else (an older file, a damaged one) goes
        # the scanner's way, which fills missing columns and reports unreadable files.
        try:
            f = pq.ParquetFile(files[0])
            schema = f.schema_arrow
            if all(
                schema.get_field_index(c) >= 0 and schema.field(c).type == REQUEST_SCHEMA.field(c).type for c in cols
            ):
                return f.read(columns=cols, use_threads=False)
        except (pa.ArrowInvalid, OSError):
            pass
    return _read(files, REQUEST_SCHEMA, cols, None, on_skip)


def read_point_server_metrics(
    run_dir: Path | str, point: str, names: Iterable[str] | None = None, on_skip: Callable[[str], None] | None = None
) -> pa.Table:
    """Server /metrics samples of one point, optionally only the given metric names."""
    flt = pc.field("name").isin(list(names)) if names is not None else None
    return _read(point_files(Path(run_dir), point, SERVER_METRICS_DIR), SERVER_METRICS_SCHEMA, None, flt, on_skip)


def read_point_gpu_metrics(
    run_dir: Path | str, point: str, columns: Iterable[str] | None = None, on_skip: Callable[[str], None] | None = None
) -> pa.Table:
    """GPU telemetry samples (gpu_metrics) of one point: an empty table where the run has none."""
    cols = list(columns) if columns is not None else None
    return _read(point_files(Path(run_dir), point, GPU_METRICS_DIR), GPU_METRICS_SCHEMA, cols, None, on_skip)


def generator_offsets(manifest: Manifest) -> dict[int, float]:
    """Clock offset (generator − driver) of each generator from the manifest, for rows that lack one."""
    return manifest.clock_offsets()
