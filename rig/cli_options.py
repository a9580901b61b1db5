"""The options of `rig run`, `rig sweep` and `rig tune`, generated from the spec models, and their merge into a spec.

A spec knob is declared once, on its pydantic field (type, default, constraints, help text as ``description``);
``SPEC_FLAGS`` only names the flag and where it lands in the spec. The few options that are not one spec field
(files to read, workload lists, comma-separated levels) are written out in ``run_options``.
"""

from __future__ import annotations

import json
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import annotated_types
import click
import yaml
from click.core import ParameterSource
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from rig.config import RunSpec, SpecError, build_spec, deep_merge, load_yaml
from rig.contracts import SloSettings
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
        ann = _unoptional(field.annotation)
        kw: dict[str, Any] = {"help": field.description}
        if self.flag.startswith("--no-"):  # a switch that turns a default-on knob off
            assert ann is bool and field.default is True, self.flag
            kw.update(is_flag=True, default=None, help=f"Do not {field.description}")
        elif ann is bool:
            kw.update(is_flag=True, default=None)
        elif typing.get_origin(ann) is tuple:
            kw.update(multiple=True)
        else:
            kw["type"] = _click_type(ann)
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
    "server_grid": ("--grid",),
    "server.extra_body": ("--extra-body",),
    "server.command": ("--command",),
}


def spec_field(path: str) -> FieldInfo:
    """The pydantic field at a dotted ``path`` of RunSpec (KeyError when there is none)."""
    model: type[BaseModel] = RunSpec
    *parents, last = path.split(".")
    for key in parents:
        model = _unoptional(model.model_fields[key].annotation)
    return model.model_fields[last]


def _unoptional(ann: Any) -> Any:
    """``X | None`` -> ``X``."""
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(ann) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return ann


def _click_type(ann: Any) -> Any:
    if typing.get_origin(ann) is Literal:
        return click.Choice(list(typing.get_args(ann)))
    if ann is Path:
        return click.Path(path_type=Path)
    if ann in (int, float, str):
        return ann
    if ann is bool:  # a --name/--no-name flag
        return click.BOOL
    raise TypeError(f"no command-line type for {ann!r}")


# --- settings models' flags (rig.contracts.search): each flag declared on its field ---------------------------------


def field_flag(field: FieldInfo) -> str | None:
    """The flag a settings field declares (``json_schema_extra={"flag": ...}``), or None."""
    extra = field.json_schema_extra
    return str(extra["flag"]) if isinstance(extra, dict) and "flag" in extra else None


def settings_option(
    model: type[BaseModel], name: str, param: str | None = None, own_default: str | None = None, **click_kw: Any
) -> Callable[[_Command], _Command]:
    """The click option of one settings field: its flag, help, bounds and default all from the field (which flags
    were given: ``given_flags``). ``param``: the command's keyword when not the field's name; ``own_default``: the
    command resolves an absent value itself (the option's default is None), as this text says."""
    field = model.model_fields[name]
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    flag = field_flag(field)
    assert flag is not None, f"{model.__name__}.{name} declares no flag"
    ann = _unoptional(field.annotation)
    kw: dict[str, Any] = {"help": field.description, "default": None, "metavar": extra.get("metavar")}
    if typing.get_origin(ann) is tuple:
        kw.update(multiple=True, default=())
    elif extra.get("path") == "existing-file":
        kw["type"] = click.Path(dir_okay=False, exists=True)
    elif typing.get_origin(ann) is Literal:
        kw["type"] = click.Choice(list(typing.get_args(ann)))
    else:
        kw["type"] = _ranged(ann, field)
    if own_default is not None:
        kw["help"] = f"{field.description} Default: {own_default}."
    elif not field.is_required() and field.default not in (None, ()):
        kw.update(default=field.default, show_default=True)
    return click.option(flag, param or name, **kw, **click_kw)


def _ranged(ann: Any, field: FieldInfo) -> Any:
    """int or float, bounded as the field is (ge/gt/le/lt)."""
    bounds: dict[str, Any] = {}
    for m in field.metadata:
        if isinstance(m, annotated_types.Ge):
            bounds["min"] = m.ge
        elif isinstance(m, annotated_types.Gt):
            bounds.update(min=m.gt, min_open=True)
        elif isinstance(m, annotated_types.Le):
            bounds["max"] = m.le
        elif isinstance(m, annotated_types.Lt):
            bounds.update(max=m.lt, max_open=True)
    if not bounds:
        return _click_type(ann)
    return click.IntRange(**bounds) if ann is int else click.FloatRange(**bounds)


def settings_options(model: type[BaseModel], *names: str) -> Callable[[_Command], _Command]:
    """The options of the named settings fields, in that order (default: every field that declares a flag)."""
    chosen = names or tuple(n for n, f in model.model_fields.items() if field_flag(f))

    def decorate(f: _Command) -> _Command:
        for name in reversed(chosen):
            f = settings_option(model, name)(f)
        return f

    return decorate


# --slo and --slo-percentile: one declaration (SloSettings), taken by sweep, tune and report.
slo_options = settings_options(SloSettings, "slos", "percentile")


def given_flags(ctx: click.Context, *params: str) -> list[str]:
    """The flags among ``params`` (parameter names) the user gave on the command line."""
    out = []
    for p in ctx.command.params:
        if p.name in params and ctx.get_parameter_source(p.name) is ParameterSource.COMMANDLINE:
            out.append(p.opts[0])
    return out


def settings_from(model: type[_Settings], kw: dict[str, Any], **fixed: Any) -> _Settings:
    """The settings the given flags make (absent flags take the model's defaults); a bad value is a usage error."""
    data = {n: kw[n] for n in model.model_fields if n in kw and kw[n] is not None and kw[n] != ()}
    try:
        return model.model_validate({**data, **fixed})
    except ValidationError as e:
        err = e.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else ""
        field = model.model_fields.get(name)
        where = (field_flag(field) if field is not None else None) or name
        raise click.UsageError(f"{where}: {err['msg']}") from None


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
        *[by_flag[s.flag] for s in SPEC_FLAGS[: SPEC_FLAGS.index(_flag("--dialect")) + 1]],
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
        click.option("--workload", help=f"{_either(typing.get_args(WorkloadName))} (sweep: comma-separated)."),
        click.option(
            "--dataset", type=click.Path(path_type=Path), help="dataset workload: a ShareGPT JSON or JSONL file."
        ),
        click.option("--workload-opt", "workload_opts", multiple=True, help="Workload option KEY=VALUE (repeatable)."),
        by_flag["--mode"],
        click.option("--concurrency", help=spec_field("load.concurrency").description),
        click.option("--rate", help=spec_field("load.rates").description),
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
        if kw["mode"] in ("poisson", "gamma", "trace") or kw["rate"]:
            o.set("load.max_concurrency", conc[0])
        else:
            o.set("load.concurrency", conc)
    o.set("load.rates", csv_floats("--rate", kw["rate"]))
    if kw["rate"] and not kw["mode"]:
        o.set("load.mode", "poisson")
    return o


def refuse_ignored(kw: dict[str, Any], spec: RunSpec) -> None:
    """A load flag the resolved spec would not use is an error naming both flags (SpecError), never dropped."""
    load = spec.load
    mode = f"--mode {load.mode}"
    conc = csv_ints("--concurrency", kw["concurrency"])
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
