"""A tiny Llama model built locally, so a real engine can be tested with no model hub.

Run with the *engine venv's* interpreter (it needs torch, transformers and tokenizers, which the rig's own venv
does not have):

    .cache/vllm-venv/bin/python -m rig.server.tiny_model OUT_DIR      (from the repo root), or
    .cache/vllm-venv/bin/python rig/server/tiny_model.py OUT_DIR
    python3 -m rig.server.tiny_model --preset gpu-1b OUT_DIR          (~1.0 B parameters, 2 GB in bf16, for a GPU)

The tokenizer is a byte-level BPE trained on a sorted, fixed selection of the Python standard library's own .py
files; the weights are random from a fixed seed. Its text is nonsense, but every byte on the wire, every scheduler
decision and every counter is the engine's own. The result is cached: a directory holding a stamp whose recipe
matches is returned at once. Only the standard library is imported at module level, so the rig's own venv can
import this module (for ``RECIPE`` and ``is_built``) without torch.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

STAMP = ".rig-tiny-model.json"

# Everything that decides the model's bytes. Change anything here and the cached model is rebuilt.
RECIPE: dict[str, Any] = {
    "version": 1,
    "corpus_files": 300,
    "corpus_max_bytes_per_file": 200_000,
    "vocab_size": 4096,
    "special_tokens": ["<s>", "</s>", "<pad>"],
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "seed": 1234,
    "dtype": "bfloat16",
}

# Larger shapes on the same tokenizer, for loading a real GPU (random weights; the text is nonsense at any size).
# gpu-1b: TinyLlama-1.1B's layer shape (22 x [2048 hidden, 5632 MLP, 32 heads, 4 KV heads]) on a 4,096-token
# vocabulary: 0.98 B parameters, 1.97 GB in bf16.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": RECIPE,
    "gpu-1b": {
        **RECIPE,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
    },
}

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<s>' + message['role'] + '\n' + message['content'] + '</s>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<s>assistant\n' }}{% endif %}"
)


def recipe_hash(preset: str = "tiny") -> str:
    return hashlib.sha256(json.dumps(PRESETS[preset], sort_keys=True).encode()).hexdigest()[:16]


def is_built(out_dir: str | os.PathLike[str], preset: str = "tiny") -> bool:
    stamp = Path(out_dir) / STAMP
    try:
        return json.loads(stamp.read_text()).get("recipe") == recipe_hash(preset)
    except (OSError, ValueError):
        return False


def corpus_files(n: int = RECIPE["corpus_files"]) -> list[Path]:
    """The first ``n`` standard-library .py files in sorted order (deterministic for a given Python install)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in stdlib.rglob("*.py")
        if "site-packages" not in p.parts and "test" not in p.parts and "tests" not in p.parts
    )
    if len(files) < n:
        raise RuntimeError(f"only {len(files)} .py files under {stdlib}; need {n}")
    return files[:n]


def _corpus() -> list[str]:
    limit = RECIPE["corpus_max_bytes_per_file"]
    return [p.read_bytes()[:limit].decode("utf-8", errors="replace") for p in corpus_files()]


def _build_tokenizer(out: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bos, eos, pad = RECIPE["special_tokens"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=RECIPE["vocab_size"],
        special_tokens=list(RECIPE["special_tokens"]),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        model_max_length=RECIPE["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def _build_weights(out: Path, tok: Any, recipe: dict[str, Any]) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(recipe["seed"])
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=recipe["hidden_size"],
        intermediate_size=recipe["intermediate_size"],
        num_hidden_layers=recipe["num_hidden_layers"],
        num_attention_heads=recipe["num_attention_heads"],
        num_key_value_heads=recipe["num_key_value_heads"],
        max_position_embeddings=recipe["max_position_embeddings"],
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    if recipe is RECIPE:
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)  # the tiny model's bytes, as they always were
    else:
        # Larger presets are built directly in bf16 (on the GPU when there is one): initialising 1 B parameters in
        # fp32 on the CPU first takes minutes of a GPU node's time.
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
                model = LlamaForCausalLM(cfg)
        finally:
            torch.set_default_dtype(torch.float32)
    model.config.dtype = recipe["dtype"]  # recorded in config.json; vLLM's --dtype auto reads it
    model.save_pretrained(out)


def build_tiny_model(out_dir: str | os.PathLike[str], preset: str = "tiny") -> Path:
    """Build the model of ``preset`` into ``out_dir`` unless a matching stamp is there already; return it.

    Safe against concurrent callers (a lock file beside the directory) and against a build cut off midway (it is
    built in a temporary sibling directory and renamed into place).
    """
    recipe = PRESETS[preset]
    out = Path(out_dir).resolve()
    if is_built(out, preset):
        return out
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_built(out, preset):
            return out
        t0 = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            tok = _build_tokenizer(tmp)
            _build_weights(tmp, tok, recipe)
            size = sum(p.stat().st_size for p in tmp.iterdir() if p.is_file())
            (tmp / STAMP).write_text(
                json.dumps(
                    {
                        "recipe": recipe_hash(preset),
                        "preset": preset,
                        "recipe_fields": recipe,
                        "vocab_size": len(tok),
                        "build_s": round(time.monotonic() - t0, 2),
                        "size_bytes": size,
                    },
                    indent=1,
                    sort_keys=True,
                )
            )
            tmp.chmod(0o755)  # mkdtemp makes it 0700
            if out.exists():
                shutil.rmtree(out)
            tmp.rename(out)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    preset = "tiny"
    if len(args) == 3 and args[0] == "--preset" and args[1] in PRESETS:
        preset, args = args[1], args[2:]
    if len(args) != 1 or args[0].startswith("-"):
        print(f"usage: python -m rig.server.tiny_model [--preset {'|'.join(PRESETS)}] OUT_DIR", file=sys.stderr)
        return 2
    try:
        out = build_tiny_model(args[0], preset)
    except ImportError as e:
        print(f"tiny_model: {e}; run this with the engine venv's python (scripts/vllm-env.sh)", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
