"""Shared setup for the GPU tests: compile a model for the device's SMs and make its weights."""
from __future__ import annotations

from dataclasses import replace

import torch

from megavm.schedule.config import ScheduleConfig
from megavm.schedule.models import ModelConfig
from megavm.schedule.weights import program_weights, random_hf_weights
from megavm.vm.compile import compile
from megavm.vm.pack import PackedProgram

TORCH_DT = {"f32": torch.float32, "bf16": torch.bfloat16}


def build(cfg: ModelConfig, sc: ScheduleConfig, seed: int = 0, n_sms: int | None = None):
    """-> (packed program, program weights on the GPU, Hugging Face weights on the GPU). n_sms: the SM
    queues, and what the tile sizes left at 0 are picked for (default: the device's SMs)."""
    n_sms = n_sms or torch.cuda.get_device_properties(0).multi_processor_count
    packed = compile(cfg, replace(sc, n_sms=n_sms))
    hf = random_hf_weights(cfg, TORCH_DT[sc.dtype], seed=seed, device="cuda")
    return packed, program_weights(cfg, hf), hf


def written(packed: PackedProgram) -> list[int]:
    """Every buffer some instruction writes (an empty optional output slot is none)."""
    return sorted({int(b) for r in packed.instrs for b in r["outputs"][:r["n_outputs"]] if b >= 0})


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| over the entries; equal entries (the -inf of an empty attention block) count 0."""
    a, b = a.double(), b.double()
    d = torch.where(a == b, torch.zeros_like(a), a - b)
    return (d.norm() / torch.where(torch.isfinite(b), b, 0).norm().clamp_min(1e-30)).item()
