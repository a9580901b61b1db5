"""Injected faults on a running simulator, seen by rig runs and sweeps (integration tier; the fault grammar's fast
checks are in test_sim_faults.py)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import pandas as pd
import psutil
import pytest
import yaml
from accounting import assert_accounting
from support import engine_procs, free_port, rig

from rig.contracts import DISTURBED_FLAGS
from rig.results import read_manifest, read_requests
from rig.sim.faults import FaultPlan, parse_fault

BASE = ["--engine", "sim", "--workload", "greedy", "--steps", "1", "--warmup", "0", "-q"]


def fault_args(*specs: str) -> list[str]:
    out: list[str] = []
    for s in specs:
        out += ["--server-arg=--sim-fault", f"--server-arg={s}"]
    return out


def sim_procs(owner: Path) -> list[psutil.Process]:
    """The simulator processes of the rig run a test started with ``owner``."""
    return engine_procs(owner, marker="rig.sim")


def server_log(run: Path) -> str:
    return "\n".join(f.read_text() for f in sorted(run.glob("logs/**/server.log")))


def _sim(*faults: str):
    """A sim subprocess with these faults on a free loopback port: (process, url)."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "rig.sim",
        "--model-path",
        "m",
        "--tp-size",
        "4",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--random-seed",
        "1",
        "--sim-no-access-log",
    ]
    for f in faults:
        argv += ["--sim-fault", f]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("sim did not start")


@pytest.mark.server
def test_stream_faults_fire_even_when_the_stream_is_shorter_than_after():
    """after=K past the end of a short stream: the fault falls on the last event, so a selected request still fails."""
    from rig.config import Timeouts
    from rig.loadgen.apis import api_for
    from rig.loadgen.client import stream_request
    from rig.workloads.base import Turn

    proc, url = _sim(
        "truncate,every=4,offset=1,after=99",
        "malformed=meta,every=4,offset=2,after=99",
        "malformed=text,every=4,offset=3,after=99",
    )

    async def send() -> list:
        async with aiohttp.ClientSession() as http:
            outs = []
            for i in range(8):
                turn = Turn(request_id=f"r{i}", messages=({"role": "user", "content": "hello there"},), max_tokens=4)
                outs.append(
                    await stream_request(
                        http, url, api_for("sglang-native"), turn, [], "m", Timeouts(first_token_s=10, total_s=10)
                    )
                )
            return outs

    try:
        outs = asyncio.run(send())
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    errors = [o.error for o in outs]
    assert errors[3] is None and errors[7] is None and errors[:3] == errors[4:7]
    assert errors[:2] == [
        "truncated stream: ended mid-event",
        "malformed event: /generate chunk without text and meta_info",
    ]
    assert errors[2].startswith('malformed event: not JSON: \'{not json: {"text":')
    assert [o.status for o in outs] == ["failed"] * 3 + ["ok"] + ["failed"] * 3 + ["ok"]
    assert [o.state.finished for o in outs] == [True, True, True, True] * 2  # the fault came after the last token


@pytest.mark.server
def test_crash_at_kills_the_server_that_long_after_the_first_request():
    proc, url = _sim("crash_at=0.6,code=3")
    try:
        time.sleep(1.0)
        assert proc.poll() is None  # the clock starts at the first generation request, not at startup
        t0 = time.monotonic()
        req = urllib.request.Request(
            url + "/generate",
            data=json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 2}}).encode(),
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 200
        assert proc.wait(timeout=5) == 3
        assert 0.55 < time.monotonic() - t0 < 1.5
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- per-request faults on one run
# Selected by a hash of the request id, so the test knows exactly which requests each fault hits.
STREAM_FAULTS = [
    "http=503,fraction=0.08,seed=1",
    "http=429,fraction=0.05,seed=2",
    "truncate,fraction=0.08,seed=3",
    "reset,fraction=0.06,seed=4",
    "malformed=text,fraction=0.06,seed=5",
    "malformed=meta,fraction=0.06,seed=6",
    "content_type,fraction=0.06,seed=7",
    "hang_headers,fraction=0.05,seed=8",
    "hang,fraction=0.05,seed=21",
]

N_STREAM = 60

