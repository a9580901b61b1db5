"""`rig --version` starts light: it loads click, yaml and pydantic (the option declarations and the spec models) and
nothing heavier. numpy, Ray, pyarrow, pandas and the analysis stack cost ~0.2-2 s of start-up; they load when a
command that needs them runs. (The wall-clock figure, under 0.5 s, is measured by benchmarks, not asserted here.)"""

from __future__ import annotations

import subprocess
import sys

# What the version path may import beyond the standard library and rig itself.
LIGHT = {"click", "yaml", "pydantic", "pydantic_core", "annotated_types", "typing_extensions", "typing_inspection"}

PROBE = """
import atexit, sys
def _report():
    loaded = {m.split('.')[0] for m in list(sys.modules)} - set(sys.stdlib_module_names) - {'cython_runtime'}
    print('LOADED', ','.join(sorted(m for m in loaded if not m.startswith('_'))), file=sys.stderr)
    print('RIG', ','.join(sorted(m for m in sys.modules if m.startswith('rig.'))), file=sys.stderr)
atexit.register(_report)
from rig.cli import main  # what the `rig` console script runs
sys.argv = ['rig', '--version']
main()
"""


def _version_run() -> tuple[str, set[str], set[str]]:
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in p.stderr.splitlines() if line.startswith(("LOADED ", "RIG ")))
    return p.stdout, set(filter(None, lines["LOADED"].split(","))), set(filter(None, lines["RIG"].split(",")))


def test_rig_version_imports_no_heavy_module():
    out, loaded, rig_modules = _version_run()
    assert out.startswith("rig, version ")
    heavy = sorted(loaded - LIGHT - {"rig"})
    assert heavy == [], f"`rig --version` imports {heavy}: import them where they are used (lazily)"
    for sub in ("rig.run.", "rig.analysis.", "rig.sim.", "rig.loadgen.drive", "rig.workloads.agentic"):
        assert not [m for m in rig_modules if m.startswith(sub)], f"`rig --version` imports {sub}*"
