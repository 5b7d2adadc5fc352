#!/usr/bin/env bash
# Re-create .whl/vllm_engine/ (git-ignored, never committed): vLLM 0.32.0's CUDA build as far as its real
# engine (`vllm.LLM`) needs it on the lent GPU (python 3.12, torch 2.11.0+cu130, no network, no vLLM, at
# most 64 MiB of carried files per call), cut into parts of at most 60 MiB, one part per device call.
# `scripts/gpu.sh vllm-engine SHA` gathers the parts in /tmp of the held machine and, once it has them
# all, installs them there and runs `python -m triton_swa.benchmark.vllm_serve`.
#
#   bash scripts/carry_vllm_engine.sh [DEST] [PYVER]     (default .whl/vllm_engine, 3.12)
#
# then one device call per part, on the same held machine (files under /tmp stay while it is held):
#   call 1: carry [".whl/vllm_engine/call1"]  bash scripts/gpu.sh vllm-engine SHA   (stores part 1, says what is missing)
#   call 2: carry [".whl/vllm_engine/call2"]  bash scripts/gpu.sh vllm-engine SHA   (all parts: installs, runs)
# A later call of the same held machine carries nothing: what was installed is reused.
#
# What the parts hold (one tar.gz cut with split; DEST/MANIFEST has each part's sha256 and the whole's):
#   - wheels/vllm-0.32.0-cp38-abi3-linux_x86_64.whl: vLLM 0.32.0's published CUDA wheel (cp38-abi3,
#     manylinux_2_28) less its compiled extensions but the three small ones that load on torch 2.11
#     (cumem_allocator, fs_io_C, spinloop); RECORD rewritten to match, every kept file byte for byte the
#     published one. The wheel's metadata travels with it: vLLM's CUDA platform probe reads it (without
#     it the probe drops CUDA, see scripts/carry_vllm.sh).
#   - vllm/_C_stable_libtorch.abi3.so: the published extension, byte for byte (75 MiB, 53 MiB in the
#     tar.gz). It is built against torch's stable C ABI and, checked on a CPU (docs/vllm.md): every torch
#     symbol it imports is exported by torch 2.11.0+cu130, it loads there and registers its 143 ops
#     (_C, _C_cache_ops, _C_cuda_utils, _C_custom_ar). It is what vllm/platforms/cuda.py imports unguarded.
#   - wheels/: the third-party packages the engine imports that the device is not assumed to have, as
#     published, for PYVER on x86-64 Linux: scripts/carry_vllm.sh's list (the versions of
#     scripts/setup_vllm.sh) plus rich and click (and their pure-Python dependencies), which the engine's
#     start imports, and compressed-tensors with loguru (the quantization layers import it at module level:
#     the first engine start on the H100 stopped there), depyf with astor and dill (torch.compile's error
#     path), blake3 (the default multimodal hash). A CPU check of the import closure: docs/vllm.md. Assumed on the device: torch, triton, numpy, transformers 5.17 and their own
#     dependencies (huggingface-hub, tokenizers, safetensors, regex, pyyaml, packaging, tqdm, filelock,
#     fsspec, httpx, anyio, h11, certifi, idna, typing-extensions, jinja2, sympy, networkx, cuda-bindings).
#   Left out of vLLM's wheel: _moe_C_stable_libtorch (43 MiB; imported under suppress(ImportError), no
#   Gemma op in it), _qutlass_C and deep_gemm's _C_extension (they do not load on torch 2.11: each imports
#   torch_exception_get_what_without_backtrace, which torch 2.11 does not export), vllm_flash_attn's
#   _vllm_fa2_C / _vllm_fa3_C (464 MiB; FlashAttention is not a backend compared here), _flashmla*,
#   _flashkda_C and _deepselect_C (MLA / KDA / sparse-attention models only).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DEST=${1:-.whl/vllm_engine}
PYVER=${2:-3.12}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
WHEELS=${VLLM_ENGINE_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/triton_swa/vllm_engine_wheels}
ABI="cp${PYVER/./}"
PART_MIB=${PART_MIB:-60}
mkdir -p "$WHEELS"

PINS=(
  openai==2.25.0 oss-harmony==0.0.11 distro==1.9.0 sniffio==1.3.1
  pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0
  fastapi==0.165.0 starlette==1.10.0 annotated-doc==0.0.7 opentelemetry-api==1.45.2
  aiohttp==3.14.5 multidict==7.2.1 attrs==26.1.0 yarl==1.25.1 propcache==0.5.4
  aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0 requests==2.34.2 urllib3==2.8.0
  pyzmq==27.3.0 msgspec==0.23.0 cbor2==6.3.0 cloudpickle==3.1.3 cachetools==8.0.2 py-cpuinfo==9.0.0
  psutil==7.2.2 pybase64==1.5.1 einops==0.8.2 prometheus-client==0.26.0
  partial-json-parser==0.2.1.1.post7 uvloop==0.23.0 xgrammar==0.2.7 apache-tvm-ffi==0.1.11 llguidance==1.7.6
  pillow==13.0.0
  rich==15.0.0 pygments==2.21.0 markdown-it-py==4.3.0 mdurl==0.1.2 click==8.5.1
  compressed-tensors==0.17.0 loguru==0.7.3 depyf==0.20.0 astor==0.8.1 dill==0.4.1 blake3==1.0.11
)

