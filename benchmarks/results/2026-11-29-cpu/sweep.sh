#!/bin/bash
# CPU stand-in of issue 6's budget sweep (tiny, Azure conv trace at 0.75x, clipped as top's CPU default)
cd /work/main
C="--device cpu --model tiny --dataset azure-conv --max-input-len 1024 --max-output-len 128 --duration 80 --trace-speed 0.75"
for n in 128 256 512 1024 2048; do
  /tmp/venv/bin/gpuchef bench $C --mode chunked --max-num-batched-tokens $n --result-json /tmp/m/sweep_$n.json > /tmp/m/sweep_$n.log 2>&1
done
/tmp/venv/bin/gpuchef bench $C --mode continuous --result-json /tmp/m/sweep_cont.json > /tmp/m/sweep_cont.log 2>&1
echo SWEEPDONE > /tmp/m/sweep.done
