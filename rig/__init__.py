"""rig: a distributed test rig for LLM serving with speculative decoding.

The Python API (rig.api, imported on first use so that ``import rig`` and ``rig --version`` stay light):
``rig.open_run(path)`` opens a run directory for analysis; ``rig.compare(a, b)`` pairs two runs' requests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from rig.api import SECTIONS, Comparison, RunView, compare, open_run

_API = ("open_run", "compare", "RunView", "Comparison", "SECTIONS")
__all__ = ["SECTIONS", "Comparison", "RunView", "__version__", "compare", "open_run"]


def __getattr__(name: str) -> Any:
    if name in _API:
        from rig import api

        return getattr(api, name)
    raise AttributeError(f"module 'rig' has no attribute {name!r}")
