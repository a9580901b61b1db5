"""Trained models for speculative decoding on a GPU: a small target and its drafts, so acceptance means something.

Run with the engine's interpreter (torch, transformers, tokenizers, safetensors), from the repository root:

    python3 -m rig.server.spec_models OUT_DIR            (an H200: about 4-5 minutes)
    python3 -m rig.server.spec_models --quick OUT_DIR    (toy shapes and a few steps, on a CPU: tests the recipe)

From one seed, the tiny model's tokenizer (rig.server.tiny_model: a 4,096-token byte-level BPE trained on the
Python standard library's own .py files) and the standard library as corpus, it writes:

- ``OUT_DIR/target``: a Llama trained on the corpus, the model the engine serves;
- ``OUT_DIR/draft``: a far smaller Llama distilled from the target (same tokenizer), for
  ``--speculative-algorithm STANDALONE --speculative-draft-model-path OUT_DIR/draft`` (vLLM: ``draft_model``);
- ``OUT_DIR/eagle``: an EAGLE head trained on the target's hidden states, in the format SGLang's
  ``LlamaForCausalLMEagle`` loads (srt/models/llama_eagle.py: ``fc`` over [token embedding, target feature], one
  decoder layer whose input norm is skipped, the output ``hidden_states + residual`` with no final norm; weights
  named without the ``model.`` prefix, which its ``load_weights`` adds; the embedding and LM head are the target's,
  shared at load by ``EAGLEWorker``), for ``--speculative-algorithm EAGLE``, the only kind (with EAGLE3) that
  SGLang's adaptive speculation runs with (srt/speculative/adaptive_spec_params.py).

Every model trains a fixed number of steps on batches drawn in a fixed order from a seeded generator: the same
recipe gives the same models up to the GPU's floating-point non-determinism. ``train_report.json`` holds held-out
figures (the target's next-token accuracy, how often each draft's greedy token matches the target's). A stamp
holds the recipe's hash; a directory with a matching stamp is returned at once. Only the standard library is
imported at module level (the rig's own venv imports this module for ``RECIPE``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

STAMP = ".rig-spec-models.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")

_LLAMA = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
RECIPE: dict[str, Any] = {
    "version": 1,
    "seed": 20261202,
    "seq_len": 1024,
    "batch": 32,
    "max_position_embeddings": 8192,
    "holdout_fraction": 0.02,
    # 24 layers of 1,024 (0.28 B parameters): deep enough that a decode step costs the GPU far more than the draft's
    # (small models are launch-bound), trained on ~26 M tokens (about 3 passes over the standard library)
    "target": {
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "steps": 800,
        "lr": 1e-3,
    },
    "draft": {
        "hidden_size": 384,
        "intermediate_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "steps": 500,
        "lr": 2e-3,
    },
    "eagle": {"steps": 400, "lr": 1e-3, "w_logits": 0.1, "w_second_step": 0.5},
}
# Toy shapes for a CPU: the same code paths, seconds instead of minutes (tests, a dry run of the recipe).
QUICK: dict[str, Any] = {
    **RECIPE,
    "seq_len": 64,
    "batch": 2,
    "max_position_embeddings": 512,
    "corpus_files": 40,
    "target": {**RECIPE["target"], **dict(zip(_LLAMA, (64, 128, 2, 4, 2), strict=True)), "steps": 3},
    "draft": {**RECIPE["draft"], **dict(zip(_LLAMA, (32, 64, 1, 2, 1), strict=True)), "steps": 2},
    "eagle": {**RECIPE["eagle"], "steps": 2},
}


def recipe_hash(recipe: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def is_built(out_dir: str | Path, recipe: dict[str, Any] = RECIPE) -> bool:
    try:
        return json.loads((Path(out_dir) / STAMP).read_text()).get("recipe") == recipe_hash(recipe)
    except (OSError, ValueError):
        return False


def corpus_texts(limit_files: int | None = None) -> list[str]:
    """Every standard-library .py file outside tests and site-packages, in sorted order (deterministic for a given
    Python install): more text than the tokenizer's 300 files, so the target learns code rather than memorising."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in stdlib.rglob("*.py") if not {"site-packages", "test", "tests", "idle_test"} & set(p.parts)
    )
    return [p.read_bytes().decode("utf-8", errors="replace") for p in files[:limit_files]]


def build_spec_models(out_dir: str | Path, recipe: dict[str, Any] = RECIPE, log: Any = print) -> Path:
    """Train the target, the standalone draft and the EAGLE head into ``out_dir`` (unless already built)."""
    from rig.server import spec_training as train
    from rig.server.tiny_model import _build_tokenizer

    out = Path(out_dir).resolve()
    if is_built(out, recipe):
        return out
    t0 = time.monotonic()
    tmp = out.parent / f".{out.name}.building"
    shutil.rmtree(tmp, ignore_errors=True)
    for sub in ("target", "draft", "eagle"):
        (tmp / sub).mkdir(parents=True)
    tok = _build_tokenizer(tmp / "target")
    for sub in ("draft", "eagle"):
        for name in TOKENIZER_FILES:
            if (tmp / "target" / name).exists():
                shutil.copy(tmp / "target" / name, tmp / sub / name)
    log(f"spec_models: tokenizer ready ({len(tok)} tokens) after {time.monotonic() - t0:.0f} s")
    data = train.token_stream(tok, corpus_texts(recipe.get("corpus_files")), recipe)
    log(f"spec_models: corpus {data.train.numel():,} training tokens, {data.held.numel():,} held out")
    report: dict[str, Any] = {"corpus_tokens": int(data.train.numel()), "held_out_tokens": int(data.held.numel())}
    target, report["target"] = train.train_target(data, tok, recipe, log)
    train.save_llama(target, tmp / "target")
    draft, report["draft"] = train.train_draft(data, tok, target, recipe, log)
    train.save_llama(draft, tmp / "draft")
    head, report["eagle"] = train.train_eagle(data, target, recipe, log)
    train.save_eagle(head, target, tmp / "eagle")
    report["build_s"] = round(time.monotonic() - t0, 1)
    report["device"] = train.device_name()
    (tmp / "train_report.json").write_text(json.dumps(report, indent=1, sort_keys=True))
    stamp = {"recipe": recipe_hash(recipe), "recipe_fields": recipe, "report": report}
    (tmp / STAMP).write_text(json.dumps(stamp, indent=1, sort_keys=True))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    log(f"spec_models: done in {report['build_s']} s: {json.dumps(report, sort_keys=True)}")
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    recipe = RECIPE
    if args and args[0] == "--quick":
        recipe, args = QUICK, args[1:]
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m rig.server.spec_models [--quick] OUT_DIR", file=sys.stderr)
        return 2
    try:
        print(build_spec_models(args[0], recipe, log=lambda m: print(m, file=sys.stderr, flush=True)))
    except ImportError as e:
        print(f"spec_models: {e}; run this with the engine's python (torch, transformers)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
