"""Agent sessions on the simulated server: each turn resends the conversation, so prompts grow and the server's
prefix cache reports the shared prefix as cached_tokens."""

import os
import subprocess
import sys

import pytest
from accounting import assert_accounting

from rig.results import read_requests

pytestmark = pytest.mark.ray


def test_agent_sessions_grow_and_hit_the_prefix_cache(tmp_path):
    args = [
        "run",
        "--workload",
        "agentic",
        "--steps",
        "2",
        "--concurrency",
        "2",
        "--requests",
        "3",
        "--workload-opt",
        "agent_turns=3",
        "--workload-opt",
        "think_time_s=0.05",
        "--workload-opt",
        "agent_output_tokens=16",
        "--workload-opt",
        "tool_output_tokens=120",
        "--warmup",
        "0",
        "-q",
        "--out",
        str(tmp_path),
        "--run-id",
        "ag",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "rig.cli", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "ag"
    t = read_requests(run).to_pandas()
    assert_accounting(run)
    assert t.ok.all() and t.session_id.nunique() == 3 and len(t) == 9
    for sid, s in t.sort_values("turn").groupby("session_id"):
        assert list(s.turn) == [0, 1, 2]
        prompts = list(s.prompt_tokens)
        assert prompts == sorted(prompts) and len(set(prompts)) == 3, (sid, prompts)
        # every later turn starts with the whole previous turn (its prompt and the reply): cached on the server
        for prev, cur in zip(s.iloc[:-1].itertuples(), s.iloc[1:].itertuples(), strict=False):
            assert cur.cached_tokens >= prev.prompt_tokens * 0.9, (sid, prev.prompt_tokens, cur.cached_tokens)
            assert cur.cached_tokens < cur.prompt_tokens
        # think time separates the turns: a turn is sent only after the previous one ended
        assert (s.send_ts.values[1:] >= s.end_ts.values[:-1] + 0.04).all()
