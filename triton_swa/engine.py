"""Serving-engine shapes with SGLang's names: forward modes, speculative algorithms, runner, batch, layer.

They carry exactly the fields the backend reads, under the names SGLang uses, so that an engine
built on SGLang's conventions (or a ``unittest.mock.MagicMock`` runner) can drive
:class:`triton_swa.backend.TritonSWAAttnBackend` unchanged.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch


class ForwardMode(enum.IntEnum):
    """What a forward step does: SGLang 0.5.23's modes, names and predicates (docs/contract.md §3, §9)."""

    EXTEND = enum.auto()  # prefill and chunked prefill
    DECODE = enum.auto()  # one new token per request
    MIXED = enum.auto()  # chunked prefill with decode requests riding along (extend-shaped)
    IDLE = enum.auto()  # nothing to do on this rank
    TARGET_VERIFY = enum.auto()  # the target model scores draft tokens
    DRAFT_EXTEND_V2 = enum.auto()  # the draft model catches up on accepted tokens (extend-shaped)
    PREBUILT = enum.auto()
    SPLIT_PREFILL = enum.auto()
    DLLM_EXTEND = enum.auto()

    def is_extend(self, include_draft_extend_v2: bool = False) -> bool:
        """SGLang's meaning: EXTEND, MIXED, TARGET_VERIFY, SPLIT_PREFILL, DLLM_EXTEND (and
        DRAFT_EXTEND_V2 when asked)."""
        modes = (ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY, ForwardMode.SPLIT_PREFILL, ForwardMode.DLLM_EXTEND)
        return self in modes or (include_draft_extend_v2 and self == ForwardMode.DRAFT_EXTEND_V2)

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_mixed(self) -> bool:
        return self == ForwardMode.MIXED

    def is_target_verify(self) -> bool:
        return self == ForwardMode.TARGET_VERIFY

    def is_draft_extend_v2(self) -> bool:
        return self == ForwardMode.DRAFT_EXTEND_V2

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE

    def is_decode_or_idle(self) -> bool:
        return self in (ForwardMode.DECODE, ForwardMode.IDLE)


class SpeculativeAlgorithm(enum.IntEnum):
    """Speculative decoding algorithms, with SGLang's predicates."""

    NONE = enum.auto()
    EAGLE = enum.auto()
    EAGLE3 = enum.auto()
    DFLASH = enum.auto()
    FROZEN_KV_MTP = enum.auto()
    NGRAM = enum.auto()

    def is_none(self) -> bool:
        return self == SpeculativeAlgorithm.NONE

    def is_eagle(self) -> bool:
        """EAGLE, EAGLE3 and FROZEN_KV_MTP all run the EAGLE worker loop."""
        return self in (SpeculativeAlgorithm.EAGLE, SpeculativeAlgorithm.EAGLE3, SpeculativeAlgorithm.FROZEN_KV_MTP)

    def is_eagle3(self) -> bool:
        return self == SpeculativeAlgorithm.EAGLE3

    def is_dflash(self) -> bool:
        return self == SpeculativeAlgorithm.DFLASH

    def is_frozen_kv_mtp(self) -> bool:
        return self == SpeculativeAlgorithm.FROZEN_KV_MTP

    def is_ngram(self) -> bool:
        return self == SpeculativeAlgorithm.NGRAM


@dataclass
class ModelRunner:
    """What an attention backend reads off a model runner."""

    token_to_kv_pool: object
    token_to_kv_pool_allocator: object
    req_to_token_pool: object
    sliding_window_size: int = -1  # window_left of the sliding layers; -1: the model has none
    is_draft_worker: bool = False
    spec_algorithm: SpeculativeAlgorithm = SpeculativeAlgorithm.NONE
    device: str | torch.device = "cpu"
    page_size: int = 1


@dataclass
class SpecInfo:
    """Speculative decoding inputs of a TARGET_VERIFY or DRAFT_EXTEND_V2 step.

    ``custom_mask`` (tree verify) is flat: each request's ``[draft_token_num, draft_token_num]``
    boolean block over its draft tokens, requests one after another; None means chain drafts
    (causal among themselves) unless ``causal`` is False (a draft block proposed at once, DFlash).
    ``positions`` (flat, optional) gives each draft token's position (tree drafts sit at prefix +
    depth).
    """

    draft_token_num: int
    custom_mask: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    causal: bool = True


