"""The effective server configuration: what SGLang (or the sim) really runs, against what rig asked for."""

from __future__ import annotations

import shlex

import pytest
from click.testing import CliRunner

from rig.cli import cli
from rig.server.effective import effective_config, label_knobs
from rig.server.engines import engine_for
from rig.server.spec import ServerConfig


def _info(steps=3, topk=1, draft=4, det=False, effective_mrr=48, algo="EAGLE"):
    """/server_info as SGLang 0.5.23 answers it (entrypoints/http_server.py): resolved args + internal_states."""
    return {
        "speculative_algorithm": algo,
        "speculative_num_steps": steps,
        "speculative_eagle_topk": topk,
        "speculative_num_draft_tokens": draft,
        "max_running_requests": 48,
        "enable_deterministic_inference": det,
        "internal_states": [{"effective_max_running_requests_per_dp": effective_mrr}],
    }


def test_topk1_draft_tokens_reset_is_a_change_and_relabels_the_point():
    """arg_groups/speculative_hook.py: topk 1 forces num_draft_tokens = steps + 1; a grid of 8 ran 4."""
    cfg = ServerConfig(engine="sglang", steps=3, num_draft_tokens=8)
    eff = effective_config(cfg, _info(draft=4), {})
    assert eff.model_dump()["changed"] == [{"knob": "num_draft_tokens", "requested": 8, "effective": 4}]
    assert label_knobs(cfg.knobs(), eff)["num_draft_tokens"] == 4
    assert eff.seeds_honoured is False


def test_nextn_alias_and_consistent_values_are_not_changes():
    cfg = ServerConfig(engine="sim", steps=3, spec_algorithm="NEXTN")
    eff = effective_config(cfg, _info(), {})
    assert eff.changed == [] and eff.effective["max_running_requests"] == 48


def test_requested_max_running_requests_capped_by_server_is_a_change():
    cfg = ServerConfig(engine="sglang", steps=0, extra_args=("--max-running-requests", "256"))
    info = {
        "speculative_algorithm": None,
        "enable_deterministic_inference": False,
        "internal_states": [{"effective_max_running_requests_per_dp": 130}],
    }
    eff = effective_config(cfg, info, {})
    assert eff.model_dump()["changed"] == [{"knob": "max_running_requests", "requested": 256, "effective": 130}]


def test_deterministic_flag_passes_enable_deterministic_inference_and_seeds_count():
    cfg = ServerConfig(engine="sglang", steps=0, deterministic=True)
    argv = engine_for("sglang").argv(cfg, "0.0.0.0", 30000)
    assert argv.count("--enable-deterministic-inference") == 1
    eff = effective_config(cfg, {"enable_deterministic_inference": True, "internal_states": [{}]}, {})
    assert eff.seeds_honoured is True and eff.changed == []
    off = effective_config(cfg, {"enable_deterministic_inference": False, "internal_states": [{}]}, {})
    assert off.seeds_honoured is False and off.changed[0].knob == "deterministic_inference"
    # Off by default, and then absent from the knobs, so configuration ids from before the knob stay the same.
    assert "deterministic" not in ServerConfig(engine="sglang").knobs()


def test_seeds_honoured_by_engine():
    assert effective_config(ServerConfig(engine="vllm"), None, {}).seeds_honoured is True
    assert effective_config(ServerConfig(engine="external", url="http://127.0.0.1:1"), None, {}).seeds_honoured is None


def test_dry_run_prints_a_command_to_paste_with_a_concrete_port():
    res = CliRunner().invoke(
        cli,
        [
            "run",
            "--engine",
            "sglang",
            "--steps",
            "2",
            "--deterministic",
            "--server-arg=--reasoning-parser",
            "--server-arg",
            "qwen3",
            "--dry-run",
        ],
    )
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if "sglang.launch_server" in x)
    argv = shlex.split(line.split(": ", 1)[1])
    assert argv[argv.index("--port") + 1] == "30000"
    assert "<" not in line and "--enable-deterministic-inference" in argv
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]  # no path that only exists on this machine