EXPECTED_ERROR = {  # fault spec prefix -> (http_status, the record's error as a regex)
    "http=503": (503, r"HTTP 503: .*sim fault: injected HTTP 503"),
    "http=429": (429, r"HTTP 429: .*sim fault: injected HTTP 429"),
    "truncate": (200, r"truncated stream: ended mid-event"),
    # the lean HTTP/1.1 client (default) and aiohttp (RIG_HTTP_CLIENT=aiohttp) word a reset body differently
    "reset": (
        200,
        r"(HTTPError: server closed the connection mid-response"
        r"|ClientPayloadError: Response payload is not completed)",
    ),
    "malformed=text": (200, r"malformed event: not JSON: '\{not json: "),
    "malformed=meta": (200, r"malformed event: /generate chunk without text and meta_info"),
    "content_type": (200, r"wrong content type 'application/json' for a stream: \{\"text\":"),
    "hang_headers": (200, r"timeout: no first token within 2s"),
    "hang": (None, r"timeout: no first token within 2s"),
}


@pytest.fixture(scope="module")
def stream_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("faults")
    res = rig(
        "run",
        *BASE,
        "--concurrency",
        "4",
        "--requests",
        str(N_STREAM),
        "--workload-opt",
        "max_tokens=8",
        "--first-token-timeout",
        "2",
        *fault_args(*STREAM_FAULTS),
        "--out",
        str(out),
        "--run-id",
        "sf",
        owner=out,
    )
    return out / "sf", res


def expected_faults(rids: list[str]) -> dict[str, str]:
    plan = FaultPlan([parse_fault(s) for s in STREAM_FAULTS])
    hit = {r: plan.choose(1, r) for r in rids}
    return {r: f.spec.split(",")[0] for r, f in hit.items() if f is not None}


@pytest.mark.ray
def test_each_faulty_request_is_one_failed_record_with_status_and_message(stream_run):
    run, res = stream_run
    assert res.returncode == 0, res.stderr[-2000:]  # failed requests do not fail the run
    t = read_requests(run).to_pandas().set_index("request_id")
    assert len(t) == N_STREAM and t.index.is_unique
    want = expected_faults(list(t.index))
    assert {k.split(",")[0] for k in STREAM_FAULTS} == set(want.values())  # every fault hit >= 1 request
    failed = t[t.status == "failed"]
    assert set(failed.index) == set(want)  # exactly the faulty requests failed, each once
    for rid, kind in want.items():
        status, pattern = EXPECTED_ERROR[kind]
        row = t.loc[rid]
        assert not row.ok and re.match(pattern, row.error), (rid, kind, row.error)
        assert (row.http_status == status) if status is not None else pd.isna(row.http_status), (rid, kind)
        assert pd.isna(row.output_hash)
    ok = t[t.status == "ok"]
    assert len(ok) == N_STREAM - len(want) and (ok.completion_tokens == 8).all() and ok.error.isna().all()
    assert (ok.http_status == 200).all() and ok.output_hash.notna().all()
    # the server saw each fault exactly where the records say (its log names request and the rid it was sent under)
    logged = re.findall(r"sim fault: request \d+ \(rid (\S+)\): (\S+)", server_log(run))
    wire = dict(zip(t["wire_request_id"], t.index, strict=True))
    assert {wire[rid]: spec.split(",")[0] for rid, spec in logged} == want


@pytest.mark.ray
def test_the_point_completes_with_exact_counts(stream_run):
    run, _ = stream_run
    m = read_manifest(run)
    (p,) = m["points"]
    n_bad = len(expected_faults([f"greedy-{i:06d}-t0" for i in range(N_STREAM)]))
    # a busy host may make rig flag the simulator's timing (sim_behind) or the client (client_saturated): flags that
    # blame the measuring host, not the faults; nothing else may be flagged
    assert m["status"] == "complete" and p["status"] == "complete" and set(p["flags"]) <= set(DISTURBED_FLAGS)
    assert p["records"] == {"ok": N_STREAM - n_bad, "failed": n_bad, "cancelled": 0}
    assert p["requests_scheduled"] == N_STREAM
    # the server's own counter saw only the requests that were generated in full (broken streams are aborted)
    t = read_requests(run).to_pandas()
    assert p["server_counters_delta"]["sglang:generation_tokens_total"] >= t[t.ok].completion_tokens.sum()
    assert_accounting(run)
    assert sim_procs(run.parent) == []


