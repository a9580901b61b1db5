"""`rig prove`: does the schedule (or the engine's adaptive controller) beat every static speculative setting, at
every load? One run directory, three stages of ordinary points:

1. Every static setting (the --steps list; steps 0 is added when missing: "no speculation" is always an arm) at every
   level, as `rig sweep` would run them.
2. The schedule read off stage 1 by `rig report`'s own rule (rig.analysis.schedule: the best steps per load band),
   turned into the engine's own per-batch-size configuration (rig.analysis.engine_schedule: an SGLang adaptive config
   whose slots each hold one candidate, keyed by the running batch measured at each band; on vLLM its
   ``num_speculative_tokens_per_batch_size`` list), and launched as an arm.
3. The engine's adaptive controller with its default table (or --adaptive-config), launched as another arm (SGLang
   and the simulator; vLLM has no controller: its speculation follows the load only through a schedule).

The schedule and adaptive arms serve the same requests at the same levels as the static ones (the workload seed and
the level fix the request ids), so each band's verdict is paired: the arm's throughput over the best static setting's
there, with a bootstrap interval (rig.analysis.prove).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

from rig.analysis.prove import judge_arms, judge_phases, schedule_slots
from rig.analysis.report import build_report
from rig.config import RunSpec, as_it_runs
from rig.contracts import ProveArm, ProveSection, ProveSettings
from rig.contracts.profile import profile_text
from rig.results import load_manifest
from rig.run.errors import RunInputError
from rig.run.points import Point, expand_points, point_id
from rig.run.runner import Runner
from rig.server import spec_schedule
from rig.server.spec import ServerConfig

ADAPTIVE_FLAG = "--speculative-adaptive"
ADAPTIVE_CONFIG_FLAG = "--speculative-adaptive-config"
# SGLang's default adaptive table (srt/speculative/adaptive_spec_params.py, DEFAULT_ADAPTIVE_CONFIG) in 0.5.23: its
# candidate union. Without --speculative-num-steps SGLang starts at the union's middle (3); the startup steps also
# size the state pool, so starting at the largest tier (which 0.5.17 needs: it sizes its logits buffer for the
# startup draft tokens) would shrink the server's running batch.
DEFAULT_TABLE_UNION = (0, 1, 3, 5, 7)
SCHEDULE_FILE = "prove/sglang_adaptive_config.json"  # where the schedule arm's config is written in the run
VLLM_SCHEDULE_FILE = "prove/vllm_speculative_config.json"  # the same for vLLM (its --speculative-config)
NO_VLLM_CONTROLLER = (
    "no adaptive arm: vLLM has no adaptive controller (its speculation follows the load only through "
    "num_speculative_tokens_per_batch_size, the schedule arm)"
)


def schedule_file(engine: str) -> str:
    """Where the schedule arm's engine configuration is kept in the run directory."""
    return VLLM_SCHEDULE_FILE if engine == "vllm" else SCHEDULE_FILE


def schedule_arm_config(base: ServerConfig, steps: int, config_file: str) -> ServerConfig:
    """``base`` running the schedule in ``config_file``: vLLM with the file's per-batch-size list (its steps the
    list's largest K), SGLang (and the simulator) as an adaptive controller reading the file."""
    if base.engine == "vllm":
        schedule = spec_schedule.parse(config_file)  # a file holding vLLM's speculative config
        return as_it_runs(base.model_copy(update={"steps": steps, "spec_schedule": schedule}))
    return adaptive_arm_config(base, steps, config_file)


def adaptive_arm_config(base: ServerConfig, steps: int, config_file: str | None) -> ServerConfig:
    """``base`` with the engine's adaptive controller on, starting at ``steps``, reading ``config_file`` if given."""
    extra = tuple(a for a in base.extra_args if a != ADAPTIVE_FLAG)
    extra += (ADAPTIVE_FLAG,) + ((ADAPTIVE_CONFIG_FLAG, config_file) if config_file else ())
    return as_it_runs(base.model_copy(update={"steps": steps, "extra_args": extra}))


