"""LoRA adapters in the megakernel (marker: cuda): every buffer every task writes against ReferenceVM
for each adapter id of one program on odd shapes, switching ids between launches, an out-of-range id
trapped by the kernel, and `megavm run --adapter` on the GPU against peft."""
from dataclasses import replace

import pytest
import torch

from megavm.core.errors import DeviceError
from megavm.schedule.adapters import random_adapter
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.lora_layout import LoraLayout, lora_weights
from megavm.vm.megakernel import MegakernelVM
from megavm.vm.reference import ReferenceVM
from tests.gpu.harness import build, rel_err, written
from tests.gpu.test_megakernel import ODD, ODD_LC, TOL

pytestmark = pytest.mark.cuda
ALL = ("q", "k", "v", "o", "gate", "up", "down")
ADAPTERS = [random_adapter(ODD, 8, ("q", "k", "v", "o"), 1, 0.5), random_adapter(ODD, 3, ("v", "gate", "down"), 2, 2.0),
            random_adapter(ODD, 8, ALL, 3, 1.0)]


def lora_vms(dtype: str, n_sms=None, combine_q_heads=0):
    sc = ScheduleConfig(dtype=dtype, **ODD_LC, lora_adapters=len(ADAPTERS), lora_rank=8, lora_targets=ALL,
                        combine_q_heads=combine_q_heads)
    packed, w, _ = build(ODD, sc, seed=3, n_sms=n_sms)
    w |= lora_weights(LoraLayout.of(ODD, replace(sc, n_sms=packed.n_queues)), ADAPTERS, w)
    return packed, MegakernelVM(packed, w), ReferenceVM(packed, w, device="cuda")


@pytest.mark.parametrize("dtype,n_sms,q_heads", [("f32", 7, 0), ("f32", None, 0), ("bf16", 7, 0), ("bf16", None, 0),
                                                 ("bf16", None, 1)])
def test_every_adapter_id_matches_reference(dtype, n_sms, q_heads):
    """q_heads 1: a combine per query head, each producing its rows' partial products for the o tiles."""
    packed, gpu, ref = lora_vms(dtype, n_sms, q_heads)
    tok = 17
    for i, pos in enumerate(range(0, 45, 4)):
        aid = i % 4
        res = gpu.run({"token": tok, "pos": pos, "adapter": aid})
        out = ref.step({"token": tok, "pos": pos, "adapter": aid})
        res.wait()
        for b in written(packed):
            if packed.names[b].startswith("lora_u.") and aid == 0:
                continue                     # id 0 writes no partial products; no one reads them
            err = rel_err(gpu.t[b], ref.t[b])
            assert err <= TOL[dtype], f"{dtype=} {n_sms=} {pos=} {aid=} buffer {packed.names[b]}: {err=:.2e}"
        assert res.token == int(out["next_token"][0]), f"{dtype=} {pos=} {aid=}"
        tok = res.token


def test_switching_ids_changes_only_the_input():
    """Position 0 under each id in turn on one VM: each equal to ReferenceVM's with that id, and the
    ids give different logits (so the adapter is applied)."""
    _, gpu, ref = lora_vms("f32")
    seen = []
    for aid in (2, 0, 3, 1, 0):
        lg = gpu.run({"token": 5, "pos": 0, "adapter": aid}).logits.clone()
        want = ref.step({"token": 5, "pos": 0, "adapter": aid})["logits"]
        assert rel_err(lg, want) <= TOL["f32"], f"{aid=}"
        seen.append(lg)
    assert torch.equal(seen[1], seen[4])
    for a in range(4):
        for b in range(a + 1, 4):
            assert (seen[a] - seen[b]).abs().max() > 1e-3, (a, b)


def test_out_of_range_id_traps_in_the_kernel():
    """An id past the adapters the program holds, put into the input buffer behind the host's back:
    the kernel refuses it with a dump rather than reading past B."""
    _, gpu, _ = lora_vms("f32")
    gpu.run({"token": 5, "pos": 0, "adapter": 1}).wait()
    gpu.buffer("adapter").fill_(9)
    with pytest.raises(DeviceError, match="9"):
        gpu.relaunch().wait()
    gpu.run({"token": 5, "pos": 0, "adapter": 2}).wait()      # and the VM runs on


@pytest.mark.parametrize("family", ["llama-untied", "qwen2-bias"])
def test_megavm_run_with_adapters_on_the_gpu_matches_peft(family, tmp_path):
    """As tests/megavm/test_lora_run.py on the CPU; 2e-5: the megakernel's 1e-5 to ReferenceVM plus
    ReferenceVM's 1e-5 to peft."""
    pytest.importorskip("peft")
    from tests.megavm.test_lora_run import check_run_with_adapters
    check_run_with_adapters(family, tmp_path, "cuda", 2e-5)


def test_in_kernel_generation_with_an_adapter_equals_reference():
    """generate(..., inputs={"adapter": id}): one launch, the id held for every step; the tokens of
    ReferenceVM's step-by-step greedy decode with that id."""
    from megavm.vm.verify import greedy, reference_step
    _, gpu, ref = lora_vms("f32")
    want = greedy(reference_step(ref, {"adapter": 2}), [5, 17], 8).tokens
    assert gpu.generate([5, 17], 8, inputs={"adapter": 2}) == want
