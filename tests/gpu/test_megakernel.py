"""The megakernel against ReferenceVM and the eager model, on an NVIDIA GPU (marker: cuda)."""
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from megavm.core import abi
from megavm.core.errors import DeviceError, InputError
from megavm.core.types import BufferKind
from megavm.instructions.kv_cache import swizzle
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.eager import EagerDecoder
from megavm.schedule.models import PRESETS, ModelConfig
from megavm.vm.megakernel import Ablations, MegakernelVM
from megavm.vm.reference import ReferenceVM
from megavm.vm.verify import VS_EAGER
from tests.gpu.harness import build, rel_err, written

pytestmark = pytest.mark.cuda

# Odd shapes: every opcode with tiles that do not divide evenly, rows split across ring stages
# (K=8200 bf16 is longer than one 16 KiB stage), group of 3, head_dim 24, a block size of 7.
ODD = ModelConfig(dim=72, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=24, ffn_dim=8200, vocab=301)
ODD_LC = dict(capacity=50, qkv_rows=6, o_rows=5, ffn_rows=7, down_rows=5, lm_rows=13, kv_block=7, embed_cols=24)
TOL = {"f32": 1e-5, "bf16": 2e-3}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("n_sms", [1, 7, None])
def test_every_opcode_matches_reference(dtype, n_sms):
    """Every buffer every opcode writes, after each of several steps, against ReferenceVM on the GPU."""
    _assert_every_written_buffer_matches(ScheduleConfig(dtype=dtype, **ODD_LC), n_sms, f"{dtype=} {n_sms=}")


# Attention groups beside ODD's 3 x 24: 4 query heads of head_dim 64 (one head batch, eight key splits)
# 8 x 128 (two head batches, four key splits each), 8 x 256 (bf16: tensor cores, four warps a key split,
# each a quarter of head_dim) and 16 x 256 (the capacities: 32 lanes a key).
GROUPS = {"g4-hd64": replace(ODD, n_heads=8, head_dim=64), "g8-hd128": replace(ODD, n_heads=16, head_dim=128),
          "g8-hd256": replace(ODD, n_heads=16, head_dim=256), "g16-hd256": replace(ODD, n_heads=32, head_dim=256)}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("shape,kv_block",
                         [(s, 7) for s in sorted(GROUPS)] + [(s, 50) for s in ["odd", *sorted(GROUPS)]])
def test_attention_groups_match_reference(dtype, shape, kv_block):
    """(kv_block 50: one block a KV head, whose partial writes the attention output: attn_direct.)"""
    rows = {"qkv_rows": 8} if shape in GROUPS else {}     # 8 divides 64, 128 and 256
    lc = ScheduleConfig(dtype=dtype, **(ODD_LC | rows | {"kv_block": kv_block}))
    _assert_every_written_buffer_matches(lc, None, f"{shape} {dtype} {kv_block=}", GROUPS.get(shape, ODD))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("shape,q_heads", [("odd", 2), ("g8-hd256", 3)])
def test_combine_ranges_match_reference(dtype, shape, q_heads):
    """ATTN_COMBINE tasks over a range of a group's query heads (ranges of 2 + 1 of ODD's 3, and 3 + 3 + 2 of 8),
    every written buffer against ReferenceVM."""
    rows = {"qkv_rows": 8} if shape in GROUPS else {}
    lc = ScheduleConfig(dtype=dtype, **(ODD_LC | rows | {"combine_q_heads": q_heads}))
    _assert_every_written_buffer_matches(lc, None, f"{shape} {dtype} {q_heads=}", GROUPS.get(shape, ODD))


# Blocks of several ring stages on the partial's tensor-core path (bf16, head_dim 64, 128 and 256): blocks of
# 300 keys (3 and 5 stages), a sliding window that starts a block mid-tile, random K/V history, and
# positions at the stage, tile and block edges.
LONG = {**GROUPS, "g4-hd64-window": replace(GROUPS["g4-hd64"], family="mistral", sliding_window=200)}


