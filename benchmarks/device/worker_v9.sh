#!/usr/bin/env bash
# Session 9's lease, beside worker_s9.sh: vLLM 0.24 from the parts the collect calls carry
# (.vp00 … .vp07: one tar of its dependencies, stub-missing.sh and the 279 MB wheel, split in
# 44 MiB parts so that each fits the 64 MiB carry with the tree), installed while the GPU tests
# run (CPU only); then, once worker_s9 flags s9_gpu1_done, issue 14's attach check
# (vllm_attach_check.sh). Flags: vllm_ready / vllm_failed, v9_done.
# Dry run: DRY=0.1 RES=/tmp/dres FLAGS=/tmp/dflags GDIR=$PWD bash benchmarks/device/worker_v9.sh
WORKER=v9
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
NPARTS=${NPARTS:-8}
have_parts() { [ $(ls $F/vp_* 2>/dev/null | wc -l) -ge $NPARTS ]; }
for i in $(seq 1 360); do have_parts && break; [ -n "$DRY" ] && break; sleep 5; done
if [ -z "$DRY" ]; then
  {
    have_parts || { echo "only $(ls $F/vp_* 2>/dev/null | wc -l) of $NPARTS parts came"; false; } &&
    mkdir -p /tmp/vstage && cat /tmp/vp/vpk.part.* | tar -xf - -C /tmp/vstage &&
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite \
      /tmp/vstage/vdeps/*.whl /tmp/vstage/vllm-0.24.0-*.whl &&
    PYTHONPATH=/tmp/vsite bash /tmp/vstage/vdeps/stub-missing.sh &&
    PYTHONPATH=$VLLM_PATH python3 -c "import vllm, flashinfer; print('vllm', vllm.__version__, 'flashinfer', flashinfer.__version__)" &&
    touch $F/vllm_ready
  } > $R/vllm_install.log 2>&1 || touch $F/vllm_failed
fi
echo "$(date +%T) vllm install: $(ls $F | grep -o 'vllm_[a-z]*' | tr '\n' ' ')" >> $R/status.txt
for i in $(seq 1 360); do [ -e $F/s9_gpu1_done ] && break; sleep 5; done
if [ -e $F/vllm_ready ] || [ -n "$DRY" ]; then
  job v9_01_attach_check 720 "bash benchmarks/device/vllm_attach_check.sh $R"
fi
touch $F/v9_done
