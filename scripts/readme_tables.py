"""Regenerate the benchmark tables of the README and of docs/performance.md from committed rows, so
that no figure there is typed.

- docs/performance.md, between ``<!-- triton-swa bench: begin -->`` and ``<!-- triton-swa bench: end -->``:
  the summary of each ``triton-swa bench`` run in the CSV (or of each ``--run``), with its provenance.
- README.md, between ``<!-- triton-swa headline: begin -->`` and ``<!-- triton-swa headline: end -->``:
  one line per op and peer: the geometric mean, least and most of the peer's time over triton-swa's
  across the cases both ran correctly (graph replay), and how many cases that is.

``--check`` exits 1 when either block differs from what the rows make (a test runs it).

    python scripts/readme_tables.py                # rewrite both blocks
    python scripts/readme_tables.py --check
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from triton_swa.benchmark import providers as P  # noqa: E402
from triton_swa.benchmark.runner import read_csv, run_ids, summary  # noqa: E402

BENCH = ("<!-- triton-swa bench: begin -->", "<!-- triton-swa bench: end -->")
HEADLINE = ("<!-- triton-swa headline: begin -->", "<!-- triton-swa headline: end -->")
DEFAULT_CSV = ROOT / "bench" / "results" / "bench-935d729-2026-12-07-NVIDIA_H100.csv"


def _provenance(r: dict) -> str:
    return f"an {r['gpu']} ({r['date']}, torch {r['torch']}, triton {r['triton']}, commit `{r['git_sha']}`, {r['dirty']} tree)"


def bench_block(csv_path: Path, runs: list[str]) -> str:
    parts = []
    for run_id in runs:
        rows = read_csv(csv_path, run_id)
        if not rows:
            raise SystemExit(f"{csv_path}: no rows for run {run_id}")
        parts.append(f"Run `{rows[0]['run_id']}` on {_provenance(rows[0])}:\n\n{summary(rows)}")
    note = (
        f"From `{csv_path.relative_to(ROOT)}`: microseconds per call (p50, CUDA-graph replay over rotated inputs), "
        "`n/a` where a provider does not run the case, in brackets a peer's time over triton-swa's, the copy counting "
        'its read and write; "best peer" leaves out the ceilings.'
    )
    return f"{BENCH[0]}\n{note}\n\n" + "\n\n".join(parts) + f"\n{BENCH[1]}"


def _geomean(values: list) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def headline_block(csv_path: Path, runs: list[str]) -> str:
    """Per op and peer: the peer's time over triton-swa's under graph replay (geometric mean, least,
    most) and, where the run timed both eagerly too, the same of the eager wall times per call."""
    graph: dict = {}
    eager: dict = {}
    first = None
    for run_id in runs:
        rows = read_csv(csv_path, run_id)
        first = first or rows[0]
        ok = {(r["case"], r["provider"]): r for r in rows if r["status"].startswith("ok") and math.isfinite(r["us_p50"])}
        for (case, provider), r in ok.items():
            mine = ok.get((case, "triton_swa"))
            if provider in ("triton_swa", *P.CEILINGS) or mine is None:
                continue
            key = (case.split("-")[0], provider)
            graph.setdefault(key, []).append(r["us_p50"] / mine["us_p50"])
            if math.isfinite(r["eager_us_p50"]) and math.isfinite(mine["eager_us_p50"]):
                eager.setdefault(key, []).append(r["eager_us_p50"] / mine["eager_us_p50"])
    with_eager = bool(eager)
    head = "| op | peer | cases | peer / triton-swa, geometric mean | least | most |"
    rule = "| --- | --- | --- | --- | --- | --- |"
    if with_eager:
        head += " eager: cases | geometric mean | least |"
        rule += " --- | --- | --- |"
    lines = [head, rule]
    for key, values in sorted(graph.items()):
        line = f"| {key[0]} | {key[1]} | {len(values)} | {_geomean(values):.2f}x | {min(values):.2f}x | {max(values):.2f}x |"
        if with_eager:
            ev = eager.get(key)
            line += f" {len(ev)} | {_geomean(ev):.2f}x | {min(ev):.2f}x |" if ev else " 0 | n/a | n/a |"
        lines.append(line)
    timing = "CUDA-graph replay, p50" + ("; eager: wall time per call, back to back" if with_eager else "")
    note = (
        f"Time per call of each peer over triton-swa's on the same bytes ({timing}; above 1: triton-swa is "
        f"faster), over the cases both run correctly, on {_provenance(first)}; from `{csv_path.relative_to(ROOT)}`, every "
        "case in [docs/performance.md](docs/performance.md)."
    )
    return f"{HEADLINE[0]}\n{note}\n\n" + "\n".join(lines) + f"\n{HEADLINE[1]}"


def _replace(path: Path, markers: tuple, new_block: str) -> tuple[str, str]:
    text = path.read_text()
    start, end = text.find(markers[0]), text.find(markers[1])
    if start < 0 or end < 0:
        raise SystemExit(f"{path.relative_to(ROOT)} has no {markers[0]} ... {markers[1]} block")
    return text, text[:start] + new_block + text[end + len(markers[1]) :]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    parser.add_argument("--run", action="append", help="run id (default: every run in the CSV)")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    csv_path = args.csv.resolve()
    runs = args.run or run_ids(csv_path)
    targets = (
        (ROOT / "docs" / "performance.md", BENCH, bench_block(csv_path, runs)),
        (ROOT / "README.md", HEADLINE, headline_block(csv_path, runs)),
    )
    status = 0
    for path, markers, block in targets:
        old, new = _replace(path, markers, block)
        if args.check:
            if new != old:
                print(f"{path.relative_to(ROOT)}'s benchmark table is not what scripts/readme_tables.py makes of the committed rows")
                status = 1
        else:
            path.write_text(new)
    return status


if __name__ == "__main__":
    sys.exit(main())
