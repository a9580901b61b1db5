#!/bin/bash
# Scale-out on the device's 16 CPU cores, in one call of at most ~235 s: install rig's wheelhouse (no network there),
# run benchmarks/scale_out.py with N = 1, 2, 4, 8 generators, then the control plane at 256 generators on 16 fake
# nodes if the time left allows it. Everything lands under $OUT (the lead commits the figures).
#
#   run (repo root, carry .cache/device-payload):  bash benchmarks/gpu/scale_out_device.sh
#   env: OUT (default /tmp/scale-out), WH (default .cache/device-payload/wh), PY (default python3),
#        BUDGET_S (default 235), SITE (default /tmp/rig-site), SCALE_ARGS (scale_out.py's arguments instead of the
#        16-core ones below), CP_ARGS (control_plane.py's), CP_NEEDS_S (seconds the control plane needs, 105),
#        CP_CPUS (its cores, 2-15), CONTROL_PLANE (0: no control plane, the scale-out gets the whole budget)
set -u
T0=$(date +%s)
OUT=${OUT:-/tmp/scale-out}; WH=${WH:-.cache/device-payload/wh}; PY=${PY:-python3}; BUDGET_S=${BUDGET_S:-235}
SITE=${SITE:-/tmp/rig-site}
mkdir -p "$OUT"
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
log() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/steps.txt"; }
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

# run_capped SECONDS LOGFILE CMD...: CMD in its own process group, killed with its group (Ray's raylets and
# workers included) when it runs past SECONDS, so the next step starts on idle cores; its exit status
run_capped() {
  local cap=$1 logf=$2; shift 2
  setsid "$@" > "$logf" 2> "${logf%.txt}.stderr.txt" < /dev/null &
  local pid=$! t=$(date +%s)
  while kill -0 $pid 2>/dev/null; do
    if [ $(( $(date +%s) - t )) -ge "$cap" ]; then
      log "  past its ${cap}s: stopping it (SIGINT, then the group)"
      kill -INT -- -$pid 2>/dev/null; sleep 3; kill -KILL -- -$pid 2>/dev/null; break
    fi
    sleep 1
  done
  wait $pid  # (Ray's raylets and GCS are in that group, and die with their parent besides)
}

log "machine: $(nproc) cores, $($PY --version 2>&1), $(free -g | awk '/Mem:/ {print $2}') GiB"
{ nproc; lscpu 2>/dev/null | head -20; $PY --version; } > "$OUT/machine.txt" 2>&1
if [ -f "$SITE/.ok" ]; then  # installed already (benchmarks/gpu/h200_queue.sh marks its install so)
  echo "using the install in $SITE" > "$OUT/install.txt"
elif ! $PY scripts/wheelhouse.py install "$WH" --target "$SITE" > "$OUT/install.txt" 2>&1; then
  log "install FAILED:"; tail -20 "$OUT/install.txt"; exit 1
fi
export PYTHONPATH=$PWD:$SITE  # this tree's rig first (the wheel's copy is older), the wheels' packages after
if ! $PY -c 'import ray, pydantic, msgspec, orjson, uvloop, pyarrow, rig.run.runner; print("ray", ray.__version__)' \
    >> "$OUT/install.txt" 2>&1; then
  log "import FAILED:"; tail -20 "$OUT/install.txt"; exit 1
fi
log "installed: $(tail -1 "$OUT/install.txt")"

# 16 cores: server 0-5 (six truth-server processes), driver + Ray 6-7, generators 8-15 (one each)
# N=8 right after N=1 (its baseline): were the cap to cut the step short, the figure that matters is in
SCALE_ARGS=${SCALE_ARGS:---n 1,8,4,2 --level-s 3 --server-cpus 0-5 --driver-cpus 6-7 --gen-cpus 8-15 --capacity-s 1.5}
CP_ARGS=${CP_ARGS:---nodes 16 --per-host 16 --requests 2560 --concurrency 256}; CP_NEEDS_S=${CP_NEEDS_S:-105}
CP_CPUS=${CP_CPUS:-2-15}  # as in the 256-generator figures of tests/data/h200-2026-12-02/control_plane_256.txt
CONTROL_PLANE=${CONTROL_PLANE:-1}; [ "$CONTROL_PLANE" = 0 ] && CP_NEEDS_S=3
cap=$(( $(left) - CP_NEEDS_S < 150 ? $(left) - CP_NEEDS_S : 150 ))
[ $cap -lt 60 ] && cap=60  # the scale-out comes first: the control plane at 256 was measured before
log "scale_out.py $SCALE_ARGS (cap ${cap}s)"
# shellcheck disable=SC2086
run_capped $cap "$OUT/scale_out.txt" $PY benchmarks/scale_out.py $SCALE_ARGS --json "$OUT/scale_out.json"
log "scale_out.py exit $?"
cat "$OUT/scale_out.txt"

if [ "$CONTROL_PLANE" = 0 ]; then
  log "control plane not asked for (CONTROL_PLANE=0)"
elif [ "$(left)" -ge "$CP_NEEDS_S" ]; then
  log "control_plane.py $CP_ARGS (cap $(( $(left) - 3 ))s)"
  # shellcheck disable=SC2086
  run_capped $(( $(left) - 3 )) "$OUT/control_plane_256.txt" taskset -c "$CP_CPUS" \
    $PY benchmarks/control_plane.py $CP_ARGS
  log "control_plane.py exit $?"
  cat "$OUT/control_plane_256.txt"
else
  log "control plane skipped: $(left)s left (it needs ~${CP_NEEDS_S} s)"
fi
log "done"
