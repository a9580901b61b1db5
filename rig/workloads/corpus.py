"""Our own text (rig/workloads/data/*.json), loaded once: chat questions and passages, the agent's prompts."""

from __future__ import annotations

from functools import cache
from importlib import resources

from pydantic import BaseModel, ConfigDict


class ChatText(BaseModel):
    """data/chat.json."""

    model_config = ConfigDict(frozen=True)  # its '_about' line is for people

    questions: tuple[str, ...]  # user questions and requests of varied topic and length
    passages: tuple[str, ...]  # paragraph fragments used as pasted context


class AgentText(BaseModel):
    """data/agent.json: system prompt, task templates and test-log phrases for agent sessions."""

    model_config = ConfigDict(frozen=True)

    system_prompt: str
    tasks: tuple[str, ...]
    test_names: tuple[str, ...]
    failure_messages: tuple[str, ...]


def _read(name: str) -> str:
    """The text of the data file ``rig/workloads/data/<name>.json`` (shipped with the package)."""
    return resources.files("rig.workloads").joinpath("data", f"{name}.json").read_text("utf-8")


@cache
def chat() -> ChatText:
    return ChatText.model_validate_json(_read("chat"))


def chat_questions() -> tuple[str, ...]:
    """User questions and requests of varied topic and length."""
    return chat().questions


def chat_passages() -> tuple[str, ...]:
    """Paragraph fragments used as pasted context."""
    return chat().passages


@cache
def agent_text() -> AgentText:
    """System prompt, task templates and test-log phrases for agent sessions."""
    return AgentText.model_validate_json(_read("agent"))
