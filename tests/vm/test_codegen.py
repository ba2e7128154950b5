"""The files generated from the opcode specs and the limits are current, and what they generate holds
every opcode, operand and param by name (vm/codegen.py, vm/docgen.py)."""
import re

import pytest

from megavm.instructions import SPECS
from megavm.vm import codegen, docgen


def test_every_generated_file_is_current():
    stale = codegen.stale()
    assert not stale, f"stale generated files {stale}: run python3 -m megavm.vm.codegen"


def test_docs_hold_every_generated_block():
    for name, blocks in docgen.BLOCKS.items():
        text = (codegen.ROOT / name).read_text()
        assert sorted(docgen.block_names(text)) == sorted(blocks), f"{name} has generated blocks {docgen.block_names(text)}"


def test_accessors_name_every_operand_and_param():
    text = codegen.opcodes_cuh()
    for code, s in SPECS.items():
        body = re.search(rf"struct {s.name} {{(.*?)\n}};", text, re.S).group(1)
        assert f"code = MVM_OP_{s.name};" in body and f"MVM_OP_{s.name} = {code}," in text
        for k, x in enumerate(s.inputs):
            assert f"int {x.name}(const mvm_instr_t* i) {{ return i->inputs[{k}]; }}" in body, (s.name, x.name)
        for k, x in enumerate(s.outputs):
            assert f"int {x.name}(const mvm_instr_t* i) {{ return i->outputs[{k}]; }}" in body, (s.name, x.name)
        for k, p in enumerate(s.params):
            want = f"__uint_as_float(i->params[{k}])" if p.f32 else f"(int)i->params[{k}]"
            assert f"{p.name}(const mvm_instr_t* i) {{ return {want}; }}" in body, (s.name, p.name)


def test_dispatch_covers_every_opcode_and_traps_the_rest():
    text = codegen.dispatch_cuh()
    for s in SPECS.values():
        if s.body:                # a guest: its case falls through to its host's call (OpSpec.body)
            host = next(h for h in SPECS.values() if h.name == s.body)
            assert re.search(rf"case MVM_OP_{s.name}:\n(    case MVM_OP_\w+:\n)*    case MVM_OP_{host.name}: "
                             rf"return op_{host.module}\(c\);", text), s.name
            assert f'"../../instructions/{s.module}.cuh"' not in text
            continue
        assert f'#include "../../instructions/{s.module}.cuh"' in text
        assert f"case MVM_OP_{s.name}: return op_{s.module}(c);" in text
    assert "MVM_ERR_BAD_OPCODE" in text.split("default:")[-1]


def test_prewait_call_sites_are_shared_only_where_the_arguments_sit_alike():
    calls = codegen._prewait_calls()
    assert sum(len(ops) for ops in calls.values()) == sum(1 for s in SPECS.values() if s.prewait)
    for call, ops in calls.items():
        places = {tuple(s.place(a) for a in s.prewait.args) for s in ops}
        assert len(places) == 1 and len({s.prewait.fn for s in ops}) == 1, (call, [s.name for s in ops])


def test_no_device_source_reads_a_slot_or_param_by_number():
    """Only the generated accessors know where an operand or param sits."""
    for f in sorted((codegen.ROOT / "instructions").glob("*.cuh")):
        if f.name != "opcodes.cuh":
            found = re.findall(r"(?:params|inputs|outputs)\[\d+\]", f.read_text())
            assert not found, f"{f.name} reads {found} by number; use the opcode's accessors (opcodes.cuh)"


