"""`megavm bench` for the DLRM presets: the megakernel against the plain torch DLRM (flywheel/dlrm_torch.py)
in bf16, eager, in a CUDA graph and under torch.compile, per batch size, each megavm time beside its
verdict (probabilities within 1e-5 of the f32 torch model on the same bf16 weights)."""
from __future__ import annotations

import time

import torch

from megavm.flywheel.dlrm_torch import from_state
from megavm.flywheel.timing import graphed, median_ms
from megavm.schedule.dlrm import PRESETS, DLRMConfig, DLRMSchedule, pad_dense, program_weights, random_state
from megavm.vm.compile import compile

TOL = 1e-5
CHECK_BATCHES = 4


def bytes_read(cfg: DLRMConfig, batch: int) -> int:
    """Bytes one batch must read in bf16: the MLPs' weights and biases, one table row per sparse
    feature per sample, the inputs (f32 dense, i32 ids)."""
    mlp = sum(n * k + n for _, k, n, *_ in cfg.layers())
    return 2 * mlp + 2 * batch * cfg.n_sparse * cfg.dim + 4 * batch * (cfg.dense + cfg.n_sparse)


def random_batch(cfg: DLRMConfig, batch: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(batch, cfg.dense, generator=g) * 4
    sparse = torch.randint(0, (1 << 31) - 1, (batch, cfg.n_sparse), generator=g, dtype=torch.int64).to(torch.int32)
    return dense, sparse


def bench_dlrm(name: str, batch: int, copy_GBps: float, do_compile: bool = True) -> dict:
    from megavm.vm.megakernel import MegakernelVM
    cfg = PRESETS[name]
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    packed = compile(cfg, DLRMSchedule(batch=batch, dtype="bf16", n_sms=n_sms))
    state = random_state(cfg, torch.bfloat16, seed=0, device="cuda")
    row = {"model": name, "batch": batch, "GB": bytes_read(cfg, batch) / 1e9, "tasks": len(packed.instrs)}
    row["floor_ms"] = row["GB"] / copy_GBps * 1e3
    vm = MegakernelVM(packed, program_weights(cfg, state, "bf16"))
    oracle = from_state(cfg, state, "cuda")                    # the same bf16 values, in f32
    worst = 0.0
    for i in range(CHECK_BATCHES):
        dense, sparse = random_batch(cfg, batch, seed=i)
        got = vm.run({"dense": pad_dense(cfg, dense), "sparse": sparse}).outputs()["prob"]
        with torch.no_grad():
            want = oracle(dense.cuda(), sparse.cuda())
        worst = max(worst, (got - want).abs().max().item())
    row["verdict"], row["max_abs_err"] = ("PASS" if worst <= TOL else "FAIL"), worst
    del oracle
    row.update(_megavm_times(vm, {"dense": pad_dense(cfg, dense), "sparse": sparse}))
    del vm
    row.update(_peer_times(from_state(cfg, state, "cuda", torch.bfloat16), dense.cuda(), sparse.cuda(), do_compile))
    torch.cuda.empty_cache()
    return row


def _megavm_times(vm, inputs: dict) -> dict:
    """The kernel alone (relaunch), and a run with its input checks and copies."""
    return {"megavm_ms": median_ms(vm.relaunch),
            "megavm_run_ms": median_ms(lambda: vm.run(inputs), iters=100, warmup=10)}


def _peer_times(peer, d: torch.Tensor, s: torch.Tensor, do_compile: bool) -> dict:
    out = {}
    with torch.no_grad():
        out["eager_ms"] = median_ms(lambda: peer(d, s), iters=100, warmup=10)
        out["cudagraph_ms"] = median_ms(graphed(lambda: peer(d, s)), iters=100, warmup=10)
        if do_compile:
            try:
                t0 = time.time()
                fn = torch.compile(peer, mode="reduce-overhead", fullgraph=True)
                for _ in range(3):
                    fn(d, s)
                out["compile_s"] = time.time() - t0
                out["compiled_ms"] = median_ms(lambda: fn(d, s), iters=100, warmup=10)
            except Exception as e:  # a peer failing to compile is reported, not fatal
                out["compiled_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return out


def table(rows: list[dict]) -> str:
    out = [f"{'model':12s} {'batch':>5s} {'what':18s} {'ms/batch':>9s} {'GB/s':>6s} {'%floor':>6s}  verdict"]
    for r in rows:
        for what, key in (("megavm kernel", "megavm_ms"), ("megavm run", "megavm_run_ms"), ("eager", "eager_ms"),
                          ("CUDA graph", "cudagraph_ms"), ("torch.compile", "compiled_ms")):
            if key in r:
                ms = r[key]
                verdict = r["verdict"] if key.startswith("megavm") else "(peer)"
                out.append(f"{r['model']:12s} {r['batch']:5d} {what:18s} {ms:9.4f} {r['GB'] / ms * 1e3:6.0f} "
                           f"{100 * r['floor_ms'] / ms:5.1f}%  {verdict}")
        sp = [f"{p} x{r[k] / r['megavm_ms']:.2f}" for p, k in (("eager", "eager_ms"), ("graph", "cudagraph_ms"),
                                                                ("compile", "compiled_ms")) if k in r]
        out.append(f"{'':12s} {'':5s} megavm speedup vs {', '.join(sp)}; floor {r['floor_ms']:.4f} ms")
    return "\n".join(out)


def weight_bytes(name: str) -> int:
    cfg = PRESETS[name]
    return 2 * (sum(n * k + n for _, k, n, *_ in cfg.layers()) + sum(cfg.tables) * cfg.dim)


def gpu_bytes(name: str, batch: int) -> int:
    """The program's bf16 weights, the f32 oracle's copy, the bf16 peer's, and activations."""
    cfg = PRESETS[name]
    acts = 4 * batch * (sum(n for *_, n, _ in cfg.layers()) + cfg.n_sparse * cfg.dim + cfg.interaction)
    return 4 * weight_bytes(name) + 4 * acts + (1 << 28)

