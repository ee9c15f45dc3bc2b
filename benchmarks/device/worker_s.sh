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
# vLLM (installed by call 8 meanwhile): hosted vLLM behind the front door (eager: no compile),
# driven by bench --base-url; its /metrics kept. Skipped if the install is not there yet.
if [ -e $F/vllm_ready ]; then
  job s10_vllm_serve 300 "PYTHONPATH=$VLLM_PATH ENG_EXTRA=--enforce-eager bash benchmarks/device/vllm_serve_smoke.sh $R"
else
  echo "$(date +%T) skip  s10_vllm_serve (vLLM not installed yet)" >> $R/status.txt
fi
# issue 15: capacity with the offered-rate axis
source /tmp/g/benchmarks/device/capacity_s.sh
touch $F/s_done
