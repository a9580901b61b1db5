"""SGLang's adaptive speculation in the simulator: the controller's decisions against hand-computed sequences, the
batch-size routing with graph padding, the config file, the launch rules, and the active tier on the virtual clock."""

from __future__ import annotations

import json
import logging

import pytest

from rig.sim.adaptive import (
    AdaptiveConfigError,
    AdaptiveController,
    AdaptiveSpec,
    Slot,
    SlotConfig,
    build_runtime_states,
    candidate_union,
    cuda_graph_bs,
    load_config,
)
from rig.sim.args import ArgsError, _CheckingParser, build_parser, check_argv, resolve
from rig.sim.launch import _adaptive_startup

SLOT_1 = SlotConfig(candidate_steps=(1, 3, 5, 7), down_hysteresis=-0.25)  # 0.5.23's slot "1"


def _feed(slot: Slot, accepted: list[int], n: int) -> list[int]:
    """Feed n identical verifies; the steps after each."""
    out = []
    for _ in range(n):
        slot.update(accepted)
        out.append(slot.current_steps)
    return out


def test_slot_warms_up_then_decides_every_interval_from_the_ema():
    """Start at 3 (EMA 2.0), every request accepts 3 drafts: EMA_n = 3 - 0.8^n. No decision in the 10 warm-up
    batches nor at 11-14; at 15 the EMA (3 - 0.8^15 = 2.965) is above 3 - 0.5 but not 5 - 0.5: up to 5. At 20
    (2.988) it holds (drop to 3 needs <= 3 - 0.5 - 0.25). Then zeros: at 25 the EMA is 2.988 * 0.8^5 = 0.979 <= 2.25,
    so down to 3, but not to 1 (needs <= 1 - 0.5 - 0.25)."""
    slot = Slot(3, SLOT_1)
    assert slot.ema == 2.0
    assert _feed(slot, [3, 3], 14) == [3] * 14
    assert slot.ema == pytest.approx(3 - 0.8**14)
    assert _feed(slot, [3, 3], 1) == [5]
    assert _feed(slot, [3, 3], 5) == [5] * 5
    assert slot.ema == pytest.approx(3 - 0.8**20)
    assert _feed(slot, [0, 0], 5) == [5, 5, 5, 5, 3]
    assert slot.ema == pytest.approx((3 - 0.8**20) * 0.8**5)


def test_up_hysteresis_holds_a_tier_the_ema_would_leave():
    """With up_hysteresis 0.6 the rise out of 3 needs an EMA above 3.1: 2.965 at batch 15 stays at 3."""
    slot = Slot(3, SlotConfig(candidate_steps=(1, 3, 5, 7), up_hysteresis=0.6, down_hysteresis=-0.25))
    assert _feed(slot, [3], 15)[-1] == 3


def test_steps_zero_freezes_the_ema_and_probes_the_next_step_up():
    """Slot "8" ([0, 1, 3], no hysteresis) at 1: EMA 0.0, fed zeros it stays 0 <= 0.5: down to 0 at batch 15. At
    steps 0 the EMA is frozen; the next decision (20) probes 1 whatever was fed."""
    slot = Slot(1, SlotConfig(candidate_steps=(0, 1, 3), down_hysteresis=0.0))
    assert _feed(slot, [0, 0, 0], 15)[-1] == 0
    frozen = slot.ema
    assert _feed(slot, [5, 5], 4) == [0] * 4 and slot.ema == frozen
    assert _feed(slot, [5, 5], 1) == [1]


def test_ceiling_coeff_caps_only_downward_moves():
    """ceiling_coeff 1: at 5 with EMA ~3.0 (no drop by the thresholds) the ceiling ceil(3.0) = 3 pulls it to 3."""
    slot = Slot(5, SlotConfig(candidate_steps=(1, 3, 5, 7), ceiling_coeff=1.0, down_hysteresis=-0.25))
    slot.ema = 3.0
    assert _feed(slot, [3], 15)[-1] == 3


def test_an_initial_steps_outside_a_slot_starts_at_its_median():
    assert Slot(3, SlotConfig(candidate_steps=(0, 1))).current_steps == 1
    assert Slot(3, SlotConfig(candidate_steps=(0,))).current_steps == 0