@pytest.mark.parametrize("shape,kv_block", [(s, 300) for s in sorted(LONG)]
                         + [(s, 704) for s in ("g4-hd64", "g8-hd128", "g4-hd64-window")])
def test_attention_long_blocks_match_reference(shape, kv_block):
    """(kv_block 704: one block of the whole capacity, whose partial writes the attention output.)"""
    cfg, where = LONG[shape], f"{shape} long blocks of {kv_block}"
    lc = ScheduleConfig(dtype="bf16", **(ODD_LC | {"qkv_rows": 8, "capacity": 700, "kv_block": kv_block}))
    packed, w, _ = build(cfg, lc, seed=5)
    gpu, ref = MegakernelVM(packed, w), ReferenceVM(packed, w, device="cuda")
    _random_history(packed, gpu, ref)
    tok = 17
    for pos in (0, 5, 127, 128, 129, 255, 299, 300, 301, 415, 511, 600, 699):
        res = gpu.run({"token": tok, "pos": pos})
        out = ref.step({"token": tok, "pos": pos})
        res.wait()
        for b in written(packed):
            err = rel_err(gpu.t[b], ref.t[b])
            assert err <= TOL["bf16"], f"{where} {pos=} buffer {packed.names[b]}: {err=:.2e}"
        assert res.token == int(out["next_token"][0]), f"{where} {pos=}"
        tok = res.token


def _random_history(packed, *vms):
    """The same random rows in every KV cache of each VM (MegakernelVM or ReferenceVM)."""
    gen = torch.Generator(device="cuda").manual_seed(6)
    for b in range(len(packed.buffers)):
        if packed.buffer(b).kind == BufferKind.KV_CACHE:
            hist = torch.randn(tuple(vms[0].t[b].shape), device="cuda", generator=gen)
            for vm in vms:
                vm.t[b].copy_(hist.to(vm.t[b].dtype))


def _assert_every_written_buffer_matches(lc: ScheduleConfig, n_sms, where: str, cfg: ModelConfig = ODD,
                                        defines: dict | None = None):
    """cfg (default ODD) lowered with lc, greedy from token 17 at positions 0, 4, .., 44: every buffer a
    task writes within TOL of ReferenceVM after each step, and the same token (defines: build knobs)."""
    packed, w, _ = build(cfg, lc, seed=3, n_sms=n_sms)
    gpu = MegakernelVM(packed, w, defines=defines)
    ref = ReferenceVM(packed, w, device="cuda")
    tok = 17
    for pos in range(0, 45, 4):
        res = gpu.run({"token": tok, "pos": pos})
        out = ref.step({"token": tok, "pos": pos})
        res.wait()
        for b in written(packed):
            err = rel_err(gpu.t[b], ref.t[b])
            assert err <= TOL[lc.dtype], f"{where} {pos=} buffer {packed.names[b]}: {err=:.2e}"
        assert res.token == int(out["next_token"][0]), f"{where} {pos=}"
        tok = res.token


UNFUSED = dict(fuse_norm=False, fuse_rope=False, fuse_residual=False, fuse_argmax=False)

# The families' departures from Llama on odd shapes: q/k/v biases, per-head q/k norms with head_dim not
# hidden / heads, a sliding window shorter than the positions decoded, GELU-tanh with (1 + w) norms, a
# scaled embedding and one KV head (tests/schedule/test_families.py holds them against transformers).
FAMILIES = {
    "qwen2": replace(ODD, family="qwen2", qkv_bias=True),
    "qwen3": replace(ODD, family="qwen3", qk_norm=True, head_dim=32),
    "mistral": replace(ODD, family="mistral", sliding_window=8),
    "gemma": replace(ODD, family="gemma", n_kv_heads=1, mlp_act="gelu_tanh", norm_offset=1.0, embed_scale=72 ** 0.5,
                     tied_embeddings=True),
}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_families_match_reference(family, dtype):
    """Each family's departures from Llama, every buffer written after each step, against ReferenceVM."""
    _assert_every_written_buffer_matches(family_schedule(dtype), 7, f"{family} {dtype=}", FAMILIES[family])


