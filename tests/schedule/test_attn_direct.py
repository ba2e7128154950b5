"""One KV block a head (attn_direct): the partial writes the attention output itself, no ATTN_COMBINE."""
from collections import Counter
from dataclasses import replace

import pytest
import torch

from megavm.instructions import Op
from megavm.schedule.config import ONE_BLOCK_ROWS, ONE_BLOCK_WORK, ScheduleConfig, resolve
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS
from megavm.schedule.plan import plan


def _ops(p):
    return Counter(t.opcode for t in p.tasks)


@pytest.mark.parametrize("name", ["small", "llama-1b", "qwen2.5-1.5b", "qwen3-1.7b", "llama-7b-32k", "qwen3-30b-a3b"])
def test_short_capacity_takes_one_block_and_no_combine(name):
    """At capacity 288 (kernel_time's at ctx 128) these presets' partials are within ONE_BLOCK_WORK: one
    block a KV head, a partial per KV head writing attn.{l}, and no combine; attn_direct=False gives back
    blocks of about one partial per SM and their combines."""
    cfg = PRESETS[name]
    sc = ScheduleConfig(capacity=288, n_sms=132)
    lc = resolve(cfg, sc)
    assert lc.kv_block == 288 and cfg.group * cfg.head_dim * 288 <= ONE_BLOCK_WORK
    assert cfg.head_dim * 288 <= ONE_BLOCK_ROWS
    p = lower(cfg, sc)
    ops = _ops(p)
    assert ops[Op.ATTN_COMBINE] == 0 and ops[Op.ATTN_PARTIAL] == cfg.n_layers * cfg.n_kv_heads
    names = {b.name for b in p.buffers}
    assert "part.0" not in names
    part = next(t for t in p.tasks if t.opcode == Op.ATTN_PARTIAL)
    assert p.buffers[part.outputs[0]].name == "attn.0"
    old = lower(cfg, replace(sc, attn_direct=False))
    assert resolve(cfg, replace(sc, attn_direct=False)).kv_block < 288
    assert _ops(old)[Op.ATTN_COMBINE] > 0


def test_the_bound_keeps_blocks_where_one_partial_is_too_much_work():
    """gemma-2b (8 query heads of 256 on one KV head) lost 2.5% with one block on the H100, and llama-1b at
    capacity 4256 would give 8 partials a layer: both keep blocks and combines."""
    for name, cap in (("gemma-2b", 288), ("llama-1b", 4256), ("qwen2.5-1.5b", 672)):
        cfg = PRESETS[name]
        assert cfg.group * cfg.head_dim * cap > ONE_BLOCK_WORK
        sc = ScheduleConfig(capacity=cap, n_sms=132)
        assert resolve(cfg, sc).kv_block < cap
        assert _ops(lower(cfg, sc))[Op.ATTN_COMBINE] > 0


@pytest.mark.parametrize("name, one, blocks", [("qwen3-1.7b", 640, 656), ("llama-7b-32k", 640, 672),
                                               ("llama-1b", 1280, 1296), ("small", 1280, 1296)])
def test_the_rows_bound_keeps_blocks_where_one_partial_streams_too_much_cache(name, one, blocks):
    """qwen3-1.7b at capacity 1184 (2 query heads a KV head: its work within ONE_BLOCK_WORK) took 1.98 ms
    with one block against 1.74 with blocks on the H100, each partial streaming 606 KB of cache through
    its SM: past ONE_BLOCK_ROWS keys' elements (head_dim x capacity) a head keeps blocks, at any group."""
    cfg = PRESETS[name]
    assert cfg.head_dim * one <= ONE_BLOCK_ROWS < cfg.head_dim * blocks
    assert resolve(cfg, ScheduleConfig(capacity=one, n_sms=132)).kv_block == one
    sc = ScheduleConfig(capacity=blocks, n_sms=132)
    assert resolve(cfg, sc).kv_block < blocks and _ops(lower(cfg, sc))[Op.ATTN_COMBINE] > 0


def test_combines_stay_where_they_carry_lora_or_the_o_tiles_combine():
    """The producers' LoRA form has each combine write the o group's partial products, and fuse_combine has
    the o tiles combine on load: one block keeps its partials then (and its combine, or the o tiles')."""
    cfg = PRESETS["small"]
    lora = ScheduleConfig(capacity=288, n_sms=132, lora_adapters=1, lora_rank=4, lora_targets=("o",),
                          lora_a_tasks=False)
    assert resolve(cfg, lora).kv_block == 288 and _ops(lower(cfg, lora))[Op.ATTN_COMBINE] > 0
    fused = ScheduleConfig(capacity=288, n_sms=132, fuse_combine=True)
    p = lower(cfg, fused)
    assert _ops(p)[Op.ATTN_COMBINE] == 0 and "part.0" in {b.name for b in p.buffers}


@pytest.mark.parametrize("name, window", [("small", 0), ("qwen3-1.7b", 0), ("qwen2.5-1.5b", 0), ("small", 5)])
def test_direct_form_decodes_what_the_combine_does(name, window):
    """ReferenceVM, two layers and a small vocabulary, f32: one block with the partial normalising (the
    default) and the same block through ATTN_COMBINE give the same tokens and bit-identical logits (the
    partial applies the combine's own arithmetic); a sliding window too (Mistral's)."""
    from megavm.schedule.weights import program_weights, random_hf_weights
    from megavm.vm.pack import pack
    from megavm.vm.reference import ReferenceVM
    from megavm.vm.verify import greedy, reference_step
    cfg = replace(PRESETS[name], n_layers=2, vocab=512, sliding_window=window or None)
    w = program_weights(cfg, random_hf_weights(cfg, torch.float32, seed=3))
    runs = []
    for direct in (True, False):
        sc = ScheduleConfig(dtype="f32", capacity=64, kv_block=64, n_sms=132, attn_direct=direct)
        b = plan(cfg, sc).checked()
        assert (_ops(b.program)[Op.ATTN_COMBINE] == 0) == direct
        runs.append(greedy(reference_step(ReferenceVM(pack(b.program, b.queues), w)), [5, 7, 9, 11, 2, 3, 4], 4))
    a, c = runs
    assert a.tokens == c.tokens
    assert all(torch.equal(x, y) for x, y in zip(a.logits, c.logits))


def test_opcode_refuses_a_direct_output_of_the_wrong_shape_or_several_blocks():
    from megavm.schedule.validate import validate
    cfg = PRESETS["small"]
    p = lower(cfg, ScheduleConfig(capacity=288, n_sms=132))
    assert validate(p).ok
    part = next(i for i, t in enumerate(p.tasks) if t.opcode == Op.ATTN_PARTIAL)
    t = p.tasks[part]
    p.tasks[part] = replace(t, params={**t.params, "block_size": 144})       # two blocks, one output
    report = validate(p)
    assert any("do not cover capacity 288" in x.message for x in report.problems)
    ffn = next(i for i, b in enumerate(p.buffers) if b.name == "ffn.0")
    p.tasks[part] = replace(t, outputs=(ffn,))                              # not q's shape
    report = validate(p)
    assert any("must have q's shape" in x.message for x in report.problems)
