"""Time `rig report` on a synthetic run of 10 million request records (prints figures; asserts nothing).

    .venv/bin/python benchmarks/report_scale.py [--rows 10000000] [--data DIR] [--repeat N] [--steps ...]

Every figure is a command in a process of its own (wall time, CPU time, peak RSS from its rusage), printed beside the
raw scan of the same files (the floor: decoding every column the report reads, nothing else) and the load average, so
it reads as a multiple of the floor on a machine shared with other work. ``engines`` computes the campaign's per-point
aggregates and exact percentiles with pyarrow+numpy (what rig does), DuckDB and Polars on the same files and checks
that their figures agree. ``bootstrap`` sets the m-out-of-n bootstrap against the full one.

The run has 5 steps values x 5 concurrency levels x 2 workloads (greedy at temperature 0, realistic sampled), 4
generators per point with clock offsets, realistic columns, and chunk lists (offsets and tokens per chunk) on a
sample of the rows, written in the runner's layout as rolling part files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rig.contracts import (
    ClusterInfo,
    GeneratorHost,
    GeneratorReport,
    Manifest,
    PointEntry,
    PointIdentity,
    ServerConfigEntry,
    Thresholds,
)
from rig.results import (
    REQUEST_SCHEMA,
    SERVER_METRICS_SCHEMA,
    part_name,
    requests_dir,
    server_metrics_dir,
    write_manifest,
)

STEPS = (0, 1, 2, 3, 4)
LEVELS = (1, 4, 16, 32, 64)
WORKLOADS = ("greedy", "realistic")
GENERATORS = 4
PART_ROWS = 50_000  # rows per part file (--part-rows: 100 M records are better written in fewer, larger parts)


def _chunks(rng: np.random.Generator, tokens: np.ndarray, ttft: np.ndarray, e2e: np.ndarray, accept: float):
    """Chunk offsets and token counts for each sampled request: chunks of ~accept tokens spread over decode."""
    offs, toks = [], []
    for n, t0, t1 in zip(tokens, ttft, e2e, strict=False):
        k = max(1, int(round(n / accept)))
        per = np.full(k, n // k)
        per[: n - per.sum()] += 1
        toks.append(per.astype(np.int32))
        offs.append(np.sort(rng.uniform(t0, t1, k)).tolist() if k > 1 else [float(t0)])
        offs[-1][0], offs[-1][-1] = float(t0), float(t1)
    return pa.array(offs, pa.list_(pa.float64())), pa.array(toks, pa.list_(pa.int32()))


def make_point(
    rng: np.random.Generator,
    run_dir: Path,
    point: str,
    steps: int,
    conc: int,
    workload: str,
    n: int,
    offsets: list[float],
    sample: float,
) -> tuple[float, float]:
    """Write one point's rows (split over generators and part files); returns its (start, end) on the driver clock."""
    greedy = workload == "greedy"
    accept = 1.0 + 0.8 * steps if greedy else 1.0 + 0.45 * steps
    tokens = np.full(n, 1000) if greedy else rng.integers(20, 1500, n)
    ttft = rng.gamma(2.0, 0.05 * (1 + conc / 16), n)
    tpot = 1.0 / (120 * accept / (1 + conc / 24)) * rng.lognormal(0, 0.1, n)
    e2e = ttft + tpot * (tokens - 1)
    start = 1.8e9
    # Closed loop: each of `conc` slots sends its next request when the previous one ends.
    slot = np.arange(n) % conc
    send = np.empty(n)
    for s in range(conc):
        idx = np.flatnonzero(slot == s)
        send[idx] = start + np.concatenate([[0.0], np.cumsum(e2e[idx])[:-1]])
    ok = rng.random(n) > 0.001
    gen = np.arange(n) % GENERATORS
    off = np.asarray(offsets)[gen]
    verify = np.where(steps > 0, np.ceil(tokens / accept), 0).astype(np.int64)
    hashes = np.char.add("h", (np.arange(n) * 2654435761 % 2**32).astype(str))
    ids = np.char.add(f"{workload}-", np.arange(n).astype(str))
    cols = {
        "run_id": "bench",
        "point": point,
        "engine": "sim",
        "workload": workload,
        "api": "sglang-native",
        "steps": steps,
        "server_config": f"sim-s{steps}",
        "server_args": json.dumps({"steps": steps}),
        "load_mode": "closed",
        "concurrency": conc,
        "repeat": 0,
        "category": workload,
        "finish_reason": "length" if greedy else "stop",
        "temperature": 0.0 if greedy else 0.7,
        "top_p": 1.0,
        "max_tokens": 1500,
        "ignore_eos": greedy,
    }
    arrays = {
        "generator": gen.astype(np.int32),
        "clock_offset_s": off,
        "request_id": ids,
        "session_id": ids,
        "turn": np.zeros(n, np.int32),
        "intended_send_ts": send + off,
        "send_ts": send + off,
        "first_token_ts": send + off + ttft,
        "end_ts": send + off + e2e,
        "ttft_s": ttft,
        "e2e_s": e2e,
        "slip_s": np.zeros(n),
        "e2e_from_intended_s": e2e,
        "prompt_tokens": rng.integers(50, 4000, n),
        "completion_tokens": tokens.astype(np.int64),
        "cached_tokens": np.zeros(n, np.int64),
        "status": np.where(ok, "ok", "failed"),
        "ok": ok,
        "http_status": np.where(ok, 200, 500).astype(np.int32),
        "spec_verify_ct": np.where(verify > 0, verify, 0),
        "spec_accept_length": np.where(verify > 0, tokens / np.maximum(verify, 1), np.nan),
        "output_hash": hashes,
        "output_chars": tokens * 4,
        "seed": np.arange(n, dtype=np.int64),
    }
    n_sample = int(n * sample)
    sample_idx = rng.choice(n, n_sample, replace=False) if n_sample else np.empty(0, int)
    chunk_off, chunk_tok = _chunks(rng, tokens[sample_idx], ttft[sample_idx], e2e[sample_idx], accept)
    for g in range(GENERATORS):
        gidx = np.flatnonzero(gen == g)
        # Sampled rows carry chunk lists; the rest null.
        pos = np.full(n, -1)
        pos[sample_idx] = np.arange(n_sample)
        for part, lo in enumerate(range(0, gidx.size, PART_ROWS)):
            idx = gidx[lo : lo + PART_ROWS]
            data = {}
            for f in REQUEST_SCHEMA:
                if f.name in arrays:
                    data[f.name] = pa.array(arrays[f.name][idx], f.type, from_pandas=True)
                elif f.name in cols:
                    data[f.name] = pa.array(np.full(idx.size, cols[f.name]), f.type)
                elif f.name in ("chunk_offsets_s", "chunk_tokens"):
                    src = chunk_off if f.name == "chunk_offsets_s" else chunk_tok
                    p = pos[idx]
                    take = pa.array(np.where(p >= 0, p, 0))
                    data[f.name] = pc_if_else(p >= 0, src.take(take) if n_sample else None, f.type, idx.size)
                else:
                    data[f.name] = pa.nulls(idx.size, f.type)
            out = requests_dir(run_dir, point, g)
            out.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table(data, schema=REQUEST_SCHEMA), out / part_name(part))
    end = float(np.max(send + e2e))
    # Scraped every second, but at most an hour of samples per point: the synthetic C=1 points span days of
    # simulated time, which no real point does.
    ts = np.arange(start, end, max(1.0, (end - start) / 3600))
    running = np.minimum(conc, 26 - 3 * steps) * np.ones(ts.size)
    samples = {
        "ts": np.repeat(ts, 3),
        "name": np.tile(["sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"], ts.size),
        "value": np.column_stack([running, np.maximum(0, conc - running), running / 30]).ravel(),
    }
    m = server_metrics_dir(run_dir, point)
    m.mkdir(parents=True, exist_ok=True)
    t = pa.table(
        {
            "run_id": pa.array(["bench"] * ts.size * 3),
            "point": pa.array([point] * ts.size * 3),
            "ts": samples["ts"],
            "name": samples["name"],
            "labels": pa.array(["{}"] * ts.size * 3),
            "value": samples["value"],
        },
        schema=SERVER_METRICS_SCHEMA,
    )
    pq.write_table(t, m / part_name(0))
    return start, end


