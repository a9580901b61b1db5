"""The campaign's figures three ways: the campaign itself, the simulator on its virtual clock (what the tests hold to
the campaign), and the simulator through the real rig path (`rig sweep` on the embedded default: Ray, HTTP, the
generators, the records, `rig report`). Prints a table; asserts nothing. Real time: about 6 minutes on a quiet machine.

    ./dev python benchmarks/campaign_real_path.py [--out DIR]

The runs launch with the campaign's assumed flags (rig/sim/data/campaign.yaml launch_flags: the overlap schedule off).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from rig.analysis.report import build_report
from rig.sim.fit import campaign_targets, evaluate
from rig.sim.profile import load_profile

# (run id, steps, concurrency levels): the campaign's steps=4 table, steps 1-3 at C=1, steps 3 at C=64
RUNS = (
    ("steps4", "4", "1,4,16,32,64"),
    ("c1", "1,2,3", "1"),
    ("c64", "3", "64"),
)
LAUNCH = ["--server-arg=--disable-overlap-schedule"]


def _sweep(out: Path, run_id: str, steps: str, levels: str) -> Path:
    cmd = [sys.executable, "-m", "rig.cli", "sweep", "--workload", "greedy", "--steps", steps, "--concurrency", levels]
    cmd += [*LAUNCH, "--out", str(out), "--run-id", run_id, "-q"]
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)
    return out / run_id


def _real(run: Path) -> dict[str, float]:
    """label -> figure, named as the campaign targets are (steps4 C=16 aggregate, ... per-request)."""
    out = {}
    for r in build_report(run, cdf_resolution=0).campaign:
        base = f"steps{r.steps} C={r.level:g}"
        out[f"{base} aggregate"] = r.aggregate_tok_s
        out[f"{base} per-request"] = r.decode_tok_s
        if r.flags:
            print(f"  note: {base} flagged {', '.join(r.flags)}")
    return out


@click.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None, help="Keep the runs here.")
def main(out: Path | None) -> None:
    out = out or Path(tempfile.mkdtemp(prefix="rig-campaign-"))
    t0 = time.time()
    real: dict[str, float] = {}
    for run_id, steps, levels in RUNS:
        real.update(_real(_sweep(out, run_id, steps, levels)))
    if real.get("steps3 C=64 aggregate"):
        real["C=64 aggregate steps4/steps3"] = real["steps4 C=64 aggregate"] / real["steps3 C=64 aggregate"]
    virtual = {row["label"]: row for row in evaluate(load_profile(), campaign_targets())}
    print(f"\nreal path {time.time() - t0:.0f} s; runs in {out}\n")
    print(f"{'figure':<28} {'campaign':>9} {'virtual':>9} {'real path':>10} {'real/virtual':>13}")
    for label, row in virtual.items():
        if label not in real or row.get("sim") is None:
            continue
        got, sim = real[label], row["sim"]
        print(f"{label:<28} {row['target']:>9,.3f} {sim:>9,.3f} {got:>10,.3f} {(got / sim - 1) * 100:>+12.1f}%")


if __name__ == "__main__":
    main()
