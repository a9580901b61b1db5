"""A note before the points whose concurrency the server cannot run at once: the rest wait in its queue.

SGLang admits at most its effective max running requests per DP rank (``/server_info``'s
``internal_states[i].effective_max_running_requests_per_dp``; with speculation it is lowered, 48 by default on
0.5.17/0.5.23), so at a closed-loop concurrency above the total the extra requests queue in the server: TTFT then
counts the wait, and the level measures the server's queue as much as its decoding.
"""

from __future__ import annotations

from typing import Any

from rig.contracts.server import EffectiveConfig


def dp_ranks(server_info: Any) -> int:
    """DP ranks of the server: one internal_states entry per rank (entrypoints/http_server.py), else dp_size."""
    if not isinstance(server_info, dict):
        return 1
    states = server_info.get("internal_states")
    if isinstance(states, list) and states:
        return len(states)
    dp = server_info.get("dp_size")
    return dp if isinstance(dp, int) and dp > 0 else 1


def queue_note(
    config_id: str, effective: EffectiveConfig | None, server_info: Any, levels: list[int], mode: str
) -> str | None:
    """The note for the closed-loop ``levels`` above what the server runs at once, or None."""
    mrr = effective.effective.get("max_running_requests") if effective is not None else None
    if mode != "closed" or not isinstance(mrr, int) or mrr <= 0:
        return None
    dp = dp_ranks(server_info)
    cap = mrr * dp
    above = sorted(c for c in set(levels) if c > cap)
    if not above:
        return None
    per = f" ({mrr} per DP rank x {dp})" if dp > 1 else ""
    return (
        f"server {config_id}: concurrency {', '.join(map(str, above))} exceeds the server's effective max running "
        f"requests {cap}{per}: requests queue in the server there (TTFT counts the wait)"
    )
