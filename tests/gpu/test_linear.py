"""LINEAR (the generic fused epilogue) in the megakernel: the fused-kernels lecture's check and odd
shapes against torch (tests/instructions/test_linear.py holds ReferenceVM to the same), with tiles of
one batch row (weights through the loader ring) and of several (weights read directly)."""
import pytest
import torch

from megavm.vm.megakernel import Ablations, MegakernelVM
from tests.instructions.test_linear import TORCH
from tests.programs import linear_operands, linear_program

pytestmark = pytest.mark.cuda


def _run(packed, weights, x, res=None):
    vm = MegakernelVM(packed, weights)
    y = vm.run({"x": x} if res is None else {"x": x, "res": res}).outputs()["y"].cpu()
    y2 = vm.run({"x": x + 1} if res is None else {"x": x + 1, "res": res}).outputs()["y"].cpu()
    return y, y2


@pytest.mark.parametrize("n", [8, 10], ids=["8x8", "8x10"])
@pytest.mark.parametrize("nb", [1, 3])
def test_lecture_check(n, nb):
    weights, x, res = linear_operands(8, n, 16, seed=n)
    y, y2 = _run(linear_program(8, n, 16, act="relu", mult=0.5, bias=True, res=True, rows=4, nb=nb), weights, x, res)
    for xi, got in ((x, y), (x + 1, y2)):          # a second run reads the new input
        expected = torch.maximum(xi @ weights["w"].T + 0.5 * res + weights["bias"], torch.tensor(0.0))
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("act", sorted(TORCH))
@pytest.mark.parametrize("shape", [(5, 37, 24), (None, 13, 40), (3, 300, 1024)], ids=["batch5", "vector", "reg"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_odd_shapes_every_activation(act, shape, dtype):
    B, N, K = shape
    weights, x, r = linear_operands(B, N, K, dtype, seed=N + K)
    y, _ = _run(linear_program(B, N, K, dtype, act=act, mult=-1.5, bias=True, res=True, rows=7, nb=2), weights, x, r)
    want = TORCH[act](x @ weights["w"].float().T + weights["bias"].float() - 1.5 * r)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)


# Row shapes for each GEMV path (instructions/gemv_core.cuh): in bf16, K = 2048 and 4096 (whole 4 KiB chunks)
# take the register path, every other K the row-per-warp path (half chunks, rows straddling stages:
# 1024, 1536, 2816, 11008, 14336); in f32 K = 1024 and 2048 the register path, the rest row per warp.
# Tile heights leave partial ring stages and rows split across warps and stages. At 33 rows and K = 7168
# a warp's second pair of rows starts 14 stages into the tile, past the ring's end (12 stages at that
# size): its stages before the pair must be handed back as they land (gemv_rows_bf16's release_to).
GEMV_K = {"bf16": [256, 512, 768, 1024, 1536, 2048, 2560, 2816, 3584, 4096, 6144, 7168, 8960, 11008, 12288, 14336],
          "f32": [128, 384, 512, 640, 768, 1024, 1408, 1536, 2048, 3072, 6144]}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("rows", [1, 7, 33])
def test_every_gemv_path_matches_torch_and_direct_loads(dtype, rows):
    for K in GEMV_K[dtype]:
        N = 2 * rows + 5
        weights, x, _ = linear_operands(None, N, K, dtype, seed=K + rows)
        packed = linear_program(None, N, K, dtype, rows=rows)
        got = MegakernelVM(packed, weights).run({"x": x}).outputs()["y"].cpu()
        want = (x.double() @ weights["w"].double().T).float()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{dtype} {K=} {rows=}: {m}")
        direct = MegakernelVM(packed, weights, ablations=Ablations(direct_loads=True)).run({"x": x}).outputs()["y"].cpu()
        assert torch.equal(direct, got), f"{dtype} {K=} {rows=}: direct loads differ from the ring"