def pc_if_else(mask: np.ndarray, values: pa.Array | None, typ: pa.DataType, n: int) -> pa.Array:
    """values where mask, null elsewhere."""
    if values is None or not mask.any():
        return pa.nulls(n, typ)
    return pc.if_else(pa.array(mask), values, pa.nulls(n, typ))


def make_run(run_dir: Path, rows: int, sample: float, seed: int = 0) -> None:
    """The whole synthetic run with its manifest."""
    rng = np.random.default_rng(seed)
    offsets = [0.0, 0.012, -0.4, 1.5]
    grid = [(s, c, w) for w in WORKLOADS for s in STEPS for c in LEVELS]
    per_point = rows // len(grid)
    points: list[PointEntry] = []
    configs: dict[str, ServerConfigEntry] = {}
    for s, c, w in grid:
        name = f"{w}-s{s}-c{c}-r0"
        t0, t1 = make_point(rng, run_dir, name, s, c, w, per_point, offsets, sample)
        configs[f"sim-s{s}"] = ServerConfigEntry(
            engine="sim",
            knobs={"engine": "sim", "steps": s, "tp": 4},
            server_info={"internal_states": [{"effective_max_running_requests_per_dp": 26 - 3 * s}]},
        )
        ident = PointIdentity(
            point=name,
            server_config=f"sim-s{s}",
            engine="sim",
            workload=w,
            steps=s,
            load_mode="closed",
            concurrency=c,
            rate=None,
            repeat=0,
        )
        points.append(
            PointEntry.new(ident).model_copy(
                update=dict(
                    status="complete",
                    started_ts=t0,
                    ended_ts=t1,
                    requests_scheduled=per_point,
                    generators=[GeneratorReport(generator=g, status="complete") for g in range(GENERATORS)],
                )
            )
        )
    write_manifest(
        run_dir,
        Manifest(
            run_id="bench",
            status="complete",
            thresholds=Thresholds(),
            server_configs=configs,
            points=points,
            cluster=ClusterInfo(
                generators=[GeneratorHost(generator=g, clock_offset_s=o) for g, o in enumerate(offsets)]
            ),
        ),
    )


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def ensure_run(run_dir: Path, rows: int, sample: float) -> str:
    """Generate the run into ``run_dir`` unless it already holds one of ``rows`` records (reused across runs: 10 M
    records take minutes to write, 100 M most of an hour)."""
    stamp = run_dir / ".bench-rows"
    want = f"{rows} {sample} {PART_ROWS}"
    if stamp.exists() and stamp.read_text().strip() == want:
        return "reused"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    t = time.perf_counter()
    # in a child process: this one stays small, so the children it times do not inherit its peak RSS
    subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            "generate",
            str(run_dir),
            f"{rows},{sample},{PART_ROWS}",
        ],
        check=True,
    )
    stamp.write_text(want)
    return f"generated in {time.perf_counter() - t:.0f} s"


