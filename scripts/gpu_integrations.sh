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
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/sglang/*.whl .whl/demo/*.whl || { echo "gpu_integrations: installing the carried wheels failed"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/triton_swa_meta . \
  >/dev/null 2>&1 || echo "gpu_integrations: no triton-swa metadata (the entry-point test will fail)"
export PYTHONPATH="$PYTHONPATH:/tmp/site:/tmp/triton_swa_meta"
python3 -c 'import torch, triton, sglang, transformers; print("torch", torch.__version__, "triton", triton.__version__, "sglang", sglang.__version__, "transformers", transformers.__version__)'
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