def family_schedule(dtype: str) -> ScheduleConfig:
    """ODD's tiling without its q/k/v tile height (a head norm takes whole heads)."""
    return ScheduleConfig(dtype=dtype, **{k: v for k, v in ODD_LC.items() if k != "qkv_rows"})


@pytest.mark.parametrize("kw", [{}, {"split_head_norm": False}, UNFUSED], ids=["split", "whole_heads", "unfused"])
def test_head_norm_lowerings_match_reference(kw):
    """Per-head q/k norms with q/k/v biases: short q/k tiles finished by ROPE and KV_APPEND tasks (the
    default), whole-head tiles, and the unfused RoPE; every buffer written, against ReferenceVM."""
    cfg = replace(FAMILIES["qwen3"], qkv_bias=True)
    _assert_every_written_buffer_matches(replace(family_schedule("f32"), **kw), 7, f"qwen3 with biases {kw}", cfg)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_unfused_opcodes_match_reference(dtype):
    """The fusion ablations' opcodes (RMSNORM, LINEAR, ADD, ROPE, KV_APPEND, ARGMAX over logits) on the
    odd shapes: every buffer they write, after each of several steps, against ReferenceVM."""
    _assert_every_written_buffer_matches(ScheduleConfig(dtype=dtype, **ODD_LC, **UNFUSED), 7, f"unfused {dtype=}")


# The GEMV's paths (instructions/gemv_core.cuh, gemv_kp) in whole models: K = 1024, 2048, 4096 and 8192 give
# 1, 2, 4 and 8 chunks of 4 KiB per row in f32 (the register path), 0.5 (the row-per-warp path), 1, 2
# and 4 in bf16; dim 1536 with ffn 6144 (Qwen2.5's width) gives 1.5 and 6 in f32, 0.75 and 3 in bf16
# (row per warp). Odd tile heights leave partial ring stages and rows split across the stage's row sums.
REG = [ModelConfig(dim=2048, n_layers=1, n_heads=16, n_kv_heads=4, head_dim=128, ffn_dim=8192, vocab=1000),
       ModelConfig(dim=1024, n_layers=1, n_heads=8, n_kv_heads=2, head_dim=128, ffn_dim=4096, vocab=777),
       ModelConfig(dim=1536, n_layers=1, n_heads=12, n_kv_heads=2, head_dim=128, ffn_dim=6144, vocab=999)]
REG_LC = dict(capacity=40, o_rows=5, ffn_rows=9, down_rows=3, lm_rows=13, kv_block=7)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("cfg", REG, ids=["dim2048", "dim1024", "dim1536"])
def test_register_gemv_matches_reference(cfg, dtype):
    packed, w, _ = build(cfg, ScheduleConfig(dtype=dtype, **REG_LC), seed=8)
    gpu = MegakernelVM(packed, w)
    ref = ReferenceVM(packed, w, device="cuda")
    tok = 29
    for pos in (0, 1, 9):
        res = gpu.run({"token": tok, "pos": pos})
        out = ref.step({"token": tok, "pos": pos})
        res.wait()
        for b in written(packed):
            err = rel_err(gpu.t[b], ref.t[b])
            assert err <= TOL[dtype], f"{dtype=} dim={cfg.dim} {pos=} buffer {packed.names[b]}: {err=:.2e}"
        tok = int(out["next_token"][0])
    # without the ring the attention partial takes its CUDA-core path: both sides without tensor cores
    cuda_cores = {"MVM_ATTN_MMA": 0}
    direct = MegakernelVM(packed, w, ablations=Ablations(direct_loads=True), defines=cuda_cores)
    _assert_same_steps(MegakernelVM(packed, w, defines=cuda_cores), direct, "direct loads", steps=2)


def test_tiny_fp32_decode_matches_reference_every_step():
    cfg = PRESETS["tiny"]
    packed, w, _ = build(cfg, ScheduleConfig(dtype="f32", capacity=64), seed=1)
    gpu, ref = MegakernelVM(packed, w), ReferenceVM(packed, w, device="cuda")
    tok = 3
    for pos in range(48):
        res = gpu.run({"token": tok, "pos": pos})
        out = ref.step({"token": tok, "pos": pos})
        err = ((res.logits - out["logits"]).abs().max() / out["logits"].abs().max()).item()
        assert err <= 1e-5, f"{pos=} {err=:.2e}"
        assert res.token == int(out["next_token"][0]), f"{pos=}"
        tok = res.token


