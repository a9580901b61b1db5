"""Every setting is declared once, on its field, and a flag the command would not use is an error, never dropped.

The search and tune settings (rig.contracts.search) carry their flags; the commands' options are generated from them,
so help text, default and bounds are the field's. Flags that would be silently ignored, or values that would be
dropped, exit 2 with one line naming the flags. Manifests written before the sections were typed still load.
"""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from rig.cli import cli
from rig.cli_settings import field_flag
from rig.contracts import SearchSettings, SloSettings, TuneSettings, parse_manifest


def _options(command: str) -> dict[str, click.Option]:
    cmd = cli.get_command(click.Context(cli), command)
    assert cmd is not None
    return {opt: p for p in cmd.params if isinstance(p, click.Option) for opt in p.opts}


@pytest.mark.parametrize(
    ("command", "model"), [("sweep", SearchSettings), ("tune", TuneSettings), ("report", SloSettings)]
)
def test_settings_flags_come_from_their_fields(command, model):
    opts = _options(command)
    for field in model.model_fields.values():
        flag = field_flag(field)
        if flag is None:
            continue
        opt = opts[flag]
        assert opt.help is not None and opt.help.startswith(field.description or "?"), (command, flag)
        if command != "report" and not field.is_required() and field.default not in (None, ()):
            assert opt.default == field.default and opt.show_default, (command, flag)


def test_slo_flags_are_one_declaration_shared_by_every_command():
    for flag in ("--slo", "--slo-percentile"):
        helps = {_options(c)[flag].help for c in ("sweep", "tune")}
        assert len(helps) == 1, flag
        assert _options("report")[flag].help.startswith(next(iter(helps)))


# (command line, the flags the one-line error must name)
REFUSED = [
    (["run", "--rate", "2", "--concurrency", "4,8"], ["--concurrency", "--rate"]),
    (["run", "--mode", "gamma", "--rate", "2", "--concurrency", "4,8"], ["--concurrency", "--rate"]),
    (["run", "--burstiness", "2"], ["--burstiness", "--mode"]),
    (["run", "--rate", "2", "--burstiness", "2"], ["--burstiness", "--mode"]),
    (["run", "--trace-speed", "2"], ["--trace-speed", "--mode"]),
    (["run", "--grace", "3"], ["--grace", "--duration"]),
    (["run", "--url", "http://127.0.0.1:9"], ["--url", "--engine"]),
    (["run", "--unreachable-timeout", "5"], ["--unreachable-timeout", "--engine"]),
    (["run", "--api-key-env", "HOME", "--api-key-file", "/etc/hostname"], ["--api-key-env", "--api-key-file"]),
    (["sweep", "--slo", "ttft=1s"], ["--slo", "--search"]),
    (["sweep", "--slo-percentile", "90"], ["--slo-percentile", "--search"]),
    (["sweep", "--search-max", "8"], ["--search-max", "--search"]),
    (["sweep", "--search", "concurrency", "--slo", "ttft=1s", "--search-tolerance", "0.2"], ["--search-tolerance"]),
    (["sweep", "--search", "concurrency", "--slo", "ttft=1s", "--concurrency", "4,8"], ["--concurrency", "--search"]),
    (["sweep", "--search", "rate", "--slo", "ttft=1s", "--rate", "1,2"], ["--rate", "--search"]),
    (["sweep", "--search", "concurrency", "--slo", "ttft=1s", "--repeat", "2"], ["--repeat"]),
    (["sweep", "--search", "concurrency", "--slo", "ttft=1s", "--rate", "1"], ["--search", "--rate"]),
    (["sweep", "--search", "concurrency"], ["--search", "--slo"]),
    (["sweep", "--resume", "/nonexistent/run", "--slo", "ttft=1s"], ["--resume", "--slo"]),
    (["tune", "--slo", "ttft=1s", "--repeat", "2"], ["--repeat"]),
    (["tune", "--slo", "ttft=1s", "--rate", "1"], ["--rate"]),
    (["tune"], ["--slo"]),
]


