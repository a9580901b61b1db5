"""Hardening round 4 (issue 32), items 5 and 6: each case here failed on the tree before its fix."""

from __future__ import annotations

import pytest
from test_harden3 import _requests

from rig.analysis import metrics as m


# --- 5. goodput counts cancelled requests as misses
def test_goodput_counts_requests_cancelled_once_sent_as_missing_the_slo():
    # 26 served within 1 s; 174 cancelled at the level's end after running 4.9-5.2 s; 3 never sent (ran 0 s)
    r = _requests([1.0] * 26, [4.9, 5.0, 5.2] * 58 + [0.0] * 3)
    g = m.goodput(r, [m.parse_slo("e2e=2s")], wall_s=10.0)
    assert (g["good"], g["counted"]) == (26, 200)  # it was 26 of 26 (100 %) beside '177 cancelled left out'
    assert g["fraction"] == pytest.approx(0.13)
    assert g["goodput_req_s"] == pytest.approx(2.6)


# --- 5. the greedy losslessness check says "not checked" when it compared nothing
def test_losslessness_with_no_temperature_0_request_is_not_checked_not_ok():
    from rich.console import Console

    from rig.analysis.render import render_lossless
    from rig.contracts.report import LosslessResult

    nothing = LosslessResult.make(groups_checked=2, requests_checked=0, mismatches=[], ok=True)
    console = Console(width=200, record=True)
    console.print(render_lossless(nothing))
    text = console.export_text()
    assert text.startswith("Greedy losslessness: not checked (no temperature-0 request in the 2 group(s)"), text
    assert "OK" not in text


def test_losslessness_not_checked_in_the_html_and_the_verdict(monkeypatch):
    from rig.analysis import verdict
    from rig.analysis.html import lossless_html
    from rig.contracts.report import LosslessResult

    class _Report:
        lossless = LosslessResult.make(groups_checked=1, requests_checked=0, mismatches=[], ok=True)
        campaign: list = []

    [line] = lossless_html(_Report())  # type: ignore[arg-type]
    assert "Not checked" in line and "OK" not in line
    h = verdict.health(_Report())  # type: ignore[arg-type]
    assert verdict.health_text(h)[1].endswith("greedy losslessness: not checked (no temperature-0 requests)")


# --- 5. decode tok/s says how many requests it left out
def test_decode_tok_s_says_how_many_ok_requests_it_left_out():
    import numpy as np

    from rig.analysis.points import flag_reasons
    from rig.analysis.runs import PointInfo

    r = _requests([2.0] * 5, [3.0])
    r.tokens[:] = [10, 10, 10, 1, 10, np.nan]
    r.ttft[:] = [0.5, 0.5, 2.0, 2.0, 2.0, np.nan]  # the last two with 10 tokens: every token in the first chunk
    assert r.decode_left_out() == (2, 1)
    assert m.nanmean(r.decode_tok_s[r.ok]) == pytest.approx(9 / 1.5)  # the two it can measure
    p = PointInfo.model_validate({"point": "p", "status": "complete"})
    why = flag_reasons(p, r)["decode_left_out"]
    assert why == (
        "Decode tok/s leaves out 3 of 5 ok requests: 2 with E2E == TTFT (every token in the first chunk), "
        "1 with fewer than two tokens"
    )


# --- 5. grid knob values appear in the tables, not only configuration hashes
def _grid_run(d):
    from synthetic import greedy_rows, point_entry, write_requests, write_run

    configs = {
        "sim-s0-aaaa": {"engine": "sim", "knobs": {"steps": 0, "eagle_topk": 1, "tp": 4}},
        "sim-s4-bbbb": {"engine": "sim", "knobs": {"steps": 4, "eagle_topk": 1, "tp": 4}},
        "sim-s4-cccc": {"engine": "sim", "knobs": {"steps": 4, "eagle_topk": 4, "tp": 4}},
    }
    points = []
    for cid, cfg in configs.items():
        for c in (2, 4):
            name = f"{cid}-c{c}"
            points.append(point_entry(name, cfg["knobs"]["steps"], concurrency=c, server_config=cid))
    write_run(d, {"run_id": "grid", "status": "complete", "points": points, "server_configs": configs})
    for p in points:
        fast = 0.5 if p["steps"] else 1.0
        write_requests(d, p["point"], 0, greedy_rows(p["point"], p["steps"], [0.1] * 8, [fast * 2] * 8, 20))
    return d


