"""Simulated power of the reference node's GPUs (4x RTX PRO 6000 Blackwell at TP=4), from the engine's iterations.

A parametric model, not a measurement: each forward's time (``cost.py``) is split into its terms, and each term runs
at a stated draw (``profiles/reference.yaml``: ``gpu_*_w``, each with its source):

- the fixed part of a target or draft forward (``t_fixed_ms``, ``d_fixed_ms``: launches, all-reduce waits, dense
  weights) at ``gpu_fixed_w``;
- streaming routed experts and reading context (``t_experts_ms`` x share touched, ``c_ctx`` x context) at
  ``gpu_memory_w``;
- per-token compute (``c_tok_ms`` x tokens, ``d_tok_ms`` x tokens) at ``gpu_compute_w``: a verify computes over all
  ``B x (k + 1)`` drafted tokens, accepted or not, and the draft head runs ``k + 1`` forwards, so rejected drafts cost
  energy;
- between iterations the GPU idles at ``gpu_idle_w``.

No draw exceeds ``gpu_board_power_w``. Under tensor parallelism every GPU runs every forward on its shard, so the
``tp`` GPUs draw the same. There is no thermal or clock model: the simulated source reports no temperature, SM clock
or throttle reasons (null), rather than invent them.

The meter integrates the draw over the engine's own clock into a per-GPU energy counter (mJ, monotonic, like
NVML's ``nvmlDeviceGetTotalEnergyConsumption``), and reports power as the mean over the last second, as NVML's
``nvmlDeviceGetPowerUsage`` does on Ampere and newer GPUs other than GA100 (nvml.h: "On Ampere (except GA100) or
newer GPUs, the API returns power averaged over 1 sec interval").
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from rig.sim.cost import ForwardCost
from rig.sim.profile import Profile
from rig.sim.scheduler import Iteration

WINDOW_S = 1.0  # power and utilisation are means over this trailing window (NVML: 1 s on Ampere and newer)
KEEP_S = 5.0  # iterations older than this are folded into the counter


@dataclass(frozen=True)
class Terms:
    """Seconds of one iteration spent in each kind of work (they sum to the iteration's modelled duration)."""

    fixed: float
    memory: float
    compute: float

    @property
    def total(self) -> float:
        return self.fixed + self.memory + self.compute


class PowerModel:
    """Per-GPU draw of an iteration, from the profile's power parameters and the forward cost of one tp."""

    def __init__(self, profile: Profile, cost: ForwardCost, steps: int):
        self.cost = cost
        self.steps = steps
        self.board_w = profile.gpu_board_power_w
        self.idle_w = min(profile.gpu_idle_w, self.board_w)
        self.fixed_w = min(profile.gpu_fixed_w, self.board_w)
        self.memory_w = min(profile.gpu_memory_w, self.board_w)
        self.compute_w = min(profile.gpu_compute_w, self.board_w)

    def _target(self, n_tokens: int, ctx: int) -> Terms:
        c = self.cost
        touched = 1.0 - math.exp(n_tokens * c._ln_miss)
        return Terms(c.t_fixed, c.t_experts * touched + c.c_ctx * ctx, c.c_tok * n_tokens)

    def _draft(self, n_tokens: int, times: int = 1) -> Terms:
        c = self.cost
        return Terms(c.d_fixed * times, 0.0, c.d_tok * n_tokens * times)

    def terms(self, it: Iteration) -> Terms:
        """The split of ``it``'s duration, mirroring ForwardCost.decode / ForwardCost.prefill term by term."""
        spec = self.steps > 0  # the startup steps: speculation on or off
        if it.kind == "prefill":
            parts = [self._target(it.tokens, it.ctx)] + ([self._draft(it.tokens)] if spec else [])
        else:
            b = len(it.reqs)
            k = it.steps  # the tier this decode ran (adaptive: it varies)
            overhead = Terms(self.cost.s_fixed, 0.0, 0.0)  # the speculative iteration's own fixed cost
            if k <= 0:
                parts = [self._target(b, it.ctx)] + ([self._draft(b), overhead] if spec else [])
            else:
                q = k + 1
                parts = [self._target(b * q, it.ctx), self._draft(b, times=k), self._draft(b * q), overhead]
        return Terms(sum(p.fixed for p in parts), sum(p.memory for p in parts), sum(p.compute for p in parts))

    def watts(self, terms: Terms) -> float:
        """Mean per-GPU draw over an iteration with these terms."""
        if terms.total <= 0:
            return self.idle_w
        w = (terms.fixed * self.fixed_w + terms.memory * self.memory_w + terms.compute * self.compute_w) / terms.total
        return min(w, self.board_w)


@dataclass
class _Segment:
    start: float
    end: float
    excess_w: float  # draw above idle
    memory_share: float  # share of the iteration in memory-bound terms


class PowerMeter:
    """The draw of one GPU over time on the engine's clock: idle, plus each iteration's excess while it runs."""

    def __init__(self, model: PowerModel, t0: float):
        self.model = model
        self.t0 = t0
        self._folded_j = 0.0  # excess energy of iterations no longer kept
        self._segments: deque[_Segment] = deque()

    def run(self, it: Iteration, start: float, end: float) -> None:
        """Record that ``it`` runs from ``start`` to ``end`` (engine clock; end - start may be scaled by a slow-down
        fault: the draw is the same, the time is what it is)."""
        if end <= start:
            return
        terms = self.model.terms(it)
        share = terms.memory / terms.total if terms.total > 0 else 0.0
        # an iteration the host held longer than its forwards (ForwardCost.host_floor): the GPU idles the rest
        busy = min(1.0, terms.total / it.duration) if it.duration > 0 and terms.total > 0 else 1.0
        self._segments.append(_Segment(start, end, busy * (self.model.watts(terms) - self.model.idle_w), share))
        while self._segments and self._segments[0].end < end - KEEP_S:
            s = self._segments.popleft()
            self._folded_j += s.excess_w * (s.end - s.start)

    @staticmethod
    def _overlap(s: _Segment, a: float, b: float) -> float:
        return max(0.0, min(s.end, b) - max(s.start, a))

    def energy_j(self, now: float) -> float:
        """Energy one GPU drew from t0 to ``now`` (joules)."""
        live = sum(s.excess_w * self._overlap(s, self.t0, now) for s in self._segments)
        return self.model.idle_w * max(0.0, now - self.t0) + self._folded_j + live

    def window(self, now: float, window_s: float = WINDOW_S) -> tuple[float, float, float]:
        """(mean watts, busy fraction, memory-bound fraction) over the trailing window."""
        a = max(self.t0, now - window_s)
        span = now - a
        if span <= 0:
            return self.model.idle_w, 0.0, 0.0
        busy = sum(self._overlap(s, a, now) for s in self._segments)
        excess = sum(s.excess_w * self._overlap(s, a, now) for s in self._segments)
        memory = sum(s.memory_share * self._overlap(s, a, now) for s in self._segments)
        return self.model.idle_w + excess / span, min(1.0, busy / span), min(1.0, memory / span)
