#!/usr/bin/env bash
# Create .venv (once) and install triton-swa into it with the extras the test command and the demo use:
# test (pytest, xdist, hypothesis), demo (transformers 5.19, tqdm, matplotlib), dev (ruff).
# - A machine without CUDA gets CPU torch 2.13.0 and the `cpu` extra (triton 3.6.0, numpy < 2.4: the
#   interpreter tier's pins, in pyproject.toml where pip sees them).
# - A machine whose python3 already has a CUDA torch keeps it (the venv sees system packages).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
has_cuda() { "$1" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
if [ ! -x .venv/bin/python ]; then
  if has_cuda "$PY"; then
    "$PY" -m venv --system-site-packages .venv
  else
    "$PY" -m venv .venv
  fi
fi
extras=test,demo,dev
has_cuda .venv/bin/python || extras=cpu,$extras
if ! .venv/bin/python -c 'import torch, triton, triton_swa, triton_swa_reference, pytest, xdist, hypothesis, transformers, tqdm, matplotlib, ruff' 2>/dev/null; then
  .venv/bin/python -m pip install -q --upgrade pip
  if ! has_cuda .venv/bin/python; then
    # CPU torch: plain `pip install torch` would pull a multi-GB CUDA build
    .venv/bin/python -m pip install -q "torch==2.13.0"
  fi
  .venv/bin/python -m pip install -q -e ".[$extras]"
elif [ pyproject.toml -nt .venv/.triton_swa_installed ]; then
  # pyproject.toml changed (extras, entry points): refresh the editable install
  .venv/bin/python -m pip install -q -e ".[$extras]"
fi
touch .venv/.triton_swa_installed
