#!/usr/bin/env python3
"""Regenerate rig/sim/sglang_args_<version>.json from a pinned SGLang release's own argparse parser.

Usage (any Python >= 3.11 with SGLang's light dependencies: `pip install msgspec pydantic packaging`):
    python scripts/sglang_args.py --sglang-root DIR      # DIR holds the unpacked wheel's `sglang/` package
    python scripts/sglang_args.py                        # an installed `sglang` (pip install --no-deps sglang==X)

SGLang's parser module imports GPU-only packages (torch, triton, flashinfer, ...) at import time. Building the
parser needs none of them, so every module that cannot be imported is replaced by a permissive stub while the
parser is built, so a CPU machine can read it.
The table holds what argparse knows about each option: names, dest, action, type, default, choices, nargs.
"""

from __future__ import annotations

import abc
import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import types
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parent.parent / "rig" / "sim"


# Dunder attributes SGLang's import-time patches read from stubbed classes (everything else dunder is "absent").
_STUB_DUNDERS = {"__class_validators__"}
# Accelerator namespaces whose presence makes SGLang pick that platform (torch.npu, torch.xpu, ...): absent.
_ABSENT = {"npu", "hpu", "musa", "mlu"}


class _Stub(types.ModuleType):
    """A module (and any attribute of it) that is whatever the importer needs: callable, subscriptable, a base."""

    __path__: list[str] = []  # a package, so `import stub.sub` works
    __version__ = "99.0.0"  # version checks at import time take the newest branch

    def __getattr__(self, name: str):
        if (name.startswith("__") and name.endswith("__")) or name in _ABSENT:
            raise AttributeError(name)
        return _anything(f"{self.__name__}.{name}")


class _AnyMeta(abc.ABCMeta):  # ABCMeta: stubbed bases mix with ABC
    def __getattr__(cls, name: str):
        if name.startswith("__") and name.endswith("__") and name not in _STUB_DUNDERS:
            raise AttributeError(name)
        return _anything(f"{cls.__qualname__}.{name}")

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __call__(cls, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]  # used as a decorator
        return _anything(f"{cls.__qualname__}()")

    def __iter__(cls):
        return iter(())

    def __contains__(cls, item):
        return False

    def __int__(cls):
        return 0

    __index__ = __int__

    def __float__(cls):
        return 0.0

    def __len__(cls):
        return 0

    def __lt__(cls, other):
        return False

    __gt__ = __le__ = __ge__ = __lt__

    def __add__(cls, other):
        return cls

    __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __floordiv__ = __mod__ = __add__
    __and__ = __rand__ = __neg__ = __add__

    def __bool__(cls):
        return False


def _anything(name: str) -> type:
    return _AnyMeta(name.rsplit(".", 1)[-1], (), {"__qualname__": name, "__module__": name.rsplit(".", 1)[0]})


