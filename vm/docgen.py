"""The generated tables of the docs: in docs/abi.md the opcode codes, the structs, the constants and
enum codes, the capacities and build knobs; docs/opcodes.md's reference of every opcode. Each is a
block between `<!-- BEGIN GENERATED name -->` and `<!-- END GENERATED name -->`, rewritten by
`python3 -m megavm.vm.codegen`; the prose around the blocks is written by hand."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import numpy as np

from megavm.core import abi, limits
from megavm.instructions import SPECS
from megavm.instructions.spec import OpSpec, Slot

BLOCK = re.compile(r"(<!-- BEGIN GENERATED (\w+) -->\n)(.*?)(<!-- END GENERATED \2 -->)", re.S)
C_TYPES = {"u1": "uint8", "u2": "uint16", "u4": "uint32", "u8": "uint64", "i1": "int8", "i4": "int32", "i8": "int64"}


def _summary(s: OpSpec) -> str:
    """The first paragraph of the spec's doc, without its leading "NAME: "."""
    return " ".join(s.doc.strip().split("\n\n")[0].split()).removeprefix(f"{s.name}: ")


def _slot(x: Slot) -> str:
    return f"`{x.name}` {'/'.join(k.name for k in x.kinds)} {'/'.join(d.name.lower() for d in x.dtypes)}"


def opcode_table() -> str:
    rows = ["| code | opcode | inputs | outputs | params |", "|---:|---|---|---|---|"]
    for code, s in SPECS.items():
        params = ", ".join(f"`{p.name}`" for p in s.params) or "none"
        rows.append(f"| {code} | [`{s.name}`](opcodes.md#{s.module}) | {', '.join(f'`{x.name}`' for x in s.inputs)} | "
                    f"{', '.join(f'`{x.name}`' for x in s.outputs)} | {params} |")
    return "\n".join(rows) + "\n"


def _role(x: Slot) -> str:
    if not x.role:
        return ""
    return x.role + (f", < `{x.bound[0]}`.shape[{x.bound[1]}]" if x.bound else "")


def _hook(s: OpSpec) -> str:
    return f"; pre-wait hook `{s.prewait.fn}({', '.join(s.prewait.args)})`" if s.prewait else ""


def opcode_reference() -> str:
    out = []
    for code, s in SPECS.items():
        out += [f'<a id="{s.module}"></a>', f"### {code}: `{s.name}`", "",
                f"{_summary(s)} (`instructions/{s.module}.py`, `.cuh`{_hook(s)})", "",
                "| slot | io | kinds | dtypes | runtime input |", "|---|---|---|---|---|"]
        for io, slots in (("in", s.inputs), ("out", s.outputs)):
            out += [f"| `{x.name}` | {io} {k} | {'/'.join(kd.name for kd in x.kinds)} | "
                    f"{'/'.join(d.name.lower() for d in x.dtypes)} | {_role(x)} |" for k, x in enumerate(slots)]
        if s.params:
            out += ["", "| word | param | type | meaning |", "|---:|---|---|---|"]
            out += [f"| {k} | `{p.name}` | {'f32' if p.f32 else 'i32'} | {p.doc} |" for k, p in enumerate(s.params)]
        out.append("")
    return "\n".join(out)


def _ctype(dt: np.dtype) -> str:
    base, shape = (dt.subdtype if dt.subdtype else (dt, ()))
    name = next((k for k, v in abi.STRUCTS.items() if v == base), None) or C_TYPES[base.str.lstrip("<>|=")]
    return name + "".join(f"[{n}]" for n in shape)


def structs() -> str:
    out = []
    for name, dt in abi.STRUCTS.items():
        out += [f"`{name}`: {dt.itemsize} bytes", "", "| offset | bytes | field | type |", "|---:|---:|---|---|"]
        for field in dt.names:
            fdt, off = dt.fields[field][:2]
            out.append(f"| {off} | {fdt.itemsize} | `{field}` | `{_ctype(fdt)}` |")
        out.append("")
    return "\n".join(out)


def constants() -> str:
    rows = ["| name | value |", "|---|---:|"]
    rows += [f"| `{k}` | {hex(v) if k == 'MEGAVM_MAGIC' else v} |" for k, v in abi.CONSTANTS.items()]
    rows += [f"| `{k}` | {v} |" for k, v in abi.ENUMS.items()]
    return "\n".join(rows) + "\n"


def limit_table() -> str:
    rows = ["| name | value | kind | meaning |", "|---|---:|---|---|"]
    rows += [f"| `{x.name}` | {x.value} | capacity | {x.doc} |" for x in limits.CAPACITIES]
    rows += [f"| `{x.name}` | {x.value} | build knob | {x.doc} |" for x in limits.KNOBS]
    return "\n".join(rows) + "\n"


BLOCKS: dict[str, dict[str, Callable[[], str]]] = {
    "docs/abi.md": {"opcodes": opcode_table, "structs": structs, "constants": constants, "limits": limit_table},
    "docs/opcodes.md": {"reference": opcode_reference},
}


def render(text: str, blocks: dict[str, Callable[[], str]]) -> str:
    return BLOCK.sub(lambda m: m.group(1) + blocks[m.group(2)]() + m.group(4) if m.group(2) in blocks else m.group(0),
                     text)


def block_names(text: str) -> list[str]:
    return [m.group(2) for m in BLOCK.finditer(text)]


def generated(root: Path) -> dict[Path, str]:
    """Each docs file with its generated blocks rewritten (files that are not there are left out)."""
    out = {}
    for name, blocks in BLOCKS.items():
        p = root / name
        if p.exists():
            out[p] = render(p.read_text(), blocks)
    return out
