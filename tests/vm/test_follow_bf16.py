"""FollowKVCodes (vm/verify.py) on a bf16 KV cache: two VMs whose f32 rows differ in their last bits round
an element on either side of a bf16 midpoint; the oracle takes the other VM's row where each element is
a valid rounding of its own, and nowhere else."""
import dataclasses

import torch

from megavm.instructions.kv_cache import swizzle
from megavm.vm.verify import FollowKVCodes


class Cache:
    """A VM's v_cache.0 (bf16 unless said) with `row` at position 3 (as vm.buffer gives it)."""
    def __init__(self, row: torch.Tensor, dtype=torch.bfloat16):
        hist = torch.zeros(row.shape[0], 4, row.shape[1], dtype=dtype)
        hist[:, 3] = row.to(dtype)
        self.cache = swizzle(hist)

    def buffer(self, name):
        assert name == "v_cache.0"
        return self.cache


def test_a_row_across_a_bf16_midpoint_is_followed_and_a_far_one_is_not():
    rows = torch.randn(2, 64, generator=torch.Generator().manual_seed(4))
    mid = 1.00390625                                           # between bf16 1 and 1 + 2^-7
    rows[0, 1] = mid * (1 - 2 ** -22)                          # rounds down to 1
    other = rows.clone()
    other[0, 1] = mid * (1 + 2 ** -22)                         # the other VM's sum: rounds up
    f = FollowKVCodes(Cache(other))
    got = f(0, "v", 3, rows)
    assert f.followed == 1 and f.errors == 0
    assert got[0, 1] == 1.0078125 and torch.equal(got, other.bfloat16().float())
    same = FollowKVCodes(Cache(rows))
    assert torch.equal(same(0, "v", 3, rows), rows.bfloat16().float()) and same.followed == 0
    far = other.clone()
    far[1, 5] = rows[1, 5] * 1.05                               # a few bf16 steps away: not a rounding of it
    f = FollowKVCodes(Cache(far))
    assert f(0, "v", 3, rows) is None and f.errors == 1
    f = FollowKVCodes(Cache(far, torch.float32))               # an f32 cache rounds nothing: its own rows stay
    assert f(0, "v", 3, rows) is None and f.errors == 0 and f.followed == 0


def test_an_adapter_step_held_to_the_tolerance_by_following_bf16_rows():
    """Rank-8 adapters on q, k, v and o of `small` (bf16) make q . k large, so a bf16 row the VM and the eager
    model round on either side of a midpoint moved the logits by 7e-3 of their largest (over the 2^-9
    tolerance) in ReferenceVM against the eager model; following the VM's rows at those near-ties, the
    step agrees within 1e-5, with no row beyond a rounding of the oracle's."""
    from megavm.schedule.adapters import random_adapter
    from megavm.schedule.config import ScheduleConfig
    from megavm.schedule.eager import EagerDecoder
    from megavm.schedule.lora_layout import LoraLayout, lora_weights
    from megavm.schedule.models import PRESETS
    from megavm.schedule.weights import program_weights, random_hf_weights
    from megavm.vm.compile import compile
    from megavm.vm.reference import ReferenceVM
    cfg, ctx = PRESETS["small"], 128
    sc = ScheduleConfig(dtype="bf16", capacity=ctx + 16, n_sms=132, lora_adapters=1, lora_rank=8,
                        lora_targets=("q", "k", "v", "o"))
    hf = random_hf_weights(cfg, torch.bfloat16, seed=0)
    ad = random_adapter(cfg, 8, sc.lora_targets, seed=1)
    ad = dataclasses.replace(ad, a={k: v.bfloat16().float() for k, v in ad.a.items()},
                             b={k: v.bfloat16().float() for k, v in ad.b.items()})
    w = program_weights(cfg, hf)
    w |= lora_weights(LoraLayout.of(cfg, sc), [ad], w)
    vm = ReferenceVM(compile(cfg, sc), w)
    eager = EagerDecoder(cfg, hf, sc.capacity, ad)
    eager.kv_follow = follow = FollowKVCodes(vm)
    for i in range(2):
        out = vm.step({"token": 7 + i, "pos": ctx + i, "adapter": 1})
        ref = eager.step(7 + i, ctx + i)
        err = ((out["logits"] - ref).abs().max() / ref.abs().max()).item()
        assert err < 1e-5, (i, err)
    assert follow.errors == 0 and follow.followed > 0
