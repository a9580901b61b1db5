"""Folding streamed events of each API into token counts, text, spec stats and errors."""

import json
from dataclasses import replace

import pytest

from rig.loadgen.apis import OpenAIChat, OpenAICompletions, SGLangNative, StreamError, StreamState
from rig.workloads.base import Turn

TURN = Turn(
    request_id="r1",
    messages=({"role": "user", "content": "hi"},),
    max_tokens=8,
    temperature=0.7,
    top_p=0.9,
    top_k=20,
    ignore_eos=False,
    seed=5,
)


def test_native_payload_uses_sglang_sampling_names():
    body = SGLangNative().payload(TURN, [], "m")
    sp = body["sampling_params"]
    assert sp == {
        "max_new_tokens": 8,
        "temperature": 0.7,
        "top_p": 0.9,
        "ignore_eos": False,
        "top_k": 20,
        "sampling_seed": 5,
    }
    assert body["stream"] is True and body["rid"] == "r1" and "hi" in body["text"]


def test_native_cumulative_text_and_tokens_per_chunk():
    api, st = SGLangNative(), StreamState()

    def ev(text, ct, fr=None, **meta):
        return {
            "text": text,
            "meta_info": {
                "completion_tokens": ct,
                "prompt_tokens": 11,
                "cached_tokens": 3,
                "finish_reason": fr,
                **meta,
            },
        }

    assert api.fold(ev("Hello", 1), st) == 1
    assert api.fold(ev("Hello wor", 4), st) == 3  # a speculative chunk: 3 tokens at once
    final = ev(
        "Hello world!",
        6,
        {"type": "length", "length": 6},
        spec_verify_ct=3,
        spec_accept_length=2.0,
        spec_num_correct_drafts=3,
        spec_num_proposed_drafts=6,
        request_received_ts=100.0,
        first_token_latency=0.25,
        request_finished_ts=101.5,
        queue_time=0.01,
    )
    assert api.fold(final, st) == 2
    assert st.text == "Hello world!"
    assert (st.prompt_tokens, st.completion_tokens, st.cached_tokens) == (11, 6, 3)
    assert st.finish_reason == "length" and st.finished
    assert st.speculative == {
        "spec_verify_ct": 3,
        "spec_accept_length": 2.0,
        "spec_accepted_drafts": 3,
        "spec_proposed_drafts": 6,
    }
    assert st.server_ts == {
        "server_received_ts": 100.0,
        "server_first_token_ts": 100.25,
        "server_finished_ts": 101.5,
        "server_queue_s": 0.01,
    }


def test_native_legacy_draft_names():
    api, st = SGLangNative(), StreamState()
    api.fold(
        {
            "text": "x",
            "meta_info": {
                "completion_tokens": 1,
                "finish_reason": {"type": "stop"},
                "spec_verify_ct": 1,
                "spec_accept_token_num": 0,
                "spec_draft_token_num": 3,
            },
        },
        st,
    )
    assert st.speculative["spec_accepted_drafts"] == 0 and st.speculative["spec_proposed_drafts"] == 3


@pytest.mark.parametrize(
    "obj",
    [
        {"error": {"message": "boom", "code": 500}},
        {"object": "error", "message": "bad"},
        {"text": "x"},
        {"text": "x", "meta_info": {}},
        [1, 2],
    ],
)
def test_native_errors_and_malformed_events_raise(obj):
    with pytest.raises(StreamError):
        SGLangNative().fold(obj, StreamState())


def test_native_abort_is_an_error():
    with pytest.raises(StreamError, match="abort"):
        SGLangNative().fold(
            {"text": "", "meta_info": {"completion_tokens": 0, "finish_reason": {"type": "abort", "message": "oom"}}},
            StreamState(),
        )


def test_completions_stream_with_usage_chunk_and_token_ids():
    api, st = OpenAICompletions(), StreamState()
    assert api.fold({"choices": [{"index": 0, "text": "", "finish_reason": None}]}, st) == 0
    assert api.fold({"choices": [{"index": 0, "text": "ab", "token_ids": [5, 6]}]}, st) == 2
    assert api.fold({"choices": [{"index": 0, "text": "c", "finish_reason": "stop"}]}, st) == 1
    assert (
        api.fold(
            {
                "choices": [],
                "usage": {"prompt_tokens": 4, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}},
            },
            st,
        )
        == 0
    )
    assert (st.text, st.completion_tokens, st.prompt_tokens, st.cached_tokens, st.finish_reason) == (
        "abc",
        3,
        4,
        2,
        "stop",
    )
    body = api.payload(TURN, [{"role": "user", "content": "before"}], "served")
    # the running usage too: the chunk counts on a server without return_token_ids (SGLang 0.5.16)
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["max_tokens"] == 8
    assert body["model"] == "served" and "before" in body["prompt"] and body["seed"] == 5


