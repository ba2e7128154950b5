"""What a user would run instead of megavm, for `megavm bench`: a plain bf16 PyTorch decode step, the
same step captured in a CUDA graph, and torch.compile set up as gpt-fast sets it up, its strongest
honest configuration for batch-1 decode:
- every tensor a registered buffer, the KV caches static and updated in place, token and position
  passed as tensors, so Inductor's CUDA graphs (mode="reduce-overhead") replay without copies;
- grouped-query attention by repeat_interleave into scaled_dot_product_attention on the math
  backend, which Inductor fuses with its neighbours;
- Inductor's coordinate-descent tuning of its generated kernels.

With weights="fp8" the peer stores the projections and the LM head as e4m3 codes with a scale per
output row (schedule/quant.py's fp8) and dequantizes on the fly, as a user of weight-only fp8 without a
fused kernel would: each linear converts its codes to the activations' dtype, multiplies, and scales
the output rows (the same sums as the dequantized weights'). Under torch.compile, Inductor is free to
fuse the conversion into its GEMV.

With weights="nvfp4" the peer keeps each linear's e2m1 codes (bytes), e4m3 block scales and per-row
global scales (each Hugging Face tensor quantized on its own, as megavm stores them) and rebuilds the
weight in the activations' dtype before each product: codes through a 16-entry table, times their
block's scale and their row's global scale (the plain weight-only form without a fused kernel).

With weights="int4" it keeps AWQ's codes (bytes along rows, element 2i in the low nibble) and each
group of 128's f16 scale and zero point, and rebuilds (code - zero) x scale in the activations' dtype
before each product; with "fp8-block", e4m3 codes and each 128 x 128 block's f32 scale, rebuilt as
code x scale the same way.

With kv_cache="fp8" the peer keeps its K and V caches as e4m3 codes with one f32 scale per position
(each new row over every KV head: its amax / 448, as megavm's KV_QUANT), and reads code x scale back
in the activations' dtype before attention (the plain form without a fused attention kernel).

With kv_cache="nvfp4" it keeps them as e2m1 codes (bytes, two a byte), an e4m3 scale per 16 elements
and an f32 scale per position (each new row over every KV head quantized as vLLM's reference NVFP4
quantizer does against the row's amax, as megavm's KV_QUANT; keys with their RoPE pairs side by side,
as megavm's cache keeps them, so that their blocks of 16 are megavm's), and reads codes through a
16-entry table x block scale x scale back in the activations' dtype before attention.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from megavm.core.codecs import nvfp4_rows
from megavm.flywheel.timing import graphed
from megavm.instructions.kv_quant import quantize_row
from megavm.instructions.routing import scores
from megavm.schedule.models import ModelConfig
from megavm.schedule.rope import rope

PEER_FORMATS = ("fp8", "fp8-block", "nvfp4", "int4")   # the quantized forms the peer keeps and rebuilds on the fly


class TorchDecoder(torch.nn.Module):
    """The decode step of any family megavm lowers (the departures from Llama: q/k/v biases, per-head
    q/k norms, a sliding window, GELU-tanh, (1 + w) norms, a scaled embedding, rope attention factors),
    in the weights' dtype, with Hugging Face's rotate-half RoPE."""

    def __init__(self, cfg: ModelConfig, hf: dict[str, torch.Tensor], capacity: int,
                 experts: dict[str, torch.Tensor] | None = None, weights: str = "bf16", kv_cache: str = ""):
        """experts: the program's weights (schedule/weights.py: program_weights), whose expert stacks
        and routers the MoE layers share rather than copy (a 30B-A3B model fits an H100 once).
        weights: "fp8" stores the dense projections and the LM head as e4m3 codes and row scales
        (module docstring); hf then holds what those stand for (schedule.weights.quantized_model).
        kv_cache: "fp8" keeps the caches as e4m3 codes and a scale per position; "nvfp4", as e2m1 codes,
        e4m3 block scales and a scale per position (module docstring)."""
        super().__init__()
        if kv_cache not in ("", "fp8", "nvfp4"):
            raise ValueError(f"the torch peer's KV cache is '' (the weights' dtype), 'fp8' or 'nvfp4', not "
                             f"{kv_cache!r}")
        self.kv_fp8, self.kv_nvfp4 = kv_cache == "fp8", kv_cache == "nvfp4"
        if weights not in ("bf16", *PEER_FORMATS) or weights != "bf16" and cfg.n_experts:
            raise ValueError(f"the torch peer has weights bf16, {', '.join(PEER_FORMATS)} (dense models), not "
                             f"{weights!r}")
        self.quantized, self.fmt = weights != "bf16", weights
        if experts is None and cfg.n_experts:
            from megavm.schedule.weights import program_weights
            experts = program_weights(cfg, hf)
        self.cfg, self.cap = cfg, capacity
        dev, dt = hf["model.norm.weight"].device, hf["model.embed_tokens.weight"].dtype
        c, hd = cfg, cfg.head_dim
        buf = lambda name, t: self.register_buffer(name, t, persistent=False)   # noqa: E731
        buf("emb", hf["model.embed_tokens.weight"])
        buf("norm", self._gamma(hf["model.norm.weight"]))
        buf("head", self.emb if cfg.tied_embeddings else hf["lm_head.weight"])
        buf("embed_scale", torch.tensor(cfg.embed_scale, dtype=dt, device=dev))
        for i in range(c.n_layers):
            p = f"model.layers.{i}."
            L = dict(an=self._gamma(hf[p + "input_layernorm.weight"]),
                     fn=self._gamma(hf[p + "post_attention_layernorm.weight"]),
                     wqkv=torch.cat([hf[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]),
                     wo=hf[p + "self_attn.o_proj.weight"],
                     k=torch.zeros(1, c.n_kv_heads, capacity, hd, device=dev, dtype=dt),
                     v=torch.zeros(1, c.n_kv_heads, capacity, hd, device=dev, dtype=dt))
            if self.kv_fp8:                  # e4m3 codes (as bytes: index_copy_ takes no float8), a scale per position
                for n in "kv":
                    L[n] = L[n].to(torch.uint8)
                    L[n + "s"] = torch.zeros(1, 1, capacity, 1, device=dev)
            if self.kv_nvfp4:                # e2m1 code bytes, e4m3 block scales (as bytes), a scale per position
                for n in "kv":
                    L[n] = torch.zeros(1, c.n_kv_heads, capacity, hd // 2, device=dev, dtype=torch.uint8)
                    L[n + "b"] = torch.zeros(1, c.n_kv_heads, capacity, hd // 16, device=dev, dtype=torch.uint8)
                    L[n + "s"] = torch.zeros(1, 1, capacity, 1, device=dev)
            if c.is_moe(i):
                q = f"layers.{i}."
                L |= {n: experts[q + n] for n in ("router", "experts_gate", "experts_up", "experts_down")}
            else:
                L["w13"] = torch.cat([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]])
                L["w2"] = hf[p + "mlp.down_proj.weight"]
            if c.qkv_bias:
                L["bqkv"] = torch.cat([hf[p + f"self_attn.{n}_proj.bias"] for n in "qkv"])
            if c.qk_norm:
                L["qn"], L["kn"] = (self._gamma(hf[p + f"self_attn.{n}_norm.weight"]) for n in "qk")
            parts = {"wqkv": [hf[p + f"self_attn.{n}_proj.weight"] for n in "qkv"], "wo": [L["wo"]]}
            if not c.is_moe(i):
                parts |= {"w13": [hf[p + f"mlp.{n}_proj.weight"] for n in ("gate", "up")], "w2": [L["w2"]]}
            for k in parts if self.quantized else ():
                L[k], L[k + "_s"] = self._codes(parts[k], dt)
            for k, t in L.items():
                buf(f"l{i}_{k}", t)
        if self.quantized:
            head, scale = self._codes([self.head], dt)
            del self.head
            buf("head", head)
            buf("head_s", scale)
        if self.fmt == "nvfp4" or self.kv_nvfp4:
            from megavm.schedule import quant
            buf("e2m1", torch.cat([quant.E2M1_GRID, -quant.E2M1_GRID]).to(dev, dt))
        inv, factor = rope(cfg)
        ang = torch.outer(torch.arange(capacity, device=dev).float(), inv.to(dev))
        buf("cos", ang.cos() * factor)
        buf("sin", ang.sin() * factor)
        buf("positions", torch.arange(capacity, device=dev))
        self.tok = torch.zeros(1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)

    def _codes(self, parts: list[torch.Tensor], dt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Matrices stacked by rows as codes and scales, each quantized on its own: fp8, e4m3 codes and
        row scales in the activations' dtype; nvfp4, code bytes and, per row, its e4m3 block scales then
        its f32 global scale (as raw bytes: one buffer); int4, code bytes along rows and per row its groups'
        f16 (scale, zero) [rows, K/128, 2]; fp8-block, e4m3 codes and per row its blocks' f32 scales."""
        from megavm.schedule import quant
        if self.fmt == "fp8":
            qs = [quant.quantize(w, "fp8") for w in parts]
            return torch.cat([q["weight"] for q in qs]), torch.cat([q["weight_scale"].view(-1) for q in qs]).to(dt)
        if self.fmt == "fp8-block":
            qs = [quant.quantize(w, "fp8-block") for w in parts]
            rows = [q["weight_scale_inv"].repeat_interleave(128, 0)[:w.shape[0]] for q, w in zip(qs, parts)]
            return torch.cat([q["weight"] for q in qs]), torch.cat(rows)
        if self.fmt == "int4":              # the codes, scales and zero points the values stand for
            from megavm.schedule.weights import int4_tables
            ts = [int4_tables(w) for w in parts]
            return torch.cat([t[0] for t in ts]), torch.cat([t[1] for t in ts])
        qs = [quant.quantize(w, "nvfp4") for w in parts]
        bs = torch.cat([q["weight_scale"].view(torch.uint8) for q in qs])
        g = torch.cat([q["weight_scale_2"].float().expand(w.shape[0]) for q, w in zip(qs, parts)])
        return torch.cat([q["weight"] for q in qs]), torch.cat([bs, g.view(-1, 1).view(torch.uint8)], 1)

    def _lin(self, x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None, bias=None) -> torch.Tensor:
        """x W^T (+ bias); with fp8 codes, dequantized on the fly: (x codes^T) * row scales; with nvfp4,
        int4 and fp8-block codes, the weight rebuilt in x's dtype first (codes x block scales x row
        scales; (code - zero) x group scale; code x block scale)."""
        if scale is None:
            return F.linear(x, w, bias)
        if self.fmt == "int4":
            out, k = w.shape[0], 2 * w.shape[1]
            q = torch.stack([w & 15, w >> 4], -1).view(out, k // 128, 128).to(x.dtype)
            t = scale.to(x.dtype)
            return F.linear(x, ((q - t[..., 1:]) * t[..., :1]).view(out, k), bias)
        if self.fmt == "fp8-block":
            k = w.shape[1]
            return F.linear(x, w.to(x.dtype) * scale.repeat_interleave(128, 1)[:, :k].to(x.dtype), bias)
        if self.fmt == "nvfp4":
            out, k = w.shape[0], 2 * w.shape[1]
            v = self.e2m1[torch.stack([w & 15, w >> 4], -1).view(out, k).long()]
            bs = scale[:, :k // 16].view(torch.float8_e4m3fn).to(x.dtype)
            g = scale[:, k // 16:].contiguous().view(torch.float32).to(x.dtype)
            return F.linear(x, (v.view(out, k // 16, 16) * bs.unsqueeze(-1)).view(out, k) * g, bias)
        y = F.linear(x, w.to(x.dtype)) * scale
        return y if bias is None else y + bias

    def _gamma(self, w: torch.Tensor) -> torch.Tensor:
        """An RMSNorm weight as the step multiplies by it: (1 + w) in f32 for offset norms (Gemma)."""
        return w.float() + self.cfg.norm_offset if self.cfg.norm_offset else w

    def _layer(self, i: int):
        """Layer i's buffers by name: L("wqkv")."""
        return lambda name: getattr(self, f"l{i}_{name}")

    def _rms(self, x, w):
        xf = x.float()
        n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps)
        return (n * w).to(x.dtype) if w.dtype == torch.float32 else n.to(x.dtype) * w

    def _rope(self, x, pos):
        cos, sin = self.cos[pos].view(1, 1, 1, -1), self.sin[pos].view(1, 1, 1, -1)
        a, b = x.float().chunk(2, -1)
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1).to(x.dtype)

    def logits(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Decode tok [1] at pos [1]; returns the logits [1, vocab] in the weights' dtype."""
        c = self.cfg
        H, KV, hd = c.n_heads, c.n_kv_heads, c.head_dim
        x = self.emb[tok].view(1, c.dim)
        if c.embed_scale != 1.0:
            x = x * self.embed_scale
        mask = self.positions <= pos
        if c.sliding_window:
            mask = mask & (self.positions > pos - c.sliding_window)
        mask = mask.view(1, 1, 1, -1)
        for i in range(c.n_layers):
            L = self._layer(i)
            S = (lambda n: L(n + "_s")) if self.quantized else (lambda n: None)     # noqa: E731
            qkv = self._lin(self._rms(x, L("an")), L("wqkv"), S("wqkv"), L("bqkv") if c.qkv_bias else None)
            q, k, v = qkv.split([H * hd, KV * hd, KV * hd], -1)
            q, k = q.view(1, 1, H, hd), k.view(1, 1, KV, hd)
            if c.qk_norm:
                q, k = self._rms(q, L("qn")), self._rms(k, L("kn"))
            q = self._rope(q.transpose(1, 2), pos)
            self._append(L, "k", self._rope(k.transpose(1, 2), pos), pos)
            self._append(L, "v", v.view(1, 1, KV, hd).transpose(1, 2), pos)
            keys, vals = (self._cache(L, n, x.dtype).repeat_interleave(H // KV, 1) for n in "kv")
            a = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)
            x = x + self._lin(a.transpose(1, 2).reshape(1, H * hd), L("wo"), S("wo"))
            h = self._rms(x, L("fn"))
            if c.is_moe(i):
                x = x + self._experts(h, L)
                continue
            g, u = self._lin(h, L("w13"), S("w13")).chunk(2, -1)
            g = F.silu(g) if c.mlp_act == "silu" else F.gelu(g, approximate="tanh")
            x = x + self._lin(g * u, L("w2"), S("w2"))
        return self._lin(self._rms(x, self.norm), self.head, self.head_s if self.quantized else None)

    def _append(self, L, n: str, row: torch.Tensor, pos: torch.Tensor) -> None:
        """Write the new K or V row [1, KV, 1, hd] at pos (fp8: its codes, and its amax / 448; nvfp4:
        _nvfp4's codes, block scales and scale)."""
        if self.kv_nvfp4:
            for suffix, t in zip(("", "b", "s"), self._nvfp4(row, keys=n == "k")):
                L(n + suffix).index_copy_(2, pos, t)
            return
        if not self.kv_fp8:
            L(n).index_copy_(2, pos, row)
            return
        codes, s = quantize_row(row, row.float().abs().amax().view(1, 1, 1, 1))
        L(n).index_copy_(2, pos, codes.view(torch.uint8))
        L(n + "s").index_copy_(2, pos, s)

    def _nvfp4(self, row: torch.Tensor, keys: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The row [1, KV, 1, hd] quantized by vLLM's reference NVFP4 quantizer against its amax over every
        KV head (core/codecs.py: nvfp4_rows, as megavm's KV_QUANT): code bytes [1, KV, 1, hd / 2], the
        e4m3 block scales' bytes [1, KV, 1, hd / 16] and the scale [1, 1, 1, 1]. Keys are quantized with
        their RoPE pairs side by side (rotate-half elements i and i + hd / 2 in one byte), as megavm's
        cache keeps them."""
        x = row.float()
        if keys:
            x = torch.stack(x.chunk(2, -1), -1).flatten(-2)
        codes, bs, s = nvfp4_rows(x, x.abs().amax())
        return codes, bs.view(torch.uint8), s.view(1, 1, 1, 1)

    def _cache(self, L, n: str, dt: torch.dtype) -> torch.Tensor:
        """The K or V cache [1, KV, capacity, hd] in dt (fp8: code x its position's scale; nvfp4:
        e2m1(code) x its block's scale x its position's scale, keys back in rotate-half order)."""
        if self.kv_nvfp4:
            w = L(n)
            v = self.e2m1[torch.stack([w & 15, w >> 4], -1).flatten(-2).long()]           # [1, KV, cap, hd]
            v = v * L(n + "b").view(torch.float8_e4m3fn).to(dt).repeat_interleave(16, -1) * L(n + "s").to(dt)
            return v.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2) if n == "k" else v
        return (L(n).view(torch.float8_e4m3fn).to(dt) * L(n + "s").to(dt)) if self.kv_fp8 else L(n)

    def _experts(self, h: torch.Tensor, L) -> torch.Tensor:
        """A mixture-of-experts MLP as gpt-fast writes one: router, top-k on the device, the chosen
        experts' rows gathered by index (no host sync; Inductor fuses the gather into its GEMVs)."""
        c = self.cfg
        probs = scores(F.linear(h, L("router")), c.router_score)
        w, ids = torch.topk(probs, c.top_k, -1)
        if c.router_renorm:
            w = w / w.sum(-1, keepdim=True)
        w, ids = (w * c.router_scale).view(-1, 1), ids.view(-1)
        g = torch.einsum("d,kfd->kf", h.view(-1), L("experts_gate")[ids])
        u = torch.einsum("d,kfd->kf", h.view(-1), L("experts_up")[ids])
        a = (F.silu(g) if c.mlp_act == "silu" else F.gelu(g, approximate="tanh")) * u
        y = torch.einsum("kf,kdf->kd", a, L("experts_down")[ids])
        return (y.float() * w).sum(0, keepdim=True).to(h.dtype)

    def forward(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Decode tok [1] at pos [1]; returns the argmax token [1]."""
        return self.logits(tok, pos).argmax(-1)

    def set(self, token: int, pos: int) -> None:
        self.tok.fill_(token)
        self.pos.fill_(pos)

    def step(self) -> torch.Tensor:
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            return self(self.tok, self.pos)

    def graphed(self):
        """The eager step captured in a CUDA graph; returns its replay function."""
        return graphed(self.step)

    def compiled(self):
        """torch.compile as gpt-fast does (module docstring); returns the compiled step, warmed up."""
        import torch._inductor.config as inductor
        inductor.coordinate_descent_tuning = True
        inductor.triton.unique_kernel_names = True
        fn = torch.compile(self, mode="reduce-overhead", fullgraph=True)

        def step():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
                return fn(self.tok, self.pos)
        for _ in range(3):
            step()
        return step
