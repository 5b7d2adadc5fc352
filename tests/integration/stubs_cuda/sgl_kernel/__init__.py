"""Test-only stand-in for ``sgl_kernel`` (SGLang's CUDA kernel wheel), for the SGLang tier on a GPU.

Why it exists: on a CUDA torch, SGLang 0.5.23's layer and quantization modules import names from
``sgl_kernel`` at module level (``layers/layernorm.py``, ``quantization/utils.py``, the fused-MoE
runner, ...), and ``layers/attention/triton_backend.py`` asks ``sgl_kernel.utils`` whether the GPU
supports programmatic dependent launch. None of those kernels is used by the attention paths this
project compares against (SGLang's Triton attention kernels are Triton code in the ``sglang``
wheel), and the real wheel is several hundred MiB. So every name imported from here exists, using
any of them raises, and ``sgl_kernel.utils.is_arch_support_pdl`` answers with SGLang's own JIT-side
answer to the same question (``sglang.kernels.jit.utils.is_arch_support_pdl``).

It is put on ``sys.path`` only where SGLang is installed, torch has CUDA and the real
``sgl_kernel`` does not import (``tests/integration/sglang_stubs.py``).

The GPU engine tier (``scripts/gpu.sh engine``: SGLang's own ``Engine`` on the H200, where the real
wheel is built for another torch and does not load) uses it too. There SGLang runs with
``SGLANG_FORCE_FUSED_OP_BACKEND=torch``, so its fused layers (norms, activations, rotary) take their
plain-torch ``forward_native`` paths instead of calling into this module, for every attention backend
alike. The ops such an engine still calls are implemented below, in plain torch (the list is
:data:`STOOD_IN`); any other name still raises when used.

gpt-oss adds two: its MoE experts, routed to SGLang's Triton MoE runner on the GPU (the test-side
plugin ``tests/engine/plugins/triton_swa_moe_cuda_path.py``; docs/sglang.md says why), call
``moe_align_block_size`` before the expert GEMMs and ``moe_sum_reduce`` after them (above 32
tokens with top-k > 2). Both are written here without host synchronisation and with output
shapes fixed by their arguments, so CUDA graphs capture them.
"""

import importlib.abc
import importlib.machinery
import sys
import types

import torch

__version__ = "0.0.0+triton-swa-test-stub"
IS_STUB = True
# the ops implemented here (the GPU engine tier's stand-ins), each the same for every attention backend
STOOD_IN = ("weak_ref_tensor", "moe_align_block_size", "moe_sum_reduce")


