"""RunSpec from YAML and flags: defaults, sweeps, and one-line errors (exit 2) for every bad value."""

import subprocess
import sys
from itertools import islice

import pytest
from click.testing import CliRunner

from rig.cli import cli
from rig.config import RunSpec, SpecError, build_spec
from rig.run.plans import split_closed, split_open
from rig.run.points import expand_points
from rig.spec_yaml import load_yaml
from rig.workloads import build_sessions
from rig.workloads.spec import WorkloadSpec


def test_defaults_are_the_main_job():
    spec = RunSpec()
    assert spec.server.engine == "sim" and spec.steps == [4] and spec.workloads[0].name == "realistic"
    assert spec.load.concurrency == [1, 4, 16, 32, 64] and spec.clients == 1
    assert [spec.load.requests_for(c, None) for c in spec.load.concurrency] == [4, 8, 32, 64, 128]


def test_sweep_product_and_stable_point_ids():
    spec = build_spec(
        {},
        {
            "server": {"engine": "sglang"},
            "steps": [0, 2],
            "server_grid": {"eagle_topk": [1, 2]},
            "workloads": [{"name": "greedy"}, {"name": "realistic"}],
            "load": {"concurrency": [1, 4]},
        },
    )
    cfgs = spec.server_configs()
    assert [(c.steps, c.eagle_topk) for c in cfgs] == [(0, 1), (2, 1), (0, 2), (2, 2)]
    points = expand_points(spec)
    assert len(points) == 4 * 2 * 2
    assert len({p.point for p in points}) == len(points)
    assert [p.point for p in expand_points(spec)] == [p.point for p in points]  # deterministic (resume relies on it)


@pytest.mark.parametrize(
    "data,needle",
    [
        ({"load": {"concurrency": [0]}}, "load.concurrency"),
        ({"steps": [-1]}, "steps"),
        ({"server": {"tp": 0}}, "server.tp"),
        ({"server": {"engine": "tgi"}}, "server.engine"),
        ({"bogus": 1}, "bogus"),
        ({"load": {"mode": "poisson"}}, "rate"),
        ({"run_id": "../etc"}, "run_id"),
        ({"server_grid": {"port": [1, 2]}}, "cannot sweep 'port'"),
        ({"server": {"engine": "external"}}, "server.url"),
    ],
)
def test_bad_values_give_one_line_naming_the_key(data, needle):
    with pytest.raises(SpecError) as e:
        build_spec(data, {})
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


