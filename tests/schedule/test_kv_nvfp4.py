"""An NVFP4 KV cache (ScheduleConfig(kv_cache="nvfp4")), appended by the same two dependent steps as
the fp8 one (RMS_LINEAR_AMAX tiles -> a KV_QUANT per KV head): e2m1 codes (two a byte, element 2i in
the low nibble), an e4m3 scale per 16 elements (<which>_bscale) and an f32 scale 1 / global per (KV
head, position); the attention partial reads e2m1(code) x block scale x scale. On the CPU: codes,
block scales and scales are bit for bit those of vLLM's reference NVFP4 quantizer (written out here
from its published formula, not megavm's codec) on random rows, e2m1 ties of both parities, zero rows
and blocks, e4m3-subnormal block scales and f32-subnormal rows; the lowering's buffers and slots;
ReferenceVM decodes as the eager model of that cache (and measurably unlike the unquantized and fp8
ones); an early KV_QUANT is refused by the validator and caught by the checking VM; operands and
configurations that do not fit are refused."""
import random
from dataclasses import replace

import pytest
import torch

from megavm.core.errors import ConfigError
from megavm.core.types import Buffer, BufferKind, DType
from megavm.fuzz import amax_early, random_weights, run_checked
from megavm.instructions import Op, spec
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.lower import lower
from megavm.schedule.models import ModelConfig
from megavm.schedule.validate import validate
from megavm.vm.pack import pack
from tests.programs import check_reference_decodes_kv_cache

CFG = ModelConfig(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=96, vocab=200)
FAMILIES = {"hd64-gqa": CFG, "hd128-gqa": replace(CFG, head_dim=128),
            "mqa-window": replace(CFG, n_kv_heads=1, sliding_window=4),
            "bias-qknorm": replace(CFG, qkv_bias=True, qk_norm=True)}
GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def recip(x: torch.Tensor) -> torch.Tensor:                 # vLLM's get_reciprocal: 1 / x, 0 for 0
    return torch.where(x == 0, torch.zeros_like(x), 1.0 / x)


def e2m1(v: float) -> int:
    """The e2m1 code of a scaled value in [-6, 6]: the nearest grid value, a tie to the even code; what
    rounds to 0 is +0; sign in bit 3."""
    i = min(range(8), key=lambda k: (abs(abs(v) - GRID[k]), k % 2))
    return i | (8 if v < 0 and i else 0)


def vllm_nvfp4(x: torch.Tensor):
    """vLLM's reference NVFP4 quantizer (tests/kernels/quantization/test_nvfp4_quant.py: ref_nvfp4_quant,
    its global scale 448 x 6 / amax as nvfp4_utils.py's get_nvfp4_global_scale) of a row x [n] f32:
    (packed codes [n / 2] uint8, block scales [n / 16] e4m3, scale 1 / global, the scaled values). An
    all-zero row is megavm's definition: global 1."""
    amax = x.abs().max()
    g = (448.0 * 6.0) / amax if amax > 0 else torch.tensor(1.0)
    blocks = x.float().view(-1, 16)
    bs = (g * (blocks.abs().amax(-1) * (1.0 / 6.0))).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    scaled = (blocks * recip(bs.float() * recip(g)).unsqueeze(-1)).clamp(-6.0, 6.0).view(-1)
    codes = [e2m1(v) for v in scaled.tolist()]
    packed = torch.tensor([codes[i] | codes[i + 1] << 4 for i in range(0, len(codes), 2)], dtype=torch.uint8)
    return packed, bs, (1.0 / g).float(), scaled


def _row(kind: str, n: int = 128) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, generator=g) * 3
    if kind == "ties":      # amax 42: global 64; blocks p x [6, +-midpoints, 0]: block scale 64 p, scaled = x / p
        block = torch.tensor([6.0, *MIDS, *(-m for m in MIDS), 0.0])
        x = torch.cat([torch.tensor([42.0] + [1.0] * 15)] + [p * block for p in (1.0, 0.5, 2.0, 0.25, 4.0, 0.125, 1.0)])
    elif kind == "zero":
        x = torch.zeros(n)
    elif kind == "zero-block":
        x[32:48] = 0
    elif kind == "e4m3-subnormal":   # global 1: blocks of amax < 6 x 2^-6 have subnormal scales, 2^-12: scale 0
        x = torch.cat([torch.tensor([2688.0]), x[1:16], x[16:] * torch.tensor([0.01, 0.004, 2e-3, 1e-3, 3e-4, 1e-5,
                                                                                1.0]).repeat_interleave(16)])
    elif kind == "f32-subnormal":    # the global scale overflows to inf: scale 0, block scales 448
        x = x * 1e-39
    return x


