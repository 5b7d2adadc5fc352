#!/usr/bin/env bash
# Before/after benchmark of the public API on the GPU machine (bench/ab_public.py says how it measures):
#   bash scripts/gpu_ab.sh <git-sha> [more bench/ab_public.py args, e.g. --quick, --budget-s 300, --cases decode-g3]
# "after" is this repo root, "before" is .ab/before: a copy of the old tree made beforehand and carried to
# the device (it is git-ignored), e.g. mkdir -p .ab/before && git archive <old-sha> | tar -x -C .ab/before
# <git-sha> is the commit of this tree, recorded in every CSV row. The log goes to
# bench/results/ab-<date>-gpu.log, the CSV beside it; both are copied to $OUT when it is set (the device tool
# brings that folder back).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ $# -lt 1 ]; then
  echo "usage: bash scripts/gpu_ab.sh <git-sha> [bench/ab_public.py args]" >&2
  exit 2
fi
sha=$1
shift
if [ ! -f .ab/before/triton_swa/__init__.py ] || { [ ! -d .ab/before/reference ] && [ ! -d .ab/before/triton_swa_reference ]; }; then
  echo "no old tree at $PWD/.ab/before (needs triton_swa/ and its reference): make it with" >&2
  echo "  mkdir -p .ab/before && git archive <old-sha> | tar -x -C .ab/before" >&2
  echo "and carry .ab/before to the device with the run" >&2
  exit 2
fi
mkdir -p bench/results
day=$(date +%F)
log=bench/results/ab-$day-gpu.log
export PYTHONUNBUFFERED=1
status=0
python3 bench/ab_public.py --tree before=.ab/before --tree after=. --git-sha "$sha" --rounds 3 "$@" 2>&1 | tee "$log" || status=$?
if [ -n "${OUT:-}" ]; then
  cp "$log" bench/results/ab-"$day"-*.csv "$OUT"/ 2>/dev/null || true
fi
exit "$status"
