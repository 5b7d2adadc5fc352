"""Test-only stand-in for ``sgl_kernel`` for the real-engine tier: ``sglang.Engine`` on a CPU.

SGLang 0.5.23 imports names from ``sgl_kernel`` (its compiled kernel wheel) at module level in about
ten modules it reaches while starting an engine. On a CPU with ``SGLANG_USE_CPU_ENGINE=1`` none of
those kernels is called: ``cpu_has_amx_support()`` asks ``torch.ops.sgl_kernel`` for an op this stub
never registers, so layers take their ``forward_native`` paths. Hence:

- ``import sgl_kernel`` and ``from sgl_kernel[.sub] import name`` succeed for any name;
- calling (or indexing into) such a name raises ``RuntimeError`` naming it, so an unexpected use is
  loud rather than silently wrong;
- ``sgl_kernel.scalar_type`` raises ``ImportError``: SGLang's quantization utilities then take their
  own fallback instead of binding placeholder scalar types.

The ops that speculative decoding (STANDALONE / EAGLE chain drafts) reaches on a CPU are
implemented rather than stubbed, in plain torch, each from the contract of the Triton kernel SGLang
runs for the same job on GPUs (named in each function's docstring):

- ``assign_req_to_token_pool_cpu`` (``assign_req_to_token_pool``, mem_cache/allocation.py);
- ``copy_all_layer_kv_cache_cpu`` (``copy_all_layer_kv_cache_tiled``), which SGLang's KV pools call
  whenever speculative decoding is on (``enable_kv_cache_copy``): for every buffer ``i``
  (``data_ptrs[i]``, a raw address, row stride ``strides[i]`` bytes), copy row ``src_loc[j]`` onto
  row ``tgt_loc[j]``. Without it no speculative algorithm starts on a CPU with this stub;
- ``assign_draft_cache_locs_contiguous_cpu``, ``assign_extend_cache_locs_cpu`` (cache_locs.py): a
  request's slot ids out of ``req_to_token``, for the draft steps and for verify;
- ``build_tree_kernel_efficient_cpu`` and ``verify_tree_greedy_cpu`` (spec_tree.py): the draft
  tree (retrieve links, positions, verify mask in the FULL_MASK or QLEN_ONLY layout) and its greedy
  verification;
- ``fill_accept_out_cache_loc_cpu``, ``fill_bonus_tokens_cpu`` (kernels/ops/speculative/eagle.py);
- ``sgl_kernel.speculative.reconstruct_indices_from_tree_mask`` (NGRAM; reconstruct_tree.py).

``verify_tree_greedy_cpu`` also appends each verify step's accepted-draft counts to the file named
by ``TRITON_SWA_STUB_VERIFY_LOG`` when that is set (SGLang reports acceptance only as averages).

Tensor parallelism on a CPU (``tp_size > 1``) needs no stand-in: SGLang 0.5.23 calls
``torch.ops.sgl_kernel.shm_allreduce`` / ``shm_allgather`` (and ``initialize``, ``init_cpu_threads_env``
at start) only where ``is_shm_available`` holds, i.e. on AMX (which it detects by
``torch.ops.sgl_kernel.convert_weight_packed``, never registered here) or arm64 CPUs; elsewhere its
``GroupCoordinator.all_reduce`` / ``all_gather`` take ``torch.distributed`` on the TP group (gloo).

It reaches the engine's subprocesses through ``PYTHONPATH`` (triton_swa.testing.sglang_engine puts
``tests/engine/stubs`` there); nothing else in the repository imports it.
"""

import importlib.abc
import importlib.machinery
import sys
import types

import torch

__version__ = "0.0.0+triton-swa-engine-stub"
IS_STUB = True
_MISSING_SUBMODULES = ("scalar_type",)