@pytest.mark.parametrize("start", [0, 1000])
def test_llama1b_bf16_greedy_tokens(start):
    """64 greedy tokens identical to the eager model, logits within bf16 tolerance; the first 6 steps also
    against ReferenceVM on the GPU (it runs 18k tasks a step from Python, so not all 64)."""
    cfg = PRESETS["llama-1b"]
    cap = start + 80
    packed, w, hf = build(cfg, ScheduleConfig(dtype="bf16", capacity=cap), seed=0)
    gpu, ref = MegakernelVM(packed, w), ReferenceVM(packed, w, device="cuda")
    eager = EagerDecoder(cfg, hf, cap)
    if start:
        g = torch.Generator(device="cuda").manual_seed(5)
        for l in range(cfg.n_layers):
            for kind, store in (("k", eager.k), ("v", eager.v)):
                hist = (torch.randn(cfg.n_kv_heads, start, cfg.head_dim, generator=g, device="cuda")).to(torch.bfloat16)
                store[l, :, :start] = hist
                # the program's keys are in interleaved-pair order
                prog_hist = hist if kind == "v" else hist.view(cfg.n_kv_heads, start, 2, -1).transpose(2, 3).reshape(hist.shape)
                prog_hist = swizzle(prog_hist)        # as the cache keeps its rows
                gpu.buffer(f"{kind}_cache.{l}")[:, :start] = prog_hist
                ref.buffer(f"{kind}_cache.{l}")[:, :start] = prog_hist
    tok, worst, ties = 9, 0.0, 0
    for i in range(64):
        pos = start + i
        res = gpu.run({"token": tok, "pos": pos})
        e = eager.step(tok, pos)
        scale = e.abs().max().item()
        err = (res.logits - e).abs().max().item() / scale
        if i < 6:
            r = ref.step({"token": tok, "pos": pos})
            err = max(err, (r["logits"] - e).abs().max().item() / scale)
            assert res.token == int(r["next_token"][0]), f"{pos=}"
        worst = max(worst, err)
        assert err <= VS_EAGER["bf16"].value, f"{pos=} {err=:.2e}"
        ties += _same_token_or_near_tie(res.token, e, res.logits, f"{pos=}")
        tok = int(e.argmax())           # both continue from the eager model's token
    assert ties <= 2, f"{ties} near-ties decided differently in 64 steps"
    print(f"llama-1b from {start}: worst logit error {worst:.2e} of max |logit|, {ties} near-ties")


def _same_token_or_near_tie(token: int, eager_logits: torch.Tensor, kernel_logits: torch.Tensor, where: str) -> int:
    """1 when the kernel's token differs from eager's greedy choice, which is accepted only where the
    difference of the two logit vectors explains it: eager's gap between the two tokens is at most
    twice the largest logit difference measured at that step (which the tolerance bounds)."""
    best = int(eager_logits.argmax())
    if token == best:
        return 0
    gap = (eager_logits[best] - eager_logits[token]).item()
    diff = (kernel_logits.float() - eager_logits.float()).abs().max().item()
    assert gap <= 2 * diff, (f"{where}: token {token}, eager {best}: their gap {gap:.3e} is not explained by a logit "
                             f"difference of {diff:.3e}")
    return 1


def test_repeated_launches_bitwise_identical():
    cfg = PRESETS["small"]
    packed, w, _ = build(cfg, ScheduleConfig(dtype="bf16", capacity=256), seed=2)
    vm = MegakernelVM(packed, w)
    first = vm.run({"token": 11, "pos": 7}).outputs()
    for i in range(100):
        out = vm.relaunch().outputs()
        for k in first:
            assert torch.equal(out[k], first[k]), f"launch {i}: {k} differs"


