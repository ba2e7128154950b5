"""A Hugging Face config.json -> ModelConfig, strictly. Every field megavm reads is checked for its
type (no bool for an int, no float for an int, no string for a number) and its range; a field whose
value would change the model in a way megavm does not implement is refused. Each refusal is one
ConfigError naming the field and its value."""
from __future__ import annotations

import math

from megavm.core.errors import ConfigError
from megavm.core.limits import MAX_EXPERTS, MAX_GROUP, MAX_HEAD_DIM, MAX_TOPK
from megavm.schedule.config import QUANTIZED
from megavm.schedule.models import ModelConfig
from megavm.schedule.rope import BELOW_ORIGINAL, STATIC, rope

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "mixtral", "qwen3_moe")
MAX_DIM = (1 << 31) - 1
_MISSING = object()


class Fields:
    """Typed reads of a config dict; every problem names the field."""

    def __init__(self, hf: dict, where: str):
        self.hf, self.where = hf, where

    def _raw(self, name: str, default):
        v = self.hf.get(name, _MISSING)
        if v is _MISSING or v is None:
            if default is _MISSING:
                raise ConfigError(f"{self.where}: field {name!r} is missing")
            return default
        return v

    def bad(self, name: str, value, why: str) -> ConfigError:
        return ConfigError(f"{self.where}: {name}={value!r} {why}")

    def integer(self, name: str, lo: int = 1, hi: int = MAX_DIM, default=_MISSING):
        v = self._raw(name, default)
        if v is default and default is not _MISSING:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.bad(name, v, "must be an integer")
        if not lo <= v <= hi:
            raise self.bad(name, v, f"must be in [{lo}, {hi}]")
        return v

    def number(self, name: str, default=_MISSING, positive: bool = True):
        v = self._raw(name, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.bad(name, v, "must be a number")
        if not math.isfinite(v) or (positive and v <= 0):
            raise self.bad(name, v, "must be a finite number > 0" if positive else "must be finite")
        return float(v)

    def flag(self, name: str, default=_MISSING):
        v = self._raw(name, default)
        if not isinstance(v, bool):
            raise self.bad(name, v, "must be true or false")
        return v

    def text(self, name: str, default=_MISSING):
        v = self._raw(name, default)
        if not isinstance(v, str):
            raise self.bad(name, v, "must be a string")
        return v

    def obj(self, name: str):
        v = self._raw(name, {})
        if not isinstance(v, dict):
            raise self.bad(name, v, "must be an object")
        return v


def _rope_scaling(f: Fields, cfg_fields: dict) -> dict | None:
    """rope_scaling (or transformers 5's rope_parameters): None for the default rotation, else the
    parameters, checked by computing the frequencies (schedule/rope.py)."""
    scaling = f.obj("rope_scaling") or f.obj("rope_parameters")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if kind not in STATIC + BELOW_ORIGINAL:
        raise f.bad("rope_scaling.rope_type", kind, f"is not supported ({', '.join(STATIC + BELOW_ORIGINAL)})")
    params = {k: v for k, v in scaling.items() if k != "type"} | {"rope_type": kind}
    if kind in BELOW_ORIGINAL and params.get("original_max_position_embeddings") is None:
        params["original_max_position_embeddings"] = f.integer(
            "original_max_position_embeddings", default=f.integer("max_position_embeddings"))
    if kind == "longrope" and params.get("factor") is None:     # its attention factor follows the context ratio
        params["factor"] = f.integer("max_position_embeddings") / params["original_max_position_embeddings"]
    try:
        rope(ModelConfig(**cfg_fields, rope_scaling=params))
    except ConfigError as e:
        raise f.bad("rope_scaling", scaling, str(e)) from None
    except Exception as e:          # parameters missing or of the wrong kind for their rope_type
        raise f.bad("rope_scaling", scaling, f"cannot be computed: {type(e).__name__}: {e}") from None
    return params


def _refuse(f: Fields, flag: str, why: str) -> None:
    if f.flag(flag, False):
        raise f.bad(flag, True, f"is not supported: {why}")


def _family(f: Fields, model_type: str) -> dict:
    """The family fields of a ModelConfig, refusing what the family's model class does that megavm does not."""
    _refuse(f, "mlp_bias", "megavm's MLPs have no biases")
    if model_type in ("qwen2", "qwen3"):
        _refuse(f, "use_sliding_window", "sliding windows in some layers only")
    if model_type == "qwen2":
        return {"family": "qwen2", "qkv_bias": True}
    _refuse(f, "attention_bias", "the o projection has no bias in megavm")
    if model_type == "qwen3":
        return {"family": "qwen3", "qk_norm": True}
    if model_type == "qwen3_moe":
        _silu(f)
        return {"family": "qwen3_moe", "qk_norm": True, **_experts(f, "num_experts", "moe_intermediate_size",
                                                                  f.flag("norm_topk_prob", False))}
    if model_type == "gemma":
        act = f.text("hidden_act", "gelu_pytorch_tanh")
        if act not in ("gelu_pytorch_tanh", "gelu"):     # transformers reads a legacy "gelu" as the tanh form
            raise f.bad("hidden_act", act, "is not supported: Gemma's MLP is GELU (tanh)")
        return {"family": "gemma", "mlp_act": "gelu_tanh", "norm_offset": 1.0,
                "embed_scale": float(f.integer("hidden_size")) ** 0.5}
    act = f.text("hidden_act", "silu")
    if act != "silu":
        raise f.bad("hidden_act", act, "is not supported: megavm lowers SwiGLU (silu) MLPs for this family")
    window = f.integer("sliding_window", default=None) if model_type in ("mistral", "mixtral") else None
    moe = _experts(f, "num_local_experts", "intermediate_size", True) if model_type == "mixtral" else {}
    return {"family": model_type or "llama", "sliding_window": window, **moe}


def _silu(f: Fields) -> None:
    act = f.text("hidden_act", "silu")
    if act != "silu":
        raise f.bad("hidden_act", act, "is not supported: megavm lowers SwiGLU (silu) experts")


def _experts(f: Fields, count: str, width: str, renorm: bool) -> dict:
    """The mixture-of-experts fields: the expert count (Qwen3-MoE: num_experts, which transformers 5
    may also write as num_local_experts), top_k, the expert width, and the layers left dense."""
    if count == "num_experts" and f.hf.get("num_experts") is None:
        count = "num_local_experts"                  # the name transformers 5 saves Qwen3-MoE's count under
    n = f.integer(count, hi=MAX_EXPERTS)
    if count == "num_experts" and f.hf.get("num_local_experts") not in (None, n):
        raise f.bad("num_local_experts", f.hf["num_local_experts"], f"disagrees with num_experts={n}")
    k = f.integer("num_experts_per_tok", hi=min(n, MAX_TOPK))
    layers = f.integer("num_hidden_layers")
    dense: set[int] = set()
    if width == "moe_intermediate_size":  # Qwen3-MoE: mlp_only_layers, and every decoder_sparse_step-th layer
        only = f.hf.get("mlp_only_layers") or []
        if not isinstance(only, list) or any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < layers
                                             for x in only):
            raise f.bad("mlp_only_layers", only, f"must be a list of layer indices in [0, {layers})")
        step = f.integer("decoder_sparse_step", default=1)
        dense = set(only) | {l for l in range(layers) if (l + 1) % step}
    return {"n_experts": n, "top_k": k, "expert_ffn": f.integer(width), "router_renorm": renorm,
            "dense_layers": tuple(sorted(dense))}


