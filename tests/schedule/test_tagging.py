"""Tagged hand-offs (schedule/tagging.py): which activations the lowering tags and which waits it
polls, the validator's refusals, and the IR's JSON and packed forms of both."""
import dataclasses
import random

import pytest

from megavm.core import abi
from megavm.core.errors import UserError
from megavm.fuzz import poll_uncovered, untag_read
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.ir import Program
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS
from megavm.schedule.validate import validate
from megavm.vm.pack import pack, unpack

SC = ScheduleConfig(dtype="f32", capacity=32, n_sms=6, kv_block=16)   # two blocks: partials and combines


def _program(**kw) -> Program:
    return lower(PRESETS["tiny"], dataclasses.replace(SC, **kw))


def _problems(p: Program) -> str:
    r = validate(p)
    assert not r.ok, "the program was accepted"
    return "\n".join(str(x) for x in r.problems)


def _task(p: Program, label: str) -> int:
    return next(i for i, t in enumerate(p.tasks) if t.label.startswith(label))


def test_the_chain_is_tagged_and_its_waits_polled():
    p = _program()
    assert validate(p).ok
    tagged = {b.name for b in p.buffers if b.tagged}
    L = PRESETS["tiny"].n_layers
    assert tagged == ({f"x.{l}" for l in range(L + 1)} | {f"{n}.{l}" for n in ("q", "k_row", "v_row", "part", "attn",
                                                                               "mid", "ffn") for l in range(L)}), sorted(tagged)
    polled = {p.tasks[i].label.split("[")[0].split(".h")[0] for i, t in enumerate(p.tasks) for w in t.waits
              if w.polled}
    assert {"L0.q", "L0.k", "L0.v", "L0.attn", "L0.combine", "L0.o", "L0.gate_up", "L0.down", "lm_head"} <= polled, \
        polled
    # the argmax reads the LM head's (max, index) partials, which are plain: its wait stays a counter wait
    assert not any(w.polled for w in p.tasks[_task(p, "argmax")].waits)
    untagged = _program(tagged=False)
    assert not any(b.tagged for b in untagged.buffers) and not any(w.polled for t in untagged.tasks for w in t.waits)
    # the same tasks, reads, writes and waits otherwise, but for this step's K/V rows that the k/v tiles
    # hand the partials (by buffer name: the tagged program has two more buffers a layer)
    def form(q: Program):
        name = lambda ids: tuple(q.buffers[b].name for b in ids if b >= 0 and "_row." not in q.buffers[b].name)  # noqa: E731
        return [(t.opcode, name(t.inputs), name(t.outputs), [(q.counters[w.counter].name, w.threshold) for w in t.waits])
                for t in q.tasks]
    assert form(p) == form(untagged)
    assert p.buffers[p.buffer_id("k_row.0")].tagged


def test_one_block_partials_write_the_tagged_attention_output():
    """One block a head (the default at this capacity): no part buffer, the partials' waits polled on q and
    this step's K/V rows, and the o tiles poll what the partials write."""
    p = _program(kv_block=0)
    assert validate(p).ok
    names = {b.name for b in p.buffers}
    assert "part.0" not in names and p.buffers[p.buffer_id("attn.0")].tagged
    polled = {p.tasks[i].label.split("[")[0].split(".h")[0] for i, t in enumerate(p.tasks) for w in t.waits
              if w.polled}
    assert {"L0.attn", "L0.o"} <= polled and not any(t.label.startswith("L0.combine") for t in p.tasks)


def test_a_wait_whose_producers_write_no_tagged_word_it_reads_is_refused():
    p = _program()
    i = _task(p, "argmax")
    p.tasks[i].waits = tuple(dataclasses.replace(w, polled=True) for w in p.tasks[i].waits)
    assert "polls its wait 0" in _problems(p)


def test_polling_a_head_that_is_not_read_is_refused():
    """One part counter a layer (head_counters=False): head 0's combine reads head 0's partials only,
    so its wait cannot be polled (the lowering keeps it a counter wait; marked polled, it is refused)."""
    p = _program(head_counters=False)
    assert validate(p).ok
    i = _task(p, "L0.combine.h0")
    assert not any(w.polled for w in p.tasks[i].waits)
    p.tasks[i].waits = tuple(dataclasses.replace(w, polled=True) for w in p.tasks[i].waits)
    assert "writes no tagged word it reads" in _problems(p)


def test_a_tagged_buffer_at_a_plain_slot_is_refused():
    p = _program()
    best = p.buffer_id("best")            # the LM head's (max, index) partials, at plain slots
    p.buffers[best] = dataclasses.replace(p.buffers[best], tagged=True)
    assert "takes plain f32 only" in _problems(p)