# ---- the manifest's effective config reaches report and compare ----
def _sampled_run(d, honoured: bool | None, changed: bool = False):
    """Two points of a sampled workload (steps 0 and 2) on servers whose effective config the manifest records."""
    from synthetic import record, write_requests, write_run

    def cfg(steps):
        eff = {
            "requested": {"steps": steps},
            "effective": {"steps": steps},
            "seeds_honoured": honoured,
            "changed": [{"knob": "num_draft_tokens", "requested": 8, "effective": 3}] if changed and steps else [],
        }
        knobs = {"engine": "sglang", "steps": steps, "num_draft_tokens": 8 if steps else None}
        return {"engine": "sglang", "knobs": knobs, "effective": eff}

    points = [
        {
            "point": f"p{s}",
            "server_config": f"cfg{s}",
            "engine": "sglang",
            "workload": "realistic",
            "steps": s,
            "load_mode": "closed",
            "concurrency": 2,
            "rate": None,
            "repeat": 0,
            "status": "complete",
            "flags": [],
            "generators": [],
        }
        for s in (0, 2)
    ]
    write_run(
        d,
        {
            "run_id": d.name,
            "status": "complete",
            "points": points,
            "spec": {"workloads": [{"name": "realistic", "temperature": 0.7}]},
            "server_configs": {"cfg0": cfg(0), "cfg2": cfg(2)},
        },
    )
    for s in (0, 2):
        rows = [
            record(
                point=f"p{s}",
                steps=s,
                workload="realistic",
                load_mode="closed",
                concurrency=2,
                repeat=0,
                generator=0,
                clock_offset_s=0.0,
                request_id=f"r{i}",
                send_ts=100.0 + i,
                first_token_ts=100.1 + i,
                end_ts=101.0 + i - 0.2 * (s > 0),
                ttft_s=0.1,
                e2e_s=1.0 - 0.2 * (s > 0),
                completion_tokens=50,
                status="ok",
                ok=True,
                temperature=0.7,
                output_hash=f"h{i}{s}",
            )
            for i in range(10)
        ]
        write_requests(d, f"p{s}", 0, rows)


def test_compare_warns_when_pairing_unhonoured_seeds(tmp_path):
    from rig.analysis.compare import compare

    _sampled_run(tmp_path / "off", honoured=False)
    warn = [w for w in compare(str(tmp_path / "off"), baseline_steps=0)["warnings"] if "seeds" in w]
    assert len(warn) == 3  # a run-level note per server configuration, and the pairing warning
    assert any(w.startswith("1 pair(s) of points compare sampled requests") for w in warn)
    _sampled_run(tmp_path / "on", honoured=True)
    assert not [w for w in compare(str(tmp_path / "on"), baseline_steps=0)["warnings"] if "seeds" in w]


