"""rig's parsers and the simulator's answers held to real SGLang 0.5.17's responses, recorded byte for byte.

The data (tests/data/sglang-0.5.17-recorded) is one SGLang 0.5.17 server on an NVIDIA H100 80GB HBM3 (driver
580.159.04), 2026-12-07 12:49 UTC, launched as command.txt says: STANDALONE speculative decoding, steps 3, topk 1, 4
draft tokens, a 4-layer random-weight Llama as target and draft. scripts/record_sglang.py recorded each exchange as
``NAME.request.json`` (method, path, headers, body) and ``NAME.response`` (status line, headers, a blank line, the raw
body: streamed SSE bodies exactly as they arrived; a body over 192 KiB keeps its head and tail), with index.json
(the exchanges in the order sent, each one's status, size and start time), provenance.json, the server's log
(server.log, progress bars removed) and the startup lines rig parses (startup_lines.txt). Besides the routes: the
refusals (bad bodies, unknown routes), ``/flush_cache`` while a request runs, a duplicate of a live rid, and a rid
reused right after its stream ended. ``err_generate_unknown_sampling_field``: SGLang 0.5.17 raised ``TypeError:
Unexpected keyword argument 'not_a_field'`` inside the /generate stream after the 200 head went out, and uvicorn
closed the connection with no body (server.log); the recorder keeps that as it came.

What is held here: rig's stream folds (rig.loadgen) and meta_info readers give the token counts, finish reasons and
speculative figures the recorded JSON itself says (every expected value computed here from the recording); rig's
readers of /server_info, /metrics, /v1/models, /model_info and the startup log give the launch of command.txt; the
simulator, launched with the same flags (NEXTN for STANDALONE, which it does not model), answers the same requests
in the same order with the same JSON keys and field types, and each difference left is listed below with its reason
(a new one fails, and so does a listed one that is gone). The recorder itself is tested against a loopback server,
and the broken stream SGLang 0.5.17 sent is replayed to rig's clients: a failed record, never a crash.
"""

from __future__ import annotations

import asyncio
import http.client
import importlib.util
import json
import re
import shlex
import socket
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pyarrow.dataset as ds
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sglang_0_5_17 import REAL_ONLY_INFO_KEYS
from support import DATA, REPO, start_sim

from rig.analysis.metrics import acceptance_from_counters
from rig.analysis.server_series import ALL_NAMES
from rig.config import Timeouts
from rig.loadgen import http1
from rig.loadgen.apis import Api, OpenAIChat, OpenAICompletions, SGLangNative, StreamState
from rig.loadgen.client import request_fields, stream_request
from rig.loadgen.dialects import identify
from rig.loadgen.outcome import Outcome, _Folder, _no_usage
from rig.loadgen.server_fields import server_timestamps, speculative_fields
from rig.server.effective import _sglang_effective, effective_config
from rig.server.engines import SGLangAdapter
from rig.server.scrape import LastGauges, parse_metrics, summed_values
from rig.server.spec import ServerConfig
from rig.sim.args import load_table
from rig.workloads.base import Turn

REC = DATA / "sglang-0.5.17-recorded"
COMMAND = (REC / "command.txt").read_text().strip()
ARGV = shlex.split(COMMAND)
PROVENANCE = json.loads((REC / "provenance.json").read_text())
LOG = (REC / "server.log").read_text()


def flag(name: str) -> str:
    """The value of ``name`` in the recorded launch command."""
    return ARGV[ARGV.index(name) + 1]


STEPS = int(flag("--speculative-num-steps"))
TOPK = int(flag("--speculative-eagle-topk"))
DRAFT_TOKENS = int(flag("--speculative-num-draft-tokens"))
MODEL = flag("--model-path")

INDEX = json.loads((REC / "index.json").read_text())
RECORDED = tuple(e["name"] for e in INDEX)  # every exchange, in the order scripts/record_sglang.py sent it
SENT_AT = {e["name"]: e["t"] for e in INDEX}  # the recorder's clock when it sent each
# record_routes' routes, up to the idle /flush_cache: the sim is asked them in this order
ORDER = RECORDED[: RECORDED.index("flush_cache_idle") + 1]
GENERATIONS = ORDER[ORDER.index("metrics_idle") + 1 : ORDER.index("metrics_after_load")]  # between the two scrapes
BROKEN = "err_generate_unknown_sampling_field"  # its stream broke: 200, then no body
# the refusals the recorder sent one after another (the duplicate rid needs the busy request: held apart)
REFUSALS = tuple(n for n in RECORDED if n.startswith("err_") and n not in (BROKEN, "err_duplicate_live_rid"))


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # names lowercased
    body: bytes


