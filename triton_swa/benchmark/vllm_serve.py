"""vLLM's real engine on a GPU, one attention backend at a time: its tokens and its speed.

``python -m triton_swa.benchmark.vllm_serve`` starts ``vllm.LLM(model=DIR, attention_backend=B, ...)``
once per (model, mode, backend) in a fresh subprocess (bounded in time), and in that one engine start
runs the phases asked for:

- ``tokens``: a few prompts longer than the sliding window, greedy, EOS ignored, then the same prompts
  again (their blocks are then in vLLM's prefix cache). The parent compares the tokens with
  transformers' ``generate()`` on the same GPU and weights (eager attention, the engines' dtype) under
  the near-tie rule of the SGLang tier (:func:`triton_swa.testing.sglang_engine.tie_tol`), and each
  backend's with the first backend's of the same mode;
- ``load``: batches of ``CONCURRENCY`` requests of ``PROMPT`` random token ids, ``--output-len`` greedy
  tokens each, handed to ``LLM.generate`` one batch at a time: output tokens per second over the phase
  and the mean time of a batch.

Modes: ``graphs`` (``enforce_eager=False``: vLLM's default torch.compile and CUDA graphs at its default
capture sizes), ``eager`` (``enforce_eager=True``) and ``graphs-nocompile`` (CUDA graphs of whole decode
steps without torch.compile: ``compilation_config={"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}``,
for when inductor of this torch does not build vLLM's graphs). Every engine has chunked prefill
(``max_num_batched_tokens`` below the longest prompt) and prefix caching on.

Models: random weights from Gemma 3 and Gemma 4 configs at real sizes
(:data:`triton_swa.benchmark.serve.MODELS`, written by its ``build_model``: bf16); a Gemma 4 directory
reaches vLLM with transformers' form of its config (:func:`~triton_swa.testing.tiny_models.transformers_dir`).
Token ids in and out (``skip_tokenizer_init``).

Results: ``vllm-serve-<date>-<gpu>.csv`` (one row per phase and run, :data:`COLUMNS`),
``vllm-serve-<sha>-<run id>.json`` (everything each run returned) and one printed line per run:
launched (start time, the backend and CUDA-graph mode vLLM reports), tokens equal, or the error with
the last lines of its traceback. ``--dry-run`` builds the models and prints and writes the plan
without starting an engine (what a CPU can check).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from triton_swa.benchmark.serve import MODELS, _prompts, _write, build_model, compare_tokens, reference_tokens, row_provenance
from triton_swa.testing.sglang_engine import REPO_ROOT
from triton_swa.testing.tiny_models import transformers_dir

__all__ = ["COLUMNS", "MODES", "llm_kwargs", "main", "plan_runs", "run_engine"]

COLUMNS = [
    "op",
    "case",
    "provider",
    "mode",
    "out_tok_s",
    "batch_s_mean",
    "batch_tok_s_p50",
    "requests",
    "output_tokens",
    "phase_s",
    "start_s",
    "tokens_vs_hf",
    "tokens_vs_first",
    "gpu",
    "torch",
    "triton",
    "vllm",
    "git_sha",
    "date",
    "dirty",
    "run_id",
    "status",
]

# mode -> LLM arguments
MODES: dict[str, dict[str, Any]] = {
    "graphs": {"enforce_eager": False},
    "eager": {"enforce_eager": True},
    "graphs-nocompile": {"enforce_eager": False, "compilation_config": {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}},
}


def llm_kwargs(model_path: str, backend: str, mode: str, *, dtype: str, max_model_len: int, chunk: int, extra: dict | None = None) -> dict:
    """The ``vllm.LLM`` arguments of one run."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {sorted(MODES)}")
    kw: dict[str, Any] = dict(
        model=model_path,
        tokenizer=model_path,
        skip_tokenizer_init=True,
        attention_backend=backend,
        dtype=dtype,
        seed=0,
        max_model_len=max_model_len,
        max_num_batched_tokens=chunk,
        max_num_seqs=64,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
        gpu_memory_utilization=0.8,
    )
    kw.update(MODES[mode])
    kw.update(extra or {})
    return kw


# the model families this harness serves through vLLM 0.32 (models/gemma3.py and models/gemma4.py; a
# Gemma 4 directory is handed over with transformers' form of its config: tiny_models.transformers_dir)
VLLM_FAMILIES = ("gemma3", "gemma4")


