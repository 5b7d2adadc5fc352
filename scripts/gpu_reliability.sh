#!/usr/bin/env bash
# The reliability run on the GPU (issue 11): the whole test suite, then the soak for a long run.
#   bash scripts/gpu_reliability.sh GIT_SHA [soak seconds per configuration]
# Logs go to $OUT (the device tool brings them back).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
sha=${1:?pass the git sha (the device copy has no .git)}
soak_s=${2:-120}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
echo "git_sha $sha" | tee "$out/gpu-tests.log"
t0=$SECONDS
timeout 330 python3 -m pytest tests -q -p no:cacheprovider -n 14 --deselect tests/test_soak.py --durations=8 \
  >> "$out/gpu-tests.log" 2>&1
status=$?
tail -12 "$out/gpu-tests.log"
echo "== tests: $(( SECONDS - t0 )) s"
t0=$SECONDS
rm -f "$out/soak.log"
TRITON_SWA_SOAK_STEPS=100000 TRITON_SWA_SOAK_SECONDS=$soak_s TRITON_SWA_SOAK_LOG="$out/soak.log" \
  timeout $(( soak_s + 150 )) python3 -m pytest tests/test_soak.py -q -p no:cacheprovider -n 3 2>&1 | tail -4
status=$(( status || PIPESTATUS[0] ))
cat "$out/soak.log"
echo "== soak: $(( SECONDS - t0 )) s"
exit $status