def _assert_same_steps(base: MegakernelVM, other: MegakernelVM, what, steps: int = 6):
    """Greedy steps from position 0: every output of `other` equals `base`'s, bit for bit."""
    tok = 5
    for pos in range(steps):
        a = base.run({"token": tok, "pos": pos}).outputs()
        b = other.run({"token": tok, "pos": pos}).outputs()
        for k in a:
            assert torch.equal(a[k], b[k]), f"{what} {pos=} {k} differs"
        tok = int(a["next_token"][0])


def test_inline_combine_bit_identical_and_matches_reference():
    """Combines run inline on the SM of each head's last partial (inline_combine, a build with
    MVM_INLINE_TASKS=1) compute what queued combines do, bit for bit, over 6 greedy steps; and every
    buffer a task writes matches ReferenceVM (which runs the same inline tasks) on the ODD shape."""
    cfg = PRESETS["small"]
    packed, w, _ = build(cfg, ScheduleConfig(dtype="bf16", capacity=64, attn_direct=False), seed=4)
    inline, _, _ = build(cfg, ScheduleConfig(dtype="bf16", capacity=64, attn_direct=False, inline_combine=True), seed=4)
    knob = {"MVM_INLINE_TASKS": 1}
    _assert_same_steps(MegakernelVM(packed, w), MegakernelVM(inline, w, defines=knob), "inline_combine")
    _assert_every_written_buffer_matches(ScheduleConfig(dtype="bf16", inline_combine=True, **ODD_LC), 5, "inline",
                                         defines=knob)


@pytest.mark.parametrize("ablation", [Ablations(direct_loads=True), Ablations(attn_history=False), Ablations(rebuild_tables=True),
                                      Ablations(evict_first=False)])
def test_ablations_bit_identical(ablation):
    """Without the ring (direct loads, no attention history) the partial takes its CUDA-core path: both
    sides then run a build without the tensor-core path (MVM_ATTN_MMA=0), the same arithmetic."""
    cfg = PRESETS["small"]
    packed, w, _ = build(cfg, ScheduleConfig(dtype="bf16", capacity=64), seed=4)
    defines = {"MVM_ATTN_MMA": 0} if ablation.direct_loads or not ablation.attn_history else None
    _assert_same_steps(MegakernelVM(packed, w, defines=defines),
                       MegakernelVM(packed, w, ablations=ablation, defines=defines), ablation)


def test_tensor_core_partial_matches_the_cuda_core_one():
    """The partial on tensor cores (default build) against MVM_ATTN_MMA=0 on the small preset (4 query
    heads of head_dim 64, as llama-1b) over random K/V history in blocks of 400 keys: the same greedy
    tokens, logits within bf16 tolerance."""
    packed, w, _ = build(PRESETS["small"], ScheduleConfig(dtype="bf16", capacity=1100, kv_block=400), seed=7)
    mma, cuda = MegakernelVM(packed, w), MegakernelVM(packed, w, defines={"MVM_ATTN_MMA": 0})
    _random_history(packed, mma, cuda)
    tok = 3
    for pos in range(0, 1000, 37):
        a, b = mma.run({"token": tok, "pos": pos}), cuda.run({"token": tok, "pos": pos})
        assert a.token == b.token, f"{pos=}"
        assert rel_err(a.logits, b.logits) <= TOL["bf16"], f"{pos=}"
        tok = a.token


