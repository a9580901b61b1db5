#!/bin/bash
# rig against real SGLang on the device's H200, as a queue of jobs that outlives each device call.
#
# Each call runs this script with whatever it carried; the script installs what arrived (idempotent), copies the
# work tree to /tmp/repo and starts the queue there in its own process session if it is not running (so it goes on
# between back-to-back calls on the warm machine), follows it until LIMIT seconds, then packs every result so far
# into $OUT/h200.tgz and returns. One call carries at most 64 MiB, so the payload goes over in two calls:
#   call 1: carry [".gpuw/c1"]                  SGLang 0.5.17's wheels (../shared/tools/sglang-h200/build_payload.sh)
#                                               the queue starts: training needs only the node's torch
#   call 2: carry [".rigwh", ".gpuw/c2"]        rig's wheelhouse (scripts/wheelhouse.py build ... --slim-ray, duckdb
#                                               left out) and sgl-deep-gemm; SGLang is launched only once both are in
#   call 3+: carry nothing                      the queue goes on
#   vLLM 0.26.0 (JOBS="vllm_prove vllm_draft" RECORD=0, no SGLang payload): call 1 carries [".rigwh"], calls 2-4
#   [".gpuv/p0"] (parts.json + part000), [".gpuv/p1"], [".gpuv/p2"], one 60 MB part each, built by
#     scripts/wheelhouse.py build /tmp/vwh --engine vllm==0.26.0 --have benchmarks/gpu/image-packages.txt \
#       --python-version 3.12 --gpu-arch sm90 --leave-out vllm-0.26.0          (72 wheels, 156 MB, 3 parts)
#     mkdir -p .gpuv/p0 .gpuv/p1 .gpuv/p2 && cp /tmp/vwh/parts.json /tmp/vwh/*part000 .gpuv/p0/ &&
#       cp /tmp/vwh/*part001 .gpuv/p1/ && cp /tmp/vwh/*part002 .gpuv/p2/        (.gpuv/ in .git/info/exclude)
#   installed into /tmp/vsite once every part is in; the training runs meanwhile
# Results come back as $OUT/h200.tgz.part-aa, -ab, ...: cat them | tar -xz
# usage: [JOBS="prove scale_out"] bash benchmarks/gpu/h200_queue.sh [LIMIT_S]     (default 540; JOBS: the jobs after
# the training, read when the queue starts)
# Jobs (benchmarks/gpu/h200_jobs.sh; each leaves /tmp/q/JOB.done or JOB.failed).
set -u
LIMIT=${1:-540}
T0=$(date +%s)
Q=/tmp/q; R=/tmp/q/res; mkdir -p $R
log() { echo "[$(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a $R/calls.log; }

# ---------------------------------------------------------------- installs (what this call carried)
if [ -d .rigwh ] && [ ! -f /tmp/rig-site/.ok ]; then
  log "installing rig's wheelhouse ($(ls .rigwh | wc -l) wheels)"
  python3 scripts/wheelhouse.py install .rigwh --target /tmp/rig-site > $R/rig-install.log 2>&1 && touch /tmp/rig-site/.ok
  tail -3 $R/rig-install.log
fi
if [ -f .gpuw/c1/payload.tar.xz ] && [ ! -f /tmp/site/.c1 ]; then
  log "installing SGLang 0.5.17 (unpack + pip --target /tmp/site)"
  rm -rf /tmp/whl && mkdir -p /tmp/whl
  python3 -c "import tarfile;tarfile.open('.gpuw/c1/payload.tar.xz','r:xz').extractall('/tmp/whl')" &&
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/whl/*.whl \
      > $R/sglang-install.log 2>&1 && touch /tmp/site/.c1
  tail -3 $R/sglang-install.log; rm -rf /tmp/whl
fi
if ls .gpuw/c2/*.whl > /dev/null 2>&1 && [ -f /tmp/site/.c1 ] && [ ! -f /tmp/site/.c2 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpuw/c2/*.whl \
    >> $R/sglang-install.log 2>&1 && touch /tmp/site/.c2
fi
[ -f /tmp/site/.c1 ] && [ -f /tmp/site/.c2 ] && touch /tmp/site/.ok
# vLLM 0.26.0 (JOBS with vllm_*): its wheelhouse's parts, one (or two) a call under .gpuv/ (the part files and
# parts.json), gathered in /tmp/vparts until every part parts.json names is there, then verified and installed
if [ -d .gpuv ] && [ ! -f /tmp/vsite/.ok ]; then
  mkdir -p /tmp/vparts && find .gpuv -type f -exec cp {} /tmp/vparts/ \;
  if python3 -c "import json,os,sys; p=json.load(open('/tmp/vparts/parts.json'))['parts']; \
sys.exit(0 if all(os.path.exists('/tmp/vparts/' + x['name']) for x in p) else 1)" 2>/dev/null; then
    log "installing vLLM 0.26.0 ($(ls /tmp/vparts | wc -l) files)"
    python3 scripts/wheelhouse.py install /tmp/vparts --target /tmp/vsite > $R/vllm-install.log 2>&1 && touch /tmp/vsite/.ok
    tail -3 $R/vllm-install.log
  else
    log "vLLM parts so far: $(ls /tmp/vparts | tr '\n' ' ')"
  fi
fi
cat > /tmp/vllmpy <<'EOS'
#!/bin/bash
export PYTHONPATH=/tmp/vsite HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_NO_USAGE_STATS=1
exec python3 "$@"
EOS
chmod +x /tmp/vllmpy
log "installed: rig $(ls /tmp/rig-site/.ok 2>/dev/null || echo no), SGLang $(ls /tmp/site/.ok 2>/dev/null || echo no)"
# The engine's interpreter: the image's python3 with SGLang's install first on the path (its transformers 5.12.1
# and tokenizers 0.22.2 shadow the image's, as SGLang pins them).
cat > /tmp/sglpy <<'EOS'
#!/bin/bash
export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
exec python3 "$@"
EOS
chmod +x /tmp/sglpy

# ---------------------------------------------------------------- the queue (runs on between calls)
if ! { [ -f $Q/queue.pid ] && kill -0 "$(cat $Q/queue.pid)" 2>/dev/null; }; then
  # Its own copy of the tree: the next call replaces this one (and removes what it does not carry).
  rm -rf /tmp/repo && mkdir -p /tmp/repo
  tar --exclude=./.gpuw --exclude=./.rigwh -cf - . | tar -C /tmp/repo -xf -
  log "starting the queue in /tmp/repo"
  # shellcheck disable=SC2086
  setsid nohup bash /tmp/repo/benchmarks/gpu/h200_jobs.sh /tmp/repo ${JOBS:-} > $R/queue.log 2>&1 < /dev/null &
  echo $! > $Q/queue.pid
else
  log "queue running (pid $(cat $Q/queue.pid)); last: $(tail -1 $R/queue.log 2>/dev/null)"
fi

# ---------------------------------------------------------------- follow it until the limit, then pack
seen=0
while [ $(( $(date +%s) - T0 )) -lt "$LIMIT" ]; do
  n=$(wc -l < $R/queue.log 2>/dev/null || echo 0)
  [ "$n" -gt "$seen" ] && { sed -n "$((seen + 1)),${n}p" $R/queue.log | cut -c1-300; seen=$n; }
  [ -f $Q/all.done ] && break
  sleep 3
done
log "packing results ($(ls $Q/*.done $Q/*.failed 2>/dev/null | xargs -n1 basename 2>/dev/null | tr '\n' ' '))"
# in parts of 15 MB (a file that comes back is at most 16 MB): cat h200.tgz.part-* | tar -xz
tar -C /tmp/q -czf - --exclude='*.safetensors' res runs 2>/dev/null | split -b 15M - "$OUT/h200.tgz.part-"
ls -la "$OUT"
