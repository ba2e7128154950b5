"""Where a model comes from: a named preset with seeded random weights, or a local Hugging Face
checkpoint folder. Either way: its config and its weights under Hugging Face names."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from megavm.core.types import DType
from megavm.schedule.models import ModelConfig, preset
from megavm.schedule.weights import random_hf_weights


@dataclass
class Model:
    name: str
    cfg: ModelConfig
    hf: dict[str, torch.Tensor]      # Hugging Face names
    dtype: str                       # "f32" | "bf16"
    notes: list[str] = field(default_factory=list)
    weights: str = ""                # ScheduleConfig.weights ("fp8": its projections' codes and row scales)


def default_dtype(model: str) -> str:
    return "f32" if model == "tiny" else "bf16"


def load_model(model: str = "tiny", checkpoint: str | None = None, dtype: str | None = None,
               seed: int = 0) -> Model:
    if checkpoint:
        from megavm.schedule.checkpoint import load
        ck = load(checkpoint, dtype)
        return Model(str(ck.path), ck.cfg, ck.hf, ck.dtype, ck.notes, ck.weights)
    cfg = preset(model)
    dtype = dtype or default_dtype(model)
    return Model(model, cfg, random_hf_weights(cfg, DType.parse(dtype).torch, seed=seed), dtype,
                 [f"random weights, seed {seed}"])
