#!/usr/bin/env bash
# Issue 16 item 4: ship FlashInfer's kernels as an AOT set instead of compiling them on every
# fresh machine. FlashInfer loads `<package>/data/aot/<uri>/<uri>.so` before it looks at its JIT
# cache and never calls ninja for it (flashinfer/jit/core.py: JitSpec.try_load / is_aot); the JIT
# cache under $FLASHINFER_WORKSPACE_BASE is rebuilt on a fresh install because ninja compares the
# freshly installed headers' mtimes with the carried objects'.
# pack FIC OUTDIR [AOTDIR]: every compiled module under FIC's cached_ops (and, given AOTDIR, the
# modules of an installed set, e.g. SITE/flashinfer/data/aot, so that a new set keeps the old
# one's) → OUTDIR/aot.tar.xz.NN (15 MiB parts, the device's return limit is 16 MiB a file) and
# OUTDIR/aot.list (uri, bytes).
# install PARTSDIR SITE: unpack the parts into SITE/flashinfer/data/aot.
# restore OUTDIR: write the committed set (benchmarks/device/aot/aot.list's modules, kept in git
# history rather than in the checkout: 6.4 MB) into OUTDIR, to carry as .fic; AOT_COMMIT is the
# last commit that holds it. A new set: pack it, commit its parts, `git rm` them, and set
# AOT_COMMIT to the commit that added them.
set -e
AOT_COMMIT=${AOT_COMMIT:-d042eb4d19ec5713efc49eeff6e53dabf46db3dc}
cmd=$1; shift
case "$cmd" in
  pack)
    fic=$1; out=$2; aot=${3:-}; tmp=$(mktemp -d); mkdir -p "$out"
    for so in "$fic"/.cache/flashinfer/*/*/cached_ops/*/*.so ${aot:+"$aot"/*/*.so}; do
      [ -e "$so" ] || continue
      uri=$(basename "$(dirname "$so")"); [ "$(basename "$so" .so)" = "$uri" ] || continue
      [ -e "$tmp/$uri/$uri.so" ] && continue  # the JIT cache's copy first
      mkdir -p "$tmp/$uri" && cp "$so" "$tmp/$uri/"
      echo "$uri $(stat -c %s "$so")"
    done > "$out/aot.list"
    tar -C "$tmp" -cf - . | xz -T0 -6 > "$tmp.tar.xz"
    split -b 15M -d "$tmp.tar.xz" "$out/aot.tar.xz."
    rm -rf "$tmp" "$tmp.tar.xz"
    echo "modules: $(wc -l < "$out/aot.list"), bytes: $(awk '{s+=$2} END {print s}' "$out/aot.list")"
    ls -la "$out" ;;
  install)
    parts=$1; site=$2; dst="$site/flashinfer/data/aot"; mkdir -p "$dst"
    cat "$parts"/aot.tar.xz.* | xz -d | tar -C "$dst" -xf -
    echo "aot modules installed: $(ls "$dst" | wc -l) in $dst" ;;
  restore)  # restore OUTDIR: the committed set (aot.list's) out of git history, before a lease
    out=$1; mkdir -p "$out"
    git show "$AOT_COMMIT:benchmarks/device/aot/aot.tar.xz.00" > "$out/aot.tar.xz.00"
    cp benchmarks/device/aot/aot.list "$out/"
    echo "aot set of $AOT_COMMIT restored into $out ($(wc -c < "$out/aot.tar.xz.00") bytes)" ;;
  *) echo "usage: aot_pack.sh pack FIC OUTDIR | install PARTSDIR SITE | restore OUTDIR" >&2
     exit 2 ;;
esac
