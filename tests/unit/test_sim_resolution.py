"""The simulator resolves and refuses flags as SGLang 0.5.23's resolution hooks do (rig/sim/resolution.py).

The first tests state the rules; the last two (slow) check them against SGLang's own source and functions, read
from the pinned wheel ($RIG_SGLANG_SRC, an unpacked wheel, or `pip download` into $RIG_CACHE; skipped when the
package index cannot be reached), as test_sim_args.py checks the flag table.
"""

from __future__ import annotations

import json
import string
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, sglang_source

from rig.sim.args import SGLANG_VERSION, check_argv, resolve
from rig.sim.resolution import (
    REFUSALS,
    resolve_backends,
)

SCRIPT = REPO / "scripts" / "sglang_refusals.py"
NODE = ["--model-path", "m", "--tp-size", "4"]


def test_deterministic_changes_the_engine_not_only_the_seeds():
    """attention_hook.py::handle_deterministic_inference on Blackwell (the simulated RTX PRO 6000): the attention
    backend falls back to flashinfer, which keeps no radix cache; the sampler is pytorch; TP 4 turns custom and
    symmetric-memory all-reduce off (overrides.py::_deterministic_*)."""
    a = resolve([*NODE, "--enable-deterministic-inference"])
    assert (a.attention_backend, a.disable_radix_cache, a.sampling_backend) == ("flashinfer", True, "pytorch")
    assert (a.disable_custom_all_reduce, a.enable_torch_symm_mem) == (True, False)
    assert a.enforce_disable_flashinfer_allreduce_fusion is True
    assert any(w.startswith("Currently radix cache is not compatible with flashinfer") for w in a.warnings)
    plain = resolve(NODE)
    assert (plain.attention_backend, plain.disable_radix_cache, plain.sampling_backend) == (None, False, "flashinfer")
    assert plain.disable_custom_all_reduce is False


def test_deterministic_keeps_the_radix_cache_on_fa3_and_all_reduce_at_tp1():
    a = resolve(["--model-path", "m", "--enable-deterministic-inference", "--attention-backend", "fa3"])
    assert (a.attention_backend, a.disable_radix_cache, a.sampling_backend) == ("fa3", False, "pytorch")
    assert a.disable_custom_all_reduce is False  # TP 1


def test_hopper_falls_back_to_fa3():
    ns = resolve(NODE).ns
    ns.enable_deterministic_inference, ns.attention_backend = True, None
    resolve_backends(ns, [], gpu_arch="sm90")
    assert (ns.attention_backend, ns.disable_radix_cache) == ("fa3", False)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            ["--mamba-radix-cache-strategy", "no_buffer"],
            "no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True. "
            "(SGLang arg_groups/mamba_hook.py::validate_mamba_no_buffer)",
        ),
        (
            ["--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule", "--page-size", "16"],
            "no_buffer only supports page_size=1.",
        ),
        (
            ["--enable-deterministic-inference", "--attention-backend", "trtllm_mha"],
            "Currently only ['ascend', 'fa3', 'fa4', 'flashinfer', 'intel_xpu', 'triton'] attention backends "
            "are supported "
            "for deterministic inference, but you explicitly specified 'trtllm_mha'.",
        ),
        (
            ["--speculative-algorithm", "NEXTN", "--speculative-eagle-topk", "1"],
            "AssertionError: --speculative-eagle-topk and --speculative-num-draft-tokens need --speculative-num-steps",
        ),
        (
            [
                "--speculative-algorithm",
                "EAGLE",
                "--speculative-use-rejection-sampling",
                "--speculative-accept-threshold-single",
                "0.5",
            ],
            "rejection sampling ignores the accept thresholds.",
        ),
    ],
)
def test_refused_at_launch_like_sglang_resolution(argv, needle):
    why = check_argv(["--model-path", "m", *argv])
    assert why is not None and needle in why


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            ["--served-model-name", "base:adapter"],
            "served_model_name cannot contain a colon (':') character. The colon is "
            "reserved for the 'model:adapter' syntax used in LoRA adapter specification. Invalid value: 'base:adapter'",
        ),
        (["--page-size", "3"], "chunked_prefill_size must be divisible by page_size"),
        (
            ["--enable-priority-scheduling", "--schedule-policy", "lpm"],
            "To use priority scheduling, schedule_policy must be 'fcfs' or 'lof'. 'lpm' is not supported.",
        ),
        (["--grpc-port", "30000"], "--grpc-port (30000) must differ from --port (30000)"),
        (["--kv-canary-sweep-interval", "5"], "--kv-canary-sweep-interval requires --kv-canary in {log, raise}"),
        (["--tp-size", "4", "--dp-size", "2", "--nnodes", "2"], "multi-node data-parallel replicas are not supported"),
        (["--tp-size", "3", "--nnodes", "2"], "tp_size must be divisible by number of nodes"),
    ],
)
def test_check_server_args_refusals(argv, needle):
    """validation_hook.py::check_server_args, the checks on flags alone, with SGLang's text."""
    why = check_argv(["--model-path", "m", *argv])
    assert why is not None and needle in why and "(SGLang arg_groups/validation_hook.py::check_server_args)" in why


