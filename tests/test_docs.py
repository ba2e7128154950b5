"""The docs cannot drift: the generated tables in docs/abi.md equal what instructions.SPECS and vm/abi.py
give, and README's test command is the one .ci/run runs.

Regenerate the tables after changing an opcode or the ABI: python3 tests/test_docs.py --write
"""
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ABI_MD = ROOT / "docs" / "abi.md"
BLOCK = re.compile(r"(<!-- BEGIN GENERATED (\w+) -->\n)(.*?)(<!-- END GENERATED \2 -->)", re.S)
C_TYPES = {"u1": "uint8", "u2": "uint16", "u4": "uint32", "u8": "uint64", "i1": "int8", "i4": "int32", "i8": "int64"}


def _slot(s) -> str:
    kinds = "/".join(k.name for k in s.kinds)
    return f"`{s.name}` {kinds} {'/'.join(d.name.lower() for d in s.dtypes)}"


def opcodes() -> str:
    from instructions import SPECS
    rows = ["| code | opcode | inputs (slot: kinds, dtypes) | outputs | params (word: name) |", "|---|---|---|---|---|"]
    for op, s in sorted(SPECS.items()):
        params = ", ".join(f"{i}: `{p}`{' (f32)' if p in s.float_params else ''}" for i, p in enumerate(s.params)) or "none"
        rows.append(f"| {int(op)} | `{s.name}` | {'; '.join(map(_slot, s.inputs))} | {'; '.join(map(_slot, s.outputs))} "
                    f"| {params} |")
    return "\n".join(rows) + "\n"


def _ctype(dt: np.dtype) -> str:
    from vm import abi
    base, shape = (dt.subdtype if dt.subdtype else (dt, ()))
    name = next((k for k, v in abi.STRUCTS.items() if v == base), None) or C_TYPES[base.str.lstrip("<>|=")]
    return name + "".join(f"[{n}]" for n in shape)


def structs() -> str:
    from vm import abi
    out = []
    for name, dt in abi.STRUCTS.items():
        out += [f"`{name}`: {dt.itemsize} bytes", "", "| offset | bytes | field | type |", "|---:|---:|---|---|"]
        for field in dt.names:
            fdt, off = dt.fields[field][:2]
            out.append(f"| {off} | {fdt.itemsize} | `{field}` | `{_ctype(fdt)}` |")
        out.append("")
    return "\n".join(out)


def constants() -> str:
    from vm import abi
    rows = ["| name | value |", "|---|---:|"]
    rows += [f"| `{k}` | {hex(v) if k == 'MEGAVM_MAGIC' else v} |" for k, v in abi.CONSTANTS.items()]
    rows += [f"| `{k}` | {v} |" for k, v in abi.ENUMS.items()]
    return "\n".join(rows) + "\n"


GENERATORS = {"opcodes": opcodes, "structs": structs, "constants": constants}


def _blocks(text: str) -> dict[str, str]:
    return {m.group(2): m.group(3) for m in BLOCK.finditer(text)}


def test_abi_md_tables_are_current():
    have = _blocks(ABI_MD.read_text())
    assert sorted(have) == sorted(GENERATORS), f"docs/abi.md has generated blocks {sorted(have)}"
    for name, gen in GENERATORS.items():
        assert have[name] == gen(), f"docs/abi.md table {name!r} is stale: run python3 tests/test_docs.py --write"


def test_every_opcode_and_param_documented():
    from instructions import SPECS
    text = ABI_MD.read_text()
    for op, s in SPECS.items():
        assert f"`{s.name}`" in text, f"docs/abi.md does not mention opcode {s.name}"
        for p in s.params:
            assert f"`{p}`" in text, f"docs/abi.md does not mention param {p} of {s.name}"


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text().splitlines()
    cmds = [l.strip() for l in readme if l.strip().startswith("python3 -m pytest")]
    assert len(cmds) == 1, f"README.md should give one test command, has {cmds}"
    ci = [l.strip() for l in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert cmds[0] in ci, f"README's test command {cmds[0]!r} is not a line of .ci/run"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    sys.path.insert(0, str(ROOT))
    text = ABI_MD.read_text()
    ABI_MD.write_text(BLOCK.sub(lambda m: m.group(1) + GENERATORS[m.group(2)]() + m.group(4), text))
    print(f"rewrote the generated tables of {ABI_MD}")


def test_readme_lists_every_environment_knob():
    from vm.env import KNOBS
    readme = (ROOT / "README.md").read_text()
    missing = [k for k in KNOBS if f"`{k}`" not in readme]
    assert not missing, f"README.md's environment table lacks {missing}"
