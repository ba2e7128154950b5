"""Checking a decode: greedy decoding through any VM (or the eager model), and the comparison of two
decodes, token for token and logit for logit, under a tolerance stated relative to the logits' scale."""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
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
# An NVFP4 KV cache rounds each new row to e2m1 codes, whose steps are a third to a half of a value, from
# rows that differ in their last bits between the program and the oracle: where the two straddle a
# midpoint, one element of the new key or value moves by a whole step, and the step's logits with it.
# Measured on the H100 (tests/gpu/test_kv_nvfp4.py, kernel_time): at most 6e-4 of max |logit| over 1100
# keys, 3.7e-3 over 128 (llama-1b); 2^-7 = 7.8e-3 bounds it. Tokens stay exact.
VS_EAGER_KV = {"nvfp4": Tolerance("rel", 2 ** -7)}


def vs_eager(dtype: str, kv_cache: str = "") -> Tolerance:
    """The tolerance of a program against the eager model: its dtype's, or its KV cache format's."""
    return VS_EAGER_KV.get(kv_cache, VS_EAGER[dtype])


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


def eager_step(model: Model, capacity: int, device="cpu", adapter=None, kv_cache: str = "") -> Step:
    eager = EagerDecoder(model.cfg, {k: v.to(device) for k, v in model.hf.items()}, capacity, adapter, kv_cache)

    def step(token: int, pos: int):
        lg = eager.step(token, pos)
        return lg, int(torch.argmax(lg))
    return step


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
