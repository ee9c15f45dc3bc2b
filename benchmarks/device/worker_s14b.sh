#!/usr/bin/env bash
# Session 14's third lease (issue 16): the floor runs worker_s14 did not reach before its machine
# was taken back (3x online twice more, offline once), at the same engine code (50df551), in one
# call: setup.sh worker_s14b && collect.sh 420 (~2.5 min setup, ~4 min jobs).
WORKER=s14b
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_n
M="--model llama-3-8b"
B3="gpuchef bench $M --dataset azure-conv --num-prompts 600 --trace-speed 3 --sample-hz 0"
job s14b_01_offline 300 "python3 benchmarks/bench_vllm_host.py --run native --out $R/peer && cp $R/peer/native.json $R/native_offline.json"
job s14b_02_3x_rep2 200 "$B3 --result-json $R/native_3x_rep2.json"
job s14b_03_3x_rep3 200 "$B3 --result-json $R/native_3x_rep3.json"
touch $F/s14b_done
