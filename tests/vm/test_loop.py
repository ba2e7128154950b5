"""The in-kernel token loop's contract (vm/loop.py): which programs may run many steps in one launch."""
import pytest

from megavm.core.types import BufferKind, DType
from megavm.instructions import Op
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.ir import Task
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS
from megavm.vm.loop import LoopError, loop_contract
from megavm.vm.pack import pack


def _lowered():
    p = lower(PRESETS["tiny"], ScheduleConfig(dtype="f32", capacity=32, n_sms=5))
    return p, pack(p, assign(p, 5))


def test_lowered_program_chains_on_the_argmax_counter():
    p, pk = _lowered()
    done = next(t.signal for t in p.tasks if t.opcode == Op.ARGMAX)
    assert loop_contract(pk) == done
    assert p.counters[done].name == "done"


def test_partial_wait_on_the_lm_head_is_refused():
    """ARGMAX waiting for all but one LM-head tile would let the next step start under that tile."""
    _, pk = _lowered()
    i = next(i for i, r in enumerate(pk.instrs) if r["opcode"] == Op.ARGMAX)
    pk.instrs[i]["waits"][0]["threshold"] -= 1
    with pytest.raises(LoopError, match=rf"{len(pk.instrs) - 1} tasks finish outside the step end argmax.*embed\[0\]"):
        loop_contract(pk)


def test_task_outside_the_step_end_is_named():
    p, _ = _lowered()
    p.add_buffer("side", BufferKind.ACTIVATION, DType.F32, (p.buffers[p.buffer_id("x.0")].shape[0],))
    c = p.add_counter("side")
    x0 = next(t for t in p.tasks if t.opcode == Op.EMBED)
    p.add_task(Task(int(Op.EMBED), x0.inputs, (p.buffer_id("side"),), (), c, dict(x0.params), "side_embed", 0, 0))
    with pytest.raises(LoopError, match="1 tasks finish outside the step end argmax.*side_embed"):
        loop_contract(pack(p, assign(p, 5)))


def test_program_without_argmax_is_refused():
    p, pk = _lowered()
    i = next(i for i, r in enumerate(pk.instrs) if r["opcode"] == Op.ARGMAX)
    pk.instrs[i]["opcode"] = int(Op.RMS_LINEAR)
    with pytest.raises(LoopError, match="exactly one task that writes the next token.*has 0"):
        loop_contract(pk)
