"""The contracts between packages (rig.contracts): record schema, manifest versions, the one validity judgement."""

import asyncio
import json
import time

import pyarrow as pa
import pytest
from click.testing import CliRunner
from synthetic import record, write_requests, write_run

from rig.analysis.cli import report
from rig.analysis.tables import campaign_table
from rig.contracts import (
    IDENTITY_FIELDS,
    MANIFEST_VERSION,
    RECORD_FIELDS,
    REQUEST_SCHEMA,
    ContractError,
    GeneratorReport,
    Manifest,
    PointEntry,
    PointIdentity,
    Thresholds,
    check_record,
    empty_record,
    judge_point,
    parse_manifest,
    unknown_columns,
)
from rig.loadgen import apis, drive
from rig.loadgen.client import Outcome, request_fields
from rig.workloads.base import Session, Turn


def test_the_parquet_schema_is_generated_from_the_record_dataclass():
    assert tuple(REQUEST_SCHEMA.names) == RECORD_FIELDS
    types = {f.name: f.type for f in REQUEST_SCHEMA}
    assert types["steps"] == pa.int32() and types["completion_tokens"] == pa.int64()
    assert types["chunk_tokens"] == pa.list_(pa.int32()) and types["chunk_offsets_s"] == pa.list_(pa.float64())
    assert types["ok"] == pa.bool_() and types["point"] == pa.string() and types["ttft_s"] == pa.float64()
    # the identity of a point is carried by every record
    assert set(IDENTITY_FIELDS) <= set(RECORD_FIELDS)


def test_every_key_the_client_and_apis_write_is_a_column():
    st = apis.StreamState(prompt_tokens=3, completion_tokens=5, finish_reason="stop", text_parts=["x"])
    # every speculative and server-time field the APIs can report, from the richest inputs they read
    st.speculative.update(
        apis._speculative_fields(
            {"spec_verify_ct": 2, "spec_accept_length": 2.5, "spec_accepted_drafts": 3, "spec_proposed_drafts": 4}
        )
    )
    st.speculative.update(
        apis._vllm_speculative_fields({"num_spec_steps": 2, "num_accepted_draft_tokens": 3, "num_draft_tokens": 4})
    )
    st.server_ts.update(
        apis._server_timestamps(
            {"request_received_ts": 1.0, "first_token_latency": 0.5, "request_finished_ts": 2.0, "queue_time": 0.1}
        )
    )
    assert len(st.speculative) == 4 and len(st.server_ts) == 4
    turn = Turn(request_id="r", messages=({"role": "user", "content": "hi"},), max_tokens=5)
    fields = request_fields(turn, Outcome(send_mono=1.0, end_mono=2.0, first_mono=1.5, state=st))
    assert unknown_columns(list(fields)) == []


def test_a_misspelled_record_key_fails_loudly(tmp_path, monkeypatch):
    row = empty_record()
    check_record(row)
    row["ttft"] = 0.1  # not a column: Parquet would drop it without a word
    with pytest.raises(ContractError, match="unknown \\['ttft'\\]"):
        check_record(row)

    real = drive.request_fields
    monkeypatch.setattr(drive, "request_fields", lambda turn, out: {**real(turn, out), "e2e": 1.0})
    from rig.contracts import PointColumns
    from rig.loadgen.plan import GeneratorPlan

    info = PointColumns(
        run_id="r",
        point="p",
        engine="sim",
        workload="w",
        api="sglang-native",
        steps=0,
        server_config="c",
        server_args="{}",
        load_mode="closed",
        concurrency=1,
        rate=None,
        repeat=0,
    )
    run = drive.PointRun(
        GeneratorPlan(point=info, generator=0, url="http://127.0.0.1:9", model="m", sessions=()), tmp_path, "h", 0.0
    )
    turn = Turn(request_id="r", messages=({"role": "user", "content": "hi"},), max_tokens=5)
    now = time.perf_counter()
    with pytest.raises(ContractError, match="e2e"):
        run._record(Session(session_id="s", turns=(turn,)), 0, turn, now, Outcome(send_mono=now, end_mono=now))


