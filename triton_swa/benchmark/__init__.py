"""``triton-swa bench``: the op benchmarks on this machine's GPU, every provider checked first.

Decode, prefill and verify on model-like shapes (:mod:`.cases`), each provider (:mod:`.providers`:
triton-swa, FlexAttention, gather + SDPA, the peers' kernels where present (SGLang's and vLLM's
Triton kernels, FlashInfer's; ``bash scripts/fetch_peers.sh`` makes ``.peers``), and the same-bytes
copy and read-only ceilings) checked against a float64 reference before it is timed by CUDA-graph
replay over rotated input sets, then eagerly (:mod:`.runner`). Prints a table; writes docs/contract.md
§7 CSV rows and a plot, wherever it runs: from a checkout the rows carry git's sha and dirty flag,
from an install the commit pip recorded (else the package version) and ``dirty = unknown``; every run
has its id.

    triton-swa bench --quick
    triton-swa bench --op decode --shape g4swa,g4full --batch 1,64 --providers triton_swa,flex
    triton-swa bench --op decode --providers triton_swa,flashinfer_decode_tc,flashinfer_decode_cc
    triton-swa bench --smoke            # tiny shapes; on a CPU through Triton's interpreter
    triton-swa bench --replot bench/results/bench-935d729-2026-12-07-NVIDIA_H100.csv   # the plots, from the rows
    triton-swa bench --grid heuristics --op decode --providers triton_swa,copy_same_bytes   # the heuristics' grid
    triton-swa bench --op indices       # the window index build: fused, two-pass, plain gather
    triton-swa bench --op decode --providers triton_swa,triton_swa_debug,triton_swa_fp8_bytes
    triton-swa bench --op step          # a 48-layer step's host cost, eager and graph (:mod:`.step`)
    triton-swa bench --op step --compare before=.ab/before --no-flashinfer   # two trees side by side
    triton-swa bench --op step --host-only [--compare ...]   # the host path alone, on the CPU (launches stubbed)
    triton-swa bench --op decode,verify --compare .ab/before --rounds 3      # (:mod:`.compare`)
    triton-swa bench --op sglang_backend    # SGLang's whole Triton backend beside ours on SGLang's pools (:mod:`.sglang_backend`)
    triton-swa bench --op serve --models gemma4-like --tokens --load 32768x16   # SGLang's own Engine per backend (:mod:`.serve`)
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import sys
import uuid
from pathlib import Path

__all__ = ["main"]


def _ints(text: str) -> list[int]:
    return [int(x.replace("k", "")) * (1024 if x.endswith("k") else 1) for x in text.split(",")]


def _narrowed(args) -> tuple:
    """``--batch``, ``--ctx`` and ``--pages`` as lists of ints (None where not given)."""
    return tuple(_ints(text) if text else None for text in (args.batch, args.ctx, args.pages))


def _replot(csv_path: Path) -> int:
    import csv

    from .runner import plot, plot_serve, run_ids

    if importlib.util.find_spec("matplotlib") is None:
        print("plot: matplotlib is not installed (pip install 'triton-swa[bench]')", file=sys.stderr)
        return 2
    with csv_path.open() as f:
        serve = next(csv.DictReader(f), {}).get("op") == "serve"  # an engine CSV (--op serve)
    for run_id in run_ids(csv_path):
        png = csv_path.with_name(f"{'serve' if serve else 'bench'}-{run_id}.png")
        drawn = (plot_serve if serve else plot)(csv_path, png, run_id)
        print(f"plot: {png}" if drawn else f"plot: run {run_id} has no row to draw")
    return 0


def _write(args, table: list[dict], sha, dirty) -> Path | None:
    """Append the run's rows to ``--out``'s CSV of the day and GPU; None when they lack a dirty flag."""
    from .runner import write_csv

    if not sha or not dirty:
        print("no CSV written: --git-sha (or GIT_SHA) was given without --dirty", file=sys.stderr)
        return None
    gpu = table[0]["gpu"].replace(" ", "_")
    csv_path = Path(args.out) / f"bench-{datetime.date.today().isoformat()}-{gpu}.csv"
    write_csv(csv_path, table)
    print(f"rows: {csv_path}")
    return csv_path


def _new_run_id() -> str:
    return datetime.datetime.now().strftime("%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:6]


def _report(args, table: list[dict], sha, dirty, run_id: str, plots: bool = True) -> int:
    """Print the summary, write the rows (and the plot) unless ``--no-csv``, name every row that failed
    and count the pairs not run (a run stopped early); 1 when a row failed or was not run, 2 when the
    rows could not be written."""
    from .runner import plot, summary

    print(summary(table))
    bad = [r for r in table if r["status"].split(" ")[0] in ("WRONG", "ERROR", "CRASHED", "CRASHED:")]
    not_run = [r for r in table if r["status"].startswith("NOT RUN")]
    if not args.no_csv:
        csv_path = _write(args, table, sha, dirty)
        if csv_path is None:
            return 2
        if plots:
            png = csv_path.with_name(f"bench-{run_id}.png")
            print(f"plot: {png}" if plot(csv_path, png) else "plot: matplotlib is not installed (pip install 'triton-swa[bench]')")
    for r in bad:
        print(f"{r['status'].split(':')[0]}: {r['case']} {r['provider']}: {r['status']}", file=sys.stderr)
    if not_run:
        print(f"NOT RUN: {len(not_run)} of {len(table)} (case, provider) pairs: {not_run[0]['status']}", file=sys.stderr)
    return 1 if bad or not_run else 0


def _sglang_backend(args, parser, device: str) -> int:
    """``--op sglang_backend``: SGLang's whole Triton backend beside ours on SGLang's pools, in this
    process (:mod:`.sglang_backend`); without SGLang it says so and exits cleanly."""
    from . import sglang_backend as S
    from .runner import provenance, to_csv_rows

    providers = args.providers.split(",") if args.providers else list(S.PROVIDERS)
    shapes = args.shape.split(",") if args.shape else None
    for name, values, allowed in (("--providers", providers, S.PROVIDERS), ("--shape", shapes or [], S.SLIDING_SHAPES)):
        unknown = [v for v in values if v not in allowed]
        if unknown:
            parser.error(f"{name}: {unknown} not of --op sglang_backend; choose from {', '.join(allowed)}")
    if device != "cuda":
        from ..testing import use_interpreter

        use_interpreter()  # before SGLang imports triton
    ready, note = S.sglang_status()
    print(f"triton-swa bench --op sglang_backend: {note}", flush=True)
    if not ready:
        return 0
    cases = S.catalog(shapes, *_narrowed(args), quick=args.quick, smoke=args.smoke, device=device)
    sha, dirty = provenance(args.git_sha, args.dirty)
    run_id = _new_run_id()
    print(f"{len(cases)} cases x {len(providers)} providers on {device}, run {run_id}", flush=True)
    rows = S.run(cases, providers, device)
    return _report(args, to_csv_rows(cases, rows, sha, dirty, run_id), sha, dirty, run_id, plots=False)


def _step(args, trees) -> int:
    """``--op step``: this tree's step (in this process), or every tree's side by side (``--compare``)."""
    from . import step
    from .runner import provenance

    sha, dirty = provenance(args.git_sha, args.dirty)
    run_id = _new_run_id()
    host = args.host_only  # CPU pools: B 64's would take tens of GB
    kw = dict(
        batches=_ints(args.batch) if args.batch else [1] if host else [1, 8, 64],
        verify_batches=_ints(args.verify_batch) if args.verify_batch else [1] if host else [1, 8],
        rounds=args.rounds or (3 if trees else 7),
        flashinfer=not args.no_flashinfer and not host,
    )
    if host:
        kw["host_only"] = True  # an older tree without it: its worker reports the error, its rows n/a
    if trees:
        by_tree = compare_step(trees, kw)
    else:
        by_tree = {sha or "this": step.measure(sha or "this", **kw)}
    table = [r for i, (name, rows) in enumerate(by_tree.items()) for r in step.csv_rows(rows, f"{name}:" if i else "", sha, dirty, run_id)]
    if table and not args.no_csv and _write(args, table, sha, dirty) is None:
        return 2
    return 0 if all(by_tree.values()) else 1


def compare_step(trees, kw: dict) -> dict:
    from . import step
    from .compare import run_step

    by_tree = run_step(trees, kw)
    print("\n== side by side (us; the other trees' values over this one's)")
    print(step.compare_table(by_tree))
    return by_tree


def _serve_args(argv: list[str]) -> list[str] | None:
    """``--op serve``'s other arguments (they are :mod:`.serve`'s), or None for the op benchmarks."""
    for i, a in enumerate(argv):
        if a == "--op=serve" or (a == "--op" and argv[i + 1 : i + 2] == ["serve"]):
            return argv[:i] + argv[i + (1 if "=" in a else 2) :]
    return None


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    serve_args = _serve_args(argv)
    if serve_args is not None:
        from .serve import main as serve

        return serve(serve_args)
    import torch

    from . import providers as P
    from .cases import ATTENTION_OPS, GRIDS, OPS, SHAPES, catalog
    from .runner import load_plugins, provenance, run, to_csv_rows

    parser = argparse.ArgumentParser(prog="triton-swa bench", description=__doc__.split("\n")[0])
    parser.add_argument("--op", default=",".join(ATTENTION_OPS), help=f"comma list of {', '.join(OPS)} (default: the attention ops)")
    parser.add_argument("--grid", choices=GRIDS, default="default", help="the cases: the default grid, or the heuristics' grids")
    parser.add_argument(
        "--shape",
        help=f"comma list of {', '.join(s for s in SHAPES if s != 'tiny')} (default: all; --op sglang_backend: also d128-w1023, "
        "d256-w1023, d128-w4095, d256-w4095, its default)",
    )
    parser.add_argument("--batch", help="comma list of batch sizes")
    parser.add_argument("--ctx", help="comma list of context lengths (4k, 32768, ...)")
    parser.add_argument("--pages", help="comma list of page sizes (1, 16)")
    parser.add_argument(
        "--providers", help=f"comma list of {', '.join(P.PROVIDERS)} and the plugins' (default: all but {', '.join(P.OPT_IN)})"
    )
    parser.add_argument("--quick", action="store_true", help="a subset of the grid, a minute or two")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (also on a CPU, through Triton's interpreter)")
    parser.add_argument("--out", default="bench/results", help="folder of the CSV and the plot")
    parser.add_argument(
        "--git-sha", help="the commit measured (default: git's from a checkout; an install's recorded commit, else its version)"
    )
    parser.add_argument("--dirty", choices=("clean", "dirty"), help="whether the tree has uncommitted changes")
    parser.add_argument("--no-csv", action="store_true", help="print the table only")
    parser.add_argument(
        "--time-limit",
        type=float,
        metavar="S",
        help="stop after S seconds (FlashInfer's build included), as on SIGTERM: the rows so far are written, the pairs left "
        "recorded NOT RUN",
    )
    parser.add_argument(
        "--prime-jobs",
        type=int,
        metavar="N",
        help="workers that first call every pair once side by side, untimed, so that the timed run finds every kernel compiled "
        "(default: on a GPU half the cores, at most 8; 0: none)",
    )
    parser.add_argument("--plugin", action="append", default=[], help="a module whose PROVIDERS dict adds providers (yours)")
    parser.add_argument("--replot", metavar="CSV", help="only redraw the plot of every run in CSV, beside it")
    parser.add_argument(
        "--compare", action="append", default=[], metavar="[NAME=]TREE", help="another source tree's triton_swa beside this one's"
    )
    parser.add_argument("--rounds", type=int, help="--compare: rounds alternating the trees (3); --op step alone: rounds per median (7)")
    parser.add_argument("--verify-batch", help="--op step: verify batch sizes (default 1,8)")
    parser.add_argument("--no-flashinfer", action="store_true", help="--op step: leave FlashInfer's rows out")
    parser.add_argument(
        "--host-only",
        action="store_true",
        help="--op step: the eager rows' host path alone, on the CPU with kernel launches stubbed out (no GPU needed; B 1 by default)",
    )
    args = parser.parse_args(argv)
    if args.replot:
        return _replot(Path(args.replot))
    load_plugins(args.plugin)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.host_only and args.op != "step":
        parser.error("--host-only is an option of --op step")
    if device == "cpu" and not args.smoke and not args.host_only:
        print("triton-swa bench: no CUDA device here; only --smoke runs (through Triton's interpreter)", file=sys.stderr)
        return 2
    ops = args.op.split(",")
    default = [p for p in P.PROVIDERS if p not in P.OPT_IN and ("indices" in ops or p not in P.INDICES_ONLY)]
    providers = args.providers.split(",") if args.providers else default
    for name, values, allowed in (("--op", ops, OPS), ("--providers", providers, P.PROVIDERS)):
        unknown = [v for v in values if v not in allowed]
        if unknown:
            parser.error(f"{name}: unknown {unknown}; choose from {', '.join(allowed)}")
    if args.compare and args.providers:
        parser.error("--compare runs provider triton_swa of each tree: leave --providers out")
    if args.time_limit is not None and (args.compare or "step" in ops or "sglang_backend" in ops):
        parser.error("--time-limit stops the providers' run only: not with --compare, --op step or --op sglang_backend")
    if args.prime_jobs is not None and (args.prime_jobs < 0 or args.compare or "step" in ops or "sglang_backend" in ops):
        parser.error(
            f"--prime-jobs takes a count of 0 or more, for the providers' run only (not --compare, --op step, sglang_backend); "
            f"got {args.prime_jobs}"
        )
    if args.time_limit is not None and args.time_limit <= 0:
        parser.error(f"--time-limit must be a positive number of seconds, got {args.time_limit}")
    try:
        from .compare import parse_trees

        trees = parse_trees(args.compare) if args.compare else None
    except ValueError as exc:
        parser.error(str(exc))
    if "step" in ops:
        if ops != ["step"]:
            parser.error("--op step runs alone")
        if device != "cuda" and not args.host_only:
            print("triton-swa bench --op step: needs a CUDA device (or --host-only)", file=sys.stderr)
            return 2
        return _step(args, trees)
    if "sglang_backend" in ops:
        if ops != ["sglang_backend"] or trees:
            parser.error("--op sglang_backend runs alone, without --compare")
        return _sglang_backend(args, parser, device)
    shapes = args.shape.split(",") if args.shape else None
    if shapes and any(s not in SHAPES for s in shapes):
        parser.error(f"--shape: unknown {[s for s in shapes if s not in SHAPES]}")
    cases = catalog(ops, shapes, *_narrowed(args), quick=args.quick, smoke=args.smoke, grid=args.grid)
    if not cases:
        parser.error("no case selected")
    sha, dirty = provenance(args.git_sha, args.dirty)
    run_id = _new_run_id()
    if trees:
        from .compare import run_cases

        print(f"{len(cases)} cases x {len(trees)} trees x {args.rounds or 3} rounds on {device}, run {run_id}", flush=True)
        rows = run_cases(cases, trees, device, args.rounds or 3)
    else:
        print(f"{len(cases)} cases x {len(providers)} providers on {device}, run {run_id}", flush=True)
        rows = run(cases, providers, device, args.plugin, time_limit=args.time_limit, prime_jobs=args.prime_jobs)
    return _report(args, to_csv_rows(cases, rows, sha, dirty, run_id), sha, dirty, run_id)
