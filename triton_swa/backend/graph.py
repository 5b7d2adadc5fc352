"""CUDA graphs: the fixed buffers a captured step reads, and their refill at capture and replay.

:meth:`~_CudaGraphs.init_cuda_graph_state` allocates every buffer once; capture and replay build the
step's metadata into them (the window indices through the metadata part's ``_indices``), so that a
replay's metadata equals, bit for bit, what ``init_forward_metadata`` builds eagerly for the same batch.
DECODE, TARGET_VERIFY and DRAFT_EXTEND_V2 (a draft model's extend over the drafts just verified: a
fixed number of new tokens per request, the last of ``seq_lens``, causal).
"""

from __future__ import annotations

import torch

from ..ops.indices import WindowIndices, WindowPageTable, max_window_len, max_window_pages
from .checks import _as_int, _check_index
from .metadata import ForwardMetadata


class _CudaGraphs:
    """The CUDA-graph part of :class:`~triton_swa.backend.TritonSWAAttnBackend`: owns ``cuda_graph``
    (the buffers) and sets ``forward_metadata`` at capture and replay; reads ``req_to_token``,
    ``page_size``, ``sliding_window_size``, ``device``, the batch part's ``_check_spec`` and the
    metadata part's ``_indices``."""

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        """``seq_lens`` value of padded batch entries (they point at ``req_to_token`` row 0)."""
        return 1

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate, once, every buffer a captured graph's kernels read: window indices, lengths,
        ``qo_indptr``, draft positions, the tree mask and its offsets.

        TARGET_VERIFY follows SGLang's convention ``draft_token_num = max_num_tokens // max_bs``: the
        mask holds ``max_bs * draft_token_num ** 2`` entries and the positions ``max_num_tokens``.
        Capture and replay fill these buffers in place (``[:n]``, the tail zeroed or padded); a replay
        that needs more than this raises.
        """
        max_bs = _as_int("max_bs", max_bs, 1)
        max_num_tokens = _as_int("max_num_tokens", max_num_tokens, max_bs)
        max_ctx = self.req_to_token.shape[1]
        w, dev = self.sliding_window_size, self.device
        drafts = max_num_tokens // max_bs

        def buffers(per_request: int) -> WindowIndices:
            return WindowIndices(
                torch.zeros(max_bs + 1, dtype=torch.int32, device=dev),
                torch.zeros(max(1, max_bs * per_request), dtype=torch.int32, device=dev),
                torch.zeros(max_bs, dtype=torch.int32, device=dev),
            )

        def tables(window_left: int) -> WindowPageTable:
            # Wide enough for a decode window (W + 1 keys) and a verify prefix window (W keys).
            width = max_window_pages(window_left, self.page_size, max_ctx)
            return WindowPageTable(
                torch.zeros(max_bs, max(1, width), dtype=torch.int32, device=dev), torch.zeros(max_bs, dtype=torch.int32, device=dev)
            )

        make = buffers if self.page_size == 1 else tables
        self.cuda_graph = {
            "max_bs": max_bs,
            "max_num_tokens": max_num_tokens,
            "draft_token_num": drafts,
            "full": make(max_ctx if self.page_size == 1 else -1),
            "sliding": (make(max_window_len(w, max_ctx) if self.page_size == 1 else w)) if w >= 0 else None,
            "seq_lens": torch.zeros(max_bs, dtype=torch.int64, device=dev),
            "qo_indptr": torch.zeros(max_bs + 1, dtype=torch.int32, device=dev),
            "prefix_lens": torch.zeros(max_bs, dtype=torch.int32, device=dev),
            "positions": torch.zeros(max_num_tokens, dtype=torch.int64, device=dev),
            "custom_mask": torch.zeros(max_bs * drafts * drafts, dtype=torch.bool, device=dev),
            "mask_indptr": torch.zeros(max_bs + 1, dtype=torch.int32, device=dev),
            # (bs, mode) -> what the captured kernels were specialised on (draft count, causal, mask, positions)
            "captured": {},
        }

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        """Metadata for capture: the same fixed buffers that replay refills. DRAFT_EXTEND_V2 takes its
        new tokens per request from ``num_tokens // bs`` (each replay of the graph brings as many)."""
        self._graph_metadata(bs, req_pool_indices, seq_lens, forward_mode, spec_info, capture=True, num_tokens=num_tokens)

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu=None
    ) -> None:
        """Refill the fixed buffers for a replay (padded entries use row 0 and the fill length).

        ``spec_info`` may be a fresh object every step: its positions and tree mask are copied into
        the buffers the graph reads. It must match what was captured (``draft_token_num``, ``causal``,
        whether it has a mask and positions); it may cover fewer requests than ``bs`` (padding).

        What a replay promises, for a batch padded the engine's way (the padded requests on
        ``req_to_token`` row 0 with :meth:`get_cuda_graph_seq_len_fill_value`, their drafts past
        ``spec_info``'s requests):

        - Metadata: equal, bit for bit, to :meth:`init_forward_metadata` over the same ``bs``
          requests, padding included: the window indices (``kv_indptr``, ``kv_indices`` up to
          ``kv_indptr[bs]``; the page tables, whose columns past eager's width are 0), window
          starts and ends, ``qo_indptr``, prefix lengths and the split bounds. Verify: the tree mask
          and positions of the requests ``spec_info`` covers are copied; the requests past it get an
          all-zero mask block (they see no draft) and positions ``prefix + i``, which is what eager
          must be given to match.
        - Outputs of the real requests (rows not on row 0): equal, bit for bit, to eager's over the
          same padded batch with the same inputs and pools (same indices, bounds and split counts).
          Eager over the real requests alone may split otherwise and differ within rounding.
        - Outputs of the padded requests: unspecified, to be discarded. Their window is row 0's
          dummy slot 0, which the padded tokens' own stores (``out_cache_loc`` 0) write
          concurrently, in no fixed order on a GPU, so they can differ from eager's, and from one
          replay to the next. They never change a real request's rows.

        ``tests/test_backend_graph.py::test_padded_replay_promise`` tests exactly this (DECODE and
        TARGET_VERIFY, page sizes 1 and 4).
        """
        self._graph_metadata(bs, req_pool_indices, seq_lens, forward_mode, spec_info, capture=False)

    def _graph_metadata(self, bs, req_pool_indices, seq_lens, forward_mode, spec_info, *, capture: bool, num_tokens=None) -> None:
        if self.cuda_graph is None:
            raise ValueError("init_cuda_graph_state must run before capture or replay")
        g = self.cuda_graph
        bs = _as_int("bs", bs, 1)
        if bs > g["max_bs"]:
            raise ValueError(f"bs={bs} exceeds the max_bs={g['max_bs']} of init_cuda_graph_state")
        draft_extend = getattr(forward_mode, "is_draft_extend_v2", lambda: False)()
        if not (forward_mode.is_decode() or forward_mode.is_target_verify() or draft_extend):
            raise ValueError(f"CUDA graphs cover DECODE, TARGET_VERIFY and DRAFT_EXTEND_V2, not {forward_mode.name}")
        for name, t in (("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens)):
            _check_index(name, t, self.device)
            if t.shape[0] < bs:
                raise ValueError(f"{name} must have at least bs={bs} entries, got {t.shape[0]}")
        req_pool_indices, seq_lens = req_pool_indices[:bs], seq_lens[:bs]
        extend = forward_mode.is_target_verify() or draft_extend
        sig = ("decode",)
        n, has_mask = 1, False
        if draft_extend:
            if capture:
                num_tokens = _as_int("num_tokens", num_tokens, bs)
                if num_tokens % bs or num_tokens > g["max_num_tokens"]:
                    raise ValueError(
                        f"DRAFT_EXTEND_V2 captures the same new tokens per request: num_tokens={num_tokens} must be a "
                        f"multiple of bs={bs} and at most the max_num_tokens={g['max_num_tokens']} of init_cuda_graph_state"
                    )
                n = num_tokens // bs
            else:
                captured = g["captured"].get((bs, forward_mode))
                n = captured[1] if captured else 1  # uncaptured: the check below names it
            sig = ("draft extend", n)
        elif extend:
            if spec_info is None:
                raise ValueError("TARGET_VERIFY needs spec_info with draft_token_num")
            n = _as_int("spec_info.draft_token_num", getattr(spec_info, "draft_token_num", None), 1)
            if bs * n > g["max_num_tokens"]:
                raise ValueError(
                    f"TARGET_VERIFY needs bs * draft_token_num = {bs} * {n} = {bs * n} query tokens, more "
                    f"than the max_num_tokens={g['max_num_tokens']} of init_cuda_graph_state"
                )
            self._check_spec(spec_info, bs, n, exact=False)
            has_mask = spec_info.custom_mask is not None
            if has_mask and bs * n * n > g["custom_mask"].numel():
                raise ValueError(
                    f"TARGET_VERIFY's tree mask needs bs * draft_token_num^2 = {bs * n * n} entries, more "
                    f"than the {g['custom_mask'].numel()} init_cuda_graph_state allocated (max_bs "
                    f"{g['max_bs']} x draft_token_num {g['draft_token_num']}^2, draft_token_num = "
                    "max_num_tokens // max_bs)"
                )
            sig = (n, spec_info.causal, has_mask, spec_info.positions is not None)
        key = (bs, forward_mode)
        if capture:
            g["captured"][key] = sig
        else:
            want = g["captured"].get(key)
            if want is None:
                raise ValueError(f"no CUDA graph was captured for bs={bs} in {forward_mode.name}")
            if want != sig:
                names = ("draft_token_num", "causal", "custom_mask given", "positions given")
                diff = ", ".join(f"{k}: captured {a}, replayed {b}" for k, a, b in zip(names, want, sig) if a != b)
                raise ValueError(f"spec_info does not match the captured graph (bs={bs}): {diff}")
        w = self.sliding_window_size
        # Everything a captured kernel reads lives in the buffers of init_cuda_graph_state: a tensor
        # made here (or a spec_info's own) would be gone or stale at the next replay.
        if draft_extend:
            # the new tokens are the last n of seq_lens (padded requests' fill length leaves no prefix)
            lens = g["prefix_lens"][:bs].copy_((seq_lens - n).clamp_(min=0))
        else:
            lens = g["prefix_lens"][:bs].copy_(seq_lens) if extend else g["seq_lens"][:bs].copy_(seq_lens)

        def build(which, window_left, translate):
            buf = g[which]
            if self.page_size == 1:
                out = WindowIndices(buf.kv_indptr[: bs + 1], buf.kv_indices, buf.window_starts[:bs])
            else:
                out = WindowPageTable(buf.page_table[:bs], buf.window_starts[:bs])
            return self._indices(req_pool_indices, lens, window_left=window_left, extend=extend, translate=translate, out=out)

        full = build("full", -1, False)
        sliding = build("sliding", w, self.use_sliding_window_kv_pool) if w >= 0 else None
        meta = ForwardMetadata(forward_mode, full, sliding, bs, bs * n)
        if extend:
            dev = self.device
            qo = g["qo_indptr"][: bs + 1]
            qo.copy_(torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device=dev))
            meta.qo_indptr, meta.prefix_lens, meta.max_extend_len = qo, lens, n
            meta.causal = True if draft_extend else spec_info.causal
            if not draft_extend and spec_info.positions is not None:
                # padded requests (and any the spec_info does not cover) sit at prefix + i
                pos = g["positions"]
                pos[: bs * n].copy_((lens.long()[:, None] + torch.arange(n, device=dev)).reshape(-1))
                pos[bs * n :].zero_()
                pos[: spec_info.positions.shape[0]].copy_(spec_info.positions)
                meta.q_positions = pos[: bs * n]
            if has_mask:
                mask = g["custom_mask"]
                mask.zero_()  # padded requests see no draft (their rows are discarded)
                mask[: spec_info.custom_mask.shape[0]].copy_(spec_info.custom_mask)
                meta.custom_mask = mask[: bs * n * n]
                mi = g["mask_indptr"][: bs + 1]
                mi.copy_(torch.arange(0, (bs + 1) * n * n, n * n, dtype=torch.int32, device=dev))
                meta.mask_indptr = mi[:bs]
        self.forward_metadata = meta
