"""The architecture as the import graph shows it: layers that only import downwards, a reference
that imports nothing of the library, engines imported only by their integration, and imports that
change nothing in the process."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "triton_swa"
REFERENCE = ROOT / "triton_swa_reference"

# What each layer may import of triton_swa (besides itself). Modules not listed are applications of
# the library (the serving loop, the demo, the command line) and may import any layer.
LAYERS = {
    "triton_swa.runtime": set(),
    "triton_swa.ops": {"triton_swa.runtime"},
    "triton_swa.mem": {"triton_swa.runtime"},
    "triton_swa.engine": set(),
    "triton_swa.backend": {"triton_swa.runtime", "triton_swa.ops", "triton_swa.mem", "triton_swa.engine"},
    # the real-engine kit runs an engine's integration (lazily, in the engine's process)
    "triton_swa.testing": {"triton_swa.runtime", "triton_swa.mem", "triton_swa.ops", "triton_swa.backend", "triton_swa.integrations"},
    # an engine's own backend may be built on the ops directly (vLLM's: its metadata is not SGLang's)
    "triton_swa.integrations": {"triton_swa.runtime", "triton_swa.ops", "triton_swa.mem", "triton_swa.engine", "triton_swa.backend"},
}
ENGINES = ("sglang", "vllm", "transformers")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(absolute module, at module level) of every import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            found.append((name, id(node) in top))
    return found


def _layer(module: str) -> str | None:
    return next((layer for layer in LAYERS if module == layer or module.startswith(layer + ".")), None)


@pytest.mark.reference
def test_layers_import_only_downwards():
    bad = []
    for path in LIBRARY.rglob("*.py"):
        module = _module_name(path)
        layer = _layer(module)
        if layer is None:
            continue
        for name, _ in _imports(path):
            if name.startswith("triton_swa_reference"):
                bad.append(f"{module} imports the reference ({name})")
            elif name.startswith("triton_swa"):
                target = _layer(name) or name
                if target != layer and target not in LAYERS[layer]:
                    bad.append(f"{module} imports {name}")
    assert not bad, "\n".join(bad)


@pytest.mark.reference
def test_no_module_imports_itself_back():
    """No import cycle among the library's modules (lazy imports included): each module's imports of
    the library, followed through, never lead back to it."""
    graph = {}
    for path in LIBRARY.rglob("*.py"):
        module = _module_name(path)
        names = {name for name, _ in _imports(path)}
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level and node.module is None:
                # "from . import x": the submodule x (when it is one), not the package
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                names |= {f"{base}.{alias.name}" for alias in node.names}
                names.discard(base)
        graph[module] = {name for name in names if name.startswith("triton_swa.") and name != module}
    # an import of a name inside a module (from pkg.mod import name) is an import of that module
    resolve = lambda name: name if name in graph else name.rpartition(".")[0]
    cycles = []
    for start in graph:
        stack, seen = [resolve(n) for n in graph[start]], set()
        while stack:
            node = stack.pop()
            if node == start:
                cycles.append(start)
                break
            if node in seen or node not in graph or (start.startswith(node + ".") or node == "triton_swa"):
                continue
            seen.add(node)
            stack += [resolve(n) for n in graph[node]]
    assert not cycles, f"modules that import themselves back: {sorted(cycles)}"


@pytest.mark.reference
def test_reference_imports_nothing_of_the_library():
    bad = [
        f"{_module_name(p)} imports {name}"
        for p in REFERENCE.rglob("*.py")
        for name, _ in _imports(p)
        if name.split(".")[0] in ("triton_swa", "triton")
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.reference
def test_engines_are_imported_lazily_or_by_their_integration():
    bad = []
    for path in LIBRARY.rglob("*.py"):
        module = _module_name(path)
        for name, top_level in _imports(path):
            engine = name.split(".")[0]
            integration = f"triton_swa.integrations.{engine}"
            if engine in ENGINES and top_level and module != integration and not module.startswith(integration + "."):
                bad.append(f"{module} imports {name} at module level")
    assert not bad, "\n".join(bad)


def _fresh(code: str) -> str:
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.reference
def test_importing_the_library_changes_nothing():
    """``import triton_swa`` sets no environment variable, loads no Triton and queries no device;
    the reference loads neither Triton nor the library."""
    out = _fresh(
        "import os, sys, torch\n"
        "torch.cuda.is_available = lambda: (_ for _ in ()).throw(AssertionError('device query at import'))\n"
        "import triton_swa, triton_swa.testing, triton_swa_reference\n"
        "print('TRITON_INTERPRET' in os.environ, 'triton' in sys.modules,"
        " sorted(m for m in sys.modules if m.startswith('triton_swa_reference') is False and m.startswith('triton_swa.ops')))\n"
    )
    assert out == "False False []", out
    out = _fresh("import sys, triton_swa_reference\nprint(sorted(m for m in sys.modules if m.split('.')[0] in ('triton', 'triton_swa')))")
    assert out == "[]", out


@pytest.mark.reference
def test_the_vllm_integration_imports_vllm_only_for_its_classes():
    """``import triton_swa.integrations.vllm`` (vLLM's entry point loads it in every process) imports no
    vLLM; its classes (``triton_swa.integrations.vllm.classes``) do, on first access."""
    out = _fresh("import sys, triton_swa.integrations.vllm\nprint('vllm' in sys.modules)")
    assert out == "False", out


@pytest.mark.reference
def test_use_interpreter_refuses_once_triton_is_loaded():
    out = _fresh(
        "import os\nfrom triton_swa.testing import use_interpreter\nuse_interpreter()\n"
        "import triton_swa.ops.decode\nprint(os.environ['TRITON_INTERPRET'])\n"
        "os.environ.pop('TRITON_INTERPRET')\n"
        "try:\n    use_interpreter()\nexcept RuntimeError as e:\n    print('refused')\n"
    )
    assert out == "1\nrefused", out
