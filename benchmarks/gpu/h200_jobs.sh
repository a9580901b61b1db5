#!/bin/bash
# The job queue that benchmarks/gpu/h200_queue.sh starts (in its own process session): trained models, SGLang's
# recorded responses, then rig's sweeps against SGLang 0.5.17 on the H200. Each job leaves /tmp/q/JOB.done or
# JOB.failed, so a queue started again skips what is done. usage: h200_jobs.sh REPO
set -u
REPO=$1; cd "$REPO"
Q=/tmp/q; R=$Q/res; RUNS=$Q/runs; SPEC=/tmp/spec; mkdir -p $R $RUNS
log() { echo "[$(date +%H:%M:%S)] $*"; }
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1
# What every SGLang launch gets: no FA3 in the carried kernels (triton attention), no flashinfer sampling JIT,
# no prefill CUDA graph (its first capture compiles for 80+ s per model shape), decode graphs up to batch 64.
SGL_ARGS=(--attention-backend triton --sampling-backend pytorch --cuda-graph-backend-prefill disabled
          --cuda-graph-max-bs-decode 64)
rig() { PYTHONPATH=/tmp/rig-site python3 -c 'import sys; from rig.cli import main; sys.argv[0] = "rig"; main()' "$@"; }
server_args() { for a in "${SGL_ARGS[@]}"; do printf -- '--server-arg=%s\n' "$a"; done; }

job() {  # job NAME FUNCTION: run once; its output in $R/NAME.log
  local name=$1; shift
  [ -f $Q/$name.done ] && { log "job $name: done before"; return 0; }
  [ -f $Q/$name.failed ] && { log "job $name: failed before, skipped"; return 1; }
  log "job $name: start"
  local t=$(date +%s)
  if "$@" > $R/$name.log 2>&1; then
    touch $Q/$name.done; log "job $name: done in $(( $(date +%s) - t )) s"
  else
    touch $Q/$name.failed; log "job $name: FAILED after $(( $(date +%s) - t )) s:"; tail -15 $R/$name.log | cut -c1-300
  fi
}

wait_for() {  # wait_for FILE SECONDS
  local i=0
  while [ ! -f "$1" ] && [ $i -lt "$2" ]; do sleep 5; i=$((i + 5)); done
  [ -f "$1" ]
}

train() {
  env -u PYTHONPATH taskset -c 0,1 python3 -m rig.server.spec_models $SPEC && cp $SPEC/train_report.json $R/
}

scale() {  # the scale-out benchmark on the CPUs (benchmarks/device_scale.sh), else the control plane at 256
  mkdir -p $R/scale
  if [ -f benchmarks/device_scale.sh ]; then
    OUT=$R/scale PYTHONPATH=/tmp/rig-site bash benchmarks/device_scale.sh
  else
    PYTHONPATH=/tmp/rig-site timeout 400 taskset -c 2-15 python3 benchmarks/control_plane.py --nodes 16 \
      --per-host 16 --requests 2560 --concurrency 256 | tee $R/scale/control_plane_256.txt
  fi
}

record() {  # SGLang's own responses, with EAGLE + adaptive speculation (the configuration richest in fields)
  local port=31000 d=$R/recorded
  mkdir -p $d
  local cmd=(/tmp/sglpy -m sglang.launch_server --model-path $SPEC/target --host 127.0.0.1 --port $port
             --enable-metrics --enable-cache-report "${SGL_ARGS[@]}" --speculative-algorithm EAGLE
             --speculative-draft-model-path $SPEC/eagle --speculative-num-steps 3 --speculative-eagle-topk 1
             --speculative-num-draft-tokens 4 --speculative-adaptive)
  echo "${cmd[*]}" > $d/command.txt
  setsid "${cmd[@]}" > $d/server.log 2>&1 < /dev/null &
  local pid=$! t=$(date +%s) ok=0
  while kill -0 $pid 2>/dev/null && [ $(( $(date +%s) - t )) -lt 400 ]; do
    curl -sf -m 5 http://127.0.0.1:$port/health > /dev/null && { ok=1; break; }
    sleep 2
  done
  echo "ready=$ok after $(( $(date +%s) - t )) s" | tee $d/ready.txt
  [ $ok = 1 ] && python3 scripts/record_sglang.py --url http://127.0.0.1:$port --out $d --label eagle-adaptive \
      --rid-reuse --log $d/server.log --command "$(cat $d/command.txt)"
  kill -TERM -- -$pid 2>/dev/null; sleep 5; kill -KILL -- -$pid 2>/dev/null
  [ $ok = 1 ]
}

sweep() {  # sweep RUN_ID RIG_ARGS...: a rig sweep against SGLang, resumed if an earlier call left it unfinished
  local id=$1; shift
  local common=(--engine sglang --engine-python /tmp/sglpy --model $SPEC/target --tp 1 --out $RUNS)
  if [ -f $RUNS/$id/manifest.json ]; then
    rig sweep --resume $RUNS/$id
  else
    rig sweep "${common[@]}" --run-id $id "$@" $(server_args)
  fi
}

standalone() {
  sweep standalone --steps 0,1,2,3,4 --spec-algorithm STANDALONE --draft-model $SPEC/draft \
    --workload greedy,realistic --concurrency 1,4,16,64
}
eagle() {
  sweep eagle --steps 1,3 --spec-algorithm EAGLE --draft-model $SPEC/eagle --workload greedy,realistic \
    --concurrency 1,4,16,64 &&
  sweep adaptive --steps 3 --spec-algorithm EAGLE --draft-model $SPEC/eagle --workload greedy,realistic \
    --concurrency 1,4,16,64 --server-arg=--speculative-adaptive
}
ngram() {
  sweep ngram --steps 3,11 --spec-algorithm NGRAM --workload greedy,realistic --concurrency 1,4,16,64
}

log "queue start in $REPO ($(git log --oneline -1 2>/dev/null || echo 'no git'))"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt 2>&1
wait_for /tmp/rig-site/.ok 600 || { log "rig is not installed"; exit 1; }
( job scale scale ) &
SCALE=$!
job train train
wait_for /tmp/site/.ok 1200 || { log "SGLang is not installed"; exit 1; }
job record record  # not a measurement: it may run beside the scale-out benchmark
wait $SCALE  # the sweeps measure: nothing else on the CPUs
job standalone standalone
job eagle eagle
job ngram ngram
touch $Q/all.done
log "queue done"
