"""The eager PyTorch model: the oracle megavm is checked against.

It works on Hugging Face weight names and layout (rotate-half RoPE, separate q/k/v), independently
of the lowering. Activations and accumulation are f32; the KV cache holds the weight dtype, as the
program's does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from megavm.schedule.models import ModelConfig, rope_freqs


class EagerLlama:
    def __init__(self, cfg: ModelConfig, hf: dict[str, torch.Tensor], capacity: int):
        self.cfg, self.w, self.capacity = cfg, hf, capacity
        dev = hf["model.norm.weight"].device
        dt = hf["model.norm.weight"].dtype
        shape = (cfg.n_layers, cfg.n_kv_heads, capacity, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dt, device=dev)
        self.v = torch.zeros(shape, dtype=dt, device=dev)
        self.freqs = rope_freqs(cfg).to(dev)

    def _rms(self, x, g):
        return g.float() * (x * torch.rsqrt(x.pow(2).mean() + self.cfg.norm_eps))

    def _lin(self, name, x):
        return F.linear(x, self.w[name].float())

    def _rope(self, x, pos):
        """x: [heads, hd] f32, rotate-half."""
        ang = pos * self.freqs
        c, s = torch.cos(ang), torch.sin(ang)
        a, b = x.chunk(2, dim=-1)
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)

    @torch.no_grad()
    def step(self, token: int, pos: int) -> torch.Tensor:
        """One decode step; returns logits [vocab] f32 and appends to the KV cache."""
        c = self.cfg
        if not 0 <= token < c.vocab:
            raise ValueError(f"token id {token} outside vocabulary of {c.vocab}")
        if not 0 <= pos < self.capacity:
            raise ValueError(f"position {pos} outside KV capacity {self.capacity}")
        hd, g = c.head_dim, c.group
        x = self.w["model.embed_tokens.weight"][token].float()
        for i in range(c.n_layers):
            p = f"model.layers.{i}."
            h = self._rms(x, self.w[p + "input_layernorm.weight"])
            q = self._rope(self._lin(p + "self_attn.q_proj.weight", h).view(c.n_heads, hd), pos)
            k = self._rope(self._lin(p + "self_attn.k_proj.weight", h).view(c.n_kv_heads, hd), pos)
            v = self._lin(p + "self_attn.v_proj.weight", h).view(c.n_kv_heads, hd)
            self.k[i, :, pos] = k.to(self.k.dtype)
            self.v[i, :, pos] = v.to(self.v.dtype)
            keys = self.k[i, :, :pos + 1].float().repeat_interleave(g, dim=0)     # [heads, pos+1, hd]
            vals = self.v[i, :, :pos + 1].float().repeat_interleave(g, dim=0)
            att = torch.softmax((keys @ q.unsqueeze(-1)).squeeze(-1) * hd ** -0.5, dim=-1)
            a = (att.unsqueeze(1) @ vals).reshape(-1)
            x = x + self._lin(p + "self_attn.o_proj.weight", a)
            h = self._rms(x, self.w[p + "post_attention_layernorm.weight"])
            f = F.silu(self._lin(p + "mlp.gate_proj.weight", h)) * self._lin(p + "mlp.up_proj.weight", h)
            x = x + self._lin(p + "mlp.down_proj.weight", f)
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
