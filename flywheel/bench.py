"""`megavm bench`: megavm against the alternatives, in one process on one GPU, on seeded random bf16
weights. Every time printed has its correctness verdict beside it; the run is recorded as JSON in
--out (default: $OUT, else the current directory)."""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import torch

from megavm.core.codecs import nvfp4_rows, nvfp4_values
from megavm.core.errors import UserError
from megavm.core.memory import require
from megavm.flywheel import results
from megavm.flywheel.peers import PEER_FORMATS
from megavm.flywheel.timing import median_ms
from megavm.instructions.kv_cache import swizzle
from megavm.instructions.kv_quant import quantize_row
from megavm.schedule.config import KV_FORMATS, QUANTIZED, ScheduleConfig
from megavm.schedule.dlrm import MAX_BATCH
from megavm.schedule.dlrm import PRESETS as DLRM_PRESETS
from megavm.schedule.eager import EagerDecoder
from megavm.schedule.footprint import footprint
from megavm.schedule.models import PRESETS, ModelConfig
from megavm.schedule.weights import (expert_names, hf_shapes, program_weights, projection, quantized_model,
                                     random_hf_weights, stored)
from megavm.vm.compile import compile
from megavm.vm.verify import VS_EAGER, FollowKVCodes

GEN_TOKENS = 256


def copy_bandwidth_GBps() -> float:
    a = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    ms = median_ms(lambda: b.copy_(a), iters=20, warmup=5)
    return 2 * (1 << 30) * 2 / (ms * 1e-3) / 1e9


def bytes_read(cfg: ModelConfig, ctx: int, weights: str = "", kv_cache: str = "") -> int:
    """Bytes one decode step must read: one embedding row, every layer (of a mixture of experts, the
    router and the top_k chosen experts), the norm, the LM head, the KV cache up to and including the
    new position, within the sliding window if any (bf16; with weights="fp8" the projections and the
    LM head one byte an element and an f32 scale a row; "nvfp4": half a byte an element, an e4m3 scale
    per 16 and an f32 scale a row; "mxfp4": half a byte an element and an exponent byte per 32, the
    format's own bytes, not the e4m3 block scales per 16 and row scales megavm reads for it; "int4":
    half a byte an element, an f16 scale and half a byte of zero point per 128, AWQ's bytes, not the
    f16 pair megavm reads; "fp8-block": a byte an element and an f32 scale per 128 x 128 block; with
    kv_cache="fp8" the cache one byte an element and an f32 scale per KV head and position; "nvfp4":
    half a byte an element, an e4m3 scale per 16 and an f32 scale per KV head and position)."""
    shapes = hf_shapes(cfg)
    read = {k: s for k, s in shapes.items() if k != "model.embed_tokens.weight" and ".experts." not in k}
    n = sum(math.prod(s) for s in read.values())
    expert = sum(3 * cfg.top_k * cfg.expert_ffn * cfg.dim for l in range(cfg.n_layers) if cfg.is_moe(l))
    head = cfg.vocab * cfg.dim if cfg.tied_embeddings else 0
    n += expert + cfg.dim + head
    rows = 2 * cfg.n_layers * cfg.n_kv_heads * min(ctx + 1, cfg.sliding_window or ctx + 1)    # K and V rows
    kv = rows * {"fp8": cfg.head_dim + 4, "nvfp4": cfg.head_dim // 2 + cfg.head_dim // 16 + 4}.get(
        kv_cache, 2 * cfg.head_dim)
    if weights not in QUANTIZED:
        return 2 * n + kv
    proj = {k: s for k, s in read.items() if projection(k)}
    elems = sum(math.prod(s) for s in proj.values()) + expert + head
    rows = (sum(s[0] for s in proj.values()) + (cfg.vocab if cfg.tied_embeddings else 0)
            + sum(cfg.top_k * (2 * cfg.expert_ffn + cfg.dim) for l in range(cfg.n_layers) if cfg.is_moe(l)))
    per = {"fp8": 1, "fp8-block": 1 + 4 / 128 ** 2, "nvfp4": 0.5 + 1 / 16, "mxfp4": 0.5 + 1 / 32,
           "int4": 0.5 + 2.5 / 128}[weights]                                          # the format's own bytes
    return int(2 * (n - elems) + elems * per + (0 if weights in ("mxfp4", "int4", "fp8-block") else 4 * rows) + kv)