# ---------------------------------------------------------------- the OpenAI routes, selected by arrival number
@pytest.mark.ray
def test_openai_chat_stream_faults_by_arrival_number(tmp_path):
    specs = ["http=500,every=5", "malformed=meta,every=7", "truncate,every=9"]
    n = 30
    res = rig(
        "run",
        *BASE,
        "--api",
        "openai-chat",
        "--concurrency",
        "2",
        "--requests",
        str(n),
        "--workload-opt",
        "max_tokens=6",
        *fault_args(*specs),
        "--out",
        str(tmp_path),
        "--run-id",
        "oa",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    run = tmp_path / "oa"
    t = read_requests(run).to_pandas()
    plan = FaultPlan([parse_fault(s) for s in specs])
    kinds = [f.spec.split(",")[0] for i in range(1, n + 1) if (f := plan.choose(i, None))]
    # 5..30 by 5; 7, 14, 21, 28; 9, 18, 27
    assert (kinds.count("http=500"), kinds.count("malformed=meta"), kinds.count("truncate")) == (6, 4, 3)
    errors = t[~t.ok].error
    assert errors.str.match(r"HTTP 500: .*injected HTTP 500").sum() == 6
    assert (errors == "malformed event: no choices, usage or error").sum() == 4
    assert (errors == "truncated stream: ended mid-event").sum() == 3
    assert len(errors) == 13 and t.ok.sum() == n - 13 and (t[t.ok].completion_tokens == 6).all()
    assert_accounting(run)


# ---------------------------------------------------------------- the server dies mid-point
CRASH_AFTER = 6


def crash_sweep(tmp: Path, run_id: str, *extra: str) -> tuple[Path, subprocess.CompletedProcess]:
    """Two server configurations: the first crashes after CRASH_AFTER requests, the second is healthy."""
    spec = tmp / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "server_grid": {
                    "extra_args": [["--sim-fault", f"crash_after={CRASH_AFTER}", "--sim-fault", "slow=4"], []]
                }
            }
        )
    )
    res = rig(
        "sweep",
        "--config",
        str(spec),
        *BASE,
        "--concurrency",
        "4",
        "--requests",
        "24",
        "--workload-opt",
        "max_tokens=16",
        *extra,
        "--out",
        str(tmp),
        "--run-id",
        run_id,
        owner=tmp,
    )
    return tmp / run_id, res


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    return crash_sweep(tmp_path_factory.mktemp("crash"), "cr")


@pytest.mark.ray
def test_a_crash_fails_its_point_within_5s_and_in_flight_requests_say_why(crashed):
    run, res = crashed
    assert res.returncode == 1, res.stderr[-2000:]  # partial: one point failed, one complete
    m = read_manifest(run)
    bad, good = m["points"]
    assert bad["status"] == "failed" and "server_died" in bad["flags"]
    assert bad["error"] == "server exited with code -9 during the point"
    assert "sim fault: crashing (crash_after=6): generation request 7 arrived" in server_log(run)
    t = read_requests(run).to_pandas()
    rows = t[t.point == bad["point"]].sort_values("send_ts")
    # the requests the server received: the first CRASH_AFTER + 1 sends (the last one killed it)
    received = rows.iloc[: CRASH_AFTER + 1]
    in_flight = received[~received.ok]
    assert received.ok.sum() >= 1 and len(in_flight) >= 2  # at concurrency 4, several were streaming
    assert in_flight.status.eq("failed").all()
    # a request whose keep-alive connection the crash closed before any answer is sent once more (the lean client's
    # stale-connection retry) and meets the dead port; a SIGKILLed process's socket may also answer with a reset (RST)
    # instead of a FIN, depending on whether unread bytes were queued when the kernel closed it
    why = (
        r"(HTTPError: server closed the connection|HTTPError: connection lost: .*Connection reset by peer"
        r"|connect: .*Connection refused|ServerDisconnectedError"
        r"|ClientOSError|ClientPayloadError)"
    )
    assert in_flight.error.str.match(why).all(), in_flight.error.tolist()
    later = rows.iloc[CRASH_AFTER + 1 :]
    assert later.status.isin(["failed", "cancelled"]).all() and later.error.notna().all()
    # detected within 5 s of the crash (the first in-flight failure)
    assert bad["ended_ts"] - in_flight.end_ts.min() < 5.0
    assert_accounting(run)