def scale_up(src: Path, dst: Path, times: int) -> str:
    """``times`` copies of every point of run ``src`` in ``dst``, one part file per point and generator (fewer, larger
    parts): copy k's request and session ids end in ``#k`` and its timestamps move k point-lengths on, so each point
    holds ``times`` as many distinct requests over ``times`` as long. Writing 100 M records this way takes minutes
    where ``make_run`` takes hours on 2 cores."""
    from rig.results import load_manifest

    t0 = time.perf_counter()
    shutil.rmtree(dst, ignore_errors=True)
    manifest: Manifest = load_manifest(src)
    ts_cols = ("intended_send_ts", "send_ts", "first_token_ts", "end_ts")
    for entry in manifest.points:
        span = (entry.ended_ts or 0) - (entry.started_ts or 0)
        for gen_dir in sorted((src / "requests" / f"point={entry.point}").glob("gen=*")):
            table = pq.read_table(sorted(str(p) for p in gen_dir.glob("*.parquet")), schema=REQUEST_SCHEMA)
            out = dst / "requests" / f"point={entry.point}" / gen_dir.name
            out.mkdir(parents=True)
            with pq.ParquetWriter(out / part_name(0), REQUEST_SCHEMA) as w:
                for k in range(times):
                    copy = table
                    for c in ("request_id", "session_id"):
                        copy = copy.set_column(
                            copy.schema.get_field_index(c),
                            c,
                            pc.binary_join_element_wise(copy[c], pa.scalar(f"#{k}"), ""),
                        )
                    for c in ts_cols:
                        copy = copy.set_column(copy.schema.get_field_index(c), c, pc.add(copy[c], k * span))
                    w.write_table(copy, row_group_size=PART_ROWS)
        shutil.copytree(
            src / "server_metrics" / f"point={entry.point}", dst / "server_metrics" / f"point={entry.point}"
        )
        entry.ended_ts = (entry.started_ts or 0) + times * span
        entry.requests_scheduled = (entry.requests_scheduled or 0) * times
    write_manifest(dst, manifest)
    return f"{times} copies of {src} written in {time.perf_counter() - t0:.0f} s"


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


