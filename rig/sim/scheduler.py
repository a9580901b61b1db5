"""The discrete-event core: continuous batching with speculative decoding, independent of any clock.

A driver asks ``plan(now)`` for the next iteration (a prefill batch or a decode step), advances its clock by the
iteration's duration (really, in the server; virtually, in the fitter), then calls ``complete(it, t_end)`` to commit
tokens. Like SGLang's scheduler, prefill has priority: whenever a waiting request can be admitted the next iteration
is a prefill batch, which stalls every running request for its duration (mixed chunked prefill is off when
speculating). Admission needs a free running slot (max running requests) and room in the KV pool.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rig.sim.acceptance import RequestAcceptance, draw_accepted
from rig.sim.adaptive import AdaptiveController, AdaptiveSpec
from rig.sim.cost import ForwardCost


@dataclass(frozen=True)
class EngineConfig:
    """The scheduler's resolved limits."""

    steps: int  # draft steps per verify; 0 = no speculative decoding
    max_running: int
    kv_pool_tokens: int
    chunked_prefill_size: int  # -1: off (whole prompts, up to max_prefill_tokens)
    max_prefill_tokens: int
    new_token_ratio: float = 0.7
    adaptive: AdaptiveSpec | None = None  # --speculative-adaptive: the steps follow the batch (rig/sim/adaptive.py)

    @property
    def speculative(self) -> bool:
        return self.steps > 0

    @property
    def chain_steps(self) -> int:
        """Draft positions a request's acceptance chain needs: the largest tier the server can switch to."""
        return self.adaptive.max_steps if self.adaptive is not None else self.steps


class Req:
    """One request inside the scheduler."""

    __slots__ = (
        "rid",
        "prompt_len",
        "cached",
        "max_new",
        "eos_at",
        "loop_from",
        "acc",
        "rng",
        "user",
        "arrival",
        "admit_t",
        "prefill_done_t",
        "first_token_t",
        "finish_t",
        "prefilled",
        "generated",
        "verify_ct",
        "accepted_drafts",
        "hist",
        "last_new",
        "finish_reason",
        "done",
    )

    def __init__(
        self,
        rid: str,
        prompt_len: int,
        max_new: int,
        acc: RequestAcceptance,
        seed: int,
        *,
        cached: int = 0,
        eos_at: int | None = None,
        loop_from: int | None = None,
        user: Any = None,
    ):
        self.rid = rid
        self.prompt_len = prompt_len
        self.cached = min(cached, max(0, prompt_len - 1))  # the last prompt token is always recomputed
        self.max_new = max_new
        self.eos_at = eos_at
        self.loop_from = loop_from
        self.acc = acc
        self.rng = random.Random(seed)
        self.user = user  # the driver's handle (stream state); opaque here
        # times on the simulation's clock, set as the request goes through
        self.arrival: float | None = None
        self.admit_t: float | None = None
        self.prefill_done_t: float | None = None
        self.first_token_t: float | None = None
        self.finish_t: float | None = None
        self.prefilled = 0
        self.generated = 0
        self.verify_ct = 0
        self.accepted_drafts = 0
        self.hist = [0] * (len(acc.normal) + 1)
        self.last_new = 0
        self.finish_reason: str | None = None  # "length" | "stop" | "abort"
        self.done = False

    @property
    def to_prefill(self) -> int:
        return self.prompt_len - self.cached - self.prefilled


@dataclass
class Iteration:
    kind: str  # "prefill" | "decode"
    duration: float  # seconds
    reqs: list[Req]
    chunks: list[int] = field(default_factory=list)  # prefill: tokens of each request in this batch
    tokens: int = 0  # tokens the forward processed
    ctx: int = 0  # context tokens the target forward read (the power model splits the cost by term: sim/power.py)
    steps: int = 0  # decode: the draft steps this iteration ran (the active tier under adaptive speculation)


@dataclass
class Counters:
    """Cumulative scheduler counters (reset by flush)."""

    decode_iterations: int = 0
    prefill_iterations: int = 0
    verify_calls: int = 0  # request-verify steps
    decode_tokens: int = 0  # tokens committed by verify steps
    accepted_drafts: int = 0
    proposed_drafts: int = 0
    prefill_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0


