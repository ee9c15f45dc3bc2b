#!/usr/bin/env bash
# GPU 1: the sampler's cost, sweep points while vLLM is being staged, then vLLM (from
# /tmp/vsite: its own flashinfer 0.6.12), then tensor parallelism on both GPUs.
WORKER=b
source /tmp/g/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$NATIVE_PATH FLASHINFER_WORKSPACE_BASE=/tmp/fic_b
M="--model llama-3-8b"
AZ="--dataset azure-conv"
job b01_sampler_all 150 "python3 benchmarks/bench_sampler.py --seconds 6 --rounds 6 --json $R/sampler_all.json"
job b02_sampler_one 150 "python3 benchmarks/bench_sampler.py --seconds 6 --rounds 6 --gpus 1 --json $R/sampler_one.json"
while [ ! -e $F/vllm_ready ] && [ ! -e $F/vllm_failed ]; do
  took=
  for n in 512 8192 2048 1024 4096; do
    if claim sweep_$n; then took=1
      job f_sweep_$n 240 "gpuchef bench $M $AZ --duration 40 --trace-speed 4 --mode chunked --max-num-batched-tokens $n --gpus 1 --result-json $R/sweep_$n.json"
      break
    fi
  done
  [ -z "$took" ] && sleep 3
done
if [ -e $F/vllm_ready ]; then
  export PYTHONPATH=$VLLM_PATH FLASHINFER_WORKSPACE_BASE=/tmp/fic_v
  job v01_tests 600 "python3 -m pytest -q -m 'gpu or vllm' -p no:cacheprovider tests/engine_host/test_vllm_scheduler_real.py tests/engine_host/test_vllm_gpu.py"
  job v02_plain 560 "python3 benchmarks/bench_vllm_host.py --run plain --out $R/bv"
  job v03_hosted 420 "python3 benchmarks/bench_vllm_host.py --run hosted --out $R/bv"
  # both GPUs: ask worker A to pause between jobs; after 150 s, stop its current job
  touch $F/want_tp2
  for i in $(seq 75); do [ -e $F/a_paused ] || [ -e $F/a_done ] && break; sleep 2; done
  if [ ! -e $F/a_paused ] && [ ! -e $F/a_done ]; then
    kill -TERM $(cat $F/pid_a) 2>/dev/null; echo "$(date +%T) stopped A's job for TP" >> $R/status.txt
    for i in $(seq 30); do [ -e $F/a_paused ] || [ -e $F/a_done ] && break; sleep 2; done
  fi
  export CUDA_VISIBLE_DEVICES=0,1
  job t01_tp2_bench 560 "gpuchef bench --engine vllm --tensor-parallel-size 2 $M $AZ --num-prompts 600 --trace-speed 3 --max-model-len 8192 --result-json $R/tp2_3x.json --trace $R/tp2_3x.jsonl"
  job t02_tp2_shot 360 "python3 benchmarks/make_screenshots.py --engine vllm --tensor-parallel-size 2 $M $AZ --gpus 0,1 --scenes main-chunked --warmup-s 20 --phase-s 40 --size 190x50 --out $R/shots --prefix h200x2-vllm-tp2-"
  touch $F/tp2_done
  export CUDA_VISIBLE_DEVICES=1
  job v04_ab_3x 580 "gpuchef ab --engine vllm $M $AZ --trace-speed 3 --num-prompts 600 --max-model-len 8192 --a mode=continuous --b mode=chunked --result-json $R/ab_vllm_3x.json"
fi
touch $F/b_done
