"""Hardening round 3 (issue 23): what a demanding user still got hurt by, each case with its one-line outcome."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest
from support import TESTS

from rig.results import read_manifest

HERE = TESTS


# ------------------------------------------------------------------------------ 2. a few seconds of full disk
class _DiskFullFor:
    """``atomic_write`` that fails with ``err`` until ``seconds`` have passed, then writes (a disk freed again)."""

    def __init__(self, monkeypatch, seconds: float, err: int = errno.ENOSPC):
        import rig.results as results

        self.real = results.atomic_write
        self.until = time.monotonic() + seconds
        self.err = err
        self.failures = 0
        monkeypatch.setattr(results, "atomic_write", self)
        monkeypatch.setattr(results, "RETRY_MAX_S", 0.2)  # the test's backoff: short steps

    def __call__(self, path, content):
        if time.monotonic() < self.until:
            self.failures += 1
            raise OSError(self.err, os.strerror(self.err), str(path))
        return self.real(path, content)


def _metric_rows(n: int) -> list[dict]:
    return [{"run_id": "r", "point": "p", "ts": float(i), "name": "m", "labels": "{}", "value": 1.0} for i in range(n)]


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO])
def test_a_part_writer_keeps_every_row_through_a_transient_disk_error(tmp_path, monkeypatch, err):
    from rig.results import SERVER_METRICS_SCHEMA, PartWriter, read_server_metrics

    disk = _DiskFullFor(monkeypatch, 1.0, err)
    w = PartWriter(tmp_path / "server_metrics" / "point=p", SERVER_METRICS_SCHEMA, max_age_s=0.0)
    for row in _metric_rows(5):
        w.add(row)
    w.maybe_flush()  # the disk is full: no exception, the rows wait
    assert w.pending == 5 and w.rows_written == 0 and w.write_failures == 1
    assert w.last_error is not None and os.strerror(err) in w.last_error
    for row in _metric_rows(3):
        w.add(row)
    w.close()  # retried until the disk is back
    assert disk.failures >= 2
    assert w.pending == 0 and w.rows_written == 8
    assert len(read_server_metrics(tmp_path)) == 8


def test_a_part_writer_that_cannot_write_for_good_counts_what_it_kept(tmp_path, monkeypatch):
    from rig.results import SERVER_METRICS_SCHEMA, PartWriter

    _DiskFullFor(monkeypatch, 3600.0)
    w = PartWriter(tmp_path / "m", SERVER_METRICS_SCHEMA, retry_s=0.5)
    for row in _metric_rows(4):
        w.add(row)
    t0 = time.monotonic()
    with pytest.raises(OSError):
        w.close()
    assert 0.25 <= time.monotonic() - t0 < 3.0  # retried for its budget, not for ever
    assert w.pending == 4 and w.rows_written == 0 and w.write_failures >= 2


def test_the_server_metrics_writer_survives_a_full_disk_mid_point(tmp_path, monkeypatch):
    import asyncio

    from rig.results import read_server_metrics
    from rig.server.actor import ServerActor
    from rig.server.spec import ServerConfig

    actor = ServerActor(ServerConfig(engine="external", url="http://127.0.0.1:9"), str(tmp_path), "logs/s.log")

    async def samples():
        return [("sglang:num_running_reqs", "{}", 1.0)]

    actor._scrape = samples  # the server answers /metrics (what the writer does with it is under test)

    async def point():
        await actor.start_scrape("r", "p", 0.05)
        actor._scrape_writer.max_age_s = 0.1
        _DiskFullFor(monkeypatch, 0.6)  # full for a while during the point
        await asyncio.sleep(1.2)
        return await actor.stop_scrape(), await actor.scrape_lost()

    parts, lost = asyncio.run(point())
    assert lost is None and parts
    rows = read_server_metrics(tmp_path)
    assert len(rows) >= 15  # every sample of the point, those taken while the disk was full included
    assert len(set(rows.column("ts").to_pylist())) == len(rows)  # each sample once: none written twice


# ------------------------------------------------------------------------------ the CLI before anything starts
def cli(*args: str, env: dict[str, str] | None = None):
    """`rig ARGS` in this process (click's runner): for checks that happen before Ray starts."""
    from click.testing import CliRunner

    from rig.cli import cli as rig_cli

    return CliRunner().invoke(rig_cli, list(args), env=env)


def refused(result, *needles: str, code: int = 2) -> str:
    """Exit ``code``, no traceback, and one error line holding every needle."""
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [ln for ln in result.output.splitlines() if "Error" in ln or "error" in ln]
    assert len(lines) == 1, result.output
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# ------------------------------------------------------------------------------ 3. duplicate levels/configurations
@pytest.mark.parametrize(
    "args, needle",
    [
        (["--concurrency", "1,1,2"], "concurrency level 1 is listed twice"),
        (["--steps", "1,1"], "steps value 1 is listed twice"),
        (["--workload", "realistic,realistic"], "workload 'realistic' is listed twice"),
        (["--grid", "eagle_topk=1,1"], "eagle_topk value 1 is listed twice"),
        (["--mode", "poisson", "--rate", "2,2"], "rate 2.0 is listed twice"),
    ],
)
def test_a_level_or_configuration_listed_twice_is_refused_before_anything_starts(tmp_path, args, needle):
    line = refused(cli("sweep", *args, "--out", str(tmp_path), "--dry-run"), needle, "--repeat")
    assert "Traceback" not in line
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


def test_grid_values_that_are_one_server_are_refused(tmp_path):
    from rig.config import SpecError, build_spec

    with pytest.raises(SpecError, match="listed twice"):
        build_spec({"server_grid": {"eagle_topk": [1, 1.0]}}, {})


# ------------------------------------------------------------------------------ 4. a live port that is not Ray
class _NotRay:
    """A TCP server on loopback that accepts and then stays silent (or answers ``reply``), like Redis on 6379."""

    def __init__(self, reply: bytes = b""):
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.reply = reply
        self.conns: list = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.reply:
                conn.sendall(self.reply)

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.sock.close()


def test_a_cluster_address_that_is_not_ray_fails_with_rigs_line_within_the_bound(tmp_path):
    from support import rig

    srv = _NotRay(b"-ERR unknown command 'PRI'\r\n")
    try:
        f = tmp_path / "c.yaml"
        f.write_text(f"cluster:\n  address: 127.0.0.1:{srv.port}\n")
        # Bounded by rig's own probe (5 s; ray.init would retry for minutes): a hang fails as the helper's timeout.
        # (A wall-clock bound of 20 s on the whole process failed at load 18: 21.5 s, most of it interpreter start.)
        proc = rig("check", "--cluster", str(f), timeout=60)
    finally:
        srv.close()
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("rig: error: "), proc.stderr[-3000:]
    assert f"127.0.0.1:{srv.port}" in lines[0] and "not Ray" in lines[0] and "-ERR" in lines[0], lines[0]


def test_a_cluster_address_that_never_answers_fails_after_the_probes_bound_not_raylets_minutes():
    """The same probe and line, on a port that accepts and stays silent (in-process, with a short bound: the CLI
    path is the one above)."""
    import rig.placement.connection as cluster
    from rig.placement.errors import ClusterError

    srv = _NotRay()
    try:
        t0 = time.monotonic()
        with pytest.raises(ClusterError) as e:
            cluster._check_reachable(f"127.0.0.1:{srv.port}", timeout_s=0.3)
        waited = time.monotonic() - t0
    finally:
        srv.close()
    assert "not Ray" in str(e.value) and "no answer within 0.3s" in str(e.value), e.value
    assert waited >= 0.3  # it did wait for the answer it needs (the upper bound is the helper's, not a timer's)


def test_address_auto_joins_exactly_the_address_it_checked(tmp_path, monkeypatch):
    import rig.placement.connection as cluster
    from rig.config import ClusterSpec

    srv = _NotRay()
    joined: list[str] = []
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{srv.port}")
    monkeypatch.setattr(cluster, "_H2_SETTINGS", 0)  # pretend the probe passes (a zeroed frame header) ...
    monkeypatch.setattr(cluster, "_read_some", lambda conn, n, t: bytes(9))
    monkeypatch.setattr(cluster.ray, "init", lambda address, **kw: joined.append(address))  # ... and record the join
    monkeypatch.setattr(cluster, "describe_nodes", lambda: {})
    monkeypatch.setattr(cluster.ray, "is_initialized", lambda: False)
    try:
        cluster.connect(ClusterSpec(address="auto"), 1)
    finally:
        srv.close()
    assert joined == [f"127.0.0.1:{srv.port}"]  # not 'auto', which Ray resolves on its own (another job's GCS)


# ------------------------------------------------------------------------------ 5. SLO verdicts and cancelled requests
def _requests(ok_e2e: list[float], cancelled_e2e: list[float], cancelled_ttft: list[float] | None = None):
    import numpy as np

    from rig.analysis import metrics as m

    n_ok, n_c = len(ok_e2e), len(cancelled_e2e)
    n = n_ok + n_c
    nan = [float("nan")] * n_c
    e2e = np.array(ok_e2e + cancelled_e2e)
    ttft = np.array([0.1] * n_ok + (cancelled_ttft or nan))
    return m.Requests(
        ok=np.array([True] * n_ok + [False] * n_c),
        cancelled=np.array([False] * n_ok + [True] * n_c),
        tokens=np.array([10.0] * n_ok + [float("nan")] * n_c),
        ttft=ttft,
        e2e=e2e,
        send=np.zeros(n),
        end=e2e.copy(),
        slip=np.zeros(n),
        e2e_from_intended=e2e.copy(),
        verify_ct=np.full(n, np.nan),
    )


def test_an_slo_verdict_says_how_cancelled_requests_were_counted_and_can_count_them_at_their_lower_bound():
    from rig.analysis.metrics import parse_slo
    from rig.analysis.slo import describe, evaluate_slos

    # 97 requests done in 1 s; 63 cancelled at the level's end after running 4.9-5.2 s; 3 never sent (ran 0 s)
    r = _requests([1.0] * 97, [4.9, 5.0, 5.2] * 21 + [0.0] * 3)
    slo = [parse_slo("e2e=4.8s")]
    left_out = evaluate_slos(r, slo, 90)
    assert left_out["meets"] and left_out["note"] == "66 cancelled request(s) left out"
    low = evaluate_slos(r, slo, 90, cancelled="lower-bound")
    assert not low["meets"] and low["note"] == "66 cancelled request(s) counted at their lower bound"
    assert low["per_slo"][0]["value_s"] == pytest.approx(5.0, abs=0.21)  # the never-sent three are not counted
    assert describe(slo, 90, "lower-bound") == "p90 e2e<=4800ms; cancelled requests at their lower bound"
    # TTFT: a cancelled request's own first-token time when one came, else the time it ran
    r2 = _requests([1.0] * 8, [6.0, 6.0], cancelled_ttft=[0.2, float("nan")])
    v = evaluate_slos(r2, [parse_slo("ttft=1s")], 95, cancelled="lower-bound")["per_slo"][0]["value_s"]
    assert v == pytest.approx(0.2 + 0.55 * (6.0 - 0.2))  # values 0.1 x8, 0.2 (its first token), 6.0 (ran 6 s)
    assert evaluate_slos(r2, [parse_slo("ttft=1s")], 95)["per_slo"][0]["value_s"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="excluded or lower-bound"):
        evaluate_slos(r, slo, 90, cancelled="ignore")


def test_a_point_with_cancelled_requests_is_flagged(tmp_path):
    from rig.analysis.points import flag_reasons
    from rig.analysis.runs import PointInfo

    p = PointInfo.model_construct(
        point="p",
        status="complete",
        flags=[],
        flag_reasons={},
        in_manifest=True,
        unreadable_parts=[],
        missing_parts=[],
        requests_scheduled=10,
        generators=[],
    )
    why = flag_reasons(p, _requests([1.0] * 7, [5.0] * 3))
    assert why.get("has_cancelled") == "3 of 10 requests cancelled"
    assert "has_cancelled" not in flag_reasons(p, _requests([1.0] * 10, []))


# ------------------------------------------------------------------------------ 6. what cannot be a finding
def test_compare_with_a_level_at_0_tok_s_gives_no_margin_instead_of_a_traceback(tmp_path):
    import json as _json

    from click.testing import CliRunner
    from synthetic import point_entry, record, write_requests, write_run

    from rig.analysis.cli import compare as compare_cmd

    def point(name: str, steps: int) -> dict:
        return point_entry(name, steps)

    d = tmp_path / "run"
    write_run(d, {"run_id": "run", "status": "complete", "points": [point("base", 0), point("cand", 2)]})
    for name, steps, ok in (("base", 0, True), ("cand", 2, False)):
        rows = [
            record(
                point=name,
                steps=steps,
                workload="greedy",
                load_mode="closed",
                concurrency=4,
                repeat=0,
                generator=0,
                clock_offset_s=0.0,
                request_id=f"r{i}",
                send_ts=100.0 + i,
                end_ts=101.0 + i,
                e2e_s=1.0,
                ttft_s=0.1 if ok else None,
                first_token_ts=100.1 + i if ok else None,
                completion_tokens=50 if ok else 0,
                status="ok" if ok else "failed",
                ok=ok,
                error=None if ok else "HTTP 500",
            )
            for i in range(8)
        ]
        write_requests(d, name, 0, rows)
    r = CliRunner().invoke(compare_cmd, [str(d), "--baseline-steps", "0", "--json"])
    assert r.exit_code == 0 and r.exception is None, (r.output, r.exception)
    [best] = _json.loads(r.stdout[r.stdout.index("{") :])["best"]
    assert best["best"] == "steps=0" and best["runner_up_aggregate_tok_s"] == 0.0
    assert best["margin"] is None and best["ci_low"] is None
    assert "steps=2 has 0 tok/s: no margin" in best["incomplete"]
    r = CliRunner().invoke(compare_cmd, [str(d), "--baseline-steps", "0"])  # the table too
    assert r.exit_code == 0 and r.exception is None, (r.output, r.exception)


@pytest.mark.parametrize(
    "command",
    [["report", "RUN"], ["sweep", "--search", "concurrency", "--dry-run"], ["tune", "--steps", "0,1", "--dry-run"]],
)
def test_an_slo_limit_of_zero_is_refused_with_one_line(tmp_path, command):
    args = [str(tmp_path) if a == "RUN" else a for a in command]
    refused(cli(*args, "--slo", "ttft=0"), "ttft=0", "above 0")


def test_several_configurations_of_one_external_server_are_refused(tmp_path):
    for command in (["tune", "--slo", "ttft=1s"], ["sweep"]):
        refused(
            cli(*command, "--engine", "external", "--url", "http://127.0.0.1:9", "--steps", "0,4", "--dry-run"),
            "external",
            "same server",
            "one --steps value",
        )
    # one configuration of it is fine: what the server runs
    ok = cli("sweep", "--engine", "external", "--url", "http://127.0.0.1:9", "--steps", "0", "--dry-run")
    assert ok.exit_code == 0, ok.output


# ------------------------------------------------------------------------------ 7. outputs never overwrite a run
def _golden_copy(tmp_path: Path) -> Path:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(HERE / "data" / "golden" / "run", run)
    return run


def test_report_and_fit_outputs_never_overwrite_a_runs_own_files(tmp_path):
    run = _golden_copy(tmp_path)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    part = next((run / "requests").rglob("part-*.parquet"))
    for args in (
        ["report", str(run), "--html", str(run / "manifest.json")],
        ["report", str(run), "--html", str(part)],
        ["report", str(run), "--csv", str(run / "requests")],
        ["report", str(run), "--plots", str(run / "logs" / "plots")],
        ["sim", "fit", str(run), "-o", str(run / "manifest.json")],
    ):
        refused(cli(*args), "never writes over a run's own files", str(run))
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    # next to the run's files is fine
    ok = cli("report", str(run), "--html", str(run / "report.html"))
    assert ok.exit_code == 0, ok.output
    assert (run / "report.html").read_text().startswith("<!")


def test_an_output_path_that_cannot_be_written_is_one_line_without_errno_noise(tmp_path):
    run = _golden_copy(tmp_path)
    (tmp_path / "adir").mkdir()
    line = refused(cli("report", str(run), "--html", str(tmp_path / "adir")), "cannot write", "Is a directory", code=1)
    assert "[Errno" not in line


# ------------------------------------------------------------------------------ 8. huge concurrency, few requests
def test_an_absurd_concurrency_is_refused_and_few_requests_below_it_are_noted(tmp_path):
    refused(
        cli("run", "--concurrency", "100000000", "--requests", "10", "--dry-run"),
        "load.concurrency",
        "at most 1,000,000",
    )
    r = cli("run", "--concurrency", "1,64", "--requests", "8", "--dry-run")
    assert r.exit_code == 0, r.output
    notes = [ln for ln in r.output.splitlines() if ln.startswith("rig: note:")]
    assert notes == [
        "rig: note: --requests 8 is below concurrency 64: at most 8 requests are ever in flight there, "
        "so such a level measures concurrency 8 (give --requests >= the concurrency, or --duration)"
    ]


def test_a_closed_level_splits_without_walking_its_concurrency_and_idle_slots_are_not_made():
    from rig.run.plans import split_closed

    sessions = list(range(10))
    t0 = time.monotonic()
    split = split_closed(sessions, 100_000_000, 3)  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 1.0  # walking 10^8 slots would take Python seconds; not walking them, microseconds
    assert [len(m) for m, _ in split] == [4, 3, 3] and [s for _, s in split] == [4, 3, 3]
    assert [s for _, s in split_closed([], 1_000_000, 3)] == [333_334, 333_333, 333_333]  # duration-bound: all slots
    assert split_closed(list(range(8)), 4, 2) == [([0, 2, 4, 6], 2), ([1, 3, 5, 7], 2)]


# ------------------------------------------------------------------------------ 9. bad input files, one line
@pytest.mark.parametrize("kind", ["directory", "binary", "duplicate keys"])
def test_a_config_or_cluster_file_that_is_not_yaml_text_is_one_line(tmp_path, kind):
    path = tmp_path / "f.yaml"
    if kind == "directory":
        path.mkdir()
        needle = "is a directory"
    elif kind == "binary":
        path.write_bytes(bytes(range(128, 256)) * 2)
        needle = "not a text file"
    else:
        path.write_text("load:\n  seed: 1\nload:\n  seed: 2\n")
        needle = "key 'load' is given twice"
    refused(cli("run", "--config", str(path), "--dry-run"), str(path), needle)
    refused(cli("sweep", "--cluster", str(path), "--dry-run"), str(path), needle)
    refused(cli("check", "--cluster", str(path)), str(path), needle)


def test_an_empty_workload_list_is_refused_before_anything_starts(tmp_path):
    f = tmp_path / "spec.yaml"
    f.write_text("workloads: []\n")
    refused(
        cli("run", "--config", str(f), "--out", str(tmp_path / "out"), "--dry-run"),
        "workloads",
        "at least one workload",
    )


# ------------------------------------------------------------------------------ also seen: values checked up front
@pytest.mark.parametrize(
    "args, needle",
    [
        (["--seed", "-1"], "load.seed"),
        (["--mode", "poisson", "--rate", "inf"], "finite"),
        (["--mode", "poisson", "--rate", "nan"], "finite"),
        (["--mode", "gamma", "--rate", "1", "--burstiness", "inf"], "load.burstiness"),
        (["--duration", "nan"], "load.duration_s"),
        (["--requests", "1000000000"], "load.requests"),
        (["--first-token-timeout", "0.002"], "first_token_s"),
    ],
)
def test_values_are_checked_before_anything_starts(tmp_path, args, needle):
    refused(cli("run", *args, "--out", str(tmp_path), "--dry-run"), needle)


def test_a_dataset_max_tokens_beyond_any_model_is_refused(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "hi", "max_tokens": 1000000000000}\n')
    refused(cli("run", "--dataset", str(f), "--dry-run"), f"{f}:1", "max_tokens", "1,000,000")


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"key-one\nkey-two\n", "more than one word or line"),
        (bytes(range(128, 200)), "not a text file"),
        (b"  \n", "is empty"),
    ],
)
def test_api_key_file_problems_name_the_file_in_one_line(tmp_path, content, needle):
    f = tmp_path / "key"
    f.write_bytes(content)
    line = refused(cli("run", "--api-key-file", str(f), "--dry-run"), str(f), needle)
    assert "key-one" not in line and "key-two" not in line  # the key itself is never shown


