"""The options of `rig run`, `rig sweep` and `rig tune`, generated from the spec models, and their merge into a spec.

A spec knob is declared once, on its pydantic field (type, default, constraints, help text as ``description``);
``SPEC_FLAGS`` only names the flag and where it lands in the spec. The few options that are not one spec field
(files to read, workload lists, comma-separated levels) are written out in ``run_options``.
"""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from rig.cli_settings import (
    click_type,
    settings_options,
    unoptional,
)
from rig.config import RunSpec, SpecError, build_spec
from rig.contracts import SloSettings
from rig.spec_yaml import deep_merge, load_yaml
from rig.workloads.spec import WorkloadName

_Command = TypeVar("_Command", bound=Callable[..., Any])  # a click command function under its decorators
_Settings = TypeVar("_Settings", bound=BaseModel)


@dataclass(frozen=True)
class SpecFlag:
    """A command-line option that sets one spec field (``path`` in the spec, dotted)."""

    flag: str
    path: str
    name: str | None = None  # the keyword the command receives, when not the flag's own (--server-arg: server_args)

    @property
    def field(self) -> FieldInfo:
        return spec_field(self.path)

    @property
    def param(self) -> str:
        return self.name or self.flag.lstrip("-").replace("-", "_")

    def option(self) -> Callable[[_Command], _Command]:
        """The click option: type, flag-ness and help text from the field."""
        field = self.field
        ann = unoptional(field.annotation)
        kw: dict[str, Any] = {"help": field.description}
        if self.flag.startswith("--no-"):  # a switch that turns a default-on knob off
            assert ann is bool and field.default is True, self.flag
            kw.update(is_flag=True, default=None, help=f"Do not {field.description}")
        elif ann is bool:
            kw.update(is_flag=True, default=None)
        elif typing.get_origin(ann) is tuple:
            kw.update(multiple=True)
        else:
            kw["type"] = click_type(ann)
        return click.option(self.flag, self.param, **kw)

    def value(self, given: Any) -> Any:
        """What the flag puts into the spec overrides (None: the flag was not given)."""
        if given is None or given == () or given is False:
            return None
        if self.flag.startswith("--no-"):
            return False
        if isinstance(given, tuple):
            return list(given)
        if isinstance(given, Path):
            return str(given)
        return given


# In the order `--help` lists them; each flag's help text is its field's description.
SPEC_FLAGS: tuple[SpecFlag, ...] = (
    SpecFlag("--engine", "server.engine"),
    SpecFlag("--model", "server.model"),
    SpecFlag("--served-model-name", "server.served_model_name"),
    SpecFlag("--tp", "server.tp"),
    SpecFlag("--spec-algorithm", "server.spec_algorithm"),
    SpecFlag("--spec-method", "server.spec_method"),
    SpecFlag("--draft-model", "server.draft_model_path"),
    SpecFlag("--server-arg", "server.extra_args", "server_args"),
    SpecFlag("--url", "server.url"),
    SpecFlag("--unreachable-timeout", "server.unreachable_timeout_s"),
    SpecFlag("--dialect", "server.dialect"),
    # --extra-body: see run_options
    SpecFlag("--engine-python", "server.python"),
    SpecFlag("--port", "server.port"),
    SpecFlag("--deterministic", "server.deterministic"),
    # --workload, --dataset, --workload-opt: see run_options
    SpecFlag("--mode", "load.mode"),
    # --concurrency, --rate: see run_options
    SpecFlag("--burstiness", "load.burstiness"),
    SpecFlag("--requests", "load.requests"),
    SpecFlag("--duration", "load.duration_s"),
    SpecFlag("--grace", "load.grace_s"),
    SpecFlag("--warmup", "load.warmup_requests"),
    SpecFlag("--trace-speed", "load.trace_speed"),
    SpecFlag("--api", "load.api"),
    SpecFlag("--seed", "load.seed"),
    SpecFlag("--clients", "clients"),
    SpecFlag("--per-host", "cluster.per_host"),
    SpecFlag("--repeat", "repeat"),
    SpecFlag("--first-token-timeout", "load.timeouts.first_token_s"),
    SpecFlag("--request-timeout", "load.timeouts.total_s"),
    SpecFlag("--metrics-interval", "metrics_interval_s"),
    SpecFlag("--no-flush-cache", "flush_cache"),
    SpecFlag("--fail-fast", "fail_fast"),
    SpecFlag("--api-key-env", "api_key_env"),
    SpecFlag("--api-key-file", "api_key_file"),
    SpecFlag("--out", "out"),
    SpecFlag("--run-id", "run_id"),
)
# Spec fields set by a hand-written option of run_options (or by a command's own option such as --steps).
HAND_WRITTEN = {
    "workloads": ("--workload", "--dataset", "--workload-opt"),
    "steps": ("--steps",),
    "load.concurrency": ("--concurrency",),
    "load.max_concurrency": ("--concurrency",),
    "load.rates": ("--rate",),
    "load.profile": ("--load-profile", "--rate-profile"),
    "server_grid": ("--grid",),
    "server.extra_body": ("--extra-body",),
    "server.command": ("--command",),
    "server.spec_schedule": ("--spec-schedule",),
}