def plan_runs(models: list[str], modes: list[str], backends: list[str]) -> list[dict]:
    """One entry per engine start, in run order: per model, per mode, per backend."""
    for name in models:
        if name not in MODELS:
            raise ValueError(f"unknown model {name!r}; expected one of {sorted(MODELS)}")
        if MODELS[name].family not in VLLM_FAMILIES:
            raise ValueError(f"{name}: only {' and '.join(VLLM_FAMILIES)} models are wired to vLLM here")
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {sorted(MODES)}")
    return [dict(model=m, mode=mode, backend=b, label=f"{m} {b} {mode}") for m in models for mode in modes for b in backends]


def parse_load(text: str) -> list[tuple[int, int, int]]:
    """``PROMPTxCONCURRENCY[xREQUESTS],...`` (``k`` = 1000) -> [(prompt, concurrency, requests)];
    requests default to twice the concurrency."""
    load = []
    for item in filter(None, text.split(",")):
        parts = [int(x) for x in item.lower().replace("k", "000").split("x")]
        if len(parts) not in (2, 3) or min(parts) < 1:
            raise ValueError(f"bad load phase {item!r}: PROMPTxCONCURRENCY[xREQUESTS]")
        load.append((parts[0], parts[1], parts[2] if len(parts) == 3 else 2 * parts[1]))
    return load


# ----------------------------------------------------------------------------------------------
# the engine's side (a subprocess: `python -m triton_swa.benchmark.vllm_serve --worker SPEC RESULT`)


def worker_main(spec_path: str, result_path: str) -> int:
    import traceback

    with open(spec_path) as f:
        spec = json.load(f)
    result: dict[str, Any] = {"ok": False, "stage": "import", "error": "", "phases": []}
    _write(result_path, result)
    try:
        t0 = time.monotonic()
        import vllm
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        result["vllm"] = vllm.__version__
        result["stage"] = "launch"
        _write(result_path, result)
        llm = vllm.LLM(**spec["llm_kwargs"])
        result["start_s"] = time.monotonic() - t0
        config = llm.llm_engine.vllm_config
        result["reported"] = {
            "attention_backend": str(getattr(config.attention_config, "backend", None)),
            "cudagraph_mode": str(config.compilation_config.cudagraph_mode),
            "compilation_mode": str(config.compilation_config.mode),
        }
        _write(result_path, result)

        def greedy(prompts: list[list[int]], n: int) -> list[list[int]]:
            params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
            outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
            return [list(o.outputs[0].token_ids) for o in outs]

        tok = spec.get("tokens")
        if tok:
            result["stage"] = "tokens"
            _write(result_path, result)
            result["tokens"] = greedy(tok["prompts"], tok["max_new_tokens"])
            result["stage"] = "tokens again (prefix cache)"
            _write(result_path, result)
            result["tokens_again"] = greedy(tok["prompts"], tok["max_new_tokens"])
            _write(result_path, result)
        for i, (prompt_len, concurrency, requests) in enumerate(spec.get("load", [])):
            result["stage"] = f"load P{prompt_len} C{concurrency}"
            _write(result_path, result)
            prompts = _prompts(requests, prompt_len, 1000 + i, spec["vocab"])
            # one untimed batch of the phase's shape first (other prompts: no prefix-cache hits), so
            # kernels Triton compiles on first use (prefill splits, batch-size configs) are not timed
            tw = time.perf_counter()
            greedy(_prompts(min(concurrency, requests), prompt_len, 2000 + i, spec["vocab"]), 8)
            warmup_s = time.perf_counter() - tw
            batches, rates, count, t1 = [], [], 0, time.perf_counter()
            for j in range(0, len(prompts), concurrency):
                tb = time.perf_counter()
                n = sum(map(len, greedy(prompts[j : j + concurrency], spec["output_len"])))
                batches.append(time.perf_counter() - tb)
                rates.append(n / batches[-1])
                count += n
            phase_s = time.perf_counter() - t1
            result["phases"].append(
                dict(
                    prompt_len=prompt_len,
                    concurrency=concurrency,
                    requests=len(prompts),
                    output_tokens=count,
                    phase_s=phase_s,
                    out_tok_s=count / phase_s,
                    batch_s_mean=statistics.mean(batches),
                    # each batch's own prompts: the median over them is the rate of rotated inputs
                    batch_tok_s_p50=statistics.median(rates),
                    batches=len(batches),
                    warmup_s=warmup_s,
                )
            )
            _write(result_path, result)
        result["ok"], result["stage"] = True, "done"
    except BaseException as e:  # noqa: BLE001 - everything is reported to the parent
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()
        traceback.print_exc()
    finally:
        _write(result_path, result)
    sys.stdout.flush()
    # vLLM's engine-core process goes with this process group (the parent kills it); skip interpreter teardown
    os._exit(0 if result["ok"] else 1)


