"""Tiny random-weight causal LMs written to a local directory, for the real-engine tier.

:func:`build_tiny_model` writes ``config.json``, ``model.safetensors`` and a small byte-level BPE
tokenizer (trained here with the ``tokenizers`` package on a seeded synthetic corpus) for one of:

- ``"gemma3"``: ``Gemma3ForCausalLM`` (text), sliding and full layers of one head dim;
- ``"gemma4"``: ``Gemma4ForCausalLM`` (text only), sliding and full layers with different head dims
  and KV-head counts, per-layer inputs (PLE) and KV-shared layers at the top of the stack;
- ``"gpt-oss"``: ``GptOssForCausalLM``, attention sinks, a small mixture of experts (bf16);
- ``"gemma3-draft"``: a one-layer Gemma 3 sharing the tokenizer (and vocabulary) of the others, the
  draft model of speculative STANDALONE decoding.

Nothing is downloaded. Weights are drawn from a seeded generator with a larger spread than
transformers' default init, so greedy tokens are decided by clear margins (float32 implementations
agree on them) while still depending on the context. The sliding windows are small (8-16 tokens) so a
few dozen generated tokens already exercise eviction.

Importing this module imports neither transformers nor SGLang; transformers is imported inside the
builders. Gemma 4's ``config.json`` is written in the form SGLang 0.5.23 reads for ``gemma4_text``
(``head_dim`` / ``num_key_value_heads`` of the full layers, ``swa_head_dim`` /
``swa_num_key_value_heads`` of the sliding ones, no ``per_layer_config``), plus
``global_head_dim`` / ``num_global_key_value_heads``; :func:`load_hf_config` turns it back into the
transformers config (sliding shape as the base, full layers overridden).
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

__all__ = [
    "FAMILIES",
    "SPECIALS",
    "build_tiny_model",
    "build_tokenizer",
    "embed_std",
    "load_hf_config",
    "model_info",
    "repeats_one_token",
    "transformers_dir",
]

FAMILIES = ("gemma3", "gemma4", "gpt-oss", "gemma3-draft")
# Gemma's special-token ids (pad 0, eos 1, bos 2), used by every family here.
SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>")
VOCAB_SIZE = 384
_TOKENIZER_SEED = 1234
_WORDS = (
    "the a window slides over keys and values while queries attend to recent tokens only pages hold slots "
    "of the cache evicted when they fall out of range sinks keep mass full layers see everything draft "
    "models propose tokens target verifies accepts some rejects others kernel triton block tile warp grid"
).split()


def _corpus(n_lines: int = 400, seed: int = _TOKENIZER_SEED) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 999)))
        lines.append(" ".join(words) + rng.choice([".", ",", "!", "?", ""]))
    return lines


def build_tokenizer(path: str, vocab_size: int = VOCAB_SIZE) -> int:
    """Train a byte-level BPE tokenizer on the seeded corpus and save it (``tokenizer.json`` and the
    ``PreTrainedTokenizerFast`` files) in ``path``; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIALS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    for i, name in enumerate(SPECIALS):
        assert tok.token_to_id(name) == i, (name, tok.token_to_id(name))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>")
    fast.model_max_length = 512
    os.makedirs(path, exist_ok=True)
    fast.save_pretrained(path)
    return tok.get_vocab_size()


def _layer_types(layers: int, full_every: int, last_full: bool = True) -> list[str]:
    """Sliding layers with every ``full_every``-th one full (2: every other), and the last one (the tiny
    models' rule; the published Gemma 3 configs follow the period alone: ``last_full=False``)."""
    full = {i for i in range(layers) if (i + 1) % full_every == 0} | ({layers - 1} if last_full else set())
    return ["full_attention" if i in full else "sliding_attention" for i in range(layers)]


