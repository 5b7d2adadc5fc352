"""Build a slim FlashInfer for ``triton-swa bench``'s flashinfer providers: OUT (git-ignored, never
committed; scripts/fetch_peers.sh makes it as .peers/flashinfer_site).

The GPU machine the bench runs on has nvcc but installs no packages, and takes a small carried tree;
FlashInfer's wheels are far larger. FlashInfer compiles its attention kernels on first use (JIT), so
its Python package plus the CUDA sources of the kernels the bench calls are enough. From the PyPI
wheels of flashinfer-python and apache-tvm-ffi (CPython 3.12, x86-64 Linux), OUT gets:

- every top-level module of the ``flashinfer`` package and the subpackages ``flashinfer.decode`` and
  ``flashinfer.prefill`` import, with an ``__init__`` of our own that imports nothing (the wheel's
  imports every kernel family): import ``flashinfer.decode`` / ``flashinfer.prefill`` directly;
- the sources and headers of the batch decode, batch prefill (fa2) and page JIT modules: the
  ``data/csrc`` files they start from, every file their ``#include`` lines reach, the whole
  attention header folder (the templates name variants by string), and CCCL's headers whole (they
  come ahead of the CUDA toolkit's own copy on the include path: a subset would mix two versions);
- the ``tvm_ffi`` package, whole.

No CUTLASS and no prebuilt kernels: about 43 MB.

    python3 scripts/fetch_flashinfer.py OUT [--wheels DIR]   (DIR: the two wheels, already downloaded)
"""

from __future__ import annotations

import argparse
import posixpath
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

FLASHINFER = "flashinfer-python==0.7.2.post1"
TVM_FFI = "apache-tvm-ffi==0.1.15.post2"  # within flashinfer-python 0.7.2's >=0.1.11,<0.2
# the GPU machine's Python and platform
TARGET = ["--python-version", "3.12", "--implementation", "cp"]
TARGET += ["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64"]

# Python: the subpackages the decode / prefill imports reach (whole), and two cute_dsl modules
SUBPACKAGES = ("jit", "mla", "trace", "autotuner", "quantization", "cudnn", "cutile")
CUTE_DSL = ("cute_dsl/__init__.py", "cute_dsl/availability.py")
INIT = '''"""FlashInfer, slimmed for triton-swa bench: import flashinfer.decode / flashinfer.prefill directly."""

from .version import __version__ as __version__
'''

# CUDA sources: the data/csrc files the JIT modules start from (by name; not the sm90, fp8 or MLA
# variants), the folders an #include is looked up in, and the folders taken whole
SEED = re.compile(r"(batch_decode|batch_prefill|page|flashinfer_page|single_decode|single_prefill)")
SEED_EXCLUDE = ("sm90", "fp8", "mla")
SEED_EXTRA = ("csrc/tvm_ffi_utils.h", "csrc/runtime_utils.h")
INCLUDE_PATH = ("include", "csrc", "cccl/libcudacxx/include", "cccl/cub", "cccl/thrust", "spdlog/include")
WHOLE = ("include/flashinfer/attention/", "cccl/libcudacxx/include/", "cccl/cub/cub/", "cccl/thrust/thrust/")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def download(dest: Path) -> tuple[Path, Path]:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", *TARGET, "-d", str(dest), FLASHINFER, TVM_FFI]
    subprocess.run(cmd, check=True)
    return wheels(dest)


def wheels(folder: Path) -> tuple[Path, Path]:
    fi = sorted(folder.glob("flashinfer_python-*.whl"))
    ffi = sorted(folder.glob("apache_tvm_ffi-*-cp312-*.whl"))
    if not fi or not ffi:
        sys.exit(f"{folder}: needs a flashinfer_python wheel and a cp312 apache_tvm_ffi wheel")
    return fi[-1], ffi[-1]


def python_files(names: list[str]) -> list[str]:
    keep = []
    for name in names:
        if not name.startswith("flashinfer/") or "__pycache__" in name or name.endswith("/"):
            continue
        rel = name[len("flashinfer/") :]
        if "/" not in rel and rel != "__init__.py":
            keep.append(name)
        elif rel.split("/", 1)[0] in SUBPACKAGES or rel in CUTE_DSL:
            keep.append(name)
    return keep


def cuda_files(wheel: zipfile.ZipFile) -> set[str]:
    """``data/`` paths (relative to flashinfer/data) of the decode / prefill / page modules' sources."""
    data = {n[len("flashinfer/data/") :] for n in wheel.namelist() if n.startswith("flashinfer/data/") and not n.endswith("/")}
    todo = [p for p in data if p.startswith("csrc/") and p.count("/") == 1 and SEED.match(p[len("csrc/") :])]
    todo = [p for p in todo if not any(word in p for word in SEED_EXCLUDE)] + [p for p in SEED_EXTRA if p in data]
    seen: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        text = wheel.read("flashinfer/data/" + path).decode(errors="replace")
        for target in INCLUDE.findall(text):
            for folder in (posixpath.dirname(path), *INCLUDE_PATH):
                found = posixpath.normpath(posixpath.join(folder, target))
                if found in data:
                    todo.append(found)
                    break
    return seen | {p for p in data if p.startswith(WHOLE)}


def build(out: Path, fi_wheel: Path, ffi_wheel: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with zipfile.ZipFile(fi_wheel) as wheel:
        py = python_files(wheel.namelist())
        data = sorted(cuda_files(wheel))
        wheel.extractall(out, py + ["flashinfer/data/" + p for p in data])
    (out / "flashinfer" / "__init__.py").write_text(INIT)
    with zipfile.ZipFile(ffi_wheel) as wheel:
        wheel.extractall(out)
    (out / "VERSION").write_text(f"{fi_wheel.name}\n{ffi_wheel.name}\n")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 2**20:.1f} MiB ({len(py)} Python files, {len(data)} CUDA sources and headers)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--wheels", type=Path, help="a folder holding the two wheels (default: download them)")
    args = parser.parse_args(argv)
    if args.wheels:
        build(args.out, *wheels(args.wheels))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        build(args.out, *download(Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
