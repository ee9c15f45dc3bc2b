#!/usr/bin/env bash
# Session 10's last device minutes: why XQA's decode step is slower end to end than alone —
# the decode profile with XQA and programmatic dependent launch on (FlashInfer's default) and
# off (GPUCHEF_XQA_PDL=0), batch 32 and 128.
WORKER=s10d
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_n
P="python3 benchmarks/profile_decode.py --model llama-3-8b --batches 32,128 --iters 20 --prof-iters 1 --decode-attention xqa"
job s10d_01_pdl_off 120 "GPUCHEF_XQA_PDL=0 $P --json $R/profile_xqa_pdl_off.json"
job s10d_02_pdl_on 120 "GPUCHEF_XQA_PDL=1 $P --json $R/profile_xqa_pdl_on.json"
touch $F/s10d_done
