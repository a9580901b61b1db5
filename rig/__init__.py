"""rig: a distributed test rig for LLM serving with speculative decoding.

The Python API (rig.api, imported on first use so that ``import rig`` and ``rig --version`` stay light):
``rig.open_run(path)`` opens a run directory for analysis; ``rig.compare(a, b)`` pairs two runs' requests.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# rig.api is imported by name when first used, not by an import statement: mypy follows those (in functions and
# under TYPE_CHECKING too) and would check the whole package under --strict with rig/contracts; its names are typed.
_API = ("open_run", "compare", "RunView", "Comparison", "SECTIONS")
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        import importlib

        return getattr(importlib.import_module("rig.api"), name)
    raise AttributeError(f"module 'rig' has no attribute {name!r}")
