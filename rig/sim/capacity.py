"""Memory accounting: how many tokens the KV pool holds and how many requests may run, from the profile and flags.

Qwen3.5 is a hybrid model: most layers are linear attention (GDN) with a fixed-size recurrent (Mamba) state per
request slot, and speculative verification keeps one more state per draft token for rollback. SGLang sizes this as
mem_cache/kv_cache_configurator.py of 0.5.23 does (_handle_max_mamba_cache: lines 3229-3400, _calculate_mamba_ratio:
3062-3088, resolve_max_num_reqs; the same in 0.5.17):
the state pool takes r/(1+r) of the memory left after weights (r: --mamba-full-memory-ratio, 0.9), each running
request holds `ratio` state slots (the radix cache's copies) plus D draft-token states, so a running request costs
(ratio + D) * p and the limit is max_mamba_cache_size // ratio. The KV pool gets what the states leave.
"""

from __future__ import annotations

from dataclasses import dataclass

from rig.sim.profile import Profile

MAMBA_FULL_MEMORY_RATIO = 0.9  # SGLang's default --mamba-full-memory-ratio (the flag's resolved value in server logs)
SPEC_MAX_RUNNING = 48  # speculative_hook.py: max_running_requests defaults to 48 when speculating


class CapacityError(ValueError):
    """The configuration does not fit in memory (SGLang fails at startup the same way)."""


@dataclass(frozen=True)
class Capacity:
    max_total_num_tokens: int  # KV pool, tokens
    max_running_requests: int  # effective limit the scheduler uses
    state_limit: int  # requests the recurrent-state pool holds (max_mamba_cache_size // ratio)
    configured_max_running: int  # the flag's value (or its default)
    available_gpu_mem_gb: float  # left after static allocation, per GPU
    weight_gb_per_gpu: float
    kv_pool_gb: float
    state_pool_gb: float  # main states and draft-token (intermediate) states
    state_mb_per_request: float  # (ratio + D) * p: what one running request costs in state
    max_mamba_cache_size: int = 0  # state slots (SGLang's max_mamba_cache_size)
    mamba_ratio: int = 1  # state slots per running request


@dataclass(frozen=True)
class StateFlags:
    """The flags that change the state pool (SGLang's names; their defaults are SGLang's)."""

    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    mamba_radix_cache_strategy: str = "auto"
    max_mamba_cache_size: int | None = None
    mamba_full_memory_ratio: float | None = None
    page_size: int = 1


def mamba_ratio(f: StateFlags) -> int:
    """State slots per running request (kv_cache_configurator.py _calculate_mamba_ratio): 1 without the radix cache;
    else 3, plus the extra buffer's ping-pong slots: 2 with the overlap schedule (1 when lazy), 1 without. 'auto'
    picks extra_buffer when the overlap schedule (or paging) is on, else no_buffer (overrides.py
    _mamba_radix_cache_resolution)."""
    if f.disable_radix_cache:
        return 1
    strategy = f.mamba_radix_cache_strategy
    if strategy == "auto":
        strategy = "extra_buffer" if (not f.disable_overlap_schedule or f.page_size > 1) else "no_buffer"
    if strategy == "no_buffer":
        return 3
    if f.disable_overlap_schedule:
        if strategy == "extra_buffer_lazy":
            raise CapacityError(
                "Lazy extra buffer requires overlap schedule (--disable-overlap-schedule is incompatible)"
            )
        return 3 + 1
    return 3 + (1 if strategy == "extra_buffer_lazy" else 2)


