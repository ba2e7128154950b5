"""Checking a decode: greedy decoding through any VM (or the eager model), and the comparison of two
decodes, token for token and logit for logit, under a tolerance stated relative to the logits' scale."""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from megavm.schedule.eager import EagerDecoder
from megavm.schedule.source import Model


@dataclass(frozen=True)
class Tolerance:
    """|got - want| <= value (absolute), or <= value * max|want| at that step (relative)."""
    kind: str        # "abs" | "rel"
    value: float

    def error(self, got: torch.Tensor, want: torch.Tensor) -> float:
        if got.shape != want.shape:
            return math.inf
        diff = (got.float() - want.float()).abs().max().item()
        if not math.isfinite(diff):
            return math.inf
        return diff / max(want.float().abs().max().item(), 1e-30) if self.kind == "rel" else diff

    @property
    def metric(self) -> str:
        return "max |logit diff| / max |logit|" if self.kind == "rel" else "max |logit diff|"

    def describe(self, err: float) -> str:
        return f"{self.metric} {err:.2e} (tol {self.value:.0e})"


# NOTE: the program and the oracle hold the same weights, rounded alike, and accumulate in f32, so f32
# programs differ by summation order alone. A bf16 program also rounds each new K/V entry to bf16; where
# the two f32 values straddle a rounding boundary the entries differ by one bf16 step (2^-8 of the
# entry), which moves the logits by far less than half a step of their own scale: 2^-9 = 1.95e-3 of
# max |logit| bounds it. Measured: 1e-6 to 4e-5 on CPU, at most 2.4e-4 on the H100 (llama-7b-32k).
VS_EAGER = {"f32": Tolerance("rel", 1e-5), "bf16": Tolerance("rel", 2 ** -9)}
VS_REFERENCE = {"f32": Tolerance("rel", 1e-5), "bf16": Tolerance("rel", 2 ** -9)}
# A quantized KV cache (fp8, nvfp4) keeps codes of each new row, and two VMs whose rows differ in their
# last bits round an element on either side of a midpoint: one code step, an eighth of the element in
# e4m3, a third in e2m1, far past these tolerances at short contexts. The oracle follows the other VM's
# codes at such near-ties (FollowKVCodes) and is then held to its dtype's tolerance.