def test_a_tagged_cache_is_refused():
    p = _program()
    k = p.buffer_id("k_cache.0")
    p.buffers[k] = dataclasses.replace(p.buffers[k], tagged=True)
    assert "tagged buffers are F32 activations" in _problems(p)


def test_a_word_written_twice_is_refused():
    p = _program()
    i, j = _task(p, "L0.down[0]"), _task(p, "L0.down[") + 1
    assert p.tasks[j].label.startswith("L0.down[")
    p.tasks[j].params = dict(p.tasks[j].params, row0=p.tasks[i].params["row0"])
    assert "a tagged word is written once a step" in _problems(p)


def test_an_untagged_read_ordered_only_by_polled_waits_is_refused():
    """x.1 stored plain and its readers' own waits on it counter waits again: the o tiles of layer 1
    still read their residual rows of x.1, which only polled waits (the attention chain's) order after
    the down tiles that wrote them."""
    p = _program()
    b = p.buffer_id("x.1")
    p.buffers[b] = dataclasses.replace(p.buffers[b], tagged=False)
    x1 = next(c for c, n in enumerate(p.counters) if n.name == "x.1")
    for t in p.tasks:
        t.waits = tuple(dataclasses.replace(w, polled=w.polled and w.counter != x1) for w in t.waits)
    msg = _problems(p)
    assert "after it only through a polled wait" in msg and "L1.o" in msg, msg


def test_moe_residual_and_router_logits_are_tagged():
    """In an MoE layer the expert down tiles write the residual tagged, so the next layer's q/k/v and o
    tiles poll it with no counter wait of their own; the router tiles poll mid and ROUTE polls their
    logits. Qwen3's q/k finishers (ROPE, KV_APPEND) poll the tiles they finish, and the partials the
    finished rows. The expert GLU tiles write h tagged and the down tiles poll it. Every expert tile still
    waits on ROUTE's counter: expert ids are not f32 words (and the loader reads them after that wait)."""
    p = lower(PRESETS["moe-tiny"], ScheduleConfig(dtype="f32", capacity=32, n_sms=4))
    assert validate(p).ok
    waits = {t.label.split("[")[0]: {p.counters[w.counter].name: w.polled for w in t.waits} for t in p.tasks}
    assert waits["L1.o"] == {"L1.attn": True} and waits["L1.q"] == {"x.1": True}, (waits["L1.o"], waits["L1.q"])
    assert waits["L0.router"] == {"L0.mid": True} and waits["L0.route"] == {"L0.router": True}
    assert waits["L0.rope.h0"] == {"L0.qproj.h0": True} and waits["L0.k_append.h0"] == {"L0.kproj.h0": True}
    assert waits["L0.attn.h0.b0"] == {"L0.qkv.h0": True}
    assert waits["L0.expert0"] == {"L0.route": False}
    assert waits["L0.experts_down"] == {"L0.route": False, "L0.experts": True}
    assert {f"{n}.0" for n in ("q_raw", "k_raw", "k_row", "v_row", "router_logits", "expert_h")} <= {
        b.name for b in p.buffers if b.tagged}
    plain = lower(PRESETS["moe-tiny"], ScheduleConfig(dtype="f32", capacity=32, n_sms=4, tag_expert_h=False))
    assert validate(plain).ok
    assert not plain.buffers[plain.buffer_id("expert_h.0")].tagged
    down = next(t for t in plain.tasks if t.label.startswith("L0.experts_down"))
    assert not any(w.polled for w in down.waits)


def test_untagged_residual_reads_get_counter_waits_of_their_own():
    """With the unfused residual (ADD takes x plain), the ADD after layer 1's o-projection waits on
    x.1's counter itself: only polled waits would order it after the expert tiles that wrote x.1."""
    p = lower(PRESETS["moe-tiny"], ScheduleConfig(dtype="f32", capacity=32, n_sms=4, fuse_residual=False))
    assert validate(p).ok
    add = p.tasks[_task(p, "L1.o.add")]
    assert {p.counters[w.counter].name: w.polled for w in add.waits} == {"o.1.tiles": False, "x.1": False}


def test_json_and_packed_forms_keep_tags_and_polls():
    p = _program()
    back = Program.from_json(p.to_json())
    assert [b.tagged for b in back.buffers] == [b.tagged for b in p.buffers]
    assert [t.waits for t in back.tasks] == [t.waits for t in p.tasks]
    q = assign(p, 6)
    packed = pack(p, q)
    i = _task(p, "L0.o[")
    r = packed.instrs[list(packed.instrs["task"]).index(i)]
    assert r["flags"] & abi.INSTR_POLLED_WAIT0
    assert packed.buffers[p.buffer_id("x.1")]["flags"] & abi.BUFFER_TAGGED
    assert packed.buffers[p.buffer_id("x.1")]["nbytes"] == 8 * PRESETS["tiny"].dim
    un, _ = unpack(packed)
    assert [b.tagged for b in un.buffers] == [b.tagged for b in p.buffers]
    assert [t.waits for t in un.tasks] == [t.waits for t in p.tasks]