def spec_field(path: str) -> FieldInfo:
    """The pydantic field at a dotted ``path`` of RunSpec (KeyError when there is none)."""
    model: type[BaseModel] = RunSpec
    *parents, last = path.split(".")
    for key in parents:
        model = unoptional(model.model_fields[key].annotation)
    return model.model_fields[last]


# --slo and --slo-percentile: one declaration (SloSettings), taken by sweep, tune and report.
slo_options = settings_options(SloSettings, "slos", "percentile")


def csv_workloads(text: str | None) -> list[str] | None:
    """--workload of the commands that run several (sweep, prove): comma-separated names."""
    return [w.strip() for w in text.split(",") if w.strip()] if text else None


def csv_ints(name: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {text!r}", param_hint=name) from None
    if not values:
        raise click.BadParameter("expected at least one value", param_hint=name)
    return values


def csv_floats(name: str, text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {text!r}", param_hint=name) from None
    return values


def _pairs(name: str, items: tuple[str, ...], json_values: bool = False) -> dict[str, object]:
    """KEY=VALUE flags as a mapping: each value read as YAML (--workload-opt max_tokens=32), or with ``json_values``
    as JSON where a bare word that is not JSON is taken as a string (--extra-body mode=fast). The values are
    whatever the user wrote (the spec's models validate them), so nothing here reads into them."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.BadParameter(
                f"expected KEY={'JSON' if json_values else 'VALUE'}, got {item!r}", param_hint=name
            )
        if not json_values:
            out[key] = yaml.safe_load(value) if value else ""
            continue
        try:
            out[key] = json.loads(value)
        except ValueError:
            if not value or value.lstrip()[:1] in '{["':  # meant as JSON: say where it breaks
                raise click.BadParameter(f"{key}: not JSON: {value!r}", param_hint=name) from None
            out[key] = value
    return out


@dataclass
class SpecPatch:
    """What the flags given set in the spec, by dotted path: the layer merged over the YAML's (flags not given leave
    the YAML's values alone)."""

    data: dict[str, Any] = field(default_factory=dict)
    # --workload-opt / --dataset without --workload: options for each workload the YAML names (or the default one)
    workload_opts: dict[str, Any] = field(default_factory=dict)

    def set(self, path: str, value: Any) -> None:
        if value is None:
            return
        d = self.data
        keys = path.split(".")
        for k in keys[:-1]:
            d = d.setdefault(k, {})
        d[keys[-1]] = value


def run_options(f: _Command) -> _Command:
    """Options shared by `rig run`, `rig sweep` and `rig tune`."""
    by_flag = {s.flag: s.option() for s in SPEC_FLAGS}
    opts = [
        click.option(
            "--config", "config_file", type=click.Path(path_type=Path), help="YAML run spec (flags override it)."
        ),
        click.option(
            "--cluster",
            "cluster_file",
            type=click.Path(path_type=Path),
            help="Cluster file (clusters/*.yaml). Default: the embedded local Ray.",
        ),
        *[by_flag[s.flag] for s in SPEC_FLAGS[: SPEC_FLAGS.index(_flag("--draft-model")) + 1]],
        click.option(
            "--spec-schedule",
            "spec_schedule",
            metavar="SCHEDULE",
            help=spec_field("server.spec_schedule").description,
        ),
        *[
            by_flag[s.flag]
            for s in SPEC_FLAGS[SPEC_FLAGS.index(_flag("--draft-model")) + 1 : SPEC_FLAGS.index(_flag("--dialect")) + 1]
        ],
        click.option(
            "--extra-body",
            "extra_body",
            multiple=True,
            metavar="KEY=JSON",
            help=spec_field("server.extra_body").description,
        ),
        *[
            by_flag[s.flag]
            for s in SPEC_FLAGS[SPEC_FLAGS.index(_flag("--dialect")) + 1 : SPEC_FLAGS.index(_flag("--mode"))]
        ],
        click.option("--command", "command", metavar="'SERVER ARGS'", help=spec_field("server.command").description),
        click.option("--workload", help=f"{_either(typing.get_args(WorkloadName))} (sweep, prove: comma-separated)."),
        click.option(
            "--dataset", type=click.Path(path_type=Path), help="dataset workload: a ShareGPT JSON or JSONL file."
        ),
        click.option("--workload-opt", "workload_opts", multiple=True, help="Workload option KEY=VALUE (repeatable)."),
        by_flag["--mode"],
        click.option("--concurrency", help=spec_field("load.concurrency").description),
        click.option("--rate", help=spec_field("load.rates").description),
        click.option(
            "--load-profile",
            "load_profile",
            metavar="C:SECs,...",
            help="Closed loop, one point: concurrency steps over time, e.g. 1:60s,64:60s,1:60s.",
        ),
        click.option(
            "--rate-profile",
            "rate_profile",
            metavar="R:SECs,...",
            help="Open loop, one point: rate steps or ramps over time, e.g. 2:30s,ramp(2,16,120s).",
        ),
        *[by_flag[s.flag] for s in SPEC_FLAGS[SPEC_FLAGS.index(_flag("--mode")) + 1 :]],
        click.option(
            "--dry-run", is_flag=True, help="Print the resolved spec, server commands and placement; start nothing."
        ),
        click.option("-q", "--quiet", is_flag=True, help="No progress bar."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _either(names: tuple[str, ...]) -> str:
    """'a, b or c'."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def _flag(flag: str) -> SpecFlag:
    return next(s for s in SPEC_FLAGS if s.flag == flag)


def overrides_from_flags(kw: dict[str, Any], steps: list[int] | None, workloads: list[str] | None) -> SpecPatch:
    """The spec values the given flags set."""
    o = SpecPatch()
    for s in SPEC_FLAGS:
        o.set(s.path, s.value(kw[s.param]))
    o.set("steps", steps)
    o.set("server.extra_body", _pairs("--extra-body", kw["extra_body"], json_values=True) or None)
    o.set("server.command", kw["command"])  # one string; ServerConfig splits it into arguments
    o.set("server.spec_schedule", kw["spec_schedule"])  # one string; ServerConfig reads it (rig.server.spec_schedule)
    if workloads is not None or kw["dataset"] or kw["workload_opts"]:
        opts = _pairs("--workload-opt", kw["workload_opts"])
        if kw["dataset"]:
            opts["path"] = str(kw["dataset"])
        names = workloads or (["dataset"] if kw["dataset"] else None)
        if names is not None:
            o.set("workloads", [{"name": n, **opts} for n in names])
        else:
            o.workload_opts = opts
    conc = csv_ints("--concurrency", kw["concurrency"])
    if conc is not None:
        if kw["mode"] in ("poisson", "gamma", "trace") or kw["rate"] or kw.get("rate_profile"):
            o.set("load.max_concurrency", conc[0])
        else:
            o.set("load.concurrency", conc)
    o.set("load.rates", csv_floats("--rate", kw["rate"]))
    if kw["rate"] and not kw["mode"]:
        o.set("load.mode", "poisson")
    _profile_flags(o, kw)
    return o


def _profile_flags(o: SpecPatch, kw: dict[str, Any]) -> None:
    """--load-profile / --rate-profile as the spec's load.profile (--rate-profile alone means --mode poisson)."""
    from rig.contracts.errors import ContractError
    from rig.contracts.profile import parse_profile

    closed, rated = kw.get("load_profile"), kw.get("rate_profile")
    if closed and rated:
        raise SpecError("--load-profile (closed loop) and --rate-profile (open loop): give one")
    if (closed or rated) and (kw["concurrency"] if closed else kw["rate"]):
        flag = "--concurrency" if closed else "--rate"
        raise SpecError(f"{flag} and a load profile: the profile sets the level of each phase; drop {flag}")
    try:
        phases = parse_profile(closed, "concurrency") if closed else parse_profile(rated, "rate") if rated else None
    except ContractError as e:
        raise SpecError(str(e)) from None
    if phases is not None:
        o.set("load.profile", [p.model_dump(exclude_none=True) for p in phases])
    if rated and not kw["mode"]:
        o.set("load.mode", "poisson")


def refuse_ignored(kw: dict[str, Any], spec: RunSpec) -> None:
    """A load flag the resolved spec would not use is an error naming both flags (SpecError), never dropped."""
    load = spec.load
    mode = f"--mode {load.mode}"
    conc = csv_ints("--concurrency", kw["concurrency"])
    if conc is not None and load.mode == "closed" and load.profile:
        raise SpecError("--concurrency and load.profile: the profile sets each phase's concurrency; drop one")
    if conc is not None and load.mode != "closed" and (len(conc) > 1 or load.max_concurrency != conc[0]):
        why = "--rate" if kw["rate"] else mode
        raise SpecError(
            f"--concurrency {kw['concurrency']}: with {why} it is one cap on in-flight requests, not a list of "
            f"levels; give one value (or sweep rates with --rate)"
        )
    if kw["burstiness"] is not None and load.mode != "gamma":
        raise SpecError(f"--burstiness applies to --mode gamma, not {mode}; drop it or give --mode gamma")
    if kw["trace_speed"] is not None and load.mode != "trace":
        raise SpecError(f"--trace-speed applies to --mode trace, not {mode}; drop it or give --mode trace")
    if kw["grace"] is not None and load.duration_s is None:
        raise SpecError("--grace applies to levels bounded by --duration; drop it or give --duration")
    engine = spec.server.engine
    for flag, param in (("--url", "url"), ("--unreachable-timeout", "unreachable_timeout")):
        if kw[param] is not None and engine != "external":
            raise SpecError(
                f"{flag} is for a server rig does not launch (--engine external); engine {engine} is launched by "
                f"rig at its own address: drop {flag} or give --engine external"
            )
    if kw["api_key_env"] and kw["api_key_file"]:
        raise SpecError(
            "--api-key-file and --api-key-env: the file's key would be sent and the variable ignored; give one"
        )


def resolve_spec(
    kw: dict[str, Any], steps: list[int] | None, workloads: list[str] | None, extra: dict[str, Any] | None = None
) -> RunSpec:
    """YAML (run spec, then cluster file) merged with flags (and ``extra``, a command's own overrides such as
    sweep's --grid); SpecError -> one line, exit 2."""
    try:
        data = load_yaml(kw["config_file"]) if kw["config_file"] else {}
        if kw["cluster_file"]:
            cluster_doc = load_yaml(kw["cluster_file"])
            if "cluster" not in cluster_doc:
                raise SpecError(f"{kw['cluster_file']}: no 'cluster:' mapping")
            data = deep_merge(data, {"cluster": cluster_doc["cluster"]})
            if "server" in cluster_doc:  # a cluster file may carry site defaults for the server (engine, tp)
                data = deep_merge({"server": cluster_doc["server"]}, data)
        patch = overrides_from_flags(kw, steps, workloads)
        over = deep_merge(patch.data, extra or {})
        if patch.workload_opts:
            base = data.get("workloads") or [{"name": "realistic"}]
            over["workloads"] = [{**w, **patch.workload_opts} for w in base]
        spec = build_spec(data, over)
        refuse_ignored(kw, spec)
        if kw["api_key_env"] and not os.environ.get(kw["api_key_env"]):
            raise SpecError(
                f"--api-key-env {kw['api_key_env']}: that environment variable is not set (or empty); "
                f"export it, or drop the flag to send no key"
            )
        return spec
    except SpecError as e:
        raise click.UsageError(str(e)) from None
