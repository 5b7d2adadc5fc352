"""The driver and worker of ``triton-swa bench``: check, time, record.

The driver runs the cases in a worker subprocess and reads one JSON line per (case, provider). A
provider that crashes the process (a peer's illegal memory access takes the CUDA context with it) is
recorded as CRASHED for that case, and a new worker goes on from the next provider; inputs are seeded
by the case id, so the new process builds the same ones. Within a worker all providers of a case
run on the same input sets (docs/contract.md §7).

Per case: N input sets (together over 4x the L2 when memory allows) are built; each provider is
checked on set 0 against the float64 reference (``providers.check``) and reported WRONG, untimed,
when it disagrees or leaves a NaN; then one rep calls it on every set, captured in a CUDA graph and
replayed (eager when the capture fails, or for a provider that synchronises, ``providers.EAGER_ONLY``;
marked in the status), 30 reps, p20 / p50 / p80 of a call;
then the same rep eagerly, back to back (``eager_us_p50``: wall time per call, the host's launch
cost wherever it exceeds the GPU's time), 10 reps. On a machine without CUDA (Triton's interpreter)
the calls are timed eagerly: a test of the tool, not a measurement.

FlashInfer's providers JIT-build their kernels on first use: the driver builds the ones the run
will need in a child process first (``providers.start_flashinfer_build``) and times nothing before
it is done. Then, on a GPU, priming workers side by side call every pair once, untimed
(:func:`prime`), so that the compilers' caches on disk hold every kernel before the timed worker
starts.

A run stopped early (``time_limit`` passed, or SIGTERM: a ``timeout`` around the command) keeps what
it measured: the rows done so far, and every (case, provider) left as ``NOT RUN``, so the CSV and
the summary are still written.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from . import providers as P
from .cases import Case, tbps

L2_BYTES = 64 * 2**20
SET_MEMORY = 8 * 2**30
REPS = 30
EAGER_REPS = 10
# the columns of docs/contract.md §7 up to `date`, then this tool's own
CONTRACT_COLUMNS = [
    "op",
    "case",
    "provider",
    "us_p50",
    "us_p20",
    "us_p80",
    "bytes",
    "flops",
    "tbps",
    "tflops",
    "pct_copy",
    "copy_tbps",
    "gpu",
    "torch",
    "triton",
    "git_sha",
    "date",
]
COLUMNS = [*CONTRACT_COLUMNS, "dirty", "run_id", "status", "max_abs_err", "eager_us_p50"]


# ---- worker ----


def _set_bytes(x: dict) -> int:
    return sum(t.numel() * t.element_size() for t in x.values() if isinstance(t, torch.Tensor))


def _time(fns, device: str, graph: bool = True) -> tuple[tuple[float, float, float], str]:
    if device != "cuda":
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            for f in fns:
                f()
            times.append((time.perf_counter() - t0) * 1e6 / len(fns))
        return (min(times), statistics.median(times), max(times)), "eager-cpu"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    how, run = "eager", lambda: [f() for f in fns]
    try:
        if graph:
            cuda_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cuda_graph):
                for f in fns:
                    f()
            how, run = "graph", cuda_graph.replay
    except Exception:  # noqa: BLE001 - a provider that cannot be captured is timed eagerly
        torch.cuda.synchronize()
    for _ in range(3):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPS):
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(fns))
    return _quantiles(times), how


def _quantiles(times: list) -> tuple[float, float, float]:
    q = torch.tensor(times, dtype=torch.float64).quantile(torch.tensor([0.2, 0.5, 0.8], dtype=torch.float64))
    return float(q[0]), float(q[1]), float(q[2])


def _time_eager(fns) -> tuple[float, float, float]:
    """Wall time per call of the calls back to back, eagerly (after ``_time``'s warm-up)."""
    times = []
    for _ in range(EAGER_REPS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for f in fns:
            f()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6 / len(fns))
    return _quantiles(times)


def input_set_count(set_bytes: int, device: str) -> int:
    """Input sets of a case: on a GPU together over 4x the L2 (no call reads what the previous one left
    there), at least 2, at most 64 and ``SET_MEMORY``; one on a CPU."""
    count = max(2, math.ceil(4 * L2_BYTES / max(set_bytes, 1))) if device == "cuda" else 1
    return max(1, min(count, 64, SET_MEMORY // max(set_bytes, 1)))


def time_row(row: dict, calls, device: str, graph: bool = True) -> str:
    """Time ``calls`` (one per input set) into ``row``: ``us`` (p20, p50, p80 of a call), and on a GPU
    ``eager_us`` too. Returns how they were timed: ``graph``, ``eager`` (the capture failed) or
    ``eager-cpu``."""
    row["us"], how = _time(calls, device, graph=graph)
    if device == "cuda":
        row["eager_us"] = _time_eager(calls)
    return how


def _emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def prime(case_ids: list[str], providers: list[str], device: str, all_cases: dict) -> None:
    """Call every (case, provider) once on the case's first input set, nothing checked or timed: the
    compilers' caches on disk (Triton's, Inductor's) then hold what the timed run will launch. One
    JSON line per pair (``primed``: its seconds, or the error it met; a failure here costs nothing)."""
    for cid in case_ids:
        case = all_cases[cid]
        try:
            x = P.build(case, 0, device)
        except Exception as exc:  # noqa: BLE001 - the timed run builds it again and reports
            _emit(dict(event="primed", case=cid, provider="-", s=0.0, error=f"{type(exc).__name__}"))
            continue
        for provider in providers:
            t = time.perf_counter()
            error = ""
            try:
                call = P.prepare(provider, case, x)
                if not isinstance(call, str):
                    call()
                    if device == "cuda":
                        torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - as above
                error = type(exc).__name__
            _emit(dict(event="primed", case=cid, provider=provider, s=round(time.perf_counter() - t, 3), error=error))
        x = None
        if device == "cuda":
            torch.cuda.empty_cache()


def worker(case_ids: list[str], providers: list[str], skip: set, device: str, all_cases: dict) -> None:
    """Run every (case, provider) not in ``skip``; one JSON line before and after each (the row with
    ``s``: the pair's seconds, its first input set's build and the reference aside)."""
    for cid in case_ids:
        case = all_cases[cid]
        todo = [p for p in providers if (cid, p) not in skip]
        if not todo:
            continue
        sets = [P.build(case, 0, device)]
        expected = P.reference(case, sets[0])
        sets += [P.build(case, i, device) for i in range(1, input_set_count(_set_bytes(sets[0]), device))]
        for provider in todo:
            _emit(dict(event="start", case=cid, provider=provider))
            t = time.perf_counter()
            row = dict(event="row", case=cid, provider=provider, status="ok", max_abs_err=None, us=None)
            try:
                calls = [P.prepare(provider, case, x) for x in sets]
                if isinstance(calls[0], str):
                    row["status"] = f"n/a: {calls[0]}"
                else:
                    if provider not in P.CEILINGS:
                        err = P.check(case, sets[0], calls[0], expected)
                        row["max_abs_err"] = err
                        if not err <= P.TOLERANCE:
                            row["status"] = "WRONG"
                    if row["status"] == "ok":
                        how = time_row(row, calls, device, graph=provider not in P.EAGER_ONLY)
                        if how != "graph":
                            row["status"] = f"ok ({how})"
            except Exception as exc:  # noqa: BLE001 - the provider's error is its result for this case
                row["status"] = f"ERROR {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:120]}"
            row["s"] = round(time.perf_counter() - t, 3)
            _emit(row)
        sets = expected = None
        if device == "cuda":
            torch.cuda.empty_cache()


# ---- driver ----


_ROOT = Path(__file__).resolve().parents[2]  # the checkout, when triton-swa runs from one


def _git(*args: str) -> str | None:
    """git's answer about triton-swa's own checkout; None when it does not run from one (an install
    in a virtual environment inside some other repository included)."""
    try:
        run = lambda *a: subprocess.check_output(["git", "-C", str(_ROOT), *a], text=True, stderr=subprocess.DEVNULL).strip()
        if Path(run("rev-parse", "--show-toplevel")).resolve() != _ROOT:
            return None
        return run(*args)
    except Exception:  # noqa: BLE001 - not a checkout
        return None


def _installed_commit() -> str | None:
    """The commit pip recorded when triton-swa was installed from a repository (PEP 610), if any."""
    try:
        from importlib.metadata import distribution

        info = json.loads(distribution("triton-swa").read_text("direct_url.json") or "{}")
        commit = info.get("vcs_info", {}).get("commit_id")
        return commit[:12] if commit else None
    except Exception:  # noqa: BLE001 - not installed, or installed otherwise
        return None


def provenance(git_sha: str | None, dirty: str | None) -> tuple[str | None, str | None]:
    """(sha, dirty) of the tree measured.

    Given (``--git-sha`` or ``GIT_SHA``): as given, with ``dirty`` as given (None when it is not: the
    caller refuses to write such rows). From a checkout: git's, clean or dirty. An install (no
    checkout): the commit pip recorded for it, else the package version (``v0.2.0``), dirty
    ``unknown``: a user's run is kept, and says what it measured.
    """
    given = git_sha or os.environ.get("GIT_SHA")
    if given:
        return given, dirty
    sha = _git("rev-parse", "--short", "HEAD")
    if sha:
        if dirty is None:
            status = _git("status", "--porcelain", "--untracked-files=no")
            dirty = None if status is None else ("dirty" if status else "clean")
        return sha, dirty
    from .. import __version__

    return _installed_commit() or f"v{__version__}", dirty or "unknown"


def _progress(done: int, total: int, label: str) -> None:
    """A progress bar on a terminal, one line per step in a log."""
    width = 30
    fill = width * done // max(total, 1)
    bar = f"[{'#' * fill}{'.' * (width - fill)}] {done}/{total} {label[:60]}"
    sys.stderr.write(f"\r{bar:<100}" if sys.stderr.isatty() else bar + "\n")
    sys.stderr.flush()


def load_plugins(modules: list[str]) -> None:
    """Register the providers of each module (its ``PROVIDERS``: name -> ``prepare(case, inputs)``,
    returning a call or a string saying why the case is not theirs): your own kernel beside ours."""
    import importlib

    for name in modules:
        P.PROVIDERS.update(importlib.import_module(name).PROVIDERS)


def worker_env(cases: list[Case], device: str, plugins: list[str] = ()) -> dict:
    """The environment of the workers: the cases, the plugins, Triton's interpreter on a CPU."""
    env = dict(os.environ, TRITON_SWA_BENCH_CASES=json.dumps([case_to_dict(c) for c in cases]))
    env["TRITON_SWA_BENCH_PLUGINS"] = ",".join(plugins)
    if device != "cuda":
        env["TRITON_INTERPRET"] = "1"
    return env


class TimeLimit(Exception):
    """The run must stop now: its time limit passed, or it was sent SIGTERM."""


def _raise_time_limit(signum, frame):
    raise TimeLimit(f"signal {signal.Signals(signum).name}")


class stops_on_sigterm:
    """While inside, SIGTERM raises :class:`TimeLimit` (in the main thread; elsewhere nothing changes)."""

    def __enter__(self):
        self.old = None
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGTERM, _raise_time_limit)
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)
        return False


def not_run(ids: list[str], providers: list[str], rows: list[dict], why: str) -> list[dict]:
    """A ``NOT RUN`` row for every (case, provider) of ``ids`` x ``providers`` that ``rows`` lacks."""
    done = {(r["case"], r["provider"]) for r in rows}
    return [dict(event="row", case=c, provider=p, status=f"NOT RUN ({why})", us=None) for c in ids for p in providers if (c, p) not in done]


def prime_jobs_default(device: str) -> int:
    """Priming workers side by side (:func:`_prime`): on a GPU as many as kernels compile side by side
    (:func:`~triton_swa.runtime.launch.compile_jobs`); none on a CPU (the interpreter compiles nothing)."""
    from ..runtime.launch import compile_jobs

    return compile_jobs() if device == "cuda" else 0


def run(
    cases: list[Case],
    providers: list[str],
    device: str,
    plugins: list[str] = (),
    timeout_s: float = 900.0,
    time_limit: float | None = None,
    prime_jobs: int | None = None,
) -> list[dict]:
    """All (case, provider) rows, through worker subprocesses (a crash costs only its own row).
    ``time_limit`` (seconds from now, the FlashInfer build included) or SIGTERM stops the run early:
    the pairs left are ``NOT RUN`` rows. ``prime_jobs`` workers first call every pair once side by
    side (:func:`_prime`; None: :func:`prime_jobs_default`), so the timed worker finds every kernel
    compiled."""
    stop_at = None if time_limit is None else time.time() + time_limit
    ids = [c.id for c in cases]
    env = worker_env(cases, device, plugins)
    builder = None
    rows: list[dict] = []
    with stops_on_sigterm():
        try:
            keys = P.flashinfer_build_keys(cases, providers) if device == "cuda" else []
            if keys and not isinstance(P._flashinfer_modules(), str):
                # the builder and the workers must build for the same architectures (the modules' names)
                env.setdefault("FLASHINFER_CUDA_ARCH_LIST", "{}.{}".format(*torch.cuda.get_device_capability()))
                log = Path(tempfile.gettempdir()) / "triton-swa-flashinfer-build.log"
                with log.open("w") as f:
                    builder = P.start_flashinfer_build(keys, env, log=f)
                print(f"flashinfer: building {len(keys)} JIT module(s) first (log: {log})", file=sys.stderr, flush=True)
                # eager columns timed beside a compiler would time the compiler: nothing runs before it is done
                t = time.perf_counter()
                _wait(builder, stop_at)
                print(f"flashinfer: built in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
            jobs = prime_jobs_default(device) if prime_jobs is None else prime_jobs
            if jobs > 0:
                _prime(ids, providers, device, env, jobs, timeout_s, stop_at=stop_at)
            rows = _drive(ids, providers, device, env, timeout_s, stop_at=stop_at)
            print(_time_report(rows), file=sys.stderr, flush=True)
        except TimeLimit as stop:  # in the FlashInfer build or the priming: nothing was timed
            why = f"stopped early: {stop}"
            print(f"triton-swa bench: {why}; every pair is a NOT RUN row", file=sys.stderr, flush=True)
            rows = not_run(ids, providers, [], why)
        finally:
            P.stop_flashinfer_build(builder)
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    return rows


def _prime(
    ids: list[str], providers: list[str], device: str, env: dict, jobs: int, timeout_s: float, worker=None, cwd=None, stop_at=None
) -> list[dict]:
    """Every (case, provider) called once, untimed, by ``jobs`` workers side by side (the cases dealt
    out in turn, so each gets large and small ones), each killed at ``timeout_s`` (a priming worker's
    failure costs nothing: the timed run compiles what it missed). Compiling is most of a fresh
    machine's run (every kernel of every provider, per shape), and one worker compiles on one core at
    a time. Returns the ``primed`` records; :class:`TimeLimit` once ``stop_at`` passes first."""
    groups = [g for g in (ids[i::jobs] for i in range(jobs)) if g]
    t0 = time.perf_counter()
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, group in enumerate(groups):
            cmd = _worker_cmd(worker, device, group, providers, "--prime")
            out = open(os.path.join(tmp, f"prime-{i}.jsonl"), "w+")
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL, text=True, env=env, cwd=cwd)
            procs.append((proc, out, _kill_at(proc, stop_at, time.time() + timeout_s)))
        records, stopped = [], False
        for proc, out, expired in procs:
            proc.wait()
            expired.cancel()
            stopped = stopped or expired.fired == "run"
            out.seek(0)
            records += [rec for rec in map(json.loads, filter(lambda ln: ln.startswith("{"), out)) if rec.get("event") == "primed"]
            out.close()
    if stopped:
        raise TimeLimit("time limit, in the priming")
    calls = sum(r["s"] for r in records)
    print(
        f"primed: {len(records)} of {len(ids) * len(providers)} pairs called once in {time.perf_counter() - t0:.0f} s by {len(groups)} "
        f"workers side by side ({calls:.0f} s of calls)",
        file=sys.stderr,
        flush=True,
    )
    return records


def _worker_cmd(worker, device: str, cases: list[str], providers: list[str], *extra: str) -> list[str]:
    """The command of one worker (``worker``: the command before its arguments; default this module)."""
    cmd = [*(worker or [sys.executable, "-m", "triton_swa.benchmark.runner"]), "--worker", "--device", device]
    return cmd + ["--cases", ",".join(cases), "--providers", ",".join(providers), *extra]


def _time_report(rows: list[dict]) -> str:
    """Where the timed run's time went: seconds per provider, and the slowest pairs."""
    timed = [r for r in rows if r.get("s") is not None]
    if not timed:
        return "timed: no pair reported its seconds"
    per: dict = {}
    for r in timed:
        per[r["provider"]] = per.get(r["provider"], 0.0) + r["s"]
    slow = sorted(timed, key=lambda r: -r["s"])[:5]
    return (
        f"timed: {len(timed)} pairs in {sum(per.values()):.0f} s; per provider: "
        + ", ".join(f"{p} {v:.0f}" for p, v in sorted(per.items(), key=lambda kv: -kv[1]))
        + "; slowest: "
        + ", ".join(f"{r['case']} {r['provider']} {r['s']:.1f}" for r in slow)
    )


def _wait(proc, stop_at: float | None) -> None:
    """Wait for ``proc``; :class:`TimeLimit` once ``stop_at`` passes first."""
    if stop_at is None:
        proc.wait()
        return
    try:
        proc.wait(timeout=max(0.0, stop_at - time.time()))
    except subprocess.TimeoutExpired:
        raise TimeLimit("time limit, in the FlashInfer build") from None


def _drive(
    ids: list[str], providers: list[str], device: str, env: dict, timeout_s: float, worker=None, cwd=None, stop_at: float | None = None
) -> list[dict]:
    """The workers of :func:`run`, one after another until every (case, provider) has its row
    (``worker``: the command that starts one, before its arguments; ``cwd``: where it runs). Past
    ``stop_at`` (a ``time.time()``), or on SIGTERM inside :class:`stops_on_sigterm`, the worker is
    killed and the rows so far come back with ``NOT RUN`` rows for the pairs left."""
    total, rows, skip = len(ids) * len(providers), [], set()
    proc = None
    try:
        while True:
            done = {(r["case"], r["provider"]) for r in rows} | skip
            left = [cid for cid in ids if any((cid, p) not in done for p in providers)]
            if not left:
                break
            if stop_at is not None and time.time() > stop_at:
                raise TimeLimit("time limit")
            cmd = _worker_cmd(worker, device, left, providers, "--skip", json.dumps(sorted(done)))
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
            expired = _kill_at(proc, stop_at, time.time() + timeout_s)
            current = None
            for line in proc.stdout:
                if not line.startswith("{"):
                    continue
                rec = json.loads(line)
                if rec["event"] == "start":
                    current = (rec["case"], rec["provider"])
                    _progress(len(rows) + len(skip), total, f"{rec['case']} {rec['provider']}")
                elif rec["event"] == "row":
                    rows.append(rec)
                    current = None
                elif rec["event"] == "tree":  # a comparison's worker: where its package came from
                    print(f"worker: triton_swa {rec['triton_swa']}, reference {rec['reference']}", file=sys.stderr, flush=True)
            proc.wait()
            expired.cancel()
            if expired.fired == "run":
                raise TimeLimit("time limit")
            err = f"killed after {timeout_s:.0f} s (a worker's limit)" if expired.fired == "worker" else proc.stderr.read()
            if current is None and proc.returncode != 0:
                # died outside any provider (building inputs): the rest of its first case is lost
                first = next(cid for cid in left if any((cid, p) not in done for p in providers))
                for p in providers:
                    if (first, p) not in done and not any((r["case"], r["provider"]) == (first, p) for r in rows):
                        rows.append(dict(event="row", case=first, provider=p, status=f"CRASHED (inputs): {_last_line(err)}", us=None))
            elif current is not None:
                rows.append(dict(event="row", case=current[0], provider=current[1], status=f"CRASHED: {_last_line(err)}", us=None))
    except TimeLimit as stop:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        why = f"stopped early: {stop}"
        print(f"\ntriton-swa bench: {why}; the pairs left are NOT RUN rows", file=sys.stderr, flush=True)
        rows += not_run(ids, providers, rows, why)
    return rows


class _kill_at:
    """Kills ``proc`` from a timer thread at ``stop_at`` (the run's limit, a ``time.time()``; None:
    none) or at ``deadline`` (the worker's), whichever comes first, so that a worker stuck in one call
    still ends; ``fired`` says which did: ``"run"``, ``"worker"`` or None."""

    def __init__(self, proc, stop_at: float | None, deadline: float):
        self.fired = None
        which = "run" if stop_at is not None and stop_at <= deadline else "worker"
        at = stop_at if which == "run" else deadline
        self.timer = threading.Timer(max(0.0, at - time.time()), self._fire, args=(proc, which))
        self.timer.daemon = True
        self.timer.start()

    def _fire(self, proc, which: str) -> None:
        self.fired = which
        proc.kill()

    def cancel(self) -> None:
        self.timer.cancel()


def _last_line(text: str) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1][:160] if lines else "no message"


