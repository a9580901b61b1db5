"""Performance profile of the simulated server: named, unit-carrying parameters loaded from and saved to YAML."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PROFILES_DIR = Path(__file__).parent / "profiles"
REFERENCE_PROFILE = PROFILES_DIR / "reference.yaml"


@dataclass(frozen=True)
class ParamSpec:
    """What a parameter means: its unit, a description, and the bounds a fitter may move it within."""

    name: str
    unit: str
    description: str
    default: float
    lo: float
    hi: float


def _p(name: str, unit: str, default: float, lo: float, hi: float, description: str) -> ParamSpec:
    return ParamSpec(name, unit, description, default, lo, hi)


# The model's parameters. Defaults are the fitter's starting point; the shipped values live in profiles/*.yaml.
SPECS: tuple[ParamSpec, ...] = (
    # --- hardware and memory (facts or assumptions; not fitted) ---
    _p("gpu_mem_gb", "GB", 96.0, 8, 400, "Memory of one GPU (RTX PRO 6000 Blackwell: 96 GB)."),
    _p("calibrated_tp", "GPUs", 4, 1, 64, "Tensor-parallel size the timing parameters were calibrated at."),
    _p("weight_gb_total", "GB", 244.0, 1, 2000, "Model weights over all GPUs (122 B parameters in bf16)."),
    _p(
        "default_mem_fraction_static",
        "fraction",
        0.85,
        0.1,
        0.99,
        "mem_fraction_static when the flag is unset: share of GPU memory for weights, KV pool and request state.",
    ),
    _p("graph_reserve_gb", "GB", 1.5, 0, 50, "Memory kept back per GPU for CUDA graphs and activations."),
    _p(
        "kv_bytes_per_token",
        "bytes/token/GPU",
        12288,
        64,
        1e7,
        "KV-cache bytes one token occupies per GPU (full-attention layers only in a hybrid model).",
    ),
    _p("context_length", "tokens", 262144, 1024, 1e7, "Model's maximum context length (config.json)."),
    _p("default_chunked_prefill_size", "tokens", 8192, 256, 1e6, "chunked_prefill_size when the flag is unset."),
    _p("default_max_prefill_tokens", "tokens", 16384, 256, 1e6, "Token budget of one prefill batch."),
    _p(
        "new_token_ratio",
        "fraction",
        0.7,
        0.0,
        1.0,
        "Share of a request's max_new_tokens the scheduler reserves in the KV pool at admission.",
    ),
    # --- per-request state (fitted: with the draft tokens it sets max running requests; rig/sim/capacity.py) ---
    _p(
        "mamba_state_mb_per_req",
        "MB/state slot/GPU",
        50.0,
        1,
        5000,
        "One recurrent-state slot per GPU (conv + SSM state of the linear-attention layers: SGLang's "
        "mamba_cache_per_req); a running request holds (ratio + draft tokens) of them.",
    ),
    # --- forward cost (fitted) ---
    _p(
        "t_fixed_ms",
        "ms",
        12.9,
        1,
        100,
        "Fixed cost of one target forward: kernel launches, all-reduce latency, dense and attention weights.",
    ),
    _p(
        "t_experts_ms",
        "ms",
        1.0,
        0.1,
        200,
        "Time to stream every routed expert's weights once; a forward pays the share of experts its tokens touch.",
    ),
    _p(
        "c_tok_ms",
        "ms/token",
        0.1,
        0.0,
        5,
        "Compute cost per token in a target forward (prefill and verify tokens alike).",
    ),
    _p(
        "c_ctx_ms_per_ktok",
        "ms/1000 context tokens",
        0.02,
        0.0,
        5,
        "Attention cost per thousand tokens of context read by a forward (sum over the batch).",
    ),
    _p("d_fixed_ms", "ms", 0.05, 0.0, 20, "Fixed cost of one draft (MTP head) forward."),
    _p("d_tok_ms", "ms/token", 0.01, 0.0, 2, "Per-token cost of one draft forward."),
    _p(
        "spec_fixed_ms",
        "ms",
        0.0,
        0.0,
        50,
        "Fixed cost of one speculative decode iteration beyond its forwards (the draft tokens' sampling, the "
        "acceptance check, the verify's metadata); a zero-step adaptive tier pays it too.",
    ),
    _p(
        "host_chunk_ms",
        "ms/chunk",
        0.0,
        0.0,
        5,
        "Serial host cost of one streamed chunk (the tokenizer manager and detokenizer turn each running request's "
        "new tokens into a chunk every decode iteration, overlapped with the GPU): a decode iteration lasts at least "
        "host_chunk_ms x running requests. SGLang 0.5.17 on an H100 streamed at most ~10-12 k chunks/s (0.28 B "
        "target: 1.7 ms a step at batch 16, 5.5 ms at 64); 0 in the reference profile.",
    ),
    _p("experts_total", "experts", 256, 1, 4096, "Routed experts per MoE layer (Qwen3.5-122B-A10B: 256)."),
    _p("experts_per_token", "experts", 8, 1, 64, "Routed experts each token activates."),
    # --- acceptance (logit scale; position i = 1..k) ---
    _p(
        "acc_logit_greedy",
        "logit",
        2.17,
        -5,
        10,
        "Logit of accepting draft position 1 at temperature 0 for content score 0.5 (assumption, see profile notes).",
    ),
    _p(
        "acc_logit_content_slope",
        "logit/unit score",
        1.45,
        0,
        10,
        "How much the content score (0 prose .. 1 code/repetitive) raises the acceptance logit (assumption).",
    ),
    _p(
        "acc_logit_position_decay",
        "logit/position",
        0.35,
        0,
        5,
        "Logit drop per later draft position: the draft head compounds its own errors (assumption).",
    ),
    _p(
        "draft_trained_positions",
        "positions",
        0,
        0,
        64,
        "Draft positions the draft head was trained to predict (an EAGLE head trained on two self-fed steps: 2); "
        "0: no such limit (the MTP head of the reference campaign). A stated fact of the head, not fitted.",
    ),
    _p(
        "acc_logit_beyond_trained",
        "logit/position",
        0.0,
        0,
        20,
        "Extra logit drop per draft position beyond draft_trained_positions: a head drafts worse where it was never "
        "trained (0 in the reference profile).",
    ),
    _p(
        "acc_logit_temperature_slope",
        "logit/unit temperature",
        0.9,
        -2,
        10,
        "Logit drop per unit of sampling temperature (capped at 2): a flatter target distribution rejects more drafts "
        "(assumption).",
    ),
    _p(
        "acc_logit_loop",
        "logit",
        4.5,
        -5,
        12,
        "Logit of accepting any draft position while greedy output repeats itself (no decay: a loop is "
        "equally predictable at every depth); fitted to the campaign, whose greedy output was repetitive.",
    ),
    _p(
        "greedy_repeat_onset_tokens",
        "tokens",
        60,
        1,
        5000,
        "Output position after which greedy decoding falls into repetition (degeneration of greedy search); "
        "sampling escapes it. Fitted to the campaign.",
    ),
    # --- output lengths ---
    _p(
        "eos_median_tokens",
        "tokens",
        400,
        1,
        1e5,
        "Median natural answer length (where EOS falls) for content score 0.5.",
    ),
    _p(
        "eos_content_slope",
        "ln(tokens)/unit score",
        0.5,
        -5,
        5,
        "Log-length change of the natural length per unit content score.",
    ),
    _p("eos_sigma", "ln(tokens)", 0.8, 0.0, 3, "Log-normal spread of the natural length across prompts and seeds."),
    _p(
        "loop_period_tokens",
        "tokens",
        24,
        2,
        1000,
        "Period of the repetition greedy output falls into past its natural end.",
    ),
    # --- power of one GPU (rig/sim/power.py; not fitted: the campaign measured no power) ---
    _p(
        "gpu_board_power_w",
        "W",
        600,
        50,
        2000,
        "Board power limit of one GPU: no modelled draw exceeds it (RTX PRO 6000 Blackwell: 600 W).",
    ),
    _p("gpu_idle_w", "W", 70, 0, 2000, "Draw of one GPU with the model loaded and no iteration running."),
    _p(
        "gpu_fixed_w",
        "W",
        300,
        0,
        2000,
        "Draw while a forward's fixed part runs (kernel launches, all-reduce waits, dense and attention weights): "
        "t_fixed_ms and d_fixed_ms.",
    ),
    _p(
        "gpu_memory_w",
        "W",
        420,
        0,
        2000,
        "Draw while a forward streams routed experts or reads context (memory-bound): t_experts_ms and c_ctx terms.",
    ),
    _p(
        "gpu_compute_w",
        "W",
        600,
        0,
        2000,
        "Draw while a forward computes over its tokens (tensor cores): c_tok_ms and d_tok_ms terms, every drafted "
        "token counted whether it is accepted or not.",
    ),
)
SPEC_BY_NAME: dict[str, ParamSpec] = {s.name: s for s in SPECS}

# Where each unfitted value comes from (the fitter marks the ones it fits as "fitted").
DEFAULT_SOURCES: dict[str, str] = {
    "gpu_mem_gb": "fact: RTX PRO 6000 Blackwell has 96 GB",
    "calibrated_tp": "fact: the campaign ran TP=4",
    "weight_gb_total": "assumption: 122 B parameters in bf16",
    "experts_total": "fact: Qwen3.5-122B-A10B model card (256 routed experts)",
    "experts_per_token": "assumption: 8 routed experts per token, as in the Qwen3 MoE family",
    "context_length": "assumption: Qwen3.5 config.json max_position_embeddings",
    "default_chunked_prefill_size": "fact: SGLang heuristic for GPUs under 160 GB (sglang-contract.md 1.3)",
    "default_max_prefill_tokens": "fact: SGLang default --max-prefill-tokens",
    "new_token_ratio": "fact: SGLang's initial new-token ratio (SGLANG_INIT_NEW_TOKEN_RATIO=0.7)",
    "acc_logit_greedy": "assumption: p1 ~ 0.85-0.9 for greedy prose (DeepSeek-V3 report: MTP second-token "
    "acceptance 85-90 %)",
    "acc_logit_temperature_slope": "assumption: T=0.7 lowers p1 from ~0.85 to ~0.75 (speculative sampling accepts "
    "with prob. 1 - TV distance, which grows as temperature flattens the target)",
    "gpu_board_power_w": "fact: RTX PRO 6000 Blackwell (Workstation and Server Edition) board power 600 W",
    "gpu_idle_w": "assumption: ~12 % of board power, as an H200 with a model loaded idles at 80 W of 700 W "
    "(shared/reference/gpu-node.md)",
    "gpu_fixed_w": "assumption: half of board power while launch- and latency-bound kernels run",
    "gpu_memory_w": "assumption: ~70 % of board power for memory-bound kernels (decode of a MoE streams weights)",
    "gpu_compute_w": "assumption: dense tensor-core work runs at the board power limit",
}

# Stated assumptions the profile carries as notes (issue 3, item 4).
DEFAULT_NOTES: dict = {
    "acceptance_assumptions": {
        "greedy (temperature 0)": (
            "prose p1 ~ 0.83, code/repetitive content higher (content score from the prompt: code punctuation and "
            "repeated bigrams); later draft positions lower (decay per position). Greedy output falls into repetition "
            "after greedy_repeat_onset_tokens and, with EOS ignored, past its natural end; repetition accepts with "
            "acc_logit_loop at every position. Fitted: the campaign ran greedy, ignore_eos, ~1,000-token outputs, "
            "described as repetitive with acceptance near 100 %."
        ),
        "sampled (temperature > 0)": (
            "the greedy prose/code acceptance lowered by acc_logit_temperature_slope per unit temperature (T=0.7: p1 "
            "~ 0.73 for prose) and no repetition loop. Not fitted: the campaign measured no sampled traffic; the "
            "direction comes from speculative sampling (acceptance = 1 - total-variation distance between draft and "
            "target, which grows as temperature flattens the target) and from EAGLE/EAGLE-2 results (lower accept "
            "length at T=1 than at T=0). Replace by fitting to real sampled runs: rig sim fit RUN_DIR."
        ),
    },
    "does_not_model": [
        "draft trees (topk > 1), NGRAM/STANDALONE drafts",
        "retraction when the KV pool overflows mid-decode (admission reserves new_token_ratio of max_new_tokens)",
        "overlap scheduling as a separate effect (folded into the fitted per-forward costs)",
        "tp other than calibrated_tp beyond a 1/tp scaling of the bandwidth and compute terms",
    ],
}


@dataclass
class Profile:
    """A full set of parameter values plus provenance notes."""

    values: dict[str, float]
    name: str = "custom"
    notes: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, item: str) -> float:
        # Parameters read like attributes (profile.t_fixed_ms); anything else is a real AttributeError.
        values = self.__dict__.get("values")
        if values is not None and item in values:
            return values[item]
        raise AttributeError(item)

    def with_values(self, **updates: float) -> Profile:
        """A copy with some parameters replaced."""
        unknown = set(updates) - set(SPEC_BY_NAME)
        if unknown:
            raise KeyError(f"unknown profile parameter(s): {', '.join(sorted(unknown))}")
        return Profile({**self.values, **updates}, self.name, dict(self.notes), dict(self.sources))

    @classmethod
    def defaults(cls) -> Profile:
        return cls(
            {s.name: float(s.default) for s in SPECS},
            name="defaults",
            notes=dict(DEFAULT_NOTES),
            sources=dict(DEFAULT_SOURCES),
        )

    def to_yaml(self) -> str:
        params = {}
        for s in SPECS:
            params[s.name] = {
                "value": _round(self.values[s.name]),
                "unit": s.unit,
                "description": s.description,
                "source": self.sources.get(s.name, "assumption"),
            }
        doc = {"name": self.name, **self.notes, "parameters": params}
        return yaml.safe_dump(doc, sort_keys=False, width=110, allow_unicode=True)

    def save(self, path: Path | str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(self.to_yaml())


def _round(v: float) -> float:
    return float(f"{v:.6g}")


class ProfileError(ValueError):
    """A profile file that cannot be used."""


def load_profile(path: Path | str | None = None) -> Profile:
    """Read a profile YAML (default: the shipped reference profile); every parameter must be present and known."""
    p = Path(path) if path else REFERENCE_PROFILE
    try:
        doc = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ProfileError(f"cannot read sim profile {p}: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("parameters"), dict):
        raise ProfileError(f"sim profile {p} has no 'parameters' mapping")
    params = doc.pop("parameters")
    unknown = set(params) - set(SPEC_BY_NAME)
    missing = set(SPEC_BY_NAME) - set(params)
    if unknown or missing:
        raise ProfileError(f"sim profile {p}: unknown {sorted(unknown)}, missing {sorted(missing)}")
    values: dict[str, float] = {}
    sources: dict[str, str] = {}
    for name, entry in params.items():
        value = entry.get("value") if isinstance(entry, dict) else entry
        try:
            if value is None:  # float(None) is a TypeError too: the same message below
                raise TypeError(name)
            values[name] = float(value)
        except (TypeError, ValueError):
            raise ProfileError(f"sim profile {p}: parameter {name} has no numeric value") from None
        if isinstance(entry, dict) and entry.get("source"):
            sources[name] = str(entry["source"])
    name = str(doc.pop("name", p.stem))
    return Profile(values, name=name, notes=doc, sources=sources)
