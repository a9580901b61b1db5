"""The simulator's GPU power model (rig/sim/power.py): stated parameters, terms that add up, monotone in work."""

from __future__ import annotations

import pytest
import yaml

from rig.sim.cost import ForwardCost
from rig.sim.power import PowerMeter, PowerModel
from rig.sim.profile import REFERENCE_PROFILE, load_profile
from rig.sim.scheduler import Iteration

POWER = ("gpu_board_power_w", "gpu_idle_w", "gpu_fixed_w", "gpu_memory_w", "gpu_compute_w")


@pytest.fixture(scope="module")
def profile():
    return load_profile()


def decode(cost: ForwardCost, batch: int, steps: int, ctx: int = 4000) -> Iteration:
    return Iteration(
        "decode", cost.decode(batch, steps, ctx), [object()] * batch, tokens=batch * (steps + 1), ctx=ctx, steps=steps
    )


def test_power_parameters_are_stated_with_unit_and_source():
    params = yaml.safe_load(REFERENCE_PROFILE.read_text())["parameters"]
    for name in POWER:
        assert params[name]["unit"] == "W" and params[name]["source"].startswith(("fact:", "assumption:")), name
    assert params["gpu_board_power_w"]["value"] == 600.0  # RTX PRO 6000 Blackwell
    assert params["gpu_board_power_w"]["source"].startswith("fact:")


@pytest.mark.parametrize("steps", [0, 1, 3, 4])
@pytest.mark.parametrize("batch", [1, 12, 64])
def test_terms_add_up_to_the_iteration_time(profile, steps, batch):
    cost = ForwardCost(profile, 4)
    m = PowerModel(profile, cost, steps)
    it = decode(cost, batch, steps)
    assert m.terms(it).total == pytest.approx(it.duration, rel=1e-12)
    pre = Iteration("prefill", cost.prefill(3000, 3500, steps > 0), [object()], [3000], tokens=3000, ctx=3500)
    assert m.terms(pre).total == pytest.approx(pre.duration, rel=1e-12)


def test_draw_rises_with_batch_and_steps_and_stays_within_board_power(profile):
    cost = ForwardCost(profile, 4)
    for steps in (0, 2, 4):
        m = PowerModel(profile, cost, steps)
        watts = [m.watts(m.terms(decode(cost, b, steps))) for b in (1, 4, 16, 64, 256)]
        assert watts == sorted(watts) and watts[0] > profile.gpu_idle_w and watts[-1] <= profile.gpu_board_power_w
    # The same batch verifying more drafted tokens (accepted or not) draws more and costs more energy.
    energies = []
    for steps in (0, 1, 2, 3, 4):
        m = PowerModel(profile, cost, steps)
        t = m.terms(decode(cost, 12, steps))
        energies.append(m.watts(t) * t.total)
    assert energies == sorted(energies) and energies[-1] > 1.5 * energies[0]


def test_rejected_drafts_cost_energy_per_committed_token(profile):
    """One verify at steps 4 costs the same energy whatever is accepted: at 1 accepted token of 5 the energy per
    committed token is 5 / (1 + 1) times that at all 4 accepted (committed = accepted + 1)."""
    cost = ForwardCost(profile, 4)
    m = PowerModel(profile, cost, 4)
    t = m.terms(decode(cost, 8, 4))
    e = m.watts(t) * t.total
    per_token = {acc: e / (8 * (acc + 1)) for acc in (0, 2, 4)}
    assert per_token[0] == pytest.approx(5 * per_token[4])
    assert per_token[0] > per_token[2] > per_token[4]


def test_meter_integrates_idle_and_iterations(profile):
    cost = ForwardCost(profile, 4)
    model = PowerModel(profile, cost, 3)
    meter = PowerMeter(model, t0=100.0)
    assert meter.energy_j(110.0) == pytest.approx(10 * profile.gpu_idle_w)
    it = decode(cost, 16, 3)
    w = model.watts(model.terms(it))
    meter.run(it, 110.0, 110.5)
    assert meter.energy_j(110.25) == pytest.approx(10.25 * profile.gpu_idle_w + 0.25 * (w - profile.gpu_idle_w))
    assert meter.energy_j(111.0) == pytest.approx(11 * profile.gpu_idle_w + 0.5 * (w - profile.gpu_idle_w))
    watts, busy, _ = meter.window(111.0)  # NVML's 1 s average over [110, 111]
    assert watts == pytest.approx(profile.gpu_idle_w + 0.5 * (w - profile.gpu_idle_w)) and busy == pytest.approx(0.5)
    # Old iterations fold into the counter without changing it.
    before = meter.energy_j(200.0)
    meter.run(it, 199.0, 199.5)
    assert meter.energy_j(200.0) == pytest.approx(before + 0.5 * (w - profile.gpu_idle_w))
    assert len(meter._segments) == 1
