#!/usr/bin/env bash
# The test command: set up .venv and the optional engine tiers, then run the whole suite. Without CUDA
# the Triton kernels run in Triton's interpreter on the CPU (tests/conftest.py sets TRITON_INTERPRET=1
# before triton loads).
#
# Optional tiers, each installed by its own script with pinned packages (--no-deps) and announced as
# "<tier>: installed" or "<tier>: SKIPPED (why)"; a skipped tier's tests are reported as skipped:
#   - SGLang tier (tests/integration): sglang 0.5.23's real classes (scripts/setup_sglang.sh);
#   - SGLang engine tier (tests/engine): SGLang's own Engine and launch_server on the CPU serving
#     tiny models through triton_swa (scripts/setup_sglang_engine.sh);
#   - vLLM tier (tests/integration/test_vllm.py, test_vllm_engine.py): vLLM 0.32's real registry,
#     metadata, builder and Attention layer driving the TRITON_SWA backend, and its real engine
#     (vllm.LLM) serving with it on the CPU (scripts/setup_vllm.sh).
#
# With no arguments: the suite on two workers (pytest-xdist, work stealing), then the engine tier on
# its own (its tests read SGLang engine runs, each a multi-process engine in subprocesses: the session
# starts each run once, two at a time, TRITON_SWA_ENGINE_JOBS). With arguments: one pytest run over them (`bash scripts/test.sh tests/ops -x`).
#
# Each part's wall time is printed as it ends ("time: setup 118 s") and all of them at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
TIMES=()
tier_done() { # name, start second
  TIMES+=("$1 $((SECONDS - $2)) s")
  echo "time: ${TIMES[-1]}"
}
t0=$SECONDS
bash scripts/setup_env.sh
bash scripts/setup_sglang.sh .venv/bin/python || echo "SGLang tier: SKIPPED (its install failed, above; tests/integration will skip)"
bash scripts/setup_sglang_engine.sh .venv/bin/python || echo "SGLang engine tier: SKIPPED (its install failed, above; tests/engine will skip)"
bash scripts/setup_vllm.sh .venv/bin/python || echo "vLLM tier: SKIPPED (its install failed, above; its tests will skip)"
tier_done setup "$t0"
PYTEST=(.venv/bin/python -m pytest -q)
if [ "$#" -gt 0 ]; then
  exec "${PYTEST[@]}" -n "${TEST_WORKERS:-2}" --dist worksteal "$@"
fi
status=0
t0=$SECONDS
"${PYTEST[@]}" -n "${TEST_WORKERS:-2}" --dist worksteal --durations=20 --ignore=tests/engine || status=$?
tier_done suite "$t0"
t0=$SECONDS
"${PYTEST[@]}" -p no:xdist -rA --durations=20 tests/engine || status=$?
tier_done "engine tier" "$t0"
echo "times: $(IFS=,; echo "${TIMES[*]}")"
exit "$status"
