#!/usr/bin/env bash
# Session 13's lease (issue 16). In order of need:
# (1) pytest -m gpu at this commit (the in-piece RoPE + append of session 12 never ran on a GPU;
#     the new block-size and split-KV tests), and the Triton kernel's own tests compiled;
# (2) decode attention alone by page size, page layout and split-KV plan
#     (bench_decode_attention.py: block 16/32/64, NHD/HND, fi_tc / nosplit / fixed splits);
# (3) the steady decode step by page size and split-KV (bench_engine_step.py --steady);
# (4) mixed steps: RoPE + append inside the pieces (mode fused) against fused-except-piecewise,
#     and at block 32 (profile_decode.py);
# (5) 3x online: fused in the pieces, block 32, and the defaults again in the same lease;
# (6) offline at the defaults (the step breakdown) and at block 32.
# Estimate: setup ~2.5 min, (1) ~2, (2) ~2 (HND dropped: not adoptable without a cache-layout change), (3) ~2.5, (4) ~1.5, (5) ~3.5, (6) ~2.
# Start: carry .whl and .snap.tgz; bash benchmarks/device/setup.sh worker_s13 && collect.sh 120,
# then collect.sh 300-400 chained, no gap, until s13_done.
# Dry run: DRY=0.1 RES=/tmp/dres FLAGS=/tmp/dflags GDIR=$PWD bash benchmarks/device/worker_s13.sh
WORKER=s13
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_n
M="--model llama-3-8b"
AZ="--dataset azure-conv"
PYT="python3 -m pytest -m gpu -q -p no:cacheprovider -rs"
STEP="python3 benchmarks/bench_engine_step.py $M --steady --decode-batches 32,64,128"
PROF="python3 benchmarks/profile_decode.py $M --iters 20 --prof-iters 1 --batches 32 --mixed 0+128,64+128,64+512,16+112"
ATT="python3 benchmarks/bench_decode_attention.py $M --batches 32,64,128,256"
B3="gpuchef bench $M $AZ --num-prompts 600 --trace-speed 3 --sample-hz 0"
# (1)
job s13_01_pytest_gpu 720 "python3 -m pytest -q -p no:cacheprovider tests/engine_host/test_rope_append.py; $PYT tests/engine_host tests/gpuchef tests/probes tests/tui"
# (2)
job s13_02_attn_b16 150 "$ATT --kernels fi_tc,fi_tc_nosplit,fi_tc_fs8,fi_tc_fs16,fi_tc_fs32 --json $R/attn_b16_NHD.json"
job s13_03_attn_b32 150 "$ATT --kernels fi_tc,fi_tc_nosplit,fi_tc_fs8 --block-size 32 --json $R/attn_b32_NHD.json"
job s13_04_attn_b64 150 "$ATT --kernels fi_tc,fi_tc_nosplit,fi_tc_fs4 --block-size 64 --json $R/attn_b64_NHD.json"
# (3)
job s13_06_steady_default 200 "$STEP --json $R/steady_default.json"
job s13_07_steady_b32 200 "$STEP --block-size 32 --json $R/steady_b32.json"
job s13_08_steady_b64 200 "$STEP --block-size 64 --json $R/steady_b64.json"
job s13_09_steady_nosplit 200 "GPUCHEF_DECODE_SPLIT_KV=off $STEP --json $R/steady_nosplit.json"
job s13_10_steady_fs16 200 "GPUCHEF_DECODE_SPLIT_KV=16 $STEP --json $R/steady_fs16.json"
# (4)
job s13_11_mixed_fused 200 "$PROF --rope-append fused --json $R/mixed_fused.json"
job s13_12_mixed_fep 200 "$PROF --rope-append fused-except-piecewise --json $R/mixed_fep.json"
job s13_13_mixed_b32 200 "$PROF --block-size 32 --json $R/mixed_b32.json"
# (5)
job s13_14_3x_fused 300 "GPUCHEF_ROPE_APPEND=fused $B3 --result-json $R/native_3x_fused.json"
job s13_15_3x_b32 300 "$B3 --block-size 32 --result-json $R/native_3x_b32.json"
job s13_16_3x_default 300 "$B3 --result-json $R/native_3x_default.json"
# (6) offline: its JSON now holds the step breakdown (where the GPU time goes, by step kind)
job s13_17_offline_default 420 "python3 benchmarks/bench_vllm_host.py --run native --out $R/peer && cp $R/peer/native.json $R/native_offline.json"
job s13_18_offline_b32 420 "python3 benchmarks/bench_vllm_host.py --run native --block-size 32 --out $R/peer_b32"
touch $F/s13_done
