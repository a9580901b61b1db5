"""Time of one forward pass: target model (prefill or verify) and draft (MTP head), from the profile.

The target is a memory-bound MoE: a forward pays a fixed cost, the share of routed experts its tokens touch
(each token picks experts_per_token of experts_total, so N tokens touch 1 - (1 - k/E)^N of them), a small per-token
compute cost and an attention cost proportional to the context it reads. Timing parameters are calibrated at
calibrated_tp GPUs; at another tp the bandwidth- and compute-bound terms scale with calibrated_tp / tp.
"""

from __future__ import annotations

import math

from rig.sim.profile import Profile


class ForwardCost:
    """Seconds per forward, precomputed from a profile for one tp."""

    __slots__ = ("t_fixed", "t_experts", "c_tok", "c_ctx", "d_fixed", "d_tok", "s_fixed", "h_chunk", "_ln_miss")

    def __init__(self, profile: Profile, tp: int):
        scale = profile.calibrated_tp / tp
        self.t_fixed = profile.t_fixed_ms / 1000.0
        self.t_experts = profile.t_experts_ms / 1000.0 * scale
        self.c_tok = profile.c_tok_ms / 1000.0 * scale
        self.c_ctx = profile.c_ctx_ms_per_ktok / 1e6 * scale  # per context token
        self.d_fixed = profile.d_fixed_ms / 1000.0
        self.d_tok = profile.d_tok_ms / 1000.0 * scale
        self.s_fixed = profile.spec_fixed_ms / 1000.0
        self.h_chunk = profile.host_chunk_ms / 1000.0
        self._ln_miss = math.log(1.0 - profile.experts_per_token / profile.experts_total)

    def target(self, n_tokens: int, ctx_tokens: int) -> float:
        """One target forward over n_tokens new tokens reading ctx_tokens of context."""
        touched = 1.0 - math.exp(n_tokens * self._ln_miss)
        return self.t_fixed + self.t_experts * touched + self.c_tok * n_tokens + self.c_ctx * ctx_tokens

    def draft(self, n_tokens: int) -> float:
        """One draft-head forward over n_tokens tokens."""
        return self.d_fixed + self.d_tok * n_tokens

    def decode(self, batch: int, steps: int, ctx_tokens: int, speculative: bool | None = None) -> float:
        """One decode iteration: without speculation a plain forward; with it, k draft steps, a verify of
        batch * (k + 1) tokens, one draft extend over the verified tokens and the iteration's fixed speculative
        cost. An adaptive server at steps 0 still verifies the one bonus token and runs the draft extend over it
        (eagle_worker_v2.py, the zero-step branch)."""
        if steps <= 0:
            zero_step = self.target(batch, ctx_tokens)
            return zero_step + self.draft(batch) + self.s_fixed if speculative else zero_step
        q = steps + 1
        return self.target(batch * q, ctx_tokens) + steps * self.draft(batch) + self.draft(batch * q) + self.s_fixed

    def host_floor(self, batch: int) -> float:
        """The shortest a decode iteration of this many running requests can be: the host streams one chunk per
        request per iteration, overlapped with the GPU's work (0 where host_chunk_ms is 0)."""
        return self.h_chunk * batch

    def prefill(self, n_tokens: int, ctx_tokens: int, speculative: bool) -> float:
        """One prefill batch; with speculation the draft head also extends over the new tokens."""
        t = self.target(n_tokens, ctx_tokens)
        return t + self.draft(n_tokens) if speculative else t
