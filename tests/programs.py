"""Small hand-built programs of one opcode, for opcode tests on either VM."""
from __future__ import annotations

import torch

from megavm.core.types import BufferKind as K
from megavm.core.types import DType
from megavm.instructions import Op
from megavm.instructions.activations import CODE
from megavm.schedule.ir import Program, Task, Wait
from megavm.vm.compile import compile_program
from megavm.vm.pack import PackedProgram


def linear_program(B: int | None, N: int, K_: int, dtype: str = "f32", act: str = "none", mult: float = 0.0,
                   bias: bool = False, res: bool = False, rows: int = 8, nb: int = 1,
                   n_sms: int = 4) -> PackedProgram:
    """y = act(x @ W.T + bias + mult * res) as LINEAR tiles of `rows` weight rows by `nb` batch rows;
    x (and res) are runtime inputs, [B, K] (a [K] vector when B is None), y the OUTPUT."""
    p = Program(meta={"inputs": ["x"] + (["res"] if res else []), "outputs": ["y"]})
    wdt = DType.parse(dtype)
    xs, ys = ((K_,), (N,)) if B is None else ((B, K_), (B, N))
    x = p.add_buffer("x", K.INPUT, DType.F32, xs)
    w = p.add_buffer("w", K.WEIGHT, wdt, (N, K_))
    b = p.add_buffer("bias", K.WEIGHT, wdt, (N,)) if bias else -1
    r = p.add_buffer("res", K.INPUT, DType.F32, ys) if res else -1
    y = p.add_buffer("y", K.OUTPUT, DType.F32, ys)
    done = p.add_counter("y")
    for r0 in range(0, N, rows):
        for b0 in range(0, B or 1, nb):
            params = dict(row0=r0, nrows=min(rows, N - r0), b0=b0, nb=min(nb, (B or 1) - b0), act=CODE[act],
                          mult=mult)
            p.add_task(Task(int(Op.LINEAR), (x, w, b, r), (y,), (), done, params, f"y[{b0}, {r0}]"))
    return compile_program(p, n_sms)


def linear_operands(B: int | None, N: int, K_: int, dtype: str = "f32", seed: int = 0):
    """(weights by name, x, res) drawn for linear_program, weights in the program's dtype."""
    g = torch.Generator().manual_seed(seed)
    wt = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    xs, ys = ((K_,), (N,)) if B is None else ((B, K_), (B, N))
    weights = {"w": (torch.randn(N, K_, generator=g) / K_ ** 0.5).to(wt), "bias": torch.randn(N, generator=g).to(wt)}
    return weights, torch.randn(xs, generator=g), torch.randn(ys, generator=g)


ROUTE_K = 6                         # experts a route_program's routers choose
# ROUTE in each of its modes: (name, params, ranking bias, hash table)
ROUTE_MODES = [
    ("softmax", dict(score=0, renorm=0), False, False),
    ("softmax-renorm", dict(score=0, renorm=1), False, False),
    ("sigmoid-bias-groups", dict(score=1, renorm=1, eps=1e-20, scale=2.5, n_group=4, topk_group=2), True, False),
    ("sqrt-softplus-bias", dict(score=2, renorm=1, scale=1.5), True, False),
    ("hash-sqrt-softplus", dict(score=2, renorm=1, scale=1.5), False, True),
]


