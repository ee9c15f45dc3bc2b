#!/usr/bin/env bash
# GPU 0: gpuchef's native engine (flashinfer 0.6.18 from /tmp/site). Pauses between jobs while
# worker B runs the tensor-parallel jobs on both GPUs.
WORKER=a
source /tmp/g/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$NATIVE_PATH FLASHINFER_WORKSPACE_BASE=/tmp/fic_a
gate() {
  if [ -e $F/want_tp2 ] && [ ! -e $F/tp2_done ]; then
    touch $F/a_paused; while [ ! -e $F/tp2_done ]; do sleep 2; done; rm -f $F/a_paused
  fi
}
run() { gate; job "$@"; }
M="--model llama-3-8b"
AZ="--dataset azure-conv"
run a01_pytest_gpu 600 "python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine_host/test_engine_gpu.py tests/engine_host/test_flashinfer_gpu.py tests/probes/test_nvml_gpu.py"
run a02_step_graphs 420 "python3 benchmarks/bench_engine_step.py $M --json $R/steps_graphs.json"
run a03_step_eager 240 "python3 benchmarks/bench_engine_step.py $M --enforce-eager --json $R/steps_eager.json"
for i in 1 2; do for hz in 0 20; do
  run a04_hz${hz}_$i 200 "gpuchef bench $M $AZ --num-prompts 400 --trace-speed inf --sample-hz $hz --gpus 0 --result-json $R/hz${hz}_$i.json"
done; done
run a05_bench_ui 480 "python3 benchmarks/bench_ui.py $M --num-prompts 300 --input-len 512 --output-len 128 --request-rate 50 --reps 3 --json $R/bench_ui.json --screenshots $R/shots --prefix h200-"
for s in 2 4; do
  run a06_ab_${s}x 420 "gpuchef ab $M $AZ --duration 60 --trace-speed $s --a mode=continuous --b mode=chunked --gpus 0 --result-json $R/ab_${s}x.json --trace $R/ab_${s}x.jsonl"
done
# floating jobs (worker B takes the sweep while it waits for vLLM)
for n in 512 8192 2048 1024 4096; do
  claim sweep_$n && run f_sweep_$n 240 "gpuchef bench $M $AZ --duration 40 --trace-speed 4 --mode chunked --max-num-batched-tokens $n --gpus 0 --result-json $R/sweep_$n.json"
done
claim capacity && run f_capacity 580 "gpuchef ab $M $AZ --capacity --slo itl_p99:100ms --a mode=continuous --b mode=chunked --rate-lo 2 --rate-hi 32 --tolerance 10% --max-probes 6 --duration 30 --gpus 0 --result-json $R/capacity.json"
claim native_peer && run f_native_peer 480 "python3 benchmarks/bench_vllm_host.py --run native --out $R/bv"
claim peer3x && run f_peer_3x 300 "gpuchef bench $M $AZ --num-prompts 600 --trace-speed 3 --max-model-len 8192 --gpus 0 --result-json $R/native_3x.json"
touch $F/a_done
