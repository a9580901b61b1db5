"""How much load the simulated server sustains on this machine while staying on its schedule.

Starts `python -m rig.sim` (default without speculation, so up to 133 streams decode at once) and, for rising numbers of
concurrent streams, runs a closed loop of long greedy /generate streams from this process (the load generator shares the
machine, as it does in `rig run`). For each level it reads the sim's own lag histogram from /metrics and counts
chunks/s at the client. Prints one row per level and the highest load whose p99 lag stayed under 1 ms. It measures;
it asserts nothing.

    .venv/bin/python benchmarks/sim_capacity.py [--levels 16,32,64,96,128,192] [--seconds 10] [--steps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time

import aiohttp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lag_histogram(text: str) -> dict[float, float]:
    """Cumulative bucket counts of sglang:sim_iteration_lag_seconds."""
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith("sglang:sim_iteration_lag_seconds_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def quantile(before: dict, after: dict, q: float) -> float:
    """Upper bucket bound containing quantile q of the observations between two scrapes."""
    les = sorted(after)
    total = after[les[-1]] - before.get(les[-1], 0.0)
    if total <= 0:
        return 0.0
    for le in les:
        if after[le] - before.get(le, 0.0) >= q * total:
            return le
    return float("inf")


async def level(url: str, n: int, seconds: float, max_running: int) -> dict:
    chunks = 0
    stop_at = time.monotonic() + seconds
    body = {
        "text": "Write a long essay about the sea.",
        "stream": True,
        "sampling_params": {"max_new_tokens": 1500, "temperature": 0, "ignore_eos": True},
    }
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as s:

        async def metrics() -> dict:
            async with s.get(url + "/metrics") as r:
                return lag_histogram(await r.text())

        async def stream() -> None:
            nonlocal chunks
            while time.monotonic() < stop_at:
                async with s.post(url + "/generate", json=body) as r:
                    async for line in r.content:
                        if line.startswith(b"data: {"):
                            chunks += 1
                        if time.monotonic() >= stop_at:
                            break

        await asyncio.sleep(0.5)
        before = await metrics()
        t0 = time.monotonic()
        await asyncio.gather(*(stream() for _ in range(n)))
        elapsed = time.monotonic() - t0
        after = await metrics()
    await asyncio.sleep(0.5)  # let aborted requests drain out of the server
    return {
        "streams": n,
        "running": min(n, max_running),
        "chunks_s": chunks / elapsed,
        "lag_p50": quantile(before, after, 0.5),
        "lag_p99": quantile(before, after, 0.99),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="16,32,64,96,128,192,256")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument(
        "--steps",
        type=int,
        default=0,
        help="0 (default): no speculation, so the most streams decode at once (133 may run)",
    )
    ap.add_argument(
        "--max-running-requests",
        type=int,
        default=None,
        help="raise the server's limit so every stream decodes (default: the model's own limit)",
    )
    a = ap.parse_args()
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "rig.sim",
        "--model-path",
        "Qwen/Qwen3.5-122B-A10B",
        "--tp-size",
        "4",
        "--port",
        str(port),
        "--enable-metrics",
        "--sim-no-access-log",
        "--log-level",
        "warning",
    ]
    if a.steps > 0:
        argv += [
            "--speculative-algorithm",
            "NEXTN",
            "--speculative-num-steps",
            str(a.steps),
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            str(a.steps + 1),
        ]
    if a.max_running_requests:
        argv += ["--max-running-requests", str(a.max_running_requests)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(300):
                try:
                    async with s.get(url + "/health") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            async with s.get(url + "/server_info") as r:
                max_running = (await r.json())["internal_states"][0]["effective_max_running_requests_per_dp"]
        print(f"sim steps={a.steps}, effective max running requests={max_running}, {a.seconds:.0f} s per level")
        print(f"{'streams':>8} {'running':>8} {'chunks/s':>10} {'lag p50':>10} {'lag p99':>10}")
        best = None
        for n in (int(x) for x in a.levels.split(",")):
            r = await level(url, n, a.seconds, max_running)
            print(
                f"{r['streams']:>8} {r['running']:>8} {r['chunks_s']:>10.0f} {r['lag_p50'] * 1e3:>8.2f}ms "
                f"{r['lag_p99'] * 1e3:>8.2f}ms"
            )
            if r["lag_p99"] <= 0.001:
                best = r
        if best:
            print(
                f"highest load with p99 lag <= 1 ms: {best['streams']} concurrent streams "
                f"({best['running']} decoding), {best['chunks_s']:.0f} chunks/s"
            )
        else:
            print("no level stayed under 1 ms p99 lag")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    asyncio.run(main())
