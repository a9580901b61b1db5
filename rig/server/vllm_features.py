"""What the vLLM behind an engine interpreter accepts, read from its installed source without importing it.

rig's launch line targets vLLM 0.32; the GPU node's torch 2.11 pins vLLM 0.24-0.26, which refuse flags added since
(argparse: "unrecognized arguments", the server never starts). Importing vllm to ask takes seconds and a GPU
stack; finding the package and reading one file takes milliseconds.
"""

from __future__ import annotations

import subprocess
from functools import lru_cache

# The per-request acceptance summary on the final usage chunk: ObservabilityConfig.per_request_spec_decode_metrics
# (vllm/config/observability.py in 0.32.0; absent in 0.26.0).
PER_REQUEST_SPEC_METRICS = ("config/observability.py", "per_request_spec_decode_metrics")

_PROBE = """
import importlib.util, os, sys
spec = importlib.util.find_spec("vllm")
if spec is None or not spec.submodule_search_locations:
    print("absent"); sys.exit()
path = os.path.join(list(spec.submodule_search_locations)[0], sys.argv[1])
try:
    text = open(path, encoding="utf-8", errors="replace").read()
except OSError:
    print("no"); sys.exit()
print("yes" if sys.argv[2] in text else "no")
"""


@lru_cache(maxsize=16)
def has_feature(python: str, feature: tuple[str, str] = PER_REQUEST_SPEC_METRICS) -> bool:
    """Does the vLLM that ``python`` imports define ``feature`` (a file under the package and a name in it)?

    True when it cannot be told (the interpreter missing here, as for a dry run planned for another host, or the
    probe failing): the launch line then stays what rig's own vLLM takes."""
    try:
        out = subprocess.run(
            [python, "-c", _PROBE, *feature], capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return True
    return out != "no"
