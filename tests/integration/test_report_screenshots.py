"""scripts/report_screenshots.py shoots rig report's HTML page in headless Chromium at a desktop and a phone width
(skipped where no Chromium is installed: `apt-get install -y chromium`)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from golden import RUN

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "report_screenshots.py"
sys.path.insert(0, str(SCRIPT.parent))
from report_screenshots import HEIGHT, WIDTHS, chromium  # noqa: E402

pytestmark = [pytest.mark.skipif(chromium() is None, reason="no chromium installed")]


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", head[16:24])
    return w, h


def test_desktop_and_phone_screenshots_of_a_report(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    out = tmp_path / "shots"
    p = subprocess.run(
        [sys.executable, str(SCRIPT), str(run), str(out), "--rig-arg=--slo=tpot=10ms"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert "TPOT ≤ 10 ms" in (out / "report.html").read_text()  # the --slo reached rig report
    for name, (width, scale) in WIDTHS.items():
        shot = out / f"{name}.png"
        assert str(shot) in p.stdout
        assert _png_size(shot) == (width * scale, HEIGHT[name] * scale)
        assert shot.stat().st_size > 20_000  # a rendered page, not a blank one (a white PNG is ~10 KB)
