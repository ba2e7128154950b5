"""LORA_A (instructions/lora_a.py): its reference against the product written out in torch, id 0 writing
nothing, and the shapes its check refuses, each named."""
import pytest
import torch

from megavm.core.types import Buffer, BufferKind, DType
from megavm.instructions.lora_a import SPEC, fits

W, A, I = BufferKind.WEIGHT, BufferKind.ACTIVATION, BufferKind.INPUT


def _ops(L=64, J=12, T=1, dtype=DType.BF16, gamma=True):
    ins = [Buffer("v", A, DType.F32, (L,)), Buffer("a", W, dtype, (3, J, L)), Buffer("adapter", I, DType.I32, (1,)),
           Buffer("g", W, dtype, (L,)) if gamma else None]
    return ins, [Buffer("u", A, DType.F32, (T, J))]


@pytest.mark.parametrize("gamma", [True, False])
def test_reference_is_rows_of_a_times_the_normed_input(gamma):
    torch.manual_seed(0)
    v, a, g = torch.randn(64), torch.randn(3, 12, 64).bfloat16(), torch.randn(64).bfloat16()
    u = torch.full((1, 12), -7.0)
    p = {"row0": 4, "nrows": 5}
    SPEC.reference(p, [v, a, torch.tensor([2], dtype=torch.int32), g if gamma else None], [u])
    x = v * g.float() if gamma else v
    torch.testing.assert_close(u[0, 4:9], a[2, 4:9].float() @ x, rtol=1e-6, atol=1e-6)
    assert torch.equal(u[0, :4], torch.full((4,), -7.0)) and torch.equal(u[0, 9:], torch.full((3,), -7.0))
    SPEC.reference(p, [v, a, torch.tensor([0], dtype=torch.int32), None], [u2 := torch.zeros(1, 12)])
    assert torch.equal(u2, torch.zeros(1, 12))          # id 0: nothing written, no one reads it
    assert not SPEC.check(p, *_ops(gamma=gamma))


@pytest.mark.parametrize("ops, p, words", [
    (_ops(T=2), {"row0": 0, "nrows": 4}, "u has shape (2, 12), expected (1, 12)"),
    (_ops(), {"row0": 10, "nrows": 4}, "rows [10, 14) outside a's 12"),
    (_ops(L=60), {"row0": 0, "nrows": 4}, "v length 60 must be a multiple of 8"),
    (_ops(L=8200, J=4, dtype=DType.F32), {"row0": 0, "nrows": 1}, "exceed the 65536 bytes of shared memory"),
])
def test_bad_operands_are_named(ops, p, words):
    assert any(words in m for m in SPEC.check(p, *ops)), SPEC.check(p, *ops)


def test_a_bad_gamma_or_a_is_named():
    ins, outs = _ops()
    ins[3] = Buffer("g", W, DType.BF16, (32,))
    assert SPEC.check({"row0": 0, "nrows": 4}, ins, outs) == ["gamma has shape (32,), expected (64,)"]
    ins, outs = _ops()
    ins[1] = Buffer("a", W, DType.BF16, (3, 12, 32))
    assert SPEC.check({"row0": 0, "nrows": 4}, ins, outs) == ["a has shape (3, 12, 32), expected (adapters, rows, 64)"]


def test_fits_counts_the_rows_and_the_input():
    assert fits(12, 2048, 2) and not fits(15, 2048, 2)          # 12 x 4 KiB + 8 KiB; 15 rows overflow
    assert fits(1, 8192, 4) and not fits(1, 8200, 4)
