#!/usr/bin/env bash
# GPU 0: gpuchef's native engine (flashinfer 0.6.18 from /tmp/site). Pauses between jobs while
# worker B runs the tensor-parallel jobs on both GPUs. Plan of the next lease (after
# 2026-11-29): what the first lease did not reach, in order of what closes issues.
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
# issue 3: where the decode step's time goes (first: it also compiles the kernels)
run a01_profile_decode 480 "python3 -u benchmarks/profile_decode.py $M --batches 1,32,128 --kv-len 1024 --json $R/profile_decode.json --trace-dir $R/traces"
run a02_pytest_gpu 420 "python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine_host/test_engine_gpu.py tests/engine_host/test_flashinfer_gpu.py tests/probes/test_nvml_gpu.py"
run a03_step_graphs 240 "python3 benchmarks/bench_engine_step.py $M --json $R/steps_graphs.json"
run a03c_step_strided 240 "python3 benchmarks/bench_engine_step.py $M --strided-qk --json $R/steps_strided.json"
run a03b_steady 480 "python3 benchmarks/bench_engine_step.py $M --steady --kv-len 1024 --decode-batches 1,8,32,64,128,256 --steady-steps 50 --json $R/steady.json"
# issue 6: capacity under P99 ITL <= 100 ms, then the budget sweep
claim capacity && run f_capacity 590 "gpuchef ab $M $AZ --capacity --slo itl_p99:100ms --a mode=continuous --b mode=chunked --rate-lo 2 --rate-hi 32 --tolerance 10% --max-probes 6 --duration 30 --gpus 0 --result-json $R/capacity.json"
for n in 512 8192 2048 1024 4096; do
  claim sweep_$n && run f_sweep_$n 300 "gpuchef bench $M $AZ --duration 40 --trace-speed 3 --mode chunked --max-num-batched-tokens $n --gpus 0 --result-json $R/sweep_$n.json"
done
# issue 5: the dashboard's cost again (after the tick was made incremental)
run a05_bench_ui 540 "python3 benchmarks/bench_ui.py $M --num-prompts 300 --input-len 512 --output-len 128 --request-rate 50 --reps 5 --ui-runs 2 --json $R/bench_ui.json"
# issue 7: the native engine on the vLLM peer runs
claim native_peer && run f_native_peer 480 "python3 benchmarks/bench_vllm_host.py --run native --out $R/bv"
claim peer3x && run f_peer_3x 300 "gpuchef bench $M $AZ --num-prompts 600 --trace-speed 3 --max-model-len 8192 --gpus 0 --result-json $R/native_3x.json"
touch $F/a_done
