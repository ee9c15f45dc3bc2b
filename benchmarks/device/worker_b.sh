#!/usr/bin/env bash
# GPU 1: the sampler's cost (after it made fewer NVML calls per tick), sweep points while vLLM
# is being staged, then vLLM (from /tmp/vsite: its own flashinfer 0.6.12): its GPU tests again,
# the dashboard on vLLM, then tensor parallelism 2 on both GPUs (trace with per-GPU samples and
# the dashboard). On a one-GPU machine it waits for worker A and uses GPU 0, without TP 2.
WORKER=b
source /tmp/g/benchmarks/device/env.sh
NG=$(nvidia-smi -L | wc -l)
if [ "$NG" -lt 2 ]; then
  while [ ! -e $F/a_done ]; do sleep 3; done; GPU=0
else
  GPU=1
fi
export CUDA_VISIBLE_DEVICES=$GPU PYTHONPATH=$NATIVE_PATH FLASHINFER_WORKSPACE_BASE=/tmp/fic_b
M="--model llama-3-8b"
AZ="--dataset azure-conv"
S="python3 benchmarks/bench_sampler.py --seconds 6 --rounds 6"
job b01_sampler_all 150 "$S --json $R/sampler_all.json"
job b02_sampler_old 150 "$S --slow-interval 0 --json $R/sampler_old.json"
job b03_sampler_par 150 "$S --parallel --json $R/sampler_par.json"
job b04_sampler_one 150 "$S --gpus $GPU --json $R/sampler_one.json"
while [ ! -e $F/vllm_ready ] && [ ! -e $F/vllm_failed ]; do
  took=
  for n in 512 8192 2048 1024 4096; do
    if claim sweep_$n; then took=1
      job f_sweep_$n 300 "gpuchef bench $M $AZ --duration 40 --trace-speed 3 --mode chunked --max-num-batched-tokens $n --gpus $GPU --result-json $R/sweep_$n.json"
      break
    fi
  done
  [ -z "$took" ] && sleep 3
done
if [ -e $F/vllm_ready ]; then
  export PYTHONPATH=$VLLM_PATH FLASHINFER_WORKSPACE_BASE=/tmp/fic_v
  job v01_tests 600 "python3 -m pytest -q -m 'gpu or vllm' -p no:cacheprovider tests/engine_host/test_vllm_scheduler_real.py tests/engine_host/test_vllm_gpu.py"
  job v02_top_shot 420 "python3 benchmarks/make_screenshots.py --engine vllm $M $AZ --gpus $GPU --scenes main-continuous,main-chunked --warmup-s 20 --phase-s 30 --size 190x50 --out $R/shots --prefix h200-vllm-"
  # vLLM's own decode step at a fixed batch, for the roofline comparison of issue 3
  job v03_decode64 300 "gpuchef bench --engine vllm $M --num-prompts 64 --input-len 1024 --output-len 512 --request-rate inf --max-num-seqs 64 --gpus $GPU --trace $R/vllm_decode64.jsonl --result-json $R/vllm_decode64.json"
  if [ "$NG" -ge 2 ]; then
    touch $F/want_tp2
    for i in $(seq 75); do [ -e $F/a_paused ] || [ -e $F/a_done ] && break; sleep 2; done
    if [ ! -e $F/a_paused ] && [ ! -e $F/a_done ]; then
      kill -TERM $(cat $F/pid_a) 2>/dev/null; echo "$(date +%T) stopped A's job for TP" >> $R/status.txt
      for i in $(seq 30); do [ -e $F/a_paused ] || [ -e $F/a_done ] && break; sleep 2; done
    fi
    export CUDA_VISIBLE_DEVICES=0,1
    job t01_tp2_bench 560 "gpuchef bench --engine vllm --tensor-parallel-size 2 $M $AZ --num-prompts 600 --trace-speed 3 --max-model-len 8192 --result-json $R/tp2_3x.json --trace $R/tp2_3x.jsonl"
    job t02_tp2_shot 420 "python3 benchmarks/make_screenshots.py --engine vllm --tensor-parallel-size 2 $M $AZ --gpus 0,1 --scenes main-chunked --warmup-s 20 --phase-s 40 --size 190x50 --out $R/shots --prefix h200x2-vllm-tp2-"
    touch $F/tp2_done
  fi
fi
touch $F/b_done
