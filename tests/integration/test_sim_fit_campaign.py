"""The campaign fit reproduces the shipped profile (integration tier, slow; the fit's fast checks are in
test_sim_fit.py). The refit is the shipped profile's own command (its produced_by); the session starts it at the
lowest CPU priority when it begins (tests/early.py), so its minutes of CPU fill the time other tests wait."""

from __future__ import annotations

import pytest
import yaml
from early import result

from rig.sim.fit import CAMPAIGN_FREE
from rig.sim.profile import REFERENCE_PROFILE, load_profile

# The draft's fixed cost per forward barely moves the campaign's figures once drafts run under the capacity model of
# SGLang's form: refits from the shipped profile took it 0.0799 -> 0.0598 -> 0.0450 ms (2026-12-02) while the
# objective moved 0.03976 -> 0.03949 -> 0.03934 and every other parameter stayed within 1 %. Its value is not a
# property of the campaign; the simulated figures (fit_quality, below) are.
WEAKLY_IDENTIFIED = frozenset({"d_fixed_ms"})


@pytest.mark.slow
def test_campaign_fit_reproduces_the_shipped_profile(tmp_path):
    doc = yaml.safe_load(REFERENCE_PROFILE.read_text())
    rc, log, out = result("refit", tmp_path)
    assert rc == 0, log[-3000:]
    new, ref = load_profile(out), load_profile()
    for name in CAMPAIGN_FREE:
        if name in WEAKLY_IDENTIFIED:
            continue
        assert new.values[name] == pytest.approx(ref.values[name], rel=0.02), name
    shipped = {q["target"]: q["simulated"] for q in doc["fit_quality"]}
    for q in yaml.safe_load(out.read_text())["fit_quality"]:
        assert q["simulated"] == pytest.approx(shipped[q["target"]], rel=0.01), q["target"]