def model_weights(cfg: ModelConfig, seed: int = 0, device: str = "cuda") -> tuple[dict, dict]:
    """(Hugging Face weights, program weights) on the GPU (or `device`), seeded random bf16. A mixture
    of experts's stacks are drawn once, in the program's layout, and the Hugging Face names of its
    experts are views into them, so a 30B-A3B model is on the GPU once (megavm, the eager oracle and
    the peers share it)."""
    if not cfg.n_experts:
        hf = random_hf_weights(cfg, torch.bfloat16, seed=seed, device=device)
        return hf, program_weights(cfg, hf)
    dense = replace(cfg, n_experts=0, top_k=0, expert_ffn=0, dense_layers=(), router_bias=False, hash_layers=0,
                    shared_ffn=0, swiglu_limit=0.0)
    if cfg.router_bias or cfg.hash_layers or cfg.shared_ffn:
        raise UserError(f"bench draws Mixtral / Qwen3-MoE shaped experts; {cfg.family} with a router bias, hash "
                        f"layers or a shared expert is not a preset it knows")
    hf = random_hf_weights(dense, torch.bfloat16, seed=seed, device=device)
    prog = program_weights(dense, hf)
    E, F, d = cfg.n_experts, cfg.expert_ffn, cfg.dim
    for l in range(cfg.n_layers):
        if not cfg.is_moe(l):
            continue
        for n in ("gate", "up", "down"):
            del hf[f"model.layers.{l}.mlp.{n}_proj.weight"], prog[f"layers.{l}.w_{n}"]
        g = torch.Generator(device=device).manual_seed(seed * 7919 + 1000 + l)
        draw = lambda *shape: (torch.randn(shape, generator=g, device=device) / shape[-1] ** 0.5).to(torch.bfloat16)  # noqa: E731
        L = f"layers.{l}."
        prog[L + "router"] = draw(E, d)
        stacks = [torch.empty(s, dtype=torch.bfloat16, device=device) for s in ((E, F, d), (E, F, d), (E, d, F))]
        router, names = expert_names(cfg, l)
        hf[f"model.layers.{l}.{router}"] = prog[L + "router"]
        for e in range(E):
            for stack, name in zip(stacks, names[e]):
                stack[e] = draw(*stack.shape[1:])
                hf[f"model.layers.{l}.{name}"] = stack[e]
        for n, stack in zip(("experts_gate", "experts_up", "experts_down"), stacks):
            prog[L + n] = stack
    torch.cuda.empty_cache()
    return hf, prog


def fill_history(cfg, ctx, eager, caches, seed=5, kv_cache="", device="cuda"):
    """Random KV history for positions < ctx, the same in every model (keys interleaved for megavm).
    kv_cache="fp8" ("nvfp4"): each position's row (every KV head) quantized as KV_QUANT does, codes and
    scales (and block scales; keys' blocks of 16 in the cache's interleaved order) into megavm's caches,
    what they stand for into the eager model's. device: where the history is drawn (the CPU in tests)."""
    g = torch.Generator(device=device).manual_seed(seed)
    for l in range(cfg.n_layers):
        for kind, store in (("k", eager.k), ("v", eager.v)):
            hist = torch.randn(cfg.n_kv_heads, ctx, cfg.head_dim, generator=g, device=device).to(store.dtype)
            if kv_cache == "nvfp4":
                nvfp4_history(hist, kind, l, store[l], caches)
                continue
            if kv_cache == "fp8":                 # each position's row over every KV head, as KV_QUANT does
                codes, scale = quantize_row(hist, hist.abs().amax(dim=(0, 2), keepdim=True))
                hist = codes.float() * scale
                scale = scale.reshape(ctx)
            store[l, :, :ctx] = hist
            prog = codes if kv_cache == "fp8" else hist
            if kind == "k":
                prog = prog.view(torch.uint8) if kv_cache == "fp8" else prog
                prog = prog.view(cfg.n_kv_heads, ctx, 2, -1).transpose(2, 3).reshape(hist.shape)
                prog = prog.view(torch.float8_e4m3fn) if kv_cache == "fp8" else prog
            prog = swizzle(prog)                  # as the cache keeps its rows (instructions/kv_cache.py)
            for c in caches:
                c(f"{kind}_cache.{l}")[:, :ctx] = prog
                if kv_cache == "fp8":
                    c(f"{kind}_scale.{l}")[:, :ctx] = scale[None, :]