@pytest.mark.ray
def test_the_sweep_goes_on_with_the_next_server_configuration(crashed):
    run, _ = crashed
    m = read_manifest(run)
    bad, good = m["points"]
    assert m["status"] == "partial" and good["status"] == "complete" and set(good["flags"]) <= set(DISTURBED_FLAGS)
    assert good["records"] == {"ok": 24, "failed": 0, "cancelled": 0}
    cfg_bad, cfg_good = (m["server_configs"][p["server_config"]] for p in (bad, good))
    assert "--sim-fault" in cfg_bad["command"] and "--sim-fault" not in cfg_good["command"]
    assert sim_procs(run.parent) == []


@pytest.mark.ray
def test_fail_fast_stops_after_the_crashed_configuration(tmp_path):
    run, res = crash_sweep(tmp_path, "ff", "--fail-fast")
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert "failed" in last and "server exited with code -9" in last
    bad, nxt = read_manifest(run)["points"]
    assert bad["status"] == "failed" and nxt["status"] == "pending" and nxt["records"]["ok"] == 0
    assert not (run / "requests" / f"point={nxt['point']}").exists()
    assert_accounting(run)
    assert sim_procs(run.parent) == []


# ---------------------------------------------------------------- a slow server against the total timeout
@pytest.mark.ray
def test_a_slowed_server_hits_the_request_timeout_after_its_first_tokens(tmp_path):
    res = rig(
        "run",
        *BASE,
        "--concurrency",
        "2",
        "--requests",
        "4",
        "--workload-opt",
        "max_tokens=64",
        "--request-timeout",
        "1.5",
        *fault_args("slow=25"),
        "--out",
        str(tmp_path),
        "--run-id",
        "slow",
    )
    assert res.returncode == 1
    run = tmp_path / "slow"
    t = read_requests(run).to_pandas()
    assert len(t) == 4 and (t.status == "failed").all()
    assert (t.error == "timeout: stream not finished within 1.5s").all()
    assert t.ttft_s.notna().all() and (t.chunk_tokens.apply(sum) < 64).all()  # tokens came, too slowly
    assert ((t.e2e_s > 1.45) & (t.e2e_s < 2.5)).all()
    (p,) = read_manifest(run)["points"]
    assert p["status"] == "failed" and p["error"] == "no request succeeded (4 failed)"
    assert_accounting(run)


@pytest.mark.ray
def test_a_simulator_its_host_stalled_flags_its_point_and_the_report_says_why(tmp_path):
    # The process stops for 1.6 s mid-request (past the 1 s it catches up on): the modelled time it skipped is
    # counted by the sim, and the run flags the point, whose figures understate the modelled hardware.
    res = rig(
        "run",
        *BASE,
        "--concurrency",
        "1",
        "--requests",
        "1",
        "--workload-opt",
        "max_tokens=300",
        *fault_args("stall=1.6,at=0.3"),
        "--out",
        str(tmp_path),
        "--run-id",
        "stall",
    )
    run = tmp_path / "stall"
    (p,) = read_manifest(run)["points"]
    # sim_behind, and nothing but what a busy host may add beside it (client_saturated: the generator's own loop lag)
    assert p["records"]["ok"] == 1 and "sim_behind" in p["flags"], (p, res.stderr[-2000:])
    assert set(p["flags"]) <= DISTURBED_FLAGS, p["flags"]
    # 1.6 s stalled, plus however late a busy host ran it besides
    reason = p["flag_reasons"]["sim_behind"]
    fell = re.fullmatch(r"the simulator fell (\d+\.\d\d) s behind its modelled clock .*", reason)
    assert fell and float(fell.group(1)) >= 1.0, p["flag_reasons"]
    assert p["server_counters_delta"]["sglang:sim_behind_seconds_total"] >= 1.0
    rep = rig("report", str(run))
    assert rep.returncode == 0 and "sim_behind" in rep.stdout, rep.stdout[-3000:]
    assert f"fell {fell.group(1)}" in rep.stdout, rep.stdout[-3000:]
