"""Realistic single-turn traffic: a seeded mix of chat (our own text) and coding requests (real source code).

Each session draws, in a fixed order from its own generator: a sampling seed, chat-or-code, a prompt length and an
output length (max_tokens) from the spec's distributions, then its content. Chat prompts are one of our questions,
preceded by pasted context (our passages) when the drawn length calls for it; code prompts are an instruction plus a
whole-line excerpt of a real source file (``rig.workloads.source``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rig.workloads import corpus, source
from rig.workloads.base import Session, Turn
from rig.workloads.lengths import draw_int, estimate_tokens, tokens_to_chars
from rig.workloads.seeding import request_seed, session_rng
from rig.workloads.spec import WorkloadSpec

CODE_INSTRUCTIONS: tuple[str, ...] = (
    "Explain what this code does, step by step, and point out anything surprising.",
    "Refactor this code to make it easier to read and maintain. Keep the behaviour identical and explain each change.",
    "Write pytest unit tests for this code. Cover normal cases, edge cases and error handling.",
    "Review this code: list possible bugs, performance problems and unclear names, most important first.",
    "Add type hints and docstrings to this code. Return the complete updated code.",
    "Summarise what this module excerpt is responsible for and how its parts fit together.",
    "Rewrite this code in a more idiomatic modern Python style and explain what you changed.",
    "How would you test this code in isolation? Describe what to mock and write two example tests.",
)

# How pasted context and the question are put together; varied so prompts do not all share one prefix.
_FRAMES: tuple[str, ...] = (
    "{context}\n\n{question}",
    "Here are some notes I took:\n\n{context}\n\n{question}",
    "Context:\n{context}\n\nQuestion: {question}",
    'I\'m going to paste a text and then ask you something.\n\n"""\n{context}\n"""\n\n{question}',
)
_MIN_CONTEXT = 80  # below this, pasted context is noise: send the question alone

_LANG = {
    ".py": "python",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".rs": "rust",
    ".go": "go",
    ".java": "java",
    ".js": "javascript",
    ".ts": "typescript",
}


def _needs_context(question: str) -> bool:
    """Questions that refer to 'the text above' only make sense after pasted context."""
    return "above" in question


def fill_text(rng: np.random.Generator, n_chars: int) -> str:
    """``n_chars`` of our passages in a seeded order, cut at a word boundary."""
    passages = corpus.chat_passages()
    parts: list[str] = []
    size = 0
    while size < n_chars:  # cycle through fresh permutations when one pass is not enough
        for k in rng.permutation(len(passages)):
            parts.append(passages[int(k)])
            size += len(passages[int(k)]) + 2
            if size >= n_chars:
                break
    text = "\n\n".join(parts)[:n_chars]
    cut = text.rfind(" ")
    return text[:cut] if cut > n_chars // 2 else text


def chat_prompt(rng: np.random.Generator, target_chars: int) -> str:
    """A question of ours, with pasted context in front when ``target_chars`` leaves room for it."""
    questions = corpus.chat_questions()
    standalone = [q for q in questions if not _needs_context(q)]
    frame = _FRAMES[int(rng.integers(len(_FRAMES)))]
    question = questions[int(rng.integers(len(questions)))]
    n_context = target_chars - len(frame.format(context="", question=question))
    if n_context >= _MIN_CONTEXT:
        return frame.format(context=fill_text(rng, n_context), question=question)
    # Short target: a question alone, the longest-fitting choice being random among those that fit.
    fitting = [q for q in standalone if len(q) <= target_chars]
    return fitting[int(rng.integers(len(fitting)))] if fitting else min(standalone, key=len)


def code_prompt(rng: np.random.Generator, spec: WorkloadSpec, target_tokens: int) -> tuple[str, str]:
    """An instruction plus a real source excerpt of about ``target_tokens``; returns (prompt, 'path:line')."""
    instruction = CODE_INSTRUCTIONS[int(rng.integers(len(CODE_INSTRUCTIONS)))]
    tree = source.source_tree(spec.code_dir)
    text_chars = len(instruction) + 40  # instruction, fence and header line
    code_chars = max(
        200,
        tokens_to_chars(target_tokens, spec.code_chars_per_token)
        - int(text_chars * spec.code_chars_per_token / spec.text_chars_per_token),
    )
    ex = source.excerpt(tree, rng, code_chars)
    lang = _LANG.get(ex.path[ex.path.rfind(".") :], "")
    prompt = f"{instruction}\n\n```{lang}\n# {ex.path}, from line {ex.first_line}\n{ex.text.rstrip()}\n```"
    return prompt, f"{ex.path}:{ex.first_line}"


def build(spec: WorkloadSpec, seed: int, indices: Sequence[int], id_prefix: str, stream: int) -> list[Session]:
    """Sessions ``indices`` of the realistic workload (one turn each)."""
    out = []
    for i in indices:
        rng = session_rng(seed, spec.name, i, stream)
        # Scalars first, in a fixed order, so content choices never shift the lengths (and vice versa).
        req_seed = request_seed(rng)
        is_code = bool(rng.random() < spec.code_fraction)
        prompt_dist = spec.code_prompt_tokens if is_code else spec.chat_prompt_tokens
        output_dist = spec.code_output_tokens if is_code else spec.chat_output_tokens
        prompt_tokens = draw_int(prompt_dist, rng)
        max_tokens = draw_int(output_dist, rng)
        extra: dict[str, object] = {"kind": "code" if is_code else "chat", "target_prompt_tokens": prompt_tokens}
        if is_code:
            prompt, where = code_prompt(rng, spec, prompt_tokens)
            extra["source"] = where
            extra["est_prompt_tokens"] = estimate_tokens(prompt, spec.code_chars_per_token)
        else:
            prompt = chat_prompt(rng, tokens_to_chars(prompt_tokens, spec.text_chars_per_token))
            extra["est_prompt_tokens"] = estimate_tokens(prompt, spec.text_chars_per_token)
        sid = f"{id_prefix}-{i:06d}"
        turn = Turn(
            request_id=f"{sid}-t0",
            messages=({"role": "user", "content": prompt},),
            max_tokens=spec.max_tokens or max_tokens,
            **spec.sampling(),
            seed=req_seed,
            category="code" if is_code else "chat",
        )
        out.append(Session(session_id=sid, turns=(turn,), extra=extra))
    return out
