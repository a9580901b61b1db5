"""Behaviour is unchanged by refactors: rig's outputs on a checked-in run equal the files taken before (issue 13).

The run directory (tests/data/golden/run) was recorded on the simulator; the reports, comparisons, CSV tables and
dry-run lines it produced are in tests/data/golden/out. A difference here is a change users would see: either a bug,
or an intended change that regenerates the files (`python tests/golden.py --write`) and says so in its commit.
"""

import difflib
import shutil

import pytest
from golden import OUT, RUN, outputs


@pytest.fixture(scope="module")
def produced(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("golden")
    run = tmp / "run"
    shutil.copytree(RUN, run)  # a copy: a command that writes into the run must not alter the checked-in data
    return outputs(run, tmp)


def expected_names():
    return sorted(str(p.relative_to(OUT)) for p in OUT.rglob("*") if p.is_file())


def test_the_same_output_files_exist(produced):
    assert sorted(produced) == expected_names()


@pytest.mark.parametrize("name", expected_names())
def test_output_is_unchanged(produced, name):
    want = (OUT / name).read_text()
    got = produced.get(name, "")
    diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "golden", "now", n=1))
    assert got == want, f"{name} changed:\n{diff[:4000]}"