# --- what is timed, each in a process of its own (its own peak RSS) ------------------------------------------------


def floor(run_dir: str) -> None:
    """The raw scan: every request column the report reads (metrics, ITL lists, ids and hashes, statuses and errors)
    and the server metrics, decoded once from every part file with pyarrow's multi-threaded scanner and dropped."""
    import pyarrow.dataset as ds

    from rig.analysis.metrics import ITL_COLUMNS, REQUEST_COLUMNS

    cols = sorted(set(REQUEST_COLUMNS + ITL_COLUMNS + ["output_hash", "temperature", "error"]))
    for kind, schema, columns in (("requests", REQUEST_SCHEMA, cols), ("server_metrics", SERVER_METRICS_SCHEMA, None)):
        files = sorted(str(p) for p in Path(run_dir, kind).rglob("*.parquet"))
        for _ in ds.dataset(files, schema=schema, format="parquet").to_batches(columns=columns):
            pass


Q = (0.5, 0.9, 0.95, 0.99)


def engine_pyarrow(run_dir: str) -> dict:
    """Per point with pyarrow's scanner into numpy, as rig's report computes (np.percentile: exact, linear)."""
    import pyarrow.dataset as ds

    out = {}
    for d in sorted(Path(run_dir, "requests").glob("point=*")):
        files = sorted(str(p) for p in d.rglob("*.parquet"))
        t = ds.dataset(files, schema=REQUEST_SCHEMA, format="parquet").to_table(
            columns=["ok", "clock_offset_s", "send_ts", "end_ts", "ttft_s", "e2e_s", "completion_tokens"]
        )
        ok = t["ok"].to_numpy(zero_copy_only=False)
        off = t["clock_offset_s"].to_numpy()
        wall = float(np.max(t["end_ts"].to_numpy() - off) - np.min(t["send_ts"].to_numpy() - off))
        ttft, e2e = t["ttft_s"].to_numpy()[ok], t["e2e_s"].to_numpy()[ok]
        tok = t["completion_tokens"].to_numpy().astype(float)[ok]
        with np.errstate(divide="ignore", invalid="ignore"):
            tpot = np.where(tok > 1, (e2e - ttft) / (tok - 1), np.nan)
        tpot = tpot[np.isfinite(tpot)]
        out[d.name.split("=", 1)[1]] = [
            len(ok),
            int(ok.sum()),
            float(tok.sum()),
            wall,
            *(float(x) for v in (ttft, tpot, e2e) for x in np.quantile(v, Q)),
            float(ttft.mean()),
        ]
    return out


