"""NVFP4 rows on e4m3 tensor cores (instructions/gemv_f8.cuh: rows of K = 2048 and 4096, x in four scaled e4m3
parts) on an NVIDIA GPU (marker: cuda), on every tile: the build MVM_E2M1_F8=1 MVM_XREG=0 (by default the path
takes tiles of 96 rows or more of K = 4096, and gemv_xreg those of K = 2048; the test shapes' tiles are
shorter). Against the eager model of the dequantized weights, ReferenceVM on the same tables, direct loads bit
for bit like the ring, and not the arithmetic of the build with both knobs 0 (so the path ran). k1024's down projection and
k2048's q/k/v, o, gate/up and LM head rows take it; the rest keep the row-per-warp loop."""

import pytest

from megavm.vm.megakernel import MegakernelVM
from tests.gpu.harness import QUANT_SHAPES, decodes_as_eager, matches_reference_and_direct_loads, quantized

pytestmark = pytest.mark.cuda

F8 = {"MVM_E2M1_F8": 1, "MVM_XREG": 0}


@pytest.mark.parametrize("shape", ["k1024", "k2048"])
def test_e4m3_tensor_core_nvfp4_matches_eager(shape):
    """Greedy tokens identical and logits within the bf16 tolerance of the eager model, step after step."""
    cfg, hf, packed, w = quantized(QUANT_SHAPES[shape], "nvfp4")
    decodes_as_eager(MegakernelVM(packed, w, defines=F8), cfg, hf, f"{shape} e4m3 tensor cores")


@pytest.mark.parametrize("shape", ["k1024", "k2048"])
def test_e4m3_tensor_core_nvfp4_matches_reference_and_direct_loads(shape):
    """ReferenceVM on the same tables within 2e-3 of the largest logit (same tokens); direct loads the same
    bits as the ring; and logits that differ from the build's with both knobs 0 (the row-per-warp loop's)."""
    matches_reference_and_direct_loads(QUANT_SHAPES[shape], "nvfp4", f"{shape} e4m3 tensor cores", F8)
