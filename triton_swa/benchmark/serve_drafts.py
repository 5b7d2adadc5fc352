"""Random-weight draft models of SGLang 0.5.23's EAGLE, EAGLE3 and DFLASH architectures, for the GPU
engine tier (:mod:`triton_swa.benchmark.serve`) on this project's Gemma-like targets.

:func:`build_draft` reads a target directory written by ``serve.build_model`` /
``tiny_models.build_tiny_model`` (Gemma 3 ``Gemma3ForCausalLM`` or Gemma 4 ``Gemma4ForCausalLM`` text
config) and writes, under ``root``, a draft directory: ``config.json``, ``model.safetensors`` (bf16,
seeded random weights: linear layers N(0, 0.02), RMSNorm scales 1.0, the identity of these drafts'
``x * w`` norms), a copy of the target's tokenizer files and ``triton_swa_draft.json`` (written last:
a directory with it, built from the same target config, algorithm and seed, is reused).
:func:`draft_engine_args` gives the ``sglang.Engine`` keyword arguments of each algorithm.

The drafts (hidden size = the target's everywhere, as each draft consumes the target's hidden states
and embeddings; heads, KV heads and head dim = the target's sliding layers'; intermediate size = the
target's; vocabulary = the target's ``vocab_size``):

- ``EAGLE``: ``LlamaForCausalLMEagle`` (srt/models/llama_eagle.py), one Llama layer without its
  input norm, ``fc`` (2H -> H, with bias) over [token embedding, target hidden]. The checkpoint has no
  ``embed_tokens`` / ``lm_head``: SGLang replaces both with the target's
  (speculative/eagle_worker_v2.py:336-378 ``init_lm_head`` -> ``set_embed_and_head``, models/llama.py:895).
  ``tie_word_embeddings`` is False: ``set_embed_and_head`` deletes ``embed_tokens.weight`` and then
  ``lm_head.weight``, which fails on one tied module (models/llama.py:895-899).
- ``EAGLE3``: ``LlamaForCausalLMEagle3`` (srt/models/llama_eagle3.py), one layer whose attention reads
  [normed embedding, normed hidden] (2H), ``fc`` (3H -> H, no bias) over the three captured target
  layers, ``norm``. Full target vocabulary, no ``d2t`` / ``t2d`` map (``hot_token_id`` stays None):
  ``draft_vocab_size`` = ``vocab_size`` and ``tie_word_embeddings`` True, so the head is the draft's
  embedding, which SGLang replaces with the target's (eagle_worker_v2.py:363 ``set_embed``; for these
  tied Gemma targets that is also the target's head). ``draft_vocab_size`` must be present in the
  config: llama_eagle3.py:318 reads it unconditionally. The captured layers are
  ``eagle_config.eagle_aux_hidden_state_layer_ids``: SGLang's default when absent,
  ``[2, n // 2, n - 3]`` as capture points (gemma3_causal.py:921, gemma4_causal.py:1499), repeats a
  point at n = 4 or 6 layers and then captures two features for an fc of three, so the ids are
  written: ``[1, n // 2 - 1, n - 4]`` (the same points) where distinct, else spread over the stack.
- ``DFLASH``: ``DFlashDraftModel`` (srt/models/dflash.py), ``model_type`` qwen3 as the published
  DFlash drafts, 2 layers (q/k norms, non-causal within the block: ``layer_types`` full_attention and
  no ``is_causal``), ``fc`` (3H -> H, no bias) over three target layers, ``hidden_norm``, ``norm``; no
  embedding or head (the target's are used). ``dflash_config``: ``block_size`` 4 (=
  ``speculative_num_draft_tokens``), ``target_layer_ids`` (three distinct ids inside the target's
  layers, SGLang's own choice ``build_target_layer_ids`` (speculative/dflash_utils.py:348) where that
  is distinct, else spread), ``num_target_layers``, ``mask_token_id`` = ``vocab_size - 1`` (inside the
  vocabulary; it must be set, as the engine runs with ``skip_tokenizer_init``).

SGLang 0.5.23's constraints (paths under ``sglang/srt/``):

- EAGLE / EAGLE3 with ``speculative_eagle_topk == 1``: ``speculative_num_draft_tokens`` is reset to
  ``speculative_num_steps + 1`` (arg_groups/speculative_hook.py:1255-1266): steps 3, topk 1, draft
  tokens 4 here. ``max_running_requests`` defaults to 48 under any speculative algorithm left unset
  (speculative_hook.py:1086-1094; DFLASH: :438-446).
- EAGLE3 needs the target to implement ``set_eagle3_layers_to_capture``
  (model_executor/model_runner_components/attention_backend_setup.py:54-61): Gemma 3 and Gemma 4 do
  (gemma3_causal.py:917, gemma4_causal.py:1495).
- DFLASH needs ``set_dflash_layers_to_capture`` (or ``set_dspark_layers_to_capture``) on the target
  (attention_backend_setup.py:62-72): Gemma 4 has it (gemma4_causal.py:1208), **Gemma 3
  (``Gemma3ForCausalLM``) does not**, so SGLang refuses DFLASH on a Gemma 3 target at start-up
  (:func:`missing_target_hooks` reports it).
- DFLASH runs only on CUDA, NPU or XPU devices (speculative_hook.py:290-302: not on SGLang's CPU
  engine), with ``pp_size == 1`` (:319) and a draft path (:324-327). It forces
  ``speculative_num_steps`` and ``speculative_eagle_topk`` to 1, with a warning when set otherwise
  (:329-366). ``speculative_dflash_block_size``, if given, must equal ``speculative_num_draft_tokens``
  (:368-387); with neither, the draft config's ``block_size`` is used, else 16 (:389-425). The worker
  uses ``speculative_num_draft_tokens`` as the block size and only warns when the config's differs
  (speculative/dflash_worker_v2.py:507-524). A ``speculative_draft_window_size`` must be >= the block
  size (speculative_hook.py:427-434).
- DFLASH's draft attention backend (speculative_hook.py:886-987): ``speculative_draft_attention_backend``
  if given, else the main ``attention_backend``, kept if it is in ``DRAFT_ATTENTION_BACKEND_CHOICES``
  (arg_groups/choices.py:103: flashinfer, fa3, fa4, triton, ascend, trtllm_mha, intel_xpu; triton-swa's
  plugin adds ``triton_swa``, triton_swa/integrations/sglang.py), else ``flashinfer`` on CUDA
  (``triton`` on ROCm / XPU) with a warning; ``trtllm_mha`` only for an all-sliding or causal draft.
  So with ``--attention-backend triton_swa`` (plugin loaded) or ``triton`` the draft runs the same
  backend; a backend outside the list falls back to FlashInfer.
- DFLASH's ``mask_token_id`` must be below the target's vocabulary size, and without it the mask id
  is looked up in the tokenizer, which ``skip_tokenizer_init`` forbids (dflash_worker_v2.py:1391-1470).
  ``target_layer_ids`` must lie in ``[0, num_target_layers)`` (dflash_utils.py ``resolve_target_layer_ids``);
  the target captures the input of layer ``id + 1`` (the output of layer ``id``; ``n`` is the final
  layer's output), once per distinct point.

What :func:`check_draft_load` verifies (on a CPU, no engine, no forward pass): SGLang's
``ModelConfig`` reads the draft as the engine does (``is_draft_model``, its ``speculative_algorithm``)
and ``get_model_architecture`` resolves its class, which is instantiated (``torch.distributed`` on gloo,
world size 1, SGLang's model-parallel groups) and loads the safetensors with its own ``load_weights``
through SGLang's own iterator, every parameter first set to NaN; each parameter is then compared with
the value expected from the checkpoint (q/k/v and gate/up stacked in SGLang's order): none left
unloaded except those SGLang takes from the target, no checkpoint tensor without a parameter, shapes
and values equal. It also makes SGLang's binding call (``set_embed_and_head`` / ``set_embed``) with
tensors of the target's shapes, checks the captured layers and the fc's feature count against the
target's layer count (and DFLASH's block size and mask id), the hidden size and vocabulary against the
target's, and reports the target hooks SGLang needs that the target's class lacks. Not verified here:
any forward pass, KV pools, attention backends, CUDA graphs, the workers themselves.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from typing import Any

__all__ = [
    "ALGORITHMS",
    "DFLASH_BLOCK_SIZE",
    "build_draft",
    "check_draft_load",
    "draft_config",
    "draft_engine_args",
    "draft_tensor_shapes",
    "from_target",
    "layer_ids",
    "missing_target_hooks",
    "target_dims",
]

ALGORITHMS = ("EAGLE", "EAGLE3", "DFLASH")
SPEC_STEPS, SPEC_TOPK, SPEC_DRAFT_TOKENS = 3, 1, 4  # the chain of serve._spec_args
DFLASH_BLOCK_SIZE = SPEC_DRAFT_TOKENS  # DFLASH's verify block: the anchor and 3 drafted tokens
DFLASH_LAYERS = 2
CONTEXT_FEATURES = 3  # target layers EAGLE3 and DFLASH read
STD = 0.02
ROPE_THETA = 10_000.0
MARKER = "triton_swa_draft.json"
_FORMAT = 1  # bump when the written drafts change: older directories are rebuilt
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja")
_ARCH = {"EAGLE": "LlamaForCausalLMEagle", "EAGLE3": "LlamaForCausalLMEagle3", "DFLASH": "DFlashDraftModel"}
# parameters of SGLang's draft class that SGLang replaces with the target's (not in the checkpoint)
_FROM_TARGET = {"EAGLE": ("model.embed_tokens.weight", "lm_head.weight"), "EAGLE3": ("model.embed_tokens.weight",), "DFLASH": ()}
# SGLang's stacked parameters: checkpoint projection -> (fused parameter, position in the stack)
_STACKED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown draft algorithm {algorithm!r}; expected one of {ALGORITHMS}")


def target_dims(config: dict) -> dict:
    """The dims a draft takes from a target ``config.json`` (Gemma 3, or Gemma 4 in SGLang's flattened
    form, whose ``head_dim`` / ``num_key_value_heads`` are the full layers' and ``swa_*`` the sliding
    layers'); the draft's attention copies the sliding layers' shape."""
    c = config.get("text_config") or config
    sliding = "swa_head_dim" in c
    return dict(
        hidden_size=int(c["hidden_size"]),
        intermediate_size=int(c["intermediate_size"]),
        vocab_size=int(c["vocab_size"]),
        num_layers=int(c["num_hidden_layers"]),
        heads=int(c["num_attention_heads"]),
        kv_heads=int(c["swa_num_key_value_heads"] if sliding else c.get("num_key_value_heads", c["num_attention_heads"])),
        head_dim=int(c["swa_head_dim"] if sliding else c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])),
        rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        max_positions=int(c.get("max_position_embeddings", 8192)),
        bos=c.get("bos_token_id", 2),
        eos=c.get("eos_token_id", 1),
        pad=c.get("pad_token_id", 0),
    )


