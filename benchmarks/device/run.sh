#!/usr/bin/env bash
# The device worker: run a job list in order, in the background of a lease (setup.sh starts it
# with `setsid`; collect.sh polls it). Usage: bash benchmarks/device/run.sh jobs/NAME.txt
# A job list has one job a line: NAME TIMEOUT_S COMMAND... (run in the checkout's copy /tmp/g,
# logged to /tmp/res/NAME.log); blank lines and lines starting with # are skipped. When every
# job has ended it touches /tmp/flags/NAME_done, which collect.sh waits for.
list=$1
[ -f "$list" ] || list=${GDIR:-/tmp/g}/benchmarks/device/$1
[ -f "$list" ] || { echo "run.sh: no job list $1 (benchmarks/device/jobs/NAME.txt)" >&2; exit 2; }
WORKER=$(basename "$list" .txt)
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH}
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fic_n}
while read -r name to cmd; do
  case "$name" in ''|'#'*) continue ;; esac
  job "$name" "$to" "$cmd"
done < "$list"
touch $F/${WORKER}_done
