#!/usr/bin/env bash
# Session 12's third lease (what was left of the device budget, ~400 s): RoPE + K/V append
# inside the piecewise graphs (model.piece(kv_append=...), the step's slots and token count in
# static buffers; mode "fused"). NOT RUN in session 12: the device budget ran out while no
# machine was lent; the default stayed fused-except-piecewise. Run it next (it still fits). (1) its GPU tests; (2) the mixed steps fused against
# fused-except-piecewise (RoPE in the pieces, eager append: session 12's lease 2 default);
# (3) the 3x floor run with the default.
# Start: carry .whl and .snap.tgz; bash benchmarks/device/setup.sh worker_s12e && collect.sh 100
# Dry run: DRY=0.1 RES=/tmp/dres FLAGS=/tmp/dflags GDIR=$PWD bash benchmarks/device/worker_s12e.sh
WORKER=s12e
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_n
M="--model llama-3-8b"
PROF="python3 benchmarks/profile_decode.py $M --iters 20 --prof-iters 1 --batches 32 --mixed 0+128,64+128,64+512,16+112"
job s12e_01_pytest 300 "python3 -m pytest -q -p no:cacheprovider tests/engine_host/test_rope_append.py; python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine_host/test_piecewise_gpu.py tests/engine_host/test_engine_gpu.py"
job s12e_02_mixed_fused 150 "$PROF --rope-append fused --json $R/e_mixed_fused.json"
job s12e_03_mixed_fep 150 "$PROF --rope-append fused-except-piecewise --json $R/e_mixed_fep.json"
job s12e_04_online_3x 300 "GPUCHEF_ROPE_APPEND=fused gpuchef bench $M --dataset azure-conv --num-prompts 600 --trace-speed 3 --sample-hz 0 --result-json $R/native_3x.json"
touch $F/s12e_done