def environment() -> dict:
    """The ``gpu``, ``torch`` and ``triton`` columns of this process's rows."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    return dict(gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", torch=torch.__version__, triton=triton_version)


def to_csv_rows(cases: list[Case], rows: list[dict], sha: str, dirty: str, run_id: str) -> list[dict]:
    """docs/contract.md §7 rows (plus dirty, run id, status and error), ``pct_copy`` against the case's own
    same-bytes copy measured in this run."""
    by_case = {c.id: c for c in cases}
    env = environment()
    # the copy reads and writes the case's bytes: its bandwidth counts both (docs/contract.md §7's copy ceiling)
    copy = {r["case"]: tbps(2 * by_case[r["case"]].nbytes(), r["us"][1]) for r in rows if r["provider"] == "copy_same_bytes" and r["us"]}
    out = []
    for r in rows:
        case = by_case[r["case"]]
        us = r["us"] or (math.nan, math.nan, math.nan)
        eager = r.get("eager_us") or (math.nan, math.nan, math.nan)
        nbytes, flops = case.nbytes(), case.flops()
        if r["provider"] in P.CEILINGS:
            nbytes, flops = nbytes * {"copy_same_bytes": 2, "read_same_bytes": 1}.get(r["provider"], 0), 0
        achieved = tbps(nbytes, us[1])
        ceiling = copy.get(case.id, math.nan)
        out.append(
            dict(
                op=case.op,
                case=case.id,
                provider=r["provider"],
                us_p50=round(us[1], 3),
                us_p20=round(us[0], 3),
                us_p80=round(us[2], 3),
                bytes=nbytes,
                flops=flops,
                tbps=round(achieved, 4),
                tflops=round(flops / (us[1] * 1e-6) / 1e12, 3) if math.isfinite(us[1]) else math.nan,
                pct_copy=round(100 * achieved / ceiling, 1) if math.isfinite(ceiling) else math.nan,
                copy_tbps=round(ceiling, 3),
                **env,
                git_sha=sha,
                date=datetime.date.today().isoformat(),
                dirty=dirty,
                run_id=run_id,
                status=r["status"],
                max_abs_err=r.get("max_abs_err"),
                eager_us_p50=round(eager[1], 3),
            )
        )
    return out


def write_csv(path: Path, rows: list[dict]) -> None:
    """Append ``rows``; refuses rows without a git sha, a dirty flag or a run id."""
    for r in rows:
        if not r.get("git_sha") or not r.get("dirty") or not r.get("run_id"):
            raise ValueError("a benchmark row needs git_sha, dirty and run_id (pass --git-sha and --dirty outside a git checkout)")
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    if not new:
        with path.open() as f:
            reader = csv.DictReader(f)
            header, old = reader.fieldnames, list(reader)
        if not set(header or ()) <= set(COLUMNS):
            raise ValueError(f"{path} has columns this version does not know: {sorted(set(header) - set(COLUMNS))}")
        if header != COLUMNS:  # a file from before a column was added: rewritten with the new header
            with path.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=COLUMNS, restval="")
                writer.writeheader()
                writer.writerows(old)
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        writer.writerows(rows)


def run_ids(path: Path) -> list[str]:
    """The runs of a CSV, in the order they were written."""
    with Path(path).open() as f:
        return list(dict.fromkeys(r["run_id"] for r in csv.DictReader(f)))


def read_csv(path: Path, run_id: str | None = None) -> list[dict]:
    """The rows of one run (the last in the file unless ``run_id``), numbers parsed back."""
    with Path(path).open() as f:
        rows = list(csv.DictReader(f))
    run_id = run_id or (rows[-1]["run_id"] if rows else None)
    rows = [r for r in rows if r["run_id"] == run_id]
    for r in rows:
        for key in ("us_p50", "us_p20", "us_p80", "tbps", "tflops", "pct_copy", "copy_tbps"):
            r[key] = float(r[key])
        r["eager_us_p50"] = float(r.get("eager_us_p50") or "nan")  # absent from older files
    return rows


def summary(rows: list[dict]) -> str:
    """Markdown: one line per case, each provider's p50 (or its status), each peer's time over
    triton_swa's in brackets, and the best peer's. Then, for rows timed eagerly too, the same of the
    eager wall times per call."""
    text = _summary_table(rows, "us_p50", "us", bandwidth=True)
    if any(math.isfinite(r.get("eager_us_p50", math.nan)) for r in rows):
        text += "\n\nEager, back to back (wall time per call):\n\n" + _summary_table(rows, "eager_us_p50", "eager us", bandwidth=False)
    return text


def _summary_table(rows: list[dict], key: str, unit: str, bandwidth: bool) -> str:
    providers = list(dict.fromkeys(r["provider"] for r in rows))
    cases = list(dict.fromkeys(r["case"] for r in rows))
    cell = {(r["case"], r["provider"]): r for r in rows}
    tail = " triton_swa TB/s | % of copy |" if bandwidth else ""
    head = "| case | " + " | ".join(f"{p} {unit}" for p in providers) + f" |{tail} best peer / triton_swa |"
    lines = [head, "|" + " --- |" * (len(providers) + (4 if bandwidth else 2))]
    for cid in cases:
        mine = cell.get((cid, "triton_swa"))
        mine_us = mine[key] if mine and mine["status"].startswith("ok") else math.nan
        vals = []
        for p in providers:
            r = cell.get((cid, p))
            if r is None:
                vals.append("-")
            elif not r["status"].startswith("ok"):
                vals.append(r["status"].split(":")[0])
            elif not math.isfinite(r[key]):
                vals.append("-")
            elif p in ("triton_swa", *P.CEILINGS) or not math.isfinite(mine_us):
                vals.append(f"{r[key]:.2f}")
            else:
                vals.append(f"{r[key]:.2f} ({r[key] / mine_us:.2f}x)")
        peers = [cell[(cid, p)][key] for p in providers if not p.startswith("triton_swa") and p not in P.CEILINGS and (cid, p) in cell]
        peers = [u for u in peers if math.isfinite(u)]
        ratio = f"{min(peers) / mine[key]:.2f}x" if mine and peers and math.isfinite(mine[key]) else "-"
        extra = ""
        if bandwidth:
            tb = f"{mine['tbps']:.2f}" if mine and math.isfinite(mine["tbps"]) else "-"
            pct = f"{mine['pct_copy']:.0f}" if mine and math.isfinite(mine["pct_copy"]) else "-"
            extra = f" {tb} | {pct} |"
        lines.append(f"| {cid} | " + " | ".join(vals) + f" |{extra} {ratio} |")
    return "\n".join(lines)


def plot(csv_path: Path, png_path: Path, run_id: str | None = None) -> bool:
    """One run of the CSV (the last unless ``run_id``) as bars per case and provider: achieved TB/s
    for decode and index builds beside the same-bytes copy and read ceilings, TFLOP/s for prefill and verify (compute
    bound). Regenerated from the CSV alone. False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in read_csv(csv_path, run_id) if r["status"].startswith("ok")]
    panels = [
        ("decode / indices", "tbps", "TB/s (fewest bytes / p50; copy: read + write)", ("decode", "indices")),
        ("prefill / verify", "tflops", "TFLOP/s (attended pairs only)", ("prefill", "verify")),
    ]
    panels = [
        (title, key, label, [r for r in rows if r["op"] in ops and (key == "tbps" or r["provider"] not in P.CEILINGS)])
        for title, key, label, ops in panels
    ]
    panels = [p for p in panels if p[3]]
    if not panels:
        return False
    fig, axes = _figure(plt, panels, 0.9)
    for ax, (title, key, label, sub) in zip(axes[:, 0], panels):
        _bars(ax, [(r["case"], r["provider"], r[key]) for r in sub], 60)
        ax.set_ylabel(label, fontsize=8)
        ax.set_title(f"{title}: triton-swa bench run {rows[0]['run_id']} ({rows[0]['gpu']}, {rows[0]['git_sha']})", fontsize=9)
    _save(fig, png_path)
    return True