def test_credentials_in_a_url_never_reach_the_manifest(tmp_path):
    import json as _json

    from rig.config import build_spec
    from rig.contracts import Manifest, ServerConfigEntry
    from rig.results import write_manifest

    spec = build_spec(
        {},
        {
            "server": {"engine": "external", "url": "http://alice:s3cr3t@127.0.0.1:9/"},
            "out": str(tmp_path),
            "run_id": "c",
        },
    )
    m = Manifest(
        run_id="c",
        spec=_json.loads(spec.model_dump_json()),
        server_configs={"x": ServerConfigEntry(url="http://alice:s3cr3t@127.0.0.1:9")},
    )
    write_manifest(tmp_path, m)
    text = (tmp_path / "manifest.json").read_text()
    assert "s3cr3t" not in text and "alice" not in text
    assert "http://***@127.0.0.1:9" in text
    r = cli("sweep", "--resume", str(tmp_path))  # a resume cannot send the masked URL: one line says so
    refused(r, "credentials", "start a new run")


def test_dry_run_shows_the_address_the_embedded_engine_really_binds():
    r = cli("run", "--steps", "2", "--dry-run")
    assert r.exit_code == 0, r.output
    [line] = [ln for ln in r.output.splitlines() if "-m rig.sim" in ln]
    assert "--host 127.0.0.1 --port 30000" in line
    assert line.endswith("# rig picks a free port at run time (30000 shown)")
    r = cli("run", "--steps", "2", "--port", "31000", "--dry-run")
    [line] = [ln for ln in r.output.splitlines() if "-m rig.sim" in ln]
    assert "--host 127.0.0.1 --port 31000 --enable-metrics" in line and "# rig picks" not in line


