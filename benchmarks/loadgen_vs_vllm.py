"""rig's generator beside vLLM's `bench serve`, against the same truth server, in one invocation (prints only).

    RIG_CACHE=~/.cache/rig .venv/bin/python benchmarks/loadgen_vs_vllm.py [--repeats 3] [--only a,b,c,d]

The anchor is vLLM's `bench serve` from the vLLM CPU venv ($RIG_CACHE/vllm-venv, scripts/vllm-env.sh), with
`--backend openai` on /v1/completions, the random dataset and the tiny model's tokenizer ($RIG_CACHE/tiny-model).
rig's side is benchmarks/rig_generator.py: the real PointRun (lean client, records, Parquet parts) in a process.
The truth server (benchmarks/truth_server.py) records when it wrote every token; it is the clock both are held to.

(a) streamed tok/s, 64 streams, 1 token per event, measured where the client is the bottleneck: the truth server
    unpaced with --burst k tokens per write (default 32; still one SSE event and one HTTP chunk per token), so it
    spends a fraction of a client's CPU per event. Client pinned to CPU 0 and server to CPU 1 (taskset), then
    unpinned. tok/s = tokens written by the server / (first request arrival at the server to the later of its last
    write and the client's last read); client and server CPU seconds in that window (psutil samples), each as a
    share of one core, and whether the client was saturated (>= 90 % of a core); events/s per client core and
    client CPU s per 1,000 events.
(b) open loop, Poisson, 16-token requests at each --rates: rate kept (rig's own rate_ratio: scheduled span over
    first intended to last actual send; and, measured as for vLLM, sends over the span of actual sends) and rig's p99
    schedule slip (vLLM records no intended send time, so only its rate kept is shown) and rig's saturation flags.
(c) one token every 10 ms per stream, 64 and 256 streams: for every token, the client's gap to the previous token
    minus the server's gap between writing them (requests matched exactly: the first token's text names the
    request); p99 of |error|.
(d) rig only: 1 vs 2 generator processes (the per_host model), 64 streams in total, against the same cheap
    (burst) server, unpinned and with generator process i pinned to CPU i (server unpinned); growth = tok/s ratio.

Every figure is repeated --repeats times, rig and vLLM alternating; medians and ratios are printed. The machine
is shared: only the ratios within one invocation mean much.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow.dataset as ds

sys.path.insert(0, str(Path(__file__).resolve().parent))
from truth_server import TruthServer  # noqa: E402

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("RIG_CACHE") or HERE.parent / ".cache").expanduser()
VLLM_PY = CACHE / "vllm-venv" / "bin" / "python"
TOKENIZER = CACHE / "tiny-model"
VLLM_MAIN = (
    "import sys\nfrom vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


class CpuSampler:
    """CPU seconds of process trees over time, so a window's CPU can be read off (start-up excluded).

    Besides the CPU of each whole tree it reads the kernel's schedstat of each process's main thread (the event
    loop): seconds on a CPU and seconds runnable but waiting for one. On shared cores a client can be the
    bottleneck without using its whole core: it is whenever its loop is either running or waiting to run."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.procs = [psutil.Process(p) for p in pids]
        self.tree: list[psutil.Process] = list(self.procs)
        self.samples: list[tuple[float, float, float, float]] = []  # (perf_counter, tree CPU, loop run, loop wait)
        self._cpu: dict[int, float] = {}  # last CPU seconds read per process of the trees
        self._sched: dict[int, tuple[float, float]] = {}  # last (on a CPU, waiting for one) per main thread
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _refresh_tree(self) -> None:
        tree = []
        for p in self.procs:
            with contextlib.suppress(psutil.Error):
                tree += [p, *p.children(recursive=True)]
        self.tree = tree

    def _read(self) -> tuple[float, float, float]:
        # A process that has exited keeps its last reading: with two generators one ends first, and dropping its
        # seconds would make the window's CPU come out short.
        for q in self.tree:
            try:
                c = q.cpu_times()
                self._cpu[q.pid] = c.user + c.system
            except psutil.Error:
                pass
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
                    on_cpu_ns, waiting_ns, _ = f.read().split()
                self._sched[pid] = (int(on_cpu_ns) / 1e9, int(waiting_ns) / 1e9)
            except (OSError, ValueError):
                pass
        sched = self._sched.values()
        return sum(self._cpu.values()), sum(x[0] for x in sched), sum(x[1] for x in sched)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            if n % 25 == 0:  # children are few and long-lived: walking /proc for them every sample costs CPU
                self._refresh_tree()
            n += 1
            self.samples.append((time.perf_counter(), *self._read()))
            self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._t.join()

    def between(self, t0: float, t1: float, what: int = 1) -> float:
        """Seconds used between two perf_counter times (linear between samples): what = 1 CPU of the trees, 2 the
        main threads on a CPU, 3 the main threads waiting for a CPU."""
        t = np.array([s[0] for s in self.samples])
        c = np.array([s[what] for s in self.samples])
        return float(np.interp(t1, t, c) - np.interp(t0, t, c))