def test_the_generator_report_is_typed_end_to_end(tmp_path):
    """A PointRun's summary is a GeneratorReport whose achieved_rate is the report's definition (sends - 1) / span."""
    from rig.contracts import PointColumns
    from rig.loadgen.plan import GeneratorPlan

    info = PointColumns(
        run_id="r",
        point="p",
        engine="sim",
        workload="w",
        api="sglang-native",
        steps=0,
        server_config="c",
        server_args="{}",
        load_mode="closed",
        concurrency=1,
        rate=None,
        repeat=0,
    )
    run = drive.PointRun(
        GeneratorPlan(point=info, generator=3, url="http://127.0.0.1:9", model="m", sessions=()), tmp_path, "h", 0.0
    )
    turn = Turn(request_id="r", messages=({"role": "user", "content": "hi"},), max_tokens=5)
    for send in (10.0, 11.0, 14.0):
        run._record(
            Session(session_id="s", turns=(turn,)),
            0,
            turn,
            send,
            Outcome(send_mono=send, end_mono=send + 1, status="failed", error="x"),
        )
    run.started_mono, run.ended_mono = 9.0, 16.0
    rep = run.summary("complete", None, {"cpu_pct": 5.0})
    assert isinstance(rep, GeneratorReport) and rep.generator == 3
    assert rep.records.failed == 3 and rep.achieved_rate == pytest.approx(2 / 4.0)
    asyncio.run(asyncio.to_thread(run.writer.close))


def test_point_entries_carry_exactly_the_identity_fields():
    assert set(IDENTITY_FIELDS) <= set(PointEntry.model_fields)
    ident = PointIdentity(
        point="p",
        server_config="c",
        engine="sim",
        workload="w",
        steps=2,
        load_mode="closed",
        concurrency=4,
        rate=None,
        repeat=0,
    )
    assert PointEntry.new(ident).identity() == ident
    assert PointEntry(point="p").identity() is None


# ------------------------------------------------------------------------------------------------ manifest versions
def _v1_point(**gen) -> dict:
    """A point entry as rig wrote it before manifests carried a version (2026-11)."""
    return {
        "point": "p",
        "server_config": "c",
        "engine": "sim",
        "workload": "realistic",
        "steps": 0,
        "load_mode": "closed",
        "concurrency": 2,
        "rate": None,
        "repeat": 0,
        "status": "complete",
        "started_ts": 1.0,
        "ended_ts": 9.0,
        "requests_scheduled": 4,
        "records": {"ok": 4, "failed": 0, "cancelled": 0},
        "window_acceptance": None,
        "flush_cache": None,
        "flags": [],
        "generators": [
            {
                "generator": 0,
                "host": "vm",
                "status": "complete",
                "error": None,
                "rows_written": 4,
                "rows_unwritten": 0,
                "parts": ["part-00000.parquet"],
                "scheduled": 4,
                "records": {"ok": 4, "failed": 0, "cancelled": 0},
                "tokens": 96,
                "slip_p50_s": 4e-05,
                "slip_p99_s": 6e-05,
                "achieved_rate": 4.8,
                "rate_ratio": None,
                "window_s": 8.0,
                "loop_lag_p50_ms": 0.2,
                "loop_lag_p99_ms": 1.4,
                "loop_lag_max_ms": 1.8,
                "cpu_pct": 3.6,
                "gathered": {"from_uri": 0, "from_host": 0, "removed": 0},
                **gen,
            }
        ],
        "api": "sglang-native",
        "warmup_ok": 1,
        "start_wall": 1.5,
        "server_counters_delta": None,
        "requests_planned": 4,
    }


def _v1(points: list[dict], slip_threshold_s: float = 0.01) -> dict:
    return {
        "run_id": "old",
        "status": "complete",
        "created": 1.0,
        "spec": {"load": {"mode": "closed", "slip_threshold_s": slip_threshold_s, "loop_lag_threshold_s": 0.05}},
        "versions": {"rig": "0.1.0"},
        "cluster": {
            "ray_version": "2",
            "nodes": [],
            "local": True,
            "corpus": None,
            "generators": [{"generator": 0, "host": "vm", "node_id": "n", "clock_offset_s": 0.25}],
        },
        "server_configs": {
            "c": {
                "engine": "sim",
                "knobs": {"steps": 0},
                "status": "ready",
                "error": None,
                "command": ["python", "-m", "rig.sim"],
                "url": "http://127.0.0.1:1",
                "node_ip": "127.0.0.1",
                "gpu_ids": [],
                "ready_after_s": 1.0,
                "startup": {},
                "server_info": {"x": 1},
                "model_info": None,
                "info": {},
                "effective": {},
                "warnings": [],
                "stopped": True,
            }
        },
        "points": points,
        "stop_reason": None,
        "finished": 10.0,
    }