@pytest.mark.parametrize("bad, what", [(5, "field 5"), ("tag", "field 5")])
def test_json_refuses_a_malformed_tag_field(bad, what):
    p = _program()
    text = p.to_json().replace('"tagged"]', f'{bad!r}]'.replace("'", '"'), 1)
    with pytest.raises(UserError, match=what):
        Program.from_json(text)


def test_json_refuses_a_malformed_poll_field():
    text = _program().to_json().replace('"polled"]', '"polld"]', 1)
    with pytest.raises(UserError, match="polled"):
        Program.from_json(text)


@pytest.mark.parametrize("mutation", [poll_uncovered, untag_read])
def test_the_fuzzers_tag_mutants_are_refused(mutation):
    p = _program()
    q = assign(p, 6)
    rng = random.Random(0)
    for _ in range(10):
        mp, mq, what = mutation(p, q, rng)
        assert not validate(mp, mq).ok, what
    assert validate(p, q).ok


def test_the_k_v_tiles_rows_are_the_rows_they_append():
    """k_row / v_row, which the partials read this step's row from, hold exactly what the cache holds at
    the step's position once rounded to the cache's dtype (bf16 here, swizzled rows), and the tagged
    step's logits are the untagged step's (ReferenceVM)."""
    import torch

    from megavm.instructions.kv_cache import logical
    from megavm.schedule.weights import program_weights, random_hf_weights
    from megavm.vm.compile import compile
    from megavm.vm.reference import ReferenceVM
    cfg = PRESETS["tiny"]
    w = program_weights(cfg, random_hf_weights(cfg, torch.bfloat16, seed=4))
    sc = ScheduleConfig(dtype="bf16", capacity=32, n_sms=6)
    tagged, plain = ReferenceVM(compile(cfg, sc), w), ReferenceVM(compile(cfg, dataclasses.replace(sc, tagged=False)), w)
    for pos, tok in enumerate((3, 17, 9)):
        out, ref = tagged.step({"token": tok, "pos": pos}), plain.step({"token": tok, "pos": pos})
        assert torch.equal(out["logits"], ref["logits"]), pos
        for which in ("k", "v"):
            row = tagged.buffer(f"{which}_row.0").view(cfg.n_kv_heads, cfg.head_dim)
            cache = tagged.buffer(f"{which}_cache.0")
            for h in range(cfg.n_kv_heads):
                assert torch.equal(row[h].to(cache.dtype), logical(cache, h, pos, pos + 1)[0]), (which, pos, h)


def test_a_lora_program_is_tagged_like_one_without_adapters():
    """The LORA_A tasks read the finished inputs as tagged words and write their partial products as
    tagged words: the adapter program tags the chain's activations as the plain one does, plus its
    lora_u buffers; every wait the plain program polls stays polled, and each projection tile with a
    low-rank term polls its LORA_A tasks' words besides (id 0 then costs nothing on the chain)."""
    plain = _program()
    lora = _program(lora_adapters=2, lora_rank=4, lora_targets=("q", "k", "v", "o", "gate", "up", "down"))
    assert validate(lora).ok
    tagged = {b.name for b in lora.buffers if b.tagged}
    lora_u = {b.name for b in lora.buffers if b.name.startswith("lora_u.")}
    assert lora_u and tagged == {b.name for b in plain.buffers if b.tagged} | lora_u, sorted(tagged)

    def polls(q: Program, first: bool):
        return [(t.label, [w.polled for w in t.waits][:1] if first else [w.polled for w in t.waits])
                for t in q.tasks if ".lora_a." not in t.label]
    assert polls(lora, True) == polls(plain, False)
    extra = [t for t in lora.tasks if len(t.waits) == 2]
    assert extra and all(t.waits[1].polled for t in extra)
    assert {lora.counters[t.waits[1].counter].name.split(".")[-1] for t in extra} == {"qkv", "o", "gu", "down"}
    # the partial products' readers poll them and no counter orders them: stored plain, with the waits
    # still polled, they would be read unordered, and the validator says so
    b = lora.buffer_id(sorted(lora_u)[0])
    lora.buffers[b] = dataclasses.replace(lora.buffers[b], tagged=False)
    assert "untagged data needs a counter path" in _problems(lora)
