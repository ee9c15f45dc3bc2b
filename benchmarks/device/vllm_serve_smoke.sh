#!/usr/bin/env bash
# Hosted vLLM behind gpuchef's front door, then plain `vllm serve`, each driven by `gpuchef bench
# --base-url` with the Azure trace's first 100 requests at 3x; /metrics text of both kept.
# Arg: the results folder. Runs from the checkout (cwd). Dry-run on CPU: DRY_SMOKE=1 (tiny model,
# native engine, no vLLM).
set -u
R=${1:-/tmp/res}
mkdir -p $R
N=${N:-100}
wait_url() {  # wait_url LOG: the front door's URL from its start-up line, or nothing after 300 s
  for i in $(seq 1 300); do
    u=$(grep -o 'on http://127.0.0.1:[0-9]*' "$1" | head -1 | cut -c4-)
    [ -n "$u" ] && { echo "$u"; return; }
    sleep 1
  done
}
if [ -n "${DRY_SMOKE:-}" ]; then ENG="--engine native --device cpu --model tiny"; N=10; else
  ENG="--engine vllm --model llama-3-8b ${ENG_EXTRA:-}"; fi
# 1. hosted vLLM behind the front door
gpuchef serve $ENG --port 0 --trace $R/vllm_hosted_serve.jsonl > $R/vllm_hosted_serve.log 2>&1 &
P=$!
U=$(wait_url $R/vllm_hosted_serve.log)
if [ -n "$U" ]; then
  curl -s $U/v1/models; echo
  curl -s $U/v1/completions -H 'Content-Type: application/json' \
    -d '{"prompt":[1,2,3,4],"max_tokens":8,"stream":true,"ignore_eos":true}' | tail -3
  gpuchef bench --base-url $U --dataset azure-conv --num-prompts $N --trace-speed 3 \
    --result-json $R/vllm_hosted_http_3x.json
  curl -s -X PATCH $U/gpuchef/v1/scheduler -d '{"mode":"continuous"}'; echo
  curl -s $U/metrics > $R/vllm_hosted_metrics.txt
fi
kill -TERM $P; wait $P
[ -n "${DRY_SMOKE:-}" ] || [ -z "${PLAIN:-}" ] && exit 0
# 2. (PLAIN=1) plain vllm serve (dummy weights, token-id prompts) as a server gpuchef does not host
D=/tmp/llama3_8b_dummy; mkdir -p $D
python3 -c "import json; from gpuchef.engine_host.vocab.presets import PRESETS; json.dump(PRESETS['llama-3-8b'], open('$D/config.json', 'w'))"
python3 -m vllm.entrypoints.openai.api_server --model $D --served-model-name llama-3-8b \
  --load-format dummy --skip-tokenizer-init --port 8012 --max-model-len 8192 \
  > $R/vllm_plain_serve.log 2>&1 &
P=$!
for i in $(seq 1 300); do curl -sf http://127.0.0.1:8012/health >/dev/null && break; sleep 1; done
curl -s http://127.0.0.1:8012/metrics > $R/vllm_plain_metrics_idle.txt
gpuchef bench --base-url http://127.0.0.1:8012 --dataset azure-conv --num-prompts $N \
  --trace-speed 3 --vocab-size 128256 --result-json $R/vllm_plain_http_3x.json &
B=$!
sleep 15; curl -s http://127.0.0.1:8012/metrics > $R/vllm_plain_metrics_load.txt
wait $B
curl -s http://127.0.0.1:8012/metrics > $R/vllm_plain_metrics_after.txt
kill -TERM $P; wait $P