@pytest.mark.parametrize(("argv", "named"), REFUSED, ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_ignored_or_conflicting_flags_exit_2_naming_them(argv, named, tmp_path):
    result = CliRunner().invoke(cli, [*argv, "--out", str(tmp_path), "--dry-run"])
    assert result.exit_code == 2, (argv, result.output)
    [line] = [ln for ln in result.output.splitlines() if "Error" in ln]
    for flag in named:
        assert flag in line, (argv, line)


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--rate", "2", "--concurrency", "4"],
        ["run", "--mode", "gamma", "--rate", "2", "--burstiness", "2"],
        ["run", "--duration", "5", "--grace", "3"],
        ["sweep", "--search", "concurrency", "--slo", "ttft=1s", "--concurrency", "4", "--slo-percentile", "90"],
        ["sweep", "--search", "rate", "--slo", "ttft=1s", "--rate", "2", "--search-tolerance", "0.2"],
        ["tune", "--slo", "ttft=1s", "--steps", "0,2", "--concurrency", "1,2,4", "--confidence", "0.3"],
    ],
)
def test_flags_that_are_used_are_accepted(argv, tmp_path):
    result = CliRunner().invoke(cli, [*argv, "--out", str(tmp_path), "--dry-run"])
    assert result.exit_code == 0, (argv, result.output)
    assert "# resolved spec" in result.output


def test_search_settings_record_their_resolved_maximum():
    s = SearchSettings(variable="rate", slos=("ttft=500ms",))
    assert s.top() == 1000.0 and s.model_copy(update={"maximum": 8.0}).top() == 8.0
    assert SearchSettings(variable="concurrency").top() == 1024


def test_search_and_tune_sections_written_as_dicts_still_load():
    """Manifests written before the sections were typed (plain dicts, keys missing, keys this rig does not know)."""
    old = {
        "version": 2,
        "search": {
            "settings": {
                "variable": "concurrency",
                "slos": ["ttft=500ms"],
                "percentile": 90.0,
                "start": 1,
                "maximum": 16,
                "tolerance": 0.1,
            },
            "describe": "p90 ttft <= 500 ms",
            "results": [
                {
                    "server_config": "c0",
                    "steps": 2,
                    "workload": "realistic",
                    "status": "bracketed",
                    "probes": 1,
                    "probe_points": [{"value": 4, "point": "p", "meets": True, "margin": 0.2}],
                    "max_passing": {"point": "p", "level": 4, "margin": 0.2},
                    "min_failing": None,
                    "error": None,
                    "note": "from a later rig",
                }
            ],
        },
        "tune": {
            "settings": {
                "slos": ["tpot=20ms"],
                "percentile": 50.0,
                "start_profile": None,
                "confidence": 0.2,
                "max_rounds": 8,
                "fit_evals": 120,
            },
            "ladder": [1, 2],
            "probes": [
                {
                    "round": 0,
                    "point": "p",
                    "server_config": "c0",
                    "steps": 0,
                    "level": 1,
                    "why": "design",
                    "predicted_meets": True,
                    "predicted_margin": 0.1,
                    "predicted_aggregate_tok_s": 5.0,
                    "predicted_decode_tok_s": 4.0,
                }
            ],
            "rounds": [
                {
                    "round": 0,
                    "fit_objective": 0.5,
                    "profile": {"c_tok_ms": 1.0},
                    "leader": {"server_config": "c0", "steps": 0, "level": 2},
                    "capacity": {"c0": 2},
                    "next": [],
                }
            ],
            "recommendation": {
                "measured_points": 1,
                "grid_points": 2,
                "stable": True,
                "stop_reason": "stable",
                "per_workload": [],
                "best_steps": None,
                "answer": "none",
                "evidence": "1 point",
            },
        },
    }
    m = parse_manifest(json.dumps(old))
    assert m.search is not None and m.tune is not None
    assert m.search.settings == SearchSettings(
        variable="concurrency", slos=("ttft=500ms",), percentile=90.0, maximum=16
    )
    [res] = m.search.results
    assert res.probe_points[0].value == 4 and isinstance(res.probe_points[0].value, int)
    assert res.model_dump()["note"] == "from a later rig"  # kept, and written back
    assert m.tune.settings is not None and m.tune.settings.percentile == 50.0
    assert m.tune.probes[0].meets is None and m.tune.recommendation is not None
    assert m.tune.recommendation.stable
    again = parse_manifest(m.to_json())
    assert again.search == m.search and again.tune == m.tune