def weak_ref_tensor(tensor):
    """SGLang's CUDA-graph runners keep graph outputs through ``weak_ref_tensor`` (a tensor over the
    same memory that does not own it). This stand-in returns a view, which does keep the storage
    alive: the same values and addresses, at the cost of holding the last captured outputs."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"weak_ref_tensor: expected a torch.Tensor, got {type(tensor).__name__}")
    return tensor.view(tensor.shape)


def moe_align_block_size(
    topk_ids,
    num_experts,
    block_size,
    sorted_token_ids,
    experts_ids,
    num_tokens_post_pad,
    cumsum_buffer,
    pad_sorted_token_ids=False,
    ignore_invalid_expert=False,
):
    """Group the flattened (token, slot) pairs of ``topk_ids`` by expert, each group padded to a
    multiple of ``block_size``, for SGLang's Triton fused-MoE GEMMs. As SGLang 0.5.23 calls it
    (``layers/moe/moe_runner/triton_utils/moe_align_block_size.py`` through
    ``sglang.kernels.ops.moe.moe_align_block_size``), in place:

    - ``num_experts`` is the bucket count ``E + 1`` ("+1 offset" convention): pair ``i`` with expert
      id ``e`` (``-1`` = filtered out under expert parallelism) goes to bucket ``e + 1``;
    - buckets are laid out in bucket order, bucket ``b`` starting at the sum of the earlier buckets'
      counts, each count rounded up to a multiple of ``block_size``;
    - ``num_tokens_post_pad[0]`` is the total of the rounded counts (int32);
    - ``experts_ids[k] = b - 1`` for every block ``k`` below that total that lies in bucket ``b``;
      entries past the total are not read by SGLang (here: -1);
    - ``sorted_token_ids[start_b : start_b + count_b]`` holds bucket ``b``'s pair indices (flat index
      into ``topk_ids``); the rest of each padded bucket holds ``topk_ids.numel()``. With
      ``pad_sorted_token_ids`` the whole buffer is pre-filled with ``numel`` (SGLang passes True);
    - ``cumsum_buffer`` (``num_experts + 1`` int32 or more) is scratch in the CUDA kernel; here it gets
      the buckets' start offsets and the total.

    The order of pairs inside a bucket is unspecified (atomics in the CUDA kernel); here it is
    ascending. ``ignore_invalid_expert`` (ids outside ``[0, E)`` dropped, a different contract) is
    not stood in: SGLang's gpt-oss path passes False."""
    if ignore_invalid_expert:
        raise NotImplementedError("moe_align_block_size(ignore_invalid_expert=True) is not stood in")
    device = topk_ids.device
    numel = topk_ids.numel()
    buckets = int(num_experts)
    bucket = topk_ids.reshape(-1).to(torch.int64) + 1
    counts = torch.zeros(buckets, dtype=torch.int64, device=device)
    counts.scatter_add_(0, bucket, torch.ones_like(bucket))
    padded = (counts + block_size - 1) // block_size * block_size
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    num_tokens_post_pad[:1].copy_(ends[-1:].to(num_tokens_post_pad.dtype))
    cumsum_buffer[:buckets].copy_(starts.to(cumsum_buffer.dtype))
    cumsum_buffer[buckets : buckets + 1].copy_(ends[-1:].to(cumsum_buffer.dtype))
    # pairs in bucket order (stable: ascending pair index inside a bucket), and each one's slot
    order = torch.sort(bucket, stable=True).indices
    in_order = bucket[order]
    first_of_bucket = torch.cumsum(counts, 0) - counts
    rank = torch.arange(numel, device=device) - first_of_bucket[in_order]
    if pad_sorted_token_ids:
        sorted_token_ids.fill_(numel)
    else:  # the padding slots of the used region still hold numel
        used = torch.arange(sorted_token_ids.numel(), device=device) < ends[-1]
        sorted_token_ids.masked_fill_(used, numel)
    sorted_token_ids.scatter_(0, starts[in_order] + rank, order.to(sorted_token_ids.dtype))
    block_start = torch.arange(experts_ids.numel(), device=device) * block_size
    owner = torch.searchsorted(ends, block_start, right=True)  # the bucket holding each block
    expert = torch.where(block_start < ends[-1], owner - 1, torch.full_like(owner, -1))
    experts_ids.copy_(expert.to(experts_ids.dtype))


def moe_sum_reduce(input, output, routed_scaling_factor):
    """``output[t, :] = routed_scaling_factor * sum_k input[t, k, :]`` for ``input`` of shape
    ``[tokens, top_k, hidden]`` and ``output`` of ``[tokens, hidden]`` (same dtype), summed in
    float32 and rounded once to the output's dtype. SGLang 0.5.23 calls it to combine the
    router-weighted expert outputs (``moe_runner/triton_utils/fused_moe.py``,
    ``moe_combine_topk``, more than 32 tokens and top-k > 2)."""
    if input.dim() != 3 or output.shape != (input.shape[0], input.shape[2]):
        raise ValueError(f"moe_sum_reduce: input {tuple(input.shape)} and output {tuple(output.shape)} do not match")
    acc = input.to(torch.float32).sum(dim=1) * float(routed_scaling_factor)
    output.copy_(acc.to(output.dtype))


class _Unavailable:
    """A name bound at import time whose use needs the real sgl_kernel."""

    def __init__(self, qualname):
        self._qualname = qualname

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._qualname}: sgl_kernel is a test stub here (tests/integration/stubs_cuda); install the real one")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{self._qualname}.{name}")

    def __repr__(self):
        return f"<sgl_kernel stub {self._qualname}>"


def _module_getattr(module_name):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{module_name}.{name}")

    return __getattr__


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any ``sgl_kernel.<name>`` without a file here is a module of unavailable names."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + ".") and importlib.machinery.PathFinder.find_spec(fullname, path) is None:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)
        return module

    def exec_module(self, module):
        pass


sys.meta_path.append(_SubmoduleFinder())
__getattr__ = _module_getattr(__name__)