def parse_response(raw: bytes) -> Answer:
    """A ``NAME.response`` file: the status line, ``name: value`` lines, a blank line, the raw body."""
    head, sep, body = raw.partition(b"\n\n")
    assert sep, "no blank line after the head"
    lines = head.decode().split("\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v for k, _, v in (ln.partition(": ") for ln in lines[1:])}
    return Answer(status, headers, body)


def recorded(name: str) -> Answer:
    ans = parse_response((REC / f"{name}.response").read_bytes())
    assert b"bytes elided ...]" not in ans.body  # the recorder keeps a long body's head and tail only
    return ans


def request(name: str) -> dict[str, Any]:
    return json.loads((REC / f"{name}.request.json").read_text())


def body_json(name: str) -> Any:
    return json.loads(recorded(name).body)


def sse_objects(body: bytes) -> list[dict[str, Any]]:
    """The events of a recorded stream, parsed here on their own (not by rig): each ``data: {...}`` line and its
    blank line, ending with ``data: [DONE]``."""
    blocks = body.split(b"\n\n")
    assert blocks[-1] == b"" and all(b.startswith(b"data: ") for b in blocks[:-1]), "not one data line per event"
    payloads = [b.removeprefix(b"data: ") for b in blocks[:-1]]
    assert payloads[-1] == b"[DONE]" and b"[DONE]" not in payloads[:-1]
    return [json.loads(p) for p in payloads[:-1]]


INFO = body_json("server_info_idle")


# ---------------------------------------------------------------- the recording itself


def test_recording_is_what_the_log_saw():
    """Every exchange saved is one the server logged (the busy and rid-reuse ones ran side by side, so order aside);
    the broken one logged 200 OK (the head had gone out), then SGLang's TypeError, and came back with no body."""
    saved = {p.name.removesuffix(".request.json") for p in REC.glob("*.request.json")}
    assert saved == set(RECORDED) == {p.name.removesuffix(".response") for p in REC.glob("*.response")}
    access = re.findall(r'INFO: +[\d.]+:\d+ - "(\w+) (\S+) HTTP/1\.1" (\d+)', LOG)
    ours = Counter((request(e["name"])["method"], request(e["name"])["path"], str(e["status"])) for e in INDEX)
    assert Counter(access[-len(INDEX) :]) == ours
    broken = INDEX[RECORDED.index(BROKEN)]
    assert (broken["status"], broken["bytes"], broken["broken"]) == (200, 0, "IncompleteRead after 0 bytes")
    assert "Exception in ASGI application" in LOG and "uvicorn/protocols/http/h11_impl.py" in LOG
    assert "TypeError: Unexpected keyword argument 'not_a_field'" in LOG
    assert PROVENANCE["command"] == COMMAND and PROVENANCE["sglang_version"] == INFO["version"] == "0.5.17"
    assert PROVENANCE["gpu"].startswith("NVIDIA H100 80GB HBM3, 580.159.04")
    assert PROVENANCE["date_utc"].startswith("2026-12-07")
    assert (flag("--speculative-algorithm"), STEPS, TOPK, DRAFT_TOKENS) == ("STANDALONE", 3, 1, 4)


def _tail_objects(name: str) -> list[dict[str, Any]]:
    """The whole events after the elided middle of a long recorded stream (the first block there is cut)."""
    raw = (REC / f"{name}.response").read_bytes()
    tail = raw.rsplit(b" bytes elided ...]\n", 1)[1]
    blocks = tail.split(b"\n\n")[1:-1]
    assert blocks and blocks[-1] == b"data: [DONE]"
    return [json.loads(b.removeprefix(b"data: ")) for b in blocks[:-1]]


def _ending(chunks: list[dict[str, Any]]) -> tuple[str, int]:
    """A streamed completion's finish reason (its last choice) and the completion tokens of its usage chunk."""
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
    return finish, chunks[-1]["usage"]["completion_tokens"]


def test_rid_rules_as_0517_showed_them():
    """What the simulator's rid rules (rig/sim/rids.py) rest on, seen: a duplicate of a live rid is refused inside a
    200 stream, and that refusal's background abort ends the live original 2 s later; a stream under a rid that
    ended a moment ago is aborted 2 s after it ended, and so is one whose rid it prefixes; another rid runs on."""
    (refusal,) = sse_objects(recorded("err_duplicate_live_rid").body)
    assert recorded("err_duplicate_live_rid").status == 200
    assert refusal == {
        "error": {
            "message": "Duplicate request ID detected: busy-1",
            "type": "invalid_request_error",
            "code": 400,
            "retryable": False,
        }
    }
    wanted = request("busy_long_stream")["body"]["max_tokens"]
    finish, tokens = _ending(sse_objects(recorded("busy_long_stream").body))
    assert finish == "abort" and 0 < tokens < wanted
    # the recorder sent rid_reuse_first the moment the busy stream ended: 2 s after the refusal
    assert 2.0 <= SENT_AT["rid_reuse_first"] - SENT_AT["err_duplicate_live_rid"] < 2.1
    first = sse_objects(recorded("rid_reuse_first").body)
    assert first[-1]["meta_info"]["finish_reason"]["type"] == "length"
    for name, rid in (("rid_reuse_same", "reuse-t1"), ("rid_reuse_prefixed", "reuse-t10")):
        chunks = sse_objects(recorded(name).body)
        assert {c["id"] for c in chunks} == {rid}
        finish, tokens = _ending(chunks)
        assert finish == "abort" and 0 < tokens < request(name)["body"]["max_tokens"]
    other = _tail_objects("rid_reuse_other")
    assert _ending(other) == ("length", request("rid_reuse_other")["body"]["max_tokens"])
    busy_flush = recorded("flush_cache_busy")
    assert (busy_flush.status, busy_flush.body) == (400, b"Flush cache failed.\n")


# ---------------------------------------------------------------- rig's stream folds on the recorded bodies


def turn_for(name: str) -> Turn:
    body = request(name)["body"]
    sp = body.get("sampling_params", body)
    n = sp.get("max_new_tokens") or body.get("max_tokens") or body.get("max_completion_tokens")
    return Turn(
        request_id=name,
        messages=({"role": "user", "content": "x"},),
        max_tokens=n,
        temperature=sp.get("temperature", 0.0),
        top_p=sp.get("top_p", 1.0),
        ignore_eos=bool(sp.get("ignore_eos", False)),
    )


def _splits(body: bytes) -> dict[str, list[bytes]]:
    """The body as the client might read it: at once, one event per read, and in 7-byte pieces."""
    events = [e + b"\n\n" for e in body.split(b"\n\n")[:-1]]
    return {"whole": [body], "per event": events, "7 bytes": [body[i : i + 7] for i in range(0, len(body), 7)]}


def fold_recorded(api: Api, name: str) -> tuple[dict[str, Any], StreamState]:
    """The recorded body through the lean client's fold (_Folder, as its sink feeds it: reads in order, nothing
    after [DONE], the end of the body only when [DONE] did not come), read three ways: the same record each time."""
    recs = {}
    for how, pieces in _splits(recorded(name).body).items():
        out = Outcome(send_mono=0.0, end_mono=0.0)
        folder = _Folder(api, out)
        for i, piece in enumerate(pieces, 1):
            folder.feed(piece, i * 1e-3)
            if out.state.done:
                break
        if not out.state.done:
            folder.close(1.0)
        rec = request_fields(turn_for(name), _no_usage(out, api))
        recs[how] = ({k: v for k, v in rec.items() if k not in ("e2e_s", "ttft_s", "chunk_offsets_s")}, out.state)
    (first, state), *others = recs.values()
    assert all(rec == first for rec, _ in others), "the record depends on how the body was split into reads"
    return first, state


@pytest.mark.parametrize("name", ["generate_stream_greedy", "generate_stream_sampled"])
def test_native_stream_folds_to_the_recorded_figures(name):
    """/generate: SGLang 0.5.17 streams cumulative text and output_ids (--incremental-streaming-output is off); rig's
    fold expects exactly that (SGLangNative.fold keeps the new suffix of each chunk's text, and takes a text that does
    not extend the last as a delta) and counts each chunk's tokens from meta_info.completion_tokens."""
    chunks = sse_objects(recorded(name).body)
    assert INFO["incremental_streaming_output"] is False
    for prev, cur in zip(chunks, chunks[1:], strict=False):  # cumulative, chunk by chunk
        assert cur["text"].startswith(prev["text"])
        assert cur["output_ids"][: len(prev["output_ids"])] == prev["output_ids"]
    assert all(len(c["output_ids"]) == c["meta_info"]["completion_tokens"] for c in chunks)
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    last = chunks[-1]["meta_info"]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]

    rec, state = fold_recorded(SGLangNative(), name)
    assert (rec["status"], rec["ok"], rec["error"]) == ("ok", True, None)
    assert rec["completion_tokens"] == last["completion_tokens"] and rec["completion_tokens_source"] == "usage"
    assert rec["chunk_tokens"] == [b - a for a, b in zip([0, *counts], counts, strict=False) if b > a]
    assert sum(rec["chunk_tokens"]) == rec["completion_tokens"]
    assert rec["finish_reason"] == last["finish_reason"]["type"]
    assert (rec["prompt_tokens"], rec["cached_tokens"]) == (last["prompt_tokens"], last["cached_tokens"])
    assert state.text == chunks[-1]["text"] and rec["output_chars"] == len(chunks[-1]["text"])  # kept once
    # the speculative figures of the finished chunk (0.5.17 sends each count under two names; rig takes either)
    assert rec["spec_verify_ct"] == last["spec_verify_ct"]
    assert rec["spec_accept_length"] == last["spec_accept_length"]
    assert rec["spec_accept_length"] == pytest.approx(rec["completion_tokens"] / rec["spec_verify_ct"])
    assert rec["spec_accepted_drafts"] == last["spec_num_correct_drafts"] == last["spec_accepted_drafts"]
    assert rec["spec_proposed_drafts"] == last["spec_num_proposed_drafts"] == last["spec_proposed_drafts"]
    # the server's clock: received, finished, queue; 0.5.17 sends no first-token time and rig invents none
    assert rec["server_received_ts"] == last["request_received_ts"]
    assert rec["server_finished_ts"] == last["request_finished_ts"] > rec["server_received_ts"]
    assert rec["server_queue_s"] == last["queue_time"]
    assert "first_token_latency" not in last and "server_first_token_ts" not in rec


