"""The model's recommended sampling parameters, which SGLang's chat route uses for fields a request leaves out.

configs/model_config.py::get_default_sampling_params: with --sampling-defaults model (the default) the keys
repetition_penalty, temperature, top_k, top_p and min_p that the model's generation_config.json sets (transformers 5
leaves the others None); openai/protocol.py ChatCompletionRequest.to_sampling_params takes the request's value,
else this, else the OpenAI default. /v1/completions and /generate do not use them.

The sim reads generation_config.json from --model-path when it is a local directory (as SGLang does); for a hub id it
cannot read, the profile's ``generation_config`` mapping stands in (none in the reference profile).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

KEYS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p")


class GenerationConfigError(ValueError):
    """A generation_config.json (or profile entry) that cannot be used."""


def chat_defaults(model_path: str, sampling_defaults: str, profile_notes: dict[str, Any]) -> dict[str, Any]:
    """The values the chat route fills in for omitted fields ({} with --sampling-defaults openai)."""
    if sampling_defaults != "model":
        return {}
    path = Path(model_path) / "generation_config.json"
    if path.is_file():
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise GenerationConfigError(f"cannot read {path}: {e}") from None
    else:
        config = profile_notes.get("generation_config") or {}
    if not isinstance(config, dict):
        raise GenerationConfigError(f"generation_config must be a mapping, got {type(config).__name__}")
    return {k: config[k] for k in KEYS if config.get(k) is not None}