def test_grid_knob_values_name_the_configurations_in_the_tables(tmp_path):
    from rich.console import Console

    from rig.analysis.report import build_report
    from rig.analysis.settings import grid_knobs
    from rig.analysis.tables import render_campaign_table
    from rig.analysis.verdict import setting_labels

    run_dir = _grid_run(tmp_path / "grid")
    rep = build_report(run_dir)
    knobs = grid_knobs(rep.run)
    assert knobs == {"sim-s0-aaaa": "eagle_topk=1", "sim-s4-bbbb": "eagle_topk=1", "sim-s4-cccc": "eagle_topk=4"}
    console = Console(width=200, record=True)
    console.print(render_campaign_table(rep.campaign, knobs))
    titles = [ln.strip() for ln in console.export_text().splitlines() if ln.startswith("greedy ·")]
    assert titles == [
        "greedy · sim-s0-aaaa (sim, steps=0, eagle_topk=1)",
        "greedy · sim-s4-bbbb (sim, steps=4, eagle_topk=1)",
        "greedy · sim-s4-cccc (sim, steps=4, eagle_topk=4)",
    ]
    labels = setting_labels(rep.campaign, rep.run)
    assert labels["sim-s4-cccc"] == "steps=4 (eagle_topk=4)" and labels["sim-s0-aaaa"] == "steps=0"
    bests = {b["best"] for band in rep.schedule for b in band["bands"]}  # the verdict's bands name them so too
    assert bests == {"steps=4 (eagle_topk=1)"}


# --- 5. rig sim fit shows progress, on a terminal and in a log
def test_sim_fit_progress_is_shown_in_place_on_a_terminal_and_every_10_s_elsewhere():
    import io

    from rich.console import Console

    from rig.sim.fit_progress import FitProgress

    now = [100.0]
    log = io.StringIO()
    console = Console(file=log, width=200)  # not a terminal: a CI log
    progress = FitProgress(console, 1500, status=None, clock=lambda: now[0])
    for n, t in ((1, 100.0), (2, 104.0), (3, 110.0), (4, 111.0), (5, 121.0)):
        now[0] = t
        progress(n, 0.5 / n)
    assert log.getvalue().splitlines() == [
        "fitting: 1 of at most 1,500 evaluations, objective 0.50000, 0 s",
        "fitting: 3 of at most 1,500 evaluations, objective 0.16667, 10 s",
        "fitting: 5 of at most 1,500 evaluations, objective 0.10000, 21 s",
    ]

    class Status:
        lines: list[str] = []

        def update(self, text: str) -> None:
            self.lines.append(text)

    term = Console(file=io.StringIO(), force_terminal=True)
    status = Status()
    on_term = FitProgress(term, 10, status=status, clock=lambda: now[0])
    on_term(1, 1.0)
    on_term(2, 0.5)
    on_term.step("held-out fit 1/3: without C=4")
    assert status.lines == [
        "fitting: 1 of at most 10 evaluations, objective 1.00000, 0 s",
        "fitting: 2 of at most 10 evaluations, objective 0.50000, 0 s",
        "held-out fit 1/3: without C=4",
    ]


# --- 6. summed gauges keep one TP rank's copy and the empty priority label
def test_summed_gauges_count_one_tp_rank_and_the_total_priority_only(tmp_path):
    import json

    from synthetic import point_entry, write_run, write_server_metrics

    from rig.analysis.runs import load_run
    from rig.analysis.server_series import point_series
    from rig.contracts.label_sets import kept_label_sets
    from rig.server.scrape import live_gauges, summed_values

    def lab(**kw: str) -> str:
        return json.dumps(dict(sorted({"model_name": "m", **kw}.items())))

    # --enable-metrics-for-all-schedulers at TP 4: every rank reports the same 6 running; per-priority beside the total
    scrape = [("sglang:num_running_reqs", lab(tp_rank=str(r)), 6.0) for r in range(4)]
    scrape += [
        ("sglang:num_queue_reqs", lab(tp_rank="0", priority=p), v) for p, v in (("", 5.0), ("1", 2.0), ("2", 3.0))
    ]
    assert summed_values(scrape) == {"sglang:num_running_reqs": 6.0, "sglang:num_queue_reqs": 5.0}
    assert live_gauges(scrape) == {"sglang:num_running_reqs": 6.0, "sglang:num_queue_reqs": 5.0}
    # DP attention: each DP rank's leader counts (its requests are its own)
    dp = [{"tp_rank": "0", "dp_rank": "0"}, {"tp_rank": "2", "dp_rank": "1"}, {"tp_rank": "3", "dp_rank": "1"}]
    assert kept_label_sets(dp) == [True, True, False]
    assert kept_label_sets([{"is_streaming": "true"}, {"is_streaming": "false"}]) == [True, True]

    write_run(tmp_path, {"run_id": "r", "status": "complete", "points": [point_entry("p", 2)]})
    rows = [{"ts": 100.0 + k, "name": n, "value": v, "labels": labels} for k in range(3) for n, labels, v in scrape]
    write_server_metrics(tmp_path, "p", rows)
    series = point_series(load_run(tmp_path), "p")
    assert series["running"].values.tolist() == [6.0, 6.0, 6.0]  # was 24 (4 ranks added up)
    assert series["queued"].values.tolist() == [5.0, 5.0, 5.0]  # was 10 (the total and its parts)