def _figure(plt, panels: list[tuple], inches_per_case: float):
    """One row of axes per panel (its rows last in the tuple), as wide as the most cases need."""
    width_cases = max(len({r["case"] for r in p[-1]}) for p in panels)
    return plt.subplots(len(panels), 1, figsize=(max(8, inches_per_case * width_cases), 4.5 * len(panels)), squeeze=False)


def _bars(ax, values: list[tuple], rotation: int) -> None:
    """Grouped bars of ``(case, provider, value)``: one group per case, one bar per provider."""
    cases = list(dict.fromkeys(c for c, _, _ in values))
    providers = list(dict.fromkeys(p for _, p, _ in values))
    value = {(c, p): v for c, p, v in values}
    width = 0.8 / max(len(providers), 1)
    for i, prov in enumerate(providers):
        held = [(j, value[(c, prov)]) for j, c in enumerate(cases) if (c, prov) in value]
        ax.bar([j + i * width for j, _ in held], [v for _, v in held], width, label=prov)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], cases, rotation=rotation, ha="right", fontsize=7)
    ax.legend(fontsize=7)


def _save(fig, png_path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


def plot_serve(csv_path: Path, png_path: Path, run_id: str | None = None) -> bool:
    """One run of an engine CSV (``triton-swa bench --op serve``: the last run unless ``run_id``) as
    bars per phase and backend: output tokens/s of each timed phase, and the time to first token
    (p50, log scale) of each phase and of each cold start. Regenerated from the CSV alone. False when
    matplotlib is missing or the run has no finished phase."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    with Path(csv_path).open() as f:
        rows = [r for r in csv.DictReader(f) if r["op"] == "serve" and r["status"] == "ok"]
    run_id = run_id or (rows[-1]["run_id"] if rows else None)
    rows = [r for r in rows if r["run_id"] == run_id]
    panels = [
        ("output tokens/s (timed phases)", "out_tok_s", False, [r for r in rows if r["out_tok_s"]]),
        ("time to first token p50, ms (phases and cold starts)", "ttft_ms_p50", True, [r for r in rows if r["ttft_ms_p50"]]),
    ]
    panels = [p for p in panels if p[3]]
    if not panels:
        return False
    fig, axes = _figure(plt, panels, 1.2)
    for ax, (label, key, log, sub) in zip(axes[:, 0], panels):
        _bars(ax, [(r["case"].removeprefix("serve-"), r["provider"], float(r[key])) for r in sub], 30)
        if log:
            ax.set_yscale("log")
        ax.set_ylabel(label, fontsize=8)
        ax.set_title(f"SGLang's engine, triton-swa bench --op serve, run {run_id} ({rows[0]['gpu']}, {rows[0]['git_sha']})", fontsize=9)
    _save(fig, png_path)
    return True


def main_worker(argv: list[str], interpreter: bool = True) -> int:
    """A worker of :func:`_drive` (``interpreter``: set Triton's interpreter up on a CPU here; a
    comparison's worker has it from its environment)."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--device", required=True)
    parser.add_argument("--cases", required=True)
    parser.add_argument("--providers", required=True)
    parser.add_argument("--skip", default="[]")
    parser.add_argument("--prime", action="store_true", help="call each pair once, untimed (:func:`prime`)")
    args = parser.parse_args(argv)
    if args.device != "cuda" and interpreter:
        from ..testing import use_interpreter

        use_interpreter()
    load_plugins([m for m in os.environ.get("TRITON_SWA_BENCH_PLUGINS", "").split(",") if m])
    every = {c.id: c for c in _cases_from_env()}
    if args.prime:
        prime(args.cases.split(","), args.providers.split(","), args.device, every)
        return 0
    skip = {tuple(x) for x in json.loads(args.skip)}
    worker(args.cases.split(","), args.providers.split(","), skip, args.device, every)
    return 0


def _cases_from_env() -> list[Case]:
    """The driver's cases, passed to its workers through the environment."""
    return [_case_from_dict(d) for d in json.loads(os.environ.get("TRITON_SWA_BENCH_CASES", "[]"))]


def case_to_dict(c: Case) -> dict:
    return dict(op=c.op, shape=c.shape.name, batch=c.batch, context=c.context, page_size=c.page_size, fp8=c.fp8, new=c.new)


def _case_from_dict(d: dict) -> Case:
    from .cases import SHAPES

    return Case(d["op"], SHAPES[d["shape"]], d["batch"], d["context"], d["page_size"], d["fp8"], d["new"])


if __name__ == "__main__":
    sys.exit(main_worker(sys.argv[1:]))
