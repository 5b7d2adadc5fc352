#!/usr/bin/env bash
# The main job: set up .venv, then run the demo (python -m triton_swa demo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m triton_swa demo "$@"
