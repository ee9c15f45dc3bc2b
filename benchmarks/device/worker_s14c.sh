#!/usr/bin/env bash
# Session 14's last lease (issue 16): pytest -m gpu at the session's final commit, one call:
# setup.sh worker_s14c && collect.sh 300.
WORKER=s14c
source ${GDIR:-/tmp/g}/benchmarks/device/env.sh
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${PYTHONPATH:-$NATIVE_PATH} FLASHINFER_WORKSPACE_BASE=/tmp/fic_n
job s14c_01_pytest_gpu 300 "python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/engine_host tests/gpuchef tests/probes tests/tui"
touch $F/s14c_done
