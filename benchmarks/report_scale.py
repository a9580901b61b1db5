"""Time `rig report` on a synthetic run of 10 million request records (prints figures; asserts nothing).

    .venv/bin/python benchmarks/report_scale.py [--rows 10000000] [--keep DIR]

The run has 5 steps values x 5 concurrency levels x 2 workloads (greedy at temperature 0, realistic sampled), 4
generators per point with clock offsets, realistic columns, and chunk lists (offsets and tokens per chunk) on a
sample of the rows, written in the runner's layout as rolling part files.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rig.contracts import (ClusterInfo, GeneratorHost, GeneratorReport, Manifest, PointEntry, PointIdentity,
                           ServerConfigEntry, Thresholds)
from rig.results import (REQUEST_SCHEMA, SERVER_METRICS_SCHEMA, part_name, requests_dir, server_metrics_dir,
                         write_manifest)

STEPS = (0, 1, 2, 3, 4)
LEVELS = (1, 4, 16, 32, 64)
WORKLOADS = ("greedy", "realistic")
GENERATORS = 4
PART_ROWS = 50_000  # rows per part file (--part-rows: 100 M records are better written in fewer, larger parts)


def _chunks(rng: np.random.Generator, tokens: np.ndarray, ttft: np.ndarray, e2e: np.ndarray, accept: float):
    """Chunk offsets and token counts for each sampled request: chunks of ~accept tokens spread over decode."""
    offs, toks = [], []
    for n, t0, t1 in zip(tokens, ttft, e2e):
        k = max(1, int(round(n / accept)))
        per = np.full(k, n // k)
        per[: n - per.sum()] += 1
        toks.append(per.astype(np.int32))
        offs.append(np.sort(rng.uniform(t0, t1, k)).tolist() if k > 1 else [float(t0)])
        offs[-1][0], offs[-1][-1] = float(t0), float(t1)
    return pa.array(offs, pa.list_(pa.float64())), pa.array(toks, pa.list_(pa.int32()))


def make_point(rng: np.random.Generator, run_dir: Path, point: str, steps: int, conc: int, workload: str, n: int,
               offsets: list[float], sample: float) -> tuple[float, float]:
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
        "run_id": "bench", "point": point, "engine": "sim", "workload": workload, "api": "sglang-native",
        "steps": steps, "server_config": f"sim-s{steps}", "server_args": json.dumps({"steps": steps}),
        "load_mode": "closed", "concurrency": conc, "repeat": 0, "category": workload,
        "finish_reason": "length" if greedy else "stop", "temperature": 0.0 if greedy else 0.7, "top_p": 1.0,
        "max_tokens": 1500, "ignore_eos": greedy,
    }
    arrays = {
        "generator": gen.astype(np.int32), "clock_offset_s": off, "request_id": ids, "session_id": ids,
        "turn": np.zeros(n, np.int32), "intended_send_ts": send + off, "send_ts": send + off,
        "first_token_ts": send + off + ttft, "end_ts": send + off + e2e, "ttft_s": ttft, "e2e_s": e2e,
        "slip_s": np.zeros(n), "e2e_from_intended_s": e2e, "prompt_tokens": rng.integers(50, 4000, n),
        "completion_tokens": tokens.astype(np.int64), "cached_tokens": np.zeros(n, np.int64),
        "status": np.where(ok, "ok", "failed"), "ok": ok, "http_status": np.where(ok, 200, 500).astype(np.int32),
        "spec_verify_ct": np.where(verify > 0, verify, 0),
        "spec_accept_length": np.where(verify > 0, tokens / np.maximum(verify, 1), np.nan),
        "output_hash": hashes, "output_chars": tokens * 4, "seed": np.arange(n, dtype=np.int64),
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
            idx = gidx[lo: lo + PART_ROWS]
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
    t = pa.table({"run_id": pa.array(["bench"] * ts.size * 3), "point": pa.array([point] * ts.size * 3),
                  "ts": samples["ts"], "name": samples["name"], "labels": pa.array(["{}"] * ts.size * 3),
                  "value": samples["value"]}, schema=SERVER_METRICS_SCHEMA)
    pq.write_table(t, m / part_name(0))
    return start, end


def pc_if_else(mask: np.ndarray, values: pa.Array | None, typ: pa.DataType, n: int) -> pa.Array:
    """values where mask, null elsewhere."""
    import pyarrow.compute as pc

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
            engine="sim", knobs={"engine": "sim", "steps": s, "tp": 4},
            server_info={"internal_states": [{"effective_max_running_requests_per_dp": 26 - 3 * s}]})
        ident = PointIdentity(point=name, server_config=f"sim-s{s}", engine="sim", workload=w, steps=s,
                              load_mode="closed", concurrency=c, rate=None, repeat=0)
        points.append(PointEntry.new(ident).model_copy(update=dict(
            status="complete", started_ts=t0, ended_ts=t1, requests_scheduled=per_point,
            generators=[GeneratorReport(generator=g, status="complete") for g in range(GENERATORS)])))
    write_manifest(run_dir, Manifest(run_id="bench", status="complete", thresholds=Thresholds(), server_configs=configs,
                                     points=points, cluster=ClusterInfo(generators=[
                                         GeneratorHost(generator=g, clock_offset_s=o) for g, o in enumerate(offsets)])))


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--chunk-sample", type=float, default=0.01, help="fraction of rows with chunk lists")
    ap.add_argument("--keep", type=Path, help="write the run here and keep it")
    args = ap.parse_args()
    from click.testing import CliRunner

    from rig.analysis.cli import report
    from rig.analysis.report import build_report, to_json
    from rig.analysis.tables import campaign_table

    tmp = None
    if args.keep:
        run_dir = args.keep
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.mkdtemp(prefix="rig-report-scale-")
        run_dir = Path(tmp) / "bench"
    try:
        t = time.perf_counter()
        make_run(run_dir, args.rows, args.chunk_sample)
        gen_s = time.perf_counter() - t
        files = len(list(run_dir.rglob("*.parquet")))
        print(f"records: {args.rows:,} in {files} part files, {du(run_dir) / 2**20:,.0f} MiB on disk "
              f"(chunk lists on {args.chunk_sample:.1%}); generated in {gen_s:.1f} s")
        timings = {}
        t = time.perf_counter()
        rows = campaign_table(run_dir)
        timings["campaign_table() (what `rig run` prints)"] = time.perf_counter() - t
        t = time.perf_counter()
        r = CliRunner().invoke(report, [str(run_dir), "--json"])
        timings["rig report --json"] = time.perf_counter() - t
        assert r.exit_code == 0, r.output
        t = time.perf_counter()
        rep = build_report(run_dir, [])
        timings["build_report() (every section, incl. ITL + losslessness)"] = time.perf_counter() - t
        t = time.perf_counter()
        r = CliRunner().invoke(report, [str(run_dir), "--slo", "ttft=500ms", "--slo", "tpot=50ms"])
        timings["rig report (terminal, with SLOs)"] = time.perf_counter() - t
        assert r.exit_code == 0, r.output
        t = time.perf_counter()
        out = Path(tempfile.mkdtemp(prefix="rig-report-out-"))
        r = CliRunner().invoke(report, [str(run_dir), "--csv", str(out / "csv"), "--plots", str(out / "plots"),
                                        "--html", str(out / "r.html")])
        timings["rig report --csv --plots --html"] = time.perf_counter() - t
        assert r.exit_code == 0, r.output
        shutil.rmtree(out, ignore_errors=True)
        for k, v in timings.items():
            print(f"{k:<58} {v:7.2f} s   ({args.rows / v / 1e6:5.1f} M records/s)")
        print(f"points: {len(rows)}; lossless groups checked: {rep.lossless['groups_checked']}, "
              f"requests compared: {rep.lossless['requests_checked']:,}; JSON size {len(to_json(rows)):,} B")
        print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:,.0f} MiB")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