def weight_format(hf: dict) -> str:
    """ScheduleConfig.weights for a config.json: "fp8" for megavm's per-row fp8 folders (e4m3 `weight`,
    f32 `weight_scale` [out, 1]), "fp8-block" for its 128 x 128 block fp8 folders (the Hugging Face
    "fp8" layout: e4m3 `weight`, f32 `weight_scale_inv` [ceil(out/128), ceil(in/128)]), "nvfp4" for its NVFP4 folders (ModelOpt's layout: u8 `weight`
    [out, in/2], e4m3 `weight_scale` [out, in/16], f32 `weight_scale_2` []), "mxfp4" for its MXFP4
    folders (u8 `weight_blocks` [out, in/32, 16], u8 `weight_scales` [out, in/32]), "int4" for its
    AWQ folders (`qweight`, `qzeros`, `scales`), all written by `megavm quantize`; else ""."""
    q = hf.get("quantization_config")
    f = q.get("megavm_format") if isinstance(q, dict) else None
    return f if f in QUANTIZED else ""


def _refuse_what_megavm_does_not_implement(f: Fields) -> None:
    q = f.hf.get("quantization_config")
    if q is not None and not weight_format(f.hf):
        method = q.get("megavm_format") or q.get("quant_method") if isinstance(q, dict) else q
        raise f.bad("quantization_config", method, "is not run yet: megavm reads f32, bf16 and f16 weights, fp8 "
                    "with a scale per output row or per 128 x 128 block, nvfp4, mxfp4 and int4 (megavm quantize --format "
                    "fp8|fp8-block|nvfp4|mxfp4|int4)")
    if weight_format(f.hf) == "nvfp4" and q.get("group_size", 16) != 16:
        raise f.bad("quantization_config.group_size", q["group_size"], "is not supported: nvfp4 scales blocks of 16")
    if weight_format(f.hf) == "fp8-block" and q.get("weight_block_size", [128, 128]) != [128, 128]:
        raise f.bad("quantization_config.weight_block_size", q["weight_block_size"],
                    "is not supported: megavm's fp8-block scales blocks of 128 x 128")
    if weight_format(f.hf) == "int4":
        for k, want in (("bits", 4), ("group_size", 128), ("zero_point", True), ("version", "gemm")):
            if q.get(k, want) != want:
                raise f.bad(f"quantization_config.{k}", q[k], f"is not supported: megavm's int4 is AWQ's {k} {want}")
    if f.number("partial_rotary_factor", 1.0) != 1.0:
        raise f.bad("partial_rotary_factor", f.hf["partial_rotary_factor"], "is not supported (RoPE on every pair)")
    types = f.hf.get("layer_types")
    if types is not None and (not isinstance(types, list) or any(t != "full_attention" for t in types)):
        raise f.bad("layer_types", types, "is not supported (full attention in every layer)")


