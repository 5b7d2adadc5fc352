"""SGLang's own server under load and faults: concurrent streams over shared prefixes, pool pressure,
disconnects and aborts, edge requests; what the engine tier's load-and-fault scenario drives.

- :class:`Server` runs ``python -m sglang.launch_server`` on 127.0.0.1 (a free port) in its own
  process group for as long as a ``with`` block, with the environment of the engine tier
  (:func:`triton_swa.testing.sglang_engine.engine_env`), and keeps its log.
- :func:`scenario_requests` builds the requests: prompts over prefixes longer than the window at
  several depths (the radix cache reuses their full slots while the SWA side drops the window pages
  older prefix tokens no longer need), varied lengths and lengths of output, and the faults:
  disconnects mid-stream, ``/abort_request`` right after sending (queued or in prefill) and
  mid-decode, ``max_new_tokens`` 1 and 0, a request that fills the context exactly, one past it
  (SGLang refuses it, HTTP 400) and stop tokens.
- :func:`drive` sends them from a bounded number of concurrent streaming clients and returns each
  request's outcome.
- :func:`check_outcomes` compares every finished request's tokens with the same prompt's greedy
  reference, as the request's own limits cut it.
- :func:`run_scenario` runs the whole scenario on one model (the reference, one server, the load,
  the idle checks, the last request) and returns its report; :func:`scenario_problems` lists what
  the report fails of the scenario's checks (empty: passed), :func:`report_line` says it in a line.
  The CPU engine tier's test (``tests/engine/test_load_faults.py``) and the GPU entry
  (``python -m triton_swa.testing.sglang_load --device cuda``, ``bash scripts/gpu.sh load SHA``) both
  run it.

The pool probe (``tests/engine/plugins/triton_swa_pool_probe.py``, a test-side SGLang plugin) writes
the allocators' free counts each time the scheduler is idle; :func:`idle_counts` reads them.

On a GPU (``device="cuda"``) the server's environment is the GPU engine tier's
(:func:`triton_swa.testing.sglang_engine.gpu_engine_env`: the ``sgl_kernel`` stand-in where the real one
does not import, SGLang's plain-torch fused ops, the radix tree's Python core), with CUDA graphs on
(decode; prefill too except on Gemma 4, whose KV-shared layers SGLang's prefill graph refuses).

This module imports neither SGLang nor transformers at import time; it needs ``aiohttp`` for the
clients.

    python -m triton_swa.testing.sglang_load --device cuda --families gemma3,gemma4
        --requests 1000 --concurrency 64 [--backend triton_swa|triton] [--spec auto|on|off] --out DIR
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
from collections.abc import Mapping, Sequence
from typing import Any

from .sglang_engine import DEFAULT_ENGINE_ARGS, _cli_args, _free_port, _http, _kill_group, engine_env, extract_tracebacks

__all__ = [
    "SCENARIOS",
    "LoadRequest",
    "Outcome",
    "Server",
    "check_outcomes",
    "drive",
    "greedy_reference",
    "idle_counts",
    "main",
    "mismatches",
    "report_line",
    "retraction_counts",
    "retractions",
    "run_scenario",
    "scenario_engine_args",
    "scenario_problems",
    "scenario_requests",
]

FAULTS = ("disconnect", "abort_early", "abort_decode", "one_token", "empty", "context_limit", "over_context", "stop_token")
# the faults among one set of requests: each fault once, the common ones several times
FAULT_SET = ("disconnect",) * 3 + ("abort_early",) * 2 + ("abort_decode",) * 3 + ("one_token",) * 2
FAULT_SET += ("empty", "context_limit", "over_context") + ("stop_token",) * 2
# one set of faults per this many requests (scenario_requests' fault_scale): 64 on the CPU tier, so
# 1000 requests on a GPU carry each fault 15 times
REQUESTS_PER_FAULT_SET = 64

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the test-side plugins (the pool probe): a checkout's tests/engine/plugins
PLUGINS_DIR = os.path.join(_ROOT, "tests", "engine", "plugins")

# per tiny-model family (triton_swa.testing.tiny_models' defaults): its window, whether the scenario
# serves it with STANDALONE drafts (the target drafting for itself), whether SGLang builds its
# SWAKVPool (the SWA allocator's free count is then checked too) and its server's environment
SCENARIOS: dict[str, dict[str, Any]] = {
    "gemma4": dict(window=16, speculative=True, swa_pool=True, env={"SGLANG_SWA_EVICTION_INTERVAL": "4"}),
    "gemma3": dict(window=8, speculative=False, swa_pool=False, env={}),
}
# SGLang's own switch that retracts running decodes every few forward steps (one running request each
# time, more where the pool is short): small pools press the scheduler, but whether they make it
# retract depends on timing; the switch makes sure it does
RETRACT_ENV = {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "7"}
# the checks the server runs itself: triton-swa's index guard (every index a kernel reads is checked
# first; outside CUDA-graph capture) and SGLang's strict idle memory check (raises on a leak)
CHECK_ENV = {"TRITON_SWA_DEBUG": "1", "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}
# a GPU server's engine arguments over the CPU tier's DEFAULT_ENGINE_ARGS
GPU_ENGINE_ARGS: dict[str, Any] = {"device": "cuda", "disable_cuda_graph": False, "mem_fraction_static": 0.7}


@dataclasses.dataclass
class LoadRequest:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    fault: str = ""  # one of FAULTS, or "" for a plain request
    stop_token_ids: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Outcome:
    rid: str
    output_ids: list[int]
    finish: Any  # SGLang's finish_reason, None when the client left first
    chunks: int
    error: str = ""


class Server:
    """``with Server(model, backend, ...) as srv``: SGLang's ``launch_server`` up and answering.

    ``device="cpu"``: the CPU engine tier's environment and engine arguments
    (:func:`~triton_swa.testing.sglang_engine.engine_env`, ``DEFAULT_ENGINE_ARGS``); ``"cuda"``: the
    GPU engine tier's environment (:func:`triton_swa.testing.sglang_engine.gpu_engine_env`) and
    :data:`GPU_ENGINE_ARGS` over the same defaults. ``engine_args`` go last. ``log_path``: where the
    server's log is written (default: a temporary file, gone after the server)."""

    def __init__(
        self,
        model_path: str,
        attention_backend: str,
        *,
        engine_args: Mapping[str, Any] | None = None,
        pythonpath: Sequence[str] = (),
        plugins: str = "triton_swa",
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = 300.0,
        device: str = "cpu",
        log_path: str | None = None,
    ):
        args = dict(DEFAULT_ENGINE_ARGS)
        if device == "cuda":
            args.update(GPU_ENGINE_ARGS)
        args.update(model_path=model_path, attention_backend=attention_backend, enable_metrics=True)
        args.update(engine_args or {})
        self.port = _free_port()
        args.update(host="127.0.0.1", port=self.port)
        self.args = args
        self.url = f"http://127.0.0.1:{self.port}"
        self.device = device
        if device == "cuda":  # the GPU engine tier's environment (pythonpath: sgl_kernel_path("cuda") and more)
            from triton_swa.testing.sglang_engine import gpu_engine_env

            self._env = gpu_engine_env([os.path.abspath(p) for p in pythonpath], dict(env or {}, SGLANG_PLUGINS=plugins), device)
        else:
            self._env = engine_env(pythonpath, plugins, env)
        self._ready_timeout_s = ready_timeout_s
        self._tmp = tempfile.TemporaryDirectory(prefix="triton_swa_load_")
        self.log_path = log_path or os.path.join(self._tmp.name, "server.log")
        self.proc: subprocess.Popen | None = None
        self.start_s = 0.0

    def __enter__(self) -> Server:
        t0 = time.monotonic()
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sglang.launch_server", *_cli_args(self.args)],
                cwd=self._tmp.name,
                env=self._env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        while time.monotonic() - t0 < self._ready_timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"launch_server exited with {self.proc.returncode} before it was ready:\n{self.tail()}")
            if self.answers():
                self.start_s = time.monotonic() - t0
                return self
            time.sleep(0.5)
        self.__exit__(None, None, None)
        raise RuntimeError(f"launch_server not ready within {self._ready_timeout_s:.0f} s:\n{self.tail()}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            _kill_group(self.proc)

    def answers(self) -> bool:
        try:
            return _http(self.url + "/model_info", timeout=5.0)[0] == 200
        except (OSError, urllib.error.URLError):
            return False

    def post(self, path: str, payload: Any, timeout: float = 600.0) -> tuple[int, str]:
        return _http(self.url + path, payload, timeout=timeout)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def tracebacks(self) -> list[str]:
        return extract_tracebacks(self.log())

    def wait_idle(self, timeout_s: float = 120.0) -> None:
        """Until SGLang reports no running or queued request (``/metrics`` gauges)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            m = metrics(self)
            if m.get("sglang:num_running_reqs", 0) == 0 and m.get("sglang:num_queue_reqs", 0) == 0:
                return
            time.sleep(0.5)
        raise TimeoutError(f"the server did not go idle within {timeout_s:.0f} s")


def metrics(server: Server) -> dict[str, float]:
    """SGLang's Prometheus gauges and counters, summed over their labels."""
    status, body = _http(server.url + "/metrics", timeout=10.0)
    if status != 200:
        return {}
    out: dict[str, float] = {}
    for line in body.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m:
            try:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
            except ValueError:
                pass
    return out


def retractions(log: str) -> int:
    """Requests the scheduler retracted (its own log lines: under pool pressure, or forced by
    ``SGLANG_TEST_RETRACT``, SGLang's own switch that retracts running decodes every few steps)."""
    return sum(retraction_counts(log).values())


def retraction_counts(log: str) -> dict[str, int]:
    """:func:`retractions` by cause: ``{"pool": .., "forced": ..}`` (the pool was full; the test switch)."""
    counts = {}
    for cause, line in (("pool", r"KV cache pool is full\. Retract requests\."), ("forced", r"Testing retraction\.")):
        counts[cause] = sum(int(n) for n in re.findall(line + r" #retracted_reqs: (\d+)", log))
    return counts


def idle_counts(probe_log: str) -> list[dict[str, int]]:
    """The pool probe's records, oldest first: ``{"full": .., "swa": .., "req": .., ...}`` per idle."""
    out = []
    if not os.path.exists(probe_log):
        return out
    with open(probe_log) as f:
        for line in f:
            if line.startswith("IDLE "):
                out.append({k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])})
    return out


