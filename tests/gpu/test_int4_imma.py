"""int4 (AWQ) rows on the integer tensor cores (instructions/gemv_imma.cuh: rows of K = 2048 and 4096 of 2-D
weights, u8 codes against x in four s8 parts, exact s32 sums) on an NVIDIA GPU (marker: cuda), on every tile:
the build MVM_U4_IMMA=1 (by default the path takes tiles of 32 rows or more; most of the test shapes' tiles
are shorter). Against the eager model of the dequantized weights, ReferenceVM on the same tables, direct loads bit
for bit like the ring, and not the arithmetic of the build with the knob 0 (so the path ran).
k1024's down projection (K = 4096) and k2048's q/k/v, o, gate/up and LM head rows (K = 2048) take it; the
rest keep gemv_xreg or the row-per-warp loop."""

import pytest
import torch

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


def test_group_table_ring_depths_compute_the_same_bits():
    """The group tables' cp.async ring (MVM_U4_TAB_AHEAD, 3 by default) changes where a (scale, zero) pair is
    read from, not the arithmetic: one slot ahead and no ring (each pair from L2) give the default's bits, through
    the ring and by direct loads, on k2048's every tile (MVM_U4_IMMA=1; tiles of 2 to 16 rows: the last group's
    copies clamped to the tile's last row). All on the CUDA-core attention path, the direct loads' own."""
    from megavm.vm.megakernel import Ablations
    _, _, packed, w = quantized(QUANT_SHAPES["k2048"], "int4")
    knobs = IMMA | {"MVM_ATTN_MMA": 0}
    vms = {depth: MegakernelVM(packed, w, defines=knobs | ({"MVM_U4_TAB_AHEAD": depth} if depth != 3 else {}))
           for depth in (3, 1, 0)}
    direct = MegakernelVM(packed, w, ablations=Ablations(direct_loads=True), defines=knobs | {"MVM_U4_TAB_AHEAD": 1})
    for pos, tok in enumerate([3, 8, 5]):
        out = {depth: vm.run({"token": tok, "pos": pos}).logits for depth, vm in vms.items()}
        assert torch.equal(out[3], out[1]) and torch.equal(out[3], out[0]), f"{pos=}: a ring depth changed the bits"
        assert torch.equal(out[1], direct.run({"token": tok, "pos": pos}).logits), f"{pos=}: direct loads differ"
