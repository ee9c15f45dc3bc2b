#!/usr/bin/env bash
# One H200 (nvidia-h200): issue 17's proof — capacity of the autopilot against the best static
# token budget of a sweep (512, 1024, 2048, 4096), llama-3-8b shapes on the Azure conversation
# trace, SLOs P99 ITL <= 50 ms and P50 TTFT <= 2 s (the issue's), and the autopilot's cost per
# step. Start: bash benchmarks/device/setup.sh worker_ap; then collect.sh until $F/ap_done.
# Wall time (estimate): warm-up 3-6 min (FlashInfer compile, graphs), then three `ab --capacity`
# pairs of <= 5 probes x (25 s of arrivals + drain, stopped early once an SLO is broken beyond
# doubt) = 6-8 min each, so ~25 min in all, then two 1-min lane runs; each job is capped by
# its timeout below.
# Dry run on a CPU (tiny model, 2 probes of 5 s; checks every command line, not the numbers;
# all seven jobs rc 0 in 2.5 min on 2026-12-01):
#   AP_DRY_CPU=1 RES=/tmp/dres FLAGS=/tmp/dflags GDIR=$PWD bash benchmarks/device/worker_ap.sh
WORKER=ap
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_ap
M="--model llama-3-8b"
AZ="--dataset azure-conv"
SLO="--slo itl_p99:50ms,ttft_p50:2s"
AUTO="mode=chunked,max_num_batched_tokens=4096,auto_budget=itl_p99:50ms,ttft_p50:2s"
CAP="--capacity $SLO --rate-lo 2 --rate-hi 64 --tolerance 10% --max-probes 5 --duration 25 --gpus 0"
T_WARM=420; T_CAP=600
if [ -n "$AP_DRY_CPU" ]; then
  M="--model tiny --device cpu"; AZ="--dataset azure-conv --max-input-len 512 --max-output-len 32"
  CAP="--capacity $SLO --rate-lo 0.5 --rate-hi 4 --tolerance 50% --max-probes 2 --duration 5"
  T_WARM=120; T_CAP=300
fi
GPUCHEF="gpuchef"
[ -n "$AP_DRY_CPU" ] && GPUCHEF="${PYTHON:-.venv/bin/python} -m gpuchef"
# compiles FlashInfer's kernels and captures the graphs once, so the timed runs start warm
job ap01_warmup $T_WARM "$GPUCHEF bench $M $AZ --num-prompts 60 --trace-speed inf --sample-hz 0"
# the autopilot's own cost per step (CPU-side; floor <= 50 us)
job ap02_cost 120 "${PYTHON:-python3} benchmarks/bench_autopilot.py --steps 5000 --json $R/ap_cost.json"
# the static sweep in pairs, then the autopilot against the middle of it
job ap03_cap_512_1024 $T_CAP "$GPUCHEF ab $M $AZ $CAP --a mode=chunked,max_num_batched_tokens=512 --b mode=chunked,max_num_batched_tokens=1024 --result-json $R/ap_cap_512_1024.json --trace $R/ap_cap_512_1024.jsonl; gzip -f $R/ap_cap_512_1024.jsonl"
job ap04_cap_2048_4096 $T_CAP "$GPUCHEF ab $M $AZ $CAP --a mode=chunked,max_num_batched_tokens=2048 --b mode=chunked,max_num_batched_tokens=4096 --result-json $R/ap_cap_2048_4096.json --trace $R/ap_cap_2048_4096.jsonl; gzip -f $R/ap_cap_2048_4096.jsonl"
job ap05_cap_2048_auto $T_CAP "$GPUCHEF ab $M $AZ $CAP --a mode=chunked,max_num_batched_tokens=2048 --b $AUTO --result-json $R/ap_cap_2048_auto.json --trace $R/ap_cap_2048_auto.jsonl; gzip -f $R/ap_cap_2048_auto.jsonl"
# the long-prompt lane: short prompts' TTFT with and without (analyse the traces with
# benchmarks/lane_ttft.py after gzip), if time is left
LANE="--max-num-batched-tokens 2048 --long-prefill-token-threshold 1024 --max-num-partial-prefills 4"
[ -n "$AP_DRY_CPU" ] && LANE="--max-num-batched-tokens 512 --long-prefill-token-threshold 256 --max-num-partial-prefills 4"
job ap06_lane_4 240 "$GPUCHEF bench $M $AZ --duration 40 --trace-speed ${LANE_SPEED:-3} $LANE --max-long-partial-prefills 4 --trace $R/lane_long4.jsonl --sample-hz 0"
job ap07_lane_1 240 "$GPUCHEF bench $M $AZ --duration 40 --trace-speed ${LANE_SPEED:-3} $LANE --max-long-partial-prefills 1 --trace $R/lane_long1.jsonl --sample-hz 0"
touch $F/ap_done
