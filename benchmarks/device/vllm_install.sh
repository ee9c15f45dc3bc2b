#!/usr/bin/env bash
# After .vw0 … .vw5 were copied to /tmp/vdeps and /tmp/vparts: join the wheel, install vLLM into
# /tmp/vsite, write stand-ins for what plain token prompts never use, then flag vllm_ready.
source /tmp/g/benchmarks/device/env.sh
V=/tmp/vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl
{
  cat /tmp/vparts/vllm.part.0* > $V && ls -la $V &&
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite /tmp/vdeps/*.whl $V &&
  PYTHONPATH=/tmp/vsite bash /tmp/vdeps/stub-missing.sh &&
  PYTHONPATH=$VLLM_PATH python3 -c "import vllm, flashinfer; print('vllm', vllm.__version__, 'flashinfer', flashinfer.__version__)" &&
  touch $F/vllm_ready
} > $R/vllm_install.log 2>&1 || touch $F/vllm_failed
