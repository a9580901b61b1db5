"""How long `rig --version` and `import rig` take in a fresh interpreter, next to a bare interpreter in the same run.

    python benchmarks/cli_startup.py [--runs 7] [--against DIR]

Each command runs ``--runs`` times, alternating with the others (so a busy moment of the machine hits them all);
prints the best and the median wall time of each. The line to hold: `rig --version` under 0.5 s (issue 33: the
API, the live view and the report's plots must not make the command line's start heavier). The anchor is
``python -c pass``: what any Python command costs here before it does anything. ``--against DIR``: also time
`rig --version` from another version's rig package in DIR (e.g. ``git archive REV rig | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

COMMANDS = {
    "python -c pass (anchor)": [sys.executable, "-c", "pass"],
    "python -m rig.cli --version": [sys.executable, "-m", "rig.cli", "--version"],
    "import rig": [sys.executable, "-c", "import rig"],
    "import rig; rig.open_run (the API: pandas, pyarrow)": [sys.executable, "-c", "import rig; rig.open_run"],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--against", metavar="DIR", help="a directory holding another version's rig package")
    args = ap.parse_args()
    commands = {name: (argv, None) for name, argv in COMMANDS.items()}
    script = shutil.which("rig")
    if script:
        commands["rig --version (console script)"] = ([script, "--version"], None)
    if args.against:
        env = {**os.environ, "PYTHONPATH": os.path.abspath(args.against)}
        commands[f"python -m rig.cli --version ({args.against})"] = (COMMANDS["python -m rig.cli --version"], env)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, (argv, env) in commands.items():
            t0 = time.perf_counter()
            # from a neutral directory: `python -m` puts the working directory first on sys.path
            subprocess.run(argv, check=True, capture_output=True, env=env, cwd=tempfile.gettempdir())
            times[name].append(time.perf_counter() - t0)
    width = max(map(len, commands))
    print(f"{'command':<{width}}  best (s)  median (s)  ({args.runs} runs each, interleaved)")
    for name, ts in times.items():
        print(f"{name:<{width}}  {min(ts):8.3f}  {statistics.median(ts):10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
