"""Regenerate the README's benchmark table from committed rows, so that no figure there is typed.

The block between the README's ``<!-- triton-swa bench: begin -->`` and ``<!-- triton-swa bench: end
-->`` markers holds the summary of each ``triton-swa bench`` run in the CSV (or of each ``--run``),
with the run's provenance. ``--check`` exits 1 when the README's block differs (a test runs it).

    python scripts/readme_tables.py                # rewrite the block
    python scripts/readme_tables.py --check
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from triton_swa.benchmark.runner import read_csv, run_ids, summary  # noqa: E402

BEGIN, END = "<!-- triton-swa bench: begin -->", "<!-- triton-swa bench: end -->"
DEFAULT_CSV = ROOT / "bench" / "results" / "bench-4f5fdff-2026-12-01-NVIDIA_H200.csv"


def block(csv_path: Path, runs: list[str]) -> str:
    parts = []
    for run_id in runs:
        rows = read_csv(csv_path, run_id)
        if not rows:
            raise SystemExit(f"{csv_path}: no rows for run {run_id}")
        r = rows[0]
        parts.append(
            f"Run `{r['run_id']}` on an {r['gpu']} ({r['date']}, torch {r['torch']}, triton {r['triton']}, commit "
            f"`{r['git_sha']}`, {r['dirty']} tree):\n\n{summary(rows)}"
        )
    note = (
        f"From `{csv_path.relative_to(ROOT)}`: microseconds per call (p50, CUDA-graph replay over rotated inputs), "
        "`n/a` where a provider does not run the case, in brackets a peer's time over triton-swa's, the copy counting "
        'its read and write; "best peer" leaves out the ceilings.'
    )
    return f"{BEGIN}\n{note}\n\n" + "\n\n".join(parts) + f"\n{END}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    parser.add_argument("--run", action="append", help="run id (default: every run in the CSV)")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    readme = ROOT / "README.md"
    text = readme.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < 0:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} block")
    csv_path = args.csv.resolve()
    new = text[:start] + block(csv_path, args.run or run_ids(csv_path)) + text[end + len(END) :]
    if args.check:
        if new != text:
            print("README.md's benchmark table is not what scripts/readme_tables.py makes of the committed rows")
            return 1
        return 0
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
