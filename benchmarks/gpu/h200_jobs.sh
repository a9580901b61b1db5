#!/bin/bash
# The job queue that benchmarks/gpu/h200_queue.sh starts (in its own process session): trained models and SGLang's
# recorded responses side by side, then rig's sweeps against SGLang 0.5.17 on the H200. Each job leaves /tmp/q/JOB.done or
# JOB.failed, so a queue started again skips what is done. usage: h200_jobs.sh REPO [JOB...]
# (JOB: standalone ngram prove eagle twin vllm_prove vllm_draft scale_out scale_out16 scale_out16c, in the order given, after the training; default: prove
# scale_out)
set -u
REPO=$1; shift; cd "$REPO"
JOBS=("$@"); [ ${#JOBS[@]} -gt 0 ] || JOBS=(prove scale_out)
Q=/tmp/q; R=$Q/res; RUNS=$Q/runs; SPEC=/tmp/spec; mkdir -p $R $RUNS
log() { echo "[$(date +%H:%M:%S)] $*"; }
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1
# What every SGLang launch gets: no FA3 in the carried kernels (triton attention), no flashinfer sampling JIT,
# no prefill CUDA graph (its first capture compiles for 80+ s per model shape), decode graphs up to batch 64.
SGL_ARGS=(--attention-backend triton --sampling-backend pytorch --cuda-graph-backend-prefill disabled
          --cuda-graph-max-bs-decode 64)
# vLLM's: the target's whole context (8,192: realistic prompts and replies fit) and half the GPU (the rest for
# the draft's and CUDA graphs' own memory)
VLLM_ARGS=(--server-arg=--max-model-len --server-arg=8192 --server-arg=--gpu-memory-utilization --server-arg=0.5)
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
  env -u PYTHONPATH taskset -c 0-11 python3 -m rig.server.spec_models $SPEC && cp $SPEC/train_report.json $R/
}

record() {  # SGLang's own responses (STANDALONE, so meta_info has its speculative fields), beside the training:
  # the 4-layer random model of rig.server.tiny_model as target and draft, a fifth of the GPU's memory
  local port=31000 d=$R/recorded
  mkdir -p $d
  wait_for /tmp/site/.ok 900 || { echo "SGLang is not installed"; return 1; }
  env -u PYTHONPATH python3 -m rig.server.tiny_model /tmp/mtiny || return 1
  local cmd=(/tmp/sglpy -m sglang.launch_server --model-path /tmp/mtiny --host 127.0.0.1 --port $port
             --enable-metrics --enable-cache-report "${SGL_ARGS[@]}" --mem-fraction-static 0.2
             --speculative-algorithm STANDALONE --speculative-draft-model-path /tmp/mtiny
             --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4)
  echo "${cmd[*]}" > $d/command.txt
  setsid taskset -c 12-15 "${cmd[@]}" > $d/server.log 2>&1 < /dev/null &
  local pid=$! t=$(date +%s) ok=0
  while kill -0 $pid 2>/dev/null && [ $(( $(date +%s) - t )) -lt 400 ]; do
    curl -sf -m 5 http://127.0.0.1:$port/health > /dev/null && { ok=1; break; }
    sleep 2
  done
  echo "ready=$ok after $(( $(date +%s) - t )) s" | tee $d/ready.txt
  [ $ok = 1 ] && python3 scripts/record_sglang.py --url http://127.0.0.1:$port --out $d --label standalone \
      --rid-reuse --long-tokens 3500 --model /tmp/mtiny --log $d/server.log --command "$(cat $d/command.txt)"
  local rc=$?
  kill -TERM -- -$pid 2>/dev/null; sleep 5; kill -KILL -- -$pid 2>/dev/null
  [ $ok = 1 ] && [ $rc = 0 ]
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
ngram() {  # steps 0 is the standalone sweep's; NGRAM drafts by draft tokens (rig labels the point by them)
  sweep ngram --steps 3 --spec-algorithm NGRAM --workload greedy,realistic --concurrency 1,4,16,64
}
prove() {  # the campaign's question on the GPU: static steps 0-4, the schedule read off them (an SGLang adaptive
  # config, one candidate per slot; no arm when one setting wins every band) and SGLang's own controller (0.5.17:
  # only from its largest tier, 7: its logits buffer is sized at startup), EAGLE with the trained head, on the same
  # requests; its static points are also the twin's fit (rig sim fit --hold-out)
  if [ -f $RUNS/prove/manifest.json ]; then
    rig sweep --resume $RUNS/prove
  else
    rig prove --engine sglang --engine-python /tmp/sglpy --model $SPEC/target --tp 1 --out $RUNS --run-id prove \
      --spec-algorithm EAGLE --draft-model $SPEC/eagle --steps 1,2,3,4 --adaptive-steps 7 --concurrency 1,4,16,64 \
      --workload greedy,realistic $(server_args)
  fi
}
eagle() {
  sweep eagle --steps 1,3 --spec-algorithm EAGLE --draft-model $SPEC/eagle --workload greedy,realistic \
    --concurrency 1,4,16,64
}

twin() {  # the twin's fit data (issue 28 item 5): every fixed setting of the proof, EAGLE with the trained head,
  # bound by duration (TWIN_S seconds a point, 8 by default; a grace long enough that no request is cut) so that
  # each point holds tens to hundreds of requests instead of the proof's 4-128; then `rig sim fit RUN --hold-out`
  # off the device
  sweep twin --steps 0,1,2,3,4 --spec-algorithm EAGLE --draft-model $SPEC/eagle --workload greedy,realistic \
    --concurrency 1,4,16,64 --duration ${TWIN_S:-8} --grace 15
}
scale_out16c() {  # closed loop alone, 16 streams per generator core, after the lazy share stopped building the
  # other generators' sessions (the loop lag that grew with N): N = 8 first, then 1 and 4
  OUT=$R/scale16c SITE=/tmp/rig-site BUDGET_S=100 CONTROL_PLANE=0 SCALE_ARGS="--n 8,1,4 --modes closed --level-s 3 \
--server-cpus 0-5 --driver-cpus 6-7 --gen-cpus 8-15 --capacity-s 0 --per-gen-concurrency 16" \
    bash benchmarks/gpu/scale_out_device.sh
}

vllm_prove() {  # issue 29 item 6 on the GPU: vLLM 0.26.0 (its torch pin is the node's), ngram, every static K and
  # the schedule arm read off them (vLLM's num_speculative_tokens_per_batch_size) on the same requests; no adaptive arm
  wait_for /tmp/vsite/.ok 1200 || { echo "vLLM is not installed"; return 1; }
  if [ -f $RUNS/vllm_prove/manifest.json ]; then
    rig sweep --resume $RUNS/vllm_prove
  else
    rig prove --engine vllm --engine-python /tmp/vllmpy --model $SPEC/target --tp 1 --out $RUNS --run-id vllm_prove \
      --spec-method ngram --steps 1,2,3,4 --concurrency 1,4,16,64 --workload greedy,realistic "${VLLM_ARGS[@]}"
  fi
}
vllm_draft() {  # issue 28 item 6: vLLM with the trained standalone draft (method draft_model), steps 0 and 3
  wait_for /tmp/vsite/.ok 1200 || { echo "vLLM is not installed"; return 1; }
  if [ -f $RUNS/vllm_draft/manifest.json ]; then
    rig sweep --resume $RUNS/vllm_draft
  else  # not sweep(): SGLang's launch flags are not vLLM's
    rig sweep --engine vllm --engine-python /tmp/vllmpy --model $SPEC/target --tp 1 --out $RUNS --run-id vllm_draft \
      --spec-method draft_model --draft-model $SPEC/draft --steps 0,3 --workload greedy,realistic \
      --concurrency 1,4,16,64 "${VLLM_ARGS[@]}"
  fi
}

scale_out() {  # issue 30 on the machine's 16 cores once the GPU work is done (the GPU idle): N = 1, 8, 4, 2, then
  # the control plane at 256 generators; rig from the queue's install
  OUT=$R/scale SITE=/tmp/rig-site BUDGET_S=270 bash benchmarks/gpu/scale_out_device.sh
}
scale_out16() {  # the same with 16 streams (100 requests/s) per generator core, where its loop should read every
  # stream before the server's next write (2 ms); no control plane
  OUT=$R/scale16 SITE=/tmp/rig-site BUDGET_S=150 CONTROL_PLANE=0 SCALE_ARGS="--n 1,8,4 --level-s 3 --server-cpus 0-5 \
--driver-cpus 6-7 --gen-cpus 8-15 --capacity-s 0 --per-gen-concurrency 16 --per-gen-rate 100" \
    bash benchmarks/gpu/scale_out_device.sh
}

log "queue start in $REPO (jobs after the training: ${JOBS[*]})"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt 2>&1
REC=
if [ "${RECORD:-1}" = 1 ]; then  # RECORD=0: a session without SGLang's payload (vLLM alone)
  ( job record record ) &  # not a measurement: beside the training
  REC=$!
fi
job train train
[ -n "$REC" ] && wait $REC
wait_for /tmp/rig-site/.ok 900 || { log "rig is not installed"; exit 1; }
for j in "${JOBS[@]}"; do job "$j" "$j"; done
touch $Q/all.done
log "queue done"
