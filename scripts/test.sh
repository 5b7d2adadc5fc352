#!/usr/bin/env bash
# The test command: set up .venv, then run the whole suite. Without CUDA the Triton kernels run in
# Triton's interpreter on the CPU (tests/conftest.py sets TRITON_INTERPRET=1 before triton loads).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m pytest -n "${TEST_WORKERS:-2}" -q "$@"