# --- 6. the sim checks Content-Type on /v1/*, and has no sglang:max_running_requests gauge
def test_sim_refuses_a_body_that_is_not_json_and_emits_no_max_running_requests_gauge():
    import asyncio

    import aiohttp
    from aiohttp.test_utils import TestServer

    from rig.sim.app import create_app
    from rig.sim.launch import build_server, prepare

    body = b'{"model": "m", "prompt": "hi", "max_tokens": 2}'

    async def go():
        srv = build_server(
            *prepare(["--model-path", "m", "--tp-size", "4", "--skip-server-warmup", "--enable-metrics"])
        )
        srv.ready = True
        server = TestServer(create_app(srv))
        await server.start_server()
        out = []
        try:
            async with aiohttp.ClientSession() as s:
                for path in ("/v1/completions", "/v1/chat/completions"):
                    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
                        headers = {"Content-Type": ctype} if ctype else {}
                        async with s.post(server.make_url(path), data=body, headers=headers) as r:
                            out.append((r.status, (await r.json())["type"], (await r.json())["message"]))
                url = server.make_url("/v1/completions")
                ok = {"Content-Type": "application/json; charset=utf-8"}
                async with s.post(url, data=body, headers=ok) as r:
                    out.append((r.status, None, None))
                async with s.get(server.make_url("/metrics")) as r:
                    metrics = await r.text()
        finally:
            await server.close()
            await srv.engine.stop()
        return out, metrics

    out, metrics = asyncio.run(go())
    err = {
        "loc": ["header", "content-type"],
        "msg": "Unsupported Media Type: Only 'application/json' is allowed",
        "type": "value_error",
    }
    refused = (400, "Bad Request", f"1 validation error:\n  {err} [{err}]")  # pydantic's words, as 0.5.17 sent them
    assert out == [refused] * 6 + [(200, None, None)]
    assert "sglang:max_total_num_tokens{" in metrics and "sglang:max_running_requests{" not in metrics


# --- 6. the sim's meta_info carries 0.5.23's speculative names, not the legacy aliases
def test_sim_meta_info_has_the_0_5_23_speculative_names_only():
    from types import SimpleNamespace

    from rig.loadgen.apis import _speculative_fields
    from rig.sim.responses import speculative_fields

    st = SimpleNamespace(req=SimpleNamespace(verify_ct=4, accepted_drafts=6, hist=[0, 1, 2, 1]), n_tokens=10)
    got = speculative_fields(st, steps=3)  # type: ignore[arg-type]
    assert set(got) == {
        "spec_verify_ct",
        "spec_accept_length",
        "spec_accept_rate",
        "spec_num_correct_drafts",
        "spec_num_proposed_drafts",
        "spec_correct_drafts_histogram",
    }
    assert _speculative_fields(got) == {
        "spec_verify_ct": 4,
        "spec_accept_length": 2.5,
        "spec_accepted_drafts": 6,
        "spec_proposed_drafts": 12,
    }


# --- 6. a note before the levels whose concurrency exceeds the server's effective max running requests
def test_a_note_names_the_levels_above_what_the_server_runs_at_once():
    from rig.contracts.server import EffectiveConfig
    from rig.run.capacity_note import queue_note

    eff = EffectiveConfig(requested={"steps": 3}, effective={"steps": 3, "max_running_requests": 48})
    info = {"internal_states": [{"effective_max_running_requests_per_dp": 48}]}
    assert queue_note("sglang-s3", eff, info, [16, 48, 64, 128], "closed") == (
        "server sglang-s3: concurrency 64, 128 exceeds the server's effective max running requests 48: requests "
        "queue in the server there (TTFT counts the wait)"
    )
    two = {"internal_states": [{}, {}]}
    assert queue_note("c", eff, two, [64, 128], "closed").endswith(  # type: ignore[union-attr]
        "concurrency 128 exceeds the server's effective max running requests 96 (48 per DP rank x 2): requests "
        "queue in the server there (TTFT counts the wait)"
    )
    assert queue_note("c", eff, info, [16, 48], "closed") is None
    assert queue_note("c", eff, info, [64], "open") is None  # open loop: no concurrency level to compare
    assert queue_note("c", EffectiveConfig(requested={}, effective={}), info, [64], "closed") is None  # not said


