#!/usr/bin/env bash
# One H200 (nvidia-h200), session 12's lease: issue 16 with RoPE and the K/V append fused into
# one Triton kernel (engine_host/rope_append.py, ops.ROPE_APPEND, on by default) and the BLAS
# experiments for the decode GEMMs. In order of need:
# (1) the new kernel's and the engine's GPU tests (compiled Triton against FlashInfer's RoPE +
#     write_kv; greedy tokens through graphs, each RoPE mode, equal to eager);
# (2) the steady decode step (batch 32/64/128, sync and async): separate kernels, fused, fused
#     with cuBLASLt preferred, fused with TunableOp;
# (3) the decode + mixed profile with the fused kernel (the per-kernel split), and the mixed
#     steps with each RoPE mode (is the eager Triton launch between the pieces worth it?);
# (4) the floor runs with the winning mode (benchmarks/device/pick_s12.py): 3x online, offline;
# (5) the rest of pytest -m gpu at this commit.
# Estimate: setup ~2 min, (1) ~3, (2) ~6, (3) ~4, (4) ~3, (5) ~2.
# Start: carry .whl and .snap.tgz; bash benchmarks/device/setup.sh worker_s12 && collect.sh 100,
# then collect.sh 400 chained, no gap, until s12_done.
# Dry run: DRY=0.1 RES=/tmp/dres FLAGS=/tmp/dflags GDIR=$PWD bash benchmarks/device/worker_s12.sh
WORKER=s12
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_n
M="--model llama-3-8b"
AZ="--dataset azure-conv"
PYT="python3 -m pytest -m gpu -q -p no:cacheprovider"
STEP="python3 benchmarks/bench_engine_step.py $M --steady --decode-batches 32,64,128"
PROF="python3 benchmarks/profile_decode.py $M --iters 20 --prof-iters 1"
# (1)
job s12_01_pytest_new 420 "python3 -m pytest -q -p no:cacheprovider tests/engine_host/test_rope_append.py; $PYT tests/engine_host/test_flashinfer_gpu.py tests/engine_host/test_piecewise_gpu.py tests/engine_host/test_engine_gpu.py"
# (2)
job s12_02_steady_separate 240 "$STEP --rope-append separate --json $R/steady_separate.json"
job s12_03_steady_fused 240 "$STEP --rope-append fused --json $R/steady_fused.json"
job s12_04_steady_cublaslt 240 "$STEP --rope-append fused --blas cublaslt --json $R/steady_cublaslt.json"
job s12_05_steady_tunableop 420 "$STEP --rope-append fused --tunableop $R/tunableop.csv --json $R/steady_tunableop.json"
# (3)
job s12_06_profile_fused 300 "$PROF --batches 32,64,128 --mixed 0+128,64+128,64+512,16+112 --rope-append fused --json $R/mixed_fused.json"
job s12_07_mixed_fep 200 "$PROF --batches 32 --mixed 0+128,64+128,64+512,16+112 --rope-append fused-except-piecewise --json $R/mixed_fused-except-piecewise.json"
job s12_08_mixed_separate 200 "$PROF --batches 32 --mixed 0+128,64+128,64+512,16+112 --rope-append separate --json $R/mixed_separate.json"
# (4)
if [ -z "$DRY" ]; then
  python3 benchmarks/device/pick_s12.py $R > $R/pick.sh 2> $R/pick.log
else
  printf 'export GPUCHEF_ROPE_APPEND=fused\nexport TORCH_BLAS_PREFER_CUBLASLT=0\n' > $R/pick.sh
fi
source $R/pick.sh
echo "$(date +%T) floor runs with GPUCHEF_ROPE_APPEND=$GPUCHEF_ROPE_APPEND TORCH_BLAS_PREFER_CUBLASLT=$TORCH_BLAS_PREFER_CUBLASLT" >> $R/status.txt
job s12_09_online_3x 300 "gpuchef bench $M $AZ --num-prompts 600 --trace-speed 3 --sample-hz 0 --result-json $R/native_3x.json"
job s12_10_offline 420 "python3 benchmarks/bench_vllm_host.py --run native --out $R/peer && cp $R/peer/native.json $R/native_offline.json"
# the offline run again with the other BLAS preference (offline steps are large, compute-bound
# GEMMs: the steady decode step does not speak for them)
ALT=$(( 1 - ${TORCH_BLAS_PREFER_CUBLASLT:-0} ))
job s12_10b_offline_blas$ALT 420 "TORCH_BLAS_PREFER_CUBLASLT=$ALT python3 benchmarks/bench_vllm_host.py --run native --out $R/peer_blas$ALT"
# (5) with the defaults (the env choices off again)
unset GPUCHEF_ROPE_APPEND TORCH_BLAS_PREFER_CUBLASLT
job s12_11_pytest_rest 720 "$PYT tests/engine_host tests/gpuchef tests/probes tests/tui --deselect tests/engine_host/test_flashinfer_gpu.py --deselect tests/engine_host/test_piecewise_gpu.py --deselect tests/engine_host/test_engine_gpu.py"
touch $F/s12_done
