#!/usr/bin/env bash
# Wheels of SGLang 0.5.23's import closure for the lent H200 (python 3.12, no network there), into a
# git-ignored folder that a device call carries (scripts/gpu.sh installs them into /tmp/site).
#
#   bash scripts/carry_sglang_wheels.sh [DEST] [PYVER]      (default .whl/sglang, 3.12)
#
# Only what the device image lacks is fetched (its list: /work/.library/device/KINDS.md, "Python
# packages already there"): it has torch 2.11, triton 3.6.0, torchvision, transformers 5.17,
# huggingface-hub, tokenizers, safetensors, sentencepiece, numpy, aiohttp, httpx, requests, pyyaml,
# psutil, pillow, regex, tqdm, einops, pygments, ... Never torch or triton. The versions are
# scripts/setup_sglang.sh's pins.
#
# The sglang wheel is 37 MiB, most of it compiled Rust extensions of the HTTP server
# (sglang/srt/rust_extensions: _server, _grpc, _bench, _multimodal) and the diffusion runtime
# (sglang/multimodal_gen); nothing this project imports reaches them (checked by importing the
# backend, pool, allocator, batch and layer modules and listing sys.modules). The copy carried is
# the same wheel without those members (RECORD rewritten to match); every other file is byte for
# byte the published one. The total must stay under 48 MiB (a device call carries 64).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.whl/sglang}
PYVER=${2:-3.12}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
ABI="cp${PYVER/./}"
mkdir -p "$DEST"

PINS=(
  sglang==0.5.23
  apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 openai==2.25.0
  orjson==3.13.0 pybase64==1.5.1 msgspec==0.23.0 pyzmq==27.3.0 dill==0.4.1 loguru==0.7.3
  gguf==0.19.0 partial-json-parser==0.2.1.1.post7 distro==1.9.0 sniffio==1.3.1 starlette==1.10.0
  pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0
  ipython==9.18.1 traitlets==5.16.1
  # the engine's serving packages (scripts/setup_sglang_engine.sh's pins) that the device lacks: what
  # sglang.Engine and launch_server import on a GPU (scripts/gpu.sh engine)
  fastapi==0.165.0 uvicorn==0.54.0 setproctitle==1.3.8 python-multipart==0.0.34 interegular==0.3.3
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
  soundfile==0.13.1 cffi==2.1.1 pycparser==3.12 xgrammar==0.2.7 opentelemetry-api==1.45.2
  importlib-metadata==10.2.0
)

have() {  # a wheel of this name and version is already in DEST
  local name=${1%%==*} ver=${1##*==}
  compgen -G "$DEST/${name//-/_}-${ver}-*.whl" >/dev/null || compgen -G "$DEST/${name}-${ver}-*.whl" >/dev/null
}

todo=()
for pin in "${PINS[@]}"; do have "$pin" || todo+=("$pin"); done
if [ "${#todo[@]}" -gt 0 ]; then
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp --abi "$ABI" \
    --abi abi3 --abi none --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --platform any -d "$DEST" "${todo[@]}"
fi

# Slim the sglang wheel in place (idempotent: a slimmed wheel has nothing left to drop).
"$PY" - "$DEST" <<'EOF'
import glob, os, sys, zipfile

DROP = ("sglang/srt/rust_extensions/", "sglang/multimodal_gen/")
(path,) = glob.glob(os.path.join(sys.argv[1], "sglang-0.5.23-*.whl"))
with zipfile.ZipFile(path) as src:
    names = src.namelist()
    if any(n.startswith(DROP) for n in names):
        tmp = path + ".tmp"
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if info.filename.startswith(DROP):
                    continue
                data = src.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines(keepends=True)
                    data = "".join(l for l in lines if not l.startswith(DROP)).encode()
                dst.writestr(info, data)
        os.replace(tmp, path)
        print(f"slimmed {os.path.basename(path)}: dropped {sum(n.startswith(DROP) for n in names)} files under {DROP}")
EOF

total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
echo "carry_sglang_wheels: $(ls "$DEST"/*.whl | wc -l) wheels, $(( total / 1024 / 1024 )) MiB in $DEST"
[ "$total" -lt $(( 48 * 1024 * 1024 )) ] || { echo "over 48 MiB" >&2; exit 1; }
