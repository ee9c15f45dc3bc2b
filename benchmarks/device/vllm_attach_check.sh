#!/usr/bin/env bash
# Issue 14 on the H200: gpuchef as the client and observer of servers it does not host — two
# plain `vllm serve` (0.24, dummy llama-3-8b weights, token-id prompts), one GPU shared at 0.42
# memory each:
#   1. `gpuchef bench --base-url` against the first, Azure trace, first 600 requests at 3×
#      (the issue's run; REFERENCE §4b's `vllm bench serve` figures for the same load);
#   2. `top --attach U1` driven by Pilot under gpuchef's load (make_attach_screenshot.py --url):
#      its SVG and session trace (scrapes + client requests), /metrics before and after;
#   3. `top --attach U1 --attach U2 --ab-load mirrored`, `a`: the A/B screen's SVG and trace;
#   4. `gpuchef ab --a url=U1 --b url=U2 --ab-load mirrored` with --result-json and --trace,
#      then `gpuchef report` of that trace (it must show the command's A and B figures).
# Needs vLLM installed (benchmarks/device/README.md: the .vw parts, vllm_install.sh). Arg: the
# results folder. Runs from the checkout (cwd). ~8 min (two model loads ~1 min each).
# Dry run on CPU (every command of the check against two `gpuchef serve --model tiny` on CPU in
# place of vLLM, small loads): DRY_SMOKE=1 bash benchmarks/device/vllm_attach_check.sh /tmp/vac
set -u
R=${1:-/tmp/res}
mkdir -p $R
N600=600; N300=300; N100=100; N200=200; SECS=40; AZ="--dataset azure-conv --vocab-size 128256"
if [ -n "${DRY_SMOKE:-}" ]; then
  N600=20; N300=20; N100=10; N200=10; SECS=15; AZ="--dataset azure-conv --vocab-size 4096"
  start() {  # start PORT: gpuchef's own server on the CPU in vLLM's place
    gpuchef serve --engine native --device cpu --model tiny --port $1 > $R/vllm_$1.log 2>&1 &
    echo $!
  }
else
  source /tmp/g/benchmarks/device/env.sh
  export PYTHONPATH=$VLLM_PATH CUDA_VISIBLE_DEVICES=0
  D=/tmp/llama3_8b_dummy; mkdir -p $D
  python3 -c "import json; from gpuchef.engine_host.vocab.presets import PRESETS; json.dump(PRESETS['llama-3-8b'], open('$D/config.json', 'w'))"
  start() {  # start PORT: a plain vLLM server on PORT, dummy weights, 0.42 of the GPU
    python3 -m vllm.entrypoints.openai.api_server --model $D --served-model-name llama-3-8b \
      --load-format dummy --skip-tokenizer-init --port $1 --max-model-len 8192 \
      --gpu-memory-utilization 0.42 > $R/vllm_$1.log 2>&1 &
    echo $!
  }
fi
wait_up() { for i in $(seq 1 400); do curl -sf http://127.0.0.1:$1/health >/dev/null && return 0; sleep 1; done; return 1; }
P1=$(start 8012); wait_up 8012 || echo "vllm 8012 did not start" >> $R/vllm_attach.err
P2=$(start 8013); wait_up 8013 || echo "vllm 8013 did not start" >> $R/vllm_attach.err
U1=http://127.0.0.1:8012; U2=http://127.0.0.1:8013
curl -s $U1/metrics > $R/va_metrics_before.txt
# 1
gpuchef bench --base-url $U1 $AZ --num-prompts $N600 --trace-speed 3 \
  --result-json $R/va_bench_600_3x.json > $R/va_bench_600_3x.log 2>&1
curl -s $U1/metrics > $R/va_metrics_after_bench.txt
# 2
python3 benchmarks/make_attach_screenshot.py --url $U1 --seconds $SECS --out $R/h200-attach.svg \
  --trace $R/va_attach.jsonl --load "$AZ --num-prompts $N300 --trace-speed 3" > $R/va_attach.log 2>&1
curl -s $U1/metrics > $R/va_metrics_after_attach.txt
# 3
python3 benchmarks/make_attach_screenshot.py --ab --url $U1 --url $U2 --timeout 300 \
  --out $R/h200-attach-ab.svg --trace $R/va_attach_ab.jsonl \
  --load "$AZ --num-prompts $N100 --trace-speed 3" > $R/va_attach_ab.log 2>&1
# 4
gpuchef ab --a url=$U1 --b url=$U2 --ab-load mirrored $AZ --num-prompts $N200 --trace-speed 3 \
  --repetitions 2 --result-json $R/va_ab_mirrored.json --trace $R/va_ab_mirrored.jsonl \
  > $R/va_ab_mirrored.log 2>&1
gpuchef report $R/va_ab_mirrored.jsonl -o $R/va_ab_mirrored.html > $R/va_report.log 2>&1
# the servers are children of start()'s subshell, not of this shell: poll until they are gone
# (the next job needs their GPU memory back)
kill -TERM $P1 $P2
for i in $(seq 1 60); do kill -0 $P1 2>/dev/null || kill -0 $P2 2>/dev/null || break; sleep 1; done
kill -KILL $P1 $P2 2>/dev/null
gzip -f $R/va_*.jsonl
