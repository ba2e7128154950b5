"""The docs cannot drift from what they describe: every opcode, param, knob and test command they name
is the real one. (Their generated tables are checked in tests/vm/test_codegen.py.)"""
import re
from pathlib import Path

from megavm.core import limits
from megavm.instructions import SPECS
from megavm.vm.env import KNOBS

ROOT = Path(__file__).resolve().parents[1]


def test_every_opcode_and_param_documented():
    text = (ROOT / "docs" / "opcodes.md").read_text()
    for s in SPECS.values():
        assert f"`{s.name}`" in text, f"docs/opcodes.md does not mention opcode {s.name}"
        for p in s.params:
            assert f"`{p.name}`" in text and p.doc in text, f"docs/opcodes.md does not describe param {p.name} of {s.name}"


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text().splitlines()
    cmds = [l.strip() for l in readme if l.strip().startswith("python3 -m pytest")]
    assert len(cmds) == 1, f"README.md should give one test command, has {cmds}"
    ci = [l.strip() for l in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert cmds[0] in ci, f"README's test command {cmds[0]!r} is not a line of .ci/run"


def test_readme_lists_every_environment_knob():
    readme = (ROOT / "README.md").read_text()
    missing = [k for k in KNOBS if f"`{k}`" not in readme]
    assert not missing, f"README.md's environment table lacks {missing}"


def test_every_build_knob_is_declared_once():
    """Each MVM_ macro the device sources test is a knob of core/limits.py (documented with its default
    in docs/abi.md), or MVM_HAS_RING, which they derive from the target arch; each knob is read."""
    sources = "\n".join(f.read_text() for d in ("instructions", "vm/kernel") for f in (ROOT / d).glob("*.cu*"))
    tested = set(re.findall(r"#if(?:n?def)?\s+(MVM_\w+)", sources)) | set(re.findall(r"\bif \((MVM_\w+)\)", sources))
    knobs = {k.name for k in limits.KNOBS}
    assert tested <= knobs | {"MVM_HAS_RING"}, f"undeclared build knobs {tested - knobs - {'MVM_HAS_RING'}}"
    for k in knobs:
        assert re.search(rf"\b{k}\b", sources), f"knob {k} is declared in core/limits.py but no source reads it"