# ----------------------------------------------------------------------------------------------
# the parent's side


def engine_env(extra: dict | None = None) -> dict:
    """The environment of an engine subprocess: the tree first on PYTHONPATH, only triton-swa's vLLM
    plugin (which registers TRITON_SWA), Triton compiled (never its interpreter)."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env.update(PYTHONUNBUFFERED="1", VLLM_PLUGINS=env.get("VLLM_PLUGINS", "triton_swa"))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra or {})
    return env


def run_engine(spec: dict, *, timeout_s: float = 600.0, log_path: str | None = None, env: dict | None = None) -> dict:
    """One engine start running ``spec`` (``llm_kwargs``, ``tokens``, ``load``, ``output_len``, ``vocab``)
    in a subprocess; never raises for an engine failure (``ok`` False, ``stage``, ``error``,
    ``tracebacks``, ``log_tail``)."""
    from triton_swa.testing.sglang_engine import _kill_group, extract_tracebacks

    with tempfile.TemporaryDirectory(prefix="triton_swa_vllm_") as tmp:
        spec_path, result_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "result.json")
        log_path = log_path or os.path.join(tmp, "log.txt")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        t0 = time.monotonic()
        timed_out = False
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "triton_swa.benchmark.vllm_serve", "--worker", spec_path, result_path],
                cwd=tmp,
                env=engine_env(env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
        _kill_group(proc)
        wall = time.monotonic() - t0
        with open(log_path, errors="replace") as f:
            text = f.read()
        result = {"ok": False, "stage": "worker", "error": f"the worker exited with {proc.returncode} and wrote no result"}
        if os.path.exists(result_path):
            with open(result_path) as f:
                result = json.load(f)
        if timed_out:
            result["ok"] = False
            result["error"] = f"no result within {timeout_s:.0f} s (stage reached: {result.get('stage')})"
        result.update(wall_s=wall, tracebacks=extract_tracebacks(text))
        if not result["ok"]:
            result["log_tail"] = "\n".join(text.splitlines()[-40:])
        return result


def _last_lines(r: dict, n: int = 6) -> str:
    """The last lines of the first traceback a failed run printed (or of its log)."""
    text = (r.get("tracebacks") or [r.get("traceback") or r.get("log_tail") or ""])[0]
    return "\n".join("      " + line for line in text.splitlines()[-n:])


def run_line(r: dict) -> str:
    """The printed line of one run: launched (and what vLLM reports), or the error."""
    if r.get("start_s") is None:
        return f"  {r['label']}: ERROR at {r.get('stage')}: {r.get('error')} (wall {r['wall_s']:.0f} s)\n{_last_lines(r)}"
    rep = r.get("reported", {})
    line = (
        f"  {r['label']}: launched in {r['start_s']:.0f} s (attention {rep.get('attention_backend')}, "
        f"cudagraph_mode {rep.get('cudagraph_mode')}, compilation {rep.get('compilation_mode')})"
    )
    if not r["ok"]:
        line += f"; ERROR at {r.get('stage')}: {r.get('error')}\n{_last_lines(r)}"
    for ph in r.get("phases", []):
        line += (
            f"\n    P{ph['prompt_len']} C{ph['concurrency']} x{ph['requests']}: {ph['out_tok_s']:.0f} out tok/s, "
            f"{ph['batch_s_mean']:.2f} s per batch; per batch, median of {ph.get('batches', '?')}: "
            f"{ph.get('batch_tok_s_p50', float('nan')):.0f} out tok/s"
        )
    return line


def report_run_tokens(r: dict, reference: tuple | None, first: dict[str, dict], dtype: str) -> None:
    """One run's tokens against transformers' (near-tie rule), against its own second pass (prefix
    cache) and against the first backend's of its mode (``first``: mode -> that run, filled here);
    sets ``tokens_vs_hf`` / ``tokens_vs_first`` and prints one line."""
    from triton_swa.testing.sglang_engine import first_divergence

    if not r.get("tokens"):
        return
    parts = []
    if reference is not None:
        c = compare_tokens(r["tokens"], *reference, dtype)
        r["vs_transformers"] = c
        r["tokens_vs_hf"] = f"{c['equal']} equal, {c['near_tie']} near-tie, {c['differ']} differ" + (
            f" (VACUOUS: {c['one_token']} reference outputs repeat one token)" if c["one_token"] else ""
        )
        detail = "; ".join(
            f"req {i}: first differs at {q['first']}, gap {q['gap']:.4f} (tol {q['tol']:.4f})"
            for i, q in enumerate(c["requests"])
            if not q["equal"]
        )
        parts.append(f"vs transformers {r['tokens_vs_hf']}" + (f" [{detail}]" if detail else ""))
    again = r.get("tokens_again")
    if again is not None:
        parts.append(f"prefix-cached pass {sum(a == b for a, b in zip(again, r['tokens']))}/{len(again)} equal")
    ref = first.setdefault(r["mode"], r)
    if ref is not r:
        firsts = [first_divergence(x, y) for x, y in zip(r["tokens"], ref["tokens"])]
        r["tokens_vs_first"] = f"{sum(f is None for f in firsts)}/{len(firsts)} equal to {ref['backend']}"
        parts.append(f"vs {ref['backend']} {r['mode']}: {r['tokens_vs_first']}")
    print(f"  {r['label']} tokens: " + "; ".join(parts), flush=True)


def _environment() -> dict:
    import torch
    import triton

    gpu = torch.cuda.get_device_name(0).replace(" ", "_") if torch.cuda.is_available() else "cpu"
    return {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m triton_swa.benchmark.vllm_serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", nargs=2, metavar=("SPEC", "RESULT"), help=argparse.SUPPRESS)
    wired = sorted(k for k, m in MODELS.items() if m.family in VLLM_FAMILIES and "draft" not in k)
    p.add_argument("--models", default="gemma3-1b", help=f"comma-separated, of {wired}")
    p.add_argument(
        "--backends", default="TRITON_SWA,TRITON_ATTN", help="vLLM attention backends, comma-separated (the first is the reference)"
    )
    p.add_argument("--modes", default="graphs,eager", help=f"comma-separated, of {sorted(MODES)}")
    p.add_argument("--no-tokens", action="store_true", help="skip the token check")
    p.add_argument("--token-prompts", default="600,1100,1700", help="prompt lengths of the token check (past the window)")
    p.add_argument("--token-new", type=int, default=32, help="greedy tokens per prompt in the token check")
    p.add_argument("--load", default="2048x1x2,2048x16x32", help="PROMPTxCONCURRENCY[xREQUESTS],... ('' for none)")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", help="the engines' and transformers' dtype (weights are written in bf16 at real sizes)")
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--chunk", type=int, default=1024, help="max_num_batched_tokens: prompts longer than this prefill in chunks")
    p.add_argument("--llm-arg", action="append", default=[], help="KEY=JSON, an extra vllm.LLM argument")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per engine start")
    p.add_argument("--dry-run", action="store_true", help="build the models, print and write the plan; start no engine")
    p.add_argument("--model-root", default=os.path.join(tempfile.gettempdir(), "triton_swa_vllm_models"))
    p.add_argument("--out", default=None, help="folder for the CSV, the JSON and the engines' logs")
    p.add_argument("--git-sha", default=None)
    p.add_argument("--dirty", default=None)
    a = p.parse_args(argv)
    if a.worker:
        return worker_main(*a.worker)

    runs_plan = plan_runs(a.models.split(","), a.modes.split(","), a.backends.split(","))
    load = parse_load(a.load)
    extra = {}
    for kv in a.llm_arg:
        k, v = kv.split("=", 1)
        extra[k] = json.loads(v)
    out = Path(a.out or tempfile.mkdtemp(prefix="vllm_serve_"))
    out.mkdir(parents=True, exist_ok=True)
    env0 = _environment()
    from triton_swa.benchmark.runner import provenance

    sha, dirty = provenance(a.git_sha, a.dirty)
    run_id = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    print(f"vllm_serve: {env0}, git {sha} ({dirty}); {len(runs_plan)} engine starts", flush=True)
    if env0["gpu"] == "cpu" and not a.dry_run:
        print("vllm_serve: no GPU here (vLLM on a CPU serves with its own CPU attention whatever the flag says): --dry-run only")
        return 2
    device = "cuda" if env0["gpu"] != "cpu" else "cpu"
    records, rows = [], []
    for name in dict.fromkeys(r["model"] for r in runs_plan):
        t0 = time.monotonic()
        path = build_model(name, a.model_root, weights=True)
        m = MODELS[name]
        print(f"== {name}: {m.note}; weights written ({time.monotonic() - t0:.0f} s) at {path}", flush=True)
        tokens = None
        if not a.no_tokens:
            lens = [int(x) for x in a.token_prompts.split(",")]
            tokens = {
                "prompts": [pr for i, n in enumerate(lens) for pr in _prompts(1, n, 77 + i, m.vocab_size)],
                "max_new_tokens": a.token_new,
            }
        reference = reference_tokens(path, tokens, device, a.dtype) if tokens and not a.dry_run else None
        engine_path = transformers_dir(path)
        runs, first = [], {}
        for plan in (r for r in runs_plan if r["model"] == name):
            kw = llm_kwargs(
                engine_path, plan["backend"], plan["mode"], dtype=a.dtype, max_model_len=a.max_model_len, chunk=a.chunk, extra=extra
            )
            spec = {"llm_kwargs": kw, "tokens": tokens, "load": [list(x) for x in load], "output_len": a.output_len, "vocab": m.vocab_size}
            if a.dry_run:
                print(f"  {plan['label']}: vllm.LLM(**{kw})", flush=True)
                records.append(dict(plan, spec=spec, dry_run=True))
                continue
            log = str(out / f"engine-{name}-{plan['backend']}-{plan['mode']}.log")
            r = run_engine(spec, timeout_s=a.timeout, log_path=log)
            r.update(plan, llm_kwargs=kw)
            print(run_line(r), flush=True)
            report_run_tokens(r, reference, first, a.dtype)
            runs.append(r)
            # what has run so far, so a call cut short by its time limit still leaves its results
            _write(str(out / f"vllm-serve-{sha}-{run_id}.json"), records + runs)
        for r in runs:
            status = "ok" if r["ok"] else f"ERROR at {r.get('stage')}: {r.get('error', '')[:200]}"
            for ph in r.get("phases") or [None]:
                row = {c: "" for c in COLUMNS}
                row.update(
                    op="vllm_serve",
                    provider=r["backend"],
                    mode=r["mode"],
                    start_s=f"{r['start_s']:.1f}" if r.get("start_s") is not None else "",
                    tokens_vs_hf=r.get("tokens_vs_hf", ""),
                    tokens_vs_first=r.get("tokens_vs_first", ""),
                    vllm=r.get("vllm", ""),
                    **row_provenance(sha, dirty, run_id, status, env0),
                )
                if ph is None:
                    row["case"] = f"vllm-{name}-{r['mode']}-tokens"
                else:
                    row["case"] = f"vllm-{name}-{r['mode']}-P{ph['prompt_len']}-C{ph['concurrency']}-O{a.output_len}"
                    row.update(
                        out_tok_s=f"{ph['out_tok_s']:.1f}",
                        batch_s_mean=f"{ph['batch_s_mean']:.3f}",
                        batch_tok_s_p50=f"{ph['batch_tok_s_p50']:.1f}" if "batch_tok_s_p50" in ph else "",
                        phase_s=f"{ph['phase_s']:.2f}",
                        requests=ph["requests"],
                        output_tokens=ph["output_tokens"],
                    )
                rows.append(row)
        records.extend(runs)
    if a.dry_run:
        with open(out / f"vllm-serve-plan-{run_id}.json", "w") as f:
            json.dump(records, f, indent=1)
        print(f"plan: {out / f'vllm-serve-plan-{run_id}.json'}")
        return 0
    csv_path = out / f"vllm-serve-{datetime.date.today().isoformat()}-{env0['gpu']}.csv"
    new = not csv_path.exists()
    with open(csv_path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            w.writeheader()
        w.writerows(rows)
    _write(str(out / f"vllm-serve-{sha}-{run_id}.json"), records)
    print(f"rows: {csv_path}")
    return 0 if records and all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