def test_report_reader_labels_effective_values_and_lists_changes(tmp_path):
    from rig.analysis.render import seeds_line
    from rig.analysis.runs import load_run

    _sampled_run(tmp_path / "r", honoured=False, changed=True)
    run = load_run(tmp_path / "r")
    p2 = run.point("p2")
    assert p2.knobs["num_draft_tokens"] == 3 and p2.seeds_honoured is False
    assert "server cfg2: requested num_draft_tokens=8 but the server runs 3" in run.warnings
    assert seeds_line(run.points).startswith("not honoured")
    res = CliRunner().invoke(cli, ["report", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "requested num_draft_tokens=8" in res.output and "Per-request seeds: not honoured" in res.output


@pytest.mark.parametrize(
    "honoured,line",
    [
        (False, "not honoured by the server (SGLang without --enable-deterministic-inference)"),
        (True, "honoured by the server (sampled requests are reproducible across points)"),
        (None, "unknown (the server does not say)"),
    ],
)
def test_the_html_report_has_the_seeds_line_of_the_terminal_report(tmp_path, honoured, line):
    from rig.analysis.html import render_html
    from rig.analysis.report import build_report

    _sampled_run(tmp_path / "r", honoured=honoured)
    page = render_html(build_report(tmp_path / "r"), plots=[])
    assert f"<p>Per-request seeds: {line}</p>" in page
    res = CliRunner().invoke(cli, ["report", str(tmp_path / "r")], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert f"Per-request seeds: {line}" in res.output  # the same words in both


def test_grid_values_the_server_collapsed_are_called_out(tmp_path):
    """--grid num_draft_tokens=4,8 with topk 1: SGLang runs steps + 1 for both, so the two are one configuration."""
    from rig.analysis.runs import effective_warnings
    from rig.contracts import Manifest

    def cfg(draft):
        knobs = {"engine": "sglang", "steps": 3, "eagle_topk": 1, "num_draft_tokens": draft}
        changed = [] if draft == 4 else [{"knob": "num_draft_tokens", "requested": draft, "effective": 4}]
        return {"knobs": knobs, "effective": {"changed": changed, "seeds_honoured": True}}

    warnings = effective_warnings(Manifest.model_validate({"server_configs": {"a": cfg(4), "b": cfg(8)}}))
    assert "server b: requested num_draft_tokens=8 but the server runs 4" in warnings
    assert any(w.startswith("server configurations a, b ran the same effective settings") for w in warnings)


def test_deterministic_engine_changes_are_read_back_and_said():
    """--enable-deterministic-inference is not a seed switch: on the simulated Blackwell node it turns the radix
    cache off (flashinfer), forces the pytorch sampler and, at TP 4, custom all-reduce off
    (SGLang arg_groups/attention_hook.py::handle_deterministic_inference). /server_info reports the resolved fields;
    rig reads them back and the run and the report say what changed."""
    from rig.server.effective import change_lines
    from rig.sim.args import resolve

    cfg = ServerConfig(engine="sim", steps=0, tp=4, deterministic=True)
    argv = engine_for("sim").argv(cfg, "127.0.0.1", 1)[3:]  # the server's own flags
    info = {**resolve(argv).as_dict(), "internal_states": [{}]}  # what the sim's /server_info lists
    eff = effective_config(cfg, info, {})
    assert {
        k: eff.effective[k] for k in ("radix_cache", "attention_backend", "sampling_backend", "custom_all_reduce")
    } == {
        "radix_cache": False,
        "attention_backend": "flashinfer",
        "sampling_backend": "pytorch",
        "custom_all_reduce": False,
    }
    lines = change_lines("sim-s0", eff)
    assert len(lines) == 1 and "radix (prefix) cache OFF (attention backend flashinfer" in lines[0]
    assert "sampling backend pytorch" in lines[0] and "custom all-reduce off" in lines[0]
    plain = ServerConfig(engine="sim", steps=0, tp=4)
    info = {**resolve(engine_for("sim").argv(plain, "127.0.0.1", 1)[3:]).as_dict(), "internal_states": [{}]}
    eff = effective_config(plain, info, {})
    assert eff.effective["radix_cache"] is True and change_lines("sim-s0", eff) == []


def test_report_prints_what_deterministic_inference_changed(tmp_path):
    """The manifest's effective config of a deterministic server (radix cache off, pytorch sampler) reaches the
    report as one line, so a figure is not read as the default engine's."""
    import json

    _sampled_run(tmp_path / "d", honoured=True)
    path = tmp_path / "d" / "manifest.json"
    data = json.loads(path.read_text())
    data["server_configs"]["cfg2"]["effective"]["effective"].update(
        deterministic_inference=True,
        radix_cache=False,
        attention_backend="flashinfer",
        sampling_backend="pytorch",
        custom_all_reduce=False,
    )
    path.write_text(json.dumps(data))
    res = CliRunner().invoke(cli, ["report", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert (
        "server cfg2: deterministic inference changes the engine, not only the seeds: radix (prefix) cache OFF "
        "(attention backend flashinfer" in flat
    )
    assert "server cfg0: deterministic" not in flat