def test_unsatisfiable_wait_reports_dump_then_recovers():
    cfg = PRESETS["tiny"]
    packed, w, _ = build(cfg, ScheduleConfig(dtype="f32", capacity=32), seed=1)
    bad = type(packed).from_bytes(packed.to_bytes())
    bad.meta = packed.meta
    # a counter wait (a polled one is met by its tagged words: test_tag_poll_timeout_reports_dump)
    i = next(i for i, r in enumerate(bad.instrs) if r["n_waits"] > 0 and not r["flags"] & abi.INSTR_POLLED_WAIT0)
    bad.instrs[i]["waits"][0]["threshold"] += 1000
    vm = MegakernelVM(bad, w)
    t0 = time.time()
    with pytest.raises(DeviceError) as ei:
        vm.run({"token": 1, "pos": 0}).wait()
    took = time.time() - t0
    assert took < 2.0, f"{took=:.2f}s"
    # the first wait to time out is reported: the broken one, or a task downstream of it (a counter
    # wait, or the poll of a tagged word its blocked producer never stores)
    d = ei.value.dump
    rec = bad.instrs[np.flatnonzero(bad.instrs["task"] == d["task"])[0]]
    if d["status"] == abi.Status.TAG_TIMEOUT:
        assert d["counter"] in rec["inputs"][:rec["n_inputs"]] and d["value"] != d["target"], d
        assert "poll timed out" in str(ei.value) and "tagged buffer" in str(ei.value)
    else:
        assert d["status"] == abi.Status.WAIT_TIMEOUT and d["value"] < d["target"], d
        assert d["counter"] in [int(w["counter"]) for w in rec["waits"][:rec["n_waits"]]], d
        assert "timed out" in str(ei.value) and "counter" in str(ei.value)
    good = MegakernelVM(packed, w)
    ref = ReferenceVM(packed, w, device="cuda")
    assert good.run({"token": 1, "pos": 0}).token == int(ref.step({"token": 1, "pos": 0})["next_token"][0])


def test_unknown_opcode_is_reported():
    cfg = PRESETS["tiny"]
    packed, w, _ = build(cfg, ScheduleConfig(dtype="f32", capacity=32), seed=1)
    bad = type(packed).from_bytes(packed.to_bytes())
    bad.meta = packed.meta
    bad.instrs[0]["opcode"] = 99
    with pytest.raises(DeviceError, match="unknown opcode 99"):
        MegakernelVM(bad, w).run({"token": 1, "pos": 0}).wait()


def test_bad_inputs_refused_and_cache_unchanged():
    cfg = PRESETS["tiny"]
    packed, w, _ = build(cfg, ScheduleConfig(dtype="bf16", capacity=32), seed=1)
    vm = MegakernelVM(packed, w)
    vm.run({"token": 3, "pos": 0}).wait()
    before = {n: vm.buffer(n).clone() for n in vm.p.names if "cache" in n}
    with pytest.raises(InputError, match="token id 256"):
        vm.run({"token": cfg.vocab, "pos": 1})
    with pytest.raises(InputError, match="position 32"):
        vm.run({"token": 3, "pos": 32})
    torch.cuda.synchronize()
    for n, t in before.items():
        assert torch.equal(vm.buffer(n), t), f"{n} changed"
    ref = ReferenceVM(packed, w, device="cuda")
    ref.step({"token": 3, "pos": 0})
    assert vm.run({"token": 3, "pos": 1}).token == int(ref.step({"token": 3, "pos": 1})["next_token"][0])


@pytest.mark.parametrize("cfg,dtype,n_sms", [(ODD, "f32", 1), (ODD, "bf16", 7), (PRESETS["small"], "bf16", None),
                                             (FAMILIES["qwen3"], "bf16", 7)])
def test_in_kernel_token_loop_equals_host_loop(cfg, dtype, n_sms):
    """One launch of the token loop gives the host loop's tokens, KV caches and last logits, bit for bit;
    on 1 and 7 SMs the steps overlap as much as they can. Qwen3's KV_APPEND finishers hand the partials
    this step's K rows and append them for the next step's history streams."""
    lc = ScheduleConfig(dtype=dtype, **ODD_LC) if cfg is ODD else ScheduleConfig(dtype=dtype, capacity=96)
    packed, w, _ = build(cfg, lc, seed=6, n_sms=n_sms)
    loop, host = MegakernelVM(packed, w), MegakernelVM(packed, w, ablations=Ablations(host_loop=True))
    prompt, n = [17, 4, 250, 9], 40
    a, b = loop.generate(prompt, n, start_pos=2), host.generate(prompt, n, start_pos=2)
    assert a == b, f"in-kernel {a} vs host {b}"
    for name in loop.p.names:
        if "cache" in name or name == "logits":
            assert torch.equal(loop.buffer(name), host.buffer(name)), f"{name} differs"
    # the VM goes on from where the loop stopped
    pos = 2 + len(prompt) + n - 1
    assert loop.run({"token": a[-1], "pos": pos}).token == host.run({"token": b[-1], "pos": pos}).token


