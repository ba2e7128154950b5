"""The import graph is a one-way stack, and megavm is the only import root.

Floors, lowest first: core (types, capacities, ABI, errors) <- instructions (the opcode specs) <-
schedule (the compiler) <- vm (packing, the VMs, the build) <- flywheel (measurement and tuning) <-
the megavm package itself (the command line and its tools). A module may import its own floor and
lower ones, never a higher one; no module imports tests; there is no cycle. The CUDA sources follow
the same stack: core <- instructions <- vm/kernel.
"""
import ast
import re
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
FLOORS = {"core": 0, "instructions": 1, "schedule": 2, "vm": 3, "flywheel": 4, "": 5}   # "": megavm/*.py


def _modules() -> dict[str, Path]:
    out = {}
    for folder in FLOORS:
        base = ROOT / (folder or "megavm")
        for f in sorted(base.glob("*.py")):
            pkg = f"megavm.{folder}" if folder else "megavm"
            out[pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"] = f
    return out


MODULES = _modules()


def _floor(module: str) -> int:
    parts = module.split(".")
    return FLOORS[parts[1]] if len(parts) > 1 and parts[1] in FLOORS else FLOORS[""]


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, at any depth (function-level imports included)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}:{node.lineno}: relative import"
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names if f"{node.module}.{a.name}" in MODULES]
    return out


def _graph() -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(MODULES)
    for mod, path in MODULES.items():
        for line, target in _imports(path):
            if target in MODULES and target != mod:
                g.add_edge(mod, target, line=line)
    return g


def test_megavm_is_the_only_import_root():
    project = {"core", "instructions", "schedule", "vm", "flywheel", "tests", "bench"}
    bad = [f"{p.relative_to(ROOT)}:{line} imports {t}" for p in MODULES.values() for line, t in _imports(p)
           if t.split(".")[0] in project]
    assert not bad, "imports outside the megavm root:\n" + "\n".join(bad)


def test_no_import_runs_back_up_a_floor():
    g = _graph()
    up = [f"{MODULES[a].relative_to(ROOT)}:{d['line']} ({a}, floor {_floor(a)}) imports {b} (floor {_floor(b)})"
          for a, b, d in g.edges(data=True) if _floor(b) > _floor(a)]
    assert not up, "imports from a lower floor to a higher one:\n" + "\n".join(up)


def test_no_import_cycle():
    cycles = list(nx.simple_cycles(_graph()))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_the_ground_floor_imports_only_itself():
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}" for m in MODULES if _floor(m) == 0
           for line, t in _imports(MODULES[m]) if t.startswith("megavm.") and not t.startswith("megavm.core")]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("folder, allowed", [("core", {"core"}), ("instructions", {"core", "instructions"}),
                                             ("vm/kernel", {"core", "instructions", "vm/kernel"})])
def test_cuda_includes_follow_the_stack(folder, allowed):
    for f in sorted((ROOT / folder).glob("*.*")):
        if f.suffix not in (".h", ".cuh", ".cu"):
            continue
        for inc in re.findall(r'#include "([^"]+)"', f.read_text()):
            target = (f.parent / inc).resolve().parent.relative_to(ROOT).as_posix()
            assert target in allowed, f"{f.relative_to(ROOT)} includes {inc} ({target}), outside {sorted(allowed)}"


def test_the_graph_sees_every_module():
    """A guard on the checks above: the package folders hold these modules, and they import each other."""
    g = _graph()
    assert {"megavm.core.abi", "megavm.instructions.spec", "megavm.schedule.lower", "megavm.vm.megakernel",
            "megavm.flywheel.bench", "megavm.cli"} <= set(g)
    assert g.has_edge("megavm.vm.megakernel", "megavm.core.abi") and g.has_edge("megavm.cli", "megavm.flywheel.bench")
