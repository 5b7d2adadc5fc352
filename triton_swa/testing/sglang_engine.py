"""The real-engine conformance kit: SGLang's own ``sglang.Engine`` (or ``sglang.launch_server``) on a
model directory, one attention backend at a time, against transformers' greedy ``generate()``.

- :func:`run_engine` starts ``sglang.Engine`` in a fresh Python subprocess with the environment the
  engine needs on a machine without CUDA (below), decodes every prompt greedily in one batch, and
  returns an :class:`EngineRun`: output token ids, SGLang's speculative counters when it reports
  them, timings, and, when the launch or the generation failed, the error text and the tracebacks
  the engine's own processes printed (an engine's scheduler dies in a child process: the parent only
  says "scheduler died").
- :func:`run_server` does the same through ``python -m sglang.launch_server`` on ``127.0.0.1`` (a
  free port) and ``POST /generate``, bounded in time, and shuts the server down.
- :func:`hf_greedy` is the reference: transformers' ``generate(do_sample=False)``, eager attention.

Every scenario is parameterised by the attention backend name: ``triton_swa`` is the backend under
test; SGLang's ``torch_native`` and ``triton`` are controls run the same way.

The environment of the engine's processes (:func:`engine_env`), set before anything imports SGLang
or Triton and inherited by the processes the engine spawns:

- ``SGLANG_USE_CPU_ENGINE=1``: SGLang's CPU code paths (without it, rotary embeddings import
  vLLM's compiled ops);
- ``TORCHDYNAMO_DISABLE=1``: no inductor builds of SGLang's ``torch.compile``'d helpers (about 45 s
  on the first request of a CPU engine);
- ``TRITON_INTERPRET=1``: triton-swa's Triton kernels (and SGLang's ``triton`` backend's) run in
  Triton's interpreter;
- ``SGLANG_PLUGINS=triton_swa``: SGLang loads only this project's plugin (the ``sglang.srt.plugins``
  entry point, which registers ``--attention-backend triton_swa``), for controls too, so every
  backend runs in the same set-up;
- ``PYTHONPATH``: the caller's ``pythonpath`` first (test stubs such as an ``sgl_kernel`` stand-in),
  then the inherited one. ``sys.path`` would not reach the engine's spawned processes.

This module imports neither SGLang nor transformers at import time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["CONTROL_BACKENDS", "EngineRun", "Speculative", "engine_env", "first_divergence", "hf_greedy", "run_engine", "run_server"]

CONTROL_BACKENDS = ("torch_native", "triton")
# what SGLang reports in meta_info about speculative decoding (tokenizer_manager), kept per prompt
SPEC_META_KEYS = (
    "spec_verify_ct",
    "spec_accept_length",
    "spec_accept_rate",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "completion_tokens",
)
# Engine arguments of the CPU tier (small pools: the models are tiny; no CUDA graphs on a CPU).
DEFAULT_ENGINE_ARGS: dict[str, Any] = {
    "device": "cpu",
    "disable_cuda_graph": True,
    "mem_fraction_static": 0.3,  # the pools are capped by max_total_tokens; a small fraction fails SGLang's
    # free-memory check whenever another process allocates during the engine's start
    "max_total_tokens": 4096,
    "context_length": 512,
    "random_seed": 0,
    "log_level": "info",  # the pool and token-usage lines (EngineRun.info)
    "decode_log_interval": 10,
}


@dataclasses.dataclass
class Speculative:
    """Speculative-decoding settings, as SGLang's ``speculative_*`` server arguments."""

    algorithm: str  # STANDALONE, EAGLE, EAGLE3, NGRAM, DFLASH, ...
    draft_model_path: str | None = None
    num_steps: int | None = 3
    eagle_topk: int | None = 1
    num_draft_tokens: int | None = 4
    draft_attention_backend: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def engine_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {"speculative_algorithm": self.algorithm}
        for key, value in (
            ("speculative_draft_model_path", self.draft_model_path),
            ("speculative_num_steps", self.num_steps),
            ("speculative_eagle_topk", self.eagle_topk),
            ("speculative_num_draft_tokens", self.num_draft_tokens),
            ("speculative_draft_attention_backend", self.draft_attention_backend),
        ):
            if value is not None:
                args[key] = value
        args.update(self.extra)
        return args