def test_https_against_a_plain_http_server_says_so(tmp_path):
    import asyncio

    from aiohttp import web

    from rig.server.actor import ServerActor
    from rig.server.spec import ServerConfig

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def go():
        app = web.Application()
        app.router.add_get("/health", health)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        actor = ServerActor(
            ServerConfig(engine="external", url=f"https://127.0.0.1:{port}", unreachable_timeout_s=0.5),
            str(tmp_path),
            "s.log",
        )
        try:
            await actor.wait_ready(timeout_s=5)
        except Exception as e:
            return str(e)
        finally:
            if actor._http is not None:
                await actor._http.close()
            await runner.cleanup()
        return "ready"

    msg = asyncio.run(go())
    assert "TLS handshake failed" in msg and "use http://" in msg, msg
    assert "operation not permitted" not in msg.lower()


def test_a_planner_that_fails_leaves_the_run_failed_not_complete(tmp_path):
    from rig.config import build_spec
    from rig.run.runner import Runner

    def planner(runner):
        raise ZeroDivisionError("float division by zero")
        yield  # a generator, as planners are

    spec = build_spec({}, {"out": str(tmp_path), "run_id": "p"})
    runner = Runner(spec, planner=planner)
    runner._setup_cluster = lambda: None  # no Ray: the failure under test comes before any point
    with pytest.raises(ZeroDivisionError):
        runner.run()
    m = read_manifest(tmp_path / "p")
    assert m["status"] == "failed"
    assert m["error"] == "internal error: ZeroDivisionError: float division by zero"


