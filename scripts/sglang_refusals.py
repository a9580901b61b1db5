#!/usr/bin/env python3
"""Read SGLang's launch refusals from its own source, and run its resolution functions, for rig's simulator tests.

Usage (the unpacked wheel, as for scripts/sglang_args.py):
    python scripts/sglang_refusals.py --sglang-root DIR sites FILE:FUNCTION ...
        -> JSON {"FILE:FUNCTION": [message template, ...]}: every assert / raise in that function of
           DIR/sglang/srt/FILE, its message with each f-string field as "{}" ("" for a bare assert)
    python scripts/sglang_refusals.py --sglang-root DIR run < cases.json
        -> JSON results of SGLang's own validate_mamba_no_buffer and _deterministic_attention_backend on each case,
           and the backend lists of arg_groups/choices.py

The second form imports SGLang with the GPU stack stubbed (scripts/sglang_args.py's finder), so run it in a process
of its own: the stubs stay on sys.meta_path.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import types
from pathlib import Path


def _template(node: ast.expr | None) -> str:
    if node is None:
        return ""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return "<expr>"  # a message built at run time: listed, so a test must still classify it


def sites(source: str, function: str) -> list[str]:
    """Every assert / raise in ``function`` (any nesting), its message as a template."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            out = []
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assert):
                    out.append(_template(sub.msg))
                elif isinstance(sub, ast.Raise) and isinstance(sub.exc, ast.Call):
                    out.append(_template(sub.exc.args[0] if sub.exc.args else None))
            return out
    raise SystemExit(f"sglang_refusals: no function {function}")


def run(cases: list[dict]) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sglang_args import _StubFinder  # noqa: E402

    sys.meta_path.append(_StubFinder())
    from sglang.srt.arg_groups import choices, mamba_hook, overrides  # noqa: E402

    results = []
    for case in cases:
        view = types.SimpleNamespace(**case["view"])
        try:
            if case["function"] == "validate_mamba_no_buffer":
                mamba_hook.validate_mamba_no_buffer(view, case["arch"])
                results.append({"ok": True})
            else:
                arch = case["arch"]
                overrides.get_platform = lambda arch=arch: types.SimpleNamespace(  # the GPU generation the case runs on
                    is_sm100=arch == "sm100", is_sm120=arch == "sm120"
                )
                results.append({"ok": True, "set": overrides._deterministic_attention_backend(view)})
        except (AssertionError, ValueError) as e:
            results.append({"ok": False, "error": type(e).__name__, "message": str(e)})
    return {
        "results": results,
        "DETERMINISTIC_ATTENTION_BACKEND_CHOICES": list(choices.DETERMINISTIC_ATTENTION_BACKEND_CHOICES),
        "RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND": list(
            choices.RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND
        ),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang-root", type=Path, required=True, help="directory that contains the `sglang` package")
    ap.add_argument("what", choices=["sites", "run"])
    ap.add_argument("functions", nargs="*", help="FILE:FUNCTION, FILE relative to sglang/srt/")
    opts = ap.parse_args()
    srt = opts.sglang_root / "sglang" / "srt"
    if not srt.is_dir():
        print(f"sglang_refusals: no sglang/srt under {opts.sglang_root}", file=sys.stderr)
        return 2
    if opts.what == "sites":
        out = {}
        for spec in opts.functions:
            rel, _, function = spec.partition(":")
            out[spec] = sites((srt / rel).read_text(), function)
        print(json.dumps(out))
        return 0
    sys.path.insert(0, str(opts.sglang_root))
    print(json.dumps(run(json.load(sys.stdin))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