PLATFORMS=()
for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
  PLATFORMS+=(--platform "${p}_x86_64")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --abi "$ABI" --abi abi3 --abi none "${PLATFORMS[@]}" --platform any -d "$WHEELS" vllm==0.32.0 "${PINS[@]}"

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/wheels" "$STAGE/vllm"
"$PY" - "$WHEELS" "$STAGE" "$ABI" "${PINS[@]}" <<'PY'
import base64, glob, hashlib, os, re, shutil, sys, zipfile

wheels, stage, abi, pins = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
KEEP_SO = {"vllm/cumem_allocator.abi3.so", "vllm/fs_io_C.abi3.so", "vllm/spinloop.abi3.so"}
CARRIED_SO = "vllm/_C_stable_libtorch.abi3.so"
# members no engine start reads: the Rust front end's binary (57 MiB; only with VLLM_USE_RUST_FRONTEND),
# C++/CUDA headers and sources of the JIT-built kernels (cutlass, DeepGEMM, fmha_sm100), the API
# server's Swagger page, a picture
DROP = re.compile(r"^vllm/vllm-rs$|/include/|\.(h|hpp|cuh|cu|cpp|cc|inl)$|^vllm/entrypoints/serve/instrumentator/static/|\.jpg$")


def wheel_of(pin):
    name, version = pin.split("==")
    stem = re.sub(r"[-_.]+", "_", name).lower()
    for path in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
        parts = os.path.basename(path)[:-4].split("-")
        if parts[0].lower() == stem and parts[1] == version and parts[-2] in (abi, "abi3", "none") and "x86_64" in parts[-1] + "x86_64":
            if "cpu" in parts[1]:
                continue
            return path
    sys.exit(f"carry_vllm_engine: no wheel of {pin} for {abi} in {wheels}")


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


# vLLM: the published wheel less the extensions left out, the carried one set apart
src = wheel_of("vllm==0.32.0")
out = os.path.join(stage, "wheels", "vllm-0.32.0-cp38-abi3-linux_x86_64.whl")
dropped, dropped_bytes = [], 0
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
    record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
    records = []
    for info in zin.infolist():
        name = info.filename
        if name == record_name:
            continue
        if DROP.search(name):
            dropped_bytes += info.file_size
            continue
        if name.endswith(".so") and name not in KEEP_SO:
            if name == CARRIED_SO:
                with open(os.path.join(stage, name), "wb") as f:
                    f.write(zin.read(name))
            dropped.append(f"{name} ({info.file_size >> 20} MiB)")
            continue
        data = zin.read(name)
        zout.writestr(info, data)
        records.append(record_line(name, data))
    records.append(f"{record_name},,\n")
    zout.writestr(record_name, "".join(records))
print(f"carry_vllm_engine: vLLM's wheel without " + ", ".join(dropped) + f", and {dropped_bytes >> 20} MiB of other files (DROP)")
if not os.path.exists(os.path.join(stage, CARRIED_SO)):
    sys.exit(f"carry_vllm_engine: no {CARRIED_SO} in {src}")
for pin in pins:
    shutil.copy(wheel_of(pin), os.path.join(stage, "wheels"))
PY

{
  echo "made by scripts/carry_vllm_engine.sh for python $PYVER on x86-64 Linux, torch 2.11.0+cu130"
  echo "vllm==0.32.0 (CUDA wheel, extensions but _C_stable_libtorch, cumem_allocator, fs_io_C, spinloop left out)"
  printf '%s\n' "${PINS[@]}"
} > "$STAGE/CARRY_VLLM_ENGINE.txt"

rm -rf "$DEST"
mkdir -p "$DEST"
tar -czf "$DEST/vllm_engine.tar.gz" -C "$STAGE" .
split -b "${PART_MIB}M" -d -a 1 "$DEST/vllm_engine.tar.gz" "$DEST/vllm_engine.tar.gz.part"
n=$(find "$DEST" -name "vllm_engine.tar.gz.part*" | wc -l)
{
  echo "parts $n"
  echo "whole $(sha256sum "$DEST/vllm_engine.tar.gz" | cut -d' ' -f1)"
  for f in "$DEST"/vllm_engine.tar.gz.part*; do echo "part $(basename "$f") $(sha256sum "$f" | cut -d' ' -f1)"; done
} > "$DEST/MANIFEST"
rm "$DEST/vllm_engine.tar.gz"
i=0
for f in "$DEST"/vllm_engine.tar.gz.part*; do
  i=$((i + 1))
  mkdir -p "$DEST/call$i"
  mv "$f" "$DEST/call$i/"
  cp "$DEST/MANIFEST" "$DEST/call$i/"
done
echo "carry_vllm_engine: $(find "$STAGE/wheels" -name "*.whl" | wc -l) wheels and vLLM's _C_stable_libtorch," \
  "$(du -sh "$STAGE" | cut -f1) unpacked, in $n parts of at most $PART_MIB MiB:"
for d in "$DEST"/call*; do
  echo "  $d: $(du -sh "$d" | cut -f1) (carry [\"$d\"] with: bash scripts/gpu.sh vllm-engine SHA)"
done
