"""Every opcode, once: its spec (operands, params, regions, cost), its torch reference, and beside it
the device implementation (a .cuh the megakernel includes)."""
from instructions import attention, embed, kv_append, lm_head, norm, residual, rms_linear, rope, swiglu
from instructions.spec import MAX_PARAMS, Access, Op, OpSpec, Slot, Stream

SPECS: dict[Op, OpSpec] = {s.op: s for s in (
    embed.SPEC, rms_linear.SPEC, rope.SPEC, kv_append.SPEC, swiglu.SPEC, residual.SPEC,
    attention.PARTIAL, attention.COMBINE, lm_head.TILE, lm_head.ARGMAX,
    norm.SPEC, residual.LINEAR, residual.ADD, rope.ROPE, kv_append.APPEND)}

assert sorted(SPECS) == list(Op), "every Op needs exactly one spec"

MAX_INPUTS = max(len(s.inputs) for s in SPECS.values())
MAX_OUTPUTS = max(len(s.outputs) for s in SPECS.values())
MAX_STREAMS = 2


def spec(opcode: int) -> OpSpec:
    try:
        return SPECS[Op(opcode)]
    except ValueError:
        raise ValueError(f"unknown opcode {opcode}") from None


def op_name(opcode: int) -> str:
    try:
        return Op(opcode).name
    except ValueError:
        return f"opcode {opcode}"


__all__ = ["SPECS", "Op", "OpSpec", "Slot", "Access", "Stream", "MAX_PARAMS", "MAX_INPUTS", "MAX_OUTPUTS",
           "MAX_STREAMS", "spec", "op_name"]