def parse(hf, where: str = "config.json") -> ModelConfig:
    """The ModelConfig of a config.json of a family megavm lowers, or ConfigError naming the field."""
    if not isinstance(hf, dict):
        raise ConfigError(f"{where}: not a JSON object")
    f = Fields(hf, where)
    model_type = hf.get("model_type")
    archs = hf.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else "?"
    if model_type not in MODEL_TYPES and not (model_type is None and "Llama" in arch):
        raise f.bad("model_type", model_type, f"({arch}) is not supported; megavm lowers {', '.join(MODEL_TYPES)}")
    _refuse_what_megavm_does_not_implement(f)
    family = _family(f, model_type)
    dim, heads = f.integer("hidden_size"), f.integer("num_attention_heads")
    kv = f.integer("num_key_value_heads", default=heads)
    if heads % kv:
        raise f.bad("num_attention_heads", heads, f"is not a multiple of num_key_value_heads={kv}")
    if heads // kv > MAX_GROUP:
        raise f.bad("num_attention_heads", heads, f"over num_key_value_heads={kv} exceeds the group capacity {MAX_GROUP}")
    if "head_dim" in hf and hf["head_dim"] is not None:
        head_dim = f.integer("head_dim")
    elif dim % heads:
        raise f.bad("hidden_size", dim, f"is not a multiple of num_attention_heads={heads}, and head_dim is not given")
    else:
        head_dim = dim // heads
    if head_dim % 8 or head_dim > MAX_HEAD_DIM:
        raise f.bad("head_dim", head_dim, f"is not supported: a multiple of 8 up to {MAX_HEAD_DIM}")
    rope_params = f.obj("rope_parameters")
    theta = f.number("rope_theta", Fields(rope_params, f"{where}: rope_parameters").number("rope_theta", 10000.0))
    fields = dict(dim=dim, n_layers=f.integer("num_hidden_layers"), n_heads=heads, n_kv_heads=kv, head_dim=head_dim,
                  ffn_dim=f.integer("intermediate_size"), vocab=f.integer("vocab_size"), rope_theta=theta,
                  norm_eps=f.number("rms_norm_eps", 1e-6),
                  tied_embeddings=f.flag("tie_word_embeddings", family["family"] == "gemma"), **family)
    return ModelConfig(**fields, rope_scaling=_rope_scaling(f, fields))
