#!/usr/bin/env bash
# Session 10's last minutes of device time (one H200): the engine's whole decode step in steady
# state, sync against async scheduling, at the batches (bench_engine_step.py --steady),
# with FlashInfer's decode wrapper (the default) — the decode floor as the engine runs it.
# Start: carry .whl and .snap.tgz; bash benchmarks/device/setup.sh worker_s10c && collect.sh 200.
WORKER=s10c
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_n
job s10c_01_steady 240 "python3 benchmarks/bench_engine_step.py --model llama-3-8b --steady --decode-batches 32,64,128 --steady-steps 60 --json $R/steady.json"
touch $F/s10c_done
