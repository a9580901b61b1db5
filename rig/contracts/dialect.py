"""The request dialects' names and what the server actor probes to decide one: shared by the spec (rig.server), the
manifest and the load generators (rig.loadgen.dialects, which holds what each dialect may carry)."""

from __future__ import annotations

from typing import Literal

DialectName = Literal["plain", "sglang", "vllm"]

# What the engines rig models speak. Any other engine (external, a launched command) is probed, and speaks plain
# OpenAI when no probe identifies it.
ENGINE_DIALECTS: dict[str, DialectName] = {"sim": "sglang", "sglang": "sglang", "vllm": "vllm"}

# The GET paths that identify a server rig did not launch (rig.loadgen.dialects.identify reads their answers).
PROBE_PATHS: tuple[str, ...] = ("/model_info", "/version")
# What an SGLang server runs (its resolved arguments): read from a server rig did not launch that is, or may be, SGLang.
SGLANG_INFO = "/server_info"


def probe_paths(engine: str, asked: DialectName | None) -> tuple[str, ...]:
    """The GET paths the server actor's describe() adds for a server of no engine rig models: those that identify
    it, and SGLang's /server_info unless another dialect was asked for."""
    if engine in ENGINE_DIALECTS or asked not in (None, "sglang"):
        return ()
    return (SGLANG_INFO,) if asked == "sglang" else (*PROBE_PATHS, SGLANG_INFO)
