"""Agentic coding sessions: a shared system prompt and a task, then one tool output per later turn.

Turn 0 sends the system prompt (the same for every session, as real agent tools share theirs) and a task naming a
real source file of the session. Each later turn adds one tool-output-like chunk (file read, grep, test log or
directory listing; ``rig.workloads.tools``) as a user message; the load generator prepends the conversation so far,
including the assistant's real replies, so the resent prefix grows turn by turn. Turn j waits ``think_time_s`` after
turn j-1 ends. Turns stop early when the estimated conversation (our chunks plus every reply at its max_tokens) would
exceed ``agent_max_context_tokens`` (checked with the drawn sizes, before any text is built).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rig.workloads import corpus, source, tools
from rig.workloads.base import Session, Turn
from rig.workloads.lengths import draw, draw_int, estimate_tokens, tokens_to_chars
from rig.workloads.seeding import request_seed, session_rng
from rig.workloads.spec import WorkloadSpec

TOOLS: tuple[str, ...] = ("read_file", "grep", "run_tests", "list_dir")
TOOL_WEIGHTS: tuple[float, ...] = (0.45, 0.25, 0.2, 0.1)  # agents read files most, then search, then test
_FOCUS_MIN_CHARS = 4000  # the session's file must be big enough to read parts of


def build(spec: WorkloadSpec, seed: int, indices: Sequence[int], id_prefix: str, stream: int) -> list[Session]:
    """Sessions ``indices`` of the agentic workload (several turns each)."""
    text = corpus.agent_text()
    tree = source.source_tree(spec.code_dir)
    system = text.system_prompt
    out = []
    for i in indices:
        rng = session_rng(seed, spec.name, i, stream)
        n_turns = draw_int(spec.agent_turns, rng)
        focus = source.pick_file(tree, rng, _FOCUS_MIN_CHARS)
        names = source.names_defined_in(tree.root, focus) or ("main",)
        name = names[int(rng.integers(len(names)))]
        task = text.tasks[int(rng.integers(len(text.tasks)))].format(path=focus, name=name)
        sid = f"{id_prefix}-{i:06d}"
        turns: list[Turn] = []
        context = estimate_tokens(system + task, spec.text_chars_per_token)
        for j in range(n_turns):
            # Scalars first, in a fixed order per turn.
            req_seed = request_seed(rng)
            max_tokens = spec.max_tokens or draw_int(spec.agent_output_tokens, rng)
            messages: tuple[dict[str, str], ...]  # what this turn adds (Turn.messages)
            if j == 0:
                messages = ({"role": "system", "content": system}, {"role": "user", "content": task})
                think = 0.0
                added = 0
            else:
                think = draw(spec.think_time_s, rng)
                n_tokens = draw_int(spec.tool_output_tokens, rng)
                tool = TOOLS[int(rng.choice(len(TOOLS), p=TOOL_WEIGHTS))]
                # Decide before building the text: a chunk that would overflow the context is never generated.
                if context + n_tokens + max_tokens > spec.agent_max_context_tokens:
                    break
                call, body = _tool_output(
                    tool, tree, rng, tokens_to_chars(n_tokens, spec.code_chars_per_token), focus, name
                )
                content = f"Tool result for {call}:\n{body}"
                messages = ({"role": "user", "content": content},)
                added = estimate_tokens(content, spec.code_chars_per_token)
            context += added + max_tokens
            turns.append(
                Turn(
                    request_id=f"{sid}-t{j}",
                    messages=messages,
                    max_tokens=max_tokens,
                    **spec.sampling(),
                    seed=req_seed,
                    think_time_s=think,
                    category="agent",
                )
            )
        out.append(
            Session(
                session_id=sid,
                turns=tuple(turns),
                extra={"focus": focus, "planned_turns": n_turns, "est_context_tokens": context},
            )
        )
    return out


def _tool_output(
    tool: str, tree: source.SourceTree, rng: np.random.Generator, n_chars: int, focus: str, name: str
) -> tuple[str, str]:
    """Dispatch to one tool's generator: reads mostly of the session's file, sometimes of another."""
    if tool == "read_file":
        path = focus if rng.random() < 0.6 else source.pick_file(tree, rng, n_chars)
        return tools.read_file(tree, rng, n_chars, path)
    if tool == "grep":
        return tools.grep(tree, rng, n_chars, name)
    if tool == "run_tests":
        return tools.run_tests(tree, rng, n_chars, focus)
    return tools.list_dir(tree, rng, n_chars)