def test_a_stop_while_one_engine_shuts_down_launches_no_other(tmp_path):
    from rig.config import build_spec
    from rig.contracts import ServerConfigEntry
    from rig.run.runner import Runner

    spec = build_spec({}, {"out": str(tmp_path), "run_id": "s", "steps": [0, 1], "load": {"concurrency": [1]}})
    runner = Runner(spec)
    runner._setup_cluster = lambda: None
    launched: list[str] = []

    def launch(cfg):
        launched.append(cfg.config_id())
        runner.store.set_server_config(cfg.config_id(), ServerConfigEntry(engine=cfg.engine, status="ready"))
        runner.server.handle = object()
        return runner.store.server_config(cfg.config_id())

    def run_point(p, entry):
        runner.store.update_point(p.point, status="complete")

    def fetch_log(cid):  # the first engine is being stopped when the user presses Ctrl-C
        runner.request_stop("stopped by SIGINT")

    runner.server.launch = launch
    runner.server.stop_server = lambda: setattr(runner.server, "handle", None)
    runner.server.fetch_log = fetch_log
    runner.executor.run_point = run_point
    m = runner.run()
    assert launched == [spec.server_configs()[0].config_id()]
    assert m.status == "interrupted"
    assert [p.status for p in m.points] == ["complete", "pending"]


