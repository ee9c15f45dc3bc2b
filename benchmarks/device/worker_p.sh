#!/usr/bin/env bash
# One H200 (nvidia-h200): the probes' numbers of issue 4 after the sampler's rework (3 NVML calls
# per GPU a tick, GPM NOT_SUPPORTED windows tolerated, sessions at a 0.5 ms switch interval):
# GPM GPU tests, the sampler's cost at 10/20/50 Hz (gpuchef's switch interval and Python's), and
# engine throughput with the sampler off / 20 Hz / 50 Hz, interleaved. Then the GPU tests of the
# engine code that has not run on a GPU since a121d7a.
WORKER=p
source /tmp/g/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$NATIVE_PATH FLASHINFER_WORKSPACE_BASE=/tmp/fic_p
M="--model llama-3-8b"
AZ="--dataset azure-conv"
S="python3 benchmarks/bench_sampler.py --gpus 0 --seconds 6 --rounds 6"
job p01_pytest_nvml 180 "python3 -m pytest -m gpu -q -p no:cacheprovider tests/probes/test_nvml_gpu.py"
job p02_sampler 150 "$S --json $R/sampler.json"
job p03_sampler_py5ms 150 "$S --switch-interval 0.005 --json $R/sampler_py5ms.json"
# compiles FlashInfer's kernels and captures the graphs once, so the timed runs start warm
job p04_warmup 420 "gpuchef bench $M $AZ --num-prompts 60 --trace-speed inf --gpus 0 --sample-hz 0"
for i in 1 2 3; do
  for hz in 0 20 50; do
    job p05_hz${hz}_$i 200 "gpuchef bench $M $AZ --num-prompts 400 --trace-speed inf --sample-hz $hz --gpus 0 --result-json $R/hz${hz}_$i.json"
  done
done
job p06_pytest_gpu 420 "python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine_host/test_engine_gpu.py tests/engine_host/test_flashinfer_gpu.py"
touch $F/p_done
