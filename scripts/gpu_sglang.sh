#!/usr/bin/env bash
# The SGLang tier on the lent GPU (issue 12, item 4): the wheels that scripts/carry_sglang_wheels.sh
# fetched go into /tmp/site, the SGLang integration tests run on cuda, then bench/bench_sglang_triton.py
# (SGLang's own TritonAttnBackend against triton-swa on SGLang's pools). Logs and the CSV go to $OUT.
#   bash scripts/gpu_sglang.sh GIT_SHA [bench arguments...]
# SGLANG_WHEELS (default .whl/sglang) names the carried wheel folder.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
sha=${1:?pass the git sha measured (the device copy has no .git)}
shift
wheels=${SGLANG_WHEELS:-.whl/sglang}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$SECONDS
install_carried_wheels "$wheels" || exit 1
echo "== install: $(( SECONDS - t0 )) s"

t0=$SECONDS
echo "git_sha $sha" > "$out/gpu-sglang-tests.log"
timeout ${TESTS_TIMEOUT_S:-180} python3 -m pytest tests/integration -q -p no:cacheprovider -n 8 --durations=5 \
  >> "$out/gpu-sglang-tests.log" 2>&1
status=$?
tail -15 "$out/gpu-sglang-tests.log"
echo "== tests: $(( SECONDS - t0 )) s (exit $status)"

t0=$SECONDS
timeout ${BENCH_TIMEOUT_S:-330} python3 bench/bench_sglang_triton.py --git-sha "$sha" --out "$out" "$@" \
  > "$out/bench-sglang-triton.log" 2>&1
bstatus=$?
grep -v -E "UserWarning|warnings.warn" "$out/bench-sglang-triton.log" | tail -150
echo "== bench: $(( SECONDS - t0 )) s (exit $bstatus)"
exit $(( status || bstatus ))
