"""The request-body fields rig sets itself, and why none of them may come from ``--extra-body``.

Below both the spec (rig.server.spec refuses them when it reads a run spec) and the generator (rig.loadgen.bodies,
whose typed bodies every one of these covers: tests/unit/test_dialects.py holds the two together).
"""

from __future__ import annotations

# Why a field may not come from --extra-body: rig sets it (or what it governs) itself, and records what it set. An
# extra field wins over rig's own (Dialect.finish), so it would make the record, and every figure read from it (TPOT at
# a fixed length, the greedy losslessness check, pairing), state a request that was not the one sent.
_WHY: dict[str, str] = {
    "sampling": "rig sends the workload's {key} and records it with every request (--workload-opt {key}=...)",
    "neutral": "rig sends min_p 0 and repetition_penalty 1, so that the server fills in nothing from the model's "
    "generation_config.json and the records' sampling is what ran",
    "length": "rig sends the workload's max_tokens and records it (--workload-opt max_tokens=N)",
    "seed": "rig sends per-request seeds drawn from --seed and records them",
    "request": "rig builds the request from the workload (its prompt, its sampling) and records it",
    "stream": "rig streams every request and reads its usage and token ids in the way it asks for them",
    "rid": "rig gives every attempt ids of its own (SGLang aborts a request under an id it just served)",
    "one output": "rig reads and records one output per request",
    "end": "where an output ends is the workload's (max_tokens, ignore_eos), and the record says which it was",
    "echo": "the prompt would come back as output and be counted as completion tokens",
}
_FIELD_WHY: dict[str, str] = {
    **dict.fromkeys(("temperature", "top_p", "top_k", "ignore_eos"), _WHY["sampling"]),
    **dict.fromkeys(("min_p", "repetition_penalty"), _WHY["neutral"]),
    **dict.fromkeys(("max_tokens", "max_completion_tokens", "max_new_tokens"), _WHY["length"]),
    **dict.fromkeys(("seed", "sampling_seed"), _WHY["seed"]),
    **dict.fromkeys(("model", "prompt", "messages", "text", "input_ids", "sampling_params"), _WHY["request"]),
    **dict.fromkeys(("stream", "stream_options", "return_token_ids", "return_spec_tokens_details"), _WHY["stream"]),
    **dict.fromkeys(("rid", "request_id"), _WHY["rid"]),  # vLLM's bodies take request_id
    **dict.fromkeys(("n", "best_of"), _WHY["one output"]),
    **dict.fromkeys(("stop", "stop_token_ids", "min_tokens", "min_new_tokens"), _WHY["end"]),
    "echo": _WHY["echo"],
}
RIG_FIELDS = frozenset(_FIELD_WHY)


def rig_field_reason(key: str) -> str | None:
    """Why ``key`` may not be an extra body field (rig sets it, or what it governs, itself), or None."""
    why = _FIELD_WHY.get(key)
    return None if why is None else why.format(key=key)