class Scheduler:
    """Waiting queue, running batch, and the rules that move requests between them."""

    def __init__(self, cfg: EngineConfig, cost: ForwardCost):
        self.cfg = cfg
        self.cost = cost
        self.waiting: deque[Req] = deque()
        self.prefilling: list[Req] = []  # admitted, prompt not fully processed (chunked prefill)
        self.running: list[Req] = []
        self.ctx_sum = 0  # sum of prompt + generated over running requests
        self.reserved = 0.0  # KV reservation of admitted requests (tokens)
        self.counters = Counters()
        self.adaptive: AdaptiveController | None = cfg.adaptive.controller(cfg.steps) if cfg.adaptive else None

    @property
    def active_steps(self) -> int:
        """The draft steps the worker runs now (the startup value unless adaptive)."""
        return self.adaptive.active if self.adaptive is not None else self.cfg.steps

    # ---- queue operations ----
    def submit(self, req: Req, now: float) -> None:
        req.arrival = now
        self.waiting.append(req)

    def abort(self, req: Req) -> None:
        """Drop a request wherever it is (client went away)."""
        if req.done:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        elif req in self.prefilling:
            self.prefilling.remove(req)
            self.reserved -= self._reservation(req)
        elif req in self.running:
            self._leave(req)
        req.done = True
        req.finish_reason = "abort"

    def finish_early(self, req: Req, generated: int, reason: str, now: float) -> None:
        """End a running request before its budget (a stop string matched); tokens past ``generated`` are dropped."""
        if req.done:
            return
        if req in self.running:
            self.ctx_sum -= req.generated - generated
            req.generated = generated
            self._leave(req)
        req.done = True
        req.finish_reason = reason
        req.finish_t = now

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    @property
    def num_running(self) -> int:
        return len(self.running) + len(self.prefilling)

    def used_tokens(self) -> int:
        return self.ctx_sum + sum(r.cached + r.prefilled for r in self.prefilling)

    # ---- planning ----
    def plan(self, now: float) -> Iteration | None:
        """The next iteration to run, or None when idle."""
        it = self._plan_prefill(now)
        if it is not None:
            return it
        if self.running:
            b = len(self.running)
            # eagle_worker_v2.py: the routed slot's tier is activated before each decode (activate_step_by_batch)
            steps = self.adaptive.steps_for_batch(b) if self.adaptive is not None else self.cfg.steps
            return Iteration(
                "decode",
                max(self.cost.decode(b, steps, self.ctx_sum, self.cfg.speculative), self.cost.host_floor(b)),
                self.running[:],
                tokens=b * (steps + 1),
                ctx=self.ctx_sum,
                steps=steps,
            )
        return None

    def _reservation(self, r: Req) -> float:
        return r.prompt_len + r.max_new * self.cfg.new_token_ratio

    def _plan_prefill(self, now: float) -> Iteration | None:
        cfg = self.cfg
        budget = cfg.chunked_prefill_size if cfg.chunked_prefill_size > 0 else cfg.max_prefill_tokens
        reqs: list[Req] = []
        chunks: list[int] = []
        used = 0
        ctx = 0
        # A prompt already being chunked continues first.
        for r in self.prefilling:
            take = min(r.to_prefill, budget - used)
            if take <= 0:
                break
            reqs.append(r)
            chunks.append(take)
            used += take
            ctx += r.cached + r.prefilled + take
        while self.waiting and used < budget and self.num_running < cfg.max_running:
            r = self.waiting[0]
            if r.arrival is not None and r.arrival > now:
                # Arrived after this iteration began (the clock is catching up): it joins a later one. SGLang 0.5.23
                # takes requests in only between forwards (srt/managers/scheduler.py event_loop_normal:
                # ingest_requests, then get_next_batch_to_run, then run_batch).
                break
            if self.reserved + self._reservation(r) > cfg.kv_pool_tokens and self.num_running > 0:
                break  # no room in the KV pool until something finishes
            take = min(max(1, r.to_prefill), budget - used)
            if take < r.to_prefill and cfg.chunked_prefill_size <= 0:
                if reqs:
                    break  # without chunking a prompt goes whole; let it lead the next batch
                take = r.to_prefill
            self.waiting.popleft()
            self.prefilling.append(r)
            self.reserved += self._reservation(r)
            reqs.append(r)
            chunks.append(take)
            used += take
            ctx += r.cached + take
        if not reqs:
            return None
        dur = self.cost.prefill(used, ctx, cfg.speculative)
        return Iteration("prefill", dur, reqs, chunks, tokens=used, ctx=ctx)

    # ---- committing ----
    def complete(self, it: Iteration, t_end: float, t_start: float | None = None) -> list[Req]:
        """Apply an iteration that ended at t_end; returns the requests that got tokens or finished."""
        if it.kind == "prefill":
            return self._complete_prefill(it, t_end, t_start)
        return self._complete_decode(it, t_end)

    def _complete_prefill(self, it: Iteration, t_end: float, t_start: float | None) -> list[Req]:
        c = self.counters
        c.prefill_iterations += 1
        out: list[Req] = []
        for r, take in zip(it.reqs, it.chunks, strict=False):
            if r.done:
                continue
            if r.admit_t is None:
                r.admit_t = t_start if t_start is not None else t_end - it.duration
                c.cached_tokens += r.cached
            r.prefilled += take
            c.prefill_tokens += take
            if r.to_prefill > 0:
                continue
            self.prefilling.remove(r)
            r.prefill_done_t = t_end
            r.first_token_t = t_end
            n = 1 if r.max_new > 0 else 0
            r.generated = n
            r.last_new = n
            c.generated_tokens += n
            out.append(r)
            if r.max_new <= n or (r.eos_at is not None and r.eos_at <= n):
                self.reserved -= self._reservation(r)
                self._finish(r, "stop" if (r.eos_at is not None and r.eos_at <= n) else "length", t_end)
            else:
                self.running.append(r)
                self.ctx_sum += r.prompt_len + n
        return out

    def _complete_decode(self, it: Iteration, t_end: float) -> list[Req]:
        c = self.counters
        c.decode_iterations += 1
        steps = it.steps
        spec = self.cfg.speculative
        out: list[Req] = []
        accepted: list[int] = []
        finished: list[tuple[Req, str]] = []
        committed = 0
        for r in it.reqs:
            if r.done:
                continue
            if spec:
                # steps 0 under adaptive still runs a one-token verify (eagle_worker_v2.py): it counts as a verify
                chain = r.acc.loop if (r.loop_from is not None and r.generated >= r.loop_from) else r.acc.normal
                acc = draw_accepted(chain[:steps], r.rng.random()) if steps > 0 else 0
                accepted.append(acc)
                n = acc + 1
                r.verify_ct += 1
                r.hist[acc] += 1
                c.verify_calls += 1
                c.proposed_drafts += steps
            else:
                n = 1
            limit = r.max_new - r.generated
            stop = False
            if r.eos_at is not None and r.eos_at - r.generated <= n:
                n = r.eos_at - r.generated
                stop = True
            if n >= limit:
                n = limit
            if spec:
                r.accepted_drafts += n - 1
                c.accepted_drafts += n - 1
                c.decode_tokens += n
            r.generated += n
            r.last_new = n
            committed += n
            out.append(r)
            if stop or r.generated >= r.max_new:
                r.finish_reason = "stop" if stop else "length"
                finished.append((r, r.finish_reason))
        self.ctx_sum += committed
        c.generated_tokens += committed
        if self.adaptive is not None:  # batch_result_processor.py feeds the verify's accepted drafts back
            self.adaptive.on_verify_complete(accepted, len(it.reqs))
        for r, reason in finished:
            self._leave(r)
            self._finish(r, reason, t_end)
        return out

    def _leave(self, r: Req) -> None:
        self.running.remove(r)
        self.ctx_sum -= r.prompt_len + r.generated
        self.reserved -= self._reservation(r)

    def _finish(self, r: Req, reason: str, t: float) -> None:
        r.done = True
        r.finish_reason = reason
        r.finish_t = t

    def reset_counters(self) -> None:
        self.counters = Counters()