def _gemma3_config(vocab: int, *, layers: int, window: int, shape: dict | None = None) -> Any:
    from transformers import Gemma3TextConfig

    d = dict(hidden_size=64, intermediate_size=128, heads=4, kv_heads=2, head_dim=16, full_every=2, last_full=True, max_positions=512)
    d.update(shape or {})
    return Gemma3TextConfig(
        vocab_size=vocab,
        hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"],
        num_hidden_layers=layers,
        num_attention_heads=d["heads"],
        num_key_value_heads=d["kv_heads"],
        head_dim=d["head_dim"],
        query_pre_attn_scalar=d["head_dim"],
        sliding_window=window,
        layer_types=_layer_types(layers, d["full_every"], d["last_full"]),
        max_position_embeddings=d["max_positions"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        },
        final_logit_softcapping=30.0,
        attn_logit_softcapping=None,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=True,
        architectures=["Gemma3ForCausalLM"],
    )


# Gemma 4 (tiny): sliding layers (head_dim 16, 2 KV heads) and full layers (head_dim 32, 1 KV head),
# every third layer full; the last two layers reuse the KV of the last non-shared layer of their type.
_G4 = dict(
    layers=6,
    hidden_size=64,
    intermediate_size=128,
    heads=4,
    sliding_head_dim=16,
    full_head_dim=32,
    sliding_kv_heads=2,
    full_kv_heads=1,
    kv_shared=2,
    full_every=3,
    ple=8,
    max_positions=512,
)


def _g4(shape: dict | None) -> dict:
    return dict(_G4, **(shape or {}))


def _gemma4_hf_kwargs(vocab: int, window: int, shape: dict | None = None) -> dict:
    g = _g4(shape)
    return dict(
        vocab_size=vocab,
        hidden_size=g["hidden_size"],
        intermediate_size=g["intermediate_size"],
        num_hidden_layers=g["layers"],
        num_attention_heads=g["heads"],
        num_key_value_heads=g["sliding_kv_heads"],
        head_dim=g["sliding_head_dim"],
        global_head_dim=g["full_head_dim"],
        num_global_key_value_heads=g["full_kv_heads"],
        attention_k_eq_v=True,  # gates num_global_key_value_heads in transformers; SGLang then drops v_proj of full layers
        sliding_window=window,
        layer_types=_layer_types(g["layers"], g["full_every"]),
        max_position_embeddings=g["max_positions"],
        hidden_size_per_layer_input=g["ple"],
        vocab_size_per_layer_input=vocab,
        num_kv_shared_layers=g["kv_shared"],
        final_logit_softcapping=30.0,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=True,
    )


def _gemma4_config(vocab: int, *, window: int, shape: dict | None = None) -> Any:
    from transformers import Gemma4TextConfig

    cfg = Gemma4TextConfig(**_gemma4_hf_kwargs(vocab, window, shape))
    cfg.architectures = ["Gemma4ForCausalLM"]
    return cfg


def _gemma4_sglang_json(cfg_dict: dict, shape: dict | None = None) -> dict:
    """transformers' Gemma4TextConfig dict -> the flattened form SGLang 0.5.23 reads (see module doc)."""
    g = _g4(shape)
    out = {k: v for k, v in cfg_dict.items() if k != "per_layer_config"}
    out.update(
        head_dim=g["full_head_dim"],
        num_key_value_heads=g["full_kv_heads"],
        v_head_dim=g["full_head_dim"],
        swa_head_dim=g["sliding_head_dim"],
        swa_v_head_dim=g["sliding_head_dim"],
        swa_num_key_value_heads=g["sliding_kv_heads"],
        global_head_dim=g["full_head_dim"],
        num_global_key_value_heads=g["full_kv_heads"],
        triton_swa_tiny_model="gemma4",
    )
    if shape:
        out["triton_swa_shape"] = dict(shape)
    return out