@pytest.mark.parametrize("kind", ["random", "ties", "zero", "zero-block", "e4m3-subnormal", "f32-subnormal"])
def test_kv_quant_codes_and_scales_are_vllms(kind):
    """KV_QUANT over 2 KV heads of 64 at position 5, the amax from 3 partials: codes (bit for bit), block
    scales and scale (exactly) of vLLM's quantization of the whole row; no NaN; nothing but position 5
    written."""
    y = _row(kind)
    nkv, hd, cap, t = 2, 64, 8, 5
    partials = torch.stack([y[:20].abs().max(), y[20:71].abs().max(), y[71:].abs().max()])
    codes, bs, scale, scaled = vllm_nvfp4(y)
    cache = torch.full((nkv, cap, hd // 2), 0xAA, dtype=torch.uint8)
    sc = torch.full((nkv, cap), -1.0)
    bsc = torch.full((nkv, cap, hd // 16), 0x33, dtype=torch.uint8).view(torch.float8_e4m3fn)
    for h in range(nkv):
        spec(Op.KV_QUANT).reference(dict(kv_head=h), [y, partials, torch.tensor([t])], [cache, sc, bsc])
    assert torch.equal(cache[:, t].reshape(-1), codes), kind
    assert torch.equal(bsc[:, t].reshape(-1).view(torch.uint8), bs.view(torch.uint8)), kind
    assert torch.equal(sc[:, t], scale.expand(nkv)), kind
    assert not torch.isnan(bsc[:, t].float()).any() and torch.isfinite(sc[:, t]).all()
    others = [u for u in range(cap) if u != t]
    assert (cache[:, others] == 0xAA).all() and (sc[:, others] == -1).all()
    assert (bsc[:, others].view(torch.uint8) == 0x33).all()
    if kind == "ties":                  # the ties are really there, on both sides of even codes
        assert all((scaled == m).any() and (scaled == -m).any() for m in MIDS)
    if kind == "zero":
        assert (codes == 0).all() and (bs.float() == 0).all() and scale == 1.0
    if kind == "zero-block":
        assert bs[2].float() == 0 and (codes[16:24] == 0).all()
    if kind == "e4m3-subnormal":
        assert scale == 1.0 and ((bs.float() < 2 ** -6) & (bs.float() > 0)).sum() >= 3 and (bs.float() == 0).any()


def test_an_all_zero_block_of_a_tiny_row_is_not_nan():
    """megavm's own definitions (core/codecs.py): an all-zero block has scale 0 and codes 0, also in a row
    whose amax (below 2688 / f32 max, about 8e-36) makes the global scale inf; such a row reads back as
    zeros (scale 1 / global = 0), never NaN."""
    y = _row("f32-subnormal")
    y[32:48] = 0
    cache, sc = torch.zeros(2, 1, 32, dtype=torch.uint8), torch.zeros(2, 1)
    bsc = torch.zeros(2, 1, 4, dtype=torch.float8_e4m3fn)
    for h in range(2):
        spec(Op.KV_QUANT).reference(dict(kv_head=h), [y, y.abs().max().view(1), torch.tensor([0])], [cache, sc, bsc])
    assert not torch.isnan(bsc.float()).any() and bsc[0, 0, 2].float() == 0
    assert (sc == 0).all() and (cache == 0).all()


def test_lowering():
    """Per layer and k / v: E2M1 caches [kv_heads, capacity, head_dim], e4m3 block scales [.., head_dim /
    16] and f32 scales [kv_heads, capacity]; each KV_QUANT writes all three; each partial reads the
    scales at slots 4 / 5 and the block scales at 8 / 9; the program is valid."""
    p = lower(CFG, ScheduleConfig(dtype="f32", capacity=16, n_sms=8, kv_cache="nvfp4"))
    want = {"cache": (DType.E2M1, (2, 16, 64)), "bscale": (DType.F8E4M3, (2, 16, 4)), "scale": (DType.F32, (2, 16))}
    for l in range(CFG.n_layers):
        ids = {f"{w}_{n}": p.buffer_id(f"{w}_{n}.{l}") for w in "kv" for n in want}
        for which in "kv":
            for n, (dt, shape) in want.items():
                buf = p.buffers[ids[f"{which}_{n}"]]
                assert (buf.kind, buf.dtype, buf.shape) == (BufferKind.KV_CACHE, dt, shape), (which, n)
            tiles = [t for t in p.tasks if t.opcode == Op.RMS_LINEAR_AMAX and t.label.startswith(f"L{l}.{which}[")]
            quant = [t for t in p.tasks if t.opcode == Op.KV_QUANT and t.label.startswith(f"L{l}.{which}_quant")]
            assert tiles and len(quant) == 2 and all(q.waits[0].threshold == len(tiles) for q in quant)
            assert all(q.outputs == tuple(ids[f"{which}_{n}"] for n in ("cache", "scale", "bscale")) for q in quant)
        parts = [t for t in p.tasks if t.opcode == Op.ATTN_PARTIAL and t.label.startswith(f"L{l}.attn")]
        assert parts and all(t.inputs[4:6] == (ids["k_scale"], ids["v_scale"]) and
                             t.inputs[8:10] == (ids["k_bscale"], ids["v_bscale"]) for t in parts)
    assert validate(p, assign(p, 8)).ok


@pytest.mark.parametrize("family,n_sms", [("hd64-gqa", 1), ("hd64-gqa", 5), ("hd128-gqa", 3), ("mqa-window", 5),
                                          ("bias-qknorm", 4)])
def test_reference_vm_decodes_as_the_nvfp4_cache_model(family, n_sms):
    """ReferenceVM (checking mode, a seeded interleaving) against the eager model whose cache keeps what
    the NVFP4 rows stand for (keys' blocks in the cache's RoPE pair order): tokens identical, logits
    within 1e-5 of the largest (f32). The eager models with an unquantized and with an fp8 cache are
    1e-3 or more away over the run, so the check tells them apart."""
    check_reference_decodes_kv_cache(FAMILIES[family], "nvfp4", n_sms, 16, others=("", "fp8"))


def test_an_early_quantize_is_refused_and_caught():
    """amax_early on an nvfp4 program (a KV_QUANT that may run before every amax partial is written):
    the validator refuses it on the partials' buffer and the checking VM (no validator) raises a race."""
    p = lower(CFG, ScheduleConfig(dtype="f32", capacity=16, n_sms=4, kv_cache="nvfp4"))
    q, rng = assign(p, 4), random.Random(1)
    m, mq, what = amax_early(p, q, rng)
    problems = str(validate(m, mq))
    assert "read_after_write" in problems and "_amax." in problems, problems
    assert "RaceError" in (run_checked(m, mq, random_weights(m, 1), rng) or ""), what


def test_operand_checks_and_config():
    """KV_QUANT and ATTN_PARTIAL take an E2M1 cache only with e4m3 block scales [kv_heads, capacity,
    head_dim / 16] and head_dim a multiple of 32, and give no block scales to a bf16 or e4m3 cache;
    kv_cache="nvfp4" with head_dim 16 is a ConfigError."""
    kv = lambda dt, shape: Buffer("c", BufferKind.KV_CACHE, dt, shape)          # noqa: E731
    act = lambda shape: Buffer("a", BufferKind.ACTIVATION, DType.F32, shape)   # noqa: E731
    pos = Buffer("pos", BufferKind.INPUT, DType.I32, (1,))
    quant = lambda hd, cache, bs: spec(Op.KV_QUANT).check(                     # noqa: E731
        dict(kv_head=0), [act((2 * hd,)), act((4,)), pos], [kv(cache, (2, 8, hd)), kv(DType.F32, (2, 8))] + bs)
    e4m3 = lambda hd: [kv(DType.F8E4M3, (2, 8, hd // 16))]                     # noqa: E731
    assert quant(64, DType.E2M1, e4m3(64)) == []
    assert any("takes its block_scale" in e for e in quant(64, DType.E2M1, []))
    assert any("block_scale is F8E4M3 (2, 8, 2)" in e for e in quant(64, DType.E2M1, e4m3(32)))
    assert any("block_scale is F32" in e for e in quant(64, DType.E2M1, [kv(DType.F32, (2, 8, 4))]))
    assert any("multiple of 32" in e for e in quant(48, DType.E2M1, e4m3(48)))
    assert any("takes no block_scale" in e for e in quant(64, DType.F8E4M3, e4m3(64)))
    assert any("expected F8E4M3 or E2M1" in e for e in quant(64, DType.BF16, e4m3(64)))

    def part(dt, hd, scales, bs):
        ins = [act((4 * hd,)), kv(dt, (2, 8, hd)), kv(dt, (2, 8, hd)), pos] + scales + [None, None] + bs
        return spec(Op.ATTN_PARTIAL).check(dict(kv_head=0, block=0, block_size=8, scale=0.1, window=0), ins,
                                           [act((2, 1, 2, hd + 2))])
    s = [kv(DType.F32, (2, 8))] * 2
    assert part(DType.E2M1, 64, s, e4m3(64) * 2) == []
    assert any("takes its k_bscale and v_bscale" in e for e in part(DType.E2M1, 64, s, []))
    assert any("block scales F8E4M3 (2, 8, 2) do not fit" in e for e in part(DType.E2M1, 64, s, e4m3(32) * 2))
    assert any("block scales F32" in e for e in part(DType.E2M1, 64, s, [kv(DType.F32, (2, 8, 4))] * 2))
    assert any("multiple of 32" in e for e in part(DType.E2M1, 48, s, e4m3(48) * 2))
    assert any("F8E4M3 cache takes no block scales" in e for e in part(DType.F8E4M3, 64, s, e4m3(64) * 2))
    assert any("BF16 cache takes no block scales" in e for e in part(DType.BF16, 64, [None, None], e4m3(64) * 2))
    with pytest.raises(ConfigError, match="kv_cache='nvfp4' needs head_dim a multiple of 32, not 16"):
        lower(replace(CFG, dim=64, head_dim=16), ScheduleConfig(kv_cache="nvfp4"))


class _Cache:
    """A VM's NVFP4 cache at one position, as FollowKVCodes reads it (vm.buffer)."""

    def __init__(self, codes, bscale, scale):
        self.t = {"k_cache.0": codes[:, None], "k_bscale.0": bscale[:, None], "k_scale.0": scale.expand(codes.shape[0])[:, None]}

    def buffer(self, name):
        return self.t[name]


def test_follow_kv_codes_takes_near_tie_codes_only():
    """The check that follows another VM's stored codes (vm/verify.py: FollowKVCodes): a row whose one
    element sits 1e-5 of amax past a rounding midpoint, stored by the other VM on the other side, is a
    valid rounding and is followed (its values returned); a code two grid steps away is not (None,
    counted as an error); the oracle's own rounding is taken as it is."""
    from megavm.core.codecs import nvfp4_rows, nvfp4_values
    from megavm.vm.verify import FollowKVCodes
    rows = torch.randn(2, 32, generator=torch.Generator().manual_seed(4))
    rows[0, 0] = 6.0                                           # amax 6: global 448, block 0's scale 448
    _, bs, s = nvfp4_rows(rows, rows.abs().max())
    unit = bs[0, 0].float() * s
    rows[0, 1] = 1.25 * unit * (1 - 1e-5)                       # just below the midpoint of 1 and 1.5: 1
    codes, bs, s = nvfp4_rows(rows, rows.abs().max())
    near = rows.clone()
    near[0, 1] = 1.25 * unit * (1 + 1e-5)                       # just past it: 1.5
    other = nvfp4_rows(near, near.abs().max())
    assert not torch.equal(other[0], codes) and torch.equal(other[1].view(torch.uint8), bs.view(torch.uint8))
    f = FollowKVCodes(_Cache(*other))
    got = f(0, "k", 0, rows)
    assert f.followed == 1 and f.errors == 0 and torch.equal(got, nvfp4_values(*other[:2], other[2].expand(2)[:, None]))
    far = other[0].clone()
    far[0, 0] = (far[0, 0] & 0xF0) | 0x3                        # element 0 (6.0) stored as 1.5
    f = FollowKVCodes(_Cache(far, other[1], other[2]))
    assert f(0, "k", 0, rows) is None and f.errors == 1
    f = FollowKVCodes(_Cache(codes, bs, s))
    assert torch.equal(f(0, "k", 0, rows), nvfp4_values(codes, bs, s)) and f.followed == 0 and f.errors == 0


def test_a_row_not_followed_fails_the_comparison():
    """compare_following (vm/verify.py) names the rows the oracle followed, and fails the check when one
    row was no valid rounding, even with identical tokens and logits."""
    from megavm.vm.verify import Decode, Tolerance, compare_following
    d = Decode([1], [2], [torch.zeros(4)], [0.1])
    follow = type("Follow", (), {"followed": 3, "errors": 0})()
    ok = compare_following("megakernel vs eager", d, d, Tolerance("rel", 1e-5), follow)
    assert ok.ok and "3 rows followed, 0 not valid" in str(ok)
    follow.errors = 1
    assert not compare_following("megakernel vs eager", d, d, Tolerance("rel", 1e-5), follow).ok


def test_the_partials_scratch_holds_a_quantized_caches_staged_scales():
    """The tensor-core partial stages an e4m3 or e2m1 cache's scales in shared memory a pass at a time
    (attention.py: staged_scales): the scratch grows by them for those caches only, most for e2m1 (its
    block scales too), not at all for a shape that takes CUDA cores or for e2m1 at head_dim 128 (read
    from L2); scores_fit shrinks to match; the validator refuses an e2m1 block whose scores fit only
    without them; llama-1b at ctx 32768 keeps its 2048-key blocks (one partial per SM) with either cache."""
    from megavm.core.limits import MAX_K
    from megavm.instructions.attention import partial_scratch, scores_fit
    from megavm.schedule.config import resolve
    from megavm.schedule.models import PRESETS
    plain, fp8, nv = (partial_scratch(4, 64, 2048, c) for c in (None, DType.F8E4M3, DType.E2M1))
    assert plain == partial_scratch(4, 64, 2048, DType.BF16) < fp8 < nv
    assert partial_scratch(16, 64, 256, DType.E2M1) == partial_scratch(16, 64, 256)   # CUDA cores: no staging
    assert partial_scratch(4, 128, 1024, DType.E2M1) == partial_scratch(4, 128, 1024) < partial_scratch(
        4, 128, 1024, DType.F8E4M3)
    for coded in (DType.F8E4M3, DType.E2M1):
        bs = scores_fit(8, 64, coded)
        assert 0 < bs < scores_fit(8, 64)
        assert partial_scratch(8, 64, bs, coded) <= MAX_K < partial_scratch(8, 64, bs + 4, coded)
    bs = scores_fit(8, 64)
    kv = lambda dt, shape: Buffer("c", BufferKind.KV_CACHE, dt, shape)          # noqa: E731
    act = lambda shape: Buffer("a", BufferKind.ACTIVATION, DType.F32, shape)   # noqa: E731

    def part(dt, scales, bscales):
        pos = Buffer("pos", BufferKind.INPUT, DType.I32, (1,))
        ins = [act((8 * 64,)), kv(dt, (1, bs, 64)), kv(dt, (1, bs, 64)), pos]
        return spec(Op.ATTN_PARTIAL).check(dict(kv_head=0, block=0, block_size=bs, scale=0.1, window=0),
                                           ins + scales + [None, None] + bscales, [act((1, 1, 8, 66))])
    assert part(DType.BF16, [], []) == []
    overrun = part(DType.E2M1, [kv(DType.F32, (1, bs))] * 2, [kv(DType.F8E4M3, (1, bs, 4))] * 2)
    assert any("overrun" in e for e in overrun), overrun
    for kv_cache in ("fp8", "nvfp4"):
        assert resolve(PRESETS["llama-1b"], ScheduleConfig(capacity=32768, kv_cache=kv_cache)).kv_block == 2048


@pytest.mark.parametrize("hd,want", [(64, 64), (128, 128), (96, 1)])
def test_an_nvfp4_program_builds_the_partial_for_its_head_dim(hd, want):
    """MegakernelVM's build knobs for a program with an NVFP4 cache (vm/megakernel.py: program_defines):
    the tensor-core partial of its head_dim (MVM_KV_E2M1 = 64 or 128), CUDA cores only (1) for another; a
    value the caller gives is kept beside the others, 0 is refused; a program without one gets none."""
    from megavm.core.errors import UserError
    from megavm.vm.megakernel import program_defines
    cfg = replace(CFG, head_dim=hd)
    p = lower(cfg, ScheduleConfig(dtype="f32", capacity=16, n_sms=4, kv_cache="nvfp4"))
    packed = pack(p, assign(p, 4))
    ring = {"MEGAVM_MAX_K": 4280, "MVM_STAGES": 13}     # its tasks state a small xs (vm/sizing.py)
    assert program_defines(packed, None) == {"MVM_KV_E2M1": want, **ring}
    assert program_defines(packed, {"MVM_STAGES": 8}) == {"MVM_KV_E2M1": want, "MVM_STAGES": 8}
    assert program_defines(packed, {"MVM_KV_E2M1": 1}) == {"MVM_KV_E2M1": 1, **ring}
    with pytest.raises(UserError, match="MVM_KV_E2M1 non-zero"):
        program_defines(packed, {"MVM_KV_E2M1": 0})
    q = lower(cfg, ScheduleConfig(dtype="f32", capacity=16, n_sms=4, kv_cache="fp8"))
    assert program_defines(pack(q, assign(q, 4)), {"MVM_STAGES": 8}) == {"MVM_STAGES": 8}
