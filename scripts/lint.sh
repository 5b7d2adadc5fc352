#!/usr/bin/env bash
# Lint: ruff check and ruff format --check over the tree (pinned ruff from the dev extra).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
.venv/bin/ruff --version
.venv/bin/ruff check .
.venv/bin/ruff format --check .
