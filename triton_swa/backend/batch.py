"""A step's batch checks: shapes, dtypes, devices and host values of a ``forward_batch``, on the host,
before anything is launched.

A DECODE or TARGET_VERIFY batch of a kind seen before (mode, batch size, draft count, tensor kinds)
checks only its lengths' host values; every other batch is checked in full every step.
"""

from __future__ import annotations

import torch

from ..runtime.checks import INDEX_DTYPES, check_tensor
from ..runtime.plans import tensor_key
from .checks import _as_int, _check_index

_MASK_DTYPES = (torch.bool, torch.uint8, torch.int8)


def _batch_kind(fb, mode) -> tuple:
    """What a DECODE or TARGET_VERIFY batch's checks depend on beside the lengths' values: the mode,
    batch size, tensor kinds and (verify) the draft count and spec_info's kinds."""
    spec = fb.spec_info if mode.is_target_verify() else None
    spec_kind = None
    if spec is not None:
        spec_kind = (
            type(spec.draft_token_num),
            spec.draft_token_num,
            type(spec.causal),
            tensor_key(getattr(spec, "custom_mask", None)),
            tensor_key(getattr(spec, "positions", None)),
        )
    bs = fb.batch_size
    return (
        mode,
        type(bs),
        bs,
        tensor_key(fb.req_pool_indices),
        tensor_key(fb.seq_lens),
        tensor_key(fb.seq_lens_cpu),
        tensor_key(fb.out_cache_loc),
        spec_kind,
    )


