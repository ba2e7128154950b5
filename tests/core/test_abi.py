"""core/abi.h against core/abi.py: the C compiler's sizeof, offsetof, constants and enum codes must equal
the numpy side exactly, and abi.h's own static_asserts must hold under a C++ compiler."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from megavm.core import abi

HEADER = Path(abi.__file__).with_name("abi.h")


def _printf_lines():
    lines = []
    for struct, dt in abi.STRUCTS.items():
        lines.append(f'printf("sizeof {struct} %zu\\n", sizeof({struct}));')
        for field in dt.names:
            lines.append(f'printf("offsetof {struct}.{field} %zu\\n", offsetof({struct}, {field}));')
            lines.append(f'printf("fieldsize {struct}.{field} %zu\\n", sizeof((({struct} *)0)->{field}));')
    for name in abi.CONSTANTS:
        lines.append(f'printf("const {name} %lld\\n", (long long)({name}));')
    for name in abi.ENUMS:
        lines.append(f'printf("enum {name} %lld\\n", (long long)({name}));')
    return lines


def _numpy_side():
    want = {}
    for struct, dt in abi.STRUCTS.items():
        want[f"sizeof {struct}"] = dt.itemsize
        for field in dt.names:
            fdt, off = dt.fields[field][:2]
            want[f"offsetof {struct}.{field}"] = off
            want[f"fieldsize {struct}.{field}"] = fdt.itemsize
    want.update({f"const {k}": int(v) for k, v in abi.CONSTANTS.items()})
    want.update({f"enum {k}": int(v) for k, v in abi.ENUMS.items()})
    return want


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_c_layout_matches_numpy(tmp_path):
    src = tmp_path / "layout.c"
    src.write_text("#include <stddef.h>\n#include <stdio.h>\n#include \"abi.h\"\nint main(void) {\n"
                   + "\n".join("  " + l for l in _printf_lines()) + "\n  return 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", "-I", str(HEADER.parent), str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    got = {k: int(v) for k, v in (line.rsplit(" ", 1) for line in out.splitlines())}
    want = _numpy_side()
    assert got.keys() == want.keys()
    wrong = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert not wrong, f"abi.h (C) vs core/abi.py (numpy), as (C, numpy): {wrong}"


def test_header_names_match_python():
    """Every MEGAVM_ constant and MVM_ enum code in abi.h is known to core/abi.py, and vice versa."""
    text = HEADER.read_text()
    consts = set(re.findall(r"^#define\s+(MEGAVM_\w+)", text, re.M))
    enums = set(re.findall(r"\b(MVM_\w+)\s*=", text))
    structs = set(re.findall(r"}\s*(mvm_\w+_t)\s*;", text))
    for what, c_side, py_side in (("constants", consts, abi.CONSTANTS), ("enum codes", enums, abi.ENUMS),
                                  ("structs", structs, abi.STRUCTS)):
        assert c_side == set(py_side), \
            f"{what} only in abi.h: {c_side - set(py_side)}, only in abi.py: {set(py_side) - c_side}"


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_static_asserts_hold_in_cxx(tmp_path):
    src = tmp_path / "asserts.cpp"
    src.write_text('#include "abi.h"\nint main() { return 0; }\n')
    r = subprocess.run(["g++", "-std=c++17", "-Wall", "-Werror", "-fsyntax-only", "-I", str(HEADER.parent), str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"abi.h fails its static_asserts or does not compile as C++:\n{r.stderr}"


def test_static_asserts_name_the_python_sizes():
    """The sizes abi.h asserts are the numpy itemsizes (so the C++ check above checks the right numbers)."""
    asserted = dict(re.findall(r"static_assert\(sizeof\((mvm_\w+_t)\)\s*==\s*(\d+)", HEADER.read_text()))
    assert {k: int(v) for k, v in asserted.items()} == {k: dt.itemsize for k, dt in abi.STRUCTS.items()}