def test_a_concurrency_search_with_fewer_requests_than_its_maximum_says_so():
    r = cli(
        "sweep", "--search", "concurrency", "--slo", "ttft=1s", "--requests", "4", "--search-max", "16", "--dry-run"
    )
    assert r.exit_code == 0, r.output
    assert (
        "rig: note: --requests 4 is below the search's maximum 16: a probe above 4 has at most 4 requests in "
        "flight" in r.output
    )


def test_a_stop_ends_the_wait_for_generator_placement(monkeypatch):
    import rig.placement.plan as cluster

    class Handle:
        class info:
            @staticmethod
            def remote():
                return object()

    def never_placed(refs, num_returns, timeout):
        time.sleep(timeout)
        return [], list(refs)

    monkeypatch.setattr(cluster.ray, "wait", never_placed)
    stopped_at = time.monotonic() + 0.3
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        cluster.wait_started([Handle()], 60.0, stop=lambda: time.monotonic() >= stopped_at)
    assert time.monotonic() - t0 < 1.5  # not the placement timeout (60 s)
    with pytest.raises(cluster.PlacementError, match="could not be placed within 0.2s"):
        cluster.wait_started([Handle()], 0.2)


def test_a_complete_runs_ray_session_files_are_removed_and_only_its_own(tmp_path):
    from rig.run.fleet import Fleet

    ours, theirs = tmp_path / "session_2026_ours", tmp_path / "session_2026_theirs"
    for d in (ours, theirs):
        (d / "logs").mkdir(parents=True)
        (d / "logs" / "raylet.out").write_text("x" * 1000)
    (tmp_path / "session_latest").symlink_to(ours)
    fleet = Fleet()
    fleet.session_dir = ours
    fleet.remove_session()
    assert not ours.exists() and theirs.exists()
    assert not (tmp_path / "session_latest").is_symlink()
    fleet.session_dir = tmp_path / "not-a-session"  # never anything but a Ray session directory
    (tmp_path / "not-a-session").mkdir()
    fleet.remove_session()
    assert (tmp_path / "not-a-session").exists()


