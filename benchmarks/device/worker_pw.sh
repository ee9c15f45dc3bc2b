#!/usr/bin/env bash
# One H200 (nvidia-h200): issue 16 item 1, the piecewise CUDA graphs' first lease. Start: carry
# .whl, .snap.tgz and .fic (FlashInfer's AOT kernels), bash benchmarks/device/setup.sh worker_pw;
# then collect.sh 540 until $F/pw_done. Estimate: warm-up ~1 min (now also 33 pieces × 11 sizes
# captured; the log's "capture piecewise CUDA graphs" lines give the time), GPU tests ~6 min,
# profile ~5 min, the offline A/B 2 × ~2 min = ~16 min.
# Dry run: DRY=0.1 RES=/tmp/dres FLAGS=/tmp/dflags GDIR=$PWD bash benchmarks/device/worker_pw.sh
WORKER=pw
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_n
M="--model llama-3-8b"
AZ="--dataset azure-conv"
job pw01_warmup 420 "gpuchef bench $M $AZ --num-prompts 60 --trace-speed inf --gpus 0 --sample-hz 0"
# the piecewise tests first (new code), then the engine's other GPU tests (the default changed)
job pw02_pytest_piecewise 540 "python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine_host/test_piecewise_gpu.py"
job pw03_pytest_engine 420 "python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine_host/test_engine_gpu.py tests/engine_host/test_flashinfer_gpu.py"
# the same mixed shapes as n02 (2026-12-02), eager and piecewise side by side, + the floors
# (128 prefill tokens + 0 / + 64 decodes ≤ 8 ms; 512 + 64 ≤ 18 ms: 576 tokens, above the default
# cap of 512) and decode batches 32/64. Capture sizes to 2048 here, so that the piecewise column
# covers every shape and shows where graphs stop paying (whether the default cap should rise)
PWS=16,32,64,96,128,192,256,320,384,448,512,576,640,768,1024,2048
job pw04_profile_piecewise 480 "python3 benchmarks/profile_decode.py $M --batches 32,64 --iters 20 --prof-iters 3 --mixed 0+16,0+128,64+128,0+512,64+512,0+1024,0+2048,16+112,64+448 --cudagraph-capture-sizes $PWS --json $R/profile_piecewise.json"
# offline, first 1000 Azure requests: piecewise graphs (default) against decode graphs only
job pw05_offline_piecewise 300 "gpuchef bench $M $AZ --num-prompts 1000 --trace-speed inf --sample-hz 0 --result-json $R/offline_piecewise.json"
job pw06_offline_decode_only 300 "gpuchef bench $M $AZ --num-prompts 1000 --trace-speed inf --sample-hz 0 --cudagraph-mode FULL_DECODE_ONLY --result-json $R/offline_decode_only.json"
touch $F/pw_done