def test_a_version_1_manifest_loads_migrated():
    m = parse_manifest(json.dumps(_v1([_v1_point()], slip_threshold_s=0.02)))
    assert m.version == MANIFEST_VERSION
    assert m.thresholds == Thresholds(slip_p99_ms=20.0)  # what that run judged by, from its spec
    assert m.clock_offsets() == {0: 0.25}
    assert m.points[0].generators[0].cpu_pct == 3.6 and m.points[0].flags == []
    again = parse_manifest(m.to_json())  # the current version round-trips unchanged
    assert again == m
    # only what is read from disk is migrated: a manifest built in code keeps what it is given
    assert Manifest(thresholds=Thresholds(cpu_pct=80)).thresholds.cpu_pct == 80


def test_migration_judges_old_points_with_the_one_rule_set():
    """Old runners judged lag and slip; old analysis added a CPU rule: the migrated verdict holds both."""
    hot = _v1_point(cpu_pct=97.0)
    hot["point"] = "hot"
    died = _v1_point()
    died.update(
        point="died", flags=["server_died"], status="failed", error="server exited with code 9 during the point"
    )
    m = parse_manifest(json.dumps(_v1([hot, died])))
    assert m.entry("hot").flag_reasons == {"client_saturated": "generator 0 used 97% CPU (limit 90%) over 8s"}
    assert m.entry("died").flag_reasons == {"server_died": "server exited with code 9 during the point"}


@pytest.mark.parametrize(
    "text, message",
    [
        ("[1]", "not a JSON object"),
        ('{"version": 99}', "newer than this rig understands"),
        ('{"points": [{"point": "p", "status": "exploded"}]}', "points.0.status"),
        ('{"points": [{"point": "p", "generators": [{"status": "complete"}]}]}', "generators.0.generator"),
    ],
)
def test_a_bad_manifest_is_one_clear_line(text, message):
    with pytest.raises(ContractError, match=message) as e:
        parse_manifest(text)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------------ validity
def _gen(**kw) -> GeneratorReport:
    return GeneratorReport(generator=kw.pop("generator", 0), status="complete", window_s=10.0, **kw)


def test_judge_point_rules():
    t = Thresholds()
    assert judge_point("closed", [_gen(cpu_pct=50, loop_lag_p99_ms=10, slip_p99_s=1.0)], t) == {}  # closed: no slip
    assert judge_point("closed", [_gen(cpu_pct=90.0)], t) == {
        "client_saturated": "generator 0 used 90% CPU (limit 90%) over 10s"
    }
    assert set(judge_point("closed", [_gen(loop_lag_p99_ms=50.5)], t)) == {"client_saturated"}
    assert judge_point("closed", [_gen(loop_lag_p99_ms=50.0)], t) == {}  # the runner's rule: above, not at
    assert judge_point("closed", [GeneratorReport(generator=0, window_s=0.5, cpu_pct=99, loop_lag_p99_ms=99)], t) == {}
    slipped = judge_point("poisson", [_gen(slip_p99_s=0.0125)], t)
    assert slipped["schedule_slip"] == "generator 0 send slip p99 12.5 ms (limit 10 ms)"
    assert "client_saturated" in slipped
    assert set(judge_point("poisson", [_gen(rate_ratio=0.95)], t)) == {"rate_shortfall", "client_saturated"}
    lost = judge_point("closed", [_gen(), GeneratorReport(generator=1, status="failed", error="generator died: X")], t)
    assert lost == {"generator_lost": "generator 1: generator died: X"}
    assert judge_point("closed", [], t, server_died="server exited")["server_died"] == "server exited"


def test_threshold_overrides():
    t = Thresholds().with_overrides("slip_p99_ms=25, cpu_pct=80")
    assert (t.slip_p99_ms, t.cpu_pct, t.loop_lag_p99_ms) == (25.0, 80.0, 50.0)
    for bad, message in (
        ("slip=3", "NAME=VALUE"),
        ("cpu_pct", "NAME=VALUE"),
        ("cpu_pct=lots", "must be a number"),
        ("cpu_pct=-1", "cpu_pct"),
    ):
        with pytest.raises(ContractError, match=message):
            Thresholds().with_overrides(bad)


