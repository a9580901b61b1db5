"""The simulator's flag table matches SGLang's own parser, read from the pinned wheel (integration tier: needs SGLang's
source; the table's fast checks are in test_sim_args.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import REPO, sglang_source

from rig.sim.args import ARGS_TABLE, load_table


@pytest.mark.slow
def test_table_matches_sglang_parser(tmp_path):
    """Regenerate the table from the pinned SGLang release's own parser and compare: the sim's flags are SGLang's."""
    import json

    pytest.importorskip("msgspec", reason="the test extra installs msgspec (SGLang's parser module imports it)")
    root = sglang_source(load_table()["sglang_version"])
    script = REPO / "scripts" / "sglang_args.py"
    p = subprocess.run(
        [sys.executable, str(script), "--sglang-root", str(root), "--out-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    fresh = json.loads((tmp_path / ARGS_TABLE.name).read_text())
    assert fresh["sglang_version"] == load_table()["sglang_version"]
    assert fresh["arguments"] == load_table()["arguments"]
