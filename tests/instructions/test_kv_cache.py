"""The KV cache's swizzled rows (instructions/kv_cache.py): the map itself, the appending opcodes' writes,
and a hand-written history read back by ReferenceVM against the eager model, which keeps its cache in
order."""

import pytest
import torch

from megavm.instructions.kv_cache import append, logical, swizzle, swizzled
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.eager import EagerDecoder
from megavm.schedule.lower import lower
from megavm.schedule.models import ModelConfig
from megavm.schedule.weights import program_weights, random_hf_weights
from megavm.vm.pack import pack
from megavm.vm.reference import ReferenceVM
from megavm.vm.verify import VS_EAGER


def test_swizzle_moves_whole_chunks_by_row_and_is_its_own_inverse():
    x = torch.randn(2, 20, 128).to(torch.bfloat16)
    y = swizzle(x, 3)
    assert torch.equal(swizzle(y, 3), x) and not torch.equal(y, x)
    for r in range(20):            # row r is cache row 3 + r: chunk c (8 elements) at c ^ ((3 + r) % 8)
        perm = torch.arange(128) ^ (((3 + r) % 8) << 3)
        assert torch.equal(y[:, r], x[:, r][..., perm])


@pytest.mark.parametrize("dtype, hd, expect", [(torch.bfloat16, 64, True), (torch.bfloat16, 256, True),
                                               (torch.bfloat16, 96, False), (torch.bfloat16, 32, False),
                                               (torch.float32, 64, False)])
def test_which_caches_swizzle(dtype, hd, expect):
    rows = torch.zeros(1, 9, hd, dtype=dtype)
    assert swizzled(rows) == expect
    if not expect:
        assert swizzle(rows, 1) is rows


def test_append_writes_rows_that_logical_reads_back_in_order():
    cache = torch.zeros(2, 30, 64, dtype=torch.bfloat16)
    v = torch.randn(128)
    append({"head_dim": 64, "row0": 0, "nrows": 128, "rope": 0}, v, 13, torch.zeros(0), cache, "KV_APPEND")
    want = v.to(torch.bfloat16).view(2, 64)
    assert torch.equal(logical(cache, 0, 13, 14)[0], want[0]) and torch.equal(logical(cache, 1, 13, 14)[0], want[1])
    assert not torch.equal(cache[0, 13], want[0])         # row 13 % 8 = 5: stored out of order


CFG = ModelConfig(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=384, vocab=256)


def _decode_from_history(start: int, write) -> float:
    """Random history at positions < start (the eager model's cache in order, the program's through
    write(rows, kind)), then 3 greedy steps: the worst logit error of ReferenceVM against eager."""
    hf = random_hf_weights(CFG, torch.bfloat16, seed=2)
    cap = start + 8
    p = lower(CFG, ScheduleConfig(dtype="bf16", capacity=cap, n_sms=4))
    vm = ReferenceVM(pack(p, assign(p, 4)), program_weights(CFG, hf))
    eager = EagerDecoder(CFG, hf, cap)
    g = torch.Generator().manual_seed(5)
    for l in range(CFG.n_layers):
        for kind, store in (("k", eager.k), ("v", eager.v)):
            hist = torch.randn(CFG.n_kv_heads, start, CFG.head_dim, generator=g).to(torch.bfloat16)
            store[l, :, :start] = hist
            # the program's keys are in interleaved-pair order
            prog = hist if kind == "v" else hist.view(CFG.n_kv_heads, start, 2, -1).transpose(2, 3).reshape(hist.shape)
            vm.buffer(f"{kind}_cache.{l}")[:, :start] = write(prog)
    tok, worst = 9, 0.0
    for pos in range(start, start + 3):
        out = vm.step({"token": tok, "pos": pos})
        e = eager.step(tok, pos)
        worst = max(worst, VS_EAGER["bf16"].error(out["logits"], e))
        tok = int(e.argmax())
    return worst


def test_hand_written_history_is_read_as_swizzle_wrote_it():
    """Rows written through swizzle() decode as the eager model does; the same rows written in order do
    not (so the check sees the layout)."""
    tol = VS_EAGER["bf16"]
    assert _decode_from_history(21, swizzle) <= tol.value
    assert _decode_from_history(21, lambda rows: rows) > 10 * tol.value