def test_batch_routes_to_the_largest_slot_key_after_graph_padding():
    slots = load_config(None, "0.5.23")
    ctl = AdaptiveController(3, slots, cuda_graph_bs(48))
    assert cuda_graph_bs(48) == [1, 2, 3, 4, 5, 6, 7, 8, *range(10, 33, 2), 40, 44, 48]  # as the real log's capture
    assert [ctl.slot_key(b) for b in (1, 7, 8, 9, 31, 33, 48)] == [1, 1, 8, 8, 32, 32, 32]
    assert [ctl.steps_for_batch(b) for b in (1, 9, 33)] == [3, 3, 1]  # slot 32 has no 3: its median
    # padding decides: with graphs [1, 2, 4, 8] a batch of 5 replays the 8 graph, so it is routed to slot 8
    assert AdaptiveController(3, slots, [1, 2, 4, 8]).slot_key(5) == 8
    assert ctl.slot_key(5) == 1


def test_controller_switches_the_active_tier_and_logs_it(caplog):
    ctl = AdaptiveController(3, load_config(None, "0.5.23"), cuda_graph_bs(48))
    with caplog.at_level(logging.INFO, logger="rig.sim"):
        for _ in range(15):
            ctl.steps_for_batch(1)
            ctl.on_verify_complete([3], 1)
    assert ctl.active == 5 and ctl.switches == 1
    assert "Adaptive spec params updated: steps 3 -> 5 (ema_accept_len=2.96)" in caplog.text
    assert "Switch adaptive runtime state: steps 3 -> 5, draft_tokens 4 -> 6" in caplog.text
    assert ctl.steps_for_batch(40) == 1  # slot 32 holds its own tier


def test_default_tables_by_version():
    assert candidate_union(load_config(None, "0.5.23")) == [0, 1, 3, 5, 7]
    assert candidate_union(load_config(None, "0.5.17")) == [0, 1, 3, 7]
    assert load_config(None, "0.5.17")[1].candidate_steps == (1, 3, 7)
    assert AdaptiveController(3, load_config(None, "0.5.17"), [1]).startup_line() == (
        "AdaptiveSpeculativeParams initialized: steps=3, candidate_steps=[1, 3, 7]"
    )


def test_config_file_is_read_with_top_level_defaults(tmp_path):
    f = tmp_path / "a.json"
    f.write_text(
        json.dumps(
            {
                "ema_alpha": 0.5,
                "warmup_batches": 2,
                "1": {"candidate_steps": [2, 4]},
                "16": {"candidate_steps": [0, 2], "warmup_batches": 0},
                "note": "ignored",
            }
        )
    )
    slots = load_config(str(f))
    assert sorted(slots) == [1, 16]
    assert slots[1] == SlotConfig(candidate_steps=(2, 4), ema_alpha=0.5, warmup_batches=2)
    assert slots[16].warmup_batches == 0 and slots[16].ema_alpha == 0.5


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[1, 2]", "speculative adaptive config must be a JSON object, got list"),
        ('{"strategy": "fast"}', "speculative_adaptive_config must contain at least one integer-string BS key"),
        (
            '{"1": {"candidate_steps": [1, -3]}}',
            "BS 1: candidate_steps must be a list of non-negative ints, got [1, -3]",
        ),
        ('{"1": {"candidate_steps": []}}', "BS 1: candidate_steps must be a list of non-negative ints, got []"),
        ('{"fast": {}}', "speculative_adaptive_config must contain at least one integer-string BS key"),
        ("{not json", "is not JSON"),
        ('{"1": {"candidate_steps": [1], "update_interval": 0}}', "BS 1: update_interval must be >= 1"),
    ],
)
def test_bad_config_files_are_refused_in_one_line(tmp_path, text, error):
    f = tmp_path / "a.json"
    f.write_text(text)
    with pytest.raises(AdaptiveConfigError, match=None) as e:
        load_config(str(f))
    assert error in str(e.value) and "\n" not in str(e.value)


def _argv(*more: str) -> list[str]:
    return ["--model-path", "m", "--speculative-algorithm", "EAGLE", "--speculative-adaptive", *more]


def test_launch_defaults_topk_and_steps_from_the_candidate_union():
    a = resolve(_argv())
    assert (a.speculative_num_steps, a.speculative_eagle_topk, a.speculative_num_draft_tokens) == (3, 1, 4)
    a = resolve(_argv("--speculative-num-steps", "7"))
    assert (a.speculative_num_steps, a.speculative_eagle_topk, a.speculative_num_draft_tokens) == (7, 1, 8)
    assert a.speculative_adaptive and not a.warnings[1:]


