#!/usr/bin/env bash
# The integrations on the lent GPU (issues 12, 13): carried wheels (scripts/carry_sglang_wheels.sh
# into .whl/sglang, transformers 5.19 into .whl/demo) go into /tmp/site, then the whole suite runs
# with -n 14 (the SGLang, transformers and demo tiers on cuda included), then the demo's gpu preset
# with its plot. Logs, the demo's output and its plot go to $OUT.
#   bash scripts/gpu_integrations.sh GIT_SHA
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
sha=${1:?pass the git sha measured (the device copy has no .git)}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$SECONDS
install_carried_wheels .whl/sglang .whl/demo || exit 1
echo "== install: $(( SECONDS - t0 )) s"

t0=$SECONDS
echo "git_sha $sha" > "$out/gpu-tests.log"
timeout ${TESTS_TIMEOUT_S:-330} python3 -m pytest ${TESTS:-tests} -q -p no:cacheprovider -n 14 --deselect tests/test_soak.py \
  --durations=8 >> "$out/gpu-tests.log" 2>&1
status=$?
tail -14 "$out/gpu-tests.log"
echo "== tests: $(( SECONDS - t0 )) s (exit $status)"

t0=$SECONDS
echo "git_sha $sha" > "$out/demo-gpu.log"
timeout ${DEMO_TIMEOUT_S:-200} python3 -m triton_swa demo --preset gpu --plot "$out/demo-gpu.png" 2>&1 \
  | tr '\r' '\n' >> "$out/demo-gpu.log"
dstatus=${PIPESTATUS[0]}
tail -30 "$out/demo-gpu.log"
echo "== demo: $(( SECONDS - t0 )) s (exit $dstatus)"
exit $(( status || dstatus ))
