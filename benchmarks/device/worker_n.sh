#!/usr/bin/env bash
# One H200 (nvidia-h200): the plan for the next lease (session 7). Start: carry .whl, .snap.tgz and
# .fic (FlashInfer's AOT kernels: no 4-min compile), bash benchmarks/device/setup.sh worker_n; then
# collect.sh 540 until $F/n_done. Estimate: warm-up ~1 min (graphs), profile ~3 min, GPU tests
# ~4 min, the two capacity searches ~9 min each (40 s probes, traces kept) = ~26 min.
# Dry run: DRY=0.1 RES=/tmp/dres FLAGS=/tmp/dflags GDIR=$PWD bash benchmarks/device/worker_n.sh
WORKER=n
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_n
M="--model llama-3-8b"
AZ="--dataset azure-conv"
job n01_warmup 420 "gpuchef bench $M $AZ --num-prompts 60 --trace-speed inf --gpus 0 --sample-hz 0"
# issue 16 item 1: is a step with prefill tokens launch-bound? (decides piecewise graphs)
job n02_profile_mixed 300 "python3 benchmarks/profile_decode.py $M --batches 32 --iters 20 --prof-iters 3 --mixed 0+16,0+128,0+512,0+2048,16+112,64+448 --json $R/profile_mixed.json"
# the engine's GPU tests after the scheduler-lifecycle move and async-by-default (issue 18/16)
job n03_pytest_gpu 300 "python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine_host tests/gpuchef"
# issue 15: capacity with the current rule 1, traces kept
CAP_DUR=40 CAP_PROBES=5 CAP_T=560 source $G/benchmarks/device/capacity_s.sh
touch $F/n_done