def test_launch_refuses_steps_outside_the_union_in_sglangs_words(tmp_path):
    assert check_argv(_argv("--speculative-num-steps", "4")) == (
        "--speculative-num-steps=4 is not in the adaptive config candidate_steps [0, 1, 3, 5, 7]. "
        "Pass one of those values."
    )
    assert "candidate_steps [0, 1, 3, 7]" in str(
        check_argv(_argv("--speculative-num-steps", "5", "--sim-sglang-version", "0.5.17"))
    )
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    assert check_argv(_argv("--speculative-adaptive-config", str(bad))) == (
        "speculative adaptive config must be a JSON object, got list"
    )
    assert "cannot read --speculative-adaptive-config" in str(
        check_argv(_argv("--speculative-adaptive-config", str(tmp_path / "missing.json")))
    )


def test_unsupported_settings_switch_adaptive_off_with_sglangs_warning():
    a = resolve(_argv("--enable-multi-layer-eagle"))
    assert not a.speculative_adaptive
    assert (
        "speculative_adaptive disabled: enable_multi_layer_eagle=True is not supported (MultiLayerEagleWorkerV2 does "
        "not implement adaptive). Falling back to static speculative params." in a.warnings
    )
    a = resolve(["--model-path", "m", "--speculative-adaptive"])
    assert not a.speculative_adaptive and "speculative_algorithm=None (only EAGLE/EAGLE3" in a.warnings[0]


def test_the_checking_parser_raises_instead_of_exiting():
    with pytest.raises(ArgsError):
        resolve(_argv("--speculative-num-steps", "2"), parser=build_parser(_CheckingParser))


def test_runtime_states_and_the_0_5_17_logits_buffer_failure():
    """0.5.17 sized the shared logits buffer for the startup draft count: with graphs up to 48 and steps 3 it held
    48 * 4 = 192 rows; the steps-7 tier needs 48 * 8 = 384 (the real H200 log). Tiers below the startup one built."""
    spec17 = AdaptiveSpec(load_config(None, "0.5.17"), tuple(cuda_graph_bs(48)))
    lines, failure = build_runtime_states(spec17, 3, "0.5.17")
    assert lines == [
        "Built adaptive runtime state steps=0: elapsed=0.00s, mem=0.00GB",
        "Built adaptive runtime state steps=1: elapsed=0.00s, mem=0.00GB",
    ]
    assert failure is not None and failure.startswith(
        "AssertionError: shared logits buffer holds 192 rows but caller needs 384 (vocab_size="
    )
    assert build_runtime_states(spec17, 7, "0.5.17")[1] is None  # started at the widest tier: nothing wider
    spec23 = AdaptiveSpec(load_config(None, "0.5.23"), tuple(cuda_graph_bs(48)))
    lines, failure = build_runtime_states(spec23, 3, "0.5.23")
    assert failure is None and [ln.split(":")[0] for ln in lines] == [
        f"Built adaptive runtime state steps={s}" for s in (0, 1, 5, 7)
    ]


def test_0_5_17_launch_fails_with_one_line(capsys):
    args = resolve(_argv("--sim-sglang-version", "0.5.17"))
    with pytest.raises(SystemExit) as e:
        _adaptive_startup(args, AdaptiveSpec(load_config(None, "0.5.17"), tuple(cuda_graph_bs(48))))
    assert e.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "rig.sim: error: SGLang 0.5.17 fails at startup: AssertionError: shared logits buffer holds 192 rows but "
        "caller needs 384 (vocab_size=248320)"
    ]


def _scenario(concurrency: int, n: int, **kw):
    from rig.sim.virtual import Scenario

    prompt = "Tell me about the history of the city, its people and the rivers that shaped its trade."
    return Scenario(steps=3, concurrency=concurrency, n_requests=n, output_tokens=(400,), prompts=(prompt,), **kw)