# The GPU / ML stack SGLang imports at module level. Only these are stubbed: any other missing module stays
# missing, so SGLang's own "is X installed?" probes (find_spec, try/except ImportError) answer as on a bare CPU box.
HEAVY = {
    "IPython",
    "torch",
    "triton",
    "transformers",
    "flashinfer",
    "sgl_kernel",
    "sglang_kernel",
    "numpy",
    "safetensors",
    "huggingface_hub",
    "tokenizers",
    "PIL",
    "zmq",
    "psutil",
    "requests",
    "aiohttp",
    "uvloop",
    "fastapi",
    "starlette",
    "uvicorn",
    "orjson",
    "setproctitle",
    "einops",
    "compressed_tensors",
    "torchao",
    "xgrammar",
    "outlines",
    "llguidance",
    "partial_json_parser",
    "openai",
    "tiktoken",
    "sentencepiece",
    "prometheus_client",
    "pybase64",
    "cuda",
    "nvidia",
    "decord",
    "soundfile",
    "scipy",
    "interegular",
    "msgpack",
    "modelscope",
    "blobfile",
    "gguf",
    "hf_transfer",
    "jinja2",
    "pynvml",
    "dill",
    "accelerate",
    "peft",
    "datasets",
    "yaml",
    "tqdm",
    "filelock",
    "jsonschema",
    "grpc",
    "google",
    "ray",
    "cloudpickle",
    "regex",
    "diffusers",
    "timm",
    "torchvision",
    "torchaudio",
    "mooncake",
    "nixl",
    "deep_gemm",
    "deep_ep",
    "flash_attn",
    "quack",
    "cutlass",
    "tvm_ffi",
    "apache_tvm_ffi",
    "pydantic_core",
    "httpx",
    "anthropic",
    "smg_grpc_proto",
    "watchfiles",
}


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: a HEAVY package that is not installed becomes a stub."""

    def __init__(self) -> None:
        self.stubbed: set[str] = set()

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] not in HEAVY:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        self.stubbed.add(spec.name.split(".")[0])
        return _Stub(spec.name)

    def exec_module(self, module) -> None:
        pass


def _jsonable(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple, set, frozenset)):
        items = [_jsonable(x) for x in v]
        return sorted(items, key=str) if isinstance(v, (set, frozenset)) else items
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return repr(v)


def _type_name(t) -> str | None:
    if t is None:
        return None
    name = getattr(t, "__name__", None) or type(t).__name__
    return {"str": "str", "int": "int", "float": "float"}.get(name, name)


def _action_name(a: argparse.Action) -> str:
    known = {
        argparse._StoreAction: "store",
        argparse._StoreTrueAction: "store_true",
        argparse._StoreFalseAction: "store_false",
        argparse._StoreConstAction: "store_const",
        argparse._AppendAction: "append",
        argparse._CountAction: "count",
        argparse.BooleanOptionalAction: "boolean_optional",
        argparse._HelpAction: "help",
    }
    for cls, name in known.items():
        if type(a) is cls:
            return name
    # SGLang's own actions (deprecations, JSON parsing): how many values they take decides how we parse.
    return f"custom:{type(a).__name__}"


def describe(parser: argparse.ArgumentParser) -> list[dict]:
    rows = []
    for a in parser._actions:
        if not a.option_strings or isinstance(a, argparse._HelpAction):
            continue
        rows.append(
            {
                "flags": list(a.option_strings),
                "dest": a.dest,
                "action": _action_name(a),
                "nargs": a.nargs if a.nargs is None or isinstance(a.nargs, (int, str)) else str(a.nargs),
                "type": _type_name(a.type),
                "default": _jsonable(a.default),
                # a set of choices (e.g. --sampling-backend) is sorted, so the table does not depend on hash order
                "choices": _jsonable(a.choices if isinstance(a.choices, (set, frozenset)) else list(a.choices))
                if a.choices is not None
                else None,
                "const": _jsonable(a.const),
                "required": bool(a.required),
            }
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang-root", type=Path, help="directory that contains the `sglang` package (unpacked wheel)")
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    opts = ap.parse_args()
    if opts.sglang_root:
        if not (opts.sglang_root / "sglang" / "srt" / "server_args.py").is_file():
            print(f"sglang_args: no sglang/srt/server_args.py under {opts.sglang_root}", file=sys.stderr)
            return 2
        sys.path.insert(0, str(opts.sglang_root))
    if importlib.util.find_spec("sglang") is None:
        print(
            "sglang_args: SGLang is not importable; pass --sglang-root or pip install --no-deps sglang==X",
            file=sys.stderr,
        )
        return 2
    finder = _StubFinder()
    sys.meta_path.append(finder)
    from sglang.srt.server_args import ServerArgs  # noqa: E402
    from sglang.version import __version__ as version  # noqa: E402  (after the stubs are in place)

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    rows = describe(parser)
    table = {
        "sglang_version": version,
        "source": "sglang.srt.server_args.ServerArgs.add_cli_args (built by scripts/sglang_args.py)",
        "stubbed_imports": sorted(finder.stubbed),
        "arguments": rows,
    }
    out = opts.out_dir / f"sglang_args_{version.replace('.', '_')}.json"
    # One option per line: a new SGLang release shows up as a readable diff of this file.
    head = {k: v for k, v in table.items() if k != "arguments"}
    lines = [json.dumps(head, indent=1)[:-2] + ',\n "arguments": [']
    lines += [" " + json.dumps(r) + ("," if i < len(rows) - 1 else "") for i, r in enumerate(rows)]
    out.write_text("\n".join(lines) + "\n ]\n}\n")
    print(f"wrote {out}: {len(rows)} options from SGLang {version}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
