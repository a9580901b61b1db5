"""Property-based: random bytes and event sequences never crash the stream parser; random specs give a clean
error or a valid spec, never anything else."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rig.config import RunSpec, SpecError, build_spec
from rig.loadgen.apis import APIS, StreamError, StreamState
from rig.loadgen.sse import SSEParser

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
plausible_keys = st.sampled_from(
    [
        "text",
        "meta_info",
        "choices",
        "usage",
        "error",
        "delta",
        "finish_reason",
        "completion_tokens",
        "prompt_tokens",
        "token_ids",
        "sglext",
        "object",
    ]
)
plausible = st.recursive(
    st.none() | st.integers(-3, 50) | st.text(max_size=8) | st.just({"type": "stop"}),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(plausible_keys, inner, max_size=5),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.lists(st.integers(1, 50), max_size=10))
def test_sse_parser_never_crashes_on_random_bytes(data, cuts):
    p = SSEParser()
    pos = 0
    events = []
    for c in cuts:
        events += p.feed(data[pos : pos + c])
        pos += c
    events += p.feed(data[pos:])
    tail, truncated = p.close()
    assert all(isinstance(e, str) for e in events + tail)
    assert isinstance(truncated, bool)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(APIS)), st.lists(json_values | plausible, max_size=8))
def test_api_fold_raises_only_stream_errors(api_name, events):
    api, state = APIS[api_name], StreamState()
    for ev in events:
        try:
            n = api.fold(json.loads(json.dumps(ev)), state)
        except StreamError:
            break  # a clean, recorded per-request error
        assert isinstance(n, int) and n >= 0


spec_values = st.dictionaries(
    st.sampled_from(
        [
            "steps",
            "clients",
            "repeat",
            "run_id",
            "server",
            "load",
            "workloads",
            "cluster",
            "bogus",
            "metrics_interval_s",
            "server_grid",
        ]
    ),
    json_values,
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(spec_values)
def test_random_specs_give_a_spec_or_a_one_line_error(data):
    try:
        spec = build_spec(data, {})
    except SpecError as e:
        assert str(e) and "\n" not in str(e)
    else:
        assert isinstance(spec, RunSpec)
