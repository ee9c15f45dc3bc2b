#!/usr/bin/env bash
# Session 12's second job list on the same machine (after worker_s12): the decode GEMMs' BLAS
# library chosen per projection (bench_engine_step.py --blas-proj), since cuBLASLt for every
# GEMM took batch 32's steady step from 6.19 to 6.07 ms while session 9's GEMM bench saw it help
# o_proj and hurt qkv; the mixed steps under cuBLASLt; repeats of the two best settings so the
# noise can be read. Started by hand: tar -xzf .snap.tgz -C /tmp/g, then
# setsid nohup bash /tmp/g/benchmarks/device/worker_s12b.sh (it waits for s12_done).
WORKER=s12b
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_n
while [ ! -e $F/s12_done ] && [ -z "$DRY" ]; do sleep 2; done
M="--model llama-3-8b"
STEP="python3 benchmarks/bench_engine_step.py $M --steady --decode-batches 32,64,128 --rope-append fused"
PROF="python3 benchmarks/profile_decode.py $M --iters 20 --prof-iters 1 --batches 32 --mixed 0+128,64+128,64+512,16+112"
job s12b_01_lt_but_qkv 200 "$STEP --blas cublaslt --blas-proj qkv_proj=cublas --json $R/b_lt_but_qkv.json"
job s12b_02_o_lt 200 "$STEP --blas-proj o_proj=cublaslt --json $R/b_o_lt.json"
job s12b_03_o_down_lt 200 "$STEP --blas-proj o_proj=cublaslt,down_proj=cublaslt --json $R/b_o_down_lt.json"
job s12b_04_lt_o_down 200 "$STEP --blas cublaslt --blas-proj qkv_proj=cublas,gate_up_proj=cublas --json $R/b_lt_o_down.json"
job s12b_05_lt_again 200 "$STEP --blas cublaslt --json $R/b_lt_again.json"
job s12b_06_fused_again 200 "$STEP --json $R/b_fused_again.json"
job s12b_07_mixed_lt_fep 200 "TORCH_BLAS_PREFER_CUBLASLT=1 $PROF --rope-append fused-except-piecewise --json $R/b_mixed_lt_fep.json"
job s12b_08_mixed_sep_again 200 "$PROF --rope-append separate --json $R/b_mixed_sep_again.json"
touch $F/s12b_done
