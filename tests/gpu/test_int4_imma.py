"""int4 (AWQ) rows on the integer tensor cores, the research build MVM_U4_IMMA=1 (instructions/gemv_imma.cuh:
rows of K = 2048 and 4096 of 2-D weights, u8 codes against x in four s8 parts, exact s32 sums) on an NVIDIA GPU
(marker: cuda), on every tile: against the eager model of the dequantized weights, ReferenceVM on the same
tables, direct loads bit for bit like the ring, and not the default build's arithmetic (so the path ran).
k1024's down projection (K = 4096) and k2048's q/k/v, o, gate/up and LM head rows (K = 2048) take it; the
rest keep gemv_xreg or the row-per-warp loop."""

import pytest
import torch

from megavm.vm.megakernel import Ablations, MegakernelVM
from megavm.vm.reference import ReferenceVM
from tests.gpu.harness import QUANT_SHAPES, decodes_as_eager, quantized, rel_err

pytestmark = pytest.mark.cuda

IMMA = {"MVM_U4_IMMA": 1}


@pytest.mark.parametrize("shape", ["k1024", "k2048"])
def test_integer_tensor_core_int4_matches_eager(shape):
    """Greedy tokens identical and logits within the bf16 tolerance of the eager model, step after step."""
    cfg, hf, packed, w = quantized(QUANT_SHAPES[shape], "int4")
    decodes_as_eager(MegakernelVM(packed, w, defines=IMMA), cfg, hf, f"{shape} integer tensor cores")


@pytest.mark.parametrize("shape", ["k1024", "k2048"])
def test_integer_tensor_core_int4_matches_reference_and_direct_loads(shape):
    """ReferenceVM on the same tables within 2e-3 of the largest logit (same tokens); direct loads the same
    bits as the ring; and logits that differ from the default build's (its sums are in another order)."""
    _, _, packed, w = quantized(QUANT_SHAPES[shape], "int4")
    cuda_cores = {"MVM_ATTN_MMA": 0}
    vm, ref = MegakernelVM(packed, w, defines=IMMA | cuda_cores), ReferenceVM(packed, w, device="cuda")
    direct = MegakernelVM(packed, w, ablations=Ablations(direct_loads=True), defines=IMMA | cuda_cores)
    base = MegakernelVM(packed, w, defines=cuda_cores)
    for pos, tok in enumerate([3, 8, 5]):
        out = ref.step({"token": tok, "pos": pos})
        res, res_d = vm.run({"token": tok, "pos": pos}), direct.run({"token": tok, "pos": pos})
        res_b = base.run({"token": tok, "pos": pos})
        err = rel_err(res.logits, out["logits"])
        assert err <= 2e-3, f"{shape} {pos=}: {err=:.2e}"
        assert res.token == int(out["next_token"][0])
        assert torch.equal(res.logits, res_d.logits), f"{shape} {pos=}: direct loads differ"
        assert not torch.equal(res.logits, res_b.logits), f"{shape} {pos=}: the same bits as the default build"