def default_max_running(tokens: int, context_len: int) -> int:
    """SGLang's derived default when not speculating (kv_cache_configurator.resolve_max_num_reqs)."""
    return int(min(max(min(tokens / context_len * 512, 4096), 2048), tokens // 2))


def _state_slots(rest_gb: float, p_gb: float, d: int, ratio: int, configured: int | None, f: StateFlags) -> int:
    """max_mamba_cache_size (_handle_max_mamba_cache): the flag's value; without the radix cache the running limit;
    else the pool's share of memory solved jointly with the draft-token states (K * p * (1 + D / ratio))."""
    if f.max_mamba_cache_size is not None:
        return f.max_mamba_cache_size
    if f.disable_radix_cache and configured is not None:
        return configured
    r = f.mamba_full_memory_ratio if f.mamba_full_memory_ratio is not None else MAMBA_FULL_MEMORY_RATIO
    budget = rest_gb * r / (1 + r)
    # 0.5.23 keeps one padding slot in each buffer (memory_pool.py): the (1 + D) term
    return int((budget - p_gb * (1 + d)) // (p_gb * (1 + d / ratio))) if d else int((budget - p_gb) // p_gb)


def compute_capacity(
    profile: Profile,
    *,
    tp: int,
    mem_fraction_static: float | None,
    draft_tokens: int,
    speculative: bool,
    max_running_requests: int | None,
    max_total_tokens: int | None,
    context_length: int,
    flags: StateFlags | None = None,
) -> Capacity:
    """Split static GPU memory into weights, request-state pool and KV pool; derive the two limits."""
    f = flags or StateFlags()
    mf = mem_fraction_static if mem_fraction_static is not None else profile.default_mem_fraction_static
    shard = profile.calibrated_tp / tp  # per-GPU state and KV shrink as heads are split over more GPUs
    weights = profile.weight_gb_total / tp
    rest = profile.gpu_mem_gb * mf - weights - profile.graph_reserve_gb
    if rest <= 0:
        raise CapacityError(
            f"Not enough memory: weights take {weights:.1f} GB per GPU of {profile.gpu_mem_gb * mf:.1f} GB "
            f"(mem_fraction_static={mf}); raise --mem-fraction-static or --tp-size"
        )
    p_gb = profile.mamba_state_mb_per_req * shard / 1000.0
    d = draft_tokens if speculative else 0
    ratio = mamba_ratio(f)
    configured_flag = (
        max_running_requests if max_running_requests is not None else (SPEC_MAX_RUNNING if speculative else None)
    )
    slots = _state_slots(rest, p_gb, d, ratio, configured_flag, f)
    if slots <= 0:
        raise CapacityError(
            f"Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed max_mamba_cache_size="
            f"{slots} (total_rest_memory={rest:.2f} GB, mamba_cache_per_req={p_gb * 1000:.2f} MB)."
        )
    state_limit = slots // ratio
    intermediate_reqs = slots if (f.disable_radix_cache and f.max_mamba_cache_size is None) else state_limit
    if configured_flag is not None:
        intermediate_reqs = min(intermediate_reqs, configured_flag)
    state_gb = (slots + 1) * p_gb + (intermediate_reqs + 1) * d * p_gb  # +1: each buffer's padding slot
    kv_gb = rest - state_gb
    tokens = int(max(0.0, kv_gb) * 1e9 / (profile.kv_bytes_per_token * shard))
    if tokens <= 0:  # model_executor/pool_configurator.py:94-99 (0.5.23)
        raise CapacityError(
            f"Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static={mf} "
            f"(the state pool takes {state_gb:.2f} GB of the {rest:.2f} GB left after weights)"
        )
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens)
    configured = configured_flag if configured_flag is not None else default_max_running(tokens, context_length)
    effective = min(configured, tokens // 2, state_limit)
    if effective <= 0:
        raise CapacityError(
            f"Hybrid (mamba/linear-attention) state cache is too small to serve any requests. max_mamba_cache_size="
            f"{slots}, mamba_ratio={ratio}, resulting max_num_reqs={effective}."
        )
    available = max(0.0, profile.gpu_mem_gb * (1.0 - mf))
    return Capacity(
        max_total_num_tokens=tokens,
        max_running_requests=effective,
        state_limit=state_limit,
        configured_max_running=configured,
        available_gpu_mem_gb=round(available, 2),
        weight_gb_per_gpu=round(weights, 2),
        kv_pool_gb=round(kv_gb, 2),
        state_pool_gb=round(state_gb, 2),
        state_mb_per_request=round((ratio + d) * p_gb * 1000, 2),
        max_mamba_cache_size=slots,
        mamba_ratio=ratio,
    )
