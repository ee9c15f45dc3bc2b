# Shared by the device-session workers (see README.md here). Sourced, not run.
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# the multi-GPU machines require NVLink multicast off (KINDS.md): keep it off for every child
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export COLUMNS=200 CUDA_DEVICE_ORDER=PCI_BUS_ID
R=${RES:-/tmp/res}; F=${FLAGS:-/tmp/flags}; G=${GDIR:-/tmp/g}
mkdir -p $R $F
NATIVE_PATH=/tmp/site
VLLM_PATH=/tmp/vstub:/tmp/vsite:/tmp/site

# job NAME TIMEOUT_S COMMAND: run COMMAND in $G under a timeout, log to $R/NAME.log, note start/end
job() {
  local name=$1 to=$2; shift 2
  echo "$(date +%T) start $name (gpu ${CUDA_VISIBLE_DEVICES:-all})" >> $R/status.txt
  [ -n "$DRY" ] && { sleep ${DRY}; echo "$(date +%T) end   $name (dry)" >> $R/status.txt; return 0; }
  # stdin from /dev/null: a job that reads stdin (a TUI under `script`) would eat the job list
  ( cd $G && exec timeout -k 10 $to bash -c "$*" ) < /dev/null > $R/$name.log 2>&1 &
  local pid=$!
  echo $pid > $F/pid_${WORKER:-x}
  wait $pid
  local rc=$?
  echo "$(date +%T) end   $name rc=$rc" >> $R/status.txt
  return 0
}

# claim NAME: true once per NAME across workers (atomic mkdir)
claim() { mkdir $F/claim_$1 2>/dev/null; }
