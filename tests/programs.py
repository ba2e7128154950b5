"""Small hand-built programs of one opcode, for opcode tests on either VM."""
from __future__ import annotations

import torch

from megavm.core.types import BufferKind as K
from megavm.core.types import DType
from megavm.instructions import Op
from megavm.instructions.activations import CODE
from megavm.schedule.ir import Program, Task
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
