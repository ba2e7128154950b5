"""Shared setup for the GPU tests: lower a model, pack it for the device's SMs, and build both VMs."""
from __future__ import annotations

import torch

from schedule.assign import assign
from schedule.lower import LowerConfig, lower
from schedule.models import ModelConfig, program_weights, random_hf_weights
from vm.pack import pack

TORCH_DT = {"f32": torch.float32, "bf16": torch.bfloat16}


def build(cfg: ModelConfig, lc: LowerConfig, seed: int = 0, n_sms: int | None = None, strategy: str = "balanced"):
    """-> (program, packed, program weights on the GPU, Hugging Face weights on the GPU)."""
    n_sms = n_sms or torch.cuda.get_device_properties(0).multi_processor_count
    prog = lower(cfg, lc)
    packed = pack(prog, assign(prog, n_sms, strategy))
    hf = random_hf_weights(cfg, TORCH_DT[lc.dtype], seed=seed, device="cuda")
    return prog, packed, program_weights(cfg, hf), hf


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| over the entries; equal entries (the -inf of an empty attention block) count 0."""
    a, b = a.double(), b.double()
    d = torch.where(a == b, torch.zeros_like(a), a - b)
    return (d.norm() / torch.where(torch.isfinite(b), b, 0).norm().clamp_min(1e-30)).item()