def test_bad_yaml_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("server:\n  engine: sim\n   tp: [\n")
    with pytest.raises(SpecError, match=r"bad.yaml: line \d+ invalid YAML"):
        load_yaml(bad)
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="top level must be a mapping"):
        load_yaml(tmp_path / "list.yaml")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run", "--concurrency", "1,x"], "comma-separated integers"),
        (["run", "--engine", "nope"], "nope"),
        (["run", "--tp", "0"], "server.tp"),
        (["run", "--workload", "greedy,realistic"], "rig sweep"),
        (["run", "--workload-opt", "temperature"], "KEY=VALUE"),
        (["run", "--config", "/nonexistent.yaml"], "no such file"),
        (["sweep", "--grid", "port=1,2"], "cannot sweep"),
    ],
)
def test_cli_errors_exit_2_with_one_line(args, needle):
    proc = subprocess.run([sys.executable, "-m", "rig.cli", *args, "--dry-run"], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_dry_run_prints_command_and_placement():
    res = CliRunner().invoke(cli, ["run", "--steps", "3", "--concurrency", "1,4", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4" in res.output
    assert "-m rig.sim" in res.output and "local Ray" in res.output
    assert res.output.count("-realistic-c") == 2


def test_closed_split_sums_to_concurrency_and_covers_every_session():
    sessions = build_sessions(WorkloadSpec(name="greedy"), seed=0, n_sessions=10)
    for c, g in [(1, 1), (4, 2), (5, 2), (3, 4)]:
        parts = split_closed(sessions, c, g)
        assert sum(slots for _, slots in parts) == c
        ids = sorted(s.session_id for mine, _ in parts for s in mine)
        assert ids == sorted(s.session_id for s in sessions)


def test_open_split_keeps_absolute_offsets():
    sessions = build_sessions(WorkloadSpec(name="greedy"), seed=0, n_sessions=5)
    offs = [0.0, 0.1, 0.3, 0.35, 0.9]
    parts = split_open(sessions, offs, 2, cap=3)
    assert parts[0][1] == [0.0, 0.3, 0.9] and parts[1][1] == [0.1, 0.35]
    assert parts[0][2] + parts[1][2] == 3


def test_lazy_sessions_match_the_eager_split():
    from itertools import islice

    from rig.loadgen.plan import LazySessions

    spec = WorkloadSpec(name="realistic")
    eager = split_closed(build_sessions(spec, seed=3, n_sessions=60), 5, 2)
    for g in range(2):
        lazy = list(islice(iter(LazySessions(spec, 3, 5, 2, g, limit=60, chunk=7)), 1000))
        assert [s.session_id for s in lazy] == [s.session_id for s in eager[g][0]]
        assert lazy == eager[g][0]  # same prompts, sampling and seeds, built in chunks on the generator


def test_a_lazy_share_builds_only_its_own_sessions(monkeypatch):
    """A duration-bound closed-loop share builds its own sessions and no other generator's: with 8 generators each
    once built all the level's sessions to keep an eighth (a 256-session chunk, 20-150 ms on its event loop, every
    32 of its sessions: the loop lag that grew with N in the scale-out benchmark). C=1 over 2 generators: generator
    1 holds no slot and builds nothing, rather than look for its share among the ten million."""
    import rig.workloads
    from rig.loadgen.plan import LazySessions

    built: list[list[int]] = []
    real = rig.workloads.build_session_indices

    def counting(*a, **kw):
        built.append(list(kw["indices"]))
        return real(*a, **kw)

    monkeypatch.setattr(rig.workloads, "build_session_indices", counting)
    spec = WorkloadSpec(name="greedy")
    assert [slots for _, slots in split_closed([], 1, 2)] == [1, 0]
    assert list(LazySessions(spec, 0, 1, 2, 1, limit=10_000_000)) == [] and built == []
    # the generator that holds the slot takes every session, in chunks
    first = list(islice(iter(LazySessions(spec, 0, 1, 2, 0, limit=10_000_000, chunk=8)), 10))
    assert len(first) == 10 and built == [list(range(8)), list(range(8, 16))]
    # 16 slots over 8 generators: generator 3 owns residues 3 and 11 of every 16, and builds those alone
    built.clear()
    mine = list(islice(iter(LazySessions(spec, 0, 16, 8, 3, limit=10_000_000)), 6))
    assert [s.session_id for s in mine] == [f"greedy-{i:06d}" for i in (3, 11, 19, 27, 35, 43)]
    assert sum(len(b) for b in built) == 6 and max(len(b) for b in built) == 1  # one session per build


def test_a_lazy_dataset_share_ends_with_the_file(tmp_path):
    """A dataset without cycle: a share stops at the file's last entry it owns."""
    from rig.loadgen.plan import LazySessions

    path = tmp_path / "d.jsonl"
    path.write_text("".join(f'{{"prompt": "question {i}", "max_tokens": 4}}\n' for i in range(7)))
    spec = WorkloadSpec(name="dataset", path=str(path))
    shares = [[s.session_id for s in LazySessions(spec, 0, 4, 2, g, limit=10_000_000)] for g in range(2)]
    assert shares == [[f"dataset-{i:06d}" for i in (0, 2, 4, 6)], [f"dataset-{i:06d}" for i in (1, 3, 5)]]


def test_num_draft_tokens_grid_is_planned_as_it_runs():
    """SGLang runs steps + 1 draft tokens with eagle_topk 1 and passes none without speculation
    (arg_groups/speculative_hook.py::_handle_eagle_family): a num_draft_tokens grid plans one launch per value that
    really differs, and each configuration's knobs (the records' server_args) say what ran."""
    from rig.notices import notices

    spec = build_spec(
        {}, {"server": {"engine": "sglang"}, "steps": [0, 2], "server_grid": {"num_draft_tokens": [3, 8]}}
    )
    cfgs = spec.server_configs()
    assert [(c.steps, c.num_draft_tokens) for c in cfgs] == [(0, None), (2, 3)]
    assert len(spec.asked_configs()) == 4
    assert any("num_draft_tokens=3 at steps 0" in n and "2 launched" in n for n in notices(spec))
    tree = build_spec(
        {}, {"server": {"engine": "sglang", "eagle_topk": 4}, "steps": [2], "server_grid": {"num_draft_tokens": [4, 8]}}
    )
    assert [c.num_draft_tokens for c in tree.server_configs()] == [4, 8]  # a draft tree takes the value asked
    assert notices(tree) == []


def test_each_generator_warms_up_under_its_own_request_ids():
    """SGLang refuses a rid still in flight ("Duplicate request ID detected", managers/tokenizer_manager.py); the
    generators of a point warm up at once, so each sends its warm-up under ids of its own."""
    from rig.run.plans import build_plans

    spec = build_spec({}, {"load": {"concurrency": [4], "warmup_requests": 2}})
    point = expand_points(spec)[0]
    plans = build_plans(spec, point, "http://h:1", "m", "sglang-native", [0, 1, 2], None)
    ids = [t.request_id for p in plans for s in p.warmup for t in s.turns]
    assert len(ids) == 6 and len(set(ids)) == 6
    assert all(t.request_id.endswith(f"-g{p.generator}") for p in plans for s in p.warmup for t in s.turns)
    measured = {t.request_id for p in plans for s in p.sessions for t in s.turns}
    assert not measured & set(ids)
