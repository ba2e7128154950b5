"""The eager PyTorch model: the oracle `megavm run` checks every step against.

It works on Hugging Face weight names and layout (rotate-half RoPE, separate q/k/v), independently of
the lowering, and follows each family's model class: q/k/v biases (Qwen2), per-head q/k RMSNorm
before RoPE (Qwen3), a sliding attention window (Mistral), GELU-tanh MLPs, (1 + weight) RMSNorm and
a scaled embedding (Gemma), the rope scaling's attention factor on cos and sin, and mixture-of-experts
MLPs (Mixtral, Qwen3-MoE: the router's top-k, their weighted sum); with a LoRA
adapter (schedule/adapters.py), each targeted projection adds scale B (A x), unmerged. Activations and
accumulation are f32; the KV cache holds the weight dtype, as the program's does, or with kv_cache="fp8"
what e4m3 codes of each new row stand for, the row (every KV head's K, or V) scaled by amax / 448
(vLLM's dynamic scaled_fp8_quant), or with kv_cache="nvfp4" what vLLM's NVFP4 codes and scales of it
stand for (core/codecs.py). (The tests hold it, and megavm, against transformers' own model
classes.)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from megavm.core.codecs import nvfp4_rows, nvfp4_values
from megavm.core.errors import InputError
from megavm.instructions.routing import route
from megavm.schedule.models import ModelConfig
from megavm.schedule.rope import rope
from megavm.schedule.weights import expert_names

ACT = {"silu": F.silu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


class EagerDecoder:
    def __init__(self, cfg: ModelConfig, hf: dict[str, torch.Tensor], capacity: int, adapter=None, kv_cache: str = ""):
        self.cfg, self.w, self.capacity, self.adapter = cfg, hf, capacity, adapter
        if kv_cache not in ("", "fp8", "nvfp4"):
            raise ValueError(f"kv_cache={kv_cache!r}: the eager model stores '' (the weights' dtype), 'fp8' or 'nvfp4'")
        self.kv_cache = kv_cache
        dev = hf["model.norm.weight"].device
        dt = torch.float32 if kv_cache else hf["model.embed_tokens.weight"].dtype
        shape = (cfg.n_layers, cfg.n_kv_heads, capacity, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dt, device=dev)
        self.v = torch.zeros(shape, dtype=dt, device=dev)
        inv, self.attn_factor = rope(cfg)
        # (layer, router logits) -> (ids, weights) in place of the router's own choice: a check that
        # follows another VM's choice at a near-tie sets it (flywheel/bench.py: verify)
        self.route_override = None
        # (layer, "k" or "v", pos, rows in cache order) -> what the cache keeps instead of the oracle's own
        # rounding, or None: a check that follows another VM's code choices at rounding near-ties sets it
        # (vm/verify.py: FollowKVCodes)
        self.kv_follow = None
        self.freqs = inv.to(dev)

    def _rms(self, x, g):
        return (g.float() + self.cfg.norm_offset) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps))

    def _lin(self, name, x, bias: str | None = None, lora: tuple[int, str] | None = None):
        y = F.linear(x, self.w[name].float(), self.w[bias].float() if bias else None)
        ad = self.adapter
        if ad is not None and lora is not None and lora[1] in ad.targets:
            a, b = ad.a[lora].to(x.device), ad.b[lora].to(x.device)
            y = y + ad.scale * F.linear(F.linear(x, a), b)
        return y

    def _stored(self, rows: torch.Tensor, keys: bool = False, at: tuple[int, int] | None = None) -> torch.Tensor:
        """A new K or V row [kv_heads, hd] as the cache keeps it: fp8, codes e4m3(x / s) times s, s = amax / 448
        over the whole row (0 for an all-zero row); nvfp4, what vLLM's NVFP4 quantizer's codes and scales
        of the row (its amax over every KV head) stand for (core/codecs.py), its blocks of 16 taken in
        the order the cache keeps the elements (keys: RoPE pairs interleaved, schedule/weights.py); in the
        weight dtype the row itself (the cache rounds it). kv_follow may keep another VM's row instead."""
        n, hd = rows.shape
        order = torch.arange(hd, device=rows.device).view(2, hd // 2).t().reshape(hd) if keys else slice(None)
        out = torch.empty_like(rows)
        kept = self.kv_follow(at[0], "k" if keys else "v", at[1], rows[:, order]) if self.kv_follow and at else None
        if not self.kv_cache and kept is None:
            return rows                                # rounded to the weight dtype where it is stored
        if kept is not None:
            out[:, order] = kept
        elif self.kv_cache == "nvfp4":
            out[:, order] = nvfp4_values(*nvfp4_rows(rows[:, order], rows.abs().max()))
        else:
            s = rows.abs().max() / 448.0
            out = torch.zeros_like(rows) if s == 0 else (rows / s).to(torch.float8_e4m3fn).float() * s
        return out

    def _rope(self, x, pos):
        """x: [heads, hd] f32, rotate-half, cos and sin scaled by the attention factor."""
        ang = pos * self.freqs
        c, s = torch.cos(ang) * self.attn_factor, torch.sin(ang) * self.attn_factor
        a, b = x.chunk(2, dim=-1)
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)

    def _qkv(self, i: int, h: torch.Tensor, which: str, heads: int) -> torch.Tensor:
        c, p = self.cfg, f"model.layers.{i}."
        y = self._lin(p + f"self_attn.{which}_proj.weight", h, p + f"self_attn.{which}_proj.bias" if c.qkv_bias else None,
                      (i, which))
        y = y.view(heads, c.head_dim)
        if c.qk_norm and which != "v":
            y = self._rms(y, self.w[p + f"self_attn.{which}_norm.weight"])
        return y

    def _experts(self, i: int, h: torch.Tensor) -> torch.Tensor:
        """An MoE layer's MLP: the router's top_k (instructions/routing.py), their weighted sum in slot order."""
        c, p = self.cfg, f"model.layers.{i}."
        router, experts = expert_names(c, i)
        logits = F.linear(h, self.w[p + router].float())
        if self.route_override is not None:
            ids, w = self.route_override(i, logits)
        else:
            ids, w = route(logits, c.top_k, c.router_score, renorm=c.router_renorm, scale=c.router_scale)
        y = torch.zeros_like(h)
        for j, e in enumerate(ids.tolist()):
            g, u, d = (self.w[p + n].float() for n in experts[e])
            y = y + w[j] * F.linear(ACT[c.mlp_act](F.linear(h, g)) * F.linear(h, u), d)
        return y

    @torch.no_grad()
    def step(self, token: int, pos: int) -> torch.Tensor:
        """One decode step; returns logits [vocab] f32 and appends to the KV cache."""
        c = self.cfg
        if not 0 <= token < c.vocab:
            raise InputError(f"token id {token} outside vocabulary of {c.vocab}")
        if not 0 <= pos < self.capacity:
            raise InputError(f"position {pos} outside KV capacity {self.capacity}")
        hd, g = c.head_dim, c.group
        lo = max(0, pos - c.sliding_window + 1) if c.sliding_window else 0
        x = self.w["model.embed_tokens.weight"][token].float() * c.embed_scale
        for i in range(c.n_layers):
            p = f"model.layers.{i}."
            h = self._rms(x, self.w[p + "input_layernorm.weight"])
            q = self._rope(self._qkv(i, h, "q", c.n_heads), pos)
            k = self._rope(self._qkv(i, h, "k", c.n_kv_heads), pos)
            v = self._qkv(i, h, "v", c.n_kv_heads)
            self.k[i, :, pos] = self._stored(k, keys=True, at=(i, pos)).to(self.k.dtype)
            self.v[i, :, pos] = self._stored(v, at=(i, pos)).to(self.v.dtype)
            keys = self.k[i, :, lo:pos + 1].float().repeat_interleave(g, dim=0)     # [heads, n, hd]
            vals = self.v[i, :, lo:pos + 1].float().repeat_interleave(g, dim=0)
            att = torch.softmax((keys @ q.unsqueeze(-1)).squeeze(-1) * hd ** -0.5, dim=-1)
            a = (att.unsqueeze(1) @ vals).reshape(-1)
            x = x + self._lin(p + "self_attn.o_proj.weight", a, lora=(i, "o"))
            h = self._rms(x, self.w[p + "post_attention_layernorm.weight"])
            if c.is_moe(i):
                x = x + self._experts(i, h)
                continue
            f = (ACT[c.mlp_act](self._lin(p + "mlp.gate_proj.weight", h, lora=(i, "gate")))
                 * self._lin(p + "mlp.up_proj.weight", h, lora=(i, "up")))
            x = x + self._lin(p + "mlp.down_proj.weight", f, lora=(i, "down"))
        head = "model.embed_tokens.weight" if c.tied_embeddings else "lm_head.weight"
        return self._lin(head, self._rms(x, self.w["model.norm.weight"]))

    def generate(self, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
        """Greedy decode: feed the prompt, then n new tokens. Returns (new tokens, logits of every step)."""
        toks, logits = list(prompt), []
        out = []
        for pos in range(len(prompt) + n - 1):
            lg = self.step(toks[pos], pos)
            logits.append(lg)
            if pos >= len(prompt) - 1:
                nxt = int(torch.argmax(lg))
                toks.append(nxt)
                out.append(nxt)
        return out, logits
