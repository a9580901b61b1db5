"""A load profile inside one point: its text form and spec, the split over generators, the open loop's arrivals,
the closed loop's gate, and the phase every record carries."""

import asyncio
import time
from typing import Any

import click
import numpy as np
import pytest
from aiohttp.test_utils import TestServer
from click.testing import CliRunner
from fake_server import make_app
from synthetic import point_columns

from rig.cli_options import resolve_spec, run_options
from rig.config import LoadSpec, SpecError, build_spec
from rig.contracts.errors import ContractError
from rig.contracts.profile import parse_profile, profile_text, schedule
from rig.loadgen import arrivals
from rig.loadgen.drive import PointRun, make_session
from rig.loadgen.phases import PhaseGate
from rig.loadgen.plan import GeneratorPlan
from rig.results import read_requests
from rig.run.plans import build_plans
from rig.run.points import expand_points
from rig.workloads.base import Session, Turn


def test_text_form_reads_steps_ramps_and_units():
    closed = parse_profile("1:60s, 64:1m,1:30", "concurrency")
    assert [(p.concurrency, p.duration_s) for p in closed] == [(1, 60.0), (64, 60.0), (1, 30.0)]
    rated = parse_profile("2:30s,ramp(2,16,2m),0.5:1h", "rate")
    assert [(p.rate, p.rate_end, p.duration_s) for p in rated] == [(2, None, 30), (2, 16, 120), (0.5, None, 3600)]
    assert profile_text(rated) == "2:30s,ramp(2,16,120s),0.5:3600s"
    assert [p.start_s for p in schedule(closed)] == [0.0, 60.0, 120.0]


@pytest.mark.parametrize(
    ("text", "kind", "said"),
    [
        ("", "concurrency", "is empty"),
        ("1:60s,x", "concurrency", "cannot read 'x'"),
        ("1.5:3s", "concurrency", "not a whole number"),
        ("4:0s", "concurrency", "greater than 0"),
        ("0:3s,0:3s", "concurrency", "idle"),
        ("ramp(1,4,10s)", "concurrency", "cannot read"),  # a ramp is an open-loop phase
        ("-1:3s", "rate", "greater than or equal to 0"),
        ("2:abc", "rate", "cannot read"),
    ],
)
def test_a_bad_profile_is_one_line_naming_it(text, kind, said):
    with pytest.raises(ContractError) as e:
        parse_profile(text, kind)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_the_spec_takes_the_text_or_a_yaml_list_and_sets_the_duration():
    load = LoadSpec(profile="1:4s,8:4s,1:4s")
    assert load.duration_s == 12.0 and load.levels() == [(8, None)]
    yaml_form = LoadSpec(
        mode="gamma", rates=[], profile=[{"rate": 1, "duration_s": 5}, {"rate": 1, "rate_end": 9, "duration_s": 5}]
    )
    assert yaml_form.duration_s == 10.0 and yaml_form.levels() == [(None, 9.0)]


@pytest.mark.parametrize(
    ("load", "said"),
    [
        ({"profile": "1:3s", "requests": 4}, "drop --requests"),
        ({"profile": "1:3s", "duration_s": 5}, "drop --duration 5"),
        ({"mode": "trace", "profile": "1:3s"}, "takes no load profile"),
        ({"mode": "poisson", "profile": "1:3s", "rates": [2]}, "drop the rates"),
        ({"mode": "poisson", "profile": [{"concurrency": 2, "duration_s": 3}]}, "--rate-profile"),
        ({"profile": [{"concurrency": 2, "rate": 1, "duration_s": 3}]}, "either concurrency"),
    ],
)
def test_a_profile_the_rest_of_the_spec_contradicts_is_refused(load, said):
    with pytest.raises(SpecError) as e:
        build_spec({}, {"load": load})
    assert said in str(e.value) and "\n" not in str(e.value)


def _flags(*argv: str) -> Any:
    seen: dict[str, Any] = {}

    @click.command()
    @run_options
    def probe(**kw: Any) -> None:
        seen["spec"] = resolve_spec(kw, None, None)

    result = CliRunner().invoke(probe, list(argv))
    return seen.get("spec"), result