def test_llama1b_in_kernel_generation_matches_eager():
    """Every token of one 64-token in-kernel generation is the eager model's greedy choice given the same
    prefix (teacher-forced on the kernel's own tokens), or a near-tie; at most two near-ties."""
    cfg = PRESETS["llama-1b"]
    packed, w, hf = build(cfg, ScheduleConfig(dtype="bf16", capacity=96), seed=0)
    prompt, n = [9, 4000, 77], 64
    ours = MegakernelVM(packed, w).generate(prompt, n)
    assert len(ours) == n and all(0 <= t < cfg.vocab for t in ours), f"{len(ours)=}, {ours=}"
    eager, replay = EagerDecoder(cfg, hf, 96), MegakernelVM(packed, w)   # the replay's logits: the loop's, bit for bit
    seq, ties = prompt + ours, 0
    for pos in range(len(prompt) + n - 1):
        logits, res = eager.step(seq[pos], pos), replay.run({"token": seq[pos], "pos": pos})
        if pos >= len(prompt) - 1:
            assert res.token == seq[pos + 1], f"step {pos}: the replay's token {res.token}, the loop's {seq[pos + 1]}"
            ties += _same_token_or_near_tie(seq[pos + 1], logits, res.logits, f"token {pos + 1 - len(prompt)}")
    assert ties <= 2, f"{ties} near-ties decided differently in {n} tokens"
    print(f"in-kernel generation: {n} tokens, each eager's choice on the same prefix ({ties} near-ties)")


def test_generate_refuses_bad_prompt_and_length():
    cfg = PRESETS["tiny"]
    packed, w, _ = build(cfg, ScheduleConfig(dtype="bf16", capacity=32), seed=1)
    vm = MegakernelVM(packed, w)
    vm.generate([3], 4)
    before = {n: vm.buffer(n).clone() for n in vm.p.names if "cache" in n}
    with pytest.raises(InputError, match=f"token id {cfg.vocab}"):
        vm.generate([3, cfg.vocab], 4)
    with pytest.raises(InputError, match="position 32"):
        vm.generate([3, 5], 30, start_pos=2)       # the last step would decode at position 32
    torch.cuda.synchronize()
    for n, t in before.items():
        assert torch.equal(vm.buffer(n), t), f"{n} changed"
    assert len(vm.generate([3, 5], 29, start_pos=2)) == 29


@pytest.mark.parametrize("lower_ablation", [{"fuse_combine": True}, {"head_counters": False}, {"fuse_norm": False},
                                            {"fuse_rope": False}, {"fuse_residual": False}, {"fuse_argmax": False},
                                            UNFUSED, {"strategy": "balanced"}, {"tagged": False},
                                            {"combine_q_heads": 1}, {"combine_q_heads": 3}, {"attn_direct": True},
                                            {"q_counter": True}],
                         ids=lambda d: ",".join(d))
def test_lowering_ablations_bit_identical(lower_ablation):
    """The o-projection combining the partials itself computes what ATTN_COMBINE tasks do, bit for bit;
    so do per-layer counters, each unfused form of a fusion (the same f32 arithmetic, split over
    more tasks), combines of a range of a group's query heads, another SM assignment, q on a counter of its
    own (q_counter: the q tiles' signals relaxed), and a lone block's partial writing the attention output
    itself (attn_direct, the default at this capacity: the base keeps its combine for the combine ablations)."""
    cfg = PRESETS["small"]
    base = dict(dtype="bf16", capacity=64, attn_direct=False)
    packed, w, _ = build(cfg, ScheduleConfig(**base), seed=4)
    other, _, _ = build(cfg, ScheduleConfig(**{**base, **lower_ablation}), seed=4)
    _assert_same_steps(MegakernelVM(packed, w), MegakernelVM(other, w), lower_ablation)
