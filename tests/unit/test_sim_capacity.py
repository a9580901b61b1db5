"""The simulator's running-request capacity in SGLang's (ratio + D) * p form (kv_cache_configurator.py), fitted to
the campaign, and the flags that change it."""

from __future__ import annotations

import pytest

from rig.sim.capacity import CapacityError, StateFlags, compute_capacity, mamba_ratio
from rig.sim.fit import campaign_flags
from rig.sim.launch import prepare
from rig.sim.profile import load_profile


@pytest.fixture(scope="module")
def ref():
    return load_profile()


def cap(profile, steps: int, flags: StateFlags | None = None, **kw):
    args = {
        "tp": 4,
        "mem_fraction_static": None,
        "draft_tokens": steps + 1,
        "speculative": steps > 0,
        "max_running_requests": None,
        "max_total_tokens": None,
        "context_length": 262144,
    }
    args.update(kw)
    return compute_capacity(profile, flags=flags, **args)


def test_capacity_at_steps_1_and_3_is_near_the_campaign(ref):
    """Campaign: 26 running requests at steps 1, about 17 at steps 3. With 3 state slots per request (the campaign's
    assumed launch, rig/sim/data/campaign.yaml) the fitted p gives that fall; SGLang's default 5 slots cannot
    (it costs 7p vs 9p per request, a 1.29x fall where the campaign fell 1.53x), and holds fewer requests."""
    flags = campaign_flags()
    assert flags.disable_overlap_schedule and mamba_ratio(flags) == 3
    one, three = cap(ref, 1, flags).max_running_requests, cap(ref, 3, flags).max_running_requests
    assert 22 <= one <= 27 and 15 <= three <= 18  # the shipped fit: 22 and 16 (rig/sim/README.md says why)
    assert cap(ref, 1).max_running_requests < one and cap(ref, 3).max_running_requests < three


def test_a_running_request_costs_ratio_plus_d_states(ref):
    """0.5.23: K = floor((B - p (1 + D)) / (p (1 + D/ratio))), B = rest * 0.9 / 1.9; the limit is K // ratio; the
    pool holds K + 1 slots and (mrr + 1) D draft-token states (a padding slot each); KV gets the rest."""
    c = cap(ref, 3)
    p = ref.mamba_state_mb_per_req / 1000
    rest = ref.gpu_mem_gb * ref.default_mem_fraction_static - ref.weight_gb_total / 4 - ref.graph_reserve_gb
    k = int((rest * 0.9 / 1.9 - p * 5) // (p * (1 + 4 / 5)))
    assert (c.mamba_ratio, c.max_mamba_cache_size, c.state_limit, c.max_running_requests) == (5, k, k // 5, k // 5)
    assert c.state_pool_gb == pytest.approx((k + 1) * p + (k // 5 + 1) * 4 * p, abs=0.01)
    assert c.kv_pool_gb == pytest.approx(rest - c.state_pool_gb, abs=0.01)
    assert c.state_mb_per_request == pytest.approx(9 * ref.mamba_state_mb_per_req, abs=0.01)


def test_without_speculation_capacity_is_the_ratio_not_three_times_it(ref):
    """Steps 0: K = (B - p) / p, limit K // 5 (the old fitted model gave 133, about 3x SGLang's form)."""
    c = cap(ref, 0)
    assert c.max_running_requests == c.max_mamba_cache_size // 5 < 60


@pytest.mark.parametrize(
    ("flags", "ratio"),
    [
        (StateFlags(), 5),
        (StateFlags(disable_overlap_schedule=True), 3),  # auto without overlap: no_buffer
        (StateFlags(disable_overlap_schedule=True, mamba_radix_cache_strategy="extra_buffer"), 4),
        (StateFlags(mamba_radix_cache_strategy="extra_buffer_lazy"), 4),
        (StateFlags(disable_overlap_schedule=True, page_size=64), 4),  # auto with paging: extra_buffer
        (StateFlags(disable_radix_cache=True), 1),
    ],
)
def test_mamba_ratio_follows_sglangs_rules(flags, ratio):
    assert mamba_ratio(flags) == ratio


def test_lazy_extra_buffer_without_overlap_fails_like_sglang():
    with pytest.raises(CapacityError, match="Lazy extra buffer requires overlap schedule"):
        mamba_ratio(StateFlags(disable_overlap_schedule=True, mamba_radix_cache_strategy="extra_buffer_lazy"))


def test_flags_change_capacity(ref):
    base = cap(ref, 3).max_running_requests
    assert cap(ref, 3, StateFlags(disable_overlap_schedule=True)).max_running_requests > base  # ratio 3
    # radix cache off: the state pool holds the running limit (48 under speculation), not a share of memory
    off = cap(ref, 3, StateFlags(disable_radix_cache=True))
    assert (off.max_running_requests, off.max_mamba_cache_size, off.mamba_ratio) == (48, 48, 1)
    # 49 slots and 49 * 4 draft-token states (a padding slot each): more than the default pool, so less KV
    assert off.state_pool_gb == pytest.approx(49 * 5 * ref.mamba_state_mb_per_req / 1000, abs=0.01)
    assert off.kv_pool_gb < cap(ref, 3).kv_pool_gb
    assert cap(ref, 3, StateFlags(max_mamba_cache_size=50)).max_running_requests == 10
    more = cap(ref, 3, StateFlags(mamba_full_memory_ratio=2.0)).max_running_requests
    assert more > base
    assert cap(ref, 3, max_running_requests=8).max_running_requests == 8


def test_a_state_pool_too_small_fails_in_sglangs_words(ref):
    with pytest.raises(CapacityError, match="state cache is too small to serve any requests"):
        cap(ref, 3, StateFlags(max_mamba_cache_size=4))


def test_launch_honours_the_flags_and_deterministic_inference_turns_radix_off():
    """--enable-deterministic-inference on the simulated Blackwell picks flashinfer attention, which turns the radix
    cache off (resolution.py): the state pool then holds the 48 running requests."""
    base = [
        "--model-path",
        "m",
        "--tp-size",
        "4",
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
    ]
    default = prepare(base)[2].max_running_requests
    assert default == cap(load_profile(), 3).max_running_requests
    assert prepare([*base, "--disable-radix-cache"])[2].max_running_requests == 48
    assert prepare([*base, "--enable-deterministic-inference"])[2].max_running_requests == 48
    assert prepare([*base, "--disable-overlap-schedule"])[2].mamba_ratio == 3
    assert prepare([*base, "--max-mamba-cache-size", "60"])[2].max_running_requests == 12
    assert prepare([*base, "--mamba-full-memory-ratio", "0.5"])[2].max_running_requests < default
