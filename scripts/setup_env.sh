#!/usr/bin/env bash
# Create .venv (once) and install triton-swa with its test and demo extras into it (the demo extra:
# transformers 5.19, tqdm, matplotlib).
# - A machine without CUDA gets CPU torch 2.13.0, triton 3.6.0 and numpy < 2.4 (triton 3.6's
#   interpreter breaks on numpy >= 2.4, SPEC §8).
# - A machine whose python3 already has a CUDA torch keeps it (the venv sees system packages).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    "$PY" -m venv --system-site-packages .venv
  else
    "$PY" -m venv .venv
  fi
fi
if ! .venv/bin/python -c 'import torch, triton_swa, triton_swa_reference, pytest, xdist, transformers, tqdm, matplotlib' 2>/dev/null; then
  .venv/bin/python -m pip install -q --upgrade pip
  if ! .venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    .venv/bin/python -m pip install -q "torch==2.13.0" "triton==3.6.0" "numpy<2.4"
  fi
  .venv/bin/python -m pip install -q -e ".[test,demo]"
elif [ pyproject.toml -nt .venv/.triton_swa_installed ]; then
  # pyproject.toml changed (entry points, packages): refresh the editable install's metadata
  .venv/bin/python -m pip install -q --no-deps -e . 2>/dev/null
fi
touch .venv/.triton_swa_installed
