"""The golden behaviour check's commands: what `rig` prints for a checked-in run directory, and the dry-run line.

`python tests/golden.py --write` regenerates tests/data/golden/out/ from the current code; do that only for an
intended change of output, and say so in the commit message (issue 13: a refactor must leave these identical).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
RUN = HERE / "data" / "golden" / "run"  # a 2x2 sweep (steps 0,4 x C=2,4, realistic, seed 7) taken on the simulator
OUT = HERE / "data" / "golden" / "out"

# name -> rig arguments; the run directory is appended where "{run}" stands
COMMANDS: dict[str, list[str]] = {
    "report.txt": ["report", "{run}"],
    "report.json": ["report", "{run}", "--json-full"],
    "report_slo.json": ["report", "{run}", "--json-full", "--slo", "ttft=300ms", "--slo", "tpot=10ms"],
    "compare.txt": ["compare", "{run}", "--baseline-steps", "0"],
    "compare.json": ["compare", "{run}", "--baseline-steps", "0", "--json"],
    "dryrun.txt": ["run", "--workload", "realistic", "--steps", "4", "--run-id", "golden-dry", "--dry-run"],
    "dryrun_sweep.txt": [
        "sweep",
        "--workload",
        "greedy",
        "--steps",
        "0,2",
        "--concurrency",
        "1,8",
        "--mode",
        "closed",
        "--requests",
        "16",
        "--run-id",
        "golden-dry",
        "--engine",
        "sglang",
        "--dry-run",
    ],
}


def rig(args: list[str], run: Path) -> str:
    """stdout and stderr of one rig command (a wide terminal, the temp dir spelled as <tmp>)."""
    env = {**os.environ, "COLUMNS": "160", "RAY_USAGE_STATS_ENABLED": "0"}
    argv = [a.replace("{run}", str(run)) for a in args]
    p = subprocess.run([sys.executable, "-m", "rig.cli", *argv], capture_output=True, text=True, env=env, timeout=120)
    text = f"exit {p.returncode}\n--- stdout\n{p.stdout}--- stderr\n{p.stderr}"
    return text.replace(str(run), "<run>").replace(tempfile.gettempdir(), "<tmp>")


def parquet_schemas() -> str:
    """The Parquet schemas rig writes (column names, types, order): files written before must stay readable."""
    from rig.results import GPU_METRICS_SCHEMA, REQUEST_SCHEMA, SERVER_METRICS_SCHEMA

    return (
        f"requests\n{REQUEST_SCHEMA}\n\nserver metrics\n{SERVER_METRICS_SCHEMA}\n\ngpu metrics\n{GPU_METRICS_SCHEMA}\n"
    )


def csv_tables(run: Path, dest: Path) -> dict[str, str]:
    """`rig report --csv`: every table file's text by name."""
    subprocess.run(
        [sys.executable, "-m", "rig.cli", "report", str(run), "--csv", str(dest)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return {f"csv/{p.name}": p.read_text() for p in sorted(dest.glob("*.csv"))}


def outputs(run: Path, scratch: Path) -> dict[str, str]:
    """Every golden output of the current code, by file name."""
    got = {name: rig(args, run) for name, args in COMMANDS.items()}
    got["request_schema.txt"] = parquet_schemas()
    got.update(csv_tables(run, scratch / "csv"))
    return got


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import shutil

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(RUN, run)
        shutil.rmtree(OUT, ignore_errors=True)
        for name, text in outputs(run, Path(tmp)).items():
            (OUT / name).parent.mkdir(parents=True, exist_ok=True)
            (OUT / name).write_text(text)
    print(f"wrote {OUT}")
