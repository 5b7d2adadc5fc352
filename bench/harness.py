"""Shared benchmark harness: timing with rotated inputs, the copy ceiling, and docs/contract.md §7 CSV rows.

Every provider of a case runs on the same inputs in the same process. Timings are medians (with p20
and p80) over calls that rotate through several input sets, so that L2 (60 MB on an H200) does not
serve a set that the previous call just read. Small launches can be timed by CUDA-graph replay.
"""

from __future__ import annotations

import csv
import datetime as _dt
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from triton_swa.benchmark.runner import SPEC_COLUMNS as COLUMNS

L2_BYTES = 64 * 2**20


def rotation_count(bytes_per_set: int, budget: int = 8 * 2**30) -> int:
    """How many input sets to rotate so that together they exceed L2 several times (at least 2)."""
    return int(max(2, min(64, -(-4 * L2_BYTES // max(bytes_per_set, 1)) + 1, budget // max(bytes_per_set, 1))))


def time_rotated(
    fns: Sequence[Callable[[], object]], *, warmup: int = 3, reps: int = 30, use_graph: bool = False
) -> tuple[float, float, float]:
    """(p20, p50, p80) microseconds of one call, cycling through ``fns`` (one per input set).

    Each rep runs every fn once between two events; the time per call is that over ``len(fns)``.
    With ``use_graph`` the rep is captured once in a CUDA graph and replayed (launch cost excluded,
    as in a serving engine's decode loop).
    """
    for _ in range(warmup):
        for f in fns:
            f()
    torch.cuda.synchronize()
    run = lambda: [f() for f in fns]
    if use_graph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        run = graph.replay
        run()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(fns))
    t = torch.tensor(times)
    return float(t.quantile(0.2)), float(t.quantile(0.5)), float(t.quantile(0.8))


def copy_ceiling_tbps(nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy bandwidth (read + write bytes over time), measured now."""
    src = torch.empty(nbytes // 2, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    _, p50, _ = time_rotated([lambda: dst.copy_(src)], reps=20)
    return 2 * nbytes / (p50 * 1e-6) / 1e12


def _git_sha() -> str:
    """``$GIT_SHA`` first: a device copy of the tree may carry a stale ``.git`` (pass the commit
    measured, ``GIT_SHA=$(git rev-parse --short HEAD)`` on this side), then git, else unknown."""
    if os.environ.get("GIT_SHA"):
        return os.environ["GIT_SHA"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True, stderr=subprocess.DEVNULL).strip()
    except Exception:
        return "unknown"


@dataclass
class Recorder:
    """Collects SPEC §7 rows and appends them to ``bench/results/<op>-<date>-<gpu>.csv``."""

    op: str
    copy_tbps: float
    rows: list

    @classmethod
    def start(cls, op: str) -> Recorder:
        return cls(op, copy_ceiling_tbps(), [])

    def add(self, case: str, provider: str, times: tuple[float, float, float], nbytes: int, flops: int) -> dict:
        p20, p50, p80 = times
        tbps = nbytes / (p50 * 1e-6) / 1e12
        row = dict(
            op=self.op,
            case=case,
            provider=provider,
            us_p50=round(p50, 2),
            us_p20=round(p20, 2),
            us_p80=round(p80, 2),
            bytes=int(nbytes),
            flops=int(flops),
            tbps=round(tbps, 4),
            tflops=round(flops / (p50 * 1e-6) / 1e12, 3),
            pct_copy=round(100 * tbps / self.copy_tbps, 1),
            copy_tbps=round(self.copy_tbps, 3),
            gpu=torch.cuda.get_device_name(),
            torch=torch.__version__,
            triton=_triton_version(),
            git_sha=_git_sha(),
            date=_dt.date.today().isoformat(),
        )
        self.rows.append(row)
        return row

    def save(self, folder: str = "bench/results") -> str:
        os.makedirs(folder, exist_ok=True)
        gpu = torch.cuda.get_device_name().replace(" ", "_")
        path = os.path.join(folder, f"{self.op}-{_dt.date.today().isoformat()}-{gpu}.csv")
        new = not os.path.exists(path)
        with open(path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            if new:
                writer.writeheader()
            writer.writerows(self.rows)
        return path

    def table(self) -> str:
        """A compact text table of the rows, for the end of a device run's output."""
        lines = [f"{'case':<34} {'provider':<14} {'us_p50':>9} {'TB/s':>7} {'TFLOP/s':>8} {'%copy':>6}"]
        for r in self.rows:
            lines.append(
                f"{r['case']:<34} {r['provider']:<14} {r['us_p50']:>9.2f} {r['tbps']:>7.3f} {r['tflops']:>8.2f} {r['pct_copy']:>6.1f}"
            )
        return "\n".join(lines)


def _triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except Exception:
        return "none"