# --- 6. NGRAM points are labelled by draft tokens; topk is the BFS breadth
def test_ngram_is_launched_by_draft_tokens_and_bfs_breadth_and_read_back_so():
    from rig.config import as_it_runs
    from rig.server.effective import effective_config, requested
    from rig.server.engines import SGLangAdapter
    from rig.server.spec import ServerConfig

    cfg = ServerConfig(engine="sglang", steps=8, spec_algorithm="ngram", eagle_topk=4)
    args = SGLangAdapter().speculative_args(cfg)
    assert args == [
        "--speculative-algorithm",
        "NGRAM",
        "--speculative-num-draft-tokens",
        "8",
        "--speculative-ngram-max-bfs-breadth",
        "4",
    ]
    assert "--speculative-eagle-topk" not in args and "--speculative-num-steps" not in args
    assert as_it_runs(cfg.model_copy(update={"num_draft_tokens": 6})).num_draft_tokens == 6  # no steps + 1 rule
    assert requested(cfg)["num_draft_tokens"] == 8
    # /server_info as _handle_ngram leaves it: eagle_topk copied from the breadth, its own num_steps
    info = {
        "speculative_algorithm": "NGRAM",
        "speculative_num_steps": 1,
        "speculative_num_draft_tokens": 8,
        "speculative_eagle_topk": 4,
        "speculative_ngram_max_bfs_breadth": 4,
    }
    eff = effective_config(cfg, info, None)
    assert eff.effective["steps"] == 8 and eff.effective["eagle_topk"] == 4
    assert [c.knob for c in eff.changed] == []  # the label stands: steps=8 means 8 draft tokens


# --- 6. SGLang 0.5.16's completions (no return_token_ids): chunk counts from continuous usage, else flagged
def _events(*events: dict) -> tuple[bytes, int]:
    import json

    return ("[" + ",\n".join(json.dumps(e) for e in events) + "]").encode(), len(events)


def test_completions_chunk_counts_come_from_continuous_usage_where_token_ids_are_missing():
    from rig.loadgen.apis import StreamState, api_for
    from rig.loadgen.dialects import Dialect
    from rig.workloads.base import Turn

    api = api_for("openai-completions", Dialect("sglang"))
    turn = Turn(request_id="r", messages=({"role": "user", "content": "x"},), max_tokens=9, temperature=0.0)
    body = api.payload(turn, [], "m")
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["return_token_ids"] is True  # asked too: 0.5.17+ answer with ids, 0.5.16 ignores the field

    def choice(text, **kw):
        return {"choices": [{"index": 0, "text": text, "finish_reason": kw.pop("finish", None)}], **kw}

    # 0.5.16 with speculation: chunks of 3, 2 and 4 tokens, a running usage on each, then the usage chunk
    use = {"prompt_tokens": 5, "total_tokens": 0}
    stream = _events(
        choice("a b c", usage={**use, "completion_tokens": 3}),
        choice(" d e", usage={**use, "completion_tokens": 5}),
        choice(" f g h i", usage={**use, "completion_tokens": 9}, finish="length"),
        {"choices": [], "usage": {**use, "completion_tokens": 9}},
    )
    for fold in ("typed", "dicts"):
        state, tokens = StreamState(), []
        if fold == "typed":
            assert api.fold_array(*stream, state, tokens) == 4
        else:
            import orjson

            api.fold_all(orjson.loads(stream[0]), state, tokens)
        assert tokens == [3, 2, 4] and state.completion_tokens == 9 and not state.counted_by_text, fold
    # neither ids nor a running usage: one token per chunk is a guess, and the record can say so
    state, tokens = StreamState(), []
    bare = _events(
        choice("a b c"), choice(" d e", finish="length"), {"choices": [], "usage": {**use, "completion_tokens": 5}}
    )
    api.fold_array(*bare, state, tokens)
    assert tokens == [1, 1] and state.completion_tokens == 5 and state.counted_by_text


def test_a_point_whose_chunk_tokens_do_not_sum_to_completion_tokens_is_flagged():
    from rig.contracts.generator import GeneratorReport
    from rig.run.statuses import dialect_flags

    gens = [
        GeneratorReport(generator=0, chunk_tokens_mismatch=7),
        GeneratorReport(generator=1, chunk_tokens_mismatch=3),
    ]
    why = dialect_flags(gens, 40, None)["chunk_tokens_mismatch"]
    assert why.startswith("10 of 40 requests' chunk token counts do not sum to their completion_tokens")
