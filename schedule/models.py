"""Model shapes as data, seeded random weights, and the mapping from Hugging Face weight names to the
program's buffers. (schedule/hf_config.py reads a Hugging Face config.json into a ModelConfig.)"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from megavm.core.errors import ConfigError


@dataclass(frozen=True)
class ModelConfig:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    tied_embeddings: bool = False
    rope_scaling: dict | None = field(default=None, hash=False)
    sliding_window: int | None = None    # attention sees the last this many positions (Mistral); None: all

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim} must be even for RoPE")

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    def to_dict(self) -> dict:
        return asdict(self)


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}

PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96, vocab=256),
    "small": ModelConfig(dim=1024, n_layers=8, n_heads=16, n_kv_heads=4, head_dim=64, ffn_dim=2816, vocab=32000),
    "llama-1b": ModelConfig(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, ffn_dim=8192,
                            vocab=128256, tied_embeddings=True, rope_scaling=LLAMA3_SCALING),
    "llama-7b-32k": ModelConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, ffn_dim=14336,
                                vocab=32000, rope_theta=1000000.0),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; presets are {sorted(PRESETS)}") from None


def rope_freqs(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequency of each rotated pair, [head_dim/2] f32, Llama-3 scaling applied."""
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim))
    s = cfg.rope_scaling
    if not s:
        return inv
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / lo, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
    return torch.where(medium, smoothed, scaled)


def hf_names(cfg: ModelConfig) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        names += [p + n + ".weight" for n in (
            "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
            "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
    if not cfg.tied_embeddings:
        names.append("lm_head.weight")
    return names


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, hd = cfg.dim, cfg.head_dim
    by_suffix = {"input_layernorm": (d,), "post_attention_layernorm": (d,),
                 "self_attn.q_proj": (cfg.n_heads * hd, d), "self_attn.k_proj": (cfg.n_kv_heads * hd, d),
                 "self_attn.v_proj": (cfg.n_kv_heads * hd, d), "self_attn.o_proj": (d, cfg.n_heads * hd),
                 "mlp.gate_proj": (cfg.ffn_dim, d), "mlp.up_proj": (cfg.ffn_dim, d), "mlp.down_proj": (d, cfg.ffn_dim)}
    out = {}
    for n in hf_names(cfg):
        if n == "model.embed_tokens.weight" or n == "lm_head.weight":
            out[n] = (cfg.vocab, d)
        elif n == "model.norm.weight":
            out[n] = (d,)
        else:
            out[n] = by_suffix[n.split(".", 3)[3].rsplit(".", 1)[0]]
    return out


def random_hf_weights(cfg: ModelConfig, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                      device="cpu") -> dict[str, torch.Tensor]:
    """Seeded random weights under Hugging Face names; norms near 1, matrices scaled by 1/sqrt(fan_in)."""
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)      # drawn where they live: a 7B model on CPU is slow
    out = {}
    for name, shape in hf_shapes(cfg).items():
        if len(shape) == 1:
            t = 1.0 + 0.1 * torch.randn(shape, generator=g, device=dev)
        else:
            t = torch.randn(shape, generator=g, device=dev) / math.sqrt(shape[1])
        out[name] = t.to(dtype)
    return out


def interleave_rope_rows(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rotate-half row order -> interleaved pairs: new row 2i is old row i, 2i+1 is old i+hd/2 (per head)."""
    n, k = w.shape
    half = head_dim // 2
    return w.view(n // head_dim, 2, half, k).transpose(1, 2).reshape(n, k)


def program_weights(cfg: ModelConfig, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hugging Face weights -> the program's weight buffers (by buffer name)."""
    shapes = hf_shapes(cfg)
    for name, shape in shapes.items():
        if name not in hf:
            raise ConfigError(f"weights lack {name!r}, which the config implies")
        if tuple(hf[name].shape) != shape:
            raise ConfigError(f"weight {name!r} has shape {tuple(hf[name].shape)}, expected {shape}")
    hd = cfg.head_dim
    out = {"tok_emb": hf["model.embed_tokens.weight"], "norm": hf["model.norm.weight"],
           "rope_freqs": rope_freqs(cfg).to(hf["model.norm.weight"].device)}
    out["lm_head"] = hf["model.embed_tokens.weight" if cfg.tied_embeddings else "lm_head.weight"]
    for i in range(cfg.n_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        out[q + "attn_norm"] = hf[p + "input_layernorm.weight"]
        out[q + "ffn_norm"] = hf[p + "post_attention_layernorm.weight"]
        out[q + "wq"] = interleave_rope_rows(hf[p + "self_attn.q_proj.weight"], hd).contiguous()
        out[q + "wk"] = interleave_rope_rows(hf[p + "self_attn.k_proj.weight"], hd).contiguous()
        out[q + "wv"] = hf[p + "self_attn.v_proj.weight"]
        out[q + "wo"] = hf[p + "self_attn.o_proj.weight"]
        out[q + "w_gate"] = hf[p + "mlp.gate_proj.weight"]
        out[q + "w_up"] = hf[p + "mlp.up_proj.weight"]
        out[q + "w_down"] = hf[p + "mlp.down_proj.weight"]
    return out
