#!/usr/bin/env bash
# Poll: wait up to $1 s (default 0) or until every job has ended, then print the status and
# put all results so far into $OUT/res.tgz (one file: the machine returns at most 8).
source /tmp/g/benchmarks/device/env.sh
end=$(( $(date +%s) + ${1:-0} ))
all_done() { for w in $(cat $F/workers 2>/dev/null); do [ -e $F/${w}_done ] || return 1; done; }
while [ $(date +%s) -lt $end ] && ! all_done; do sleep 5; done
cat $R/status.txt; ls $F
for f in $R/*.log; do echo "== $(basename $f): $(tail -c 300 $f | tr '\n' ' ' | tail -c 300)"; done 2>/dev/null | tail -40
nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
# traces (*.jsonl.gz) come back as files of their own (the return limit is 16 MiB a file, 8
# files): the newest 7 that fit; the logs and JSON in res.tgz
if [ -n "$OUT" ]; then
  tar --exclude='*.jsonl.gz' -czf $OUT/res.tgz -C /tmp res
  find $R -name '*.jsonl.gz' -printf '%T@ %p\n' 2>/dev/null | sort -rn | cut -d' ' -f2- | while read f; do
    [ $(stat -c %s "$f") -lt 16000000 ] && echo "$f"; done | head -7 | while read f; do
    cp "$f" "$OUT/$(basename $(dirname "$f"))-$(basename "$f")"; done
fi