def test_a_server_metrics_write_error_never_erases_a_points_accounting(tmp_path, monkeypatch):
    """The closing steps of a point (counters, server metrics, gathering) failing: the point keeps its generators'
    counts and status and carries a flag (it ended 'failed', requests_scheduled 0, generators [])."""
    import types

    import ray as real_ray

    import rig.run.execute as execute
    import rig.run.fleet as fleet_mod
    from rig.config import build_spec
    from rig.contracts import GeneratorProgress, GeneratorReport, RecordCounts, ServerConfigEntry
    from rig.run.context import RunContext
    from rig.run.execute import PointExecutor
    from rig.run.fleet import Fleet
    from rig.run.manifest_store import ManifestStore
    from rig.run.points import expand_points
    from rig.run.progress import Progress
    from rig.run.signals import StopControl

    never = object()  # the server's wait_exit: the engine never exits

    class Call:
        def __init__(self, fn):
            self.fn = fn

        def remote(self, *a):
            return self.fn(*a)

    def fake_get(x, timeout=None):
        if isinstance(x, list):
            return [fake_get(i) for i in x]
        if isinstance(x, BaseException):
            raise x
        return x

    fake = types.SimpleNamespace(
        get=fake_get,
        exceptions=real_ray.exceptions,
        cancel=lambda *a, **k: None,
        kill=lambda *a: None,
        wait=lambda refs, num_returns=1, timeout=None: (
            [r for r in refs if r is not never],
            [r for r in refs if r is never],
        ),
    )
    monkeypatch.setattr(execute, "ray", fake)
    monkeypatch.setattr(fleet_mod, "ray", fake)

    report = GeneratorReport(
        generator=0, status="complete", scheduled=5, rows_written=5, records=RecordCounts(ok=5), window_s=0.1
    )
    gen = types.SimpleNamespace(
        prepare=Call(lambda pl: 1),
        run_point=Call(lambda t: report),
        stop=Call(lambda: None),
        progress=Call(lambda: GeneratorProgress({"ok": 5})),
    )
    disk_full = OSError(28, "No space left on device")
    server = types.SimpleNamespace(
        metrics_snapshot=Call(lambda: {}),
        start_scrape=Call(lambda *a: None),
        wait_exit=Call(lambda: never),
        alive=Call(lambda: True),
        stop_scrape=Call(lambda: disk_full),
        scrape_lost=Call(lambda: None),
    )
    spec = build_spec(
        {}, {"out": str(tmp_path), "run_id": "e", "flush_cache": False, "load": {"concurrency": [1]}, "steps": [0]}
    )
    [point] = expand_points(spec)
    store = ManifestStore(tmp_path, "closed")
    store.create(spec, [point])
    fleet = Fleet()
    fleet.active = [(0, gen)]
    fleet.gen_info = [{"generator": 0, "node_id": None}]
    ctx = RunContext(spec, tmp_path, store, Progress(), StopControl(lambda m: None), fleet, None)
    ex = PointExecutor(ctx, types.SimpleNamespace(handle=server))
    ex.gather_one = lambda pid, gid: {}
    ex.run_point(point, ServerConfigEntry(url="http://127.0.0.1:9", dialect="sglang"))
    e = store.entry(point.point)
    assert e.status == "complete" and e.requests_scheduled == 5 and e.records.ok == 5
    assert [g.generator for g in e.generators] == [0]
    assert "metrics_unwritten" in e.flags and "No space left on device" in e.flag_reasons["metrics_unwritten"]