def default_adaptive_steps(config_file: str | None) -> int:
    """The startup steps SGLang picks for an adaptive table: the middle of its candidate union (a positive one)."""
    union = list(DEFAULT_TABLE_UNION)
    if config_file is not None:
        data = json.loads(Path(config_file).read_text())
        union = sorted(
            {s for k, v in data.items() if k.isdigit() and isinstance(v, dict) for s in v.get("candidate_steps", [])}
        )
    positive = [s for s in union if s > 0] or [1]
    middle = union[len(union) // 2] if union else positive[0]
    return middle if middle > 0 else positive[0]


class ProvePlanner:
    """A planner for Runner (see the module docstring); what it decides is kept in the manifest's ``prove``."""

    def __init__(self, spec: RunSpec, settings: ProveSettings) -> None:
        self.spec = spec
        self.settings = settings
        self.base = spec.server_configs()[0]
        self.section = ProveSection()

    def __call__(self, runner: Runner) -> Iterator[Point]:
        self.section = runner.manifest.prove = runner.manifest.prove or ProveSection()
        self.section.settings = self.settings
        if self.settings.from_run is not None:
            yield from self._across_load_changes(runner)
            return
        statics = expand_points(self.spec)
        self.section.arms = [
            ProveArm(label=f"steps {c.steps}", kind="static", server_config=c.config_id(), steps=c.steps)
            for c in self.spec.server_configs()
        ]
        runner.save()
        yield from statics
        schedule_cfg = self._schedule_arm(runner)
        if schedule_cfg is not None:
            yield from self._points(schedule_cfg)
        if self.settings.adaptive and self.base.engine == "vllm":
            self.section.adaptive_note = NO_VLLM_CONTROLLER
            runner.save()
        elif self.settings.adaptive:
            steps = self.settings.adaptive_steps or default_adaptive_steps(self.settings.adaptive_config)
            cfg = adaptive_arm_config(self.base, steps, self.settings.adaptive_config)
            self.section.arms.append(
                ProveArm(
                    label="adaptive",
                    kind="adaptive",
                    server_config=cfg.config_id(),
                    steps=steps,
                    config_file=self.settings.adaptive_config,
                )
            )
            runner.save()
            yield from self._points(cfg)
        report = build_report(runner.run_dir, cdf_resolution=0)
        judge_arms(self.section, report)
        runner.save()

    def _across_load_changes(self, runner: Runner) -> Iterator[Point]:
        """Every arm of the earlier proof (its statics, its schedule with the same config file, its adaptive arm)
        on one point each, whose load follows the spec's profile; judged phase by phase."""
        prior = load_manifest(Path(str(self.settings.from_run)))
        if prior.prove is None:
            raise RunInputError(f"{self.settings.from_run} is not a rig prove run (its manifest has no prove section)")
        self.section.profile = profile_text(self.spec.load.profile or [])
        arms = [
            (ProveArm(label=f"steps {c.steps}", kind="static", server_config=c.config_id(), steps=c.steps), c)
            for c in self.spec.server_configs()
        ]
        for arm in prior.prove.arms:
            if arm.kind == "static" or (arm.kind == "adaptive" and not self.settings.adaptive):
                continue
            config_file = None
            if arm.config_file is not None:  # the earlier run's file, copied: this run holds what it ran
                src = Path(str(self.settings.from_run)) / arm.config_file
                kept = schedule_file(self.base.engine) if arm.kind == "schedule" else "prove/adaptive_config.json"
                dest = runner.run_dir / kept
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dest)
                config_file = str(dest)
            if arm.kind == "schedule" and config_file is not None:
                cfg = schedule_arm_config(self.base, arm.steps, config_file)
            else:
                cfg = adaptive_arm_config(self.base, arm.steps, config_file)
            arms.append((arm.model_copy(update={"server_config": cfg.config_id()}), cfg))
        self.section.arms = [a for a, _ in arms]
        self.section.schedule = prior.prove.schedule
        runner.save()
        for _, cfg in arms:
            yield from self._points(cfg)
        report = build_report(runner.run_dir, cdf_resolution=0)
        judge_phases(self.section, report)
        runner.save()

    def _points(self, cfg: ServerConfig) -> list[Point]:
        """The arm's points: the static grid's workloads, levels and repeats, on ``cfg``."""
        out = []
        for wl in self.spec.workloads:
            for concurrency, rate in self.spec.load.levels():
                for rep in range(self.spec.repeat):
                    pid = point_id(cfg, wl, concurrency, rate, self.spec.load.mode, rep)
                    if self.spec.load.profile:  # named as rig sweep names a profiled point
                        pid = pid.replace(f"-{wl.name}-", f"-{wl.name}-profile-", 1)
                    out.append(Point(pid, cfg, wl, concurrency, rate, rep))
        return out

    def _schedule_arm(self, runner: Runner) -> ServerConfig | None:
        """The schedule of the static points as the engine's own configuration, or None (said why) when there is
        nothing to schedule: every band's best is one setting, or no band was decided."""
        report = build_report(runner.run_dir, cdf_resolution=0)
        slots, config, note = schedule_slots(report, self.spec.workloads[0].name, self.base.engine)
        self.section.schedule, self.section.schedule_note = slots, note
        if config is None or len({s.steps for s in slots}) < 2:
            self.section.schedule_note = note + (
                "; no schedule arm: one setting is the best in every band, and it is measured already"
                if slots
                else "; no schedule arm"
            )
            runner.save()
            return None
        kept = schedule_file(self.base.engine)
        path = runner.run_dir / kept
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=2) + "\n")
        steps = max(s.steps for s in slots)
        cfg = schedule_arm_config(self.base, steps, str(path))
        self.section.arms.append(
            ProveArm(label="schedule", kind="schedule", server_config=cfg.config_id(), steps=steps, config_file=kept)
        )
        runner.save()
        return cfg


def prove_planner(spec: RunSpec, settings: ProveSettings) -> ProvePlanner:
    """The planner Runner calls for `rig prove` (and for a resumed proof)."""
    return ProvePlanner(spec, settings)
