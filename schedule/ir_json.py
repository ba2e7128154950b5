"""Reading the IR's JSON form (docs/ir.md) strictly: exactly the types the schema names (no bool for an
int, no float for an int, no string for a list), every integer within what the packed tables hold,
names that the names table can carry, and no RecursionError, OverflowError or NaN getting through.
Every refusal is one UserError naming the entry and the field. Plain JSON only: nothing is executed."""
from __future__ import annotations

import json
import math

from megavm.core import abi
from megavm.core.errors import UserError
from megavm.core.types import Buffer, BufferKind, DType

I32 = (-(1 << 31), (1 << 31) - 1)
U32 = (0, (1 << 32) - 1)
U63 = (0, (1 << 63) - 1)
MAX_NAME = 1024
MAX_ELEMENTS = 1 << 40              # elements of one buffer: past any GPU's memory, within int64 shapes
TASK_KEYS = {"op", "in", "out", "waits", "signal", "params", "label", "bytes", "flops"}
OPTIONAL_TASK_KEYS = {"inline"}        # written only when true


class Malformed(UserError):
    """A JSON document that is not a megavm program; the message names where."""


def _constant(name: str):
    raise Malformed(f"not a megavm program: {name} is not a number JSON holds")


def parse(text) -> dict:
    """The JSON document, or Malformed (never RecursionError, never NaN or Infinity)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise Malformed(f"not a megavm program: not UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        return json.loads(text, parse_constant=_constant)
    except RecursionError:
        raise Malformed("not a megavm program: nested too deeply") from None
    except ValueError as e:         # JSONDecodeError, and integers too long to parse
        raise Malformed(f"not a megavm program: {str(e)[:200]}") from None


def integer(v, where: str, bounds: tuple[int, int]) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise Malformed(f"malformed megavm program: {where} is {_kind(v)}, not an integer")
    if not bounds[0] <= v <= bounds[1]:
        raise Malformed(f"malformed megavm program: {where}={v} is outside [{bounds[0]}, {bounds[1]}]")
    return v


def array(v, where: str, most: int | None = None) -> list:
    if not isinstance(v, list):
        raise Malformed(f"malformed megavm program: {where} is {_kind(v)}, not a list")
    if most is not None and len(v) > most:
        raise Malformed(f"malformed megavm program: {where} has {len(v)} entries; the ABI holds {most}")
    return v


def flag(v, where: str) -> bool:
    if not isinstance(v, bool):
        raise Malformed(f"malformed megavm program: {where} is {_kind(v)}, not true or false")
    return v


def text(v, where: str) -> str:
    if not isinstance(v, str):
        raise Malformed(f"malformed megavm program: {where} is {_kind(v)}, not a string")
    return v


def _kind(v) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


def buffer(row, i: int) -> Buffer:
    where = f"buffer {i}"
    row = array(row, where)
    if len(row) not in (4, 5):
        raise Malformed(f"malformed megavm program: {where} has {len(row)} fields, not [name, kind, dtype, shape] "
                        "or [name, kind, dtype, shape, \"tagged\"]")
    name, kind, dtype = text(row[0], f"{where} name"), text(row[1], f"{where} kind"), text(row[2], f"{where} dtype")
    if not name or len(name) > MAX_NAME or "\0" in name:
        raise Malformed(f"malformed megavm program: {where} name {name[:40]!r} must be 1 to {MAX_NAME} characters, "
                        "no NUL")
    if kind not in BufferKind.__members__ or dtype not in DType.__members__:
        bad = ("kind", kind, list(BufferKind.__members__)) if kind not in BufferKind.__members__ else \
            ("dtype", dtype, list(DType.__members__))
        raise Malformed(f"malformed megavm program: {where} ({name!r}) {bad[0]} {bad[1]!r} is not one of {bad[2]}")
    shape = tuple(integer(s, f"{where} ({name!r}) shape[{k}]", (1, I32[1]))
                  for k, s in enumerate(array(row[3], f"{where} ({name!r}) shape", abi.MAX_DIMS)))
    if not shape or math.prod(shape) > MAX_ELEMENTS:
        raise Malformed(f"malformed megavm program: {where} ({name!r}) shape {list(shape)} must have 1 to "
                        f"{abi.MAX_DIMS} axes and at most {MAX_ELEMENTS} elements")
    if len(row) == 5 and row[4] != "tagged":
        raise Malformed(f"malformed megavm program: {where} ({name!r}) field 5 is {row[4]!r}, not \"tagged\"")
    return Buffer(name, BufferKind[kind], DType[dtype], shape, len(row) == 5)


def param(v, where: str):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Malformed(f"malformed megavm program: {where} is {_kind(v)}, not a number")
    if isinstance(v, float) and not math.isfinite(v):
        raise Malformed(f"malformed megavm program: {where}={v} is not finite")
    return integer(v, where, (I32[0], U32[1])) if isinstance(v, int) else v


def task(t, i: int) -> dict:
    """One task's fields, checked (the Task is built by the caller)."""
    where = f"task {i}"
    if not isinstance(t, dict):
        raise Malformed(f"malformed megavm program: {where} is {_kind(t)}, not an object")
    if not TASK_KEYS <= set(t) <= TASK_KEYS | OPTIONAL_TASK_KEYS:
        missing, extra = sorted(TASK_KEYS - set(t)), sorted(set(t) - TASK_KEYS - OPTIONAL_TASK_KEYS)
        what = f"lacks {missing}" if missing else f"has unknown {extra}"
        raise Malformed(f"malformed megavm program: {where} {what}")
    params = t["params"]
    if not isinstance(params, dict):
        raise Malformed(f"malformed megavm program: {where} params is {_kind(params)}, not an object")
    waits = []
    for k, w in enumerate(array(t["waits"], f"{where} waits", abi.MAX_WAITS)):
        w = array(w, f"{where} wait {k}")
        if len(w) not in (2, 3) or (len(w) == 3 and w[2] != "polled"):
            raise Malformed(f"malformed megavm program: {where} wait {k} is not [counter, threshold] or "
                            "[counter, threshold, \"polled\"]")
        waits.append((integer(w[0], f"{where} wait {k} counter", (0, I32[1])),
                      integer(w[1], f"{where} wait {k} threshold", U32), len(w) == 3))
    return dict(
        op=integer(t["op"], f"{where} op", (0, 0xFFFF)),
        ins=tuple(integer(b, f"{where} input {k}", (-1, I32[1]))         # -1: an optional slot left empty
                  for k, b in enumerate(array(t["in"], f"{where} in", abi.MAX_INPUTS))),
        outs=tuple(integer(b, f"{where} output {k}", (-1, I32[1]))
                   for k, b in enumerate(array(t["out"], f"{where} out", abi.MAX_OUTPUTS))),
        waits=waits, signal=integer(t["signal"], f"{where} signal", (-1, I32[1])),
        params={k: param(v, f"{where} param {k!r}") for k, v in params.items()},
        label=text(t["label"], f"{where} label"), bytes=integer(t["bytes"], f"{where} bytes", U63),
        flops=integer(t["flops"], f"{where} flops", U63), inline=flag(t.get("inline", False), f"{where} inline"))