def _spread(n: int, k: int) -> list[int]:
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def layer_ids(algorithm: str, num_target_layers: int, k: int = CONTEXT_FEATURES) -> list[int]:
    """The ``k`` distinct target layers (0-based; the draft reads each one's output) of EAGLE3 or
    DFLASH: SGLang's own default choice where its points are distinct, else spread over the stack."""
    n = num_target_layers
    if n < k:
        raise ValueError(f"{algorithm} reads {k} distinct target layers; the target has {n}")
    if algorithm == "EAGLE3":
        ids = [1, n // 2 - 1, n - 4]  # SGLang's capture points [2, n // 2, n - 3], as layer outputs
    else:  # SGLang's build_target_layer_ids(n, k) (dflash_utils.py)
        ids = [round(1 + i * (n - 4) / (k - 1)) for i in range(k)]
    if len(set(ids)) == k and all(0 <= i < n for i in ids) and ids == sorted(ids):
        return ids
    ids = _spread(n, k)
    assert len(ids) == k, (n, k, ids)
    return ids


def draft_config(algorithm: str, target_config: dict) -> dict:
    """The draft's ``config.json`` for ``algorithm`` on a target of ``target_config``."""
    _check_algorithm(algorithm)
    d = target_dims(target_config)
    n = d["num_layers"]
    base = dict(
        hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"],
        num_attention_heads=d["heads"],
        num_key_value_heads=d["kv_heads"],
        head_dim=d["head_dim"],
        hidden_act="silu",
        rms_norm_eps=d["rms_norm_eps"],
        vocab_size=d["vocab_size"],
        max_position_embeddings=d["max_positions"],
        rope_theta=ROPE_THETA,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=d["bos"],
        eos_token_id=d["eos"],
        pad_token_id=d["pad"],
        dtype="bfloat16",  # transformers 5 spelling (torch_dtype before)
    )
    if algorithm == "EAGLE":
        return dict(base, architectures=[_ARCH[algorithm]], model_type="llama", num_hidden_layers=1, tie_word_embeddings=False)
    if algorithm == "EAGLE3":
        return dict(
            base,
            architectures=[_ARCH[algorithm]],
            model_type="llama",
            num_hidden_layers=1,
            tie_word_embeddings=True,
            draft_vocab_size=d["vocab_size"],
            target_hidden_size=d["hidden_size"],
            eagle_config={"eagle_aux_hidden_state_layer_ids": layer_ids("EAGLE3", n), "use_aux_hidden_state": True},
        )
    return dict(
        base,
        architectures=[_ARCH[algorithm]],
        model_type="qwen3",
        num_hidden_layers=DFLASH_LAYERS,
        layer_types=["full_attention"] * DFLASH_LAYERS,
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=DFLASH_LAYERS,
        tie_word_embeddings=False,
        block_size=DFLASH_BLOCK_SIZE,
        num_target_layers=n,
        dflash_config={
            "block_size": DFLASH_BLOCK_SIZE,
            "target_layer_ids": layer_ids("DFLASH", n),
            "num_target_layers": n,
            "mask_token_id": d["vocab_size"] - 1,
        },
    )


def draft_tensor_shapes(algorithm: str, config: dict) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensor names and shapes for a draft ``config`` (names as published drafts
    spell them: no ``model.`` prefix, q/k/v and gate/up separate)."""
    _check_algorithm(algorithm)
    H, I = config["hidden_size"], config["intermediate_size"]
    q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    attn_in = 2 * H if algorithm == "EAGLE3" else H
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (q, attn_in),
                p + "self_attn.k_proj.weight": (kv, attn_in),
                p + "self_attn.v_proj.weight": (kv, attn_in),
                p + "self_attn.o_proj.weight": (H, q),
                p + "mlp.gate_proj.weight": (I, H),
                p + "mlp.up_proj.weight": (I, H),
                p + "mlp.down_proj.weight": (H, I),
                p + "post_attention_layernorm.weight": (H,),
            }
        )
        if algorithm != "EAGLE" or i > 0:  # EAGLE's first layer has no input norm
            shapes[p + "input_layernorm.weight"] = (H,)
        if algorithm == "EAGLE3":
            shapes[p + "hidden_norm.weight"] = (H,)
        if algorithm == "DFLASH":
            shapes[p + "self_attn.q_norm.weight"] = (config["head_dim"],)
            shapes[p + "self_attn.k_norm.weight"] = (config["head_dim"],)
    if algorithm == "EAGLE":
        shapes.update({"fc.weight": (H, 2 * H), "fc.bias": (H,)})
    elif algorithm == "EAGLE3":
        k = len(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
        shapes.update({"fc.weight": (H, k * H), "norm.weight": (H,)})
    else:
        k = len(config["dflash_config"]["target_layer_ids"])
        shapes.update({"fc.weight": (H, k * H), "hidden_norm.weight": (H,), "norm.weight": (H,)})
    return shapes


def from_target(algorithm: str) -> tuple[str, ...]:
    """Parameters of SGLang's draft class that SGLang binds to the target's tensors (not written)."""
    _check_algorithm(algorithm)
    return _FROM_TARGET[algorithm]


def _random_tensors(shapes: dict[str, tuple[int, ...]], seed: int) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight"):  # RMSNorm x * w: scale 1 is the identity
            t = torch.ones(shape)
        else:
            t = torch.randn(shape, generator=gen) * STD
        out[name] = t.to(torch.bfloat16).contiguous()
    return out


def _config_digest(target_path: str) -> str:
    with open(os.path.join(target_path, "config.json"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def build_draft(algorithm: str, target_path: str, root: str, *, seed: int = 0) -> str:
    """Write the random-weight ``algorithm`` draft of the target at ``target_path`` under ``root``
    (once: a complete directory built from the same target config, algorithm and seed is reused);
    returns its path."""
    _check_algorithm(algorithm)
    with open(os.path.join(target_path, "config.json")) as f:
        target_config = json.load(f)
    name = f"{os.path.basename(os.path.normpath(target_path))}-{algorithm.lower()}-draft-s{seed}"
    path = os.path.join(root, name)
    info = {
        "format": _FORMAT,
        "algorithm": algorithm,
        "architecture": _ARCH[algorithm],
        "seed": seed,
        "std": STD,
        "target": os.path.abspath(target_path),
        "target_config_sha256": _config_digest(target_path),
        "from_target": list(from_target(algorithm)),
        "dtype": "bfloat16",
    }
    marker = os.path.join(path, MARKER)
    if os.path.exists(marker):
        with open(marker) as f:
            old = json.load(f)
        if all(old.get(k) == info[k] for k in ("format", "algorithm", "seed", "target_config_sha256")):
            return path
    from safetensors.torch import save_file

    config = draft_config(algorithm, target_config)
    tensors = _random_tensors(draft_tensor_shapes(algorithm, config), seed)
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=root)
    try:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        for fname in _TOKENIZER_FILES:
            src = os.path.join(target_path, fname)
            if os.path.exists(src):
                shutil.copy2(src, os.path.join(tmp, fname))
        info["parameters"] = sum(t.numel() for t in tensors.values())
        with open(os.path.join(tmp, MARKER), "w") as f:
            json.dump(info, f, indent=2)
        if os.path.exists(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
    return path


def draft_engine_args(algorithm: str, draft_path: str) -> dict:
    """The ``sglang.Engine`` keyword arguments of ``algorithm`` with the draft at ``draft_path``
    (SGLang's constraints: module doc). EAGLE / EAGLE3: the chain of 3 steps, top-1, 4 verified
    tokens. DFLASH: one block of 4 (the anchor and 3 drafted tokens, as the chain verifies 4);
    steps and top-k 1, as SGLang forces them; the draft attention backend is left to SGLang (the main
    backend where it is a draft backend choice, triton_swa included with the plugin loaded)."""
    _check_algorithm(algorithm)
    args: dict[str, Any] = {"speculative_algorithm": algorithm, "speculative_draft_model_path": draft_path}
    if algorithm == "DFLASH":
        args.update(speculative_num_steps=1, speculative_eagle_topk=1, speculative_num_draft_tokens=DFLASH_BLOCK_SIZE)
    else:
        args.update(speculative_num_steps=SPEC_STEPS, speculative_eagle_topk=SPEC_TOPK, speculative_num_draft_tokens=SPEC_DRAFT_TOKENS)
    return args


# ----------------------------------------------------------------------------------------------
# the check against SGLang's own classes (imports SGLang; run it in a process of its own: it
# publishes SGLang's runtime context)

_TARGET_HOOKS = {
    "EAGLE": (("get_embed_and_head_for_draft", "get_embed_and_head"),),
    "EAGLE3": (("get_embed_and_head_for_draft", "get_embed_and_head"), ("set_eagle3_layers_to_capture",)),
    "DFLASH": (("get_input_embeddings",), ("set_dflash_layers_to_capture", "set_dspark_layers_to_capture")),
}


def missing_target_hooks(algorithm: str, target_path: str) -> list[str]:
    """The methods SGLang calls on the target for ``algorithm`` that the target's SGLang class lacks
    (each entry: the alternatives, joined by ``|``); empty when it has them all. Imports SGLang."""
    _check_algorithm(algorithm)
    from sglang.srt.models.registry import ModelRegistry

    with open(os.path.join(target_path, "config.json")) as f:
        archs = json.load(f)["architectures"]
    cls, _ = ModelRegistry.resolve_model_cls(archs)
    return ["|".join(alts) for alts in _TARGET_HOOKS[algorithm] if not any(hasattr(cls, a) for a in alts)]


def _expected_params(tensors: dict, params: dict) -> tuple[dict, list[str]]:
    """Checkpoint tensors -> {SGLang parameter name: expected value}, by this module's own reading of
    SGLang's layouts (tensor parallel size 1); names that fit no parameter are returned apart."""
    import torch

    parts: dict[str, dict[int, Any]] = {}
    unexpected = []
    for name, t in tensors.items():
        fused, pos = name, 0
        for proj, (stacked, i) in _STACKED.items():
            if f".{proj}." in name:
                fused, pos = name.replace(f".{proj}.", f".{stacked}."), i
                break
        target = next((c for c in (fused, f"model.{fused}") if c in params), None)
        if target is None:
            unexpected.append(name)
            continue
        parts.setdefault(target, {})[pos] = t
    expected = {p: torch.cat([d[i] for i in sorted(d)], dim=0) if len(d) > 1 else next(iter(d.values())) for p, d in parts.items()}
    return expected, unexpected


def _capture_report(algorithm: str, hf_config: Any, info: dict) -> dict:
    """The target layers the draft reads, as SGLang resolves and captures them."""
    target_path = info.get("target")
    n = vocab = None
    if target_path and os.path.exists(os.path.join(target_path, "config.json")):
        with open(os.path.join(target_path, "config.json")) as f:
            dims = target_dims(json.load(f))
        n, vocab = dims["num_layers"], dims["vocab_size"]
    out: dict[str, Any] = {}
    if algorithm == "EAGLE3":
        ids = list(hf_config.eagle_config["eagle_aux_hidden_state_layer_ids"])
    elif algorithm == "DFLASH":
        from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

        parsed = parse_dflash_draft_config(draft_hf_config=hf_config)
        ids = parsed.resolve_target_layer_ids(target_num_layers=n or parsed.num_target_layers)
        out.update(block_size=parsed.block_size, mask_token_id=parsed.mask_token_id)
    else:
        return out
    points = [i + 1 for i in ids]  # set_*_layers_to_capture: the input of layer id + 1
    ok = n is not None and len(set(points)) == len(points) and all(1 <= p <= n for p in points)
    if algorithm == "DFLASH":  # the block of draft_engine_args, and a mask id inside the target's vocabulary
        mask = out["mask_token_id"]
        ok = ok and out["block_size"] == DFLASH_BLOCK_SIZE and vocab is not None and mask is not None and 0 <= mask < vocab
    return dict(out, layer_ids=ids, capture_points=points, target_layers=n, capture_ok=ok)


def _bind_target_tensors(algorithm: str, model: Any) -> str:
    """SGLang's EAGLE worker binds the target's embedding (and head) into the draft
    (eagle_worker_v2.py ``init_lm_head``): make the same call with stand-in tensors of the target's
    shapes and check what the draft then reads; "ok" or what went wrong."""
    import torch

    if algorithm == "DFLASH":  # the DFLASH worker passes the target's embeddings and head per call
        return "ok" if getattr(model, "embed_tokens", None) is None else "the draft has an embedding of its own"
    embed = torch.zeros_like(model.model.embed_tokens.weight)
    try:
        if algorithm == "EAGLE":
            head = torch.zeros_like(model.lm_head.weight)
            model.set_embed_and_head(embed, head)
            if model.model.embed_tokens.weight is not embed or model.lm_head.weight is not head:
                return "set_embed_and_head did not bind the target's tensors"
            return "ok"
        if getattr(model, "load_lm_head_from_target", False) or getattr(model, "hot_token_id", None) is not None:
            return "EAGLE3 draft takes the set_embed_and_head path or a d2t map: not the full-vocabulary tied draft written here"
        model.set_embed(embed)
        if model.model.embed_tokens.weight is not embed or model.lm_head.weight is not embed:
            return "set_embed did not make the target's embedding the draft's embedding and head"
        return "ok"
    except Exception as e:  # noqa: BLE001 - reported
        return f"{type(e).__name__}: {e}"


_WORLD_READY = False


def _sglang_cpu_world() -> None:
    """SGLang's runtime context and parallel groups for one CPU process: a published default
    ``ServerArgs`` (device cpu, every parallel size 1), ``torch.distributed`` on gloo with world size
    1 and SGLang's model-parallel groups over it (once per process)."""
    global _WORLD_READY
    if _WORLD_READY:
        return
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    reset_context()
    publish(ServerArgs(model_path="dummy", device="cpu"), role="bench", ranks=SpawnRanks(world_rank=0))
    store = os.path.join(tempfile.mkdtemp(prefix="triton_swa_drafts_"), "store")
    init_distributed_environment(world_size=1, rank=0, local_rank=0, distributed_init_method=f"file://{store}", backend="gloo")
    initialize_model_parallel()
    _WORLD_READY = True


def check_draft_load(draft_path: str) -> dict:
    """Instantiate the draft's SGLang class on the CPU (tensor parallel size 1) from SGLang's reading of
    its config, load the safetensors with the class's own ``load_weights`` and compare every
    parameter with the checkpoint (module doc). Imports SGLang and publishes its runtime context: run
    it in a process of its own (``python -m triton_swa.benchmark.serve_drafts --check PATH...``)."""
    import torch

    report: dict[str, Any] = {"path": draft_path, "ok": False, "error": None}
    try:
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.model_loader.utils import get_model_architecture
        from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

        with open(os.path.join(draft_path, MARKER)) as f:
            info = json.load(f)
        algorithm = info["algorithm"]
        _sglang_cpu_world()
        # the draft's config as the engine reads it (ModelConfig.from_server_args with is_draft_model)
        with open(os.path.join(draft_path, "config.json")) as f:
            context = json.load(f)["max_position_embeddings"]
        model_config = ModelConfig(
            model_path=draft_path,
            trust_remote_code=False,
            context_length=context,
            dtype="bfloat16",
            is_draft_model=True,
            speculative_algorithm=algorithm,
        )
        hf_config = model_config.hf_config
        cls, arch = get_model_architecture(model_config)  # as the loader's _initialize_model resolves it
        report.update(algorithm=algorithm, architecture=arch, sglang_class=f"{cls.__module__}.{cls.__name__}")
        report.update(
            head_dim=model_config.head_dim,
            kv_heads=model_config.get_num_kv_heads(1),
            vocab_size=model_config.vocab_size,
            context_len=model_config.context_len,
            hybrid_swa=bool(model_config.is_hybrid_swa),
        )
        report.update(_capture_report(algorithm, hf_config, info))
        if os.path.exists(os.path.join(info.get("target", ""), "config.json")):
            with open(os.path.join(info["target"], "config.json")) as f:
                target = target_dims(json.load(f))
            # the draft's hidden states and vocabulary are the target's (its embedding, head, hidden states)
            report["dims_ok"] = (model_config.vocab_size, model_config.hidden_size) == (target["vocab_size"], target["hidden_size"])
            report["missing_target_hooks"] = missing_target_hooks(algorithm, info["target"])  # the target's side, reported apart
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device("cpu"):
                model = cls(config=hf_config, quant_config=None)
        finally:
            torch.set_default_dtype(previous)
        if "capture_points" in report:  # the features the draft's fc takes: one per captured point
            k = model.num_context_features if algorithm == "DFLASH" else model.model.num_aux_hidden_states
            report["context_features"] = int(k)
            report["capture_ok"] = report["capture_ok"] and int(k) == len(set(report["capture_points"]))
        params = dict(model.named_parameters())
        with torch.no_grad():
            for p in params.values():
                p.fill_(float("nan"))
        files = [os.path.join(draft_path, f) for f in sorted(os.listdir(draft_path)) if f.endswith(".safetensors")]
        tensors = dict(safetensors_weights_iterator(files))
        model.load_weights(iter(tensors.items()))
        expected, unexpected = _expected_params(tensors, params)
        shared = set(from_target(algorithm))
        missing, mismatched, loaded = [], [], []
        for name, p in params.items():
            if name in shared:
                continue
            want = expected.get(name)
            if want is None or torch.isnan(p.float()).any():
                missing.append(name)
            elif tuple(p.shape) != tuple(want.shape) or not torch.equal(p.detach().to(want.dtype), want):
                mismatched.append(f"{name}: parameter {tuple(p.shape)}, checkpoint {tuple(want.shape)}")
            else:
                loaded.append(name)
        report["binding"] = _bind_target_tensors(algorithm, model)
        report.update(
            parameters=len(params),
            loaded=sorted(loaded),
            from_target=sorted(shared & set(params)),
            missing=sorted(missing),
            unexpected=sorted(unexpected),
            mismatched=sorted(mismatched),
            shared_absent=sorted(shared - set(params)),
        )
        bad = missing or unexpected or mismatched or report["shared_absent"] or report["binding"] != "ok"
        report["ok"] = bool(loaded) and not bad and report.get("capture_ok", True) and report.get("dims_ok", True)
    except Exception as e:  # noqa: BLE001 - a failed load is the report's answer
        import traceback

        report["error"] = f"{type(e).__name__}: {e}"
        report["traceback"] = traceback.format_exc()[-4000:]
    return report


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m triton_swa.benchmark.serve_drafts", description=__doc__.split("\n\n")[0])
    p.add_argument("--build", nargs=3, metavar=("ALGORITHM", "TARGET", "ROOT"), help="write a draft; prints its path")
    p.add_argument("--check", nargs="+", metavar="DRAFT", help="load drafts into SGLang's classes on the CPU; prints JSON")
    p.add_argument("--hooks", nargs=2, metavar=("ALGORITHM", "TARGET"), help="the target hooks SGLang needs and the target lacks")
    a = p.parse_args(argv)
    if a.build:
        print(build_draft(a.build[0], a.build[1], a.build[2]))
    if a.hooks:
        print(json.dumps(missing_target_hooks(*a.hooks)))
    if a.check:
        reports = [check_draft_load(path) for path in a.check]
        print(json.dumps(reports))
        return 0 if all(r["ok"] for r in reports) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