@dataclasses.dataclass
class EngineRun:
    """What one engine (or server) run returned. ``ok`` is False when the launch or the generation
    failed; ``stage`` says where (``"launch"``, ``"generate"``, ``"timeout"``, ``"worker"``)."""

    backend: str
    model_path: str
    ok: bool
    outputs: list[list[int]]
    meta: list[dict[str, Any]]
    stage: str = ""
    error: str = ""
    tracebacks: list[str] = dataclasses.field(default_factory=list)
    start_s: float = 0.0
    generate_s: float = 0.0
    wall_s: float = 0.0
    log_tail: str = ""
    engine_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    # SGLang's log lines about the KV pools, token usage and plugins (engine log level "info")
    info: list[str] = dataclasses.field(default_factory=list)

    @property
    def kv_pool(self) -> str | None:
        """The KV pool SGLang built, from its log: ``"SWAKVPool"`` (hybrid SWA memory) or ``"MHATokenToKVPool"``."""
        if any("SWAKVPool mem usage" in line for line in self.info):
            return "SWAKVPool"
        if any("KV Cache is allocated" in line for line in self.info):
            return "MHATokenToKVPool"
        return None

    @property
    def accept_lengths(self) -> list[float | None]:
        """``spec_accept_length`` per prompt (generated tokens per verify step), None where unreported."""
        return [m.get("spec_accept_length") for m in self.meta]

    def describe(self) -> str:
        """A one-paragraph account for assertion messages: the error and the engine's tracebacks."""
        if self.ok:
            return f"{self.backend} on {self.model_path}: ok ({len(self.outputs)} outputs, start {self.start_s:.1f}s)"
        parts = [f"{self.backend} on {self.model_path}: FAILED at {self.stage}: {self.error}"]
        for tb in self.tracebacks:
            parts.append("--- traceback from the engine's processes ---\n" + tb)
        if not self.tracebacks and self.log_tail:
            parts.append("--- log tail ---\n" + self.log_tail)
        return "\n".join(parts)