@pytest.mark.parametrize(
    "argv",
    [
        ["--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule"],
        ["--mamba-radix-cache-strategy", "no_buffer", "--disable-radix-cache"],  # the validation needs the radix cache
        ["--mamba-radix-cache-strategy", "auto"],
        ["--enable-deterministic-inference", "--attention-backend", "triton"],
    ],
)
def test_accepted_like_sglang_resolution(argv):
    assert check_argv(["--model-path", "m", *argv]) is None


# ---------------------------------------------------------------- checked against SGLang's own code
def _root() -> Path:
    """SGLang's source: $RIG_SGLANG_SRC, else the pinned wheel from the package index, cached (support.py)."""
    return sglang_source(SGLANG_VERSION)


# Sites of the cited functions the simulator has no rule for, and why none is needed.
NOT_REACHED = {
    "arg_groups/validation_hook.py:check_server_args": {
        "enable_mixed_chunk is not supported with speculative_algorithm={}": "_handle_eagle_family turns "
        "mixed chunked prefill off first (the sim models the EAGLE family only)",
    },
    "arg_groups/speculative_hook.py:_handle_eagle_family": {
        "Currently standalone speculative decoding does not support dp attention.": "STANDALONE is refused "
        "by the simulator (not modelled)",
        "speculative_eagle_topk > 1 with page_size > 1 is only supported on {}; got attention_backend={}. Use "
        "page_size == 1 or one of those backends.": "topk > 1 is refused by the simulator (not modelled)",
        "--speculative-use-rejection-sampling is only supported for EAGLE / EAGLE3 / NEXTN, not "
        "speculative_algorithm={}.": "other algorithms are refused by the simulator (not modelled)",
        "--speculative-use-rejection-sampling requires --speculative-eagle-topk=1.": "topk > 1 is refused",
        "Deterministic rejection sampling is currently supported only on CUDA-compatible devices because draft "
        "proposal sampling uses a Triton hash kernel.": "the simulated device is CUDA",
        "--speculative-use-rejection-sampling with multi-layer EAGLE (--enable-multi-layer-eagle) requires "
        "--speculative-eagle-topk 1; rejection sampling is only implemented for the linear (topk=1) "
        "chain.": "topk > 1 is refused",
    },
}


@pytest.mark.slow
def _template(message: str) -> str:
    """A rule's message as scripts/sglang_refusals.py writes SGLang's: literal text, each field as {}."""
    parts = string.Formatter().parse(message)
    return "".join(text + ("{}" if field is not None else "") for text, field, _, _ in parts)


def test_every_rule_is_sglang_text_and_every_site_is_classified():
    """Each rule's message is an assert/raise of the function it cites (f-string fields as {}), and every other
    assert/raise of those functions is listed above with the reason the simulator needs no rule: a new refusal in
    a new release fails here until it is modelled or classified."""
    root = _root()
    cited = sorted({f"{r.file}:{r.function}" for r in REFUSALS})
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--sglang-root", str(root), "sites", *cited],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    wheel = json.loads(out.stdout)
    for site in cited:
        ours = {_template(r.message) for r in REFUSALS if f"{r.file}:{r.function}" == site}
        theirs = set(wheel[site])
        assert ours <= theirs, f"{site}: not SGLang's text: {ours - theirs}"
        assert theirs - ours == set(NOT_REACHED.get(site, {})), site


def test_chat_defaults_from_the_model_directory_or_the_profile(tmp_path):
    """configs/model_config.py::get_default_sampling_params: the five keys generation_config.json sets (transformers
    5 leaves the rest None), only with --sampling-defaults model; a hub id the sim cannot read uses the profile's."""
    from rig.sim.generation import GenerationConfigError, chat_defaults

    (tmp_path / "generation_config.json").write_text(
        json.dumps(
            {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": None, "do_sample": True, "max_new_tokens": 9}
        )
    )
    assert chat_defaults(str(tmp_path), "model", {"generation_config": {"top_k": 5}}) == {
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
    }
    assert chat_defaults(str(tmp_path), "openai", {}) == {}
    assert chat_defaults("Qwen/Qwen3.5-122B-A10B", "model", {"generation_config": {"top_k": 5}}) == {"top_k": 5}
    assert chat_defaults("Qwen/Qwen3.5-122B-A10B", "model", {}) == {}
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(GenerationConfigError, match="cannot read"):
        chat_defaults(str(tmp_path), "model", {})