def test_an_out_path_that_is_a_file_is_one_line(tmp_path):
    f = tmp_path / "afile"
    f.write_text("")
    line = refused(cli("run", "--out", str(f), "--dry-run"), str(f), "is a file")
    assert "Errno" not in line


def test_a_generator_stops_its_warm_up_when_asked(tmp_path):
    """The generator half of case 1 (no Ray): stop() cancels a warm-up request the server stalls."""
    import asyncio

    from aiohttp.test_utils import TestServer
    from fake_server import make_app

    from rig.contracts import PointColumns
    from rig.loadgen.actor import LoadGenerator
    from rig.loadgen.plan import GeneratorPlan
    from rig.workloads.base import Session, Turn

    info = PointColumns(
        run_id="r",
        point="p0",
        engine="external",
        workload="t",
        api="sglang-native",
        steps=0,
        server_config="x",
        server_args="{}",
        load_mode="closed",
        concurrency=1,
        rate=None,
        repeat=0,
    )
    stalled = Session(
        session_id="w",
        turns=(Turn(request_id="w0", max_tokens=4, messages=({"role": "user", "content": "MODE:slowfirst"},)),),
    )

    async def go() -> tuple[int, float]:
        server = TestServer(make_app())
        await server.start_server()
        gen = LoadGenerator(0, str(tmp_path))
        plan = GeneratorPlan(
            point=info, generator=0, url=str(server.make_url("")).rstrip("/"), model="m", sessions=(), warmup=(stalled,)
        )
        try:
            prep = asyncio.get_running_loop().create_task(gen.prepare(plan))
            await asyncio.sleep(0.5)  # the warm-up request is in flight, its server silent
            assert not prep.done()
            t0 = time.monotonic()
            await gen.stop()
            ok = await asyncio.wait_for(prep, 2.0)
            return ok, time.monotonic() - t0
        finally:
            await gen.close()
            await server.close()

    ok, took = asyncio.run(go())
    assert ok == 0 and took < 1.0


def test_a_password_holding_an_at_sign_is_masked_whole_on_disk_and_on_screen(tmp_path):
    from rig.results import mask_url_credentials

    url = "http://alice:pa@ss@127.0.0.1:9"  # urlsplit reads the password as "pa@ss" (the authority's last "@")
    from urllib.parse import urlsplit

    assert urlsplit(url).password == "pa@ss"
    for text in (url, f'{{"url": "{url}", "b": "https://t0ken@h/x?q=a@b"}}', f"waiting at {url} (last: refused)"):
        masked = mask_url_credentials(text)
        assert "pa@" not in masked and "ss@" not in masked and "alice" not in masked and "t0ken" not in masked
    assert mask_url_credentials(url) == "http://***@127.0.0.1:9"
    assert mask_url_credentials("https://h:1/p?to=a@b") == "https://h:1/p?to=a@b"  # an "@" past the host is kept
    r = cli("run", "--engine", "external", "--url", url, "--dry-run")
    assert r.exit_code == 0 and "ss@" not in r.output and "url: http://***@127.0.0.1:9" in r.output, r.output
