#!/usr/bin/env bash
# Session 14's lease (issue 16), the final-commit runs: pytest -m gpu at this commit (the
# fixed-split refusal; this session's first lease (worker_s13.sh) ran at f41a787 and one test failed:
# a decode graph captured with fixed_split_size replays wrong outputs), then the floor runs at
# the defaults: 3x online three times, offline twice (its JSON holds the step breakdown), the
# steady decode step once.
# Estimate: setup ~2.5 min, pytest ~1.8, 3x 3 × ~1.2, offline 2 × ~1, steady ~0.5 → ~11 min.
# Start: carry .whl and .snap.tgz; bash benchmarks/device/setup.sh worker_s14 && collect.sh 120,
# then collect.sh 300-400 chained, no gap, until s14_done.
# Dry run: DRY=0.1 RES=/tmp/dres FLAGS=/tmp/dflags GDIR=$PWD bash benchmarks/device/worker_s14.sh
WORKER=s14
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_n
M="--model llama-3-8b"
B3="gpuchef bench $M --dataset azure-conv --num-prompts 600 --trace-speed 3 --sample-hz 0"
job s14_01_pytest_gpu 720 "python3 -m pytest -q -p no:cacheprovider tests/engine_host/test_rope_append.py; python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/engine_host tests/gpuchef tests/probes tests/tui"
job s14_02_3x 300 "$B3 --result-json $R/native_3x.json"
job s14_03_offline 420 "python3 benchmarks/bench_vllm_host.py --run native --out $R/peer && cp $R/peer/native.json $R/native_offline.json"
job s14_04_3x_rep2 300 "$B3 --result-json $R/native_3x_rep2.json"
job s14_05_steady 200 "python3 benchmarks/bench_engine_step.py $M --steady --decode-batches 32,64,128 --json $R/steady.json"
job s14_06_3x_rep3 300 "$B3 --result-json $R/native_3x_rep3.json"
job s14_07_offline_rep2 420 "python3 benchmarks/bench_vllm_host.py --run native --out $R/peer2"
touch $F/s14_done
