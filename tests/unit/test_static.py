"""Static checks: ruff's lint and format, mypy's type check. CI runs them as a step of their own (`./dev check`,
from .ci/run), so `pytest` leaves these tests out; `./dev pytest --static tests/unit/test_static.py` runs them here.

The settings are in pyproject.toml ([tool.ruff], [tool.mypy]): the whole package is type-checked with the same strict
settings (no module is exempt), and the cross-package data contracts (rig/contracts/) are checked with --strict.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

ROOT = REPO
pytestmark = pytest.mark.static


def _tool(name: str) -> str:
    """The tool installed beside this interpreter (the project venv), else on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: it is in the test extra (pip install -e '.[test]')")
    return found


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing():
    p = _run(_tool("ruff"), "check", "rig", "tests", "benchmarks", "scripts")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]


def test_ruff_format_is_clean():
    p = _run(_tool("ruff"), "format", "--check", "rig", "tests", "benchmarks", "scripts")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]


def test_mypy_passes_on_the_package():
    p = _run(_tool("mypy"))
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]


def test_mypy_strict_passes_on_the_contracts():
    p = _run(_tool("mypy"), "--strict", "rig/contracts")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
