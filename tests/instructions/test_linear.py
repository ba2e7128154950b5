"""LINEAR, the generic fused epilogue y = act(W x + bias + mult * res), on ReferenceVM: the fused-kernels
lecture's own check (expected = maximum(in_out + 0.5 * in + bias, 0) at rtol = atol = 1e-4 on 8x8 and
8x10), then odd shapes, bf16 weights, vectors, every activation, tiles of several batch rows. The
expected values are torch's own functions over torch's matmul, written here, not megavm's reference."""
import pytest
import torch
import torch.nn.functional as F

from megavm.vm.reference import ReferenceVM
from tests.programs import linear_operands, linear_program

TORCH = {"none": lambda v: v, "relu": F.relu, "sigmoid": torch.sigmoid, "silu": F.silu, "gelu": F.gelu,
         "gelu_tanh": lambda v: F.gelu(v, approximate="tanh")}


def _run(packed, weights, x, res=None):
    vm = ReferenceVM(packed, weights, check=True)
    inputs = {"x": x} if res is None else {"x": x, "res": res}
    return vm.step(inputs)["y"]


@pytest.mark.parametrize("n", [8, 10], ids=["8x8", "8x10"])
def test_lecture_check(n):
    """in_out = x @ W.T is the matmul the epilogue is fused onto; in is the residual, mult 0.5, relu."""
    weights, x, res = linear_operands(8, n, 16, seed=n)
    y = _run(linear_program(8, n, 16, act="relu", mult=0.5, bias=True, res=True, rows=4, nb=3), weights, x, res)
    in_out = x @ weights["w"].T
    expected = torch.maximum(in_out + 0.5 * res + weights["bias"], torch.tensor(0.0))
    torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("act", sorted(TORCH))
@pytest.mark.parametrize("shape", [(5, 37, 24), (None, 13, 40), (1, 3, 8)], ids=["batch5", "vector", "one"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_odd_shapes_every_activation(act, shape, dtype):
    B, N, K = shape
    for bias, res, mult in ((True, True, -1.5), (False, False, 0.0), (True, False, 0.0), (False, True, 2.0)):
        weights, x, r = linear_operands(B, N, K, dtype, seed=N + K)
        packed = linear_program(B, N, K, dtype, act=act, mult=mult, bias=bias, res=res, rows=7, nb=2)
        y = _run(packed, weights if bias else {"w": weights["w"]}, x, r if res else None)
        v = x @ weights["w"].float().T
        if bias:
            v = v + weights["bias"].float()
        if res:
            v = v + mult * r
        # f32 sums in another order: the error is a few ulps of the dot products' terms
        torch.testing.assert_close(y, TORCH[act](v), rtol=1e-5, atol=1e-5, msg=lambda m: f"{act} {shape} {dtype} "
                                   f"{bias=} {res=}: {m}")