def test_native_answer_read_by_rigs_meta_info_readers():
    """The non-streamed /generate answer's meta_info (rig streams, but reads meta_info and sglext with these)."""
    ans = body_json("generate_nostream")
    meta = ans["meta_info"]
    asked = request("generate_nostream")["body"]["sampling_params"]["max_new_tokens"]
    assert len(ans["output_ids"]) == meta["completion_tokens"] == asked
    assert meta["finish_reason"] == {"type": "length", "length": asked}
    assert speculative_fields(meta) == {
        "spec_verify_ct": meta["spec_verify_ct"],
        "spec_accept_length": meta["spec_accept_length"],
        "spec_accepted_drafts": meta["spec_num_correct_drafts"],
        "spec_proposed_drafts": meta["spec_num_proposed_drafts"],
    }
    assert server_timestamps(meta) == {
        "server_received_ts": meta["request_received_ts"],
        "server_finished_ts": meta["request_finished_ts"],
        "server_queue_s": meta["queue_time"],
    }


@pytest.mark.parametrize("name", ["generate_stream_greedy", "generate_stream_sampled", "generate_nostream"])
def test_speculative_figures_agree_with_the_launch(name):
    """Each finished meta_info against command.txt: drafts proposed = verify steps x num_steps, the histogram of
    accepted drafts per step (0.5.17: also under its 0.5.15 name) sums to the steps and to the accepted drafts, and
    the tokens are what the steps can have committed (one from the prefill, then 1 + accepted per step)."""
    ans = recorded(name)
    meta = (sse_objects(ans.body)[-1] if request(name)["body"]["stream"] else json.loads(ans.body))["meta_info"]
    verify, correct, proposed = (
        meta["spec_verify_ct"],
        meta["spec_num_correct_drafts"],
        meta["spec_num_proposed_drafts"],
    )
    hist = meta["spec_correct_drafts_histogram"]
    assert proposed == verify * STEPS and proposed == verify * (DRAFT_TOKENS - 1)  # topk 1: a chain of num_steps
    assert hist == meta["spec_accept_histogram"] and len(hist) <= DRAFT_TOKENS
    assert sum(hist) == verify and sum(i * h for i, h in enumerate(hist)) == correct
    assert meta["spec_accept_rate"] == pytest.approx(correct / proposed)
    assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / verify)
    assert verify <= meta["completion_tokens"] <= 1 + verify + correct


