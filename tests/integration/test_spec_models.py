"""The trained speculative models' recipe, run at toy size on the CPU in the engine venv (torch, transformers):
the three models are written, and the EAGLE head is in the layout SGLang's LlamaForCausalLMEagle loads."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.server, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
CHECK = """
import sys
from pathlib import Path
from rig.server.spec_training import eagle_export_problems
out = Path(sys.argv[1])
print("\\n".join(eagle_export_problems(out / "eagle", out / "target")) or "OK")
"""


def test_quick_recipe_builds_target_draft_and_an_eagle_head_sglang_can_load(vllm_engine_python, tmp_path):
    out = tmp_path / "spec"
    run = subprocess.run(
        [str(vllm_engine_python), "-m", "rig.server.spec_models", "--quick", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    for sub in ("target", "draft", "eagle"):
        assert (out / sub / "config.json").exists() and (out / sub / "tokenizer.json").exists()
    assert (
        json.loads((out / "draft" / "config.json").read_text())["vocab_size"]
        == json.loads((out / "target" / "config.json").read_text())["vocab_size"]
    )
    report = json.loads((out / "train_report.json").read_text())
    assert report["target"]["params"] > report["draft"]["params"] > 0
    assert 0 <= report["eagle"]["step1_greedy_agreement"] <= 1
    check = subprocess.run(
        [str(vllm_engine_python), "-c", CHECK, str(out)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert check.stdout.strip() == "OK", check.stdout + check.stderr[-2000:]
    again = subprocess.run(  # a matching stamp: returned at once, nothing retrained
        [str(vllm_engine_python), "-m", "rig.server.spec_models", "--quick", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0 and "step" not in again.stderr