def engine_env(
    pythonpath: Sequence[str] = (),
    plugins: str | None = "triton_swa",
    extra: Mapping[str, str] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of an engine subprocess (see the module docstring); ``extra`` is added last
    (e.g. ``SGLANG_SWA_EVICTION_INTERVAL``)."""
    env = dict(os.environ if base is None else base)
    env.update(SGLANG_USE_CPU_ENGINE="1", TORCHDYNAMO_DISABLE="1", TRITON_INTERPRET="1", PYTHONUNBUFFERED="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if plugins is None:
        env.pop("SGLANG_PLUGINS", None)
    else:
        env["SGLANG_PLUGINS"] = plugins
    paths = [os.path.abspath(p) for p in pythonpath]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra or {})
    return env


_TB_START = "Traceback (most recent call last):"


def extract_tracebacks(log: str, limit: int = 4) -> list[str]:
    """The distinct Python tracebacks in ``log`` (distinct by their exception line), at most ``limit``
    (the first ones, where root causes are, and the last one). A traceback may start mid-line (SGLang's
    scheduler logs ``[time TP0] Scheduler hit an exception: Traceback ...``); its exception message
    may span a few lines."""
    lines = log.splitlines()
    blocks: dict[str, str] = {}
    i = 0
    while i < len(lines):
        if _TB_START not in lines[i]:
            i += 1
            continue
        block = [lines[i][lines[i].index(_TB_START) :]]
        i += 1
        while i < len(lines) and (not lines[i].strip() or lines[i][:1].isspace()):
            block.append(lines[i])
            i += 1
        key = lines[i].strip() if i < len(lines) else ""
        while i < len(lines) and len(block) < 400:
            line = lines[i]
            if _TB_START in line or line.startswith("[20") or (line.strip() == "" and block[-1].strip() == ""):
                break
            block.append(line)
            i += 1
            if i < len(lines) and lines[i][:1].isspace() and not lines[i].strip().startswith("-"):
                break
        if key and key not in blocks:
            blocks[key] = "\n".join(block).rstrip()
    found = list(blocks.values())
    if len(found) > limit:
        found = found[: limit - 1] + found[-1:]
    return found


_INFO_MARKERS = ("SWAKVPool", "sliding window memory pool", "KV Cache is allocated", "token usage", "plugin", "Plugin", "Hybrid SWA")


def _info_lines(text: str) -> list[str]:
    return [line[:400] for line in text.splitlines() if any(m in line for m in _INFO_MARKERS) and "server_args=" not in line]


def _tail(text: str, lines: int = 60) -> str:
    noisy = (
        "Loading safetensors",
        "Multi-thread loading",
        "Writing model shards",
        "warnings.warn(",
        "UserWarning",
        "server_args=",
        " INFO ",
    )
    kept = [line for line in text.splitlines() if not any(n in line for n in noisy)]
    return "\n".join(kept[-lines:])


def _sampling(max_new_tokens: int) -> dict[str, Any]:
    # greedy, a fixed number of tokens (random-weight models emit EOS whenever they like)
    return {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}


def _spec_meta(meta_info: Mapping[str, Any]) -> dict[str, Any]:
    return {k: meta_info[k] for k in SPEC_META_KEYS if k in meta_info}


# ----------------------------------------------------------------------------------------------
# sglang.Engine in a subprocess


def run_engine(
    model_path: str,
    attention_backend: str,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    speculative: Speculative | None = None,
    dtype: str = "float32",
    engine_args: Mapping[str, Any] | None = None,
    pythonpath: Sequence[str] = (),
    plugins: str | None = "triton_swa",
    env: Mapping[str, str] | None = None,
    timeout_s: float = 600.0,
    python: str | None = None,
    alias_backends_in_model_checks: Mapping[str, str] | None = None,
) -> EngineRun:
    """Run ``sglang.Engine(model_path, attention_backend=...)`` in a fresh subprocess and decode
    ``prompts`` (token ids) greedily, ``max_new_tokens`` each, in one batch.

    ``engine_args`` override :data:`DEFAULT_ENGINE_ARGS` (any ``ServerArgs`` field). Never raises for
    an engine failure: the returned :class:`EngineRun` has ``ok=False`` and the error text.

    ``alias_backends_in_model_checks`` (controls only, e.g. ``{"torch_native": "triton"}``) makes
    SGLang's per-model allow-lists (``arg_groups/model_hook.py``) read a backend under another name;
    the engine still runs the backend it was given. Recorded in ``EngineRun.engine_args``.
    """
    args = dict(DEFAULT_ENGINE_ARGS)
    args.update(model_path=model_path, attention_backend=attention_backend, dtype=dtype)
    if speculative is not None:
        args.update(speculative.engine_args())
    if engine_args:
        args.update(engine_args)
    spec = {
        "engine_args": args,
        "prompts": [list(map(int, p)) for p in prompts],
        "sampling_params": _sampling(max_new_tokens),
        "alias_backends_in_model_checks": dict(alias_backends_in_model_checks or {}),
    }
    recorded = dict(args, alias_backends_in_model_checks=dict(alias_backends_in_model_checks or {}))
    run = EngineRun(backend=attention_backend, model_path=model_path, ok=False, outputs=[], meta=[], engine_args=recorded)
    with tempfile.TemporaryDirectory(prefix="triton_swa_engine_") as tmp:
        spec_path, result_path, log_path = (os.path.join(tmp, n) for n in ("spec.json", "result.json", "log.txt"))
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        t0 = time.monotonic()
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [python or sys.executable, "-m", "triton_swa.testing._engine_worker", spec_path, result_path],
                cwd=tmp,
                env=engine_env(pythonpath, plugins, env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: a timeout ends the engine's children too
            )
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
        run.wall_s = time.monotonic() - t0
        _kill_group(proc)  # children an engine left behind
        with open(log_path, errors="replace") as f:
            log_text = f.read()
        run.log_tail = _tail(log_text)
        run.tracebacks = extract_tracebacks(log_text)
        run.info = _info_lines(log_text)
        result = None
        if os.path.exists(result_path):
            with open(result_path) as f:
                result = json.load(f)
        if result is not None:
            run.ok = result["ok"]
            run.stage = result.get("stage", "")
            run.error = result.get("error", "")
            run.outputs = result.get("outputs", [])
            run.meta = result.get("meta", [])
            run.start_s = result.get("start_s", 0.0)
            run.generate_s = result.get("generate_s", 0.0)
        if timed_out:
            run.ok, run.stage = False, "timeout"
            run.error = f"no result within {timeout_s:.0f}s" + (f" (last stage reached: {result['stage']})" if result else "")
        elif result is None:
            run.ok, run.stage = False, "worker"
            run.error = f"the engine worker exited with {proc.returncode} and wrote no result"
        elif not run.ok and not run.error:
            # SGLang ends its own process (SIGQUIT from a dying scheduler) before the worker can report
            last = run.tracebacks[-1].splitlines()[-1] if run.tracebacks else "no traceback in the log"
            run.error = f"the engine process exited with {proc.returncode} during {run.stage}: {last}"
    return run


def _kill_group(proc: subprocess.Popen) -> None:
    """End the process group this module started for ``proc`` (TERM, then KILL)."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # the leader is gone; give the group's other members a moment, then make sure
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


# ----------------------------------------------------------------------------------------------
# python -m sglang.launch_server + HTTP


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(url: str, payload: Any | None = None, timeout: float = 10.0) -> tuple[int, str]:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _cli_args(args: Mapping[str, Any]) -> list[str]:
    out = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        else:
            out += [flag, str(value)]
    return out


def run_server(
    model_path: str,
    attention_backend: str,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    speculative: Speculative | None = None,
    dtype: str = "float32",
    engine_args: Mapping[str, Any] | None = None,
    pythonpath: Sequence[str] = (),
    plugins: str | None = "triton_swa",
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 240.0,
    request_timeout_s: float = 300.0,
    python: str | None = None,
) -> EngineRun:
    """As :func:`run_engine`, through ``python -m sglang.launch_server`` on 127.0.0.1 and
    ``POST /generate`` (one batched request); the server is shut down before returning."""
    args = dict(DEFAULT_ENGINE_ARGS)
    args.update(model_path=model_path, attention_backend=attention_backend, dtype=dtype)
    if speculative is not None:
        args.update(speculative.engine_args())
    if engine_args:
        args.update(engine_args)
    port = _free_port()
    args.update(host="127.0.0.1", port=port)
    base = f"http://127.0.0.1:{port}"
    run = EngineRun(backend=attention_backend, model_path=model_path, ok=False, outputs=[], meta=[], engine_args=args)
    with tempfile.TemporaryDirectory(prefix="triton_swa_server_") as tmp:
        log_path = os.path.join(tmp, "server.log")
        t0 = time.monotonic()
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [python or sys.executable, "-m", "sglang.launch_server", *_cli_args(args)],
                cwd=tmp,
                env=engine_env(pythonpath, plugins, env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            run.stage = "launch"
            ready = False
            while time.monotonic() - t0 < ready_timeout_s:
                if proc.poll() is not None:
                    run.error = f"launch_server exited with {proc.returncode} before it was ready"
                    break
                try:
                    status, _ = _http(base + "/model_info", timeout=2.0)
                    if status == 200:
                        ready = True
                        break
                except (OSError, urllib.error.URLError):
                    pass
                time.sleep(0.5)
            else:
                run.error = f"server not ready within {ready_timeout_s:.0f}s"
            run.start_s = time.monotonic() - t0
            if ready:
                run.stage = "generate"
                t1 = time.monotonic()
                payload = {"input_ids": [list(map(int, p)) for p in prompts], "sampling_params": _sampling(max_new_tokens)}
                try:
                    status, body = _http(base + "/generate", payload, timeout=request_timeout_s)
                except (OSError, urllib.error.URLError) as e:
                    status, body = -1, f"{type(e).__name__}: {e}"
                run.generate_s = time.monotonic() - t1
                if status == 200:
                    items = json.loads(body)
                    items = items if isinstance(items, list) else [items]
                    run.outputs = [list(it["output_ids"]) for it in items]
                    run.meta = [_spec_meta(it.get("meta_info", {})) for it in items]
                    run.ok, run.stage = True, "done"
                else:
                    run.error = f"POST /generate answered {status}: {body[:2000]}"
        finally:
            _kill_group(proc)
            run.wall_s = time.monotonic() - t0
            with open(log_path, errors="replace") as f:
                log_text = f.read()
            run.log_tail = _tail(log_text)
            run.tracebacks = extract_tracebacks(log_text)
            run.info = _info_lines(log_text)
    return run


# ----------------------------------------------------------------------------------------------
# the transformers reference


def hf_greedy(
    model_path: str,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    dtype: str | None = None,
    return_margins: bool = False,
    device: str = "cpu",
    return_top2: bool = False,
    batched: bool = False,
) -> Any:
    """transformers' greedy ``generate(do_sample=False)`` of each prompt, eager attention, no EOS stop.

    ``dtype`` defaults to the model's (float32 for the tiny Gemmas, bfloat16 for gpt-oss). Models
    written by :mod:`triton_swa.testing.tiny_models` load through its ``load_hf_config``. With
    ``return_margins``, returns ``(tokens, margins)``: ``margins[i][t]`` is the relative gap
    ``(top1 - top2) / |top1|`` of the logits at new token ``t`` of prompt ``i``. Where it is within
    rounding (bf16 keeps 8 significant bits: a relative spacing of 2**-8 to 2**-7), another correct
    implementation may pick the runner-up. With ``return_top2`` (instead), returns ``(tokens, gaps,
    tops)``: the absolute top-2 logit gap and ``|top1|`` at each new token. ``device``: where the
    model runs (the GPU engine tier's reference runs on the GPU). ``batched`` (a thousand prompts on
    a GPU): one ``generate()`` per distinct prompt length, the prompts of that length stacked (no
    padding, so each row's tokens are its prompt's alone, up to the rounding of a batched matmul);
    otherwise one per prompt.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from .tiny_models import load_hf_config

    config = load_hf_config(model_path)
    if dtype is None:
        dtype = str(getattr(config, "dtype", None) or "float32").removeprefix("torch.")
    model = AutoModelForCausalLM.from_pretrained(model_path, config=config, attn_implementation="eager", dtype=getattr(torch, dtype))
    model.to(device).eval()
    groups: dict[Any, list[int]] = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(len(prompt) if batched else i, []).append(i)
    outputs: list[list[int]] = [[] for _ in prompts]
    margins: list[list[float]] = [[] for _ in prompts]
    gaps: list[list[float]] = [[] for _ in prompts]
    tops: list[list[float]] = [[] for _ in prompts]
    with torch.no_grad():
        for rows in groups.values():
            ids = torch.tensor([list(map(int, prompts[i])) for i in rows], device=device)
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                min_new_tokens=0,
                eos_token_id=None,
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
            )
            top2 = torch.stack([step.float() for step in out.logits], dim=1).topk(2, dim=-1).values  # [rows, steps, 2]
            for j, i in enumerate(rows):
                top1, gap = top2[j, :, 0], top2[j, :, 0] - top2[j, :, 1]
                outputs[i] = out.sequences[j, ids.shape[1] :].tolist()
                margins[i] = (gap / top1.abs().clamp_min(1e-30)).tolist()
                gaps[i], tops[i] = gap.tolist(), top1.abs().tolist()
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    if return_top2:
        return outputs, gaps, tops
    return (outputs, margins) if return_margins else outputs


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where two token lists differ (a length difference counts), None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ---- the seed's failure, live: reading the prefix-rule plugin's step log ----------------------
#
# SGLang builds a STANDALONE Gemma 4 draft its own SWAKVPool on the target's allocator, sharing the
# allocator's full->SWA mapping. Full and SWA slot ids stay equal while both sides hand out fresh
# slots in lockstep and part once freed slots come back in other orders (SWA slots freed by window
# eviction, full ones when a request ends). These engine arguments make that happen mid-run: pools
# of 128 slots, full and SWA alike, two requests at a time, no radix cache, so a third prompt runs on
# slots its predecessors freed. The plugin is tests/engine/plugins/triton_swa_prefix_rule.py.
DRIFT_ENGINE_ARGS = {"max_total_tokens": 128, "swa_full_tokens_ratio": 1.0, "max_running_requests": 2, "disable_radix_cache": True}


def steps_around_drift(step_log: Sequence[str]) -> tuple[list[list[int]], list[list[int]]]:
    """Accepted drafts per request and verify step (``V`` lines), before and after the first draft
    write whose SWA slot differs from its full slot (a ``D`` line with a count above 0)."""
    before: list[list[int]] = []
    after: list[list[int]] = []
    drifted = False
    for line in step_log:
        kind, *values = line.split()
        if kind == "D" and int(values[0]) > 0:
            drifted = True
        elif kind == "V":
            (after if drifted else before).append([int(v) for v in values])
    return before, after


def mean_accepted(rows: Sequence[Sequence[int]]) -> float:
    """The mean accepted drafts over every request of every step (NaN for none)."""
    flat = [x for row in rows for x in row]
    return sum(flat) / len(flat) if flat else float("nan")


def acceptance_windows(rows: Sequence[Sequence[int]], size: int = 8) -> str:
    """Acceptance length (1 + accepted drafts) per window of ``size`` verify steps, as text."""
    return " ".join(f"{1 + mean_accepted(rows[i : i + size]):.2f}" for i in range(0, len(rows), size))


# ---- the GPU engine tier's environment and token rule (triton_swa.benchmark.serve, sglang_load) ----
REPO_ROOT = Path(__file__).resolve().parents[2]  # the tree: the test stubs live under tests/
CUDA_STUBS = REPO_ROOT / "tests" / "integration" / "stubs_cuda"
TORCHVISION_STUBS = REPO_ROOT / "tests" / "integration" / "stubs"
ENGINE_PLUGINS = REPO_ROOT / "tests" / "engine" / "plugins"  # the test-side SGLang plugins (and their entry points)


def sgl_kernel_path(device: str) -> list[str]:
    """The stand-in's folder when the real ``sgl_kernel`` does not import here (it loads only on the
    torch it was built for), plus the torchvision stub where the real one does not import. On a CPU
    (this harness's own test) the CPU engine tier's stand-in."""
    paths = []
    stubs = CUDA_STUBS if device == "cuda" else REPO_ROOT / "tests" / "engine" / "stubs"
    for probe, folder in (("import sgl_kernel", stubs), ("import torchvision.transforms", TORCHVISION_STUBS)):
        if subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=300).returncode != 0:
            paths.append(str(folder))
    return paths


def fused_ops_standin(env=None) -> bool:
    """Whether GPU engines get the Triton norm and rotary stand-ins (tests/engine/plugins/
    triton_swa_fused_ops.py): yes unless ``TRITON_SWA_ENGINE_FUSED_OPS=torch`` asks for SGLang's
    plain-torch layers (the set-up of the GPU engine runs before 2026-12-07)."""
    value = (os.environ if env is None else env).get("TRITON_SWA_ENGINE_FUSED_OPS", "triton")
    if value not in ("triton", "torch"):
        raise ValueError(f"TRITON_SWA_ENGINE_FUSED_OPS must be 'triton' or 'torch', got {value!r}")
    return value == "triton"


def gpu_engine_env(pythonpath: list[str], extra: dict | None = None, device: str = "cuda") -> dict:
    """The environment of a GPU engine subprocess (triton_swa.benchmark.serve's module doc says why each
    setting); ``device="cpu"`` is SGLang's CPU engine with the kernels in Triton's interpreter."""
    env = dict(os.environ)
    # SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND: the radix tree's Python core (the carried sglang wheel
    # has no compiled Rust extensions)
    env.update(
        SGLANG_PLUGINS="triton_swa",
        SGLANG_FORCE_FUSED_OP_BACKEND="torch",
        PYTHONUNBUFFERED="1",
        SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND="python",
    )
    env.setdefault("TRITON_SWA_LOG_LEVEL", "INFO")  # the plugin's own lines in the engine's log (a warning-level engine)
    env.pop("TRITON_INTERPRET", None)
    plugins = ["triton_swa"]
    pythonpath = list(pythonpath)
    if device == "cpu":
        env.update(SGLANG_USE_CPU_ENGINE="1", TORCHDYNAMO_DISABLE="1", TRITON_INTERPRET="1")
    elif str(CUDA_STUBS) in pythonpath:
        env["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"] = "1"  # the stand-in has no wheel metadata to check
        # the same image for every backend: the compiled packages SGLang's speculative paths import
        # (tests/engine/plugins/triton_swa_gpu_standins.py) and, unless TRITON_SWA_ENGINE_FUSED_OPS=torch,
        # one Triton kernel per norm and rotary layer for sgl_kernel's (triton_swa_fused_ops.py)
        plugins.append("triton_swa_gpu_standins")
        if fused_ops_standin(env):
            plugins.append("triton_swa_fused_ops")
        pythonpath += [] if str(ENGINE_PLUGINS) in pythonpath else [str(ENGINE_PLUGINS)]
    extra = dict(extra or {})
    plugins += [n for n in extra.pop("SGLANG_PLUGINS", "").split(",") if n and n not in plugins]
    paths = [*pythonpath, str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra, SGLANG_PLUGINS=",".join(plugins))
    return env


SIGNIFICANT_BITS = {"bfloat16": 8, "float16": 11, "float32": 24}


def tie_tol(logit: float, dtype: str = "bfloat16") -> float:
    """The near-tie rule for greedy tokens: two logits closer than 2 units in the last place of
    ``dtype`` at the top logit's magnitude (bf16: 8 significant bits) can swap order under any correct
    reordering of the sums."""
    bits = SIGNIFICANT_BITS[dtype]
    if logit <= 0 or not math.isfinite(logit):
        return 2.0 ** (2 - bits)
    return 2.0 * 2.0 ** (math.floor(math.log2(logit)) - (bits - 1))


# ---- tensor parallelism on a CPU ---------------------------------------------------------------


def cpu_threads_bind(ranks: int, cpus: Sequence[int] | None = None) -> dict[str, str]:
    """The environment an engine of ``ranks`` CPU ranks (``tp_size * dp_size * pp_size``) needs where the
    machine has fewer NUMA nodes than ranks: ``SGLANG_CPU_OMP_THREADS_BIND``, this process's CPUs
    (``cpus``, default its affinity) split into ``ranks`` contiguous groups, ``|``-separated (a CPU is
    shared when there are fewer CPUs than ranks).

    Without it SGLang 0.5.23 refuses to start a second rank on one NUMA node (``numa_utils.
    init_threads_binding``: "SGLANG_CPU_OMP_THREADS_BIND is not set, in this case, the total number of
    ranks ... should be smaller than or equal to number of numa node on the machine"). SGLang binds
    threads to the groups only with the compiled sgl_kernel on AMX or arm64 CPUs; elsewhere it logs them.
    """
    ids = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if ranks < 1 or not ids:
        raise ValueError(f"cpu_threads_bind needs ranks >= 1 and some CPUs, got ranks={ranks}, cpus={ids}")
    if len(ids) < ranks:
        groups = [[ids[r % len(ids)]] for r in range(ranks)]
    else:
        size, extra = divmod(len(ids), ranks)
        groups, start = [], 0
        for r in range(ranks):
            end = start + size + (r < extra)
            groups.append(ids[start:end])
            start = end
    return {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(",".join(map(str, g)) for g in groups)}
