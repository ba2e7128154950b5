"""LoRA adapters in the program (schedule/lora_layout.py, instructions/lora.py) on ReferenceVM: every
adapter id of one packed program decodes as megavm's eager model with that adapter applied unmerged;
id 0 is the base model; switching ids needs nothing but the step's input. (tests/schedule/
test_adapters.py holds the adapter files against peft; tests/megavm/test_lora_cli.py the whole run.)"""
import pytest
import torch

from megavm.core.errors import ConfigError, InputError
from megavm.schedule.adapters import random_adapter
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.lora_layout import LoraLayout, lora_weights
from megavm.schedule.models import ModelConfig
from megavm.schedule.source import load_model
from megavm.schedule.weights import program_weights
from megavm.vm.compile import compile
from megavm.vm.reference import ReferenceVM
from megavm.vm.verify import VS_REFERENCE, compare, eager_decode, greedy, reference_step

CFG = ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96, vocab=256)
PROMPT, N, CAP = [5, 17, 200], 6, 16


ADAPTERS = [random_adapter(CFG, 4, ("q", "k", "v", "o"), 1, 0.5),
            random_adapter(CFG, 2, ("v", "gate", "down"), 2, 2.0),
            random_adapter(CFG, 4, ("q", "k", "v", "o", "gate", "up", "down"), 3, 1.0)]
TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@pytest.fixture(scope="module", params=[0, 1], ids=["combine-group", "combine-per-head"])
def setup(request):
    """The program with a combine per KV head, or one per query head (each producing its own rows of the
    o-projection's partial products)."""
    model = load_model("tiny", dtype="f32")
    model.cfg = CFG
    from megavm.schedule.weights import random_hf_weights
    model.hf = random_hf_weights(CFG, torch.float32, seed=4)
    sc = ScheduleConfig(dtype="f32", capacity=CAP, n_sms=6, lora_adapters=len(ADAPTERS), lora_rank=4,
                        lora_targets=TARGETS, combine_q_heads=request.param)
    packed = compile(CFG, sc)
    w = program_weights(CFG, model.hf)
    w |= lora_weights(LoraLayout.of(CFG, sc), ADAPTERS, w)
    return model, packed, w


@pytest.mark.parametrize("aid", [0, 1, 2, 3])
def test_every_adapter_id_matches_eager_unmerged(setup, aid):
    model, packed, w = setup
    vm = ReferenceVM(packed, w)
    got = greedy(reference_step(vm, {"adapter": aid}), PROMPT, N)
    want = eager_decode(model, PROMPT, N, CAP, adapter=ADAPTERS[aid - 1] if aid else None)
    c = compare(f"adapter {aid}", got, want, VS_REFERENCE["f32"])
    assert c.ok, str(c)
    base = eager_decode(model, PROMPT, N, CAP)
    if aid:       # the adapter changes the logits (so the check above could fail)
        assert (got.logits[0] - base.logits[0]).abs().max() > 1e-2 * base.logits[0].abs().max(), f"{aid=}"


def test_switching_ids_in_one_vm(setup):
    """Steps with different ids on one VM, one packed program: each as a fresh decode with that id."""
    model, packed, w = setup
    vm = ReferenceVM(packed, w)
    for aid in (2, 0, 3, 1):
        got = greedy(reference_step(vm, {"adapter": aid}), PROMPT, 3)
        want = eager_decode(model, PROMPT, 3, CAP, adapter=ADAPTERS[aid - 1] if aid else None)
        assert compare(f"adapter {aid}", got, want, VS_REFERENCE["f32"]).ok, f"{aid=}"


def test_checking_mode_finds_no_race(setup):
    _, packed, w = setup
    for seed in range(3):
        vm = ReferenceVM(packed, w, check=True, seed=seed)
        greedy(reference_step(vm, {"adapter": 3}), PROMPT, 2)


def test_bad_ids_and_adapters_are_refused(setup):
    _, packed, w = setup
    vm = ReferenceVM(packed, w)
    for bad in (4, -1):
        with pytest.raises(InputError, match=f"{bad}.*'adapter'.*outside \\[0, 4\\)"):
            vm.step({"token": 1, "pos": 0, "adapter": bad})
    with pytest.raises(InputError, match=r"missing runtime inputs \['adapter'\]"):
        vm.step({"token": 1, "pos": 0})
    layout = LoraLayout.of(CFG, ScheduleConfig(lora_adapters=1, lora_rank=2, lora_targets=("q",)))
    with pytest.raises(ConfigError, match="rank 4 on .* does not fit the program's rank 2"):
        lora_weights(layout, ADAPTERS[:1], w)
    with pytest.raises(ConfigError, match="holds 1 adapters, 2 given"):
        lora_weights(layout, ADAPTERS[:2], w)
    for sc, words in ((ScheduleConfig(lora_adapters=1, lora_rank=4, lora_targets=("lm_head",)), "lora_targets"),
                      (ScheduleConfig(lora_adapters=1, lora_rank=0, lora_targets=("q",)), "lora_rank=0"),
                      (ScheduleConfig(lora_adapters=1, lora_rank=4, lora_targets=("q",), fuse_norm=False), "fuse_norm")):
        with pytest.raises(ConfigError, match=words):
            compile(CFG, sc)
