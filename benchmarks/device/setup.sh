#!/usr/bin/env bash
# Call 1 of a device session (args: the job lists to run, jobs/NAME.txt): install the carried
# wheels, copy the checkout to /tmp/g (the background workers run from there, so later calls
# cannot change their files), start one run.sh worker per job list in its own process session
# (they outlive this call; the machine stays while calls follow each other within ~30 s).
set -e
[ $# -gt 0 ] || { echo "usage: setup.sh jobs/NAME.txt [jobs/NAME2.txt ...]" >&2; exit 2; }
rm -rf /tmp/g /tmp/res /tmp/flags && mkdir -p /tmp/g /tmp/res /tmp/flags /tmp/vparts /tmp/vdeps
# a committed snapshot (.snap.tgz: `git archive HEAD ... | gzip`) when carried, so that edits in
# progress in the checkout do not travel into the runs; else the working tree
if [ -f .snap.tgz ]; then tar -xzf .snap.tgz -C /tmp/g; else
  tar --exclude=./.whl --exclude='./.vw*' --exclude=./.git -cf - . | tar -xf - -C /tmp/g; fi
# a snapshot of an older commit, for job lists that run the old design beside the new
[ -f .old.tgz ] && cp .old.tgz /tmp/g/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
# what the image may already have (transformers brings tokenizers): only when it is missing
PYTHONPATH=/tmp/site python3 -c "import tokenizers, jinja2, packaging" 2>/dev/null || \
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/opt/*.whl
# FlashInfer's kernels for llama-3-8b's shapes as an AOT set (.fic/, from aot_pack.sh pack on a
# warm machine): loaded without ninja, so a fresh machine does not spend ~4 min compiling them.
# The set lives in git history, not in the checkout: `bash benchmarks/device/aot_pack.sh
# restore .fic` before the lease, then carry .fic (a checkout does not keep git-ignored folders
# from one session to the next)
if [ -d .fic ] && ls .fic/aot.tar.xz.* >/dev/null 2>&1; then
  bash benchmarks/device/aot_pack.sh install .fic /tmp/site
else
  echo "setup: no .fic/aot.tar.xz.* carried: FlashInfer compiles its kernels (~4 min)" >&2
fi
cd /tmp/g && PYTHONPATH=/tmp/site python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null
nvidia-smi -L; nproc; PYTHONPATH=/tmp/site python3 -c "import torch, flashinfer, textual; print(torch.__version__, torch.cuda.device_count(), flashinfer.__version__, textual.__version__)"
# arguments: job lists (jobs/NAME.txt), each run by run.sh in a worker of its own
names=""
for w in "$@"; do
  n=$(basename $w .txt)
  setsid nohup bash /tmp/g/benchmarks/device/run.sh $w > /tmp/res/$n.out 2>&1 < /dev/null &
  names="$names $n"
done
echo $names > /tmp/flags/workers
sleep 2; cat /tmp/res/status.txt 2>/dev/null; echo started
