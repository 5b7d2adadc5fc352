"""``triton-swa bench --compare [NAME=]TREE``: this tree's ``triton_swa`` beside another source tree's.

Each tree runs in worker processes of its own with ``PYTHONPATH=TREE`` (and ``TREE`` as the working
folder), so that the worker imports that tree's ``triton_swa`` and its reference
(``triton_swa_reference``); the worker refuses to run unless every module of both packages came from
the tree, and reports where they came from. The measuring code is this tree's (loaded from its files
under another package name, so that it cannot shadow the tree's package): the same inputs, checks,
timing and rows for both trees, through public APIs only (an older tree gets ``n/a`` for an API it
lacks).

- Ops ``decode`` / ``prefill`` / ``verify`` / ``indices``: provider ``triton_swa`` of each tree, in
  ``--rounds`` rounds whose order of the trees alternates (drift of clocks and neighbours cancels); a
  tree's row of a case is its round of median p50. Rows: ``triton_swa`` (this tree) and
  ``triton_swa@NAME``, side by side in the table with NAME's time over this tree's in brackets.
- Op ``step``: :func:`.step.measure` of each tree, in ``--rounds`` rounds whose order of the trees
  alternates, each row the median of its tree's rounds; then a table of both with the ratios; rows
  ``NAME:metric`` for the other tree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
THIS_TREE = HERE.parents[1]  # the folder holding this triton_swa (a checkout, or site-packages)
ALIAS = "triton_swa_bench_harness"

# Run by ``python -c`` in the tree's folder: import the tree's packages (checked), then this harness.
BOOT = f"""
import importlib.util, json, sys
from pathlib import Path
tree, harness = Path(sys.argv[1]).resolve(), sys.argv[2]
import triton_swa_reference, triton_swa
for name, module in list(sys.modules.items()):
    file = getattr(module, "__file__", None)
    if name.split(".")[0] in ("triton_swa", "triton_swa_reference") and file and not Path(file).resolve().is_relative_to(tree):
        sys.exit(f"{{name}} was imported from outside the tree {{tree}}: {{file}}")
print(json.dumps(dict(event="tree", triton_swa=triton_swa.__file__, reference=triton_swa_reference.__file__)), flush=True)
spec = importlib.util.spec_from_file_location("{ALIAS}", harness + "/__init__.py", submodule_search_locations=[harness])
sys.modules["{ALIAS}"] = module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
from {ALIAS}.compare import worker_main
sys.exit(worker_main(sys.argv[3:]))
"""


def parse_trees(specs: list[str]) -> list[tuple[str, Path]]:
    """``[NAME=]DIR`` of each ``--compare`` (the name defaults to the folder's), after this tree's."""
    trees = [("this", THIS_TREE)]
    for spec in specs:
        name, sep, folder = spec.rpartition("=") if "=" in spec else ("", "", spec)
        path = Path(folder).resolve()
        name = name or path.name
        if not (path / "triton_swa" / "__init__.py").is_file():
            raise ValueError(f"--compare {spec!r}: expected [NAME=]DIR with DIR/triton_swa/__init__.py")
        if name in [n for n, _ in trees]:
            raise ValueError(f"--compare {spec!r}: the name {name!r} is taken (give NAME=DIR)")
        trees.append((name, path))
    return trees


def _env(base: dict, tree: Path) -> dict:
    env = dict(base, PYTHONPATH=str(tree), PYTHONUNBUFFERED="1")
    env.pop("TRITON_SWA_DEBUG", None)  # the debug guard synchronises: no graph capture
    return env


def _command(tree: Path) -> list[str]:
    return [sys.executable, "-c", BOOT, str(tree), str(HERE)]


def provider_name(trees, name: str) -> str:
    return "triton_swa" if name == trees[0][0] else f"triton_swa@{name}"


def run_cases(cases, trees, device: str, rounds: int, timeout_s: float = 900.0) -> list[dict]:
    """The rows of provider ``triton_swa`` of every tree (renamed per tree), each its median round."""
    from .runner import _drive, worker_env

    ids = [c.id for c in cases]
    base = worker_env(cases, device)
    by = {}  # (case, provider) -> rows of the rounds
    for rnd in range(rounds):
        for name, tree in trees if rnd % 2 == 0 else trees[::-1]:
            print(f"round {rnd + 1}/{rounds}: {name} ({tree})", file=sys.stderr, flush=True)
            for row in _drive(ids, ["triton_swa"], device, _env(base, tree), timeout_s, worker=_command(tree), cwd=tree):
                row["provider"] = provider_name(trees, name)
                by.setdefault((row["case"], row["provider"]), []).append(row)
    return [_median_round(rows) for rows in by.values()]


def _median_round(rows: list[dict]) -> dict:
    """The round of median p50 (the lower of two) when every round was ok, else the first that was not."""
    bad = [r for r in rows if not r["status"].startswith("ok") or not r.get("us")]
    return bad[0] if bad else sorted(rows, key=lambda r: r["us"][1])[(len(rows) - 1) // 2]


def run_step(trees, step_args: dict) -> dict:
    """:func:`.step.measure` of every tree, each run in a worker of its own, ``step_args["rounds"]``
    times with the trees' order alternating between rounds (a cold first process, drifting clocks and
    neighbours then weigh on every tree alike; each worker takes the median of 3 rounds): ``{name:
    rows}``, a row's value the median of its tree's runs (n/a where any run was n/a)."""
    import statistics

    rounds = max(1, step_args.get("rounds", 3))
    runs: dict = {name: [] for name, _ in trees}
    for rnd in range(rounds):
        for name, tree in trees if rnd % 2 == 0 else trees[::-1]:
            print(f"== host cost of {name} ({tree}), round {rnd + 1}/{rounds}", flush=True)
            cmd = [*_command(tree), "--step", json.dumps(dict(step_args, rounds=3, name=name))]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=_env(os.environ, tree), cwd=tree)
            rows = []
            for line in proc.stdout:
                if line.startswith('{"event": "step"'):
                    rows = [tuple(r) for r in json.loads(line)["rows"]]
                elif line.startswith('{"event": "tree"'):
                    print(f"# {name}: {json.loads(line)['triton_swa']}", flush=True)
                else:
                    print(line, end="", flush=True)
            if proc.wait() != 0:
                print(f"# {name}: the worker exited with {proc.returncode}", flush=True)
            runs[name].append(rows)
    out = {}
    for name, per_run in runs.items():
        if not all(per_run):
            out[name] = []  # a run that failed: the tree has no rows
            continue
        values: dict = {}
        for rows in per_run:
            for metric, batch, value in rows:
                values.setdefault((metric, batch), []).append(value)
        out[name] = [(m, b, float("nan") if any(v != v for v in vs) else statistics.median(vs)) for (m, b), vs in values.items()]
    return out


def worker_main(argv: list[str]) -> int:
    """A worker in the tree's process (after :data:`BOOT`): the runner's worker, or the step's."""
    if argv[:1] == ["--step"]:
        from .step import measure

        args = json.loads(argv[1])
        rows = measure(args.pop("name"), **args)
        print(json.dumps(dict(event="step", rows=[[m, b, v] for m, b, v in rows])), flush=True)
        return 0
    from .runner import main_worker

    return main_worker(argv, interpreter=False)
