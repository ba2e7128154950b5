"""Tagged hand-offs on the GPU (docs/ir.md, instructions/tagged.cuh): a word that never arrives times out
with a dump and leaves the VM usable; tagged and plain programs compute the same bits. (The lowering
ablations' bitwise equality, tagged=False among them, is in test_megakernel.py.)"""
import time

import numpy as np
import pytest
import torch

from megavm.core import abi
from megavm.core.errors import DeviceError
from megavm.core.types import BufferKind
from megavm.vm.megakernel import MegakernelVM
from megavm.vm.reference import ReferenceVM

pytestmark = pytest.mark.cuda


def _embed_then_project(tagged: bool):
    """Two tasks by hand: EMBED writes x, RMS_LINEAR (one 16-row tile) reads it, its wait polled when
    x is tagged. Packed for one SM."""
    from megavm.core.types import DType
    from megavm.instructions import Op
    from megavm.schedule.ir import Program, Task, Wait
    from megavm.vm.compile import compile_program
    p = Program(meta={"inputs": ["token"], "outputs": ["y"]})
    K = BufferKind
    table = p.add_buffer("table", K.WEIGHT, DType.F32, (8, 64))
    token = p.add_buffer("token", K.INPUT, DType.I32, (1,))
    x = p.add_buffer("x", K.ACTIVATION, DType.F32, (64,), tagged=tagged)
    p.add_buffer("x_elsewhere", K.ACTIVATION, DType.F32, (64,))
    gamma = p.add_buffer("gamma", K.WEIGHT, DType.F32, (64,))
    wq = p.add_buffer("w", K.WEIGHT, DType.F32, (16, 64))
    y = p.add_buffer("y", K.OUTPUT, DType.F32, (16,))
    c = p.add_counter("x")
    p.add_task(Task(Op.EMBED, (table, token), (x,), (), c, {"col0": 0, "ncols": 64, "scale": 1.0}, "embed"))
    p.add_task(Task(Op.RMS_LINEAR, (x, gamma, wq), (y,), (Wait(c, 1, polled=tagged),), -1,
                    {"row0": 0, "nrows": 16, "eps": 1e-5, "norm": 1}, "proj"))
    g = torch.Generator().manual_seed(0)
    w = {"table": torch.randn(8, 64, generator=g), "gamma": torch.rand(64, generator=g) + 0.5,
         "w": torch.randn(16, 64, generator=g)}
    return compile_program(p, 1), {k: v.cuda() for k, v in w.items()}


def test_tag_poll_timeout_reports_dump_then_recovers():
    """A tagged word whose writer never stores it (EMBED's output pointed at another buffer): the
    reader's poll times out within the wait timeout, with a dump naming the buffer, the tag it saw and
    the tag it needs; the good program then runs on the same weights, as ReferenceVM does."""
    packed, w = _embed_then_project(tagged=True)
    assert packed.instrs[1]["flags"] & abi.INSTR_POLLED_WAIT0, "the projection's wait is not polled"
    bad = type(packed).from_bytes(packed.to_bytes())
    bad.meta = packed.meta
    embed = int(np.flatnonzero(bad.instrs["opcode"] == 0)[0])
    bad.instrs[embed]["outputs"][0] = packed.buffer_id("x_elsewhere")
    vm = MegakernelVM(bad, w)
    t0 = time.time()
    with pytest.raises(DeviceError) as ei:
        vm.run({"token": 3}).wait()
    assert time.time() - t0 < 2.0
    d = ei.value.dump
    assert d["status"] == abi.Status.TAG_TIMEOUT and d["counter"] == packed.buffer_id("x"), d
    assert d["value"] == 0 and d["target"] == 1, d       # never written; step 0's tag is 1
    assert "poll timed out" in str(ei.value) and "'x'" in str(ei.value), str(ei.value)
    good = MegakernelVM(packed, w)
    for step in range(3):            # tags of later steps too, on a VM of its own
        tok = 2 + step
        got = good.run({"token": tok}).outputs()["y"]
        want = ReferenceVM(packed, w, device="cuda").step({"token": tok})["y"]
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (step, (got - want).abs().max())
    plain, _ = _embed_then_project(tagged=False)
    assert torch.equal(MegakernelVM(plain, w).run({"token": 4}).outputs()["y"], got), "tagged and plain differ"
