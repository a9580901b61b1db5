"""The sim's model core in virtual time: capacity, acceptance, determinism, and the campaign figures."""

from __future__ import annotations

import random

import pytest

from rig.sim.acceptance import chain_survival, draw_accepted, expected_accept_length, regime_logit
from rig.sim.fit import campaign_flags, campaign_targets, evaluate
from rig.sim.prefix_cache import PrefixCache
from rig.sim.profile import SPECS, load_profile
from rig.sim.requests import Sampling, output_stream, plan_request, prompt_key
from rig.sim.text import content_score, token_id, tokenize
from rig.sim.virtual import Scenario, engine_config, run_closed_loop, summarize

PROSE = "Tell me about the history of the city, its people and the rivers that shaped its trade over the centuries."
CODE = "def f(x):\n    return {k: v for k, v in x.items() if v[0] == k}\nprint(f({'a': [1]}), len(x) + 2 * 3)"


@pytest.fixture(scope="module")
def ref():
    return load_profile()


def test_profile_parameters_have_name_unit_description(ref):
    import yaml

    from rig.sim.profile import REFERENCE_PROFILE

    doc = yaml.safe_load(REFERENCE_PROFILE.read_text())
    assert set(doc["parameters"]) == {s.name for s in SPECS}
    for name, p in doc["parameters"].items():
        assert p["unit"] and p["description"] and isinstance(p["value"], (int, float)), name
    assert "rig sim fit --campaign" in doc["produced_by"]
    assert set(doc["acceptance_assumptions"]) == {"greedy (temperature 0)", "sampled (temperature > 0)"}


def test_effective_max_running_falls_as_steps_rise(ref):
    flags = campaign_flags()  # the campaign's assumed launch (3 state slots per request)
    m = [engine_config(ref, s, state_flags=flags).max_running for s in (1, 2, 3, 4)]
    assert m == sorted(m, reverse=True) and len(set(m)) == 4
    assert 22 <= m[0] <= 28 and 15 <= m[2] <= 19  # campaign: 26 at steps 1, about 17 at steps 3 (fit: 22, 16)
    d = [engine_config(ref, s).max_running for s in (1, 2, 3, 4)]  # SGLang's defaults: 5 slots, fewer requests
    assert d == sorted(d, reverse=True) and all(a < b for a, b in zip(d, m, strict=True))


def test_chain_draw_matches_its_law():
    surv = chain_survival(1.5, 0.3, 4)
    rng = random.Random(1)
    n = 40000
    mean = sum(draw_accepted(surv, rng.random()) for _ in range(n)) / n + 1
    assert mean == pytest.approx(expected_accept_length(surv), abs=0.02)


def test_content_score_orders_code_above_prose():
    assert content_score(tokenize(CODE)) > 0.7 > 0.3 > content_score(tokenize(PROSE))


def test_sampled_acceptance_lower_than_greedy(ref):
    for text in (PROSE, CODE):
        s = content_score(tokenize(text))
        assert regime_logit(ref, s, 0.7) < regime_logit(ref, s, 0.0)
    greedy = expected_accept_length(chain_survival(regime_logit(ref, 0.2, 0.0), ref.acc_logit_position_decay, 4))
    sampled = expected_accept_length(chain_survival(regime_logit(ref, 0.2, 0.7), ref.acc_logit_position_decay, 4))
    assert sampled < greedy - 0.2


def _output(ref, steps: int, s: Sampling, text: str = PROSE, n: int = 300) -> list[int]:
    toks = tokenize(text)
    plan = plan_request(ref, steps, toks, prompt_key([token_id(t) for t in toks]), s)
    ids, _ = output_stream(ref, plan).extend(n)
    return ids


def test_greedy_output_independent_of_steps_sampled_depends_on_seed(ref):
    g = Sampling(max_new_tokens=300, temperature=0.0)
    assert _output(ref, 0, g) == _output(ref, 4, g) == _output(ref, 2, g)
    s1, s2 = (Sampling(max_new_tokens=300, temperature=0.7, seed=k) for k in (1, 2))
    assert _output(ref, 4, s1) == _output(ref, 1, s1)
    assert _output(ref, 4, s1) != _output(ref, 4, s2)


def test_closed_loop_is_deterministic_and_counts_tokens(ref):
    sc = Scenario(3, 8, 16, (200,), (PROSE, CODE))
    a, b = summarize(run_closed_loop(ref, sc)), summarize(run_closed_loop(ref, sc))
    assert a == b
    assert a["tokens"] == 16 * 200
    assert 1.0 < a["accept_length"] <= 4.0


def test_sampled_traffic_accepts_less_than_greedy_in_simulation(ref):
    greedy = summarize(run_closed_loop(ref, Scenario(3, 4, 8, (300,), (PROSE,))))
    sampled = summarize(run_closed_loop(ref, Scenario(3, 4, 8, (300,), (PROSE,), temperature=0.7)))
    assert sampled["accept_length"] < greedy["accept_length"] - 0.3


def test_reference_profile_reproduces_campaign_in_virtual_time(ref):
    rows = {r["label"]: r for r in evaluate(ref, campaign_targets())}
    for c in (1, 4, 16, 32, 64):
        for kind in ("aggregate", "per-request"):
            r = rows[f"steps4 C={c} {kind}"]
            assert abs(r["rel_err"]) <= 0.10, r
    for steps in (1, 2, 3):
        r = rows[f"steps{steps} C=1 per-request"]
        assert abs(r["rel_err"]) <= 0.10, r
    assert rows["steps4 C=64 aggregate"]["sim"] < rows["steps3 C=64 aggregate"]["sim"]


def test_prefix_cache_matches_longest_prefix_and_evicts():
    c = PrefixCache(capacity_tokens=10)
    c.insert([1, 2, 3, 4])
    assert c.match([1, 2, 3, 9]) == 3 and c.match([9]) == 0
    c.insert([5, 6, 7, 8, 9, 10, 11])  # over capacity: the oldest sequence goes
    assert c.match([1, 2]) == 0 and c.match([5, 6, 7]) == 3


def test_a_head_drafts_worse_past_the_positions_it_was_trained_for():
    free = chain_survival(1.5, 0.3, 4)
    trained = chain_survival(1.5, 0.3, 4, trained=2, beyond=3.0)
    assert trained[:2] == free[:2]  # positions 1-2 as before
    assert trained[2] < free[2] * 0.2 and trained[3] < trained[2]
    assert chain_survival(1.5, 0.3, 4, trained=0, beyond=3.0) == free  # 0: no limit


def test_the_host_streams_at_most_one_chunk_per_host_chunk_ms(ref):
    """A serial host cost per streamed chunk caps a plain server's decode at 1 / host_chunk_ms chunks a second (here
    500 at 2 ms) however large the batch, and leaves a small batch (GPU-bound) as it was."""
    capped = ref.with_values(host_chunk_ms=2.0)
    big, small = Scenario(0, 64, 128, (100,), (PROSE,)), Scenario(0, 1, 4, (100,), (PROSE,))
    free_big, capped_big = (summarize(run_closed_loop(p, big)) for p in (ref, capped))
    assert free_big["aggregate_tok_s"] > 1000 and capped_big["aggregate_tok_s"] <= 500 * 1.001
    assert capped_big["aggregate_tok_s"] > 500 * 0.8  # bound by the host, not starved
    free_small, capped_small = (summarize(run_closed_loop(p, small)) for p in (ref, capped))
    assert capped_small["aggregate_tok_s"] == pytest.approx(free_small["aggregate_tok_s"], rel=0.01)
