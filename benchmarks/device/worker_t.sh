#!/usr/bin/env bash
# One H200 (nvidia-h200), session 6 (2026-12-01): issue 15's capacity searches on the offered-rate
# axis (continuous vs chunked, chunked 512 vs 2048), issue 16 item 4 (FlashInfer's kernels packed
# as an AOT set and checked with JIT disabled), then, if the lease lasts, a first look at issue
# 17's autopilot against the static 2048 budget. Start: bash benchmarks/device/setup.sh worker_t;
# then collect.sh 540 until $F/t_done; the last call copies /tmp/aotpack/* to $OUT.
# Dry run on a CPU: DRY=0.2 RES=/tmp/dres FLAGS=/tmp/dflags GDIR=$PWD bash benchmarks/device/worker_t.sh
WORKER=t
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_t
M="--model llama-3-8b"
AZ="--dataset azure-conv"
# compiles FlashInfer's kernels and captures the graphs once, so the timed runs start warm
job t01_warmup 420 "gpuchef bench $M $AZ --num-prompts 60 --trace-speed inf --gpus 0 --sample-hz 0"
job t02_aot_pack 240 "bash benchmarks/device/aot_pack.sh pack /tmp/fic_t /tmp/aotpack"
# the packed set alone: installed into the site, an empty JIT cache and JIT disabled; any kernel
# missing from the set raises MissingJITCacheError instead of compiling
job t03_aot_check 300 "bash benchmarks/device/aot_pack.sh install /tmp/aotpack $NATIVE_PATH && \
  time FLASHINFER_WORKSPACE_BASE=/tmp/fic_empty FLASHINFER_DISABLE_JIT=1 gpuchef bench $M $AZ \
  --num-prompts 60 --trace-speed inf --gpus 0 --sample-hz 0"
# issue 15: capacity with the offered-rate axis
source $G/benchmarks/device/capacity_s.sh
# issue 17, a first look (the full sweep is worker_ap.sh's)
CAPA="--capacity --slo itl_p99:50ms,ttft_p50:2s --rate-lo 2 --rate-hi 64 --tolerance 10% --max-probes 4 --duration 25 --gpus 0"
job t30_cap_2048_auto 420 "gpuchef ab $M $AZ $CAPA --a mode=chunked,max_num_batched_tokens=2048 --b mode=chunked,max_num_batched_tokens=4096,auto_budget=itl_p99:50ms,ttft_p50:2s --result-json $R/ap_cap_2048_auto.json"
touch $F/t_done
