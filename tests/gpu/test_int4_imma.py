"""int4 (AWQ) rows on the integer tensor cores (instructions/gemv_imma.cuh: rows of K = 2048 and 4096 of 2-D
weights, u8 codes against x in four s8 parts, exact s32 sums) on an NVIDIA GPU (marker: cuda), on every tile:
the build MVM_U4_IMMA=1 (by default the path takes tiles of 96 rows or more; the test shapes' tiles are
shorter). Against the eager model of the dequantized weights, ReferenceVM on the same tables, direct loads bit
for bit like the ring, and not the arithmetic of the build with the knob 0 (so the path ran).
k1024's down projection (K = 4096) and k2048's q/k/v, o, gate/up and LM head rows (K = 2048) take it; the
rest keep gemv_xreg or the row-per-warp loop."""

import pytest

from megavm.schedule.models import ModelConfig
from megavm.vm.megakernel import MegakernelVM
from tests.gpu.harness import QUANT_SHAPES, decodes_as_eager, matches_reference_and_direct_loads, quantized

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
    bits as the ring; and logits that differ from the build's with the knob 0 (gemv_xreg's or the loop's)."""
    matches_reference_and_direct_loads(QUANT_SHAPES[shape], "int4", f"{shape} integer tensor cores", IMMA)


# Down projections of K past 4096 (MVM_U4_IMMA_LONG: B's fragments in x's own place, the row sums in acc):
# k2048's of 8192 codes (tiles of about 16 rows) and one of 14336 (llama-7b-32k's K; tiles of about 8 rows).
LONG = {"MVM_U4_IMMA_LONG": 1}
LONG_SHAPES = {"k2048": QUANT_SHAPES["k2048"],
               "k14336": ModelConfig(dim=1024, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=128, ffn_dim=14336,
                                     vocab=1000)}


@pytest.mark.parametrize("shape", sorted(LONG_SHAPES))
def test_in_place_integer_tensor_core_int4_matches_eager(shape):
    """Greedy tokens identical and logits within the bf16 tolerance of the eager model, step after step."""
    cfg, hf, packed, w = quantized(LONG_SHAPES[shape], "int4")
    decodes_as_eager(MegakernelVM(packed, w, defines=LONG), cfg, hf, f"{shape} in-place integer tensor cores")


@pytest.mark.parametrize("shape", sorted(LONG_SHAPES))
def test_in_place_integer_tensor_core_int4_matches_reference_and_direct_loads(shape):
    """ReferenceVM within 2e-3 of the largest logit (same tokens), direct loads the same bits as the ring, and
    logits that differ from the build's with the knob 0 (the down projection on the row-per-warp loop)."""
    matches_reference_and_direct_loads(LONG_SHAPES[shape], "int4", f"{shape} in-place integer tensor cores", LONG)
