"""What a request's content and sampling imply for the model: content score, natural length, acceptance, seeds.

Shared by the real-time server and the virtual-time fitter so both simulate the same physics.
"""

from __future__ import annotations

from dataclasses import dataclass

from rig.sim.acceptance import RequestAcceptance, request_acceptance
from rig.sim.profile import Profile
from rig.sim.scheduler import Req
from rig.sim.text import OutputStream, content_score, natural_length, stable_hash


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters the model reacts to."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    ignore_eos: bool = False
    seed: int | None = None  # sampling_seed; None when sampled draws one from the server's RNG

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


@dataclass(frozen=True)
class RequestPlan:
    score: float
    natural_len: int
    eos_at: int | None
    loop_from: int | None
    acceptance: RequestAcceptance
    output_seed: int


def prompt_key(ids: list[int]) -> int:
    """The identity of a prompt for everything derived from it (the same in the server and the fitter)."""
    return stable_hash("prompt", ids)


def plan_request(profile: Profile, steps: int, prompt_tokens: list[str], key: int, s: Sampling) -> RequestPlan:
    """Derive everything content- and sampling-dependent; greedy plans depend on the prompt alone."""
    score = content_score(prompt_tokens)
    temperature = 0.0 if s.greedy else s.temperature
    if s.greedy:
        out_seed = stable_hash("out", key)
    else:
        out_seed = stable_hash("out", key, s.seed, round(s.temperature, 6), round(s.top_p, 6), s.top_k)
    nat = natural_length(out_seed, score, profile.eos_median_tokens, profile.eos_content_slope, profile.eos_sigma)
    eos_at = None if s.ignore_eos else nat
    loop_from = None
    if s.greedy:
        # Greedy search degenerates into repetition after an onset; with EOS ignored, at the latest once the
        # natural answer is over. Sampling escapes loops.
        onset = max(1, int(round(profile.greedy_repeat_onset_tokens)))
        if s.ignore_eos:
            loop_from = min(onset, nat)
        elif onset < nat:
            loop_from = onset
    acc = request_acceptance(profile, score, temperature, max(0, steps))
    return RequestPlan(score, nat, eos_at, loop_from, acc, out_seed)


def build_req(
    rid: str, plan: RequestPlan, prompt_len: int, s: Sampling, accept_seed: int, cached: int = 0, user: object = None
) -> Req:
    return Req(
        rid,
        prompt_len,
        s.max_new_tokens,
        plan.acceptance,
        accept_seed,
        cached=cached,
        eos_at=plan.eos_at,
        loop_from=plan.loop_from,
        user=user,
    )


def output_stream(profile: Profile, plan: RequestPlan) -> OutputStream:
    return OutputStream(plan.output_seed, plan.score, plan.loop_from, int(profile.loop_period_tokens), plan.eos_at)
