"""Our own text (rig/workloads/data/*.json), loaded once: chat questions and passages, the agent's prompts."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any


@cache
def load(name: str) -> dict[str, Any]:
    """The parsed data file ``rig/workloads/data/<name>.json`` (shipped with the package)."""
    return json.loads(resources.files("rig.workloads").joinpath("data", f"{name}.json").read_text("utf-8"))


def chat_questions() -> tuple[str, ...]:
    """User questions and requests of varied topic and length."""
    return tuple(load("chat")["questions"])


def chat_passages() -> tuple[str, ...]:
    """Paragraph fragments used as pasted context."""
    return tuple(load("chat")["passages"])


def agent_text() -> dict[str, Any]:
    """System prompt, task templates and test-log phrases for agent sessions."""
    return load("agent")