def nvfp4_history(hist, kind, l, store, caches):
    """fill_history's rows hist [kv_heads, ctx, head_dim] (keys in rotate-half order) into an NVFP4
    cache: each position's row over every KV head quantized by nvfp4_rows as KV_QUANT does, keys in the
    cache's interleaved order (element 2i is rotate-half element i, 2i + 1 is i + head_dim / 2); codes,
    block scales and scales into megavm's caches (not swizzled: instructions/kv_cache.py), what they
    stand for, in hist's order, into the eager model's layer store [kv_heads, capacity, head_dim]."""
    nkv, ctx, hd = hist.shape
    rows = hist.float()
    if kind == "k":
        rows = rows.view(nkv, ctx, 2, hd // 2).transpose(2, 3).reshape(nkv, ctx, hd)
    codes, bscale, scale = torch.vmap(nvfp4_rows, in_dims=(1, 0), out_dims=(1, 1, 0))(rows, rows.abs().amax(dim=(0, 2)))
    values = nvfp4_values(codes, bscale, scale[None, :, None])
    if kind == "k":
        values = values.view(nkv, ctx, hd // 2, 2).transpose(2, 3).reshape(nkv, ctx, hd)
    store[:, :ctx] = values.to(store.dtype)
    for c in caches:
        c(f"{kind}_cache.{l}")[:, :ctx] = codes
        c(f"{kind}_bscale.{l}")[:, :ctx] = bscale
        c(f"{kind}_scale.{l}")[:, :ctx] = scale[None, :]


ROUTE_TIE = 1e-3          # relative score gap under which two experts' order may differ between VMs


class FollowNearTies:
    """The eager oracle's router, taking megavm's choice of experts only where the two differ by a
    near-tie: every expert megavm chose that the oracle did not scores within ROUTE_TIE (relative) of
    the oracle's k-th. A larger difference is a routing error (counted in `errors`); ties followed are
    counted in `ties`. Weights always come from the oracle's own scores."""

    def __init__(self, cfg: ModelConfig, vm):
        self.cfg, self.vm, self.ties, self.errors = cfg, vm, 0, 0

    def __call__(self, layer: int, logits: torch.Tensor):
        from megavm.instructions.routing import renormalise, route, scores
        c = self.cfg
        ids, w = route(logits, c.top_k, c.router_score, renorm=c.router_renorm, scale=c.router_scale)
        theirs = self.vm.buffer(f"expert_ids.{layer}").long().to(ids.device)
        if set(theirs.tolist()) == set(ids.tolist()):
            return ids, w
        s = scores(logits, c.router_score)
        kth = s[ids].min()
        if all(float((kth - s[e]) / kth) <= ROUTE_TIE for e in set(theirs.tolist()) - set(ids.tolist())):
            self.ties += 1
            w = s[theirs]
            return theirs, (renormalise(w, 0.0) if c.router_renorm else w) * c.router_scale
        self.errors += 1
        return ids, w


def verify(cfg, vm, ref_vm, eager, ctx, steps=8, tol=VS_EAGER["bf16"].value):
    """Greedy steps from ctx: megavm tokens identical to eager (and ReferenceVM on the first step),
    logits within tol of max |logit|. A mixture of experts's oracle follows megavm's choice of experts
    at near-ties only (FollowNearTies); a routing difference beyond one fails. Returns (verdict, worst
    relative error, near-ties followed)."""
    tok, worst, ok = 7, 0.0, True
    follow = FollowNearTies(cfg, vm) if cfg.n_experts else None
    eager.route_override = follow
    codes = FollowKVCodes(vm)              # the cache's codes (bf16 values, e4m3, e2m1) at rounding near-ties
    eager.kv_follow = codes
    for i in range(steps):
        res = vm.run({"token": tok, "pos": ctx + i})
        res.wait()
        e = eager.step(tok, ctx + i)
        err = (res.logits - e).abs().max().item() / e.abs().max().item()
        ok &= res.token == int(e.argmax()) and err <= tol
        if i == 0 and ref_vm is not None:
            r = ref_vm.step({"token": tok, "pos": ctx})
            ok &= int(r["next_token"][0]) == res.token
            err = max(err, (r["logits"] - res.logits).abs().max().item() / e.abs().max().item())
        worst = max(worst, err)
        tok = res.token
    ok &= (follow is None or follow.errors == 0) and (codes is None or codes.errors == 0)
    return ("PASS" if ok else "FAIL"), worst, (follow.ties if follow else 0)


def bench_model(name: str, ctx: int, copy_GBps: float, do_compile: bool = True, ablations=None,
                reference: bool = True, tuned_schedule: bool = True, weights: str = "bf16", kv_cache: str = "") -> dict:
    """One preset against its peers. weights="fp8" (or "nvfp4", "int4", "fp8-block"): megavm and the
    peers store the projections and the LM head as e4m3 codes with row scales (e2m1 codes with block
    and row scales, ...), and the oracle is the model those stand for (schedule.weights.quantized_model); the peers dequantize
    on the fly (flywheel/peers.py). kv_cache="fp8": megavm, the oracle and the peers keep e4m3 KV caches
    with a scale per position; "nvfp4": e2m1 KV caches with an e4m3 scale per 16 and a scale per
    position."""
    from megavm.flywheel.peers import TorchDecoder
    from megavm.vm.megakernel import Ablations, MegakernelVM
    from megavm.vm.reference import ReferenceVM
    from megavm.vm.sizing import describe
    cfg = PRESETS[name]
    cap = ctx + GEN_TOKENS + 16
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    quantized = weights in QUANTIZED
    if quantized and weights not in PEER_FORMATS:
        raise UserError(f"--weights {weights}: the torch peers dequantize {', '.join(PEER_FORMATS)} only")
    if quantized and cfg.n_experts:
        raise UserError(f"--weights {weights}: {name} is a mixture of experts; the {weights} bench takes dense "
                        f"presets")
    hf, w = model_weights(cfg)
    if quantized:                       # the oracle's weights: what the codes and row scales stand for
        del w
        cfg, hf = quantized_model(cfg, hf, weights)
        w = program_weights(cfg, hf)
    sc, defines = ScheduleConfig(dtype="bf16", capacity=cap, n_sms=n_sms, weights=weights if quantized else "",
                                 kv_cache=kv_cache), {}
    chosen = "schedule: defaults (--untuned)"
    if quantized or kv_cache:
        what = weights if quantized else f"{kv_cache} cache"
        chosen = f"schedule: defaults (the tuning corpus has no {what} configurations)"
    elif tuned_schedule:                # the best configuration `megavm tune` recorded for it on this GPU
        from megavm.flywheel.prior import tuned
        sc, defines, chosen = tuned(cfg, "bf16", sc, torch.cuda.get_device_name(0), ctx)
    print(f"{name}: {chosen}", flush=True)
    packed = compile(cfg, sc)
    if quantized:
        w = stored(w, [packed.buffer(i) for i in range(len(packed.buffers))], weights)
    row = {"model": name, "ctx": ctx, "weights": weights, "kv_cache": kv_cache or "bf16",
           "GB": bytes_read(cfg, ctx, sc.weights, kv_cache) / 1e9,
           "tasks": len(packed.instrs), "schedule": chosen}
    row["floor_ms"] = row["GB"] / copy_GBps * 1e3
    vm = MegakernelVM(packed, w, ablations=ablations or Ablations(), defines=defines or None)
    row["build"] = describe(vm.defines)
    print(f"{name}: {row['build']}", flush=True)
    eager = EagerDecoder(cfg, hf, cap, kv_cache=kv_cache)
    ref = ReferenceVM(packed, w, device="cuda") if reference else None
    caches = [vm.buffer] + ([ref.buffer] if ref else [])
    fill_history(cfg, ctx, eager, caches, kv_cache=kv_cache)
    row["verdict"], row["max_rel_err"], ties = verify(cfg, vm, ref, eager, ctx)
    if cfg.n_experts:
        row["route_ties_followed"] = ties
    del ref, eager
    vm.run({"token": 7, "pos": ctx}).wait()
    row["megavm_ms"] = median_ms(vm.relaunch)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    vm.generate([7], GEN_TOKENS, start_pos=ctx)
    row["megavm_e2e_ms"] = (time.perf_counter() - t0) * 1e3 / GEN_TOKENS
    del vm
    peer = TorchDecoder(cfg, hf, cap, experts=w, weights=weights, kv_cache=kv_cache)
    peer.set(7, ctx)
    row["compile_setup"] = "gpt-fast: buffers, static KV caches, reduce-overhead, SDPA math, coordinate descent"
    if quantized:
        row["peer_weights"] = {"fp8": "e4m3 codes and row scales", "nvfp4": "e2m1 codes, e4m3 block scales and row "
                               "scales", "int4": "int4 codes with an f16 scale and zero point per 128",
                               "fp8-block": "e4m3 codes with an f32 scale per 128 x 128 block"}[weights] + \
            ", dequantized on the fly in each linear (flywheel/peers.py)"
    with torch.no_grad():
        row["eager_ms"] = median_ms(peer.step, iters=50, warmup=5)
        row["cudagraph_ms"] = median_ms(peer.graphed(), iters=100, warmup=10)
        if do_compile:
            try:
                t0 = time.time()
                fn = peer.compiled()
                row["compile_s"] = time.time() - t0
                row["compiled_ms"] = median_ms(fn, iters=100, warmup=10)
            except Exception as e:  # a peer failing to compile is reported, not fatal
                row["compiled_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    del peer, hf, w
    torch.cuda.empty_cache()
    return row


def table(rows: list[dict], copy_GBps: float) -> str:
    out = [f"copy bandwidth {copy_GBps:.0f} GB/s (read + written)",
           f"{'model':16s} {'ctx':>5s} {'what':18s} {'ms/token':>9s} {'GB/s':>6s} {'%floor':>6s}  verdict"]
    for r in rows:
        name = r["model"] + (f" {r['weights']}" if r.get("weights", "bf16") != "bf16" else "") + \
            (f" kv-{r['kv_cache']}" if r.get("kv_cache", "bf16") != "bf16" else "")
        for what, key in (("megavm kernel", "megavm_ms"), ("megavm generate", "megavm_e2e_ms"), ("eager", "eager_ms"),
                          ("CUDA graph", "cudagraph_ms"), ("torch.compile", "compiled_ms")):
            if key not in r:
                continue
            ms = r[key]
            verdict = r["verdict"] if key.startswith("megavm") else "(peer)"
            out.append(f"{name:16s} {r['ctx']:5d} {what:18s} {ms:9.3f} {r['GB'] / ms * 1e3:6.0f} "
                       f"{100 * r['floor_ms'] / ms:5.1f}%  {verdict}")
        sp = [f"{p} x{r[k] / r['megavm_ms']:.2f}" for p, k in (("eager", "eager_ms"), ("graph", "cudagraph_ms"),
                                                                ("compile", "compiled_ms")) if k in r]
        out.append(f"{'':16s} {'':5s} megavm speedup vs {', '.join(sp)}; floor {r['floor_ms']:.3f} ms")
    return "\n".join(out)


def commit() -> str:
    """The commit a result belongs to: MEGAVM_COMMIT, else the checkout's HEAD (with "-dirty", as git
    describe says it, when tracked files differ from it: the code measured is not that commit's), else
    "unknown"."""
    from megavm.vm import env
    if env.get("MEGAVM_COMMIT"):
        return env.get("MEGAVM_COMMIT")
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        try:
            r = subprocess.run(["git", *args], capture_output=True, text=True, cwd=here)
        except OSError:
            return ""
        return r.stdout.strip() if r.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def out_dir(given: str | None) -> Path:
    """Where a tool writes its results: --out, else $OUT, else the current directory."""
    return Path(given or os.environ.get("OUT") or ".")


def run_doc(kind: str, command: str, note: str, **fields) -> dict:
    """A run of this GPU in the schema of its kind (flywheel/results.py)."""
    return dict(kind=kind, schema=results.SCHEMA_VERSION, device=torch.cuda.get_device_name(0),
                date=time.strftime("%Y-%m-%d"), commit=commit(), command=command, note=note, **fields)


def record(rows, copy_GBps, command: str, note: str, out: Path) -> Path:
    return results.write(run_doc("bench", command, note, torch=torch.__version__, copy_GBps=copy_GBps, rows=rows), out)


def setup_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="llama-1b", help="preset(s), comma-separated (default: llama-1b)")
    p.add_argument("--ctx", type=int, default=128, help="context length the step decodes at (default: 128)")
    p.add_argument("--batch", default="1", metavar="N[,N]",
                   help="batch sizes of the DLRM presets, comma-separated (default: 1)")
    p.add_argument("--weights", choices=("bf16", *PEER_FORMATS), default="bf16",
                   help="the projections' and LM head's storage, for megavm and the peers alike (default: bf16)")
    p.add_argument("--kv-cache", choices=("bf16", *(f for f in KV_FORMATS if f)), default="bf16",
                   help="the KV caches' storage, for megavm, the oracle and the peers alike (default: bf16)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    p.add_argument("--no-reference", action="store_true", help="skip the ReferenceVM check (slow on big models)")
    p.add_argument("--untuned", action="store_true",
                   help="the default schedule, not the best one `megavm tune` recorded for the model and this GPU")
    p.add_argument("--out", metavar="DIR", help="where the JSON goes, under bench/ (default: $OUT, else the current "
                                               "directory)")
    p.add_argument("--note", default="megavm bench", help="what the run is for, recorded with it")


def parse_batches(text: str) -> list[int]:
    try:
        batches = [int(b, 10) for b in text.split(",")]
    except ValueError:
        raise UserError(f"--batch {text!r}: expected comma-separated batch sizes such as 1,32,128") from None
    bad = [b for b in batches if not 1 <= b <= MAX_BATCH]
    if bad:
        raise UserError(f"--batch sizes {bad} are outside [1, {MAX_BATCH}]")
    return batches


def require_gpu(ctx: int, models: list[str], batches: list[int] = (1,)) -> None:
    """UserError unless a GPU is here and each model's step at this context fits its free memory (the
    program's weights, the megakernel's and the peers' KV caches and activations)."""
    if not torch.cuda.is_available():
        raise UserError("needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    if ctx < 0:
        raise UserError(f"--ctx {ctx} must be >= 0")
    unknown = [m for m in models if m not in PRESETS and m not in DLRM_PRESETS]
    if unknown:
        raise UserError(f"unknown model(s) {unknown}; presets are {sorted(PRESETS) + sorted(DLRM_PRESETS)}")
    free = torch.cuda.mem_get_info()[0]
    for m in models:
        if m in DLRM_PRESETS:
            from megavm.flywheel.bench_dlrm import gpu_bytes
            require(f"{m} at batch {max(batches)}", {"weights, copies and activations": gpu_bytes(m, max(batches))},
                    free, "GPU memory")
            continue
        cfg = PRESETS[m]
        fp = footprint(cfg, ScheduleConfig(dtype="bf16", capacity=ctx + GEN_TOKENS + 16))
        experts = 2 * 3 * cfg.n_experts * cfg.expert_ffn * cfg.dim * sum(cfg.is_moe(l) for l in range(cfg.n_layers))
        # experts once (shared by megavm, the oracle and the peers); the rest in three copies
        require(f"{m} at ctx {ctx}", {"weights": experts + 3 * (fp.weight_bytes - experts), "KV caches": 4 * fp.kv_bytes,
                                      "activations": fp.arena_bytes}, free, "GPU memory")


def cmd_bench(a: argparse.Namespace) -> int:
    """Time megavm against eager, CUDA graph and torch.compile on this GPU, with verdicts."""
    import sys
    models, batches = a.model.split(","), parse_batches(a.batch)
    moe = [m for m in models if a.weights != "bf16" and m in PRESETS and PRESETS[m].n_experts]
    if moe:
        raise UserError(f"--weights {a.weights} takes dense presets; {moe} are mixtures of experts")
    require_gpu(a.ctx, models, batches)
    copy = copy_bandwidth_GBps()
    command = "megavm bench " + " ".join(sys.argv[2:])
    rows, dlrm_rows = [], []
    for m in models:
        if m in DLRM_PRESETS:
            from megavm.flywheel.bench_dlrm import bench_dlrm
            for b in batches:
                dlrm_rows.append(bench_dlrm(m, b, copy, not a.no_compile))
                print(json.dumps(dlrm_rows[-1]), flush=True)
        else:
            rows.append(bench_model(m, a.ctx, copy, not a.no_compile, reference=not a.no_reference,
                                    tuned_schedule=not a.untuned, weights=a.weights,
                                    kv_cache="" if a.kv_cache == "bf16" else a.kv_cache))
            print(json.dumps(rows[-1]), flush=True)
    if rows:
        print(table(rows, copy))
        print(f"results: {record(rows, copy, command, a.note, out_dir(a.out))}")
    if dlrm_rows:
        from megavm.flywheel import bench_dlrm
        print(bench_dlrm.table(dlrm_rows))
        doc = run_doc("bench_dlrm", command, a.note, torch=torch.__version__, copy_GBps=copy, rows=dlrm_rows)
        print(f"results: {results.write(doc, out_dir(a.out))}")
    return 0 if all(r["verdict"] == "PASS" for r in rows + dlrm_rows) else 1