def test_each_decode_costs_and_commits_at_the_active_tier():
    """On the virtual clock every decode's duration is the cost of the tier the controller routed it to, and a
    steps-0 decode still pays the one-token verify plus the draft extend."""
    from rig.sim.cost import ForwardCost
    from rig.sim.profile import load_profile
    from rig.sim.requests import Sampling, build_req, plan_request, prompt_key
    from rig.sim.scheduler import Scheduler
    from rig.sim.virtual import engine_config

    prof = load_profile()
    cfg = engine_config(prof, 3, adaptive=True)
    cost = ForwardCost(prof, 4)
    sched = Scheduler(cfg, cost)
    assert cfg.chain_steps == 7
    for i in range(12):
        s = Sampling(max_new_tokens=300, temperature=0.0, ignore_eos=True)
        plan = plan_request(prof, cfg.chain_steps, ["a", "b"], prompt_key([i]), s)
        sched.submit(build_req(f"r{i}", plan, 2, s, i), 0.0)
    t, seen = 0.0, set()
    while sched.busy:
        it = sched.plan(t)
        assert it is not None
        if it.kind == "decode":
            b = len(it.reqs)
            assert it.steps == sched.adaptive.active if sched.adaptive else False
            assert it.duration == cost.decode(b, it.steps, it.ctx, True) and it.tokens == b * (it.steps + 1)
            seen.add((sched.adaptive.slot_key(b), it.steps))
        sched.complete(it, t + it.duration, t)
        t += it.duration
    assert {steps for key, steps in seen if key == 8} <= {0, 1, 3} and any(k == 8 for k, _ in seen)
    assert cost.decode(8, 0, 1000, True) == cost.target(8, 1000) + cost.draft(8) > cost.decode(8, 0, 1000)


def test_the_tier_follows_the_load_on_the_virtual_clock():
    """One request at a time: slot "1" climbs past 3 once greedy output repeats (acceptance near 1); 16 at once
    (as many as may run) route to slot "8" ([0, 1, 3]): never above 3 while 8 or more run."""
    from rig.sim.profile import load_profile
    from rig.sim.virtual import run_closed_loop

    prof = load_profile()
    alone = run_closed_loop(prof, _scenario(1, 3, adaptive=True)).extra
    crowd = run_closed_loop(prof, _scenario(16, 32, adaptive=True)).extra
    assert alone["mean_active_steps"] > 3 and alone["switches"] >= 1
    assert set(alone["mean_steps_by_slot"]) == {1}
    assert crowd["mean_steps_by_slot"][8] <= 3 + 1e-9  # while 8 or more run (the drain alone goes back to slot 1)
    assert run_closed_loop(prof, _scenario(1, 3)).extra == {}  # static: no controller


def test_gauges_and_internal_states_show_the_active_tier_and_the_top_level_the_startup():
    """The decode log sets sglang:spec_num_steps / spec_num_draft_tokens from the active tier (metrics_reporter.py
    _active_spec_config_snapshot); /server_info's internal state carries it, the top level keeps the startup 3."""
    import asyncio

    from rig.sim.launch import build_server, prepare
    from rig.sim.scheduler import Iteration
    from rig.sim.server import server_info_dict

    async def go():
        srv = build_server(*prepare(_argv("--tp-size", "4", "--decode-log-interval", "1")))
        await srv.engine.stop()  # no real-time loop: drive the bookkeeping by hand
        eng = srv.engine
        m = eng.metrics
        startup = (m.spec_num_steps._value.get(), server_info_dict(srv)["internal_states"][0]["speculative_num_steps"])
        eng.sched.adaptive._activate(1)  # the controller switched (as on_verify_complete does)
        eng.sched.counters.verify_calls = 1
        eng._account(Iteration("decode", 0.01, [], steps=1), eng.loop.time())
        info = server_info_dict(srv)
        return startup, m.spec_num_steps._value.get(), m.spec_num_draft_tokens._value.get(), info

    startup, steps, draft, info = asyncio.run(go())
    assert startup == (3, 3)
    assert (steps, draft) == (1, 2)
    assert info["internal_states"][0]["speculative_num_steps"] == 1
    assert info["speculative_num_steps"] == 3 and info["speculative_num_draft_tokens"] == 4


def test_meta_info_accept_rate_uses_the_startup_draft_count_as_sglang_does():
    """tokenizer_manager.py divides by verify_ct x (startup draft tokens - 1): 10 verifies at tier 7 accepting 5
    drafts each report 50 / 30, above 1, and no field says which tier ran."""
    from types import SimpleNamespace

    from rig.sim.responses import speculative_fields

    st = SimpleNamespace(req=SimpleNamespace(verify_ct=10, accepted_drafts=50, hist=[0] * 8), n_tokens=60)
    meta = speculative_fields(st, 3)  # the engine passes its startup steps
    assert meta["spec_accept_rate"] == pytest.approx(50 / 30) and meta["spec_num_proposed_drafts"] == 30
    assert not any("num_steps" in k for k in meta)
