"""An fp8 KV cache (ScheduleConfig(kv_cache="fp8")), appended by amax -> quantize as two dependent
tasks with no host sync: every k (v) tile writes its finished rows and their partial amax
(RMS_LINEAR_AMAX), and per KV head a KV_QUANT task waits on all of those tiles, reduces the partials
to the row's amax, takes the scale amax / 448 and stores e4m3 codes and the scale; the attention
partial reads code x scale. On the CPU: codes and scales are those of vLLM's published dynamic fp8
quantizer, ReferenceVM decodes as the eager model of that cache does (and measurably unlike the
unquantized one), and the quantization seed's bug (the quantize step reading the partials before all
are written) is refused by the validator, caught by the checking VM, and made by the fuzzer."""
from dataclasses import replace

import pytest
import torch

from megavm.core.errors import ConfigError
from megavm.core.types import Buffer, BufferKind, DType
from megavm.fuzz import MUTATIONS, amax_early, fuzz, random_weights, run_checked
from megavm.instructions import Op, spec
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS, ModelConfig
from megavm.schedule.validate import validate
from tests.programs import check_reference_decodes_kv_cache

import random

E4M3_MAX = 448.0
CFG = ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96, vocab=200)
# Qwen2-style biases and Qwen3-style per-head q/k norms (whole-head tiles), MQA, a sliding window
FAMILIES = {"llama-gqa": CFG, "bias-qknorm": replace(CFG, qkv_bias=True, qk_norm=True),
            "mqa-window": replace(CFG, n_kv_heads=1, sliding_window=4),
            "hd64-swizzled": replace(CFG, dim=128, head_dim=64, n_heads=4, n_kv_heads=2)}


def vllm_dynamic_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's scaled_fp8_quant with a dynamic per-tensor scale (vllm/_custom_ops.py and its reference
    in tests/kernels/quant_utils.py): scale = amax / fp8_max, codes = clamp(x / scale, -fp8_max,
    fp8_max) converted to float8_e4m3fn (round to nearest even). An all-zero tensor is megavm's own
    definition (vLLM clamps the scale to a minimum): scale 0 and zero codes."""
    amax = x.abs().max().float()
    scale = amax / E4M3_MAX
    if amax == 0:
        return torch.zeros_like(x, dtype=torch.float8_e4m3fn), scale
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def _rows(kind: str, n: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    if kind == "random":
        return torch.randn(n, generator=g) * 3
    if kind == "ties":              # amax 448 -> scale 1: midpoints between e4m3 neighbours, both parities
        return torch.tensor([448.0, 1.0625, 1.1875, -1.0625, -1.1875, 9.0, 11.0, 0.0] * (n // 8))
    if kind == "zero":
        return torch.zeros(n)
    if kind == "subnormal":         # values whose codes are e4m3 subnormals (below 2^-6 after scaling)
        return torch.cat([torch.tensor([448.0]), torch.linspace(-2 ** -7, 2 ** -7, n - 1)])
    if kind == "tiny":              # a row of f32 subnormals: the scale itself is tiny
        return torch.randn(n, generator=g) * 1e-39
    raise KeyError(kind)


@pytest.mark.parametrize("kind", ["random", "ties", "zero", "subnormal", "tiny"])
def test_kv_quant_codes_and_scale_are_vllms(kind):
    """KV_QUANT over 2 KV heads of 32, its amax from 3 partials: the codes (bit for bit) and the scale
    (exactly) of the whole row's vLLM dynamic quantization; no NaN anywhere."""
    y = _rows(kind)
    nkv, hd, cap, t = 2, 32, 8, 5
    partials = torch.stack([y[:20].abs().max(), y[20:41].abs().max(), y[41:].abs().max()])
    want_codes, want_scale = vllm_dynamic_fp8(y)
    cache = torch.zeros(nkv, cap, hd, dtype=torch.float8_e4m3fn)
    scale = torch.full((nkv, cap), -1.0)
    for h in range(nkv):
        spec(Op.KV_QUANT).reference(dict(kv_head=h), [y, partials, torch.tensor([t])], [cache, scale])
    got = cache[:, t].reshape(-1)
    assert torch.equal(got.view(torch.uint8), want_codes.view(torch.uint8)), kind
    assert torch.equal(scale[:, t], want_scale.expand(nkv)), kind
    assert not torch.isnan(got.float()).any() and torch.isfinite(scale[:, t]).all()
    assert (scale[:, :t] == -1).all() and (cache[:, :t].view(torch.uint8) == 0).all()   # only position t


