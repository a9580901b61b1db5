"""Whether a server configuration runs SGLang's adaptive speculation, and with which candidate table: from the
launch's arguments (``--speculative-adaptive``, ``--speculative-adaptive-config FILE``) and what /server_info says
it resolved (``speculative_adaptive``, ``speculative_adaptive_config``; SGLang switches adaptive off with a warning
where it cannot run it, adaptive_spec_params.py ``adaptive_unsupported_reason``).

An adaptive point's steps are the steps it starts at, not a fixed setting: the table says what it may switch to.
"""

from __future__ import annotations

from typing import Any

from rig.contracts.adaptive import AdaptiveTable, AdaptiveTableError, Slots, default_slots, read_config_file
from rig.server.spec import ServerConfig

FLAG = "--speculative-adaptive"
CONFIG_FLAG = "--speculative-adaptive-config"


def _args(cfg: ServerConfig) -> tuple[str, ...]:
    return tuple(cfg.extra_args) + tuple(cfg.command)


def config_path(args: tuple[str, ...]) -> str | None:
    """The value of --speculative-adaptive-config in an argument list (either spelling), else None."""
    for i, a in enumerate(args):
        if a == CONFIG_FLAG and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(CONFIG_FLAG + "="):
            return a.split("=", 1)[1]
    return None


def asked_adaptive(cfg: ServerConfig) -> bool:
    """The launch asks for adaptive speculation (SGLang or the simulated server)."""
    return cfg.engine in ("sglang", "sim", "command", "external") and FLAG in _args(cfg)


def config_file_slots(cfg: ServerConfig) -> Slots | None:
    """The slots of the config file the launch names (read at spec time: AdaptiveTableError when SGLang would refuse
    it), None when it names none."""
    path = config_path(_args(cfg))
    return read_config_file(path) if path is not None else None


def adaptive_table(cfg: ServerConfig, server_info: Any) -> tuple[AdaptiveTable | None, list[str]]:
    """The configuration's adaptive table (None: not adaptive) and warnings (asked for but switched off)."""
    info = server_info if isinstance(server_info, dict) and "http_status" not in server_info else {}
    asked = asked_adaptive(cfg)
    said = info.get("speculative_adaptive")
    if said is False and asked:
        return None, [
            f"server {cfg.config_id()}: --speculative-adaptive was asked for but /server_info says "
            "speculative_adaptive=False (SGLang switches it off where it cannot run it: EAGLE/EAGLE3 with topk 1 "
            "only); its points ran fixed steps"
        ]
    if not (asked or said is True):
        return None, []
    path = info.get("speculative_adaptive_config") or config_path(_args(cfg))
    startup = info.get("speculative_num_steps") if isinstance(info.get("speculative_num_steps"), int) else cfg.steps
    if path:
        try:
            slots = read_config_file(str(path))
            note = None
        except AdaptiveTableError as e:  # a file on the server's machine the driver cannot read
            slots, note = {}, f"candidate table unknown here ({e})"
        return AdaptiveTable(
            slots=slots, startup_steps=startup, source=f"config file {path}", config_file=str(path), note=note
        ), []
    version = info.get("version") if isinstance(info.get("version"), str) else None
    slots, source, note = default_slots(version)
    return AdaptiveTable(slots=slots, startup_steps=startup, source=source, note=note), []
