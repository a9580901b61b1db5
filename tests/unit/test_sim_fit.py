"""The fitter and `rig sim` CLI: the shipped reference profile is what the fit command produces."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rig.sim.cli import sim
from rig.sim.fit import Target, evaluate, objective
from rig.sim.profile import load_profile
from rig.sim.virtual import Scenario


def test_fit_usage_errors():
    r = CliRunner().invoke(sim, ["fit"])
    assert r.exit_code == 2 and "either --campaign or RUN_DIR" in r.output


def test_sim_cli_rejects_unknown_flag_like_argparse():
    r = CliRunner().invoke(sim, ["--model-path", "m", "--bogus"])
    assert r.exit_code == 2


def test_objective_is_zero_at_the_target_and_grows_with_error():
    ref = load_profile()
    sc = Scenario(2, 2, 4, (100,), ("hello world",))
    sim_value = evaluate(ref, [Target("t", "aggregate_tok_s", 1.0, sc)])[0]["sim"]
    exact = evaluate(ref, [Target("t", "aggregate_tok_s", sim_value, sc)])
    off = evaluate(ref, [Target("t", "aggregate_tok_s", sim_value * 1.2, sc)])
    assert objective(exact) == pytest.approx(0.0, abs=1e-12)
    assert objective(off) == pytest.approx(__import__("math").log(1.2) ** 2)


def test_the_first_simplex_stays_within_bounds():
    """A run directory's first simplex moves each parameter by the step, downwards where upwards leaves its bounds."""
    import numpy as np

    from rig.sim.fit import _simplex

    s = _simplex(np.array([0.0, 1.9]), [(-5.0, 5.0), (0.0, 2.0)], 0.7)
    assert s.shape == (3, 2)
    assert s[1].tolist() == pytest.approx([0.7, 1.9]) and s[2].tolist() == pytest.approx([0.0, 1.2])
