#!/usr/bin/env bash
# One H200 (nvidia-h200), session 5 (2026-12-01): the front door (issue 13), the capacity axis
# (issue 15), the engine's GPU tests after the StepOutput change, then hosted vLLM behind the front
# door and plain `vllm serve` driven by `gpuchef bench --base-url` (issues 13/14) once vLLM is
# installed (call 8 of README.md's table). Start: bash benchmarks/device/setup.sh worker_s
WORKER=s
source /tmp/g/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$NATIVE_PATH FLASHINFER_WORKSPACE_BASE=/tmp/fic_s
M="--model llama-3-8b"
AZ="--dataset azure-conv"
# compiles FlashInfer's kernels and captures the graphs once, so the timed runs start warm
job s01_warmup 420 "gpuchef bench $M $AZ --num-prompts 60 --trace-speed inf --gpus 0 --sample-hz 0"
# issue 13: in-process vs HTTP, same arrivals, interleaved
job s02_serve_3x 420 "python3 benchmarks/bench_serve.py $M $AZ --trace-speed 3 --num-prompts 300 --rounds 1 --json $R/serve_3x.json"
# the engine's GPU tests (engine.py changed: StepOutput, stop ids, first_scheduled_ns)
job s03_pytest_gpu 300 "python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine_host/test_engine_gpu.py tests/engine_host/test_engine_async.py"
# issue 15: capacity with the offered-rate axis (commands from the capacity rework)
[ -f /tmp/g/benchmarks/device/capacity_s.sh ] && source /tmp/g/benchmarks/device/capacity_s.sh
touch $F/native_done
# vLLM: wait (up to 6 min) for the install, then hosted vLLM behind the front door, and plain
# vllm serve as an outside server; its /metrics text is captured for issue 14's parser tests
for i in $(seq 1 72); do [ -e $F/vllm_ready ] || [ -e $F/vllm_failed ] && break; sleep 5; done
if [ -e $F/vllm_ready ]; then
  export PYTHONPATH=$VLLM_PATH
  job s10_vllm_serve 360 "bash benchmarks/device/vllm_serve_smoke.sh $R"
fi
touch $F/s_done