@pytest.mark.parametrize("hd", [64, 128])
def test_kv_quant_writes_rows_swizzled(hd):
    """Rows of 64 and 128 codes keep their 16-byte chunks swizzled by position (kv_cache.py), as the
    kernel's tensor-core partial reads them: logical() reads back the codes in order."""
    from megavm.instructions.kv_cache import logical
    y = _rows("random", 2 * hd)
    want, _ = vllm_dynamic_fp8(y)
    cache, scale = torch.zeros(2, 8, hd, dtype=torch.float8_e4m3fn), torch.zeros(2, 8)
    for t in range(8):
        for h in range(2):
            spec(Op.KV_QUANT).reference(dict(kv_head=h), [y, y.abs().max().reshape(1), torch.tensor([t])],
                                        [cache, scale])
    for h in range(2):
        got = logical(cache, h, 0, 8).view(torch.uint8)
        assert (got == want[h * hd:(h + 1) * hd].view(torch.uint8)).all()
    assert not torch.equal(cache[0, 2].view(torch.uint8), want[:hd].view(torch.uint8))   # row 2 is permuted


def test_rms_linear_amax_rows_are_rms_linear_kvs_and_amax_their_largest():
    """RMS_LINEAR_AMAX writes the very rows RMS_LINEAR_KV appends (bias, head norm, RoPE) and their
    largest magnitude into its amax slot."""
    hd, n, d = 8, 16, 24
    g = torch.Generator().manual_seed(0)
    x, gamma, w = torch.randn(d, generator=g), torch.rand(d, generator=g) + 0.5, torch.randn(n, d, generator=g)
    freqs, bias, norm = torch.rand(hd // 2, generator=g), torch.randn(n, generator=g), torch.rand(hd, generator=g)
    params = dict(row0=8, nrows=8, eps=1e-5, norm=1, head_dim=hd, rope=1, lora_off=0)
    ins = [x, gamma, w, torch.tensor([3]), freqs, bias, norm, None, None, None]
    cache = torch.zeros(2, 6, hd)
    spec(Op.RMS_LINEAR_KV).reference(params, ins, [cache])
    y, amax = torch.full((n,), 7.0), torch.zeros(4)
    spec(Op.RMS_LINEAR_AMAX).reference(dict(params, tile=2), ins, [y, amax])
    assert torch.equal(y[8:], cache[1, 3]) and (y[:8] == 7).all()
    assert amax[2] == cache[1, 3].abs().max() and (amax[[0, 1, 3]] == 0).all()


def test_lowering_two_dependent_steps():
    """Per layer and per k / v: RMS_LINEAR_AMAX tiles on one counter, a KV_QUANT per KV head waiting on
    all of them; e4m3 caches with f32 scales [kv_heads, capacity], read by the partials; valid."""
    p = lower(CFG, ScheduleConfig(dtype="f32", capacity=16, n_sms=8, kv_cache="fp8"))
    for l in range(CFG.n_layers):
        for which in ("k", "v"):
            c, s = p.buffers[p.buffer_id(f"{which}_cache.{l}")], p.buffers[p.buffer_id(f"{which}_scale.{l}")]
            assert (c.kind, c.dtype, c.shape) == (BufferKind.KV_CACHE, DType.F8E4M3, (2, 16, 16))
            assert (s.kind, s.dtype, s.shape) == (BufferKind.KV_CACHE, DType.F32, (2, 16))
            tiles = [t for t in p.tasks if t.opcode == Op.RMS_LINEAR_AMAX and t.label.startswith(f"L{l}.{which}[")]
            quant = [t for t in p.tasks if t.opcode == Op.KV_QUANT and t.label.startswith(f"L{l}.{which}_quant")]
            assert len(quant) == 2 and {t.signal for t in tiles} == {quant[0].waits[0].counter}
            assert all(q.waits[0].threshold == len(tiles) for q in quant)
            assert sorted(t.params["tile"] for t in tiles) == list(range(len(tiles)))
    assert not any(t.opcode in (Op.RMS_LINEAR_KV, Op.KV_APPEND) for t in p.tasks)
    assert validate(p, assign(p, 8)).ok


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("n_sms", [1, 5])
def test_reference_vm_decodes_as_the_fp8_cache_model(family, n_sms):
    """ReferenceVM (checking mode, a seeded interleaving) against the eager model whose cache keeps
    what vLLM-quantized rows stand for: tokens identical, logits within 1e-5 of the largest (f32). The
    eager model with an unquantized cache is 1e-3 or more away over the run, so the check tells the
    two apart."""
    check_reference_decodes_kv_cache(FAMILIES[family], "fp8", n_sms, 24, others=("",))


def test_the_seeds_bug_is_refused_caught_and_fuzzed():
    """A KV_QUANT that may run before every amax partial is written: the validator refuses it on the
    partials' buffer, the checking VM (no validator) raises a race, and the fuzzer's amax_early
    mutants are all rejected."""
    p = lower(PRESETS["tiny"], ScheduleConfig(dtype="f32", capacity=32, n_sms=4, kv_cache="fp8"))
    q = assign(p, 4)
    rng = random.Random(1)
    m, mq, what = amax_early(p, q, rng)
    problems = str(validate(m, mq))
    assert "read_after_write" in problems and "_amax." in problems, problems
    assert "RaceError" in (run_checked(m, mq, random_weights(m, 1), rng) or "")
    res = fuzz(2 * len(MUTATIONS), seed=3)          # two of each kind
    made = res.by_kind["amax_early"]
    assert made["made"] >= 2 and made["accepted"] == 0 and made["rejected"] == made["made"]


def test_kv_quant_checks_its_operands():
    """KV_QUANT takes an e4m3 cache and scales that fit it; the partial takes scales with e4m3 rows only."""
    kv = lambda dt, shape: Buffer("c", BufferKind.KV_CACHE, dt, shape)
    act = lambda shape: Buffer("a", BufferKind.ACTIVATION, DType.F32, shape)
    pos = Buffer("pos", BufferKind.INPUT, DType.I32, (1,))
    check = spec(Op.KV_QUANT).check
    assert check(dict(kv_head=0), [act((32,)), act((4,)), pos], [kv(DType.F8E4M3, (2, 8, 16)), kv(DType.F32, (2, 8))]) == []
    assert any("F8E4M3" in e for e in check(dict(kv_head=0), [act((32,)), act((4,)), pos],
                                              [kv(DType.BF16, (2, 8, 16)), kv(DType.F32, (2, 8))]))
    assert any("scale has shape" in e for e in check(dict(kv_head=0), [act((32,)), act((4,)), pos],
                                                       [kv(DType.F8E4M3, (2, 8, 16)), kv(DType.F32, (8,))]))
    assert any("kv_head=2" in e for e in check(dict(kv_head=2), [act((32,)), act((4,)), pos],
                                                 [kv(DType.F8E4M3, (2, 8, 16)), kv(DType.F32, (2, 8))]))
    part = spec(Op.ATTN_PARTIAL).check
    params = dict(kv_head=0, block=0, block_size=8, scale=0.25, window=0)
    ins = [act((32,)), kv(DType.BF16, (2, 8, 16)), kv(DType.BF16, (2, 8, 16)), pos]
    assert part(params, ins + [None, None], [act((2, 1, 1, 18))]) == []
    assert any("takes no scales" in e for e in part(params, ins + [kv(DType.F32, (2, 8))] * 2, [act((2, 1, 1, 18))]))
    ins8 = [act((32,)), kv(DType.F8E4M3, (2, 8, 16)), kv(DType.F8E4M3, (2, 8, 16)), pos]
    assert any("k_scale and v_scale" in e for e in part(params, ins8 + [None, None], [act((2, 1, 1, 18))]))


def test_config_refusals():
    for sc, what in ((ScheduleConfig(kv_cache="int8"), "kv_cache='int8'"),
                     (ScheduleConfig(kv_cache="fp8", fuse_rope=False), "needs fuse_rope")):
        with pytest.raises(ConfigError, match=what):
            lower(CFG, sc)


def test_follow_kv_codes_takes_near_tie_e4m3_codes_only():
    """FollowKVCodes (vm/verify.py) on an fp8 cache: a row whose one element sits 1e-5 of amax past a
    rounding midpoint, stored by another VM on the other side, is followed; a code far from the
    element is not (None, an error)."""
    from megavm.instructions.kv_cache import swizzle
    from megavm.instructions.kv_quant import quantize_row
    from megavm.vm.verify import FollowKVCodes
    rows = torch.randn(2, 64, generator=torch.Generator().manual_seed(4))
    rows[0, 0] = 448.0                                         # amax 448: scale 1, codes are the values
    rows[0, 1] = 1.0625 * (1 - 1e-5)                           # below the midpoint of 1 and 1.125
    near = rows.clone()
    near[0, 1] = 1.0625 * (1 + 1e-5)

    class Cache:
        def __init__(self, codes, scale):
            self.t = {"v_cache.0": swizzle(codes[:, None], 3), "v_scale.0": scale.expand(2)[:, None]}

        def buffer(self, name):
            t = self.t[name]
            return torch.cat([torch.zeros_like(t)] * 3 + [t], 1)   # position 3

    other = quantize_row(near, near.abs().max())
    f = FollowKVCodes(Cache(*other))
    got = f(0, "v", 3, rows)
    assert f.followed == 1 and f.errors == 0 and got[0, 1] == 1.125 and torch.equal(got, other[0].float() * other[1])
    far = other[0].clone()
    far[0, 2] = torch.tensor(100.0).to(torch.float8_e4m3fn)
    f = FollowKVCodes(Cache(far, other[1]))
    assert f(0, "v", 3, rows) is None and f.errors == 1
