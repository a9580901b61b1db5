"""Test tiers: the fast tier (no Ray, no server processes) and the integration tier.

`./dev pytest --fast` runs the fast tier, what a developer runs on every change (under 2 minutes on 2 cores);
`./dev pytest` (and .ci/run) runs everything. A test belongs to the integration tier when it is marked ``ray``,
``slow``, ``netns`` or ``server`` (starts an engine, simulator or other server process of its own).
"""

from __future__ import annotations

import pytest
from tserve_fixtures import tserve_executable, tserve_server  # noqa: F401

# the real-engine fixtures (session-scoped: one vLLM venv, one tiny model, one server per steps value for the run)
from vllm_fixtures import tiny_model_dir, vllm_engine_python, vllm_servers  # noqa: F401

INTEGRATION = ("ray", "slow", "netns", "server")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true", help="run only the fast tier (no Ray, no server processes)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.get_closest_marker(m) for m in INTEGRATION):
            item.add_marker(pytest.mark.integration)
    if config.getoption("--fast"):
        skip = [i for i in items if i.get_closest_marker("integration")]
        keep = [i for i in items if not i.get_closest_marker("integration")]
        if skip:
            config.hook.pytest_deselected(items=skip)
        items[:] = keep