def test_the_flags_set_the_profile_and_refuse_what_it_replaces():
    spec, _ = _flags("--rate-profile", "2:5s,ramp(2,8,5s)", "--concurrency", "16")
    assert spec.load.mode == "poisson" and spec.load.max_concurrency == 16 and spec.load.duration_s == 10
    spec, _ = _flags("--load-profile", "1:2s,4:2s")
    assert [p.concurrency for p in spec.load.profile] == [1, 4]
    for argv, said in (
        (("--load-profile", "1:2s", "--concurrency", "4"), "drop --concurrency"),
        (("--rate-profile", "1:2s", "--rate", "4"), "drop --rate"),
        (("--load-profile", "1:2s", "--rate-profile", "1:2s"), "give one"),
        (("--load-profile", "1:2s,oops"), "cannot read 'oops'"),
    ):
        spec, result = _flags(*argv)
        assert spec is None and result.exit_code == 2 and said in result.output, (argv, result.output)


def test_a_profile_is_one_point_named_apart_and_a_sweep_has_one_per_configuration():
    spec = build_spec({}, {"steps": [0, 3], "load": {"profile": "1:2s,8:2s"}})
    names = [p.point for p in expand_points(spec)]
    assert len(names) == 2 and all("-profile-c8" in n for n in names)


def test_each_generator_gets_its_share_of_every_phase():
    spec = build_spec({}, {"load": {"profile": "1:2s,8:2s,3:2s,0:1s"}})
    plans = build_plans(spec, expand_points(spec)[0], "http://h:1", "m", "sglang-native", [0, 1, 2], None)
    caps = [p.phase_slots for p in plans]
    assert caps == [(1, 3, 1, 0), (0, 3, 1, 0), (0, 2, 1, 0)]
    assert [sum(c[i] for c in caps) for i in range(4)] == [1, 8, 3, 0]  # the shares sum to the phase's concurrency
    assert [p.slots for p in plans] == [3, 3, 2] and all(p.phase_starts == (0.0, 2.0, 4.0, 6.0) for p in plans)
    assert all(p.duration_s == 7.0 and p.lazy is not None for p in plans)


def test_the_open_loop_arrivals_follow_the_profile_and_split_round_robin():
    spec = build_spec({}, {"load": {"mode": "poisson", "profile": "2:100s,10:100s,0:50s,ramp(0,20,100s)"}})
    plans = build_plans(spec, expand_points(spec)[0], "http://h:1", "m", "sglang-native", [0, 1], None)
    offs = np.sort(np.concatenate([p.arrivals for p in plans]))
    counts = [
        int(((offs >= a) & (offs < b)).sum()) for a, b in ((0, 100), (100, 200), (200, 250), (250, 300), (300, 350))
    ]
    # expected 200, 1000, 0, then a ramp from 0 to 20/s: 250 in its first half, 750 in its second (Poisson noise)
    for got, want in zip(counts, (200, 1000, 0, 250, 750), strict=True):
        assert abs(got - want) <= 4 * max(1.0, want**0.5), counts
    assert abs(len(plans[0].arrivals) - len(plans[1].arrivals)) <= 1 and all(p.phase_slots == () for p in plans)


def test_one_constant_phase_is_the_fixed_rate_schedule():
    one = arrivals.profile_offsets("gamma", [(3.0, 3.0, 50.0)], seed=7, cv=2.0)
    assert np.allclose(one, arrivals.schedule("gamma", 3.0, cv=2.0, duration_s=50.0, seed=7))


def test_the_gate_gives_a_slot_room_only_in_phases_whose_cap_exceeds_it():
    gate = PhaseGate([0.0, 10.0, 20.0], [1, 4, 0], origin=100.0)
    assert gate.next_room(0, 101.0) == 101.0
    assert gate.next_room(2, 101.0) == 110.0  # waits for the phase of 4
    assert gate.next_room(2, 115.0) == 115.0
    assert gate.next_room(0, 125.0) is None  # the last phase is idle: nothing more
    assert gate.ever(3) and not gate.ever(4)
    assert [gate.phase_at(t) for t in (99.0, 100.0, 109.9, 110.0, 130.0)] == [0, 0, 0, 1, 2]


def test_a_slot_under_a_lowered_cap_waits_until_in_flight_falls_below_it():
    async def main() -> list[str]:
        in_flight = [3]
        gate = PhaseGate([0.0], [1], origin=time.perf_counter(), in_flight=lambda: in_flight[0])
        seen: list[str] = []

        async def slot0() -> None:
            assert await gate.admit(0, deadline=None)
            seen.append(f"admitted at {in_flight[0]}")

        task = asyncio.ensure_future(slot0())
        for _ in range(2):  # two of the three finish: still at the cap of 1
            await asyncio.sleep(0)
            in_flight[0] -= 1
            seen.append(f"ended -> {in_flight[0]}")
            gate.freed()
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        in_flight[0] -= 1
        gate.freed()
        await asyncio.wait_for(task, 5)
        return seen

    assert asyncio.run(main()) == ["ended -> 2", "ended -> 1", "admitted at 0"]


