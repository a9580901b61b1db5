"""The campaign fit reproduces the shipped profile (integration tier, slow; the fit's fast checks are in
test_sim_fit.py)."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from rig.sim.cli import sim
from rig.sim.fit import CAMPAIGN_FREE
from rig.sim.profile import REFERENCE_PROFILE, load_profile


@pytest.mark.slow
def test_campaign_fit_reproduces_the_shipped_profile(tmp_path):
    doc = yaml.safe_load(REFERENCE_PROFILE.read_text())
    cmd = doc["produced_by"].split()
    assert cmd[:4] == ["rig", "sim", "fit", "--campaign"]
    out = tmp_path / "refit.yaml"
    args = cmd[2:]
    args[args.index("-o") + 1] = str(out)
    r = CliRunner().invoke(sim, args)
    assert r.exit_code == 0, r.output
    new, ref = load_profile(out), load_profile()
    for name in CAMPAIGN_FREE:
        assert new.values[name] == pytest.approx(ref.values[name], rel=0.02), name
    shipped = {q["target"]: q["simulated"] for q in doc["fit_quality"]}
    for q in yaml.safe_load(out.read_text())["fit_quality"]:
        assert q["simulated"] == pytest.approx(shipped[q["target"]], rel=0.01), q["target"]
