"""Attention's K/V history streams: each partial names its block's K and V rows, the loader copies
the rows before the step's position through the ring once the wait on their writers was met a step
earlier, and the validator refuses a partial none of whose waits covers those writers."""
from dataclasses import replace

import pytest

from megavm.core import abi
from megavm.core.types import Buffer, BufferKind, DType
from megavm.instructions import Op, spec
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.ir import Wait
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS
from megavm.schedule.validate import validate
from megavm.vm.pack import pack

CFG = PRESETS["tiny"]                     # 2 KV heads of head_dim 16
SC = ScheduleConfig(dtype="bf16", capacity=40, n_sms=4, kv_block=16)


def _partials(p):
    return [i for i, t in enumerate(p.tasks) if t.opcode == Op.ATTN_PARTIAL]


@pytest.mark.parametrize("window", [0, 8])
def test_each_partial_streams_its_blocks_k_then_v_rows(window):
    cfg = replace(CFG, sliding_window=window or None)
    p = lower(cfg, SC)
    packed = pack(p, assign(p, 4))
    hd, cap = cfg.head_dim, SC.capacity
    seen = set()
    for i in _partials(p):
        t, r = p.tasks[i], packed.instrs[i]
        h, b, bs = t.params["kv_head"], t.params["block"], t.params["block_size"]
        k0, k1 = b * bs, min((b + 1) * bs, cap)                 # the last block stops at the capacity
        assert int(r["n_streams"]) == 2, p.describe_task(i)
        for st, slot in zip(r["streams"][:2], (1, 2)):          # K rows, then V rows
            assert int(st["buffer"]) == t.inputs[slot]
            assert int(st["index_slot"]) == abi.STREAM_HISTORY
            assert int(st["index_first"]) | int(st["index_count"]) << 8 == window
            assert int(st["byte_offset"]) == (h * cap + k0) * hd * 2
            assert int(st["byte_count"]) == (k1 - k0) * hd * 2
            w = t.waits[int(st["index_wait"])]
            writers = {j for j in p.writers()[t.inputs[slot]]}
            head_writers = {j for j in writers if p.tasks[j].params.get("row0", 0) // hd == h}
            assert head_writers and head_writers <= set(p.producers()[w.counter])
            assert w.threshold == len(p.producers()[w.counter])   # a full join
        seen.add((h, b))
    assert seen == {(h, b) for h in range(cfg.n_kv_heads) for b in range(-(-SC.capacity // 16))}


def test_a_window_the_stream_cannot_name_leaves_the_rows_to_l2():
    s = spec(Op.ATTN_PARTIAL)
    kv = Buffer("k", BufferKind.KV_CACHE, DType.BF16, (2, 70000, 16))
    ins = [None, kv, kv, None]
    p = dict(kv_head=1, block=3, block_size=1024, window=0x10000)
    assert s.streams(p, ins, []) == []
    assert [st.window for st in s.streams(dict(p, window=0xFFFF), ins, [])] == [0xFFFF, 0xFFFF]
    assert [st.window for st in s.streams(dict(p, window=70000), ins, [])] == [0, 0]   # no narrower than the cache


def test_a_partial_whose_wait_does_not_cover_its_rows_writers_is_refused():
    p = lower(CFG, SC)
    i = _partials(p)[0]
    t = p.tasks[i]
    other = next(j for j in _partials(p) if p.tasks[j].params["kv_head"] != t.params["kv_head"]
                 and p.tasks[j].waits[0].counter != t.waits[0].counter)
    tasks = list(p.tasks)
    tasks[i] = replace(t, waits=(Wait(p.tasks[other].waits[0].counter, p.tasks[other].waits[0].threshold),))
    rep = validate(replace(p, tasks=tasks))
    assert not rep.ok and "history" in {pr.rule for pr in rep.problems}, str(rep)
    msg = next(pr.message for pr in rep.problems if pr.rule == "history")
    assert "ATTN_PARTIAL" in msg and "k_cache.0" in msg and "before they are written" in msg



@pytest.mark.parametrize("model", ["small", "llama-1b", "llama-7b-32k"])
@pytest.mark.parametrize("capacity", [288, 4256, 32928])
def test_default_blocks_give_at_most_one_partial_per_sm(model, capacity):
    """kv_block's default: n_sms // n_kv blocks per KV head (a partial past the SM count makes a
    second round), unless the 64-key minimum, MAX_KV_BLOCK or the scores' shared memory says less."""
    from megavm.core.limits import MAX_K, MAX_KV_BLOCK
    from megavm.instructions.attention import partial_scratch
    from megavm.schedule.config import resolve
    cfg = PRESETS[model]
    bs = resolve(cfg, ScheduleConfig(dtype="bf16", capacity=capacity, n_sms=132)).kv_block
    partials = cfg.n_kv_heads * -(-capacity // bs)
    assert bs % 16 == 0 and partial_scratch(cfg.group, cfg.head_dim, bs) <= MAX_K
    if 64 < bs < MAX_KV_BLOCK:
        assert partials <= 132, (bs, partials)
    if bs == MAX_KV_BLOCK:
        assert partials > 132                   # the cap, not the SM count, decided


@pytest.mark.parametrize("seed", range(6))
def test_the_fuzzers_history_mutant_is_refused_by_the_history_rule(seed):
    import random
    from megavm.fuzz import history_early
    p = lower(CFG, SC)
    q = assign(p, 4)
    m, mq, what = history_early(p, q, random.Random(seed))
    rules = {pr.rule for pr in validate(m, mq).problems}
    assert "history" in rules and "acyclic" not in rules, (what, rules)
    assert validate(p, q).ok

