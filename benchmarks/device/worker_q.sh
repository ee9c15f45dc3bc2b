#!/usr/bin/env bash
# One H200: the tail of a lease after worker_n (session 7): waits for $F/n_done, then issue 17's
# autopilot cost per step and the long-prompt lane with and without (short prompts' TTFT; analyse
# the traces with benchmarks/lane_ttft.py). ~4 min.
# Start beside worker_n: setsid nohup bash benchmarks/device/worker_q.sh (after setup.sh).
WORKER=q
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_n
while [ ! -e $F/n_done ]; do sleep 2; done
M="--model llama-3-8b"
AZ="--dataset azure-conv"
job q01_ap_cost 120 "python3 benchmarks/bench_autopilot.py --steps 5000 --json $R/ap_cost.json"
LANE="--max-num-batched-tokens 2048 --long-prefill-token-threshold 1024 --max-num-partial-prefills 4"
job q02_lane_4 200 "gpuchef bench $M $AZ --duration 40 --trace-speed ${LANE_SPEED:-3} $LANE --max-long-partial-prefills 4 --trace $R/lane_long4.jsonl --sample-hz 0; gzip -f $R/lane_long4.jsonl"
job q03_lane_1 200 "gpuchef bench $M $AZ --duration 40 --trace-speed ${LANE_SPEED:-3} $LANE --max-long-partial-prefills 1 --trace $R/lane_long1.jsonl --sample-hz 0; gzip -f $R/lane_long1.jsonl"
touch $F/q_done
