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

The pool probe (``tests/engine/plugins/triton_swa_pool_probe.py``, a test-side SGLang plugin) writes
the allocators' free counts each time the scheduler is idle; :func:`idle_counts` reads them.

This module imports neither SGLang nor transformers; it needs ``aiohttp`` for the clients.
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

__all__ = ["LoadRequest", "Outcome", "Server", "check_outcomes", "drive", "idle_counts", "retractions", "scenario_requests"]

FAULTS = ("disconnect", "abort_early", "abort_decode", "one_token", "empty", "context_limit", "over_context", "stop_token")


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
    """``with Server(model, backend, ...) as srv``: SGLang's ``launch_server`` up and answering."""

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
    ):
        args = dict(DEFAULT_ENGINE_ARGS)
        args.update(model_path=model_path, attention_backend=attention_backend, enable_metrics=True)
        args.update(engine_args or {})
        self.port = _free_port()
        args.update(host="127.0.0.1", port=self.port)
        self.args = args
        self.url = f"http://127.0.0.1:{self.port}"
        self._env = engine_env(pythonpath, plugins, env)
        self._ready_timeout_s = ready_timeout_s
        self._tmp = tempfile.TemporaryDirectory(prefix="triton_swa_load_")
        self.log_path = os.path.join(self._tmp.name, "server.log")
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
    pattern = r"(?:KV cache pool is full\. Retract requests\.|Testing retraction\.) #retracted_reqs: (\d+)"
    return sum(int(n) for n in re.findall(pattern, log))


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
    n: int, *, window: int, context_length: int, vocab: int = 384, seed: int = 0, max_new_tokens: int = 12
) -> list[LoadRequest]:
    """``n`` requests (at least 24) over three prefixes, each longer than ``window`` and each the
    next one's start, with one of each fault among them (several of the common ones)."""
    rng = random.Random(seed)
    p1 = [2] + [rng.randrange(4, vocab) for _ in range(window + 8)]
    p2 = p1 + [rng.randrange(4, vocab) for _ in range(window + 4)]
    p3 = p2 + [rng.randrange(4, vocab) for _ in range(2 * window)]
    prefixes = (p1, p2, p3)
    faults = ["disconnect"] * 3 + ["abort_early"] * 2 + ["abort_decode"] * 3 + ["one_token"] * 2
    faults += ["empty", "context_limit", "over_context"] + ["stop_token"] * 2
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
        async with aiohttp.ClientSession(timeout=timeout) as session:

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
