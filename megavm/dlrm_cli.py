"""`megavm run` and `megavm validate` for the DLRM presets (schedule/dlrm.py): seeded random weights
and batches of random features, decoded by the VM and checked batch by batch against the plain torch
DLRM (flywheel/dlrm_torch.py). Probabilities must agree within 1e-5 absolute: the weights reach both
in the same values (a bf16 program's weights are given to torch as those bf16 values in f32), so the
only difference is the order of f32 sums."""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from megavm.core.errors import UserError
from megavm.core.memory import host_bytes_available, require
from megavm.core.types import DType
from megavm.schedule.dlrm import (
    PRESETS,
    DLRMConfig,
    DLRMSchedule,
    pad_dense,
    program_weights,
    random_state,
    state_shapes,
)

TOL = 1e-5


def is_dlrm(a: argparse.Namespace) -> bool:
    return not getattr(a, "checkpoint", None) and a.model in PRESETS


def refuse_decoder_args(a: argparse.Namespace) -> None:
    for flag, v in (("--capacity", a.capacity),):
        if v is not None:
            raise UserError(f"{flag} is a decoder's setting; {a.model} is a DLRM program (it has --batch)")


def schedule(a: argparse.Namespace, n_sms: int) -> tuple[DLRMConfig, DLRMSchedule]:
    cfg = PRESETS[a.model]
    dtype = a.dtype or ("f32" if a.model == "dlrm-tiny" else "bf16")
    return cfg, DLRMSchedule(batch=a.batch or 1, dtype=dtype, n_sms=n_sms, strategy=a.strategy)


def describe(name: str, cfg: DLRMConfig, sc: DLRMSchedule) -> str:
    rows = sum(cfg.tables)
    return (f"{name}: DLRM, {cfg.dense} dense -> {'-'.join(map(str, cfg.bottom))}, {cfg.n_sparse} tables of "
            f"{rows:,} rows x {cfg.dim}, interaction {cfg.interaction} -> {'-'.join(map(str, cfg.top))}, "
            f"batch {sc.batch}, {sc.dtype}")


def weight_bytes(cfg: DLRMConfig, dtype: str) -> int:
    return sum(int(np.prod(s)) for s in state_shapes(cfg).values()) * DType.parse(dtype).itemsize


def random_batch(cfg: DLRMConfig, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense features in [0, 4), raw sparse ids over all of [0, 2^31): the hash wraps them."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(batch, cfg.dense, generator=g) * 4
    sparse = torch.randint(0, (1 << 31) - 1, (batch, cfg.n_sparse), generator=g, dtype=torch.int64)
    return dense, sparse.to(torch.int32)


def run(a: argparse.Namespace, device: str, n_sms: int, out) -> int:
    """Decode --batches random batches through the VM; each checked against the torch DLRM."""
    from megavm.flywheel.dlrm_torch import from_state
    from megavm.vm.compile import compile
    from megavm.vm.reference import ReferenceVM
    refuse_decoder_args(a)
    cfg, sc = schedule(a, n_sms)
    wb = weight_bytes(cfg, sc.dtype)
    if device == "cuda":
        require("this run", {"weights, and the torch model's f32 copy": wb + weight_bytes(cfg, "f32")},
                torch.cuda.mem_get_info()[0], "GPU memory")
    require("this run", {"weights, and the torch model's f32 copy": wb + weight_bytes(cfg, "f32")},
            host_bytes_available(), "host memory")
    print(describe(a.model, cfg, sc))
    packed = compile(cfg, sc)
    print(f"program: {len(packed.instrs)} tasks, {len(packed.counter_producers)} counters, {sc.n_sms} queues "
          f"({sc.strategy}); valid")
    state = random_state(cfg, DType.parse(sc.dtype).torch, seed=0, device=device)
    weights = program_weights(cfg, state, sc.dtype)
    ref = from_state(cfg, {k: v.float() for k, v in state.items()}, device)
    if device == "cuda":
        from megavm.vm.megakernel import MegakernelVM
        vm, name = MegakernelVM(packed, weights), "megakernel"
        step = lambda inputs: vm.run(inputs).outputs()["prob"]           # noqa: E731
    else:
        vm, name = ReferenceVM(packed, weights, device), f"reference-vm on {device}"
        step = lambda inputs: vm.step(inputs)["prob"]                    # noqa: E731
    worst, times, ref_times, saved = 0.0, [], [], {"dense": [], "sparse": [], "prob": []}
    for i in range(a.batches):
        dense, sparse = random_batch(cfg, sc.batch, seed=i)
        t0 = time.perf_counter()
        got = step({"dense": pad_dense(cfg, dense), "sparse": sparse}).float().cpu()
        times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with torch.no_grad():
            want = ref(dense.to(device), sparse.to(device)).float().cpu()
        ref_times.append(time.perf_counter() - t0)
        worst = max(worst, (got - want).abs().max().item())
        for k, v in (("dense", dense), ("sparse", sparse), ("prob", got)):
            saved[k].append(v.numpy())
    if out:
        np.savez(out, **{k: np.stack(v) for k, v in saved.items()}, vm=np.asarray(name))
        print(f"saved {out}: dense, sparse and prob of {a.batches} batches")
    ok = worst <= TOL
    print(f"{name}: {1e3 * statistics.median(times):.2f} ms/batch; torch eager: "
          f"{1e3 * statistics.median(ref_times):.2f} ms/batch (medians of {a.batches}, host-timed)")
    print(f"{'PASS' if ok else 'FAIL'} max |prob diff| {worst:.2e} (tol {TOL:.0e}) over {a.batches} batches of "
          f"{sc.batch}; {name} vs torch DLRM")
    return 0 if ok else 1
