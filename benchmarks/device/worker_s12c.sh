#!/usr/bin/env bash
# Session 12's second lease (the first machine went back idle after worker_s12's floor run at
# 3x; its offline run and the rest of pytest -m gpu were lost): the defaults are now RoPE + K/V
# append fused-except-piecewise and cuBLASLt on CUDA (ops.prefer_blas). In order of need:
# (1) pytest -m gpu at this commit, and the Triton kernel's own tests compiled;
# (2) the floor runs with the defaults: 3x online, offline;
# (3) BLAS per projection on the steady decode step (bench_engine_step.py --blas-proj) and the
#     default again for its noise; offline and the mixed steps with TORCH_BLAS_PREFER_CUBLASLT=0
#     (torch's cuBLAS choice), the decode + mixed profile with the defaults.
# Estimate: setup ~2 min, (1) ~3, (2) ~2.5, (3) ~4.5.
# Start: carry .whl and .snap.tgz; bash benchmarks/device/setup.sh worker_s12c && collect.sh 100,
# then collect.sh 400 chained, no gap, until s12c_done.
# Dry run: DRY=0.1 RES=/tmp/dres FLAGS=/tmp/dflags GDIR=$PWD bash benchmarks/device/worker_s12c.sh
WORKER=s12c
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_n
M="--model llama-3-8b"
AZ="--dataset azure-conv"
PYT="python3 -m pytest -m gpu -q -p no:cacheprovider"
STEP="python3 benchmarks/bench_engine_step.py $M --steady --decode-batches 32,64,128"
PROF="python3 benchmarks/profile_decode.py $M --iters 20 --prof-iters 1"
# (1)
job s12c_01_pytest_gpu 720 "python3 -m pytest -q -p no:cacheprovider tests/engine_host/test_rope_append.py; $PYT tests/engine_host tests/gpuchef tests/probes tests/tui"
# (2)
job s12c_02_online_3x 300 "gpuchef bench $M $AZ --num-prompts 600 --trace-speed 3 --sample-hz 0 --result-json $R/native_3x.json"
job s12c_03_offline 420 "python3 benchmarks/bench_vllm_host.py --run native --out $R/peer && cp $R/peer/native.json $R/native_offline.json"
# (3)
job s12c_04_steady_default 200 "$STEP --json $R/c_steady_default.json"
job s12c_05_lt_but_qkv 200 "$STEP --blas-proj qkv_proj=cublas --json $R/c_lt_but_qkv.json"
job s12c_06_o_lt_only 200 "TORCH_BLAS_PREFER_CUBLASLT=0 $STEP --blas-proj o_proj=cublaslt --json $R/c_o_lt_only.json"
job s12c_07_lt_o_down 200 "$STEP --blas-proj qkv_proj=cublas,gate_up_proj=cublas --json $R/c_lt_o_down.json"
job s12c_08_offline_cublas 420 "TORCH_BLAS_PREFER_CUBLASLT=0 python3 benchmarks/bench_vllm_host.py --run native --out $R/peer_cublas"
job s12c_09_profile 300 "$PROF --batches 32,64,128 --mixed 0+128,64+128,64+512,16+112 --json $R/c_profile.json"
job s12c_10_mixed_cublas 200 "TORCH_BLAS_PREFER_CUBLASLT=0 $PROF --batches 32 --mixed 0+128,64+128,64+512,16+112 --json $R/c_mixed_cublas.json"
job s12c_11_steady_default_again 200 "$STEP --json $R/c_steady_default2.json"
touch $F/s12c_done
