#!/usr/bin/env bash
# One H200 (nvidia-h200): the next session's first lease (planned in session 7). In order of
# need: (1) worker_pw.sh's jobs — the piecewise CUDA graphs' GPU tests, profile and offline A/B
# (issue 16, ~16 min); (2) the H200 screenshots again (they date from session 4; with the
# piecewise default and the autopilot scene); (3) a narrow chunked capacity search at the
# session-7 SLOs, 512 against 2048, to pin issue 15's chunked bracket [17.2, 22.3) (~6 min);
# (4) the long-prompt lane under load (session 7's 3x runs had no queue). Each job is capped by
# its timeout; collect.sh returns what is done. Start: carry .whl, .snap.tgz, .fic;
# bash benchmarks/device/setup.sh worker_s8, then collect.sh 540 (chained, no gap) until s8_done.
# Dry run: DRY=0.1 RES=/tmp/dres FLAGS=/tmp/dflags GDIR=$PWD bash benchmarks/device/worker_s8.sh
G0=${GDIR:-/tmp/g}
# (1): worker_pw's job list, without its done flag
WORKER=pw source <(sed '/touch \$F\/pw_done/d' $G0/benchmarks/device/worker_pw.sh)
WORKER=s8
M="--model llama-3-8b"
AZ="--dataset azure-conv"
# (2)
job s8_screens 420 "python3 benchmarks/make_screenshots.py $M $AZ --gpus 0 --prefix h200- --out $R/screens --warmup-s 20 --phase-s 30 --ab-s 30"
# (3)
CAPF="--capacity --slo itl_p99:100ms,ttft_p50:2s --rate-lo 17 --rate-hi 23 --max-probes 4 --duration 40 --gpus 0"
job s8_cap_512_2048 480 "gpuchef ab $M $AZ $CAPF --a mode=chunked,max_num_batched_tokens=512 --b mode=chunked,max_num_batched_tokens=2048 --result-json $R/s8_cap_512_2048.json --trace $R/s8_cap_512_2048.jsonl; gzip -f $R/s8_cap_512_2048.jsonl"
# (4) at 9x the trace's speed (~17 req/s: near chunked capacity, a queue forms)
LANE="--max-num-batched-tokens 2048 --long-prefill-token-threshold 1024 --max-num-partial-prefills 4"
job s8_lane_4 180 "gpuchef bench $M $AZ --duration 40 --trace-speed 9 $LANE --max-long-partial-prefills 4 --trace $R/s8_lane_long4.jsonl --sample-hz 0; gzip -f $R/s8_lane_long4.jsonl"
job s8_lane_1 180 "gpuchef bench $M $AZ --duration 40 --trace-speed 9 $LANE --max-long-partial-prefills 1 --trace $R/s8_lane_long1.jsonl --sample-hz 0; gzip -f $R/s8_lane_long1.jsonl"
touch $F/s8_done