class _BatchChecks:
    """The batch-check part of :class:`~triton_swa.backend.TritonSWAAttnBackend`; reads ``device`` and
    ``req_to_token``, caches ``_checked_batches``."""

    def _check_batch(self, fb) -> tuple[int, list | None]:
        """Check a batch on the host (shapes, dtypes, devices, CPU copies); returns its token count and
        ``seq_lens_cpu``'s values (None when the batch has none).

        DECODE and TARGET_VERIFY batches of a kind seen before (the same mode, batch size, draft count
        and tensor kinds) check only their host values (the lengths' range); extend batches check
        everything every step (their host lists change with the batch)."""
        mode = fb.forward_mode
        key = None
        if mode.is_decode() or mode.is_target_verify():
            try:
                key = _batch_kind(fb, mode)
            except (AttributeError, TypeError):  # not tensors where tensors belong: the checks name them
                key = None
            checked = self._checked_batches.get(key) if key is not None else None
            if checked is not None:
                num_tokens, extra = checked
                return num_tokens, self._check_lens_range(fb, extra)
        num_tokens, extra, lens = self._check_batch_in_full(fb)
        if key is not None:
            if len(self._checked_batches) >= 256:
                self._checked_batches.clear()
            self._checked_batches[key] = (num_tokens, extra)
        return num_tokens, lens

    def _check_lens_range(self, fb, extra: int) -> list | None:
        """``seq_lens_cpu`` (plus ``extra`` drafts) within ``req_to_token``'s columns; returns its values
        (None without host lengths)."""
        lens = fb.seq_lens_cpu
        if lens is None:
            return None
        values = lens.tolist()
        if values:
            max_ctx = self.req_to_token.shape[1]
            lo, hi = min(values), max(values)
            if lo < 0 or hi + extra > max_ctx:
                what = f"seq_lens_cpu (+ draft_token_num {extra})" if extra else "seq_lens_cpu"
                raise ValueError(
                    f"forward_batch.{what} must lie in [0, {max_ctx}] (req_to_token's columns), got values from {lo} to {hi + extra}"
                )
        return values

    def _check_batch_in_full(self, fb) -> tuple[int, int]:
        """Every check of :meth:`_check_batch`; returns (tokens, drafts per request in verify (else 0),
        ``seq_lens_cpu``'s values)."""
        mode = fb.forward_mode
        dev, max_ctx = self.device, self.req_to_token.shape[1]
        bs = _as_int("forward_batch.batch_size", fb.batch_size, 0)
        _check_index("forward_batch.req_pool_indices", fb.req_pool_indices, dev, bs)
        _check_index("forward_batch.seq_lens", fb.seq_lens, dev, bs)
        if fb.seq_lens_cpu is not None:
            check_tensor("forward_batch.seq_lens_cpu", fb.seq_lens_cpu, dtype=INDEX_DTYPES, device="cpu", shape=(bs,))
        if mode.is_decode():
            num_tokens, extra = bs, 0
            tokens_why = "one per request in DECODE: batch_size"
        elif mode.is_target_verify():
            spec = fb.spec_info
            if spec is None:
                raise ValueError("TARGET_VERIFY needs forward_batch.spec_info with draft_token_num")
            n = _as_int("spec_info.draft_token_num", getattr(spec, "draft_token_num", None), 1)
            num_tokens, extra = bs * n, n
            tokens_why = f"one per draft token: batch_size {bs} x draft_token_num {n}"
            self._check_spec(spec, bs, n, exact=True)
        else:
            if fb.extend_seq_lens is None or fb.extend_prefix_lens is None:
                raise ValueError(f"{mode.name} needs forward_batch.extend_seq_lens and extend_prefix_lens")
            _check_index("forward_batch.extend_seq_lens", fb.extend_seq_lens, dev, bs)
            _check_index("forward_batch.extend_prefix_lens", fb.extend_prefix_lens, dev, bs)
            cpu = {}
            for name in ("extend_seq_lens_cpu", "extend_prefix_lens_cpu"):
                values = getattr(fb, name)
                if values is None:
                    continue
                values = values.tolist() if isinstance(values, torch.Tensor) else list(values)
                if len(values) != bs:
                    raise ValueError(f"forward_batch.{name} must have {bs} entries, got {len(values)}")
                cpu[name] = [_as_int(f"forward_batch.{name}[{i}]", x, 0) for i, x in enumerate(values)]
            if "extend_seq_lens_cpu" in cpu and "extend_prefix_lens_cpu" in cpu:
                for i, (e, p) in enumerate(zip(cpu["extend_seq_lens_cpu"], cpu["extend_prefix_lens_cpu"])):
                    if p + e > max_ctx:
                        raise ValueError(
                            f"request {i}: extend_prefix_lens_cpu + extend_seq_lens_cpu = {p + e} exceeds req_to_token's {max_ctx} columns"
                        )
                if fb.seq_lens_cpu is not None:
                    # host values: the sum rule of an extend step costs nothing to check, every step
                    seq_cpu = fb.seq_lens_cpu.tolist()
                    for i, (e, p, n) in enumerate(zip(cpu["extend_seq_lens_cpu"], cpu["extend_prefix_lens_cpu"], seq_cpu)):
                        if p + e != n:
                            raise ValueError(
                                f"request {i}: forward_batch.extend_prefix_lens_cpu[{i}] + extend_seq_lens_cpu[{i}] = "
                                f"{p} + {e} = {p + e}, but seq_lens_cpu[{i}] = {n} (cached prefix + new tokens must equal "
                                "seq_lens in an extend step)"
                            )
            ext = cpu.get("extend_seq_lens_cpu")
            num_tokens = sum(ext) if ext is not None else int(fb.extend_seq_lens.sum())
            tokens_why = "one per new token: the sum of extend_seq_lens" + ("_cpu" if ext is not None else "")
            extra = 0
            spec = fb.spec_info
            if spec is not None and not isinstance(getattr(spec, "causal", True), bool):
                raise TypeError(f"spec_info.causal must be a bool, got {type(spec.causal).__name__}")
        lens = self._check_lens_range(fb, extra)
        if fb.out_cache_loc is not None:
            _check_index("forward_batch.out_cache_loc", fb.out_cache_loc, dev, num_tokens, tokens_why)
        return num_tokens, extra, lens

    def _check_spec(self, spec, bs: int, n: int, *, exact: bool) -> None:
        """spec_info of a verify step: ``causal`` a bool, ``custom_mask`` ``[bs * n * n]`` and ``positions``
        ``[bs * n]`` on the device (``exact=False``, graph replay: whole requests, at most ``bs``)."""
        if not isinstance(getattr(spec, "causal", None), bool):
            raise TypeError(f"spec_info.causal must be a bool, got {type(getattr(spec, 'causal', None)).__name__}")
        for name, per_request, dtypes in (("custom_mask", n * n, _MASK_DTYPES), ("positions", n, INDEX_DTYPES)):
            x = getattr(spec, name, None)
            if x is None:
                continue
            check_tensor(f"spec_info.{name}", x, dtype=dtypes, device=self.device, ndim=1)
            m = x.shape[0]
            if exact and m != bs * per_request:
                raise ValueError(
                    f"spec_info.{name} must have shape [{bs * per_request}] (batch_size {bs} x "
                    f"{'draft_token_num^2' if name == 'custom_mask' else 'draft_token_num'}), got [{m}]"
                )
            if not exact and (m % per_request or m > bs * per_request):
                raise ValueError(
                    f"spec_info.{name} must hold whole requests of {per_request} entries, at most {bs} of "
                    f"them (the graph's batch), got [{m}]"
                )