def test_completions_stream_folds_to_the_recorded_usage():
    """/v1/completions without token ids or running usage (this request asked for neither): deltas of text, the
    final usage chunk's counts; rig counts one token per chunk with text and says so (counted_by_text), since under
    speculation a chunk carries several (rig's own bodies ask for token ids: the next test)."""
    name = "completions_stream"
    chunks = sse_objects(recorded(name).body)
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert chunks[-1]["choices"] == [] and all(c["usage"] is None for c in chunks[:-1])
    usage = chunks[-1]["usage"]
    rec, state = fold_recorded(OpenAICompletions(), name)
    assert rec["status"] == "ok" and state.text == "".join(c["text"] for c in choices)
    assert (rec["completion_tokens"], rec["prompt_tokens"]) == (usage["completion_tokens"], usage["prompt_tokens"])
    assert rec["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert [rec["finish_reason"]] == [c["finish_reason"] for c in choices if c["finish_reason"] is not None]
    assert rec["chunk_tokens"] == [1] * sum(bool(c["text"]) for c in choices) and state.counted_by_text
    assert not {k for k in rec if k.startswith("spec_")}  # not asked for (return_spec_tokens_details)


def test_completions_stream_with_token_ids_folds_to_the_recorded_usage():
    """The body rig's SGLang dialect sends: return_token_ids and continuous usage stats. Each chunk's token ids are
    its tokens (several per chunk under speculation), the running usage agrees with them, the first chunk carries
    the prompt's ids."""
    name = "completions_stream_token_ids"
    chunks = sse_objects(recorded(name).body)
    choice_chunks = [c for c in chunks if c["choices"]]
    ids = [c["choices"][0]["token_ids"] for c in choice_chunks]
    usage = chunks[-1]["usage"]
    running = [c["usage"]["completion_tokens"] for c in choice_chunks]
    assert running == [sum(map(len, ids[: i + 1])) for i in range(len(ids))]
    assert len(choice_chunks[0]["choices"][0]["prompt_token_ids"]) == usage["prompt_tokens"]
    rec, state = fold_recorded(OpenAICompletions(), name)
    assert rec["status"] == "ok" and not state.counted_by_text
    assert rec["chunk_tokens"] == [len(x) for x in ids if x]
    assert sum(rec["chunk_tokens"]) == rec["completion_tokens"] == usage["completion_tokens"] == running[-1]
    assert state.text == "".join(c["choices"][0]["text"] for c in choice_chunks)
    # the running usage has no prompt_tokens_details; the final one has the cached count
    assert all(c["usage"]["prompt_tokens_details"] is None for c in choice_chunks)
    assert rec["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert rec["finish_reason"] == choice_chunks[-1]["choices"][0]["finish_reason"]


def test_chat_stream_folds_to_the_recorded_usage():
    """/v1/chat/completions: a role chunk, content deltas (reasoning_content null throughout), a finish chunk with an
    empty delta, the usage chunk."""
    name = "chat_stream"
    chunks = sse_objects(recorded(name).body)
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert choices[0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    assert all(c["delta"]["reasoning_content"] is None for c in choices)
    content = [c["delta"].get("content") or "" for c in choices]
    usage = chunks[-1]["usage"]
    rec, state = fold_recorded(OpenAIChat(), name)
    assert rec["status"] == "ok" and state.text == state.reply == "".join(content) and not state.reasoning
    assert (rec["completion_tokens"], rec["prompt_tokens"]) == (usage["completion_tokens"], usage["prompt_tokens"])
    assert rec["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert rec["finish_reason"] == choices[-1]["finish_reason"] and choices[-1]["delta"] == {"reasoning_content": None}
    assert rec["chunk_tokens"] == [1] * sum(map(bool, content)) and state.counted_by_text


# ---------------------------------------------------------------- rig's readers of the server's own answers


def _metric_values(text: str, name: str) -> list[tuple[str, float]]:
    """(labels text, value) of every sample called ``name``, read with a regex (not rig's parser)."""
    return [(m[1], float(m[2])) for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}}) (\S+)$", text, re.M)]


def _metric_sum(text: str, name: str) -> float:
    return sum(v for _, v in _metric_values(text, name))


METRICS_IDLE = recorded("metrics_idle").body.decode()
METRICS_AFTER = recorded("metrics_after_load").body.decode()


def _facts() -> dict[str, Any]:
    return dict(SGLangAdapter().parse_startup_log((REC / "startup_lines.txt").read_text()))


def test_startup_facts_from_the_recorded_log():
    """The capacity line rig parses, from the recorder's startup lines and the whole log alike; each fact as the
    server reported it elsewhere (/server_info, /v1/models, /metrics, its speculative reset line)."""
    facts = _facts()
    assert facts == dict(SGLangAdapter().parse_startup_log(LOG))
    assert facts["max_total_num_tokens"] == INFO["max_total_num_tokens"]
    assert facts["max_total_num_tokens"] == _metric_sum(METRICS_IDLE, "sglang:max_total_num_tokens")
    assert facts["chunked_prefill_size"] == INFO["chunked_prefill_size"]
    assert facts["max_prefill_tokens"] == INFO["max_prefill_tokens"]
    reset = re.search(r"Max running requests is reset to (\d+) for speculative decoding", LOG)
    assert reset is not None
    assert (
        facts["max_running_requests"]
        == int(reset[1])
        == INFO["internal_states"][0]["effective_max_running_requests_per_dp"]
    )
    assert facts["context_len"] == body_json("v1_models_idle")["data"][0]["max_model_len"]
    assert facts["context_len"] == _metric_sum(METRICS_IDLE, "sglang:context_len")
    assert facts["available_mem_gb"] == round(_metric_sum(METRICS_IDLE, "sglang:startup_available_gpu_memory_gb"), 2)


def test_effective_configuration_from_recorded_server_info():
    """/server_info read as rig reads it (465 keys of 0.5.17's ServerArgs plus internal_states) gives command.txt's
    launch; rig's own launch of that configuration sends the same speculative flags and reports no change."""
    facts = _facts()
    assert len(INFO) == 465 and len(INFO["internal_states"]) == 1
    eff = _sglang_effective(INFO, facts)
    assert eff == {
        "steps": STEPS,
        "spec_algorithm": flag("--speculative-algorithm"),
        "eagle_topk": TOPK,
        "num_draft_tokens": DRAFT_TOKENS,
        "max_running_requests": facts["max_running_requests"],
        "deterministic_inference": "--enable-deterministic-inference" in ARGV,
        "radix_cache": "--disable-radix-cache" not in ARGV,
        "attention_backend": flag("--attention-backend"),
        "sampling_backend": flag("--sampling-backend"),
        "custom_all_reduce": "--disable-custom-all-reduce" not in ARGV,
    }
    cfg = ServerConfig(
        engine="sglang",
        model=MODEL,
        tp=1,
        steps=STEPS,
        spec_algorithm=flag("--speculative-algorithm"),
        eagle_topk=TOPK,
        num_draft_tokens=DRAFT_TOKENS,
        draft_model_path=flag("--speculative-draft-model-path"),
    )
    spec_args = SGLangAdapter().speculative_args(cfg)
    i = ARGV.index(spec_args[0])
    assert ARGV[i : i + len(spec_args)] == spec_args
    got = effective_config(cfg, INFO, facts)
    assert got.changed == [] and got.seeds_honoured is False
    # the deprecated alias, and the provenance's own read, answered the same bytes
    assert recorded("get_server_info_idle").body == recorded("server_info_idle").body
    assert recorded("server_info_for_provenance").body == recorded("server_info_idle").body


def test_model_identity_from_recorded_routes():
    """/v1/models, /model_info and /get_model_info name the launched model; rig's dialect probe knows SGLang by
    /model_info (or its deprecated alias)."""
    assert INFO["model_path"] == INFO["served_model_name"] == MODEL and "--served-model-name" not in ARGV
    assert INFO["speculative_draft_model_path"] == flag("--speculative-draft-model-path")
    models = body_json("v1_models_idle")
    assert [(m["id"], m["root"], m["owned_by"]) for m in models["data"]] == [(MODEL, MODEL, "sglang")]
    assert recorded("model_info_idle").body == recorded("get_model_info_idle").body
    info = body_json("model_info_idle")
    assert info["model_path"] == info["tokenizer_path"] == MODEL and info["is_generation"] is True
    assert identify({"/model_info": info}) == ("sglang", "probe:/model_info")
    assert identify({"/get_model_info": info}) == ("sglang", "probe:/get_model_info")
    # the server's log says the same architecture
    assert f"type={info['architectures'][0]}" in LOG


def test_recorded_metrics_read_as_rig_reads_them():
    """Both scrapes through rig's parser: the counters rig sums (over is_streaming, which 0.5.17 splits them by) equal
    the samples' own sum, their change between the scrapes is what the recorded answers say was generated, and
    the window acceptance and live gauges follow; every sglang: name rig reads is there."""
    before, after = (summed_values(parse_metrics(t)) for t in (METRICS_IDLE, METRICS_AFTER))
    counters = ("sglang:generation_tokens_total", "sglang:prompt_tokens_total", "sglang:num_requests_total")
    for text, totals in ((METRICS_IDLE, before), (METRICS_AFTER, after)):
        for name in (*counters, "sglang:spec_verify_calls_total"):
            assert totals[name] == _metric_sum(text, name), name
    streaming = {
        re.search(r'is_streaming="(\w+)"', labels)[1] for labels, _ in _metric_values(METRICS_AFTER, counters[0])
    }
    assert streaming == {"true", "false"}  # streamed and whole answers between the scrapes: both label sets summed

    def usage(name: str) -> dict[str, int]:
        ans = recorded(name)
        if not request(name)["body"]["stream"]:
            obj = json.loads(ans.body)
            return obj["usage"] if "usage" in obj else obj["meta_info"]
        last = sse_objects(ans.body)[-1]
        return last["usage"] if "usage" in last else last["meta_info"]

    used = [usage(n) for n in GENERATIONS]
    gen = after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"]
    assert gen == sum(u["completion_tokens"] for u in used)
    assert after["sglang:prompt_tokens_total"] - before["sglang:prompt_tokens_total"] == sum(
        u["prompt_tokens"] for u in used
    )
    assert after["sglang:num_requests_total"] - before["sglang:num_requests_total"] == len(GENERATIONS)
    verify = after["sglang:spec_verify_calls_total"] - before["sglang:spec_verify_calls_total"]
    assert verify >= sum(u.get("spec_verify_ct", 0) for u in used)  # the OpenAI routes' own were not asked for
    acc = SGLangAdapter().window_acceptance(before, after)
    assert acc is not None and (acc.generation_tokens, acc.verify_calls) == (gen, verify)
    assert acc.accept_length == gen / verify == acceptance_from_counters("sglang", before, after)
    samples = parse_metrics(METRICS_AFTER)
    assert {n for n in ALL_NAMES if n.startswith("sglang:")} <= {s[0] for s in samples}
    live = LastGauges()
    live.seen(samples)
    g = live.answer(None)
    assert g.spec_steps == STEPS == _metric_sum(METRICS_AFTER, "sglang:spec_num_steps")
    assert _metric_sum(METRICS_AFTER, "sglang:spec_num_draft_tokens") == DRAFT_TOKENS
    assert (g.running, g.queued, g.gen_throughput) == tuple(
        _metric_sum(METRICS_AFTER, n)
        for n in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput")
    )


# ---------------------------------------------------------------- the simulator, asked the same


SIM_MODEL = "Qwen/Qwen3.5-122B-A10B"
# command.txt's flags for the sim: NEXTN for STANDALONE (the sim models EAGLE-family chains and refuses STANDALONE),
# no draft model path, and its own memory split for its own model (--mem-fraction-static 0.2 would not hold its
# weights)
SIM_FLAGS = [
    a.replace("STANDALONE", "NEXTN")
    for i, a in enumerate(ARGV)
    if i > ARGV.index("--port") + 1
    and a not in ("--mem-fraction-static", "--speculative-draft-model-path")
    and ARGV[i - 1] not in ("--mem-fraction-static", "--speculative-draft-model-path")
]


def _adapted(body: Any) -> Any:
    return {**body, "model": SIM_MODEL} if isinstance(body, dict) and "model" in body else body


def _send(port: int, method: str, path: str, headers: dict[str, str], body: Any) -> Answer:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        resp = conn.getresponse()
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    """The sim, launched with the recording's flags, asked each recorded request in the recording's order (the
    model renamed), then the request whose stream broke 0.5.17, then the refusals; its answers by exchange name, its
    log."""
    proc, url, log = start_sim(tmp_path_factory.mktemp("rec17"), "rec17", SIM_MODEL, SIM_FLAGS)
    port = int(url.rsplit(":", 1)[1])
    try:
        answers = {}
        for name in ORDER:
            req = request(name)
            answers[name] = _send(port, req["method"], req["path"], req["headers"], _adapted(req["body"]))
        broken = _recorder_module().native("def fibonacci(n):\n    ", 8, True, temperature=0.0, not_a_field=1)
        answers[BROKEN] = _send(port, "POST", "/generate", {"Content-Type": "application/json"}, broken)
        for name in REFUSALS:
            req = request(name)
            body = req["body"]
            if isinstance(body, str):  # sent as text (the wrong content type): the same bytes, the model renamed
                body = json.dumps(_adapted(json.loads(body)))
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                conn.request(req["method"], req["path"], body=body, headers=req["headers"])
                resp = conn.getresponse()
                answers[name] = Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
                conn.close()
            else:
                answers[name] = _send(port, req["method"], req["path"], req["headers"], _adapted(body))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return answers, log.read_text()


def _type(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def shape(objs: Iterable[Any]) -> dict[str, set[str]]:
    """Every key path of the objects (``a.b``; ``a[]`` for a list's items, ``a[].b`` inside them) and the JSON types
    seen there."""
    out: dict[str, set[str]] = {}

    def walk(o: dict[str, Any], pre: str) -> None:
        for k, v in o.items():
            p = pre + k
            out.setdefault(p, set()).add(_type(v))
            if isinstance(v, dict):
                walk(v, p + ".")
            elif isinstance(v, list):
                for x in v:
                    out.setdefault(p + "[]", set()).add(_type(x))
                    if isinstance(x, dict):
                        walk(x, p + "[].")

    for o in objs:
        walk(o, "")
    return out


def _parent(path: str) -> str | None:
    if path.endswith("[]"):
        return path[:-2]
    cut = path.rfind(".")
    return path[:cut] if cut >= 0 else None


def shape_differences(group: str, real: Iterable[Any], sim: Iterable[Any]) -> dict[tuple[str, str, str], str]:
    """(group, path, 'real only' | 'sim only' | 'types') -> what differs. A path is compared where its parent is a
    container on both sides; a null on one side matches any type on the other (a field left empty)."""
    a, b = shape(real), shape(sim)
    out = {}
    for path in sorted(a.keys() | b.keys()):
        parent = _parent(path)
        if parent is not None and not ({"dict", "list"} & a.get(parent, set()) & b.get(parent, set())):
            continue
        if path not in b:
            out[(group, path, "real only")] = f"real {sorted(a[path])}"
        elif path not in a:
            out[(group, path, "sim only")] = f"sim {sorted(b[path])}"
        elif (x := a[path] - {"null"}) and (y := b[path] - {"null"}) and x != y:
            out[(group, path, "types")] = f"real {sorted(a[path])}, sim {sorted(b[path])}"
    return out


def _native_parts(chunks: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    finished = [c for c in chunks if c["meta_info"]["finish_reason"] is not None]
    assert finished == chunks[-1:]
    return {"first": chunks[:1], "middle": chunks[1:-1], "finished": finished}


def _openai_parts(chunks: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    usage = [c for c in chunks if c["choices"] == []]
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is not None]
    rest = [c for c in chunks if c not in usage and c not in finish]
    assert usage == chunks[-1:] and finish == chunks[-2:-1]
    return {"first": rest[:1], "middle": rest[1:], "finish": finish, "usage": usage}


STREAMS = {  # group -> the exchanges it merges, and how their chunks are told apart
    "/generate stream": (("generate_stream_greedy", "generate_stream_sampled"), _native_parts),
    "/v1/completions stream": (("completions_stream",), _openai_parts),
    "/v1/completions stream with token ids": (("completions_stream_token_ids",), _openai_parts),
    "/v1/chat/completions stream": (("chat_stream",), _openai_parts),
}
WHOLE = {
    "/generate": ("generate_nostream",),
    "/v1/completions": ("completions_nostream",),
    "/v1/models": ("v1_models_idle",),
    "/model_info": ("model_info_idle", "get_model_info_idle"),
}

_LEGACY = (
    "0.5.17 sends its 0.5.15 name beside the new one; 0.5.23 dropped it and the sim imitates 0.5.23 (rig reads either)"
)
_FIRST_TOKEN = (
    "0.5.23 sends first_token_latency (observability/req_time_stats.py); 0.5.17 sends no first-token time "
    "(rig then records none, test_sglang_recorded.py)"
)
_COMPLETION_DETAILS = (
    "0.5.23's UsageInfo field (null unless there are reasoning tokens); 0.5.17's UsageInfo has none; rig reads neither"
)
# Every difference left between the sim's answers and 0.5.17's recorded ones, with its reason.
KNOWN_DIFFERENCES = {
    ("/generate stream finished", "meta_info.spec_accepted_drafts", "real only"): _LEGACY,
    ("/generate stream finished", "meta_info.spec_proposed_drafts", "real only"): _LEGACY,
    ("/generate stream finished", "meta_info.spec_accept_histogram", "real only"): _LEGACY,
    ("/generate stream finished", "meta_info.first_token_latency", "sim only"): _FIRST_TOKEN,
    ("/generate stream finished", "meta_info.first_token_ts", "sim only"): (
        "a sim addition (rig/sim/README.md): neither release sends it; rig reads it where present"
    ),
    ("/generate", "meta_info.spec_accepted_drafts", "real only"): _LEGACY,
    ("/generate", "meta_info.spec_proposed_drafts", "real only"): _LEGACY,
    ("/generate", "meta_info.spec_accept_histogram", "real only"): _LEGACY,
    ("/generate", "meta_info.first_token_latency", "sim only"): _FIRST_TOKEN,
    ("/generate", "meta_info.first_token_ts", "sim only"): "a sim addition (rig/sim/README.md)",
    ("/v1/completions", "usage.completion_tokens_details", "sim only"): _COMPLETION_DETAILS,
    ("/v1/completions stream with token ids first", "usage.completion_tokens_details", "sim only"): (
        _COMPLETION_DETAILS
    ),
    ("/v1/completions stream with token ids middle", "usage.completion_tokens_details", "sim only"): (
        _COMPLETION_DETAILS
    ),
    ("/v1/completions stream with token ids finish", "usage.completion_tokens_details", "sim only"): (
        _COMPLETION_DETAILS
    ),
    ("/model_info", "embedding", "real only"): (
        "0.5.17 describes the model's embedding plan (this Llama's); 0.5.23 only for a model config with an "
        "embedding_model_spec; rig reads model_path and is_generation only"
    ),
    ("/model_info", "served_model_name", "sim only"): "0.5.23 added it to /model_info (http_server.py model_info)",
}


def _json_groups(answers: dict[str, Answer]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for group, (names, parts) in STREAMS.items():
        for name in names:
            for part, chunks in parts(sse_objects(answers[name].body)).items():
                out.setdefault(f"{group} {part}", []).extend(chunks)
    for group, names in WHOLE.items():
        out[group] = [json.loads(answers[n].body) for n in names]
    return out


@pytest.mark.server
def test_sim_answers_have_the_recorded_json_shapes(sim):
    """/generate (stream: first, middle and finished chunks; whole), /v1/completions (stream with and without token
    ids: first, middle, finish and usage chunks; whole), /v1/chat/completions stream, /v1/models, /model_info: the
    same key paths and JSON types, field by field, less the differences listed."""
    answers, _ = sim
    real_answers = {n: recorded(n) for n in ORDER}
    assert all(answers[n].status == real_answers[n].status == 200 for n in ORDER)
    real, got = _json_groups(real_answers), _json_groups(answers)
    assert all(real[g] and got[g] for g in real), "a group with no chunks compares nothing"
    found: dict[tuple[str, str, str], str] = {}
    for group in real:
        found.update(shape_differences(group, real[group], got[group]))
    new = {k: v for k, v in found.items() if k not in KNOWN_DIFFERENCES}
    gone = sorted(k for k in KNOWN_DIFFERENCES if k not in found)
    assert not new, f"differences from SGLang 0.5.17 not listed: {new}"
    assert not gone, f"listed differences that are gone (drop them from KNOWN_DIFFERENCES): {gone}"


@pytest.mark.server
def test_sim_answers_carry_the_values_rig_reads(sim):
    """Beyond shapes: the response ids are meta_info's (no cmpl- prefix), every streamed /generate chunk has the
    scheduler's time stats with --enable-metrics, the first says when it was sent, the finished one repeats it."""
    answers, _ = sim
    for ans in (recorded("generate_stream_greedy"), answers["generate_stream_greedy"]):
        chunks = sse_objects(ans.body)
        ids = {c["meta_info"]["id"] for c in chunks}
        assert len(ids) == 1 and re.fullmatch(r"[0-9a-f]+", ids.pop())
        assert all({"forward_entry_time", "prefill_finished_time", "queue_time"} <= set(c["meta_info"]) for c in chunks)
        sent = [c["meta_info"].get("response_sent_to_client_ts") for c in chunks]
        assert sent[0] is not None and sent[-1] == sent[0] and set(sent[1:-1]) == {None}
    for name in ("completions_stream", "completions_stream_token_ids", "chat_stream", "completions_nostream"):
        for ans in (recorded(name), answers[name]):
            objs = (
                sse_objects(ans.body)
                if ans.headers["content-type"].startswith("text/event-stream")
                else [json.loads(ans.body)]
            )
            ids = {o["id"] for o in objs}
            assert len(ids) == 1 and re.fullmatch(r"[0-9a-f]+", ids.pop()), name
    # rig's folds give the sim's answers the same kind of record as the real ones
    for name, api in (
        ("generate_stream_greedy", SGLangNative()),
        ("completions_stream_token_ids", OpenAICompletions()),
        ("chat_stream", OpenAIChat()),
    ):
        out = Outcome(send_mono=0.0, end_mono=0.0)
        folder = _Folder(api, out)
        folder.feed(answers[name].body, 0.001)
        rec = request_fields(turn_for(name), _no_usage(out, api))
        assert rec["status"] == "ok" and rec["completion_tokens"] == turn_for(name).max_tokens, name
        assert rec["finish_reason"] == "length"
        if isinstance(api, SGLangNative):
            assert rec["spec_verify_ct"] > 0 and rec["spec_accept_length"] >= 1


# internal_states[0] keys of 0.5.17 the sim lacks: those arguments less two top-level-only ones, and what 0.5.17's
# scheduler copy of ServerArgs carried besides (private attributes, two fields 0.5.23 turned into functions)
REAL_ONLY_STATE_KEYS = (REAL_ONLY_INFO_KEYS - {"custom_sigquit_handler", "kv_events"}) | {
    "_cuda_graph_config_locked",
    "_declarations_materialized",
    "_mx_config_cache",
    "_quantization_explicitly_unset",
    "_resolved_overrides",
    "grpc_worker_threads",
    "max_speculative_num_draft_tokens",
}
# /server_info keys of the sim that are no 0.5.23 argument (its other extra keys are 0.5.23's arguments 0.5.17 lacks)
SIM_ONLY_INFO_KEYS = {
    "sim": "the sim's own block (profile, capacity)",
    "launch_command": "0.5.23's build_server_info adds it (srt/utils/common.py)",
    "frontend": "0.5.23's build_server_info adds it",
}
SIM_ONLY_STATE_KEYS = {"world_size": "0.5.23's internal state adds it (scheduler_components/internal_state.py)"}
MEMORY_USAGE_DIFFERENCES = {
    ("memory_usage", "graph", "types"): "the sim reserves one figure for graphs; SGLang lists each graph's GB",
    ("memory_usage", "mamba_state", "sim only"): "the sim's hybrid model's state pool; this Llama has none",
}
# The fields of /server_info rig reads, and those whose values come from the launch flags the sim was given too.
READ_BY_RIG = (
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "enable_deterministic_inference",
    "disable_radix_cache",
    "disable_custom_all_reduce",
    "attention_backend",
    "sampling_backend",
    "max_running_requests",
    "max_total_num_tokens",
    "version",
)
SAME_VALUE = set(READ_BY_RIG) - {"speculative_algorithm", "max_total_num_tokens", "version"}


@pytest.mark.server
def test_sim_server_info_keys_against_recorded(sim):
    answers, sim_log = sim
    real, got = INFO, json.loads(answers["server_info_idle"].body)
    h200 = json.loads((DATA / "h200-sglang-0.5.17-run" / "manifest.json").read_text())["server_configs"]
    for cfg in h200.values():  # the same release's keys on the H200 run's servers: the lists below hold for both
        assert set(cfg["server_info"]) == set(real)
        assert set(cfg["server_info"]["internal_states"][0]) == set(real["internal_states"][0])
    assert set(real) - set(got) == REAL_ONLY_INFO_KEYS
    args = {row["dest"] for row in load_table()["arguments"]}
    assert set(got) - set(real) - args == set(SIM_ONLY_INFO_KEYS)
    rs, ss = real["internal_states"][0], got["internal_states"][0]
    assert set(rs) - set(ss) == REAL_ONLY_STATE_KEYS
    assert set(ss) - set(rs) - args == set(SIM_ONLY_STATE_KEYS)
    assert shape_differences("memory_usage", [rs["memory_usage"]], [ss["memory_usage"]]).keys() == set(
        MEMORY_USAGE_DIFFERENCES
    )
    for key in READ_BY_RIG:
        assert _type(real[key]) == _type(got[key]), key
        if key in SAME_VALUE:
            assert real[key] == got[key], key
    for key in ("effective_max_running_requests_per_dp", "speculative_num_steps", "speculative_num_draft_tokens"):
        assert _type(rs[key]) == _type(ss[key]) == "int", key
    # what rig makes of each: the same launch, less the algorithm (NEXTN resolves to EAGLE) and the running limit
    # (the sim's hybrid model's state pool holds fewer requests than 48 on its modelled GPUs)
    sim_facts = dict(SGLangAdapter().parse_startup_log(sim_log))
    a, b = _sglang_effective(real, _facts()), _sglang_effective(got, sim_facts)
    assert {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} <= {"spec_algorithm", "max_running_requests"}
    assert (a["spec_algorithm"], b["spec_algorithm"]) == ("STANDALONE", "EAGLE")
    assert b["max_running_requests"] == ss["effective_max_running_requests_per_dp"] <= a["max_running_requests"]


def _families(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def _label_keys(text: str) -> dict[str, set[tuple[str, ...]]]:
    out: dict[str, set[tuple[str, ...]]] = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            out.setdefault(s.name, set()).add(tuple(sorted(s.labels)))
    return out


# /metrics families of 0.5.17 the sim does not emit: none is one rig reads (server_series.ALL_NAMES, asserted).
_NOT_MODELLED = "SGLang's; the sim does not model it, and rig reads none of these"
REAL_ONLY_METRICS = {
    f"sglang:{n}": _NOT_MODELLED
    for n in (
        "cuda_graph_passes",
        "decode_sum_seq_lens",
        "full_token_usage",
        "fwd_occupancy",
        "generation_tokens_histogram",
        "graph_memory_usage_gb",
        "http_requests",
        "http_requests_active",
        "http_responses",
        "is_cuda_graph",
        "kv_available_tokens",
        "kv_cache_memory_usage_gb",
        "kv_evictable_tokens",
        "kv_used_tokens",
        "mamba_available_tokens",
        "mamba_evictable_tokens",
        "mamba_usage",
        "mamba_used_tokens",
        "new_token_ratio",
        "num_decode_prealloc_queue_reqs",
        "num_decode_transfer_queue_reqs",
        "num_grammar_queue_reqs",
        "num_pages",
        "num_paused_reqs",
        "num_prefill_bootstrap_queue_reqs",
        "num_prefill_inflight_queue_reqs",
        "num_retracted_reqs",
        "num_unique_running_routing_keys",
        "page_size",
        "pending_prealloc_token_usage",
        "per_stage_req_latency_seconds",
        "process_cpu_seconds",
        "prompt_tokens_histogram",
        "queue_time_seconds",
        "realtime_tokens",
        "routing_key_all_req_count",
        "routing_key_running_req_count",
        "routing_keys_active",
        "spec_block_accept_length",
        "spec_cap_length",
        "startup_available_gpu_memory_gb",
        "startup_cuda_graph_time_seconds",
        "startup_time_seconds",
        "swa_available_tokens",
        "swa_evictable_tokens",
        "swa_token_usage",
        "swa_used_tokens",
        "uncached_prompt_tokens_histogram",
        "utilization",
        "weight_memory_usage_gb",
    )
}
SIM_ONLY_METRICS = {
    "sglang:request_time_per_output_token_seconds": "0.5.23's TPOT histogram (the sim imitates 0.5.23)",
    "sglang:num_aborted_requests": (
        "a labelled counter SGLang shows only once a request aborted: none did in this recording (the H200 run's "
        "scrapes have it)"
    ),
}  # and the sim's own sglang:sim_* diagnostics
LABEL_DIFFERENCES = {
    "sglang:generation_tokens_total": (
        "0.5.17 and 0.5.23 split it by is_streaming (metrics_collector.py); the sim's counters carry no is_streaming "
        "(its engine does not know how a request is answered); rig sums every label set (recorded scrape above)"
    ),
}


@pytest.mark.server
def test_sim_metrics_against_recorded(sim):
    """Family names and types, and the label keys of the samples rig reads, against both recorded scrapes."""
    answers, _ = sim
    real_text, sim_text = METRICS_AFTER, answers["metrics_after_load"].body.decode()
    real = _families(METRICS_IDLE) | _families(real_text)
    got = _families(answers["metrics_idle"].body.decode()) | _families(sim_text)
    assert set(real) - set(got) == set(REAL_ONLY_METRICS)
    assert {n for n in set(got) - set(real) if not n.startswith("sglang:sim_")} == set(SIM_ONLY_METRICS)
    h200 = ds.dataset(DATA / "h200-sglang-0.5.17-run" / "server_metrics", format="parquet").to_table(columns=["name"])
    assert "sglang:num_aborted_requests_total" in set(h200.column("name").to_pylist())
    assert {n: (real[n], got[n]) for n in set(real) & set(got) if real[n] != got[n]} == {}
    rl, sl = _label_keys(real_text), _label_keys(sim_text)
    read = [n for n in ALL_NAMES if n.startswith("sglang:")]
    assert {n for n in read if rl[n] != sl[n]} == set(LABEL_DIFFERENCES)
    assert (
        answers["metrics_after_load"].headers["content-type"] == recorded("metrics_after_load").headers["content-type"]
    )


@pytest.mark.server
def test_sim_health_and_flush_cache_against_recorded(sim):
    answers, _ = sim
    for name in ("health_idle", "health_generate_idle"):
        assert (answers[name].status, answers[name].body) == (recorded(name).status, recorded(name).body) == (200, b"")
    real, got = recorded("flush_cache_idle"), answers["flush_cache_idle"]
    assert (got.status, got.body) == (real.status, real.body)
    # 0.5.17 answers with a bare Response (no content type); aiohttp's text response says text/plain. rig keeps the
    # status and the body's start (rig.server.actor.flush_cache), whatever the type.
    assert "content-type" not in real.headers and got.headers["content-type"].startswith("text/plain")


@pytest.mark.server
def test_unknown_sampling_field_sim_refuses_where_0517_broke_the_stream(sim):
    """0.5.17 built SamplingParams(**sampling_params) inside the stream and raised (server.log); 0.5.23 checks the
    body first and answers 400 with the check's text, which the sim imitates."""
    answers, _ = sim
    ans = answers[BROKEN]
    assert ans.status == 400 and "not_a_field" in json.loads(ans.body)["error"]
    assert "TypeError: Unexpected keyword argument 'not_a_field'" in LOG


# The refusals whose text the sim does not copy, each with its reason
REFUSAL_TEXT_DIFFERS = {
    # pydantic's own error list with a source location (http_server.py line 1694 of the install) in 0.5.17; the sim
    # says what is wrong in a sentence (same status, same ErrorResponse keys and type)
    "err_completions_bad_type": "pydantic's validation text and the install's file path",
}


def _numbers_masked(v: Any) -> Any:
    """Numbers inside texts as N: the model's context length and the prompt's token count are the model's (the sim
    serves another), the template is the server's."""
    if isinstance(v, str):
        return re.sub(r"\d+", "N", v)
    if isinstance(v, dict):
        return {k: _numbers_masked(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_numbers_masked(x) for x in v]
    return v


def _refusal_body(ans: Answer) -> Any:
    """What a refusal says: its JSON, its stream's events, or for a request the server took, how it ended."""
    if ans.headers.get("content-type", "").startswith("text/event-stream"):
        chunks = sse_objects(ans.body)
        return _numbers_masked(chunks) if "error" in chunks[0] else ("served", _ending(chunks)[0])
    return _numbers_masked(json.loads(ans.body))


@pytest.mark.server
def test_sim_refusals_as_recorded(sim):
    """Each refusal 0.5.17 was sent one after another (no body text, a prompt too long streamed and not, a bad type,
    an unknown field, the wrong content type, no messages, an unknown route): the sim answers the same status and the
    same JSON, or the same events inside a 200 stream, less the texts listed with their reasons."""
    answers, _ = sim
    assert len(REFUSALS) == 8
    for name in REFUSALS:
        real, got = recorded(name), answers[name]
        assert got.status == real.status, name
        want, have = _refusal_body(real), _refusal_body(got)
        if name in REFUSAL_TEXT_DIFFERS:
            assert set(have) == set(want) and {k: v for k, v in have.items() if k != "message"} == {
                k: v for k, v in want.items() if k != "message"
            }, name
            assert have["message"] != want["message"], f"{name}: the same text now: drop it from REFUSAL_TEXT_DIFFERS"
        else:
            assert have == want, name


# ---------------------------------------------------------------- the broken stream, and the recorder


def _recorder_module():
    spec = importlib.util.spec_from_file_location("record_sglang", REPO / "scripts" / "record_sglang.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class RawServer:
    """A loopback HTTP/1.1 server that reads each request whole and answers it with the bytes given for its path,
    then closes the connection: a response can end anywhere, a chunked body without its last chunk."""

    def __init__(self, answers: dict[str, bytes]) -> None:
        self.answers = answers
        self.requests: list[tuple[bytes, bytes]] = []  # (head, body) of each request
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> RawServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                buf = b""
                while b"\r\n\r\n" not in buf:
                    buf += conn.recv(65536)
                head, _, body = buf.partition(b"\r\n\r\n")
                size = re.search(rb"(?im)^content-length: *(\d+)", head)
                while size and len(body) < int(size[1]):
                    body += conn.recv(65536)
                self.requests.append((head, body))
                conn.sendall(self.answers[head.split(b" ")[1].decode()])
                conn.shutdown(socket.SHUT_WR)


def _wire_head(name: str) -> bytes:
    """A recorded response's head as it went over the wire (CRLF lines)."""
    raw = (REC / f"{name}.response").read_bytes().partition(b"\n\n")[0]
    return raw.replace(b"\n", b"\r\n") + b"\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


STREAM_HEAD = _wire_head("generate_stream_greedy")  # 200, text/event-stream, Transfer-Encoding: chunked
# what the broken exchange sent: the head, then (SGLang 0.5.17's TypeError before the first event) no chunk at all
BROKEN_WIRE = STREAM_HEAD
FIRST_EVENT = recorded("generate_stream_greedy").body.split(b"\n\n")[0] + b"\n\n"


def test_recorder_saves_exchanges_and_a_broken_stream(tmp_path):
    rs = _recorder_module()
    ok = b'{"status": "ok"}'
    done = b"data: [DONE]\n\n"
    answers = {
        "/ok": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(ok), ok),
        "/stream": STREAM_HEAD + _chunk(FIRST_EVENT) + _chunk(done) + b"0\r\n\r\n",
        "/broken_after_event": STREAM_HEAD + _chunk(FIRST_EVENT),  # no last chunk: closed mid-body
        "/broken_mid_chunk": STREAM_HEAD + b"%x\r\n" % (len(FIRST_EVENT) + 100) + FIRST_EVENT,  # a chunk cut short
        "/broken_at_once": BROKEN_WIRE,
    }
    out = tmp_path / "rec"
    with RawServer(answers) as srv:
        r = rs.Recorder(srv.url, out)
        assert r.exchange("ok", "POST", "/ok", {"x": 1}) == (200, ok)
        assert r.exchange("stream", "POST", "/stream", {"stream": True}) == (200, FIRST_EVENT + done)
        assert r.exchange("broken_after_event", "POST", "/broken_after_event", {"stream": True}) == (200, FIRST_EVENT)
        assert r.exchange("broken_mid_chunk", "POST", "/broken_mid_chunk", {"stream": True}) == (200, FIRST_EVENT)
        assert r.exchange("broken_at_once", "GET", "/broken_at_once") == (200, b"")
        r.save_index()
    assert srv.requests[0][1] == json.dumps({"x": 1}).encode()
    assert json.loads((out / "ok.request.json").read_text()) == {
        "method": "POST",
        "path": "/ok",
        "headers": {"Content-Type": "application/json"},
        "body": {"x": 1},
    }
    assert (out / "ok.response").read_bytes() == (
        b"HTTP/1.1 200 OK\nContent-Type: application/json\nContent-Length: %d\n\n%s" % (len(ok), ok)
    )
    # the saved stream reads back as the recorded data is read here: the head's lines, the body as it arrived
    saved = parse_response((out / "broken_after_event.response").read_bytes())
    assert saved.status == 200 and saved.headers == recorded("generate_stream_greedy").headers
    assert saved.body == FIRST_EVENT
    index = {e["name"]: e for e in json.loads((out / "index.json").read_text())}
    assert list(index) == [p.strip("/") for p in answers] and all(e["status"] == 200 for e in index.values())
    assert "broken" not in index["ok"] and "broken" not in index["stream"]
    assert index["stream"]["bytes"] == len(FIRST_EVENT + done)
    for name, got in (("broken_after_event", FIRST_EVENT), ("broken_mid_chunk", FIRST_EVENT), ("broken_at_once", b"")):
        assert index[name]["broken"] == f"IncompleteRead after {len(got)} bytes", name
        assert index[name]["bytes"] == len(got) and (out / f"{name}.response").read_bytes().endswith(b"\n\n" + got)


def _send_rig(url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One /generate stream through each of rig's clients (the lean one, rig's default, and aiohttp)."""
    t = Turn(request_id="broken", messages=({"role": "user", "content": "x"},), max_tokens=8)

    async def go() -> tuple[Outcome, Outcome]:
        async with http1.Pool() as pool:
            lean = await stream_request(pool, url, SGLangNative(), t, [], "m", Timeouts())
        async with aiohttp.ClientSession() as session:
            aio = await stream_request(session, url, SGLangNative(), t, [], "m", Timeouts())
        return lean, aio

    lean, aio = asyncio.run(go())
    return request_fields(t, lean), request_fields(t, aio)


@pytest.mark.parametrize("tail", [b"", _chunk(FIRST_EVENT)], ids=["no event", "after an event"])
def test_a_stream_broken_as_0517_broke_it_is_one_failed_record(tail):
    """SGLang 0.5.17's answer to an unknown sampling field: the 200 stream head, then the connection closed without
    the chunked body's end (and, had the TypeError come later, after some events). Each of rig's clients records the
    request as failed, with what it saw, and goes on (tests/unit/test_client.py covers cleanly ended bad streams)."""
    with RawServer({"/generate": BROKEN_WIRE + tail}) as srv:
        lean, aio = _send_rig(srv.url)
    first = json.loads(FIRST_EVENT.removeprefix(b"data: "))["meta_info"]["completion_tokens"]
    for rec in (lean, aio):
        assert (rec["status"], rec["ok"], rec["http_status"], rec["output_hash"]) == ("failed", False, 200, None)
        assert rec["chunk_tokens"] == ([first] if tail else [])
        assert rec["finish_reason"] is None
    assert lean["error"] == "HTTPError: server closed the connection mid-response"
    assert aio["error"].startswith("ClientPayloadError: Response payload is not completed")
