"""What a user would run instead of megavm, for `megavm bench`: a plain bf16 PyTorch decode step,
the same step captured in a CUDA graph, and torch.compile(mode="reduce-overhead").

Every tensor is made before capture and updated in place (token, position, KV cache), so the graph
and Inductor's CUDA graphs replay the same memory."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from schedule.models import ModelConfig, rope_freqs


class TorchDecoder:
    def __init__(self, cfg: ModelConfig, hf: dict[str, torch.Tensor], capacity: int):
        self.cfg, self.cap = cfg, capacity
        dev, dt = hf["model.norm.weight"].device, hf["model.norm.weight"].dtype
        c, hd = cfg, cfg.head_dim
        self.emb, self.norm = hf["model.embed_tokens.weight"], hf["model.norm.weight"]
        self.head = self.emb if cfg.tied_embeddings else hf["lm_head.weight"]
        self.layers = []
        for i in range(c.n_layers):
            p = f"model.layers.{i}."
            self.layers.append(dict(
                an=hf[p + "input_layernorm.weight"], fn=hf[p + "post_attention_layernorm.weight"],
                wqkv=torch.cat([hf[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]),
                wo=hf[p + "self_attn.o_proj.weight"],
                w13=torch.cat([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]]),
                w2=hf[p + "mlp.down_proj.weight"],
                k=torch.zeros(1, c.n_kv_heads, capacity, hd, device=dev, dtype=dt),
                v=torch.zeros(1, c.n_kv_heads, capacity, hd, device=dev, dtype=dt)))
        ang = torch.outer(torch.arange(capacity, device=dev).float(), rope_freqs(cfg).to(dev))
        self.cos, self.sin = ang.cos(), ang.sin()
        self.tok = torch.zeros(1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.positions = torch.arange(capacity, device=dev)

    def _rms(self, x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps)).to(x.dtype) * w

    def _rope(self, x):
        cos, sin = self.cos[self.pos].view(1, 1, 1, -1), self.sin[self.pos].view(1, 1, 1, -1)
        a, b = x.float().chunk(2, -1)
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1).to(x.dtype)

    def step(self) -> torch.Tensor:
        """Decode self.tok at self.pos; returns the argmax token [1]."""
        c = self.cfg
        H, KV, hd = c.n_heads, c.n_kv_heads, c.head_dim
        x = self.emb[self.tok].view(1, c.dim)
        mask = (self.positions <= self.pos).view(1, 1, 1, -1)
        for L in self.layers:
            q, k, v = F.linear(self._rms(x, L["an"]), L["wqkv"]).split([H * hd, KV * hd, KV * hd], -1)
            q = self._rope(q.view(1, 1, H, hd).transpose(1, 2))
            L["k"].index_copy_(2, self.pos, self._rope(k.view(1, 1, KV, hd).transpose(1, 2)))
            L["v"].index_copy_(2, self.pos, v.view(1, 1, KV, hd).transpose(1, 2))
            a = F.scaled_dot_product_attention(q, L["k"], L["v"], attn_mask=mask, enable_gqa=True)
            x = x + F.linear(a.transpose(1, 2).reshape(1, H * hd), L["wo"])
            g, u = F.linear(self._rms(x, L["fn"]), L["w13"]).chunk(2, -1)
            x = x + F.linear(F.silu(g) * u, L["w2"])
        return F.linear(self._rms(x, self.norm), self.head).argmax(-1)

    def set(self, token: int, pos: int) -> None:
        self.tok.fill_(token)
        self.pos.fill_(pos)

    def graphed(self):
        """The step captured in a CUDA graph; returns its replay function."""
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                self.step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.out = self.step()
        return g.replay

    def compiled(self):
        """torch.compile(mode="reduce-overhead"). The KV caches, token and position are marked static
        addresses, so Inductor's CUDA graphs may update the caches in place instead of skipping."""
        for t in [self.tok, self.pos] + [L[k] for L in self.layers for k in ("k", "v")]:
            torch._dynamo.mark_static_address(t)
        fn = torch.compile(self.step, mode="reduce-overhead", fullgraph=True)
        for _ in range(3):
            fn()
        return fn