def route_program(E: int, k: int, vocab: int, n_sms: int = 4) -> PackedProgram:
    """EMBED copies row `token` of a [vocab, E] table into the router logits (so a test picks the
    logits by the token), then one ROUTE per ROUTE_MODES writes ids.<mode> and weights.<mode>."""
    p = Program(meta={"inputs": ["token"], "outputs": [f"{w}.{m[0]}" for m in ROUTE_MODES for w in ("ids", "weights")]})
    table = p.add_buffer("logit_table", K.WEIGHT, DType.F32, (vocab, E))
    tok = p.add_buffer("token", K.INPUT, DType.I32, (1,))
    logits = p.add_buffer("logits", K.ACTIVATION, DType.F32, (E,))
    bias = p.add_buffer("bias", K.WEIGHT, DType.F32, (E,))
    hashes = p.add_buffer("hash_table", K.WEIGHT, DType.I32, (vocab, k))
    ready = p.add_counter("logits")
    p.add_task(Task(int(Op.EMBED), (table, tok), (logits,), (), ready, dict(col0=0, ncols=E, scale=1.0), "logits"))
    for name, params, has_bias, has_hash in ROUTE_MODES:
        ids = p.add_buffer(f"ids.{name}", K.OUTPUT, DType.I32, (k,))
        w = p.add_buffer(f"weights.{name}", K.OUTPUT, DType.F32, (k,))
        ins = (logits, bias if has_bias else -1, hashes if has_hash else -1, tok if has_hash else -1)
        p.add_task(Task(int(Op.ROUTE), ins, (ids, w), (Wait(ready, 1),), p.add_counter(name), params, f"route.{name}"))
    return compile_program(p, n_sms)


