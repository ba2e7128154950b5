"""DLRM in plain torch, written from the model's definition (the reference DLRM's dot interaction
without self-interaction, Linear + ReLU MLPs with a sigmoid after the last top layer, one lookup per
sparse feature by the modulus hash): the oracle megavm's DLRM programs are checked against, and the
eager and torch.compile peers of `megavm bench`. Its parameters carry the reference's names
(bot_l.{2i}, emb_l.{f}, top_l.{2i}), so one state dict serves both."""
from __future__ import annotations

import torch
from torch import nn

from megavm.schedule.dlrm import DLRMConfig


def _mlp(ins: int, widths: tuple[int, ...], last: nn.Module) -> nn.Sequential:
    mods: list[nn.Module] = []
    for i, n in enumerate(widths):
        mods += [nn.Linear(ins if i == 0 else widths[i - 1], n), last if i == len(widths) - 1 else nn.ReLU()]
    return nn.Sequential(*mods)


class TorchDLRM(nn.Module):
    def __init__(self, cfg: DLRMConfig):
        super().__init__()
        self.cfg = cfg
        self.bot_l = _mlp(cfg.dense, cfg.bottom, nn.ReLU())
        self.emb_l = nn.ModuleList(nn.EmbeddingBag(n, cfg.dim, mode="sum") for n in cfg.tables)
        self.top_l = _mlp(cfg.interaction, cfg.top, nn.Sigmoid())
        n = cfg.n_sparse + 1
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """dense [B, dense] f32, sparse [B, S] raw ids >= 0 -> probabilities [B, top[-1]]."""
        dense = dense.to(self.bot_l[0].weight.dtype)
        x = self.bot_l(dense)
        ly = [emb(((sparse[:, f].long() + 1) % emb.num_embeddings).unsqueeze(1)) for f, emb in enumerate(self.emb_l)]
        t = torch.cat([x] + ly, dim=1).view(dense.shape[0], -1, self.cfg.dim)
        z = torch.bmm(t, t.transpose(1, 2))
        return self.top_l(torch.cat([x, z[:, self.li, self.lj]], dim=1)).float()


def from_state(cfg: DLRMConfig, state: dict, device="cpu", dtype: torch.dtype = torch.float32) -> TorchDLRM:
    """The module with the given parameters (reference names), in dtype (f32: the oracle; bf16: what a
    user serving bf16 weights runs), on device. Its outputs are f32."""
    m = TorchDLRM(cfg)
    m.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True, assign=True)
    return m.to(device).eval()
