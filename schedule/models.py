"""Model shapes as data: ModelConfig, the decoder families megavm lowers, and the named presets.
(schedule/hf_config.py reads a Hugging Face config.json into a ModelConfig; schedule/weights.py maps
Hugging Face weights onto the program's buffers.)"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from megavm.core.errors import ConfigError
from megavm.instructions.routing import SCORE_FNS as ROUTER_SCORES     # the router's score functions

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "mixtral", "qwen3_moe")
ACTIVATIONS = ("silu", "gelu_tanh")          # the MLP gate's activation


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer of the Llama lineage. The family fields say where a family departs
    from Llama; each is a fact of the model, not a name to branch on."""
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
    rope_scaling: dict | None = field(default=None, hash=False)   # Hugging Face rope parameters, if not default
    sliding_window: int | None = None    # attention sees the last this many positions (Mistral); None: all
    family: str = "llama"
    qkv_bias: bool = False               # the q/k/v projections add a bias (Qwen2)
    qk_norm: bool = False                # per-head RMSNorm of q and k before RoPE (Qwen3)
    mlp_act: str = "silu"                # the gate's activation: silu (SwiGLU) or gelu_tanh (GeGLU, Gemma)
    norm_offset: float = 0.0             # RMSNorm scales by offset + weight (Gemma: 1)
    embed_scale: float = 1.0             # the embedding row is scaled by this (Gemma: sqrt(dim))
    # mixture of experts (Mixtral, Qwen3-MoE): n_experts > 0 replaces the MLP of every layer not in
    # dense_layers by top_k of n_experts SwiGLU experts of width expert_ffn, chosen per token by a
    # router (instructions/routing.py: scores, stable top-k, renormalisation, scaling)
    n_experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    router_score: str = "softmax"
    router_renorm: bool = True           # the chosen experts' weights divided by their sum
    router_scale: float = 1.0            # the routed scaling factor, after renormalisation
    dense_layers: tuple[int, ...] = ()   # layers that keep a dense MLP of ffn_dim (Qwen3-MoE mlp_only_layers)
    # DeepSeek-V4's MoE block: a ranking bias on the scores, renormalisation epsilon, the first
    # hash_layers MoE layers routed by a [vocab, top_k] table of the token, a shared expert of width
    # shared_ffn added to the routed sum, and the gate/up clamp of every expert (swiglu_limit; 0: none)
    router_bias: bool = False
    router_eps: float = 0.0
    hash_layers: int = 0
    shared_ffn: int = 0
    swiglu_limit: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "dense_layers", tuple(self.dense_layers))    # JSON gives a list
        if self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.family not in FAMILIES:
            raise ConfigError(f"family={self.family!r} is not one of {FAMILIES}")
        if self.mlp_act not in ACTIVATIONS:
            raise ConfigError(f"mlp_act={self.mlp_act!r} is not one of {ACTIVATIONS}")
        if self.n_experts:
            if not 1 <= self.top_k <= self.n_experts:
                raise ConfigError(f"top_k={self.top_k} must be in [1, n_experts={self.n_experts}]")
            if self.expert_ffn < 1:
                raise ConfigError(f"expert_ffn={self.expert_ffn} must be >= 1 with n_experts={self.n_experts}")
            if self.router_score not in ROUTER_SCORES:
                raise ConfigError(f"router_score={self.router_score!r} is not one of {ROUTER_SCORES}")
            if self.hash_layers < 0 or self.shared_ffn < 0 or self.swiglu_limit < 0 or self.router_eps < 0:
                raise ConfigError(f"hash_layers={self.hash_layers}, shared_ffn={self.shared_ffn}, swiglu_limit="
                                  f"{self.swiglu_limit} and router_eps={self.router_eps} must be >= 0")
            bad = [l for l in self.dense_layers if not 0 <= l < self.n_layers]
            if bad:
                raise ConfigError(f"dense_layers {bad} outside the {self.n_layers} layers")

    def is_moe(self, layer: int) -> bool:
        """Layer `layer` routes its MLP through experts."""
        return self.n_experts > 0 and layer not in self.dense_layers

    def is_hash(self, layer: int) -> bool:
        """Layer `layer` is one of the first hash_layers MoE layers: its experts come from a token table."""
        moe = [l for l in range(self.n_layers) if self.is_moe(l)]
        return layer in moe[:self.hash_layers]

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    def to_dict(self) -> dict:
        """The fields as JSON holds them (dense_layers a list), so a config survives a round trip."""
        return dict(asdict(self), dense_layers=list(self.dense_layers))


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}

PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96, vocab=256),
    "small": ModelConfig(dim=1024, n_layers=8, n_heads=16, n_kv_heads=4, head_dim=64, ffn_dim=2816, vocab=32000),
    "llama-1b": ModelConfig(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, ffn_dim=8192,
                            vocab=128256, tied_embeddings=True, rope_scaling=LLAMA3_SCALING),
    "llama-7b-32k": ModelConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, ffn_dim=14336,
                                vocab=32000, rope_theta=1000000.0),
    # the other families at a real size (the shapes of the published checkpoints)
    "qwen2.5-1.5b": ModelConfig(dim=1536, n_layers=28, n_heads=12, n_kv_heads=2, head_dim=128, ffn_dim=8960,
                                vocab=151936, rope_theta=1000000.0, norm_eps=1e-6, tied_embeddings=True,
                                family="qwen2", qkv_bias=True),
    "qwen3-1.7b": ModelConfig(dim=2048, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, ffn_dim=6144,
                              vocab=151936, rope_theta=1000000.0, norm_eps=1e-6, tied_embeddings=True,
                              family="qwen3", qk_norm=True),
    "mistral-7b": ModelConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, ffn_dim=14336,
                              vocab=32000, rope_theta=10000.0, family="mistral", sliding_window=4096),
    # mixture of experts: a small one for CPU tests, and Qwen3-30B-A3B's shape (about 61 GB in bf16)
    "moe-tiny": ModelConfig(dim=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96, vocab=256,
                            family="qwen3_moe", qk_norm=True, n_experts=8, top_k=2, expert_ffn=32, dense_layers=(1,)),
    "qwen3-30b-a3b": ModelConfig(dim=2048, n_layers=48, n_heads=32, n_kv_heads=4, head_dim=128, ffn_dim=6144,
                                 vocab=151936, rope_theta=1000000.0, norm_eps=1e-6, family="qwen3_moe", qk_norm=True,
                                 n_experts=128, top_k=8, expert_ffn=768),
    "gemma-2b": ModelConfig(dim=2048, n_layers=18, n_heads=8, n_kv_heads=1, head_dim=256, ffn_dim=16384,
                            vocab=256000, rope_theta=10000.0, norm_eps=1e-6, tied_embeddings=True, family="gemma",
                            mlp_act="gelu_tanh", norm_offset=1.0, embed_scale=2048 ** 0.5),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; presets are {sorted(PRESETS)}") from None
