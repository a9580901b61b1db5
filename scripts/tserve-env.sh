#!/usr/bin/env bash
# Create (once) an isolated venv that runs `transformers serve` on CPU, apart from the rig's own venv.
#
#   scripts/tserve-env.sh [DIR]      default: $RIG_CACHE/tserve-venv, else <repo>/.cache/tserve-venv
#
# Prints the venv's `transformers` executable on stdout (the last line); progress goes to stderr. Idempotent: a
# stamp file records what was installed, and a re-run with the same pins returns at once. Safe to run concurrently
# (flock). `pip freeze` of the result is kept beside the stamp (freeze.txt): the list a GPU node without a package
# index needs as wheels.
#
# Two ways to get torch (RIG_TSERVE_TORCH):
#   shared (default)  chain the vLLM CPU venv's site-packages (scripts/vllm-env.sh builds it; it has torch
#                     2.13.0+cpu) through a .pth file, and install only what transformers serve adds on top. The
#                     venv's own site-packages come first on sys.path, so its transformers shadows vLLM's.
#   own               install torch 2.13.0+cpu from the local wheel folder (/opt/wheels), as vllm-env.sh does.
# Measured on this 2-core machine (2026-12-01): see README.md, "Real engines in the test suite".
set -euo pipefail

TRANSFORMERS_VERSION="${RIG_TRANSFORMERS_VERSION:-5.17.0}"  # what the GPU node runs (shared/reference/gpu-node.md)
ACCELERATE_VERSION="${RIG_ACCELERATE_VERSION:-1.15.0}"
TORCH_VERSION="${RIG_TORCH_VERSION:-2.13.0}"
TORCH_MODE="${RIG_TSERVE_TORCH:-shared}"
PYTHON="${RIG_TSERVE_BASE_PYTHON:-python3}"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${RIG_CACHE:-$repo/.cache}"
dir="${1:-$cache/tserve-venv}"
stamp="$dir/.rig-tserve-env.stamp"
RECIPE=1  # bump when the steps below change

log() { printf '[tserve-env] %s\n' "$*" >&2; }

case "$TORCH_MODE" in
    shared)
        # Builds (or waits for) the vLLM venv; its stamp is part of ours, so a rebuilt vLLM venv rebuilds this one.
        vllm_py="$(bash "$repo/scripts/vllm-env.sh" | tail -n1)"
        vllm_dir="$(dirname "$(dirname "$vllm_py")")"
        base="shared:$(head -n1 "$vllm_dir/.rig-vllm-env.stamp" | tr ' ' ',')" ;;
    own) base="own:torch==$TORCH_VERSION" ;;
    *) log "RIG_TSERVE_TORCH must be 'shared' or 'own', got '$TORCH_MODE'"; exit 2 ;;
esac
want="recipe=$RECIPE transformers==$TRANSFORMERS_VERSION accelerate==$ACCELERATE_VERSION torch=$base python=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

ready() { [[ -f "$stamp" && "$(head -n1 "$stamp")" == "$want" && -x "$dir/bin/transformers" ]]; }

if ready; then
    echo "$dir/bin/transformers"
    exit 0
fi

mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
if ready; then  # another process finished the job while we waited for the lock
    echo "$dir/bin/transformers"
    exit 0
fi

start=$(date +%s)
rm -rf "$dir"
log "creating $dir with $PYTHON (torch: $TORCH_MODE)"
"$PYTHON" -m venv "$dir"
py="$dir/bin/python"
pip_args=(--disable-pip-version-check --no-input --progress-bar off)
reqs=("transformers[serving]==$TRANSFORMERS_VERSION" "accelerate==$ACCELERATE_VERSION")

if [[ "$TORCH_MODE" == shared ]]; then
    site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    vsite="$("$vllm_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$vsite" > "$site/rig-vllm-venv.pth"
    log "chained $vsite"
    # pip sees the chained packages as installed and keeps them (it never uninstalls outside this venv); what it
    # installs here shadows them.
    reqs+=("torch==$TORCH_VERSION+cpu")
    if [[ "$("$py" -c 'import torch; print(torch.__version__)')" != "$TORCH_VERSION+cpu" ]]; then
        log "the vLLM venv has no torch $TORCH_VERSION+cpu"; exit 1
    fi
else
    find_links="${RIG_TORCH_FIND_LINKS:-/opt/wheels}"
    if compgen -G "$find_links/torch-$TORCH_VERSION+cpu-*.whl" >/dev/null; then
        pip_args+=(--find-links "$find_links")
        reqs+=("torch==$TORCH_VERSION+cpu")
    else
        log "WARNING: no torch-$TORCH_VERSION+cpu wheel in $find_links; pip will take torch==$TORCH_VERSION from the index (on PyPI that is a multi-GB CUDA build)"
        reqs+=("torch==$TORCH_VERSION")
    fi
fi

log "installing ${reqs[*]}"
"$py" -m pip install "${pip_args[@]}" "${reqs[@]}" >&2
# Not used by a text model; torchvision from PyPI does not import beside the +cpu torch (see vllm-env.sh).
"$py" -m pip uninstall -y torchvision torchaudio torchcodec >&2 2>/dev/null || true

log "checking imports"
"$py" - >&2 <<EOF
import torch, transformers, accelerate, fastapi, uvicorn, openai
from transformers.cli.serving.server import build_server  # noqa: F401
assert transformers.__version__ == "$TRANSFORMERS_VERSION", transformers.__version__
print("torch", torch.__version__, "transformers", transformers.__version__, "accelerate", accelerate.__version__,
      "fastapi", fastapi.__version__, "uvicorn", uvicorn.__version__, "openai", openai.__version__)
EOF
"$py" -m pip freeze --all > "$dir/freeze.txt" 2>/dev/null

secs=$(( $(date +%s) - start ))
size=$(du -sm "$dir" | cut -f1)
printf '%s\ninstalled_in_s=%s size_mb=%s\n' "$want" "$secs" "$size" > "$stamp"
log "done in ${secs}s, ${size} MB"
echo "$dir/bin/transformers"
