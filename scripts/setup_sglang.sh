#!/usr/bin/env bash
# Install the SGLang 0.5.23 integration tier into a venv, for a CPU without CUDA (docs/contract.md §9).
#
#   scripts/setup_sglang.sh [VENV_PYTHON]      (default: .venv/bin/python)
#
# What it installs, every version pinned, all with --no-deps so that pip never resolves a torch:
#   - sglang==0.5.23 itself (its metadata asks for torch 2.14.1, flashinfer, CUDA kernels: none of
#     them is needed to import the pools, allocators, ForwardBatch, RadixAttention, the attention
#     ABC and registry, the plugin loader, the speculative inputs or the FlashInfer/TRTLLM-MHA
#     backend modules, which guard their flashinfer imports);
#   - the closure of pure-Python (or CPU-only wheel) packages those imports reach, found by
#     importing them in an empty venv until nothing was missing;
#   - triton 3.6.0 and numpy 2.3.5 only when the venv has no triton / no numpy below 2.4
#     (triton 3.6's interpreter breaks on numpy >= 2.4, docs/contract.md §8); a CUDA torch's triton is kept.
# torch is never installed or replaced: a venv without torch skips the tier.
#
# torchvision is not installed: PyPI's wheels do not load beside a CPU torch, and SGLang imports
# torchvision.transforms only for multimodal configs. tests/integration/stubs/torchvision stands in
# for it; tests/integration/conftest.py puts it on sys.path only when the real one does not import,
# and this script's final import check does the same.
#
# Idempotent: pins already satisfied are not reinstalled, and a complete venv needs no network.
# Prints "SGLang tier: installed", or "SGLang tier: SKIPPED (reason)" and exits 0 when the package
# registry cannot be reached; any other failure exits 1.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
STUBS="$PWD/tests/integration/stubs"
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT

skip() { echo "SGLang tier: SKIPPED ($*)"; exit 0; }
fail() { echo "SGLang tier: FAILED ($*)" >&2; [ -s "$LOG" ] && tail -n 20 "$LOG" >&2; exit 1; }

[ -x "$PY" ] || fail "no python at $PY; create the venv first (scripts/setup_env.sh)"
# absolute: the import check runs from /tmp
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"

PINS=(
  sglang==0.5.23
  # sglang's own pins
  transformers==5.19.0 tokenizers==0.23.2 sentencepiece==0.2.1 apache-tvm-ffi==0.1.11
  compressed-tensors==0.18.0 openai==2.25.0
  # what `import sglang.srt...` and transformers reach at import time
  orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 msgspec==0.23.0 pyzmq==27.3.0 pyyaml==6.0.4
  dill==0.4.1 loguru==0.7.3 gguf==0.19.0 partial-json-parser==0.2.1.1.post7 einops==0.8.2
  packaging==26.4 regex==2026.11.19 tqdm==4.70.1 safetensors==0.8.0 pillow==13.0.0
  huggingface-hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 h11==0.16.0
  httpx==0.28.1 distro==1.9.0 sniffio==1.3.1 anyio==4.16.0 starlette==1.10.0
  requests==2.34.2 certifi==2026.10.19.post1 idna==3.20 urllib3==2.8.0 charset-normalizer==3.5.3
  pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0
  aiohttp==3.14.5 multidict==7.2.1 attrs==26.1.0 yarl==1.25.1 propcache==0.5.4
  aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0
  ipython==9.18.1 traitlets==5.16.1 pygments==2.21.0
)

source "$(dirname "$0")/pins.sh"

"$PY" -m pip --version >/dev/null 2>&1 || fail "$PY has no pip"

require_torch_triton_numpy

install_pins setup_sglang "${PINS[@]}"

# The import check, run where the tests run: the stub only when the real torchvision fails to import.
TV_PATH=""
if ! "$PY" -c "import torchvision.transforms" >/dev/null 2>&1; then
  TV_PATH="$STUBS"
fi
if ! (cd /tmp && PYTHONPATH="$TV_PATH${PYTHONPATH:+:$PYTHONPATH}" "$PY" - >"$LOG" 2>&1 <<'EOF'
from sglang.srt.mem_cache.memory_pool import KVCache, KVWriteLoc, MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.base_swa_memory_pool import BaseSWAKVPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.kv_loc_plan import IdSpaceKind
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.layers.radix_attention import AttentionType, RadixAttention
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend
from sglang.srt.arg_groups.choices import add_attention_backend_choices, add_draft_attention_backend_choices
from sglang.srt.plugins import load_plugins
from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.eagle_info import EagleVerifyInput

assert SpeculativeAlgorithm.FROZEN_KV_MTP.is_frozen_kv_mtp()
assert callable(FlashInferAttnBackend._resolve_swa_kv_pool) and callable(TRTLLMHAAttnBackend._resolve_swa_kv_pool)
EOF
); then
  fail "SGLang imports"
fi
echo "SGLang tier: installed (sglang 0.5.23$([ -n "$TV_PATH" ] && echo ', torchvision stub'))"