def test_chat_deltas_and_sglext_spec_details():
    api, st = OpenAIChat(), StreamState()
    api.fold({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, st)
    api.fold({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}, st)
    api.fold({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}, st)
    api.fold({"choices": [], "sglext": {"spec_tokens_details": {"spec_verify_ct": 2, "spec_accept_length": 1.5}}}, st)
    api.fold({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}, st)
    assert st.text == "Hi" and st.finish_reason == "length" and st.completion_tokens == 3
    assert st.speculative == {"spec_verify_ct": 2, "spec_accept_length": 1.5}
    body = api.payload(TURN, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "m")
    assert [m["content"] for m in body["messages"]] == ["a", "b", "hi"]


def test_openai_malformed_events():
    for obj in ({"id": 1}, {"choices": "x"}, {"choices": [{"text": 3}]}, {"choices": [{"delta": "x"}]}):
        api = OpenAIChat() if "delta" in json.dumps(obj) else OpenAICompletions()
        with pytest.raises(StreamError):
            api.fold(obj, StreamState())


def test_vllm_per_request_spec_summary_on_the_usage_chunk():
    api, st = OpenAICompletions(), StreamState()
    api.fold({"choices": [{"index": 0, "text": "abc", "finish_reason": "length"}]}, st)
    api.fold(
        {
            "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": 12},
            "metrics": {
                "speculative_decoding": {
                    "num_spec_tokens": 2,
                    "num_spec_steps": 5,
                    "num_draft_tokens": 10,
                    "num_accepted_draft_tokens": 6,
                    "acceptance_histogram": [1, 2, 2],
                }
            },
        },
        st,
    )
    assert st.speculative == {
        "spec_verify_ct": 5,
        "spec_accepted_drafts": 6,
        "spec_proposed_drafts": 10,
        "spec_accept_length": pytest.approx(2.2),
    }
    st2 = StreamState()
    api.fold({"choices": [], "usage": {"completion_tokens": 1}, "metrics": {"speculative_decoding": {"x": 1}}}, st2)
    assert st2.speculative == {}


def test_openai_payloads_follow_sglang_0_5_23():
    """Chat must not send return_token_ids while streaming (SGLang's serving_chat.py answers 400); completions asks
    for per-chunk token ids (serving_completions.py); both ask for sglext.spec_tokens_details."""
    chat = OpenAIChat().payload(TURN, [], "m")
    comp = OpenAICompletions().payload(TURN, [], "m")
    assert chat["stream"] is True and "return_token_ids" not in chat
    assert comp["return_token_ids"] is True
    assert chat["return_spec_tokens_details"] is True and comp["return_spec_tokens_details"] is True
    assert chat["seed"] == comp["seed"] == 5
    assert chat["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_completions_chunk_tokens_come_from_token_ids_even_with_empty_text():
    """A chunk whose text is empty still carries tokens (serving_completions.py sends one chunk per output)."""
    api, st = OpenAICompletions(), StreamState()
    assert api.fold({"choices": [{"index": 0, "text": "", "token_ids": [7]}]}, st) == 1
    assert api.fold({"choices": [{"index": 0, "text": "abc", "token_ids": [1, 2, 3, 4]}]}, st) == 4


def test_chat_chunk_tokens_from_continuous_usage():
    """SGLang's chat puts the running completion count on each content chunk (continuous_usage_stats)."""
    api, st = OpenAIChat(), StreamState()

    def ev(content, ct):
        return {
            "choices": [{"index": 0, "delta": {"reasoning_content": None, "content": content}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": ct},
        }

    assert api.fold({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, st) == 0
    assert [api.fold(ev("a", 1), st), api.fold(ev("bcd", 4), st), api.fold(ev("ef", 6), st)] == [1, 3, 2]
    assert st.completion_tokens == 6


def test_chat_sends_every_sampling_parameter_the_records_state():
    """SGLang's chat route fills an omitted temperature / top_p / top_k / min_p / repetition_penalty from the model's
    generation_config.json (--sampling-defaults model, the default: openai/protocol.py
    ChatCompletionRequest.to_sampling_params): the record's top_k -1 must be what ran, so it is sent."""
    for api in (OpenAIChat(), OpenAICompletions()):  # vLLM fills omitted ones on both routes (--generation-config)
        off = api.payload(replace(TURN, top_k=-1), [], "m")
        assert (off["temperature"], off["top_p"], off["top_k"], off["min_p"], off["repetition_penalty"]) == (
            0.7,
            0.9,
            -1,
            0.0,
            1.0,
        )
        assert api.payload(TURN, [], "m")["top_k"] == 20


def test_chat_reasoning_and_content_chunks_of_one_step_share_a_count():
    """With a reasoning parser SGLang sends one step's reasoning and content as two chunks, each with the same
    running count (serving_chat.py::_generate_stream_content): the second adds no token."""
    api, st = OpenAIChat(), StreamState()

    def ev(ct, reasoning=None, content=None):
        return {
            "choices": [{"index": 0, "delta": {"reasoning_content": reasoning, "content": content}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": ct},
        }

    counts = [
        api.fold(ev(2, reasoning="think "), st),
        api.fold(ev(4, reasoning="more</think>"), st),
        api.fold(ev(4, content="Answer"), st),
        api.fold(ev(5, content=" ok"), st),
    ]
    assert counts == [2, 2, 0, 1] and sum(counts) == st.completion_tokens == 5


def test_chat_reply_resent_without_its_reasoning():
    """The next agentic turn carries the assistant's content only, as real clients send it (the reasoning text
    still counts in the record's text, hash and length)."""
    api, st = OpenAIChat(), StreamState()
    api.fold({"choices": [{"index": 0, "delta": {"reasoning_content": "Let me think.", "content": None}}]}, st)
    api.fold({"choices": [{"index": 0, "delta": {"reasoning_content": None, "content": "The answer."}}]}, st)
    assert st.text == "Let me think.The answer." and st.reply == "The answer."
    plain = StreamState()
    OpenAICompletions().fold({"choices": [{"index": 0, "text": "abc"}]}, plain)
    assert plain.reply == plain.text == "abc"