_SQL = """
SELECT point, count(*), sum(ok::INT), sum(completion_tokens) FILTER (WHERE ok),
       max(end_ts - clock_offset_s) - min(send_ts - clock_offset_s),
       quantile_cont(ttft_s, {q}) FILTER (WHERE ok),
       quantile_cont(CASE WHEN completion_tokens > 1 THEN (e2e_s - ttft_s) / (completion_tokens - 1) END, {q})
           FILTER (WHERE ok),
       quantile_cont(e2e_s, {q}) FILTER (WHERE ok), avg(ttft_s) FILTER (WHERE ok)
FROM read_parquet($files, union_by_name = true) GROUP BY point
"""


def engine_duckdb(run_dir: str) -> dict:
    """One SQL statement over every part file (DuckDB: multi-threaded, out-of-core; quantile_cont is exact)."""
    import duckdb

    files = sorted(str(p) for p in Path(run_dir, "requests").rglob("*.parquet"))
    rows = duckdb.connect().execute(_SQL.format(q=list(Q)), {"files": files}).fetchall()
    return {r[0]: [r[1], int(r[2]), float(r[3]), r[4], *r[5], *r[6], *r[7], r[8]] for r in rows}


def engine_polars(run_dir: str) -> dict:
    """One lazy query over every part file (Polars: scan_parquet, group_by, exact linear quantiles)."""
    import polars as pl

    files = sorted(str(p) for p in Path(run_dir, "requests").rglob("*.parquet"))
    ok, tok = pl.col("ok"), pl.col("completion_tokens")
    tpot = pl.when(tok > 1).then((pl.col("e2e_s") - pl.col("ttft_s")) / (tok - 1))
    aggs = [
        pl.len(),
        ok.sum(),
        tok.filter(ok).sum().cast(pl.Float64).alias("tokens"),
        (
            (pl.col("end_ts") - pl.col("clock_offset_s")).max() - (pl.col("send_ts") - pl.col("clock_offset_s")).min()
        ).alias("wall"),
    ]
    for name, e in (("ttft", pl.col("ttft_s")), ("tpot", tpot), ("e2e", pl.col("e2e_s"))):
        aggs += [e.filter(ok).quantile(q, interpolation="linear").alias(f"{name}{q}") for q in Q]
    aggs.append(pl.col("ttft_s").filter(ok).mean().alias("ttft_mean"))
    df = pl.scan_parquet(files).group_by("point").agg(aggs).collect()
    return {r[0]: list(r[1:]) for r in df.iter_rows()}


ENGINES = {"pyarrow+numpy": engine_pyarrow, "duckdb": engine_duckdb, "polars": engine_polars}


def child(step: str, run_dir: str, out: str) -> None:
    """Run one timed step in this (child) process; engines write their figures to ``out`` for the agreement check."""
    if step == "generate":
        rows, sample, part_rows = out.split(",")
        globals()["PART_ROWS"] = int(part_rows)
        make_run(Path(run_dir), int(rows), float(sample))
    elif step == "floor":
        floor(run_dir)
    elif step in ENGINES:
        Path(out).write_text(json.dumps(ENGINES[step](run_dir)))


def timed(argv: list[str], code: Path | None = None) -> tuple[float, float, float, int]:
    """(wall s, CPU s, peak RSS MiB, exit code) of a command, from its own rusage; ``code``: run that copy of rig
    (first on the path, and the working directory, which ``python -c`` puts before it)."""
    t = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(code)} if code else None
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=code)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, proc.returncode