def taskset(cpus: str | None) -> list[str]:
    return ["taskset", "-c", cpus] if cpus else []


def run_rig(url: str, out: Path, cpus: str | list[str | None] | None, procs: int = 1, **kw) -> dict:
    """One level with `procs` rig generator processes sharing the load; their summaries and records.

    `cpus`: one taskset CPU list for every process, or one per process."""
    per_proc = cpus if isinstance(cpus, list) else [cpus] * procs
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter() + 2.0  # all processes start at this common moment (imports take ~1 s)
    args = []
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    ps = [
        subprocess.Popen(
            [
                *taskset(per_proc[i]),
                sys.executable,
                str(HERE / "rig_generator.py"),
                "--url",
                url,
                "--out",
                str(out),
                "--index",
                str(i),
                "--of",
                str(procs),
                "--start-at",
                str(start),
                *args,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(procs)
    ]
    sampler = CpuSampler([p.pid for p in ps])
    outs = [p.communicate()[0] for p in ps]
    sampler.stop()
    sums = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    recs = (
        ds.dataset(str(out), format="parquet")
        .to_table(columns=["ok", "chunk_offsets_s", "output_hash", "completion_tokens", "status", "error", "send_ts"])
        .to_pylist()
    )
    return {"summaries": sums, "records": recs, "sampler": sampler}


def run_vllm(
    url: str,
    out: Path,
    cpus: str | None,
    *,
    concurrency: int | None,
    requests: int,
    max_tokens: int,
    rate: float | None = None,
) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        *taskset(cpus),
        str(VLLM_PY),
        "-c",
        VLLM_MAIN,
        "--backend",
        "openai",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        "truth",
        "--tokenizer",
        str(TOKENIZER),
        "--dataset-name",
        "random",
        "--random-input-len",
        "16",
        "--random-output-len",
        str(max_tokens),
        "--num-prompts",
        str(requests),
        "--ignore-eos",
        "--num-warmups",
        "0",
        "--ready-check-timeout-sec",
        "0",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(out),
        "--result-filename",
        "r.json",
        "--seed",
        "1",
    ]
    if concurrency:
        cmd += ["--max-concurrency", str(concurrency)]
    if rate:
        cmd += ["--request-rate", str(rate)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = CpuSampler([p.pid])
    log = p.communicate()[0]
    sampler.stop()
    f = out / "r.json"
    if p.returncode != 0 or not f.exists():
        raise RuntimeError(f"vllm bench serve failed ({p.returncode}):\n{log[-2000:]}")
    return {"result": json.loads(f.read_text()), "sampler": sampler}


def server_window(truth: dict) -> tuple[float, float]:
    return float(truth["arrivals"].min()), float(max(w[-1] for w in truth["writes"] if len(w)))


def runs(rows: list, key: str | None, fmt: str) -> str:
    return ", ".join(format(x if key is None else x[key], fmt) for x in rows)


def med(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else float("nan")


# ---------------------------------------------------------------- (a) and (d) throughput

SATURATED_PCT = 90  # a client whose event loop runs or waits to run this share of the time is the bottleneck


def throughput(
    tool: str,
    srv: TruthServer,
    tmp: Path,
    cpus: str | list[str | None] | None,
    requests: int,
    max_tokens: int,
    procs: int = 1,
) -> dict:
    server_cpu = CpuSampler([p.pid for p in srv.procs])
    if tool == "rig":
        r = run_rig(
            srv.url, tmp / "rig", cpus, procs, mode="closed", concurrency=64, requests=requests, max_tokens=max_tokens
        )
        ok = sum(1 for x in r["records"] if x["ok"])
        last_read = max(x["ended_mono"] for x in r["summaries"])  # after the last response's last byte
        lost = sum(x["scheduled"] for x in r["summaries"]) - len(r["records"])  # requests sent but not on disk
    else:
        r = run_vllm(srv.url, tmp / "vllm", cpus, concurrency=64, requests=requests, max_tokens=max_tokens)
        res = r["result"]
        ok = res["completed"]
        lost = 0
        # vLLM's start_times and latencies are perf_counter values and spans: the same clock as the server's.
        last_read = max(s + d for s, d in zip(res["start_times"], res["latencies"], strict=False) if d)
    server_cpu.stop()
    truth = srv.collect()
    t0, t1 = server_window(truth)
    # With bursts the server can be ahead of the client by what the socket buffers hold: the window ends at the
    # later of its last write and the client's last read, so tok/s is what the client actually streamed.
    t1 = max(t1, last_read)
    cpu = r["sampler"].between(t0, t1)
    events = truth["tokens"]
    span = t1 - t0
    busy = r["sampler"].between(t0, t1, 2) + r["sampler"].between(t0, t1, 3)  # the loop ran or waited to run
    return {
        "tok_s": events / span,
        "cpu_s": cpu,
        "events_per_core_s": events / cpu if cpu > 0 else float("nan"),
        "cpu_per_1k": 1e3 * cpu / events,
        "ok": ok,
        "server_cpu_pct": 100 * server_cpu.between(t0, t1) / span,
        "client_cpu_pct": 100 * cpu / span,
        "span_s": span,
        "events": events,
        "loop_busy_pct": 100 * busy / span,
        "loop_wait_pct": 100 * r["sampler"].between(t0, t1, 3) / span,
        "lost": lost,
    }


def verdict(x: dict, procs: int = 1) -> str:
    """Which side set the pace of one run: a client whose event loop was running or waiting for a CPU nearly all
    the window was the bottleneck (on a shared core it may hold only part of it)."""
    busy = x["loop_busy_pct"] / procs
    v = (
        f"client {'SATURATED' if busy >= SATURATED_PCT else 'not saturated'} (its loop ran or waited to run "
        f"{busy:.0f} % of the window, {x['loop_wait_pct'] / procs:.0f} % waiting for a CPU)"
    )
    if x["server_cpu_pct"] >= SATURATED_PCT:
        v += "; server saturated"
    return v + (f"; {x['lost']} RECORDS LOST (sent, not in the part files)" if x["lost"] else "")


def loadavg() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def print_runs(tool: str, rr: list[dict], procs: int = 1) -> None:
    print(
        f"    {tool:5} tok/s {med([x['tok_s'] for x in rr]):>9.0f}  events/s per client core "
        f"{med([x['events_per_core_s'] for x in rr]):>9.0f}  client CPU s per 1k events "
        f"{med([x['cpu_per_1k'] for x in rr]):.4f}"
    )
    for i, x in enumerate(rr):
        print(
            f"      run {i + 1}: tok/s {x['tok_s']:.0f} over {x['span_s']:.2f} s; client CPU "
            f"{x['client_cpu_pct']:.0f} %, server CPU {x['server_cpu_pct']:.0f} % of a core; {verdict(x, procs)}; "
            f"ok {x['ok']}"
        )


def figure_a(args, tmp: Path) -> None:
    print(
        f"(a) streamed tok/s, 64 streams, 1 token per event, {args.requests} requests x {args.max_tokens} tokens; "
        f"truth server unpaced, {args.burst} tokens per write"
    )
    for pinned in (True, False):
        cpus_c, cpus_s = ("0", "1") if pinned else (None, None)
        srv = TruthServer(tmp / "truth-a", itl_ms=0, workers=1, cpus=cpus_s, burst=args.burst)
        rows: dict[str, list[dict]] = {"rig": [], "vllm": []}
        try:
            for rep in range(args.repeats):
                for tool in ("rig", "vllm") if rep % 2 == 0 else ("vllm", "rig"):
                    rows[tool].append(throughput(tool, srv, tmp, cpus_c, args.requests, args.max_tokens))
        finally:
            srv.stop()
        label = "pinned (client CPU 0, server CPU 1)" if pinned else "unpinned"
        print(f"  {label}:")
        for tool in ("rig", "vllm"):
            print_runs(tool, rows[tool])
        ratios = [a["tok_s"] / b["tok_s"] for a, b in zip(rows["rig"], rows["vllm"], strict=False)]
        eff = [b["cpu_per_1k"] / a["cpu_per_1k"] for a, b in zip(rows["rig"], rows["vllm"], strict=False)]
        print(
            f"    rig / vLLM: tok/s x{med(ratios):.2f} (runs {runs(ratios, None, '.2f')}); "
            f"events per client CPU second x{med(eff):.2f} (runs {runs(eff, None, '.2f')})"
        )


def figure_d(args, tmp: Path) -> None:
    print(
        f"(d) rig only: 1 vs 2 generator processes, 64 streams in total, {args.requests} requests x "
        f"{args.max_tokens} tokens; truth server unpaced, {args.burst} tokens per write, 1 process, unpinned"
    )
    srv = TruthServer(tmp / "truth-d", itl_ms=0, workers=1, burst=args.burst)
    try:
        for pinned in (False, True):
            res: dict[int, list[dict]] = {1: [], 2: []}
            for rep in range(args.repeats):
                for procs in (1, 2) if rep % 2 == 0 else (2, 1):
                    cpus = [str(i) for i in range(procs)] if pinned else None
                    res[procs].append(throughput("rig", srv, tmp, cpus, args.requests, args.max_tokens, procs))
            print("  generator process i pinned to CPU i:" if pinned else "  unpinned:")
            for procs in (1, 2):
                print_runs(f"{procs}p", res[procs], procs)
            g = [b["tok_s"] / a["tok_s"] for a, b in zip(res[1], res[2], strict=False)]
            print(f"    2 / 1 processes: tok/s x{med(g):.2f} (runs {runs(g, None, '.2f')})")
    finally:
        srv.stop()


# ---------------------------------------------------------------- (b) open loop


def figure_b(args, tmp: Path) -> None:
    rates = [float(r) for r in args.rates.split(",")]
    print(
        f"(b) open loop, Poisson, 16-token requests, {args.level_s:g} s per level, client CPU 0, server CPU 1 (unpaced)"
    )
    srv = TruthServer(tmp / "truth-b", itl_ms=0, workers=1, cpus="1")
    try:
        for rate in rates:
            n = int(rate * args.level_s)
            rig_rows, v_rows = [], []
            for rep in range(args.repeats):
                for tool in ("rig", "vllm") if rep % 2 == 0 else ("vllm", "rig"):
                    if tool == "rig":
                        r = run_rig(
                            srv.url,
                            tmp / "rig",
                            "0",
                            1,
                            mode="poisson",
                            rate=rate,
                            requests=n,
                            max_tokens=16,
                            seed=rep + 1,
                        )
                        s = r["summaries"][0]
                        flags = []
                        if s["slip_p99_s"] > 0.010:
                            flags.append(f"schedule_slip (p99 {s['slip_p99_s'] * 1e3:.1f} ms > 10 ms)")
                        if (s["rate_ratio"] or 1) < 0.99:
                            flags.append(f"rate_shortfall (ratio {s['rate_ratio']:.3f} < 0.99)")
                        if (s.get("loop_lag_p99_ms") or 0) > 50:
                            flags.append(f"loop lag p99 {s['loop_lag_p99_ms']:.0f} ms")
                        ok = s["records"]["ok"]
                        st = np.sort(np.asarray([x["send_ts"] for x in r["records"]]))
                        rig_rows.append(
                            {
                                "span_kept": (len(st) - 1) / (st[-1] - st[0]) / rate,
                                "kept": s["rate_ratio"],
                                "slip_p99_ms": s["slip_p99_s"] * 1e3,
                                "ok": ok,
                                "flags": flags,
                                "cpu_ms": 1e3 * s["cpu_s"] / max(1, n),
                                "cpu_pct": 100 * s["cpu_s"] / max(1e-9, s["window_s"]),
                                "slip_p50_ms": s["slip_p50_s"] * 1e3,
                                # the loop runnable but not on its core: what a late wake-up waits for
                                "wait_pct": 100
                                * r["sampler"].between(s["started_mono"], s["ended_mono"], 3)
                                / max(1e-9, s["ended_mono"] - s["started_mono"]),
                            }
                        )
                    else:
                        r = run_vllm(srv.url, tmp / "vllm", "0", concurrency=None, requests=n, max_tokens=16, rate=rate)
                        st = np.sort(np.asarray(r["result"]["start_times"]))
                        v_rows.append({"kept": (len(st) - 1) / (st[-1] - st[0]) / rate, "ok": r["result"]["completed"]})
                    srv.collect()
            print(
                f"  {rate:g}/s ({n} requests): rig rate kept {med([x['kept'] for x in rig_rows]):.3f} "
                f"(runs {runs(rig_rows, 'kept', '.3f')}), p99 slip "
                f"{med([x['slip_p99_ms'] for x in rig_rows]):.2f} ms (runs "
                f"{runs(rig_rows, 'slip_p99_ms', '.2f')}), ok {[x['ok'] for x in rig_rows]}; "
                f"vLLM rate kept {med([x['kept'] for x in v_rows]):.3f} (runs "
                f"{runs(v_rows, 'kept', '.3f')}), ok {[x['ok'] for x in v_rows]}"
            )
            print(
                f"      rig rate kept measured as for vLLM (sends / span of actual sends / target): "
                f"{med([x['span_kept'] for x in rig_rows]):.3f} (runs {runs(rig_rows, 'span_kept', '.3f')})"
            )
            print(
                f"      rig client CPU per request {med([x['cpu_ms'] for x in rig_rows]):.3f} ms, "
                f"CPU% of its core {runs(rig_rows, 'cpu_pct', '.0f')}; p50 slip "
                f"{runs(rig_rows, 'slip_p50_ms', '.3f')} ms; its loop waited for its core "
                f"{runs(rig_rows, 'wait_pct', '.1f')} % of the level"
            )
            for x in rig_rows:
                if x["flags"]:
                    print(f"      rig flagged client_saturated: {'; '.join(x['flags'])}")
    finally:
        srv.stop()


# ---------------------------------------------------------------- (c) ITL against the server's clock


def itl_errors_rig(records: list[dict], truth: dict) -> tuple[np.ndarray, int]:
    errs, unmatched = [], 0
    for rec in records:
        w = truth["by_hash"].get(rec["output_hash"])
        offs = np.asarray(rec["chunk_offsets_s"])
        if w is None or len(w) != len(offs):
            unmatched += 1
            continue
        errs.append(np.diff(offs) - np.diff(w))
    return (np.abs(np.concatenate(errs)) if errs else np.zeros(0)), unmatched


def tokens_sharing_a_read(records: list[dict]) -> int:
    """Tokens that came in the same read as the one before (client gap exactly 0): one arrival stamp for both."""
    return int(sum((np.diff(np.asarray(rec["chunk_offsets_s"])) == 0).sum() for rec in records))


def itl_errors_vllm(result: dict, truth: dict) -> tuple[np.ndarray, int]:
    errs, unmatched = [], 0
    for text, itl in zip(result["generated_texts"], result["itls"], strict=False):
        m = re.search(r"#(\S+)", text or "")
        w = truth["by_tag"].get(m.group(1)) if m else None
        if w is None or len(w) != len(itl) + 1:
            unmatched += 1
            continue
        errs.append(np.asarray(itl) - np.diff(w))
    return (np.abs(np.concatenate(errs)) if errs else np.zeros(0)), unmatched


def figure_c(args, tmp: Path) -> None:
    print(
        f"(c) inter-token gap error vs the server's write times, one token every 10 ms per stream, "
        f"{args.itl_tokens} tokens per request, client CPU 0, server CPU 1"
    )
    srv = TruthServer(tmp / "truth-c", itl_ms=10, workers=1, cpus="1")
    try:
        for streams in (64, 256):
            rows: dict[str, list[dict]] = {"rig": [], "vllm": []}
            for rep in range(args.repeats):
                for tool in ("rig", "vllm") if rep % 2 == 0 else ("vllm", "rig"):
                    n = 2 * streams
                    if tool == "rig":
                        r = run_rig(
                            srv.url,
                            tmp / "rig",
                            "0",
                            1,
                            mode="closed",
                            concurrency=streams,
                            requests=n,
                            max_tokens=args.itl_tokens,
                        )
                        truth = srv.collect()
                        e, un = itl_errors_rig(r["records"], truth)
                        shared = tokens_sharing_a_read(r["records"])
                        unstamped = sum(x.get("unstamped_reads") or 0 for x in r["summaries"])
                    else:
                        r = run_vllm(
                            srv.url, tmp / "vllm", "0", concurrency=streams, requests=n, max_tokens=args.itl_tokens
                        )
                        truth = srv.collect()
                        e, un = itl_errors_vllm(r["result"], truth)
                    sg = truth["gaps_s"]
                    rows[tool].append(
                        {
                            "p99": np.percentile(e, 99) * 1e3 if len(e) else float("nan"),
                            "p50": np.percentile(e, 50) * 1e3 if len(e) else float("nan"),
                            "unmatched": un,
                            "tokens": len(e),
                            "shared": shared if tool == "rig" else None,
                            "unstamped": unstamped if tool == "rig" else None,
                            "server_gap_p99": np.percentile(sg, 99) * 1e3 if len(sg) else float("nan"),
                        }
                    )
            for tool in ("rig", "vllm"):
                rr = rows[tool]
                print(
                    f"  {streams} streams, {tool:5}: |client gap - server gap| p99 "
                    f"{med([x['p99'] for x in rr]):.2f} ms (runs {runs(rr, 'p99', '.2f')}), "
                    f"p50 {med([x['p50'] for x in rr]):.3f} ms; {rr[0]['tokens']} gaps matched, "
                    f"{sum(x['unmatched'] for x in rr)} requests unmatched; server's own gap p99 "
                    f"{med([x['server_gap_p99'] for x in rr]):.2f} ms"
                )
                if tool == "rig":  # what is left of rig's error: a read late by more than one token interval
                    print(
                        f"      tokens that shared a read with the one before (one kernel stamp for both): runs "
                        f"{runs(rr, 'shared', 'd')}; reads without a kernel stamp: runs {runs(rr, 'unstamped', 'd')}"
                    )
            d = [a["p99"] - b["p99"] for a, b in zip(rows["rig"], rows["vllm"], strict=False)]
            print(f"  {streams} streams: rig - vLLM error p99 {med(d):+.2f} ms")
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="a,b,c,d")
    ap.add_argument("--requests", type=int, default=5120, help="(a, d) requests per run")
    ap.add_argument("--max-tokens", type=int, default=256, help="(a, d) tokens per request")
    ap.add_argument("--burst", type=int, default=32, help="(a, d) tokens per server write (unpaced truth server)")
    ap.add_argument("--rates", default="250,1000,2000")
    ap.add_argument("--level-s", type=float, default=4.0)
    ap.add_argument("--itl-tokens", type=int, default=100)
    args = ap.parse_args()
    if not VLLM_PY.exists() or not (TOKENIZER / "tokenizer.json").exists():
        print(f"needs the vLLM CPU venv at {VLLM_PY} (scripts/vllm-env.sh) and the tiny model at {TOKENIZER}")
        sys.exit(2)
    tmp = Path(tempfile.mkdtemp(prefix="rig-vs-vllm-"))
    print(f"machine: {os.cpu_count()} cores, {loadavg()}; repeats {args.repeats}\n")
    try:
        for part in args.only.split(","):
            print(f"[{part.strip()}] {time.strftime('%H:%M:%S', time.gmtime())} UTC, {loadavg()}")
            {"a": figure_a, "b": figure_b, "c": figure_c, "d": figure_d}[part.strip()](args, tmp)
            print(flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
