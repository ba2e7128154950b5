"""Activation functions an epilogue applies, by code (the `act` param): the same formulas in torch as
in activations.cuh, each evaluated in f32."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from megavm.instructions.spec import Param

NAMES = ("none", "relu", "sigmoid", "silu", "gelu", "gelu_tanh")
CODE = {name: code for code, name in enumerate(NAMES)}
LIMIT = Param("limit", "clamp of a gated MLP's gate (above) and up (both ways) projections before they meet; 0: "
                      "none", f32=True, default=0.0)
ACT_CODE = Param("act", "activation code: " + ", ".join(f"{c} {n}" for c, n in enumerate(NAMES)))

_TORCH = {"none": lambda x: x, "relu": F.relu, "sigmoid": torch.sigmoid, "silu": F.silu, "gelu": F.gelu,
          "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


def activate(code: int, x: torch.Tensor) -> torch.Tensor:
    return _TORCH[NAMES[code]](x.float())


def check_act(p: dict, problems: list[str]) -> None:
    if not 0 <= p["act"] < len(NAMES):
        problems.append(f"act={p['act']} is not an activation code (0..{len(NAMES) - 1})")