INFO = point_columns(concurrency=4)


def _sessions(n: int, turns: int) -> tuple[Session, ...]:
    return tuple(
        Session(
            session_id=f"s{i}",
            turns=tuple(
                Turn(request_id=f"s{i}-t{j}", max_tokens=6, messages=({"role": "user", "content": f"q{i}"},))
                for j in range(turns)
            ),
        )
        for i in range(n)
    )


async def _drive(tmp_path, plan: dict[str, Any]):
    server = TestServer(make_app())
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    run = PointRun(GeneratorPlan(point=INFO, generator=0, url=url, model="m", **plan), tmp_path, "h", 0.0)
    async with make_session() as http:
        summary = await run.run(http, time.perf_counter() + 0.05)
    await server.close()
    return summary


@pytest.mark.parametrize("turns", [1, 2])
def test_every_record_carries_its_phase_and_no_send_exceeds_the_phases_cap(tmp_path, turns):
    caps = (1, 4, 1)
    plan = {"sessions": _sessions(400, turns), "slots": 4, "duration_s": 0.6, "phase_starts": (0.0, 0.2, 0.4)}
    summary = asyncio.run(_drive(tmp_path, {**plan, "phase_slots": caps}))
    t = read_requests(tmp_path).to_pandas().sort_values("intended_send_ts")
    sent = t[t.send_ts.notna()]
    assert summary.status == "complete" and set(sent.phase) <= {0, 1, 2} and sent.phase.is_monotonic_increasing
    assert (sent.status == "ok").all()  # a lowered cap cancels nothing
    for r in sent.itertuples():  # requests of the generator in flight when this one was sent
        others = ((sent.send_ts < r.send_ts) & (sent.end_ts > r.send_ts)).sum()
        assert others < caps[r.phase], (r.request_id, r.phase, others)
    unsent = t[t.send_ts.isna()]
    assert unsent.error.str.startswith("not sent").all() and unsent.phase.notna().all()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["sweep", "--search", "concurrency", "--slo", "ttft=500ms"], "--search varies one fixed level"),
        (["tune", "--slo", "ttft=500ms"], "rig tune measures fixed levels"),
    ],
)
def test_search_and_tune_refuse_a_profile(argv, said):
    from rig.cli import cli

    result = CliRunner().invoke(cli, [*argv, "--load-profile", "1:2s,4:2s", "--dry-run"])
    assert result.exit_code == 2 and said in result.output, result.output


def test_the_open_loop_tags_each_arrival_with_the_phase_it_was_due_in(tmp_path):
    offsets = tuple(0.01 + 0.02 * i for i in range(30))  # 0.01 .. 0.59 s, none on a boundary
    plan = {"sessions": _sessions(30, 1), "arrivals": offsets, "slots": 8, "phase_starts": (0.0, 0.2, 0.4)}
    summary = asyncio.run(_drive(tmp_path, plan))
    t = read_requests(tmp_path).to_pandas()
    assert summary.status == "complete" and len(t) == 30 and t.ok.all()
    due = {f"s{i}-t0": off for i, off in enumerate(offsets)}
    expected = [0 if due[r] < 0.2 else 1 if due[r] < 0.4 else 2 for r in t.request_id]
    assert list(t.phase) == expected


def test_a_generator_whose_share_is_zero_in_every_phase_ends_at_once(tmp_path):
    """Concurrency 1 over two generators: the second one's lazy share holds no session (it would build millions
    looking for one); it must not ask for a session at all."""
    spec = build_spec({}, {"load": {"profile": "1:0.3s", "warmup_requests": 0}})
    second = build_plans(spec, expand_points(spec)[0], "http://127.0.0.1:9", "m", "sglang-native", [0, 1], None)[1]
    assert second.phase_slots == (0,) and second.lazy is not None and second.slots == 1

    class NoSession:
        def __iter__(self):
            return self

        def __next__(self):
            raise AssertionError("a slot with no room in any phase asked for a session")

    gated = {"slots": second.slots, "duration_s": second.duration_s, "phase_starts": second.phase_starts}
    summary = asyncio.run(_drive(tmp_path, {"sessions": NoSession(), **gated, "phase_slots": second.phase_slots}))
    assert summary.status == "complete" and summary.scheduled == 0, summary.error
