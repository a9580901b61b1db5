"""The simulator's resolution rules agree with SGLang's own functions run on the same flags (integration tier: needs
SGLang's source; the rules' fast checks are in test_sim_resolution.py)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, sglang_source

from rig.sim.args import SGLANG_VERSION, resolve
from rig.sim.resolution import (
    DETERMINISTIC_ATTENTION_BACKEND_CHOICES,
    MODEL_ARCH,
    RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND,
    refusal,
    resolve_backends,
)

SCRIPT = REPO / "scripts" / "sglang_refusals.py"


# ---------------------------------------------------------------- checked against SGLang's own code
def _root() -> Path:
    """SGLang's source: $RIG_SGLANG_SRC, else the pinned wheel from the package index, cached (support.py)."""
    return sglang_source(SGLANG_VERSION)


@pytest.mark.slow
def test_rules_agree_with_sglang_functions_run_on_the_same_flags():
    """SGLang's validate_mamba_no_buffer and _deterministic_attention_backend, imported from the wheel (GPU stack
    stubbed) and run on every combination, refuse and choose exactly what the simulator does; the backend lists are
    choices.py's."""
    root = _root()
    cases, ours = [], []
    for page, overlap_off, backend in itertools.product((1, 16), (False, True), (None, "fa3", "trtllm_mha")):
        ns = resolve(["--model-path", "m", "--skip-server-warmup"]).ns
        ns.mamba_radix_cache_strategy, ns.disable_radix_cache = "no_buffer", False
        ns.page_size, ns.disable_overlap_schedule, ns.attention_backend = page, overlap_off, backend
        cases.append(
            {
                "function": "validate_mamba_no_buffer",
                "arch": MODEL_ARCH,
                "view": {"page_size": page, "disable_overlap_schedule": overlap_off, "attention_backend": backend},
            }
        )
        ours.append(refusal(ns))
    for arch, backend in itertools.product(("sm90", "sm100", "sm120"), (None, "fa3", "flashinfer", "trtllm_mha")):
        ns = resolve(["--model-path", "m"]).ns
        ns.enable_deterministic_inference, ns.attention_backend = True, backend
        why = refusal(ns)
        if why is None:
            resolve_backends(ns, [], gpu_arch=arch)
        cases.append(
            {
                "function": "_deterministic_attention_backend",
                "arch": arch,
                "view": {"enable_deterministic_inference": True, "attention_backend": backend, "model_path": "m"},
            }
        )
        ours.append(why or ns.attention_backend)
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--sglang-root", str(root), "run"],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    got = json.loads(out.stdout)
    assert got["DETERMINISTIC_ATTENTION_BACKEND_CHOICES"] == list(DETERMINISTIC_ATTENTION_BACKEND_CHOICES)
    radix = list(RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND)
    assert got["RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND"] == radix
    for case, mine, theirs in zip(cases, ours, got["results"], strict=True):
        if not theirs["ok"]:
            assert mine is not None and mine.startswith(theirs["message"] or "AssertionError"), (case, mine, theirs)
        elif case["function"] == "validate_mamba_no_buffer":
            assert mine is None, (case, mine)
        else:
            assert mine == (theirs["set"] or {}).get("attention_backend", case["view"]["attention_backend"]), case
