"""rig on a real GPU: local Ray, the server actor (num_gpus=1) launching `transformers serve` through the command
engine, a concurrency sweep, the campaign's table with energy per token. Prints; never asserts. CI never runs it.

On a GPU node (no package index needed; see README "Installing on a GPU node with no package index"):

    python3 benchmarks/gpu_transformers_serve.py --wheelhouse WH [--concurrency 1,4,16,32,64] [--out results]

``--wheelhouse WH`` installs rig's wheelhouse (scripts/wheelhouse.py build, where pip works) into a folder first
and runs with it on PYTHONPATH; without it, rig and its dependencies must already import.

The model is built locally from a config with random weights (rig.server.tiny_model --preset gpu-1b: 1.0 B
parameters, bf16), so nothing comes from a model hub; its text is nonsense but every kernel, batch and byte on the
wire is the engine's own. Needs torch with CUDA, transformers (with fastapi, uvicorn, openai for `serve`) and
nvidia-ml-py on the node.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# transformers serve with continuous batching on the GPU; {model} {host} {port} are filled by rig's command engine.
SERVE = "transformers serve {model} --continuous-batching --host {host} --port {port}"


def gpu_name() -> str | None:
    """The first GPU's name from NVML, or None where there is no NVIDIA GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        finally:
            pynvml.nvmlShutdown()
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # no library, no driver, no device: all mean "no GPU here"
        return None


def rig(*args: str, check: bool = True) -> tuple[int, str]:
    """Run `rig ARGS`, echoing its output line by line as it comes (a run cut off by a time limit still shows how
    far it got); returns the exit code and the output."""
    print("$ rig " + " ".join(args), flush=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rig.cli", *args],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0"},
    )
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    code = proc.wait()
    if check and code not in (0, 1):  # 1: a partial point is a finding, still reported
        raise SystemExit(f"gpu_transformers_serve: rig {args[0]} exited {code}")
    return code, "".join(lines)


def install_and_rerun(wheelhouse: str, site: str) -> int:
    """Install the wheelhouse into ``site`` (no index), then run this script again with it on PYTHONPATH (so the
    engine and Ray's workers, which inherit the environment, see the same packages)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "wheelhouse.py"), "install", wheelhouse, "--target", site]
    )
    if done.returncode != 0:
        print(f"gpu_transformers_serve: installing {wheelhouse} failed (exit {done.returncode})", file=sys.stderr)
        return 2
    path = os.pathsep.join(p for p in (site, str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "RIG_WHEELHOUSE_SITE": site}
    return subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env).returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,2,4,8,16,32,64")
    ap.add_argument("--workload", default="realistic")
    ap.add_argument("--api", default="openai-completions")
    ap.add_argument("--model-dir", default="/tmp/rig-gpu-1b")
    ap.add_argument("--preset", default="gpu-1b")
    ap.add_argument("--out", default=str(ROOT / "results"))
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--gpu-hour-price", type=float, default=None, help="USD per GPU-hour for $ per million tokens")
    ap.add_argument("--extra", action="append", default=[], help="another rig flag for the sweep (repeatable)")
    ap.add_argument("--resume", default=None, help="continue this run directory's sweep (rig sweep --resume)")
    ap.add_argument("--wheelhouse", default=None, help="install this wheelhouse first (no package index needed)")
    ap.add_argument("--site", default="/tmp/rig-site", help="where --wheelhouse installs")
    args = ap.parse_args()
    if args.wheelhouse and os.environ.get("RIG_WHEELHOUSE_SITE") != args.site:
        return install_and_rerun(args.wheelhouse, args.site)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # inherited by Ray's workers and the engine: no hub look-ups
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    name = gpu_name()
    if name is None:
        print("gpu_transformers_serve: no NVIDIA GPU here (NVML found none); run it on a GPU node", file=sys.stderr)
        return 2
    if shutil.which("transformers") is None:
        print(
            "gpu_transformers_serve: the `transformers` command is not on PATH (pip install transformers[serving])",
            file=sys.stderr,
        )
        return 2
    from rig.server.tiny_model import build_tiny_model

    t0 = time.monotonic()
    model = build_tiny_model(args.model_dir, args.preset)
    print(f"model {model} ({args.preset}) ready in {time.monotonic() - t0:.1f} s", flush=True)

    started = datetime.datetime.now(datetime.UTC)
    if args.resume:  # a sweep cut off earlier (a time limit): its finished points stay, the rest run now
        run_dir = Path(args.resume)
        rig("sweep", "--resume", str(run_dir), "--quiet")
        return report(run_dir, args, name, started)
    run_id = args.run_id or f"gpu-tserve-{started:%Y%m%dT%H%M%SZ}"
    # --tp 1 asks Ray for one GPU; --steps 0: transformers serve has no speculative decoding (the template places no
    # {steps}); --model is the path the server was started with (transformers serve refuses any other model name).
    rig(
        "sweep",
        "--engine",
        "command",
        "--command",
        SERVE,
        "--model",
        str(model),
        "--tp",
        "1",
        "--steps",
        "0",
        "--workload",
        args.workload,
        "--api",
        args.api,
        "--concurrency",
        args.concurrency,
        "--out",
        args.out,
        "--run-id",
        run_id,
        "--quiet",
        *args.extra,
    )
    return report(Path(args.out) / run_id, args, name, started)


def report(run_dir: Path, args: argparse.Namespace, gpu: str, started: datetime.datetime) -> int:
    report_args = ["report", str(run_dir)]
    if args.gpu_hour_price is not None:
        report_args += ["--gpu-hour-price", str(args.gpu_hour_price)]
    rig(*report_args, check=False)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    print(
        f"# {started:%Y-%m-%d %H:%M} UTC, {gpu}, transformers serve --continuous-batching, model {args.preset}, "
        f"run {run_dir.name}, status {manifest.get('status')}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
