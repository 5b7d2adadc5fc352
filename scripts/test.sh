#!/usr/bin/env bash
# The test command: set up .venv, the optional SGLang tier, then run the whole suite. Without CUDA
# the Triton kernels run in Triton's interpreter on the CPU (tests/conftest.py sets TRITON_INTERPRET=1
# before triton loads). The SGLang tier (tests/integration) installs sglang 0.5.23 with --no-deps and
# says "SGLang tier: installed" or "SKIPPED (why)"; when skipped, its tests are reported as skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
bash scripts/setup_sglang.sh .venv/bin/python || echo "SGLang tier: SKIPPED (its install failed, above; tests/integration will skip)"
exec .venv/bin/python -m pytest -n "${TEST_WORKERS:-2}" --dist worksteal -q "$@"
