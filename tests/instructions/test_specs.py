"""The opcode registry and what a spec may declare: every opcode in its own module, codes dense and
unique, names and hooks that refer to real operands, params that round-trip through the ABI words."""
import random
import sys

import pytest

from megavm.core.types import BufferKind, DType
from megavm.instructions import SPECS, Op, discover, op_name, spec
from megavm.instructions.spec import ACT, F32, SAMPLING, Hook, OpSpec, Param, Slot


def _spec(**changes) -> OpSpec:
    fields = dict(name="TOY", code=0, doc="TOY: a test opcode.", inputs=(Slot("a", ACT, F32),),
                  outputs=(Slot("y", ACT, F32),), params=(Param("n", "a count"),), check=lambda p, i, o: [],
                  accesses=lambda p, i, o: [], reference=lambda p, i, o: None, cost=lambda p, i, o: (0, 0))
    return OpSpec(**{**fields, **changes})


def test_registry_is_dense_and_named_after_the_modules():
    assert sorted(SPECS) == list(range(len(SPECS))) and [o.value for o in Op] == list(SPECS)
    for code, s in SPECS.items():
        assert s.code == code and Op[s.name] == code and op_name(code) == s.name
        assert sys.modules[f"megavm.instructions.{s.module}"].SPEC is s
    assert op_name(999) == "opcode 999"
    with pytest.raises(ValueError, match="unknown opcode 999"):
        spec(999)


@pytest.mark.parametrize("changes, words", [
    (dict(name="toy"), "upper-case"),
    (dict(params=(Param("a", "clashes with slot a"),)), "unique, ['a'] repeat"),
    (dict(inputs=(Slot("a", ACT, F32, bound=("nope", 0)),)), "bounded by unknown slot 'nope'"),
    (dict(prewait=Hook("toy_prewait", ("a", "missing"))), "unknown operands or params ['missing']"),
    (dict(params=tuple(Param(f"p{i}", "") for i in range(13))), "13 params; the ABI holds 12"),
    (dict(inputs=tuple(Slot(f"i{i}", ACT, F32) for i in range(13))), "13 inputs; the ABI holds 12"),
])
def test_a_spec_that_contradicts_itself_is_refused(changes, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        _spec(**changes)


def test_place_finds_operands_and_params():
    s = _spec(inputs=(Slot("a", ACT, F32), Slot("b", ACT, F32)))
    assert [s.place(x) for x in ("a", "b", "y", "n")] == [("in", 0), ("in", 1), ("out", 0), ("param", 0)]
    with pytest.raises(KeyError, match="no operand or param 'z'"):
        s.place("z")


@pytest.mark.parametrize("s", list(SPECS.values()), ids=lambda s: s.name)
def test_params_round_trip_through_the_abi_words(s):
    rng = random.Random(s.code)
    p = {x.name: (rng.uniform(-1e3, 1e3) if x.f32 else rng.randrange(-(1 << 31), 1 << 31)) for x in s.params}
    got = s.decode_params(s.encode_params(p))
    for x in s.params:
        want = p[x.name]
        assert got[x.name] == (pytest.approx(want, rel=1e-7) if x.f32 else want), (s.name, x.name)
    with pytest.raises(ValueError, match="unknown params"):
        s.encode_params({**p, "bogus": 1})


def test_every_runtime_input_slot_says_what_it_carries():
    """A slot that reads only runtime inputs says what they carry, and takes INPUT i32 scalars (a token
    id, a position, a seed) or, for SAMPLE's settings, an f32 vector the host checks by its role; a
    slot that also takes activations reads a tensor input as data, with no role."""
    for s in SPECS.values():
        for x in s.inputs:
            if BufferKind.INPUT in x.kinds:
                only = x.kinds == (BufferKind.INPUT,)
                assert bool(x.role) == only, f"{s.name}.{x.name}"
                assert not only or x.dtypes == (DType.I32,) or x.role == SAMPLING, f"{s.name}.{x.name}"


def _package(tmp_path, monkeypatch, files: dict[str, str]) -> tuple[list[str], str]:
    """A throwaway package of opcode modules, importable for this test."""
    name = f"toy_ops_{tmp_path.name}".replace("-", "_")
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for f, text in files.items():
        (pkg / f).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return [str(pkg)], name


TOY = '''from megavm.instructions.spec import ACT, F32, OpSpec, Slot
SPEC = OpSpec(name="{name}", code={code}, doc="", inputs=(Slot("a", ACT, F32),), outputs=(), params=(),
              check=lambda p, i, o: [], accesses=lambda p, i, o: [], reference=lambda p, i, o: None,
              cost=lambda p, i, o: (0, 0))
'''


@pytest.mark.parametrize("files, words", [
    ({"toy.py": TOY.format(name="OTHER", code=0)}, "OTHER is defined in instructions/toy.py"),
    ({"one.py": TOY.format(name="ONE", code=0), "two.py": TOY.format(name="TWO", code=0)}, "share code 0"),
    ({"one.py": TOY.format(name="ONE", code=1)}, "codes must be 0..0"),
])
def test_discovery_refuses_a_misplaced_or_misnumbered_opcode(tmp_path, monkeypatch, files, words):
    path, name = _package(tmp_path, monkeypatch, files)
    with pytest.raises(ImportError, match=words):
        discover(path, name)


def test_discovery_finds_an_added_opcode_with_nothing_else_listed(tmp_path, monkeypatch):
    path, name = _package(tmp_path, monkeypatch, {"one.py": TOY.format(name="ONE", code=0), "helpers.py": "X = 1\n",
                                     "two.py": TOY.format(name="TWO", code=1)})
    assert [s.name for s in discover(path, name).values()] == ["ONE", "TWO"]


@pytest.mark.parametrize("g, hd", [(1, 64), (4, 64), (3, 24), (8, 128), (8, 256), (16, 128), (16, 256), (5, 96)])
def test_attention_partial_takes_every_group_and_head_dim_up_to_the_capacities(g, hd):
    """Any group of at most MAX_GROUP query heads and head_dim (a multiple of 8) up to MAX_HEAD_DIM is a
    valid partial while its scratch fits shared memory; past the capacities it is refused by name."""
    from megavm.core.limits import MAX_GROUP, MAX_HEAD_DIM
    from megavm.core.types import Buffer, BufferKind, DType

    def problems(g, hd):
        kv = Buffer("k", BufferKind.KV_CACHE, DType.BF16, (1, 64, hd))
        ins = [Buffer("q", BufferKind.ACTIVATION, DType.F32, (g * hd,)), kv, kv,
               Buffer("pos", BufferKind.INPUT, DType.I32, (1,))]
        outs = [Buffer("part", BufferKind.ACTIVATION, DType.F32, (1, 1, g, hd + 2))]
        return spec(Op.ATTN_PARTIAL).check(dict(kv_head=0, block=0, block_size=64, scale=1.0, window=0), ins, outs)
    assert problems(g, hd) == []
    assert any("group size" in x for x in problems(MAX_GROUP + 1, hd))
    assert any("head_dim" in x for x in problems(g, MAX_HEAD_DIM + 8))