class _Placeholder:
    """A name SGLang binds at import time; any use needs the real sgl_kernel."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} was called, but sgl_kernel is the engine tier's stub (tests/engine/stubs)")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __repr__(self):
        return f"<sgl_kernel stub {self._name}>"


def _getattr_for(module_name: str):
    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{module_name}.{attr}")

    return __getattr__


class _StubSubmodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``sgl_kernel.<anything>`` is a module of placeholders, except the ones SGLang must miss."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(__name__ + "."):
            return None
        if fullname.split(".", 1)[1].split(".")[0] in _MISSING_SUBMODULES:
            raise ImportError(f"{fullname} is not provided by the sgl_kernel stub", name=fullname)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _getattr_for(spec.name)
        for name, op in _SUBMODULE_OPS.get(spec.name.split(".", 1)[1], {}).items():
            setattr(module, name, op)
        return module

    def exec_module(self, module):
        pass


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len=None):
    """``req_to_token[req_pool_indices[i], start[i]:end[i]] = out_cache_loc[o_i : o_i + end[i] - start[i]]``,
    ``o_i`` the lengths of the requests before ``i`` (see the module docstring)."""
    offset = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = int(end) - int(start)
        if n > 0:
            req_to_token[int(row), int(start) : int(end)] = out_cache_loc[offset : offset + n].to(req_to_token.dtype)
        offset += n


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """Row copies ``src_loc -> tgt_loc`` in every KV buffer (see the module docstring)."""
    import ctypes

    ptrs = [int(p) for p in data_ptrs.reshape(-1).tolist()]
    row_bytes = [int(s) for s in strides.reshape(-1).tolist()]
    pairs = list(zip(tgt_loc.reshape(-1).tolist(), src_loc.reshape(-1).tolist()))
    for ptr, stride in zip(ptrs, row_bytes):
        # all reads before any write, as the kernel's tiles do for disjoint rows
        rows = [(int(t), ctypes.string_at(ptr + int(s) * stride, stride)) for t, s in pairs if int(t) != int(s)]
        for t, data in rows:
            ctypes.memmove(ptr + t * stride, data, stride)


# ----- speculative decoding's CPU ops (plain torch; each from the contract of the Triton kernel
# SGLang runs for the same job on GPUs, named in its docstring)


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk, num_cols):
    """``assign_draft_cache_locs_contiguous`` (kernels/ops/speculative/cache_locs.py): request ``b``'s
    ``topk * num_cols`` slot ids ``req_to_token[req_pool_indices[b], seq_lens[b]:]`` go to
    ``out_cache_loc[b * topk * num_cols:]`` (the slots the draft steps write)."""
    n = int(topk) * int(num_cols)
    for b, (row, start) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[b * n : (b + 1) * n] = req_to_token[int(row), int(start) : int(start) + n].to(out_cache_loc.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """``assign_extend_cache_locs`` (cache_locs.py): the slot ids ``req_to_token[req_pool_indices[i],
    start[i]:end[i]]`` of every request, concatenated in request order into ``out_cache_loc``."""
    offset = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = int(end) - int(start)
        if n > 0:
            out_cache_loc[offset : offset + n] = req_to_token[int(row), int(start) : int(end)].to(out_cache_loc.dtype)
        offset += n


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    """``fill_accept_out_cache_loc`` (kernels/ops/speculative/eagle.py): the slots of the accepted
    tokens, in order: ``accept_out_cache_loc[k] = out_cache_loc[j]`` for the k-th ``j`` of the flattened
    ``accept_index`` that is not -1."""
    idx = accept_index.reshape(-1)
    kept = idx[idx != -1].long()
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    """``fill_bonus_tokens`` (eagle.py): request ``i``'s last accepted token (the bonus),
    ``accept_tokens.flat[accept_stride * i + accept_lens[i] - 1]``."""
    flat = accept_tokens.reshape(-1)
    rows = torch.arange(accept_lens.numel(), device=flat.device)
    bonus_tokens.copy_(flat[rows * int(accept_stride) + accept_lens.long() - 1].to(bonus_tokens.dtype))


def build_tree_kernel_efficient_cpu(
    parent_list,
    selected_index,
    verified_seq_len,
    tree_mask,
    positions,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    topk,
    depth,
    draft_token_num,
    tree_mask_mode,
):
    """``sgl_build_tree_kernel_efficient_triton`` (kernels/ops/speculative/spec_tree.py): the draft tree of
    each request ``b`` (``n = draft_token_num`` nodes, node 0 the bonus token, node ``i > 0`` the draft
    ``selected_index[b, i - 1]``, whose parent is the node drafted as ``parent_list[b, sel // topk]``,
    or the root when ``sel // topk == 0``):

    - ``retrive_index[b, i] = b * n + i``; ``retrive_next_token[b, p]`` = p's last-listed child,
      ``retrive_next_sibling[b, i]`` = the child listed after ``i`` (children linked from the highest
      node index down; -1 ends a list: the caller fills -1);
    - ``positions[b * n + i] = seq_len + depth(i)`` (at most ``depth`` levels);
    - ``tree_mask``: node ``i``'s row attends the root and its ancestors and itself, no other draft
      node. ``tree_mask_mode`` 0 (FULL_MASK): rows of ``seq_len + n`` columns per request, packed
      request after request, the prefix columns left as the caller filled them; 1 (QLEN_ONLY):
      ``n x n`` per request. Mode 2 (bit-packed) is not stood in for.
    """
    mode = int(tree_mask_mode)
    if mode not in (0, 1):
        raise NotImplementedError(f"build_tree_kernel_efficient_cpu stand-in: tree_mask_mode {mode} (bit-packed) is not implemented")
    n, topk, depth = int(draft_token_num), int(topk), int(depth)
    bs = verified_seq_len.numel()
    seq_lens = [int(x) for x in verified_seq_len.tolist()]
    sel = selected_index.reshape(bs, -1).tolist()
    parents = parent_list.reshape(bs, -1).tolist() if parent_list.numel() else [[] for _ in range(bs)]

    def node_of(b, token_idx):
        """The node (1-based) whose draft is ``token_idx``, or None."""
        for pp in range(n - 1):
            if sel[b][pp] == token_idx:
                return pp + 1
        return None

    def parent_node(b, i):
        """Node ``i``'s parent node: 0 for the root, None when not found."""
        tb = sel[b][i - 1] // topk
        return 0 if tb == 0 else node_of(b, parents[b][tb])

    prefix = 0
    for b in range(bs):
        seq_len = seq_lens[b]
        positions[b * n] = seq_len
        for i in range(n - 1, 0, -1):
            retrive_index[b, i] = b * n + i
            p = parent_node(b, i)
            if p is not None:
                first = int(retrive_next_token[b, p])
                retrive_next_token[b, p] = i
                if first != -1:
                    retrive_next_sibling[b, i] = first
        retrive_index[b, 0] = b * n
        for x in range(n):
            if mode == 0:
                root = n * n * b + prefix * n + (seq_len + n) * x + seq_len
            else:
                root = n * n * b + n * x
            tree_mask[root] = True
            tree_mask[root + 1 : root + n] = False
            if x == 0:
                continue
            node, level = x, 0
            for _ in range(depth):
                level += 1
                tree_mask[root + node] = True
                p = parent_node(b, node)
                if not p:  # the root (0) or not found
                    break
                node = p
            positions[b * n + x] = seq_len + level
        prefix += seq_len


def verify_tree_greedy_cpu(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token, retrive_next_sibling, target_predict
):
    """``verify_tree_greedy_kernel_triton`` (spec_tree.py): greedy verification of each request's draft
    tree. From the root, repeatedly move to the child whose draft token (``candidates``) equals the
    target's prediction at the current node (``target_predict.flat[node's retrive_index]``), siblings
    tried in list order; stop at the first level without a match (at most ``accept_index.shape[1] - 1``
    levels). ``accept_index[b]`` gets the root's and every accepted node's retrive_index,
    ``accept_token_num[b]`` the number of accepted drafts, and ``predicts.flat[j]`` the target's token at
    each node ``j`` on the accepted path (the last one being the bonus)."""
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    pred_flat, target_flat = predicts.view(-1), target_predict.reshape(-1)
    for b in range(bs):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, steps):
            cur = int(retrive_next_token[b, cur])
            want = int(target_flat[last])
            while cur != -1 and int(candidates[b, cur]) != want:
                cur = int(retrive_next_sibling[b, cur])
            if cur == -1:
                break
            pred_flat[last] = want
            accepted += 1
            last = int(retrive_index[b, cur])
            accept_index[b, accepted] = last
        accept_token_num[b] = accepted
        pred_flat[last] = target_flat[last]
    _record_verify(accept_token_num)


def _record_verify(accept_token_num) -> None:
    """Per-step acceptance for tests: with ``TRITON_SWA_STUB_VERIFY_LOG`` set, append one line per
    verify step, ``V`` and the accepted drafts of each request of the batch (SGLang reports only
    averages)."""
    import os

    path = os.environ.get("TRITON_SWA_STUB_VERIFY_LOG")
    if path:
        with open(path, "a") as f:
            f.write("V " + " ".join(str(int(x)) for x in accept_token_num.tolist()) + "\n")


def reconstruct_indices_from_tree_mask(
    tree_mask, verified_seq_len, positions, retrive_index, retrive_next_token, retrive_next_sibling, batch_size, draft_token_num
):
    """``sgl_kernel.speculative.reconstruct_indices_from_tree_mask`` (NGRAM), contract as
    kernels/ops/speculative/reconstruct_tree.py states it: ``tree_mask`` is ``[bs, n, n]`` (flat),
    ``mask[b, i, j]`` marking node ``j`` an ancestor of ``i``; with ``anc[i, j] = mask[b, i, j] and j < i``:
    ``positions[b, i] = seq_len[b] + #anc[i]``, ``retrive_index[b, i] = b * n + i``, ``parent(i)`` the
    largest ancestor (-1 if none), ``retrive_next_token[b, i]`` the smallest ``k > i`` with ``anc[k, i]``,
    ``retrive_next_sibling[b, i]`` the smallest ``k > i`` with ``parent(k) == parent(i)`` (-1 if none or
    if ``parent(i) < 0``)."""
    n, bs = int(draft_token_num), int(batch_size)
    mask = tree_mask.reshape(bs, n, n).bool()
    lower = torch.ones(n, n, dtype=torch.bool, device=mask.device).tril_(-1)
    for b in range(bs):
        anc = (mask[b] & lower).tolist()
        parent = [max((j for j in range(i) if anc[i][j]), default=-1) for i in range(n)]
        seq_len = int(verified_seq_len[b])
        for i in range(n):
            positions.view(bs, n)[b, i] = seq_len + sum(anc[i])
            retrive_index.view(bs, n)[b, i] = b * n + i
            retrive_next_token.view(bs, n)[b, i] = next((k for k in range(i + 1, n) if anc[k][i]), -1)
            sibling = next((k for k in range(i + 1, n) if parent[k] == parent[i]), -1) if parent[i] >= 0 else -1
            retrive_next_sibling.view(bs, n)[b, i] = sibling


# ops of sgl_kernel's submodules that the stub implements (submodule -> name -> op)
_SUBMODULE_OPS = {"speculative": {"reconstruct_indices_from_tree_mask": reconstruct_indices_from_tree_mask}}


sys.meta_path.insert(0, _StubSubmodules())
__getattr__ = _getattr_for(__name__)
