"""The unit a workload produces and a load generator consumes: sessions of one or more turns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Turn:
    """One request of a session.

    ``messages`` holds only what this turn adds to the conversation (for a first turn: system + user; later: the
    new user/tool message). The load generator prepends the history, including the assistant's real replies, so the
    shared prefix grows as it does in an agent session. ``prompt`` is the same content rendered as plain text, for
    APIs without a chat template.
    """

    request_id: str
    messages: tuple[dict[str, str], ...]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    ignore_eos: bool = False
    seed: int | None = None
    think_time_s: float = 0.0  # pause before sending this turn (after the previous turn ended)
    category: str = "chat"

    @property
    def prompt(self) -> str:
        """This turn's own messages as plain text (for a first turn, the whole prompt of a completion-style API)."""
        return render_messages(self.messages)


@dataclass(frozen=True)
class Session:
    """A sequence of turns sent one after another on one connection slot; the unit of concurrency.

    ``arrival_s`` is the offset from the level's start at which the session's first turn is due (open loop and
    trace replay); closed-loop levels ignore it.
    """

    session_id: str
    turns: tuple[Turn, ...]
    arrival_s: float | None = None
    # How the workload made the session (source file or entry, planned turns, estimates): never sent or recorded;
    # the workload tests check generated content against it.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_requests(self) -> int:
        return len(self.turns)


def render_messages(messages: list[dict[str, str]] | tuple[dict[str, str], ...]) -> str:
    """Plain-text rendering of a conversation for completion-style APIs (no tokenizer chat template on the client)."""
    parts = []
    for m in messages:
        parts.append(f"<|{m['role']}|>\n{m['content']}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)
