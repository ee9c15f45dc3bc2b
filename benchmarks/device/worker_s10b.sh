#!/usr/bin/env bash
# Session 10's second lease (one H200), after the first showed XQA's decode step slower end to
# end and "auto" went back to FlashInfer's decode wrapper: (1) the AOT set packed in the first
# lease (XQA's modules in it) loads without a compile; (2) pytest -m gpu at this commit, all of
# it (FlashInfer's wrapper is the default again; XQA's own tests explicit); (3) the 3x online
# floor run with each decode kernel in one session (a pair on one machine), then offline.
# Start: carry .whl and .snap.tgz; bash benchmarks/device/setup.sh worker_s10b && collect.sh 100,
# then collect.sh 400 chained until s10b_done.
# Dry run: DRY=0.1 RES=/tmp/dres FLAGS=/tmp/dflags GDIR=$PWD bash benchmarks/device/worker_s10b.sh
WORKER=s10b
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_n
M="--model llama-3-8b"
AZ="--dataset azure-conv"
PYT="python3 -m pytest -m gpu -q -p no:cacheprovider"
job s10b_01_xqa_load 300 "python3 benchmarks/device/xqa_build.py 128:4 128:1 64:2; ls /tmp/fic_n/.cache/flashinfer/*/*/cached_ops 2>/dev/null | wc -l"
job s10b_02_pytest_gpu 720 "$PYT tests/engine_host tests/gpuchef tests/probes tests/tui"
job s10b_03_online_fi 300 "gpuchef bench $M $AZ --num-prompts 600 --trace-speed 3 --sample-hz 0 --decode-attention flashinfer --result-json $R/native_3x.json"
job s10b_04_online_xqa 300 "gpuchef bench $M $AZ --num-prompts 600 --trace-speed 3 --sample-hz 0 --decode-attention xqa --result-json $R/native_3x_xqa.json"
job s10b_05_offline 420 "python3 benchmarks/bench_vllm_host.py --run native --out $R/peer && cp $R/peer/native.json $R/native_offline.json"
touch $F/s10b_done
