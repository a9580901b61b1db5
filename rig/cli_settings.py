"""Click options generated from pydantic settings fields: a field's type, bounds, default and help text become its
option's, and a field declares its flag once (``json_schema_extra={"flag": ...}``)."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import annotated_types
import click
from click.core import ParameterSource
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

_Command = TypeVar("_Command", bound=Callable[..., Any])  # a click command function under its decorators
_Settings = TypeVar("_Settings", bound=BaseModel)


def unoptional(ann: Any) -> Any:
    """``X | None`` -> ``X``."""
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(ann) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return ann


def click_type(ann: Any) -> Any:
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
    ann = unoptional(field.annotation)
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
        return click_type(ann)
    return click.IntRange(**bounds) if ann is int else click.FloatRange(**bounds)


def settings_options(model: type[BaseModel], *names: str) -> Callable[[_Command], _Command]:
    """The options of the named settings fields, in that order (default: every field that declares a flag)."""
    chosen = names or tuple(n for n, f in model.model_fields.items() if field_flag(f))

    def decorate(f: _Command) -> _Command:
        for name in reversed(chosen):
            f = settings_option(model, name)(f)
        return f

    return decorate


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