def scenario_requests(
    n: int, *, window: int, context_length: int, vocab: int = 384, seed: int = 0, max_new_tokens: int = 12, fault_scale: int = 1
) -> list[LoadRequest]:
    """``n`` requests (at least 23 per ``fault_scale``) over three prefixes, each longer than
    ``window`` and each the next one's start, with :data:`FAULT_SET` (one of each fault, several of
    the common ones) ``fault_scale`` times among them."""
    rng = random.Random(seed)
    p1 = [2] + [rng.randrange(4, vocab) for _ in range(window + 8)]
    p2 = p1 + [rng.randrange(4, vocab) for _ in range(window + 4)]
    p3 = p2 + [rng.randrange(4, vocab) for _ in range(2 * window)]
    prefixes = (p1, p2, p3)
    faults = list(FAULT_SET) * fault_scale
    if n < len(faults) + 8:
        raise ValueError(f"n: at least {len(faults) + 8} requests, got {n}")
    faults += [""] * (n - len(faults))
    rng.shuffle(faults)
    out = []
    for i, fault in enumerate(faults):
        prompt = prefixes[i % 3] + [rng.randrange(4, vocab) for _ in range(rng.randrange(1, 12))]
        new = rng.randrange(max(2, max_new_tokens // 2), max_new_tokens + 1)
        if fault == "one_token":
            new = 1
        elif fault == "empty":
            new = 0
        elif fault in ("context_limit", "over_context"):
            new = 8  # prompt and output fill the context exactly, or pass it by one
            prompt = prompt + [rng.randrange(4, vocab) for _ in range(context_length - new - len(prompt) + (fault == "over_context"))]
        out.append(LoadRequest(f"load-{i}-{fault or 'plain'}", prompt, new, fault))
    return out


async def _one(session, server: Server, req: LoadRequest) -> Outcome:
    payload = {
        "input_ids": req.input_ids,
        "rid": req.rid,
        "stream": True,
        # SGLang checks stop tokens only where it checks EOS: a stop-token request stops at either
        "sampling_params": {
            "temperature": 0.0,
            "max_new_tokens": req.max_new_tokens,
            "ignore_eos": not req.stop_token_ids,
            **({"stop_token_ids": req.stop_token_ids} if req.stop_token_ids else {}),
        },
    }
    out = Outcome(req.rid, [], None, 0)
    if req.fault == "abort_early":
        asyncio.get_running_loop().call_later(0.05, lambda: asyncio.ensure_future(_abort(session, server, req.rid)))
    try:
        async with session.post(server.url + "/generate", json=payload) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {(await resp.text())[:500]}"
                return out
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                item = json.loads(line[5:])
                if "error" in item:  # SGLang's refusal inside the stream
                    out.error = f"stream error: {item['error']}"
                    return out
                out.chunks += 1
                out.output_ids = list(item.get("output_ids", out.output_ids))
                out.finish = item.get("meta_info", {}).get("finish_reason")
                if req.fault == "disconnect" and out.chunks == 2:
                    resp.close()  # the client leaves mid-stream
                    out.finish = None
                    return out
                if req.fault == "abort_decode" and out.chunks == 2:
                    await _abort(session, server, req.rid)
    except Exception as e:  # noqa: BLE001 - recorded, the scenario judges
        out.error = f"{type(e).__name__}: {e}"
    return out


async def _abort(session, server: Server, rid: str) -> None:
    async with session.post(server.url + "/abort_request", json={"rid": rid}) as resp:
        await resp.read()


def drive(server: Server, requests: Sequence[LoadRequest], concurrency: int, timeout_s: float = 900.0) -> list[Outcome]:
    """Send ``requests`` from ``concurrency`` streaming clients; outcomes in the requests' order."""
    import aiohttp

    async def main():
        queue = list(reversed(requests))
        done: dict[str, Outcome] = {}
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        # room for every client's stream and the aborts they send beside it (aiohttp's default: 100)
        connector = aiohttp.TCPConnector(limit=max(100, concurrency + 16))
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

            async def client():
                while queue:
                    req = queue.pop()
                    done[req.rid] = await _one(session, server, req)

            await asyncio.gather(*(client() for _ in range(concurrency)))
        return [done[r.rid] for r in requests]

    return asyncio.run(main())


def _finish_type(finish: Any) -> str:
    return (finish or {}).get("type", "") if isinstance(finish, dict) else str(finish or "")


def check_outcomes(
    requests: Sequence[LoadRequest], outcomes: Sequence[Outcome], reference: Mapping[str, list[int]], eos_token_id: int = 1
) -> dict:
    """Every request that finished on its own (not aborted, not left) must return the greedy
    reference of its prompt, cut where its own limits cut it (``max_new_tokens``, the context
    length, its stop token, the stop token included). Aborted and left requests must return a
    prefix of it. Returns the counts and the failures (``"problems"``: one line each)."""
    report: dict[str, Any] = {"finished": 0, "aborted": 0, "left": 0, "refused": 0, "compared_tokens": 0, "problems": []}
    for req, out in zip(requests, outcomes):
        ref = reference[req.rid]
        kind = _finish_type(out.finish)
        if req.fault == "over_context":
            if "context length" in out.error and not out.output_ids:
                report["refused"] += 1
            else:
                report["problems"].append(f"{req.rid}: past the context, expected SGLang's HTTP 400, got {out.error or out.output_ids}")
            continue
        if out.error and req.fault not in ("disconnect",):
            report["problems"].append(f"{req.rid}: {out.error}")
            continue
        if req.fault == "disconnect":
            report["left"] += 1
        elif kind == "abort":
            report["aborted"] += 1
        else:
            report["finished"] += 1
        want = ref[: req.max_new_tokens]
        if req.stop_token_ids:
            stops = [i for i, t in enumerate(want) if t in req.stop_token_ids or t == eos_token_id]
            want = want[: stops[0] + 1] if stops else want
        got = out.output_ids
        report["compared_tokens"] += len(got)
        if req.fault in ("disconnect", "abort_early", "abort_decode") or kind == "abort":
            if got != want[: len(got)]:
                report["problems"].append(f"{req.rid} ({req.fault or 'plain'}, {kind}): {got} is not a prefix of {want}")
            continue
        if req.fault == "context_limit":  # SGLang may stop a few tokens short of the context's end
            if not 1 <= len(got) <= req.max_new_tokens or kind != "length":
                report["problems"].append(f"{req.rid}: at the context limit {len(got)} tokens, finish {kind}")
            want = want[: len(got)]
        if got != want:
            report["problems"].append(f"{req.rid} ({req.fault or 'plain'}, finish {kind}): {got} != {want}")
    return report


# ----------------------------------------------------------------------------------------------
# the whole scenario on one model: what the CPU tier's test and the GPU entry run

# full slots per running request: 40 (the CPU tier's 640 for 16 in flight). Requests are 19 to 100
# tokens (prompt and output), and the three prefixes are cached once; with faults, retraction and
# the radix cache's evictable entries taking their share, the pool runs near full and decodes grow
# past what the scheduler admitted for (schedule_conservativeness 0.3: it admits for a small part of
# each request's max_new_tokens)
SLOTS_PER_REQUEST = 40


def scenario_engine_args(
    concurrency: int, *, context_length: int = 256, device: str = "cpu", family: str = "", slots_per_request: int = SLOTS_PER_REQUEST
) -> dict[str, Any]:
    """The server's engine arguments for ``concurrency`` clients: as many running requests as
    clients, ``slots_per_request`` full slots for each (at least two whole contexts, so a request at
    the context limit fits beside others), chunked prefill of 128 tokens (a request at the context
    limit is prefilled in chunks), float32. On ``"cuda"``: decode CUDA graphs up to ``concurrency``
    requests, prefill graphs off on Gemma 4 (SGLang 0.5.23's prefill graph refuses KV-shared layers).
    At 16 clients on the CPU: the CPU tier's arguments (640 slots)."""
    args: dict[str, Any] = dict(
        max_total_tokens=max(slots_per_request * concurrency, 2 * context_length + 128),
        context_length=context_length,
        max_running_requests=concurrency,
        chunked_prefill_size=128,
        schedule_conservativeness=0.3,
        log_level="warning",
        dtype="float32",
    )
    if device == "cuda":
        args.update(cuda_graph_max_bs_decode=concurrency)
        if family == "gemma4":
            args.update(disable_prefill_cuda_graph=True)
    return args


def greedy_reference(
    model_path: str, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, device: str = "cpu", batched: bool = False
) -> tuple[list[list[int]], list[list[float]], list[list[float]]]:
    """transformers' greedy tokens of each prompt with the top-2 logit gap and ``|top1|`` at each new
    token, ``(tokens, gaps, tops)``: :func:`~triton_swa.testing.sglang_engine.hf_greedy`, ``batched``
    (one ``generate()`` per prompt length) for a thousand prompts on a GPU."""
    from .sglang_engine import hf_greedy

    return hf_greedy(model_path, prompts, max_new_tokens, device=device, return_top2=True, batched=batched)


def mismatches(
    requests: Sequence[LoadRequest],
    outcomes: Sequence[Outcome],
    reference: Mapping[str, list[int]],
    gaps: Mapping[str, list[float]],
    tops: Mapping[str, list[float]],
    dtype: str = "float32",
) -> list[dict[str, Any]]:
    """Every request whose tokens leave the reference's (each request's tokens, however its limits or
    a fault cut them, are a prefix of its prompt's greedy tokens): where, the two tokens, and the
    reference's top-2 logit gap there, with whether that is a near-tie in ``dtype``
    (:func:`triton_swa.testing.sglang_engine.tie_tol`: any correct reordering of the sums may swap it)."""
    from triton_swa.testing.sglang_engine import tie_tol

    out = []
    for req, got in zip(requests, outcomes):
        want = reference[req.rid]
        at = next((t for t, (a, b) in enumerate(zip(got.output_ids, want)) if a != b), None)
        if at is None:
            continue
        gap, top = gaps[req.rid][at], tops[req.rid][at]
        row = dict(rid=req.rid, at=at, got=got.output_ids[at], want=want[at], gap=gap, top=top)
        row["near_tie"] = gap <= tie_tol(top, dtype)
        out.append(row)
    return out


# SGLang's counters kept in the report (its /metrics, summed over labels): retractions, aborts, the
# prompt tokens the radix cache served, tokens in and out, speculative verify calls
_COUNTERS = ("retract", "abort", "cached_tokens_total", "prompt_tokens_total", "generation_tokens_total", "spec_verify")


def run_scenario(
    model_path: str,
    family: str,
    *,
    n_requests: int = 64,
    concurrency: int = 16,
    context_length: int = 256,
    engine_args: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    pythonpath: Sequence[str] = (),
    device: str = "cpu",
    backend: str = "triton_swa",
    speculative: bool | None = None,
    probe_log_dir: str | None = None,
    log_dir: str | None = None,
    seed: int = 11,
    fault_scale: int | None = None,
    batched_reference: bool | None = None,
    plugins_dir: str = PLUGINS_DIR,
) -> dict[str, Any]:
    """The load-and-fault scenario on one tiny model of ``family`` (a key of :data:`SCENARIOS`),
    served by SGLang's ``launch_server`` with ``backend``; returns its report (JSON-able).

    The reference first (transformers' greedy tokens of every prompt, :func:`greedy_reference`; batched
    on a GPU), then one server (``engine_args`` default :func:`scenario_engine_args`; STANDALONE
    drafts of the model itself where ``speculative``, default the family's; the environment: the
    family's, :data:`RETRACT_ENV`, :data:`CHECK_ENV`, the pool probe's log, then ``env``): the free
    counts at idle after ``/flush_cache``, ``n_requests`` requests from ``concurrency`` streaming
    clients (:func:`scenario_requests` with ``fault_scale`` sets of faults, default one per
    :data:`REQUESTS_PER_FAULT_SET` requests), idle and flushed again, the free counts again, one more
    request. ``pythonpath``: what the engine needs (the ``sgl_kernel`` stand-in, ...); the pool
    probe's folder ``plugins_dir`` is added. ``probe_log_dir``: where the probe writes (default: a
    temporary folder); ``log_dir``: where the server's log and the outcomes are kept (default: not
    kept). :func:`scenario_problems` judges the report."""
    sc = SCENARIOS[family]
    speculative = sc["speculative"] if speculative is None else speculative
    scale = max(1, n_requests // REQUESTS_PER_FAULT_SET) if fault_scale is None else fault_scale
    batched = device == "cuda" if batched_reference is None else batched_reference
    t0 = time.monotonic()
    requests = scenario_requests(n_requests, window=sc["window"], context_length=context_length, seed=seed, fault_scale=scale)
    # the reference: transformers' greedy tokens of each prompt (one model load), as far as any request asks
    longest = max(3, *(r.max_new_tokens for r in requests))
    tokens, gaps, tops = greedy_reference(model_path, [r.input_ids for r in requests], longest, device=device, batched=batched)
    reference = {}
    for req, ref in zip(requests, tokens):
        reference[req.rid] = ref
        if req.fault == "stop_token":
            req.stop_token_ids = [ref[2]]
    reference_s = time.monotonic() - t0
    tmp = None
    if probe_log_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="triton_swa_probe_")
        probe_log_dir = tmp.name
    tag = f"{family}-{backend}" + ("-spec" if speculative else "")
    probe_log = os.path.join(probe_log_dir, f"pool-probe-{tag}.txt")
    open(probe_log, "w").close()  # the probe appends
    if engine_args is None:
        engine_args = scenario_engine_args(concurrency, context_length=context_length, device=device, family=family)
    args = dict(engine_args)
    if speculative:
        from .sglang_engine import Speculative

        args.update(Speculative("STANDALONE", draft_model_path=model_path, num_steps=3, eagle_topk=1, num_draft_tokens=4).engine_args())
    server_env = dict(sc["env"], **RETRACT_ENV, TRITON_SWA_POOL_PROBE_LOG=probe_log, **CHECK_ENV)
    server_env.update(env or {})
    log_path = None
    if log_dir is not None:
        os.makedirs(log_dir, exist_ok=True)
        log_path = os.path.join(log_dir, f"server-{tag}.log")
    t1 = time.monotonic()
    try:
        with Server(
            model_path,
            backend,
            engine_args=args,
            pythonpath=[*pythonpath, plugins_dir],
            plugins="triton_swa,triton_swa_pool_probe",
            env=server_env,
            device=device,
            log_path=log_path,
        ) as srv:
            srv.post("/flush_cache", {})
            srv.wait_idle()
            time.sleep(1.0)  # an idle pass records the counts after the flush
            before = idle_counts(probe_log)
            t2 = time.monotonic()
            outcomes = drive(srv, requests, concurrency)
            load_s = time.monotonic() - t2
            srv.wait_idle()
            flush_status, _ = srv.post("/flush_cache", {})
            time.sleep(1.0)
            srv.wait_idle()
            time.sleep(1.0)
            after = idle_counts(probe_log)
            counters = {k: v for k, v in metrics(srv).items() if any(w in k for w in _COUNTERS)}
            # the server still answers: one more request, its tokens as transformers'
            last_status, last_body = srv.post(
                "/generate",
                {"input_ids": requests[0].input_ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": 3, "ignore_eos": True}},
            )
            log = srv.log()
            tracebacks = srv.tracebacks()
            start_s = srv.start_s
            server_args = dict(srv.args)
    finally:
        if tmp is not None:
            tmp.cleanup()
    report = check_outcomes(requests, outcomes, reference)
    by_rid = {r.rid: i for i, r in enumerate(requests)}
    report.update(
        mismatches=mismatches(
            requests, outcomes, reference, {k: gaps[i] for k, i in by_rid.items()}, {k: tops[i] for k, i in by_rid.items()}
        ),
        family=family,
        backend=backend,
        device=device,
        speculative="STANDALONE" if speculative else "",
        requests=len(requests),
        concurrency=concurrency,
        fault_scale=scale,
        faults=sum(1 for r in requests if r.fault),
        swa_pool=sc["swa_pool"],
        retractions=retractions(log),
        retraction_causes=retraction_counts(log),
        metrics=counters,
        before=before[-1] if before else None,
        after=after[-1] if after else None,
        flush_status=flush_status,
        last_status=last_status,
        last_body=last_body[:2000],
        last_want=reference[requests[0].rid][:3],
        tracebacks=tracebacks,
        leak_warnings=[line for line in log.splitlines() if "memory leak" in line or "double free" in line or "use-after-free" in line],
        reference="batched" if batched else "one prompt at a time",
        reference_s=reference_s,
        start_s=start_s,
        load_s=load_s,
        wall_s=time.monotonic() - t1,
        engine_args={k: v for k, v in server_args.items() if k not in ("host", "port")},
        env={k: server_env[k] for k in sorted(server_env) if k != "TRITON_SWA_POOL_PROBE_LOG"},
    )
    if log_dir is not None:
        with open(os.path.join(log_dir, f"outcomes-{tag}.jsonl"), "w") as f:
            for req, out in zip(requests, outcomes):
                row = dict(rid=req.rid, fault=req.fault, prompt_len=len(req.input_ids), max_new_tokens=req.max_new_tokens)
                row.update(output_ids=out.output_ids, finish=out.finish, chunks=out.chunks, error=out.error, want=reference[req.rid])
                f.write(json.dumps(row, default=str) + "\n")
    return report


def scenario_problems(report: Mapping[str, Any]) -> list[str]:
    """What ``report`` (:func:`run_scenario`'s) fails of the scenario's checks, one line each; empty
    when it passes. The checks: no traceback in the server's log and no leak warning; every finished
    request's tokens as the reference's, aborted and abandoned ones a prefix of them
    (:func:`check_outcomes`); all but at most 10 per fault set finished, at least one aborted, every
    disconnect left and every request past the context refused; at least one retraction; the pool
    probe's free counts (full, SWA, request rows) at idle equal before and after the load (the SWA
    count present where the model has an SWA pool); ``/flush_cache`` answered; the last request's
    tokens as the reference's."""
    r = report
    n, scale = r["requests"], r.get("fault_scale", 1)
    out = [f"traceback in the server's log:\n{tb}" for tb in r["tracebacks"]]
    out += [f"leak warning: {line}" for line in r["leak_warnings"]]
    out += list(r["problems"])
    if r["finished"] < n - 10 * scale:
        out.append(f"{r['finished']} of {n} requests finished (at least {n - 10 * scale} expected)")
    if r["aborted"] < 1:
        out.append("no request was aborted")
    if r["left"] != 3 * scale:
        out.append(f"{r['left']} requests left mid-stream ({3 * scale} disconnected)")
    if r["refused"] != scale:
        out.append(f"{r['refused']} requests past the context refused ({scale} sent)")
    if r["retractions"] < 1:
        out.append("no retraction happened: the pools did not press the scheduler")
    before, after = r["before"], r["after"]
    if before is None or after is None:
        out.append("the pool probe recorded no idle state")
    else:
        for key in ("full", "swa", "req"):
            if after[key] != before[key]:
                out.append(f"{key}: {before} before the load, {after} after")
        if r.get("swa_pool") and before["swa"] <= 0:
            out.append(f"no SWA allocator count where the model has an SWA pool: {before}")
    if r["flush_status"] != 200:
        out.append(f"/flush_cache answered {r['flush_status']}")
    if r["last_status"] != 200:
        out.append(f"the last request answered {r['last_status']}: {r['last_body'][:300]}")
    else:
        try:
            got = json.loads(r["last_body"])["output_ids"]
        except (ValueError, KeyError, TypeError) as e:
            got = f"unreadable ({type(e).__name__})"
        if got != r["last_want"]:
            out.append(f"the last request returned {got}, not {r['last_want']}")
    return out


def _counts(c: Mapping[str, int] | None) -> str:
    return "none" if not c else f"{c['full']}/{c['swa']}/{c['req']}"


def _differ(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "none differ"
    ties = sum(1 for m in rows if m["near_tie"])
    return f"{len(rows)} differ ({ties} at a near-tie; smallest top-2 gap {min(m['gap'] for m in rows):.3g})"


def _cache_hits(m: Mapping[str, float]) -> str:
    if "sglang:prompt_tokens_total" not in m:
        return "radix cache hits unknown"
    return f"{m.get('sglang:cached_tokens_total', 0):.0f} of {m['sglang:prompt_tokens_total']:.0f} prompt tokens from the radix cache"


def report_line(report: Mapping[str, Any]) -> str:
    """One line of ``report``: what was served, what the checks found, how long it took."""
    r = report
    causes = r.get("retraction_causes") or {}
    spec = f" + {r['speculative']}" if r.get("speculative") else ""
    return (
        f"load and faults, {r['family']}{spec} ({r['backend']}, {r['device']}): {r['requests']} requests ({r['faults']} with faults) "
        f"from {r['concurrency']} clients, {r['finished']} finished, {r['aborted']} aborted, {r['left']} left, {r['refused']} refused, "
        f"{r['retractions']} retracted ({causes.get('pool', 0)} pool full, {causes.get('forced', 0)} forced), "
        f"{r['compared_tokens']} tokens compared, {_differ(r.get('mismatches') or [])}, {_cache_hits(r.get('metrics') or {})}, "
        f"idle free full/swa/req {_counts(r['before'])} -> {_counts(r['after'])}, "
        f"{len(scenario_problems(r))} problems, {len(r['tracebacks'])} tracebacks, "
        f"reference {r['reference_s']:.0f} s, start {r['start_s']:.0f} s, load {r['load_s']:.0f} s, wall {r['wall_s']:.0f} s"
    )


# ----------------------------------------------------------------------------------------------
# python -m triton_swa.testing.sglang_load


def _parse_kv(items: Sequence[str], as_json: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = json.loads(value) if as_json else value
    return out


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import signal

    p = argparse.ArgumentParser(
        prog="python -m triton_swa.testing.sglang_load",
        description="The load-and-fault scenario on SGLang's launch_server (tiny float32 models); exit 1 when a check fails.",
    )
    p.add_argument("--device", default="", help="cuda or cpu (default: cuda where torch sees one)")
    p.add_argument("--families", default="gemma3,gemma4", help=f"comma-separated, of {sorted(SCENARIOS)}")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=64, help="streaming clients, and the server's running requests")
    p.add_argument("--backend", default="triton_swa", help="SGLang attention backend (triton: SGLang's own, the control)")
    p.add_argument("--spec", default="auto", choices=("auto", "on", "off"), help="STANDALONE drafts (auto: Gemma 4 on, Gemma 3 off)")
    p.add_argument("--context-length", type=int, default=256)
    p.add_argument("--slots-per-request", type=int, default=SLOTS_PER_REQUEST, help="full KV slots per running request")
    p.add_argument("--fault-scale", type=int, default=None, help=f"fault sets (default: one per {REQUESTS_PER_FAULT_SET} requests)")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--reference", default="auto", choices=("auto", "batched", "alone"), help="auto: batched on cuda")
    p.add_argument("--engine-arg", action="append", default=[], help="KEY=JSON, over the scenario's engine arguments")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE, over the server's environment")
    p.add_argument("--model-root", default=os.path.join(tempfile.gettempdir(), "triton_swa_load_models"))
    p.add_argument("--out", default=None, help="folder for load-report.json, the servers' logs, outcomes and probe logs")
    p.add_argument("--git-sha", default="")
    a = p.parse_args(argv)

    # `timeout` sends TERM: unwind, so each Server's `with` ends its process group
    def _term(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _term)
    device = a.device
    if not device:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    from triton_swa.testing.sglang_engine import sgl_kernel_path

    from .tiny_models import build_tiny_model

    out = a.out or tempfile.mkdtemp(prefix="triton_swa_load_")
    os.makedirs(out, exist_ok=True)
    pythonpath = sgl_kernel_path(device)
    print(f"load: device {device}, backend {a.backend}, git {a.git_sha or '?'}; on PYTHONPATH: {pythonpath or 'nothing'}", flush=True)
    reports: list[dict[str, Any]] = []
    failed = False
    for family in filter(None, a.families.split(",")):
        spec = None if a.spec == "auto" else a.spec == "on"
        t0 = time.monotonic()
        model = build_tiny_model(family, os.path.join(a.model_root, family), seed=0)
        args = scenario_engine_args(
            a.concurrency, context_length=a.context_length, device=device, family=family, slots_per_request=a.slots_per_request
        )
        args.update(_parse_kv(a.engine_arg, as_json=True))
        print(f"== {family}: model built ({time.monotonic() - t0:.0f} s); engine args {args}", flush=True)
        try:
            report = run_scenario(
                model,
                family,
                n_requests=a.requests,
                concurrency=a.concurrency,
                context_length=a.context_length,
                engine_args=args,
                env=_parse_kv(a.env, as_json=False),
                pythonpath=pythonpath,
                device=device,
                backend=a.backend,
                speculative=spec,
                probe_log_dir=out,
                log_dir=out,
                seed=a.seed,
                fault_scale=a.fault_scale,
                batched_reference=None if a.reference == "auto" else a.reference == "batched",
            )
            report["problem_list"] = scenario_problems(report)
            print(report_line(report), flush=True)
            for line in report["problem_list"][:20]:
                print("  PROBLEM " + line[:2000], flush=True)
        except Exception as e:  # noqa: BLE001 - recorded; the next family still runs
            report = dict(family=family, backend=a.backend, device=device, error=f"{type(e).__name__}: {e}", problem_list=[str(e)])
            print(f"load and faults, {family} ({a.backend}, {device}): FAILED: {type(e).__name__}: {str(e)[-3000:]}", flush=True)
        report.update(git_sha=a.git_sha)
        failed = failed or bool(report["problem_list"])
        reports.append(report)
        with open(os.path.join(out, "load-report.json"), "w") as f:
            json.dump(reports, f, indent=1, default=str)
    print(f"report: {os.path.join(out, 'load-report.json')}; {'FAILED' if failed else 'passed'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