class FollowKVCodes:
    """The eager oracle's cache rows (bf16, fp8 or nvfp4), taking another VM's stored row at a
    position (its codes and scales, read from its cache after its step or decode) wherever that row is
    a valid rounding of the oracle's own row moved by at most `rel` of its amax: its scales within rel
    of the oracle's, and every element's code one that round-to-nearest gives for some value within
    rel x amax of the oracle's element. Two VMs whose rows differ in their last bits then keep the same
    codes where the rows straddle a midpoint, and the rest of the step is held to the tolerance; a row
    beyond that is an error (counted in `errors`, the oracle keeps its own rounding). Rows followed
    that differ from the oracle's own rounding are counted in `followed`. A bf16 row is held closer:
    each element within half a bf16 step of its value plus `bf16_rel` of amax (f32 sums of the same terms
    in another order, over the layers before: 3e-6 of amax on qwen2.5-1.5b with adapters in ReferenceVM;
    a bf16 step at the row's amax is 2^-8 of it, sixteen times bf16_rel)."""

    def __init__(self, vm, rel: float = 2 ** -9, bf16_rel: float = 2 ** -12):
        self.vm, self.rel, self.bf16_rel, self.followed, self.errors = vm, rel, bf16_rel, 0, 0

    def _bf16(self, cache: torch.Tensor, pos: int, rows: torch.Tensor):
        from megavm.instructions.kv_cache import swizzle
        theirs = swizzle(cache[:, pos:pos + 1].to(rows.device), pos)[:, 0].float()
        if torch.equal(theirs, rows.bfloat16().float()):
            return theirs
        x = rows.float()
        _, e = torch.frexp(theirs)                     # |t| = m 2^e, m in [0.5, 1): a bf16 step there is 2^(e - 8)
        half = torch.where(theirs != 0, torch.ldexp(torch.ones_like(theirs), e - 9), torch.zeros_like(theirs))
        if not bool(((theirs - x).abs() <= half + self.bf16_rel * float(x.abs().max())).all()):
            self.errors += 1
            return None
        self.followed += 1
        return theirs

    def __call__(self, layer: int, which: str, pos: int, rows: torch.Tensor):
        """rows: the oracle's new row [kv_heads, head_dim] in the cache's element order (keys' RoPE pairs
        interleaved); returns the values the cache keeps in that order, or None."""
        from megavm.core.codecs import E2M1_GRID, e2m1_values, nvfp4_rows, nvfp4_values, unpack_nibbles
        from megavm.instructions.kv_cache import swizzle
        from megavm.instructions.kv_quant import quantize_row
        dev = rows.device
        cache = self.vm.buffer(f"{which}_cache.{layer}")
        if cache.dtype == torch.float32:
            return None                                # kept as computed: nothing rounds
        if cache.dtype == torch.bfloat16:
            return self._bf16(cache, pos, rows)
        scale = self.vm.buffer(f"{which}_scale.{layer}")[:, pos].to(dev).float()
        if cache.dtype == torch.uint8:                 # nvfp4: codes, block scales, scale
            codes = cache[:, pos].to(dev)
            bscale = self.vm.buffer(f"{which}_bscale.{layer}")[:, pos].to(dev)
            own = nvfp4_rows(rows, rows.abs().max())
            same = torch.equal(codes, own[0]) and torch.equal(bscale.view(torch.uint8), own[1].view(torch.uint8))
            own_scale, theirs = own[2], nvfp4_values(codes, bscale, scale[:, None])
            v = e2m1_values(unpack_nibbles(codes)).float()
            unit = (bscale.float()[..., None] * scale[:, None, None]).expand(*bscale.shape, 16).reshape(v.shape)
            grid = E2M1_GRID.to(dev)
            mag = v.abs()
            i = (mag[..., None] == grid).float().argmax(-1)
            below = torch.where(i > 0, grid[(i - 1).clamp_min(0)], grid[0])
            above = torch.where(i < 7, grid[(i + 1).clamp_max(7)], torch.full_like(mag, float("inf")))
        else:                                          # fp8: e4m3 codes (rows swizzled) and a scale
            codes = swizzle(cache[:, pos:pos + 1].to(dev), pos)[:, 0]
            own_codes, own_scale = quantize_row(rows, rows.abs().max())
            same = torch.equal(codes.view(torch.uint8), own_codes.view(torch.uint8))
            theirs = codes.float() * scale[:, None]
            v = codes.float()
            mag, bits = v.abs(), codes.view(torch.uint8) & 0x7F
            value = lambda b: b.to(torch.uint8).view(torch.float8_e4m3fn).float()
            below = torch.where(bits > 0, value((bits.int() - 1).clamp_min(0)), torch.zeros_like(mag))
            above = torch.where(bits < 0x7E, value((bits.int() + 1).clamp_max(0x7E)), torch.full_like(mag, float("inf")))
            unit = scale[:, None].expand(v.shape)
        if same and bool((scale == own_scale).all()):
            return theirs
        slack = self.rel * float(rows.abs().max())
        ok = bool(((scale - own_scale).abs() <= self.rel * own_scale.abs()).all())
        # each element against its code's rounding interval (the midpoints to its neighbours), on the
        # code's side of zero (code 0 rounds an interval around 0: the element's magnitude)
        x = torch.where(v < 0, -rows, torch.where(v == 0, rows.abs(), rows)).float()
        lo = torch.where(mag > 0, (mag + below) / 2, torch.zeros_like(mag))
        ok &= bool(((x >= lo * unit - slack) & (x <= (mag + above) / 2 * unit + slack)).all())
        if not ok:
            self.errors += 1
            return None
        self.followed += 1
        return theirs


# -- decoding --------------------------------------------------------------------------------------
Step = Callable[[int, int], tuple[torch.Tensor, int]]    # (token, pos) -> (logits [vocab] f32, next token)


@dataclass
class Decode:
    prompt: list[int]
    tokens: list[int]                # generated
    logits: list[torch.Tensor]       # one per position, f32 on the CPU
    step_s: list[float]              # wall time of each VM step

    @property
    def ms_per_token(self) -> float:
        return 1e3 * statistics.median(self.step_s)


def greedy(step: Step, prompt: list[int], n: int) -> Decode:
    """Feed the prompt, then each step's own next token, until n tokens are generated."""
    toks, out, logits, times = list(prompt), [], [], []
    for pos in range(len(prompt) + n - 1):
        t0 = time.perf_counter()
        lg, nxt = step(toks[pos], pos)
        times.append(time.perf_counter() - t0)
        logits.append(lg.float().cpu())
        if pos >= len(prompt) - 1:
            toks.append(nxt)
            out.append(nxt)
    return Decode(list(prompt), out, logits, times)


def reference_step(vm, extra: dict | None = None) -> Step:
    """extra: the program's other runtime inputs, the same every step (an adapter id)."""
    def step(token: int, pos: int):
        out = vm.step({"token": token, "pos": pos, **(extra or {})})
        return out["logits"], int(out["next_token"][0])
    return step


