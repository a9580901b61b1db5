"""Run the scheduler in virtual time under a closed-loop client, and compute the rig's metrics from the result.

The client behaves like the campaign's benchmark: C requests sent at the level's start, each finished request
immediately replaced until the level's count has been sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rig.sim.adaptive import AdaptiveSpec, cuda_graph_bs, load_config
from rig.sim.capacity import StateFlags, compute_capacity
from rig.sim.cost import ForwardCost
from rig.sim.profile import Profile
from rig.sim.requests import Sampling, build_req, plan_request, prompt_key
from rig.sim.scheduler import EngineConfig, Req, Scheduler
from rig.sim.text import stable_hash, token_id, tokenize


@dataclass(frozen=True)
class Scenario:
    """One measured load level: the server's steps, the client's concurrency and requests."""

    steps: int
    concurrency: int
    n_requests: int
    output_tokens: tuple[int, ...]  # max_new_tokens of request i is output_tokens[i % len]
    prompts: tuple[str, ...]
    temperature: float = 0.0
    ignore_eos: bool = True
    tp: int = 4
    seed: int = 0
    label: str = ""
    # Limits a real server reported at startup (max_running_requests, max_total_num_tokens); None: from the profile.
    max_running: int | None = None
    kv_pool_tokens: int | None = None
    adaptive: bool = False  # --speculative-adaptive (steps: the startup tier)
    adaptive_config: str | None = None  # --speculative-adaptive-config; None: the version's default table
    sglang_version: str = "0.5.23"
    state_flags: StateFlags | None = None  # launch flags that size the state pool (None: SGLang's defaults)


@dataclass
class RequestResult:
    send: float
    first_token: float
    end: float
    prompt_tokens: int
    completion_tokens: int
    verify_ct: int
    index: int = -1  # the request's place in the scenario's send order (results come in completion order)

    @property
    def ttft(self) -> float:
        return self.first_token - self.send

    @property
    def e2e(self) -> float:
        return self.end - self.send


@dataclass
class LevelResult:
    requests: list[RequestResult]
    max_running: int
    peak_running: int
    mean_running: float = 0.0
    extra: dict = field(default_factory=dict)


def engine_config(
    profile: Profile,
    steps: int,
    tp: int = 4,
    adaptive: bool = False,
    adaptive_config: str | None = None,
    sglang_version: str = "0.5.23",
    state_flags: StateFlags | None = None,
) -> EngineConfig:
    """The limits a server with default flags would use (and its adaptive controller, if asked for)."""
    cap = compute_capacity(
        profile,
        tp=tp,
        mem_fraction_static=None,
        draft_tokens=steps + 1,
        speculative=steps > 0,
        max_running_requests=None,
        max_total_tokens=None,
        context_length=int(profile.context_length),
        flags=state_flags,
    )
    spec = None
    if adaptive and steps > 0:
        spec = AdaptiveSpec(
            load_config(adaptive_config, sglang_version), tuple(cuda_graph_bs(cap.max_running_requests))
        )
    return EngineConfig(
        steps=steps,
        adaptive=spec,
        max_running=cap.max_running_requests,
        kv_pool_tokens=cap.max_total_num_tokens,
        chunked_prefill_size=int(profile.default_chunked_prefill_size),
        max_prefill_tokens=int(profile.default_max_prefill_tokens),
        new_token_ratio=profile.new_token_ratio,
    )


def run_closed_loop(profile: Profile, sc: Scenario) -> LevelResult:
    """Simulate one level in virtual time; deterministic for a given profile and scenario."""
    cfg = engine_config(profile, sc.steps, sc.tp, sc.adaptive, sc.adaptive_config, sc.sglang_version, sc.state_flags)
    if sc.max_running is not None or sc.kv_pool_tokens is not None:
        cfg = replace(
            cfg, max_running=sc.max_running or cfg.max_running, kv_pool_tokens=sc.kv_pool_tokens or cfg.kv_pool_tokens
        )
    sched = Scheduler(cfg, ForwardCost(profile, sc.tp))
    prompt_toks = [tokenize(p) for p in sc.prompts]
    keys = [prompt_key([token_id(t) for t in toks]) for toks in prompt_toks]
    results: list[RequestResult] = []
    sent = 0

    def send(now: float) -> None:
        nonlocal sent
        i = sent
        j = i % len(sc.prompts)
        s = Sampling(
            max_new_tokens=sc.output_tokens[i % len(sc.output_tokens)],
            temperature=sc.temperature,
            ignore_eos=sc.ignore_eos,
            seed=None if sc.temperature == 0 else sc.seed * 100003 + i,
        )
        plan = plan_request(profile, cfg.chain_steps, prompt_toks[j], keys[j], s)
        req = build_req(f"r{i}", plan, len(prompt_toks[j]), s, stable_hash("acc", sc.seed, i))
        sched.submit(req, now)
        sent += 1

    t = 0.0
    for _ in range(min(sc.concurrency, sc.n_requests)):
        send(t)
    peak = 0
    area = 0.0
    steps_area = decode_time = 0.0  # time-weighted active tier over the decodes
    by_slot: dict[int, tuple[float, float]] = {}  # adaptive: per batch-size slot, (steps x time, time)
    while sched.busy:
        it = sched.plan(t)
        if it is None:  # cannot happen while busy (something can always be admitted when nothing runs)
            raise RuntimeError("scheduler stalled")
        t_end = t + it.duration
        peak = max(peak, sched.num_running)
        area += sched.num_running * it.duration
        if it.kind == "decode":
            steps_area += it.steps * it.duration
            decode_time += it.duration
            if sched.adaptive is not None:
                key = sched.adaptive.slot_key(len(it.reqs))
                a, d = by_slot.get(key, (0.0, 0.0))
                by_slot[key] = (a + it.steps * it.duration, d + it.duration)
        for r in sched.complete(it, t_end, t):
            if r.done:
                results.append(_result(r))
                if sent < sc.n_requests:
                    send(t_end)
        t = t_end
    extra: dict = {}
    if sched.adaptive is not None:
        extra = {
            "mean_active_steps": steps_area / decode_time if decode_time > 0 else float(cfg.steps),
            "switches": sched.adaptive.switches,
            "final_steps": sched.active_steps,
            "mean_steps_by_slot": {k: a / d for k, (a, d) in sorted(by_slot.items()) if d > 0},
        }
    return LevelResult(results, cfg.max_running, peak, area / t if t > 0 else 0.0, extra)


def _result(r: Req) -> RequestResult:
    if r.arrival is None or r.finish_t is None:
        raise RuntimeError(f"sim: request {r.rid} finished without an arrival or finish time")
    return RequestResult(
        r.arrival,
        r.first_token_t if r.first_token_t is not None else r.finish_t,
        r.finish_t,
        r.prompt_len,
        r.generated,
        r.verify_ct,
        int(r.rid[1:]),
    )


def summarize(level: LevelResult) -> dict[str, float]:
    """The rig's figures for a level (defined as in rig/analysis/metrics.py; calibration note: rig/sim/README.md)."""
    rs = level.requests
    tokens = sum(r.completion_tokens for r in rs)
    wall = max(r.end for r in rs) - min(r.send for r in rs)
    decode = [(r.completion_tokens - 1) / (r.e2e - r.ttft) for r in rs if r.completion_tokens > 1 and r.e2e > r.ttft]
    verify = sum(r.verify_ct for r in rs)
    return {
        "aggregate_tok_s": tokens / wall if wall > 0 else 0.0,
        "decode_tok_s": sum(decode) / len(decode) if decode else 0.0,
        "per_request_tok_s": sum(r.completion_tokens / r.e2e for r in rs) / len(rs),
        "tokens": float(tokens),
        "wall_s": wall,
        "mean_ttft_s": sum(r.ttft for r in rs) / len(rs),
        "accept_length": tokens / verify if verify else 0.0,
        "max_running": float(level.max_running),
        "mean_running": level.mean_running,
    }