def route_logits(vocab: int, E: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Weights for route_program. Row t of the logit table: random (values apart by more than 1e-4)
    for most t; token 0: all zero (every score ties: ids 0..k-1); token 1: -1e4 everywhere (sigmoid and
    sqrt-softplus scores underflow to 0: weights 0, no NaN); token 2: pairs of equal logits (ties to the
    lower id); token 3: +1e4 (softmax of one huge logit, sigmoids saturate at 1)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(vocab, E, generator=g) * 3
    table[0] = 0
    table[1] = -1e4
    table[2] = torch.randn(E // 2, generator=g).repeat_interleave(2)
    table[3] = torch.randn(E, generator=g)
    table[3, 5] = 1e4
    hashes = torch.stack([torch.randperm(E, generator=g)[:ROUTE_K] for _ in range(vocab)]).int()
    return {"logit_table": table, "bias": 0.1 * torch.randn(E, generator=g), "hash_table": hashes}



def random_program_weights(packed: PackedProgram, seed: int = 0, device="cpu", gain: float = 1.0) -> dict:
    """Every weight buffer of a packed decoder drawn by its name and shape: matrices and expert stacks
    gain * randn / sqrt(K), vectors near 1, hash tables valid expert ids, rope_freqs a RoPE's (theta 1e4)."""
    from megavm.core.types import BufferKind
    g = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for i, r in enumerate(packed.buffers):
        if int(r["kind"]) != BufferKind.WEIGHT:
            continue
        shape, name = packed.shape(i), packed.names[i]
        if name.endswith("hash_table"):
            e = packed.shape(packed.buffer_id(name.replace("hash_table", "router")))[0]
            out[name] = torch.randint(0, e, shape, generator=g, device=device, dtype=torch.int32)
            continue
        t = torch.randn(shape, generator=g, device=device)
        t = gain * t / shape[-1] ** 0.5 if len(shape) >= 2 else 1.0 + 0.1 * t
        out[name] = t.to(DType(int(r["dtype"])).torch)
    n = out["rope_freqs"].numel()
    out["rope_freqs"] = 10000.0 ** (-torch.arange(n, device=device) / n)
    return out


def quantized_program(cfg, fmt: str, dtype: str = "f32", n_sms: int = 4, seed: int = 1, capacity: int = 16):
    """(cfg, hf, cfg_q, hf_q, program, stored weights) of seeded random weights whose projections and
    LM head are stored in fmt ("fp8", "nvfp4" or "mxfp4"): hf_q is what those stand for (the oracle's weights)."""
    from megavm.schedule.config import ScheduleConfig
    from megavm.schedule.lower import lower
    from megavm.schedule.weights import program_weights, quantized_model, random_hf_weights, stored
    hf = random_hf_weights(cfg, torch.float32 if dtype == "f32" else torch.bfloat16, seed=seed)
    cfg_q, hf_q = quantized_model(cfg, hf, fmt)
    p = lower(cfg_q, ScheduleConfig(dtype=dtype, weights=fmt, capacity=capacity, n_sms=n_sms))
    return cfg, hf, cfg_q, hf_q, p, stored(program_weights(cfg_q, hf_q), p.buffers, fmt)


def refusals(p) -> list[str]:
    """The validator's problems with program p, as text."""
    from megavm.schedule.validate import validate
    return [str(x) for x in validate(p).problems]


def changed(p, buffer: str, **change) -> list[str]:
    """refusals() of p with one buffer's fields changed (name, shape, dtype, kind)."""
    from dataclasses import replace
    bad = replace(p, buffers=list(p.buffers))
    i = p.buffer_id(buffer)
    bad.buffers[i] = replace(p.buffers[i], **change)
    return refusals(bad)


def check_reference_decodes_quantized(cfg, fmt: str, n_sms: int, far_from_plain: float, steps: int = 5) -> None:
    """ReferenceVM on the fmt tables (quantized_program) against the eager model of the dequantized
    weights: tokens identical, logits within 1e-5 of the largest (f32); the unquantized model must be
    far_from_plain or more away, so the check tells the two apart."""
    from megavm.schedule.assign import assign
    from megavm.schedule.eager import EagerDecoder
    from megavm.vm.pack import pack
    from megavm.vm.reference import ReferenceVM
    cfg0, hf, cfg_q, hf_q, p, w = quantized_program(cfg, fmt, n_sms=n_sms)
    vm = ReferenceVM(pack(p, assign(p, n_sms)), w, check=True, seed=n_sms)
    eager, plain = EagerDecoder(cfg_q, hf_q, 16), EagerDecoder(cfg0, hf, 16)
    tok, far = 5, 0.0
    for pos in range(steps):
        out, ref = vm.step({"token": tok, "pos": pos}), eager.step(tok, pos)
        err = ((out["logits"] - ref).abs().max() / ref.abs().max()).item()
        assert err <= 1e-5, f"{fmt} {pos=}: {err=:.2e}"
        assert int(out["next_token"][0]) == int(ref.argmax())
        far = max(far, ((plain.step(tok, pos) - ref).abs().max() / ref.abs().max()).item())
        tok = int(ref.argmax())
    assert far > far_from_plain, f"the unquantized model is within {far:.1e}: the check would not see {fmt} ignored"


def check_reference_decodes_kv_cache(cfg, kv_cache: str, n_sms: int, capacity: int, others: tuple[str, ...],
                                     steps: int = 10) -> None:
    """ReferenceVM (checking mode, a seeded interleaving) on a program with a kv_cache ("fp8", "nvfp4") cache
    against the eager model of that cache: tokens identical, logits within 1e-5 of the largest (f32). The
    eager models with the `others` caches ("": unquantized) must each be 1e-3 or more away over the run,
    so the check tells them apart."""
    from megavm.schedule.assign import assign
    from megavm.schedule.config import ScheduleConfig
    from megavm.schedule.eager import EagerDecoder
    from megavm.schedule.lower import lower
    from megavm.schedule.weights import program_weights, random_hf_weights
    from megavm.vm.pack import pack
    from megavm.vm.reference import ReferenceVM
    hf = random_hf_weights(cfg, torch.float32, seed=2)
    p = lower(cfg, ScheduleConfig(dtype="f32", capacity=capacity, n_sms=n_sms, kv_cache=kv_cache))
    vm = ReferenceVM(pack(p, assign(p, n_sms)), program_weights(cfg, hf), check=True, seed=n_sms)
    eager = EagerDecoder(cfg, hf, capacity, kv_cache=kv_cache)
    apart = {k: EagerDecoder(cfg, hf, capacity, kv_cache=k) for k in others}
    tok, far = 5, dict.fromkeys(others, 0.0)
    for pos in range(steps):
        out, ref = vm.step({"token": tok, "pos": pos}), eager.step(tok, pos)
        err = ((out["logits"] - ref).abs().max() / ref.abs().max()).item()
        assert err <= 1e-5, f"{kv_cache} cache {pos=}: {err=:.2e}"
        assert int(out["next_token"][0]) == int(ref.argmax())
        for k, m in apart.items():
            far[k] = max(far[k], ((m.step(tok, pos) - ref).abs().max() / ref.abs().max()).item())
        tok = int(ref.argmax())
    assert min(far.values()) >= 1e-3, far
