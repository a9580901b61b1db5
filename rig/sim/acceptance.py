"""Per-position acceptance of draft tokens: a chain in which position i is accepted only if 1..i-1 were.

Position i (1-based) is accepted with probability p_i = sigmoid(L - decay * (i - 1) - beyond * max(0, i - trained)),
where ``trained`` is the positions the draft head was trained for (0: no limit) and the logit L depends on
the sampling regime and the content: L = greedy_logit + content_slope * (score - 0.5) - temperature_slope * min(T, 2).
Greedy output that has fallen into repetition (past the greedy repeat onset, or past its natural end with EOS
ignored) uses the loop logit at every position instead: a loop is as predictable four tokens ahead as one.
A verify step then commits accepted + 1 tokens (the bonus token from the target).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rig.sim.profile import Profile


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def chain_survival(logit1: float, decay: float, k: int, trained: int = 0, beyond: float = 0.0) -> tuple[float, ...]:
    """c_j = P(at least j drafts accepted) = p_1 * ... * p_j, for j = 1..k (non-increasing)."""
    out, c = [], 1.0
    for i in range(k):
        untrained = max(0, i + 1 - trained) if trained > 0 else 0
        c *= sigmoid(logit1 - decay * i - beyond * untrained)
        out.append(c)
    return tuple(out)


def draw_accepted(survival: tuple[float, ...], u: float) -> int:
    """Accepted drafts for one verify from a single uniform u: the largest j with u < c_j (exact chain law)."""
    j = 0
    for c in survival:
        if u < c:
            j += 1
        else:
            break
    return j


def expected_accept_length(survival: tuple[float, ...]) -> float:
    """Mean tokens committed per verify (accepted drafts + the bonus token)."""
    return 1.0 + sum(survival)


@dataclass(frozen=True)
class RequestAcceptance:
    """The two chains one request uses: its normal regime and, for greedy with EOS ignored, the repetition loop."""

    normal: tuple[float, ...]
    loop: tuple[float, ...]


def regime_logit(profile: Profile, score: float, temperature: float) -> float:
    """Logit of accepting draft position 1 for this content score and temperature."""
    logit = profile.acc_logit_greedy + profile.acc_logit_content_slope * (score - 0.5)
    if temperature > 0:
        logit -= profile.acc_logit_temperature_slope * min(temperature, 2.0)
    return logit


def request_acceptance(profile: Profile, score: float, temperature: float, k: int) -> RequestAcceptance:
    decay = profile.acc_logit_position_decay
    trained, beyond = int(round(profile.draft_trained_positions)), profile.acc_logit_beyond_trained
    normal = chain_survival(regime_logit(profile, score, temperature), decay, k, trained, beyond)
    loop = chain_survival(profile.acc_logit_loop, 0.0, k, trained, beyond)  # even a loop is drafted by that head
    return RequestAcceptance(normal, loop)