@pytest.mark.parametrize("s", list(SPECS.values()), ids=lambda s: s.name)
def test_each_opcode_lives_in_its_own_files(s):
    """instructions/<name>.py holds the spec and <name>.cuh the body op_<name> (an opcode that runs
    another's body, OpSpec.body, has no .cuh: the host's branches on its opcode), and every pre-wait
    hook is defined in a header the body includes (directly or not)."""
    root = codegen.ROOT / "instructions"
    assert (root / f"{s.module}.py").is_file()
    module = s.body.lower() if s.body else s.module
    cuh = (root / f"{module}.cuh").read_text()
    assert re.search(rf"__device__ bool op_{module}\(mvm_ctx& c\)", cuh), f"{module}.cuh lacks op_{module}"
    if s.body:
        assert f"MVM_OP_{s.name}" in cuh and not (root / f"{s.module}.cuh").exists(), s.name
    if s.prewait:
        seen, todo = set(), [f"{module}.cuh"]
        while todo:
            f = todo.pop()
            if f in seen or not (root / f).is_file():
                continue
            seen.add(f)
            text = (root / f).read_text()
            if re.search(rf"void {s.prewait.fn}\(mvm_ctx& c", text):
                break
            todo += re.findall(r'#include "(\w+\.cuh)"', text)
        else:
            pytest.fail(f"{s.name}'s pre-wait hook {s.prewait.fn} is defined in no header {module}.cuh includes")


def test_an_added_opcode_reaches_every_generated_table(monkeypatch):
    """What adding an opcode takes: its spec (here a synthetic one) and its files; the enum, accessors,
    includes, dispatch, pre-wait call and docs follow from the spec alone."""
    from megavm.instructions.spec import ACT, F32, Hook, OpSpec, Param, Slot
    code = len(SPECS)
    toy = OpSpec(name="TOY_SCALE", code=code, doc="TOY_SCALE: y = s * a.", inputs=(Slot("a", ACT, F32),),
                 outputs=(Slot("y", ACT, F32),), params=(Param("s", "the factor", f32=True),),
                 check=lambda p, i, o: [], accesses=lambda p, i, o: [], reference=lambda p, i, o: None,
                 cost=lambda p, i, o: (0, 0), prewait=Hook("toy_prewait", ("a",)))
    monkeypatch.setitem(SPECS, code, toy)
    ops, disp = codegen.opcodes_cuh(), codegen.dispatch_cuh()
    assert f"MVM_OP_TOY_SCALE = {code}," in ops and f"MVM_OP_COUNT = {code + 1}" in ops
    assert "static __device__ __forceinline__ float s(const mvm_instr_t* i) { return __uint_as_float(i->params[0]); }" in ops
    assert '#include "../../instructions/toy_scale.cuh"' in disp and "case MVM_OP_TOY_SCALE: return op_toy_scale(c);" in disp
    assert "      toy_prewait(c, TOY_SCALE::a(c.ins));" in disp and f"MVM_OP_COUNT == {code + 1}" in disp
    assert "`TOY_SCALE`" in docgen.opcode_table() and "| 0 | `s` | f32 | the factor |" in docgen.opcode_reference()


def test_a_guest_shares_its_hosts_call_site_only_where_its_operands_sit_alike(monkeypatch):
    """An opcode that runs another's body (OpSpec.body) gets a case that falls through to the host's
    call and no include of its own; one whose inputs or params do not begin with the host's is refused
    when the dispatch is generated."""
    from dataclasses import replace

    from megavm.instructions import Op, spec
    from megavm.instructions.spec import ACT, F32, Slot
    code = len(SPECS)
    guest = replace(spec(Op.RMS_LINEAR_AMAX), name="TOY_GUEST", code=code)
    monkeypatch.setitem(SPECS, code, guest)
    disp = codegen.dispatch_cuh()
    assert re.search(r"case MVM_OP_TOY_GUEST:\n(    case MVM_OP_\w+:\n)*    case MVM_OP_RMS_LINEAR_KV: return "
                     r"op_rms_linear_kv\(c\);", disp)
    assert "toy_guest.cuh" not in disp
    bad = replace(guest, inputs=(Slot("other", ACT, F32),) + guest.inputs[1:])
    monkeypatch.setitem(SPECS, code, bad)
    with pytest.raises(ValueError, match="TOY_GUEST runs RMS_LINEAR_KV's body: its inputs and params must begin"):
        codegen.dispatch_cuh()