def _ints(values, device) -> torch.Tensor:
    """A host list of ints as an int64 tensor on ``device`` (int64 when empty too: ``torch.tensor([])``
    alone is float32, which the backend rejects as it would any float index tensor)."""
    return torch.tensor(values, dtype=torch.int64, device=device)


@dataclass
class ForwardBatch:
    """One step's batch. ``seq_lens`` count every token including this step's new ones."""

    forward_mode: ForwardMode
    batch_size: int
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens_cpu: torch.Tensor | None = None
    extend_prefix_lens: torch.Tensor | None = None
    extend_seq_lens: torch.Tensor | None = None
    extend_prefix_lens_cpu: list[int] | None = None
    extend_seq_lens_cpu: list[int] | None = None
    spec_info: SpecInfo | None = None
    spec_algorithm: SpeculativeAlgorithm = SpeculativeAlgorithm.NONE
    extra: dict = field(default_factory=dict)

    @property
    def seq_lens_sum(self) -> int:
        return int(self.seq_lens_cpu.sum()) if self.seq_lens_cpu is not None else int(self.seq_lens.sum())

    @classmethod
    def extend(cls, rows, prefix_lens, extend_lens, out_cache_loc, *, device, mode=None) -> ForwardBatch:
        """An extend-shaped step (EXTEND by default): request ``i`` brings ``extend_lens[i]`` tokens
        after its ``prefix_lens[i]`` cached ones (host lists of ints; empty lists give an empty batch
        of int64 tensors)."""
        seq = torch.tensor([p + e for p, e in zip(prefix_lens, extend_lens)], dtype=torch.int64)
        return cls(
            ForwardMode.EXTEND if mode is None else mode,
            len(rows),
            _ints(rows, device),
            seq.to(device),
            out_cache_loc,
            seq_lens_cpu=seq,
            extend_prefix_lens=_ints(prefix_lens, device),
            extend_seq_lens=_ints(extend_lens, device),
            extend_prefix_lens_cpu=list(prefix_lens),
            extend_seq_lens_cpu=list(extend_lens),
        )

    @classmethod
    def decode(cls, rows, prefix_lens, out_cache_loc, *, device) -> ForwardBatch:
        """One new token per request, at position ``prefix_lens[i]``."""
        seq = torch.tensor(prefix_lens, dtype=torch.int64) + 1
        return cls(ForwardMode.DECODE, len(rows), _ints(rows, device), seq.to(device), out_cache_loc, seq_lens_cpu=seq)

    @classmethod
    def verify(
        cls,
        rows,
        prefix_lens,
        spec_info: SpecInfo,
        out_cache_loc,
        *,
        device,
        spec_algorithm: SpeculativeAlgorithm = SpeculativeAlgorithm.NONE,
    ) -> ForwardBatch:
        """TARGET_VERIFY: ``spec_info.draft_token_num`` tokens after each request's ``prefix_lens[i]``
        committed ones (SGLang's convention: ``seq_lens`` are the committed lengths)."""
        seq = torch.tensor(prefix_lens, dtype=torch.int64)
        return cls(
            ForwardMode.TARGET_VERIFY,
            len(rows),
            _ints(rows, device),
            seq.to(device),
            out_cache_loc,
            seq_lens_cpu=seq,
            spec_info=spec_info,
            spec_algorithm=spec_algorithm,
        )


@dataclass
class AttentionLayer:
    """A RadixAttention-like layer description.

    ``sliding_window_size`` is ``window_left`` (-1 for full layers). ``kv_shared_layer_id``: a layer
    that reads another (earlier) layer's K/V and writes none (Gemma 4's tail layers).
    """

    layer_id: int
    tp_q_head_num: int
    tp_k_head_num: int
    head_dim: int
    v_head_dim: int | None = None
    scaling: float | None = None
    logit_cap: float = 0.0
    sliding_window_size: int = -1
    sinks: torch.Tensor | None = None
    k_scale: float | None = None
    v_scale: float | None = None
    kv_shared_layer_id: int | None = None

    def __post_init__(self):
        if self.v_head_dim is None:
            self.v_head_dim = self.head_dim
        if self.scaling is None:
            self.scaling = self.head_dim**-0.5

    @property
    def tp_v_head_num(self) -> int:
        return self.tp_k_head_num

    @property
    def is_sliding(self) -> bool:
        return self.sliding_window_size >= 0
