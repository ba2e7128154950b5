"""Runtime inputs: which buffer carries the token id and the position, and their bounds, come from the
opcodes' slot roles (instructions/spec.py), and bad values are refused on the host by name."""
import pytest

from megavm.core.errors import InputError
from megavm.instructions.spec import POSITION, TOKEN
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.models import PRESETS
from megavm.vm.compile import compile
from megavm.vm.inputs import check_inputs, input_limits, input_roles

CFG = PRESETS["tiny"]


@pytest.mark.parametrize("unfused", [False, True], ids=["fused", "unfused"])
def test_roles_and_bounds_come_from_the_specs(unfused):
    sc = ScheduleConfig(dtype="f32", capacity=40, n_sms=4, fuse_rope=not unfused, fuse_norm=not unfused,
                        fuse_residual=not unfused, fuse_argmax=not unfused)
    packed = compile(CFG, sc)
    assert input_roles(packed) == {TOKEN: "token", POSITION: "pos"}
    assert input_limits(packed) == {"token": (TOKEN, CFG.vocab), "pos": (POSITION, 40)}


def test_bad_inputs_are_named():
    packed = compile(CFG, ScheduleConfig(dtype="f32", capacity=40, n_sms=4))
    assert check_inputs(packed, {"token": CFG.vocab - 1, "pos": 39}) == {"token": CFG.vocab - 1, "pos": 39}
    for inputs, words in (({"token": CFG.vocab, "pos": 0}, f"token id {CFG.vocab} for input 'token'"),
                          ({"token": 0, "pos": 40}, "position 40 for input 'pos' is outside [0, 40)"),
                          ({"token": -1, "pos": 0}, "token id -1"),
                          ({"token": True, "pos": 0}, "'token' must be an int, got bool"),
                          ({"token": 0}, "missing runtime inputs ['pos']"),
                          ({"token": 0, "pos": 0, "x": 1}, "unknown runtime inputs ['x']")):
        with pytest.raises(InputError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            check_inputs(packed, inputs)


def test_generation_is_checked_before_anything_runs():
    """MegakernelVM.generate's checks, on the host: every prompt token, the last position, n and start_pos."""
    from megavm.vm.inputs import check_generation
    packed = compile(CFG, ScheduleConfig(dtype="f32", capacity=32, n_sms=4))
    assert check_generation(packed, [3, 5], 29, 2) == ([3, 5], 30, {})
    for args, words in ((([3, CFG.vocab], 4, 0), f"token id {CFG.vocab}"),
                        (([3, 5], 30, 2), "position 32 for input 'pos'"),
                        (([], 4, 0), "at least one prompt token"),
                        (([3], 0, 0), "n >= 1"),
                        (([3], 2.0, 0), "n must be an int, got float"),
                        (([3], True, 0), "n must be an int, got bool"),
                        (([3], 4, -1), "position -1"),
                        (([3.7], 4, 0), "'token' must be an int, got float")):
        with pytest.raises(InputError, match=words):
            check_generation(packed, *args)


def test_ablation_switches_set_their_launch_flags():
    from megavm.core.abi import Flag
    from megavm.vm.megakernel import Ablations
    assert Ablations().flags == 0
    assert Ablations(direct_loads=True).flags == Flag.DIRECT_LOADS
    assert Ablations(attn_history=False).flags == Flag.NO_ATTN_HISTORY
    assert Ablations(evict_first=False).flags == Flag.WEIGHTS_EVICT_NORMAL
    assert Ablations(direct_loads=True, attn_history=False, evict_first=False).flags == 7
    assert Ablations(host_loop=True).flags == Ablations(rebuild_tables=True).flags == 0   # host-side switches


def test_tensor_inputs_are_checked_by_name_and_element():
    """A tensor input: exactly its buffer's shape, floating values for an f32 buffer, each finite."""
    import numpy as np
    import torch

    from tests.programs import linear_program
    packed = linear_program(3, 8, 16, res=True, mult=1.0)
    x, res = torch.randn(3, 16), torch.randn(3, 8)
    got = check_inputs(packed, {"x": x.double(), "res": res.numpy()})
    assert got["x"].dtype == torch.float32 and torch.equal(got["x"], x.double().float())
    assert torch.equal(got["res"], res)
    nan = x.clone()
    nan[2, 5] = float("nan")
    for inputs, words in (({"x": x[:2], "res": res}, "'x' has shape (2, 16), the program expects (3, 16)"),
                          ({"x": x.long(), "res": res}, "'x' must hold floating-point values, got torch.int64"),
                          ({"x": nan, "res": res}, "'x' holds nan at [2, 5]; values must be finite"),
                          ({"x": x.tolist(), "res": res}, "'x' must be a tensor of shape (3, 16), got list"),
                          ({"x": np.array([["a"] * 16] * 3), "res": res}, "'x' must be numbers")):
        with pytest.raises(InputError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            check_inputs(packed, inputs)


def test_an_unknown_opcode_is_left_for_the_kernel_to_trap():
    """The host side of a VM reads a packed program whose opcode no spec knows without raising, so
    that the kernel's dispatch traps on it and names it (tests/gpu: test_unknown_opcode_is_reported)."""
    from megavm.vm.inputs import RuntimeInputs
    from megavm.vm.loop import loop_contract
    packed = compile(CFG, ScheduleConfig(dtype="f32", capacity=40, n_sms=4))
    good = RuntimeInputs(packed)
    bad = type(packed).from_bytes(packed.to_bytes())
    bad.meta = packed.meta
    bad.instrs[0]["opcode"] = 99
    assert RuntimeInputs(bad).check({"token": 3, "pos": 1}) == good.check({"token": 3, "pos": 1})
    assert loop_contract(bad) == loop_contract(packed)


def test_generation_holds_the_other_inputs_checked():
    """A program with an adapter id: generate takes it once, checked as a step's inputs are."""
    from megavm.vm.inputs import check_generation
    sc = ScheduleConfig(dtype="f32", capacity=32, n_sms=4, lora_adapters=2, lora_rank=2, lora_targets=("q",))
    packed = compile(CFG, sc)
    assert check_generation(packed, [3], 4, 0, {"adapter": 2}) == ([3], 4, {"adapter": 2})
    for others, words in (({}, r"missing runtime inputs \['adapter'\]"),
                          ({"adapter": 3}, r"adapter id 3 for input 'adapter' is outside \[0, 3\)"),
                          ({"adapter": 1, "pos": 0}, "generate feeds 'token' and 'pos' itself")):
        with pytest.raises(InputError, match=words):
            check_generation(packed, [3], 4, 0, others)
