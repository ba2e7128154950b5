"""Rotary position embedding of a ModelConfig: the inverse frequency of each rotated pair, and the
factor some scalings apply to the rotated q and k (yarn's attention factor).

Default and Llama 3 frequencies are computed here (the presets need no other package). Every other
scaling transformers knows is computed by transformers' own functions, from the config's rope
parameters, so a checkpoint's rotation is exactly the one its model class applies. Scalings that change
with the sequence length (dynamic, longrope) hold still below their original context length, so they
are refused past it (schedule/config.py).
"""
from __future__ import annotations

import math

import torch

from megavm.core.errors import ConfigError
from megavm.schedule.models import ModelConfig

STATIC = ("default", "llama3", "linear", "yarn", "proportional")
BELOW_ORIGINAL = ("dynamic", "longrope")           # static below original_max_position_embeddings


def rope_type(cfg: ModelConfig) -> str:
    s = cfg.rope_scaling or {}
    return s.get("rope_type", s.get("type", "default"))


def original_context(cfg: ModelConfig) -> int | None:
    """The context length below which a length-dependent scaling holds still."""
    s = cfg.rope_scaling or {}
    return s.get("original_max_position_embeddings") or s.get("max_position_embeddings")


def _llama3(inv: torch.Tensor, s: dict) -> torch.Tensor:
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / lo, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
    return torch.where(medium, smoothed, scaled)


def _transformers(cfg: ModelConfig) -> tuple[torch.Tensor, float]:
    try:
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError:
        raise ConfigError(f"rope_type {rope_type(cfg)!r} is computed by transformers: pip install "
                          "'megavm[checkpoint]'") from None
    kind = rope_type(cfg)
    if kind not in ROPE_INIT_FUNCTIONS:
        raise ConfigError(f"rope_type {kind!r} is not one transformers knows")
    params = {**cfg.rope_scaling, "rope_type": kind, "rope_theta": cfg.rope_theta}
    if kind == "dynamic":           # its original context is the config's max_position_embeddings
        params.pop("original_max_position_embeddings", None)
    hf = LlamaConfig(hidden_size=cfg.dim, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
                     head_dim=cfg.head_dim, max_position_embeddings=original_context(cfg) or 4096,
                     rope_parameters=params)
    seq = original_context(cfg) if kind in BELOW_ORIGINAL else None
    inv, factor = ROPE_INIT_FUNCTIONS[kind](hf, torch.device("cpu"), **({"seq_len": seq} if seq else {}))
    return inv.float(), float(factor)


def rope(cfg: ModelConfig) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim / 2] f32, attention factor applied to cos and sin)."""
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim))
    kind = rope_type(cfg)
    if kind == "default":
        return inv, 1.0
    if kind == "llama3":
        return _llama3(inv, cfg.rope_scaling), 1.0
    if kind not in STATIC + BELOW_ORIGINAL:
        raise ConfigError(f"rope_type {kind!r} is not supported")
    return _transformers(cfg)


def rope_freqs(cfg: ModelConfig) -> torch.Tensor:
    return rope(cfg)[0]
