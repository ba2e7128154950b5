"""A model's weights: the tensors its config implies under their Hugging Face names, seeded random
ones for the presets, and the mapping onto the program's weight buffers (query and key rows in
interleaved RoPE pairs, RMSNorm weights with the family's offset folded in)."""
from __future__ import annotations

import dataclasses
import math

import torch

from megavm.core.errors import ConfigError, UserError
from megavm.core.types import U4_GROUP, DType, block_scale_name, scale_name
from megavm.schedule.models import ModelConfig
from megavm.schedule.rope import rope_freqs


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the config implies, Hugging Face name -> shape."""
    d, hd, f = cfg.dim, cfg.head_dim, cfg.ffn_dim
    q, kv = cfg.n_heads * hd, cfg.n_kv_heads * hd
    out = {"model.embed_tokens.weight": (cfg.vocab, d), "model.norm.weight": (d,)}
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        layer = {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,),
                 "self_attn.q_proj.weight": (q, d), "self_attn.k_proj.weight": (kv, d),
                 "self_attn.v_proj.weight": (kv, d), "self_attn.o_proj.weight": (d, q)}
        if cfg.is_moe(i):
            router, experts = expert_names(cfg, i)
            fe = cfg.expert_ffn
            layer[router] = (cfg.n_experts, d)
            for g, u, dn in experts:
                layer |= {g: (fe, d), u: (fe, d), dn: (d, fe)}
        else:
            layer |= {"mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d), "mlp.down_proj.weight": (d, f)}
        if cfg.qkv_bias:
            layer |= {"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)}
        if cfg.qk_norm:
            layer |= {"self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,)}
        out |= {p + n: s for n, s in layer.items()}
    if not cfg.tied_embeddings:
        out["lm_head.weight"] = (cfg.vocab, d)
    return out


def expert_names(cfg: ModelConfig, layer: int) -> tuple[str, list[tuple[str, str, str]]]:
    """An MoE layer's router and each expert's (gate, up, down) under Hugging Face names, relative to
    model.layers.<layer>. (Mixtral: block_sparse_moe.gate, experts.e.w1 / w3 / w2; Qwen3-MoE: mlp.gate,
    experts.e.gate_proj / up_proj / down_proj.)"""
    if cfg.family == "mixtral":
        q, parts = "block_sparse_moe.", ("w1.weight", "w3.weight", "w2.weight")
    else:
        q, parts = "mlp.", ("gate_proj.weight", "up_proj.weight", "down_proj.weight")
    return q + "gate.weight", [tuple(f"{q}experts.{e}.{w}" for w in parts) for e in range(cfg.n_experts)]


def expert_stack(parts: list[torch.Tensor]) -> torch.Tensor:
    """The experts' matrices as one [experts, rows, K] stack: the stack they are views of, when they
    are its consecutive matrices (no copy), else a new one."""
    base = parts[0]._base
    if (base is not None and base.dim() == 3 and base.shape[0] == len(parts) and base.is_contiguous()
            and all(p.data_ptr() == base[e].data_ptr() and p.shape == base.shape[1:] for e, p in enumerate(parts))):
        return base
    return torch.stack(parts)


def random_hf_weights(cfg: ModelConfig, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                      device="cpu") -> dict[str, torch.Tensor]:
    """Seeded random weights under Hugging Face names: matrices scaled by 1/sqrt(fan_in), biases small,
    norms near 1 in effect (near 0 where the family adds the 1 itself)."""
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)      # drawn where they live: a 7B model on CPU is slow
    out = {}
    for name, shape in hf_shapes(cfg).items():
        t = torch.randn(shape, generator=g, device=dev)
        if len(shape) == 2:
            t = t / math.sqrt(shape[1])
        elif name.endswith(".bias"):
            t = 0.1 * t
        else:
            t = (1.0 - cfg.norm_offset) + 0.1 * t
        out[name] = t.to(dtype)
    return out


def interleave_rope_rows(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rotate-half order -> interleaved pairs, per head: new row 2i is old row i, 2i+1 is old i + hd/2.
    w: [n, K] rows, or [n] (a bias, or a per-head norm weight)."""
    n, half = w.shape[0], head_dim // 2
    return w.view(n // head_dim, 2, half, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _gamma(cfg: ModelConfig, w: torch.Tensor) -> torch.Tensor:
    """An RMSNorm weight as the program reads it: offset + w, in f32 where the family has an offset."""
    return (w.float() + cfg.norm_offset) if cfg.norm_offset else w


def program_weights(cfg: ModelConfig, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hugging Face weights -> the program's weight buffers (by buffer name)."""
    for name, shape in hf_shapes(cfg).items():
        if name not in hf:
            raise ConfigError(f"weights lack {name!r}, which the config implies")
        if tuple(hf[name].shape) != shape:
            raise ConfigError(f"weight {name!r} has shape {tuple(hf[name].shape)}, expected {shape}")
    hd = cfg.head_dim
    out = {"tok_emb": hf["model.embed_tokens.weight"], "norm": _gamma(cfg, hf["model.norm.weight"]),
           "rope_freqs": rope_freqs(cfg).to(hf["model.norm.weight"].device)}
    out["lm_head"] = hf["model.embed_tokens.weight" if cfg.tied_embeddings else "lm_head.weight"]
    for i in range(cfg.n_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        out[q + "attn_norm"] = _gamma(cfg, hf[p + "input_layernorm.weight"])
        out[q + "ffn_norm"] = _gamma(cfg, hf[p + "post_attention_layernorm.weight"])
        for x in "qk":
            out[q + "w" + x] = interleave_rope_rows(hf[p + f"self_attn.{x}_proj.weight"], hd).contiguous()
            if cfg.qkv_bias:
                out[q + "b" + x] = interleave_rope_rows(hf[p + f"self_attn.{x}_proj.bias"], hd).contiguous()
            if cfg.qk_norm:
                out[q + x + "_norm"] = interleave_rope_rows(hf[p + f"self_attn.{x}_norm.weight"], hd).contiguous()
        out[q + "wv"] = hf[p + "self_attn.v_proj.weight"]
        if cfg.qkv_bias:
            out[q + "bv"] = hf[p + "self_attn.v_proj.bias"]
        out[q + "wo"] = hf[p + "self_attn.o_proj.weight"]
        if cfg.is_moe(i):
            router, experts = expert_names(cfg, i)
            out[q + "router"] = hf[p + router]
            for j, n in enumerate(("experts_gate", "experts_up", "experts_down")):
                out[q + n] = expert_stack([hf[p + e[j]] for e in experts])
            continue
        out[q + "w_gate"] = hf[p + "mlp.gate_proj.weight"]
        out[q + "w_up"] = hf[p + "mlp.up_proj.weight"]
        out[q + "w_down"] = hf[p + "mlp.down_proj.weight"]
    return out


def projection(name: str) -> bool:
    """A Hugging Face tensor a GEMV streams and ScheduleConfig.weights stores: the attention and MLP
    projections (experts' too) and the LM head, not the embedding, the norms, the biases or a router."""
    return name.endswith(".weight") and (name == "lm_head.weight" or "_proj." in name or
                                         any(f".{p}.weight" in name for p in ("w1", "w2", "w3")))


def quantized_model(cfg: ModelConfig, hf: dict[str, torch.Tensor], fmt: str
                    ) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """The model whose projections and LM head are what their form in fmt ("fp8": e4m3 codes times each
    row's scale; "nvfp4") stands for, in f32: what a program with ScheduleConfig(weights=fmt)
    computes. A tied head becomes a tensor of its own (the embedding stays exact), so the config comes
    back untied. nvfp4: each matrix of an expert stack is one tensor (its own global scale)."""
    from megavm.schedule import quant

    out = dict(hf)
    if cfg.tied_embeddings:
        out["lm_head.weight"] = hf["model.embed_tokens.weight"]
        cfg = dataclasses.replace(cfg, tied_embeddings=False)
    for n, w in out.items():
        if projection(n):
            out[n] = quant.dequantize(quant.quantize(w, fmt), fmt)
    return cfg, out


def mx_weight(codes: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    """The f32 weight [..., K] stored as mxfp4 stands for: each block of 32 e2m1 codes times 2^(e - 127)
    (codes: bytes [..., K/2], element 2i in the low nibble; exponents: biased e8m0 bytes [..., K/32])."""
    from megavm.schedule import quant

    k = 2 * codes.shape[-1]
    w = quant.dequantize({"weight_blocks": codes.reshape(-1, k // 32, 16),
                          "weight_scales": exponents.reshape(-1, k // 32)}, "mxfp4")
    return w.reshape(*codes.shape[:-1], k)


def int4_tables(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weights [..., K] -> U4 codes (bytes [..., K/2], element 2i in the low nibble), their f16 group
    table [..., K/128, 2] (scale, zero point) and a mask [..., K/128] of the groups that stand for w
    exactly. Each group of 128 takes the first n in 15, 14, .. 1 whose scale f16(span / n) and zero
    point clamp(-round(min / scale), 0, 15) give codes clamp(round(w / scale) + zero, 0, 15) with
    (code - zero) x scale == w (span: max - min, or |w| for a constant group; all zero: codes 0, zero
    point 0 and AutoAWQ's scale for it, f16(1e-5 / 15)). For an int4 (AWQ) matrix's dequantized
    values that is the file's own scale, zero point and codes where the group's codes reach n apart
    (AutoAWQ's formula reaches 15); a group no n fits gets n = 15 (AutoAWQ's quantization of it) and a
    False in the mask."""
    from megavm.schedule import quant

    g = w.float().reshape(*w.shape[:-1], w.shape[-1] // U4_GROUP, U4_GROUP)
    hi, lo = g.amax(-1), g.amin(-1)
    span = torch.where(hi > lo, hi - lo, hi.abs())
    scale, zero, codes = torch.zeros_like(hi), torch.zeros_like(hi), torch.zeros_like(g)
    exact = span == 0
    for n in range(15, 0, -1):
        s = (span / n).half().float()
        safe = torch.where(s > 0, s, torch.ones_like(s))
        z = (-torch.round(lo / safe)).clamp(0, 15)
        q = (torch.round(g / safe.unsqueeze(-1)) + z.unsqueeze(-1)).clamp(0, 15)
        ok = ((q - z.unsqueeze(-1)) * s.unsqueeze(-1) == g).all(-1) & (s > 0)
        take = (ok & ~exact) | ((n == 15) & (span > 0))
        scale, zero = torch.where(take, s, scale), torch.where(take, z, zero)
        codes = torch.where(take.unsqueeze(-1), q, codes)
        exact |= ok
        if bool(exact.all()):
            break
    scale = torch.where(span == 0, torch.tensor(1e-5 / 15).half().float(), scale)      # AutoAWQ's, for zeros
    table = torch.stack([scale, zero], -1).half()
    return quant.pack_nibbles(codes.to(torch.uint8).reshape(w.shape)), table, exact


def u4_weight(codes: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The f32 weight [..., K] stored U4 stands for: (code - zero) x scale of each group of 128
    (codes: bytes [..., K/2], element 2i in the low nibble; table: f16 [..., K/128, 2])."""
    from megavm.schedule import quant

    q = quant.unpack_nibbles(codes).float()
    q = q.reshape(*q.shape[:-1], q.shape[-1] // U4_GROUP, U4_GROUP)
    t = table.float()
    return ((q - t[..., 1:]) * t[..., :1]).flatten(-2)


def fp8_block_weight(codes: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The f32 weight [..., rows, K] e4m3 codes with 128 x 128 block scales (table [..., ceil(rows/128),
    ceil(K/128)], the Hugging Face "fp8" format's weight_scale_inv) stand for."""
    from megavm.schedule import quant

    rows, k = codes.shape[-2:]
    ms = zip(codes.reshape(-1, rows, k), table.reshape(-1, *table.shape[-2:]))
    return torch.stack([quant.dequantize({"weight": c, "weight_scale_inv": t}, "fp8-block") for c, t in ms]
                       ).reshape(codes.shape)


def u4_table_problem(table: torch.Tensor) -> str | None:
    """What is wrong with a U4 group table, if anything: a scale that is NaN, inf or negative, or a
    zero point that is not an integer in [0, 15]."""
    s, z = table[..., 0].float(), table[..., 1].float()
    bad = ~torch.isfinite(s) | (s < 0)
    if bool(bad.any()):
        at = bad.nonzero()[0].tolist()
        return f"holds the scale {s[tuple(at)].item()} at group {at}"
    bad = ~((z >= 0) & (z <= 15) & (z == torch.round(z)))
    if bool(bad.any()):
        at = bad.nonzero()[0].tolist()
        return f"holds the zero point {z[tuple(at)].item()} at group {at} (int4 zero points are 0 .. 15)"
    return None


def stored(weights: dict[str, torch.Tensor], buffers, fmt: str = "nvfp4") -> dict[str, torch.Tensor]:
    """A program's weights as it stores them: each F8E4M3 buffer as e4m3 codes and its f32 row scales
    (buffer <name>.scale; schedule/quant.py's fp8: a row's amax / 448); each E2M1 buffer as codes (bytes,
    element 2i in the low nibble), e4m3 block scales (<name>.block_scale) and row scales
    (<name>.scale), each matrix of a stack on its own: with fmt "nvfp4" its nvfp4 codes and block scales
    and its global scale on every row, with "mxfp4" its mxfp4 codes and e8m0 exponents
    (<name>.block_scale, no row scales); each U4 buffer as int4_tables holds it; with fmt "fp8-block"
    each F8E4M3 buffer as e4m3 codes and f32 scales per 128 x 128 block (<name>.block_scale), each
    matrix of a stack on its own; the rest as given. Quantizing what such codes stand for gives back
    the same values: nvfp4's codes and
    block scales themselves (the block holding the amax has the scale 448, so the global scale comes
    back within an f32 rounding), mxfp4's codes times their powers of two (a block whose largest code
    is below 4 comes back with a smaller exponent and larger codes)."""
    from megavm.schedule import quant

    out = dict(weights)
    for b in buffers:
        if b.dtype == DType.E2M1 and b.name in weights and fmt == "mxfp4":
            w = weights[b.name]
            qs = [quant.quantize(m, "mxfp4") for m in w.reshape(-1, *w.shape[-2:])]
            out[b.name] = torch.stack([q["weight_blocks"] for q in qs]).reshape(b.dtype.storage_shape(w.shape))
            out[block_scale_name(b.name)] = torch.stack([q["weight_scales"] for q in qs]).reshape(
                *w.shape[:-1], w.shape[-1] // 32)
        elif b.dtype == DType.E2M1 and b.name in weights:
            w = weights[b.name]
            qs = [quant.quantize(m, "nvfp4") for m in w.reshape(-1, *w.shape[-2:])]
            out[b.name] = torch.stack([q["weight"] for q in qs]).reshape(b.dtype.storage_shape(w.shape))
            out[block_scale_name(b.name)] = torch.stack([q["weight_scale"] for q in qs]).reshape(
                *w.shape[:-1], w.shape[-1] // 16)
            out[scale_name(b.name)] = torch.stack([q["weight_scale_2"].float().expand(w.shape[-2]) for q in qs]
                                                  ).reshape(w.shape[:-1]).contiguous()
        if b.dtype == DType.U4 and b.name in weights:
            out[b.name], out[block_scale_name(b.name)], _ = int4_tables(weights[b.name])
        if b.dtype == DType.F8E4M3 and b.name in weights and fmt == "fp8-block":
            w = weights[b.name]
            qs = [quant.quantize(m, "fp8-block") for m in w.reshape(-1, *w.shape[-2:])]
            out[b.name] = torch.stack([q["weight"] for q in qs]).reshape(w.shape)
            s = torch.stack([q["weight_scale_inv"] for q in qs])
            out[block_scale_name(b.name)] = s.reshape(*w.shape[:-2], *s.shape[-2:]).contiguous()
        elif b.dtype == DType.F8E4M3 and b.name in weights:
            w = weights[b.name]
            q = quant.quantize(w.reshape(-1, w.shape[-1]), "fp8")
            out[b.name] = q["weight"].reshape(w.shape)
            out[scale_name(b.name)] = q["weight_scale"].reshape(w.shape[:-1]).contiguous()
    return out


def stored_exactly(weights: dict[str, torch.Tensor], buffers, fmt: str = "nvfp4") -> dict[str, torch.Tensor]:
    """A quantized checkpoint's program weights (loaded as what they stand for) stored as the program
    stores them (fmt: the folder's format, one of quant.FORMATS), refused in one line where that
    would not be what the file's codes and scales stand for (within one f32 rounding of each weight;
    int4: exactly): a row whose scale is not its largest weight / 448."""
    out = stored(weights, buffers, fmt)
    dtypes = {b.name: b.dtype for b in buffers}
    for n, w in weights.items():
        if out[n] is not w and dtypes[n] == DType.U4:
            again = u4_weight(out[n], out[block_scale_name(n)])
            if not torch.equal(again, w.float()):
                at = (again != w).reshape(*w.shape[:-1], -1, U4_GROUP).any(-1).nonzero()[0].tolist()
                raise UserError(f"weight {n!r}: group {at} of its int4 codes is not (code - zero) x an f16 scale "
                                f"for any zero point in 0 .. 15 megavm can recover")
        elif out[n] is not w and dtypes[n] == DType.E2M1 and fmt == "mxfp4":
            if not torch.equal(mx_weight(out[n], out[block_scale_name(n)]), w.float()):
                raise UserError(f"weight {n!r}: its mxfp4 codes and exponents do not stand for the weights given")
        elif out[n] is not w and dtypes[n] == DType.E2M1:
            again = e2m1_weight(out[n], out[block_scale_name(n)], out[scale_name(n)])
            if not torch.allclose(again, w, rtol=2 ** -20, atol=0):
                raise UserError(f"weight {n!r}: its {fmt} codes and scales do not stand for the weights given "
                                f"(row {int((again - w).abs().amax(-1).argmax())})")
        elif out[n] is not w and fmt == "fp8-block":
            again = fp8_block_weight(out[n], out[block_scale_name(n)])
            if not torch.allclose(again, w, rtol=2 ** -22, atol=0):
                raise UserError(f"weight {n!r}: its fp8 128 x 128 blocks are not scaled by their largest weight / 448 "
                                f"(row {int((again - w).abs().amax(-1).argmax())})")
        elif out[n] is not w:
            again = out[n].float() * out[scale_name(n)].unsqueeze(-1)
            if not torch.allclose(again, w, rtol=2 ** -22, atol=0):
                raise UserError(f"weight {n!r}: its fp8 rows are not scaled by their largest weight / 448, which "
                                f"megavm's per-row e4m3 format needs (row {int((again - w).abs().amax(-1).argmax())})")
    return out


def e2m1_weight(codes: torch.Tensor, block: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The f32 weight [..., K] stored E2M1 stands for: the nvfp4 format's dequantization
    (schedule/quant.py) of each row, its row scale as the global scale (codes: bytes [..., K/2],
    element 2i in the low nibble; block [..., K/16]; rows [...])."""
    from megavm.schedule import quant

    k = 2 * codes.shape[-1]
    w = quant.dequantize({"weight": codes.reshape(-1, k // 2), "weight_scale": block.reshape(-1, k // 16),
                          "weight_scale_2": rows.reshape(-1, 1)}, "nvfp4")
    return w.reshape(*codes.shape[:-1], k)