def rig_cmd() -> list[str]:
    return [sys.executable, "-c", "from rig.cli import main; main()"]


def bootstrap_error(run_dir: Path, seeds: int = 5) -> None:
    """The m-out-of-n bootstrap against the full one, on the paired decode-speed ratio of two large points: how far
    its bounds fall from the full bootstrap's, next to how far the full one's own bounds move from seed to seed."""
    from rig.analysis import compare as cmp
    from rig.analysis import resample as rs
    from rig.analysis.runs import load_run

    run = load_run(run_dir)
    a, b = run.points[0], run.points[5]  # greedy steps 0 and 1 at concurrency 1: the same request ids
    base, cand = cmp.Side(run, a, a.point), cmp.Side(run, b, b.point)
    full, sub = [], []
    draws = rs.BOOTSTRAP_DRAWS
    for seed in range(seeds):
        rs.BOOTSTRAP_DRAWS = 10**12
        t = time.process_time()
        [f] = cmp.paired_speedups(base, cand, 500, seed, metrics=("decode_tok_s",))
        tf = time.process_time() - t
        rs.BOOTSTRAP_DRAWS = draws
        t = time.process_time()
        [s] = cmp.paired_speedups(base, cand, 500, seed, metrics=("decode_tok_s",))
        ts = time.process_time() - t
        full.append((f["ci_low"], f["ci_high"], tf))
        sub.append((s["ci_low"], s["ci_high"], ts))
    fa, sa = np.array(full), np.array(sub)
    width = float(np.mean(fa[:, 1] - fa[:, 0]))
    between = float(np.max(np.abs(fa[:, :2] - sa[:, :2]))) / width
    seed_to_seed = float(np.max(np.ptp(fa[:, :2], axis=0))) / width
    print(
        f"bootstrap ({f['pairs']:,} pairs, 500 resamples, {seeds} seeds): full {np.mean(fa[:, 2]):.2f} s CPU, "
        f"{draws:,} draws {np.mean(sa[:, 2]):.2f} s CPU; bounds differ by at most {between:.1%} of the interval "
        f"width (full bootstrap seed to seed: {seed_to_seed:.1%})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--chunk-sample", type=float, default=0.01, help="fraction of rows with chunk lists")
    ap.add_argument(
        "--data",
        type=Path,
        help="the run directory: generated there once, reused while it matches "
        "--rows (default: a temporary directory, removed)",
    )
    ap.add_argument("--part-rows", type=int, default=PART_ROWS, help="rows per part file")
    ap.add_argument("--repeat", type=int, default=1, help="time each step this many times (the best is printed)")
    ap.add_argument(
        "--steps",
        default="floor,engines,json,terminal,html,all",
        help="comma list of: floor, engines, json, terminal, html, all, startup, bootstrap (and "
        "baseline-terminal, baseline-html with --baseline-code)",
    )
    ap.add_argument(
        "--scale-up",
        type=int,
        metavar="TIMES",
        help="make --data from TIMES copies of the --rows/TIMES run (generated or reused next to it)",
    )
    ap.add_argument(
        "--baseline-code",
        type=Path,
        metavar="DIR",
        help="a copy of another version's rig package (e.g. git archive REV rig | tar -x -C DIR): the "
        "steps named baseline-terminal and baseline-html run it on the same files",
    )
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    if args.scale_up:
        if args.data is None:
            ap.error("--scale-up needs --data")
        small = args.data.with_name(args.data.name + f"-base{args.rows // args.scale_up}")
        ensure_run(small, args.rows // args.scale_up, args.chunk_sample)
        stamp = args.data / ".bench-rows"
        want = f"{args.rows} {args.chunk_sample} scaled {args.scale_up}"
        if not (stamp.exists() and stamp.read_text().strip() == want):
            print(scale_up(small, args.data, args.scale_up))
            stamp.write_text(want)
    globals()["PART_ROWS"] = args.part_rows
    steps = args.steps.split(",")
    tmp = None
    run_dir = args.data
    if run_dir is None:
        tmp = tempfile.mkdtemp(prefix="rig-report-scale-")
        run_dir = Path(tmp) / "bench"
    try:
        how = "scaled up" if args.scale_up else ensure_run(run_dir, args.rows, args.chunk_sample)
        files = len(list(run_dir.rglob("*.parquet")))
        print(
            f"records: {args.rows:,} in {files} part files, {du(run_dir) / 2**30:,.2f} GiB on disk (chunk lists on "
            f"{args.chunk_sample:.1%}); {how}; {os.cpu_count()} CPUs; {load()}"
        )
        out = Path(tempfile.mkdtemp(prefix="rig-report-out-"))
        me = [sys.executable, str(Path(__file__).resolve())]
        slo = ["--slo", "ttft=500ms", "--slo", "tpot=50ms"]
        commands = {
            "floor": ("raw scan of the same files (the floor)", me + ["--child", "floor", str(run_dir), "-"]),
            "startup": ("rig --help (interpreter and imports)", rig_cmd() + ["--help"]),
            "json": ("rig report --json (campaign table)", rig_cmd() + ["report", str(run_dir), "--json"]),
            "terminal": ("rig report (terminal, every section, SLOs)", rig_cmd() + ["report", str(run_dir), *slo]),
            "html": (
                "rig report --html (with its plots), SLOs",
                rig_cmd() + ["report", str(run_dir), *slo, "--html", str(out / "r.html")],
            ),
            "all": (
                "rig report --csv --plots --html, SLOs",
                rig_cmd()
                + [
                    "report",
                    str(run_dir),
                    *slo,
                    "--csv",
                    str(out / "csv"),
                    "--plots",
                    str(out / "plots"),
                    "--html",
                    str(out / "r2.html"),
                ],
            ),
        }
        if args.baseline_code:
            for name in ("terminal", "html"):
                label, argv = commands[name]
                commands[f"baseline-{name}"] = (f"  the same with {args.baseline_code}", argv)
        base = None
        for step in steps:
            if step == "engines":
                figures = {}
                for name in ENGINES:
                    best = min(
                        (
                            timed(me + ["--child", name, str(run_dir), str(out / f"{name}.json")])
                            for _ in range(args.repeat)
                        ),
                        key=lambda x: x[0],
                    )
                    figures[name] = json.loads((out / f"{name}.json").read_text())
                    ratio = f"{best[0] / base:4.1f}x floor" if base else ""
                    print(
                        f"  engine {name:<14} per-point aggregates + exact percentiles  {best[0]:6.2f} s  "
                        f"CPU {best[1]:6.2f} s  peak RSS {best[2]:6,.0f} MiB  {ratio}  ({load()})"
                    )
                ref = figures["pyarrow+numpy"]
                for name, got in figures.items():
                    worst = max(
                        abs(x - y) / max(abs(x), 1e-300) for p in ref for x, y in zip(ref[p], got[p], strict=False)
                    )
                    print(f"  {name}: figures agree with numpy's to a relative {worst:.1e}")
                continue
            if step == "bootstrap":
                bootstrap_error(run_dir)
                continue
            label, argv = commands[step]
            code = args.baseline_code.resolve() if step.startswith("baseline-") else None
            runs = [timed(argv, code) for _ in range(args.repeat)]
            wall, cpu, rss, rc = min(runs, key=lambda x: x[0])
            if step == "floor":
                base = wall
            ratio = f"{wall / base:4.1f}x floor" if base and step != "floor" else ""
            print(
                f"  {label:<46} {wall:6.2f} s  CPU {cpu:6.2f} s  peak RSS {rss:6,.0f} MiB  {ratio}  "
                f"{'exit ' + str(rc) if rc else ''}({load()})",
                flush=True,
            )
        shutil.rmtree(out, ignore_errors=True)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