def test_report_reads_the_verdict_and_rejudges_only_on_request(tmp_path):
    gens = [{"generator": 0, "status": "complete", "window_s": 10.0, "cpu_pct": 40.0, "loop_lag_p99_ms": 30.0}]
    d = write_run(
        tmp_path / "run",
        Manifest(
            run_id="r",
            status="complete",
            thresholds=Thresholds(),
            points=[
                PointEntry(
                    point="p",
                    server_config="c",
                    engine="sim",
                    workload="w",
                    steps=0,
                    load_mode="closed",
                    concurrency=1,
                    rate=None,
                    repeat=0,
                    status="complete",
                    requests_scheduled=1,
                    generators=gens,
                )
            ],
        ),
    )
    write_requests(
        d,
        "p",
        0,
        [
            record(
                point="p",
                generator=0,
                request_id="a",
                send_ts=1.0,
                end_ts=2.0,
                e2e_s=1.0,
                ttft_s=0.1,
                completion_tokens=5,
                status="ok",
                ok=True,
            )
        ],
    )
    assert campaign_table(d)[0]["flags"] == []
    r = CliRunner().invoke(report, [str(d), "--json", "--thresholds", "loop_lag_p99_ms=20"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)[0]
    assert row["flag_reasons"] == {"client_saturated": "generator 0 event-loop lag p99 30 ms (limit 20 ms)"}
    assert "validity judged again with loop_lag_p99_ms=20" in r.stderr
    r = CliRunner().invoke(report, [str(d), "--thresholds", "lag=3"])
    assert r.exit_code == 2 and "NAME=VALUE" in r.output and "Traceback" not in r.output


# ------------------------------------------------------------------------------------------------ the runner's store
def test_the_manifest_store_keeps_typed_entries_and_resumes_an_old_manifest(tmp_path):
    from rig.config import RunSpec
    from rig.run.manifest_store import ManifestStore
    from rig.run.points import expand_points

    spec = RunSpec.model_validate(
        {"run_id": "s", "out": str(tmp_path), "load": {"concurrency": [2], "requests": 4, "slip_threshold_s": 0.02}}
    )
    points = expand_points(spec)
    store = ManifestStore(tmp_path, spec.load.mode)
    store.create(spec, points)
    assert store.data.thresholds == Thresholds(slip_p99_ms=20.0)
    pid = points[0].point
    store.update_point(pid, status="running", records={"ok": 1, "failed": 0, "cancelled": 0})
    assert store.entry(pid).records.ok == 1
    with pytest.raises(ValueError):
        store.update_point(pid, stauts="complete")  # a misspelled field is refused, not stored
    with pytest.raises(ValueError):
        store.update_point(pid, status="done")  # and so is a status the contract does not know
    store.save()
    assert parse_manifest((tmp_path / "manifest.json").read_text()) == store.data

    old = _v1([dict(_v1_point(), point=pid, status="complete")])
    old["spec"] = json.loads(spec.model_dump_json())
    (tmp_path / "manifest.json").write_text(json.dumps(old))
    again = ManifestStore(tmp_path, spec.load.mode)
    again.resume(points)  # its records are not on disk: the point is run again
    assert again.data.version == MANIFEST_VERSION and again.data.status == "running"
    assert again.entry(pid).status == "pending" and "0 of 4 records" in (again.entry(pid).rerun or "")


def test_a_generators_entry_starts_as_what_it_said_of_itself():
    """GeneratorEntry (the driver's typed record of a generator) holds every GeneratorInfo field, in its order, so
    the manifest's cluster.generators keeps all of them when GeneratorInfo grows a field."""
    from rig.contracts import GeneratorEntry, GeneratorInfo, generator_entry

    info = GeneratorInfo(generator=2, host="h", node_ip="10.0.0.2", node_id="n", pid=7, spool_root="/s")
    assert generator_entry(info) == info.model_dump()
    assert list(generator_entry(info)) == list(GeneratorInfo.model_fields)
    assert set(GeneratorInfo.model_fields) <= set(GeneratorEntry.__annotations__)
