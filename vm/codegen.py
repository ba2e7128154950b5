"""Everything generated from the opcode specs and the limits, so no per-opcode fact is kept by hand in
a second place:

  core/limits.h            the capacities and build knobs (core/limits.py)
  instructions/opcodes.cuh the opcode enum, and per opcode a struct of accessors that read its operands
                           and params by name (no literal slot or param index in any .cuh)
  vm/kernel/dispatch.cuh   the kernel's per-opcode tables: the bodies it includes, the pre-wait hooks,
                           and the dispatch switch that traps on an unknown opcode
  docs/abi.md, docs/opcodes.md  their generated tables (vm/docgen.py)

`python3 -m megavm.vm.codegen` rewrites them; `--check` lists the stale ones and exits 1. The build
refuses stale C files, and tests/vm/test_codegen.py fails on any stale file.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from megavm.core import limits
from megavm.instructions import SPECS, activations
from megavm.instructions.spec import OpSpec

ROOT = Path(__file__).resolve().parent.parent
BANNER = "// GENERATED from the specs in instructions/ by `python3 -m megavm.vm.codegen`: do not edit."


def _accessor(ret: str, name: str, expr: str) -> str:
    return f"  static __device__ __forceinline__ {ret} {name}(const mvm_instr_t* i) {{ return {expr}; }}"


def _struct(s: OpSpec) -> list[str]:
    doc = s.doc.strip().split("\n\n")[0].replace("\n", " ")
    out = [f"// {doc}", f"struct {s.name} {{", f"  static constexpr int code = MVM_OP_{s.name};"]
    out += [_accessor("int", x.name, f"i->inputs[{k}]") for k, x in enumerate(s.inputs)]
    out += [_accessor("int", x.name, f"i->outputs[{k}]") for k, x in enumerate(s.outputs)]
    out += [_accessor("float", p.name, f"__uint_as_float(i->params[{k}])") if p.f32 else
            _accessor("int", p.name, f"(int)i->params[{k}]") for k, p in enumerate(s.params)]
    return out + ["};", ""]


def opcodes_cuh() -> str:
    out = [BANNER, "// The opcode codes, and per opcode a struct whose static functions read an instruction's",
           "// operands (buffer ids) and params by the names its spec gives them.", "#pragma once",
           '#include "../core/abi.h"', "", "enum mvm_opcode {"]
    out += [f"  MVM_OP_{s.name} = {code}," for code, s in SPECS.items()]
    out += [f"  MVM_OP_COUNT = {len(SPECS)}", "};", "", "// activation codes (instructions/activations.py)", "enum mvm_act {"]
    out += [f"  ACT_{name.upper()} = {code}," for code, name in enumerate(activations.NAMES)]
    out += ["};", ""]
    for s in SPECS.values():
        out += _struct(s)
    return "\n".join(out)


def _prewait_calls() -> dict[str, list[OpSpec]]:
    """Each pre-wait call, its arguments read through the first opcode's accessors, -> the opcodes whose
    hook and argument places (slot or param index) are the same: they share the call site."""
    groups: dict[tuple, list[OpSpec]] = {}
    for s in SPECS.values():
        if s.prewait:
            groups.setdefault((s.prewait.fn,) + tuple(s.place(a) for a in s.prewait.args), []).append(s)
    out = {}
    for ops in groups.values():
        first = ops[0]
        args = "".join(f", {first.name}::{a}(c.ins)" for a in first.prewait.args)
        out[f"{first.prewait.fn}(c{args});"] = ops
    return out


def _guests(host: OpSpec) -> list[OpSpec]:
    """The opcodes whose device function is host's (OpSpec.body), checked: their inputs and params begin
    with host's, so host's accessors read them at the same places."""
    guests = [s for s in SPECS.values() if s.body == host.name]
    for g in guests:
        if ([x.name for x in g.inputs[:len(host.inputs)]] != [x.name for x in host.inputs]
                or g.param_names[:len(host.params)] != host.param_names):
            raise ValueError(f"{g.name} runs {host.name}'s body: its inputs and params must begin with {host.name}'s")
    return guests


def dispatch_cuh() -> str:
    out = [BANNER, "// The kernel's per-opcode tables (included by megakernel.cu).", "#pragma once"]
    out += [f'#include "../../instructions/{s.module}.cuh"' for s in SPECS.values() if not s.body]
    out += ["", f'static_assert(MVM_OP_COUNT == {len(SPECS)}, "opcodes.cuh and dispatch.cuh are generated together");',
            "", "// Before the instruction's waits: what its opcode fetches that no counter guards (OpSpec.prewait).",
            "__device__ __forceinline__ void prewait(mvm_ctx& c) {", "  switch (c.ins->opcode) {"]
    for call, ops in _prewait_calls().items():
        out += [f"    case MVM_OP_{s.name}:" for s in ops] + [f"      {call}", "      break;"]
    out += ["    default: break;", "  }", "}", "",
            "// Run the instruction's opcode; an unknown opcode aborts the launch with a dump.",
            "__device__ __forceinline__ bool dispatch(mvm_ctx& c) {", "  switch (c.ins->opcode) {"]
    for s in SPECS.values():
        if not s.body:
            out += [f"    case MVM_OP_{g.name}:" for g in _guests(s)] + [f"    case MVM_OP_{s.name}: return op_{s.module}(c);"]
    out += ["    default:",
            "      if (c.tid == 0) mvm_fail(c.a, MVM_ERR_BAD_OPCODE, c.block, c.qpos, c.ins, -1, c.ins->opcode, MVM_OP_COUNT);",
            "      return false;", "  }", "}", ""]
    return "\n".join(out)


# the C files the build compiles; each a function giving its text
C_FILES: dict[str, Callable[[], str]] = {
    "core/limits.h": limits.c_header,
    "instructions/opcodes.cuh": opcodes_cuh,
    "vm/kernel/dispatch.cuh": dispatch_cuh,
}


def generated(with_docs: bool = True) -> dict[Path, str]:
    """Path -> the text it must hold. Docs are left out where they are not shipped (an installed megavm)."""
    out = {ROOT / name: gen() for name, gen in C_FILES.items()}
    if with_docs:
        from megavm.vm import docgen
        out.update({p: text for p, text in docgen.generated(ROOT).items() if p.exists()})
    return out


def stale(with_docs: bool = True) -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p, text in generated(with_docs).items()
                  if not p.exists() or p.read_text() != text)


def write() -> list[str]:
    changed = stale()
    for p, text in generated().items():
        if not p.exists() or p.read_text() != text:
            p.write_text(text)
    return changed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="write (or --check) the files generated from the opcode specs")
    ap.add_argument("--check", action="store_true", help="list the stale files and exit 1 if any")
    a = ap.parse_args(argv)
    if a.check:
        bad = stale()
        print("\n".join(f"stale: {b}" for b in bad) or "every generated file is current")
        return 1 if bad else 0
    changed = write()
    print("\n".join(f"wrote {c}" for c in changed) or "every generated file was current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
