"""The house's shape, kept by tests: small modules, typed seams (issue 22)."""

from __future__ import annotations

import ast
from pathlib import Path

import rig

RIG = Path(rig.__file__).parent
MAX_MODULE_LINES = 500
# Functions outside the simulator whose return type holds an untyped ``dict[str, Any]`` (bare, in a list, a tuple, an
# Optional...): JSON readers and serializers at true boundaries (a manifest's raw JSON, a YAML file and its merge, a
# typed row's JSON form, the per-request record and the part writer's rows on the hot path) and the speculative
# schedule's sections, which their owners are splitting. Issue 31 took them from 38 to 15; return a TypedDict, a
# dataclass or a model (rig.contracts, rig.analysis.rows) instead of raising this.
MAX_UNTYPED_DICT_RETURNS = 15


def _modules(root: Path = RIG) -> list[Path]:
    return sorted(root.rglob("*.py"))


def test_no_module_over_the_line_limit():
    long = {str(p.relative_to(RIG)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"split these by job (limit {MAX_MODULE_LINES} lines): {long}"


def untyped_dict_returns(root: Path = RIG) -> list[str]:
    found = []
    for path in _modules(root):
        if path.relative_to(root).parts[0] == "sim":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if function and node.returns is not None and "dict[str,Any]" in ast.unparse(node.returns).replace(" ", ""):
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
    return found


def test_few_functions_return_untyped_dicts():
    found = untyped_dict_returns()
    assert len(found) <= MAX_UNTYPED_DICT_RETURNS, "return a model (rig.contracts) instead:\n" + "\n".join(found)


def test_the_counter_sees_an_untyped_return(tmp_path):
    """The count above is not vacuous: such a function is counted, a list or an Optional of them too, except in the
    simulator; a typed row is not."""
    for sub, name in (("x", "f"), ("sim", "g")):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "m.py").write_text(
            f"from typing import Any\n\ndef {name}() -> dict[str, Any]:\n    return {{}}\n"
            f"\n\ndef {name}_rows() -> list[dict[str, Any]] | None:\n    return None\n"
            f"\n\ndef {name}_typed() -> list[Row]:\n    return []\n"
        )
    assert untyped_dict_returns(tmp_path) == ["x/m.py:3 f", "x/m.py:7 f_rows"]


def test_no_module_beside_a_script_run_by_path_shadows_the_standard_library():
    """rig/server/tiny_model.py is run by path with the engine venv's python (tests/vllm_fixtures.py), which puts
    rig/server/ first on sys.path: a module there named like one of the standard library's (a secrets.py once)
    replaces it for everything the script imports."""
    import sys

    shadows = sorted(p.name for p in (RIG / "server").glob("*.py") if p.stem in sys.stdlib_module_names)
    assert shadows == []