def megakernel_step(vm, extra: dict | None = None) -> Step:
    def step(token: int, pos: int):
        r = vm.run({"token": token, "pos": pos, **(extra or {})})
        return r.logits, int(r.token)
    return step


def forced(step: Step, prompt: list[int], tokens: list[int]) -> Decode:
    """Feed the prompt, then the given tokens (teacher forcing): the logits of each position on that
    sequence, so that a sampled decode's logits can be held to another model's along the same tokens."""
    seq, logits, times = list(prompt) + list(tokens), [], []
    for pos in range(len(seq) - 1):
        t0 = time.perf_counter()
        lg, _ = step(seq[pos], pos)
        times.append(time.perf_counter() - t0)
        logits.append(lg.float().cpu())
    return Decode(list(prompt), list(tokens), logits, times)


def eager_step(model: Model, capacity: int, device="cpu", adapter=None, kv_cache: str = "", kv_follow=None) -> Step:
    eager = EagerDecoder(model.cfg, {k: v.to(device) for k, v in model.hf.items()}, capacity, adapter, kv_cache)
    eager.kv_follow = kv_follow

    def step(token: int, pos: int):
        lg = eager.step(token, pos)
        return lg, int(torch.argmax(lg))
    return step


def greedy_along(step: Step, d: Decode) -> Decode:
    """Another model fed d's prompt and tokens (teacher forcing), its own greedy token at each step: held
    to d by compare, tokens and logits along the same sequence."""
    f = forced(step, d.prompt, d.tokens)
    start = len(d.prompt) - 1
    return Decode(f.prompt, [int(torch.argmax(lg)) for lg in f.logits[start:]], f.logits, f.step_s)


def compare_following(name: str, got: Decode, want: Decode, tol: Tolerance, follow: FollowKVCodes) -> Comparison:
    """compare got with an oracle that followed got's KV codes at near-ties (FollowKVCodes), naming how
    many rows it followed; a row that was no valid rounding fails the check whatever the logits."""
    c = compare(f"{name} (following its codes at rounding near-ties: {follow.followed} rows followed, "
                f"{follow.errors} not valid roundings)", got, want, tol)
    return c if follow.errors == 0 else replace(c, max_err=math.inf)


def spec_tokens(name: str, d: Decode, sampling: tuple[float, int, float, int]) -> Comparison:
    """Each sampled token against the sampling spec on the logits the same VM computed at that step."""
    from megavm.instructions.sampling import sample_at
    t, k, p, seed = sampling
    start = len(d.prompt) - 1
    want = [sample_at(d.logits[start + i], t, k, p, seed, start + i) for i in range(len(d.tokens))]
    diff = next((i for i, (a, b) in enumerate(zip(d.tokens, want)) if a != b), None)
    return Comparison(name, Tolerance("rel", 0.0), 0.0, diff, len(d.tokens), tokens_only=True)


def eager_decode(model: Model, prompt: list[int], n: int, capacity: int, device="cpu", adapter=None,
                 kv_cache: str = "") -> Decode:
    eager = EagerDecoder(model.cfg, {k: v.to(device) for k, v in model.hf.items()}, capacity, adapter, kv_cache)
    t0 = time.perf_counter()
    tokens, logits = eager.generate(prompt, n)
    per = (time.perf_counter() - t0) / max(len(logits), 1)
    return Decode(list(prompt), tokens, [lg.float().cpu() for lg in logits], [per] * len(logits))


@dataclass
class Comparison:
    name: str
    tol: Tolerance
    max_err: float
    first_token_diff: int | None     # index of the first generated token that differs
    steps: int                       # positions compared
    tokens_only: bool = False        # a check of tokens alone (no logits)

    @property
    def ok(self) -> bool:
        return self.first_token_diff is None and self.max_err <= self.tol.value

    def __str__(self) -> str:
        toks = "tokens identical" if self.first_token_diff is None else \
            f"tokens differ from generated token {self.first_token_diff}"
        if self.tokens_only:
            return f"{self.name}: {toks} over {self.steps} steps"
        return f"{self.name}: {toks}, {self.tol.describe(self.max_err)} over {self.steps} steps"


def compare(name: str, got: Decode, want: Decode, tol: Tolerance) -> Comparison:
    """Logits are compared at every position whose input token agrees (up to the first divergence)."""
    diff = next((i for i, (a, b) in enumerate(zip(got.tokens, want.tokens)) if a != b), None)
    if diff is None and len(got.tokens) != len(want.tokens):
        diff = min(len(got.tokens), len(want.tokens))
    last = len(got.logits) if diff is None else len(got.prompt) + diff
    err = max((tol.error(g, w) for g, w in zip(got.logits[:last], want.logits[:last])), default=0.0)
    return Comparison(name, tol, err, diff, min(last, len(got.logits), len(want.logits)))
