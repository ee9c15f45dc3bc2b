#!/usr/bin/env bash
# One H200 (nvidia-h200), session 10's lease: issue 16 with XQA for decode rows
# (--decode-attention, auto = XQA on SM90) and the runs session 9 left. In order of need:
# (1) XQA's modules built in parallel (llama-3-8b's and the GPU tests' shapes; not in the
#     committed AOT set), then the FlashInfer backend's GPU tests (both decode kernels against
#     the reference, graph replay), then the AOT set packed again with XQA's modules in it;
# (2) decode attention alone (bench_decode_attention.py: FlashInfer's kernels against XQA); the
#     kernel that wins at batch >= 32 is the one the floor runs use (auto or flashinfer);
# (3) the decode/mixed profile with each decode kernel; the 3x online and offline floor runs;
# (4) the rest of pytest -m gpu at this commit (the default path is XQA now);
# (5) issue 16 item 5: dashboard against headless, 6 pairs; (6) the H200 screenshots.
# Estimate: setup ~2 min, (1) ~4, (2) ~2, (3) ~5, (4) ~4, (5) ~5, (6) ~5.
# Start: carry .whl and .snap.tgz; bash benchmarks/device/setup.sh worker_s10 && collect.sh 100,
# then collect.sh 400 chained, no gap, until s10_done.
# Dry run: DRY=0.1 RES=/tmp/dres FLAGS=/tmp/dflags GDIR=$PWD bash benchmarks/device/worker_s10.sh
WORKER=s10
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_n
M="--model llama-3-8b"
AZ="--dataset azure-conv"
PYT="python3 -m pytest -m gpu -q -p no:cacheprovider"
# (1)
job s10_01_xqa_build 480 "python3 benchmarks/device/xqa_build.py 128:4 128:1 64:2"
job s10_02_pytest_fi 360 "$PYT tests/engine_host/test_flashinfer_gpu.py"
# (2) fi_cuda last: it alone compiles a module (FlashInfer's CUDA-core decode)
job s10_03_attn 360 "python3 benchmarks/bench_decode_attention.py $M --batches 1,8,32,64,128 --kernels fi_tc,xqa,xqa_wide,fi_tc_fa3,fi_cuda --json $R/attn_fixed.json; python3 benchmarks/bench_decode_attention.py $M --batches 32,128 --kv-dist uniform --kernels fi_tc,xqa,xqa_wide --json $R/attn_uniform.json"
DA=auto
if [ -z "$DRY" ]; then
  DA=$(python3 -c "
import json; rows = [r['kernels'] for r in json.load(open('$R/attn_fixed.json'))['rows'] if r['batch'] >= 32]
print('auto' if rows and all(k.get('xqa_wide', {}).get('us', 1e9) < k['fi_tc']['us'] for k in rows) else 'flashinfer')" 2>/dev/null || echo flashinfer)
fi
echo "$(date +%T) decode attention for the floor runs: $DA" >> $R/status.txt
job s10_04_aot_pack 120 "bash benchmarks/device/aot_pack.sh pack /tmp/fic_n $R/aot /tmp/site/flashinfer/data/aot"
# (3)
job s10_05_profile_xqa 360 "python3 benchmarks/profile_decode.py $M --batches 32,64,128 --iters 20 --prof-iters 2 --mixed 0+128,64+128,64+512,16+112 --decode-attention xqa --json $R/profile_xqa.json"
job s10_06_profile_fi 300 "python3 benchmarks/profile_decode.py $M --batches 32,64,128 --iters 20 --prof-iters 1 --mixed 64+128,64+512 --decode-attention flashinfer --json $R/profile_fi.json"
job s10_07_online_3x 300 "gpuchef bench $M $AZ --num-prompts 600 --trace-speed 3 --sample-hz 0 --decode-attention $DA --result-json $R/native_3x.json"
job s10_08_offline 420 "python3 benchmarks/bench_vllm_host.py --run native --decode-attention $DA --out $R/peer && cp $R/peer/native.json $R/native_offline.json"
# (4)
job s10_09_pytest_rest 720 "$PYT tests/engine_host tests/gpuchef tests/probes tests/tui --deselect tests/engine_host/test_flashinfer_gpu.py"
# (5)
job s10_10_bench_ui 480 "python3 benchmarks/bench_ui.py $M --num-prompts 300 --input-len 512 --output-len 128 --request-rate 50 --reps 6 --ui-runs 2 --json $R/bench_ui.json"
# (6)
job s10_11_screens 420 "python3 benchmarks/make_screenshots.py $M $AZ --gpus 0 --prefix h200- --out $R/screens --warmup-s 20 --phase-s 30 --ab-s 30"
touch $F/s10_done