def _gpt_oss_config(vocab: int, *, layers: int, window: int, shape: dict | None = None) -> Any:
    """gpt-oss: sliding and full layers alternating (sliding first), attention sinks, a mixture of
    experts with biases and the clamped SwiGLU. ``shape`` overrides the tiny dims (``hidden_size``,
    ``intermediate_size``, ``heads``, ``kv_heads``, ``head_dim``, ``experts``, ``experts_per_token``,
    ``max_positions``, ``rope_theta``)."""
    from transformers import GptOssConfig

    d = dict(
        hidden_size=64,
        intermediate_size=64,
        heads=4,
        kv_heads=2,
        head_dim=16,
        experts=4,
        experts_per_token=2,
        max_positions=512,
        rope_theta=10_000.0,
    )
    d.update(shape or {})
    return GptOssConfig(
        vocab_size=vocab,
        hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"],
        num_hidden_layers=layers,
        num_attention_heads=d["heads"],
        num_key_value_heads=d["kv_heads"],
        head_dim=d["head_dim"],
        num_local_experts=d["experts"],
        num_experts_per_tok=d["experts_per_token"],
        sliding_window=window,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        max_position_embeddings=d["max_positions"],
        rope_parameters={"rope_type": "default", "rope_theta": d["rope_theta"]},
        # the clamp of gpt-oss's SwiGLU, written out as gpt-oss's own config.json has it: SGLang reads
        # config.swiglu_limit, which transformers 5.17's GptOssConfig does not declare (5.19's does)
        swiglu_limit=7.0,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=False,
        architectures=["GptOssForCausalLM"],
    )


def load_hf_config(path: str) -> Any:
    """The transformers config of a directory written by :func:`build_tiny_model` (Gemma 4's
    ``config.json`` is in SGLang's flattened form; the others load with ``AutoConfig``)."""
    from transformers import AutoConfig

    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    if raw.get("triton_swa_tiny_model") == "gemma4":
        return _gemma4_config(raw["vocab_size"], window=raw["sliding_window"], shape=raw.get("triton_swa_shape"))
    return AutoConfig.from_pretrained(path)


