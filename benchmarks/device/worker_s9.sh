#!/usr/bin/env bash
# One H200 (nvidia-h200), session 9's lease, the GPU jobs; worker_v9.sh beside it installs vLLM
# from the parts the collect calls carry and runs issue 14's attach check when this worker says
# the GPU is free (flag s9_gpu1_done), and this one waits for it before the dashboard's cost.
# In order of need:
# (1) the GPU tests at this commit, one file after another (the piecewise default cap rose to
#     1024 after session 8's run; mixed_attention "single" is new), the autopilot's cost bench
#     beside the warm-up (CPU only); then FlashInfer's compiled kernels packed as an AOT set
#     (the set of session 6 was not kept: this machine compiles on its first start);
# (2) issue 16's floor runs: offline first 1000 (bench_vllm_host.py --run native, vLLM's offline
#     defaults 16384 / 1024) and the 3x online run, as native_offline.json and native_3x.json;
#     the decode GEMMs under torch's BLAS choices; the profile at the default sizes, mixed steps
#     timed with split and single attention;
# (3) issue 14: worker_v9's attach check against vLLM 0.24 (~8 min);
# (4) issue 16 item 5: the dashboard against headless, 6 pairs (bench_ui.py);
# (5) the H200 screenshots (stale since session 4); (6) budget 4096 for issue 17's sweep.
# Estimate: setup ~2 min, (1) ~10 (4 of them compiling), (2) ~5, (3) ~8, (4) ~5, (5) ~7, (6) ~3.
# Start: carry .whl, .snap.tgz (git archive without benchmarks/results and the sample reports:
# the carry limit is 64 MiB with the tree; move those out of the tree during the lease);
# bash benchmarks/device/setup.sh worker_s9 worker_v9 && collect.sh 200; then one call per vLLM
# part (.vp00 … .vp07: mkdir -p /tmp/vp && cp .vpNN/* /tmp/vp/ && touch /tmp/flags/vp_NN &&
# collect.sh 30), then collect.sh 420 chained, no gap, until s9_done and v9_done.
# Dry run: DRY=0.1 RES=/tmp/dres FLAGS=/tmp/dflags GDIR=$PWD bash benchmarks/device/worker_s9.sh
WORKER=s9
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_n
M="--model llama-3-8b"
AZ="--dataset azure-conv"
PYT="python3 -m pytest -m gpu -q -p no:cacheprovider"
job s9_01_warmup 420 "gpuchef bench $M $AZ --num-prompts 60 --trace-speed inf --gpus 0 --sample-hz 0"
job s9_02_ap_cost 120 "python3 benchmarks/bench_autopilot.py --steps 5000 --json $R/ap_cost.json" &
job s9_03_pytest_piecewise 480 "$PYT tests/engine_host/test_piecewise_gpu.py"
wait
job s9_04_pytest_engine 480 "$PYT tests/engine_host tests/gpuchef tests/probes tests/tui --deselect tests/engine_host/test_piecewise_gpu.py"
job s9_04b_aot_pack 120 "bash benchmarks/device/aot_pack.sh pack /tmp/fic_n $R/aot"
# (2)
job s9_05_offline 420 "python3 benchmarks/bench_vllm_host.py --run native --out $R/peer && cp $R/peer/native.json $R/native_offline.json"
job s9_06_online_3x 240 "gpuchef bench $M $AZ --num-prompts 600 --trace-speed 3 --sample-hz 0 --result-json $R/native_3x.json"
job s9_07a_gemms 180 "python3 benchmarks/bench_decode_gemms.py $M --rows 1,32,64,128,256 --json $R/decode_gemms.json"
job s9_07_profile 360 "python3 benchmarks/profile_decode.py $M --batches 32,64,128 --iters 20 --prof-iters 3 --mixed 0+128,64+128,64+512,16+112,64+448,0+1024 --mixed-attention split,single --json $R/profile_default.json"
touch $F/s9_gpu1_done
# (3) runs in worker_v9; wait for it (or its failure) at most 15 min
for i in $(seq 1 180); do [ -e $F/v9_done ] && break; sleep 5; done
# (4)
job s9_08_bench_ui 420 "python3 benchmarks/bench_ui.py $M --num-prompts 300 --input-len 512 --output-len 128 --request-rate 50 --reps 6 --ui-runs 2 --json $R/bench_ui.json"
# (5)
job s9_09_screens 420 "python3 benchmarks/make_screenshots.py $M $AZ --gpus 0 --prefix h200- --out $R/screens --warmup-s 20 --phase-s 30 --ab-s 30"
# (6) budget 4096 at issue 17's SLOs; B repeats 1024 as the pairing anchor
CAP="--capacity --slo itl_p99:50ms,ttft_p50:2s --rate-lo 15 --rate-hi 26 --max-probes 4 --duration 25 --gpus 0"
job s9_10_cap_4096 300 "gpuchef ab $M $AZ $CAP --a mode=chunked,max_num_batched_tokens=4096 --b mode=chunked,max_num_batched_tokens=1024 --result-json $R/s9_cap_4096_1024.json --trace $R/s9_cap_4096_1024.jsonl; gzip -f $R/s9_cap_4096_1024.jsonl"
touch $F/s9_done