def transformers_dir(path: str) -> str:
    """A directory of the model at ``path`` whose ``config.json`` is transformers' own form, for
    engines that read a config as transformers writes it (vLLM): ``path`` itself, except for Gemma 4,
    whose ``config.json`` here is SGLang's flattened form. Then a sibling ``<path>-hf`` holds
    transformers' config (with its ``per_layer_config``) and links to every other file; made once."""
    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    if raw.get("triton_swa_tiny_model") != "gemma4":
        return path
    out = path.rstrip(os.sep) + "-hf"
    if os.path.exists(os.path.join(out, "config.json")):
        return out
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(path):
        if name != "config.json" and not os.path.lexists(os.path.join(out, name)):
            os.symlink(os.path.abspath(os.path.join(path, name)), os.path.join(out, name))
    cfg = load_hf_config(path).to_dict()
    cfg["torch_dtype"] = cfg.get("torch_dtype") or raw.get("torch_dtype") or raw.get("dtype")
    tmp = os.path.join(out, "config.json.tmp")
    with open(tmp, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    os.replace(tmp, os.path.join(out, "config.json"))
    return out


def embed_std(family: str, hidden_size: int) -> float:
    """The spread of the token embeddings. Gemma multiplies them by sqrt(width) and reads its logits
    through the same matrix (tied): at a fixed spread the current token's own embedding outweighs
    what the layers add at real widths, and greedy decoding repeats the last prompt token forever,
    whatever attention reads (every Gemma-like model of the GPU tier did, 2026-12-05). So for Gemma
    the spread shrinks as 1/sqrt(width) past the tiny models' 64, as the other weights' does."""
    if family.startswith("gemma"):
        return 0.05 * min(1.0, (64 / hidden_size) ** 0.5)
    return 0.05


def repeats_one_token(tokens) -> bool:
    """A greedy stream of four or more tokens that is one token repeated: what a random model whose
    input embedding dominates its logits writes. Such a stream cannot tell attention paths apart."""
    return len(tokens) >= 4 and len(set(tokens)) == 1


# The spread of a query-key score (before softmax) over random inputs, at real widths (``shape``
# given). Gemma 4 scores normalized q and k at scaling 1.0, so its q/k norm weights alone set the scale:
# at the common norm centre (1) a head of 256 scored keys with a spread of about 19, attention took its
# top key (0.3 nats of entropy, 0.88 of the weight) and float32 rounding decided which key won: the
# float32 and float64 runs of serve's gemma4-like model grew apart by about 1.5x a layer, to logits up
# to 2 apart, and their greedy tokens parted within 1-3 outputs (2026-12). At a spread of 3 its
# attention keeps 2.7-3.1 nats (of log 512 = 6.2), the two runs stay within 4e-4 in the logits, and a
# prompt changed 200-400 tokens back still changes every greedy token. (At 2: 4.2-4.6 nats, 7e-5, but
# greedy streams that repeat tokens.)
QK_SCORE_STD = 3.0


def qk_norm_init(family: str, head_dim: int, score_std: float = QK_SCORE_STD) -> tuple[float, float]:
    """(centre, spread) of the q_norm / k_norm weights (as stored) that give scores a spread of about
    ``score_std``: a score of unit-RMS q and k is a sum of ``head_dim`` products."""
    if family == "gemma4":  # weight w scales directly; attention scaling 1.0: score ~ w^2 sqrt(d)
        scale = (score_std / head_dim**0.5) ** 0.5
        return scale, 0.25 * scale
    # Gemma 3 scales by 1 + w and its scaling is query_pre_attn_scalar**-0.5 = head_dim**-0.5:
    # score ~ (1 + w)^2
    scale = score_std**0.5
    return scale - 1.0, 0.25 * scale


def _init_weights(model, seed: int, std: float, norm_centre: float, embed_std: float, qk_family: str | None = None) -> None:
    """``qk_family`` (real widths only: the tiny models keep their weights) sets the q/k norms by
    :func:`qk_norm_init` for that Gemma family."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if not p.is_floating_point():
                continue
            if "norm" in name:  # RMSNorm scales around 2 (Gemma scales by 1 + w, gpt-oss by w)
                # the final norm also sets the logits' scale: a wide one keeps greedy margins clear
                centre = 4 * norm_centre + (3.0 if norm_centre == 1.0 else 0.0) if name == "model.norm.weight" else norm_centre
                spread = 0.5
                if qk_family and name.endswith(("q_norm.weight", "k_norm.weight")):
                    centre, spread = qk_norm_init(qk_family, p.shape[-1])
                p.copy_((centre + spread * torch.randn(p.shape, generator=gen, dtype=torch.float32)).to(p.dtype))
                continue
            s = std if p.ndim >= 2 else std / 4
            if "embed" in name:
                s = embed_std if "per_layer" not in name else 0.5
            if name.endswith("sinks"):
                s = 1.0
            p.copy_((torch.randn(p.shape, generator=gen, dtype=torch.float32) * s).to(p.dtype))


def model_info(path: str) -> dict:
    """``triton_swa_tiny.json`` of a built model: family, seed, sliding window, layer types, dtype."""
    with open(os.path.join(path, "triton_swa_tiny.json")) as f:
        return json.load(f)


def build_tiny_model(
    family: str,
    path: str,
    seed: int = 0,
    *,
    window: int | None = None,
    num_layers: int | None = None,
    shape: dict | None = None,
    vocab_size: int | None = None,
    dtype: str | None = None,
    weights: bool = True,
) -> str:
    """Write a tiny random-weight model of ``family`` (one of :data:`FAMILIES`) to ``path``; returns ``path``.

    ``window`` is the ``sliding_window`` of the config (defaults: 8 for Gemma 3, 16 for Gemma 4, 8
    for gpt-oss); ``num_layers`` overrides the layer count of Gemma 3 / gpt-oss.

    For models at real sizes (the GPU engine tier, ``triton_swa.benchmark.serve``): ``shape`` overrides
    the Gemma dims (Gemma 3: ``hidden_size``, ``intermediate_size``, ``heads``, ``kv_heads``,
    ``head_dim``, ``full_every``, ``last_full``, ``max_positions``; Gemma 4 also ``layers``, ``sliding_head_dim``,
    ``full_head_dim``, ``sliding_kv_heads``, ``full_kv_heads``, ``kv_shared``, ``ple``; gpt-oss:
    ``hidden_size``, ``intermediate_size``, ``heads``, ``kv_heads``, ``head_dim``, ``max_positions``,
    ``experts``, ``experts_per_token``, ``rope_theta``); ``vocab_size``
    widens the config's vocabulary past the tokenizer's (engines then run with token ids in and out);
    ``dtype`` is the saved weights' (default float32, bfloat16 for gpt-oss); ``weights=False`` writes
    the config and tokenizer only, for an engine's ``load_format="dummy"``.
    """
    import torch

    if family not in FAMILIES:
        raise ValueError(f"unknown tiny-model family {family!r}; expected one of {FAMILIES}")
    os.makedirs(path, exist_ok=True)
    vocab = max(build_tokenizer(path), vocab_size or 0)
    saved_dtype = torch.float32
    if family == "gemma3":
        cfg, std = _gemma3_config(vocab, layers=num_layers or 4, window=window or 8, shape=shape), 0.15
    elif family == "gemma3-draft":
        cfg, std = _gemma3_config(vocab, layers=num_layers or 1, window=window or 8, shape=shape), 0.15
        cfg.layer_types = ["sliding_attention"] * cfg.num_hidden_layers
    elif family == "gemma4":
        cfg, std = _gemma4_config(vocab, window=window or 16, shape=shape), 0.15
    else:
        cfg, std = _gpt_oss_config(vocab, layers=num_layers or 2, window=window or 8, shape=shape), 0.15
        saved_dtype = torch.bfloat16
    if dtype is not None:
        saved_dtype = getattr(torch, dtype)
    info = {
        "family": family,
        "seed": seed,
        "vocab_size": vocab,
        "sliding_window": cfg.sliding_window,
        "layer_types": list(cfg.layer_types),
        "dtype": str(saved_dtype).removeprefix("torch."),
        "architecture": cfg.architectures[0],
        "weights": "random" if weights else "none (load_format dummy)",
    }
    if not weights:
        cfg.dtype = saved_dtype
        cfg.save_pretrained(path)
        _finish_model_dir(path, family, shape, info)
        return path

    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    # the spread shrinks as 1/sqrt(width) past the tiny models' 64 (at real sizes a fixed spread makes
    # the random network chaotic: bf16 rounding alone then decides the greedy tokens)
    std *= (64 / cfg.hidden_size) ** 0.5
    # at real widths the q/k norms also set a moderate attention temperature (see QK_SCORE_STD)
    qk_family = ("gemma4" if family == "gemma4" else "gemma3") if shape and family != "gpt-oss" else None
    _init_weights(model, seed, std, 2.0 if family == "gpt-oss" else 1.0, embed_std(family, cfg.hidden_size), qk_family)
    model = model.to(saved_dtype)
    model.generation_config.eos_token_id = None  # the tier decodes a fixed number of tokens
    model.save_pretrained(path, safe_serialization=True)
    _finish_model_dir(path, family, shape, info)
    return path


def _finish_model_dir(path: str, family: str, shape: dict | None, info: dict) -> None:
    """Gemma 4's config.json in SGLang's form, and the directory's ``triton_swa_tiny.json``."""
    if family == "gemma4":
        cfg_path = os.path.join(path, "config.json")
        with open(cfg_path) as f:
            saved = json.load(f)
        with open(cfg_path, "w") as f:
            json.dump(_gemma4_sglang_json(saved, shape), f, indent=2, sort_keys=True)
    with open(os.path.join(path, "triton_swa_tiny.json"), "w") as f:
        json.dump(info, f, indent=2)
